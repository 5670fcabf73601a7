//! One incarnation of the running agent (`Running`): its source follower,
//! bridge, status writer, notification deliveries and provider workers,
//! started together under a child of the agent's cancellation token;
//! restarted one by one when a task ends on its own; stopped and reloaded
//! as a whole.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::health::Heartbeats;
use super::{Shared, fail, reopen, worker};
use crate::agent::Agent;
use crate::clock::SystemClock;
use crate::config::{Config, ConfigError};
use crate::journal::Access;
use crate::process::exit;
use crate::source::{PollOutcome, Snapshot, SourceError, Wakeups};
use crate::status::board::{SourceStatus, StatusBoard};
use crate::status::notify::deliver::Notifier;
use crate::telemetry::Metrics;

/// The status writer of `agent`, as a task to spawn.
pub(super) fn status_writer(
    agent: &Agent,
    shared: &Shared,
    restart: &Restart,
) -> impl std::future::Future<Output = ()> + use<> {
    let publisher = crate::status::publish::StatusPublisher::new(
        agent,
        crate::status::writer::TITLE,
        &Default::default(),
        restart.notifier.clone(),
    );
    crate::status::writer::run(
        shared.board.clone(),
        publisher,
        agent.clock().clone(),
        shared.metrics.clone(),
        restart.wake.clone(),
        restart.stop_rx.clone(),
    )
}

/// Resolves when the notification deliveries end (never, without them).
pub(super) async fn deliveries_ended(
    deliveries: &mut Option<tokio::task::JoinHandle<()>>,
) -> Result<(), tokio::task::JoinError> {
    match deliveries {
        Some(handle) => handle.await,
        None => std::future::pending().await,
    }
}

/// Why a task's handle ended: a panic's message, or "it returned".
pub(super) fn ended(joined: Result<(), tokio::task::JoinError>) -> String {
    match joined {
        Ok(()) => "it returned".into(),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            format!("it panicked: {message}")
        }
        Err(e) => format!("it was cancelled: {e}"),
    }
}

/// Why an incarnation of the agent could not start.
#[derive(Debug, thiserror::Error)]
pub(super) enum StartError {
    #[error("source: {0}")]
    Source(#[from] SourceError),
    #[error("{0}")]
    Config(#[from] ConfigError),
}

impl StartError {
    /// 78 only for a configuration that cannot work (systemd then stops
    /// restarting, `RestartPreventExitStatus=78`); a failure of I/O, of
    /// inotify or of the Git cache may pass, and exits 1 so
    /// `Restart=on-failure` tries again.
    pub(super) fn exit_code(&self) -> u8 {
        match self {
            StartError::Config(_) => exit::CONFIG,
            StartError::Source(_) => exit::ERROR,
        }
    }
}

/// One incarnation of the agent: its source follower and its workers.
pub(super) struct Running {
    pub(super) agent: Arc<Agent>,
    /// Cancelled to stop this incarnation (a child of the agent's
    /// shutdown token).
    pub(super) stop: CancellationToken,
    /// Every task of this incarnation but the workers (the source
    /// follower, the bridge, the status writer, the deliveries): a stop
    /// waits for them all, and names the ones that do not end.
    pub(super) tasks: TaskTracker,
    pub(super) workers: JoinSet<()>,
    pub(super) source: tokio::task::JoinHandle<()>,
    pub(super) bridge: tokio::task::JoinHandle<()>,
    /// Writes the report files (ends when `stop` turns true).
    pub(super) status: tokio::task::JoinHandle<()>,
    /// Delivers notifications (ends when `stop` turns true).
    pub(super) deliveries: Option<tokio::task::JoinHandle<()>>,
    /// What restarting the status writer or the source follower needs.
    pub(super) restart: Restart,
}

/// What the coordinator needs to start a task of the agent again after it
/// ended on its own (a panic), and how often it did.
pub(super) struct Restart {
    pub(super) stop_rx: CancellationToken,
    pub(super) notifier: Option<Arc<Notifier>>,
    pub(super) wake: Arc<tokio::sync::Notify>,
    pub(super) outcomes: watch::Sender<Option<PollOutcome>>,
    pub(super) status_restarts: u32,
    pub(super) source_restarts: u32,
    pub(super) deliveries_restarts: u32,
}

/// How long after its `n`-th restart a task is started again: 1 s,
/// doubling, at most a minute.
fn restart_delay(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}

/// Runs `task` after `delay`.
async fn after<F: std::future::Future<Output = ()>>(delay: Duration, task: F) {
    tokio::time::sleep(delay).await;
    task.await;
}

impl Running {
    pub(super) fn start(agent: Arc<Agent>, shared: &Shared) -> Result<Self, StartError> {
        // Every worker decides from the same read of the memories, kept
        // while nothing is written.
        agent.memories().retain();
        shared
            .heartbeats
            .set_operation_deadline(crate::executor::RetryPolicy::operation_deadline(
                agent.config(),
            ));
        let source = agent.source()?.parses_on_disk().packing_beside();
        let config = agent.config();
        let wakeups = Wakeups::new(config.source.interval, &config.source.url)?;
        *shared
            .server
            .fetch
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(wakeups.trigger());
        let stop = shared.shutdown.child_token();
        let stop_rx = stop.clone();
        let tasks = TaskTracker::new();
        let (outcomes_tx, outcomes) = watch::channel(None);
        let source = tasks.spawn(crate::source::follow(
            source,
            wakeups,
            outcomes_tx.clone(),
            stop_rx.clone(),
        ));
        let (snapshots_tx, snapshots) = watch::channel(None);
        let bridge = tasks.spawn(bridge(
            stop_rx.clone(),
            outcomes,
            snapshots_tx,
            shared.board.clone(),
            shared.metrics.clone(),
            shared.latest_snapshot.clone(),
            (shared.heartbeats.clone(), config.source.interval),
        ));
        let notifier = Notifier::from_config(config)?.map(Arc::new);
        let wake = Arc::new(tokio::sync::Notify::new());
        let deliveries = match (&notifier, agent.store()) {
            (Some(notifier), Some(store)) => {
                Some(tasks.spawn(crate::status::notify::deliver::run(
                    notifier.clone(),
                    store.clone(),
                    wake.clone(),
                    stop_rx.clone(),
                )))
            }
            _ => None,
        };
        let restart = Restart {
            stop_rx: stop_rx.clone(),
            notifier,
            wake,
            outcomes: outcomes_tx,
            status_restarts: 0,
            source_restarts: 0,
            deliveries_restarts: 0,
        };
        let status = tasks.spawn(status_writer(&agent, shared, &restart));
        let mut workers = JoinSet::new();
        let changes = Arc::new(crate::source::KeptChanges::default());
        let cycle_permits = Arc::new(tokio::sync::Semaphore::new(
            config.reconcile.parallel_cycles,
        ));
        for provider in agent.runtimes().keys() {
            workers.spawn(worker::run(
                provider.clone(),
                agent.clone(),
                shared.board.clone(),
                shared.metrics.clone(),
                worker::WorkerInputs {
                    snapshots: snapshots.clone(),
                    resync: shared.resync.subscribe(),
                    stop: stop_rx.clone(),
                    heartbeats: shared.heartbeats.clone(),
                    changes: changes.clone(),
                    cycle_permits: cycle_permits.clone(),
                },
            ));
        }
        Ok(Running {
            agent,
            stop,
            tasks,
            workers,
            source,
            bridge,
            status,
            deliveries,
            restart,
        })
    }

    /// The status writer ended on its own (`why`): started again after a
    /// backoff, with a fresh publisher (the report is written again whole).
    pub(super) fn restart_status(&mut self, shared: &Shared, why: String) {
        self.restart.status_restarts += 1;
        let delay = restart_delay(self.restart.status_restarts);
        tracing::error!(
            "status: the status writer ended ({why}); started again in {} (restart {})",
            crate::time::duration(delay),
            self.restart.status_restarts
        );
        let writer = status_writer(&self.agent, shared, &self.restart);
        self.status = self.tasks.spawn(after(delay, writer));
    }

    /// The notification deliveries ended on its own (`why`): started again
    /// after a backoff (the queue keeps every message meanwhile).
    pub(super) fn restart_deliveries(&mut self, why: String) {
        let (Some(notifier), Some(store)) = (self.restart.notifier.clone(), self.agent.store())
        else {
            self.deliveries = None;
            return;
        };
        self.restart.deliveries_restarts += 1;
        let delay = restart_delay(self.restart.deliveries_restarts);
        tracing::error!(
            "notifications: the delivery task ended ({why}); started again in {} (restart {})",
            crate::time::duration(delay),
            self.restart.deliveries_restarts
        );
        let deliveries = crate::status::notify::deliver::run(
            notifier,
            store.clone(),
            self.restart.wake.clone(),
            self.restart.stop_rx.clone(),
        );
        self.deliveries = Some(self.tasks.spawn(after(delay, deliveries)));
    }

    /// The source follower ended on its own (`why`): opened again and
    /// started after a backoff; if it cannot be opened, the agent cannot
    /// follow its source, and says so (`Err`).
    pub(super) fn restart_source(
        &mut self,
        shared: &Shared,
        why: String,
    ) -> Result<(), StartError> {
        self.restart.source_restarts += 1;
        let delay = restart_delay(self.restart.source_restarts);
        tracing::error!(
            "source: the source follower ended ({why}); started again in {} (restart {})",
            crate::time::duration(delay),
            self.restart.source_restarts
        );
        let source = self.agent.source()?.parses_on_disk().packing_beside();
        let config = self.agent.config();
        let wakeups = Wakeups::new(config.source.interval, &config.source.url)?;
        *shared
            .server
            .fetch
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(wakeups.trigger());
        let follower = crate::source::follow(
            source,
            wakeups,
            self.restart.outcomes.clone(),
            self.restart.stop_rx.clone(),
        );
        self.source = self.tasks.spawn(after(delay, follower));
        Ok(())
    }

    /// Stops taking work and waits (up to `timeout`) for the workers to
    /// finish their cycles; returns the agent (its lock and store) when
    /// they did.
    pub(super) async fn stop(mut self, timeout: Duration) -> Option<Agent> {
        self.agent.drain();
        self.stop.cancel();
        crate::source::transport::cancel_conversations();
        self.tasks.close();
        let started = Instant::now();
        let drained = tokio::time::timeout(timeout, async {
            while self.workers.join_next().await.is_some() {}
        })
        .await;
        // Every other task ends at the token: the writer after a write
        // under way, a delivery after its call (bounded by its receiver's
        // timeout), the source follower after a fetch under way (bounded
        // by `[source] timeout`: waited for, so the next follower after a
        // reload never fetches beside it).
        let limit = crate::source::transport::cancel_wait() + Duration::from_secs(5);
        if tokio::time::timeout(limit, self.tasks.wait())
            .await
            .is_err()
        {
            let mut running = Vec::new();
            for (name, finished) in [
                ("the source follower", self.source.is_finished()),
                ("the bridge", self.bridge.is_finished()),
                ("the status writer", self.status.is_finished()),
                (
                    "the notification deliveries",
                    self.deliveries.as_ref().is_none_or(|d| d.is_finished()),
                ),
            ] {
                if !finished {
                    running.push(name);
                }
            }
            tracing::warn!(
                "stopping: {} still running after {}; left to end on their own",
                running.join(", "),
                crate::time::duration(limit)
            );
            self.source.abort();
            self.bridge.abort();
            self.status.abort();
            if let Some(deliveries) = &self.deliveries {
                deliveries.abort();
            }
        }
        if drained.is_err() {
            let busy = self.agent.runtimes().keys().cloned().collect::<Vec<_>>();
            tracing::warn!(
                "stopping: operations of {} still running after {:?}: they stay journalled and are resolved at the next start",
                busy.join(", "),
                started.elapsed()
            );
            self.workers.abort_all();
            return None;
        }
        // The workers are gone: this is the last reference.
        Arc::into_inner(self.agent)
    }

    /// Reloads the configuration: an invalid one (or one that moves the
    /// state dir or the listen address) is refused and the agent keeps
    /// running; a valid one restarts the source follower and the workers
    /// with the same state lock. `Err`: the agent cannot go on.
    pub(super) async fn reload(self, config_path: &Path, shared: &Shared) -> Result<Running, u8> {
        let refuse = |why: String| {
            tracing::error!("configuration reload refused, running on the previous one: {why}");
            shared.metrics.reload(false);
        };
        let config = match Config::load(config_path) {
            Ok(c) => c,
            Err(e) => {
                refuse(e.to_string());
                return Ok(self);
            }
        };
        let old = self.agent.config();
        if config.state_dir != old.state_dir
            || config.server.listen != old.server.listen
            || config.control_socket() != old.control_socket()
            || config.control.group != old.control.group
        {
            refuse("state_dir, [server] listen and [control] take effect only at a restart".into());
            return Ok(self);
        }
        if let Some(id) = config
            .agent_id
            .as_deref()
            .filter(|id| *id != self.agent.agent_id())
        {
            refuse(format!(
                "agent_id = \"{id}\", but this agent is `{}` (kept in its state, and carried by every database it manages): set agent_id = \"{}\"",
                self.agent.agent_id(),
                self.agent.agent_id()
            ));
            return Ok(self);
        }
        if !config.state.same_place(&old.state) {
            refuse("where the state is kept ([state] backend, url, schema, lease_ttl, ...) takes effect only at a restart".into());
            return Ok(self);
        }
        let min_interval = config.server.reconcile_min_interval;
        let access = match super::server_access(&config) {
            Ok(s) => s,
            Err(e) => {
                refuse(e.to_string());
                return Ok(self);
            }
        };
        // Every provider must build (secrets read, kinds known), and every
        // notification receiver, before the running agent is stopped.
        let checked = Agent::open(config.clone(), Access::ReadOnly, Arc::new(SystemClock));
        // Opening it set the new `[source] timeout` process-wide: the
        // running agent's holds until the new one starts.
        crate::source::transport::set_timeout(old.source.timeout);
        if let Err(e) = checked {
            refuse(e.to_string());
            return Ok(self);
        }
        if let Err(e) = Notifier::from_config(&config) {
            refuse(e.to_string());
            return Ok(self);
        }
        let timeout = old.reconcile.shutdown_timeout;
        let providers: Vec<String> = self.agent.runtimes().keys().cloned().collect();
        let Some(stopped) = self.stop(timeout).await else {
            fail(
                "the reload could not stop the running cycles in time; exiting (restart to resume)",
            );
            return Err(exit::ERROR);
        };
        let agent = match reopen(stopped, config, shared) {
            Ok(agent) => agent,
            Err(e) => {
                fail(format!("cannot reopen the agent after a reload: {e}"));
                return Err(exit::ERROR);
            }
        };
        *shared
            .server
            .access
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = access;
        shared.server.reconciles.set_interval(min_interval);
        for provider in &providers {
            shared.heartbeats.forget(provider);
        }
        shared.board.reset_parts();
        let running = Running::start(Arc::new(agent), shared).map_err(|e| {
            fail(&e);
            e.exit_code()
        })?;
        shared.metrics.reload(true);
        tracing::info!("configuration reloaded");
        Ok(running)
    }
}

/// Publishes what the source follower saw: the snapshot in force (only
/// when its commit changes, so an unchanged poll wakes no worker), the
/// source's state and its metrics.
async fn bridge(
    stop: CancellationToken,
    mut outcomes: watch::Receiver<Option<PollOutcome>>,
    snapshots: watch::Sender<Option<Arc<Snapshot>>>,
    board: Arc<StatusBoard>,
    metrics: Arc<Metrics>,
    latest: Arc<Mutex<Option<Arc<Snapshot>>>>,
    (heartbeats, interval): (Arc<Heartbeats>, Duration),
) {
    loop {
        tokio::select! {
            changed = outcomes.changed() => if changed.is_err() { return },
            _ = stop.cancelled() => return,
        }
        let Some(outcome) = outcomes.borrow_and_update().clone() else {
            continue;
        };
        // The next poll comes after the interval (+10 % jitter) or the
        // failure backoff, and its fetch ends within `[source] timeout`.
        let wait = match &outcome.failure {
            Some(f) => SourceError::backoff(f.failures),
            None => interval.mul_f64(1.1),
        };
        heartbeats
            .source_polled(wait + crate::source::transport::timeout() + Duration::from_secs(30));
        if let Some(failure) = &outcome.failure {
            metrics.fetch_error();
            tracing::warn!(
                "source: {} (failing since {}, {} attempt{})",
                failure.error,
                crate::time::rfc3339(failure.since),
                failure.failures,
                if failure.failures == 1 { "" } else { "s" }
            );
        }
        let snapshot = outcome.snapshot;
        board.set_source(SourceStatus {
            commit: snapshot.as_ref().map(|s| s.commit.clone()),
            commit_time: snapshot.as_ref().map(|s| s.commit_time),
            failure: outcome.failure.clone(),
        });
        if let Some(snapshot) = snapshot {
            let age = crate::time::since(std::time::SystemTime::now(), snapshot.commit_time);
            metrics.source(&snapshot.commit, age.as_secs_f64());
            let changed = snapshots
                .borrow()
                .as_ref()
                .is_none_or(|current| current.commit != snapshot.commit);
            if changed {
                tracing::info!(commit = %snapshot.commit, "new snapshot");
                *latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(snapshot.clone());
                snapshots.send_replace(Some(snapshot));
            }
        }
    }
}
