//! Reading a delivery's JSON body with serde_json: the few fields a verifier needs (the event
//! id, a signed timestamp, a challenge), and the whole document for handlers.
//!
//! Verifiers read fields with [`fields_until`], which stops once it has what it needs: on a
//! large body the id usually comes first, and skipping the rest costs more than the HMAC
//! (`cargo bench --bench ratios`, `stripe_id_first` against `stripe_id_last`). The first of
//! repeated keys wins, in the fields and in [`parse`]'s document alike, so the id a
//! delivery is keyed by and the document the handler reads never disagree.

use serde::de::DeserializeSeed as _;

use crate::error::VerifyError;

mod document;
mod seed;

/// Parses the body as JSON, keeping the first of repeated object keys as [`fields`] does
/// (serde_json's own `Value` keeps the last), so the id a delivery is keyed by and the document
/// the handler reads never disagree.
pub(crate) fn parse(body: &[u8]) -> Result<serde_json::Value, VerifyError> {
    document(body).map_err(|_| VerifyError::BodyNotJson)
}

/// [`parse`], with serde_json's error.
pub(crate) fn document(body: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    document::Document
        .deserialize(&mut de)
        .and_then(|value| de.end().map(|()| value))
}

/// A scalar read by [`fields`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Scalar {
    /// A string.
    Str(String),
    /// A non-negative integer.
    U64(u64),
    /// A negative integer.
    I64(i64),
    /// A number with a fraction or an exponent, as the bits of the `f64` serde_json read.
    Float(u64),
    /// Anything else (bool, null, object, array).
    Other,
}

impl Scalar {
    #[cfg(any(
        feature = "stripe",
        feature = "slack",
        feature = "zoom",
        feature = "mailgun"
    ))]
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    #[cfg(feature = "discord")]
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            Self::U64(n) => Some(*n),
            _ => None,
        }
    }

    /// A non-negative integer, also when written with a fraction or an exponent
    /// (`1700000000000.0`, `17e11`), as long as the value is whole and exact in an `f64`.
    #[cfg(feature = "linear")]
    pub(crate) fn as_whole(&self) -> Option<u64> {
        const EXACT: f64 = (1u64 << f64::MANTISSA_DIGITS) as f64;
        match self {
            Self::U64(n) => Some(*n),
            Self::Float(bits) => {
                let v = f64::from_bits(*bits);
                // `as` is exact here: a whole value in 0..2^53.
                ((0.0..EXACT).contains(&v) && v.fract() == 0.0).then_some(v as u64)
            }
            _ => None,
        }
    }
}

/// Reads the scalars at `pointers` (object keys only, e.g. `/event-data/id`) from the JSON
/// `body` in one pass, without building the document. Handlers that want the document parse
/// it lazily ([`VerifiedWebhook::json`](crate::VerifiedWebhook::json)).
///
/// Parsing stops as soon as every pointer was found, so only the body up to the last needed
/// field is validated (the body is authenticated; a later syntax error surfaces in `json()`),
/// and the first of repeated keys wins. A body that ends before all are found must be one
/// complete JSON document, else [`VerifyError::BodyNotJson`].
pub(crate) fn fields<const N: usize>(
    body: &[u8],
    pointers: [&str; N],
) -> Result<Fields<N>, VerifyError> {
    fields_until(body, pointers, |found| found.iter().all(Option::is_some))
}

/// [`fields`], stopping as soon as `done` holds for what was found so far (for fields
/// that are only needed depending on others).
///
/// serde_json drives a visitor ([`seed::Seed`]) that records the values at the pointers and
/// skips everything else with `IgnoredAny`. To stop early the visitor returns in the middle of
/// an object; serde_json then fails the enclosing parse with its own syntax error (none when
/// the field was the object's last member), which is read as success because the visitor says
/// it stopped. (An error of our own would format a message on every delivery.)
pub(crate) fn fields_until<const N: usize>(
    body: &[u8],
    pointers: [&str; N],
    done: impl Fn(&[Option<Scalar>]) -> bool,
) -> Result<Fields<N>, VerifyError> {
    const {
        assert!(
            N >= 1 && N <= 32,
            "fields reads 1 to 32 pointers (a u32 bit set)"
        )
    };
    let paths = pointers.map(seed::Path::new);
    let mut out: Fields<N> = std::array::from_fn(|_| None);
    let stopped = std::cell::Cell::new(false);
    let mut de = serde_json::Deserializer::from_slice(body);
    let result = seed::Seed {
        depth: 0,
        paths: &paths,
        candidates: u32::MAX >> (32 - N),
        out: &mut out,
        done: &done,
        stopped: &stopped,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match result {
        Ok(()) => Ok(out),
        Err(_) if stopped.get() => Ok(out),
        Err(_) => Err(VerifyError::BodyNotJson),
    }
}

/// What [`fields`] reads: one value per pointer.
pub(crate) type Fields<const N: usize> = [Option<Scalar>; N];

/// only (no segment that could index an array, no `~` escape), at most four deep.
pub(crate) fn scannable_pointer(pointer: &str) -> bool {
    let Some(rest) = pointer.strip_prefix('/') else {
        return false;
    };
    let mut depth = 0;
    rest.split('/').all(|segment| {
        depth += 1;
        let index = !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit());
        depth <= seed::MAX_DEPTH && !index && !segment.contains('~')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields_agree_with_value_pointers() {
        let body = br#"{"id":"evt_1","n":-3,"big":18446744073709551615,"f":1.5,"deep":{"a":{"b":"x\"y"}},
            "arr":[{"id":"no"}],"dup":"first","dup":"last","esc\u0061ped":"k","deep":{"a":{"c":1}}}"#;
        // `/none` is never found, so the whole body is read.
        let [id, n, big, f, b, c, dup, escaped, missing, arr] = fields(
            body,
            [
                "/id",
                "/n",
                "/big",
                "/f",
                "/deep/a/b",
                "/deep/a/c",
                "/dup",
                "/escaped",
                "/none",
                "/arr",
            ],
        )
        .unwrap();
        let value: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(id, Some(Scalar::Str("evt_1".into())));
        assert_eq!(n, Some(Scalar::I64(-3)));
        assert_eq!(big, Some(Scalar::U64(u64::MAX)));
        assert_eq!(f, Some(Scalar::Float(1.5f64.to_bits())));
        // Fields of repeated objects are all seen; the first of repeated keys wins (a Value keeps
        // the last: the signed body is the provider's, which does not repeat keys).
        assert_eq!(value.pointer("/deep/a/b"), None);
        assert_eq!(b, Some(Scalar::Str("x\"y".into())));
        assert_eq!(c, Some(Scalar::U64(1)));
        assert_eq!(dup, Some(Scalar::Str("first".into())));
        assert_eq!(value["dup"], "last");
        // The document handed to handlers reads repeated keys as the field reader does.
        let document = parse(body).unwrap();
        assert_eq!(document["dup"], "first");
        assert_eq!(document.pointer("/deep/a/b"), Some(&"x\"y".into()));
        assert_eq!(document.pointer("/deep/a/c"), Some(&1.into()));
        assert_eq!(escaped, Some(Scalar::Str("k".into())));
        assert_eq!(missing, None);
        assert_eq!(arr, Some(Scalar::Other));
        for bad in [&b"{"[..], b"{} x", b"", b"{\"a\":}", b"nul"] {
            assert_eq!(fields(bad, ["/a"]), Err(VerifyError::BodyNotJson));
        }
        assert_eq!(fields(b" [1] ", ["/a"]).unwrap(), [None]);
        // Found everything: the rest is not parsed.
        let [a] = fields(br#"{"a":"x","b":[1,2"#, ["/a"]).unwrap();
        assert_eq!(a, Some(Scalar::Str("x".into())));
        let [a, b] = fields_until(br#"{"a":"x","b":{"c":1}} trailing"#, ["/a", "/b/c"], |f| {
            f[0].as_ref().and_then(Scalar::as_str) == Some("x")
        })
        .unwrap();
        assert_eq!((a.is_some(), b), (true, None));
        assert_eq!(
            fields(br#"{"b":1} x"#, ["/a"]),
            Err(VerifyError::BodyNotJson)
        );
        // Skipped values are walked without recursion: deep nesting cannot overflow the stack.
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(
            fields(deep.as_bytes(), ["/a"]).unwrap(),
            [Some(Scalar::Other)]
        );
    }
}
