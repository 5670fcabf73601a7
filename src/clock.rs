//! The clock tend reads. Injected, so tests and the simulation can drive
//! time: nothing outside this module calls `SystemTime::now()` on the
//! reconcile path.

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// A source of the current time.
pub trait Clock: Debug + Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to (tests, simulation).
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
}

impl ManualClock {
    pub fn new(start: SystemTime) -> Self {
        ManualClock {
            now: Mutex::new(start),
        }
    }

    pub fn set(&self, t: SystemTime) {
        *self.lock() = t;
    }

    pub fn advance(&self, d: Duration) {
        let mut now = self.lock();
        *now = crate::time::add(*now, d);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SystemTime> {
        self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.lock()
    }
}
