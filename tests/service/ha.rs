//! High availability on a shared PostgreSQL state, with real processes:
//! two `tend run` on one machine (a state dir each for the Git cache, one
//! state schema in a real cluster), the reference DBaaS server as the
//! provider both reach. Exactly one acts; a killed, paused or cut-off
//! leader is replaced by the standby; the old leader's writes are fenced;
//! the provider never sees a second database or a second operation.

use crate::support;
use crate::support::tend;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::daemon::Daemon;
use support::git::{TestRepo, free_port};
use support::pgproxy::PgProxy;
use support::postgres::Postgres;
use support::reference::ReferenceServer;

const TTL_SECS: u64 = 3;
const SCHEMA: &str = "ha";

fn dbaas(name: &str) -> String {
    format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  engine: postgres\n  version: \"16\"\n  size: db-small\n  storageGb: 100\n  region: eu-west-1\n"
    )
}

struct Group {
    pg: Postgres,
    server: ReferenceServer,
    repo: TestRepo,
    dirs: Vec<tempfile::TempDir>,
}

impl Group {
    fn new(declarations: &[&str]) -> Self {
        let repo = TestRepo::new();
        for name in declarations {
            repo.write(&format!("{name}.yaml"), &dbaas(name));
        }
        repo.commit("declarations");
        Group {
            pg: Postgres::start(),
            server: ReferenceServer::start(&[]),
            repo,
            dirs: Vec::new(),
        }
    }

    /// A member's configuration; its state reaches PostgreSQL on
    /// `state_port` (the cluster, or a proxy in front of it).
    fn member(&mut self, state_port: u16) -> (PathBuf, u16) {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = self.config(dir.path(), port, Some(state_port));
        self.dirs.push(dir);
        (config, port)
    }

    /// `dir/tend.toml`: the state in PostgreSQL on `state_port`, or (`None`)
    /// in the state dir.
    fn config(&self, dir: &std::path::Path, port: u16, state_port: Option<u16>) -> PathBuf {
        self.config_of(dir, port, state_port, Some("ha-group"))
    }

    /// [`Group::config`] with `agent_id` (`None`: not set, generated).
    fn config_of(
        &self,
        dir: &std::path::Path,
        port: u16,
        state_port: Option<u16>,
        agent_id: Option<&str>,
    ) -> PathBuf {
        let agent_id = agent_id.map(|id| format!("\"{id}\""));
        let config = support::config::TendConfig::new(dir, &self.repo.url())
            .without_section("providers.sandbox")
            .top("agent_id", agent_id.as_deref())
            .source("interval", "\"200ms\"")
            .server("listen", &format!("\"127.0.0.1:{port}\""))
            .section("providers.dbaas", "kind", "\"http\"")
            .section(
                "providers.dbaas",
                "endpoint",
                &format!("\"{}\"", self.server.url()),
            )
            .section("providers.dbaas", "timeout", "\"10s\"")
            .section("providers.dbaas", "rate_limit", "1000");
        let Some(state_port) = state_port else {
            return config.write();
        };
        config
            .section("state", "backend", "\"postgres\"")
            .section("state", "url", &format!("\"{}\"", state_url(state_port)))
            .section("state", "schema", &format!("\"{SCHEMA}\""))
            .section("state", "lease_ttl", &format!("\"{TTL_SECS}s\""))
            .write()
    }

    fn start(&mut self, state_port: u16) -> Daemon {
        let (config, port) = self.member(state_port);
        Daemon::start(&config, port, &[])
    }

    fn declare(&self, name: &str) {
        self.repo.write(&format!("{name}.yaml"), &dbaas(name));
        self.repo.commit(&format!("declare {name}"));
    }

    fn creates(&self) -> u64 {
        self.server.count("creates")
    }

    /// Intents of `name` in the shared journal, by state.
    fn intents(&self, name: &str) -> String {
        self.pg.psql(&format!(
            "SELECT coalesce(string_agg(state, ',' ORDER BY op_id), '') FROM {SCHEMA}.intents WHERE name = '{name}'"
        ))
    }

    /// The operation ids of `name`'s intents in the shared journal.
    fn op_ids(&self, name: &str) -> Vec<String> {
        self.pg
            .psql(&format!(
                "SELECT op_id FROM {SCHEMA}.intents WHERE name = '{name}' ORDER BY op_id"
            ))
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// `name`'s applied fields in the shared state, as JSON.
    fn applied(&self, name: &str) -> serde_json::Value {
        let text = self.pg.psql(&format!(
            "SELECT applied_fields FROM {SCHEMA}.resources WHERE name = '{name}'"
        ));
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{name}'s applied fields {text:?}: {e}"))
    }

    fn lease(&self) -> (String, i64) {
        let row = self.pg.psql(&format!(
            "SELECT holder || '|' || token FROM {SCHEMA}.leases"
        ));
        let (holder, token) = row.split_once('|').expect("a lease row");
        (holder.to_string(), token.parse().unwrap())
    }
}

fn state_url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable")
}

fn leads(d: &Daemon) -> bool {
    d.get("/metrics")
        .is_some_and(|r| r.body.lines().any(|l| l == "tend_leader 1"))
}

fn stands_by(d: &Daemon) -> bool {
    d.get("/readyz")
        .is_some_and(|r| r.status == 200 && r.body.starts_with("standby"))
}

fn wait(what: &str, limit: Duration, logs: &[&Daemon], mut check: impl FnMut() -> bool) {
    support::eventually(
        what,
        limit,
        || support::holds(check()),
        || {
            let logs: Vec<String> = logs.iter().map(|d| d.log()).collect();
            format!("--- logs\n{}", logs.join("\n---\n"))
        },
    );
}

/// Starts `a`, waits until it leads and created `expect` databases, then
/// starts the standby.
fn leader_and_standby(group: &mut Group, expect: u64) -> (Daemon, Daemon) {
    let port = group.pg.port;
    let a = group.start(port);
    wait(
        "the first agent to lead",
        Duration::from_secs(30),
        &[&a],
        || leads(&a),
    );
    wait(
        "the declarations to be created",
        Duration::from_secs(30),
        &[&a],
        || group.creates() == expect,
    );
    let b = group.start(port);
    wait(
        "the second agent to stand by",
        Duration::from_secs(30),
        &[&a, &b],
        || stands_by(&b),
    );
    (a, b)
}

#[test]
fn one_of_two_agents_acts_and_the_standby_takes_over_a_killed_leader_without_a_duplicate() {
    let mut group = Group::new(&["alpha"]);
    let (mut a, b) = leader_and_standby(&mut group, 1);
    let standby = b.get("/readyz").unwrap().body;
    assert!(
        standby.contains("led by") && standby.contains("token 1"),
        "{standby}"
    );
    assert!(!leads(&b), "the standby does not lead");
    // The standby acts on nothing: a new declaration is created once, by
    // the leader.
    group.declare("bravo");
    wait("bravo", Duration::from_secs(30), &[&a, &b], || {
        group.creates() == 2
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(group.creates(), 2);
    assert!(
        !b.log().contains("operation"),
        "the standby journals and calls nothing:\n{}",
        b.log()
    );
    // A pending change: the leader has journalled its create and is
    // waiting for the provider's answer when it dies.
    group.server.faults(serde_json::json!({"latencyMs": 3000}));
    group.declare("charlie");
    wait("charlie's intent", Duration::from_secs(30), &[&a], || {
        group.intents("charlie") == "pending"
    });
    a.signal("KILL");
    let killed = Instant::now();
    a.wait_exit(Duration::from_secs(10));
    wait(
        "the standby to lead",
        Duration::from_secs(30),
        &[&b],
        || leads(&b),
    );
    let took = killed.elapsed();
    // The lease lasts TTL after its last renewal, tried every TTL/3.
    assert!(
        took < Duration::from_secs(TTL_SECS + TTL_SECS / 3 + 3),
        "the standby led after {took:?}"
    );
    group.server.faults(serde_json::json!({}));
    wait(
        "charlie to converge",
        Duration::from_secs(60),
        &[&b],
        || group.intents("charlie") == "done",
    );
    assert_eq!(
        group.creates(),
        3,
        "one create per declaration: the replay of charlie used its journalled id"
    );
    // The server keeps names unique, so the count alone cannot show a
    // duplicate: charlie must have been made under the id the old leader
    // journalled (whichever leader's request made it), and every key the
    // server ever stored must be an id the journal holds (a retry under a
    // fresh id would be a key no intent has).
    let charlie_op = group.op_ids("charlie");
    assert_eq!(
        charlie_op.len(),
        1,
        "one intent for charlie: {charlie_op:?}"
    );
    let stats = group.server.stats();
    let keys: Vec<String> = stats["keyUses"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert!(
        keys.contains(&charlie_op[0]),
        "charlie was made under its journalled id {}: {stats}",
        charlie_op[0]
    );
    let journalled: Vec<String> = ["alpha", "bravo", "charlie"]
        .iter()
        .flat_map(|name| group.op_ids(name))
        .collect();
    assert!(
        keys.iter().all(|k| journalled.contains(k)),
        "a key no intent holds reached the server: {keys:?} against {journalled:?}"
    );
    let (holder, token) = group.lease();
    assert_eq!(token, 2, "one takeover");
    assert!(holder.contains(&format!("/{}/", b.pid())), "{holder}");
    // `tend state show` names the leader.
    let show = support::TendCommand::new(&[
        "--config",
        &b.log.with_extension("toml").display().to_string(),
        "state",
        "show",
    ])
    .expect_code(0);
    assert!(
        show.stdout.contains(&format!("leader: {holder}")) && show.stdout.contains("token 2"),
        "{}",
        show.stdout
    );
}

#[test]
fn a_paused_leader_is_fenced_after_the_standby_took_over_and_steps_down() {
    let mut group = Group::new(&["alpha"]);
    let (a, b) = leader_and_standby(&mut group, 1);
    // The leader journals a create, sends it, and is paused before the
    // answer arrives.
    group.server.faults(serde_json::json!({"latencyMs": 2000}));
    group.declare("bravo");
    wait("bravo's intent", Duration::from_secs(30), &[&a], || {
        group.intents("bravo") == "pending"
    });
    a.signal("STOP");
    wait(
        "the standby to lead",
        Duration::from_secs(30),
        &[&a, &b],
        || leads(&b),
    );
    wait(
        "bravo to converge under the new leader",
        Duration::from_secs(60),
        &[&b],
        || group.intents("bravo") == "done",
    );
    assert_eq!(group.creates(), 2);
    group.server.faults(serde_json::json!({}));
    // The new leader applies a change the old one never saw: a stale write
    // of the old leader's, were it not fenced, would put back the values
    // it decided from (storageGb 100), and they would differ.
    group.repo.write(
        "bravo.yaml",
        &dbaas("bravo").replace("storageGb: 100", "storageGb: 200"),
    );
    group.repo.commit("bravo grows");
    wait(
        "the new leader to apply bravo's change",
        Duration::from_secs(60),
        &[&b],
        || {
            group
                .server
                .database("bravo")
                .is_some_and(|d| d["fields"]["storageGb"] == 200)
                && group.applied("bravo")["storageGb"] == 200
        },
    );
    // The old leader wakes up with its answer in hand and the lease gone.
    a.signal("CONT");
    wait(
        "the old leader to step down",
        Duration::from_secs(30),
        &[&a, &b],
        || a.log().contains("stepping down as leader"),
    );
    wait(
        "the old leader to stand by",
        Duration::from_secs(30),
        &[&a, &b],
        || stands_by(&a),
    );
    // The state and the provider keep the new leader's values: the old
    // leader's record of its create (storageGb 100) never landed.
    assert_eq!(
        group.applied("bravo")["storageGb"],
        200,
        "the new leader's applied values survive the old leader's wake-up"
    );
    assert_eq!(
        group.server.database("bravo").unwrap()["fields"]["storageGb"],
        200
    );
    // Its operation in flight finished at the provider; recording that
    // was the old leader's next write, and the fence refused it.
    let log = a.log();
    assert!(
        log.contains("no longer holds the leader lease of agent group ha-group (it wrote under token 1; the lease is now token 2"),
        "the old leader's write after the takeover is refused by the fence:\n{log}"
    );
    assert_eq!(group.creates(), 2, "no second create");
    assert_eq!(group.lease().1, 2);
    assert!(leads(&b) && !leads(&a));
    // Nothing the old leader did after the takeover reached the state: the
    // journal holds bravo's create and update, finished by the new leader.
    assert_eq!(
        group
            .intents("bravo")
            .split(',')
            .filter(|s| *s != "done")
            .count(),
        0
    );
}

#[test]
fn a_leader_cut_off_from_the_state_database_steps_down_and_the_standby_converges() {
    let mut group = Group::new(&["alpha"]);
    let proxy = PgProxy::start(group.pg.port);
    let a = group.start(proxy.port);
    wait(
        "the first agent to lead",
        Duration::from_secs(30),
        &[&a],
        || leads(&a),
    );
    wait("alpha", Duration::from_secs(30), &[&a], || {
        group.creates() == 1
    });
    let port = group.pg.port;
    let b = group.start(port);
    wait("the standby", Duration::from_secs(30), &[&a, &b], || {
        stands_by(&b)
    });
    proxy.sever();
    group.declare("bravo");
    wait(
        "the standby to lead",
        Duration::from_secs(30),
        &[&a, &b],
        || leads(&b),
    );
    wait("bravo", Duration::from_secs(60), &[&b], || {
        group.intents("bravo") == "done"
    });
    wait(
        "the cut-off leader to step down",
        Duration::from_secs(30),
        &[&a],
        || a.log().contains("stepping down as leader"),
    );
    proxy.heal();
    wait(
        "the old leader to stand by again",
        Duration::from_secs(30),
        &[&a, &b],
        || stands_by(&a),
    );
    assert_eq!(
        group.creates(),
        2,
        "one create each, none from the cut-off leader"
    );
    assert_eq!(group.lease().1, 2);
}

#[test]
fn a_sqlite_state_migrates_into_postgres_and_a_one_shot_apply_never_races_a_leader() {
    let mut group = Group::new(&["alpha"]);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // One agent on its state dir, as every installation starts.
    let sqlite = group.config(dir.path(), port, None);
    tend(&sqlite, &["apply"], 0);
    assert_eq!(group.creates(), 1);
    let url = state_url(group.pg.port);
    let migrate = ["state", "migrate", "--to", url.as_str(), "--schema", SCHEMA];
    let copied = tend(&sqlite, &migrate, 0);
    assert!(
        copied.stdout.contains("resources: 1") && copied.stdout.contains("intents: 1"),
        "{}",
        copied.stdout
    );
    let again = tend(&sqlite, &migrate, 1);
    assert!(
        again.stderr.contains("holds a state already")
            && again.stderr.contains("1 rows in resources"),
        "a second copy is refused: {}",
        again.stderr
    );
    // The same agent on the shared state remembers what it applied.
    let shared = group.config(dir.path(), port, Some(group.pg.port));
    let plan = tend(&shared, &["plan", "--format", "json"], 0).json();
    assert_eq!(plan["resources"][0]["state"], "InSync", "{plan:#}");
    let show = tend(&shared, &["state", "show"], 0).stdout;
    assert!(
        show.contains("resources managed: 1") && show.contains("agent_id: ha-group"),
        "{show}"
    );
    // A one-shot apply takes the lease for its run and gives it back.
    group.declare("bravo");
    tend(&shared, &["apply"], 0);
    assert_eq!(group.creates(), 2);
    assert_eq!(group.lease().1, 1);
    // With an agent leading, a one-shot apply refuses and changes nothing.
    let a = group.start(group.pg.port);
    wait("the agent to lead", Duration::from_secs(30), &[&a], || {
        leads(&a)
    });
    group.declare("charlie");
    let refused = tend(&shared, &["apply"], 1);
    assert!(
        refused.stderr.contains("agent group ha-group is led by")
            && refused.stderr.contains("token 2"),
        "{}",
        refused.stderr
    );
    wait(
        "the leader to create charlie",
        Duration::from_secs(30),
        &[&a],
        || group.creates() == 3,
    );
    assert_eq!(group.lease().1, 2, "the apply took no lease");
}

/// docs/operations.md, "Running two or more agents", as written, from an
/// installation that never pinned its agent id: migrate the state, give
/// every host the id `tend state show` prints, start them. Every database
/// stays managed; a host given another id is refused at start (78, both
/// ids named) instead of finding them all owned by another agent.
#[test]
fn the_ha_procedure_as_written_keeps_every_database_managed() {
    let mut group = Group::new(&["alpha", "bravo"]);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = group.config_of(dir.path(), free_port(), None, None);
    tend(&sqlite, &["apply"], 0);
    assert_eq!(group.creates(), 2);
    let kept = tend(&sqlite, &["state", "show"], 0).stdout;
    let id = kept
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("agent_id: "))
        .unwrap_or_else(|| panic!("`tend state show` starts with the agent id:\n{kept}"))
        .to_string();
    assert!(id.starts_with("tend-"), "{id}");
    let url = state_url(group.pg.port);
    tend(
        &sqlite,
        &["state", "migrate", "--to", url.as_str(), "--schema", SCHEMA],
        0,
    );
    // A host given the example's id instead: refused, nothing changed.
    let other = tempfile::tempdir().unwrap();
    let wrong = group.config_of(
        other.path(),
        free_port(),
        Some(group.pg.port),
        Some("platform-eu"),
    );
    let refused = tend(&wrong, &["plan"], 78);
    assert!(
        refused.stderr.contains(&format!("belongs to agent `{id}`"))
            && refused.stderr.contains(&format!("Set agent_id = \"{id}\"")),
        "{}",
        refused.stderr
    );
    let (config_a, port_a) = {
        let d = tempfile::tempdir().unwrap();
        let port = free_port();
        let c = group.config_of(d.path(), port, Some(group.pg.port), Some(&id));
        group.dirs.push(d);
        (c, port)
    };
    let mut wrong_agent = Daemon::start(&wrong, free_port(), &[]);
    assert_eq!(
        wrong_agent.wait_exit(Duration::from_secs(30)),
        Some(78),
        "{}",
        wrong_agent.log()
    );
    let a = Daemon::start(&config_a, port_a, &[]);
    wait("the agent to lead", Duration::from_secs(30), &[&a], || {
        leads(&a)
    });
    a.wait_ready();
    let report = a.status();
    assert_eq!(report["agent"]["id"], id.as_str());
    assert_eq!(report["summary"]["inSync"], 2, "{report:#}");
    assert_eq!(report["summary"]["blocked"], 0, "{report:#}");
    assert_eq!(group.creates(), 2, "nothing created twice");
}

#[test]
fn state_settings_that_cannot_work_are_configuration_errors() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::new();
    repo.write("a.yaml", &dbaas("a"));
    repo.commit("a");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("backend", "\"postgres\"")], "needs url"),
        (
            &[
                ("backend", "\"postgres\""),
                ("url", "\"postgres://tend:hunter2@db/tend\""),
            ],
            "carries a password",
        ),
        (
            &[("url", "\"postgres://tend@db/tend\"")],
            "[state] url is a setting of backend = \"postgres\"",
        ),
        (
            &[
                ("backend", "\"postgres\""),
                ("url", "\"postgres://tend@db/tend\""),
                ("schema", "\"Bad-Name\""),
            ],
            "schema \"Bad-Name\" must be",
        ),
        (
            &[
                ("backend", "\"postgres\""),
                ("url", "\"postgres://tend@db/tend\""),
                ("lease_ttl", "\"1s\""),
            ],
            "lease_ttl must be at least 3s",
        ),
        (&[("backend", "\"etcd\"")], "unknown variant `etcd`"),
    ];
    for (keys, expected) in cases {
        let mut config = support::config::TendConfig::new(dir.path(), &repo.url());
        for (k, v) in *keys {
            config = config.section("state", k, v);
        }
        let path = config.write();
        let out = tend(&path, &["plan"], 78);
        assert!(
            out.stderr.contains(expected) && !out.stderr.contains("hunter2"),
            "{keys:?}: {}",
            out.stderr
        );
    }
}
