//! The state store's behaviour, the same cases on both backends: SQLite
//! in a state dir and PostgreSQL (a real cluster from the test harness,
//! each case in a schema of its own).

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tend::testing::journal::{Applied, IntentState, PgStateSettings, StateStore};
use tend::testing::model::SpecHash;

/// Where a case's store lives; it is dropped after the case.
enum Place {
    Sqlite(tempfile::TempDir),
    Postgres(PgStateSettings),
}

impl Place {
    fn open(&self, writer: bool) -> Result<Option<StateStore>, tend::testing::journal::StateError> {
        match self {
            Place::Sqlite(dir) => StateStore::open(dir.path(), writer),
            Place::Postgres(settings) => StateStore::open_postgres(settings, writer),
        }
    }

    fn writer(&self) -> StateStore {
        self.open(true).unwrap().unwrap()
    }
}

/// Each case twice, one test per backend (so one failing case hides no
/// other): `NAME::on_sqlite` and `NAME::on_postgres`, the latter with a
/// cluster of its own.
macro_rules! both_backends {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            #[test]
            fn on_sqlite() {
                super::$case(&super::Place::Sqlite(tempfile::tempdir().unwrap()));
            }

            #[test]
            fn on_postgres() {
                let pg = super::support::postgres::Postgres::start();
                let schema = format!("s_{}", &stringify!($case)[..stringify!($case).len().min(40)]);
                super::$case(&super::Place::Postgres(super::settings(&pg, &schema)));
            }
        }
    )*};
}

both_backends!(
    superseded_pending_or_failed_creates_are_unconfirmed,
    generations_count_finished_operations,
    applied_fields_are_read_by_name_and_corrupt_values_reported,
    unknown_intent_states_are_open_and_corrupt,
    pruning_keeps_pending_and_recent_intents,
    freshness_moves_with_every_write,
    the_agent_id_is_generated_once,
    tombstones_overrides_and_deletion_holds_round_trip,
    drift_and_attempts_are_kept_per_field,
    notifications_queue_and_conditions,
    a_failed_write_leaves_nothing,
    writes_at_once_each_land_or_fail_alone,
    a_reader_sees_no_state_before_a_writer,
    last_operations_by_name_are_what_the_whole_read_gives,
);

fn settings(pg: &support::postgres::Postgres, schema: &str) -> PgStateSettings {
    PgStateSettings {
        url: pg.url(),
        password: None,
        schema: schema.to_string(),
        tls_ca_file: None,
    }
}

#[test]
fn a_newer_min_reader_format_on_postgres_is_refused_and_nothing_is_written() {
    let pg = support::postgres::Postgres::start();
    let place = Place::Postgres(settings(&pg, "guarded"));
    drop(place.writer());
    pg.psql("UPDATE guarded.meta SET value = '99' WHERE key = 'min_reader_format'");
    // Every row's transaction id and the tables: a write changes one.
    let snapshot = || {
        pg.psql(
            "SELECT string_agg(key || '=' || value || '@' || xmin::text, ',' ORDER BY key) FROM guarded.meta \
             UNION ALL SELECT count(*)::text FROM pg_tables WHERE schemaname = 'guarded'",
        )
    };
    let before = snapshot();
    for writer in [true, false] {
        let err = place.open(writer).unwrap_err().to_string();
        assert!(
            err.contains("min_reader_format is 99") && err.contains("docs/runbooks/rollback.md"),
            "{err}"
        );
        assert!(err.contains("schema guarded"), "names the schema: {err}");
    }
    assert_eq!(snapshot(), before, "the refused opens wrote nothing");
}

#[test]
fn agents_starting_together_create_one_postgres_state() {
    let pg = support::postgres::Postgres::start();
    let settings = settings(&pg, "together");
    let opened: Vec<_> = (0..6)
        .map(|_| {
            let settings = settings.clone();
            std::thread::spawn(move || {
                StateStore::open_postgres(&settings, true).map(|s| s.is_some())
            })
        })
        .collect();
    for handle in opened {
        assert!(
            handle.join().unwrap().unwrap(),
            "every writer opens the state"
        );
    }
    assert_eq!(
        pg.psql("SELECT value FROM together.meta WHERE key = 'format'"),
        tend::testing::journal::FORMAT.to_string()
    );
}

fn last_operations_by_name_are_what_the_whole_read_gives(place: &Place) {
    let store = place.writer();
    let (h, now) = (SpecHash::from("h"), SystemTime::now());
    for (op, name, state) in [
        ("op1", "orders", IntentState::Done),
        ("op2", "orders", IntentState::Failed),
        ("op3", "billing", IntentState::Done),
        ("op4", "ledger", IntentState::Pending),
    ] {
        store
            .begin_intent(op, name, "update", &h, 0, &Value::Null, now)
            .unwrap();
        if state != IntentState::Pending {
            store.finish_intent(op, state, Some("why"), now).unwrap();
        }
    }
    let whole = store.last_operations().unwrap();
    let named = store
        .last_operations_of(&["orders", "billing", "ledger", "nobody"])
        .unwrap();
    assert_eq!(named, whole, "a pending intent is no last operation");
    assert_eq!(
        named["orders"].id, "op1",
        "of one millisecond, the lower id"
    );
    // The finished-operations mark counts what a prune took out of the
    // journal: pruning alone does not move its count or newest time (only
    // how many of the journal's rows finished then).
    let mark = store.finished_operations_mark().unwrap();
    assert_eq!((mark.count, mark.recent), (3, 3), "three finished");
    let later = now + std::time::Duration::from_secs(3600);
    assert_eq!(store.prune_journal(later, 1).unwrap(), 1, "orders' op2");
    assert_eq!(
        store.last_operations().unwrap(),
        whole,
        "a prune keeps every last operation (op1 of one millisecond)"
    );
    let pruned = store.finished_operations_mark().unwrap();
    assert_eq!(
        (pruned.count, pruned.newest_ms, pruned.recent),
        (mark.count, mark.newest_ms, 2)
    );
    // What finished since a mark is told apart, and read as the whole
    // read gives it (the mark counted with the rows, in one statement).
    let later = now + std::time::Duration::from_millis(1);
    store
        .finish_intent("op4", IntentState::Done, None, later)
        .unwrap();
    let (read, changed) = store
        .last_operations_since(pruned, store.finished_operations_mark().unwrap())
        .unwrap()
        .expect("told apart");
    assert!(changed.contains("ledger"), "{changed:?}");
    let whole = store.last_operations().unwrap();
    for (name, op) in &read {
        assert_eq!(Some(op), whole.get(name), "{name}");
    }
}

fn superseded_pending_or_failed_creates_are_unconfirmed(place: &Place) {
    let store = place.writer();
    let (h, now) = (SpecHash::from("h"), SystemTime::now());
    for (op, name) in [("op1", "a"), ("op2", "b"), ("op3", "c")] {
        store
            .begin_intent(op, name, "create", &h, 0, &Value::Null, now)
            .unwrap();
    }
    store
        .finish_intent(
            "op2",
            IntentState::Failed,
            Some("superseded: the declaration changed"),
            now,
        )
        .unwrap();
    store
        .finish_intent(
            "op3",
            IntentState::Failed,
            Some("the server refused it"),
            now,
        )
        .unwrap();
    store
        .begin_intent("op4", "d", "update", &h, 0, &Value::Null, now)
        .unwrap();
    store
        .finish_intent(
            "op4",
            IntentState::Failed,
            Some("the server refused it"),
            now,
        )
        .unwrap();
    let memories = store.read_memories().unwrap().memories;
    let flag = |n: &str| memories.get(n).is_some_and(|m| m.unconfirmed_write);
    assert!(flag("a"), "pending");
    assert!(flag("b"), "superseded");
    assert!(
        flag("c"),
        "a refused create may have made the database before a setting was refused"
    );
    assert!(
        !flag("d"),
        "a refused update: what is there is not tend's write"
    );
}

fn generations_count_finished_operations(place: &Place) {
    let store = place.writer();
    let h = SpecHash::from("h");
    let now = SystemTime::now();
    assert_eq!(store.next_generation("a", "update", &h).unwrap(), 0);
    assert_eq!(
        store
            .begin_intent("op1", "a", "update", &h, 0, &Value::Null, now)
            .unwrap(),
        0
    );
    store.note_attempt("op1").unwrap();
    assert_eq!(
        store
            .begin_intent("op1", "a", "update", &h, 0, &Value::Null, now)
            .unwrap(),
        1,
        "a replay keeps the row and its attempts"
    );
    assert_eq!(
        store.next_generation("a", "update", &h).unwrap(),
        0,
        "a pending intent is retried, not replaced"
    );
    store
        .finish_intent("op1", IntentState::Done, None, now)
        .unwrap();
    assert_eq!(store.next_generation("a", "update", &h).unwrap(), 1);
    assert!(store.pending_intents().unwrap().is_empty());
}

fn applied(name: &str, hash: &SpecHash, fields: &BTreeMap<String, Value>, store: &StateStore) {
    let applied = Applied {
        provider: "p",
        database_name: name,
        file: "f.yaml",
        manifest: &Value::Null,
        spec_hash: hash,
        fields,
        commit: None,
        external_id: "id",
    };
    store
        .write(|tx| tx.record_applied(name, &applied, SystemTime::now()))
        .unwrap();
}

fn applied_fields_are_read_by_name_and_corrupt_values_reported(place: &Place) {
    let store = place.writer();
    let fields = BTreeMap::from([("owner".to_string(), Value::from("app"))]);
    let hash = SpecHash::from("old");
    for name in ["good", "bad"] {
        applied(name, &hash, &fields, &store);
    }
    store
        .execute_unchecked("UPDATE resources SET applied_fields = '{not json' WHERE name = 'bad'")
        .unwrap();
    let read = store
        .applied_fields(&["good".into(), "bad".into(), "absent".into()])
        .unwrap();
    assert_eq!(read.len(), 2, "an absent resource has no row");
    assert_eq!(read[0].1, Some(hash.clone()));
    assert_eq!(read[0].2.as_ref().unwrap(), &fields);
    let corrupt = read[1].2.as_ref().unwrap_err();
    assert_eq!(corrupt.name, "bad");
    assert!(corrupt.problem.contains("not a JSON object"), "{corrupt}");
    let memories = store.read_memories().unwrap().memories;
    assert!(memories.values().all(|m| m.existed) && memories.len() == 2);
    assert!(store.knows_resource("good").unwrap());
    assert!(!store.knows_resource("absent").unwrap());
}

fn unknown_intent_states_are_open_and_corrupt(place: &Place) {
    let store = place.writer();
    let h = SpecHash::from("h");
    let now = SystemTime::now();
    for op in ["p", "d", "x", "j"] {
        store
            .begin_intent(op, op, "update", &h, 0, &Value::Null, now)
            .unwrap();
    }
    store
        .finish_intent("d", IntentState::Done, None, now)
        .unwrap();
    store
        .execute_unchecked("UPDATE intents SET state = 'frozen' WHERE op_id = 'x'")
        .unwrap();
    store
        .execute_unchecked("UPDATE intents SET request = '{' WHERE op_id = 'j'")
        .unwrap();
    let names: Vec<String> = store
        .open_intents()
        .unwrap()
        .iter()
        .map(|r| match r {
            Ok(i) => format!("ok:{}", i.name),
            Err(c) => format!("corrupt:{}", c.name),
        })
        .collect();
    assert_eq!(
        names,
        ["corrupt:j", "ok:p", "corrupt:x"],
        "oldest first, then by id"
    );
    assert_eq!(store.pending_intents().unwrap().len(), 1);
    let problems = store.check().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("unknown state `frozen`")),
        "{problems:?}"
    );
}

fn pruning_keeps_pending_and_recent_intents(place: &Place) {
    let store = place.writer();
    let h = SpecHash::from("h");
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    for (i, op) in ["a0", "a1", "a2", "a3", "a4"].iter().enumerate() {
        let at = old + Duration::from_secs(i as u64);
        store
            .begin_intent(op, "a", "update", &h, i as u32, &Value::Null, at)
            .unwrap();
        store
            .finish_intent(op, IntentState::Done, None, at)
            .unwrap();
    }
    store
        .begin_intent("a5", "a", "update", &h, 5, &Value::Null, old)
        .unwrap();
    assert_eq!(store.next_generation("a", "update", &h).unwrap(), 5);
    let cutoff = old + Duration::from_secs(3600);
    assert_eq!(
        store.prune_journal(cutoff, 2).unwrap(),
        3,
        "the three oldest finished go; the newest two stay"
    );
    let mut left: Vec<String> = store
        .all_intents()
        .unwrap()
        .into_iter()
        .map(|i| i.op_id)
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["a3", "a4", "a5"].map(String::from),
        "pending a5 is never pruned"
    );
    assert_eq!(
        store.next_generation("a", "update", &h).unwrap(),
        5,
        "the next operation does not reuse a pruned one's id"
    );
    assert_eq!(store.prune_journal(cutoff, 2).unwrap(), 0);
}

fn freshness_moves_with_every_write(place: &Place) {
    let store = place.writer();
    let read = store.read_memories().unwrap().freshness.unwrap();
    assert_eq!(
        store.freshness().unwrap(),
        read,
        "nothing written: still fresh"
    );
    store
        .write(|tx| tx.record_write("a", SystemTime::now()))
        .unwrap();
    let after_own = store.freshness().unwrap();
    assert_ne!(after_own, read, "this store wrote");
    // `tend override set` from another process: another connection.
    let other = place.writer();
    other
        .set_local_override("a", &BTreeMap::new(), SystemTime::now())
        .unwrap();
    assert_ne!(
        store.freshness().unwrap(),
        after_own,
        "another connection wrote"
    );
}

fn the_agent_id_is_generated_once(place: &Place) {
    let store = place.writer();
    let id = store.agent_id(None).unwrap();
    assert!(id.starts_with("tend-"));
    assert_eq!(store.agent_id(None).unwrap(), id);
    assert_eq!(
        place.writer().agent_id(None).unwrap(),
        id,
        "kept in the state"
    );
    // A configured id the state does not keep is refused, naming both.
    let refused = store.agent_id(Some("configured")).unwrap_err().to_string();
    assert!(
        refused.contains(&format!("belongs to agent `{id}`"))
            && refused.contains("agent_id = \"configured\""),
        "{refused}"
    );
    assert_eq!(store.agent_id(Some(&id)).unwrap(), id);
}

fn tombstones_overrides_and_deletion_holds_round_trip(place: &Place) {
    let store = place.writer();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000);
    let manifest: Value = serde_json::from_str(
        r#"{"apiVersion":"tend.dev/v1","kind":"ManagedDatabase","metadata":{"name":"gone"},"spec":{"provider":"p","databaseName":"gone","owner":"app"}}"#,
    )
    .unwrap();
    store
        .write(|tx| {
            tx.add_tombstone("gone", &manifest, now, "c1")?;
            tx.add_tombstone("gone", &manifest, now + Duration::from_secs(5), "c2")
        })
        .unwrap();
    let tombstones = store.tombstones().unwrap();
    assert_eq!(tombstones.len(), 1);
    let row = tombstones[0].as_ref().unwrap();
    assert_eq!(
        (row.removal_commit.as_str(), row.removed_at),
        ("c1", now),
        "the first removal is kept"
    );
    store
        .write(|tx| tx.tombstone_progress("gone", now, Some("busy")))
        .unwrap();
    assert_eq!(
        store.tombstones().unwrap()[0]
            .as_ref()
            .unwrap()
            .last_error
            .as_deref(),
        Some("busy")
    );
    let pause = BTreeMap::from([("tend.dev/paused".to_string(), "true".to_string())]);
    store.set_local_override("gone", &pause, now).unwrap();
    let overrides = store.local_overrides().unwrap();
    assert!(overrides[0].as_ref().unwrap().is_pause());
    store
        .write(|tx| tx.override_seen("gone", "git", "f1", now))
        .unwrap();
    assert_eq!(
        store.overrides_seen().unwrap()[&("gone".to_string(), "git".to_string())].first_seen,
        now
    );
    let hold = tend::testing::engine::HeldDeletion {
        since: now,
        due_together: 7,
    };
    store
        .write(|tx| tx.hold_deletions(&["gone".to_string()], hold))
        .unwrap();
    assert_eq!(store.held_deletions().unwrap()["gone"], hold);
    store
        .approve_deletion("gone", "decommissioned", now)
        .unwrap();
    assert_eq!(store.approvals().unwrap()["gone"].reason, "decommissioned");
    assert!(store.clear_local_override("gone").unwrap());
    assert!(!store.clear_local_override("gone").unwrap());
    store.write(|tx| tx.forget("gone")).unwrap();
    assert!(store.tombstones().unwrap().is_empty());
    assert!(store.held_deletions().unwrap().is_empty());
    assert!(store.approvals().unwrap().is_empty());
}

fn drift_and_attempts_are_kept_per_field(place: &Place) {
    let store = place.writer();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(3_000_000);
    let fields = BTreeMap::new();
    applied("a", &SpecHash::from("h"), &fields, &store);
    store
        .write(|tx| tx.sync_drift("a", &["owner".into(), "encoding".into()], t0))
        .unwrap();
    store
        .write(|tx| tx.sync_drift("a", &["owner".into()], t0 + Duration::from_secs(9)))
        .unwrap();
    let memory = &store.read_memories().unwrap().memories["a"];
    assert_eq!(memory.drift_first_seen.len(), 1);
    assert_eq!(
        memory.drift_first_seen["owner"], t0,
        "the first sighting is kept"
    );
    let diff = |d: &str, o: &str| ("owner".to_string(), Value::from(d), Value::from(o));
    for _ in 0..2 {
        store
            .write(|tx| tx.record_attempts("a", &[diff("x", "y")]))
            .unwrap();
    }
    let count = |s: &StateStore| {
        s.read_memories().unwrap().memories["a"]
            .failed_attempts
            .get("owner")
            .map(|a| a.count)
    };
    assert_eq!(count(&store), Some(2), "the same two values count on");
    store
        .write(|tx| tx.record_attempts("a", &[diff("x", "z")]))
        .unwrap();
    assert_eq!(count(&store), Some(1), "other values start again");
    store.write(|tx| tx.record_attempts("a", &[])).unwrap();
    assert_eq!(count(&store), None, "a converged field's count goes");
    store
        .write(|tx| tx.record_attempts("a", &[diff("x", "y")]))
        .unwrap();
    assert!(store.reset_attempts("a").unwrap());
    assert_eq!(count(&store), None);
}

fn notifications_queue_and_conditions(place: &Place) {
    let store = place.writer();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(4_000_000);
    let conditions = |list: &[(&str, &str)]| -> std::collections::BTreeSet<(String, String)> {
        list.iter()
            .map(|(s, c)| (s.to_string(), c.to_string()))
            .collect()
    };
    let queued = (
        "hook".to_string(),
        "drift".to_string(),
        "a".to_string(),
        "{}".to_string(),
    );
    store
        .record_notifications(
            &conditions(&[("a", "drift"), ("b", "blocked")]),
            &[queued.clone(), queued],
            &[],
            now,
        )
        .unwrap();
    store
        .record_notifications(&conditions(&[("a", "drift")]), &[], &[], now)
        .unwrap();
    assert_eq!(
        store.notify_conditions().unwrap(),
        conditions(&[("a", "drift")])
    );
    let due = store.due_notifications(now, 10).unwrap();
    assert_eq!(due.len(), 2);
    assert!(due[0].id < due[1].id, "oldest first");
    assert_eq!(
        store.due_notifications(now, 1).unwrap().len(),
        1,
        "the limit holds"
    );
    store
        .notification_failed(due[0].id, "refused", now + Duration::from_secs(60))
        .unwrap();
    store.notification_done(due[1].id).unwrap();
    assert!(store.due_notifications(now, 10).unwrap().is_empty());
    assert_eq!(
        store.next_notification_due().unwrap(),
        Some(now + Duration::from_secs(60))
    );
    let retried = store
        .due_notifications(now + Duration::from_secs(60), 10)
        .unwrap();
    assert_eq!(retried[0].attempts, 1);

    // A resolved alert drops its firing alert still waiting (same
    // receiver, subject and event); a commit status replaces its own
    // commit's, never another commit's.
    let message = |event: &str, subject: &str| {
        (
            "am".to_string(),
            event.to_string(),
            subject.to_string(),
            "[]".to_string(),
        )
    };
    store
        .record_notifications(
            &conditions(&[("a", "drift")]),
            &[
                message("drift-detected", "orders"),
                message("drift-detected", "billing"),
                message("commit-status", "c1"),
                message("commit-status", "c2"),
            ],
            &[],
            now,
        )
        .unwrap();
    store
        .record_notifications(
            &conditions(&[("a", "drift")]),
            &[
                message("resolved:drift-detected", "orders"),
                message("commit-status", "c1"),
            ],
            &[],
            now,
        )
        .unwrap();
    let waiting: Vec<(String, String)> = store
        .due_notifications(now + Duration::from_secs(60), 100)
        .unwrap()
        .into_iter()
        .filter(|n| n.receiver == "am")
        .map(|n| (n.event, n.subject))
        .collect();
    let pair = |e: &str, s: &str| (e.to_string(), s.to_string());
    assert_eq!(
        waiting,
        [
            pair("drift-detected", "billing"),
            pair("commit-status", "c2"),
            pair("resolved:drift-detected", "orders"),
            pair("commit-status", "c1"),
        ]
    );
}

fn a_failed_write_leaves_nothing(place: &Place) {
    let store = place.writer();
    let h = SpecHash::from("h");
    let failed: Result<(), _> = store.write(|tx| {
        tx.finish_intent("none", IntentState::Done, None, SystemTime::now())?;
        tx.record_write("x", SystemTime::now())?;
        Err(tend::testing::journal::StateError::Refused {
            path: "test".into(),
            problem: "injected".into(),
        })
    });
    assert!(failed.is_err());
    store
        .begin_intent("op", "a", "create", &h, 0, &Value::Null, SystemTime::now())
        .unwrap();
    assert_eq!(
        store.all_intents().unwrap().len(),
        1,
        "the store still writes after a rollback"
    );
}

/// Writes that meet at the connection share a commit: two made to meet
/// (the first waits, inside its write, until the second is at the
/// connection), the second refused by the backend at a statement (on
/// PostgreSQL that aborts the whole transaction until it is rolled back to
/// the write's savepoint); then many threads at once. Each write lands
/// whole, and one that fails is undone alone.
fn writes_at_once_each_land_or_fail_alone(place: &Place) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let store = place.writer();
    let (h, now) = (SpecHash::from("h"), SystemTime::now());
    for op in ["first", "second"] {
        store
            .begin_intent(op, &format!("db-{op}"), "create", &h, 0, &Value::Null, now)
            .unwrap();
    }
    let (commits_before, _) = store.commits();
    let inside = AtomicBool::new(false);
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let (first, second) = std::thread::scope(|s| {
        let second = s.spawn(|| {
            until("the first write never began", &|| {
                inside.load(Ordering::SeqCst)
            });
            store.write(|tx| {
                tx.finish_intent("second", IntentState::Done, None, now)?;
                tx.exec_unchecked("INSERT INTO no_such_table VALUES (1)")
            })
        });
        let first = store.write(|tx| {
            tx.finish_intent("first", IntentState::Done, None, now)?;
            inside.store(true, Ordering::SeqCst);
            until("the second write never came", &|| {
                store.waiting_for_connection() > 0
            });
            Ok(())
        });
        (first, second.join().unwrap())
    });
    first.unwrap();
    let refused = second.unwrap_err().to_string();
    assert!(refused.contains("no_such_table"), "{refused}");
    assert_eq!(
        store.commits().0 - commits_before,
        1,
        "the two writes met in one transaction"
    );
    let state_of = |op: &str| {
        store
            .all_intents()
            .unwrap()
            .into_iter()
            .find(|i| i.op_id == op)
            .map(|i| i.state)
    };
    assert_eq!(state_of("first"), Some(IntentState::Done));
    assert_eq!(
        state_of("second"),
        Some(IntentState::Pending),
        "undone alone"
    );

    let threads = 24;
    let start = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        for i in 0..threads {
            let (store, start, h) = (&store, &start, &h);
            s.spawn(move || {
                let op = format!("op{i:02}");
                start.wait();
                store
                    .begin_intent_and_attempt(
                        &op,
                        &format!("db{i:02}"),
                        "create",
                        h,
                        0,
                        &Value::Null,
                        now,
                    )
                    .unwrap();
                if i.is_multiple_of(2) {
                    store
                        .finish_intent(&op, IntentState::Done, None, now)
                        .unwrap();
                } else {
                    let failed: Result<(), _> = store.write(|tx| {
                        tx.finish_intent(&op, IntentState::Failed, Some("undone"), now)?;
                        Err(tend::testing::journal::StateError::Refused {
                            path: "test".into(),
                            problem: "injected".into(),
                        })
                    });
                    assert!(failed.is_err());
                }
            });
        }
    });
    let intents: Vec<_> = store
        .all_intents()
        .unwrap()
        .into_iter()
        .filter(|i| i.op_id.starts_with("op"))
        .collect();
    assert_eq!(intents.len(), threads);
    for intent in intents {
        let i: usize = intent.op_id[2..].parse().unwrap();
        let expected = if i.is_multiple_of(2) {
            IntentState::Done
        } else {
            IntentState::Pending
        };
        assert_eq!(intent.state, expected, "{}", intent.op_id);
        assert_eq!(intent.attempts, 1, "{}", intent.op_id);
        assert_eq!(intent.last_error, None, "{}", intent.op_id);
    }
}

fn a_reader_sees_no_state_before_a_writer(place: &Place) {
    assert!(
        place.open(false).unwrap().is_none(),
        "no state yet: nothing to read"
    );
    drop(place.writer());
    let reader = place.open(false).unwrap().unwrap();
    assert!(reader.summary().unwrap().contains("resources managed: 0"));
}

/// TLS as for the postgres provider: the URL's `sslmode` and a CA file
/// that verifies the server; a server that refuses plain connections is
/// refused with its reason.
#[test]
fn the_postgres_state_speaks_tls_verified_by_the_configured_ca() {
    let pg = support::postgres::Postgres::start_with_tls();
    let with = |sslmode: &str, ca: bool| PgStateSettings {
        url: format!("{}?sslmode={sslmode}", pg.url()),
        password: None,
        schema: "secured".into(),
        tls_ca_file: ca.then(|| pg.ca_file()),
    };
    let plain = StateStore::open_postgres(&with("disable", false), true)
        .unwrap_err()
        .to_string();
    assert!(plain.contains("no pg_hba.conf entry"), "{plain}");
    let store = StateStore::open_postgres(&with("require", true), true)
        .unwrap()
        .unwrap();
    journal_one_intent(&store);
    assert_eq!(store.all_intents().unwrap().len(), 1);
}

/// A leader deposed by a takeover writes nothing: its store's next write
/// is refused (`Fenced`) and the rows read back as the new leader left
/// them. Without the fence the stale write would replace the new leader's
/// applied fields (the values differ on purpose).
#[test]
fn a_deposed_leaders_write_is_fenced_and_the_new_leaders_rows_stand() {
    use tend::testing::journal::StateError;
    use tend::testing::journal::{Fence, LeaseHolder};

    let pg = support::postgres::Postgres::start();
    let settings = settings(&pg, "s_fence");
    let a = StateStore::open_postgres(&settings, true).unwrap().unwrap();
    let b = StateStore::open_postgres(&settings, true).unwrap().unwrap();
    let holder = |name: &str| LeaseHolder {
        agent_id: "group".into(),
        holder: name.into(),
        host: "test".into(),
        pid: 1,
    };
    let ttl = Duration::from_millis(300);
    let hash = SpecHash::from("h");
    let fields_of = |owner: &str| BTreeMap::from([("owner".to_string(), Value::from(owner))]);

    let token_a = a.try_acquire_lease(&holder("a"), ttl).unwrap().unwrap();
    a.set_fence(Some(Fence {
        agent_id: "group".into(),
        token: token_a,
    }));
    applied("orders", &hash, &fields_of("from-a"), &a);
    assert!(
        b.try_acquire_lease(&holder("b"), ttl).unwrap().is_none(),
        "a live lease is not taken over"
    );

    std::thread::sleep(ttl + Duration::from_millis(200));
    let token_b = b.try_acquire_lease(&holder("b"), ttl).unwrap().unwrap();
    assert!(token_b > token_a, "a takeover raises the token");
    b.set_fence(Some(Fence {
        agent_id: "group".into(),
        token: token_b,
    }));
    applied("orders", &hash, &fields_of("from-b"), &b);

    // A, paused through the takeover, wakes and writes what it had decided.
    let stale = Applied {
        provider: "p",
        database_name: "orders",
        file: "f.yaml",
        manifest: &Value::Null,
        spec_hash: &hash,
        fields: &fields_of("stale-from-a"),
        commit: None,
        external_id: "id",
    };
    let refused = a
        .write(|tx| tx.record_applied("orders", &stale, SystemTime::now()))
        .unwrap_err();
    assert!(
        matches!(&refused, StateError::Fenced { token, .. } if *token == token_a),
        "{refused:?}"
    );
    assert!(a.was_fenced());
    assert!(
        !a.renew_lease(&holder("a"), token_a, ttl).unwrap(),
        "the deposed leader cannot renew"
    );
    let read = b.applied_fields(&["orders".into()]).unwrap();
    assert_eq!(
        read[0].2.as_ref().unwrap(),
        &fields_of("from-b"),
        "the new leader's values stand"
    );
    let lease = b.lease("group").unwrap().unwrap();
    assert_eq!((lease.holder.as_str(), lease.token), ("b", token_b));
}

/// The PostgreSQL session's guarantee: a transaction never spans two
/// connections. The connection is cut between two statements of one
/// write: the statements after the cut fail (never run on a new
/// connection in autocommit), nothing of the write is committed, and the
/// next write reconnects.
#[test]
fn a_connection_lost_inside_a_postgres_transaction_commits_nothing_of_it() {
    let pg = support::postgres::Postgres::start();
    let proxy = support::pgproxy::PgProxy::start(pg.port);
    let settings = PgStateSettings {
        url: format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            proxy.port
        ),
        ..settings(&pg, "cut")
    };
    let store = StateStore::open_postgres(&settings, true).unwrap().unwrap();
    let manifest = serde_json::json!({});
    let written: Result<(), _> = store.write(|tx| {
        tx.add_tombstone("first", &manifest, SystemTime::now(), "c1")?;
        proxy.sever();
        proxy.heal();
        // Long enough for the session to see the connection closed: the
        // next statement would find a fresh connection, and must not
        // take it.
        std::thread::sleep(Duration::from_millis(300));
        tx.add_tombstone("second", &manifest, SystemTime::now(), "c1")?;
        Ok(())
    });
    assert!(written.is_err(), "the write after the cut must fail");
    assert_eq!(
        pg.psql("SELECT count(*) FROM cut.tombstones"),
        "0",
        "half a transaction is never committed"
    );
    journal_one_intent(&store);
    assert_eq!(
        store.all_intents().unwrap().len(),
        1,
        "the next write reconnects"
    );
}

/// Journals one intent (the store takes writes).
fn journal_one_intent(store: &StateStore) {
    store
        .begin_intent(
            "op",
            "a",
            "create",
            &SpecHash::from("h"),
            0,
            &Value::Null,
            SystemTime::now(),
        )
        .unwrap();
}
