//! The relay: claims due messages under a lease, delivers them (HTTP, or your
//! [`Dispatcher`]), and records each outcome, fenced by the claim's token.

use std::{fmt, future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use tower_idempotency_core::IDEMPOTENCY_KEY;
use tower_idempotency_jobs::{BoxFuture, Claimed, Job, Outcome, Settings, Worker, WorkerHandle};

use crate::{
    backend::{OutboxDatabase, Payload},
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
pub const DEFAULT_CONCURRENCY: usize = 16;

/// The former name of [`DEFAULT_CONCURRENCY`].
#[deprecated(note = "renamed DEFAULT_CONCURRENCY, the inbox worker's name for the setting")]
pub const DEFAULT_BATCH: usize = DEFAULT_CONCURRENCY;

/// The most error text kept per message, in bytes (the job engine's bound, the inbox's too).
pub const MAX_ERROR_LEN: usize = tower_idempotency_jobs::MAX_ERROR_LEN;

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
    pub(crate) deliver: Deliver,
    settings: Settings,
}

impl<DB: OutboxDatabase> Clone for Relay<DB> {
    fn clone(&self) -> Self {
        Self {
            outbox: self.outbox.clone(),
            deliver: self.deliver.clone(),
            settings: self.settings,
        }
    }
}

impl<DB: OutboxDatabase> fmt::Debug for Relay<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("outbox", &self.outbox)
            .field("dispatcher", &self.deliver.dispatcher.is_some())
            .field("brokers", &self.deliver.brokers.names())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<DB: OutboxDatabase> Outbox<DB> {
    /// A relay for this outbox with the default settings.
    pub fn relay(&self) -> Relay<DB> {
        let mut settings = Settings::new(DEFAULT_CONCURRENCY);
        settings.max_attempts = DEFAULT_MAX_ATTEMPTS;
        settings.lease = DEFAULT_LEASE;
        settings.attempt_timeout = DEFAULT_ATTEMPT_TIMEOUT;
        settings.poll_every = DEFAULT_POLL_EVERY;
        settings.keep_leases = false;
        Relay {
            outbox: self.clone(),
            deliver: Deliver {
                http: client(reqwest::redirect::Policy::none()),
                dispatcher: None,
                brokers: crate::broker::Brokers::default(),
                retry_horizon: Duration::ZERO,
            },
            settings,
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
        self.deliver.http = client;
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
        self.deliver.http = client(same_method_redirects());
        self
    }

    /// Delivers dispatched messages; without one, they fail at their first attempt.
    pub fn dispatcher(mut self, dispatcher: impl Dispatcher) -> Self {
        self.deliver.dispatcher = Some(Arc::new(dispatcher));
        self
    }

    tower_idempotency_jobs::settings_setters! {
        /// Attempts before a message is failed (default [`DEFAULT_MAX_ATTEMPTS`], at least 1).
        max_attempts;
        /// When a failed attempt is retried (default: 1 s doubling up to 1 h, with jitter; the
        /// job engine's [`Backoff`](tower_idempotency_jobs::Backoff), the inbox's too).
        backoff;
        /// How long a claim lasts (default [`DEFAULT_LEASE`]); keep it longer than the attempt
        /// timeout. A delivery's outcome whose write fails is retried until the lease ends, so a
        /// round may last up to the lease. A message whose claim ends before its delivery is
        /// recorded is delivered again by the next round, which the receiver's deduplication
        /// absorbs.
        lease;
        /// How long one delivery may take (default [`DEFAULT_ATTEMPT_TIMEOUT`]) before it counts as
        /// a failed attempt.
        attempt_timeout;
        /// How often an idle spawned relay looks for due messages (default
        /// [`DEFAULT_POLL_EVERY`]); [`Outbox::wake`] starts a round at once.
        poll_every;
        /// Messages one round claims and delivers at once (default [`DEFAULT_CONCURRENCY`], at
        /// least 1): the inbox worker's name for the setting.
        concurrency;
        /// Attempts a message's history keeps after its first (default
        /// [`DEFAULT_HISTORY`](tower_idempotency_jobs::DEFAULT_HISTORY); 0: none is written):
        /// each attempt's start, duration, outcome, error, HTTP status and the first KiB of
        /// the answer ([`Outbox::attempts`]).
        history;
    }

    /// The former name of [`concurrency`](Self::concurrency).
    #[deprecated(note = "renamed concurrency, the inbox worker's name for the setting")]
    pub fn batch(self, n: usize) -> Self {
        self.concurrency(n)
    }

    /// How long after its first attempt a message may still be sent again: the backoff's
    /// ceilings between its attempts, each attempt's timeout, and one lease (a relay that
    /// crashed between a delivery and its record leaves the message to the next one after the
    /// lease). A broker's deduplication window (JetStream's duplicate window) must cover it.
    pub fn retry_horizon(&self) -> Duration {
        let settings = &self.settings;
        let pauses: Duration = (1..settings.max_attempts)
            .map(|attempt| settings.backoff.ceiling(attempt))
            .sum();
        pauses
            .saturating_add(
                settings
                    .attempt_timeout
                    .saturating_mul(settings.max_attempts),
            )
            .saturating_add(settings.lease)
    }

    /// Renews the lease of the messages a round is delivering every third of the lease, so
    /// that only a stopped or stalled relay loses one (default: off; the lease then bounds a
    /// delivery, and a delivery longer than it is made again by another relay).
    pub fn keep_leases(mut self, keep: bool) -> Self {
        self.settings.keep_leases = keep;
        self
    }

    /// The relay's settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn worker(&self) -> Worker<DB, Deliver> {
        let deliver = Deliver {
            retry_horizon: self.retry_horizon(),
            ..self.deliver.clone()
        };
        Worker::new(
            self.outbox.pool.clone(),
            self.outbox.jobs.clone(),
            deliver,
            self.settings,
            self.outbox.wake.clone(),
        )
    }

    /// One round: fails the messages whose attempts are spent, claims up to
    /// [`concurrency`](Self::concurrency) due messages, delivers them at once and records each
    /// outcome.
    pub async fn run_once(&self) -> Result<Round, OutboxError> {
        let round = self.worker().run_once().await?;
        Ok(Round {
            claimed: round.claimed,
            delivered: round.done,
            retried: round.retried,
            failed: round.failed,
            unrecorded: round.unrecorded,
        })
    }

    /// Runs rounds on the current Tokio runtime until the returned handle is drained or
    /// dropped: one after another while they find a full batch, else after
    /// [`poll_every`](Self::poll_every) or [`Outbox::wake`].
    pub fn spawn(self) -> RelayHandle {
        self.worker().spawn()
    }
}

/// How a delivery ended: its HTTP status when there was one, or the status and the error.
type Delivered = Result<Option<u16>, (Option<u16>, DispatchError)>;

/// Delivers one claimed message: the relay's job for the engine's [`Worker`].
#[derive(Clone)]
pub(crate) struct Deliver {
    http: reqwest::Client,
    dispatcher: Option<Arc<dyn Dispatcher>>,
    pub(crate) brokers: crate::broker::Brokers,
    /// The relay's [`Relay::retry_horizon`], which a broker's deduplication window must cover.
    retry_horizon: Duration,
}

impl<DB: OutboxDatabase> Job<DB> for Deliver {
    type Payload = DB::Payload;
    const NAME: &'static str = "delivery";

    async fn run(&self, job: Claimed<DB::Payload>) -> Outcome {
        let key = job.key.0.into_iter().next().unwrap_or_default();
        let (delivered, response) = self.deliver(key, job.payload.into(), job.attempt).await;
        match delivered {
            Ok(status) => Outcome::Done {
                status: status.map(i32::from),
                response,
            },
            Err((status, DispatchError::Retry(error))) => Outcome::Retry {
                status: status.map(i32::from),
                error,
                response,
            },
            Err((status, DispatchError::Permanent(error))) => Outcome::Permanent {
                status: status.map(i32::from),
                error,
                response,
            },
        }
    }

    /// The message's target: see [`Outbox::pause`](crate::Outbox::pause).
    fn scopes(&self, payload: &DB::Payload) -> Vec<String> {
        payload.as_ref().pause_scope().into_iter().collect()
    }
}

impl Deliver {
    /// One delivery: answers the HTTP status when there was one, and the start of the HTTP
    /// answer's body.
    async fn deliver(
        &self,
        key: String,
        row: Payload,
        attempt: u32,
    ) -> (Delivered, Option<String>) {
        let mut head = None;
        let delivered = self.send(key, row, attempt, &mut head).await;
        (delivered, head)
    }

    /// One delivery, keeping the start of an HTTP answer's body in `head`.
    async fn send(
        &self,
        key: String,
        row: Payload,
        attempt: u32,
        head: &mut Option<String>,
    ) -> Delivered {
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
                    .header(&IDEMPOTENCY_KEY, &key)
                    .body(row.body)
                    .send()
                    .await;
                let response = sent.map_err(|error| (None, request_error(&error)))?;
                let status = response.status();
                let location = status
                    .is_redirection()
                    .then(|| location(response.url(), response.headers()));
                // Read the answer so the connection can be reused; its start goes to the
                // attempt's history.
                if let Ok(body) = response.bytes().await {
                    let end = body
                        .len()
                        .min(tower_idempotency_jobs::history::MAX_RESPONSE_LEN);
                    *head = Some(String::from_utf8_lossy(&body[..end]).into_owned());
                }
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
                    key,
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
                    key,
                    headers,
                    body: row.body.into(),
                };
                self.brokers
                    .publish(&target, message, self.retry_horizon)
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

/// A spawned relay: the job engine's [`WorkerHandle`], the inbox worker's handle too.
/// [`drain`](WorkerHandle::drain) it on shutdown; dropping it stops it at once (a delivery cut
/// short is attempted again after its lease).
pub type RelayHandle = WorkerHandle;

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
