//! The documentation's commands, run: every ```console and ```sh block in
//! README.md and docs/ runs against the real binary in a scratch copy of
//! this repository's examples, and a console block's output must match
//! what it shows, its exit code too (0 unless the shown output ends with a
//! line `[exit N]`). A block that cannot run here says so, with the reason,
//! in an HTML comment just before it (`<!-- doctest: skip: … -->`); a
//! block may carry hidden setup (`<!-- doctest: setup … -->`), or leave
//! out one line that cannot run here, with the reason
//! (`<!-- doctest: without `LINE` reason -->`).
//!
//! Matching: each shown output line must match the next real line; `…` in
//! a line matches any text, and a line that is only `…` matches any
//! number of lines. `cargo run --` in a block means the built `tend`.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::docs::{Block, blocks, doc_files};
use support::git::git;
use support::repo_root;

/// A scratch copy of the repository's examples as a Git repository of its
/// own (tend reads commits, never a working tree), with `tend` on `PATH`.
///
/// Its agent listens on a free port of its own, not the documented
/// `127.0.0.1:9477` (which a developer's own agent, or a second checkout's
/// tests, may hold): the port is written into the copied configuration
/// and the blocks' commands, and the documented port put back into what
/// they print before it is compared.
struct Workspace {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: String,
}

/// The port the documents show.
const DOCUMENTED_PORT: &str = "9477";

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
        let port = support::git::free_port().to_string();
        let config = dir.path().join("examples/tend.toml");
        let mut text = std::fs::read_to_string(&config).unwrap();
        assert!(
            !text.contains("[server]"),
            "examples/tend.toml sets [server]: the doc tests add their own listen address"
        );
        text.push_str(&format!("\n[server]\nlisten = \"127.0.0.1:{port}\"\n"));
        std::fs::write(&config, text).unwrap();
        git(dir.path(), &["init", "-q", "-b", "main"]);
        git(dir.path(), &["add", "."]);
        git(dir.path(), &["commit", "-q", "-m", "examples"]);
        let bin = dir.path().join(".bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tend"), bin.join("tend")).unwrap();
        Workspace { dir, bin, port }
    }

    /// Runs `script` with bash; stdout and stderr interleaved as a
    /// terminal shows them.
    fn run(&self, script: &str) -> (bool, String) {
        let (code, out) = self.run_with_code(script);
        (code == Some(0), out)
    }

    /// [`Workspace::run`] with the exit code (`None`: killed by a signal).
    fn run_with_code(&self, script: &str) -> (Option<i32>, String) {
        let script = script
            .replace("cargo run -- ", "tend ")
            .replace(&format!(":{DOCUMENTED_PORT}"), &format!(":{}", self.port));
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
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
                .replace(&format!(":{}", self.port), &format!(":{DOCUMENTED_PORT}")),
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

/// The exit code a command's shown output states on its last line
/// (`[exit N]`, taken off the output), else 0.
fn shown_exit(expected: &mut Vec<String>) -> i32 {
    let stated = expected.last().and_then(|l| {
        l.trim()
            .strip_prefix("[exit ")?
            .strip_suffix(']')?
            .parse::<i32>()
            .ok()
    });
    match stated {
        Some(code) => {
            expected.pop();
            code
        }
        None => 0,
    }
}

/// Runs a console block: each `$ command` in turn, its output compared,
/// and its exit code (0 unless the output shown ends with `[exit N]`).
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
    for (cmd, mut expected) in commands {
        let code = shown_exit(&mut expected);
        let (actual_code, actual) = ws.run_with_code(&cmd);
        let lines: Vec<&str> = actual.lines().collect();
        if !output_matches(&expected, &lines) {
            return Err(format!(
                "$ {cmd}\n--- shown:\n{}\n--- actual:\n{actual}",
                expected.join("\n")
            ));
        }
        if actual_code != Some(code) {
            return Err(format!(
                "$ {cmd}\nexited {actual_code:?}, the document shows {code} (end the shown output with `[exit N]` when a command fails on purpose):\n{actual}"
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
    let mut failing = shown("error: …\n[exit 78]");
    assert_eq!(shown_exit(&mut failing), 78);
    assert_eq!(failing, shown("error: …"));
    let mut passing = shown("ok\n…");
    assert_eq!(shown_exit(&mut passing), 0);
    assert_eq!(passing.len(), 2);
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
            if !is_test(&source, name) {
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

/// Whether `source` has a test `fn name()`: the function's own attributes
/// (the lines above it, up to the previous item) include `#[test]`.
fn is_test(source: &str, name: &str) -> bool {
    let Some(at) = source.find(&format!("fn {name}()")) else {
        return false;
    };
    let line_start = source[..at].rfind('\n').map_or(0, |i| i + 1);
    source[..line_start]
        .lines()
        .rev()
        .take_while(|l| {
            let l = l.trim();
            l.starts_with("#[") || l.starts_with("///") || l.starts_with("//")
        })
        .any(|l| l.trim() == "#[test]")
}

#[test]
fn a_cited_name_must_be_a_test_not_a_helper() {
    let source = "#[test]\n#[ignore = \"x\"]\nfn real() {}\n\n/// doc\nfn helper() {}\n";
    assert!(is_test(source, "real"));
    assert!(!is_test(source, "helper"));
    assert!(!is_test(source, "absent"));
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
            if let Err(e) = tend::testing::config::Config::load(&file) {
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
/// repository laid out as it expects (`databases/`, `ci/tend.toml`),
/// against a real PostgreSQL whose databases the agents manage, through
/// the read-only role docs/providers.md grants: its `git`, `printf` and
/// `tend` steps are run in order (the download and the comment need the
/// network and GitHub), and the plan it would post lists what the pull
/// request changes, with everything in sync counted, not listed. Only the
/// server's address in ci/tend.toml is changed (and TLS, which the test
/// server does not offer).
#[test]
fn the_ci_example_validates_and_plans_a_pull_request() {
    let root = repo_root();
    let pg = support::postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    git(work, &["init", "-q", "-b", "main"]);
    std::fs::create_dir_all(work.join("databases")).unwrap();
    std::fs::create_dir_all(work.join("ci")).unwrap();
    for entry in std::fs::read_dir(root.join("examples/databases")).unwrap() {
        let path = entry.unwrap().path();
        // A DBaaS instance a PostgreSQL server cannot hold.
        if path.ends_with("analytics.yaml") {
            continue;
        }
        std::fs::copy(
            &path,
            work.join("databases").join(path.file_name().unwrap()),
        )
        .unwrap();
    }
    let ci = std::fs::read_to_string(root.join("examples/ci/tend.toml"))
        .unwrap()
        .replace("db.internal:5432", &format!("127.0.0.1:{}", pg.port))
        .replace("sslmode=require", "sslmode=disable");
    std::fs::write(work.join("ci/tend.toml"), &ci).unwrap();
    git(work, &["add", "."]);
    git(work, &["commit", "-q", "-m", "declarations"]);

    // The agents manage the main branch's databases (`sessions` existed
    // before tend, as declared, and is adopted).
    pg.psql("CREATE ROLE identity_app");
    pg.psql("CREATE DATABASE sessions OWNER identity_app CONNECTION LIMIT 300");
    let agent = work.join("agent.toml");
    std::fs::write(
        &agent,
        format!(
            "agent_id = \"example-agent\"\nstate_dir = \"agent-state\"\n[source]\nurl = \"{}\"\npath = \"databases\"\n[status]\nbranch = \"\"\n[providers.main]\nkind = \"postgres\"\nurl = \"{}\"\ncreate_owner = true\n",
            work.display(),
            pg.url()
        ),
    )
    .unwrap();
    for code in [2, 0, 0] {
        let out = Command::new(env!("CARGO_BIN_EXE_tend"))
            .args(["--config", agent.to_str().unwrap(), "apply"])
            .env_remove("TEND_CONFIG")
            .env("TEND_LOG", "warn")
            .output()
            .unwrap();
        if out.status.code() == Some(0) {
            break;
        }
        assert_eq!(
            out.status.code(),
            Some(code),
            "the agents' apply:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // docs/providers.md, "A read-only role for CI", and nothing more.
    pg.psql("CREATE ROLE tend_readonly LOGIN");
    pg.psql("GRANT USAGE ON SCHEMA tend TO tend_readonly");
    pg.psql("GRANT SELECT ON tend.databases TO tend_readonly");
    let before = pg.psql(
        "SELECT string_agg(datname || ':' || pg_get_userbyid(datdba) || ':' || datconnlimit, ',' ORDER BY datname) FROM pg_database",
    );

    // The pull request: a new declaration on a branch.
    git(work, &["checkout", "-q", "-b", "pr"]);
    std::fs::write(
        work.join("databases/reporting.yaml"),
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: reporting\nspec:\n  owner: reporting_app\n",
    )
    .unwrap();
    git(work, &["add", "databases"]);
    // The pull request also points the CI configuration at a host of its
    // author's: the job must take the base branch's instead.
    let hostile = ci.replace(&format!("127.0.0.1:{}", pg.port), "127.0.0.1:1");
    std::fs::write(work.join("ci/tend.toml"), &hostile).unwrap();
    git(work, &["add", "ci"]);
    git(work, &["commit", "-q", "-m", "reporting"]);
    // The runner's checkout has the repository as `origin`.
    git(
        work,
        &["remote", "add", "origin", &work.display().to_string()],
    );
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
        if !["tend ", "git ", "printf "]
            .iter()
            .any(|start| run.starts_with(start))
        {
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
            .env("TEND_READONLY_PASSWORD", "not-checked-by-the-test-server")
            .env("BASE_REF", "main")
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
    assert_eq!(
        ran.len(),
        5,
        "validate, the base branch's configuration, branch, password, plan: {ran:?}"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("ci/tend.toml")).unwrap(),
        ci,
        "the job ran with the base branch's ci/tend.toml"
    );
    let plan = std::fs::read_to_string(work.join("plan.md")).unwrap();
    assert!(
        plan.contains("| `reporting` | Missing | Create |"),
        "the pull request's new database, as markdown:\n{plan}"
    );
    assert!(
        plan.contains("in sync (not listed)") && !plan.contains("| `orders` |"),
        "what is in sync is counted, not listed:\n{plan}"
    );
    assert_eq!(
        pg.psql(
            "SELECT string_agg(datname || ':' || pg_get_userbyid(datdba) || ':' || datconnlimit, ',' ORDER BY datname) FROM pg_database",
        ),
        before,
        "the plan changed nothing on the server"
    );
}

/// Shell words of one command line: quotes and backslashes removed,
/// `$(…)` kept whole, a `#` comment dropped.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut in_word) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                word.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '$' if chars.peek() == Some(&'(') => {
                in_word = true;
                word.push('$');
                let mut depth = 0;
                for c in chars.by_ref() {
                    word.push(c);
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    if depth == 0 {
                        break;
                    }
                }
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            ';' | '|' | '&' if !word.ends_with('>') => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                let mut operator = c.to_string();
                if c != ';' && chars.peek() == Some(&c) {
                    operator.extend(chars.next());
                }
                words.push(operator);
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The simple commands of a shell script: continuation lines joined,
/// split at `|`, `||`, `&&`, `;` and `&`; leading `VAR=value`, `time`,
/// `sudo [-u USER]` and trailing redirections dropped.
fn simple_commands(script: &[String]) -> Vec<Vec<String>> {
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in script {
        match line.trim_end().strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                joined.push(std::mem::take(&mut current));
            }
        }
    }
    let mut commands = Vec::new();
    for line in joined {
        let mut command: Vec<String> = Vec::new();
        for word in shell_words(&line).into_iter().chain([";".to_string()]) {
            if ["|", "||", "&&", ";", "&"].contains(&word.as_str()) {
                let mut rest = std::mem::take(&mut command).into_iter().peekable();
                while let Some(w) = rest.peek() {
                    let assignment = w.split_once('=').is_some_and(|(k, _)| {
                        !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    });
                    if assignment || w == "time" || w == "sudo" {
                        rest.next();
                    } else if w == "-u" {
                        rest.next();
                        rest.next();
                    } else {
                        break;
                    }
                }
                let words: Vec<String> = rest
                    .take_while(|w| {
                        !(w.starts_with('>') || w.starts_with('<') || w.starts_with("2>"))
                    })
                    .collect();
                if !words.is_empty() {
                    commands.push(words);
                }
            } else {
                command.push(word);
            }
        }
    }
    commands
}

/// The agent's server source, whose `.route("…")` calls a `curl` of its
/// port is checked against.
fn server_source() -> String {
    std::fs::read_to_string(repo_root().join("src/server/mod.rs")).unwrap()
}

/// What a skipped block's commands refer to, checked without running
/// them: a `tend` command line parses with tend's own command-line
/// parser (a renamed command or flag fails here); `cargo run --example`,
/// `cargo … --test`, `scripts/…` and repository paths name files that
/// exist; `systemctl`/`journalctl -u` name the unit in `systemd/`; `curl`
/// of the agent's port asks for a path its server routes; `grep` of
/// `/metrics` names metrics the agent exports. (The unit itself is
/// checked by `systemd-analyze verify` in `.ci/run`.)
fn check_skipped_command(words: &[String], server: &str) -> Result<(), String> {
    let root = repo_root();
    let tend_args = match words[0].as_str() {
        "tend" => Some(&words[1..]),
        "cargo" if words.get(1).is_some_and(|w| w == "run") => {
            match words.iter().position(|w| w == "--example") {
                Some(i) => {
                    let example = words.get(i + 1).ok_or("`--example` names no example")?;
                    if !root.join(format!("examples/{example}.rs")).exists() {
                        return Err(format!("examples/{example}.rs does not exist"));
                    }
                    None
                }
                None => words
                    .iter()
                    .position(|w| w == "--")
                    .map(|i| &words[i + 1..]),
            }
        }
        _ => None,
    };
    if let Some(args) = tend_args {
        use clap::Parser;
        let argv = std::iter::once("tend").chain(args.iter().map(String::as_str));
        // `--help`/`--version` would print; only a parse failure matters.
        if let Err(e) = tend::testing::cli::Cli::try_parse_from(argv)
            && !matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            )
        {
            return Err(format!("tend's parser refuses it: {}", e.render()));
        }
    }
    if words[0] == "cargo"
        && let Some(i) = words.iter().position(|w| w == "--test")
    {
        let test = words.get(i + 1).ok_or("`--test` names no test")?;
        if !root.join(format!("tests/{test}/main.rs")).exists() {
            return Err(format!("tests/{test}/main.rs does not exist"));
        }
    }
    if words[0] == "systemctl" || words[0] == "journalctl" {
        let unit = match words[0].as_str() {
            "journalctl" => words
                .iter()
                .position(|w| w == "-u")
                .and_then(|i| words.get(i + 1)),
            _ => words.iter().skip(2).find(|w| !w.starts_with('-')),
        };
        if let Some(unit) = unit {
            let unit = unit.trim_end_matches(".service");
            if !root.join(format!("systemd/{unit}.service")).exists() {
                return Err(format!("systemd/{unit}.service does not exist"));
            }
        }
    }
    for word in words {
        let repo_path = ["examples/", "systemd/", "scripts/", "docs/", "tests/"]
            .iter()
            .any(|dir| word.starts_with(dir));
        if repo_path && !word.contains('$') && !root.join(word).exists() {
            return Err(format!("{word} does not exist in the repository"));
        }
        if let Some(path) = word
            .split_once("127.0.0.1:9477")
            .map(|(_, path)| path.split('?').next().unwrap_or(""))
            && !server.contains(&format!(".route(\"{path}\""))
        {
            return Err(format!("the agent's server has no route `{path}`"));
        }
    }
    Ok(())
}

/// The metric names a `grep -E '^tend_…'` pattern of a block asks for:
/// `^tend_status_(a|b)` is `tend_status_a` and `tend_status_b`; a label
/// selector (`\{…`) is dropped.
fn metric_names(pattern: &str) -> Vec<String> {
    let Some(pattern) = pattern.strip_prefix('^') else {
        return Vec::new();
    };
    let (prefix, rest) = pattern.split_once('(').unwrap_or((pattern, ")"));
    let (alternatives, suffix) = rest.split_once(')').unwrap_or((rest, ""));
    alternatives
        .split('|')
        .map(|a| {
            let name = format!("{prefix}{a}{suffix}");
            name.split("\\{").next().unwrap_or("").to_string()
        })
        .collect()
}

#[test]
fn every_skipped_command_is_checked_another_way() {
    let families = support::metric_families();
    let exported = tend::testing::telemetry::Metrics::new().encode();
    assert!(
        exported.contains("# TYPE tend_fetch_errors counter"),
        "the registry's prefix is `tend_`:\n{exported}"
    );
    let server = server_source();
    let (mut checked, mut failures) = (0, Vec::new());
    for file in doc_files() {
        for block in blocks(&file) {
            if block.skip.is_none() {
                continue;
            }
            let script: Vec<String> = if block.lang == "console" {
                block
                    .body
                    .iter()
                    .filter_map(|l| l.trim_start().strip_prefix("$ "))
                    .map(str::to_string)
                    .collect()
            } else {
                block.body.clone()
            };
            let commands = simple_commands(&script);
            for words in &commands {
                checked += 1;
                let mut result = check_skipped_command(words, &server);
                if words[0] == "grep"
                    && commands
                        .iter()
                        .any(|c| c.iter().any(|w| w.ends_with("/metrics")))
                {
                    for name in words.iter().flat_map(|w| metric_names(w)) {
                        let family = name.strip_suffix("_total").unwrap_or(&name);
                        if name.starts_with("tend_") && !families.iter().any(|f| f == family) {
                            result = Err(format!("the agent exports no metric `{name}`"));
                        }
                    }
                }
                if let Err(e) = result {
                    failures.push(format!(
                        "{}:{}: `{}`: {e}",
                        block.file,
                        block.line,
                        words.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        checked >= 50,
        "skipped blocks hold commands ({checked} checked)"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_skipped_command_checks_can_fail() {
    let server = server_source();
    let check = |line: &str| {
        let commands = simple_commands(&[line.to_string()]);
        commands
            .iter()
            .try_for_each(|c| check_skipped_command(c, &server))
    };
    assert!(check("tend state show").is_ok());
    assert!(check("TEND_LOG=debug time tend --config /etc/tend/tend.toml plan > out").is_ok());
    assert!(check("tend state shows").is_err(), "an unknown command");
    assert!(
        check("tend plan --formatt json").is_err(),
        "an unknown flag"
    );
    assert!(check("systemctl status tend; journalctl -u tend -b | grep x").is_ok());
    assert!(check("journalctl -u tend-agent").is_err(), "no such unit");
    assert!(check("curl -si 127.0.0.1:9477/readyz").is_ok());
    assert!(
        check("curl -si 127.0.0.1:9477/ready").is_err(),
        "no such route"
    );
    assert!(check("cargo run --example reference_provider -- --listen x").is_ok());
    assert!(check("cargo run --example no_such_example").is_err());
    assert!(check("cargo nextest run --test no_such_test").is_err());
    assert!(check("install -m 0644 systemd/tend.servic /etc").is_err());
    assert_eq!(
        metric_names(r#"^tend_(provider_errors_total|resources\{state="Error"\})"#),
        ["tend_provider_errors_total", "tend_resources"]
    );
    assert_eq!(
        shell_words(r#"echo "a \"b\"" 'c d' $(cat x y) # comment"#),
        ["echo", "a \"b\"", "c d", "$(cat x y)"]
    );
}

/// Every `docs/….md` page the code names (errors, `tend explain`, log
/// lines) exists: a renamed runbook breaks the build, not the operator's
/// 3 a.m. search.
#[test]
fn every_page_the_code_names_exists() {
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    sources(&repo_root().join("src"), &mut files);
    let (mut named, mut missing) = (0, Vec::new());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, _) in text.match_indices("docs/") {
            let rest = &text[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "_/.-".contains(c)))
                .unwrap_or(rest.len());
            let Some(page) = rest[..end].split_inclusive(".md").next() else {
                continue;
            };
            if !page.ends_with(".md") {
                continue;
            }
            named += 1;
            if !repo_root().join(page).exists() {
                missing.push(format!("{}: {page}", file.display()));
            }
        }
    }
    assert!(named >= 20, "the code names its runbooks ({named} found)");
    assert!(
        missing.is_empty(),
        "pages the code names that do not exist:\n{}",
        missing.join("\n")
    );
}
