//! The key's claim together with the [`Authenticator`] check (see its documentation).

use std::future::Future;

use http::request::Parts;
use sha2::{Digest, Sha256};

use super::{claim::within, layer::Config, metrics};
use crate::{
    authenticator::Authenticator,
    scope::MAX_NAMESPACE_LEN,
    store::{ClaimOutcome, FencingToken, Fingerprint},
};

/// The key's claim as the store answered it (an error: why it did not), or a refusal.
pub(crate) enum Checked {
    /// Go on with this answer to the key's claim.
    Claim(Result<ClaimOutcome, String>),
    /// The authenticator was first seen under another key; any claim of this key was released.
    Replayed,
}

/// The [`Authenticator`] the key source inserted, with the owner its record is claimed for: a
/// digest of the key as derived, before scoping, so one delivery sent to several routes of one
/// namespace is one owner.
pub(crate) fn of(parts: &Parts, key: &str) -> Option<(Authenticator, Fingerprint)> {
    let authenticator = parts.extensions.get::<Authenticator>()?;
    let owner = Sha256::new()
        .chain_update(b"tower-idempotency authenticator owner\0")
        .chain_update(key.as_bytes())
        .finalize();
    Some((*authenticator, Fingerprint(owner.into())))
}

/// Claims `store_key` and, when the request carries an [`Authenticator`] (from [`of`]), claims
/// its record at the same time. A claim of the key is released again when the request is
/// refused, or when the record could not be read (answered then as a store failure).
pub(crate) async fn claim(
    config: &Config,
    store_key: &str,
    key_claim: impl Future<Output = Result<ClaimOutcome, String>>,
    authenticator: Option<(Authenticator, Fingerprint)>,
) -> Checked {
    let Some((authenticator, owner)) = authenticator else {
        return Checked::Claim(key_claim.await);
    };
    let record = record_key(config.scope.namespace(), &authenticator);
    // Kept in flight, never completed: one round trip, and a store evicting completed
    // records when full never drops it before its time.
    let lease = config.ttl.max(config.lease);
    let record_claim = async {
        let token = FencingToken::random().map_err(|e| format!("no fencing token: {e}"))?;
        match within(
            config.store_timeout(),
            metrics::timed(
                config,
                "claim",
                config.store.claim(&record, &owner, token, lease),
            ),
        )
        .await
        {
            Some(Ok(outcome)) => Ok(outcome),
            Some(Err(error)) => Err(error.to_string()),
            None => Err(format!("timed out after {:?}", config.store_timeout())),
        }
    };
    let (claim, seen) = tokio::join!(key_claim, record_claim);
    let verdict = match seen {
        Ok(ClaimOutcome::Claimed { .. }) => Ok(true),
        Ok(ClaimOutcome::InFlight { fingerprint, .. }) => Ok(fingerprint == owner),
        Ok(ClaimOutcome::Completed { record, .. }) => Ok(record.fingerprint == owner),
        Err(error) => Err(error),
    };
    if matches!(verdict, Ok(true)) {
        return Checked::Claim(claim);
    }
    if let Ok(ClaimOutcome::Claimed { token }) = &claim {
        match within(
            config.store_timeout(),
            metrics::timed(config, "release", config.store.release(store_key, *token)),
        )
        .await
        {
            Some(Ok(_)) => {}
            _ => tracing::warn!(
                "releasing the key failed; it stays in flight until its lease expires"
            ),
        }
    }
    match verdict {
        Ok(_) => {
            tracing::warn!("refused a credential already used under another idempotency key");
            Checked::Replayed
        }
        Err(error) => Checked::Claim(Err(error)),
    }
}

/// `{namespace}.auth:{hex}`, within the 320 bytes a store key may take.
fn record_key(namespace: &str, authenticator: &Authenticator) -> String {
    let digest = Sha256::new()
        .chain_update(namespace.as_bytes())
        .chain_update([0])
        .chain_update(authenticator.as_bytes())
        .finalize();
    // Namespaces are ASCII; a long one is shortened, its full text is in the digest.
    let prefix = &namespace[..namespace.len().min(MAX_NAMESPACE_LEN - ".auth".len())];
    format!("{prefix}.auth:{}", hex::encode(digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_stay_within_the_store_key_limit_and_apart_per_namespace() {
        let a = Authenticator([7; 32]);
        let short = record_key("github", &a);
        assert!(short.starts_with("github.auth:"), "{short}");
        assert_eq!(short.len(), "github.auth:".len() + 64);
        let long = "n".repeat(MAX_NAMESPACE_LEN);
        let longer = format!("{}x", &long[..MAX_NAMESPACE_LEN - 1]);
        let (k1, k2) = (record_key(&long, &a), record_key(&longer, &a));
        assert!(k1.len() <= 320 && k2.len() <= 320);
        assert_ne!(k1, k2);
        assert_ne!(short, record_key("github", &Authenticator([8; 32])));
    }
}
