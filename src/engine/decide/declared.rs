//! A declaration in Git: identity and ownership, then a missing database
//! or field-level drift.

use serde_json::Value;

use super::drift::{compute_drift, decide_drift};
use super::{
    Action, DecideInput, Decision, Drift, DriftOrigin, Rule, State, absence_unproven, duration,
    observation_failed, report_only, short, time,
};
use crate::engine::desired::desired_fields_of;
use crate::engine::overrides::EffectiveOverride;
use crate::model::Declaration;
use crate::model::observation::{Observed, ResourceStatus};

/// Where a managed database lives is its identity: a new name or provider
/// would be a second database, never a move.
fn moved(input: &DecideInput<'_>, decl: &Declaration) -> Option<Decision> {
    let name = decl.name();
    // (Compared without building the name: this runs for every resource.)
    let same_database = |was: &str| decl.manifest.is_database_name(was);
    if !input.memory.existed
        || input
            .memory
            .database_name
            .as_deref()
            .is_none_or(same_database)
            && input
                .memory
                .provider
                .as_deref()
                .is_none_or(|p| p == input.provider)
    {
        return None;
    }
    let db = decl.manifest.database_name();
    let moved = [
        (
            "databaseName",
            input.memory.database_name.as_deref(),
            db.as_str(),
        ),
        ("provider", input.memory.provider.as_deref(), input.provider),
    ]
    .into_iter()
    .find(|(_, was, now)| was.is_some_and(|was| was != *now));
    let (field, Some(was), now) = moved? else {
        return None;
    };
    Some(Decision::new(
        State::Blocked,
        Action::None,
        Rule::RequiresReplacement,
        format!(
            "requires replacement: {field} changed from `{was}` to `{now}`; tend manages `{name}` at `{was}` and never creates a second database for one declaration (restore {field}, or remove the declaration and add a new one)"
        ),
    ))
}

/// Ownership: this agent's marker for this declaration, or an adoption.
/// A database owned by anyone else is `Blocked` (`Some`).
fn ownership(
    input: &DecideInput<'_>,
    decl: &Declaration,
    obs: &crate::model::observation::Observation,
) -> Option<Decision> {
    let name = decl.name();
    match obs.marker_labels() {
        Some((agent_id, declaration)) if agent_id == input.policy.agent_id => {
            if declaration != name
                && let Some(renamed) = input.renamed
                && renamed.other == declaration
            {
                // A rename under `deletionPolicy: Delete`: the old name's
                // tombstone would delete this database, and this name then
                // create an empty one. Say so, and how each ends.
                if decl.annotations.adopt {
                    return None;
                }
                return Some(Decision::new(
                    State::Blocked,
                    Action::None,
                    Rule::Renamed,
                    match renamed.approved {
                        Some(reason) => format!(
                            "database `{}` belongs to `{declaration}`, removed from Git with deletionPolicy Delete, whose deletion an operator approved ({reason}): it is deleted, then `{name}` creates an empty database; to keep the data instead, add `tend.dev/adopt: \"true\"` to `{name}` before that",
                            obs.database_name
                        ),
                        None => format!(
                            "database `{}` belongs to `{declaration}`, removed from Git with deletionPolicy Delete (a rename to `{name}`?); its deletion is held while `{name}` names the database. Add `tend.dev/adopt: \"true\"` to `{name}` to keep the database and its data under `{name}`; or `tend deletions approve {declaration} --reason …` to delete it, after which `{name}` creates an empty one",
                            obs.database_name
                        ),
                    },
                ));
            }
            if declaration != name {
                return Some(Decision::new(
                    State::Blocked,
                    Action::None,
                    Rule::OwnedByOtherDeclaration,
                    format!(
                        "database `{}` belongs to declaration `{declaration}` of this agent, not to `{name}`: give `{name}` another databaseName",
                        obs.database_name
                    ),
                ));
            }
            None
        }
        Some((agent_id, _)) => Some(Decision::new(
            State::Blocked,
            Action::None,
            Rule::OwnedByOtherAgent,
            format!(
                "database `{}` is owned by another tend agent (`{agent_id}`); release it there before this agent can manage it",
                obs.database_name
            ),
        )),
        None if decl.annotations.adopt => None,
        None => Some(Decision::new(
            State::Blocked,
            Action::None,
            Rule::NameTaken,
            match &input.memory.released {
                // The declaration came back after tend released the
                // database: the name is not "taken" by a stranger, and
                // the way back is one annotation.
                Some(release) if release.database_name == obs.database_name => format!(
                    "database `{}` was released by this agent at {}{} when `{name}` was removed from Git; to manage it again, add the annotation `tend.dev/adopt: \"true\"` to the declaration",
                    obs.database_name,
                    time(release.at),
                    if release.removal_commit.is_empty() {
                        String::new()
                    } else {
                        format!(" (commit {})", short(&release.removal_commit))
                    }
                ),
                _ => format!(
                    "name taken: database `{}` exists without tend's ownership marker; tend will not touch it unless the declaration says `tend.dev/adopt: \"true\"`",
                    obs.database_name
                ),
            },
        )),
    }
}

/// A declaration that sets a provider field its provider does not manage
/// (an http server's capabilities do not list it): nothing is sent, since
/// a create would be refused or, worse, leave the field silently
/// unmanaged. `provider` routes the declaration and the name is the
/// database's identity: neither is a field a server must list.
fn not_managed(input: &DecideInput<'_>, decl: &Declaration) -> Option<Decision> {
    let spec = &decl.normalized_spec;
    let sets_unmanaged = |f: &crate::model::FieldInfo| {
        f.mutability != crate::model::Mutability::Behaviour
            && !matches!(f.name, "provider" | "databaseName")
            && spec.get(f.name).is_some_and(|v| !v.is_null())
            && !input.capabilities.fields.contains_key(f.name)
    };
    // This runs for every resource in every cycle: the spec's few keys
    // are checked first, the field table only when one is not managed.
    let all_managed = spec.iter().all(|(key, value)| {
        value.is_null()
            || input.capabilities.fields.contains_key(key)
            || crate::model::fields::field_info(key).is_none_or(|f| !sets_unmanaged(f))
    });
    if all_managed {
        return None;
    }
    let unmanaged: Vec<&str> = crate::model::FIELDS
        .iter()
        .filter(|f| sets_unmanaged(f))
        .map(|f| f.name)
        .collect();
    if unmanaged.is_empty() {
        return None;
    }
    let managed: Vec<&str> = input.capabilities.fields.keys().collect();
    Some(Decision::new(
        State::Error,
        Action::None,
        Rule::FieldNotManaged,
        format!(
            "spec.{} {} not managed by provider `{}` (it manages {}): remove {} from the declaration, or use a provider that manages {}",
            unmanaged.join(", spec."),
            if unmanaged.len() == 1 { "is" } else { "are" },
            input.provider,
            managed.join(", "),
            if unmanaged.len() == 1 { "it" } else { "them" },
            if unmanaged.len() == 1 { "it" } else { "them" },
        ),
    ))
}

pub(super) fn decide_declared(
    input: &DecideInput<'_>,
    decl: &Declaration,
    ov: &EffectiveOverride,
) -> Decision {
    let name = decl.name();
    if let Some(blocked) = moved(input, decl) {
        return blocked;
    }
    if let Some(refused) = not_managed(input, decl) {
        return refused;
    }
    let obs = match input.observed {
        Observed::Failed(message) => return observation_failed(name, message),
        Observed::NotFound => return decide_missing(input, decl, ov),
        Observed::Found(obs) => obs,
    };
    if let Some(blocked) = ownership(input, decl, obs)
        && !input
            .policy
            .sabotaged(crate::sabotage::Sabotage::OwnershipNotChecked)
    {
        return blocked;
    }
    // Adopting: a database without a marker, or the one a rename's
    // removed declaration leaves behind.
    let adopting = decl.annotations.adopt
        && match obs.marker_labels() {
            None => true,
            Some((agent_id, declaration)) => {
                agent_id == input.policy.agent_id
                    && declaration != name
                    && input.renamed.is_some_and(|r| r.other == declaration)
            }
        };

    if obs.status == ResourceStatus::Provisioning {
        return Decision::new(
            State::Missing,
            Action::Hold,
            Rule::Provisioning,
            format!(
                "`{}` is still being provisioned at the provider; waiting for it to become ready",
                obs.database_name
            ),
        );
    }

    let drift = compute_drift(input, decl, obs, ov);
    if let Some(written) = input.memory.last_write_at
        && obs.observed_at < written
    {
        // A lagging cache must not turn tend's own write into "drift".
        let mut d = Decision::new(
            if drift.is_empty() {
                State::InSync
            } else {
                State::Drifted
            },
            Action::Hold,
            Rule::StaleObservation,
            format!(
                "the observation ({}) is older than tend's last write to `{}` ({}); waiting for a fresh one before deciding a new write",
                time(obs.observed_at),
                obs.database_name,
                time(written)
            ),
        );
        d.drift = drift;
        return d;
    }
    let mut decision = decide_drift(input, decl, ov, drift);
    if adopting && !ov.paused && decision.state != State::Blocked {
        decision.action = Action::Adopt;
        decision.rule = Rule::Adopt;
        decision.reason = format!(
            "`tend.dev/adopt` is set: tend takes ownership of the existing database `{}` by adding its marker{}",
            obs.database_name,
            if decision.drift.iter().any(|d| !d.ignored) {
                "; drift is then corrected under the normal rules"
            } else {
                ""
            }
        )
        .into();
        decision.changes.clear();
    }
    decision
}

fn decide_missing(input: &DecideInput<'_>, decl: &Declaration, ov: &EffectiveOverride) -> Decision {
    let name = decl.name();
    let db = decl.manifest.database_name();
    if ov.paused {
        return Decision::new(
            State::Overridden,
            Action::None,
            Rule::PausedMissing,
            format!(
                "`{db}` does not exist, but `{name}` is paused: nothing is created until the override is removed or expires"
            ),
        );
    }
    if let Some(wait) = absence_unproven(input, &db, State::Missing) {
        return wait;
    }
    let create = |rule, reason| {
        let mut d = Decision::new(State::Missing, Action::Create, rule, reason);
        // Ignored fields are created as declared: an override leaves the
        // provider's value alone, and before creation there is none. (Left
        // to the provider's default, the declared value would never be
        // applied, and the field would report drift tend itself caused.)
        d.changes = desired_fields_of(&decl.normalized_spec, input.capabilities);
        d
    };
    if !input.memory.existed {
        return create(
            Rule::Create,
            format!("`{db}` does not exist at the provider: create it"),
        );
    }
    // It existed and was dropped behind tend's back: out-of-band drift.
    let first_seen = input
        .memory
        .drift_first_seen
        .get("")
        .copied()
        .unwrap_or(input.now);
    // Reported as out-of-band drift of the whole database.
    let gone = |mut d: Decision| {
        d.drift.push(Drift {
            field: "databaseName".into(),
            desired: Value::String(db.clone()),
            observed: Value::Null,
            origin: DriftOrigin::OutOfBand,
            ignored: false,
        });
        d
    };
    if report_only(input.policy, &decl.manifest) {
        return gone(Decision::new(
            State::Missing,
            Action::None,
            Rule::DriftReportOnly,
            format!(
                "`{db}` was deleted outside tend (out-of-band); driftPolicy Report: tend only reports it"
            ),
        ));
    }
    let due = crate::time::add(first_seen, input.policy.drift_grace);
    if input.now < due {
        let mut d = Decision::new(
            State::Missing,
            Action::Hold,
            Rule::MissingOutOfBand,
            format!(
                "`{db}` was deleted outside tend (out-of-band); it is recreated after drift_grace ({}) at {} unless an override is added",
                duration(input.policy.drift_grace),
                time(due)
            ),
        );
        d.act_at = Some(due);
        return gone(d);
    }
    gone(create(
        Rule::MissingOutOfBand,
        format!("`{db}` was deleted outside tend and drift_grace has passed: recreate it"),
    ))
}
