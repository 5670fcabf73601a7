//! The executor: acts on decisions, durably (DESIGN.md §3).
//!
//! Every mutating call is journalled (fsynced) with its operation id before
//! it is sent, retried with the same id, and marked done only after an
//! observation confirms its effect. Pending intents are resolved before any
//! new work on a resource, so a lost response or a crash is finished, never
//! repeated as new work.

pub mod hooks;
pub mod operation;
pub mod retry;

pub use operation::{JournalRequest, OpOutcome, PlannedOperation, RequestBody};
pub use retry::RetryPolicy;

use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

use crate::journal::StateStore;
use crate::provider::Provider;

/// Everything operations against one provider share.
pub struct ExecContext<P: Provider> {
    pub provider: Arc<P>,
    pub provider_name: String,
    pub store: Arc<StateStore>,
    pub agent_id: String,
    /// Calls per second to this provider.
    pub limiter: DefaultDirectRateLimiter,
    /// At most this many operations in flight against this provider.
    pub slots: Semaphore,
    /// The size of `slots`: how many operations are worth starting at once.
    pub max_concurrency: usize,
    pub retry: RetryPolicy,
    /// How long to wait for an observation that confirms a call's effect
    /// before leaving the intent pending for the next cycle.
    pub confirm_timeout: Duration,
}

/// Limits and timings of one provider's executor.
#[derive(Debug, Clone, Copy)]
pub struct ExecLimits {
    pub max_concurrency: usize,
    pub rate_per_second: u32,
    pub retry: RetryPolicy,
    pub confirm_timeout: Duration,
}

impl<P: Provider> ExecContext<P> {
    pub fn new(
        provider: Arc<P>,
        provider_name: &str,
        store: Arc<StateStore>,
        agent_id: &str,
        limits: ExecLimits,
    ) -> Self {
        let rate = std::num::NonZeroU32::new(limits.rate_per_second.max(1))
            .unwrap_or(std::num::NonZeroU32::MIN);
        ExecContext {
            provider,
            provider_name: provider_name.to_string(),
            store,
            agent_id: agent_id.to_string(),
            limiter: RateLimiter::direct(Quota::per_second(rate)),
            slots: Semaphore::new(limits.max_concurrency.max(1)),
            max_concurrency: limits.max_concurrency.max(1),
            retry: limits.retry,
            confirm_timeout: limits.confirm_timeout,
        }
    }
}
