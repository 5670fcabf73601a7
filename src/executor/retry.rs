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
    /// How failing provider calls are retried (`[reconcile] retry_min_delay`
    /// and `max_retries`).
    pub fn from_config(config: &crate::config::Config) -> RetryPolicy {
        RetryPolicy {
            min_delay: config.reconcile.retry_min_delay,
            max_retries: config.reconcile.max_retries,
            ..RetryPolicy::default()
        }
    }

    /// The longest one operation may be in flight: every attempt's call
    /// deadline, the waits between them and the confirmation. Past it, an
    /// operation is hung, not slow (the watchdog stops being fed).
    pub fn operation_deadline(config: &crate::config::Config) -> Duration {
        let policy = RetryPolicy::from_config(config);
        let call = config
            .providers
            .values()
            .map(crate::config::ProviderConfig::call_deadline)
            .max()
            .unwrap_or_default();
        let retries = u32::try_from(policy.max_retries).unwrap_or(u32::MAX);
        call.saturating_mul(retries.saturating_add(1))
            .saturating_add(policy.max_delay.saturating_mul(retries))
            .saturating_add(config.reconcile.confirm_timeout)
    }

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
                tracing::error!(
                    error = %error,
                    "provider call failed {} times; giving up until the next cycle (docs/runbooks/provider-unavailable.md)",
                    self.max_retries + 1
                );
                return Err(error);
            };
            if let ProviderError::RateLimited { retry_after, .. } = &error {
                delay = delay.max(*retry_after);
            }
            tracing::warn!(
                error = %error,
                delay = %crate::time::duration_ms(delay),
                "provider call failed; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use governor::{Quota, RateLimiter};

    fn limiter() -> DefaultDirectRateLimiter {
        RateLimiter::direct(Quota::per_second(
            std::num::NonZeroU32::new(10_000).unwrap(),
        ))
    }

    fn transient(n: u32) -> ProviderError {
        ProviderError::Retryable {
            resource: "db".into(),
            message: format!("503 #{n}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_back_off_exponentially_then_succeed() {
        let policy = RetryPolicy {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(30),
            max_retries: 6,
        };
        let calls = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let result = policy
            .run(&limiter(), || async {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                if n < 3 { Err(transient(n)) } else { Ok(n) }
            })
            .await;
        assert_eq!(result, Ok(3));
        let waited = started.elapsed();
        // 200 + 400 + 800 ms, each with up to as much again of jitter.
        assert!(
            waited >= Duration::from_millis(1400) && waited < Duration::from_millis(2800),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_obeyed_and_permanent_errors_are_not_retried() {
        let policy = RetryPolicy::default();
        let calls = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let result = policy
            .run(&limiter(), || async {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err(ProviderError::RateLimited {
                        resource: "db".into(),
                        retry_after: Duration::from_secs(7),
                    })
                } else {
                    Ok(())
                }
            })
            .await;
        assert_eq!(result, Ok(()));
        assert!(
            started.elapsed() >= Duration::from_secs(7),
            "{:?}",
            started.elapsed()
        );

        let calls = AtomicU32::new(0);
        let result: Result<(), _> = policy
            .run(&limiter(), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(ProviderError::Permanent {
                    resource: "db".into(),
                    message: "invalid owner".into(),
                })
            })
            .await;
        assert!(matches!(result, Err(ProviderError::Permanent { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_run_out_with_the_last_error() {
        let policy = RetryPolicy {
            max_retries: 2,
            ..RetryPolicy::default()
        };
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = policy
            .run(&limiter(), || async {
                Err(transient(calls.fetch_add(1, Ordering::SeqCst)))
            })
            .await;
        assert_eq!(result, Err(transient(2)));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "the first attempt and two retries"
        );
    }
}
