//! Slack's `v0` scheme, which Zoom uses under other header names: `v0=<hex>` in one header,
//! the signed unix time in another, HMAC-SHA256 over `v0:{timestamp}:{body}`.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName};

use crate::{
    error::VerifyError,
    headers,
    secret::Secret,
    signature::{self, Encoding, HmacAlgorithm},
    timestamp,
};

/// The scheme under a provider's header names.
pub(crate) struct V0Scheme {
    /// The signature header.
    pub(crate) signature_header: HeaderName,
    /// The signed timestamp header.
    pub(crate) timestamp_header: HeaderName,
}

impl V0Scheme {
    /// Verifies the headers against `body`, replay window included: returns the signed time and
    /// the matching secret.
    pub(crate) fn verify(
        &'static self,
        headers: &HeaderMap,
        body: &[u8],
        secrets: &[Secret],
        now: SystemTime,
        tolerance: Option<Duration>,
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
        let index = signature::match_hmac(
            HmacAlgorithm::Sha256,
            secrets,
            &[b"v0:", timestamp.as_bytes(), b":", body],
            &candidates,
        )?;
        timestamp::check_window(timestamp_header, signed, now, tolerance)?;
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
}
