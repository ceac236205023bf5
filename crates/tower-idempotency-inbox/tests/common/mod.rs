//! Shared fixtures of the inbox tests: a database per backend (the real SQLite file and the
//! shared Postgres, each test with tables of its own), a probe handler, signed Stripe
//! deliveries and a server on a free loopback port.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{
    collections::HashMap,
    future::Future,
    hash::{BuildHasher, RandomState},
    path::PathBuf,
    pin::Pin,
    str::FromStr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{routing::post_service, Router};
use tokio::{
    net::TcpListener,
    sync::{watch, Notify},
};
use tower_idempotency_inbox::{
    Backoff, EventKey, EventState, EventSummary, HandlerError, IdempotentTx, Inbox, InboxDatabase,
    InboxEvent, InboxWorker, WorkerBuilder,
};
use tower_idempotency_sqlx::sqlx::{self, Executor};
use tower_idempotency_webhooks::stripe::{self, StripeVerifier};

pub const SECRET: &str = "whsec_inbox_test_secret_7d1f";

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A handler as the tests' recorders and probes hand it to a worker: a boxed future per event.
pub trait TestHandler<DB: Fixture>:
    Fn(InboxEvent, IdempotentTx<DB>) -> BoxFuture<'static, Result<(), HandlerError>>
    + Send
    + Sync
    + 'static
{
}

impl<DB: Fixture, F> TestHandler<DB> for F where
    F: Fn(InboxEvent, IdempotentTx<DB>) -> BoxFuture<'static, Result<(), HandlerError>>
        + Send
        + Sync
        + 'static
{
}

pub fn suffix() -> String {
    format!("{:012x}", RandomState::new().hash_one(Instant::now()) >> 16)
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A database the tests run on: a pool, an effects table the handler writes through its
/// transaction, and the count of those writes.
pub trait Fixture: InboxDatabase + Sized {
    const LABEL: &'static str;

    /// A pool, a name prefix of this test's own, and a directory to remove at the end.
    fn open() -> BoxFuture<'static, (sqlx::Pool<Self>, String, Option<PathBuf>)>;

    fn create_effects<'a>(pool: &'a sqlx::Pool<Self>, table: &'a str) -> BoxFuture<'a, ()>;

    fn write_effect<'a>(
        tx: &'a mut IdempotentTx<Self>,
        table: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<()>>;

    fn effects<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, i64>;

    /// All rows of the effects table, read through the event's transaction.
    fn read_effects<'a>(
        tx: &'a mut IdempotentTx<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<i64>>;

    fn drop_tables<'a>(pool: &'a sqlx::Pool<Self>, tables: &'a [&'a str]) -> BoxFuture<'a, ()>;

    fn exec<'a>(pool: &'a sqlx::Pool<Self>, sql: &'a str) -> BoxFuture<'a, ()>;
}

/// The fixture's statements, the same text on both databases.
macro_rules! same_sql {
    () => {
        fn create_effects<'a>(pool: &'a sqlx::Pool<Self>, table: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                let sql = format!("CREATE TABLE {table} (event_id text NOT NULL)");
                pool.execute(sqlx::AssertSqlSafe(sql.as_str()))
                    .await
                    .unwrap();
            })
        }

        fn write_effect<'a>(
            tx: &'a mut IdempotentTx<Self>,
            table: &'a str,
            event_id: &'a str,
        ) -> BoxFuture<'a, sqlx::Result<()>> {
            Box::pin(async move {
                let sql = format!("INSERT INTO {table} (event_id) VALUES ($1)");
                sqlx::query(sqlx::AssertSqlSafe(&*sql))
                    .bind(event_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            })
        }

        fn effects<'a>(
            pool: &'a sqlx::Pool<Self>,
            table: &'a str,
            event_id: &'a str,
        ) -> BoxFuture<'a, i64> {
            Box::pin(async move {
                let sql = format!("SELECT count(*) FROM {table} WHERE event_id = $1");
                sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql))
                    .bind(event_id)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            })
        }

        fn read_effects<'a>(
            tx: &'a mut IdempotentTx<Self>,
            table: &'a str,
        ) -> BoxFuture<'a, sqlx::Result<i64>> {
            Box::pin(async move {
                let sql = format!("SELECT count(*) FROM {table}");
                sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql))
                    .fetch_one(&mut **tx)
                    .await
            })
        }

        fn drop_tables<'a>(pool: &'a sqlx::Pool<Self>, tables: &'a [&'a str]) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                for table in tables {
                    for dropped in tower_idempotency_testkit::job_tables(table) {
                        let _ = pool
                            .execute(sqlx::AssertSqlSafe(
                                format!("DROP TABLE IF EXISTS {dropped}").as_str(),
                            ))
                            .await;
                    }
                }
            })
        }

        fn exec<'a>(pool: &'a sqlx::Pool<Self>, sql: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                pool.execute(sqlx::AssertSqlSafe(sql)).await.expect(sql);
            })
        }
    };
}

impl Fixture for sqlx::Sqlite {
    const LABEL: &'static str = "sqlite";

    fn open() -> BoxFuture<'static, (sqlx::Pool<Self>, String, Option<PathBuf>)> {
        Box::pin(async {
            let dir = std::env::temp_dir().join(format!("tidem-inbox-{}", suffix()));
            std::fs::create_dir_all(&dir).unwrap();
            let url = format!("sqlite://{}/inbox.db", dir.display());
            (sqlite_pool(&url).await, format!("t{}", suffix()), Some(dir))
        })
    }

    same_sql!();
}

/// A SQLite pool as docs/inbox.md recommends: WAL, and a busy timeout to wait for the writer.
pub async fn sqlite_pool(url: &str) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .unwrap()
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .unwrap()
}

impl Fixture for sqlx::Postgres {
    const LABEL: &'static str = "postgres";

    fn open() -> BoxFuture<'static, (sqlx::Pool<Self>, String, Option<PathBuf>)> {
        Box::pin(async {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(8)
                .connect(&database_url())
                .await
                .expect("Postgres at DATABASE_URL");
            (pool, format!("t{}", suffix()), None)
        })
    }

    same_sql!();
}

/// MySQL or MariaDB (`MYSQL_URL`), with the server's own isolation level and lock wait
/// timeout, as an application brings its pool.
#[cfg(feature = "mysql")]
impl Fixture for sqlx::MySql {
    const LABEL: &'static str = "mysql";

    fn open() -> BoxFuture<'static, (sqlx::Pool<Self>, String, Option<PathBuf>)> {
        Box::pin(async {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(8)
                .connect(&tower_idempotency_testkit::mysql_url())
                .await
                .expect("MySQL or MariaDB at MYSQL_URL");
            (pool, format!("t{}", suffix()), None)
        })
    }

    fn create_effects<'a>(pool: &'a sqlx::Pool<Self>, table: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let sql = format!("CREATE TABLE {table} (event_id VARCHAR(255) NOT NULL)");
            pool.execute(sqlx::AssertSqlSafe(sql.as_str()))
                .await
                .unwrap();
        })
    }

    fn write_effect<'a>(
        tx: &'a mut IdempotentTx<Self>,
        table: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<()>> {
        Box::pin(async move {
            let sql = format!("INSERT INTO {table} (event_id) VALUES (?)");
            sqlx::query(sqlx::AssertSqlSafe(&*sql))
                .bind(event_id)
                .execute(&mut **tx)
                .await?;
            Ok(())
        })
    }

    fn effects<'a>(
        pool: &'a sqlx::Pool<Self>,
        table: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, i64> {
        Box::pin(async move {
            let sql = format!("SELECT count(*) FROM {table} WHERE event_id = ?");
            sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql))
                .bind(event_id)
                .fetch_one(pool)
                .await
                .unwrap()
        })
    }

    fn read_effects<'a>(
        tx: &'a mut IdempotentTx<Self>,
        table: &'a str,
    ) -> BoxFuture<'a, sqlx::Result<i64>> {
        Box::pin(async move {
            let sql = format!("SELECT count(*) FROM {table}");
            sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql))
                .fetch_one(&mut **tx)
                .await
        })
    }

    fn drop_tables<'a>(pool: &'a sqlx::Pool<Self>, tables: &'a [&'a str]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            for table in tables {
                for dropped in tower_idempotency_testkit::job_tables(table) {
                    let _ = pool
                        .execute(sqlx::AssertSqlSafe(
                            format!("DROP TABLE IF EXISTS {dropped}").as_str(),
                        ))
                        .await;
                }
            }
        })
    }

    fn exec<'a>(pool: &'a sqlx::Pool<Self>, sql: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            pool.execute(sqlx::AssertSqlSafe(sql)).await.expect(sql);
        })
    }
}

/// One test's inbox and effects tables, dropped by [`Setup::cleanup`].
pub struct Setup<DB: Fixture> {
    pub pool: sqlx::Pool<DB>,
    pub inbox: Inbox<DB>,
    pub inbox_table: String,
    pub effects_table: String,
    dir: Option<PathBuf>,
}

impl<DB: Fixture> Setup<DB> {
    pub async fn new() -> Self {
        let (pool, prefix, dir) = DB::open().await;
        let inbox_table = format!("{prefix}_inbox");
        let effects_table = format!("{prefix}_effects");
        let inbox = Inbox::new(pool.clone(), &inbox_table).unwrap();
        inbox.migrate().await.unwrap();
        DB::create_effects(&pool, &effects_table).await;
        Self {
            pool,
            inbox,
            inbox_table,
            effects_table,
            dir,
        }
    }

    pub fn probe(&self) -> Probe {
        Probe::new(&self.effects_table)
    }

    pub async fn effects(&self, event_id: &str) -> i64 {
        DB::effects(&self.pool, &self.effects_table, event_id).await
    }

    /// The stored Stripe event `event_id`, which must exist.
    pub async fn event(&self, event_id: &str) -> EventSummary {
        let key = EventKey::new("stripe", event_id);
        self.inbox
            .get(&key)
            .await
            .unwrap()
            .expect("the event is stored")
    }

    /// Waits until `event_id` is in `state`, failing after 20 s.
    pub async fn wait_for(&self, event_id: &str, state: EventState) -> u32 {
        wait_for_state(&self.inbox, event_id, state).await
    }

    /// Drains `worker`, which must finish within 30 s, and drops the test's tables.
    pub async fn finish(self, worker: InboxWorker) {
        assert!(worker.drain(Duration::from_secs(30)).await);
        self.cleanup().await;
    }

    pub async fn cleanup(self) {
        // The inbox's positions table (the retention's, see `Inbox::purge_batch`) with it.
        let positions = format!("{}_positions", self.inbox_table);
        let attempts = format!("{}_attempts", self.inbox_table);
        let audit = format!("{}_audit", self.inbox_table);
        let tables = [
            &self.inbox_table,
            &positions,
            &attempts,
            &audit,
            &self.effects_table,
        ];
        DB::drop_tables(&self.pool, &tables.map(String::as_str)).await;
        self.pool.close().await;
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Polls the inbox until `event_id` (Stripe) is in `state`; answers its attempts. The bound only
/// turns a hang into a failure: a 300-event ordered backlog on a loaded 2-core machine needs
/// most of it.
pub async fn wait_for_state<DB: InboxDatabase>(
    inbox: &Inbox<DB>,
    event_id: &str,
    state: EventState,
) -> u32 {
    let key = EventKey::new("stripe", event_id);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let event = inbox.get(&key).await.unwrap();
        if let Some(event) = event.as_ref().filter(|event| event.state == state) {
            return event.attempts;
        }
        assert!(
            Instant::now() < deadline,
            "{event_id} never reached {state:?}: {event:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The handler of the tests: counts its runs per event, writes one effect row through the
/// transaction, and misbehaves by event type: `test.poison` always fails after writing,
/// `test.flaky` fails its first two attempts, `test.panic` panics on its first, `test.gated`
/// waits for [`Probe::open_gate`] before writing, `test.slow` takes [`Probe::slow`] before
/// writing, `test.hang` never returns, `test.readwrite` reads the effects table in its
/// transaction before writing, `test.flaky_once` fails its first attempt, `test.permanent` fails
/// permanently, `test.write_hang` writes, then never returns.
#[derive(Clone)]
pub struct Probe {
    effects_table: Arc<str>,
    runs: Arc<Mutex<HashMap<String, u32>>>,
    started: Arc<Notify>,
    gate: Arc<watch::Sender<bool>>,
    slow: Duration,
    /// Event ids in the order their runs started, with when.
    order: Arc<Mutex<Vec<(String, Instant)>>>,
}

impl Probe {
    pub fn new(effects_table: &str) -> Self {
        Self {
            effects_table: effects_table.into(),
            runs: Arc::default(),
            started: Arc::default(),
            gate: Arc::new(watch::channel(false).0),
            slow: Duration::ZERO,
            order: Arc::default(),
        }
    }

    /// How long a `test.slow` run takes.
    pub fn slow(mut self, slow: Duration) -> Self {
        self.slow = slow;
        self
    }

    /// Event ids in the order their runs started, with when.
    pub fn order(&self) -> Vec<(String, Instant)> {
        self.order.lock().unwrap().clone()
    }

    pub fn runs(&self, event_id: &str) -> u32 {
        self.runs
            .lock()
            .unwrap()
            .get(event_id)
            .copied()
            .unwrap_or(0)
    }

    pub fn total_runs(&self) -> u32 {
        self.runs.lock().unwrap().values().sum()
    }

    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    /// Waits until a handler has started `n` runs in total.
    pub async fn wait_started(&self, n: u32) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let notified = self.started.notified();
            if self.total_runs() >= n {
                return;
            }
            tokio::time::timeout_at(deadline, notified)
                .await
                .expect("the handler never started");
        }
    }

    pub fn handler<DB: Fixture>(&self) -> impl TestHandler<DB> {
        let probe = self.clone();
        move |event, tx| {
            let probe = probe.clone();
            Box::pin(async move { probe.run::<DB>(event, tx).await })
        }
    }

    async fn run<DB: Fixture>(
        &self,
        event: InboxEvent,
        mut tx: IdempotentTx<DB>,
    ) -> Result<(), HandlerError> {
        let id = event.key.event_id.clone();
        let run = {
            let mut runs = self.runs.lock().unwrap();
            let run = runs.entry(id.clone()).or_default();
            *run += 1;
            *run
        };
        self.order
            .lock()
            .unwrap()
            .push((id.clone(), Instant::now()));
        tracing::info!("the probe handler runs");
        self.started.notify_waiters();
        let kind = event.json()?["type"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if kind == "test.gated" {
            let mut gate = self.gate.subscribe();
            gate.wait_for(|open| *open).await?;
        }
        match kind.as_str() {
            "test.slow" => tokio::time::sleep(self.slow).await,
            "test.hang" => std::future::pending::<()>().await,
            "test.readwrite" => {
                DB::read_effects(&mut tx, &self.effects_table).await?;
                // Lets other connections commit between the read and the write.
                tokio::task::yield_now().await;
            }
            _ => {}
        }
        DB::write_effect(&mut tx, &self.effects_table, &id).await?;
        match kind.as_str() {
            "test.poison" => Err("poisoned event: refusing it".into()),
            "test.flaky" if run <= 2 => Err(format!("flaky: attempt {run} fails").into()),
            "test.permanent" => Err(tower_idempotency_inbox::permanent(
                "unknown account: do not retry",
            )),
            "test.flaky_once" if run == 1 => Err("flaky: the first attempt fails".into()),
            "test.panic" if run == 1 => panic!("the test handler panics on its first run"),
            "test.write_hang" => std::future::pending().await,
            _ => Ok(()),
        }
    }
}

/// A worker whose retries come a few milliseconds apart, swept every 20 ms.
pub fn quick<DB: Fixture>(builder: WorkerBuilder<DB>) -> WorkerBuilder<DB> {
    quick_retries(builder, Duration::from_millis(20))
}

/// Delivers `ids` (of type `kind`) concurrently; every one must be acknowledged `200`.
pub async fn deliver_all(client: &reqwest::Client, url: &str, ids: &[String], kind: &str) {
    let statuses = futures_util::future::join_all(ids.iter().map(|id| {
        let body = event_body(id, kind);
        async move { deliver(client, url, SECRET, &body).await }
    }))
    .await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
}

/// Sends events to an inbox served over HTTP.
pub struct Sender {
    pub client: reqwest::Client,
    pub url: String,
}

impl Sender {
    pub async fn new<DB: InboxDatabase>(inbox: &Inbox<DB>) -> Self {
        Self {
            client: reqwest::Client::new(),
            url: serve(inbox).await,
        }
    }

    /// `n` events of `kind`, their ids starting with `prefix`, each acknowledged: the ids.
    pub async fn deliver(&self, prefix: &str, n: usize, kind: &str) -> Vec<String> {
        let all = ids(prefix, n);
        deliver_all(&self.client, &self.url, &all, kind).await;
        all
    }

    /// The event `id` of `kind`, acknowledged.
    pub async fn acknowledged(&self, id: &str, kind: &str) {
        let body = event_body(id, kind);
        assert_eq!(
            deliver(&self.client, &self.url, SECRET, &body).await,
            200,
            "{id}"
        );
    }
}

/// Drops the Postgres trigger function `{name}_refuse` a test created, and its trigger with it;
/// SQLite's triggers have no function.
pub async fn drop_refusal<DB: Fixture>(setup: &Setup<DB>, name: &str) {
    drop_refusal_on(&setup.pool, name).await;
}

/// [`drop_refusal`] on `pool`.
pub async fn drop_refusal_on<DB: Fixture>(pool: &sqlx::Pool<DB>, name: &str) {
    if DB::LABEL == "postgres" {
        let sql = format!("DROP FUNCTION IF EXISTS {name}_refuse() CASCADE");
        DB::exec(pool, &sql).await;
    }
}

/// Makes `table` refuse the row of `event_id` (a trigger `{table}_refuse` raises an error): its
/// insert fails as a row the database refuses, the other rows of its batch are fine.
pub async fn refuse_row<DB: Fixture>(pool: &sqlx::Pool<DB>, table: &str, event_id: &str) {
    let trigger = if DB::LABEL == "postgres" {
        format!(
            "CREATE FUNCTION {table}_refuse() RETURNS trigger AS $$ BEGIN \
             IF NEW.event_id = '{event_id}' THEN RAISE EXCEPTION 'refused'; END IF; \
             RETURN NEW; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER {table}_refuse BEFORE INSERT ON {table} \
             FOR EACH ROW EXECUTE FUNCTION {table}_refuse()"
        )
    } else {
        format!(
            "CREATE TRIGGER {table}_refuse BEFORE INSERT ON {table} \
             WHEN NEW.event_id = '{event_id}' BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    };
    DB::exec(pool, &trigger).await;
}

/// `n` event ids starting with `prefix`.
pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}_{i}")).collect()
}

/// The JSON body of `response`.
pub async fn json(response: reqwest::Response) -> serde_json::Value {
    serde_json::from_slice(&response.bytes().await.expect("body")).expect("JSON")
}

/// The response to `GET url`.
pub async fn get(client: &reqwest::Client, url: impl reqwest::IntoUrl) -> reqwest::Response {
    client.get(url).send().await.expect("GET")
}

/// The JSON body of `GET url`.
pub async fn get_json(client: &reqwest::Client, url: impl reqwest::IntoUrl) -> serde_json::Value {
    json(get(client, url).await).await
}

/// A Stripe event body.
pub fn event_body(id: &str, kind: &str) -> String {
    format!(r#"{{"id":"{id}","object":"event","type":"{kind}","data":{{"object":{{}}}}}}"#)
}

/// Posts a Stripe delivery signed with `secret`; answers the status.
pub async fn deliver(client: &reqwest::Client, url: &str, secret: &str, body: &str) -> u16 {
    let now = tower_idempotency_testkit::unix_now();
    let request = client
        .post(url)
        .header(
            stripe::SIGNATURE_HEADER,
            stripe::sign(secret, now, body.as_bytes()),
        )
        .header("content-type", "application/json")
        .body(body.to_owned());
    tower_idempotency_testkit::delivery_status(request).await
}

/// Serves `POST /inbox/stripe` of `inbox` on a free loopback port; answers its URL.
pub async fn serve<DB: InboxDatabase>(inbox: &Inbox<DB>) -> String {
    let app = Router::new().route(
        "/inbox/stripe",
        post_service(inbox.ack(StripeVerifier::new([SECRET]))),
    );
    format!("{}/inbox/stripe", serve_router(app).await)
}

pub async fn serve_router(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    format!("http://{addr}")
}

/// `builder` retrying a few milliseconds apart (5 ms, doubling up to 20 ms), swept every `sweep`.
pub fn quick_retries<DB: Fixture>(
    builder: WorkerBuilder<DB>,
    sweep: Duration,
) -> WorkerBuilder<DB> {
    builder
        .backoff(Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
        .poll_every(sweep)
}

/// One `#[tokio::test]` per named generic test function and database: `sqlite::<name>` and
/// `postgres::<name>` (the including file imports `sqlx`).
#[allow(unused_macros)] // Not every test binary has generic tests.
macro_rules! on_both {
    // The same tests on MySQL or MariaDB too (feature `mysql`): skipped, saying so, when it is
    // unreachable, unless CI=true.
    (and_mysql: $($name:ident),* $(,)?) => {
        on_both!($($name),*);
        #[cfg(feature = "mysql")]
        mod mysql {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let what = concat!("inbox on MySQL: ", stringify!($name));
                    if tower_idempotency_testkit::mysql_or_skip(what) {
                        super::$name::<sqlx::MySql>().await;
                    }
                }
            )*
        }
    };
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name::<sqlx::Sqlite>().await;
                }
            )*
        }
        mod postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name::<sqlx::Postgres>().await;
                }
            )*
        }
    };
}
