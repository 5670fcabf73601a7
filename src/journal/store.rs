//! The SQLite state store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde_json::Value;

use super::{FORMAT, READABLE_FORMAT, StateError};
use crate::engine::Memory;
use crate::model::SpecHash;
use crate::model::hash::sha256_hex;

/// Migrations, applied in order; index + 1 is the format they produce.
const MIGRATIONS: &[&str] = &[
    // 1: the first layout.
    r#"
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE resources (
    name TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    database_name TEXT NOT NULL,
    file TEXT NOT NULL,
    applied_spec_hash TEXT,
    applied_fields TEXT NOT NULL DEFAULT '{}',
    applied_commit TEXT,
    external_id TEXT,
    existed INTEGER NOT NULL DEFAULT 0,
    manifest TEXT NOT NULL DEFAULT '{}',
    last_write_ms INTEGER,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE drift_seen (
    name TEXT NOT NULL, field TEXT NOT NULL, first_seen_ms INTEGER NOT NULL,
    PRIMARY KEY (name, field)
);
CREATE TABLE attempts (
    name TEXT NOT NULL, field TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (name, field)
);
CREATE TABLE intents (
    op_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    generation INTEGER NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE INDEX intents_by_name ON intents (name, state);
CREATE TABLE tombstones (
    name TEXT PRIMARY KEY,
    manifest TEXT NOT NULL,
    removed_ms INTEGER NOT NULL,
    removal_commit TEXT NOT NULL,
    delete_requested_ms INTEGER,
    last_error TEXT
);
CREATE TABLE local_overrides (
    name TEXT PRIMARY KEY,
    annotations TEXT NOT NULL,
    set_ms INTEGER NOT NULL
);
CREATE TABLE override_seen (
    name TEXT NOT NULL, source TEXT NOT NULL, fingerprint TEXT NOT NULL, first_seen_ms INTEGER NOT NULL,
    PRIMARY KEY (name, source)
);
"#,
    // 2: finding the pending intents (every cycle) must not scan the whole
    // journal; format-1 readers ignore the index.
    r#"
CREATE INDEX IF NOT EXISTS intents_pending ON intents (state) WHERE state = 'pending';
"#,
];

/// How much of a state database is read through a memory map.
pub const MMAP_BYTES: i64 = 1 << 30;

fn ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn time(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// State of a journalled intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentState {
    /// Journalled; the call may or may not have reached the provider.
    Pending,
    /// Confirmed by an observation.
    Done,
    /// The provider refused it permanently.
    Failed,
}

impl IntentState {
    fn as_str(self) -> &'static str {
        match self {
            IntentState::Pending => "pending",
            IntentState::Done => "done",
            IntentState::Failed => "failed",
        }
    }
    fn parse(s: &str) -> Self {
        match s {
            "done" => IntentState::Done,
            "failed" => IntentState::Failed,
            _ => IntentState::Pending,
        }
    }
}

/// One journalled operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Intent {
    pub op_id: String,
    pub name: String,
    pub kind: String,
    pub spec_hash: String,
    pub generation: u32,
    /// The request as JSON, replayed with the same id after a crash.
    pub request: Value,
    pub state: IntentState,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub created: SystemTime,
}

/// A resource tend manages (created or adopted, not yet released).
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedResource {
    pub name: String,
    pub provider: String,
    pub database_name: String,
    pub file: String,
    /// The last declaration seen, as JSON (for tombstones).
    pub manifest: Value,
}

/// An override set on this host (`tend override set`), in annotation form.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalOverride {
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    pub set_at: SystemTime,
}

/// A removed declaration awaiting its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct TombstoneRow {
    pub name: String,
    pub manifest: Value,
    pub removed_at: SystemTime,
    pub removal_commit: String,
    pub delete_requested_at: Option<SystemTime>,
    pub last_error: Option<String>,
}

/// The state database. Statements are short; one connection behind a mutex.
#[derive(Debug)]
pub struct StateStore {
    conn: Mutex<Connection>,
    path: PathBuf,
}

impl StateStore {
    pub fn path(&self) -> &Path {
        &self.path
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
        let uri = format!("file:{}?immutable=1", path.display());
        let conn = Connection::open_with_flags(
            &uri,
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
            return Err(StateError::TooNew {
                path: path.display().to_string(),
                found,
                supported: READABLE_FORMAT,
            });
        }
        Ok(())
    }

    /// Opens (and for a writer creates and migrates) `state_dir/state.db`.
    /// A reader on a state dir without a database gets `None`.
    pub fn open(state_dir: &Path, writer: bool) -> Result<Option<Self>, StateError> {
        let path = state_dir.join("state.db");
        if path.exists() {
            Self::check_readable(&path)?;
        } else if !writer {
            return Ok(None);
        }
        std::fs::create_dir_all(state_dir).map_err(|e| StateError::Io {
            path: state_dir.display().to_string(),
            message: e.to_string(),
        })?;
        let flags = if writer {
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
        } else {
            OpenFlags::SQLITE_OPEN_READ_ONLY
        };
        let conn = Connection::open_with_flags(&path, flags).map_err(|e| sql_err(&path, e))?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(|e| sql_err(&path, e))?;
        // Reads through a memory map: a cycle reads every resource's row,
        // which through read(2) is thousands of page-sized system calls.
        conn.pragma_update(None, "mmap_size", MMAP_BYTES)
            .map_err(|e| sql_err(&path, e))?;
        let store = StateStore {
            conn: Mutex::new(conn),
            path,
        };
        if writer {
            store.migrate()?;
        }
        Ok(Some(store))
    }

    fn migrate(&self) -> Result<(), StateError> {
        let mut conn = self.conn();
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| sql_err(&self.path, e))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| sql_err(&self.path, e))?;
        let tx = conn.transaction().map_err(|e| sql_err(&self.path, e))?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
        )
        .map_err(|e| sql_err(&self.path, e))?;
        let current: i64 = tx
            .query_row("SELECT value FROM meta WHERE key = 'format'", [], |r| {
                r.get::<_, String>(0)
            })
            .optional()
            .map_err(|e| sql_err(&self.path, e))?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        for (i, sql) in MIGRATIONS.iter().enumerate() {
            let format = i as i64 + 1;
            if format > current {
                tx.execute_batch(sql).map_err(|e| sql_err(&self.path, e))?;
            }
        }
        // A newer writer's higher format stays: this binary only reads it.
        let format = current.max(FORMAT);
        for (key, value) in [
            ("format", format.to_string()),
            ("writer_version", env!("CARGO_PKG_VERSION").to_string()),
        ] {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(|e| sql_err(&self.path, e))?;
        }
        tx.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('min_reader_format', ?1)",
            params![READABLE_FORMAT.to_string()],
        )
        .map_err(|e| sql_err(&self.path, e))?;
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
        if let Some(id) = configured {
            self.set_meta("agent_id", id)?;
            return Ok(id.to_string());
        }
        if let Some(id) = self.meta("agent_id")? {
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

    /// What tend remembers of every resource, in three queries (a cycle over
    /// thousands of resources must not pay three queries each). Applied
    /// field values are parsed only for resources whose spec changed
    /// (`current`: each declaration's spec hash).
    pub fn memories(
        &self,
        current: &std::collections::HashMap<&str, &SpecHash>,
    ) -> Result<std::collections::HashMap<String, Memory>, StateError> {
        self.read_memories()?.resolve(current, self)
    }

    /// Every resource's memory, read before the declarations are known
    /// (beside the fetch); [`StoredMemories::resolve`] finishes it.
    pub fn read_memories(&self) -> Result<StoredMemories, StateError> {
        let conn = self.conn();
        let mut rows_read = Vec::new();
        let mut stmt = conn
            .prepare("SELECT name, applied_spec_hash, applied_commit, existed, last_write_ms, database_name, provider FROM resources")
            .map_err(|e| self.err(e))?;
        let mut rows = stmt.query([]).map_err(|e| self.err(e))?;
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let name: String = r.get(0).map_err(|e| self.err(e))?;
            let memory = Memory {
                applied_spec_hash: r
                    .get::<_, Option<String>>(1)
                    .map_err(|e| self.err(e))?
                    .map(SpecHash),
                applied_commit: r.get(2).map_err(|e| self.err(e))?,
                existed: r.get::<_, i64>(3).map_err(|e| self.err(e))? != 0,
                last_write_at: r
                    .get::<_, Option<i64>>(4)
                    .map_err(|e| self.err(e))?
                    .map(time),
                database_name: Some(r.get(5).map_err(|e| self.err(e))?),
                provider: Some(r.get(6).map_err(|e| self.err(e))?),
                ..Memory::default()
            };
            rows_read.push((name, memory));
        }
        drop(rows);
        let mut out: std::collections::HashMap<String, Memory> = rows_read.into_iter().collect();
        let mut stmt = conn
            .prepare("SELECT name, field, first_seen_ms FROM drift_seen")
            .map_err(|e| self.err(e))?;
        let mut rows = stmt.query([]).map_err(|e| self.err(e))?;
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let name: String = r.get(0).map_err(|e| self.err(e))?;
            let field: String = r.get(1).map_err(|e| self.err(e))?;
            out.entry(name)
                .or_default()
                .drift_first_seen
                .insert(field, time(r.get(2).map_err(|e| self.err(e))?));
        }
        drop(rows);
        let mut stmt = conn
            .prepare("SELECT name, field, count FROM attempts")
            .map_err(|e| self.err(e))?;
        let mut rows = stmt.query([]).map_err(|e| self.err(e))?;
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let name: String = r.get(0).map_err(|e| self.err(e))?;
            let field: String = r.get(1).map_err(|e| self.err(e))?;
            out.entry(name)
                .or_default()
                .failed_attempts
                .insert(field, r.get(2).map_err(|e| self.err(e))?);
        }
        Ok(StoredMemories { memories: out })
    }

    /// The last manifest seen of a managed resource, and its file.
    pub fn manifest_and_file(&self, name: &str) -> Result<Option<(Value, String)>, StateError> {
        self.conn()
            .query_row(
                "SELECT manifest, file FROM resources WHERE name = ?1",
                [name],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
            )
            .optional()
            .map(|row| row.and_then(|(m, f)| serde_json::from_str(&m).ok().map(|m| (m, f))))
            .map_err(|e| self.err(e))
    }

    /// Every resource tend manages.
    pub fn managed(&self) -> Result<Vec<ManagedResource>, StateError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT name, provider, database_name, file, manifest FROM resources WHERE existed = 1 ORDER BY name")
            .map_err(|e| self.err(e))?;
        stmt.query_map([], |r| {
            Ok(ManagedResource {
                name: r.get(0)?,
                provider: r.get(1)?,
                database_name: r.get(2)?,
                file: r.get(3)?,
                manifest: serde_json::from_str(&r.get::<_, String>(4)?).unwrap_or(Value::Null),
            })
        })
        .map_err(|e| self.err(e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| self.err(e))
    }

    /// Records a confirmed apply: the spec and fields now at the provider.
    #[allow(clippy::too_many_arguments)]
    pub fn record_applied(
        &self,
        name: &str,
        provider: &str,
        database_name: &str,
        file: &str,
        manifest: &Value,
        spec_hash: &SpecHash,
        fields: &BTreeMap<String, Value>,
        commit: Option<&str>,
        external_id: &str,
        now: SystemTime,
    ) -> Result<(), StateError> {
        let fields = serde_json::to_string(fields).unwrap_or_else(|_| "{}".into());
        let manifest = manifest.to_string();
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| sql_err(&self.path, e))?;
        tx.execute(
            "INSERT INTO resources (name, provider, database_name, file, applied_spec_hash, applied_fields, applied_commit, external_id, existed, manifest, updated_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, ?9, ?10)
             ON CONFLICT(name) DO UPDATE SET provider = excluded.provider, database_name = excluded.database_name, file = excluded.file,
               applied_spec_hash = excluded.applied_spec_hash, applied_fields = excluded.applied_fields, applied_commit = excluded.applied_commit,
               external_id = excluded.external_id, existed = 1, manifest = excluded.manifest, updated_ms = excluded.updated_ms",
            params![name, provider, database_name, file, spec_hash.0, fields, commit, external_id, manifest, ms(now)],
        )
        .map_err(|e| sql_err(&self.path, e))?;
        tx.execute("DELETE FROM drift_seen WHERE name = ?1", [name])
            .map_err(|e| sql_err(&self.path, e))?;
        tx.commit().map_err(|e| sql_err(&self.path, e))
    }

    /// Keeps the declaration's file and manifest current for a managed
    /// resource (tombstones need the last one seen).
    pub fn touch(&self, name: &str, file: &str, manifest: &Value) -> Result<(), StateError> {
        self.conn()
            .execute(
                "UPDATE resources SET file = ?2, manifest = ?3 WHERE name = ?1 AND (file != ?2 OR manifest != ?3)",
                params![name, file, manifest.to_string()],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Records when tend last wrote to `name` (for the stale-read rule).
    pub fn record_write(&self, name: &str, now: SystemTime) -> Result<(), StateError> {
        self.conn()
            .execute(
                "UPDATE resources SET last_write_ms = ?2 WHERE name = ?1",
                params![name, ms(now)],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Keeps first-seen times for exactly the `fields` now drifting out of
    /// band (`""` stands for "the resource went missing").
    pub fn sync_drift(
        &self,
        name: &str,
        fields: &[String],
        now: SystemTime,
    ) -> Result<(), StateError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| sql_err(&self.path, e))?;
        {
            let mut existing = tx
                .prepare_cached("SELECT field FROM drift_seen WHERE name = ?1")
                .map_err(|e| sql_err(&self.path, e))?;
            let known: Vec<String> = existing
                .query_map([name], |r| r.get(0))
                .map_err(|e| sql_err(&self.path, e))?
                .collect::<Result<_, _>>()
                .map_err(|e| sql_err(&self.path, e))?;
            for field in known.iter().filter(|f| !fields.contains(f)) {
                tx.execute(
                    "DELETE FROM drift_seen WHERE name = ?1 AND field = ?2",
                    params![name, field],
                )
                .map_err(|e| sql_err(&self.path, e))?;
            }
            for field in fields.iter().filter(|f| !known.contains(f)) {
                tx.execute(
                    "INSERT INTO drift_seen (name, field, first_seen_ms) VALUES (?1, ?2, ?3)",
                    params![name, field, ms(now)],
                )
                .map_err(|e| sql_err(&self.path, e))?;
            }
        }
        tx.commit().map_err(|e| sql_err(&self.path, e))
    }

    /// Counts a confirmed update that left `fields` still different; a
    /// field not listed converged and its count is cleared.
    pub fn record_attempts(
        &self,
        name: &str,
        still_different: &[String],
    ) -> Result<(), StateError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| sql_err(&self.path, e))?;
        if still_different.is_empty() {
            tx.execute("DELETE FROM attempts WHERE name = ?1", [name])
                .map_err(|e| sql_err(&self.path, e))?;
        }
        for field in still_different {
            tx.execute(
                "INSERT INTO attempts (name, field, count) VALUES (?1, ?2, 1) ON CONFLICT(name, field) DO UPDATE SET count = count + 1",
                params![name, field],
            )
            .map_err(|e| sql_err(&self.path, e))?;
        }
        tx.commit().map_err(|e| sql_err(&self.path, e))
    }

    /// How many operations of this kind on this spec were completed: the
    /// generation of the next one (a new correction of recurring drift must
    /// not reuse the id of the last one).
    pub fn next_generation(
        &self,
        name: &str,
        kind: &str,
        spec_hash: &SpecHash,
    ) -> Result<u32, StateError> {
        self.conn()
            .query_row(
                "SELECT count(*) FROM intents WHERE name = ?1 AND kind = ?2 AND spec_hash = ?3 AND state != 'pending'",
                params![name, kind, spec_hash.0],
                |r| r.get::<_, u32>(0),
            )
            .map_err(|e| self.err(e))
    }

    /// Journals an intent (a replay keeps the existing row) and commits it
    /// durably before the provider call. Returns the calls sent so far.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_intent(
        &self,
        op_id: &str,
        name: &str,
        kind: &str,
        spec_hash: &SpecHash,
        generation: u32,
        request: &Value,
        now: SystemTime,
    ) -> Result<u32, StateError> {
        let conn = self.conn();
        conn.execute(
            "INSERT INTO intents (op_id, name, kind, spec_hash, generation, request, state, attempts, created_ms, updated_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', 0, ?7, ?7)
             ON CONFLICT(op_id) DO UPDATE SET updated_ms = excluded.updated_ms",
            params![op_id, name, kind, spec_hash.0, generation, request.to_string(), ms(now)],
        )
        .map_err(|e| self.err(e))?;
        conn.query_row(
            "SELECT attempts FROM intents WHERE op_id = ?1",
            [op_id],
            |r| r.get(0),
        )
        .map_err(|e| self.err(e))
    }

    /// Counts one call sent under an intent's id (every retry counts).
    pub fn note_attempt(&self, op_id: &str) -> Result<(), StateError> {
        self.conn()
            .execute(
                "UPDATE intents SET attempts = attempts + 1 WHERE op_id = ?1",
                [op_id],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Marks an intent's outcome.
    pub fn finish_intent(
        &self,
        op_id: &str,
        state: IntentState,
        error: Option<&str>,
        now: SystemTime,
    ) -> Result<(), StateError> {
        self.conn()
            .execute(
                "UPDATE intents SET state = ?2, last_error = ?3, updated_ms = ?4 WHERE op_id = ?1",
                params![op_id, state.as_str(), error, ms(now)],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Records an error on a still-pending intent.
    pub fn intent_error(
        &self,
        op_id: &str,
        error: &str,
        now: SystemTime,
    ) -> Result<(), StateError> {
        self.conn()
            .execute(
                "UPDATE intents SET last_error = ?2, updated_ms = ?3 WHERE op_id = ?1",
                params![op_id, error, ms(now)],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn intents_where(&self, clause: &str, arg: &str) -> Result<Vec<Intent>, StateError> {
        let conn = self.conn();
        let sql = format!(
            "SELECT op_id, name, kind, spec_hash, generation, request, state, attempts, last_error, created_ms FROM intents WHERE {clause} ORDER BY created_ms, op_id"
        );
        let mut stmt = conn.prepare(&sql).map_err(|e| self.err(e))?;
        stmt.query_map([arg], |r| {
            Ok(Intent {
                op_id: r.get(0)?,
                name: r.get(1)?,
                kind: r.get(2)?,
                spec_hash: r.get(3)?,
                generation: r.get(4)?,
                request: serde_json::from_str(&r.get::<_, String>(5)?).unwrap_or(Value::Null),
                state: IntentState::parse(&r.get::<_, String>(6)?),
                attempts: r.get(7)?,
                last_error: r.get(8)?,
                created: time(r.get(9)?),
            })
        })
        .map_err(|e| self.err(e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| self.err(e))
    }

    /// Intents journalled but not confirmed.
    pub fn pending_intents(&self) -> Result<Vec<Intent>, StateError> {
        self.intents_where("state = ?1", "pending")
    }

    /// Every intent of one resource.
    pub fn intents_of(&self, name: &str) -> Result<Vec<Intent>, StateError> {
        self.intents_where("name = ?1", name)
    }

    /// Every intent.
    pub fn all_intents(&self) -> Result<Vec<Intent>, StateError> {
        self.intents_where("?1 = ?1", "")
    }

    pub fn add_tombstone(
        &self,
        name: &str,
        manifest: &Value,
        now: SystemTime,
        commit: &str,
    ) -> Result<(), StateError> {
        self.conn()
            .execute(
                "INSERT OR IGNORE INTO tombstones (name, manifest, removed_ms, removal_commit) VALUES (?1, ?2, ?3, ?4)",
                params![name, manifest.to_string(), ms(now), commit],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    pub fn tombstones(&self) -> Result<Vec<TombstoneRow>, StateError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT name, manifest, removed_ms, removal_commit, delete_requested_ms, last_error FROM tombstones ORDER BY name")
            .map_err(|e| self.err(e))?;
        stmt.query_map([], |r| {
            Ok(TombstoneRow {
                name: r.get(0)?,
                manifest: serde_json::from_str(&r.get::<_, String>(1)?).unwrap_or(Value::Null),
                removed_at: time(r.get(2)?),
                removal_commit: r.get(3)?,
                delete_requested_at: r.get::<_, Option<i64>>(4)?.map(time),
                last_error: r.get(5)?,
            })
        })
        .map_err(|e| self.err(e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| self.err(e))
    }

    /// A declaration came back: its tombstone goes.
    pub fn remove_tombstone(&self, name: &str) -> Result<(), StateError> {
        self.conn()
            .execute("DELETE FROM tombstones WHERE name = ?1", [name])
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    pub fn tombstone_progress(
        &self,
        name: &str,
        requested: SystemTime,
        error: Option<&str>,
    ) -> Result<(), StateError> {
        self.conn()
            .execute(
                "UPDATE tombstones SET delete_requested_ms = coalesce(delete_requested_ms, ?2), last_error = ?3 WHERE name = ?1",
                params![name, ms(requested), error],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// The outcome of a removal is confirmed: forget the resource.
    pub fn forget(&self, name: &str) -> Result<(), StateError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| sql_err(&self.path, e))?;
        for table in [
            "tombstones",
            "resources",
            "drift_seen",
            "attempts",
            "override_seen",
        ] {
            tx.execute(&format!("DELETE FROM {table} WHERE name = ?1"), [name])
                .map_err(|e| sql_err(&self.path, e))?;
        }
        tx.commit().map_err(|e| sql_err(&self.path, e))
    }

    /// When tend first saw an override of `name` from `source` with this
    /// content (a changed override starts a new duration).
    pub fn override_first_seen(
        &self,
        name: &str,
        source: &str,
        fingerprint: &str,
        now: SystemTime,
    ) -> Result<SystemTime, StateError> {
        let conn = self.conn();
        conn.execute(
            "INSERT INTO override_seen (name, source, fingerprint, first_seen_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(name, source) DO UPDATE SET fingerprint = excluded.fingerprint, first_seen_ms = excluded.first_seen_ms
             WHERE override_seen.fingerprint != excluded.fingerprint",
            params![name, source, fingerprint, ms(now)],
        )
        .map_err(|e| self.err(e))?;
        conn.query_row(
            "SELECT first_seen_ms FROM override_seen WHERE name = ?1 AND source = ?2",
            params![name, source],
            |r| r.get::<_, i64>(0),
        )
        .map(time)
        .map_err(|e| self.err(e))
    }

    /// Opens the state database for a local override change: read-write but
    /// without the writer lock (an operator must be able to pause a resource
    /// while `tend run` or `tend apply` holds it). Creates the state if none.
    pub fn open_for_overrides(state_dir: &Path) -> Result<Self, StateError> {
        Self::open(state_dir, true)?.ok_or_else(|| StateError::Io {
            path: state_dir.display().to_string(),
            message: "the state database could not be created".into(),
        })
    }

    /// Sets (replaces) the local override of `name`: annotation-style keys
    /// (`tend.dev/paused`, …) and their values.
    pub fn set_local_override(
        &self,
        name: &str,
        annotations: &BTreeMap<String, String>,
        now: SystemTime,
    ) -> Result<(), StateError> {
        self.conn()
            .execute(
                "INSERT INTO local_overrides (name, annotations, set_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(name) DO UPDATE SET annotations = excluded.annotations, set_ms = excluded.set_ms",
                params![name, serde_json::to_string(annotations).unwrap_or_else(|_| "{}".into()), ms(now)],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Removes the local override of `name`; whether there was one.
    pub fn clear_local_override(&self, name: &str) -> Result<bool, StateError> {
        self.conn()
            .execute("DELETE FROM local_overrides WHERE name = ?1", [name])
            .map(|n| n > 0)
            .map_err(|e| self.err(e))
    }

    /// Every local override.
    pub fn local_overrides(&self) -> Result<Vec<LocalOverride>, StateError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT name, annotations, set_ms FROM local_overrides ORDER BY name")
            .map_err(|e| self.err(e))?;
        stmt.query_map([], |r| {
            Ok(LocalOverride {
                name: r.get(0)?,
                annotations: serde_json::from_str(&r.get::<_, String>(1)?).unwrap_or_default(),
                set_at: time(r.get(2)?),
            })
        })
        .map_err(|e| self.err(e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| self.err(e))
    }

    /// When tend first saw this override, if it has (read-only).
    pub fn override_seen_at(
        &self,
        name: &str,
        source: &str,
        fingerprint: &str,
    ) -> Result<Option<SystemTime>, StateError> {
        self.conn()
            .query_row(
                "SELECT first_seen_ms FROM override_seen WHERE name = ?1 AND source = ?2 AND fingerprint = ?3",
                params![name, source, fingerprint],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map(|t| t.map(time))
            .map_err(|e| self.err(e))
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
        Ok(problems)
    }

    /// A readable summary for `tend state show`.
    pub fn summary(&self) -> Result<String, StateError> {
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
            "  resources managed: {}\n  intents: {} pending, {} done, {} failed\n  tombstones: {}\n  local overrides: {}\n",
            count("SELECT count(*) FROM resources WHERE existed = 1")?,
            count("SELECT count(*) FROM intents WHERE state = 'pending'")?,
            count("SELECT count(*) FROM intents WHERE state = 'done'")?,
            count("SELECT count(*) FROM intents WHERE state = 'failed'")?,
            count("SELECT count(*) FROM tombstones")?,
            count("SELECT count(*) FROM local_overrides")?,
        ));
        Ok(out)
    }
}

/// Every resource's memory as read from the store, without the applied
/// field values: reading them all would cost more than the rest of the
/// memory, and only a changed spec needs them.
#[derive(Debug, Default)]
pub struct StoredMemories {
    memories: std::collections::HashMap<String, Memory>,
}

impl StoredMemories {
    /// The memories, with applied field values read where the spec
    /// changed (`current`: each declaration's spec hash; a resource not
    /// declared counts as changed).
    pub fn resolve(
        mut self,
        current: &std::collections::HashMap<&str, &SpecHash>,
        store: &StateStore,
    ) -> Result<std::collections::HashMap<String, Memory>, StateError> {
        let changed: Vec<&String> = self
            .memories
            .iter()
            .filter(|(name, memory)| {
                memory.applied_spec_hash.is_some()
                    && current.get(name.as_str()).copied() != memory.applied_spec_hash.as_ref()
            })
            .map(|(name, _)| name)
            .collect();
        if changed.is_empty() {
            return Ok(self.memories);
        }
        let mut fields = Vec::with_capacity(changed.len());
        {
            let conn = store.conn();
            // The hash is read again with the values: a writer beside a
            // reader (`tend plan` during `tend apply`) may have applied a new
            // spec since the first read, and the two must describe one apply.
            let mut stmt = conn
                .prepare("SELECT applied_spec_hash, applied_fields FROM resources WHERE name = ?1")
                .map_err(|e| store.err(e))?;
            for name in changed {
                let row: Option<(Option<String>, String)> = stmt
                    .query_row([name], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
                    .map_err(|e| store.err(e))?;
                fields.push((name.clone(), row));
            }
        }
        for (name, row) in fields {
            if let (Some(memory), Some((hash, text))) = (self.memories.get_mut(&name), row) {
                memory.applied_spec_hash = hash.map(SpecHash);
                memory.applied_fields = serde_json::from_str(&text).unwrap_or_default();
            }
        }
        Ok(self.memories)
    }
}

fn sql_err(path: &Path, e: rusqlite::Error) -> StateError {
    StateError::Sqlite {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                message.contains("min_reader_format is 99") && message.contains("reads up to 1"),
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
    fn applied_fields_are_parsed_only_where_the_spec_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        let fields = BTreeMap::from([("owner".to_string(), Value::from("app"))]);
        for name in ["same", "changed", "gone"] {
            store
                .record_applied(
                    name,
                    "p",
                    name,
                    "f.yaml",
                    &Value::Null,
                    &SpecHash("old".into()),
                    &fields,
                    None,
                    "id",
                    SystemTime::now(),
                )
                .unwrap();
        }
        let old = SpecHash("old".into());
        let new = SpecHash("new".into());
        let current = std::collections::HashMap::from([("same", &old), ("changed", &new)]);
        let memories = store
            .read_memories()
            .unwrap()
            .resolve(&current, &store)
            .unwrap();
        assert!(
            memories["same"].applied_fields.is_empty(),
            "unchanged: not needed"
        );
        assert_eq!(memories["changed"].applied_fields, fields);
        assert_eq!(
            memories["gone"].applied_fields, fields,
            "no longer declared"
        );
        assert!(memories.values().all(|m| m.existed));
        assert_eq!(store.memories(&current).unwrap(), memories);
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
