//! tend as systemd runs it: the Debian package installed with `dpkg -i`
//! into a real systemd booted as PID 1 of a private namespace
//! (tests/support/systemd.rs says how, and why the host is safe), then the
//! unit driven with `systemctl` and read with `journalctl` — readiness,
//! reload, the journal's fields, the dynamic user and its credentials, the
//! watchdog and the restart policy, a stop during a slow operation,
//! operators' commands beside the unit, an upgrade and a purge. The
//! declarations are served by a `git daemon` and the HTTP provider by the
//! reference server, both on the host's loopback.

use crate::support;

use std::time::{Duration, Instant};

use support::config::TendConfig;
use support::daemon::request;
use support::git::{GitDaemon, TestRepo, free_port, git, manifest};
use support::systemd::{BootedSystem, package};

/// A freshly installed host: systemd booted, the package installed, the
/// declarations (`orders`, `billing`) on a `git daemon`.
struct Host {
    system: BootedSystem,
    repo: TestRepo,
    served: tempfile::TempDir,
    git: GitDaemon,
    /// The agent's HTTP port.
    port: u16,
}

impl Host {
    fn new() -> Self {
        let deb = package(1);
        let repo = TestRepo::new();
        repo.write("orders.yaml", &manifest("orders", 10))
            .write("billing.yaml", &manifest("billing", 20));
        repo.commit("two databases");
        let served = tempfile::tempdir().unwrap();
        repo.bare_clone(served.path());
        let git = GitDaemon::start(served.path());
        let system = BootedSystem::boot();
        let installed = system.install(&deb);
        assert_eq!(installed.code, Some(0), "{}", installed.all());
        Host {
            system,
            repo,
            served,
            git,
            port: free_port(),
        }
    }

    /// The service's configuration (docs/operations.md, "Configure"),
    /// with the test's remote and port.
    fn config(&self) -> TendConfig {
        TendConfig::new(std::path::Path::new("/etc/tend"), &self.git.url("repo.git"))
            .top("agent_id", Some("\"platform-eu\""))
            .top("state_dir", Some("\"/var/lib/tend\""))
            .source("interval", "\"1s\"")
            .server("listen", &format!("\"127.0.0.1:{}\"", self.port))
    }

    fn configure(&self, config: &TendConfig) {
        self.system.write("/etc/tend/tend.toml", &config.text());
    }

    /// Commits what the work tree holds and pushes it to the remote.
    fn push(&self, message: &str) -> String {
        let commit = self.repo.commit(message);
        git(
            self.repo.path(),
            &[
                "push",
                "-q",
                &self.served.path().join("repo.git").display().to_string(),
                "main",
            ],
        );
        commit
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        request(self.port, "GET", path, &[], b"").map(|r| (r.status, r.body))
    }

    /// `/v1/status` as JSON.
    fn status(&self) -> serde_json::Value {
        let (code, body) = self.get("/v1/status").expect("the agent answers");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// One resource's state in the agent's report (`None`: not reported).
    fn state_of(&self, name: &str) -> Option<String> {
        let (code, body) = self.get("/v1/status").filter(|(c, _)| *c == 200)?;
        let _ = code;
        let report: serde_json::Value = serde_json::from_str(&body).ok()?;
        report["resources"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == name)
            .and_then(|r| r["state"].as_str().map(str::to_string))
    }

    fn start(&self) {
        let start = self.system.sh("systemctl start tend");
        assert_eq!(
            start.code,
            Some(0),
            "{}\n{}",
            start.all(),
            self.system.sh("journalctl -u tend --no-pager -n 40").all()
        );
    }

    /// One resource of the agent's report.
    fn resource(&self, name: &str) -> serde_json::Value {
        self.status()["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no resource {name}"))
    }

    fn main_pid(&self) -> String {
        self.system.property("tend", "MainPID")
    }
}

#[test]
fn an_unconfigured_package_does_not_start_and_start_returns_once_ready() {
    let host = Host::new();
    // Installed and enabled, and the postinst's start refused by the
    // condition: `systemctl status` says which.
    assert_eq!(host.system.property("tend", "UnitFileState"), "enabled");
    assert_eq!(host.system.property("tend", "ActiveState"), "inactive");
    let status = host.system.sh("systemctl status tend --no-pager");
    assert!(
        status
            .stdout
            .contains("ConditionPathExists=/etc/tend/tend.toml was not met"),
        "{}",
        status.all()
    );
    assert!(
        host.get("/healthz").is_none(),
        "nothing may listen before the configuration exists"
    );

    host.configure(&host.config());
    host.start();
    // `systemctl start` returned: READY=1 was sent, so the first snapshot
    // is reconciled and /readyz answers 200 now, not eventually.
    let ready = host.get("/readyz").expect("the agent answers");
    assert_eq!(ready.0, 200, "{}", ready.1);
    assert_eq!(host.state_of("orders").as_deref(), Some("InSync"));
    assert_eq!(host.state_of("billing").as_deref(), Some("InSync"));
    assert_eq!(host.system.property("tend", "ActiveState"), "active");
    let line = host.system.property("tend", "StatusText");
    let commit = &host.repo.head()[..12];
    assert!(
        line.contains(commit) && line.contains("2 in sync"),
        "the status line names the commit and the counts: {line:?}"
    );
    let status = host.system.ok("systemctl status tend --no-pager");
    assert!(status.contains(&format!("Status: \"{line}\"")), "{status}");
    host.system.shutdown();
}

/// A declaration on the provider `provider`.
fn declaration_on(name: &str, provider: &str) -> String {
    format!("{}  provider: {provider}\n", manifest(name, 5))
}

#[test]
fn a_commit_is_applied_and_a_reload_applies_a_new_configuration_or_keeps_the_old() {
    let host = Host::new();
    host.configure(&host.config());
    host.start();
    let pid = host.main_pid();

    host.repo.write("ledger.yaml", &manifest("ledger", 7));
    host.push("a third database");
    host.system
        .wait_for("the pushed commit applied", Duration::from_secs(30), || {
            host.state_of("ledger").as_deref() == Some("InSync")
        });

    // A declaration for a provider the configuration does not have yet,
    // then the configuration that adds it, reloaded.
    host.repo
        .write("audit.yaml", &declaration_on("audit", "archive"));
    host.push("a database on a second provider");
    host.system
        .wait_for("the declaration reported", Duration::from_secs(30), || {
            host.status().to_string().contains("archive")
        });
    assert_ne!(host.state_of("audit").as_deref(), Some("InSync"));
    host.configure(
        &host
            .config()
            .section("providers.archive", "kind", "\"sandbox\""),
    );
    host.system.ok("systemctl reload tend");
    host.system.wait_for(
        "the reloaded provider reconciled",
        Duration::from_secs(30),
        || host.state_of("audit").as_deref() == Some("InSync"),
    );
    assert_eq!(host.main_pid(), pid, "a reload is not a restart");

    // A broken configuration: the reload fails, says why, and the agent
    // runs on as it was.
    host.configure(&host.config().reconcile("observ", "\"1m\""));
    let refused = host.system.sh("systemctl reload tend");
    assert_ne!(refused.code, Some(0), "{}", refused.all());
    assert_eq!(host.system.property("tend", "ActiveState"), "active");
    assert_eq!(host.main_pid(), pid);
    let journal = host.system.journal("tend");
    assert!(
        journal.contains("observ"),
        "the journal names the key the check refused:\n{journal}"
    );
    let status = host.system.sh("systemctl status tend --no-pager -l").stdout;
    assert!(status.contains("observ"), "{status}");
    assert_eq!(host.get("/readyz").map(|r| r.0), Some(200));
    host.system.shutdown();
}

#[test]
fn the_journal_carries_the_documented_fields_and_priorities() {
    let host = Host::new();
    host.configure(&host.config());
    host.start();
    // A reload signal with a configuration the agent refuses (sent
    // directly, past the unit's ExecReload check): an error line.
    host.configure(&host.config().reconcile("observ", "\"1m\""));
    host.system.ok("systemctl kill --signal=HUP tend");
    host.system
        .wait_for("the refused reload logged", Duration::from_secs(30), || {
            host.system
                .journal("tend")
                .contains("configuration reload refused")
        });

    let entries: Vec<serde_json::Value> = host
        .system
        .ok("journalctl -u tend --no-pager -o json")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let from_tend: Vec<&serde_json::Value> = entries
        .iter()
        .filter(|e| e["SYSLOG_IDENTIFIER"] == "tend")
        .collect();
    assert!(!from_tend.is_empty(), "no entry from tend: {entries:?}");
    for entry in &from_tend {
        assert_eq!(entry["_SYSTEMD_UNIT"], "tend.service", "{entry}");
        assert!(
            entry.get("F_PROVIDER").is_none(),
            "fields carry no prefix: {entry}"
        );
    }
    let create = from_tend
        .iter()
        .find(|e| e["RESOURCE"] == "orders" && e["KIND"] == "create")
        .unwrap_or_else(|| panic!("no create of orders with its fields: {from_tend:?}"));
    assert_eq!(create["PROVIDER"], "sandbox", "{create}");
    assert_eq!(
        create["PRIORITY"], "5",
        "info is the journal's notice (5): {create}"
    );
    assert!(
        create["OPERATION"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{create}"
    );
    let ready = from_tend
        .iter()
        .find(|e| {
            e["MESSAGE"]
                .as_str()
                .is_some_and(|m| m.contains("the first snapshot is reconciled"))
        })
        .expect("the ready line");
    assert_eq!(ready["PRIORITY"], "5", "{ready}");
    let refused = from_tend
        .iter()
        .find(|e| {
            e["MESSAGE"]
                .as_str()
                .is_some_and(|m| m.contains("configuration reload refused"))
        })
        .expect("the refused reload");
    assert_eq!(
        refused["PRIORITY"], "3",
        "a refused reload is an error: {refused}"
    );
    assert!(
        refused["MESSAGE"].as_str().unwrap().contains("observ"),
        "{refused}"
    );
    host.system.shutdown();
}

#[test]
fn the_dynamic_user_owns_the_state_alone_and_credentials_stay_secret() {
    let token = "tok-7c1e9b0d5f3a2e84";
    let webhook = "hook-4b8d2f6a9e1c3057";
    let host = Host::new();
    // The declarations over HTTP, behind the token.
    let http = support::git::HttpGitServer::start(host.served.path(), Some(token));
    host.system.write("/etc/tend/secrets/git-token", token);
    host.system
        .write("/etc/tend/secrets/webhook-secret", webhook);
    host.system.ok("chmod 0600 /etc/tend/secrets/*");
    host.system.write(
        "/etc/systemd/system/tend.service.d/credentials.conf",
        "[Service]\n\
         LoadCredential=git-token:/etc/tend/secrets/git-token\n\
         LoadCredential=webhook-secret:/etc/tend/secrets/webhook-secret\n",
    );
    host.system.ok("systemctl daemon-reload");
    host.configure(
        &host
            .config()
            .source("url", &format!("\"{}\"", http.url("repo.git")))
            .source("token_file", "\"$CREDENTIALS_DIRECTORY/git-token\"")
            .server(
                "webhook_secret_file",
                "\"$CREDENTIALS_DIRECTORY/webhook-secret\"",
            ),
    );
    host.start();
    assert_eq!(host.state_of("orders").as_deref(), Some("InSync"));

    // The agent runs as a dynamic user that owns the state, 0700, and
    // every file in it.
    let pid = host.main_pid();
    let uid: u32 = host
        .system
        .ok(&format!("stat -c %u /proc/{pid}"))
        .trim()
        .parse()
        .unwrap();
    assert!(
        (61184..=65519).contains(&uid),
        "a dynamic user's uid, not {uid}"
    );
    assert_eq!(
        host.system
            .ok("stat -c '%u %a' /var/lib/private/tend")
            .trim(),
        format!("{uid} 700")
    );
    assert_eq!(
        host.system.ok("readlink /var/lib/tend").trim(),
        "private/tend"
    );
    let foreign = host
        .system
        .ok(&format!("find /var/lib/private/tend ! -uid {uid}"));
    assert!(
        foreign.is_empty(),
        "files the agent does not own: {foreign}"
    );

    // Nothing else is writable in the agent's view of the system: its
    // mount namespace, entered at its own root (`-r`: the namespace's
    // root is the writable one systemd mounted the service's over).
    for path in [
        "/etc/tend/probe",
        "/etc/probe",
        "/usr/probe",
        "/var/probe",
        "/var/lib/probe",
        "/root/probe",
        "/home/probe",
        "/srv/probe",
    ] {
        let run = host
            .system
            .sh(&format!("nsenter -t {pid} -m -r -- touch {path}"));
        assert_ne!(run.code, Some(0), "the agent's view lets {path} be written");
    }
    host.system.ok(&format!(
        "nsenter -t {pid} -m -r -- touch /var/lib/tend/probe && rm /var/lib/tend/probe"
    ));

    // The secrets reached the agent (the fetch passed the token; a hook
    // signed with the secret is accepted) and appear nowhere else.
    let body = br#"{"ref":"refs/heads/main"}"#;
    let signature = tend::testing::server::webhook::sign(webhook.as_bytes(), body);
    let hook = request(
        host.port,
        "POST",
        "/hooks/git",
        &[
            ("X-GitHub-Event", "push"),
            ("X-Hub-Signature-256", &format!("sha256={signature}")),
            ("Content-Type", "application/json"),
        ],
        body,
    )
    .expect("the agent answers");
    assert_eq!(hook.status, 202, "{}", hook.body);
    let environ = host
        .system
        .ok(&format!("tr '\\0' '\\n' < /proc/{pid}/environ"));
    assert!(environ.contains("CREDENTIALS_DIRECTORY="), "{environ}");
    for secret in [token, webhook] {
        assert!(!environ.contains(secret), "a secret in the environment");
        let found = host.system.sh(&format!(
            "journalctl --no-pager -o verbose | grep -c {secret}; grep -rlI {secret} /var/lib/private/tend"
        ));
        assert_eq!(
            found.stdout.trim(),
            "0",
            "a secret in the journal or the state (reports included): {}",
            found.all()
        );
    }
    host.system.shutdown();
}

impl Host {
    /// A drop-in for the unit (`systemctl edit tend`), loaded.
    fn drop_in(&self, text: &str) {
        self.system
            .write("/etc/systemd/system/tend.service.d/test.conf", text);
        self.system.ok("systemctl daemon-reload");
    }

    fn restarts(&self) -> u32 {
        self.system.property("tend", "NRestarts").parse().unwrap()
    }
}

#[test]
fn a_wedged_loop_is_killed_by_the_watchdog_and_restarted() {
    let host = Host::new();
    // The test hook wedges every provider worker before its second cycle;
    // `observe` brings that cycle within a second.
    host.drop_in("[Service]\nEnvironment=FAILPOINTS=wedge=return\nWatchdogSec=3s\nRestartSec=1s\n");
    host.configure(&host.config().reconcile("observe", "\"1s\""));
    host.start();
    let first = host.main_pid();
    host.system
        .wait_for("a restart by the watchdog", Duration::from_secs(60), || {
            host.restarts() >= 1
        });
    let journal = host.system.journal("tend");
    assert!(
        journal.contains("Watchdog timeout"),
        "systemd's watchdog ended it:\n{journal}"
    );
    assert!(
        journal.contains("a provider worker is not making progress"),
        "tend said why it stopped feeding the watchdog:\n{journal}"
    );
    host.system
        .wait_for("the restarted agent", Duration::from_secs(30), || {
            let pid = host.main_pid();
            pid != "0" && pid != first
        });
    host.system.shutdown();
}

#[test]
fn a_configuration_error_exits_78_and_is_not_restarted() {
    let host = Host::new();
    host.drop_in("[Service]\nRestartSec=1s\n");
    host.configure(&host.config().reconcile("observ", "\"1m\""));
    let start = host.system.sh("systemctl start tend");
    assert_ne!(start.code, Some(0), "{}", start.all());
    // Well past RestartSec: still failed, never restarted.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(host.system.property("tend", "ActiveState"), "failed");
    assert_eq!(host.system.property("tend", "ExecMainStatus"), "78");
    assert_eq!(host.restarts(), 0, "a configuration error was restarted");
    let journal = host.system.journal("tend");
    assert!(journal.contains("observ"), "the key is named:\n{journal}");
    host.system.shutdown();
}

#[test]
fn a_transient_start_failure_is_restarted_until_it_passes() {
    let host = Host::new();
    host.drop_in("[Service]\nRestartSec=1s\n");
    host.configure(&host.config());
    // The agent's port is taken (on the shared loopback): exit 1, which
    // may pass, so systemd starts it again.
    let taken = std::net::TcpListener::bind(("127.0.0.1", host.port)).unwrap();
    host.system.ok("systemctl start --no-block tend");
    host.system.wait_for(
        "restarts while the port is taken",
        Duration::from_secs(30),
        || host.restarts() >= 2,
    );
    let journal = host.system.journal("tend");
    assert!(journal.contains("status=1/FAILURE"), "{journal}");
    drop(taken);
    host.system.wait_for(
        "the agent ready once the port is free",
        Duration::from_secs(30),
        || host.get("/readyz").is_some_and(|r| r.0 == 200),
    );
    assert_eq!(host.system.property("tend", "ActiveState"), "active");
    host.system.shutdown();
}

#[test]
fn a_stop_during_a_slow_operation_finishes_it_and_the_next_start_converges() {
    let host = Host::new();
    let provider = support::reference::ReferenceServer::start(&[]);
    host.configure(
        &host
            .config()
            .without_section("providers.sandbox")
            .section("providers.dbaas", "kind", "\"http\"")
            .section(
                "providers.dbaas",
                "endpoint",
                &format!("\"{}\"", provider.url()),
            ),
    );
    host.start();
    assert_eq!(provider.count("creates"), 2);

    // Creates now take 8 s; a new declaration's create is in flight when
    // the stop comes.
    provider.faults(serde_json::json!({ "operationDelayMs": 8000 }));
    host.repo.write("ledger.yaml", &manifest("ledger", 7));
    host.push("a third database");
    host.system
        .wait_for("the create in flight", Duration::from_secs(30), || {
            provider.count("creates") == 3
        });
    let started = Instant::now();
    host.system.ok("systemctl stop tend");
    let took = started.elapsed();
    assert_eq!(host.system.property("tend", "Result"), "success");
    assert_eq!(host.system.property("tend", "ExecMainStatus"), "0");
    assert!(
        took < Duration::from_secs(45),
        "the stop took {took:?}, past TimeoutStopSec"
    );
    let journal = host.system.journal("tend");
    assert!(
        !journal.contains("still running after"),
        "the operation finished within shutdown_timeout:\n{journal}"
    );

    provider.faults(serde_json::json!({}));
    host.start();
    assert_eq!(host.state_of("ledger").as_deref(), Some("InSync"));
    assert_eq!(provider.count("creates"), 3, "no second create of ledger");
    assert!(provider.database("ledger").is_some());
    host.system.shutdown();
}

#[test]
fn root_commands_beside_the_unit_take_effect_through_the_agent() {
    let host = Host::new();
    // Two databases that may be deleted; deleting both at once is more
    // than the guard allows, so their deletion waits for an operator.
    let deletable =
        |name: &str| manifest(name, 20).replace("spec:\n", "spec:\n  deletionPolicy: Delete\n");
    host.repo
        .write("billing.yaml", &deletable("billing"))
        .write("scratch.yaml", &deletable("scratch"));
    host.push("billing and scratch may be deleted");
    host.configure(
        &host
            .config()
            .reconcile("deletion_delay", "\"0s\"")
            .reconcile("max_deletions", "1"),
    );
    host.start();
    let tend = |args: &str| {
        host.system.sh(&format!(
            "cd /root && tend --config /etc/tend/tend.toml {args}"
        ))
    };

    let set =
        tend("override set orders --ignore-fields connectionLimit --reason INC-1 --expires 30m");
    assert_eq!(set.code, Some(0), "{}", set.all());
    assert!(
        set.stdout.contains("the running agent honours it"),
        "{}",
        set.all()
    );
    host.system.wait_for(
        "the override in the agent's report",
        Duration::from_secs(30),
        || {
            host.resource("orders")["override"]["source"]
                .as_str()
                .is_some_and(|s| s.contains("local"))
        },
    );

    host.repo.remove("billing.yaml").remove("scratch.yaml");
    host.push("billing and scratch go");
    host.system
        .wait_for("the deletions held", Duration::from_secs(30), || {
            host.resource("billing")["rule"] == "deletion-guard"
        });
    let approve = tend("deletions approve billing scratch --reason CHG-1");
    assert_eq!(approve.code, Some(0), "{}", approve.all());
    host.system
        .wait_for("both deleted by the agent", Duration::from_secs(30), || {
            let journal = host.system.journal("tend");
            journal.contains("delete billing: ") && journal.contains("delete scratch: ")
        });

    let reconcile = tend("reconcile");
    assert_eq!(reconcile.code, Some(0), "{}", reconcile.all());
    assert!(
        reconcile.stdout.contains("reconciles every resource now"),
        "{}",
        reconcile.all()
    );

    // Root's plan reads; it leaves the agent's state dir as it was: no
    // file of root's in it, and the agent goes on applying commits.
    let plan = tend("plan");
    assert!(matches!(plan.code, Some(0 | 2)), "{}", plan.all());
    let rooted = host.system.ok("find /var/lib/private/tend -uid 0");
    assert!(
        rooted.is_empty(),
        "root's plan left files in the state: {rooted}"
    );
    host.repo.write("ledger.yaml", &manifest("ledger", 7));
    host.push("a third database");
    host.system.wait_for(
        "a commit applied after root's plan",
        Duration::from_secs(30),
        || host.state_of("ledger").as_deref() == Some("InSync"),
    );
    let journal = host.system.journal("tend");
    for command in [
        "tend override set by uid 0",
        "tend deletions approve by uid 0",
        "tend reconcile by uid 0",
    ] {
        assert!(
            journal.contains(command),
            "{command} is not logged:\n{journal}"
        );
    }
    host.system.shutdown();
}

#[test]
fn an_upgrade_restarts_the_agent_and_keeps_its_state_and_a_purge_removes_it() {
    let host = Host::new();
    host.configure(&host.config());
    host.start();
    let before = host.main_pid();
    let agent_id = host.status()["agent"]["id"].clone();

    let upgraded = host.system.install(&package(2));
    assert_eq!(upgraded.code, Some(0), "{}", upgraded.all());
    assert_eq!(
        host.system.ok("dpkg-query -W -f '${Version}' tend"),
        format!("{}-2", env!("CARGO_PKG_VERSION"))
    );
    assert_ne!(host.main_pid(), before, "the upgrade restarted the agent");
    assert_eq!(host.system.property("tend", "ActiveState"), "active");
    assert_eq!(host.get("/readyz").map(|r| r.0), Some(200));
    assert_eq!(host.status()["agent"]["id"], agent_id);
    let journal = host.system.journal("tend");
    assert_eq!(
        journal.matches("create orders: ").count(),
        1,
        "the upgraded agent kept the state (no second create):\n{journal}"
    );
    assert_eq!(host.state_of("orders").as_deref(), Some("InSync"));

    let removed = host.system.sh("apt-get purge -y tend 2>&1");
    assert_eq!(removed.code, Some(0), "{}", removed.all());
    assert_eq!(host.system.property("tend", "ActiveState"), "inactive");
    for gone in [
        "/usr/bin/tend",
        "/lib/systemd/system/tend.service",
        "/var/lib/tend",
        "/var/lib/private/tend",
    ] {
        let left = host.system.sh(&format!("test -e {gone}"));
        assert_ne!(left.code, Some(0), "{gone} is left after the purge");
    }
    host.system.shutdown();
}

/// The `systemctl` and `journalctl` commands of a shell line: split at
/// `;`, `&&`, `||` and `|` outside quotes, leading `sudo`/`$ ` dropped,
/// comments cut.
fn service_commands(line: &str) -> Vec<String> {
    let line = line.trim().trim_start_matches("$ ");
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut quote = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '#') if current.is_empty() || current.ends_with(' ') => break,
            (None, '\'' | '"') => {
                quote = Some(c);
                current.push(c);
            }
            (Some(q), _) if c == q => {
                quote = None;
                current.push(c);
            }
            (None, ';' | '|' | '&') => {
                while chars.peek().is_some_and(|n| matches!(n, '|' | '&')) {
                    chars.next();
                }
                parts.push(std::mem::take(&mut current));
            }
            _ => current.push(c),
        }
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.trim().trim_start_matches("sudo ").trim().to_string())
        .filter(|p| p.starts_with("systemctl ") || p.starts_with("journalctl "))
        .collect()
}

#[test]
fn every_documented_systemctl_and_journalctl_command_works_against_the_installed_unit() {
    assert_eq!(
        service_commands(
            "journalctl -u tend -o verbose MESSAGE='a; b' | grep -E 'x|y'; sudo systemctl status tend  # why"
        ),
        [
            "journalctl -u tend -o verbose MESSAGE='a; b'",
            "systemctl status tend"
        ]
    );
    let mut commands = Vec::new();
    for file in support::docs::doc_files() {
        for block in support::docs::blocks(&file) {
            for (i, line) in block.body.iter().enumerate() {
                for command in service_commands(line) {
                    commands.push((format!("{}:{}", block.file, block.line + 1 + i), command));
                }
            }
        }
    }
    assert!(
        commands.len() >= 10,
        "the docs show fewer service commands than expected: {commands:?}"
    );

    let host = Host::new();
    host.configure(&host.config());
    host.start();
    for (place, command) in &commands {
        let run = host.system.sh(command);
        assert_eq!(
            run.code,
            Some(0),
            "{place}: `{command}` fails against the installed unit:\n{}",
            run.all()
        );
        if command.starts_with("systemctl stop") {
            host.start();
        }
    }
    assert_eq!(host.system.property("tend", "ActiveState"), "active");
    host.system.shutdown();
}
