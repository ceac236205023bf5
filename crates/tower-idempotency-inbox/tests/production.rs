//! The inbox where production handlers break, over real HTTP on a SQLite file and on Postgres
//! (each test with tables of its own): handlers slower than the lease, hanging handlers, handlers
//! that read before they write under load, and retries while acknowledgements keep arriving.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;
use tower_idempotency_inbox::{EventKey, EventState, Inbox};
use tower_idempotency_sqlx::sqlx;

/// Three handlers that hold their attempt until the test opens their gate, past four times the
/// lease (1 s, renewed every third of it: long enough that a loaded machine renews in time), and
/// ten quick events delivered once all three run: the quick ones are processed while the three
/// still run (their gate is opened only after that is asserted), and the slow events keep their
/// claim, which a second worker on the table, started once they run, would take if it lapsed:
/// once all are processed and both workers drained, each ran once, on its first attempt, with
/// one effect, and nothing failed.
async fn slow_handler_keeps_its_lease<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let lease = Duration::from_millis(1000);
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .lease(lease)
        .concurrency(4)
        .max_attempts(4)
        .spawn();
    let sender = Sender::new(&setup.inbox).await;
    let slow = sender.deliver("evt_slow", 3, "test.gated").await;
    probe.wait_started(3).await;
    let started = tokio::time::Instant::now();
    let other = Inbox::new(setup.pool.clone(), &setup.inbox_table).unwrap();
    let second = quick(other.worker(probe.handler::<DB>()))
        .lease(lease)
        .max_attempts(4)
        .spawn();
    let quick_ids = sender.deliver("evt_quick", 10, "charge.succeeded").await;
    for id in &quick_ids {
        setup.wait_for(id, EventState::Processed).await;
    }
    for id in &slow {
        let event = setup.event(id).await;
        assert_eq!(
            (event.state, event.attempts, probe.runs(id)),
            (EventState::Pending, 1, 1),
            "{}: {id} still runs its first attempt",
            DB::LABEL
        );
        assert_eq!(setup.effects(id).await, 0, "{}: {id}", DB::LABEL);
    }
    // The claims must outlive four leases: a lease ends on the clock, with no signal to await.
    tokio::time::sleep_until(started + 4 * lease).await;
    probe.open_gate();
    for id in &slow {
        setup.wait_for(id, EventState::Processed).await;
    }
    for worker in [worker, second] {
        assert!(worker.drain(Duration::from_secs(30)).await);
    }
    for id in slow.iter().chain(&quick_ids) {
        assert_eq!(setup.event(id).await.attempts, 1, "{}: {id}", DB::LABEL);
        assert_eq!(probe.runs(id), 1, "{}: {id}", DB::LABEL);
        assert_eq!(setup.effects(id).await, 1, "{}: {id}", DB::LABEL);
    }
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!((counts.processed, counts.failed), (13, 0), "{}", DB::LABEL);
    setup.cleanup().await;
}

/// A handler that writes its effect, then never returns, with `concurrency(2)`, a 1.5 s attempt
/// timeout and two attempts, while ten other events are delivered: the ten are processed once
/// each; each attempt of the hanging event is cancelled, its write rolled back (no effect), and
/// it ends failed after two attempts with the timeout as its last error. (On SQLite its write
/// holds the database's write lock until the attempt is cancelled: the others wait for that,
/// within their own attempt timeout, and a handler whose first statement meets that lock runs
/// again in the same attempt. There an other event may spend its first attempt waiting through
/// both of the hanging event's attempts, so its attempts are at most two and its runs at least
/// its attempts; the effects are exact on both databases.)
async fn hanging_handler_holds_only_its_permit<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .concurrency(2)
        .lease(Duration::from_millis(1000))
        .attempt_timeout(Duration::from_millis(1500))
        .max_attempts(2)
        .spawn();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let hang = event_body("evt_hang", "test.write_hang");
    assert_eq!(deliver(&client, &url, SECRET, &hang).await, 200);
    probe.wait_started(1).await;
    let others = ids("evt_other", 10);
    deliver_all(&client, &url, &others, "charge.succeeded").await;
    // Runs, exactly on Postgres; on SQLite a run that met the lock is run again.
    let ran = |runs: u32, attempts: u32| {
        if DB::LABEL == "postgres" {
            runs == attempts
        } else {
            runs >= attempts
        }
    };
    for id in &others {
        let attempts = setup.wait_for(id, EventState::Processed).await;
        if DB::LABEL == "postgres" {
            assert_eq!(attempts, 1, "postgres: {id}");
        } else {
            assert!(attempts <= 2, "sqlite: {id}: {attempts} attempts");
        }
        assert!(
            ran(probe.runs(id), 1),
            "{}: {id}: {}",
            DB::LABEL,
            probe.runs(id)
        );
        assert_eq!(setup.effects(id).await, 1, "{}: {id}", DB::LABEL);
    }
    assert_eq!(setup.wait_for("evt_hang", EventState::Failed).await, 2);
    let event = setup.inbox.get(&EventKey::new("stripe", "evt_hang")).await;
    let error = event.unwrap().unwrap().last_error.unwrap();
    assert!(
        error.contains("timed out after 1500 ms"),
        "{}: {error}",
        DB::LABEL
    );
    let runs = probe.runs("evt_hang");
    assert!(ran(runs, 2), "{}: {runs}", DB::LABEL);
    assert_eq!(setup.effects("evt_hang").await, 0, "{}", DB::LABEL);
    setup.finish(worker).await;
}

/// A handler that answers a permanent failure: the event is failed after its first attempt
/// (of ten allowed) with the handler's message, and its write rolled back.
async fn permanent_failure_fails_at_once<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .max_attempts(10)
        .spawn();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let body = event_body("evt_permanent", "test.permanent");
    assert_eq!(deliver(&client, &url, SECRET, &body).await, 200);
    assert_eq!(setup.wait_for("evt_permanent", EventState::Failed).await, 1);
    let key = EventKey::new("stripe", "evt_permanent");
    let event = setup.inbox.get(&key).await.unwrap().unwrap();
    assert_eq!(
        event.last_error.as_deref(),
        Some("unknown account: do not retry")
    );
    assert!(worker.drain(Duration::from_secs(30)).await);
    assert_eq!(probe.runs("evt_permanent"), 1, "{}", DB::LABEL);
    assert_eq!(setup.effects("evt_permanent").await, 0, "{}", DB::LABEL);
    setup.cleanup().await;
}

/// 200 concurrent deliveries of events whose handler reads the effects table in its
/// transaction, then writes: every event is processed on its first attempt, none fails.
async fn read_then_write_under_load<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe();
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .max_attempts(4)
        .spawn();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let all = ids("evt_rw", 200);
    deliver_all(&client, &url, &all, "test.readwrite").await;
    let mut retried = Vec::new();
    for id in &all {
        let key = EventKey::new("stripe", id.as_str());
        let deadline = Instant::now() + Duration::from_secs(60);
        let event = loop {
            let event = setup.inbox.get(&key).await.unwrap().unwrap();
            if event.state != EventState::Pending {
                break event;
            }
            assert!(Instant::now() < deadline, "{}: {id} stuck", DB::LABEL);
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            event.state,
            EventState::Processed,
            "{}: {id}: {:?}",
            DB::LABEL,
            event.last_error
        );
        if event.attempts != 1 {
            retried.push((id.clone(), event.attempts));
        }
    }
    assert!(retried.is_empty(), "{}: retried: {retried:?}", DB::LABEL);
    let counts = setup.inbox.counts().await.unwrap();
    assert_eq!((counts.processed, counts.failed), (200, 0), "{}", DB::LABEL);
    setup.finish(worker).await;
}

/// A sustained stream: 150 events (handlers of 50 ms, two at a time) sent 10 ms apart,
/// faster than they are processed, so the queue is never empty while it lasts. The 21st
/// delivery is an event whose first attempt fails; its retry is due at most 20 ms later and the
/// sweeper looks every 20 ms. The retry must start within 3 s of the failed attempt and before
/// 20 more stream events have started, not after the queue has emptied.
async fn retry_runs_under_sustained_stream<DB: Fixture>() {
    let setup = Setup::<DB>::new().await;
    let probe = setup.probe().slow(Duration::from_millis(50));
    let worker = quick(setup.inbox.worker(probe.handler::<DB>()))
        .concurrency(2)
        .max_attempts(4)
        .spawn();
    let url = serve(&setup.inbox).await;
    let client = reqwest::Client::new();
    let stream = ids("evt_stream", 150);
    // Each delivery is sent on its tick without waiting for the previous one's answer, so the
    // stream's pace does not follow the acknowledgements' (on SQLite they wait for the handlers'
    // write lock).
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut sent = Vec::new();
    for (n, id) in stream.iter().enumerate() {
        tick.tick().await;
        if n == 20 {
            let body = event_body("evt_retry", "test.flaky_once");
            assert_eq!(deliver(&client, &url, SECRET, &body).await, 200);
        }
        let body = event_body(id, "test.slow");
        let (client, url) = (client.clone(), url.clone());
        sent.push(tokio::spawn(async move {
            deliver(&client, &url, SECRET, &body).await
        }));
    }
    for delivery in sent {
        assert_eq!(delivery.await.unwrap(), 200, "{}", DB::LABEL);
    }
    assert_eq!(setup.wait_for("evt_retry", EventState::Processed).await, 2);
    for id in &stream {
        setup.wait_for(id, EventState::Processed).await;
    }
    let order = probe.order();
    let runs: Vec<(usize, Instant)> = order
        .iter()
        .enumerate()
        .filter(|(_, (id, _))| id == "evt_retry")
        .map(|(at, (_, when))| (at, *when))
        .collect();
    let [(first, failed_at), (second, retried_at)] = runs[..] else {
        panic!("{}: runs of the retried event: {runs:?}", DB::LABEL);
    };
    let between = order[first..second]
        .iter()
        .filter(|(id, _)| id.starts_with("evt_stream"))
        .count();
    let waited = retried_at - failed_at;
    let behind = order[second..]
        .iter()
        .filter(|(id, _)| id.starts_with("evt_stream"))
        .count();
    eprintln!(
        "{}: first run at {first}; the retry started {waited:?} after its failure, after {between} stream runs; \
         {behind} stream runs started after it",
        DB::LABEL
    );
    assert!(
        between < 20,
        "{}: the retry waited for {between} stream events ({waited:?})",
        DB::LABEL
    );
    assert!(
        behind > 0,
        "{}: the stream was over before the retry; the test proved nothing",
        DB::LABEL
    );
    assert!(waited < Duration::from_secs(3), "{}: {waited:?}", DB::LABEL);
    setup.finish(worker).await;
}

on_both!(
    slow_handler_keeps_its_lease,
    hanging_handler_holds_only_its_permit,
    permanent_failure_fails_at_once,
    read_then_write_under_load,
    retry_runs_under_sustained_stream,
);
