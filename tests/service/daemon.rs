//! `tend run` as a real process: systemd notifications, the watchdog,
//! signals, reloads, the HTTP endpoints and webhooks, resync and due
//! times, with real Git and the sandbox provider.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::TendCommand;
use support::config::TendConfig;
use support::daemon::Daemon;
use support::fixture::Fixture;
use support::git::{TestRepo, free_port, manifest};
use tend::testing::provider::sandbox::SandboxProvider;

const SECRET: &str = "hunter2-webhook-secret";

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
    /// One declaration (`orders`), a one-hour poll and resync, a webhook
    /// secret.
    fn new(change: impl FnOnce(TendConfig) -> TendConfig) -> Self {
        let port = free_port();
        let fixture = Fixture::with_config(&[("orders.yaml", manifest("orders", 10))], |c| {
            change(
                c.source("interval", "\"1h\"")
                    .reconcile("resync", "\"1h\"")
                    .reconcile("drift_grace", "\"10m\"")
                    .server("listen", &format!("\"127.0.0.1:{port}\""))
                    .server("webhook_secret_file", "\"webhook-secret\""),
            )
        });
        std::fs::write(
            fixture.dir.path().join("webhook-secret"),
            format!("{SECRET}\n"),
        )
        .unwrap();
        Env { fixture, port }
    }

    fn start(&self, env: &[(&str, &str)]) -> Daemon {
        let daemon = Daemon::start(&self.config_path(), self.port, env);
        daemon.wait_ready();
        daemon
    }

    fn edit_limit(&self, name: &str, limit: i64) {
        support::fixture::change_limit(&self.sandbox(), name, limit);
    }
}

fn resource<'a>(report: &'a Value, name: &str) -> Option<&'a Value> {
    report["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)
}

#[test]
fn systemd_hears_ready_status_watchdog_reloading_and_stopping() {
    let env = Env::new(|c| c);
    let mut daemon = env.start(&[("WATCHDOG_USEC", "1000000")]);
    let mut seen = Vec::new();
    daemon.wait_for(
        "READY=1, STATUS= and two WATCHDOG=1",
        Duration::from_secs(5),
        || {
            seen.extend(daemon.notifications());
            // READY=1 comes with the status line it makes current, in
            // one message.
            seen.iter().any(|m| {
                m.starts_with("READY=1\nSTATUS=commit ") && m.contains(": 1 resource, 1 in sync,")
            }) && seen.iter().filter(|m| m.contains("WATCHDOG=1")).count() >= 2
        },
    );
    daemon.signal("HUP");
    daemon.wait_for("RELOADING=1 then READY=1", Duration::from_secs(10), || {
        seen.extend(daemon.notifications());
        let reloading = seen.iter().position(|m| m.contains("RELOADING=1"));
        reloading.is_some_and(|i| seen[i..].iter().any(|m| m.contains("READY=1")))
    });
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(Duration::from_secs(30)), Some(0));
    seen.extend(daemon.notifications());
    assert!(seen.iter().any(|m| m.contains("STOPPING=1")), "{seen:?}");
}

/// A reload before the agent is ready (its source unreachable, nothing
/// reconciled) must not send READY=1: under `Type=notify` that would end
/// the start with nothing reconciled.
#[test]
fn a_reload_before_the_agent_is_ready_does_not_tell_systemd_it_is() {
    let env = Env::new(|c| c.source("url", "\"http://127.0.0.1:9/databases.git\""));
    let mut daemon = Daemon::start(&env.config_path(), env.port, &[]);
    daemon.wait_for("the server", Duration::from_secs(20), || {
        daemon.get("/readyz").is_some_and(|r| r.status == 503)
    });
    let mut seen = daemon.notifications();
    daemon.signal("HUP");
    daemon.wait_for("the reload", Duration::from_secs(10), || {
        daemon.log().contains("configuration reloaded")
    });
    std::thread::sleep(Duration::from_millis(300));
    seen.extend(daemon.notifications());
    assert!(
        !seen
            .iter()
            .any(|m| m.contains("READY=1") || m.contains("RELOADING=1")),
        "{seen:?}"
    );
    assert_eq!(daemon.get("/readyz").unwrap().status, 503);
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(Duration::from_secs(30)), Some(0));
}

/// `tend run`'s text log outside the journal (no `TEND_LOG`): every line
/// starts with the UTC time, so a terminal or container log tells when.
#[test]
fn the_agents_text_log_carries_the_wall_clock_time() {
    let env = Env::new(|c| c);
    let log = env.dir.path().join("plain.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tend"))
        .args(["--config", env.config_path().to_str().unwrap(), "run"])
        .current_dir(env.dir.path())
        .env_remove("TEND_LOG")
        .env_remove("TEND_LOG_FORMAT")
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let text = support::eventually(
        "the agent ready",
        Duration::from_secs(20),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("ready: the first snapshot is reconciled")
                .then_some(text)
        },
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    let _ = child.kill();
    let _ = child.wait();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 2, "{text}");
    let year = tend::testing::time::rfc3339(std::time::SystemTime::now())[..4].to_string();
    for line in lines {
        let stamp = line.split_whitespace().next().unwrap_or("");
        assert!(
            stamp.starts_with(&year) && stamp.contains('T') && stamp.ends_with('Z'),
            "no UTC time at the start of: {line}"
        );
    }
}

#[test]
fn a_wedged_loop_stops_the_watchdog_though_http_still_answers() {
    let env = Env::new(|c| c);
    let daemon = env.start(&[("WATCHDOG_USEC", "1000000"), ("FAILPOINTS", "wedge=return")]);
    daemon.wait_for("a first WATCHDOG=1", Duration::from_secs(5), || {
        daemon
            .notifications()
            .iter()
            .any(|m| m.contains("WATCHDOG=1"))
    });
    // The next cycle hangs (the test-only wedge).
    let r = daemon.request("POST", "/v1/reconcile", &[], b"").unwrap();
    assert_eq!(r.status, 202);
    std::thread::sleep(Duration::from_millis(2500));
    daemon.notifications();
    std::thread::sleep(Duration::from_millis(2500));
    let late = daemon.notifications();
    assert!(
        !late.iter().any(|m| m.contains("WATCHDOG=1")),
        "the watchdog was still pinged by a wedged agent: {late:?}"
    );
    assert_eq!(
        daemon.get("/healthz").unwrap().status,
        200,
        "HTTP still answers"
    );
    assert!(
        daemon.log().contains("not making progress"),
        "{}",
        daemon.log()
    );
}

#[test]
fn metrics_are_openmetrics_and_count_what_status_reports() {
    let env = Env::new(|c| c);
    // An override with an expiry: its time is a gauge an alert compares
    // with time().
    env.repo.write(
        "billing.yaml",
        &manifest("billing", 5).replace(
            "  name: billing\n",
            "  name: billing\n  annotations:\n    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: INC-1\n    tend.dev/override-expires: \"2099-01-01T00:00:00Z\"\n",
        ),
    );
    env.repo.commit("billing");
    let daemon = env.start(&[]);
    env.edit_limit("orders", 99);
    daemon.request("POST", "/v1/reconcile", &[], b"");
    daemon.wait_for("orders drifted", Duration::from_secs(10), || {
        resource(&daemon.status(), "orders").is_some_and(|r| r["state"] == "Drifted")
    });
    let status = daemon.status();
    let metrics = daemon.get("/metrics").unwrap();
    assert_eq!(metrics.status, 200);
    let text = metrics.body;
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics ends with # EOF: {text}"
    );
    for family in [
        "tend_resources",
        "tend_cycles",
        "tend_operations",
        "tend_source_commit_age_seconds",
        "tend_last_successful_cycle_timestamp_seconds",
        "tend_config_reloads",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} missing:\n{text}"
        );
    }
    assert!(
        text.contains("tend_override_expiry_timestamp_seconds{resource=\"billing\"} 4070908800\n"),
        "{text}"
    );
    // A healthy provider's error series exists, at 0, before any error.
    assert!(
        text.contains("tend_provider_errors_total{provider=\"sandbox\",kind=\"observe\"} 0"),
        "{text}"
    );
    let gauge = |state: &str| -> u64 {
        let prefix = format!("tend_resources{{state=\"{state}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(
        gauge("InSync"),
        status["summary"]["inSync"].as_u64().unwrap()
    );
    assert_eq!(
        gauge("Drifted"),
        status["summary"]["drifted"].as_u64().unwrap()
    );
    assert_eq!(
        gauge("InSync") + gauge("Drifted"),
        status["summary"]["total"].as_u64().unwrap()
    );
    let one = daemon.get("/v1/status/orders").unwrap();
    assert_eq!(one.status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&one.body).unwrap()["state"],
        "Drifted"
    );
    assert_eq!(daemon.get("/v1/status/nope").unwrap().status, 404);
    // A name with control characters is not reflected raw.
    let hostile = daemon.get("/v1/status/x%1b%5B2J%0Ay").unwrap();
    assert_eq!(hostile.status, 404);
    assert!(
        !hostile.body.contains('\u{1b}') && hostile.body.contains("x\\u{1b}[2J\\ny"),
        "{:?}",
        hostile.body
    );
}

fn sign(body: &[u8]) -> String {
    tend::testing::server::webhook::sign(SECRET.as_bytes(), body)
}

#[test]
fn a_signed_webhook_fetches_at_once_and_unsigned_ones_trigger_nothing() {
    // Served by `git daemon`: no local watch, only the hook (and a one-hour
    // poll) can make the agent fetch.
    let served = tempfile::tempdir().unwrap();
    let work = TestRepo::new();
    work.write("orders.yaml", &manifest("orders", 10));
    work.commit("orders");
    let bare = work.bare_clone(served.path());
    let git_daemon = support::git::GitDaemon::start(served.path());
    let env = Env::new(|c| c.source("url", &format!("\"{}\"", git_daemon.url("repo.git"))));
    let push = |message: &str| {
        let commit = work.commit(message);
        work.git(&["push", "-q", &bare.display().to_string(), "main"]);
        commit
    };
    let daemon = env.start(&[]);
    let first = daemon.status()["source"]["commit"].clone();
    work.write("billing.yaml", &manifest("billing", 5));
    push("billing");
    let body = br#"{"ref":"refs/heads/main"}"#;
    let forged = tend::testing::server::webhook::sign(b"not the secret", body);
    let refused: [(&str, String); 6] = [
        ("X-Hub-Signature-256", format!("sha256={forged}")),
        ("X-Gitea-Signature", forged.clone()),
        ("X-Gitlab-Token", "wrong-token".into()),
        ("X-Hub-Signature-256", "sha256=".into()),
        ("X-Gitea-Signature", String::new()),
        ("X-Unrelated", "x".into()),
    ];
    for (header, value) in &refused {
        let r = daemon
            .request("POST", "/hooks/git", &[(header, value)], body)
            .unwrap();
        assert_eq!(r.status, 401, "{header}: {value}: {}", r.body);
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        daemon.status()["source"]["commit"],
        first,
        "a refused hook fetched"
    );

    for (header, value) in [
        ("X-Hub-Signature-256", format!("sha256={}", sign(body))),
        ("X-Gitea-Signature", sign(body)),
        ("X-Gitlab-Token", SECRET.to_string()),
    ] {
        let commit = push(&format!("empty commit for {header}"));
        let sent = Instant::now();
        let r = daemon
            .request("POST", "/hooks/git", &[(header, &value)], body)
            .unwrap();
        assert_eq!(r.status, 202, "{header}: {}", r.body);
        daemon.wait_for(
            "the hook's commit in /v1/status",
            Duration::from_secs(1),
            || daemon.status()["source"]["commit"] == commit.as_str(),
        );
        eprintln!("{header}: push to reconciled in {:?}", sent.elapsed());
    }
    assert!(resource(&daemon.status(), "billing").is_some());
    for text in [
        daemon.log(),
        daemon.get("/metrics").unwrap().body,
        daemon.get("/v1/status").unwrap().body,
    ] {
        assert!(!text.contains(SECRET), "the webhook secret leaked");
    }
}

#[test]
fn resync_finds_out_of_band_drift_without_a_commit_and_corrects_it_after_grace() {
    let env = Env::new(|c| {
        c.reconcile("resync", "\"1s\"")
            .reconcile("drift_grace", "\"2s\"")
    });
    let daemon = env.start(&[]);
    env.edit_limit("orders", 77);
    daemon.wait_for("the drift reported", Duration::from_secs(5), || {
        resource(&daemon.status(), "orders").is_some_and(|r| {
            r["drift"][0]["origin"] == "out-of-band" && r["drift"][0]["observed"] == 77
        })
    });
    daemon.wait_for("the correction", Duration::from_secs(10), || {
        env.limit_at_provider("orders") == json!(10)
    });
}

#[test]
fn a_held_correction_runs_when_drift_grace_ends_not_at_the_next_poll() {
    let env = Env::new(|c| c.reconcile("drift_grace", "\"3s\""));
    let daemon = env.start(&[]);
    env.edit_limit("orders", 55);
    // The drift is first seen by the cycle this asks for, no earlier.
    let asked = Instant::now();
    assert_eq!(
        daemon
            .request("POST", "/v1/reconcile", &[], b"")
            .unwrap()
            .status,
        202
    );
    daemon.wait_for("the drift held", Duration::from_secs(5), || {
        resource(&daemon.status(), "orders").is_some_and(|r| r["action"] == "Hold")
    });
    let held = Instant::now();
    // The grace is honoured: the out-of-band value stands for most of it.
    std::thread::sleep(Duration::from_millis(2500).saturating_sub(asked.elapsed()));
    assert_eq!(
        env.limit_at_provider("orders"),
        json!(55),
        "corrected {:?} after the drift was first seen, within drift_grace 3s",
        asked.elapsed()
    );
    daemon.wait_for(
        "the correction at the due time",
        Duration::from_secs(6),
        || env.limit_at_provider("orders") == json!(10),
    );
    let waited = held.elapsed();
    eprintln!(
        "corrected {waited:?} after the hold was reported (drift_grace 3s, poll and resync 1h)"
    );
    assert!(waited < Duration::from_millis(4500), "{waited:?}");
}

#[test]
fn an_override_set_on_the_host_stops_a_pending_correction() {
    let env = Env::new(|c| c.reconcile("drift_grace", "\"2s\""));
    let daemon = env.start(&[]);
    env.edit_limit("orders", 66);
    daemon.request("POST", "/v1/reconcile", &[], b"");
    daemon.wait_for("the drift held", Duration::from_secs(5), || {
        resource(&daemon.status(), "orders").is_some_and(|r| r["action"] == "Hold")
    });
    let config = env.config_path().display().to_string();
    TendCommand::new(&[
        "--config",
        &config,
        "override",
        "set",
        "orders",
        "--ignore-fields",
        "connectionLimit",
        "--reason",
        "INC-77",
    ])
    .expect_code(0);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        env.limit_at_provider("orders"),
        json!(66),
        "the override was clobbered"
    );
    let orders = resource(&daemon.status(), "orders").cloned().unwrap();
    assert_eq!(orders["state"], "Overridden", "{orders:#}");
    assert_eq!(orders["override"]["source"], "local");
}

#[test]
fn sighup_with_a_broken_configuration_keeps_the_old_one() {
    let env = Env::new(|c| c);
    let daemon = env.start(&[]);
    let good = std::fs::read_to_string(env.config_path()).unwrap();
    std::fs::write(
        env.config_path(),
        format!("{good}\nthis is not toml = = =\n"),
    )
    .unwrap();
    // The sample's own line: the metric's HELP text reads
    // "tend_config_reload_failed 1 while …", which matched before the
    // reload and let the log be read too early.
    let sample = |value: &str| {
        daemon.get("/metrics").is_some_and(|m| {
            m.body
                .lines()
                .any(|l| l == format!("tend_config_reload_failed {value}"))
        })
    };
    daemon.signal("HUP");
    daemon.wait_for(
        "the refused reload in the metrics",
        Duration::from_secs(5),
        || sample("1"),
    );
    assert_eq!(daemon.get("/healthz").unwrap().status, 200);
    assert!(
        daemon.log().contains("configuration reload refused"),
        "{}",
        daemon.log()
    );
    std::fs::write(env.config_path(), good).unwrap();
    daemon.signal("HUP");
    daemon.wait_for("the accepted reload", Duration::from_secs(10), || {
        sample("0")
    });
    daemon.wait_ready();
    assert!(resource(&daemon.status(), "orders").is_some());
}

#[test]
fn sigterm_during_a_slow_operation_exits_0_and_the_next_start_converges() {
    let env = Env::new(|c| {
        c.faults("rate_limit_calls", "1")
            .faults("retry_after", "\"2s\"")
    });
    env.repo.write("billing.yaml", &manifest("billing", 5));
    env.repo.commit("billing");
    let mut daemon = Daemon::start(&env.config_path(), env.port, &[]);
    daemon.wait_for("a create under way", Duration::from_secs(10), || {
        daemon.log().contains("provider call failed; retrying")
    });
    daemon.signal("TERM");
    assert_eq!(
        daemon.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        daemon.log()
    );
    let restarted = env.start(&[]);
    restarted.wait_for("both in sync", Duration::from_secs(10), || {
        let status = restarted.status();
        status["summary"]["inSync"] == 2
    });
    let state = env.sandbox().load().unwrap();
    assert_eq!(state.databases.len(), 2, "no duplicate");
    assert_eq!(
        state.operations().len(),
        2,
        "one operation each reached the provider"
    );
}

#[test]
fn apply_beside_the_daemon_is_refused_naming_its_pid_and_plan_works() {
    let env = Env::new(|c| c);
    let daemon = env.start(&[]);
    let config = env.config_path().display().to_string();
    let refused = TendCommand::new(&["--config", &config, "apply"]).expect_code(1);
    assert!(
        refused.stderr.contains(&format!("pid {}", daemon.pid())),
        "{}",
        refused.stderr
    );
    TendCommand::new(&["--config", &config, "plan"]).expect_code(0);
    TendCommand::new(&["--config", &config, "state", "show"]).expect_code(0);
}

#[test]
fn listening_beyond_loopback_without_a_webhook_secret_is_a_configuration_error() {
    let env = Env::new(|c| c);
    std::fs::write(
        env.config_path(),
        std::fs::read_to_string(env.config_path())
            .unwrap()
            .replace("webhook_secret_file = \"webhook-secret\"\n", "")
            .replace("127.0.0.1:", "0.0.0.0:"),
    )
    .unwrap();
    let run = TendCommand::new(&["--config", &env.config_path().display().to_string(), "run"])
        .expect_code(78);
    assert!(run.stderr.contains("beyond loopback"), "{}", run.stderr);
}

/// A command run in an operator's shell, outside the service, meets a
/// `$CREDENTIALS_DIRECTORY/` path with the variable unset: the error says
/// so and what to do, and with the variable set the command works.
#[test]
fn a_command_outside_the_service_is_told_how_to_reach_the_credentials() {
    let env = Env::new(|c| c.server("webhook_secret_file", "\"$CREDENTIALS_DIRECTORY/webhook\""));
    let config = env.config_path().display().to_string();
    if std::path::Path::new("/run/credentials/tend.service").exists() {
        panic!("a tend.service is running on this machine: its credentials would be used");
    }
    let run = TendCommand::new(&["--config", &config, "run"]).expect_code(78);
    assert!(
        run.stderr.contains(
            "webhook_secret_file = $CREDENTIALS_DIRECTORY/webhook: cannot open it: CREDENTIALS_DIRECTORY is not set"
        ) && run
            .stderr
            .contains("`sudo CREDENTIALS_DIRECTORY=/etc/tend/secrets tend …` (docs/operations.md)"),
        "{}",
        run.stderr
    );
    let creds = env.dir.path().join("creds");
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(creds.join("webhook"), SECRET).unwrap();
    let mut daemon = env.start(&[("CREDENTIALS_DIRECTORY", creds.to_str().unwrap())]);
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(Duration::from_secs(30)), Some(0));
}

#[test]
fn json_logs_credentials_from_systemd_and_no_secret_in_any_output() {
    const TOKEN: &str = "ghp_tokenvalue_0123456789";
    let env = Env::new(|c| {
        c.server("webhook_secret_file", "\"$CREDENTIALS_DIRECTORY/webhook\"")
            .source("token_file", "\"${CREDENTIALS_DIRECTORY}/git-token\"")
    });
    let creds = env.dir.path().join("creds");
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(creds.join("webhook"), SECRET).unwrap();
    std::fs::write(creds.join("git-token"), TOKEN).unwrap();
    let creds = creds.display().to_string();
    let mut daemon = env.start(&[
        ("CREDENTIALS_DIRECTORY", &creds),
        ("TEND_LOG_FORMAT", "json"),
    ]);
    let body = b"{}";
    let ok = daemon
        .request("POST", "/hooks/git", &[("X-Gitlab-Token", SECRET)], body)
        .unwrap();
    assert_eq!(
        ok.status, 202,
        "the secret came from $CREDENTIALS_DIRECTORY"
    );
    let bad = daemon
        .request("POST", "/hooks/git", &[("X-Gitlab-Token", "nope")], body)
        .unwrap();
    assert_eq!(bad.status, 401);
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(Duration::from_secs(30)), Some(0));
    let log = daemon.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() > 3, "{log}");
    for line in &lines {
        let parsed: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            parsed["level"].is_string() && parsed["fields"].is_object(),
            "{line}"
        );
    }
    let outputs = [log, ok.body, bad.body];
    for text in &outputs {
        assert!(
            !text.contains(SECRET) && !text.contains(TOKEN),
            "a secret leaked: {text}"
        );
    }
}

#[test]
fn tend_status_prints_the_running_agents_last_report() {
    let env = Env::new(|c| c);
    let daemon = env.start(&[]);
    let config = env.config_path().display().to_string();
    let all = TendCommand::new(&["--config", &config, "status"]).expect_code(0);
    assert!(
        all.stdout
            .contains(&format!("the running agent (http://127.0.0.1:{}", env.port)),
        "{}",
        all.stdout
    );
    assert!(
        all.stdout.contains("orders") && all.stdout.contains("InSync"),
        "{}",
        all.stdout
    );
    let one = TendCommand::new(&["--config", &config, "status", "orders", "--format", "json"])
        .expect_code(0);
    assert_eq!(one.json()["resources"][0]["name"], "orders");
    TendCommand::new(&["--config", &config, "status", "nope"]).expect_code(1);
    // The agent writes its report files too (by default in the state dir).
    let reports = env.config.state_dir().join("reports");
    daemon.wait_for("latest.json", Duration::from_secs(10), || {
        reports.join("latest.json").exists() && reports.join("latest.html").exists()
    });
    drop(daemon);
    let from_file = TendCommand::new(&["--config", &config, "status"]).expect_code(0);
    assert!(
        from_file.stdout.contains("(no agent answered)") && from_file.stdout.contains("orders"),
        "{}",
        from_file.stdout
    );
    std::fs::remove_dir_all(&reports).unwrap();
    let gone = TendCommand::new(&["--config", &config, "status"]).expect_code(1);
    assert!(
        gone.stderr.contains("no running agent answers"),
        "{}",
        gone.stderr
    );
}

/// A cycle whose report says what the report files say, only later (a
/// no-change request), leaves the files as they are for a while; the
/// status writer then writes them by itself, with no other cycle, so they
/// show the last observation.
#[test]
fn report_files_whose_report_only_moved_times_are_written_when_due() {
    let env = Env::new(|c| c.reconcile("observe", "\"1h\""));
    let daemon = env.start(&[("TEND_LOG", "debug")]);
    let latest = env.config.state_dir().join("reports/latest.json");
    let generated = || -> Option<String> {
        let text = std::fs::read_to_string(&latest).ok()?;
        let report: Value = serde_json::from_str(&text).ok()?;
        report["generatedAt"].as_str().map(str::to_string)
    };
    daemon.wait_for("the first report files", Duration::from_secs(20), || {
        generated().is_some()
    });
    let first = generated();
    let cycles = || daemon.log().matches("cycle done in").count();
    let left = || {
        daemon
            .log()
            .matches("status: only the report's times moved; its files are written in")
            .count()
    };
    // The report's times are to the second.
    std::thread::sleep(Duration::from_millis(1100));
    let (before, left_before) = (cycles(), left());
    let answer = daemon.request("POST", "/v1/reconcile", &[], b"").unwrap();
    assert_eq!(answer.status, 202, "{}", answer.body);
    daemon.wait_for("the files left for later", Duration::from_secs(20), || {
        left() > left_before
    });
    let after = cycles();
    assert!(after > before, "the request ran no cycle");
    daemon.wait_for(
        "the files written by the status writer alone",
        Duration::from_secs(30),
        || generated() != first,
    );
    assert_eq!(cycles(), after, "another cycle wrote them");
    assert_eq!(
        daemon.status()["resources"][0]["state"],
        "InSync",
        "{}",
        daemon.log()
    );
}

/// `tend status` beside an agent that is up but has finished no cycle yet
/// says so (it is not "not running": an operator would restart a healthy
/// agent), and an agent answering for another configuration is refused.
#[test]
fn tend_status_tells_a_starting_agent_and_another_agent_from_no_agent() {
    // A source that cannot be reached and no commit accepted before: the
    // agent serves, but its first cycle cannot start.
    let env = Env::new(|c| c);
    let unreachable = Env::new(|c| c.source("url", "\"http://127.0.0.1:9/databases.git\""));
    let config = unreachable.config_path().display().to_string();
    let daemon = Daemon::start(&unreachable.config_path(), unreachable.port, &[]);
    // /readyz says what holds the start up: the source.
    daemon.wait_for("the server", Duration::from_secs(20), || {
        daemon
            .get("/readyz")
            .is_some_and(|r| r.status == 503 && r.body.contains("the source cannot be read"))
    });
    let starting = TendCommand::new(&["--config", &config, "status"]).expect_code(1);
    assert!(
        starting.stderr.contains(&format!(
            "the agent at http://127.0.0.1:{} is running but has no report yet (starting: the source cannot be read (since ",
            unreachable.port
        )) && starting.stderr.contains("/v1/status: 503 Service Unavailable no cycle has finished yet)")
            && starting.stderr.contains("docs/runbooks/daemon-not-ready.md"),
        "{}",
        starting.stderr
    );
    assert!(
        !starting.stderr.contains("no running agent"),
        "{}",
        starting.stderr
    );
    drop(daemon);

    // A configuration whose agent_id is not the answering agent's.
    let daemon = env.start(&[]);
    let other = env.dir.path().join("other.toml");
    let text = std::fs::read_to_string(env.config_path()).unwrap();
    assert!(text.contains("agent_id = \"test-agent\""), "{text}");
    std::fs::write(
        &other,
        text.replace("agent_id = \"test-agent\"", "agent_id = \"someone-else\""),
    )
    .unwrap();
    let refused = TendCommand::new(&["--config", other.to_str().unwrap(), "status"]).expect_code(1);
    assert!(
        refused
            .stderr
            .contains("is agent `test-agent`, not `someone-else` (this configuration's agent_id)"),
        "{}",
        refused.stderr
    );
    // One without agent_id, whose own state keeps another id: the kept
    // id is what the answering agent must be.
    std::fs::write(
        &other,
        text.replace("agent_id = \"test-agent\"", "agent_id = \"elsewhere\"")
            .replace("state_dir = \"state\"", "state_dir = \"other-state\""),
    )
    .unwrap();
    TendCommand::new(&["--config", other.to_str().unwrap(), "apply"]).expect_code(0);
    std::fs::write(
        &other,
        text.replace("agent_id = \"test-agent\"\n", "")
            .replace("state_dir = \"state\"", "state_dir = \"other-state\""),
    )
    .unwrap();
    let refused = TendCommand::new(&["--config", other.to_str().unwrap(), "status"]).expect_code(1);
    assert!(
        refused.stderr.contains(
            "is agent `test-agent`, not `elsewhere` (the agent id this configuration's state keeps)"
        ),
        "{}",
        refused.stderr
    );
    drop(daemon);
}

/// `/` serves the report page; a start while the source fails
/// reconciles the last accepted commit, and the report says why.
#[test]
fn the_page_at_the_root_and_a_start_while_the_source_fails() {
    let env = Env::new(|c| c);
    let daemon = env.start(&[]);
    let page = daemon.get("/").unwrap();
    assert_eq!(page.status, 200);
    assert!(
        page.body.starts_with("<!doctype html>") && page.body.contains("<code>orders</code>"),
        "{}",
        page.body
    );
    drop(daemon);
    // The branch goes away; the agent restarts with the last accepted
    // commit and corrects drift from it.
    let broken = env.config.clone().source("branch", "\"gone\"");
    broken.write();
    env.edit_limit("orders", 77);
    let daemon = Daemon::start(&env.config_path(), env.port, &[]);
    daemon.wait_ready();
    let status = daemon.status();
    let error = &status["source"]["error"];
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("branch `gone` does not exist")),
        "{status:#}"
    );
    assert_eq!(status["source"]["commit"], env.repo.head().as_str());
    assert_eq!(resource(&status, "orders").unwrap()["state"], "Drifted");
}

#[test]
fn a_service_manager_that_stops_reading_never_stalls_the_agent() {
    let env = Env::new(|c| c);
    // The harness binds the notify socket and, here, never reads it: its
    // queue (ten datagrams by default) fills within a few cycles.
    let daemon = env.start(&[("WATCHDOG_USEC", "200000")]);
    let done = |d: &Daemon| d.log().matches("cycle done in").count();
    for _ in 0..30 {
        let before = done(&daemon);
        assert_eq!(
            daemon
                .request("POST", "/v1/reconcile", &[], b"")
                .unwrap()
                .status,
            202
        );
        daemon.wait_for("the next cycle", Duration::from_secs(5), || {
            done(&daemon) > before
        });
    }
}

#[test]
fn an_expiring_override_is_re_decided_at_its_expiry_not_at_the_next_poll() {
    let env = Env::new(|c| c.reconcile("drift_grace", "\"0s\""));
    let daemon = env.start(&[]);
    env.repo.write(
        "orders.yaml",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n  annotations:\n    tend.dev/paused: \"true\"\n    tend.dev/override-reason: INC-9\n    tend.dev/override-expires: 3s\n    tend.dev/override-on-expiry: resume\nspec:\n  connectionLimit: 10\n",
    );
    env.repo.commit("pause orders for 3s");
    // The local repository's watch brings the commit in.
    daemon.wait_for("the pause", Duration::from_secs(5), || {
        resource(&daemon.status(), "orders").is_some_and(|r| r["state"] == "Overridden")
    });
    env.edit_limit("orders", 44);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        env.limit_at_provider("orders"),
        json!(44),
        "paused: left alone"
    );
    daemon.wait_for(
        "the correction after the expiry",
        Duration::from_secs(5),
        || env.limit_at_provider("orders") == json!(10),
    );
}

fn with_provider(name: &str, provider: &str, limit: u32) -> String {
    format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  provider: {provider}\n  connectionLimit: {limit}\n"
    )
}

/// Two sandbox providers (`sandbox`, `other`), one declaration at each
/// (`orders`, `ledger`), and `stray`, which names a provider not configured.
fn two_providers_and_a_stray() -> Env {
    let env = Env::new(|c| c.section("providers.other", "kind", "\"sandbox\""));
    env.repo
        .write("orders.yaml", &with_provider("orders", "sandbox", 10));
    env.repo
        .write("ledger.yaml", &with_provider("ledger", "other", 10));
    env.repo
        .write("stray.yaml", &with_provider("stray", "nowhere", 10));
    env.repo.commit("two providers and a stray declaration");
    env
}

/// A commit that changes none of a provider's declarations moves that
/// provider's report to it without a cycle, and the report says what a
/// cycle would have said: a file that stops or starts parsing, and an
/// orphaned override whose name the commit declares elsewhere.
#[test]
fn a_report_moved_to_a_commit_without_a_cycle_says_what_a_cycle_would() {
    let env = two_providers_and_a_stray();
    let daemon = env.start(&[]);
    let config = env.config_path().display().to_string();
    TendCommand::new(&[
        "--config", &config, "override", "set", "billing", "--pause", "--reason", "INC-1",
        "--force",
    ])
    .expect_code(0);
    daemon.request("POST", "/v1/reconcile", &[], b"");
    let names = |report: &Value, list: &str, key: &str| -> Vec<String> {
        let mut names: Vec<String> = report[list]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[key].as_str().map(String::from))
            .collect();
        names.sort();
        names
    };
    daemon.wait_for(
        "the orphaned override reported",
        Duration::from_secs(10),
        || names(&daemon.status(), "orphanedOverrides", "name") == ["billing"],
    );

    // `billing` declared at `sandbox`, and a file that does not parse: the
    // `other` provider's report moves, `sandbox` decides `billing`.
    env.repo
        .write("billing.yaml", &with_provider("billing", "sandbox", 10));
    env.repo.write("broken.yaml", "metadata: [\n");
    let declared = env
        .repo
        .commit("billing declared; a file that does not parse");
    daemon.wait_for("billing decided", Duration::from_secs(10), || {
        let report = daemon.status();
        report["source"]["commit"] == declared.as_str()
            && resource(&report, "billing").is_some()
            && cycles(&daemon, "sandbox", "change") >= 1.0
    });
    let report = daemon.status();
    assert_eq!(
        names(&report, "orphanedOverrides", "name"),
        Vec::<String>::new(),
        "{report:#}"
    );
    assert_eq!(
        names(&report, "errors", "file"),
        ["broken.yaml", "stray.yaml"],
        "{report:#}"
    );

    // The broken file broken otherwise, and another beside it: no
    // declaration changed, so neither provider decides anything and both
    // reports move (the old error of `broken.yaml` goes with the old
    // snapshot).
    env.repo
        .write("broken.yaml", "# broken otherwise\nspec: [\n");
    env.repo.write("worse.yaml", "spec: {\n");
    let worse = env.repo.commit("the broken file otherwise, and another");
    daemon.wait_for("the parse errors moved", Duration::from_secs(10), || {
        let report = daemon.status();
        report["source"]["commit"] == worse.as_str()
            && names(&report, "errors", "file") == ["broken.yaml", "stray.yaml", "worse.yaml"]
    });
    let report = daemon.status();
    assert!(
        resource(&report, "ledger").is_some_and(|r| r["state"] == "InSync"),
        "{report:#}"
    );
    assert_eq!(
        cycles(&daemon, "sandbox", "change"),
        1.0,
        "{}",
        daemon.log()
    );
    assert_eq!(cycles(&daemon, "other", "change"), 0.0, "{}", daemon.log());
    let log = daemon.log();
    let moved = |provider: &str| {
        log.lines()
            .filter(|l| {
                l.contains(provider) && l.contains("its report moves to it without a cycle")
            })
            .count()
    };
    assert_eq!((moved("other"), moved("sandbox")), (2, 1), "{log}");

    // The broken files gone: a resource whose file could not be read may
    // now have left Git, with this commit as its removal's, which a cycle
    // records: both providers run one.
    env.repo.remove("broken.yaml");
    env.repo.remove("worse.yaml");
    let mended = env.repo.commit("the broken files removed");
    daemon.wait_for(
        "a cycle over the mended commit",
        Duration::from_secs(10),
        || {
            let report = daemon.status();
            report["source"]["commit"] == mended.as_str()
                && names(&report, "errors", "file") == ["stray.yaml"]
                && cycles(&daemon, "other", "change") >= 1.0
                && cycles(&daemon, "sandbox", "change") >= 2.0
        },
    );
}

#[test]
fn a_slow_provider_never_delays_another_providers_resources() {
    // `slow` answers its first call with 429 and a 6 s Retry-After.
    let env = Env::new(|c| {
        c.section("providers.slow", "kind", "\"sandbox\"")
            .section("providers.slow.faults", "rate_limit_calls", "1")
            .section("providers.slow.faults", "retry_after", "\"6s\"")
    });
    env.repo
        .write("orders.yaml", &with_provider("orders", "sandbox", 10));
    env.repo
        .write("ledger.yaml", &with_provider("ledger", "slow", 10));
    env.repo.commit("two providers");
    let started = Instant::now();
    let daemon = Daemon::start(&env.config_path(), env.port, &[]);
    daemon.wait_for(
        "orders created at the fast provider",
        Duration::from_secs(3),
        || env.limit_at_provider("orders") == json!(10),
    );
    let fast = started.elapsed();
    let slow = SandboxProvider::new(
        "slow",
        &env.config.state_dir(),
        Duration::ZERO,
        Default::default(),
    );
    assert!(
        slow.load().unwrap().databases.is_empty(),
        "the slow provider is still waiting out its Retry-After"
    );
    daemon.wait_for(
        "ledger created at the slow provider",
        Duration::from_secs(15),
        || slow.load().unwrap().databases.contains_key("ledger"),
    );
    eprintln!(
        "fast provider done after {fast:?}, slow after {:?}",
        started.elapsed()
    );
    daemon.wait_ready();
}

#[test]
fn a_second_signal_exits_at_once_and_nothing_is_lost() {
    let env = Env::new(|c| {
        c.faults("rate_limit_calls", "2")
            .faults("retry_after", "\"20s\"")
    });
    let mut daemon = Daemon::start(&env.config_path(), env.port, &[]);
    daemon.wait_for(
        "a call waiting out its Retry-After",
        Duration::from_secs(10),
        || daemon.log().contains("provider call failed; retrying"),
    );
    daemon.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    let second = Instant::now();
    daemon.signal("INT");
    assert_eq!(
        daemon.wait_exit(Duration::from_secs(5)),
        Some(130),
        "{}",
        daemon.log()
    );
    assert!(
        second.elapsed() < Duration::from_secs(3),
        "{:?}",
        second.elapsed()
    );
    assert!(daemon.log().contains("second signal"), "{}", daemon.log());
    // The next start (the provider well again) finishes what was left, once.
    let text = std::fs::read_to_string(env.config_path()).unwrap();
    let healthy: String = text
        .lines()
        .filter(|l| !l.starts_with("rate_limit_calls") && !l.starts_with("retry_after"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(env.config_path(), healthy).unwrap();
    let restarted = env.start(&[]);
    restarted.wait_for("orders in sync", Duration::from_secs(10), || {
        resource(&restarted.status(), "orders").is_some_and(|r| r["state"] == "InSync")
    });
    assert_eq!(env.sandbox().load().unwrap().databases.len(), 1);
}

#[test]
fn request_bodies_are_capped() {
    let env = Env::new(|c| c);
    let daemon = env.start(&[]);
    let big = vec![b'x'; 2 * 1024 * 1024];
    let r = daemon.request("POST", "/hooks/git", &[("X-Gitlab-Token", SECRET)], &big);
    assert!(
        r.as_ref().is_none_or(|r| r.status == 413),
        "a 2 MiB body is refused: {r:?}"
    );
    assert_eq!(daemon.get("/healthz").unwrap().status, 200);
}

/// A provider that answers nothing fails every cycle: the "last successful
/// cycle" alert must fire for an outage, not keep moving because the cycle
/// finished.
#[test]
fn a_cycle_that_observes_nothing_is_not_a_successful_cycle() {
    let env = Env::new(|c| {
        c.faults("fail_calls", "1000000")
            .reconcile("max_retries", "0")
    });
    let daemon = env.start(&[]);
    daemon.wait_for("a failed cycle", Duration::from_secs(20), || {
        daemon.get("/metrics").is_some_and(|m| {
            m.body.lines().any(|l| {
                l.starts_with("tend_cycles_total{")
                    && l.contains("result=\"error\"")
                    && !l.ends_with(" 0")
            })
        })
    });
    let text = daemon.get("/metrics").unwrap().body;
    assert!(
        text.lines()
            .any(|l| l == "tend_last_successful_cycle_timestamp_seconds 0.0"),
        "{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("tend_cycles_total{")
            && l.contains("result=\"ok\"")
            && !l.ends_with(" 0")),
        "{text}"
    );
}

/// Each provider's worker decides its own part of the fleet, but the
/// mass-deletion guard counts the whole fleet: removals spread over two
/// providers, each provider's share below the limit and the whole above
/// it, are all held at both.
#[test]
fn the_mass_deletion_guard_counts_the_removals_at_every_provider_together() {
    let env = Env::new(|c| {
        c.section("providers.other", "kind", "\"sandbox\"")
            .reconcile("deletion_delay", "\"0s\"")
            .reconcile("max_deletion_percent", "30")
    });
    let deletable = |name: &str, provider: &str| {
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  provider: {provider}\n  connectionLimit: 5\n  deletionPolicy: Delete\n"
        )
    };
    env.repo.remove("orders.yaml");
    for i in 0..5 {
        env.repo.write(
            &format!("a{i}.yaml"),
            &deletable(&format!("a{i}"), "sandbox"),
        );
        env.repo
            .write(&format!("b{i}.yaml"), &deletable(&format!("b{i}"), "other"));
    }
    env.repo.commit("ten databases at two providers");
    let other = SandboxProvider::new(
        "other",
        &env.config.state_dir(),
        Duration::ZERO,
        Default::default(),
    );
    let count = |p: &SandboxProvider| p.load().unwrap().databases.len();
    let daemon = env.start(&[]);
    daemon.wait_for("ten databases", Duration::from_secs(15), || {
        count(&env.sandbox()) == 5 && count(&other) == 5
    });

    // 4 of 10 due together: the limit is 30 % of 10, 3; each provider's 2
    // alone are below it.
    for name in ["a0", "a1", "b0", "b1"] {
        env.repo.remove(&format!("{name}.yaml"));
    }
    let commit = env.repo.commit("remove two at each provider");
    daemon.signed_webhook(SECRET);
    let held = |status: &Value| {
        ["a0", "a1", "b0", "b1"].iter().all(|name| {
            resource(status, name).is_some_and(|r| {
                r["action"] == "Hold"
                    && r["reason"]
                        .as_str()
                        .is_some_and(|why| why.contains("4 were due together"))
            })
        })
    };
    daemon.wait_for(
        "the four removals held by the guard",
        Duration::from_secs(15),
        || {
            let status = daemon.status();
            status["source"]["commit"] == commit.as_str() && held(&status)
        },
    );
    // More cycles of both workers change nothing.
    daemon.run_cycles(2);
    assert!(held(&daemon.status()), "{}", daemon.status());
    assert_eq!(
        (count(&env.sandbox()), count(&other)),
        (5, 5),
        "a provider's worker deleted its share of a mass deletion"
    );
}

/// The cycles `tend_cycles_total` counts for `provider` over `scope`.
fn cycles(daemon: &Daemon, provider: &str, scope: &str) -> f64 {
    let text = daemon.get("/metrics").unwrap().body;
    text.lines()
        .filter(|l| {
            l.starts_with("tend_cycles_total{")
                && l.contains(&format!("provider=\"{provider}\""))
                && l.contains(&format!("scope=\"{scope}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A commit is reconciled by cycles over the declarations it changed: the
/// provider whose declaration changed decides that one, the other runs no
/// cycle at all (its report moves to the commit), and neither runs a
/// cycle over its whole part of the fleet. The
/// report still holds every resource, the new commit, and the error of a
/// declaration no cycle decided. A removal is a whole cycle's work at
/// every provider (it is decided where the resource is managed, which may
/// not be where it was declared).
#[test]
fn a_commit_wakes_only_the_declarations_it_changed() {
    let env = two_providers_and_a_stray();
    let daemon = env.start(&[]);
    let in_sync =
        |report: &Value, name: &str| resource(report, name).is_some_and(|r| r["state"] == "InSync");
    daemon.wait_for("both resources in sync", Duration::from_secs(10), || {
        let report = daemon.status();
        in_sync(&report, "orders") && in_sync(&report, "ledger")
    });
    let full = |provider: &str| cycles(&daemon, provider, "full");
    let (sandbox_full, other_full) = (full("sandbox"), full("other"));
    assert!(sandbox_full >= 1.0 && other_full >= 1.0);

    env.repo
        .write("orders.yaml", &with_provider("orders", "sandbox", 12));
    let commit = env.repo.commit("orders: 12");
    // (The merged report names the newest commit as soon as one part
    // does: both providers' cycles are waited for, not the report.)
    daemon.wait_for("the commit reconciled", Duration::from_secs(10), || {
        let report = daemon.status();
        report["source"]["commit"] == commit.as_str()
            && cycles(&daemon, "sandbox", "change") >= 1.0
            && in_sync(&report, "orders")
    });
    assert_eq!(env.limit_at_provider("orders"), json!(12));
    assert_eq!(cycles(&daemon, "sandbox", "change"), 1.0);
    assert_eq!(cycles(&daemon, "other", "change"), 0.0, "{}", daemon.log());
    assert_eq!(full("sandbox"), sandbox_full, "{}", daemon.log());
    assert_eq!(full("other"), other_full, "{}", daemon.log());
    let log = daemon.log();
    let starts = |provider: &str, over: &str| {
        log.lines()
            .filter(|l| {
                l.contains(&format!("provider=\"{provider}\""))
                    || l.contains(&format!("provider={provider}"))
            })
            // (A due-time cycle may follow the change: not counted.)
            .filter(|l| {
                l.contains(&format!("cycle starts over {over}"))
                    && (l.contains("scope=\"change\"") || l.contains("scope=change"))
            })
            .count()
    };
    assert_eq!(starts("sandbox", "1 resources"), 1, "{log}");
    assert_eq!(starts("other", "0 resources"), 0, "{log}");
    assert!(
        log.lines().any(|l| l.contains("other")
            && l.contains(&commit)
            && l.contains("its report moves to it without a cycle")),
        "{log}"
    );
    let report = daemon.status();
    assert!(in_sync(&report, "ledger"), "{report:#}");
    let errors = report["errors"].as_array().unwrap();
    assert!(
        errors.iter().any(
            |e| e["file"] == "stray.yaml" && e["message"].as_str().unwrap().contains("nowhere")
        ),
        "{report:#}"
    );

    // `ledger` declared at the other provider than the one that manages
    // it, then removed: its removal is decided where it is managed.
    env.repo
        .write("ledger.yaml", &with_provider("ledger", "sandbox", 10));
    let moved = env.repo.commit("ledger: declared at the other provider");
    daemon.wait_for("the move reconciled", Duration::from_secs(10), || {
        daemon.status()["source"]["commit"] == moved.as_str()
    });
    let (sandbox_full, other_full) = (full("sandbox"), full("other"));
    env.repo.remove("ledger.yaml");
    let removed = env.repo.commit("ledger removed");
    daemon.wait_for(
        "the removal's whole cycles, at every provider",
        Duration::from_secs(10),
        || full("other") > other_full && full("sandbox") > sandbox_full,
    );
    daemon.wait_for("the removal reported", Duration::from_secs(10), || {
        let report = daemon.status();
        report["source"]["commit"] == removed.as_str() && resource(&report, "ledger").is_some()
    });
}
