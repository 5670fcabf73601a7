//! Replays the fuzz targets' committed corpus (tests/fuzz/corpus/) through
//! the same checks the libFuzzer targets make (tests/fuzz/checks.rs), so
//! every input a fuzzer kept, and every crash turned regression, is
//! checked on every run. Longer fuzzing: docs/testing.md.

use crate::support;

#[path = "../fuzz/checks.rs"]
mod checks;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = support::repo_root().join("tests/fuzz/corpus").join(target);
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        check(&std::fs::read(&path).unwrap());
        files += 1;
    }
    assert!(files > 0, "no corpus in {}", dir.display());
}

#[test]
fn declaration_corpus() {
    replay("declaration", checks::declaration);
}

#[test]
fn config_corpus() {
    replay("config", checks::config);
}

#[test]
fn parse_cache_corpus() {
    replay("parse_cache", checks::parse_cache);
}

#[test]
fn webhook_corpus() {
    replay("webhook", checks::webhook);
}
