//! The fixture of a provider whose credential is one shared secret (an HMAC key or a token),
//! described by its parts.

use std::sync::Arc;

use http::Method;

use super::{Delivery, Event, Fixture, Recapture, Signer, ATTACKER_SECRET};
use crate::Verifier;

/// The verifier holding `secret`.
pub type MakeVerifier = fn(&'static str) -> Arc<dyn Verifier>;
/// The body of the event `id` at `now`.
pub type MakeBody = fn(&str, u64) -> String;
/// A delivery of `sent` carrying the signature over `signed` made with `secret` at `now`.
pub type MakeDelivery = fn(&str, &Event, &Event, u64) -> Delivery;
/// The key the layer derives from a delivery of an event.
pub type MakeKey = fn(&Event, &Delivery) -> String;

/// A [`Fixture`] from its parts, for the providers signing with a shared secret: the genuine
/// signer uses `secret`, the attacker [`ATTACKER_SECRET`].
#[derive(Clone, Copy)]
pub struct HmacFixture {
    provider: &'static str,
    secret: &'static str,
    signature_header: Option<&'static str>,
    verifier: MakeVerifier,
    body: MakeBody,
    deliver: MakeDelivery,
    key: Option<MakeKey>,
    detects_tampering: bool,
    signs_path: bool,
    other_methods: &'static [Method],
    recapture: Recapture,
}

impl HmacFixture {
    /// A provider keyed by the event's id, whose signature covers the body and not the path,
    /// which sends `POST` only, and whose key cannot be changed without a new signature.
    pub const fn new(
        provider: &'static str,
        secret: &'static str,
        signature_header: Option<&'static str>,
        verifier: MakeVerifier,
        body: MakeBody,
        deliver: MakeDelivery,
    ) -> Self {
        Self {
            provider,
            secret,
            signature_header,
            verifier,
            body,
            deliver,
            key: None,
            detects_tampering: true,
            signs_path: false,
            other_methods: &[],
            recapture: Recapture::Signed,
        }
    }

    /// The layer's key is `key(event, delivery)`, not the event's id.
    pub const fn key(mut self, key: MakeKey) -> Self {
        self.key = Some(key);
        self
    }

    /// The credential does not cover the body (a bare token).
    pub const fn without_tamper_evidence(mut self) -> Self {
        self.detects_tampering = false;
        self
    }

    /// The signature covers the request's path.
    pub const fn signs_path(mut self) -> Self {
        self.signs_path = true;
        self
    }

    /// The provider also sends deliveries with `methods`.
    pub const fn other_methods(mut self, methods: &'static [Method]) -> Self {
        self.other_methods = methods;
        self
    }

    /// A captured delivery can be re-sent under another key as `recapture` says.
    pub const fn recapture(mut self, recapture: Recapture) -> Self {
        self.recapture = recapture;
        self
    }
}

impl Fixture for HmacFixture {
    fn provider(&self) -> &'static str {
        self.provider
    }

    fn verifier(&self) -> Arc<dyn Verifier> {
        (self.verifier)(self.secret)
    }

    fn event(&self, id: &str, now: u64) -> Event {
        Event {
            id: id.to_owned(),
            body: (self.body)(id, now),
        }
    }

    fn deliver(&self, signer: Signer, signed: &Event, sent: &Event, now: u64) -> Delivery {
        let secret = match signer {
            Signer::Genuine => self.secret,
            Signer::Attacker => ATTACKER_SECRET,
        };
        (self.deliver)(secret, signed, sent, now)
    }

    fn signature_header(&self) -> Option<&'static str> {
        self.signature_header
    }

    fn secret_forms(&self) -> Vec<String> {
        vec![self.secret.to_owned()]
    }

    fn key(&self, event: &Event, delivery: &Delivery) -> String {
        match self.key {
            Some(key) => key(event, delivery),
            None => event.id.clone(),
        }
    }

    fn detects_tampering(&self) -> bool {
        self.detects_tampering
    }

    fn signs_path(&self) -> bool {
        self.signs_path
    }

    fn other_methods(&self) -> &'static [Method] {
        self.other_methods
    }

    fn recapture(&self) -> Recapture {
        self.recapture
    }
}
