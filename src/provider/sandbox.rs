//! The sandbox provider: the embedded default a new user runs first, and
//! the provider deterministic tests use.
//!
//! Databases live in a SQLite file in the state dir (so they survive
//! restarts and `tend sandbox edit` can change them as an operator would at
//! a dashboard, even while `tend apply` runs). It honours idempotency keys like a real API: the same key
//! with the same request returns the original result; the same key with a
//! different request is refused. Faults from `[providers.NAME.faults]` are
//! injected at the exact points a real API fails.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    Capabilities, ChangeRequest, OWNER_AGENT_LABEL, Observation, OperationId, Provider,
    ProviderError, ResourceStatus,
};
use crate::clock::{Clock, SystemClock};
use crate::config::FaultConfig;
use crate::model::hash::sha256_hex;

/// Fields the sandbox observes: every provider field of both scopes.
pub const SANDBOX_FIELDS: &[&str] = &[
    "databaseName",
    "owner",
    "encoding",
    "locale",
    "connectionLimit",
    "allowConnections",
    "extensions",
    "parameters",
    "comment",
    "engine",
    "version",
    "size",
    "storageGb",
    "highAvailability",
    "backupRetentionDays",
    "region",
];

/// One database in the sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxDatabase {
    pub id: String,
    /// Field values by path (`parameters.work_mem` for settings).
    pub fields: BTreeMap<String, Value>,
    pub labels: BTreeMap<String, String>,
    /// Seconds since the epoch.
    pub created_at: u64,
    pub ready_at: u64,
    /// Milliseconds since the epoch of the last write through the API.
    #[serde(default)]
    pub written_at_ms: u64,
    /// The state before that write, served by stale reads (`None` after a
    /// create: the database is not visible yet).
    #[serde(default)]
    pub previous: Option<Box<SandboxDatabase>>,
}

/// A mutating call the sandbox has seen, by idempotency key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedOperation {
    request_digest: String,
    pub database_name: String,
    /// `create`, `update` or `delete`.
    #[serde(default)]
    pub kind: String,
    /// How often the key was used.
    pub uses: u32,
}

/// The sandbox file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxState {
    pub databases: BTreeMap<String, SandboxDatabase>,
    #[serde(default)]
    operations: BTreeMap<String, RecordedOperation>,
    #[serde(default)]
    next_id: u64,
}

impl SandboxState {
    /// How often an idempotency key was used (for tests of retries).
    pub fn key_uses(&self, op: &str) -> u32 {
        self.operations.get(op).map_or(0, |o| o.uses)
    }

    /// Every idempotency key seen, with its operation.
    pub fn operations(&self) -> &BTreeMap<String, RecordedOperation> {
        &self.operations
    }
}

/// Sandbox errors outside the provider contract (its storage).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox state {path}: {message}")]
    Storage { path: PathBuf, message: String },
    #[error("sandbox state {path} is corrupt: {message}; move it away to start an empty sandbox")]
    Corrupt { path: PathBuf, message: String },
}

/// The sandbox file's two tables: a JSON body per key.
#[derive(Debug, Clone, Copy)]
enum Table {
    Databases,
    Operations,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Databases => "databases",
            Table::Operations => "operations",
        }
    }

    fn key_column(self) -> &'static str {
        match self {
            Table::Databases => "name",
            Table::Operations => "key",
        }
    }

    /// What a row is, for messages.
    fn describe(self, key: &str) -> String {
        match self {
            Table::Databases => format!("database `{key}`"),
            Table::Operations => format!("idempotency key {key}"),
        }
    }
}

/// A sandbox provider over its directory in the state dir: one SQLite
/// file (`sandbox.db`: a row per database and per idempotency key) and the
/// call log, so a call costs one small transaction and observing every
/// database one query, however many databases the sandbox holds.
#[derive(Debug)]
pub struct SandboxProvider {
    name: String,
    dir: PathBuf,
    provisioning_delay: Duration,
    faults: Mutex<FaultConfig>,
    /// The service's own clock (observation and write times).
    clock: Arc<dyn Clock>,
    /// Opened on first use (a provider that is never called creates no file).
    conn: Mutex<Option<Connection>>,
}

impl SandboxProvider {
    pub fn new(
        name: &str,
        state_dir: &Path,
        provisioning_delay: Duration,
        faults: FaultConfig,
    ) -> Self {
        SandboxProvider {
            name: name.to_string(),
            dir: state_dir.join("sandbox").join(name),
            provisioning_delay,
            faults: Mutex::new(faults),
            clock: Arc::new(SystemClock),
            conn: Mutex::new(None),
        }
    }

    /// The same sandbox reading `clock` (tests and the simulation drive it).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    fn now_ms(&self) -> u64 {
        self.clock
            .now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// The sandbox's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn db_path(&self) -> PathBuf {
        self.dir.join("sandbox.db")
    }

    fn storage_err(&self, e: impl std::fmt::Display) -> SandboxError {
        SandboxError::Storage {
            path: self.db_path(),
            message: e.to_string(),
        }
    }

    /// The connection, opened (and the schema created) on first use.
    /// No fsync (`synchronous = NORMAL` in WAL mode): the sandbox stands for
    /// a remote service, whose durability a killed tend cannot touch, and
    /// a committed row survives the death of the process that wrote it.
    fn conn(&self) -> Result<MutexGuard<'_, Option<Connection>>, SandboxError> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            fs::create_dir_all(&self.dir).map_err(|e| self.storage_err(e))?;
            let conn = Connection::open(self.db_path()).map_err(|e| self.storage_err(e))?;
            conn.busy_timeout(Duration::from_secs(10))
                .map_err(|e| self.storage_err(e))?;
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(|e| self.storage_err(e))?;
            conn.pragma_update(None, "synchronous", "NORMAL")
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

    /// Moves a sandbox written by tend 0.1 before the SQLite layout (a JSON
    /// file per database in `databases/`, per key in `operations/`) into
    /// the database, once; the old directories are renamed, not deleted.
    fn import_files(&self, conn: &Connection) -> Result<(), SandboxError> {
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
                Err(e) => return Err(self.storage_err(format!("{}: {e}", dir.display()))),
            };
            let mut rows = Vec::new();
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                let corrupt = |message: String| SandboxError::Corrupt {
                    path: path.clone(),
                    message,
                };
                let bytes = fs::read(&path).map_err(|e| corrupt(e.to_string()))?;
                let stem = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let row = if table == "databases" {
                    let file: DatabaseFile =
                        serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
                    (file.name, self.encode(&file.database)?)
                } else {
                    let op: RecordedOperation =
                        serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
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
    fn with_conn<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, SandboxError> {
        let guard = self.conn()?;
        let conn = guard.as_ref().ok_or_else(|| self.storage_err("not open"))?;
        f(conn).map_err(|e| self.storage_err(e))
    }

    fn decode<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        body: &str,
    ) -> Result<T, SandboxError> {
        serde_json::from_str(body).map_err(|e| SandboxError::Corrupt {
            path: self.db_path(),
            message: format!("{what}: {e}"),
        })
    }

    fn encode(&self, value: &impl Serialize) -> Result<String, SandboxError> {
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
        body.map(|b| self.decode(&table.describe(key), &b))
            .transpose()
    }

    /// Writes one row (replacing it).
    fn put(&self, table: Table, key: &str, value: &impl Serialize) -> Result<(), SandboxError> {
        let body = self.encode(value)?;
        let sql = format!(
            "INSERT OR REPLACE INTO {} ({}, body) VALUES (?1, ?2)",
            table.name(),
            table.key_column()
        );
        self.with_conn(|c| c.execute(&sql, params![key, body]))
            .map(drop)
    }

    /// Every row, by key.
    fn all<T: serde::de::DeserializeOwned>(
        &self,
        table: Table,
    ) -> Result<Vec<(String, T)>, SandboxError> {
        let sql = format!(
            "SELECT {0}, body FROM {1} ORDER BY {0}",
            table.key_column(),
            table.name()
        );
        let rows: Vec<(String, String)> = self.with_conn(|c| {
            let mut stmt = c.prepare(&sql)?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })?;
        rows.into_iter()
            .map(|(key, body)| {
                let value = self.decode(&table.describe(&key), &body)?;
                Ok((key, value))
            })
            .collect()
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
    fn databases(&self) -> Result<Vec<(String, SandboxDatabase)>, SandboxError> {
        self.all(Table::Databases)
    }

    fn load_operation(&self, key: &str) -> Result<Option<RecordedOperation>, SandboxError> {
        self.get(Table::Operations, key)
    }

    fn store_operation(&self, key: &str, op: &RecordedOperation) -> Result<(), SandboxError> {
        self.put(Table::Operations, key, op)
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

    /// The observation of `db` at `now` (full precision: it is compared
    /// with the time a call was sent, on the same clock).
    fn observation(name: String, db: SandboxDatabase, now: SystemTime) -> Observation {
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Observation {
            database_name: name,
            external_id: db.id,
            status: if secs < db.ready_at {
                ResourceStatus::Provisioning
            } else {
                ResourceStatus::Ready
            },
            fields: db.fields,
            labels: db.labels,
            observed_at: now,
            unobserved: Vec::new(),
        }
    }

    /// What a read shows of `db`: with `stale_reads`, the state before a
    /// write younger than the lag, stamped with the time it reflects.
    fn read(&self, name: String, db: SandboxDatabase, lag: Duration) -> Option<Observation> {
        let now = self.clock.now();
        let now_ms = self.now_ms();
        let lag_ms = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX);
        if lag_ms > 0 && now_ms.saturating_sub(db.written_at_ms) < lag_ms {
            let old = db.previous?;
            let mut obs = Self::observation(name, *old, now);
            obs.observed_at =
                SystemTime::UNIX_EPOCH + Duration::from_millis(now_ms.saturating_sub(lag_ms));
            return Some(obs);
        }
        Some(Self::observation(name, db, now))
    }

    fn stale_lag(&self) -> Duration {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stale_reads
    }

    /// Remembers the state before an API write, for stale reads.
    fn before_write(&self, db: &mut SandboxDatabase) {
        let mut old = db.clone();
        old.previous = None;
        db.previous = Some(Box::new(old));
        db.written_at_ms = self.now_ms();
    }

    /// Answers a committed write, unless a lost response is injected: the
    /// change is committed either way, as at a real API.
    fn answer(&self, name: &str) -> Result<Observation, ProviderError> {
        self.lose_after(name)?;
        let db = self
            .load_database(name)
            .map_err(|e| self.to_provider_error(name, e))?
            .ok_or_else(|| ProviderError::NotFound {
                resource: name.to_string(),
            })?;
        Ok(Self::observation(name.to_string(), db, self.clock.now()))
    }

    fn to_provider_error(&self, resource: &str, e: SandboxError) -> ProviderError {
        ProviderError::Retryable {
            resource: resource.to_string(),
            message: format!("sandbox `{}`: {e}", self.name),
        }
    }

    /// Injected failures before a call reaches the "server".
    fn fail_before(&self, call: &str, resource: &str) -> Result<(), ProviderError> {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let outcome = if faults.rate_limit_calls > 0 {
            "429"
        } else if faults.fail_calls > 0 {
            "503"
        } else {
            "ok"
        };
        self.log_call(call, resource, outcome);
        if faults.rate_limit_calls > 0 {
            faults.rate_limit_calls -= 1;
            return Err(ProviderError::RateLimited {
                resource: resource.to_string(),
                retry_after: faults.retry_after,
            });
        }
        if faults.fail_calls > 0 {
            faults.fail_calls -= 1;
            return Err(ProviderError::Retryable {
                resource: resource.to_string(),
                message: "sandbox: 503 service unavailable (injected)".into(),
            });
        }
        Ok(())
    }

    /// Appends `millis call resource outcome` to `<name>.calls` beside the
    /// state file: what tests read to check timing and retries.
    fn log_call(&self, call: &str, resource: &str, outcome: &str) {
        use std::io::Write as _;
        let path = self.dir.join("calls.log");
        if let Some(dir) = path.parent() {
            let _ = fs::create_dir_all(dir);
        }
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{} {call} {resource} {outcome}", self.now_ms());
        }
    }

    /// The call log (`millis`, call, resource, outcome), oldest first.
    pub fn calls(&self) -> Vec<(u64, String, String, String)> {
        fs::read_to_string(self.dir.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut p = l.split(' ');
                Some((
                    p.next()?.parse().ok()?,
                    p.next()?.to_string(),
                    p.next()?.to_string(),
                    p.next()?.to_string(),
                ))
            })
            .collect()
    }

    /// Injected loss of a response after the change was committed.
    fn lose_after(&self, resource: &str) -> Result<(), ProviderError> {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        if faults.lose_responses > 0 {
            faults.lose_responses -= 1;
            return Err(ProviderError::Retryable {
                resource: resource.to_string(),
                message: "sandbox: connection reset after the change was committed (injected lost response)".into(),
            });
        }
        Ok(())
    }

    /// Looks an idempotency key up: `Ok(true)` when the same request was
    /// seen before (answer with the original result, change nothing);
    /// `Ok(false)` for a new key, which [`Self::record_key`] stores once the
    /// change is committed.
    fn seen_key(
        &self,
        op: &OperationId,
        digest: &str,
        database_name: &str,
    ) -> Result<bool, ProviderError> {
        let recorded = self
            .load_operation(&op.0)
            .map_err(|e| self.to_provider_error(database_name, e))?;
        match recorded {
            Some(mut recorded) if recorded.request_digest == digest => {
                recorded.uses += 1;
                self.store_operation(&op.0, &recorded)
                    .map_err(|e| self.to_provider_error(database_name, e))?;
                Ok(true)
            }
            Some(_) => Err(ProviderError::Permanent {
                resource: database_name.to_string(),
                message: format!("idempotency key {op} was already used for a different request"),
            }),
            None => Ok(false),
        }
    }

    fn record_key(
        &self,
        op: &OperationId,
        kind: &str,
        digest: &str,
        database_name: &str,
    ) -> Result<(), ProviderError> {
        let recorded = RecordedOperation {
            request_digest: digest.to_string(),
            database_name: database_name.to_string(),
            kind: kind.to_string(),
            uses: 1,
        };
        self.store_operation(&op.0, &recorded)
            .map_err(|e| self.to_provider_error(database_name, e))
    }

    fn digest(kind: &str, request: &impl Serialize) -> String {
        let json = serde_json::to_string(request).unwrap_or_default();
        sha256_hex(format!("{kind}:{json}").as_bytes())
    }

    fn apply_fields(db: &mut SandboxDatabase, request: &ChangeRequest) {
        for (field, value) in &request.fields {
            if value.is_null() {
                db.fields.remove(field);
            } else {
                db.fields.insert(field.clone(), value.clone());
            }
        }
        for (k, v) in &request.labels {
            if v.is_empty() {
                db.labels.remove(k);
            } else {
                db.labels.insert(k.clone(), v.clone());
            }
        }
    }
}

impl Provider for SandboxProvider {
    fn capabilities(&self) -> Capabilities {
        Capabilities::for_fields(SANDBOX_FIELDS, true)
    }

    async fn observe_all(
        &self,
        names: &[String],
        _deep: &[String],
    ) -> Result<Vec<Observation>, ProviderError> {
        self.fail_before("observe_all", "*")?;
        let databases = self
            .databases()
            .map_err(|e| self.to_provider_error("*", e))?;
        let names: std::collections::HashSet<&String> = names.iter().collect();
        let lag = self.stale_lag();
        Ok(databases
            .into_iter()
            .filter_map(|(name, db)| self.read(name, db, lag))
            .filter(|o| {
                names.contains(&o.database_name) || o.labels.contains_key(OWNER_AGENT_LABEL)
            })
            .collect())
    }

    async fn observe(&self, database_name: &str) -> Result<Option<Observation>, ProviderError> {
        self.fail_before("observe", database_name)?;
        let db = self
            .load_database(database_name)
            .map_err(|e| self.to_provider_error(database_name, e))?;
        Ok(db.and_then(|db| self.read(database_name.to_string(), db, self.stale_lag())))
    }

    async fn create(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let name = &request.database_name;
        self.fail_before("create", name)?;
        let digest = Self::digest("create", request);
        if !self.seen_key(op, &digest, name)? {
            let existing = self
                .load_database(name)
                .map_err(|e| self.to_provider_error(name, e))?;
            if existing.is_some() {
                return Err(ProviderError::Conflict {
                    resource: name.clone(),
                    message: "a database of that name already exists".into(),
                });
            }
            let now = self.now_ms() / 1000;
            let mut db = SandboxDatabase {
                id: format!(
                    "sbx-{}",
                    &sha256_hex(format!("{name}:{}", self.now_ms()).as_bytes())[..10]
                ),
                fields: BTreeMap::new(),
                labels: BTreeMap::new(),
                created_at: now,
                ready_at: now + self.provisioning_delay.as_secs(),
                written_at_ms: self.now_ms(),
                previous: None,
            };
            Self::apply_fields(&mut db, request);
            // The database first, then the key: a crash between the two
            // leaves a database a retry meets as "exists" (a conflict the
            // caller confirms by observation), never a key without its effect.
            self.store_database(name, &db)
                .map_err(|e| self.to_provider_error(name, e))?;
            self.record_key(op, "create", &digest, name)?;
        }
        self.answer(name)
    }

    async fn update(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let name = &request.database_name;
        self.fail_before("update", name)?;
        let Some(mut db) = self
            .load_database(name)
            .map_err(|e| self.to_provider_error(name, e))?
        else {
            return Err(ProviderError::NotFound {
                resource: name.clone(),
            });
        };
        let digest = Self::digest("update", request);
        if !self.seen_key(op, &digest, name)? {
            self.before_write(&mut db);
            Self::apply_fields(&mut db, request);
            self.store_database(name, &db)
                .map_err(|e| self.to_provider_error(name, e))?;
            self.record_key(op, "update", &digest, name)?;
        }
        self.answer(name)
    }

    async fn delete(&self, op: &OperationId, database_name: &str) -> Result<(), ProviderError> {
        self.fail_before("delete", database_name)?;
        let digest = Self::digest("delete", &database_name);
        if !self.seen_key(op, &digest, database_name)? {
            self.remove_database(database_name)
                .map_err(|e| self.to_provider_error(database_name, e))?;
            self.record_key(op, "delete", &digest, database_name)?;
        }
        self.lose_after(database_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SpecHash;
    use crate::provider::OperationKind;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn request(limit: i64) -> ChangeRequest {
        ChangeRequest {
            database_name: "orders".into(),
            fields: BTreeMap::from([("connectionLimit".to_string(), Value::from(limit))]),
            labels: BTreeMap::from([(OWNER_AGENT_LABEL.to_string(), "a".to_string())]),
        }
    }

    #[test]
    fn a_lost_create_response_retried_with_the_same_key_creates_one_database() {
        let dir = tempfile::tempdir().unwrap();
        let faults = FaultConfig {
            lose_responses: 1,
            ..FaultConfig::default()
        };
        let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, faults);
        let op = OperationId::derive("a", "orders", OperationKind::Create, &SpecHash("h".into()));
        rt().block_on(async {
            assert!(
                sandbox
                    .create(&op, &request(5))
                    .await
                    .unwrap_err()
                    .is_transient()
            );
            let obs = sandbox.create(&op, &request(5)).await.unwrap();
            assert_eq!(obs.fields["connectionLimit"], Value::from(5));
            let other = OperationId("other".into());
            assert!(matches!(
                sandbox.create(&other, &request(5)).await,
                Err(ProviderError::Conflict { .. })
            ));
            assert!(matches!(
                sandbox.create(&op, &request(6)).await,
                Err(ProviderError::Permanent { .. })
            ));
        });
        let state = sandbox.load().unwrap();
        assert_eq!(state.databases.len(), 1);
        assert_eq!(state.key_uses(&op.0), 2);
    }

    #[test]
    fn a_sandbox_in_the_old_file_layout_is_imported_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("sandbox").join("s");
        fs::create_dir_all(root.join("databases")).unwrap();
        fs::create_dir_all(root.join("operations")).unwrap();
        fs::write(
            root.join("databases").join("6f7264657273.json"),
            r#"{"name": "orders", "id": "sbx-1", "fields": {"connectionLimit": 5},
                "labels": {"tend.dev/owner-agent": "a"}, "created_at": 1, "ready_at": 1}"#,
        )
        .unwrap();
        fs::write(
            root.join("operations").join("abc123.json"),
            r#"{"request_digest": "d", "database_name": "orders", "kind": "create", "uses": 2}"#,
        )
        .unwrap();
        let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
        let state = sandbox.load().unwrap();
        assert_eq!(
            state.databases["orders"].fields["connectionLimit"],
            Value::from(5)
        );
        assert_eq!(state.key_uses("abc123"), 2);
        assert!(!root.join("databases").exists());
        assert!(root.join("databases.imported").exists(), "kept, renamed");
        // A second open does not import again (nor fail on the renamed dirs).
        let again = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
        assert_eq!(again.load().unwrap(), state);
    }

    #[test]
    fn stale_reads_show_the_state_before_a_recent_write() {
        let dir = tempfile::tempdir().unwrap();
        let faults = FaultConfig {
            stale_reads: Duration::from_secs(3600),
            ..FaultConfig::default()
        };
        let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, faults);
        let create = OperationId("c".into());
        let update = OperationId("u".into());
        rt().block_on(async {
            sandbox.create(&create, &request(5)).await.unwrap();
            assert_eq!(
                sandbox.observe("orders").await.unwrap(),
                None,
                "a new database is not visible yet"
            );
            sandbox.update(&update, &request(9)).await.unwrap();
            let stale = sandbox.observe("orders").await.unwrap().unwrap();
            assert_eq!(stale.fields["connectionLimit"], Value::from(5));
            assert!(stale.observed_at < SystemTime::now() - Duration::from_secs(3000));
        });
        let fresh = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
        let obs = rt().block_on(fresh.observe("orders")).unwrap().unwrap();
        assert_eq!(obs.fields["connectionLimit"], Value::from(9));
    }

    #[test]
    fn rate_limits_and_failures_are_injected_before_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let faults = FaultConfig {
            rate_limit_calls: 1,
            fail_calls: 1,
            retry_after: Duration::from_secs(2),
            ..FaultConfig::default()
        };
        let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, faults);
        rt().block_on(async {
            assert!(matches!(
                sandbox.observe("x").await,
                Err(ProviderError::RateLimited { retry_after, .. }) if retry_after == Duration::from_secs(2)
            ));
            assert!(matches!(sandbox.observe("x").await, Err(ProviderError::Retryable { .. })));
            assert_eq!(sandbox.observe("x").await.unwrap(), None);
        });
    }
}
