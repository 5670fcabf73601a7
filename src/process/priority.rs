//! Maintenance that yields the CPU to the reconciliation cycles: the Git
//! cache's packing (seconds of a core at 100,000 resources) runs on a
//! thread of its own at a lower priority (nice 10), taking what the
//! cycles leave; the kernel still gives it about a tenth of a busy core,
//! so it is never starved.
//!
//! Linux keeps a nice value per thread, and a thread made by one inherits
//! it; an unprivileged process cannot raise it back. So the priority is
//! only ever lowered on a thread made for the purpose, never on one of a
//! pool that later runs a cycle's work.

/// The nice value of background threads.
const BACKGROUND_NICE: libc::c_int = 10;

/// Lowers the calling thread's priority to [`BACKGROUND_NICE`] (and that
/// of the threads it makes). Only for a thread made for background work.
pub(crate) fn lower_this_thread() {
    // SAFETY: gettid and setpriority have no memory preconditions; the
    // call changes only the calling thread's nice value (Linux keeps one
    // per thread).
    let lowered = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE)
    };
    if lowered != 0 {
        tracing::debug!(
            "cannot lower a background thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    /// The nice value of the calling thread, from `/proc/thread-self/stat`
    /// (the 19th field; the 2nd, the name, is in parentheses).
    fn nice_of_this_thread() -> Option<i64> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        let after_name = &stat[stat.rfind(')')? + 2..];
        after_name.split(' ').nth(16)?.parse().ok()
    }

    #[test]
    fn a_background_thread_runs_at_nice_10_and_the_others_are_left_alone() {
        let before = nice_of_this_thread();
        let lowered = std::thread::spawn(|| {
            super::lower_this_thread();
            nice_of_this_thread()
        })
        .join()
        .ok()
        .flatten();
        assert!(lowered >= Some(10), "nice {lowered:?}");
        assert_eq!(nice_of_this_thread(), before, "only the thread itself");
    }
}
