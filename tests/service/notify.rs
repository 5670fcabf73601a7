//! Notifications to a real receiver on loopback: one message per
//! transition across restarts, signed, retried, and never holding up a
//! cycle.

use crate::support;

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use support::TendCommand;
use support::config::TendConfig;
use support::daemon::Daemon;
use support::fixture::Fixture;
use support::git::{free_port, manifest};
use support::receiver::{Answer, Receiver};

const SECRET: &str = "notify-signing-secret";

/// A [`Fixture`] with a signing secret, configured per test with its
/// receiver.
struct Env(Fixture);

impl std::ops::Deref for Env {
    type Target = Fixture;
    fn deref(&self) -> &Fixture {
        &self.0
    }
}

impl Env {
    fn new() -> Self {
        let fixture = Fixture::new(&[("orders.yaml", manifest("orders", 10))]);
        std::fs::write(
            fixture.dir.path().join("notify-secret"),
            format!("{SECRET}\n"),
        )
        .unwrap();
        Env(fixture)
    }

    fn config(&self, receiver: &Receiver, change: impl FnOnce(TendConfig) -> TendConfig) -> String {
        change(self.config.clone().notify(&[
            ("name", "\"oncall\""),
            ("url", &format!("\"{}\"", receiver.url())),
            ("secret_file", "\"notify-secret\""),
            ("timeout", "\"1s\""),
        ]))
        .write()
        .display()
        .to_string()
    }

    fn tend(&self, config: &str, args: &[&str], code: i32) -> support::RunOutput {
        let mut all = vec!["--config", config];
        all.extend_from_slice(args);
        TendCommand::new(&all).expect_code(code)
    }

    fn edit(&self, config: &str, limit: u32) {
        self.tend(
            config,
            &[
                "sandbox",
                "edit",
                "orders",
                "--set",
                &format!("connectionLimit={limit}"),
            ],
            0,
        );
    }
}

fn verify(secret: &str, body: &str, header: Option<&str>) {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(header, Some(format!("sha256={hex}").as_str()), "{body}");
}

/// One message per transition, whatever the number of cycles and
/// restarts in between: drift detected once, recovered once.
#[test]
fn each_transition_is_notified_once_across_restarts_and_signed() {
    let env = Env::new();
    let receiver = Receiver::start(&[]);
    let config = env.config(&receiver, |c| c);
    env.tend(&config, &["apply"], 0);
    assert!(receiver.received().is_empty(), "{:#?}", receiver.received());

    env.edit(&config, 99);
    // Three processes see the drift (held for drift_grace): one message.
    for _ in 0..3 {
        env.tend(&config, &["apply"], 2);
    }
    let got = receiver.received();
    assert_eq!(receiver.events(), ["drift-detected"], "{got:#?}");
    let message = &got[0];
    verify(SECRET, &message.body, message.header("X-Tend-Signature"));
    let body = message.json();
    assert_eq!(body["event"], "drift-detected");
    assert_eq!(body["resource"], "orders");
    assert_eq!(body["state"], "Drifted");
    assert_eq!(body["drift"][0]["field"], "connectionLimit");
    assert_eq!(body["drift"][0]["observed"], 99);
    assert_eq!(body["agent"]["id"], "test-agent");
    assert!(!message.body.contains(SECRET));

    // The running agent starts, stops, starts again: no new message.
    let port = free_port();
    let daemon_config = env.config(&receiver, |c| {
        c.server("listen", &format!("\"127.0.0.1:{port}\""))
            .source("interval", "\"1h\"")
    });
    for _ in 0..2 {
        let daemon = Daemon::start(std::path::Path::new(&daemon_config), port, &[]);
        daemon.wait_ready();
        std::thread::sleep(Duration::from_millis(500));
        drop(daemon);
    }
    assert_eq!(receiver.events(), ["drift-detected"]);

    // Someone puts the value back: recovered, once.
    env.edit(&config, 10);
    env.tend(&config, &["apply"], 0);
    env.tend(&config, &["apply"], 0);
    let got = receiver.received();
    assert_eq!(
        receiver.events(),
        ["drift-detected", "recovered"],
        "{got:#?}"
    );
    let recovered = got[1].json();
    assert_eq!(recovered["resource"], "orders");
    assert_eq!(recovered["ended"], serde_json::json!(["drift"]));
    verify(SECRET, &got[1].body, got[1].header("X-Tend-Signature"));
}

/// A receiver that answers 500 gets the message again later; the running
/// agent retries it on its own.
#[test]
fn a_failed_delivery_is_retried_until_the_receiver_takes_it() {
    let env = Env::new();
    let receiver = Receiver::start(&[Answer::Status(500)]);
    let port = free_port();
    let config = env.config(&receiver, |c| {
        c.server("listen", &format!("\"127.0.0.1:{port}\""))
            .source("interval", "\"1h\"")
            .reconcile("resync", "\"200ms\"")
    });
    env.tend(&config, &["apply"], 0);
    env.edit(&config, 55);
    let daemon = Daemon::start(std::path::Path::new(&config), port, &[]);
    daemon.wait_ready();
    // The first attempt is answered 500, the retry (5 s later) 200.
    let got = receiver.wait_for(2, Duration::from_secs(30));
    assert_eq!(receiver.events()[..2], ["drift-detected", "drift-detected"]);
    assert_eq!(got[0].body, got[1].body, "the retry sends the same message");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(receiver.received().len(), 2, "delivered once it was taken");
    assert!(
        daemon
            .log()
            .contains("notification sent: drift-detected for orders")
    );
}

/// A receiver that never answers costs a cycle its timeout, no more: the
/// one-shot apply ends, and the running agent keeps reconciling while the
/// delivery waits.
#[test]
fn a_receiver_that_hangs_does_not_hold_up_reconciliation() {
    let env = Env::new();
    let receiver = Receiver::start(&[Answer::Hang, Answer::Hang, Answer::Hang]);
    let config = env.config(&receiver, |c| c);
    env.tend(&config, &["apply"], 0);
    env.edit(&config, 77);
    // Ends (after the 1 s timeout), reports, and keeps the message.
    let run = env.tend(&config, &["apply"], 2);
    assert!(run.stderr.contains("no answer within 1s"), "{}", run.stderr);
    assert_eq!(receiver.events(), ["drift-detected"]);

    let port = free_port();
    let config = env.config(&receiver, |c| {
        c.server("listen", &format!("\"127.0.0.1:{port}\""))
            .source("interval", "\"100ms\"")
            .reconcile("drift_grace", "\"0s\"")
    });
    let daemon = Daemon::start(std::path::Path::new(&config), port, &[]);
    daemon.wait_ready();
    // While deliveries hang, a new commit is reconciled.
    env.repo.write("orders.yaml", &manifest("orders", 42));
    let head = env.repo.commit("orders: 42");
    daemon.wait_for("the new commit applied", Duration::from_secs(20), || {
        let status = daemon.status();
        status["source"]["commit"] == head.as_str() && status["resources"][0]["state"] == "InSync"
    });
}

/// The Slack format is an incoming-webhook message: text and blocks.
#[test]
fn the_slack_format_is_an_incoming_webhook_message() {
    let env = Env::new();
    let receiver = Receiver::start(&[]);
    let config = TendConfig::new(env.dir.path(), &env.repo.url())
        .notify(&[
            ("url", &format!("\"{}\"", receiver.url())),
            ("format", "\"slack\""),
            ("events", "[\"drift-detected\"]"),
        ])
        .write()
        .display()
        .to_string();
    env.tend(&config, &["apply"], 0);
    env.edit(&config, 12);
    env.tend(&config, &["apply"], 2);
    let got = receiver.received();
    assert_eq!(got.len(), 1, "{got:#?}");
    let body = got[0].json();
    assert_eq!(
        body["text"],
        "tend: `orders`: out-of-band drift on connectionLimit"
    );
    assert_eq!(body["blocks"][0]["type"], "section");
    assert_eq!(body["blocks"][0]["text"]["type"], "mrkdwn");
    assert_eq!(body["blocks"][1]["type"], "context");
    assert!(
        got[0].header("X-Tend-Signature").is_none(),
        "no secret, no signature"
    );
}

#[test]
fn a_receiver_without_a_url_is_a_configuration_error() {
    let env = Env::new();
    let config = TendConfig::new(env.dir.path(), &env.repo.url())
        .notify(&[("name", "\"oncall\"")])
        .write()
        .display()
        .to_string();
    let run = env.tend(&config, &["apply"], 78);
    assert!(
        run.stderr.contains("[[notify]] oncall: give url"),
        "{}",
        run.stderr
    );
}

/// The firing alerts in `received` (every request is a POST of an alert
/// list to Alertmanager's API), each with when it was received.
fn alerts(received: &[support::receiver::Received]) -> Vec<serde_json::Value> {
    received
        .iter()
        .flat_map(|r| {
            assert_eq!(r.method, "POST", "{r:#?}");
            assert_eq!(r.path, "/api/v2/alerts", "{r:#?}");
            assert_eq!(r.header("Content-Type"), Some("application/json"));
            r.json().as_array().expect("a list of alerts").clone()
        })
        .collect()
}

fn ends_at(alert: &serde_json::Value) -> std::time::SystemTime {
    humantime::parse_rfc3339(alert["endsAt"].as_str().unwrap()).unwrap()
}

/// Alertmanager gets the alert of a condition while it holds (ending 4 ×
/// resend later unless sent again) and the same alert resolved when it
/// ends; nothing is sent while nothing holds.
#[test]
fn alertmanager_gets_an_alert_while_drift_holds_and_resolved_when_it_ends() {
    let env = Env::new();
    let receiver = Receiver::start(&[]);
    let config = TendConfig::new(env.dir.path(), &env.repo.url())
        .notify(&[
            ("name", "\"alertmanager\""),
            (
                "url",
                &format!("\"http://127.0.0.1:{}/api/v2/alerts\"", receiver.port),
            ),
            ("format", "\"alertmanager\""),
            ("resend", "\"1m\""),
        ])
        .status("report_url", "\"https://tend.example/latest.html\"")
        .write()
        .display()
        .to_string();
    env.tend(&config, &["apply"], 0);
    assert!(receiver.received().is_empty(), "{:#?}", receiver.received());

    env.edit(&config, 99);
    let before = std::time::SystemTime::now();
    env.tend(&config, &["apply"], 2);
    let firing = alerts(&receiver.received());
    assert!(!firing.is_empty());
    for alert in &firing {
        assert_eq!(
            alert["labels"],
            serde_json::json!({
                "alertname": "TendDriftDetected",
                "event": "drift-detected",
                "agent": "test-agent",
                "resource": "orders",
                "severity": "warning",
            }),
            "{alert:#}"
        );
        assert_eq!(
            alert["annotations"]["summary"],
            "`orders`: out-of-band drift on connectionLimit"
        );
        assert_eq!(
            alert["annotations"]["runbook_url"],
            "docs/runbooks/drift-held.md"
        );
        assert_eq!(alert["generatorURL"], "https://tend.example/latest.html");
        // Lasts 4 × resend unless sent again.
        assert!(
            ends_at(alert) >= before + Duration::from_secs(230),
            "{alert:#}"
        );
    }
    let labels = firing[0]["labels"].clone();

    // Put right: the same alert, resolved now; no firing alert follows.
    env.edit(&config, 10);
    let sent = receiver.received().len();
    env.tend(&config, &["apply"], 0);
    let after = std::time::SystemTime::now();
    let resolved = alerts(&receiver.received()[sent..]);
    assert_eq!(resolved.len(), 1, "{resolved:#?}");
    assert_eq!(
        receiver.received()[sent].header("X-Tend-Event"),
        Some("resolved:drift-detected")
    );
    assert_eq!(resolved[0]["labels"], labels);
    assert!(ends_at(&resolved[0]) <= after, "{:#}", resolved[0]);
    let sent = receiver.received().len();
    env.tend(&config, &["apply"], 0);
    assert_eq!(
        receiver.received().len(),
        sent,
        "nothing holds: nothing sent"
    );
}

/// The running agent sends the alerts that hold again every `resend`, so
/// Alertmanager keeps them firing for as long as they hold.
#[test]
fn the_running_agent_sends_firing_alerts_again_every_resend() {
    let env = Env::new();
    let receiver = Receiver::start(&[]);
    let port = free_port();
    let config = TendConfig::new(env.dir.path(), &env.repo.url())
        .notify(&[
            (
                "url",
                &format!("\"http://127.0.0.1:{}/api/v2/alerts\"", receiver.port),
            ),
            ("format", "\"alertmanager\""),
            ("resend", "\"1s\""),
        ])
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .source("interval", "\"1h\"")
        .write()
        .display()
        .to_string();
    env.tend(&config, &["apply"], 0);
    env.edit(&config, 99);
    let daemon = Daemon::start(std::path::Path::new(&config), port, &[]);
    daemon.wait_ready();
    let got = receiver.wait_for(4, Duration::from_secs(30));
    let firing = alerts(&got);
    assert!(
        firing
            .iter()
            .all(|a| a["labels"]["alertname"] == "TendDriftDetected"),
        "{firing:#?}"
    );
    // Each later one ends later: the alert is kept alive.
    let ends: Vec<_> = firing.iter().map(ends_at).collect();
    assert!(ends.last() > ends.first(), "{ends:?}");
    drop(daemon);
}

/// GitHub, GitLab and Gitea get a commit status on the source commit in
/// their API's shape, with their token header; it is sent again only when
/// what it says changes (across processes).
#[test]
fn commit_statuses_reach_github_gitlab_and_gitea_in_their_shapes() {
    let env = Env::new();
    let receiver = Receiver::start(&[]);
    for (file, token) in [("gh", "tok-gh"), ("gl", "tok-gl"), ("gt", "tok-gt")] {
        std::fs::write(env.dir.path().join(file), format!("{token}\n")).unwrap();
    }
    let base = format!("http://127.0.0.1:{}", receiver.port);
    let config = TendConfig::new(env.dir.path(), &env.repo.url())
        .notify(&[
            ("name", "\"github\""),
            ("format", "\"github\""),
            ("url", &format!("\"{base}/gh/repos/acme/databases\"")),
            ("token_file", "\"gh\""),
        ])
        .notify(&[
            ("name", "\"gitlab\""),
            ("format", "\"gitlab\""),
            ("url", &format!("\"{base}/gl/api/v4/projects/42/\"")),
            ("token_file", "\"gl\""),
            ("context", "\"tend/prod\""),
        ])
        .notify(&[
            ("name", "\"gitea\""),
            ("format", "\"gitea\""),
            ("url", &format!("\"{base}/gt/api/v1/repos/acme/databases\"")),
            ("token_file", "\"gt\""),
        ])
        .status("report_url", "\"https://tend.example/latest.html\"")
        .write()
        .display()
        .to_string();
    let head = env.repo.head();
    env.tend(&config, &["apply"], 0);
    let by_path = |got: &[support::receiver::Received], prefix: &str| {
        got.iter()
            .find(|r| r.path.starts_with(prefix))
            .unwrap_or_else(|| panic!("nothing under {prefix}: {got:#?}"))
            .clone()
    };
    let got = receiver.received();
    assert_eq!(got.len(), 3, "{got:#?}");

    let github = by_path(&got, "/gh/");
    assert_eq!(github.method, "POST");
    assert_eq!(
        github.path,
        format!("/gh/repos/acme/databases/statuses/{head}")
    );
    assert_eq!(github.header("Authorization"), Some("Bearer tok-gh"));
    assert_eq!(github.header("Accept"), Some("application/vnd.github+json"));
    assert_eq!(
        github.json(),
        serde_json::json!({
            "state": "success",
            "context": "tend",
            "description": "tend: 1 in sync",
            "target_url": "https://tend.example/latest.html",
        })
    );
    let gitlab = by_path(&got, "/gl/");
    assert_eq!(
        gitlab.path,
        format!("/gl/api/v4/projects/42/statuses/{head}")
    );
    assert_eq!(gitlab.header("PRIVATE-TOKEN"), Some("tok-gl"));
    assert_eq!(gitlab.json()["name"], "tend/prod");
    assert_eq!(gitlab.json()["state"], "success");
    let gitea = by_path(&got, "/gt/");
    assert_eq!(
        gitea.path,
        format!("/gt/api/v1/repos/acme/databases/statuses/{head}")
    );
    assert_eq!(gitea.header("Authorization"), Some("token tok-gt"));
    assert_eq!(gitea.json()["context"], "tend");
    for r in &got {
        assert!(!r.body.contains("tok-"), "a token in a body: {}", r.body);
    }

    // Nothing changed: nothing sent, in a new process too.
    env.tend(&config, &["apply"], 0);
    assert_eq!(receiver.received().len(), 3);

    // Drift held for grace: pending, in each forge's words.
    env.edit(&config, 99);
    env.tend(&config, &["apply"], 2);
    let got = receiver.received()[3..].to_vec();
    assert_eq!(got.len(), 3, "{got:#?}");
    let github = by_path(&got, "/gh/").json();
    assert_eq!(github["state"], "pending");
    assert_eq!(github["description"], "tend: 0 in sync, 1 drifted");
    assert_eq!(by_path(&got, "/gl/").json()["state"], "pending");
}

/// A commit-status receiver without a token, or given events, is refused
/// with what to do.
#[test]
fn a_commit_status_receiver_needs_a_token_and_takes_no_events() {
    let env = Env::new();
    for (keys, wanted) in [
        (
            vec![
                ("format", "\"github\""),
                ("url", "\"https://api.github.com/repos/a/b\""),
            ],
            "[[notify]] notify-1: format = \"github\" needs token_file",
        ),
        (
            vec![
                ("format", "\"gitea\""),
                ("url", "\"https://gitea.example/api/v1/repos/a/b\""),
                ("token_file", "\"tok\""),
                ("events", "[\"blocked\"]"),
            ],
            "events does not apply to format = \"gitea\"",
        ),
    ] {
        let config = TendConfig::new(env.dir.path(), &env.repo.url())
            .notify(&keys)
            .write()
            .display()
            .to_string();
        let run = env.tend(&config, &["config", "check"], 78);
        assert!(run.stderr.contains(wanted), "{}", run.stderr);
    }
}
