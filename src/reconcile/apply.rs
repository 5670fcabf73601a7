//! `Mode::Apply`: replay what the journal left pending, decide (and commit
//! the effects), execute the decisions, decide again for the report (from
//! the confirming observations when every operation has one, otherwise
//! from a new observation).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::cycle::{Observations, Planned, plan_cycle};
use super::inputs::{Inputs, MemoryRead};
use super::observe::ListingAhead;
use super::standing;
use super::{Mode, Outcome, Plan, PlannedResource, ReconcileError, Scope};
use crate::agent::Agent;
use crate::executor::queue::execute;
use crate::executor::replay::Replay;
use crate::executor::request::{self, RequestSubject};
use crate::executor::{Confirmation, ExecContext, Executed, OpOutcome, PlannedOperation};
use crate::journal::effects::{Effect, commit};
use crate::journal::{StateError, blocking};
use crate::provider::OperationKind;
use crate::source::Snapshot;

pub(super) async fn apply_cycle<'s>(
    agent: &Agent,
    snapshot: &'s Arc<Snapshot>,
    scope: &Scope,
    given: super::CycleInputs,
) -> Result<Outcome<'s>, ReconcileError> {
    let ctx = agent.exec_context().ok_or(ReconcileError::ReadOnly)?;
    // The providers that list everything are listed while the journal is
    // replayed and the inputs read (a replay that writes makes the cycle
    // observe again: see `ListingAhead`).
    let ahead = ListingAhead::for_cycle(given.listing, agent, scope).await;
    let (replayed, mut operations) = replay_pending(agent, &ctx, snapshot, scope).await?;
    let Planned {
        plan,
        unobserved,
        written,
        beside,
    } = plan_cycle(
        agent,
        snapshot,
        Mode::Apply,
        scope,
        &replayed,
        Observations::Fresh(ahead),
    )
    .await
    .map_err(keep(&mut operations))?;
    let (mut ran, error) = execute_decisions(agent, &ctx, &plan).await;
    // An operation never sent left its database as the cycle observed it.
    let all_confirmed = unobserved.is_empty()
        && ran
            .iter()
            .all(|e| e.confirmed_by.is_some() || matches!(e.outcome, OpOutcome::NotSent(_)));
    // Moved out, not copied: at a cold start every declaration's create has
    // one, and a second copy of 10,000 observations beside the plan set the
    // agent's peak resident memory (which it keeps: see `process::heap`).
    let confirmations: HashMap<String, Box<Confirmation>> = ran
        .iter_mut()
        .filter_map(|e| Some((e.name.clone(), e.confirmed_by.take()?)))
        .collect();
    if operations.is_empty() {
        operations = ran;
    } else {
        operations.extend(ran);
    }
    operations.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(error) = error {
        return Err(ReconcileError::State {
            error,
            finished: operations,
        });
    }
    // A deletion that failed (replayed or new) says why on its tombstone,
    // for `Stalled`; an operation refused for good is held as `Failed`.
    let now = agent.clock().now();
    let mut failed = deletion_errors(&operations, now);
    failed.extend(refusals(&operations, &plan, now));
    blocking(&ctx.store, move |s| commit(s, &failed))
        .await
        .map_err(keep(&mut operations))?;
    let plan = if operations.is_empty() {
        plan
    } else {
        // Decided again from what memory now holds. What the providers show
        // is known without asking again when every operation was confirmed
        // by an observation (an unconfirmed one, or a provider that could
        // not be observed, is looked at again: the report tells what was
        // seen, never what was hoped); then only what the operations and
        // the cycle's effects changed is decided again.
        let again = all_confirmed
            .then(|| standing::decided_again(&plan, &written, &operations, &confirmations))
            .flatten();
        match again {
            Some(again) => {
                let views = standing::views_of(&plan, &again, confirmations.clone());
                let only = Some(again.clone());
                let second =
                    decide_again(agent, snapshot, scope, Observations::Known { views, only })
                        .await
                        .map_err(keep(&mut operations))?;
                if standing::still_stands(&beside, &second.beside, &second.plan) {
                    standing::merge(plan, &again, second.plan)
                } else {
                    // Written beside the cycle between its passes, or a
                    // deletion came due: decided again whole.
                    drop(second);
                    let views = standing::views_after(plan, confirmations);
                    let only = None;
                    decide_again(agent, snapshot, scope, Observations::Known { views, only })
                        .await
                        .map_err(keep(&mut operations))?
                        .plan
                }
            }
            None => {
                let observations = if all_confirmed {
                    Observations::Known {
                        views: standing::views_after(plan, confirmations),
                        only: None,
                    }
                } else {
                    drop((plan, confirmations));
                    Observations::Fresh(None)
                };
                decide_again(agent, snapshot, scope, observations)
                    .await
                    .map_err(keep(&mut operations))?
                    .plan
            }
        }
    };
    Ok(Outcome { plan, operations })
}

/// Decides again after a cycle's operations (writing nothing).
async fn decide_again<'s>(
    agent: &Agent,
    snapshot: &'s Arc<Snapshot>,
    scope: &Scope,
    observations: Observations,
) -> Result<Planned<'s>, StateError> {
    let none = HashSet::new();
    plan_cycle(agent, snapshot, Mode::Plan, scope, &none, observations).await
}

/// A state failure, with what already ran (moved, never copied ahead of a
/// failure: at a cold start that is 10,000 operations).
fn keep(operations: &mut Vec<Executed>) -> impl FnOnce(StateError) -> ReconcileError + '_ {
    move |error| ReconcileError::State {
        error,
        finished: std::mem::take(operations),
    }
}

/// Pending intents first: finish what a lost response or a crash left,
/// with the same ids, before any new work; supersede (end without
/// replaying) what the repository has overtaken. Returns the names whose
/// intents were replayed and the replays' outcomes.
async fn replay_pending(
    agent: &Agent,
    ctx: &ExecContext,
    snapshot: &Arc<Snapshot>,
    scope: &Scope,
) -> Result<(HashSet<String>, Vec<Executed>), ReconcileError> {
    let scope = scope.clone();
    let now = agent.clock().now();
    let replay = {
        let snapshot = snapshot.clone();
        blocking(&ctx.store, move |store| {
            // Only the journal and the local pauses are needed here.
            let inputs = Inputs::load(store, &snapshot, MemoryRead::Skip)?;
            // Looked up by name in the sorted set: a map of 100,000
            // declarations for each cycle's few intents cost 30-50 ms.
            let declarations = |name: &str| snapshot.declared(name);
            let paused: HashSet<&str> = inputs
                .local_overrides
                .values()
                .filter(|o| o.is_pause())
                .map(|o| o.name.as_str())
                .collect();
            // Only this scope's intents: two workers must never replay one.
            // Suspended: nothing is sent, a replay included; the intents
            // stay pending (and hold their resources) until `tend resume`.
            if inputs.suspension.as_ref().is_some_and(|s| s.in_force(now)) {
                return Ok(Replay::sort(Vec::new(), declarations, &paused));
            }
            let pending = inputs
                .pending
                .iter()
                .filter(|p| scope.admits(&p.op.name, &p.op.request.provider))
                // A resource whose state cannot be read is left alone:
                // its intent stays pending, neither replayed nor dropped.
                .filter(|p| !inputs.corrupt.contains_key(&p.op.name))
                .map(|p| p.op.clone())
                .collect();
            Ok(Replay::sort(pending, declarations, &paused))
        })
        .await?
    };
    for (op, why) in &replay.superseded {
        tracing::warn!(
            resource = %op.name,
            operation = %op.id,
            "not replaying {} {}: {why}",
            op.kind.as_str(),
            op.name
        );
    }
    let superseded = replay.superseded_effects(agent.clock().now());
    blocking(&ctx.store, move |s| commit(s, &superseded)).await?;
    let replayed: HashSet<String> = replay.replay.iter().map(|op| op.name.clone()).collect();
    let run = execute(
        agent.runtimes(),
        ctx,
        replay.replay,
        |op| op.request.provider.as_str(),
        Some,
        agent.progress(),
    )
    .await;
    match run.error {
        Some(error) => Err(ReconcileError::State {
            error,
            finished: run.finished,
        }),
        None => Ok((replayed, run.finished)),
    }
}

/// Runs every decision that has an operation; a deletion's request is
/// remembered on its tombstone first (for `Stalled`). Returns the
/// outcomes, and the state-store failure that stopped new work, if one
/// did.
/// The largest batch of operations whose confirming observations a cycle
/// keeps to decide again from (about a kilobyte each). A larger batch
/// (a cold start creating a whole fleet) observes the providers again
/// instead: one listing, where the observations would have been held
/// through the batch and set the agent's peak memory, which a running
/// agent keeps.
const KEEP_CONFIRMATIONS_AT_MOST: usize = 1_000;

async fn execute_decisions(
    agent: &Agent,
    ctx: &ExecContext,
    plan: &Plan<'_>,
) -> (Vec<Executed>, Option<StateError>) {
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
    if let Err(e) = blocking(&ctx.store, move |s| commit(s, &requested)).await {
        return (Vec::new(), Some(e));
    }
    let ctx = &ExecContext {
        keep_confirmations: work.len() <= KEEP_CONFIRMATIONS_AT_MOST,
        ..ctx.clone()
    };
    let run = execute(
        agent.runtimes(),
        ctx,
        work,
        |r| &*r.provider,
        |r| planned_operation(agent, plan.commit.as_deref(), r),
        agent.progress(),
    )
    .await;
    (run.finished, run.error)
}

/// The failure of each deletion among `operations`, as tombstone progress.
fn deletion_errors(operations: &[Executed], now: std::time::SystemTime) -> Vec<Effect> {
    operations
        .iter()
        .filter_map(|e| match (&e.kind, &e.outcome) {
            (
                OperationKind::Delete,
                OpOutcome::Pending(error) | OpOutcome::Failed(error) | OpOutcome::Refused(error),
            ) => Some(Effect::DeletionProgress {
                name: e.name.clone(),
                at: now,
                error: Some(error.clone()),
            }),
            _ => None,
        })
        .collect()
}

/// Each operation the provider refused for good in this cycle, with what
/// it was decided from (the declaration's spec hash, the observation's
/// fingerprint): the resource is `Failed`, and the operation is not sent
/// again while both stay the same. (A replayed intent has no decision of
/// this cycle: it is not held, and its next failure is.)
fn refusals(operations: &[Executed], plan: &Plan<'_>, now: std::time::SystemTime) -> Vec<Effect> {
    operations
        .iter()
        .filter_map(|e| {
            let OpOutcome::Refused(message) = &e.outcome else {
                return None;
            };
            let r = plan
                .resources
                .iter()
                .find(|r| r.name == e.name && r.operation.as_ref().is_some_and(|o| o.id == e.id))?;
            Some(Effect::OperationFailed {
                name: e.name.clone(),
                failure: Box::new(crate::engine::OperationFailure {
                    operation_id: e.id.0.clone(),
                    kind: e.kind.as_str().to_string(),
                    spec_hash: r.spec_hash.clone(),
                    observed: crate::engine::observed_fingerprint(&r.observed),
                    message: message.clone(),
                    at: now,
                }),
            })
        })
        .collect()
}

/// The operation that carries out a planned resource's decision.
fn planned_operation(
    agent: &Agent,
    commit: Option<&str>,
    r: &PlannedResource<'_>,
) -> Option<PlannedOperation> {
    let op = r.operation.as_ref()?;
    let manifest = r.subject.manifest()?;
    let capabilities = &agent.runtimes().get(&*r.provider)?.capabilities();
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
