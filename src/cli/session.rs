//! What the cycle commands share: loading the configuration, opening the
//! agent, building the runtime and fetching the snapshot. Errors are
//! printed here and become exit codes (78 for configuration).

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use super::exit;
use crate::agent::Agent;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::executor::Executed;
use crate::journal::Access;
use crate::reconcile::{CycleInputs, Mode, Outcome, ReconcileError, Scope, reconcile_with};
use crate::source::{CacheWriting, Snapshot, SourceFailure};
use crate::status::files::LastFailures;
use crate::status::report::empty_report;
use crate::status::{Report, build_report};

/// Prints `tend: {error}` on stderr.
pub(super) fn fail(error: impl std::fmt::Display) {
    let _ = writeln!(io::stderr(), "tend: {error}");
}

/// Says why the state cannot be used; the exit code: 78 when no retry
/// can help (a newer tend's state, a damaged or untrusted one, another
/// agent id), 1 otherwise.
pub(super) fn state_failed(error: &crate::journal::StateError) -> u8 {
    fail(error);
    if error.is_configuration() {
        exit::CONFIG
    } else {
        exit::ERROR
    }
}

/// A string setting of a configuration file that does not load (an edit
/// in progress, a missing secret): `key` of `[section]` (`""`: the top),
/// from the TOML when the file parses at all, else read line by line
/// (`key = "value"` under its section header). What a command needs to
/// reach the agent, which runs on the configuration it loaded before.
pub(super) fn setting_of_unloadable(path: &Path, section: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    if let Ok(table) = text.parse::<toml::Table>() {
        let scope = if section.is_empty() {
            Some(&table)
        } else {
            table.get(section).and_then(toml::Value::as_table)
        };
        return scope?.get(key)?.as_str().map(str::to_string);
    }
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            current = header.trim_end_matches(']').trim().to_string();
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if current == section && k.trim() == key {
            let v = v.split('#').next().unwrap_or("").trim();
            return v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .map(str::to_string);
        }
    }
    None
}

/// Loads the configuration, or the exit code after saying why.
pub(super) fn load_config(path: &Path) -> Result<Config, u8> {
    Config::load(path).map_err(|e| {
        fail(&e);
        exit::CONFIG
    })
}

/// Opens the agent, or the exit code after saying why.
pub(super) fn open_agent(path: &Path, access: Access) -> Result<Agent, u8> {
    crate::source::start_libgit2_init();
    let config = load_config(path)?;
    // A writer run as root acts as the state dir's owner: everything it
    // makes there stays the agent's.
    if access == Access::Writer {
        super::operator::become_state_owner(&config, &[])?;
    }
    let mut agent = Agent::open(config, access, Arc::new(SystemClock)).map_err(|e| {
        fail(&e);
        e.exit_code()
    })?;
    agent.hold_lease().map_err(|e| {
        fail(&e);
        exit::ERROR
    })?;
    Ok(agent)
}

/// The runtime a one-shot command runs the library on: one thread for the
/// async work, and [`BLOCKING_THREADS`] for blocking calls (SQLite,
/// fsync, libgit2).
pub(super) fn runtime() -> Result<tokio::runtime::Runtime, u8> {
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
/// side at start; later, journal writes and reads. A journal write waiting
/// for the state's shared commit holds one while it waits, so this bounds
/// how many writes one commit carries: a cold apply of 10,000 creates
/// (16 slots) took 7.8-8.1 s with 64 against 8.4-9.1 s with 2, and the
/// same peak. Threads add no malloc arena: the command caps them at two
/// ([`crate::process::heap::two_arenas`]; with glibc's default, 16 threads
/// raised that apply's peak by 40 %).
const BLOCKING_THREADS: usize = 64;

/// What a one-shot command read from the source: the snapshot to decide
/// from, and why the branch itself could not be read (then the snapshot is
/// the last accepted commit's, or there is none).
pub(super) struct SourceRead {
    pub snapshot: Option<Arc<Snapshot>>,
    pub failure: Option<SourceFailure>,
    /// What was read and started beside the fetch, for the cycle.
    pub ahead: CycleInputs,
    /// The parse cache of a new commit, written beside the cycle: its
    /// write is waited for when this goes.
    pub cache_writing: CacheWriting,
}

/// Fetches the snapshot once, reading the state's memories beside the
/// fetch (the fetch waits on the network; the read does not need the
/// declarations).
///
/// Without a provider to list ahead, the fetch runs on this thread, not the
/// blocking pool: a one-shot command has nothing else to run meanwhile,
/// and what libgit2 and the parser allocate then sits in the main malloc
/// arena, where the cycle reuses it. On a pool thread it stayed in that
/// thread's arena beside the cycle's: a cold apply of 10,000 declarations
/// peaked 25 MB higher. With one (an http provider), the listing runs on
/// this thread and the fetch on the pool, and that is the price.
///
/// `for_a_cycle`: read the memories and start the listings beside the
/// fetch (a command that runs no cycle, `tend import`, does neither).
pub(super) async fn snapshot(agent: &Agent, for_a_cycle: bool) -> SourceRead {
    let now = agent.clock().now();
    let (preload, listing) = if for_a_cycle {
        (
            agent.start_preload(),
            // Every provider whose observation is one listing whatever it
            // is asked for, listed for the cycle (`None`: there is none, and
            // nothing runs beside the fetch).
            crate::reconcile::observe::ListingAhead::start(
                agent.runtimes(),
                agent.store().map(Arc::as_ref),
            ),
        )
    } else {
        (None, None)
    };
    let polled = if listing.is_some() {
        // A provider is being listed on this thread's runtime meanwhile:
        // opening the source (which waits for libgit2's initialisation)
        // and the fetch go to a blocking thread instead; their allocations
        // in that thread's arena are the price of not listing after them.
        // A panic there goes on as it would here (a task is cancelled only
        // when its runtime shuts down, which it does not while this waits).
        let open = agent.source_opener();
        match tokio::task::spawn_blocking(move || open().map(|s| s.poll_once_writing_beside(now)))
            .await
        {
            Ok(polled) => polled,
            Err(e) => std::panic::resume_unwind(
                e.try_into_panic()
                    .unwrap_or_else(|e| Box::new(format!("the source fetch stopped: {e}"))),
            ),
        }
    } else {
        agent.source().map(|s| s.poll_once_writing_beside(now))
    };
    let (outcome, cache_writing) = match polled {
        Ok(polled) => polled,
        Err(error) => {
            return SourceRead {
                snapshot: None,
                failure: Some(SourceFailure {
                    error,
                    since: now,
                    failures: 1,
                }),
                ahead: CycleInputs::default(),
                cache_writing: CacheWriting::default(),
            };
        }
    };
    agent.finish_preload(preload).await;
    SourceRead {
        snapshot: outcome.snapshot,
        failure: outcome.failure,
        ahead: CycleInputs { listing },
        cache_writing,
    }
}

/// What a cycle command reports on: the outcome (none when there was no
/// snapshot to decide from) and the source's failure, if any.
pub(super) struct CycleResult<'a, 's> {
    pub outcome: Option<&'a Outcome<'s>>,
    pub source_failure: Option<&'a SourceFailure>,
}

impl CycleResult<'_, '_> {
    /// The report of the cycle: the outcome's, or an empty one, marked
    /// with the source's failure. `previous`: the last report written, so
    /// the failure's age survives processes.
    pub(super) fn report(&self, agent: &Agent, previous: &LastFailures) -> Report {
        let report = match self.outcome {
            Some(outcome) => build_report(agent.config(), outcome.latest()),
            None => empty_report(agent.config(), agent.agent_id(), agent.clock().now()),
        };
        match self.source_failure {
            Some(failure) => report.with_source_failure(failure, previous.source_since.as_deref()),
            None => report,
        }
    }
}

/// Runs one cycle in `mode` and hands its result to `report`, whose exit
/// code is the command's. A source that fails is reported, not fatal:
/// the cycle runs on the last accepted commit's snapshot when there is
/// one (as the running agent does), and the report says why. A state
/// failure after operations ran first shows them through `finished`
/// (what ran is journalled, and the operator must see it).
pub(super) fn one_cycle(
    agent: &Agent,
    mode: Mode,
    finished: impl FnOnce(&[Executed]) -> io::Result<()>,
    report: impl FnOnce(CycleResult<'_, '_>) -> io::Result<u8>,
) -> io::Result<u8> {
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    runtime.block_on(async {
        let read = snapshot(agent, true).await;
        if let Some(failure) = &read.failure {
            let fallback = match &read.snapshot {
                Some(s) => format!("; deciding from the last accepted commit {}", s.commit),
                None => "; no commit was ever accepted, so nothing is decided".into(),
            };
            fail(format!("source: {}{fallback}", failure.error));
        }
        let Some(snapshot) = read.snapshot else {
            return report(CycleResult {
                outcome: None,
                source_failure: read.failure.as_ref(),
            });
        };
        let outcome = match reconcile_with(agent, &snapshot, mode, &Scope::All, read.ahead).await {
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
        let code = report(CycleResult {
            outcome: Some(&outcome),
            source_failure: read.failure.as_ref(),
        });
        // A one-shot command's results go with the process (see heap.rs).
        super::heap::release_at_exit(outcome);
        super::heap::release_at_exit(snapshot);
        // The parse cache is complete on disk before the process ends.
        drop(read.cache_writing);
        code
    })
}
