//! What tend released (format 8): a `Retain` declaration removed from Git
//! whose database tend gave up. The resource itself is forgotten; this
//! record is kept so that the release is shown once in the reports and on
//! the status branch (`shown`), and so that the declaration coming back
//! is told how to take the database again (the adopt annotation).

use std::time::SystemTime;

use super::sql::args;
use super::{StateStore, Tx, ms, time};
use crate::journal::StateError;

/// One release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub name: String,
    pub provider: String,
    pub database_name: String,
    /// The declaration's file, relative to the repository root.
    pub file: String,
    pub operation_id: String,
    /// The commit that removed the declaration (`""`: not known).
    pub removal_commit: String,
    pub at: SystemTime,
}

impl Tx<'_> {
    /// Records the confirmed release of `name` (before it is forgotten:
    /// the removal commit is read from its tombstone).
    pub fn record_release(&self, release: &Release) -> Result<(), StateError> {
        self.exec(
            "INSERT INTO releases (name, provider, database_name, file, op_id, removal_commit, released_ms, shown) \
             VALUES (?1, ?2, ?3, ?4, ?5, coalesce((SELECT removal_commit FROM tombstones WHERE name = ?1), ?6), ?7, 0) \
             ON CONFLICT (name) DO UPDATE SET provider = excluded.provider, database_name = excluded.database_name, \
             file = excluded.file, op_id = excluded.op_id, removal_commit = excluded.removal_commit, \
             released_ms = excluded.released_ms, shown = 0",
            args![
                release.name.as_str(),
                release.provider.as_str(),
                release.database_name.as_str(),
                release.file.as_str(),
                release.operation_id.as_str(),
                release.removal_commit.as_str(),
                ms(release.at)
            ],
        )
    }

    /// `name` is managed again (adopted, created): its release is over.
    pub fn clear_release(&self, name: &str) -> Result<(), StateError> {
        self.exec("DELETE FROM releases WHERE name = ?1", args![name])
    }
}

impl StateStore {
    /// Every release kept, and whether it was shown yet, oldest first (a
    /// state older than format 8 has none).
    pub fn releases(&self) -> Result<Vec<(Release, bool)>, StateError> {
        if !self.has_table("releases")? {
            return Ok(Vec::new());
        }
        self.map_rows(
            "SELECT name, provider, database_name, file, op_id, removal_commit, released_ms, shown \
             FROM releases ORDER BY released_ms, name",
            &[],
            |r| {
                Ok((
                    Release {
                        name: r.get(0)?,
                        provider: r.get(1)?,
                        database_name: r.get(2)?,
                        file: r.get(3)?,
                        operation_id: r.get(4)?,
                        removal_commit: r.get(5)?,
                        at: time(r.get::<i64>(6)?),
                    },
                    r.get::<i64>(7)? != 0,
                ))
            },
        )
    }

    /// The releases of `names` were published (the report files, and the
    /// status branch when there is one): reports leave them out from now.
    pub fn releases_shown(&self, names: &[String]) -> Result<(), StateError> {
        if names.is_empty() || !self.has_table("releases")? {
            return Ok(());
        }
        self.write_aside(|tx| {
            for name in names {
                tx.exec(
                    "UPDATE releases SET shown = 1 WHERE name = ?1",
                    args![name.as_str()],
                )?;
            }
            Ok(())
        })
    }
}
