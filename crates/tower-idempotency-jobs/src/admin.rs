//! The operator's routes both halves mount: list the jobs in a state, show one, retry or
//! discard it, count them, purge the finished ones. A half implements [`Operated`] for its
//! handle (the inbox's `Inbox`, the outbox's `Outbox`) and merges [`routes`] into its admin
//! router, adding what is its own (the inbox's filters and bulk retry, the outbox's key-in-body
//! forms).
//!
//! | route | answer |
//! |---|---|
//! | `GET /{state}?limit=N` | `200`, an array of the half's summaries in that state, oldest first (default limit 100); `404` a name that is no state |
//! | `GET /counts` | `200`, the half's counts per state |
//! | `GET /activity` | `200` [`Activity`](crate::chart::Activity): per minute over the last hour, the jobs received, done and failed, and the oldest pending job's age at each minute's end (the pages' charts) |
//! | `GET {item}` | `200`, one job's detail; `404` |
//! | `POST {item}/retry` | `202` re-queued; `404` no such failed job |
//! | `POST {item}/discard` | [`Operated::DISCARDED`]; `404` no such job in a state a discard applies to |
//! | `POST /purge?older_than_secs=N`, or with a JSON body `{"older_than_secs": N}` | `200 {"purged": n}`; `400` without the age |
//! | `GET /pauses` | `200`, an array of [`Pause`] by scope ([`pauses`](crate::pauses)) |
//! | `POST /pauses` `{"scope": ".."}` | `201` paused, `200` paused already; `400` an empty scope or one past [`MAX_SCOPE_LEN`](crate::pauses::MAX_SCOPE_LEN) bytes |
//! | `POST /pauses/resume` `{"scope": ".."}` | `200` resumed (its parked jobs are due now); `404` not paused |
//! | `GET /audit?limit=N` | `200`, the newest audit entries, newest first (default [`DEFAULT_AUDIT_LIMIT`]) |
//!
//! `{item}` is the half's path of one job (`/events/{provider}/{event_id}`,
//! `/messages/{key}`). Every `POST` needs the half's [`Operated::ADMIN_HEADER`] or a
//! `Content-Type: application/json` body and is refused `403` without ([`SameSite`]). A
//! database failure is a `503` problem ([`Unavailable`]).
//!
//! Every change that took effect is audited ([`audit`](crate::audit)) as made by the request's
//! [`Operator`]: name it from your own authentication with [`operator`] and your extractor.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use axum::{extract::FromRequestParts, http::request::Parts, middleware, Router};
//! use tower_idempotency_jobs::admin;
//!
//! /// The signed-in user, as the application's own auth layer put it in the request.
//! #[derive(Clone)]
//! struct User(String);
//!
//! impl std::fmt::Display for User {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str(&self.0)
//!     }
//! }
//!
//! impl<S: Send + Sync> FromRequestParts<S> for User {
//!     type Rejection = axum::http::StatusCode;
//!
//!     async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
//!         parts.extensions.get::<User>().cloned().ok_or(axum::http::StatusCode::UNAUTHORIZED)
//!     }
//! }
//!
//! /// An admin router (the inbox's or the outbox's), its changes audited as made by the user.
//! fn audited(admin: Router) -> Router {
//!     admin.layer(middleware::from_fn(admin::operator::<User>))
//! }
//! # let _ = audited(Router::new());
//! ```

use std::{convert::Infallible, fmt, future::Future, time::Duration};

use axum::{
    body::Bytes,
    extract::{FromRequestParts, Path, Query, Request, State},
    http::{request::Parts, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::{get, post, MethodRouter},
    Json, Router,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

pub use crate::audit::DEFAULT_AUDIT_LIMIT;
use crate::{
    audit::{AuditAction, AuditEntry},
    pauses::Pause,
    Unavailable,
};

/// A half's handle as the operator's routes drive it.
pub trait Operated: Clone + Send + Sync + 'static {
    /// One job's key as its path's segments deserialize (`(String, String)` for
    /// `/events/{provider}/{event_id}`, `String` for `/messages/{key}`).
    type Key: DeserializeOwned + Send + Sync + 'static;
    /// A state a listing takes.
    type State: Send + 'static;
    /// One job in a listing.
    type Summary: Serialize + Send + 'static;
    /// One job in full, as an operator is shown it (credentials masked).
    type Detail: Serialize + Send + 'static;
    /// How many jobs are in each state.
    type Counts: Serialize + Send + 'static;

    /// The header the half's page sends with its actions ([`SameSite`]).
    const ADMIN_HEADER: &'static str;
    /// What a discard answers when it took effect.
    const DISCARDED: StatusCode;

    /// The state a listing's path names, or `None` for a name that is no state.
    fn state(name: &str) -> Option<Self::State>;

    /// Up to `limit` jobs in `state`, oldest first.
    fn list(
        &self,
        state: Self::State,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<Self::Summary>, Unavailable>> + Send;

    /// One job in full, when the table holds it.
    fn detail(
        &self,
        key: &Self::Key,
    ) -> impl Future<Output = Result<Option<Self::Detail>, Unavailable>> + Send;

    /// Re-queues a failed job; answers whether it was failed.
    fn retry(&self, key: &Self::Key) -> impl Future<Output = Result<bool, Unavailable>> + Send;

    /// Gives a job up; answers whether it was in a state a discard applies to.
    fn discard(&self, key: &Self::Key) -> impl Future<Output = Result<bool, Unavailable>> + Send;

    /// How many jobs are in each state.
    fn counts(&self) -> impl Future<Output = Result<Self::Counts, Unavailable>> + Send;

    /// Deletes the jobs finished more than `older_than` ago; answers how many.
    fn purge(&self, older_than: Duration) -> impl Future<Output = Result<u64, Unavailable>> + Send;

    /// The activity per minute over the last hour ([`chart`](crate::chart)).
    fn activity(&self) -> impl Future<Output = Result<crate::chart::Activity, Unavailable>> + Send;

    /// A job's key as the audit names it (`stripe/evt_1`).
    fn target(key: &Self::Key) -> String;

    /// Logs and stores `entry` ([`audit::record`](crate::audit::record)); a failure to store
    /// is logged, and the change it records stands.
    fn audit(&self, entry: AuditEntry) -> impl Future<Output = ()> + Send;

    /// The newest `limit` audit entries, newest first.
    fn audit_log(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<AuditEntry>, Unavailable>> + Send;

    /// The paused scopes ([`pauses`](crate::pauses)).
    fn pauses(&self) -> impl Future<Output = Result<Vec<Pause>, Unavailable>> + Send;

    /// Pauses `scope` (checked: [`check_scope`](crate::pauses::check_scope)) by `by`; answers
    /// whether it was not paused already.
    fn pause(
        &self,
        scope: &str,
        by: &str,
    ) -> impl Future<Output = Result<bool, Unavailable>> + Send;

    /// Resumes `scope`; answers whether it was paused.
    fn resume(&self, scope: &str) -> impl Future<Output = Result<bool, Unavailable>> + Send;
}

/// Who makes an operator's change, as the audit records it: the request extension that
/// [`operator`] sets from the user's own extractor (or the user's middleware inserts);
/// [`Operator::UNIDENTIFIED`] when there is none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operator(pub String);

impl Operator {
    /// The name of a change whose request named no operator.
    pub const UNIDENTIFIED: &'static str = "unidentified";

    /// The operator's name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Operator {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Infallible> {
        Ok(parts
            .extensions
            .get::<Self>()
            .cloned()
            .unwrap_or_else(|| Self(Self::UNIDENTIFIED.to_owned())))
    }
}

/// Middleware (`axum::middleware::from_fn(operator::<E>)`) that names each request's
/// [`Operator`] with the user's extractor `E` (their signed-in user, read by their own auth
/// layer), or answers `E`'s rejection.
pub async fn operator<E>(request: Request, next: Next) -> Response
where
    E: FromRequestParts<()> + fmt::Display,
    E::Rejection: IntoResponse,
{
    let (mut parts, body) = request.into_parts();
    match E::from_request_parts(&mut parts, &()).await {
        Ok(who) => {
            parts.extensions.insert(Operator(who.to_string()));
            next.run(Request::from_parts(parts, body)).await
        }
        Err(rejection) => rejection.into_response(),
    }
}

/// The operator's routes over `O`, one job at `item` (a path with the parameters
/// [`Operated::Key`] deserializes): see the [module](self) for the table.
pub fn routes<O: Operated>(item: &str) -> Router<O> {
    Router::new()
        .route("/{state}", get(list::<O>))
        .route("/counts", get(counts::<O>))
        .route("/activity", get(activity::<O>))
        .route(item, get(detail::<O>))
        .route(&format!("{item}/retry"), change::<O>(Change::Retry))
        .route(&format!("{item}/discard"), change::<O>(Change::Discard))
        .route("/purge", post(purge::<O>))
        .route("/audit", get(audit_log::<O>))
        .route("/pauses", get(pauses::<O>).post(pause::<O>))
        .route("/pauses/resume", post(resume::<O>))
}

/// A state-changing request that a cross-site form could not have sent: it carries the
/// half's [`Operated::ADMIN_HEADER`] or a JSON content type
/// ([`same_site`](crate::page::same_site)). Rejected `403`.
#[derive(Debug)]
pub struct SameSite;

/// The refusal of a request that is not [`SameSite`].
#[derive(Debug)]
pub struct CrossSite(&'static str);

impl IntoResponse for CrossSite {
    fn into_response(self) -> Response {
        let message = format!("send the {} header or a JSON body", self.0);
        (StatusCode::FORBIDDEN, message).into_response()
    }
}

impl<O: Operated> FromRequestParts<O> for SameSite {
    type Rejection = CrossSite;

    async fn from_request_parts(parts: &mut Parts, _state: &O) -> Result<Self, Self::Rejection> {
        if crate::page::same_site(&parts.headers, O::ADMIN_HEADER) {
            Ok(Self)
        } else {
            Err(CrossSite(O::ADMIN_HEADER))
        }
    }
}

#[derive(Deserialize)]
struct Limit {
    limit: Option<u32>,
}

async fn list<O: Operated>(
    State(operated): State<O>,
    Path(state): Path<String>,
    Query(limit): Query<Limit>,
) -> Result<Response, Unavailable> {
    let Some(state) = O::state(&state) else {
        return Ok(StatusCode::NOT_FOUND.into_response());
    };
    let jobs = operated.list(state, limit.limit.unwrap_or(100)).await?;
    Ok(Json(jobs).into_response())
}

async fn audit_log<O: Operated>(
    State(operated): State<O>,
    Query(limit): Query<Limit>,
) -> Result<Json<Vec<AuditEntry>>, Unavailable> {
    let limit = limit.limit.unwrap_or(DEFAULT_AUDIT_LIMIT);
    Ok(Json(operated.audit_log(limit).await?))
}

async fn counts<O: Operated>(State(operated): State<O>) -> Result<Json<O::Counts>, Unavailable> {
    Ok(Json(operated.counts().await?))
}

async fn activity<O: Operated>(
    State(operated): State<O>,
) -> Result<Json<crate::chart::Activity>, Unavailable> {
    Ok(Json(operated.activity().await?))
}

async fn detail<O: Operated>(
    State(operated): State<O>,
    Path(key): Path<O::Key>,
) -> Result<Response, Unavailable> {
    Ok(match operated.detail(&key).await? {
        Some(detail) => Json(detail).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    })
}

/// A change an operator `POST`s on one job.
#[derive(Clone, Copy, Debug)]
pub enum Change {
    /// Re-queues a failed job: `202`.
    Retry,
    /// Gives a job up: [`Operated::DISCARDED`].
    Discard,
}

impl Change {
    /// Makes the change on the job at `key` as `who`, audits it when it took effect, and
    /// answers as the routes do: the change's status, or `404` when the job is not in a state
    /// the change applies to.
    pub async fn apply<O: Operated>(
        self,
        operated: &O,
        key: &O::Key,
        who: &Operator,
    ) -> Result<StatusCode, Unavailable> {
        let (changed, status, action) = match self {
            Self::Retry => (
                operated.retry(key).await?,
                StatusCode::ACCEPTED,
                AuditAction::Retry,
            ),
            Self::Discard => (
                operated.discard(key).await?,
                O::DISCARDED,
                AuditAction::Discard,
            ),
        };
        if !changed {
            return Ok(StatusCode::NOT_FOUND);
        }
        let entry = AuditEntry::now(who.name(), action, O::target(key), 1);
        operated.audit(entry).await;
        Ok(status)
    }
}

/// `POST` of `change` on the job at the route's path.
fn change<O: Operated>(change: Change) -> MethodRouter<O> {
    post(
        move |_: SameSite, who: Operator, State(operated): State<O>, Path(key): Path<O::Key>| async move {
            change.apply(&operated, &key, &who).await
        },
    )
}

#[derive(Deserialize)]
struct Age {
    older_than_secs: Option<u64>,
}

/// `POST /purge`: the age from the query, else from a JSON body.
async fn purge<O: Operated>(
    _: SameSite,
    who: Operator,
    State(operated): State<O>,
    Query(query): Query<Age>,
    body: Bytes,
) -> Result<Response, Unavailable> {
    let from_body = || {
        serde_json::from_slice::<Age>(&body)
            .ok()
            .and_then(|age| age.older_than_secs)
    };
    let Some(secs) = query.older_than_secs.or_else(from_body) else {
        let message = "name the age: ?older_than_secs=N or {\"older_than_secs\": N}";
        return Ok((StatusCode::BAD_REQUEST, message).into_response());
    };
    let purged = operated.purge(Duration::from_secs(secs)).await?;
    let target = format!("finished more than {secs} s ago");
    let entry = AuditEntry::now(who.name(), AuditAction::Purge, target, purged);
    operated.audit(entry).await;
    Ok(Json(serde_json::json!({ "purged": purged })).into_response())
}

/// A scope named in a pause's or a resume's JSON body.
#[derive(Deserialize)]
struct Scoped {
    scope: String,
}

async fn pauses<O: Operated>(State(operated): State<O>) -> Result<Json<Vec<Pause>>, Unavailable> {
    Ok(Json(operated.pauses().await?))
}

/// `POST /pauses`: paused by the request's operator, and audited when it was not paused.
async fn pause<O: Operated>(
    _: SameSite,
    who: Operator,
    State(operated): State<O>,
    Json(body): Json<Scoped>,
) -> Result<Response, Unavailable> {
    let scope = body.scope.trim();
    if let Err(error) = crate::pauses::check_scope(scope) {
        return Ok((StatusCode::BAD_REQUEST, error.to_string()).into_response());
    }
    if !operated.pause(scope, who.name()).await? {
        return Ok(StatusCode::OK.into_response());
    }
    let entry = AuditEntry::now(who.name(), AuditAction::Pause, scope, 1);
    operated.audit(entry).await;
    Ok(StatusCode::CREATED.into_response())
}

/// `POST /pauses/resume`, audited when it was paused.
async fn resume<O: Operated>(
    _: SameSite,
    who: Operator,
    State(operated): State<O>,
    Json(body): Json<Scoped>,
) -> Result<StatusCode, Unavailable> {
    let scope = body.scope.trim();
    if !operated.resume(scope).await? {
        return Ok(StatusCode::NOT_FOUND);
    }
    let entry = AuditEntry::now(who.name(), AuditAction::Resume, scope, 1);
    operated.audit(entry).await;
    Ok(StatusCode::OK)
}
