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
pub(crate) fn latest() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(LATEST_SECS)
}

/// The longest duration accepted from configuration or annotations: ten
/// years. Anything longer is a typo (`500000000y`), not an intent.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `t + d`, saturating at [`latest`].
pub(crate) fn add(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_add(d).map_or(latest(), |sum| sum.min(latest()))
}

/// `later - earlier`, zero when `later` is not later.
pub(crate) fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// RFC 3339 to the second, UTC. Times outside 1970..=9999 are clamped.
pub fn rfc3339(t: SystemTime) -> String {
    let clamped = t.clamp(SystemTime::UNIX_EPOCH, latest());
    humantime::format_rfc3339_seconds(clamped).to_string()
}

/// RFC 3339 with any offset (`Z`, `+02:00`, `-04:30`): the one parser for
/// times read from annotations and from providers. `humantime` accepts
/// only `Z`, so a numeric offset is split off and applied here.
pub(crate) fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    if text.ends_with('Z') || text.ends_with('z') {
        return humantime::parse_rfc3339_weak(text).ok();
    }
    let split = text.len().checked_sub(6)?;
    let (local, offset) = (text.get(..split)?, text.get(split..)?);
    let bytes = offset.as_bytes();
    let sign = match bytes[0] {
        b'+' => 1i64,
        b'-' => -1i64,
        _ => return None,
    };
    if bytes[3] != b':' {
        return None;
    }
    let hours: u64 = offset.get(1..3)?.parse().ok()?;
    let minutes: u64 = offset.get(4..6)?.parse().ok()?;
    if hours > 23 || minutes > 59 || !local.contains('T') {
        return None;
    }
    let as_utc = humantime::parse_rfc3339_weak(&format!("{local}Z")).ok()?;
    let shift = Duration::from_secs(hours * 3600 + minutes * 60);
    // A positive offset means the local time is ahead of UTC.
    if sign > 0 {
        as_utc.checked_sub(shift)
    } else {
        as_utc.checked_add(shift)
    }
}

/// A duration to the second, as `1h 30m`.
pub(crate) fn duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// A short duration to the millisecond, as `1s 500ms` (retry delays).
pub(crate) fn duration_ms(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
    .to_string()
}

/// Checks a duration from configuration or an annotation against
/// [`MAX_DURATION`]; the error says what the limit is.
pub(crate) fn check_duration(text: &str, d: Duration) -> Result<Duration, String> {
    if d > MAX_DURATION {
        return Err(format!(
            "`{text}` is longer than the limit of 10 years ({} days): give a shorter duration",
            MAX_DURATION.as_secs() / 86_400
        ));
    }
    Ok(d)
}

/// An HTTP date in the IMF-fixdate form (`Sun, 06 Nov 1994 08:49:37
/// GMT`), the one RFC 9110 says senders use (as `Retry-After` may carry).
pub(crate) fn parse_http_date(text: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [_, day, month, year, clock, "GMT"] = parts.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m == month)? + 1;
    if day.len() != 2 || year.len() != 4 || clock.len() != 8 {
        return None;
    }
    humantime::parse_rfc3339(&format!("{year}-{month:02}-{day}T{clock}Z")).ok()
}

/// An optional time written as RFC 3339 text, and read back from it (a
/// text that is not such a time is an error): `#[serde(with = ...)]`
/// for a time held as a `SystemTime` and shown as text.
pub(crate) mod optional_rfc3339 {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer, de};

    pub(crate) fn serialize<S: Serializer>(
        time: &Option<SystemTime>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match time {
            Some(time) => serializer.serialize_str(&super::rfc3339(*time)),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<SystemTime>, D::Error> {
        match Option::<String>::deserialize(deserializer)? {
            None => Ok(None),
            Some(text) => super::parse_rfc3339(&text)
                .map(Some)
                .ok_or_else(|| de::Error::custom(format!("`{text}` is not an RFC 3339 time"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_offsets_are_applied() {
        let utc = parse_rfc3339("2026-12-01T18:00:00Z").unwrap();
        assert_eq!(parse_rfc3339("2026-12-01T20:00:00+02:00"), Some(utc));
        assert_eq!(parse_rfc3339("2026-12-01T13:30:00-04:30"), Some(utc));
        assert_eq!(parse_rfc3339("2026-12-01T18:00:00+00:00"), Some(utc));
        assert_eq!(parse_rfc3339("2026-12-01 18:00:00"), None);
        assert_eq!(parse_rfc3339("tomorrow"), None);
        assert_eq!(parse_rfc3339("2026-12-01T18:00:00+0é:00"), None);
    }

    /// The text a time held as a `SystemTime` is written as, and read
    /// back as, is the one `rfc3339` makes; other text is refused.
    #[test]
    fn an_optional_time_is_written_and_read_as_rfc3339_text() -> Result<(), serde_json::Error> {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Held {
            #[serde(
                default,
                skip_serializing_if = "Option::is_none",
                with = "optional_rfc3339"
            )]
            at: Option<SystemTime>,
        }
        let at = parse_rfc3339("2026-12-01T18:00:00Z").expect("an RFC 3339 time")
            + Duration::from_millis(250);
        let text = serde_json::to_string(&Held { at: Some(at) })?;
        assert_eq!(text, format!("{{\"at\":\"{}\"}}", rfc3339(at)));
        // Written to the second, as every time tend writes.
        let second = at - Duration::from_millis(250);
        assert_eq!(
            serde_json::from_str::<Held>(&text)?,
            Held { at: Some(second) }
        );
        assert_eq!(serde_json::to_string(&Held { at: None })?, "{}");
        assert_eq!(serde_json::from_str::<Held>("{}")?, Held { at: None });
        let refused = serde_json::from_str::<Held>(r#"{"at":"08:00"}"#).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("`08:00` is not an RFC 3339 time"),
            "{refused}"
        );
        Ok(())
    }

    #[test]
    fn http_dates_in_the_imf_fixdate_form() {
        assert_eq!(
            parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT"),
            parse_rfc3339("2015-10-21T07:28:00Z")
        );
        assert_eq!(parse_http_date("Wed, 21 Oct 2015 07:28:00 CET"), None);
        assert_eq!(parse_http_date("Wednesday, 21-Oct-15 07:28:00 GMT"), None);
        assert_eq!(parse_http_date("3"), None);
    }

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
