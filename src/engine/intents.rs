//! Journalled operations and new work: which pending intent is replayed
//! and which the repository has overtaken (supersession), and the gate
//! that keeps new work off a resource while an earlier operation on it is
//! unconfirmed.
//!
//! # Guarantees
//! * An intent is replayed with its own id unless the declaration it came
//!   from has since been paused, changed (create/update of an older spec)
//!   or restored (a delete or release of a declaration that is back).
//! * While an intent is pending, the resource gets no new operation: its
//!   observation may not show that intent's effect yet, and a second
//!   operation could act on a state that is about to change.

use std::time::{Duration, SystemTime};

use super::decide::{Action, Decision, Rule};
use crate::model::operation::{OperationId, OperationKind};
use crate::model::{Declaration, SpecHash};

/// What happens to a pending intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntentVerdict {
    /// Replayed with the same id before any new work.
    Replay,
    /// Dropped (marked failed, `superseded: <why>`), not replayed.
    Supersede(&'static str),
}

impl IntentVerdict {
    /// The rule `explain` names for this verdict.
    pub(crate) fn rule(self) -> Rule {
        match self {
            IntentVerdict::Replay => Rule::PendingIntent,
            IntentVerdict::Supersede(_) => Rule::Superseded,
        }
    }
}

/// Decides a pending intent's fate against the current declaration
/// (`None`: the declaration is gone) and the local pause on this host.
pub(crate) fn verdict(
    kind: OperationKind,
    intent_spec: &SpecHash,
    declared: Option<&Declaration>,
    paused_locally: bool,
) -> IntentVerdict {
    if paused_locally {
        return IntentVerdict::Supersede("the resource is paused on this host");
    }
    let paused =
        declared.is_some_and(|d| d.annotations.overrides.as_ref().is_some_and(|o| o.paused));
    match (kind, declared) {
        (_, Some(_)) if paused => IntentVerdict::Supersede("the resource is paused now"),
        (OperationKind::Delete | OperationKind::Release, Some(_)) => {
            IntentVerdict::Supersede("the declaration is back in Git")
        }
        (OperationKind::Create | OperationKind::Update, Some(d)) if &d.spec_hash != intent_spec => {
            IntentVerdict::Supersede(
                "the declaration changed since; the next decision uses the new spec",
            )
        }
        _ => IntentVerdict::Replay,
    }
}

/// A journalled operation that is not confirmed yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingWork {
    pub kind: OperationKind,
    pub id: OperationId,
    pub last_error: Option<String>,
    /// Calls sent under its id so far.
    pub attempts: u32,
    /// When it was last tried (or journalled).
    pub last_attempt: SystemTime,
}

/// The longest a failing operation waits before it is tried again.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);

/// When an operation tried `attempts` times, last at `last`, is tried
/// again: 1 s after the first call, doubling with every call (a cycle's
/// own quick retries count), at most [`MAX_RETRY_DELAY`], spread by up to
/// 10 % from the operation's id so that many failures do not come back
/// together (derived, not random: the decision stays a function of its
/// inputs).
pub(crate) fn retry_at(id: &OperationId, attempts: u32, last: SystemTime) -> SystemTime {
    let exp = attempts.saturating_sub(1).min(16);
    let base = Duration::from_secs(1u64 << exp).min(MAX_RETRY_DELAY);
    let spread = id.0.bytes().fold(attempts, |h, b| {
        h.wrapping_mul(31).wrapping_add(u32::from(b))
    }) % 100;
    let jitter = base.mul_f64(f64::from(spread) / 1000.0);
    last.checked_add(base + jitter).unwrap_or(last)
}

/// Why new work on a resource waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WorkGate<'a> {
    /// An intent is pending (replayed first, or unresolved after replay).
    Pending(&'a PendingWork),
    /// An intent was replayed in this cycle and the decision is to create:
    /// the create is decided again on a fresh observation next cycle.
    JustReplayed,
}

/// Holds a decision's action behind a gate; the state and drift stay as
/// decided (the report still tells the truth about the resource).
pub(crate) fn hold_behind(mut decision: Decision, name: &str, gate: WorkGate<'_>) -> Decision {
    let planned = decision.action;
    if matches!(gate, WorkGate::JustReplayed) && planned != Action::Create {
        return decision;
    }
    let suspended = decision.rule == Rule::Suspended;
    decision.action = Action::Hold;
    decision.rule = Rule::PendingIntent;
    decision.changes.clear();
    decision.reason = match gate {
        WorkGate::Pending(work) => {
            // A failing call is tried again on its own time, in seconds at
            // first, not at the next resync; under a freeze nothing is sent,
            // so the freeze's end is the resource's next time.
            let at = retry_at(&work.id, work.attempts, work.last_attempt);
            if !suspended {
                decision.act_at = Some(at);
            }
            format!(
                "{} operation {} on `{name}` is journalled and not yet confirmed{}; no new work until it is: it is sent again with the same id at {} ({} attempt{} so far)",
                work.kind.as_str(),
                short(&work.id.0),
                work.last_error
                    .as_deref()
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default(),
                crate::time::rfc3339(at),
                work.attempts,
                if work.attempts == 1 { "" } else { "s" }
            )
            .into()
        }
        WorkGate::JustReplayed => format!(
            "an earlier operation on `{name}` was replayed in this cycle; the create is decided again on a fresh observation"
        )
        .into(),
    };
    decision
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeclarationSet, parse_file};
    use std::path::Path;

    fn declaration(annotations: &str, limit: u32) -> Declaration {
        let text = format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n  annotations:\n    x: y\n{annotations}spec:\n  owner: app\n  connectionLimit: {limit}\n"
        );
        std::sync::Arc::unwrap_or_clone(
            DeclarationSet::from_files(vec![parse_file(Path::new("o.yaml"), text.as_bytes())])
                .declarations
                .remove(0),
        )
    }

    /// Under a freeze nothing is sent, so a retry time (soon in the past
    /// for good) would wake the resource cycle after cycle: the freeze's
    /// own next time stays.
    #[test]
    fn a_frozen_resource_keeps_the_freezes_time_not_a_retry_time() {
        let mut decision = Decision::new(
            crate::engine::State::Drifted,
            Action::None,
            Rule::Suspended,
            "suspended",
        );
        let ends = SystemTime::UNIX_EPOCH + Duration::from_secs(99_999);
        decision.act_at = Some(ends);
        let work = PendingWork {
            kind: OperationKind::Update,
            id: OperationId("abcdef0123456789".into()),
            last_error: Some("503".into()),
            attempts: 1,
            last_attempt: SystemTime::UNIX_EPOCH,
        };
        let held = hold_behind(decision, "orders", WorkGate::Pending(&work));
        assert_eq!(held.act_at, Some(ends));
    }

    #[test]
    fn retries_back_off_to_a_cap() {
        let id = OperationId("op".into());
        let t0 = SystemTime::UNIX_EPOCH;
        let wait = |n| retry_at(&id, n, t0).duration_since(t0).unwrap();
        assert!(wait(1) >= Duration::from_secs(1) && wait(1) < Duration::from_millis(1100));
        assert!(wait(2) >= Duration::from_secs(2));
        assert!(wait(5) >= Duration::from_secs(16));
        assert!(wait(30) <= MAX_RETRY_DELAY.mul_f64(1.1));
        assert!(wait(30) >= MAX_RETRY_DELAY);
    }

    #[test]
    fn an_intent_of_the_current_spec_is_replayed() {
        let d = declaration("", 10);
        assert_eq!(
            verdict(OperationKind::Update, &d.spec_hash, Some(&d), false),
            IntentVerdict::Replay
        );
        assert_eq!(
            verdict(OperationKind::Delete, &d.spec_hash, None, false),
            IntentVerdict::Replay,
            "a delete of a declaration still removed goes on"
        );
    }

    #[test]
    fn overtaken_intents_are_superseded() {
        let old = declaration("", 10);
        let new = declaration("", 20);
        assert!(matches!(
            verdict(OperationKind::Update, &old.spec_hash, Some(&new), false),
            IntentVerdict::Supersede(why) if why.contains("changed")
        ));
        assert!(matches!(
            verdict(OperationKind::Delete, &old.spec_hash, Some(&old), false),
            IntentVerdict::Supersede(why) if why.contains("back in Git")
        ));
        let paused = declaration(
            "    tend.dev/paused: \"true\"\n    tend.dev/override-reason: INC-1\n",
            10,
        );
        assert!(matches!(
            verdict(OperationKind::Update, &paused.spec_hash, Some(&paused), false),
            IntentVerdict::Supersede(why) if why.contains("paused")
        ));
        assert!(matches!(
            verdict(OperationKind::Delete, &old.spec_hash, None, true),
            IntentVerdict::Supersede(why) if why.contains("this host")
        ));
    }

    #[test]
    fn a_pending_intent_holds_new_work_but_keeps_the_state() {
        let mut decision = Decision::new(
            crate::engine::State::Drifted,
            Action::Update,
            Rule::DeclaredChange,
            "update",
        );
        decision.changes.insert("connectionLimit", 20.into());
        let work = PendingWork {
            kind: OperationKind::Update,
            id: OperationId("abcdef0123456789".into()),
            last_error: Some("503".into()),
            attempts: 3,
            last_attempt: SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
        };
        let held = hold_behind(decision.clone(), "orders", WorkGate::Pending(&work));
        assert_eq!(held.action, Action::Hold);
        assert_eq!(held.rule, Rule::PendingIntent);
        assert_eq!(held.state, crate::engine::State::Drifted);
        assert!(held.changes.is_empty());
        assert!(
            held.reason.contains("abcdef012345") && held.reason.contains("503"),
            "{}",
            held.reason
        );
        // Tried again 4 s (+ up to 10 %) after its third call.
        let at = held.act_at.expect("a retry time");
        let wait = at
            .duration_since(SystemTime::UNIX_EPOCH + Duration::from_secs(1000))
            .unwrap();
        assert!(
            wait >= Duration::from_secs(4) && wait < Duration::from_millis(4400),
            "{wait:?}"
        );
        assert!(held.reason.contains("3 attempts so far"), "{}", held.reason);
        assert_eq!(
            hold_behind(decision, "orders", WorkGate::JustReplayed).action,
            Action::Update,
            "only a create waits after a replay"
        );
    }
}
