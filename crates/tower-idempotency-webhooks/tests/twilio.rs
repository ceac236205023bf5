//! Twilio: published vectors, negatives and sign-then-verify properties.
//!
//! The vectors are twilio-python's (tests/unit/test_request_validator.py: auth token `12345`,
//! `https://mycompany.com/myapp.php?foo=1&bar=2`, the five call parameters, the duplicate-name
//! MultiDict case, the `:443` / `:80` / `:1234` port cases and the `bodySHA256` JSON case), and
//! were re-computed independently with Python's hmac module before being pasted here.

use std::{
    sync::LazyLock,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use http::request::Parts;
use proptest::prelude::*;
use tower_idempotency_webhooks::{
    twilio::{self, TwilioVerifier},
    ConfigError, Verifier, VerifyError,
};

/// The published vectors' auth token; shorter than any verifier accepts, so the vectors are
/// checked through [`twilio::sign`] and verification runs with [`TOKEN`].
const VECTOR_TOKEN: &str = "12345";
/// An auth token of the length Twilio issues (32 hex digits).
const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const PATH: &str = "/myapp.php?foo=1&bar=2";
const URL: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";
const PARAMS: &[(&str, &str)] = &[
    ("CallSid", "CA1234567890ABCDE"),
    ("Digits", "1234"),
    ("From", "+14158675309"),
    ("To", "+18005551212"),
    ("Caller", "+14158675309"),
];
const FORM_BODY: &str = "CallSid=CA1234567890ABCDE&Digits=1234&From=%2B14158675309&To=%2B18005551212&Caller=%2B14158675309";
/// Over the URL without a port.
const VECTOR_SIG: &str = "RSOYDt4T1cUTdK1PDd93/VVr8B8=";
/// Over `https://mycompany.com:443/...`.
const VECTOR_SIG_443: &str = "kvajT1Ptam85bY51eRf/AJRuM3w=";
/// Over `http://mycompany.com:80/...`.
const VECTOR_SIG_HTTP_80: &str = "0ZXoZLH/DfblKGATFgpif+LLRf4=";
/// Over `http://mycompany.com:1234/...`.
const VECTOR_SIG_HTTP_1234: &str = "Zmvh+3yNM1Phv2jhDCwEM3q5ebU=";
/// `Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234`: repeated names sorted by value.
const VECTOR_SIG_DUPLICATES: &str = "IK+Dwps556ElfBT0I3Rgjkr1wJU=";
const JSON_BODY: &str = r#"{"property": "value", "boolean": true}"#;
const JSON_HASH: &str = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
const VECTOR_SIG_JSON: &str = "a9nBmqA0ju/hNViExpshrM61xv4=";

/// The vectors' requests signed with [`TOKEN`].
static SIG: LazyLock<String> = LazyLock::new(|| twilio::sign(TOKEN, URL, PARAMS));
static SIG_443: LazyLock<String> = LazyLock::new(|| {
    twilio::sign(
        TOKEN,
        "https://mycompany.com:443/myapp.php?foo=1&bar=2",
        PARAMS,
    )
});
static SIG_HTTP_80: LazyLock<String> = LazyLock::new(|| {
    twilio::sign(
        TOKEN,
        "http://mycompany.com:80/myapp.php?foo=1&bar=2",
        PARAMS,
    )
});
static SIG_HTTP_1234: LazyLock<String> = LazyLock::new(|| {
    twilio::sign(
        TOKEN,
        "http://mycompany.com:1234/myapp.php?foo=1&bar=2",
        PARAMS,
    )
});
static SIG_DUPLICATES: LazyLock<String> = LazyLock::new(|| twilio::sign(TOKEN, URL, DUPLICATES));
static SIG_JSON: LazyLock<String> = LazyLock::new(|| {
    twilio::sign(
        TOKEN,
        &twilio::url_with_body_sha256(URL, JSON_BODY.as_bytes()),
        &[],
    )
});
const DUPLICATES: &[(&str, &str)] = &[
    ("Sid", "CA123"),
    ("SidAccount", "AC123"),
    ("Digits", "5678"),
    ("Digits", "1234"),
];

const FORM: &str = "application/x-www-form-urlencoded";

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> Parts {
    let mut builder = http::Request::builder().method(method).uri(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap().into_parts().0
}

fn post(
    verifier: &TwilioVerifier,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<tower_idempotency_webhooks::VerifiedWebhook, VerifyError> {
    verifier.verify(
        &request("POST", path, headers),
        &Bytes::copy_from_slice(body.as_bytes()),
        now(),
    )
}

fn form(signature: &str) -> Vec<(&'static str, String)> {
    vec![
        ("x-twilio-signature", signature.to_owned()),
        ("content-type", format!("{FORM}; charset=utf-8")),
    ]
}

fn headers<'a>(list: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    list.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn verifier(base: &str) -> TwilioVerifier {
    TwilioVerifier::new(base, [TOKEN]).unwrap()
}

#[test]
fn published_vectors_and_sign_agree() {
    assert_eq!(twilio::sign(VECTOR_TOKEN, URL, PARAMS), VECTOR_SIG);
    let with_port = |url: &str| twilio::sign(VECTOR_TOKEN, url, PARAMS);
    assert_eq!(
        with_port("https://mycompany.com:443/myapp.php?foo=1&bar=2"),
        VECTOR_SIG_443
    );
    assert_eq!(
        with_port("http://mycompany.com:80/myapp.php?foo=1&bar=2"),
        VECTOR_SIG_HTTP_80
    );
    assert_eq!(
        with_port("http://mycompany.com:1234/myapp.php?foo=1&bar=2"),
        VECTOR_SIG_HTTP_1234
    );
    assert_eq!(
        twilio::sign(VECTOR_TOKEN, URL, DUPLICATES),
        VECTOR_SIG_DUPLICATES
    );
    let hashed = twilio::url_with_body_sha256(URL, JSON_BODY.as_bytes());
    assert_eq!(hashed, format!("{URL}&bodySHA256={JSON_HASH}"));
    assert_eq!(twilio::sign(VECTOR_TOKEN, &hashed, &[]), VECTOR_SIG_JSON);

    let v = verifier("https://mycompany.com");
    let hook = post(&v, PATH, &headers(&form(&SIG)), FORM_BODY).unwrap();
    assert_eq!(hook.provider(), "twilio");
    let mut sorted = PARAMS.to_vec();
    sorted.sort_unstable();
    let signed: String = sorted.iter().map(|(k, v)| format!("{k}{v}")).collect();
    assert_eq!(hook.event_id(), signed_key(&format!("{URL}{signed}")));
    assert_eq!(hook.secret_index(), Some(0));
    assert_eq!(hook.body().as_ref(), FORM_BODY.as_bytes());
    assert_eq!(v.signed_url(PATH), URL);
}

#[test]
fn port_variants_are_both_accepted() {
    // Signed with :443 while the base URL has no port, and the other way round.
    let v = verifier("https://mycompany.com");
    assert!(post(&v, PATH, &headers(&form(&SIG_443)), FORM_BODY).is_ok());
    let v = verifier("https://mycompany.com:443/");
    assert!(post(&v, PATH, &headers(&form(&SIG)), FORM_BODY).is_ok());
    assert!(post(&v, PATH, &headers(&form(&SIG_443)), FORM_BODY).is_ok());
    // http: the default port is 80; a non-default port is tried with and without.
    let v = verifier("http://mycompany.com");
    assert!(post(&v, PATH, &headers(&form(&SIG_HTTP_80)), FORM_BODY).is_ok());
    let v = verifier("http://mycompany.com:1234");
    assert!(post(&v, PATH, &headers(&form(&SIG_HTTP_1234)), FORM_BODY).is_ok());
    // A signature over another port is not one of the variants.
    let v = verifier("http://mycompany.com:8080");
    assert_eq!(
        post(&v, PATH, &headers(&form(&SIG_HTTP_1234)), FORM_BODY).unwrap_err(),
        VerifyError::SignatureMismatch
    );
}

#[test]
fn repeated_parameters_sort_by_value() {
    let v = verifier("https://mycompany.com");
    // Body order differs from the sorted order on purpose.
    let body = "Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234";
    let hook = post(&v, PATH, &headers(&form(&SIG_DUPLICATES)), body).unwrap();
    assert_eq!(
        hook.event_id(),
        signed_key(&format!("{URL}Digits1234Digits5678SidCA123SidAccountAC123"))
    );
    let swapped = "Digits=1234&Sid=CA123&Digits=5678&SidAccount=AC123";
    let again = post(&v, PATH, &headers(&form(&SIG_DUPLICATES)), swapped).unwrap();
    assert_eq!(again.event_id(), hook.event_id());
}

#[test]
fn json_body_is_covered_by_body_sha256() {
    let v = verifier("https://mycompany.com");
    let path = format!("{PATH}&bodySHA256={JSON_HASH}");
    let json = [
        ("x-twilio-signature", SIG_JSON.as_str()),
        ("content-type", "application/json"),
        ("i-twilio-idempotency-token", "idem-json-1"),
    ];
    let hook = post(&v, &path, &json, JSON_BODY).unwrap();
    // The key is the signed URL, whose bodySHA256 covers the body; not the unsigned token.
    assert_eq!(
        hook.event_id(),
        signed_key(&format!("https://mycompany.com{path}"))
    );
    assert_eq!(
        post(&v, &path, &json[..2], JSON_BODY).unwrap().event_id(),
        hook.event_id()
    );
    // Tampered body: the URL (and its signature) are genuine, the hash is not the body's.
    let tampered = JSON_BODY.replace("true", "false");
    assert_eq!(
        post(&v, &path, &json, &tampered).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    let body = r#"{"CallSid":"CA1","CallStatus":"completed"}"#;
    let url = twilio::url_with_body_sha256("https://mycompany.com/status", body.as_bytes());
    let sig = twilio::sign(TOKEN, &url, &[]);
    let path = url.strip_prefix("https://mycompany.com").unwrap();
    let hook = post(&v, path, &[("x-twilio-signature", &sig)], body).unwrap();
    assert_eq!(hook.event_id(), signed_key(&url));
    assert_eq!(hook.json().unwrap()["CallStatus"], "completed");
}

#[test]
fn each_status_callback_is_its_own_event_and_get_is_keyed_by_its_url() {
    let v = verifier("https://example.com");
    let status = |status: &str| {
        let params = [("MessageSid", "SM1"), ("MessageStatus", status)];
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter())
            .finish();
        let sig = twilio::sign(TOKEN, "https://example.com/sms", &params);
        post(&v, "/sms", &headers(&form(&sig)), &body)
            .unwrap()
            .event_id()
            .to_owned()
    };
    assert_ne!(status("sent"), status("delivered"));
    assert_eq!(status("sent"), status("sent"));
    // GET webhooks: the parameters are in the query, the signature covers the URL only.
    let url = "https://example.com/voice?CallSid=CA9&From=%2B1555";
    let sig = twilio::sign(TOKEN, url, &[]);
    let parts = request(
        "GET",
        "/voice?CallSid=CA9&From=%2B1555",
        &[("x-twilio-signature", &sig)],
    );
    let hook = v.verify(&parts, &Bytes::new(), now()).unwrap();
    assert_eq!(hook.event_id(), signed_key(url));
    // Twilio sends no body with a GET: one would be unsigned.
    assert!(matches!(
        v.verify(&parts, &Bytes::from_static(b"CallSid=CA9"), now()),
        Err(VerifyError::MalformedBody { .. })
    ));
}

/// An unauthenticated form body is refused by its parameter count before anything is decoded.
#[test]
fn form_parameters_are_capped() {
    let v = verifier("https://example.com");
    let at_cap = vec!["a=1"; twilio::MAX_FORM_PARAMS].join("&");
    let params = vec![("a", "1"); twilio::MAX_FORM_PARAMS];
    let sig = twilio::sign(TOKEN, "https://example.com/sms", &params);
    assert!(post(&v, "/sms", &headers(&form(&sig)), &at_cap).is_ok());
    let over = format!("{at_cap}&a=1");
    assert!(matches!(
        post(&v, "/sms", &headers(&form(&sig)), &over),
        Err(VerifyError::MalformedBody { .. })
    ));
}

#[test]
fn base_url_prefix_and_raw_path_are_signed_verbatim() {
    // The proxy strips `/tw`; the application sees `/a%20b?x=%27`.
    let v = TwilioVerifier::new("https://Example.com/tw/", [TOKEN]).unwrap();
    let url = "https://example.com/tw/a%20b?x=%27";
    assert_eq!(v.signed_url("/a%20b?x=%27"), url);
    let sig = twilio::sign(TOKEN, url, &[("CallSid", "CA1")]);
    assert!(post(&v, "/a%20b?x=%27", &headers(&form(&sig)), "CallSid=CA1").is_ok());
    // A decoded path is another URL.
    assert_eq!(
        post(&v, "/a%20b?x='", &headers(&form(&sig)), "CallSid=CA1").unwrap_err(),
        VerifyError::SignatureMismatch
    );
}

#[test]
fn rotation_reports_the_matching_token() {
    let v = TwilioVerifier::new("https://mycompany.com", ["new-auth-token", TOKEN]).unwrap();
    let hook = post(&v, PATH, &headers(&form(&SIG)), FORM_BODY).unwrap();
    assert_eq!(hook.secret_index(), Some(1));
}

#[test]
fn negative_cases() {
    let v = verifier("https://mycompany.com");
    let h = "x-twilio-signature";
    let good_list = form(&SIG);
    let good = headers(&good_list);
    let err =
        |list: &[(&str, &str)], path: &str, body: &str| post(&v, path, list, body).unwrap_err();
    assert_eq!(
        err(&[("content-type", FORM)], PATH, FORM_BODY),
        VerifyError::MissingHeader { name: h }
    );
    assert!(matches!(
        err(
            &[(h, "not base64!"), ("content-type", FORM)],
            PATH,
            FORM_BODY
        ),
        VerifyError::MalformedHeader { .. }
    ));
    assert_eq!(
        err(
            &[(h, &*SIG), (h, &*SIG), ("content-type", FORM)],
            PATH,
            FORM_BODY
        ),
        VerifyError::DuplicateHeader { name: h }
    );
    // Wrong token, tampered parameter, tampered query, another host.
    let wrong = TwilioVerifier::new(
        "https://mycompany.com",
        ["fedcba9876543210fedcba9876543210"],
    )
    .unwrap();
    assert_eq!(
        post(&wrong, PATH, &good, FORM_BODY).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    let tampered = FORM_BODY.replace("Digits=1234", "Digits=9999");
    assert_eq!(err(&good, PATH, &tampered), VerifyError::SignatureMismatch);
    let added = format!("{FORM_BODY}&Extra=1");
    assert_eq!(err(&good, PATH, &added), VerifyError::SignatureMismatch);
    assert_eq!(
        err(&good, "/myapp.php?foo=1&bar=3", FORM_BODY),
        VerifyError::SignatureMismatch
    );
    let other = verifier("https://attacker.example");
    assert_eq!(
        post(&other, PATH, &good, FORM_BODY).unwrap_err(),
        VerifyError::SignatureMismatch
    );
    // A JSON body without bodySHA256 is signed by nothing.
    assert!(matches!(
        err(
            &[(h, &*SIG), ("content-type", "application/json")],
            PATH,
            JSON_BODY
        ),
        VerifyError::MalformedBody { .. }
    ));
    // A bodySHA256 that is not hex cannot match any body.
    let path = format!("{PATH}&bodySHA256=zz");
    let sig = twilio::sign(TOKEN, &format!("https://mycompany.com{path}"), &[]);
    assert_eq!(
        err(
            &[(h, &sig), ("i-twilio-idempotency-token", "t")],
            &path,
            JSON_BODY
        ),
        VerifyError::SignatureMismatch
    );
    // Webhooks Rules sign with a shared key this verifier does not hold.
    let mut rule = good.clone();
    rule.push((
        "x-twilio-webhooks-signature-settings",
        "key=k1,algorithm=HMAC_SHA256",
    ));
    assert_eq!(
        err(&rule, PATH, FORM_BODY),
        VerifyError::UnsupportedVersion { name: h }
    );
    // No token configured.
    let empty = TwilioVerifier::new("https://mycompany.com", Vec::<String>::new()).unwrap();
    assert_eq!(
        post(&empty, PATH, &good, FORM_BODY).unwrap_err(),
        VerifyError::MissingConfiguration { what: "auth token" }
    );
}

#[test]
fn base_url_must_be_an_absolute_http_url() {
    for bad in [
        "",
        "not a url",
        "/relative",
        "ftp://example.com",
        "https://user:pass@example.com",
        "https://example.com/?q=1",
        "https://example.com/#frag",
        "mailto:ops@example.com",
    ] {
        assert!(
            matches!(
                TwilioVerifier::new(bad, [TOKEN]),
                Err(ConfigError::InvalidUrl { .. })
            ),
            "{bad:?}"
        );
    }
}

fn encode(params: &[(String, String)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params.iter())
        .finish()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn form_sign_then_verify_in_any_order_and_any_change_rejects(
        token in "[ -~]{8,40}",
        mut params in proptest::collection::vec(("[A-Za-z]{1,12}", ".{0,40}"), 1..12),
        rotate in 0usize..12,
        with_port in any::<bool>(),
        which in any::<prop::sample::Index>(),
        added_name in "[A-Za-z]{1,12}",
        added_value in ".{0,40}",
    ) {
        params.push(("CallSid".into(), "CA42".into()));
        let borrowed: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let url = if with_port { "https://hooks.example.com:443/in?x=1" } else { "https://hooks.example.com/in?x=1" };
        let sig = twilio::sign(&token, url, &borrowed);
        let len = params.len();
        params.rotate_left(rotate % len);
        let v = TwilioVerifier::new("https://hooks.example.com", [token.as_str()]).unwrap();
        let list = form(&sig);
        let hook = post(&v, "/in?x=1", &headers(&list), &encode(&params));
        prop_assert!(hook.is_ok(), "{:?}", hook.err());
        let i = which.index(params.len());
        // One value changed, one name changed (the case of its first letter), one parameter
        // dropped, one added: each changes what Twilio signs, so each is refused.
        let mut changed_value = params.clone();
        changed_value[i].1.push('!');
        let mut renamed = params.clone();
        let name = &mut renamed[i].0;
        let first = name.remove(0);
        let flipped = if first.is_ascii_uppercase() {
            first.to_ascii_lowercase()
        } else {
            first.to_ascii_uppercase()
        };
        name.insert(0, flipped);
        let mut dropped = params.clone();
        dropped.remove(i);
        let mut added = params.clone();
        added.insert(i, (added_name, added_value));
        for (change, tampered) in [
            ("value", changed_value),
            ("name", renamed),
            ("dropped", dropped),
            ("added", added),
        ] {
            prop_assert_eq!(
                post(&v, "/in?x=1", &headers(&list), &encode(&tampered)).err(),
                Some(VerifyError::SignatureMismatch),
                "{} {:?}",
                change,
                tampered
            );
        }
    }

    #[test]
    fn json_any_flip_rejects(body in ".{1,300}", flip in any::<prop::sample::Index>()) {
        let url = twilio::url_with_body_sha256("https://example.com/j", body.as_bytes());
        let sig = twilio::sign(TOKEN, &url, &[]);
        let path = url.strip_prefix("https://example.com").unwrap().to_owned();
        let v = verifier("https://example.com");
        let list = [("x-twilio-signature", sig.as_str()), ("i-twilio-idempotency-token", "t1")];
        let parts = request("POST", &path, &list);
        prop_assert!(v.verify(&parts, &Bytes::from(body.clone()), now()).is_ok());
        let mut tampered = body.into_bytes();
        let i = flip.index(tampered.len());
        tampered[i] ^= 0x01;
        prop_assert_eq!(
            v.verify(&parts, &Bytes::from(tampered), now()).unwrap_err(),
            VerifyError::SignatureMismatch
        );
    }

    #[test]
    fn arbitrary_requests_never_panic(
        path in "/[ -~]{0,80}",
        body in proptest::collection::vec(any::<u8>(), 0..300),
        sig in "[ -~]{0,60}",
        form_type in any::<bool>(),
    ) {
        let v = verifier("https://example.com");
        let mut list = vec![("x-twilio-signature", sig.as_str())];
        if form_type {
            list.push(("content-type", FORM));
        }
        let Ok(uri) = path.parse::<http::Uri>() else { return Ok(()); };
        let Ok(value) = http::HeaderValue::from_str(&sig) else { return Ok(()); };
        let mut parts = request("POST", "/", &[]);
        parts.uri = uri;
        parts.headers.insert("x-twilio-signature", value);
        if form_type {
            parts.headers.insert("content-type", http::HeaderValue::from_static(FORM));
        }
        let _ = list;
        prop_assert!(v.verify(&parts, &Bytes::from(body), now()).is_err());
    }
}

/// `sha256:<hex>` of `signed`, the key of a delivery whose signed string it is.
fn signed_key(signed: &str) -> String {
    use sha2::{Digest as _, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(signed.as_bytes())))
}

/// Twilio's signed string has no separators between names and values, so a body re-split
/// under one signature verifies: it must be the same event (one key), not a second one.
#[test]
fn re_split_parameters_under_one_signature_are_one_event() {
    let v = verifier("https://example.com");
    let params = [
        ("MessageSid", "SM1"),
        ("MessageStatus", "delivered"),
        ("SmsSid", "SM1"),
    ];
    let sig = twilio::sign(TOKEN, "https://example.com/sms", &params);
    let list = form(&sig);
    let genuine = "MessageSid=SM1&MessageStatus=delivered&SmsSid=SM1";
    let re_split = "MessageSid=SM1&MessageStatus=deliveredSmsSidSM1";
    let a = post(&v, "/sms", &headers(&list), genuine).unwrap();
    let b = post(&v, "/sms", &headers(&list), re_split).unwrap();
    assert_eq!(a.event_id(), b.event_id());
    assert_eq!(
        a.event_id(),
        signed_key("https://example.com/smsMessageSidSM1MessageStatusdeliveredSmsSidSM1")
    );
    // The unsigned idempotency token does not change the key: a relayed capture with a new
    // token is still the same event.
    let mut with_token = list.clone();
    with_token.push(("i-twilio-idempotency-token", "relayed-2".into()));
    let c = post(&v, "/sms", &headers(&with_token), genuine).unwrap();
    assert_eq!(c.event_id(), a.event_id());
}
