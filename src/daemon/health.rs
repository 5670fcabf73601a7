//! Whether the reconcile loops are alive, for the watchdog.
//!
//! Each provider worker beats while it waits and at the start and end of
//! every cycle; a running cycle counts as alive while operations keep
//! finishing, or are in flight (the executor says so every second). The
//! watchdog is pinged only when every worker is alive, so a wedged loop
//! trips it however healthy the HTTP server is.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::executor::Executed;
use crate::executor::queue::Progress;

#[derive(Debug, Clone, Copy)]
struct Beat {
    at: Instant,
    in_cycle: bool,
}

/// The workers' heartbeats.
#[derive(Debug)]
pub(crate) struct Heartbeats {
    workers: Mutex<HashMap<String, Beat>>,
    /// The last time any operation finished, or was in flight within its
    /// deadline.
    activity: Mutex<Instant>,
    /// The longest an operation may be in flight
    /// ([`crate::executor::RetryPolicy::operation_deadline`]); past it, it is hung.
    operation_deadline: Mutex<Duration>,
    /// The source follower's last poll, and how long it may take until
    /// the next (the wait between polls and one fetch's deadline).
    source: Mutex<Option<(Instant, Duration)>>,
}

impl Default for Heartbeats {
    fn default() -> Self {
        Heartbeats {
            workers: Mutex::default(),
            activity: Mutex::new(Instant::now()),
            operation_deadline: Mutex::new(Duration::from_secs(3600)),
            source: Mutex::new(None),
        }
    }
}

impl Heartbeats {
    /// `worker` is alive; `in_cycle`: it is running a cycle now.
    pub(crate) fn beat(&self, worker: &str, in_cycle: bool) {
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                worker.to_string(),
                Beat {
                    at: Instant::now(),
                    in_cycle,
                },
            );
    }

    /// Sets the longest an operation may be in flight (at each start and
    /// reload).
    pub(crate) fn set_operation_deadline(&self, deadline: Duration) {
        *self
            .operation_deadline
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = deadline;
    }

    /// The source follower finished a poll; the next one is due within
    /// `window` (its wait and its fetch's deadline).
    pub(crate) fn source_polled(&self, window: Duration) {
        *self.source.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), window));
    }

    /// Whether the source follower polled within its window (or has not
    /// started: its first fetch is bounded too).
    pub(crate) fn source_alive(&self) -> bool {
        self.source
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none_or(|(at, window)| at.elapsed() <= window)
    }

    pub(crate) fn forget(&self, worker: &str) {
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(worker);
    }

    /// Whether every worker beat, or (in a cycle) saw an operation finish,
    /// within `within`.
    pub(crate) fn all_alive(&self, within: Duration) -> bool {
        let activity = *self.activity.lock().unwrap_or_else(|p| p.into_inner());
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .all(|b| b.at.elapsed() < within || (b.in_cycle && activity.elapsed() < within))
    }
}

impl Progress for Heartbeats {
    fn finished(&self, _done: usize, _total: usize, _executed: &Executed) {
        *self.activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Operations in flight are activity too while they are within their
    /// deadline: each waits on calls the provider's timeouts bound
    /// (`timeout`, `operation_timeout`, the retries), and the executor that
    /// says so is being polled. One in flight past the deadline is hung:
    /// it is not activity, and the watchdog stops being fed. A loop wedged
    /// anywhere else says nothing.
    fn in_flight(&self, _operations: usize, oldest: Duration) {
        let deadline = *self
            .operation_deadline
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if oldest <= deadline {
            *self.activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        } else {
            tracing::error!(
                "an operation has been in flight for {}, past its deadline of {} (every attempt's call timeouts, the waits between them and the confirmation): it is hung, and the watchdog is no longer fed",
                crate::time::duration(oldest),
                crate::time::duration(deadline)
            );
        }
    }
}
