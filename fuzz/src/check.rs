//! The oracles every verification outcome is held to.

use tower_idempotency_webhooks::{__fuzz, VerifiedWebhook, VerifyError};

use crate::{stats, SECRET};

/// What every verification outcome must satisfy.
pub(crate) fn outcome(result: &Result<VerifiedWebhook, VerifyError>, body: &[u8]) {
    stats::bump(if result.is_ok() {
        &stats::ACCEPTED
    } else {
        &stats::REFUSED
    });
    match result {
        Ok(hook) => {
            assert_eq!(hook.body().as_ref(), body);
            event_id(hook.event_id());
        }
        Err(error) => {
            let text = error.to_string();
            assert!(!text.contains(SECRET), "secret in error: {text}");
            assert!(!error.status().is_success());
        }
    }
}

/// An event id is non-empty, at most 255 bytes and free of control characters.
pub(crate) fn event_id(id: &str) {
    assert!(!id.is_empty() && id.len() <= 255 && !id.chars().any(char::is_control));
}

/// A delivery the harness signed itself may be refused for its body or ids, never for its
/// signature.
pub(crate) fn self_signed(result: &Result<VerifiedWebhook, VerifyError>) {
    if let Err(error) = result {
        assert!(
            !matches!(
                error,
                VerifyError::SignatureMismatch
                    | VerifyError::MalformedHeader { .. }
                    | VerifyError::UnsupportedVersion { .. }
                    | VerifyError::TimestampOutsideTolerance { .. }
            ),
            "self-signed delivery refused: {error:?}"
        );
    }
}

/// [`outcome`] and [`self_signed`]: the checks of a delivery the harness signed.
pub(crate) fn signed(result: &Result<VerifiedWebhook, VerifyError>, body: &[u8]) {
    outcome(result, body);
    self_signed(result);
}

/// The `k=v` list parser's output respects its bounds.
pub(crate) fn kv(text: &str, separator: char) {
    if let Ok(pairs) = __fuzz::kv_pairs(text, separator) {
        assert!(pairs.len() <= 2 * __fuzz::MAX_SIGNATURES + 4);
        for (key, value) in pairs {
            assert!(!key.is_empty() && !value.is_empty());
            assert!(!key.contains(separator) && !value.contains(separator));
            assert_eq!(key, key.trim());
        }
    }
}
