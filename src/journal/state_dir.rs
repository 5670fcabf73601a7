//! What the state dir must be before tend trusts it: a directory, owned by
//! the user tend runs as (or root), writable by nobody else. Whoever can
//! write into it can replace the journal, plant a symlink at the lock or
//! edit the parse cache; tend refuses to start on such a directory rather
//! than act on state it cannot vouch for.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::StateError;

/// Whether `dir` exists (`false` when missing); an error when it is
/// something other than a directory.
pub fn exists(dir: &Path) -> Result<bool, StateError> {
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(true),
        Ok(_) => Err(StateError::Io {
            path: dir.display().to_string(),
            message: "is not a directory; state_dir must name a directory (or a path that does not exist yet)".into(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StateError::Io {
            path: dir.display().to_string(),
            message: e.to_string(),
        }),
    }
}

/// Creates `dir` (mode 0700 for a new directory) and checks that it is
/// safe to write state into.
pub fn prepare_for_writing(dir: &Path) -> Result<(), StateError> {
    if !exists(dir)? {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StateError::Io {
                path: dir.display().to_string(),
                message: format!("cannot create the state dir: {e}"),
            })?;
    }
    check_trusted(dir)
}

/// Refuses a state dir that another user could write into.
pub fn check_trusted(dir: &Path) -> Result<(), StateError> {
    let meta = fs::metadata(dir).map_err(|e| StateError::Io {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let mode = meta.permissions().mode();
    if mode & 0o002 != 0 {
        return Err(StateError::Untrusted {
            dir: dir.display().to_string(),
            problem: format!("is writable by every user (mode {:o})", mode & 0o7777),
            fix: format!("chmod o-w {}", dir.display()),
        });
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Err(StateError::Untrusted {
            dir: dir.display().to_string(),
            problem: format!("is owned by uid {}, and tend runs as uid {me}", meta.uid()),
            fix: format!("chown {me} {}", dir.display()),
        });
    }
    Ok(())
}
