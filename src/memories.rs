//! What the agent remembers of each resource between cycles, as read from
//! the state store, and the cache every cycle reads it through.
//!
//! # Guarantees
//! * A read is reused only while the state's freshness is unchanged: a
//!   write anywhere makes the next cycle read again.
//! * A one-shot command's read ahead is handed to its one cycle, which then
//!   holds the only reference and moves each memory out.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use serde_json::Value;

use crate::engine::Memory;
use crate::journal::{MemoriesSince, StateError, StateStore, StoredMemories};
use crate::model::{ManagedDatabase, SpecHash};
use crate::source::Snapshot;

/// A managed resource no longer declared and without a tombstone yet.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LeftGit {
    pub name: String,
    pub last: ManagedDatabase,
    /// The file it was last declared in.
    pub file: String,
}

/// Every resource's memory as one read of the state found it, shared by
/// the cycles that run while nothing is written: the running agent's
/// provider workers each decide their own part of the fleet from the same
/// read, so the fleet's memories are held (and read) once, not once per
/// provider. What a cycle derives from them over the whole fleet (the
/// resources that left Git, the specs changed since their last apply) is
/// derived once per snapshot.
///
/// Never changed once made: a cycle that writes makes the next one read
/// again (the read carries its freshness).
#[derive(Debug, Default)]
pub struct SharedMemories {
    /// Each behind its own `Arc`: a cycle's plan refers to the memories
    /// it decided from instead of copying them.
    memories: HashMap<String, Arc<Memory>>,
    freshness: Option<crate::journal::store::Freshness>,
    /// Which read of the state they are (a read is brought up to date
    /// only from the store's last).
    number: u64,
    /// How many resources tend saw exist (the deletion guard's base).
    existed: usize,
    /// What was derived over the fleet, and the snapshot it was derived
    /// from (a weak reference keeps the snapshot's address from being
    /// reused by another while it is held, so the comparison is exact).
    derived: Mutex<Option<(Weak<Snapshot>, Arc<Derived>)>>,
    /// The memories in the order of a snapshot's declarations, and that
    /// snapshot (as `derived`). Made from this read alone, never carried to
    /// another: it cannot go stale.
    aligned: Mutex<Option<(Weak<Snapshot>, Arc<Aligned>)>>,
}

/// Each declaration's memory, at the declaration's position in its
/// snapshot (`None`: it has none). A whole cycle takes its subjects'
/// memories by position from it: looked up by name, each was a search in
/// a table of the fleet's names scattered in memory (about a tenth of a
/// no-change cycle's own time at 100,000).
type Aligned = Vec<Option<Arc<Memory>>>;

/// Fleet-wide facts of a snapshot and the memories.
#[derive(Debug, Default, Clone)]
pub(crate) struct Derived {
    /// Seen to exist and not declared (sorted): they left Git, or were
    /// tombstoned already.
    pub(crate) undeclared: Vec<String>,
    /// Applied, and the spec changed since (or no longer declared): their
    /// applied field values are read.
    pub(crate) changed: Vec<String>,
}

impl Derived {
    /// Whether a resource with `memory`, declared with `spec` (`None`:
    /// not declared), is undeclared, and whether its spec changed.
    fn facts(memory: &Memory, spec: Option<&SpecHash>) -> (bool, bool) {
        (
            memory.existed && spec.is_none(),
            memory.applied_spec_hash.is_some() && spec != memory.applied_spec_hash.as_ref(),
        )
    }

    /// `name`'s facts with its memory now `memory` (`None`: none) over
    /// `snapshot`.
    fn update(&mut self, name: &str, memory: Option<&Memory>, snapshot: &Snapshot) {
        let spec = snapshot.declared(name).map(|d| &d.spec_hash);
        let (undeclared, changed) = memory.map_or((false, false), |m| Self::facts(m, spec));
        for (list, holds) in [
            (&mut self.undeclared, undeclared),
            (&mut self.changed, changed),
        ] {
            match (list.binary_search_by(|n| n.as_str().cmp(name)), holds) {
                (Err(at), true) => list.insert(at, name.to_string()),
                (Ok(at), false) => {
                    list.remove(at);
                }
                _ => {}
            }
        }
    }
}

impl SharedMemories {
    pub fn new(stored: StoredMemories) -> SharedMemories {
        let existed = stored.memories.values().filter(|m| m.existed).count();
        SharedMemories {
            memories: stored.memories,
            freshness: stored.freshness,
            number: stored.number,
            existed,
            derived: Mutex::default(),
            aligned: Mutex::default(),
        }
    }

    /// `last` with the memories of `names` as read again (a name not in
    /// `memories` has none left): the state's writes since `last` changed
    /// those rows alone. Moved out of `last` when no cycle holds it any
    /// more, else copied (the memories themselves are shared).
    fn with_changes(
        last: Arc<SharedMemories>,
        names: Vec<String>,
        mut changed: HashMap<String, Arc<Memory>>,
        (freshness, number): (crate::journal::store::Freshness, u64),
    ) -> SharedMemories {
        // What the last read derived over a snapshot still in use is
        // brought up to date for the changed names below: derived again,
        // it passes over every memory and declaration (at 100,000, tens of
        // milliseconds of each cycle after the agent's own writes).
        let carried = last
            .derived
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|(of, derived)| Some((of.upgrade()?, Arc::clone(derived))));
        let mut existed = last.existed;
        let mut memories = match Arc::try_unwrap(last) {
            Ok(own) => own.memories,
            Err(shared) => shared.memories.clone(),
        };
        for name in &names {
            let before = match changed.remove(name) {
                Some(memory) => memories.insert(name.clone(), memory),
                None => memories.remove(name),
            };
            existed -= usize::from(before.is_some_and(|m| m.existed));
            existed += usize::from(memories.get(name).is_some_and(|m| m.existed));
        }
        let derived = carried.map(|(snapshot, derived)| {
            let mut derived = Arc::unwrap_or_clone(derived);
            for name in &names {
                derived.update(name, memories.get(name).map(Arc::as_ref), &snapshot);
            }
            (Arc::downgrade(&snapshot), Arc::new(derived))
        });
        SharedMemories {
            memories,
            freshness: Some(freshness),
            number,
            existed,
            derived: Mutex::new(derived),
            aligned: Mutex::default(),
        }
    }

    /// When they were read (`None`: never reused).
    pub fn freshness(&self) -> Option<crate::journal::store::Freshness> {
        self.freshness
    }

    /// The memories aligned with `snapshot`'s declarations, made at the
    /// first whole cycle over it that reads them so.
    fn aligned(&self, snapshot: &Arc<Snapshot>) -> Arc<Aligned> {
        let mut slot = self.aligned.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(aligned) = made_over(&slot, snapshot) {
            return aligned;
        }
        let aligned: Arc<Aligned> = Arc::new(
            snapshot
                .declarations
                .declarations
                .iter()
                .map(|d| self.memories.get(d.name()).cloned())
                .collect(),
        );
        *slot = Some((Arc::downgrade(snapshot), aligned.clone()));
        aligned
    }

    /// The fleet-wide facts over `snapshot`, derived at the first cycle
    /// over it and kept for the others.
    pub(crate) fn derived(&self, snapshot: &Arc<Snapshot>) -> Arc<Derived> {
        let mut slot = self.derived.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(derived) = made_over(&slot, snapshot) {
            return derived;
        }
        if self.memories.is_empty() {
            return Arc::default();
        }
        // Over the last snapshot's, still in use: only the names declared
        // differently are derived again (a commit changes a few).
        let carried = slot
            .as_ref()
            .and_then(|(of, derived)| Some((of.upgrade()?, Arc::clone(derived))));
        if let Some((before, derived)) = carried
            && let Some(names) = declared_differently(&before, snapshot)
        {
            let mut derived = Arc::unwrap_or_clone(derived);
            for name in names {
                derived.update(name, self.memories.get(name).map(Arc::as_ref), snapshot);
            }
            let derived = Arc::new(derived);
            *slot = Some((Arc::downgrade(snapshot), derived.clone()));
            return derived;
        }
        // One index of the declarations by name: a lookup per memory in
        // the sorted list touches a dozen declarations scattered in
        // memory, and at 10,000 resources those cache misses cost
        // milliseconds.
        let declared: HashMap<&str, &SpecHash> = snapshot
            .declarations
            .declarations
            .iter()
            .map(|d| (d.name(), &d.spec_hash))
            .collect();
        let mut derived = Derived::default();
        for (name, memory) in &self.memories {
            let (undeclared, changed) =
                Derived::facts(memory, declared.get(name.as_str()).copied());
            if undeclared {
                derived.undeclared.push(name.clone());
            }
            if changed {
                derived.changed.push(name.clone());
            }
        }
        derived.undeclared.sort_unstable();
        derived.changed.sort_unstable();
        let derived = Arc::new(derived);
        *slot = Some((Arc::downgrade(snapshot), derived.clone()));
        derived
    }
}

/// What `slot` holds, if it was made over `snapshot` (the weak reference
/// keeps that snapshot's address from being another's while it is held).
fn made_over<T>(
    slot: &Option<(Weak<Snapshot>, Arc<T>)>,
    snapshot: &Arc<Snapshot>,
) -> Option<Arc<T>> {
    slot.as_ref()
        .filter(|(of, _)| std::ptr::eq(of.as_ptr(), Arc::as_ptr(snapshot)))
        .map(|(_, made)| made.clone())
}

/// The names declared in one snapshot and not the other, or with another
/// spec: a walk of the two sorted sets (a declaration the parse cache
/// carried over is the same `Arc` in both). `None` when they are more
/// than an eighth of the fleet (and a few), which is derived again whole.
fn declared_differently<'a>(before: &'a Snapshot, now: &'a Snapshot) -> Option<Vec<&'a str>> {
    use std::cmp::Ordering;
    let (mut old, mut new) = (
        before.declarations.declarations.iter().peekable(),
        now.declarations.declarations.iter().peekable(),
    );
    let most = now.declarations.declarations.len() / 8 + 8;
    let mut names = Vec::new();
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => return Some(names),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => Ordering::Equal,
            (Some(a), Some(b)) => a.name().cmp(b.name()),
        };
        let name = match order {
            Ordering::Less => old.next().map(|d| d.name()),
            Ordering::Greater => new.next().map(|d| d.name()),
            Ordering::Equal => {
                let (a, b) = (old.next(), new.next());
                a.zip(b)
                    .filter(|(a, b)| !Arc::ptr_eq(a, b) && a.spec_hash != b.spec_hash)
                    .map(|(_, b)| b.name())
            }
        };
        if let Some(name) = name {
            names.push(name);
            if names.len() > most {
                return None;
            }
        }
    }
}

/// Applied field values read for a changed spec: the hash they were
/// applied under, and the values.
type Applied = (Option<SpecHash>, BTreeMap<String, Value>);

/// The memories a cycle decides from: the shared read, with the applied
/// field values read for this cycle over it. Each subject takes its own.
#[derive(Debug, Default)]
pub(crate) struct Memories {
    shared: Arc<SharedMemories>,
    applied: HashMap<String, Applied>,
    /// The shared read aligned with the cycle's snapshot (see
    /// [`Memories::align`]), and that snapshot (a position is checked
    /// against its declaration in debug builds: every test then checks
    /// that each cycle takes a position of the snapshot it was aligned
    /// with).
    aligned: Option<(Arc<Aligned>, Arc<Snapshot>)>,
}

impl Memories {
    /// Memories of a test, as if read.
    #[cfg(test)]
    pub(crate) fn of(memories: HashMap<String, Memory>) -> Memories {
        Memories::over(Arc::new(SharedMemories::new(StoredMemories {
            memories: memories
                .into_iter()
                .map(|(name, memory)| (name, Arc::new(memory)))
                .collect(),
            freshness: None,
            number: 0,
        })))
    }

    /// A cycle's memories over the shared read `shared`.
    pub(crate) fn over(shared: Arc<SharedMemories>) -> Memories {
        Memories {
            shared,
            applied: HashMap::new(),
            aligned: None,
        }
    }

    /// Takes the memories of `snapshot`'s declarations by their position
    /// from now on ([`Memories::take`]), when the read is shared with other
    /// cycles: for a cycle over a whole provider, whose subjects are many.
    /// (A cycle holding the only reference moves each memory out by name
    /// instead.)
    pub(crate) fn align(&mut self, snapshot: &Arc<Snapshot>) {
        if Arc::strong_count(&self.shared) > 1 {
            self.aligned = Some((self.shared.aligned(snapshot), snapshot.clone()));
        }
    }

    /// Records `name`'s applied field values, read for this cycle (a
    /// resource without a memory has none to complete: ignored).
    pub(crate) fn set_applied(
        &mut self,
        name: String,
        hash: Option<SpecHash>,
        fields: BTreeMap<String, Value>,
    ) {
        if self.contains(&name) {
            self.applied.insert(name, (hash, fields));
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Memory> {
        self.shared.memories.get(name).map(Arc::as_ref)
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.shared.memories.contains_key(name)
    }

    /// How many resources tend saw exist, fleet-wide.
    pub(crate) fn existed(&self) -> usize {
        self.shared.existed
    }

    /// `name`'s memory for its decision (empty on first sight): moved out
    /// when this cycle holds the only reference to the read (a one-shot
    /// command), shared when other cycles hold it too (copied only where
    /// this cycle read its applied field values).
    ///
    /// `position`: where the declaration `name` is in the snapshot the
    /// memories were aligned with ([`Memories::align`]), if it is one.
    pub(crate) fn take(&mut self, name: &str, position: Option<usize>) -> Arc<Memory> {
        // The count is read before `get_mut` is tried: `get_mut` takes the
        // shared read's counters for writing (a locked instruction), and the
        // running agent's cycles, which share the read, took them from each
        // other's cores at every resource.
        let own = match Arc::strong_count(&self.shared) {
            1 => Arc::get_mut(&mut self.shared),
            _ => None,
        };
        let aligned = position.and_then(|at| {
            let (aligned, snapshot) = self.aligned.as_ref()?;
            debug_assert_eq!(
                snapshot.declarations.declarations.get(at).map(|d| d.name()),
                Some(name),
                "a memory taken at a position of another snapshot"
            );
            Some(aligned.get(at)?.as_ref())
        });
        let mut memory = match (own, aligned) {
            (Some(own), _) => own.memories.remove(name),
            (None, Some(aligned)) => aligned.cloned(),
            (None, None) => self.shared.memories.get(name).cloned(),
        }
        .unwrap_or_default();
        // (Most cycles read no applied values: no name is hashed then.)
        if !self.applied.is_empty()
            && let Some((hash, fields)) = self.applied.remove(name)
        {
            let memory = Arc::make_mut(&mut memory);
            memory.applied_spec_hash = hash;
            memory.applied_fields = fields;
        }
        memory
    }
}

/// The last read of every resource's memory. A retaining cache (the
/// running agent's) is reused by every cycle while nothing is written: the
/// provider workers decide from one read, and hold one copy, whatever the
/// number of providers. Otherwise (a one-shot command) a read made ahead
/// is handed to the next cycle alone, which then moves each memory out of
/// it instead of copying it.
#[derive(Debug, Default)]
pub struct MemoryCache {
    /// Locked across a read: a cycle that asks meanwhile waits for it
    /// rather than reading the same rows a second time.
    last: Mutex<Option<Arc<SharedMemories>>>,
    retain: AtomicBool,
}

impl MemoryCache {
    /// Keeps each read for the cycles after it (the running agent).
    pub fn retain(&self) {
        self.retain.store(true, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<SharedMemories>>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `last` taken out if nothing was written since it was read, else a
    /// new read. Taken out whatever it is: a stale read is freed by the
    /// last cycle that holds it, not kept beside the new one.
    fn up_to_date(
        last: &mut Option<Arc<SharedMemories>>,
        store: &StateStore,
    ) -> Result<Arc<SharedMemories>, StateError> {
        let now = store.freshness()?;
        let read = match last.take() {
            Some(read) if read.freshness() == Some(now) => return Ok(read),
            // Brought up to date when the state can say what changed.
            Some(read) if let Some(since) = read.freshness() => {
                match store.read_memories_since((since, read.number))? {
                    MemoriesSince::Whole(stored) => SharedMemories::new(stored),
                    MemoriesSince::Changed {
                        names,
                        memories,
                        freshness,
                        number,
                    } => SharedMemories::with_changes(read, names, memories, (freshness, number)),
                }
            }
            _ => SharedMemories::new(store.read_memories()?),
        };
        Ok(Arc::new(read))
    }

    /// The memories as the state holds them now: the last read if nothing
    /// was written since, else a new one. Blocks (call it on a blocking
    /// thread).
    pub fn current(&self, store: &StateStore) -> Result<Arc<SharedMemories>, StateError> {
        let mut last = self.lock();
        let read = Self::up_to_date(&mut last, store)?;
        if self.retain.load(Ordering::Relaxed) {
            *last = Some(read.clone());
        }
        Ok(read)
    }

    /// Reads the memories now (unless the last read is still current),
    /// for the next cycle.
    pub fn read_ahead(&self, store: &StateStore) -> Result<(), StateError> {
        let mut last = self.lock();
        let read = Self::up_to_date(&mut last, store)?;
        *last = Some(read);
        Ok(())
    }
}

#[cfg(test)]
#[path = "memories_tests.rs"]
mod tests;
