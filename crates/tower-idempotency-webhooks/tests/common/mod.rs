#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::request::Parts;
use tower_idempotency_webhooks::{VerifiedWebhook, Verifier, VerifyError};

// SendGrid: the vector of the official SDKs' tests, e.g. sendgrid/sendgrid-java
// src/test/java/com/sendgrid/helpers/eventwebhook/EventWebhookTest.java (the same key, payload,
// signature and timestamp appear in sendgrid-nodejs, -python, -ruby, -php and -go).
pub const SG_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==";
pub const SG_SIG: &str = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0=";
pub const SG_PAYLOAD: &[u8] =
    br#"{"category":"example_payload","event":"test_event","message_id":"message_id"}"#;
pub const SG_TS: u64 = 1_588_788_367;

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
