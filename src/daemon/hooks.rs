//! Test-only faults of the daemon (the failpoint `wedge`; never in a
//! release build): every provider worker hangs forever before its second
//! cycle, as a deadlocked loop would, so a test can see the watchdog stop
//! while the HTTP server still answers.

use crate::process::failpoint::{WEDGE, fired};

pub(super) async fn wedge_point() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CYCLES: AtomicUsize = AtomicUsize::new(0);
    if fired(WEDGE).is_some() && CYCLES.fetch_add(1, Ordering::SeqCst) >= 1 {
        std::future::pending::<()>().await;
    }
}
