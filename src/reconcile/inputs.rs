//! What a cycle reads from the state store, in one pass on a blocking
//! thread: memories, tombstones, the last declarations of resources that
//! left Git, local overrides, override first-sightings, open intents, and
//! the deletion guard's holds and approvals.
//!
//! `plan` and `apply` read through this one loader; only `apply` commits
//! what the planner derives from it.
//!
//! # Guarantees
//! * Nothing unreadable becomes a default. A row that fails to parse is
//!   kept in [`Inputs::corrupt`] under its resource, and that resource is
//!   reported `Error` and left alone: no action without evidence.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::engine::HeldDeletion;
use crate::executor::PlannedOperation;
use crate::journal::{
    Approval, CorruptRow, LocalOverride, OverrideSeen, StateError, StateStore, TombstoneRow,
};
use crate::source::Snapshot;

pub(crate) use crate::memories::{LeftGit, Memories, MemoryCache, SharedMemories};

/// How a load gets the memories.
#[derive(Debug)]
pub(crate) enum MemoryRead {
    /// Current memories, through the agent's cache.
    Fresh(Arc<MemoryCache>),
    /// None (the journal and the overrides are all that is needed).
    Skip,
}

/// A journalled operation not confirmed yet.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PendingIntent {
    pub op: PlannedOperation,
    pub last_error: Option<String>,
    /// Calls sent under its id so far.
    pub attempts: u32,
    /// When it was last tried (or journalled).
    pub last_attempt: std::time::SystemTime,
}

/// Everything a cycle reads from the state.
#[derive(Debug, Default)]
pub(crate) struct Inputs {
    pub memories: Memories,
    pub tombstones: Vec<TombstoneRow>,
    pub left_git: Vec<LeftGit>,
    pub local_overrides: HashMap<String, LocalOverride>,
    /// First sightings by (resource, override source).
    pub overrides_seen: HashMap<(String, String), OverrideSeen>,
    /// Pending intents, oldest first.
    pub pending: Vec<PendingIntent>,
    pub approvals: HashMap<String, Approval>,
    pub held_deletions: HashMap<String, HeldDeletion>,
    /// Unreadable rows, by resource.
    pub corrupt: BTreeMap<String, Vec<String>>,
    /// The agent-wide freeze (`tend suspend`), if one is set.
    pub suspension: Option<crate::engine::Suspension>,
    /// The databases tend released, and whether each was shown yet.
    pub releases: Vec<(crate::journal::Release, bool)>,
}

impl Inputs {
    fn corrupt_row(&mut self, row: CorruptRow) {
        self.corrupt
            .entry(row.name.clone())
            .or_default()
            .push(row.to_string());
    }

    /// Reads the inputs of a cycle over `snapshot`. `memories`: read them
    /// (reusing what was read ahead if nothing was written since), or skip
    /// them (replaying the journal needs none).
    pub(crate) fn load(
        store: &StateStore,
        snapshot: &Arc<Snapshot>,
        memories: MemoryRead,
    ) -> Result<Inputs, StateError> {
        let mut inputs = Inputs {
            suspension: store.suspension()?,
            releases: store.releases()?,
            ..Inputs::default()
        };
        let shared = match memories {
            MemoryRead::Skip => Arc::new(SharedMemories::default()),
            MemoryRead::Fresh(cache) => cache.current(store)?,
        };
        let derived = shared.derived(snapshot);
        inputs.memories = Memories::over(shared);
        inputs.read_applied_fields(store, &derived.changed)?;
        let tombstoned: HashSet<String> = store
            .tombstones()?
            .into_iter()
            .map(|row| match row {
                Ok(t) => {
                    let name = t.name.clone();
                    inputs.tombstones.push(t);
                    name
                }
                Err(corrupt) => {
                    let name = corrupt.name.clone();
                    inputs.corrupt_row(corrupt);
                    name
                }
            })
            .collect();
        // Managed and no longer declared: found from the memories already
        // read, so only those few rows are read again.
        for name in derived
            .undeclared
            .iter()
            .filter(|n| !tombstoned.contains(*n))
        {
            match store.manifest_and_file(name)? {
                Some(Ok((last, file))) => inputs.left_git.push(LeftGit {
                    name: name.clone(),
                    last,
                    file,
                }),
                Some(Err(corrupt)) => inputs.corrupt_row(corrupt),
                None => {}
            }
        }
        for row in store.local_overrides()? {
            match row {
                Ok(o) => {
                    inputs.local_overrides.insert(o.name.clone(), o);
                }
                Err(corrupt) => inputs.corrupt_row(corrupt),
            }
        }
        inputs.overrides_seen = store.overrides_seen()?;
        for row in store.open_intents()? {
            match row.map(|intent| {
                PlannedOperation::from_intent(&intent)
                    .map(|op| PendingIntent {
                        op,
                        last_error: intent.last_error.clone(),
                        attempts: intent.attempts,
                        last_attempt: intent.updated,
                    })
                    .map_err(|e| (intent.name, e))
            }) {
                Ok(Ok(pending)) => inputs.pending.push(pending),
                Ok(Err((name, unreadable))) => inputs.corrupt_row(CorruptRow {
                    table: "intents",
                    name,
                    problem: unreadable.0,
                }),
                Err(corrupt) => inputs.corrupt_row(corrupt),
            }
        }
        inputs.approvals = store.approvals()?;
        inputs.held_deletions = store.held_deletions()?;
        Ok(inputs)
    }

    /// Applied field values, read only where the spec changed since the
    /// last apply (or the resource is no longer declared): an unchanged
    /// spec's applied values are its declared values, and reading them all
    /// would cost more than the rest of the memory.
    fn read_applied_fields(
        &mut self,
        store: &StateStore,
        changed: &[String],
    ) -> Result<(), StateError> {
        if changed.is_empty() {
            return Ok(());
        }
        for (name, hash, fields) in store.applied_fields(changed)? {
            match fields {
                Ok(fields) => self.memories.set_applied(name, hash, fields),
                Err(corrupt) => self.corrupt_row(corrupt),
            }
        }
        Ok(())
    }
}
