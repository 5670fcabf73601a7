//! The planner: one decision per routed subject, and the effects on
//! memory those decisions imply. Pure: everything comes in (the inputs,
//! the observation, the guard's verdict, `now`); effects go out as data
//! for [`crate::journal::effects::commit`] (which only `apply` calls).
//!
//! Around the decision core it assembles the three override sources
//! (annotation, local, provider label) with their first sightings, and
//! applies the rules that need more than one resource or the journal:
//! the deletion gate, the pending-intent gate, unreadable state.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use super::inputs::Inputs;
use super::routing::{Routed, corrupt_reason};
use super::{PlannedResource, PlannedSubject};
use crate::engine::intents::{PendingWork, WorkGate, hold_behind};
use crate::engine::overrides::{fingerprint, legacy_fingerprint};
use crate::engine::{
    Action, DecideInput, Decision, DeletionGate, DeletionGuard, DriftOrigin, Memory, OverrideInput,
    OverrideSource, Policy, Rule, State, Subject, decide,
};
use crate::journal::effects::Effect;
use crate::model::declaration::ScalarString;
use crate::model::{OnExpiry, OverrideSpec};
use crate::provider::{Capabilities, Observed, OperationKind};

/// What every decision of a cycle shares.
#[derive(Debug)]
pub struct PlanContext<'a> {
    pub policy: &'a Policy,
    pub now: SystemTime,
    pub guard: &'a DeletionGuard,
    pub inputs: &'a Inputs,
    /// Pending intents that hold new work, by resource.
    pub gates: &'a HashMap<String, PendingWork>,
    /// Resources whose intents were replayed in this cycle.
    pub just_replayed: &'a HashSet<String>,
}

/// The operation kind that carries out an action.
pub fn operation_kind(action: Action) -> Option<OperationKind> {
    match action {
        Action::Create => Some(OperationKind::Create),
        Action::Update => Some(OperationKind::Update),
        Action::Delete => Some(OperationKind::Delete),
        Action::Adopt => Some(OperationKind::Adopt),
        Action::Release => Some(OperationKind::Release),
        Action::None | Action::Hold => None,
    }
}

/// Decides one subject observed as `observed`, remembered as `memory`;
/// pushes the memory effects of the decision onto `effects`.
pub fn plan_subject<'s>(
    ctx: &PlanContext<'_>,
    provider: &str,
    capabilities: &Capabilities,
    routed: Routed<'s>,
    observed: Observed,
    memory: Memory,
    effects: &mut Vec<Effect>,
) -> PlannedResource<'s> {
    let subject = routed.subject;
    let name = subject.name().to_string();
    let (file, spec_hash) = match &subject {
        PlannedSubject::Declared(d) => (d.file.to_string_lossy().into_owned(), d.spec_hash.clone()),
        PlannedSubject::Removed(t) => (String::new(), t.last.spec_hash()),
        PlannedSubject::Unreadable => (String::new(), crate::model::SpecHash(String::new())),
    };
    let decision = match ctx.inputs.corrupt.get(&name) {
        Some(problems) => Decision::new(
            State::Error,
            Action::None,
            Rule::CorruptState,
            corrupt_reason(&name, problems),
        ),
        None => decide_subject(
            ctx,
            provider,
            capabilities,
            &name,
            &subject,
            &observed,
            &memory,
            effects,
        ),
    };
    let decision = match ctx.gates.get(&name) {
        Some(work) => hold_behind(decision, &name, WorkGate::Pending(work)),
        None if ctx.just_replayed.contains(&name) => {
            hold_behind(decision, &name, WorkGate::JustReplayed)
        }
        None => decision,
    };
    remember(
        &name, &subject, &observed, &memory, &decision, ctx.now, effects,
    );
    PlannedResource {
        operation: operation_kind(decision.action).map(|kind| super::PlannedOperationId {
            kind,
            id: crate::provider::OperationId::derive_nth(
                &ctx.policy.agent_id,
                &name,
                kind,
                &spec_hash,
                0,
            ),
            generation: 0,
        }),
        name,
        subject,
        file,
        provider: provider.to_string(),
        spec_hash,
        observed,
        memory,
        decision,
    }
}

#[allow(clippy::too_many_arguments)]
fn decide_subject(
    ctx: &PlanContext<'_>,
    provider: &str,
    capabilities: &Capabilities,
    name: &str,
    subject: &PlannedSubject<'_>,
    observed: &Observed,
    memory: &Memory,
    effects: &mut Vec<Effect>,
) -> Decision {
    let mut overrides = Vec::new();
    if let PlannedSubject::Declared(d) = subject
        && let Some(spec) = &d.annotations.overrides
    {
        let first_seen = first_seen(ctx, name, OverrideSource::Annotation, spec, effects);
        overrides.push(OverrideInput {
            source: OverrideSource::Annotation,
            spec: spec.clone(),
            first_seen,
        });
    }
    overrides.extend(local_override(ctx, name));
    let provider_override_seen = provider_labels_seen(ctx, name, observed, effects);
    let gate = match subject {
        PlannedSubject::Removed(_) => ctx
            .guard
            .gate(ctx.inputs.approvals.get(name).map(|a| a.reason.as_str())),
        _ => DeletionGate::Allowed,
    };
    let engine_subject = match subject {
        PlannedSubject::Declared(d) => Subject::Declared(d),
        PlannedSubject::Removed(t) => Subject::Removed(t),
        PlannedSubject::Unreadable => {
            return Decision::new(
                State::Error,
                Action::None,
                Rule::CorruptState,
                format!("what tend remembers of `{name}` cannot be read"),
            );
        }
    };
    decide(&DecideInput {
        subject: engine_subject,
        observed,
        memory,
        overrides: &overrides,
        policy: ctx.policy,
        capabilities,
        deletion: &gate,
        provider_override_seen,
        provider,
        now: ctx.now,
    })
}

/// When an annotation override with this content was first seen: the
/// stored sighting if its content matches (a row in the format-2 `Debug`
/// fingerprint is carried over to the canonical one), else now.
fn first_seen(
    ctx: &PlanContext<'_>,
    name: &str,
    source: OverrideSource,
    spec: &OverrideSpec,
    effects: &mut Vec<Effect>,
) -> SystemTime {
    let fp = fingerprint(spec);
    let seen = ctx
        .inputs
        .overrides_seen
        .get(&(name.to_string(), source.as_str().to_string()));
    let (first_seen, record) = match seen {
        Some(s) if s.fingerprint == fp => (s.first_seen, false),
        Some(s) if s.fingerprint == legacy_fingerprint(spec) => (s.first_seen, true),
        _ => (ctx.now, true),
    };
    if record {
        effects.push(Effect::OverrideSeen {
            name: name.to_string(),
            source: source.as_str(),
            fingerprint: fp,
            first_seen,
        });
    }
    first_seen
}

/// The override set on this host, if any. A local override that no longer
/// parses must not be ignored: it is honoured as a pause.
fn local_override(ctx: &PlanContext<'_>, name: &str) -> Option<OverrideInput> {
    let local = ctx.inputs.local_overrides.get(name)?;
    let annotations = local
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), ScalarString(v.clone())))
        .collect();
    let spec = match crate::model::overrides::parse_annotations(&annotations) {
        Ok(parsed) => parsed.overrides?,
        Err(problems) => OverrideSpec {
            paused: true,
            ignore_fields: Vec::new(),
            reason: format!(
                "invalid local override, treated as a pause: {}",
                problems
                    .into_iter()
                    .map(|p| p.message)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            expires: None,
            expires_text: None,
            on_expiry: OnExpiry::Hold,
        },
    };
    Some(OverrideInput {
        source: OverrideSource::Local,
        spec,
        first_seen: local.set_at,
    })
}

/// When the override labels the provider shows were first seen (the
/// decision core parses the labels themselves).
fn provider_labels_seen(
    ctx: &PlanContext<'_>,
    name: &str,
    observed: &Observed,
    effects: &mut Vec<Effect>,
) -> Option<SystemTime> {
    let Observed::Found(obs) = observed else {
        return None;
    };
    let labels: Vec<String> = obs
        .labels
        .iter()
        .filter(|(k, _)| k.starts_with("tend.dev/") && !k.starts_with("tend.dev/owner-"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if labels.is_empty() {
        return None;
    }
    let fp = labels.join("\n");
    let source = OverrideSource::Provider.as_str();
    match ctx
        .inputs
        .overrides_seen
        .get(&(name.to_string(), source.to_string()))
    {
        Some(s) if s.fingerprint == fp => Some(s.first_seen),
        _ => {
            effects.push(Effect::OverrideSeen {
                name: name.to_string(),
                source,
                fingerprint: fp,
                first_seen: ctx.now,
            });
            Some(ctx.now)
        }
    }
}

/// What the decision changes in memory: first-seen times of out-of-band
/// drift (so `drift_grace` counts from the first sighting across cycles
/// and restarts), the last declaration of a managed resource, and the end
/// of a removed resource that is gone.
fn remember(
    name: &str,
    subject: &PlannedSubject<'_>,
    observed: &Observed,
    memory: &Memory,
    decision: &Decision,
    now: SystemTime,
    effects: &mut Vec<Effect>,
) {
    match subject {
        PlannedSubject::Removed(_) if matches!(observed, Observed::NotFound) => {
            effects.push(Effect::Forget {
                name: name.to_string(),
            });
        }
        PlannedSubject::Declared(d) if decision.rule != Rule::CorruptState => {
            if !matches!(observed, Observed::Failed(_)) {
                let mut fields: Vec<String> = decision
                    .drift
                    .iter()
                    .filter(|d| d.origin == DriftOrigin::OutOfBand)
                    .map(|d| d.field.clone())
                    .collect();
                if matches!(observed, Observed::NotFound) && memory.existed {
                    fields.push(String::new());
                }
                // Most cycles change nothing here: only a changed set is written.
                let unchanged = fields.len() == memory.drift_first_seen.len()
                    && fields
                        .iter()
                        .all(|f| memory.drift_first_seen.contains_key(f));
                if !unchanged {
                    effects.push(Effect::SyncDrift {
                        name: name.to_string(),
                        fields,
                        at: now,
                    });
                }
            }
            // Keep the last declaration (for a future tombstone) when it
            // changed; an unchanged spec needs no write.
            if memory.existed && memory.applied_spec_hash.as_ref() != Some(&d.spec_hash) {
                effects.push(Effect::Touch {
                    name: name.to_string(),
                    file: d.file.to_string_lossy().into_owned(),
                    manifest: serde_json::to_value(&d.manifest).unwrap_or_default(),
                });
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::overrides::fingerprint;
    use crate::engine::{DeletionGuard, Tombstone};
    use crate::journal::{LocalOverride, OverrideSeen};
    use crate::model::{Declaration, DeclarationSet, parse_file};
    use crate::provider::{
        OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, ResourceStatus,
    };
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
        DeclarationSet::from_files(vec![parse_file(Path::new("orders.yaml"), text.as_bytes())])
            .declarations
            .remove(0)
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
            labels: all,
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
            };
            let mut effects = Vec::new();
            let routed = Routed {
                subject,
                database_name: "orders".into(),
            };
            let r = plan_subject(&ctx, "p", &caps(), routed, observed, memory, &mut effects);
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
}
