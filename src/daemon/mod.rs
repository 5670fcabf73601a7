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
pub(crate) mod queue;
mod running;
mod signals;
mod systemd;
pub(crate) mod worker;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, AgentError};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::journal::{Access, BackendKind, Fence};
use crate::process::exit;
use crate::server::ServerState;
use crate::server::access::Access as ServerAccess;
use crate::server::coalesce::Coalescer;
use crate::source::Snapshot;
use crate::status::board::StatusBoard;
use crate::telemetry::Metrics;
use health::Heartbeats;
use leadership::Leadership;
use running::{Running, deliveries_ended, ended};
use signals::{Request, Signals};

/// Threads for blocking calls (state reads and writes, libgit2, files).
/// A journal write waiting for the state's shared commit holds one while
/// it waits, so this bounds how many writes one commit can carry. A cold
/// start of 100,000 creates took 80.4 s with 4 threads (commits of 2.7
/// writes on average), 65.6 s with 16, 59.0 s with 32 and 46.6-59.3 s
/// with 64 (100.5 s before writes shared commits). Each thread keeps some
/// memory of its own (its stack, glibc's per-thread cache): at 10,000
/// declarations the agent peaked at 62.3 MiB with 16, 63.3 with 32 and
/// 63.4-63.8 with 64, against 62.7-62.8 with 4, where the target is
/// 64 MB (61 MiB). Threads add no malloc arena
/// ([`crate::process::heap::tune_agent`] caps them), and an idle one ends
/// after ten seconds.
const BLOCKING_THREADS: usize = 16;

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

fn fail(error: impl std::fmt::Display) {
    eprintln!("tend: {error}");
}

/// The credentials the HTTP server checks, read from their files.
pub(crate) fn server_access(config: &Config) -> Result<ServerAccess, crate::config::ConfigError> {
    Ok(ServerAccess::new(
        config.server.listen,
        config.server_token()?,
        config.webhook_secret()?,
    ))
}

/// Runs the agent until a signal stops it; the process exit code.
pub(crate) fn run(config_path: &Path) -> u8 {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            fail(e);
            return exit::CONFIG;
        }
    };
    let access = match server_access(&config) {
        Ok(a) => a,
        Err(e) => {
            fail(e);
            return exit::CONFIG;
        }
    };
    if let Some(warning) = access.open_reports_warning(config.server.listen) {
        tracing::warn!("{warning}");
    }
    let threads = crate::process::heap::agent_threads(
        config.providers.len(),
        config.reconcile.parallel_cycles,
    );
    // SAFETY: no other thread exists yet: the runtime below starts the
    // first (reading the configuration starts none).
    unsafe { crate::process::heap::tune_agent(threads) };
    let mut builder = if threads > 1 {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            fail(format!("cannot start the async runtime: {e}"));
            return exit::ERROR;
        }
    };
    let code = runtime.block_on(lifecycle(config_path, config, access));
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

async fn lifecycle(config_path: &Path, config: Config, access: ServerAccess) -> u8 {
    let min_interval = config.server.reconcile_min_interval;
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            fail(format!("cannot install signal handlers: {e}"));
            return exit::ERROR;
        }
    };
    let listen = config.server.listen;
    let control_group = match crate::control::Group::from_config(&config) {
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
            access: Mutex::new(access),
            reconciles: Coalescer::new(min_interval),
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
    // The status line is written at most every `STATUS_LINE_EVERY` (it
    // merges the providers' reports); a change meanwhile is written when
    // that time comes. Readiness is never delayed.
    let start = tokio::time::Instant::now();
    let mut line_written = start.checked_sub(STATUS_LINE_EVERY).unwrap_or(start);
    let mut line_pending = false;
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
                let now = tokio::time::Instant::now();
                if becomes_ready(&running, shared, ready) || now >= line_written + STATUS_LINE_EVERY {
                    on_status_change(&running, shared, ready);
                    line_written = now;
                    line_pending = false;
                } else {
                    line_pending = true;
                }
            }
            _ = tokio::time::sleep_until(line_written + STATUS_LINE_EVERY), if line_pending => {
                on_status_change(&running, shared, ready);
                line_written = tokio::time::Instant::now();
                line_pending = false;
            }
        }
    }
}

/// How often at most systemd's status line is written.
const STATUS_LINE_EVERY: Duration = Duration::from_secs(1);

/// Whether the agent is not ready yet and every provider has reported.
fn becomes_ready(running: &Running, shared: &Shared, ready: &watch::Sender<bool>) -> bool {
    !*ready.borrow() && shared.board.reported() >= running.agent.runtimes().len()
}

fn on_status_change(running: &Running, shared: &Shared, ready: &watch::Sender<bool>) {
    let now_ready = becomes_ready(running, shared, ready);
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
    if now_ready {
        ready.send_replace(true);
        shared.metrics.ready(true);
        // One message: `systemctl start` returns at READY=1, and the
        // status line it then shows must already be this one.
        systemd::ready_with_status(&line);
        tracing::info!("ready: the first snapshot is reconciled");
    } else {
        systemd::status(&line);
    }
}
