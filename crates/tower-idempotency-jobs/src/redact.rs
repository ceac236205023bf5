//! Redaction: what an operator is shown of a stored request (headers, body, URLs), for the
//! inbox's and the outbox's pages and JSON routes alike.

/// Header and body field names whose values an operator is never shown: a name containing one
/// of these (ASCII case-insensitive) is redacted.
const SECRET_NAME_PARTS: [&str; 14] = [
    "authorization",
    "cookie",
    "signature",
    "secret",
    "token",
    "hmac",
    "api-key",
    "api_key",
    "apikey",
    "auth-key",
    "password",
    "passwd",
    "session",
    "credential",
];

/// What a redacted header's value reads.
pub const REDACTED: &str = "[redacted]";

/// What a masked query value or fragment of a shown URL reads.
pub const MASKED: &str = "***";

/// Whether a header or body field `name` looks like a credential's: it contains (ASCII
/// case-insensitive) `authorization`, `cookie`, `signature`, `secret`, `token`, `hmac`,
/// `api-key`, `api_key`, `apikey`, `auth-key`, `password`, `passwd`, `session` or `credential`.
pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_NAME_PARTS.iter().any(|part| lower.contains(part))
}

/// `value`, or [`REDACTED`] when the header `name` looks like a credential's
/// ([`is_secret_name`]); an `http(s)` URL value as [`redact_url`] shows it. The rule of
/// the inbox's events and the outbox's messages as an operator is shown them.
pub fn redact(name: &str, value: String) -> String {
    if is_secret_name(name) {
        REDACTED.to_owned()
    } else {
        redact_url_text(value)
    }
}

/// A URL as an operator is shown it: without user-info, each query value and the fragment
/// [`MASKED`] (names stay), parsed by the `url` crate. Text that is not an absolute URL reads
/// [`REDACTED`]: it cannot be told apart from a credential.
///
/// ```
/// use tower_idempotency_jobs::redact::redact_url;
///
/// assert_eq!(
///     redact_url("https://user:pass@api.example.com/hook?token=abc&mode=live#sig"),
///     "https://api.example.com/hook?token=***&mode=***#***"
/// );
/// assert_eq!(redact_url("https://api.example.com/hook"), "https://api.example.com/hook");
/// ```
pub fn redact_url(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(url) => masked_url(url),
        Err(_) => REDACTED.to_owned(),
    }
}

fn masked_url(mut url: url::Url) -> String {
    if url.cannot_be_a_base() {
        // `mailto:`, `data:`, ...: nothing of a host, user-info or path to keep apart.
        return REDACTED.to_owned();
    }
    // Both succeed on a URL that can be a base.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    if url.query().is_some() {
        let pairs: Vec<(String, &str)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if value.is_empty() { "" } else { MASKED };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    if url.fragment().is_some_and(|fragment| !fragment.is_empty()) {
        url.set_fragment(Some(MASKED));
    }
    url.to_string()
}

/// `text` as [`redact_url`] shows it when it is an `http(s)` URL carrying user-info, a query or
/// a fragment; else unchanged.
fn redact_url_text(text: String) -> String {
    let lower = text.get(..8).unwrap_or(&text).to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return text;
    }
    match url::Url::parse(text.trim()) {
        Ok(url)
            if !url.username().is_empty()
                || url.password().is_some()
                || url.query().is_some()
                || url.fragment().is_some() =>
        {
            masked_url(url)
        }
        Ok(_) => text,
        Err(_) => REDACTED.to_owned(),
    }
}

/// Masks a JSON value for an operator: the string or number of a field whose name looks like a
/// credential's ([`is_secret_name`]) reads [`REDACTED`] (an object or array under such a name
/// is masked field by field: Mailgun's `signature` object keeps its `timestamp`), and a URL
/// string reads as [`redact_url`] shows it. Answers whether anything changed.
fn redact_json(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Object(fields) => {
            let mut changed = false;
            for (name, field) in fields.iter_mut() {
                match field {
                    Value::String(_) | Value::Number(_) if is_secret_name(name) => {
                        *field = Value::String(REDACTED.to_owned());
                        changed = true;
                    }
                    _ => changed |= redact_json(field),
                }
            }
            changed
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, item| redact_json(item) | changed),
        Value::String(text) => {
            let shown = redact_url_text(text.clone());
            let changed = shown != *text;
            *text = shown;
            changed
        }
        _ => false,
    }
}

/// A body as an operator is shown it: as text, and pretty-printed when it is JSON, with
/// credential fields and URLs masked: a field whose name looks like a credential's
/// ([`is_secret_name`]) reads [`REDACTED`], a URL as [`redact_url`] shows it. A JSON body that
/// needed masking is shown re-serialized.
pub fn shown_body(body: &[u8]) -> (String, Option<String>) {
    let Ok(mut json) = serde_json::from_slice::<serde_json::Value>(body) else {
        return (String::from_utf8_lossy(body).into_owned(), None);
    };
    let changed = redact_json(&mut json);
    let pretty = serde_json::to_string_pretty(&json).ok();
    let text = if changed {
        json.to_string()
    } else {
        String::from_utf8_lossy(body).into_owned()
    };
    (text, pretty)
}

/// An attempt as an operator is shown it: its answer masked as [`shown_body`] masks a body (a
/// JSON answer's credential fields; an answer cut short of valid JSON is shown as text).
pub fn shown_attempt(mut attempt: crate::Attempt) -> crate::Attempt {
    attempt.response = attempt
        .response
        .map(|response| shown_body(response.as_bytes()).0);
    attempt
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_headers_are_redacted() {
        assert_eq!(redact("Stripe-Signature", "t=1,v1=ab".into()), REDACTED);
        assert_eq!(redact("x-api-key", "k".into()), REDACTED);
        assert_eq!(
            redact("content-type", "application/json".into()),
            "application/json"
        );
    }

    #[test]
    fn credential_names_are_redacted_whatever_their_case() {
        for name in [
            "apikey",
            "X-ApiKey",
            "api_key",
            "x-api-key",
            "Password",
            "x-session-id",
            "X-Auth-Key",
            "cookie",
            "Set-Cookie",
            "Proxy-Authorization",
            "x-amz-security-token",
            "X-Shopify-Hmac-Sha256",
            "client_secret",
            "X-Hub-Signature-256",
            "x-client-credential",
        ] {
            assert_eq!(redact(name, "v".into()), REDACTED, "{name}");
        }
        for name in [
            "content-type",
            "x-github-event",
            "user-agent",
            "x-request-id",
        ] {
            assert_eq!(redact(name, "v".into()), "v", "{name}");
        }
    }

    #[test]
    fn urls_lose_their_user_info_and_query_values() {
        assert_eq!(
            redact_url("https://user:pa%20ss@api.example.com:8443/hook?token=a%26b&flag&x=1#frag"),
            "https://api.example.com:8443/hook?token=***&flag=&x=***#***"
        );
        assert_eq!(redact_url("http://token@h.example/p"), "http://h.example/p");
        assert_eq!(redact_url("https://h.example/p/q"), "https://h.example/p/q");
        // Not an absolute URL, or nothing but an opaque payload: nothing of it is shown.
        for text in [
            "not a url",
            "/relative?token=x",
            "mailto:someone@example.com",
        ] {
            assert_eq!(redact_url(text), REDACTED, "{text}");
        }
        // A header value that is a URL is shown as one; other values stay whole.
        assert_eq!(
            redact("referer", "https://u:p@h.example/?code=1".into()),
            "https://h.example/?code=***"
        );
        assert_eq!(
            redact("referer", "https://h.example/a".into()),
            "https://h.example/a"
        );
        assert_eq!(redact("x-note", "see https:".into()), "see https:");
    }

    #[test]
    fn mailgun_signature_fields_and_body_urls_are_masked() {
        let body = serde_json::json!({
            "signature": {"timestamp": "1700000000", "token": "tok", "signature": "ab12"},
            "event-data": {
                "id": "e1",
                "client_secret": 42,
                "tokens": ["kept: an array under a credential name is masked field by field"],
                "links": [{"href": "https://u:p@h.example/x?k=v"}, "https://h.example/plain"],
            },
        });
        let (text, pretty) = shown_body(body.to_string().as_bytes());
        let shown: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            shown,
            serde_json::json!({
                "signature": {"timestamp": "1700000000", "token": REDACTED, "signature": REDACTED},
                "event-data": {
                    "id": "e1",
                    "client_secret": REDACTED,
                    "tokens": ["kept: an array under a credential name is masked field by field"],
                    "links": [{"href": "https://h.example/x?k=***"}, "https://h.example/plain"],
                },
            })
        );
        assert_eq!(pretty, serde_json::to_string_pretty(&shown).ok());
        // A body with nothing to mask is shown as it came; one that is not JSON as text.
        let plain = br#"{"b": 1,  "a": "x"}"#;
        assert_eq!(shown_body(plain).0, r#"{"b": 1,  "a": "x"}"#);
        assert_eq!(shown_body(b"token=abc"), ("token=abc".to_owned(), None));
    }
}
