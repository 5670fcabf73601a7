//! `decide`: one resource, one decision.
//!
//! The rules are DESIGN.md §3–§5. Each returns a [`Rule`] so `tend explain`
//! can name the rule that produced a decision, and a `reason` sentence for
//! operators.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;

use super::desired::{desired_fields_of, manages_parameters};
use super::overrides::{EffectiveOverride, OverrideInput, effective};
use crate::model::{
    Declaration, DeletionPolicy, DriftPolicy, ManagedDatabase, Mutability, SpecHash,
};
use crate::provider::{Capabilities, Observation, Observed, ResourceStatus};

/// What tend reports about a resource (DESIGN.md §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum State {
    InSync,
    Drifted,
    Missing,
    Overridden,
    Blocked,
    Unconvergeable,
    Deleting,
    Stalled,
    Released,
    Error,
}

/// What tend will do about it (DESIGN.md §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Action {
    None,
    Create,
    Update,
    Delete,
    Release,
    Adopt,
    Hold,
}

/// The rule that produced a decision, for `tend explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    ObservationFailed,
    InvalidProviderOverride,
    PausedMissing,
    Create,
    MissingOutOfBand,
    Provisioning,
    StaleObservation,
    NameTaken,
    OwnedByOtherAgent,
    OwnedByOtherDeclaration,
    Adopt,
    RequiresReplacement,
    Paused,
    Unconvergeable,
    InSync,
    IgnoredDrift,
    DeclaredChange,
    DriftReportOnly,
    DriftGrace,
    DriftCorrect,
    Release,
    Released,
    DeletionPaused,
    DeletionNotOurs,
    DeletionDelay,
    DeletionGuard,
    Delete,
    DeletionStalled,
    Deleted,
}

/// Whether a difference was made in Git or behind tend's back (DESIGN.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriftOrigin {
    Declared,
    OutOfBand,
}

/// One field that differs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drift {
    pub field: String,
    /// `null` when the declaration removes the field (a parameter to reset).
    pub desired: Value,
    /// `null` when the provider does not have it.
    pub observed: Value,
    pub origin: DriftOrigin,
    /// Left alone by an override.
    pub ignored: bool,
}

/// What tend remembers of a resource (the state dir; empty on first sight).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memory {
    /// Hash of the last spec applied and confirmed.
    pub applied_spec_hash: Option<SpecHash>,
    /// Field values of the last applied spec (may be left empty when the
    /// declaration's spec hash equals `applied_spec_hash`: then they are the
    /// declared values).
    pub applied_fields: BTreeMap<String, Value>,
    /// The commit of the last applied spec.
    pub applied_commit: Option<String>,
    /// tend created or adopted this resource and saw it exist.
    pub existed: bool,
    /// When each out-of-band drift (or the resource going missing, as field
    /// `""`) was first seen.
    pub drift_first_seen: BTreeMap<String, SystemTime>,
    /// Confirmed updates of a field that still left it different.
    pub failed_attempts: BTreeMap<String, u32>,
    /// When tend last wrote to the resource: an observation older than this
    /// is not used to decide a new write (a cache may lag).
    pub last_write_at: Option<SystemTime>,
    /// The database name and provider tend manages the resource at.
    pub database_name: Option<String>,
    pub provider: Option<String>,
}

/// A declaration removed from Git, kept until the provider confirms the
/// outcome (DESIGN.md §5).
#[derive(Debug, Clone, PartialEq)]
pub struct Tombstone {
    pub last: ManagedDatabase,
    /// When tend first saw the removal (in a commit on the tracked branch).
    pub removed_at: SystemTime,
    pub removal_commit: String,
    /// When the delete was first requested, if it was.
    pub delete_requested_at: Option<SystemTime>,
    pub last_error: Option<String>,
}

/// What a decision is about.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    Declared(&'a Declaration),
    Removed(&'a Tombstone),
}

/// Agent-wide policy (from `[reconcile]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub agent_id: String,
    /// `report` here overrides every declaration's `driftPolicy`.
    pub drift_policy: DriftPolicy,
    pub drift_grace: Duration,
    pub deletion_delay: Duration,
    pub deletion_stall: Duration,
    /// Confirmed attempts before a field is `Unconvergeable`.
    pub max_update_attempts: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            agent_id: String::new(),
            drift_policy: DriftPolicy::Correct,
            drift_grace: Duration::from_secs(600),
            deletion_delay: Duration::from_secs(3600),
            deletion_stall: Duration::from_secs(3600),
            max_update_attempts: 3,
        }
    }
}

/// Everything `decide` needs.
#[derive(Debug, Clone)]
pub struct DecideInput<'a> {
    pub subject: Subject<'a>,
    pub observed: &'a Observed,
    pub memory: &'a Memory,
    /// Annotation and local overrides (provider-label overrides are read
    /// from the observation).
    pub overrides: &'a [OverrideInput],
    pub policy: &'a Policy,
    pub capabilities: &'a Capabilities,
    /// The cycle's mass-deletion guard allows this resource's deletion.
    pub deletion_allowed: bool,
    /// The provider the subject is planned at.
    pub provider: &'a str,
    pub now: SystemTime,
}

/// The outcome for one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub state: State,
    pub action: Action,
    pub rule: Rule,
    /// A sentence for operators naming the rule.
    pub reason: String,
    pub drift: Vec<Drift>,
    pub overrides: EffectiveOverride,
    /// Field values to set when `action` is `Create`, `Update` or `Adopt`.
    pub changes: BTreeMap<String, Value>,
    /// When a held action becomes due.
    pub act_at: Option<SystemTime>,
}

impl Decision {
    fn new(state: State, action: Action, rule: Rule, reason: String) -> Self {
        Decision {
            state,
            action,
            rule,
            reason,
            drift: Vec::new(),
            overrides: EffectiveOverride::default(),
            changes: BTreeMap::new(),
            act_at: None,
        }
    }

    /// Whether this decision leaves work pending (for exit code 2).
    pub fn is_pending(&self) -> bool {
        self.action != Action::None || !matches!(self.state, State::InSync | State::Released)
    }
}

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

fn show(v: &Value) -> String {
    match v {
        Value::Null => "unset".into(),
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

/// Decides what may happen to one resource. Pure: same input, same output.
pub fn decide(input: &DecideInput<'_>) -> Decision {
    // Overrides at the provider travel with the observation.
    let mut override_inputs = input.overrides.to_vec();
    if let Observed::Found(obs) = input.observed
        && input.capabilities.labels
    {
        match provider_override(obs, input.memory, input.now) {
            Ok(Some(o)) => override_inputs.push(o),
            Ok(None) => {}
            Err(message) => {
                return Decision::new(
                    State::Error,
                    Action::None,
                    Rule::InvalidProviderOverride,
                    format!(
                        "the override labels at the provider are invalid ({message}); tend changes nothing until they are fixed, because a broken override must never be ignored"
                    ),
                );
            }
        }
    }
    let overrides = effective(&override_inputs, input.now);
    let mut decision = match input.subject {
        Subject::Declared(decl) => decide_declared(input, decl, &overrides),
        Subject::Removed(tomb) => decide_removed(input, tomb, &overrides),
    };
    decision.overrides = overrides;
    decision
}

fn provider_override(
    obs: &Observation,
    memory: &Memory,
    now: SystemTime,
) -> Result<Option<OverrideInput>, String> {
    // The common case: no override labels at all.
    if !obs
        .labels
        .keys()
        .any(|k| k.starts_with("tend.dev/") && !k.starts_with("tend.dev/owner-"))
    {
        return Ok(None);
    }
    let labels = obs
        .labels
        .iter()
        .filter(|(k, _)| k.starts_with("tend.dev/") && !k.starts_with("tend.dev/owner-"))
        .map(|(k, v)| {
            (
                k.clone(),
                crate::model::declaration::ScalarString(v.clone()),
            )
        })
        .collect();
    let parsed = crate::model::overrides::parse_annotations(&labels).map_err(|problems| {
        problems
            .into_iter()
            .map(|p| p.message)
            .collect::<Vec<_>>()
            .join("; ")
    })?;
    Ok(parsed.overrides.map(|spec| OverrideInput {
        source: super::OverrideSource::Provider,
        spec,
        first_seen: memory
            .drift_first_seen
            .get("override:provider")
            .copied()
            .unwrap_or(now),
    }))
}

fn decide_declared(
    input: &DecideInput<'_>,
    decl: &Declaration,
    ov: &EffectiveOverride,
) -> Decision {
    let name = decl.name();
    let policy = input.policy;
    // Where a managed database lives is its identity: a new name or
    // provider would be a second database, never a move.
    // (Compared without building the name: this runs for every resource.)
    let same_database = |was: &str| decl.manifest.is_database_name(was);
    if input.memory.existed
        && !(input
            .memory
            .database_name
            .as_deref()
            .is_none_or(same_database)
            && input
                .memory
                .provider
                .as_deref()
                .is_none_or(|p| p == input.provider))
    {
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
        if let Some((field, Some(was), now)) = moved {
            return Decision::new(
                State::Blocked,
                Action::None,
                Rule::RequiresReplacement,
                format!(
                    "requires replacement: {field} changed from `{was}` to `{now}`; tend manages `{name}` at `{was}` and never creates a second database for one declaration (restore {field}, or remove the declaration and add a new one)"
                ),
            );
        }
    }
    let obs = match input.observed {
        Observed::Failed(message) => return observation_failed(name, message),
        Observed::NotFound => return decide_missing(input, decl, ov),
        Observed::Found(obs) => obs,
    };

    // Ownership (DESIGN.md §3).
    let adopting = match obs.marker_labels() {
        Some((agent_id, declaration)) if agent_id == policy.agent_id => {
            if declaration != name {
                return Decision::new(
                    State::Blocked,
                    Action::None,
                    Rule::OwnedByOtherDeclaration,
                    format!(
                        "database `{}` belongs to declaration `{declaration}` of this agent, not to `{name}`: give `{name}` another databaseName",
                        obs.database_name
                    ),
                );
            }
            false
        }
        Some((agent_id, _)) => {
            return Decision::new(
                State::Blocked,
                Action::None,
                Rule::OwnedByOtherAgent,
                format!(
                    "database `{}` is owned by another tend agent (`{agent_id}`); release it there before this agent can manage it",
                    obs.database_name
                ),
            );
        }
        None if decl.annotations.adopt => true,
        None => {
            return Decision::new(
                State::Blocked,
                Action::None,
                Rule::NameTaken,
                format!(
                    "name taken: database `{}` exists without tend's ownership marker; tend will not touch it unless the declaration says `tend.dev/adopt: \"true\"`",
                    obs.database_name
                ),
            );
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
        );
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
    let create = |rule, reason| {
        let mut d = Decision::new(State::Missing, Action::Create, rule, reason);
        // Ignored fields are left to the provider's default even at creation:
        // an override means hands off, whatever the action.
        d.changes = desired_fields_of(&decl.normalized_spec, input.capabilities)
            .into_iter()
            .filter(|(field, _)| !ov.ignores(field))
            .collect();
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
    let due = first_seen + input.policy.drift_grace;
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

fn report_only(policy: &Policy, decl: &ManagedDatabase) -> bool {
    policy.drift_policy == DriftPolicy::Report || decl.spec.drift_policy == DriftPolicy::Report
}

fn compute_drift(
    input: &DecideInput<'_>,
    decl: &Declaration,
    obs: &Observation,
    ov: &EffectiveOverride,
) -> Vec<Drift> {
    // Walks the normalised spec in place (no per-decision copy of the
    // desired values): this runs for every resource in every cycle.
    let empty = serde_json::Map::new();
    let spec = decl.normalized_spec.as_object().unwrap_or(&empty);
    let declared_parameters = spec.get("parameters").and_then(Value::as_object);
    let mut drift = Vec::new();
    let mut push = |field: &str, want: &Value, have: &Value| {
        if values_match(field, want, have) || obs.unobserved.iter().any(|u| u == field) {
            return;
        }
        // The spec unchanged since the last apply: nothing is a declared change
        // (and the applied field values need not even be loaded).
        let unchanged = input.memory.applied_spec_hash.as_ref() == Some(&decl.spec_hash);
        let declared = !unchanged
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
    let mut key = String::new();
    for (name, want) in spec {
        if !input.capabilities.fields.contains_key(name.as_str()) {
            continue;
        }
        match (name.as_str(), want) {
            ("parameters", Value::Object(map)) => {
                for (setting, want) in map {
                    key.clear();
                    key.push_str("parameters.");
                    key.push_str(setting);
                    push(&key, want, obs.fields.get(&key).unwrap_or(&Value::Null));
                }
            }
            _ => push(name, want, obs.fields.get(name).unwrap_or(&Value::Null)),
        }
    }
    if manages_parameters(&decl.manifest, input.capabilities) {
        for (field, have) in obs.fields.range::<str, _>((
            std::ops::Bound::Included("parameters."),
            std::ops::Bound::Unbounded,
        )) {
            let Some(setting) = field.strip_prefix("parameters.") else {
                break;
            };
            if !declared_parameters.is_some_and(|p| p.contains_key(setting)) {
                push(field, &Value::Null, have);
            }
        }
    }
    drift
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
        _ => false,
    }
}

fn decide_drift(
    input: &DecideInput<'_>,
    decl: &Declaration,
    ov: &EffectiveOverride,
    drift: Vec<Drift>,
) -> Decision {
    let name = decl.name();
    let policy = input.policy;
    let with = |mut d: Decision, drift: Vec<Drift>| {
        d.drift = drift;
        d
    };
    let active: Vec<&Drift> = drift.iter().filter(|d| !d.ignored).collect();

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
        return with(
            Decision::new(
                State::Blocked,
                Action::None,
                Rule::RequiresReplacement,
                format!(
                    "requires replacement: {list} cannot be changed in place, and tend never drops and recreates a database on its own"
                ),
            ),
            drift,
        );
    }
    if ov.paused {
        let what = if active.is_empty() {
            "no drift"
        } else {
            "drift is reported only"
        };
        return with(
            Decision::new(
                State::Overridden,
                Action::None,
                Rule::Paused,
                format!(
                    "`{name}` is paused by an override ({}): {what}; nothing is changed",
                    ov.reasons.join("; ")
                ),
            ),
            drift,
        );
    }
    let stuck: Vec<&&Drift> = active
        .iter()
        .filter(|d| {
            input
                .memory
                .failed_attempts
                .get(&d.field)
                .copied()
                .unwrap_or(0)
                >= policy.max_update_attempts
        })
        .collect();
    if !stuck.is_empty() {
        let fields = join_fields(stuck.iter().map(|d| d.field.as_str()));
        return with(
            Decision::new(
                State::Unconvergeable,
                Action::None,
                Rule::Unconvergeable,
                format!(
                    "{fields} still differ after {} confirmed updates; tend stops retrying until the declaration or the observed value changes",
                    policy.max_update_attempts
                ),
            ),
            drift,
        );
    }
    if active.is_empty() {
        if drift.is_empty() {
            return Decision::new(
                State::InSync,
                Action::None,
                Rule::InSync,
                "in sync with the declaration".into(),
            );
        }
        let fields = join_fields(drift.iter().map(|d| d.field.as_str()));
        return with(
            Decision::new(
                State::Overridden,
                Action::None,
                Rule::IgnoredDrift,
                format!(
                    "{fields} differ but are left alone by an override ({})",
                    ov.reasons.join("; ")
                ),
            ),
            drift,
        );
    }

    // Declared changes apply now; out-of-band drift waits for drift_grace.
    let mut changes = BTreeMap::new();
    let mut held: Vec<(&str, SystemTime)> = Vec::new();
    let report = report_only(policy, &decl.manifest);
    for d in &active {
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
                let due = first + policy.drift_grace;
                if input.now >= due {
                    changes.insert(d.field.clone(), d.desired.clone());
                } else {
                    held.push((&d.field, due));
                }
            }
        }
    }
    let out_of_band: Vec<&str> = active
        .iter()
        .filter(|d| d.origin == DriftOrigin::OutOfBand)
        .map(|d| d.field.as_str())
        .collect();
    let act_at = held.iter().map(|(_, t)| *t).min();
    let mut decision = if !changes.is_empty() {
        let declared = active
            .iter()
            .any(|d| d.origin == DriftOrigin::Declared && changes.contains_key(&d.field));
        let fields = join_fields(changes.keys().map(String::as_str));
        let (rule, why) = if declared {
            (Rule::DeclaredChange, "the declaration changed in Git")
        } else {
            (Rule::DriftCorrect, "out-of-band drift outlived drift_grace")
        };
        let mut reason = format!("update {fields}: {why}");
        if let Some(t) = act_at {
            let fields = join_fields(held.iter().map(|(f, _)| *f));
            reason.push_str(&format!(
                "; out-of-band drift on {fields} is held until {}",
                time(t)
            ));
        }
        Decision::new(State::Drifted, Action::Update, rule, reason)
    } else if report {
        Decision::new(
            State::Drifted,
            Action::None,
            Rule::DriftReportOnly,
            format!(
                "out-of-band drift on {}; driftPolicy Report: tend only reports it",
                out_of_band.join(", ")
            ),
        )
    } else {
        let fields = join_fields(held.iter().map(|(f, _)| *f));
        Decision::new(
            State::Drifted,
            Action::Hold,
            Rule::DriftGrace,
            format!(
                "out-of-band drift on {fields} is held for drift_grace ({}) so an operator can add an override; tend corrects it at {}",
                duration(policy.drift_grace),
                act_at.map(time).unwrap_or_default()
            ),
        )
    };
    decision.changes = changes;
    decision.act_at = act_at;
    with(decision, drift)
}

fn decide_removed(input: &DecideInput<'_>, tomb: &Tombstone, ov: &EffectiveOverride) -> Decision {
    let name = &tomb.last.metadata.name;
    let policy = input.policy;
    let obs = match input.observed {
        Observed::Failed(message) => return observation_failed(name, message),
        Observed::NotFound => {
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
    match tomb.last.spec.deletion_policy {
        DeletionPolicy::Retain => {
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
        DeletionPolicy::Delete => {
            if !ours {
                return Decision::new(
                    State::Blocked,
                    Action::None,
                    Rule::DeletionNotOurs,
                    format!(
                        "`{name}` was removed with deletionPolicy Delete, but `{}` does not carry this agent's marker: tend never deletes what it cannot prove it owns",
                        obs.database_name
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
            if let Some(since) = tomb.delete_requested_at
                && input.now >= since + policy.deletion_stall
            {
                let error = tomb.last_error.as_deref().unwrap_or("no error reported");
                // Still under the guards: a stalled deletion is retried only
                // where a fresh one would be allowed.
                return Decision::new(
                    State::Stalled,
                    if input.deletion_allowed {
                        Action::Delete
                    } else {
                        Action::Hold
                    },
                    Rule::DeletionStalled,
                    format!(
                        "the deletion of `{name}` has not been confirmed for {} (last error: {error})",
                        duration(input.now.duration_since(since).unwrap_or_default())
                    ),
                );
            }
            let due = tomb.removed_at + policy.deletion_delay;
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
            if !input.deletion_allowed {
                return Decision::new(
                    State::Deleting,
                    Action::Hold,
                    Rule::DeletionGuard,
                    "the mass-deletion guard stops further deletions in this cycle (max_deletions / max_deletion_percent)".into(),
                );
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
    }
}

/// Never act without evidence.
fn observation_failed(name: &str, message: &str) -> Decision {
    Decision::new(
        State::Error,
        Action::None,
        Rule::ObservationFailed,
        format!(
            "could not observe `{name}` at the provider ({message}); no action is taken without an observation"
        ),
    )
}

/// Field names for a reason sentence: `a, b, c`.
fn join_fields<'a>(fields: impl Iterator<Item = &'a str>) -> String {
    fields.collect::<Vec<_>>().join(", ")
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}
