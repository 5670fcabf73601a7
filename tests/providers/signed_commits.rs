//! `[source] verify`: commits signed by git itself with `ssh-keygen` keys
//! (`gpg.format = ssh`) and with `gpg` in a throwaway `GNUPGHOME`. A head
//! signed by an allowed key is applied; every other head is refused with
//! the commit, the signer and the reason named, and the last accepted
//! commit stays in force (nothing of the refused commit is applied).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::TendCommand;
use support::config::TendConfig;
use support::git::{TestRepo, manifest};
use support::sshd::{fingerprint, new_key};

/// Runs git in `dir` with extra `-c` settings and environment.
fn git_with(dir: &Path, settings: &[String], env: &[(&str, &Path)], args: &[&str]) -> String {
    let mut command = Command::new("git");
    for setting in settings {
        command.arg("-c").arg(setting);
    }
    command
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Test Author")
        .env("GIT_AUTHOR_EMAIL", "author@example.test")
        .env("GIT_COMMITTER_NAME", "Test Author")
        .env("GIT_COMMITTER_EMAIL", "author@example.test");
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Who signs: an SSH key or a gpg key, with what git needs to use it.
enum Signer {
    Ssh { key: PathBuf },
    Gpg { home: PathBuf, email: String },
}

impl Signer {
    fn settings(&self) -> Vec<String> {
        match self {
            Signer::Ssh { key } => vec![
                "gpg.format=ssh".into(),
                format!("user.signingkey={}", key.display()),
            ],
            Signer::Gpg { email, .. } => vec![
                "gpg.format=openpgp".into(),
                format!("user.signingkey={email}"),
            ],
        }
    }

    fn env(&self) -> Vec<(&str, &Path)> {
        match self {
            Signer::Ssh { .. } => vec![],
            Signer::Gpg { home, .. } => vec![("GNUPGHOME", home.as_path())],
        }
    }

    /// Stages everything and makes a signed commit.
    fn commit(&self, repo: &TestRepo, message: &str) -> String {
        git_with(repo.path(), &[], &[], &["add", "-A"]);
        git_with(
            repo.path(),
            &self.settings(),
            &self.env(),
            &["commit", "-q", "--allow-empty", "-S", "-m", message],
        );
        repo.head()
    }
}

/// A gpg key for `email` in its own `GNUPGHOME` under `dir`, and its
/// armored public key.
fn gpg_key(dir: &Path, email: &str) -> (Signer, String) {
    let home = dir.join(format!("gnupg-{email}"));
    std::fs::create_dir_all(&home).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let gpg = |args: &[&str]| {
        let out = Command::new("gpg")
            .args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""])
            .args(args)
            .env("GNUPGHOME", &home)
            .output()
            .expect("cannot run gpg (apt-get install gnupg)");
        assert!(
            out.status.success(),
            "gpg {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    gpg(&[
        "--quick-gen-key",
        &format!("Test Signer <{email}>"),
        "ed25519",
        "sign",
        "never",
    ]);
    let armored = gpg(&["--armor", "--export", email]);
    (
        Signer::Gpg {
            home,
            email: email.to_string(),
        },
        armored,
    )
}

impl Drop for Signer {
    fn drop(&mut self) {
        if let Signer::Gpg { home, .. } = self {
            let _ = Command::new("gpgconf")
                .args(["--kill", "gpg-agent"])
                .env("GNUPGHOME", home)
                .output();
        }
    }
}

/// An allowed-signers line for the public half of `key`.
fn allowed(principal: &str, options: &str, key: &Path) -> String {
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let mut parts = public.split_whitespace();
    format!(
        "{principal} {options}{} {}\n",
        parts.next().unwrap(),
        parts.next().unwrap()
    )
}

struct Agent {
    dir: tempfile::TempDir,
    config: String,
}

impl Agent {
    fn new(repo: &TestRepo, source: &[(&str, String)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = TendConfig::new(dir.path(), &repo.url());
        for (key, value) in source {
            config = config.source(key, value);
        }
        let config = config.write().display().to_string();
        Agent { dir, config }
    }

    fn ssh(repo: &TestRepo, signers: &str, verify_all: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("allowed_signers");
        std::fs::write(&file, signers).unwrap();
        let agent = Agent::new(
            repo,
            &[
                ("verify", "\"ssh\"".into()),
                ("allowed_signers_file", format!("\"{}\"", file.display())),
                ("verify_all", verify_all.to_string()),
            ],
        );
        std::mem::forget(dir);
        agent
    }

    fn gpg(repo: &TestRepo, keyring: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keyring.asc");
        std::fs::write(&file, keyring).unwrap();
        let agent = Agent::new(
            repo,
            &[
                ("verify", "\"gpg\"".into()),
                ("gpg_keyring_file", format!("\"{}\"", file.display())),
            ],
        );
        std::mem::forget(dir);
        agent
    }

    /// `tend apply --format json`: exit code, operations made, report.
    fn apply(&self) -> (i32, Option<(usize, usize)>, serde_json::Value) {
        let out = Command::new(env!("CARGO_BIN_EXE_tend"))
            .args(["--config", &self.config, "apply", "--format", "json"])
            .current_dir(self.dir.path())
            .env_remove("TEND_CONFIG")
            .env_remove("TEND_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let report = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("no JSON report ({e}): {stderr}"));
        (
            out.status.code().unwrap_or(-1),
            support::applied(&report),
            report,
        )
    }

    /// Applies a head that must be accepted.
    fn accepts(&self, head: &str) {
        let (code, _, report) = self.apply();
        assert_eq!(code, 0, "{report}");
        assert_eq!(report["source"]["commit"].as_str(), Some(head), "{report}");
        assert!(report["source"]["error"].is_null(), "{report}");
    }

    /// Applies a head that must be refused for the commit `refused` (the
    /// head, or with `verify_all` one before it): the refusal's message;
    /// the last accepted commit stays, and nothing is done.
    fn refuses(&self, refused: &str, accepted: &str) -> String {
        let (code, operations, report) = self.apply();
        assert_eq!(code, 1, "{report}");
        assert_eq!(operations, Some((0, 0)), "{report}");
        assert_eq!(
            report["source"]["commit"].as_str(),
            Some(accepted),
            "{report}"
        );
        let message = report["source"]["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no source error: {report}"))
            .to_string();
        assert!(
            message.starts_with(&format!("refusing commit {refused}: signed by "))
                || message.starts_with(&format!("refusing commit {refused}: unsigned: ")),
            "{message}"
        );
        assert!(message.contains("unverified-commit.md"), "{message}");
        message
    }
}

fn first_commit(repo: &TestRepo, signer: &Signer) -> String {
    repo.write("orders.yaml", &manifest("orders", 10));
    signer.commit(repo, "orders")
}

#[test]
fn ssh_a_signed_head_is_applied_and_an_unsigned_one_refused() {
    let keys = tempfile::tempdir().unwrap();
    let key = new_key(&keys.path().join("alice"), "alice");
    let alice = Signer::Ssh { key: key.clone() };
    let repo = TestRepo::new();
    let accepted = first_commit(&repo, &alice);
    let agent = Agent::ssh(&repo, &allowed("alice@example.test", "", &key), false);
    agent.accepts(&accepted);

    repo.write("orders.yaml", &manifest("orders", 20));
    let unsigned = repo.commit("raise orders, unsigned");
    let message = agent.refuses(&unsigned, &accepted);
    assert!(
        message.contains(": unsigned: the commit carries no signature"),
        "{message}"
    );
    // Signed again on top: accepted (only the head is checked by default).
    let signed = alice.commit(&repo, "raise orders, signed");
    let (code, operations, report) = agent.apply();
    assert_eq!((code, operations), (0, Some((1, 1))), "{report}");
    assert_eq!(report["source"]["commit"].as_str(), Some(signed.as_str()));
}

#[test]
fn ssh_a_key_not_in_the_allowed_signers_is_refused_with_its_fingerprint() {
    let keys = tempfile::tempdir().unwrap();
    let alice_key = new_key(&keys.path().join("alice"), "alice");
    let mallory_key = new_key(&keys.path().join("mallory"), "mallory");
    let alice = Signer::Ssh {
        key: alice_key.clone(),
    };
    let mallory = Signer::Ssh {
        key: mallory_key.clone(),
    };
    let repo = TestRepo::new();
    let accepted = first_commit(&repo, &alice);
    let agent = Agent::ssh(&repo, &allowed("alice@example.test", "", &alice_key), false);
    agent.accepts(&accepted);
    repo.write("orders.yaml", &manifest("orders", 20));
    let head = mallory.commit(&repo, "raise orders");
    let message = agent.refuses(&head, &accepted);
    let fingerprint = fingerprint(&mallory_key.with_extension("pub"));
    assert!(
        message.contains(&format!(
            "signed by SSH key {fingerprint}: the key is not in "
        )),
        "{message}"
    );
}

#[test]
fn ssh_a_commit_altered_after_signing_is_refused() {
    let keys = tempfile::tempdir().unwrap();
    let key = new_key(&keys.path().join("alice"), "alice");
    let alice = Signer::Ssh { key: key.clone() };
    let repo = TestRepo::new();
    let accepted = first_commit(&repo, &alice);
    let agent = Agent::ssh(&repo, &allowed("alice@example.test", "", &key), false);
    agent.accepts(&accepted);

    repo.write("orders.yaml", &manifest("orders", 20));
    let signed = alice.commit(&repo, "raise orders to 20");
    // The same commit object, signature and all, pointing at another
    // tree (connectionLimit 99): what a tampered mirror would serve.
    repo.write("orders.yaml", &manifest("orders", 99));
    repo.git(&["add", "-A"]);
    let tree = repo.git(&["write-tree"]);
    let raw = repo.git(&["cat-file", "commit", &signed]);
    let original_tree = repo.git(&["rev-parse", &format!("{signed}^{{tree}}")]);
    let altered = raw.replacen(&original_tree, &tree, 1) + "\n";
    let file = keys.path().join("altered");
    std::fs::write(&file, altered).unwrap();
    let forged = repo.git(&[
        "hash-object",
        "-t",
        "commit",
        "-w",
        &file.display().to_string(),
    ]);
    repo.git(&["update-ref", "refs/heads/main", &forged]);
    repo.git(&["reset", "-q", "--hard"]);
    let message = agent.refuses(&forged, &accepted);
    assert!(
        message.contains("signed by alice@example.test (SSH key ")
            && message.contains("does not match the commit's content"),
        "{message}"
    );
}

#[test]
fn ssh_verify_all_refuses_an_unsigned_commit_inside_a_signed_range_and_merges_are_checked() {
    let keys = tempfile::tempdir().unwrap();
    let key = new_key(&keys.path().join("alice"), "alice");
    let alice = Signer::Ssh { key: key.clone() };
    let signers = allowed("alice@example.test", "namespaces=\"git\" ", &key);
    let repo = TestRepo::new();
    let accepted = first_commit(&repo, &alice);
    let every = Agent::ssh(&repo, &signers, true);
    let head_only = Agent::ssh(&repo, &signers, false);
    every.accepts(&accepted);
    head_only.accepts(&accepted);

    repo.write("orders.yaml", &manifest("orders", 20));
    let unsigned = repo.commit("unsigned, in the middle");
    repo.write("orders.yaml", &manifest("orders", 30));
    let head = alice.commit(&repo, "signed head");
    // The refusal names the unsigned commit, not the signed head.
    let message = every.refuses(&unsigned, &accepted);
    assert!(message.contains(": unsigned: "), "{message}");
    head_only.accepts(&head);

    // A signed merge of an unsigned side branch.
    let every = Agent::ssh(&repo, &signers, true);
    every.accepts(&head);
    repo.git(&["checkout", "-q", "-b", "side"]);
    repo.write("billing.yaml", &manifest("billing", 5));
    let side = repo.commit("unsigned side commit");
    repo.git(&["checkout", "-q", "main"]);
    git_with(
        repo.path(),
        &alice.settings(),
        &[],
        &["merge", "-q", "--no-ff", "-S", "-m", "signed merge", "side"],
    );
    let merge = repo.head();
    let (code, _, report) = every.apply();
    assert_eq!(code, 1, "{report}");
    let message = report["source"]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("refusing commit {side}: unsigned")),
        "{message} (merge {merge})"
    );
    assert_eq!(report["source"]["commit"].as_str(), Some(head.as_str()));
}

#[test]
fn ssh_an_allowed_signer_whose_valid_before_has_passed_is_refused() {
    let keys = tempfile::tempdir().unwrap();
    let key = new_key(&keys.path().join("alice"), "alice");
    let alice = Signer::Ssh { key: key.clone() };
    let repo = TestRepo::new();
    let accepted = first_commit(&repo, &alice);
    let agent = Agent::ssh(
        &repo,
        &allowed("alice@example.test", "valid-before=\"20200101\" ", &key),
        false,
    );
    // Never accepted, so nothing is in force: no declarations at all.
    let (code, operations, report) = agent.apply();
    assert_eq!((code, operations), (1, Some((0, 0))), "{report}");
    assert!(report["source"]["commit"].is_null(), "{report}");
    let message = report["source"]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "refusing commit {accepted}: signed by alice@example.test"
        )) && message.contains("was valid only before 2020-01-01T00:00:00Z"),
        "{message}"
    );
}

#[test]
fn gpg_signed_heads_by_the_keyring_are_applied_others_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, alice_public) = gpg_key(dir.path(), "alice@example.test");
    let (mallory, _) = gpg_key(dir.path(), "mallory@example.test");
    let repo = TestRepo::new();
    let accepted = first_commit(&repo, &alice);
    let agent = Agent::gpg(&repo, &alice_public);
    agent.accepts(&accepted);

    repo.write("orders.yaml", &manifest("orders", 20));
    let unsigned = repo.commit("unsigned");
    let message = agent.refuses(&unsigned, &accepted);
    assert!(message.contains(": unsigned: "), "{message}");

    let foreign = mallory.commit(&repo, "signed by mallory");
    let message = agent.refuses(&foreign, &accepted);
    assert!(
        message.contains("signed by OpenPGP key ") && message.contains("the key is not in "),
        "{message}"
    );

    let signed = alice.commit(&repo, "signed by alice");
    let (code, operations, report) = agent.apply();
    assert_eq!((code, operations), (0, Some((1, 1))), "{report}");
    assert_eq!(report["source"]["commit"].as_str(), Some(signed.as_str()));

    // Altered after signing: the message changed, the signature kept.
    let raw = repo.git(&["cat-file", "commit", &signed]);
    let altered = raw.replacen("signed by alice", "signed by alice, then edited", 1) + "\n";
    let file = dir.path().join("altered");
    std::fs::write(&file, altered).unwrap();
    let forged = repo.git(&[
        "hash-object",
        "-t",
        "commit",
        "-w",
        &file.display().to_string(),
    ]);
    repo.git(&["update-ref", "refs/heads/main", &forged]);
    let message = agent.refuses(&forged, &signed);
    assert!(
        message.contains("Test Signer <alice@example.test>")
            && message.contains("does not match the commit's content"),
        "{message}"
    );
}

#[test]
fn verify_settings_that_cannot_work_are_configuration_errors() {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10));
    repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    let signers = dir.path().join("allowed_signers");
    std::fs::write(&signers, "alice@example.test cert-authority ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE6JZUUoW8FVth3yBPI9h6Il/Y1jruBtxeEKyRpGKPGb\n").unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "# nobody\n").unwrap();
    for (settings, expect) in [
        (vec![("verify", "\"ssh\"")], "needs allowed_signers_file"),
        (vec![("verify", "\"gpg\"")], "needs gpg_keyring_file"),
        (
            vec![("allowed_signers_file", "\"allowed_signers\"")],
            "verify = \"none\"",
        ),
        (vec![("verify_all", "true")], "verify_all = true needs"),
        (
            vec![
                ("verify", "\"ssh\""),
                ("allowed_signers_file", "\"missing\""),
            ],
            "cannot read",
        ),
        (
            vec![("verify", "\"ssh\""), ("allowed_signers_file", "\"empty\"")],
            "would refuse every commit",
        ),
        (
            vec![
                ("verify", "\"ssh\""),
                ("allowed_signers_file", "\"allowed_signers\""),
            ],
            "allowed_signers:1: cert-authority",
        ),
        (
            vec![("verify", "\"gpg\""), ("gpg_keyring_file", "\"empty\"")],
            "empty",
        ),
    ] {
        let mut config = TendConfig::new(dir.path(), &repo.url());
        for (key, value) in &settings {
            config = config.source(key, value);
        }
        let config = config.write();
        let run =
            TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(78);
        assert!(run.stderr.contains(expect), "{settings:?}: {}", run.stderr);
    }
}

#[test]
fn the_running_agent_keeps_the_accepted_commit_and_a_reload_trusts_a_new_key() {
    let keys = tempfile::tempdir().unwrap();
    let alice_key = new_key(&keys.path().join("alice"), "alice");
    let bob_key = new_key(&keys.path().join("bob"), "bob");
    let alice = Signer::Ssh {
        key: alice_key.clone(),
    };
    let bob = Signer::Ssh {
        key: bob_key.clone(),
    };
    let repo = TestRepo::new();
    let accepted = first_commit(&repo, &alice);
    let dir = tempfile::tempdir().unwrap();
    let signers = dir.path().join("allowed_signers");
    std::fs::write(&signers, allowed("alice@example.test", "", &alice_key)).unwrap();
    let port = support::git::free_port();
    let config = TendConfig::new(dir.path(), &repo.url())
        .source("verify", "\"ssh\"")
        .source("allowed_signers_file", "\"allowed_signers\"")
        .source("interval", "\"1h\"")
        .reconcile("resync", "\"1h\"")
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .write();
    let daemon = support::daemon::Daemon::start(&config, port, &[]);
    daemon.wait_ready();
    assert_eq!(daemon.status()["source"]["commit"], accepted.as_str());

    // Bob is not trusted yet: his commit (noticed by the watch on the
    // local repository) is refused, and the agent stays at Alice's.
    repo.write("orders.yaml", &manifest("orders", 20));
    let bobs = bob.commit(&repo, "raise orders");
    let refusal = format!("refusing commit {bobs}: signed by SSH key ");
    daemon.wait_for("the refusal", std::time::Duration::from_secs(20), || {
        daemon.status()["source"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(&refusal))
    });
    let status = daemon.status();
    assert_eq!(status["source"]["commit"], accepted.as_str(), "{status:#}");

    // The operator trusts Bob and reloads: the same head is accepted.
    std::fs::write(
        &signers,
        allowed("alice@example.test", "", &alice_key) + &allowed("bob@example.test", "", &bob_key),
    )
    .unwrap();
    daemon.signal("HUP");
    daemon.wait_for(
        "the accepted head",
        std::time::Duration::from_secs(20),
        || {
            let status = daemon.status();
            status["source"]["commit"] == bobs.as_str() && status["source"]["error"].is_null()
        },
    );
    assert!(
        daemon.log().contains(&format!(
            "commit {bobs} is signed by bob@example.test (SSH key "
        )),
        "{}",
        daemon.log()
    );
}

#[test]
fn gpg_a_key_that_has_expired_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("gnupg");
    std::fs::create_dir_all(&home).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    // gpg living on 2020-01-01: the key made then expires a day later,
    // and git signs with it "then".
    let wrapper = dir.path().join("gpg-2020");
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nexec gpg --faked-system-time 20200101T000000 \"$@\"\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let gpg = |args: &[&str]| {
        let out = Command::new(&wrapper)
            .args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""])
            .args(args)
            .env("GNUPGHOME", &home)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    gpg(&[
        "--quick-gen-key",
        "Old Key <old@example.test>",
        "ed25519",
        "sign",
        "1d",
    ]);
    let keyring = gpg(&["--armor", "--export", "old@example.test"]);
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10));
    git_with(repo.path(), &[], &[], &["add", "-A"]);
    git_with(
        repo.path(),
        &[
            format!("gpg.program={}", wrapper.display()),
            "user.signingkey=old@example.test".into(),
        ],
        &[("GNUPGHOME", home.as_path())],
        &["commit", "-q", "-S", "-m", "signed in 2020"],
    );
    let head = repo.head();
    let agent = Agent::gpg(&repo, &keyring);
    let (code, operations, report) = agent.apply();
    assert_eq!((code, operations), (1, Some((0, 0))), "{report}");
    let message = report["source"]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("refusing commit {head}: signed by OpenPGP key "))
            && message.contains("Old Key <old@example.test>")
            && message.contains("the key expired at 2020-01-02T00:00:00Z"),
        "{message}"
    );
    let _ = Command::new("gpgconf")
        .args(["--kill", "gpg-agent"])
        .env("GNUPGHOME", &home)
        .output();
}
