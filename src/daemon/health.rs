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
pub struct Heartbeats {
    workers: Mutex<HashMap<String, Beat>>,
    /// The last time any operation finished.
    activity: Mutex<Instant>,
}

impl Default for Heartbeats {
    fn default() -> Self {
        Heartbeats {
            workers: Mutex::default(),
            activity: Mutex::new(Instant::now()),
        }
    }
}

impl Heartbeats {
    /// `worker` is alive; `in_cycle`: it is running a cycle now.
    pub fn beat(&self, worker: &str, in_cycle: bool) {
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

    pub fn forget(&self, worker: &str) {
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(worker);
    }

    /// Whether every worker beat, or (in a cycle) saw an operation finish,
    /// within `within`.
    pub fn all_alive(&self, within: Duration) -> bool {
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

    /// Operations in flight are activity too: each waits on a call the
    /// provider's timeouts bound (`timeout`, `operation_timeout`), and the
    /// executor that says so is being polled. A loop wedged anywhere else
    /// says nothing.
    fn in_flight(&self, _operations: usize) {
        *self.activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}
