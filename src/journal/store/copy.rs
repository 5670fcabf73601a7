//! `tend state migrate`: a SQLite state copied whole into an empty
//! PostgreSQL schema, in one transaction on the target (a failure leaves
//! the target as it was).

use super::sql::args;
use super::{BackendKind, StateStore};
use crate::journal::StateError;

/// Every table and its columns, in an order that needs no deferred
/// constraints (there are none), at this binary's format.
const TABLES: &[(&str, &str)] = &[
    (
        "resources",
        "name, provider, database_name, file, applied_spec_hash, applied_fields, applied_commit, external_id, existed, manifest, last_write_ms, updated_ms",
    ),
    ("drift_seen", "name, field, first_seen_ms"),
    ("attempts", "name, field, count, desired, observed"),
    (
        "intents",
        "op_id, name, kind, spec_hash, generation, request, state, attempts, last_error, created_ms, updated_ms",
    ),
    (
        "tombstones",
        "name, manifest, removed_ms, removal_commit, delete_requested_ms, last_error",
    ),
    ("local_overrides", "name, annotations, set_ms"),
    ("override_seen", "name, source, fingerprint, first_seen_ms"),
    ("deletion_holds", "name, since_ms, due_together"),
    ("deletion_approvals", "name, reason, approved_ms"),
    ("pruned_generations", "name, kind, spec_hash, count"),
    ("notify_conditions", "subject, condition, since_ms"),
    (
        "notify_outbox",
        "id, receiver, event, subject, body, attempts, next_ms, created_ms, last_error",
    ),
    ("status_decided", "name, digest, commit_id"),
    (
        "failures",
        "name, op_id, kind, spec_hash, observed, message, failed_ms",
    ),
    (
        "releases",
        "name, provider, database_name, file, op_id, removal_commit, released_ms, shown",
    ),
    ("notify_marks", "receiver, mark"),
];

/// `meta` keys that describe the state's content (the format keys belong
/// to each backend's own layout).
const COPIED_META: &[&str] = &["agent_id", "suspension", super::finished::REFINISHED];

impl StateStore {
    /// Copies this (SQLite) state into `target` (PostgreSQL), which must
    /// hold no state yet; the rows copied, by table.
    pub fn copy_into(&self, target: &StateStore) -> Result<Vec<(&'static str, usize)>, StateError> {
        if self.kind != BackendKind::Sqlite || target.kind != BackendKind::Postgres {
            return Err(StateError::Refused {
                path: target.location.clone(),
                problem: "a state is copied from a SQLite state dir into a PostgreSQL schema"
                    .into(),
            });
        }
        let mut occupied = Vec::new();
        for (table, _) in TABLES {
            let rows = target.count(&format!("SELECT count(*) FROM {table}"))?;
            if rows > 0 {
                occupied.push(format!("{rows} rows in {table}"));
            }
        }
        if let Some(id) = target.meta("agent_id")? {
            occupied.push(format!("agent_id {id}"));
        }
        if !occupied.is_empty() {
            return Err(StateError::Refused {
                path: target.location.clone(),
                problem: format!(
                    "holds a state already ({}): tend copies only into an empty schema, never over a state. Choose another schema, or drop this one if it is certainly unused",
                    occupied.join(", ")
                ),
            });
        }
        let mut copied = Vec::new();
        let rows: Vec<_> = TABLES
            .iter()
            .map(|(table, columns)| {
                self.rows(&format!("SELECT {columns} FROM {table}"), &[])
                    .map(|r| (*table, *columns, r))
            })
            .collect::<Result<_, _>>()?;
        let meta: Vec<(String, Option<String>)> = COPIED_META
            .iter()
            .map(|k| self.meta(k).map(|v| (k.to_string(), v)))
            .collect::<Result<_, _>>()?;
        target.write(|tx| {
            for (table, columns, rows) in &rows {
                let sql = format!(
                    "INSERT INTO {table} ({columns}) VALUES ({})",
                    super::sql::placeholders(columns.split(',').count())
                );
                for row in rows {
                    tx.exec(&sql, &row.0)?;
                }
                copied.push((*table, rows.len()));
            }
            tx.query(
                "SELECT setval(pg_get_serial_sequence('notify_outbox', 'id'), coalesce(max(id), 0) + 1, false)::text FROM notify_outbox",
                &[],
            )?;
            for (key, value) in &meta {
                if let Some(value) = value {
                    tx.exec(
                        "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        args![key, value],
                    )?;
                }
            }
            Ok(())
        })?;
        Ok(copied)
    }
}
