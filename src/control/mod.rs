//! The local control channel: operators' commands carried out by the
//! running agent (docs/operations.md, "Commands beside the agent").
//!
//! While `tend run` runs it is the only writer of its state. A command that
//! changes the state (`override set|clear`, `deletions approve`, `state
//! reset-attempts`, `reconcile`, `suspend`, `resume`) is sent to it over a
//! Unix socket and answered with what the agent did. Without a running
//! agent the command writes the state itself, acting as the state dir's
//! owner ([`crate::process::owner`]). Either way the same code decides
//! and writes ([`actions`]).
//!
//! # Guarantees
//! * The agent carries out a request only for a peer the kernel vouches
//!   for (`SO_PEERCRED`): root, the agent's own user, or a member of
//!   `[control] group`. Anyone else is refused, and the refusal says who
//!   may.
//! * A request is one JSON line, its answer one JSON line; a request
//!   larger than [`MAX_REQUEST`] or slower than [`REQUEST_TIMEOUT`] is
//!   dropped unanswered, never half carried out.
//! * What the agent did is logged with who asked (uid and pid).

pub(crate) mod actions;
pub(crate) mod client;
mod peer;
pub(crate) mod server;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The largest request the agent reads.
pub(crate) const MAX_REQUEST: usize = 64 * 1024;
/// How long a request may take to arrive, and an answer to be read.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What an operator asks the agent to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub(crate) enum Request {
    /// Set (replace) the local override of a declaration: the annotations
    /// it stands for, checked by the same rules as annotations in Git.
    OverrideSet {
        name: String,
        annotations: BTreeMap<String, String>,
        /// Set it although no declaration or resource of that name is
        /// known.
        force: bool,
    },
    /// Remove the local override of a declaration.
    OverrideClear { name: String },
    /// Approve deletions the mass-deletion guard holds.
    DeletionsApprove { names: Vec<String>, reason: String },
    /// Forget the failed update attempts of a resource.
    ResetAttempts { name: String },
    /// Reconcile now (every resource; `names`, when given, must be known).
    Reconcile { names: Vec<String> },
    /// Freeze every change until `resume` (or the expiry).
    Suspend {
        reason: String,
        expires: Option<String>,
        on_expiry: Option<String>,
    },
    /// End a freeze.
    Resume,
}

impl Request {
    /// The command line an operator typed, for logs and refusals.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Request::OverrideSet { .. } => "tend override set",
            Request::OverrideClear { .. } => "tend override clear",
            Request::DeletionsApprove { .. } => "tend deletions approve",
            Request::ResetAttempts { .. } => "tend state reset-attempts",
            Request::Reconcile { .. } => "tend reconcile",
            Request::Suspend { .. } => "tend suspend",
            Request::Resume => "tend resume",
        }
    }
}

/// What a command answers: its exit code and what it prints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Answer {
    pub code: u8,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

impl Answer {
    /// Success, printing `stdout`.
    pub(crate) fn ok(stdout: impl Into<String>) -> Self {
        Answer {
            code: crate::process::exit::OK,
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    /// Failure (exit 1), printing `stderr`.
    pub(crate) fn refused(stderr: impl Into<String>) -> Self {
        Answer {
            code: crate::process::exit::ERROR,
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }
}

/// The group whose members may use the control channel, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    pub name: String,
    pub gid: u32,
}

impl Group {
    /// `[control] group`, resolved; a group that does not exist is a
    /// configuration error.
    pub(crate) fn from_config(
        config: &crate::config::Config,
    ) -> Result<Option<Group>, crate::config::ConfigError> {
        let Some(name) = &config.control.group else {
            return Ok(None);
        };
        group_by_name(name)
            .map(Some)
            .ok_or_else(|| crate::config::ConfigError::NoGroup { name: name.clone() })
    }
}

/// Looks a group up by name (`/etc/group`, NSS).
pub(crate) fn group_by_name(name: &str) -> Option<Group> {
    let c_name = std::ffi::CString::new(name).ok()?;
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; getgrnam_r writes only
    // into `group` and `buf` (its strings point into `buf`, unused here).
    let rc = unsafe {
        libc::getgrnam_r(
            c_name.as_ptr(),
            &mut group,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then(|| Group {
        name: name.to_string(),
        gid: group.gr_gid,
    })
}
