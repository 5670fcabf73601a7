//! `tend run` as a service: the daemon, liveness, high availability, notifications, its HTTP server, systemd, crashes and faults, the status branch.
//!
//! One test binary per theme: each links the whole crate once.

#[path = "../support/mod.rs"]
mod support;

mod apply_faults;
mod crash_loop;
mod daemon;
mod ha;
mod liveness;
mod notify;
mod reconcile_e2e;
mod server_access;
mod status_branch;
mod systemd;
