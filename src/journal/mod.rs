//! The state dir's SQLite database (DESIGN.md §8): what tend remembers of
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

pub mod lock;
pub mod store;

pub use lock::StateLock;
pub use store::{
    Intent, IntentState, LocalOverride, ManagedResource, StateStore, StoredMemories, TombstoneRow,
};

/// The state format this binary writes (see `store::MIGRATIONS`).
pub const FORMAT: i64 = 2;
/// The newest `min_reader_format` this binary can read. Format 2 only
/// added an index, so a format-1 reader still reads it: new files keep
/// `min_reader_format` 1.
pub const READABLE_FORMAT: i64 = 1;

/// A state-dir problem.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "state {path} needs a newer tend: its min_reader_format is {found}, this tend reads up to {supported}. The file was not changed. Run the newer tend, or follow docs/runbooks/rollback.md"
    )]
    TooNew {
        path: String,
        found: i64,
        supported: i64,
    },
    #[error(
        "state dir {dir} is in use by another tend (pid {pid}); wait for it to finish or stop it (systemctl stop tend)"
    )]
    Locked { dir: String, pid: String },
    #[error("state database {path}: {message}")]
    Sqlite { path: String, message: String },
    #[error("state dir {path}: {message}")]
    Io { path: String, message: String },
}
