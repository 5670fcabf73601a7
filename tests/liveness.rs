//! The agent never stalls silently: what used to wedge `tend run` (a
//! secret path that blocks, a transient start failure read as a broken
//! configuration) ends in a named error within a bounded time, and the
//! exit code tells systemd the truth.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::config::TendConfig;
use support::daemon::Daemon;
use support::git::{TestRepo, free_port, manifest};

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

struct Env {
    repo: TestRepo,
    dir: tempfile::TempDir,
    port: u16,
}

impl Env {
    fn new() -> Self {
        let repo = TestRepo::new();
        repo.write("orders.yaml", &manifest("orders", 10));
        repo.commit("orders");
        Env {
            repo,
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
        }
    }

    fn config(&self) -> std::path::PathBuf {
        TendConfig::new(self.dir.path(), &self.repo.url())
            .server("listen", &format!("\"127.0.0.1:{}\"", self.port))
            .server("webhook_secret_file", "\"webhook-secret\"")
            .write()
    }
}

/// A webhook secret that is a FIFO (reading it would wait for a writer
/// forever): the start refuses it at once, naming the key and what the
/// path is, with the configuration's exit code.
#[test]
fn a_fifo_secret_is_refused_at_start_without_blocking() {
    let env = Env::new();
    mkfifo(&env.dir.path().join("webhook-secret"));
    let config = env.config();
    let started = Instant::now();
    let mut daemon = Daemon::start(&config, env.port, &[]);
    let code = daemon.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(78), "{}", daemon.log());
    assert!(started.elapsed() < Duration::from_secs(10));
    let log = daemon.log();
    assert!(
        log.contains("webhook_secret_file") && log.contains("FIFO (named pipe)"),
        "{log}"
    );
}

/// At a reload, the same FIFO is refused and the agent runs on with its
/// configuration: `/healthz` and `/v1/status` keep answering; two
/// SIGTERMs then stop it at once.
#[test]
fn a_fifo_secret_at_reload_is_refused_and_the_agent_keeps_answering() {
    let env = Env::new();
    let secret = env.dir.path().join("webhook-secret");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let config = env.config();
    let mut daemon = Daemon::start(&config, env.port, &[]);
    daemon.wait_ready();
    std::fs::remove_file(&secret).unwrap();
    mkfifo(&secret);
    daemon.signal("HUP");
    daemon.wait_for("the reload refused", Duration::from_secs(10), || {
        daemon.log().contains("FIFO (named pipe)")
    });
    for path in ["/healthz", "/v1/status"] {
        let answer = daemon.get(path).expect("an answer");
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    }
    daemon.signal("TERM");
    daemon.signal("TERM");
    let code = daemon.wait_exit(Duration::from_secs(10));
    assert!(
        matches!(code, Some(0) | Some(130)),
        "{code:?}\n{}",
        daemon.log()
    );
}

/// A start that fails for a reason that may pass (here the Git cache
/// cannot be created) exits 1, so `Restart=on-failure` tries again; a
/// configuration that cannot work exits 78 (systemd then stops trying).
#[test]
fn a_transient_start_failure_exits_1_and_a_bad_configuration_78() {
    let env = Env::new();
    std::fs::write(env.dir.path().join("webhook-secret"), "s3cret\n").unwrap();
    let config = env.config();
    // The state exists; its Git cache's place is taken by a file.
    support::TendCommand::new(&["--config", &config.display().to_string(), "apply"]).expect_code(0);
    let cache = env.dir.path().join("state/source");
    std::fs::remove_dir_all(&cache).unwrap();
    std::fs::write(&cache, "not a directory").unwrap();
    let mut daemon = Daemon::start(&config, env.port, &[]);
    assert_eq!(
        daemon.wait_exit(Duration::from_secs(20)),
        Some(1),
        "{}",
        daemon.log()
    );

    std::fs::write(
        &config,
        std::fs::read_to_string(&config).unwrap() + "\n[bogus]\nkey = 1\n",
    )
    .unwrap();
    let mut daemon = Daemon::start(&config, env.port, &[]);
    assert_eq!(
        daemon.wait_exit(Duration::from_secs(20)),
        Some(78),
        "{}",
        daemon.log()
    );
}
