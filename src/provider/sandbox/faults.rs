//! Faults the sandbox injects at the points a real API fails (rate
//! limits, 5xx, lost responses, stale reads), the call log, and the
//! idempotency keys that make a retried call answer with the original
//! result.

use std::fs;
use std::time::Duration;

use serde::Serialize;

use super::{RecordedOperation, SandboxProvider};
use crate::model::hash::sha256_hex;
use crate::provider::{OperationId, ProviderError};

/// How large the call log grows before it is rotated.
pub(super) const CALL_LOG_BYTES: u64 = 1 << 20;

impl SandboxProvider {
    pub(super) fn stale_lag(&self) -> Duration {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stale_reads
    }

    /// Injected failures before a call reaches the "server".
    pub(super) fn fail_before(&self, call: &str, resource: &str) -> Result<(), ProviderError> {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let outcome = if faults.rate_limit_calls > 0 {
            "429"
        } else if faults.fail_calls > 0 {
            "503"
        } else {
            "ok"
        };
        self.log_call(call, resource, outcome);
        if faults.rate_limit_calls > 0 {
            faults.rate_limit_calls -= 1;
            return Err(ProviderError::RateLimited {
                resource: resource.to_string(),
                retry_after: faults.retry_after,
            });
        }
        if faults.fail_calls > 0 {
            faults.fail_calls -= 1;
            return Err(ProviderError::Retryable {
                resource: resource.to_string(),
                message: "sandbox: 503 service unavailable (injected)".into(),
            });
        }
        Ok(())
    }

    /// Appends `millis call resource outcome` to `<name>.calls` beside the
    /// state file: what tests read to check timing and retries.
    /// A read-only sandbox (a reader's) writes nothing, this log included.
    pub(super) fn log_call(&self, call: &str, resource: &str, outcome: &str) {
        use std::io::Write as _;
        if self.read_only {
            return;
        }
        let path = self.dir.join("calls.log");
        if let Some(dir) = path.parent() {
            let _ = fs::create_dir_all(dir);
        }
        // Bounded: past CALL_LOG_BYTES the log moves to calls.log.1 (the
        // one before goes), so a long-running sandbox never fills a disk.
        if fs::metadata(&path).is_ok_and(|m| m.len() >= CALL_LOG_BYTES) {
            let _ = fs::rename(&path, self.dir.join("calls.log.1"));
        }
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{} {call} {resource} {outcome}", self.now_ms());
        }
    }

    /// The call log (`millis`, call, resource, outcome), oldest first (the
    /// rotated part included).
    pub fn calls(&self) -> Vec<(u64, String, String, String)> {
        let text = ["calls.log.1", "calls.log"]
            .iter()
            .map(|f| fs::read_to_string(self.dir.join(f)).unwrap_or_default())
            .collect::<String>();
        text.lines()
            .filter_map(|l| {
                let mut p = l.split(' ');
                Some((
                    p.next()?.parse().ok()?,
                    p.next()?.to_string(),
                    p.next()?.to_string(),
                    p.next()?.to_string(),
                ))
            })
            .collect()
    }

    pub(super) fn names_not_unique(&self) -> bool {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .names_not_unique
    }

    /// The first `NAME~N` no database is stored as (`names_not_unique`).
    pub(super) fn free_duplicate_name(&self, name: &str) -> Result<String, ProviderError> {
        for n in 1.. {
            let candidate = format!("{name}~{n}");
            let taken = self
                .load_database(&candidate)
                .map_err(|e| self.to_provider_error(name, e))?;
            if taken.is_none() {
                return Ok(candidate);
            }
        }
        unreachable!("an unbounded range ends only by returning")
    }

    /// Injected loss of a response after the change was committed.
    pub(super) fn lose_after(&self, resource: &str) -> Result<(), ProviderError> {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        if faults.lose_responses > 0 {
            faults.lose_responses -= 1;
            return Err(ProviderError::Retryable {
                resource: resource.to_string(),
                message: "sandbox: connection reset after the change was committed (injected lost response)".into(),
            });
        }
        Ok(())
    }

    /// Looks an idempotency key up: `Ok(true)` when the same request was
    /// seen before (answer with the original result, change nothing);
    /// `Ok(false)` for a new key, which [`Self::record_key`] stores once the
    /// change is committed.
    pub(super) fn seen_key(
        &self,
        op: &OperationId,
        digest: &str,
        database_name: &str,
    ) -> Result<bool, ProviderError> {
        let recorded = self
            .load_operation(&op.0)
            .map_err(|e| self.to_provider_error(database_name, e))?;
        match recorded {
            Some(mut recorded) if recorded.request_digest == digest => {
                recorded.uses += 1;
                self.store_operation(&op.0, &recorded)
                    .map_err(|e| self.to_provider_error(database_name, e))?;
                Ok(true)
            }
            Some(_) => Err(ProviderError::Permanent {
                resource: database_name.to_string(),
                message: format!("idempotency key {op} was already used for a different request"),
            }),
            None => Ok(false),
        }
    }

    pub(super) fn record_key(
        &self,
        op: &OperationId,
        kind: &str,
        digest: &str,
        database_name: &str,
    ) -> Result<(), ProviderError> {
        self.store_operation(&op.0, &Self::recorded(kind, digest, database_name))
            .map_err(|e| self.to_provider_error(database_name, e))
    }

    /// A call's record under its idempotency key, first used.
    pub(super) fn recorded(kind: &str, digest: &str, database_name: &str) -> RecordedOperation {
        RecordedOperation {
            request_digest: digest.to_string(),
            database_name: database_name.to_string(),
            kind: kind.to_string(),
            uses: 1,
        }
    }

    pub(super) fn digest(kind: &str, request: &impl Serialize) -> String {
        let json = serde_json::to_string(request).unwrap_or_default();
        sha256_hex(format!("{kind}:{json}").as_bytes())
    }
}
