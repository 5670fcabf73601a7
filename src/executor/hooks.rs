//! Test-only pause points, so a crash test's SIGKILL lands exactly between
//! two commit points. Inert unless `TEND_TEST_PAUSE_AT` names the point.

/// Pause points in the life of an operation.
pub const AFTER_INTENT: &str = "after-intent";
pub const AFTER_CALL: &str = "after-call";

/// If `TEND_TEST_PAUSE_AT` is `point`, writes `TEND_TEST_PAUSE_FILE` (so the
/// test knows the point was reached) and sleeps until killed.
pub fn pause_point(point: &str) {
    if std::env::var("TEND_TEST_PAUSE_AT").as_deref() != Ok(point) {
        return;
    }
    if let Ok(file) = std::env::var("TEND_TEST_PAUSE_FILE") {
        let _ = std::fs::write(file, point);
    }
    std::thread::sleep(std::time::Duration::from_secs(600));
}
