//! `tend plan` end to end through the binary, on the sandbox provider:
//! out-of-band drift made with `tend sandbox edit` shows up with origin
//! `out-of-band` and exit code 2; an override annotation turns the state to
//! `Overridden`.

use crate::support;

use std::fs;
use std::path::Path;

use serde_json::Value;
use support::TendCommand;
use support::config::TendConfig;
use support::git::TestRepo;

const ORDERS: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: orders
spec:
  owner: orders_app
  connectionLimit: 200
";

fn setup(dir: &Path) -> (TestRepo, String) {
    let repo = TestRepo::new();
    repo.write("databases/orders.yaml", ORDERS);
    repo.commit("orders");
    let config = TendConfig::new(dir, &repo.url())
        .top("agent_id", Some("\"e2e-agent\""))
        .source("path", "\"databases\"")
        .write();
    (repo, config.display().to_string())
}

fn plan_json(config: &str, code: i32) -> Value {
    let run = TendCommand::new(&[
        "--config",
        config,
        "plan",
        "--format",
        "json",
        "--detailed-exitcode",
    ])
    .expect_code(code);
    serde_json::from_str(&run.stdout).unwrap()
}

#[test]
fn out_of_band_drift_is_reported_then_an_override_turns_it_overridden() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, config) = setup(dir.path());

    // Nothing exists yet: a create is pending.
    let report = plan_json(&config, 2);
    assert_eq!(report["resources"][0]["state"], "Missing");
    assert_eq!(report["resources"][0]["action"], "Create");
    assert_eq!(report["resources"][0]["operation"]["kind"], "create");

    // The database exists, owned by this agent, exactly as declared: in sync.
    TendCommand::new(&[
        "--config",
        &config,
        "sandbox",
        "edit",
        "orders",
        "--create",
        "--set",
        "owner=orders_app",
        "--set",
        "connectionLimit=200",
        "--label",
        "tend.dev/owner-agent=e2e-agent",
        "--label",
        "tend.dev/owner-declaration=orders",
    ])
    .expect_code(0);
    let report = plan_json(&config, 0);
    assert_eq!(report["resources"][0]["state"], "InSync");
    assert_eq!(report["summary"]["inSync"], 1);

    // An operator raises the limit at the dashboard.
    TendCommand::new(&[
        "--config",
        &config,
        "sandbox",
        "edit",
        "orders",
        "--set",
        "connectionLimit=500",
    ])
    .expect_code(0);
    let report = plan_json(&config, 2);
    let r = &report["resources"][0];
    assert_eq!(r["state"], "Drifted");
    assert_eq!(r["action"], "Hold");
    assert_eq!(r["drift"][0]["field"], "connectionLimit");
    assert_eq!(r["drift"][0]["desired"], 200);
    assert_eq!(r["drift"][0]["observed"], 500);
    assert_eq!(r["drift"][0]["origin"], "out-of-band");
    assert!(r["reason"].as_str().unwrap().contains("drift_grace"));

    // They commit an override: the drift is now Overridden, still listed.
    let with_override = ORDERS.replace(
        "  name: orders\n",
        "  name: orders\n  annotations:\n    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: INC-7 traffic spike\n    tend.dev/override-expires: 2099-01-01T00:00:00Z\n",
    );
    repo.write("databases/orders.yaml", &with_override);
    let commit = repo.commit("override during INC-7");
    let report = plan_json(&config, 2);
    let r = &report["resources"][0];
    assert_eq!(r["state"], "Overridden");
    assert_eq!(r["action"], "None");
    assert_eq!(r["override"]["source"], "annotation");
    assert_eq!(r["override"]["kind"], "ignore-fields");
    assert_eq!(r["override"]["fields"][0], "connectionLimit");
    assert_eq!(r["override"]["reason"], "INC-7 traffic spike");
    assert_eq!(r["override"]["expires"], "2099-01-01T00:00:00Z");
    assert_eq!(r["override"]["expired"], false);
    // The contract's camelCase key, never the Rust field's name.
    assert!(
        r["override"]["firstSeen"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
            && r["override"].get("first_seen").is_none(),
        "{r:#}"
    );
    assert_eq!(report["summary"]["overridden"], 1);
    assert_eq!(
        report["source"]["commit"],
        commit.as_str(),
        "the report names the commit it planned"
    );

    // explain names the rule and the override.
    let run = TendCommand::new(&["--config", &config, "explain", "orders"]).expect_code(0);
    assert!(
        run.stdout.contains("rule:        ignored-drift"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("INC-7 traffic spike"), "{}", run.stdout);
    assert!(
        run.stdout.contains("tend marker: agent `e2e-agent`"),
        "{}",
        run.stdout
    );
    // The database by name; the provider's id said as such.
    assert!(
        run.stdout
            .contains("observed:    database `orders` (ready) at ")
            && run.stdout.contains("; provider id "),
        "{}",
        run.stdout
    );
}

#[test]
fn the_json_report_follows_the_contract_field_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, config) = setup(dir.path());
    repo.write(
        "databases/broken.yaml",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: Broken\n",
    );
    repo.commit("broken");
    let report = plan_json(&config, 1);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(report["formatVersion"], 1);
    assert_eq!(
        keys(&report),
        [
            "agent",
            "errors",
            "formatVersion",
            "generatedAt",
            "resources",
            "source",
            "summary"
        ]
    );
    assert!(
        humantime::parse_rfc3339(report["generatedAt"].as_str().unwrap()).is_ok(),
        "{}",
        report["generatedAt"]
    );
    assert_eq!(keys(&report["agent"]), ["id", "version"]);
    assert_eq!(report["agent"]["id"], "e2e-agent");
    assert_eq!(
        keys(&report["source"]),
        ["branch", "commit", "commitTime", "url"]
    );
    assert_eq!(
        keys(&report["summary"]),
        [
            "blocked",
            "deleting",
            "drifted",
            "errors",
            "inSync",
            "missing",
            "overridden",
            "total"
        ]
    );
    let r = &report["resources"][0];
    assert_eq!(
        keys(r),
        [
            "action",
            "drift",
            "file",
            "name",
            "observedAt",
            "operation",
            "override",
            "reason",
            "rule",
            "state"
        ]
    );
    assert_eq!(r["file"], "databases/orders.yaml");
    assert_eq!(keys(&r["operation"]), ["id", "kind", "state"]);
    assert_eq!(r["operation"]["id"].as_str().unwrap().len(), 64);
    assert!(r["override"].is_null());
    // The unparsable declaration is an error for that file only.
    assert_eq!(report["summary"]["total"], 1);
    assert_eq!(report["summary"]["errors"], 1);
    let e = &report["errors"][0];
    assert_eq!(keys(e), ["column", "file", "line", "message"]);
    assert_eq!(e["file"], "databases/broken.yaml");
    assert_eq!(
        (e["line"].as_u64(), e["column"].as_u64()),
        (Some(4), Some(9))
    );
}

#[test]
fn an_unreadable_source_is_an_error_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tend.toml");
    fs::write(
        &config,
        "[source]\nurl = \"file:///nonexistent/repo\"\n[providers.sandbox]\nkind = \"sandbox\"\nstate_dir = \"x\"\n",
    )
    .unwrap();
    let run =
        TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(78);
    assert!(run.stderr.contains("state_dir"), "{}", run.stderr);
    fs::write(
        &config,
        "state_dir = \"state\"\n[source]\nurl = \"file:///nonexistent/repo\"\n[providers.sandbox]\nkind = \"sandbox\"\n",
    )
    .unwrap();
    let run = TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(1);
    assert!(
        run.stderr.contains("cannot fetch file:///nonexistent/repo"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_missing_config_is_a_configuration_error() {
    let run = TendCommand::new(&["--config", "/nonexistent/tend.toml", "plan"]).expect_code(78);
    assert!(
        run.stderr
            .contains("cannot read configuration /nonexistent/tend.toml"),
        "{}",
        run.stderr
    );
}
