//! `[providers.NAME]`: one tagged variant per provider kind, each with
//! exactly the settings that kind understands (a sandbox setting on a
//! PostgreSQL provider is an error, not ignored).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::values;

/// One configured provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ProviderConfig {
    /// The embedded sandbox: databases in a SQLite file in the state dir.
    Sandbox(SandboxConfig),
    /// A PostgreSQL server (one `CREATE DATABASE` per declaration).
    Postgres(PostgresConfig),
    /// A DBaaS through its HTTP API.
    Http(HttpConfig),
}

/// The kind of a provider, for messages and routing checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Sandbox,
    Postgres,
    Http,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Sandbox => "sandbox",
            ProviderKind::Postgres => "postgres",
            ProviderKind::Http => "http",
        }
    }
}

/// Limits every provider kind shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderLimits {
    pub max_concurrency: usize,
    pub rate_limit: u32,
}

impl ProviderConfig {
    pub fn kind(&self) -> ProviderKind {
        match self {
            ProviderConfig::Sandbox(_) => ProviderKind::Sandbox,
            ProviderConfig::Postgres(_) => ProviderKind::Postgres,
            ProviderConfig::Http(_) => ProviderKind::Http,
        }
    }

    pub fn limits(&self) -> ProviderLimits {
        let (max_concurrency, rate_limit) = match self {
            ProviderConfig::Sandbox(c) => (c.max_concurrency, c.rate_limit),
            ProviderConfig::Postgres(c) => (c.max_concurrency, c.rate_limit),
            ProviderConfig::Http(c) => (c.max_concurrency, c.rate_limit),
        };
        ProviderLimits {
            max_concurrency,
            rate_limit,
        }
    }

    /// The longest one call to this provider may take: its request
    /// timeout and its asynchronous operation's (http), a generous bound
    /// on a `CREATE DATABASE` copying a large template (postgres), the
    /// provisioning delay (sandbox).
    pub fn call_deadline(&self) -> std::time::Duration {
        match self {
            ProviderConfig::Sandbox(c) => c.provisioning_delay + std::time::Duration::from_secs(60),
            ProviderConfig::Postgres(_) => std::time::Duration::from_secs(600),
            ProviderConfig::Http(c) => c.timeout + c.operation_timeout,
        }
    }

    /// The files this provider's settings name (secrets, CA certificates).
    pub(super) fn files(&self) -> Vec<std::path::PathBuf> {
        match self {
            ProviderConfig::Sandbox(_) => Vec::new(),
            ProviderConfig::Postgres(c) => c
                .password_file
                .iter()
                .chain(c.tls_ca_file.iter())
                .cloned()
                .collect(),
            ProviderConfig::Http(c) => c.token_file.iter().cloned().collect(),
        }
    }

    /// Makes relative file paths relative to the configuration's directory.
    pub(super) fn resolve_paths(&mut self, resolve: &dyn Fn(&PathBuf) -> PathBuf) {
        let files: Vec<&mut PathBuf> = match self {
            ProviderConfig::Sandbox(_) => Vec::new(),
            ProviderConfig::Postgres(c) => c
                .password_file
                .iter_mut()
                .chain(c.tls_ca_file.iter_mut())
                .collect(),
            ProviderConfig::Http(c) => c.token_file.iter_mut().collect(),
        };
        for file in files {
            *file = resolve(file);
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// How long a new database stays `provisioning`.
    #[serde(default, deserialize_with = "values::duration")]
    pub provisioning_delay: Duration,
    /// Deterministic fault injection, for tests and demonstrations.
    #[serde(default)]
    pub faults: FaultConfig,
    #[serde(
        default = "default_concurrency",
        deserialize_with = "values::concurrency"
    )]
    pub max_concurrency: usize,
    /// Calls per second to this provider.
    #[serde(default = "default_rate_limit", deserialize_with = "values::rate")]
    pub rate_limit: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// libpq-style URL of the maintenance database.
    pub url: String,
    /// File holding the password (systemd `LoadCredential=`).
    pub password_file: Option<PathBuf>,
    /// Create a missing owner role (NOLOGIN).
    #[serde(default)]
    pub create_owner: bool,
    /// `DROP DATABASE … WITH (FORCE)` when connections remain.
    #[serde(default)]
    pub force_drop: bool,
    /// CA certificates (PEM) that verify the server's TLS certificate; TLS
    /// itself follows the URL's `sslmode`.
    pub tls_ca_file: Option<PathBuf>,
    #[serde(
        default = "default_concurrency",
        deserialize_with = "values::concurrency"
    )]
    pub max_concurrency: usize,
    #[serde(default = "default_rate_limit", deserialize_with = "values::rate")]
    pub rate_limit: u32,
}

/// A DBaaS that speaks tend's HTTP provider contract
/// (docs/provider-http-api.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Base URL before `/v1` (`https://dbaas.internal`).
    pub endpoint: String,
    /// File holding the bearer token (systemd `LoadCredential=`).
    pub token_file: Option<PathBuf>,
    /// One request's limit.
    #[serde(default = "default_timeout", deserialize_with = "values::duration")]
    pub timeout: Duration,
    /// How long an asynchronous operation (`202 Accepted`) may run before
    /// the call is retried (the retry finds the same operation).
    #[serde(
        default = "default_operation_timeout",
        deserialize_with = "values::duration"
    )]
    pub operation_timeout: Duration,
    /// How long the server's reads may lag its writes (a cache in front
    /// of it): within this long of tend's own write, a database missing
    /// from a listing is waited for, not created again.
    #[serde(default, deserialize_with = "values::duration")]
    pub read_lag: Duration,
    #[serde(
        default = "default_concurrency",
        deserialize_with = "values::concurrency"
    )]
    pub max_concurrency: usize,
    #[serde(default = "default_rate_limit", deserialize_with = "values::rate")]
    pub rate_limit: u32,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_operation_timeout() -> Duration {
    Duration::from_secs(600)
}

fn default_rate_limit() -> u32 {
    20
}

pub(super) fn default_concurrency() -> usize {
    4
}

/// Faults the sandbox provider injects (counts are per process).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// Commit the next N creates/updates/deletes, then lose the response.
    #[serde(default)]
    pub lose_responses: u32,
    /// Fail the next N calls with a 5xx-like retryable error.
    #[serde(default)]
    pub fail_calls: u32,
    /// Answer the next N calls with 429 and this retry-after.
    #[serde(default)]
    pub rate_limit_calls: u32,
    #[serde(default, deserialize_with = "values::duration")]
    pub retry_after: Duration,
    /// Serve reads that lag writes by this long (a stale cache): within this
    /// time after a write, observations show the state before it.
    #[serde(default, deserialize_with = "values::duration")]
    pub stale_reads: Duration,
    /// Accept a higher `connectionLimit` but store this one (a plan limit a
    /// DBaaS enforces silently): the update is confirmed, and the field
    /// still differs.
    #[serde(default)]
    pub max_connection_limit: Option<i64>,
    /// Keep databases by id, not by name, as some DBaaS APIs do: a create
    /// under a new idempotency key beside a database of the same name
    /// makes a second database (stored as `NAME~N`). Then only the
    /// idempotency key stands between a retried create and a duplicate.
    #[serde(default)]
    pub names_not_unique: bool,
}
