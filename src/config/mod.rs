//! The agent's configuration file (TOML, docs/configuration.md).
//!
//! Config types only describe the file; runtime components are built from
//! them (`Policy`, providers). Relative paths are resolved against the
//! directory of the configuration file, so `examples/tend.toml` works from
//! any working directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::engine::Policy;
use crate::model::DriftPolicy;

/// A configuration problem. Exit code 78 (`EX_CONFIG`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read configuration {path}: {source} (pass --config or set TEND_CONFIG)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file parses but a value is wrong.
    #[error("invalid configuration {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// A provider's settings do not make a working provider. (The
    /// provider's own error, boxed, as for `Trust`.)
    #[error("[providers.{provider}]: {source}")]
    Provider {
        provider: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The signers file or keyring of `[source] verify` cannot be used.
    /// (The source's own error, boxed: the configuration sits below the
    /// source and does not name its types.)
    #[error("[source] verify: {0}")]
    Trust(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// `[control] group` names no group of this host.
    #[error("[control] group = \"{name}\": no such group on this host (getent group {name})")]
    NoGroup { name: String },
    /// A secret file is missing, unreadable, empty or too large.
    #[error("{setting} = {}: {message}", path.display())]
    Secret {
        setting: String,
        path: PathBuf,
        message: String,
        /// The I/O error behind it, when there is one.
        #[source]
        cause: Option<std::io::Error>,
    },
}

mod control;
pub(crate) mod notify;
mod providers;
mod source;

pub use source::TokenScheme;
use source::credentials_in_url;
pub(crate) use source::{SourceConfig, VerifyMode, redacted_url};
pub(crate) mod secret;
mod values;

pub(crate) use control::ControlConfig;
pub(crate) use providers::{FaultConfig, ProviderConfig, ProviderKind};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Identity of this installation in ownership markers.
    pub agent_id: Option<String>,
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    pub source: SourceConfig,
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    #[serde(default)]
    pub reconcile: ReconcileConfig,
    #[serde(default)]
    pub status: StatusConfig,
    /// Receivers of notifications on transitions.
    #[serde(default)]
    pub notify: Vec<notify::NotifyConfig>,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub state: StateConfig,
    #[serde(default)]
    pub control: ControlConfig,
}

/// `[state]`: where the state is kept and for how long.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// Finished intents older than this are pruned by `tend run` (the
    /// newest few of each resource always stay, for `explain`).
    #[serde(default = "thirty_days", deserialize_with = "values::duration")]
    pub journal_retention: Duration,
    /// `sqlite` (the state dir, one agent) or `postgres` (a schema shared
    /// by a group of agents, one of which leads at a time).
    #[serde(default)]
    pub backend: StateBackend,
    /// PostgreSQL: libpq-style URL of the database (no password in it).
    pub url: Option<String>,
    /// PostgreSQL: file holding the password.
    pub password_file: Option<PathBuf>,
    /// PostgreSQL: the schema of this agent group's tables.
    #[serde(default = "default_state_schema")]
    pub schema: String,
    /// PostgreSQL: CA certificates (PEM) that verify the server.
    pub tls_ca_file: Option<PathBuf>,
    /// PostgreSQL: how long a leader's lease lasts without renewal (it is
    /// renewed every third of it); a standby takes over after it.
    #[serde(default = "default_lease_ttl", deserialize_with = "values::duration")]
    pub lease_ttl: Duration,
}

/// Where the state is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateBackend {
    #[default]
    Sqlite,
    Postgres,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            journal_retention: thirty_days(),
            backend: StateBackend::Sqlite,
            url: None,
            password_file: None,
            schema: default_state_schema(),
            tls_ca_file: None,
            lease_ttl: default_lease_ttl(),
        }
    }
}

fn default_state_schema() -> String {
    "tend_state".into()
}

fn default_lease_ttl() -> Duration {
    Duration::from_secs(15)
}

impl StateConfig {
    /// Whether `other` keeps the state in the same place (everything but
    /// the journal's retention).
    pub fn same_place(&self, other: &StateConfig) -> bool {
        (
            self.backend,
            &self.url,
            &self.password_file,
            &self.schema,
            &self.tls_ca_file,
            self.lease_ttl,
        ) == (
            other.backend,
            &other.url,
            &other.password_file,
            &other.schema,
            &other.tls_ca_file,
            other.lease_ttl,
        )
    }

    /// What is wrong with the `[state]` section, if anything.
    fn problem(&self) -> Option<String> {
        let postgres_only = [
            ("url", self.url.is_some()),
            ("password_file", self.password_file.is_some()),
            ("tls_ca_file", self.tls_ca_file.is_some()),
        ];
        match self.backend {
            StateBackend::Sqlite => postgres_only.iter().find(|(_, set)| *set).map(|(key, _)| {
                format!("[state] {key} is a setting of backend = \"postgres\"; set that backend, or remove {key}")
            }),
            StateBackend::Postgres => {
                let Some(url) = &self.url else {
                    return Some("[state] backend = \"postgres\" needs url (postgres://user@host:port/database)".into());
                };
                if let Err(e) = url.parse::<tokio_postgres::Config>() {
                    return Some(format!("[state] url is not a PostgreSQL URL: {e}"));
                }
                if password_in_postgres_url(url) {
                    return Some("[state] url carries a password: put it in password_file (systemd LoadCredential=) and remove it from the url, which is shown in errors and logs".into());
                }
                let valid = !self.schema.is_empty()
                    && self.schema.len() <= 63
                    && self.schema.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                    && !self.schema.starts_with(|c: char| c.is_ascii_digit());
                if !valid {
                    return Some(format!("[state] schema {:?} must be 1 to 63 lowercase letters, digits or underscores, not starting with a digit", self.schema));
                }
                if self.lease_ttl < Duration::from_secs(3) {
                    return Some("[state] lease_ttl must be at least 3s (it is renewed every third of it)".into());
                }
                None
            }
        }
    }
}

fn thirty_days() -> Duration {
    Duration::from_secs(30 * 24 * 3600)
}

/// `[server]`: the daemon's HTTP endpoint (metrics, health, status,
/// webhooks).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address and port; beyond loopback only with a webhook secret.
    #[serde(default = "default_listen")]
    pub listen: std::net::SocketAddr,
    /// File holding the secret webhooks are signed with (GitHub, Gitea) or
    /// carry as a token (GitLab).
    pub webhook_secret_file: Option<PathBuf>,
    /// File holding a bearer token: when set, `/`, `/v1/status`,
    /// `/metrics` and `POST /v1/reconcile` need `Authorization: Bearer`.
    pub token_file: Option<PathBuf>,
    /// `POST /v1/reconcile` starts at most one reconcile per this long;
    /// requests in between are folded into one at its end.
    #[serde(
        default = "default_reconcile_min_interval",
        deserialize_with = "values::duration"
    )]
    pub reconcile_min_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            webhook_secret_file: None,
            token_file: None,
            reconcile_min_interval: default_reconcile_min_interval(),
        }
    }
}

fn default_reconcile_min_interval() -> Duration {
    Duration::from_secs(2)
}

fn default_listen() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 9477))
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/tend")
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileConfig {
    #[serde(default)]
    pub drift_policy: DriftPolicyConfig,
    #[serde(default = "ten_minutes", deserialize_with = "values::duration")]
    pub drift_grace: Duration,
    #[serde(default = "ten_minutes", deserialize_with = "values::duration")]
    pub resync: Duration,
    /// `tend run`: how often every resource is observed at its provider
    /// (one listing, no fetch), so out-of-band drift is seen within about
    /// this long; a cycle acts on what it finds, as any cycle does.
    #[serde(default = "one_minute", deserialize_with = "values::duration")]
    pub observe: Duration,
    #[serde(
        default = "providers::default_concurrency",
        deserialize_with = "values::concurrency"
    )]
    pub max_concurrency: usize,
    /// `tend run`: how many providers' cycles run at once. Each holds its
    /// provider's listing, plan and report until its report is published
    /// (about 2 KB a resource), so this bounds the agent's memory over
    /// many providers; more overlaps the listings of slow providers.
    #[serde(
        default = "default_parallel_cycles",
        deserialize_with = "values::parallel_cycles"
    )]
    pub parallel_cycles: usize,
    #[serde(default = "one_hour", deserialize_with = "values::duration")]
    pub deletion_delay: Duration,
    #[serde(default = "default_max_deletions")]
    pub max_deletions: usize,
    #[serde(default = "default_max_deletion_percent")]
    pub max_deletion_percent: u8,
    #[serde(default = "one_hour", deserialize_with = "values::duration")]
    pub deletion_stall: Duration,
    /// How long an operation waits for an observation confirming it before
    /// it is left pending for the next cycle.
    #[serde(default = "thirty_seconds", deserialize_with = "values::duration")]
    pub confirm_timeout: Duration,
    /// First delay of the exponential backoff of a failing provider call.
    #[serde(default = "two_hundred_ms", deserialize_with = "values::duration")]
    pub retry_min_delay: Duration,
    /// Retries of a failing call within one cycle.
    #[serde(default = "default_max_retries")]
    pub max_retries: usize,
    /// `tend run`: how long in-flight operations may take to finish after
    /// SIGTERM before the agent exits anyway (what is left stays
    /// journalled).
    #[serde(default = "thirty_seconds", deserialize_with = "values::duration")]
    pub shutdown_timeout: Duration,
}

fn two_hundred_ms() -> Duration {
    Duration::from_millis(200)
}

fn default_max_retries() -> usize {
    6
}

/// Two: the agent decides on two threads (see `process::heap`), so two
/// whole cycles use both; more buys no CPU, only overlap of listings
/// that wait on the network, and each holds its provider's listing.
fn default_parallel_cycles() -> usize {
    2
}

fn thirty_seconds() -> Duration {
    Duration::from_secs(30)
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            drift_policy: DriftPolicyConfig::Correct,
            drift_grace: ten_minutes(),
            resync: ten_minutes(),
            observe: one_minute(),
            max_concurrency: providers::default_concurrency(),
            parallel_cycles: default_parallel_cycles(),
            deletion_delay: one_hour(),
            max_deletions: default_max_deletions(),
            max_deletion_percent: default_max_deletion_percent(),
            deletion_stall: one_hour(),
            confirm_timeout: thirty_seconds(),
            retry_min_delay: two_hundred_ms(),
            max_retries: default_max_retries(),
            shutdown_timeout: thirty_seconds(),
        }
    }
}

fn one_minute() -> Duration {
    Duration::from_secs(60)
}

fn ten_minutes() -> Duration {
    Duration::from_secs(600)
}
fn one_hour() -> Duration {
    Duration::from_secs(3600)
}
fn default_max_deletions() -> usize {
    5
}
fn default_max_deletion_percent() -> u8 {
    10
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriftPolicyConfig {
    #[default]
    Correct,
    Report,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusConfig {
    /// The status branch in the source remote; empty: none.
    #[serde(
        default = "default_status_branch",
        deserialize_with = "values::status_branch"
    )]
    pub branch: String,
    /// Where reports go; [`Config::reports_dir`] gives the default.
    pub reports_dir: Option<PathBuf>,
    #[serde(default = "default_keep_reports")]
    pub keep_reports: usize,
    /// An override this close to its expiry is notified as expiring.
    #[serde(default = "one_day", deserialize_with = "values::duration")]
    pub warn_before: Duration,
    /// Keep a `tend/propose/<name>` branch for every overridden resource
    /// with out-of-band drift (docs/propose.md).
    #[serde(default)]
    pub propose: bool,
    /// Where people read the report (the served `latest.html`, a CI
    /// page): the link of commit statuses and alerts.
    pub report_url: Option<String>,
}

fn one_day() -> Duration {
    Duration::from_secs(24 * 3600)
}

impl Default for StatusConfig {
    fn default() -> Self {
        StatusConfig {
            branch: default_status_branch(),
            reports_dir: None,
            keep_reports: default_keep_reports(),
            warn_before: one_day(),
            propose: false,
            report_url: None,
        }
    }
}

fn default_status_branch() -> String {
    "tend-status".into()
}
fn default_keep_reports() -> usize {
    50
}

/// Whether a PostgreSQL connection string holds a password: in a URL's
/// user part (`postgres://user:pw@host`) or as a `password=` parameter
/// (of the URL's query or a key/value string).
fn password_in_postgres_url(url: &str) -> bool {
    let in_userinfo = url.split_once("://").is_some_and(|(_, rest)| {
        rest.split('/')
            .next()
            .and_then(|authority| authority.rsplit_once('@'))
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    });
    let lower = url.to_ascii_lowercase();
    let as_parameter = lower
        .split(|c: char| c == '?' || c == '&' || c.is_whitespace())
        .any(|part| part.trim_start().starts_with("password="));
    in_userinfo || as_parameter
}

/// The part after `$CREDENTIALS_DIRECTORY/` (or `${CREDENTIALS_DIRECTORY}/`)
/// of a configured path.
fn credential_path(p: &Path) -> Option<&Path> {
    ["$CREDENTIALS_DIRECTORY", "${CREDENTIALS_DIRECTORY}"]
        .iter()
        .find_map(|prefix| p.strip_prefix(prefix).ok())
}

/// Where `$CREDENTIALS_DIRECTORY/` points: the variable systemd sets
/// inside the service; in an operator's shell on the host of a running
/// `tend.service`, that service's credentials (`/run/credentials/
/// tend.service`, root only), so `tend plan`, `explain` or `override set`
/// beside the agent read the same secrets it does.
fn credentials_directory() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") {
        return Some(PathBuf::from(dir));
    }
    let service = Path::new(RUNNING_SERVICE_CREDENTIALS);
    service.is_dir().then(|| service.to_path_buf())
}

/// The credentials directory systemd gives a running `tend.service`.
/// The most a configuration file may hold.
const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

pub(crate) const RUNNING_SERVICE_CREDENTIALS: &str = "/run/credentials/tend.service";

impl Config {
    /// Where reports are written: `[status] reports_dir`, by default
    /// `<state_dir>/reports`.
    pub fn reports_dir(&self) -> PathBuf {
        self.status
            .reports_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("reports"))
    }

    /// Reads and checks a configuration file; relative paths become
    /// relative to the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            crate::files::read_regular_to_string(path, MAX_CONFIG_BYTES).map_err(|source| {
                ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        Self::parse(&text, path)
    }

    /// Checks the text of the configuration file at `path` (which names
    /// it in errors and anchors its relative paths; it is not read).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let mut config: Config = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let credentials = credentials_directory();
        let resolve = |p: &Path| {
            if let Some(rest) = credential_path(p) {
                // systemd's `LoadCredential=` directory; without it the
                // path stays as written (not anchored to the file's
                // directory) and reading the file fails, saying why.
                return match &credentials {
                    Some(dir) => dir.join(rest),
                    None => p.to_path_buf(),
                };
            }
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        config.state_dir = resolve(&config.state_dir);
        if let Some(socket) = &config.control.socket {
            config.control.socket = Some(resolve(socket));
        }
        if let Some(dir) = &config.status.reports_dir {
            config.status.reports_dir = Some(resolve(dir));
        }
        for file in [
            &mut config.state.password_file,
            &mut config.state.tls_ca_file,
        ]
        .into_iter()
        .flatten()
        {
            *file = resolve(file);
        }
        if let Some(problem) = config.state.problem() {
            return Err(invalid(problem));
        }
        for file in [
            &mut config.source.token_file,
            &mut config.source.ssh_key_file,
            &mut config.source.known_hosts_file,
            &mut config.source.allowed_signers_file,
            &mut config.source.gpg_keyring_file,
        ]
        .into_iter()
        .flatten()
        {
            *file = resolve(file);
        }
        for file in [
            &mut config.server.webhook_secret_file,
            &mut config.server.token_file,
        ]
        .into_iter()
        .flatten()
        {
            *file = resolve(file);
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, receiver) in config.notify.iter_mut().enumerate() {
            receiver.check(i).map_err(&invalid)?;
            if !names.insert(receiver.name_at(i)) {
                return Err(invalid(format!(
                    "[[notify]] name {:?} is used twice: give each receiver its own",
                    receiver.name_at(i)
                )));
            }
            for file in [
                &mut receiver.url_file,
                &mut receiver.secret_file,
                &mut receiver.token_file,
            ]
            .into_iter()
            .flatten()
            {
                *file = resolve(file);
            }
        }
        if !config.server.listen.ip().is_loopback() && config.server.webhook_secret_file.is_none() {
            return Err(invalid(format!(
                "[server] listen = \"{}\" is beyond loopback: set webhook_secret_file too, or listen on 127.0.0.1",
                config.server.listen
            )));
        }
        for provider in config.providers.values_mut() {
            provider.resolve_paths(&|p: &PathBuf| resolve(p));
        }
        if let Some(problem) = credentials_in_url(&config.source.url) {
            return Err(invalid(problem));
        }
        if let Some(problem) = config.source.trust_problem() {
            return Err(invalid(problem));
        }
        for (name, provider) in &config.providers {
            if let ProviderConfig::Postgres(pg) = provider
                && password_in_postgres_url(&pg.url)
            {
                return Err(invalid(format!(
                    "[providers.{name}] url carries a password: put it in password_file (systemd LoadCredential=) and remove it from the url, which is shown in errors and logs"
                )));
            }
        }
        if !config.source.url.contains("://") && !config.source.url.contains('@') {
            config.source.url = resolve(Path::new(&config.source.url)).display().to_string();
        }
        if config.providers.is_empty() {
            return Err(invalid(
                "no [providers.NAME] section: configure at least one provider (kind = \"sandbox\" to try tend)".into(),
            ));
        }
        if let Some(id) = &config.agent_id
            && (id.is_empty() || id.len() > 63)
        {
            return Err(invalid("agent_id must be 1 to 63 characters".into()));
        }
        if config.status.branch == config.source.branch {
            return Err(invalid(format!(
                "[status] branch = {:?} is the tracked branch: tend never writes the branch humans own. Give the status branch another name (default \"tend-status\"), or \"\" for none",
                config.status.branch
            )));
        }
        if let Some(url) = &config.status.report_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            return Err(invalid(format!(
                "[status] report_url = {url:?} is not an http(s) URL"
            )));
        }
        if config.source.timeout < Duration::from_secs(1)
            || config.source.timeout > Duration::from_secs(3600)
        {
            return Err(invalid(format!(
                "[source] timeout = \"{}\" must be between 1s and 1h (how long one fetch or push may take)",
                crate::time::duration(config.source.timeout)
            )));
        }
        if config.reconcile.max_deletion_percent > 100 {
            return Err(invalid(format!(
                "[reconcile] max_deletion_percent = {} is not a percentage: give 0 to 100",
                config.reconcile.max_deletion_percent
            )));
        }
        Ok(config)
    }

    /// The decision policy of the agent `agent_id`.
    pub fn policy(&self, agent_id: &str) -> Policy {
        Policy {
            agent_id: agent_id.to_string(),
            drift_policy: match self.reconcile.drift_policy {
                DriftPolicyConfig::Correct => DriftPolicy::Correct,
                DriftPolicyConfig::Report => DriftPolicy::Report,
            },
            drift_grace: self.reconcile.drift_grace,
            deletion_delay: self.reconcile.deletion_delay,
            deletion_stall: self.reconcile.deletion_stall,
            max_update_attempts: 3,
            #[cfg(feature = "test-hooks")]
            sabotage: crate::sabotage::Sabotage::None,
        }
    }
}
