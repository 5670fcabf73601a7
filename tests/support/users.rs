//! Running processes as other OS users, the way the shipped unit runs
//! the agent (`DynamicUser=yes`: a uid with no passwd entry, `UMask=0077`)
//! and operators run commands (root, a member of a group). The tests run
//! as root (CI does): a test needing another user fails, saying so,
//! otherwise.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Who a process runs as.
#[derive(Debug, Clone, Copy)]
pub struct OsUser {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: &'static [u32],
    pub umask: u32,
}

/// The agent as the shipped unit runs it: a dynamic uid, `UMask=0077`.
pub const AGENT: OsUser = OsUser {
    uid: 61234,
    gid: 61234,
    groups: &[],
    umask: 0o077,
};

/// Root in an operator's shell.
pub const ROOT: OsUser = OsUser {
    uid: 0,
    gid: 0,
    groups: &[],
    umask: 0o022,
};

/// Panics unless the tests run as root (they need to be other users).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests run processes as other OS users (the agent's dynamic user, operators): run the suite as root, as CI does"
    );
}

impl OsUser {
    /// Makes `command` run as this user: groups, gid, uid and umask set
    /// in the child before it runs.
    pub fn apply(self, command: &mut Command) -> &mut Command {
        // SAFETY: only async-signal-safe system calls run in the child.
        unsafe {
            command.pre_exec(move || {
                let fail = || Err(std::io::Error::last_os_error());
                if libc::setgroups(self.groups.len(), self.groups.as_ptr()) != 0 {
                    return fail();
                }
                if libc::setresgid(self.gid, self.gid, self.gid) != 0 {
                    return fail();
                }
                if libc::setresuid(self.uid, self.uid, self.uid) != 0 {
                    return fail();
                }
                libc::umask(self.umask);
                Ok(())
            })
        }
    }
}

/// A directory the agent's user owns, mode 0700: what systemd makes of
/// `StateDirectory=` for a `DynamicUser=`.
pub fn state_dir_for(user: OsUser, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// Every entry under `dir`: its path (relative), owner, group, mode and,
/// for a regular file, a digest of its content — what "left as it was"
/// is checked against.
pub fn listing(dir: &Path, with_content: bool) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let digest = if with_content && meta.is_file() {
                use sha2::Digest;
                let bytes = std::fs::read(&path).unwrap();
                let digest: String = sha2::Sha256::digest(&bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                format!(" {digest}")
            } else {
                String::new()
            };
            out.push(format!(
                "{} {}:{} {:o}{digest}",
                path.strip_prefix(dir).unwrap().display(),
                meta.uid(),
                meta.gid(),
                meta.mode() & 0o7777
            ));
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Entries under `dir` that `user` does not own.
pub fn not_owned_by(user: OsUser, dir: &Path) -> Vec<String> {
    listing(dir, false)
        .into_iter()
        .filter(|line| {
            let owner = line.split(' ').nth(1).unwrap_or("");
            owner != format!("{}:{}", user.uid, user.gid)
        })
        .collect()
}
