//! What the state dir (and the reports dir) must be before tend trusts
//! it: a directory, owned by the user tend runs as (or root), writable by
//! nobody else — nor is any directory below it. Whoever can write into
//! one can replace the journal, plant a symlink where tend writes, or edit
//! the parse cache; tend refuses to start on such a directory rather than
//! act on state it cannot vouch for.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::StateError;

/// Whether `dir` exists (`false` when missing); an error when it is
/// something other than a directory.
pub(crate) fn exists(dir: &Path) -> Result<bool, StateError> {
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(true),
        Ok(_) => Err(StateError::Refused {
            path: dir.display().to_string(),
            problem: "is not a directory; state_dir must name a directory (or a path that does not exist yet)".into(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StateError::Io {
            path: dir.display().to_string(),
            source: e,
        }),
    }
}

/// Creates `dir` (mode 0700 for a new directory) and checks that it is
/// safe to write state into.
pub(crate) fn prepare_for_writing(dir: &Path) -> Result<(), StateError> {
    if !exists(dir)? {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| StateError::IoWhile {
                path: dir.display().to_string(),
                doing: "cannot create the state dir",
                source,
            })?;
    }
    check_trusted(dir)
}

/// Refuses a directory tend writes into (the state dir, the reports dir)
/// when another user could write into it or into any directory below it:
/// whoever can plant a file there can plant a symbolic link where tend
/// writes, or replace the journal or the parse cache. Symbolic links
/// below `dir` are not followed (only a user trusted with `dir` could
/// have made them); `dir` itself may be one (systemd's `/var/lib/NAME` of
/// a `DynamicUser=` unit is).
pub(crate) fn check_trusted(dir: &Path) -> Result<(), StateError> {
    let meta = fs::metadata(dir).map_err(|source| StateError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (me, my_group) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut pending = vec![(dir.to_path_buf(), meta)];
    while let Some((dir, meta)) = pending.pop() {
        if let Some((problem, fix)) = trust_problem(&dir, &meta, me, my_group) {
            return Err(StateError::Untrusted {
                dir: dir.display().to_string(),
                problem,
                fix,
            });
        }
        let entries = fs::read_dir(&dir).map_err(|source| StateError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        // The entry's type comes with the listing (no `stat` of each of
        // the Git cache's thousands of files); only a directory's own
        // metadata is read, for its mode and owner.
        for entry in entries.flatten() {
            // (`DirEntry::metadata` does not follow a link, and reads it
            // relative to the open directory: no path walked again.)
            if entry.file_type().is_ok_and(|kind| kind.is_dir())
                && let Ok(meta) = entry.metadata()
                && meta.is_dir()
            {
                pending.push((entry.path(), meta));
            }
        }
    }
    Ok(())
}

/// What makes `dir` writable by someone other than tend's user (and
/// root), and the command that fixes it.
fn trust_problem(
    dir: &Path,
    meta: &fs::Metadata,
    me: u32,
    my_group: u32,
) -> Option<(String, String)> {
    let mode = meta.permissions().mode();
    let shown = dir.display();
    if mode & 0o002 != 0 {
        return Some((
            format!("is writable by every user (mode {:o})", mode & 0o7777),
            format!("chmod o-w {shown}"),
        ));
    }
    if mode & 0o020 != 0 && meta.gid() != my_group {
        return Some((
            format!(
                "is writable by group {} (mode {:o}), which is not tend's group ({my_group})",
                meta.gid(),
                mode & 0o7777
            ),
            format!("chmod g-w {shown}"),
        ));
    }
    if meta.uid() != me && meta.uid() != 0 {
        return Some((
            format!("is owned by uid {}, and tend runs as uid {me}", meta.uid()),
            format!("chown {me} {shown}"),
        ));
    }
    None
}
