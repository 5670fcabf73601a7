//! Benchmark of the Git source (prints figures; asserts only correctness).
//! Run: `cargo nextest run --release --run-ignored only --test bench source:: --no-capture`
//! Figures go to docs/performance.md.

use crate::support;

use std::time::{Duration, Instant, SystemTime};

use support::git::{GitDaemon, git, manifest, repo_with_declarations};
use tend::testing::source::Source;
use tend::testing::source::auth::Credentials;
use tend::testing::source::tracker::SourceSettings;

use support::bench::{Scale, figure, spread};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn settings_for(url: &str) -> SourceSettings {
    SourceSettings {
        url: url.to_string(),
        branch: "main".into(),
        path: "databases".into(),
        depth: None,
        allow_rewind: false,
        credentials: Credentials::default(),
        trust: Default::default(),
    }
}

#[test]
#[ignore = "benchmark: run explicitly, see docs/performance.md"]
fn source_with_10000_declarations() {
    let scale = Scale::from_env();
    let declarations = scale.n(10_000, 300);
    let repo = repo_with_declarations(declarations);
    let served = tempfile::tempdir().unwrap();
    let bare = repo.bare_clone(served.path());
    let daemon = GitDaemon::start(served.path());
    let url = daemon.url("repo.git");
    let settings = settings_for(&url);

    let state = tempfile::tempdir().unwrap();
    let mut source = Source::open(
        state.path(),
        settings,
        tend::testing::journal::Access::Writer,
    )
    .unwrap();
    let started = Instant::now();
    let cold = source.poll(SystemTime::now());
    let cold_time = started.elapsed();
    assert!(cold.failure.is_none(), "{:?}", cold.failure);
    assert_eq!(
        cold.snapshot
            .as_ref()
            .unwrap()
            .declarations
            .declarations
            .len(),
        declarations
    );
    assert_eq!(source.parse_count(), declarations as u64);

    let unchanged: Vec<Duration> = (0..15)
        .map(|_| {
            let t = Instant::now();
            assert!(!source.poll(SystemTime::now()).changed);
            t.elapsed()
        })
        .collect();
    assert_eq!(source.parse_count(), declarations as u64);

    let mut one_change = Vec::new();
    for round in 0..5 {
        repo.write(
            "databases/team-07/db-00007.yaml",
            &manifest("db-00007", 1000 + round),
        );
        repo.commit("one change");
        repo.git(&["push", "-q", &format!("file://{}", bare.display()), "main"]);
        let before = source.parse_count();
        let t = Instant::now();
        assert!(source.poll(SystemTime::now()).changed);
        one_change.push(t.elapsed());
        assert_eq!(
            source.parse_count(),
            before + 1,
            "one changed file parses one file"
        );
    }

    let clone_dir = tempfile::tempdir().unwrap();
    git(clone_dir.path(), &["clone", "-q", &url, "c"]);
    let checkout = clone_dir.path().join("c");
    let cli: Vec<Duration> = (0..15)
        .map(|_| {
            let t = Instant::now();
            git(&checkout, &["fetch", "-q", "origin"]);
            t.elapsed()
        })
        .collect();

    // The same branch with `verify = "ssh"`: a signed head, then unchanged
    // polls interleaved with the unverified source's (the same minute of
    // the machine for both).
    let keys = tempfile::tempdir().unwrap();
    let key = support::sshd::new_key(&keys.path().join("signer"), "bench signer");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let signers = keys.path().join("allowed_signers");
    std::fs::write(&signers, format!("bench@example.test {public}")).unwrap();
    let sign = |message: &str| {
        repo.git(&[
            "-c",
            "gpg.format=ssh",
            "-c",
            &format!("user.signingkey={}", key.display()),
            "commit",
            "-q",
            "--allow-empty",
            "-S",
            "-m",
            message,
        ]);
        repo.git(&["push", "-q", &format!("file://{}", bare.display()), "main"]);
    };
    sign("signed head");
    let mut verified_settings = settings_for(&url);
    verified_settings.trust = tend::testing::source::trust::Trust {
        policy: tend::testing::source::trust::TrustPolicy::Ssh(std::sync::Arc::new(
            tend::testing::source::trust::AllowedSigners::load(&signers).unwrap(),
        )),
        verify_all: false,
    };
    let verified_state = tempfile::tempdir().unwrap();
    let mut verified = Source::open(
        verified_state.path(),
        verified_settings,
        tend::testing::journal::Access::Writer,
    )
    .unwrap();
    let first = verified.poll(SystemTime::now());
    assert!(first.failure.is_none(), "{:?}", first.failure);
    assert!(source.poll(SystemTime::now()).changed);
    let (mut plain_polls, mut verified_polls) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let t = Instant::now();
        assert!(!source.poll(SystemTime::now()).changed);
        plain_polls.push(t.elapsed());
        let t = Instant::now();
        let outcome = verified.poll(SystemTime::now());
        assert!(!outcome.changed && outcome.failure.is_none());
        verified_polls.push(t.elapsed());
    }
    let mut verified_change = Vec::new();
    for round in 0..5 {
        repo.write(
            "databases/team-07/db-00007.yaml",
            &manifest("db-00007", 2000 + round),
        );
        repo.git(&["add", "-A"]);
        sign("signed change");
        let t = Instant::now();
        let outcome = verified.poll(SystemTime::now());
        assert!(
            outcome.changed && outcome.failure.is_none(),
            "{:?}",
            outcome.failure
        );
        verified_change.push(t.elapsed());
    }

    let as_ms = |v: &[Duration]| v.iter().map(|d| support::bench::ms(*d)).collect::<Vec<_>>();
    figure(
        "source: cold snapshot (clone + parse)",
        format!("{:.2} s", cold_time.as_secs_f64()),
        &format!("{declarations} declarations, in-process"),
    );
    let (v, d) = spread(&as_ms(&unchanged));
    figure(
        "source: unchanged poll (in-process fetch and compare)",
        v,
        &d,
    );
    let (v, d) = spread(&as_ms(&one_change));
    figure(
        "source: one changed file (fetch, tree walk, 1 parse)",
        v,
        &d,
    );
    let (v, d) = spread(&as_ms(&cli));
    figure("source: `git fetch` no-op, git CLI process", v, &d);
    let (v, d) = spread(&as_ms(&verified_polls));
    figure(
        "source: unchanged poll, verify = \"ssh\"",
        v,
        &format!("{d}; interleaved with as many unverified polls"),
    );
    let (v, d) = spread(&as_ms(&plain_polls));
    figure(
        "source: unchanged poll, verify = \"none\" (interleaved)",
        v,
        &d,
    );
    figure(
        "source: unchanged poll, verify on / off",
        format!(
            "{:.2}x",
            median(verified_polls).as_secs_f64() / median(plain_polls).as_secs_f64()
        ),
        "medians of the interleaved polls",
    );
    let (v, d) = spread(&as_ms(&verified_change));
    figure(
        "source: one changed file, signed head checked (verify = \"ssh\")",
        v,
        &d,
    );
    let (unchanged, one_change, cli) = (median(unchanged), median(one_change), median(cli));
    figure(
        "source: unchanged poll / `git fetch` (target <= 1.5x)",
        format!("{:.2}x", unchanged.as_secs_f64() / cli.as_secs_f64()),
        "in-process poll against a CLI process: the running agent's mode",
    );
    println!("declarations:                 {declarations}");
    println!("cold snapshot (clone+parse):  {cold_time:?}");
    println!("unchanged poll (median of 15): {unchanged:?}");
    println!("one-file change (median of 5): {one_change:?} (1 file parsed)");
    println!("git fetch no-op (median of 15): {cli:?}");
    println!(
        "unchanged poll / git fetch:   {:.2}x",
        unchanged.as_secs_f64() / cli.as_secs_f64()
    );
}
