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

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use serde_json::{Value, json};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{
    Capabilities, ChangeRequest, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation,
    OperationId, Provider, ProviderError, ResourceStatus,
};

/// Fields this provider observes and manages.
pub const POSTGRES_FIELDS: &[&str] = &[
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

/// `"name"` with embedded quotes doubled: safe for any identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'value'` with embedded quotes doubled (with standard_conforming_strings
/// on, backslashes are ordinary characters).
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

const CATALOG: &str = "
CREATE SCHEMA IF NOT EXISTS tend;
CREATE TABLE IF NOT EXISTS tend.databases (
    database_name text PRIMARY KEY,
    agent_id text NOT NULL,
    declaration text NOT NULL,
    operation_id text NOT NULL,
    reserved_at timestamptz NOT NULL DEFAULT now()
);";

/// Settings of a `postgres` provider.
#[derive(Debug, Clone)]
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
struct Pooled<'a> {
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

fn retryable(resource: &str, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::Retryable {
        resource: resource.to_string(),
        message: e.to_string(),
    }
}

/// Classifies a server error: connection trouble is retryable, a refused
/// statement is permanent.
fn classify(resource: &str, e: tokio_postgres::Error) -> ProviderError {
    // Connection trouble (08), operator intervention (57), serialization and
    // deadlock (40001, 40P01), "in use" and lock waits (55006, 55P03) pass.
    const TRANSIENT: &[&str] = &["40001", "40P01", "55006", "55P03"];
    match e.as_db_error() {
        Some(db)
            if db.code().code().starts_with("08")
                || db.code().code().starts_with("57")
                || TRANSIENT.contains(&db.code().code()) =>
        {
            retryable(resource, db.message())
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
async fn open(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    resource: &str,
) -> Result<Client, ProviderError> {
    let (client, connection) = config
        .connect(tls.clone())
        .await
        .map_err(|e| retryable(resource, connect_error(e)))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
        .batch_execute("SET standard_conforming_strings = on")
        .await
        .map_err(|e| classify(resource, e))?;
    Ok(client)
}

/// A connection error with its cause (TLS failures hide in the source).
fn connect_error(e: tokio_postgres::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    message
}

/// The extensions installed in one database.
async fn extensions_in(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    database: &str,
) -> Result<Value, ProviderError> {
    let client = open(config, tls, database).await?;
    let rows = client
        .query(
            "SELECT e.extname, e.extversion, n.nspname FROM pg_extension e \
             JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname <> 'plpgsql' ORDER BY e.extname",
            &[],
        )
        .await
        .map_err(|e| classify(database, e))?;
    Ok(Value::Array(
        rows.iter()
            .map(|r| json!({"name": r.get::<_, String>(0), "version": r.get::<_, String>(1), "schema": r.get::<_, String>(2)}))
            .collect(),
    ))
}

impl PostgresProvider {
    pub fn new(settings: PostgresSettings) -> Result<Self, String> {
        let mut config: tokio_postgres::Config = settings
            .url
            .parse()
            .map_err(|e| format!("invalid postgres url: {e}"))?;
        if let Some(password) = &settings.password {
            config.password(password.as_bytes());
        }
        config.application_name("tend");
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

    async fn client(&self, resource: &str) -> Result<Pooled<'_>, ProviderError> {
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
        let pooled = Pooled {
            client: Some(client),
            pool: self,
            _permit: permit,
        };
        self.catalog_ready
            .get_or_try_init(|| async {
                pooled
                    .batch_execute(CATALOG)
                    .await
                    .map_err(|e| classify(resource, e))
            })
            .await?;
        Ok(pooled)
    }

    /// A connection to one database (extensions live per database).
    async fn client_in(&self, database: &str) -> Result<Client, ProviderError> {
        let mut config = self.config.clone();
        config.dbname(database);
        self.connect(&config, database).await
    }

    /// `deep`: databases whose extensions are observed (`None`: every named
    /// one). Extension queries run concurrently, bounded by the pool size.
    async fn observe_where(
        &self,
        names: &[String],
        all_marked: bool,
        deep: Option<&[String]>,
    ) -> Result<Vec<Observation>, ProviderError> {
        let client = self.client("*").await?;
        let rows = client
            .query(
                "SELECT d.datname, d.oid::text, r.rolname, pg_encoding_to_char(d.encoding), d.datcollate, \
                        d.datconnlimit, d.datallowconn, sd.description, coalesce(s.setconfig, '{}'::text[]), \
                        t.agent_id, t.declaration \
                 FROM pg_database d \
                 JOIN pg_roles r ON r.oid = d.datdba \
                 LEFT JOIN pg_shdescription sd ON sd.objoid = d.oid AND sd.classoid = 'pg_database'::regclass \
                 LEFT JOIN pg_db_role_setting s ON s.setdatabase = d.oid AND s.setrole = 0 \
                 LEFT JOIN tend.databases t ON t.database_name = d.datname \
                 WHERE d.datname = ANY($1) OR ($2 AND t.agent_id IS NOT NULL)",
                &[&names, &all_marked],
            )
            .await
            .map_err(|e| classify("*", e))?;
        drop(client);
        let mut out = Vec::with_capacity(rows.len());
        let mut extension_queries = Vec::new();
        for row in rows {
            let name: String = row.get(0);
            let mut fields = BTreeMap::new();
            fields.insert("databaseName".into(), json!(name));
            fields.insert("owner".into(), json!(row.get::<_, String>(2)));
            fields.insert("encoding".into(), json!(row.get::<_, String>(3)));
            fields.insert("locale".into(), json!(row.get::<_, String>(4)));
            fields.insert("connectionLimit".into(), json!(row.get::<_, i32>(5)));
            let allow: bool = row.get(6);
            fields.insert("allowConnections".into(), json!(allow));
            if let Some(comment) = row.get::<_, Option<String>>(7) {
                fields.insert("comment".into(), json!(comment));
            }
            for setting in row.get::<_, Vec<String>>(8) {
                if let Some((k, v)) = setting.split_once('=') {
                    fields.insert(format!("parameters.{k}"), json!(v));
                }
            }
            let mut labels = BTreeMap::new();
            if let (Some(agent), Some(decl)) = (
                row.get::<_, Option<String>>(9),
                row.get::<_, Option<String>>(10),
            ) {
                labels.insert(OWNER_AGENT_LABEL.to_string(), agent);
                labels.insert(OWNER_DECLARATION_LABEL.to_string(), decl);
            }
            // Extensions need a connection to the database itself: only for
            // databases that accept connections and whose extensions are
            // wanted; otherwise they are unknown, not absent.
            let wanted = match deep {
                Some(deep) => deep.contains(&name),
                None => names.contains(&name),
            };
            let unobserved = if allow && wanted {
                extension_queries.push(name.clone());
                Vec::new()
            } else {
                vec!["extensions".to_string()]
            };
            out.push(Observation {
                database_name: name,
                external_id: row.get(1),
                status: ResourceStatus::Ready,
                fields,
                labels,
                observed_at: SystemTime::now(),
                unobserved,
            });
        }
        let limit = std::sync::Arc::new(Semaphore::new(self.settings.max_connections.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        for name in extension_queries {
            let mut config = self.config.clone();
            config.dbname(&name);
            let limit = limit.clone();
            let tls = self.tls.clone();
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let result = extensions_in(&config, &tls, &name).await;
                (name, result)
            });
        }
        let mut found = BTreeMap::new();
        while let Some(joined) = tasks.join_next().await {
            let (name, result) = joined.map_err(|e| retryable("*", e))?;
            found.insert(name, result);
        }
        for obs in &mut out {
            match found.remove(&obs.database_name) {
                Some(Ok(extensions)) => {
                    obs.fields.insert("extensions".into(), extensions);
                }
                // One database that cannot be reached (CONNECT revoked,
                // dropped meanwhile) leaves its extensions unknown; it does
                // not make every other database unobservable.
                Some(Err(e)) => {
                    tracing::warn!("extensions of {}: {e}", obs.database_name);
                    obs.unobserved.push("extensions".into());
                }
                None => {}
            }
        }
        Ok(out)
    }

    async fn ensure_role(
        &self,
        client: &Client,
        role: &str,
        database: &str,
    ) -> Result<(), ProviderError> {
        let exists = client
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
            .await
            .map_err(|e| classify(database, e))?
            .is_some();
        if exists {
            return Ok(());
        }
        if !self.settings.create_owner {
            return Err(ProviderError::Permanent {
                resource: database.to_string(),
                message: format!(
                    "owner role {} does not exist; create it, or set create_owner = true in the provider config",
                    quote_ident(role)
                ),
            });
        }
        client
            .batch_execute(&format!("CREATE ROLE {} NOLOGIN", quote_ident(role)))
            .await
            .map_err(|e| classify(database, e))
    }

    /// Applies the mutable fields of a request (each statement idempotent).
    async fn apply_fields(
        &self,
        client: &Client,
        db: &str,
        fields: &BTreeMap<String, Value>,
    ) -> Result<(), ProviderError> {
        let ident = quote_ident(db);
        let mut statements = Vec::new();
        for (field, value) in fields {
            match (field.as_str(), value) {
                ("owner", Value::String(role)) => {
                    self.ensure_role(client, role, db).await?;
                    statements.push(format!(
                        "ALTER DATABASE {ident} OWNER TO {}",
                        quote_ident(role)
                    ));
                }
                ("connectionLimit", Value::Number(n)) => {
                    statements.push(format!(
                        "ALTER DATABASE {ident} CONNECTION LIMIT {}",
                        n.as_i64().unwrap_or(-1)
                    ));
                }
                ("allowConnections", Value::Bool(b)) => {
                    statements.push(format!("ALTER DATABASE {ident} ALLOW_CONNECTIONS {b}"));
                }
                ("comment", Value::String(c)) => {
                    statements.push(format!(
                        "COMMENT ON DATABASE {ident} IS {}",
                        quote_literal(c)
                    ));
                }
                ("comment", Value::Null) => {
                    statements.push(format!("COMMENT ON DATABASE {ident} IS NULL"))
                }
                (other, value) if other.starts_with("parameters.") => {
                    let key = &other["parameters.".len()..];
                    if !crate::model::fields::is_parameter_name(key) {
                        return Err(ProviderError::Permanent {
                            resource: db.to_string(),
                            message: format!("`{key}` is not a parameter name"),
                        });
                    }
                    statements.push(match value {
                        Value::Null => format!("ALTER DATABASE {ident} RESET {}", quote_ident(key)),
                        Value::String(v) => format!(
                            "ALTER DATABASE {ident} SET {} = {}",
                            quote_ident(key),
                            quote_literal(v)
                        ),
                        other => format!(
                            "ALTER DATABASE {ident} SET {} = {}",
                            quote_ident(key),
                            quote_literal(&other.to_string())
                        ),
                    });
                }
                _ => {}
            }
        }
        for sql in statements {
            client
                .batch_execute(&sql)
                .await
                .map_err(|e| classify(db, e))?;
        }
        if let Some(Value::Array(extensions)) = fields.get("extensions") {
            let ext_client = self.client_in(db).await?;
            for ext in extensions {
                let Some(name) = ext.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let mut sql = format!("CREATE EXTENSION IF NOT EXISTS {}", quote_ident(name));
                if let Some(schema) = ext.get("schema").and_then(Value::as_str) {
                    sql.push_str(&format!(" SCHEMA {}", quote_ident(schema)));
                }
                if let Some(version) = ext.get("version").and_then(Value::as_str) {
                    sql.push_str(&format!(" VERSION {}", quote_literal(version)));
                }
                ext_client
                    .batch_execute(&sql)
                    .await
                    .map_err(|e| classify(db, e))?;
                if let Some(version) = ext.get("version").and_then(Value::as_str) {
                    ext_client
                        .batch_execute(&format!(
                            "ALTER EXTENSION {} UPDATE TO {}",
                            quote_ident(name),
                            quote_literal(version)
                        ))
                        .await
                        .map_err(|e| classify(db, e))?;
                }
            }
        }
        Ok(())
    }

    /// Sets or removes the catalog row that marks ownership.
    async fn apply_marker(
        &self,
        client: &Client,
        db: &str,
        op: &OperationId,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), ProviderError> {
        match (
            labels.get(OWNER_AGENT_LABEL),
            labels.get(OWNER_DECLARATION_LABEL),
        ) {
            (Some(agent), Some(decl)) if agent.is_empty() => {
                let _ = decl;
                client
                    .execute(
                        "DELETE FROM tend.databases WHERE database_name = $1",
                        &[&db],
                    )
                    .await
                    .map_err(|e| classify(db, e))?;
            }
            (Some(agent), Some(decl)) => {
                client
                    .execute(
                        "INSERT INTO tend.databases (database_name, agent_id, declaration, operation_id) VALUES ($1, $2, $3, $4) \
                         ON CONFLICT (database_name) DO UPDATE SET declaration = excluded.declaration \
                         WHERE tend.databases.agent_id = excluded.agent_id",
                        &[&db, agent, decl, &op.0],
                    )
                    .await
                    .map_err(|e| classify(db, e))?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Runs `CREATE DATABASE` (the owner role made first, when allowed).
    async fn create_database(
        &self,
        client: &Client,
        db: &str,
        sql: &str,
        request: &ChangeRequest,
    ) -> Result<(), ProviderError> {
        if let Some(owner) = request.fields.get("owner").and_then(Value::as_str) {
            self.ensure_role(client, owner, db).await?;
        }
        client.batch_execute(sql).await.map_err(|e| classify(db, e))
    }

    fn capabilities_static() -> Capabilities {
        Capabilities::for_fields(POSTGRES_FIELDS, false)
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
        self.observe_where(names, true, Some(deep)).await
    }

    async fn observe(&self, database_name: &str) -> Result<Option<Observation>, ProviderError> {
        Ok(self
            .observe_where(&[database_name.to_string()], false, None)
            .await?
            .into_iter()
            .next())
    }

    async fn create(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let db = request.database_name.as_str();
        let client = self.client(db).await?;
        let agent = request
            .labels
            .get(OWNER_AGENT_LABEL)
            .cloned()
            .unwrap_or_default();
        let decl = request
            .labels
            .get(OWNER_DECLARATION_LABEL)
            .cloned()
            .unwrap_or_default();
        // Reserve the name first: after a lost response the reservation
        // proves the database is ours.
        let inserted = client
            .execute(
                "INSERT INTO tend.databases (database_name, agent_id, declaration, operation_id) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (database_name) DO NOTHING",
                &[&db, &agent, &decl, &op.0],
            )
            .await
            .map_err(|e| classify(db, e))?
            == 1;
        let reservation = client
            .query_one(
                "SELECT agent_id, declaration FROM tend.databases WHERE database_name = $1",
                &[&db],
            )
            .await
            .map_err(|e| classify(db, e))?;
        let (r_agent, r_decl): (String, String) = (reservation.get(0), reservation.get(1));
        if r_agent != agent || r_decl != decl {
            return Err(ProviderError::Conflict {
                resource: db.to_string(),
                message: format!(
                    "the name is reserved by agent `{r_agent}` for declaration `{r_decl}`"
                ),
            });
        }
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
            .await
            .map_err(|e| classify(db, e))?
            .is_some();
        if exists && inserted {
            // It existed before our reservation: not ours.
            client
                .execute(
                    "DELETE FROM tend.databases WHERE database_name = $1 AND operation_id = $2",
                    &[&db, &op.0],
                )
                .await
                .map_err(|e| classify(db, e))?;
            return Err(ProviderError::Conflict {
                resource: db.to_string(),
                message: "a database of that name already exists and is not tend's".into(),
            });
        }
        if !exists {
            let mut sql = format!("CREATE DATABASE {}", quote_ident(db));
            let text = |f: &str| request.fields.get(f).and_then(Value::as_str);
            if let Some(owner) = text("owner") {
                sql.push_str(&format!(" OWNER {}", quote_ident(owner)));
            }
            let mut template = text("template").map(str::to_string);
            if let Some(encoding) = text("encoding") {
                sql.push_str(&format!(" ENCODING {}", quote_literal(encoding)));
                template.get_or_insert_with(|| "template0".into());
            }
            if let Some(locale) = text("locale") {
                sql.push_str(&format!(
                    " LC_COLLATE {} LC_CTYPE {}",
                    quote_literal(locale),
                    quote_literal(locale)
                ));
                template.get_or_insert_with(|| "template0".into());
            }
            if let Some(template) = template {
                sql.push_str(&format!(" TEMPLATE {}", quote_ident(&template)));
            }
            if let Err(e) = self.create_database(&client, db, &sql, request).await {
                // A reservation must never outlive a create that failed for
                // good: a database someone makes later by hand under that
                // name would look like tend's.
                if !e.is_transient() {
                    client
                        .execute(
                            "DELETE FROM tend.databases WHERE database_name = $1 AND operation_id = $2 \
                             AND NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)",
                            &[&db, &op.0],
                        )
                        .await
                        .map_err(|e| classify(db, e))?;
                }
                // "Already exists" (42P04) right after our own reservation
                // means someone else created it in between: not ours.
                if inserted
                    && matches!(&e, ProviderError::Permanent { message, .. } if message.contains("42P04"))
                {
                    client
                        .execute("DELETE FROM tend.databases WHERE database_name = $1 AND operation_id = $2", &[&db, &op.0])
                        .await
                        .map_err(|e| classify(db, e))?;
                    return Err(ProviderError::Conflict {
                        resource: db.to_string(),
                        message: "a database of that name appeared while tend was creating it; it is not tend's".into(),
                    });
                }
                if !matches!(&e, ProviderError::Permanent { message, .. } if message.contains("42P04"))
                {
                    return Err(e);
                }
            }
        }
        let mut rest = request.fields.clone();
        for f in ["owner", "encoding", "locale", "template", "databaseName"] {
            if f != "owner" {
                rest.remove(f);
            }
        }
        self.apply_fields(&client, db, &rest).await?;
        drop(client);
        self.observe(db)
            .await?
            .ok_or_else(|| ProviderError::NotFound {
                resource: db.to_string(),
            })
    }

    async fn update(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let db = request.database_name.as_str();
        let client = self.client(db).await?;
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
            .await
            .map_err(|e| classify(db, e))?
            .is_some();
        if !exists {
            return Err(ProviderError::NotFound {
                resource: db.to_string(),
            });
        }
        self.apply_fields(&client, db, &request.fields).await?;
        self.apply_marker(&client, db, op, &request.labels).await?;
        drop(client);
        self.observe(db)
            .await?
            .ok_or_else(|| ProviderError::NotFound {
                resource: db.to_string(),
            })
    }

    async fn delete(&self, _op: &OperationId, database_name: &str) -> Result<(), ProviderError> {
        let db = database_name;
        let client = self.client(db).await?;
        let connections: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&db],
            )
            .await
            .map_err(|e| classify(db, e))?
            .get(0);
        if connections > 0 && !self.settings.force_drop {
            return Err(ProviderError::Retryable {
                resource: db.to_string(),
                message: format!(
                    "{connections} active connections; tend waits for them to end (set force_drop = true to drop with FORCE)"
                ),
            });
        }
        let force = if self.settings.force_drop {
            " WITH (FORCE)"
        } else {
            ""
        };
        client
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {}{force}",
                quote_ident(db)
            ))
            .await
            .map_err(|e| classify(db, e))?;
        client
            .execute(
                "DELETE FROM tend.databases WHERE database_name = $1",
                &[&db],
            )
            .await
            .map_err(|e| classify(db, e))?;
        Ok(())
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
