//! [`Backoff`]: when a failed job is attempted again.

use std::time::Duration;

/// Exponential backoff with jitter: the delay after attempt `n` is drawn uniformly from
/// `[d/2, d]`, where `d = min(max, base * 2^(n-1))`. The jitter spreads the retries of jobs
/// that failed together (a dependency's outage) instead of sending them back at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

impl Default for Backoff {
    /// One second, doubling up to one hour.
    fn default() -> Self {
        Self::exponential(Duration::from_secs(1), Duration::from_secs(3600))
    }
}

impl Backoff {
    /// Starts at `base` and doubles after each failure, capped at `max` (at least `base`).
    pub fn exponential(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
        }
    }

    /// The ceiling of the delay after failed attempt `attempt` (from 1), before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        self.base
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max)
    }

    /// The delay after failed attempt `attempt` (from 1), jitter included.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        let spread = u64::try_from((ceiling - half).as_micros()).unwrap_or(u64::MAX);
        half + Duration::from_micros(fastrand::u64(0..=spread))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
        let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));
        let ceilings: Vec<u128> = (1..=6).map(|n| backoff.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        for attempt in 1..=6 {
            let ceiling = backoff.ceiling(attempt);
            for _ in 0..200 {
                let delay = backoff.delay(attempt);
                assert!(
                    delay >= ceiling / 2 && delay <= ceiling,
                    "{attempt}: {delay:?}"
                );
            }
        }
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn the_jitter_varies() {
        let backoff = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(1));
        let delays: std::collections::HashSet<Duration> =
            (0..50).map(|_| backoff.delay(1)).collect();
        assert!(delays.len() > 1);
    }
}
