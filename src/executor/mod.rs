//! The executor: acts on decisions, durably.
//!
//! Every mutating call is journalled (fsynced) with its operation id before
//! it is sent, retried with the same id, and marked done only after an
//! observation confirms its effect. Pending intents are resolved before any
//! new work on a resource, so a lost response or a crash is finished, never
//! repeated as new work.
//!
//! [`runtime`]: one provider's limiter, slots and retry policy, shared by
//! observation and operations · [`request`]: the call a decision makes ·
//! [`operation`]: one operation's commit points · [`queue`]: running many,
//! bounded per provider · [`replay`]: pending intents after a crash.

pub(crate) mod operation;
pub(crate) mod queue;
pub(crate) mod replay;
pub(crate) mod request;
pub(crate) mod retry;
pub(crate) mod runtime;

pub(crate) use operation::{Confirmation, OpOutcome, PlannedOperation};
pub(crate) use queue::Executed;
pub(crate) use retry::RetryPolicy;
pub(crate) use runtime::{ExecLimits, ProviderRuntime};

use std::sync::Arc;

use crate::clock::Clock;
use crate::journal::StateStore;

/// What every operation of one agent shares: the journal, the agent's
/// identity and the clock.
#[derive(Debug, Clone)]
pub struct ExecContext {
    pub store: Arc<StateStore>,
    pub agent_id: Arc<str>,
    pub clock: Arc<dyn Clock>,
    /// Set when the agent is shutting down: operations already running
    /// finish, no new one starts (what is left is decided again, or stays
    /// journalled, at the next start).
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// Set by the executor when a journal write of its batch failed: an
    /// operation journalled ahead and still waiting for a provider slot is
    /// not sent (each batch starts with its own, unset).
    pub halted: Arc<std::sync::atomic::AtomicBool>,
    /// Whether each operation's confirming observation is returned with
    /// it ([`Executed::confirmed_by`]), for a cycle that decides again from
    /// them instead of observing again. Off for a large batch: holding one
    /// observation per operation costs memory in proportion to the batch,
    /// where observing again costs a listing.
    pub keep_confirmations: bool,
    /// A deliberate bug: a field of test builds only (the `test-hooks`
    /// feature).
    #[cfg(feature = "test-hooks")]
    pub sabotage: crate::sabotage::Sabotage,
}

impl ExecContext {
    /// Whether the deliberate bug `which` is on (never without
    /// `test-hooks`).
    #[inline(always)]
    pub fn sabotaged(&self, which: crate::sabotage::Sabotage) -> bool {
        #[cfg(feature = "test-hooks")]
        return self.sabotage == which;
        #[cfg(not(feature = "test-hooks"))]
        {
            let _ = which;
            false
        }
    }
}
