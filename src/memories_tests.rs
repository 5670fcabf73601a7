use super::*;
use crate::journal::effects::{Effect, commit};

type Outcome = Result<(), Box<dyn std::error::Error>>;

#[test]
fn a_read_not_the_store_s_last_is_not_brought_up_to_date() -> Outcome {
    let dir = tempfile::tempdir()?;
    let (store, cache) = retaining(&dir)?;
    for name in ["orders", "payments"] {
        applied(&store, name)?;
    }
    let first = cache.current(&store)?;
    // Another read at the same freshness takes the notes after it.
    store.read_memories()?;
    let now = std::time::SystemTime::now();
    store.write(|tx| tx.sync_drift("orders", &["owner".into()], now))?;
    let after = cache.current(&store)?;
    assert!(
        !Arc::ptr_eq(&first.memories["payments"], &after.memories["payments"]),
        "brought up to date from a read that was not the last"
    );
    assert!(
        after.memories["orders"]
            .drift_first_seen
            .contains_key("owner")
    );
    Ok(())
}

fn store(dir: &tempfile::TempDir) -> Result<StateStore, Box<dyn std::error::Error>> {
    StateStore::open(dir.path(), true)?.ok_or_else(|| "no state store was made".into())
}

/// A state store in `dir`, and a cache that keeps its reads (as the
/// running agent's does).
fn retaining(
    dir: &tempfile::TempDir,
) -> Result<(StateStore, MemoryCache), Box<dyn std::error::Error>> {
    let cache = MemoryCache::default();
    cache.retain();
    Ok((store(dir)?, cache))
}

#[test]
fn a_retaining_cache_shares_one_read_until_the_state_is_written() -> Outcome {
    let dir = tempfile::tempdir()?;
    let (store, cache) = retaining(&dir)?;
    let first = cache.current(&store)?;
    let again = cache.current(&store)?;
    assert!(
        Arc::ptr_eq(&first, &again),
        "read twice with nothing written"
    );
    commit(
        &store,
        &[Effect::RemoveTombstone {
            name: "orders".into(),
        }],
    )?;
    let after = cache.current(&store)?;
    assert!(!Arc::ptr_eq(&first, &after), "a stale read was reused");
    Ok(())
}

#[test]
fn a_status_commit_s_writes_leave_the_memories_read_in_use() -> Outcome {
    let dir = tempfile::tempdir()?;
    let (store, cache) = retaining(&dir)?;
    let first = cache.current(&store)?;
    let decided: crate::journal::DecidedFrom = [(
        "orders".to_string(),
        crate::journal::DecidedAt {
            digest: [7; 32],
            commit: "c0ffee".into(),
        },
    )]
    .into();
    let changes: Vec<_> = decided
        .iter()
        .map(|(n, v)| (n.clone(), Some(v.clone())))
        .collect();
    store.record_status_decided(&changes)?;
    store.record_notifications(&Default::default(), &[], &[], std::time::SystemTime::now())?;
    assert_eq!(store.status_decided()?, decided, "written");
    let again = cache.current(&store)?;
    assert!(
        Arc::ptr_eq(&first, &again),
        "the status commit's writes made every memory be read again"
    );
    Ok(())
}

/// A resource applied, as a confirmed create records it.
#[test]
fn memories_read_share_each_commit_and_provider() -> Outcome {
    let dir = tempfile::tempdir()?;
    let (store, cache) = retaining(&dir)?;
    for name in ["orders", "payments"] {
        applied(&store, name)?;
    }
    let read = cache.current(&store)?;
    let (orders, payments) = (&read.memories["orders"], &read.memories["payments"]);
    assert_eq!(orders.applied_commit.as_deref(), Some("c0ffee"));
    assert_eq!(orders.provider.as_deref(), Some("sandbox"));
    let shared = |a: &Option<Arc<str>>, b: &Option<Arc<str>>| match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    };
    assert!(shared(&orders.applied_commit, &payments.applied_commit));
    assert!(shared(&orders.provider, &payments.provider));
    Ok(())
}

fn applied(store: &StateStore, name: &str) -> Result<(), StateError> {
    let (manifest, fields) = (serde_json::json!({}), BTreeMap::new());
    let hash = SpecHash::from("spec-1");
    let applied = crate::journal::Applied {
        provider: "sandbox",
        database_name: name,
        file: "fleet.yaml",
        manifest: &manifest,
        spec_hash: &hash,
        fields: &fields,
        commit: Some("c0ffee"),
        external_id: name,
    };
    store.write(|tx| tx.record_applied(name, &applied, std::time::SystemTime::now()))
}

/// A snapshot declaring `names`.
fn declaring(names: &[&str]) -> Snapshot {
    let files = names.iter().map(|name| {
        let text = format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  owner: app\n"
        );
        crate::model::parse_file(std::path::Path::new(&format!("{name}.yaml")), text.as_bytes())
    });
    Snapshot {
        commit: "c0ffee".into(),
        commit_time: std::time::SystemTime::UNIX_EPOCH,
        files: Vec::new(),
        declarations: crate::model::DeclarationSet::from_files(files.collect()),
        provider_groups: Default::default(),
    }
}

/// A new snapshot's facts are derived over the last one's from the
/// names declared differently alone (a declaration carried over is
/// the same `Arc`), and are what deriving them whole gives.
#[test]
fn a_new_snapshot_s_facts_are_derived_from_the_declarations_that_changed() -> Outcome {
    let dir = tempfile::tempdir()?;
    let (store, cache) = retaining(&dir)?;
    for name in ["billing", "ledger", "orders", "payments"] {
        applied(&store, name)?;
    }
    let read = cache.current(&store)?;
    let before = Arc::new(declaring(&["accounts", "orders", "payments"]));
    let first = read.derived(&before);
    assert_eq!(first.undeclared, ["billing", "ledger"]);
    // The next commit: `orders` removed, `ledger` declared as applied,
    // `accounts` and `payments` carried over.
    let mut now = (*before).clone();
    now.provider_groups = Default::default();
    let list = &mut now.declarations.declarations;
    list.retain(|d| d.name() != "orders");
    let mut ledger = (*declaring(&["ledger"]).declarations.declarations[0]).clone();
    ledger.spec_hash = SpecHash::from("spec-1");
    list.insert(1, Arc::new(ledger));
    let now = Arc::new(now);
    assert_eq!(
        declared_differently(&before, &now),
        Some(vec!["ledger", "orders"])
    );
    let derived = read.derived(&now);
    let whole = SharedMemories::new(store.read_memories()?).derived(&now);
    assert_eq!(
        (&derived.undeclared, &derived.changed),
        (&whole.undeclared, &whole.changed)
    );
    assert_eq!(derived.undeclared, ["billing", "orders"]);
    assert_eq!(derived.changed, ["billing", "orders", "payments"]);
    // A whole new fleet is derived again whole.
    let names: Vec<String> = (0..20).map(|i| format!("db-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let other = Arc::new(declaring(&names));
    assert_eq!(declared_differently(&now, &other), None);
    Ok(())
}

/// Each memory of `read`, as a whole read returns them (compared by
/// value: `Arc`'s equality is its content's).
fn held(read: &SharedMemories) -> HashMap<String, Arc<Memory>> {
    read.memories.clone()
}

#[test]
fn after_its_own_writes_the_agent_reads_again_only_the_rows_they_changed() -> Outcome {
    let dir = tempfile::tempdir()?;
    let (store, cache) = retaining(&dir)?;
    for name in ["billing", "ledger", "orders", "payments"] {
        applied(&store, name)?;
    }
    let first = cache.current(&store)?;
    // Declared: `orders`, `payments` and `accounts` (each spec changed
    // since its apply); `billing` and `ledger` left Git.
    let snapshot = Arc::new(declaring(&["accounts", "orders", "payments"]));
    let derived = first.derived(&snapshot);
    assert_eq!(derived.undeclared, ["billing", "ledger"]);
    let now = std::time::SystemTime::now();
    // A change of each table a memory is read from; `payments` is left.
    store.write(|tx| {
        tx.sync_drift("orders", &["owner".into()], now)?;
        let different = ("owner".into(), "app".into(), "ops".into());
        tx.record_attempts("orders", &[different])?;
        let failure = crate::engine::OperationFailure {
            operation_id: "op-1".into(),
            kind: "update".into(),
            spec_hash: SpecHash::from("spec-1"),
            observed: "seen".into(),
            message: "refused".into(),
            at: now,
        };
        tx.record_failure("ledger", &failure)?;
        tx.forget("billing")
    })?;
    let request = serde_json::json!({});
    let spec = SpecHash::from("spec-2");
    store.begin_intent("op-2", "ledger", "update", &spec, 1, &request, now)?;
    applied(&store, "accounts")?;
    // An upsert over a row noted already (its conflict policy is the
    // notes' too).
    applied(&store, "accounts")?;
    let after = cache.current(&store)?;
    // What another connection reads whole.
    let reader = StateStore::open(dir.path(), false)?.ok_or("no state")?;
    assert_eq!(held(&after), reader.read_memories()?.memories);
    assert!(
        after
            .memories
            .get("orders")
            .is_some_and(|m| m.drift_first_seen.len() == 1)
    );
    assert!(
        after
            .memories
            .get("ledger")
            .is_some_and(|m| m.unconfirmed_write)
    );
    assert!(!after.memories.contains_key("billing"));
    assert_eq!(after.existed, 4);
    // What was derived over the snapshot is brought up to date, not
    // derived again, and is what a whole read derives.
    let carried = after.derived.lock().map_err(|_| "poisoned")?.is_some();
    assert!(carried, "derived again over every memory");
    let whole = SharedMemories::new(reader.read_memories()?).derived(&snapshot);
    let derived = after.derived(&snapshot);
    assert_eq!(
        (&derived.undeclared, &derived.changed),
        (&whole.undeclared, &whole.changed)
    );
    assert_eq!(derived.undeclared, ["ledger"]);
    assert_eq!(
        derived.changed,
        ["accounts", "ledger", "orders", "payments"]
    );
    // Read again from the rows changed alone: the unchanged memory is
    // the one read before.
    let unchanged = |a: &SharedMemories, b: &SharedMemories| {
        Arc::ptr_eq(&a.memories["payments"], &b.memories["payments"])
    };
    assert!(unchanged(&first, &after), "every memory was read again");
    // Another connection's write is not noted here: read whole.
    let other = self::store(&dir)?;
    other.write(|tx| tx.sync_drift("payments", &["owner".into()], now))?;
    let whole = cache.current(&store)?;
    assert!(
        !unchanged(&after, &whole),
        "another writer's change was missed"
    );
    assert_eq!(held(&whole), reader.read_memories()?.memories);
    Ok(())
}

#[test]
fn a_one_shot_cache_hands_its_read_ahead_to_one_cycle_alone() -> Outcome {
    let dir = tempfile::tempdir()?;
    let store = store(&dir)?;
    let cache = MemoryCache::default();
    cache.read_ahead(&store)?;
    let first = cache.current(&store)?;
    // Nothing else holds it: the cycle moves the memories out.
    assert_eq!(Arc::strong_count(&first), 1);
    let second = cache.current(&store)?;
    assert!(!Arc::ptr_eq(&first, &second));
    Ok(())
}

/// A whole cycle over a shared read takes each memory by its declaration's
/// position: the memory the name has, for each snapshot it is aligned with.
#[test]
fn a_whole_cycle_takes_each_memory_by_its_declaration_s_position() -> Outcome {
    let dir = tempfile::tempdir()?;
    let (store, cache) = retaining(&dir)?;
    for name in ["billing", "orders"] {
        applied(&store, name)?;
    }
    let read = cache.current(&store)?;
    for names in [
        &["accounts", "billing", "orders"][..],
        &["billing", "ledger", "orders"],
        &["orders"],
    ] {
        let snapshot = Arc::new(declaring(names));
        let mut memories = Memories::over(read.clone());
        memories.align(&snapshot);
        assert!(memories.aligned.is_some(), "a shared read was not aligned");
        for (at, name) in names.iter().enumerate() {
            let taken = memories.take(name, Some(at));
            match read.memories.get(*name) {
                Some(memory) => assert!(Arc::ptr_eq(&taken, memory), "{name} in {names:?}"),
                None => assert_eq!(*taken, Memory::default(), "{name} in {names:?}"),
            }
        }
    }
    // A read the cycle holds alone is not aligned: its memories are moved
    // out by name.
    drop(cache);
    let orders = read.memories["orders"].clone();
    let mut memories = Memories::over(read);
    let snapshot = Arc::new(declaring(&["billing", "orders"]));
    memories.align(&snapshot);
    assert!(memories.aligned.is_none());
    assert!(Arc::ptr_eq(&memories.take("orders", Some(1)), &orders));
    Ok(())
}

/// A position that is not the name's in the aligned snapshot is a bug of
/// the caller: debug builds (every test) stop on it.
#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "a position of another snapshot")]
fn a_position_of_another_snapshot_is_refused_in_debug_builds() {
    let dir = tempfile::tempdir().expect("a directory");
    let (store, cache) = retaining(&dir).expect("a store");
    applied(&store, "orders").expect("applied");
    let read = cache.current(&store).expect("a read");
    let mut memories = Memories::over(read);
    memories.align(&Arc::new(declaring(&["accounts", "orders"])));
    memories.take("orders", Some(0));
}
