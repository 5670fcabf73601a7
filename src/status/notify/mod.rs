//! Notifications on transitions (`[[notify]]`): a message when something
//! starts being wrong (drift detected, an override expiring or expired,
//! Blocked, Stalled, Unconvergeable, the source failing) and when all of
//! it is over (recovered), never one per cycle.
//!
//! # Guarantees
//! * A transition is found by comparing the conditions of the fleet's
//!   report with the conditions last notified, which the state store
//!   keeps: a restart neither sends a transition again nor loses one.
//! * The conditions and the messages they cause are recorded in one
//!   transaction, before anything is sent; delivery reads the queue, so a
//!   message survives a crash and a receiver that is down.
//! * Delivery never blocks reconciliation: it runs after the cycle
//!   (`apply`) or in a task of its own (`run`), each attempt bounded by
//!   the receiver's `timeout`, retried with backoff.
//! * Payloads carry what the report says, never a credential.

pub(crate) mod alertmanager;
pub(crate) mod commit_status;
pub(crate) mod deliver;
pub(crate) mod payload;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use super::report::Report;
use crate::config::notify::NotifyEvent;
use crate::engine::{DriftOrigin, State};

/// Something that holds about one subject until it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Condition {
    Drift,
    OverrideExpiring,
    OverrideExpired,
    Blocked,
    Stalled,
    Unconvergeable,
    SourceError,
    /// The agent is suspended (`tend suspend`), about [`AGENT`].
    Suspended,
    /// The provider refused an operation for good (`Failed`).
    OperationFailed,
    /// The mass-deletion guard holds the resource's deletion.
    DeletionHeld,
    /// The resource is in `Error` (not observed, an invalid provider
    /// label): nothing is done about it.
    Error,
}

impl Condition {
    const ALL: [Condition; 11] = [
        Condition::Drift,
        Condition::OverrideExpiring,
        Condition::OverrideExpired,
        Condition::Blocked,
        Condition::Stalled,
        Condition::Unconvergeable,
        Condition::SourceError,
        Condition::Suspended,
        Condition::OperationFailed,
        Condition::DeletionHeld,
        Condition::Error,
    ];

    /// Its name in the state store.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Condition::Drift => "drift",
            Condition::OverrideExpiring => "override-expiring",
            Condition::OverrideExpired => "override-expired",
            Condition::Blocked => "blocked",
            Condition::Stalled => "stalled",
            Condition::Unconvergeable => "unconvergeable",
            Condition::SourceError => "source-error",
            Condition::Suspended => "suspended",
            Condition::OperationFailed => "operation-failed",
            Condition::DeletionHeld => "deletion-held",
            Condition::Error => "error",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The event its start is notified as.
    pub(crate) fn event(self) -> NotifyEvent {
        match self {
            Condition::Drift => NotifyEvent::DriftDetected,
            Condition::OverrideExpiring => NotifyEvent::OverrideExpiring,
            Condition::OverrideExpired => NotifyEvent::OverrideExpired,
            Condition::Blocked => NotifyEvent::Blocked,
            Condition::Stalled => NotifyEvent::Stalled,
            Condition::Unconvergeable => NotifyEvent::Unconvergeable,
            Condition::SourceError => NotifyEvent::SourceError,
            Condition::Suspended => NotifyEvent::Suspended,
            Condition::OperationFailed => NotifyEvent::OperationFailed,
            Condition::DeletionHeld => NotifyEvent::DeletionHeld,
            Condition::Error => NotifyEvent::Error,
        }
    }
}

/// The subject of the source's conditions (resource names are never
/// empty).
pub(crate) const SOURCE: &str = "";
/// The subject of the agent's own conditions (a suspension): never a
/// resource's name (those are DNS labels).
pub(crate) const AGENT: &str = "(agent)";

/// What a notification is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    pub event: NotifyEvent,
    /// The resource, or [`SOURCE`].
    pub subject: String,
    /// For `recovered`: the conditions that ended.
    pub ended: Vec<Condition>,
}

impl Transition {
    /// The condition whose start this is (`None` for `recovered`).
    pub(crate) fn started(&self) -> Option<Condition> {
        Condition::ALL.into_iter().find(|c| c.event() == self.event)
    }
}

/// The conditions of `report` at `now`, by `(subject, condition)`.
pub(crate) fn conditions(
    report: &Report,
    now: SystemTime,
    warn_before: Duration,
) -> BTreeSet<(String, Condition)> {
    let mut out = BTreeSet::new();
    if report.source.error.is_some() {
        out.insert((SOURCE.to_string(), Condition::SourceError));
    }
    if report.suspended.as_ref().is_some_and(|s| s.in_force) {
        out.insert((AGENT.to_string(), Condition::Suspended));
    }
    for r in &report.resources {
        let mut add = |c| {
            out.insert((r.name.clone(), c));
        };
        match r.state {
            State::Blocked => add(Condition::Blocked),
            State::Stalled => add(Condition::Stalled),
            State::Unconvergeable => add(Condition::Unconvergeable),
            State::Failed => add(Condition::OperationFailed),
            State::Error => add(Condition::Error),
            _ => {}
        }
        if r.rule == crate::engine::Rule::DeletionGuard.as_str() {
            add(Condition::DeletionHeld);
        }
        // A pause leaves every field alone: its drift is expected, not news
        // (until the pause expires).
        let paused = r
            .override_
            .as_ref()
            .is_some_and(|o| o.kind.contains("paused") && !o.expired);
        if !paused
            && r.drift
                .iter()
                .any(|d| d.origin == DriftOrigin::OutOfBand && !d.ignored)
        {
            add(Condition::Drift);
        }
        if let Some(o) = &r.override_ {
            let expires = o
                .expires
                .as_deref()
                .and_then(|t| humantime::parse_rfc3339(t).ok());
            if o.expired {
                add(Condition::OverrideExpired);
            } else if expires.is_some_and(|t| t <= crate::time::add(now, warn_before)) {
                add(Condition::OverrideExpiring);
            }
        }
    }
    out
}

/// What changed from the conditions last notified (`before`, as stored:
/// unknown names are ignored) to `now`: each condition that started, and
/// `recovered` naming exactly the conditions of a subject that ended (an
/// override that was expiring and has now expired did not end: it went on
/// to the next stage). A subject gone from the report (a removed
/// declaration, released) is forgotten without a message, except a
/// stalled deletion, which recovered: the database is gone.
pub(crate) fn transitions(
    before: &BTreeSet<(String, String)>,
    now: &BTreeSet<(String, Condition)>,
    report: &Report,
) -> Vec<Transition> {
    let before: BTreeSet<(String, Condition)> = before
        .iter()
        .filter_map(|(s, c)| Some((s.clone(), Condition::parse(c)?)))
        .collect();
    let mut out: Vec<Transition> = now
        .difference(&before)
        .map(|(subject, c)| Transition {
            event: c.event(),
            subject: subject.clone(),
            ended: Vec::new(),
        })
        .collect();
    let mut ended: BTreeMap<&str, Vec<Condition>> = BTreeMap::new();
    for (subject, c) in before.difference(now) {
        let expired_now = *c == Condition::OverrideExpiring
            && now.contains(&(subject.clone(), Condition::OverrideExpired));
        if !expired_now {
            ended.entry(subject.as_str()).or_default().push(*c);
        }
    }
    for (subject, mut conditions) in ended {
        let present = subject == SOURCE
            || subject == AGENT
            || report.resources.iter().any(|r| r.name == subject);
        if !present {
            conditions.retain(|c| *c == Condition::Stalled);
        }
        if !conditions.is_empty() {
            out.push(Transition {
                event: NotifyEvent::Recovered,
                subject: subject.to_string(),
                ended: conditions,
            });
        }
    }
    out
}

/// The conditions as the state store keeps them.
pub(crate) fn stored(now: &BTreeSet<(String, Condition)>) -> BTreeSet<(String, String)> {
    now.iter()
        .map(|(s, c)| (s.clone(), c.as_str().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(resources: serde_json::Value, source_error: bool) -> Report {
        let mut r = serde_json::json!({
            "formatVersion": 1,
            "generatedAt": "2027-01-15T08:00:00Z",
            "agent": {"id": "a", "version": "0"},
            "source": {"url": "u", "branch": "main", "commit": "c"},
            "summary": {"total": 0, "inSync": 0, "drifted": 0, "missing": 0, "blocked": 0, "overridden": 0, "deleting": 0, "errors": 0},
            "resources": resources,
            "errors": [],
        });
        if source_error {
            r["source"]["error"] = serde_json::json!({"message": "down", "since": "2027-01-15T07:00:00Z", "failures": 3});
        }
        serde_json::from_value(r).unwrap()
    }

    fn resource(name: &str, state: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut r = serde_json::json!({
            "name": name, "file": "f", "state": state, "action": "None", "reason": "r",
            "drift": [], "override": null, "operation": null,
        });
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        r
    }

    fn at(t: &str) -> SystemTime {
        humantime::parse_rfc3339(t).unwrap()
    }

    fn events(t: &[Transition]) -> Vec<(&str, &str)> {
        t.iter()
            .map(|t| (t.event.as_str(), t.subject.as_str()))
            .collect()
    }

    #[test]
    fn every_condition_starts_once_and_recovery_needs_all_of_them_gone() {
        let day = Duration::from_secs(24 * 3600);
        let now = at("2027-01-15T08:00:00Z");
        let expiring = serde_json::json!({"override": {"source": "annotation", "kind": "paused", "fields": [], "reason": "INC-1", "expires": "2027-01-15T20:00:00Z", "expired": false}});
        let expired = serde_json::json!({"override": {"source": "annotation", "kind": "paused", "fields": [], "reason": "INC-1", "expires": "2027-01-15T07:00:00Z", "expired": true}});
        let later = serde_json::json!({"override": {"source": "annotation", "kind": "paused", "fields": [], "reason": "INC-1", "expires": "2027-03-01T00:00:00Z", "expired": false}});
        let drift = serde_json::json!({"drift": [{"field": "connectionLimit", "desired": 1, "observed": 2, "origin": "out-of-band"}]});
        let ignored = serde_json::json!({"drift": [{"field": "connectionLimit", "desired": 1, "observed": 2, "origin": "out-of-band", "ignored": true}]});
        let first = report(
            serde_json::json!([
                resource("a", "Blocked", serde_json::json!({})),
                resource("b", "Stalled", serde_json::json!({})),
                resource("c", "Unconvergeable", serde_json::json!({})),
                resource("d", "Overridden", expiring.clone()),
                resource("e", "Drifted", drift),
                resource("f", "Overridden", ignored),
                resource("g", "Overridden", later),
            ]),
            true,
        );
        let now_c = conditions(&first, now, day);
        let t = transitions(&BTreeSet::new(), &now_c, &first);
        assert_eq!(
            events(&t),
            [
                ("source-error", ""),
                ("blocked", "a"),
                ("stalled", "b"),
                ("unconvergeable", "c"),
                ("override-expiring", "d"),
                ("drift-detected", "e"),
            ]
        );
        // The same again: nothing.
        assert!(transitions(&stored(&now_c), &now_c, &first).is_empty());

        // d's override expires; a is fine again; the source recovers; e
        // goes away entirely.
        let second = report(
            serde_json::json!([
                resource("a", "InSync", serde_json::json!({})),
                resource("b", "Stalled", serde_json::json!({})),
                resource("c", "Unconvergeable", serde_json::json!({})),
                resource("d", "Overridden", expired),
            ]),
            false,
        );
        let later_c = conditions(&second, now, day);
        let t = transitions(&stored(&now_c), &later_c, &second);
        assert_eq!(
            events(&t),
            [
                ("override-expired", "d"),
                ("recovered", ""),
                ("recovered", "a")
            ]
        );
        assert_eq!(t[2].ended, [Condition::Blocked]);
    }

    /// docs/reports.md, "Notifications", rule by rule, as transitions.
    #[test]
    fn each_notification_rule_is_a_transition() {
        let day = Duration::from_secs(24 * 3600);
        let now = at("2027-01-15T08:00:00Z");
        let drift = serde_json::json!([{"field": "connectionLimit", "desired": 1, "observed": 2, "origin": "out-of-band"}]);
        let pause = |expires: &str, expired: bool| serde_json::json!({"source": "annotation", "kind": "paused", "fields": [], "reason": "INC-1", "expires": expires, "expired": expired});
        let step = |before: &BTreeSet<(String, Condition)>, resources: serde_json::Value| {
            let r = report(resources, false);
            let c = conditions(&r, now, day);
            let t = transitions(&stored(before), &c, &r);
            (c, t)
        };

        // No drift-detected for drift a pause leaves alone.
        let (c, t) = step(
            &BTreeSet::new(),
            serde_json::json!([resource(
                "p",
                "Overridden",
                serde_json::json!({"drift": drift, "override": pause("2027-03-01T00:00:00Z", false)})
            )]),
        );
        assert!(events(&t).is_empty(), "{t:?}");
        assert!(c.is_empty());

        // Drift, then an override covers it: recovered names exactly the
        // drift, while the override's own condition starts.
        let (c, _) = step(
            &BTreeSet::new(),
            serde_json::json!([resource(
                "d",
                "Drifted",
                serde_json::json!({"drift": drift})
            )]),
        );
        let (c, t) = step(
            &c,
            serde_json::json!([resource(
                "d",
                "Overridden",
                serde_json::json!({"drift": drift, "override": pause("2027-01-15T09:00:00Z", false)})
            )]),
        );
        assert_eq!(events(&t), [("override-expiring", "d"), ("recovered", "d")]);
        assert_eq!(t[1].ended, [Condition::Drift]);
        // The override then expires: that is not a recovery.
        let (_, t) = step(
            &c,
            serde_json::json!([resource(
                "d",
                "Overridden",
                serde_json::json!({"drift": drift, "override": pause("2027-01-15T07:59:00Z", true)})
            )]),
        );
        assert_eq!(
            events(&t),
            [("drift-detected", "d"), ("override-expired", "d")]
        );

        // The mass-deletion guard, an Error, a Failed operation.
        let (c, t) = step(
            &BTreeSet::new(),
            serde_json::json!([
                resource(
                    "g",
                    "Deleting",
                    serde_json::json!({"action": "Hold", "rule": "deletion-guard"})
                ),
                resource("e", "Error", serde_json::json!({})),
                resource("s", "Stalled", serde_json::json!({})),
                resource("x", "Drifted", serde_json::json!({"drift": drift})),
            ]),
        );
        assert_eq!(
            events(&t),
            [
                ("error", "e"),
                ("deletion-held", "g"),
                ("stalled", "s"),
                ("drift-detected", "x")
            ]
        );
        // The stalled deletion completes (gone from the report): recovered;
        // a drifted declaration removed from Git is forgotten silently.
        let (_, t) = step(
            &c,
            serde_json::json!([
                resource(
                    "g",
                    "Deleting",
                    serde_json::json!({"action": "Hold", "rule": "deletion-guard"})
                ),
                resource("e", "Error", serde_json::json!({})),
            ]),
        );
        assert_eq!(events(&t), [("recovered", "s")]);
        assert_eq!(t[0].ended, [Condition::Stalled]);
    }
}
