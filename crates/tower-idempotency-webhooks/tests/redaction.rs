//! No secret reaches a `Debug` of any verifier, key source or layer, and no secret or
//! signature (received or expected) reaches an error's `Display`, `Debug` or problem detail.

use std::{
    fmt::Debug,
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use base64::Engine as _;
use bytes::Bytes;
use http::request::Parts;
use tower_idempotency_core::{IdempotencyLayer, MemoryStore, Problem};
use tower_idempotency_webhooks::{
    generic::{EventId, HmacVerifier},
    testing, *,
};

const TS: u64 = 1_700_000_000;
/// The verifier's secret.
const OURS: &str = "SeCrEtOurs0123456789abcdef";
/// The sender's (wrong) secret.
const THEIRS: &str = "SeCrEtTheirs9876543210fedcba";
const BODY: &[u8] = br#"{"id":"evt_1","event_id":"evt_1","webhookTimestamp":1700000000000}"#;

trait DebugVerifier: Verifier + Debug {}
impl<T: Verifier + Debug> DebugVerifier for T {}

fn parts(path: &str, headers: &[(&str, String)]) -> Parts {
    let mut builder = http::Request::post(path);
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    builder.body(()).unwrap().into_parts().0
}

/// A delivery of [`BODY`] to `/` with `headers`.
fn signed(headers: &[(&str, String)]) -> (Parts, Vec<u8>) {
    (parts("/", headers), BODY.to_vec())
}

/// Builds a delivery signed with the given secret: its parts and body.
type Sign = dyn Fn(&str) -> (Parts, Vec<u8>);

struct Case {
    name: &'static str,
    verifier: Arc<dyn DebugVerifier>,
    /// Headers of a delivery signed with `secret`, and its body.
    signed: Box<Sign>,
    /// Every spelling of the verifier's secret that must not leak.
    secret_forms: Vec<String>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn cases() -> Vec<Case> {
    let ts = TS.to_string();
    let t = move || ts.clone();
    let plain = |s: &str| vec![s.to_owned()];
    let generic = || {
        HmacVerifier::builder("acme")
            .secrets([OURS])
            .signature_header("x-acme-signature")
            .event_id(EventId::BodySha256)
            .build()
            .unwrap()
    };
    let t1 = t.clone();
    let t2 = t.clone();
    let t3 = t.clone();
    vec![
        Case {
            name: "stripe",
            verifier: Arc::new(stripe::StripeVerifier::new([OURS])),
            signed: Box::new(move |s| {
                let h = stripe::sign(s, TS, BODY);
                signed(&[("stripe-signature", h)])
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "github",
            verifier: Arc::new(github::GitHubVerifier::new([OURS])),
            signed: Box::new(move |s| {
                let h = github::sign(s, BODY);
                signed(&[
                    ("x-hub-signature-256", h),
                    ("x-github-delivery", "d".into()),
                ])
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "slack",
            verifier: Arc::new(slack::SlackVerifier::new([OURS])),
            signed: Box::new(move |s| {
                let h = slack::sign(s, TS, BODY);
                signed(&[
                    ("x-slack-signature", h),
                    ("x-slack-request-timestamp", t1()),
                ])
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "standard-webhooks",
            verifier: Arc::new(
                standard::StandardWebhooksVerifier::new([format!(
                    "whsec_{}",
                    b64(OURS.as_bytes())
                )])
                .unwrap(),
            ),
            signed: Box::new(move |s| {
                let h = standard::sign(s.as_bytes(), "msg_1", TS, BODY);
                signed(&[
                    ("webhook-signature", h),
                    ("webhook-id", "msg_1".into()),
                    ("webhook-timestamp", t2()),
                ])
            }),
            secret_forms: vec![OURS.to_owned(), b64(OURS.as_bytes())],
        },
        Case {
            name: "shopify",
            verifier: Arc::new(shopify::ShopifyVerifier::new([OURS])),
            signed: Box::new(move |s| {
                let h = shopify::sign(s, BODY);
                signed(&[
                    ("x-shopify-hmac-sha256", h),
                    ("x-shopify-event-id", "e".into()),
                ])
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "paddle",
            verifier: Arc::new(paddle::PaddleVerifier::new([OURS])),
            signed: Box::new(move |s| {
                let h = paddle::sign(s, TS, BODY);
                signed(&[("paddle-signature", h)])
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "linear",
            verifier: Arc::new(linear::LinearVerifier::new([OURS])),
            signed: Box::new(move |s| {
                let h = linear::sign(s, BODY);
                signed(&[("linear-signature", h), ("linear-delivery", "d".into())])
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "gitlab",
            verifier: Arc::new(gitlab::GitLabVerifier::new([OURS])),
            signed: Box::new(move |s| {
                signed(&[
                    ("x-gitlab-token", s.to_owned()),
                    ("idempotency-key", "k".into()),
                ])
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "zoom",
            verifier: Arc::new(zoom::ZoomVerifier::new([OURS])),
            signed: Box::new(move |s| {
                let h = zoom::sign(s, TS, BODY);
                signed(&[("x-zm-signature", h), ("x-zm-request-timestamp", t3())])
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "mailgun",
            verifier: Arc::new(mailgun::MailgunVerifier::new([OURS])),
            signed: Box::new(move |s| {
                let signature = mailgun::sign(s, TS, "tok-1");
                let body =
                    serde_json::json!({ "signature": signature, "event-data": { "id": "e1" } });
                (parts("/", &[]), body.to_string().into_bytes())
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "square",
            verifier: Arc::new(
                square::SquareVerifier::new("https://example.com/sq", [OURS]).unwrap(),
            ),
            signed: Box::new(move |s| {
                let h = square::sign(s, "https://example.com/sq", BODY);
                (
                    parts("/sq", &[("x-square-hmacsha256-signature", h)]),
                    BODY.to_vec(),
                )
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "twilio",
            verifier: Arc::new(twilio::TwilioVerifier::new("https://example.com", [OURS]).unwrap()),
            signed: Box::new(move |s| {
                let h = twilio::sign(s, "https://example.com/tw", &[("CallSid", "CA1")]);
                (
                    parts(
                        "/tw",
                        &[
                            ("x-twilio-signature", h),
                            ("content-type", "application/x-www-form-urlencoded".into()),
                        ],
                    ),
                    b"CallSid=CA1".to_vec(),
                )
            }),
            secret_forms: plain(OURS),
        },
        Case {
            name: "generic",
            verifier: Arc::new(generic()),
            signed: Box::new(move |s| {
                let h = generic().sign(s, None, None, BODY);
                signed(&[("x-acme-signature", h)])
            }),
            secret_forms: plain(OURS),
        },
    ]
}

/// The values of every header of `parts` and the long tokens inside them (signatures).
fn signature_texts(parts: &Parts, body: &[u8]) -> Vec<String> {
    let mut texts = Vec::new();
    let mut add = |value: &str| {
        for token in value.split([',', '=', ';', ' ', ':', '"']) {
            if token.len() >= 16 {
                texts.push(token.to_owned());
            }
        }
    };
    for value in parts.headers.values() {
        add(value.to_str().unwrap());
    }
    // Mailgun carries its signature in the body.
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(sig) = json
            .pointer("/signature/signature")
            .and_then(|v| v.as_str())
        {
            add(sig);
        }
    }
    texts
}

fn assert_clean(case: &str, text: &str, needles: &[String]) {
    for needle in needles {
        assert!(
            !text.contains(needle.as_str()),
            "{case}: {needle:?} leaked into {text:?}"
        );
    }
}

#[test]
fn debug_of_every_verifier_key_source_and_layer_is_redacted() {
    for case in cases() {
        let debug = format!("{:?}", case.verifier);
        assert_clean(case.name, &debug, &case.secret_forms);
        assert!(debug.contains("[redacted]"), "{}: {debug}", case.name);
        let keys = WebhookKeys::new(case.verifier);
        assert_clean(case.name, &format!("{keys:?}"), &case.secret_forms);
        let layer: IdempotencyLayer = keys.into_layer(MemoryStore::new());
        assert_clean(case.name, &format!("{layer:?}"), &case.secret_forms);
    }
    // The asymmetric verifiers hold public keys only; still, their Debug is bounded.
    let discord = discord::DiscordVerifier::new([
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
    ])
    .unwrap();
    let _ = format!("{discord:?}");
    let builder = HmacVerifier::builder("acme").secrets([OURS]);
    assert_clean("builder", &format!("{builder:?}"), &[OURS.to_owned()]);
    assert_clean(
        "secret",
        &format!("{:?}", Secret::from(OURS)),
        &[OURS.to_owned()],
    );
}

#[test]
fn errors_never_carry_secrets_or_signatures() {
    let now = UNIX_EPOCH + Duration::from_secs(TS);
    for case in cases() {
        // A delivery signed with another secret: the verifier computes its expected signature
        // with OURS and compares it with the received one made with THEIRS.
        let (forged, forged_body) = (case.signed)(THEIRS);
        let (genuine, genuine_body) = (case.signed)(OURS);
        let mut needles = case.secret_forms.clone();
        needles.push(THEIRS.to_owned());
        needles.extend(signature_texts(&forged, &forged_body));
        needles.extend(signature_texts(&genuine, &genuine_body));
        needles.retain(|n| !matches!(n.as_str(), "application/x-www-form-urlencoded"));
        // Sanity: the genuine delivery verifies, so the expected signature is the genuine one.
        case.verifier
            .verify(&genuine, &Bytes::from(genuine_body), now)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let error = case
            .verifier
            .verify(&forged, &Bytes::from(forged_body), now)
            .unwrap_err();
        assert!(
            matches!(error, VerifyError::SignatureMismatch),
            "{}: {error:?}",
            case.name
        );
        let problem = Problem::from(error.clone());
        for text in [
            error.to_string(),
            format!("{error:?}"),
            problem.detail.to_string(),
            format!("{problem:?}"),
        ] {
            assert_clean(case.name, &text, &needles);
        }
    }
}

/// Every provider's fixture: no error of its negatives (another credential, a tampered body, no
/// signature, a timestamp outside the window) carries a spelling of its credential or a
/// signature, received or expected.
#[test]
fn fixture_errors_never_carry_secrets_or_signatures() {
    let now = UNIX_EPOCH + Duration::from_secs(TS);
    for fixture in testing::fixtures() {
        let verifier = fixture.verifier();
        let event = fixture.event("evt_redaction", TS);
        let genuine = fixture.sign(&event, TS);
        let mut needles = fixture.secret_forms();
        needles.extend(signature_texts(&genuine.parts(), genuine.body.as_bytes()));
        let negatives = fixture.negatives(TS);
        for negative in &negatives {
            let delivery = &negative.delivery;
            needles.extend(signature_texts(&delivery.parts(), delivery.body.as_bytes()));
        }
        needles.retain(|n| !matches!(n.as_str(), "application/x-www-form-urlencoded"));
        for negative in negatives {
            let name = format!("{}: {}", fixture.provider(), negative.name);
            let delivery = &negative.delivery;
            let error = verifier
                .verify(&delivery.parts(), &Bytes::from(delivery.body.clone()), now)
                .unwrap_err();
            let problem = Problem::from(error.clone());
            assert_eq!(problem.status, negative.status, "{name}");
            for text in [
                error.to_string(),
                format!("{error:?}"),
                problem.detail.to_string(),
                format!("{problem:?}"),
            ] {
                assert_clean(&name, &text, &needles);
            }
        }
    }
}

#[test]
fn config_errors_never_carry_the_secret() {
    let bad = "whsec_!!SeCrEt-not-base64!!";
    let error = standard::StandardWebhooksVerifier::new([bad]).unwrap_err();
    assert!(!error.to_string().contains("SeCrEt"));
    assert!(!format!("{error:?}").contains("SeCrEt"));
    let error = twilio::TwilioVerifier::new("https://user:SeCrEt@example.com", [OURS]).unwrap_err();
    assert!(!error.to_string().contains("SeCrEt"));
    assert!(!format!("{error:?}").contains("SeCrEt"));
}
