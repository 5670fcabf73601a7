//! Schemathesis (property-based and stateful testing from
//! docs/openapi.yaml, every check) against the reference server: what the
//! document describes and what the server answers agree. The answers the
//! contract makes legitimate for a schema-valid request are configured
//! in tests/contract/schemathesis.toml, one reason each.

use crate::support;

use std::process::Command;

use support::reference::ReferenceServer;

/// The Schemathesis CLI: on PATH, or where .ci/run installs it.
fn schemathesis() -> String {
    for candidate in ["schemathesis", "/opt/schemathesis/bin/schemathesis"] {
        if Command::new(candidate)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return candidate.to_string();
        }
    }
    panic!(
        "Schemathesis is missing: install it from PyPI (`python3 -m venv /opt/schemathesis && /opt/schemathesis/bin/pip install schemathesis`, as .ci/run does)"
    );
}

#[test]
fn schemathesis_finds_nothing_against_the_reference_server() {
    let tool = schemathesis();
    let server = ReferenceServer::start(&["--token", "contract-token"]);
    let root = support::repo_root();
    // Its caches (.hypothesis) go to a scratch directory, not the tree.
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(&tool)
        .arg("--config-file")
        .arg(root.join("tests/contract/schemathesis.toml"))
        .arg("--no-color")
        .arg("run")
        .arg(root.join("docs/openapi.yaml"))
        .args(["--url", &server.url(), "--checks", "all"])
        .args(["-H", "Authorization: Bearer contract-token"])
        .current_dir(scratch.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("generated,") || l.contains(" ST"))
        .collect();
    println!("{}", summary.join("\n"));
    assert!(out.status.success(), "Schemathesis found failures:\n{text}");
    assert!(text.contains("generated,"), "{text}");
}
