//! Tests of the sandbox provider.

use super::*;
use crate::model::SpecHash;
use crate::provider::{OWNER_AGENT_LABEL, OperationKind};
use std::fs;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn request(limit: i64) -> ChangeRequest {
    ChangeRequest {
        database_name: "orders".into(),
        fields: BTreeMap::from([("connectionLimit".to_string(), Value::from(limit))]),
        labels: BTreeMap::from([(OWNER_AGENT_LABEL.to_string(), "a".to_string())]),
    }
}

#[test]
fn a_lost_create_response_retried_with_the_same_key_creates_one_database() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultConfig {
        lose_responses: 1,
        ..FaultConfig::default()
    };
    let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, faults);
    let op = OperationId::derive("a", "orders", OperationKind::Create, &SpecHash::from("h"));
    rt().block_on(async {
        assert!(
            sandbox
                .create(&op, &request(5))
                .await
                .unwrap_err()
                .is_transient()
        );
        let obs = sandbox.create(&op, &request(5)).await.unwrap();
        assert_eq!(obs.fields["connectionLimit"], Value::from(5));
        let other = OperationId("other".into());
        assert!(matches!(
            sandbox.create(&other, &request(5)).await,
            Err(ProviderError::Conflict { .. })
        ));
        assert!(matches!(
            sandbox.create(&op, &request(6)).await,
            Err(ProviderError::Permanent { .. })
        ));
    });
    let state = sandbox.load().unwrap();
    assert_eq!(state.databases.len(), 1);
    assert_eq!(state.key_uses(&op.0), 2);
}

#[test]
fn a_sandbox_in_the_old_file_layout_is_imported_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sandbox").join("s");
    fs::create_dir_all(root.join("databases")).unwrap();
    fs::create_dir_all(root.join("operations")).unwrap();
    fs::write(
        root.join("databases").join("6f7264657273.json"),
        r#"{"name": "orders", "id": "sbx-1", "fields": {"connectionLimit": 5},
            "labels": {"tend.dev/owner-agent": "a"}, "created_at": 1, "ready_at": 1}"#,
    )
    .unwrap();
    fs::write(
        root.join("operations").join("abc123.json"),
        r#"{"request_digest": "d", "database_name": "orders", "kind": "create", "uses": 2}"#,
    )
    .unwrap();
    let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
    let state = sandbox.load().unwrap();
    assert_eq!(
        state.databases["orders"].fields["connectionLimit"],
        Value::from(5)
    );
    assert_eq!(state.key_uses("abc123"), 2);
    assert!(!root.join("databases").exists());
    assert!(root.join("databases.imported").exists(), "kept, renamed");
    // A second open does not import again (nor fail on the renamed dirs).
    let again = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
    assert_eq!(again.load().unwrap(), state);
}

#[test]
fn a_corrupt_file_is_named_and_keeps_the_json_error_as_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sandbox").join("s");
    fs::create_dir_all(root.join("databases")).unwrap();
    let file = root.join("databases").join("6f7264657273.json");
    fs::write(&file, "{not json").unwrap();
    let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
    let error = sandbox.load().unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with(&format!("sandbox state {} is corrupt: ", file.display()))
            && message.ends_with("; move it away to start an empty sandbox"),
        "{message}"
    );
    let cause = std::error::Error::source(&error).expect("a cause");
    let json = std::error::Error::source(cause).expect("the underlying error");
    assert!(json.is::<serde_json::Error>(), "{json:?}");
    assert!(file.exists(), "a corrupt file is left where it was");
}

#[test]
fn stale_reads_show_the_state_before_a_recent_write() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultConfig {
        stale_reads: Duration::from_secs(3600),
        ..FaultConfig::default()
    };
    let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, faults);
    let create = OperationId("c".into());
    let update = OperationId("u".into());
    rt().block_on(async {
        sandbox.create(&create, &request(5)).await.unwrap();
        assert_eq!(
            sandbox.observe("orders").await.unwrap(),
            None,
            "a new database is not visible yet"
        );
        sandbox.update(&update, &request(9)).await.unwrap();
        let stale = sandbox.observe("orders").await.unwrap().unwrap();
        assert_eq!(stale.fields["connectionLimit"], Value::from(5));
        assert!(stale.observed_at < SystemTime::now() - Duration::from_secs(3000));
    });
    let fresh = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
    let obs = rt().block_on(fresh.observe("orders")).unwrap().unwrap();
    assert_eq!(obs.fields["connectionLimit"], Value::from(9));
}

#[test]
fn rate_limits_and_failures_are_injected_before_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultConfig {
        rate_limit_calls: 1,
        fail_calls: 1,
        retry_after: Duration::from_secs(2),
        ..FaultConfig::default()
    };
    let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, faults);
    rt().block_on(async {
        assert!(matches!(
            sandbox.observe("x").await,
            Err(ProviderError::RateLimited { retry_after, .. }) if retry_after == Duration::from_secs(2)
        ));
        assert!(matches!(sandbox.observe("x").await, Err(ProviderError::Retryable { .. })));
        assert_eq!(sandbox.observe("x").await.unwrap(), None);
    });
}

#[test]
fn the_call_log_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
    let line = "x".repeat(200);
    for _ in 0..12_000 {
        sandbox.log_call("observe", &line, "ok");
    }
    let size = |f: &str| {
        fs::metadata(sandbox.dir.join(f))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    assert!(size("calls.log") < super::faults::CALL_LOG_BYTES + 1024);
    assert!(size("calls.log.1") > 0, "rotated");
    assert!(size("calls.log") + size("calls.log.1") < 2 * super::faults::CALL_LOG_BYTES + 2048);
    // The newest calls are still read.
    assert!(!sandbox.calls().is_empty());
}

#[test]
fn a_create_whose_key_cannot_be_recorded_leaves_no_database()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let faults = FaultConfig {
        names_not_unique: true,
        ..FaultConfig::default()
    };
    let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, faults);
    let op = OperationId::derive("a", "orders", OperationKind::Create, &SpecHash::from("h"));
    let rt = rt();
    // The schema exists once the sandbox was read; then every key write
    // fails, as a process killed between the two writes would leave it.
    assert!(rt.block_on(sandbox.observe("orders"))?.is_none());
    let db = rusqlite::Connection::open(sandbox.db_path())?;
    db.execute_batch(
        "CREATE TRIGGER no_keys BEFORE INSERT ON operations BEGIN SELECT RAISE(ABORT, 'injected'); END;",
    )?;
    assert!(rt.block_on(sandbox.create(&op, &request(5))).is_err());
    assert!(
        sandbox.load()?.databases.is_empty(),
        "no database without its key"
    );
    // The replay under the same key, once keys are written again, makes
    // one database, not `orders~1` beside a stray `orders`.
    db.execute_batch("DROP TRIGGER no_keys;")?;
    rt.block_on(sandbox.create(&op, &request(5)))?;
    rt.block_on(sandbox.create(&op, &request(5)))?;
    let names: Vec<String> = sandbox.load()?.databases.keys().cloned().collect();
    assert_eq!(names, ["orders"]);
    Ok(())
}

#[test]
fn a_row_that_does_not_decode_is_named_and_fails_the_listing() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
    rt().block_on(async {
        sandbox
            .create(&OperationId("c".into()), &request(5))
            .await
            .unwrap();
    });
    let name = sandbox.databases().unwrap()[0].0.clone();
    rusqlite::Connection::open(sandbox.db_path())
        .unwrap()
        .execute(
            "UPDATE databases SET body = '{not json' WHERE name = ?1",
            [&name],
        )
        .unwrap();
    let error = sandbox.databases().unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("is corrupt") && message.contains(&format!("database `{name}`")),
        "{message}"
    );
    let cause = std::error::Error::source(&error).expect("a cause");
    let json = std::error::Error::source(cause).expect("the underlying error");
    assert!(json.is::<serde_json::Error>(), "{json:?}");
}

/// The listing is in name order (byte order, as SQLite's own), whatever
/// order the rows were stored in.
#[test]
fn the_listing_is_in_name_order_whatever_the_order_of_creation()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let sandbox = SandboxProvider::new("s", dir.path(), Duration::ZERO, FaultConfig::default());
    let names = ["orders", "Billing", "billing", "ledger-10", "ledger-9", "a"];
    rt().block_on(async {
        for (i, name) in names.iter().enumerate() {
            let mut request = request(5);
            request.database_name = name.to_string();
            sandbox
                .create(&OperationId(format!("c-{i}")), &request)
                .await?;
        }
        Ok::<_, ProviderError>(())
    })?;
    let listed: Vec<String> = sandbox.databases()?.into_iter().map(|(n, _)| n).collect();
    let by_sqlite: Vec<String> = rusqlite::Connection::open(sandbox.db_path())?
        .prepare("SELECT name FROM databases ORDER BY name")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut sorted: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    sorted.sort();
    assert_eq!(listed.len(), names.len(), "{listed:?}");
    assert_eq!(listed, sorted);
    assert_eq!(listed, by_sqlite);
    Ok(())
}
