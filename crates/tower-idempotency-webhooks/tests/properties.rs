//! Sign-then-verify properties and parser robustness against arbitrary header bytes.

mod common;

use bytes::Bytes;
use common::at;
use http::{request::Parts, HeaderValue};
use proptest::prelude::*;
use tower_idempotency_webhooks::{
    generic::{EventId, HmacVerifier, Part},
    *,
};

fn parts(headers: &[(&str, String)]) -> Parts {
    let mut builder = http::Request::post("/hook");
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    builder.body(()).unwrap().into_parts().0
}

fn json_body(id: &str, filler: &str) -> Vec<u8> {
    serde_json::json!({ "id": id, "event_id": id, "filler": filler, "webhookTimestamp": 1_700_000_000_000u64 })
        .to_string()
        .into_bytes()
}

/// Every shipped verifier with a delivery signed for `body` at `ts` under `secret`.
fn deliveries(secret: &str, ts: u64, id: &str, body: &[u8]) -> Vec<(Box<dyn Verifier>, Parts)> {
    let sw_key = secret.as_bytes().to_vec();
    use base64::Engine as _;
    let sw_secret = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(&sw_key)
    );
    let generic = HmacVerifier::builder("acme")
        .secrets([secret])
        .signature_header("x-acme-signature")
        .prefix("sha512=")
        .encoding(Encoding::Base64)
        .algorithm(HmacAlgorithm::Sha512)
        .timestamp_header("x-acme-timestamp")
        .signed_parts([
            Part::Id,
            Part::Literal(":"),
            Part::Timestamp,
            Part::Literal(":"),
            Part::Body,
        ])
        .event_id(EventId::Header("x-acme-id"))
        .build()
        .unwrap();
    let generic_sig = generic.sign(secret, Some(ts), Some(id), body);
    let t = ts.to_string();
    vec![
        (
            Box::new(stripe::StripeVerifier::new([secret])) as Box<dyn Verifier>,
            parts(&[("stripe-signature", stripe::sign(secret, ts, body))]),
        ),
        (
            Box::new(github::GitHubVerifier::new([secret])),
            parts(&[
                ("x-hub-signature-256", github::sign(secret, body)),
                ("x-github-delivery", id.into()),
            ]),
        ),
        (
            Box::new(slack::SlackVerifier::new([secret])),
            parts(&[
                ("x-slack-signature", slack::sign(secret, ts, body)),
                ("x-slack-request-timestamp", t.clone()),
            ]),
        ),
        (
            Box::new(standard::StandardWebhooksVerifier::new([sw_secret]).unwrap()),
            parts(&[
                ("webhook-signature", standard::sign(&sw_key, id, ts, body)),
                ("webhook-id", id.into()),
                ("webhook-timestamp", t.clone()),
            ]),
        ),
        (
            Box::new(shopify::ShopifyVerifier::new([secret])),
            parts(&[
                ("x-shopify-hmac-sha256", shopify::sign(secret, body)),
                ("x-shopify-event-id", id.into()),
            ]),
        ),
        (
            Box::new(paddle::PaddleVerifier::new([secret])),
            parts(&[("paddle-signature", paddle::sign(secret, ts, body))]),
        ),
        (
            Box::new(linear::LinearVerifier::new([secret])),
            parts(&[
                ("linear-signature", linear::sign(secret, body)),
                ("linear-delivery", id.into()),
            ]),
        ),
        (
            Box::new(zoom::ZoomVerifier::new([secret])),
            parts(&[
                ("x-zm-signature", zoom::sign(secret, ts, body)),
                ("x-zm-request-timestamp", t.clone()),
            ]),
        ),
        (
            Box::new(generic),
            parts(&[
                ("x-acme-signature", generic_sig),
                ("x-acme-timestamp", t),
                ("x-acme-id", id.into()),
            ]),
        ),
    ]
}

const TS: u64 = 1_700_000_000;
/// A secret of the shortest accepted length.
const K: &str = "k-secret";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sign_then_verify_accepts_and_any_flip_rejects(
        secret in "[ -~]{8,64}",
        id in "[A-Za-z0-9_-]{1,40}",
        filler in ".{0,200}",
        skew in -300i64..=300,
        flip in any::<prop::sample::Index>(),
    ) {
        let body = json_body(&id, &filler);
        let now = at(TS.checked_add_signed(skew).unwrap());
        for (verifier, parts) in deliveries(&secret, TS, &id, &body) {
            let name = verifier.provider();
            let hook = verifier.verify(&parts, &Bytes::from(body.clone()), now);
            let hook = hook.unwrap_or_else(|e| panic!("{name}: {e}"));
            prop_assert_eq!(hook.body().as_ref(), body.as_slice());
            if !matches!(name, "zoom") {
                prop_assert_eq!(hook.event_id(), id.as_str(), "{}", name);
            }
            let mut tampered = body.clone();
            let i = flip.index(tampered.len());
            tampered[i] ^= 0x01;
            let err = verifier.verify(&parts, &Bytes::from(tampered), now).unwrap_err();
            prop_assert_eq!(err, VerifyError::SignatureMismatch, "{}", name);
        }
    }

    #[test]
    fn wrong_secret_never_verifies(secret in "[a-z]{8}", other in "[A-Z]{8}") {
        let body = json_body("evt", "x");
        for (_, parts) in deliveries(&other, TS, "evt", &body) {
            for (verifier, _) in deliveries(&secret, TS, "evt", &body) {
                let result = verifier.verify(&parts, &Bytes::from(body.clone()), at(TS));
                prop_assert!(result.is_err());
            }
        }
    }

    #[test]
    fn header_parsers_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..600), which in 0usize..20) {
        let Ok(value) = HeaderValue::from_bytes(&raw) else { return Ok(()); };
        let names = [
            "stripe-signature", "x-hub-signature-256", "x-github-delivery", "x-slack-signature",
            "x-slack-request-timestamp", "webhook-signature", "webhook-id", "webhook-timestamp",
            "svix-signature", "x-shopify-hmac-sha256", "x-shopify-event-id", "paddle-signature",
            "linear-signature", "linear-delivery", "x-gitlab-token", "idempotency-key",
            "x-zm-signature", "x-zm-request-timestamp", "x-acme-signature", "x-acme-timestamp",
        ];
        let body = json_body("evt", "x");
        let gitlab = gitlab::GitLabVerifier::new(["tok-secret"]);
        for (verifier, mut parts) in deliveries("s-secret", TS, "evt", &body) {
            // Replace one header (or add it) with arbitrary bytes, keep the others valid.
            parts.headers.insert(names[which], value.clone());
            let _ = verifier.verify(&parts, &Bytes::from(body.clone()), at(TS));
            let _ = verifier.verify(&parts, &Bytes::from(raw.clone()), at(TS));
            let _ = gitlab.verify(&parts, &Bytes::from(raw.clone()), at(TS));
            // And the value repeated.
            parts.headers.append(names[which], value.clone());
            let _ = verifier.verify(&parts, &Bytes::from(body.clone()), at(TS));
        }
        // The asymmetric schemes' and Mailgun's parsers, with every header arbitrary.
        let discord = discord::DiscordVerifier::new(["d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"]).unwrap();
        let sendgrid = sendgrid::SendGridVerifier::new(["MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA=="]).unwrap();
        let mailgun = mailgun::MailgunVerifier::new([K]);
        let mut parts = parts(&[]);
        for name in ["x-signature-ed25519", "x-signature-timestamp", "x-twilio-email-event-webhook-signature", "x-twilio-email-event-webhook-timestamp"] {
            parts.headers.insert(name, value.clone());
        }
        for verifier in [&discord as &dyn Verifier, &sendgrid, &mailgun] {
            let _ = verifier.verify(&parts, &Bytes::from(raw.clone()), at(TS));
            let _ = verifier.verify(&parts, &Bytes::from(body.clone()), at(TS));
        }
    }

    #[test]
    fn mailgun_body_parser_never_panics(ts in ".{0,30}", token in ".{0,30}", sig in ".{0,80}", id in proptest::option::of(".{0,300}")) {
        let body = serde_json::json!({
            "signature": { "timestamp": ts, "token": token, "signature": sig },
            "event-data": { "id": id },
        }).to_string();
        let result = mailgun::MailgunVerifier::new([K]).verify(&parts(&[]), &Bytes::from(body), at(TS));
        prop_assert!(result.is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Every provider's fixture: a delivery of any event id, signed at any time within the
    /// window, verifies and is keyed as the fixture says; signed with another credential, it
    /// does not verify.
    #[test]
    fn every_fixture_signs_then_verifies(
        id in "[A-Za-z0-9_-]{1,40}",
        skew in -300i64..=300,
    ) {
        let now = at(TS.checked_add_signed(skew).unwrap());
        for fixture in testing::fixtures() {
            let name = fixture.provider();
            let event = fixture.event(&id, TS);
            let verifier = fixture.verifier();
            let genuine = fixture.sign(&event, TS);
            let body = Bytes::from(genuine.body.clone());
            let hook = verifier.verify(&genuine.parts(), &body, now);
            let hook = hook.unwrap_or_else(|e| panic!("{name}: {e}"));
            prop_assert_eq!(hook.body(), &body, "{}", name);
            prop_assert_eq!(hook.event_id(), fixture.key(&event, &genuine), "{}", name);
            let forged = fixture.deliver(testing::Signer::Attacker, &event, &event, TS);
            let result = verifier.verify(&forged.parts(), &Bytes::from(forged.body), now);
            prop_assert_eq!(result.unwrap_err(), VerifyError::SignatureMismatch, "{}", name);
        }
    }
}

#[test]
fn generic_builder_requires_its_settings() {
    assert!(HmacVerifier::builder("x")
        .event_id(EventId::BodySha256)
        .build()
        .is_err());
    assert!(HmacVerifier::builder("x")
        .signature_header("h")
        .build()
        .is_err());
    assert!(HmacVerifier::builder("x")
        .signature_header("h")
        .event_id(EventId::BodySha256)
        .signed_parts([Part::Timestamp, Part::Body])
        .build()
        .is_err());
    // A timestamp header the signature does not cover could be rewritten to pass any window.
    assert_eq!(
        HmacVerifier::builder("x")
            .secrets([K])
            .signature_header("h")
            .timestamp_header("x-ts")
            .event_id(EventId::BodySha256)
            .build()
            .unwrap_err(),
        ConfigError::Missing {
            what: "the timestamp in the signed parts (an unsigned timestamp header proves nothing)"
        }
    );
    let v = HmacVerifier::builder("x")
        .secrets([K])
        .signature_header("h")
        .event_id(EventId::JsonPointer("/id"))
        .build()
        .unwrap();
    let body = br#"{"id":42}"#;
    let p = parts(&[("h", v.sign(K, None, None, body))]);
    assert_eq!(
        v.verify(&p, &Bytes::from_static(body), at(TS))
            .unwrap()
            .event_id(),
        "42"
    );
    let body = br#"{"no":1}"#;
    let p = parts(&[("h", v.sign(K, None, None, body))]);
    assert_eq!(
        v.verify(&p, &Bytes::from_static(body), at(TS)).unwrap_err(),
        VerifyError::MissingEventId { location: "/id" }
    );
}

/// JSON pointer ids: object-key pointers are read by the field scan, pointers into arrays or
/// with `~` escapes by building the document; both give the ids `Value::pointer` gives, and the
/// handler's `json()` is the whole document either way.
#[test]
fn generic_json_pointer_ids_through_the_scan_and_the_document() {
    let body =
        br#"{"data":{"object":{"id":"obj_1"}},"items":[{"id":"item_0"}],"a/b":{"c~d":7},"n":-3}"#;
    let document: serde_json::Value = serde_json::from_slice(body).unwrap();
    for pointer in [
        "/data/object/id",
        "/items/0/id",
        "/a~1b/c~0d",
        "/n",
        "/data/object/missing",
        "/data/object",
        "/items/x",
    ] {
        let v = HmacVerifier::builder("x")
            .secrets([K])
            .signature_header("h")
            .event_id(EventId::JsonPointer(pointer))
            .build()
            .unwrap();
        let p = parts(&[("h", v.sign(K, None, None, body))]);
        let expected = match document.pointer(pointer) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
            _ => Err(VerifyError::MissingEventId { location: pointer }),
        };
        let verified = v.verify(&p, &Bytes::from_static(body), at(TS));
        assert_eq!(
            verified
                .as_ref()
                .map(|w| w.event_id().to_owned())
                .map_err(Clone::clone),
            expected,
            "{pointer}"
        );
        if let Ok(webhook) = verified {
            assert_eq!(webhook.json().ok(), Some(&document), "{pointer}");
        }
    }
}

#[test]
fn generic_signatures_are_separated_by_commas_and_or_whitespace() {
    let v = HmacVerifier::builder("x")
        .secrets([K])
        .signature_header("x-sig")
        .prefix("v1=")
        .event_id(EventId::BodySha256)
        .build()
        .unwrap();
    let body = b"{}";
    let good = v.sign(K, None, None, body);
    let bad = v.sign("other-secret", None, None, body);
    let verify = |value: String| {
        v.verify(
            &parts(&[("x-sig", value)]),
            &Bytes::from_static(body),
            at(TS),
        )
        .map(|_| ())
    };
    for value in [
        format!("{bad},{good}"),
        format!("{bad}, {good}"),
        format!("{bad} {good}"),
        format!("{bad}\t{good}"),
        format!(",,{bad} ,, {good},"),
        format!("v0=abc {good}"),
    ] {
        assert_eq!(verify(value.clone()), Ok(()), "{value}");
    }
    assert_eq!(
        verify(format!("{bad} {bad}")),
        Err(VerifyError::SignatureMismatch)
    );
    assert_eq!(
        verify(format!("{bad} abc")),
        Err(VerifyError::MalformedHeader {
            name: "x-sig",
            reason: "signature without the expected prefix",
        })
    );
    let many = vec![bad.as_str(); 17].join(",");
    assert_eq!(
        verify(many),
        Err(VerifyError::MalformedHeader {
            name: "x-sig",
            reason: "too many signatures",
        })
    );
}

#[test]
fn generic_builder_refuses_invalid_header_names_and_accepts_any_case() {
    for (signature, id) in [("bad header", "x-id"), ("x-sig", "x\nid")] {
        let built = HmacVerifier::builder("x")
            .secrets([K])
            .signature_header(signature)
            .signed_parts([Part::Id, Part::Literal("."), Part::Body])
            .event_id(EventId::Header(id))
            .build();
        let bad = if signature.contains(' ') {
            signature
        } else {
            id
        };
        assert_eq!(
            built.unwrap_err(),
            ConfigError::InvalidHeaderName { name: bad }
        );
    }
    assert_eq!(
        HmacVerifier::builder("x")
            .secrets([K])
            .signature_header("x-sig")
            .timestamp_header("x ts")
            .event_id(EventId::BodySha256)
            .build()
            .unwrap_err(),
        ConfigError::InvalidHeaderName { name: "x ts" }
    );
    // Header names are matched case-insensitively, whatever case the builder was given.
    let v = HmacVerifier::builder("x")
        .secrets([K])
        .signature_header("X-Sig")
        .signed_parts([Part::Id, Part::Literal("."), Part::Body])
        .event_id(EventId::Header("X-Id"))
        .build()
        .unwrap();
    let body = b"{}";
    let p = parts(&[
        ("x-sig", v.sign(K, None, Some("e1"), body)),
        ("x-id", "e1".into()),
    ]);
    assert_eq!(
        v.verify(&p, &Bytes::from_static(body), at(TS))
            .unwrap()
            .event_id(),
        "e1"
    );
}

/// A panic's message, for the constructors that refuse a configuration by panicking.
fn panic_message(build: impl FnOnce()) -> Option<String> {
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(build)).err()?;
    Some(
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default(),
    )
}

/// Anyone can sign with an empty secret (`env::var(..).unwrap_or_default()`): every provider
/// with a shared secret refuses an empty or short one when it is built, naming the provider
/// and the rule, never the secret.
#[test]
fn empty_and_short_secrets_are_refused_at_construction() {
    use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
    type Build = fn(&str);
    type TryBuild = fn(&str) -> Result<(), ConfigError>;
    // Each provider's one-secret layer constructor, named by the provider.
    macro_rules! layers {
        ($($provider:ident),*) => {
            [$((
                stringify!($provider),
                (|s| drop(IdempotencyLayer::$provider([s], MemoryStore::new()))) as Build,
            )),*]
        };
    }
    let layers = layers!(stripe, github, slack, shopify, paddle, linear, gitlab, zoom, mailgun);
    // The verifiers themselves, for `WebhookKeys::new(..)` users; a good secret next to a bad
    // one does not hide it.
    let verifier: (&str, Build) = ("stripe", |s| {
        drop(stripe::StripeVerifier::new(["whsec_long_enough", s]))
    });
    let infallible: Vec<(&str, Build)> = layers.into_iter().chain([verifier]).collect();
    let fallible: &[(&str, TryBuild)] = &[
        ("twilio", |s| {
            IdempotencyLayer::twilio("https://example.com", [s], MemoryStore::new()).map(drop)
        }),
        ("square", |s| {
            IdempotencyLayer::square("https://example.com/sq", [s], MemoryStore::new()).map(drop)
        }),
        ("generic", |s| {
            HmacVerifier::builder("acme")
                .secrets([s])
                .signature_header("x-sig")
                .event_id(EventId::BodySha256)
                .build()
                .map(drop)
        }),
        ("Secret::try_new", |s| Secret::try_new(s).map(drop)),
    ];
    let refused = ConfigError::WeakSecret {
        min_len: MIN_SECRET_LEN,
    };
    for secret in ["", "3by"] {
        for (provider, build) in &infallible {
            let message = panic_message(|| build(secret))
                .unwrap_or_else(|| panic!("{provider} accepted {secret:?}"));
            assert!(message.contains(provider), "{message}");
            assert!(message.contains(&refused.to_string()), "{message}");
            assert!(secret.is_empty() || !message.contains(secret), "{message}");
        }
        for (provider, build) in fallible {
            assert_eq!(build(secret), Err(refused.clone()), "{provider} {secret:?}");
        }
    }
    // The shortest accepted secret is accepted by every one of them.
    let shortest = "hush";
    assert_eq!(shortest.len(), MIN_SECRET_LEN);
    for (provider, build) in &infallible {
        assert_eq!(panic_message(|| build(shortest)), None, "{provider}");
    }
    for (provider, build) in fallible {
        assert_eq!(build(shortest), Ok(()), "{provider}");
    }
}

/// Configurations whose signature covers nothing useful are refused with a reason: without
/// the body, an empty list, a key from a header the signature does not cover, and two variable
/// parts side by side (where one ends and the next begins is then unsigned).
#[test]
fn generic_builder_refuses_signed_parts_that_sign_nothing_useful() {
    let builder = || {
        HmacVerifier::builder("acme")
            .secrets([K])
            .signature_header("x-sig")
            .timestamp_header("x-ts")
            .event_id(EventId::Header("x-id"))
    };
    let cases: &[(&[Part], &str)] = &[
        (&[], "empty"),
        (&[Part::Timestamp, Part::Literal("."), Part::Id], "body"),
        (&[Part::Timestamp, Part::Literal("."), Part::Body], "id"),
        (
            &[Part::Id, Part::Literal("."), Part::Timestamp, Part::Body],
            "separat",
        ),
        (
            &[
                Part::Id,
                Part::Literal(""),
                Part::Timestamp,
                Part::Literal("."),
                Part::Body,
            ],
            "separat",
        ),
    ];
    for (parts, reason) in cases {
        let refused = builder().signed_parts(parts.to_vec()).build();
        let message = refused
            .map(|_| String::new())
            .unwrap_or_else(|error| error.to_string());
        assert!(message.contains(reason), "{parts:?}: {message:?}");
    }
    // A key from the body needs no `Part::Id`; literals in between make the parts unambiguous.
    assert!(HmacVerifier::builder("acme")
        .secrets([K])
        .signature_header("x-sig")
        .timestamp_header("x-ts")
        .signed_parts([Part::Timestamp, Part::Literal("."), Part::Body])
        .event_id(EventId::JsonPointer("/id"))
        .build()
        .is_ok());
    assert!(builder()
        .signed_parts([
            Part::Id,
            Part::Literal("."),
            Part::Timestamp,
            Part::Literal("."),
            Part::Body,
        ])
        .build()
        .is_ok());
}

/// A signed body that repeats the key its id comes from: the key reader and `json()` read the
/// same (first) value, so the handler never sees another id than the one the delivery is keyed
/// by. Every verifier in the table.
#[test]
fn a_repeated_id_key_gives_the_handler_the_id_the_key_was_read_from() {
    let body = format!(
        r#"{{"id":"evt_first","event_id":"evt_first","webhookTimestamp":{},"nested":{{"id":1,"id":2}},"id":"evt_second","event_id":"evt_second"}}"#,
        1_700_000_000_000u64
    );
    for (verifier, parts) in deliveries(K, TS, "evt_first", body.as_bytes()) {
        let name = verifier.provider();
        let hook = verifier
            .verify(&parts, &Bytes::from(body.clone()), at(TS))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let json = hook.json().unwrap();
        assert_eq!(json["id"], "evt_first", "{name}");
        assert_eq!(json["event_id"], "evt_first", "{name}");
        assert_eq!(json["nested"]["id"], 1, "{name}");
        // Zoom keys by a digest of the body.
        if name != "zoom" {
            assert_eq!(hook.event_id(), "evt_first", "{name}");
        }
    }
}

/// Which inputs the signature covers, per verifier: handlers can tell a signed header or id
/// from one anyone relaying the delivery could rewrite.
#[test]
fn verified_webhooks_tell_signed_from_unsigned_inputs() {
    let body = json_body("evt_1", "x");
    for (verifier, mut parts) in deliveries(K, TS, "evt_1", &body) {
        let name = verifier.provider();
        // Headers handlers like to dispatch on, which no provider signs.
        for header in ["x-github-event", "x-shopify-topic", "x-gitlab-event"] {
            parts.headers.insert(header, "push".parse().unwrap());
        }
        let hook = verifier
            .verify(&parts, &Bytes::from(body.clone()), at(TS))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (id_signed, signed): (bool, &[&str]) = match name {
            "github" | "shopify" | "linear" => (false, &[]),
            "slack" => (true, &["x-slack-request-timestamp"]),
            "zoom" => (true, &["x-zm-request-timestamp"]),
            "acme" => (true, &["x-acme-timestamp", "x-acme-id"]),
            _ => (true, &[]),
        };
        assert_eq!(hook.is_event_id_signed(), id_signed, "{name}");
        for header in signed {
            assert!(hook.is_signed_header(header), "{name} {header}");
            assert!(
                hook.is_signed_header(&header.to_uppercase()),
                "{name} {header}"
            );
        }
        for header in ["x-github-event", "x-shopify-topic", "x-gitlab-event"] {
            assert!(!hook.is_signed_header(header), "{name} {header}");
        }
    }
    let token = "gitlab-token";
    let gitlab = gitlab::GitLabVerifier::new([token]);
    let parts = parts(&[
        ("x-gitlab-token", token.into()),
        ("idempotency-key", "k1".into()),
        ("x-gitlab-event", "Push Hook".into()),
    ]);
    let hook = gitlab.verify(&parts, &Bytes::from(body), at(TS)).unwrap();
    assert!(!hook.is_event_id_signed());
    assert!(!hook.is_signed_header("x-gitlab-event"));
}
