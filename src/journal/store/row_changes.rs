//! Which resources this connection's writes changed since the memories
//! were last read, so that a running agent reads again only their rows.
//!
//! At 100,000 resources a whole read of the memories takes most of a
//! second, and every cycle that writes (one update after a one-file
//! commit) made the next one read them all again. The writer's SQLite
//! connection now carries `TEMP` triggers on the tables the memories are
//! read from, which note each row's resource in a `TEMP` table. Nothing
//! of this is in the state file: the triggers and tables live and die
//! with the connection, so the state's format is unchanged and another
//! process (an older binary too) never sees them.
//!
//! # Guarantees
//! * Only this connection's writes are noted. A commit by any other
//!   connection (a `tend override set`, another process) moves SQLite's
//!   `data_version`, and the next read is whole.
//! * The names noted are taken out under the connection's lock, in one
//!   step, after the read's freshness is taken: a write that commits
//!   after that is either in what is taken out (and its rows are read
//!   after it) or left for the next read. No name is lost between two
//!   reads.
//! * Only the read that took the names out last may be brought up to
//!   date from what was noted since (the store remembers its freshness
//!   and its number): anything older reads whole.
//! * PostgreSQL has no `TEMP` triggers on another session's tables; its
//!   state is read whole after any write, as before.

use super::sql::SqlValue;
use super::{Backend, BackendKind, Freshness, StateStore};
use crate::journal::StateError;

/// The tables a memory is read from, each keyed by the resource's `name`.
const TRACKED: &[&str] = &["resources", "drift_seen", "intents", "attempts", "failures"];

/// Beyond this many names changed, one whole read is cheaper than reading
/// each name's rows (and the map is rebuilt anyway).
pub(super) const MAX_CHANGED: usize = 5_000;

/// The `TEMP` tables and triggers, for the tables present.
fn tracking_sql(tables: &[&str]) -> String {
    let mut sql = String::from(
        "PRAGMA temp_store = MEMORY;\n\
         CREATE TEMP TABLE IF NOT EXISTS memory_rows_touched (name TEXT PRIMARY KEY) WITHOUT ROWID;\n\
         CREATE TEMP TABLE IF NOT EXISTS memory_rows_to_read (name TEXT PRIMARY KEY) WITHOUT ROWID;\n",
    );
    for table in tables {
        for (event, names) in [
            ("INSERT", &["NEW"][..]),
            ("UPDATE", &["OLD", "NEW"][..]),
            ("DELETE", &["OLD"][..]),
        ] {
            // No conflict clause: inside a trigger, the conflict policy of
            // the statement that fired it (an upsert's) overrides the
            // trigger's own, and `OR IGNORE` would abort the write. The
            // note is made only where it cannot conflict at all.
            let notes: String = names
                .iter()
                .map(|row| {
                    format!(
                        "INSERT INTO memory_rows_touched (name) SELECT {row}.name \
                         WHERE {row}.name IS NOT NULL AND NOT EXISTS \
                         (SELECT 1 FROM memory_rows_touched WHERE name = {row}.name); "
                    )
                })
                .collect();
            sql.push_str(&format!(
                "CREATE TEMP TRIGGER IF NOT EXISTS tend_touched_{table}_{event} \
                 AFTER {event} ON main.{table} BEGIN {notes}END;\n",
                event = event.to_lowercase(),
            ));
        }
    }
    sql
}

/// What a read of the memories covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Covered {
    /// Every resource.
    All,
    /// The names in `memory_rows_to_read` (SQLite only).
    Noted,
}

impl Covered {
    /// The condition on a `name` column (`column`) that keeps the rows
    /// covered, with `prefix` (`WHERE` or `AND`) when there is one.
    pub(super) fn filter(self, prefix: &str, column: &str) -> String {
        match self {
            Covered::All => String::new(),
            Covered::Noted => {
                format!(" {prefix} {column} IN (SELECT name FROM temp.memory_rows_to_read)")
            }
        }
    }
}

impl StateStore {
    /// Notes, on this (writer's SQLite) connection, each resource whose
    /// memory rows its writes change. Called once the schema is current.
    pub(super) fn track_memory_rows(&self) -> Result<(), StateError> {
        if self.kind != BackendKind::Sqlite {
            return Ok(());
        }
        let mut present = Vec::with_capacity(TRACKED.len());
        for table in TRACKED {
            if self.has_table(table)? {
                present.push(*table);
            }
        }
        // A state without every table (an older format this binary reads
        // but did not migrate) is read whole, as it always was.
        if present.len() != TRACKED.len() {
            return Ok(());
        }
        // Only a saving: a connection that cannot carry the notes reads
        // the memories whole, as it always did.
        if let Err(e) = self.conn().batch(&tracking_sql(&present)) {
            tracing::warn!(
                "state {}: cannot note the resources each write changes ({}); every read of the memories is whole",
                self.location,
                self.err(e)
            );
            return Ok(());
        }
        self.tracks_rows
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Starts a read of the memories: its freshness and number, and the
    /// names noted since the last read moved to `memory_rows_to_read`
    /// (how many), when this read can be brought up to date from `since`
    /// (the freshness and number of the read it follows). `None` names:
    /// the read must be whole (not tracked, another connection wrote, or
    /// `since` is not the last read).
    pub(super) fn begin_memory_read(
        &self,
        since: Option<(Freshness, u64)>,
    ) -> Result<(Freshness, u64, Option<usize>), StateError> {
        let now = self.freshness()?;
        let mut last = self
            .last_memory_read
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let number = last.map_or(1, |(_, n)| n + 1);
        let current = since.is_some()
            && *last == since
            && since.is_some_and(|(s, _)| s.data_version == now.data_version);
        *last = Some((now, number));
        if !self.tracks_rows.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok((now, number, None));
        }
        // Taken out whatever follows: a whole read covers them too. (On an
        // error this read is still the last: a read from an older one is
        // whole.)
        let conn = self.conn();
        let noted = take_noted(&conn).map_err(|e| self.err(e))?;
        drop(conn);
        Ok((now, number, current.then_some(noted)))
    }
}

/// Moves the names noted to `memory_rows_to_read`, under the caller's
/// lock of the connection (no write can come between the copy and the
/// delete), and counts them.
fn take_noted(conn: &Backend) -> Result<usize, super::sql::SqlError> {
    conn.batch(
        "DELETE FROM temp.memory_rows_to_read;\n\
         INSERT INTO temp.memory_rows_to_read SELECT name FROM temp.memory_rows_touched;\n\
         DELETE FROM temp.memory_rows_touched;",
    )?;
    let rows = conn.query("SELECT count(*) FROM temp.memory_rows_to_read", &[])?;
    let count = match rows.first().and_then(|r| r.0.first()) {
        Some(SqlValue::Int(n)) => usize::try_from(*n).unwrap_or(usize::MAX),
        _ => usize::MAX,
    };
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_has_a_trigger_for_each_kind_of_change() {
        let sql = tracking_sql(TRACKED);
        assert_eq!(
            sql.matches("CREATE TEMP TRIGGER").count(),
            TRACKED.len() * 3
        );
        let update = sql
            .lines()
            .find(|l| l.contains("AFTER update ON main.resources"))
            .unwrap_or_default();
        assert!(update.contains("SELECT OLD.name") && update.contains("SELECT NEW.name"));
        assert!(
            !sql.contains(" OR IGNORE"),
            "a conflict clause the upsert overrides"
        );
    }
}
