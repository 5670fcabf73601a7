//! One reconcile path for `plan`, `apply` and `run`.
//!
//! [`reconcile`] takes an opened [`Agent`], a snapshot, a [`Mode`] and a
//! [`Scope`]. Its phases, each in its own module:
//! [`inputs`] (read the state) → [`routing`] (subjects and their
//! providers) → the mass-deletion guard → [`observe`] (every provider at
//! once) → [`plan`] (one decision per resource, and its effects on memory)
//! → commit the effects (`apply` only) → execute (`apply` only: pending
//! intents are replayed first) → observe again for the report.
//!
//! # Guarantees
//! * `plan` and `apply` read the same inputs through the same loader and
//!   decide with the same functions: what `plan` shows is what `apply`
//!   would do at that moment.
//! * `plan` writes nothing: its effects are computed and dropped.
//! * Library code never builds a runtime and never reads the system clock:
//!   the caller's runtime runs it, the agent's clock tells the time.

mod apply;
mod cycle;
pub(crate) mod inputs;
pub(crate) mod observe;
pub(crate) mod plan;
pub(crate) mod routing;
mod standing;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use crate::agent::Agent;
use crate::engine::{Decision, DeletionGuard, Memory, Rule, Tombstone};
use crate::executor::Executed;
use crate::journal::StateError;
use crate::model::{Declaration, Diagnostic, ManagedDatabase, SpecHash};
use crate::provider::{Observed, OperationId, OperationKind};
use crate::source::Snapshot;
use observe::ListingAhead;

/// What a reconcile may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Observe and decide; write nothing.
    Plan,
    /// Replay pending intents, observe, decide, commit, execute, confirm.
    Apply,
}

/// Which resources a reconcile decides.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Scope {
    /// Every declaration and tombstone.
    #[default]
    All,
    /// These names only (the daemon's due resources). The mass-deletion
    /// guard still counts the whole fleet.
    Only(BTreeSet<String>),
    /// The resources of one provider (all of them, or these names): the
    /// daemon runs one worker per provider, so a slow provider never
    /// delays another's resources.
    Provider {
        provider: String,
        names: Option<BTreeSet<String>>,
    },
}

impl Scope {
    /// Whether a resource of this name may be in scope (its provider is
    /// checked by [`Scope::admits`] once it is known).
    pub fn contains(&self, name: &str) -> bool {
        match self {
            Scope::All | Scope::Provider { names: None, .. } => true,
            Scope::Only(names)
            | Scope::Provider {
                names: Some(names), ..
            } => names.contains(name),
        }
    }

    /// Whether every resource is in scope (of every provider, or of the
    /// one), not some names.
    pub fn is_whole(&self) -> bool {
        matches!(self, Scope::All | Scope::Provider { names: None, .. })
    }

    /// Whether the resource `name` at `provider` is in scope.
    pub fn admits(&self, name: &str, provider: &str) -> bool {
        self.contains(name)
            && match self {
                Scope::Provider { provider: p, .. } => p == provider,
                _ => true,
            }
    }
}

/// Why a reconcile stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The state store failed; `finished` are the operations that ran
    /// before (their outcomes are journalled: the report must show them).
    #[error("{error}")]
    State {
        error: StateError,
        finished: Vec<Executed>,
    },
    /// `Mode::Apply` on an agent opened read-only (a bug in the caller).
    #[error("apply needs the agent opened as the writer")]
    ReadOnly,
}

impl From<StateError> for ReconcileError {
    fn from(error: StateError) -> Self {
        ReconcileError::State {
            error,
            finished: Vec::new(),
        }
    }
}

/// What a planned resource is about.
#[derive(Debug, Clone)]
pub enum PlannedSubject<'s> {
    /// A declaration of the snapshot (borrowed: a cycle over thousands of
    /// declarations copies none).
    Declared(&'s Declaration),
    /// A removed declaration.
    Removed(Box<Tombstone>),
    /// Known only by name: what tend remembers of it cannot be read.
    Unreadable,
}

impl<'s> PlannedSubject<'s> {
    pub fn declaration(&self) -> Option<&'s Declaration> {
        match self {
            PlannedSubject::Declared(d) => Some(d),
            _ => None,
        }
    }

    /// The declaration as declared or as last seen.
    pub fn manifest(&self) -> Option<&ManagedDatabase> {
        match self {
            PlannedSubject::Declared(d) => Some(&d.manifest),
            PlannedSubject::Removed(t) => Some(&t.last),
            PlannedSubject::Unreadable => None,
        }
    }

    /// The declaration's name (empty for an unreadable subject, which is
    /// named by its resource instead).
    pub fn name(&self) -> &str {
        match self {
            PlannedSubject::Declared(d) => d.name(),
            PlannedSubject::Removed(t) => &t.last.metadata.name,
            PlannedSubject::Unreadable => "",
        }
    }
}

/// The operation a decision runs, with its journal identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedOperationId {
    pub kind: OperationKind,
    pub id: OperationId,
    pub generation: u32,
}

/// The decision for one resource with everything a report shows.
#[derive(Debug, Clone)]
pub struct PlannedResource<'s> {
    pub name: String,
    pub subject: PlannedSubject<'s>,
    /// Path of the file relative to the repository root (borrowed from
    /// the snapshot: a Git path is UTF-8; empty for a removed declaration).
    pub file: std::borrow::Cow<'s, str>,
    /// Shared by every resource of the provider's cycle (one allocation a
    /// cycle, not one a resource).
    pub provider: Arc<str>,
    pub spec_hash: SpecHash,
    pub observed: Observed,
    /// Shared with the read it came from (see `inputs::Memories::take`).
    pub memory: Arc<Memory>,
    pub decision: Decision,
    /// The id the executor uses for the decision's action.
    pub operation: Option<PlannedOperationId>,
}

/// A pending intent and what happens to it.
#[derive(Debug, Clone, PartialEq)]
pub struct IntentReport {
    pub name: String,
    pub kind: OperationKind,
    pub id: OperationId,
    /// `pending-intent` (replayed) or `superseded`.
    pub rule: Rule,
    pub reason: String,
}

/// The decisions of one cycle.
#[derive(Debug, Clone)]
pub struct Plan<'s> {
    /// This installation's agent id.
    pub agent_id: String,
    /// The source commit the declarations come from.
    pub commit: Option<String>,
    /// Its committer time.
    pub commit_time: Option<SystemTime>,
    pub resources: Vec<PlannedResource<'s>>,
    /// Declaration files that failed to parse, or declarations that could
    /// not be routed to a provider.
    pub errors: Vec<Diagnostic>,
    /// Pending intents and their verdicts.
    pub intents: Vec<IntentReport>,
    /// Local overrides set on a name tend knows nothing of (no declaration,
    /// no resource in the state): they protect nothing, and whoever set
    /// one in an emergency must be told.
    pub orphaned_overrides: Vec<OrphanedOverride>,
    pub guard: DeletionGuard,
    /// The agent-wide freeze (`tend suspend`), if one is set.
    pub suspension: Option<crate::engine::Suspension>,
    /// Databases tend released that no report has shown yet: each is
    /// shown once, as `Released`.
    pub released: Vec<crate::journal::Release>,
    pub now: SystemTime,
}

/// A local override on a name with no declaration and no resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanedOverride {
    pub name: String,
    pub reason: String,
    pub set_at: SystemTime,
}

/// What a reconcile did.
#[derive(Debug, Clone)]
pub struct Outcome<'s> {
    /// The state after the cycle, decided: for `apply`, observed and
    /// decided again when operations ran (the decisions that led to them
    /// are dropped first: at 10,000 resources two plans at once doubled
    /// the peak memory).
    pub plan: Plan<'s>,
    /// Operations run (pending intents replayed first), by name.
    pub operations: Vec<Executed>,
}

impl<'s> Outcome<'s> {
    /// The plan that describes the state after the cycle.
    pub fn latest(&self) -> &Plan<'s> {
        &self.plan
    }

    /// When each held action falls due (`drift_grace`, `deletion_delay`,
    /// an override's expiry), soonest first: what a work queue waits for.
    pub fn due(&self) -> Vec<(String, SystemTime)> {
        let mut due: Vec<(String, SystemTime)> = self
            .latest()
            .resources
            .iter()
            .filter_map(|r| r.decision.act_at.map(|at| (r.name.clone(), at)))
            .collect();
        due.sort_by_key(|(_, at)| *at);
        due
    }
}

/// What a cycle is given that was started before it: a one-shot command
/// starts the providers' listings beside its source fetch. Passed to
/// [`reconcile_with`], never left in the agent for a later cycle to find.
/// (The memories read ahead are in the agent's [`inputs::MemoryCache`],
/// which every cycle reads through.)
#[derive(Default)]
pub(crate) struct CycleInputs {
    /// The listings under way (see [`observe::ListingAhead`]).
    pub listing: Option<ListingAhead>,
}

/// Reconciles `snapshot` in `mode` over `scope`, reading everything in
/// the cycle.
pub async fn reconcile<'s>(
    agent: &Agent,
    snapshot: &'s Arc<Snapshot>,
    mode: Mode,
    scope: &Scope,
) -> Result<Outcome<'s>, ReconcileError> {
    reconcile_with(agent, snapshot, mode, scope, CycleInputs::default()).await
}

/// [`reconcile`] with what was read or started ahead of it.
pub(crate) async fn reconcile_with<'s>(
    agent: &Agent,
    snapshot: &'s Arc<Snapshot>,
    mode: Mode,
    scope: &Scope,
    ahead: CycleInputs,
) -> Result<Outcome<'s>, ReconcileError> {
    match mode {
        Mode::Plan => {
            let plan = cycle::plan_cycle(
                agent,
                snapshot,
                Mode::Plan,
                scope,
                &HashSet::new(),
                cycle::Observations::Fresh(ahead.listing),
            )
            .await?
            .plan;
            Ok(Outcome {
                plan,
                operations: Vec::new(),
            })
        }
        Mode::Apply => apply::apply_cycle(agent, snapshot, scope, ahead).await,
    }
}
