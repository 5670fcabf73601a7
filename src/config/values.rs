//! Deserializers for bounded configuration values. A value outside its
//! bounds is refused where it is written (toml reports the line and the
//! key), never clamped: a silent `max_concurrency = 0 → 1` hides a typo.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration like `10m`, at most [`crate::time::MAX_DURATION`].
pub fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    let parsed = humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!("`{text}` is not a duration like \"10m\" ({e})"))
    })?;
    crate::time::check_duration(&text, parsed).map_err(serde::de::Error::custom)
}

/// `max_concurrency`: at least 1, at most 1,024.
pub fn concurrency<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    bounded(d, "max_concurrency", 1, 1024, "concurrent operations")
}

/// `rate_limit` (calls per second): at least 1, at most 10,000.
pub fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    bounded(d, "rate_limit", 1, 10_000, "calls per second").map(|v| v as u32)
}

/// The key is named in the message: inside a `[providers.NAME]` table
/// toml can only point at the table, not at the key.
fn bounded<'de, D: Deserializer<'de>>(
    d: D,
    key: &str,
    min: u64,
    max: u64,
    what: &str,
) -> Result<usize, D::Error> {
    let value = i64::deserialize(d)?;
    if value < min as i64 || value > max as i64 {
        return Err(serde::de::Error::custom(format!(
            "{key} = {value} is out of range: give {min} to {max} {what}"
        )));
    }
    Ok(value as usize)
}
