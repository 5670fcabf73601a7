//! What an installation ships besides the binary, generated from the
//! command definitions: the version line, the shell completions and the
//! man pages.

use crate::support;

use std::process::Command;

use support::{TendCommand, repo_root};

/// `tend --version` names the version, the commit it was built from and
/// the cargo features.
#[test]
fn the_version_names_the_commit_and_the_features() {
    let run = TendCommand::new(&["--version"]).expect_code(0);
    let head = String::from_utf8(
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .current_dir(repo_root())
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let line = run.stdout.trim();
    assert!(
        line.starts_with(&format!("tend {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{line}"
    );
    // The binary is rebuilt for each commit (build.rs watches HEAD).
    assert!(line.contains(head.trim()), "{line} (HEAD {head})");
    // The test build turns test-hooks on besides the default gpg; a
    // release build says "gpg".
    assert!(line.ends_with(", features: gpg, test-hooks)"), "{line}");
}

/// Completions for bash, zsh and fish know every command.
#[test]
fn completions_cover_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let run = TendCommand::new(&["completions", shell]).expect_code(0);
        for command in [
            "apply",
            "plan",
            "override",
            "deletions",
            "suspend",
            "completions",
        ] {
            assert!(run.stdout.contains(command), "{shell}: no {command}");
        }
    }
    let run = TendCommand::new(&["completions", "tcsh"]).expect_code(1);
    assert!(
        run.stderr.contains("possible values: bash, zsh, fish"),
        "{}",
        run.stderr
    );
}

/// One man page per command and subcommand, each rendered by groff
/// without a warning.
#[test]
fn man_pages_cover_every_command_and_render_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let run = TendCommand::new(&["man", &dir.path().display().to_string()]).expect_code(0);
    let pages: Vec<&str> = run.stdout.lines().collect();
    for page in [
        "tend.1",
        "tend-run.1",
        "tend-override-set.1",
        "tend-deletions-approve.1",
        "tend-completions.1",
    ] {
        assert!(
            pages.iter().any(|p| p.ends_with(&format!("/{page}"))),
            "no {page} in {pages:#?}"
        );
    }
    assert!(
        !pages.iter().any(|p| p.ends_with("/tend-man.1")),
        "the hidden command has no page"
    );
    let set = std::fs::read_to_string(dir.path().join("tend-override-set.1")).unwrap();
    assert!(set.contains(r"\fBtend override set\fR"), "{set}");
    for page in &pages {
        let groff = Command::new("groff")
            .args(["-man", "-ww", "-z", "-Tutf8", page])
            .output()
            .expect("groff is missing: apt-get install groff-base (.ci/run installs it)");
        assert!(
            groff.status.success() && groff.stderr.is_empty(),
            "{page}: {}",
            String::from_utf8_lossy(&groff.stderr)
        );
    }
}
