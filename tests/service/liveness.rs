//! The agent never stalls silently: what used to wedge `tend run` (a
//! secret path that blocks, a transient start failure read as a broken
//! configuration) ends in a named error within a bounded time, and the
//! exit code tells systemd the truth.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::config::TendConfig;
use support::daemon::Daemon;
use support::fixture::Fixture;
use support::git::{TestRepo, free_port, manifest};

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// A [`Fixture`] with `tend run`'s port.
struct Env {
    fixture: Fixture,
    port: u16,
}

impl std::ops::Deref for Env {
    type Target = Fixture;
    fn deref(&self) -> &Fixture {
        &self.fixture
    }
}

impl Env {
    fn new() -> Self {
        Env {
            fixture: Fixture::new(&[("orders.yaml", manifest("orders", 10))]),
            port: free_port(),
        }
    }

    /// The configuration with a listener and a webhook secret, written.
    fn config(&self) -> std::path::PathBuf {
        self.fixture
            .config
            .clone()
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

mod listing {
    use super::*;
    use support::TendCommand;
    use support::hostile_http::{HostileHttp, Reply};

    /// A database as the contract lists it.
    fn db(name: &str) -> String {
        format!(
            r#"{{"name":"{name}","id":"id-{name}","status":"ready","fields":{{"size":"small"}},"labels":{{}},"etag":"\"1\"","observedAt":"2026-01-01T00:00:00Z"}}"#
        )
    }

    fn page(items: &[&str], next: Option<&str>) -> Reply {
        let items: Vec<String> = items.iter().map(|n| db(n)).collect();
        let next = match next {
            Some(t) => format!(r#","nextPageToken":"{t}""#),
            None => String::new(),
        };
        Reply::Json(format!(r#"{{"items":[{}]{next}}}"#, items.join(",")))
    }

    /// `tend plan` of `orders` against `server`; its output and how long
    /// it took.
    fn plan(server: &HostileHttp, code: i32) -> (support::RunOutput, Duration) {
        plan_with(server, &["orders"], 0, code)
    }

    /// `tend plan` of a declaration for each of `names` against `server`,
    /// with `retries` retries of a failed listing.
    fn plan_with(
        server: &HostileHttp,
        names: &[&str],
        retries: usize,
        code: i32,
    ) -> (support::RunOutput, Duration) {
        let repo = TestRepo::new();
        for name in names {
            repo.write(
                &format!("{name}.yaml"),
                &format!(
                    "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  size: small\n"
                ),
            );
        }
        repo.commit("declarations");
        let dir = tempfile::tempdir().unwrap();
        let config = TendConfig::new(dir.path(), &repo.url())
            .without_section("providers.sandbox")
            .section("providers.dbaas", "kind", "\"http\"")
            .section(
                "providers.dbaas",
                "endpoint",
                &format!("\"{}\"", server.url()),
            )
            .section("providers.dbaas", "timeout", "\"5s\"")
            .reconcile("max_retries", &retries.to_string())
            .write();
        let started = Instant::now();
        let run = TendCommand::new(&["--config", &config.display().to_string(), "plan"])
            .expect_code(code);
        (run, started.elapsed())
    }

    /// A fresh token on every page, the same database on each: the
    /// second page lists it twice, and the listing ends there.
    #[test]
    fn fresh_tokens_over_the_same_items_end_in_a_named_error() {
        let server = HostileHttp::start(|_, n| page(&["orders"], Some(&format!("t{n}"))));
        let (run, took) = plan(&server, 1);
        assert!(
            run.stdout.contains("listed `orders` twice"),
            "{}",
            run.stdout
        );
        assert!(server.requests() <= 3, "{} requests", server.requests());
        assert!(took < Duration::from_secs(30), "{took:?}");
    }

    /// A listing that fails after its first page was read: nothing is
    /// decided from that page, and a declaration no page has listed yet is
    /// not taken for missing. Both resources are unobserved, neither is
    /// created nor called taken.
    #[test]
    fn a_listing_that_fails_midway_decides_nothing_from_its_first_page() {
        let server = HostileHttp::start(|path, _| {
            if path.contains("pageToken=") {
                Reply::Json("{\"items\": 7}".to_string())
            } else {
                page(&["orders"], Some("p2"))
            }
        });
        let (run, _) = plan_with(&server, &["billing", "orders"], 0, 1);
        assert!(run.stdout.contains("breaks the contract"), "{}", run.stdout);
        for line in run
            .stdout
            .lines()
            .filter(|l| l.contains("billing") || l.contains("orders"))
        {
            assert!(
                !line.contains("create") && !line.contains("name taken"),
                "decided from a failed listing: {line}\n{}",
                run.stdout
            );
        }
        assert!(!run.stdout.contains("name taken"), "{}", run.stdout);
        assert!(!run.stdout.contains("would create"), "{}", run.stdout);
    }

    /// A listing retried after its second page failed: what the first
    /// attempt's first page showed (`orders`) is void; the second attempt
    /// lists nothing, so `orders` is to be created, as a listing that
    /// never failed would have it.
    #[test]
    fn a_retried_listing_decides_from_its_last_attempt_only() {
        let server = HostileHttp::start(|path, n| match n {
            0 => page(&["orders"], Some("p2")),
            1 => Reply::Status(503),
            _ if path.contains("pageToken=") => page(&[], None),
            _ => page(&[], Some("q2")),
        });
        let (run, _) = plan_with(&server, &["orders"], 1, 0);
        assert!(server.requests() >= 4, "{} requests", server.requests());
        assert!(!run.stdout.contains("name taken"), "{}", run.stdout);
        let orders = run
            .stdout
            .lines()
            .find(|l| l.contains("orders"))
            .unwrap_or_else(|| panic!("no line for orders:\n{}", run.stdout));
        assert!(orders.contains("create"), "{}", run.stdout);
    }

    /// Tokens alternating A, B, A: the token seen before ends it.
    #[test]
    fn alternating_tokens_end_in_a_named_error() {
        let server = HostileHttp::start(|path, _| {
            if path.contains("pageToken=A") {
                page(&[], Some("B"))
            } else if path.contains("pageToken=B") {
                page(&[], Some("A"))
            } else {
                page(&["orders"], Some("A"))
            }
        });
        let (run, _) = plan(&server, 1);
        assert!(
            run.stdout.contains("returned page token \"A\" again"),
            "{}",
            run.stdout
        );
        assert!(server.requests() <= 4, "{} requests", server.requests());
    }

    /// Empty pages with fresh tokens forever: a hundred in a row end it.
    #[test]
    fn endless_empty_pages_end_in_a_named_error() {
        let server = HostileHttp::start(|_, n| page(&[], Some(&format!("t{n}"))));
        let (run, _) = plan(&server, 1);
        assert!(
            run.stdout.contains("empty pages in a row"),
            "{}",
            run.stdout
        );
        assert!(server.requests() <= 102, "{} requests", server.requests());
    }

    /// `""` on the last page ends the listing as `null` does.
    #[test]
    fn an_empty_token_on_the_last_page_ends_the_listing() {
        let server = HostileHttp::start(|path, _| {
            if path.contains("pageToken=") {
                page(&["orders"], Some(""))
            } else {
                page(&[], Some("next"))
            }
        });
        let (run, _) = plan(&server, 0);
        // Observed (found without a marker), and no third request.
        assert!(run.stdout.contains("name taken"), "{}", run.stdout);
        assert_eq!(server.requests(), 2);
    }

    /// A body that never ends: the read stops at the cap with an error
    /// naming it, and the process never holds more than the cap and its
    /// own needs (peak RSS measured by GNU time).
    #[test]
    fn an_endless_body_ends_at_the_cap_with_bounded_memory() {
        let server = HostileHttp::start(|_, _| Reply::Endless);
        let repo = TestRepo::new();
        repo.write(
            "orders.yaml",
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\nspec:\n  size: small\n",
        );
        repo.commit("orders");
        let dir = tempfile::tempdir().unwrap();
        let config = TendConfig::new(dir.path(), &repo.url())
            .without_section("providers.sandbox")
            .section("providers.dbaas", "kind", "\"http\"")
            .section(
                "providers.dbaas",
                "endpoint",
                &format!("\"{}\"", server.url()),
            )
            .section("providers.dbaas", "timeout", "\"60s\"")
            .reconcile("max_retries", "0")
            .write();
        let time = std::path::Path::new("/usr/bin/time");
        assert!(
            time.exists(),
            "GNU time is missing: apt-get install time (.ci/run installs it)"
        );
        let output = std::process::Command::new(time)
            .args(["-f", "peak-rss-kb=%M", env!("CARGO_BIN_EXE_tend")])
            .args(["--config", &config.display().to_string(), "plan"])
            .env("TEND_LOG", "warn")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
        assert!(stdout.contains("larger than 32 MiB"), "{stdout}\n{stderr}");
        let peak: u64 = stderr
            .lines()
            .find_map(|l| l.strip_prefix("peak-rss-kb="))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        eprintln!("peak RSS: {} MiB", peak / 1024);
        assert!(peak < 256 * 1024, "peak RSS {} MiB", peak / 1024);
    }
}

mod git_remote {
    use super::*;
    use support::TendCommand;

    /// A server that accepts every connection and never answers (nor
    /// closes) it.
    fn silent_server() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                held.push(stream);
            }
        });
        port
    }

    fn config(dir: &Path, url: &str, port: Option<u16>) -> std::path::PathBuf {
        let config = TendConfig::new(dir, url)
            .source("timeout", "\"3s\"")
            .status("branch", "\"\"");
        match port {
            Some(port) => config
                .server("listen", &format!("\"127.0.0.1:{port}\""))
                .write(),
            None => config.write(),
        }
    }

    /// `tend plan` against a remote that never answers, over git:// and
    /// smart HTTP: a named error within the timeout (and its one read
    /// bound), not a hang.
    #[test]
    fn a_silent_remote_ends_plan_with_a_named_error_in_bounded_time() {
        let port = silent_server();
        for url in [
            format!("git://127.0.0.1:{port}/repo.git"),
            format!("http://127.0.0.1:{port}/repo.git"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let config = config(dir.path(), &url, None);
            let started = Instant::now();
            let run = TendCommand::new(&["--config", &config.display().to_string(), "plan"])
                .expect_code(1);
            let took = started.elapsed();
            let said = format!("{}{}", run.stdout, run.stderr);
            assert!(said.contains("[source] timeout"), "{url}: {said}");
            assert!(took < Duration::from_secs(20), "{url}: {took:?}");
        }
    }

    /// The running agent: the fetch ends, the source error shows in
    /// `/v1/status` and the metrics count it; the agent keeps answering.
    #[test]
    fn a_silent_remote_is_a_source_error_the_running_agent_reports() {
        let port = silent_server();
        let dir = tempfile::tempdir().unwrap();
        let http = free_port();
        let config = config(
            dir.path(),
            &format!("git://127.0.0.1:{port}/repo.git"),
            Some(http),
        );
        let daemon = Daemon::start(&config, http, &[]);
        // /readyz says what holds the start up.
        daemon.wait_for("the source error", Duration::from_secs(30), || {
            daemon.get("/readyz").is_some_and(|r| {
                r.status == 503
                    && r.body.contains("the source cannot be read")
                    && r.body.contains("[source] timeout")
            })
        });
        let metrics = daemon.get("/metrics").unwrap().body;
        let errors: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("tend_fetch_errors_total "))
            .unwrap_or_else(|| panic!("{metrics}"))
            .trim()
            .parse()
            .unwrap();
        assert!(errors >= 1.0, "{metrics}");
        assert_eq!(daemon.get("/healthz").unwrap().status, 200);
    }
}

/// A proxy in front of a Git server (smart HTTP or git://) that passes
/// fetches through and holds every push (`git-receive-pack`, named in the
/// first bytes of either protocol's request) forever.
fn push_stalling_proxy(upstream: u16) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let mut first = [0u8; 4096];
            let Ok(n) = client.read(&mut first) else {
                continue;
            };
            let head = first[..n].to_vec();
            if String::from_utf8_lossy(&head).contains("git-receive-pack") {
                held.push(client);
                continue;
            }
            let Ok(mut server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let _ = server.write_all(&head);
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut s2);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut server, &mut client);
            });
        }
    });
    port
}

/// The status branch pushed to a remote that accepts the push and never
/// answers, over smart HTTP and git://: the push ends within `[source]
/// timeout` with a named error in the report; the apply itself finishes.
#[test]
fn a_push_to_a_stalling_remote_ends_in_a_named_error() {
    use support::git::{GitDaemon, HttpGitServer, git};
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10));
    repo.commit("orders");
    let served = tempfile::tempdir().unwrap();
    let bare = repo.bare_clone(served.path());
    git(&bare, &["config", "http.receivepack", "true"]);
    let http = HttpGitServer::start(served.path(), None);
    let daemon = GitDaemon::start_writable(served.path());
    for direct in [http.url("repo.git"), daemon.url("repo.git")] {
        push_through_a_stalling_proxy(&direct);
    }
}

fn push_through_a_stalling_proxy(direct: &str) {
    let upstream: u16 = direct
        .split(':')
        .nth(2)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .parse()
        .unwrap();
    let proxy = push_stalling_proxy(upstream);
    let url = direct.replace(&format!(":{upstream}/"), &format!(":{proxy}/"));
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &url)
        .source("timeout", "\"3s\"")
        .status("branch", "\"tend-status\"")
        .write();
    let started = Instant::now();
    let run =
        support::TendCommand::new(&["--config", &config.display().to_string(), "apply"]).run();
    // It ends (a stalled push used to hang for good); how soon is the
    // benchmarks' business, and a loaded machine once took 30.5 s here.
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
    let latest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("state/reports/latest.json")).unwrap(),
    )
    .unwrap();
    let error = latest["statusBranch"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("cannot push") && error.contains("[source] timeout"),
        "{url}: {latest:#}\n{}",
        run.stderr
    );
}

/// 1,100 idle connections to the agent's port (more than a service's
/// default 1,024 files): `/healthz` still answers within 2 s, a new
/// commit is still applied, and nothing runs out of files.
#[test]
fn a_crowd_of_idle_connections_does_not_silence_the_agent() {
    let env = Env::new();
    std::fs::write(env.dir.path().join("webhook-secret"), "s3cret\n").unwrap();
    let config = TendConfig::new(env.dir.path(), &env.repo.url())
        .server("listen", &format!("\"127.0.0.1:{}\"", env.port))
        .source("interval", "\"1s\"")
        .status("branch", "\"\"")
        .write();
    let daemon = Daemon::start_with_file_limit(&config, env.port, 1024);
    daemon.wait_ready();
    // This test's own files: its 1,100 sockets.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers to an rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    let idle: Vec<std::net::TcpStream> = (0..1100)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", env.port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    let health = daemon.get("/healthz").expect("/healthz answers");
    assert_eq!(health.status, 200);
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "/healthz took {:?}",
        asked.elapsed()
    );
    env.repo.write("orders.yaml", &manifest("orders", 42));
    let head = env.repo.commit("orders: 42");
    daemon.wait_for("the new commit applied", Duration::from_secs(30), || {
        let status = daemon.status();
        status["source"]["commit"] == head.as_str() && status["resources"][0]["state"] == "InSync"
    });
    let log = daemon.log();
    assert!(!log.contains("too many open files"), "{log}");
    assert!(!log.contains("Too many open files"), "{log}");
    drop(idle);
}

mod backoff {
    use super::*;
    use support::reference::ReferenceServer;

    fn dbaas(name: &str) -> String {
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  engine: postgres\n  version: \"16\"\n  size: db-small\n  storageGb: 100\n  region: eu-west-1\n"
        )
    }

    /// A create the provider answers 502 twice, then takes: retried by
    /// its own backoff within seconds, while `observe` and `resync` are an
    /// hour (nothing else would wake it), under one operation id.
    #[test]
    fn a_failing_operation_is_retried_by_backoff_within_seconds() {
        let server = ReferenceServer::start(&[]);
        server.faults(serde_json::json!({"errorMutations": 2}));
        let repo = TestRepo::new();
        repo.write("analytics.yaml", &dbaas("analytics"));
        repo.commit("analytics");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = TendConfig::new(dir.path(), &repo.url())
            .without_section("providers.sandbox")
            .section("providers.dbaas", "kind", "\"http\"")
            .section(
                "providers.dbaas",
                "endpoint",
                &format!("\"{}\"", server.url()),
            )
            .section("providers.dbaas", "timeout", "\"5s\"")
            .reconcile("max_retries", "0")
            .reconcile("observe", "\"1h\"")
            .reconcile("resync", "\"1h\"")
            .server("listen", &format!("\"127.0.0.1:{port}\""))
            .source("interval", "\"1h\"")
            .status("branch", "\"\"")
            .write();
        let started = Instant::now();
        let daemon = Daemon::start(&config, port, &[]);
        daemon.wait_for("the database created", Duration::from_secs(30), || {
            server.database("analytics").is_some()
        });
        let took = started.elapsed();
        eprintln!("created {took:?} after the start, through two 502s");
        assert!(took < Duration::from_secs(20), "{took:?}");
        assert_eq!(server.count("creates"), 1, "one database");
        let log = daemon.log();
        assert!(log.contains("sent again with the same id at"), "{log}");
        // Each 502 is a provider error the metrics count.
        let metrics = daemon.get("/metrics").unwrap().body;
        assert!(
            metrics.contains("tend_provider_errors_total{provider=\"dbaas\",kind=\"operation\"} 2"),
            "{metrics}"
        );
        daemon.wait_for("InSync", Duration::from_secs(20), || {
            daemon
                .get("/v1/status")
                .is_some_and(|r| r.body.contains("\"InSync\""))
        });
    }

    /// A provider whose first two observations fail: looked at again after
    /// a backoff of seconds (the report says when), not after `observe`.
    #[test]
    fn a_provider_that_cannot_be_observed_is_looked_at_again_within_seconds() {
        let repo = TestRepo::new();
        repo.write("orders.yaml", &manifest("orders", 10));
        repo.commit("orders");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = TendConfig::new(dir.path(), &repo.url())
            .section("providers.sandbox.faults", "fail_calls", "2")
            .reconcile("max_retries", "0")
            .reconcile("observe", "\"1h\"")
            .reconcile("resync", "\"1h\"")
            .server("listen", &format!("\"127.0.0.1:{port}\""))
            .source("interval", "\"1h\"")
            .status("branch", "\"\"")
            .write();
        let started = Instant::now();
        let daemon = Daemon::start(&config, port, &[]);
        daemon.wait_for("orders created", Duration::from_secs(30), || {
            daemon
                .get("/v1/status")
                .is_some_and(|r| r.body.contains("\"InSync\""))
        });
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        let log = daemon.log();
        assert!(log.contains("looking again in 1s"), "{log}");
        assert!(log.contains("looking again in 2s"), "{log}");
    }
}

/// A reload that waits for a long operation to stop (here a DBaaS create
/// that takes a minute), then two SIGTERMs: the second exits at once, as
/// the docs promise, though the coordinator is busy with the reload.
#[test]
fn a_second_sigterm_exits_at_once_even_during_a_reload() {
    use support::reference::ReferenceServer;
    let server = ReferenceServer::start(&[]);
    server.faults(serde_json::json!({"operationDelayMs": 60000}));
    let repo = TestRepo::new();
    repo.write(
        "analytics.yaml",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: analytics\nspec:\n  engine: postgres\n  version: \"16\"\n  size: db-small\n  storageGb: 100\n  region: eu-west-1\n",
    );
    repo.commit("analytics");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = TendConfig::new(dir.path(), &repo.url())
        .without_section("providers.sandbox")
        .section("providers.dbaas", "kind", "\"http\"")
        .section(
            "providers.dbaas",
            "endpoint",
            &format!("\"{}\"", server.url()),
        )
        .section("providers.dbaas", "operation_timeout", "\"5m\"")
        .reconcile("shutdown_timeout", "\"2m\"")
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .status("branch", "\"\"")
        .write();
    let mut daemon = Daemon::start(&config, port, &[]);
    daemon.wait_for("the create in flight", Duration::from_secs(30), || {
        server.count("creates") >= 1
    });
    daemon.signal("HUP");
    std::thread::sleep(Duration::from_millis(500));
    daemon.signal("TERM");
    std::thread::sleep(Duration::from_millis(200));
    daemon.signal("TERM");
    let code = daemon.wait_exit(Duration::from_secs(5));
    assert_eq!(code, Some(130), "{}", daemon.log());
    assert!(daemon.log().contains("second signal"), "{}", daemon.log());
}

/// A status writer that panics is started again (after a second), and
/// the reports are written as before: the agent never runs on without it.
#[test]
fn a_panicking_status_writer_is_started_again() {
    let env = Env::new();
    std::fs::write(env.dir.path().join("webhook-secret"), "s3cret\n").unwrap();
    let config = TendConfig::new(env.dir.path(), &env.repo.url())
        .server("listen", &format!("\"127.0.0.1:{}\"", env.port))
        .source("interval", "\"1s\"")
        .status("branch", "\"\"")
        .write();
    let daemon = Daemon::start(
        &config,
        env.port,
        &[("FAILPOINTS", "status-writer-panic=return")],
    );
    daemon.wait_for("the restart", Duration::from_secs(20), || {
        daemon
            .log()
            .contains("the status writer ended (it panicked: injected status writer panic")
    });
    let latest = env.dir.path().join("state/reports/latest.json");
    daemon.wait_for("a report written", Duration::from_secs(20), || {
        latest.exists()
    });
    env.repo.write("orders.yaml", &manifest("orders", 42));
    let head = env.repo.commit("orders: 42");
    daemon.wait_for("the new commit reported", Duration::from_secs(30), || {
        std::fs::read_to_string(&latest).is_ok_and(|t| t.contains(&head))
    });
}

/// An operation in flight past its deadline (every attempt's timeouts and
/// the confirmation: here 1 s + 1 s + 1 s) is hung, not slow: the watchdog
/// stops being fed and the log says why, while HTTP still answers. (A
/// slow one inside its deadline keeps it fed: tests/providers/http_provider.rs.)
#[test]
fn an_operation_hung_past_its_deadline_stops_the_watchdog() {
    use support::reference::ReferenceServer;
    let server = ReferenceServer::start(&[]);
    let repo = TestRepo::new();
    repo.write(
        "analytics.yaml",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: analytics\nspec:\n  engine: postgres\n  version: \"16\"\n  size: db-small\n  storageGb: 100\n  region: eu-west-1\n",
    );
    repo.commit("analytics");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = TendConfig::new(dir.path(), &repo.url())
        .without_section("providers.sandbox")
        .section("providers.dbaas", "kind", "\"http\"")
        .section(
            "providers.dbaas",
            "endpoint",
            &format!("\"{}\"", server.url()),
        )
        .section("providers.dbaas", "timeout", "\"1s\"")
        .section("providers.dbaas", "operation_timeout", "\"1s\"")
        .reconcile("max_retries", "0")
        .reconcile("confirm_timeout", "\"1s\"")
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .status("branch", "\"\"")
        .write();
    let daemon = Daemon::start(
        &config,
        port,
        &[
            ("WATCHDOG_USEC", "1000000"),
            ("FAILPOINTS", "hang-operations=return"),
        ],
    );
    daemon.wait_for("the hung operation named", Duration::from_secs(30), || {
        daemon.log().contains("past its deadline of 3s")
    });
    daemon.notifications();
    std::thread::sleep(Duration::from_millis(2500));
    let late = daemon.notifications();
    assert!(
        !late.iter().any(|m| m.contains("WATCHDOG=1")),
        "the watchdog was fed beside a hung operation: {late:?}"
    );
    assert_eq!(daemon.get("/healthz").unwrap().status, 200);
}

/// A client that trickles its request head a byte at a time (each byte
/// inside the idle timeout) is cut off once the request has gone
/// unanswered for the request timeout (1 s here, 30 s shipped); other
/// clients are answered meanwhile.
#[test]
fn a_client_trickling_its_headers_is_cut_off() {
    use std::io::{Read, Write};
    let env = Env::new();
    std::fs::write(env.dir.path().join("webhook-secret"), "s3cret\n").unwrap();
    let config = env.config();
    let daemon = Daemon::start(
        &config,
        env.port,
        &[("FAILPOINTS", "request-timeout=return(1000)")],
    );
    daemon.wait_ready();
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", env.port)).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
    let started = Instant::now();
    let mut cut = None;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(250));
        if slow.write_all(b"X").is_err() {
            cut = Some(started.elapsed());
            break;
        }
        assert_eq!(daemon.get("/healthz").unwrap().status, 200);
    }
    if cut.is_none() {
        // A write into a closed socket may still succeed once; the read
        // says it is closed.
        slow.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 64];
        let closed = match slow.read(&mut buf) {
            Ok(0) => true,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            Ok(_) => false,
        };
        if closed {
            cut = Some(started.elapsed());
        }
    }
    let cut = cut.expect("the trickling client was never cut off");
    assert!(cut < Duration::from_secs(4), "{cut:?}");
}

/// A fetch stuck where no socket timeout reaches (here a test hook stalls
/// the poll; in life a DNS lookup or a file system): past twice `[source]
/// timeout` it is a named source failure in `/readyz`, not a silent wait.
#[test]
fn a_fetch_stuck_past_its_deadline_is_said() {
    let env = Env::new();
    std::fs::write(env.dir.path().join("webhook-secret"), "s3cret\n").unwrap();
    let config = TendConfig::new(env.dir.path(), &env.repo.url())
        .server("listen", &format!("\"127.0.0.1:{}\"", env.port))
        .source("timeout", "\"1s\"")
        .status("branch", "\"\"")
        .write();
    let pause = env.dir.path().join("paused");
    let daemon = Daemon::start(
        &config,
        env.port,
        &[
            ("FAILPOINTS", "before-fetch=return(pause)"),
            ("TEND_TEST_PAUSE_FILE", pause.to_str().unwrap()),
        ],
    );
    daemon.wait_for("the stalled fetch said", Duration::from_secs(20), || {
        daemon.get("/readyz").is_some_and(|r| {
            r.status == 503 && r.body.contains("the fetch has not returned after 2s")
        })
    });
    let metrics = daemon.get("/metrics").unwrap().body;
    assert!(metrics.contains("tend_fetch_errors_total 1"), "{metrics}");
}

mod turns {
    use super::*;
    use support::reference::ReferenceServer;

    const SECRET: &str = "turns-secret";

    fn declared(name: &str, provider: &str, spec: &str) -> String {
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  provider: {provider}\n{spec}"
        )
    }

    /// A cycle's mark in the log: (`starts` or `done`, provider, scope).
    fn marks(log: &str) -> Vec<(&'static str, String, String)> {
        let field = |line: &str, key: &str| -> String {
            line.split_once(&format!("{key}="))
                .map(|(_, rest)| {
                    rest.split_whitespace()
                        .next()
                        .unwrap_or("")
                        .trim_matches('"')
                        .to_string()
                })
                .unwrap_or_default()
        };
        log.lines()
            .filter_map(|line| {
                let what = if line.contains("cycle starts") {
                    "starts"
                } else if line.contains("cycle done in") {
                    "done"
                } else {
                    return None;
                };
                Some((what, field(line, "provider"), field(line, "scope")))
            })
            .collect()
    }

    fn count(log: &str, what: &str, provider: &str, scope: &str) -> usize {
        marks(log)
            .iter()
            .filter(|(w, p, s)| *w == what && p == provider && s == scope)
            .count()
    }

    /// With `parallel_cycles = 1`, whole-provider cycles take turns: while
    /// a slow provider lists, another provider's whole cycle waits for it,
    /// and a commit to that other provider is reconciled meanwhile, not
    /// after the slow listing.
    #[test]
    fn whole_cycles_take_turns_and_a_commit_does_not_wait_behind_a_slow_listing() {
        let server = ReferenceServer::start(&[]);
        let repo = TestRepo::new();
        repo.write(
            "analytics.yaml",
            &declared(
                "analytics",
                "slow",
                "  engine: postgres\n  size: db-small\n  storageGb: 100\n",
            ),
        );
        repo.write(
            "orders.yaml",
            &declared("orders", "sandbox", "  connectionLimit: 10\n"),
        );
        repo.commit("two providers");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        let port = free_port();
        let config = TendConfig::new(dir.path(), &repo.url())
            .section("providers.slow", "kind", "\"http\"")
            .section(
                "providers.slow",
                "endpoint",
                &format!("\"{}\"", server.url()),
            )
            .section("providers.slow", "timeout", "\"60s\"")
            .reconcile("parallel_cycles", "1")
            .reconcile("observe", "\"1h\"")
            .reconcile("resync", "\"1h\"")
            .server("listen", &format!("\"127.0.0.1:{port}\""))
            .server("webhook_secret_file", "\"secret\"")
            .server("reconcile_min_interval", "\"0s\"")
            .source("interval", "\"1h\"")
            .write();
        let daemon = Daemon::start(&config, port, &[]);
        daemon.wait_for("both in sync", Duration::from_secs(60), || {
            daemon
                .get("/v1/status")
                .is_some_and(|r| r.body.matches("\"InSync\"").count() == 2)
        });

        // The slow provider's whole cycle takes the only turn and lists
        // for 10 s.
        server.faults(serde_json::json!({"latencyMs": 10_000}));
        let slow_started = count(&daemon.log(), "starts", "slow", "full");
        let slow_done = count(&daemon.log(), "done", "slow", "full");
        let post = || {
            let r = daemon.request("POST", "/v1/reconcile", &[], b"").unwrap();
            assert_eq!(r.status, 202, "{}", r.body);
        };
        post();
        daemon.wait_for("the slow whole cycle", Duration::from_secs(30), || {
            count(&daemon.log(), "starts", "slow", "full") > slow_started
        });
        // Whichever went first, the sandbox's next whole cycle now waits
        // (its last word is that it waits, not that a cycle starts). A
        // second request only when it went first: one left pending would
        // run a whole cycle of its own after the commit's, and hide a lost
        // one that gave way.
        let waiting = || {
            let log = daemon.log();
            log.lines()
                .rev()
                .filter(|l| l.contains("provider=\"sandbox\"") || l.contains("provider=sandbox"))
                .find(|l| l.contains("waits for its turn") || l.contains("cycle starts"))
                .is_some_and(|l| l.contains("waits for its turn"))
        };
        std::thread::sleep(Duration::from_millis(300));
        if !waiting() {
            post();
        }
        daemon.wait_for("the sandbox waiting", Duration::from_secs(10), waiting);
        // A commit to the sandbox's declaration: reconciled while the slow
        // listing still holds the turn.
        let changes = count(&daemon.log(), "done", "sandbox", "change");
        let sandbox_whole = count(&daemon.log(), "done", "sandbox", "full");
        repo.write(
            "orders.yaml",
            &declared("orders", "sandbox", "  connectionLimit: 20\n"),
        );
        repo.commit("orders: 20");
        daemon.signed_webhook(SECRET);
        daemon.wait_for("the commit's cycle", Duration::from_secs(30), || {
            count(&daemon.log(), "done", "sandbox", "change") > changes
        });
        let log = daemon.log();
        assert_eq!(
            count(&log, "done", "slow", "full"),
            slow_done,
            "the commit's cycle waited for the slow listing:\n{log}"
        );

        // Then the slow cycle ends and the sandbox's whole cycle, which
        // gave way to the commit, runs.
        daemon.wait_for("the turns served", Duration::from_secs(60), || {
            let log = daemon.log();
            count(&log, "done", "slow", "full") > slow_done
                && count(&log, "done", "sandbox", "full") > sandbox_whole
        });
        // Never two whole cycles at once (every cycle ended: none failed).
        let log = daemon.log();
        assert!(!log.contains("cycle failed"), "{log}");
        let mut open = std::collections::BTreeSet::new();
        for (what, provider, scope) in marks(&log) {
            if scope != "full" {
                continue;
            }
            if what == "starts" {
                open.insert(provider);
                assert!(open.len() <= 1, "whole cycles overlapped: {open:?}\n{log}");
            } else {
                open.remove(&provider);
            }
        }
    }
}
