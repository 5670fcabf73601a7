//! The sandbox's storage: one SQLite file (`sandbox.db`) with a JSON body
//! per database and per idempotency key, and the import of the older
//! file-per-database layout.

use std::fs;
use std::sync::MutexGuard;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::cause::Cause;

use super::{RecordedOperation, SandboxDatabase, SandboxError, SandboxProvider, SandboxState};

/// The sandbox file's two tables: a JSON body per key.
#[derive(Debug, Clone, Copy)]
enum Table {
    Databases,
    Operations,
}

impl Table {
    pub(super) fn name(self) -> &'static str {
        match self {
            Table::Databases => "databases",
            Table::Operations => "operations",
        }
    }

    pub(super) fn key_column(self) -> &'static str {
        match self {
            Table::Databases => "name",
            Table::Operations => "key",
        }
    }

    /// The statement that writes one row (replacing it): the key as `?1`,
    /// the body as `?2`.
    pub(super) fn replace_sql(self) -> String {
        format!(
            "INSERT OR REPLACE INTO {} ({}, body) VALUES (?1, ?2)",
            self.name(),
            self.key_column()
        )
    }

    /// What a row is, for messages.
    pub(super) fn describe(self, key: &str) -> String {
        match self {
            Table::Databases => format!("database `{key}`"),
            Table::Operations => format!("idempotency key {key}"),
        }
    }
}

impl SandboxProvider {
    /// The connection, opened (and the schema created) on first use.
    /// No fsync (`synchronous = NORMAL` in WAL mode): the sandbox stands for
    /// a remote service, whose durability a killed tend cannot touch, and
    /// a committed row survives the death of the process that wrote it.
    pub(super) fn conn(&self) -> Result<MutexGuard<'_, Option<Connection>>, SandboxError> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() && self.read_only {
            *guard = Some(self.open_for_reading()?);
        }
        if guard.is_none() {
            fs::create_dir_all(&self.dir).map_err(|e| self.storage_err(e))?;
            let conn = Connection::open(self.db_path()).map_err(|e| self.storage_err(e))?;
            conn.busy_timeout(Duration::from_secs(10))
                .map_err(|e| self.storage_err(e))?;
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(|e| self.storage_err(e))?;
            conn.pragma_update(None, "synchronous", "NORMAL")
                .map_err(|e| self.storage_err(e))?;
            conn.pragma_update(None, "cache_size", -crate::process::sqlite::PAGE_CACHE_KIB)
                .map_err(|e| self.storage_err(e))?;
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS databases (name TEXT PRIMARY KEY, body TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS operations (key TEXT PRIMARY KEY, body TEXT NOT NULL);",
            )
            .map_err(|e| self.storage_err(e))?;
            self.import_files(&conn)?;
            *guard = Some(conn);
        }
        Ok(guard)
    }

    /// A reader's connection: the sandbox's file read without a trace, or
    /// (no sandbox yet) an empty one in memory. A write through it fails.
    fn open_for_reading(&self) -> Result<Connection, SandboxError> {
        let path = self.db_path();
        if path.exists() {
            return crate::process::sqlite::open_reader(&path).map_err(|e| self.storage_err(e));
        }
        let conn = Connection::open_in_memory().map_err(|e| self.storage_err(e))?;
        conn.execute_batch(
            "CREATE TABLE databases (name TEXT PRIMARY KEY, body TEXT NOT NULL);
             CREATE TABLE operations (key TEXT PRIMARY KEY, body TEXT NOT NULL);
             PRAGMA query_only = 1;",
        )
        .map_err(|e| self.storage_err(e))?;
        Ok(conn)
    }

    /// Moves a sandbox written by tend 0.1 before the SQLite layout (a JSON
    /// file per database in `databases/`, per key in `operations/`) into
    /// the database, once; the old directories are renamed, not deleted.
    pub(super) fn import_files(&self, conn: &Connection) -> Result<(), SandboxError> {
        #[derive(Deserialize)]
        struct DatabaseFile {
            name: String,
            #[serde(flatten)]
            database: SandboxDatabase,
        }
        for (sub, table) in [("databases", "databases"), ("operations", "operations")] {
            let dir = self.dir.join(sub);
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                // An unreadable old sandbox must not look empty (tend would
                // create everything again).
                Err(e) => {
                    return Err(SandboxError::Storage {
                        path: self.db_path(),
                        source: Cause::explained(format!("{}: {e}", dir.display()), e),
                    });
                }
            };
            let mut rows = Vec::new();
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                let corrupt = |source: Cause| SandboxError::Corrupt {
                    path: path.clone(),
                    source,
                };
                let bytes = fs::read(&path).map_err(|e| corrupt(Cause::new(e)))?;
                let stem = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let row = if table == "databases" {
                    let file: DatabaseFile =
                        serde_json::from_slice(&bytes).map_err(|e| corrupt(Cause::new(e)))?;
                    (file.name, self.encode(&file.database)?)
                } else {
                    let op: RecordedOperation =
                        serde_json::from_slice(&bytes).map_err(|e| corrupt(Cause::new(e)))?;
                    (stem, self.encode(&op)?)
                };
                rows.push(row);
            }
            let insert = format!("INSERT OR IGNORE INTO {table} VALUES (?1, ?2)");
            let tx = conn
                .unchecked_transaction()
                .map_err(|e| self.storage_err(e))?;
            for (key, body) in &rows {
                tx.execute(&insert, params![key, body])
                    .map_err(|e| self.storage_err(e))?;
            }
            tx.commit().map_err(|e| self.storage_err(e))?;
            // Never over an earlier import (a rollback may have made a new
            // directory after one).
            let mut target = self.dir.join(format!("{sub}.imported"));
            for n in 2.. {
                if !target.exists() {
                    break;
                }
                target = self.dir.join(format!("{sub}.imported-{n}"));
            }
            fs::rename(&dir, &target).map_err(|e| self.storage_err(e))?;
            tracing::info!(
                "sandbox `{}`: imported {} {sub} from {} into {}",
                self.name,
                rows.len(),
                dir.display(),
                self.db_path().display()
            );
        }
        Ok(())
    }

    /// Runs `f` on the open connection.
    pub(super) fn with_conn<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, SandboxError> {
        let guard = self.conn()?;
        let conn = guard
            .as_ref()
            .ok_or_else(|| self.storage_err(std::io::Error::other("not open")))?;
        f(conn).map_err(|e| self.storage_err(e))
    }

    /// `body` decoded; `what` names it in the error (built only then: a
    /// sandbox's observation decodes every row).
    pub(super) fn decode<T: serde::de::DeserializeOwned>(
        &self,
        what: impl FnOnce() -> String,
        body: &str,
    ) -> Result<T, SandboxError> {
        serde_json::from_str(body).map_err(|e| SandboxError::Corrupt {
            path: self.db_path(),
            source: Cause::explained(format!("{}: {e}", what()), e),
        })
    }

    pub(super) fn encode(&self, value: &impl Serialize) -> Result<String, SandboxError> {
        serde_json::to_string(value).map_err(|e| self.storage_err(e))
    }

    /// One row's body, decoded.
    fn get<T: serde::de::DeserializeOwned>(
        &self,
        table: Table,
        key: &str,
    ) -> Result<Option<T>, SandboxError> {
        let sql = format!(
            "SELECT body FROM {} WHERE {} = ?1",
            table.name(),
            table.key_column()
        );
        let body: Option<String> =
            self.with_conn(|c| c.query_row(&sql, [key], |r| r.get(0)).optional())?;
        body.map(|b| self.decode(|| table.describe(key), &b))
            .transpose()
    }

    /// Writes one row (replacing it).
    fn put(&self, table: Table, key: &str, value: &impl Serialize) -> Result<(), SandboxError> {
        let body = self.encode(value)?;
        self.with_conn(|c| c.execute(&table.replace_sql(), params![key, body]))
            .map(drop)
    }

    /// Every row, by key. Each body is decoded from the row's own bytes
    /// (a copy of every body first cost an allocation a row, at every
    /// observation of a sandbox holding thousands).
    ///
    /// The table is read in its own order and sorted here: `ORDER BY` the
    /// key walked the key's index and looked each row up in the table, a
    /// B-tree search a row (about 7 % of a running agent's CPU over
    /// 100,000 databases). Databases created concurrently are stored out
    /// of key order, so the sort is a real one: about 1.5 % of that CPU.
    fn all<T: serde::de::DeserializeOwned>(
        &self,
        table: Table,
    ) -> Result<Vec<(String, T)>, SandboxError> {
        let sql = format!("SELECT {}, body FROM {}", table.key_column(), table.name());
        // The query's error is SQLite's; a row's, its body's.
        self.with_conn(|c| {
            let mut stmt = c.prepare(&sql)?;
            let mut rows = stmt.query([])?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let key: String = row.get(0)?;
                let body = row.get_ref(1)?.as_str().map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        1,
                        rusqlite::types::Type::Text,
                        e.into(),
                    )
                })?;
                match self.decode(|| table.describe(&key), body) {
                    Ok(value) => out.push((key, value)),
                    Err(e) => return Ok(Err(e)),
                }
            }
            out.sort_by(|(a, _), (b, _)| a.cmp(b));
            Ok(Ok(out))
        })?
    }

    /// One database.
    pub fn load_database(&self, name: &str) -> Result<Option<SandboxDatabase>, SandboxError> {
        self.get(Table::Databases, name)
    }

    /// Stores one database.
    pub fn store_database(
        &self,
        name: &str,
        database: &SandboxDatabase,
    ) -> Result<(), SandboxError> {
        self.put(Table::Databases, name, database)
    }

    /// Drops one database.
    pub fn remove_database(&self, name: &str) -> Result<(), SandboxError> {
        self.with_conn(|c| c.execute("DELETE FROM databases WHERE name = ?1", [name]))
            .map(drop)
    }

    /// Every database, by name.
    pub(super) fn databases(&self) -> Result<Vec<(String, SandboxDatabase)>, SandboxError> {
        self.all(Table::Databases)
    }

    pub(super) fn load_operation(
        &self,
        key: &str,
    ) -> Result<Option<RecordedOperation>, SandboxError> {
        self.get(Table::Operations, key)
    }

    pub(super) fn store_operation(
        &self,
        key: &str,
        op: &RecordedOperation,
    ) -> Result<(), SandboxError> {
        self.put(Table::Operations, key, op)
    }

    /// Stores a new database and the idempotency key of the call that
    /// made it in one transaction, as a provider commits an effect with
    /// its key. Two writes left a window, and the sandbox runs in tend's
    /// process: killed between them, it kept a database without the key,
    /// and where names are not unique the replay under the same key made a
    /// second one (`NAME~1`).
    pub(super) fn store_created(
        &self,
        name: &str,
        database: &SandboxDatabase,
        key: &str,
        op: &RecordedOperation,
    ) -> Result<(), SandboxError> {
        let database = self.encode(database)?;
        let op = self.encode(op)?;
        self.with_conn(|c| {
            let tx = c.unchecked_transaction()?;
            tx.execute(&Table::Databases.replace_sql(), params![name, database])?;
            tx.execute(&Table::Operations.replace_sql(), params![key, op])?;
            tx.commit()
        })
    }

    /// Everything in the sandbox (an absent file is an empty sandbox).
    pub fn load(&self) -> Result<SandboxState, SandboxError> {
        Ok(SandboxState {
            databases: self.databases()?.into_iter().collect(),
            operations: self.all(Table::Operations)?.into_iter().collect(),
            next_id: 0,
        })
    }

    /// Makes the databases exactly `state.databases` (the dashboard's edits).
    pub fn save(&self, state: &SandboxState) -> Result<(), SandboxError> {
        for (name, _) in self.databases()? {
            if !state.databases.contains_key(&name) {
                self.remove_database(&name)?;
            }
        }
        for (name, database) in &state.databases {
            self.store_database(name, database)?;
        }
        Ok(())
    }
}
