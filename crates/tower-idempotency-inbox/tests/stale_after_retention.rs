//! Skip-stale after retention, over real HTTP on a SQLite file and on Postgres: the purge
//! deletes the processed event that makes an older one stale, and the older event delivered
//! afterwards is still skipped. The newest processed position of an object is kept in the
//! table's positions table, which has a retention of its own: it is kept while the object has a
//! pending or failed event, and forgotten once it is older than the retention and none is left.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;
use tower_idempotency_inbox::{EventKey, EventState, Inbox, Ordering, OrderingPolicy};
use tower_idempotency_sqlx::sqlx;

/// A Stripe event about `object` created at `created` (seconds), of type `kind`.
fn stripe_event(id: &str, object: &str, created: i64, kind: &str) -> String {
    format!(
        r#"{{"id":"{id}","object":"event","type":"{kind}","created":{created},"data":{{"object":{{"id":"{object}"}}}}}}"#
    )
}

async fn send(sender: &Sender, id: &str, object: &str, created: i64, kind: &str) {
    let body = stripe_event(id, object, created, kind);
    let status = deliver(&sender.client, &sender.url, SECRET, &body).await;
    assert_eq!(status, 200, "{id}");
}

/// Waits until `id` is processed or skipped (failing after 20 s); answers which.
async fn finished<DB: Fixture>(inbox: &Inbox<DB>, id: &str) -> EventState {
    let key = EventKey::new("stripe", id);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let event = inbox.get(&key).await.unwrap();
        if let Some(event) = event.as_ref().filter(|e| {
            matches!(
                e.state,
                EventState::Processed | EventState::Skipped | EventState::Failed
            )
        }) {
            return event.state;
        }
        assert!(Instant::now() < deadline, "{id} never finished: {event:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Purges with a zero retention until `id` is gone (its finish time must fall strictly before
/// the purge's bound, a millisecond later at most).
async fn purge_until_gone<DB: Fixture>(inbox: &Inbox<DB>, id: &str) {
    let key = EventKey::new("stripe", id);
    let deadline = Instant::now() + Duration::from_secs(5);
    while inbox.get(&key).await.unwrap().is_some() {
        inbox.purge_batch(Duration::ZERO, 1000).await.unwrap();
        assert!(Instant::now() < deadline, "{id} was never purged");
        tokio::task::yield_now().await;
    }
}

/// The newer event of `pi_a` is processed and purged; an older one delivered afterwards is
/// skipped and never runs, and its last error names the purged event. Once the older one is
/// purged too (nothing of `pi_a` open, the position older than the retention), the position is
/// forgotten: a still older event runs.
async fn an_older_event_stays_stale_after_the_newer_one_is_purged<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let inbox = setup
        .inbox
        .clone()
        .ordering(Ordering::stripe(OrderingPolicy::SkipStale));
    let probe = setup.probe();
    let worker = quick(inbox.worker(probe.handler::<DB>())).spawn();
    let sender = Sender::new(&inbox).await;

    send(&sender, "evt_new", "pi_a", 5, "charge.updated").await;
    assert_eq!(finished(&inbox, "evt_new").await, EventState::Processed);
    purge_until_gone(&inbox, "evt_new").await;

    send(&sender, "evt_old", "pi_a", 3, "charge.updated").await;
    assert_eq!(
        finished(&inbox, "evt_old").await,
        EventState::Skipped,
        "{}: an event older than a purged processed one ran",
        DB::LABEL
    );
    assert_eq!(setup.effects("evt_old").await, 0, "{}", DB::LABEL);
    let old = setup.event("evt_old").await;
    assert!(
        old.last_error.as_deref().unwrap_or("").contains("evt_new"),
        "{}: {old:?}",
        DB::LABEL
    );
    // Another object's events are not held back by `pi_a`'s position.
    send(&sender, "evt_b", "pi_b", 1, "charge.updated").await;
    assert_eq!(finished(&inbox, "evt_b").await, EventState::Processed);

    // The skipped event purged as well: the position, written at the first purge and older
    // than the (zero) retention, goes with the same purge.
    purge_until_gone(&inbox, "evt_old").await;
    send(&sender, "evt_oldest", "pi_a", 1, "charge.updated").await;
    assert_eq!(
        finished(&inbox, "evt_oldest").await,
        EventState::Processed,
        "{}: the position outlived its retention",
        DB::LABEL
    );
    assert_eq!(
        (
            probe.runs("evt_new"),
            probe.runs("evt_old"),
            probe.runs("evt_oldest")
        ),
        (1, 0, 1),
        "{}",
        DB::LABEL
    );
    setup.finish(worker).await;
}

/// A failed older event of `pi_a` keeps the object's position past the retention: retried by
/// an operator after the newer event was purged (and after further purges), it is skipped.
async fn a_failed_older_event_is_skipped_when_retried_after_the_purge<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let inbox = setup
        .inbox
        .clone()
        .ordering(Ordering::stripe(OrderingPolicy::SkipStale));
    let probe = setup.probe();
    let worker = quick(inbox.worker(probe.handler::<DB>())).spawn();
    let sender = Sender::new(&inbox).await;

    send(&sender, "evt_2", "pi_a", 2, "test.permanent").await;
    assert_eq!(finished(&inbox, "evt_2").await, EventState::Failed);
    send(&sender, "evt_5", "pi_a", 5, "charge.updated").await;
    assert_eq!(finished(&inbox, "evt_5").await, EventState::Processed);
    purge_until_gone(&inbox, "evt_5").await;
    // Purges after the position is older than the retention keep it: `evt_2` is open.
    tokio::time::sleep(Duration::from_millis(5)).await;
    for _ in 0..3 {
        inbox.purge_batch(Duration::ZERO, 1000).await.unwrap();
    }

    assert!(inbox
        .retry(&EventKey::new("stripe", "evt_2"))
        .await
        .unwrap());
    assert_eq!(
        finished(&inbox, "evt_2").await,
        EventState::Skipped,
        "{}: a retried older event ran after the newer one was purged",
        DB::LABEL
    );
    assert_eq!(probe.runs("evt_2"), 1, "{}", DB::LABEL);
    setup.finish(worker).await;
}

on_both!(and_mysql:
    an_older_event_stays_stale_after_the_newer_one_is_purged,
    a_failed_older_event_is_skipped_when_retried_after_the_purge,
);
