//! Fault injection for tests: one mechanism, the `fail` crate's
//! failpoints, at the exact points a test needs the process to stop,
//! crash, hang or panic.
//!
//! Compiled in only with the `test-hooks` feature in a build with debug
//! assertions (`cfg(test_hooks)`, build.rs): the test build. Without it
//! every point is an inline no-op and the `fail` crate is not even a
//! dependency, so a production binary has no code path a variable in its
//! environment can reach.
//!
//! A test process names its points in `FAILPOINTS` (`NAME=ACTIONS;…`, read
//! once at start by [`setup`]), an in-process test with [`CrashSwitch`].
//! Every point here takes the `return` action; its argument says what
//! happens:
//!
//! | point | `return(…)` | what the process does |
//! | --- | --- | --- |
//! | [`AFTER_INTENT`], [`AFTER_CALL`], [`AFTER_CONFIRM`], [`BEFORE_FETCH`] | `pause` | writes `TEND_TEST_PAUSE_FILE` and sleeps: a crash test's SIGKILL lands exactly there |
//! | the commit points | `crash` | an in-process crash ([`SimulatedCrash`]): the simulation |
//! | [`BEFORE_INPUTS`], [`STATUS_WRITER_TAKEN`] | `until-resumed` | writes the file and waits until the test removes it |
//! | [`HANG_OPERATIONS`] | (none) | every operation hangs for good after its intent |
//! | [`WEDGE`] | (none) | every provider worker hangs before its second cycle |
//! | [`STATUS_WRITER_PANIC`] | (none) | the first status writer panics before it publishes |
//! | [`REQUEST_TIMEOUT`] | milliseconds | the HTTP server's request timeout |
//! | [`LAST_OPERATIONS_UNREAD`] | (none) | the status writer's read of the operations finished since its last render fails |
//! | [`GIT_PACK_LOOSE`] | objects | the loose objects above which the Git cache is packed |

use std::sync::atomic::{AtomicBool, Ordering};

/// Commit points in the life of an operation.
pub const AFTER_INTENT: &str = "after-intent";
pub const AFTER_CALL: &str = "after-call";
pub const AFTER_CONFIRM: &str = "after-confirm";
/// A source poll about to fetch.
pub const BEFORE_FETCH: &str = "before-fetch";
/// A cycle about to read its inputs from the state (after the source
/// fetch, with any listing ahead started).
pub const BEFORE_INPUTS: &str = "before-inputs";
/// Every operation, after its intent is journalled.
pub const HANG_OPERATIONS: &str = "hang-operations";
/// A provider worker's cycle.
pub const WEDGE: &str = "wedge";
/// The status writer, before its first publication.
pub const STATUS_WRITER_PANIC: &str = "status-writer-panic";
/// The status writer, with the board's report taken, before it reads the
/// state and publishes.
pub const STATUS_WRITER_TAKEN: &str = "status-writer-taken";
/// The HTTP server's request timeout.
pub const REQUEST_TIMEOUT: &str = "request-timeout";
/// The state's read of the operations finished since a mark
/// (`StateStore::last_operations_since`).
pub const LAST_OPERATIONS_UNREAD: &str = "last-operations-unread";
/// The loose objects above which the Git cache is packed
/// (`source::cache_pack::limits`).
pub const GIT_PACK_LOOSE: &str = "git-pack-loose";

/// The failpoints `FAILPOINTS` names, for the life of the process (the
/// binary's `main` holds the value).
#[cfg(test_hooks)]
pub fn setup() -> Option<fail::FailScenario<'static>> {
    Some(fail::FailScenario::setup())
}

/// Without `test-hooks`: nothing.
#[cfg(not(test_hooks))]
#[inline(always)]
pub fn setup() -> Option<()> {
    None
}

/// The argument of the `return` action configured at `point` when it
/// fires (`Some("")` for a bare `return`); `None` when nothing is.
#[cfg(test_hooks)]
pub(crate) fn fired(point: &str) -> Option<String> {
    fail::eval(point, |arg| arg.unwrap_or_default())
}

/// Without `test-hooks`: never.
#[cfg(not(test_hooks))]
#[inline(always)]
pub(crate) fn fired(_point: &str) -> Option<String> {
    None
}

/// A point where a test may stop the process: `pause` (sleep until
/// killed) or `until-resumed` (until the test removes the file).
pub(crate) fn stop_point(point: &'static str) {
    if let Some(how) = fired(point) {
        stop(point, &how);
    }
}

/// A commit point of an operation: [`stop_point`]'s actions, and
/// `crash`, which stops the operation as if the process had died there:
/// the agent drains (no new operation starts), and the panic's payload is
/// a [`SimulatedCrash`] its task contains. One call per commit point.
pub(crate) fn commit_point(point: &'static str, draining: &AtomicBool) {
    let Some(how) = fired(point) else {
        return;
    };
    if how == "crash" {
        CRASHED.store(true, Ordering::SeqCst);
        draining.store(true, Ordering::SeqCst);
        std::panic::panic_any(SimulatedCrash(point));
    }
    stop(point, &how);
}

/// `pause`: writes `TEND_TEST_PAUSE_FILE` (so the test knows the point
/// was reached) and sleeps until killed; `until-resumed`: writes it and
/// waits until the test removes it.
fn stop(point: &str, how: &str) {
    let file = std::env::var("TEND_TEST_PAUSE_FILE").ok();
    if let Some(file) = &file {
        let _ = std::fs::write(file, point);
    }
    let until = std::time::Instant::now() + std::time::Duration::from_secs(600);
    let waiting = || match how {
        "pause" => true,
        "until-resumed" => file
            .as_ref()
            .is_some_and(|f| std::path::Path::new(f).exists()),
        _ => false,
    };
    while std::time::Instant::now() < until && waiting() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Whether an armed in-process crash happened since the last call.
static CRASHED: AtomicBool = AtomicBool::new(false);

/// The simulation's switch for in-process crashes at commit points
/// (`crash`). The failpoints are the process's, so one agent at a time
/// arms them.
#[derive(Debug, Clone, Copy, Default)]
pub struct CrashSwitch;

#[cfg(feature = "test-hooks")]
impl CrashSwitch {
    /// Crash at `point` the `nth` time (from 1) an operation reaches it,
    /// once.
    pub fn arm(&self, point: &'static str, nth: u32) {
        let skip = nth.max(1) - 1;
        let actions = if skip == 0 {
            "1*return(crash)->off".to_string()
        } else {
            format!("{skip}*off->1*return(crash)->off")
        };
        if let Err(e) = fail::cfg(point, &actions) {
            panic!("failpoint {point}: {e}");
        }
        CRASHED.store(false, Ordering::SeqCst);
    }

    /// Whether the armed crash happened (and disarms every commit point).
    pub fn take_fired(&self) -> bool {
        for point in [AFTER_INTENT, AFTER_CALL, AFTER_CONFIRM] {
            fail::remove(point);
        }
        CRASHED.swap(false, Ordering::SeqCst)
    }
}

/// The payload of a simulated crash's panic (a test's panic hook can tell
/// it from a real one).
#[derive(Debug)]
pub struct SimulatedCrash(pub &'static str);

#[cfg(all(test, test_hooks))]
mod tests {
    use super::*;

    #[test]
    fn an_armed_crash_fires_at_the_nth_arrival_only_and_drains() {
        let draining = AtomicBool::new(false);
        let arrive = || {
            std::panic::catch_unwind(|| commit_point(AFTER_CALL, &draining))
                .err()
                .and_then(|p| p.downcast::<SimulatedCrash>().ok())
                .map(|c| c.0)
        };
        let switch = CrashSwitch;
        switch.arm(AFTER_CALL, 2);
        assert_eq!(arrive(), None, "the first arrival goes on");
        assert!(!draining.load(Ordering::SeqCst));
        assert_eq!(arrive(), Some(AFTER_CALL), "the second crashes");
        assert!(draining.load(Ordering::SeqCst), "and the agent drains");
        assert_eq!(arrive(), None, "once");
        assert!(switch.take_fired());
        assert!(!switch.take_fired());
        assert_eq!(fired(AFTER_INTENT), None, "other points are untouched");
    }
}
