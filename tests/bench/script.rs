//! `scripts/bench.sh quick` runs every benchmark on small workloads and
//! prints the table docs/performance.md shows: the figures keep a command
//! that reproduces them, and it cannot rot unnoticed.

use crate::support;

use std::process::Command;

#[test]
fn the_benchmark_script_prints_every_figure() {
    let out = support::without_package_env(&mut Command::new(
        support::repo_root().join("scripts/bench.sh"),
    ))
    .arg("quick")
    .current_dir(support::repo_root())
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("tend benchmarks (quick), commit "),
        "{stdout}"
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| figure"))
        .collect();
    for needed in [
        "**apply, no change: whole process**",
        "apply, no change: libgit2 start + fetch",
        "**run: no-change cycle, tend's own (target <= 50 ms)**",
        "**run: peak resident memory (target <= 64 MB)**",
        "run: signed webhook to cycle start",
        "source: unchanged poll / `git fetch`",
        "source: unchanged poll, verify on / off",
        "http: plan / raw page fetch (information)",
        "**http: agent cycle / in-process listing (target <= 1.5x)**",
        "**postgres: plan / psql (target <= 2x)**",
        "`tend validate` of 300 files",
        "**scale: no-change cycle of all 10 providers, tend's own (target <= 400 ms)**",
        "scale: no-change cycle of all 10 providers, wall",
        "**scale: `tend run` peak resident memory (target <= 400 MB)**",
        "**scale: one-file commit, webhook to status commit and report written (target <= 1 s)**",
    ] {
        assert!(
            rows.iter().any(|r| r.starts_with(&format!("| {needed}"))),
            "no row for {needed}:\n{stdout}"
        );
    }
    // Every row has a value.
    for row in &rows {
        let cells: Vec<&str> = row.split(" | ").collect();
        assert!(cells.len() >= 3 && !cells[1].trim().is_empty(), "{row}");
    }
}
