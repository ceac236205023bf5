//! What a provider that signs `{timestamp}{body}` with a key pair (the signature in one header,
//! the unix time in another) shares with the others: the public keys and replay window its
//! verifier holds, and, behind `test-support`, its fixture's shape.

use std::sync::Arc;

use crate::{
    error::{ConfigError, VerifyError},
    timestamp::ReplayWindow,
};

/// What a verifier holds whose provider signs a timestamp with a key pair: the public keys and
/// the replay window.
#[derive(Clone, Debug)]
pub(crate) struct PublicKeys<K> {
    keys: Arc<[K]>,
    pub(crate) tolerance: ReplayWindow,
}

impl<K> PublicKeys<K> {
    /// Every one of `keys`, trimmed and read by `parse`, under the default replay window; one key
    /// `parse` refuses refuses them all.
    pub(crate) fn parse<S: AsRef<str>>(
        keys: impl IntoIterator<Item = S>,
        mut parse: impl FnMut(&str) -> Result<K, ConfigError>,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            keys: keys
                .into_iter()
                .map(|key| parse(key.as_ref().trim()))
                .collect::<Result<_, _>>()?,
            tolerance: ReplayWindow::default(),
        })
    }

    /// Refuses to verify without any key, naming `what` is missing: a verifier built from an
    /// empty list is misconfigured, not shown a wrong signature.
    pub(crate) fn require(&self, what: &'static str) -> Result<(), VerifyError> {
        if self.keys.is_empty() {
            return Err(VerifyError::MissingConfiguration { what });
        }
        Ok(())
    }

    /// The index of the first key that `verifies` the signature.
    pub(crate) fn matching(&self, verifies: impl FnMut(&K) -> bool) -> Result<usize, VerifyError> {
        self.keys
            .iter()
            .position(verifies)
            .ok_or(VerifyError::SignatureMismatch)
    }
}

#[cfg(feature = "test-support")]
pub(crate) use fixture::KeyPairFixture;

/// The fixture of such a provider, described by its parts.
#[cfg(feature = "test-support")]
mod fixture {
    use std::sync::Arc;

    use crate::{
        testing::{Delivery, Event, Fixture, MakeBody, MakeKey, Signer},
        Verifier,
    };

    /// A [`Fixture`] from its parts: each [`Signer`] signs with the key of its
    /// [`key_seed`](crate::testing::key_seed), the verifier holds the genuine one's public half.
    #[derive(Clone, Copy)]
    pub(crate) struct KeyPairFixture {
        provider: &'static str,
        headers: [&'static str; 2],
        verifier: fn() -> Arc<dyn Verifier>,
        body: MakeBody,
        sign: fn(Signer, &[u8]) -> String,
        key: Option<MakeKey>,
    }

    impl KeyPairFixture {
        /// A provider keyed by the event's id whose `headers` are the signature header, where
        /// `sign(signer, message)` goes, and the timestamp header.
        pub(crate) const fn new(
            provider: &'static str,
            headers: [&'static str; 2],
            verifier: fn() -> Arc<dyn Verifier>,
            body: MakeBody,
            sign: fn(Signer, &[u8]) -> String,
        ) -> Self {
            Self {
                provider,
                headers,
                verifier,
                body,
                sign,
                key: None,
            }
        }

        /// The layer's key is `key(event, delivery)`, not the event's id.
        pub(crate) const fn key(mut self, key: MakeKey) -> Self {
            self.key = Some(key);
            self
        }
    }

    impl Fixture for KeyPairFixture {
        fn provider(&self) -> &'static str {
            self.provider
        }

        fn verifier(&self) -> Arc<dyn Verifier> {
            (self.verifier)()
        }

        fn event(&self, id: &str, now: u64) -> Event {
            Event {
                id: id.to_owned(),
                body: (self.body)(id, now),
            }
        }

        fn deliver(&self, signer: Signer, signed: &Event, sent: &Event, now: u64) -> Delivery {
            let [signature_header, timestamp_header] = self.headers;
            let signature = (self.sign)(signer, format!("{now}{}", signed.body).as_bytes());
            let headers = vec![
                (signature_header, signature),
                (timestamp_header, now.to_string()),
            ];
            Delivery::new(headers, sent.body.clone())
        }

        fn signature_header(&self) -> Option<&'static str> {
            Some(self.headers[0])
        }

        // The verifier holds a public key only.
        fn secret_forms(&self) -> Vec<String> {
            Vec::new()
        }

        fn key(&self, event: &Event, delivery: &Delivery) -> String {
            self.key
                .map_or_else(|| event.id.clone(), |key| key(event, delivery))
        }
    }
}
