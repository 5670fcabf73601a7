//! One provider's worker: reconciles that provider's resources whenever
//! the source moves, the observation cadence (`observe`, at most `resync`)
//! falls due, someone asks (`tend reconcile`, `POST /v1/reconcile`), or a
//! held action falls due — each resource at its own
//! time, from its decision's `act_at`. One worker per provider, so a slow
//! provider never delays another's resources.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::health::Heartbeats;
use super::queue::DueQueue;
use crate::agent::Agent;
use crate::reconcile::{CycleInputs, Mode, ReconcileError, Scope, reconcile_with};
use crate::source::Snapshot;
use crate::status::board::StatusBoard;
use crate::status::build_report;
use crate::telemetry::Metrics;

/// What a worker listens to.
pub(crate) struct WorkerInputs {
    /// The source's snapshot in force (changes only when the commit does).
    pub snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    /// Bumped to reconcile everything now.
    pub resync: watch::Receiver<u64>,
    /// Cancelled to stop.
    pub stop: tokio_util::sync::CancellationToken,
    /// Where the worker says it is alive.
    pub heartbeats: Arc<Heartbeats>,
    /// A commit's changes, merged once for every worker.
    pub changes: Arc<crate::source::KeptChanges>,
    /// Shared by every worker: a cycle that is not small runs holding
    /// one (`reconcile.parallel_cycles`, see `wait_for_turn`).
    pub cycle_permits: Arc<tokio::sync::Semaphore>,
}

/// The soonest a resource just decided is due again.
const MIN_REQUEUE: Duration = Duration::from_secs(1);

/// How often an idle worker beats.
const BEAT: Duration = Duration::from_secs(1);

/// Why a cycle runs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wake {
    /// Everything of the provider.
    Full,
    /// These resources fell due.
    Due(BTreeSet<String>),
    /// The source moved to another commit.
    Commit,
    Stop,
}

/// What the worker reconciled last, to tell a new commit's changes from.
#[derive(Default)]
struct Reconciled {
    /// The snapshot of the last cycle that finished (`None`: none yet).
    snapshot: Option<Arc<Snapshot>>,
    /// Whether a cycle over every resource of the provider finished: the
    /// board holds a whole part that a partial report can update.
    whole: bool,
}

impl Reconciled {
    /// The resources of `provider` a cycle over `snapshot` must decide
    /// besides `names`: none when the snapshot is the one reconciled, the
    /// declarations it changed otherwise: those that name the provider,
    /// name none it has, or that its last report holds (a re-declared
    /// name whose removal it was deciding). `None`: every resource
    /// (nothing whole was reconciled yet, or the commit removed a
    /// declaration anywhere: a removal's tombstone is decided where the
    /// resource is managed, which may not be where it was declared, and
    /// its release and rename are a whole cycle's work).
    fn scope_over(
        &self,
        provider: &str,
        config: &crate::config::Config,
        board: &StatusBoard,
        (snapshot, kept): (&Arc<Snapshot>, &crate::source::KeptChanges),
        mut names: BTreeSet<String>,
    ) -> Option<(BTreeSet<String>, bool)> {
        let before = self.snapshot.as_ref().filter(|_| self.whole)?;
        if Arc::ptr_eq(before, snapshot) {
            return Some((names, false));
        }
        // A declaration whose provider cannot be named is every provider's
        // concern (each reports it, and one of them may manage it).
        let concerns =
            |d: &crate::model::Declaration| match crate::reconcile::routing::provider_name_of(
                config,
                &d.manifest,
            ) {
                Ok(named) => named == provider,
                Err(_) => true,
            };
        for at in kept.between(before, snapshot).iter() {
            let change = snapshot.change_at(before, *at);
            // Removed: a whole cycle.
            change.after?;
            let ours = change.before.is_some_and(concerns)
                || change.after.is_some_and(concerns)
                || board.holds(provider, change.name);
            if ours {
                names.insert(change.name.to_string());
            }
        }
        Some((names, true))
    }
}

/// A cycle over at most this many named resources runs without waiting
/// for a turn (see `reconcile.parallel_cycles`): what it holds is small.
const SMALL_CYCLE: usize = 1000;

/// Runs until told to stop.
pub(crate) async fn run(
    provider: String,
    agent: Arc<Agent>,
    board: Arc<StatusBoard>,
    metrics: Arc<Metrics>,
    mut inputs: WorkerInputs,
) {
    // Every resource is looked at every `observe` (a listing: cheap) and
    // at least every `resync`: drift made behind tend's back is seen
    // within about `observe`, whatever `resync` says.
    let reconcile = &agent.config().reconcile;
    let every = reconcile.observe.min(reconcile.resync);
    let mut queue = DueQueue::default();
    let mut next_full = Instant::now();
    // The memories read ahead while the worker waits, for its next cycle
    // (the agent's cache keeps the read while nothing is written).
    let mut preload: Option<crate::agent::Preload> = None;
    // Cycles in a row that could not observe the provider: the next one
    // comes after a backoff (seconds at first), not at the next `observe`.
    let mut failing = 0u32;
    // A commit wakes the worker for the declarations it changed, not for
    // the whole fleet: at 100,000 declarations a whole cycle per provider
    // for a one-file commit is most of the time to its status commit.
    let mut reconciled = Reconciled::default();
    metrics.provider_known(&provider);
    // A whole cycle that gave way to a commit while it waited for its
    // turn, and its place in the queue for one.
    let mut full_pending = false;
    let mut request: Option<TurnRequest> = None;
    // The last cycle, when it ended without its report (it failed): until
    // a cycle reports, the status writer knows its operations may be in
    // the journal and not in the reports. (Held for its drop.)
    let mut _unreported = None;
    loop {
        let wake = if std::mem::take(&mut full_pending) {
            Wake::Full
        } else {
            next_wake(&provider, &agent, &mut inputs, &mut queue, next_full).await
        };
        // A whole cycle waits for its turn (see `wait_for_turn`); a commit
        // that comes meanwhile is reconciled first, then the whole cycle.
        let (wake, turn) = match wake {
            Wake::Full => match wait_for_turn(&provider, &mut inputs, &mut request, true).await {
                Turn::Taken(permit) => (Wake::Full, Some(permit)),
                Turn::Commit => {
                    full_pending = true;
                    (Wake::Commit, None)
                }
                Turn::Stop => return,
            },
            other => (other, None),
        };
        let names = match wake {
            Wake::Stop => return,
            Wake::Full => None,
            Wake::Due(names) => Some(names),
            Wake::Commit => Some(BTreeSet::new()),
        };
        let Some(snapshot) = inputs.snapshots.borrow_and_update().clone() else {
            continue;
        };
        // Counted as running from the moment it takes the snapshot up: the
        // status writer, woken by another worker's report moving to the
        // commit, waits for this one's cycle instead of publishing first.
        // (Not while it waits for a turn: that can be long.)
        let commit = (snapshot.commit.as_str(), snapshot.commit_time);
        let mut arriving = Some(board.cycle_running(commit, agent.clock().now()));
        // Whatever woke it, a cycle over a snapshot the worker has not
        // reconciled decides that snapshot's changes too.
        let names = names.and_then(|names| {
            let over = (&snapshot, inputs.changes.as_ref());
            reconciled.scope_over(&provider, agent.config(), &board, over, names)
        });
        // A commit that changed none of the provider's declarations moves
        // its report to the commit: a cycle would decide nothing.
        if let (Some((names, true)), Some(before)) = (&names, &reconciled.snapshot)
            && names.is_empty()
            && move_part(&provider, &agent, &board, before, &snapshot)
        {
            reconciled.snapshot = Some(snapshot);
            continue;
        }
        let kind = match &names {
            None => {
                next_full = Instant::now() + every;
                "full"
            }
            Some((_, true)) => "change",
            Some((_, false)) => "due",
        };
        let scope = Scope::Provider {
            provider: provider.clone(),
            names: names.map(|(names, _)| names),
        };
        // Any other cycle that is not small (a commit that changed most
        // of the provider or removed a declaration, a first cycle) takes
        // a turn as it is: with the place a whole cycle that gave way
        // held, if any.
        let permit = match (turn, &scope) {
            (Some(permit), _) => Some(permit),
            (
                None,
                Scope::Provider {
                    names: Some(names), ..
                },
            ) if names.len() <= SMALL_CYCLE => None,
            (None, _) => {
                arriving = None;
                match wait_for_turn(&provider, &mut inputs, &mut request, false).await {
                    Turn::Taken(permit) => Some(permit),
                    Turn::Commit | Turn::Stop => return,
                }
            }
        };
        // (Handed over to `running` with no await between, unless the
        // test hook wedges the worker here.)
        drop(arriving);
        super::hooks::wedge_point().await;
        let running = board.cycle_running(commit, agent.clock().now());
        inputs.heartbeats.beat(&provider, true);
        // Read ahead (and shared with the other workers): usually ready.
        agent.finish_preload(preload.take()).await;
        let (done, retry) = cycle(
            &provider,
            &agent,
            &board,
            &metrics,
            &snapshot,
            (&scope, kind),
            &mut queue,
            &mut failing,
        )
        .await;
        drop(permit);
        // (After this cycle's report: a failed one's goes with it.)
        _unreported = (!done).then(|| running.ended_unreported());
        // A whole cycle that ran (the commit's, over a snapshot never
        // reconciled whole) is the one that gave way.
        full_pending &= kind != "full";
        if done {
            reconciled.whole |= kind == "full";
            reconciled.snapshot = Some(snapshot);
        }
        if let Some(retry) = retry {
            next_full = next_full.min(Instant::now() + retry);
        }
        // What this cycle wrote is read again while the worker waits
        // (once, whichever worker asks first).
        preload = agent.start_preload();
        inputs.heartbeats.beat(&provider, false);
        metrics.queue_depth(&provider, queue.len());
    }
}

/// Moves `provider`'s report from `before` to `after`, a commit that
/// changed none of its declarations (see [`crate::status::board::PartMove`]).
/// Returns `false` when the board holds no report of it to move, and when
/// a file that failed to parse at `before` parses (or is gone) at `after`:
/// a managed resource whose file could not be read was not taken for
/// removed, and now may be, with this commit as its removal's (a cycle
/// over no names still records the tombstones of the whole fleet).
fn move_part(
    provider: &str,
    agent: &Agent,
    board: &StatusBoard,
    before: &Snapshot,
    after: &Snapshot,
) -> bool {
    let still_failing = |d: &crate::model::Diagnostic| {
        after
            .declarations
            .diagnostics
            .iter()
            .any(|a| a.file == d.file)
    };
    if !before.declarations.diagnostics.iter().all(still_failing) {
        return false;
    }
    let declared = |name: &str| after.declared(name).is_some();
    let moved = board.advance(
        provider,
        crate::status::board::PartMove {
            source: crate::status::report::SourceInfo::of(
                agent.config(),
                Some(after.commit.clone()),
                Some(after.commit_time),
            ),
            errors_before: &before.declarations.diagnostics,
            errors_after: &after.declarations.diagnostics,
            declared: &declared,
        },
    );
    if moved {
        tracing::debug!(
            provider,
            commit = %after.commit,
            "the commit changes none of the provider's declarations: its report moves to it without a cycle"
        );
    }
    moved
}

/// How a wait for a whole cycle's turn ended.
enum Turn {
    Taken(tokio::sync::OwnedSemaphorePermit),
    /// The source moved first: its cycle runs before the whole one.
    Commit,
    Stop,
}

/// A worker's place in the queue for a turn. The semaphore is fair: the
/// request is kept while a commit that came first is reconciled, or the
/// whole cycle would go to the back of the queue at every commit.
type TurnRequest = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<tokio::sync::OwnedSemaphorePermit, tokio::sync::AcquireError>,
            > + Send,
    >,
>;

/// Waits for a turn to run a cycle over the whole provider.
///
/// Such a cycle holds its provider's listing, plan and report until its
/// report is published; every provider's at once held the whole fleet's
/// (at 100,000 over 10 providers, 170 MB more than two at a time). So
/// they take turns (`reconcile.parallel_cycles`, shared by every worker).
/// With `give_way`, a commit that comes while the worker waits is not
/// held behind another provider's slow listing: the wait ends (the place
/// in the queue is kept in `request`), and the commit's cycle runs first.
/// The worker beats while it waits, as it does between cycles: it is not
/// in a cycle yet, and the cycle it waits behind is watched on its own.
/// A stop ends the wait.
async fn wait_for_turn(
    provider: &str,
    inputs: &mut WorkerInputs,
    request: &mut Option<TurnRequest>,
    give_way: bool,
) -> Turn {
    if inputs.stop.is_cancelled() {
        return Turn::Stop;
    }
    let acquire = match request {
        Some(acquire) => acquire,
        None => {
            if let Ok(permit) = inputs.cycle_permits.clone().try_acquire_owned() {
                return Turn::Taken(permit);
            }
            tracing::debug!(
                provider,
                "the whole cycle waits for its turn: other providers' whole cycles run (reconcile.parallel_cycles)"
            );
            request.insert(Box::pin(inputs.cycle_permits.clone().acquire_owned()))
        }
    };
    let taken = loop {
        tokio::select! {
            biased;
            _ = inputs.stop.cancelled() => return Turn::Stop,
            changed = inputs.snapshots.changed(), if give_way => {
                return if changed.is_err() { Turn::Stop } else { Turn::Commit };
            }
            permit = acquire.as_mut() => break permit,
            _ = tokio::time::sleep(BEAT) => inputs.heartbeats.beat(provider, false),
        }
    };
    *request = None;
    // The semaphore is never closed.
    taken.map_or(Turn::Stop, Turn::Taken)
}

/// Waits for the next reason to reconcile.
async fn next_wake(
    provider: &str,
    agent: &Agent,
    inputs: &mut WorkerInputs,
    queue: &mut DueQueue,
    next_full: Instant,
) -> Wake {
    loop {
        if inputs.stop.is_cancelled() {
            return Wake::Stop;
        }
        inputs.heartbeats.beat(provider, false);
        let has_snapshot = inputs.snapshots.borrow().is_some();
        let due_in = queue.next().map(|at| {
            at.duration_since(agent.clock().now())
                .unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            biased;
            _ = inputs.stop.cancelled() => return Wake::Stop,
            changed = inputs.snapshots.changed() => {
                if changed.is_err() {
                    return Wake::Stop;
                }
                return Wake::Commit;
            }
            _ = inputs.resync.changed(), if has_snapshot => return Wake::Full,
            _ = tokio::time::sleep_until(next_full.into()), if has_snapshot => return Wake::Full,
            _ = tokio::time::sleep(BEAT) => {}
            _ = tokio::time::sleep(due_in.unwrap_or_default()), if has_snapshot && due_in.is_some() => {
                let due = queue.take_due(agent.clock().now());
                if !due.is_empty() {
                    return Wake::Due(due);
                }
            }
        }
    }
}

/// How long after `failing` cycles in a row that could not observe the
/// provider the next one runs: 1 s, doubling, at most 5 minutes.
fn observe_backoff(failing: u32) -> Duration {
    Duration::from_secs(1u64 << failing.saturating_sub(1).min(9)).min(Duration::from_secs(300))
}

/// One reconcile (with the memories read while the worker waited), its
/// report and its metrics; `kind` names the scope (`full`, `change`,
/// `due`). Returns whether the reconcile finished, and how soon to try
/// again when the provider could not be observed (`failing` counts such
/// cycles in a row).
#[allow(clippy::too_many_arguments)]
async fn cycle(
    provider: &str,
    agent: &Agent,
    board: &StatusBoard,
    metrics: &Metrics,
    snapshot: &Arc<Snapshot>,
    (scope, kind): (&Scope, &str),
    queue: &mut DueQueue,
    failing: &mut u32,
) -> (bool, Option<Duration>) {
    let started = Instant::now();
    let names = match scope {
        Scope::Provider { names, .. } => names.as_ref(),
        _ => None,
    };
    let full = names.is_none();
    tracing::debug!(
        provider,
        scope = kind,
        "cycle starts{}",
        names.map_or(String::new(), |n| format!(" over {} resources", n.len()))
    );
    let ahead = CycleInputs { listing: None };
    match reconcile_with(agent, snapshot, Mode::Apply, scope, ahead).await {
        Ok(outcome) => {
            let plan = outcome.latest();
            if full {
                queue.clear();
            }
            // A due time already past (a retry whose call could not be
            // sent) comes back a second later at the soonest: never a
            // cycle after cycle with no pause.
            let soonest = crate::time::add(agent.clock().now(), MIN_REQUEUE);
            queue.update(
                plan.resources.iter().map(|r| r.name.as_str()),
                outcome
                    .due()
                    .into_iter()
                    .map(|(name, at)| (name, at.max(soonest))),
            );
            metrics.operations(outcome.operations.iter().map(|op| op.metric_labels()));
            // A call the provider failed (left pending, refused, failed)
            // is a provider error as much as an observation that failed.
            for _ in outcome.operations.iter().filter(|op| {
                matches!(
                    op.outcome,
                    crate::executor::OpOutcome::Pending(_)
                        | crate::executor::OpOutcome::Failed(_)
                        | crate::executor::OpOutcome::Refused(_)
                )
            }) {
                metrics.provider_error(provider, "operation");
            }
            for op in &outcome.operations {
                tracing::info!(
                    provider,
                    resource = %op.name,
                    operation = %op.id,
                    kind = op.kind.as_str(),
                    "{} {}: {}",
                    op.kind.as_str(),
                    op.name,
                    op.outcome.describe()
                );
            }
            for r in plan
                .resources
                .iter()
                .filter(|r| r.decision.action == crate::engine::Action::Hold)
            {
                tracing::debug!(
                    provider,
                    resource = %r.name,
                    rule = r.decision.rule.as_str(),
                    "held: {}",
                    r.decision.reason
                );
            }
            let failed = |r: &crate::reconcile::PlannedResource<'_>| {
                matches!(r.observed, crate::provider::Observed::Failed(_))
            };
            if plan.resources.iter().any(failed) {
                metrics.provider_error(provider, "observe");
            }
            // A cycle that could observe none of its resources (the
            // provider is down) did not succeed, though it finished: the
            // "last successful cycle" alert must fire for a provider
            // outage.
            let observed = plan.resources.is_empty() || !plan.resources.iter().all(failed);
            let retry = if plan.resources.iter().any(failed) {
                *failing += 1;
                Some(observe_backoff(*failing))
            } else {
                *failing = 0;
                None
            };
            let mut report = build_report(agent.config(), plan);
            // What could not be observed is looked at again after the
            // backoff: the report says when.
            if let Some(retry) = retry {
                let at = crate::time::rfc3339(crate::time::add(SystemTime::now(), retry));
                for r in report
                    .resources
                    .iter_mut()
                    .filter(|r| r.rule == crate::engine::Rule::ObservationFailed.as_str())
                {
                    Arc::make_mut(r).acts_at = Some(at.clone());
                }
                tracing::info!(
                    provider,
                    "not all of the provider's resources could be observed ({} cycle{} in a row): looking again in {}",
                    failing,
                    if *failing == 1 { "" } else { "s" },
                    crate::time::duration(retry)
                );
            }
            board.publish(provider, report, names);
            metrics.cycle(provider, kind, observed, started.elapsed().as_secs_f64());
            if observed {
                let now = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                metrics.succeeded_at(now);
            }
            tracing::info!(
                provider,
                scope = kind,
                operations = outcome.operations.len(),
                "cycle done in {:?}",
                started.elapsed()
            );
            (true, retry)
        }
        Err(e) => {
            if let ReconcileError::State { finished, .. } = &e {
                metrics.operations(finished.iter().map(|op| op.metric_labels()));
            }
            metrics.cycle(provider, kind, false, started.elapsed().as_secs_f64());
            *failing += 1;
            let retry = observe_backoff(*failing);
            tracing::error!(
                provider,
                "cycle failed: {e}; tried again in {}",
                crate::time::duration(retry)
            );
            (false, Some(retry))
        }
    }
}
