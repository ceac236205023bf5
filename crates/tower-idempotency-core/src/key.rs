//! Where the idempotency key comes from: the client's `Idempotency-Key` header, or any other
//! [`KeySource`] such as a webhook provider's verified event id.

use bytes::Bytes;
use http::request::Parts;

use crate::{
    key_header::{parse_key, KeyError, IDEMPOTENCY_KEY},
    problem::{Problem, Rejection},
};

/// Derives the idempotency key of a request from its parts and its buffered body.
///
/// Implemented by [`ClientKey`] for the `Idempotency-Key` header, and by the webhook verifiers,
/// which check the signature over `body` before returning the provider's event id. A source may
/// insert request extensions (e.g. the verified delivery) through `parts`.
pub trait KeySource: Send + Sync + 'static {
    /// `Ok(Some(key))` to guard the request under `key`, `Ok(None)` to pass it through unguarded,
    /// `Err(problem)` to reject it before it reaches the handler or the store.
    fn derive(&self, parts: &mut Parts, body: &Bytes) -> Result<Option<String>, Problem>;
}

/// Takes the key from the client's `Idempotency-Key` header.
#[derive(Clone, Copy, Debug)]
pub struct ClientKey {
    required: bool,
}

impl ClientKey {
    /// A missing header is answered `400`.
    pub const fn required() -> Self {
        Self { required: true }
    }

    /// A missing header passes the request through unguarded.
    pub const fn optional() -> Self {
        Self { required: false }
    }

    /// Whether a missing header is rejected.
    pub const fn is_required(&self) -> bool {
        self.required
    }
}

impl KeySource for ClientKey {
    fn derive(&self, parts: &mut Parts, _body: &Bytes) -> Result<Option<String>, Problem> {
        let mut values = parts.headers.get_all(&IDEMPOTENCY_KEY).iter();
        let Some(value) = values.next() else {
            return if self.required {
                Err(Rejection::MissingKey.into())
            } else {
                Ok(None)
            };
        };
        if values.next().is_some() {
            return Err(Rejection::InvalidKey(KeyError::Repeated).into());
        }
        parse_key(value)
            .map(Some)
            .map_err(|e| Rejection::InvalidKey(e).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_header_is_rejected() {
        let (mut parts, ()) = http::Request::builder()
            .header("idempotency-key", "a")
            .header("idempotency-key", "b")
            .body(())
            .unwrap()
            .into_parts();
        let err = ClientKey::required()
            .derive(&mut parts, &Bytes::new())
            .unwrap_err();
        assert_eq!(err.slug, "invalid-key");
    }
}
