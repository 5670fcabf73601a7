//! After a cycle's operations: which of its decisions stand, so that the
//! decision made again for the report covers only what the operations
//! changed.
//!
//! A decision is a function of its resource's declaration, memory and
//! observation, of what is fleet-wide (the suspension, the mass-deletion
//! guard, renames) and of the time. After operations that were each
//! confirmed by an observation, what changed is known exactly:
//! * the operated resources' memory (applied, wrote, the intent's end)
//!   and their databases (the confirming observations);
//! * the memory of the resources the cycle's own effects wrote to (drift
//!   first seen, a declaration touched, an override seen);
//! * and so the observation of any resource naming one of those databases
//!   at the same provider.
//!
//! Those are decided again ([`decided_again`]) and put in the cycle's plan
//! in place of their first decisions ([`merge`]); every other decision
//! stands as the cycle made it, moments before (its `act_at` still says
//! when it falls due, and the next cycle decides it at its own time). At
//! 10,000 resources, deciding every one again after a one-file change
//! cost a one-shot `tend apply` 20 ms, and the running agent as much for
//! each provider at each change.
//!
//! # When nothing stands
//! Everything is decided again when a fleet-wide input may have moved: an
//! effect that is not one resource's (the guard's hold, an intent ended
//! outside the executor), a rename in the cycle, a due deletion counted
//! by the guard (a create or an adoption moves its base), an operation
//! that ends management (a delete, a release), or two decisions that
//! cannot be told apart by name or by database; and, found by the second
//! pass, when something was written beside the cycle between the two
//! (an operator's pause, override or approval, the suspension, another
//! worker's guard hold) or a deletion came due meanwhile
//! ([`still_stands`]).

use std::collections::{HashMap, HashSet};

use super::Plan;
use super::observe::{Listing, ProviderView};
use crate::executor::{Confirmation, Executed};
use crate::journal::effects::Effect;
use crate::provider::{Observation, Observed, OperationKind};

/// What operators and other workers write beside a cycle that any of its
/// decisions may read (local overrides and pauses, approvals, the
/// deletion guard's holds, the suspension): compared between a cycle's
/// two passes, since a decision that stands was made before the second
/// pass read them.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Beside {
    local_overrides: HashMap<String, crate::journal::LocalOverride>,
    approvals: HashMap<String, crate::journal::Approval>,
    held_deletions: HashMap<String, crate::engine::HeldDeletion>,
    suspension: Option<crate::engine::Suspension>,
}

impl Beside {
    pub(super) fn of(inputs: &super::inputs::Inputs) -> Beside {
        Beside {
            local_overrides: inputs.local_overrides.clone(),
            approvals: inputs.approvals.clone(),
            held_deletions: inputs.held_deletions.clone(),
            suspension: inputs.suspension.clone(),
        }
    }
}

/// What a planning pass's effects on memory wrote to.
#[derive(Debug, Default)]
pub(super) struct Written {
    /// The resources named by an effect.
    names: HashSet<String>,
    /// An effect, or an input of the pass, that is not one resource's.
    fleet_wide: bool,
}

impl Written {
    /// What `effects` write to; `renames`: whether the pass saw a rename
    /// (two resources decided from each other).
    pub(super) fn of(effects: &[Effect], renames: bool) -> Written {
        let mut written = Written {
            names: HashSet::new(),
            fleet_wide: renames,
        };
        for effect in effects {
            match effect {
                Effect::AddTombstone { name, .. }
                | Effect::RemoveTombstone { name }
                | Effect::Forget { name }
                | Effect::SyncDrift { name, .. }
                | Effect::Touch { name, .. }
                | Effect::OverrideSeen { name, .. }
                | Effect::DeletionProgress { name, .. }
                | Effect::Wrote { name, .. }
                | Effect::Applied { name, .. }
                | Effect::OperationFailed { name, .. } => {
                    written.names.insert(name.clone());
                }
                Effect::Released(release) => {
                    written.names.insert(release.name.clone());
                }
                Effect::HoldDeletions { .. } | Effect::ReleaseDeletions | Effect::Intent { .. } => {
                    written.fleet_wide = true;
                }
            }
        }
        written
    }
}

/// The resources of `plan` to decide again after `operations` (each
/// confirmed, by its entry in `confirmed`), given what the plan's own
/// effects wrote; `None`: every one (see the module's docs).
pub(super) fn decided_again(
    plan: &Plan<'_>,
    written: &Written,
    operations: &[Executed],
    confirmed: &HashMap<String, Box<Confirmation>>,
) -> Option<HashSet<String>> {
    let may_stand = !written.fleet_wide
        && plan.guard.due == 0
        && plan.guard.trip.is_none()
        && operations.iter().all(|e| {
            matches!(
                e.kind,
                OperationKind::Create | OperationKind::Update | OperationKind::Adopt
            )
        });
    // Sorted by name: two decisions under one name are neighbours.
    let resources = &plan.resources;
    let told_apart = resources.windows(2).all(|pair| pair[0].name < pair[1].name);
    if !may_stand || !told_apart {
        return None;
    }
    let mut again: HashSet<String> = written.names.clone();
    again.extend(operations.iter().map(|e| e.name.clone()));
    // Their databases, by name (then by provider: a handful).
    let mut databases: HashMap<Vec<u8>, Vec<&str>> = HashMap::new();
    for r in resources.iter().filter(|r| again.contains(&r.name)) {
        // A resource that cannot be read names no database (and is
        // decided again whatever: routing adds it at every pass).
        let Some(manifest) = r.subject.manifest() else {
            continue;
        };
        let mut names = vec![manifest.database_name_bytes().collect::<Vec<u8>>()];
        names.extend(
            confirmed
                .get(&r.name)
                .map(|c| c.database_name.clone().into_bytes()),
        );
        for database in names {
            databases.entry(database).or_default().push(&r.provider);
        }
    }
    let mut name = Vec::new();
    for r in resources {
        if again.contains(&r.name) {
            continue;
        }
        let Some(manifest) = r.subject.manifest() else {
            continue;
        };
        name.clear();
        name.extend(manifest.database_name_bytes());
        if databases
            .get(&name)
            .is_some_and(|providers| providers.contains(&&*r.provider))
        {
            again.insert(r.name.clone());
        }
    }
    Some(again)
}

/// What the providers show after a cycle's operations: the cycle's own
/// observations (consumed with its plan: at 10,000 resources two plans at
/// once doubled the peak memory), each confirmed database replaced by the
/// observation that confirmed its operation (a confirmed delete: gone).
/// Only for a plan whose every provider was observed.
pub(super) fn views_after(
    plan: Plan<'_>,
    confirmed: HashMap<String, Box<Confirmation>>,
) -> HashMap<String, ProviderView> {
    let mut views: HashMap<String, Vec<Observation>> = HashMap::new();
    let mut provider_of = HashMap::new();
    for r in plan.resources {
        let view = views.entry(r.provider.to_string()).or_default();
        if let Observed::Found(obs) = r.observed {
            view.push(obs);
        }
        if confirmed.contains_key(&r.name) {
            provider_of.insert(r.name, r.provider.to_string());
        }
    }
    confirm(views, &provider_of, confirmed)
}

/// [`views_after`] for the resources decided again alone (their
/// observations copied: the plan stays).
pub(super) fn views_of(
    plan: &Plan<'_>,
    again: &HashSet<String>,
    confirmed: HashMap<String, Box<Confirmation>>,
) -> HashMap<String, ProviderView> {
    let mut views: HashMap<String, Vec<Observation>> = HashMap::new();
    let mut provider_of = HashMap::new();
    for r in plan.resources.iter().filter(|r| again.contains(&r.name)) {
        let view = views.entry(r.provider.to_string()).or_default();
        if let Observed::Found(obs) = &r.observed {
            view.push(obs.clone());
        }
        if confirmed.contains_key(&r.name) {
            provider_of.insert(r.name.clone(), r.provider.to_string());
        }
    }
    confirm(views, &provider_of, confirmed)
}

/// `views` with each confirmation in place. Confirmations go in after
/// every observation: a tombstone and a new declaration may share a
/// database, and the one whose operation ran must not be overwritten by
/// the other's older observation.
fn confirm(
    views: HashMap<String, Vec<Observation>>,
    provider_of: &HashMap<String, String>,
    confirmed: HashMap<String, Box<Confirmation>>,
) -> HashMap<String, ProviderView> {
    let mut views: HashMap<String, Listing> = views
        .into_iter()
        .map(|(provider, observed)| (provider, Listing::new(observed)))
        .collect();
    for (name, c) in confirmed {
        let Some(view) = provider_of.get(&name).and_then(|p| views.get_mut(p)) else {
            continue;
        };
        match c.observation {
            // Filed under the database the operation was confirmed on
            // (the observation is of that name: observed by it).
            Some(mut obs) => {
                obs.database_name = c.database_name;
                view.insert(obs);
            }
            None => {
                view.remove(&c.database_name);
            }
        };
    }
    views.into_iter().map(|(p, v)| (p, Ok(v))).collect()
}

/// `first` with the decisions of `again` (a pass that decided only the
/// resources `decided` names, as [`decided_again`] gave them) in place of
/// its own; a resource named there that `again` no longer has (its state
/// forgotten by the cycle's effects) is gone. What is fleet-wide
/// (intents, the guard, the suspension, the time) is as `again` saw it.
/// The declaration problems and the releases not shown yet stay
/// `first`'s: `again` routed and counted its few resources only.
pub(super) fn merge<'s>(
    mut first: Plan<'s>,
    decided: &HashSet<String>,
    again: Plan<'s>,
) -> Plan<'s> {
    // The first pass's declaration problems stand: they depend on the
    // configuration and the snapshot alone, and the second pass routes the
    // names it decides again, not the fleet (`Routing::route`).
    let Plan {
        resources,
        errors: _,
        intents,
        orphaned_overrides,
        guard,
        suspension,
        now,
        agent_id: _,
        commit: _,
        commit_time: _,
        released: _,
    } = again;
    let mut gone: HashSet<&str> = decided.iter().map(String::as_str).collect();
    let mut unplaced = Vec::new();
    for r in resources {
        gone.remove(r.name.as_str());
        match first
            .resources
            .binary_search_by(|x| x.name.as_str().cmp(&r.name))
        {
            Ok(i) => first.resources[i] = r,
            Err(_) => unplaced.push(r),
        }
    }
    if !gone.is_empty() {
        first.resources.retain(|r| !gone.contains(r.name.as_str()));
    }
    if !unplaced.is_empty() {
        first.resources.append(&mut unplaced);
        first.resources.sort_by(|a, b| a.name.cmp(&b.name));
    }
    first.intents = intents;
    first.orphaned_overrides = orphaned_overrides;
    first.guard = guard;
    first.suspension = suspension;
    first.now = now;
    first
}

/// Whether the second pass found what the first decided beside still so:
/// nothing written beside the cycle, no deletion come due (the time
/// moved past a `deletion_delay`). Otherwise everything is decided again.
pub(super) fn still_stands(first: &Beside, second: &Beside, again: &Plan<'_>) -> bool {
    first == second && again.guard.due == 0 && again.guard.trip.is_none()
}

#[cfg(test)]
#[path = "standing_tests.rs"]
mod tests;
