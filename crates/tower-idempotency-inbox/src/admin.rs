//! Operating an inbox: list pending and failed events, retry a failed one, purge old processed
//! ones; as [`Inbox`] methods and as an axum [`router`] to mount behind your own auth.

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
    event::{duration_ms, now_ms},
    EventKey, EventState, EventSummary, Inbox, InboxDatabase, InboxError, StateCounts,
};

/// The most events one listing returns.
pub const MAX_LIST: u32 = 1000;

impl<DB: InboxDatabase> Inbox<DB> {
    /// Up to `limit` (at most [`MAX_LIST`]) events in `state`, oldest first.
    pub async fn list(
        &self,
        state: EventState,
        limit: u32,
    ) -> Result<Vec<EventSummary>, InboxError> {
        let limit = i64::from(limit.min(MAX_LIST));
        Ok(DB::list(&self.pool, &self.sql, state.code(), limit).await?)
    }

    /// One event, when the inbox holds it.
    pub async fn get(&self, key: &EventKey) -> Result<Option<EventSummary>, InboxError> {
        Ok(DB::get(&self.pool, &self.sql, key).await?)
    }

    /// Puts a failed event back to pending with a fresh count of attempts, due now, and hands
    /// it to the running worker. Answers `false` when the event is not failed (absent, pending
    /// or processed).
    pub async fn retry(&self, key: &EventKey) -> Result<bool, InboxError> {
        let retried = DB::retry(&self.pool, &self.sql, key, now_ms()).await?;
        if retried {
            self.notify(key.clone());
        }
        Ok(retried)
    }

    /// Deletes the events processed more than `older_than` ago; answers how many. Keep them
    /// longer than the providers' retry schedule: a delivery that arrives after its row was
    /// purged is stored and processed again.
    pub async fn purge_processed(&self, older_than: Duration) -> Result<u64, InboxError> {
        let before = now_ms().saturating_sub(duration_ms(older_than));
        Ok(DB::purge(&self.pool, &self.sql, before).await?)
    }

    /// How many events are in each state.
    pub async fn counts(&self) -> Result<StateCounts, InboxError> {
        Ok(DB::counts(&self.pool, &self.sql).await?)
    }
}

/// The inbox's operations over HTTP, JSON in and out. Mount it behind your own authentication
/// (`Router::nest("/admin/inbox", admin::router(inbox).layer(auth))`): it lists events and
/// changes their state.
///
/// | route | answer |
/// |---|---|
/// | `GET /failed?limit=N` | `200`, an array of [`EventSummary`] (default limit 100) |
/// | `GET /pending?limit=N` | the same for pending events |
/// | `GET /counts` | `200` [`StateCounts`] |
/// | `POST /failed/{provider}/{event_id}/retry` | `202` re-queued, `404` no such failed event |
/// | `POST /purge?older_than_secs=N` | `200 {"purged": n}` |
///
/// A database failure is a `503` problem.
pub fn router<DB: InboxDatabase>(inbox: Inbox<DB>) -> Router {
    Router::new()
        .route("/failed", get(list_failed::<DB>))
        .route("/pending", get(list_pending::<DB>))
        .route("/counts", get(counts::<DB>))
        .route("/failed/{provider}/{event_id}/retry", post(retry::<DB>))
        .route("/purge", post(purge::<DB>))
        .with_state(inbox)
}

/// A database failure, answered without its details.
struct Unavailable;

impl From<InboxError> for Unavailable {
    fn from(error: InboxError) -> Self {
        tracing::warn!(%error, "inbox admin call failed");
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

async fn list_failed<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
    Query(limit): Query<Limit>,
) -> Result<Json<Vec<EventSummary>>, Unavailable> {
    let events = inbox
        .list(EventState::Failed, limit.limit.unwrap_or(100))
        .await?;
    Ok(Json(events))
}

async fn list_pending<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
    Query(limit): Query<Limit>,
) -> Result<Json<Vec<EventSummary>>, Unavailable> {
    let events = inbox
        .list(EventState::Pending, limit.limit.unwrap_or(100))
        .await?;
    Ok(Json(events))
}

async fn counts<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
) -> Result<Json<StateCounts>, Unavailable> {
    Ok(Json(inbox.counts().await?))
}

async fn retry<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
    Path((provider, event_id)): Path<(String, String)>,
) -> Result<StatusCode, Unavailable> {
    let retried = inbox.retry(&EventKey::new(provider, event_id)).await?;
    Ok(if retried {
        StatusCode::ACCEPTED
    } else {
        StatusCode::NOT_FOUND
    })
}

#[derive(Deserialize)]
struct Purge {
    older_than_secs: u64,
}

async fn purge<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
    Query(purge): Query<Purge>,
) -> Result<Json<serde_json::Value>, Unavailable> {
    let older_than = Duration::from_secs(purge.older_than_secs);
    let purged = inbox.purge_processed(older_than).await?;
    Ok(Json(serde_json::json!({ "purged": purged })))
}
