//! The layer's metrics over each real store: concurrent identical requests over real HTTP run
//! one handler, and the counters and the store label say so. Recorded by a Prometheus recorder
//! installed on the test's thread only (`metrics::set_default_local_recorder`), with the server
//! and the client on a current-thread runtime, so tests share no global state.

mod support;

use std::{future::Future, sync::Arc};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use support::*;
use tower_idempotency::{IdempotencyLayer, PostgresStore, RedisStore, SqliteStore, Store};
use tower_idempotency_testkit::post_order;

const DUPLICATES: usize = 8;

/// Runs `test` with a Prometheus recorder installed for this thread and a current-thread
/// runtime, so the server, its handlers and the store calls all record into it.
fn recorded<F: Future<Output = ()>>(test: impl FnOnce(PrometheusHandle) -> F) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _local = metrics::set_default_local_recorder(&recorder);
    runtime.block_on(test(handle));
}

/// Sends `DUPLICATES` identical requests at once through a layer over `store`, then checks the
/// one execution, the outcome counters and the store label.
async fn one_execution_counted(store: Arc<dyn Store>, name: &str, metrics: PrometheusHandle) {
    assert_eq!(store.name(), name);
    let executions = Executions::new();
    let layer = IdempotencyLayer::client_keys(store).namespace("metered");
    let url = format!("{}/op", serve(counted_app(layer, executions.clone())).await);
    let client = reqwest::Client::new();
    let answers = futures_util::future::join_all(
        (0..DUPLICATES).map(|_| post_order(&client, &url, "same-key")),
    )
    .await;
    let statuses: Vec<u16> = answers
        .into_iter()
        .map(|(answer, _)| answer.status().as_u16())
        .collect();
    assert_eq!(executions.total(), 1, "{statuses:?}");

    let text = metrics.render();
    let count = |outcome: &str| -> usize {
        let prefix =
            format!(r#"idempotency_requests_total{{namespace="metered",outcome="{outcome}"}} "#);
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map_or(0, |n| n.parse().unwrap())
    };
    assert_eq!(count("executed"), 1, "{text}");
    assert_eq!(
        count("executed") + count("replayed") + count("in_flight"),
        DUPLICATES,
        "{text}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        count("executed") + count("replayed")
    );
    let claims = format!(
        r#"idempotency_store_call_duration_seconds_count{{operation="claim",store="{name}"}} {DUPLICATES}"#
    );
    assert!(
        text.lines().any(|l| l == claims),
        "missing {claims:?} in:\n{text}"
    );
    let completion = format!(
        r#"idempotency_store_call_duration_seconds_count{{operation="complete",store="{name}"}} 1"#
    );
    assert!(
        text.lines().any(|l| l == completion),
        "missing {completion:?} in:\n{text}"
    );
}

#[test]
fn sqlite_store_metrics() {
    recorded(|metrics| async move {
        let path = std::env::temp_dir().join(format!("tidem-metrics-{}.db", random_suffix()));
        let url = format!("sqlite://{}", path.display());
        let store = SqliteStore::connect_with_table(&url, "metrics_test")
            .await
            .unwrap();
        store.migrate().await.unwrap();
        one_execution_counted(Arc::new(store), "sqlite", metrics).await;
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    });
}

#[test]
fn postgres_store_metrics() {
    let url = database_url();
    if !reachable(&host_port(&url)) {
        return skip(
            "metrics postgres",
            "Postgres is not reachable at DATABASE_URL",
        );
    }
    let guard = PgTableGuard {
        table: format!("tidem_metrics_{}", random_suffix()),
    };
    let table = guard.table.clone();
    recorded(|metrics| async move {
        let store = PostgresStore::connect_with_table(&url, &table)
            .await
            .unwrap();
        store.migrate().await.unwrap();
        one_execution_counted(Arc::new(store), "postgres", metrics).await;
    });
}

#[test]
fn redis_store_metrics() {
    let url = redis_url();
    if !reachable(&host_port(&url)) {
        return skip("metrics redis", "Redis is not reachable at REDIS_URL");
    }
    let guard = RedisPrefixGuard {
        url,
        prefix: format!("tidem-metrics-{}", random_suffix()),
    };
    let (url, prefix) = (guard.url.clone(), guard.prefix.clone());
    recorded(|metrics| async move {
        let store = RedisStore::connect(&url, &prefix).await.unwrap();
        one_execution_counted(Arc::new(store), "redis", metrics).await;
    });
}
