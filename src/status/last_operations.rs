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

use super::branch_files::{FileContent, Inputs, Rendered, render};
use super::report::{Report, ResourceReport};
use crate::journal::{DecidedFrom, LastOperation, StateError, StateStore};

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
/// render reaches it: the entry asked and the next [`CHUNK`] - 1 it will
/// ask at once. It gives what [`StateStore::last_operations`] would (the
/// newest of each name), holding one chunk.
///
/// Those `known` (read before the render: finished since the last
/// render, or read by name) are not read again, nor the entries
/// `skipped` (kept over the last render: the render asks nothing of
/// them). A render of the 20,000 resources a cold start added among
/// 80,000 kept read all 100,000 otherwise, and took twice as long.
pub(crate) struct ReadAlong<'a> {
    store: &'a StateStore,
    resources: &'a [Arc<ResourceReport>],
    known: &'a HashMap<String, LastOperation>,
    skipped: Option<&'a [bool]>,
    /// The entries `chunk` holds: `from..to`.
    from: usize,
    to: usize,
    chunk: HashMap<String, LastOperation>,
    /// How many names were read.
    read: usize,
    /// The first read that failed (its entries have no last operation).
    failed: Option<StateError>,
}

impl<'a> ReadAlong<'a> {
    pub(crate) fn new(
        store: &'a StateStore,
        resources: &'a [Arc<ResourceReport>],
        known: &'a HashMap<String, LastOperation>,
        skipped: Option<&'a [bool]>,
    ) -> Self {
        ReadAlong {
            store,
            resources,
            known,
            skipped,
            from: 0,
            to: 0,
            chunk: HashMap::new(),
            read: 0,
            failed: None,
        }
    }

    /// How many names were read, and the first read that failed, if one
    /// did: a render made without every last operation it needed is not
    /// trusted by the next.
    pub(crate) fn finish(self) -> (usize, Option<StateError>) {
        (self.read, self.failed)
    }

    /// Whether the render will ask entry `j` for a last operation not
    /// known yet.
    fn to_read(&self, j: usize, name: &str) -> bool {
        self.skipped
            .is_none_or(|skipped| skipped.get(j) != Some(&true))
            && !self.known.contains_key(name)
    }
}

impl LastOperationOf for ReadAlong<'_> {
    fn of(&mut self, i: usize, name: &str) -> Option<&LastOperation> {
        let known = self.known;
        if let Some(op) = known.get(name) {
            return Some(op);
        }
        if !(self.from..self.to).contains(&i) {
            let mut names = vec![name];
            let mut to = i + 1;
            for r in self.resources.get(to..).unwrap_or_default() {
                if names.len() >= CHUNK {
                    break;
                }
                if self.to_read(to, &r.name) {
                    names.push(r.name.as_str());
                }
                to += 1;
            }
            self.read += names.len();
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

/// [`render`], with each resource's last operation from `last_operations`,
/// or (`along`) read from that state along the render where it is not
/// there, except for the entries `inputs` has kept (the render asks
/// nothing of them): a read that fails is said, and sets `unread`.
pub(crate) fn render_reading(
    report: &Report,
    along: Option<&StateStore>,
    last_operations: &mut HashMap<String, LastOperation>,
    unread: &mut bool,
    decided: &DecidedFrom,
    inputs: Inputs<'_>,
    hold: &mut dyn FnMut(Vec<u8>) -> FileContent,
) -> Rendered {
    let Some(store) = along else {
        return render(report, last_operations, decided, inputs, hold);
    };
    let mut along = ReadAlong::new(store, &report.resources, last_operations, inputs.kept());
    let rendered = render(report, &mut along, decided, inputs, hold);
    let (read, failed) = along.finish();
    tracing::debug!("status branch: the last operations of {read} resources read along the render");
    if let Some(e) = failed {
        tracing::warn!("status branch: cannot read the last operations: {e}");
        *unread = true;
    }
    rendered
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
        let resources = reports(&names)?;
        let none = HashMap::new();
        let mut along = ReadAlong::new(&store, &resources, &none, None);
        for (i, name) in names.iter().enumerate() {
            assert_eq!(along.of(i, name), whole.get(name), "{name}");
        }
        let (read, failed) = along.finish();
        assert_eq!(read, names.len());
        assert!(failed.is_none());
        Ok(())
    }

    /// Read along a render over a known one, only what the render asks
    /// and does not know is read: the kept entries (every other here) and
    /// those known (every fourth) are not, and the rest of 2,007 entries
    /// fit one read of a thousand names, where the whole range took three.
    #[test]
    fn read_along_reads_neither_the_kept_nor_the_known() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        let names: Vec<String> = (0..2 * CHUNK + 7).map(|i| format!("db-{i:05}")).collect();
        let hash = SpecHash::from("h");
        for (i, name) in names.iter().enumerate() {
            let op = format!("op-{i}");
            let at = UNIX_EPOCH + Duration::from_millis(1_000 + i as u64);
            store.begin_intent(&op, name, "update", &hash, 1, &serde_json::json!({}), at)?;
            store.finish_intent(&op, IntentState::Done, None, at)?;
        }
        let whole = store.last_operations()?;
        let resources = reports(&names)?;
        let skipped: Vec<bool> = (0..names.len()).map(|i| i % 2 == 1).collect();
        let known: HashMap<String, LastOperation> = names
            .iter()
            .step_by(4)
            .filter_map(|name| Some((name.clone(), whole.get(name)?.clone())))
            .collect();
        let mut along = ReadAlong::new(&store, &resources, &known, Some(&skipped));
        let mut reads = 0;
        for (i, name) in names.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            let from = (along.from, along.to);
            assert_eq!(along.of(i, name), whole.get(name), "{name}");
            reads += usize::from((along.from, along.to) != from);
        }
        assert_eq!(
            reads,
            1,
            "one read of the {} asked and not known",
            names.len() / 4
        );
        let (read, failed) = along.finish();
        let asked_unknown = (0..names.len()).filter(|i| i % 4 == 2).count();
        assert_eq!(read, asked_unknown);
        assert!(failed.is_none());
        Ok(())
    }

    /// A report entry for each of `names`.
    fn reports(names: &[String]) -> Result<Vec<Arc<ResourceReport>>, serde_json::Error> {
        names
            .iter()
            .map(|name| {
                serde_json::from_value(serde_json::json!({
                    "name": name, "file": format!("{name}.yaml"), "state": "InSync",
                    "action": "None", "reason": "", "drift": [],
                }))
                .map(Arc::new)
            })
            .collect()
    }
}
