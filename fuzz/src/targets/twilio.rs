//! Twilio: the URL and form parameters the signature covers.

use bytes::Bytes;
use tower_idempotency_webhooks::{__fuzz, twilio as provider, Verifier};

use crate::{check, fields, now, parts, SECRET, TWILIO_BASE};

/// Twilio: path-and-query, signature, flags lines, then the body.
pub fn twilio(data: &[u8]) {
    let [path, signature, flags, body] = fields(data);
    let flags = flags.first().copied().unwrap_or(0);
    let form = flags & 1 == 1;
    let token = flags & 2 == 2;
    let verifier = provider::TwilioVerifier::new(TWILIO_BASE, [SECRET]).expect("valid URL");
    let sorted = __fuzz::twilio_sorted_params(body);
    assert!(sorted.windows(2).all(|w| w[0] <= w[1]));
    let Some(pq) = path_and_query(path) else {
        return;
    };
    let bytes = Bytes::copy_from_slice(body);
    let mut headers: Vec<(&'static str, &[u8])> = vec![("x-twilio-signature", signature)];
    if form {
        headers.push(("content-type", b"application/x-www-form-urlencoded"));
    }
    if token {
        headers.push(("i-twilio-idempotency-token", b"fuzz-token"));
    }
    if let Some(p) = parts(&pq, &headers) {
        check::outcome(&verifier.verify(&p, &bytes, now()), body);
    }
    let url = format!("{TWILIO_BASE}{pq}");
    if form && !pq.contains("bodySHA256") {
        // Self-signed: the form parameters as the verifier parses them, over the URL it rebuilds.
        let params: Vec<(&str, &str)> = sorted
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let signed = provider::sign(SECRET, &url, &params);
        headers[0] = ("x-twilio-signature", signed.as_bytes());
        let p = parts(&pq, &headers).expect("valid headers");
        check::signed(&verifier.verify(&p, &bytes, now()), body);
    }
    self_signed_json(&verifier, &url, &pq, body);
}

/// The fuzzed path (given a leading `/`) as a request's path and query.
fn path_and_query(path: &[u8]) -> Option<String> {
    let path = std::str::from_utf8(path).ok()?;
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let uri = path.parse::<http::Uri>().ok()?;
    uri.path_and_query().map(|pq| pq.as_str().to_owned())
}

/// Self-signed JSON: the `bodySHA256` URL.
fn self_signed_json(verifier: &provider::TwilioVerifier, url: &str, pq: &str, body: &[u8]) {
    let hashed = provider::url_with_body_sha256(url, body);
    let signed = provider::sign(SECRET, &hashed, &[]);
    let hashed_pq = &hashed[TWILIO_BASE.len()..];
    if hashed_pq.parse::<http::Uri>().is_ok() && !pq.contains("bodySHA256") {
        let p = parts(
            hashed_pq,
            &[
                ("x-twilio-signature", signed.as_bytes()),
                ("i-twilio-idempotency-token", b"fuzz-token"),
            ],
        )
        .expect("valid headers");
        let result = verifier.verify(&p, &Bytes::copy_from_slice(body), now());
        check::signed(&result, body);
    }
}
