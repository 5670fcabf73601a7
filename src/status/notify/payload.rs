//! The body of a notification, in tend's JSON or as a Slack message, and
//! its signature.

use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use super::{AGENT, SOURCE, Transition};
use crate::config::notify::{NotifyEvent, NotifyFormat};
use crate::status::report::{Report, ResourceReport};

/// The header a signed body carries.
pub(crate) const SIGNATURE_HEADER: &str = "X-Tend-Signature";

/// `sha256=<hex HMAC-SHA256 of body with secret>`.
pub(crate) fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        // HMAC takes keys of any length: unreachable, and a wrong
        // signature is what a receiver would then see.
        Err(_) => return "sha256=".into(),
    };
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(71);
    hex.push_str("sha256=");
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// Whether `t` is about a resource (not the source, not the agent).
fn about_resource(t: &Transition) -> bool {
    t.subject != SOURCE && t.subject != AGENT
}

fn resource<'a>(report: &'a Report, t: &Transition) -> Option<&'a ResourceReport> {
    about_resource(t)
        .then(|| report.entries().find(|r| r.name == t.subject))
        .flatten()
}

/// tend's JSON payload of `t` (docs/reports.md, "Notifications").
pub(crate) fn json_payload(t: &Transition, report: &Report) -> Value {
    let r = resource(report, t);
    let mut body = json!({
        "event": t.event.as_str(),
        "resource": about_resource(t).then_some(&t.subject),
        "at": report.generated_at,
        "agent": report.agent,
        "source": {
            "url": report.source.url,
            "branch": report.source.branch,
            "commit": report.source.commit,
        },
    });
    if let Some(r) = r {
        body["state"] = json!(r.state.as_str());
        body["reason"] = json!(r.reason);
        if t.event == NotifyEvent::DriftDetected {
            body["drift"] = json!(r.drift);
        }
        if matches!(
            t.event,
            NotifyEvent::OverrideExpiring | NotifyEvent::OverrideExpired
        ) {
            body["override"] = json!(r.override_);
        }
    }
    if t.event == NotifyEvent::SourceError {
        body["sourceError"] = json!(report.source.error);
    }
    if t.event == NotifyEvent::DeletionHeld {
        body["approve"] = json!(format!(
            "tend deletions approve {} --reason TEXT",
            t.subject
        ));
    }
    if let (NotifyEvent::OperationFailed, Some(r)) = (t.event, r) {
        body["operation"] = json!(r.operation);
    }
    if t.event == NotifyEvent::Suspended {
        body["suspended"] = json!(report.suspended);
    }
    if t.event == NotifyEvent::Recovered {
        body["ended"] = json!(t.ended.iter().map(|c| c.as_str()).collect::<Vec<_>>());
    }
    body
}

/// One line saying what happened.
pub(crate) fn headline(t: &Transition, report: &Report) -> String {
    let r = resource(report, t);
    let who = if t.subject == SOURCE {
        "the source".to_string()
    } else if t.subject == AGENT {
        "the agent".to_string()
    } else {
        format!("`{}`", t.subject)
    };
    match t.event {
        NotifyEvent::DriftDetected => {
            let fields: Vec<&str> = r
                .map(|r| r.drift.iter().map(|d| d.field.as_str()).collect())
                .unwrap_or_default();
            format!("{who}: out-of-band drift on {}", fields.join(", "))
        }
        NotifyEvent::OverrideExpiring => format!(
            "{who}: an override expires {}",
            r.and_then(|r| r.override_.as_ref())
                .and_then(|o| o.expires.clone())
                .map(|t| format!("at {t}"))
                .unwrap_or_else(|| "soon".into())
        ),
        NotifyEvent::OverrideExpired => format!("{who}: an override expired"),
        NotifyEvent::Blocked => format!("{who} is Blocked"),
        NotifyEvent::Stalled => format!("{who}: its deletion is Stalled"),
        NotifyEvent::Unconvergeable => format!("{who} is Unconvergeable"),
        NotifyEvent::DeletionHeld => format!(
            "{who}: its deletion is held by the mass-deletion guard (`tend deletions approve {} --reason …` lets it go)",
            t.subject
        ),
        NotifyEvent::Error => format!("{who} is in Error: nothing is done about it"),
        NotifyEvent::OperationFailed => format!(
            "{who}: the provider refused {}",
            r.and_then(|r| r.operation.as_ref())
                .map_or("an operation".to_string(), |o| format!(
                    "the {}",
                    o.kind.as_str()
                ))
        ),
        NotifyEvent::SourceError => format!("the source {} cannot be read", report.source.url),
        NotifyEvent::Suspended => format!(
            "the agent is suspended: it changes nothing until `tend resume` ({})",
            report.suspended.as_ref().map_or("", |s| s.reason.as_str())
        ),
        NotifyEvent::Recovered => format!(
            "{who} recovered ({} over)",
            t.ended
                .iter()
                .map(|c| c.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// What follows the headline: the source's error, an override's reason,
/// or the resource's reason.
pub(crate) fn detail(t: &Transition, report: &Report) -> String {
    match (resource(report, t), t.event) {
        (_, NotifyEvent::SourceError) => report
            .source
            .error
            .as_ref()
            .map(|e| format!("{} (since {})", e.message, e.since))
            .unwrap_or_default(),
        (Some(r), NotifyEvent::OverrideExpiring | NotifyEvent::OverrideExpired) => r
            .override_
            .as_ref()
            .map(|o| format!("reason: {}", o.reason))
            .unwrap_or_default(),
        (Some(r), _) => r.reason.to_string(),
        (None, _) => String::new(),
    }
}

/// A Slack incoming-webhook message (`text` for notifications, `blocks`
/// for the channel).
pub(crate) fn slack_payload(t: &Transition, report: &Report) -> Value {
    let headline = headline(t, report);
    let detail = detail(t, report);
    let commit = report.source.commit.as_deref().unwrap_or("none");
    let context = format!(
        "agent `{}` · commit `{}` · event `{}`",
        report.agent.id,
        commit.get(..12).unwrap_or(commit),
        t.event.as_str()
    );
    json!({
        "text": format!("tend: {headline}"),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": format!("*tend*: {headline}\n{detail}")}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
        ],
    })
}

/// The body of a transition for a webhook receiver of `format` (JSON or
/// Slack; the other formats are not sent transitions as such).
pub(crate) fn body(format: NotifyFormat, t: &Transition, report: &Report) -> String {
    let value = match format {
        NotifyFormat::Slack => slack_payload(t, report),
        _ => json_payload(t, report),
    };
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::signature;

    #[test]
    fn the_signature_is_hmac_sha256_in_hex() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
