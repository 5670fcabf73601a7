//! Benchmark of the http provider against the reference server (prints
//! figures; asserts only correctness). Run:
//! `TEND_BENCH=full cargo nextest run --release --run-ignored only --test bench http:: --no-capture`

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use support::TendCommand;
use support::bench::{Scale, durations, figure, ms, spread};
use support::config::TendConfig;
use support::git::TestRepo;
use support::reference::ReferenceServer;

fn declarations(repo: &TestRepo, prefix: &str, n: usize) {
    for i in 0..n {
        repo.write(
            &format!("{prefix}/{prefix}-{i:04}.yaml"),
            &format!(
                "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {prefix}-{i:04}\nspec:\n  engine: postgres\n  size: db-small\n  storageGb: {}\n",
                10 + i % 100
            ),
        );
    }
    repo.commit(prefix);
}

fn config(dir: &std::path::Path, repo: &TestRepo, server: &ReferenceServer, path: &str) -> String {
    TendConfig::new(dir, &repo.url())
        .without_section("providers.sandbox")
        .source("path", &format!("\"{path}\""))
        .reconcile("max_concurrency", "8")
        .section("providers.dbaas", "kind", "\"http\"")
        .section(
            "providers.dbaas",
            "endpoint",
            &format!("\"{}\"", server.url()),
        )
        .section("providers.dbaas", "max_concurrency", "8")
        .section("providers.dbaas", "rate_limit", "10000")
        .write()
        .display()
        .to_string()
}

/// `runs` listings of every database at `base`, as any client makes one:
/// page after page (the client's largest page size, the server's limit),
/// each parsed; milliseconds each, in this process.
///
/// Each starts after [`PAUSE`], as the agent's cycles do (they are asked
/// for one after the other, each once the log shows the one before done:
/// the harness looks every 50 ms). Both sides of the ratio then start
/// from the same idle machine: listings run back to back are 15-25 %
/// faster than after a pause (caches and the server's threads warm),
/// which no cycle of a running agent ever is.
fn in_process_listings(base: &str, runs: usize) -> Vec<f64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = tend::testing::provider::tls::http_client_for(base)
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut out = Vec::new();
        for _ in 0..runs {
            tokio::time::sleep(PAUSE).await;
            let t = Instant::now();
            let mut token: Option<String> = None;
            let mut listed = 0;
            loop {
                let url = match &token {
                    Some(t) => format!("{base}/v1/databases?pageSize=1000&pageToken={t}"),
                    None => format!("{base}/v1/databases?pageSize=1000"),
                };
                let body = client.get(url).send().await.unwrap().bytes().await.unwrap();
                let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
                listed += page["items"].as_array().map_or(0, Vec::len);
                match page["nextPageToken"].as_str() {
                    Some(next) if !next.is_empty() => token = Some(next.to_string()),
                    _ => break,
                }
            }
            out.push(ms(t.elapsed()));
            assert!(listed > 0);
        }
        out
    })
}

/// The idle time before each in-process listing: about what the agent has
/// between two cycles in this benchmark (the harness's 50 ms look at the
/// log, less a cycle).
const PAUSE: Duration = Duration::from_millis(40);

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
#[ignore = "benchmark: run explicitly, see docs/performance.md"]
fn plan_over_1000_databases_and_creating_200() {
    let scale = Scale::from_env();
    let (managed, create, runs) = (scale.n(1000, 30), scale.n(200, 10), scale.n(15, 3));
    let repo = TestRepo::new();
    declarations(&repo, "fleet", managed);
    declarations(&repo, "burst", create);

    // Observing 1,000: the server answers pages of 100.
    let server = ReferenceServer::start(&["--page-size", "100"]);
    let dir = tempfile::tempdir().unwrap();
    let fleet = config(dir.path(), &repo, &server, "fleet");
    let made = TendCommand::new(&["--config", &fleet, "apply"]).expect_code(0);
    assert_eq!(
        support::bench::operation_counts(&made.stderr),
        Some((managed, managed)),
        "{}",
        made.stderr
    );
    // The pages, as any client walks them (their tokens, learnt once).
    let mut urls = vec![format!("{}/v1/databases", server.url())];
    loop {
        let last = urls
            .last()
            .unwrap()
            .trim_start_matches(&server.url())
            .to_string();
        let (status, page) = server.request("GET", &last, "");
        assert_eq!(status, 200);
        match page["nextPageToken"].as_str() {
            Some(token) => urls.push(format!("{}/v1/databases?pageToken={token}", server.url())),
            None => break,
        }
    }
    let mut plans = Vec::new();
    let mut observing = Vec::new();
    let mut raw = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let run = TendCommand::new(&["--config", &fleet, "plan", "--format", "json"])
            .env("TEND_LOG", "tend=debug")
            .expect_code(0);
        plans.push(t.elapsed());
        // The listing itself, from the plan's own log (it runs beside the
        // source fetch).
        let listed = durations(&run.stderr, "listed every database ahead in ");
        assert_eq!(listed.len(), 1, "{}", run.stderr);
        observing.push(listed[0]);
        let plan = run.json();
        assert_eq!(plan["summary"]["inSync"], managed, "{}", plan["summary"]);
        // One curl process fetching every page over one connection.
        let mut curl = Command::new("curl");
        curl.args(["-s", "--fail"]);
        for url in &urls {
            curl.args(["-o", "/dev/null", url]);
        }
        let t = Instant::now();
        let out = curl
            .output()
            .expect("cannot run curl (apt-get install curl)");
        raw.push(t.elapsed());
        assert!(out.status.success(), "{out:?}");
    }
    let as_ms = |v: &[Duration]| v.iter().map(|d| ms(*d)).collect::<Vec<_>>();
    let (v, d) = spread(&as_ms(&plans));
    figure(
        &format!("http: `tend plan` over {managed} databases, whole process"),
        v,
        &format!("{d}; pages of 100"),
    );
    let (v, d) = spread(&observing);
    figure(
        &format!("http: `tend plan`'s listing of the {managed} (its observation phase)"),
        v,
        &format!("{d}; from each run's log; beside the source fetch"),
    );
    let (v, d) = spread(&as_ms(&raw));
    figure(
        &format!(
            "http: one `curl` fetching the {} pages, whole process",
            urls.len()
        ),
        v,
        &d,
    );
    let median_of = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    figure(
        "http: listing / raw page fetch",
        format!(
            "{:.2}x",
            median_of(&observing) / (median(raw.clone()).as_secs_f64() * 1000.0)
        ),
        "medians: tend's observation phase against the whole curl process",
    );
    figure(
        "http: plan / raw page fetch (information)",
        format!(
            "{:.2}x",
            median(plans).as_secs_f64() / median(raw).as_secs_f64()
        ),
        "medians: whole processes both (was the target; docs/performance.md)",
    );

    // The target: the running agent's no-change cycle over the same
    // databases against one in-process listing of the same pages (no
    // process start on either side), side by side.
    let port = support::git::free_port();
    let agent_config = TendConfig::new(dir.path(), &repo.url())
        .without_section("providers.sandbox")
        .source("path", "\"fleet\"")
        .source("interval", "\"1h\"")
        .reconcile("resync", "\"1h\"")
        .reconcile("max_concurrency", "8")
        .section("providers.dbaas", "kind", "\"http\"")
        .section(
            "providers.dbaas",
            "endpoint",
            &format!("\"{}\"", server.url()),
        )
        .section("providers.dbaas", "max_concurrency", "8")
        .section("providers.dbaas", "rate_limit", "10000")
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .server("reconcile_min_interval", "\"0s\"")
        .write();
    let daemon = support::daemon::Daemon::start(&agent_config, port, &[]);
    daemon.wait_ready();
    daemon.run_cycles(runs);
    let cycles: Vec<f64> = durations(&daemon.log(), "cycle done in ")
        .into_iter()
        .skip(1)
        .collect();
    drop(daemon);
    let listings = in_process_listings(&server.url(), runs);
    let (v, d) = spread(&cycles);
    figure(
        &format!("http: the running agent's no-change cycle over {managed} databases"),
        v,
        &format!("{d}; each asked for through POST /v1/reconcile"),
    );
    let (v, d) = spread(&listings);
    figure(
        &format!("http: one in-process listing of the {managed} (reqwest + serde_json)"),
        v,
        &format!("{d}; the same pages, one connection"),
    );
    figure(
        "**http: agent cycle / in-process listing (target <= 1.5x)**",
        format!("{:.2}x", median_of(&cycles) / median_of(&listings)),
        "medians",
    );

    // Creating 200 at a server that takes 50 ms per call (and lists up to
    // 1,000 on a page, so listing is one call, as creating is). One run is
    // one sample of a noisy machine: each of `bursts` runs starts from an
    // empty server and an empty state.
    let bursts = scale.n(7, 1);
    let mut took = Vec::new();
    let mut calls = 0;
    for _ in 0..bursts {
        let slow = ReferenceServer::start(&["--page-size", "1000"]);
        slow.faults(json!({"latencyMs": 50}));
        let dir = tempfile::tempdir().unwrap();
        let burst = config(dir.path(), &repo, &slow, "burst");
        let t = Instant::now();
        let run = TendCommand::new(&["--config", &burst, "apply"]).expect_code(0);
        took.push(t.elapsed());
        assert_eq!(
            support::bench::operation_counts(&run.stderr),
            Some((create, create)),
            "{}",
            run.stderr
        );
        assert_eq!(slow.count("creates"), create as u64);
        calls = slow.count("calls");
    }
    let (v, d) = spread(&as_ms(&took));
    figure(
        &format!(
            "**http: create {create} at 50 ms per call, max_concurrency 8 (target <= 1.5 s)**"
        ),
        v,
        &format!(
            "whole `tend apply`; {d}; {calls} API calls a run; the floor is {create} x 50 ms / 8 = {:.0} ms",
            create as f64 * 50.0 / 8.0
        ),
    );
}
