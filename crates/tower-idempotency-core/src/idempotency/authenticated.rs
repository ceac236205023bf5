//! The key's claim together with the [`Authenticator`] check (see its documentation).

use std::future::Future;

use bytes::Bytes;
use http::{request::Parts, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use sha2::{Digest, Sha256};

use super::{claim::within, config::Config, metrics};
use crate::{
    authenticator::Authenticator,
    outcome::Outcome,
    policy::cacheable_headers,
    scope::MAX_NAMESPACE_LEN,
    store::{CachedResponse, ClaimOutcome, CompletedRecord, FencingToken, Fingerprint},
};

/// The key's claim as the store answered it (an error: why it did not), or a refusal.
// Made once per request and matched at once: boxing the common variant would allocate for
// every request to shrink the rare one.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Checked {
    /// Go on with this answer to the key's claim; `held` is the authenticator's record this
    /// request claimed, to settle once the key is settled (see [`settle`]).
    Claim {
        claim: Result<ClaimOutcome, String>,
        held: Option<Held>,
    },
    /// The authenticator was first seen under another key; any claim of this key was released.
    Replayed,
}

/// An authenticator's record claimed in flight by the request that runs its key.
pub(crate) struct Held {
    record: String,
    token: FencingToken,
}

/// Says which scoped key an authenticator's record holds the result of (a digest of it), or
/// `released` when that key was released (the handler failed, or its answer was not cached): a
/// released record still refuses the credential under another key, but holds no result. Never
/// replayed to a caller.
const MARKER: HeaderName = HeaderName::from_static("tower-idempotency-authenticator");
const RELEASED: &str = "released";

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
///
/// The record is in flight only while its key's handler runs: [`settle`] completes it with the
/// key's status (or a released marker), so a store that evicts completed records can evict it
/// and never fills with records that run nothing. A completed record stands in for its key's:
/// when the key's own record is gone (evicted before its TTL) but the authenticator's says the
/// key completed, the request is answered as a replay without a body (`Idempotent-Body-Omitted`)
/// with the stored status, and the handler does not run again.
pub(crate) async fn claim(
    config: &Config,
    store_key: &str,
    fingerprint: &Fingerprint,
    key_claim: impl Future<Output = Result<ClaimOutcome, String>>,
    authenticator: Option<(Authenticator, Fingerprint)>,
) -> Checked {
    let Some((authenticator, owner)) = authenticator else {
        return Checked::Claim {
            claim: key_claim.await,
            held: None,
        };
    };
    let record = record_key(config.scope.namespace(), &authenticator);
    // In flight for the TTL at most: a request whose instance dies mid-handler leaves it to
    // refuse the credential under another key until then.
    let lease = config.ttl.max(config.lease);
    let token = match FencingToken::random() {
        Ok(token) => token,
        Err(error) => {
            return Checked::Claim {
                claim: Err(format!("no fencing token: {error}")),
                held: None,
            }
        }
    };
    let record_claim = async {
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
    let verdict = match &seen {
        Ok(ClaimOutcome::Claimed { .. }) => Ok(true),
        Ok(ClaimOutcome::InFlight { fingerprint, .. }) => Ok(*fingerprint == owner),
        Ok(ClaimOutcome::Completed { record, .. }) => Ok(record.fingerprint == owner),
        Err(error) => Err(error.clone()),
    };
    if matches!(verdict, Ok(true)) {
        return go_on(
            config,
            store_key,
            fingerprint,
            claim,
            seen,
            Held { record, token },
        )
        .await;
    }
    if let Ok(ClaimOutcome::Claimed { token }) = &claim {
        release_key(config, store_key, *token).await;
    }
    match verdict {
        Ok(_) => {
            tracing::warn!("refused a credential already used under another idempotency key");
            Checked::Replayed
        }
        Err(error) => Checked::Claim {
            claim: Err(error),
            held: None,
        },
    }
}

/// The key's claim once the authenticator's record accepted the request.
async fn go_on(
    config: &Config,
    store_key: &str,
    fingerprint: &Fingerprint,
    claim: Result<ClaimOutcome, String>,
    seen: Result<ClaimOutcome, String>,
    held: Held,
) -> Checked {
    match (seen, claim) {
        // First seen (or its record had expired): settled with the key after the handler.
        (Ok(ClaimOutcome::Claimed { .. }), claim @ Ok(ClaimOutcome::Claimed { .. })) => {
            Checked::Claim {
                claim,
                held: Some(held),
            }
        }
        // The key is answered from its own record (or failed): settle the record now.
        (Ok(ClaimOutcome::Claimed { .. }), claim) => {
            let stored = match &claim {
                Ok(ClaimOutcome::Completed { record, .. }) => Some(&record.response),
                _ => None,
            };
            settle_record(config, &held, stored, store_key).await;
            Checked::Claim { claim, held: None }
        }
        // The key's record is gone while its authenticator remembers a result: a replay of it.
        (
            Ok(ClaimOutcome::Completed {
                record: remembered,
                ttl_remaining,
            }),
            Ok(ClaimOutcome::Claimed { token }),
        ) if remembered.response.headers.get(MARKER) == Some(&key_digest(store_key)) => {
            release_key(config, store_key, token).await;
            tracing::warn!("the key's record is gone but its authenticator's is not; answering its stored status without the body");
            let mut response = remembered.response;
            response.headers.remove(MARKER);
            let record = CompletedRecord {
                fingerprint: *fingerprint,
                response,
            };
            Checked::Claim {
                claim: Ok(ClaimOutcome::Completed {
                    record,
                    ttl_remaining,
                }),
                held: None,
            }
        }
        (_, claim) => Checked::Claim { claim, held: None },
    }
}

/// What the key's settling left for its authenticator's record: the key's status and headers
/// when it completed, `None` when it was released (read before the record is settled, so the
/// response is not held across the store's round trip).
pub(crate) fn settled_as<B>(answer: Option<&Response<B>>) -> Option<CachedResponse> {
    let completed = answer.filter(|r| r.extensions().get::<Outcome>() == Some(&Outcome::Executed));
    completed.map(|response| CachedResponse {
        status: response.status(),
        headers: cacheable_headers(response.headers()),
        body: Bytes::new(),
        body_omitted: true,
    })
}

/// Settles the authenticator's record a request held while its key ran: completed with the
/// key's status and headers (without the body) when the key completed (`stored`, from
/// [`settled_as`]), with the released marker otherwise. A failure is logged; the record then
/// stays in flight until its lease ends.
pub(crate) async fn settle(
    config: &Config,
    held: Held,
    stored: Option<CachedResponse>,
    store_key: &str,
) {
    settle_record(config, &held, stored.as_ref(), store_key).await;
}

/// What an authenticator's record stores: the key's result without its body, marked with the
/// key it belongs to, or the released marker.
fn result_marker(stored: Option<&CachedResponse>, store_key: &str) -> CachedResponse {
    let (status, mut headers, marker) = match stored {
        Some(response) => (
            response.status,
            response.headers.clone(),
            key_digest(store_key),
        ),
        None => (
            StatusCode::NO_CONTENT,
            HeaderMap::new(),
            HeaderValue::from_static(RELEASED),
        ),
    };
    headers.insert(MARKER, marker);
    CachedResponse {
        status,
        headers,
        body: Bytes::new(),
        body_omitted: stored.is_some(),
    }
}

/// A digest of the scoped key, so that one delivery sent to two routes (two scoped keys, one
/// owner) is answered from the record only on the route that ran it.
fn key_digest(store_key: &str) -> HeaderValue {
    let digest = Sha256::digest(store_key.as_bytes());
    HeaderValue::from_str(&hex::encode(&digest[..16])).expect("hex is a valid header value")
}

async fn settle_record(
    config: &Config,
    held: &Held,
    stored: Option<&CachedResponse>,
    store_key: &str,
) {
    let stored = result_marker(stored, store_key);
    let completion = metrics::timed(
        config,
        "complete",
        config
            .store
            .complete(&held.record, held.token, &stored, config.ttl),
    );
    match within(config.store_timeout(), completion).await {
        Some(Ok(_)) => {}
        _ => tracing::warn!(
            "settling the authenticator's record failed; it stays in flight until its lease ends"
        ),
    }
}

async fn release_key(config: &Config, store_key: &str, token: FencingToken) {
    match within(
        config.store_timeout(),
        metrics::timed(config, "release", config.store.release(store_key, token)),
    )
    .await
    {
        Some(Ok(_)) => {}
        _ => tracing::warn!("releasing the key failed; it stays in flight until its lease expires"),
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
