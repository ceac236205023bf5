//! Checks for stores that push notices of settled keys ([`Store::settlements`]): the notices
//! themselves, and waiters on another instance woken by them instead of a timer. Each takes
//! two store objects over one backend (separate pools or clients, as two application
//! instances would have), used by no other check at the same time: the checks count the
//! claims and subscriptions of those objects.

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use futures_util::FutureExt;
use http::StatusCode;

use super::CountingStore;
use super::{
    claim_token, fingerprint, fresh_key, response,
    server::{concurrent_posts, until},
    token as fencing,
    waiting::{one_result_for_all, serve_waiting, First},
    LONG, MAX_WAIT,
};
use crate::store::{Ownership, Settlement, Settlements, Store};

/// How long a notice may take to arrive before a check fails.
const NOTICE_WITHIN: Duration = Duration::from_secs(10);

/// The store's notices, with its subscription up.
async fn ready_notices(store: &dyn Store) -> Settlements {
    let notices = store
        .settlements()
        .expect("this check is for stores with notices (Store::settlements)");
    tokio::time::timeout(Duration::from_secs(30), notices.ready())
        .await
        .expect("the store's subscription comes up");
    notices
}

/// Marks `key`, in flight, as waited on ([`Settlements::watch`]), as a waiter does.
async fn watched(notices: &Settlements, key: &str) {
    assert!(
        notices.watch(key).await.expect("watch"),
        "an in-flight key can be watched"
    );
}

async fn notified(what: &str, settlement: &mut Settlement) {
    tokio::time::timeout(NOTICE_WITHIN, settlement.settled())
        .await
        .unwrap_or_else(|_| panic!("no notice: {what}"));
}

fn not_notified(what: &str, settlement: &mut Settlement) {
    assert!(
        settlement.settled().now_or_never().is_none(),
        "a notice for nothing: {what}"
    );
}

/// `complete`, `release` and `forget` on one store object of keys that a waiter watches
/// ([`Settlements::watch`]) are notified, by key, to the subscribers of another over the same
/// backend; a stale `complete` or `release` (another
/// token) changes nothing and sends nothing. Notices arrive in order, so a later key's notice
/// proves that none came for the stale calls before it.
pub async fn settlements_are_notified_across_instances(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let notices = ready_notices(b.as_ref()).await;
    let fp = fingerprint(1);
    for what in ["complete", "release", "forget"] {
        let key = fresh_key("notice");
        let mut settlement = notices.subscribe(&key);
        let token = fencing(claim_token(a.as_ref(), &key, &fp, LONG).await);
        watched(&notices, &key).await;
        let changed = match what {
            "complete" => {
                a.complete(&key, token, &response("done"), LONG)
                    .await
                    .expect("complete")
                    == Ownership::Current
            }
            "release" => a.release(&key, token).await.expect("release") == Ownership::Current,
            _ => a.forget(&key).await.expect("forget"),
        };
        assert!(changed, "{what} took effect");
        notified(what, &mut settlement).await;
    }

    let stale = fresh_key("notice-stale");
    let mut stale_settlement = notices.subscribe(&stale);
    let token = claim_token(a.as_ref(), &stale, &fp, LONG).await;
    watched(&notices, &stale).await;
    let other = fencing(token ^ 1);
    a.release(&stale, other).await.expect("stale release");
    a.complete(&stale, other, &response("x"), LONG)
        .await
        .expect("stale complete");
    let later = fresh_key("notice-later");
    let mut later_settlement = notices.subscribe(&later);
    let later_token = fencing(claim_token(a.as_ref(), &later, &fp, LONG).await);
    watched(&notices, &later).await;
    a.release(&later, later_token).await.expect("release");
    notified("the later key", &mut later_settlement).await;
    not_notified("stale calls", &mut stale_settlement);
    drop((stale_settlement, later_settlement));
    assert_eq!(notices.subscribed_keys(), 0, "unsubscribed on drop");
}

/// Two application instances with `wait_for_result` over one backend whose stores push
/// notices: 25 concurrent identical POSTs spread over both (a 500 ms handler) run it once and
/// all get its `201`. The waiters on the instance not running it are woken by the store's
/// notice: each claims twice (on arrival, after the notice), where re-claiming on the 50 ms
/// doubling timer would take five claims within the 500 ms. Afterwards no subscription is left.
pub async fn waiting_across_instances_is_notified_over_http(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let counted = [
        Arc::new(CountingStore::new(a)),
        Arc::new(CountingStore::new(b)),
    ];
    let mut notices = Vec::new();
    for store in &counted {
        notices.push(ready_notices(store.as_ref()).await);
    }
    let executions = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let wait = MAX_WAIT;
    let mut servers = Vec::new();
    for store in &counted {
        let store: Arc<dyn Store> = store.clone();
        servers.push(serve_waiting(store, executions.clone(), wait, First::Succeeds).await);
    }
    let urls: Vec<_> = servers.iter().map(|(s, _)| s.url.clone()).collect();
    let client = reqwest::Client::new();
    let answers = concurrent_posts(&client, &urls, &fresh_key("wait-notified")).await;
    one_result_for_all(&answers);
    assert_eq!(executions.load(Ordering::SeqCst), 1);

    // `concurrent_posts` sends request `i` to `urls[i % 2]`.
    let ran = answers
        .iter()
        .position(|(_, replayed, _)| !replayed)
        .expect("one execution")
        % 2;
    let other = 1 - ran;
    let requests = (0..answers.len()).filter(|i| i % 2 == other).count();
    let claims = counted[other].claims();
    assert!(
        claims <= 3 * requests,
        "{claims} claims for {requests} requests on the instance not running the handler: \
         its waiters polled instead of being notified"
    );
    for (notices, (_, layer)) in notices.iter().zip(&servers) {
        assert_eq!(layer.waiting(), 0);
        assert_eq!(notices.subscribed_keys(), 0, "no subscription left behind");
    }
}

/// A request waiting on one instance for a holder on another, whose caller disconnects,
/// leaves nothing behind: no waiter, no subscription to the store's notices. The holder then
/// completes and the key is replayed on the other instance, run once.
pub async fn notified_waiter_leaves_nothing_behind_over_http(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let notices = ready_notices(b.as_ref()).await;
    let started = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let executions = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let first = First::Gated(started.clone(), gate.clone());
    let wait = MAX_WAIT;
    let (one, _) = serve_waiting(a, executions.clone(), wait, first.clone()).await;
    let (two, waiting_layer) = serve_waiting(b, executions.clone(), wait, first).await;
    let key = fresh_key("wait-notified-leave");
    let post = |client: &reqwest::Client, url: &str| {
        client
            .post(url)
            .header("idempotency-key", &key)
            .body("{}")
            .send()
    };
    let client = reqwest::Client::new();
    let holder = tokio::spawn(post(&client, &one.url));
    started.notified().await;

    let leaving = tokio::spawn(post(&reqwest::Client::new(), &two.url));
    until("the duplicate waits, subscribed", || {
        waiting_layer.waiting() == 1 && notices.subscribed_keys() == 1
    })
    .await;
    leaving.abort();
    let _ = leaving.await;
    until("the abandoned wait is gone", || {
        waiting_layer.waiting() == 0 && notices.subscribed_keys() == 0
    })
    .await;

    gate.notify_one();
    let first = holder.await.expect("task").expect("first request");
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = post(&client, &two.url).await.expect("retry");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}
