//! The one-command demo: a Stripe webhook receiver on loopback, guarded by `IdempotencyLayer`
//! over the embedded SQLite store, hammered with duplicated, concurrent and forged deliveries.
//!
//! ```text
//! cargo run --release --example demo
//! cargo run --release --example demo -- --events 50 --duplicates 20 --concurrency 25 \
//!     --forgeries 30 --store sqlite:///tmp/demo.db
//! ```
//!
//! It ends with a table and exits non-zero unless every event ran exactly once and every forged
//! delivery was refused.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::{extract::State, routing::post, Json, Router};
use tokio::{
    sync::{oneshot, Semaphore},
    task::{JoinHandle, JoinSet},
};
use tower_idempotency::{
    connect_store, webhooks::stripe, IdempotencyLayer, Store, VerifiedWebhook, WebhookLayerExt,
};

const SECRET: &str = "whsec_demo_secret_do_not_use_in_production";

#[derive(Debug)]
struct Options {
    events: usize,
    duplicates: usize,
    concurrency: usize,
    forgeries: usize,
    store: Option<String>,
}

const USAGE: &str = "usage: demo [--events N] [--duplicates N] [--concurrency N] [--forgeries N] [--store URL]
  --events N       distinct Stripe events (default 50)
  --duplicates N   deliveries of each event (default 20)
  --concurrency N  deliveries in flight at once (default 25)
  --forgeries N    tampered, wrongly signed and stale deliveries (default 30)
  --store URL      memory | sqlite://PATH | postgres://... | redis://... (default: a fresh SQLite file)";

// Five flags do not justify an argument-parsing dependency in an example.
fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        events: 50,
        duplicates: 20,
        concurrency: 25,
        forgeries: 30,
        store: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_owned());
        }
        let value = args
            .next()
            .ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag} takes a positive number"))
        };
        match flag.as_str() {
            "--events" => options.events = number()?,
            "--duplicates" => options.duplicates = number()?,
            "--concurrency" => options.concurrency = number()?.max(1),
            "--forgeries" => options.forgeries = number()?,
            "--store" => options.store = Some(value),
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(options)
}

/// What the receiver's handler did: executions per event id.
#[derive(Clone, Default)]
struct Effects(Arc<Mutex<HashMap<String, usize>>>);

async fn stripe_webhook(
    State(effects): State<Effects>,
    webhook: VerifiedWebhook,
) -> Json<serde_json::Value> {
    *effects
        .0
        .lock()
        .unwrap()
        .entry(webhook.event_id().to_owned())
        .or_default() += 1;
    // Simulated work (a database write), so that concurrent duplicates meet an in-flight claim.
    tokio::time::sleep(Duration::from_millis(5)).await;
    Json(serde_json::json!({ "received": webhook.event_id() }))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn event_body(index: usize) -> String {
    serde_json::json!({
        "id": format!("evt_demo_{index:04}"),
        "object": "event",
        "type": "payment_intent.succeeded",
        "data": { "object": { "id": format!("pi_{index:04}"), "amount": 1000 + index } },
    })
    .to_string()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Delivery {
    Genuine(usize),
    Tampered(usize),
    WrongSecret(usize),
    Stale(usize),
}

#[derive(Default)]
struct Tally {
    executed: AtomicUsize,
    replayed: AtomicUsize,
    conflicts: AtomicUsize,
    rejected_forgeries: AtomicUsize,
    accepted_forgeries: AtomicUsize,
    errors: AtomicUsize,
    done: AtomicUsize,
}

async fn deliver(client: &reqwest::Client, url: &str, delivery: Delivery, tally: &Tally) {
    let (body, signature) = match delivery {
        Delivery::Genuine(i) => {
            let body = event_body(i);
            let signature = stripe::sign(SECRET, now(), body.as_bytes());
            (body, signature)
        }
        Delivery::Tampered(i) => {
            let signature = stripe::sign(SECRET, now(), event_body(i).as_bytes());
            (
                event_body(i).replace("\"amount\":", "\"amount\":9"),
                signature,
            )
        }
        Delivery::WrongSecret(i) => {
            let body = event_body(i);
            let signature = stripe::sign("whsec_attacker", now(), body.as_bytes());
            (body, signature)
        }
        Delivery::Stale(i) => {
            let body = event_body(i);
            let signature = stripe::sign(SECRET, now() - 3600, body.as_bytes());
            (body, signature)
        }
    };
    let response = client
        .post(url)
        .header("stripe-signature", signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let counter = match (&response, delivery) {
        (Ok(r), Delivery::Genuine(_)) if r.status().is_success() => {
            if r.headers().contains_key("idempotent-replayed") {
                &tally.replayed
            } else {
                &tally.executed
            }
        }
        (Ok(r), Delivery::Genuine(_)) if r.status() == 409 => &tally.conflicts,
        (Ok(r), Delivery::Genuine(_)) => {
            eprintln!("unexpected status {} for a genuine delivery", r.status());
            &tally.errors
        }
        (Ok(r), _) if r.status().is_client_error() => &tally.rejected_forgeries,
        (Ok(_), _) => &tally.accepted_forgeries,
        (Err(error), _) => {
            eprintln!("request failed: {error}");
            &tally.errors
        }
    };
    counter.fetch_add(1, Ordering::Relaxed);
    tally.done.fetch_add(1, Ordering::Relaxed);
}

/// A deterministic shuffle (xorshift), so runs are comparable without a `rand` dependency.
fn shuffle<T>(items: &mut [T]) {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(i, (state % (i as u64 + 1)) as usize);
    }
}

/// Every genuine delivery `duplicates` times, plus the forgeries, in a shuffled order.
fn plan(options: &Options) -> Vec<Delivery> {
    let mut deliveries: Vec<Delivery> = (0..options.events)
        .flat_map(|i| std::iter::repeat_n(Delivery::Genuine(i), options.duplicates))
        .collect();
    for i in 0..options.forgeries {
        let event = i % options.events.max(1);
        deliveries.push(match i % 3 {
            0 => Delivery::Tampered(event),
            1 => Delivery::WrongSecret(event),
            _ => Delivery::Stale(event),
        });
    }
    shuffle(&mut deliveries);
    deliveries
}

/// The receiver on a free loopback port: its URL, and the sender that stops it.
async fn serve(
    store: Arc<dyn Store>,
    effects: Effects,
) -> (String, oneshot::Sender<()>, JoinHandle<std::io::Result<()>>) {
    let app = Router::new()
        .route("/webhooks/stripe", post(stripe_webhook))
        .route_layer(IdempotencyLayer::stripe([SECRET], store))
        .with_state(effects);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}/webhooks/stripe", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    (url, stop, server)
}

/// Sends every delivery, `concurrency` at once, with a progress line on stderr.
async fn send_all(url: &str, deliveries: Vec<Delivery>, concurrency: usize) -> Arc<Tally> {
    let total = deliveries.len();
    let tally = Arc::new(Tally::default());
    let client = reqwest::Client::new();
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    for delivery in deliveries {
        let permit = permits.clone().acquire_owned().await.unwrap();
        let (client, url, tally) = (client.clone(), url.to_owned(), tally.clone());
        tasks.spawn(async move {
            deliver(&client, &url, delivery, &tally).await;
            drop(permit);
        });
    }
    let progress = tokio::spawn({
        let tally = tally.clone();
        async move {
            loop {
                let done = tally.done.load(Ordering::Relaxed);
                eprint!("\r  progress  {done}/{total} deliveries");
                if done >= total {
                    eprintln!();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    while tasks.join_next().await.is_some() {}
    progress.await.unwrap();
    tally
}

/// Prints the table and the verdict; `false` unless every event ran once and every forgery
/// was refused.
fn report(
    options: &Options,
    effects: &Effects,
    tally: &Tally,
    total: usize,
    elapsed: Duration,
) -> bool {
    let runs = effects.0.lock().unwrap().clone();
    let handler_executions: usize = runs.values().sum();
    let ran_once = runs.values().filter(|&&n| n == 1).count();
    let get = |c: &AtomicUsize| c.load(Ordering::Relaxed);
    println!();
    println!("  +--------------------------------+----------+");
    for (label, value) in [
        ("deliveries sent", total),
        ("handler executions", handler_executions),
        ("  answered by the handler", get(&tally.executed)),
        ("replays (cached response)", get(&tally.replayed)),
        ("in-flight conflicts (409)", get(&tally.conflicts)),
        ("forgeries rejected (4xx)", get(&tally.rejected_forgeries)),
        ("forgeries accepted", get(&tally.accepted_forgeries)),
        ("errors", get(&tally.errors)),
        ("events that ran exactly once", ran_once),
    ] {
        println!("  | {label:<30} | {value:>8} |");
    }
    println!("  +--------------------------------+----------+");
    println!(
        "  {:.0} deliveries/s over {:.2?}",
        total as f64 / elapsed.as_secs_f64(),
        elapsed
    );

    let every_event_once = ran_once == options.events && handler_executions == options.events;
    let forgeries_refused = get(&tally.rejected_forgeries) == options.forgeries;
    if every_event_once && forgeries_refused && get(&tally.errors) == 0 {
        println!(
            "\n  VERDICT: every one of the {} events ran exactly once; all {} forgeries were refused.",
            options.events, options.forgeries
        );
        true
    } else {
        println!("\n  VERDICT: FAILED (see the table above).");
        false
    }
}

#[tokio::main]
async fn main() {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let default_db =
        std::env::temp_dir().join(format!("tower-idempotency-demo-{}.db", std::process::id()));
    let store_url = options
        .store
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", default_db.display()));
    let store = match connect_store(&store_url).await {
        Ok(store) => store,
        Err(error) => {
            eprintln!("cannot open store {store_url}: {error}");
            std::process::exit(1);
        }
    };

    let effects = Effects::default();
    let (url, stop, server) = serve(store, effects.clone()).await;
    let deliveries = plan(&options);
    let total = deliveries.len();

    println!("tower-idempotency demo");
    println!("  receiver  {url}");
    println!("  store     {store_url}");
    println!(
        "  sending   {} events x {} deliveries + {} forgeries = {total} requests, {} at once\n",
        options.events, options.duplicates, options.forgeries, options.concurrency
    );

    let started = Instant::now();
    let tally = send_all(&url, deliveries, options.concurrency).await;
    let elapsed = started.elapsed();
    let _ = stop.send(());
    let _ = server.await;
    let _ = std::fs::remove_file(&default_db);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", default_db.display()));
    }

    if !report(&options, &effects, &tally, total, elapsed) {
        std::process::exit(1);
    }
}
