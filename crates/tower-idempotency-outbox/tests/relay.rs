//! The outbox on the real SQLite file, the shared Postgres and (feature `mysql`) the shared
//! MySQL or MariaDB, each test with a table of its own, delivering over real HTTP to loopback
//! servers: messages exist exactly when their transaction commits, failed deliveries are
//! retried with the same `Idempotency-Key`, spent ones are failed and operated through the
//! admin router, and several relays on Postgres and on MySQL deliver each message at least once
//! while the receiver's client-key layer runs it once. The MySQL tests skip, saying so, when
//! the server is unreachable, unless CI=true.

use std::{
    collections::HashMap,
    future::Future,
    path::PathBuf,
    pin::Pin,
    str::FromStr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::post,
    Router,
};
use tower_idempotency_core::{IdempotencyLayer, MemoryStore};
use tower_idempotency_outbox::{
    admin, Backoff, Dispatch, DispatchError, Enqueued, Message, MessageState, Outbox,
    OutboxDatabase, OutboxError,
};
use tower_idempotency_sqlx::{sqlx, Backend, IdempotentTx, SqlStore};
use tower_idempotency_testkit::{database_url, random_suffix, serve};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A database the tests run on.
trait Fixture: OutboxDatabase + Backend + Sized {
    /// A pool, a table name of this test's own, and a directory to remove at the end.
    fn open() -> BoxFuture<'static, (sqlx::Pool<Self>, String, Option<PathBuf>)>;

    /// A transactional client-key layer on a store of this database, in `table`.
    fn transactional<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, IdempotencyLayer> {
        Box::pin(async move {
            let store = SqlStore::<Self>::new(pool.clone(), table).unwrap();
            store.migrate().await.unwrap();
            IdempotencyLayer::client_keys(store).transactional()
        })
    }

    /// Drops the test's table from a shared database.
    fn drop_table<'a>(_pool: &'a sqlx::Pool<Self>, _table: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// The stored payload of the message `key` in `table`, read with SQL of its own.
    fn stored<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Option<Stored>>;
}

/// A message's stored payload: method, URL, topic, headers (JSON text) and body.
type Stored = (
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    Vec<u8>,
);

/// The statement [`Fixture::stored`] runs.
fn stored_sql(table: &str) -> String {
    format!("SELECT method, url, topic, headers, body FROM {table} WHERE key = $1")
}

impl Fixture for sqlx::Sqlite {
    fn open() -> BoxFuture<'static, (sqlx::Pool<Self>, String, Option<PathBuf>)> {
        Box::pin(async {
            let dir = std::env::temp_dir().join(format!("tidem-outbox-{}", random_suffix()));
            std::fs::create_dir_all(&dir).unwrap();
            let url = format!("sqlite://{}/outbox.db", dir.display());
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
                .unwrap()
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(8)
                .connect_with(options)
                .await
                .unwrap();
            (pool, "outbox".to_owned(), Some(dir))
        })
    }

    fn stored<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Option<Stored>> {
        Box::pin(async move {
            sqlx::query_as(sqlx::AssertSqlSafe(&*stored_sql(table)))
                .bind(key)
                .fetch_optional(pool)
                .await
                .unwrap()
        })
    }
}

#[cfg(feature = "mysql")]
impl Fixture for sqlx::MySql {
    fn open() -> BoxFuture<'static, (sqlx::Pool<Self>, String, Option<PathBuf>)> {
        Box::pin(async {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(16)
                .connect(&tower_idempotency_testkit::mysql_url())
                .await
                .expect("MySQL or MariaDB at MYSQL_URL");
            (pool, tower_idempotency_testkit::mysql_table("outbox"), None)
        })
    }

    fn drop_table<'a>(pool: &'a sqlx::Pool<Self>, table: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let drop = tower_idempotency_testkit::drop_job_tables_sql(table);
            sqlx::raw_sql(sqlx::AssertSqlSafe(&*drop))
                .execute(pool)
                .await
                .unwrap();
        })
    }

    fn stored<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Option<Stored>> {
        Box::pin(async move {
            let sql =
                format!("SELECT method, url, topic, headers, body FROM {table} WHERE `key` = ?");
            sqlx::query_as(sqlx::AssertSqlSafe(&*sql))
                .bind(key)
                .fetch_optional(pool)
                .await
                .unwrap()
        })
    }
}

impl Fixture for sqlx::Postgres {
    fn open() -> BoxFuture<'static, (sqlx::Pool<Self>, String, Option<PathBuf>)> {
        Box::pin(async {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .connect(&database_url())
                .await
                .expect("Postgres at DATABASE_URL");
            (pool, format!("outbox_{}", random_suffix()), None)
        })
    }

    fn drop_table<'a>(pool: &'a sqlx::Pool<Self>, table: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let drop = tower_idempotency_testkit::drop_job_tables_sql(table);
            sqlx::raw_sql(sqlx::AssertSqlSafe(&*drop))
                .execute(pool)
                .await
                .unwrap();
        })
    }

    fn stored<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Option<Stored>> {
        Box::pin(async move {
            sqlx::query_as(sqlx::AssertSqlSafe(&*stored_sql(table)))
                .bind(key)
                .fetch_optional(pool)
                .await
                .unwrap()
        })
    }
}

/// An outbox on a fresh table; dropped (or its directory removed) by [`Env::finish`].
struct Env<DB: Fixture> {
    outbox: Outbox<DB>,
    dir: Option<PathBuf>,
}

impl<DB: Fixture> Env<DB> {
    async fn new() -> Self {
        let (pool, table, dir) = DB::open().await;
        let outbox = Outbox::new(pool, &table).unwrap();
        outbox.migrate().await.unwrap();
        Self { outbox, dir }
    }

    /// Enqueues `messages` in one committed transaction; answers their keys.
    async fn commit(&self, messages: Vec<Message>) -> Vec<String> {
        let mut tx = self.outbox.pool().begin().await.unwrap();
        let mut keys = Vec::new();
        for message in messages {
            let enqueued = self.outbox.enqueue(&mut *tx, message).await.unwrap();
            keys.push(enqueued.key().to_owned());
        }
        tx.commit().await.unwrap();
        keys
    }

    async fn state(&self, key: &str) -> (MessageState, u32, Option<u16>, Option<String>) {
        let summary = self.outbox.get(key).await.unwrap().expect("the message");
        (
            summary.state,
            summary.attempts,
            summary.last_status,
            summary.last_error,
        )
    }

    async fn stored(&self, key: &str) -> Option<Stored> {
        DB::stored(self.outbox.pool(), self.outbox.table(), key).await
    }

    async fn finish(self) {
        DB::drop_table(self.outbox.pool(), self.outbox.table()).await;
        self.outbox.pool().close().await;
        if let Some(dir) = self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// What a test receiver saw: the `Idempotency-Key` of every request, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn record(&self, headers: &HeaderMap) -> usize {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut seen = self.0.lock().unwrap();
        seen.push(key.clone());
        seen.iter().filter(|k| **k == key).count()
    }

    fn keys(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// A receiver at `/hook` answering `503` to the first `failures` requests of each key (a JSON
/// body with a credential-named field), then `status` (the body `created`).
async fn receiver(seen: Seen, failures: usize, status: StatusCode) -> String {
    let app = Router::new()
        .route(
            "/hook",
            post(
                move |State(seen): State<Seen>, headers: HeaderMap| async move {
                    let n = seen.record(&headers);
                    if n <= failures {
                        let busy = format!(r#"{{"busy": {n}, "token": "tk_answer_secret"}}"#);
                        (StatusCode::SERVICE_UNAVAILABLE, busy)
                    } else {
                        (status, "created".to_owned())
                    }
                },
            ),
        )
        .with_state(seen);
    serve(app).await
}

/// Runs relay rounds until `done` holds for the message `key`, failing after 20 s.
async fn rounds_until<DB: Fixture>(
    env: &Env<DB>,
    relay: &tower_idempotency_outbox::Relay<DB>,
    key: &str,
    done: impl Fn(MessageState) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        relay.run_once().await.unwrap();
        let (state, ..) = env.state(key).await;
        if done(state) {
            return;
        }
        assert!(Instant::now() < deadline, "{key} stayed {state:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn fast<DB: Fixture>(outbox: &Outbox<DB>) -> tower_idempotency_outbox::Relay<DB> {
    outbox
        .relay()
        .backoff(Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
        .attempt_timeout(Duration::from_secs(5))
        .lease(Duration::from_secs(10))
}

/// A rolled-back transaction leaves no message; a committed one leaves each, keyed by its
/// scope and index or its own key, stored exactly as it was enqueued; a key enqueued again
/// with other content leaves the stored message as it was.
async fn enqueued_exactly_when_committed<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    let outbox = &env.outbox;
    let url = "http://127.0.0.1:9/hook";

    let mut tx = outbox.pool().begin().await.unwrap();
    let mut scope = outbox.scope("evt_rolled_back");
    scope
        .enqueue(&mut *tx, Message::post_json(url, &serde_json::json!({})))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(outbox.get("evt_rolled_back/0").await.unwrap(), None);

    let mut tx = outbox.pool().begin().await.unwrap();
    let mut scope = outbox.scope("evt_1");
    let first = scope
        .enqueue(
            &mut *tx,
            Message::http(http::Method::PUT, url)
                .header("x-trace", "t-1")
                .header("content-type", "text/plain")
                .body("first body"),
        )
        .await
        .unwrap();
    let second = scope
        .enqueue(&mut *tx, Message::dispatch("mail", "hello"))
        .await
        .unwrap();
    let own = scope
        .enqueue(&mut *tx, Message::dispatch("mail", "x").key("refund-ch_1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!((first.key(), second.key()), ("evt_1/0", "evt_1/1"));
    assert_eq!(own.key(), "refund-ch_1");
    let summary = outbox.get("evt_1/0").await.unwrap().unwrap();
    assert_eq!(summary.scope.as_deref(), Some("evt_1"));
    assert_eq!(summary.state, MessageState::Pending);
    let http_row: Stored = (
        Some("PUT".to_owned()),
        Some(url.to_owned()),
        None,
        r#"[["x-trace","t-1"],["content-type","text/plain"]]"#.to_owned(),
        b"first body".to_vec(),
    );
    let refund_row: Stored = (
        None,
        None,
        Some("mail".to_owned()),
        "[]".to_owned(),
        b"x".to_vec(),
    );
    assert_eq!(env.stored("evt_1/0").await, Some(http_row.clone()));
    assert_eq!(
        env.stored("evt_1/1").await,
        Some((
            None,
            None,
            Some("mail".to_owned()),
            "[]".to_owned(),
            b"hello".to_vec()
        ))
    );
    assert_eq!(env.stored("refund-ch_1").await, Some(refund_row.clone()));

    // The same keys enqueued again with other content: refused, and nothing stored changes.
    let mut tx = outbox.pool().begin().await.unwrap();
    let other = Message::dispatch("mail", "again")
        .header("x-other", "1")
        .key("refund-ch_1");
    let again = outbox.enqueue(&mut *tx, other).await;
    let mut scope = outbox.scope("evt_1");
    let moved = Message::http(http::Method::POST, "http://127.0.0.1:9/elsewhere");
    let renumbered = scope.enqueue(&mut *tx, moved).await;
    tx.commit().await.unwrap();
    assert_eq!(env.stored("refund-ch_1").await, Some(refund_row));
    assert_eq!(env.stored("evt_1/0").await, Some(http_row));
    assert!(matches!(again, Err(OutboxError::KeyConflict)), "{again:?}");
    assert!(
        matches!(renumbered, Err(OutboxError::KeyConflict)),
        "{renumbered:?}"
    );
    assert_eq!(outbox.counts().await.unwrap().pending, 3);

    let mut tx = outbox.pool().begin().await.unwrap();
    let bad_key = Message::dispatch("mail", "x").key("has space");
    assert!(matches!(
        outbox.enqueue(&mut *tx, bad_key).await,
        Err(OutboxError::InvalidKey)
    ));
    let bad_url = Message::http(http::Method::POST, "/relative");
    assert!(matches!(
        outbox.enqueue(&mut *tx, bad_url).await,
        Err(OutboxError::InvalidUrl)
    ));
    drop(tx);
    env.finish().await;
}

/// `enqueue` says what it did: the first enqueue of a key inserts it, the same message again
/// (in another transaction, or the same one) is already there and stays one row, and the key
/// with a different method, URL, topic, header or body is a conflict that changes nothing.
/// A message without a key of its own gets a UUIDv7.
async fn enqueue_reports_inserted_already_there_or_conflict<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    let outbox = &env.outbox;
    let url = "http://127.0.0.1:9/orders";
    let message = || {
        Message::post_json(url, &serde_json::json!({ "sku": "a" }))
            .header("x-tenant", "acme")
            .key("order-1")
    };
    let enqueue = |message: Message| async move {
        let mut tx = outbox.pool().begin().await.unwrap();
        let result = outbox.enqueue(&mut *tx, message).await;
        tx.commit().await.unwrap();
        result
    };
    assert_eq!(
        enqueue(message()).await.unwrap(),
        Enqueued::Inserted("order-1".to_owned())
    );
    let stored = env.stored("order-1").await.expect("stored");
    assert_eq!(
        enqueue(message()).await.unwrap(),
        Enqueued::AlreadyThere("order-1".to_owned())
    );
    // Twice in one transaction: the second sees the first.
    let mut tx = outbox.pool().begin().await.unwrap();
    let same = Message::dispatch("mail", "m").key("mail-1");
    let inserted = outbox.enqueue(&mut *tx, same.clone()).await.unwrap();
    let again = outbox.enqueue(&mut *tx, same).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(inserted, Enqueued::Inserted("mail-1".to_owned()));
    assert_eq!(again, Enqueued::AlreadyThere("mail-1".to_owned()));
    assert!(again.key() == "mail-1" && !again.inserted() && inserted.inserted());

    let different = [
        Message::post_json(url, &serde_json::json!({ "sku": "b" }))
            .header("x-tenant", "acme")
            .key("order-1"),
        Message::post_json(
            "http://127.0.0.1:9/other",
            &serde_json::json!({ "sku": "a" }),
        )
        .header("x-tenant", "acme")
        .key("order-1"),
        Message::http(http::Method::PUT, url)
            .header("content-type", "application/json")
            .header("x-tenant", "acme")
            .body(r#"{"sku":"a"}"#)
            .key("order-1"),
        Message::post_json(url, &serde_json::json!({ "sku": "a" }))
            .header("x-tenant", "other")
            .key("order-1"),
        Message::dispatch("orders", r#"{"sku":"a"}"#)
            .header("x-tenant", "acme")
            .key("order-1"),
    ];
    for message in different {
        let result = enqueue(message.clone()).await;
        assert!(
            matches!(result, Err(OutboxError::KeyConflict)),
            "{message:?}: {result:?}"
        );
    }
    assert_eq!(env.stored("order-1").await, Some(stored));
    assert_eq!(outbox.counts().await.unwrap().pending, 2);

    let generated = enqueue(Message::dispatch("mail", "no key")).await.unwrap();
    let uuid = uuid::Uuid::parse_str(generated.key()).expect("a UUID");
    assert_eq!(uuid.get_version(), Some(uuid::Version::SortRand));
    assert_eq!(generated, Enqueued::Inserted(uuid.to_string()));
    env.finish().await;
}

/// A receiver that answers `503` twice gets the message a third time, with the same
/// `Idempotency-Key` each time; the message is then delivered with its status.
async fn retries_a_failing_receiver_with_the_same_key<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    let seen = Seen::default();
    let base = receiver(seen.clone(), 2, StatusCode::CREATED).await;
    let message = Message::post_json(format!("{base}/hook"), &serde_json::json!({"n": 1}));
    let mut tx = env.outbox.pool().begin().await.unwrap();
    let key = env
        .outbox
        .scope("evt_flaky")
        .enqueue(&mut *tx, message)
        .await
        .unwrap()
        .into_key();
    tx.commit().await.unwrap();

    let relay = fast(&env.outbox).max_attempts(5);
    rounds_until(&env, &relay, &key, |s| s == MessageState::Delivered).await;
    let (_, attempts, status, error) = env.state(&key).await;
    assert_eq!((attempts, status, error), (3, Some(201), None));
    assert_eq!(seen.keys(), ["evt_flaky/0"; 3]);

    // Each attempt is on record with its status and the start of its answer; shown to an
    // operator, the answer's credential field is masked.
    let recorded = env.outbox.attempts(&key).await.unwrap();
    let summary: Vec<(u32, &str, Option<i32>)> = recorded
        .iter()
        .map(|a| (a.attempt, a.outcome.as_str(), a.status))
        .collect();
    assert_eq!(
        summary,
        [
            (1, "retried", Some(503)),
            (2, "retried", Some(503)),
            (3, "done", Some(201))
        ]
    );
    assert!(recorded[0]
        .response
        .as_deref()
        .unwrap()
        .contains("tk_answer_secret"));
    assert!(recorded[0].error.as_deref().unwrap().contains("503"));
    assert_eq!(recorded[2].response.as_deref(), Some("created"));
    let shown = env.outbox.message(&key).await.unwrap().unwrap().history;
    let answer = shown[1].response.as_deref().unwrap();
    assert!(
        answer.contains(r#""busy":2"#) && !answer.contains("tk_answer_secret"),
        "{answer}"
    );
    env.finish().await;
}

/// A receiver that always answers `500` fails the message after its attempts; one that answers
/// `400` fails it at once. The admin router lists them, refuses a form-encoded retry, retries
/// one with a JSON body and discards the other.
async fn failed_messages_are_operated<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    let (seen, refused) = (Seen::default(), Seen::default());
    let broken = receiver(seen.clone(), 0, StatusCode::INTERNAL_SERVER_ERROR).await;
    let refusing = receiver(refused.clone(), 0, StatusCode::BAD_REQUEST).await;
    let keys = env
        .commit(vec![
            Message::http(http::Method::POST, format!("{broken}/hook")).key("to-broken"),
            Message::http(http::Method::POST, format!("{refusing}/hook")).key("to-refusing"),
        ])
        .await;
    let relay = fast(&env.outbox).max_attempts(2);
    rounds_until(&env, &relay, &keys[0], |s| s == MessageState::Failed).await;
    rounds_until(&env, &relay, &keys[1], |s| s == MessageState::Failed).await;
    let (_, attempts, status, error) = env.state("to-broken").await;
    assert_eq!(attempts, 2);
    assert_eq!(status, Some(500));
    assert_eq!(error.as_deref(), Some("the receiver answered 500"));
    let (_, attempts, status, _) = env.state("to-refusing").await;
    assert_eq!((attempts, status), (1, Some(400)));
    assert_eq!(seen.keys().len(), 2);
    assert_eq!(refused.keys().len(), 1);

    let admin = serve(admin::router(env.outbox.clone())).await;
    let client = reqwest::Client::new();
    let get_json = |path: &str| {
        let request = client.get(format!("{admin}/{path}")).send();
        async move {
            let bytes = request.await.unwrap().bytes().await.unwrap();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        }
    };
    let failed = get_json("failed").await;
    let listed: Vec<&str> = failed
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["key"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["to-broken", "to-refusing"]);
    assert!(failed[0].get("body").is_none() && failed[0].get("headers").is_none());

    // What a cross-site form can send: refused, and nothing changes.
    let form = client
        .post(format!("{admin}/retry"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("key=to-broken")
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), 415);
    assert_eq!(env.state("to-broken").await.0, MessageState::Failed);

    let post_json = |path: &str, body: serde_json::Value| {
        client
            .post(format!("{admin}/{path}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let json = |path: &str, key: &str| post_json(path, serde_json::json!({ "key": key }));
    assert_eq!(json("retry", "to-broken").await.unwrap().status(), 202);
    assert_eq!(json("retry", "to-broken").await.unwrap().status(), 404);
    let (state, attempts, ..) = env.state("to-broken").await;
    assert_eq!((state, attempts), (MessageState::Pending, 0));
    assert_eq!(json("discard", "to-refusing").await.unwrap().status(), 200);
    assert_eq!(
        json("discard", "never-enqueued").await.unwrap().status(),
        404
    );
    assert_eq!(env.state("to-refusing").await.0, MessageState::Discarded);
    // Discarded: never attempted again.
    relay.run_once().await.unwrap();
    assert_eq!(refused.keys().len(), 1);
    let counts = get_json("counts").await;
    assert_eq!(counts["discarded"], 1);
    // Finished in an earlier millisecond than the purge's cut-off.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let purge = post_json("purge", serde_json::json!({ "older_than_secs": 0 }))
        .await
        .unwrap();
    assert_eq!(purge.status(), 200);
    let purged: serde_json::Value = serde_json::from_slice(&purge.bytes().await.unwrap()).unwrap();
    assert_eq!(purged["purged"], 1);
    assert_eq!(env.outbox.get("to-refusing").await.unwrap(), None);
    env.finish().await;
}

/// Dispatched messages reach the dispatcher with their key and payload; a dispatcher's
/// permanent error fails the message at once.
async fn dispatched_messages_reach_the_dispatcher<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    /// Key, topic and payload of each dispatched message.
    type Dispatched = Vec<(String, String, Vec<u8>)>;
    let got: Arc<Mutex<Dispatched>> = Arc::default();
    let dispatcher = {
        let got = got.clone();
        move |message: Dispatch| {
            let got = got.clone();
            async move {
                if message.topic == "refused" {
                    return Err(DispatchError::permanent("no such mailbox"));
                }
                got.lock()
                    .unwrap()
                    .push((message.key, message.topic, message.payload.to_vec()));
                Ok(())
            }
        }
    };
    env.commit(vec![
        Message::dispatch("mail", "hello").key("mail-1"),
        Message::dispatch("refused", "x").key("mail-2"),
    ])
    .await;
    let relay = fast(&env.outbox).dispatcher(dispatcher);
    rounds_until(&env, &relay, "mail-1", |s| s == MessageState::Delivered).await;
    rounds_until(&env, &relay, "mail-2", |s| s == MessageState::Failed).await;
    assert_eq!(
        *got.lock().unwrap(),
        [("mail-1".to_owned(), "mail".to_owned(), b"hello".to_vec())]
    );
    let (_, attempts, _, error) = env.state("mail-2").await;
    assert_eq!((attempts, error.as_deref()), (1, Some("no such mailbox")));
    env.finish().await;
}

/// A spawned relay that polls once an hour delivers what a committed transaction enqueued
/// as soon as `Outbox::wake` is called, and drains. The message is committed after the relay's
/// first round has ended (it delivered a message committed before the spawn), so only the wake
/// can start the round that delivers it.
async fn a_spawned_relay_delivers<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    let seen = Seen::default();
    let base = receiver(seen.clone(), 0, StatusCode::OK).await;
    let hook = format!("{base}/hook");
    env.commit(vec![Message::http(http::Method::POST, &hook).key("first")])
        .await;
    let relay = fast(&env.outbox)
        .poll_every(Duration::from_secs(3600))
        .spawn();
    // The first round claims `first` (and nothing else: nothing else is committed yet).
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.state("first").await.0 != MessageState::Delivered {
        assert!(Instant::now() < deadline, "the first round did not deliver");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    env.commit(vec![Message::http(http::Method::POST, &hook).key("woken")])
        .await;
    env.outbox.wake();
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.state("woken").await.0 != MessageState::Delivered {
        assert!(Instant::now() < deadline, "the wake did not start a round");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(relay.drain(Duration::from_secs(5)).await);
    assert_eq!(seen.keys(), ["first", "woken"]);
    env.finish().await;
}

/// What a redirecting target received: method, path and body of each request.
type Received = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

/// A target whose `POST /x` answers `301 Location: /y`, `POST /x308` answers `308 Location:
/// /y`, and `/y` answers `200` to any method; it records every request.
async fn redirecting_target(received: Received) -> String {
    let record = move |method: http::Method, uri: http::Uri, body: axum::body::Bytes| {
        let received = received.clone();
        async move {
            received.lock().unwrap().push((
                method.to_string(),
                uri.path().to_owned(),
                body.to_vec(),
            ));
            match uri.path() {
                "/x" => (StatusCode::MOVED_PERMANENTLY, [("location", "/y")]).into_response(),
                "/x308" => (StatusCode::PERMANENT_REDIRECT, [("location", "/y")]).into_response(),
                _ => StatusCode::OK.into_response(),
            }
        }
    };
    serve(Router::new().fallback(record)).await
}

/// A `301` to `/y` is a failed attempt naming the status and the location, not a delivery:
/// the relay neither follows it as a bodiless `GET` nor sends anything to `/y`. With same-method
/// redirects on, a `308` to `/y` delivers the `POST` with its body and key there, and a `301`
/// still fails the attempt.
async fn a_redirect_is_not_a_delivery<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    let received = Received::default();
    let base = redirecting_target(received.clone()).await;
    let post = |path: &str, key: &str| {
        Message::http(http::Method::POST, format!("{base}{path}"))
            .body("the order")
            .key(key)
    };
    env.commit(vec![post("/x", "moved")]).await;
    let round = fast(&env.outbox).run_once().await.unwrap();
    assert_eq!((round.claimed, round.delivered, round.retried), (1, 0, 1));
    let (state, attempts, status, error) = env.state("moved").await;
    assert_eq!(
        (state, attempts, status),
        (MessageState::Pending, 1, Some(301))
    );
    let error = error.expect("an error");
    assert!(error.contains("301") && error.contains("/y"), "{error}");
    assert_eq!(
        *received.lock().unwrap(),
        [("POST".to_owned(), "/x".to_owned(), b"the order".to_vec())]
    );

    received.lock().unwrap().clear();
    env.commit(vec![post("/x308", "kept"), post("/x", "moved-again")])
        .await;
    let relay = fast(&env.outbox).follow_same_method_redirects();
    rounds_until(&env, &relay, "kept", |s| s == MessageState::Delivered).await;
    assert_eq!(env.state("kept").await.2, Some(200));
    let (state, _, status, _) = env.state("moved-again").await;
    assert_eq!((state, status), (MessageState::Pending, Some(301)));
    let received = received.lock().unwrap().clone();
    let at_y: Vec<_> = received.iter().filter(|r| r.1 == "/y").collect();
    assert_eq!(
        at_y,
        [&("POST".to_owned(), "/y".to_owned(), b"the order".to_vec())]
    );
    env.finish().await;
}

/// A transactional route's handler enqueues through its `IdempotentTx`, scoped by the request's
/// idempotency key: an answer the layer commits keeps the message, one it rolls back (a `422`)
/// leaves none, and a replay of the committed request enqueues nothing more.
async fn enqueued_from_a_transactional_route<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    let keys_table = format!("{}_keys", env.outbox.table());
    let layer = DB::transactional(env.outbox.pool(), &keys_table).await;
    async fn pay<DB: Fixture>(
        State(outbox): State<Outbox<DB>>,
        headers: HeaderMap,
        mut tx: IdempotentTx<DB>,
        body: String,
    ) -> StatusCode {
        let key = headers["idempotency-key"].to_str().unwrap().to_owned();
        let message = Message::dispatch("ledger", body.clone());
        outbox
            .scope(format!("pay-{key}"))
            .enqueue(&mut *tx, message)
            .await
            .unwrap();
        if body == "refuse" {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::CREATED
        }
    }
    let app = Router::new()
        .route("/pay", post(pay::<DB>))
        .route_layer(layer)
        .with_state(env.outbox.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let send = |key: &str, body: &str| {
        client
            .post(format!("{base}/pay"))
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
    };
    assert_eq!(send("k1", "ok").await.unwrap().status(), 201);
    assert_eq!(send("k2", "refuse").await.unwrap().status(), 422);
    let replay = send("k1", "ok").await.unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let pending = env.outbox.list(MessageState::Pending, 10).await.unwrap();
    let keys: Vec<&str> = pending.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, ["pay-k1/0"]);
    DB::drop_table(env.outbox.pool(), &keys_table).await;
    env.finish().await;
}

/// The operator's listing pages newest first with a cursor that neither repeats nor skips a
/// message while states change; one message's detail redacts credential headers and
/// pretty-prints its body; the page and JSON routes serve both and refuse a bad cursor.
async fn messages_are_paged_and_shown<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    for n in 0..5 {
        env.commit(vec![Message::post_json(
            "http://127.0.0.1:9/hook",
            &serde_json::json!({ "n": n, "note": "<b>x</b>" }),
        )
        .key(format!("m{n}"))
        .header("authorization", "Bearer very-secret")
        .header("X-Api-Key", "k-secret")
        .header("x-note", "kept")])
            .await;
    }
    let mut expected = env.outbox.list(MessageState::Pending, 100).await.unwrap();
    expected.sort_by(|a, b| (b.created_at_ms, &b.key).cmp(&(a.created_at_ms, &a.key)));
    let expected: Vec<String> = expected.into_iter().map(|m| m.key).collect();
    assert_eq!(expected.len(), 5);

    let (mut listed, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let page = env
            .outbox
            .messages(None, cursor.as_deref(), 2)
            .await
            .unwrap();
        pages += 1;
        listed.extend(page.messages.iter().map(|m| m.key.clone()));
        // A state change between pages moves nothing in an any-state listing.
        if pages == 1 {
            assert!(env.outbox.discard(&expected[3]).await.unwrap());
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(listed, expected, "newest first, each once");
    assert_eq!(pages, 3);
    let discarded = env
        .outbox
        .messages(Some(MessageState::Discarded), None, 10)
        .await
        .unwrap();
    let discarded: Vec<&str> = discarded.messages.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(discarded, [expected[3].as_str()]);
    assert!(matches!(
        env.outbox.messages(None, Some("zz"), 10).await,
        Err(tower_idempotency_outbox::OutboxError::InvalidCursor)
    ));

    let detail = env.outbox.message("m2").await.unwrap().expect("m2");
    assert_eq!(
        detail.headers,
        [
            ("content-type".to_owned(), "application/json".to_owned()),
            ("authorization".to_owned(), "[redacted]".to_owned()),
            ("X-Api-Key".to_owned(), "[redacted]".to_owned()),
            ("x-note".to_owned(), "kept".to_owned()),
        ]
    );
    assert_eq!(
        detail.body_pretty.as_deref(),
        Some("{\n  \"n\": 2,\n  \"note\": \"<b>x</b>\"\n}")
    );
    assert_eq!(env.outbox.message("absent").await.unwrap(), None);

    let admin = serve(admin::router(env.outbox.clone())).await;
    let client = reqwest::Client::new();
    let get = |path: String| {
        let request = client.get(format!("{admin}/{path}")).send();
        async move {
            let response = request.await.unwrap();
            let status = response.status().as_u16();
            let text = String::from_utf8(response.bytes().await.unwrap().to_vec()).unwrap();
            (status, text)
        }
    };
    // The secret header's value shows nowhere, in JSON or in HTML.
    let redacted = |body: &str| body.contains("[redacted]") && !body.contains("very-secret");
    let (status, text) = get("messages?state=&limit=2".into()).await;
    assert_eq!(status, 200);
    let page: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(page["messages"][0]["key"], expected[0].as_str());
    assert!(page["next_cursor"].is_string());
    assert_eq!(get("messages?cursor=zz".into()).await.0, 400);
    assert_eq!(get("messages?state=bogus".into()).await.0, 400);
    let (status, text) = get("message?key=m2".into()).await;
    assert_eq!(status, 200);
    assert!(redacted(&text), "{text}");
    assert_eq!(get("message?key=absent".into()).await.0, 404);
    let (status, html) = get("page?state=pending".into()).await;
    assert_eq!(status, 200);
    assert!(
        html.contains(&format!("data-key=\"{}\"", expected[0]))
            && !html.contains(&format!("data-key=\"{}\"", expected[3])),
        "{html}"
    );
    assert_eq!(get("page?cursor=zz".into()).await.0, 400);
    let (status, html) = get("detail?key=m2".into()).await;
    assert_eq!(status, 200);
    assert!(redacted(&html), "{html}");
    assert!(html.contains("&lt;b&gt;x&lt;/b&gt;"), "{html}");
    assert_eq!(get("detail?key=absent".into()).await.0, 404);
    env.finish().await;
}

/// A paused host's messages stay pending with no attempt spent while another host's are
/// delivered; a second handle on the table (a restart) sees the pause and resumes it; the
/// resumed message is delivered once.
async fn a_paused_host_is_not_delivered_until_resumed<DB: Fixture>() {
    let env = Env::<DB>::new().await;
    let seen = Seen::default();
    let base = receiver(seen.clone(), 0, StatusCode::CREATED).await;
    let port = base.rsplit(':').next().unwrap();
    assert!(env.outbox.pause("127.0.0.1", "tester").await.unwrap());
    assert!(!env.outbox.pause("127.0.0.1", "tester").await.unwrap());
    assert!(matches!(
        env.outbox.pause(" ", "tester").await,
        Err(OutboxError::InvalidScope(_))
    ));
    let keys = env
        .commit(vec![
            Message::post_json(format!("{base}/hook"), &serde_json::json!({"n": 1})).key("paused"),
            Message::post_json(
                format!("http://localhost:{port}/hook"),
                &serde_json::json!({"n": 2}),
            )
            .key("open"),
        ])
        .await;
    let relay = fast(&env.outbox);
    rounds_until(&env, &relay, &keys[1], |s| s == MessageState::Delivered).await;
    // Every round since claimed nothing: the paused message is parked.
    assert_eq!(relay.run_once().await.unwrap().claimed, 0);
    assert_eq!(
        env.state(&keys[0]).await,
        (MessageState::Pending, 0, None, None)
    );
    assert_eq!(seen.keys(), ["open"]);
    assert!(env.outbox.attempts(&keys[0]).await.unwrap().is_empty());

    let restarted = Outbox::<DB>::new(env.outbox.pool().clone(), env.outbox.table()).unwrap();
    let pauses = restarted.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(
        (pauses[0].scope.as_str(), pauses[0].by.as_str()),
        ("127.0.0.1", "tester")
    );
    assert!(restarted.resume("127.0.0.1").await.unwrap());
    assert!(!restarted.resume("127.0.0.1").await.unwrap());
    rounds_until(&env, &relay, &keys[0], |s| s == MessageState::Delivered).await;
    assert_eq!(env.state(&keys[0]).await.1, 1);
    assert_eq!(seen.keys(), ["open", "paused"]);
    env.finish().await;
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name::<super::sqlx::Sqlite>().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name::<super::sqlx::Postgres>().await;
                }
            )*
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if tower_idempotency_testkit::mysql_or_skip(concat!(
                        "outbox on MySQL: ",
                        stringify!($name)
                    )) {
                        super::$name::<super::sqlx::MySql>().await;
                    }
                }
            )*
        }
    };
}

on_both!(
    enqueued_exactly_when_committed,
    enqueue_reports_inserted_already_there_or_conflict,
    enqueued_from_a_transactional_route,
    retries_a_failing_receiver_with_the_same_key,
    failed_messages_are_operated,
    messages_are_paged_and_shown,
    dispatched_messages_reach_the_dispatcher,
    a_spawned_relay_delivers,
    a_redirect_is_not_a_delivery,
    a_paused_host_is_not_delivered_until_resumed,
);

/// SQLite: another connection holds the write lock (`BEGIN IMMEDIATE`) from the moment the
/// target has the request until well past the relay pool's busy timeout. The relay keeps
/// retrying the record of the delivery, and once the lock is released the message is
/// delivered, sent exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_records_a_delivery_made_while_the_write_lock_is_held() {
    use sqlx::Connection;
    let busy = Duration::from_millis(100);
    let dir = std::env::temp_dir().join(format!("tidem-outbox-{}", random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&format!(
        "sqlite://{}/outbox.db",
        dir.display()
    ))
    .unwrap()
    .create_if_missing(true)
    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
    .busy_timeout(busy);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options.clone())
        .await
        .unwrap();
    let outbox = Outbox::new(pool, "outbox").unwrap();
    outbox.migrate().await.unwrap();
    let env = Env::<sqlx::Sqlite> {
        outbox,
        dir: Some(dir),
    };

    // The target tells the test when a request arrived and answers once the test says so.
    let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel::<String>();
    let answer = Arc::new(tokio::sync::Semaphore::new(0));
    let app = Router::new().route(
        "/hook",
        post({
            let answer = answer.clone();
            move |headers: HeaderMap| {
                let (arrived, answer) = (arrived.clone(), answer.clone());
                async move {
                    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                    arrived.send(key).unwrap();
                    answer.acquire().await.unwrap().forget();
                    StatusCode::OK
                }
            }
        }),
    );
    let base = serve(app).await;
    env.commit(vec![Message::http(
        http::Method::POST,
        format!("{base}/hook"),
    )
    .key("under-lock")])
        .await;

    let relay = fast(&env.outbox).lease(Duration::from_secs(30));
    let round = tokio::spawn({
        let relay = relay.clone();
        async move { relay.run_once().await }
    });
    assert_eq!(arrivals.recv().await.as_deref(), Some("under-lock"));
    let mut locker = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut locker)
        .await
        .unwrap();
    answer.add_permits(1);
    // The lock is held for ten busy timeouts: the relay's record of the delivery waits.
    tokio::time::sleep(busy * 10).await;
    assert!(
        !round.is_finished(),
        "the round ended with its record unwritten"
    );
    sqlx::raw_sql("COMMIT").execute(&mut locker).await.unwrap();
    let round = round.await.unwrap().unwrap();
    assert_eq!(
        (round.claimed, round.delivered, round.unrecorded),
        (1, 1, 0)
    );
    let (state, attempts, status, error) = env.state("under-lock").await;
    assert_eq!(
        (state, attempts, status, error),
        (MessageState::Delivered, 1, Some(200), None)
    );
    // Delivered: nothing is claimed or sent again.
    let round = relay.run_once().await.unwrap();
    assert_eq!(round.claimed, 0);
    assert!(arrivals.try_recv().is_err(), "the message was sent twice");
    locker.close().await.unwrap();
    env.finish().await;
}

/// SQLite: while a writer elsewhere in the process holds the database file's writer gate (as the
/// inbox's acknowledgements on the same file would), the relay claims nothing, so nothing is
/// sent; once the turn ends the message is claimed, delivered and recorded, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_relay_takes_its_turn_at_the_files_writer_gate() {
    let env = Env::<sqlx::Sqlite>::new().await;
    let seen = Seen::default();
    let base = receiver(seen.clone(), 0, StatusCode::OK).await;
    env.commit(vec![Message::http(
        http::Method::POST,
        format!("{base}/hook"),
    )
    .key("behind-the-gate")])
        .await;
    let path = env
        .outbox
        .pool()
        .connect_options()
        .get_filename()
        .to_owned();
    let turn = tower_idempotency_jobs::WriteGate::for_file(&path)
        .turn()
        .await;
    assert!(turn.holds());
    let relay = fast(&env.outbox);
    let mut round = tokio::spawn({
        let relay = relay.clone();
        async move { relay.run_once().await }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut round)
            .await
            .is_err(),
        "the relay's round ended while another writer held the file's gate"
    );
    assert!(
        seen.keys().is_empty(),
        "a message was sent while its claim had to wait"
    );
    drop(turn);
    let round = round.await.unwrap().unwrap();
    assert_eq!((round.claimed, round.delivered), (1, 1));
    assert_eq!(seen.keys(), ["behind-the-gate"]);
    let (state, attempts, ..) = env.state("behind-the-gate").await;
    assert_eq!((state, attempts), (MessageState::Delivered, 1));
    env.finish().await;
}

/// Executions per `Idempotency-Key` behind the client-key layer, and requests received.
#[derive(Clone, Default)]
struct Orders {
    executions: Arc<Mutex<HashMap<String, usize>>>,
    requests: Arc<Mutex<usize>>,
}

/// Four relays share one Postgres outbox of 60 messages, with a lease shorter than the
/// receiver's handler for ten of them: their leases lapse mid-delivery and other relays deliver
/// them again (each relay's batches are disjoint only while their leases last). The receiver's
/// client-key layer runs each order once, and every message ends delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_relays_on_postgres_deliver_each_message_once_at_the_receiver() {
    let requests =
        four_relays_deliver_60_messages::<sqlx::Postgres>(Duration::from_millis(60)).await;
    assert!(
        requests > 60,
        "no message was delivered twice ({requests} requests): the test proved nothing"
    );
    eprintln!("60 messages, {requests} requests, each order run once");
}

/// With leases longer than any delivery, four relays' batches are disjoint (`FOR UPDATE SKIP
/// LOCKED`): the receiver gets exactly one request per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_relays_on_postgres_claim_disjoint_batches() {
    let requests = four_relays_deliver_60_messages::<sqlx::Postgres>(Duration::from_secs(30)).await;
    assert_eq!(requests, 60);
}

/// Four relays on one MySQL outbox, leases lapsing mid-delivery: each order runs once.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_relays_on_mysql_deliver_each_message_once_at_the_receiver() {
    if !tower_idempotency_testkit::mysql_or_skip("several relays on MySQL") {
        return;
    }
    let requests = four_relays_deliver_60_messages::<sqlx::MySql>(Duration::from_millis(60)).await;
    assert!(
        requests > 60,
        "no message was delivered twice ({requests} requests): the test proved nothing"
    );
}

/// With long leases, four relays' batches on MySQL are disjoint (`FOR UPDATE SKIP LOCKED`).
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_relays_on_mysql_claim_disjoint_batches() {
    if !tower_idempotency_testkit::mysql_or_skip("several relays on MySQL") {
        return;
    }
    let requests = four_relays_deliver_60_messages::<sqlx::MySql>(Duration::from_secs(30)).await;
    assert_eq!(requests, 60);
}

/// Four spawned relays with `lease` deliver 60 messages to a client-key route whose first ten
/// orders take 600 ms and the others 20 ms; each order runs once. Answers the requests the
/// route received.
async fn four_relays_deliver_60_messages<DB: Fixture>(lease: Duration) -> usize {
    let env = Env::<DB>::new().await;
    let orders = Orders::default();
    let counted = orders.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move |headers: HeaderMap| {
                let orders = counted.clone();
                async move {
                    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                    // The first orders are slow: their leases lapse while they run, and the
                    // relays that finished their own batches claim them again.
                    let slow = key.len() == "order-0".len();
                    *orders.executions.lock().unwrap().entry(key).or_default() += 1;
                    let millis = if slow { 600 } else { 20 };
                    tokio::time::sleep(Duration::from_millis(millis)).await;
                    StatusCode::CREATED
                }
            }),
        )
        .route_layer(IdempotencyLayer::client_keys(MemoryStore::new()))
        .layer(axum::middleware::map_request({
            let orders = orders.clone();
            move |request: axum::extract::Request| {
                let orders = orders.clone();
                async move {
                    *orders.requests.lock().unwrap() += 1;
                    request
                }
            }
        }));
    let base = serve(app).await;
    let messages = 60;
    let body = serde_json::json!({ "sku": "x" });
    env.commit(
        (0..messages)
            .map(|n| Message::post_json(format!("{base}/orders"), &body).key(format!("order-{n}")))
            .collect(),
    )
    .await;

    let relays: Vec<_> = (0..4)
        .map(|_| {
            fast(&env.outbox)
                .lease(lease)
                .attempt_timeout(Duration::from_secs(2))
                .max_attempts(1000)
                .concurrency(8)
                .poll_every(Duration::from_millis(10))
                .spawn()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = env.outbox.counts().await.unwrap();
        if counts.delivered == messages {
            break;
        }
        assert!(Instant::now() < deadline, "not all delivered: {counts:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for relay in relays {
        relay.drain(Duration::from_secs(5)).await;
    }
    let executions = orders.executions.lock().unwrap().clone();
    assert_eq!(executions.len(), messages as usize);
    assert!(
        executions.values().all(|&n| n == 1),
        "an order ran twice: {executions:?}"
    );
    let requests = *orders.requests.lock().unwrap();
    env.finish().await;
    requests
}
