//! The connection to a single server or a cluster, and the round trips a store makes on it:
//! one command, one script (`EVALSHA` with the `NOSCRIPT` fallback), or a pipeline ending in a
//! script, each within the store's timeout and with its errors mapped to [`StoreError`].

use std::time::Duration;

use redis::{
    aio::{ConnectionLike, ConnectionManager},
    cluster_async::ClusterConnection,
    Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ScriptInvocation, ServerErrorKind, Value,
};
use tower_idempotency_core::StoreError;

use crate::RedisStore;

/// One server through a reconnecting manager, or a cluster. Either routes each command itself,
/// so the store sends through [`ConnectionLike`] without knowing which it holds.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisStore {
    /// Runs one round trip within the store timeout.
    async fn round_trip<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(self.timeout, call).await {
            // The connection's own response timeout fired: report how long it waited.
            Ok(result) => result.map_err(|e| map_error(e, started.elapsed())),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// One command in one round trip.
    pub(crate) async fn command(&self, command: &Cmd) -> Result<Value, StoreError> {
        let mut connection = self.connection.clone();
        self.round_trip(command.query_async::<Value>(&mut connection))
            .await
    }

    /// `EVALSHA`, and on `NOSCRIPT` (server restarted or failed over) `SCRIPT LOAD` and again.
    pub(crate) async fn invoke(
        &self,
        invocation: ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        let mut connection = self.connection.clone();
        self.round_trip(invocation.invoke_async::<Value>(&mut connection))
            .await
    }

    /// A pipeline ending in a script, in one round trip, with the same `NOSCRIPT` fallback. The
    /// whole pipeline is repeated after loading, so its other commands must be idempotent.
    pub(crate) async fn pipeline_with_script(
        &self,
        pipeline: &Pipeline,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        let mut c = self.connection.clone();
        self.round_trip(async {
            match pipeline.query_async::<(Value,)>(&mut c).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    invocation.load_async(&mut c).await?;
                    Ok(pipeline.query_async::<(Value,)>(&mut c).await?.0)
                }
                other => Ok(other?.0),
            }
        })
        .await
    }
}

fn map_error(error: RedisError, waited: Duration) -> StoreError {
    if error.is_timeout() {
        return StoreError::Timeout(waited);
    }
    let unavailable = error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_cluster_error()
        || matches!(
            error.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        );
    if unavailable {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Backend(Box::new(error))
    }
}
