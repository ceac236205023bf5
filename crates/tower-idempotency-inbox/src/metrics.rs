//! The inbox's metrics, recorded through the `metrics` crate facade when the `metrics` feature
//! is on; without it the recording functions are no-ops. Names, labels and units are listed in
//! [docs/observability.md](https://github.com/tower-idempotency/tower-idempotency/blob/main/docs/observability.md).

use crate::{Inbox, InboxDatabase};

/// Gauge: events in the inbox table by `state` (`pending`, `failed`), refreshed at each sweep
/// from an index of the rows that are not processed.
pub const EVENTS: &str = "idempotency_inbox_events";
/// Gauge: the age in seconds of the oldest pending event (from its acknowledgement), by
/// `provider`, refreshed at each sweep; `0` once a provider has no pending event.
pub const LAG_SECONDS: &str = "idempotency_inbox_lag_seconds";
/// Counter: processed events deleted by a worker's retention.
pub const PURGED_TOTAL: &str = "idempotency_inbox_purged_total";
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
        describe_gauge!(
            LAG_SECONDS,
            Unit::Seconds,
            "Age of the oldest pending inbox event, by provider."
        );
        describe_counter!(
            PURGED_TOTAL,
            Unit::Count,
            "Processed inbox events deleted by the retention."
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

pub(crate) fn purged(events: u64) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(PURGED_TOTAL).increment(events);
    #[cfg(not(feature = "metrics"))]
    let _ = events;
}

/// Sets the state and lag gauges from the index of the rows that are not processed (one query
/// per sweep). `lagging` holds the providers whose lag gauge was last set above zero, so that
/// one without pending events any more is set back to zero.
pub(crate) async fn refresh<DB: InboxDatabase>(
    inbox: &Inbox<DB>,
    lagging: &mut std::collections::HashSet<String>,
) {
    #[cfg(feature = "metrics")]
    match DB::open_groups(&inbox.pool, &inbox.sql).await {
        Ok(groups) => {
            use crate::EventState;
            let now = crate::event::now_ms();
            let (mut pending, mut failed) = (0, 0);
            let mut lags = std::collections::HashMap::new();
            for group in groups {
                match group.state {
                    EventState::Failed => failed += group.count,
                    _ => {
                        pending += group.count;
                        let age = now.saturating_sub(group.oldest_received_at).max(0);
                        lags.insert(group.provider, age as f64 / 1000.0);
                    }
                }
            }
            ::metrics::gauge!(EVENTS, "state" => "pending").set(pending as f64);
            ::metrics::gauge!(EVENTS, "state" => "failed").set(failed as f64);
            for provider in lagging.drain() {
                if !lags.contains_key(&provider) {
                    ::metrics::gauge!(LAG_SECONDS, "provider" => provider).set(0.0);
                }
            }
            for (provider, lag) in lags {
                ::metrics::gauge!(LAG_SECONDS, "provider" => provider.clone()).set(lag);
                lagging.insert(provider);
            }
        }
        Err(error) => tracing::debug!(%error, "reading the inbox gauges failed"),
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (inbox, lagging);
}
