//! One writer per state dir: an exclusive lock on `state_dir/lock` holding
//! the writer's pid. The kernel releases it when the process dies, so a
//! crash never leaves a stale lock.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
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
        fs::create_dir_all(state_dir).map_err(io)?;
        let path = state_dir.join("lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
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
