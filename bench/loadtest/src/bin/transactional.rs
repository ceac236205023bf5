//! The transactional mode's cost, measured side by side in one run on loopback: for SQLite,
//! Postgres and MySQL/MariaDB, first requests (a new key each) to three routes whose handler inserts one row:
//!
//! - `bare`: no layer; the handler runs `BEGIN; INSERT; COMMIT` on the pool;
//! - `plain`: `IdempotencyLayer::client_keys(store)` in front of the same handler;
//! - `transactional`: `.transactional()`, the handler inserts through `IdempotentTx`.
//!
//! ```text
//! cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest --bin transactional -- [SECONDS]
//! ```
//!
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) names the Postgres database,
//! `MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`) the MySQL one; their tables get random
//! names and are dropped at the end. Prints one Markdown table.

mod drive;

use std::sync::Arc;

use drive::{drive, postgres_pool, seconds_arg, serve, suffix};

use axum::{extract::State, http::StatusCode, routing::post, Router};
use tower_idempotency_core::{IdempotencyLayer, Store};
use tower_idempotency_sqlx::{
    sqlx::{self, Database, MySql, Pool, Postgres, Sqlite},
    IdempotentTx, MySqlStore, PostgresStore, SqliteStore,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Sql {
    insert: String,
}

/// The row every handler writes, and the two handlers (`bare` begins its own transaction,
/// `tx` writes in the layer's), on each database.
macro_rules! handlers {
    ($bare:ident, $tx:ident, $db:ty, $begin:literal) => {
        async fn $bare(State((pool, sql)): State<(Pool<$db>, Arc<Sql>)>) -> StatusCode {
            let mut tx = pool.begin_with($begin).await.expect("begin");
            sqlx::query(sqlx::AssertSqlSafe(&*sql.insert))
                .bind(1_i64)
                .execute(&mut *tx)
                .await
                .expect("insert");
            tx.commit().await.expect("commit");
            StatusCode::CREATED
        }

        async fn $tx(
            State((_, sql)): State<(Pool<$db>, Arc<Sql>)>,
            mut tx: IdempotentTx<$db>,
        ) -> StatusCode {
            sqlx::query(sqlx::AssertSqlSafe(&*sql.insert))
                .bind(1_i64)
                .execute(&mut *tx)
                .await
                .expect("insert");
            StatusCode::CREATED
        }
    };
}

handlers!(bare_pg, tx_pg, Postgres, "BEGIN");
handlers!(bare_my, tx_my, MySql, "BEGIN");
// SQLite takes the write lock at BEGIN, as the layer's transactions do.
handlers!(bare_sqlite, tx_sqlite, Sqlite, "BEGIN IMMEDIATE");

async fn measure(label: &str, routes: [(&str, String); 3], seconds: u64) {
    for clients in [1, 16] {
        for (name, url) in &routes {
            // First requests: a fresh key each.
            let url = url.clone();
            let run = drive(clients, seconds, 201, move |client, run, worker, n| {
                client
                    .post(&url)
                    .header("idempotency-key", format!("{run}-{worker}-{n}"))
                    .body("{}")
            })
            .await;
            println!(
                "| {label} | {name} | {clients} | {} | {} |",
                run.cells(),
                run.errors
            );
        }
    }
}

fn routes<DB: Database, H1, T1, H2, T2>(
    state: (Pool<DB>, Arc<Sql>),
    store: Arc<dyn Store>,
    bare: H1,
    tx: H2,
) -> Router
where
    H1: axum::handler::Handler<T1, (Pool<DB>, Arc<Sql>)> + Clone,
    H2: axum::handler::Handler<T2, (Pool<DB>, Arc<Sql>)> + Clone,
    T1: 'static,
    T2: 'static,
{
    Router::new()
        .route("/bare", post(bare.clone()))
        .merge(
            Router::new()
                .route("/plain", post(bare))
                .route_layer(IdempotencyLayer::client_keys(store.clone()).namespace("plain")),
        )
        .merge(
            Router::new().route("/transactional", post(tx)).route_layer(
                IdempotencyLayer::client_keys(store)
                    .namespace("transactional")
                    .transactional(),
            ),
        )
        .with_state(state)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let seconds = seconds_arg();
    println!("| store | route | clients | requests/s | p50 ms | p99 ms | max ms | errors |");
    println!("|---|---|---|---|---|---|---|---|");

    let dir = std::env::temp_dir().join(format!("tidem-tx-bench-{}", suffix()));
    std::fs::create_dir_all(&dir)?;
    let sqlite =
        Arc::new(SqliteStore::connect(&format!("sqlite://{}/bench.db", dir.display())).await?);
    sqlite.migrate().await?;
    sqlx::raw_sql("CREATE TABLE effects (amount INTEGER NOT NULL)")
        .execute(sqlite.pool())
        .await?;
    let sql = Arc::new(Sql {
        insert: "INSERT INTO effects (amount) VALUES (?1)".into(),
    });
    let router = routes(
        (sqlite.pool().clone(), sql),
        sqlite.clone(),
        bare_sqlite,
        tx_sqlite,
    );
    let base = serve(router).await?;
    let urls = ["bare", "plain", "transactional"].map(|r| (r, format!("{base}/{r}")));
    measure("sqlite", urls, seconds).await;
    let _ = std::fs::remove_dir_all(&dir);

    let pool = postgres_pool().await?;
    let table = format!("bench_tx_{}", suffix());
    let effects = format!("bench_effects_{}", suffix());
    let store = Arc::new(PostgresStore::new(pool.clone(), &table)?.with_connection_lanes(16));
    store.migrate().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
        "CREATE TABLE {effects} (amount bigint NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let sql = Arc::new(Sql {
        insert: format!("INSERT INTO {effects} (amount) VALUES ($1)"),
    });
    let router = routes((pool.clone(), sql), store.clone(), bare_pg, tx_pg);
    let base = serve(router).await?;
    let urls = ["bare", "plain", "transactional"].map(|r| (r, format!("{base}/{r}")));
    measure("postgres", urls, seconds).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
        "DROP TABLE {effects}; DROP TABLE {table};"
    )))
    .execute(&pool)
    .await?;

    let url =
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let table = format!("bench_tx_{}", suffix());
    let effects = format!("bench_effects_{}", suffix());
    let store = Arc::new(MySqlStore::connect_with_table(&url, &table).await?);
    store.migrate().await?;
    let pool = store.pool().clone();
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
        "CREATE TABLE {effects} (amount BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let sql = Arc::new(Sql {
        insert: format!("INSERT INTO {effects} (amount) VALUES (?)"),
    });
    let router = routes((pool.clone(), sql), store.clone(), bare_my, tx_my);
    let base = serve(router).await?;
    let urls = ["bare", "plain", "transactional"].map(|r| (r, format!("{base}/{r}")));
    measure("mysql", urls, seconds).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(&*format!(
        "DROP TABLE {effects}; DROP TABLE {table};"
    )))
    .execute(&pool)
    .await?;
    Ok(())
}
