//! The SQLite state store: opening, formats and migrations, `meta`, and
//! the integrity check. Reads are in [`read`], writes in [`write`].

mod migrations;
mod read;
mod status;
mod write;

pub use read::{
    Approval, CorruptRow, Intent, IntentState, LocalOverride, OverrideSeen, StoredMemories,
    TombstoneRow,
};
pub use status::{DecidedFrom, LastOperation, PendingNotification, QueuedNotification};
pub use write::{Applied, Tx};

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::{FORMAT, READABLE_FORMAT, StateError};
use crate::model::hash::sha256_hex;

/// SQLite's page cache per connection, in KiB: enough for the resource
/// rows of 10,000 declarations.
pub const PAGE_CACHE_KIB: i64 = 8 * 1024;

fn ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn time(ms: i64) -> SystemTime {
    crate::time::add(
        SystemTime::UNIX_EPOCH,
        Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
    )
}

/// The state database. Statements are short; one connection behind a mutex.
#[derive(Debug)]
pub struct StateStore {
    conn: Mutex<Connection>,
    path: PathBuf,
    /// Write transactions committed through this store (see
    /// [`StateStore::freshness`]).
    writes: std::sync::atomic::AtomicU64,
}

/// Identifies a moment of the database's content: this store's writes
/// and SQLite's `data_version` (which moves when another connection
/// commits). Anything read at one freshness is current while it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    writes: u64,
    data_version: i64,
}

impl StateStore {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The database's content now, as a value to compare later.
    pub fn freshness(&self) -> Result<Freshness, StateError> {
        let data_version = self
            .conn()
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        Ok(Freshness {
            writes: self.writes.load(std::sync::atomic::Ordering::SeqCst),
            data_version,
        })
    }

    fn wrote(&self) {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn err(&self, e: rusqlite::Error) -> StateError {
        sql_err(&self.path, e)
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks compatibility without writing a byte: `immutable=1` makes
    /// SQLite touch neither the file nor a WAL or journal.
    fn check_readable(path: &Path) -> Result<(), StateError> {
        let conn = Connection::open_with_flags(
            immutable_uri(path),
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(|e| sql_err(path, e))?;
        let has_meta: bool = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(|e| sql_err(path, e))?
            > 0;
        if !has_meta {
            return Ok(());
        }
        let found: Option<String> = conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'min_reader_format'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| sql_err(path, e))?;
        let found = found.and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        if found > READABLE_FORMAT {
            let writer: Option<String> = conn
                .query_row(
                    "SELECT value FROM meta WHERE key = 'writer_version'",
                    [],
                    |r| r.get(0),
                )
                .optional()
                .map_err(|e| sql_err(path, e))?;
            return Err(StateError::TooNew {
                path: path.display().to_string(),
                found,
                supported: READABLE_FORMAT,
                writer: writer.unwrap_or_else(|| "(unknown version)".into()),
            });
        }
        Ok(())
    }

    /// Opens (and for a writer creates and migrates) `state_dir/state.db`.
    /// A reader on a state dir without a database gets `None`.
    ///
    /// Only a missing database starts fresh. One that exists but is empty
    /// or unreadable is [`StateError::Damaged`]: starting afresh over it
    /// would silently forget the journal, tombstones and override clocks.
    /// A new database is built beside the final name and moved into place
    /// whole, so a crash while creating it leaves nothing, never the empty
    /// file that would then be refused.
    pub fn open(state_dir: &Path, writer: bool) -> Result<Option<Self>, StateError> {
        let path = state_dir.join("state.db");
        if !super::state_dir::exists(state_dir)? && !writer {
            return Ok(None);
        }
        match std::fs::metadata(&path) {
            Ok(meta) if meta.len() == 0 => {
                return Err(StateError::Damaged {
                    path: path.display().to_string(),
                    problem: "is empty (zero bytes)".into(),
                });
            }
            Ok(_) => Self::check_readable(&path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let wal = state_dir.join("state.db-wal");
                if wal.exists() {
                    return Err(StateError::Damaged {
                        path: path.display().to_string(),
                        problem: "is missing while its write-ahead log state.db-wal is there"
                            .into(),
                    });
                }
                if !writer {
                    return Ok(None);
                }
                super::state_dir::prepare_for_writing(state_dir)?;
                Self::create(state_dir, &path)?;
            }
            Err(e) => {
                return Err(StateError::Io {
                    path: path.display().to_string(),
                    message: e.to_string(),
                });
            }
        }
        if writer {
            super::state_dir::check_trusted(state_dir)?;
        }
        let conn = if writer {
            Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_WRITE)
                .map_err(|e| sql_err(&path, e))?
        } else {
            Self::open_reader(&path)?
        };
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(|e| sql_err(&path, e))?;
        // A cycle reads every resource's row: from SQLite's page cache,
        // sized to hold them, rather than thousands of page-sized read(2)
        // calls. Not a memory map: every page a map ever touched (a
        // one-time read of the whole journal) would stay resident.
        conn.pragma_update(None, "cache_size", -PAGE_CACHE_KIB)
            .map_err(|e| sql_err(&path, e))?;
        let store = StateStore {
            conn: Mutex::new(conn),
            path,
            writes: std::sync::atomic::AtomicU64::new(0),
        };
        if writer {
            store.migrate()?;
        }
        Ok(Some(store))
    }

    /// A read-only connection. A WAL database needs its shared-memory file
    /// (`state.db-shm`); where the reader cannot create it (a state dir it
    /// may only read, no writer running, so no such file) the database is
    /// read as immutable: with no writer there is nothing to coordinate.
    fn open_reader(path: &Path) -> Result<Connection, StateError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| sql_err(path, e))?;
        // The shared memory is only set up on the first read.
        match conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        }) {
            Ok(_) => Ok(conn),
            Err(e) if is_readonly_error(&e) => {
                drop(conn);
                Connection::open_with_flags(immutable_uri(path), flags | OpenFlags::SQLITE_OPEN_URI)
                    .map_err(|e| sql_err(path, e))
            }
            Err(e) => Err(sql_err(path, e)),
        }
    }

    /// Builds a new, migrated database and moves it to `path` unless
    /// another writer (an `override set` beside a first `apply`) got there
    /// first.
    fn create(state_dir: &Path, path: &Path) -> Result<(), StateError> {
        let io = |p: &Path, e: std::io::Error| StateError::Io {
            path: p.display().to_string(),
            message: e.to_string(),
        };
        let fresh = state_dir.join(format!("state.db.new-{}", std::process::id()));
        let _ = std::fs::remove_file(&fresh);
        {
            let conn = Connection::open_with_flags(
                &fresh,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            )
            .map_err(|e| sql_err(&fresh, e))?;
            let store = StateStore {
                conn: Mutex::new(conn),
                path: fresh.clone(),
                writes: std::sync::atomic::AtomicU64::new(0),
            };
            store.migrate()?;
            // Closing the last connection checkpoints the WAL into the
            // file and removes it: the file alone is the database.
        }
        std::fs::File::open(&fresh)
            .and_then(|f| f.sync_all())
            .map_err(|e| io(&fresh, e))?;
        // A hard link fails when the name exists: the first creator wins.
        let linked = std::fs::hard_link(&fresh, path);
        let _ = std::fs::remove_file(&fresh);
        match linked {
            Ok(()) => std::fs::File::open(state_dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(state_dir, e)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(io(path, e)),
        }
    }

    /// The `meta` values a migration looks at, read without a
    /// transaction (a fresh file has no `meta` table yet: all `None`).
    fn format_meta(conn: &Connection) -> (i64, i64, Option<String>) {
        let read = |key: &str| -> Option<String> {
            conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
                .ok()
        };
        let number = |key: &str| read(key).and_then(|v| v.parse().ok()).unwrap_or(0);
        (
            number("format"),
            number("min_reader_format"),
            read("writer_version"),
        )
    }

    /// Brings the file to this binary's format. Nothing is written when it
    /// is already there: every writer open (an operator's `override set`
    /// beside a running agent included) would otherwise take the write lock
    /// just to rewrite `meta`.
    fn migrate(&self) -> Result<(), StateError> {
        let mut conn = self.conn();
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| sql_err(&self.path, e))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| sql_err(&self.path, e))?;
        let version = env!("CARGO_PKG_VERSION");
        let (format, min_reader, writer) = Self::format_meta(&conn);
        if format >= FORMAT && min_reader >= READABLE_FORMAT && writer.as_deref() == Some(version) {
            return Ok(());
        }
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| sql_err(&self.path, e))?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
        )
        .map_err(|e| sql_err(&self.path, e))?;
        // Read again under the write lock: another writer may have migrated.
        let (current, min_reader, _) = Self::format_meta(&tx);
        for (i, step) in migrations::STEPS.iter().enumerate() {
            let format = i as i64 + 1;
            if format > current {
                step.apply(&tx).map_err(|e| sql_err(&self.path, e))?;
            }
        }
        // A newer writer's higher format and reader requirement stay: this
        // binary only raises them.
        for (key, value) in [
            ("format", current.max(FORMAT).to_string()),
            (
                "min_reader_format",
                min_reader.max(READABLE_FORMAT).to_string(),
            ),
            ("writer_version", version.to_string()),
        ] {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(|e| sql_err(&self.path, e))?;
        }
        tx.commit().map_err(|e| sql_err(&self.path, e))
    }

    /// A `meta` value.
    pub fn meta(&self, key: &str) -> Result<Option<String>, StateError> {
        self.conn()
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))
    }

    /// The agent id: the configured one (kept), else the kept one, else a
    /// new one generated once and kept.
    pub fn agent_id(&self, configured: Option<&str>) -> Result<String, StateError> {
        let kept = self.meta("agent_id")?;
        if let Some(id) = configured {
            if kept.as_deref() != Some(id) {
                self.set_meta("agent_id", id)?;
            }
            return Ok(id.to_string());
        }
        if let Some(id) = kept {
            return Ok(id);
        }
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_i64(ms(SystemTime::now()));
        h.write_u32(std::process::id());
        let id = format!("tend-{}", &sha256_hex(&h.finish().to_le_bytes())[..12]);
        self.set_meta("agent_id", &id)?;
        Ok(id)
    }

    fn set_meta(&self, key: &str, value: &str) -> Result<(), StateError> {
        self.conn()
            .execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Opens the state database for a local override change: read-write but
    /// without the writer lock (an operator must be able to pause a resource
    /// while `tend run` or `tend apply` holds it). Creates the state if none.
    pub fn open_for_overrides(state_dir: &Path) -> Result<Self, StateError> {
        // (`override list` reads through `open(_, false)`.)
        Self::open(state_dir, true)?.ok_or_else(|| StateError::Io {
            path: state_dir.display().to_string(),
            message: "the state database could not be created".into(),
        })
    }

    /// `PRAGMA integrity_check` plus tend's own invariants; each problem is
    /// one line.
    pub fn check(&self) -> Result<Vec<String>, StateError> {
        let conn = self.conn();
        let mut problems = Vec::new();
        let integrity: Vec<String> = conn
            .prepare("PRAGMA integrity_check")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| self.err(e))?;
        problems.extend(integrity.into_iter().filter(|l| l != "ok"));
        for key in ["format", "min_reader_format"] {
            let found: Option<String> = conn
                .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
                .optional()
                .map_err(|e| self.err(e))?;
            if found.is_none() {
                problems.push(format!("meta.{key} is missing"));
            }
        }
        let bad_states: i64 = conn
            .query_row(
                "SELECT count(*) FROM intents WHERE state NOT IN ('pending', 'done', 'failed')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))?;
        if bad_states > 0 {
            problems.push(format!("{bad_states} intents have an unknown state"));
        }
        drop(conn);
        let corrupt = self
            .open_intents()?
            .into_iter()
            .filter_map(Result::err)
            .chain(self.tombstones()?.into_iter().filter_map(Result::err))
            .chain(self.local_overrides()?.into_iter().filter_map(Result::err));
        problems.extend(corrupt.map(|row| row.to_string()));
        Ok(problems)
    }

    /// A readable summary for `tend state show`.
    pub fn summary(&self) -> Result<String, StateError> {
        // Before taking the connection: these take it themselves.
        let (held, approved) = (self.held_deletions()?.len(), self.approvals()?.len());
        let conn = self.conn();
        let count = |sql: &str| {
            conn.query_row(sql, [], |r| r.get::<_, i64>(0))
                .map_err(|e| sql_err(&self.path, e))
        };
        let mut out = String::new();
        let meta: Vec<(String, String)> = conn
            .prepare("SELECT key, value FROM meta ORDER BY key")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .map_err(|e| self.err(e))?;
        out.push_str(&format!("state: {}\n", self.path.display()));
        for (k, v) in meta {
            out.push_str(&format!("  {k}: {v}\n"));
        }
        out.push_str(&format!(
            "  resources managed: {}\n  intents: {} pending, {} done, {} failed\n  tombstones: {}\n  local overrides: {}\n  deletions held by the guard: {}\n  deletions approved: {}\n",
            count("SELECT count(*) FROM resources WHERE existed = 1")?,
            count("SELECT count(*) FROM intents WHERE state = 'pending'")?,
            count("SELECT count(*) FROM intents WHERE state = 'done'")?,
            count("SELECT count(*) FROM intents WHERE state = 'failed'")?,
            count("SELECT count(*) FROM tombstones")?,
            count("SELECT count(*) FROM local_overrides")?,
            held,
            approved,
        ));
        Ok(out)
    }
}

fn sql_err(path: &Path, e: rusqlite::Error) -> StateError {
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
        return StateError::Damaged {
            path: path.display().to_string(),
            problem: format!("is not a readable SQLite database ({e})"),
        };
    }
    StateError::Sqlite {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// SQLite could not set up what a read needs (the WAL's shared memory) in
/// a place it may not write.
fn is_readonly_error(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
    )
}

/// `file:` URI of `path` opened immutable (read-only, no WAL, no locks).
/// Characters that end a URI's path are escaped.
fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for c in path.display().to_string().chars() {
        match c {
            '%' => uri.push_str("%25"),
            '?' => uri.push_str("%3f"),
            '#' => uri.push_str("%23"),
            c => uri.push(c),
        }
    }
    uri.push_str("?immutable=1");
    uri
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SpecHash;
    use serde_json::Value;
    use std::collections::BTreeMap;
    use std::time::Duration;

    #[test]
    fn a_newer_min_reader_format_is_refused_and_the_file_left_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = StateStore::open(dir.path(), true).unwrap().unwrap();
            store.set_meta("min_reader_format", "99").unwrap();
            let conn = store.conn();
            conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
        }
        let path = dir.path().join("state.db");
        let before = std::fs::read(&path).unwrap();
        for writer in [true, false] {
            let err = StateStore::open(dir.path(), writer).unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains("min_reader_format is 99")
                    && message.contains(&format!("reads up to {READABLE_FORMAT}")),
                "{message}"
            );
            assert!(message.contains("docs/runbooks/rollback.md"), "{message}");
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the state file must not change"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no WAL or journal files appear: {names:?}");
    }

    #[test]
    fn a_superseded_or_pending_write_is_an_unconfirmed_write_and_a_refused_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        let (h, now) = (SpecHash("h".into()), SystemTime::now());
        for (op, name) in [("op1", "a"), ("op2", "b"), ("op3", "c")] {
            store
                .begin_intent(op, name, "create", &h, 0, &Value::Null, now)
                .unwrap();
        }
        let superseded = Some("superseded: the declaration changed");
        store
            .finish_intent("op2", IntentState::Failed, superseded, now)
            .unwrap();
        let refused = Some("the server refused it");
        store
            .finish_intent("op3", IntentState::Failed, refused, now)
            .unwrap();
        let memories = store.read_memories().unwrap().memories;
        let flag = |n: &str| memories.get(n).is_some_and(|m| m.unconfirmed_write);
        assert!(flag("a"), "pending");
        assert!(flag("b"), "superseded");
        assert!(!flag("c"), "refused: nothing was written");
    }

    #[test]
    fn generations_count_finished_operations() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        let h = SpecHash("h".into());
        let now = SystemTime::now();
        assert_eq!(store.next_generation("a", "update", &h).unwrap(), 0);
        assert_eq!(
            store
                .begin_intent("op1", "a", "update", &h, 0, &Value::Null, now)
                .unwrap(),
            0
        );
        store.note_attempt("op1").unwrap();
        assert_eq!(
            store
                .begin_intent("op1", "a", "update", &h, 0, &Value::Null, now)
                .unwrap(),
            1
        );
        assert_eq!(
            store.next_generation("a", "update", &h).unwrap(),
            0,
            "a pending intent is retried, not replaced"
        );
        store
            .finish_intent("op1", IntentState::Done, None, now)
            .unwrap();
        assert_eq!(store.next_generation("a", "update", &h).unwrap(), 1);
        assert!(store.pending_intents().unwrap().is_empty());
    }

    #[test]
    fn applied_fields_are_read_by_name_and_a_corrupt_value_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        let fields = BTreeMap::from([("owner".to_string(), Value::from("app"))]);
        let hash = SpecHash("old".into());
        for name in ["good", "bad"] {
            let applied = Applied {
                provider: "p",
                database_name: name,
                file: "f.yaml",
                manifest: &Value::Null,
                spec_hash: &hash,
                fields: &fields,
                commit: None,
                external_id: "id",
            };
            store
                .write(|tx| tx.record_applied(name, &applied, SystemTime::now()))
                .unwrap();
        }
        store
            .conn()
            .execute(
                "UPDATE resources SET applied_fields = '{not json' WHERE name = 'bad'",
                [],
            )
            .unwrap();
        let read = store
            .applied_fields(&["good".into(), "bad".into(), "absent".into()])
            .unwrap();
        assert_eq!(read.len(), 2, "an absent resource has no row");
        assert_eq!(read[0].1, Some(hash.clone()));
        assert_eq!(read[0].2.as_ref().unwrap(), &fields);
        let corrupt = read[1].2.as_ref().unwrap_err();
        assert_eq!(corrupt.name, "bad");
        assert!(corrupt.problem.contains("not a JSON object"), "{corrupt}");
        assert!(
            store
                .read_memories()
                .unwrap()
                .memories
                .values()
                .all(|m| m.existed)
        );
    }

    #[test]
    fn unknown_intent_states_are_open_and_corrupt_not_pending() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        let h = SpecHash("h".into());
        let now = SystemTime::now();
        for op in ["p", "d", "x", "j"] {
            store
                .begin_intent(op, op, "update", &h, 0, &Value::Null, now)
                .unwrap();
        }
        store
            .finish_intent("d", IntentState::Done, None, now)
            .unwrap();
        let conn = store.conn();
        conn.execute("UPDATE intents SET state = 'frozen' WHERE op_id = 'x'", [])
            .unwrap();
        conn.execute("UPDATE intents SET request = '{' WHERE op_id = 'j'", [])
            .unwrap();
        drop(conn);
        let open = store.open_intents().unwrap();
        let names: Vec<String> = open
            .iter()
            .map(|r| match r {
                Ok(i) => format!("ok:{}", i.name),
                Err(c) => format!("corrupt:{}", c.name),
            })
            .collect();
        assert_eq!(
            names,
            ["corrupt:j", "ok:p", "corrupt:x"],
            "oldest first, then by id"
        );
        assert_eq!(store.pending_intents().unwrap().len(), 1);
        let problems = store.check().unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("unknown state `frozen`")),
            "{problems:?}"
        );
    }

    #[test]
    fn an_open_at_the_current_format_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        drop(StateStore::open(dir.path(), true).unwrap().unwrap());
        let reader = StateStore::open(dir.path(), false).unwrap().unwrap();
        let before = reader
            .conn()
            .query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
            .unwrap();
        drop(StateStore::open(dir.path(), true).unwrap().unwrap());
        let after = reader
            .conn()
            .query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
            .unwrap();
        assert_eq!(before, after, "a second writer open changed the file");
    }

    #[test]
    fn pruning_keeps_pending_and_recent_intents_and_never_reuses_a_generation() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        let h = SpecHash("h".into());
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        for (i, op) in ["a0", "a1", "a2", "a3", "a4"].iter().enumerate() {
            let at = old + Duration::from_secs(i as u64);
            store
                .begin_intent(op, "a", "update", &h, i as u32, &Value::Null, at)
                .unwrap();
            store
                .finish_intent(op, IntentState::Done, None, at)
                .unwrap();
        }
        store
            .begin_intent("a5", "a", "update", &h, 5, &Value::Null, old)
            .unwrap();
        assert_eq!(store.next_generation("a", "update", &h).unwrap(), 5);
        let pruned = store
            .prune_journal(old + Duration::from_secs(3600), 2)
            .unwrap();
        assert_eq!(
            pruned, 3,
            "the three oldest finished go; the newest two stay"
        );
        let mut left: Vec<String> = store
            .all_intents()
            .unwrap()
            .into_iter()
            .map(|i| i.op_id)
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["a3", "a4", "a5"].map(String::from),
            "pending a5 is never pruned"
        );
        assert_eq!(
            store.next_generation("a", "update", &h).unwrap(),
            5,
            "the next operation does not reuse a pruned one's id"
        );
        assert_eq!(
            store
                .prune_journal(old + Duration::from_secs(3600), 2)
                .unwrap(),
            0
        );
    }

    #[test]
    fn freshness_moves_with_every_write_this_store_or_another_connection_makes() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        let read = store.read_memories().unwrap().freshness.unwrap();
        assert_eq!(
            store.freshness().unwrap(),
            read,
            "nothing written: still fresh"
        );
        store
            .write(|tx| tx.record_write("a", SystemTime::now()))
            .unwrap();
        let after_own = store.freshness().unwrap();
        assert_ne!(after_own, read, "this store wrote");
        // `tend override set` from another process: another connection.
        let other = StateStore::open_for_overrides(dir.path()).unwrap();
        other
            .set_local_override("a", &BTreeMap::new(), SystemTime::now())
            .unwrap();
        assert_ne!(
            store.freshness().unwrap(),
            after_own,
            "another connection wrote"
        );
    }

    #[test]
    fn the_agent_id_is_generated_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        let id = store.agent_id(None).unwrap();
        assert!(id.starts_with("tend-"));
        assert_eq!(store.agent_id(None).unwrap(), id);
        assert_eq!(store.agent_id(Some("configured")).unwrap(), "configured");
    }
}
