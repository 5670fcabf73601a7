//! The state (the state dir's SQLite database, or a PostgreSQL schema) (docs/apply.md, docs/runbooks/rollback.md): what tend remembers of
//! each resource, the intent journal, tombstones, local overrides and
//! first-seen times; and the one-writer lock.
//!
//! # Guarantees
//! * An intent is committed (WAL, `synchronous=FULL`) before the provider
//!   call it describes, and marked done only after an observation confirmed
//!   the effect.
//! * A binary refuses a state whose `min_reader_format` is newer than it
//!   understands and leaves the file byte-for-byte unchanged (it checks
//!   through an immutable read-only connection before anything else).
//! * Columns and tables this binary does not know are left alone: updates
//!   name their columns, nothing is rewritten wholesale.

pub(crate) mod effects;
pub(crate) mod lock;
pub(crate) mod state_dir;
pub(crate) mod store;

pub(crate) use lock::{Holder, StateLock};
pub use store::{
    Applied, Fence, Intent, IntentState, LeaseHolder, PgStateSettings, Release, StateStore,
};
pub(crate) use store::{
    Approval, BackendKind, CorruptRow, DecidedAt, DecidedFrom, FinishedMark, HeldLease,
    LastOperation, LocalOverride, MemoriesSince, OverrideSeen, PendingNotification,
    QueuedNotification, StoredMemories, TombstoneRow, Tx,
};

use std::sync::Arc;

/// How a process uses the state dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads only (`plan`, `explain`, `state show`): no lock, no writes,
    /// safe beside a running writer.
    ReadOnly,
    /// The one writer (`apply`, `run`): holds the state dir's lock.
    Writer,
}

/// The state format this binary writes (see `store::migrations`).
pub const FORMAT: i64 = 8;
/// The newest `min_reader_format` this binary can read, and the one it
/// writes: format 3 holds deletions (the mass-deletion guard) in a table
/// an older reader would ignore, and deleting what is held is exactly what
/// the guard exists to prevent, so readers older than format 3 are refused.
/// (Format 2 only added an index and kept 1.)
pub(crate) const READABLE_FORMAT: i64 = 3;

/// Runs a state-store call off the async worker threads (SQLite blocks,
/// and a journal write waits for an fsync).
pub(crate) async fn blocking<T, F>(store: &Arc<StateStore>, f: F) -> Result<T, StateError>
where
    T: Send + 'static,
    F: FnOnce(&StateStore) -> Result<T, StateError> + Send + 'static,
{
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|source| StateError::Worker { source })?
}

/// A state-dir problem.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "state {path} needs a newer tend: its min_reader_format is {found}, and this tend (state format {format}) reads states whose min_reader_format is at most {supported}; it was last written by tend {writer}. The file was not changed. Run that tend again, or follow docs/runbooks/rollback.md",
        format = FORMAT
    )]
    TooNew {
        path: String,
        found: i64,
        supported: i64,
        /// `meta.writer_version`: the version to reinstall.
        writer: String,
    },
    #[error(
        "state dir {dir} is in use by another tend (pid {pid}); wait for it to finish or stop it (systemctl stop tend)"
    )]
    Locked { dir: String, pid: String },
    #[error(
        "state database {path} {problem}. tend does not start afresh over it: that would forget the intent journal, the tombstones and when each override was first seen. Follow docs/runbooks/state-recovery.md"
    )]
    Damaged { path: String, problem: String },
    #[error(
        "{dir} {problem}: tend writes its state and reports there and does not trust a directory another user can change (a planted file or link). Fix it ({fix}) and start again"
    )]
    Untrusted {
        dir: String,
        problem: String,
        fix: String,
    },
    /// The commit a write shared with other writes failed (`commit`, as
    /// a lone write's would have): nothing of any of them is kept.
    #[error(
        "{commit} (one commit held this write and {others} other writes: none of them is kept)"
    )]
    SharedCommit {
        commit: Arc<StateError>,
        others: usize,
    },
    /// A statement failed (SQLite, or the PostgreSQL server or connection).
    #[error("state database {path}: {source}")]
    Database {
        path: String,
        #[source]
        source: store::sql::SqlError,
    },
    /// The backend cannot do what was asked (a lease on SQLite).
    #[error("state database {path}: {problem}")]
    Unsupported { path: String, problem: &'static str },
    /// A file or directory of the state could not be read or written.
    #[error("state dir {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The same, while doing what `doing` says.
    #[error("state dir {path}: {doing}: {source}")]
    IoWhile {
        path: String,
        doing: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A backup's target could not be created.
    #[error("state dir {path}: cannot create it ({source}); name a file that does not exist")]
    BackupTarget {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A value could not be encoded for the state.
    #[error("state dir {path}: cannot encode {what}: {source}")]
    Encode {
        path: String,
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// What tend found and refuses (a link, a file that is not one, a
    /// target that is not empty): no underlying error.
    #[error("state dir {path}: {problem}")]
    Refused { path: String, problem: String },
    /// A write of a leader that lost its lease: refused, nothing written.
    #[error(
        "state {location}: this agent no longer holds the leader lease of agent group {agent_id} (it wrote under token {token}; the lease is now {now}): nothing was written, and this agent steps down. See docs/runbooks/leader-lease.md"
    )]
    Fenced {
        location: String,
        agent_id: String,
        token: i64,
        now: String,
    },
    /// A one-shot writer found the group led by a running agent.
    #[error(
        "agent group {agent_id} is led by {leader}: a `tend apply` beside it would race it, so nothing was done. The leader reconciles on its own (POST /v1/reconcile on it to make it start now); or stop the group's agents first. See docs/runbooks/leader-lease.md"
    )]
    LeaseHeld { agent_id: String, leader: String },
    /// The thread running a state-store call stopped (a bug): what it was
    /// writing is not known to have happened.
    #[error("a state-store call stopped before it finished: {source}")]
    Worker {
        #[source]
        source: tokio::task::JoinError,
    },
    /// The thread that renews a held lease could not be started.
    #[error(
        "a state-store call stopped before it finished: cannot start the lease renewal thread: {source}"
    )]
    LeaseThread {
        #[source]
        source: std::io::Error,
    },
    /// The configuration names another agent id than the one the state
    /// holds: every resource tend manages carries the state's id in its
    /// ownership marker, so the other id would find them all owned by
    /// someone else.
    #[error(
        "state {location} belongs to agent `{kept}`, but the configuration says agent_id = \"{configured}\": the databases this state manages carry `{kept}` in their ownership marker, so as `{configured}` tend would find every one of them owned by another agent. Set agent_id = \"{kept}\" in the configuration (docs/operations.md, \"The agent id\"); nothing was changed"
    )]
    AgentIdChanged {
        location: String,
        configured: String,
        kept: String,
    },
}

impl StateError {
    /// Whether restarting cannot help: the state needs a newer tend, is
    /// damaged, is not trusted, or belongs to another agent id. `tend run`
    /// exits 78 on these (systemd's `RestartPreventExitStatus=78`), 1 on
    /// the rest (a lock held, a database that does not answer).
    pub fn is_configuration(&self) -> bool {
        match self {
            StateError::SharedCommit { commit, .. } => commit.is_configuration(),
            _ => matches!(
                self,
                StateError::TooNew { .. }
                    | StateError::Damaged { .. }
                    | StateError::Untrusted { .. }
                    | StateError::AgentIdChanged { .. }
            ),
        }
    }
}
