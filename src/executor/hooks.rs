//! Test-only pause points, so a crash test's SIGKILL lands exactly between
//! two commit points.
//!
//! Compiled in only with the `test-hooks` feature, which the test build
//! enables (the crate's dev-dependency on itself) and a release build does
//! not: a production binary has no code path that reads
//! `TEND_TEST_PAUSE_AT` or sleeps on an environment variable's say-so.

/// Pause points in the life of an operation.
pub const AFTER_INTENT: &str = "after-intent";
pub const AFTER_CALL: &str = "after-call";
pub const AFTER_CONFIRM: &str = "after-confirm";

/// If `TEND_TEST_PAUSE_AT` is `point`, writes `TEND_TEST_PAUSE_FILE` (so the
/// test knows the point was reached) and sleeps until killed.
#[cfg(test_hooks)]
pub fn pause_point(point: &str) {
    if std::env::var("TEND_TEST_PAUSE_AT").as_deref() != Ok(point) {
        return;
    }
    if let Ok(file) = std::env::var("TEND_TEST_PAUSE_FILE") {
        let _ = std::fs::write(file, point);
    }
    std::thread::sleep(std::time::Duration::from_secs(600));
}

/// Without `test-hooks`: nothing.
#[cfg(not(test_hooks))]
#[inline(always)]
pub fn pause_point(_point: &str) {}

/// If `TEND_TEST_HANG_OPERATIONS` is `1`, every operation hangs for good
/// after its intent is journalled (a call that ignores every deadline):
/// the watchdog must stop being fed once its deadline passes.
#[cfg(test_hooks)]
pub async fn hang_point() {
    if std::env::var("TEND_TEST_HANG_OPERATIONS").as_deref() == Ok("1") {
        std::future::pending::<()>().await;
    }
}

/// Without `test-hooks`: nothing.
#[cfg(not(test_hooks))]
#[inline(always)]
pub async fn hang_point() {}

/// A source poll about to fetch (a test stalls it past every deadline).
pub const BEFORE_FETCH: &str = "before-fetch";

/// A cycle about to read its inputs from the state (after the source
/// fetch, with any listing ahead started).
pub const BEFORE_INPUTS: &str = "before-inputs";

/// If `TEND_TEST_PAUSE_AT` is `point`, writes `TEND_TEST_PAUSE_FILE` and
/// waits until the test removes it: the test acts while the process
/// stands still (on this thread), then lets it go on.
#[cfg(test_hooks)]
pub fn pause_until_resumed(point: &str) {
    if std::env::var("TEND_TEST_PAUSE_AT").as_deref() != Ok(point) {
        return;
    }
    let Ok(file) = std::env::var("TEND_TEST_PAUSE_FILE") else {
        return;
    };
    let _ = std::fs::write(&file, point);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while std::path::Path::new(&file).exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Without `test-hooks`: nothing.
#[cfg(not(test_hooks))]
#[inline(always)]
pub fn pause_until_resumed(_point: &str) {}

/// An in-process crash at a commit point, for the simulation: armed with a
/// point and a count, the operation that reaches that point the count-th
/// time stops there, as if the process had died: nothing after the point
/// is committed, and no new operation starts (the agent drains). The
/// simulation then drops the agent and opens it again over the same state
/// store and provider.
///
/// Inert without the `test-hooks` feature: [`CrashSwitch::arm`] does not
/// exist there, and [`CrashSwitch::reached`] does nothing.
#[derive(Debug, Clone, Default)]
pub struct CrashSwitch(std::sync::Arc<std::sync::Mutex<CrashState>>);

#[derive(Debug, Default)]
struct CrashState {
    armed: Option<(&'static str, u32)>,
    fired: bool,
}

impl CrashSwitch {
    /// Crash at `point` the `nth` time (from 1) an operation reaches it.
    #[cfg(feature = "test-hooks")]
    pub fn arm(&self, point: &'static str, nth: u32) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *state = CrashState {
            armed: Some((point, nth.max(1))),
            fired: false,
        };
    }

    /// Whether the armed crash happened (and disarms it).
    #[cfg(feature = "test-hooks")]
    pub fn take_fired(&self) -> bool {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.armed = None;
        std::mem::take(&mut state.fired)
    }

    /// Called at each commit point: stops the operation (a panic its task
    /// contains; the intent stays as the journal has it) when armed for
    /// this point and count.
    #[inline(always)]
    pub fn reached(&self, point: &'static str, draining: &std::sync::atomic::AtomicBool) {
        if !cfg!(feature = "test-hooks") {
            return;
        }
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some((armed, left)) = state.armed else {
            return;
        };
        if armed != point {
            return;
        }
        if left > 1 {
            state.armed = Some((armed, left - 1));
            return;
        }
        state.armed = None;
        state.fired = true;
        drop(state);
        draining.store(true, std::sync::atomic::Ordering::SeqCst);
        std::panic::panic_any(SimulatedCrash(point));
    }
}

/// The payload of a simulated crash's panic (a test's panic hook can tell
/// it from a real one).
#[derive(Debug)]
pub struct SimulatedCrash(pub &'static str);
