//! A fleet's report stays a page a person reads: at 100,000 resources each
//! rendering lists what needs attention and counts what is in sync.

use super::html;
use super::render;
use super::report::Report;

/// A report of `n` resources, one in `every` of them with something to
/// say (drifted, blocked, overridden and expiring, in turn), the rest in
/// sync.
fn fleet(n: usize, every: usize) -> Report {
    let resources: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let name = format!("tenant-{i:06}");
            let mut r = serde_json::json!({
                "name": name, "file": format!("tenants/{name}.yaml"), "state": "InSync",
                "action": "None", "reason": "in sync with the declaration",
                "drift": [], "override": null, "operation": null,
                "observedAt": "2027-01-15T07:59:00Z",
            });
            if i % every == every / 2 {
                match (i / every) % 3 {
                    0 => {
                        r["state"] = "Drifted".into();
                        r["action"] = "Update".into();
                        r["reason"] = "connectionLimit drifted".into();
                        r["drift"] = serde_json::json!([{"field": "connectionLimit", "desired": 10, "observed": 99, "origin": "out-of-band"}]);
                    }
                    1 => {
                        r["state"] = "Blocked".into();
                        r["reason"] = "the database carries another agent's marker".into();
                    }
                    _ => {
                        r["state"] = "Overridden".into();
                        r["override"] = serde_json::json!({"source": "annotation", "kind": "paused", "fields": [], "reason": "INC-1", "expires": "2027-01-15T09:00:00Z", "expired": false});
                    }
                }
            }
            r
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "formatVersion": 1,
        "generatedAt": "2027-01-15T08:00:00Z",
        "agent": {"id": "fleet", "version": "0"},
        "source": {"url": "u", "branch": "main", "commit": "c"},
        "summary": {"total": n, "inSync": n - n / every, "drifted": 0, "missing": 0, "blocked": 0, "overridden": 0, "deleting": 0, "errors": 0},
        "resources": resources,
        "errors": [],
    }))
    .unwrap()
}

fn problems(report: &Report) -> Vec<&str> {
    report
        .resources
        .iter()
        .filter(|r| !r.is_quiet())
        .map(|r| r.name.as_str())
        .collect()
}

#[test]
fn the_page_of_100000_resources_is_small_and_shows_the_problems_first() {
    let report = fleet(100_000, 500);
    let wanted = problems(&report);
    assert_eq!(wanted.len(), 200);
    let page = html::page(&report, "tend run");
    eprintln!("the page of 100,000 resources: {} bytes", page.len());
    assert!(page.len() <= 5_000_000, "{} bytes", page.len());
    // The problems come before anything in sync, in the table of all
    // resources as on the page.
    let first_quiet = page.find("<code>tenant-000000</code>");
    assert!(first_quiet.is_none(), "a quiet resource has a row");
    let all = page.find("<h2>All resources</h2>").unwrap();
    let blocked = page[all..].find("tenant-000750").unwrap();
    let folded = page.find("<details id=\"in-sync\">").unwrap();
    assert!(all + blocked < folded);
    for name in &wanted {
        assert!(page[..folded].contains(*name), "{name} is not listed");
    }
    assert!(page.contains("<summary>99800 more in sync"), "no count");
    // Every quiet one is still named once, folded.
    assert!(page[folded..].contains("tenant-000000 "));
}

#[test]
fn text_and_markdown_of_100000_resources_list_the_problems_and_count_the_rest() {
    let report = fleet(100_000, 500);
    let wanted = problems(&report);
    let text = render::text(&report, false, false);
    let markdown = render::markdown(&report, "tend run", false);
    for (what, out) in [("text", &text), ("markdown", &markdown)] {
        assert!(out.len() < 100_000, "{what}: {} bytes", out.len());
        for name in &wanted {
            assert!(out.contains(*name), "{what}: {name} is not listed");
        }
        assert!(!out.contains("tenant-000000"), "{what}: a quiet one is");
        assert!(out.contains("99800 more in sync"), "{what}: no count");
    }
    // `--all`: every resource, one line each.
    let every = render::text(&report, false, true);
    assert!(every.lines().count() > 100_000);
    assert!(every.contains("tenant-000000") && !every.contains("more in sync"));
}

#[test]
fn a_fleet_of_a_thousand_lists_every_resource() {
    let report = fleet(1_000, 500);
    assert!(render::text(&report, false, false).contains("tenant-000000"));
    assert!(render::markdown(&report, "t", false).contains("tenant-000000"));
    assert!(html::page(&report, "t").contains("<code>tenant-000000</code>"));
}
