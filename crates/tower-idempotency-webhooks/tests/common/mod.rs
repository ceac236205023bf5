#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::request::Parts;
use tower_idempotency_webhooks::{VerifiedWebhook, Verifier, VerifyError};

pub fn parts(headers: &[(&str, &str)]) -> Parts {
    let mut builder = http::Request::post("/hook");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap().into_parts().0
}

pub fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

pub fn verify(
    verifier: &impl Verifier,
    headers: &[(&str, &str)],
    body: &[u8],
    now: u64,
) -> Result<VerifiedWebhook, VerifyError> {
    verifier.verify(&parts(headers), &Bytes::copy_from_slice(body), at(now))
}
