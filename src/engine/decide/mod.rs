//! `decide`: one resource, one decision.
//!
//! The rules: identity and ownership, drift and overrides, deletion. Each
//! decision names the [`Rule`] that produced it, so `tend explain` can say
//! why, and carries a `reason` sentence for operators.
//!
//! Split by subject: [`declared`] (a declaration in Git, present or
//! missing at the provider), [`drift`] (field-level differences and what
//! may be corrected), [`removed`] (a tombstone: release or delete).

mod declared;
mod drift;
mod removed;

pub use drift::{each_difference, values_match};

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::deletion::DeletionGate;
use super::overrides::{DecidedOverrides, OverrideInput, effective};
use crate::model::observation::{Capabilities, Observation, Observed};
use crate::model::{Declaration, DriftPolicy, FlatMap, ManagedDatabase, SpecHash};
use crate::sabotage::Sabotage;

/// What tend reports about a resource (docs/reports.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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
    /// The provider refused an operation for good: held, not retried,
    /// until what it depends on changes or an operator retries it.
    Failed,
}

/// What tend will do about it (docs/reports.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Action {
    None,
    Create,
    Update,
    Delete,
    Release,
    Adopt,
    Hold,
}

impl State {
    /// The state as every report and human output names it (`InSync`).
    pub fn as_str(self) -> &'static str {
        match self {
            State::InSync => "InSync",
            State::Drifted => "Drifted",
            State::Missing => "Missing",
            State::Overridden => "Overridden",
            State::Blocked => "Blocked",
            State::Unconvergeable => "Unconvergeable",
            State::Deleting => "Deleting",
            State::Stalled => "Stalled",
            State::Released => "Released",
            State::Error => "Error",
            State::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Action {
    /// The action as every report and human output names it (`Update`).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::None => "None",
            Action::Create => "Create",
            Action::Update => "Update",
            Action::Delete => "Delete",
            Action::Release => "Release",
            Action::Adopt => "Adopt",
            Action::Hold => "Hold",
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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
    /// The mass-deletion guard tripped, and an operator approved this one.
    DeletionApproved,
    /// An earlier operation on the resource is journalled and not yet
    /// confirmed: no new work until it is (it is replayed first).
    PendingIntent,
    /// A journalled operation the repository has since overtaken is
    /// dropped instead of replayed.
    Superseded,
    /// What tend remembers of the resource cannot be read: no action
    /// without evidence.
    CorruptState,
    /// A removed declaration's provider is no longer configured.
    ProviderNotConfigured,
    /// The agent is suspended (`tend suspend`): what would change is held.
    Suspended,
    /// The provider refused the same operation for good, on the same
    /// declaration and the same observed database: not sent again.
    OperationFailed,
    /// A removed declaration (`deletionPolicy: Delete`) and a live one
    /// name the same database at the same provider, as a rename of
    /// `metadata.name` leaves them: the deletion is held, the new name
    /// blocked, until an operator adopts the database under the new name
    /// or approves the deletion.
    Renamed,
    /// The declaration sets a field its provider does not manage (an http
    /// provider's server does not list it in its capabilities).
    FieldNotManaged,
}

impl Rule {
    /// The rule's name as `explain` and the reports show it (`drift-grace`).
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::ObservationFailed => "observation-failed",
            Rule::InvalidProviderOverride => "invalid-provider-override",
            Rule::FieldNotManaged => "field-not-managed",
            Rule::PausedMissing => "paused-missing",
            Rule::Create => "create",
            Rule::MissingOutOfBand => "missing-out-of-band",
            Rule::Provisioning => "provisioning",
            Rule::StaleObservation => "stale-observation",
            Rule::NameTaken => "name-taken",
            Rule::OwnedByOtherAgent => "owned-by-other-agent",
            Rule::OwnedByOtherDeclaration => "owned-by-other-declaration",
            Rule::Adopt => "adopt",
            Rule::RequiresReplacement => "requires-replacement",
            Rule::Paused => "paused",
            Rule::Unconvergeable => "unconvergeable",
            Rule::InSync => "in-sync",
            Rule::IgnoredDrift => "ignored-drift",
            Rule::DeclaredChange => "declared-change",
            Rule::DriftReportOnly => "drift-report-only",
            Rule::DriftGrace => "drift-grace",
            Rule::DriftCorrect => "drift-correct",
            Rule::Release => "release",
            Rule::Released => "released",
            Rule::DeletionPaused => "deletion-paused",
            Rule::DeletionNotOurs => "deletion-not-ours",
            Rule::DeletionDelay => "deletion-delay",
            Rule::DeletionGuard => "deletion-guard",
            Rule::Delete => "delete",
            Rule::DeletionStalled => "deletion-stalled",
            Rule::Deleted => "deleted",
            Rule::DeletionApproved => "deletion-approved",
            Rule::PendingIntent => "pending-intent",
            Rule::Superseded => "superseded",
            Rule::CorruptState => "corrupt-state",
            Rule::ProviderNotConfigured => "provider-not-configured",
            Rule::Suspended => "suspended",
            Rule::OperationFailed => "operation-failed",
            Rule::Renamed => "renamed",
        }
    }
}

/// Whether a difference was made in Git or behind tend's back (docs/reports.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The commit of the last applied spec (shared: most of a fleet was
    /// applied at a handful of commits, and every resource's memory is
    /// kept between cycles).
    pub applied_commit: Option<Arc<str>>,
    /// tend created or adopted this resource and saw it exist.
    pub existed: bool,
    /// When each out-of-band drift (or the resource going missing, as field
    /// `""`) was first seen.
    pub drift_first_seen: BTreeMap<String, SystemTime>,
    /// Confirmed updates of a field that still left it different, with
    /// the declared and observed values they were counted against.
    pub failed_attempts: BTreeMap<String, FailedAttempts>,
    /// When tend last wrote to the resource: an observation older than this
    /// is not used to decide a new write (a cache may lag).
    pub last_write_at: Option<SystemTime>,
    /// The database name and provider tend manages the resource at (the
    /// provider's name shared, as the commit is).
    pub database_name: Option<String>,
    pub provider: Option<Arc<str>>,
    /// tend journalled a create or update of this resource after its last
    /// confirmed apply that was never confirmed (pending, or superseded
    /// after a crash), or a create that failed (refused halfway, it may
    /// have made the database without a setting): what the provider
    /// shows may be tend's own unfinished write. A difference is then
    /// tend's to correct, never out-of-band drift held for grace.
    pub unconfirmed_write: bool,
    /// The last operation the provider refused for good, until one
    /// succeeds or an operator retries (`tend reconcile NAME`). Boxed, as
    /// `released`: few resources have one, and every resource's memory is
    /// kept between cycles (a memory is 208 bytes with both boxed, 392
    /// without).
    pub failure: Option<Box<OperationFailure>>,
    /// tend released this declaration's database (it was removed from Git
    /// with `Retain`), until it is managed again.
    pub released: Option<Box<Released>>,
}

/// A release tend made, as a returning declaration is told about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub database_name: String,
    pub at: SystemTime,
    /// The commit that removed the declaration (`""`: not known).
    pub removal_commit: String,
}

/// An operation the provider refused for good, and what it was decided
/// from: it is not sent again while both are the same.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationFailure {
    pub operation_id: String,
    /// `create`, `update`, `delete`, `adopt` or `release`.
    pub kind: String,
    /// The declaration's spec hash the operation carried.
    pub spec_hash: SpecHash,
    /// [`observed_fingerprint`] of what the provider showed when it was
    /// decided.
    pub observed: String,
    /// The provider's message.
    pub message: String,
    pub at: SystemTime,
}

/// A digest of what the provider shows of a database (its fields and
/// labels; `absent` when it does not have it): an operation refused on one
/// observation is tried again when the database changes.
pub fn observed_fingerprint(observed: &Observed) -> String {
    match observed {
        Observed::Found(o) => {
            let shown = serde_json::json!({ "fields": &o.fields, "labels": &o.labels });
            crate::model::hash::sha256_hex(shown.to_string().as_bytes())
        }
        Observed::NotFound => "absent".into(),
        Observed::Failed(_) => "unobserved".into(),
    }
}

/// Confirmed updates of one field that did not make it converge. They
/// count only while the declaration asks for the same value and the
/// provider shows the same one: a new declared value, or an observed value
/// that moved (someone fixed the cause), is a new situation and is tried
/// again. (Counted forever, one bad spell made a field unmanageable.)
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FailedAttempts {
    pub count: u32,
    /// `None` for a count stored before the values were (it never counts).
    pub desired: Option<Value>,
    pub observed: Option<Value>,
}

impl FailedAttempts {
    /// How many attempts count against a field now declared `desired` and
    /// observed `observed`.
    pub fn against(&self, desired: &Value, observed: &Value) -> u32 {
        if self.desired.as_ref() == Some(desired) && self.observed.as_ref() == Some(observed) {
            self.count
        } else {
            0
        }
    }
}

/// A declaration removed from Git, kept until the provider confirms the
/// outcome (docs/apply.md).
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
    /// A deliberate bug: a field of test builds only (the `test-hooks`
    /// feature), so no other build holds one to turn on.
    #[cfg(feature = "test-hooks")]
    pub sabotage: crate::sabotage::Sabotage,
}

impl Policy {
    /// Whether the deliberate bug `which` is on (never without
    /// `test-hooks`).
    #[inline(always)]
    pub fn sabotaged(&self, which: Sabotage) -> bool {
        #[cfg(feature = "test-hooks")]
        return self.sabotage == which;
        #[cfg(not(feature = "test-hooks"))]
        {
            let _ = which;
            false
        }
    }
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
            #[cfg(feature = "test-hooks")]
            sabotage: crate::sabotage::Sabotage::None,
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
    /// What the mass-deletion guard says about deleting this resource now.
    pub deletion: &'a DeletionGate,
    /// When tend first saw the override labels the observation carries
    /// (a duration expiry counts from here); `None` when never seen.
    pub provider_override_seen: Option<SystemTime>,
    /// The provider the subject is planned at.
    pub provider: &'a str,
    /// The agent-wide freeze (`tend suspend`), if one is set.
    pub suspension: Option<&'a super::Suspension>,
    /// The other side of a rename: for a removed declaration with
    /// `deletionPolicy: Delete`, the live declaration naming the same
    /// database at the same provider; for that live declaration, the
    /// removed one.
    pub renamed: Option<Renamed<'a>>,
    pub now: SystemTime,
}

/// A removed declaration and a live one naming the same database at the
/// same provider ([`DecideInput::renamed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renamed<'a> {
    /// The other declaration's name.
    pub other: &'a str,
    /// The removed declaration's deletion approval (`tend deletions
    /// approve`), if an operator gave one: the deletion then proceeds.
    pub approved: Option<&'a str>,
}

/// The outcome for one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub state: State,
    pub action: Action,
    pub rule: Rule,
    /// A sentence for operators naming the rule. Borrowed when it is a
    /// fixed sentence (every in-sync resource's, at every cycle): no
    /// allocation for what most of a fleet says.
    pub reason: Cow<'static, str>,
    pub drift: Vec<Drift>,
    pub overrides: DecidedOverrides,
    /// Field values to set when `action` is `Create`, `Update` or `Adopt`.
    /// A flat map: a create's few fields in a `BTreeMap` took a whole
    /// node of eleven slots (636 bytes a resource, 6.4 MB of a cold
    /// cycle's 32.6 MB heap peak at 10,000 creates).
    pub changes: FlatMap<Value>,
    /// When a held action becomes due.
    pub act_at: Option<SystemTime>,
}

impl Decision {
    /// A decision with no drift, override or changes.
    pub fn new(
        state: State,
        action: Action,
        rule: Rule,
        reason: impl Into<Cow<'static, str>>,
    ) -> Self {
        Decision {
            state,
            action,
            rule,
            reason: reason.into(),
            drift: Vec::new(),
            overrides: DecidedOverrides::default(),
            changes: FlatMap::new(),
            act_at: None,
        }
    }

    /// Whether this decision leaves work pending (for exit code 2).
    pub fn is_pending(&self) -> bool {
        self.action != Action::None || !matches!(self.state, State::InSync | State::Released)
    }
}

fn time(t: SystemTime) -> String {
    crate::time::rfc3339(t)
}

fn duration(d: Duration) -> String {
    crate::time::duration(d)
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
        match provider_override(obs, input.provider_override_seen, input.now) {
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
    let mut overrides = effective(&override_inputs, input.now);
    if input.policy.sabotaged(Sabotage::IgnoreFieldsNotHonoured) {
        overrides.ignore_fields.clear();
    }
    if input.policy.sabotaged(Sabotage::PauseNotHonoured) {
        overrides.paused = false;
    }
    let mut decision = match input.subject {
        Subject::Declared(decl) => declared::decide_declared(input, decl, &overrides),
        Subject::Removed(tomb) => removed::decide_removed(input, tomb, &overrides),
    };
    if input.policy.sabotaged(Sabotage::HeldDriftReportedInSync) && decision.state == State::Drifted
    {
        decision.state = State::InSync;
    }
    // An override that has yet to expire changes the decision when it
    // does: the resource is due again then.
    if let Some(expiry) = overrides.expires.filter(|at| *at > input.now) {
        decision.act_at = Some(decision.act_at.map_or(expiry, |at| at.min(expiry)));
    }
    decision.overrides = overrides.into();
    let decision = failed_again(decision, input);
    match input.suspension {
        Some(suspension) if suspension.in_force(input.now) => {
            suspended(decision, suspension, input.now)
        }
        _ => decision,
    }
}

/// An operation the provider refused for good is not sent again while the
/// declaration (its spec hash) and the database (its observation) are
/// what it was decided from: the same call would be refused the same way,
/// under a new operation id each cycle. `Failed`, with the provider's
/// message, until one of them changes or an operator retries (`tend
/// reconcile NAME` clears the failure).
fn failed_again(decision: Decision, input: &DecideInput<'_>) -> Decision {
    let Some(failure) = &input.memory.failure else {
        return decision;
    };
    let kind = match decision.action {
        Action::Create => "create",
        Action::Update => "update",
        Action::Delete => "delete",
        Action::Adopt => "adopt",
        Action::Release => "release",
        Action::None | Action::Hold => return decision,
    };
    let spec_hash = match input.subject {
        Subject::Declared(d) => Some(&d.spec_hash),
        Subject::Removed(_) => None,
    };
    let same = failure.kind == kind
        && spec_hash.is_none_or(|h| *h == failure.spec_hash)
        && failure.observed == observed_fingerprint(input.observed);
    if !same {
        return decision;
    }
    Decision {
        state: State::Failed,
        action: Action::None,
        rule: Rule::OperationFailed,
        reason: format!(
            "the provider refused the {kind} (operation {}) at {}: {}; tend does not send it again until the declaration or the database changes, or `tend reconcile {}` retries it",
            short(&failure.operation_id),
            time(failure.at),
            failure.message,
            match input.subject {
                Subject::Declared(d) => d.name(),
                Subject::Removed(t) => t.last.metadata.name.as_str(),
            }
        )
        .into(),
        act_at: None,
        ..decision
    }
}

/// The freeze holds every action that would change something at the
/// provider or in what tend owns; what is observed and reported stays
/// (the state, the drift, the overrides). Due again when the freeze ends
/// by itself.
fn suspended(decision: Decision, suspension: &super::Suspension, now: SystemTime) -> Decision {
    let changes = matches!(
        decision.action,
        Action::Create | Action::Update | Action::Delete | Action::Release | Action::Adopt
    );
    if !changes {
        return decision;
    }
    let act_at = match (decision.act_at, suspension.ends_at()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Decision {
        action: Action::Hold,
        rule: Rule::Suspended,
        reason: format!(
            "{} would {}: {}",
            decision.reason,
            decision.action.as_str().to_lowercase(),
            suspension.describe(now)
        )
        .into(),
        act_at,
        ..decision
    }
}

/// A database missing from the provider's answer within its read lag
/// after tend's own write to it: a lagging cache, not evidence that it is
/// gone. Creating it again would be a new operation (a second database at
/// a provider that does not keep names unique); forgetting a removed one
/// would let its declaration, restored, create another. `Hold` (in
/// `state`) until the lag has passed; `None` when the absence counts.
fn absence_unproven(input: &DecideInput<'_>, db: &str, state: State) -> Option<Decision> {
    let written = input.memory.last_write_at?;
    let visible_by = crate::time::add(written, input.capabilities.read_lag);
    if input.now >= visible_by {
        return None;
    }
    let mut d = Decision::new(
        state,
        Action::Hold,
        Rule::StaleObservation,
        format!(
            "`{db}` is not in the provider's answer, but tend wrote it at {} and the provider's reads may lag writes by {}: waiting until {} before deciding from its absence",
            time(written),
            duration(input.capabilities.read_lag),
            time(visible_by)
        ),
    );
    d.act_at = Some(visible_by);
    Some(d)
}

fn provider_override(
    obs: &Observation,
    first_seen: Option<SystemTime>,
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
    let parsed = crate::model::overrides::parse_override_strings(
        obs.labels
            .iter()
            .filter(|(k, _)| k.starts_with("tend.dev/") && !k.starts_with("tend.dev/owner-")),
    )?;
    Ok(parsed.overrides.map(|spec| OverrideInput {
        source: super::OverrideSource::Provider,
        spec: *spec,
        first_seen: first_seen.unwrap_or(now),
    }))
}

fn report_only(policy: &Policy, decl: &ManagedDatabase) -> bool {
    (policy.drift_policy == DriftPolicy::Report || decl.spec.drift_policy == DriftPolicy::Report)
        && !policy.sabotaged(Sabotage::ReportPolicyIgnored)
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
