//! One planning pass, shared by both modes: read the inputs, route the
//! subjects, count the fleet's due deletions against the guard, observe,
//! decide; `Mode::Apply` commits the effects on memory, `Mode::Plan` drops
//! them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::inputs::{Inputs, Memories, MemoryRead};
use super::observe::{self, ProviderView};
use super::plan::{self, PlanContext};
use super::routing::{Routed, Routing};
use super::standing::{Beside, Written};
use super::{IntentReport, Mode, OrphanedOverride, Plan, PlannedResource, Scope};
use crate::agent::Agent;
use crate::engine::DeletionGuard;
use crate::engine::deletion::DueDeletion;
use crate::engine::intents::{IntentVerdict, PendingWork, verdict};
use crate::journal::effects::{Effect, commit};
use crate::journal::{StateError, StateStore, blocking};
use crate::model::SpecHash;
use crate::provider::{OperationId, OperationKind};
use crate::source::Snapshot;

/// Where a planning pass gets what the providers show.
pub(super) enum Observations {
    /// Ask every provider, awaiting the listings already under way (see
    /// [`observe::ListingAhead`]); without, those a one-shot command
    /// started, or new ones while the inputs are read.
    Fresh(Option<observe::ListingAhead>),
    /// Known already: after operations that were each confirmed by an
    /// observation, the cycle's first observations with those in their
    /// place (see [`super::standing`]). `only`: the resources decided (the
    /// others' decisions stand, and the caller keeps them); `None`: all.
    Known {
        views: HashMap<String, ProviderView>,
        only: Option<HashSet<String>>,
    },
}

/// What a planning pass decided, the providers it could not observe, what
/// its effects wrote to, and what it read that is written beside it.
pub(super) struct Planned<'s> {
    pub plan: Plan<'s>,
    pub unobserved: HashSet<String>,
    pub written: Written,
    pub beside: Beside,
}

/// Reads, routes, guards, observes and decides.
pub(super) async fn plan_cycle<'s>(
    agent: &Agent,
    snapshot: &'s Arc<Snapshot>,
    mode: Mode,
    scope: &Scope,
    just_replayed: &HashSet<String>,
    observations: Observations,
) -> Result<Planned<'s>, StateError> {
    crate::process::failpoint::stop_point(crate::process::failpoint::BEFORE_INPUTS);
    let now = agent.clock().now();
    let started = std::time::Instant::now();
    // A provider whose observation is one listing whatever it is asked for
    // is listed while the inputs are read (a one-shot command started it
    // beside the source fetch already).
    let observations = match observations {
        Observations::Fresh(None) => {
            Observations::Fresh(observe::ListingAhead::for_cycle(None, agent, scope).await)
        }
        other => other,
    };
    let mut inputs = match agent.store() {
        Some(store) => {
            let snapshot = snapshot.clone();
            let cache = agent.memories();
            blocking(store, move |s| {
                Inputs::load(s, &snapshot, MemoryRead::Fresh(cache))
            })
            .await?
        }
        None => Inputs::default(),
    };
    tracing::debug!("inputs read in {:?}", started.elapsed());
    let beside = Beside::of(&inputs);
    let (intents, gates) = pending_work(snapshot, &inputs);
    let orphaned_overrides = orphaned_overrides(snapshot, &inputs);
    let policy = agent.policy();
    let only = match &observations {
        Observations::Known { only, .. } => only.as_ref(),
        Observations::Fresh(_) => None,
    };
    let mut routing = Routing::route(
        agent.config(),
        policy,
        snapshot,
        &mut inputs,
        scope,
        now,
        only,
    );
    let mut memories = std::mem::take(&mut inputs.memories);
    let (guard, guard_effect) = guard(agent, snapshot, &routing, &mut inputs, &memories);
    let mut effects = std::mem::take(&mut routing.effects);
    effects.extend(guard_effect);

    let (views, only) = match observations {
        Observations::Fresh(ahead) => {
            tracing::debug!("observing, {:?} into the cycle", started.elapsed());
            let ahead = match ahead {
                Some(ahead) => ahead.if_fresh(agent.store()).await,
                None => HashMap::new(),
            };
            let views = observe::observe_all(agent.runtimes(), &routing.by_provider, ahead).await;
            tracing::debug!("observed, {:?} into the cycle", started.elapsed());
            (views, None)
        }
        Observations::Known { views, only } => (views, only),
    };
    let unobserved: HashSet<String> = routing
        .by_provider
        .keys()
        .filter(|provider| !matches!(views.get(*provider), Some(Ok(_))))
        .cloned()
        .collect();
    let renamed = std::mem::take(&mut routing.renamed);
    let ctx = PlanContext {
        policy,
        now,
        guard: &guard,
        inputs: &inputs,
        gates: &gates,
        just_replayed,
        renamed: &renamed,
    };
    let mut by_provider = std::mem::take(&mut routing.by_provider);
    if let Some(only) = &only {
        for subjects in by_provider.values_mut() {
            subjects.retain(|routed| only.contains(routed.subject.name()));
        }
    }
    // A whole provider's cycle takes its memories by position.
    if scope.is_whole() && only.is_none() {
        memories.align(snapshot);
    }
    let mut resources = decide_all(agent, &ctx, by_provider, views, &mut memories, &mut effects);
    resources.append(&mut routing.undecidable);
    // Declarations arrive sorted; only tombstones or several providers
    // leave anything to sort (and moving large entries is not free).
    if !resources.is_sorted_by(|a, b| a.name <= b.name) {
        resources.sort_by(|a, b| a.name.cmp(&b.name));
    }
    tracing::debug!("decided, {:?} into the cycle", started.elapsed());
    let written = Written::of(&effects, !renamed.is_empty());
    if let Some(store) = agent.store() {
        if mode == Mode::Apply && !effects.is_empty() {
            tracing::debug!("committing {} effects", effects.len());
            blocking(store, move |s| commit(s, &effects)).await?;
        }
        assign_generations(store, agent.agent_id(), &mut resources).await?;
    }
    let mut errors = snapshot.declarations.diagnostics.clone();
    errors.append(&mut routing.diagnostics);
    let released = unshown_releases(&inputs, scope, &resources);
    let plan = Plan {
        agent_id: agent.agent_id().to_string(),
        commit: Some(snapshot.commit.clone()),
        commit_time: Some(snapshot.commit_time),
        resources,
        errors,
        intents,
        orphaned_overrides,
        guard,
        suspension: inputs.suspension.clone(),
        released,
        now,
    };
    Ok(Planned {
        plan,
        unobserved,
        written,
        beside,
    })
}

/// The releases no report has shown yet, within the cycle's scope (a cycle
/// over some names only shows none: its report is merged into a whole
/// one), and not declared again.
fn unshown_releases(
    inputs: &Inputs,
    scope: &Scope,
    resources: &[PlannedResource<'_>],
) -> Vec<crate::journal::Release> {
    let in_scope = |provider: &str| match scope {
        Scope::All => true,
        Scope::Only(_) => false,
        Scope::Provider { provider: p, names } => names.is_none() && p == provider,
    };
    inputs
        .releases
        .iter()
        .filter(|(r, shown)| {
            !shown
                && in_scope(&r.provider)
                && resources
                    .binary_search_by(|x| x.name.as_str().cmp(&r.name))
                    .is_err()
        })
        .map(|(r, _)| r.clone())
        .collect()
}

/// Local overrides whose name is neither declared nor a resource the state
/// knows (managed, or tombstoned): whatever the cycle's scope, the same
/// list.
fn orphaned_overrides(snapshot: &Snapshot, inputs: &Inputs) -> Vec<OrphanedOverride> {
    let mut out: Vec<OrphanedOverride> = inputs
        .local_overrides
        .values()
        .filter(|o| {
            snapshot.declared(&o.name).is_none()
                && !inputs.memories.contains(&o.name)
                && !inputs.tombstones.iter().any(|t| t.name == o.name)
        })
        .map(|o| OrphanedOverride {
            name: o.name.clone(),
            reason: o
                .annotations
                .get(crate::model::overrides::OVERRIDE_REASON)
                .cloned()
                .unwrap_or_default(),
            set_at: o.set_at,
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Each pending intent with its verdict, and the work it holds back (a
/// replayed intent gates its resource; a superseded one does not).
fn pending_work(
    snapshot: &Snapshot,
    inputs: &Inputs,
) -> (Vec<IntentReport>, HashMap<String, PendingWork>) {
    let mut reports = Vec::new();
    let mut gates = HashMap::new();
    for p in &inputs.pending {
        let paused_locally = inputs
            .local_overrides
            .get(&p.op.name)
            .is_some_and(|o| o.is_pause());
        let v = verdict(
            p.op.kind,
            &p.op.spec_hash,
            snapshot.declared(&p.op.name),
            paused_locally,
        );
        let last_error = p
            .last_error
            .as_deref()
            .map(|e| format!(" (last error: {e})"))
            .unwrap_or_default();
        reports.push(IntentReport {
            name: p.op.name.clone(),
            kind: p.op.kind,
            id: p.op.id.clone(),
            rule: v.rule(),
            reason: match v {
                IntentVerdict::Replay => {
                    format!("replayed with the same id before any new work{last_error}")
                }
                IntentVerdict::Supersede(why) => format!("superseded, not replayed: {why}"),
            },
        });
        if v == IntentVerdict::Replay {
            gates.insert(
                p.op.name.clone(),
                PendingWork {
                    kind: p.op.kind,
                    id: p.op.id.clone(),
                    last_error: p.last_error.clone(),
                    attempts: p.attempts,
                    last_attempt: p.last_attempt,
                },
            );
        }
    }
    (reports, gates)
}

/// The mass-deletion guard over the whole fleet's due deletions, and the
/// effect that remembers (or ends) its hold.
fn guard(
    agent: &Agent,
    snapshot: &Snapshot,
    routing: &Routing<'_>,
    inputs: &mut Inputs,
    memories: &Memories,
) -> (DeletionGuard, Option<Effect>) {
    let had_holds = !inputs.held_deletions.is_empty();
    // A restored declaration's hold goes with its tombstone (an effect of
    // this cycle), and an approved one's with the approval: neither may keep
    // the guard tripped.
    inputs.held_deletions.retain(|name, _| {
        snapshot.declared(name).is_none() && !inputs.approvals.contains_key(name)
    });
    // What an operator approved is allowed by name: it does not count
    // toward the limit (an approved deletion that can never run, say of a
    // database without this agent's marker, must not trip the guard for
    // every later deletion).
    let due: Vec<DueDeletion<'_>> = routing
        .due_deletions
        .iter()
        .filter(|name| !inputs.approvals.contains_key(*name))
        .map(|name| DueDeletion {
            name,
            approved: false,
        })
        .collect();
    let guard = DeletionGuard::evaluate(
        &due,
        &inputs.held_deletions,
        memories.existed(),
        agent.deletion_limits(),
        snapshot.declarations.declarations.is_empty()
            && !agent
                .policy()
                .sabotaged(crate::sabotage::Sabotage::EmptyTreeNotGuarded),
        agent.clock().now(),
    );
    let effect = match guard.trip {
        Some(hold) => {
            let mut names: Vec<String> = due
                .iter()
                .map(|d| d.name.to_string())
                .chain(inputs.held_deletions.keys().cloned())
                .collect();
            names.sort_unstable();
            names.dedup();
            Some(Effect::HoldDeletions { names, hold })
        }
        None if had_holds => Some(Effect::ReleaseDeletions),
        None => None,
    };
    (guard, effect)
}

/// One decision per routed subject, provider by provider.
fn decide_all<'s>(
    agent: &Agent,
    ctx: &PlanContext<'_>,
    by_provider: BTreeMap<String, Vec<Routed<'s>>>,
    mut views: HashMap<String, ProviderView>,
    memories: &mut Memories,
    effects: &mut Vec<Effect>,
) -> Vec<PlannedResource<'s>> {
    let mut resources = Vec::with_capacity(by_provider.values().map(Vec::len).sum());
    for (provider, subjects) in by_provider {
        let Some(runtime) = agent.runtimes().get(&provider) else {
            continue;
        };
        let observed = observe::distribute(&subjects, views.remove(&provider));
        let capabilities = runtime.capabilities();
        let provider: Arc<str> = Arc::from(provider);
        for (routed, observed) in subjects.into_iter().zip(observed) {
            let name = routed.subject.name();
            let mut memory = memories.take(name, routed.position);
            let released = ctx
                .inputs
                .releases
                .iter()
                .find(|(r, _)| r.name == name)
                .map(|(r, _)| {
                    Box::new(crate::engine::Released {
                        database_name: r.database_name.clone(),
                        at: r.at,
                        removal_commit: r.removal_commit.clone(),
                    })
                });
            if released.is_some() || memory.released.is_some() {
                Arc::make_mut(&mut memory).released = released;
            }
            resources.push(plan::plan_subject(
                ctx,
                &provider,
                &capabilities,
                routed,
                observed,
                memory,
                effects,
            ));
        }
    }
    resources
}

/// Gives each planned operation its generation and id (the journal counts
/// the finished operations of the same kind on the same spec).
async fn assign_generations(
    store: &Arc<StateStore>,
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
