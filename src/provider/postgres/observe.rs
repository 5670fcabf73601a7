//! Observing: one catalog query for every server-level field of every
//! named database; extensions only where a declaration manages
//! them (a connection per database).

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{Value, json};
use tokio_postgres_rustls::MakeRustlsConnect;

use tokio::sync::Semaphore;

use super::{PostgresProvider, classify, open, retryable};
use crate::model::FlatMap;
use crate::provider::setting_list::{self, POSTGRES_LIST_SETTINGS};
use crate::provider::{
    OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, ProviderError, ResourceStatus,
};

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

/// Which observed databases' extensions are read (a connection each).
#[derive(Clone, Copy)]
pub(super) enum Deep<'a> {
    /// These.
    Of(&'a [String]),
    /// Every database asked for by name.
    Named,
    /// Those this says (a listing of the whole server: only the ones
    /// worth a connection).
    Where(&'a (dyn Fn(&str) -> bool + Sync)),
}

/// Which databases an observation lists.
#[derive(Clone, Copy)]
pub(super) enum Listed<'a> {
    /// The named ones (a cycle names every resource it decides; a
    /// database that only carries tend's marker would be dropped unread).
    Named { names: &'a [String] },
    /// Every database of the server but its templates (`datistemplate`:
    /// a connection to one makes a concurrent `CREATE DATABASE` from it
    /// fail, and no tenant's data lives there).
    Everything,
}

impl PostgresProvider {
    /// The databases `listed` names, their extensions as `deep` says.
    /// Extension queries run concurrently, bounded by the pool size.
    pub(super) async fn observe_where(
        &self,
        listed: Listed<'_>,
        deep: Deep<'_>,
    ) -> Result<Vec<Observation>, ProviderError> {
        let (names, everything) = match listed {
            Listed::Named { names } => (names, false),
            Listed::Everything => (&[][..], true),
        };
        let client = self.client("*").await?;
        // Before the first write there is no catalog (plan never makes
        // it): no database carries a marker yet, which is what an empty
        // catalog would say.
        let markers = if self.has_catalog(&client, "*").await? {
            "tend.databases"
        } else {
            tracing::info!(
                "tend's catalog (tend.databases) does not exist in the maintenance database yet: no database carries tend's marker; the first apply creates it"
            );
            "(SELECT NULL::text AS database_name, NULL::text AS agent_id, NULL::text AS declaration WHERE false)"
        };
        let rows = client
            .query(
                &format!(
                    "SELECT d.datname, d.oid::text, r.rolname, pg_encoding_to_char(d.encoding), d.datcollate, \
                        d.datconnlimit, d.datallowconn, sd.description, coalesce(s.setconfig, '{{}}'::text[]), \
                        t.agent_id, t.declaration \
                 FROM pg_database d \
                 JOIN pg_roles r ON r.oid = d.datdba \
                 LEFT JOIN pg_shdescription sd ON sd.objoid = d.oid AND sd.classoid = 'pg_database'::regclass \
                 LEFT JOIN pg_db_role_setting s ON s.setdatabase = d.oid AND s.setrole = 0 \
                 LEFT JOIN {markers} t ON t.database_name = d.datname \
                 WHERE ($2 AND NOT d.datistemplate) OR d.datname = ANY($1)"
                ),
                &[&names, &everything],
            )
            .await
            .map_err(|e| classify("*", e))?;
        drop(client);
        let mut out = Vec::with_capacity(rows.len());
        let mut extension_queries = Vec::new();
        for row in rows {
            let (name, fields, labels, allow) = server_fields(&row);
            // Extensions need a connection to the database itself: only for
            // databases that accept connections and whose extensions are
            // wanted; otherwise they are unknown, not absent.
            let wanted = match deep {
                Deep::Of(deep) => deep.contains(&name),
                Deep::Named => names.contains(&name),
                Deep::Where(wanted) => wanted(&name),
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
        self.observe_extensions(&mut out, extension_queries).await?;
        Ok(out)
    }

    /// Adds the extensions of `databases` (one connection each, at most the
    /// pool size at once) to their observations.
    async fn observe_extensions(
        &self,
        out: &mut [Observation],
        databases: Vec<String>,
    ) -> Result<(), ProviderError> {
        let limit = std::sync::Arc::new(Semaphore::new(self.settings.max_connections.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        for name in databases {
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
        for obs in out.iter_mut() {
            match found.remove(&obs.database_name) {
                Some(Ok(extensions)) => {
                    obs.fields.insert("extensions", extensions);
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
        Ok(())
    }
}

/// The server-level fields of one `pg_database` row, its ownership marker
/// (from tend's catalog) and whether it accepts connections.
fn server_fields(row: &tokio_postgres::Row) -> (String, FlatMap<Value>, FlatMap<String>, bool) {
    let name: String = row.get(0);
    let mut fields = FlatMap::new();
    fields.insert("databaseName", json!(name));
    fields.insert("owner", json!(row.get::<_, String>(2)));
    fields.insert("encoding", json!(row.get::<_, String>(3)));
    fields.insert("locale", json!(row.get::<_, String>(4)));
    fields.insert("connectionLimit", json!(row.get::<_, i32>(5)));
    let allow: bool = row.get(6);
    fields.insert("allowConnections", json!(allow));
    if let Some(comment) = row.get::<_, Option<String>>(7) {
        fields.insert("comment", json!(comment));
    }
    for setting in row.get::<_, Vec<String>>(8) {
        if let Some((k, v)) = setting.split_once('=') {
            // A list setting as the declaration's side is compared.
            let v = setting_list::find(POSTGRES_LIST_SETTINGS, k)
                .and_then(|s| setting_list::canonical(s, v))
                .unwrap_or_else(|| v.to_string());
            fields.insert(format!("parameters.{k}"), json!(v));
        }
    }
    let mut labels = FlatMap::new();
    if let (Some(agent), Some(decl)) = (
        row.get::<_, Option<String>>(9),
        row.get::<_, Option<String>>(10),
    ) {
        labels.insert(OWNER_AGENT_LABEL.to_string(), agent);
        labels.insert(OWNER_DECLARATION_LABEL.to_string(), decl);
    }
    (name, fields, labels, allow)
}
