//! The inbox's metrics, recorded through the `metrics` crate facade when the `metrics` feature
//! is on; without it the recording functions are no-ops. Names, labels and units are listed in
//! [docs/observability.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/observability.md).

use crate::{Inbox, InboxDatabase};

/// Gauge: events in the inbox table by `state` (`pending`, `failed`), refreshed at each sweep.
pub const EVENTS: &str = "idempotency_inbox_events";
/// Counter: attempts that ended, by `provider` and `outcome` (`processed`, `retry`, `failed`,
/// `lease_lost`).
pub const ATTEMPTS_TOTAL: &str = "idempotency_inbox_attempts_total";
/// Histogram: how long attempts took, in seconds, from the claim to the recorded end, by
/// `provider` and `outcome` (as [`ATTEMPTS_TOTAL`]).
pub const ATTEMPT_DURATION_SECONDS: &str = "idempotency_inbox_attempt_duration_seconds";
/// Counter: deliveries acknowledged, by `provider` and `outcome` (`stored`, `duplicate`).
pub const ACKNOWLEDGED_TOTAL: &str = "idempotency_inbox_acknowledged_total";

/// Registers the description and unit of every inbox metric with the installed recorder
/// (Prometheus `# HELP` lines). Optional; a no-op without the `metrics` feature.
pub fn describe_metrics() {
    #[cfg(feature = "metrics")]
    {
        use ::metrics::{describe_counter, describe_gauge, Unit};
        describe_gauge!(
            EVENTS,
            Unit::Count,
            "Events in the inbox by state (pending, failed)."
        );
        describe_counter!(
            ATTEMPTS_TOTAL,
            Unit::Count,
            "Inbox attempts that ended, by provider and outcome."
        );
        ::metrics::describe_histogram!(
            ATTEMPT_DURATION_SECONDS,
            Unit::Seconds,
            "How long inbox attempts took, by provider and outcome."
        );
        describe_counter!(
            ACKNOWLEDGED_TOTAL,
            Unit::Count,
            "Deliveries the inbox acknowledged, by provider and outcome."
        );
    }
}

pub(crate) fn acknowledged(provider: &str, stored: bool) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        ACKNOWLEDGED_TOTAL,
        "provider" => provider.to_owned(),
        "outcome" => if stored { "stored" } else { "duplicate" },
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (provider, stored);
}

pub(crate) fn attempt(provider: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        ATTEMPTS_TOTAL,
        "provider" => provider.to_owned(),
        "outcome" => outcome,
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (provider, outcome);
}

pub(crate) fn attempt_duration(
    provider: &str,
    outcome: &'static str,
    elapsed: std::time::Duration,
) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(
        ATTEMPT_DURATION_SECONDS,
        "provider" => provider.to_owned(),
        "outcome" => outcome,
    )
    .record(elapsed.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (provider, outcome, elapsed);
}

/// Sets the state gauges from the table (one `GROUP BY` query per sweep).
pub(crate) async fn refresh<DB: InboxDatabase>(inbox: &Inbox<DB>) {
    #[cfg(feature = "metrics")]
    match inbox.counts().await {
        Ok(counts) => {
            ::metrics::gauge!(EVENTS, "state" => "pending").set(counts.pending as f64);
            ::metrics::gauge!(EVENTS, "state" => "failed").set(counts.failed as f64);
        }
        Err(error) => tracing::debug!(%error, "counting inbox events failed"),
    }
    #[cfg(not(feature = "metrics"))]
    let _ = inbox;
}
