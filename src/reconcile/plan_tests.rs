//! Tests of [`super`] (the plan phase).
use super::*;
use crate::engine::overrides::fingerprint;
use crate::engine::{DeletionGuard, Tombstone};
use crate::journal::{LocalOverride, OverrideSeen};
use crate::model::{Declaration, DeclarationSet, parse_file};
use crate::provider::{OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, ResourceStatus};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

fn t(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
}

fn declaration(annotations: &str) -> Declaration {
    let text = format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n  annotations:\n    x: y\n{annotations}spec:\n  connectionLimit: 10\n"
    );
    std::sync::Arc::unwrap_or_clone(
        DeclarationSet::from_files(vec![parse_file(Path::new("orders.yaml"), text.as_bytes())])
            .declarations
            .remove(0),
    )
}

fn caps() -> Capabilities {
    Capabilities::for_fields(&["databaseName", "connectionLimit"], true)
}

fn found(limit: u64, labels: &[(&str, &str)]) -> Observed {
    let mut all: BTreeMap<String, String> = [
        (OWNER_AGENT_LABEL, "agent"),
        (OWNER_DECLARATION_LABEL, "orders"),
    ]
    .iter()
    .chain(labels)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    all.retain(|_, v| !v.is_empty());
    Observed::Found(Observation {
        database_name: "orders".into(),
        external_id: "x".into(),
        status: ResourceStatus::Ready,
        fields: [
            ("databaseName".to_string(), json!("orders")),
            ("connectionLimit".to_string(), json!(limit)),
        ]
        .into(),
        labels: all.into_iter().collect(),
        observed_at: t(0),
        unobserved: Vec::new(),
    })
}

fn applied(d: &Declaration) -> Memory {
    Memory {
        applied_spec_hash: Some(d.spec_hash.clone()),
        existed: true,
        database_name: Some("orders".into()),
        provider: Some("p".into()),
        ..Memory::default()
    }
}

struct Fixture {
    policy: Policy,
    guard: DeletionGuard,
    inputs: Inputs,
    gates: HashMap<String, PendingWork>,
    replayed: HashSet<String>,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            policy: Policy {
                agent_id: "agent".into(),
                ..Policy::default()
            },
            guard: DeletionGuard::evaluate(
                &[],
                &HashMap::new(),
                1,
                crate::engine::DeletionLimits {
                    max_deletions: 5,
                    max_percent: 10,
                },
                false,
                t(0),
            ),
            inputs: Inputs::default(),
            gates: HashMap::new(),
            replayed: HashSet::new(),
        }
    }

    fn plan<'s>(
        &self,
        subject: PlannedSubject<'s>,
        observed: Observed,
        memory: Memory,
    ) -> (PlannedResource<'s>, Vec<Effect>) {
        let ctx = PlanContext {
            policy: &self.policy,
            now: t(100),
            guard: &self.guard,
            inputs: &self.inputs,
            gates: &self.gates,
            just_replayed: &self.replayed,
            renamed: &HashMap::new(),
        };
        let mut effects = Vec::new();
        let routed = Routed {
            subject,
            database_name: "orders".into(),
            position: None,
        };
        let r = plan_subject(
            &ctx,
            &std::sync::Arc::from("p"),
            &caps(),
            routed,
            observed,
            std::sync::Arc::new(memory),
            &mut effects,
        );
        (r, effects)
    }
}

const PAUSE_1H: &str = "    tend.dev/paused: \"true\"\n    tend.dev/override-reason: INC-1\n    tend.dev/override-expires: 1h\n";

#[test]
fn an_annotation_override_counts_from_its_stored_first_sighting() {
    let d = declaration(PAUSE_1H);
    let spec = d.annotations.overrides.clone().unwrap();
    let mut f = Fixture::new();
    // Never seen: first seen now, and recorded.
    let (r, effects) = f.plan(PlannedSubject::Declared(&d), found(10, &[]), applied(&d));
    assert_eq!(r.decision.rule, Rule::Paused);
    assert!(effects.contains(&Effect::OverrideSeen {
        name: "orders".into(),
        source: "annotation",
        fingerprint: fingerprint(&spec),
        first_seen: t(100),
    }));
    // Seen two hours ago: expired (held), and nothing to record.
    f.inputs.overrides_seen.insert(
        ("orders".into(), "annotation".into()),
        OverrideSeen {
            fingerprint: fingerprint(&spec),
            first_seen: t(100) - Duration::from_secs(7200),
        },
    );
    let (r, effects) = f.plan(PlannedSubject::Declared(&d), found(10, &[]), applied(&d));
    assert!(r.decision.overrides.expired);
    assert!(effects.is_empty(), "{effects:?}");
    // The same sighting in the old form: kept, and rewritten canonically.
    f.inputs.overrides_seen.insert(
        ("orders".into(), "annotation".into()),
        OverrideSeen {
            fingerprint: legacy_fingerprint(&spec),
            first_seen: t(100) - Duration::from_secs(7200),
        },
    );
    let (r, effects) = f.plan(PlannedSubject::Declared(&d), found(10, &[]), applied(&d));
    assert!(r.decision.overrides.expired);
    assert_eq!(
        effects,
        [Effect::OverrideSeen {
            name: "orders".into(),
            source: "annotation",
            fingerprint: fingerprint(&spec),
            first_seen: t(100) - Duration::from_secs(7200),
        }]
    );
}

#[test]
fn provider_label_overrides_and_local_overrides_reach_the_decision() {
    let d = declaration("");
    let mut f = Fixture::new();
    let labels = [
        ("tend.dev/paused", "true"),
        ("tend.dev/override-reason", "DBA"),
    ];
    let (r, effects) = f.plan(
        PlannedSubject::Declared(&d),
        found(99, &labels),
        applied(&d),
    );
    assert_eq!(r.decision.rule, Rule::Paused);
    assert!(
        matches!(&effects[..], [Effect::OverrideSeen { source: "provider", first_seen, .. }, ..] if *first_seen == t(100))
    );

    f.inputs.local_overrides.insert(
        "orders".into(),
        LocalOverride {
            name: "orders".into(),
            annotations: [("tend.dev/paused".to_string(), "maybe".to_string())].into(),
            set_at: t(0),
        },
    );
    let (r, _) = f.plan(PlannedSubject::Declared(&d), found(99, &[]), applied(&d));
    assert_eq!(
        r.decision.rule,
        Rule::Paused,
        "a broken local override pauses"
    );
    assert!(r.decision.overrides.reasons[0].contains("invalid local override"));
}

#[test]
fn unreadable_state_is_an_error_and_remembers_nothing() {
    let d = declaration("");
    let mut f = Fixture::new();
    f.inputs
        .corrupt
        .insert("orders".into(), vec!["intents row of `orders`: bad".into()]);
    let (r, effects) = f.plan(PlannedSubject::Declared(&d), found(99, &[]), applied(&d));
    assert_eq!(
        (r.decision.state, r.decision.action, r.decision.rule),
        (State::Error, Action::None, Rule::CorruptState)
    );
    assert!(r.operation.is_none());
    assert!(effects.is_empty(), "{effects:?}");
}

#[test]
fn a_pending_intent_gates_new_work_and_a_replayed_create_waits_a_cycle() {
    let d = declaration("");
    let mut f = Fixture::new();
    let (r, _) = f.plan(
        PlannedSubject::Declared(&d),
        Observed::NotFound,
        Memory::default(),
    );
    assert_eq!(r.decision.action, Action::Create);
    assert!(r.operation.is_some());

    f.replayed.insert("orders".into());
    let (r, _) = f.plan(
        PlannedSubject::Declared(&d),
        Observed::NotFound,
        Memory::default(),
    );
    assert_eq!(
        (r.decision.action, r.decision.rule),
        (Action::Hold, Rule::PendingIntent)
    );
    assert!(r.operation.is_none());

    f.replayed.clear();
    f.gates.insert(
        "orders".into(),
        PendingWork {
            kind: OperationKind::Update,
            id: crate::provider::OperationId("0123456789abcdef".into()),
            last_error: None,
            attempts: 1,
            last_attempt: std::time::SystemTime::UNIX_EPOCH,
        },
    );
    let (r, _) = f.plan(PlannedSubject::Declared(&d), found(99, &[]), applied(&d));
    assert_eq!(
        (r.decision.action, r.decision.rule),
        (Action::Hold, Rule::PendingIntent)
    );
    assert_eq!(
        r.decision.state,
        State::Drifted,
        "the state still tells the truth"
    );
}

#[test]
fn effects_record_drift_sightings_only_when_they_change() {
    let d = declaration("");
    let f = Fixture::new();
    let (_, effects) = f.plan(PlannedSubject::Declared(&d), found(99, &[]), applied(&d));
    assert_eq!(
        effects,
        [Effect::SyncDrift {
            name: "orders".into(),
            fields: vec!["connectionLimit".into()],
            at: t(100),
        }]
    );
    let mut memory = applied(&d);
    memory
        .drift_first_seen
        .insert("connectionLimit".into(), t(50));
    let (_, effects) = f.plan(PlannedSubject::Declared(&d), found(99, &[]), memory.clone());
    assert!(effects.is_empty());
    let (_, effects) = f.plan(PlannedSubject::Declared(&d), found(10, &[]), memory);
    assert_eq!(
        effects,
        [Effect::SyncDrift {
            name: "orders".into(),
            fields: Vec::new(),
            at: t(100),
        }],
        "corrected drift is forgotten"
    );
    let tomb = Tombstone {
        last: d.manifest.clone(),
        removed_at: t(0),
        removal_commit: "c".into(),
        delete_requested_at: None,
        last_error: None,
    };
    let (_, effects) = f.plan(
        PlannedSubject::Removed(Box::new(tomb)),
        Observed::NotFound,
        applied(&d),
    );
    assert_eq!(
        effects,
        [Effect::Forget {
            name: "orders".into()
        }]
    );
}
