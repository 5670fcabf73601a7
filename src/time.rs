//! Time arithmetic and formatting that cannot panic.
//!
//! Durations come from configuration files and from annotations anyone with
//! push access can commit. `SystemTime + Duration` panics on overflow and
//! `humantime`'s RFC 3339 formatting panics beyond year 9999, so every
//! computation that involves such a value goes through this module: sums
//! saturate at [`latest`], and formatting clamps to the range it can show.

use std::time::{Duration, SystemTime};

/// Seconds from the epoch to 9999-12-31T23:59:59Z.
const LATEST_SECS: u64 = 253_402_300_799;

/// 9999-12-31T23:59:59Z: the latest time RFC 3339 can write. A sum that
/// would pass it stops here ("never", for every practical purpose).
pub fn latest() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(LATEST_SECS)
}

/// The longest duration accepted from configuration or annotations: ten
/// years. Anything longer is a typo (`500000000y`), not an intent.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `t + d`, saturating at [`latest`].
pub fn add(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_add(d).map_or(latest(), |sum| sum.min(latest()))
}

/// `later - earlier`, zero when `later` is not later.
pub fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// RFC 3339 to the second, UTC. Times outside 1970..=9999 are clamped.
pub fn rfc3339(t: SystemTime) -> String {
    let clamped = t.clamp(SystemTime::UNIX_EPOCH, latest());
    humantime::format_rfc3339_seconds(clamped).to_string()
}

/// A duration to the second, as `1h 30m`.
pub fn duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// A short duration to the millisecond, as `1s 500ms` (retry delays).
pub fn duration_ms(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
    .to_string()
}

/// Checks a duration from configuration or an annotation against
/// [`MAX_DURATION`]; the error says what the limit is.
pub fn check_duration(text: &str, d: Duration) -> Result<Duration, String> {
    if d > MAX_DURATION {
        return Err(format!(
            "`{text}` is longer than the limit of 10 years ({} days): give a shorter duration",
            MAX_DURATION.as_secs() / 86_400
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_saturate_instead_of_panicking() {
        let huge = Duration::from_secs(u64::MAX / 2);
        assert_eq!(add(SystemTime::now(), huge), latest());
        assert_eq!(add(latest(), Duration::from_secs(1)), latest());
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        assert_eq!(
            add(t, Duration::from_secs(5)),
            SystemTime::UNIX_EPOCH + Duration::from_secs(15)
        );
    }

    #[test]
    fn formatting_clamps_out_of_range_times() {
        assert_eq!(rfc3339(latest()), "9999-12-31T23:59:59Z");
        assert_eq!(
            rfc3339(add(latest(), Duration::from_secs(3600))),
            "9999-12-31T23:59:59Z"
        );
        let before_epoch = SystemTime::UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(rfc3339(before_epoch), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn absurd_durations_are_refused_with_the_limit() {
        let parsed = humantime::parse_duration("500000000y").unwrap();
        let err = check_duration("500000000y", parsed).unwrap_err();
        assert!(err.contains("10 years"), "{err}");
        assert!(check_duration("10m", Duration::from_secs(600)).is_ok());
    }
}
