//! The cases: each starts its own [`EffectsServer`] and checks the rows it leaves.

use axum::http::StatusCode;
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};

use super::{fresh_key, layer, problem_type, server::send, EffectsDb, EffectsServer, Fixture};

/// A server with the transactional layer on the fixture's store, and a fresh key named after
/// `name`.
async fn server_and_key<DB: EffectsDb>(
    fixture: &Fixture<DB>,
    name: &str,
) -> (EffectsServer<DB>, String) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    (server, fresh_key(name))
}

/// A request of `key` on a task of its own, once its handler holds its transaction open until
/// the gate opens.
async fn held<DB: EffectsDb>(
    server: &EffectsServer<DB>,
    key: &str,
) -> tokio::task::JoinHandle<(StatusCode, bool, String)> {
    let (url, key) = (format!("{}/effects", server.base), key.to_owned());
    let request =
        tokio::spawn(async move { send(&reqwest::Client::new(), &url, &key, "hold").await });
    server.entered().await;
    request
}

/// Posts `mode` under `key` to `path`, which is answered `status` with the problem document of
/// type `kind`: the document.
async fn post_refused<DB: EffectsDb>(
    server: &EffectsServer<DB>,
    path: &str,
    key: &str,
    mode: &str,
    status: StatusCode,
    kind: &str,
) -> String {
    let (answered, _, body) = server.post(path, key, mode).await;
    assert_eq!(answered, status, "{body}");
    assert_eq!(
        problem_type(&body),
        format!("urn:tower-idempotency:problem:{kind}")
    );
    body
}

/// Over real HTTP: 10 rounds of 25 concurrent identical requests (one key per round) leave
/// exactly one row per key in the handler's table and one handler execution per round; every
/// answer is `201` or `409`, and a later request replays the row's own `amount`.
pub async fn concurrent_rounds_write_one_row_per_key<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    let client = reqwest::Client::new();
    let url = format!("{}/effects", server.base);
    for round in 0..10 {
        let key = fresh_key(&format!("round{round}"));
        let before = server.executions();
        let requests = (0..25).map(|_| {
            let (client, url, key) = (client.clone(), url.clone(), key.clone());
            tokio::spawn(async move { send(&client, &url, &key, "ok").await })
        });
        let mut firsts = Vec::new();
        for answer in futures_util::future::join_all(requests).await {
            let (status, replayed, body) = answer.expect("task");
            match status {
                StatusCode::CREATED if !replayed => firsts.push(body),
                StatusCode::CREATED | StatusCode::CONFLICT => {}
                other => panic!("unexpected {other}: {body}"),
            }
        }
        assert!(firsts.len() <= 1, "two first answers: {firsts:?}");
        assert_eq!(server.executions() - before, 1, "one execution per round");
        assert_eq!(server.rows(&key).await, 1, "one row per key");
        let (status, replayed, body) = send(&client, &url, &key, "ok").await;
        assert_eq!((status, replayed), (StatusCode::CREATED, true));
        let amount = before + 1;
        assert_eq!(body, format!("{{\"amount\":{amount}}}"));
        if let Some(first) = firsts.first() {
            assert_eq!(&body, first);
        }
    }
    server.finish().await;
}

/// A handler that wrote and then answers `400` (released by the default policy), panics, or whose
/// inner service fails leaves no row, and its key is released: a retry runs the handler and
/// writes exactly one row.
pub async fn released_answers_write_nothing<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let server = EffectsServer::start(fixture, layer(fixture.store.clone())).await;
    let cases = [
        ("/effects", "reject", StatusCode::BAD_REQUEST),
        ("/effects", "panic", StatusCode::INTERNAL_SERVER_ERROR),
        ("/effects-error", "ok", StatusCode::BAD_GATEWAY),
    ];
    for (path, mode, expected) in cases {
        let key = fresh_key(mode);
        let before = server.executions();
        let (status, _, body) = server.post(path, &key, mode).await;
        assert_eq!(status, expected, "{path} {mode}: {body}");
        if path == "/effects" {
            assert_eq!(server.executions() - before, 1, "{mode}: the handler ran");
        }
        assert_eq!(server.rows(&key).await, 0, "{path} {mode}: nothing written");
        let (status, replayed, _) = server.post("/effects", &key, "ok").await;
        assert_eq!(
            (status, replayed),
            (StatusCode::CREATED, false),
            "{mode}: the key was released, a retry runs"
        );
        assert_eq!(server.rows(&key).await, 1, "{mode}: the retry wrote once");
    }
    server.finish().await;
}

/// `CacheDirective::Complete` on a `402` commits the handler's writes with the completion; the
/// `402` is replayed and nothing is written again.
pub async fn directive_commits_a_non_2xx<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let (server, key) = server_and_key(fixture, "decline").await;
    let (status, replayed, first) = server.post("/effects", &key, "decline").await;
    assert_eq!((status, replayed), (StatusCode::PAYMENT_REQUIRED, false));
    assert_eq!(server.rows(&key).await, 1);
    let (status, replayed, again) = server.post("/effects", &key, "decline").await;
    assert_eq!((status, replayed), (StatusCode::PAYMENT_REQUIRED, true));
    assert_eq!(again, first);
    assert_eq!(server.rows(&key).await, 1);
    assert_eq!(server.executions(), 1);
    server.finish().await;
}

/// A `COMMIT` that fails (a deferred foreign key) is answered `503 commit-failed`, writes
/// nothing, and releases the key: a retry runs and writes once.
pub async fn failed_commit_writes_nothing<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let (server, key) = server_and_key(fixture, "orphan").await;
    post_refused(
        &server,
        "/effects",
        &key,
        "orphan",
        StatusCode::SERVICE_UNAVAILABLE,
        "commit-failed",
    )
    .await;
    assert_eq!(server.rows(&key).await, 0);
    let (status, replayed, _) = server.post("/effects", &key, "ok").await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    assert_eq!(server.rows(&key).await, 1);
    server.finish().await;
}

/// A result larger than the store accepts (the fixture's store must refuse records of
/// [`LARGE_BODY_BYTES`](super::LARGE_BODY_BYTES), e.g. `with_max_record_bytes(64 * 1024)`) is
/// committed without its body, in the handler's transaction: the caller gets the whole `201`,
/// the handler's row is committed, and a retry is a replay with an empty body that does not run
/// the handler again.
pub async fn oversized_result_commits_without_its_body<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let (server, key) = server_and_key(fixture, "large").await;
    let (status, replayed, body) = server.post("/effects", &key, "large").await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, false),
        "{body:.200}"
    );
    assert_eq!(body.len(), super::LARGE_BODY_BYTES);
    assert!(body.starts_with("{\"amount\":1,"), "{body:.200}");
    assert_eq!(
        server.rows(&key).await,
        1,
        "the handler's write was committed"
    );
    let (status, replayed, again) = server.post("/effects", &key, "large").await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, true),
        "{again:.200}"
    );
    assert_eq!(again, "", "the replay carries no body");
    assert_eq!(server.executions(), 1, "the retry did not run the handler");
    assert_eq!(server.rows(&key).await, 1);
    server.finish().await;
}

/// A handler taking [`IdempotentTx`](crate::IdempotentTx) behind a layer that is not transactional is answered with a
/// `500 transaction-unavailable` problem naming the misconfiguration, before it writes; and
/// `try_transactional` refuses a store without transactions.
pub async fn misconfiguration_is_refused<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let (server, key) = server_and_key(fixture, "misconfigured").await;
    let body = post_refused(
        &server,
        "/misconfigured",
        &key,
        "ok",
        StatusCode::INTERNAL_SERVER_ERROR,
        "transaction-unavailable",
    )
    .await;
    assert!(body.contains(".transactional()"), "{body}");
    assert_eq!(server.executions(), 0, "the handler never ran");
    assert_eq!(server.rows(&key).await, 0);
    assert!(IdempotencyLayer::client_keys(MemoryStore::new())
        .try_transactional()
        .is_err());
    server.finish().await;
}

/// A duplicate that arrives while the first request's transaction is open waits for no lock
/// on its claim, and after the commit is answered with the replay; one row in all.
/// On SQLite the duplicate's claim is a read beside the writer (the store claimed the key
/// lately), so it does not wait for the write lock the open transaction holds either.
pub async fn duplicate_in_flight_gets_409<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let (server, key) = server_and_key(fixture, "hold").await;
    let first = held(&server, &key).await;
    let (status, _, body) = server.post("/effects", &key, "hold").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    server.open_gate();
    let (status, replayed, body) = first.await.expect("task");
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    let (status, replayed, again) = server.post("/effects", &key, "hold").await;
    assert_eq!((status, replayed, again), (StatusCode::CREATED, true, body));
    assert_eq!(server.rows(&key).await, 1);
    server.finish().await;
}

/// A caller that disconnects while its handler holds the transaction does not cancel it: the
/// handler finishes on a task of its own and commits once; the retry replays its result.
pub async fn caller_disconnect_still_commits_once<DB: EffectsDb>(fixture: &Fixture<DB>) {
    let (server, key) = server_and_key(fixture, "disconnect").await;
    let caller = held(&server, &key).await;
    caller.abort();
    assert!(caller.await.is_err(), "the caller went away");
    server.open_gate();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, replayed, _) = loop {
        let answer = server.post("/effects", &key, "ok").await;
        if answer.0 != StatusCode::CONFLICT {
            break answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the detached handler never committed"
        );
        tokio::task::yield_now().await;
    };
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(server.rows(&key).await, 1);
    assert_eq!(server.executions(), 1);
    server.finish().await;
}
