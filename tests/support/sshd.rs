//! A throwaway OpenSSH server on a free loopback port, with its own host
//! key and one authorized deploy key, for tests of the SSH transport. It
//! serves whatever the logged-in user can read (a bare repository by its
//! absolute path); stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::git::free_port;

const SSHD: &str = "/usr/sbin/sshd";

/// Runs `ssh-keygen` (OpenSSH's client tools).
pub fn ssh_keygen(args: &[&str]) -> String {
    let out = Command::new("ssh-keygen")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run ssh-keygen {args:?}: {e} (apt-get install openssh-client)")
        });
    assert!(
        out.status.success(),
        "ssh-keygen {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A new ed25519 key pair at `path` (and `path.pub`), no passphrase.
pub fn new_key(path: &Path, comment: &str) -> PathBuf {
    ssh_keygen(&[
        "-q",
        "-t",
        "ed25519",
        "-N",
        "",
        "-C",
        comment,
        "-f",
        &path.display().to_string(),
    ]);
    path.to_path_buf()
}

/// The `SHA256:…` fingerprint of a public key file.
pub fn fingerprint(public_key: &Path) -> String {
    let line = ssh_keygen(&[
        "-l",
        "-E",
        "sha256",
        "-f",
        &public_key.display().to_string(),
    ]);
    line.split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no fingerprint in {line:?}"))
        .to_string()
}

pub struct Sshd {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    /// The server's public host key file.
    pub host_key: PathBuf,
    /// The authorized deploy key (private half).
    pub deploy_key: PathBuf,
    /// The user tests log in as (the one running them).
    pub user: String,
}

impl Sshd {
    pub fn start() -> Self {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: the SSH transport tests need a real sshd (apt-get install openssh-server)"
        );
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let host = new_key(&d.join("host_ed25519"), "test host");
        let deploy_key = new_key(&d.join("deploy_ed25519"), "tend deploy key");
        std::fs::copy(d.join("deploy_ed25519.pub"), d.join("authorized_keys")).unwrap();
        let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string();
        // sshd's privilege separation directory (a fresh container may lack it).
        let _ = std::fs::create_dir_all("/run/sshd");
        let port = free_port();
        let config = d.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile {}\nAuthorizedKeysFile {}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\nAllowUsers {user}\nLogLevel VERBOSE\n",
                host.display(),
                d.join("sshd.pid").display(),
                d.join("authorized_keys").display(),
            ),
        )
        .unwrap();
        let log = std::fs::File::create(d.join("sshd.log")).unwrap();
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {SSHD}: {e}"));
        let sshd = Sshd {
            child,
            port,
            host_key: d.join("host_ed25519.pub"),
            deploy_key,
            user,
            dir,
        };
        super::eventually(
            &format!("sshd listening on 127.0.0.1:{port}"),
            Duration::from_secs(5),
            || super::holds(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()),
            || sshd.log(),
        );
        sshd
    }

    /// `ssh://user@127.0.0.1:PORT/abs/path`.
    pub fn url(&self, repository: &Path) -> String {
        format!(
            "ssh://{}@127.0.0.1:{}{}",
            self.user,
            self.port,
            repository.display()
        )
    }

    /// What `ssh-keyscan` writes for this server (`hashed`: with `-H`).
    pub fn keyscan(&self, hashed: bool) -> String {
        let mut args = vec![
            "-p".to_string(),
            self.port.to_string(),
            "-t".into(),
            "ed25519".into(),
        ];
        if hashed {
            args.push("-H".into());
        }
        args.push("127.0.0.1".into());
        let out = Command::new("ssh-keyscan")
            .args(&args)
            .output()
            .expect("cannot run ssh-keyscan (apt-get install openssh-client)");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            text.contains("ssh-ed25519"),
            "ssh-keyscan found no key: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
