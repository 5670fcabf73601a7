//! A removed declaration (a tombstone): release ownership, or delete under
//! every guard.

use super::{
    Action, DecideInput, Decision, Rule, State, Tombstone, duration, observation_failed, short,
    time,
};
use crate::engine::deletion::DeletionGate;
use crate::engine::overrides::EffectiveOverride;
use crate::model::DeletionPolicy;
use crate::model::observation::Observed;

pub(super) fn decide_removed(
    input: &DecideInput<'_>,
    tomb: &Tombstone,
    ov: &EffectiveOverride,
) -> Decision {
    let name = &tomb.last.metadata.name;
    let policy = input.policy;
    let obs = match input.observed {
        Observed::Failed(message) => return observation_failed(name, message),
        Observed::NotFound => {
            let db = tomb.last.database_name();
            if let Some(wait) = super::absence_unproven(input, &db, State::Deleting) {
                return wait;
            }
            let (state, rule, reason) = match tomb.last.spec.deletion_policy {
                DeletionPolicy::Delete => (
                    State::Released,
                    Rule::Deleted,
                    "deleted at the provider; the tombstone can go",
                ),
                DeletionPolicy::Retain => (
                    State::Released,
                    Rule::Released,
                    "removed from Git and no longer at the provider",
                ),
            };
            return Decision::new(state, Action::None, rule, format!("`{name}` was {reason}"));
        }
        Observed::Found(obs) => obs,
    };
    let ours = obs
        .marker_labels()
        .is_some_and(|(agent_id, declaration)| agent_id == policy.agent_id && declaration == name);
    // The live declaration of a rename took the database over (adopted
    // it): nothing is left to release or delete.
    if let Some(renamed) = input.renamed
        && obs.marker_labels().is_some_and(|(agent_id, declaration)| {
            agent_id == policy.agent_id && declaration == renamed.other
        })
    {
        return Decision::new(
            State::Released,
            Action::None,
            Rule::Renamed,
            format!(
                "`{name}` was removed from Git, and `{}` took its database `{}` over: the tombstone can go",
                renamed.other, obs.database_name
            ),
        );
    }
    match tomb.last.spec.deletion_policy {
        DeletionPolicy::Retain => release(name, ours, ov),
        DeletionPolicy::Delete => delete(input, tomb, ov, ours, &obs.database_name),
    }
}

/// `deletionPolicy: Retain`: give the database up, keep it.
fn release(name: &str, ours: bool, ov: &EffectiveOverride) -> Decision {
    if ours && ov.paused {
        Decision::new(
            State::Overridden,
            Action::None,
            Rule::DeletionPaused,
            format!(
                "`{name}` was removed from Git, but it is paused ({}): ownership is kept until the override goes",
                ov.reasons.join("; ")
            ),
        )
    } else if ours {
        Decision::new(
            State::Released,
            Action::Release,
            Rule::Release,
            format!(
                "`{name}` was removed from Git with deletionPolicy Retain: release ownership and leave the database"
            ),
        )
    } else {
        Decision::new(
            State::Released,
            Action::None,
            Rule::Released,
            format!("`{name}` was removed from Git and released; the database stays"),
        )
    }
}

/// `deletionPolicy: Delete`: delete only what carries this agent's marker,
/// with no override, after `deletion_delay`, under the guard.
fn delete(
    input: &DecideInput<'_>,
    tomb: &Tombstone,
    ov: &EffectiveOverride,
    ours: bool,
    database_name: &str,
) -> Decision {
    let name = &tomb.last.metadata.name;
    let policy = input.policy;
    if !ours {
        return Decision::new(
            State::Blocked,
            Action::None,
            Rule::DeletionNotOurs,
            format!(
                "`{name}` was removed with deletionPolicy Delete, but `{}` does not carry this agent's marker: tend never deletes what it cannot prove it owns",
                database_name
            ),
        );
    }
    if !ov.is_empty() && (ov.paused || !ov.ignore_fields.is_empty()) {
        return Decision::new(
            State::Deleting,
            Action::None,
            Rule::DeletionPaused,
            format!(
                "`{name}` would be deleted, but an override is set ({}): nothing is deleted while it holds",
                ov.reasons.join("; ")
            ),
        );
    }
    if let Some(renamed) = input.renamed
        && renamed.approved.is_none()
        && tomb.delete_requested_at.is_none()
    {
        return Decision::new(
            State::Deleting,
            Action::Hold,
            Rule::Renamed,
            format!(
                "`{name}` was removed in {} with deletionPolicy Delete, but declaration `{other}` names the same database `{database_name}` at this provider (a rename of metadata.name?): the deletion is held. To keep the database and its data under `{other}`, add the annotation `tend.dev/adopt: \"true\"` to `{other}`; to delete it (and let `{other}` create an empty one), `tend deletions approve {name} --reason …`",
                short(&tomb.removal_commit),
                other = renamed.other,
            ),
        );
    }
    if let Some(since) = tomb.delete_requested_at
        && input.now >= crate::time::add(since, policy.deletion_stall)
    {
        let error = tomb.last_error.as_deref().unwrap_or("no error reported");
        // Still under the guards: a stalled deletion is retried only
        // where a fresh one would be allowed.
        return Decision::new(
            State::Stalled,
            if input.deletion.allows() {
                Action::Delete
            } else {
                Action::Hold
            },
            Rule::DeletionStalled,
            format!(
                "the deletion of `{name}` has not been confirmed since {} (more than deletion_stall, {}; last error: {error})",
                time(since),
                duration(policy.deletion_stall)
            ),
        );
    }
    let due = crate::time::add(tomb.removed_at, policy.deletion_delay);
    if input.now < due {
        let mut d = Decision::new(
            State::Deleting,
            Action::Hold,
            Rule::DeletionDelay,
            format!(
                "`{name}` was removed in {} with deletionPolicy Delete; it is deleted after deletion_delay ({}) at {}",
                short(&tomb.removal_commit),
                duration(policy.deletion_delay),
                time(due)
            ),
        );
        d.act_at = Some(due);
        return d;
    }
    if let Some(held) = gate(input, tomb) {
        return held;
    }
    Decision::new(
        State::Deleting,
        Action::Delete,
        Rule::Delete,
        format!(
            "`{name}` was removed in {} with deletionPolicy Delete and deletion_delay has passed: delete it",
            short(&tomb.removal_commit)
        ),
    )
}

/// What the mass-deletion guard says, as a decision unless it says go
/// (`None`: a plain `Delete` follows).
fn gate(input: &DecideInput<'_>, tomb: &Tombstone) -> Option<Decision> {
    let name = &tomb.last.metadata.name;
    match input.deletion {
        DeletionGate::Allowed => None,
        DeletionGate::Approved { reason } => Some(Decision::new(
            State::Deleting,
            Action::Delete,
            Rule::DeletionApproved,
            format!(
                "`{name}` was removed in {} with deletionPolicy Delete; the mass-deletion guard holds deletions, but an operator approved this one ({reason}): delete it",
                short(&tomb.removal_commit)
            ),
        )),
        DeletionGate::Held {
            due,
            limit,
            managed,
            since,
        } => Some(Decision::new(
            State::Deleting,
            Action::Hold,
            Rule::DeletionGuard,
            format!(
                "the mass-deletion guard holds every deletion since {}: {due} were due together, more than the limit of {limit} for {managed} managed resources (max_deletions / max_deletion_percent); nothing is deleted until the limits allow all {due}, the declarations are restored, or `tend deletions approve {name} --reason …`",
                time(*since)
            ),
        )),
        DeletionGate::EmptyTree => Some(Decision::new(
            State::Deleting,
            Action::Hold,
            Rule::DeletionGuard,
            "the tracked tree declares nothing; an empty tree never deletes anything (it is more likely a mistake than the end of every database)",
        )),
    }
}
