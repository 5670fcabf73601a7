//! Benchmark of the PostgreSQL provider (prints figures; asserts only
//! correctness). Run:
//! `cargo nextest run --release --run-ignored only --test bench postgres:: --no-capture`

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::TendCommand;
use support::git::TestRepo;
use support::postgres::Postgres;

fn config(dir: &std::path::Path, repo: &TestRepo, pg: &Postgres, concurrency: usize) -> String {
    let path = dir.join("tend.toml");
    std::fs::write(
        &path,
        format!(
            "agent_id = \"bench\"\nstate_dir = \"state\"\n[source]\nurl = \"{}\"\n[reconcile]\nmax_concurrency = {concurrency}\n[providers.main]\nkind = \"postgres\"\nurl = \"{}\"\nmax_concurrency = {concurrency}\nrate_limit = 10000\n",
            repo.url(),
            pg.url()
        ),
    )
    .unwrap();
    path.display().to_string()
}

/// Runs `command`, which must exit `code` (psql's 2 is a failed
/// connection, never a result to time), and returns how long it took.
fn timed(mut command: Command, code: i32) -> Duration {
    let t = Instant::now();
    let out = command.output().unwrap();
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn declarations(repo: &TestRepo, prefix: &str, n: usize) {
    for i in 0..n {
        repo.write(
            &format!("{prefix}/{prefix}-{i:04}.yaml"),
            &format!("apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {prefix}-{i:04}\nspec:\n  connectionLimit: {}\n", i % 100),
        );
    }
    repo.commit(prefix);
}

#[test]
#[ignore = "benchmark: run explicitly, see docs/performance.md"]
fn plan_over_1000_databases_and_creating_200() {
    let scale = support::bench::Scale::from_env();
    let (create, managed, runs) = (scale.n(200, 10), scale.n(1000, 30), scale.n(15, 3));
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();

    // Creating 200: tend apply (bounded concurrency) against a serial createdb loop.
    let repo = TestRepo::new();
    declarations(&repo, "c", create);
    let cfg = config(dir.path(), &repo, &pg, 8);
    let mut apply = Command::new(env!("CARGO_BIN_EXE_tend"));
    apply
        .args(["--config", &cfg, "apply"])
        .env("TEND_LOG", "warn");
    let tend_create = timed(apply, 0);
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_database WHERE datname LIKE 'c_%'"),
        create.to_string()
    );
    let createdb = pg.path().join("createdb-loop.sh");
    std::fs::write(
        &createdb,
        format!(
            "for i in $(seq 1 {create}); do createdb -h 127.0.0.1 -p {} -U postgres serial_$i || exit 1; done\n",
            pg.port
        ),
    )
    .unwrap();
    let mut serial = Command::new("sh");
    serial.arg(&createdb);
    let serial_create = timed(serial, 0);
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_database WHERE datname LIKE 'serial_%'"),
        create.to_string()
    );

    // 1,000 managed databases: tend plan against one raw catalog query.
    declarations(&repo, "p", managed - create);
    let mut apply = Command::new(env!("CARGO_BIN_EXE_tend"));
    apply
        .args(["--config", &cfg, "apply"])
        .env("TEND_LOG", "warn");
    timed(apply, 0);
    assert_eq!(
        pg.psql("SELECT count(*) FROM tend.databases"),
        managed.to_string()
    );
    // Whole processes, interleaved (the machine's load hits both alike),
    // 15 runs each.
    let (mut plans, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let run = Instant::now();
        TendCommand::new(&["--config", &cfg, "plan", "--format", "json"]).expect_code(0);
        plans.push(run.elapsed());
        let mut psql = Command::new("psql");
        psql.args([
            "-X", "-q", "-h", "127.0.0.1", "-p", &pg.port.to_string(), "-U", "postgres", "-d", "postgres", "-Atc",
            "SELECT d.datname, r.rolname, pg_encoding_to_char(d.encoding), d.datcollate, d.datconnlimit, d.datallowconn, \
             sd.description, s.setconfig FROM pg_database d JOIN pg_roles r ON r.oid = d.datdba \
             LEFT JOIN pg_shdescription sd ON sd.objoid = d.oid LEFT JOIN pg_db_role_setting s ON s.setdatabase = d.oid",
        ]);
        raw.push(timed(psql, 0));
    }
    let spread = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        (v[0], v[v.len() - 1])
    };
    println!(
        "plan over 1,000: spread tend {:?}, psql {:?}",
        spread(&plans),
        spread(&raw)
    );
    let as_ms = |v: &[Duration]| v.iter().map(|d| support::bench::ms(*d)).collect::<Vec<_>>();
    let (v, d) = support::bench::spread(&as_ms(&plans));
    support::bench::figure(
        &format!("postgres: `tend plan` over {managed} managed databases, whole process"),
        v,
        &d,
    );
    let (v, d) = support::bench::spread(&as_ms(&raw));
    support::bench::figure(
        "postgres: one raw `psql` catalog query, whole process",
        v,
        &d,
    );
    support::bench::figure(
        &format!("postgres: create {create}, `tend apply` (max_concurrency 8)"),
        format!("{:.2} s", tend_create.as_secs_f64()),
        &format!(
            "a serial createdb loop: {:.2} s ({:.2}x)",
            serial_create.as_secs_f64(),
            tend_create.as_secs_f64() / serial_create.as_secs_f64()
        ),
    );
    let (plan, raw) = (median(plans), median(raw));
    support::bench::figure(
        "**postgres: plan / psql (target <= 2x)**",
        format!("{:.2}x", plan.as_secs_f64() / raw.as_secs_f64()),
        "medians",
    );
    println!(
        "create 200: tend apply (concurrency 8) {tend_create:?}, serial createdb loop {serial_create:?}, ratio {:.2}x",
        tend_create.as_secs_f64() / serial_create.as_secs_f64()
    );
    println!(
        "plan over 1,000: tend plan {plan:?} (median of 15), raw psql catalog query {raw:?}, ratio {:.2}x",
        plan.as_secs_f64() / raw.as_secs_f64()
    );
}
