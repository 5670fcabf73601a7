//! `POST /v1/reconcile` starts at most one fetch-and-reconcile per
//! `[server] reconcile_min_interval`: a request within the interval of the
//! last start is folded into one start at the end of it, and every later
//! request before then into that same one. None is lost (each is answered
//! with when its reconcile starts), and a flood of requests costs one
//! cycle per interval, not one per request.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// Start now.
    Now,
    /// Start at the end of the interval: the caller schedules it (and
    /// calls [`Coalescer::started`] when it does).
    Scheduled(Duration),
    /// A start is already scheduled, this much later: folded into it.
    Folded(Duration),
}

#[derive(Debug, Default)]
struct Gate {
    interval: Duration,
    last_start: Option<Instant>,
    scheduled: bool,
}

/// The gate in front of the reconcile trigger.
#[derive(Debug, Default)]
pub(crate) struct Coalescer {
    gate: Mutex<Gate>,
}

impl Coalescer {
    pub(crate) fn new(interval: Duration) -> Self {
        Coalescer {
            gate: Mutex::new(Gate {
                interval,
                ..Gate::default()
            }),
        }
    }

    /// A reload's new interval.
    pub(crate) fn set_interval(&self, interval: Duration) {
        self.lock().interval = interval;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a request arriving at `now`. While a start is scheduled,
    /// every request folds into it, even one arriving after its time
    /// before it ran (else both would start).
    pub(crate) fn admit(&self, now: Instant) -> Admitted {
        let mut gate = self.lock();
        let next = gate.last_start.map(|last| last + gate.interval);
        let wait = next.map_or(Duration::ZERO, |next| next.saturating_duration_since(now));
        if gate.scheduled {
            return Admitted::Folded(wait);
        }
        if wait.is_zero() {
            gate.last_start = Some(now);
            Admitted::Now
        } else {
            gate.scheduled = true;
            Admitted::Scheduled(wait)
        }
    }

    /// The scheduled start happened at `now`.
    pub(crate) fn started(&self, now: Instant) {
        let mut gate = self.lock();
        gate.scheduled = false;
        gate.last_start = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_requests_costs_one_start_per_interval_and_loses_none() {
        let gate = Coalescer::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(gate.admit(at(0)), Admitted::Now);
        assert_eq!(
            gate.admit(at(500)),
            Admitted::Scheduled(Duration::from_millis(1500))
        );
        for ms in [600, 1000, 1999] {
            assert_eq!(
                gate.admit(at(ms)),
                Admitted::Folded(Duration::from_millis(2000 - ms))
            );
        }
        // Its time has come, and it has not run yet: still folded.
        assert_eq!(gate.admit(at(2001)), Admitted::Folded(Duration::ZERO));
        gate.started(at(2002));
        assert_eq!(
            gate.admit(at(2100)),
            Admitted::Scheduled(Duration::from_millis(1902))
        );
        gate.started(at(4000));
        // Quiet for longer than the interval: at once again.
        assert_eq!(gate.admit(at(6500)), Admitted::Now);

        let open = Coalescer::new(Duration::ZERO);
        assert_eq!(open.admit(at(0)), Admitted::Now);
        assert_eq!(open.admit(at(0)), Admitted::Now);
    }
}
