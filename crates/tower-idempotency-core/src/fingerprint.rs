//! Request fingerprints: the same key with a different request is answered `422`, never replayed.

use std::{fmt, sync::Arc};

use http::request::Parts;
use sha2::{Digest, Sha256};

use crate::store::Fingerprint;

type FingerprintFn = dyn Fn(&Parts, &[u8]) -> Fingerprint + Send + Sync;

/// What a fingerprint covers.
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
}

impl fmt::Debug for FingerprintMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request => f.write_str("Request"),
            Self::Body => f.write_str("Body"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl FingerprintMode {
    /// Computes the fingerprint of a request.
    pub fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Fingerprint {
        match self {
            Self::Request => {
                let path_and_query = crate::scope::request_uri(parts)
                    .path_and_query()
                    .map_or("/", |pq| pq.as_str());
                let mut hasher = Sha256::new();
                for part in [parts.method.as_str().as_bytes(), path_and_query.as_bytes()] {
                    hasher.update((part.len() as u64).to_be_bytes());
                    hasher.update(part);
                }
                hasher.update(body);
                Fingerprint(hasher.finalize().into())
            }
            Self::Body => Fingerprint(Sha256::digest(body).into()),
            Self::Custom(f) => f(parts, body),
        }
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
        let a = request.fingerprint(&parts("/o?x=1"), b"{}");
        assert_eq!(a, request.fingerprint(&parts("/o?x=1"), b"{}"));
        assert_ne!(a, request.fingerprint(&parts("/o?x=2"), b"{}"));
        assert_ne!(a, request.fingerprint(&parts("/o?x=1"), b"{ }"));
        let body = FingerprintMode::Body;
        assert_eq!(
            body.fingerprint(&parts("/o?x=1"), b"{}"),
            body.fingerprint(&parts("/o?x=2"), b"{}")
        );
    }
}
