//! tend operated in the shape it ships (docs/operations.md): the agent runs
//! as an unprivileged user of its own with `UMask=0077` and its state in a
//! 0700 directory that user owns (what systemd makes of `DynamicUser=yes`
//! and `StateDirectory=`); operators type commands from root's shell, with
//! root's `HOME`. Real processes, a real `git daemon` remote.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::TendCommand;
use support::config::TendConfig;
use support::daemon::Daemon;
use support::git::{GitDaemon, TestRepo, free_port, manifest};
use support::receiver::Receiver;
use support::users::{AGENT, OsUser, ROOT, listing, not_owned_by, require_root, state_dir_for};

/// A host: the declarations served by `git daemon`, a configuration
/// anyone may read, and a state dir the agent's user owns.
struct Site {
    dir: tempfile::TempDir,
    repo: TestRepo,
    _git: GitDaemon,
    port: u16,
}

impl Site {
    fn new() -> Self {
        Self::with(|config| config)
    }

    fn with(configure: impl FnOnce(TendConfig) -> TendConfig) -> Self {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let repo = TestRepo::new();
        repo.write("orders.yaml", &manifest("orders", 10))
            .write("billing.yaml", &manifest("billing", 20));
        repo.commit("two databases");
        let served = dir.path().join("served");
        std::fs::create_dir(&served).unwrap();
        repo.bare_clone(&served);
        let git = GitDaemon::start(&served);
        state_dir_for(AGENT, &dir.path().join("state"));
        let port = free_port();
        let config = TendConfig::new(dir.path(), &git.url("repo.git"))
            .top("agent_id", Some("\"platform-eu\""))
            .server("listen", &format!("\"127.0.0.1:{port}\""))
            .reconcile("resync", "\"1h\"");
        let path = configure(config).write();
        chmod(&path, 0o644);
        Site {
            dir,
            repo,
            _git: git,
            port,
        }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("tend.toml")
    }

    /// The remote's repository goes away: every fetch fails.
    fn stop_git(&self) {
        let served = self.dir.path().join("served");
        std::fs::rename(served.join("repo.git"), served.join("away.git")).unwrap();
    }

    /// The remote's repository is back.
    fn restart_git(&self) {
        let served = self.dir.path().join("served");
        std::fs::rename(served.join("away.git"), served.join("repo.git")).unwrap();
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// `tend ARGS` as `user`, expecting `code`.
    fn tend(&self, user: OsUser, args: &[&str], code: i32) -> support::RunOutput {
        let config = self.config().display().to_string();
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        TendCommand::new(&all)
            .current_dir(self.dir.path())
            .env("HOME", "/root")
            .run_as(user)
            .expect_code(code)
    }

    fn start_agent(&self) -> Daemon {
        let daemon = Daemon::start_as(&self.config(), self.port, &[("HOME", "/root")], AGENT);
        daemon.wait_ready();
        daemon
    }

    /// The resource `name` of the running agent's report.
    fn resource(daemon: &Daemon, name: &str) -> serde_json::Value {
        daemon.status()["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no resource {name}"))
    }

    /// The sandbox's `connectionLimit` of `name`, as root reads it.
    fn limit(&self, name: &str) -> String {
        let out = self.tend(ROOT, &["sandbox", "list"], 0).stdout;
        let mut lines = out
            .lines()
            .skip_while(|l| l.split_whitespace().next() != Some(name))
            .skip(1)
            .take_while(|l| l.starts_with("    "));
        lines
            .find_map(|l| l.trim().strip_prefix("connectionLimit = "))
            .unwrap_or_else(|| panic!("no connectionLimit of {name}:\n{out}"))
            .to_string()
    }
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn assert_all_agents(site: &Site) {
    let foreign = not_owned_by(AGENT, &site.state());
    assert!(
        foreign.is_empty(),
        "files in the state dir the agent's user does not own: {foreign:#?}"
    );
}

#[test]
fn operator_commands_beside_the_running_agent_are_carried_out_by_it() {
    let site = Site::new();
    let daemon = site.start_agent();

    let set = site.tend(
        ROOT,
        &[
            "override",
            "set",
            "orders",
            "--ignore-fields",
            "connectionLimit",
            "--reason",
            "INC-1",
            "--expires",
            "30m",
        ],
        0,
    );
    assert!(
        set.stdout.contains("the running agent honours it"),
        "{}",
        set.stdout
    );
    site.tend(ROOT, &["state", "reset-attempts", "orders"], 0);
    let reconcile = site.tend(ROOT, &["reconcile", "orders"], 0);
    assert!(
        reconcile.stdout.contains("reconciles every resource now"),
        "{}",
        reconcile.stdout
    );
    let refused = site.tend(
        ROOT,
        &["deletions", "approve", "orders", "--reason", "x"],
        1,
    );
    assert!(
        refused
            .stderr
            .contains("no removed declaration with deletionPolicy Delete is named orders"),
        "{}",
        refused.stderr
    );
    // A name nobody declared: refused by the agent, nothing written.
    site.tend(
        ROOT,
        &["override", "set", "ordres", "--pause", "--reason", "x"],
        1,
    );
    daemon.wait_for(
        "the local override in the agent's report",
        Duration::from_secs(20),
        || {
            Site::resource(&daemon, "orders")["override"]["source"]
                .as_str()
                .is_some_and(|s| s.contains("local"))
        },
    );
    let log = daemon.log();
    for command in [
        "tend override set by uid 0",
        "tend state reset-attempts by uid 0",
        "tend reconcile by uid 0",
        "tend deletions approve by uid 0",
    ] {
        assert!(
            log.contains(&format!("control: {command}")),
            "the agent carried out `{command}`:\n{log}"
        );
    }
    site.tend(ROOT, &["override", "clear", "orders"], 0);
    daemon.wait_for("the override cleared", Duration::from_secs(20), || {
        Site::resource(&daemon, "orders")["override"].is_null()
    });
    // Another user (not root, not the agent's, no group configured):
    // refused by the socket's permissions, saying how.
    let other = OsUser {
        uid: 4242,
        gid: 4242,
        groups: &[],
        umask: 0o022,
    };
    let denied = site.tend(other, &["suspend", "--reason", "x"], 1);
    assert!(
        denied.stderr.contains("refuses this user") || denied.stderr.contains("Permission denied"),
        "{}",
        denied.stderr
    );
    assert_all_agents(&site);
}

/// `[control] group`: its members may use the channel; everyone else is
/// refused. The socket lives where the group can reach it (a directory of
/// the agent's, 0755, like the unit's RuntimeDirectory=).
#[test]
fn members_of_the_control_group_may_ask_and_others_may_not() {
    // `users` (gid 100) exists on Debian systems.
    const USERS: u32 = 100;
    let site = Site::with(|config| {
        config.section("control", "group", "\"users\"").section(
            "control",
            "socket",
            "\"run/control.sock\"",
        )
    });
    let run = site.dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::os::unix::fs::chown(&run, Some(AGENT.uid), Some(AGENT.gid)).unwrap();
    chmod(&run, 0o755);
    let agent = OsUser {
        groups: &[USERS],
        ..AGENT
    };
    let daemon = Daemon::start_as(&site.config(), site.port, &[], agent);
    daemon.wait_ready();
    let member = OsUser {
        uid: 4242,
        gid: 4242,
        groups: &[USERS],
        umask: 0o022,
    };
    let done = site.tend(member, &["reconcile"], 0);
    assert!(
        done.stdout.contains("reconciles every resource"),
        "{}",
        done.stdout
    );
    let stranger = OsUser {
        uid: 4243,
        gid: 4243,
        groups: &[],
        umask: 0o022,
    };
    let denied = site.tend(stranger, &["reconcile"], 1);
    assert!(
        denied.stderr.contains("refuses this user"),
        "{}",
        denied.stderr
    );
    assert!(daemon.log().contains("control: tend reconcile by uid 4242"));
    assert!(!daemon.log().contains("by uid 4243"));
}

#[test]
fn without_an_agent_root_writes_the_state_as_its_owner() {
    let site = Site::new();
    site.tend(AGENT, &["apply"], 0);
    // Break-glass works with Git unreachable.
    site.stop_git();
    for args in [
        &["override", "set", "orders", "--pause", "--reason", "INC-2"][..],
        &["state", "reset-attempts", "billing"],
        &["suspend", "--reason", "change freeze", "--expires", "2h"],
        &["resume"],
        &["sandbox", "edit", "billing", "--set", "connectionLimit=500"],
    ] {
        site.tend(ROOT, args, 0);
        assert_all_agents(&site);
    }
    // The rollback runbook's `tend apply`, as root: a cycle as the owner
    // (on the last accepted commit: the source is down, so exit 1).
    site.tend(ROOT, &["apply"], 1);
    assert_all_agents(&site);
    // `tend reconcile` needs an agent: said so, nothing written.
    let none = site.tend(ROOT, &["reconcile"], 1);
    assert!(
        none.stderr.contains("no agent is running"),
        "{}",
        none.stderr
    );
    let list = site.tend(ROOT, &["override", "list"], 0).stdout;
    assert!(list.contains("orders") && list.contains("INC-2"), "{list}");
    // And the agent works on what root left.
    site.restart_git();
    let daemon = site.start_agent();
    assert_eq!(Site::resource(&daemon, "orders")["state"], "Overridden");
    drop(daemon);
    assert_all_agents(&site);
}

#[test]
fn readers_leave_the_state_dir_as_they_found_it_whoever_runs_them() {
    let site = Site::new();
    site.tend(AGENT, &["apply"], 0);
    site.tend(
        AGENT,
        &["sandbox", "edit", "orders", "--set", "connectionLimit=99"],
        0,
    );
    let before = listing(&site.state(), true);
    let declarations = site.repo.path().display().to_string();
    for (args, _what) in [
        (&["plan"][..], "plan"),
        (&["plan", "--format", "json"], "plan json"),
        (&["explain", "orders"], "explain"),
        (&["status"], "status"),
        (&["propose", "orders"], "propose"),
        (&["state", "show"], "state show"),
        (&["state", "check"], "state check"),
        (&["override", "list"], "override list"),
        (&["deletions", "list"], "deletions list"),
        (&["sandbox", "list"], "sandbox list"),
        (&["config", "check"], "config check"),
        (&["validate", declarations.as_str()], "validate"),
    ] {
        let config = site.config().display().to_string();
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        // Whatever the exit code (plan: drift pending): only what it left.
        let _ = std::process::Command::new(env!("CARGO_BIN_EXE_tend"))
            .args(&all)
            .env("HOME", "/root")
            .current_dir(site.dir.path())
            .output()
            .unwrap();
        assert_eq!(
            listing(&site.state(), true),
            before,
            "`tend {}` as root changed the state dir",
            args.join(" ")
        );
    }
    // Beside the running agent: nothing of root's appears.
    let daemon = site.start_agent();
    for args in [
        &["plan"][..],
        &["explain", "orders"],
        &["status"],
        &["state", "show"],
    ] {
        let config = site.config().display().to_string();
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        let _ = std::process::Command::new(env!("CARGO_BIN_EXE_tend"))
            .args(&all)
            .current_dir(site.dir.path())
            .output()
            .unwrap();
    }
    assert_all_agents(&site);
    // The agent still fetches and publishes: a new commit is applied.
    site.repo.write("orders.yaml", &manifest("orders", 11));
    site.repo.commit("orders 11");
    let served = site.dir.path().join("served/repo.git");
    support::git::git(
        site.repo.path(),
        &["push", "-q", &served.display().to_string(), "main"],
    );
    site.tend(ROOT, &["reconcile"], 0);
    daemon.wait_for("the new commit applied", Duration::from_secs(30), || {
        daemon.status()["source"]["commit"] == site.repo.head().as_str()
            && Site::resource(&daemon, "orders")["state"] == "InSync"
    });
}

#[test]
fn tend_suspend_stops_a_pending_correction_and_resume_lets_it_run() {
    let receiver = Receiver::start(&[]);
    let site = Site::with(|config| {
        config
            .reconcile("drift_grace", "\"1s\"")
            .notify(&[("url", &format!("\"{}\"", receiver.url()))])
    });
    let daemon = site.start_agent();
    let suspended = site.tend(
        ROOT,
        &["suspend", "--reason", "INC-3 freeze", "--expires", "1h"],
        0,
    );
    assert!(
        suspended.stdout.contains("INC-3 freeze"),
        "{}",
        suspended.stdout
    );
    // Out-of-band drift, past its grace: corrected if not suspended.
    site.tend(
        ROOT,
        &["sandbox", "edit", "orders", "--set", "connectionLimit=500"],
        0,
    );
    site.tend(ROOT, &["reconcile"], 0);
    std::thread::sleep(Duration::from_secs(2));
    site.tend(ROOT, &["reconcile"], 0);
    daemon.wait_for(
        "orders held by the suspension",
        Duration::from_secs(20),
        || {
            let orders = Site::resource(&daemon, "orders");
            orders["state"] == "Drifted"
                && orders["action"] == "Hold"
                && orders["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("suspended") && r.contains("INC-3 freeze"))
        },
    );
    assert_eq!(site.limit("orders"), "500", "not corrected");
    let report = daemon.status();
    assert_eq!(report["suspended"]["reason"], "INC-3 freeze");
    assert_eq!(report["suspended"]["inForce"], true);
    let ready = daemon.get("/readyz").unwrap();
    assert!(
        ready.status == 200 && ready.body.contains("SUSPENDED"),
        "{}",
        ready.body
    );
    let metrics = daemon.get("/metrics").unwrap().body;
    assert!(metrics.contains("tend_suspended 1"), "{metrics}");
    let text = site.tend(ROOT, &["status"], 0).stdout;
    assert!(text.contains("SUSPENDED since"), "{text}");
    daemon.wait_for("a suspended notification", Duration::from_secs(20), || {
        receiver.events().contains(&"suspended".to_string())
    });

    site.tend(ROOT, &["resume"], 0);
    daemon.wait_for(
        "orders corrected after resume",
        Duration::from_secs(20),
        || Site::resource(&daemon, "orders")["state"] == "InSync",
    );
    assert_eq!(site.limit("orders"), "10");
    assert!(daemon.status()["suspended"].is_null());
    assert!(
        daemon
            .get("/metrics")
            .unwrap()
            .body
            .contains("tend_suspended 0")
    );
    daemon.wait_for("the freeze's end notified", Duration::from_secs(20), || {
        receiver.received().iter().any(|r| {
            let body = r.json();
            body["event"] == "recovered" && body["ended"] == serde_json::json!(["suspended"])
        })
    });
}

/// While the configuration file is broken (an edit in progress), `tend
/// status` still shows the running agent's report, and says why the file
/// does not load; `tend override set` still reaches the agent.
#[test]
fn a_broken_configuration_file_does_not_hide_the_running_agent() {
    let site = Site::new();
    let daemon = site.start_agent();
    let good = std::fs::read_to_string(site.config()).unwrap();
    std::fs::write(site.config(), format!("{good}\n[reconcile\n")).unwrap();
    let status = site.tend(ROOT, &["status", "--format", "json"], 0);
    assert_eq!(status.json()["summary"]["inSync"], 2);
    assert!(
        status.stderr.contains("warning") && status.stderr.contains("invalid configuration"),
        "{}",
        status.stderr
    );
    let set = site.tend(
        ROOT,
        &["override", "set", "orders", "--pause", "--reason", "INC-6"],
        0,
    );
    assert!(
        set.stdout.contains("the running agent honours it"),
        "{}",
        set.stdout
    );
    site.tend(ROOT, &["config", "check"], 78);
    drop(daemon);
    // Without the agent, the broken file is what is said (78).
    site.tend(ROOT, &["status"], 78);
}

/// The unit's `ExecReload=` lines, run by hand as systemd runs them (in
/// order, stopping at the first that fails): a broken configuration fails
/// the reload before the agent is signalled.
#[test]
fn the_units_reload_fails_on_a_broken_configuration() {
    let site = Site::new();
    let daemon = site.start_agent();
    let unit = std::fs::read_to_string(support::repo_root().join("systemd/tend.service")).unwrap();
    let lines: Vec<String> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("ExecReload="))
        .map(|l| {
            l.replace("/usr/bin/tend", env!("CARGO_BIN_EXE_tend"))
                .replace("/etc/tend/tend.toml", &site.config().display().to_string())
                .replace("$MAINPID", &daemon.pid().to_string())
        })
        .collect();
    assert!(lines.len() >= 2, "{lines:?}");
    let reload = || -> Option<i32> {
        for line in &lines {
            let status = AGENT
                .apply(std::process::Command::new("sh").args(["-c", line]))
                .status()
                .unwrap();
            if !status.success() {
                return status.code();
            }
        }
        Some(0)
    };
    let good = std::fs::read_to_string(site.config()).unwrap();
    std::fs::write(site.config(), format!("{good}\nbogus_key = 1\n")).unwrap();
    assert_eq!(reload(), Some(78), "a broken file fails the reload");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !daemon.log().contains("configuration reload"),
        "the agent was never signalled:\n{}",
        daemon.log()
    );
    std::fs::write(site.config(), &good).unwrap();
    assert_eq!(reload(), Some(0));
    daemon.wait_for("the reload", Duration::from_secs(20), || {
        daemon.log().contains("configuration reloaded")
    });
}

/// docs/runbooks/rollback.md, as written: keep a copy, check the pinned
/// agent id, move the state database away, start again. Every database
/// stays managed (none Blocked as another agent's).
#[test]
fn the_rollback_runbook_as_written_keeps_every_database_managed() {
    let site = Site::new();
    site.tend(AGENT, &["apply"], 0);
    let show = site.tend(ROOT, &["state", "show"], 0).stdout;
    assert!(show.starts_with("agent_id: platform-eu\n"), "{show}");
    let old = site.dir.path().join("old-state");
    std::fs::create_dir(&old).unwrap();
    let moved = std::process::Command::new("sh")
        .args([
            "-c",
            &format!(
                "for f in state.db state.db-wal state.db-shm; do if [ -e \"{dir}/$f\" ]; then mv \"{dir}/$f\" {old}/; fi; done",
                dir = site.state().display(),
                old = old.display()
            ),
        ])
        .status()
        .unwrap();
    assert!(moved.success());
    let plan = site.tend(ROOT, &["plan", "--format", "json"], 0).json();
    for r in plan["resources"].as_array().unwrap() {
        assert_eq!(r["state"], "InSync", "{r:#}");
    }
    let daemon = site.start_agent();
    let report = daemon.status();
    assert_eq!(report["summary"]["blocked"], 0, "{report:#}");
    assert_eq!(report["summary"]["inSync"], 2, "{report:#}");
}

/// A state started afresh without its agent id (no `agent_id` in the
/// configuration, the state moved away): every database carries the old
/// id's marker, and the report says so in one line naming the id to set,
/// not one Blocked row per database.
#[test]
fn a_new_state_beside_another_agents_databases_says_so_in_one_line() {
    let site = Site::with(|config| config.top("agent_id", None));
    site.tend(AGENT, &["apply"], 0);
    let show = site.tend(ROOT, &["state", "show"], 0).stdout;
    let old = show
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("agent_id: "))
        .unwrap()
        .to_string();
    std::fs::remove_file(site.state().join("state.db")).unwrap();
    let plan = site.tend(ROOT, &["plan"], 0).stdout;
    let lines: Vec<&str> = plan
        .lines()
        .filter(|l| l.contains("ownership marker"))
        .collect();
    assert_eq!(lines.len(), 1, "one line for the fleet:\n{plan}");
    assert!(
        !plan
            .lines()
            .any(|l| l.starts_with("billing") || l.starts_with("orders")),
        "no Blocked row per database:\n{plan}"
    );
    assert!(
        lines[0].starts_with("2 databases (billing, orders) carry the ownership marker")
            && lines[0].contains(&format!("set agent_id = \"{old}\"")),
        "{plan}"
    );
    let json = site.tend(ROOT, &["plan", "--format", "json"], 0).json();
    for r in json["resources"].as_array().unwrap() {
        assert_eq!(r["state"], "Blocked");
        assert_eq!(r["ownedBy"], old.as_str());
    }
}

/// `tend state backup` beside the running agent, as root: a consistent
/// copy, the state dir untouched; restored as the state-recovery runbook
/// says, the agent carries on with every database managed.
#[test]
fn a_backup_taken_beside_the_agent_restores_to_a_working_state() {
    let site = Site::new();
    let daemon = site.start_agent();
    site.tend(
        ROOT,
        &["override", "set", "orders", "--pause", "--reason", "INC-5"],
        0,
    );
    let backup = site.dir.path().join("backup.db");
    let done = site.tend(ROOT, &["state", "backup", backup.to_str().unwrap()], 0);
    assert!(done.stdout.contains("backed up"), "{}", done.stdout);
    let again = site.tend(ROOT, &["state", "backup", backup.to_str().unwrap()], 1);
    assert!(again.stderr.contains("does not exist"), "{}", again.stderr);
    assert_all_agents(&site);
    drop(daemon);
    // The runbook's restore: the copy in place, owned by the state's user.
    let state_db = site.state().join("state.db");
    let restored = std::process::Command::new("install")
        .args(["-o", "61234", "-g", "61234", "-m", "0600"])
        .arg(&backup)
        .arg(&state_db)
        .status()
        .unwrap();
    assert!(restored.success());
    let check = site.tend(ROOT, &["state", "check"], 0);
    assert!(check.stdout.contains(": ok"), "{}", check.stdout);
    let daemon = site.start_agent();
    let report = daemon.status();
    assert_eq!(report["summary"]["blocked"], 0, "{report:#}");
    assert_eq!(
        Site::resource(&daemon, "orders")["override"]["reason"],
        "INC-5",
        "the backup held the local override"
    );
    drop(daemon);
    assert_all_agents(&site);
}
