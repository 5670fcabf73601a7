//! Running many operations: at most each provider's `max_concurrency` at a
//! time, and a slow provider never delays another provider's operations.
//!
//! Work waits in a queue per provider and becomes an operation (`build`:
//! the journal request, kilobytes of JSON) and a task only when one of the
//! provider's slots frees: ten thousand built and spawned at once held
//! well over 100 MB while they waited. Each slot has one more operation
//! journalled ahead of it ([`LOOKAHEAD_PER_SLOT`]), waiting for the slot:
//! a freed slot's next call goes out at once, not after that operation's
//! intent is committed (with every slot's call ending at about the same
//! time, those commits queued behind each other on the one state
//! connection, and a provider answering in 50 ms sat idle for 4 ms a
//! round).
//!
//! # Guarantees
//! * Every operation that started is waited for, even after an error: a
//!   call may have reached the provider, and its outcome must be recorded.
//! * An error stops new work; what finished before and after it is still
//!   returned ([`Execution::finished`]) beside the error.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use tokio::task::JoinSet;

use super::operation::{self, Confirmation, OpOutcome, PlannedOperation};
use super::{ExecContext, ProviderRuntime};
use crate::journal::StateError;
use crate::provider::{OperationId, OperationKind, Provider};

/// One operation's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Executed {
    pub name: String,
    pub kind: OperationKind,
    pub id: OperationId,
    pub outcome: OpOutcome,
    /// The observation that confirmed it (none unless it was confirmed;
    /// taken by the cycle that decides again from it).
    /// Boxed: most operations carry none, and a cycle holds 10,000 of
    /// these at a cold start.
    pub confirmed_by: Option<Box<Confirmation>>,
}

impl Executed {
    /// Its `kind` and `result` labels in `tend_operations_total`.
    pub fn metric_labels(&self) -> (&'static str, &'static str) {
        (self.kind.as_str(), self.outcome.metric_label())
    }
}

/// What running a batch of operations did.
#[derive(Debug, Default)]
pub(crate) struct Execution {
    /// Finished operations, by name.
    pub finished: Vec<Executed>,
    /// The first state-store failure; no new operation started after it.
    pub error: Option<StateError>,
}

/// Told of each finished operation (the CLI draws a progress bar).
pub trait Progress: Send + Sync {
    fn finished(&self, done: usize, total: usize, executed: &Executed);

    /// Told every [`IN_FLIGHT_BEAT`] while `operations` are running and
    /// none has finished since the last word: the executor is alive,
    /// waiting on calls that the provider's own timeouts bound (a DBaaS
    /// create polled for minutes must not look like a wedged loop).
    /// `oldest`: how long the longest-running of them has run (one past
    /// every deadline of its calls is hung, not slow).
    fn in_flight(&self, _operations: usize, _oldest: std::time::Duration) {}
}

/// How often the executor tells its [`Progress`] that operations are
/// still in flight.
pub(crate) const IN_FLIGHT_BEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// No progress reporting.
#[derive(Debug, Default)]
pub(crate) struct Silent;

impl Progress for Silent {
    fn finished(&self, _: usize, _: usize, _: &Executed) {}
}

type Joined = (String, Executed, Option<StateError>);

/// Operations started per provider slot: the one calling and one whose
/// intent is journalled while it waits for the slot. The provider still
/// sees at most `max_concurrency` calls at once (its slots are the limit,
/// see [`operation::run`]).
pub(crate) const LOOKAHEAD_PER_SLOT: usize = 2;

/// Runs `queued` work; `provider_of` routes an item, `build` turns it into
/// an operation when a slot is free (`None`: nothing to run).
pub(crate) async fn execute<T, P: Provider>(
    runtimes: &BTreeMap<String, Arc<ProviderRuntime<P>>>,
    ctx: &ExecContext,
    queued: Vec<T>,
    provider_of: impl Fn(&T) -> &str,
    mut build: impl FnMut(T) -> Option<PlannedOperation>,
    progress: &dyn Progress,
) -> Execution {
    let total = queued.len();
    let commits_before = ctx.store.commits();
    let ctx = &ExecContext {
        halted: Arc::default(),
        ..ctx.clone()
    };
    let mut queues: BTreeMap<String, VecDeque<T>> = BTreeMap::new();
    for item in queued {
        let provider = provider_of(&item);
        if runtimes.contains_key(provider) {
            queues
                .entry(provider.to_string())
                .or_default()
                .push_back(item);
        }
    }
    let mut tasks: JoinSet<Joined> = JoinSet::new();
    // When each task in flight started.
    let mut started: BTreeMap<tokio::task::Id, std::time::Instant> = BTreeMap::new();
    let mut start_next = |tasks: &mut JoinSet<Joined>,
                          started: &mut BTreeMap<tokio::task::Id, std::time::Instant>,
                          queues: &mut BTreeMap<String, VecDeque<T>>,
                          provider: &str| {
        let Some(runtime) = runtimes.get(provider).cloned() else {
            return;
        };
        if ctx.draining.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        while let Some(item) = queues.get_mut(provider).and_then(VecDeque::pop_front) {
            let Some(op) = build(item) else { continue };
            let (provider, ctx) = (provider.to_string(), ctx.clone());
            let keep = ctx.keep_confirmations;
            let handle = tasks.spawn(async move {
                let (name, kind, id) = (op.name.clone(), op.kind, op.id.clone());
                // Its own task, so a panic still tells which provider's slot
                // came free (the intent stays pending for the next cycle).
                let (outcome, confirmed_by, error) =
                    match tokio::spawn(operation::run(runtime, ctx, op)).await {
                        Ok(Ok((outcome, seen))) => {
                            (outcome, seen.filter(|_| keep).map(Box::new), None)
                        }
                        Ok(Err(e)) => (OpOutcome::Pending(format!("journal: {e}")), None, Some(e)),
                        Err(e) => {
                            let message = format!(
                                "stopped: {e}; the intent stays pending for the next cycle"
                            );
                            tracing::error!("{} {name} ({id}) {message}", kind.as_str());
                            (OpOutcome::Pending(message), None, None)
                        }
                    };
                (
                    provider,
                    Executed {
                        name,
                        kind,
                        id,
                        outcome,
                        confirmed_by,
                    },
                    error,
                )
            });
            started.insert(handle.id(), std::time::Instant::now());
            break;
        }
    };
    let providers: Vec<String> = queues.keys().cloned().collect();
    for provider in &providers {
        let slots = runtimes.get(provider).map_or(1, |r| r.max_concurrency);
        for _ in 0..slots * LOOKAHEAD_PER_SLOT {
            start_next(&mut tasks, &mut started, &mut queues, provider);
        }
    }
    let mut execution = Execution::default();
    let mut beat = tokio::time::interval(IN_FLIGHT_BEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    beat.reset();
    loop {
        let joined = tokio::select! {
            joined = tasks.join_next_with_id() => joined,
            _ = beat.tick() => {
                let oldest = started
                    .values()
                    .min()
                    .map_or(std::time::Duration::ZERO, |t| t.elapsed());
                progress.in_flight(tasks.len(), oldest);
                continue;
            }
        };
        let Some(joined) = joined else {
            break;
        };
        beat.reset();
        let Ok((id, (provider, executed, error))) = joined else {
            // A panicked task: its start goes with it.
            if let Err(e) = &joined {
                started.remove(&e.id());
            }
            continue;
        };
        started.remove(&id);
        if let Some(e) = error {
            execution.error.get_or_insert(e);
        }
        if execution.error.is_none() {
            start_next(&mut tasks, &mut started, &mut queues, &provider);
        }
        progress.finished(execution.finished.len() + 1, total, &executed);
        execution.finished.push(executed);
    }
    execution.finished.sort_by(|a, b| a.name.cmp(&b.name));
    if execution.finished.is_empty() {
        return execution;
    }
    let (commits, writes) = ctx.store.commits();
    tracing::debug!(
        "{} operations run; meanwhile the state committed {} writes in {} commits",
        execution.finished.len(),
        writes.saturating_sub(commits_before.1),
        commits.saturating_sub(commits_before.0),
    );
    execution
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use crate::clock::SystemClock;
    use crate::executor::operation::{JournalRequest, RequestBody};
    use crate::executor::{ExecLimits, RetryPolicy};
    use crate::journal::StateStore;
    use crate::model::SpecHash;
    use crate::provider::{Capabilities, ChangeRequest, Observation, ProviderError};

    /// Deletes whatever it is asked to and observes nothing (so every
    /// delete is confirmed at once); records the calls. Each call takes
    /// `delay`. With `drain`, a call starts the agent's drain, and the
    /// first call counts the intents open in the journal as it ends.
    #[derive(Default)]
    struct Deleter {
        calls: Mutex<Vec<String>>,
        delay: Duration,
        drain: Option<(Arc<std::sync::atomic::AtomicBool>, Arc<StateStore>)>,
        open_as_the_first_call_ended: Mutex<Option<usize>>,
    }

    /// A journal and a fake provider with `max_concurrency` slots; the
    /// journal refuses `refused`'s intent, as a full disk would.
    struct Fixture {
        store: Arc<StateStore>,
        ctx: ExecContext,
        runtime: Arc<ProviderRuntime<Deleter>>,
        _dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new(
            max_concurrency: usize,
            refused: Option<&str>,
            provider: impl FnOnce(&ExecContext) -> Deleter,
        ) -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let store = Arc::new(StateStore::open(dir.path(), true).unwrap().unwrap());
            if let Some(name) = refused {
                rusqlite::Connection::open(dir.path().join("state.db"))
                    .unwrap()
                    .execute_batch(&format!(
                        "CREATE TRIGGER refuse BEFORE INSERT ON intents WHEN NEW.name = '{name}'
                         BEGIN SELECT RAISE(ABORT, 'injected: disk full'); END;"
                    ))
                    .unwrap();
            }
            let ctx = ExecContext {
                store: store.clone(),
                agent_id: Arc::from("agent"),
                clock: Arc::new(SystemClock),
                draining: Arc::default(),
                halted: Arc::default(),
                keep_confirmations: false,
                #[cfg(feature = "test-hooks")]
                sabotage: Default::default(),
            };
            let runtime = Arc::new(ProviderRuntime::new(
                "fake",
                provider(&ctx),
                ExecLimits {
                    max_concurrency,
                    rate_per_second: 1000,
                    retry: RetryPolicy::default(),
                    confirm_timeout: Duration::from_secs(1),
                },
            ));
            Fixture {
                store,
                ctx,
                runtime,
                _dir: dir,
            }
        }

        fn calls(&self) -> Vec<String> {
            self.runtime.provider.calls.lock().unwrap().clone()
        }

        fn open_intents(&self) -> Vec<String> {
            self.store
                .open_intents()
                .unwrap()
                .into_iter()
                .map(|i| i.unwrap().name)
                .collect()
        }
    }

    struct Batch {
        fixture: Fixture,
        execution: Execution,
    }

    impl Batch {
        /// Deletes `names` through a [`Fixture`].
        async fn run(
            max_concurrency: usize,
            names: &[&str],
            refused: Option<&str>,
            provider: impl FnOnce(&ExecContext) -> Deleter,
        ) -> Batch {
            let fixture = Fixture::new(max_concurrency, refused, provider);
            let runtimes = BTreeMap::from([("fake".to_string(), fixture.runtime.clone())]);
            let execution = execute(
                &runtimes,
                &fixture.ctx,
                names.iter().map(|n| delete(n)).collect(),
                |op| op.request.provider.as_str(),
                Some,
                &Silent,
            )
            .await;
            Batch { fixture, execution }
        }

        fn finished(&self) -> Vec<(&str, &OpOutcome)> {
            self.execution
                .finished
                .iter()
                .map(|e| (e.name.as_str(), &e.outcome))
                .collect()
        }

        fn calls(&self) -> Vec<String> {
            self.fixture.calls()
        }

        fn open_intents(&self) -> Vec<String> {
            self.fixture.open_intents()
        }
    }

    impl Provider for Deleter {
        fn capabilities(&self) -> Capabilities {
            Capabilities::for_fields(&[], false)
        }
        async fn observe_all(
            &self,
            _: &[String],
            _: &[String],
        ) -> Result<Vec<Observation>, ProviderError> {
            Ok(Vec::new())
        }
        async fn observe(&self, _: &str) -> Result<Option<Observation>, ProviderError> {
            Ok(None)
        }
        async fn create(
            &self,
            _: &OperationId,
            r: &ChangeRequest,
        ) -> Result<Observation, ProviderError> {
            Err(ProviderError::Permanent {
                resource: r.database_name.clone(),
                message: "not in this test".into(),
            })
        }
        async fn update(
            &self,
            op: &OperationId,
            r: &ChangeRequest,
        ) -> Result<Observation, ProviderError> {
            self.create(op, r).await
        }
        async fn delete(&self, _: &OperationId, name: &str) -> Result<(), ProviderError> {
            let first = {
                let mut calls = self.calls.lock().unwrap();
                calls.push(name.to_string());
                calls.len() == 1
            };
            if let Some((draining, _)) = &self.drain {
                draining.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            tokio::time::sleep(self.delay).await;
            if let Some((_, journal)) = &self.drain
                && first
            {
                // However slow the machine: the next intent is journalled
                // while this call is in flight, or never.
                let until = std::time::Instant::now() + Duration::from_secs(5);
                let mut open = journal.open_intents().unwrap().len();
                while open < 2 && std::time::Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    open = journal.open_intents().unwrap().len();
                }
                *self.open_as_the_first_call_ended.lock().unwrap() = Some(open);
            }
            Ok(())
        }
    }

    fn delete(name: &str) -> PlannedOperation {
        PlannedOperation {
            name: name.into(),
            kind: OperationKind::Delete,
            spec_hash: SpecHash::from("h"),
            generation: 0,
            id: OperationId(format!("op-{name}")),
            request: JournalRequest {
                provider: "fake".into(),
                database_name: name.into(),
                file: String::new(),
                commit: None,
                manifest: serde_json::Value::Null,
                desired: BTreeMap::new(),
                body: RequestBody::Delete {
                    database_name: name.into(),
                },
            },
        }
    }

    #[tokio::test]
    async fn the_next_intent_is_journalled_during_a_call_and_not_sent_after_a_drain() {
        let batch = Batch::run(1, &["a", "b", "c"], None, |ctx| Deleter {
            delay: Duration::from_millis(50),
            drain: Some((ctx.draining.clone(), ctx.store.clone())),
            ..Deleter::default()
        })
        .await;
        assert_eq!(
            *batch
                .fixture
                .runtime
                .provider
                .open_as_the_first_call_ended
                .lock()
                .unwrap(),
            Some(2),
            "the second intent was journalled while the first call was in flight"
        );
        // The agent began draining during the first call (a's or b's,
        // whichever intent was committed first): the other waited for the
        // one slot with its intent journalled, and is not sent.
        let calls = batch.calls();
        assert_eq!(calls.len(), 1, "{calls:?}");
        let (sent, waited) = if calls[0] == "a" {
            ("a", "b")
        } else {
            ("b", "a")
        };
        let finished = batch.finished();
        assert_eq!(finished.len(), 2, "c never started: {finished:?}");
        let outcome = |name: &str| {
            finished
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, o)| (*o).clone())
        };
        assert_eq!(outcome(sent), Some(OpOutcome::Done), "{finished:?}");
        assert!(
            matches!(outcome(waited), Some(OpOutcome::NotSent(why)) if why.contains("the agent is stopping")),
            "{finished:?}"
        );
        assert_eq!(
            batch.open_intents(),
            [waited],
            "the unsent intent stays pending for the next cycle"
        );
    }

    #[tokio::test]
    async fn a_journal_failure_stops_new_work_and_keeps_what_finished() {
        // One slot: a (or b, whichever intent is committed first) is sent,
        // the other journalled meanwhile and sent when that call ends; c's
        // intent is refused after the first finished; d, started when the
        // second finished (or not at all, if c's failure was seen first),
        // is never sent.
        let batch = Batch::run(1, &["a", "b", "c", "d"], Some("c"), |_| Deleter {
            delay: Duration::from_millis(20),
            ..Deleter::default()
        })
        .await;
        let finished = batch.finished();
        assert_eq!(finished[0], ("a", &OpOutcome::Done), "{finished:?}");
        assert_eq!(finished[1], ("b", &OpOutcome::Done), "{finished:?}");
        assert_eq!(finished[2].0, "c");
        assert!(matches!(finished[2].1, OpOutcome::Pending(why) if why.contains("journal")));
        assert!(
            finished.len() == 3
                || matches!(finished[3], ("d", OpOutcome::NotSent(why)) if why.contains("a journal write failed")),
            "{finished:?}"
        );
        assert!(
            batch
                .execution
                .error
                .as_ref()
                .unwrap()
                .to_string()
                .contains("injected: disk full")
        );
        let mut calls = batch.calls();
        calls.sort();
        assert_eq!(calls, ["a", "b"], "c was never sent");
    }

    #[tokio::test]
    async fn an_operation_that_reaches_its_slot_after_a_journal_failure_is_not_sent() {
        let fixture = Fixture::new(1, None, |_| Deleter::default());
        // Another operation of the batch failed to write the journal.
        fixture
            .ctx
            .halted
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let (outcome, confirmed) =
            operation::run(fixture.runtime.clone(), fixture.ctx.clone(), delete("c"))
                .await
                .unwrap();
        assert!(
            matches!(&outcome, OpOutcome::NotSent(why) if why.contains("a journal write failed")),
            "{outcome:?}"
        );
        assert!(confirmed.is_none());
        assert!(fixture.calls().is_empty());
        assert_eq!(
            fixture.open_intents(),
            ["c"],
            "journalled, pending for the next cycle"
        );
    }

    /// The confirming observations come back only when the batch keeps
    /// them: a cold start's batch holding one per database set the running
    /// agent's peak memory.
    #[tokio::test]
    async fn confirmations_are_returned_only_when_the_batch_keeps_them() {
        for keep in [false, true] {
            let mut fixture = Fixture::new(2, None, |_| Deleter::default());
            fixture.ctx.keep_confirmations = keep;
            let runtimes = BTreeMap::from([("fake".to_string(), fixture.runtime.clone())]);
            let execution = execute(
                &runtimes,
                &fixture.ctx,
                ["a", "b"].iter().map(|n| delete(n)).collect(),
                |op| op.request.provider.as_str(),
                Some,
                &Silent,
            )
            .await;
            let confirmed: Vec<(&str, bool)> = execution
                .finished
                .iter()
                .map(|e| (e.name.as_str(), e.confirmed_by.is_some()))
                .collect();
            assert_eq!(confirmed, [("a", keep), ("b", keep)], "keep = {keep}");
            assert!(
                execution
                    .finished
                    .iter()
                    .all(|e| e.outcome == OpOutcome::Done),
                "{:?}",
                execution.finished
            );
        }
    }
}
