//! The planner: one decision per routed subject, and the effects on
//! memory those decisions imply. Pure: everything comes in (the inputs,
//! the observation, the guard's verdict, `now`); effects go out as data
//! for [`crate::journal::effects::commit`] (which only `apply` calls).
//!
//! Around the decision core it assembles the three override sources
//! (annotation, local, provider label) with their first sightings, and
//! applies the rules that need more than one resource or the journal:
//! the deletion gate, the pending-intent gate, unreadable state.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use super::inputs::Inputs;
use super::routing::{Routed, corrupt_reason};
use super::{PlannedResource, PlannedSubject};
use crate::engine::intents::{PendingWork, WorkGate, hold_behind};
use crate::engine::overrides::{fingerprint, legacy_fingerprint};
use crate::engine::{
    Action, DecideInput, Decision, DeletionGate, DeletionGuard, DriftOrigin, Memory, OverrideInput,
    OverrideSource, Policy, Renamed, Rule, State, Subject, decide,
};
use crate::journal::effects::Effect;
use crate::model::{OnExpiry, OverrideSpec};
use crate::provider::{Capabilities, Observed, OperationKind};

/// What every decision of a cycle shares.
#[derive(Debug)]
pub(crate) struct PlanContext<'a> {
    pub policy: &'a Policy,
    pub now: SystemTime,
    pub guard: &'a DeletionGuard,
    pub inputs: &'a Inputs,
    /// Pending intents that hold new work, by resource.
    pub gates: &'a HashMap<String, PendingWork>,
    /// Resources whose intents were replayed in this cycle.
    pub just_replayed: &'a HashSet<String>,
    /// Renames ([`super::routing::Routing::renamed`]): each name to the
    /// other's.
    pub renamed: &'a HashMap<String, String>,
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
pub(crate) fn plan_subject<'s>(
    ctx: &PlanContext<'_>,
    provider: &std::sync::Arc<str>,
    capabilities: &Capabilities,
    routed: Routed<'s>,
    mut observed: Observed,
    memory: std::sync::Arc<Memory>,
    effects: &mut Vec<Effect>,
) -> PlannedResource<'s> {
    let subject = routed.subject;
    if capabilities.parameter_names_ignore_case
        && let (PlannedSubject::Declared(d), Observed::Found(obs)) = (&subject, &mut observed)
        && let Some(parameters) = &d.manifest.spec.parameters
    {
        let declared: Vec<String> = parameters
            .keys()
            .map(|k| format!("parameters.{k}"))
            .collect();
        obs.align_parameter_names(declared.iter().map(String::as_str));
    }
    let name = subject.name().to_string();
    let (file, spec_hash) = match &subject {
        // `to_str` first: a Git path is UTF-8, and checking it so costs half
        // of `to_string_lossy`'s scan (this runs for every resource).
        PlannedSubject::Declared(d) => (
            d.file
                .to_str()
                .map_or_else(|| d.file.to_string_lossy(), Cow::Borrowed),
            d.spec_hash.clone(),
        ),
        PlannedSubject::Removed(t) => (Cow::Borrowed(""), t.last.spec_hash()),
        PlannedSubject::Unreadable => (Cow::Borrowed(""), crate::model::SpecHash::from("")),
    };
    let decision = match ctx.inputs.corrupt.get(&name) {
        // Unreadable state: reported as it is, nothing remembered (no
        // gate may replace this verdict).
        Some(problems) => Decision::new(
            State::Error,
            Action::None,
            Rule::CorruptState,
            corrupt_reason(&name, problems),
        ),
        None => {
            let decision = decide_subject(
                ctx,
                provider,
                capabilities,
                &name,
                &subject,
                &observed,
                &memory,
                effects,
            );
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
            decision
        }
    };
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
        provider: provider.clone(),
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
            spec: OverrideSpec::clone(spec),
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
    let renamed = ctx.renamed.get(name).map(|other| {
        let removed = match subject {
            PlannedSubject::Removed(_) => name,
            _ => other.as_str(),
        };
        Renamed {
            other: other.as_str(),
            approved: ctx.inputs.approvals.get(removed).map(|a| a.reason.as_str()),
        }
    });
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
        suspension: ctx.inputs.suspension.as_ref(),
        renamed,
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
    let spec = match crate::model::overrides::parse_override_strings(&local.annotations) {
        Ok(parsed) => *parsed.overrides?,
        Err(problems) => OverrideSpec {
            paused: true,
            ignore_fields: Vec::new(),
            reason: format!("invalid local override, treated as a pause: {problems}"),
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
        // Gone, and the decision says so (an absence within the provider's
        // read lag after tend's own write is held, and remembered); or
        // taken over by the live declaration of a rename.
        PlannedSubject::Removed(_)
            if decision.state == crate::engine::State::Released
                && (matches!(observed, Observed::NotFound) || decision.rule == Rule::Renamed) =>
        {
            effects.push(Effect::Forget {
                name: name.to_string(),
            });
        }
        PlannedSubject::Declared(d) => {
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
#[path = "plan_tests.rs"]
mod tests;
