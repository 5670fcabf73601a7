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

pub mod inputs;
pub mod observe;
pub mod plan;
pub mod routing;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use crate::agent::Agent;
use crate::engine::deletion::DueDeletion;
use crate::engine::intents::{IntentVerdict, PendingWork, verdict};
use crate::engine::{Decision, DeletionGuard, Memory, Rule, Tombstone};
use crate::executor::queue::execute;
use crate::executor::replay::Replay;
use crate::executor::request::{self, RequestSubject};
use crate::executor::{Executed, OpOutcome, PlannedOperation};
use crate::journal::effects::{Effect, commit};
use crate::journal::{StateError, StoredMemories, blocking};
use crate::model::{Declaration, Diagnostic, ManagedDatabase, SpecHash};
use crate::provider::{Observed, OperationId, OperationKind};
use crate::source::Snapshot;
use inputs::{Inputs, declared};
use routing::Routing;

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
}

impl Scope {
    pub fn contains(&self, name: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Only(names) => names.contains(name),
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
    /// Path of the file relative to the repository root.
    pub file: String,
    pub provider: String,
    pub spec_hash: SpecHash,
    pub observed: Observed,
    pub memory: Memory,
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
    pub resources: Vec<PlannedResource<'s>>,
    /// Declaration files that failed to parse, or declarations that could
    /// not be routed to a provider.
    pub errors: Vec<Diagnostic>,
    /// Pending intents and their verdicts.
    pub intents: Vec<IntentReport>,
    pub guard: DeletionGuard,
    pub now: SystemTime,
}

/// What a reconcile did.
#[derive(Debug, Clone)]
pub struct Outcome<'s> {
    /// The decisions (for `apply`: before executing them).
    pub plan: Plan<'s>,
    /// Operations run (pending intents replayed first), by name.
    pub operations: Vec<Executed>,
    /// The state after the operations, observed again (`None` when none
    /// ran: then `plan` is that state).
    pub after: Option<Plan<'s>>,
}

impl<'s> Outcome<'s> {
    /// The plan that describes the state after the cycle.
    pub fn latest(&self) -> &Plan<'s> {
        self.after.as_ref().unwrap_or(&self.plan)
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

/// Reconciles `snapshot` in `mode` over `scope`.
pub async fn reconcile<'s>(
    agent: &Agent,
    snapshot: &'s Arc<Snapshot>,
    mode: Mode,
    scope: &Scope,
) -> Result<Outcome<'s>, ReconcileError> {
    match mode {
        Mode::Plan => {
            let preloaded = agent.take_preloaded();
            let plan = plan_cycle(
                agent,
                snapshot,
                Mode::Plan,
                scope,
                &HashSet::new(),
                preloaded,
            )
            .await?;
            Ok(Outcome {
                plan,
                operations: Vec::new(),
                after: None,
            })
        }
        Mode::Apply => apply_cycle(agent, snapshot, scope).await,
    }
}

async fn apply_cycle<'s>(
    agent: &Agent,
    snapshot: &'s Arc<Snapshot>,
    scope: &Scope,
) -> Result<Outcome<'s>, ReconcileError> {
    let ctx = agent.exec_context().ok_or(ReconcileError::ReadOnly)?;
    // Pending intents first: finish what a lost response or a crash left,
    // with the same ids, before any new work; supersede what the
    // repository has overtaken.
    let mut preloaded = agent.take_preloaded();
    let replay = {
        let snapshot = snapshot.clone();
        blocking(&ctx.store, move |store| {
            let inputs = Inputs::load(store, &snapshot, Some(StoredMemories::default()))?;
            let declarations: HashMap<&str, &Declaration> = snapshot
                .declarations
                .declarations
                .iter()
                .map(|d| (d.name(), d))
                .collect();
            let paused: HashSet<&str> = inputs
                .local_overrides
                .values()
                .filter(|o| {
                    o.annotations
                        .get(crate::model::overrides::PAUSED)
                        .map(String::as_str)
                        == Some("true")
                })
                .map(|o| o.name.as_str())
                .collect();
            let pending = inputs.pending.iter().map(|p| p.op.clone()).collect();
            Ok(Replay::sort(pending, &declarations, &paused))
        })
        .await?
    };
    for (op, why) in &replay.superseded {
        tracing::warn!(resource = %op.name, operation = %op.id, "not replaying {} {}: {why}", op.kind.as_str(), op.name);
    }
    let superseded = replay.superseded_effects(agent.clock().now());
    blocking(&ctx.store, move |s| commit(s, &superseded)).await?;
    let replayed: HashSet<String> = replay.replay.iter().map(|op| op.name.clone()).collect();
    if !replayed.is_empty() {
        // Replayed intents change what is remembered: read it again.
        preloaded = None;
    }
    let replay_run = execute(
        agent.runtimes(),
        &ctx,
        replay.replay,
        |op| op.request.provider.as_str(),
        Some,
        agent.progress(),
    )
    .await;
    let mut operations = replay_run.finished;
    if let Some(error) = replay_run.error {
        return Err(ReconcileError::State {
            error,
            finished: operations,
        });
    }

    let plan = plan_cycle(agent, snapshot, Mode::Apply, scope, &replayed, preloaded).await?;
    let now = agent.clock().now();
    let work: Vec<&PlannedResource<'_>> = plan
        .resources
        .iter()
        .filter(|r| r.operation.is_some())
        .collect();
    let requested: Vec<Effect> = work
        .iter()
        .filter(|r| {
            r.operation
                .as_ref()
                .is_some_and(|o| o.kind == OperationKind::Delete)
        })
        .map(|r| Effect::DeletionProgress {
            name: r.name.clone(),
            at: now,
            error: None,
        })
        .collect();
    blocking(&ctx.store, move |s| commit(s, &requested)).await?;
    let run = execute(
        agent.runtimes(),
        &ctx,
        work,
        |r| r.provider.as_str(),
        |r| planned_operation(agent, plan.commit.as_deref(), r),
        agent.progress(),
    )
    .await;
    let failed_deletes: Vec<Effect> = run
        .finished
        .iter()
        .filter_map(|e| match (&e.kind, &e.outcome) {
            (OperationKind::Delete, OpOutcome::Pending(error) | OpOutcome::Failed(error)) => {
                Some(Effect::DeletionProgress {
                    name: e.name.clone(),
                    at: now,
                    error: Some(error.clone()),
                })
            }
            _ => None,
        })
        .collect();
    operations.extend(run.finished);
    operations.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(error) = run.error {
        return Err(ReconcileError::State {
            error,
            finished: operations,
        });
    }
    blocking(&ctx.store, move |s| commit(s, &failed_deletes))
        .await
        .map_err(|error| ReconcileError::State {
            error,
            finished: operations.clone(),
        })?;
    let after = if operations.is_empty() {
        None
    } else {
        Some(plan_cycle(agent, snapshot, Mode::Plan, scope, &HashSet::new(), None).await?)
    };
    Ok(Outcome {
        plan,
        operations,
        after,
    })
}

/// The operation that carries out a planned resource's decision.
fn planned_operation(
    agent: &Agent,
    commit: Option<&str>,
    r: &PlannedResource<'_>,
) -> Option<PlannedOperation> {
    let op = r.operation.as_ref()?;
    let manifest = r.subject.manifest()?;
    let capabilities = &agent.runtimes().get(&r.provider)?.capabilities;
    let request = request::build(
        op.kind,
        agent.agent_id(),
        RequestSubject {
            name: &r.name,
            manifest,
            file: &r.file,
            provider: &r.provider,
            commit,
        },
        &r.decision.changes,
        capabilities,
    );
    Some(PlannedOperation {
        name: r.name.clone(),
        kind: op.kind,
        spec_hash: r.spec_hash.clone(),
        generation: op.generation,
        id: op.id.clone(),
        request,
    })
}

/// Reads, routes, guards, observes and decides; in `Mode::Apply` commits
/// the effects on memory.
async fn plan_cycle<'s>(
    agent: &Agent,
    snapshot: &'s Arc<Snapshot>,
    mode: Mode,
    scope: &Scope,
    just_replayed: &HashSet<String>,
    preloaded: Option<StoredMemories>,
) -> Result<Plan<'s>, StateError> {
    let now = agent.clock().now();
    let started = std::time::Instant::now();
    let mut inputs = match agent.store() {
        Some(store) => {
            let snapshot = snapshot.clone();
            blocking(store, move |s| Inputs::load(s, &snapshot, preloaded)).await?
        }
        None => Inputs::default(),
    };
    tracing::debug!("inputs read in {:?}", started.elapsed());
    let policy = agent.policy();
    let intents = intent_reports(snapshot, &inputs);
    let gates: HashMap<String, PendingWork> = inputs
        .pending
        .iter()
        .filter(|p| {
            intents
                .iter()
                .any(|i| i.id == p.op.id && i.rule == Rule::PendingIntent)
        })
        .map(|p| {
            (
                p.op.name.clone(),
                PendingWork {
                    kind: p.op.kind,
                    id: p.op.id.clone(),
                    last_error: p.last_error.clone(),
                },
            )
        })
        .collect();
    let mut routing = Routing::route(agent.config(), policy, snapshot, &mut inputs, scope, now);
    // A restored declaration's hold goes with its tombstone (an effect of
    // this cycle): it must not keep the guard tripped meanwhile.
    inputs
        .held_deletions
        .retain(|name, _| declared(snapshot, name).is_none());
    let mut memories = std::mem::take(&mut inputs.memories);
    let managed = memories.values().filter(|m| m.existed).count();
    let due: Vec<DueDeletion<'_>> = routing
        .due_deletions
        .iter()
        .map(|name| DueDeletion {
            name,
            approved: inputs.approvals.contains_key(name),
        })
        .collect();
    let guard = DeletionGuard::evaluate(
        &due,
        &inputs.held_deletions,
        managed,
        agent.deletion_limits(),
        snapshot.declarations.declarations.is_empty(),
        now,
    );
    let mut effects = std::mem::take(&mut routing.effects);
    match guard.trip {
        Some(hold) => {
            let mut names: Vec<String> = due
                .iter()
                .filter(|d| !d.approved)
                .map(|d| d.name.to_string())
                .collect();
            names.extend(inputs.held_deletions.keys().cloned());
            names.sort_unstable();
            names.dedup();
            effects.push(Effect::HoldDeletions { names, hold });
        }
        None if !inputs.held_deletions.is_empty() => effects.push(Effect::ReleaseDeletions),
        None => {}
    }
    drop(due);

    let views = observe::observe_all(agent.runtimes(), &routing.by_provider).await;
    tracing::debug!("observed in {:?}", started.elapsed());
    let ctx = plan::PlanContext {
        policy,
        now,
        guard: &guard,
        inputs: &inputs,
        gates: &gates,
        just_replayed,
    };
    let mut views = views;
    let mut resources = Vec::with_capacity(
        routing.by_provider.values().map(Vec::len).sum::<usize>() + routing.undecidable.len(),
    );
    for (provider, subjects) in std::mem::take(&mut routing.by_provider) {
        let Some(runtime) = agent.runtimes().get(&provider) else {
            continue;
        };
        let observed = observe::distribute(&subjects, views.remove(&provider));
        for (routed, observed) in subjects.into_iter().zip(observed) {
            let memory = memories.remove(routed.subject.name()).unwrap_or_default();
            resources.push(plan::plan_subject(
                &ctx,
                &provider,
                &runtime.capabilities,
                routed,
                observed,
                memory,
                &mut effects,
            ));
        }
    }
    resources.append(&mut routing.undecidable);
    // Declarations arrive sorted; only tombstones or several providers
    // leave anything to sort (and moving large entries is not free).
    if !resources.is_sorted_by(|a, b| a.name <= b.name) {
        resources.sort_by(|a, b| a.name.cmp(&b.name));
    }
    tracing::debug!("decided in {:?}", started.elapsed());
    if let Some(store) = agent.store() {
        if mode == Mode::Apply {
            blocking(store, move |s| commit(s, &effects)).await?;
        }
        assign_generations(store, agent.agent_id(), &mut resources).await?;
    }
    let mut errors = snapshot.declarations.diagnostics.clone();
    errors.append(&mut routing.diagnostics);
    Ok(Plan {
        agent_id: agent.agent_id().to_string(),
        commit: Some(snapshot.commit.clone()),
        resources,
        errors,
        intents,
        guard,
        now,
    })
}

/// Each pending intent with its verdict.
fn intent_reports(snapshot: &Snapshot, inputs: &Inputs) -> Vec<IntentReport> {
    inputs
        .pending
        .iter()
        .map(|p| {
            let paused_locally = inputs.local_overrides.get(&p.op.name).is_some_and(|o| {
                o.annotations
                    .get(crate::model::overrides::PAUSED)
                    .map(String::as_str)
                    == Some("true")
            });
            let v = verdict(
                p.op.kind,
                &p.op.spec_hash,
                declared(snapshot, &p.op.name),
                paused_locally,
            );
            IntentReport {
                name: p.op.name.clone(),
                kind: p.op.kind,
                id: p.op.id.clone(),
                rule: v.rule(),
                reason: match v {
                    IntentVerdict::Replay => format!(
                        "replayed with the same id before any new work{}",
                        p.last_error
                            .as_deref()
                            .map(|e| format!(" (last error: {e})"))
                            .unwrap_or_default()
                    ),
                    IntentVerdict::Supersede(why) => format!("superseded, not replayed: {why}"),
                },
            }
        })
        .collect()
}

/// Gives each planned operation its generation and id (the journal counts
/// the finished operations of the same kind on the same spec).
async fn assign_generations(
    store: &Arc<crate::journal::StateStore>,
    agent_id: &str,
    resources: &mut [PlannedResource<'_>],
) -> Result<(), StateError> {
    let wanted: Vec<(usize, String, OperationKind, SpecHash)> = resources
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            r.operation
                .as_ref()
                .map(|o| (i, r.name.clone(), o.kind, r.spec_hash.clone()))
        })
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let generations = blocking(store, move |s| {
        wanted
            .into_iter()
            .map(|(i, name, kind, hash)| {
                s.next_generation(&name, kind.as_str(), &hash)
                    .map(|g| (i, g))
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    for (i, generation) in generations {
        let r = &mut resources[i];
        if let Some(op) = &mut r.operation {
            op.generation = generation;
            op.id = OperationId::derive_nth(agent_id, &r.name, op.kind, &r.spec_hash, generation);
        }
    }
    Ok(())
}
