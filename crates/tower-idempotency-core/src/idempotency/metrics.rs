//! The layer's metrics, recorded through the `metrics` crate facade when the `metrics` feature
//! is on; without it every function here is a no-op the compiler removes. Names, labels and
//! units are listed in [docs/observability.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/observability.md) and described by [`describe_metrics`].

use std::future::Future;

use super::config::Config;
#[cfg(feature = "metrics")]
use crate::outcome::Outcome;

/// Counter: requests the layer answered, by `namespace` and `outcome`.
pub const REQUESTS_TOTAL: &str = "idempotency_requests_total";
/// Histogram, seconds: the duration of each store call that answered, by `operation` and `store`.
pub const STORE_CALL_DURATION_SECONDS: &str = "idempotency_store_call_duration_seconds";
/// Gauge: handlers running under a claimed key, by `namespace`.
pub const HANDLERS_IN_FLIGHT: &str = "idempotency_handlers_in_flight";
/// Counter: lease renewals the store answered as lost (another holder, or the key forgotten),
/// by `namespace`.
pub const LEASE_RENEWALS_LOST_TOTAL: &str = "idempotency_lease_renewals_lost_total";
/// Counter: handler results that could not be recorded (the key stays in flight until its lease
/// expires), by `namespace`.
pub const RESULTS_UNRECORDED_TOTAL: &str = "idempotency_results_unrecorded_total";

/// Registers the description and unit of every metric above with the installed recorder, so an
/// exporter can print them (Prometheus `# HELP` lines). Optional: the metrics are recorded
/// either way. Call it after installing the recorder.
///
/// ```
/// tower_idempotency_core::describe_metrics();
/// ```
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        REQUESTS_TOTAL,
        Unit::Count,
        "Requests answered by the idempotency layer, by namespace and outcome."
    );
    describe_histogram!(
        STORE_CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of the idempotency store calls that answered, by operation and store."
    );
    describe_gauge!(
        HANDLERS_IN_FLIGHT,
        Unit::Count,
        "Handlers running under a claimed idempotency key, by namespace."
    );
    describe_counter!(
        LEASE_RENEWALS_LOST_TOTAL,
        Unit::Count,
        "Lease renewals the store answered as lost, by namespace."
    );
    describe_counter!(
        RESULTS_UNRECORDED_TOTAL,
        Unit::Count,
        "Handler results that could not be recorded, by namespace."
    );
}

/// Counts a request the layer answered.
#[cfg(feature = "metrics")]
fn request(config: &Config, outcome: Outcome) {
    ::metrics::counter!(
        REQUESTS_TOTAL,
        "namespace" => config.scope.namespace().to_owned(),
        "outcome" => outcome.as_str(),
    )
    .increment(1);
}

/// Times `call`, a store call named `operation`; a call that never answers (dropped at the store
/// timeout) is not recorded.
#[cfg(feature = "metrics")]
pub(super) async fn timed<F: Future>(
    config: &Config,
    operation: &'static str,
    call: F,
) -> F::Output {
    let started = std::time::Instant::now();
    let output = call.await;
    ::metrics::histogram!(
        STORE_CALL_DURATION_SECONDS,
        "operation" => operation,
        "store" => config.store.name(),
    )
    .record(started.elapsed().as_secs_f64());
    output
}

/// Times `call`, a store call named `operation` (the `metrics` feature is off: nothing to do).
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(super) fn timed<F: Future>(_config: &Config, _operation: &'static str, call: F) -> F {
    call
}

/// Counts a handler in flight while it lives.
pub(super) struct HandlerInFlight {
    #[cfg(feature = "metrics")]
    gauge: ::metrics::Gauge,
}

impl HandlerInFlight {
    pub(super) fn start(config: &Config) -> Self {
        #[cfg(feature = "metrics")]
        {
            let gauge = ::metrics::gauge!(
                HANDLERS_IN_FLIGHT,
                "namespace" => config.scope.namespace().to_owned(),
            );
            gauge.increment(1.0);
            Self { gauge }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = config;
            Self {}
        }
    }
}

#[cfg(feature = "metrics")]
impl Drop for HandlerInFlight {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

/// Counts a renewal the store answered as lost.
pub(super) fn lease_renewal_lost(config: &Config) {
    count_in_namespace(LEASE_RENEWALS_LOST_TOTAL, config);
}

/// Counts a result that could not be recorded.
pub(super) fn result_unrecorded(config: &Config) {
    count_in_namespace(RESULTS_UNRECORDED_TOTAL, config);
}

/// Adds one to the counter `name` of the layer's namespace.
fn count_in_namespace(name: &'static str, config: &Config) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(name, "namespace" => config.scope.namespace().to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, config);
}

/// Counts the request `answer` answers, by the [`Outcome`] in its extensions (an error from the
/// inner service counts as [`Outcome::HandlerFailed`]). A request whose caller went away before
/// the answer is not counted.
#[cfg(feature = "metrics")]
pub(super) async fn counted<F, B, E>(
    config: std::sync::Arc<Config>,
    answer: F,
) -> Result<http::Response<B>, E>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    let answer = answer.await;
    let outcome = match &answer {
        Ok(response) => response.extensions().get::<Outcome>().copied(),
        Err(_) => Some(Outcome::HandlerFailed),
    };
    if let Some(outcome) = outcome {
        request(&config, outcome);
    }
    answer
}

/// Counts the request `answer` answers (the `metrics` feature is off: nothing to do).
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(super) fn counted<F>(_config: std::sync::Arc<Config>, answer: F) -> F {
    answer
}
