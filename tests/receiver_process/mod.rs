//! The reference receiver (`examples/receiver/`) as a child process the crash tests SIGKILL,
//! and a Postgres database of a test's own (the receiver uses fixed table names).
#![allow(dead_code)] // Each test binary uses a different subset.

use std::{
    io::BufRead,
    path::{Path, PathBuf},
};

use tower_idempotency::sqlx::{self, Executor};

use crate::support::database_url;

/// The receiver binary next to this test's directory, built here when missing or older than
/// any source it is built from (its own, the facade's, every crate's): `cargo test --test <crash
/// test>` builds no examples, and a binary older than a crate's change would run the old code.
pub fn receiver_binary() -> PathBuf {
    let test_exe = std::env::current_exe().unwrap();
    let profile_dir = test_exe.parent().unwrap().parent().unwrap();
    let binary = profile_dir.join("examples").join("receiver");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let newest_source = ["examples/receiver", "src", "crates"]
        .iter()
        .filter_map(|dir| newest(&root.join(dir)))
        .max();
    if modified(&binary) < newest_source {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "--example", "receiver", "--all-features"])
            .arg("--manifest-path")
            .arg(root.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(profile_dir.parent().unwrap())
            .status()
            .expect("run cargo");
        assert!(status.success(), "building the receiver example failed");
    }
    binary
}

/// The newest modification time of a file below `dir` (`target` directories left out).
fn newest(dir: &Path) -> Option<std::time::SystemTime> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name() != "target")
        .filter_map(|entry| {
            let path = entry.path();
            if path.is_dir() {
                newest(&path)
            } else {
                entry.metadata().and_then(|m| m.modified()).ok()
            }
        })
        .max()
}

/// The receiver as a child process, SIGKILLed on drop.
pub struct Receiver {
    child: std::process::Child,
    pub base: String,
}

impl Receiver {
    /// Starts the receiver on a free loopback port with only `env` set (plus `RUST_LOG=error`).
    pub fn start(env: &[(&str, String)]) -> Self {
        let mut command = std::process::Command::new(receiver_binary());
        command
            .env_clear()
            .env("RECEIVER_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("spawn receiver");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the listening line");
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Self { child, base }
    }

    /// Starts the receiver on `store` (its `IDEMPOTENCY_STORE`) verifying Stripe deliveries with
    /// `secret`, with the variables `env` too.
    pub fn stripe(store: &str, secret: &str, env: &[(&str, String)]) -> Self {
        let mut all = vec![
            ("IDEMPOTENCY_STORE", store.to_owned()),
            ("STRIPE_WEBHOOK_SECRET", secret.to_owned()),
        ];
        all.extend_from_slice(env);
        Self::start(&all)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL: no drain, no destructors, no rollback sent.
        let _ = self.child.wait();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A database of the test's own on the Postgres server of `DATABASE_URL`, dropped (with any
/// connection a killed receiver left behind) when the test ends, even when it panics.
pub struct Database {
    pub name: String,
}

pub async fn admin(sql: &str) {
    let pool = sqlx::PgPool::connect(&database_url())
        .await
        .expect("connect postgres");
    pool.execute(sqlx::AssertSqlSafe(sql)).await.expect(sql);
    pool.close().await;
}

impl Database {
    pub async fn create(name: String) -> Self {
        admin(&format!("CREATE DATABASE {name}")).await;
        Self { name }
    }

    /// `DATABASE_URL` with this database in place of its own, its query kept.
    pub fn url(&self) -> String {
        let url = database_url();
        let (url, query) = url
            .split_once('?')
            .map_or((url.as_str(), None), |(u, q)| (u, Some(q)));
        let (scheme, rest) = url.split_once("://").expect("DATABASE_URL has a scheme");
        let authority = rest.split('/').next().unwrap_or(rest);
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        format!("{scheme}://{authority}/{}{query}", self.name)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        // Drop runs inside the test's runtime, which cannot be blocked on: use a runtime of its own.
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(admin(&sql));
        })
        .join();
        if dropped.is_err() && !std::thread::panicking() {
            panic!("could not drop the test database {}", self.name);
        }
    }
}

/// A database of the test's own on the shared MySQL/MariaDB server
/// ([`mysql_url`](tower_idempotency_testkit::mysql_url)), dropped when the test ends.
#[cfg(feature = "mysql")]
pub struct MySqlDatabase {
    pub name: String,
}

#[cfg(feature = "mysql")]
async fn mysql_admin(sql: &str) {
    let pool = sqlx::MySqlPool::connect(&tower_idempotency_testkit::mysql_url())
        .await
        .expect("connect mysql");
    pool.execute(sqlx::AssertSqlSafe(sql)).await.expect(sql);
    pool.close().await;
}

#[cfg(feature = "mysql")]
impl MySqlDatabase {
    pub async fn create(name: String) -> Self {
        mysql_admin(&format!("CREATE DATABASE `{name}`")).await;
        Self { name }
    }

    /// The shared server's URL with this database in place of its own.
    pub fn url(&self) -> String {
        let url = tower_idempotency_testkit::mysql_url();
        let (scheme, rest) = url.split_once("://").expect("MYSQL_URL has a scheme");
        let authority = rest.split('/').next().unwrap_or(rest);
        format!("{scheme}://{authority}/{}", self.name)
    }
}

#[cfg(feature = "mysql")]
impl Drop for MySqlDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS `{}`", self.name);
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(mysql_admin(&sql));
        })
        .join();
        if dropped.is_err() && !std::thread::panicking() {
            panic!("could not drop the test database {}", self.name);
        }
    }
}

/// The `i64` results of `sql`, with `param` bound to its one parameter (`$1`; `?` on MySQL), on
/// the SQLite, Postgres or MySQL database at `store` (a receiver's `IDEMPOTENCY_STORE`).
pub async fn scalars(store: &str, sql: &str, param: &str) -> Vec<i64> {
    #[cfg(feature = "mysql")]
    if store.starts_with("mysql:") {
        let pool = sqlx::MySqlPool::connect(store)
            .await
            .expect("connect mysql");
        let sql = sql.replace("$1", "?");
        let found = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(param)
            .fetch_all(&pool)
            .await;
        pool.close().await;
        return found.expect("query mysql");
    }
    if store.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(store).await.expect("open sqlite");
        let found = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(param)
            .fetch_all(&pool)
            .await;
        pool.close().await;
        found.expect(sql)
    } else {
        let pool = sqlx::PgPool::connect(store)
            .await
            .expect("connect postgres");
        let found = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(param)
            .fetch_all(&pool)
            .await;
        pool.close().await;
        found.expect(sql)
    }
}

/// A pseudo-random number below `bound`.
pub fn random_below(bound: u64) -> u64 {
    tower_idempotency_testkit::random_u64() % bound
}

/// A Stripe event `{"id", "object": "event", "type": kind}` with an empty object.
pub fn stripe_event(id: &str, kind: &str) -> String {
    format!(r#"{{"id":"{id}","object":"event","type":"{kind}","data":{{"object":{{}}}}}}"#)
}

/// POSTs `body` to the receiver's `/inbox/stripe`, signed now with `secret`; answers the status.
pub async fn deliver_stripe(client: &reqwest::Client, base: &str, secret: &str, body: &str) -> u16 {
    use tower_idempotency::webhooks::stripe;
    let now = tower_idempotency_testkit::unix_now();
    let request = client
        .post(format!("{base}/inbox/stripe"))
        .header(
            stripe::SIGNATURE_HEADER,
            stripe::sign(secret, now, body.as_bytes()),
        )
        .body(body.to_owned());
    tower_idempotency_testkit::delivery_status(request).await
}

/// The JSON body of `GET url`.
pub async fn get_json(client: &reqwest::Client, url: String) -> serde_json::Value {
    let bytes = client.get(url).send().await.unwrap().bytes().await.unwrap();
    serde_json::from_slice(&bytes).expect("JSON")
}

/// A directory of the test's own (`tidem-<name>-<random>` in the temporary directory), removed
/// with what it holds when dropped.
pub struct TestDir(PathBuf);

impl TestDir {
    pub fn new(name: &str) -> Self {
        let suffix = crate::support::random_suffix();
        let dir = std::env::temp_dir().join(format!("tidem-{name}-{suffix}"));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory of the test's own and a SQLite store URL in it; keep the directory until the
/// receivers on it are gone (declared first, it is dropped after them).
pub fn sqlite_store(name: &str) -> (TestDir, String) {
    let dir = TestDir::new(name);
    let store = format!("sqlite://{}/receiver.db", dir.path().display());
    (dir, store)
}

/// `send(client, base, item)` for each of `items`, all at once, each on a task of its own: the
/// requests in flight when a test kills the receiver at `base`.
pub fn send_each<F, Fut>(
    client: &reqwest::Client,
    base: &str,
    items: &[String],
    send: F,
) -> Vec<tokio::task::JoinHandle<Fut::Output>>
where
    F: Fn(reqwest::Client, String, String) -> Fut,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    items
        .iter()
        .map(|item| tokio::spawn(send(client.clone(), base.to_owned(), item.clone())))
        .collect()
}

/// Two tests of `$scenario(store, label)`: `$sqlite` on a SQLite file of its own (named after
/// `$file`), `$postgres` on a Postgres database of its own (named `$database_<random>`).
#[allow(unused_macros)] // Each test binary uses a different subset.
macro_rules! on_sqlite_and_postgres {
    ($scenario:ident: $sqlite:ident($file:literal), $postgres:ident($database:literal)) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            let (_dir, store) = crate::receiver_process::sqlite_store($file);
            $scenario(&store, "sqlite").await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            let name = format!("{}_{}", $database, crate::support::random_suffix());
            let database = crate::receiver_process::Database::create(name).await;
            $scenario(&database.url(), "postgres").await;
        }
    };
}
#[allow(unused_imports)] // Each test binary uses a different subset.
pub(crate) use on_sqlite_and_postgres;
