//! [`settings_setters!`](crate::settings_setters): the setters of the engine's [`Settings`](crate::Settings)
//! on a half's builder.

/// Writes, inside an `impl` block of a builder that holds the engine's
/// [`Settings`](crate::Settings) in a field named `settings`, its setters `max_attempts`,
/// `backoff`, `lease`, `attempt_timeout`, `poll_every`, `concurrency` and `history`, each with the doc
/// comment written before its name (the half's words for its jobs) and the engine's bounds:
/// at least one attempt and at most `i32::MAX`, a lease of at least 3 ms (renewed every
/// third), an attempt timeout and a poll interval of at least 1 ms, a concurrency of at least 1.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_jobs::{Backoff, Settings};
///
/// /// A builder of a half of your own.
/// pub struct Builder {
///     settings: Settings,
/// }
///
/// impl Builder {
///     tower_idempotency_jobs::settings_setters! {
///         /// Attempts before a job is failed.
///         max_attempts;
///         /// When a failed attempt is retried.
///         backoff;
///         /// How long a claim lasts.
///         lease;
///         /// How long one attempt may run.
///         attempt_timeout;
///         /// How often an idle worker looks for due jobs.
///         poll_every;
///         /// Jobs run at once.
///         concurrency;
///         /// Attempts a job's history keeps after its first.
///         history;
///     }
/// }
///
/// let builder = Builder { settings: Settings::new(4) }.max_attempts(0).lease(Duration::ZERO);
/// assert_eq!(builder.settings.max_attempts, 1);
/// assert_eq!(builder.settings.lease, Duration::from_millis(3));
/// ```
#[macro_export]
macro_rules! settings_setters {
    (
        $(#[doc = $max_attempts:literal])* max_attempts;
        $(#[doc = $backoff:literal])* backoff;
        $(#[doc = $lease:literal])* lease;
        $(#[doc = $attempt_timeout:literal])* attempt_timeout;
        $(#[doc = $poll_every:literal])* poll_every;
        $(#[doc = $concurrency:literal])* concurrency;
        $(#[doc = $history:literal])* history;
    ) => {
        $(#[doc = $max_attempts])*
        pub fn max_attempts(mut self, n: u32) -> Self {
            self.settings.max_attempts = n.clamp(1, i32::MAX as u32);
            self
        }

        $(#[doc = $backoff])*
        pub fn backoff(mut self, backoff: $crate::Backoff) -> Self {
            self.settings.backoff = backoff;
            self
        }

        $(#[doc = $lease])*
        pub fn lease(mut self, lease: ::std::time::Duration) -> Self {
            self.settings.lease = lease.max(::std::time::Duration::from_millis(3));
            self
        }

        $(#[doc = $attempt_timeout])*
        pub fn attempt_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.settings.attempt_timeout = timeout.max(::std::time::Duration::from_millis(1));
            self
        }

        $(#[doc = $poll_every])*
        pub fn poll_every(mut self, every: ::std::time::Duration) -> Self {
            self.settings.poll_every = every.max(::std::time::Duration::from_millis(1));
            self
        }

        $(#[doc = $concurrency])*
        pub fn concurrency(mut self, n: usize) -> Self {
            self.settings.concurrency = n.max(1);
            self
        }

        $(#[doc = $history])*
        pub fn history(mut self, n: u32) -> Self {
            self.settings.history = n;
            self
        }
    };
}
