//! The PostgreSQL provider: a `ManagedDatabase` is a real database on a
//! PostgreSQL server (13 or newer).
//!
//! # Ownership and lost responses
//! tend keeps a catalog in the maintenance database (`tend.databases`): which
//! database belongs to which agent and declaration, and the operation id that
//! created it. The name is reserved there *before* `CREATE DATABASE`, so after
//! a lost response or a crash, "exists + our reservation" is success and
//! "exists + not ours" is a conflict (the engine reports `Blocked`).
//!
//! # Quoting
//! Every identifier and value goes through [`quote_ident`] or
//! [`quote_literal`] (with `standard_conforming_strings` on for the session);
//! nothing from a declaration is interpolated unquoted.

mod observe;
mod write;

use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::setting_list::POSTGRES_LIST_SETTINGS;
use super::{
    Capabilities, ChangeRequest, Observation, OperationId, Provider, ProviderError, SetupError,
};

/// Fields this provider observes and manages.
pub(crate) const POSTGRES_FIELDS: &[&str] = &[
    "databaseName",
    "owner",
    "encoding",
    "locale",
    "connectionLimit",
    "allowConnections",
    "extensions",
    "parameters",
    "comment",
];

/// The database `config` connects to: its dbname, else (libpq's default)
/// its user's name.
fn database_of(config: &tokio_postgres::Config) -> Option<String> {
    config
        .get_dbname()
        .or_else(|| config.get_user())
        .map(str::to_string)
}

/// `"name"` with embedded quotes doubled: safe for any identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'value'` with embedded quotes doubled (with standard_conforming_strings
/// on, backslashes are ordinary characters).
pub(crate) fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// tend's catalog in the maintenance database. The schema is made apart
/// from the table, and only when missing: `CREATE SCHEMA IF NOT EXISTS`
/// checks the `CREATE` privilege on the database before it looks, so an
/// agent for which an administrator made the schema needs no privilege on
/// the database itself.
const CATALOG_SCHEMA: &str = "CREATE SCHEMA IF NOT EXISTS tend";
const CATALOG_TABLE: &str = "
CREATE TABLE IF NOT EXISTS tend.databases (
    database_name text PRIMARY KEY,
    agent_id text NOT NULL,
    declaration text NOT NULL,
    operation_id text NOT NULL,
    reserved_at timestamptz NOT NULL DEFAULT now()
)";

/// Settings of a `postgres` provider. `Debug` never shows the password.
#[derive(Clone)]
pub struct PostgresSettings {
    /// libpq-style URL of the maintenance database.
    pub url: String,
    pub password: Option<String>,
    /// Create a missing owner role (NOLOGIN) instead of failing.
    pub create_owner: bool,
    /// `DROP DATABASE … WITH (FORCE)` when connections remain.
    pub force_drop: bool,
    pub max_connections: usize,
    /// CA certificates (PEM) that verify the server; without, TLS (when the
    /// URL's sslmode asks for it) encrypts but does not authenticate.
    pub tls_ca_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("create_owner", &self.create_owner)
            .field("force_drop", &self.force_drop)
            .field("max_connections", &self.max_connections)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
}

#[cfg(test)]
mod debug_tests {
    #[test]
    fn debug_output_never_holds_the_password() {
        let settings = super::PostgresSettings {
            url: "postgres://tend@127.0.0.1/postgres".into(),
            password: Some("hunter2-secret".into()),
            create_owner: false,
            force_drop: false,
            max_connections: 4,
            tls_ca_file: None,
        };
        let shown = format!("{settings:?}");
        assert!(
            !shown.contains("hunter2-secret") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}

/// The provider: a small bounded pool of connections to the maintenance
/// database.
pub struct PostgresProvider {
    settings: PostgresSettings,
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    idle: Mutex<Vec<Client>>,
    slots: Semaphore,
    catalog_ready: tokio::sync::OnceCell<()>,
}

/// A pooled connection, returned on drop.
pub(super) struct Pooled<'a> {
    client: Option<Client>,
    pool: &'a PostgresProvider,
    _permit: SemaphorePermit<'a>,
}

impl std::ops::Deref for Pooled<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().expect("present until drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
        {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(client);
        }
    }
}

pub(super) fn retryable(resource: &str, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::Retryable {
        resource: resource.to_string(),
        message: e.to_string(),
    }
}

/// Classifies a server error: connection trouble is retryable, a refused
/// statement is permanent.
pub(super) fn classify(resource: &str, e: tokio_postgres::Error) -> ProviderError {
    // Connection trouble (08), insufficient resources such as too many
    // connections (53), operator intervention (57), serialization and
    // deadlock (40001, 40P01), "in use" and lock waits (55006, 55P03) pass.
    const TRANSIENT: &[&str] = &["40001", "40P01", "55006", "55P03"];
    match e.as_db_error() {
        Some(db)
            if db.code().code().starts_with("08")
                || db.code().code().starts_with("53")
                || db.code().code().starts_with("57")
                || TRANSIENT.contains(&db.code().code()) =>
        {
            retryable(resource, db.message())
        }
        // Two CREATE DATABASE of one name at once: the other is still
        // running (an earlier attempt's session, its client killed, which
        // the server finishes anyway). Not "exists" yet, not a failure:
        // the retry finds the database, or not.
        Some(db)
            if db.code().code() == "23505"
                && db.constraint() == Some("pg_database_datname_index") =>
        {
            retryable(
                resource,
                format!(
                    "another CREATE DATABASE of this name is in progress: {}",
                    db.message()
                ),
            )
        }
        Some(db) => ProviderError::Permanent {
            resource: resource.to_string(),
            message: format!("{} ({})", db.message(), db.code().code()),
        },
        None => retryable(resource, e),
    }
}

/// Opens a session with the settings tend relies on (TLS as the URL's
/// `sslmode` says).
pub(super) async fn open(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    resource: &str,
) -> Result<Client, ProviderError> {
    let (client, connection) = config
        .connect(tls.clone())
        .await
        .map_err(|e| connect_failure(resource, e))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
        .batch_execute("SET standard_conforming_strings = on")
        .await
        .map_err(|e| classify(resource, e))?;
    Ok(client)
}

/// Classifies a failed connection. The server refusing the session
/// (authentication, a missing database) and TLS that cannot work as
/// configured do not get better by retrying: they are permanent, with
/// what to change; a network failure or a full server is retryable.
fn connect_failure(resource: &str, e: tokio_postgres::Error) -> ProviderError {
    if e.as_db_error().is_some() {
        return classify(resource, e);
    }
    let message = connect_error(&e);
    let configuration = if message.contains("server does not support TLS") {
        Some(
            "the server offers no TLS, but the url's sslmode asks for it: enable ssl on the server, or change sslmode in [providers] url",
        )
    } else if message.contains("invalid peer certificate") {
        Some(
            "the server's certificate is not trusted: set tls_ca_file to the CA that signed it (or fix the certificate's names)",
        )
    } else {
        None
    };
    match configuration {
        Some(what) => ProviderError::Permanent {
            resource: resource.to_string(),
            message: format!("cannot connect: {what} ({message})"),
        },
        None => retryable(resource, message),
    }
}

/// A connection error with its cause (TLS failures hide in the source).
pub(crate) fn connect_error(e: &tokio_postgres::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    message
}

async fn catalog_exists(client: &Client, resource: &str) -> Result<bool, ProviderError> {
    let table: Option<String> = client
        .query_one("SELECT to_regclass('tend.databases')::text", &[])
        .await
        .map_err(|e| classify(resource, e))?
        .get(0);
    Ok(table.is_some())
}

/// A failure to make the catalog, with the grant that allows it.
fn catalog_error(resource: &str, e: tokio_postgres::Error) -> ProviderError {
    match classify(resource, e) {
        ProviderError::Permanent { resource, message } => ProviderError::Permanent {
            resource,
            message: format!(
                "cannot create tend's catalog (schema tend, table tend.databases) in the maintenance database: {message}. Grant CREATE on that database to tend's role once, or create the schema for it (`CREATE SCHEMA tend AUTHORIZATION <role>`); see docs/providers.md"
            ),
        },
        other => other,
    }
}

impl PostgresProvider {
    pub fn new(settings: PostgresSettings) -> Result<Self, SetupError> {
        let mut config: tokio_postgres::Config =
            settings.url.parse().map_err(SetupError::PostgresUrl)?;
        if let Some(password) = &settings.password {
            config.password(password.as_bytes());
        }
        config.application_name("tend");
        // A server behind a network that drops packets must fail a cycle's
        // observation in seconds, not hold it (and the watchdog) for the
        // kernel's TCP timeout. The URL's own connect_timeout wins.
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(std::time::Duration::from_secs(10));
        }
        let slots = Semaphore::new(settings.max_connections.max(1));
        let tls = super::tls::connector(settings.tls_ca_file.as_deref())?;
        Ok(PostgresProvider {
            settings,
            config,
            tls,
            idle: Mutex::new(Vec::new()),
            slots,
            catalog_ready: tokio::sync::OnceCell::new(),
        })
    }

    async fn connect(
        &self,
        config: &tokio_postgres::Config,
        resource: &str,
    ) -> Result<Client, ProviderError> {
        open(config, &self.tls, resource).await
    }

    /// A pooled connection to the maintenance database, for reading: it
    /// never creates tend's catalog (`tend plan` writes nothing).
    pub(super) async fn client(&self, resource: &str) -> Result<Pooled<'_>, ProviderError> {
        let permit = self
            .slots
            .acquire()
            .await
            .map_err(|e| retryable(resource, e))?;
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let client = match idle {
            Some(c) if !c.is_closed() => c,
            _ => self.connect(&self.config, resource).await?,
        };
        Ok(Pooled {
            client: Some(client),
            pool: self,
            _permit: permit,
        })
    }

    /// A pooled connection for a write: tend's catalog is made first when
    /// it is missing (once per process).
    pub(super) async fn writer(&self, resource: &str) -> Result<Pooled<'_>, ProviderError> {
        let pooled = self.client(resource).await?;
        self.catalog_ready
            .get_or_try_init(|| async {
                if catalog_exists(&pooled, resource).await? {
                    return Ok(());
                }
                let schema: Option<String> = pooled
                    .query_one("SELECT to_regnamespace('tend')::text", &[])
                    .await
                    .map_err(|e| classify(resource, e))?
                    .get(0);
                if schema.is_none() {
                    pooled
                        .batch_execute(CATALOG_SCHEMA)
                        .await
                        .map_err(|e| catalog_error(resource, e))?;
                }
                pooled
                    .batch_execute(CATALOG_TABLE)
                    .await
                    .map_err(|e| catalog_error(resource, e))
            })
            .await?;
        Ok(pooled)
    }

    /// Whether tend's catalog exists (known for the rest of the process
    /// once this process made or found it for a write).
    pub(super) async fn has_catalog(
        &self,
        client: &Client,
        resource: &str,
    ) -> Result<bool, ProviderError> {
        if self.catalog_ready.initialized() {
            return Ok(true);
        }
        catalog_exists(client, resource).await
    }

    /// A connection to one database (extensions live per database).
    pub(super) async fn client_in(&self, database: &str) -> Result<Client, ProviderError> {
        let mut config = self.config.clone();
        config.dbname(database);
        self.connect(&config, database).await
    }

    /// Every database of the server but its templates (`tend import`),
    /// with the extensions of those `deep` names (a connection each: only
    /// the databases worth importing).
    pub async fn observe_every_database(
        &self,
        deep: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Vec<Observation>, ProviderError> {
        self.observe_where(observe::Listed::Everything, observe::Deep::Where(deep))
            .await
    }

    /// `template1`, without connecting to it: what `CREATE DATABASE`
    /// copies (its encoding and locale are the server's defaults).
    pub async fn template(&self) -> Result<Option<Observation>, ProviderError> {
        Ok(self
            .observe_where(
                observe::Listed::Named {
                    names: &["template1".to_string()],
                },
                observe::Deep::Of(&[]),
            )
            .await?
            .into_iter()
            .next())
    }

    /// The database of the maintenance connection (tend's catalog lives
    /// there), as the URL names it (libpq's default: the user's name).
    pub fn maintenance_database(&self) -> Option<String> {
        database_of(&self.config)
    }

    /// The database a libpq-style `url` connects to, when it reaches the
    /// same server as this provider's (the same hosts, and ports with
    /// 5432 for none).
    pub fn database_on_this_server(&self, url: &str) -> Option<String> {
        let other = url.parse::<tokio_postgres::Config>().ok()?;
        let ports = |c: &tokio_postgres::Config| match c.get_ports() {
            [] => vec![5432],
            ports => ports.to_vec(),
        };
        (other.get_hosts() == self.config.get_hosts() && ports(&other) == ports(&self.config))
            .then(|| database_of(&other))
            .flatten()
    }

    fn capabilities_static() -> Capabilities {
        Capabilities {
            list_settings: POSTGRES_LIST_SETTINGS,
            parameter_names_ignore_case: true,
            ..Capabilities::for_fields(POSTGRES_FIELDS, false)
        }
    }
}

impl Provider for PostgresProvider {
    fn capabilities(&self) -> Capabilities {
        Self::capabilities_static()
    }

    async fn observe_all(
        &self,
        names: &[String],
        deep: &[String],
    ) -> Result<Vec<Observation>, ProviderError> {
        self.observe_where(observe::Listed::Named { names }, observe::Deep::Of(deep))
            .await
    }

    async fn observe(&self, database_name: &str) -> Result<Option<Observation>, ProviderError> {
        Ok(self
            .observe_where(
                observe::Listed::Named {
                    names: &[database_name.to_string()],
                },
                observe::Deep::Named,
            )
            .await?
            .into_iter()
            .next())
    }

    async fn create(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        self.create_reserved(op, request).await
    }

    async fn update(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        self.alter(op, request).await
    }

    async fn delete(&self, op: &OperationId, database_name: &str) -> Result<(), ProviderError> {
        self.drop_database(op, database_name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_quotes() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("back\\slash"), "'back\\slash'");
    }
}
