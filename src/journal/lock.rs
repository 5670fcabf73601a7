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
    /// Locked for as long as this lives (the kernel drops the lock with
    /// the process).
    file: File,
    pub path: PathBuf,
}

impl StateLock {
    /// Takes the lock or refuses at once, naming the holder's pid.
    pub fn acquire(state_dir: &Path) -> Result<Self, StateError> {
        let io = |source: std::io::Error| StateError::Io {
            path: state_dir.display().to_string(),
            source,
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
            .map_err(|e| {
                let path = path.display().to_string();
                if e.raw_os_error() == Some(libc::ELOOP) {
                    StateError::Refused {
                        path,
                        problem: "is a symbolic link; tend never follows one here. Remove it and start again".into(),
                    }
                } else {
                    StateError::Io { path, source: e }
                }
            })?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(StateError::Refused {
                path: path.display().to_string(),
                problem: "is not a regular file; remove it and start again".into(),
            });
        }
        // A command that only looks at who holds the lock ([`holder`])
        // takes it shared for an instant: that is waited out.
        let mut tries = 0;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if tries < LOOK_RETRIES => {
                    tries += 1;
                    std::thread::sleep(LOOK_WAIT);
                }
                Err(TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    return Err(StateError::Locked {
                        dir: state_dir.display().to_string(),
                        pid: holder.split_whitespace().next().unwrap_or("").to_string(),
                    });
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(StateLock { file, path })
    }

    /// Records that the holder is the running agent (`tend run`), not a
    /// one-shot command: operators' commands then go through the agent
    /// and never write beside it.
    pub fn mark_agent(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.seek(SeekFrom::Start(0))?;
        writeln!(self.file, "{} {AGENT_MARK}", std::process::id())
    }
}

/// What the lock file says after the pid when `tend run` holds it.
const AGENT_MARK: &str = "tend-run";
/// How often, and how long apart, a writer tries again while a command
/// looks at the lock ([`holder`]).
const LOOK_RETRIES: u32 = 20;
const LOOK_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Who holds the state dir's lock now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Nobody.
    Free,
    /// The running agent (`tend run`), with its pid.
    Agent(String),
    /// A one-shot writer (`tend apply`, `state migrate`), with its pid.
    Command(String),
}

/// Who holds the lock of `state_dir`, found without waiting and without
/// writing: the lock is taken shared for an instant (a writer starting
/// meanwhile waits it out). A state dir or lock that does not exist is
/// free.
pub(crate) fn holder(state_dir: &Path) -> Result<Holder, StateError> {
    let path = state_dir.join("lock");
    let mut file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Holder::Free),
        Err(e) => {
            return Err(StateError::Io {
                path: path.display().to_string(),
                source: e,
            });
        }
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(Holder::Free),
        Err(TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let mut words = text.split_whitespace();
            let pid = words.next().unwrap_or("").to_string();
            Ok(match words.next() {
                Some(AGENT_MARK) => Holder::Agent(pid),
                _ => Holder::Command(pid),
            })
        }
        Err(TryLockError::Error(e)) => Err(StateError::Io {
            path: path.display().to_string(),
            source: e,
        }),
    }
}
