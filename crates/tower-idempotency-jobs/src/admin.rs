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
//! | `GET {item}` | `200`, one job's detail; `404` |
//! | `POST {item}/retry` | `202` re-queued; `404` no such failed job |
//! | `POST {item}/discard` | [`Operated::DISCARDED`]; `404` no such job in a state a discard applies to |
//! | `POST /purge?older_than_secs=N`, or with a JSON body `{"older_than_secs": N}` | `200 {"purged": n}`; `400` without the age |
//! | `GET /pauses` | `200`, an array of [`Pause`] by scope ([`pauses`](crate::pauses)) |
//! | `POST /pauses` `{"scope": ".."}` | `201` paused, `200` paused already; `400` an empty scope or one past [`MAX_SCOPE_LEN`](crate::pauses::MAX_SCOPE_LEN) bytes |
//! | `POST /pauses/resume` `{"scope": ".."}` | `200` resumed (its parked jobs are due now); `404` not paused |
//!
//! `{item}` is the half's path of one job (`/events/{provider}/{event_id}`,
//! `/messages/{key}`). Every `POST` needs the half's [`Operated::ADMIN_HEADER`] or a
//! `Content-Type: application/json` body and is refused `403` without ([`SameSite`]). A
//! database failure is a `503` problem ([`Unavailable`]).

use std::{future::Future, time::Duration};

use axum::{
    body::Bytes,
    extract::{FromRequestParts, Path, Query, State},
    http::{request::Parts, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post, MethodRouter},
    Json, Router,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::{pauses::Pause, Unavailable};

/// Who the routes record as having paused a scope.
pub const PAUSED_BY_ROUTE: &str = "admin-api";

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

/// The operator's routes over `O`, one job at `item` (a path with the parameters
/// [`Operated::Key`] deserializes): see the [module](self) for the table.
pub fn routes<O: Operated>(item: &str) -> Router<O> {
    Router::new()
        .route("/{state}", get(list::<O>))
        .route("/counts", get(counts::<O>))
        .route(item, get(detail::<O>))
        .route(&format!("{item}/retry"), change::<O>(Change::Retry))
        .route(&format!("{item}/discard"), change::<O>(Change::Discard))
        .route("/purge", post(purge::<O>))
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

async fn counts<O: Operated>(State(operated): State<O>) -> Result<Json<O::Counts>, Unavailable> {
    Ok(Json(operated.counts().await?))
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
    /// Makes the change on the job at `key` and answers as the routes do: the change's status,
    /// or `404` when the job is not in a state the change applies to.
    pub async fn apply<O: Operated>(
        self,
        operated: &O,
        key: &O::Key,
    ) -> Result<StatusCode, Unavailable> {
        let (changed, status) = match self {
            Self::Retry => (operated.retry(key).await?, StatusCode::ACCEPTED),
            Self::Discard => (operated.discard(key).await?, O::DISCARDED),
        };
        Ok(if changed {
            status
        } else {
            StatusCode::NOT_FOUND
        })
    }
}

/// `POST` of `change` on the job at the route's path.
fn change<O: Operated>(change: Change) -> MethodRouter<O> {
    post(
        move |_: SameSite, State(operated): State<O>, Path(key): Path<O::Key>| async move {
            change.apply(&operated, &key).await
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

/// `POST /pauses`.
async fn pause<O: Operated>(
    _: SameSite,
    State(operated): State<O>,
    Json(body): Json<Scoped>,
) -> Result<Response, Unavailable> {
    let scope = body.scope.trim();
    if let Err(error) = crate::pauses::check_scope(scope) {
        return Ok((StatusCode::BAD_REQUEST, error.to_string()).into_response());
    }
    Ok(if operated.pause(scope, PAUSED_BY_ROUTE).await? {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
    .into_response())
}

/// `POST /pauses/resume`.
async fn resume<O: Operated>(
    _: SameSite,
    State(operated): State<O>,
    Json(body): Json<Scoped>,
) -> Result<StatusCode, Unavailable> {
    Ok(if operated.resume(body.scope.trim()).await? {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    })
}
