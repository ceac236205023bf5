//! Operating an outbox: list messages, retry a failed one, discard one, purge old delivered
//! ones; as [`Outbox`] methods and as an axum [`router`] to mount behind your own auth.

use std::time::Duration;

use axum::{
    extract::{Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post, MethodRouter},
    Json, Router,
};
use serde::Deserialize;

use tower_idempotency_jobs::{
    admin::{Change, Operated},
    chart::Activity,
    cursor,
    pauses::{check_scope, Pause},
    redact,
    time::{duration_ms, now_ms},
    Attempt, JobKey, JobSummary, PageFilter,
};

use crate::{
    backend::{Listed, Payload},
    http::{state_filter, KeyQuery, Listing, Unavailable},
    MessageDetail, MessagePage, MessageState, MessageSummary, Outbox, OutboxDatabase, OutboxError,
    StateCounts,
};

pub use crate::page::ADMIN_HEADER;
pub use tower_idempotency_jobs::{
    admin::{operator, Operator},
    audit::{AuditAction, AuditEntry},
};

/// The most messages one listing returns.
pub const MAX_LIST: u32 = 1000;

/// The most messages one page of [`Outbox::messages`] holds.
pub const MAX_PAGE: u32 = 500;

/// Rows one purge statement deletes.
const PURGE_BATCH: i64 = 1000;

impl<DB: OutboxDatabase> Outbox<DB> {
    /// Up to `limit` (at most [`MAX_LIST`]) messages in `state`, oldest first.
    pub async fn list(
        &self,
        state: MessageState,
        limit: u32,
    ) -> Result<Vec<MessageSummary>, OutboxError> {
        let limit = i64::from(limit.min(MAX_LIST));
        let jobs = DB::list::<DB::Listed>(&self.pool, &self.jobs, state.job(), limit).await?;
        Ok(jobs.into_iter().map(summary).collect())
    }

    /// Up to `limit` (at most [`MAX_PAGE`]) messages in `state` (any when `None`), newest
    /// enqueued first, after `cursor` (a previous page's
    /// [`next_cursor`](MessagePage::next_cursor); `None` for the first page). Ordered by
    /// enqueue time and key, so a page never repeats or skips a message however the states
    /// change between pages.
    pub async fn messages(
        &self,
        state: Option<MessageState>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<MessagePage, OutboxError> {
        let after = match cursor {
            Some(cursor) => Some(cursor::decode(cursor, 1).ok_or(OutboxError::InvalidCursor)?),
            None => None,
        };
        let limit = limit.clamp(1, MAX_PAGE);
        let filter = PageFilter {
            state: state.map(MessageState::job),
            after,
            ..PageFilter::default()
        };
        let jobs =
            DB::page::<DB::Listed>(&self.pool, &self.jobs, &filter, i64::from(limit)).await?;
        let next_cursor = (jobs.len() == limit as usize)
            .then(|| {
                jobs.last()
                    .map(|job| cursor::encode(job.created_at_ms, &job.key))
            })
            .flatten();
        Ok(MessagePage {
            messages: jobs.into_iter().map(summary).collect(),
            next_cursor,
        })
    }

    /// One message in full, as an operator is shown it: its fields (the URL without
    /// user-info and with its query values masked), headers (a value whose name looks like a
    /// credential's reads `[redacted]`) and body (a JSON body's credential fields masked, as
    /// the inbox's event detail shows them).
    pub async fn message(&self, key: &str) -> Result<Option<MessageDetail>, OutboxError> {
        let key = JobKey::one(key);
        let Some((listed, payload)) =
            DB::detail::<DB::Listed, DB::Payload>(&self.pool, &self.jobs, &key).await?
        else {
            return Ok(None);
        };
        let payload: Payload = payload.into();
        let summary = shown(summary(listed));
        let headers: Vec<(String, String)> =
            serde_json::from_str(&payload.headers).unwrap_or_default();
        let headers = headers
            .into_iter()
            .map(|(name, value)| {
                let value = redact::redact(&name, value);
                (name, value)
            })
            .collect();
        let (body, body_pretty) = redact::shown_body(&payload.body);
        let history = DB::attempts(&self.pool, &self.jobs, &key)
            .await?
            .into_iter()
            .map(redact::shown_attempt)
            .collect();
        Ok(Some(MessageDetail {
            summary,
            headers,
            body,
            body_pretty,
            history,
        }))
    }

    /// One message, when the outbox holds it.
    pub async fn get(&self, key: &str) -> Result<Option<MessageSummary>, OutboxError> {
        let key = JobKey::one(key);
        let job = DB::get::<DB::Listed>(&self.pool, &self.jobs, &key).await?;
        Ok(job.map(summary))
    }

    /// Puts a failed message back to pending with a fresh count of attempts, due now, and
    /// wakes the relays. Answers `false` when the message is not failed.
    pub async fn retry(&self, key: &str) -> Result<bool, OutboxError> {
        let key = JobKey::one(key);
        let retried = DB::retry(&self.pool, &self.jobs, &key, now_ms()).await?;
        if retried {
            self.wake();
        }
        Ok(retried)
    }

    /// Gives up a failed message, or a pending one no relay is delivering: it is marked
    /// discarded and never attempted again (its key stays taken until it is purged). Answers
    /// `false` when there is no such message.
    pub async fn discard(&self, key: &str) -> Result<bool, OutboxError> {
        let key = JobKey::one(key);
        Ok(DB::discard(&self.pool, &self.jobs, &key, now_ms()).await?)
    }

    /// Deletes the messages delivered or discarded more than `older_than` ago, a batch per
    /// statement, and then their attempt history; answers how many messages. A purged
    /// message's key can be enqueued again.
    pub async fn purge_finished(&self, older_than: Duration) -> Result<u64, OutboxError> {
        let before = now_ms().saturating_sub(duration_ms(older_than));
        let mut purged = 0;
        loop {
            let batch = DB::purge(&self.pool, &self.jobs, before, PURGE_BATCH).await?;
            purged += batch;
            if batch < PURGE_BATCH as u64 {
                break;
            }
        }
        while DB::purge_attempts(&self.pool, &self.jobs, PURGE_BATCH).await? == PURGE_BATCH as u64 {
        }
        Ok(purged)
    }

    /// The recorded attempts of the message `key`, oldest first: its first and its newest
    /// ([`Relay::history`](crate::Relay::history)), each with its start, duration, outcome,
    /// error, HTTP status and the first KiB of the answer (as stored: show it through
    /// [`Outbox::message`], which masks credentials).
    pub async fn attempts(&self, key: &str) -> Result<Vec<Attempt>, OutboxError> {
        Ok(DB::attempts(&self.pool, &self.jobs, &JobKey::one(key)).await?)
    }

    /// How many messages are in each state.
    pub async fn counts(&self) -> Result<StateCounts, OutboxError> {
        Ok(DB::counts(&self.pool, &self.jobs).await?.into())
    }

    /// The outbox's activity per minute over the last hour: the messages enqueued (`received`),
    /// delivered (done) and failed, and the oldest pending message's age at each minute's end
    /// (the page's charts; [`tower_idempotency_jobs::chart`]). Three bounded statements.
    pub async fn activity(&self) -> Result<Activity, OutboxError> {
        Ok(DB::activity(&self.pool, &self.jobs, now_ms()).await?)
    }

    /// Logs and stores an operator's change in the outbox's audit table
    /// ([`audit`](tower_idempotency_jobs::audit)).
    pub async fn audit(&self, entry: &AuditEntry) -> Result<(), OutboxError> {
        Ok(tower_idempotency_jobs::audit::record(&self.pool, &self.jobs, entry).await?)
    }

    /// The newest `limit` entries of the outbox's audit, newest first.
    pub async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, OutboxError> {
        Ok(DB::audit_log(&self.pool, &self.jobs, i64::from(limit)).await?)
    }
}

/// A listed job as a message summary.
fn summary<L: Into<Listed>>(job: JobSummary<L>) -> MessageSummary {
    MessageSummary::from(job.map(Into::into))
}

/// `message` as an operator is shown it: its URL without user-info and with its query values
/// masked (a broker target, `nats:<subject>` or `amqp:<exchange>/<routing key>`, carries no
/// credential and is shown as it is). [`Outbox::list`] and [`Outbox::messages`] answer the
/// stored URL; pass their summaries through this before showing them to anyone.
pub fn shown(mut message: MessageSummary) -> MessageSummary {
    message.url = message.url.as_deref().map(|url| {
        if message.method.is_none() && crate::broker::parse(url).is_some() {
            url.to_owned()
        } else {
            redact::redact_url(url)
        }
    });
    message
}

impl<DB: OutboxDatabase> Outbox<DB> {
    /// Pauses the delivery of the messages of `scope`, recording `by` as who paused it:
    /// an HTTP target's host (`api.example.com`; an IP address as the URL writes it,
    /// `127.0.0.1`, `[::1]`), `broker:nats` or `broker:rabbitmq` (every message to that
    /// broker), or `topic:{topic}` (a dispatched topic). A host is compared in lowercase.
    /// Answers whether it was not paused already.
    ///
    /// Paused messages stay pending and spend no attempt; the pause is stored in the
    /// `{table}_pauses` table, so it holds for every relay on the table and across restarts.
    /// A relay sees it within [`REFRESH`](tower_idempotency_jobs::pauses::REFRESH) (at once
    /// through this handle's clones); a delivery already running finishes.
    pub async fn pause(&self, scope: &str, by: &str) -> Result<bool, OutboxError> {
        let scope = pause_scope(scope);
        check_scope(&scope)?;
        Ok(DB::pause(&self.pool, &self.jobs, &scope, now_ms(), by).await?)
    }

    /// Resumes `scope`: its parked messages are due at once. Answers whether it was paused.
    pub async fn resume(&self, scope: &str) -> Result<bool, OutboxError> {
        let resumed = DB::resume(&self.pool, &self.jobs, &pause_scope(scope), now_ms()).await?;
        if resumed {
            self.wake();
        }
        Ok(resumed)
    }

    /// The paused scopes, by scope.
    pub async fn pauses(&self) -> Result<Vec<Pause>, OutboxError> {
        Ok(DB::pauses(&self.pool, &self.jobs).await?)
    }
}

/// A scope as the outbox stores it ([`Outbox::pause`]): trimmed, a host in lowercase.
pub fn pause_scope(scope: &str) -> String {
    let scope = scope.trim();
    if scope.starts_with("broker:") || scope.starts_with("topic:") {
        scope.to_owned()
    } else {
        scope.to_ascii_lowercase()
    }
}

/// The outbox's operations over HTTP, JSON in and out. Mount it behind your own authentication
/// (`Router::nest("/admin/outbox", admin::router(outbox).layer(auth))`): it lists messages and
/// changes their state.
///
/// | route | answer |
/// |---|---|
/// | `GET /page?state=&cursor=` | the operator's page: counts, messages newest first (state `failed` unless another is chosen), retry and discard buttons (`GET /` redirects to it; docs/outbox.md) |
/// | `GET /detail?key=..` | one message's page |
/// | `GET /messages?state=&cursor=&limit=` | `200` [`MessagePage`], newest first (any state when `state` is absent; URLs without user-info, query values masked); `400` a bad state or cursor |
/// | `GET /message?key=..` | `200` [`MessageDetail`] (credentials masked: [`Outbox::message`]), `404` |
/// | `GET /{state}?limit=N` | `200`, an array of [`MessageSummary`] in that state (`pending`, `delivered`, `failed`, `discarded`; default limit 100) |
/// | `GET /counts` | `200` [`StateCounts`] |
/// | `GET /activity` | `200` [`Activity`]: per minute over the last hour, messages enqueued (`received`), delivered (`done`) and failed, and the oldest pending message's age at each minute's end ([`Outbox::activity`]) |
/// | `GET /messages/{key}` | `200` [`MessageDetail`], `404`: the inbox router's `GET /events/{provider}/{event_id}` shape (the key percent-encoded as one segment, `/` as `%2F`) |
/// | `POST /retry` `{"key": ".."}` | `202` re-queued, `404` no such failed message |
/// | `POST /messages/{key}/retry` | the same, in the inbox router's shape |
/// | `POST /discard` `{"key": ".."}` | `200` discarded, `404` no such failed or idle pending message |
/// | `POST /messages/{key}/discard` | the same, in the inbox router's shape |
/// | `POST /purge` `{"older_than_secs": N}` (or `?older_than_secs=N`) | `200 {"purged": n}` |
/// | `GET /pauses` | `200`, an array of [`Pause`] |
/// | `POST /pauses` `{"scope": "api.example.com"}` | `201` paused ([`Outbox::pause`]), `200` paused already, `400` an empty scope |
/// | `POST /pauses/resume` `{"scope": ".."}` | `200` resumed, `404` not paused |
/// | `GET /audit?limit=N` | `200`, the newest [`AuditEntry`]s, newest first (default 20) |
///
/// Every change that took effect is audited as made by the request's [`Operator`], named from
/// your own authentication with `axum::middleware::from_fn(admin::operator::<YourUser>)`
/// around this router ([`tower_idempotency_jobs::admin::operator`]).
///
/// `POST /retry` and `POST /discard` take JSON and answer `415` without `Content-Type:
/// application/json`, which a page on another site cannot send through an operator's browser
/// without a CORS preflight (the router answers none); the other `POST`s need the
/// [`ADMIN_HEADER`] or that content type, and are refused `403` without (the inbox router's
/// rule): a cross-site form cannot retry, discard or purge. The page's own script sends JSON
/// and the [`ADMIN_HEADER`]. A database failure is a `503` problem. The routes shared with the
/// inbox's router (listing by state, counts, activity, one message, retry, discard, purge) are
/// the job engine's [`tower_idempotency_jobs::admin::routes`].
///
/// Behind your authentication, as the inbox's router (`tower_idempotency_inbox::admin::router`
/// shows the layer):
///
/// ```no_run
/// use axum::Router;
/// use tower_idempotency_outbox::{admin, Outbox};
/// use tower_idempotency_sqlx::sqlx::Postgres;
///
/// fn app(outbox: Outbox<Postgres>, auth: impl Fn(Router) -> Router) -> Router {
///     // The operator's page is then at /admin/outbox/page.
///     Router::new().nest("/admin/outbox", auth(admin::router(outbox)))
/// }
/// ```
pub fn router<DB: OutboxDatabase>(outbox: Outbox<DB>) -> Router {
    crate::page::routes::<DB>()
        .merge(tower_idempotency_jobs::admin::routes::<Outbox<DB>>(
            "/messages/{key}",
        ))
        .route("/messages", get(messages::<DB>))
        .route("/message", get(message::<DB>))
        .route("/retry", change(Change::Retry))
        .route("/discard", change(Change::Discard))
        .with_state(outbox)
}

/// The outbox as the job engine's operator routes drive it; a key is the path's `{key}`.
impl<DB: OutboxDatabase> Operated for Outbox<DB> {
    type Key = String;
    type State = MessageState;
    type Summary = MessageSummary;
    type Detail = MessageDetail;
    type Counts = StateCounts;

    const ADMIN_HEADER: &'static str = ADMIN_HEADER;
    const DISCARDED: StatusCode = StatusCode::OK;

    fn state(name: &str) -> Option<MessageState> {
        MessageState::named(name)
    }

    async fn list(
        &self,
        state: MessageState,
        limit: u32,
    ) -> Result<Vec<MessageSummary>, Unavailable> {
        let messages = Outbox::list(self, state, limit).await?;
        Ok(messages.into_iter().map(shown).collect())
    }

    async fn detail(&self, key: &String) -> Result<Option<MessageDetail>, Unavailable> {
        Ok(self.message(key).await?)
    }

    async fn retry(&self, key: &String) -> Result<bool, Unavailable> {
        Ok(Outbox::retry(self, key).await?)
    }

    async fn discard(&self, key: &String) -> Result<bool, Unavailable> {
        Ok(Outbox::discard(self, key).await?)
    }

    async fn counts(&self) -> Result<StateCounts, Unavailable> {
        Ok(Outbox::counts(self).await?)
    }

    async fn purge(&self, older_than: Duration) -> Result<u64, Unavailable> {
        Ok(self.purge_finished(older_than).await?)
    }

    async fn activity(&self) -> Result<Activity, Unavailable> {
        Ok(Outbox::activity(self).await?)
    }

    fn target(key: &String) -> String {
        key.clone()
    }

    async fn audit(&self, entry: AuditEntry) {
        // A failure is logged by the record; the change it records stands.
        let _ = Outbox::audit(self, &entry).await;
    }

    async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, Unavailable> {
        Ok(Outbox::audit_log(self, limit).await?)
    }

    async fn pauses(&self) -> Result<Vec<Pause>, Unavailable> {
        Ok(Outbox::pauses(self).await?)
    }

    async fn pause(&self, scope: &str, by: &str) -> Result<bool, Unavailable> {
        Ok(Outbox::pause(self, scope, by).await?)
    }

    async fn resume(&self, scope: &str) -> Result<bool, Unavailable> {
        Ok(Outbox::resume(self, scope).await?)
    }
}

async fn messages<DB: OutboxDatabase>(
    State(outbox): State<Outbox<DB>>,
    Query(listing): Query<Listing>,
) -> Result<Response, Unavailable> {
    let Ok(state) = state_filter(listing.state.as_deref().unwrap_or("")) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let cursor = listing
        .cursor
        .as_deref()
        .filter(|cursor| !cursor.is_empty());
    match outbox
        .messages(state, cursor, listing.limit.unwrap_or(100))
        .await
    {
        Ok(page) => Ok(Json(MessagePage {
            messages: page.messages.into_iter().map(shown).collect(),
            ..page
        })
        .into_response()),
        Err(OutboxError::InvalidCursor) => Ok(StatusCode::BAD_REQUEST.into_response()),
        Err(error) => Err(error.into()),
    }
}

async fn message<DB: OutboxDatabase>(
    State(outbox): State<Outbox<DB>>,
    Query(query): Query<KeyQuery>,
) -> Result<Response, Unavailable> {
    Ok(match outbox.message(&query.key).await? {
        Some(detail) => Json(detail).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    })
}

#[derive(Deserialize)]
struct Key {
    key: String,
}

/// `POST` of `change` on the message of the JSON body's key `{"key": ..}`.
fn change<DB: OutboxDatabase>(change: Change) -> MethodRouter<Outbox<DB>> {
    post(
        move |who: Operator, State(outbox): State<Outbox<DB>>, Json(body): Json<Key>| async move {
            change.apply(&outbox, &body.key, &who).await
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    /// The router's message paths, in the inbox router's shape: a key with `/` percent-encoded
    /// as one segment is shown, retried and discarded; a `POST` without the admin header or a
    /// JSON content type is refused `403` and changes nothing; `GET /discarded` lists; the purge
    /// takes its age as a query or a JSON body.
    #[tokio::test]
    async fn message_paths_take_the_inbox_routers_shape() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let outbox = Outbox::new(pool.clone(), "paths").unwrap();
        outbox.migrate().await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        for key in ["stripe/evt_1/0", "stripe/evt_2/0"] {
            let message =
                Message::post_json("http://svc.internal/x", &serde_json::json!(1)).key(key);
            outbox.enqueue(&mut conn, message).await.unwrap();
        }
        drop(conn);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router(outbox)).await.unwrap() });
        let client = reqwest::Client::new();
        let at = |key: &str, action: &str| {
            let key = tower_idempotency_jobs::page::encode(key);
            format!("{base}/messages/{key}{action}")
        };
        let shown = client.get(at("stripe/evt_1/0", "")).send().await.unwrap();
        assert_eq!(shown.status(), 200);
        let detail: serde_json::Value = serde_json::from_str(&shown.text().await.unwrap()).unwrap();
        assert_eq!(detail["key"], "stripe/evt_1/0");
        let missing = client.get(at("stripe/none", "")).send().await.unwrap();
        assert_eq!(missing.status(), 404);

        let forged = client
            .post(at("stripe/evt_1/0", "/discard"))
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), 403);
        let discard = |key: &'static str| {
            client
                .post(at(key, "/discard"))
                .header(ADMIN_HEADER, "1")
                .send()
        };
        assert_eq!(discard("stripe/evt_1/0").await.unwrap().status(), 200);
        assert_eq!(discard("stripe/evt_1/0").await.unwrap().status(), 404);
        let retry = client
            .post(at("stripe/evt_2/0", "/retry"))
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(retry.status(), 404, "a pending message is not failed");
        let counts = client.get(format!("{base}/counts")).send().await.unwrap();
        let counts: serde_json::Value =
            serde_json::from_str(&counts.text().await.unwrap()).unwrap();
        assert_eq!(
            (counts["discarded"].as_u64(), counts["pending"].as_u64()),
            (Some(1), Some(1))
        );
        let discarded = client
            .get(format!("{base}/discarded"))
            .send()
            .await
            .unwrap();
        let discarded: serde_json::Value =
            serde_json::from_str(&discarded.text().await.unwrap()).unwrap();
        assert_eq!(discarded[0]["key"], "stripe/evt_1/0", "{discarded}");

        // The purge: `403` from a form (no header, no JSON), the age as a query or a body.
        let purge = format!("{base}/purge?older_than_secs=3600");
        let forged = client.post(&purge).send().await.unwrap();
        assert_eq!(forged.status(), 403);
        let kept = client
            .post(&purge)
            .header(ADMIN_HEADER, "1")
            .send()
            .await
            .unwrap();
        let kept: serde_json::Value = serde_json::from_str(&kept.text().await.unwrap()).unwrap();
        assert_eq!(kept["purged"], 0);
        let purged = client
            .post(format!("{base}/purge"))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "older_than_secs": 0 }).to_string())
            .send()
            .await
            .unwrap();
        let purged: serde_json::Value =
            serde_json::from_str(&purged.text().await.unwrap()).unwrap();
        assert!(purged["purged"].as_u64().is_some(), "{purged}");
    }

    /// A message to a credentialed URL, with a credential in its JSON body, on a SQLite outbox:
    /// `show` (the method, `GET /message`) and the listings (`GET /messages`, `GET /pending`)
    /// show the URL without user-info and with query values masked, and the body field masked.
    #[tokio::test]
    async fn shown_messages_carry_no_credentials() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let outbox = Outbox::new(pool.clone(), "redacted").unwrap();
        outbox.migrate().await.unwrap();
        let url = "https://ops:hunter2@api.example.com/hook?token=tk_live_9&v=2";
        let body = serde_json::json!({"api_key": "sk_body_7", "n": 1});
        let mut conn = pool.acquire().await.unwrap();
        let message = Message::post_json(url, &body).key("m1");
        outbox.enqueue(&mut conn, message).await.unwrap();
        drop(conn);
        let shown_url = "https://api.example.com/hook?token=***&v=***";
        let assert_clean = |label: &str, text: &str| {
            for secret in ["hunter2", "tk_live_9", "sk_body_7"] {
                assert!(!text.contains(secret), "{label} shows {secret}: {text}");
            }
        };

        let detail = outbox.message("m1").await.unwrap().expect("m1");
        assert_eq!(detail.summary.url.as_deref(), Some(shown_url));
        assert_clean("show", &serde_json::to_string(&detail).unwrap());
        assert!(detail.body.contains("\"n\":1"), "{}", detail.body);

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = router(outbox.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let client = reqwest::Client::new();
        for path in [
            "/message?key=m1",
            "/messages",
            "/pending",
            "/page?state=",
            "/detail?key=m1",
        ] {
            let response = client.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            let text = response.text().await.unwrap();
            assert_clean(path, &text);
            assert!(
                text.contains(shown_url) || text.contains(&shown_url.replace('&', "&amp;")),
                "{path}: {text}"
            );
        }
    }
}
