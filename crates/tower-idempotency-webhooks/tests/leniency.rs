//! Input the official verifiers ignore is ignored here too, and nothing they refuse is accepted:
//! svix-webhooks (`go/webhook.go`: members split on `,`, a member without one skipped, parts
//! after the second ignored), `@linear/sdk` (`webhookTimestamp` compared as a JS number, so
//! `1700000000000.0` is the same instant) and `@sendgrid/eventwebhook` (the verification key
//! as PEM or as bare base64).

mod common;

use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};
use common::{at, verify, SG_KEY, SG_PAYLOAD, SG_SIG, SG_TS};
use tower_idempotency_webhooks::{linear, sendgrid, standard, VerifyError};

const NOW: u64 = 1_700_000_000;

// The Standard Webhooks specification's vector.
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TS: u64 = 1_614_265_330;
const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SW_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn standard_with(signature: &str) -> Result<String, VerifyError> {
    let v = standard::StandardWebhooksVerifier::new([SW_SECRET]).unwrap();
    let ts = SW_TS.to_string();
    let headers = [
        ("svix-id", SW_ID),
        ("svix-timestamp", ts.as_str()),
        ("svix-signature", signature),
    ];
    verify(&v, &headers, SW_BODY, SW_TS).map(|hook| hook.event_id().to_owned())
}

#[test]
fn svix_members_without_version_or_with_a_trailing_part_are_ignored() {
    let other = standard::sign(b"another key entirely", SW_ID, SW_TS, SW_BODY);
    for header in [
        format!("{SW_SIG},extra"),
        format!("{SW_SIG},extra,more"),
        format!("unversioned {SW_SIG}"),
        format!("{SW_SIG} unversioned"),
        format!("v1 {other},x {SW_SIG}"),
    ] {
        assert_eq!(standard_with(&header).as_deref(), Ok(SW_ID), "{header}");
    }
    // Nothing the official verifier refuses: no member that verifies, or only unversioned ones.
    for header in [
        format!("{other},extra"),
        format!("unversioned {other}"),
        format!("v1,{}", &SW_SIG[3..10]),
        format!("v2,{} x", &SW_SIG[3..]),
    ] {
        assert!(standard_with(&header).is_err(), "{header}");
    }
    assert!(matches!(
        standard_with(&SW_SIG[3..]),
        Err(VerifyError::MalformedHeader { .. })
    ));
}

fn linear_with(timestamp: &str) -> Result<(), VerifyError> {
    let v = linear::LinearVerifier::new(["lin_wh_leniency_secret_5d1c"]);
    let body = format!(r#"{{"action":"create","type":"Issue","webhookTimestamp":{timestamp}}}"#);
    let sig = linear::sign("lin_wh_leniency_secret_5d1c", body.as_bytes());
    let headers = [
        ("linear-signature", sig.as_str()),
        ("linear-delivery", "d1"),
    ];
    let hook = verify(&v, &headers, body.as_bytes(), NOW)?;
    assert_eq!(hook.signed_at(), Some(at(NOW)));
    Ok(())
}

#[test]
fn linear_timestamp_written_as_a_float_of_whole_milliseconds() {
    let ms = NOW * 1000;
    for written in [
        format!("{ms}.0"),
        format!("{ms}.000"),
        format!("{NOW}e3"),
        format!("{NOW}.0E+3"),
        format!("{}.5e3", NOW),
    ] {
        // `{NOW}.5e3` is NOW * 1000 + 500 ms: a whole number of milliseconds.
        assert_eq!(linear_with(&written), Ok(()), "{written}");
    }
    let invalid = VerifyError::InvalidTimestamp {
        name: "webhookTimestamp",
    };
    for written in [format!("{ms}.5"), format!("-{ms}.0"), "9.9e300".to_owned()] {
        assert_eq!(linear_with(&written), Err(invalid.clone()), "{written}");
    }
    // Out of the range of a double: not JSON serde_json reads (JavaScript reads Infinity).
    assert!(linear_with("1e400").is_err());
    assert!(matches!(
        linear_with(&format!("{}.0", ms + 400_000)),
        Err(VerifyError::TimestampOutsideTolerance { .. })
    ));
}

#[test]
fn sendgrid_verification_key_as_pem() {
    let wrapped: Vec<&str> = SG_KEY
        .as_bytes()
        .chunks(64)
        .map(|line| std::str::from_utf8(line).unwrap())
        .collect();
    for pem in [
        // As `@sendgrid/eventwebhook` builds it from the console's key: one long line.
        format!("-----BEGIN PUBLIC KEY-----\n{SG_KEY}\n-----END PUBLIC KEY-----"),
        // As OpenSSL writes it: 64-character lines, a final newline, or CRLF.
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            wrapped.join("\n")
        ),
        format!(
            "-----BEGIN PUBLIC KEY-----\r\n{}\r\n-----END PUBLIC KEY-----\r\n",
            wrapped.join("\r\n")
        ),
    ] {
        let v = sendgrid::SendGridVerifier::new([&pem]).unwrap();
        let headers = [
            ("x-twilio-email-event-webhook-signature", SG_SIG),
            ("x-twilio-email-event-webhook-timestamp", "1588788367"),
        ];
        let hook = verify(&v, &headers, SG_PAYLOAD, SG_TS).unwrap();
        assert!(hook.event_id().starts_with("sha256:"), "{pem}");
        assert_eq!(
            verify(&v, &headers, b"other payload", SG_TS).unwrap_err(),
            VerifyError::SignatureMismatch
        );
    }
    let der = BASE64.decode(SG_KEY).unwrap();
    let bad = [
        // Another PEM type, a missing end line, text outside the block, not base64 inside.
        format!("-----BEGIN CERTIFICATE-----\n{SG_KEY}\n-----END CERTIFICATE-----"),
        format!("-----BEGIN PUBLIC KEY-----\n{SG_KEY}\n"),
        format!("junk -----BEGIN PUBLIC KEY-----\n{SG_KEY}\n-----END PUBLIC KEY-----"),
        "-----BEGIN PUBLIC KEY-----\n@@@@\n-----END PUBLIC KEY-----".to_owned(),
        // Not a P-256 key.
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----",
            BASE64.encode(&der[..der.len() - 1])
        ),
    ];
    for pem in bad {
        assert!(sendgrid::SendGridVerifier::new([&pem]).is_err(), "{pem}");
    }
}
