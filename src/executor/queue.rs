//! Running many operations: at most each provider's `max_concurrency` at a
//! time, and a slow provider never delays another provider's operations.
//!
//! Work waits in a queue per provider and becomes an operation (`build`:
//! the journal request, kilobytes of JSON) and a task only when one of the
//! provider's slots frees: ten thousand built and spawned at once held
//! well over 100 MB while they waited.
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
    /// The observation that confirmed it (none unless it was confirmed).
    pub confirmed_by: Option<Confirmation>,
}

/// What running a batch of operations did.
#[derive(Debug, Default)]
pub struct Execution {
    /// Finished operations, by name.
    pub finished: Vec<Executed>,
    /// The first state-store failure; no new operation started after it.
    pub error: Option<StateError>,
}

/// Told of each finished operation (the CLI draws a progress bar).
pub trait Progress: Send + Sync {
    fn finished(&self, done: usize, total: usize, executed: &Executed);
}

/// No progress reporting.
#[derive(Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn finished(&self, _: usize, _: usize, _: &Executed) {}
}

type Joined = (String, Executed, Option<StateError>);

/// Runs `queued` work; `provider_of` routes an item, `build` turns it into
/// an operation when a slot is free (`None`: nothing to run).
pub async fn execute<T, P: Provider>(
    runtimes: &BTreeMap<String, Arc<ProviderRuntime<P>>>,
    ctx: &ExecContext,
    queued: Vec<T>,
    provider_of: impl Fn(&T) -> &str,
    mut build: impl FnMut(T) -> Option<PlannedOperation>,
    progress: &dyn Progress,
) -> Execution {
    let total = queued.len();
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
    let mut start_next = |tasks: &mut JoinSet<Joined>,
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
            tasks.spawn(async move {
                let (name, kind, id) = (op.name.clone(), op.kind, op.id.clone());
                // Its own task, so a panic still tells which provider's slot
                // came free (the intent stays pending for the next cycle).
                let (outcome, confirmed_by, error) =
                    match tokio::spawn(operation::run(runtime, ctx, op)).await {
                        Ok(Ok((outcome, seen))) => (outcome, seen, None),
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
            break;
        }
    };
    let providers: Vec<String> = queues.keys().cloned().collect();
    for provider in &providers {
        let slots = runtimes.get(provider).map_or(1, |r| r.max_concurrency);
        for _ in 0..slots {
            start_next(&mut tasks, &mut queues, provider);
        }
    }
    let mut execution = Execution::default();
    while let Some(joined) = tasks.join_next().await {
        let Ok((provider, executed, error)) = joined else {
            continue;
        };
        if let Some(e) = error {
            execution.error.get_or_insert(e);
        }
        if execution.error.is_none() {
            start_next(&mut tasks, &mut queues, &provider);
        }
        progress.finished(execution.finished.len() + 1, total, &executed);
        execution.finished.push(executed);
    }
    execution.finished.sort_by(|a, b| a.name.cmp(&b.name));
    execution
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use crate::clock::SystemClock;
    use crate::executor::{ExecLimits, JournalRequest, RequestBody, RetryPolicy};
    use crate::journal::StateStore;
    use crate::model::SpecHash;
    use crate::provider::{Capabilities, ChangeRequest, Observation, ProviderError};

    /// Deletes whatever it is asked to and observes nothing (so every
    /// delete is confirmed at once); records the calls.
    #[derive(Default)]
    struct Deleter {
        calls: Mutex<Vec<String>>,
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
            self.calls.lock().unwrap().push(name.to_string());
            Ok(())
        }
    }

    fn delete(name: &str) -> PlannedOperation {
        PlannedOperation {
            name: name.into(),
            kind: OperationKind::Delete,
            spec_hash: SpecHash("h".into()),
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
    async fn a_journal_failure_stops_new_work_and_keeps_what_finished() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(StateStore::open(dir.path(), true).unwrap().unwrap());
        // The journal refuses b's intent, as a full disk would.
        rusqlite::Connection::open(dir.path().join("state.db"))
            .unwrap()
            .execute_batch(
                "CREATE TRIGGER refuse_b BEFORE INSERT ON intents WHEN NEW.name = 'b'
                 BEGIN SELECT RAISE(ABORT, 'injected: disk full'); END;",
            )
            .unwrap();
        let runtime = Arc::new(ProviderRuntime::new(
            "fake",
            Deleter::default(),
            ExecLimits {
                max_concurrency: 1,
                rate_per_second: 1000,
                retry: RetryPolicy::default(),
                confirm_timeout: Duration::from_secs(1),
            },
        ));
        let runtimes = BTreeMap::from([("fake".to_string(), runtime.clone())]);
        let ctx = ExecContext {
            store: store.clone(),
            agent_id: Arc::from("agent"),
            clock: Arc::new(SystemClock),
            draining: Arc::default(),
            sabotage: Default::default(),
            crash: Default::default(),
        };
        let execution = execute(
            &runtimes,
            &ctx,
            vec![delete("a"), delete("b"), delete("c")],
            |op| op.request.provider.as_str(),
            Some,
            &Silent,
        )
        .await;
        let finished: Vec<(&str, &OpOutcome)> = execution
            .finished
            .iter()
            .map(|e| (e.name.as_str(), &e.outcome))
            .collect();
        assert_eq!(
            finished[0],
            ("a", &OpOutcome::Done),
            "a finished before the failure"
        );
        assert_eq!(finished[1].0, "b");
        assert!(matches!(finished[1].1, OpOutcome::Pending(why) if why.contains("journal")));
        assert_eq!(finished.len(), 2, "c never started");
        assert!(
            execution
                .error
                .unwrap()
                .to_string()
                .contains("injected: disk full")
        );
        assert_eq!(
            *runtime.provider.calls.lock().unwrap(),
            ["a"],
            "b was never sent"
        );
    }
}
