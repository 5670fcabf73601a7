//! The PostgreSQL state backend's session: one connection, owned by a
//! thread of its own that runs it on a private single-threaded runtime.
//!
//! The store is synchronous (SQLite blocks, and the store's callers
//! already run it off the async workers), so a statement is sent to that
//! thread and the caller waits for its answer. This works the same from a
//! blocking thread, a test or a one-shot command, whatever runtime (if
//! any) the caller is on.
//!
//! # Guarantees
//! * A transaction never spans two connections: when the connection is
//!   lost inside one, every later statement of it fails until its
//!   `COMMIT`/`ROLLBACK` (the server rolled it back), and only then does
//!   the session reconnect. Half a transaction is never committed.
//! * Statements that take longer than [`STATEMENT_TIMEOUT`] (a network
//!   that stopped answering) fail, and the connection is dropped.

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::sql::{Row, SqlError, SqlValue, TxControl};
use crate::journal::StateError;

/// How long one statement may take before the connection is given up.
pub(crate) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the shared state lives (`[state] backend = "postgres"`).
#[derive(Clone)]
pub struct PgStateSettings {
    /// libpq-style URL of the database holding the state schema.
    pub url: String,
    pub password: Option<String>,
    /// The schema tend's tables live in (one per agent group).
    pub schema: String,
    pub tls_ca_file: Option<std::path::PathBuf>,
}

impl PgStateSettings {
    /// `[state]`'s PostgreSQL settings (its password read), or `None` for
    /// the SQLite state dir.
    pub fn from_config(
        state: &crate::config::StateConfig,
    ) -> Result<Option<PgStateSettings>, StateError> {
        if state.backend != crate::config::StateBackend::Postgres {
            return Ok(None);
        }
        let url = state.url.clone().unwrap_or_default();
        let password = match &state.password_file {
            Some(file) => Some(
                crate::config::secret::read("[state] password_file", file).map_err(|e| {
                    StateError::Refused {
                        path: file.display().to_string(),
                        problem: e.to_string(),
                    }
                })?,
            ),
            None => None,
        };
        Ok(Some(PgStateSettings {
            url,
            password,
            schema: state.schema.clone(),
            tls_ca_file: state.tls_ca_file.clone(),
        }))
    }
}

impl std::fmt::Debug for PgStateSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStateSettings")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("schema", &self.schema)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
}

impl PgStateSettings {
    /// The URL without a password, and the schema: how logs and errors
    /// name this state.
    pub fn location(&self) -> String {
        let url = match self.url.parse::<tokio_postgres::Config>() {
            Ok(c) => {
                let host = c
                    .get_hosts()
                    .first()
                    .map(|h| match h {
                        tokio_postgres::config::Host::Tcp(h) => h.clone(),
                        tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                    })
                    .unwrap_or_default();
                let port = c.get_ports().first().copied().unwrap_or(5432);
                format!(
                    "postgres://{}@{host}:{port}/{}",
                    c.get_user().unwrap_or(""),
                    c.get_dbname().unwrap_or("")
                )
            }
            Err(_) => "postgres://(invalid url)".into(),
        };
        format!("{url} schema {}", self.schema)
    }
}

/// Quotes an identifier for PostgreSQL.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

enum Kind {
    Execute,
    Query,
    Batch,
    /// Transaction control, typed so the session knows when one is open
    /// (never by comparing SQL text).
    Tx(TxControl),
}

enum Reply {
    Count(u64),
    Rows(Vec<Row>),
    Done,
}

struct Job {
    kind: Kind,
    sql: String,
    args: Vec<SqlValue>,
    reply: std::sync::mpsc::Sender<Result<Reply, SqlError>>,
}

/// A handle on the session thread; dropping it ends the thread.
pub(crate) struct PgSession {
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
}

impl std::fmt::Debug for PgSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgSession")
    }
}

impl PgSession {
    /// Starts the session thread. It connects at the first statement (and
    /// again after a lost connection).
    pub(crate) fn start(settings: &PgStateSettings) -> Result<Self, SqlError> {
        let mut config: tokio_postgres::Config = settings.url.parse().map_err(SqlError::Url)?;
        if let Some(password) = &settings.password {
            config.password(password.as_bytes());
        }
        config
            .application_name("tend-state")
            .connect_timeout(Duration::from_secs(10))
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10));
        let tls = crate::provider::tls::connector(settings.tls_ca_file.as_deref())
            .map_err(SqlError::Tls)?;
        let schema = settings.schema.clone();
        let (jobs, rx) = tokio::sync::mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| SqlError::Start {
                what: "runtime",
                source,
            })?;
        std::thread::Builder::new()
            .name("tend-state-pg".into())
            .spawn(move || runtime.block_on(serve(config, tls, schema, rx)))
            .map_err(|source| SqlError::Start {
                what: "thread",
                source,
            })?;
        Ok(PgSession { jobs })
    }

    fn call(&self, kind: Kind, sql: &str, args: &[SqlValue]) -> Result<Reply, SqlError> {
        let (reply, answer) = std::sync::mpsc::channel();
        let stopped = || SqlError::Postgres("the state database session has stopped".into());
        self.jobs
            .send(Job {
                kind,
                sql: sql.to_string(),
                args: args.to_vec(),
                reply,
            })
            .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }

    pub(crate) fn execute(&self, sql: &str, args: &[SqlValue]) -> Result<usize, SqlError> {
        match self.call(Kind::Execute, sql, args)? {
            Reply::Count(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => Ok(0),
        }
    }

    pub(crate) fn query(&self, sql: &str, args: &[SqlValue]) -> Result<Vec<Row>, SqlError> {
        match self.call(Kind::Query, sql, args)? {
            Reply::Rows(rows) => Ok(rows),
            _ => Ok(Vec::new()),
        }
    }

    pub(crate) fn batch(&self, sql: &str) -> Result<(), SqlError> {
        self.call(Kind::Batch, sql, &[]).map(|_| ())
    }

    /// Begins, commits or rolls back the session's transaction.
    pub(crate) fn transaction(&self, control: TxControl) -> Result<(), SqlError> {
        self.call(Kind::Tx(control), control.postgres_sql(), &[])
            .map(|_| ())
    }
}

struct Live {
    client: Client,
    statements: HashMap<String, Statement>,
}

async fn serve(
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    schema: String,
    mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>,
) {
    let mut live: Option<Live> = None;
    let mut in_tx = false;
    while let Some(job) = jobs.recv().await {
        let begins = matches!(job.kind, Kind::Tx(TxControl::Begin));
        let ends = matches!(job.kind, Kind::Tx(TxControl::Commit | TxControl::Rollback));
        if live.as_ref().is_some_and(|l| l.client.is_closed()) {
            live = None;
        }
        let result = match live.as_mut() {
            None if in_tx => Err(SqlError::Postgres(
                "the connection to the state database was lost inside a transaction: the server rolled it back".into(),
            )),
            _ => {
                if live.is_none() {
                    match connect(&config, &tls, &schema).await {
                        Ok(l) => live = Some(l),
                        Err(e) => {
                            let _ = job.reply.send(Err(e));
                            continue;
                        }
                    }
                }
                let Some(session) = live.as_mut() else {
                    continue;
                };
                match tokio::time::timeout(STATEMENT_TIMEOUT, session.run(&job)).await {
                    Ok(result) => result,
                    Err(_) => {
                        live = None;
                        Err(SqlError::Postgres(format!(
                            "the state database did not answer within {}s; the connection was dropped",
                            STATEMENT_TIMEOUT.as_secs()
                        )))
                    }
                }
            }
        };
        if begins && result.is_ok() {
            in_tx = true;
        }
        if ends {
            in_tx = false;
        }
        let _ = job.reply.send(result);
    }
}

async fn connect(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    schema: &str,
) -> Result<Live, SqlError> {
    let (client, connection) = config
        .connect(tls.clone())
        .await
        .map_err(SqlError::Connect)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
        .batch_execute(&format!(
            "SET standard_conforming_strings = on; SET search_path TO {}",
            quote_ident(schema)
        ))
        .await
        .map_err(SqlError::Server)?;
    Ok(Live {
        client,
        statements: HashMap::new(),
    })
}

/// A PostgreSQL error with its SQLSTATE, or the connection error with its
/// causes (TLS failures hide in the source).
pub(crate) fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => crate::provider::postgres::connect_error(e),
    }
}

/// `?N` placeholders as PostgreSQL's `$N` (tend's SQL has no `?` in
/// literals).
fn dollar_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

type Param = Box<dyn ToSql + Sync + Send>;

/// A parameter as the type the server inferred for it.
fn param(value: &SqlValue, ty: &Type) -> Result<Param, SqlError> {
    let text = matches!(
        *ty,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN
    );
    let mismatch = || SqlError::Type(format!("cannot send {value:?} as a {ty}"));
    Ok(match value {
        SqlValue::Null => match *ty {
            Type::INT8 => Box::new(None::<i64>),
            Type::INT4 => Box::new(None::<i32>),
            Type::INT2 => Box::new(None::<i16>),
            Type::BOOL => Box::new(None::<bool>),
            _ => Box::new(None::<String>),
        },
        SqlValue::Int(i) => match *ty {
            Type::INT8 => Box::new(*i),
            Type::INT4 => Box::new(i32::try_from(*i).map_err(|_| mismatch())?),
            Type::INT2 => Box::new(i16::try_from(*i).map_err(|_| mismatch())?),
            Type::BOOL => Box::new(*i != 0),
            _ if text => Box::new(i.to_string()),
            _ => return Err(mismatch()),
        },
        SqlValue::Text(t) => match *ty {
            _ if text => Box::new(t.clone()),
            Type::INT8 => Box::new(t.parse::<i64>().map_err(|_| mismatch())?),
            _ => return Err(mismatch()),
        },
    })
}

fn column(row: &tokio_postgres::Row, i: usize) -> Result<SqlValue, SqlError> {
    let ty = row.columns()[i].type_().clone();
    let err = |source: tokio_postgres::Error| SqlError::Column { index: i, source };
    let int = |v: Option<i64>| v.map_or(SqlValue::Null, SqlValue::Int);
    Ok(match ty {
        Type::INT8 => int(row.try_get::<_, Option<i64>>(i).map_err(err)?),
        Type::INT4 => int(row
            .try_get::<_, Option<i32>>(i)
            .map_err(err)?
            .map(i64::from)),
        Type::INT2 => int(row
            .try_get::<_, Option<i16>>(i)
            .map_err(err)?
            .map(i64::from)),
        Type::BOOL => int(row
            .try_get::<_, Option<bool>>(i)
            .map_err(err)?
            .map(i64::from)),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => row
            .try_get::<_, Option<String>>(i)
            .map_err(err)?
            .map_or(SqlValue::Null, SqlValue::Text),
        other => {
            return Err(SqlError::Type(format!(
                "column {i} has type {other}, which the state store does not read"
            )));
        }
    })
}

impl Live {
    async fn run(&mut self, job: &Job) -> Result<Reply, SqlError> {
        let pg = SqlError::Server;
        if let Kind::Batch | Kind::Tx(_) = job.kind {
            self.client.batch_execute(&job.sql).await.map_err(pg)?;
            return Ok(Reply::Done);
        }
        let statement = match self.statements.get(&job.sql) {
            Some(s) => s.clone(),
            None => {
                let s = self
                    .client
                    .prepare(&dollar_placeholders(&job.sql))
                    .await
                    .map_err(pg)?;
                self.statements.insert(job.sql.clone(), s.clone());
                s
            }
        };
        let params = job
            .args
            .iter()
            .zip(statement.params())
            .map(|(v, ty)| param(v, ty))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&(dyn ToSql + Sync)> = params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        match job.kind {
            Kind::Execute => Ok(Reply::Count(
                self.client.execute(&statement, &refs).await.map_err(pg)?,
            )),
            _ => {
                let rows = self.client.query(&statement, &refs).await.map_err(pg)?;
                rows.iter()
                    .map(|r| (0..r.len()).map(|i| column(r, i)).collect::<Result<_, _>>())
                    .map(|r| r.map(Row))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Reply::Rows)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn question_placeholders_become_dollar_ones() {
        assert_eq!(
            super::dollar_placeholders("SELECT a FROM t WHERE b = ?1 AND c = ?12 OR d = '?'"),
            "SELECT a FROM t WHERE b = $1 AND c = $12 OR d = '?'"
        );
    }
}
