//! Signed timestamps: strict unix seconds and the replay window around the clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// `Some(d)`.
///
/// # Panics
/// On zero, which reads as "no tolerance" but would disable the check: the verifiers'
/// `disable_replay_window` says that.
pub(crate) fn tolerance(duration: Duration) -> Option<Duration> {
    assert!(
        !duration.is_zero(),
        "a zero replay window would disable the timestamp check; call disable_replay_window() \
         to turn it off"
    );
    Some(duration)
}

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
