//! What a new user's first hour found (docs and behaviour disagreeing),
//! each reproduced against the real binary.

mod support;

use support::TendCommand;
use support::config::TendConfig;
use support::git::{TestRepo, manifest};

fn tend(config: &str, args: &[&str], code: i32) -> support::RunOutput {
    let mut all = vec!["--config", config];
    all.extend(args);
    TendCommand::new(&all).expect_code(code)
}

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
