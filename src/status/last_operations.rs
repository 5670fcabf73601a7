//! Where a status render finds each resource's last operation: in a map
//! read before it (the few a commit over a known render renders), or read
//! from the state along the render, a thousand resources at a time (a
//! whole render).
//!
//! A whole render at 100,000 resources that read every last operation
//! first held them all beside the files it made: 26 MB of the running
//! agent's peak, at its cold start. Read along the render, it holds a
//! thousand.

use std::collections::HashMap;
use std::sync::Arc;

use super::report::ResourceReport;
use crate::journal::{LastOperation, StateError, StateStore};

/// The last operation of a report's entries, asked in the report's order.
pub(crate) trait LastOperationOf {
    /// The last operation of the report's `i`-th entry, named `name`.
    fn of(&mut self, i: usize, name: &str) -> Option<&LastOperation>;
}

impl LastOperationOf for HashMap<String, LastOperation> {
    fn of(&mut self, _: usize, name: &str) -> Option<&LastOperation> {
        self.get(name)
    }
}

/// Entries whose last operations one read takes (ten queries of a
/// hundred names).
const CHUNK: usize = 1000;

/// Every entry's last operation, read by name from the state as the
/// render reaches it: the entry asked and the next [`CHUNK`] - 1 at once.
/// It gives what [`StateStore::last_operations`] would (the newest of
/// each name), holding one chunk.
pub(crate) struct ReadAlong<'a> {
    store: &'a StateStore,
    resources: &'a [Arc<ResourceReport>],
    /// The entries `chunk` holds: `from..to`.
    from: usize,
    to: usize,
    chunk: HashMap<String, LastOperation>,
    /// The first read that failed (its entries have no last operation).
    failed: Option<StateError>,
}

impl<'a> ReadAlong<'a> {
    pub(crate) fn new(store: &'a StateStore, resources: &'a [Arc<ResourceReport>]) -> Self {
        ReadAlong {
            store,
            resources,
            from: 0,
            to: 0,
            chunk: HashMap::new(),
            failed: None,
        }
    }

    /// The first read that failed, if one did: a render made without
    /// every last operation it needed is not trusted by the next.
    pub(crate) fn failure(self) -> Option<StateError> {
        self.failed
    }
}

impl LastOperationOf for ReadAlong<'_> {
    fn of(&mut self, i: usize, name: &str) -> Option<&LastOperation> {
        if !(self.from..self.to).contains(&i) {
            let to = (i + CHUNK).min(self.resources.len()).max(i + 1);
            let names: Vec<&str> = self
                .resources
                .get(i..to)
                .unwrap_or_default()
                .iter()
                .map(|r| r.name.as_str())
                .collect();
            self.chunk = match self.store.last_operations_of(&names) {
                Ok(read) => read,
                Err(e) => {
                    self.failed.get_or_insert(e);
                    HashMap::new()
                }
            };
            (self.from, self.to) = (i, to);
        }
        self.chunk.get(name)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::journal::IntentState;
    use crate::model::SpecHash;

    type Outcome = Result<(), Box<dyn std::error::Error>>;

    /// Read along a render, in chunks, every entry's last operation is
    /// the one a whole read gives: across chunk boundaries, for a name
    /// with two operations, and none for a name without one.
    #[test]
    fn read_along_gives_what_a_whole_read_gives() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        let names: Vec<String> = (0..2 * CHUNK + 7).map(|i| format!("db-{i:05}")).collect();
        let hash = SpecHash::from("h");
        for (i, name) in names.iter().enumerate() {
            // Every third has none; every fifth has two.
            for n in (0..1 + usize::from(i % 5 == 0)).filter(|_| i % 3 != 0) {
                let op = format!("op-{i}-{n}");
                let at = UNIX_EPOCH + Duration::from_millis(1_000 + (i * 2 + n) as u64);
                let json = serde_json::json!({});
                store.begin_intent(&op, name, "update", &hash, 1, &json, at)?;
                store.finish_intent(&op, IntentState::Done, None, at)?;
            }
        }
        let whole = store.last_operations()?;
        assert_eq!(whole.len(), names.len() - names.len().div_ceil(3));
        let resources: Vec<Arc<ResourceReport>> = names
            .iter()
            .map(|name| {
                serde_json::from_value(serde_json::json!({
                    "name": name, "file": format!("{name}.yaml"), "state": "InSync",
                    "action": "None", "reason": "", "drift": [],
                }))
                .map(Arc::new)
            })
            .collect::<Result<_, _>>()?;
        let mut along = ReadAlong::new(&store, &resources);
        for (i, name) in names.iter().enumerate() {
            assert_eq!(along.of(i, name), whole.get(name), "{name}");
        }
        assert!(along.failure().is_none());
        Ok(())
    }
}
