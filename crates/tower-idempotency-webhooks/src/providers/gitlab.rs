//! [GitLab](https://docs.gitlab.com/user/project/integrations/webhooks/): the secret token is
//! sent as is in `X-Gitlab-Token` (no signature: the body is protected by TLS only) and compared
//! in constant time; keyed by `Idempotency-Key`, which GitLab keeps across retries, falling back
//! to `X-Gitlab-Event-UUID`.
//!
//! GitLab retries failed deliveries only in limited cases and lets users resend recent
//! deliveries by hand from the webhook's log; [`DEFAULT_TTL`] is three days.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::request::Parts;

use crate::{
    error::VerifyError,
    event_id, headers,
    secret::{self, Secret},
    signature,
    verified::VerifiedWebhook,
    verifier::{verifier_settings, Verifier},
};

/// The provider name and store namespace.
pub const PROVIDER: &str = "gitlab";
/// The token header.
pub const TOKEN_HEADER: &str = "x-gitlab-token";
/// The idempotency key header: the key.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
/// The event UUID header: the key for GitLab versions without `Idempotency-Key`.
pub const EVENT_UUID_HEADER: &str = "x-gitlab-event-uuid";
/// Three days.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3 * 24 * 60 * 60);

/// Verifies GitLab deliveries.
#[derive(Clone, Debug)]
pub struct GitLabVerifier {
    tokens: Arc<[Secret]>,
}

impl GitLabVerifier {
    /// Accepts deliveries carrying any of `tokens`.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes.
    pub fn new<S: Into<Secret>>(tokens: impl IntoIterator<Item = S>) -> Self {
        Self {
            tokens: secret::collect(PROVIDER, tokens),
        }
    }
}

impl Verifier for GitLabVerifier {
    fn verify(
        &self,
        parts: &Parts,
        body: &Bytes,
        _now: SystemTime,
    ) -> Result<VerifiedWebhook, VerifyError> {
        if self.tokens.is_empty() {
            return Err(VerifyError::MissingConfiguration { what: "token" });
        }
        let token = headers::required(&parts.headers, TOKEN_HEADER)?;
        let index = self
            .tokens
            .iter()
            .position(|t| signature::token_eq(t.expose(), token.as_bytes()))
            .ok_or(VerifyError::SignatureMismatch)?;
        let id = match headers::header(&parts.headers, IDEMPOTENCY_HEADER)? {
            Some(id) => event_id::check_id(id.to_owned(), IDEMPOTENCY_HEADER)?,
            None => {
                event_id::header_id(&parts.headers, EVENT_UUID_HEADER).map_err(|e| match e {
                    VerifyError::MissingEventId { .. } => VerifyError::MissingEventId {
                        location: IDEMPOTENCY_HEADER,
                    },
                    other => other,
                })?
            }
        };
        Ok(VerifiedWebhook::new(PROVIDER, id, body.clone())
            .with_secret_index(index)
            .with_unsigned_event_id())
    }

    verifier_settings!(PROVIDER, DEFAULT_TTL);
}

/// The fixture the tests and benches sign GitLab deliveries with.
#[cfg(feature = "test-support")]
pub(crate) fn fixture() -> crate::testing::HmacFixture {
    use crate::testing::{Delivery, HmacFixture, Outcome, Recapture};

    HmacFixture::new(
        PROVIDER,
        "glpat-fixture-token",
        Some(TOKEN_HEADER),
        |token| Arc::new(GitLabVerifier::new([token])),
        |id, _| format!(r#"{{"object_kind":"push","ref":"refs/heads/{id}"}}"#),
        |token, _, sent, _| {
            let headers = vec![
                (TOKEN_HEADER, token.to_owned()),
                (IDEMPOTENCY_HEADER, sent.id.clone()),
                ("x-gitlab-event", "Push Hook".into()),
            ];
            Delivery::new(headers, sent.body.clone())
        },
    )
    // The token is a bare shared secret: the body is protected by TLS only, and a captured
    // delivery holds the credential itself, nothing to bind it to its key.
    .without_tamper_evidence()
    .recapture(Recapture::Header(IDEMPOTENCY_HEADER, Outcome::Runs))
}
