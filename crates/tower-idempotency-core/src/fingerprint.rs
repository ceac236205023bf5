//! Request fingerprints: the same key with a different request is answered `422`, never replayed.

use std::{fmt, sync::Arc};

use http::request::Parts;
use serde_json::Value;

use crate::store::Fingerprint;

type FingerprintFn = dyn Fn(&Parts, &[u8]) -> Fingerprint + Send + Sync;

/// What a fingerprint covers. The built-in modes hash with BLAKE3: as collision-resistant as
/// SHA-256 and several times faster on large bodies (the `fingerprint` group of the core's
/// `layer` bench compares the two).
#[derive(Clone, Default)]
pub enum FingerprintMode {
    /// Method, path and query (as the request arrived, before `Router::nest` stripped a
    /// prefix), and body (the default).
    #[default]
    Request,
    /// The body only, for senders whose URL carries volatile parameters.
    Body,
    /// A closure, e.g. hashing a canonical form of a JSON body.
    Custom(Arc<FingerprintFn>),
    /// Only the chosen fields of a JSON body; built by [`FingerprintMode::json_fields`].
    JsonFields(JsonPointers),
    /// A JSON body without the chosen fields; built by [`FingerprintMode::json_excluding`].
    JsonExcluding(JsonPointers),
}

impl fmt::Debug for FingerprintMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request => f.write_str("Request"),
            Self::Body => f.write_str("Body"),
            Self::Custom(_) => f.write_str("Custom(..)"),
            Self::JsonFields(pointers) => f.debug_tuple("JsonFields").field(pointers).finish(),
            Self::JsonExcluding(pointers) => {
                f.debug_tuple("JsonExcluding").field(pointers).finish()
            }
        }
    }
}

/// A sorted, deduplicated set of valid JSON Pointers (RFC 6901), as the JSON fingerprint modes
/// hold them. Built by [`FingerprintMode::json_fields`] and [`FingerprintMode::json_excluding`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonPointers(Arc<[String]>);

impl JsonPointers {
    /// # Panics
    /// If a pointer is neither empty nor starts with `/`, or has a `~` not followed by `0` or
    /// `1` (RFC 6901).
    fn new<I, P>(pointers: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        let mut pointers: Vec<String> = pointers.into_iter().map(Into::into).collect();
        for pointer in &pointers {
            assert!(
                is_valid_pointer(pointer),
                "not a JSON Pointer (RFC 6901): {pointer:?}"
            );
        }
        pointers.sort();
        pointers.dedup();
        Self(pointers.into())
    }

    /// The pointers, sorted.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

/// Why a request has no fingerprint. The layer answers it with a `400` problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// A JSON fingerprint mode was configured and the body is not a JSON document.
    #[error("request body is not JSON")]
    NotJson,
}

impl FingerprintMode {
    /// Fingerprints only the fields at these JSON Pointers (RFC 6901) of a JSON body, so a
    /// retry that changes anything else (a timestamp, a trace id) is still a replay. Key order
    /// and whitespace do not matter, inside the chosen fields either; a field that is absent
    /// differs from one that is `null`. The order of the pointers does not matter; `""` is the
    /// whole document. A body that is not JSON is answered `400`.
    ///
    /// Like [`Body`](Self::Body) it leaves out the query string (the scoped key covers the
    /// method and path).
    ///
    /// # Panics
    /// If a pointer is not a valid JSON Pointer (it must be empty or start with `/`, and `~`
    /// must be followed by `0` or `1`).
    ///
    /// ```
    /// use tower_idempotency_core::{FingerprintMode, IdempotencyLayer, MemoryStore};
    /// let layer = IdempotencyLayer::client_keys(MemoryStore::new())
    ///     .fingerprint(FingerprintMode::json_fields(["/amount", "/currency", "/customer/id"]));
    /// # let _ = layer;
    /// ```
    pub fn json_fields<I, P>(pointers: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        Self::JsonFields(JsonPointers::new(pointers))
    }

    /// Fingerprints a JSON body without the fields at these JSON Pointers (RFC 6901): a retry
    /// may change them and is still a replay; a change anywhere else is `422`. Key order and
    /// whitespace do not matter. An excluded array element counts as `null`, so the positions
    /// of the others do not shift. A body that is not JSON is answered `400`. Leaves out the
    /// query string, like [`json_fields`](Self::json_fields).
    ///
    /// # Panics
    /// If a pointer is not a valid JSON Pointer.
    ///
    /// ```
    /// use tower_idempotency_core::{FingerprintMode, IdempotencyLayer, MemoryStore};
    /// let layer = IdempotencyLayer::client_keys(MemoryStore::new())
    ///     .fingerprint(FingerprintMode::json_excluding(["/sent_at", "/meta/trace_id"]));
    /// # let _ = layer;
    /// ```
    pub fn json_excluding<I, P>(pointers: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        Self::JsonExcluding(JsonPointers::new(pointers))
    }

    /// Computes the fingerprint of a request; fails only in the JSON modes, for a body that is
    /// not JSON.
    pub fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Result<Fingerprint, FingerprintError> {
        Ok(match self {
            Self::Request => {
                let path_and_query = crate::scope::request_uri(parts)
                    .path_and_query()
                    .map_or("/", |pq| pq.as_str());
                let mut hasher = blake3::Hasher::new();
                for part in [parts.method.as_str().as_bytes(), path_and_query.as_bytes()] {
                    hasher.update(&(part.len() as u64).to_be_bytes());
                    hasher.update(part);
                }
                hasher.update(body);
                Fingerprint(*hasher.finalize().as_bytes())
            }
            Self::Body => Fingerprint(*blake3::hash(body).as_bytes()),
            Self::Custom(f) => f(parts, body),
            Self::JsonFields(pointers) => {
                let document = parse_json(body)?;
                let mut hasher = blake3::Hasher::new();
                hasher.update(b"json-fields");
                let mut canonical = Vec::new();
                for pointer in pointers.as_slice() {
                    hasher.update(&(pointer.len() as u64).to_be_bytes());
                    hasher.update(pointer.as_bytes());
                    match document.pointer(pointer) {
                        None => {
                            hasher.update(&[0]);
                        }
                        Some(value) => {
                            canonical.clear();
                            write_canonical(value, &mut canonical);
                            hasher.update(&[1]);
                            hasher.update(&(canonical.len() as u64).to_be_bytes());
                            hasher.update(&canonical);
                        }
                    }
                }
                Fingerprint(*hasher.finalize().as_bytes())
            }
            Self::JsonExcluding(pointers) => {
                let mut document = parse_json(body)?;
                for pointer in pointers.as_slice() {
                    remove_pointer(&mut document, pointer);
                }
                let mut hasher = blake3::Hasher::new();
                hasher.update(b"json-excluding");
                let mut canonical = Vec::with_capacity(body.len());
                write_canonical(&document, &mut canonical);
                hasher.update(&canonical);
                Fingerprint(*hasher.finalize().as_bytes())
            }
        })
    }
}

fn parse_json(body: &[u8]) -> Result<Value, FingerprintError> {
    serde_json::from_slice(body).map_err(|_| FingerprintError::NotJson)
}

fn is_valid_pointer(pointer: &str) -> bool {
    if pointer.is_empty() {
        return true;
    }
    pointer.starts_with('/')
        && pointer
            .split('~')
            .skip(1)
            .all(|after| after.starts_with(['0', '1']))
}

/// One reference token of a pointer, unescaped (`~1` is `/`, `~0` is `~`, in that order).
fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Removes the member a pointer names; an array element becomes `null`. The whole document
/// (`""`) becomes `null`. A pointer to nothing changes nothing.
fn remove_pointer(document: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        *document = Value::Null;
        return;
    };
    match document.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.remove(&unescape(last));
        }
        Some(Value::Array(items)) => {
            if let Some(item) = last.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                *item = Value::Null;
            }
        }
        _ => {}
    }
}

/// Writes `value` with object members sorted by key and no whitespace, whatever order the body
/// had them in (independent of serde_json's `preserve_order` feature).
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key).expect("writing to a Vec cannot fail");
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar).expect("writing to a Vec cannot fail"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str) -> Parts {
        http::Request::post(uri).body(()).unwrap().into_parts().0
    }

    #[test]
    fn request_mode_covers_query_and_body_body_mode_only_body() {
        let request = FingerprintMode::Request;
        let a = request.fingerprint(&parts("/o?x=1"), b"{}").unwrap();
        assert_eq!(a, request.fingerprint(&parts("/o?x=1"), b"{}").unwrap());
        assert_ne!(a, request.fingerprint(&parts("/o?x=2"), b"{}").unwrap());
        assert_ne!(a, request.fingerprint(&parts("/o?x=1"), b"{ }").unwrap());
        let body = FingerprintMode::Body;
        assert_eq!(
            body.fingerprint(&parts("/o?x=1"), b"{}").unwrap(),
            body.fingerprint(&parts("/o?x=2"), b"{}").unwrap()
        );
    }

    fn fp(mode: &FingerprintMode, body: &str) -> Fingerprint {
        mode.fingerprint(&parts("/o"), body.as_bytes()).unwrap()
    }

    #[test]
    fn json_fields_see_only_their_fields_in_canonical_form() {
        let mode = FingerprintMode::json_fields(["/b/y", "/a"]);
        let first = fp(
            &mode,
            r#"{"a":{"p":1,"q":[1,{"r":2,"s":3}]},"b":{"x":1,"y":"z"},"t":1}"#,
        );
        // Other member order at every depth, whitespace, other unchosen fields.
        let same = r#" { "t" : 9, "b":{"y":"z","x":7},
            "a":{"q":[1,{"s":3,"r":2}],"p":1} } "#;
        assert_eq!(first, fp(&mode, same));
        // Pointer order does not matter.
        assert_eq!(
            first,
            fp(&FingerprintMode::json_fields(["/a", "/b/y", "/a"]), same)
        );
        // A chosen field changed, or array order changed.
        assert_ne!(
            first,
            fp(
                &mode,
                r#"{"a":{"p":2,"q":[1,{"r":2,"s":3}]},"b":{"y":"z"}}"#
            )
        );
        assert_ne!(
            first,
            fp(
                &mode,
                r#"{"a":{"p":1,"q":[{"r":2,"s":3},1]},"b":{"y":"z"}}"#
            )
        );
        // Absent differs from null.
        let absent = fp(&mode, r#"{"b":{"y":"z"}}"#);
        assert_ne!(absent, fp(&mode, r#"{"a":null,"b":{"y":"z"}}"#));
        // A field's value cannot be confused with the next pointer's.
        let pair = FingerprintMode::json_fields(["/a", "/b"]);
        assert_ne!(
            fp(&pair, r#"{"a":"x","b":"y"}"#),
            fp(&pair, r#"{"a":"xy"}"#)
        );
    }

    #[test]
    fn json_excluding_ignores_the_excluded_fields_only() {
        let mode = FingerprintMode::json_excluding(["/sent_at", "/meta/trace~1id", "/items/1"]);
        let first = fp(
            &mode,
            r#"{"amount":5,"sent_at":"t1","meta":{"trace/id":"x","v":1},"items":[1,2,3]}"#,
        );
        assert_eq!(
            first,
            fp(
                &mode,
                r#"{"meta":{"v":1,"trace/id":"y"},"items":[1,9,3],"amount":5}"#
            ),
            "excluded fields changed or gone, members reordered"
        );
        assert_ne!(
            first,
            fp(
                &mode,
                r#"{"amount":6,"sent_at":"t1","meta":{"trace/id":"x","v":1},"items":[1,2,3]}"#
            )
        );
        assert_ne!(
            first,
            fp(&mode, r#"{"amount":5,"meta":{"v":1},"items":[1,2,4]}"#),
            "an unexcluded array element changed"
        );
        assert_ne!(
            first,
            fp(&mode, r#"{"amount":5,"meta":{"v":1},"items":[1,3]}"#),
            "the positions of the other elements count"
        );
    }

    #[test]
    fn a_body_that_is_not_json_has_no_json_fingerprint() {
        for mode in [
            FingerprintMode::json_fields(["/a"]),
            FingerprintMode::json_excluding(["/a"]),
        ] {
            for body in [&b""[..], b"a=1&b=2", b"{\"a\":1", b"\xff\xfe"] {
                assert_eq!(
                    mode.fingerprint(&parts("/o"), body),
                    Err(FingerprintError::NotJson)
                );
            }
        }
        // The other modes take any body.
        assert!(FingerprintMode::Body
            .fingerprint(&parts("/o"), b"a=1")
            .is_ok());
    }

    #[test]
    fn pointers_are_validated() {
        for valid in ["", "/", "/a/0", "/a~0b/c~1d"] {
            assert!(is_valid_pointer(valid), "{valid:?}");
        }
        for invalid in ["a", "a/b", "/a~", "/a~2"] {
            assert!(!is_valid_pointer(invalid), "{invalid:?}");
            let built = std::panic::catch_unwind(|| FingerprintMode::json_fields([invalid]));
            assert!(built.is_err(), "{invalid:?} must be refused");
        }
    }
}
