//! The connection a state store runs its statements on: SQLite or a
//! PostgreSQL session, one set of calls for both.

use rusqlite::Connection;

use super::postgres::PgSession;
use super::sql::{self, Row, SqlError, SqlValue};

/// The connection a store runs its statements on.
#[derive(Debug)]
pub(in crate::journal) enum Backend {
    Sqlite(Connection),
    Postgres(PgSession),
}

impl Backend {
    pub(super) fn execute(&self, sql: &str, args: &[SqlValue]) -> Result<usize, SqlError> {
        match self {
            Backend::Sqlite(c) => sql::sqlite_execute(c, sql, args),
            Backend::Postgres(s) => s.execute(sql, args),
        }
    }

    pub(super) fn query(&self, sql: &str, args: &[SqlValue]) -> Result<Vec<Row>, SqlError> {
        match self {
            Backend::Sqlite(c) => sql::sqlite_query(c, sql, args),
            Backend::Postgres(s) => s.query(sql, args),
        }
    }

    pub(super) fn batch(&self, sql: &str) -> Result<(), SqlError> {
        match self {
            Backend::Sqlite(c) => c.execute_batch(sql).map_err(SqlError::from),
            Backend::Postgres(s) => s.batch(sql),
        }
    }

    /// Begins (SQLite: `BEGIN IMMEDIATE`, the write lock at once),
    /// commits or rolls back a transaction.
    pub(super) fn transaction(&self, control: sql::TxControl) -> Result<(), SqlError> {
        match self {
            Backend::Sqlite(c) => c
                .execute_batch(control.sqlite_sql())
                .map_err(SqlError::from),
            Backend::Postgres(s) => s.transaction(control),
        }
    }

    /// Calls `f` with each row (SQLite: one at a time, never the whole
    /// result in memory).
    pub(super) fn each(
        &self,
        sql: &str,
        args: &[SqlValue],
        f: &mut dyn FnMut(&Row) -> Result<(), SqlError>,
    ) -> Result<(), SqlError> {
        match self {
            Backend::Sqlite(c) => sql::sqlite_each(c, sql, args, f),
            Backend::Postgres(s) => s.query(sql, args)?.iter().try_for_each(f),
        }
    }
}
