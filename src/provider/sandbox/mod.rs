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
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod faults;
mod store;

use super::{
    Capabilities, ChangeRequest, Observation, OperationId, Provider, ProviderError, ResourceStatus,
};
use crate::cause::Cause;
use crate::clock::{Clock, SystemClock};
use crate::config::FaultConfig;
use crate::model::FlatMap;
use crate::model::hash::sha256_hex;

/// Up to how many names `observe_all` reads one by one.
const FEW_NAMES: usize = 64;

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
    pub fields: FlatMap<Value>,
    pub labels: FlatMap<String>,
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

/// Sandbox errors outside the provider contract (its storage), each with
/// the SQLite, I/O or JSON error that caused it.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox state {path}: {source}")]
    Storage {
        path: PathBuf,
        #[source]
        source: Cause,
    },
    #[error("sandbox state {path} is corrupt: {source}; move it away to start an empty sandbox")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: Cause,
    },
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
    /// Opened by a reader (`tend plan`, `explain`): the sandbox's files are
    /// read, never created or changed, whoever runs it.
    read_only: bool,
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
            read_only: false,
        }
    }

    /// The same sandbox, read and never written: a reader's view (a
    /// missing sandbox reads as an empty one, and nothing is created).
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
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

    fn storage_err(&self, e: impl std::error::Error + Send + Sync + 'static) -> SandboxError {
        SandboxError::Storage {
            path: self.db_path(),
            source: Cause::new(e),
        }
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

    fn apply_fields(&self, db: &mut SandboxDatabase, request: &ChangeRequest) {
        let clamp = self
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .max_connection_limit;
        for (field, value) in &request.fields {
            if let (Some(max), "connectionLimit", Some(asked)) =
                (clamp, field.as_str(), value.as_i64())
                && asked > max
            {
                db.fields.insert(field.clone(), Value::from(max));
            } else if value.is_null() {
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

impl SandboxProvider {
    /// Every database in the sandbox (`tend import`).
    pub fn observe_every_database(&self) -> Result<Vec<Observation>, ProviderError> {
        self.fail_before("observe_all", "*")?;
        let databases = self
            .databases()
            .map_err(|e| self.to_provider_error("*", e))?;
        let lag = self.stale_lag();
        Ok(databases
            .into_iter()
            .filter_map(|(name, db)| self.read(name, db, lag))
            .collect())
    }
}

impl Provider for SandboxProvider {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_lag: self.stale_lag(),
            ..Capabilities::for_fields(SANDBOX_FIELDS, true)
        }
    }

    async fn observe_all(
        &self,
        names: &[String],
        _deep: &[String],
    ) -> Result<Vec<Observation>, ProviderError> {
        self.fail_before("observe_all", "*")?;
        let lag = self.stale_lag();
        // A few names (a cycle over a commit's changes) are read one by
        // one; many, in one pass over the store.
        if names.len() <= FEW_NAMES {
            let mut found = Vec::with_capacity(names.len());
            for name in names {
                let db = self
                    .load_database(name)
                    .map_err(|e| self.to_provider_error(name, e))?;
                found.extend(db.and_then(|db| self.read(name.clone(), db, lag)));
            }
            return Ok(found);
        }
        let databases = self
            .databases()
            .map_err(|e| self.to_provider_error("*", e))?;
        let names: std::collections::HashSet<&String> = names.iter().collect();
        Ok(databases
            .into_iter()
            .filter(|(name, _)| names.contains(name))
            .filter_map(|(name, db)| self.read(name, db, lag))
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
            let stored_as = match existing {
                None => name.clone(),
                Some(_) if self.names_not_unique() => self.free_duplicate_name(name)?,
                Some(_) => {
                    return Err(ProviderError::Conflict {
                        resource: name.clone(),
                        message: "a database of that name already exists".into(),
                    });
                }
            };
            let now = self.now_ms() / 1000;
            let mut db = SandboxDatabase {
                id: format!(
                    "sbx-{}",
                    &sha256_hex(format!("{name}:{}", self.now_ms()).as_bytes())[..10]
                ),
                fields: FlatMap::new(),
                labels: FlatMap::new(),
                created_at: now,
                ready_at: now + self.provisioning_delay.as_secs(),
                written_at_ms: self.now_ms(),
                previous: None,
            };
            self.apply_fields(&mut db, request);
            // The database and its key together: a process killed
            // meanwhile leaves neither, and the replay creates it once.
            let recorded = Self::recorded("create", &digest, &stored_as);
            self.store_created(&stored_as, &db, &op.0, &recorded)
                .map_err(|e| self.to_provider_error(name, e))?;
            if stored_as != *name {
                return self.answer(&stored_as);
            }
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
            self.apply_fields(&mut db, request);
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
mod tests;
