//! The long-lived agent: everything a reconcile needs that outlives one
//! cycle, opened once.
//!
//! `plan` and `explain` open it read-only, `apply` and `run` as the writer.
//! It holds the state store (and, for the writer, the state dir's lock for
//! its whole life), one [`ProviderRuntime`] per configured provider (the
//! provider, its rate limiter, concurrency slots and retry policy, shared
//! by observation and operations), the decision policy, the agent id and
//! the clock every time read goes through.
//!
//! # Guarantees
//! * `plan` and `apply` choose the agent id the same way: the one kept in
//!   the state, else the configured one, else (the writer only) a new one
//!   generated once and kept. A configured id that differs from the kept
//!   one is refused (a configuration error): never an all-Blocked fleet.
//! * A provider that cannot be built (an unsupported kind, a missing
//!   secret file, an invalid URL) is a configuration error before any
//!   work starts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::config::{Config, ConfigError};
use crate::engine::{DeletionLimits, Policy};
use crate::executor::queue::{Progress, Silent};
use crate::executor::{ExecContext, ExecLimits, ProviderRuntime};
use crate::journal::{Access, StateError, StateLock, StateStore};
use crate::source::reader_repo::ReaderRepo;
use crate::source::tracker::SourceSettings;
use crate::source::{Source, SourceError};

/// Why the agent could not open.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration cannot be turned into a running agent (exit 78).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The state dir cannot be opened or locked.
    #[error(transparent)]
    State(#[from] StateError),
}

impl AgentError {
    /// The exit code that tells systemd the truth: 78 when restarting
    /// cannot help (the configuration, or a state that needs a newer tend,
    /// is damaged, untrusted or belongs to another agent id), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::Config(_) => crate::process::exit::CONFIG,
            AgentError::State(e) if e.is_configuration() => crate::process::exit::CONFIG,
            AgentError::State(_) => crate::process::exit::ERROR,
        }
    }
}

/// Memories being read ahead ([`Agent::start_preload`]).
pub(crate) type Preload = tokio::task::JoinHandle<Result<(), StateError>>;

/// The agent id a reader reports before any writer generated one (no
/// resource can carry it yet, so no decision depends on it).
pub(crate) const UNSET_AGENT_ID: &str = "(generated at the first apply)";

/// One installation of tend, opened.
pub struct Agent {
    config: Config,
    access: Access,
    store: Option<Arc<StateStore>>,
    /// Held for the agent's life (the writer only).
    lock: Option<StateLock>,
    agent_id: String,
    policy: Policy,
    runtimes: BTreeMap<String, Arc<ProviderRuntime>>,
    /// The source's settings, its secrets read at open (a missing token
    /// file is a configuration error before any work).
    source_settings: SourceSettings,
    clock: Arc<dyn Clock>,
    progress: Arc<dyn Progress>,
    /// Set by [`Agent::drain`]: no new operation starts.
    draining: Arc<std::sync::atomic::AtomicBool>,
    /// The group's lease, held by a one-shot writer on a shared state.
    held_lease: Option<crate::journal::HeldLease>,
    /// A reader's own repository, which its source fetches into (made at
    /// its first fetch, on the fetch's thread; kept for the agent's life:
    /// `tend propose` reads the fetched objects after the fetch).
    reader_repo: Arc<Mutex<Option<Arc<ReaderRepo>>>>,
    /// The last read of the memories, reused while nothing is written.
    memories: Arc<crate::memories::MemoryCache>,
}

impl Agent {
    /// Opens the state dir (taking its lock for a writer) and builds every
    /// provider.
    pub fn open(
        config: Config,
        access: Access,
        clock: Arc<dyn Clock>,
    ) -> Result<Agent, AgentError> {
        let lock = match access {
            Access::Writer => {
                let lock = StateLock::acquire(&config.state_dir)?;
                // Below the state dir, the lock's check covered it.
                let reports = config.reports_dir();
                if !reports.starts_with(&config.state_dir)
                    && crate::journal::state_dir::exists(&reports)?
                {
                    crate::journal::state_dir::check_trusted(&reports)?;
                }
                Some(lock)
            }
            Access::ReadOnly => None,
        };
        Self::open_locked(config, lock, clock)
    }

    /// Opens the writer with a lock it already holds (`tend run` keeps its
    /// lock across a configuration reload); `None`: a reader.
    pub fn open_locked(
        config: Config,
        lock: Option<StateLock>,
        clock: Arc<dyn Clock>,
    ) -> Result<Agent, AgentError> {
        Self::open_with_store(config, lock, clock, None, None)
    }

    /// [`Agent::open_locked`] on a state store already open (`tend run`
    /// keeps its store, and with it a leader's fence, across a
    /// configuration reload and a step-down). `known_agent_id`: the id the
    /// agent had; kept without asking the state when the configuration
    /// does not change it (a leader stepping down because its state
    /// database is unreachable must still be able to stand by).
    pub fn open_with_store(
        config: Config,
        lock: Option<StateLock>,
        clock: Arc<dyn Clock>,
        store: Option<Arc<StateStore>>,
        known_agent_id: Option<String>,
    ) -> Result<Agent, AgentError> {
        let access = if lock.is_some() {
            Access::Writer
        } else {
            Access::ReadOnly
        };
        let store = match store {
            Some(store) => Some(store),
            None => match &lock {
                Some(lock) => StateStore::open_configured_locked(&config, lock)?,
                None => StateStore::open_configured(&config, false)?,
            }
            .map(Arc::new),
        };
        let known = known_agent_id.filter(|id| config.agent_id.as_ref().is_none_or(|c| c == id));
        let agent_id = match (known, &store, access) {
            (Some(id), _, _) => id,
            (None, Some(store), Access::Writer) => store.agent_id(config.agent_id.as_deref())?,
            (None, Some(store), Access::ReadOnly) => store
                .agent_id_for_reading(config.agent_id.as_deref())?
                .unwrap_or_else(|| UNSET_AGENT_ID.to_string()),
            (None, None, _) => config
                .agent_id
                .clone()
                .unwrap_or_else(|| UNSET_AGENT_ID.to_string()),
        };
        let source_settings = SourceSettings::from_config(&config)?;
        crate::source::transport::set_timeout(config.source.timeout);
        let mut runtimes = BTreeMap::new();
        for (name, provider) in &config.providers {
            let use_ = match access {
                Access::Writer => crate::provider::build::Use::ReadWrite,
                Access::ReadOnly => crate::provider::build::Use::Read,
            };
            let built =
                crate::provider::build::build(name, provider, &config.state_dir, &clock, use_)?;
            let limits = provider.limits();
            let runtime = ProviderRuntime::new(
                name,
                built,
                ExecLimits {
                    max_concurrency: limits.max_concurrency.min(config.reconcile.max_concurrency),
                    rate_per_second: limits.rate_limit,
                    retry: crate::executor::RetryPolicy::from_config(&config),
                    confirm_timeout: config.reconcile.confirm_timeout,
                },
            );
            runtimes.insert(name.clone(), Arc::new(runtime));
        }
        Ok(Agent {
            policy: config.policy(&agent_id),
            config,
            access,
            store,
            lock,
            agent_id,
            runtimes,
            source_settings,
            clock,
            progress: Arc::new(Silent),
            draining: Arc::default(),
            held_lease: None,
            reader_repo: Arc::default(),
            memories: Arc::default(),
        })
    }

    /// A one-shot writer (`tend apply`) on a shared PostgreSQL state takes
    /// its group's leader lease for its run, or refuses when an agent
    /// leads: two writers of one state would race each other. No-op on
    /// the SQLite state (the state dir's lock already makes it the one
    /// writer).
    pub fn hold_lease(&mut self) -> Result<(), StateError> {
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        if store.backend() != crate::journal::BackendKind::Postgres || self.access != Access::Writer
        {
            return Ok(());
        }
        let ttl = self.config.state.lease_ttl;
        self.held_lease = Some(crate::journal::HeldLease::take(store, &self.agent_id, ttl)?);
        Ok(())
    }

    /// Marks the state dir's lock as held by the running agent (`tend
    /// run`): operators' commands then reach it over its control channel
    /// and never write beside it.
    pub fn mark_running_agent(&mut self) -> std::io::Result<()> {
        match &mut self.lock {
            Some(lock) => lock.mark_agent(),
            None => Ok(()),
        }
    }

    /// Gives the state dir's lock and the state store back (to reopen with
    /// a new configuration).
    pub fn into_parts(self) -> (Option<StateLock>, Option<Arc<StateStore>>) {
        (self.lock, self.store)
    }

    /// Stops starting operations: those running finish, the rest wait for
    /// the next cycle (shutdown, reload).
    pub fn drain(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Reports each finished operation to `progress`.
    pub fn with_progress(mut self, progress: Arc<dyn Progress>) -> Self {
        self.progress = progress;
        self
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn access(&self) -> Access {
        self.access
    }

    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// Turns on a deliberate bug (`crate::sabotage`), for a test that
    /// shows its invariants catch it.
    #[cfg(feature = "test-hooks")]
    pub fn sabotage(&mut self, sabotage: crate::sabotage::Sabotage) {
        self.policy.sabotage = sabotage;
    }

    /// The switch that crashes an operation at a commit point
    /// (`process::failpoint::CrashSwitch`: the process's failpoints).
    #[cfg(feature = "test-hooks")]
    pub fn crash_switch(&self) -> crate::process::failpoint::CrashSwitch {
        crate::process::failpoint::CrashSwitch
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn deletion_limits(&self) -> DeletionLimits {
        DeletionLimits {
            max_deletions: self.config.reconcile.max_deletions,
            max_percent: self.config.reconcile.max_deletion_percent,
        }
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn progress(&self) -> &dyn Progress {
        self.progress.as_ref()
    }

    /// The state store; `None` for a reader of a state dir nothing was
    /// ever applied from.
    pub fn store(&self) -> Option<&Arc<StateStore>> {
        self.store.as_ref()
    }

    pub fn runtimes(&self) -> &BTreeMap<String, Arc<ProviderRuntime>> {
        &self.runtimes
    }

    /// What the executor needs; `None` for a reader.
    pub fn exec_context(&self) -> Option<ExecContext> {
        match (self.access, &self.store) {
            (Access::Writer, Some(store)) => Some(ExecContext {
                store: store.clone(),
                agent_id: Arc::from(self.agent_id.as_str()),
                clock: self.clock.clone(),
                draining: self.draining.clone(),
                halted: Arc::default(),
                keep_confirmations: false,
                #[cfg(feature = "test-hooks")]
                sabotage: self.policy.sabotage,
            }),
            _ => None,
        }
    }

    /// The source's settings (credentials read).
    pub fn source_settings(&self) -> &crate::source::tracker::SourceSettings {
        &self.source_settings
    }

    pub fn source(&self) -> Result<Source, SourceError> {
        self.source_opener()()
    }

    /// [`Agent::source`], to call on another thread (opening waits for
    /// libgit2's initialisation). A reader's source fetches into the
    /// reader's own repository, never the state dir's.
    pub fn source_opener(&self) -> impl FnOnce() -> Result<Source, SourceError> + Send + 'static {
        let (dir, settings, access, slot) = (
            self.config.state_dir.clone(),
            self.source_settings.clone(),
            self.access,
            self.reader_repo.clone(),
        );
        move || {
            let url = settings.url.clone();
            let source = Source::open(&dir, settings, access)?;
            if access == Access::Writer {
                return Ok(source);
            }
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            let reader = match slot.as_ref() {
                Some(reader) => reader.clone(),
                None => Arc::new(crate::source::reader_repo::prepare(&dir, &url)?),
            };
            *slot = Some(reader.clone());
            Ok(source.with_reader_repo(reader))
        }
    }

    /// The bare repository this agent's source was fetched into: the
    /// state dir's for the writer, the reader's own for a reader (the
    /// state dir's until a reader fetched).
    pub fn source_repo_dir(&self) -> std::path::PathBuf {
        match &*self.reader_repo.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(reader) => reader.dir.clone(),
            None => crate::source::repo_dir(&self.config.state_dir),
        }
    }

    /// The memories every cycle reads through.
    pub fn memories(&self) -> Arc<crate::memories::MemoryCache> {
        self.memories.clone()
    }

    /// Starts bringing the memories up to date on a blocking thread, so
    /// the next reconcile does not wait for the read: started before a
    /// fetch, or while a worker waits, it costs nothing. Hand the handle
    /// to [`Agent::finish_preload`].
    pub fn start_preload(&self) -> Option<Preload> {
        let store = self.store.clone()?;
        let cache = self.memories.clone();
        Some(tokio::task::spawn_blocking(move || {
            cache.read_ahead(&store)
        }))
    }

    /// Waits for [`Agent::start_preload`]. A failed read is not an error
    /// here: the reconcile reads again and reports it.
    pub async fn finish_preload(&self, handle: Option<Preload>) {
        if let Some(handle) = handle {
            let _ = handle.await;
        }
    }
}
