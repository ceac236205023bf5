//! Operating an inbox: list events by filters, show one, retry or discard a failed one, retry
//! failed events in bulk, purge old processed ones; as [`Inbox`] methods and as an axum
//! [`router`] to mount behind your own auth.

use std::time::Duration;

use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde::Deserialize;
use tower_idempotency_jobs::{
    admin::{Change, Operated, SameSite},
    chart::Activity,
    pauses::{check_scope, Pause},
    Unavailable,
};

use crate::{
    backend,
    event::{duration_ms, now_ms},
    BulkReplay, BulkRetry, BulkRetryOptions, EventDetail, EventFilter, EventKey, EventPage,
    EventState, EventSummary, Inbox, InboxDatabase, InboxError, StateCounts,
};

pub use crate::page::ADMIN_HEADER;
pub use tower_idempotency_jobs::{
    admin::{operator, Operator},
    audit::{AuditAction, AuditEntry},
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
        Ok(backend::list(&self.pool, &self.sql, state.job(), limit).await?)
    }

    /// One event, when the inbox holds it.
    pub async fn get(&self, key: &EventKey) -> Result<Option<EventSummary>, InboxError> {
        Ok(backend::get(&self.pool, &self.sql, key).await?)
    }

    /// Puts a failed event back to pending with a fresh count of attempts, due now, and hands
    /// it to the running worker. Answers `false` when the event is not failed (absent, pending
    /// or processed).
    pub async fn retry(&self, key: &EventKey) -> Result<bool, InboxError> {
        let retried = backend::retry(&self.pool, &self.sql, key, now_ms()).await?;
        if retried {
            self.notify(key.clone());
        }
        Ok(retried)
    }

    /// Deletes the events processed more than `older_than` ago; answers how many. Keep them
    /// longer than the providers' retry schedule: a delivery that arrives after its row was
    /// purged is stored and processed again.
    pub async fn purge_processed(&self, older_than: Duration) -> Result<u64, InboxError> {
        let now = now_ms();
        let before = now.saturating_sub(duration_ms(older_than));
        // In batches, each a statement of its own (see `purge_batch`).
        let batch = crate::retention::DEFAULT_PURGE_BATCH;
        let mut purged = 0;
        loop {
            let done =
                DB::purge_batch(&self.pool, &self.sql, before, now, i64::from(batch)).await?;
            purged += done;
            if done < u64::from(batch) {
                self.purge_orphan_attempts(batch).await?;
                return Ok(purged);
            }
        }
    }

    /// How many events are in each state.
    pub async fn counts(&self) -> Result<StateCounts, InboxError> {
        Ok(backend::counts(&self.pool, &self.sql).await?)
    }

    /// The inbox's activity per minute over the last hour: the events received, processed
    /// (done) and failed, and the oldest pending event's age at each minute's end (the page's
    /// charts; [`tower_idempotency_jobs::chart`]). Three bounded statements.
    pub async fn activity(&self) -> Result<Activity, InboxError> {
        (0..3).for_each(|_| self.sql.sent());
        Ok(DB::activity(&self.pool, &self.sql.jobs, now_ms()).await?)
    }
}

/// The inbox's operations over HTTP, JSON in and out. Mount it behind your own authentication
/// (`Router::nest("/admin/inbox", admin::router(inbox).layer(auth))`, see docs/inbox.md): it
/// lists events and changes their state.
///
/// | route | answer |
/// |---|---|
/// | `GET /page` | the operator's page (`GET /` redirects to it; docs/inbox.md) |
/// | `GET /detail?provider=..&event_id=..` | one event's page |
/// | `GET /{state}?limit=N` | `200`, an array of [`EventSummary`] in that state (`failed`, `pending`, `processed`, `skipped`; default limit 100), oldest first |
/// | `GET /counts` | `200` [`StateCounts`] |
/// | `GET /activity` | `200` [`Activity`]: per minute over the last hour, events received, processed (`done`) and failed, and the oldest pending event's age at each minute's end ([`Inbox::activity`]) |
/// | `GET /events?state=&provider=&type=&received_after=&received_before=&cursor=&limit=` | `200` [`EventPage`], newest first; times RFC 3339; `400` a bad filter or cursor |
/// | `GET /events/{provider}/{event_id}` | `200` [`EventDetail`] (credentials masked: [`Inbox::event`]), `404` |
/// | `POST /failed/{provider}/{event_id}/retry` | `202` re-queued, `404` no such failed event |
/// | `POST /events/{provider}/{event_id}/retry` | the same |
/// | `POST /events/{provider}/{event_id}/discard` | `204` discarded ([`Inbox::discard`]: deleted, or kept without its body until its authenticator's horizon), `404` no such failed event |
/// | `POST /retry` with a JSON body `{"filter": {..}, "dry_run": bool, "per_second": n}` | `200` [`BulkRetry`] (the filter's fields as [`EventFilter`]) |
/// | `POST /events/{provider}/{event_id}/replay` | `202` replayed ([`Inbox::replay`]: the handler runs it again), `404` no such processed or skipped event with its body |
/// | `POST /replay` with a JSON body `{"filter": {..}, "dry_run": bool, "per_second": n}` | `200` [`BulkReplay`] ([`Inbox::replay_matching`]) |
/// | `POST /purge?older_than_secs=N` (or a JSON body `{"older_than_secs": N}`) | `200 {"purged": n}` |
/// | `GET /pauses` | `200`, an array of [`Pause`] |
/// | `POST /pauses` `{"scope": "stripe"}` or `{"scope": "stripe/invoice.paid"}` | `201` paused ([`Inbox::pause`], scopes as [`pause_scope`]), `200` paused already, `400` an empty scope |
/// | `POST /pauses/resume` `{"scope": ".."}` | `200` resumed, `404` not paused |
/// | `GET /audit?limit=N` | `200`, the newest [`AuditEntry`]s, newest first (default 20) |
///
/// Every change that took effect (not a dry run) is audited as made by the request's
/// [`Operator`]: name it from your own authentication with
/// `axum::middleware::from_fn(admin::operator::<YourUser>)` around this router
/// ([`tower_idempotency_jobs::admin::operator`]).
///
/// The routes shared with the outbox's router (listing by state, counts, activity, one event,
/// retry, discard, purge) are the job engine's [`tower_idempotency_jobs::admin::routes`].
///
/// Every `POST` needs the [`ADMIN_HEADER`] header or a `Content-Type: application/json`
/// body, and is refused `403` without: neither can come from another site's form, so a browser
/// carrying the operator's cookies cannot be made to send one. A database failure is a `503`
/// problem.
///
/// The page and the routes behind your authentication check:
///
/// ```no_run
/// use axum::{
///     extract::Request,
///     http::{HeaderMap, StatusCode},
///     middleware::{self, Next},
///     response::Response,
///     Router,
/// };
/// use tower_idempotency_inbox::{admin, Inbox};
/// use tower_idempotency_sqlx::sqlx::Postgres;
///
/// /// Your own check: a session, a client certificate, or (as here) the identity header of an
/// /// SSO proxy in front of the application that strips it from clients' requests.
/// fn is_operator(headers: &HeaderMap) -> bool {
///     headers.contains_key("x-sso-operator")
/// }
///
/// async fn operators_only(request: Request, next: Next) -> Result<Response, StatusCode> {
///     if is_operator(request.headers()) {
///         Ok(next.run(request).await)
///     } else {
///         Err(StatusCode::UNAUTHORIZED)
///     }
/// }
///
/// fn app(inbox: Inbox<Postgres>) -> Router {
///     let admin = admin::router(inbox).layer(middleware::from_fn(operators_only));
///     // The operator's page is then at /admin/inbox/page.
///     Router::new().nest("/admin/inbox", admin)
/// }
/// ```
pub fn router<DB: InboxDatabase>(inbox: Inbox<DB>) -> Router {
    tower_idempotency_jobs::admin::routes::<Inbox<DB>>("/events/{provider}/{event_id}")
        .route("/events", get(events::<DB>))
        .route(
            "/failed/{provider}/{event_id}/retry",
            post(
                |_: SameSite,
                 who: Operator,
                 State(inbox): State<Inbox<DB>>,
                 Path(key): Path<(String, String)>| async move {
                    Change::Retry.apply(&inbox, &key, &who).await
                },
            ),
        )
        .route("/retry", post(retry_matching::<DB>))
        .route("/events/{provider}/{event_id}/replay", post(replay::<DB>))
        .route("/replay", post(replay_matching::<DB>))
        .merge(crate::page::routes())
        .with_state(inbox)
}

/// The inbox as the job engine's operator routes drive it; a key is the path's
/// `{provider}/{event_id}`.
impl<DB: InboxDatabase> Operated for Inbox<DB> {
    type Key = (String, String);
    type State = EventState;
    type Summary = EventSummary;
    type Detail = EventDetail;
    type Counts = StateCounts;

    const ADMIN_HEADER: &'static str = ADMIN_HEADER;
    const DISCARDED: StatusCode = StatusCode::NO_CONTENT;

    fn state(name: &str) -> Option<EventState> {
        EventState::ALL
            .into_iter()
            .find(|state| state.as_str() == name)
    }

    async fn list(&self, state: EventState, limit: u32) -> Result<Vec<EventSummary>, Unavailable> {
        Ok(Inbox::list(self, state, limit).await?)
    }

    async fn detail(
        &self,
        (provider, event_id): &(String, String),
    ) -> Result<Option<EventDetail>, Unavailable> {
        Ok(self
            .event(&EventKey::new(provider.clone(), event_id.clone()))
            .await?)
    }

    async fn retry(&self, (provider, event_id): &(String, String)) -> Result<bool, Unavailable> {
        Ok(Inbox::retry(self, &EventKey::new(provider.clone(), event_id.clone())).await?)
    }

    async fn discard(&self, (provider, event_id): &(String, String)) -> Result<bool, Unavailable> {
        Ok(Inbox::discard(self, &EventKey::new(provider.clone(), event_id.clone())).await?)
    }

    async fn counts(&self) -> Result<StateCounts, Unavailable> {
        Ok(Inbox::counts(self).await?)
    }

    async fn purge(&self, older_than: Duration) -> Result<u64, Unavailable> {
        Ok(self.purge_processed(older_than).await?)
    }

    async fn activity(&self) -> Result<Activity, Unavailable> {
        Ok(Inbox::activity(self).await?)
    }

    fn target((provider, event_id): &(String, String)) -> String {
        format!("{provider}/{event_id}")
    }

    async fn audit(&self, entry: AuditEntry) {
        // A failure is logged by the record; the change it records stands.
        let _ = Inbox::audit(self, &entry).await;
    }

    async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, Unavailable> {
        Ok(Inbox::audit_log(self, limit).await?)
    }
    async fn pauses(&self) -> Result<Vec<Pause>, Unavailable> {
        Ok(Inbox::pauses(self).await?)
    }

    async fn pause(&self, scope: &str, by: &str) -> Result<bool, Unavailable> {
        Ok(self.pause_scope(scope, by).await?)
    }

    async fn resume(&self, scope: &str) -> Result<bool, Unavailable> {
        Ok(self.resume_scope(scope).await?)
    }
}

/// The scope of a pause of `provider`'s events, or of those of its events whose body's
/// top-level `"type"` is `event_type`: `{provider}` or `{provider}/{event_type}`.
pub fn pause_scope(provider: &str, event_type: Option<&str>) -> String {
    match event_type {
        Some(kind) => format!("{}/{}", provider.trim(), kind.trim()),
        None => provider.trim().to_owned(),
    }
}

impl<DB: InboxDatabase> Inbox<DB> {
    /// Pauses the processing of `provider`'s events, or (with `event_type`) of those of its
    /// events whose body's top-level `"type"` is `event_type`, recording `by` as who paused it;
    /// answers whether it was not paused already.
    ///
    /// Paused events are still acknowledged and stored; they stay pending and spend no attempt.
    /// The pause is stored in the `{table}_pauses` table ([`pause_scope`] names it), so it holds
    /// for every worker on the table and across restarts. A worker sees it within
    /// [`REFRESH`](tower_idempotency_jobs::pauses::REFRESH) (at once through this handle's
    /// clones); an attempt already running finishes.
    pub async fn pause(
        &self,
        provider: &str,
        event_type: Option<&str>,
        by: &str,
    ) -> Result<bool, InboxError> {
        self.pause_scope(&pause_scope(provider, event_type), by)
            .await
    }

    /// Resumes what [`pause`](Self::pause) paused: its parked events are due at once (a worker
    /// takes them at its next sweep). Answers whether it was paused.
    pub async fn resume(
        &self,
        provider: &str,
        event_type: Option<&str>,
    ) -> Result<bool, InboxError> {
        self.resume_scope(&pause_scope(provider, event_type)).await
    }

    /// The paused scopes ([`pause_scope`]), by scope.
    pub async fn pauses(&self) -> Result<Vec<Pause>, InboxError> {
        Ok(DB::pauses(&self.pool, &self.sql.jobs).await?)
    }

    async fn pause_scope(&self, scope: &str, by: &str) -> Result<bool, InboxError> {
        let scope = scope.trim();
        check_scope(scope)?;
        Ok(DB::pause(&self.pool, &self.sql.jobs, scope, now_ms(), by).await?)
    }

    async fn resume_scope(&self, scope: &str) -> Result<bool, InboxError> {
        Ok(DB::resume(&self.pool, &self.sql.jobs, scope.trim(), now_ms()).await?)
    }
}

impl EventFilter {
    /// The filter as the audit names a bulk call's target: its set fields (`provider=stripe
    /// type=charge.failed`), or `all events`.
    pub fn described(&self) -> String {
        let mut parts = Vec::new();
        if let Some(state) = self.state {
            parts.push(format!("state={}", state.as_str()));
        }
        if let Some(provider) = &self.provider {
            parts.push(format!("provider={provider}"));
        }
        if let Some(kind) = &self.event_type {
            parts.push(format!("type={kind}"));
        }
        if let Some(after) = self.received_after {
            parts.push(format!("received_after={}", crate::rfc3339(after)));
        }
        if let Some(before) = self.received_before {
            parts.push(format!("received_before={}", crate::rfc3339(before)));
        }
        if parts.is_empty() {
            "all events".to_owned()
        } else {
            parts.join(" ")
        }
    }
}

/// The paging part of `GET /events`' query.
#[derive(Deserialize)]
pub(crate) struct Paging {
    pub(crate) cursor: Option<String>,
    pub(crate) limit: Option<u32>,
}

impl Paging {
    pub(crate) fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref().filter(|cursor| !cursor.is_empty())
    }
}

/// A failed listing: a cursor the inbox did not make (`400`) or the database (`503`).
pub(crate) enum ListFailure {
    BadCursor,
    Unavailable(Unavailable),
}

impl From<InboxError> for ListFailure {
    fn from(error: InboxError) -> Self {
        match error {
            InboxError::InvalidCursor => Self::BadCursor,
            error => Self::Unavailable(error.into()),
        }
    }
}

impl IntoResponse for ListFailure {
    fn into_response(self) -> Response {
        match self {
            Self::BadCursor => (
                StatusCode::BAD_REQUEST,
                "the cursor is not one the inbox made",
            )
                .into_response(),
            Self::Unavailable(unavailable) => unavailable.into_response(),
        }
    }
}

async fn events<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
    Query(filter): Query<EventFilter>,
    Query(paging): Query<Paging>,
) -> Result<Json<EventPage>, ListFailure> {
    let limit = paging.limit.unwrap_or(100);
    Ok(Json(inbox.events(&filter, paging.cursor(), limit).await?))
}

/// The filter of `POST /retry`: an [`EventFilter`] whose unknown fields are refused (a
/// misspelt field must not widen a bulk retry to every failed event).
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StrictFilter {
    #[serde(default, deserialize_with = "crate::ops::filter_fields::state")]
    state: Option<EventState>,
    #[serde(default, deserialize_with = "crate::ops::filter_fields::text")]
    provider: Option<String>,
    #[serde(
        default,
        rename = "type",
        deserialize_with = "crate::ops::filter_fields::text"
    )]
    event_type: Option<String>,
    #[serde(default, deserialize_with = "crate::ops::filter_fields::time")]
    received_after: Option<std::time::SystemTime>,
    #[serde(default, deserialize_with = "crate::ops::filter_fields::time")]
    received_before: Option<std::time::SystemTime>,
}

impl From<StrictFilter> for EventFilter {
    fn from(strict: StrictFilter) -> Self {
        Self {
            state: strict.state,
            provider: strict.provider,
            event_type: strict.event_type,
            received_after: strict.received_after,
            received_before: strict.received_before,
        }
    }
}

/// The body of `POST /retry`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkRetryRequest {
    #[serde(default)]
    filter: StrictFilter,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    per_second: Option<std::num::NonZeroU32>,
}

impl BulkRetryRequest {
    fn options(&self) -> BulkRetryOptions {
        BulkRetryOptions {
            dry_run: self.dry_run,
            per_second: self.per_second,
        }
    }
}

async fn retry_matching<DB: InboxDatabase>(
    _: SameSite,
    who: Operator,
    State(inbox): State<Inbox<DB>>,
    Json(request): Json<BulkRetryRequest>,
) -> Result<Json<BulkRetry>, Unavailable> {
    let options = request.options();
    let filter: EventFilter = request.filter.into();
    let retried = inbox.retry_matching(&filter, options).await?;
    if !options.dry_run {
        let target = EventFilter {
            state: Some(EventState::Failed),
            ..filter
        };
        let entry = AuditEntry::now(
            who.name(),
            AuditAction::BulkRetry,
            target.described(),
            retried.retried,
        );
        Operated::audit(&inbox, entry).await;
    }
    Ok(Json(retried))
}

/// `POST /events/{provider}/{event_id}/replay`.
async fn replay<DB: InboxDatabase>(
    _: SameSite,
    who: Operator,
    State(inbox): State<Inbox<DB>>,
    Path((provider, event_id)): Path<(String, String)>,
) -> Result<StatusCode, Unavailable> {
    let key = EventKey::new(provider, event_id);
    if !inbox.replay(&key).await? {
        return Ok(StatusCode::NOT_FOUND);
    }
    let target = format!("{}/{}", key.provider, key.event_id);
    let entry = AuditEntry::now(who.name(), AuditAction::Replay, target, 1);
    Operated::audit(&inbox, entry).await;
    Ok(StatusCode::ACCEPTED)
}

/// `POST /replay`: the body of a bulk retry, over processed and skipped events.
async fn replay_matching<DB: InboxDatabase>(
    _: SameSite,
    who: Operator,
    State(inbox): State<Inbox<DB>>,
    Json(request): Json<BulkRetryRequest>,
) -> Result<Json<BulkReplay>, Unavailable> {
    let options = request.options();
    let filter: EventFilter = request.filter.into();
    let replayed = inbox.replay_matching(&filter, options).await?;
    if !options.dry_run {
        let entry = AuditEntry::now(
            who.name(),
            AuditAction::BulkReplay,
            filter.described(),
            replayed.replayed,
        );
        Operated::audit(&inbox, entry).await;
    }
    Ok(Json(replayed))
}
