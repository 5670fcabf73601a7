//! The alerting rules that ship with tend (`examples/prometheus/`): they
//! load, fire as their unit tests say (promtool, from Debian's
//! `prometheus`; `.ci/run` installs it when missing), name only metrics the
//! agent exports, and link runbook pages that exist.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::repo_root;

fn rules_dir() -> PathBuf {
    repo_root().join("examples/prometheus")
}

fn promtool() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("promtool"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "promtool is not on PATH: `apt-get update && apt-get install -y prometheus` (Debian's package ships it; .ci/run does this)"
            )
        })
}

fn run(args: &[&str], dir: &Path) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {}:\n{text}", args.join(" "));
    text
}

#[test]
fn the_shipped_rules_load_and_fire_as_their_tests_say() {
    let checked = run(&["check", "rules", "tend-rules.yml"], &rules_dir());
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run(&["test", "rules", "tend-rules.test.yml"], &rules_dir());
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_rule_names_an_exported_metric_and_an_existing_runbook() {
    let families = support::metric_families();
    let text = std::fs::read_to_string(rules_dir().join("tend-rules.yml")).unwrap();
    let rules: serde_json::Value =
        serde_json::to_value(serde_norway::from_str::<serde_norway::Value>(&text).unwrap())
            .unwrap();
    let mut alerts = 0;
    for rule in rules["groups"][0]["rules"].as_array().unwrap() {
        alerts += 1;
        let name = rule["alert"].as_str().unwrap();
        let expr = rule["expr"].as_str().unwrap();
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if let Some(metric) = word.strip_prefix("tend_") {
                let family = format!("tend_{}", metric.strip_suffix("_total").unwrap_or(metric));
                assert!(
                    families.contains(&family),
                    "{name}: the agent exports no metric `{word}` ({families:?})"
                );
            }
        }
        let runbook = rule["annotations"]["runbook_url"].as_str().unwrap();
        assert!(
            repo_root().join(runbook).is_file(),
            "{name}: {runbook} does not exist"
        );
    }
    assert!(alerts >= 14, "{alerts} alerts");
}
