//! Benchmark of `tend run` over 10,000 declarations on the sandbox
//! provider (prints figures; asserts only correctness).
//! Run: `cargo nextest run --release --run-ignored only --test bench daemon:: --no-capture`
//! Figures go to docs/performance.md.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::config::TendConfig;
use support::daemon::Daemon;
use support::git::{GitDaemon, free_port, manifest, repo_with_declarations};

use support::bench::{Scale, durations, figure, spread};
const SECRET: &str = "bench-secret";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn stats(v: &[f64]) -> String {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    format!(
        "median {:7.1} ms, min {:7.1}, max {:7.1} ({} samples)",
        s[s.len() / 2],
        s[0],
        s[s.len() - 1],
        s.len()
    )
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// One cycle of the running agent as its `TEND_LOG=debug` log tells it.
struct Cycle {
    whole_ms: f64,
    /// Time between "observing" and "observed" within the cycle.
    observe_ms: f64,
    operations: usize,
}

/// Every cycle of `log`, in order: the marks between a "cycle starts" and
/// its "cycle done in" belong to that cycle.
fn cycles_of(log: &str) -> Vec<Cycle> {
    let mut out = Vec::new();
    let (mut observe_ms, mut observing) = (0.0, None);
    for line in log.lines() {
        let line = line.trim_start();
        let Some((time, rest)) = line
            .split_once("s DEBUG ")
            .or_else(|| line.split_once("s  INFO "))
        else {
            continue;
        };
        let Ok(at) = time.parse::<f64>() else {
            continue;
        };
        if rest.starts_with("cycle starts") {
            (observe_ms, observing) = (0.0, None);
        } else if rest.starts_with("observing") {
            observing = Some(at);
        } else if rest.starts_with("observed") {
            if let Some(start) = observing.take() {
                observe_ms += (at - start) * 1000.0;
            }
        } else if let Some(done) = rest.strip_prefix("cycle done in ") {
            let whole = durations(&format!("cycle done in {done}"), "cycle done in ");
            let operations = done
                .split_once("operations=")
                .and_then(|(_, n)| n.split_whitespace().next()?.parse().ok())
                .unwrap_or(usize::MAX);
            if let Some(whole_ms) = whole.first() {
                out.push(Cycle {
                    whole_ms: *whole_ms,
                    observe_ms,
                    operations,
                });
            }
        }
    }
    out
}

#[test]
#[ignore = "benchmark: run explicitly, see docs/performance.md"]
fn daemon_over_10000_declarations() {
    let scale = Scale::from_env();
    let declarations = scale.n(10_000, 300);
    let (first, more) = (scale.n(10, 5), scale.n(1000, 15));
    let events = scale.n(10, 3);
    let work = repo_with_declarations(declarations);
    let served = tempfile::tempdir().unwrap();
    let bare = work.bare_clone(served.path());
    let git_daemon = GitDaemon::start(served.path());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let port = free_port();
    let path = TendConfig::new(dir.path(), &git_daemon.url("repo.git"))
        .source("path", "\"databases\"")
        .source("interval", "\"1h\"")
        .reconcile("resync", "\"1h\"")
        .reconcile("max_concurrency", "16")
        .sandbox("max_concurrency", "16")
        .sandbox("rate_limit", "10000")
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .server("webhook_secret_file", "\"secret\"")
        // Cycles back to back, each asked for: no coalescing.
        .server("reconcile_min_interval", "\"0s\"")
        .write();
    let daemon = Daemon::start(&path, port, &[]);
    let started = Instant::now();
    daemon.wait_for("the cold cycle", Duration::from_secs(300), || {
        daemon.get("/readyz").is_some_and(|r| r.status == 200)
    });
    println!(
        "cold start ({declarations} creates): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    figure(
        "run: cold start to ready (creates every declaration)",
        format!("{:.1} s", started.elapsed().as_secs_f64()),
        &format!("{declarations} declarations"),
    );
    let pid = daemon.pid();

    // No-change cycles, each asked for through POST /v1/reconcile (a fetch
    // of the unchanged branch and a full cycle of the provider).
    daemon.run_cycles(first);
    let rss_10 = rss_kib(pid);
    daemon.run_cycles(more);
    let rss_1000 = rss_kib(pid);
    let log = daemon.log();
    // Each cycle with its own observation (a cold cycle that made
    // operations observes twice: the counts of the marks differ from the
    // cycles', so they are paired by cycle, never by index).
    let all = cycles_of(&log);
    assert!(
        all.len() > first + more,
        "one cycle per request after the cold one: {} cycles",
        all.len()
    );
    let no_change = &all[all.len() - (first + more)..];
    let busy: Vec<&Cycle> = no_change.iter().filter(|c| c.operations != 0).collect();
    assert!(
        busy.is_empty(),
        "no-change cycles made operations: {} of {}",
        busy.len(),
        no_change.len()
    );
    let cycle_ms: Vec<f64> = no_change.iter().map(|c| c.whole_ms).collect();
    let observe_ms: Vec<f64> = no_change.iter().map(|c| c.observe_ms).collect();
    let own: Vec<f64> = no_change
        .iter()
        .map(|c| c.whole_ms - c.observe_ms)
        .collect();
    for (key, samples) in [
        ("run: no-change cycle, whole", &cycle_ms),
        ("run: no-change cycle, provider observation", &observe_ms),
        (
            "**run: no-change cycle, tend's own (target <= 50 ms)**",
            &own,
        ),
    ] {
        let (v, d) = spread(samples);
        figure(key, v, &d);
    }
    println!("no-change cycle (whole)        {}", stats(&cycle_ms));
    println!("provider observation           {}", stats(&observe_ms));
    println!("tend's own time (target <= 50) {}", stats(&own));
    let polls = durations(&log, "source: fetched in ");
    println!("unchanged poll (fetch call)    {}", stats(&polls[1..]));
    let git_fetch: Vec<f64> = (0..15)
        .map(|_| {
            let clone = dir.path().join("clone");
            if !clone.exists() {
                support::git::git(
                    dir.path(),
                    &[
                        "clone",
                        "-q",
                        "--bare",
                        &git_daemon.url("repo.git"),
                        "clone",
                    ],
                );
            }
            let t = Instant::now();
            let ok = Command::new("git")
                .args(["fetch", "-q", "origin"])
                .current_dir(&clone)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .status()
                .unwrap();
            assert!(ok.success());
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    println!("git fetch no-op (CLI)          {}", stats(&git_fetch));
    let (v, d) = spread(&polls[1..]);
    figure("run: unchanged poll (the agent's fetch)", v, &d);
    let (v, d) = spread(&git_fetch);
    figure("run: `git fetch` no-op, git CLI process", v, &d);
    figure(
        "run: unchanged poll / `git fetch` (target <= 1.5x)",
        format!(
            "{:.2}x",
            median(polls[1..].to_vec()) / median(git_fetch.clone())
        ),
        "medians",
    );
    figure(
        "run: resident memory growth (target within 5 %)",
        format!(
            "{:+.1} %",
            (rss_kib(pid) as f64 / rss_10 as f64 - 1.0) * 100.0
        ),
        &format!(
            "after {first} cycles {rss_10} KiB, after {} more {} KiB",
            more,
            rss_kib(pid)
        ),
    );
    figure(
        "**run: peak resident memory (target <= 64 MB)**",
        format!("{:.1} MiB", hwm_kib(pid) as f64 / 1024.0),
        "VmHWM",
    );
    println!(
        "unchanged poll / git fetch: {:.2}x (target <= 1.5x)",
        median(polls[1..].to_vec()) / median(git_fetch)
    );
    println!(
        "RSS after 10 cycles {} KiB, after 1,010 {} KiB ({:+.1} %; target within 5 %); peak {} KiB (target <= 64 MB)",
        rss_10,
        rss_1000,
        (rss_1000 as f64 / rss_10 as f64 - 1.0) * 100.0,
        hwm_kib(pid)
    );

    // Push → reconcile start through the webhook.
    let mut latencies = Vec::new();
    for i in 0..events {
        work.write(
            "databases/team-07/db-00007.yaml",
            &manifest("db-00007", 200 + i as u32),
        );
        work.commit("raise db-00007");
        work.git(&["push", "-q", &bare.display().to_string(), "main"]);
        let before = daemon.log().matches("cycle starts").count();
        let sent = daemon.signed_webhook(SECRET);
        daemon.wait_for("the cycle start", Duration::from_secs(10), || {
            daemon.log().matches("cycle starts").count() > before
        });
        latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
        daemon.wait_for("the cycle end", Duration::from_secs(30), || {
            daemon.log().matches("cycle done in").count() > before
        });
    }
    println!(
        "webhook → cycle start (target <= 200) {}",
        stats(&latencies)
    );
    let (v, d) = spread(&latencies);
    figure(
        "run: signed webhook to cycle start (target <= 200 ms)",
        v,
        &d,
    );

    drop(daemon);

    // Commit → cycle start through the local repository's watch.
    let local_dir = tempfile::tempdir().unwrap();
    let local_port = free_port();
    let local = TendConfig::new(local_dir.path(), &work.url())
        .source("path", "\"databases\"")
        .source("interval", "\"1h\"")
        .reconcile("resync", "\"1h\"")
        .reconcile("max_concurrency", "16")
        .sandbox("max_concurrency", "16")
        .sandbox("rate_limit", "10000")
        .server("listen", &format!("\"127.0.0.1:{local_port}\""))
        .write();
    let watched = Daemon::start(&local, local_port, &[]);
    watched.wait_for("the cold cycle", Duration::from_secs(300), || {
        watched.get("/readyz").is_some_and(|r| r.status == 200)
    });
    let mut latencies = Vec::new();
    for i in 0..events {
        work.write(
            "databases/team-07/db-00007.yaml",
            &manifest("db-00007", 300 + i as u32),
        );
        let before = watched.log().matches("cycle starts").count();
        let committed = Instant::now();
        work.commit("raise db-00007");
        watched.wait_for("the cycle start", Duration::from_secs(10), || {
            watched.log().matches("cycle starts").count() > before
        });
        latencies.push(committed.elapsed().as_secs_f64() * 1000.0);
        watched.wait_for("the cycle end", Duration::from_secs(30), || {
            watched.log().matches("cycle done in").count() > before
        });
    }
    println!("local commit → cycle start (watch) {}", stats(&latencies));
    let (v, d) = spread(&latencies);
    figure(
        "run: local commit to cycle start (filesystem watch)",
        v,
        &format!("{d}; the git commit included"),
    );
}

/// How soon the running agent sees a change made at the provider behind
/// its back, with no commit and `resync` an hour: the observation cadence
/// (`[reconcile] observe`) bounds it. Each sample edits a database at a
/// random moment of the cadence and times until `/v1/status` shows the
/// out-of-band drift. Target: at most the cadence + 5 s.
#[test]
#[ignore = "benchmark: run explicitly, see docs/performance.md"]
fn drift_is_seen_within_the_observe_cadence() {
    let scale = Scale::from_env();
    let declarations = scale.n(1_000, 50);
    let samples = scale.n(8, 3);
    let cadence = Duration::from_secs(if scale.quick { 3 } else { 15 });
    let work = repo_with_declarations(declarations);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = TendConfig::new(dir.path(), &work.url())
        .source("path", "\"databases\"")
        .source("interval", "\"1h\"")
        .reconcile("resync", "\"1h\"")
        .reconcile("drift_grace", "\"1h\"")
        .reconcile("observe", &format!("\"{}s\"", cadence.as_secs()))
        .sandbox("rate_limit", "10000")
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .write();
    let daemon = Daemon::start(&path, port, &[]);
    daemon.wait_for("ready", Duration::from_secs(300), || {
        daemon.get("/readyz").is_some_and(|r| r.status == 200)
    });
    let mut seen_ms = Vec::new();
    let mut dice = support::dice::Dice(7);
    for i in 0..samples {
        // A random moment of the cadence.
        std::thread::sleep(Duration::from_millis(
            dice.below(cadence.as_millis() as u64),
        ));
        let name = format!("db-{:05}", (i * 7919) % declarations);
        // The database's name: the declaration's, `-` made `_`.
        let database = name.replace('-', "_");
        let limit = 1000 + i;
        let edited = Command::new(env!("CARGO_BIN_EXE_tend"))
            .args([
                "--config",
                &path.display().to_string(),
                "sandbox",
                "edit",
                &database,
            ])
            .args(["--set", &format!("connectionLimit={limit}")])
            .output()
            .unwrap();
        assert!(edited.status.success(), "{edited:?}");
        let edited_at = Instant::now();
        daemon.wait_for("the drift seen", cadence + Duration::from_secs(60), || {
            daemon
                .get(&format!("/v1/status/{name}"))
                .filter(|r| r.status == 200)
                .and_then(|r| serde_json::from_str::<serde_json::Value>(&r.body).ok())
                .is_some_and(|r| {
                    r["drift"]
                        .as_array()
                        .is_some_and(|d| d.iter().any(|x| x["observed"] == limit as u64))
                })
        });
        seen_ms.push(edited_at.elapsed().as_secs_f64() * 1000.0);
    }
    let (v, d) = spread(&seen_ms);
    figure(
        &format!(
            "**run: out-of-band change seen, observe = {}s (target <= {}s)**",
            cadence.as_secs(),
            cadence.as_secs() + 5
        ),
        v,
        &format!("{d}; {declarations} declarations, resync 1h, no commit"),
    );
    println!("drift seen after {}", stats(&seen_ms));
}
