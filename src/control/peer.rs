//! Who is at the other end of the control socket, as the kernel says
//! (`SO_PEERCRED`, `SO_PEERGROUPS`), and whether they may ask.

use std::os::fd::AsRawFd;

use super::Group;

/// The peer of a control connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
    /// Supplementary groups (empty where the kernel cannot say).
    pub groups: Vec<u32>,
}

impl Peer {
    /// The peer of `stream`.
    pub(crate) fn of(stream: &tokio::net::UnixStream) -> std::io::Result<Peer> {
        let cred = stream.peer_cred()?;
        Ok(Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            pid: cred.pid(),
            groups: peer_groups(stream.as_raw_fd()),
        })
    }

    /// `uid 0 (pid 4242)`, for logs and what the state keeps.
    pub(crate) fn describe(&self) -> String {
        match self.pid {
            Some(pid) => format!("uid {} (pid {pid})", self.uid),
            None => format!("uid {}", self.uid),
        }
    }

    /// Whether the peer may ask: root, the agent's own user, or a member
    /// of `group`. `Err`: the refusal, saying who may.
    pub(crate) fn allowed(&self, agent_uid: u32, group: Option<&Group>) -> Result<(), String> {
        if self.uid == 0 || self.uid == agent_uid {
            return Ok(());
        }
        if let Some(group) = group
            && (self.gid == group.gid || self.groups.contains(&group.gid))
        {
            return Ok(());
        }
        Err(format!(
            "{} may not change this agent's state: root, the agent's user (uid {agent_uid}){} may. Run the command with sudo{}",
            self.describe(),
            match group {
                Some(g) => format!(" and members of group `{}`", g.name),
                None => String::new(),
            },
            match group {
                Some(_) => ", or join that group",
                None => ", or name a group in [control] group",
            }
        ))
    }
}

/// The peer's supplementary groups (`SO_PEERGROUPS`, Linux 4.13); empty
/// where the kernel cannot say. The option's number is not in the libc
/// crate; 59 is its value on the architectures listed (not on MIPS, SPARC
/// or PA-RISC, where the groups are then not read).
fn peer_groups(fd: std::os::fd::RawFd) -> Vec<u32> {
    #[cfg(any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64",
        target_arch = "loongarch64",
        target_arch = "s390x"
    ))]
    {
        const SO_PEERGROUPS: libc::c_int = 59;
        let mut groups = vec![0 as libc::gid_t; 256];
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is valid for `len` bytes; the kernel writes at
        // most that many and sets `len` to what it wrote.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc == 0 {
            groups.truncate(len as usize / std::mem::size_of::<libc::gid_t>());
            return groups;
        }
    }
    let _ = fd;
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer {
            uid,
            gid,
            pid: Some(7),
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn root_the_agents_user_and_the_group_may_ask_and_nobody_else() {
        let ops = Group {
            name: "tend-ops".into(),
            gid: 900,
        };
        assert!(peer(0, 0, &[]).allowed(61234, None).is_ok());
        assert!(peer(61234, 61234, &[]).allowed(61234, None).is_ok());
        assert!(peer(1000, 900, &[]).allowed(61234, Some(&ops)).is_ok());
        assert!(
            peer(1000, 1000, &[4, 900])
                .allowed(61234, Some(&ops))
                .is_ok()
        );
        let refused = peer(1000, 1000, &[4])
            .allowed(61234, Some(&ops))
            .unwrap_err();
        assert!(
            refused.contains("uid 1000 (pid 7)") && refused.contains("group `tend-ops`"),
            "{refused}"
        );
        assert!(peer(1000, 900, &[900]).allowed(61234, None).is_err());
    }
}
