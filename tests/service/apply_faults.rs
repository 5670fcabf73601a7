//! `tend apply` under injected faults and crashes. Each test asserts the
//! invariant: no duplicate, no lost intent, the same operation id reused for
//! a retry, convergence once the fault clears.

use crate::support;

use std::path::{Path, PathBuf};

use std::time::Duration;

use support::TendCommand;
use support::fixture::Fixture;
use support::git::manifest;
use tend::testing::journal::{Intent, IntentState, StateStore};
use tend::testing::provider::sandbox::SandboxState;

/// A [`Fixture`] whose sandbox faults and `[reconcile]` settings each test
/// sets as TOML lines (`lose_responses = 1`).
struct Env(Fixture);

impl std::ops::Deref for Env {
    type Target = Fixture;
    fn deref(&self) -> &Fixture {
        &self.0
    }
}

impl Env {
    fn new(files: &[(String, String)]) -> Self {
        let env = Env(Fixture::new(files));
        env.configure("", "");
        env
    }

    /// Rewrites the config from the fixture's default: `faults` lines go
    /// under [providers.sandbox.faults], `reconcile` lines under
    /// [reconcile] (with `deletion_delay = "0s"` unless given).
    fn configure(&self, faults: &str, reconcile: &str) {
        let pairs = |lines: &str| -> Vec<(String, String)> {
            lines
                .lines()
                .map(|line| {
                    let (key, value) = line
                        .split_once(" = ")
                        .unwrap_or_else(|| panic!("not `key = value`: {line}"));
                    (key.to_string(), value.to_string())
                })
                .collect()
        };
        let mut config = self.0.config.clone().reconcile("deletion_delay", "\"0s\"");
        for (key, value) in pairs(faults) {
            config = config.faults(&key, &value);
        }
        for (key, value) in pairs(reconcile) {
            config = config.reconcile(&key, &value);
        }
        config.write();
    }

    fn config(&self) -> PathBuf {
        self.config_path()
    }

    fn apply(&self, code: i32) -> support::RunOutput {
        self.tend(&["apply"], code)
    }

    /// `tend apply --format json`: its report.
    fn apply_json(&self, code: i32) -> serde_json::Value {
        self.0.apply(code)
    }

    fn sandbox_state(&self) -> SandboxState {
        self.sandbox().load().unwrap()
    }

    fn intents(&self) -> Vec<Intent> {
        StateStore::open(&self.state(), false)
            .unwrap()
            .unwrap()
            .all_intents()
            .unwrap()
    }
}

fn only<'a>(intents: &'a [Intent], kind: &str) -> &'a Intent {
    let matching: Vec<&Intent> = intents.iter().filter(|i| i.kind == kind).collect();
    assert_eq!(matching.len(), 1, "exactly one {kind} intent: {intents:#?}");
    matching[0]
}

fn decl(name: &str, limit: u32) -> (String, String) {
    (format!("{name}.yaml"), manifest(name, limit))
}

#[test]
fn a_lost_create_response_is_retried_with_the_same_id_and_creates_one_database() {
    let env = Env::new(&[decl("orders", 10)]);
    env.configure("lose_responses = 1", "");
    env.apply(0);
    env.configure("", "");
    env.apply(0);

    let state = env.sandbox_state();
    assert_eq!(state.databases.len(), 1, "exactly one database");
    let create = only(&env.intents(), "create").clone();
    assert_eq!(create.state, IntentState::Done);
    assert_eq!(create.attempts, 2, "the journal shows one id used twice");
    assert_eq!(
        state.key_uses(&create.op_id),
        2,
        "the provider saw the same key twice"
    );
    assert_eq!(
        state.operations().len(),
        1,
        "no other operation reached the provider"
    );
}

#[test]
fn a_lost_update_response_is_retried_with_the_same_id() {
    let env = Env::new(&[decl("orders", 10)]);
    env.apply(0);
    env.repo.write("orders.yaml", &manifest("orders", 20));
    env.repo.commit("raise the limit");
    env.configure("lose_responses = 1", "");
    env.apply(0);
    env.apply(0);

    let state = env.sandbox_state();
    assert_eq!(state.databases["orders"].fields["connectionLimit"], 20);
    let update = only(&env.intents(), "update").clone();
    assert_eq!((update.state, update.attempts), (IntentState::Done, 2));
    assert_eq!(state.key_uses(&update.op_id), 2);
}

#[test]
fn a_lost_delete_response_is_retried_with_the_same_id() {
    let scratch = manifest("scratch", 5).replace("spec:\n", "spec:\n  deletionPolicy: Delete\n");
    let env = Env::new(&[decl("orders", 10), ("scratch.yaml".into(), scratch)]);
    env.apply(0);
    assert_eq!(env.sandbox_state().databases.len(), 2);
    env.repo.remove("scratch.yaml");
    env.repo.commit("scratch is no longer needed");
    env.configure("lose_responses = 1", "");
    env.apply(0);

    let state = env.sandbox_state();
    assert_eq!(state.databases.keys().collect::<Vec<_>>(), ["orders"]);
    let delete = only(&env.intents(), "delete").clone();
    assert_eq!((delete.state, delete.attempts), (IntentState::Done, 2));
    assert_eq!(state.key_uses(&delete.op_id), 2);
    let store = StateStore::open(&env.state(), false).unwrap().unwrap();
    assert!(
        store.tombstones().unwrap().is_empty(),
        "the confirmed deletion ends the tombstone"
    );
}

#[test]
/// What it checks: while reads lag tend's write, the write is confirmed by
/// the provider's answer to it (not by a read), and the cycles that still
/// read the old value (the `stale-observation` rule: an observation older
/// than tend's last write) never send it again.
fn a_write_whose_later_reads_are_stale_is_never_sent_twice() {
    let env = Env::new(&[decl("orders", 10)]);
    env.apply(0);
    // Let the create age past the lag, so only the update's read is stale.
    std::thread::sleep(Duration::from_millis(2200));
    env.repo.write("orders.yaml", &manifest("orders", 20));
    env.repo.commit("raise the limit");
    // Reads lag writes by 2 s.
    env.configure("stale_reads = \"2s\"", "confirm_timeout = \"500ms\"");
    // Done, and in sync in the report: the cycle reports from the write's
    // own answer (the newest observation there is), not from a stale read.
    let first = env.apply_json(0);
    assert_eq!(support::applied(&first), Some((1, 1)), "{first:#}");
    assert_eq!(first["resources"][0]["name"], "orders", "{first:#}");
    assert_eq!(first["resources"][0]["state"], "InSync", "{first:#}");
    // The counts are the printed report's alone: the files stay as they
    // were when a later apply runs nothing.
    let latest = std::fs::read_to_string(env.state().join("reports/latest.json")).unwrap();
    assert!(!latest.contains("\"applied\""), "{latest}");
    // The next cycle reads the old value (stale), and must not write again.
    let plan = TendCommand::new(&[
        "--config",
        &env.config().display().to_string(),
        "plan",
        "--format",
        "json",
    ])
    .expect_code(0)
    .json();
    let reason = plan["resources"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("older than"), "{plan:#}");
    let second = env.apply_json(2);
    assert_eq!(support::applied(&second), Some((0, 0)), "{second:#}");
    std::thread::sleep(Duration::from_millis(2200));
    env.apply(0);

    let state = env.sandbox_state();
    let updates: Vec<_> = state
        .operations()
        .values()
        .filter(|o| o.kind == "update")
        .collect();
    assert_eq!(
        updates.len(),
        1,
        "one update, however often the stale read showed the old value"
    );
    assert_eq!(state.databases["orders"].fields["connectionLimit"], 20);
    assert_eq!(only(&env.intents(), "update").state, IntentState::Done);
}

/// Found by the simulation (seeds 146 and 728): a create, confirmed by its
/// answer, is missing from the next listing served by a lagging cache.
/// Read as an out-of-band drop (drift_grace 0), or as a removed
/// declaration's database being gone (and the declaration restored), tend
/// created it again under a new operation id: a second database at a
/// provider that does not keep names unique. Within the provider's read
/// lag after tend's own write, an absence is no evidence.
#[test]
fn a_database_missing_from_a_lagging_listing_is_not_created_again() {
    // (billing keeps the tree from being empty when orders is removed.)
    let env = Env::new(&[decl("orders", 10), decl("billing", 10)]);
    env.configure(
        "stale_reads = \"30s\"\nnames_not_unique = true",
        "drift_grace = \"0s\"",
    );
    env.apply(0);
    // The listing lags the create: orders is not in it.
    let second = env.apply_json(2);
    assert_eq!(support::applied(&second), Some((0, 0)), "{second:#}");
    let orders = second["resources"]
        .as_array()
        .and_then(|all| all.iter().find(|r| r["name"] == "orders"))
        .unwrap_or_else(|| panic!("no orders: {second:#}"));
    assert!(
        orders["reason"]
            .as_str()
            .is_some_and(|r| r.contains("may lag writes by 30s")),
        "{orders:#}"
    );
    // Removed and restored while the listing still lags: the tombstone is
    // not forgotten on an absence tend cannot trust, so the restored
    // declaration is not created again either.
    env.repo.remove("orders.yaml");
    env.repo.commit("remove orders");
    env.apply(2);
    env.repo.write("orders.yaml", &manifest("orders", 12));
    env.repo.commit("restore orders");
    env.apply(2);
    let state = env.sandbox_state();
    let owned: Vec<&String> = state
        .databases
        .iter()
        .filter(|(_, db)| {
            db.labels
                .get("tend.dev/owner-declaration")
                .map(String::as_str)
                == Some("orders")
        })
        .map(|(name, _)| name)
        .collect();
    assert_eq!(owned, ["orders"], "one database for the declaration");
    assert_eq!(
        state
            .operations()
            .values()
            .filter(|o| o.kind == "create")
            .count(),
        2,
        "one create each for orders and billing"
    );
}

#[test]
fn a_429_with_retry_after_is_obeyed() {
    let env = Env::new(&[decl("orders", 10)]);
    env.configure("rate_limit_calls = 1\nretry_after = \"2s\"", "");
    env.apply(0);
    let calls = env.sandbox().calls();
    let limited = calls
        .iter()
        .position(|c| c.3 == "429")
        .expect("a 429 was served");
    let next = &calls[limited + 1];
    let waited = next.0 - calls[limited].0;
    assert!(
        waited >= 2000,
        "the next call came {waited} ms after the 429, before Retry-After: 2"
    );
    assert_eq!(env.sandbox_state().databases.len(), 1);
}

#[test]
fn consecutive_5xx_back_off_with_growing_delays_then_succeed() {
    let env = Env::new(&[decl("orders", 10)]);
    env.configure("fail_calls = 5", "");
    env.apply(0);
    let calls = env.sandbox().calls();
    let failures: Vec<u64> = calls.iter().take(6).map(|c| c.0).collect();
    assert_eq!(
        calls.iter().take(5).filter(|c| c.3 == "503").count(),
        5,
        "{calls:?}"
    );
    assert_eq!(calls[5].3, "ok");
    let gaps: Vec<u64> = failures.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] >= 50, "{gaps:?}");
    assert!(gaps[4] > gaps[0] * 4, "backoff grows: {gaps:?}");
    for w in gaps.windows(2) {
        assert!(w[1] * 10 >= w[0] * 9, "no delay shrinks: {gaps:?}");
    }
    assert_eq!(env.sandbox_state().databases.len(), 1);
}

fn paused_apply(env: &Env, point: &str) -> std::process::Child {
    let marker = env.dir.path().join(format!("paused-{point}"));
    support::paused_apply(&env.config(), point, &marker)
}

fn kill(mut child: std::process::Child) {
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

#[test]
fn killed_after_the_intent_is_journalled_and_before_the_call() {
    let env = Env::new(&[decl("orders", 10)]);
    kill(paused_apply(&env, "after-intent"));
    let pending = only(&env.intents(), "create").clone();
    assert_eq!(
        pending.state,
        IntentState::Pending,
        "the intent survived the crash"
    );
    assert!(
        env.sandbox_state().databases.is_empty(),
        "the call was never sent"
    );

    env.apply(0);
    let state = env.sandbox_state();
    assert_eq!(state.databases.len(), 1);
    let create = only(&env.intents(), "create").clone();
    assert_eq!(
        create.op_id, pending.op_id,
        "the replay used the journalled id"
    );
    assert_eq!(create.state, IntentState::Done);
    assert_eq!(state.key_uses(&create.op_id), 1);
}

#[test]
fn killed_after_the_call_and_before_confirmation() {
    let env = Env::new(&[decl("orders", 10)]);
    kill(paused_apply(&env, "after-call"));
    assert_eq!(
        env.sandbox_state().databases.len(),
        1,
        "the provider committed the create"
    );
    let pending = only(&env.intents(), "create").clone();
    assert_eq!(pending.state, IntentState::Pending);

    env.apply(0);
    let state = env.sandbox_state();
    assert_eq!(state.databases.len(), 1, "no duplicate");
    let create = only(&env.intents(), "create").clone();
    assert_eq!(
        (create.op_id.as_str(), create.state),
        (pending.op_id.as_str(), IntentState::Done)
    );
    assert_eq!(
        state.key_uses(&create.op_id),
        2,
        "the replay reached the provider under the same key"
    );
    assert_eq!(state.operations().len(), 1);
}

/// Killed after an observation confirmed the effect and before the
/// journal said so: the intent is still pending, the replay is answered
/// from the provider's memory of the id, and it is confirmed then.
#[test]
fn killed_after_confirmation_and_before_the_journal_says_so() {
    let env = Env::new(&[decl("orders", 10)]);
    kill(paused_apply(&env, "after-confirm"));
    assert_eq!(env.sandbox_state().databases.len(), 1);
    let pending = only(&env.intents(), "create").clone();
    assert_eq!(
        pending.state,
        IntentState::Pending,
        "confirmed, but the journal never heard of it"
    );
    env.apply(0);
    let state = env.sandbox_state();
    assert_eq!(state.databases.len(), 1, "no duplicate");
    let create = only(&env.intents(), "create").clone();
    assert_eq!(
        (create.op_id.as_str(), create.state),
        (pending.op_id.as_str(), IntentState::Done)
    );
    assert_eq!(state.key_uses(&create.op_id), 2);
    assert_eq!(state.operations().len(), 1);
}

#[test]
fn a_second_apply_while_one_runs_is_refused_naming_the_pid() {
    let env = Env::new(&[decl("orders", 10)]);
    let running = paused_apply(&env, "after-intent");
    let pid = running.id();
    let second = env.apply(1);
    assert!(
        second
            .stderr
            .contains(&format!("in use by another tend (pid {pid})")),
        "{}",
        second.stderr
    );
    // Readers work beside the writer.
    TendCommand::new(&[
        "--config",
        &env.config().display().to_string(),
        "state",
        "show",
    ])
    .expect_code(0);
    TendCommand::new(&["--config", &env.config().display().to_string(), "plan"]).expect_code(0);
    kill(running);
    env.apply(0);
}

fn checksum(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn a_state_with_a_newer_min_reader_format_is_refused_and_left_unchanged() {
    let env = Env::new(&[decl("orders", 10)]);
    env.apply(0);
    {
        let conn = rusqlite::Connection::open(env.state().join("state.db")).unwrap();
        conn.execute(
            "UPDATE meta SET value = '7' WHERE key = 'min_reader_format'",
            [],
        )
        .unwrap();
        conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    }
    let db = env.state().join("state.db");
    let before = checksum(&db);
    // 78: no restart can help (systemd's RestartPreventExitStatus=78).
    let run = env.apply(78);
    assert!(
        run.stderr.contains("min_reader_format is 7"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("docs/runbooks/rollback.md"),
        "{}",
        run.stderr
    );
    assert_eq!(
        checksum(&db),
        before,
        "the state file is byte-for-byte unchanged"
    );
    TendCommand::new(&[
        "--config",
        &env.config().display().to_string(),
        "state",
        "show",
    ])
    .expect_code(78);
}

#[test]
fn a_provider_label_override_with_a_duration_expires_across_runs() {
    let env = Env::new(&[decl("orders", 10)]);
    env.apply(0);
    TendCommand::new(&[
        "--config",
        &env.config().display().to_string(),
        "sandbox",
        "edit",
        "orders",
        "--set",
        "connectionLimit=99",
        "--label",
        "tend.dev/paused=true",
        "--label",
        "tend.dev/override-reason=DBA on call",
        "--label",
        "tend.dev/override-expires=2s",
        "--label",
        "tend.dev/override-on-expiry=resume",
    ])
    .expect_code(0);
    env.configure("", "drift_grace = \"0s\"");
    env.apply(2);
    assert_eq!(
        env.sandbox_state().databases["orders"].fields["connectionLimit"],
        99,
        "paused by the label"
    );
    std::thread::sleep(Duration::from_millis(2300));
    env.apply(0);
    assert_eq!(
        env.sandbox_state().databases["orders"].fields["connectionLimit"],
        10,
        "the override expired 2 s after tend first saw it, and management resumed"
    );
}

#[test]
fn local_overrides_work_beside_a_running_writer_and_expire() {
    let env = Env::new(&[decl("orders", 10)]);
    let config = env.config().display().to_string();
    let tend = |args: &[&str], code: i32| {
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        TendCommand::new(&all)
            .env("TEND_LOG", "warn")
            .expect_code(code)
    };

    // A writer holds the state dir (paused after journalling a create);
    // an operator pauses the resource from the host meanwhile.
    let running = paused_apply(&env, "after-intent");
    tend(
        &[
            "override",
            "set",
            "orders",
            "--pause",
            "--reason",
            "INC-12: Git is down",
        ],
        0,
    );
    let listed = tend(&["override", "list"], 0);
    assert!(
        listed.stdout.contains("orders") && listed.stdout.contains("INC-12"),
        "{}",
        listed.stdout
    );
    kill(running);

    // The journalled create is superseded by the pause, nothing is created,
    // and the report names the local override.
    let run = tend(&["apply", "--format", "json"], 2);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["resources"][0]["state"], "Overridden");
    assert_eq!(report["resources"][0]["override"]["source"], "local");
    assert!(env.sandbox_state().databases.is_empty());
    assert_eq!(only(&env.intents(), "create").state, IntentState::Failed);

    // Cleared: the database is created.
    tend(&["override", "clear", "orders"], 0);
    env.apply(0);
    assert_eq!(env.sandbox_state().databases.len(), 1);

    // A typo in a local override is refused, never stored.
    let refused = tend(
        &[
            "override",
            "set",
            "orders",
            "--ignore-fields",
            "encoding",
            "--reason",
            "x",
        ],
        1,
    );
    assert!(refused.stderr.contains("immutable"), "{}", refused.stderr);

    // An ignore-fields override with a duration holds, then resumes.
    tend(
        &[
            "override",
            "set",
            "orders",
            "--ignore-fields",
            "connectionLimit",
            "--reason",
            "INC-13",
            "--expires",
            "2s",
            "--on-expiry",
            "resume",
        ],
        0,
    );
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
    env.configure("", "drift_grace = \"0s\"");
    env.apply(2);
    assert_eq!(
        env.sandbox_state().databases["orders"].fields["connectionLimit"],
        99
    );
    std::thread::sleep(Duration::from_millis(2300));
    env.apply(0);
    assert_eq!(
        env.sandbox_state().databases["orders"].fields["connectionLimit"],
        10
    );
}

#[test]
fn with_one_slot_every_operation_still_runs_once() {
    // Operations wait in a queue and start as the provider's slots free up:
    // with one slot and a lost response, each still runs, under its own id.
    let names = ["a1", "a2", "a3", "a4", "a5", "a6"];
    let env = Env::new(&names.map(|n| decl(n, 5)));
    env.configure("lose_responses = 1", "max_concurrency = 1");
    env.apply(0);
    let state = env.sandbox_state();
    assert_eq!(
        state.databases.keys().cloned().collect::<Vec<_>>(),
        names.map(|n| n.to_string()),
        "one database per declaration"
    );
    let intents = env.intents();
    assert_eq!(intents.len(), names.len(), "{intents:#?}");
    assert!(
        intents
            .iter()
            .all(|i| i.kind == "create" && i.state == IntentState::Done),
        "{intents:#?}"
    );
    assert_eq!(
        intents.iter().map(|i| i.attempts).sum::<u32>(),
        names.len() as u32 + 1,
        "one lost response, retried once with the same id"
    );
    assert_eq!(state.operations().len(), names.len(), "one key per create");
}
