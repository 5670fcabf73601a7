//! The status branch in real remotes: a bare repository over `git daemon`
//! (receive-pack enabled) and over smart HTTP (`git http-backend`), and a
//! bare repository on disk.

use crate::support;

use std::path::PathBuf;

use support::TendCommand;
use support::config::TendConfig;
use support::git::{GitDaemon, HttpGitServer, TestRepo, git, git_if_any, manifest, status_file};

const BILLING: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: billing
  annotations:
    tend.dev/ignore-fields: connectionLimit
    tend.dev/override-reason: \"INC-4821: invoice run\"
    tend.dev/override-expires: \"2099-01-01T00:00:00Z\"
spec:
  owner: billing_app
  connectionLimit: 50
";

/// A work-tree repository with two declarations, its bare clone under a
/// served directory, and a tend configuration pointing at `url`.
struct Remote {
    repo: TestRepo,
    served: tempfile::TempDir,
    bare: PathBuf,
    dir: tempfile::TempDir,
}

impl Remote {
    fn new() -> Self {
        let repo = TestRepo::new();
        repo.write("orders.yaml", &manifest("orders", 10));
        repo.write("billing.yaml", BILLING);
        repo.commit("two databases");
        let served = tempfile::tempdir().unwrap();
        let bare = repo.bare_clone(served.path());
        git(&bare, &["config", "http.receivepack", "true"]);
        Remote {
            repo,
            served,
            bare,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Declares `orders` with `limit` connections, committed as
    /// `orders: LIMIT` and pushed to the bare remote; the commit's id.
    fn push_orders(&self, limit: u32) -> String {
        self.repo.write("orders.yaml", &manifest("orders", limit));
        let commit = self.repo.commit(&format!("orders: {limit}"));
        self.repo
            .git(&["push", "-q", &self.bare.display().to_string(), "main"]);
        commit
    }

    /// Adds `count` declarations under `fleet/` (`db-0000`…), committed
    /// and pushed; the configuration of an agent of that fleet, whose
    /// sandbox creates them quickly.
    fn fleet(&self, count: usize) -> String {
        for i in 0..count {
            let name = format!("db-{i:04}");
            self.repo
                .write(&format!("fleet/{name}.yaml"), &manifest(&name, 10));
        }
        self.repo.commit(&format!("a fleet of {count}"));
        let bare = self.bare.display().to_string();
        self.repo.git(&["push", "-q", &bare, "main"]);
        TendConfig::new(self.dir.path(), &format!("file://{bare}"))
            .top("agent_id", Some("\"fleet-agent\""))
            .status("branch", "\"tend-status\"")
            .sandbox("rate_limit", "10000")
            .sandbox("max_concurrency", "64")
            .write()
            .display()
            .to_string()
    }

    fn config(&self, url: &str, agent: &str) -> String {
        TendConfig::new(self.dir.path(), url)
            .top("agent_id", Some(&format!("\"{agent}\"")))
            .status("branch", "\"tend-status\"")
            .write()
            .display()
            .to_string()
    }

    /// Another agent of the same remote: its own configuration and state
    /// (an agent id is part of its state: one state dir serves one id).
    fn other_agent_config(&self, url: &str, agent: &str) -> String {
        let dir = self.dir.path().join("agents").join(agent);
        std::fs::create_dir_all(&dir).unwrap();
        TendConfig::new(&dir, url)
            .top("agent_id", Some(&format!("\"{agent}\"")))
            .status("branch", "\"tend-status\"")
            .write()
            .display()
            .to_string()
    }

    fn git(&self, args: &[&str]) -> String {
        git(&self.bare, args)
    }

    fn show(&self, path: &str) -> String {
        self.git(&["show", &format!("tend-status:{path}")])
    }

    /// A work-tree clone of the status branch, as someone editing it by
    /// hand would have.
    fn clone_status(&self, name: &str) -> PathBuf {
        git(
            self.served.path(),
            &[
                "clone",
                "-q",
                "-b",
                "tend-status",
                &self.bare.display().to_string(),
                name,
            ],
        );
        self.served.path().join(name)
    }

    /// [`Remote::status_commits`], 0 while the branch does not exist.
    fn status_commits_so_far(&self) -> usize {
        std::process::Command::new("git")
            .args(["rev-list", "--count", "tend-status"])
            .current_dir(&self.bare)
            .output()
            .ok()
            .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
            .unwrap_or(0)
    }

    fn status_commits(&self) -> usize {
        self.git(&["rev-list", "--count", "tend-status"])
            .parse()
            .unwrap()
    }

    /// `tend run` as agent `run-agent`, polling and resyncing every
    /// 100 ms, ready.
    fn run_agent(&self) -> support::daemon::Daemon {
        self.run_agent_with(|c| c)
    }

    /// [`Remote::run_agent`] with its configuration changed by `change`.
    fn run_agent_with(
        &self,
        change: impl FnOnce(TendConfig) -> TendConfig,
    ) -> support::daemon::Daemon {
        self.run_agent_with_env(change, &[])
    }

    /// [`Remote::run_agent_with`], the agent's environment extended by
    /// `env`.
    fn run_agent_with_env(
        &self,
        change: impl FnOnce(TendConfig) -> TendConfig,
        env: &[(&str, &str)],
    ) -> support::daemon::Daemon {
        let url = format!("file://{}", self.bare.display());
        let port = support::git::free_port();
        let config = change(
            TendConfig::new(self.dir.path(), &url)
                .top("agent_id", Some("\"run-agent\""))
                .status("branch", "\"tend-status\"")
                .source("interval", "\"100ms\"")
                .reconcile("resync", "\"100ms\"")
                .server("listen", &format!("\"127.0.0.1:{port}\"")),
        )
        .write();
        let daemon = support::daemon::Daemon::start(&config, port, env);
        daemon.wait_ready();
        daemon
    }

    fn latest(&self) -> serde_json::Value {
        let path = self.dir.path().join("state/reports/latest.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }
}

fn apply(config: &str, code: i32) -> support::RunOutput {
    TendCommand::new(&["--config", config, "apply"]).expect_code(code)
}

/// Checks what the first status commit holds.
fn check_first_commit(remote: &Remote, agent: &str) {
    let main = remote.git(&["rev-parse", "main"]);
    // An orphan: one commit, no parent, nothing shared with main.
    assert_eq!(remote.status_commits(), 1);
    let parents = remote.git(&["rev-list", "--parents", "-n", "1", "tend-status"]);
    assert_eq!(parents.split_whitespace().count(), 1, "{parents}");
    let files = remote.git(&["ls-tree", "-r", "--name-only", "tend-status"]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        [
            "SUMMARY.md",
            "agent.yaml",
            &status_file("billing"),
            &status_file("orders")
        ]
    );
    // The rule, spelled out once: `printf %s orders | sha256sum` starts 1c.
    assert_eq!(status_file("orders"), "status/1c/orders.yaml");
    let author = remote.git(&["log", "-1", "--format=%an|%cn|%s", "tend-status"]);
    assert!(
        author.starts_with(&format!(
            "tend ({agent})|tend ({agent})|tend status at {}",
            &main[..12]
        )),
        "{author}"
    );
    assert!(author.contains(": 2 resources, 2 in sync,"), "{author}");
    let agent_file: serde_json::Value = serde_norway::from_str(&remote.show("agent.yaml")).unwrap();
    assert_eq!(agent_file["agentId"], agent);
    assert_eq!(agent_file["statusFormat"], 2);
    assert_eq!(agent_file["tendVersion"], env!("CARGO_PKG_VERSION"));

    let orders: serde_json::Value =
        serde_norway::from_str(&remote.show(&status_file("orders"))).unwrap();
    assert_eq!(orders["state"], "InSync");
    assert_eq!(orders["decidedFrom"], main.as_str());
    // In sync: every declared field observed as declared.
    assert!(orders.get("observed").is_none(), "{orders:#}");
    assert_eq!(orders["lastOperation"]["kind"], "create");
    assert_eq!(orders["lastOperation"]["result"], "done");
    assert_eq!(
        orders["lastOperation"]["id"].as_str().map(str::len),
        Some(64)
    );
    let billing: serde_json::Value =
        serde_norway::from_str(&remote.show(&status_file("billing"))).unwrap();
    assert_eq!(billing["override"]["reason"], "INC-4821: invoice run");
    assert_eq!(billing["override"]["expires"], "2099-01-01T00:00:00Z");
    let summary = remote.show("SUMMARY.md");
    assert!(
        summary.contains("| `billing` | ignore-fields `connectionLimit` | annotation | INC-4821: invoice run | 2099-01-01T00:00:00Z |"),
        "{summary}"
    );
    assert!(
        summary.contains(&format!("Decided from commit `{main}`")),
        "{summary}"
    );
}

#[test]
fn the_status_branch_over_git_daemon_and_smart_http() {
    for transport in ["git", "http"] {
        let remote = Remote::new();
        let daemon = GitDaemon::start_writable(remote.served.path());
        let http = HttpGitServer::start(remote.served.path(), None);
        let url = match transport {
            "git" => daemon.url("repo.git"),
            _ => http.url("repo.git"),
        };
        let config = remote.config(&url, "status-agent");
        let main_before = remote.git(&["rev-parse", "main"]);
        let run = apply(&config, 0);
        assert!(
            !run.stderr.contains("status branch"),
            "{transport}: {}",
            run.stderr
        );
        check_first_commit(&remote, "status-agent");
        // A second cycle with nothing new: no commit.
        apply(&config, 0);
        assert_eq!(remote.status_commits(), 1, "{transport}");
        // A change: one more commit, on top of the first.
        remote.push_orders(20);
        apply(&config, 0);
        assert_eq!(remote.status_commits(), 2, "{transport}");
        // A commit that changes one declaration changes that resource's
        // file and SUMMARY.md (which names the new source commit), and no
        // other file: billing's file still says the commit it was decided
        // from, which nothing since has changed for it.
        let changed = remote.git(&["diff", "--name-only", "tend-status~1", "tend-status"]);
        assert_eq!(
            changed.lines().collect::<Vec<_>>(),
            ["SUMMARY.md", status_file("orders").as_str()],
            "{transport}: {}",
            remote.git(&["diff", "tend-status~1", "tend-status", "--", "status"])
        );
        assert!(
            remote
                .show("SUMMARY.md")
                .contains(&format!("Decided from commit `{}`", remote.repo.head())),
            "{transport}"
        );
        let billing: serde_json::Value =
            serde_norway::from_str(&remote.show(&status_file("billing"))).unwrap();
        assert_eq!(billing["decidedFrom"], main_before.as_str(), "{transport}");
        let orders = remote.show(&status_file("orders"));
        assert!(
            orders.contains(&format!("decidedFrom: \"{}\"", remote.repo.head())),
            "{orders}"
        );
        assert!(orders.contains("kind: update"), "{orders}");
        // Changed at the provider: the observed value and the drift.
        TendCommand::new(&[
            "--config",
            &config,
            "sandbox",
            "edit",
            "orders",
            "--set",
            "connectionLimit=99",
        ])
        .expect_code(0);
        apply(&config, 2);
        let orders: serde_json::Value =
            serde_norway::from_str(&remote.show(&status_file("orders"))).unwrap();
        assert_eq!(orders["state"], "Drifted", "{transport}");
        assert_eq!(orders["observed"]["connectionLimit"], 99);
        assert_eq!(orders["drift"][0]["desired"], 20);
        assert_eq!(orders["drift"][0]["origin"], "out-of-band");
        // The tracked branch is never written.
        assert_eq!(
            remote.git(&["rev-parse", "main"]),
            remote.repo.head(),
            "{transport}"
        );
        assert_eq!(remote.status_commits(), 3, "{transport}");
        assert_ne!(remote.git(&["rev-parse", "main"]), main_before);
    }
}

#[test]
fn a_hundred_unchanged_cycles_make_no_commit_and_main_is_untouched() {
    let remote = Remote::new();
    let url = format!("file://{}", remote.bare.display());
    let config = remote.config(&url, "quiet-agent");
    let main = remote.git(&["rev-parse", "main"]);
    apply(&config, 0);
    assert_eq!(remote.status_commits(), 1);
    let tip = remote.git(&["rev-parse", "tend-status"]);
    for _ in 0..100 {
        apply(&config, 0);
    }
    assert_eq!(remote.git(&["rev-parse", "tend-status"]), tip);
    assert_eq!(remote.git(&["rev-parse", "main"]), main);
    let refs = remote.git(&["for-each-ref", "--format=%(refname)"]);
    assert_eq!(
        refs.lines().collect::<Vec<_>>(),
        ["refs/heads/main", "refs/heads/tend-status"]
    );
}

/// Someone else pushes to the status branch after tend fetched it and
/// before tend's push lands (a pre-receive hook moves the branch, once):
/// the push is refused, tend fetches the new tip, rebuilds on it and
/// succeeds, and the other commit and its file are kept.
#[test]
fn a_push_refused_because_someone_pushed_first_is_rebuilt_on_their_commit() {
    let remote = Remote::new();
    let daemon = GitDaemon::start_writable(remote.served.path());
    let config = remote.config(&daemon.url("repo.git"), "race-agent");
    apply(&config, 0);
    assert_eq!(remote.status_commits(), 1);
    let hook = remote.bare.join("hooks/pre-receive");
    let marker = remote.served.path().join("raced");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh
# Once, for a push of tend-status: another writer's commit lands there
# first. Outside the
# push's quarantine (git forbids ref updates inside it, and its objects
# go away with a refused push).
grep -q ' refs/heads/tend-status$' || exit 0
[ -e {marker} ] && exit 0
touch {marker}
unset GIT_QUARANTINE_PATH GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES
tip=$(git rev-parse refs/heads/tend-status)
blob=$(echo 'a note by a human' | git hash-object -w --stdin)
tree=$( (git ls-tree $tip; printf '100644 blob %s\\tNOTES.md\\n' $blob) | git mktree)
other=$(echo 'a human was here' | GIT_AUTHOR_NAME=human GIT_AUTHOR_EMAIL=h@example.test GIT_COMMITTER_NAME=human GIT_COMMITTER_EMAIL=h@example.test git commit-tree $tree -p $tip)
git update-ref refs/heads/tend-status $other
exit 0
",
            marker = marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    remote.push_orders(30);
    let run = TendCommand::new(&["--config", &config, "apply"])
        .env("TEND_LOG", "tend=info")
        .expect_code(0);
    assert!(marker.exists(), "the hook never ran");
    assert!(
        run.stderr.contains("push refused"),
        "tend's first push was not refused: {}\n{}",
        run.stderr,
        remote.git(&["log", "--format=%an|%s", "tend-status"])
    );
    let log = remote.git(&["log", "--format=%an|%s", "tend-status"]);
    let authors: Vec<&str> = log.lines().map(|l| l.split('|').next().unwrap()).collect();
    assert_eq!(
        authors,
        ["tend (race-agent)", "human", "tend (race-agent)"],
        "{log}"
    );
    assert_eq!(remote.show("NOTES.md").trim(), "a note by a human");
    let orders: serde_json::Value =
        serde_norway::from_str(&remote.show(&status_file("orders"))).unwrap();
    assert_eq!(orders["decidedFrom"], remote.repo.head().as_str());
    assert!(remote.latest().get("statusBranch").is_none());
}

#[test]
fn a_branch_of_another_agent_is_not_written_and_the_report_says_why() {
    let remote = Remote::new();
    let url = format!("file://{}", remote.bare.display());
    apply(&remote.other_agent_config(&url, "first-agent"), 0);
    let tip = remote.git(&["rev-parse", "tend-status"]);
    let config = remote.config(&url, "second-agent");
    let run = apply(&config, 0);
    assert!(
        run.stderr.contains(
            "status branch `tend-status` belongs to agent `first-agent`, not `second-agent`"
        ),
        "{}",
        run.stderr
    );
    assert_eq!(remote.git(&["rev-parse", "tend-status"]), tip);
    // The printed report says so too, not only stderr and latest.json.
    assert!(
        run.stdout
            .contains("STATUS BRANCH `tend-status` NOT WRITTEN since"),
        "{}",
        run.stdout
    );
    let latest = remote.latest();
    assert_eq!(latest["statusBranch"]["branch"], "tend-status");
    // The history holds that report, never one that did not say so
    // (the files are written while the branch is tried).
    let history = remote.dir.path().join("state/reports/history");
    let kept: Vec<String> = std::fs::read_dir(&history)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:#?}");
    assert!(kept[0].contains("\"statusBranch\""), "{}", kept[0]);
    // A second one-shot process says since when it has failed: the first's.
    let since = latest["statusBranch"]["since"].clone();
    assert!(since.is_string(), "{latest:#}");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    apply(&config, 0);
    assert_eq!(remote.latest()["statusBranch"]["since"], since);
    assert!(
        latest["statusBranch"]["error"]
            .as_str()
            .unwrap()
            .contains("belongs to agent `first-agent`"),
        "{latest:#}"
    );
    let html =
        std::fs::read_to_string(remote.dir.path().join("state/reports/latest.html")).unwrap();
    assert!(
        html.contains("belongs to agent"),
        "the page shows it too:\n{html}"
    );

    // A newer status format: not written either.
    let newer = remote.clone_status("newer");
    std::fs::write(
        newer.join("agent.yaml"),
        "agentId: first-agent\ntendVersion: 9.0.0\nstatusFormat: 3\n",
    )
    .unwrap();
    git(&newer, &["commit", "-q", "-am", "a newer tend"]);
    git(&newer, &["push", "-q", "origin", "tend-status"]);
    let tip = remote.git(&["rev-parse", "tend-status"]);
    let run = apply(&remote.other_agent_config(&url, "first-agent"), 0);
    assert!(
        run.stderr
            .contains("status format 3, newer than this tend's 2"),
        "{}",
        run.stderr
    );
    assert_eq!(remote.git(&["rev-parse", "tend-status"]), tip);
}

/// A branch written in the first format (every resource's file directly
/// in `status/`) is rewritten to the sharded one by the next commit: the
/// flat files go, each resource's file is in its shard, `agent.yaml`
/// says format 2, and a file tend does not own is kept.
#[test]
fn a_branch_of_the_first_format_is_rewritten_sharded() {
    let remote = Remote::new();
    let url = format!("file://{}", remote.bare.display());
    let config = remote.config(&url, "old-agent");
    apply(&config, 0);
    let old = remote.clone_status("old");
    git(&old, &["rm", "-q", "-r", "status"]);
    for name in ["billing", "orders"] {
        let text = remote.show(&status_file(name));
        std::fs::create_dir_all(old.join("status")).unwrap();
        std::fs::write(old.join(format!("status/{name}.yaml")), text).unwrap();
    }
    std::fs::write(
        old.join("agent.yaml"),
        "agentId: old-agent\ntendVersion: 0.2.0\nstatusFormat: 1\n",
    )
    .unwrap();
    std::fs::write(old.join("README.md"), "kept\n").unwrap();
    git(&old, &["add", "-A"]);
    git(&old, &["commit", "-q", "-m", "the first format"]);
    git(&old, &["push", "-q", "origin", "tend-status"]);
    // Something to commit: orders changes.
    remote.push_orders(30);
    apply(&config, 0);
    let files = remote.git(&["ls-tree", "-r", "--name-only", "tend-status"]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        [
            "README.md",
            "SUMMARY.md",
            "agent.yaml",
            &status_file("billing"),
            &status_file("orders")
        ]
    );
    let agent_file: serde_json::Value = serde_norway::from_str(&remote.show("agent.yaml")).unwrap();
    assert_eq!(agent_file["statusFormat"], 2);
    // `git log --follow` finds the file's history across the move.
    let history = remote.git(&[
        "log",
        "--follow",
        "--format=%s",
        "tend-status",
        "--",
        &status_file("billing"),
    ]);
    assert!(history.lines().count() >= 2, "{history}");
}

/// At a thousand resources, a status commit that changes one resource
/// writes that resource's file, `SUMMARY.md`, and three trees: its shard
/// (a few entries), `status/` (one entry per shard, at most 256) and the
/// root; no tree the commit writes names the fleet. And `SUMMARY.md`
/// stays a page: the resource needing attention first, the in-sync ones
/// past 200 counted, not listed.
#[test]
fn a_one_resource_change_rewrites_a_bounded_set_of_trees() {
    let remote = Remote::new();
    let config = remote.fleet(1000);
    apply(&config, 0);
    let before = remote.git(&["rev-parse", "tend-status"]);
    // One resource changes (and drifts: it needs attention).
    TendCommand::new(&[
        "--config",
        &config,
        "sandbox",
        "edit",
        "db_0500",
        "--set",
        "connectionLimit=99",
    ])
    .expect_code(0);
    apply(&config, 2);
    assert_eq!(
        remote.git(&["rev-list", "--count", &format!("{before}..tend-status")]),
        "1"
    );
    let trees = |commit: &str| -> std::collections::HashSet<String> {
        remote
            .git(&["ls-tree", "-r", "-t", commit])
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("tree"))
            .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
            .chain([remote.git(&["rev-parse", &format!("{commit}^{{tree}}")])])
            .collect()
    };
    let old = trees(&before);
    let new: Vec<String> = trees("tend-status").difference(&old).cloned().collect();
    assert_eq!(new.len(), 3, "new trees: {new:?}");
    for tree in &new {
        let entries = remote.git(&["ls-tree", tree]).lines().count();
        assert!(entries <= 256, "a tree of {entries} entries was written");
    }
    let changed = remote.git(&["diff", "--name-only", &before, "tend-status"]);
    assert_eq!(
        changed.lines().collect::<Vec<_>>(),
        ["SUMMARY.md", status_file("db-0500").as_str()]
    );
    let summary = remote.show("SUMMARY.md");
    let rows: Vec<&str> = summary.lines().filter(|l| l.starts_with("| [`")).collect();
    assert_eq!(rows.len(), 200, "{summary}");
    assert!(
        rows[0].contains("db-0500") && rows[0].contains("Drifted"),
        "{summary}"
    );
    assert!(
        summary.contains("802 more resources are not listed here (802 of them in sync or released"),
        "{summary}"
    );
}

#[test]
fn the_status_branch_may_not_be_the_tracked_branch() {
    let remote = Remote::new();
    let config = TendConfig::new(
        remote.dir.path(),
        &format!("file://{}", remote.bare.display()),
    )
    .status("branch", "\"main\"")
    .write();
    let run =
        TendCommand::new(&["--config", &config.display().to_string(), "apply"]).expect_code(78);
    assert!(
        run.stderr.contains("is the tracked branch"),
        "{}",
        run.stderr
    );
}

/// `tend run` writes the status branch from its one status writer: a
/// commit when what it observed changes, none while nothing does, and the
/// metrics count them.
#[test]
fn the_running_agent_commits_on_changes_only() {
    let remote = Remote::new();
    let daemon = remote.run_agent();
    let commits = || {
        let out = std::process::Command::new("git")
            .args(["rev-list", "--count", "tend-status"])
            .current_dir(&remote.bare)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<usize>()
            .unwrap_or(0)
    };
    daemon.wait_for(
        "the first status commit",
        std::time::Duration::from_secs(10),
        || commits() == 1,
    );
    // Many resyncs later (each a cycle): still one commit, and the branch
    // was not even fetched again.
    let fetches = || {
        daemon
            .log()
            .matches("status branch: fetching the tip")
            .count()
    };
    let fetched = fetches();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let metrics = daemon.get("/metrics").unwrap().body;
    let cycles: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("tend_cycles_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(cycles >= 5.0, "{metrics}");
    assert_eq!(commits(), 1);
    assert_eq!(
        fetches(),
        fetched,
        "the unchanged status branch was fetched again"
    );
    assert!(metrics.contains("tend_status_commits_total 1"), "{metrics}");
    assert!(
        metrics.contains("tend_status_publish_failing 0"),
        "{metrics}"
    );
    remote.push_orders(11);
    daemon.wait_for(
        "a second status commit",
        std::time::Duration::from_secs(10),
        || commits() == 2,
    );
}

/// The running agent's `/v1/status` says when the status branch cannot be
/// written, and the reconciliation goes on.
#[test]
fn the_running_agents_status_says_why_the_branch_is_not_written() {
    let remote = Remote::new();
    let url = format!("file://{}", remote.bare.display());
    apply(&remote.other_agent_config(&url, "first-agent"), 0);
    let port = support::git::free_port();
    let config = TendConfig::new(remote.dir.path(), &url)
        .top("agent_id", Some("\"second-agent\""))
        .status("branch", "\"tend-status\"")
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .write();
    let daemon = support::daemon::Daemon::start(&config, port, &[]);
    daemon.wait_ready();
    daemon.wait_for(
        "statusBranch in /v1/status",
        std::time::Duration::from_secs(10),
        || {
            daemon.status()["statusBranch"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("belongs to agent `first-agent`"))
        },
    );
    let metrics = daemon.get("/metrics").unwrap().body;
    assert!(
        metrics.contains("tend_status_publish_failing 1"),
        "{metrics}"
    );
    assert_eq!(daemon.status()["summary"]["total"], 2);
}

/// A `Retain` declaration removed from Git: its release is shown once —
/// in the report and on the status branch, with what, when and which
/// commit — then leaves both (a history entry keeps it); the declaration
/// restored is told it was released and how to take it back.
#[test]
fn a_release_is_shown_once_and_a_restored_declaration_is_offered_adoption() {
    let remote = Remote::new();
    let url = format!("file://{}", remote.bare.display());
    let config = remote.config(&url, "release-agent");
    let push = || {
        remote
            .repo
            .git(&["push", "-q", &remote.bare.display().to_string(), "main"]);
    };
    apply(&config, 0);
    remote.repo.remove("orders.yaml");
    let removal = remote.repo.commit("orders: no longer ours");
    push();
    apply(&config, 0);

    let report = remote.latest();
    let orders = report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "orders")
        .unwrap_or_else(|| panic!("the release is not in the report: {report:#}"));
    assert_eq!(orders["state"], "Released", "{orders:#}");
    assert_eq!(orders["rule"], "release", "{orders:#}");
    assert_eq!(orders["operation"]["kind"], "release", "{orders:#}");
    let reason = orders["reason"].as_str().unwrap();
    assert!(reason.contains(&removal[..12]), "{reason}");
    assert!(reason.contains("database `orders` stays"), "{reason}");
    assert!(reason.contains("released at 20"), "{reason}");
    let on_branch: serde_json::Value =
        serde_norway::from_str(&remote.show(&status_file("orders"))).unwrap();
    assert_eq!(on_branch["state"], "Released", "{on_branch:#}");
    assert!(
        remote.show("SUMMARY.md").contains("orders"),
        "{}",
        remote.show("SUMMARY.md")
    );
    let text = TendCommand::new(&["--config", &config, "status"]).expect_code(0);
    assert!(
        text.stdout.contains("orders") && text.stdout.contains("Released"),
        "{}",
        text.stdout
    );

    // Shown once: the next report and the branch no longer carry it; the
    // history keeps the report that did.
    apply(&config, 0);
    let report = remote.latest();
    assert!(
        !report["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "orders"),
        "{report:#}"
    );
    let files = remote.git(&["ls-tree", "-r", "--name-only", "tend-status"]);
    assert!(!files.contains("orders.yaml"), "{files}");
    let history = remote.dir.path().join("state/reports/history");
    let kept = std::fs::read_dir(&history)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .any(|text| text.contains("\"Released\"") && text.contains(&removal[..12]));
    assert!(kept, "no history entry shows the release");

    // The declaration comes back: not a stranger's name, a release; the
    // reason offers the annotation that takes it back.
    remote.repo.write("orders.yaml", &manifest("orders", 10));
    remote.repo.commit("orders: ours again");
    push();
    apply(&config, 2);
    let report = remote.latest();
    let orders = report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "orders")
        .unwrap()
        .clone();
    assert_eq!(orders["state"], "Blocked", "{orders:#}");
    let reason = orders["reason"].as_str().unwrap();
    assert!(
        reason.contains("was released by this agent")
            && reason.contains(&removal[..12])
            && reason.contains("tend.dev/adopt: \"true\""),
        "{reason}"
    );
    remote.repo.write(
        "orders.yaml",
        &manifest("orders", 10).replace(
            "  name: orders\n",
            "  name: orders\n  annotations:\n    tend.dev/adopt: \"true\"\n",
        ),
    );
    remote.repo.commit("orders: adopt");
    push();
    apply(&config, 0);
    let report = remote.latest();
    let orders = report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "orders")
        .unwrap()
        .clone();
    assert_eq!(orders["state"], "InSync", "{orders:#}");
}

/// The running agent renders only the files whose resource changed over
/// the commit it last published, and a file someone edited by hand on the
/// branch is put right with the next change (every file is rendered again
/// over a commit that is not the agent's).
#[test]
fn the_running_agent_renders_what_changed_and_puts_a_hand_edit_right() {
    let remote = Remote::new();
    let daemon = remote.run_agent();
    let (orders, billing) = (status_file("orders"), status_file("billing"));
    let wait_for_commits = |n: usize, what: &str| {
        daemon.wait_for(what, std::time::Duration::from_secs(10), || {
            support::git::git_if_any(&remote.bare, &["rev-list", "--count", "tend-status"])
                .and_then(|c| c.parse::<usize>().ok())
                == Some(n)
        });
    };
    wait_for_commits(1, "the first status commit");
    let billing_first = remote.show(&billing);
    // The line is logged once the commit is pushed: waited for, then
    // counted exactly.
    let logged = |line: &str, times: usize, why: &str| {
        let count = || daemon.log().matches(line).count();
        daemon.wait_for(why, std::time::Duration::from_secs(10), || count() >= times);
        assert_eq!(count(), times, "{why}:\n{}", daemon.log());
    };
    // A change: pushed, its status commit waited for, the files rendered
    // counted; orders' file names the new commit, billing's is as tend
    // rendered it first.
    let change = |limit: u32, commits: usize, rendered: &str, times: usize, why: &str| {
        let commit = remote.push_orders(limit);
        wait_for_commits(commits, why);
        logged(rendered, times, why);
        assert!(
            remote.show(&orders).contains(&commit),
            "{}",
            remote.show(&orders)
        );
        assert_eq!(remote.show(&billing), billing_first, "{why}");
    };
    change(
        11,
        2,
        "status branch: 1 resource files rendered, 1 kept;",
        1,
        "only orders' file is rendered over the agent's own commit",
    );
    // The agent keeps no resource's last operation between commits:
    // orders' update is found among the operations finished since its
    // last render, and no other is read.
    logged(
        "the last operations of 0 resources read by name",
        1,
        "the status writer reads the operations finished since its last render",
    );

    // Someone edits billing's file on the branch.
    let clone = remote.clone_status("by-hand");
    std::fs::write(clone.join(&billing), "state: Edited by hand\n").unwrap();
    git(&clone, &["commit", "-qam", "edited by hand"]);
    git(&clone, &["push", "-q", "origin", "tend-status"]);
    assert!(remote.show(&billing).contains("Edited by hand"));

    // The next change is written over their commit, every file rendered
    // again: the hand edit is put right.
    change(
        12,
        4,
        "status branch: 2 resource files rendered, 0 kept;",
        2,
        "the first commit and the one over the hand edit render every file",
    );

    // A change that finishes no operation (the declaration moved to
    // another file): its file is still rendered, the other kept.
    remote.repo.remove("orders.yaml");
    remote.repo.write("db/orders.yaml", &manifest("orders", 12));
    remote.repo.commit("orders moved");
    remote
        .repo
        .git(&["push", "-q", &remote.bare.display().to_string(), "main"]);
    wait_for_commits(5, "the move's status commit");
    logged(
        "status branch: 1 resource files rendered, 1 kept;",
        2,
        "only orders' file is rendered for the move",
    );
    // No operation finished: orders' last operation is read by name, and
    // its file still shows it.
    logged(
        "the last operations of 1 resources read by name",
        1,
        "the moved file's last operation is read by name",
    );
    assert!(remote.show(&orders).contains("db/orders.yaml"));
    assert!(
        remote.show(&orders).contains("kind: update"),
        "{}",
        remote.show(&orders)
    );
}

/// A commit whose change at one provider takes its time (its call is
/// answered 429 with a 1.5 s Retry-After) is one status commit, written once that provider's cycle
/// ends: not a first one, set off by the other provider's quick cycle,
/// that names the new commit without the new database, then a second.
#[test]
fn a_commit_is_one_status_commit_written_when_its_cycles_end() {
    let remote = Remote::new();
    let declared = |name: &str, provider: &str| {
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  provider: {provider}\n  connectionLimit: 5\n"
        )
    };
    let push = |message: &str| {
        remote.repo.commit(message);
        remote
            .repo
            .git(&["push", "-q", &remote.bare.display().to_string(), "main"]);
    };
    remote
        .repo
        .write("orders.yaml", &declared("orders", "sandbox"));
    remote
        .repo
        .write("billing.yaml", &declared("billing", "sandbox"));
    push("two databases at one provider");
    let daemon = remote.run_agent_with(|c| {
        c.reconcile("resync", "\"1h\"")
            .section("providers.slow", "kind", "\"sandbox\"")
            .section("providers.slow.faults", "rate_limit_calls", "1")
            .section("providers.slow.faults", "retry_after", "\"1500ms\"")
    });
    let head = remote.repo.head();
    daemon.wait_for(
        "the first status commit",
        std::time::Duration::from_secs(10),
        || {
            support::git::git_if_any(&remote.bare, &["show", "tend-status:SUMMARY.md"])
                .is_some_and(|summary| summary.contains(&head))
        },
    );
    let before = remote.status_commits();

    remote
        .repo
        .write("ledger.yaml", &declared("ledger", "slow"));
    push("a database at the slow provider");
    let ledger = status_file("ledger");
    daemon.wait_for(
        "the new database on the status branch",
        std::time::Duration::from_secs(15),
        || {
            support::git::git_if_any(&remote.bare, &["show", &format!("tend-status:{ledger}")])
                .is_some_and(|f| f.contains("InSync"))
        },
    );
    // Time for a publication that would follow.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(
        remote.status_commits(),
        before + 1,
        "{}",
        remote.git(&["log", "--format=%s", "tend-status"])
    );
}

/// What one `tend apply` rendered is kept for the next: a one-declaration
/// change renders that resource's file alone, the other kept from the tip
/// (and, with the kept digests gone, every file again, to the same tree).
#[test]
fn a_one_shot_apply_renders_only_what_changed_since_the_last_one() {
    let remote = Remote::new();
    let url = format!("file://{}", remote.bare.display());
    let config = remote.config(&url, "status-agent");
    let debug_apply_exiting = |code| {
        TendCommand::new(&["--config", &config, "apply"])
            .env("TEND_LOG", "tend=debug")
            .expect_code(code)
    };
    let debug_apply = || debug_apply_exiting(0);
    let rendered = |run: &support::RunOutput| {
        run.stderr
            .lines()
            .find(|l| l.contains("resource files rendered"))
            .map(|l| l.split("status branch: ").nth(1).unwrap_or(l).to_string())
            .unwrap_or_else(|| panic!("no render in\n{}", run.stderr))
    };
    let first = debug_apply();
    assert!(rendered(&first).starts_with("2 resource files rendered, 0 kept"));
    let kept = remote.dir.path().join("state/status-inputs");
    assert!(kept.exists(), "the digests were not kept");

    remote.push_orders(20);
    let second = debug_apply();
    assert!(
        rendered(&second).starts_with("1 resource files rendered, 1 kept"),
        "{}",
        rendered(&second)
    );
    // The rendered file is decided from the new commit; the kept one is
    // the one the tip held. orders says what it said (in sync): its new
    // last operation alone, found among those finished since the last
    // render, renders it, and it alone has its last operation read.
    let head = remote.repo.head();
    let orders = remote.show(&status_file("orders"));
    assert!(orders.contains(&head), "{orders}");
    assert!(orders.contains("kind: update"), "{orders}");
    assert!(!remote.show(&status_file("billing")).contains(&head));
    // Of what each file was decided from, orders' alone is read (billing
    // is kept).
    assert!(
        rendered(&second).ends_with(
            "the last operations of 0 resources read by name; what 1 files were decided from read"
        ),
        "{}",
        rendered(&second)
    );
    // billing changes at the provider, under its override: no operation,
    // its entry changes, and its file still shows its last operation (read
    // by name: none finished since the last render).
    TendCommand::new(&[
        "--config",
        &config,
        "sandbox",
        "edit",
        "billing",
        "--set",
        "connectionLimit=99",
    ])
    .expect_code(0);
    // (Exit 2: a difference left alone by an override is pending.)
    let drifted = debug_apply_exiting(2);
    assert!(
        rendered(&drifted).starts_with("1 resource files rendered, 1 kept"),
        "{}",
        rendered(&drifted)
    );
    assert!(
        rendered(&drifted).ends_with(
            "the last operations of 1 resources read by name; what 1 files were decided from read"
        ),
        "{}",
        rendered(&drifted)
    );
    let billing = remote.show(&status_file("billing"));
    assert!(billing.contains("connectionLimit: 99"), "{billing}");
    assert!(billing.contains("kind: create"), "{billing}");

    std::fs::remove_file(&kept).unwrap();
    remote.push_orders(30);
    let third = debug_apply_exiting(2);
    assert!(rendered(&third).starts_with("2 resource files rendered, 0 kept"));
    assert_eq!(remote.status_commits(), 4);
}

/// A failed read of the operations finished since the last render never
/// commits files without their last operation: every resource's is read
/// along the render instead.
#[test]
fn a_failed_read_of_the_finished_operations_keeps_every_last_operation() {
    let remote = Remote::new();
    let url = format!("file://{}", remote.bare.display());
    let config = remote.config(&url, "status-agent");
    apply(&config, 0);
    remote.push_orders(20);
    let run = TendCommand::new(&["--config", &config, "apply"])
        .env("FAILPOINTS", "last-operations-unread=return")
        .expect_code(0);
    assert!(
        run.stderr
            .contains("cannot read the operations finished since the last render"),
        "{}",
        run.stderr
    );
    // orders has its update, billing (unchanged) still its create.
    let orders = remote.show(&status_file("orders"));
    assert!(orders.contains("kind: update"), "{orders}");
    let billing = remote.show(&status_file("billing"));
    assert!(billing.contains("kind: create"), "{billing}");
    assert_eq!(remote.status_commits(), 2);
}

/// When the operations finished since the last render cannot be told
/// apart from the rest (the count moved by more than the newer ones: here
/// a pruned generation of no resource of the fleet, as a prune beside an
/// operation finished in the mark's own millisecond would), every
/// resource's last operation is read along the render, and none is lost.
#[test]
fn operations_not_told_apart_since_the_last_render_are_read_along_and_none_is_lost() {
    let remote = Remote::new();
    let url = format!("file://{}", remote.bare.display());
    let config = remote.config(&url, "status-agent");
    apply(&config, 0);
    let state = rusqlite::Connection::open(remote.dir.path().join("state/state.db")).unwrap();
    state
        .execute(
            "INSERT INTO pruned_generations (name, kind, spec_hash, count) VALUES ('ghost', 'update', 'h', 1)",
            [],
        )
        .unwrap();
    drop(state);
    remote.push_orders(20);
    apply(&config, 0);
    // orders has its update, billing (unchanged) still its create: read
    // along, not left out of the files rendered again.
    let orders = remote.show(&status_file("orders"));
    assert!(orders.contains("kind: update"), "{orders}");
    let billing = remote.show(&status_file("billing"));
    assert!(billing.contains("kind: create"), "{billing}");
    assert_eq!(remote.status_commits(), 2);
}

/// Over a known render, more entries than are read by name before the
/// render change with no operation of theirs (here 250 files moved): their
/// last operations are read along the render, those alone, not every
/// resource's, and each moved file still shows its own.
#[test]
fn many_entries_changed_without_an_operation_have_only_theirs_read_along() {
    let remote = Remote::new();
    let config = remote.fleet(250);
    apply(&config, 0);
    remote.repo.git(&["mv", "fleet", "moved"]);
    remote.repo.commit("the fleet moved");
    let bare = remote.bare.display().to_string();
    remote.repo.git(&["push", "-q", &bare, "main"]);
    let run = TendCommand::new(&["--config", &config, "apply"])
        .env("TEND_LOG", "tend=debug")
        .expect_code(0);
    let said = |what: &str| run.stderr.lines().any(|l| l.contains(what));
    assert!(
        said("250 resource files rendered, 2 kept"),
        "{}",
        run.stderr
    );
    assert!(
        said("the last operations of 250 resources read along the render"),
        "{}",
        run.stderr
    );
    let moved = remote.show(&status_file("db-0123"));
    assert!(moved.contains("moved/db-0123.yaml"), "{moved}");
    assert!(moved.contains("kind: create"), "{moved}");
    assert!(
        remote
            .show(&status_file("billing"))
            .contains("kind: create")
    );
}

/// The loose objects and the packs of the agent's Git cache.
fn cache_shape(remote: &Remote) -> (usize, usize) {
    let objects = remote.dir.path().join("state/source/repo.git/objects");
    let mut loose = 0;
    for dir in std::fs::read_dir(&objects).unwrap().flatten() {
        let name = dir.file_name().to_string_lossy().into_owned();
        if name.len() == 2 {
            loose += std::fs::read_dir(dir.path()).unwrap().count();
        }
    }
    let packs = std::fs::read_dir(objects.join("pack"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .count();
    (loose, packs)
}

/// A one-shot apply packs the Git cache at its end once its loose objects
/// pass the limit (here lowered to none), and the next apply reads the
/// packed status branch and source and commits over them; below the
/// limit, nothing is packed.
#[test]
fn a_one_shot_apply_packs_the_git_cache_past_its_limit_and_the_branch_goes_on() {
    let remote = Remote::new();
    let url = format!("file://{}", remote.bare.display());
    let config = remote.config(&url, "status-agent");
    apply(&config, 0);
    let (loose, _) = cache_shape(&remote);
    assert!(
        loose > 5,
        "a first status commit leaves loose objects: {loose}"
    );

    remote.push_orders(20);
    let packing = TendCommand::new(&["--config", &config, "apply"])
        .env("FAILPOINTS", "git-pack-loose=return(0)")
        .expect_code(0);
    assert!(
        packing.stderr.contains("packed") && packing.stderr.contains("objects of the Git cache"),
        "{}",
        packing.stderr
    );
    let (loose, packs) = cache_shape(&remote);
    assert_eq!(loose, 0, "every loose object packed");
    assert!(packs >= 1);
    assert!(remote.show(&status_file("orders")).contains("kind: update"));
    // A reader borrows the packed objects (Git alternates) and sees the
    // commit the cache holds.
    let plan = TendCommand::new(&["--config", &config, "plan", "--format", "json"]).expect_code(0);
    assert_eq!(plan.json()["summary"]["total"], 2, "{}", plan.stdout);

    // Over the packed cache: the source and the branch read, a new commit.
    remote.push_orders(21);
    apply(&config, 0);
    assert_eq!(remote.status_commits(), 3);
    let orders = remote.show(&status_file("orders"));
    assert!(orders.contains("kind: update"), "{orders}");
    let (loose, _) = cache_shape(&remote);
    assert!(loose > 0, "below the limit, nothing is packed: {loose}");
}

/// The running agent packs the Git cache beside its status commits, and
/// goes on committing over the packed cache.
#[test]
fn the_running_agent_packs_the_git_cache_beside_its_status_commits() {
    let remote = Remote::new();
    let daemon = remote.run_agent_with_env(|c| c, &[("FAILPOINTS", "git-pack-loose=return(0)")]);
    let packed = |n: usize| daemon.log().matches("objects of the Git cache in").count() >= n;
    daemon.wait_for("the first pack", std::time::Duration::from_secs(20), || {
        remote.status_commits_so_far() == 1 && packed(1)
    });
    remote.push_orders(30);
    daemon.wait_for(
        "a status commit over the packed cache, packed in turn",
        std::time::Duration::from_secs(20),
        || remote.status_commits_so_far() == 2 && packed(2),
    );
    let orders = remote.show(&status_file("orders"));
    assert!(orders.contains("kind: update"), "{orders}");
    assert!(!daemon.log().contains("cannot pack"), "{}", daemon.log());
    daemon.wait_for(
        "no loose object left",
        std::time::Duration::from_secs(10),
        || cache_shape(&remote).0 == 0,
    );
}

/// The status writer takes the fleet's report, then reads the state: a
/// commit's cycle may run an operation in between. That publication shows
/// the operation under the older report's commit; the next one, over the
/// commit's report, names the commit, though the resource's entry says
/// the same as before (in sync). Before, the file named the older commit
/// until the resource changed again.
#[test]
fn an_operation_newer_than_the_report_taken_names_its_commit_next() {
    let remote = Remote::new();
    let paused = remote.dir.path().join("writer-paused");
    let daemon = remote.run_agent_with_env(
        |c| c,
        &[
            ("FAILPOINTS", "status-writer-taken=return(until-resumed)"),
            ("TEND_TEST_PAUSE_FILE", paused.to_str().unwrap()),
        ],
    );
    let resume = || match std::fs::remove_file(&paused) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{e}"),
        _ => {}
    };
    let orders = status_file("orders");
    let names = |commit: &str| {
        let file = git_if_any(&remote.bare, &["show", &format!("tend-status:{orders}")]);
        file.is_some_and(|f| f.contains(&format!("decidedFrom: \"{commit}\"")))
    };
    // Every publication goes through until orders' file names the first
    // commit.
    let first = remote.git(&["rev-parse", "main"]);
    daemon.wait_for(
        "orders' file at the first commit",
        std::time::Duration::from_secs(60),
        || {
            resume();
            names(&first)
        },
    );
    // A publication holds a report taken before the next commit, while
    // the commit's cycle updates orders.
    daemon.wait_for("a report taken", std::time::Duration::from_secs(30), || {
        paused.exists()
    });
    let updates = || daemon.log().matches("update orders: done").count();
    let second = remote.push_orders(20);
    daemon.wait_for("orders updated", std::time::Duration::from_secs(30), || {
        updates() == 1
    });
    resume();
    daemon.wait_for(
        "orders' file at the commit that updated it",
        std::time::Duration::from_secs(30),
        || {
            resume();
            names(&second)
        },
    );
    assert!(
        daemon
            .log()
            .contains("1 with an operation newer than the report, made again next"),
        "{}",
        daemon.log()
    );
    let file = remote.show(&orders);
    assert!(file.contains("kind: update"), "{file}");
}

/// A commit changing two providers' declarations: the status writer
/// publishes while the slower provider's cycle still runs (its report is
/// at the commit before), and the faster one's file names the new commit,
/// then and after. Before, the merged report took the first provider's
/// commit, the file was recorded as decided from the older commit, and
/// kept it once the slower provider came to say the same.
#[test]
fn a_file_of_a_faster_provider_names_the_newer_commit() {
    let remote = Remote::new();
    let declare = |name: &str, provider: &str, limit: u32| {
        remote.repo.write(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  provider: {provider}\n  connectionLimit: {limit}\n"
            ),
        );
    };
    // Provider `a` (before `sandbox` in name order): six databases, one
    // call a second; `sandbox`: `fast`.
    let declare_all = |limit: u32| {
        for i in 0..6 {
            declare(&format!("a-{i}"), "a", limit);
        }
        declare("fast", "sandbox", limit);
        for gone in ["orders.yaml", "billing.yaml"] {
            let _ = std::fs::remove_file(remote.repo.path().join(gone));
        }
        let commit = remote.repo.commit(&format!("every limit {limit}"));
        remote
            .repo
            .git(&["push", "-q", &remote.bare.display().to_string(), "main"]);
        commit
    };
    let first = declare_all(10);
    let daemon = remote.run_agent_with(|c| {
        c.section("providers.a", "kind", "\"sandbox\"")
            .section("providers.a", "rate_limit", "1")
            .section("providers.a", "max_concurrency", "1")
    });
    let fast = status_file("fast");
    let names = |commit: &str| {
        let file = git_if_any(&remote.bare, &["show", &format!("tend-status:{fast}")]);
        file.is_some_and(|f| f.contains(&format!("decidedFrom: \"{commit}\"")))
    };
    let long = std::time::Duration::from_secs(60);
    daemon.wait_for("fast's file at the first commit", long, || names(&first));
    // One commit: `fast` and all of `a`'s.
    let second = declare_all(20);
    daemon.wait_for("fast's file at the second commit", long, || names(&second));
    daemon.wait_for("a's updates", long, || {
        daemon.log().matches("update a-").count() == 6
    });
    // Every status commit since names the second commit for `fast`.
    daemon.run_cycles(1);
    assert!(names(&second), "{}", remote.show(&fast));
}
