//! The cases shared by the criterion bench (`verify.rs`) and the paired-ratio bench
//! (`ratios.rs`): every shipped provider with a valid delivery of about `size` bytes, and the
//! floors (the raw primitive over the same bytes).

#![allow(dead_code)]

use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use ed25519_dalek::{Signer as _, SigningKey, Verifier as _};
use hmac::{Hmac, Mac};
use http::request::Parts;
use p256::{
    ecdsa::{Signature as P256Signature, SigningKey as P256SigningKey},
    pkcs8::EncodePublicKey,
};
use tower_idempotency_webhooks::{
    discord, generic::EventId, generic::HmacVerifier, generic::Part, github, gitlab, linear,
    mailgun, paddle, sendgrid, shopify, slack, square, standard, stripe, twilio, zoom, Verifier,
};

pub const TS: u64 = 1_700_000_000;
pub const SECRET: &str = "whsec_bench_secret_0123456789";
pub const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub fn parts(uri: &str, headers: &[(&str, String)]) -> Parts {
    let mut builder = http::Request::post(uri);
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    builder.body(()).unwrap().into_parts().0
}

/// A JSON event of about `len` bytes carrying every provider's id fields.
pub fn json_body(len: usize) -> Bytes {
    let signature = mailgun::sign(SECRET, TS, "tok-1");
    let head = serde_json::json!({
        "id": "evt_1",
        "event_id": "evt_1",
        "type": "event_callback",
        "event": "meeting.started",
        "webhookTimestamp": TS * 1000,
        "signature": signature,
        "event-data": { "id": "e1" },
    })
    .to_string();
    // Realistic filler: many small members (what building a `Value` is slow on), not one long
    // string.
    let mut items = String::new();
    let mut i = 0;
    while head.len() + items.len() + 64 < len {
        if i > 0 {
            items.push(',');
        }
        items.push_str(&format!(r#"{{"k":"value-{i}","n":{i},"ok":true}}"#));
        i += 1;
    }
    let doc = format!(r#"{},"items":[{items}]}}"#, &head[..head.len() - 1]);
    let pad = " ".repeat(len.saturating_sub(doc.len()));
    Bytes::from(format!("{doc}{pad}"))
}

/// A Twilio-style form of about `len` bytes.
pub fn form_body(len: usize) -> Bytes {
    let head = "CallSid=CA1&CallStatus=ringing&From=%2B15551230000&To=%2B15559870000&Body=";
    let filler = "a+b%2Cc".repeat(len.saturating_sub(head.len()) / 7);
    Bytes::from(format!("{head}{filler}"))
}

pub fn hmac_floor<M: Mac + hmac::digest::KeyInit>(body: &[u8]) -> impl Fn() -> usize + '_ {
    move || {
        let mut mac = <M as Mac>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(body);
        mac.finalize().into_bytes().len()
    }
}

type VerifierCase = (&'static str, Box<dyn Verifier>, Parts, Bytes);

fn verifier_cases(size: usize) -> (Vec<VerifierCase>, Bytes, Bytes) {
    let body = json_body(size);
    let form = form_body(size);
    let ts = TS.to_string();
    let sw_key = standard::decode_secret(SW_SECRET).unwrap();
    let discord_key = SigningKey::from_bytes(&[7; 32]);
    let sendgrid_key = P256SigningKey::from_slice(&[9; 32]).unwrap();
    let sendgrid_public = base64::engine::general_purpose::STANDARD.encode(
        sendgrid_key
            .verifying_key()
            .to_public_key_der()
            .unwrap()
            .as_bytes(),
    );
    let signed = [ts.as_bytes(), &body].concat();
    let discord_sig = hex::encode(discord_key.sign(&signed).to_bytes());
    let sendgrid_sig: P256Signature = sendgrid_key.sign(&signed);
    let sendgrid_sig = base64::engine::general_purpose::STANDARD.encode(sendgrid_sig.to_der());
    let generic = HmacVerifier::builder("acme")
        .secrets([SECRET])
        .signature_header("x-acme-signature")
        .signed_parts([Part::Id, Part::Literal("."), Part::Body])
        .event_id(EventId::Header("x-acme-id"))
        .build()
        .unwrap();
    let generic_sig = generic.sign(SECRET, None, Some("e"), &body);
    let generic_json = HmacVerifier::builder("acme")
        .secrets([SECRET])
        .signature_header("x-acme-signature")
        .event_id(EventId::JsonPointer("/event-data/id"))
        .build()
        .unwrap();
    let generic_json_sig = generic_json.sign(SECRET, None, None, &body);
    let twilio_url = "https://example.com/twilio?x=1";
    let form_params: Vec<(String, String)> = form_urlencoded::parse(&form).into_owned().collect();
    let form_refs: Vec<(&str, &str)> = form_params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let twilio_form_sig = twilio::sign(SECRET, twilio_url, &form_refs);
    let twilio_json_url = twilio::url_with_body_sha256(twilio_url, &body);
    let twilio_json_sig = twilio::sign(SECRET, &twilio_json_url, &[]);
    let twilio_json_path = twilio_json_url["https://example.com".len()..].to_owned();
    let list: Vec<VerifierCase> = vec![
        (
            "stripe",
            Box::new(stripe::StripeVerifier::new([SECRET])),
            parts(
                "/",
                &[("stripe-signature", stripe::sign(SECRET, TS, &body))],
            ),
            body.clone(),
        ),
        (
            "github",
            Box::new(github::GitHubVerifier::new([SECRET])),
            parts(
                "/",
                &[
                    ("x-hub-signature-256", github::sign(SECRET, &body)),
                    ("x-github-delivery", "d".into()),
                ],
            ),
            body.clone(),
        ),
        (
            "slack",
            Box::new(slack::SlackVerifier::new([SECRET])),
            parts(
                "/",
                &[
                    ("x-slack-signature", slack::sign(SECRET, TS, &body)),
                    ("x-slack-request-timestamp", ts.clone()),
                ],
            ),
            body.clone(),
        ),
        (
            "standard_webhooks",
            Box::new(standard::StandardWebhooksVerifier::new([SW_SECRET]).unwrap()),
            parts(
                "/",
                &[
                    (
                        "webhook-signature",
                        standard::sign(&sw_key, "msg_1", TS, &body),
                    ),
                    ("webhook-id", "msg_1".into()),
                    ("webhook-timestamp", ts.clone()),
                ],
            ),
            body.clone(),
        ),
        (
            "shopify",
            Box::new(shopify::ShopifyVerifier::new([SECRET])),
            parts(
                "/",
                &[
                    ("x-shopify-hmac-sha256", shopify::sign(SECRET, &body)),
                    ("x-shopify-event-id", "e".into()),
                ],
            ),
            body.clone(),
        ),
        (
            "paddle",
            Box::new(paddle::PaddleVerifier::new([SECRET])),
            parts(
                "/",
                &[("paddle-signature", paddle::sign(SECRET, TS, &body))],
            ),
            body.clone(),
        ),
        (
            "linear",
            Box::new(linear::LinearVerifier::new([SECRET])),
            parts(
                "/",
                &[
                    ("linear-signature", linear::sign(SECRET, &body)),
                    ("linear-delivery", "d".into()),
                ],
            ),
            body.clone(),
        ),
        (
            "gitlab",
            Box::new(gitlab::GitLabVerifier::new([SECRET])),
            parts(
                "/",
                &[
                    ("x-gitlab-token", SECRET.into()),
                    ("idempotency-key", "k".into()),
                ],
            ),
            body.clone(),
        ),
        (
            "zoom",
            Box::new(zoom::ZoomVerifier::new([SECRET])),
            parts(
                "/",
                &[
                    ("x-zm-signature", zoom::sign(SECRET, TS, &body)),
                    ("x-zm-request-timestamp", ts.clone()),
                ],
            ),
            body.clone(),
        ),
        (
            "mailgun",
            Box::new(mailgun::MailgunVerifier::new([SECRET])),
            parts("/", &[]),
            body.clone(),
        ),
        (
            "square",
            Box::new(square::SquareVerifier::new("https://example.com/sq", [SECRET]).unwrap()),
            parts(
                "/sq",
                &[(
                    "x-square-hmacsha256-signature",
                    square::sign(SECRET, "https://example.com/sq", &body),
                )],
            ),
            body.clone(),
        ),
        (
            "twilio_form",
            Box::new(twilio::TwilioVerifier::new("https://example.com", [SECRET]).unwrap()),
            parts(
                "/twilio?x=1",
                &[
                    ("x-twilio-signature", twilio_form_sig),
                    (
                        "content-type",
                        "application/x-www-form-urlencoded".to_owned(),
                    ),
                ],
            ),
            form.clone(),
        ),
        (
            "twilio_json",
            Box::new(twilio::TwilioVerifier::new("https://example.com", [SECRET]).unwrap()),
            parts(
                &twilio_json_path,
                &[
                    ("x-twilio-signature", twilio_json_sig),
                    ("i-twilio-idempotency-token", "idem-1".to_owned()),
                ],
            ),
            body.clone(),
        ),
        (
            "generic_hmac",
            Box::new(generic),
            parts(
                "/",
                &[("x-acme-signature", generic_sig), ("x-acme-id", "e".into())],
            ),
            body.clone(),
        ),
        (
            "generic_json_pointer",
            Box::new(generic_json),
            parts("/", &[("x-acme-signature", generic_json_sig)]),
            body.clone(),
        ),
        (
            "discord",
            Box::new(
                discord::DiscordVerifier::new([hex::encode(
                    discord_key.verifying_key().as_bytes(),
                )])
                .unwrap(),
            ),
            parts(
                "/",
                &[
                    ("x-signature-ed25519", discord_sig),
                    ("x-signature-timestamp", ts.clone()),
                ],
            ),
            body.clone(),
        ),
        (
            "sendgrid",
            Box::new(sendgrid::SendGridVerifier::new([sendgrid_public]).unwrap()),
            parts(
                "/",
                &[
                    ("x-twilio-email-event-webhook-signature", sendgrid_sig),
                    ("x-twilio-email-event-webhook-timestamp", ts.clone()),
                ],
            ),
            body.clone(),
        ),
    ];
    (list, body, form)
}

/// Something to time.
pub type Run = Box<dyn Fn() -> bool>;

/// A provider case and the floor it is compared with.
pub struct Case {
    pub name: &'static str,
    pub floor: &'static str,
    pub run: Run,
}

/// Every case for bodies of about `size` bytes, and the floors by name.
pub fn cases(size: usize) -> (Vec<Case>, Vec<(&'static str, Run)>) {
    let now = UNIX_EPOCH + Duration::from_secs(TS);
    let (list, body, form) = verifier_cases(size);
    let mut cases = Vec::new();
    for (name, verifier, parts, body) in list {
        verifier
            .verify(&parts, &body, now)
            .unwrap_or_else(|e| panic!("{name} bench setup: {e}"));
        let floor = match name {
            "twilio_form" => "floor_hmac_sha1_form",
            "twilio_json" => "floor_sha256_plus_hmac_sha1",
            "discord" => "floor_ed25519",
            "sendgrid" => "floor_ecdsa_p256",
            _ => "floor_hmac_sha256",
        };
        cases.push(Case {
            name,
            floor,
            run: Box::new(move || verifier.verify(&parts, &body, now).is_ok()),
        });
    }

    // Worst case for the field scan: the id after all the filler, so the whole body is parsed
    // (skipped, not built).
    let id_last = {
        let text = std::str::from_utf8(&body).unwrap().trim_end();
        let text = text[..text.len() - 1].replacen(r#""id":"evt_1""#, r#""xd":"evt_1""#, 1);
        Bytes::from(format!(r#"{text},"id":"evt_1"}}"#))
    };
    let stripe_last = stripe::StripeVerifier::new([SECRET]);
    let last_parts = parts(
        "/",
        &[("stripe-signature", stripe::sign(SECRET, TS, &id_last))],
    );
    stripe_last.verify(&last_parts, &id_last, now).unwrap();
    cases.push(Case {
        name: "stripe_id_last",
        floor: "floor_hmac_sha256",
        run: Box::new(move || stripe_last.verify(&last_parts, &id_last, now).is_ok()),
    });
    // Best case, and how Stripe sends events: `id` is the first member, so the scan stops there.
    let id_first = {
        let text = std::str::from_utf8(&body).unwrap();
        let rest = text.replacen(r#""id":"evt_1","#, "", 1);
        Bytes::from(format!(r#"{{"id":"evt_1",{}"#, &rest[1..]))
    };
    let stripe_first = stripe::StripeVerifier::new([SECRET]);
    let first_parts = parts(
        "/",
        &[("stripe-signature", stripe::sign(SECRET, TS, &id_first))],
    );
    assert_eq!(
        stripe_first
            .verify(&first_parts, &id_first, now)
            .unwrap()
            .event_id(),
        "evt_1"
    );
    cases.push(Case {
        name: "stripe_id_first",
        floor: "floor_hmac_sha256",
        run: Box::new(move || stripe_first.verify(&first_parts, &id_first, now).is_ok()),
    });
    // The verify-only cost: a wrong secret fails right after the MAC.
    let wrong = stripe::StripeVerifier::new(["whsec_other"]);
    let wrong_parts = parts(
        "/",
        &[("stripe-signature", stripe::sign(SECRET, TS, &body))],
    );
    let wrong_body = body.clone();
    cases.push(Case {
        name: "stripe_wrong_secret",
        floor: "floor_hmac_sha256",
        run: Box::new(move || wrong.verify(&wrong_parts, &wrong_body, now).is_err()),
    });
    // What the JSON-keyed verifiers used to add: building a `Value` of the whole body.
    let value_body = body.clone();
    cases.push(Case {
        name: "ref_serde_json_value",
        floor: "floor_hmac_sha256",
        run: Box::new(move || serde_json::from_slice::<serde_json::Value>(&value_body).is_ok()),
    });

    let ts = TS.to_string();
    let signed = [ts.as_bytes(), &body].concat();
    let discord_key = SigningKey::from_bytes(&[7; 32]);
    let ed_sig = discord_key.sign(&signed);
    let ed_public = discord_key.verifying_key();
    let p256_key = P256SigningKey::from_slice(&[9; 32]).unwrap();
    let p256_sig: P256Signature = p256_key.sign(&signed);
    let p256_public = *p256_key.verifying_key();
    let signed_p256 = signed.clone();
    let (b1, b2) = (body.clone(), body);
    let floors: Vec<(&'static str, Run)> = vec![
        (
            "floor_hmac_sha256",
            Box::new(move || hmac_floor::<Hmac<sha2::Sha256>>(&b1)() > 0),
        ),
        (
            "floor_hmac_sha1_form",
            Box::new(move || hmac_floor::<Hmac<sha1::Sha1>>(&form)() > 0),
        ),
        (
            // Twilio JSON: the body's SHA-256 plus a MAC over the short URL.
            "floor_sha256_plus_hmac_sha1",
            Box::new(move || {
                use sha2::Digest as _;
                let url = b"https://example.com/twilio?x=1&bodySHA256=0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
                sha2::Sha256::digest(&b2).len() + hmac_floor::<Hmac<sha1::Sha1>>(url)() > 0
            }),
        ),
        (
            "floor_ed25519",
            Box::new(move || ed_public.verify_strict(&signed, &ed_sig).is_ok()),
        ),
        (
            "floor_ecdsa_p256",
            Box::new(move || p256_public.verify(&signed_p256, &p256_sig).is_ok()),
        ),
    ];
    (cases, floors)
}
