//! `RunOnce` in a queue consumer, without HTTP: a broker that delivers at least once (here a
//! tokio channel that sends every message twice, the copies interleaved and handled by two
//! consumers at once) and a handler that must charge each order once.
//!
//! ```sh
//! cargo run --example run_once_consumer
//! ```
//!
//! Swap the channel for a Kafka, SQS or NATS consumer: key each message by what identifies it
//! (an event id, a partition and offset, a business key), and acknowledge it after `run`
//! answered, whether the work ran now or earlier.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tower_idempotency::{OnceError, RunOnce, SqliteStore};

#[derive(Clone, Debug, Serialize)]
struct Message {
    id: String,
    order: u32,
    cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    charge: String,
}

async fn consume(
    once: RunOnce,
    messages: Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Message>>>,
    charges: Arc<AtomicUsize>,
) -> (usize, usize) {
    let (mut ran, mut replayed) = (0, 0);
    loop {
        let Some(message) = messages.lock().await.recv().await else {
            return (ran, replayed);
        };
        let charges = charges.clone();
        let order = message.order;
        let result = once
            .run_with_input(&message.id, &message, move || async move {
                // The effect to run once: a charge at the payment provider.
                let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok::<_, std::io::Error>(Receipt {
                    charge: format!("ch_{order}_{n}"),
                })
            })
            .await;
        match result {
            Ok(receipt) if receipt.is_replay() => replayed += 1,
            Ok(_) => ran += 1,
            // The other copy is being handled right now: leave this one unacknowledged, the
            // broker redelivers it and `run` then returns the stored receipt.
            Err(OnceError::InFlight { .. }) => replayed += 1,
            Err(error) => eprintln!("message {}: {error}", message.id),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("run-once-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = SqliteStore::connect(&format!("sqlite://{}/once.db", dir.display())).await?;
    store.migrate().await?;
    let once = RunOnce::new(store)
        .namespace("charges")
        .wait_for_result(Duration::from_secs(10));

    let (send, receive) = tokio::sync::mpsc::channel(64);
    let receive = Arc::new(tokio::sync::Mutex::new(receive));
    let charges = Arc::new(AtomicUsize::new(0));
    let consumers: Vec<_> = (0..2)
        .map(|_| tokio::spawn(consume(once.clone(), receive.clone(), charges.clone())))
        .collect();
    let orders = 50;
    for order in 0..orders {
        let message = Message {
            id: format!("msg-{order}"),
            order,
            cents: 1_000 + u64::from(order),
        };
        // At least once: every message arrives twice.
        send.send(message.clone()).await?;
        send.send(message).await?;
    }
    drop(send);
    let (mut ran, mut replayed) = (0, 0);
    for consumer in consumers {
        let (r, p) = consumer.await?;
        ran += r;
        replayed += p;
    }
    let charged = charges.load(Ordering::SeqCst);
    println!("{orders} orders, each delivered twice: {ran} ran, {replayed} duplicates answered from the store, {charged} charges");
    std::fs::remove_dir_all(&dir)?;
    assert_eq!(
        charged, orders as usize,
        "every order is charged exactly once"
    );
    Ok(())
}
