//! What a new user's first hour found (docs and behaviour disagreeing),
//! each reproduced against the real binary.

use crate::support;
use crate::support::tend;

use support::TendCommand;
use support::config::TendConfig;
use support::git::{TestRepo, manifest};

fn state_of(config: &str, name: &str) -> (String, String) {
    let plan = tend(config, &["plan", "--format", "json"], 0).json();
    let r = plan["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {plan:#}"))
        .clone();
    (
        r["state"].as_str().unwrap().to_string(),
        r["reason"].as_str().unwrap().to_string(),
    )
}

#[test]
fn unconvergeable_is_a_state_tend_leaves_when_something_changes() {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 300));
    repo.commit("orders wants 300 connections");
    let dir = tempfile::tempdir().unwrap();
    // The provider stores at most 200 and says nothing.
    let config = TendConfig::new(dir.path(), &repo.url())
        .faults("max_connection_limit", "200")
        // What the provider did to tend's own write is corrected at once.
        .reconcile("drift_grace", "\"0s\"")
        .write()
        .display()
        .to_string();
    let stuck = |config: &str| {
        for _ in 0..4 {
            TendCommand::new(&["--config", config, "apply"]).expect_code(2);
        }
        let (state, reason) = state_of(config, "orders");
        assert_eq!(state, "Unconvergeable", "{reason}");
        assert!(
            reason.contains("tend state reset-attempts orders"),
            "{reason}"
        );
    };
    stuck(&config);

    // A new declared value is a new situation: applied at once.
    repo.write("orders.yaml", &manifest("orders", 150));
    repo.commit("orders: 150");
    let applied = tend(&config, &["apply"], 0);
    assert!(
        applied.stderr.contains("update orders: done"),
        "{}",
        applied.stderr
    );
    assert_eq!(state_of(&config, "orders").0, "InSync");

    // Back to an impossible value, stuck again; someone changes the value
    // at the provider: tried again.
    repo.write("orders.yaml", &manifest("orders", 300));
    repo.commit("orders: 300 again");
    stuck(&config);
    tend(
        &config,
        &["sandbox", "edit", "orders", "--set", "connectionLimit=120"],
        0,
    );
    let (state, reason) = state_of(&config, "orders");
    assert_eq!(state, "Drifted", "{reason}");

    // And the operator's way out, beside everything else.
    tend(
        &config,
        &["sandbox", "edit", "orders", "--set", "connectionLimit=200"],
        0,
    );
    let (state, _) = state_of(&config, "orders");
    assert_eq!(state, "Unconvergeable");
    let reset = tend(&config, &["state", "reset-attempts", "orders"], 0);
    assert!(
        reset.stdout.contains("tries its fields again"),
        "{}",
        reset.stdout
    );
    let (state, reason) = state_of(&config, "orders");
    assert_ne!(state, "Unconvergeable", "{reason}");
    let none = tend(&config, &["state", "reset-attempts", "orders"], 0);
    assert!(
        none.stdout.contains("no failed update attempts"),
        "{}",
        none.stdout
    );
}

fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

/// Without `[status] reports_dir`, reports go to `<state_dir>/reports`:
/// `latest.json`, `latest.md` (titled for the command that wrote it) and
/// `latest.html`, and a history that grows only when the content changes
/// and never past `keep_reports`.
#[test]
fn reports_go_to_the_state_dir_by_default_with_a_bounded_history() {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10));
    repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .status("keep_reports", "3")
        .write()
        .display()
        .to_string();
    tend(&config, &["apply"], 0);
    let reports = dir.path().join("state/reports");
    let latest = read_json(&reports.join("latest.json"));
    assert_eq!(latest["resources"][0]["state"], "InSync", "{latest:#}");
    assert!(
        latest["generatedAt"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert!(
        latest["resources"][0]["observedAt"].is_string(),
        "{latest:#}"
    );
    let md = std::fs::read_to_string(reports.join("latest.md")).unwrap();
    assert!(md.starts_with("### tend apply\n"), "{md}");
    let html = std::fs::read_to_string(reports.join("latest.html")).unwrap();
    assert!(html.starts_with("<!doctype html>") && html.contains("orders"));
    let history = || {
        let mut names: Vec<String> = std::fs::read_dir(reports.join("history"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(history().len(), 1);
    // Nothing changed: no new history entry, though latest.json is new.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    tend(&config, &["apply"], 0);
    assert_eq!(history().len(), 1, "{:?}", history());
    assert_ne!(
        read_json(&reports.join("latest.json"))["generatedAt"],
        latest["generatedAt"]
    );
    // Five changes: the history keeps the newest three, in time order.
    for limit in 11..16 {
        repo.write("orders.yaml", &manifest("orders", limit));
        repo.commit("more connections");
        tend(&config, &["apply"], 0);
    }
    let kept = history();
    assert_eq!(kept.len(), 3, "{kept:?}");
    let newest = read_json(&reports.join("history").join(&kept[2]));
    assert_eq!(newest["source"]["commit"], repo.head());
    assert!(kept.windows(2).all(|w| w[0] < w[1]), "{kept:?}");
}

/// When the branch cannot be read, `plan` and `apply` still report: the
/// source error, since when it fails, and the resources decided from the
/// last accepted commit. Before any commit was accepted, the report has
/// the error and no resources.
#[test]
fn a_failing_source_is_reported_with_the_last_accepted_commit() {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10));
    let accepted = repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    let write = |branch: &str| {
        TendConfig::new(dir.path(), &repo.url())
            .source("branch", &format!("\"{branch}\""))
            .write()
            .display()
            .to_string()
    };
    // Never accepted anything: the error, no resources, exit 1.
    let config = write("nope");
    let plan = tend(&config, &["plan", "--format", "json"], 1).json();
    assert!(
        plan["source"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("branch `nope` does not exist"),
        "{plan:#}"
    );
    assert_eq!(plan["resources"].as_array().unwrap().len(), 0);
    assert!(plan["source"]["commit"].is_null());

    let config = write("main");
    tend(&config, &["apply"], 0);
    // The branch goes away: the last accepted commit stays in force.
    let config = write("gone");
    let plan = tend(&config, &["plan", "--format", "json"], 1).json();
    assert_eq!(plan["source"]["commit"], accepted.as_str());
    assert_eq!(plan["resources"][0]["name"], "orders");
    assert_eq!(plan["resources"][0]["state"], "InSync");
    let error = &plan["source"]["error"];
    assert!(
        error["since"].is_string() && error["failures"] == 1,
        "{error:#}"
    );
    let text = tend(&config, &["plan"], 1).stdout;
    assert!(
        text.contains("SOURCE ERROR since") && text.contains("last accepted commit"),
        "{text}"
    );

    // apply writes it; a later apply keeps since when it fails.
    tend(&config, &["apply"], 1);
    let latest = dir.path().join("state/reports/latest.json");
    let first = read_json(&latest)["source"]["error"]["since"].clone();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    tend(&config, &["apply"], 1);
    let second = read_json(&latest);
    assert_eq!(second["source"]["error"]["since"], first, "{second:#}");
    assert_eq!(second["resources"][0]["name"], "orders");

    // Back to a readable branch: the error is gone.
    let config = write("main");
    tend(&config, &["apply"], 0);
    assert!(read_json(&latest)["source"].get("error").is_none());
}

/// An `http` provider whose endpoint is not an HTTP URL is a configuration
/// error (78) naming the provider; one that cannot be reached is a failed
/// observation (1), never a configuration error.
#[test]
fn an_http_provider_endpoint_is_checked_at_start() {
    let repo = TestRepo::new();
    repo.write(
        "orders.yaml",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\nspec:\n  provider: dbaas\n  size: db-small\n",
    );
    repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    let config = |endpoint: &str| {
        TendConfig::new(dir.path(), &repo.url())
            .section("providers.dbaas", "kind", "\"http\"")
            .section("providers.dbaas", "endpoint", &format!("\"{endpoint}\""))
            .write()
            .display()
            .to_string()
    };
    let bad = config("dbaas.internal:8080");
    for command in [&["plan"][..], &["apply"], &["explain", "orders"]] {
        let run = tend(&bad, command, 78);
        assert!(
            run.stderr.contains("[providers.dbaas]") && run.stderr.contains("not an http://"),
            "{}",
            run.stderr
        );
    }
    let unreachable = config("http://127.0.0.1:9");
    let run = tend(&unreachable, &["plan"], 1);
    assert!(
        run.stdout.contains("could not observe `orders`") && run.stdout.contains("127.0.0.1:9"),
        "{}",
        run.stdout
    );
}

/// Human output has one vocabulary and never Rust's debug formatting.
#[test]
fn explain_and_plan_speak_one_vocabulary() {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10));
    repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .write()
        .display()
        .to_string();
    tend(&config, &["apply"], 0);
    tend(
        &config,
        &["sandbox", "edit", "orders", "--set", "connectionLimit=99"],
        0,
    );
    let explain = tend(&config, &["explain", "orders"], 0).stdout;
    let plan = tend(&config, &["plan"], 0).stdout;
    for out in [&explain, &plan] {
        for debug in [
            "OutOfBand",
            "Declared)",
            "observed null",
            "Some(",
            "None)",
            "\"}",
        ] {
            assert!(!out.contains(debug), "`{debug}` in:\n{out}");
        }
    }
    assert!(
        explain.contains("connectionLimit declared 10 observed 99 (out-of-band)"),
        "{explain}"
    );
    assert!(explain.contains("decision:    Drifted / Hold"), "{explain}");
    assert!(
        plan.contains("drift connectionLimit: declared 10, observed 99 (out-of-band)"),
        "{plan}"
    );
}
