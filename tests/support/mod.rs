//! Shared test support: running the real `tend` binary with a clean
//! environment, and paths into the repository.
#![allow(dead_code)]

pub mod bench;
pub mod browser;
pub mod config;
pub mod daemon;
pub mod dice;
pub mod docs;
pub mod fixture;
pub mod git;
pub mod hostile_http;
pub mod minimal_dbaas;
pub mod pgproxy;
pub mod postgres;
pub mod receiver;
pub mod reference;
pub mod sshd;
pub mod systemd;
pub mod users;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(25);

/// Polls `check` until it gives `Some`, and returns what it gave: the
/// suite's one poll loop (a test waits for an outcome, never for a fixed
/// time). After `limit` the test fails, naming `what`, with what
/// `on_timeout` reports (a log, the state seen last); `on_timeout` may
/// also stop what the test started. `check` may itself panic on a state
/// that can never turn good.
pub fn eventually<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Option<T>,
    on_timeout: impl FnOnce() -> String,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(found) = check() {
            return found;
        }
        if started.elapsed() >= limit {
            panic!("{what}: not within {limit:?}\n{}", on_timeout());
        }
        std::thread::sleep(POLL);
    }
}

/// `true` as `Some(())`: a condition for [`eventually`].
pub fn holds(condition: bool) -> Option<()> {
    condition.then_some(())
}

/// The metric families the agent registers (`r.register("name", …)` in
/// src/telemetry/metrics.rs), with the registry's `tend_` prefix: read from
/// the source, since a family with no samples yet is not in the encoded
/// text.
pub fn metric_families() -> Vec<String> {
    let registered = std::fs::read_to_string(repo_root().join("src/telemetry/metrics.rs")).unwrap();
    registered
        .split("register(")
        .skip(1)
        .filter_map(|rest| rest.trim_start().strip_prefix('"')?.split('"').next())
        .map(|name| format!("tend_{name}"))
        .collect()
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `command` (cargo, or a script that runs cargo on this repository)
/// without the package variables the test harness gives a test
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, …). Build scripts rerun when one
/// of those differs from the outer build's: ring's did, so a nested cargo
/// rebuilt and relinked `target/debug/tend` while other tests ran it.
pub fn without_package_env(command: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_CFG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&key.as_ref())
        {
            command.env_remove(key.as_ref());
        }
    }
    command
}

/// A `tend` invocation whose environment cannot leak the developer's
/// config, run in a temporary directory of its own unless told otherwise
/// (a relative path in a test then cannot touch the repository).
pub struct TendCommand {
    command: Command,
    display: String,
    _cwd: Option<tempfile::TempDir>,
    /// How long it may run before it is killed and the test fails.
    limit: Option<std::time::Duration>,
}

impl TendCommand {
    pub fn new(args: &[&str]) -> Self {
        let cwd = tempfile::tempdir().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_tend"));
        command
            .args(args)
            .env_remove("TEND_CONFIG")
            .env_remove("TEND_LOG")
            .env_remove("CREDENTIALS_DIRECTORY")
            .env("NO_COLOR", "1")
            .current_dir(cwd.path());
        TendCommand {
            command,
            display: format!("tend {}", args.join(" ")),
            _cwd: Some(cwd),
            limit: None,
        }
    }

    /// `tend --config CONFIG ARGS`.
    pub fn configured(config: impl AsRef<Path>, args: &[&str]) -> Self {
        let config = config.as_ref().display().to_string();
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        TendCommand::new(&all)
    }

    /// Kills it and fails the test if it runs longer than `limit` (a
    /// command that hangs on hostile input must fail, not stall the run).
    pub fn within(mut self, limit: std::time::Duration) -> Self {
        self.limit = Some(limit);
        self
    }

    fn output(&mut self) -> std::process::Output {
        let Some(limit) = self.limit else {
            return self
                .command
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.display));
        };
        use std::io::Read;
        use std::process::Stdio;
        let mut child = self
            .command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.display));
        fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                bytes
            })
        }
        let stdout = drain(child.stdout.take().unwrap());
        let stderr = drain(child.stderr.take().unwrap());
        let child = std::cell::RefCell::new(child);
        let status = eventually(
            &format!("`{}` finishing", self.display),
            limit,
            || child.borrow_mut().try_wait().unwrap(),
            || {
                let _ = child.borrow_mut().kill();
                let _ = child.borrow_mut().wait();
                "killed".into()
            },
        );
        std::process::Output {
            status,
            stdout: stdout.join().unwrap(),
            stderr: stderr.join().unwrap(),
        }
    }

    pub fn current_dir(mut self, dir: &Path) -> Self {
        self.command.current_dir(dir);
        self._cwd = None;
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.command.env(key, value);
        self
    }

    /// Runs as `user` (its groups, gid, uid and umask).
    pub fn run_as(mut self, user: users::OsUser) -> Self {
        user.apply(&mut self.command);
        self.display = format!("{} (as uid {})", self.display, user.uid);
        self
    }

    /// Runs the command; on an unexpected exit code, panics with everything
    /// needed to reproduce it.
    /// Runs it, whatever it exits with.
    pub fn run(mut self) -> RunOutput {
        let output = self.output();
        RunOutput {
            command: self.display.clone(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            output,
        }
    }

    pub fn expect_code(mut self, code: i32) -> RunOutput {
        let output = self.output();
        let run = RunOutput {
            command: self.display.clone(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            output,
        };
        assert_eq!(
            run.output.status.code(),
            Some(code),
            "`{}` exited with {:?}, expected {code}\n--- stdout\n{}\n--- stderr\n{}",
            self.display,
            run.output.status,
            run.stdout,
            run.stderr
        );
        run
    }
}

/// Spawns `tend --config CONFIG apply` that pauses at a test pause point
/// (the failpoint `POINT=return(pause)`), and returns it once it has
/// reached it.
pub fn paused_apply(config: &Path, point: &str, marker: &Path) -> std::process::Child {
    use std::process::Stdio;
    let child = Command::new(env!("CARGO_BIN_EXE_tend"))
        .args(["--config", &config.display().to_string(), "apply"])
        .current_dir(config.parent().unwrap())
        .env_remove("TEND_CONFIG")
        .env("TEND_LOG", "warn")
        .env("FAILPOINTS", format!("{point}=return(pause)"))
        .env("TEND_TEST_PAUSE_FILE", marker)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(
        &format!("tend apply reaching {point}"),
        Duration::from_secs(60),
        || holds(marker.exists()),
        String::new,
    );
    child
}

pub struct RunOutput {
    pub command: String,
    pub output: Output,
    pub stdout: String,
    pub stderr: String,
}

impl RunOutput {
    /// stdout as JSON (a report), or a panic naming the command.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "`{}` did not print JSON ({e})\n--- stdout\n{}\n--- stderr\n{}",
                self.command, self.stdout, self.stderr
            )
        })
    }
}

/// `tend --config CONFIG ARGS`, which must exit `code` (default logging).
pub fn tend(config: impl AsRef<Path>, args: &[&str], code: i32) -> RunOutput {
    TendCommand::configured(config, args).expect_code(code)
}

/// What `tend apply --format json` ran: `(operations, done)` from its
/// report's `applied` (`None` when the report has none: a run without
/// `--format json` fails the test's assertion instead of passing it).
pub fn applied(report: &serde_json::Value) -> Option<(usize, usize)> {
    let applied = report.get("applied")?;
    let count = |key: &str| applied[key].as_u64().and_then(|n| usize::try_from(n).ok());
    Some((count("operations")?, count("done")?))
}

/// `tend provider check URL` (with `--token-file` holding `token`).
pub fn provider_check(url: &str, token: Option<&str>) -> RunOutput {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["provider".to_string(), "check".into(), url.to_string()];
    if let Some(token) = token {
        let file = dir.path().join("token");
        std::fs::write(&file, token).unwrap();
        args.extend(["--token-file".into(), file.display().to_string()]);
    }
    let output = Command::new(env!("CARGO_BIN_EXE_tend"))
        .args(&args)
        .output()
        .unwrap();
    RunOutput {
        command: "tend provider check".into(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        output,
    }
}

/// The rules a `tend provider check` run printed with `verdict` (`PASS`,
/// `FAIL`, `SKIP`).
pub fn check_rules(run: &RunOutput, verdict: &str) -> Vec<String> {
    run.stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{verdict} ")))
        .map(|l| l.split(':').next().unwrap_or(l).to_string())
        .collect()
}
