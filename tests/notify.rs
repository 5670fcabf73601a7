//! Notifications to a real receiver on loopback: one message per
//! transition across restarts, signed, retried, and never holding up a
//! cycle.

mod support;

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use support::TendCommand;
use support::config::TendConfig;
use support::daemon::Daemon;
use support::git::{TestRepo, free_port, manifest};
use support::receiver::{Answer, Receiver};

const SECRET: &str = "notify-signing-secret";

struct Env {
    repo: TestRepo,
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        let repo = TestRepo::new();
        repo.write("orders.yaml", &manifest("orders", 10));
        repo.commit("orders");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notify-secret"), format!("{SECRET}\n")).unwrap();
        Env { repo, dir }
    }

    fn config(&self, receiver: &Receiver, change: impl FnOnce(TendConfig) -> TendConfig) -> String {
        change(TendConfig::new(self.dir.path(), &self.repo.url()).notify(&[
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
