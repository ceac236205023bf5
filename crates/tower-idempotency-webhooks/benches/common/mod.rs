//! What the benches share: the cases of the criterion bench (`verify.rs`) and the paired-ratio
//! bench (`ratios.rs`), every shipped provider with a valid delivery of about `size` bytes and
//! the floors (the raw primitive over the same bytes).

#![allow(dead_code)]

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use ed25519_dalek::{Signer as _, SigningKey, Verifier as _};
use hmac::{Hmac, Mac};
use http::request::Parts;
use p256::ecdsa::{Signature as P256Signature, SigningKey as P256SigningKey};
use tower_idempotency_webhooks::{
    generic::{EventId, HmacVerifier, Part},
    stripe,
    testing::{self, Event},
    twilio, Verifier,
};

pub const TS: u64 = 1_700_000_000;
pub const SECRET: &str = "whsec_bench_secret_0123456789";

pub fn parts(uri: &str, headers: &[(&str, String)]) -> Parts {
    let mut builder = http::Request::post(uri);
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    builder.body(()).unwrap().into_parts().0
}

/// A JSON event of about `len` bytes with the fields the non-fixture cases read.
pub fn json_body(len: usize) -> Bytes {
    Bytes::from(padded(r#"{"id":"evt_1","event-data":{"id":"e1"}}"#, len))
}

pub fn hmac_floor<M: Mac + hmac::digest::KeyInit>(body: &[u8]) -> impl Fn() -> usize + '_ {
    move || {
        let mut mac = <M as Mac>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(body);
        mac.finalize().into_bytes().len()
    }
}

type VerifierCase = (String, Arc<dyn Verifier>, Parts, Bytes);

/// `body` (JSON or a form) grown to about `size` bytes by filler after its members, so the
/// fields a verifier reads come first, as providers send them. The JSON filler is many small
/// members (what building a `Value` is slow on), not one long string.
pub fn padded(body: &str, size: usize) -> String {
    if !body.ends_with('}') && !body.ends_with(']') {
        let filler = "a+b%2Cc".repeat(size.saturating_sub(body.len() + 6) / 7);
        return format!("{body}&Body={filler}");
    }
    let (head, tail) = body.split_at(body.rfind('}').expect("a JSON object"));
    let mut items = String::new();
    let mut i = 0;
    while head.len() + items.len() + 64 < size {
        if i > 0 {
            items.push(',');
        }
        items.push_str(&format!(r#"{{"k":"value-{i}","n":{i},"ok":true}}"#));
        i += 1;
    }
    format!(r#"{head},"items":[{items}]{tail}"#)
}

/// Every provider's fixture with a delivery of about `size` bytes, named as the bench tables
/// name them (Twilio's fixture is its form scheme).
fn fixture_cases(size: usize) -> Vec<VerifierCase> {
    testing::fixtures()
        .into_iter()
        .map(|fixture| {
            let event = fixture.event("evt_1", TS);
            let event = Event {
                body: padded(&event.body, size),
                ..event
            };
            let delivery = fixture.sign(&event, TS);
            let name = match fixture.provider() {
                "twilio" => "twilio_form".to_owned(),
                provider => provider.replace('-', "_"),
            };
            let body = Bytes::from(delivery.body.clone());
            (name, fixture.verifier(), delivery.parts(), body)
        })
        .collect()
}

/// The fixtures' cases, then the schemes no provider fixture covers: Twilio's JSON scheme and
/// the generic verifier keyed by a header and by a JSON pointer.
fn verifier_cases(size: usize) -> (Vec<VerifierCase>, Bytes) {
    let body = json_body(size);
    let mut list = fixture_cases(size);
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
    let twilio_json_url = twilio::url_with_body_sha256(twilio_url, &body);
    let twilio_json_sig = twilio::sign(SECRET, &twilio_json_url, &[]);
    let twilio_json_path = twilio_json_url["https://example.com".len()..].to_owned();
    list.extend([
        (
            "twilio_json".to_owned(),
            Arc::new(twilio::TwilioVerifier::new("https://example.com", [SECRET]).unwrap())
                as Arc<dyn Verifier>,
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
            "generic_hmac".to_owned(),
            Arc::new(generic),
            parts(
                "/",
                &[("x-acme-signature", generic_sig), ("x-acme-id", "e".into())],
            ),
            body.clone(),
        ),
        (
            "generic_json_pointer".to_owned(),
            Arc::new(generic_json),
            parts("/", &[("x-acme-signature", generic_json_sig)]),
            body.clone(),
        ),
    ]);
    (list, body)
}

/// Something to time.
pub type Run = Box<dyn Fn() -> bool>;

/// A provider case and the floor it is compared with.
pub struct Case {
    pub name: String,
    pub floor: &'static str,
    pub run: Run,
}

/// Every case for bodies of about `size` bytes, and the floors by name.
pub fn cases(size: usize) -> (Vec<Case>, Vec<(&'static str, Run)>) {
    let now = UNIX_EPOCH + Duration::from_secs(TS);
    let (list, body) = verifier_cases(size);
    let mut cases: Vec<Case> = list
        .into_iter()
        .map(|case| verifier_case(case, now))
        .collect();
    cases.extend(stripe_cases(&body, now));
    let form = Bytes::from(padded(
        &testing::fixture("twilio").event("evt_1", TS).body,
        size,
    ));
    (cases, floors(body, form))
}

/// A verifier's case, checked once, with the floor of its primitive.
fn verifier_case((name, verifier, parts, body): VerifierCase, now: SystemTime) -> Case {
    verifier
        .verify(&parts, &body, now)
        .unwrap_or_else(|e| panic!("{name} bench setup: {e}"));
    let floor = match name.as_str() {
        "twilio_form" => "floor_hmac_sha1_form",
        "twilio_json" => "floor_sha256_plus_hmac_sha1",
        "discord" => "floor_ed25519",
        "sendgrid" => "floor_ecdsa_p256",
        _ => "floor_hmac_sha256",
    };
    Case {
        name,
        floor,
        run: Box::new(move || verifier.verify(&parts, &body, now).is_ok()),
    }
}

/// A Stripe verifier of `secret`, and the headers of `body` signed with [`SECRET`].
fn stripe_delivery(secret: &str, body: &Bytes) -> (stripe::StripeVerifier, Parts) {
    let verifier = stripe::StripeVerifier::new([secret]);
    let parts = parts("/", &[("stripe-signature", stripe::sign(SECRET, TS, body))]);
    (verifier, parts)
}

/// Stripe where the event id's place in the body matters, a wrong secret, and what building a
/// `serde_json::Value` would add.
fn stripe_cases(body: &Bytes, now: SystemTime) -> Vec<Case> {
    // Worst case for the field scan: the id after all the filler, so the whole body is parsed
    // (skipped, not built).
    let id_last = {
        let text = std::str::from_utf8(body).unwrap().trim_end();
        let text = text[..text.len() - 1].replacen(r#""id":"evt_1""#, r#""xd":"evt_1""#, 1);
        Bytes::from(format!(r#"{text},"id":"evt_1"}}"#))
    };
    let (stripe_last, last_parts) = stripe_delivery(SECRET, &id_last);
    stripe_last.verify(&last_parts, &id_last, now).unwrap();
    // Best case, and how Stripe sends events: `id` is the first member, so the scan stops there.
    let id_first = {
        let text = std::str::from_utf8(body).unwrap();
        let rest = text.replacen(r#""id":"evt_1","#, "", 1);
        Bytes::from(format!(r#"{{"id":"evt_1",{}"#, &rest[1..]))
    };
    let (stripe_first, first_parts) = stripe_delivery(SECRET, &id_first);
    assert_eq!(
        stripe_first
            .verify(&first_parts, &id_first, now)
            .unwrap()
            .event_id(),
        "evt_1"
    );
    // The verify-only cost: a wrong secret fails right after the MAC.
    let (wrong, wrong_parts) = stripe_delivery("whsec_other", body);
    let (wrong_body, value_body) = (body.clone(), body.clone());
    let case = |name: &str, run: Run| Case {
        name: name.to_owned(),
        floor: "floor_hmac_sha256",
        run,
    };
    vec![
        case(
            "stripe_id_last",
            Box::new(move || stripe_last.verify(&last_parts, &id_last, now).is_ok()),
        ),
        case(
            "stripe_id_first",
            Box::new(move || stripe_first.verify(&first_parts, &id_first, now).is_ok()),
        ),
        case(
            "stripe_wrong_secret",
            Box::new(move || wrong.verify(&wrong_parts, &wrong_body, now).is_err()),
        ),
        // What the JSON-keyed verifiers used to add: building a `Value` of the whole body.
        case(
            "ref_serde_json_value",
            Box::new(move || serde_json::from_slice::<serde_json::Value>(&value_body).is_ok()),
        ),
    ]
}

/// The raw primitives over the same bytes: HMACs, Twilio JSON's hash plus MAC, Ed25519 and
/// ECDSA P-256 over `timestamp || body`.
fn floors(body: Bytes, form: Bytes) -> Vec<(&'static str, Run)> {
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
    vec![
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
    ]
}
