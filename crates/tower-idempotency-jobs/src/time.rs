//! Times as the job tables store them: unix milliseconds from the application's clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `time` in unix milliseconds (0 before the epoch, `i64::MAX` past its range).
pub fn unix_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

/// Unix milliseconds as a time (the epoch for a negative value).
pub fn from_unix_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `duration` in milliseconds (`i64::MAX` past its range).
pub fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// `time` as RFC 3339 in UTC with milliseconds: `2023-11-14T22:13:20.123Z`.
pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// Unix milliseconds as RFC 3339 ([`rfc3339`]).
pub fn rfc3339_ms(ms: i64) -> String {
    rfc3339(from_unix_ms(ms))
}

/// Parses an RFC 3339 time (`2026-01-02T03:04:05Z`, fractions and offsets `Z` only).
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(text.trim_end_matches(['Z', 'z'])).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_both_ways() {
        let time = from_unix_ms(1_700_000_000_123);
        assert_eq!(rfc3339(time), "2023-11-14T22:13:20.123Z");
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20.123Z"), Some(time));
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(unix_ms(time), 1_700_000_000_123);
        assert_eq!(from_unix_ms(-5), UNIX_EPOCH);
    }
}
