//! Changing databases: create (name reserved first), alter fields and the
//! ownership marker, drop. Every statement is idempotent, so a replay of
//! the same operation changes nothing.

use std::collections::BTreeMap;

use serde_json::Value;
use tokio_postgres::Client;

use super::{PostgresProvider, classify, quote_ident, quote_literal};
use crate::provider::setting_list::{self, POSTGRES_LIST_SETTINGS};
use crate::provider::{
    ChangeRequest, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, OperationId, Provider,
    ProviderError,
};

/// The comment on a role tend made, naming the database and the operation
/// it was made for: what lets a failed create drop that role and no other.
fn role_marker(database: &str, op: &OperationId) -> String {
    format!("tend: made as the owner of database {database:?} by operation {op}")
}

impl PostgresProvider {
    /// Makes the owner role when it is missing and `create_owner` allows:
    /// `NOLOGIN`, with tend's role a member (a role that is not a
    /// superuser must be one to create or alter a database owned by it),
    /// and marked with [`role_marker`], in one transaction.
    async fn ensure_role(
        &self,
        client: &Client,
        role: &str,
        database: &str,
        op: &OperationId,
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
        let ident = quote_ident(role);
        let made = client
            .batch_execute(&format!(
                "BEGIN; CREATE ROLE {ident} NOLOGIN; GRANT {ident} TO CURRENT_USER; COMMENT ON ROLE {ident} IS {}; COMMIT",
                quote_literal(&role_marker(database, op))
            ))
            .await;
        let Err(e) = made else {
            return Ok(());
        };
        // A failed statement stops the batch inside its transaction: end
        // it, or every later statement on this pooled connection fails
        // with 25P02 ("current transaction is aborted") and a create is
        // refused for good over it.
        let _ = client.batch_execute("ROLLBACK").await;
        // Another create made the same owner role meanwhile (two
        // declarations, one owner): it exists now, which is all this
        // needs.
        let raced = e.code().is_some_and(|c| {
            *c == tokio_postgres::error::SqlState::DUPLICATE_OBJECT
                || *c == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
        });
        if raced
            && client
                .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
                .await
                .is_ok_and(|row| row.is_some())
        {
            return Ok(());
        }
        Err(classify(database, e))
    }

    /// Drops `role` if this operation made it for `database` (its comment
    /// is still [`role_marker`]'s), after the create that needed it failed
    /// for good: a role made for nothing would be left behind. Best
    /// effort: a role that cannot be dropped is logged, never an error.
    async fn drop_made_role(&self, client: &Client, role: &str, database: &str, op: &OperationId) {
        let marked = client
            .query_opt(
                "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = $1",
                &[&role],
            )
            .await
            .ok()
            .flatten()
            .and_then(|row| row.get::<_, Option<String>>(0));
        if marked.as_deref() != Some(role_marker(database, op).as_str()) {
            return;
        }
        if let Err(e) = client
            .batch_execute(&format!("DROP ROLE {}", quote_ident(role)))
            .await
        {
            tracing::warn!(
                resource = database,
                "cannot drop the role {role:?} tend made for a create that failed: {}",
                classify(database, e)
            );
        }
    }

    /// Applies the mutable fields of a request (each statement idempotent).
    async fn apply_fields(
        &self,
        client: &Client,
        db: &str,
        op: &OperationId,
        fields: &BTreeMap<String, Value>,
    ) -> Result<(), ProviderError> {
        let ident = quote_ident(db);
        let mut statements = Vec::new();
        for (field, value) in fields {
            match (field.as_str(), value) {
                ("owner", Value::String(role)) => {
                    self.ensure_role(client, role, db, op).await?;
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
                    statements.push(parameter_statement(db, &ident, other, value)?);
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
            self.apply_extensions(db, extensions).await?;
        }
        Ok(())
    }

    /// Creates the declared extensions (in their schema, at their version)
    /// in `db`, through a connection to that database.
    async fn apply_extensions(&self, db: &str, extensions: &[Value]) -> Result<(), ProviderError> {
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
        op: &OperationId,
        sql: &str,
        request: &ChangeRequest,
    ) -> Result<(), ProviderError> {
        let owner = request.fields.get("owner").and_then(Value::as_str);
        if let Some(owner) = owner {
            self.ensure_role(client, owner, db, op).await?;
        }
        let created = client.batch_execute(sql).await.map_err(|e| classify(db, e));
        if let (Err(e), Some(owner)) = (&created, owner)
            && !e.is_transient()
            && !matches!(e, ProviderError::Permanent { message, .. } if message.contains("42P04"))
        {
            self.drop_made_role(client, owner, db, op).await;
        }
        created
    }

    /// Creates a database after reserving its name in the catalog (see
    /// the module docs: the reservation is what proves ownership after a
    /// lost response).
    pub(super) async fn create_reserved(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let db = request.database_name.as_str();
        let client = self.writer(db).await?;
        let label = |key: &str| request.labels.get(key).cloned().unwrap_or_default();
        let (agent, decl) = (label(OWNER_AGENT_LABEL), label(OWNER_DECLARATION_LABEL));
        // Reserve the name first: after a lost response the reservation
        // proves the database is ours.
        let inserted = reserve(&client, db, &agent, &decl, op).await?;
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
            .await
            .map_err(|e| classify(db, e))?
            .is_some();
        if exists && inserted {
            // It existed before our reservation: not ours.
            unreserve(&client, db, op, false).await?;
            return Err(ProviderError::Conflict {
                resource: db.to_string(),
                message: "a database of that name already exists and is not tend's".into(),
            });
        }
        if !exists {
            self.create_new(&client, db, op, request, inserted).await?;
        }
        let mut rest = request.fields.clone();
        for f in ["encoding", "locale", "template", "databaseName"] {
            rest.remove(f);
        }
        self.apply_fields(&client, db, op, &rest).await?;
        drop(client);
        self.observe(db)
            .await?
            .ok_or_else(|| ProviderError::NotFound {
                resource: db.to_string(),
            })
    }

    /// `CREATE DATABASE` under a reservation this operation holds
    /// (`inserted`: made by this call, not found from an earlier attempt).
    async fn create_new(
        &self,
        client: &Client,
        db: &str,
        op: &OperationId,
        request: &ChangeRequest,
        inserted: bool,
    ) -> Result<(), ProviderError> {
        let sql = create_statement(db, &request.fields);
        let Err(e) = self.create_database(client, db, op, &sql, request).await else {
            return Ok(());
        };
        // A reservation must never outlive a create that failed for good: a
        // database someone makes later by hand under that name would look
        // like tend's.
        if !e.is_transient() {
            unreserve(client, db, op, true).await?;
        }
        let exists_already =
            matches!(&e, ProviderError::Permanent { message, .. } if message.contains("42P04"));
        // "Already exists" (42P04) right after our own reservation means
        // someone else created it in between: not ours.
        if inserted && exists_already {
            unreserve(client, db, op, false).await?;
            return Err(ProviderError::Conflict {
                resource: db.to_string(),
                message:
                    "a database of that name appeared while tend was creating it; it is not tend's"
                        .into(),
            });
        }
        // "Already exists" under an earlier attempt's reservation is that
        // attempt's database: the create succeeded.
        if exists_already { Ok(()) } else { Err(e) }
    }

    pub(super) async fn alter(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let db = request.database_name.as_str();
        let client = self.writer(db).await?;
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
        self.apply_fields(&client, db, op, &request.fields).await?;
        self.apply_marker(&client, db, op, &request.labels).await?;
        drop(client);
        self.observe(db)
            .await?
            .ok_or_else(|| ProviderError::NotFound {
                resource: db.to_string(),
            })
    }

    pub(super) async fn drop_database(
        &self,
        _op: &OperationId,
        database_name: &str,
    ) -> Result<(), ProviderError> {
        let db = database_name;
        let client = self.writer(db).await?;
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

/// Reserves `db` for this agent and declaration under `op` in the catalog;
/// `true` when this call made the reservation. A name reserved for anyone
/// else is a conflict.
async fn reserve(
    client: &Client,
    db: &str,
    agent: &str,
    decl: &str,
    op: &OperationId,
) -> Result<bool, ProviderError> {
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
    Ok(inserted)
}

/// Drops this operation's reservation of `db` (`only_if_absent`: unless
/// the database exists after all).
async fn unreserve(
    client: &Client,
    db: &str,
    op: &OperationId,
    only_if_absent: bool,
) -> Result<(), ProviderError> {
    let sql = if only_if_absent {
        "DELETE FROM tend.databases WHERE database_name = $1 AND operation_id = $2 \
         AND NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)"
    } else {
        "DELETE FROM tend.databases WHERE database_name = $1 AND operation_id = $2"
    };
    client
        .execute(sql, &[&db, &op.0])
        .await
        .map(|_| ())
        .map_err(|e| classify(db, e))
}

/// The `CREATE DATABASE` statement for the fixed-at-creation fields
/// (owner, encoding, locale, template; a declared encoding or locale needs
/// `template0`).
fn create_statement(db: &str, fields: &BTreeMap<String, Value>) -> String {
    let mut sql = format!("CREATE DATABASE {}", quote_ident(db));
    let text = |f: &str| fields.get(f).and_then(Value::as_str);
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
    sql
}

/// `ALTER DATABASE … SET|RESET` for `parameters.<key>` (`null` resets).
fn parameter_statement(
    db: &str,
    ident: &str,
    field: &str,
    value: &Value,
) -> Result<String, ProviderError> {
    let key = &field["parameters.".len()..];
    if !crate::model::fields::is_parameter_name(key) {
        return Err(ProviderError::Permanent {
            resource: db.to_string(),
            message: format!("`{key}` is not a parameter name"),
        });
    }
    let setting = quote_ident(key);
    let text = match value {
        Value::Null => return Ok(format!("ALTER DATABASE {ident} RESET {setting}")),
        Value::String(v) => v.clone(),
        other => other.to_string(),
    };
    // A list setting is sent as its elements, one literal each: as one
    // literal it would be one element (see `setting_list`).
    let value = match setting_list::find(POSTGRES_LIST_SETTINGS, key) {
        Some(_) => match setting_list::split(&text) {
            Some(elements) if elements.is_empty() => quote_literal(""),
            Some(elements) => elements
                .iter()
                .map(|e| quote_literal(e))
                .collect::<Vec<_>>()
                .join(", "),
            None => {
                return Err(ProviderError::Permanent {
                    resource: db.to_string(),
                    message: format!(
                        "parameters.{key}: `{text}` is not a list PostgreSQL accepts (elements separated by commas, each a name or a double-quoted string)"
                    ),
                });
            }
        },
        None => quote_literal(&text),
    };
    Ok(format!("ALTER DATABASE {ident} SET {setting} = {value}"))
}
