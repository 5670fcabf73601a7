//! The http provider against the reference server over loopback, one test
//! per fault, each asserting the invariant the fault threatens; and
//! `tend provider check` against the reference server and against
//! variants that break one rule each.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::TendCommand;
use support::config::TendConfig;
use support::git::TestRepo;
use support::reference::ReferenceServer;

fn dbaas(name: &str, size: &str) -> String {
    format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  engine: postgres\n  version: \"16\"\n  size: {size}\n  storageGb: 100\n  region: eu-west-1\n"
    )
}

/// A configuration with one http provider, `dbaas`, at `server`.
fn dbaas_config(dir: &std::path::Path, repo: &TestRepo, server: &ReferenceServer) -> TendConfig {
    TendConfig::new(dir, &repo.url())
        .without_section("providers.sandbox")
        .section("providers.dbaas", "kind", "\"http\"")
        .section(
            "providers.dbaas",
            "endpoint",
            &format!("\"{}\"", server.url()),
        )
}

struct Setup {
    server: ReferenceServer,
    repo: TestRepo,
    dir: tempfile::TempDir,
    config: String,
}

fn setup(server_args: &[&str], declarations: &[(&str, &str)]) -> Setup {
    let server = ReferenceServer::start(server_args);
    let repo = TestRepo::new();
    for (name, size) in declarations {
        repo.write(&format!("{name}.yaml"), &dbaas(name, size));
    }
    repo.commit("declarations");
    let dir = tempfile::tempdir().unwrap();
    let config = dbaas_config(dir.path(), &repo, &server)
        .section("providers.dbaas", "timeout", "\"5s\"")
        .section("providers.dbaas", "max_concurrency", "8")
        .section("providers.dbaas", "rate_limit", "1000")
        .write();
    Setup {
        server,
        repo,
        dir,
        config: config.display().to_string(),
    }
}

impl Setup {
    fn apply(&self, code: i32) -> support::RunOutput {
        TendCommand::new(&["--config", &self.config, "apply", "--format", "json"])
            .current_dir(self.dir.path())
            .expect_code(code)
    }

    fn plan(&self) -> serde_json::Value {
        TendCommand::new(&["--config", &self.config, "plan", "--format", "json"])
            .current_dir(self.dir.path())
            .expect_code(0)
            .json()
    }

    fn size(&self, name: &str) -> String {
        self.server.database(name).unwrap()["fields"]["size"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

#[test]
fn creates_observes_and_corrects_through_the_contract() {
    let s = setup(&[], &[("analytics", "db-small")]);
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    let db = s.server.database("analytics").unwrap();
    assert_eq!(db["fields"]["size"], "db-small");
    assert_eq!(db["labels"]["tend.dev/owner-declaration"], "analytics");
    let plan = s.plan();
    assert_eq!(plan["resources"][0]["state"], "InSync", "{plan:#}");
    // A declared change is a PATCH with If-Match.
    s.repo
        .write("analytics.yaml", &dbaas("analytics", "db-medium"));
    s.repo.commit("bigger");
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    assert_eq!(s.size("analytics"), "db-medium");
    assert_eq!(s.server.count("updates"), 1);
}

/// A cycle whose every write was confirmed by the provider's answer to it
/// reports from those answers: the provider is listed once, before the
/// decisions. A write left unconfirmed sends the cycle back to the
/// provider, so the report tells what is there.
#[test]
fn writes_confirmed_by_their_answers_are_not_listed_again() {
    let s = setup(
        &[],
        &[
            ("analytics", "db-small"),
            ("billing", "db-small"),
            ("orders", "db-small"),
        ],
    );
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((3, 3)),
        "{}",
        run.stderr
    );
    assert_eq!(s.server.count("creates"), 3, "{}", s.server.stats());
    assert_eq!(s.server.count("lists"), 1, "{}", s.server.stats());
    assert_eq!(run.json()["summary"]["inSync"], 3, "{}", run.stdout);

    // A create whose operation outlasts operation_timeout is sent but not
    // confirmed: the report is made from a second listing.
    s.repo
        .write("payments.yaml", &dbaas("payments", "db-small"));
    s.repo.commit("payments");
    let impatient = dbaas_config(s.dir.path(), &s.repo, &s.server)
        .section("providers.dbaas", "operation_timeout", "\"300ms\"")
        .reconcile("max_retries", "1")
        .write();
    s.server.faults(json!({"operationDelayMs": 5000}));
    let run = TendCommand::new(&["--config", &impatient.display().to_string(), "apply"])
        .current_dir(s.dir.path())
        .expect_code(2);
    assert_eq!(
        s.server.count("lists"),
        3,
        "an unconfirmed write lists again: {}",
        s.server.stats()
    );
    assert!(run.stdout.contains("payments"), "{}", run.stdout);
}

/// `tend plan` lists the provider beside the source fetch. A listing
/// that started before a write to the state (here an override set while
/// the plan stands still) may predate what is now remembered: it is not
/// used, and the plan lists again.
#[test]
fn a_listing_older_than_a_state_write_is_made_again() {
    let s = setup(&[], &[("analytics", "db-small")]);
    s.apply(0);
    let listed = s.server.count("lists");
    assert_eq!(s.plan()["summary"]["inSync"], 1);
    assert_eq!(
        s.server.count("lists"),
        listed + 1,
        "one listing a plan: {}",
        s.server.stats()
    );

    let marker = s.dir.path().join("paused");
    let plan = std::process::Command::new(env!("CARGO_BIN_EXE_tend"))
        .args(["--config", &s.config, "plan", "--format", "json"])
        .current_dir(s.dir.path())
        .env_remove("TEND_CONFIG")
        .env_remove("CREDENTIALS_DIRECTORY")
        .env("TEND_LOG", "tend=debug")
        .env("FAILPOINTS", "before-inputs=return(until-resumed)")
        .env("TEND_TEST_PAUSE_FILE", &marker)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    support::eventually(
        "tend apply pausing",
        Duration::from_secs(60),
        || support::holds(marker.exists()),
        String::new,
    );
    TendCommand::new(&[
        "--config",
        &s.config,
        "override",
        "set",
        "analytics",
        "--pause",
        "--reason",
        "INC-42",
    ])
    .current_dir(s.dir.path())
    .expect_code(0);
    std::fs::remove_file(&marker).unwrap();
    let out = plan.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the state changed while listing ahead"),
        "{stderr}"
    );
    // The listing ahead is stopped, perhaps before it was sent.
    assert!(
        s.server.count("lists") >= listed + 2,
        "a listing after the write: {}",
        s.server.stats()
    );
    assert!(
        stdout.contains("INC-42"),
        "the plan read the state after the write: {stdout}"
    );
}

/// A second http provider no declaration uses is listed ahead too (a
/// one-shot command cannot know before it reads the declarations), but
/// never waited for: here it accepts connections and never answers, with
/// an hour's timeout.
#[test]
fn a_provider_no_declaration_uses_is_not_waited_for() {
    let server = ReferenceServer::start(&[]);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let repo = TestRepo::new();
    repo.write(
        "analytics.yaml",
        &dbaas("analytics", "db-small").replace("spec:\n", "spec:\n  provider: dbaas\n"),
    );
    repo.commit("analytics");
    let dir = tempfile::tempdir().unwrap();
    let config = dbaas_config(dir.path(), &repo, &server)
        .section("providers.spare", "kind", "\"http\"")
        .section(
            "providers.spare",
            "endpoint",
            &format!("\"http://{}\"", silent.local_addr().unwrap()),
        )
        .section("providers.spare", "timeout", "\"1h\"")
        .write();
    let plan = std::process::Command::new(env!("CARGO_BIN_EXE_tend"))
        .args([
            "--config",
            &config.display().to_string(),
            "plan",
            "--format",
            "json",
        ])
        .current_dir(dir.path())
        .env_remove("TEND_CONFIG")
        .env_remove("CREDENTIALS_DIRECTORY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let plan = std::cell::RefCell::new(plan);
    support::eventually(
        "tend plan finishing without the provider nothing is routed to",
        Duration::from_secs(60),
        || plan.borrow_mut().try_wait().unwrap(),
        || {
            let _ = plan.borrow_mut().kill();
            "it waited for that provider: killed".into()
        },
    );
    let plan = plan.into_inner();
    let out = plan.wait_with_output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "{report:#}");
    assert_eq!(report["resources"][0]["state"], "Missing", "{report:#}");
    assert_eq!(server.count("lists"), 1, "{}", server.stats());
}

#[test]
fn a_response_lost_after_commit_makes_exactly_one_database() {
    let s = setup(&[], &[("analytics", "db-small")]);
    s.server.faults(json!({"dropResponses": 1}));
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    assert_eq!(s.server.count("creates"), 1, "{}", s.server.stats());
    assert_eq!(s.server.count("dropped"), 1, "{}", s.server.stats());
    assert!(s.server.count("replays") >= 1, "{}", s.server.stats());
    assert_eq!(s.server.stats()["databases"], 1);
    // The retry used the same key: one key, used twice or more.
    let uses = s.server.stats()["keyUses"].clone();
    let uses: Vec<u64> = uses
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(uses.len(), 1, "{uses:?}");
    assert!(uses[0] >= 2, "{uses:?}");
}

#[test]
fn a_412_is_observed_again_and_never_overwritten_blindly() {
    let s = setup(&[], &[("analytics", "db-small")]);
    s.apply(0);
    s.repo
        .write("analytics.yaml", &dbaas("analytics", "db-medium"));
    s.repo.commit("bigger");
    // Someone sets size to db-large between tend's observation and its PATCH.
    s.server.faults(json!({
        "concurrentWrite": {"database": "analytics", "fields": {"size": "db-large"}}
    }));
    let run = TendCommand::new(&["--config", &s.config, "apply"])
        .current_dir(s.dir.path())
        .expect_code(1);
    assert!(
        run.stderr.contains("(412): Precondition Failed"),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(s.server.count("updates"), 0, "the stale PATCH was refused");
    assert_eq!(
        s.size("analytics"),
        "db-large",
        "the other writer's value stands"
    );
    // Decided afresh, knowing the other writer's value: the plan shows it
    // before anything is written again.
    let plan = s.plan();
    let drift = plan["resources"][0]["drift"].to_string();
    assert!(drift.contains("db-large"), "{plan:#}");
    // The declaration changed in Git, so the next apply applies it, with
    // the ETag of what it saw.
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    assert_eq!(s.server.count("updates"), 1);
    assert_eq!(s.size("analytics"), "db-medium");
}

#[test]
fn a_429_is_honoured_with_its_retry_after() {
    let s = setup(&[], &[("analytics", "db-small")]);
    s.server
        .faults(json!({"rateLimitCalls": 2, "retryAfterSecs": 1}));
    let started = Instant::now();
    let run = s.apply(0);
    let took = started.elapsed();
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    assert!(
        took >= Duration::from_millis(1900),
        "two 429s with Retry-After: 1 waited only {took:?}"
    );
    assert!(run.stderr.contains("rate limited"), "{}", run.stderr);
    assert_eq!(s.server.count("creates"), 1);
}

#[test]
fn server_errors_are_retried_with_backoff_until_they_pass() {
    let s = setup(&[], &[("analytics", "db-small")]);
    s.server.faults(json!({"errorCalls": 3}));
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("502"), "{}", run.stderr);
    assert_eq!(s.server.count("creates"), 1);
    assert_eq!(s.server.stats()["databases"], 1);
}

#[test]
fn a_stale_read_after_a_write_does_not_cause_a_second_write() {
    let s = setup(&[], &[("analytics", "db-small")]);
    s.apply(0);
    s.repo
        .write("analytics.yaml", &dbaas("analytics", "db-medium"));
    s.repo.commit("bigger");
    // Past the create's lag (a stale read right after a create shows no
    // database at all: that is another test's subject).
    std::thread::sleep(Duration::from_millis(1600));
    s.server.faults(json!({"staleReadsMs": 1500}));
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    assert_eq!(s.server.count("updates"), 1, "{}", s.server.stats());
    // Later cycles (still reading stale copies for a moment) write nothing.
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((0, 0)),
        "{}",
        run.stderr
    );
    assert_eq!(s.server.count("updates"), 1);
    assert_eq!(s.size("analytics"), "db-medium");
}

/// A `databaseName` with a space and an accent: created, then found by
/// its percent-encoded path (the reference server matched the raw
/// segment, answered 404, and every apply waited on "not visible yet").
#[test]
fn a_unicode_database_name_is_created_and_found_again() {
    let s = setup(&[], &[]);
    s.repo.write(
        "cafe.yaml",
        &dbaas("cafe", "db-small").replace("spec:\n", "spec:\n  databaseName: Café Orders\n"),
    );
    s.repo.commit("café");
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    let (status, body) = s
        .server
        .request("GET", "/v1/databases/Caf%C3%A9%20Orders", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["name"], "Café Orders");
    let run = s.apply(0);
    assert!(
        !format!("{}{}", run.stdout, run.stderr).contains("not visible yet"),
        "{}",
        run.stderr
    );
    assert_eq!(
        support::applied(&run.json()),
        Some((0, 0)),
        "{}",
        run.stderr
    );
    let plan = s.plan();
    assert_eq!(plan["resources"][0]["state"], "InSync", "{plan:#}");
    assert_eq!(s.server.count("creates"), 1);
}

/// `metadata.labels` stay in Git: they were copied to the provider at
/// create and never reconciled (`team: data` → `team: bi` stayed `InSync`
/// with `data` at the DBaaS). Only the ownership marker is written.
#[test]
fn metadata_labels_are_not_written_to_the_provider() {
    let s = setup(&[], &[]);
    s.repo.write(
        "billing.yaml",
        &dbaas("billing", "db-small").replace(
            "  name: billing\n",
            "  name: billing\n  labels:\n    team: data\n",
        ),
    );
    s.repo.commit("billing");
    s.apply(0);
    let labels = s.server.database("billing").unwrap()["labels"].clone();
    let keys: Vec<&str> = labels
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        ["tend.dev/owner-agent", "tend.dev/owner-declaration"],
        "{labels}"
    );
}

/// A server that manages a small field set (no `databaseName`, no
/// `engine`): tend reads its capabilities, sends only what it manages
/// (it sent `databaseName` on every create, and this server refuses any
/// field it does not list: all creates were 422), and refuses at plan time
/// a declaration that sets a field the server does not manage, naming the
/// field and the provider.
#[test]
fn only_the_fields_the_server_manages_are_sent_and_others_are_refused_at_plan() {
    let small = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: ledger\nspec:\n  owner: ledger_app\n  comment: The ledger\n  connectionLimit: 20\n  parameters:\n    work_mem: 8MB\n";
    let s = setup(
        &["--fields", "owner,comment,connectionLimit,parameters"],
        &[],
    );
    s.repo.write("ledger.yaml", small);
    s.repo.write("sized.yaml", &dbaas("sized", "db-small"));
    s.repo.commit("two declarations");
    let run = TendCommand::new(&["--config", &s.config, "apply", "--format", "json"])
        .current_dir(s.dir.path())
        .expect_code(1);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "only ledger is created: {}",
        run.stderr
    );
    let db = s.server.database("ledger").unwrap();
    assert_eq!(db["fields"]["connectionLimit"], 20, "{db}");
    assert_eq!(db["fields"].get("databaseName"), None, "{db}");
    assert_eq!(s.server.database("sized"), None);
    let plan = TendCommand::new(&["--config", &s.config, "plan", "--format", "json"])
        .current_dir(s.dir.path())
        .expect_code(1)
        .json();
    let state = |name: &str| {
        plan["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(state("ledger")["state"], "InSync", "{plan:#}");
    let sized = state("sized");
    assert_eq!(sized["state"], "Error", "{sized:#}");
    assert_eq!(sized["rule"], "field-not-managed");
    let reason = sized["reason"].as_str().unwrap();
    assert!(
        reason.contains("spec.engine")
            && reason.contains("spec.size")
            && reason.contains("provider `dbaas`"),
        "{reason}"
    );
    // A change made at the DBaaS is corrected with a PATCH of that field
    // alone.
    let etag = db["etag"].as_str().unwrap().to_string();
    let (status, body) = s.server.request_with(
        "PATCH",
        "/v1/databases/ledger",
        &[("Idempotency-Key", &"e".repeat(64)), ("If-Match", &etag)],
        &json!({"fields": {"connectionLimit": 99}}).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    s.repo.write(
        "ledger.yaml",
        &small.replace("connectionLimit: 20", "connectionLimit: 30"),
    );
    s.repo.commit("30");
    TendCommand::new(&["--config", &s.config, "apply"])
        .current_dir(s.dir.path())
        .expect_code(1);
    assert_eq!(
        s.server.database("ledger").unwrap()["fields"]["connectionLimit"],
        30
    );
}

/// A database the DBaaS made itself (its fields carry no `databaseName`)
/// is adopted: it was `Blocked: requires replacement: databaseName unset
/// → "legacy"`.
#[test]
fn a_database_the_dbaas_made_itself_is_adopted() {
    let s = setup(&[], &[]);
    let made = s.server.create_directly(
        "legacy",
        json!({"engine": "postgres", "version": "16", "size": "db-small", "storageGb": 100, "region": "eu-west-1"}),
    );
    assert!(made == 201 || made == 202, "{made}");
    assert_eq!(
        s.server.database("legacy").unwrap()["fields"].get("databaseName"),
        None
    );
    s.repo.write(
        "legacy.yaml",
        &dbaas("legacy", "db-small").replace(
            "  name: legacy\n",
            "  name: legacy\n  annotations:\n    tend.dev/adopt: \"true\"\n",
        ),
    );
    s.repo.commit("adopt legacy");
    s.apply(0);
    let plan = s.plan();
    let legacy = plan["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "legacy")
        .unwrap()
        .clone();
    assert_eq!(legacy["state"], "InSync", "{legacy:#}");
    let db = s.server.database("legacy").unwrap();
    assert_eq!(
        db["labels"]["tend.dev/owner-declaration"], "legacy",
        "adopted: marked as this declaration's: {db}"
    );
    assert_eq!(s.server.count("creates"), 1, "no second database");
}

#[test]
fn a_slow_asynchronous_operation_is_polled_to_completion() {
    let s = setup(&[], &[("analytics", "db-small")]);
    s.server.faults(json!({"operationDelayMs": 1500}));
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    let db = s.server.database("analytics").unwrap();
    assert_eq!(db["status"], "ready", "{db}");
    assert_eq!(s.server.count("creates"), 1);
    let plan = s.plan();
    assert_eq!(plan["resources"][0]["state"], "InSync", "{plan:#}");
}

/// A DBaaS create that takes longer than the systemd watchdog's timeout
/// (here 3 s; 120 s in the shipped unit, against a provisioning of
/// minutes): while it is polled, no other operation finishes, and the
/// running agent still feeds the watchdog; the create completes.
#[test]
fn a_slow_asynchronous_operation_keeps_the_watchdog_fed() {
    let server = ReferenceServer::start(&[]);
    server.faults(json!({"operationDelayMs": 9000}));
    let repo = TestRepo::new();
    repo.write("analytics.yaml", &dbaas("analytics", "db-small"));
    repo.commit("analytics");
    let dir = tempfile::tempdir().unwrap();
    let port = support::git::free_port();
    let config = dbaas_config(dir.path(), &repo, &server)
        .section("providers.dbaas", "operation_timeout", "\"60s\"")
        .source("interval", "\"1h\"")
        .reconcile("resync", "\"1h\"")
        .server("listen", &format!("\"127.0.0.1:{port}\""))
        .write();
    let daemon = support::daemon::Daemon::start(&config, port, &[("WATCHDOG_USEC", "3000000")]);
    daemon.wait_for("the create", Duration::from_secs(30), || {
        server.count("creates") == 1
    });
    // More than the watchdog's timeout after the cycle began, and before
    // the operation ends.
    std::thread::sleep(Duration::from_millis(4000));
    daemon.notifications();
    std::thread::sleep(Duration::from_millis(3000));
    let late = daemon.notifications();
    assert!(
        late.iter().any(|m| m.contains("WATCHDOG=1")),
        "the watchdog went unfed while the create was polled: {late:?}\n{}",
        daemon.log()
    );
    daemon.wait_for("the database ready", Duration::from_secs(30), || {
        server
            .database("analytics")
            .is_some_and(|db| db["status"] == "ready")
    });
    assert_eq!(server.count("creates"), 1);
}

#[test]
fn two_hundred_fifty_databases_are_observed_over_pages() {
    let names: Vec<String> = (0..250).map(|i| format!("db-{i:03}")).collect();
    let declarations: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "db-small")).collect();
    let s = setup(&[], &declarations);
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((250, 250)),
        "{}",
        run.stderr
    );
    let plan = s.plan();
    let resources = plan["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 250);
    assert!(resources.iter().all(|r| r["state"] == "InSync"), "{plan:#}");
    // One page holds 100: the listing took three pages.
    let (_, first) = s.server.request("GET", "/v1/databases", "");
    assert_eq!(first["items"].as_array().unwrap().len(), 100);
    assert!(first["nextPageToken"].is_string());
    let run = s.apply(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((0, 0)),
        "{}",
        run.stderr
    );
}

#[test]
fn provider_check_passes_against_the_reference_server() {
    let all = [
        "capabilities",
        "auth",
        "problem-json",
        "create",
        "async-operations",
        "idempotency-replay",
        "idempotency-mismatch",
        "if-match-required",
        "etag-precondition",
        "patch-replay",
        "immutability",
        "unknown-field",
        "pagination",
        "delete-precondition",
        "delete-replay",
        "delete",
    ];
    for (args, token, skips) in [
        (
            &["--token", "s3cret"][..],
            Some("s3cret"),
            &["async-operations"][..],
        ),
        (&["--provisioning-delay", "300ms"][..], None, &["auth"][..]),
        // A server managing a small field set: every rule is exercised
        // with those fields; none has an immutable one.
        (
            &["--fields", "owner,comment,connectionLimit,parameters"][..],
            None,
            &["auth", "async-operations", "immutability"][..],
        ),
    ] {
        let server = ReferenceServer::start(args);
        let run = support::provider_check(&server.url(), token);
        assert_eq!(
            run.output.status.code(),
            Some(0),
            "{args:?}\n{}\n{}",
            run.stdout,
            run.stderr
        );
        let passed = support::check_rules(&run, "PASS");
        let skipped = support::check_rules(&run, "SKIP");
        for rule in all {
            let expected_skip = skips.contains(&rule);
            assert!(
                if expected_skip {
                    skipped.contains(&rule.to_string())
                } else {
                    passed.contains(&rule.to_string())
                },
                "{args:?}: {rule}: {}",
                run.stdout
            );
        }
        assert_eq!(server.stats()["databases"], 0, "the check cleans up");
        assert!(
            run.stdout.contains("PASS delete: 5 databases deleted"),
            "{}",
            run.stdout
        );
    }
}

/// Servers that break rules, each named: one without auth (checked with a
/// token), one that ignores If-Match, one that performs a replayed key's
/// request again.
#[test]
fn provider_check_names_the_rule_a_broken_server_breaks() {
    for (flag, token, rules) in [
        (None, Some("s3cret"), &["auth"][..]),
        (
            Some("--broken-replay"),
            None,
            &["idempotency-replay", "patch-replay", "delete-replay"][..],
        ),
        (
            Some("--broken-etag"),
            None,
            &[
                "if-match-required",
                "etag-precondition",
                "delete-precondition",
            ][..],
        ),
    ] {
        let server = ReferenceServer::start(flag.as_slice());
        let run = support::provider_check(&server.url(), token);
        assert_eq!(run.output.status.code(), Some(1), "{}", run.stdout);
        let failed = support::check_rules(&run, "FAIL");
        for rule in rules {
            assert!(
                failed.contains(&rule.to_string()),
                "{flag:?}: {rule}: {}",
                run.stdout
            );
        }
    }
}

/// docs/openapi.yaml names every request of the contract, and what the
/// reference server answers validates against its schemas.
#[test]
fn the_openapi_document_describes_what_the_server_answers() {
    let text = std::fs::read_to_string(support::repo_root().join("docs/openapi.yaml")).unwrap();
    let doc: serde_json::Value = serde_norway::from_str(&text).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for (path, method) in [
        ("/v1/capabilities", "get"),
        ("/v1/databases", "get"),
        ("/v1/databases", "post"),
        ("/v1/databases/{name}", "get"),
        ("/v1/databases/{name}", "patch"),
        ("/v1/databases/{name}", "delete"),
        ("/v1/operations/{id}", "get"),
    ] {
        assert!(doc["paths"][path][method].is_object(), "{method} {path}");
    }
    // Every status code the document names, on the requests that can
    // answer it.
    for (path, method, codes) in [
        (
            "/v1/databases",
            "post",
            &["400", "401", "403", "409", "422", "429", "503"][..],
        ),
        (
            "/v1/databases/{name}",
            "patch",
            &[
                "400", "401", "403", "404", "412", "422", "428", "429", "503",
            ][..],
        ),
        (
            "/v1/databases/{name}",
            "delete",
            &[
                "400", "401", "403", "404", "412", "422", "428", "429", "503",
            ][..],
        ),
    ] {
        for code in codes {
            assert!(
                doc["paths"][path][method]["responses"][code].is_object(),
                "{method} {path} {code}"
            );
        }
    }
    // The key's form is the one tend and the checker send; a GET's ETag
    // links to the If-Match of a PATCH and a DELETE (for stateful
    // testers); the ETag header is required.
    let key = &doc["components"]["parameters"]["IdempotencyKey"]["schema"];
    assert_eq!(key["pattern"], "^[0-9a-f]{64}$", "{key}");
    let links = &doc["components"]["responses"]["Database"]["links"];
    for (link, operation) in [
        ("UpdateDatabase", "updateDatabase"),
        ("DeleteDatabase", "deleteDatabase"),
    ] {
        assert_eq!(links[link]["operationId"], operation, "{links}");
        assert_eq!(
            links[link]["parameters"]["If-Match"],
            "$response.header.ETag"
        );
    }
    assert_eq!(doc["components"]["headers"]["ETag"]["required"], true);
    let name = &doc["components"]["schemas"]["CreateDatabase"]["properties"]["name"];
    assert_eq!(name["minLength"], 1, "{name}");
    let validator = |schema: &str| {
        let root = json!({
            "$ref": format!("#/components/schemas/{schema}"),
            "components": doc["components"].clone(),
        });
        jsonschema::validator_for(&root).unwrap()
    };
    let s = setup(
        &["--provisioning-delay", "1s"],
        &[("analytics", "db-small")],
    );
    s.apply(0);
    let (_, capabilities) = s.server.request("GET", "/v1/capabilities", "");
    let (_, page) = s.server.request("GET", "/v1/databases", "");
    let database = s.server.database("analytics").unwrap();
    let (_, missing) = s.server.request("GET", "/v1/databases/absent", "");
    let (status, accepted) = s.server.request("POST", "/v1/databases", "");
    assert_eq!(status, 400, "no Idempotency-Key: {accepted}");
    for (schema, value) in [
        ("Capabilities", &capabilities),
        ("DatabasePage", &page),
        ("Database", &database),
        ("Problem", &missing),
        ("Problem", &accepted),
    ] {
        let v = validator(schema);
        let errors: Vec<String> = v.iter_errors(value).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{schema}: {errors:?}\n{value:#}");
    }
}

/// examples/dbaas.toml runs the example declarations (the DBaaS one,
/// examples/databases/analytics.yaml, among them) at the reference server.
#[test]
fn the_dbaas_example_runs_against_the_reference_server() {
    let server = ReferenceServer::start(&[]);
    let repo = TestRepo::new();
    let examples = support::repo_root().join("examples/databases");
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        repo.write(
            &format!("examples/databases/{name}"),
            &std::fs::read_to_string(&path).unwrap(),
        );
    }
    repo.commit("examples");
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(support::repo_root().join("examples/dbaas.toml")).unwrap();
    assert!(text.contains("url = \"..\"") && text.contains("http://127.0.0.1:8080"));
    let text = text
        .replace("url = \"..\"", &format!("url = \"{}\"", repo.url()))
        .replace("http://127.0.0.1:8080", &server.url())
        .replace("../target/tend-dbaas-example-state", "state");
    let config = dir.path().join("dbaas.toml");
    std::fs::write(&config, text).unwrap();
    let config = config.display().to_string();
    TendCommand::new(&["--config", &config, "apply"]).expect_code(0);
    let plan = TendCommand::new(&["--config", &config, "plan", "--format", "json"])
        .expect_code(0)
        .json();
    let resources = plan["resources"].as_array().unwrap();
    assert!(resources.len() >= 6, "{plan:#}");
    assert!(resources.iter().all(|r| r["state"] == "InSync"), "{plan:#}");
    let analytics = server.database("analytics").unwrap();
    assert_eq!(analytics["fields"]["size"], "db-medium", "{analytics}");
    assert_eq!(analytics["fields"]["highAvailability"], true, "{analytics}");
}

/// The reference server keeps what it committed across a restart: the
/// databases, and the idempotency keys (a replay after the restart still
/// returns the original result).
#[test]
fn the_reference_server_keeps_databases_and_keys_across_a_restart() {
    let s = setup(&[], &[("analytics", "db-small")]);
    s.apply(0);
    let before = s.server.database("analytics").unwrap();
    let old_url = s.server.url();
    let Setup {
        server,
        repo,
        dir,
        config,
    } = s;
    let server = server.restart(&[]);
    let text = std::fs::read_to_string(&config).unwrap();
    let path = dir.path().join("tend.toml");
    std::fs::write(&path, text.replace(&old_url, &server.url())).unwrap();
    let after = server.database("analytics").unwrap();
    assert_eq!(after["id"], before["id"]);
    assert_eq!(after["etag"], before["etag"]);
    // tend's next cycle finds everything as it left it: no operation.
    let run = TendCommand::new(&[
        "--config",
        &path.display().to_string(),
        "apply",
        "--format",
        "json",
    ])
    .current_dir(dir.path())
    .expect_code(0);
    assert_eq!(
        support::applied(&run.json()),
        Some((0, 0)),
        "{}",
        run.stderr
    );
    // The create's idempotency key survived the restart.
    let uses = server.stats()["keyUses"].clone();
    assert_eq!(uses.as_object().unwrap().len(), 1, "{uses}");
    drop(repo);
}

/// What adapter authors copy enforces what the document says (it accepted
/// each of these): a field of the wrong type, a change to an immutable
/// field, an empty name, a key that is not 64 hex characters, and a
/// method a path does not take.
#[test]
fn the_reference_server_enforces_what_the_document_says() {
    let server = ReferenceServer::start(&[]);
    let key = |n: u8| format!("{n:064x}");
    let post = |k: &str, body: serde_json::Value| {
        server.request_with(
            "POST",
            "/v1/databases",
            &[("Idempotency-Key", k)],
            &body.to_string(),
        )
    };
    let (status, body) = post(
        &key(1),
        json!({"name": "x", "fields": {"storageGb": "lots"}}),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("storageGb"),
        "{body}"
    );
    assert_eq!(post(&key(2), json!({"name": "", "fields": {}})).0, 422);
    for bad in ["", "short", &"a".repeat(300), &"A".repeat(64)] {
        let (status, body) = post(bad, json!({"name": "y", "fields": {}}));
        assert_eq!(status, 400, "key {bad:?}: {body}");
    }
    let (status, made) = post(
        &key(3),
        json!({"name": "z", "fields": {"engine": "postgres", "size": "db-small"}}),
    );
    assert_eq!(status, 201, "{made}");
    let etag = made["etag"].as_str().unwrap().to_string();
    let (status, body) = server.request_with(
        "PATCH",
        "/v1/databases/z",
        &[("Idempotency-Key", &key(4)), ("If-Match", &etag)],
        &json!({"fields": {"engine": "mysql"}}).to_string(),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("immutable"),
        "{body}"
    );
    let (status, body) = server.request_with(
        "POST",
        "/v1/databases/z",
        &[("Idempotency-Key", &key(5))],
        "{}",
    );
    assert_eq!(status, 405, "{body}");
    assert_eq!(
        server.database("z").unwrap()["fields"]["engine"],
        "postgres",
        "nothing changed"
    );
}
