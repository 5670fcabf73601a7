//! Files and processes on a state dir that belongs to another user: what
//! root does beside the agent's own user (the shipped unit's dynamic
//! user) must leave every file usable by that user.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Gives `path` (a file this process created) to the owner of `like`, when
/// this process runs as root and `like` is another user's: a file root
/// leaves in the agent's state dir must stay usable by the agent. Best
/// effort (a failure is logged): the caller created the file only to read.
pub(crate) fn give_to_owner_of(path: &Path, like: &Path) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let Ok(owner) = fs::metadata(like) else {
        return;
    };
    if owner.uid() == 0 {
        return;
    }
    if let Err(e) = std::os::unix::fs::lchown(path, Some(owner.uid()), Some(owner.gid())) {
        tracing::warn!(
            "cannot give {} to uid {}: {e}; the agent may not be able to open its state until it is (chown {} {})",
            path.display(),
            owner.uid(),
            owner.uid(),
            path.display()
        );
    }
}

/// Whom this process acts as after [`act_as_owner_of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acting {
    /// As itself: not root, or the state dir is root's (or not there yet).
    Itself,
    /// As the state dir's owner, root given up for good.
    Owner { uid: u32, gid: u32 },
}

/// Why this process could not become the state dir's owner.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot act as uid {uid}, the owner of the state dir {}: {source}",
    dir.display()
)]
pub(crate) struct OwnerError {
    uid: u32,
    dir: std::path::PathBuf,
    #[source]
    source: std::io::Error,
}

/// When this process runs as root and `state_dir` belongs to another
/// user (the service's dynamic user), gives root up for good and acts as
/// that user — its uid and gid, no supplementary groups — before anything
/// in the state dir is touched: every file it then makes (the journal's
/// write-ahead log, fetched packs) is the agent's, exactly as if the agent
/// had made it. Root never asks for a `chown` that would break the
/// service.
///
/// # Caveats
/// Secrets the configuration names may be root-only: read them first
/// ([`crate::config::secret::preload`]).
pub(crate) fn act_as_owner_of(state_dir: &Path) -> Result<Acting, OwnerError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(Acting::Itself);
    }
    let meta = match fs::metadata(state_dir) {
        Ok(meta) => meta,
        // Made by this command (as root): systemd hands a StateDirectory=
        // to the service's user at its start.
        Err(_) => return Ok(Acting::Itself),
    };
    let (uid, gid) = (meta.uid(), meta.gid());
    if uid == 0 {
        return Ok(Acting::Itself);
    }
    let fail = |source| OwnerError {
        uid,
        dir: state_dir.to_path_buf(),
        source,
    };
    // glibc applies each of these to every thread of the process. Groups
    // first, while root may still change them; the uid last.
    // SAFETY: plain system calls on integers; a null list with size 0
    // clears the supplementary groups.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(fail(std::io::Error::last_os_error()));
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(fail(std::io::Error::last_os_error()));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(fail(std::io::Error::last_os_error()));
        }
    }
    tracing::debug!(
        "acting as uid {uid} gid {gid}, the owner of {}",
        state_dir.display()
    );
    Ok(Acting::Owner { uid, gid })
}
