//! How the tend process uses its heap.
//!
//! A cycle over thousands of declarations builds and drops a hundred
//! megabytes of small objects (declarations, observations, decisions, the
//! report). With glibc's defaults, every large free trims the heap back to
//! the kernel and the next allocations fault the same pages in again, and
//! a one-shot command then frees every object one by one just before the
//! kernel would reclaim them all at once. Both cost more than deciding.
//! A one-shot command keeps its freed memory ([`tune`]); the running
//! agent, whose resident memory is what its operators budget for, gives
//! it back ([`tune_agent`]).

/// Keeps freed memory in the process (no trimming, no per-allocation
/// `mmap` for large blocks, the heap grown in large steps): for a command
/// that ends soon after its peak. The running agent gives memory back
/// instead ([`tune_agent`]).
///
/// # Safety
/// Call it before the process starts any other thread (the binary's
/// `main` does, first): glibc reads these tunables without a lock.
pub unsafe fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // 32 MiB is the largest mmap threshold glibc accepts on 64-bit.
        for (param, bytes) in [
            (libc::M_TRIM_THRESHOLD, 256 << 20),
            (libc::M_TOP_PAD, 64 << 20),
            (libc::M_MMAP_THRESHOLD, 32 << 20),
        ] {
            // SAFETY: an allocator tunable, set before any other thread
            // exists (this function's contract). A refusal (return 0)
            // leaves the defaults, which are correct, only slower.
            unsafe {
                libc::mallopt(param, bytes);
            }
        }
    }
}

/// How many threads the running agent (`tend run`) decides on, for
/// `providers` providers of which `parallel_cycles` may run whole cycles
/// at once: two when there are two cores and two cycles to run, else one.
///
/// With one, ten providers' cycles at 100,000 declarations decided one
/// after another (a no-change request took as much CPU time as wall time,
/// about 0.6 s, on two cores); with two, two whole cycles run at once and
/// the request takes about 0.37 s. Each thread costs an arena
/// ([`tune_agent`]), and a second one buys nothing for one provider:
/// at 10,000 declarations on one provider it only raised the peak from
/// 104-114 MB to 137-140 MB. More than two would not shorten a request on
/// the two cores this is measured on.
pub fn agent_threads(providers: usize, parallel_cycles: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(providers).min(parallel_cycles).clamp(1, 2)
}

/// The running agent's heap: as many malloc arenas as it decides on
/// threads ([`agent_threads`]), and freed memory handed back to the
/// kernel (glibc's 128 KiB thresholds, fixed), without fast bins.
///
/// Arenas: glibc's default of eight a core gave each blocking thread that
/// reads the state an arena of its own that a long-running agent never
/// gave back (at 10,000 resources, about 45 MB of the daemon's resident
/// memory). One arena shared by two deciding threads made them wait on
/// each other's allocations: a no-change request at 100,000 took 1.5 s of
/// CPU instead of 0.6 s. The second costs about 7 MB at 10,000 resources
/// over 10 providers and 40-60 MB at 100,000 (each arena keeps what its
/// threads freed).
///
/// Handing memory back: [`tune`] keeps every freed page for the next
/// allocation, which a one-shot command wants (it ends soon after its
/// peak). An agent's resident memory is then the most its heap ever
/// spanned, holes and all: the cold start's creates and the first whole
/// status render left pages no later cycle fills. With blocks of 128 KiB
/// or more in their own mappings (unmapped when freed; glibc's default
/// threshold, but fixed instead of rising to the largest block freed) and
/// the heap's free top returned past 128 KiB, `bench_daemon` at 10,000
/// peaked at 68.5-69.0 MiB instead of 75.0-75.1, and held 63-64 MB
/// instead of 75-77 after its no-change cycles, for about 3 ms more of
/// tend's own time in each of them (pages faulted in again). Either
/// setting alone gave back 0-2 MiB of the peak.
///
/// No fast bins: glibc keeps small freed blocks (up to 128 bytes) unsorted
/// in "fast bins" and sorts them all into its free lists at the next
/// large allocation. A cycle frees its plan (the observations, decisions
/// and report entries of every resource: tens of thousands of small
/// blocks), and the next cycle's first large allocation sorted them all,
/// touching each again: at 100,000 declarations `malloc_consolidate` and
/// `unlink_chunk` were a fifth of the agent's samples, and glibc's
/// allocator 43 %. Without fast bins a freed block joins its free
/// neighbours at once (the small ones still go through glibc's per-thread
/// cache first). In a `perf` profile at 100,000 the allocator's share fell
/// from 43 % to 35 % of the samples. `bench_scale`, five runs each,
/// alternating: tend's own time per no-change request 349-553 ms (median
/// 436) against 458-600 ms (median 513), CPU per request 766-1,133 ms
/// (median 913) against 941-1,216 ms (median 1,046), the peak within the
/// same spread (342-379 MiB against 344-372 MiB). At 10,000, no
/// difference beyond the noise.
///
/// # Safety
/// As [`tune`]: before the process starts any other thread (the agent
/// calls it once its configuration is read, before its runtime starts).
pub unsafe fn tune_agent(threads: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let arenas = i32::try_from(threads).unwrap_or(1);
        for (param, value) in [
            (libc::M_ARENA_MAX, arenas),
            (libc::M_MXFAST, 0),
            (libc::M_MMAP_THRESHOLD, 128 << 10),
            (libc::M_TRIM_THRESHOLD, 128 << 10),
            (libc::M_TOP_PAD, 0),
        ] {
            // SAFETY: as in `tune`.
            unsafe {
                libc::mallopt(param, value);
            }
        }
    }
}

/// Two malloc arenas for a one-shot command (`tend apply`, `tend plan`):
/// glibc's default of eight a core gave each thread that reads ahead
/// beside the fetch (the parse cache, the memories, libgit2's start) an
/// arena of its own, whose freed memory no other thread reuses. At 10,000
/// declarations a no-change `tend apply` peaked at 101 MB with the
/// default, 93 MB with two (one arena: 88 MB, but 30 % slower, its
/// threads waiting on each other's allocations).
///
/// # Safety
/// As [`tune`]: before the process starts any other thread.
pub unsafe fn two_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: as in `tune`.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// Hands `value` to the kernel with the rest of the process instead of
/// freeing it: for the large results of a one-shot command, right before
/// the process exits. Nothing with a side effect on drop (files, locks,
/// connections) may be passed here.
pub(crate) fn release_at_exit<T>(value: T) {
    std::mem::forget(value);
}

#[cfg(test)]
mod tests {
    use super::agent_threads;

    /// A second thread only where a second whole cycle can run beside the
    /// first: two cores, two providers, two cycles allowed at once.
    #[test]
    fn the_agent_decides_on_two_threads_only_where_two_cycles_can_run() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let two = if cores >= 2 { 2 } else { 1 };
        assert_eq!(agent_threads(1, 2), 1, "one provider");
        assert_eq!(agent_threads(10, 1), 1, "parallel_cycles = 1");
        assert_eq!(agent_threads(0, 2), 1, "no provider");
        assert_eq!(agent_threads(2, 2), two);
        assert_eq!(agent_threads(100, 1024), two, "more than two");
    }
}
