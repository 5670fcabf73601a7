//! Benchmark of `tend validate` and `tend plan` over 10,000 declarations
//! (whole processes, as an operator runs them; prints figures, asserts
//! only correctness). Run with `scripts/bench.sh`, or
//! `cargo nextest run --release --run-ignored only --test bench plan:: --no-capture`.

use crate::support;

use std::process::Command;
use std::time::Instant;

use support::bench::{Scale, figure, spread};
use support::config::TendConfig;
use support::git::repo_with_declarations;

/// Runs `args` with GNU time (peak RSS); wall milliseconds, KiB and
/// stdout.
fn run(args: &[&str], code: i32) -> (f64, u64, String) {
    let t = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "rss-kib %M", env!("CARGO_BIN_EXE_tend")])
        .args(args)
        .env_remove("TEND_LOG")
        .output()
        .expect("GNU time at /usr/bin/time (apt-get install time)");
    let wall = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rss = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("rss-kib "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (wall, rss, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
#[ignore = "benchmark: run explicitly, see docs/performance.md"]
fn validate_and_plan_over_10000_declarations() {
    let scale = Scale::from_env();
    let declarations = scale.n(10_000, 300);
    let runs = scale.n(15, 3);
    let repo = repo_with_declarations(declarations);
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .source("path", "\"databases\"")
        .sandbox("rate_limit", "10000")
        .write()
        .display()
        .to_string();
    let tree = repo.path().join("databases").display().to_string();
    let (mut validate, mut plan, mut rss_v, mut rss_p) = (Vec::new(), Vec::new(), 0, 0);
    for _ in 0..runs {
        let (wall, rss, out) = run(&["validate", &tree], 0);
        assert!(
            out.contains(&format!("{declarations} declarations, 0 errors")),
            "{out}"
        );
        validate.push(wall);
        rss_v = rss_v.max(rss);
        let (wall, rss, out) = run(&["--config", &config, "plan", "--format", "json"], 0);
        // What was timed is the plan asked for: every declaration, each
        // a create into the empty sandbox.
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        let resources = report["resources"].as_array().unwrap();
        assert_eq!(resources.len(), declarations);
        assert!(
            resources.iter().all(|r| r["action"] == "Create"),
            "every declaration planned as a create"
        );
        plan.push(wall);
        rss_p = rss_p.max(rss);
    }
    let (v, d) = spread(&validate);
    figure(
        &format!("`tend validate` of {declarations} files"),
        v,
        &format!("{d}; peak RSS {rss_v} KiB"),
    );
    let (v, d) = spread(&plan);
    figure(
        &format!("`tend plan --format json`, {declarations} declarations, empty sandbox"),
        v,
        &format!("{d}; peak RSS {rss_p} KiB; the parse cache warm after the first run"),
    );
}
