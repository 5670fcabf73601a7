//! What `tend state check` and `tend state show` read: the backend's
//! integrity check plus tend's invariants, and a summary of the state.

use super::{BackendKind, StateError, StateStore};

impl StateStore {
    pub(super) fn count(&self, sql: &str) -> Result<i64, StateError> {
        self.row(sql, &[])?
            .map(|r| r.get::<i64>(0))
            .transpose()
            .map_err(|e| self.err(e))
            .map(Option::unwrap_or_default)
    }

    /// The backend's own integrity check (SQLite's `PRAGMA
    /// integrity_check`; PostgreSQL checks its own pages) plus tend's
    /// invariants; each problem is one line.
    pub fn check(&self) -> Result<Vec<String>, StateError> {
        let mut problems = Vec::new();
        if self.kind == BackendKind::Sqlite {
            let integrity = self.rows("PRAGMA integrity_check", &[])?;
            problems.extend(
                integrity
                    .iter()
                    .filter_map(|r| r.get::<String>(0).ok())
                    .filter(|l| l != "ok"),
            );
        }
        for key in ["format", "min_reader_format"] {
            if self.meta(key)?.is_none() {
                problems.push(format!("meta.{key} is missing"));
            }
        }
        let bad_states = self.count(
            "SELECT count(*) FROM intents WHERE state NOT IN ('pending', 'done', 'failed')",
        )?;
        if bad_states > 0 {
            problems.push(format!("{bad_states} intents have an unknown state"));
        }
        let corrupt = self
            .open_intents()?
            .into_iter()
            .filter_map(Result::err)
            .chain(self.tombstones()?.into_iter().filter_map(Result::err))
            .chain(self.local_overrides()?.into_iter().filter_map(Result::err));
        problems.extend(corrupt.map(|row| row.to_string()));
        Ok(problems)
    }

    /// A readable summary for `tend state show`.
    pub fn summary(&self) -> Result<String, StateError> {
        let (held, approved) = (self.held_deletions()?.len(), self.approvals()?.len());
        let mut out = String::new();
        // First: the id every managed database's ownership marker
        // carries, which a configuration must keep.
        out.push_str(&format!(
            "agent_id: {}\n",
            self.meta("agent_id")?
                .as_deref()
                .unwrap_or("(none yet: set at the first apply)")
        ));
        out.push_str(&format!("state: {}\n", self.location));
        for (k, v) in self.meta_all()? {
            if k != "changes" && k != "agent_id" {
                out.push_str(&format!("  {k}: {v}\n"));
            }
        }
        out.push_str(&format!(
            "  resources managed: {}\n  intents: {} pending, {} done, {} failed\n  tombstones: {}\n  local overrides: {}\n  deletions held by the guard: {}\n  deletions approved: {}\n",
            self.count("SELECT count(*) FROM resources WHERE existed = 1")?,
            self.count("SELECT count(*) FROM intents WHERE state = 'pending'")?,
            self.count("SELECT count(*) FROM intents WHERE state = 'done'")?,
            self.count("SELECT count(*) FROM intents WHERE state = 'failed'")?,
            self.count("SELECT count(*) FROM tombstones")?,
            self.count("SELECT count(*) FROM local_overrides")?,
            held,
            approved,
        ));
        Ok(out)
    }
}
