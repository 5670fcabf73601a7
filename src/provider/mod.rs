//! Providers: where databases really live (docs/providers.md).
//!
//! A provider observes databases and performs create/update/delete calls
//! that carry an [`OperationId`] as idempotency key. Observations are plain
//! data so the decision core can stay pure.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::hash::sha256_hex;
use crate::model::{FIELDS, Mutability, SpecHash};

pub mod build;
pub mod http;
pub mod postgres;
pub mod sandbox;
pub mod setting_list;
pub mod tls;

/// Label keys of the ownership marker at the provider.
pub const OWNER_AGENT_LABEL: &str = "tend.dev/owner-agent";
pub const OWNER_DECLARATION_LABEL: &str = "tend.dev/owner-declaration";

/// Which agent and declaration own a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnershipMarker {
    pub agent_id: String,
    pub declaration: String,
}

impl OwnershipMarker {
    /// Reads the marker from provider labels.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Option<Self> {
        marker_labels(labels).map(|(agent_id, declaration)| OwnershipMarker {
            agent_id: agent_id.to_string(),
            declaration: declaration.to_string(),
        })
    }
}

/// The marker's agent id and declaration name in `labels`, borrowed.
fn marker_labels(labels: &BTreeMap<String, String>) -> Option<(&str, &str)> {
    Some((
        labels.get(OWNER_AGENT_LABEL)?,
        labels.get(OWNER_DECLARATION_LABEL)?,
    ))
}

/// Lifecycle of a database at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceStatus {
    /// Created but not ready yet.
    Provisioning,
    Ready,
    /// A delete was accepted and is in progress.
    Deleting,
}

impl ResourceStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceStatus::Provisioning => "provisioning",
            ResourceStatus::Ready => "ready",
            ResourceStatus::Deleting => "deleting",
        }
    }
}

/// What a provider showed about one database, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The database name at the provider.
    pub database_name: String,
    /// The provider's id for it.
    pub external_id: String,
    pub status: ResourceStatus,
    /// Observed values by field path (`connectionLimit`, `parameters.work_mem`).
    pub fields: BTreeMap<String, Value>,
    /// Provider-side labels (ownership marker and provider-side overrides).
    pub labels: BTreeMap<String, String>,
    /// When the provider's answer was produced (a stale cache answers with an
    /// old time).
    pub observed_at: SystemTime,
    /// Fields the provider could not observe this time (extensions of a
    /// database that refuses connections): never compared, never "drift".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unobserved: Vec<String>,
}

impl Observation {
    pub fn marker(&self) -> Option<OwnershipMarker> {
        OwnershipMarker::from_labels(&self.labels)
    }

    /// The marker's agent id and declaration name, borrowed (the decision
    /// core reads them for every resource in every cycle).
    pub fn marker_labels(&self) -> Option<(&str, &str)> {
        marker_labels(&self.labels)
    }

    /// Files each observed `parameters.<key>` under the declared spelling
    /// of the same name in another case (`declared`: field paths), for a
    /// provider whose setting names are case-insensitive
    /// ([`Capabilities::parameter_names_ignore_case`]): PostgreSQL stores
    /// `Work_Mem` as `work_mem` (and `datestyle` as `DateStyle`), and
    /// compared as written the setting would be drift at every cycle.
    pub fn align_parameter_names<'a>(&mut self, declared: impl IntoIterator<Item = &'a str>) {
        for path in declared {
            let Some(key) = path.strip_prefix("parameters.") else {
                continue;
            };
            if self.fields.contains_key(path) {
                continue;
            }
            let spelled = self
                .fields
                .keys()
                .find(|k| {
                    k.strip_prefix("parameters.")
                        .is_some_and(|o| o.eq_ignore_ascii_case(key))
                })
                .cloned();
            if let Some(spelled) = spelled
                && let Some(value) = self.fields.remove(&spelled)
            {
                self.fields.insert(path.to_string(), value);
                for unobserved in &mut self.unobserved {
                    if *unobserved == spelled {
                        *unobserved = path.to_string();
                    }
                }
            }
        }
    }
}

/// The result of observing one declared database.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    Found(Observation),
    NotFound,
    /// The provider could not be asked; never act on this.
    Failed(String),
}

/// What a provider can observe and change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Top-level spec fields the provider observes, with their mutability
    /// there (from the field table unless the provider knows better).
    pub fields: BTreeMap<&'static str, Mutability>,
    /// Whether the provider stores labels (and so provider-side overrides).
    pub labels: bool,
    /// Settings (`parameters.<name>`) the provider parses as lists: their
    /// values are compared in [`setting_list::canonical`] form.
    pub list_settings: &'static [setting_list::ListSetting],
    /// How long the provider's reads may lag its writes (a cache in front
    /// of it): within this long of tend's own write to a database, its
    /// absence from a listing is not evidence that it is gone.
    pub read_lag: std::time::Duration,
    /// Setting names are case-insensitive and the provider reports them in
    /// its own spelling (PostgreSQL): observations are read under the
    /// declaration's (see [`Observation::align_parameter_names`]).
    pub parameter_names_ignore_case: bool,
}

impl Capabilities {
    /// Capabilities for a set of top-level field names, mutability from the
    /// field table.
    pub fn for_fields(names: &[&str], labels: bool) -> Self {
        let fields = FIELDS
            .iter()
            .filter(|f| names.contains(&f.name))
            .map(|f| (f.name, f.mutability))
            .collect();
        Capabilities {
            fields,
            labels,
            list_settings: &[],
            read_lag: std::time::Duration::ZERO,
            parameter_names_ignore_case: false,
        }
    }

    /// `value` of the field `path` in the form the provider compares it:
    /// a list setting's text in canonical form, anything else as it is.
    pub fn comparable(&self, path: &str, value: Value) -> Value {
        path.strip_prefix("parameters.")
            .and_then(|key| self.canonical_setting(key, &value))
            .unwrap_or(value)
    }

    /// The mutability of a field path (`parameters.x` → `parameters`), if
    /// the provider observes it.
    pub fn mutability(&self, path: &str) -> Option<Mutability> {
        let top = path.split('.').next().unwrap_or(path);
        self.fields.get(top).copied()
    }

    /// The canonical form of the setting `key`'s `value` when the provider
    /// parses it as a list (`None` otherwise: compare it as it is).
    pub fn canonical_setting(&self, key: &str, value: &Value) -> Option<Value> {
        let setting = setting_list::find(self.list_settings, key)?;
        setting_list::canonical(setting, value.as_str()?).map(Value::String)
    }
}

/// Kind of a mutating call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OperationKind {
    Create,
    Update,
    Delete,
    Adopt,
    Release,
}

impl OperationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OperationKind::Create => "create",
            OperationKind::Update => "update",
            OperationKind::Delete => "delete",
            OperationKind::Adopt => "adopt",
            OperationKind::Release => "release",
        }
    }

    /// The kind [`OperationKind::as_str`] names.
    pub fn parse(text: &str) -> Option<Self> {
        [
            OperationKind::Create,
            OperationKind::Update,
            OperationKind::Delete,
            OperationKind::Adopt,
            OperationKind::Release,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

/// Identity of one mutating operation: sha256 of (agent id, declaration name,
/// kind, spec hash), hex. The same work always gets the same id, so a retry
/// after a lost response or a crash is recognised by the provider.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperationId(pub String);

impl OperationId {
    pub fn derive(agent_id: &str, name: &str, kind: OperationKind, spec_hash: &SpecHash) -> Self {
        Self::derive_nth(agent_id, name, kind, spec_hash, 0)
    }

    /// The id of the `generation`-th operation of this kind on this spec
    /// (0 for the first). The design derives the id from the four parts
    /// alone; but correcting the same out-of-band drift twice under one spec
    /// is two different operations, and a provider would answer the second
    /// with the first's result. The journal counts finished operations, so
    /// a retry (pending intent) keeps its id and new work gets a new one.
    pub fn derive_nth(
        agent_id: &str,
        name: &str,
        kind: OperationKind,
        spec_hash: &SpecHash,
        generation: u32,
    ) -> Self {
        // Length-prefixed parts: no two different tuples share an input.
        let mut input = String::new();
        let generation = generation.to_string();
        let parts: &[&str] = if generation == "0" {
            &[agent_id, name, kind.as_str(), &spec_hash.0]
        } else {
            &[agent_id, name, kind.as_str(), &spec_hash.0, &generation]
        };
        for part in parts {
            input.push_str(&part.len().to_string());
            input.push(':');
            input.push_str(part);
        }
        OperationId(sha256_hex(input.as_bytes()))
    }
}

impl std::fmt::Display for OperationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A provider error, classified for the executor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    #[error("{resource}: temporary provider failure: {message}")]
    Retryable { resource: String, message: String },
    #[error("{resource}: rate limited by the provider, retry after {}", crate::time::duration_ms(*retry_after))]
    RateLimited {
        resource: String,
        retry_after: std::time::Duration,
    },
    #[error("{resource}: write conflict (the resource changed since it was observed): {message}")]
    Conflict { resource: String, message: String },
    #[error("{resource}: not found at the provider")]
    NotFound { resource: String },
    #[error("{resource}: {message}")]
    Permanent { resource: String, message: String },
}

impl ProviderError {
    /// Whether the same call may succeed if retried later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ProviderError::Retryable { .. } | ProviderError::RateLimited { .. }
        )
    }
}

/// The request of a create or update: database name, field values to set,
/// labels to set (ownership marker included on create).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeRequest {
    pub database_name: String,
    pub fields: BTreeMap<String, Value>,
    pub labels: BTreeMap<String, String>,
}

/// A place databases live.
///
/// # Guarantees expected of implementations
/// * `create`, `update` and `delete` are idempotent per [`OperationId`]: the
///   same id with the same request returns the original result; the same id
///   with a different request is a `Permanent` error.
/// * `observe_all` returns every database carrying this agent's marker plus
///   the ones named.
///
/// Futures are `Send`, so the executor can run operations as tasks.
pub trait Provider: Send + Sync + 'static {
    fn capabilities(&self) -> Capabilities;
    /// `deep`: databases whose per-database fields (extensions) are wanted;
    /// a provider may leave those fields unobserved for the others.
    fn observe_all(
        &self,
        names: &[String],
        deep: &[String],
    ) -> impl Future<Output = Result<Vec<Observation>, ProviderError>> + Send;
    fn observe(
        &self,
        database_name: &str,
    ) -> impl Future<Output = Result<Option<Observation>, ProviderError>> + Send;
    fn create(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> impl Future<Output = Result<Observation, ProviderError>> + Send;
    /// Sets the request's fields and labels (a label with an empty value is
    /// removed).
    fn update(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> impl Future<Output = Result<Observation, ProviderError>> + Send;
    fn delete(
        &self,
        op: &OperationId,
        database_name: &str,
    ) -> impl Future<Output = Result<(), ProviderError>> + Send;
}

/// Every provider kind this build runs, behind one type.
pub enum AnyProvider {
    Sandbox(Box<sandbox::SandboxProvider>),
    Postgres(Box<postgres::PostgresProvider>),
    Http(Box<http::HttpProvider>),
}

impl Provider for AnyProvider {
    fn capabilities(&self) -> Capabilities {
        match self {
            AnyProvider::Sandbox(p) => p.capabilities(),
            AnyProvider::Postgres(p) => p.capabilities(),
            AnyProvider::Http(p) => p.capabilities(),
        }
    }
    async fn observe_all(
        &self,
        names: &[String],
        deep: &[String],
    ) -> Result<Vec<Observation>, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.observe_all(names, deep).await,
            AnyProvider::Postgres(p) => p.observe_all(names, deep).await,
            AnyProvider::Http(p) => p.observe_all(names, deep).await,
        }
    }
    async fn observe(&self, database_name: &str) -> Result<Option<Observation>, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.observe(database_name).await,
            AnyProvider::Postgres(p) => p.observe(database_name).await,
            AnyProvider::Http(p) => p.observe(database_name).await,
        }
    }
    async fn create(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.create(op, request).await,
            AnyProvider::Postgres(p) => p.create(op, request).await,
            AnyProvider::Http(p) => p.create(op, request).await,
        }
    }
    async fn update(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.update(op, request).await,
            AnyProvider::Postgres(p) => p.update(op, request).await,
            AnyProvider::Http(p) => p.update(op, request).await,
        }
    }
    async fn delete(&self, op: &OperationId, database_name: &str) -> Result<(), ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.delete(op, database_name).await,
            AnyProvider::Postgres(p) => p.delete(op, database_name).await,
            AnyProvider::Http(p) => p.delete(op, database_name).await,
        }
    }
}

impl AnyProvider {
    /// Every database the provider shows, for a provider whose observation
    /// is one listing whatever names it is asked for (the http provider):
    /// a cycle can then start it before it knows the declarations.
    /// `None`: this provider observes by name (the postgres provider reads
    /// each managed database's extensions), so there is nothing to start.
    pub async fn observe_everything(&self) -> Option<Result<Vec<Observation>, ProviderError>> {
        match self {
            AnyProvider::Http(p) => Some(p.observe_everything().await),
            AnyProvider::Sandbox(_) | AnyProvider::Postgres(_) => None,
        }
    }

    /// Every database the provider shows (`tend import`; a PostgreSQL
    /// server's templates aside), each observed in full but for the
    /// per-database fields (extensions) of those `deep` does not name.
    pub async fn observe_every_database(
        &self,
        deep: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Vec<Observation>, ProviderError> {
        match self {
            AnyProvider::Sandbox(p) => p.observe_every_database(),
            AnyProvider::Postgres(p) => p.observe_every_database(deep).await,
            AnyProvider::Http(p) => p.observe_everything().await,
        }
    }

    /// Whether [`AnyProvider::observe_everything`] has anything to do.
    pub fn lists_everything(&self) -> bool {
        matches!(self, AnyProvider::Http(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observed_settings_are_filed_under_the_declared_spelling() {
        let mut obs = Observation {
            database_name: "db".into(),
            external_id: "db".into(),
            status: ResourceStatus::Ready,
            fields: BTreeMap::from([
                ("parameters.work_mem".to_string(), serde_json::json!("64MB")),
                (
                    "parameters.DateStyle".to_string(),
                    serde_json::json!("iso, dmy"),
                ),
                (
                    "parameters.search_path".to_string(),
                    serde_json::json!("public"),
                ),
                ("connectionLimit".to_string(), serde_json::json!(5)),
            ]),
            labels: BTreeMap::new(),
            observed_at: std::time::SystemTime::UNIX_EPOCH,
            unobserved: vec!["parameters.work_mem".to_string()],
        };
        obs.align_parameter_names([
            "parameters.Work_Mem",
            "parameters.datestyle",
            "connectionLimit",
        ]);
        let keys: Vec<&str> = obs.fields.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "connectionLimit",
                "parameters.Work_Mem",
                "parameters.datestyle",
                "parameters.search_path"
            ],
            "declared spellings; an undeclared setting keeps the server's"
        );
        assert_eq!(obs.fields["parameters.Work_Mem"], "64MB");
        assert_eq!(obs.unobserved, ["parameters.Work_Mem"]);
    }

    #[test]
    fn operation_ids_differ_per_part_and_repeat_per_input() {
        let h = SpecHash("abc".into());
        let a = OperationId::derive("agent", "orders", OperationKind::Create, &h);
        assert_eq!(
            a,
            OperationId::derive("agent", "orders", OperationKind::Create, &h)
        );
        assert_ne!(
            a,
            OperationId::derive("agent", "orders", OperationKind::Update, &h)
        );
        assert_ne!(
            a,
            OperationId::derive("agent2", "orders", OperationKind::Create, &h)
        );
        assert_ne!(
            OperationId::derive("ab", "c", OperationKind::Create, &h),
            OperationId::derive("a", "bc", OperationKind::Create, &h)
        );
        assert_eq!(a.0.len(), 64);
        assert_eq!(
            a,
            OperationId::derive_nth("agent", "orders", OperationKind::Create, &h, 0)
        );
        assert_ne!(
            a,
            OperationId::derive_nth("agent", "orders", OperationKind::Create, &h, 1)
        );
    }
}
