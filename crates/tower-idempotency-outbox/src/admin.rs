//! Operating an outbox: list messages, retry a failed one, discard one, purge old delivered
//! ones; as [`Outbox`] methods and as an axum [`router`] to mount behind your own auth.

use std::time::Duration;

use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde::Deserialize;
use tower_idempotency_core::{Problem, Rejection};

use crate::{
    outbox::{duration_ms, now_ms},
    MessageState, MessageSummary, Outbox, OutboxDatabase, OutboxError, StateCounts,
};

/// The most messages one listing returns.
pub const MAX_LIST: u32 = 1000;

impl<DB: OutboxDatabase> Outbox<DB> {
    /// Up to `limit` (at most [`MAX_LIST`]) messages in `state`, oldest first.
    pub async fn list(
        &self,
        state: MessageState,
        limit: u32,
    ) -> Result<Vec<MessageSummary>, OutboxError> {
        let limit = i64::from(limit.min(MAX_LIST));
        Ok(DB::list(&self.pool, &self.sql, state.code(), limit).await?)
    }

    /// One message, when the outbox holds it.
    pub async fn get(&self, key: &str) -> Result<Option<MessageSummary>, OutboxError> {
        Ok(DB::get(&self.pool, &self.sql, key).await?)
    }

    /// Puts a failed message back to pending with a fresh count of attempts, due now, and
    /// wakes the relays. Answers `false` when the message is not failed.
    pub async fn retry(&self, key: &str) -> Result<bool, OutboxError> {
        let retried = DB::retry(&self.pool, &self.sql, key, now_ms()).await?;
        if retried {
            self.wake();
        }
        Ok(retried)
    }

    /// Gives up a failed message, or a pending one no relay is delivering: it is marked
    /// discarded and never attempted again (its key stays taken until it is purged). Answers
    /// `false` when there is no such message.
    pub async fn discard(&self, key: &str) -> Result<bool, OutboxError> {
        Ok(DB::discard(&self.pool, &self.sql, key, now_ms()).await?)
    }

    /// Deletes the messages delivered or discarded more than `older_than` ago; answers how
    /// many. A purged message's key can be enqueued again.
    pub async fn purge_finished(&self, older_than: Duration) -> Result<u64, OutboxError> {
        let before = now_ms().saturating_sub(duration_ms(older_than));
        Ok(DB::purge(&self.pool, &self.sql, before).await?)
    }

    /// How many messages are in each state.
    pub async fn counts(&self) -> Result<StateCounts, OutboxError> {
        Ok(DB::counts(&self.pool, &self.sql).await?)
    }
}

/// The outbox's operations over HTTP, JSON in and out. Mount it behind your own authentication
/// (`Router::nest("/admin/outbox", admin::router(outbox).layer(auth))`): it lists messages and
/// changes their state.
///
/// | route | answer |
/// |---|---|
/// | `GET /{state}?limit=N` | `200`, an array of [`MessageSummary`] in that state (`pending`, `delivered`, `failed`, `discarded`; default limit 100) |
/// | `GET /counts` | `200` [`StateCounts`] |
/// | `POST /retry` `{"key": ".."}` | `202` re-queued, `404` no such failed message |
/// | `POST /discard` `{"key": ".."}` | `200` discarded, `404` no such failed or idle pending message |
/// | `POST /purge` `{"older_than_secs": N}` | `200 {"purged": n}` |
///
/// Every `POST` takes a JSON body and answers `415` without `Content-Type: application/json`,
/// which a page on another site cannot send through an operator's browser without a CORS
/// preflight (the router answers none): a cross-site form cannot retry, discard or purge. Keys
/// travel in the body because they may contain `/`. A database failure is a `503` problem.
pub fn router<DB: OutboxDatabase>(outbox: Outbox<DB>) -> Router {
    Router::new()
        .route("/counts", get(counts::<DB>))
        .route("/{state}", get(list::<DB>))
        .route("/retry", post(retry::<DB>))
        .route("/discard", post(discard::<DB>))
        .route("/purge", post(purge::<DB>))
        .with_state(outbox)
}

/// A database failure, answered without its details.
struct Unavailable;

impl From<OutboxError> for Unavailable {
    fn from(error: OutboxError) -> Self {
        tracing::warn!(%error, "outbox admin call failed");
        Self
    }
}

impl IntoResponse for Unavailable {
    fn into_response(self) -> Response {
        let retry_after = Duration::from_secs(5);
        Problem::from(Rejection::StoreUnavailable { retry_after }).into_response()
    }
}

#[derive(Deserialize)]
struct Limit {
    limit: Option<u32>,
}

async fn list<DB: OutboxDatabase>(
    State(outbox): State<Outbox<DB>>,
    Path(state): Path<String>,
    Query(limit): Query<Limit>,
) -> Result<Response, Unavailable> {
    let state = match state.as_str() {
        "pending" => MessageState::Pending,
        "delivered" => MessageState::Delivered,
        "failed" => MessageState::Failed,
        "discarded" => MessageState::Discarded,
        _ => return Ok(StatusCode::NOT_FOUND.into_response()),
    };
    let messages = outbox.list(state, limit.limit.unwrap_or(100)).await?;
    Ok(Json(messages).into_response())
}

async fn counts<DB: OutboxDatabase>(
    State(outbox): State<Outbox<DB>>,
) -> Result<Json<StateCounts>, Unavailable> {
    Ok(Json(outbox.counts().await?))
}

#[derive(Deserialize)]
struct Key {
    key: String,
}

async fn retry<DB: OutboxDatabase>(
    State(outbox): State<Outbox<DB>>,
    Json(body): Json<Key>,
) -> Result<StatusCode, Unavailable> {
    Ok(if outbox.retry(&body.key).await? {
        StatusCode::ACCEPTED
    } else {
        StatusCode::NOT_FOUND
    })
}

async fn discard<DB: OutboxDatabase>(
    State(outbox): State<Outbox<DB>>,
    Json(body): Json<Key>,
) -> Result<StatusCode, Unavailable> {
    Ok(if outbox.discard(&body.key).await? {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    })
}

#[derive(Deserialize)]
struct Purge {
    older_than_secs: u64,
}

async fn purge<DB: OutboxDatabase>(
    State(outbox): State<Outbox<DB>>,
    Json(purge): Json<Purge>,
) -> Result<Json<serde_json::Value>, Unavailable> {
    let older_than = Duration::from_secs(purge.older_than_secs);
    let purged = outbox.purge_finished(older_than).await?;
    Ok(Json(serde_json::json!({ "purged": purged })))
}
