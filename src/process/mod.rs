//! What the process as a whole shares, below `cli` and `daemon`: the exit
//! codes scripts and systemd read, how the heap is tuned, and acting as
//! the state dir's owner when run as root.

pub mod failpoint;
pub mod heap;
pub(crate) mod owner;
pub(crate) mod sqlite;

/// Exit codes shared by the commands and the daemon.
pub(crate) mod exit {
    /// Nothing to do / no problems.
    pub(crate) const OK: u8 = 0;
    /// An error (invalid declarations, a failed cycle); for `tend run`, a
    /// failure a restart may cure (systemd's `Restart=on-failure`).
    pub(crate) const ERROR: u8 = 1;
    /// With `--detailed-exitcode`: changes or drift pending.
    pub(crate) const PENDING: u8 = 2;
    /// A configuration (or state) that cannot work, sysexits `EX_CONFIG`:
    /// restarting cannot help (the unit's `RestartPreventExitStatus=78`).
    pub(crate) const CONFIG: u8 = 78;
}
