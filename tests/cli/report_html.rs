//! `latest.html` in a real browser: headless Chromium (Debian's
//! `chromium`; `.ci/run` installs it when missing) loads the file the way
//! an operator opens it, and its DOM holds what the report says. A
//! screenshot goes to `target/report-html/latest.png` for a person to look
//! at.

use crate::support;

use support::TendCommand;
use support::config::TendConfig;
use support::git::{TestRepo, manifest};

const BILLING: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: billing
  annotations:
    tend.dev/ignore-fields: connectionLimit
    tend.dev/override-reason: \"INC-4821: invoice run <needs> more\"
    tend.dev/override-expires: 72h
spec:
  connectionLimit: 50
";

/// An emergency override that ran out: someone has to decide.
const LEGACY: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: legacy
  annotations:
    tend.dev/ignore-fields: connectionLimit
    tend.dev/override-reason: \"INC-17: migration\"
    tend.dev/override-expires: \"2026-01-01T00:00:00Z\"
    tend.dev/override-on-expiry: hold
spec:
  connectionLimit: 5
";

use support::browser::browse;

#[test]
fn latest_html_in_a_browser_shows_the_drift_and_the_overrides_reason() {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10));
    repo.write("billing.yaml", BILLING);
    repo.write("legacy.yaml", LEGACY);
    repo.commit("three databases");
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .write()
        .display()
        .to_string();
    TendCommand::new(&["--config", &config, "apply"]).expect_code(0);
    for (name, limit) in [("orders", "321"), ("billing", "500")] {
        TendCommand::new(&[
            "--config",
            &config,
            "sandbox",
            "edit",
            name,
            "--set",
            &format!("connectionLimit={limit}"),
        ])
        .expect_code(0);
    }
    TendCommand::new(&["--config", &config, "apply"]).expect_code(2);
    let page = dir.path().join("state/reports/latest.html");
    let url = format!("file://{}", page.display());
    let profile = tempfile::tempdir().unwrap();

    let dom = browse(profile.path(), &["--dump-dom"], &url);
    let dom = String::from_utf8_lossy(&dom.stdout);
    // Each row of a table as its cells' text, `|`-separated.
    let rows = |id: &str| -> Vec<String> {
        let table = dom
            .split(&format!("<table id=\"{id}\">"))
            .nth(1)
            .and_then(|t| t.split("</table>").next())
            .unwrap_or_else(|| panic!("no {id} table in the DOM:\n{dom}"));
        table
            .split("<tr>")
            .skip(2)
            .map(|row| {
                row.split("</td>")
                    .map(|cell| {
                        let mut text = String::new();
                        let mut in_tag = false;
                        for c in cell.chars() {
                            match c {
                                '<' => in_tag = true,
                                '>' => in_tag = false,
                                c if !in_tag => text.push(c),
                                _ => {}
                            }
                        }
                        text
                    })
                    .filter(|t| !t.is_empty())
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    };
    let drift = rows("drift");
    for expected in [
        "orders|connectionLimit|10|321|out-of-band",
        "billing|connectionLimit|50|500|out-of-band, ignored by the override: not corrected",
    ] {
        assert!(
            drift.iter().any(|r| r == expected),
            "{expected}\nnot in\n{drift:#?}"
        );
    }
    let overrides = rows("overrides");
    // Escaped in the file, text in the DOM: the browser shows the reason
    // as written, and `<needs>` opened no element.
    assert!(
        overrides
            .iter()
            .any(|r| r.starts_with("billing|annotation|ignore-fields connectionLimit|INC-4821: invoice run &lt;needs&gt; more|")),
        "{overrides:#?}"
    );
    assert!(!dom.contains("<needs>"));
    // Times are absolute, their distance said as of the report: a page
    // read a day later does not claim "now" or "35s ago".
    assert!(
        overrides[0].contains("(in 2days 23h as of this report)")
            || overrides[0].contains("(in 3days as of this report)"),
        "{overrides:#?}"
    );
    assert!(!dom.contains("(now)"), "{dom}");
    assert!(!dom.contains("s ago)"), "{dom}");
    // The expired override needs attention, and the title counts it.
    assert!(
        dom.contains("3 resources, 1 need attention</title>"),
        "{}",
        dom.lines().find(|l| l.contains("<title>")).unwrap_or("")
    );
    let attention = rows("attention");
    assert!(
        attention.iter().any(|r| r.starts_with("legacy|")),
        "{attention:#?}"
    );

    let shots = support::repo_root().join("target/report-html");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("latest.png");
    let _ = std::fs::remove_file(&shot);
    let out = browse(
        profile.path(),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=414,1400",
        ],
        &url,
    );
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot at {} ({e}): {}",
            shot.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
}
