//! The reconcile path through the real binary: `plan` and `apply` agree,
//! the mass-deletion guard is a circuit breaker, unreadable state is never
//! turned into action, and `plan` stays out of the writer's way. Each test
//! failed before the reconcile-path rework (see the note on the issue).

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use support::TendCommand;
use support::fixture::{Fixture, resource};
use support::git::manifest;

/// Each test's repository, directory and configuration.
type Env = Fixture;

fn decl(name: &str, limit: u32) -> (String, String) {
    (format!("{name}.yaml"), manifest(name, limit))
}

fn with_annotations(name: &str, limit: u32, annotations: &str) -> (String, String) {
    (
        format!("{name}.yaml"),
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\n  annotations:\n{annotations}spec:\n  connectionLimit: {limit}\n"
        ),
    )
}

fn deletable(name: &str) -> (String, String) {
    (
        format!("{name}.yaml"),
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  connectionLimit: 5\n  deletionPolicy: Delete\n"
        ),
    )
}

#[test]
fn plan_counts_an_annotation_override_from_its_first_sighting_as_apply_does() {
    let env = Env::new(&[with_annotations(
        "orders",
        10,
        "    tend.dev/paused: \"true\"\n    tend.dev/override-reason: INC-1\n    tend.dev/override-expires: 2s\n    tend.dev/override-on-expiry: resume\n",
    )]);
    // The first apply sees the override and keeps the sighting.
    let first = env.apply(2);
    assert_eq!(resource(&first, "orders")["state"], "Overridden");
    std::thread::sleep(Duration::from_millis(2500));
    let plan = env.plan(0);
    let orders = resource(&plan, "orders");
    assert_eq!(
        orders["override"]["expired"], true,
        "2s after the first sighting the override has expired: {orders:#}"
    );
    assert_eq!(
        orders["action"], "Create",
        "resumed: plan creates, as apply will"
    );
    let applied = env.apply(0);
    assert_eq!(resource(&applied, "orders")["state"], "InSync");
    assert_eq!(env.databases(), ["orders"]);
}

/// The agent id is part of the state: every database tend manages carries
/// it. A configuration naming another id is refused by every command that
/// reads the state (78, both ids named, the state unchanged), never an
/// all-Blocked fleet; pinning the kept id works.
#[test]
fn a_configured_agent_id_the_state_does_not_keep_is_refused_by_every_command() {
    let mut env = Env::new(&[decl("orders", 10)]);
    let kept = env.apply(0)["agent"]["id"].as_str().unwrap().to_string();
    let before = std::fs::read(env.state().join("state.db")).unwrap();
    env.configure(|c| c.top("agent_id", Some("\"other-agent\"")));
    for args in [
        &["plan"][..],
        &["apply"],
        &["explain", "orders"],
        &["config", "check"],
    ] {
        let out = env.tend(args, 78);
        assert!(
            out.stderr.contains(&format!("belongs to agent `{kept}`"))
                && out.stderr.contains("agent_id = \"other-agent\"")
                && out.stderr.contains(&format!("Set agent_id = \"{kept}\"")),
            "tend {args:?}: {}",
            out.stderr
        );
    }
    assert_eq!(
        std::fs::read(env.state().join("state.db")).unwrap(),
        before,
        "a refused command changed the state"
    );
    env.configure(|c| c.top("agent_id", Some(&format!("\"{kept}\""))));
    let plan = env.plan(0);
    assert_eq!(plan["agent"]["id"], kept.as_str());
    assert_eq!(resource(&plan, "orders")["state"], "InSync");
    env.tend(&["config", "check"], 0);
}

#[test]
fn the_mass_deletion_guard_holds_every_deletion_until_an_operator_acts() {
    let names: Vec<String> = (1..=9).map(|i| format!("db{i}")).collect();
    let files: Vec<(String, String)> = names.iter().map(|n| deletable(n)).collect();
    let mut env = Env::new(&files);
    env.configure(|c| {
        c.reconcile("deletion_delay", "\"0s\"")
            .reconcile("max_deletion_percent", "30")
    });
    env.apply(0);
    assert_eq!(env.databases().len(), 9);
    for n in &names[..5] {
        env.repo.remove(&format!("{n}.yaml"));
    }
    env.repo.commit("remove five");

    // 5 due, limit min(5, 30% of 9 = 2): none of them is deleted, cycle
    // after cycle (a throttle would delete 2, then 1, then 1 ...).
    for _ in 0..3 {
        let report = env.apply(2);
        assert_eq!(env.databases().len(), 9, "the guard deleted something");
        for n in &names[..5] {
            let r = resource(&report, n);
            assert_eq!(
                (r["state"].as_str(), r["action"].as_str()),
                (Some("Deleting"), Some("Hold"))
            );
            let reason = r["reason"].as_str().unwrap();
            assert!(
                reason.contains("5 were due together")
                    && reason.contains("limit of 2 for 9 managed"),
                "{reason}"
            );
        }
    }
    let listed = env.tend(&["deletions", "list"], 0).stdout;
    assert_eq!(
        listed.matches("HELD by the mass-deletion guard").count(),
        5,
        "{listed}"
    );

    // Approving names deletes exactly those; the others stay held.
    env.tend(
        &["deletions", "approve", "db1", "db2", "--reason", "CHG-42"],
        0,
    );
    let report = env.apply(2);
    assert_eq!(
        env.databases(),
        ["db3", "db4", "db5", "db6", "db7", "db8", "db9"]
    );
    assert_eq!(resource(&report, "db3")["action"], "Hold");
    let unknown = env.tend(&["deletions", "approve", "db6", "--reason", "x"], 1);
    assert!(unknown.stderr.contains("db6"), "{}", unknown.stderr);

    // Raising the limits so all five would have been allowed releases the rest.
    env.configure(|c| {
        c.reconcile("max_deletions", "10")
            .reconcile("max_deletion_percent", "100")
    });
    env.apply(0);
    assert_eq!(env.databases(), ["db6", "db7", "db8", "db9"]);
}

#[test]
fn below_the_limits_due_deletions_proceed_and_a_restored_declaration_is_not_deleted() {
    let names: Vec<String> = (1..=4).map(|i| format!("db{i}")).collect();
    let files: Vec<(String, String)> = names.iter().map(|n| deletable(n)).collect();
    let mut env = Env::new(&files);
    env.configure(|c| {
        c.reconcile("deletion_delay", "\"0s\"")
            .reconcile("max_deletions", "1")
    });
    env.apply(0);
    env.repo.remove("db1.yaml");
    env.repo.commit("remove one");
    env.apply(0);
    assert_eq!(env.databases(), ["db2", "db3", "db4"]);

    // Two due against a limit of one: held; restoring them ends the hold.
    env.repo.remove("db2.yaml").remove("db3.yaml");
    env.repo.commit("remove two");
    env.apply(2);
    assert_eq!(env.databases().len(), 3);
    let (f2, t2) = deletable("db2");
    let (f3, t3) = deletable("db3");
    env.repo.write(&f2, &t2).write(&f3, &t3);
    env.repo.commit("restore");
    let report = env.apply(0);
    assert_eq!(resource(&report, "db2")["state"], "InSync");
    assert_eq!(env.databases(), ["db2", "db3", "db4"]);
    let db = env.state_db();
    let holds: i64 = db
        .query_row("SELECT count(*) FROM deletion_holds", [], |r| r.get(0))
        .unwrap();
    assert_eq!(holds, 0, "restored declarations leave no hold behind");
}

/// Applies `orders`, then lets `corrupt` damage the state; the next cycle
/// must report `orders` as Error and change nothing at the provider even
/// though the declaration now asks for a new limit.
fn corrupt_then_change(corrupt: impl FnOnce(&Env)) -> (Env, Value) {
    let env = Env::new(&[decl("orders", 10), decl("other", 10)]);
    env.apply(0);
    corrupt(&env);
    env.repo.write("orders.yaml", &manifest("orders", 20));
    env.repo.write("other.yaml", &manifest("other", 20));
    env.repo.commit("raise the limits");
    let plan = env.plan(1);
    let orders = resource(&plan, "orders");
    assert_eq!(orders["state"], "Error", "{orders:#}");
    assert_eq!(orders["action"], "None");
    assert!(
        orders["reason"]
            .as_str()
            .unwrap()
            .contains("cannot be read"),
        "{orders:#}"
    );
    let report = env.apply(1);
    assert_eq!(resource(&report, "orders")["state"], "Error");
    assert_eq!(
        env.limit_at_provider("orders"),
        10,
        "no action without evidence"
    );
    assert_eq!(
        env.limit_at_provider("other"),
        20,
        "the rest are still reconciled"
    );
    (env, report)
}

#[test]
fn an_unreadable_intent_holds_its_resource_in_error() {
    corrupt_then_change(|env| {
        env.state_db()
            .execute(
                "INSERT INTO intents (op_id, name, kind, spec_hash, generation, request, state, attempts, created_ms, updated_ms)
                 VALUES ('broken', 'orders', 'update', 'h', 0, '{not json', 'pending', 1, 0, 0)",
                [],
            )
            .unwrap();
    });
}

#[test]
fn an_intent_in_an_unknown_state_is_not_read_as_pending_or_done() {
    corrupt_then_change(|env| {
        env.state_db()
            .execute(
                "INSERT INTO intents (op_id, name, kind, spec_hash, generation, request, state, attempts, created_ms, updated_ms)
                 VALUES ('odd', 'orders', 'update', 'h', 0, '{}', 'half-done', 1, 0, 0)",
                [],
            )
            .unwrap();
    });
}

#[test]
fn an_unreadable_local_override_is_an_error_not_no_override() {
    let (env, _) = corrupt_then_change(|env| {
        env.tend(
            &["override", "set", "orders", "--pause", "--reason", "INC-9"],
            0,
        );
        env.state_db()
            .execute(
                "UPDATE local_overrides SET annotations = '{oops' WHERE name = 'orders'",
                [],
            )
            .unwrap();
    });
    let list = env.tend(&["override", "list"], 0).stdout;
    assert!(list.contains("orders  UNREADABLE"), "{list}");
}

#[test]
fn unreadable_applied_values_are_an_error_not_a_declared_change() {
    corrupt_then_change(|env| {
        env.state_db()
            .execute(
                "UPDATE resources SET applied_fields = 'garbage' WHERE name = 'orders'",
                [],
            )
            .unwrap();
    });
}

#[test]
fn an_unreadable_tombstone_is_reported_not_dropped() {
    let env = Env::new(&[deletable("orders"), decl("other", 10)]);
    env.apply(0);
    env.repo.remove("orders.yaml");
    env.repo.commit("remove orders");
    let held = env.apply(2);
    assert_eq!(resource(&held, "orders")["state"], "Deleting");
    env.state_db()
        .execute(
            "UPDATE tombstones SET manifest = 'nope' WHERE name = 'orders'",
            [],
        )
        .unwrap();
    let plan = env.plan(1);
    let orders = resource(&plan, "orders");
    assert_eq!(orders["state"], "Error", "{plan:#}");
    assert!(
        orders["reason"].as_str().unwrap().contains("tombstones"),
        "{orders:#}"
    );
    env.apply(1);
    assert_eq!(env.databases(), ["orders", "other"], "nothing deleted");
}

#[test]
fn a_removed_declaration_whose_provider_is_gone_is_reported() {
    let env = Env::new(&[deletable("orders"), decl("other", 10)]);
    env.apply(0);
    env.repo.remove("orders.yaml");
    env.repo.commit("remove orders");
    env.apply(2);
    // The sandbox is renamed in the configuration: the tombstone's provider
    // is no longer configured.
    std::fs::write(
        env.dir.path().join("tend.toml"),
        env.config
            .text()
            .replace("[providers.sandbox]", "[providers.renamed]"),
    )
    .unwrap();
    let plan = env.plan(1);
    let orders = resource(&plan, "orders");
    assert_eq!(orders["state"], "Error", "{plan:#}");
    assert!(
        orders["reason"]
            .as_str()
            .unwrap()
            .contains("no longer configured"),
        "{orders:#}"
    );
}

#[test]
fn plan_beside_a_writer_never_takes_the_writers_ref_locks() {
    let env = Env::new(&[decl("orders", 10)]);
    env.apply(0);
    env.repo.write("orders.yaml", &manifest("orders", 20));
    let new_head = env.repo.commit("raise");
    // The writer is mid-fetch: git holds the tracking ref's lock file.
    let repo = env.state().join("source/repo.git");
    let tracking = repo.join("refs/tend/source/heads/main");
    let before = std::fs::read_to_string(&tracking).unwrap();
    let lock = repo.join("refs/tend/source/heads/main.lock");
    std::fs::write(&lock, "writer").unwrap();
    let plan = env.plan(0);
    assert_eq!(plan["source"]["commit"], new_head.as_str());
    assert_eq!(resource(&plan, "orders")["action"], "Update");
    assert_eq!(
        std::fs::read_to_string(&tracking).unwrap(),
        before,
        "the writer's ref moved"
    );
    assert!(lock.exists(), "the writer's lock was touched");
    assert!(
        !repo.join("FETCH_HEAD").exists()
            || std::fs::read_to_string(repo.join("FETCH_HEAD"))
                .unwrap()
                .is_empty()
    );
    let readers = repo.join("refs/tend/readers");
    let left: Vec<_> = walk(&readers);
    assert!(
        left.is_empty(),
        "a reader's private ref was left behind: {left:?}"
    );
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            if e.path().is_dir() {
                walk(&e.path())
            } else {
                vec![e.path()]
            }
        })
        .collect()
}

#[test]
fn absurd_durations_are_configuration_errors_not_panics() {
    let mut env = Env::new(&[decl("orders", 10)]);
    env.configure(|c| c.reconcile("drift_grace", "\"500000000y\""));
    let run = env.tend(&["plan"], 78);
    assert!(
        run.stderr.contains("drift_grace") && run.stderr.contains("10 years"),
        "{}",
        run.stderr
    );
    env.configure(|c| {
        c.reconcile("drift_grace", "\"10m\"")
            .sandbox("max_concurrency", "0")
    });
    let run = env.tend(&["plan"], 78);
    assert!(
        run.stderr.contains("max_concurrency") && run.stderr.contains("out of range"),
        "{}",
        run.stderr
    );
}

#[test]
fn an_override_expiry_beyond_ten_years_is_a_located_validation_error() {
    let dir = tempfile::tempdir().unwrap();
    let (file, text) = with_annotations(
        "orders",
        10,
        "    tend.dev/paused: \"true\"\n    tend.dev/override-reason: INC-1\n    tend.dev/override-expires: 8000y\n",
    );
    std::fs::write(dir.path().join(&file), text).unwrap();
    let run = TendCommand::new(&["validate", "."])
        .current_dir(dir.path())
        .expect_code(1);
    assert!(
        run.stderr.contains("./orders.yaml:") && run.stderr.contains("10 years"),
        "{}",
        run.stderr
    );
}

/// An annotation that expires in an hour and a local pause without
/// expiry: the report's `expires` is the annotation's, and the text says
/// it is the first of them, not when the resource is released.
#[test]
fn folded_overrides_say_whose_expiry_the_report_shows() {
    let env = Env::new(&[with_annotations(
        "orders",
        10,
        "    tend.dev/paused: \"true\"\n    tend.dev/override-reason: INC-3\n    tend.dev/override-expires: 1h\n",
    )]);
    env.apply(2);
    env.tend(
        &["override", "set", "orders", "--pause", "--reason", "INC-4"],
        0,
    );
    let plan = env.plan(0);
    let orders = resource(&plan, "orders");
    assert_eq!(
        orders["override"]["source"], "annotation,local",
        "{orders:#}"
    );
    assert!(orders["override"]["expires"].is_string(), "{orders:#}");
    let text = env.tend(&["plan"], 0).stdout;
    assert!(text.contains("; the first of them expires "), "{text}");
    env.tend(&["override", "clear", "orders"], 0);
    let text = env.tend(&["plan"], 0).stdout;
    assert!(
        text.contains("(annotation, paused): INC-3; expires "),
        "one source: its own expiry: {text}"
    );
}

#[test]
fn a_sighting_stored_in_the_old_debug_form_keeps_its_clock() {
    let env = Env::new(&[with_annotations(
        "orders",
        10,
        "    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: INC-3\n    tend.dev/override-expires: 1h\n",
    )]);
    // Created as declared (the ignored field included): in sync.
    env.apply(0);
    // A state written before the canonical fingerprint: the sighting is two
    // hours old and keyed by the `Debug` form.
    let legacy = r#"false|["connectionLimit"]|INC-3|Some("1h")"#;
    let two_hours_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 2 * 3600 * 1000;
    env.state_db()
        .execute(
            "UPDATE override_seen SET fingerprint = ?1, first_seen_ms = ?2 WHERE name = 'orders' AND source = 'annotation'",
            rusqlite::params![legacy, two_hours_ago],
        )
        .unwrap();
    let plan = env.plan(0);
    assert_eq!(
        resource(&plan, "orders")["override"]["expired"],
        true,
        "{plan:#}"
    );
    env.apply(0);
    let db = env.state_db();
    let (fingerprint, first_seen): (String, i64) = db
        .query_row(
            "SELECT fingerprint, first_seen_ms FROM override_seen WHERE name = 'orders'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        fingerprint.starts_with('{'),
        "migrated to the canonical form: {fingerprint}"
    );
    assert_eq!(
        first_seen, two_hours_ago,
        "the first sighting was carried over"
    );
}

#[test]
fn an_approved_deletion_that_can_never_run_does_not_keep_the_guard_tripped() {
    let names: Vec<String> = (1..=4).map(|i| format!("db{i}")).collect();
    let files: Vec<(String, String)> = names.iter().map(|n| deletable(n)).collect();
    let mut env = Env::new(&files);
    env.configure(|c| {
        c.reconcile("deletion_delay", "\"0s\"")
            .reconcile("max_deletions", "1")
    });
    env.apply(0);
    // db1 loses tend's marker at the provider: it can never be deleted.
    let sandbox = env.sandbox();
    let mut state = sandbox.load().unwrap();
    state.databases.get_mut("db1").unwrap().labels.clear();
    sandbox.save(&state).unwrap();
    env.repo.remove("db1.yaml").remove("db2.yaml");
    env.repo.commit("remove two");
    env.apply(2);
    assert_eq!(
        env.databases().len(),
        4,
        "two due against a limit of one: held"
    );
    env.tend(
        &["deletions", "approve", "db1", "db2", "--reason", "CHG-1"],
        0,
    );
    let report = env.apply(2);
    assert_eq!(env.databases(), ["db1", "db3", "db4"]);
    assert_eq!(
        resource(&report, "db1")["state"],
        "Blocked",
        "not ours: never deleted"
    );
    // One more removal is within the limit: it goes without an approval.
    env.repo.remove("db3.yaml");
    env.repo.commit("remove one more");
    env.apply(2);
    assert_eq!(env.databases(), ["db1", "db4"]);
}

#[test]
fn plan_reads_a_state_written_before_the_guard_tables_existed() {
    let env = Env::new(&[decl("orders", 10)]);
    env.apply(0);
    let db = env.state_db();
    db.execute_batch(
        "DROP TABLE deletion_holds; DROP TABLE deletion_approvals; DROP INDEX intents_by_state;
         UPDATE meta SET value = '2' WHERE key = 'format';
         UPDATE meta SET value = '1' WHERE key = 'min_reader_format';",
    )
    .unwrap();
    drop(db);
    let plan = env.plan(0);
    assert_eq!(resource(&plan, "orders")["state"], "InSync");
    env.tend(&["deletions", "list"], 0);
    env.tend(&["state", "show"], 0);
    // The writer migrates it.
    env.apply(0);
    let format: String = env
        .state_db()
        .query_row("SELECT value FROM meta WHERE key = 'format'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(format, tend::testing::journal::FORMAT.to_string());
}

#[test]
fn a_pending_intent_of_a_resource_with_unreadable_state_is_not_replayed() {
    let env = Env::new(&[decl("orders", 10)]);
    env.apply(0);
    env.tend(
        &["override", "set", "orders", "--pause", "--reason", "INC-5"],
        0,
    );
    let db = env.state_db();
    // The create looks unconfirmed again, and the pause cannot be read.
    db.execute_batch(
        "UPDATE intents SET state = 'pending', attempts = 1 WHERE kind = 'create';
         UPDATE local_overrides SET annotations = '{' WHERE name = 'orders';",
    )
    .unwrap();
    drop(db);
    let report = env.apply(1);
    let orders = resource(&report, "orders");
    assert_eq!(orders["state"], "Error");
    assert!(
        orders["reason"]
            .as_str()
            .unwrap()
            .contains("cannot be read"),
        "{orders:#}"
    );
    let (state, attempts): (String, i64) = env
        .state_db()
        .query_row(
            "SELECT state, attempts FROM intents WHERE kind = 'create'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (state.as_str(), attempts),
        ("pending", 1),
        "neither replayed nor dropped"
    );
}

#[test]
fn a_writer_sweeps_the_private_refs_readers_left_behind() {
    let env = Env::new(&[decl("orders", 10)]);
    env.apply(0);
    let repo = env.state().join("source/repo.git");
    let head = env.repo.head();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let fresh = format!("refs/tend/readers/{now}-42-1/heads/main");
    let stale = format!("refs/tend/readers/{}-43-1/heads/main", now - 3600);
    for name in [&fresh, &stale] {
        support::git::git(&repo, &["update-ref", name, &head]);
    }
    env.apply(0);
    let left = support::git::git(
        &repo,
        &["for-each-ref", "--format=%(refname)", "refs/tend/readers/"],
    );
    assert_eq!(left, fresh, "only the ref a reader left an hour ago goes");
}

/// `tend override set` answers in the words the operator typed: the
/// flags, not annotation names; a misspelt name or field gets the one
/// probably meant; one mistake is one message.
#[test]
fn override_set_answers_in_its_flags_and_suggests_the_name_meant() {
    let env = Env::new(&[decl("orders", 10)]);
    env.apply(0);
    let refused = |args: &[&str]| {
        let mut all = vec!["override", "set"];
        all.extend_from_slice(args);
        let run = env.tend(&all, 1);
        run.stderr.trim().to_string()
    };
    let typo = refused(&["ordres", "--pause", "--reason", "INC-1"]);
    assert!(
        typo.contains("no declaration named `ordres` (did you mean `orders`?)"),
        "{typo}"
    );
    let field = refused(&[
        "orders",
        "--ignore-fields",
        "conectionLimit",
        "--reason",
        "INC-1",
        "--expires",
        "2h",
    ]);
    assert!(
        field.contains(
            "unknown field `conectionLimit` (did you mean `connectionLimit`?) in --ignore-fields"
        ),
        "{field}"
    );
    assert!(!field.contains("tend.dev/"), "{field}");
    assert!(
        !field.contains("no override to apply to"),
        "one mistake, one message: {field}"
    );
    let bare = refused(&["orders", "--reason", "INC-1", "--expires", "2h"]);
    assert_eq!(
        bare,
        "tend override set: --expires has no override to apply to: set --pause or --ignore-fields, or remove it"
    );
    let when = refused(&["orders", "--pause", "--reason", "x", "--expires", "2"]);
    assert!(
        when.starts_with("tend override set: --expires must be an RFC 3339 time"),
        "{when}"
    );
    // Nothing was stored.
    let list = env.tend(&["override", "list"], 0).stdout;
    assert!(!list.contains("orders"), "{list}");
}

/// `name` declaring the database `orders_db`, `deletionPolicy: Delete`.
fn renamed_declaration(name: &str, adopt: bool) -> String {
    format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\n{}spec:\n  databaseName: orders_db\n  connectionLimit: 5\n  deletionPolicy: Delete\n",
        if adopt {
            "  annotations:\n    tend.dev/adopt: \"true\"\n"
        } else {
            ""
        }
    )
}

/// A rename of `metadata.name` under `deletionPolicy: Delete` (same
/// `databaseName`): `orders` → `ledger`.
fn renamed_env() -> (Env, String) {
    let mut env = Env::new(&[("orders.yaml", renamed_declaration("orders", false))]);
    env.configure(|c| c.reconcile("deletion_delay", "\"0s\""));
    env.apply(0);
    let id = env.sandbox().load().unwrap().databases["orders_db"]
        .id
        .clone();
    env.repo.remove("orders.yaml");
    env.repo
        .write("ledger.yaml", &renamed_declaration("ledger", false));
    env.repo.commit("rename orders to ledger");
    (env, id)
}

#[test]
fn a_rename_under_deletion_policy_delete_holds_the_deletion_until_the_new_name_adopts() {
    let (env, id) = renamed_env();
    // Before: the old name's tombstone deleted orders_db at once (its
    // deletion_delay is 0s) and `ledger` created an empty one next.
    let plan = env.plan(0);
    let ledger = resource(&plan, "ledger");
    assert_eq!(ledger["state"], "Blocked", "{ledger:#}");
    assert_eq!(ledger["rule"], "renamed");
    let reason = ledger["reason"].as_str().unwrap();
    assert!(
        reason.contains("removed from Git with deletionPolicy Delete")
            && reason.contains("tend.dev/adopt")
            && reason.contains("tend deletions approve orders"),
        "{reason}"
    );
    for _ in 0..3 {
        // Exit 2: a resource is blocked.
        let report = env.apply(2);
        let orders = resource(&report, "orders");
        assert_eq!(orders["rule"], "renamed", "{orders:#}");
        assert_eq!(orders["action"], "Hold");
    }
    assert_eq!(env.databases(), ["orders_db"]);
    let explain = env.tend(&["explain", "orders"], 0).stdout;
    assert!(
        explain.contains("renamed") && explain.contains("ledger"),
        "{explain}"
    );

    // The way out that keeps the data: adopt it under the new name.
    env.repo
        .write("ledger.yaml", &renamed_declaration("ledger", true));
    env.repo.commit("ledger adopts orders_db");
    env.apply(0);
    let report = env.apply(0);
    let orders = resource(&report, "orders");
    assert_eq!(orders["state"], "Released", "{orders:#}");
    assert!(
        orders["reason"]
            .as_str()
            .unwrap()
            .contains("took its database `orders_db` over")
    );
    let report = env.apply(0);
    assert_eq!(resource(&report, "ledger")["state"], "InSync");
    assert!(
        report["resources"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["name"] != "orders"),
        "the tombstone is gone: {report:#}"
    );
    let db = &env.sandbox().load().unwrap().databases["orders_db"];
    assert_eq!(
        db.id, id,
        "the same database, never deleted and created again"
    );
    assert_eq!(
        db.labels
            .get("tend.dev/owner-declaration")
            .map(String::as_str),
        Some("ledger")
    );
}

#[test]
fn a_rename_whose_deletion_an_operator_approves_deletes_and_creates_the_new_one_empty() {
    let (env, id) = renamed_env();
    env.apply(2);
    env.tend(
        &[
            "deletions",
            "approve",
            "orders",
            "--reason",
            "CHG-7 start empty",
        ],
        0,
    );
    let plan = env.plan(0);
    assert!(
        resource(&plan, "ledger")["reason"]
            .as_str()
            .unwrap()
            .contains("an operator approved (CHG-7 start empty)"),
        "{plan:#}"
    );
    env.apply(2);
    env.apply(0);
    let report = env.apply(0);
    assert_eq!(resource(&report, "ledger")["state"], "InSync");
    let db = &env.sandbox().load().unwrap().databases["orders_db"];
    assert_ne!(db.id, id, "deleted, then created empty for ledger");
}

/// Nothing is deleted, and nothing is marked for deletion, when the tree
/// declares nothing: neither when every file was removed nor when its
/// only file no longer parses. With `deletion_delay` 0 and no guard
/// limit, only that rule stands between such a commit and deleting every
/// database.
#[test]
fn an_empty_or_unparsable_tree_deletes_nothing_and_leaves_no_tombstone() {
    // (what, the only file left, apply's exit code: a file that does not
    // parse is an error)
    for (what, only_file, code) in [
        ("an empty tree", None, 0),
        (
            "a tree whose only file does not parse",
            Some((
                "broken.yaml",
                "apiVersion: tend.dev/v1alpha1\nkind: [unclosed\n",
            )),
            1,
        ),
    ] {
        let files: Vec<(String, String)> = ["db1", "db2"].iter().map(|n| deletable(n)).collect();
        let mut env = Env::new(&files);
        env.configure(|c| {
            c.reconcile("deletion_delay", "\"0s\"")
                .reconcile("max_deletions", "100")
                .reconcile("max_deletion_percent", "100")
        });
        env.apply(0);
        assert_eq!(env.databases(), ["db1", "db2"]);
        // Both databases' fields as the sandbox stores them.
        let fields = |env: &Env| -> Vec<Value> {
            let stored = env.sandbox().load().unwrap();
            ["db1", "db2"]
                .iter()
                .map(|n| stored.databases[*n].fields.clone().into_iter().collect())
                .collect()
        };
        let before = fields(&env);
        env.repo.remove("db1.yaml").remove("db2.yaml");
        if let Some((file, text)) = only_file {
            env.repo.write(file, text);
        }
        env.repo.commit(what);
        // Twice: a second cycle must not act on what the first remembered.
        for _ in 0..2 {
            let run = env.tend(&["apply", "--format", "json"], code);
            assert_eq!(
                env.databases(),
                ["db1", "db2"],
                "{what}: a database was deleted\n{}",
                run.stderr
            );
        }
        assert_eq!(before, fields(&env), "{what}: a database was changed");
        let tombstones: i64 = env
            .state_db()
            .query_row("SELECT count(*) FROM tombstones", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tombstones, 0, "{what}: removals were recorded");
    }
}
