//! The secrets and replay window of a verifier whose provider signs a timestamp with a shared
//! secret.

use std::sync::Arc;

use crate::{
    error::VerifyError,
    secret::{self, Secret},
    signature::{self, Candidate, HmacAlgorithm},
    timestamp::ReplayWindow,
};

/// What a verifier holds whose provider signs a timestamp with a shared secret (HMAC-SHA256): the
/// secrets, current first, and the replay window.
#[derive(Clone, Debug)]
pub(crate) struct TimedSecrets {
    pub(crate) secrets: Arc<[Secret]>,
    pub(crate) tolerance: ReplayWindow,
}

impl TimedSecrets {
    /// `secrets` under the default replay window.
    ///
    /// # Panics
    /// If a secret is empty or shorter than [`MIN_SECRET_LEN`](crate::MIN_SECRET_LEN) bytes; the
    /// message names `provider` and the rule, never the secret.
    pub(crate) fn new<S: Into<Secret>>(
        provider: &str,
        secrets: impl IntoIterator<Item = S>,
    ) -> Self {
        Self {
            secrets: secret::collect(provider, secrets),
            tolerance: ReplayWindow::default(),
        }
    }

    /// The index of the first secret whose HMAC-SHA256 of `chunks` is one of `candidates`,
    /// compared in constant time.
    pub(crate) fn matching(
        &self,
        chunks: &[&[u8]],
        candidates: &[Candidate],
    ) -> Result<usize, VerifyError> {
        signature::match_hmac(HmacAlgorithm::Sha256, &self.secrets, chunks, candidates)
    }
}
