//! The sandbox provider: the embedded default a new user runs first, and
//! the provider deterministic tests use.
//!
//! Databases live in a JSON file in the state dir (so they survive
//! restarts and `tend sandbox edit` can change them as an operator would at
//! a dashboard). It honours idempotency keys like a real API: the same key
//! with the same request returns the original result; the same key with a
//! different request is refused. Faults from `[providers.NAME.faults]` are
//! injected at the exact points a real API fails.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    Capabilities, ChangeRequest, OWNER_AGENT_LABEL, Observation, OperationId, Provider,
    ProviderError, ResourceStatus,
};
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

/// Sandbox errors outside the provider contract (file access).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot read sandbox state {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sandbox state {path} is corrupt: {message}; move it away to start an empty sandbox")]
    Corrupt { path: PathBuf, message: String },
    #[error("cannot write sandbox state {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A sandbox provider over its state file.
#[derive(Debug)]
pub struct SandboxProvider {
    name: String,
    file: PathBuf,
    provisioning_delay: Duration,
    faults: Mutex<FaultConfig>,
}

fn now_secs() -> u64 {
    now_ms() / 1000
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
            file: state_dir.join("sandbox").join(format!("{name}.json")),
            provisioning_delay,
            faults: Mutex::new(faults),
        }
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Reads the state file (an absent file is an empty sandbox).
    pub fn load(&self) -> Result<SandboxState, SandboxError> {
        match fs::read(&self.file) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| SandboxError::Corrupt {
                path: self.file.clone(),
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SandboxState::default()),
            Err(source) => Err(SandboxError::Read {
                path: self.file.clone(),
                source,
            }),
        }
    }

    /// Writes the state atomically (temp file, fsync, rename): a crash never
    /// leaves a half-written sandbox.
    pub fn save(&self, state: &SandboxState) -> Result<(), SandboxError> {
        let write_err = |source| SandboxError::Write {
            path: self.file.clone(),
            source,
        };
        if let Some(dir) = self.file.parent() {
            fs::create_dir_all(dir).map_err(write_err)?;
        }
        let tmp = self.file.with_extension("json.tmp");
        let bytes =
            serde_json::to_vec_pretty(state).map_err(|e| write_err(std::io::Error::other(e)))?;
        let mut f = fs::File::create(&tmp).map_err(write_err)?;
        f.write_all(&bytes).map_err(write_err)?;
        f.sync_all().map_err(write_err)?;
        fs::rename(&tmp, &self.file).map_err(write_err)
    }

    /// `now` in milliseconds: observations are compared with write times.
    fn observation(name: &str, db: &SandboxDatabase, now: u64) -> Observation {
        Observation {
            database_name: name.to_string(),
            external_id: db.id.clone(),
            status: if now / 1000 < db.ready_at {
                ResourceStatus::Provisioning
            } else {
                ResourceStatus::Ready
            },
            fields: db.fields.clone(),
            labels: db.labels.clone(),
            observed_at: SystemTime::UNIX_EPOCH + Duration::from_millis(now),
        }
    }

    /// What a read shows of `db`: with `stale_reads`, the state before a
    /// write younger than the lag, stamped with the time it reflects.
    fn read(&self, name: &str, db: &SandboxDatabase) -> Option<Observation> {
        let lag = self.stale_lag();
        let now = now_ms();
        let lag_ms = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX);
        if lag_ms > 0 && now.saturating_sub(db.written_at_ms) < lag_ms {
            let old = db.previous.as_deref()?;
            let mut obs = Self::observation(name, old, now);
            obs.observed_at =
                SystemTime::UNIX_EPOCH + Duration::from_millis(now.saturating_sub(lag_ms));
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
    fn before_write(db: &mut SandboxDatabase) {
        let mut old = db.clone();
        old.previous = None;
        db.previous = Some(Box::new(old));
        db.written_at_ms = now_ms();
    }

    /// Persists a write, then answers it, unless a lost response is
    /// injected: the change is committed either way, as at a real API.
    fn commit(&self, state: &SandboxState, name: &str) -> Result<Observation, ProviderError> {
        self.save(state)
            .map_err(|e| self.to_provider_error(name, e))?;
        self.lose_after(name)?;
        let db = state
            .databases
            .get(name)
            .ok_or_else(|| ProviderError::NotFound {
                resource: name.to_string(),
            })?;
        Ok(Self::observation(name, db, now_ms()))
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
        let path = self.file.with_extension("calls");
        if let Some(dir) = path.parent() {
            let _ = fs::create_dir_all(dir);
        }
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{} {call} {resource} {outcome}", now_ms());
        }
    }

    /// The call log (`millis`, call, resource, outcome), oldest first.
    pub fn calls(&self) -> Vec<(u64, String, String, String)> {
        fs::read_to_string(self.file.with_extension("calls"))
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

    /// Records an idempotency key; `Ok(true)` when the same request was seen
    /// before (return the original result, change nothing).
    fn check_key(
        state: &mut SandboxState,
        op: &OperationId,
        kind: &str,
        digest: &str,
        database_name: &str,
    ) -> Result<bool, ProviderError> {
        match state.operations.get_mut(&op.0) {
            Some(recorded) if recorded.request_digest == digest => {
                recorded.uses += 1;
                Ok(true)
            }
            Some(_) => Err(ProviderError::Permanent {
                resource: database_name.to_string(),
                message: format!("idempotency key {op} was already used for a different request"),
            }),
            None => {
                state.operations.insert(
                    op.0.clone(),
                    RecordedOperation {
                        request_digest: digest.to_string(),
                        database_name: database_name.to_string(),
                        kind: kind.to_string(),
                        uses: 1,
                    },
                );
                Ok(false)
            }
        }
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

    async fn observe_all(&self, names: &[String]) -> Result<Vec<Observation>, ProviderError> {
        self.fail_before("observe_all", "*")?;
        let state = self.load().map_err(|e| self.to_provider_error("*", e))?;
        Ok(state
            .databases
            .iter()
            .filter_map(|(name, db)| self.read(name, db))
            .filter(|o| {
                names.contains(&o.database_name) || o.labels.contains_key(OWNER_AGENT_LABEL)
            })
            .collect())
    }

    async fn observe(&self, database_name: &str) -> Result<Option<Observation>, ProviderError> {
        self.fail_before("observe", database_name)?;
        let state = self
            .load()
            .map_err(|e| self.to_provider_error(database_name, e))?;
        Ok(state
            .databases
            .get(database_name)
            .and_then(|db| self.read(database_name, db)))
    }

    async fn create(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let name = &request.database_name;
        self.fail_before("create", name)?;
        let mut state = self.load().map_err(|e| self.to_provider_error(name, e))?;
        let now = now_secs();
        if !Self::check_key(
            &mut state,
            op,
            "create",
            &Self::digest("create", request),
            name,
        )? {
            if state.databases.contains_key(name) {
                return Err(ProviderError::Conflict {
                    resource: name.clone(),
                    message: "a database of that name already exists".into(),
                });
            }
            state.next_id += 1;
            let mut db = SandboxDatabase {
                id: format!("sbx-{}", state.next_id),
                fields: BTreeMap::new(),
                labels: BTreeMap::new(),
                created_at: now,
                ready_at: now + self.provisioning_delay.as_secs(),
                written_at_ms: now_ms(),
                previous: None,
            };
            Self::apply_fields(&mut db, request);
            state.databases.insert(name.clone(), db);
        }
        self.commit(&state, name)
    }

    async fn update(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let name = &request.database_name;
        self.fail_before("update", name)?;
        let mut state = self.load().map_err(|e| self.to_provider_error(name, e))?;
        if !state.databases.contains_key(name) {
            return Err(ProviderError::NotFound {
                resource: name.clone(),
            });
        }
        if !Self::check_key(
            &mut state,
            op,
            "update",
            &Self::digest("update", request),
            name,
        )? && let Some(db) = state.databases.get_mut(name)
        {
            Self::before_write(db);
            Self::apply_fields(db, request);
        }
        self.commit(&state, name)
    }

    async fn delete(&self, op: &OperationId, database_name: &str) -> Result<(), ProviderError> {
        self.fail_before("delete", database_name)?;
        let mut state = self
            .load()
            .map_err(|e| self.to_provider_error(database_name, e))?;
        if !Self::check_key(
            &mut state,
            op,
            "delete",
            &Self::digest("delete", &database_name),
            database_name,
        )? {
            state.databases.remove(database_name);
        }
        self.save(&state)
            .map_err(|e| self.to_provider_error(database_name, e))?;
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
