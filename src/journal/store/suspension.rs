//! The global freeze (`tend suspend`), kept as the `meta` value
//! `suspension` (JSON), on both backends.
//!
//! A value that cannot be read is not "no freeze": it reads as a freeze
//! saying why, so corruption never turns into action.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{StateStore, ms, time};
use crate::engine::Suspension;
use crate::journal::StateError;
use crate::journal::store::sql::args;
use crate::model::OnExpiry;

const KEY: &str = "suspension";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    reason: String,
    since_ms: i64,
    expires_ms: Option<i64>,
    on_expiry: String,
    by: String,
}

impl StateStore {
    /// The freeze in force, if any. An unreadable value is a freeze that
    /// says so (never none).
    pub fn suspension(&self) -> Result<Option<Suspension>, StateError> {
        let Some(text) = self.meta(KEY)? else {
            return Ok(None);
        };
        Ok(Some(decode(&text).unwrap_or_else(|problem| Suspension {
            reason: format!(
                "the suspension kept in the state cannot be read ({problem}); `tend resume` clears it"
            ),
            since: SystemTime::UNIX_EPOCH,
            expires: None,
            on_expiry: OnExpiry::Hold,
            by: "(unknown)".into(),
        })))
    }

    /// Sets (replaces) the freeze.
    pub fn set_suspension(&self, suspension: &Suspension) -> Result<(), StateError> {
        let stored = Stored {
            reason: suspension.reason.clone(),
            since_ms: ms(suspension.since),
            expires_ms: suspension.expires.map(ms),
            on_expiry: match suspension.on_expiry {
                OnExpiry::Hold => "hold".into(),
                OnExpiry::Resume => "resume".into(),
            },
            by: suspension.by.clone(),
        };
        let text = serde_json::to_string(&stored).map_err(|source| StateError::Encode {
            path: self.location.clone(),
            what: "the suspension".into(),
            source,
        })?;
        self.set_meta(KEY, &text)
    }

    /// Ends the freeze; whether there was one.
    pub fn clear_suspension(&self) -> Result<bool, StateError> {
        self.write(|tx| Ok(tx.count("DELETE FROM meta WHERE key = ?1", args![KEY])? > 0))
    }
}

fn decode(text: &str) -> Result<Suspension, String> {
    let stored: Stored = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let on_expiry = match stored.on_expiry.as_str() {
        "hold" => OnExpiry::Hold,
        "resume" => OnExpiry::Resume,
        other => return Err(format!("on_expiry `{other}` is neither hold nor resume")),
    };
    Ok(Suspension {
        reason: stored.reason,
        since: time(stored.since_ms),
        expires: stored.expires_ms.map(time),
        on_expiry,
        by: stored.by,
    })
}
