//! Benchmark of one agent over 100,000 declarations spread over 10
//! sandbox providers (prints figures; asserts what its runs did).
//! Run: `TEND_BENCH=full cargo nextest run --release --run-ignored only --test bench scale:: --no-capture`
//! (`scripts/bench.sh full` runs it with the others; `TEND_BENCH_REQUESTS=N`
//! makes N no-change requests instead of 1,000; `TEND_BENCH_DECLARATIONS=N`
//! another fleet size, for profiling; `TEND_BENCH_LOG=FILE` keeps the
//! agent's log). Figures go to
//! docs/performance.md.

use crate::support;

use std::time::{Duration, Instant};

use support::TendCommand;
use support::bench::{Scale, durations, figure, spread};
use support::config::TendConfig;
use support::daemon::Daemon;
use support::git::{GitDaemon, TestRepo, free_port, git_if_any, status_file};

const SECRET: &str = "bench-secret";
const PROVIDERS: usize = 10;

fn declaration(i: usize, limit: usize) -> String {
    format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: db-{i:06}\nspec:\n  provider: p{}\n  connectionLimit: {limit}\n",
        i % PROVIDERS
    )
}

/// A count from the environment variable `name`, if set.
fn env_count(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|n| n.parse().ok())
}

fn path_of(i: usize) -> String {
    format!("fleet/p{}/db-{i:06}.yaml", i % PROVIDERS)
}

/// The CPU time process `pid` has used, user and system, in
/// milliseconds: the less noisy measure of work where wall times move
/// with the machine's other load.
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's name, which may hold spaces: state is field 3,
    // utime and stime fields 14 and 15.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks * 1000.0 / per_second
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Counts the agent's finished cycles (all, and those that ran
/// operations) from its log, reading only what was appended since the
/// last count: the cold start logs a line per database created (17 MB at
/// 100,000), and reading it whole at every poll took the benchmark's
/// process half a core beside the agent it measures.
struct CycleCounter {
    log: std::path::PathBuf,
    read: u64,
    /// A line not yet ended.
    partial: Vec<u8>,
    done: usize,
    busy: usize,
    /// The cycles' wall times, summed (ms).
    whole_ms: f64,
    /// The cycles' provider observations ("observing" to "observed"),
    /// summed (ms). Two cycles run at once and their lines interleave,
    /// unmarked by provider; each line says how far into its own cycle it
    /// is, so the sum of the "observed" marks less that of the
    /// "observing" marks is the sum of the observations however they
    /// pair.
    observe_ms: f64,
}

impl CycleCounter {
    fn new(daemon: &Daemon) -> Self {
        CycleCounter {
            log: daemon.log.clone(),
            read: 0,
            partial: Vec::new(),
            done: 0,
            busy: 0,
            whole_ms: 0.0,
            observe_ms: 0.0,
        }
    }

    /// (cycles done, of which ran operations) so far.
    fn count(&mut self) -> (usize, usize) {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut file) = std::fs::File::open(&self.log) else {
            return (self.done, self.busy);
        };
        file.seek(SeekFrom::Start(self.read)).unwrap();
        let mut more = Vec::new();
        self.read += file.read_to_end(&mut more).unwrap() as u64;
        self.partial.extend_from_slice(&more);
        let ended = self
            .partial
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |at| at + 1);
        let lines: Vec<u8> = self.partial.drain(..ended).collect();
        let text = String::from_utf8_lossy(&lines);
        for line in text.lines() {
            if line.contains("cycle done in") {
                self.done += 1;
                self.busy += usize::from(!line.contains("operations=0"));
            }
        }
        let sum = |message: &str| durations(&text, message).iter().sum::<f64>();
        self.whole_ms += sum("cycle done in ");
        self.observe_ms += sum("observed, ") - sum("observing, ");
        (self.done, self.busy)
    }

    /// tend's own time in the cycles counted so far: their wall times less
    /// their provider observations (the sandbox runs in the agent's
    /// process; in production a provider's listing is its server's time).
    fn own_ms(&self) -> f64 {
        self.whole_ms - self.observe_ms
    }
}

#[test]
#[ignore = "benchmark: run explicitly, see docs/performance.md"]
fn one_agent_over_100000_declarations_on_10_providers() {
    let scale = Scale::from_env();
    // `TEND_BENCH_DECLARATIONS`: another fleet size (for profiling).
    let n = env_count("TEND_BENCH_DECLARATIONS").unwrap_or(scale.n(100_000, 2_000));
    // `TEND_BENCH_REQUESTS`: fewer no-change requests than the target's
    // 1,000 (each is a cycle of every provider), for a shorter run.
    let more = env_count("TEND_BENCH_REQUESTS").unwrap_or(scale.n(1000, 5));
    let first = scale.n(10, 3);
    let events = scale.n(10, 2);

    let work = TestRepo::new();
    for i in 0..n {
        work.write(&path_of(i), &declaration(i, 10 + i % 500));
    }
    work.commit(&format!("{n} declarations"));
    let served = tempfile::tempdir().unwrap();
    let bare = work.bare_clone(served.path());
    let git_daemon = GitDaemon::start_writable(served.path());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let port = free_port();
    let mut config = TendConfig::new(dir.path(), &git_daemon.url("repo.git"))
        .without_section("providers.sandbox")
        .source("path", "\"fleet\"")
        .source("interval", "\"1h\"")
        .reconcile("resync", "\"1h\"")
        .reconcile("max_concurrency", "64")
        .status("branch", "\"tend-status\"")
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .server("webhook_secret_file", "\"secret\"")
        .server("reconcile_min_interval", "\"0s\"");
    for p in 0..PROVIDERS {
        let section = format!("providers.p{p}");
        config = config
            .section(&section, "kind", "\"sandbox\"")
            .section(&section, "max_concurrency", "64")
            .section(&section, "rate_limit", "10000");
    }
    let latest_json = config.state_dir().join("reports").join("latest.json");
    let sampled = config.state_dir().join("source/repo.git/objects/17");
    let config = config.write();
    let config_arg = config.display().to_string();

    // `tend validate` of every file, whole process.
    let t = Instant::now();
    let validated = TendCommand::new(&[
        "--config",
        &config_arg,
        "validate",
        "--format",
        "json",
        &work.path().join("fleet").display().to_string(),
    ])
    .expect_code(0);
    let took = t.elapsed();
    assert_eq!(validated.json()["declarations"], n, "{}", validated.stdout);
    figure(
        &format!("**scale: `tend validate` of {n} files (target <= 5 s)**"),
        format!("{:.2} s", took.as_secs_f64()),
        "whole process",
    );

    // Cold start: every database created.
    let daemon = Daemon::start(&config, port, &[]);
    let started = Instant::now();
    daemon.wait_for("the cold cycle", Duration::from_secs(1800), || {
        daemon.get("/readyz").is_some_and(|r| r.status == 200)
    });
    figure(
        &format!("**scale: cold start to ready, {n} creates (target <= 120 s)**"),
        format!("{:.1} s", started.elapsed().as_secs_f64()),
        &format!("{PROVIDERS} sandbox providers"),
    );
    let pid = daemon.pid();
    // Every provider's first cycle done (ready says the first snapshot is
    // reconciled).
    let counter = std::cell::RefCell::new(CycleCounter::new(&daemon));
    let cycles_done = || counter.borrow_mut().count();
    daemon.wait_for(
        "every provider's cold cycle",
        Duration::from_secs(600),
        || cycles_done().0 >= PROVIDERS,
    );
    let (_, busy) = cycles_done();
    assert!(busy >= 1, "the cold cycles created nothing");
    // The no-change cycles are measured once the cold start's status is
    // written: the status writer commits 100,000 files after the cold
    // cycles (tens of seconds on two cores), and requests made meanwhile
    // time that commit as much as their own cycles. Every provider's
    // cycle is one commit of its whole part, so one file of each shows it.
    let cold = work.head();
    daemon.wait_for(
        "the cold start's status on the status branch",
        Duration::from_secs(900),
        || {
            (n.saturating_sub(PROVIDERS)..n).all(|i| {
                let file = format!("tend-status:{}", status_file(&format!("db-{i:06}")));
                git_if_any(&bare, &["show", &file]).is_some_and(|f| f.contains(&cold))
            })
        },
    );
    // The cold start's status commits leave a loose object per resource
    // in the Git cache: the agent packs them on a thread of its own (two
    // seconds of a core per commit at 100,000), and the no-change cycles
    // are timed once none is due (as Git estimates it: at most 26 loose
    // objects in `objects/17`).
    daemon.wait_for(
        "the Git cache packed after the cold start",
        Duration::from_secs(600),
        || std::fs::read_dir(&sampled).map_or(0, |d| d.count()) * 256 <= 6_700,
    );
    let packs: Vec<String> = daemon
        .log()
        .lines()
        .filter_map(|l| {
            l.split_once("source: packed ")
                .map(|(_, what)| what.to_string())
        })
        .collect();
    figure(
        "scale: the Git cache packed during the cold start",
        format!("{} packs", packs.len()),
        &packs.join("; "),
    );
    std::thread::sleep(Duration::from_secs(2));

    // No-change cycles: each request runs every provider's cycle. Each
    // gives its wall time and tend's own time, summed over the providers'
    // cycles (two run at once: the sum is the work, not the wait).
    let own_so_far = || counter.borrow().own_ms();
    let run = |count: usize| -> Vec<(f64, f64)> {
        (0..count)
            .map(|_| {
                let (before, _) = cycles_done();
                let own_before = own_so_far();
                let t = Instant::now();
                let answer = daemon.request("POST", "/v1/reconcile", &[], b"").unwrap();
                assert_eq!(answer.status, 202, "{}", answer.body);
                daemon.wait_for("every provider's cycle", Duration::from_secs(120), || {
                    cycles_done().0 >= before + PROVIDERS
                });
                let wall = t.elapsed().as_secs_f64() * 1000.0;
                (wall, own_so_far() - own_before)
            })
            .collect()
    };
    let (_, busy_before) = cycles_done();
    let mut requests = run(first);
    let rss_first = status_kib(pid, "VmRSS:");
    let cpu_before = cpu_ms(pid);
    requests.extend(run(more));
    let cpu_per_request = (cpu_ms(pid) - cpu_before) / more as f64;
    let rss_more = status_kib(pid, "VmRSS:");
    let (_, busy_after) = cycles_done();
    assert_eq!(busy_after, busy_before, "no-change cycles ran operations");
    let walls: Vec<f64> = requests.iter().map(|(wall, _)| *wall).collect();
    let own: Vec<f64> = requests.iter().map(|(_, own)| *own).collect();
    let (v, d) = spread(&own);
    figure(
        &format!(
            "**scale: no-change cycle of all {PROVIDERS} providers, tend's own (target <= 400 ms)**"
        ),
        v,
        &format!(
            "{d}; the {PROVIDERS} cycles' wall times less their provider observations, summed"
        ),
    );
    figure(
        &format!("scale: no-change cycle of all {PROVIDERS} providers, the agent's CPU time"),
        format!("{cpu_per_request:.1} ms"),
        &format!(
            "mean of {more} requests; every thread of the process: the cycles, the sandbox's listings, the status writer"
        ),
    );
    let (v, d) = spread(&walls);
    figure(
        &format!("scale: no-change cycle of all {PROVIDERS} providers, wall"),
        v,
        &format!("{d}; from POST /v1/reconcile to the last provider's cycle done"),
    );
    figure(
        "scale: resident memory growth over the no-change cycles (target within 5 %)",
        format!(
            "{:+.1} %",
            (rss_more as f64 / rss_first as f64 - 1.0) * 100.0
        ),
        &format!("after {first} requests {rss_first} KiB, after {more} more {rss_more} KiB"),
    );

    // One file changed: pushed, the webhook, then the cycle, the report
    // and the status branch.
    // The status branch's first commit (the cold start's report) may
    // still be on its way: each event is timed from a branch that exists.
    let tip = || git_if_any(&bare, &["rev-parse", "-q", "--verify", "tend-status"]);
    daemon.wait_for(
        "the status branch's first commit",
        Duration::from_secs(300),
        || tip().is_some(),
    );
    // The report files' `latest.json` names its source commit in its
    // first lines: read those alone (the file is some 30 MB).
    let report_names = |commit: &str| {
        use std::io::Read;
        let mut head = [0u8; 1024];
        let read = std::fs::File::open(&latest_json)
            .and_then(|mut f| f.read(&mut head))
            .unwrap_or(0);
        String::from_utf8_lossy(&head[..read]).contains(&format!("\"commit\": \"{commit}\""))
    };
    let mut reconciled = Vec::new();
    let mut committed = Vec::new();
    for e in 0..events {
        let i = 7 + e * PROVIDERS;
        work.write(&path_of(i), &declaration(i, 900 + e));
        work.commit("one database changed");
        work.git(&["push", "-q", &bare.display().to_string(), "main"]);
        let commit = work.head();
        let before = tip();
        // The changed resource's own status file decided from the new
        // commit: another provider's report naming the commit first is
        // not this change reconciled.
        let file = format!("tend-status:{}", status_file(&format!("db-{i:06}")));
        let sent = daemon.signed_webhook(SECRET);
        let at_commit = std::cell::Cell::new(None);
        let at_report = std::cell::Cell::new(None);
        support::eventually(
            "the status commit and the report",
            Duration::from_secs(60),
            || {
                if at_commit.get().is_none()
                    && tip() != before
                    && git_if_any(&bare, &["show", &file]).is_some_and(|f| f.contains(&commit))
                {
                    at_commit.set(Some(sent.elapsed()));
                }
                if at_report.get().is_none() && report_names(&commit) {
                    at_report.set(Some(sent.elapsed()));
                }
                at_commit.get().zip(at_report.get())
            },
            // Which of the two is missing, and what the branch and the
            // report files said instead.
            || {
                let head = std::fs::read(&latest_json).unwrap_or_default();
                format!(
                    "commit {commit}: status commit seen {:?}, report seen {:?}
                     --- tip {:?} (before the webhook {before:?}), {file}:
{}
                     --- latest.json's first 1 KB:
{}
--- log
{}",
                    at_commit.get(),
                    at_report.get(),
                    tip(),
                    git_if_any(&bare, &["show", &file]).unwrap_or_default(),
                    String::from_utf8_lossy(&head[..head.len().min(1024)]),
                    daemon.log()
                )
            },
        );
        let (at_commit, at_report) = (at_commit.get().unwrap(), at_report.get().unwrap());
        committed.push(at_commit.as_secs_f64() * 1000.0);
        reconciled.push(at_commit.max(at_report).as_secs_f64() * 1000.0);
    }
    // A commit's tree is listed over the last one's: only the subtrees on
    // the changed file's path are read, not the fleet's every directory.
    let log = daemon.log();
    assert!(
        log.contains("files listed over the last tree's"),
        "no commit's tree was listed over the last: {}",
        log.lines()
            .filter(|l| l.contains("source:"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let (v, d) = spread(&reconciled);
    let (commit_v, commit_d) = spread(&committed);
    figure(
        "**scale: one-file commit, webhook to status commit and report written (target <= 1 s)**",
        v,
        &format!(
            "{d}; the cycle done, the report files and the status branch written (the status commit alone: {commit_v}, {commit_d})"
        ),
    );
    figure(
        "**scale: `tend run` peak resident memory (target <= 400 MB)**",
        format!("{:.1} MiB", status_kib(pid, "VmHWM:") as f64 / 1024.0),
        "VmHWM",
    );
    let metrics = daemon.get("/metrics").unwrap();
    figure(
        "scale: /metrics (target < 100 KB)",
        format!("{:.1} KB", metrics.body.len() as f64 / 1000.0),
        "bytes of one scrape",
    );
    let html = daemon.get("/").unwrap();
    figure(
        "scale: the HTML report (target <= 5 MB)",
        format!("{:.2} MB", html.body.len() as f64 / 1e6),
        "GET /",
    );
    // `TEND_BENCH_LOG=FILE`: the agent's log (debug), for a breakdown.
    if let Ok(path) = std::env::var("TEND_BENCH_LOG") {
        std::fs::write(path, daemon.log()).unwrap();
    }
    drop(daemon);

    // `tend plan`, whole process, once the agent stopped.
    let mut plans = Vec::new();
    for _ in 0..scale.n(3, 1) {
        let t = Instant::now();
        let plan =
            TendCommand::new(&["--config", &config_arg, "plan", "--format", "json"]).expect_code(0);
        plans.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(plan.json()["summary"]["total"], n);
    }
    let (v, d) = spread(&plans);
    figure(
        &format!("**scale: `tend plan` over {n}, whole process (target <= 5 s)**"),
        v,
        &d,
    );
}
