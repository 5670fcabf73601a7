//! One provider at run time: the provider, its capabilities, its rate
//! limiter and concurrency slots, and the retry policy. Built once per
//! agent and shared by observation and operations, so the configured
//! `rate_limit` bounds every call, reads included.

use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

use super::RetryPolicy;
use crate::provider::{AnyProvider, Capabilities, Provider};

/// Limits and timings of one provider's executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecLimits {
    pub max_concurrency: usize,
    pub rate_per_second: u32,
    pub retry: RetryPolicy,
    pub confirm_timeout: Duration,
}

/// A provider with everything calls to it share.
pub struct ProviderRuntime<P: Provider = AnyProvider> {
    pub name: String,
    pub provider: P,
    /// Calls per second to this provider (observations included).
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

impl<P: Provider> ProviderRuntime<P> {
    /// What the provider manages now (an http provider learns it from its
    /// server's `GET /v1/capabilities`, at the first call): read once per
    /// cycle, after observing, and passed to every decision of the cycle.
    pub fn capabilities(&self) -> Capabilities {
        self.provider.capabilities()
    }

    pub fn new(name: &str, provider: P, limits: ExecLimits) -> Self {
        let rate =
            std::num::NonZeroU32::new(limits.rate_per_second).unwrap_or(std::num::NonZeroU32::MIN);
        let slots = limits.max_concurrency.max(1);
        ProviderRuntime {
            name: name.to_string(),
            provider,
            limiter: RateLimiter::direct(Quota::per_second(rate)),
            slots: Semaphore::new(slots),
            max_concurrency: slots,
            retry: limits.retry,
            confirm_timeout: limits.confirm_timeout,
        }
    }
}
