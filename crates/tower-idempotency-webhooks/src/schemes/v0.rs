//! Slack's `v0` scheme, which Zoom uses under other header names: `v0=<hex>` in one header,
//! the signed unix time in another, HMAC-SHA256 over `v0:{timestamp}:{body}`.

use std::time::SystemTime;

use http::{HeaderMap, HeaderName};

use crate::{
    error::VerifyError,
    headers,
    providers::timed_secrets::TimedSecrets,
    signature::{self, Encoding, HmacAlgorithm},
    timestamp,
};

/// The scheme under a provider's header names.
pub(crate) struct V0Scheme {
    /// The signature header.
    signature_header: HeaderName,
    /// The signed timestamp header.
    timestamp_header: HeaderName,
}

impl V0Scheme {
    /// The scheme with `v0=<hex>` in `signature_header` and the time in `timestamp_header`
    /// (lower-case names).
    pub(crate) const fn new(
        signature_header: &'static str,
        timestamp_header: &'static str,
    ) -> Self {
        Self {
            signature_header: HeaderName::from_static(signature_header),
            timestamp_header: HeaderName::from_static(timestamp_header),
        }
    }

    /// Verifies the headers against `body` with `keys`, replay window included: returns the
    /// signed time and the matching secret.
    pub(crate) fn verify(
        &'static self,
        headers: &HeaderMap,
        body: &[u8],
        keys: &TimedSecrets,
        now: SystemTime,
    ) -> Result<(u64, usize), VerifyError> {
        let timestamp = headers::required(headers, &self.timestamp_header)?;
        let value = headers::required(headers, &self.signature_header)?;
        let (signature_header, timestamp_header) = (
            self.signature_header.as_str(),
            self.timestamp_header.as_str(),
        );
        let signature = headers::prefixed(signature_header, value, "v0=")?;
        let signed = timestamp::parse_unix(timestamp_header, timestamp)?;
        let candidates = signature::decode_all(signature_header, &[signature], Encoding::Hex)?;
        let index = keys.matching(&[b"v0:", timestamp.as_bytes(), b":", body], &candidates)?;
        keys.tolerance.check(timestamp_header, signed, now)?;
        Ok((signed, index))
    }

    /// The `v0=<hex>` signature for `body` at `timestamp`.
    pub(crate) fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
        let ts = timestamp.to_string();
        let mac = signature::hmac(
            HmacAlgorithm::Sha256,
            secret,
            &[b"v0:", ts.as_bytes(), b":", body],
        );
        format!("v0={}", hex::encode(mac))
    }

    /// A fixture's delivery of `sent` carrying the signature over `signed` made with `secret` at
    /// `now` (see [`crate::testing::MakeDelivery`]).
    #[cfg(feature = "test-support")]
    pub(crate) fn delivery(
        &'static self,
        secret: &str,
        signed: &crate::testing::Event,
        sent: &crate::testing::Event,
        now: u64,
    ) -> crate::testing::Delivery {
        let headers = vec![
            (
                self.signature_header.as_str(),
                Self::sign(secret.as_bytes(), now, signed.body.as_bytes()),
            ),
            (self.timestamp_header.as_str(), now.to_string()),
        ];
        crate::testing::Delivery::new(headers, sent.body.clone())
    }
}
