//! Field-level drift: what differs, where the difference came from, and
//! which differences may be corrected now.

use std::borrow::Cow;
use std::time::SystemTime;

use serde_json::Value;

use super::{
    Action, DecideInput, Decision, Drift, DriftOrigin, Rule, State, duration, join_fields,
    report_only, show, time,
};
use crate::engine::desired::manages_parameters;
use crate::engine::overrides::EffectiveOverride;
use crate::model::observation::{Observation, Observed};
use crate::model::{Declaration, FlatMap, Mutability, NormalizedSpec};

pub(super) fn compute_drift(
    input: &DecideInput<'_>,
    decl: &Declaration,
    obs: &Observation,
    ov: &EffectiveOverride,
) -> Vec<Drift> {
    let spec = &decl.normalized_spec;
    let mut drift = Vec::new();
    let push = |field: &str, want: &Value, have: &Value| {
        // The spec unchanged since the last apply: nothing is a declared change
        // (and the applied field values need not even be loaded).
        let unchanged = input.memory.applied_spec_hash.as_ref() == Some(&decl.spec_hash);
        let declared = input.memory.unconfirmed_write
            || !unchanged
                && (input
                    .memory
                    .applied_fields
                    .get(field)
                    .is_some_and(|applied| applied != want)
                    || (input.memory.applied_spec_hash.is_some()
                        && !input.memory.applied_fields.contains_key(field)
                        && want != &Value::Null));
        drift.push(Drift {
            field: field.to_string(),
            desired: want.clone(),
            observed: have.clone(),
            origin: if declared {
                DriftOrigin::Declared
            } else {
                DriftOrigin::OutOfBand
            },
            ignored: ov.ignores(field),
        });
    };
    each_difference(
        spec,
        obs,
        input.capabilities,
        manages_parameters(&decl.manifest, input.capabilities),
        push,
    );
    drift
}

/// Calls `differs(field, declared, observed)` for every field of the
/// normalised `spec` the provider observes (`capabilities`) whose
/// observed value does not satisfy the declared one ([`values_match`]):
/// each setting on its own (`parameters.work_mem`, a list setting in the
/// provider's canonical form), and, when the declaration manages
/// `parameters`, each setting the provider has that the spec does not
/// declare (declared as null). A field the provider could not observe is
/// never a difference. Walks the spec in place: it runs for every
/// resource in every cycle.
pub fn each_difference(
    spec: &NormalizedSpec,
    obs: &Observation,
    capabilities: &crate::model::observation::Capabilities,
    manages_parameters: bool,
    mut differs: impl FnMut(&str, &Value, &Value),
) {
    let mut check = |field: &str, want: &Value, have: &Value| {
        if !values_match(field, want, have) && !obs.unobserved.iter().any(|u| u == field) {
            differs(field, want, have);
        }
    };
    let mut key = String::new();
    for (name, want) in spec.iter() {
        if !capabilities.fields.contains_key(name) {
            continue;
        }
        match (name, want) {
            ("parameters", Value::Object(map)) => {
                for (setting, want) in map {
                    key.clear();
                    key.push_str("parameters.");
                    key.push_str(setting);
                    // A list setting as the provider stores it (None for
                    // the rest: no copy).
                    let canonical = capabilities.canonical_setting(setting, want);
                    let want = canonical.as_ref().unwrap_or(want);
                    check(&key, want, obs.fields.get(&key).unwrap_or(&Value::Null));
                }
            }
            _ => check(name, want, obs.fields.get(name).unwrap_or(&Value::Null)),
        }
    }
    if manages_parameters {
        let declared = spec.get("parameters").and_then(Value::as_object);
        for (field, have) in obs.fields.iter_from("parameters.") {
            let Some(setting) = field.strip_prefix("parameters.") else {
                break;
            };
            if !declared.is_some_and(|p| p.contains_key(setting)) {
                check(field, &Value::Null, have);
            }
        }
    }
}

/// Whether an observed value satisfies a declared one. Extensions match by
/// name, and only the version and schema the declaration states are
/// compared (the server fills in the rest; extensions it has beyond the
/// declared ones are not tend's to remove).
pub fn values_match(field: &str, want: &Value, have: &Value) -> bool {
    if want == have {
        return true;
    }
    match (field, want, have) {
        ("extensions", Value::Array(wanted), Value::Array(present)) => wanted.iter().all(|w| {
            let name = w.get("name");
            present.iter().any(|p| {
                p.get("name") == name
                    && w.as_object()
                        .is_some_and(|o| o.iter().all(|(k, v)| p.get(k) == Some(v)))
            })
        }),
        // A setting is text: a provider that reports `128` reports the
        // declared `"128"`.
        (setting, Value::String(text), Value::Number(_) | Value::Bool(_))
            if setting.starts_with("parameters.") =>
        {
            serde_json::from_str::<Value>(text).ok().as_ref() == Some(have)
        }
        _ => false,
    }
}

/// Decides what to do about `drift` (empty when in sync). The decision
/// carries the drift, whatever it decides.
pub(super) fn decide_drift(
    input: &DecideInput<'_>,
    decl: &Declaration,
    ov: &EffectiveOverride,
    drift: Vec<Drift>,
) -> Decision {
    let active: Vec<&Drift> = drift.iter().filter(|d| !d.ignored).collect();
    let mut decision = hands_off(input, decl, ov, &drift, &active)
        .unwrap_or_else(|| corrections(input, decl, &active));
    decision.drift = drift;
    decision
}

/// The rules under which nothing is changed, in order: a difference that
/// needs replacement, a pause, a field that did not converge, nothing (left)
/// to change. (One function: the order of these rules is the decision.)
fn hands_off(
    input: &DecideInput<'_>,
    decl: &Declaration,
    ov: &EffectiveOverride,
    drift: &[Drift],
    active: &[&Drift],
) -> Option<Decision> {
    let name = decl.name();
    let policy = input.policy;
    let immutable: Vec<&&Drift> = active
        .iter()
        .filter(|d| input.capabilities.mutability(&d.field) == Some(Mutability::Immutable))
        .collect();
    if !immutable.is_empty() {
        let list = immutable
            .iter()
            .map(|d| format!("{} {} → {}", d.field, show(&d.observed), show(&d.desired)))
            .collect::<Vec<_>>()
            .join(", ");
        return Some(Decision::new(
            State::Blocked,
            Action::None,
            Rule::RequiresReplacement,
            format!(
                "requires replacement: {list} cannot be changed in place, and tend never drops and recreates a database on its own"
            ),
        ));
    }
    if ov.paused {
        // The reason must agree with the drift list shown under it: ignored
        // fields that differ are drift too, only left alone.
        let what = if !active.is_empty() {
            "drift is reported only".to_string()
        } else if drift.is_empty() {
            "no drift".to_string()
        } else {
            format!(
                "{} {}, left alone by the override",
                join_fields(drift.iter().map(|d| d.field.as_str())),
                differ(drift.len())
            )
        };
        return Some(Decision::new(
            State::Overridden,
            Action::None,
            Rule::Paused,
            format!(
                "`{name}` is paused by an override ({}): {what}; nothing is changed",
                ov.reasons.join("; ")
            ),
        ));
    }
    let stuck: Vec<&&Drift> = active
        .iter()
        .filter(|d| {
            input
                .memory
                .failed_attempts
                .get(&d.field)
                .map_or(0, |a| a.against(&d.desired, &d.observed))
                >= policy.max_update_attempts
        })
        .collect();
    if !stuck.is_empty() {
        let fields = join_fields(stuck.iter().map(|d| d.field.as_str()));
        return Some(Decision::new(
            State::Unconvergeable,
            Action::None,
            Rule::Unconvergeable,
            format!(
                "{fields} still {} after {} confirmed updates; tend stops retrying until the declaration or the observed value changes (or `tend state reset-attempts {name}` asks it to try again)",
                differ(stuck.len()),
                policy.max_update_attempts
            ),
        ));
    }
    if !active.is_empty() {
        return None;
    }
    if drift.is_empty() {
        // Unobserved declared fields are unknown, not in sync: said so.
        let unobserved = unobserved_declared(input, decl);
        let reason: Cow<'static, str> = if unobserved.is_empty() {
            "in sync with the declaration".into()
        } else {
            format!(
                "in sync on every field the provider observed; {} could not be observed this time (unknown, not in sync)",
                join_fields(unobserved.iter().copied())
            )
            .into()
        };
        return Some(Decision::new(
            State::InSync,
            Action::None,
            Rule::InSync,
            reason,
        ));
    }
    let fields = join_fields(drift.iter().map(|d| d.field.as_str()));
    Some(Decision::new(
        State::Overridden,
        Action::None,
        Rule::IgnoredDrift,
        format!(
            "{fields} {} but {} left alone by an override ({})",
            differ(drift.len()),
            if drift.len() == 1 { "is" } else { "are" },
            ov.reasons.join("; ")
        ),
    ))
}

/// The fields the declaration sets that the observation could not see.
fn unobserved_declared<'a>(input: &'a DecideInput<'_>, decl: &Declaration) -> Vec<&'a str> {
    let Observed::Found(obs) = input.observed else {
        return Vec::new();
    };
    obs.unobserved
        .iter()
        .filter(|f| {
            decl.normalized_spec
                .get(f.as_str())
                .is_some_and(|v| !v.is_null())
        })
        .map(String::as_str)
        .collect()
}

/// The verb for `count` fields.
fn differ(count: usize) -> &'static str {
    if count == 1 { "differs" } else { "differ" }
}

/// Declared changes apply now; out-of-band drift waits for `drift_grace`
/// (or, with `driftPolicy: Report`, is only reported).
fn corrections(input: &DecideInput<'_>, decl: &Declaration, active: &[&Drift]) -> Decision {
    let policy = input.policy;
    let mut changes = FlatMap::new();
    let mut held: Vec<(&str, SystemTime)> = Vec::new();
    let report = report_only(policy, &decl.manifest);
    for d in active {
        match d.origin {
            DriftOrigin::Declared => {
                changes.insert(d.field.clone(), d.desired.clone());
            }
            DriftOrigin::OutOfBand if report => {}
            DriftOrigin::OutOfBand => {
                let first = input
                    .memory
                    .drift_first_seen
                    .get(&d.field)
                    .copied()
                    .unwrap_or(input.now);
                let due = crate::time::add(first, policy.drift_grace);
                if input.now >= due {
                    changes.insert(d.field.clone(), d.desired.clone());
                } else {
                    held.push((&d.field, due));
                }
            }
        }
    }
    let act_at = held.iter().map(|(_, t)| *t).min();
    let held_fields = join_fields(held.iter().map(|(f, _)| *f));
    let mut decision = if !changes.is_empty() {
        let declared = active
            .iter()
            .any(|d| d.origin == DriftOrigin::Declared && changes.contains_key(&d.field));
        let fields = join_fields(changes.keys());
        let (rule, why) = if !declared {
            (
                Rule::DriftCorrect,
                "out-of-band drift outlived drift_grace".to_string(),
            )
        } else if input.memory.unconfirmed_write {
            // What is missing is tend's own write that did not finish.
            let why = match &input.memory.failure {
                Some(f) => format!(
                    "tend's own {} did not finish: the provider refused it partway (operation {}, at {}: {})",
                    f.kind,
                    super::short(&f.operation_id),
                    time(f.at),
                    f.message
                ),
                None => "tend's own earlier write was never confirmed".to_string(),
            };
            (Rule::DeclaredChange, why)
        } else {
            (
                Rule::DeclaredChange,
                "the declaration changed in Git".to_string(),
            )
        };
        let mut reason = format!("update {fields}: {why}");
        if let Some(t) = act_at {
            reason.push_str(&format!(
                "; out-of-band drift on {held_fields} is held until {}",
                time(t)
            ));
        }
        Decision::new(State::Drifted, Action::Update, rule, reason)
    } else if report {
        let out_of_band = join_fields(
            active
                .iter()
                .filter(|d| d.origin == DriftOrigin::OutOfBand)
                .map(|d| d.field.as_str()),
        );
        Decision::new(
            State::Drifted,
            Action::None,
            Rule::DriftReportOnly,
            format!("out-of-band drift on {out_of_band}; driftPolicy Report: tend only reports it"),
        )
    } else {
        Decision::new(
            State::Drifted,
            Action::Hold,
            Rule::DriftGrace,
            format!(
                "out-of-band drift on {held_fields} is held for drift_grace ({}) so an operator can add an override; tend corrects it at {}",
                duration(policy.drift_grace),
                act_at.map(time).unwrap_or_default()
            ),
        )
    };
    decision.changes = changes;
    decision.act_at = act_at;
    decision
}
