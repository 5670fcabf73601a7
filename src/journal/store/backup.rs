//! `tend state backup`: a consistent copy of the SQLite state, taken
//! beside the running agent.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::{Backend, StateStore, sql_err};
use crate::journal::StateError;

impl StateStore {
    /// Copies the SQLite state into a new file `target` with SQLite's
    /// online backup (one step, under one read transaction: a consistent
    /// copy, also beside the running agent), then checks the copy. An
    /// existing `target` is refused, never overwritten.
    pub fn backup_to(&self, target: &Path) -> Result<(), StateError> {
        let guard = self.conn();
        let Backend::Sqlite(source) = &*guard else {
            return Err(StateError::Refused {
                path: target.display().to_string(),
                problem: "the state is in PostgreSQL: back it up with pg_dump (docs/operations.md, \"Backups\")"
                    .into(),
            });
        };
        // `create_new`: an existing file (a symlink included) is refused.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .map_err(|source| StateError::BackupTarget {
                path: target.display().to_string(),
                source,
            })?;
        let mut copy = Connection::open(target).map_err(|e| sql_err(target, e))?;
        {
            let backup =
                rusqlite::backup::Backup::new(source, &mut copy).map_err(|e| sql_err(target, e))?;
            backup
                .run_to_completion(i32::MAX, Duration::from_millis(50), None)
                .map_err(|e| sql_err(target, e))?;
        }
        let check: String = copy
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| sql_err(target, e))?;
        if check != "ok" {
            return Err(StateError::Refused {
                path: target.display().to_string(),
                problem: format!("the copy fails SQLite's integrity check: {check}"),
            });
        }
        copy.pragma_update(None, "journal_mode", "DELETE")
            .map_err(|e| sql_err(target, e))?;
        drop(copy);
        std::fs::File::open(target)
            .and_then(|f| f.sync_all())
            .map_err(|source| StateError::Io {
                path: target.display().to_string(),
                source,
            })
    }
}
