//! A Stripe receiver on the durable webhook inbox (docs/inbox.md), on SQLite: `POST
//! /webhooks/stripe` answers `200` as soon as the verified event is stored; a worker then records
//! each `charge.succeeded` in the table `charges`, in the same transaction that marks the event
//! processed. Failed events are listed and retried under `/admin/inbox` (put your own auth in
//! front of it in a real application).
//!
//! ```text
//! STRIPE_WEBHOOK_SECRET=whsec_test cargo run --example inbox --features inbox
//! ```
//!
//! Listens on `127.0.0.1:3014`; Ctrl-C drains the worker (up to 30 s) and exits.

use std::{str::FromStr, time::Duration};

use axum::{routing::post_service, Router};
use tower_idempotency::{
    inbox::{self, Backoff, HandlerError, IdempotentTx, Inbox, InboxEvent},
    sqlx::{self, sqlite::SqliteConnectOptions, Sqlite},
    webhooks::stripe::{self, StripeVerifier},
};

/// Records a succeeded charge; every other event type is acknowledged and ignored. An error
/// (here: a `charge.succeeded` without an object id) rolls back and is retried with backoff.
async fn on_event(event: InboxEvent, mut tx: IdempotentTx<Sqlite>) -> Result<(), HandlerError> {
    let json = event.json()?;
    if json["type"] != "charge.succeeded" {
        return Ok(());
    }
    let charge = json["data"]["object"]["id"]
        .as_str()
        .ok_or("charge.succeeded without data.object.id")?;
    sqlx::query("INSERT INTO charges (event_id, charge_id) VALUES ($1, $2)")
        .bind(&event.key.event_id)
        .bind(charge)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("STRIPE_WEBHOOK_SECRET").unwrap_or_else(|_| "whsec_test".into());
    // WAL and a busy timeout: acknowledgements and the worker's commits share one writer.
    let options = SqliteConnectOptions::from_str("sqlite://inbox-example.db")?
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = sqlx::SqlitePool::connect_with(options).await?;
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS charges (event_id TEXT PRIMARY KEY, charge_id TEXT)")
        .execute(&pool)
        .await?;

    let inbox = Inbox::new(pool, inbox::DEFAULT_TABLE)?;
    inbox.migrate().await?;
    let worker = inbox
        .worker(on_event)
        .concurrency(4)
        .max_attempts(10)
        .backoff(Backoff::exponential(
            Duration::from_secs(1),
            Duration::from_secs(600),
        ))
        .spawn();

    let app = Router::new()
        .route(
            "/webhooks/stripe",
            post_service(inbox.ack(StripeVerifier::new([secret.clone()]))),
        )
        .nest("/admin/inbox", inbox::admin::router(inbox.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3014").await?;
    println!("listening on http://{}", listener.local_addr()?);
    let body =
        r#"{"id":"evt_example_1","type":"charge.succeeded","data":{"object":{"id":"ch_1"}}}"#;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let signature = stripe::sign(&secret, now.as_secs(), body.as_bytes());
    println!(
        "try (valid for 5 minutes; send it twice, it is stored and processed once):\n  \
         curl -i http://127.0.0.1:3014/webhooks/stripe -H 'stripe-signature: {signature}' -d '{body}'\n  \
         curl http://127.0.0.1:3014/admin/inbox/counts"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    if !worker.drain(Duration::from_secs(30)).await {
        eprintln!("handlers still running at the deadline; their events stay pending");
    }
    Ok(())
}
