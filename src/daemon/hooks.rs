//! Test-only faults of the daemon (the `test-hooks` feature; never in a
//! release build): `TEND_TEST_WEDGE=1` makes every provider worker hang
//! forever before its second cycle, as a deadlocked loop would, so a test
//! can see the watchdog stop while the HTTP server still answers.

#[cfg(test_hooks)]
pub async fn wedge_point() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CYCLES: AtomicUsize = AtomicUsize::new(0);
    if std::env::var("TEND_TEST_WEDGE").as_deref() == Ok("1")
        && CYCLES.fetch_add(1, Ordering::SeqCst) >= 1
    {
        std::future::pending::<()>().await;
    }
}

/// Without `test-hooks`: nothing.
#[cfg(not(test_hooks))]
#[inline(always)]
pub async fn wedge_point() {}
