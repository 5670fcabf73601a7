//! Another OS user plants symbolic links where tend writes: in a reports
//! dir, or a state subdirectory, that user can write into. tend refuses
//! such a directory at start (exit 78, naming it and the `chmod` that
//! fixes it), and a link planted at the name a temporary file once had is
//! never followed: the root-only file it names keeps its content.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use support::TendCommand;
use support::config::TendConfig;
use support::git::{TestRepo, manifest};
use support::users::{OsUser, require_root};

/// The other user: no passwd entry needed.
const MALLORY: OsUser = OsUser {
    uid: 61390,
    gid: 61390,
    groups: &[],
    umask: 0o022,
};

/// `ln -s target link`, run as Mallory.
fn plant(link: &Path, target: &Path) {
    let mut ln = Command::new("ln");
    ln.arg("-s").arg(target).arg(link);
    let status = MALLORY.apply(&mut ln).status().unwrap();
    assert!(
        status.success(),
        "Mallory could not plant {}",
        link.display()
    );
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A root-only file with a secret in it: what the link points at.
fn victim(dir: &Path) -> std::path::PathBuf {
    let victim = dir.join("root-only");
    std::fs::write(&victim, "root's secret").unwrap();
    chmod(&victim, 0o600);
    victim
}

fn assert_untouched(victim: &Path) {
    assert_eq!(
        std::fs::read_to_string(victim).unwrap(),
        "root's secret",
        "tend wrote through the planted link"
    );
}

/// A directory root can see into, the root-only victim in it, and a
/// repository declaring `orders`.
fn site() -> (tempfile::TempDir, std::path::PathBuf, TestRepo) {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let victim = victim(dir.path());
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 20));
    repo.commit("orders");
    (dir, victim, repo)
}

fn apply(config: &Path, code: i32) -> support::RunOutput {
    TendCommand::new(&["--config", &config.display().to_string(), "apply"]).expect_code(code)
}

#[test]
fn a_reports_dir_others_can_write_is_refused_and_a_planted_link_is_never_followed() {
    let (dir, victim, repo) = site();
    let reports = dir.path().join("reports");
    std::fs::create_dir(&reports).unwrap();
    chmod(&reports, 0o777);
    let config = TendConfig::new(dir.path(), &repo.url())
        .status("reports_dir", &format!("\"{}\"", reports.display()))
        .write();
    // The name root's `tend apply` used to write the report JSON through.
    plant(&reports.join(".latest.json.tmp"), &victim);

    let refused = apply(&config, 78);
    assert!(
        refused.stderr.contains(&format!(
            "{} is writable by every user (mode 777)",
            reports.display()
        )) && refused
            .stderr
            .contains(&format!("chmod o-w {}", reports.display())),
        "{}",
        refused.stderr
    );
    assert_untouched(&victim);

    // Group-writable by a group that is not tend's: refused too.
    std::os::unix::fs::chown(&reports, Some(0), Some(MALLORY.gid)).unwrap();
    chmod(&reports, 0o775);
    let refused = apply(&config, 78);
    assert!(
        refused
            .stderr
            .contains(&format!("is writable by group {}", MALLORY.gid))
            && refused
                .stderr
                .contains(&format!("chmod g-w {}", reports.display())),
        "{}",
        refused.stderr
    );

    // Fixed as the message says; Mallory's link is still there, under a
    // name tend no longer writes through.
    chmod(&reports, 0o755);
    apply(&config, 0);
    assert_untouched(&victim);
    let latest = std::fs::symlink_metadata(reports.join("latest.json")).unwrap();
    assert!(latest.is_file(), "latest.json is a regular file");
    assert!(
        std::fs::read_to_string(reports.join("latest.json"))
            .unwrap()
            .contains("\"orders\"")
    );
}

#[test]
fn a_state_subdirectory_others_can_write_is_refused_and_a_planted_link_is_never_followed() {
    let (dir, victim, repo) = site();
    let config = TendConfig::new(dir.path(), &repo.url()).write();
    apply(&config, 0);
    let state = dir.path().join("state");
    let source = state.join("source");
    assert!(source.is_dir(), "the first apply made state/source");

    // The state dir itself is fine; one directory below it is not.
    chmod(&state, 0o755);
    chmod(&source, 0o777);
    plant(&source.join("parse-cache.tmp"), &victim);
    repo.write("billing.yaml", &manifest("billing", 5));
    repo.commit("billing: the parse cache is written again");
    let refused = apply(&config, 78);
    assert!(
        refused
            .stderr
            .contains(&format!("{} is writable by every user", source.display()))
            && refused
                .stderr
                .contains(&format!("chmod o-w {}", source.display())),
        "{}",
        refused.stderr
    );
    assert_untouched(&victim);
    // Readers do not write: `plan` still answers.
    TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(0);

    chmod(&source, 0o755);
    apply(&config, 0);
    assert_untouched(&victim);
    assert!(
        std::fs::symlink_metadata(source.join("parse-cache.jsonl"))
            .unwrap()
            .is_file()
    );
}
