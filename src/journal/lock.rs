//! One writer per state dir: an exclusive lock on `state_dir/lock` holding
//! the writer's pid. The kernel releases it when the process dies, so a
//! crash never leaves a stale lock.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::StateError;

/// Held for as long as the writer runs.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    pub path: PathBuf,
}

impl StateLock {
    /// Takes the lock or refuses at once, naming the holder's pid.
    pub fn acquire(state_dir: &Path) -> Result<Self, StateError> {
        let io = |e: std::io::Error| StateError::Io {
            path: state_dir.display().to_string(),
            message: e.to_string(),
        };
        super::state_dir::prepare_for_writing(state_dir)?;
        let path = state_dir.join("lock");
        // A symlink planted at `lock` is refused, never followed: opening
        // through it would truncate whatever it points at.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| StateError::Io {
                path: path.display().to_string(),
                message: if e.raw_os_error() == Some(libc::ELOOP) {
                    "is a symbolic link; tend never follows one here. Remove it and start again"
                        .into()
                } else {
                    e.to_string()
                },
            })?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(StateError::Io {
                path: path.display().to_string(),
                message: "is not a regular file; remove it and start again".into(),
            });
        }
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(StateError::Locked {
                    dir: state_dir.display().to_string(),
                    pid: holder.trim().to_string(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(StateLock { _file: file, path })
    }
}
