//! The Postgres store's coalescing of claims of new keys and completions
//! ([`PostgresStore::with_coalescing`]): batches are built by holding back, at a proxy, the
//! replies to the statements on every write lane, so the calls that arrive meanwhile queue up
//! and go out together when the proxy lets the replies through. (A row lock would not hold a
//! batch: a batch gives up on a row lock after 100 ms and hands its calls back.)
#![cfg(feature = "postgres")]

mod common;

use std::{sync::Arc, time::Duration};

use common::*;
use tower_idempotency_core::{
    ClaimOutcome, FencingToken, IdempotencyLayer, Ownership, Store, StoreError,
};
use tower_idempotency_sqlx::PostgresStore;
use tower_idempotency_testkit::{Mode, Protocol, Proxy};

mod suite_with_coalescing {
    tower_idempotency_core::store_conformance_tests!(async {
        let table = crate::common::PgTable::new();
        let store = table.store().await?.with_coalescing(true);
        store.migrate().await.expect("migrate");
        Some(crate::common::Guarded::new(
            std::sync::Arc::new(store),
            table,
        ))
    });
}

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(60);

/// A migrated store with coalescing on a pool of its own, with its table.
async fn store_on(table: &PgTable, pool: sqlx::PgPool) -> Arc<PostgresStore> {
    let store = PostgresStore::new(pool, &table.name)
        .expect("valid table name")
        .with_coalescing(true);
    store.migrate().await.expect("migrate");
    Arc::new(store)
}

/// A store with one write lane whose every connection goes through a proxy that can hold
/// replies back; `None` when Postgres is unreachable.
async fn proxied(table: &PgTable) -> Option<(Arc<PostgresStore>, Proxy)> {
    proxied_with_lanes(table, 1).await
}

/// A store with `lanes` write lanes whose every connection goes through a proxy that can hold
/// replies back, warmed so that each lane holds its connection and has prepared both batch
/// statements; `None` when Postgres is unreachable.
async fn proxied_with_lanes(table: &PgTable, lanes: usize) -> Option<(Arc<PostgresStore>, Proxy)> {
    pg_pool().await?;
    let proxy = Proxy::counting(pg_address(), Protocol::Postgres)
        .await
        .expect("bind");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .connect(&proxy_url(&proxy))
        .await
        .expect("connect through the proxy");
    let store = PostgresStore::new(pool, &table.name)
        .expect("valid table name")
        .with_connection_lanes(lanes)
        .with_coalescing(true);
    store.migrate().await.expect("migrate");
    let store = Arc::new(store);
    assert_eq!(store.connection_lanes(), lanes);
    // Lanes are taken in turn: `lanes` claims one after another run one on each lane, and so
    // do the completions after them.
    let keys: Vec<String> = (0..lanes)
        .map(|i| random_key(&format!("warm{i}")))
        .collect();
    let mut tokens = Vec::new();
    for key in &keys {
        tokens.push(token_of(claim(&*store, key, 1, LEASE).await));
    }
    for (key, token) in keys.iter().zip(tokens) {
        let done = store.complete(key, token, &response("warm"), TTL).await;
        assert_eq!(done.expect("warm"), Ownership::Current);
    }
    Some((store, proxy))
}

/// [`proxied`], with a claim of a fresh key [`in_flight`] on its one lane: the claims that
/// follow queue until the proxy passes replies again.
async fn proxied_behind_held_claim(
    table: &PgTable,
) -> Option<(
    Arc<PostgresStore>,
    Proxy,
    tokio::task::JoinHandle<Result<ClaimOutcome, StoreError>>,
)> {
    let (store, proxy) = proxied(table).await?;
    let held = in_flight(&proxy, || {
        spawn_claim(store.clone(), &random_key("held"), LEASE)
    })
    .await;
    Some((store, proxy, held))
}

fn pg_address() -> String {
    let url = url::Url::parse(&pg_url()).expect("DATABASE_URL is a URL");
    format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(5432)
    )
}

fn proxy_url(proxy: &Proxy) -> String {
    let mut url = url::Url::parse(&pg_url()).expect("DATABASE_URL is a URL");
    url.set_host(Some("127.0.0.1")).expect("host");
    url.set_port(Some(proxy.addr.port())).expect("port");
    url.query_pairs_mut().append_pair("sslmode", "disable");
    url.to_string()
}

/// Runs `call` with the proxy holding replies back, and returns once its statement is on the
/// wire, where it holds its lane until the proxy passes replies again.
async fn in_flight<T>(
    proxy: &Proxy,
    start: impl FnOnce() -> tokio::task::JoinHandle<T>,
) -> tokio::task::JoinHandle<T> {
    proxy.set(Mode::HoldReplies);
    let before = proxy.counted();
    let running = start();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while proxy.counted() == before {
        assert!(tokio::time::Instant::now() < deadline, "nothing was sent");
        tokio::task::yield_now().await;
    }
    running
}

/// Waits until `n` calls are queued for a lane.
async fn until_queued(store: &PostgresStore, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.coalescing_queued() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "calls never queued: {} of {n}",
            store.coalescing_queued()
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(store.coalescing_queued(), n);
}

fn spawn_claim(
    store: Arc<PostgresStore>,
    key: &str,
    lease: Duration,
) -> tokio::task::JoinHandle<Result<ClaimOutcome, StoreError>> {
    let key = key.to_owned();
    tokio::spawn(async move {
        let token = FencingToken::random().expect("token");
        store.claim(&key, &fingerprint(1), token, lease).await
    })
}

fn spawn_complete(
    store: Arc<PostgresStore>,
    key: &str,
    token: FencingToken,
) -> tokio::task::JoinHandle<Result<Ownership, StoreError>> {
    let key = key.to_owned();
    tokio::spawn(async move { store.complete(&key, token, &response("done"), TTL).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_new_keys_over_http_run_each_handler_once_and_replay_every_duplicate() {
    let table = PgTable::new();
    let Some(pool) = pg_pool().await else { return };
    let store = store_on(&table, pool).await;
    let server = serve(IdempotencyLayer::client_keys(store.clone())).await;
    let client = reqwest::Client::new();
    let keys: Vec<String> = (0..200).map(|_| random_suffix()).collect();

    // Every key three times, 600 requests, 64 of them in flight at a time.
    let senders = Arc::new(tokio::sync::Semaphore::new(64));
    let sends = keys.iter().flat_map(|key| {
        (0..3).map(|_| {
            let (client, url, key) = (client.clone(), server.url.clone(), key.clone());
            let senders = senders.clone();
            tokio::spawn(async move {
                let _sending = senders.acquire().await.expect("open");
                (key.clone(), post_order(&client, &url, &key).await)
            })
        })
    });
    let mut first = std::collections::HashMap::<String, (usize, String)>::new();
    for send in sends.collect::<Vec<_>>() {
        let (key, (status, replayed, body)) = send.await.expect("request");
        // A duplicate that arrives while the first is running is told so (409); one that
        // arrives after it is replayed.
        assert!(
            status == 201 || status == 409,
            "{key}: {status} {replayed} {body}"
        );
        if status == 201 && !replayed {
            let entry = first.entry(key).or_insert((0, body));
            entry.0 += 1;
        }
    }
    assert_eq!(first.len(), keys.len(), "every key ran its handler");
    assert!(first.values().all(|(runs, _)| *runs == 1), "{first:?}");
    assert_eq!(
        server.executions.load(std::sync::atomic::Ordering::SeqCst),
        keys.len(),
        "one handler execution per key"
    );

    // Every duplicate now replays the first answer.
    for key in &keys {
        let (status, replayed, body) = post_order(&client, &server.url, key).await;
        assert_eq!((status, replayed), (201, true), "{key}");
        assert_eq!(body, first[key].1, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_claims_go_out_as_one_batch_with_one_answer_per_key() {
    let table = PgTable::new();
    let Some((store, proxy, held)) = proxied_behind_held_claim(&table).await else {
        return;
    };

    let keys: Vec<String> = (0..20).map(|i| random_key(&format!("q{i}"))).collect();
    // The first key twice: the second call, for a key the store has just seen, reads the key
    // first (held at the proxy too) instead of queueing; only one of the two may be granted.
    let claims: Vec<_> = keys
        .iter()
        .chain(std::iter::once(&keys[0]))
        .map(|key| spawn_claim(store.clone(), key, LEASE))
        .collect();
    until_queued(&store, keys.len()).await;
    let before = proxy.counted();
    proxy.set(Mode::Pass);

    assert!(matches!(
        held.await.unwrap().expect("held claim"),
        ClaimOutcome::Claimed { .. }
    ));
    let mut outcomes = Vec::new();
    for claim in claims {
        outcomes.push(claim.await.unwrap().expect("claim"));
    }
    let spent = proxy.counted() - before;
    assert!(
        spent < keys.len() as u64,
        "{} queued claims took {spent} round trips",
        keys.len()
    );
    let (twice, once) = (&outcomes[0], &outcomes[keys.len()]);
    let granted = [twice, once]
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Claimed { .. }))
        .count();
    assert_eq!(granted, 1, "{twice:?} {once:?}");
    assert!(
        [twice, once]
            .iter()
            .any(|o| matches!(o, ClaimOutcome::InFlight { .. })),
        "{twice:?} {once:?}"
    );
    for (key, outcome) in keys.iter().zip(&outcomes).skip(1) {
        let ClaimOutcome::Claimed { token } = outcome else {
            panic!("{key}: {outcome:?}");
        };
        assert_eq!(
            store
                .complete(key, *token, &response("done"), TTL)
                .await
                .expect("complete"),
            Ownership::Current
        );
    }
}

/// A call that finds a lane free goes out at once, beside a statement in flight: calls queue only
/// while every lane is busy, and those that queued go out together on the first lane to free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waits_only_while_every_lane_is_busy() {
    let table = PgTable::new();
    let Some((store, proxy)) = proxied_with_lanes(&table, 2).await else {
        return;
    };
    let first = in_flight(&proxy, || {
        spawn_claim(store.clone(), &random_key("a"), LEASE)
    })
    .await;
    let sent = proxy.counted();
    let second = spawn_claim(store.clone(), &random_key("b"), LEASE);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while proxy.counted() == sent {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second claim waited although a lane was free"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(store.coalescing_queued(), 0);

    let keys: Vec<String> = (0..20).map(|i| random_key(&format!("q{i}"))).collect();
    let queued: Vec<_> = keys
        .iter()
        .map(|key| spawn_claim(store.clone(), key, LEASE))
        .collect();
    until_queued(&store, keys.len()).await;
    let before = proxy.counted();
    proxy.set(Mode::Pass);

    for claim in [first, second].into_iter().chain(queued) {
        let outcome = claim.await.unwrap().expect("claim");
        assert!(
            matches!(outcome, ClaimOutcome::Claimed { .. }),
            "{outcome:?}"
        );
    }
    // Their batch, with the first and second claims' replies and a first use's prepare.
    let spent = proxy.counted() - before;
    assert!(
        spent < 5,
        "{} queued claims took {spent} round trips",
        keys.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_answers_each_call_as_its_own_statement_would() {
    let table = PgTable::new();
    let Some((store, proxy, held)) = proxied_behind_held_claim(&table).await else {
        return;
    };

    // Postgres's text cannot hold a NUL: this key fails its statement, and the batch with it.
    let good: Vec<String> = (0..5).map(|i| random_key(&format!("g{i}"))).collect();
    let bad = format!("{}\0", random_key("bad"));
    let mut claims: Vec<_> = good
        .iter()
        .map(|key| spawn_claim(store.clone(), key, LEASE))
        .collect();
    claims.insert(2, spawn_claim(store.clone(), &bad, LEASE));
    until_queued(&store, good.len() + 1).await;
    proxy.set(Mode::Pass);
    held.await.unwrap().expect("held claim");

    let bad_outcome = claims.remove(2).await.unwrap();
    assert!(bad_outcome.is_err(), "{bad_outcome:?}");
    for (key, claim) in good.iter().zip(claims) {
        let outcome = claim.await.unwrap().expect("a good key is answered");
        assert!(
            matches!(outcome, ClaimOutcome::Claimed { .. }),
            "{key}: {outcome:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_completion_in_a_batch_loses_and_a_fresh_one_wins() {
    let table = PgTable::new();
    let Some((store, proxy)) = proxied(&table).await else {
        return;
    };
    let [held, fresh, stale, both] = ["held", "fresh", "stale", "both"].map(random_key);
    let mut tokens = Vec::new();
    for key in [&held, &fresh, &stale, &both] {
        tokens.push(token_of(claim(&*store, key, 1, LEASE).await));
    }

    let first = in_flight(&proxy, || spawn_complete(store.clone(), &held, tokens[0])).await;

    let wrong = |token: FencingToken| FencingToken(token.0 ^ 1);
    let calls = [
        spawn_complete(store.clone(), &fresh, tokens[1]),
        spawn_complete(store.clone(), &stale, wrong(tokens[2])),
        spawn_complete(store.clone(), &both, wrong(tokens[3])),
        spawn_complete(store.clone(), &both, tokens[3]),
    ];
    // The second call for `both` runs as its own statement (its key is queued already): in
    // either order, only the right token makes the completion current.
    until_queued(&store, calls.len() - 1).await;
    proxy.set(Mode::Pass);

    assert_eq!(first.await.unwrap().expect("held"), Ownership::Current);
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap().expect("complete"));
    }
    assert_eq!(
        answers,
        [
            Ownership::Current,
            Ownership::Stale,
            Ownership::Stale,
            Ownership::Current
        ]
    );
    let outcome = claim(&*store, &stale, 2, LEASE).await;
    assert!(
        matches!(outcome, ClaimOutcome::InFlight { .. }),
        "the stale completion left the claim in flight: {outcome:?}"
    );
    for key in [&fresh, &both] {
        let outcome = claim(&*store, key, 1, LEASE).await;
        assert!(
            matches!(outcome, ClaimOutcome::Completed { .. }),
            "{key}: {outcome:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gives_up_while_queued_writes_nothing() {
    let table = PgTable::new();
    let Some((store, proxy, held)) = proxied_behind_held_claim(&table).await else {
        return;
    };

    let (gone, stays) = (random_key("gone"), random_key("stays"));
    let given_up = spawn_claim(store.clone(), &gone, LEASE);
    let kept = spawn_claim(store.clone(), &stays, LEASE);
    until_queued(&store, 2).await;
    given_up.abort();
    assert!(given_up.await.unwrap_err().is_cancelled());
    proxy.set(Mode::Pass);
    held.await.unwrap().expect("held claim");

    assert!(matches!(
        kept.await.unwrap().expect("claim"),
        ClaimOutcome::Claimed { .. }
    ));
    assert!(store.get(&gone).await.expect("get").is_none());
}

/// A key another transaction holds an uncommitted row of holds up only its own caller: its
/// batch gives up on the lock and hands every call back, the others are answered while the
/// transaction is still open, and the key's own claim is answered when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_locked_by_another_transaction_holds_up_only_its_own_caller() {
    let table = PgTable::new();
    let Some(pool) = pg_pool().await else { return };
    let store = store_on(&table, pool).await;
    let locked = random_key("locked");
    let mut tx = store.pool().begin().await.expect("begin");
    let token = FencingToken::random().expect("token");
    store
        .claim_in(&mut tx, &locked, &fingerprint(9), token, LEASE)
        .await
        .expect("claim in the transaction");

    let waiting = spawn_claim(store.clone(), &locked, LEASE);
    let others: Vec<_> = (0..20)
        .map(|i| spawn_claim(store.clone(), &random_key(&format!("o{i}")), LEASE))
        .collect();
    for other in others {
        let outcome = tokio::time::timeout(Duration::from_secs(10), other)
            .await
            .expect("a free key must not wait for another key's lock")
            .unwrap()
            .expect("claim");
        assert!(
            matches!(outcome, ClaimOutcome::Claimed { .. }),
            "{outcome:?}"
        );
    }
    assert!(!waiting.is_finished(), "the locked key waits for the lock");
    tx.commit().await.expect("commit");
    let outcome = waiting.await.unwrap().expect("claim after the commit");
    assert!(
        matches!(outcome, ClaimOutcome::InFlight { .. }),
        "the committed claim holds the key: {outcome:?}"
    );
}
