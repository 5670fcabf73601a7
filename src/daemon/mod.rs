//! `tend run`: the agent as a long-running service.
//!
//! Stages: load the configuration (an error exits 78) → open the state and
//! take the writer lock for the daemon's life → bind the HTTP server →
//! follow the source and start one worker per provider ([`worker`]) → the
//! coordinator loop: signals, the systemd watchdog and status line.
//!
//! # Guarantees
//! * SIGTERM/SIGINT: no new operation starts; running ones get
//!   `shutdown_timeout` to finish; whatever is left stays journalled and is
//!   replayed at the next start. A second signal exits at once.
//! * SIGHUP reloads the configuration; an invalid one is refused (logged,
//!   `tend_config_reload_failed` 1) and the agent keeps running on the old.
//! * `WATCHDOG=1` is sent only while every provider worker is alive.
//! * On a shared PostgreSQL state, the agent acts only while it holds its
//!   group's leader lease ([`leadership`]); otherwise it stands by, ready
//!   and watched but starting no cycle.

mod health;
mod hooks;
mod leadership;
pub mod queue;
mod signals;
mod systemd;
pub mod worker;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::{Agent, AgentError};
use crate::clock::SystemClock;
use crate::config::{Config, ConfigError};
use crate::journal::{Access, BackendKind, Fence};
use crate::process::exit;
use crate::server::ServerState;
use crate::source::{PollOutcome, Snapshot, SourceError, Wakeups};
use crate::status::board::{SourceStatus, StatusBoard};
use crate::status::notify::deliver::Notifier;
use crate::telemetry::Metrics;
use health::Heartbeats;
use leadership::Leadership;
use signals::{Request, Signals};

/// The journal is pruned this long after start, then this often.
const PRUNE_FIRST: Duration = Duration::from_secs(60);
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Finished intents kept per resource whatever their age (`explain`).
const KEEP_PER_RESOURCE: u32 = 5;

/// Drops finished intents older than `[state] journal_retention`.
async fn prune_journal(agent: &Agent) {
    let Some(store) = agent.store() else { return };
    let retention = agent.config().state.journal_retention;
    let cutoff = agent
        .clock()
        .now()
        .checked_sub(retention)
        .unwrap_or(std::time::UNIX_EPOCH);
    match crate::journal::blocking(store, move |s| s.prune_journal(cutoff, KEEP_PER_RESOURCE)).await
    {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            "journal: pruned {n} finished intents older than {}",
            crate::time::duration(retention)
        ),
        Err(e) => tracing::warn!("journal: cannot prune: {e}"),
    }
}

pub use signals::EXIT_INTERRUPTED;

fn fail(error: impl std::fmt::Display) {
    eprintln!("tend: {error}");
}

/// Runs the agent until a signal stops it; the process exit code.
pub fn run(config_path: &Path) -> u8 {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            fail(e);
            return exit::CONFIG;
        }
    };
    let secret = match config.webhook_secret() {
        Ok(s) => s,
        Err(e) => {
            fail(e);
            return exit::CONFIG;
        }
    };
    crate::process::heap::one_arena();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(4)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            fail(format!("cannot start the async runtime: {e}"));
            return exit::ERROR;
        }
    };
    let code = runtime.block_on(lifecycle(config_path, config, secret));
    // A blocking call abandoned at the stop (a fetch stuck where no
    // timeout reaches) must not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(5));
    code
}

/// Carries operators' requests out on the agent's state: the same
/// actions as the commands' own, checked against the snapshot in force;
/// a change wakes every worker (and `tend reconcile` a fetch) so it takes
/// effect now.
fn control_handler(
    store: Arc<crate::journal::StateStore>,
    latest: Arc<Mutex<Option<Arc<Snapshot>>>>,
    server: Arc<ServerState>,
) -> crate::control::server::Handler {
    use crate::control::{Request, actions};
    Arc::new(move |request, peer| {
        let snapshot = latest.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let ctx = actions::Context {
            store: &store,
            declarations: Ok(snapshot.as_deref()),
            now: std::time::SystemTime::now(),
            by: peer.describe(),
            by_agent: true,
        };
        let answer = actions::carry_out(request, &ctx);
        if answer.code == exit::OK {
            if matches!(request, Request::Reconcile { .. }) {
                server.fire_fetch();
            }
            server.resync.send_modify(|n| *n += 1);
        }
        answer
    })
}

/// What every incarnation of the running agent shares (across reloads).
struct Shared {
    /// The snapshot in force, for operators' requests to check names
    /// against.
    latest_snapshot: Arc<Mutex<Option<Arc<Snapshot>>>>,
    board: Arc<StatusBoard>,
    metrics: Arc<Metrics>,
    heartbeats: Arc<Heartbeats>,
    server: Arc<ServerState>,
    resync: watch::Sender<u64>,
    /// Cancelled when the agent stops: the server and the control socket
    /// end, and every incarnation's token (a child of this one) with them.
    shutdown: CancellationToken,
}

async fn lifecycle(config_path: &Path, config: Config, secret: Option<Vec<u8>>) -> u8 {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            fail(format!("cannot install signal handlers: {e}"));
            return exit::ERROR;
        }
    };
    let listen = config.server.listen;
    let control_group = match config.control_group() {
        Ok(g) => g,
        Err(e) => {
            fail(e);
            return exit::CONFIG;
        }
    };
    let heartbeats = Arc::new(Heartbeats::default());
    let mut agent = match Agent::open(config, Access::Writer, Arc::new(SystemClock)) {
        Ok(agent) => agent.with_progress(heartbeats.clone()),
        Err(e) => {
            fail(&e);
            return e.exit_code();
        }
    };
    if let Err(e) = agent.mark_running_agent() {
        tracing::warn!("cannot mark the state's lock as the running agent's: {e}");
    }
    // Bound while the state's lock is held: a socket there is stale.
    let control_socket = match crate::control::server::bind(
        &agent.config().control_socket(),
        control_group.as_ref(),
    ) {
        Ok(socket) => socket,
        Err(e) => {
            fail(e);
            return exit::ERROR;
        }
    };
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            fail(format!("cannot listen on {listen} ([server] listen): {e}"));
            return exit::ERROR;
        }
    };
    let (ready_tx, ready_rx) = watch::channel(false);
    let (standby_tx, standby_rx) = watch::channel(None);
    let board = Arc::new(StatusBoard::default());
    let metrics = Arc::new(Metrics::new());
    let resync = watch::Sender::new(0);
    let latest_snapshot: Arc<Mutex<Option<Arc<Snapshot>>>> = Arc::default();
    let shared = Shared {
        latest_snapshot: latest_snapshot.clone(),
        server: Arc::new(ServerState {
            board: board.clone(),
            metrics: metrics.clone(),
            fetch: Mutex::new(None),
            resync: resync.clone(),
            webhook_secret: Mutex::new(secret),
            ready: ready_rx,
            standby: standby_rx,
        }),
        board,
        metrics,
        heartbeats,
        resync,
        shutdown: CancellationToken::new(),
    };
    // One token stops everything (the server, the control socket, and
    // through its child tokens every incarnation's tasks).
    let shutdown = shared.shutdown.clone();
    let files = crate::server::listener::raise_file_limit();
    let max_connections = crate::server::listener::max_connections(files);
    tracing::debug!("open files: at most {files}; HTTP connections: at most {max_connections}");
    let server = tokio::spawn(crate::server::serve(
        listener,
        shared.server.clone(),
        shutdown.clone(),
        max_connections,
    ));
    tracing::info!("listening on http://{listen}");
    let control = match agent.store() {
        Some(store) => {
            let handler = control_handler(store.clone(), latest_snapshot, shared.server.clone());
            // SAFETY: geteuid has no preconditions and cannot fail.
            let uid = unsafe { libc::geteuid() };
            tracing::info!(
                "operators' commands on {}",
                agent.config().control_socket().display()
            );
            Some(tokio::spawn(crate::control::server::serve(
                control_socket,
                uid,
                control_group,
                handler,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    let code = loop {
        let leading = match agent
            .store()
            .filter(|s| s.backend() == BackendKind::Postgres)
            .cloned()
        {
            None => None,
            Some(store) => {
                let ttl = agent.config().state.lease_ttl;
                let leadership = Leadership::new(store.clone(), agent.agent_id(), ttl);
                shared.metrics.leader(false);
                let token = match stand_by(&leadership, &mut signals, &standby_tx).await {
                    StandbyEnd::Leading(token) => token,
                    StandbyEnd::Shutdown => break exit::OK,
                };
                store.set_fence(Some(Fence {
                    agent_id: agent.agent_id().to_string(),
                    token,
                }));
                standby_tx.send_replace(None);
                tracing::info!(
                    "leading agent group {} as {} (token {token})",
                    agent.agent_id(),
                    leadership.me.holder
                );
                Some((leadership, token))
            }
        };
        shared.metrics.leader(true);
        let running = match Running::start(Arc::new(agent), &shared) {
            Ok(r) => r,
            Err(e) => {
                fail(&e);
                break e.exit_code();
            }
        };
        let lost = async {
            match &leading {
                Some((leadership, token)) => leadership.keep(*token).await,
                None => std::future::pending().await,
            }
        };
        match coordinate(config_path, running, &shared, &mut signals, &ready_tx, lost).await {
            Err(code) => break code,
            Ok(Stopped::Shutdown(running)) => {
                systemd::stopping();
                tracing::info!("stopping: no new operations; waiting for running ones");
                let shutdown_timeout = running.agent.config().reconcile.shutdown_timeout;
                // A second SIGTERM exits the process from the signal
                // watcher (`signals`), whatever this waits for.
                // Operations still running after the timeout stay
                // journalled: the stop itself went as documented.
                let _ = running.stop(shutdown_timeout).await;
                let code = exit::OK;
                if let (Some((leadership, token)), exit::OK) = (&leading, code) {
                    leadership.release(*token).await;
                }
                break code;
            }
            Ok(Stopped::LostLease(running, why)) => {
                tracing::warn!("stepping down as leader: {why}");
                shared.metrics.leader(false);
                let config = running.agent.config().clone();
                let providers: Vec<String> = running.agent.runtimes().keys().cloned().collect();
                let timeout = config.reconcile.shutdown_timeout;
                let Some(stopped) = running.stop(timeout).await else {
                    fail("stepping down: the running cycles did not stop in time; exiting");
                    break exit::ERROR;
                };
                for provider in &providers {
                    shared.heartbeats.forget(provider);
                }
                shared.board.reset_parts();
                agent = match reopen(stopped, config, &shared) {
                    Ok(agent) => agent,
                    Err(e) => {
                        fail(format!("cannot reopen the agent after stepping down: {e}"));
                        break exit::ERROR;
                    }
                };
            }
        }
    };
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    if let Some(control) = control {
        let _ = tokio::time::timeout(Duration::from_secs(5), control).await;
    }
    tracing::info!("stopped");
    code
}

/// A stopped agent opened again with `config`, keeping its lock, its
/// state store (and with it a leader's fence) and its id.
fn reopen(stopped: Agent, config: Config, shared: &Shared) -> Result<Agent, AgentError> {
    let agent_id = stopped.agent_id().to_string();
    let (lock, store) = stopped.into_parts();
    Agent::open_with_store(config, lock, Arc::new(SystemClock), store, Some(agent_id))
        .map(|agent| agent.with_progress(shared.heartbeats.clone()))
}

/// How standing by ended.
enum StandbyEnd {
    Leading(i64),
    Shutdown,
}

/// Stands by until this agent holds its group's lease: ready for systemd
/// and `/readyz` (which names the leader), the watchdog kept, a reload
/// noted (the configuration is read when the agent starts leading, which
/// restarts it anyway) and a stop obeyed.
async fn stand_by(
    leadership: &Leadership,
    signals: &mut Signals,
    standby: &watch::Sender<Option<String>>,
) -> StandbyEnd {
    let announce = |line: String| {
        systemd::status(&line);
        standby.send_replace(Some(line));
        systemd::ready();
    };
    let acquire = leadership.acquire(&announce);
    tokio::pin!(acquire);
    let watchdog = systemd::watchdog_interval();
    let mut watchdog_tick = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    loop {
        tokio::select! {
            token = &mut acquire => return StandbyEnd::Leading(token),
            request = signals.next() => match request {
                Request::Shutdown => return StandbyEnd::Shutdown,
                Request::Reload => tracing::info!("reload while standing by: nothing runs; the agent reads its configuration when it starts leading"),
            },
            _ = watchdog_tick.tick(), if watchdog.is_some() => systemd::watchdog(),
        }
    }
}

/// Why the coordinator loop ended.
enum Stopped {
    /// A signal asked for a stop.
    Shutdown(Running),
    /// The leader lease is lost: stop acting and stand by again.
    LostLease(Running, String),
}

/// The coordinator loop: signals, readiness, the status line and the
/// watchdog. Returns the running agent to stop when a signal asks for it;
/// `Err(code)` when it can no longer run (a reload that failed half-way).
async fn coordinate(
    config_path: &Path,
    mut running: Running,
    shared: &Shared,
    signals: &mut Signals,
    ready: &watch::Sender<bool>,
    lost: impl std::future::Future<Output = String>,
) -> Result<Stopped, u8> {
    tokio::pin!(lost);
    let mut changes = shared.board.subscribe();
    let watchdog = systemd::watchdog_interval();
    let mut prune_tick =
        tokio::time::interval_at(tokio::time::Instant::now() + PRUNE_FIRST, PRUNE_EVERY);
    let mut watchdog_tick = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    loop {
        tokio::select! {
            request = signals.next() => match request {
                Request::Shutdown => return Ok(Stopped::Shutdown(running)),
                Request::Reload => {
                    // Before the agent is ready, READY=1 would end its start
                    // for systemd (Type=notify) with nothing reconciled: a
                    // reload then says nothing, and the first reconciled
                    // snapshot still sends READY=1.
                    let started = *ready.borrow();
                    if started {
                        systemd::reloading();
                    }
                    running = running.reload(config_path, shared).await?;
                    if started {
                        systemd::ready();
                    }
                }
            },
            _ = watchdog_tick.tick(), if watchdog.is_some() => {
                // Alive means a beat within the watchdog's whole timeout,
                // and a source follower that polls within its window.
                if !shared.heartbeats.all_alive(watchdog.unwrap_or_default() * 2) {
                    tracing::error!("a provider worker is not making progress: the watchdog is not pinged");
                } else if !shared.heartbeats.source_alive() {
                    tracing::error!("the source follower has not finished a poll within its wait and its fetch's deadline: the watchdog is not pinged");
                } else {
                    systemd::watchdog();
                }
            }
            _ = prune_tick.tick() => prune_journal(&running.agent).await,
            why = &mut lost => return Ok(Stopped::LostLease(running, why)),
            // Supervision: a task that ends on its own (a panic) is started
            // again if it can be, or the agent stops with a non-zero exit
            // (systemd restarts it), never running on without it.
            joined = &mut running.status => {
                running.restart_status(shared, ended(joined));
            }
            joined = deliveries_ended(&mut running.deliveries) => {
                running.restart_deliveries(ended(joined));
            }
            joined = &mut running.source => {
                if let Err(e) = running.restart_source(shared, ended(joined)) {
                    fail(format!("the source follower cannot be started again: {e}; exiting"));
                    let timeout = running.agent.config().reconcile.shutdown_timeout;
                    let _ = running.stop(timeout).await;
                    return Err(exit::ERROR);
                }
            }
            Some(joined) = running.workers.join_next() => {
                let why = ended(joined.map(|_| ()));
                fail(format!("a provider worker ended ({why}); exiting so that the agent is started again whole"));
                let timeout = running.agent.config().reconcile.shutdown_timeout;
                let _ = running.stop(timeout).await;
                return Err(exit::ERROR);
            }
            changed = changes.changed() => {
                if changed.is_err() {
                    return Ok(Stopped::Shutdown(running));
                }
                on_status_change(&running, shared, ready);
            }
        }
    }
}

fn on_status_change(running: &Running, shared: &Shared, ready: &watch::Sender<bool>) {
    let providers = running.agent.runtimes().len();
    if !*ready.borrow() && shared.board.reported() >= providers {
        ready.send_replace(true);
        shared.metrics.ready(true);
        systemd::ready();
        tracing::info!("ready: the first snapshot is reconciled");
    }
    let source = shared.board.source();
    let commit = source
        .commit
        .as_deref()
        .map_or("none", |c| c.get(..12).unwrap_or(c));
    let line = match shared.board.latest() {
        Some(r) => {
            let s = &r.summary;
            format!(
                "commit {commit}: {}, {} in sync, {} drifted, {} missing, {} blocked, {} overridden, {} deleting, {} errors{}",
                s.resources(),
                s.in_sync,
                s.drifted,
                s.missing,
                s.blocked,
                s.overridden,
                s.deleting,
                s.errors,
                if source.failure.is_some() {
                    "; source failing"
                } else {
                    ""
                }
            )
        }
        None => match &source.failure {
            Some(failure) => format!("waiting for the source: {}", failure.error),
            None => "starting".into(),
        },
    };
    systemd::status(&line);
}

/// The status writer of `agent`, as a task to spawn.
fn status_writer(
    agent: &Agent,
    shared: &Shared,
    restart: &Restart,
) -> impl std::future::Future<Output = ()> + use<> {
    let publisher = crate::status::publish::StatusPublisher::new(
        agent,
        crate::status::writer::TITLE,
        None,
        restart.notifier.clone(),
    );
    crate::status::writer::run(
        shared.board.clone(),
        publisher,
        shared.metrics.clone(),
        restart.wake.clone(),
        restart.stop_rx.clone(),
    )
}

/// Resolves when the notification deliveries end (never, without them).
async fn deliveries_ended(
    deliveries: &mut Option<tokio::task::JoinHandle<()>>,
) -> Result<(), tokio::task::JoinError> {
    match deliveries {
        Some(handle) => handle.await,
        None => std::future::pending().await,
    }
}

/// Why a task's handle ended: a panic's message, or "it returned".
fn ended(joined: Result<(), tokio::task::JoinError>) -> String {
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
enum StartError {
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
    fn exit_code(&self) -> u8 {
        match self {
            StartError::Config(_) => exit::CONFIG,
            StartError::Source(_) => exit::ERROR,
        }
    }
}

/// One incarnation of the agent: its source follower and its workers.
struct Running {
    agent: Arc<Agent>,
    /// Cancelled to stop this incarnation (a child of the agent's
    /// shutdown token).
    stop: CancellationToken,
    /// Every task of this incarnation but the workers (the source
    /// follower, the bridge, the status writer, the deliveries): a stop
    /// waits for them all, and names the ones that do not end.
    tasks: TaskTracker,
    workers: JoinSet<()>,
    source: tokio::task::JoinHandle<()>,
    bridge: tokio::task::JoinHandle<()>,
    /// Writes the report files (ends when `stop` turns true).
    status: tokio::task::JoinHandle<()>,
    /// Delivers notifications (ends when `stop` turns true).
    deliveries: Option<tokio::task::JoinHandle<()>>,
    /// What restarting the status writer or the source follower needs.
    restart: Restart,
}

/// What the coordinator needs to start a task of the agent again after it
/// ended on its own (a panic), and how often it did.
struct Restart {
    stop_rx: CancellationToken,
    notifier: Option<Arc<Notifier>>,
    wake: Arc<tokio::sync::Notify>,
    outcomes: watch::Sender<Option<PollOutcome>>,
    status_restarts: u32,
    source_restarts: u32,
    deliveries_restarts: u32,
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
    fn start(agent: Arc<Agent>, shared: &Shared) -> Result<Self, StartError> {
        shared
            .heartbeats
            .set_operation_deadline(agent.config().operation_deadline());
        let source = agent.source()?.parses_on_disk();
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
    fn restart_status(&mut self, shared: &Shared, why: String) {
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
    fn restart_deliveries(&mut self, why: String) {
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
    fn restart_source(&mut self, shared: &Shared, why: String) -> Result<(), StartError> {
        self.restart.source_restarts += 1;
        let delay = restart_delay(self.restart.source_restarts);
        tracing::error!(
            "source: the source follower ended ({why}); started again in {} (restart {})",
            crate::time::duration(delay),
            self.restart.source_restarts
        );
        let source = self.agent.source()?.parses_on_disk();
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
    async fn stop(mut self, timeout: Duration) -> Option<Agent> {
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
    async fn reload(self, config_path: &Path, shared: &Shared) -> Result<Running, u8> {
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
        let secret = match config.webhook_secret() {
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
            .webhook_secret
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = secret;
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
