//! The `tower-idempotency` command-line tool end to end: a server guarded by the layer writes
//! records over real HTTP, the built binary inspects, forgets and purges them, against SQLite,
//! Postgres, Redis and (feature `mysql`) MariaDB/MySQL.

mod support;

use std::{sync::Arc, time::Duration};

use serde_json::Value;
use support::*;
use tower_idempotency::{
    store::{
        store_key_from_parts, CachedResponse, ClaimOutcome, FencingToken, Fingerprint, Ownership,
        RecordState,
    },
    IdempotencyLayer, PostgresStore, RedisStore, SqliteStore, Store,
};

/// Runs the tool with `--json` and returns the parsed stdout; the command must succeed.
async fn cli_json(store: &[&str], command: &[&str]) -> Value {
    let mut args = store.to_vec();
    args.push("--json");
    args.extend_from_slice(command);
    let output = cli(&args).await;
    assert!(
        output.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

/// What every store must show: a record written over HTTP is found by its parts and by its
/// store key, an in-flight one shows its lease, `forget` makes the key run again.
async fn inspect_and_forget(store: Arc<dyn Store>, store_args: &[&str]) {
    let namespace = format!("cli-{}", random_suffix());
    let executions = Executions::new();
    let base = serve(counted_app(
        IdempotencyLayer::client_keys(store.clone()).namespace(namespace.as_str()),
        executions.clone(),
    ))
    .await;
    let client = reqwest::Client::new();
    let post = |key: &'static str| {
        client
            .post(format!("{base}/op"))
            .header("idempotency-key", key)
            .body("{\"sku\":\"book\"}")
            .send()
    };
    assert_eq!(post("order-1").await.unwrap().status(), 200);
    let parts = [
        "--namespace",
        namespace.as_str(),
        "--method",
        "POST",
        "--path",
        "/op",
        "--key",
        "order-1",
    ];

    let inspect: Vec<&str> = ["inspect"].into_iter().chain(parts).collect();
    let found = cli_json(store_args, &inspect).await;
    assert_eq!(found["state"], "completed", "{found}");
    assert_eq!(found["status"], 200);
    assert_eq!(found["body_omitted"], false);
    let key = found["key"].as_str().unwrap().to_owned();
    assert_eq!(
        key,
        store_key_from_parts(&namespace, "POST", "/op", None, "order-1")
    );
    assert!(matches!(
        store.get(&key).await.unwrap(),
        Some(RecordState::Completed { .. })
    ));

    // The readable table, by the scoped store key.
    let mut args = store_args.to_vec();
    args.extend(["inspect", key.as_str()]);
    let table = cli(&args).await;
    assert!(table.status.success());
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("state") && l.ends_with("completed"))
            && table
                .lines()
                .any(|l| l.starts_with("status") && l.ends_with("200")),
        "{table}"
    );

    // An in-flight record shows what is left of its lease.
    let held = store_key_from_parts(&namespace, "POST", "/op", None, "order-2");
    let claim = store.claim(
        &held,
        &Fingerprint([7; 32]),
        FencingToken::random().unwrap(),
        Duration::from_secs(60),
    );
    assert!(matches!(claim.await.unwrap(), ClaimOutcome::Claimed { .. }));
    let in_flight = cli_json(store_args, &["inspect", &held]).await;
    assert_eq!(in_flight["state"], "in_flight", "{in_flight}");
    let left = in_flight["lease_remaining_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 60_000, "{in_flight}");

    let forget: Vec<&str> = ["forget"].into_iter().chain(parts).collect();
    let forgotten = cli_json(store_args, &forget).await;
    assert_eq!(forgotten["forgotten"], true, "{forgotten}");
    assert_eq!(forgotten["key"], key.as_str());
    let gone = cli_json(store_args, &inspect).await;
    assert_eq!(gone["state"], "absent", "{gone}");
    let again = cli_json(store_args, &forget).await;
    assert_eq!(again["forgotten"], false, "nothing left to forget");
    // The in-flight record of the other key is untouched.
    assert!(matches!(
        store.get(&held).await.unwrap(),
        Some(RecordState::InFlight { .. })
    ));

    // The forgotten key runs the handler again instead of replaying.
    let rerun = post("order-1").await.unwrap();
    assert_eq!(rerun.status(), 200);
    assert!(rerun.headers().get("idempotent-replayed").is_none());
    assert_eq!(executions.of("order-1"), 2);
}

/// Completes one record with a short TTL and one with a long one; returns their keys.
async fn one_expired_one_live(store: &dyn Store) -> (String, String) {
    let response = CachedResponse {
        status: http::StatusCode::CREATED,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from_static(b"{}"),
        body_omitted: false,
    };
    let mut keys = Vec::new();
    for ttl in [Duration::from_millis(200), Duration::from_secs(3600)] {
        let key = store_key_from_parts("cli-purge", "POST", "/op", None, &random_suffix());
        let ClaimOutcome::Claimed { token } = store
            .claim(
                &key,
                &Fingerprint([1; 32]),
                FencingToken::random().unwrap(),
                Duration::from_secs(60),
            )
            .await
            .unwrap()
        else {
            panic!("a fresh key is claimed");
        };
        let done = store.complete(&key, token, &response, ttl).await.unwrap();
        assert_eq!(done, Ownership::Current);
        keys.push(key);
    }
    // Waiting for the short TTL to pass is the point; there is no event to await.
    tokio::time::sleep(Duration::from_millis(400)).await;
    (keys.remove(0), keys.remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_inspect_forget_purge() {
    let path = std::env::temp_dir().join(format!("tidem-cli-{}.db", random_suffix()));
    let url = format!("sqlite://{}", path.display());
    let table = format!("cli_{}", random_suffix());
    let store = SqliteStore::connect_with_table(&url, &table).await.unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);
    let args = ["--store", url.as_str(), "--table", table.as_str()];
    inspect_and_forget(store.clone(), &args).await;

    let (expired, live) = one_expired_one_live(&*store).await;
    let purged = cli_json(&args, &["purge-expired"]).await;
    assert_eq!(purged["store"], "sqlite");
    assert_eq!(purged["purged"], 1, "{purged}");
    let remaining: i64 =
        tower_idempotency_sqlx::sqlx::query_scalar(tower_idempotency_sqlx::sqlx::AssertSqlSafe(
            &*format!("SELECT count(*) FROM \"{table}\" WHERE key IN (?1, ?2)"),
        ))
        .bind(&expired)
        .bind(&live)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(remaining, 1, "the live record stays");
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

/// A MySQL table dropped when the test ends.
#[cfg(feature = "mysql")]
struct MySqlTableGuard {
    table: String,
}

#[cfg(feature = "mysql")]
impl Drop for MySqlTableGuard {
    fn drop(&mut self) {
        use tower_idempotency::sqlx::{self, Connection};
        let sql = format!("DROP TABLE IF EXISTS `{}`", self.table);
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(async {
                    let url = tower_idempotency_testkit::mysql_url();
                    if let Ok(mut conn) = sqlx::MySqlConnection::connect(&url).await {
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                            .execute(&mut conn)
                            .await;
                    }
                })
        })
        .join();
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_inspect_forget_purge() {
    if !tower_idempotency_testkit::mysql_or_skip("cli mysql") {
        return;
    }
    let url = tower_idempotency_testkit::mysql_url();
    let guard = MySqlTableGuard {
        table: tower_idempotency_testkit::mysql_table("tidem_cli"),
    };
    let store = tower_idempotency::MySqlStore::connect_with_table(&url, &guard.table)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);
    let args = ["--store", url.as_str(), "--table", guard.table.as_str()];
    inspect_and_forget(store.clone(), &args).await;

    let (expired, live) = one_expired_one_live(&*store).await;
    let purged = cli_json(&args, &["purge-expired"]).await;
    assert_eq!(purged["store"], "mysql");
    assert_eq!(purged["purged"], 1, "{purged}");
    assert_eq!(store.get(&expired).await.unwrap(), None);
    assert!(
        store.get(&live).await.unwrap().is_some(),
        "the live record stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inspect_forget_purge() {
    require_postgres!("cli postgres");
    let url = database_url();
    let guard = PgTableGuard {
        table: format!("tidem_cli_{}", random_suffix()),
    };
    let store = PostgresStore::connect_with_table(&url, &guard.table)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);
    let args = ["--store", url.as_str(), "--table", guard.table.as_str()];
    inspect_and_forget(store.clone(), &args).await;

    let (expired, live) = one_expired_one_live(&*store).await;
    let purged = cli_json(&args, &["purge-expired"]).await;
    assert_eq!(purged["store"], "postgres");
    assert_eq!(purged["purged"], 1, "{purged}");
    assert_eq!(store.get(&expired).await.unwrap(), None);
    assert!(
        store.get(&live).await.unwrap().is_some(),
        "the live record stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_inspect_forget_and_nothing_to_purge() {
    let url = redis_url();
    if !reachable(&host_port(&url)) {
        return skip("cli redis", "Redis is not reachable at REDIS_URL");
    }
    let guard = RedisPrefixGuard {
        url: url.clone(),
        prefix: format!("tidem-cli-{}", random_suffix()),
    };
    let store = Arc::new(RedisStore::connect(&url, &guard.prefix).await.unwrap());
    let args = [
        "--store",
        url.as_str(),
        "--redis-prefix",
        guard.prefix.as_str(),
    ];
    inspect_and_forget(store.clone(), &args).await;

    let purged = cli_json(&args, &["purge-expired"]).await;
    assert_eq!(purged["store"], "redis");
    assert_eq!(purged["purged"], Value::Null);
    assert!(
        purged["note"]
            .as_str()
            .unwrap()
            .contains("expires records by itself"),
        "{purged}"
    );
}

#[tokio::test]
async fn failures_exit_non_zero_without_the_store_password() {
    // Nothing listens on port 1 of loopback: the connection is refused at once.
    let url = "postgres://admin:hunter2-secret@127.0.0.1:1/app";
    let output = cli(&["--store", url, "purge-expired"]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("could not open the postgres store"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2-secret"), "{stderr}");

    for (args, expected) in [
        (
            vec!["--store", "memory", "purge-expired"],
            "the memory store lives inside one process",
        ),
        (
            vec!["--store", "mongodb://x", "purge-expired"],
            "unsupported store URL",
        ),
        (vec!["purge-expired"], "no store given"),
        (
            vec!["--store", "sqlite:///nonexistent/dir/x.db", "purge-expired"],
            "no SQLite database file",
        ),
    ] {
        let output = cli(&args).await;
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }

    // A malformed store key, and a key given both ways, are refused before any store call.
    let path = std::env::temp_dir().join(format!("tidem-cli-{}.db", random_suffix()));
    std::fs::write(&path, b"").unwrap();
    let url = format!("sqlite://{}", path.display());
    let output = cli(&["--store", &url, "inspect", "orders:not-hex"]).await;
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a scoped store key"));
    let both = cli(&[
        "--store",
        &url,
        "forget",
        "orders:00",
        "--namespace",
        "o",
        "--key",
        "k",
    ])
    .await;
    assert_eq!(both.status.code(), Some(2), "a usage error");
    let _ = std::fs::remove_file(&path);
}
