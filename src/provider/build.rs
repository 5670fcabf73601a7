//! Building providers from their configuration: secrets are read from
//! their files here, and a kind this build cannot run is refused as a
//! configuration error (exit 78), before any work starts.

use std::path::Path;
use std::sync::Arc;

use super::AnyProvider;
use super::http::{HttpProvider, HttpSettings};
use super::postgres::{PostgresProvider, PostgresSettings};
use super::sandbox::SandboxProvider;
use crate::clock::Clock;
use crate::config::{ConfigError, ProviderConfig, secret};

/// Why a provider's settings do not make a working provider.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// `url` of a PostgreSQL provider does not parse.
    #[error("invalid postgres url: {0}")]
    PostgresUrl(#[source] tokio_postgres::Error),
    /// `tls_ca_file` cannot be used.
    #[error(transparent)]
    Tls(#[from] super::tls::TlsError),
    /// `endpoint` of an HTTP provider is not an HTTP URL.
    #[error("endpoint `{0}` is not an http:// or https:// URL")]
    Endpoint(String),
    /// reqwest cannot build the client (its TLS backend failed to start).
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
}

/// Whether a built provider may change what it stands for. Only the
/// sandbox keeps its data on this host (in the state dir), so only it
/// differs: a reader's sandbox is read, never written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    /// `tend run`, `apply`, `sandbox edit`.
    ReadWrite,
    /// `tend plan`, `explain`, `propose`, `config check`.
    Read,
}

/// Builds the provider `name` as configured. `state_dir` holds the
/// sandbox's data; `clock` is the sandbox's clock.
pub(crate) fn build(
    name: &str,
    config: &ProviderConfig,
    state_dir: &Path,
    clock: &Arc<dyn Clock>,
    use_: Use,
) -> Result<AnyProvider, ConfigError> {
    match config {
        ProviderConfig::Sandbox(c) => {
            let sandbox =
                SandboxProvider::new(name, state_dir, c.provisioning_delay, c.faults.clone())
                    .with_clock(clock.clone());
            Ok(AnyProvider::Sandbox(Box::new(match use_ {
                Use::ReadWrite => sandbox,
                Use::Read => sandbox.read_only(),
            })))
        }
        ProviderConfig::Postgres(c) => {
            let password = match &c.password_file {
                Some(file) => Some(secret::read(
                    &format!("[providers.{name}] password_file"),
                    file,
                )?),
                None => None,
            };
            let settings = PostgresSettings {
                url: c.url.clone(),
                password,
                create_owner: c.create_owner,
                force_drop: c.force_drop,
                max_connections: c.max_concurrency,
                tls_ca_file: c.tls_ca_file.clone(),
            };
            PostgresProvider::new(settings)
                .map(|p| AnyProvider::Postgres(Box::new(p)))
                .map_err(|source| ConfigError::Provider {
                    provider: name.to_string(),
                    source: Box::new(source),
                })
        }
        ProviderConfig::Http(c) => {
            let token = match &c.token_file {
                Some(file) => Some(secret::read(
                    &format!("[providers.{name}] token_file"),
                    file,
                )?),
                None => None,
            };
            let settings = HttpSettings {
                endpoint: c.endpoint.clone(),
                token,
                timeout: c.timeout,
                operation_timeout: c.operation_timeout,
                max_connections: c.max_concurrency,
                read_lag: c.read_lag,
            };
            HttpProvider::new(settings)
                .map(|p| AnyProvider::Http(Box::new(p)))
                .map_err(|source| ConfigError::Provider {
                    provider: name.to_string(),
                    source: Box::new(source),
                })
        }
    }
}
