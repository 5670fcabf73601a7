//! The SSH transport end to end, against a real throwaway `sshd` serving a
//! bare repository: clone and poll with a deploy key, plain and hashed
//! known_hosts entries, and the refusals an operator must be able to act
//! on (unknown host, changed host key, wrong deploy key).

use crate::support;

use std::path::Path;

use support::TendCommand;
use support::config::TendConfig;
use support::git::{TestRepo, manifest};
use support::sshd::{Sshd, fingerprint, new_key};

struct Setup {
    sshd: Sshd,
    repo: TestRepo,
    bare: std::path::PathBuf,
    _served: tempfile::TempDir,
    dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let sshd = Sshd::start();
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10));
    repo.commit("orders");
    let served = tempfile::tempdir().unwrap();
    let bare = repo.bare_clone(served.path());
    Setup {
        sshd,
        repo,
        bare,
        _served: served,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl Setup {
    fn config(&self, known_hosts: &str, key: &Path) -> String {
        let file = self.dir.path().join("known_hosts");
        std::fs::write(&file, known_hosts).unwrap();
        TendConfig::new(self.dir.path(), &self.sshd.url(&self.bare))
            .source("ssh_key_file", &format!("\"{}\"", key.display()))
            .source("known_hosts_file", &format!("\"{}\"", file.display()))
            .write()
            .display()
            .to_string()
    }

    /// `tend plan --format json` expected to fail on the source: its error.
    fn source_error(&self, config: &str) -> String {
        let run =
            TendCommand::new(&["--config", config, "plan", "--format", "json"]).expect_code(1);
        let report = run.json();
        report["source"]["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no source error in {report}\n{}", run.stderr))
            .to_string()
    }

    fn names(&self, config: &str) -> Vec<String> {
        let report = TendCommand::new(&["--config", config, "plan", "--format", "json"])
            .expect_code(0)
            .json();
        report["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    }
}

#[test]
fn clones_and_polls_over_ssh_with_a_deploy_key() {
    let s = setup();
    let config = s.config(&s.sshd.keyscan(false), &s.sshd.deploy_key);
    let applied =
        TendCommand::new(&["--config", &config, "apply", "--format", "json"]).expect_code(0);
    assert_eq!(
        support::applied(&applied.json()),
        Some((1, 1)),
        "{}\n{}",
        applied.stderr,
        s.sshd.log()
    );
    // A new commit at the server is found by the next poll.
    s.repo.write("billing.yaml", &manifest("billing", 5));
    s.repo.commit("billing");
    s.repo
        .git(&["push", "-q", &s.bare.display().to_string(), "main"]);
    assert_eq!(s.names(&config), vec!["billing", "orders"]);
    let report = TendCommand::new(&["--config", &config, "plan", "--format", "json"])
        .expect_code(0)
        .json();
    assert_eq!(
        report["source"]["commit"].as_str(),
        Some(s.repo.head().as_str())
    );
}

#[test]
fn hashed_known_hosts_entries_for_a_host_and_port_are_matched() {
    let s = setup();
    let hashed = s.sshd.keyscan(true);
    assert!(
        hashed.lines().any(|l| l.starts_with("|1|")),
        "ssh-keyscan -H wrote no hashed entry: {hashed}"
    );
    assert!(!hashed.contains("127.0.0.1"), "{hashed}");
    let config = s.config(&hashed, &s.sshd.deploy_key);
    assert_eq!(s.names(&config), vec!["orders"]);
}

#[test]
fn an_unknown_host_key_is_refused_with_its_fingerprint_and_the_keyscan_line() {
    let s = setup();
    let config = s.config("# nothing known yet\n", &s.sshd.deploy_key);
    let error = s.source_error(&config);
    let fingerprint = fingerprint(&s.sshd.host_key);
    assert!(error.contains(&fingerprint), "{error} lacks {fingerprint}");
    let keyscan = format!("ssh-keyscan -p {} 127.0.0.1 >>", s.sshd.port);
    assert!(error.contains(&keyscan), "{error} lacks {keyscan}");
    assert!(
        error.contains(&format!("[127.0.0.1]:{} is not in", s.sshd.port)),
        "{error}"
    );
}

#[test]
fn a_changed_host_key_is_refused_as_a_possible_attack() {
    let s = setup();
    // The entry names this host and port with another key.
    let other = new_key(&s.dir.path().join("other_host"), "another host");
    let other_pub = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let mut parts = other_pub.split_whitespace();
    let entry = format!(
        "[127.0.0.1]:{} {} {}\n",
        s.sshd.port,
        parts.next().unwrap(),
        parts.next().unwrap()
    );
    let config = s.config(&entry, &s.sshd.deploy_key);
    let error = s.source_error(&config);
    assert!(
        error.contains("CHANGED") && error.contains("may be an attack"),
        "{error}"
    );
    assert!(error.contains(&fingerprint(&s.sshd.host_key)), "{error}");
    // Nothing was fetched: no declaration came from the server.
    let report = TendCommand::new(&["--config", &config, "plan", "--format", "json"])
        .expect_code(1)
        .json();
    assert_eq!(report["resources"].as_array().map(Vec::len), Some(0));
}

#[test]
fn a_wrong_deploy_key_fails_with_an_auth_error_naming_the_file_not_its_content() {
    let s = setup();
    let wrong = new_key(&s.dir.path().join("not_authorized"), "stranger");
    let config = s.config(&s.sshd.keyscan(false), &wrong);
    let run = TendCommand::new(&["--config", &config, "plan", "--format", "json"]).expect_code(1);
    let report = run.json();
    let error = report["source"]["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(error.starts_with("authentication to "), "{error}");
    assert!(
        error.contains(&wrong.display().to_string()),
        "{error} does not name {}",
        wrong.display()
    );
    let private = std::fs::read_to_string(&wrong).unwrap();
    let public = std::fs::read_to_string(wrong.with_extension("pub")).unwrap();
    let secret_lines: Vec<&str> = private
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .chain(public.split_whitespace().nth(1))
        .collect();
    for output in [&run.stdout, &run.stderr] {
        for line in &secret_lines {
            assert!(
                !output.contains(line),
                "the key's content was printed: {line}"
            );
        }
    }
}
