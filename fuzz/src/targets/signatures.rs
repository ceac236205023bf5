//! The signature headers of the `k=v` schemes (Stripe, Paddle), Standard Webhooks and `v0=`
//! (Slack, Zoom): the fuzzed header, then one the harness signs over the fuzzed body.

use bytes::Bytes;
use tower_idempotency_webhooks::{paddle, slack, standard, stripe, zoom, Verifier};

use crate::{check, fields, now, parts, NOW, SECRET, SW_SECRET};

/// `Stripe-Signature` (and the comma `k=v` parser): header line, then the body.
pub fn stripe_signature(data: &[u8]) {
    let verifier = stripe::StripeVerifier::new([SECRET]);
    kv_signature(data, ',', "stripe-signature", &verifier, stripe::sign);
}

/// `Paddle-Signature` (and the semicolon `k=v` parser): header line, then the body.
pub fn paddle_signature(data: &[u8]) {
    let verifier = paddle::PaddleVerifier::new([SECRET]);
    kv_signature(data, ';', "paddle-signature", &verifier, paddle::sign);
}

/// A `t=…,v1=…` scheme whose one `header` holds `separator`-separated pairs: the fuzzed header
/// line, then the body signed by `sign`.
fn kv_signature(
    data: &[u8],
    separator: char,
    header: &'static str,
    verifier: &impl Verifier,
    sign: fn(&'static str, u64, &[u8]) -> String,
) {
    let [value, body] = fields(data);
    if let Ok(text) = std::str::from_utf8(value) {
        check::kv(text, separator);
    }
    let bytes = Bytes::copy_from_slice(body);
    if let Some(p) = parts("/", &[(header, value)]) {
        check::outcome(&verifier.verify(&p, &bytes, now()), body);
    }
    let signed = sign(SECRET, NOW, body);
    let p = parts("/", &[(header, signed.as_bytes())]).expect("valid header");
    check::signed(&verifier.verify(&p, &bytes, now()), body);
}

/// Standard Webhooks' signature list: signature, id, timestamp lines, then the body.
pub fn standard_signature(data: &[u8]) {
    let [signature, id, timestamp, body] = fields(data);
    let verifier = standard::StandardWebhooksVerifier::new([SW_SECRET])
        .expect("valid secret")
        .public_keys(["whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="])
        .expect("valid key");
    let bytes = Bytes::copy_from_slice(body);
    for family in [
        ["webhook-signature", "webhook-id", "webhook-timestamp"],
        ["svix-signature", "svix-id", "svix-timestamp"],
    ] {
        if let Some(p) = parts(
            "/",
            &[
                (family[0], signature),
                (family[1], id),
                (family[2], timestamp),
            ],
        ) {
            check::outcome(&verifier.verify(&p, &bytes, now()), body);
        }
    }
    if let Some(id) = verbatim_id(id) {
        standard_self_signed(&verifier, id, body);
    }
}

/// The fuzzed id when it is a header value the verifier reads verbatim: it refuses values
/// outside visible ASCII (a `400`, not a mismatch).
fn verbatim_id(id: &[u8]) -> Option<&str> {
    let id = std::str::from_utf8(id).ok()?;
    let visible =
        !id.is_empty() && id == id.trim() && id.bytes().all(|b| (0x20..0x7f).contains(&b));
    visible.then_some(id)
}

/// Self-signed over the fuzzed id and body.
fn standard_self_signed(verifier: &standard::StandardWebhooksVerifier, id: &str, body: &[u8]) {
    let key = standard::decode_secret(SW_SECRET).expect("valid secret");
    let signed = standard::sign(&key, id, NOW, body);
    let ts = NOW.to_string();
    let p = parts(
        "/",
        &[
            ("webhook-signature", signed.as_bytes()),
            ("webhook-id", id.as_bytes()),
            ("webhook-timestamp", ts.as_bytes()),
        ],
    )
    .expect("valid headers");
    check::signed(
        &verifier.verify(&p, &Bytes::copy_from_slice(body), now()),
        body,
    );
}

/// Slack's and Zoom's `v0=` scheme: signature and timestamp lines, then the body.
pub fn v0_signature(data: &[u8]) {
    let [signature, timestamp, body] = fields(data);
    let bytes = Bytes::copy_from_slice(body);
    let slack = slack::SlackVerifier::new([SECRET]);
    let zoom = zoom::ZoomVerifier::new([SECRET]);
    if let Some(p) = v0_parts(signature, timestamp) {
        check::outcome(&slack.verify(&p, &bytes, now()), body);
        check::outcome(&zoom.verify(&p, &bytes, now()), body);
    }
    let signed = slack::sign(SECRET, NOW, body);
    let ts = NOW.to_string();
    let p = v0_parts(signed.as_bytes(), ts.as_bytes()).expect("valid headers");
    for result in [
        slack.verify(&p, &bytes, now()),
        zoom.verify(&p, &bytes, now()),
    ] {
        check::signed(&result, body);
    }
}

/// The same signature and timestamp under Slack's and Zoom's header names.
fn v0_parts(signature: &[u8], timestamp: &[u8]) -> Option<http::request::Parts> {
    parts(
        "/",
        &[
            ("x-slack-signature", signature),
            ("x-slack-request-timestamp", timestamp),
            ("x-zm-signature", signature),
            ("x-zm-request-timestamp", timestamp),
        ],
    )
}
