//! Test helpers shared by the tower-idempotency workspace (unpublished): a dev-dependency of the
//! crates whose tests use them, and a dependency of the load harness.
//!
//! - The environment: where the shared Postgres and Redis are, and the rule that a missing
//!   service skips a test outside CI and fails it under `CI=true` ([`skip`]).
//! - Logs: what `tracing` wrote on the test's thread ([`CapturedLogs`]).
//! - Metrics: a recording recorder's snapshot by metric name and sorted labels ([`snapshot`],
//!   [`metric_id`]).
//! - Ports: the rule that no port is picked, let go and bound later, and the [`ReservedPort`]
//!   of a child server that cannot bind port 0 itself.
//! - HTTP: an app served on a loopback port it binds itself ([`serve`], [`Server`]), and
//!   the handler and request the layer's bench and profile loop measure ([`echo_created`],
//!   [`order_request`]), and an order posted over HTTP ([`post_order`]).
//! - Polling: asking again until a condition holds, failing after a bound ([`poll_until`]).
//! - A loopback TCP [`Proxy`] that injects faults and counts what clients send.
//! - Throw-away `redis-server` processes (plain, or serving TLS too) and a 3-master
//!   [`Cluster`], on reserved ports.
//! - Certificates for TLS servers: a CA of the test's own and a server certificate it signed
//!   ([`TestCertificates`]).
//! - Stores that forward to another store with a twist ([`Hooked`], [`Guarded`],
//!   [`CountingStore`], [`Outage`]).
//! - The tables a job table's `migrate` creates, to drop at a test's end ([`job_tables`],
//!   [`drop_job_tables_sql`]).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod env;
mod http;
mod logs;
mod metrics;
mod mysql;
mod poll;
mod ports;
mod proxy;
mod redis_server;
mod stores;
mod tables;
mod tls;

pub use env::{
    database_url, host_port, in_ci, postgres_or_skip, random_suffix, random_u64, reachable,
    redis_url, skip, unix_now, which,
};
pub use http::{
    created_json, delivery_status, echo_created, order_body, order_request, post_order, serve,
    HeldHandler, Server,
};
pub use logs::CapturedLogs;
pub use metrics::{metric_id, snapshot, MetricId};
pub use mysql::{mysql_or_skip, mysql_table, mysql_url};
pub use poll::{poll_until, POLL_WITHIN};
pub use ports::ReservedPort;
pub use proxy::{Mode, Protocol, Proxy};
pub use redis_server::{Cluster, RedisServer, DURABLE};
pub use stores::{Call, CountClaims, CountingStore, Guard, Guarded, Hooked, Hooks, Outage};
pub use tables::{drop_job_tables_sql, job_tables, JOB_SIDE_TABLES};
pub use tls::{CertificateFiles, TestCertificates};
