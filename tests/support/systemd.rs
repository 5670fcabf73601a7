//! A real systemd as PID 1 for a test, booted where it cannot touch the
//! host: a new PID, mount, UTS and IPC namespace whose root is an overlay
//! of `/` with a tmpfs upper layer (everything systemd, dpkg or tend
//! writes lands there and vanishes with it), its own `/tmp`, `/run` and
//! `/dev` (a tmpfs with device nodes of its own: journald's `/dev/log`
//! link must not land on the host's `/dev`, and systemd's chmod of
//! `/dev/console` must not reach a host node bound in), a read-only
//! `/sys`, and `container=` set so systemd behaves as in a container (no
//! udev, no sysctl, no module loading). The root is entered with
//! `pivot_root`, not `chroot`: a chrooted process cannot create the user
//! namespace the unit's `PrivateUsers=yes` needs (`217/USER`).
//!
//! **Never boot systemd on the host's own root or without a private
//! `/tmp`**: at boot `systemd-tmpfiles` empties `/tmp`, and on a shared
//! root that deletes every other process's files. [`BootedSystem::shutdown`]
//! proves the host was left alone: a canary file in the host's `/tmp`
//! survives and no file appeared under the host's `/etc`.
//!
//! The network namespace is the host's: the agent's HTTP server, a `git
//! daemon` and the reference provider the test starts meet on loopback.
//! One booted system at a time (a lock file): two would share the host's
//! cgroup hierarchy and each manage the other's `tend.service`.
//!
//! Boots into `tend-test.target` (sysinit and journald, nothing of
//! `multi-user.target`: no PostgreSQL, sshd or Prometheus of the image
//! listening on the shared loopback), so the package's postinst is what
//! starts tend, as on a freshly installed host.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::repo_root;

/// What the test does before `pivot_root`, as root in the new namespaces
/// (`$1`: where to mount the layer). Everything written under `$R` goes
/// to the overlay's upper layer.
const BOOT: &str = r#"
set -eu
D=$1
mount --make-rprivate /
mount -t tmpfs -o mode=700 tmpfs "$D"
mkdir -p "$D/upper" "$D/work" "$D/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$D/upper,workdir=$D/work" "$D/root"
R="$D/root"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mount -t tmpfs -o mode=755 tmpfs "$R/run"
mount -t tmpfs -o mode=755 tmpfs "$R/dev"
# Device nodes of their own, never the host's bound in: systemd chowns
# and chmods /dev/console (and others) at boot.
mknod -m 666 "$R/dev/null" c 1 3
mknod -m 666 "$R/dev/zero" c 1 5
mknod -m 666 "$R/dev/full" c 1 7
mknod -m 666 "$R/dev/random" c 1 8
mknod -m 666 "$R/dev/urandom" c 1 9
mknod -m 666 "$R/dev/tty" c 5 0
mknod -m 600 "$R/dev/console" c 1 3
mkdir -p "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
ln -s /proc/self/fd "$R/dev/fd"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
mount --rbind /sys "$R/sys"
mount -o remount,bind,ro "$R/sys"
cat > "$R/etc/systemd/system/tend-test.target" <<'UNIT'
[Unit]
Description=A test boot: sysinit and journald only
Wants=sysinit.target
After=sysinit.target
UNIT
# Container images forbid starting services from maintainer scripts
# (policy-rc.d exits 101); a host does not.
rm -f "$R/usr/sbin/policy-rc.d"
# The man-db trigger rebuilds the whole index at every install: seconds.
rm -f "$R/var/lib/man-db/auto-update"
mkdir -p "$R/.host"
cd "$R"
pivot_root . .host
mount -t proc proc /proc
umount -l /.host
rmdir /.host
# What systemd does at boot on a host and leaves to the manager in a
# container: shared propagation, which the credentials' private mounts
# need to reach the service. (The host's mounts are private to this
# namespace: nothing propagates out.)
mount --make-rshared /
export container=tend-test
exec /lib/systemd/systemd --system --unit=tend-test.target
"#;

/// The host's device nodes a booted system could reach.
const DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/console",
    "/dev/ptmx",
];

/// A device node's owner, group and mode (`None`: absent).
type DeviceState = (&'static str, Option<(u32, u32, u32)>);

/// The host's state the test must not change: a canary in its `/tmp`, the
/// files under its `/etc`, its device nodes' owners and modes.
struct HostWitness {
    canary: PathBuf,
    etc: BTreeSet<PathBuf>,
    devices: Vec<DeviceState>,
}

fn devices() -> Vec<DeviceState> {
    use std::os::unix::fs::MetadataExt;
    DEVICES
        .iter()
        .map(|d| {
            let meta = std::fs::metadata(d).ok();
            (*d, meta.map(|m| (m.uid(), m.gid(), m.mode())))
        })
        .collect()
}

impl HostWitness {
    fn take() -> Self {
        let canary =
            std::env::temp_dir().join(format!("tend-systemd-canary-{}", std::process::id()));
        std::fs::write(&canary, "a booted systemd must not delete this").unwrap();
        HostWitness {
            canary,
            etc: files_under(Path::new("/etc")),
            devices: devices(),
        }
    }

    fn check(&self) {
        assert_eq!(
            std::fs::read_to_string(&self.canary).ok().as_deref(),
            Some("a booted systemd must not delete this"),
            "the booted systemd reached the host's /tmp: {} is gone",
            self.canary.display()
        );
        assert_eq!(
            devices(),
            self.devices,
            "the booted system changed the host's device nodes (owner, group, mode)"
        );
        let new: Vec<_> = files_under(Path::new("/etc"))
            .difference(&self.etc)
            .cloned()
            .collect();
        assert!(
            new.is_empty(),
            "the booted systemd wrote to the host's /etc: {new:?}"
        );
    }
}

impl Drop for HostWitness {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.canary);
    }
}

fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path.clone());
            }
            found.insert(path);
        }
    }
    found
}

/// The cgroup directories directly under each of the host's hierarchies.
fn cgroups() -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return found;
    };
    for hierarchy in hierarchies.flatten() {
        if let Ok(children) = std::fs::read_dir(hierarchy.path()) {
            for child in children.flatten() {
                if child.file_type().is_ok_and(|t| t.is_dir()) {
                    found.insert(child.path());
                }
            }
        }
    }
    found
}

/// Removes an (emptied) cgroup tree, deepest first.
fn remove_cgroup(dir: &Path) {
    if let Ok(children) = std::fs::read_dir(dir) {
        for child in children.flatten() {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&child.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// A booted system; killed (its whole PID namespace with it) on drop.
pub struct BootedSystem {
    unshare: Child,
    /// systemd's pid as the host sees it.
    pub pid: u32,
    layer: tempfile::TempDir,
    host: Option<HostWitness>,
    cgroups_before: BTreeSet<PathBuf>,
    _lock: File,
}

impl BootedSystem {
    /// Boots systemd and waits until it is `running`.
    pub fn boot() -> Self {
        super::users::require_root();
        for tool in ["unshare", "nsenter"] {
            assert!(
                Command::new(tool).arg("--version").output().is_ok(),
                "{tool} is missing: apt-get install util-linux"
            );
        }
        assert!(
            Path::new("/lib/systemd/systemd").exists(),
            "/lib/systemd/systemd is missing: apt-get install systemd"
        );
        let lock = File::create(std::env::temp_dir().join("tend-systemd-test.lock")).unwrap();
        lock.lock().unwrap();
        let host = HostWitness::take();
        let cgroups_before = cgroups();
        let layer = tempfile::tempdir().unwrap();
        let unshare = Command::new("unshare")
            .args([
                "--mount", "--pid", "--fork", "--uts", "--ipc", "sh", "-c", BOOT, "boot",
            ])
            .arg(layer.path())
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run unshare");
        let mut system = BootedSystem {
            pid: 0,
            unshare,
            layer,
            host: Some(host),
            cgroups_before,
            _lock: lock,
        };
        system.pid = system.find_systemd();
        system.wait_running();
        system
    }

    /// The forked child of `unshare`, once it runs systemd.
    fn find_systemd(&mut self) -> u32 {
        let parent = self.unshare.id();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.unshare.try_wait() {
                let mut err = String::new();
                let _ =
                    std::io::Read::read_to_string(self.unshare.stderr.as_mut().unwrap(), &mut err);
                panic!("the boot script failed ({status}): {err}");
            }
            let children =
                std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
                    .unwrap_or_default();
            if let Some(pid) = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
                && std::fs::read_link(format!("/proc/{pid}/exe"))
                    .is_ok_and(|exe| exe.ends_with("systemd"))
            {
                return pid;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("systemd did not start within 30 s");
    }

    fn wait_running(&self) {
        let state = std::cell::RefCell::new(String::new());
        super::eventually(
            "systemd running",
            Duration::from_secs(60),
            || {
                let now = self.sh("systemctl is-system-running 2>&1 || true").stdout;
                if now.trim() == "degraded" {
                    let failed = self.sh("systemctl --failed --no-legend --plain").stdout;
                    panic!("the test boot is degraded; failed units:\n{failed}");
                }
                let running = now.trim() == "running";
                *state.borrow_mut() = now;
                super::holds(running)
            },
            || format!("its state: {}", state.borrow()),
        );
    }

    /// A command inside the booted system, as root, with a plain
    /// environment; `input` on its stdin.
    pub fn run_with_input(&self, args: &[&str], input: &[u8]) -> Run {
        let mut child = Command::new("nsenter")
            .args([
                "-t",
                &self.pid.to_string(),
                "-m",
                "-p",
                "-u",
                "-i",
                "-r",
                "-w",
                "--",
            ])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8")
            .env("SYSTEMD_PAGER", "")
            .env("SYSTEMD_COLORS", "0")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run nsenter");
        child.stdin.take().unwrap().write_all(input).unwrap();
        Run::from(child.wait_with_output().unwrap(), args)
    }

    pub fn run(&self, args: &[&str]) -> Run {
        self.run_with_input(args, b"")
    }

    /// A shell command inside the booted system.
    pub fn sh(&self, script: &str) -> Run {
        self.run(&["sh", "-c", script])
    }

    /// A shell command that must succeed.
    pub fn ok(&self, script: &str) -> String {
        let run = self.sh(script);
        assert_eq!(run.code, Some(0), "`{script}` failed:\n{}", run.all());
        run.stdout
    }

    /// Writes `text` to `path` inside the booted system.
    pub fn write(&self, path: &str, text: &str) {
        let run = self.run_with_input(
            &[
                "sh",
                "-c",
                &format!("mkdir -p \"$(dirname {path})\" && cat > {path}"),
            ],
            text.as_bytes(),
        );
        assert_eq!(run.code, Some(0), "cannot write {path}:\n{}", run.all());
    }

    /// Reads a file inside the booted system.
    pub fn read(&self, path: &str) -> String {
        self.ok(&format!("cat {path}"))
    }

    /// Installs a package file (`dpkg -i`), as an operator would.
    pub fn install(&self, deb: &Path) -> Run {
        let bytes = std::fs::read(deb).unwrap();
        self.run_with_input(
            &[
                "sh",
                "-c",
                "cat > /root/tend.deb && dpkg -i /root/tend.deb 2>&1",
            ],
            &bytes,
        )
    }

    /// One property of a unit (`systemctl show -p NAME --value`).
    pub fn property(&self, unit: &str, name: &str) -> String {
        self.ok(&format!("systemctl show {unit} -p {name} --value"))
            .trim()
            .to_string()
    }

    /// The unit's journal, as text.
    pub fn journal(&self, unit: &str) -> String {
        self.ok(&format!("journalctl -u {unit} --no-pager -o cat"))
    }

    /// Waits for `check`, with what the unit logged when it never holds.
    pub fn wait_for(&self, what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
        super::eventually(
            what,
            limit,
            || super::holds(check()),
            || {
                format!(
                    "--- systemctl status tend\n{}\n--- journal\n{}",
                    self.sh("systemctl status tend --no-pager -l").all(),
                    self.sh("journalctl -u tend --no-pager -n 80").all()
                )
            },
        );
    }

    /// Stops the system and checks the host was left alone.
    pub fn shutdown(mut self) {
        self.kill();
        let host = self.host.take().unwrap();
        host.check();
    }

    fn kill(&mut self) {
        if self.pid != 0 {
            // PID 1 of the namespace: the kernel kills every process in it.
            // SAFETY: kill has no memory preconditions.
            unsafe {
                libc::kill(self.pid as i32, libc::SIGKILL);
            }
            self.pid = 0;
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        // What the booted systemd made of the host's cgroup hierarchies;
        // empty once its namespace is gone.
        for _ in 0..50 {
            let left: Vec<_> = cgroups()
                .difference(&self.cgroups_before)
                .cloned()
                .collect();
            if left.is_empty() {
                break;
            }
            for dir in &left {
                remove_cgroup(dir);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = &self.layer;
    }
}

impl Drop for BootedSystem {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a command inside printed, and how it ended.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub command: String,
}

impl Run {
    fn from(out: Output, args: &[&str]) -> Self {
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            command: args.join(" "),
        }
    }

    pub fn all(&self) -> String {
        format!(
            "$ {} (exit {:?})\n{}{}",
            self.command, self.code, self.stdout, self.stderr
        )
    }
}

/// The package built from the test build's binary, revision `revision`
/// (a second revision is an upgrade of the first), under `target/`.
/// Built once: reused while it is newer than the binary and the files
/// the package is made of.
pub fn package(revision: u32) -> PathBuf {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_tend"));
    let out = repo_root()
        .join("target")
        .join("systemd-test")
        .join(format!("revision-{revision}"));
    std::fs::create_dir_all(&out).unwrap();
    let lock = File::create(out.join(".lock")).unwrap();
    lock.lock().unwrap();
    let built = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"));
    // What the package is made of: rebuilt when any of it is newer.
    let inputs = [
        binary.clone(),
        repo_root().join("systemd/tend.service"),
        repo_root().join("packaging/build-deb"),
        repo_root().join("packaging/tend.toml.example"),
        repo_root().join("packaging/debian/postrm"),
        repo_root().join("Cargo.toml"),
    ];
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let newest_input = inputs.iter().filter_map(|p| modified(p)).max();
    let fresh = |deb: &Path| modified(deb) > newest_input;
    if let Some(deb) = built.filter(|d| fresh(d)) {
        return deb;
    }
    for entry in std::fs::read_dir(&out).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "deb") {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    let mut build = Command::new(repo_root().join("packaging/build-deb"));
    super::without_package_env(&mut build)
        .args(["--profile", "dev", "--no-build"])
        .env(
            "CARGO_DEB_ARGS",
            format!("--fast --deb-revision {revision} -o {}", out.display()),
        )
        .current_dir(repo_root());
    let done = build.output().expect("cannot run packaging/build-deb");
    assert!(
        done.status.success(),
        "packaging/build-deb failed (cargo-deb missing? cargo install cargo-deb --version 3.8.0 --locked; .ci/run installs it):\n{}",
        String::from_utf8_lossy(&done.stderr)
    );
    std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("packaging/build-deb wrote no .deb")
}
