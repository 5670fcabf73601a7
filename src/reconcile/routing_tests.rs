//! Tests of [`super`] (the routing phase).
use super::*;
use crate::engine::Memory;
use crate::journal::TombstoneRow;
use crate::model::{DeclarationSet, parse_file};
use crate::reconcile::inputs::LeftGit;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

fn t(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
}

fn config(providers: &str) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tend.toml");
    std::fs::write(&path, format!("[source]\nurl = \"/x\"\n{providers}")).unwrap();
    Config::load(&path).unwrap()
}

fn manifest(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  owner: app\n{extra}"
    )
}

fn snapshot(files: &[(&str, String)]) -> Snapshot {
    Snapshot {
        commit: "c0ffee".into(),
        commit_time: t(0),
        files: Vec::new(),
        declarations: DeclarationSet::from_files(
            files
                .iter()
                .map(|(f, text)| parse_file(Path::new(f), text.as_bytes()))
                .collect(),
        ),
        provider_groups: Default::default(),
    }
}

fn parsed(name: &str, extra: &str) -> ManagedDatabase {
    serde_norway::from_str(&manifest(name, extra)).unwrap()
}

const SANDBOX: &str = "[providers.sandbox]\nkind = \"sandbox\"\n";

fn names(routing: &Routing<'_>) -> Vec<String> {
    routing
        .by_provider
        .values()
        .flatten()
        .map(|r| r.subject.name().to_string())
        .collect()
}

#[test]
fn a_declaration_that_came_back_clears_its_tombstone() {
    let config = config(SANDBOX);
    let snapshot = snapshot(&[("a.yaml", manifest("a", ""))]);
    let mut inputs = Inputs::default();
    inputs.tombstones.push(TombstoneRow {
        name: "a".into(),
        last: parsed("a", ""),
        removed_at: t(0),
        removal_commit: "old".into(),
        delete_requested_at: None,
        last_error: None,
    });
    let routing = Routing::route(
        &config,
        &Policy::default(),
        &snapshot,
        &mut inputs,
        &Scope::All,
        t(10),
        None,
    );
    assert_eq!(
        routing.effects,
        [Effect::RemoveTombstone { name: "a".into() }]
    );
    assert_eq!(names(&routing), ["a"]);
    assert!(routing.due_deletions.is_empty());
}

#[test]
fn a_managed_resource_that_left_git_gets_a_tombstone_unless_its_file_is_unreadable() {
    let config = config(SANDBOX);
    let snapshot = snapshot(&[
        ("a.yaml", manifest("a", "")),
        ("broken.yaml", "kind: [".into()),
    ]);
    let mut inputs = Inputs {
        left_git: vec![
            LeftGit {
                name: "gone".into(),
                last: parsed("gone", "  deletionPolicy: Delete\n"),
                file: "gone.yaml".into(),
            },
            LeftGit {
                name: "hidden".into(),
                last: parsed("hidden", ""),
                file: "broken.yaml".into(),
            },
        ],
        ..Inputs::default()
    };
    let policy = Policy {
        deletion_delay: Duration::ZERO,
        ..Policy::default()
    };
    let routing = Routing::route(
        &config,
        &policy,
        &snapshot,
        &mut inputs,
        &Scope::All,
        t(10),
        None,
    );
    assert!(
        matches!(&routing.effects[..], [Effect::AddTombstone { name, at, commit, .. }] if name == "gone" && *at == t(10) && commit == "c0ffee")
    );
    assert_eq!(names(&routing), ["a", "gone"]);
    assert_eq!(routing.due_deletions, ["gone"]);
}

#[test]
fn an_empty_tree_removes_nothing() {
    let config = config(SANDBOX);
    let snapshot = snapshot(&[]);
    let mut inputs = Inputs {
        left_git: vec![LeftGit {
            name: "gone".into(),
            last: parsed("gone", "  deletionPolicy: Delete\n"),
            file: "gone.yaml".into(),
        }],
        ..Inputs::default()
    };
    let routing = Routing::route(
        &config,
        &Policy::default(),
        &snapshot,
        &mut inputs,
        &Scope::All,
        t(10),
        None,
    );
    assert!(routing.effects.is_empty());
    assert!(names(&routing).is_empty());
}

#[test]
fn a_tombstone_is_routed_where_tend_manages_it_or_reported() {
    let config =
        config("[providers.one]\nkind = \"sandbox\"\n[providers.two]\nkind = \"sandbox\"\n");
    let snapshot = snapshot(&[("a.yaml", manifest("a", "  provider: one\n"))]);
    let mut inputs = Inputs::default();
    let mut memories = HashMap::new();
    for (name, provider) in [("kept", "two"), ("orphan", "three")] {
        inputs.tombstones.push(TombstoneRow {
            name: name.into(),
            last: parsed(name, "  provider: one\n"),
            removed_at: t(0),
            removal_commit: "old".into(),
            delete_requested_at: None,
            last_error: None,
        });
        memories.insert(
            name.to_string(),
            Memory {
                existed: true,
                provider: Some(provider.into()),
                ..Memory::default()
            },
        );
    }
    inputs.memories = crate::reconcile::inputs::Memories::of(memories);
    let routing = Routing::route(
        &config,
        &Policy::default(),
        &snapshot,
        &mut inputs,
        &Scope::All,
        t(10),
        None,
    );
    assert_eq!(
        routing.by_provider["two"][0].subject.name(),
        "kept",
        "where tend manages it"
    );
    assert_eq!(routing.undecidable.len(), 1);
    let orphan = &routing.undecidable[0];
    assert_eq!(
        (orphan.name.as_str(), orphan.decision.rule),
        ("orphan", Rule::ProviderNotConfigured)
    );
    assert_eq!(orphan.decision.state, State::Error);
}

#[test]
fn unroutable_declarations_are_diagnostics_and_unreadable_state_is_undecidable() {
    let config =
        config("[providers.one]\nkind = \"sandbox\"\n[providers.two]\nkind = \"sandbox\"\n");
    let snapshot = snapshot(&[
        ("a.yaml", manifest("a", "")),
        ("b.yaml", manifest("b", "  provider: one\n")),
    ]);
    let mut inputs = Inputs::default();
    inputs
        .corrupt
        .insert("lost".into(), vec!["tombstones row of `lost`: x".into()]);
    let routing = Routing::route(
        &config,
        &Policy::default(),
        &snapshot,
        &mut inputs,
        &Scope::All,
        t(10),
        None,
    );
    assert_eq!(routing.diagnostics.len(), 1);
    assert!(
        routing.diagnostics[0]
            .message
            .contains("spec.provider is required")
    );
    assert_eq!(names(&routing), ["b"]);
    assert_eq!(routing.undecidable[0].decision.rule, Rule::CorruptState);

    let scoped = Routing::route(
        &config,
        &Policy::default(),
        &snapshot,
        &mut Inputs::default(),
        &Scope::Only(["b".to_string()].into()),
        t(10),
        None,
    );
    assert_eq!(names(&scoped), ["b"]);
    // Out of scope, `a` is not decided, but its error is still reported:
    // a cycle over some names never drops another declaration's error.
    assert_eq!(scoped.diagnostics, routing.diagnostics);
}

/// A provider worker's cycle routes its own declarations and reports the
/// ones no configured provider takes (unknown, or none named where
/// several are configured), in name order; another configured provider's
/// declarations are passed over, errors and all. Every provider's cycle
/// over the same snapshot (sharing its groups) routes the same way.
#[test]
fn a_provider_cycle_takes_its_own_group_and_reports_the_unroutable() {
    let config = config("[providers.p0]\nkind = \"sandbox\"\n[providers.p1]\nkind = \"sandbox\"\n");
    let at = |name: &str, provider: &str| {
        let extra = if provider.is_empty() {
            String::new()
        } else {
            format!("  provider: {provider}\n")
        };
        (format!("{name}.yaml"), manifest(name, &extra))
    };
    let files = [
        at("a", "p1"),
        at("b", "p0"),
        at("c", "nope"),
        at("d", ""),
        at("e", "p0"),
        at("f", "p1"),
        at("g", "other"),
    ];
    let borrowed: Vec<(&str, String)> =
        files.iter().map(|(f, t)| (f.as_str(), t.clone())).collect();
    let snapshot = snapshot(&borrowed);
    let route = |provider: &str| {
        let scope = Scope::Provider {
            provider: provider.into(),
            names: None,
        };
        let mut inputs = Inputs::default();
        let routing = Routing::route(
            &config,
            &Policy::default(),
            &snapshot,
            &mut inputs,
            &scope,
            t(0),
            None,
        );
        let errors: Vec<String> = routing
            .diagnostics
            .iter()
            .map(|d| d.file.display().to_string())
            .collect();
        (names(&routing), errors)
    };
    let unroutable = vec!["c.yaml".to_string(), "d.yaml".into(), "g.yaml".into()];
    assert_eq!(
        route("p0"),
        (vec!["b".to_string(), "e".into()], unroutable.clone())
    );
    assert_eq!(
        route("p1"),
        (vec!["a".to_string(), "f".into()], unroutable.clone())
    );
    // A whole cycle routes every routable declaration and the same errors.
    let mut inputs = Inputs::default();
    let all = Routing::route(
        &config,
        &Policy::default(),
        &snapshot,
        &mut inputs,
        &Scope::All,
        t(0),
        None,
    );
    let mut every = names(&all);
    every.sort();
    assert_eq!(every, ["a", "b", "e", "f"]);
    assert_eq!(all.diagnostics.len(), unroutable.len());
}

/// The pass that decides again what a cycle's operations changed routes
/// the names it is given, in the snapshot's order, found by name: within
/// the cycle's scope, with their positions (their memories are taken by
/// them), tombstones in scope included; the other declarations are not
/// looked at, so their problems are not reported again (the first pass's
/// stand, see `standing::merge`).
#[test]
fn a_pass_over_some_names_routes_those_alone() {
    let config = config("[providers.p0]\nkind = \"sandbox\"\n[providers.p1]\nkind = \"sandbox\"\n");
    let at = |name: &str, provider: &str| {
        (
            format!("{name}.yaml"),
            manifest(name, &format!("  provider: {provider}\n")),
        )
    };
    let files = [
        at("a", "p1"),
        at("b", "p0"),
        at("c", "nope"),
        at("d", "p0"),
        at("e", "p1"),
    ];
    let borrowed: Vec<(&str, String)> =
        files.iter().map(|(f, t)| (f.as_str(), t.clone())).collect();
    let snapshot = snapshot(&borrowed);
    let inputs = || {
        let mut inputs = Inputs::default();
        inputs.tombstones.push(TombstoneRow {
            name: "gone".into(),
            last: parsed("gone", "  provider: p0\n"),
            removed_at: t(0),
            removal_commit: "old".into(),
            delete_requested_at: None,
            last_error: None,
        });
        inputs
    };
    let only: HashSet<String> = ["e", "b", "d", "unknown"].map(String::from).into();
    let route = |scope: &Scope| {
        let routing = Routing::route(
            &config,
            &Policy::default(),
            &snapshot,
            &mut inputs(),
            scope,
            t(0),
            Some(&only),
        );
        let positions: Vec<(String, Option<usize>)> = routing
            .by_provider
            .values()
            .flatten()
            .map(|r| (r.subject.name().to_string(), r.position))
            .collect();
        (positions, routing.diagnostics.len())
    };
    let named = |list: &[(&str, Option<usize>)]| -> Vec<(String, Option<usize>)> {
        list.iter().map(|(n, at)| (n.to_string(), *at)).collect()
    };
    assert_eq!(
        route(&Scope::All),
        (
            named(&[
                ("b", Some(1)),
                ("d", Some(3)),
                ("gone", None),
                ("e", Some(4))
            ]),
            0
        )
    );
    let p0 = Scope::Provider {
        provider: "p0".into(),
        names: None,
    };
    assert_eq!(
        route(&p0),
        (named(&[("b", Some(1)), ("d", Some(3)), ("gone", None)]), 0)
    );
    // The whole routing of the same scope gives the same subjects, and
    // the problem of `c`, which no pass over some names repeats.
    let whole = Routing::route(
        &config,
        &Policy::default(),
        &snapshot,
        &mut inputs(),
        &p0,
        t(0),
        None,
    );
    assert_eq!(names(&whole), ["b", "d", "gone"]);
    assert_eq!(whole.diagnostics.len(), 1);
}

#[test]
fn a_provider_s_own_group_is_routed_without_a_copy() {
    let at = |name: &str, provider: &str| {
        (
            format!("{name}.yaml"),
            manifest(name, &format!("  provider: {provider}\n")),
        )
    };
    let files = [at("a", "p1"), at("b", "p0"), at("c", "p1"), at("d", "gone")];
    let borrowed: Vec<(&str, String)> =
        files.iter().map(|(f, t)| (f.as_str(), t.clone())).collect();
    let snapshot = snapshot(&borrowed);
    let configured = |name: &str| ["p0", "p1", "gone"].contains(&name);
    let own = snapshot.routed_by("p1", configured);
    assert!(matches!(own, std::borrow::Cow::Borrowed(_)));
    assert_eq!(&*own, [0, 2]);
    // With `gone` no longer configured, its declarations are p0's too.
    let merged = snapshot.routed_by("p0", |name| ["p0", "p1"].contains(&name));
    assert!(matches!(merged, std::borrow::Cow::Owned(_)));
    assert_eq!(&*merged, [1, 3]);
}

/// A provider's cycle over its own group alone (every declaration names
/// it: none is looked up) still refuses the fields its kind does not
/// manage, as a whole cycle does, and routes each declaration with its
/// position in the snapshot.
#[test]
fn a_provider_s_own_group_is_checked_for_the_fields_it_manages() {
    let config = config(
        "[providers.pg]\nkind = \"postgres\"\nurl = \"postgres://tend@127.0.0.1:1/postgres\"\n",
    );
    let files = [
        ("a.yaml", manifest("a", "  provider: pg\n")),
        ("b.yaml", manifest("b", "  provider: pg\n  size: small\n")),
        ("c.yaml", manifest("c", "  provider: pg\n")),
    ];
    let snapshot = snapshot(&files);
    assert!(matches!(
        snapshot.routed_by("pg", |name| name == "pg"),
        std::borrow::Cow::Borrowed(_)
    ));
    let scope = Scope::Provider {
        provider: "pg".into(),
        names: None,
    };
    let own = Routing::route(
        &config,
        &Policy::default(),
        &snapshot,
        &mut Inputs::default(),
        &scope,
        t(0),
        None,
    );
    let whole = Routing::route(
        &config,
        &Policy::default(),
        &snapshot,
        &mut Inputs::default(),
        &Scope::All,
        t(0),
        None,
    );
    for routing in [&own, &whole] {
        assert_eq!(names(routing), ["a", "c"]);
        let positions: Vec<Option<usize>> = routing.by_provider["pg"]
            .iter()
            .map(|r| r.position)
            .collect();
        assert_eq!(positions, [Some(0), Some(2)]);
        assert_eq!(routing.diagnostics.len(), 1);
        assert!(
            routing.diagnostics[0]
                .message
                .contains("spec.size is DBaaS-only: provider `pg` (postgres)"),
            "{:?}",
            routing.diagnostics
        );
    }
}
