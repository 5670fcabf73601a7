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
#[cfg(feature = "test-hooks")]
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
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn pause_point(_point: &str) {}
