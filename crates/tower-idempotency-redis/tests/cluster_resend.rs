//! A Redis Cluster whose replies get lost: redis-rs's cluster client resends a command when its
//! connection fails, even when the first attempt already ran. Each test starts its own 3-master
//! cluster behind one loopback proxy per node; the nodes advertise the proxies' ports in
//! `CLUSTER SLOTS`, so every client connection goes through a proxy, and a proxy loses the reply
//! to one chosen command (forwarding the command, then closing the connection instead of
//! delivering its reply).

mod common;

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{routing::post, Router};
use http::StatusCode;
use tower_idempotency_core::{
    store_key_from_parts, ClaimOutcome, FencingToken, Fingerprint, IdempotencyLayer, Ownership,
    RecordState, Store,
};
use tower_idempotency_redis::RedisStore;
use tower_idempotency_testkit::{skip, Proxy, Server};

/// Needles picking out the claim (`SET … NX PX … GET`) of a store with `prefix`.
fn claim_of(prefix: &str) -> [&[u8]; 2] {
    [prefix.as_bytes(), b"\r\nNX\r\n"]
}

/// Needles picking out the completion script (`EVALSHA`) of a store with `prefix`.
fn completion_of(prefix: &str) -> [&[u8]; 2] {
    [prefix.as_bytes(), b"EVALSHA"]
}

/// A throw-away cluster reachable only through its proxies. Dropping it closes the proxies,
/// then stops the nodes.
struct ProxiedCluster {
    proxies: Vec<Proxy>,
    cluster: common::Cluster,
}

impl ProxiedCluster {
    /// Starts the proxies, then the cluster announcing their ports, and checks that
    /// `CLUSTER SLOTS` names only proxies. `None` (after saying why) without `redis-server`.
    async fn start() -> Option<Self> {
        // The proxies listen first, the nodes start announcing the proxies' ports, and the
        // proxies then learn where the nodes listen: no port is picked and bound later.
        let mut proxies = Vec::new();
        for _ in 0..3 {
            proxies.push(Proxy::without_upstream().await);
        }
        let announced = [0, 1, 2].map(|i| proxies[i].addr.port());
        // Blocking (processes, polling): off the runtime's workers, which serve the proxies.
        let nodes =
            tokio::task::spawn_blocking(move || common::Cluster::nodes_announcing(Some(announced)))
                .await
                .expect("cluster start task");
        let cluster = match nodes {
            Ok(nodes) => {
                for (proxy, node) in proxies.iter().zip(&nodes.nodes) {
                    proxy.forward_to(format!("127.0.0.1:{}", node.port));
                }
                tokio::task::spawn_blocking(move || nodes.create().map(|()| nodes))
                    .await
                    .expect("cluster create task")
            }
            Err(why) => Err(why),
        };
        let cluster = match cluster {
            Ok(cluster) => cluster,
            Err(why) => {
                skip("the Redis Cluster resend tests", &why);
                return None;
            }
        };
        let this = Self { proxies, cluster };
        let mut con = redis::Client::open(this.cluster.urls()[0].as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let slots: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).unwrap();
        let proxy_ports: Vec<i64> = this.proxies.iter().map(|p| p.addr.port().into()).collect();
        assert_eq!(slots.len(), 3, "one slot range per master: {slots:?}");
        for range in &slots {
            let redis::Value::Array(items) = range else {
                panic!("slot range {range:?}")
            };
            let redis::Value::Array(master) = &items[2] else {
                panic!("master {items:?}")
            };
            assert!(
                matches!(master[1], redis::Value::Int(port) if proxy_ports.contains(&port)),
                "a master advertises a port that is not a proxy: {master:?}"
            );
        }
        Some(this)
    }

    fn proxy_urls(&self) -> Vec<String> {
        self.proxies
            .iter()
            .map(|p| format!("redis://{}", p.addr))
            .collect()
    }

    /// A store on a cluster client that knows the proxies only, with its own prefix.
    async fn store(&self) -> RedisStore {
        let connection = redis::cluster::ClusterClientBuilder::new(self.proxy_urls())
            .connection_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_secs(2))
            .build()
            .expect("cluster client")
            .get_async_connection()
            .await
            .expect("cluster connection");
        let store = RedisStore::cluster(connection, &common::random_prefix()).expect("prefix");
        store.preload_scripts().await.expect("script load");
        store
    }

    /// Arms the proxy of the master that owns `redis_key`'s slot (the node its commands go to)
    /// to lose the reply to the next command containing every one of `needles`. Only that
    /// proxy: while the client rebuilds the lost connection it may send the resend to another
    /// master first (which answers `MOVED`), and losing that reply as well would be a second
    /// fault.
    fn lose_reply_to(&self, redis_key: &str, needles: &[&[u8]]) {
        let mut con = redis::Client::open(self.cluster.urls()[0].as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(redis_key)
            .query(&mut con)
            .unwrap();
        let ranges: Vec<(i64, i64, Vec<redis::Value>)> =
            redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).unwrap();
        let (_, _, master) = ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .expect("every slot is served");
        let redis::Value::Int(port) = master[1] else {
            panic!("master {master:?}")
        };
        let owner = self
            .proxies
            .iter()
            .find(|p| i64::from(p.addr.port()) == port)
            .expect("the owner is a proxy");
        owner.lose_reply_to(needles);
    }

    fn lost_replies(&self) -> usize {
        self.proxies.iter().map(Proxy::lost_replies).sum()
    }
}

const LEASE: Duration = Duration::from_secs(30);

/// The claim runs on its master, its reply is lost, the client resends it and gets back the
/// record the first attempt wrote, with our token: the claim is ours, not a duplicate in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_claim_is_claimed_not_in_flight() {
    let Some(cluster) = ProxiedCluster::start().await else {
        return;
    };
    let store = cluster.store().await;
    let fp = Fingerprint([3; 32]);
    let token = FencingToken::random().unwrap();
    cluster.lose_reply_to(&store.redis_key("resent-claim"), &claim_of(store.prefix()));
    let claimed = store.claim("resent-claim", &fp, token, LEASE).await;
    assert_eq!(
        cluster.lost_replies(),
        1,
        "the first attempt's reply was lost"
    );
    assert!(
        matches!(claimed, Ok(ClaimOutcome::Claimed { token: t }) if t == token),
        "{claimed:?}"
    );
    // One record, held by our token: the first attempt wrote it, the resend found it.
    assert!(matches!(
        store.get("resent-claim").await.unwrap(),
        Some(RecordState::InFlight { token: t, .. }) if t == token
    ));
    let other = store
        .claim("resent-claim", &fp, FencingToken::random().unwrap(), LEASE)
        .await
        .unwrap();
    assert!(
        matches!(other, ClaimOutcome::InFlight { .. }),
        "another token is still a duplicate: {other:?}"
    );
}

/// The completion script runs, its reply is lost, the client resends it and the script finds
/// the record completed by our token: `Current`, and the record is the first attempt's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_completion_answers_current() {
    let Some(cluster) = ProxiedCluster::start().await else {
        return;
    };
    let store = cluster.store().await;
    let fp = Fingerprint([4; 32]);
    let token = FencingToken::random().unwrap();
    assert!(matches!(
        store
            .claim("resent-completion", &fp, token, LEASE)
            .await
            .unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let response = tower_idempotency_core::CachedResponse {
        status: StatusCode::CREATED,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from_static(b"made once"),
        body_omitted: false,
    };
    cluster.lose_reply_to(
        &store.redis_key("resent-completion"),
        &completion_of(store.prefix()),
    );
    let completed = store
        .complete("resent-completion", token, &response, LEASE)
        .await;
    assert_eq!(
        cluster.lost_replies(),
        1,
        "the first attempt's reply was lost"
    );
    assert!(matches!(completed, Ok(Ownership::Current)), "{completed:?}");
    match store
        .claim(
            "resent-completion",
            &fp,
            FencingToken::random().unwrap(),
            LEASE,
        )
        .await
    {
        Ok(ClaimOutcome::Completed { record, .. }) => {
            assert_eq!(record.fingerprint, fp);
            assert_eq!(record.response, response);
        }
        other => panic!("the key is completed: {other:?}"),
    }
    // Another token's completion still changes nothing.
    assert_eq!(
        store
            .complete(
                "resent-completion",
                FencingToken::random().unwrap(),
                &response,
                LEASE
            )
            .await
            .unwrap(),
        Ownership::Stale
    );
}

/// Over real HTTP through the layer: concurrent identical requests while the claim's reply is
/// lost, then a request while the completion's reply is lost. Each key's handler runs exactly
/// once and a retry is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_lost_replies_run_the_handler_once() {
    let Some(cluster) = ProxiedCluster::start().await else {
        return;
    };
    let store = cluster.store().await;
    let prefix = store.prefix().to_owned();
    // The store key the layer uses for `key` (default scope: method and path), and its record.
    let store_key =
        |key: &str| store_key_from_parts("cluster-resend", "POST", "/orders", None, key);
    let record_of = |key: &str| store.redis_key(&store_key(key));
    let (claim_lost, completion_lost) = (record_of("claim-lost"), record_of("completion-lost"));
    let reader = store.clone();
    let (server, executions) = counting_orders(store).await;
    let url = server.url("/orders");
    let client = reqwest::Client::new();
    let send = |key: &'static str| post_order(client.clone(), url.clone(), key);

    cluster.lose_reply_to(&claim_lost, &claim_of(&prefix));
    let answers = futures_join_all((0..8).map(|_| tokio::spawn(send("claim-lost")))).await;
    assert_eq!(cluster.lost_replies(), 1, "a claim's reply was lost");
    assert_eq!(executions.load(Ordering::SeqCst), 1, "{answers:?}");
    let fresh: Vec<_> = answers
        .iter()
        .filter(|(status, replayed)| *status == StatusCode::CREATED && !replayed)
        .collect();
    assert_eq!(fresh.len(), 1, "one request ran the handler: {answers:?}");
    for (status, replayed) in &answers {
        assert!(
            *status == StatusCode::CONFLICT || *status == StatusCode::CREATED,
            "duplicates are refused or replayed: {status} {replayed}"
        );
    }
    assert_eq!(
        send("claim-lost").await,
        (StatusCode::CREATED, true),
        "a retry is replayed"
    );
    assert_eq!(executions.load(Ordering::SeqCst), 1);

    cluster.lose_reply_to(&completion_lost, &completion_of(&prefix));
    assert_eq!(send("completion-lost").await, (StatusCode::CREATED, false));
    assert_eq!(cluster.lost_replies(), 2, "a completion's reply was lost");
    assert_eq!(
        send("completion-lost").await,
        (StatusCode::CREATED, true),
        "a retry is replayed"
    );
    assert_eq!(executions.load(Ordering::SeqCst), 2);
    for key in ["claim-lost", "completion-lost"] {
        assert!(
            matches!(
                reader.get(&store_key(key)).await.unwrap(),
                Some(RecordState::Completed { .. })
            ),
            "{key}: the armed record is the layer's"
        );
    }

    server.stop().await;
}

/// A server whose `POST /orders` runs behind the layer on `store` (namespace `cluster-resend`),
/// and the count of the handler's runs.
async fn counting_orders(store: RedisStore) -> (Server, Arc<AtomicUsize>) {
    let executions = Arc::new(AtomicUsize::new(0));
    let handler = {
        let executions = executions.clone();
        move || {
            let executions = executions.clone();
            async move {
                executions.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, "made")
            }
        }
    };
    let app = Router::new()
        .route("/orders", post(handler))
        .route_layer(IdempotencyLayer::client_keys(store).namespace("cluster-resend"));
    (Server::start(app).await, executions)
}

/// Posts an order with idempotency key `key`: the status, and whether it was a replay.
async fn post_order(client: reqwest::Client, url: String, key: &str) -> (StatusCode, bool) {
    let (response, replayed) = tower_idempotency_testkit::post_order(&client, &url, key).await;
    (response.status(), replayed)
}

/// Awaits spawned tasks in order.
async fn futures_join_all<T: Send + 'static>(
    tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let tasks: Vec<_> = tasks.collect();
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.expect("task"));
    }
    out
}
