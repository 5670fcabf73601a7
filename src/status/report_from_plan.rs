//! A report made from a plan: each planned resource as the report shows
//! it, and the released databases shown once.

use std::sync::Arc;

use super::report::{
    AgentInfo, DriftReport, ErrorReport, OperationReport, OrphanedOverrideReport, OverrideReport,
    Report, ResourceReport, SourceInfo, Summary, SuspensionReport,
};
use crate::config::Config;
use crate::engine::{Action, DriftOrigin, State};
use crate::provider::{Observed, OperationId};
use crate::reconcile::Plan;
use crate::time::rfc3339;

/// Builds the report of a plan.
pub fn build_report(config: &Config, plan: &Plan<'_>) -> Report {
    let mut resources: Vec<Arc<ResourceReport>> = plan
        .resources
        .iter()
        .map(|r| Arc::new(resource_report(plan, r)))
        .collect();
    if !plan.released.is_empty() {
        resources.extend(plan.released.iter().map(|r| Arc::new(released_report(r))));
        resources.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Report {
        format_version: 1,
        generated_at: rfc3339(plan.now),
        agent: AgentInfo {
            id: plan.agent_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        },
        source: SourceInfo::of(config, plan.commit.clone(), plan.commit_time),
        summary: Summary::of(&resources, plan.errors.len()),
        resources,
        errors: plan.errors.iter().map(ErrorReport::from).collect(),
        orphaned_overrides: plan
            .orphaned_overrides
            .iter()
            .map(|o| OrphanedOverrideReport {
                name: o.name.clone(),
                reason: o.reason.clone(),
                set_at: rfc3339(o.set_at),
            })
            .collect(),
        status_branch: None,
        suspended: plan
            .suspension
            .as_ref()
            .map(|s| SuspensionReport::of(s, plan.now)),
        applied: None,
    }
}

/// A database tend released, shown once after the release: what, where,
/// when, and which commit removed its declaration.
fn released_report(r: &crate::journal::Release) -> ResourceReport {
    let commit = if r.removal_commit.is_empty() {
        String::new()
    } else {
        format!(
            " after commit {} removed its declaration",
            r.removal_commit.get(..12).unwrap_or(&r.removal_commit)
        )
    };
    ResourceReport {
        name: r.name.clone(),
        file: r.file.clone(),
        state: State::Released,
        action: Action::None,
        rule: crate::engine::Rule::Release.as_str().into(),
        reason: format!(
            "released at {}{commit}: database `{}` stays at provider `{}`, no longer managed by tend (operation {})",
            rfc3339(r.at),
            r.database_name,
            r.provider,
            r.operation_id
        )
        .into(),
        drift: Vec::new(),
        override_: None,
        operation: Some(Box::new(OperationReport {
            id: OperationId(r.operation_id.clone()),
            kind: crate::provider::OperationKind::Release,
            state: "done".into(),
        })),
        observed_at: None,
        unobserved: Vec::new(),
        acts_at: None,
        propose: None,
        owned_by: None,
    }
}

/// One resource as the report shows it.
fn resource_report(plan: &Plan<'_>, r: &crate::reconcile::PlannedResource<'_>) -> ResourceReport {
    let d = &r.decision;
    let ov = &d.overrides;
    let (observed_at, unobserved) = match &r.observed {
        Observed::Found(o) => (Some(o.observed_at), declared_unobserved(r, &o.unobserved)),
        Observed::NotFound => (Some(plan.now), Vec::new()),
        Observed::Failed(_) => (None, Vec::new()),
    };
    // Drift tend leaves alone stays: Git can declare it instead.
    let kept = d.drift.iter().any(|x| {
        x.origin == DriftOrigin::OutOfBand
            && (x.ignored || !ov.is_empty() || d.rule == crate::engine::Rule::DriftReportOnly)
    });
    let propose =
        (kept && r.subject.declaration().is_some()).then(|| format!("tend propose {}", r.name));
    ResourceReport {
        name: r.name.clone(),
        file: r.file.to_string(),
        state: d.state,
        action: d.action,
        rule: d.rule.as_str().into(),
        reason: d.reason.clone(),
        drift: d
            .drift
            .iter()
            .map(|x| DriftReport {
                field: x.field.clone(),
                desired: x.desired.clone(),
                observed: x.observed.clone(),
                origin: x.origin,
                ignored: x.ignored,
            })
            .collect(),
        override_: (!ov.is_empty()).then(|| {
            Box::new(OverrideReport {
                source: ov
                    .sources
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                kind: ov.kind().to_string(),
                fields: ov.declared_fields.clone(),
                reason: ov.reasons.join("; "),
                expires: ov.expires.map(rfc3339),
                expired: ov.expired,
                first_seen: ov.first_seen.map(rfc3339),
            })
        }),
        operation: match &r.operation {
            Some(op) => Some(Box::new(OperationReport {
                id: op.id.clone(),
                kind: op.kind,
                state: "planned".into(),
            })),
            // Refused for good: that operation is the resource's, failed.
            None if d.rule == crate::engine::Rule::OperationFailed => {
                r.memory.failure.as_ref().and_then(|f| {
                    Some(Box::new(OperationReport {
                        id: crate::provider::OperationId(f.operation_id.clone()),
                        kind: crate::provider::OperationKind::parse(&f.kind)?,
                        state: "failed".into(),
                    }))
                })
            }
            // Held behind a journalled intent: that operation is the
            // resource's, and it is pending.
            None => plan
                .intents
                .iter()
                .find(|i| i.name == r.name && i.rule == crate::engine::Rule::PendingIntent)
                .map(|i| {
                    Box::new(OperationReport {
                        id: i.id.clone(),
                        kind: i.kind,
                        state: "pending".into(),
                    })
                }),
        },
        observed_at,
        unobserved,
        acts_at: d.act_at.map(rfc3339),
        propose,
        owned_by: match (&r.observed, d.rule) {
            (Observed::Found(o), crate::engine::Rule::OwnedByOtherAgent) => {
                o.marker_labels().map(|(agent, _)| agent.to_string())
            }
            _ => None,
        },
    }
}

/// The fields a resource's declaration sets that its observation left
/// unobserved (an unobserved field nobody declared is nobody's concern).
fn declared_unobserved(
    r: &crate::reconcile::PlannedResource<'_>,
    unobserved: &[String],
) -> Vec<String> {
    if unobserved.is_empty() {
        return Vec::new();
    }
    let declared = |spec: &crate::model::NormalizedSpec| -> Vec<String> {
        unobserved
            .iter()
            .filter(|f| spec.get(f.as_str()).is_some_and(|v| !v.is_null()))
            .cloned()
            .collect()
    };
    match &r.subject {
        crate::reconcile::PlannedSubject::Declared(d) => declared(&d.normalized_spec),
        other => other
            .manifest()
            .map(|m| declared(&crate::model::NormalizedSpec::of(m)))
            .unwrap_or_default(),
    }
}
