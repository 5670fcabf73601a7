//! Tests of [`super`] (which decisions stand after a cycle's operations).
use super::*;
use crate::engine::{Action, Decision, DeletionGuard, HeldDeletion, Rule, State};
use crate::executor::OpOutcome;
use crate::model::{Declaration, DeclarationSet, parse_file};
use crate::provider::OperationId;
use crate::reconcile::{PlannedResource, PlannedSubject};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

/// Declarations by name, each with its database name (`""`: its own),
/// in the order given (each read alone: a set would refuse two naming one
/// database, which a declaration and a tombstone may).
fn declarations(named: &[(&str, &str)]) -> Vec<Arc<Declaration>> {
    named
        .iter()
        .flat_map(|(name, database)| {
            let database = match *database {
                "" => String::new(),
                db => format!("  databaseName: {db}\n"),
            };
            let text = format!(
                "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n{database}  connectionLimit: 10\n"
            );
            let file = parse_file(Path::new(&format!("{name}.yaml")), text.as_bytes());
            DeclarationSet::from_files(vec![file]).declarations
        })
        .collect()
}

/// A plan of `declarations`, each at the provider named beside it, in
/// sync and observed as not found.
fn plan<'s>(declarations: &'s [(Arc<Declaration>, &str)]) -> Plan<'s> {
    let mut resources: Vec<PlannedResource<'s>> = declarations
        .iter()
        .map(|(d, provider)| PlannedResource {
            name: d.name().to_string(),
            subject: PlannedSubject::Declared(d),
            file: "x.yaml".into(),
            provider: std::sync::Arc::from(*provider),
            spec_hash: d.spec_hash.clone(),
            observed: Observed::NotFound,
            memory: Arc::default(),
            decision: Decision::new(State::InSync, Action::None, Rule::InSync, "first"),
            operation: None,
        })
        .collect();
    resources.sort_by(|a, b| a.name.cmp(&b.name));
    Plan {
        agent_id: "agent".into(),
        commit: None,
        commit_time: None,
        resources,
        errors: Vec::new(),
        intents: Vec::new(),
        orphaned_overrides: Vec::new(),
        guard: DeletionGuard {
            due: 0,
            managed: declarations.len(),
            limit: 5,
            trip: None,
            empty_tree: false,
        },
        suspension: None,
        released: Vec::new(),
        now: SystemTime::UNIX_EPOCH,
    }
}

fn ran(name: &str, kind: OperationKind) -> Executed {
    Executed {
        name: name.into(),
        kind,
        id: OperationId(format!("op-{name}")),
        outcome: OpOutcome::Done,
        confirmed_by: None,
    }
}

fn at(
    declarations: &[Arc<Declaration>],
    providers: &[&'static str],
) -> Vec<(Arc<Declaration>, &'static str)> {
    declarations
        .iter()
        .cloned()
        .zip(providers.iter().copied())
        .collect()
}

fn names(again: Option<HashSet<String>>) -> Option<Vec<String>> {
    let mut names: Vec<String> = again?.into_iter().collect();
    names.sort();
    Some(names)
}

#[test]
fn the_operated_and_the_written_are_decided_again_and_so_is_whoever_names_their_database() {
    let decls = declarations(&[
        ("orders", ""),
        ("billing", ""),
        ("payments", ""),
        // Names orders' database at the same provider: its observation
        // is the one the update changed.
        ("orders-copy", "orders"),
        // The same database name at another provider: another database.
        ("elsewhere", "orders"),
        // Names the database a create confirmed under another name.
        ("late", "renamed_db"),
    ]);
    let subjects = at(&decls, &["p", "p", "p", "p", "q", "p"]);
    let plan = plan(&subjects);
    let written = Written::of(
        &[Effect::Touch {
            name: "billing".into(),
            file: "billing.yaml".into(),
            manifest: serde_json::Value::Null,
        }],
        false,
    );
    let operations = [
        ran("orders", OperationKind::Update),
        ran("payments", OperationKind::Create),
    ];
    let confirmed: HashMap<String, Box<Confirmation>> = [(
        "payments".to_string(),
        Box::new(Confirmation {
            database_name: "renamed_db".into(),
            observation: None,
        }),
    )]
    .into();
    assert_eq!(
        names(decided_again(&plan, &written, &operations, &confirmed)),
        Some(
            ["billing", "late", "orders", "orders-copy", "payments"]
                .map(String::from)
                .to_vec()
        ),
        "elsewhere's decision stands: nothing it is decided from changed"
    );
    assert_eq!(
        names(decided_again(
            &plan,
            &Written::default(),
            &[],
            &HashMap::new()
        )),
        Some(Vec::new()),
        "nothing operated, nothing written: every decision stands"
    );
}

#[test]
fn a_fleet_wide_change_decides_everything_again() {
    let decls = declarations(&[("orders", ""), ("billing", "")]);
    let subjects = at(&decls, &["p", "p"]);
    let update = [ran("orders", OperationKind::Update)];
    let none = HashMap::new();
    let stands = |plan: &Plan<'_>, written: &Written, operations: &[Executed]| {
        decided_again(plan, written, operations, &none).is_some()
    };
    let plan = plan(&subjects);
    assert!(stands(&plan, &Written::default(), &update));
    for kind in [OperationKind::Delete, OperationKind::Release] {
        assert!(
            !stands(&plan, &Written::default(), &[ran("orders", kind)]),
            "{kind:?} ends management: the guard's base moves"
        );
    }
    for effect in [
        Effect::ReleaseDeletions,
        Effect::HoldDeletions {
            names: vec!["billing".into()],
            hold: HeldDeletion {
                since: SystemTime::UNIX_EPOCH,
                due_together: 9,
            },
        },
    ] {
        assert!(!stands(&plan, &Written::of(&[effect], false), &update));
    }
    assert!(
        !stands(&plan, &Written::of(&[], true), &update),
        "a rename decides two resources from each other"
    );
    let mut due = crate::reconcile::standing::tests::plan(&subjects);
    due.guard.due = 1;
    assert!(
        !stands(&due, &Written::default(), &update),
        "a create or adoption moves the base of a due deletion's guard"
    );
    let mut twice = crate::reconcile::standing::tests::plan(&subjects);
    let copy = twice.resources[0].clone();
    twice.resources.insert(0, copy);
    assert!(
        !stands(&twice, &Written::default(), &update),
        "two decisions under one name are not told apart"
    );
    let mut unreadable = crate::reconcile::standing::tests::plan(&subjects);
    unreadable.resources[1].subject = PlannedSubject::Unreadable;
    assert!(
        stands(&unreadable, &Written::default(), &update),
        "a resource that cannot be read names no database, and routing decides it at every pass"
    );
}

#[test]
fn decisions_made_again_take_the_place_of_the_first_and_the_fleet_wide_is_the_latest() {
    let decls = declarations(&[("billing", ""), ("orders", ""), ("payments", "")]);
    let subjects = at(&decls, &["p", "p", "p"]);
    let mut first = plan(&subjects);
    let problem = crate::model::Diagnostic {
        file: "broken.yaml".into(),
        line: 1,
        column: 1,
        message: "spec.provider `nope` is not configured".into(),
    };
    first.errors.push(problem.clone());
    // orders and payments decided again: orders still there, payments'
    // state forgotten by the cycle (no longer routed, so gone).
    let mut again = plan(&subjects[1..2]);
    again.resources[0].decision.reason = "again".into();
    again.now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(5);
    again.guard.managed = 1;
    let decided: HashSet<String> = ["orders", "payments"].map(String::from).into();
    let merged = merge(first, &decided, again);
    let shown: Vec<(&str, &str)> = merged
        .resources
        .iter()
        .map(|r| (r.name.as_str(), &*r.decision.reason))
        .collect();
    assert_eq!(shown, [("billing", "first"), ("orders", "again")]);
    assert_eq!(
        merged.now,
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(5)
    );
    assert_eq!(merged.guard.managed, 1, "the guard as decided again");
    // The second pass routed the names it decided, not the fleet: the
    // first pass's declaration problems stand.
    assert_eq!(merged.errors, [problem]);
}

#[test]
fn what_is_written_beside_the_cycle_between_its_passes_decides_everything_again() {
    let decls = declarations(&[("orders", "")]);
    let subjects = at(&decls, &["p"]);
    let again = plan(&subjects);
    let first = Beside::default();
    assert!(still_stands(&first, &Beside::default(), &again));
    let held = Beside {
        held_deletions: [(
            "billing".to_string(),
            HeldDeletion {
                since: SystemTime::UNIX_EPOCH,
                due_together: 9,
            },
        )]
        .into(),
        ..Beside::default()
    };
    assert!(
        !still_stands(&first, &held, &again),
        "another worker's guard held deletions meanwhile"
    );
    let mut due = plan(&subjects);
    due.guard.due = 1;
    assert!(
        !still_stands(&first, &Beside::default(), &due),
        "a deletion came due meanwhile"
    );
}
