//! What happens to a key after the handler answered: complete it (cache and replay the response)
//! or release it (let a corrected retry run the handler again).

use std::{fmt, sync::Arc};

use http::{header, HeaderMap, HeaderName, StatusCode};

/// A handler's per-response override of the [`CachePolicy`]: insert it into the response
/// extensions.
///
/// In Axum, return `(Extension(CacheDirective::Complete), response)` from the handler.
///
/// ```
/// use tower_idempotency_core::CacheDirective;
///
/// // A declined card is final: replay the 402 to every retry instead of charging again.
/// let mut response = http::Response::new(());
/// *response.status_mut() = http::StatusCode::PAYMENT_REQUIRED;
/// response.extensions_mut().insert(CacheDirective::Complete);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheDirective {
    /// Complete the key with this response, whatever its status.
    Complete,
    /// Release the key, whatever its status.
    Release,
}

type StatusPredicate = dyn Fn(StatusCode) -> bool + Send + Sync;

/// Decides by status whether a response completes the key.
#[derive(Clone)]
pub struct CachePolicy(Arc<StatusPredicate>);

impl fmt::Debug for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CachePolicy(..)")
    }
}

impl Default for CachePolicy {
    fn default() -> Self {
        Self::successful()
    }
}

impl CachePolicy {
    /// Complete on 2xx; release on anything else (the default).
    pub fn successful() -> Self {
        Self(Arc::new(|status| status.is_success()))
    }

    /// Complete on every status once the handler ran (Stripe's behaviour for its own API).
    pub fn always() -> Self {
        Self(Arc::new(|_| true))
    }

    /// Complete when `predicate` returns true.
    pub fn when(predicate: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(predicate))
    }

    /// The decision for a response, honouring a [`CacheDirective`] it carries.
    pub fn completes(&self, status: StatusCode, directive: Option<CacheDirective>) -> bool {
        match directive {
            Some(CacheDirective::Complete) => true,
            Some(CacheDirective::Release) => false,
            None => (self.0)(status),
        }
    }
}

/// Headers never stored or replayed: hop-by-hop headers (RFC 9110 section 7.6.1), `Date` (a
/// replay gets its own), `Content-Length` (recomputed), and credentials (`Set-Cookie`,
/// `Authorization`, `Proxy-Authorization`), which must never leak to a second caller.
pub const UNCACHED_HEADERS: [HeaderName; 12] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::DATE,
    header::CONTENT_LENGTH,
    header::SET_COOKIE,
    header::AUTHORIZATION,
    HeaderName::from_static("keep-alive"),
];

/// The subset of `headers` worth replaying.
pub fn cacheable_headers(headers: &HeaderMap) -> HeaderMap {
    // Headers the response itself declared hop-by-hop via `Connection`; almost never present.
    let declared: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|list| list.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    // Copying the kept entries is cheaper than cloning the map and removing twelve names from it
    // (one hash lookup each), which showed up in the profile of every first request.
    // Room for what a replay adds (`Idempotent-Replayed`, and hyper's `Content-Length`, `Date`):
    // a map cloned from an exactly-sized one would otherwise grow (two allocations) per replay.
    let mut kept = HeaderMap::with_capacity(headers.len() + 4);
    for (name, value) in headers {
        if !UNCACHED_HEADERS.contains(name) && !declared.contains(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_completes_2xx_and_directives_override() {
        let policy = CachePolicy::default();
        assert!(policy.completes(StatusCode::CREATED, None));
        assert!(!policy.completes(StatusCode::BAD_REQUEST, None));
        assert!(policy.completes(StatusCode::BAD_REQUEST, Some(CacheDirective::Complete)));
        assert!(!policy.completes(StatusCode::OK, Some(CacheDirective::Release)));
        assert!(CachePolicy::always().completes(StatusCode::INTERNAL_SERVER_ERROR, None));
    }

    #[test]
    fn credentials_and_hop_by_hop_headers_are_not_cached() {
        let mut headers = HeaderMap::new();
        headers.insert("set-cookie", "session=secret".parse().unwrap());
        headers.insert("authorization", "Bearer x".parse().unwrap());
        headers.insert("date", "Mon, 30 Nov 2026 00:00:00 GMT".parse().unwrap());
        headers.insert("connection", "x-hop".parse().unwrap());
        headers.insert("x-hop", "1".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        headers.insert("location", "/orders/1".parse().unwrap());
        headers.append("link", "</a>; rel=a".parse().unwrap());
        headers.append("link", "</b>; rel=b".parse().unwrap());
        let kept = cacheable_headers(&headers);
        let names: Vec<_> = kept.keys().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(kept.contains_key("content-type") && kept.contains_key("location"));
        let links: Vec<_> = kept.get_all("link").iter().collect();
        assert_eq!(
            links,
            ["</a>; rel=a", "</b>; rel=b"],
            "every value of a repeated header"
        );
    }
}
