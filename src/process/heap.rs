//! How the tend process uses its heap.
//!
//! A cycle over thousands of declarations builds and drops a hundred
//! megabytes of small objects (declarations, observations, decisions, the
//! report). With glibc's defaults, every large free trims the heap back to
//! the kernel and the next allocations fault the same pages in again, and
//! a one-shot command then frees every object one by one just before the
//! kernel would reclaim them all at once. Both cost more than deciding.

/// Keeps freed memory in the process (no trimming, no per-allocation
/// `mmap` for large blocks, the heap grown in large steps). A long-running
/// agent settles at its peak, which the memory targets bound anyway.
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

/// One malloc arena for every thread (`tend run`): the blocking threads
/// that read the state each grew an arena of their own that a
/// long-running agent never gave back (at 10,000 resources, about 45 MB of
/// the daemon's resident memory). The agent's threads rarely allocate at
/// the same moment, so sharing one costs nothing measurable.
///
/// # Safety
/// As [`tune`]: before the process starts any other thread.
pub unsafe fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: as in `tune`.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
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
