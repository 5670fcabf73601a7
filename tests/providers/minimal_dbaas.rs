//! A second DBaaS written from docs/provider-http-api.md alone
//! (tests/support/minimal_dbaas.rs), managing another field set than the
//! reference server (no `databaseName`, no `engine`): tend converges
//! against it, `tend provider check` passes it, and a careless variant
//! (no auth, no `If-Match`, no key replay) fails the checker naming each
//! rule.

use crate::support;

use support::TendCommand;
use support::config::TendConfig;
use support::git::TestRepo;
use support::minimal_dbaas::{Lax, MinimalDbaas};

const LEDGER: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: ledger
spec:
  owner: ledger_app
  comment: The ledger
  connectionLimit: 20
  region: eu-west-1
  parameters:
    work_mem: 8MB
";

#[test]
fn tend_converges_against_a_second_independent_server() {
    let server = MinimalDbaas::start(Lax::default());
    let repo = TestRepo::new();
    repo.write("ledger.yaml", LEDGER);
    repo.commit("ledger");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), &server.token).unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .without_section("providers.sandbox")
        .section("providers.dbaas", "kind", "\"http\"")
        .section(
            "providers.dbaas",
            "endpoint",
            &format!("\"{}\"", server.url()),
        )
        .section("providers.dbaas", "token_file", "\"token\"")
        .write()
        .display()
        .to_string();
    let tend = |args: &[&str], code: i32| {
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        TendCommand::new(&all).expect_code(code)
    };
    let run = tend(&["apply", "--format", "json"], 0);
    assert_eq!(
        support::applied(&run.json()),
        Some((1, 1)),
        "{}",
        run.stderr
    );
    let state =
        |code: i32| tend(&["plan", "--format", "json"], code).json()["resources"][0].clone();
    assert_eq!(state(0)["state"], "InSync");
    // A change in Git is applied with a PATCH the server accepts.
    repo.write(
        "ledger.yaml",
        &LEDGER.replace("connectionLimit: 20", "connectionLimit: 35"),
    );
    repo.commit("35");
    tend(&["apply"], 0);
    assert_eq!(state(0)["state"], "InSync");
    // A change of the immutable region is blocked, never sent.
    repo.write("ledger.yaml", &LEDGER.replace("eu-west-1", "us-east-1"));
    repo.commit("move it");
    assert_eq!(state(0)["rule"], "requires-replacement");
    // A field this server does not manage is refused at plan time.
    repo.write(
        "ledger.yaml",
        &LEDGER.replace(
            "  region: eu-west-1\n",
            "  region: eu-west-1\n  size: db-small\n",
        ),
    );
    repo.commit("size");
    let refused = state(1);
    assert_eq!(refused["rule"], "field-not-managed", "{refused:#}");
}

#[test]
fn the_checker_passes_the_second_server_and_names_what_a_careless_one_breaks() {
    let server = MinimalDbaas::start(Lax::default());
    let run = support::provider_check(&server.url(), Some(&server.token));
    assert_eq!(run.output.status.code(), Some(0), "{}", run.stdout);
    assert!(
        support::check_rules(&run, "FAIL").is_empty(),
        "{}",
        run.stdout
    );
    for rule in [
        "auth",
        "immutability",
        "patch-replay",
        "delete-replay",
        "unknown-field",
    ] {
        assert!(
            support::check_rules(&run, "PASS").contains(&rule.to_string()),
            "{rule}: {}",
            run.stdout
        );
    }

    let careless = MinimalDbaas::start(Lax {
        no_auth: true,
        no_if_match: true,
        no_replay: true,
    });
    let run = support::provider_check(&careless.url(), Some(&careless.token));
    assert_eq!(run.output.status.code(), Some(1), "{}", run.stdout);
    let failed = support::check_rules(&run, "FAIL");
    for rule in [
        "auth",
        "if-match-required",
        "etag-precondition",
        "idempotency-replay",
    ] {
        assert!(failed.contains(&rule.to_string()), "{rule}: {}", run.stdout);
    }
}
