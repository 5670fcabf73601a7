//! Alerts for Alertmanager's API (`POST /api/v2/alerts`): one alert per
//! condition that holds, identified by its labels, sent again while it
//! holds and resolved (`endsAt` now) when it ends.
//!
//! # Guarantees
//! * An alert's labels depend only on what it is about (the condition,
//!   the resource, the agent): the firing, the re-sent and the resolved
//!   alert are one alert to Alertmanager.
//! * A firing alert ends by itself `4 × resend` after it was last sent, as
//!   Prometheus's do: an agent that stops sending cannot leave an alert
//!   firing forever (`TendAgentDown` says why it stopped).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::{AGENT, Condition, SOURCE, Transition, payload};
use crate::status::report::Report;

/// How much longer than `resend` a firing alert lasts unless sent again.
const LIFETIME_RESENDS: u32 = 4;

/// The alert's name: `Tend` and the event, in Pascal case
/// (`drift-detected` → `TendDriftDetected`).
fn alertname(condition: Condition) -> String {
    let mut name = String::from("Tend");
    for word in condition.event().as_str().split('-') {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            name.extend(first.to_uppercase());
            name.push_str(chars.as_str());
        }
    }
    name
}

fn severity(condition: Condition) -> &'static str {
    match condition {
        Condition::DeletionHeld
        | Condition::OperationFailed
        | Condition::SourceError
        | Condition::Stalled
        | Condition::Error => "critical",
        _ => "warning",
    }
}

/// The runbook of a condition (relative to the repository, as the
/// shipped Prometheus rules link them).
pub(crate) fn runbook(condition: Condition) -> &'static str {
    match condition {
        Condition::Drift => "docs/runbooks/drift-held.md",
        Condition::OverrideExpiring | Condition::OverrideExpired => {
            "docs/runbooks/override-expiry.md"
        }
        Condition::Blocked => "docs/runbooks/blocked.md",
        Condition::Stalled => "docs/runbooks/deletion-stalled.md",
        Condition::Unconvergeable => "docs/runbooks/unconvergeable.md",
        Condition::SourceError => "docs/runbooks/source-unreachable.md",
        Condition::Suspended => "docs/runbooks/README.md",
        Condition::OperationFailed => "docs/runbooks/operation-failed.md",
        Condition::DeletionHeld => "docs/runbooks/deletion-held.md",
        Condition::Error => "docs/runbooks/provider-unavailable.md",
    }
}

/// The labels that identify the alert of `condition` about `subject`.
fn labels(subject: &str, condition: Condition, report: &Report) -> BTreeMap<&'static str, String> {
    let mut labels = BTreeMap::from([
        ("alertname", alertname(condition)),
        ("event", condition.event().as_str().to_string()),
        ("agent", report.agent.id.clone()),
        ("severity", severity(condition).to_string()),
    ]);
    if subject != SOURCE && subject != AGENT {
        labels.insert("resource", subject.to_string());
    }
    labels
}

/// The alert of `condition` about `subject` as it holds now (`endsAt`
/// `resend × 4` from `now`), with what the report says of it.
pub(crate) fn firing(
    subject: &str,
    condition: Condition,
    report: &Report,
    report_url: Option<&str>,
    now: SystemTime,
    resend: Duration,
) -> Value {
    let t = Transition {
        event: condition.event(),
        subject: subject.to_string(),
        ended: Vec::new(),
    };
    let mut alert = json!({
        "labels": labels(subject, condition, report),
        "annotations": {
            "summary": payload::headline(&t, report),
            "description": payload::detail(&t, report),
            "runbook_url": runbook(condition),
        },
        "endsAt": crate::time::rfc3339(crate::time::add(now, resend * LIFETIME_RESENDS)),
    });
    if let Some(url) = report_url {
        alert["generatorURL"] = json!(url);
    }
    alert
}

/// The alert of `condition` about `subject`, resolved at `now`.
pub(crate) fn resolved(
    subject: &str,
    condition: Condition,
    report: &Report,
    report_url: Option<&str>,
    now: SystemTime,
) -> Value {
    let mut alert = json!({
        "labels": labels(subject, condition, report),
        "annotations": {
            "summary": format!("{} (over)", alertname(condition)),
            "runbook_url": runbook(condition),
        },
        "endsAt": crate::time::rfc3339(now),
    });
    if let Some(url) = report_url {
        alert["generatorURL"] = json!(url);
    }
    alert
}

/// `alerts` moved on to `now`: each firing one ends `4 × resend` later.
pub(crate) fn restamp(alerts: &[Value], now: SystemTime, resend: Duration) -> String {
    let ends = crate::time::rfc3339(crate::time::add(now, resend * LIFETIME_RESENDS));
    let alerts: Vec<Value> = alerts
        .iter()
        .map(|a| {
            let mut a = a.clone();
            a["endsAt"] = json!(ends);
            a
        })
        .collect();
    Value::Array(alerts).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alert_names_are_the_events_in_pascal_case() {
        assert_eq!(alertname(Condition::Drift), "TendDriftDetected");
        assert_eq!(alertname(Condition::DeletionHeld), "TendDeletionHeld");
        assert_eq!(alertname(Condition::Error), "TendError");
    }
}
