//! Published test vectors and the negative cases of every shipped provider.

mod common;

use common::{at, parts, verify, SG_KEY, SG_PAYLOAD, SG_SIG, SG_TS};
use tower_idempotency_webhooks::{VerifyError, *};

const NOW: u64 = 1_700_000_000;

// ---------------------------------------------------------------------------------------------
// Stripe. Stripe publishes no fixed vector; its SDKs' tests sign with the scheme documented at
// https://docs.stripe.com/webhooks#verify-manually ("{t}.{payload}", HMAC-SHA256, hex, v1).
// This vector was computed independently with Python's hmac module:
//   hmac.new(b"whsec_test_secret", b"1700000000." + body, hashlib.sha256).hexdigest()
// ---------------------------------------------------------------------------------------------
const STRIPE_SECRET: &str = "whsec_test_secret";
const STRIPE_BODY: &[u8] =
    br#"{"id":"evt_1","object":"event","api_version":"2024-06-20","type":"charge.succeeded"}"#;

fn stripe() -> stripe::StripeVerifier {
    stripe::StripeVerifier::new([STRIPE_SECRET])
}

#[test]
fn stripe_independent_vector_and_sign_agree() {
    let header = stripe::sign(STRIPE_SECRET, NOW, STRIPE_BODY);
    assert_eq!(header, format!("t={NOW},v1={}", STRIPE_V1));
    let webhook = verify(
        &stripe(),
        &[("stripe-signature", &header)],
        STRIPE_BODY,
        NOW,
    )
    .unwrap();
    assert_eq!(webhook.event_id(), "evt_1");
    assert_eq!(webhook.provider(), "stripe");
    assert_eq!(webhook.signed_at(), Some(at(NOW)));
    assert_eq!(webhook.body().as_ref(), STRIPE_BODY);
    assert_eq!(webhook.json().unwrap()["type"], "charge.succeeded");
}

const STRIPE_V1: &str = "a035017279b2d1a4d2978d5c3e5fec729c7fdfd89e60d31759ddf7774da63a55";

#[test]
fn stripe_rotation_multiple_v1_and_unknown_schemes() {
    let good = stripe::sign(STRIPE_SECRET, NOW, STRIPE_BODY);
    let old = stripe::sign("whsec_old", NOW, STRIPE_BODY);
    let good_sig = good.split_once(",v1=").unwrap().1;
    let old_sig = old.split_once(",v1=").unwrap().1;
    // Several v1 plus a v0: any v1 matching is enough.
    let header = format!("t={NOW},v1={old_sig},v0=abcd,v1={good_sig}");
    assert!(verify(
        &stripe(),
        &[("stripe-signature", &header)],
        STRIPE_BODY,
        NOW
    )
    .is_ok());
    // Two secrets configured, the delivery signed with the second.
    let rotated = stripe::StripeVerifier::new(["whsec_new", STRIPE_SECRET]);
    let webhook = verify(&rotated, &[("stripe-signature", &good)], STRIPE_BODY, NOW).unwrap();
    assert_eq!(webhook.secret_index(), Some(1));
    // Only unknown schemes.
    let header = format!("t={NOW},v0={good_sig},v9={good_sig}");
    assert_eq!(
        verify(
            &stripe(),
            &[("stripe-signature", &header)],
            STRIPE_BODY,
            NOW
        )
        .unwrap_err(),
        VerifyError::UnsupportedVersion {
            name: "stripe-signature"
        }
    );
}

#[test]
fn stripe_negative_cases() {
    let v = stripe();
    let good = stripe::sign(STRIPE_SECRET, NOW, STRIPE_BODY);
    let h = "stripe-signature";
    let err = |headers: &[(&str, &str)], body: &[u8], now: u64| {
        verify(&v, headers, body, now).unwrap_err()
    };
    assert_eq!(
        err(&[], STRIPE_BODY, NOW),
        VerifyError::MissingHeader { name: h }
    );
    assert!(matches!(
        err(&[(h, "garbage")], STRIPE_BODY, NOW),
        VerifyError::MalformedHeader { .. }
    ));
    assert!(matches!(
        err(&[(h, "v1=abcd")], STRIPE_BODY, NOW),
        VerifyError::MalformedHeader {
            reason: "no timestamp",
            ..
        }
    ));
    assert!(matches!(
        err(&[(h, &format!("t={NOW}"))], STRIPE_BODY, NOW),
        VerifyError::MalformedHeader {
            reason: "no signature",
            ..
        }
    ));
    assert!(matches!(
        err(&[(h, &format!("t={NOW},t={NOW},v1=00"))], STRIPE_BODY, NOW),
        VerifyError::MalformedHeader {
            reason: "timestamp appears twice",
            ..
        }
    ));
    assert!(matches!(
        err(&[(h, &format!("t={NOW},v1=zz"))], STRIPE_BODY, NOW),
        VerifyError::MalformedHeader { .. }
    ));
    assert_eq!(
        err(&[(h, &good), (h, &good)], STRIPE_BODY, NOW),
        VerifyError::DuplicateHeader { name: h }
    );
    let huge = format!("{good},{}", "v0=0,".repeat(2000));
    assert_eq!(
        err(&[(h, &huge)], STRIPE_BODY, NOW),
        VerifyError::HeaderTooLarge {
            name: h,
            limit: MAX_HEADER_LEN
        }
    );
    let many = format!("t={NOW}{}", ",v1=00".repeat(MAX_SIGNATURES + 1));
    assert!(matches!(
        err(&[(h, &many)], STRIPE_BODY, NOW),
        VerifyError::MalformedHeader { .. }
    ));
    // Wrong secret, tampered body.
    let wrong = stripe::sign("whsec_wrong", NOW, STRIPE_BODY);
    assert_eq!(
        err(&[(h, &wrong)], STRIPE_BODY, NOW),
        VerifyError::SignatureMismatch
    );
    let tampered = STRIPE_BODY.replace_last(b"succeeded", b"refunded!");
    assert_eq!(
        err(&[(h, &good)], &tampered, NOW),
        VerifyError::SignatureMismatch
    );
    // Stale and future, just outside the default 300 s.
    assert!(matches!(
        err(&[(h, &good)], STRIPE_BODY, NOW + 301),
        VerifyError::TimestampOutsideTolerance {
            skew_secs: -301,
            tolerance_secs: 300
        }
    ));
    assert!(matches!(
        err(&[(h, &good)], STRIPE_BODY, NOW - 301),
        VerifyError::TimestampOutsideTolerance { skew_secs: 301, .. }
    ));
    assert!(verify(&v, &[(h, &good)], STRIPE_BODY, NOW + 300).is_ok());
    // Zero tolerance disables the window only when set.
    let lax = stripe().disable_replay_window();
    assert!(verify(&lax, &[(h, &good)], STRIPE_BODY, NOW + 10_000_000).is_ok());
    // Non-numeric and overflowing timestamps.
    let sig = good.split_once(",v1=").unwrap().1;
    for t in ["abc", "1e9", "-5", "99999999999999999999"] {
        assert_eq!(
            err(&[(h, &format!("t={t},v1={sig}"))], STRIPE_BODY, NOW),
            VerifyError::InvalidTimestamp { name: h },
            "{t}"
        );
    }
    // Not JSON / no id (correctly signed).
    let body = b"not json";
    let signed = stripe::sign(STRIPE_SECRET, NOW, body);
    assert_eq!(err(&[(h, &signed)], body, NOW), VerifyError::BodyNotJson);
    let body = br#"{"object":"event"}"#;
    let signed = stripe::sign(STRIPE_SECRET, NOW, body);
    assert_eq!(
        err(&[(h, &signed)], body, NOW),
        VerifyError::MissingEventId { location: "/id" }
    );
    // No secret configured.
    let empty = stripe::StripeVerifier::new(Vec::<String>::new());
    assert_eq!(
        verify(&empty, &[(h, &good)], STRIPE_BODY, NOW).unwrap_err(),
        VerifyError::MissingConfiguration { what: "secret" }
    );
}

#[test]
fn stripe_api_version_mismatch_is_distinct() {
    let good = stripe::sign(STRIPE_SECRET, NOW, STRIPE_BODY);
    let pinned = stripe().expected_api_version("2024-06-20");
    assert!(verify(&pinned, &[("stripe-signature", &good)], STRIPE_BODY, NOW).is_ok());
    let other = stripe().expected_api_version("2025-01-27.acacia");
    let err = verify(&other, &[("stripe-signature", &good)], STRIPE_BODY, NOW).unwrap_err();
    assert_eq!(
        err,
        VerifyError::ApiVersionMismatch {
            expected: "2025-01-27.acacia".into(),
            received: "2024-06-20".into()
        }
    );
    assert!(
        !err.to_string().contains("2024-06-20"),
        "no body content in the message"
    );
    let problem = tower_idempotency_core::Problem::from(err);
    assert_eq!(problem.slug, "webhook-api-version-mismatch");
    assert_eq!(problem.status, 400);
}

trait ReplaceLast {
    fn replace_last(&self, from: &[u8], to: &[u8]) -> Vec<u8>;
}

impl ReplaceLast for [u8] {
    fn replace_last(&self, from: &[u8], to: &[u8]) -> Vec<u8> {
        let at = self.windows(from.len()).rposition(|w| w == from).unwrap();
        [&self[..at], to, &self[at + from.len()..]].concat()
    }
}

// ---------------------------------------------------------------------------------------------
// GitHub: the vector published at
// https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries#testing-the-webhook-payload-validation
// ---------------------------------------------------------------------------------------------
#[test]
fn github_published_vector() {
    let v = github::GitHubVerifier::new(["It's a Secret to Everybody"]);
    let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    assert_eq!(
        github::sign("It's a Secret to Everybody", b"Hello, World!"),
        sig
    );
    let webhook = verify(
        &v,
        &[
            ("X-Hub-Signature-256", sig),
            ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ],
        b"Hello, World!",
        NOW,
    )
    .unwrap();
    assert_eq!(webhook.event_id(), "72d3162e-cc78-11e3-81ab-4c9367dc0958");
    assert_eq!(webhook.json(), Err(NotJson));
}

#[test]
fn github_negative_cases() {
    let v = github::GitHubVerifier::new(["s-secret"]);
    let body = br#"{"zen":"x"}"#;
    let sig = github::sign("s-secret", body);
    let h = "x-hub-signature-256";
    let d = ("x-github-delivery", "d-1");
    let err = |headers: &[(&str, &str)], body: &[u8]| verify(&v, headers, body, NOW).unwrap_err();
    assert_eq!(err(&[d], body), VerifyError::MissingHeader { name: h });
    assert_eq!(
        err(&[("x-hub-signature", "sha1=00"), d], body),
        VerifyError::UnsupportedVersion { name: h }
    );
    assert_eq!(
        err(&[(h, "sha1=00"), d], body),
        VerifyError::UnsupportedVersion { name: h }
    );
    assert!(matches!(
        err(&[(h, "00ff"), d], body),
        VerifyError::MalformedHeader { .. }
    ));
    assert!(matches!(
        err(&[(h, "sha256=xyz"), d], body),
        VerifyError::MalformedHeader { .. }
    ));
    // An empty signature is malformed (400), as Stripe's empty `v1=` is, not a mismatch (401).
    assert_eq!(
        err(&[(h, "sha256="), d], body),
        VerifyError::MalformedHeader {
            name: h,
            reason: "empty signature"
        }
    );
    assert_eq!(
        err(&[(h, &sig), (h, &sig), d], body),
        VerifyError::DuplicateHeader { name: h }
    );
    assert_eq!(
        err(&[(h, &github::sign("t", body)), d], body),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        err(&[(h, &sig), d], b"{\"zen\":\"y\"}"),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        err(&[(h, &sig)], body),
        VerifyError::MissingEventId {
            location: "x-github-delivery"
        }
    );
    let long = "a".repeat(256);
    assert_eq!(
        err(&[(h, &sig), ("x-github-delivery", &long)], body),
        VerifyError::InvalidEventId {
            location: "x-github-delivery"
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Slack: the worked example of
// https://api.slack.com/authentication/verifying-requests-from-slack (also in the Bolt SDKs'
// tests).
// ---------------------------------------------------------------------------------------------
const SLACK_DOC_BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";

#[test]
fn slack_published_vector() {
    let secret = "8f742231b10e8888abcd99yyyzzz85a5";
    let expected = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
    assert_eq!(
        slack::sign(secret, 1_531_420_618, SLACK_DOC_BODY.as_bytes()),
        expected
    );
    // The example is a slash command (a form, no event_id): the signature verifies and the
    // verifier then asks for JSON, which is the Events API contract.
    let v = slack::SlackVerifier::new([secret]);
    let headers = [
        ("X-Slack-Request-Timestamp", "1531420618"),
        ("X-Slack-Signature", expected),
    ];
    assert_eq!(
        verify(&v, &headers, SLACK_DOC_BODY.as_bytes(), 1_531_420_618).unwrap_err(),
        VerifyError::BodyNotJson
    );
    assert_eq!(
        verify(&v, &headers, b"token=tampered", 1_531_420_618).unwrap_err(),
        VerifyError::SignatureMismatch
    );
}

#[test]
fn slack_events_challenge_and_negatives() {
    let v = slack::SlackVerifier::new(["other-secret", "slack-secret"]);
    let body = br#"{"type":"event_callback","event_id":"Ev123","event":{"type":"app_mention"}}"#;
    let ts = NOW.to_string();
    let sig = slack::sign("slack-secret", NOW, body);
    let (t, s) = ("x-slack-request-timestamp", "x-slack-signature");
    let ok = verify(&v, &[(t, &ts), (s, &sig)], body, NOW).unwrap();
    assert_eq!((ok.event_id(), ok.secret_index()), ("Ev123", Some(1)));
    assert!(slack::url_verification_response(&ok).is_none());

    let challenge = br#"{"token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let csig = slack::sign("slack-secret", NOW, challenge);
    let hook = verify(&v, &[(t, &ts), (s, &csig)], challenge, NOW).unwrap();
    let response = slack::url_verification_response(&hook).unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        hook.challenge().unwrap().body.as_ref(),
        br#"{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}"#
    );

    let err = |headers: &[(&str, &str)], body: &[u8], now: u64| {
        verify(&v, headers, body, now).unwrap_err()
    };
    assert_eq!(
        err(&[(s, &sig)], body, NOW),
        VerifyError::MissingHeader { name: t }
    );
    assert_eq!(
        err(&[(t, &ts)], body, NOW),
        VerifyError::MissingHeader { name: s }
    );
    assert_eq!(
        err(&[(t, &ts), (s, "v1=00")], body, NOW),
        VerifyError::UnsupportedVersion { name: s }
    );
    assert_eq!(
        err(&[(t, "soon"), (s, &sig)], body, NOW),
        VerifyError::InvalidTimestamp { name: t }
    );
    assert!(matches!(
        err(&[(t, &ts), (s, &sig)], body, NOW + 600),
        VerifyError::TimestampOutsideTolerance { .. }
    ));
    assert!(matches!(
        err(&[(t, &ts), (s, &sig)], body, NOW - 600),
        VerifyError::TimestampOutsideTolerance { .. }
    ));
    assert_eq!(
        err(&[(t, &ts), (s, &slack::sign("bad", NOW, body))], body, NOW),
        VerifyError::SignatureMismatch
    );
    let no_id = br#"{"type":"event_callback"}"#;
    assert_eq!(
        err(
            &[(t, &ts), (s, &slack::sign("slack-secret", NOW, no_id))],
            no_id,
            NOW
        ),
        VerifyError::MissingEventId {
            location: "/event_id"
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Standard Webhooks: the specification's vector, repeated by every reference library's tests
// (https://github.com/standard-webhooks/standard-webhooks, libraries/*/ tests, and
// https://docs.svix.com/receiving/verifying-payloads/how-manual).
// ---------------------------------------------------------------------------------------------
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TS: u64 = 1_614_265_330;
const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SW_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

#[test]
fn standard_webhooks_published_vector_both_header_families() {
    let key = standard::decode_secret(SW_SECRET).unwrap();
    assert_eq!(standard::sign(&key, SW_ID, SW_TS, SW_BODY), SW_SIG);
    let v = standard::StandardWebhooksVerifier::new([SW_SECRET]).unwrap();
    for prefix in ["webhook", "svix"] {
        let (i, t, s) = (
            format!("{prefix}-id"),
            format!("{prefix}-timestamp"),
            format!("{prefix}-signature"),
        );
        let ts = SW_TS.to_string();
        let hook = verify(&v, &[(&i, SW_ID), (&t, &ts), (&s, SW_SIG)], SW_BODY, SW_TS).unwrap();
        assert_eq!(hook.event_id(), SW_ID);
        assert_eq!(hook.provider(), "standard-webhooks");
    }
    // The prefix is optional on the secret.
    assert!(standard::StandardWebhooksVerifier::new(["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]).is_ok());
    assert!(standard::StandardWebhooksVerifier::new(["whsec_not base64!"]).is_err());
}

#[test]
fn standard_webhooks_rotation_versions_ed25519_and_negatives() {
    use ed25519_dalek::{Signer, SigningKey};
    let v = standard::StandardWebhooksVerifier::new([SW_SECRET]).unwrap();
    let ts = SW_TS.to_string();
    let (i, t, s) = ("webhook-id", "webhook-timestamp", "webhook-signature");
    let err = |headers: &[(&str, &str)], body: &[u8], now: u64| {
        verify(&v, headers, body, now).unwrap_err()
    };
    let other = standard::sign(b"other-key", SW_ID, SW_TS, SW_BODY);
    let several = format!("v2,AAAA {other} {SW_SIG}");
    assert!(verify(&v, &[(i, SW_ID), (t, &ts), (s, &several)], SW_BODY, SW_TS).is_ok());
    assert_eq!(
        err(
            &[(i, SW_ID), (t, &ts), (s, "v2,AAAA v1a,AAAA")],
            SW_BODY,
            SW_TS
        ),
        VerifyError::UnsupportedVersion { name: s }
    );
    assert_eq!(
        err(&[(i, SW_ID), (t, &ts), (s, &other)], SW_BODY, SW_TS),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        err(&[(i, "msg_other"), (t, &ts), (s, SW_SIG)], SW_BODY, SW_TS),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        err(
            &[(i, SW_ID), (t, &ts), (s, SW_SIG)],
            br#"{"test": 2432232315}"#,
            SW_TS
        ),
        VerifyError::SignatureMismatch
    );
    assert!(matches!(
        err(&[(i, SW_ID), (t, &ts), (s, "v1,@@@")], SW_BODY, SW_TS),
        VerifyError::MalformedHeader { .. }
    ));
    assert!(matches!(
        err(&[(i, SW_ID), (t, &ts), (s, "v1,")], SW_BODY, SW_TS),
        VerifyError::MalformedHeader { .. }
    ));
    assert!(matches!(
        err(&[(i, SW_ID), (t, &ts), (s, "nocomma")], SW_BODY, SW_TS),
        VerifyError::MalformedHeader { .. }
    ));
    assert_eq!(
        err(&[(t, &ts), (s, SW_SIG)], SW_BODY, SW_TS),
        VerifyError::MissingHeader { name: i }
    );
    assert_eq!(
        err(&[(i, SW_ID), (t, "x"), (s, SW_SIG)], SW_BODY, SW_TS),
        VerifyError::InvalidTimestamp { name: t }
    );
    assert!(matches!(
        err(&[(i, SW_ID), (t, &ts), (s, SW_SIG)], SW_BODY, SW_TS + 301),
        VerifyError::TimestampOutsideTolerance { .. }
    ));
    assert!(matches!(
        err(&[(i, SW_ID), (t, &ts), (s, SW_SIG)], SW_BODY, SW_TS - 301),
        VerifyError::TimestampOutsideTolerance { .. }
    ));
    let many = vec![SW_SIG; MAX_SIGNATURES + 1].join(" ");
    assert!(matches!(
        err(&[(i, SW_ID), (t, &ts), (s, &many)], SW_BODY, SW_TS),
        VerifyError::MalformedHeader { .. }
    ));

    // v1a: Ed25519 over the same signed content.
    let signing = SigningKey::from_bytes(&[7u8; 32]);
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let pk = format!("whpk_{}", b64.encode(signing.verifying_key().as_bytes()));
    let message = [SW_ID.as_bytes(), b".", ts.as_bytes(), b".", SW_BODY].concat();
    let sig = format!("v1a,{}", b64.encode(signing.sign(&message).to_bytes()));
    let asym = standard::StandardWebhooksVerifier::from_public_keys([pk]).unwrap();
    assert!(matches!(
        standard::StandardWebhooksVerifier::from_public_keys(Vec::<String>::new()),
        Err(ConfigError::InvalidPublicKey { .. })
    ));
    assert!(verify(&asym, &[(i, SW_ID), (t, &ts), (s, &sig)], SW_BODY, SW_TS).is_ok());
    assert_eq!(
        verify(&asym, &[(i, SW_ID), (t, &ts), (s, &sig)], b"{}", SW_TS).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    // v1 only, but only public keys configured.
    assert_eq!(
        verify(&asym, &[(i, SW_ID), (t, &ts), (s, SW_SIG)], SW_BODY, SW_TS).unwrap_err(),
        VerifyError::UnsupportedVersion { name: s }
    );
}

// ---------------------------------------------------------------------------------------------
// Shopify. Shopify's docs verify base64(HMAC-SHA256(secret, raw body)); no fixed vector is
// published, so this one was computed independently with Python's hmac + base64 modules.
// ---------------------------------------------------------------------------------------------
#[test]
fn shopify_vector_ids_and_negatives() {
    let body = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    let v = shopify::ShopifyVerifier::new(["hush"]);
    let sig = shopify::sign("hush", body);
    assert_eq!(sig, SHOPIFY_SIG);
    let hook = verify(
        &v,
        &[
            ("X-Shopify-Hmac-Sha256", &sig),
            ("X-Shopify-Event-Id", "ev-1"),
            ("X-Shopify-Webhook-Id", "wh-1"),
        ],
        body,
        NOW,
    )
    .unwrap();
    assert_eq!(hook.event_id(), "ev-1");
    let hook = verify(
        &v,
        &[
            ("shopify-hmac-sha256", &sig),
            ("shopify-webhook-id", "wh-1"),
        ],
        body,
        NOW,
    )
    .unwrap();
    assert_eq!(hook.event_id(), "wh-1");
    let h = "x-shopify-hmac-sha256";
    let e = ("x-shopify-event-id", "ev-1");
    assert_eq!(
        verify(&v, &[e], body, NOW).unwrap_err(),
        VerifyError::MissingHeader { name: h }
    );
    assert!(matches!(
        verify(&v, &[(h, "!!"), e], body, NOW).unwrap_err(),
        VerifyError::MalformedHeader { .. }
    ));
    assert_eq!(
        verify(&v, &[(h, &shopify::sign("x", body)), e], body, NOW).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        verify(&v, &[(h, &sig)], body, NOW).unwrap_err(),
        VerifyError::MissingEventId {
            location: "x-shopify-event-id"
        }
    );
}

const SHOPIFY_SIG: &str = "D0UMXmhjwBRi4y66TmhJrDlhQABD7zI2fm3p6/QLMo8=";

// ---------------------------------------------------------------------------------------------
// Paddle: scheme from https://developer.paddle.com/webhooks/signature-verification; vector
// computed independently with Python's hmac module over "1671552777:" + body.
// ---------------------------------------------------------------------------------------------
#[test]
fn paddle_vector_and_negatives() {
    let secret = "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_6h3qd3uFSi9YCD3OLYAShQI90XTI5vEI";
    let body =
        br#"{"event_id":"evt_01h8bzakzx3hm2fmen703n5q45","event_type":"transaction.completed"}"#;
    let header = paddle::sign(secret, 1_671_552_777, body);
    assert_eq!(header, format!("ts=1671552777;h1={PADDLE_H1}"));
    let v = paddle::PaddleVerifier::new([secret]);
    let h = "paddle-signature";
    let hook = verify(&v, &[(h, &header)], body, 1_671_552_777).unwrap();
    assert_eq!(hook.event_id(), "evt_01h8bzakzx3hm2fmen703n5q45");
    let rotated = format!("ts=1671552777;h1={};h1={PADDLE_H1}", "00".repeat(32));
    assert!(verify(&v, &[(h, &rotated)], body, 1_671_552_777).is_ok());
    assert_eq!(
        verify(&v, &[(h, "ts=1671552777;h2=00")], body, 1_671_552_777).unwrap_err(),
        VerifyError::UnsupportedVersion { name: h }
    );
    assert_eq!(
        verify(&v, &[(h, &header)], b"{}", 1_671_552_777).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert!(matches!(
        verify(&v, &[(h, &header)], body, 1_671_552_777 + 301).unwrap_err(),
        VerifyError::TimestampOutsideTolerance { .. }
    ));
    assert_eq!(
        verify(
            &v,
            &[(h, &format!("ts=x;h1={PADDLE_H1}"))],
            body,
            1_671_552_777
        )
        .unwrap_err(),
        VerifyError::InvalidTimestamp { name: h }
    );
    let no_id = br#"{"event_type":"x"}"#;
    let signed = paddle::sign(secret, 1_671_552_777, no_id);
    assert_eq!(
        verify(&v, &[(h, &signed)], no_id, 1_671_552_777).unwrap_err(),
        VerifyError::MissingEventId {
            location: "/event_id"
        }
    );
}

const PADDLE_H1: &str = "6b16f6101e6d6d3d764dc20b32062a57f980a19f2f5802db585d750679ab7b3b";

// ---------------------------------------------------------------------------------------------
// Linear: scheme from https://linear.app/developers/webhooks#securing-webhooks.
// ---------------------------------------------------------------------------------------------
#[test]
fn linear_sign_verify_and_negatives() {
    let v = linear::LinearVerifier::new(["lin_wh_secret"]);
    let ms = NOW * 1000 + 123;
    let body = format!(r#"{{"action":"create","type":"Issue","webhookTimestamp":{ms}}}"#);
    let body = body.as_bytes();
    let sig = linear::sign("lin_wh_secret", body);
    let (s, d) = ("linear-signature", "linear-delivery");
    let hook = verify(
        &v,
        &[(s, &sig), (d, "234d1a4e-b617-4388-90fe-adc3633d6b72")],
        body,
        NOW,
    )
    .unwrap();
    assert_eq!(hook.event_id(), "234d1a4e-b617-4388-90fe-adc3633d6b72");
    assert_eq!(hook.signed_at(), Some(at(NOW)));
    assert!(matches!(
        verify(&v, &[(s, &sig), (d, "x")], body, NOW + 400).unwrap_err(),
        VerifyError::TimestampOutsideTolerance { .. }
    ));
    assert_eq!(
        verify(&v, &[(s, &linear::sign("no", body)), (d, "x")], body, NOW).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        verify(&v, &[(s, &sig)], body, NOW).unwrap_err(),
        VerifyError::MissingEventId { location: d }
    );
    let no_ts = br#"{"action":"create"}"#;
    assert_eq!(
        verify(
            &v,
            &[(s, &linear::sign("lin_wh_secret", no_ts)), (d, "x")],
            no_ts,
            NOW
        )
        .unwrap_err(),
        VerifyError::InvalidTimestamp {
            name: "webhookTimestamp"
        }
    );
}

// ---------------------------------------------------------------------------------------------
// GitLab: plain token, https://docs.gitlab.com/user/project/integrations/webhooks/
// ---------------------------------------------------------------------------------------------
#[test]
fn gitlab_token_and_keys() {
    let v = gitlab::GitLabVerifier::new(["new-token", "old-token"]);
    let body = br#"{"object_kind":"push"}"#;
    let (t, k) = ("x-gitlab-token", "idempotency-key");
    let hook = verify(&v, &[(t, "old-token"), (k, "f1e2")], body, NOW).unwrap();
    assert_eq!((hook.event_id(), hook.secret_index()), ("f1e2", Some(1)));
    let hook = verify(
        &v,
        &[(t, "new-token"), ("x-gitlab-event-uuid", "uuid-1")],
        body,
        NOW,
    )
    .unwrap();
    assert_eq!(hook.event_id(), "uuid-1");
    assert_eq!(
        verify(&v, &[(t, "new-tokeN"), (k, "a")], body, NOW).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        verify(&v, &[(k, "a")], body, NOW).unwrap_err(),
        VerifyError::MissingHeader { name: t }
    );
    assert_eq!(
        verify(&v, &[(t, "new-token")], body, NOW).unwrap_err(),
        VerifyError::MissingEventId { location: k }
    );
    assert_eq!(
        verify(
            &v,
            &[(t, "new-token"), (t, "new-token"), (k, "a")],
            body,
            NOW
        )
        .unwrap_err(),
        VerifyError::DuplicateHeader { name: t }
    );
}

// ---------------------------------------------------------------------------------------------
// Zoom: scheme and url_validation from https://developers.zoom.us/docs/api/webhooks/
// ---------------------------------------------------------------------------------------------
#[test]
fn zoom_events_and_url_validation() {
    let v = zoom::ZoomVerifier::new(["zoom_secret"]);
    let ts = NOW.to_string();
    let (s, t) = ("x-zm-signature", "x-zm-request-timestamp");
    let body = br#"{"event":"meeting.started","event_ts":1700000000000,"payload":{}}"#;
    let sig = zoom::sign("zoom_secret", NOW, body);
    let hook = verify(&v, &[(s, &sig), (t, &ts)], body, NOW).unwrap();
    assert!(hook.event_id().starts_with("sha256:"));
    assert!(zoom::url_validation_response(&hook).is_none());
    let again = verify(&v, &[(s, &sig), (t, &ts)], body, NOW).unwrap();
    assert_eq!(hook.event_id(), again.event_id());

    let body = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
    let sig = zoom::sign("zoom_secret", NOW, body);
    let hook = verify(&v, &[(s, &sig), (t, &ts)], body, NOW).unwrap();
    let response = zoom::url_validation_response(&hook).unwrap();
    assert_eq!(response.status(), 200);
    let answer: serde_json::Value =
        serde_json::from_slice(&hook.challenge().unwrap().body).unwrap();
    assert_eq!(answer["plainToken"], "qgg8vlvZRS6UYooatFL8Aw");
    assert_eq!(answer["encryptedToken"], ZOOM_ENCRYPTED);
    assert_eq!(
        verify(&v, &[(s, &sig), (t, &ts)], b"{}", NOW).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        verify(&v, &[(s, "v1=00"), (t, &ts)], body, NOW).unwrap_err(),
        VerifyError::UnsupportedVersion { name: s }
    );
}

const ZOOM_ENCRYPTED: &str = "46a324cfb7c2ec760e4cd561586a53aadb6fc7561eb8d626d6ee1b71d808b3c0";

#[test]
fn problems_have_distinct_slugs_and_no_secrets() {
    let errors = [
        VerifyError::MissingHeader { name: "h" },
        VerifyError::MalformedHeader {
            name: "h",
            reason: "r",
        },
        VerifyError::DuplicateHeader { name: "h" },
        VerifyError::HeaderTooLarge {
            name: "h",
            limit: 1,
        },
        VerifyError::UnsupportedVersion { name: "h" },
        VerifyError::SignatureMismatch,
        VerifyError::TimestampOutsideTolerance {
            skew_secs: 1,
            tolerance_secs: 0,
        },
        VerifyError::InvalidTimestamp { name: "h" },
        VerifyError::BodyNotJson,
        VerifyError::MalformedBody { reason: "r" },
        VerifyError::MissingEventId { location: "l" },
        VerifyError::InvalidEventId { location: "l" },
        VerifyError::ApiVersionMismatch {
            expected: "a".into(),
            received: "b".into(),
        },
        VerifyError::MissingConfiguration { what: "secret" },
    ];
    let mut slugs = std::collections::HashSet::new();
    for error in errors {
        let problem = tower_idempotency_core::Problem::from(error.clone());
        assert!(slugs.insert(problem.slug), "{}", problem.slug);
        assert!(problem.slug.starts_with("webhook-"));
        let expected = match error {
            VerifyError::SignatureMismatch
            | VerifyError::UnsupportedVersion { .. }
            | VerifyError::TimestampOutsideTolerance { .. } => 401,
            VerifyError::MissingConfiguration { .. } => 500,
            _ => 400,
        };
        assert_eq!(problem.status, expected, "{}", problem.slug);
    }
    // A real mismatch: the detail names neither the secret nor any signature.
    let v = stripe();
    let wrong = stripe::sign("whsec_wrong", NOW, STRIPE_BODY);
    let problem = tower_idempotency_core::Problem::from(
        verify(&v, &[("stripe-signature", &wrong)], STRIPE_BODY, NOW).unwrap_err(),
    );
    let right = stripe::sign(STRIPE_SECRET, NOW, STRIPE_BODY);
    for needle in [STRIPE_SECRET, &wrong[14..], &right[14..], "charge"] {
        assert!(!problem.detail.contains(needle));
    }
    assert_eq!(format!("{:?}", stripe()).matches("[redacted]").count(), 1);
    let _ = parts(&[]);
}

// ---------------------------------------------------------------------------------------------
// SendGrid: the vector of the official SDKs' tests (`common::SG_*`).
// ---------------------------------------------------------------------------------------------

#[test]
fn sendgrid_published_vector_and_negatives() {
    let v = sendgrid::SendGridVerifier::new([SG_KEY]).unwrap();
    let (s, t) = (
        "x-twilio-email-event-webhook-signature",
        "x-twilio-email-event-webhook-timestamp",
    );
    let hook = verify(&v, &[(s, SG_SIG), (t, "1588788367")], SG_PAYLOAD, SG_TS).unwrap();
    assert!(hook.event_id().starts_with("sha256:"));
    assert_eq!(hook.signed_at(), Some(at(SG_TS)));
    // The SDKs' negative cases: other timestamp, other payload, other key, altered signature.
    assert_eq!(
        verify(&v, &[(s, SG_SIG), (t, "1388788367")], SG_PAYLOAD, SG_TS).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        verify(&v, &[(s, SG_SIG), (t, "1588788367")], b"payload", SG_TS).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    let other = sendgrid::SendGridVerifier::new(["MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEqTxd43gyp8IOEto2LdIfjRQrIbsd4SXZkLW6jDutdhXSJCWHw8REntlo7aNDthvj+y7GjUuFDb/R1NGe1OPzpA=="]).unwrap();
    assert_eq!(
        verify(&other, &[(s, SG_SIG), (t, "1588788367")], SG_PAYLOAD, SG_TS).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    let failing = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH3j/0=";
    assert_eq!(
        verify(&v, &[(s, failing), (t, "1588788367")], SG_PAYLOAD, SG_TS).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert!(matches!(
        verify(&v, &[(s, "notder"), (t, "1588788367")], SG_PAYLOAD, SG_TS).unwrap_err(),
        VerifyError::MalformedHeader { .. }
    ));
    assert!(matches!(
        verify(
            &v,
            &[(s, SG_SIG), (t, "1588788367")],
            SG_PAYLOAD,
            SG_TS + 301
        )
        .unwrap_err(),
        VerifyError::TimestampOutsideTolerance { .. }
    ));
    assert_eq!(
        verify(&v, &[(s, SG_SIG), (t, "x")], SG_PAYLOAD, SG_TS).unwrap_err(),
        VerifyError::InvalidTimestamp { name: t }
    );
    assert!(sendgrid::SendGridVerifier::new(["bm90IGEga2V5"]).is_err());
    // The published payload is one object, not a batch.
    assert!(matches!(
        sendgrid::event_ids(&hook).unwrap_err(),
        VerifyError::MalformedBody { .. }
    ));
}

#[test]
fn sendgrid_sign_verify_batch_ids() {
    use p256::ecdsa::{signature::Signer, Signature, SigningKey};
    use p256::pkcs8::EncodePublicKey;
    let signing = SigningKey::from_slice(&[9u8; 32]).unwrap();
    let der = signing.verifying_key().to_public_key_der().unwrap();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let v = sendgrid::SendGridVerifier::new([b64.encode(der.as_bytes())]).unwrap();
    let body = br#"[{"sg_event_id":"a1","event":"delivered"},{"sg_event_id":"b2","event":"open"}]"#;
    let ts = NOW.to_string();
    let sig: Signature = signing.sign(&[ts.as_bytes(), body].concat());
    let sig = b64.encode(sig.to_der().as_bytes());
    let hook = verify(
        &v,
        &[
            ("x-twilio-email-event-webhook-signature", &sig),
            ("x-twilio-email-event-webhook-timestamp", &ts),
        ],
        body,
        NOW,
    )
    .unwrap();
    assert_eq!(sendgrid::event_ids(&hook).unwrap(), ["a1", "b2"]);
}

// ---------------------------------------------------------------------------------------------
// Discord: Ed25519 over timestamp + body. Discord publishes no vector; the key below is
// RFC 8032 section 7.1 TEST 1's, and the signature is checked by ed25519-dalek's signer.
// ---------------------------------------------------------------------------------------------
#[test]
fn discord_sign_verify_ping_and_negatives() {
    use ed25519_dalek::{Signer, SigningKey};
    let secret =
        hex::decode("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60").unwrap();
    let signing = SigningKey::from_bytes(&secret.try_into().unwrap());
    let public = hex::encode(signing.verifying_key().as_bytes());
    assert_eq!(
        public,
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    );
    let v = discord::DiscordVerifier::new([public]).unwrap();
    let ts = NOW.to_string();
    let (s, t) = ("x-signature-ed25519", "x-signature-timestamp");
    let sign = |body: &[u8]| hex::encode(signing.sign(&[ts.as_bytes(), body].concat()).to_bytes());
    let ping = br#"{"id":"1180000000000000001","type":1,"application_id":"1"}"#;
    let hook = verify(&v, &[(s, &sign(ping)), (t, &ts)], ping, NOW).unwrap();
    assert_eq!(hook.event_id(), "1180000000000000001");
    assert_eq!(hook.challenge().unwrap().body.as_ref(), br#"{"type":1}"#);
    assert!(discord::ping_response(&hook).is_some());
    let command = br#"{"id":"1180000000000000002","type":2}"#;
    let hook = verify(&v, &[(s, &sign(command)), (t, &ts)], command, NOW).unwrap();
    assert!(discord::ping_response(&hook).is_none());
    assert_eq!(
        verify(&v, &[(s, &sign(command)), (t, &ts)], ping, NOW).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert!(matches!(
        verify(&v, &[(s, "abcd"), (t, &ts)], ping, NOW).unwrap_err(),
        VerifyError::MalformedHeader { .. }
    ));
    assert!(matches!(
        verify(&v, &[(s, &sign(ping)), (t, &ts)], ping, NOW + 1000).unwrap_err(),
        VerifyError::TimestampOutsideTolerance { .. }
    ));
    assert_eq!(
        verify(&v, &[(s, &sign(ping))], ping, NOW).unwrap_err(),
        VerifyError::MissingHeader { name: t }
    );
    assert!(discord::DiscordVerifier::new(["zz"]).is_err());
}

// ---------------------------------------------------------------------------------------------
// Mailgun: scheme from https://documentation.mailgun.com (securing webhooks); vector computed
// independently with Python: hmac.new(b"key-mg", b"1700000000" + b"tok-1", sha256).hexdigest().
// ---------------------------------------------------------------------------------------------
#[test]
fn mailgun_vector_and_negatives() {
    let signature = mailgun::sign("key-mg", NOW, "tok-1");
    assert_eq!(signature["signature"], MAILGUN_SIG);
    let body = serde_json::json!({
        "signature": signature,
        "event-data": { "id": "CPgfbmQMTCKtHW6uIWtuVe", "event": "delivered" }
    })
    .to_string();
    let v = mailgun::MailgunVerifier::new(["key-old", "key-mg"]);
    let hook = verify(&v, &[], body.as_bytes(), NOW).unwrap();
    assert_eq!(
        (hook.event_id(), hook.secret_index()),
        ("CPgfbmQMTCKtHW6uIWtuVe", Some(1))
    );
    assert!(matches!(
        verify(&v, &[], body.as_bytes(), NOW + 301).unwrap_err(),
        VerifyError::TimestampOutsideTolerance { .. }
    ));
    let wrong = body.replace("tok-1", "tok-2");
    assert_eq!(
        verify(&v, &[], wrong.as_bytes(), NOW).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        verify(&v, &[], b"form=1", NOW).unwrap_err(),
        VerifyError::BodyNotJson
    );
    assert!(matches!(
        verify(&v, &[], br#"{"event-data":{}}"#, NOW).unwrap_err(),
        VerifyError::MalformedBody { .. }
    ));
    let no_id = serde_json::json!({ "signature": signature, "event-data": {} }).to_string();
    assert_eq!(
        verify(&v, &[], no_id.as_bytes(), NOW).unwrap_err(),
        VerifyError::MissingEventId {
            location: "/event-data/id"
        }
    );
}

const MAILGUN_SIG: &str = "9cd74a7186b9afa259bfeb1db33c27e1aa505b9caeb49fcc51bf42430af6bc71";

// ---------------------------------------------------------------------------------------------
// Square: scheme from https://developer.squareup.com/docs/webhooks/step3validate; vector
// computed independently with Python: base64(hmac.new(key, url + body, sha256).digest()).
// ---------------------------------------------------------------------------------------------
#[test]
fn square_vector_url_and_negatives() {
    let url = "https://example.com/webhooks/square";
    let body = br#"{"merchant_id":"MLEFBHHSJGVHD","type":"payment.updated","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f"}"#;
    assert_eq!(square::sign("asdf1234", url, body), SQUARE_SIG);
    let v = square::SquareVerifier::new(url, ["asdf1234"]).unwrap();
    let h = "x-square-hmacsha256-signature";
    let at = |path: &str| {
        let mut parts = common::parts(&[(h, SQUARE_SIG)]);
        parts.uri = path.parse().unwrap();
        v.verify(
            &parts,
            &bytes::Bytes::copy_from_slice(body),
            common::at(NOW),
        )
    };
    let hook = at("/webhooks/square").unwrap();
    assert_eq!(hook.event_id(), "ac3ac95b-f97d-458c-a6e6-18981597e05f");
    // A tail of the registered path (a proxy or `Router::nest` stripped `/webhooks`).
    assert!(at("/square").is_ok());
    // Square signed the registered URL, not these: another query, route or spelling.
    for elsewhere in [
        "/webhooks/square?tenant=evil",
        "/webhooks/other",
        "/hook",
        "/webhooks/%73quare",
        "/x/webhooks/square",
        "/uare",
    ] {
        assert_eq!(
            at(elsewhere).unwrap_err(),
            VerifyError::SignatureMismatch,
            "{elsewhere}"
        );
    }
    // The same delivery checked against another registered URL does not verify.
    let elsewhere = square::SquareVerifier::new("https://example.com/other", ["asdf1234"]).unwrap();
    let mut parts = common::parts(&[(h, SQUARE_SIG)]);
    parts.uri = "/other".parse().unwrap();
    assert_eq!(
        elsewhere
            .verify(
                &parts,
                &bytes::Bytes::copy_from_slice(body),
                common::at(NOW)
            )
            .unwrap_err(),
        VerifyError::SignatureMismatch
    );
    assert_eq!(
        verify(&v, &[("x-square-signature", "abc=")], body, NOW).unwrap_err(),
        VerifyError::UnsupportedVersion { name: h }
    );
    assert_eq!(
        verify(&v, &[], body, NOW).unwrap_err(),
        VerifyError::MissingHeader { name: h }
    );
    assert!(square::SquareVerifier::new("/relative", ["k-secret"]).is_err());
}

const SQUARE_SIG: &str = "11N21HjqFKWRsdJxwSH/Xl5KNw336tVVHc3WdbJzBNs=";

/// Each `v1a` signature costs an Ed25519 check (a hash of the whole body) per public key, and
/// none of that work is authenticated: the header may carry at most
/// [`MAX_ASYMMETRIC_SIGNATURES`] of them, refused before any is checked.
#[test]
fn standard_webhooks_v1a_signatures_are_capped_before_any_check() {
    use base64::Engine as _;
    use ed25519_dalek::{Signer, SigningKey};
    let b64 = base64::engine::general_purpose::STANDARD;
    let signing = SigningKey::from_bytes(&[7u8; 32]);
    let pk = format!("whpk_{}", b64.encode(signing.verifying_key().as_bytes()));
    let asym = standard::StandardWebhooksVerifier::from_public_keys([pk]).unwrap();
    let ts = SW_TS.to_string();
    let message = [SW_ID.as_bytes(), b".", ts.as_bytes(), b".", SW_BODY].concat();
    let genuine = format!("v1a,{}", b64.encode(signing.sign(&message).to_bytes()));
    let forged = format!("v1a,{}", b64.encode([1u8; 64]));
    let (i, t, s) = ("webhook-id", "webhook-timestamp", "webhook-signature");
    let with = |count: usize| {
        let mut members = vec![forged.clone(); count - 1];
        members.push(genuine.clone());
        let header = members.join(" ");
        verify(&asym, &[(i, SW_ID), (t, &ts), (s, &header)], SW_BODY, SW_TS)
    };
    assert!(with(MAX_ASYMMETRIC_SIGNATURES).is_ok());
    assert_eq!(
        with(MAX_ASYMMETRIC_SIGNATURES + 1).unwrap_err(),
        VerifyError::MalformedHeader {
            name: s,
            reason: "too many v1a signatures",
        }
    );
}
