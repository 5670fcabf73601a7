//! The pre-commit hook (`.pre-commit-hooks.yaml`), run by the pre-commit
//! framework itself (from PyPI) in a sample declarations repository, the
//! way a platform team uses it: pre-commit clones tend at a revision,
//! builds it with `cargo install` (`language: rust`), and runs
//! `tend validate` before each commit.
//!
//! The build is real but cheap: the test points `cargo install` at a
//! target directory of its own under `target/` (kept between runs) with
//! the release profile at `opt-level = 0`, because an optimised release
//! build of tend takes minutes of CI's two cores and proves nothing more
//! about the hook.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::git::{TestRepo, git, isolated};
use support::repo_root;

const GOOD: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: orders
spec:
  provider: sandbox
  databaseName: orders
  owner: app_orders
";

/// `pre-commit` on `PATH`, or a failure that says how to install it.
fn pre_commit() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("pre-commit"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "pre-commit is not on PATH: install it from PyPI \
             (python3 -m venv /opt/pre-commit && /opt/pre-commit/bin/pip install pre-commit \
             && ln -s /opt/pre-commit/bin/pre-commit /usr/local/bin/; .ci/run does this)"
        )
    })
}

/// A Git repository holding tend's sources as they are in this checkout
/// (committed or not), as pre-commit would clone it from tend's remote.
fn hook_repository() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let root = repo_root();
    for item in ["Cargo.toml", "Cargo.lock", ".pre-commit-hooks.yaml", "src"] {
        let copied = Command::new("cp")
            .arg("-r")
            .arg(root.join(item))
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(copied.success(), "cannot copy {item}");
    }
    git(dir.path(), &["init", "-q", "-b", "main"]);
    git(dir.path(), &["add", "."]);
    git(dir.path(), &["commit", "-q", "-m", "tend"]);
    let rev = git(dir.path(), &["rev-parse", "HEAD"]);
    (dir, rev)
}

/// Runs pre-commit in `repo` with its own cache and the cheap build.
fn run(repo: &Path, cache: &Path, args: &[&str]) -> Output {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("pre-commit-hook");
    isolated(&mut Command::new(pre_commit()))
        .args(args)
        .current_dir(repo)
        .env("PRE_COMMIT_HOME", cache)
        .env("PRE_COMMIT_COLOR", "never")
        .env("CARGO_TARGET_DIR", target)
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "256")
        .env("CARGO_PROFILE_RELEASE_INCREMENTAL", "false")
        .env_remove("TEND_CONFIG")
        .output()
        .unwrap_or_else(|e| panic!("cannot run pre-commit: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_pre_commit_hook_validates_a_declarations_repository() {
    let (hook, rev) = hook_repository();
    let cache = tempfile::tempdir().unwrap();
    let repo = TestRepo::new();
    repo.write(
        ".pre-commit-config.yaml",
        &format!(
            "repos:\n  - repo: {}\n    rev: {rev}\n    hooks:\n      - id: tend-validate\n",
            hook.path().display()
        ),
    )
    .write("databases/orders.yaml", GOOD)
    .write("README.md", "declarations\n");
    repo.commit("declarations");

    // Valid declarations pass; pre-commit built tend with `cargo install`.
    let out = run(repo.path(), cache.path(), &["run", "--all-files"]);
    let shown = text(&out);
    assert!(out.status.success(), "valid declarations pass:\n{shown}");
    assert!(
        shown.contains("tend validate") && shown.contains("Passed"),
        "{shown}"
    );
    let installed: Vec<PathBuf> = walk(cache.path())
        .into_iter()
        .filter(|p| p.ends_with("rustenv-system/bin/tend"))
        .collect();
    assert_eq!(
        installed.len(),
        1,
        "pre-commit installed tend with cargo install"
    );

    // A change outside databases/ does not run the hook.
    repo.write("README.md", "declarations, and more\n");
    git(repo.path(), &["add", "README.md"]);
    let out = run(repo.path(), cache.path(), &["run"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("(no files to check)Skipped"),
        "{}",
        text(&out)
    );

    // A broken declaration is refused with file:line:column.
    repo.write(
        "databases/billing.yaml",
        &GOOD
            .replace("name: orders", "name: billing")
            .replace("databaseName: orders", "databaseName: billing")
            .replace(
                "owner: app_orders",
                "owner: app_billing\n  conectionLimit: 20",
            ),
    );
    git(repo.path(), &["add", "."]);
    let out = run(repo.path(), cache.path(), &["run"]);
    let shown = text(&out);
    assert!(
        !out.status.success(),
        "a broken declaration fails:\n{shown}"
    );
    assert!(
        shown.contains("databases/billing.yaml:9:3: spec: unknown field `conectionLimit`"),
        "{shown}"
    );

    // Two files declaring one database: only seen when the whole
    // directory is validated, not just the changed file.
    repo.write("databases/billing.yaml", GOOD);
    git(repo.path(), &["add", "."]);
    let out = run(repo.path(), cache.path(), &["run"]);
    let shown = text(&out);
    assert!(
        !out.status.success(),
        "a clash across files fails:\n{shown}"
    );
    assert!(
        shown.contains(
            "databases/billing.yaml:4:9: duplicate metadata.name `orders` (also at databases/orders.yaml:4)"
        ),
        "{shown}"
    );

    // Fixed: the commit goes through with the hook installed in Git.
    repo.remove("databases/billing.yaml");
    git(repo.path(), &["add", "-A"]);
    let out = run(repo.path(), cache.path(), &["install"]);
    assert!(out.status.success(), "{}", text(&out));
    let committed = isolated(&mut Command::new("git"))
        .args(["commit", "-q", "-m", "more"])
        .current_dir(repo.path())
        .env("PRE_COMMIT_HOME", cache.path())
        .output()
        .unwrap();
    assert!(committed.status.success(), "{}", text(&committed));
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// The `rev:` and hook id docs/declarations.md shows.
fn documented_hook() -> (String, String) {
    let doc = std::fs::read_to_string(repo_root().join("docs/declarations.md")).unwrap();
    let value = |key: &str| {
        doc.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|rest| rest.split('#').next().unwrap().trim().to_string())
            .unwrap_or_else(|| panic!("docs/declarations.md shows no `{key}`"))
    };
    (value("rev:"), value("- id:"))
}

/// The documented configuration works as shown: the `rev:` is a release
/// tag of tend (named in CHANGELOG.md, this version's), and the
/// `language: system` hook runs the `tend` on PATH, building nothing.
#[test]
fn the_system_hook_runs_the_installed_tend_at_the_documented_rev() {
    let (rev, id) = documented_hook();
    assert_eq!(id, "tend-validate-system");
    assert_eq!(
        rev,
        format!("v{}", env!("CARGO_PKG_VERSION")),
        "the documented rev is this release"
    );
    let changelog = std::fs::read_to_string(repo_root().join("CHANGELOG.md")).unwrap();
    assert!(
        changelog.contains(&format!("## {rev}")),
        "CHANGELOG.md has an entry for {rev}"
    );
    let (hook, _) = hook_repository();
    git(hook.path(), &["tag", &rev]);
    let cache = tempfile::tempdir().unwrap();
    let repo = TestRepo::new();
    repo.write(
        ".pre-commit-config.yaml",
        &format!(
            "repos:\n  - repo: {}\n    rev: {rev}\n    hooks:\n      - id: {id}\n",
            hook.path().display()
        ),
    )
    .write("databases/orders.yaml", GOOD);
    repo.commit("declarations");
    let bin = Path::new(env!("CARGO_BIN_EXE_tend")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run_with_tend = |args: &[&str]| {
        isolated(&mut Command::new(pre_commit()))
            .args(args)
            .current_dir(repo.path())
            .env("PRE_COMMIT_HOME", cache.path())
            .env("PRE_COMMIT_COLOR", "never")
            .env("PATH", &path)
            .env_remove("TEND_CONFIG")
            .output()
            .unwrap()
    };
    let out = run_with_tend(&["run", "--all-files"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Passed"), "{}", text(&out));
    assert!(
        walk(cache.path()).iter().all(|p| !p.ends_with("bin/tend")),
        "nothing was built"
    );
    repo.write(
        "databases/orders.yaml",
        &GOOD.replace(
            "owner: app_orders",
            "owner: app_orders\n  conectionLimit: 20",
        ),
    );
    git(repo.path(), &["add", "."]);
    let out = run_with_tend(&["run"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("databases/orders.yaml:9:3: spec: unknown field `conectionLimit`"),
        "{}",
        text(&out)
    );
}
