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

use super::decide::{Action, Decision, Rule};
use crate::model::{Declaration, SpecHash};
use crate::provider::{OperationId, OperationKind};

/// What happens to a pending intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentVerdict {
    /// Replayed with the same id before any new work.
    Replay,
    /// Dropped (marked failed, `superseded: <why>`), not replayed.
    Supersede(&'static str),
}

impl IntentVerdict {
    /// The rule `explain` names for this verdict.
    pub fn rule(self) -> Rule {
        match self {
            IntentVerdict::Replay => Rule::PendingIntent,
            IntentVerdict::Supersede(_) => Rule::Superseded,
        }
    }
}

/// Decides a pending intent's fate against the current declaration
/// (`None`: the declaration is gone) and the local pause on this host.
pub fn verdict(
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
pub struct PendingWork {
    pub kind: OperationKind,
    pub id: OperationId,
    pub last_error: Option<String>,
}

/// Why new work on a resource waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkGate<'a> {
    /// An intent is pending (replayed first, or unresolved after replay).
    Pending(&'a PendingWork),
    /// An intent was replayed in this cycle and the decision is to create:
    /// the create is decided again on a fresh observation next cycle.
    JustReplayed,
}

/// Holds a decision's action behind a gate; the state and drift stay as
/// decided (the report still tells the truth about the resource).
pub fn hold_behind(mut decision: Decision, name: &str, gate: WorkGate<'_>) -> Decision {
    let planned = decision.action;
    if matches!(gate, WorkGate::JustReplayed) && planned != Action::Create {
        return decision;
    }
    decision.action = Action::Hold;
    decision.rule = Rule::PendingIntent;
    decision.changes.clear();
    decision.reason = match gate {
        WorkGate::Pending(work) => format!(
            "{} operation {} on `{name}` is journalled and not yet confirmed{}; no new work until it is (the next apply replays it with the same id)",
            work.kind.as_str(),
            short(&work.id.0),
            work.last_error
                .as_deref()
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default()
        ),
        WorkGate::JustReplayed => format!(
            "an earlier operation on `{name}` was replayed in this cycle; the create is decided again on a fresh observation"
        ),
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
        DeclarationSet::from_files(vec![parse_file(Path::new("o.yaml"), text.as_bytes())])
            .declarations
            .remove(0)
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
            "update".into(),
        );
        decision.changes.insert("connectionLimit".into(), 20.into());
        let work = PendingWork {
            kind: OperationKind::Update,
            id: OperationId("abcdef0123456789".into()),
            last_error: Some("503".into()),
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
        assert_eq!(
            hold_behind(decision, "orders", WorkGate::JustReplayed).action,
            Action::Update,
            "only a create waits after a replay"
        );
    }
}
