//! The PostgreSQL provider against a real cluster started by the harness.

use crate::support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::TendCommand;
use support::git::{TestRepo, manifest};
use support::postgres::Postgres;

struct Env {
    pg: Postgres,
    repo: TestRepo,
    dir: tempfile::TempDir,
}

const ORDERS: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: orders
spec:
  owner: orders_app
  encoding: UTF8
  connectionLimit: 50
  allowConnections: true
  comment: Orders and carts
  parameters:
    work_mem: 64MB
    statement_timeout: 30s
  extensions:
    - pg_trgm
    - name: citext
";

impl Env {
    fn new(files: &[(&str, &str)]) -> Self {
        let pg = Postgres::start();
        let repo = TestRepo::new();
        for (file, text) in files {
            repo.write(file, text);
        }
        repo.commit("declarations");
        let env = Env {
            pg,
            repo,
            dir: tempfile::tempdir().unwrap(),
        };
        env.configure("");
        env
    }

    fn configure(&self, provider_extra: &str) {
        std::fs::write(
            self.config(),
            format!(
                "agent_id = \"pg-agent\"\nstate_dir = \"state\"\n[source]\nurl = \"{}\"\n[reconcile]\ndrift_grace = \"2s\"\ndeletion_delay = \"0s\"\nretry_min_delay = \"50ms\"\nmax_retries = 2\nconfirm_timeout = \"5s\"\n[providers.main]\nkind = \"postgres\"\nurl = \"{}\"\ncreate_owner = true\n{provider_extra}\n",
                self.repo.url(),
                self.pg.url()
            ),
        )
        .unwrap();
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("tend.toml")
    }

    fn tend(&self, args: &[&str], code: i32) -> support::RunOutput {
        let config = self.config().display().to_string();
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        TendCommand::new(&all)
            .env("TEND_LOG", "warn")
            .expect_code(code)
    }

    fn plan(&self, code: i32) -> Value {
        serde_json::from_str(
            &self
                .tend(&["plan", "--format", "json", "--detailed-exitcode"], code)
                .stdout,
        )
        .unwrap()
    }

    fn commit(&self, file: &str, text: &str) {
        self.repo.write(file, text);
        self.repo.commit("change");
    }

    fn q(&self, sql: &str) -> String {
        self.pg.psql(sql)
    }

    /// Waits until a session is connected to `database`.
    fn wait_for_a_session_on(&self, database: &str) {
        let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{database}'");
        support::eventually(
            &format!("a session connected to {database}"),
            Duration::from_secs(20),
            || support::holds(self.q(&sql) != "0"),
            String::new,
        );
    }
}

fn resource<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no resource {name} in {report}"))
}

#[test]
fn creates_a_real_database_and_applies_every_mutable_field_change() {
    let env = Env::new(&[("orders.yaml", ORDERS)]);
    env.tend(&["apply"], 0);
    assert_eq!(
        env.q("SELECT datname, pg_get_userbyid(datdba), datconnlimit, datallowconn FROM pg_database WHERE datname = 'orders'"),
        "orders|orders_app|50|t"
    );
    assert_eq!(
        env.q(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = 'orders'"
        ),
        "Orders and carts"
    );
    let settings = env.q("SELECT array_to_string(setconfig, ',') FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE datname = 'orders'");
    assert!(
        settings.contains("work_mem=64MB") && settings.contains("statement_timeout=30s"),
        "{settings}"
    );
    assert_eq!(env.pg.psql_in("orders", "SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension WHERE extname <> 'plpgsql'"), "citext,pg_trgm");
    assert_eq!(env.q("SELECT agent_id || '/' || declaration FROM tend.databases WHERE database_name = 'orders'"), "pg-agent/orders");
    assert_eq!(resource(&env.plan(0), "orders")["state"], "InSync");

    // Every mutable field changed in Git is applied; a removed parameter is reset.
    let changed = ORDERS
        .replace("owner: orders_app", "owner: orders_owner")
        .replace("connectionLimit: 50", "connectionLimit: 75")
        .replace(
            "comment: Orders and carts",
            "comment: \"It's orders; \\\"quoted\\\"\"",
        )
        .replace("    statement_timeout: 30s\n", "")
        .replace("work_mem: 64MB", "work_mem: 128MB")
        .replace(
            "    - name: citext\n",
            "    - name: citext\n    - name: pgcrypto\n      schema: public\n",
        );
    env.commit("orders.yaml", &changed);
    env.tend(&["apply"], 0);
    assert_eq!(
        env.q("SELECT pg_get_userbyid(datdba), datconnlimit, shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = 'orders'"),
        "orders_owner|75|It's orders; \"quoted\""
    );
    let settings = env.q("SELECT array_to_string(setconfig, ',') FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE datname = 'orders'");
    assert_eq!(settings, "work_mem=128MB");
    assert_eq!(
        env.pg.psql_in("orders", "SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension WHERE extname <> 'plpgsql'"),
        "citext,pg_trgm,pgcrypto"
    );
    assert_eq!(resource(&env.plan(0), "orders")["state"], "InSync");

    // allowConnections is applied too (and extensions are then not observed).
    env.commit(
        "orders.yaml",
        &changed.replace("allowConnections: true", "allowConnections: false"),
    );
    env.tend(&["apply"], 0);
    assert_eq!(
        env.q("SELECT datallowconn FROM pg_database WHERE datname = 'orders'"),
        "f"
    );
}

#[test]
fn the_examples_are_created_except_the_dbaas_one_which_is_an_error() {
    let root = support::repo_root().join("examples/databases");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        files.push((
            path.file_name().unwrap().to_string_lossy().into_owned(),
            std::fs::read_to_string(&path).unwrap(),
        ));
    }
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(f, t)| (f.as_str(), t.as_str()))
        .collect();
    let env = Env::new(&refs);
    let run = env.tend(&["apply"], 1);
    assert!(run.stdout.contains("DBaaS-only"), "{}", run.stdout);
    assert_eq!(
        env.q("SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database WHERE datname NOT IN ('postgres', 'template0', 'template1')"),
        "billing,identity,loadtest_scratch,orders,sessions",
        "what the apply said:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(env.pg.psql_in("orders", "SELECT string_agg(extname || '@' || extnamespace::regnamespace, ',' ORDER BY extname) FROM pg_extension WHERE extname <> 'plpgsql'"), "pg_trgm@public,pgcrypto@public");
}

#[test]
fn a_database_dropped_behind_tends_back_is_reported_and_recreated_after_grace() {
    let env = Env::new(&[("orders.yaml", ORDERS)]);
    env.tend(&["apply"], 0);
    env.q("DROP DATABASE orders");
    let run = env.tend(&["apply", "--format", "json"], 2);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let r = resource(&report, "orders");
    assert_eq!(
        (r["state"].as_str(), r["action"].as_str()),
        (Some("Missing"), Some("Hold"))
    );
    assert_eq!(r["drift"][0]["origin"], "out-of-band");
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'orders'"),
        "0",
        "not recreated during grace"
    );
    std::thread::sleep(Duration::from_millis(2100));
    env.tend(&["apply"], 0);
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'orders'"),
        "1"
    );
    assert_eq!(
        env.q("SELECT datconnlimit FROM pg_database WHERE datname = 'orders'"),
        "50"
    );
}

#[test]
fn out_of_band_drift_is_held_during_grace_then_corrected_unless_ignored_or_paused() {
    let env = Env::new(&[("orders.yaml", ORDERS)]);
    env.tend(&["apply"], 0);
    env.q("ALTER DATABASE orders CONNECTION LIMIT 500");
    let run = env.tend(&["apply", "--format", "json"], 2);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let r = resource(&report, "orders");
    assert_eq!(r["action"], "Hold");
    assert_eq!(r["drift"][0]["origin"], "out-of-band");
    assert_eq!(
        env.q("SELECT datconnlimit FROM pg_database WHERE datname = 'orders'"),
        "500",
        "held during grace"
    );
    std::thread::sleep(Duration::from_millis(2100));
    env.tend(&["apply"], 0);
    assert_eq!(
        env.q("SELECT datconnlimit FROM pg_database WHERE datname = 'orders'"),
        "50",
        "corrected after grace"
    );

    // With ignore-fields: left alone however long it lasts.
    let ignored = ORDERS.replace(
        "  name: orders\n",
        "  name: orders\n  annotations:\n    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: INC-9\n",
    );
    env.commit("orders.yaml", &ignored);
    env.q("ALTER DATABASE orders CONNECTION LIMIT 400");
    env.tend(&["apply"], 2);
    std::thread::sleep(Duration::from_millis(2100));
    env.tend(&["apply"], 2);
    assert_eq!(
        env.q("SELECT datconnlimit FROM pg_database WHERE datname = 'orders'"),
        "400"
    );

    // Paused: nothing changes, not even a declared change.
    let paused = ORDERS
        .replace("  name: orders\n", "  name: orders\n  annotations:\n    tend.dev/paused: \"true\"\n    tend.dev/override-reason: INC-10\n")
        .replace("comment: Orders and carts", "comment: changed while paused");
    env.commit("orders.yaml", &paused);
    std::thread::sleep(Duration::from_millis(2100));
    env.tend(&["apply"], 2);
    assert_eq!(
        env.q("SELECT datconnlimit FROM pg_database WHERE datname = 'orders'"),
        "400"
    );
    assert_eq!(
        env.q(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = 'orders'"
        ),
        "Orders and carts"
    );
}

#[test]
fn an_immutable_change_is_blocked_and_a_foreign_database_is_untouched() {
    let env = Env::new(&[("orders.yaml", ORDERS)]);
    env.tend(&["apply"], 0);
    env.commit(
        "orders.yaml",
        &ORDERS.replace("encoding: UTF8", "encoding: SQL_ASCII"),
    );
    let report = env.plan(2);
    let r = resource(&report, "orders");
    assert_eq!(r["state"], "Blocked");
    assert!(
        r["reason"]
            .as_str()
            .unwrap()
            .contains("requires replacement")
    );

    env.q("CREATE DATABASE billing CONNECTION LIMIT 3");
    env.commit("billing.yaml", "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: billing\nspec:\n  connectionLimit: 10\n");
    let run = env.tend(&["apply", "--format", "json"], 2);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(resource(&report, "billing")["state"], "Blocked");
    assert_eq!(
        env.q("SELECT datconnlimit FROM pg_database WHERE datname = 'billing'"),
        "3",
        "not touched"
    );
    assert_eq!(
        env.q("SELECT count(*) FROM tend.databases WHERE database_name = 'billing'"),
        "0"
    );

    // Adopting it takes ownership, then manages it.
    env.commit(
        "billing.yaml",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: billing\n  annotations:\n    tend.dev/adopt: \"true\"\nspec:\n  connectionLimit: 10\n",
    );
    env.tend(&["apply"], 2);
    assert_eq!(
        env.q("SELECT agent_id FROM tend.databases WHERE database_name = 'billing'"),
        "pg-agent"
    );
}

#[test]
fn hostile_names_and_values_are_quoted_never_interpolated() {
    let names = [
        ("mixed", "Mixed Case"),
        ("quotes", "with \\\"quotes\\\""),
        ("injection", "x'); DROP DATABASE postgres; --"),
        ("unicode", "ünïcødé ✓"),
    ];
    let mut files = Vec::new();
    for (name, db) in names {
        files.push((
            format!("{name}.yaml"),
            format!(
                "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  databaseName: \"{db}\"\n  owner: \"Role \\\"{name}\\\"; DROP ROLE postgres\"\n  comment: \"'); DROP DATABASE postgres; --\"\n  parameters:\n    application_name: \"x'); DROP TABLE y; --\"\n"
            ),
        ));
    }
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(f, t)| (f.as_str(), t.as_str()))
        .collect();
    let env = Env::new(&refs);
    env.tend(&["apply"], 0);
    let listed = env.q("SELECT string_agg(datname, '|' ORDER BY datname) FROM pg_database WHERE datname NOT IN ('postgres', 'template0', 'template1')");
    assert_eq!(
        listed,
        "Mixed Case|with \"quotes\"|x'); DROP DATABASE postgres; --|ünïcødé ✓"
    );
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'postgres'"),
        "1"
    );
    assert_eq!(
        env.q("SELECT count(*) FROM pg_roles WHERE rolname = 'postgres'"),
        "1"
    );
    assert_eq!(
        env.q("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = 'Mixed Case'"),
        "'); DROP DATABASE postgres; --"
    );
    assert_eq!(
        env.q("SELECT array_to_string(setconfig, ',') FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE datname = 'Mixed Case'"),
        "application_name=x'); DROP TABLE y; --"
    );
    assert_eq!(
        env.q("SELECT count(*) FROM pg_roles WHERE rolname = 'Role \"mixed\"; DROP ROLE postgres'"),
        "1"
    );
    assert_eq!(resource(&env.plan(0), "injection")["state"], "InSync");
}

/// tend's journal rows of `name`: (operation id, kind, state, calls sent).
fn journal(env: &Env, name: &str) -> Vec<(String, String, String, i64)> {
    let db = rusqlite::Connection::open(env.dir.path().join("state/state.db")).unwrap();
    let mut stmt = db
        .prepare(
            "SELECT op_id, kind, state, attempts FROM intents WHERE name = ?1 ORDER BY created_ms",
        )
        .unwrap();
    stmt.query_map([name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The provider connects through a proxy that loses the response of the
/// armed statement after PostgreSQL committed it.
fn through_proxy(env: &Env) -> support::pgproxy::PgProxy {
    let proxy = support::pgproxy::PgProxy::start(env.pg.port);
    std::fs::write(
        env.config(),
        format!(
            "agent_id = \"pg-agent\"\nstate_dir = \"state\"\n[source]\nurl = \"{}\"\n[reconcile]\ndrift_grace = \"2s\"\ndeletion_delay = \"0s\"\nmax_deletion_percent = 100\nretry_min_delay = \"50ms\"\nmax_retries = 3\nconfirm_timeout = \"5s\"\n[providers.main]\nkind = \"postgres\"\nurl = \"postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable\"\ncreate_owner = true\n",
            env.repo.url(),
            proxy.port
        ),
    )
    .unwrap();
    proxy
}

/// `CREATE DATABASE` commits and its `CommandComplete` never reaches tend
/// (the connection is cut right there). The retry carries the same
/// operation id; the name reservation proves the database is tend's, so it
/// is not Blocked as "name taken" by its own database, and it converges.
/// Without the reservation the retry would meet "already exists" from a
/// database it could not tell from someone else's.
#[test]
fn a_create_whose_response_is_lost_after_commit_is_retried_with_its_id_and_converges() {
    let env = Env::new(&[("orders.yaml", ORDERS)]);
    let proxy = through_proxy(&env);
    proxy.arm("CREATE DATABASE");
    let run = env.tend(&["apply"], 0);
    assert_eq!(
        proxy.cut(),
        ["CREATE DATABASE"],
        "the fault was never injected"
    );
    let rows = journal(&env, "orders");
    assert_eq!(
        rows.len(),
        1,
        "one operation, not a second for the retry: {rows:?}"
    );
    let (op, kind, state, calls) = &rows[0];
    assert_eq!(
        (kind.as_str(), state.as_str()),
        ("create", "done"),
        "{rows:?}"
    );
    assert!(
        *calls >= 2,
        "the call was retried with the same id: {rows:?}\n{}",
        run.stderr
    );
    assert_eq!(
        env.q("SELECT operation_id FROM tend.databases WHERE database_name = 'orders'"),
        *op
    );
    let plan = env.plan(0);
    assert_eq!(resource(&plan, "orders")["state"], "InSync", "{plan:#}");
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'orders'"),
        "1"
    );
}

/// The same for `ALTER DATABASE` (an update) and `DROP DATABASE` (a
/// deletion): the lost response is retried under the same id, the
/// statement's second run changes nothing, and the resource converges.
#[test]
fn lost_responses_of_alter_and_drop_are_retried_with_their_ids() {
    let scratch = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: scratch\nspec:\n  deletionPolicy: Delete\n";
    let env = Env::new(&[("orders.yaml", ORDERS), ("scratch.yaml", scratch)]);
    env.tend(&["apply"], 0);
    let proxy = through_proxy(&env);

    proxy.arm("ALTER DATABASE");
    env.commit(
        "orders.yaml",
        &ORDERS.replace("connectionLimit: 50", "connectionLimit: 60"),
    );
    env.tend(&["apply"], 0);
    assert_eq!(proxy.cut(), ["ALTER DATABASE"]);
    let updates: Vec<_> = journal(&env, "orders")
        .into_iter()
        .filter(|r| r.1 == "update")
        .collect();
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(updates[0].2, "done");
    assert!(updates[0].3 >= 2, "{updates:?}");
    assert_eq!(
        env.q("SELECT datconnlimit FROM pg_database WHERE datname = 'orders'"),
        "60"
    );

    proxy.arm("DROP DATABASE");
    env.repo.remove("scratch.yaml");
    env.repo.commit("scratch goes");
    env.tend(&["apply"], 0);
    assert_eq!(proxy.cut(), ["ALTER DATABASE", "DROP DATABASE"]);
    let deletes: Vec<_> = journal(&env, "scratch")
        .into_iter()
        .filter(|r| r.1 == "delete")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].2, "done");
    assert!(deletes[0].3 >= 2, "{deletes:?}");
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'scratch'"),
        "0"
    );
    assert_eq!(
        env.q("SELECT count(*) FROM tend.databases WHERE database_name = 'scratch'"),
        "0"
    );
    assert_eq!(resource(&env.plan(0), "orders")["state"], "InSync");
}

#[test]
fn delete_waits_for_connections_unless_force_drop() {
    let scratch = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: scratch\nspec:\n  deletionPolicy: Delete\n";
    let env = Env::new(&[("orders.yaml", ORDERS), ("scratch.yaml", scratch)]);
    env.tend(&["apply"], 0);
    // A client holds a connection to scratch.
    let mut holder = Command::new("psql")
        .args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &env.pg.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "scratch",
            "-c",
            "SELECT pg_sleep(60)",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    env.wait_for_a_session_on("scratch");
    env.repo.remove("scratch.yaml");
    env.repo.commit("remove scratch");
    let run = env.tend(&["apply"], 2);
    assert!(run.stderr.contains("active connections"), "{}", run.stderr);
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'scratch'"),
        "1",
        "not dropped under a connection"
    );

    env.configure("force_drop = true");
    env.tend(&["apply"], 0);
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'scratch'"),
        "0"
    );
    assert_eq!(
        env.q("SELECT count(*) FROM tend.databases WHERE database_name = 'scratch'"),
        "0"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn dbaas_fields_are_an_error_for_a_postgres_provider() {
    let env = Env::new(&[(
        "analytics.yaml",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: analytics\nspec:\n  size: db-small\n  storageGb: 10\n",
    )]);
    let report = env.plan(1);
    let message = report["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.size, spec.storageGb are DBaaS-only"),
        "{message}"
    );
    assert!(message.contains("provider `main` (postgres)"), "{message}");
}

#[test]
fn tls_connections_verify_the_server_against_the_configured_ca() {
    let pg = Postgres::start_with_tls();
    let repo = TestRepo::new();
    repo.write("orders.yaml", ORDERS);
    repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tend.toml");
    let write = |extra: &str, sslmode: &str| {
        std::fs::write(
            &config,
            format!(
                "agent_id = \"tls-agent\"\nstate_dir = \"state\"\n[source]\nurl = \"{}\"\n[reconcile]\nmax_retries = 0\n[providers.main]\nkind = \"postgres\"\nurl = \"{}?sslmode={sslmode}\"\ncreate_owner = true\n{extra}\n",
                repo.url(),
                pg.url()
            ),
        )
        .unwrap();
    };
    let tend = |code: i32| {
        TendCommand::new(&["--config", &config.display().to_string(), "apply"])
            .env("TEND_LOG", "warn")
            .expect_code(code)
    };

    // The server refuses plain connections: the resource is in Error with
    // the server's refusal, and nothing is created.
    write("", "disable");
    let plan = TendCommand::new(&[
        "--config",
        &config.display().to_string(),
        "plan",
        "--format",
        "json",
    ])
    .env("TEND_LOG", "warn")
    .expect_code(1)
    .json();
    let orders = resource(&plan, "orders");
    assert_eq!(orders["state"], "Error", "{orders:#}");
    assert!(
        orders["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no pg_hba.conf entry")),
        "{orders:#}"
    );
    tend(1);

    // A CA that did not sign the server's certificate: refused, and the
    // reason names the certificate.
    let other_ca = dir.path().join("other-ca.crt");
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=other",
            "-keyout",
        ])
        .arg(dir.path().join("other.key"))
        .arg("-out")
        .arg(&other_ca)
        .output()
        .unwrap();
    assert!(out.status.success());
    write(
        &format!("tls_ca_file = \"{}\"", other_ca.display()),
        "require",
    );
    let run = tend(1);
    assert!(
        format!("{}{}", run.stdout, run.stderr)
            .to_lowercase()
            .contains("certificate"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_database WHERE datname = 'orders'"),
        "0"
    );

    // The right CA: verified, encrypted, applied.
    write(
        &format!("tls_ca_file = \"{}\"", pg.ca_file().display()),
        "require",
    );
    tend(0);
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_database WHERE datname = 'orders'"),
        "1"
    );
}

#[test]
fn a_pending_delete_is_not_replayed_once_the_declaration_is_back() {
    let scratch = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: scratch\nspec:\n  deletionPolicy: Delete\n";
    let env = Env::new(&[("orders.yaml", ORDERS), ("scratch.yaml", scratch)]);
    env.tend(&["apply"], 0);
    let mut holder = Command::new("psql")
        .args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &env.pg.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "scratch",
            "-c",
            "SELECT pg_sleep(60)",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    env.wait_for_a_session_on("scratch");
    env.repo.remove("scratch.yaml");
    env.repo.commit("remove scratch");
    env.tend(&["apply"], 2); // the delete stays pending: a session is connected
    let _ = holder.kill();
    let _ = holder.wait();

    // The removal is reverted before the delete could run.
    env.commit("scratch.yaml", scratch);
    env.tend(&["apply"], 0);
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'scratch'"),
        "1",
        "not dropped"
    );
    let store = tend::testing::journal::StateStore::open(&env.dir.path().join("state"), false)
        .unwrap()
        .unwrap();
    let delete = store
        .all_intents()
        .unwrap()
        .into_iter()
        .find(|i| i.kind == "delete")
        .unwrap();
    assert_eq!(delete.state, tend::testing::journal::IntentState::Failed);
    assert!(delete.last_error.unwrap().contains("superseded"));
}

/// Settings PostgreSQL parses as lists are sent as lists: a declared
/// `search_path: '"$user", public'` is two schemas, not one with a comma
/// in its name. Either spelling matches what the server stores, so the
/// database plans `InSync`; a change at the server is drift.
/// PostgreSQL stores a setting under its own name's spelling (`Work_Mem`
/// as `work_mem`, `datestyle` as `DateStyle`): a declaration that writes
/// it in another case is set once and then in sync, not corrected at
/// every cycle.
#[test]
fn a_setting_declared_in_another_case_than_the_server_stores_is_in_sync() {
    let env = Env::new(&[(
        "cased.yaml",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: cased\nspec:\n  parameters:\n    Work_Mem: 64MB\n    datestyle: 'ISO, DMY'\n",
    )]);
    let run = env.tend(&["apply", "--format", "json"], 0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "created and confirmed: {}",
        run.stderr
    );
    let stored = env.q("SELECT array_to_string(setconfig, ',') FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE datname = 'cased'");
    assert!(
        stored.contains("work_mem=64MB") && stored.contains("DateStyle=iso, dmy"),
        "{stored}"
    );
    let plan = env.plan(0);
    let cased = resource(&plan, "cased");
    assert_eq!(cased["state"], "InSync", "{cased:#}");
    let again = env.tend(&["apply", "--format", "json"], 0);
    assert_eq!(
        support::applied(&again.json()),
        Some((0, 0)),
        "nothing to correct: {}",
        again.stderr
    );
}

#[test]
fn list_valued_settings_are_sent_as_lists_and_compared_as_the_server_stores_them() {
    let declared = |search_path: &str, datestyle: &str| {
        format!(
            "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: lists
spec:
  owner: lists_app
  parameters:
    search_path: '{search_path}'
    temp_tablespaces: 'pg_default, \"pg_default\"'
    session_preload_libraries: auto_explain
    DateStyle: '{datestyle}'
    wal_consistency_checking: 'heap,btree'
    restrict_nonsystem_relation_kind: 'view, foreign-table'
"
        )
    };
    let env = Env::new(&[("lists.yaml", &declared("\"$user\", public", "ISO, DMY"))]);
    env.tend(&["apply"], 0);
    let stored = env.q("SELECT array_to_string(setconfig, E'\\n') FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE datname = 'lists'");
    let mut stored: Vec<&str> = stored.lines().collect();
    stored.sort_unstable();
    assert_eq!(
        stored,
        [
            "DateStyle=iso, dmy",
            "restrict_nonsystem_relation_kind=view, foreign-table",
            "search_path=\"$user\", public",
            "session_preload_libraries=auto_explain",
            "temp_tablespaces=pg_default, pg_default",
            "wal_consistency_checking=heap, btree",
        ]
    );
    // What a session in the database gets: two schemas.
    assert_eq!(
        env.pg.psql_in(
            "postgres",
            "SELECT current_schemas(false)::text FROM (SELECT set_config('search_path', (SELECT split_part(c, '=', 2) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase, unnest(setconfig) c WHERE datname = 'lists' AND c LIKE 'search_path=%'), false)) x"
        ),
        "{public}"
    );
    let plan = env.plan(0);
    assert_eq!(resource(&plan, "lists")["state"], "InSync", "{plan:#}");

    // The other spelling of the same lists: still in sync, nothing to do.
    env.commit("lists.yaml", &declared("$user,public", "iso,dmy"));
    let plan = env.plan(0);
    assert_eq!(resource(&plan, "lists")["state"], "InSync", "{plan:#}");
    env.tend(&["apply"], 0);

    // Changed at the server: drift on that setting, in the compared form.
    env.q("ALTER DATABASE lists SET search_path = public, \"Audit Log\"");
    let plan = env.plan(2);
    let drift = &resource(&plan, "lists")["drift"];
    assert_eq!(drift.as_array().unwrap().len(), 1, "{drift:#}");
    assert_eq!(drift[0]["field"], "parameters.search_path");
    assert_eq!(drift[0]["desired"], "\"$user\", public");
    assert_eq!(drift[0]["observed"], "public, \"Audit Log\"");
}

/// A configuration for `env` whose provider connects as `user` (trust
/// authentication: the role's grants are what is tested).
fn configure_as(env: &Env, user: &str, extra: &str) {
    let url = env
        .pg
        .url()
        .replace("postgres://postgres@", &format!("postgres://{user}@"));
    std::fs::write(
        env.config(),
        format!(
            "agent_id = \"pg-agent\"\nstate_dir = \"state\"\n[source]\nurl = \"{}\"\n[reconcile]\ndrift_grace = \"0s\"\ndeletion_delay = \"0s\"\nmax_deletion_percent = 100\nretry_min_delay = \"50ms\"\nmax_retries = 2\nconfirm_timeout = \"5s\"\n[providers.main]\nkind = \"postgres\"\nurl = \"{url}\"\ncreate_owner = true\n{extra}\n",
            env.repo.url()
        ),
    )
    .unwrap();
}

/// The grants docs/providers.md lists, and nothing more: a role that is
/// not a superuser runs plan (read-only: it creates no catalog), apply
/// (creating the owner role), adopt and delete.
#[test]
fn a_role_with_exactly_the_documented_grants_runs_plan_apply_adopt_and_delete() {
    let legacy = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: legacy
  annotations:
    tend.dev/adopt: \"true\"
spec:
  owner: legacy_owner
  connectionLimit: 7
";
    let scratch = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: scratch\nspec:\n  owner: scratch_app\n  deletionPolicy: Delete\n";
    let env = Env::new(&[
        ("orders.yaml", ORDERS),
        ("legacy.yaml", legacy),
        ("scratch.yaml", scratch),
    ]);
    // docs/providers.md, "Privileges".
    env.q("CREATE ROLE tend_agent LOGIN CREATEDB CREATEROLE");
    env.q("GRANT CREATE ON DATABASE postgres TO tend_agent");
    // A database tend adopts, and the grant that lets it manage it.
    env.q("CREATE ROLE legacy_owner");
    env.q("CREATE DATABASE legacy OWNER legacy_owner");
    env.q("GRANT legacy_owner TO tend_agent");
    configure_as(&env, "tend_agent", "");

    let plan = env.tend(&["plan", "--format", "json", "--detailed-exitcode"], 2);
    let report: Value = serde_json::from_str(&plan.stdout).unwrap();
    assert_eq!(resource(&report, "orders")["action"], "Create");
    assert_eq!(resource(&report, "legacy")["action"], "Adopt");
    assert_eq!(
        env.q("SELECT to_regnamespace('tend') IS NULL"),
        "t",
        "plan created tend's catalog"
    );

    // Adopted in this cycle, its drift corrected in the next (one
    // operation per resource per cycle).
    env.tend(&["apply"], 2);
    env.tend(&["apply"], 0);
    assert_eq!(
        env.q("SELECT string_agg(datname || ':' || pg_get_userbyid(datdba) || ':' || datconnlimit, ',' ORDER BY datname) FROM pg_database WHERE datname IN ('orders', 'legacy', 'scratch')"),
        "legacy:legacy_owner:7,orders:orders_app:50,scratch:scratch_app:-1"
    );
    assert_eq!(
        env.q("SELECT string_agg(database_name, ',' ORDER BY database_name) FROM tend.databases"),
        "legacy,orders,scratch"
    );
    assert_eq!(
        env.pg.psql_in("orders", "SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension WHERE extname <> 'plpgsql'"),
        "citext,pg_trgm"
    );
    assert_eq!(resource(&env.plan(0), "legacy")["state"], "InSync");

    env.repo.remove("scratch.yaml");
    env.repo.commit("scratch goes");
    env.tend(&["apply"], 0);
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'scratch'"),
        "0"
    );
}

/// With the schema made for it by an administrator, tend's role needs no
/// privilege on the maintenance database at all.
#[test]
fn a_catalog_schema_made_by_an_administrator_needs_no_grant_on_the_database() {
    let env = Env::new(&[("orders.yaml", ORDERS)]);
    env.q("CREATE ROLE tend_agent LOGIN CREATEDB CREATEROLE");
    env.q("CREATE SCHEMA tend AUTHORIZATION tend_agent");
    configure_as(&env, "tend_agent", "");
    env.tend(&["apply"], 0);
    assert_eq!(env.q("SELECT database_name FROM tend.databases"), "orders");
}

/// A create that fails for good removes the owner role tend made for it;
/// a role that existed before is never touched.
#[test]
fn a_failed_create_leaves_no_owner_role_behind() {
    let impossible = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: impossible\nspec:\n  owner: ghost_app\n  encoding: LATIN1\n";
    let env = Env::new(&[("impossible.yaml", impossible)]);
    let run = env.tend(&["apply"], 1);
    assert!(
        run.stderr.contains("does not match locale")
            || run.stdout.contains("does not match locale"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(
        env.q("SELECT count(*) FROM pg_roles WHERE rolname = 'ghost_app'"),
        "0",
        "the role made for the failed create is left behind"
    );
    // The same failure with a role someone made: the role stays.
    env.q("CREATE ROLE ghost_app");
    env.tend(&["apply"], 1);
    assert_eq!(
        env.q("SELECT count(*) FROM pg_roles WHERE rolname = 'ghost_app'"),
        "1"
    );
}

/// `sslmode=require` against a server without TLS is a configuration
/// error, reported at once, not retried as a network failure.
#[test]
fn sslmode_require_against_a_server_without_tls_is_a_permanent_error() {
    let env = Env::new(&[("orders.yaml", ORDERS)]);
    let url = format!("{}?sslmode=require", env.pg.url());
    std::fs::write(
        env.config(),
        format!(
            "agent_id = \"pg-agent\"\nstate_dir = \"state\"\n[source]\nurl = \"{}\"\n[reconcile]\nretry_min_delay = \"1s\"\nmax_retries = 5\n[providers.main]\nkind = \"postgres\"\nurl = \"{url}\"\n",
            env.repo.url()
        ),
    )
    .unwrap();
    let run = env.tend(&["plan", "--format", "json"], 1);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let orders = resource(&report, "orders");
    assert_eq!(orders["state"], "Error", "{orders:#}");
    let reason = orders["reason"].as_str().unwrap();
    assert!(reason.contains("the server offers no TLS"), "{reason}");
    assert!(
        !run.stderr.contains("temporary provider failure"),
        "retried as a temporary failure: {}",
        run.stderr
    );
}

/// Extensions of a database that refuses connections cannot be observed:
/// they are reported as unobserved (JSON, text, explain), and the
/// resource is never called plainly in sync.
#[test]
fn unobserved_fields_are_reported_never_silently_in_sync() {
    let env = Env::new(&[("orders.yaml", ORDERS)]);
    env.tend(&["apply"], 0);
    let closed = ORDERS.replace("allowConnections: true", "allowConnections: false");
    env.commit("orders.yaml", &closed);
    env.tend(&["apply"], 0);
    let plan = env.plan(0);
    let orders = resource(&plan, "orders");
    assert_eq!(
        orders["unobserved"],
        serde_json::json!(["extensions"]),
        "{orders:#}"
    );
    let reason = orders["reason"].as_str().unwrap();
    assert!(
        reason.contains("extensions could not be observed this time"),
        "{reason}"
    );
    let text = env.tend(&["plan"], 0).stdout;
    assert!(text.contains("not observed: extensions"), "{text}");
    let explain = env.tend(&["explain", "orders"], 0).stdout;
    assert!(explain.contains("extensions not observed"), "{explain}");
}

/// A create the server refuses for good (the agent's role is not a member
/// of the owner role: 42501) is `Failed` everywhere an on-call person
/// looks — `/v1/status`, `tend status`, the HTML page, `SUMMARY.md` on the
/// status branch — and notified once; it is not sent again while nothing
/// changes; once the cause is fixed, `tend reconcile NAME` sends it again,
/// and it recovers.
#[test]
fn a_create_the_server_refuses_is_failed_everywhere_and_sent_again_only_when_asked() {
    let reporting = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: reporting\nspec:\n  owner: reporting_app\n";
    let env = Env::new(&[("reporting.yaml", reporting)]);
    env.q("CREATE ROLE tend_agent LOGIN CREATEDB");
    env.q("GRANT CREATE ON DATABASE postgres TO tend_agent");
    env.q("CREATE ROLE reporting_app");
    let served = env.dir.path().join("served");
    std::fs::create_dir(&served).unwrap();
    let bare = env.repo.bare_clone(&served);
    let receiver = support::receiver::Receiver::start(&[]);
    let port = support::git::free_port();
    let url = env
        .pg
        .url()
        .replace("postgres://postgres@", "postgres://tend_agent@");
    std::fs::write(
        env.config(),
        format!(
            "agent_id = \"pg-agent\"\nstate_dir = \"state\"\n[source]\nurl = \"file://{}\"\ninterval = \"1h\"\n[status]\nbranch = \"tend-status\"\n[server]\nlisten = \"127.0.0.1:{port}\"\n[reconcile]\nresync = \"1h\"\nretry_min_delay = \"50ms\"\nmax_retries = 1\n[providers.main]\nkind = \"postgres\"\nurl = \"{url}\"\n[[notify]]\nurl = \"{}\"\n",
            bare.display(),
            receiver.url()
        ),
    )
    .unwrap();
    let daemon = support::daemon::Daemon::start(&env.config(), port, &[]);
    daemon.wait_ready();
    let reporting = || resource(&daemon.status(), "reporting").clone();
    daemon.wait_for("reporting Failed", Duration::from_secs(30), || {
        reporting()["state"] == "Failed"
    });
    let r = reporting();
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.contains("reporting_app") && reason.contains("42501") && reason.contains("create"),
        "the server's message: {r:#}"
    );
    assert_eq!(r["operation"]["state"], "failed", "{r:#}");
    assert_eq!(r["operation"]["kind"], "create", "{r:#}");
    assert_eq!(
        daemon.status()["summary"]["errors"],
        1,
        "counted as an error"
    );
    // Every other place on-call looks.
    let status = env.tend(&["status", "reporting"], 1).stdout;
    assert!(
        status.contains("Failed") && status.contains("42501"),
        "{status}"
    );
    let explain = env.tend(&["explain", "reporting"], 0).stdout;
    assert!(
        explain.contains("operation-failed")
            && explain.contains("docs/runbooks/operation-failed.md"),
        "{explain}"
    );
    let page = env.dir.path().join("state/reports/latest.html");
    let profile = tempfile::tempdir().unwrap();
    let dom = support::browser::browse(
        profile.path(),
        &["--dump-dom"],
        &format!("file://{}", page.display()),
    );
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("Failed") && dom.contains("42501"), "{dom}");
    daemon.wait_for("SUMMARY.md", Duration::from_secs(20), || {
        support::git::git(&bare, &["show", "tend-status:SUMMARY.md"]).contains("42501")
    });
    daemon.wait_for("one operation-failed", Duration::from_secs(20), || {
        receiver.events().contains(&"operation-failed".to_string())
    });

    // Not sent again while nothing changes, however often it reconciles.
    let creates = || {
        let db = rusqlite::Connection::open_with_flags(
            env.dir.path().join("state/state.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        db.query_row(
            "SELECT count(*) FROM intents WHERE name = 'reporting' AND kind = 'create'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
    };
    assert_eq!(creates(), 1);
    for _ in 0..3 {
        daemon.run_cycles(1);
    }
    assert_eq!(creates(), 1, "not sent again");
    assert_eq!(reporting()["state"], "Failed");
    assert_eq!(
        receiver
            .events()
            .iter()
            .filter(|e| *e == "operation-failed")
            .count(),
        1,
        "notified once"
    );

    // The cause fixed, an operator retries it.
    env.q("GRANT reporting_app TO tend_agent");
    let retried = env.tend(&["reconcile", "reporting"], 0).stdout;
    assert!(retried.contains("sent again"), "{retried}");
    daemon.wait_for("reporting in sync", Duration::from_secs(30), || {
        reporting()["state"] == "InSync"
    });
    assert_eq!(
        env.q("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'reporting'"),
        "reporting_app"
    );
    daemon.wait_for("recovered", Duration::from_secs(20), || {
        receiver.received().iter().any(|m| {
            let body = m.json();
            body["event"] == "recovered" && body["ended"] == serde_json::json!(["operation-failed"])
        })
    });
}

/// An `ALTER DATABASE` made behind tend's back is seen by the running agent
/// at its observation cadence (`observe`), although `resync` is an hour and
/// nothing was committed: reported as out-of-band drift, held for grace.
#[test]
fn the_running_agent_sees_an_alter_database_within_its_observe_cadence() {
    let env = Env::new(&[("orders.yaml", ORDERS)]);
    let port = support::git::free_port();
    env.configure(&format!("[server]\nlisten = \"127.0.0.1:{port}\"\n"));
    let text = std::fs::read_to_string(env.config())
        .unwrap()
        .replace(
            "[reconcile]\n",
            "[reconcile]\nresync = \"1h\"\nobserve = \"2s\"\n",
        )
        .replace("drift_grace = \"2s\"", "drift_grace = \"1h\"");
    std::fs::write(env.config(), text).unwrap();
    let daemon = support::daemon::Daemon::start(&env.config(), port, &[]);
    daemon.wait_ready();
    daemon.wait_for("orders in sync", Duration::from_secs(30), || {
        resource(&daemon.status(), "orders")["state"] == "InSync"
    });
    env.q("ALTER DATABASE orders SET work_mem = '2GB'");
    daemon.wait_for(
        "the ALTER seen without a commit or a resync",
        Duration::from_secs(20),
        || {
            let orders = resource(&daemon.status(), "orders").clone();
            orders["state"] == "Drifted"
                && orders["drift"].as_array().is_some_and(|d| {
                    d.iter().any(|x| {
                        x["field"] == "parameters.work_mem" && x["origin"] == "out-of-band"
                    })
                })
        },
    );
}

/// A provider tend cannot log in to (here a role that does not exist,
/// as a wrong password would be) is said once, however many databases it
/// holds: one line with the server's message, not one per database.
#[test]
fn a_provider_that_refuses_the_login_is_reported_once_not_per_database() {
    let names = ["alpha", "bravo", "charlie", "delta", "echo"];
    let files: Vec<(String, String)> = names
        .iter()
        .map(|n| (format!("{n}.yaml"), manifest(n, 10)))
        .collect();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(f, t)| (f.as_str(), t.as_str()))
        .collect();
    let env = Env::new(&files);
    configure_as(&env, "nobody_here", "");
    let run = env.tend(&["plan"], 1);
    let said = run.stdout.matches("nobody_here").count();
    assert_eq!(said, 1, "the server's message once:\n{}", run.stdout);
    assert!(
        run.stdout
            .contains("5 databases (alpha, bravo, charlie and 2 more) could not be observed"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("5 errors"), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("could not be observed at the provider: role \"nobody_here\" does not exist"),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.matches("nobody_here").count() <= 1,
        "logged once at most:\n{}",
        run.stderr
    );
}

/// An owner role the server refuses to create (a reserved `pg_` name)
/// fails that create for good, and only that one: the failed statement
/// used to leave its transaction open on the pooled connection, and the
/// next create on it was refused with 25P02 ("current transaction is
/// aborted") and marked Failed too.
#[test]
fn a_refused_owner_role_leaves_no_aborted_transaction_behind() {
    let owned = |name: &str, owner: &str| {
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  owner: {owner}\n"
        )
    };
    let env = Env::new(&[
        ("a.yaml", &owned("a-first", "pg_not_allowed")),
        ("b.yaml", &owned("b-second", "b_app")),
        ("c.yaml", &owned("c-third", "c_app")),
    ]);
    // One connection: every create goes through it, in order.
    env.configure("max_concurrency = 1");
    let out = env.tend(&["apply", "--format", "json"], 1);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        resource(&report, "a-first")["state"],
        "Failed",
        "{report:#}"
    );
    for name in ["b-second", "c-third"] {
        assert_eq!(
            resource(&report, name)["state"],
            "InSync",
            "{name} after a refused create on the same connection: {report:#}"
        );
    }
    assert!(!out.stdout.contains("25P02"), "{}", out.stdout);
}

/// A create the server refuses halfway: the database is made (with tend's
/// marker) and a setting is refused. What the database lacks is tend's own
/// unfinished write, corrected at once (here refused again, so Failed with
/// the server's reason), never an operator's out-of-band change held for
/// `drift_grace` (it was, and `explain` said "remembered: nothing").
#[test]
fn a_create_that_fails_halfway_is_remembered_as_tends_own_write() {
    let declared = |timeout: &str| {
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: ledger\nspec:\n  connectionLimit: 20\n  parameters:\n    work_mem: 8MB\n    statement_timeout: {timeout}\n"
        )
    };
    let env = Env::new(&[("ledger.yaml", &declared("forever"))]);
    // A long grace: were the drift out-of-band, it would be held.
    std::fs::write(
        env.config(),
        std::fs::read_to_string(env.config())
            .unwrap()
            .replace("drift_grace = \"2s\"", "drift_grace = \"1h\""),
    )
    .unwrap();
    let run = env.tend(&["apply", "--format", "json"], 1);
    assert!(
        run.stderr.contains("create ledger") && run.stderr.contains("22023"),
        "{}",
        run.stderr
    );
    assert_eq!(
        env.q("SELECT count(*) FROM pg_database WHERE datname = 'ledger'"),
        "1",
        "the create made the database before the setting was refused"
    );
    let plan = env.plan(2);
    let ledger = resource(&plan, "ledger");
    let drift = ledger["drift"].as_array().unwrap();
    assert!(!drift.is_empty(), "{ledger:#}");
    for d in drift {
        assert_eq!(
            d["origin"], "declared",
            "tend's own unfinished create: {ledger:#}"
        );
    }
    assert_eq!(ledger["action"], "Update", "corrected at once: {ledger:#}");
    let reason = ledger["reason"].as_str().unwrap();
    assert!(
        reason.contains("tend's own create did not finish") && reason.contains("22023"),
        "{reason}"
    );
    let explain = env.tend(&["explain", "ledger"], 0).stdout;
    assert!(
        !explain.contains("remembered:  nothing (first sight"),
        "{explain}"
    );
    assert!(explain.contains("tend's own create"), "{explain}");
    // Corrected at once: the setting is refused again, with the server's
    // reason (22023: invalid value), not held as someone else's change.
    let run = env.tend(&["apply", "--format", "json"], 1);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let ledger = resource(&report, "ledger");
    assert_eq!(ledger["state"], "Failed", "{ledger:#}");
    let reason = ledger["reason"].as_str().unwrap();
    assert!(
        reason.contains("22023") && reason.contains("statement_timeout"),
        "{reason}"
    );
    // The declaration fixed, it converges on the same database.
    let oid = env.q("SELECT oid FROM pg_database WHERE datname = 'ledger'");
    env.commit("ledger.yaml", &declared("30s"));
    env.tend(&["apply"], 0);
    assert_eq!(resource(&env.plan(0), "ledger")["state"], "InSync");
    assert_eq!(
        env.q("SELECT oid FROM pg_database WHERE datname = 'ledger'"),
        oid,
        "the same database, never made twice"
    );
}

/// Two attempts of one create at once (an earlier attempt's session still
/// running `CREATE DATABASE` when the retry sends it again): the server
/// answers the later one with a unique violation on `pg_database`
/// (23505), which is the other attempt still at work, not a failure. Each
/// race ends with one database, no attempt refused for good, and at
/// least one race (they are real: both statements overlap for tens of
/// milliseconds) answered with the retryable error.
#[test]
fn two_attempts_of_one_create_at_once_make_one_database_and_never_fail_for_good() {
    use std::collections::BTreeMap;
    use tend::testing::provider::postgres::{PostgresProvider, PostgresSettings};
    use tend::testing::provider::{
        ChangeRequest, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, OperationId, Provider,
        ProviderError,
    };

    let pg = Postgres::start();
    let provider = std::sync::Arc::new(
        PostgresProvider::new(PostgresSettings {
            url: pg.url(),
            password: None,
            create_owner: false,
            force_drop: false,
            max_connections: 4,
            tls_ca_file: None,
        })
        .unwrap(),
    );
    // Both attempts wait on the server at once on one thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut in_progress = 0;
    let mut outcomes = Vec::new();
    for round in 0..6 {
        let name = format!("race_{round}");
        let request = ChangeRequest {
            database_name: name.clone(),
            fields: BTreeMap::new(),
            labels: BTreeMap::from([
                (OWNER_AGENT_LABEL.to_string(), "test-agent".to_string()),
                (OWNER_DECLARATION_LABEL.to_string(), name.clone()),
            ]),
        };
        let op = OperationId(format!("{round:064x}"));
        let results = runtime.block_on(async {
            let attempt = || {
                let (provider, op, request) = (provider.clone(), op.clone(), request.clone());
                tokio::spawn(async move { provider.create(&op, &request).await })
            };
            let (a, b) = (attempt(), attempt());
            [a.await.unwrap(), b.await.unwrap()]
        });
        for result in &results {
            match result {
                Ok(observed) => assert_eq!(observed.database_name, name),
                Err(ProviderError::Retryable { message, .. })
                    if message.contains("another CREATE DATABASE of this name is in progress") =>
                {
                    in_progress += 1
                }
                Err(e) => panic!("round {round}: an attempt of the create failed: {e:?}"),
            }
        }
        outcomes.push(
            results
                .iter()
                .map(|r| if r.is_ok() { "ok" } else { "retryable" })
                .collect::<Vec<_>>()
                .join("+"),
        );
        assert!(
            results.iter().any(Result::is_ok),
            "round {round}: {outcomes:?}"
        );
        assert_eq!(
            pg.psql(&format!(
                "SELECT count(*) FROM pg_database WHERE datname = '{name}'"
            )),
            "1"
        );
    }
    println!("outcomes per race: {outcomes:?}");
    assert!(
        in_progress > 0,
        "no race overlapped (every attempt found the other's database): the test proved nothing: {outcomes:?}"
    );
}
