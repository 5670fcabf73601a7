//! The state store: opening, formats and migrations, and `meta`, over
//! either backend (the integrity check and summary are in [`inspect`]): SQLite in the state dir (the
//! default) or a PostgreSQL schema shared by a group of agents
//! ([`postgres`], [`lease`]). Reads are in [`read`], writes in [`write`];
//! both are written once against [`sql`].

mod agent_id;
mod backend;
mod backup;
mod copy;
mod finished;
mod group_commit;
mod inspect;
pub(crate) mod lease;
mod migrations;
pub(crate) mod postgres;
mod read;
mod releases;
mod row_changes;
pub(crate) mod sql;
mod status;
mod suspension;
mod write;

pub(crate) use finished::FinishedMark;
pub(crate) use lease::HeldLease;
pub use lease::{Fence, LeaseHolder};
pub use postgres::PgStateSettings;
pub(crate) use read::{
    Approval, CorruptRow, LocalOverride, MemoriesSince, OverrideSeen, StoredMemories, TombstoneRow,
};
pub use read::{Intent, IntentState};
pub use releases::Release;
pub(crate) use status::{
    COMMIT_STATUS_EVENT, DecidedAt, DecidedFrom, LastOperation, PendingNotification,
    QueuedNotification, RESOLVED_PREFIX, as_kept,
};
pub use write::Applied;
pub(crate) use write::Tx;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::{FORMAT, READABLE_FORMAT, StateError};
use backend::Backend;
use postgres::PgSession;
use sql::{Row, SqlError, SqlValue, args};

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

/// Which backend a store is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Sqlite,
    Postgres,
}

/// The state store. Statements are short; one connection behind a mutex,
/// on which writes that meet share a commit ([`group_commit`]).
#[derive(Debug)]
pub struct StateStore {
    conn: group_commit::Connection,
    /// How errors and `tend state show` name this state (the file, or the
    /// URL without password and the schema).
    location: String,
    kind: BackendKind,
    /// Write transactions committed through this store (see
    /// [`StateStore::freshness`]).
    writes: std::sync::atomic::AtomicU64,
    /// The leader lease every write is checked against (PostgreSQL only).
    fence: Mutex<Option<Fence>>,
    /// Set when a write was refused by the fence: this agent lost its
    /// lease and must stop acting.
    fenced: std::sync::atomic::AtomicBool,
    /// Whether this connection notes the resources its writes change
    /// ([`row_changes`]).
    tracks_rows: std::sync::atomic::AtomicBool,
    /// The last read of the memories, which took the names noted before
    /// it: its freshness and its number (each read takes the next, so two
    /// reads at one freshness are told apart).
    last_memory_read: Mutex<Option<(Freshness, u64)>>,
    /// The last [`StateStore::finished_operations_mark`] and the freshness
    /// it was counted at: while that holds, no operation can have
    /// finished, and the count of every finished one is not made again.
    finished_mark: Mutex<Option<(Freshness, FinishedMark)>>,
}

/// Identifies a moment of the database's content: this store's writes
/// and the backend's own change counter (SQLite's `data_version`, which
/// moves when another connection commits; on PostgreSQL a counter every
/// write transaction raises). Anything read at one freshness is current
/// while it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    writes: u64,
    data_version: i64,
}

impl StateStore {
    /// The file, or the PostgreSQL URL (without password) and schema.
    pub fn location(&self) -> &str {
        &self.location
    }

    pub fn backend(&self) -> BackendKind {
        self.kind
    }

    fn wrap(backend: Backend, location: String) -> Self {
        let kind = match backend {
            Backend::Sqlite(_) => BackendKind::Sqlite,
            Backend::Postgres(_) => BackendKind::Postgres,
        };
        StateStore {
            conn: group_commit::Connection::new(backend),
            location,
            kind,
            writes: std::sync::atomic::AtomicU64::new(0),
            fence: Mutex::new(None),
            fenced: std::sync::atomic::AtomicBool::new(false),
            tracks_rows: std::sync::atomic::AtomicBool::new(false),
            last_memory_read: Mutex::new(None),
            finished_mark: Mutex::new(None),
        }
    }

    /// The database's content now, as a value to compare later.
    pub fn freshness(&self) -> Result<Freshness, StateError> {
        let sql = match self.kind {
            BackendKind::Sqlite => "PRAGMA data_version",
            BackendKind::Postgres => {
                "SELECT coalesce((SELECT value FROM meta WHERE key = 'changes'), '0')"
            }
        };
        let row = self.row(sql, &[])?;
        let data_version = match row.as_ref().map(|r| r.0.first()) {
            Some(Some(SqlValue::Int(n))) => *n,
            Some(Some(SqlValue::Text(t))) => t.parse().unwrap_or(0),
            _ => 0,
        };
        Ok(Freshness {
            writes: self.writes.load(std::sync::atomic::Ordering::SeqCst),
            data_version,
        })
    }

    fn wrote(&self) {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn err(&self, e: SqlError) -> StateError {
        match e {
            SqlError::Sqlite(e) => sql_err(Path::new(&self.location), e),
            other => StateError::Database {
                path: self.location.clone(),
                source: other,
            },
        }
    }

    /// Write transactions committed through this store, and the writes
    /// they held (writes that met shared a commit).
    pub fn commits(&self) -> (u64, u64) {
        (self.conn.commits(), self.conn.writes())
    }

    /// Threads waiting for the store's connection now: a test makes two
    /// writes meet with it.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn waiting_for_connection(&self) -> usize {
        self.conn.waiting()
    }

    /// The connection, with no write transaction open on it.
    fn conn(&self) -> group_commit::Taken<'_> {
        self.conn.take_settled(self)
    }

    /// Every row `sql` returns.
    fn rows(&self, sql: &str, args: &[SqlValue]) -> Result<Vec<Row>, StateError> {
        self.conn().query(sql, args).map_err(|e| self.err(e))
    }

    /// The first row `sql` returns, if any.
    fn row(&self, sql: &str, args: &[SqlValue]) -> Result<Option<Row>, StateError> {
        Ok(self.rows(sql, args)?.into_iter().next())
    }

    /// Runs `sql` on the store's connection outside tend's own writes: for
    /// tests that damage rows on purpose (both backends).
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn execute_unchecked(&self, sql: &str) -> Result<usize, StateError> {
        let changed = self.conn().execute(sql, &[]).map_err(|e| self.err(e));
        self.wrote();
        changed
    }

    /// Checks compatibility without writing a byte: `immutable=1` makes
    /// SQLite touch neither the file nor a WAL or journal.
    ///
    /// With a write-ahead log beside the file, the file alone may not be a
    /// database: a writer killed during a checkpoint leaves it half
    /// copied, and only the log makes it whole. Read immutable it would be
    /// "malformed" at every start, and no start would ever get far enough
    /// to finish the checkpoint; so then it is read through the log
    /// (read-only: the file is not written, the log is replayed in the
    /// shared memory).
    fn check_readable(path: &Path) -> Result<(), StateError> {
        let conn = if crate::process::sqlite::has_log(path) {
            crate::process::sqlite::open_reader(path)
        } else {
            crate::process::sqlite::open_immutable(path)
        }
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
        let read = |key: &str| -> Result<Option<String>, StateError> {
            conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
                .optional()
                .map_err(|e| sql_err(path, e))
        };
        refuse_too_new(
            &path.display().to_string(),
            read("min_reader_format")?,
            read("writer_version")?,
        )
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
        Self::open_checked(state_dir, writer, false)
    }

    /// [`StateStore::open`] for a writer that holds the state's lock: the
    /// lock's acquisition checked the directory's trust already (walking
    /// the Git cache's directories a second time cost a one-shot `tend
    /// apply` 6 ms). Writers without the lock (`tend override set` beside
    /// a one-shot apply, the operator commands) check it in `open`.
    pub(crate) fn open_locked(
        state_dir: &Path,
        _lock: &crate::journal::StateLock,
    ) -> Result<Option<Self>, StateError> {
        Self::open_checked(state_dir, true, true)
    }

    /// `trusted`: the state dir's trust was checked by the caller.
    fn open_checked(
        state_dir: &Path,
        writer: bool,
        trusted: bool,
    ) -> Result<Option<Self>, StateError> {
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
                    source: e,
                });
            }
        }
        if writer && !trusted {
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
        // Not a memory map: every page a map ever touched (a one-time read
        // of the whole journal) would stay resident.
        conn.pragma_update(None, "cache_size", -crate::process::sqlite::PAGE_CACHE_KIB)
            .map_err(|e| sql_err(&path, e))?;
        let store = Self::wrap(Backend::Sqlite(conn), path.display().to_string());
        if writer {
            store.migrate_sqlite()?;
            store.track_memory_rows()?;
        }
        Ok(Some(store))
    }

    /// Opens the state the configuration names: the state dir's SQLite
    /// database, or the PostgreSQL schema of `[state] backend =
    /// "postgres"` (a reader on a schema that does not exist yet gets
    /// `None`, as on a state dir without a database).
    pub fn open_configured(
        config: &crate::config::Config,
        writer: bool,
    ) -> Result<Option<Self>, StateError> {
        match PgStateSettings::from_config(&config.state)? {
            None => Self::open(&config.state_dir, writer),
            Some(settings) => Self::open_postgres(&settings, writer),
        }
    }

    /// [`StateStore::open_configured`] for the writer holding `lock`
    /// (see [`StateStore::open_locked`]).
    pub(crate) fn open_configured_locked(
        config: &crate::config::Config,
        lock: &crate::journal::StateLock,
    ) -> Result<Option<Self>, StateError> {
        match PgStateSettings::from_config(&config.state)? {
            None => Self::open_locked(&config.state_dir, lock),
            Some(settings) => Self::open_postgres(&settings, true),
        }
    }

    /// Opens the state in a PostgreSQL schema. The format guard reads
    /// before anything is written (a newer `min_reader_format` is refused
    /// with nothing changed); a writer then creates the schema and tables
    /// if missing.
    pub fn open_postgres(
        settings: &PgStateSettings,
        writer: bool,
    ) -> Result<Option<Self>, StateError> {
        let location = settings.location();
        let session = PgSession::start(settings).map_err(|source| StateError::Database {
            path: location.clone(),
            source,
        })?;
        let store = Self::wrap(Backend::Postgres(session), location);
        let has_meta = store.postgres_has_meta(&settings.schema)?;
        if has_meta {
            refuse_too_new(
                &store.location,
                store.meta("min_reader_format")?,
                store.meta("writer_version")?,
            )?;
        } else if !writer {
            return Ok(None);
        }
        if writer {
            store.migrate_postgres(&settings.schema)?;
        }
        Ok(Some(store))
    }

    /// A read-only connection that leaves the state dir as it found it
    /// ([`crate::process::sqlite::open_reader`]).
    fn open_reader(path: &Path) -> Result<Connection, StateError> {
        crate::process::sqlite::open_reader(path).map_err(|e| sql_err(path, e))
    }

    /// Builds a new, migrated database and moves it to `path` unless
    /// another writer (an `override set` beside a first `apply`) got there
    /// first.
    fn create(state_dir: &Path, path: &Path) -> Result<(), StateError> {
        let io = |p: &Path, source: std::io::Error| StateError::Io {
            path: p.display().to_string(),
            source,
        };
        let fresh = state_dir.join(format!("state.db.new-{}", std::process::id()));
        let _ = std::fs::remove_file(&fresh);
        {
            let conn = Connection::open_with_flags(
                &fresh,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            )
            .map_err(|e| sql_err(&fresh, e))?;
            Self::wrap(Backend::Sqlite(conn), fresh.display().to_string()).migrate_sqlite()?;
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
    fn migrate_sqlite(&self) -> Result<(), StateError> {
        let path = PathBuf::from(&self.location);
        let mut guard = self.conn();
        let Backend::Sqlite(conn) = &mut *guard else {
            return Ok(());
        };
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| sql_err(&path, e))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| sql_err(&path, e))?;
        let version = env!("CARGO_PKG_VERSION");
        let (format, min_reader, writer) = Self::format_meta(conn);
        if format >= FORMAT && min_reader >= READABLE_FORMAT && writer.as_deref() == Some(version) {
            return Ok(());
        }
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| sql_err(&path, e))?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
        )
        .map_err(|e| sql_err(&path, e))?;
        // Read again under the write lock: another writer may have migrated.
        let (current, min_reader, _) = Self::format_meta(&tx);
        for (i, step) in migrations::STEPS.iter().enumerate() {
            let format = i as i64 + 1;
            if format > current {
                step.apply(&tx).map_err(|e| sql_err(&path, e))?;
            }
        }
        for (key, value) in format_values(current, min_reader) {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(|e| sql_err(&path, e))?;
        }
        tx.commit().map_err(|e| sql_err(&path, e))
    }

    /// Creates the schema and its tables (at this binary's format) where
    /// missing, under an advisory lock so that two agents starting together
    /// do not race; writes nothing when already current.
    fn migrate_postgres(&self, schema: &str) -> Result<(), StateError> {
        let version = env!("CARGO_PKG_VERSION");
        let number = |v: Option<String>| v.and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        let current = || -> Result<(i64, i64, Option<String>), StateError> {
            if !self.postgres_has_meta(schema)? {
                return Ok((0, 0, None));
            }
            Ok((
                number(self.meta("format")?),
                number(self.meta("min_reader_format")?),
                self.meta("writer_version")?,
            ))
        };
        let (format, min_reader, writer) = current()?;
        if format >= FORMAT && min_reader >= READABLE_FORMAT && writer.as_deref() == Some(version) {
            return Ok(());
        }
        self.write_unfenced(|tx| {
            // First the lock: `CREATE … IF NOT EXISTS` is not safe against
            // a concurrent create (two agents starting together).
            tx.query(
                "SELECT pg_advisory_xact_lock(hashtext(?1))::text",
                args![format!("tend-state-migrate:{schema}")],
            )?;
            tx.batch(&format!(
                "CREATE SCHEMA IF NOT EXISTS {}",
                postgres::quote_ident(schema)
            ))?;
            tx.batch(migrations::POSTGRES)?;
            // Read again under the lock: another agent may have migrated.
            let meta = |key: &str| -> Result<Option<String>, StateError> {
                Ok(tx
                    .query("SELECT value FROM meta WHERE key = ?1", args![key])?
                    .first()
                    .and_then(|r| r.get::<String>(0).ok()))
            };
            let (current, min_reader) = (number(meta("format")?), number(meta("min_reader_format")?));
            for (key, value) in format_values(current, min_reader) {
                tx.exec(
                    "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    args![key, value],
                )?;
            }
            Ok(())
        })
    }

    fn postgres_has_meta(&self, schema: &str) -> Result<bool, StateError> {
        let row = self.row(
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = ?1 AND tablename = 'meta'",
            args![schema],
        )?;
        Ok(row.map(|r| r.get::<i64>(0).unwrap_or(0)).unwrap_or(0) > 0)
    }

    /// A `meta` value.
    pub fn meta(&self, key: &str) -> Result<Option<String>, StateError> {
        self.row("SELECT value FROM meta WHERE key = ?1", args![key])?
            .map(|r| r.get(0))
            .transpose()
            .map_err(|e| self.err(e))
    }

    /// Every `meta` key and value, by key.
    pub fn meta_all(&self) -> Result<Vec<(String, String)>, StateError> {
        self.rows("SELECT key, value FROM meta ORDER BY key", &[])?
            .iter()
            .map(|r| Ok((r.get(0)?, r.get(1)?)))
            .collect::<Result<_, SqlError>>()
            .map_err(|e| self.err(e))
    }

    pub(crate) fn set_meta(&self, key: &str, value: &str) -> Result<(), StateError> {
        self.write(|tx| {
            tx.exec(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                args![key, value],
            )
        })
    }

    /// Opens the state database for a local override change: read-write but
    /// without the writer lock (an operator must be able to pause a resource
    /// while `tend run` or `tend apply` holds it). Creates the state if none.
    pub fn open_for_overrides(state_dir: &Path) -> Result<Self, StateError> {
        // (`override list` reads through `open(_, false)`.)
        Self::open(state_dir, true)?.ok_or_else(|| StateError::Refused {
            path: state_dir.display().to_string(),
            problem: "the state database could not be created".into(),
        })
    }

    /// [`StateStore::open_for_overrides`] on the configured backend.
    pub fn open_configured_for_overrides(
        config: &crate::config::Config,
    ) -> Result<Self, StateError> {
        Self::open_configured(config, true)?.ok_or_else(|| StateError::Refused {
            path: config.state_dir.display().to_string(),
            problem: "the state database could not be created".into(),
        })
    }
}

/// The `meta` values a migration leaves: a newer writer's higher format and
/// reader requirement stay (this binary only raises them).
fn format_values(current: i64, min_reader: i64) -> [(&'static str, String); 3] {
    [
        ("format", current.max(FORMAT).to_string()),
        (
            "min_reader_format",
            min_reader.max(READABLE_FORMAT).to_string(),
        ),
        ("writer_version", env!("CARGO_PKG_VERSION").to_string()),
    ]
}

/// [`StateError::TooNew`] when the state needs a newer reader.
fn refuse_too_new(
    location: &str,
    min_reader: Option<String>,
    writer: Option<String>,
) -> Result<(), StateError> {
    let found = min_reader.and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    if found > READABLE_FORMAT {
        return Err(StateError::TooNew {
            path: location.to_string(),
            found,
            supported: READABLE_FORMAT,
            writer: writer.unwrap_or_else(|| "(unknown version)".into()),
        });
    }
    Ok(())
}

fn sql_err(path: &Path, e: rusqlite::Error) -> StateError {
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
        return StateError::Damaged {
            path: path.display().to_string(),
            problem: format!("is not a readable SQLite database ({e})"),
        };
    }
    // Truncated or overwritten pages: "malformed" alone says nothing of
    // what to do.
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseCorrupt) {
        return StateError::Damaged {
            path: path.display().to_string(),
            problem: format!("is damaged: {e} (truncated or overwritten)"),
        };
    }
    StateError::Database {
        path: path.display().to_string(),
        source: SqlError::Sqlite(e),
    }
}

#[cfg(test)]
mod tests {
    //! SQLite-only: the file itself. The behaviour both backends share is
    //! tested on both by tests/library/state_store.rs.
    use super::*;

    #[test]
    fn a_newer_min_reader_format_is_refused_and_the_file_left_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = StateStore::open(dir.path(), true).unwrap().unwrap();
            store.set_meta("min_reader_format", "99").unwrap();
            store.conn().batch("PRAGMA journal_mode = DELETE").unwrap();
        }
        let path = dir.path().join("state.db");
        let before = std::fs::read(&path).unwrap();
        for writer in [true, false] {
            let err = StateStore::open(dir.path(), writer).unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains("min_reader_format is 99")
                    && message.contains(&format!(
                        "this tend (state format {FORMAT}) reads states whose min_reader_format is at most {READABLE_FORMAT}"
                    )),
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

    /// A writer killed while checkpointing leaves the file half copied and
    /// the log whole: every start must read through the log (and finish
    /// the checkpoint), never refuse the file as malformed forever.
    #[test]
    fn a_state_left_mid_checkpoint_is_read_through_its_log() {
        let dir = tempfile::tempdir().unwrap();
        drop(StateStore::open(dir.path(), true).unwrap().unwrap());
        let path = dir.path().join("state.db");
        let writer = Connection::open(&path).unwrap();
        writer.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        writer
            .execute_batch(
                "CREATE TABLE filler (x BLOB);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
                 INSERT INTO filler SELECT zeroblob(1000) FROM n;
                 UPDATE meta SET value = 'still here' WHERE key = 'writer_version';",
            )
            .unwrap();
        // Killed now: no checkpoint, the log stays.
        std::mem::forget(writer);
        assert!(dir.path().join("state.db-wal").exists());
        // Half a checkpoint: page 1 (the schema, newer in the log) torn
        // in the file, its header kept.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[100..4096].fill(0xA5);
        std::fs::write(&path, &bytes).unwrap();
        let immutable = Connection::open_with_flags(
            crate::process::sqlite::immutable_uri(&path),
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
        )
        .unwrap();
        assert!(
            immutable
                .query_row("SELECT count(*) FROM meta", [], |r| r.get::<_, i64>(0))
                .is_err(),
            "the file alone is not a database"
        );
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        assert_eq!(
            store.meta("writer_version").unwrap().as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(store.count("SELECT count(*) FROM filler").unwrap(), 200);
    }

    #[test]
    fn an_open_at_the_current_format_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        drop(StateStore::open(dir.path(), true).unwrap().unwrap());
        let reader = StateStore::open(dir.path(), false).unwrap().unwrap();
        let before = reader.freshness().unwrap().data_version;
        drop(StateStore::open(dir.path(), true).unwrap().unwrap());
        let after = reader.freshness().unwrap().data_version;
        assert_eq!(before, after, "a second writer open changed the file");
    }
}
