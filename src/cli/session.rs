//! What the cycle commands share: loading the configuration, opening the
//! agent, building the runtime and fetching the snapshot. Errors are
//! printed here and become exit codes (78 for configuration).

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use super::exit;
use crate::agent::{Agent, AgentError};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::journal::Access;
use crate::source::{Snapshot, SourceError};

/// Prints `tend: {error}` on stderr.
pub fn fail(error: impl std::fmt::Display) {
    let _ = writeln!(io::stderr(), "tend: {error}");
}

/// Loads the configuration, or the exit code after saying why.
pub fn load_config(path: &Path) -> Result<Config, u8> {
    Config::load(path).map_err(|e| {
        fail(&e);
        exit::CONFIG
    })
}

/// Opens the agent, or the exit code after saying why.
pub fn open_agent(path: &Path, access: Access) -> Result<Agent, u8> {
    let config = load_config(path)?;
    Agent::open(config, access, Arc::new(SystemClock)).map_err(|e| {
        fail(&e);
        match e {
            AgentError::Config(_) => exit::CONFIG,
            AgentError::State(_) => exit::ERROR,
        }
    })
}

/// The runtime a one-shot command runs the library on: one thread for the
/// async work, and few for blocking calls (SQLite, fsync, libgit2). The
/// state store has one connection, so more would only wait, and every
/// thread that allocates gets a malloc arena of its own: with 16 of them a
/// cold apply of 10,000 creates peaked 40% higher.
pub fn runtime() -> Result<tokio::runtime::Runtime, u8> {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .map_err(|e| {
            fail(format!("cannot start the async runtime: {e}"));
            exit::ERROR
        })
}

/// Threads for blocking calls: the fetch and the memory read run side by
/// side at start; later, journal writes and reads.
const BLOCKING_THREADS: usize = 2;

/// Fetches the snapshot once, reading the state's memories beside the
/// fetch (the fetch waits on the network; the read does not need the
/// declarations).
///
/// The fetch runs on this thread, not the blocking pool: a one-shot command
/// has nothing else to run meanwhile, and what libgit2 and the parser
/// allocate then sits in the main malloc arena, where the cycle reuses it.
/// On a pool thread it stayed in that thread's arena beside the cycle's:
/// a cold apply of 10,000 declarations peaked 25 MB higher.
pub async fn snapshot(agent: &Agent) -> Result<Arc<Snapshot>, SourceError> {
    let source = agent.source()?;
    let now = agent.clock().now();
    let url = agent.config().source.url.clone();
    let preload = agent.start_preload();
    let outcome = source.poll_once(now);
    agent.finish_preload(preload).await;
    match (outcome.snapshot, outcome.failure) {
        (Some(snapshot), _) => Ok(snapshot),
        (None, Some(failure)) => Err(failure.error),
        (None, None) => Err(SourceError::Fetch {
            url,
            message: "no snapshot and no error".into(),
        }),
    }
}

/// Runs one cycle in `mode` and hands its outcome to `report`, whose exit
/// code is the command's. Failures before an outcome are printed here; a
/// state failure after operations ran first shows them through
/// `finished` (what ran is journalled, and the operator must see it).
pub fn one_cycle(
    agent: &Agent,
    mode: crate::reconcile::Mode,
    finished: impl FnOnce(&[crate::executor::Executed]) -> std::io::Result<()>,
    report: impl FnOnce(&crate::reconcile::Outcome<'_>) -> std::io::Result<u8>,
) -> std::io::Result<u8> {
    use crate::reconcile::{ReconcileError, Scope, reconcile};
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    runtime.block_on(async {
        let snapshot = match snapshot(agent).await {
            Ok(s) => s,
            Err(e) => {
                fail(format!("source: {e}"));
                return Ok(exit::ERROR);
            }
        };
        let outcome = match reconcile(agent, &snapshot, mode, &Scope::All).await {
            Ok(o) => o,
            Err(ReconcileError::State {
                error,
                finished: ran,
            }) => {
                finished(&ran)?;
                fail(error);
                return Ok(exit::ERROR);
            }
            Err(e) => {
                fail(e);
                return Ok(exit::ERROR);
            }
        };
        tracing::debug!("reconciled");
        let code = report(&outcome);
        // A one-shot command's results go with the process (see heap.rs).
        super::heap::release_at_exit(outcome);
        super::heap::release_at_exit(snapshot);
        code
    })
}
