//! Retrying provider calls: exponential backoff with jitter (`backon`),
//! never sooner than a `Retry-After` the provider asked for.

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use governor::DefaultDirectRateLimiter;

use crate::provider::ProviderError;

/// How transient failures are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub min_delay: Duration,
    pub max_delay: Duration,
    /// Retries after the first attempt.
    pub max_retries: usize,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(30),
            max_retries: 6,
        }
    }
}

impl RetryPolicy {
    fn delays(&self) -> impl Iterator<Item = Duration> {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(self.max_retries)
            .build()
    }

    /// Runs `call` until it succeeds, fails for good, or the retries run
    /// out (then the last transient error). Every attempt waits for the
    /// provider's rate limit first.
    pub async fn run<T, F, Fut>(
        &self,
        limiter: &DefaultDirectRateLimiter,
        mut call: F,
    ) -> Result<T, ProviderError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ProviderError>>,
    {
        let mut delays = self.delays();
        loop {
            limiter.until_ready().await;
            let error = match call().await {
                Ok(value) => return Ok(value),
                Err(e) if !e.is_transient() => return Err(e),
                Err(e) => e,
            };
            let Some(mut delay) = delays.next() else {
                return Err(error);
            };
            if let ProviderError::RateLimited { retry_after, .. } = &error {
                delay = delay.max(*retry_after);
            }
            tracing::warn!(error = %error, delay = ?delay, "provider call failed; retrying");
            tokio::time::sleep(delay).await;
        }
    }
}
