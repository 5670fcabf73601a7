//! The daemon's HTTP server as someone who can reach its port sees it:
//! with `[server] token_file`, the reports and `POST /v1/reconcile` need
//! the bearer token (probes stay open), `tend status` sends it, and a
//! flood of reconcile requests costs one cycle per
//! `reconcile_min_interval`, none lost. (Tests listen on 127.0.0.1 only:
//! the rule for addresses beyond loopback is tested in
//! `src/server/access.rs`.)

use crate::support;

use std::time::{Duration, Instant};

use support::TendCommand;
use support::daemon::Daemon;
use support::fixture::Fixture;
use support::git::{free_port, manifest};

const TOKEN: &str = "reports-token-5b1e";

/// A [`Fixture`] with a reports token, and `tend run` started on it.
struct Env {
    fixture: Fixture,
    daemon: Daemon,
}

impl Env {
    fn start(min_interval: &str) -> Self {
        let port = free_port();
        let fixture = Fixture::with_config(&[("orders.yaml", manifest("orders", 10))], |c| {
            c.source("interval", "\"1h\"")
                .reconcile("resync", "\"1h\"")
                .server("listen", &format!("\"127.0.0.1:{port}\""))
                .server("token_file", "\"token\"")
                .server("reconcile_min_interval", &format!("\"{min_interval}\""))
        });
        std::fs::write(fixture.dir.path().join("token"), format!("{TOKEN}\n")).unwrap();
        let daemon = Daemon::start(&fixture.config_path(), port, &[]);
        daemon.wait_ready();
        Env { fixture, daemon }
    }

    fn with_token(&self, method: &str, path: &str) -> support::daemon::Response {
        let auth = format!("Bearer {TOKEN}");
        self.daemon
            .request(method, path, &[("Authorization", &auth)], b"")
            .expect("the server answers")
    }

    fn cycles(&self) -> usize {
        self.daemon.log().matches("cycle done in").count()
    }
}

#[test]
fn with_a_token_file_the_reports_and_reconcile_need_the_bearer_token() {
    let env = Env::start("0s");
    let daemon = &env.daemon;
    for path in ["/v1/status", "/v1/status/orders", "/metrics", "/"] {
        let open = daemon.get(path).unwrap();
        assert_eq!(open.status, 401, "{path}: {}", open.body);
        assert!(open.body.contains("[server] token_file"), "{}", open.body);
        let wrong = daemon
            .request("GET", path, &[("Authorization", "Bearer nope")], b"")
            .unwrap();
        assert_eq!(wrong.status, 401, "{path}");
        assert_eq!(env.with_token("GET", path).status, 200, "{path}");
    }
    // Probes carry no credentials.
    assert_eq!(daemon.get("/healthz").unwrap().status, 200);
    assert_eq!(daemon.get("/readyz").unwrap().status, 200);

    let before = env.cycles();
    let refused = daemon.request("POST", "/v1/reconcile", &[], b"").unwrap();
    assert_eq!(refused.status, 401, "{}", refused.body);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(env.cycles(), before, "a refused request triggers nothing");
    assert_eq!(env.with_token("POST", "/v1/reconcile").status, 202);
    daemon.wait_for("the asked-for cycle", Duration::from_secs(20), || {
        env.cycles() > before
    });

    // `tend status` reads the token from the configuration.
    let config = env.fixture.config_path().display().to_string();
    let status = TendCommand::new(&["--config", &config, "status"]).expect_code(0);
    assert!(
        status.stdout.contains("orders") && !status.stderr.contains("401"),
        "{}{}",
        status.stdout,
        status.stderr
    );
}

/// 300 requests over about 3 s: one cycle per interval (it was a cycle
/// after another as fast as they run: 74 in 3 s), and the last request is
/// served by a cycle that starts after it.
#[test]
fn a_flood_of_reconcile_requests_is_coalesced_and_none_is_lost() {
    let env = Env::start("1s");
    std::thread::sleep(Duration::from_millis(1100));
    let before = env.cycles();
    let started = Instant::now();
    let mut answers = std::collections::BTreeMap::new();
    let mut last = "";
    let mut before_last = 0;
    for _ in 0..300 {
        before_last = env.cycles();
        let r = env.with_token("POST", "/v1/reconcile");
        assert_eq!(r.status, 202, "{}", r.body);
        last = if r.body.starts_with("folded") {
            "folded"
        } else if r.body.contains(" start in ") {
            "scheduled"
        } else {
            "now"
        };
        *answers.entry(last).or_insert(0) += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let flood = started.elapsed();
    // The last request's reconcile (started then, or at most an interval
    // later) has run by now: a cycle finished after it was sent.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        env.cycles() > before_last,
        "the last request ({last}) was lost:\n{}",
        env.daemon.log()
    );
    let ran = env.cycles() - before;
    let bound = flood.as_secs_f64().ceil() as usize + 2;
    println!(
        "300 requests in {:.2} s: {ran} cycles (bound {bound}); answers {answers:?}",
        flood.as_secs_f64()
    );
    assert!(
        (1..=bound).contains(&ran),
        "{ran} cycles for 300 requests in {flood:?}"
    );
    assert!(
        answers.get("folded").copied().unwrap_or(0) > 200,
        "{answers:?}"
    );
}
