//! What the status step reads from the state: each resource's last
//! finished operation (the status branch shows it).

use std::collections::HashMap;
use std::time::SystemTime;

use super::{StateStore, time};
use crate::journal::StateError;

/// The newest finished operation of a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastOperation {
    pub id: String,
    pub kind: String,
    /// `done` or `failed`.
    pub result: String,
    /// Why it failed (or the last error before it succeeded).
    pub error: Option<String>,
    pub finished_at: SystemTime,
}

impl StateStore {
    /// The newest finished (done or failed) operation of every resource
    /// that has one.
    pub fn last_operations(&self) -> Result<HashMap<String, LastOperation>, StateError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT i.name, i.op_id, i.kind, i.state, i.last_error, i.updated_ms FROM intents i \
                 JOIN (SELECT name, MAX(updated_ms) AS newest FROM intents \
                       WHERE state IN ('done', 'failed') GROUP BY name) n \
                 ON n.name = i.name AND n.newest = i.updated_ms \
                 WHERE i.state IN ('done', 'failed') ORDER BY i.op_id",
            )
            .map_err(|e| self.err(e))?;
        let mut rows = stmt.query([]).map_err(|e| self.err(e))?;
        let mut out = HashMap::new();
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let name: String = r.get(0).map_err(|e| self.err(e))?;
            let op = LastOperation {
                id: r.get(1).map_err(|e| self.err(e))?,
                kind: r.get(2).map_err(|e| self.err(e))?,
                result: r.get(3).map_err(|e| self.err(e))?,
                error: r.get(4).map_err(|e| self.err(e))?,
                finished_at: time(r.get(5).map_err(|e| self.err(e))?),
            };
            // Two finished in the same millisecond: one, always the same.
            out.entry(name).or_insert(op);
        }
        Ok(out)
    }
}
