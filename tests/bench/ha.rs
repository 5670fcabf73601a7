//! Benchmarks of agent groups on a shared PostgreSQL state (prints
//! figures; asserts only correctness): failover from a SIGKILLed leader to
//! the standby's first cycle, and the no-change daemon cycle at 10,000
//! declarations on the PostgreSQL state against the SQLite one.
//! Run: `cargo nextest run --release --run-ignored only --test bench ha:: --no-capture`
//! (`TEND_BENCH_LEASE_TTL=5s` for a shorter lease; the default is tend's, 15s).
//! Figures go to docs/performance.md.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::bench::{Scale, durations, figure, spread};
use support::config::TendConfig;
use support::daemon::Daemon;
use support::git::{GitDaemon, TestRepo, free_port, repo_with_declarations};
use support::postgres::Postgres;
use support::reference::ReferenceServer;

fn state_section(config: TendConfig, pg: &Postgres, ttl: &str) -> TendConfig {
    config
        .section("state", "backend", "\"postgres\"")
        .section(
            "state",
            "url",
            &format!(
                "\"postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable\"",
                pg.port
            ),
        )
        .section("state", "lease_ttl", &format!("\"{ttl}\""))
}

fn leads(d: &Daemon) -> bool {
    d.get("/metrics")
        .is_some_and(|r| r.body.lines().any(|l| l == "tend_leader 1"))
}

/// Cycles finished since the agent started leading (the last time).
fn cycles_leading(d: &Daemon) -> usize {
    let log = d.log();
    log.rsplit_once("leading agent group")
        .map_or(0, |(_, after)| after.matches("cycle done in").count())
}

#[test]
#[ignore = "benchmark: run explicitly, see docs/performance.md"]
fn failover_from_a_killed_leader_to_the_standbys_first_cycle() {
    let scale = Scale::from_env();
    let ttl = std::env::var("TEND_BENCH_LEASE_TTL")
        .unwrap_or_else(|_| if scale.quick { "3s" } else { "15s" }.to_string());
    let ttl_secs = humantime_secs(&ttl);
    let rounds = scale.n(10, 2);
    let pg = Postgres::start();
    let server = ReferenceServer::start(&[]);
    let repo = TestRepo::new();
    for i in 0..20 {
        repo.write(
            &format!("db{i}.yaml"),
            &format!(
                "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: db{i}\nspec:\n  engine: postgres\n  version: \"16\"\n  size: db-small\n  storageGb: 100\n  region: eu-west-1\n"
            ),
        );
    }
    repo.commit("declarations");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let start = |dir: &Path| {
        let port = free_port();
        let config = TendConfig::new(dir, &repo.url())
            .without_section("providers.sandbox")
            .top("agent_id", Some("\"bench-group\""))
            .source("interval", "\"1s\"")
            .server("listen", &format!("\"127.0.0.1:{port}\""))
            .section("providers.dbaas", "kind", "\"http\"")
            .section(
                "providers.dbaas",
                "endpoint",
                &format!("\"{}\"", server.url()),
            )
            .section("providers.dbaas", "rate_limit", "1000");
        let path = state_section(config, &pg, &ttl).write();
        Daemon::start(&path, port, &[])
    };
    let mut members = [start(dirs[0].path()), start(dirs[1].path())];
    members[0].wait_for("a leader", Duration::from_secs(60), || {
        members.iter().any(leads)
    });
    let mut leader = if leads(&members[0]) { 0 } else { 1 };
    members[leader].wait_for("the first cycle", Duration::from_secs(60), || {
        cycles_leading(&members[leader]) > 0
    });
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let standby = 1 - leader;
        members[standby].wait_for("the standby", Duration::from_secs(60), || {
            members[standby]
                .get("/readyz")
                .is_some_and(|r| r.body.starts_with("standby"))
        });
        // A renewal just happened or is due: kill at a random point of
        // the renewal period, as a crash would.
        std::thread::sleep(Duration::from_millis(
            (std::process::id() as u64 * 7919 + samples.len() as u64 * 104_729)
                % (ttl_secs * 1000 / 3).max(1),
        ));
        members[leader].signal("KILL");
        let killed = Instant::now();
        members[leader].wait_exit(Duration::from_secs(10));
        let waiting = &members[standby];
        waiting.wait_for(
            "the standby's first cycle",
            Duration::from_secs(ttl_secs * 3 + 30),
            || leads(waiting) && cycles_leading(waiting) > 0,
        );
        samples.push(killed.elapsed().as_secs_f64() * 1000.0);
        members[leader] = start(dirs[leader].path());
        leader = standby;
    }
    assert_eq!(server.count("creates"), 20, "no duplicate across failovers");
    let (value, detail) = spread(&samples);
    figure(
        &format!(
            "**ha: failover, SIGKILL to the standby's first cycle (target <= 2 x lease_ttl = {}s)**",
            2 * ttl_secs
        ),
        value,
        &format!("lease_ttl {ttl}, {detail}"),
    );
}

fn humantime_secs(text: &str) -> u64 {
    text.trim_end_matches('s')
        .parse()
        .expect("TEND_BENCH_LEASE_TTL in seconds, like 15s")
}

#[test]
#[ignore = "benchmark: run explicitly, see docs/performance.md"]
fn no_change_cycle_at_10000_declarations_postgres_against_sqlite() {
    let scale = Scale::from_env();
    // `TEND_BENCH_HA_DECLARATIONS` runs it at another size (100,000 for
    // the state backends at scale; docs/performance.md).
    let declarations = std::env::var("TEND_BENCH_HA_DECLARATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| scale.n(10_000, 200));
    let cycles = scale.n(30, 4);
    // A cold start's creates, and a cycle, take longer with the fleet.
    let times = u32::try_from(declarations.div_ceil(10_000)).unwrap_or(u32::MAX);
    let work = repo_with_declarations(declarations);
    let served = tempfile::tempdir().unwrap();
    work.bare_clone(served.path());
    let git_daemon = GitDaemon::start(served.path());
    let pg = Postgres::start();
    let mut medians = Vec::new();
    for backend in ["sqlite", "postgres"] {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = TendConfig::new(dir.path(), &git_daemon.url("repo.git"))
            .source("path", "\"databases\"")
            .source("interval", "\"1h\"")
            .reconcile("resync", "\"1h\"")
            .reconcile("max_concurrency", "16")
            .sandbox("max_concurrency", "16")
            .sandbox("rate_limit", "10000")
            .server("listen", &format!("\"127.0.0.1:{port}\""))
            // Cycles back to back, each asked for: no coalescing.
            .server("reconcile_min_interval", "\"0s\"");
        let config = if backend == "postgres" {
            state_section(config, &pg, "15s")
        } else {
            config
        };
        let daemon = Daemon::start(&config.write(), port, &[]);
        daemon.wait_for("the cold cycle", Duration::from_secs(600) * times, || {
            daemon
                .get("/readyz")
                .is_some_and(|r| r.status == 200 && r.body.starts_with("ready"))
        });
        daemon.run_cycles(cycles);
        let log = daemon.log();
        let samples: Vec<f64> = durations(&log, "cycle done in ")
            .into_iter()
            .skip(1)
            .collect();
        // Both backends timed the same work: no-change cycles over the
        // whole fleet in sync.
        let done: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("cycle done in "))
            .skip(1)
            .collect();
        assert!(done.len() >= cycles, "{backend}: {} cycles", done.len());
        assert!(
            done.iter().all(|l| l.contains("operations=0")),
            "{backend}: a measured cycle made operations"
        );
        let status = daemon.status();
        assert_eq!(
            status["resources"].as_array().map(Vec::len),
            Some(declarations),
            "{backend}"
        );
        assert!(
            status["resources"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["state"] == "InSync"),
            "{backend}: not every resource in sync"
        );
        let (value, detail) = spread(&samples);
        figure(
            &format!("ha: no-change cycle, {backend} state"),
            value,
            &format!("{declarations} declarations, sandbox provider, {detail}"),
        );
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        medians.push(sorted[sorted.len() / 2]);
    }
    figure(
        "**ha: no-change cycle, postgres state / sqlite state (target <= 2x)**",
        format!("{:.2}x", medians[1] / medians[0]),
        &format!("{declarations} declarations"),
    );
}
