//! Scoping: the key a store sees is built from a namespace, the method, the path, an optional
//! principal and the client's key, so equal keys from two tenants or two endpoints never collide.
//! The path is the one the request arrived with, before `Router::nest` stripped a prefix; with
//! [`RouteScope::MatchedPath`] the route template and no method take their place.

use std::{fmt, sync::Arc};

use http::request::Parts;
use sha2::{Digest, Sha256};

/// The authenticated caller, inserted as a request extension by the application's auth layer.
///
/// When present, it becomes part of every scoped key, so one tenant can never receive another
/// tenant's cached response even when both send the same `Idempotency-Key`.
///
/// ```
/// use tower_idempotency_core::Principal;
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Principal::new("tenant-42"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Principal(String);

impl Principal {
    /// A principal from any stable identifier (tenant id, user id, API key id).
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The identifier.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Principal {
    // Principals can be account identifiers; keep them out of debug logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Principal(..)")
    }
}

type PrincipalFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Where the principal of a request comes from.
#[derive(Clone, Default)]
pub enum PrincipalSource {
    /// The [`Principal`] request extension, when the auth layer set one (the default).
    #[default]
    Extension,
    /// A closure over the request parts (e.g. reading a tenant header your gateway sets).
    Custom(Arc<PrincipalFn>),
    /// Never scope by principal.
    Disabled,
}

impl fmt::Debug for PrincipalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Extension => f.write_str("Extension"),
            Self::Custom(_) => f.write_str("Custom(..)"),
            Self::Disabled => f.write_str("Disabled"),
        }
    }
}

impl PrincipalSource {
    fn principal(&self, parts: &Parts) -> Option<String> {
        match self {
            Self::Extension => parts.extensions.get::<Principal>().map(|p| p.0.clone()),
            Self::Custom(f) => f(parts),
            Self::Disabled => None,
        }
    }
}

/// Which part of the request's route scopes its keys, besides the namespace and principal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteScope {
    /// The method and the path the request arrived with (the default): `POST /orders` and
    /// `PATCH /orders/1` never share a record.
    #[default]
    MethodAndPath,
    /// The route template axum matched ([`MatchedPath`](axum::extract::MatchedPath), e.g.
    /// `/hooks/{account}`), not the method: every spelling of one route (`/hooks/acct_%31` and
    /// `/hooks/acct_1`) and every method shares one record per key. Requests without a
    /// `MatchedPath` (outside an axum `Router`) use the path they arrived with. For keys that
    /// name one event whatever the request looks like: verified webhook event ids.
    MatchedPath,
}

/// Builds scoped store keys: `{namespace}:{hex(sha256(method, path, principal, key))}`
/// (with [`RouteScope::MatchedPath`], `sha256("*", route template, principal, key)`).
#[derive(Clone, Debug)]
pub struct Scope {
    namespace: String,
    principal: PrincipalSource,
    route: RouteScope,
}

/// Longest accepted namespace, so scoped keys stay at most 320 bytes.
pub const MAX_NAMESPACE_LEN: usize = 255;

impl Scope {
    /// A scope with the given namespace and principal source.
    ///
    /// # Panics
    /// If the namespace is empty, longer than 255 bytes, or contains anything but ASCII letters,
    /// digits, `-`, `_` and `.` (it becomes part of database and Redis keys).
    pub fn new(namespace: impl Into<String>, principal: PrincipalSource) -> Self {
        let namespace = namespace.into();
        assert!(
            is_valid_namespace(&namespace),
            "idempotency namespace must be 1..=255 bytes of [A-Za-z0-9._-]"
        );
        Self {
            namespace,
            principal,
            route: RouteScope::default(),
        }
    }

    /// This scope with `route` deciding which part of the route scopes keys.
    pub fn route(mut self, route: RouteScope) -> Self {
        self.route = route;
        self
    }

    /// Which part of the route scopes keys.
    pub fn route_scope(&self) -> RouteScope {
        self.route
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Where the principal comes from.
    pub fn principal_source(&self) -> &PrincipalSource {
        &self.principal
    }

    /// Whether the principal source finds a principal on this request.
    pub fn has_principal(&self, parts: &Parts) -> bool {
        self.principal.principal(parts).is_some()
    }

    /// The scoped store key for `key` on this request.
    ///
    /// Each part is length-prefixed before hashing, so no choice of path and key can produce the
    /// same input as another; hashing bounds the length and keeps the raw key out of the store.
    pub fn store_key(&self, parts: &Parts, key: &str) -> String {
        let principal = self.principal.principal(parts);
        let (method, path) = match self.route {
            RouteScope::MethodAndPath => (parts.method.as_str(), request_uri(parts).path()),
            // `*` is no method name, so these keys never equal a method-scoped one.
            RouteScope::MatchedPath => (
                "*",
                parts
                    .extensions
                    .get::<axum::extract::MatchedPath>()
                    .map_or_else(|| request_uri(parts).path(), |matched| matched.as_str()),
            ),
        };
        store_key_from_parts(&self.namespace, method, path, principal.as_deref(), key)
    }
}

/// The scoped store key built from its parts, without a request: what the layer's
/// [`Scope::store_key`] computes for a request with this method, path (without the query;
/// before `Router::nest` stripped a prefix), principal and client key (or provider event id).
/// Operators use it to find a request's record (`tower-idempotency inspect`).
///
/// The result is `{namespace}:{hex(sha256(...))}`: each of method, path, principal and key is
/// length-prefixed before hashing, then a byte telling whether a principal was present, so an
/// absent principal and an empty one differ. `namespace` is used as given; check it with
/// [`is_valid_namespace`] when it comes from outside.
///
/// ```
/// use tower_idempotency_core::store_key_from_parts;
/// let key = store_key_from_parts("orders", "POST", "/orders", Some("tenant-42"), "k-1");
/// assert!(key.starts_with("orders:") && key.len() == "orders:".len() + 64);
/// ```
pub fn store_key_from_parts(
    namespace: &str,
    method: &str,
    path: &str,
    principal: Option<&str>,
    key: &str,
) -> String {
    let mut hasher = Sha256::new();
    for part in [method, path, principal.unwrap_or(""), key] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.update([u8::from(principal.is_some())]);
    let mut digest_hex = [0u8; 64];
    hex::encode_to_slice(hasher.finalize(), &mut digest_hex).expect("64 bytes for 32");
    let mut out = String::with_capacity(namespace.len() + 65);
    out.push_str(namespace);
    out.push(':');
    out.push_str(std::str::from_utf8(&digest_hex).expect("hex is ASCII"));
    out
}

/// The URI the request arrived with. Inside `Router::nest`, axum strips the nest prefix from
/// `parts.uri` (`/shops/1/orders` becomes `/orders`) and keeps the original in
/// [`OriginalUri`](axum::extract::OriginalUri); scoping by the stripped path would let
/// `/shops/1/orders` and `/shops/2/orders` share records.
pub(crate) fn request_uri(parts: &Parts) -> &http::Uri {
    parts
        .extensions
        .get::<axum::extract::OriginalUri>()
        .map_or(&parts.uri, |original| &original.0)
}

/// Whether `namespace` is usable as a scope namespace.
pub fn is_valid_namespace(namespace: &str) -> bool {
    !namespace.is_empty()
        && namespace.len() <= MAX_NAMESPACE_LEN
        && namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, path: &str, principal: Option<&str>) -> Parts {
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap();
        if let Some(p) = principal {
            request.extensions_mut().insert(Principal::new(p));
        }
        request.into_parts().0
    }

    #[test]
    fn tenants_endpoints_and_methods_get_distinct_keys() {
        let scope = Scope::new("orders", PrincipalSource::Extension);
        let base = scope.store_key(&parts("POST", "/orders", Some("a")), "k");
        assert_ne!(
            base,
            scope.store_key(&parts("POST", "/orders", Some("b")), "k")
        );
        assert_ne!(base, scope.store_key(&parts("POST", "/orders", None), "k"));
        assert_ne!(
            base,
            scope.store_key(&parts("PATCH", "/orders", Some("a")), "k")
        );
        assert_ne!(
            base,
            scope.store_key(&parts("POST", "/refunds", Some("a")), "k")
        );
        assert_eq!(
            base,
            scope.store_key(&parts("POST", "/orders?x=1", Some("a")), "k")
        );
        assert!(base.starts_with("orders:") && base.len() == "orders:".len() + 64);
    }

    #[test]
    fn the_key_from_parts_is_the_key_of_the_request() {
        let scope = Scope::new("orders", PrincipalSource::Extension);
        for (method, uri, principal, key) in [
            ("POST", "/orders?x=1", Some("tenant-42"), "k-1"),
            ("PATCH", "/orders/7", None, "k-1"),
            ("POST", "/orders", Some(""), ""),
        ] {
            let path = uri.split('?').next().unwrap();
            assert_eq!(
                scope.store_key(&parts(method, uri, principal), key),
                store_key_from_parts("orders", method, path, principal, key),
                "{method} {uri} {principal:?}"
            );
        }
        // Known value: a tool that rebuilds the key elsewhere must get exactly this.
        assert_eq!(
            store_key_from_parts("orders", "POST", "/orders", Some("tenant-42"), "k-1"),
            format!("orders:{}", {
                let mut hasher = Sha256::new();
                for part in ["POST", "/orders", "tenant-42", "k-1"] {
                    hasher.update((part.len() as u64).to_be_bytes());
                    hasher.update(part);
                }
                hasher.update([1u8]);
                hex::encode(hasher.finalize())
            })
        );
        assert_ne!(
            store_key_from_parts("orders", "POST", "/orders", None, "k"),
            store_key_from_parts("orders", "POST", "/orders", Some(""), "k"),
            "an absent principal is not an empty one"
        );
    }

    #[test]
    fn nested_routes_use_the_original_path() {
        let scope = Scope::new("orders", PrincipalSource::Disabled);
        let mut request = http::Request::post("/orders").body(()).unwrap();
        request.extensions_mut().insert(axum::extract::OriginalUri(
            "/shops/1/orders".parse().unwrap(),
        ));
        let (parts, _) = request.into_parts();
        assert_eq!(
            scope.store_key(&parts, "k"),
            store_key_from_parts("orders", "POST", "/shops/1/orders", None, "k")
        );
    }

    #[test]
    fn matched_path_scope_ignores_the_method_and_the_path_spelling() {
        let scope = Scope::new("hooks", PrincipalSource::Disabled).route(RouteScope::MatchedPath);
        let with_route = |method: &str, path: &str| {
            let mut parts = parts(method, path, None);
            parts.extensions.insert(matched_path("/hooks/{account}"));
            parts
        };
        let base = scope.store_key(&with_route("POST", "/hooks/acct_1"), "evt");
        assert_eq!(
            base,
            scope.store_key(&with_route("POST", "/hooks/acct_%31"), "evt")
        );
        assert_eq!(
            base,
            scope.store_key(&with_route("GET", "/hooks/acct_1"), "evt")
        );
        assert_ne!(
            base,
            scope.store_key(&with_route("POST", "/hooks/acct_1"), "evt2")
        );
        // Without a matched route, the path the request arrived with.
        assert_eq!(
            scope.store_key(&parts("POST", "/hooks/acct_1", None), "evt"),
            scope.store_key(&parts("PUT", "/hooks/acct_1", None), "evt"),
        );
        assert_ne!(
            scope.store_key(&parts("POST", "/hooks/acct_1", None), "evt"),
            scope.store_key(&parts("POST", "/hooks/acct_%31", None), "evt"),
        );
        let by_method = Scope::new("hooks", PrincipalSource::Disabled);
        assert_ne!(
            base,
            by_method.store_key(&with_route("POST", "/hooks/{account}"), "evt")
        );
    }

    /// The `MatchedPath` axum's router inserts for `template` (it has no public constructor).
    fn matched_path(template: &'static str) -> axum::extract::MatchedPath {
        use axum::{extract::MatchedPath, routing::any, Router};
        use tower::ServiceExt as _;
        let (tx, rx) = std::sync::mpsc::channel();
        let app = Router::new().route(
            template,
            any(move |matched: MatchedPath| async move { tx.send(matched).unwrap() }),
        );
        let request = http::Request::builder()
            .uri(template.replace(['{', '}'], ""))
            .body(axum::body::Body::empty())
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(app.oneshot(request)).unwrap();
        rx.recv().unwrap()
    }

    #[test]
    fn namespace_is_validated() {
        assert!(is_valid_namespace("stripe.v1_prod-2"));
        assert!(!is_valid_namespace(""));
        assert!(!is_valid_namespace("a b"));
        assert!(!is_valid_namespace("x'; DROP TABLE y;--"));
    }
}
