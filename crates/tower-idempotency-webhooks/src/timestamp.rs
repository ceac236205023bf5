//! Signed timestamps: strict unix seconds and the replay window around the clock.

use std::{
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::error::VerifyError;

/// The default replay window, in both directions.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Parses a unix timestamp in seconds: 1 to 19 ASCII digits, nothing else.
pub(crate) fn parse_unix(name: &'static str, text: &str) -> Result<u64, VerifyError> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::InvalidTimestamp { name });
    }
    text.parse()
        .map_err(|_| VerifyError::InvalidTimestamp { name })
}

/// Checks `signed` (unix seconds) against `now`; `tolerance` of `None` disables the check.
pub(crate) fn check_window(
    name: &'static str,
    signed: u64,
    now: SystemTime,
    tolerance: Option<Duration>,
) -> Result<(), VerifyError> {
    let signed_at = UNIX_EPOCH
        .checked_add(Duration::from_secs(signed))
        .ok_or(VerifyError::InvalidTimestamp { name })?;
    let Some(tolerance) = tolerance else {
        return Ok(());
    };
    let (skew, past) = match now.duration_since(signed_at) {
        Ok(age) => (age, true),
        Err(ahead) => (ahead.duration(), false),
    };
    if skew > tolerance {
        let secs = i64::try_from(skew.as_secs()).unwrap_or(i64::MAX);
        return Err(VerifyError::TimestampOutsideTolerance {
            skew_secs: if past { -secs } else { secs },
            tolerance_secs: tolerance.as_secs(),
        });
    }
    Ok(())
}

/// A verifier's replay window: [`DEFAULT_TOLERANCE`] until its `tolerance` sets another, none
/// once its `disable_replay_window` turns the check off.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplayWindow(Option<Duration>);

impl ReplayWindow {
    /// Checks timestamps within `tolerance` of the clock.
    ///
    /// # Panics
    /// On zero, which reads as "no tolerance" but would disable the check: the verifiers'
    /// `disable_replay_window` says that.
    pub(crate) fn set(&mut self, tolerance: Duration) {
        assert!(
            !tolerance.is_zero(),
            "a zero replay window would disable the timestamp check; call disable_replay_window() \
             to turn it off"
        );
        self.0 = Some(tolerance);
    }

    /// Checks no timestamp against the clock.
    pub(crate) fn disable(&mut self) {
        self.0 = None;
    }

    /// The window, `None` when the check is off.
    pub(crate) fn get(self) -> Option<Duration> {
        self.0
    }

    /// [`check_window`] against this window.
    pub(crate) fn check(
        self,
        name: &'static str,
        signed: u64,
        now: SystemTime,
    ) -> Result<(), VerifyError> {
        check_window(name, signed, now, self.0)
    }
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self(Some(DEFAULT_TOLERANCE))
    }
}

// A verifier's `Debug` shows the window as the `Option` it is: `Some(300s)` or `None`.
impl fmt::Debug for ReplayWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Writes a verifier's (or builder's) `tolerance` and `disable_replay_window` methods over its
/// [`ReplayWindow`] at `self.<field>`. The doc comments given document `tolerance`, which is
/// where a provider says its default and what the window is around. `Duration` is the caller's,
/// as in [`verifier_settings!`](crate::verifier::verifier_settings).
macro_rules! replay_window_methods {
    ($(#[$doc:meta])* self.$($field:ident).+) => {
        $(#[$doc])*
        pub fn tolerance(mut self, tolerance: Duration) -> Self {
            self.$($field).+.set(tolerance);
            self
        }

        /// Turns the replay window off: a captured delivery then verifies at any time, and only
        /// the idempotency record (for its TTL) keeps it from running twice.
        pub fn disable_replay_window(mut self) -> Self {
            self.$($field).+.disable();
            self
        }
    };
}
pub(crate) use replay_window_methods;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_strict() {
        assert_eq!(parse_unix("t", "1614265330"), Ok(1_614_265_330));
        for bad in [
            "",
            "-1",
            "+1",
            "1.5",
            "1e9",
            " 1",
            "99999999999999999999",
            "abc",
        ] {
            assert_eq!(
                parse_unix("t", bad),
                Err(VerifyError::InvalidTimestamp { name: "t" }),
                "{bad:?}"
            );
        }
        assert!(check_window("t", u64::MAX, SystemTime::now(), None).is_err());
    }

    #[test]
    fn window_is_symmetric_and_disableable() {
        let now = UNIX_EPOCH + Duration::from_secs(10_000);
        let tol = Some(Duration::from_secs(300));
        assert!(check_window("t", 10_000 - 300, now, tol).is_ok());
        assert!(check_window("t", 10_000 + 300, now, tol).is_ok());
        assert!(matches!(
            check_window("t", 10_000 - 301, now, tol),
            Err(VerifyError::TimestampOutsideTolerance {
                skew_secs: -301,
                ..
            })
        ));
        assert!(matches!(
            check_window("t", 10_000 + 301, now, tol),
            Err(VerifyError::TimestampOutsideTolerance { skew_secs: 301, .. })
        ));
        assert!(check_window("t", 1, now, None).is_ok());
    }
}
