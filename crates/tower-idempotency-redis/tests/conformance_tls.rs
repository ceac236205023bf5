//! The public store conformance suite over TLS (`rediss://`, the `tls` feature): a throw-away
//! `redis-server` serving TLS with a certificate signed by a CA the test made, which the store
//! trusts through `ConnectOptions::root_certificates`.

mod common;

use std::time::Duration;

use tower_idempotency_core::{ClaimOutcome, FencingToken, Fingerprint, Store};
use tower_idempotency_redis::{ConnectError, ConnectOptions, RedisStore};

tower_idempotency_core::store_conformance_tests!(common::tls_store());

/// The server's certificate is checked: without the test CA among the trusted roots (the
/// system's roots only), the handshake is refused and the store does not connect.
#[tokio::test]
async fn a_server_whose_ca_is_not_trusted_is_refused() {
    let Some(server) = common::tls_server() else {
        return;
    };
    let outcome = RedisStore::connect(&server.tls_url(), &common::random_prefix()).await;
    let Err(ConnectError::Redis(error)) = outcome else {
        panic!("connected to a server whose CA is not trusted: {outcome:?}");
    };
    let said = format!("{error:?}");
    assert!(
        said.contains("UnknownIssuer") || said.contains("certificate"),
        "{said}"
    );
}

/// What the store writes over TLS is on the server: the claim's key is seen on its plain port.
#[tokio::test]
async fn a_claim_over_tls_is_stored_on_the_server() {
    let Some(store) = common::tls_store().await else {
        return;
    };
    let server = common::tls_server().expect("started by tls_store");
    let before = store.guard().count_keys();
    let token = FencingToken::random().unwrap();
    let outcome = store
        .claim(
            "claimed-over-tls",
            &Fingerprint([7; 32]),
            token,
            Duration::from_secs(30),
        )
        .await
        .expect("claim over TLS");
    assert!(
        matches!(outcome, ClaimOutcome::Claimed { .. }),
        "{outcome:?}"
    );
    assert_eq!(store.guard().count_keys(), before + 1, "{}", server.url());
}

/// Root certificates apply to `rediss://` URLs only: with them, `redis://` URLs of a server and
/// of a cluster stay plain.
#[tokio::test]
async fn root_certificates_leave_plain_urls_plain() {
    let Some(server) = common::tls_server() else {
        return;
    };
    let options = || ConnectOptions::new().root_certificates(server.ca_pem());
    let prefix = common::random_prefix();
    RedisStore::connect_with(&server.url(), &prefix, options())
        .await
        .expect("a plain server with root certificates set");
    let Some(cluster) = common::Cluster::shared() else {
        return;
    };
    let urls = cluster.urls();
    RedisStore::connect_cluster_with(urls.iter().map(String::as_str), &prefix, options())
        .await
        .expect("a plain cluster with root certificates set");
}
