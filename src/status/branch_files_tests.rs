//! The status branch's files: what a render names over the last one.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::journal::LastOperation;

/// A report of `entries` (name, reason) at commit `c1`.
pub(crate) fn report(entries: &[(&str, &str)]) -> Report {
    let mut report: Report = serde_json::from_value(serde_json::json!({
        "formatVersion": 1, "generatedAt": "2027-01-15T08:00:00Z",
        "agent": {"id": "agent", "version": "0"},
        "source": {"url": "/repo", "branch": "main", "commit": "c1"},
        "summary": super::super::report::Summary::default(),
        "resources": [], "errors": [],
    }))
    .expect("a report");
    report.resources = entries
        .iter()
        .map(|(name, reason)| {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "name": name, "file": format!("{name}.yaml"), "state": "InSync",
                    "action": "None", "reason": reason, "drift": [],
                }))
                .expect("a resource report"),
            )
        })
        .collect();
    report
}

/// Over `base` (`None`: every file), no entry known unchanged.
fn keep(
    base: Option<HashMap<String, InputsDigest>>,
    reported_until: Option<SystemTime>,
) -> Inputs<'static> {
    Inputs::Keep {
        base,
        unchanged: &none_unchanged,
        kept: None,
        reported_until,
    }
}

/// A whole render of `billing`, `ledger` and `orders`, and the
/// `decidedFrom` the state then remembers.
fn first_render() -> (Rendered, DecidedFrom) {
    let first = report(&[("billing", ""), ("ledger", ""), ("orders", "")]);
    let whole = render(
        &first,
        &mut HashMap::new(),
        &DecidedFrom::new(),
        keep(None, None),
        &mut FileContent::Bytes,
    );
    let decided: DecidedFrom = whole
        .decided
        .iter()
        .map(|(name, now)| (name.clone(), now.clone().expect("a decidedFrom")))
        .collect();
    (whole, decided)
}

#[test]
fn over_the_last_render_only_what_changed_is_named() {
    let mut none = HashMap::new();
    let (whole, decided) = first_render();
    assert!(!whole.over_base);
    assert_eq!(whole.rendered, 3);
    assert_eq!(
        whole.files.len(),
        5,
        "three resources, agent.yaml, SUMMARY.md"
    );
    // `orders` changed, `ledger` went, `payments` came, `billing` stayed.
    let second = report(&[("billing", ""), ("orders", "drifted"), ("payments", "")]);
    let over = render(
        &second,
        &mut none,
        &decided,
        keep(Some(whole.inputs), None),
        &mut FileContent::Bytes,
    );
    assert!(over.over_base);
    assert_eq!(over.rendered, 2);
    let named: Vec<(&str, bool)> = over
        .files
        .iter()
        .map(|(path, content)| (path.as_str(), matches!(content, FileContent::Removed)))
        .collect();
    let expected = [
        (file_name("ledger"), true),
        (file_name("orders"), false),
        (file_name("payments"), false),
        ("SUMMARY.md".to_string(), false),
        ("agent.yaml".to_string(), false),
    ];
    let mut expected: Vec<(&str, bool)> = expected.iter().map(|(p, r)| (p.as_str(), *r)).collect();
    expected.sort();
    assert_eq!(named, expected);
    let mut keys: Vec<&str> = over.inputs.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["billing", "orders", "payments"]);
    let changed: Vec<(&str, bool)> = over
        .decided
        .iter()
        .map(|(name, now)| (name.as_str(), now.is_some()))
        .collect();
    assert_eq!(
        changed,
        [("orders", true), ("payments", true), ("ledger", false)]
    );
}

#[test]
fn entries_the_caller_found_kept_are_taken_as_they_were() {
    let (whole, decided) = first_render();
    let second = report(&[("billing", ""), ("orders", "drifted"), ("payments", "")]);
    let with = |kept: &[bool]| {
        render(
            &second,
            &mut HashMap::new(),
            &decided,
            Inputs::Keep {
                base: Some(whole.inputs.clone()),
                unchanged: &none_unchanged,
                kept: Some(kept),
                reported_until: None,
            },
            &mut FileContent::Bytes,
        )
    };
    // `billing` found kept: the same files as when render looks.
    let found = with(&[true, false, false]);
    assert_eq!(found.rendered, 2, "orders and payments");
    let paths: Vec<&str> = found.files.keys().map(String::as_str).collect();
    let mut expected = vec![
        file_name("ledger"),
        file_name("orders"),
        file_name("payments"),
        "SUMMARY.md".to_string(),
        "agent.yaml".to_string(),
    ];
    expected.sort();
    assert_eq!(paths, expected);
    assert!(matches!(
        found.files[&file_name("ledger")],
        FileContent::Removed
    ));
    // Whatever the caller says is kept is not rendered, and a resource
    // gone is still found gone.
    let trusted = with(&[true, true, false]);
    assert_eq!(trusted.rendered, 1, "payments alone");
    assert!(!trusted.files.contains_key(&file_name("orders")));
    assert!(matches!(
        trusted.files[&file_name("ledger")],
        FileContent::Removed
    ));
    let mut keys: Vec<&str> = trusted.inputs.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["billing", "orders", "payments"]);
}

/// A report taken before a cycle began, rendered with the operation that
/// cycle then finished (the state is read after the report is taken):
/// the file is written, but not kept as decided at the report's older
/// commit. The next render, over the report of the commit the operation
/// was run for, names that commit, though its entry renders the same
/// bytes. (Kept, the file named the older commit until the resource
/// changed again: a one-file commit's status file never named it.)
#[test]
fn an_operation_newer_than_the_report_is_decided_at_the_next() {
    let (whole, decided) = first_render();
    let done = |at: u64| {
        let op = LastOperation {
            id: "op-1".into(),
            kind: "update".into(),
            result: "done".into(),
            error: None,
            finished_at: UNIX_EPOCH + Duration::from_secs(at),
        };
        HashMap::from([("orders".to_string(), op)])
    };
    let taken = |at: u64| Some(UNIX_EPOCH + Duration::from_secs(at));
    let decided_from = |r: &Rendered| match &r.files[&file_name("orders")] {
        FileContent::Bytes(bytes) => String::from_utf8_lossy(bytes)
            .lines()
            .find_map(|l| l.strip_prefix("decidedFrom: ").map(str::to_string)),
        _ => None,
    };
    // Taken at 100 s; the operation finished at 101 s.
    let before = report(&[("billing", ""), ("ledger", ""), ("orders", "")]);
    let ahead = render(
        &before,
        &mut done(101),
        &decided,
        keep(Some(whole.inputs), taken(100)),
        &mut FileContent::Bytes,
    );
    assert_eq!((ahead.rendered, ahead.ahead), (1, 1));
    assert!(ahead.files.contains_key(&file_name("orders")), "written");
    assert!(ahead.decided.is_empty(), "{:?}", ahead.decided);
    assert_eq!(ahead.inputs.get("orders"), Some(&AHEAD_OF_REPORT));
    // Gone from the next report: its file goes.
    let gone = render(
        &report(&[("billing", ""), ("ledger", "")]),
        &mut done(101),
        &decided,
        keep(Some(ahead.inputs.clone()), taken(102)),
        &mut FileContent::Bytes,
    );
    assert!(matches!(
        gone.files.get(&file_name("orders")),
        Some(FileContent::Removed)
    ));
    assert_eq!(gone.decided, [("orders".to_string(), None)]);
    // The commit's report, taken at 102 s: the same entry, at `c2`.
    let mut after = before.clone();
    after.source.commit = Some("c2".into());
    let next = render(
        &after,
        &mut done(101),
        &decided,
        keep(Some(ahead.inputs), taken(102)),
        &mut FileContent::Bytes,
    );
    assert_eq!((next.rendered, next.ahead), (1, 0));
    assert_eq!(decided_from(&next).as_deref(), Some("\"c2\""));
    assert_eq!(next.decided.len(), 1);
    assert_eq!(next.decided[0].0, "orders");
    assert_ne!(next.inputs.get("orders"), Some(&AHEAD_OF_REPORT));
    assert!(next.inputs.contains_key("orders"));
    // Finished in the bound's own millisecond (the state keeps
    // milliseconds): perhaps after it.
    let (whole, decided) = first_render();
    let same_ms = render(
        &before,
        &mut done(100),
        &decided,
        keep(
            Some(whole.inputs),
            Some(UNIX_EPOCH + Duration::from_micros(100_000_400)),
        ),
        &mut FileContent::Bytes,
    );
    assert_eq!(same_ms.ahead, 1);
    // Without a time (a one-shot publication) nothing is ahead.
    let (whole, decided) = first_render();
    let unbounded = render(
        &before,
        &mut done(101),
        &decided,
        keep(Some(whole.inputs), None),
        &mut FileContent::Bytes,
    );
    assert_eq!((unbounded.rendered, unbounded.ahead), (1, 0));
    assert_eq!(decided_from(&unbounded).as_deref(), Some("\"c1\""));
}

#[test]
fn a_name_never_leaves_the_status_directory() {
    // `printf %s orders | sha256sum`: 1c168a…; `../x`: d6b96a…
    assert_eq!(file_name("orders"), "status/1c/orders.yaml");
    assert_eq!(file_name("../x"), "status/d6/%2E%2E%2Fx.yaml");
}

/// A file with no `decidedFrom` to remember (a report without a source
/// commit) keeps no digest of its own: the next render makes it again,
/// and a one-shot reads no row for it.
#[test]
fn a_file_decided_from_no_commit_is_made_again() {
    let mut no_commit = report(&[("billing", ""), ("orders", "")]);
    no_commit.source.commit = None;
    let whole = render(
        &no_commit,
        &mut HashMap::new(),
        &DecidedFrom::new(),
        keep(None, None),
        &mut FileContent::Bytes,
    );
    assert!(whole.decided.is_empty(), "{:?}", whole.decided);
    assert_eq!(whole.inputs.len(), 2);
    assert!(whole.inputs.values().all(|d| *d == AHEAD_OF_REPORT));
    let again = render(
        &no_commit,
        &mut HashMap::new(),
        &DecidedFrom::new(),
        keep(Some(whole.inputs), None),
        &mut FileContent::Bytes,
    );
    assert_eq!(again.rendered, 2, "made again");
}
