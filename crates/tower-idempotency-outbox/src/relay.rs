//! The relay: claims due messages under a lease, delivers them (HTTP, or your
//! [`Dispatcher`]), and records each outcome, fenced by the claim's token.

use std::{fmt, future::Future, panic::AssertUnwindSafe, sync::Arc, time::Duration};

use bytes::Bytes;
use futures_util::{future::join_all, FutureExt};
use tokio::{sync::watch, task::JoinHandle};
use tower_idempotency_core::IDEMPOTENCY_KEY;
use tower_idempotency_inbox::{bounded, Backoff};

use crate::{
    backend::{BoxFuture, ClaimedRow, OutboxDatabase},
    outbox::{duration_ms, now_ms},
    Outbox, OutboxError,
};

/// Attempts before a message is marked failed, unless configured otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// How long a claim lasts, unless configured otherwise: a relay that crashed mid-delivery
/// leaves its messages to the next relay after it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// How long one delivery may take before it counts as a failed attempt, unless configured
/// otherwise.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often an idle relay looks for due messages, unless configured otherwise.
pub const DEFAULT_POLL_EVERY: Duration = Duration::from_secs(1);
/// Messages one round claims and delivers at once, unless configured otherwise.
pub const DEFAULT_BATCH: usize = 16;

/// The most error text kept per message, in bytes (the inbox's bound for an event's error).
pub const MAX_ERROR_LEN: usize = tower_idempotency_inbox::MAX_ERROR_LEN;

/// A dispatched message ([`Message::dispatch`](crate::Message::dispatch)) as the relay hands it
/// to your [`Dispatcher`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Dispatch {
    /// The message's key: pass it on as the receiving system's idempotency or deduplication key
    /// (an SQS `MessageDeduplicationId`, a Kafka record key, an email API's idempotency key).
    pub key: String,
    /// The topic it was enqueued under.
    pub topic: String,
    /// Its headers, in the order they were added.
    pub headers: Vec<(String, String)>,
    /// Its payload.
    pub payload: Bytes,
    /// This attempt's number, from 1.
    pub attempt: u32,
}

/// Why a delivery failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// Worth another attempt after the backoff (an outage, a timeout, a `503`).
    #[error("{0}")]
    Retry(String),
    /// Not worth retrying (the receiver refused the message): the message is failed at once.
    #[error("{0}")]
    Permanent(String),
}

impl DispatchError {
    /// A failure worth another attempt, with `text` as the message's last error (name no secret).
    pub fn retry(text: impl Into<String>) -> Self {
        Self::Retry(text.into())
    }

    /// A failure not worth retrying, with `text` as the message's last error.
    pub fn permanent(text: impl Into<String>) -> Self {
        Self::Permanent(text.into())
    }
}

/// Delivers dispatched messages: your queue producer, mailer or SDK call. Return `Ok` once the
/// receiving system has accepted the message; the relay then marks it delivered. It may be
/// called more than once for one message (a crash between the acceptance and the record, a
/// lease lost to a slow call): pass [`Dispatch::key`] on to the receiver so it can drop the
/// repeats.
///
/// Implemented for every `Fn(Dispatch) -> impl Future<Output = Result<(), DispatchError>>`.
pub trait Dispatcher: Send + Sync + 'static {
    /// Delivers one message.
    fn dispatch(&self, message: Dispatch) -> BoxFuture<'static, Result<(), DispatchError>>;
}

impl<F, Fut> Dispatcher for F
where
    F: Fn(Dispatch) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), DispatchError>> + Send + 'static,
{
    fn dispatch(&self, message: Dispatch) -> BoxFuture<'static, Result<(), DispatchError>> {
        Box::pin(self(message))
    }
}

/// What one [`Relay::run_once`] round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Round {
    /// Messages claimed.
    pub claimed: usize,
    /// Delivered and recorded.
    pub delivered: usize,
    /// Failed attempts scheduled for a retry.
    pub retried: usize,
    /// Messages failed (their last attempt, or a permanent failure), spent ones included.
    pub failed: usize,
    /// Attempts whose outcome could not be recorded: the claim was lost to another relay, or
    /// the database failed until the claim's lease ended; the message is attempted again
    /// after its lease.
    pub unrecorded: usize,
}

/// Delivers an [`Outbox`]'s messages; from [`Outbox::relay`]. Configure it, then
/// [`spawn`](Self::spawn) it, or call [`run_once`](Self::run_once) from a scheduler of your own.
///
/// HTTP messages are sent with the relay's `reqwest` client (the default one speaks plain HTTP
/// only; give [`http_client`](Self::http_client) a client built with a TLS feature of `reqwest`
/// for `https` URLs), with the message's key as `Idempotency-Key`. A `2xx` answer delivers the
/// message; a `3xx` (the default client follows no redirect; see
/// [`follow_same_method_redirects`](Self::follow_same_method_redirects)), a `408`, `409` (a
/// duplicate still in flight at a receiver that dedupes), `425`, `429`, any `5xx`, a timeout or
/// a connection failure is retried after the backoff; any other answer fails the message at
/// once. Dispatched messages go to the [`Dispatcher`].
///
/// A delivery's outcome is written under the claim's fencing token. When that write fails
/// (SQLite's write lock held past the busy timeout, a lost connection), the relay retries it
/// with a backoff until the claim's lease ends; it never sends the message again because its
/// outcome could not be written. Only a write still failing when the lease ends leaves the
/// message to be delivered again after it.
///
/// On Postgres several relays (threads or instances) share one outbox: each round claims a
/// batch with `FOR UPDATE SKIP LOCKED`, so their batches are disjoint. On SQLite run one relay
/// per database.
pub struct Relay<DB: OutboxDatabase> {
    outbox: Outbox<DB>,
    http: reqwest::Client,
    dispatcher: Option<Arc<dyn Dispatcher>>,
    pub(crate) brokers: crate::broker::Brokers,
    max_attempts: u32,
    backoff: Backoff,
    lease: Duration,
    attempt_timeout: Duration,
    poll_every: Duration,
    batch: usize,
}

impl<DB: OutboxDatabase> Clone for Relay<DB> {
    fn clone(&self) -> Self {
        Self {
            outbox: self.outbox.clone(),
            http: self.http.clone(),
            dispatcher: self.dispatcher.clone(),
            brokers: self.brokers.clone(),
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            lease: self.lease,
            attempt_timeout: self.attempt_timeout,
            poll_every: self.poll_every,
            batch: self.batch,
        }
    }
}

impl<DB: OutboxDatabase> fmt::Debug for Relay<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("outbox", &self.outbox)
            .field("dispatcher", &self.dispatcher.is_some())
            .field("brokers", &self.brokers.names())
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("lease", &self.lease)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("poll_every", &self.poll_every)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl<DB: OutboxDatabase> Outbox<DB> {
    /// A relay for this outbox with the default settings.
    pub fn relay(&self) -> Relay<DB> {
        Relay {
            outbox: self.clone(),
            http: client(reqwest::redirect::Policy::none()),
            dispatcher: None,
            brokers: crate::broker::Brokers::default(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            lease: DEFAULT_LEASE,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            poll_every: DEFAULT_POLL_EVERY,
            batch: DEFAULT_BATCH,
        }
    }
}

impl<DB: OutboxDatabase> Relay<DB> {
    /// The client HTTP messages are sent with (default: reqwest's default client, except that
    /// it follows no redirect: [`reqwest::redirect::Policy::none`]).
    ///
    /// The client's redirect policy is yours. reqwest's default one follows up to 10 redirects
    /// and turns a `POST` answered `301`, `302` or `303` into a bodiless `GET` of the new
    /// location, whose `2xx` would mark the message delivered though the target never received
    /// it. Build the client with `.redirect(reqwest::redirect::Policy::none())` (every `3xx` is
    /// a failed attempt) or `.redirect(`[`same_method_redirects()`]`)`.
    pub fn http_client(mut self, client: reqwest::Client) -> Self {
        self.http = client;
        self
    }

    /// Follows same-method redirects: a `307` or `308` answer is followed (up to 10 in a
    /// row) with the same method, body and `Idempotency-Key`, and the answer at its end decides
    /// the attempt. A `301`, `302` or `303` (which a client follows as a bodiless `GET`) still
    /// stops there and is a failed attempt. Off by default: every `3xx` is a failed attempt.
    ///
    /// This replaces the relay's client with a default one using [`same_method_redirects`];
    /// for a client of your own ([`http_client`](Self::http_client)), build it with that
    /// policy instead of calling this.
    pub fn follow_same_method_redirects(mut self) -> Self {
        self.http = client(same_method_redirects());
        self
    }

    /// Delivers dispatched messages; without one, they fail at their first attempt.
    pub fn dispatcher(mut self, dispatcher: impl Dispatcher) -> Self {
        self.dispatcher = Some(Arc::new(dispatcher));
        self
    }

    /// Attempts before a message is failed (default [`DEFAULT_MAX_ATTEMPTS`], at least 1).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.clamp(1, i32::MAX as u32);
        self
    }

    /// When a failed attempt is retried (default: 1 s doubling up to 1 h, with jitter; the
    /// inbox's [`Backoff`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long a claim lasts (default [`DEFAULT_LEASE`]); keep it longer than the attempt
    /// timeout. A delivery's outcome whose write fails is retried until the lease ends, so a
    /// round may last up to the lease. A message whose claim ends before its delivery is
    /// recorded is delivered again by the next round, which the receiver's deduplication
    /// absorbs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// How long one delivery may take (default [`DEFAULT_ATTEMPT_TIMEOUT`]) before it counts as
    /// a failed attempt.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How often an idle spawned relay looks for due messages (default
    /// [`DEFAULT_POLL_EVERY`]); [`Outbox::wake`] starts a round at once.
    pub fn poll_every(mut self, every: Duration) -> Self {
        self.poll_every = every.max(Duration::from_millis(1));
        self
    }

    /// Messages one round claims and delivers concurrently (default [`DEFAULT_BATCH`], at
    /// least 1).
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How long after its first attempt a message may still be sent again: the backoff's
    /// ceilings between its attempts, each attempt's timeout, and one lease (a relay that
    /// crashed between a delivery and its record leaves the message to the next one after the
    /// lease). A broker's deduplication window (JetStream's duplicate window) must cover it.
    pub fn retry_horizon(&self) -> Duration {
        let pauses: Duration = (1..self.max_attempts)
            .map(|attempt| self.backoff.ceiling(attempt))
            .sum();
        pauses
            .saturating_add(self.attempt_timeout.saturating_mul(self.max_attempts))
            .saturating_add(self.lease)
    }

    fn max(&self) -> i32 {
        i32::try_from(self.max_attempts).unwrap_or(i32::MAX)
    }

    /// One round: fails the messages whose attempts are spent, claims up to a batch of due
    /// messages, delivers them concurrently and records each outcome.
    pub async fn run_once(&self) -> Result<Round, OutboxError> {
        let (pool, sql) = (&self.outbox.pool, &self.outbox.sql);
        let now = now_ms();
        let spent = DB::exhaust(pool, sql, now, self.max()).await?;
        if spent > 0 {
            tracing::warn!(spent, "outbox messages failed: their attempts were spent");
        }
        let token = fastrand::i64(0..i64::MAX);
        let lease_until = now.saturating_add(duration_ms(self.lease));
        let limit = i64::try_from(self.batch).unwrap_or(i64::MAX);
        let rows = DB::claim(pool, sql, now, token, lease_until, self.max(), limit).await?;
        let mut round = Round {
            claimed: rows.len(),
            failed: usize::try_from(spent).unwrap_or(usize::MAX),
            ..Round::default()
        };
        let outcomes = join_all(
            rows.into_iter()
                .map(|row| self.attempt(row, token, lease_until)),
        )
        .await;
        for outcome in outcomes {
            match outcome {
                Recorded::Delivered => round.delivered += 1,
                Recorded::Retry => round.retried += 1,
                Recorded::Failed => round.failed += 1,
                Recorded::Unrecorded => round.unrecorded += 1,
            }
        }
        Ok(round)
    }

    /// Runs rounds on the current Tokio runtime until the returned handle is drained or
    /// dropped: one after another while they find a full batch, else after
    /// [`poll_every`](Self::poll_every) or [`Outbox::wake`].
    pub fn spawn(self) -> RelayHandle {
        let (stop, stopped) = watch::channel(false);
        RelayHandle {
            stop,
            task: Some(tokio::spawn(self.run(stopped))),
        }
    }

    async fn run(self, mut stop: watch::Receiver<bool>) {
        let wake = self.outbox.wake.clone();
        loop {
            if *stop.borrow() {
                return;
            }
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let full = match self.run_once().await {
                Ok(round) => round.claimed >= self.batch,
                Err(error) => {
                    tracing::warn!(%error, "an outbox relay round failed; retrying at the next");
                    false
                }
            };
            if full {
                continue;
            }
            tokio::select! {
                _ = stop.changed() => return,
                () = &mut notified => {}
                () = tokio::time::sleep(self.poll_every) => {}
            }
        }
    }

    /// Delivers one claimed message and records the outcome, retrying the record until
    /// `lease_until`.
    async fn attempt(&self, row: ClaimedRow, token: i64, lease_until: i64) -> Recorded {
        let attempt = u32::try_from(row.attempts).unwrap_or(1);
        let key = row.key.clone();
        let delivery = AssertUnwindSafe(tokio::time::timeout(
            self.attempt_timeout,
            self.deliver(row, attempt),
        ))
        .catch_unwind()
        .await;
        let result = match delivery {
            Ok(Ok(result)) => result,
            Ok(Err(_elapsed)) => Err((
                None,
                DispatchError::retry(format!(
                    "the delivery timed out after {} ms",
                    self.attempt_timeout.as_millis()
                )),
            )),
            Err(_panic) => Err((None, DispatchError::retry("the dispatcher panicked"))),
        };
        let (pool, sql, now) = (&self.outbox.pool, &self.outbox.sql, now_ms());
        let recorded = match &result {
            Ok(status) => {
                let status = status.map(i32::from);
                until_written(lease_until, || {
                    DB::complete(pool, sql, &key, token, now, status)
                })
                .await
            }
            Err((status, error)) => {
                let permanent = matches!(error, DispatchError::Permanent(_));
                let retry_at = now.saturating_add(duration_ms(self.backoff.delay(attempt)));
                // A permanent failure is the last attempt: `attempts >= 0` holds for every row.
                let max = if permanent { 0 } else { self.max() };
                let text = bounded(error.to_string());
                let status = status.map(i32::from);
                until_written(lease_until, || {
                    DB::fail(pool, sql, &key, token, now, max, retry_at, status, &text)
                })
                .await
            }
        };
        match (recorded, result) {
            (Ok(true), Ok(_)) => Recorded::Delivered,
            (Ok(true), Err((_, error))) => {
                if matches!(error, DispatchError::Permanent(_)) || attempt >= self.max_attempts {
                    tracing::warn!(attempt, %error, "an outbox message failed its last attempt");
                    Recorded::Failed
                } else {
                    tracing::debug!(attempt, %error, "an outbox delivery failed; retrying");
                    Recorded::Retry
                }
            }
            (Ok(false), _) => {
                tracing::warn!("an outbox delivery ended after its claim was taken over");
                Recorded::Unrecorded
            }
            (Err(error), _) => {
                tracing::warn!(%error, "recording an outbox delivery failed until its lease ended; attempted again");
                Recorded::Unrecorded
            }
        }
    }

    /// One delivery: answers the HTTP status when there was one.
    async fn deliver(
        &self,
        row: ClaimedRow,
        attempt: u32,
    ) -> Result<Option<u16>, (Option<u16>, DispatchError)> {
        let headers: Vec<(String, String)> = serde_json::from_str(&row.headers).unwrap_or_default();
        match (row.method, row.url, row.topic) {
            (Some(method), Some(url), _) => {
                let method = http::Method::from_bytes(method.as_bytes()).map_err(|_| {
                    (
                        None,
                        DispatchError::permanent("the stored method is invalid"),
                    )
                })?;
                let mut request = self.http.request(method, url);
                for (name, value) in headers {
                    if !name.eq_ignore_ascii_case(IDEMPOTENCY_KEY.as_str()) {
                        request = request.header(name, value);
                    }
                }
                let sent = request
                    .header(&IDEMPOTENCY_KEY, &row.key)
                    .body(row.body)
                    .send()
                    .await;
                let response = sent.map_err(|error| (None, request_error(&error)))?;
                let status = response.status();
                let location = status
                    .is_redirection()
                    .then(|| location(response.url(), response.headers()));
                // Read the answer so the connection can be reused; its content is not kept.
                let _ = response.bytes().await;
                classify(status, location.as_deref())
            }
            (_, _, Some(topic)) => {
                let Some(dispatcher) = &self.dispatcher else {
                    return Err((
                        None,
                        DispatchError::permanent("the relay has no dispatcher for this message"),
                    ));
                };
                let message = Dispatch {
                    key: row.key,
                    topic,
                    headers,
                    payload: row.body.into(),
                    attempt,
                };
                dispatcher
                    .dispatch(message)
                    .await
                    .map(|()| None)
                    .map_err(|error| (None, error))
            }
            // A broker target: `url` without a method (the encoding: src/broker/mod.rs).
            (None, Some(target), None) => {
                let message = crate::broker::Outgoing {
                    key: row.key,
                    headers,
                    body: row.body.into(),
                };
                self.brokers
                    .publish(&target, message, self.retry_horizon())
                    .await
                    .map(|()| None)
                    .map_err(|error| (None, error))
            }
            _ => Err((
                None,
                DispatchError::permanent("the stored message has no target"),
            )),
        }
    }
}

/// A delivery's outcome as recorded.
enum Recorded {
    Delivered,
    Retry,
    Failed,
    Unrecorded,
}

/// Writes a delivery's outcome with `write`, retrying a failed write with a backoff (10 ms
/// doubling to 1 s) until `lease_until`: the claim's token fences the write, so a retry can only
/// land while no other relay holds the message. Answers the last try's result.
async fn until_written<'a>(
    lease_until: i64,
    mut write: impl FnMut() -> BoxFuture<'a, sqlx::Result<bool>>,
) -> sqlx::Result<bool> {
    let mut pause = Duration::from_millis(10);
    loop {
        let error = match write().await {
            Ok(written) => return Ok(written),
            Err(error) => error,
        };
        let left = lease_until.saturating_sub(now_ms());
        if left <= 0 {
            return Err(error);
        }
        tracing::debug!(%error, "recording an outbox delivery failed; retrying within its lease");
        let left = Duration::from_millis(u64::try_from(left).unwrap_or(u64::MAX));
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// A redirect policy for [`Relay::http_client`]'s client: follows `307` and `308` (the method,
/// body and headers are sent again, the `Idempotency-Key` with them), up to 10 in a row, and
/// stops at any other redirect (`301`, `302` and `303`, which a client would follow as a bodiless
/// `GET`), whose answer is then a failed attempt. [`Relay::follow_same_method_redirects`] uses
/// it.
///
/// ```
/// let client = reqwest::Client::builder()
///     .redirect(tower_idempotency_outbox::same_method_redirects())
///     .build()
///     .unwrap();
/// # let _ = client;
/// ```
pub fn same_method_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        // `previous` holds every URL requested so far: the message's own and each followed.
        let followed = attempt.previous().len().saturating_sub(1);
        let same_method = matches!(attempt.status().as_u16(), 307 | 308);
        if same_method && followed < 10 {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// A client with reqwest's defaults and `redirect`.
fn client(redirect: reqwest::redirect::Policy) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(redirect)
        .build()
        .expect("a client without TLS settings builds")
}

/// Where a redirect points, for the message's error: its `Location` resolved against the URL
/// requested, without user info, query or fragment (they may carry credentials), at most 200
/// bytes.
fn location(requested: &reqwest::Url, headers: &http::HeaderMap) -> String {
    let Some(value) = headers.get(http::header::LOCATION) else {
        return "no Location".to_owned();
    };
    let Ok(mut url) = value.to_str().map_err(drop).and_then(|text| {
        // Relative to the URL requested, as a client following it would resolve it.
        requested.join(text).map_err(drop)
    }) else {
        return "a Location that is not a URL".to_owned();
    };
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    let mut text = url.to_string();
    if text.len() > 200 {
        let mut end = 200;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    format!("Location {text}")
}

/// What an HTTP answer means for the message; `location` describes a redirect's target.
fn classify(
    status: http::StatusCode,
    location: Option<&str>,
) -> Result<Option<u16>, (Option<u16>, DispatchError)> {
    let code = status.as_u16();
    if status.is_success() {
        return Ok(Some(code));
    }
    if status.is_redirection() {
        let to = location.unwrap_or("no Location");
        let text = format!("the receiver answered {code} with {to}: a redirect is not a delivery");
        return Err((Some(code), DispatchError::retry(text)));
    }
    let retry = status.is_server_error() || matches!(code, 408 | 409 | 425 | 429);
    let error = if retry {
        DispatchError::retry(format!("the receiver answered {code}"))
    } else {
        DispatchError::permanent(format!("the receiver refused the message with {code}"))
    };
    Err((Some(code), error))
}

/// A failed request's error text, without its URL (which may carry credentials).
fn request_error(error: &reqwest::Error) -> DispatchError {
    let what = if error.is_timeout() {
        "the request timed out"
    } else if error.is_connect() {
        "the receiver could not be reached"
    } else if error.is_builder() {
        return DispatchError::permanent("the request could not be built");
    } else {
        "the request failed"
    };
    DispatchError::retry(what)
}

/// A spawned relay. [`drain`](Self::drain) it on shutdown; dropping it stops it at once (a
/// delivery cut short is attempted again after its lease).
#[derive(Debug)]
pub struct RelayHandle {
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl RelayHandle {
    /// Stops starting rounds and waits up to `deadline` for the running one. Answers whether it
    /// finished; one still running at the deadline is aborted (its messages are attempted again
    /// after their lease).
    pub async fn drain(mut self, deadline: Duration) -> bool {
        let _ = self.stop.send(true);
        let Some(mut task) = self.task.take() else {
            return true;
        };
        match tokio::time::timeout(deadline, &mut task).await {
            Ok(_) => true,
            Err(_) => {
                task.abort();
                false
            }
        }
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_that_are_retried_and_answers_that_fail() {
        let code = |n| http::StatusCode::from_u16(n).unwrap();
        assert_eq!(classify(code(201), None).unwrap(), Some(201));
        for retried in [301, 302, 307, 308, 408, 409, 425, 429, 500, 503] {
            let (status, error) = classify(code(retried), None).unwrap_err();
            assert_eq!(status, Some(retried));
            assert!(matches!(error, DispatchError::Retry(_)), "{retried}");
        }
        for refused in [400, 401, 404, 422] {
            let (_, error) = classify(code(refused), None).unwrap_err();
            assert!(matches!(error, DispatchError::Permanent(_)), "{refused}");
        }
    }

    #[test]
    fn a_redirect_location_loses_its_credentials() {
        let requested = reqwest::Url::parse("http://svc.internal/x?token=a").unwrap();
        let at = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::LOCATION, value.parse().unwrap());
            location(&requested, &headers)
        };
        assert_eq!(at("/y?sig=secret#f"), "Location http://svc.internal/y");
        assert_eq!(
            at("https://user:pw@other.example/z?k=v"),
            "Location https://other.example/z"
        );
        assert_eq!(location(&requested, &http::HeaderMap::new()), "no Location");
        assert!(at(&format!("/{}", "a".repeat(300))).len() < 220);
    }
}
