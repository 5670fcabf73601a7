//! The one SQL surface the state store is written against, so every query
//! is written once and runs on both backends: SQLite (the state dir) and
//! PostgreSQL (a state shared by several agents, [`super::postgres`]).
//!
//! Values are integers, text or NULL only (the schema has nothing else):
//! booleans are integers 0/1 and times milliseconds since the epoch, on
//! both backends. Statements use `?N` placeholders; the PostgreSQL session
//! rewrites them to `$N`. SQL that only one backend speaks (`PRAGMA`,
//! `sqlite_master`, advisory locks) stays in that backend's code.

use rusqlite::types::{ToSqlOutput, ValueRef};

/// A transaction's start or end, typed so a session knows when one is
/// open without reading SQL text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxControl {
    Begin,
    Commit,
    Rollback,
}

impl TxControl {
    /// The statement on PostgreSQL.
    pub(crate) fn postgres_sql(self) -> &'static str {
        match self {
            TxControl::Begin => "BEGIN",
            TxControl::Commit => "COMMIT",
            TxControl::Rollback => "ROLLBACK",
        }
    }

    /// The statement on SQLite: a writer takes the write lock at `BEGIN`
    /// (`IMMEDIATE`), so a busy database is found before any work.
    pub(crate) fn sqlite_sql(self) -> &'static str {
        match self {
            TxControl::Begin => "BEGIN IMMEDIATE",
            other => other.postgres_sql(),
        }
    }
}

/// A parameter or column value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SqlValue {
    Null,
    Int(i64),
    Text(String),
}

impl From<&str> for SqlValue {
    fn from(v: &str) -> Self {
        SqlValue::Text(v.to_string())
    }
}

impl From<&String> for SqlValue {
    fn from(v: &String) -> Self {
        SqlValue::Text(v.clone())
    }
}

impl From<String> for SqlValue {
    fn from(v: String) -> Self {
        SqlValue::Text(v)
    }
}

impl From<i64> for SqlValue {
    fn from(v: i64) -> Self {
        SqlValue::Int(v)
    }
}

impl From<u32> for SqlValue {
    fn from(v: u32) -> Self {
        SqlValue::Int(i64::from(v))
    }
}

impl From<usize> for SqlValue {
    fn from(v: usize) -> Self {
        SqlValue::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(v: Option<T>) -> Self {
        v.map_or(SqlValue::Null, Into::into)
    }
}

/// `?1, ?2, …, ?n`: the placeholders of `n` parameters, for a statement
/// whose parameter count is known only when it runs (a row of a table's
/// columns, a list of names).
pub(crate) fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `args![a, b]`: statement parameters, in `?1`, `?2` order.
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        &[$($crate::journal::store::sql::SqlValue::from($a)),*][..]
    };
}
pub(crate) use args;

impl rusqlite::ToSql for SqlValue {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            SqlValue::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            SqlValue::Int(i) => ToSqlOutput::Borrowed(ValueRef::Integer(*i)),
            SqlValue::Text(t) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
        })
    }
}

/// A failed statement, before the store names where.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL refused a statement (its message and SQLSTATE), or the
    /// connection failed under it.
    #[error("{}", super::postgres::error_text(.0))]
    Server(#[source] tokio_postgres::Error),
    /// The session could not connect to the PostgreSQL state.
    #[error("cannot connect: {}", super::postgres::error_text(.0))]
    Connect(#[source] tokio_postgres::Error),
    /// What the PostgreSQL session found itself: a transaction lost with
    /// its connection, a server that did not answer, a stopped session.
    #[error("{0}")]
    Postgres(String),
    /// The `[state] url` does not parse.
    #[error("invalid [state] url: {0}")]
    Url(#[source] tokio_postgres::Error),
    /// The `[state] tls_ca_file` cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::provider::tls::TlsError),
    /// The PostgreSQL session's runtime or thread could not be started.
    #[error("cannot start the state session's {what}: {source}")]
    Start {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A column did not hold the type the query reads.
    #[error("{0}")]
    Type(String),
    /// A savepoint of a transaction shared by several writes could not be
    /// released or undone: the whole transaction is rolled back.
    #[error("the transaction shared with other writes was lost: {0}")]
    Savepoint(String),
    /// A column could not be read as the type the query reads.
    #[error("column {index}: {source}")]
    Column {
        index: usize,
        #[source]
        source: tokio_postgres::Error,
    },
}

/// One result row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row(pub(super) Vec<SqlValue>);

/// A Rust value a column can be read as.
pub(crate) trait FromSqlValue: Sized {
    fn from_sql_value(v: &SqlValue) -> Option<Self>;
}

impl FromSqlValue for i64 {
    fn from_sql_value(v: &SqlValue) -> Option<Self> {
        match v {
            SqlValue::Int(i) => Some(*i),
            _ => None,
        }
    }
}

impl FromSqlValue for u32 {
    fn from_sql_value(v: &SqlValue) -> Option<Self> {
        i64::from_sql_value(v).map(|i| u32::try_from(i).unwrap_or(u32::MAX))
    }
}

impl FromSqlValue for bool {
    fn from_sql_value(v: &SqlValue) -> Option<Self> {
        i64::from_sql_value(v).map(|i| i != 0)
    }
}

impl FromSqlValue for String {
    fn from_sql_value(v: &SqlValue) -> Option<Self> {
        match v {
            SqlValue::Text(t) => Some(t.clone()),
            _ => None,
        }
    }
}

impl<T: FromSqlValue> FromSqlValue for Option<T> {
    fn from_sql_value(v: &SqlValue) -> Option<Self> {
        match v {
            SqlValue::Null => Some(None),
            v => T::from_sql_value(v).map(Some),
        }
    }
}

impl Row {
    /// Column `i`'s text, borrowed from the row: a read of every resource
    /// copies none of it that it does not keep. A value that is not text
    /// is an error naming the column.
    pub(crate) fn text(&self, i: usize) -> Result<&str, SqlError> {
        match self.0.get(i) {
            Some(SqlValue::Text(t)) => Ok(t),
            value => Err(SqlError::Type(format!(
                "column {i} holds {value:?}, not text"
            ))),
        }
    }

    /// Column `i` as a `T`; a NULL or a value of another type where `T`
    /// does not allow it is an error naming the column.
    pub(crate) fn get<T: FromSqlValue>(&self, i: usize) -> Result<T, SqlError> {
        let value = self.0.get(i).unwrap_or(&SqlValue::Null);
        T::from_sql_value(value).ok_or_else(|| {
            SqlError::Type(format!(
                "column {i} holds {value:?}, not a {}",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// Runs statements on one SQLite connection through its statement cache.
pub(super) fn sqlite_execute(
    conn: &rusqlite::Connection,
    sql: &str,
    args: &[SqlValue],
) -> Result<usize, SqlError> {
    let mut stmt = conn.prepare_cached(sql)?;
    Ok(stmt.execute(rusqlite::params_from_iter(args.iter()))?)
}

pub(super) fn sqlite_query(
    conn: &rusqlite::Connection,
    sql: &str,
    args: &[SqlValue],
) -> Result<Vec<Row>, SqlError> {
    let mut out = Vec::new();
    sqlite_each(conn, sql, args, &mut |row| {
        out.push(row.clone());
        Ok(())
    })?;
    Ok(out)
}

/// Calls `f` with each row in turn, one row buffer reused: a query over
/// every resource holds one row at a time, not the whole result.
pub(super) fn sqlite_each(
    conn: &rusqlite::Connection,
    sql: &str,
    args: &[SqlValue],
    f: &mut dyn FnMut(&Row) -> Result<(), SqlError>,
) -> Result<(), SqlError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let columns = stmt.column_count();
    let mut rows = stmt.query(rusqlite::params_from_iter(args.iter()))?;
    let mut row = Row(Vec::with_capacity(columns));
    while let Some(r) = rows.next()? {
        row.0.clear();
        for i in 0..columns {
            row.0.push(match r.get_ref(i)? {
                ValueRef::Null => SqlValue::Null,
                ValueRef::Integer(n) => SqlValue::Int(n),
                // The schema has no REAL columns; an aggregate might.
                ValueRef::Real(f) => SqlValue::Int(f as i64),
                ValueRef::Text(t) | ValueRef::Blob(t) => {
                    SqlValue::Text(String::from_utf8_lossy(t).into_owned())
                }
            });
        }
        f(&row)?;
    }
    Ok(())
}
