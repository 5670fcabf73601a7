//! The documentation's commands, run: every ```console and ```sh block in
//! README.md and docs/ runs against the real binary in a scratch copy of
//! this repository's examples, and a console block's output must match
//! what it shows. A block that cannot run here says so, with the reason,
//! in an HTML comment just before it (`<!-- doctest: skip: … -->`); a
//! block may carry hidden setup (`<!-- doctest: setup … -->`), or leave
//! out one line that cannot run here, with the reason
//! (`<!-- doctest: without `LINE` reason -->`).
//!
//! Matching: each shown output line must match the next real line; `…` in
//! a line matches any text, and a line that is only `…` matches any
//! number of lines. `cargo run --` in a block means the built `tend`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::git::git;
use support::repo_root;

/// A fenced block with what precedes it.
#[derive(Debug)]
struct Block {
    file: String,
    line: usize,
    lang: String,
    body: Vec<String>,
    skip: Option<String>,
    setup: Option<String>,
}

fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "docs/runbooks"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

/// The console and sh blocks of `path`, with their directives.
fn blocks(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let file = path
        .strip_prefix(repo_root())
        .unwrap()
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(lang) = trimmed.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let lang = lang.trim().to_string();
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push(
                lines[i]
                    .get(indent..)
                    .unwrap_or(lines[i].trim_start())
                    .to_string(),
            );
            i += 1;
        }
        i += 1;
        if lang != "console" && lang != "sh" {
            continue;
        }
        // The directive: an HTML comment ending on the line before the
        // fence (blank lines between are allowed).
        let mut end = start;
        while end > 0 && lines[end - 1].trim().is_empty() {
            end -= 1;
        }
        let (mut skip, mut setup, mut without) = (None, None, None);
        if end > 0 && lines[end - 1].trim().ends_with("-->") {
            let mut open = end - 1;
            while !lines[open].contains("<!--") && open > 0 {
                open -= 1;
            }
            let comment = lines[open..end].join("\n");
            let inner = comment
                .trim()
                .trim_start_matches("<!--")
                .trim_end_matches("-->")
                .trim();
            if let Some(reason) = inner.strip_prefix("doctest: skip:") {
                skip = Some(reason.trim().to_string());
            } else if let Some(script) = inner.strip_prefix("doctest: setup") {
                setup = Some(script.trim().to_string());
            } else if let Some(rest) = inner.strip_prefix("doctest: without `") {
                let (line, reason) = rest.split_once('`').unwrap_or((rest, ""));
                assert!(
                    !reason.trim().is_empty(),
                    "{file}:{}: `doctest: without` must say why",
                    start + 1
                );
                without = Some(line.to_string());
            }
        }
        out.push(Block {
            file: file.clone(),
            line: start + 1,
            lang,
            body: body
                .into_iter()
                .filter(|l| without.as_deref() != Some(l.trim()))
                .collect(),
            skip,
            setup,
        });
    }
    out
}

/// A scratch copy of the repository's examples as a Git repository of its
/// own (tend reads commits, never a working tree), with `tend` on `PATH`.
struct Workspace {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Workspace {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = repo_root();
        let copy = Command::new("cp")
            .arg("-r")
            .arg(root.join("examples"))
            .arg(root.join("docs"))
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(copy.success());
        git(dir.path(), &["init", "-q", "-b", "main"]);
        git(dir.path(), &["add", "."]);
        git(dir.path(), &["commit", "-q", "-m", "examples"]);
        let bin = dir.path().join(".bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tend"), bin.join("tend")).unwrap();
        Workspace { dir, bin }
    }

    /// Runs `script` with bash; stdout and stderr interleaved as a
    /// terminal shows them.
    fn run(&self, script: &str) -> (bool, String) {
        let script = script.replace("cargo run -- ", "tend ");
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("exec 2>&1\n{script}"))
            .current_dir(self.dir.path())
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("TEND_CONFIG", self.dir.path().join("examples/tend.toml"))
            .env("NO_COLOR", "1")
            .env("TEND_LOG", "warn")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "Doc Test")
            .env("GIT_AUTHOR_EMAIL", "doc@example.test")
            .env("GIT_COMMITTER_NAME", "Doc Test")
            .env("GIT_COMMITTER_EMAIL", "doc@example.test")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

/// Whether `actual` matches the shown line `expected` (`…` is any text).
fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.trim_end().split('…').collect();
    let actual = actual.trim_end();
    if parts.len() == 1 {
        return actual == parts[0];
    }
    let Some(mut rest) = actual.strip_prefix(parts[0]) else {
        return false;
    };
    let last = parts[parts.len() - 1];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Whether the lines `actual` match the shown lines `expected`.
fn output_matches(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first.trim() == "…" => {
            (0..=actual.len()).any(|skip| output_matches(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(line, tail)| line_matches(first, line) && output_matches(rest, tail)),
    }
}

/// Runs a console block: each `$ command` in turn, its output compared.
fn run_console(ws: &Workspace, block: &Block) -> Result<(), String> {
    let mut commands: Vec<(String, Vec<String>)> = Vec::new();
    for line in &block.body {
        if let Some(cmd) = line.strip_prefix("$ ") {
            commands.push((cmd.to_string(), Vec::new()));
        } else if let Some((cmd, output)) = commands.last_mut() {
            // A command continued with a trailing backslash.
            if cmd.ends_with('\\') && output.is_empty() {
                cmd.push('\n');
                cmd.push_str(line);
            } else {
                output.push(line.clone());
            }
        }
    }
    for (cmd, expected) in commands {
        let (_, actual) = ws.run(&cmd);
        let lines: Vec<&str> = actual.lines().collect();
        if !output_matches(&expected, &lines) {
            return Err(format!(
                "$ {cmd}\n--- shown:\n{}\n--- actual:\n{actual}",
                expected.join("\n")
            ));
        }
    }
    Ok(())
}

#[test]
fn every_documented_command_runs_as_shown() {
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut skipped = Vec::new();
    for file in doc_files() {
        for block in blocks(&file) {
            let place = format!("{}:{}", block.file, block.line);
            if let Some(reason) = &block.skip {
                assert!(!reason.is_empty(), "{place}: a skipped block must say why");
                skipped.push(format!("{place}: {reason}"));
                continue;
            }
            let ws = Workspace::new();
            if let Some(setup) = &block.setup {
                let (ok, out) = ws.run(&format!("set -e\n{setup}"));
                assert!(ok, "{place}: the setup failed:\n{out}");
            }
            let result = if block.lang == "console" {
                run_console(&ws, &block)
            } else {
                let (ok, out) = ws.run(&format!("set -e\n{}", block.body.join("\n")));
                if ok {
                    Ok(())
                } else {
                    Err(format!(
                        "the script failed:\n{}\n---\n{out}",
                        block.body.join("\n")
                    ))
                }
            };
            ran += 1;
            if let Err(e) = result {
                failures.push(format!("{place}:\n{e}"));
            }
        }
    }
    eprintln!(
        "ran {ran} blocks; skipped {}:\n{}",
        skipped.len(),
        skipped.join("\n")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_matcher_accepts_ellipses_and_refuses_differences() {
    let shown = |s: &str| s.lines().map(String::from).collect::<Vec<_>>();
    assert!(output_matches(&shown("a …\n…\nz"), &["a b", "x", "y", "z"]));
    assert!(output_matches(&shown("…"), &[]));
    assert!(!output_matches(&shown("a"), &["a", "b"]));
    assert!(!output_matches(&shown("a … c"), &["a b d"]));
    assert!(line_matches(
        "x: …, expected one of `a`, …",
        "x: bad, expected one of `a`, `b`"
    ));
}

/// The rollback runbook's loop that moves the state database away, run
/// over a scratch state dir: with the WAL files and without (after a
/// clean stop they are absent), under `set -e` as a script would run it.
#[test]
fn the_rollback_runbooks_move_works_with_and_without_wal_files() {
    let runbook = repo_root().join("docs/runbooks/rollback.md");
    let block = blocks(&runbook)
        .into_iter()
        .find(|b| b.body.iter().any(|l| l.contains("for f in state.db")))
        .expect("the move loop in docs/runbooks/rollback.md");
    for files in [
        &["state.db", "state.db-wal", "state.db-shm"][..],
        &["state.db"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("tend");
        std::fs::create_dir(&state).unwrap();
        for f in files {
            std::fs::write(state.join(f), "x").unwrap();
        }
        let script = block
            .body
            .join("\n")
            .replace("/var/lib/tend", &state.display().to_string());
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("set -e\n{script}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{files:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let moved = dir.path().join("tend.old-state");
        for f in files {
            assert!(moved.join(f).exists() && !state.join(f).exists(), "{f}");
        }
    }
}

/// Every `tests/FILE.rs::NAME` a document cites (the design record links
/// each claim to the test that demonstrates it) names a test that exists.
#[test]
fn every_test_a_document_cites_exists() {
    let mut cited = 0;
    let mut missing = Vec::new();
    for path in doc_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, _) in text.match_indices("tests/") {
            let rest = &text[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "_/.:".contains(c)))
                .unwrap_or(rest.len());
            let Some((file, name)) = rest[..end].split_once(".rs::") else {
                continue;
            };
            if file == "tests/FILE" {
                continue;
            }
            cited += 1;
            let source =
                std::fs::read_to_string(repo_root().join(format!("{file}.rs"))).unwrap_or_default();
            if !source.contains(&format!("fn {name}()")) {
                missing.push(format!("{}: {file}.rs::{name}", path.display()));
            }
        }
    }
    assert!(
        cited >= 30,
        "the design record cites its tests ({cited} found)"
    );
    assert!(
        missing.is_empty(),
        "cited tests that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The ```toml blocks of `path`: (line, text), the fence's indentation
/// removed.
fn toml_blocks(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if trimmed != "```toml" {
            i += 1;
            continue;
        }
        let indent = lines[i].len() - trimmed.len();
        let start = i + 1;
        let mut body = String::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push_str(lines[i].get(indent..).unwrap_or(lines[i].trim_start()));
            body.push('\n');
            i += 1;
        }
        out.push((start, body));
    }
    out
}

fn merge(into: &mut toml::Table, from: toml::Table) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// Every configuration snippet in README.md and docs/ is TOML that tend
/// loads: merged into a minimal configuration (a source and a sandbox
/// provider), each block must pass `Config::load`, so a renamed or
/// removed setting breaks the build instead of a reader's service.
#[test]
fn every_configuration_snippet_is_a_configuration_tend_loads() {
    let base: toml::Table = toml::from_str(
        "agent_id = \"doc-agent\"\n[source]\nurl = \"https://git.example/platform/databases.git\"\n[providers.sandbox]\nkind = \"sandbox\"\n",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    let mut problems = Vec::new();
    for path in doc_files() {
        for (line, text) in toml_blocks(&path) {
            let place = format!(
                "{}:{line}",
                path.strip_prefix(repo_root()).unwrap().display()
            );
            let block: toml::Table = match toml::from_str(&text) {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{place}: not TOML: {e}"));
                    continue;
                }
            };
            let mut config = base.clone();
            merge(&mut config, block);
            let file = dir.path().join("tend.toml");
            std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
            if let Err(e) = tend::config::Config::load(&file) {
                problems.push(format!("{place}: {e}"));
            }
            checked += 1;
        }
    }
    assert!(checked >= 7, "only {checked} snippets found");
    assert!(
        problems.is_empty(),
        "configuration snippets tend refuses:\n{}",
        problems.join("\n")
    );
}

/// examples/ci/github-actions.yml runs as written on a declarations
/// repository laid out as it expects (`databases/`, `ci/tend.toml`): its
/// `git` and `tend` steps are run in order (the download and the comment
/// need the network and GitHub), and the plan it would post is a markdown
/// report of the pull request's head.
#[test]
fn the_ci_example_validates_and_plans_a_pull_request() {
    let root = repo_root();
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    git(work, &["init", "-q", "-b", "main"]);
    std::fs::create_dir_all(work.join("databases")).unwrap();
    std::fs::create_dir_all(work.join("ci")).unwrap();
    for entry in std::fs::read_dir(root.join("examples/databases")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(
            &path,
            work.join("databases").join(path.file_name().unwrap()),
        )
        .unwrap();
    }
    std::fs::copy(
        root.join("examples/ci/tend.toml"),
        work.join("ci/tend.toml"),
    )
    .unwrap();
    git(work, &["add", "."]);
    git(work, &["commit", "-q", "-m", "declarations"]);
    // The pull request: a new declaration on a branch.
    git(work, &["checkout", "-q", "-b", "pr"]);
    std::fs::write(
        work.join("databases/reporting.yaml"),
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: reporting\nspec:\n  owner: reporting_app\n",
    )
    .unwrap();
    git(work, &["add", "."]);
    git(work, &["commit", "-q", "-m", "reporting"]);
    let workflow: serde_json::Value = serde_json::to_value(
        serde_norway::from_str::<serde_norway::Value>(
            &std::fs::read_to_string(root.join("examples/ci/github-actions.yml")).unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_tend"))
        .parent()
        .unwrap();
    let mut ran = Vec::new();
    for step in workflow["jobs"]["plan"]["steps"].as_array().unwrap() {
        let Some(run) = step["run"].as_str() else {
            continue;
        };
        if !(run.starts_with("tend ") || run.starts_with("git ")) {
            continue;
        }
        let out = Command::new("bash")
            .args(["-c", run])
            .current_dir(work)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env_remove("TEND_CONFIG")
            .env("TEND_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "step `{run}` failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ran.push(run.to_string());
    }
    assert_eq!(ran.len(), 3, "validate, branch, plan: {ran:?}");
    let plan = std::fs::read_to_string(work.join("plan.md")).unwrap();
    assert!(
        plan.contains("reporting") && plan.contains("Missing") && plan.contains('|'),
        "the plan of the pull request's head, as markdown:\n{plan}"
    );
}
