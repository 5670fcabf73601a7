//! One table case per rule of `decide`, and properties that must hold for
//! every input.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use serde_json::{Value, json};
use tend::testing::engine::{
    Action, DecideInput, Decision, DeletionGate, DriftOrigin, FailedAttempts, Memory,
    OverrideInput, OverrideSource, Policy, Rule, State, Subject, Tombstone, decide,
};
use tend::testing::model::{
    Declaration, DeclarationSet, FlatMap, OnExpiry, OverrideExpiry, OverrideSpec, parse_file,
};
use tend::testing::provider::{
    Capabilities, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, Observed, ResourceStatus,
};

const AGENT: &str = "agent-1";

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn declaration(extra_annotations: &str, spec: &str) -> Declaration {
    let text = format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n  annotations:\n    x: y\n{extra_annotations}spec:\n  encoding: UTF8\n  connectionLimit: 100\n  owner: app\n{spec}"
    );
    let set =
        DeclarationSet::from_files(vec![parse_file(Path::new("orders.yaml"), text.as_bytes())]);
    assert!(set.diagnostics.is_empty(), "{:?}", set.diagnostics);
    std::sync::Arc::unwrap_or_clone(set.declarations.into_iter().next().unwrap())
}

fn caps() -> Capabilities {
    Capabilities::for_fields(
        &[
            "databaseName",
            "owner",
            "encoding",
            "connectionLimit",
            "parameters",
            "comment",
        ],
        true,
    )
}

fn observation(fields: &[(&str, Value)], marker: Option<(&str, &str)>) -> Observed {
    let mut base: BTreeMap<String, Value> = [
        ("databaseName", json!("orders")),
        ("owner", json!("app")),
        ("encoding", json!("UTF8")),
        ("connectionLimit", json!(100)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in fields {
        base.insert(k.to_string(), v.clone());
    }
    let mut labels = BTreeMap::new();
    if let Some((agent, decl)) = marker {
        labels.insert(OWNER_AGENT_LABEL.to_string(), agent.to_string());
        labels.insert(OWNER_DECLARATION_LABEL.to_string(), decl.to_string());
    }
    Observed::Found(Observation {
        database_name: "orders".into(),
        external_id: "db-1".into(),
        status: ResourceStatus::Ready,
        fields: base.into_iter().collect(),
        labels: labels.into_iter().collect(),
        observed_at: t(0),
        unobserved: Vec::new(),
    })
}

fn ours(fields: &[(&str, Value)]) -> Observed {
    observation(fields, Some((AGENT, "orders")))
}

fn policy() -> Policy {
    Policy {
        agent_id: AGENT.into(),
        ..Policy::default()
    }
}

fn applied(decl: &Declaration) -> Memory {
    Memory {
        database_name: Some("orders".into()),
        provider: Some("main".into()),
        applied_spec_hash: Some(decl.spec_hash.clone()),
        applied_fields: tend::testing::engine::desired::desired_fields(&decl.manifest, &caps()),
        existed: true,
        ..Memory::default()
    }
}

/// The guard holding five deletions due together against a limit of two.
fn held() -> DeletionGate {
    DeletionGate::Held {
        due: 5,
        limit: 2,
        managed: 9,
        since: t(0),
    }
}

struct Case<'a> {
    subject: Subject<'a>,
    observed: Observed,
    memory: Memory,
    overrides: Vec<OverrideInput>,
    policy: Policy,
    deletion: DeletionGate,
    provider_override_seen: Option<SystemTime>,
    suspension: Option<tend::testing::engine::Suspension>,
    now: SystemTime,
}

impl<'a> Case<'a> {
    fn new(decl: &'a Declaration, observed: Observed) -> Self {
        Case {
            subject: Subject::Declared(decl),
            observed,
            memory: applied(decl),
            overrides: Vec::new(),
            policy: policy(),
            deletion: DeletionGate::Allowed,
            provider_override_seen: None,
            suspension: None,
            now: t(100),
        }
    }

    fn run(&self) -> Decision {
        let caps = caps();
        decide(&DecideInput {
            subject: self.subject,
            observed: &self.observed,
            memory: &self.memory,
            overrides: &self.overrides,
            policy: &self.policy,
            capabilities: &caps,
            deletion: &self.deletion,
            provider_override_seen: self.provider_override_seen,
            provider: "main",
            suspension: self.suspension.as_ref(),
            renamed: None,
            now: self.now,
        })
    }
}

fn expect(d: &Decision, state: State, action: Action, rule: Rule) {
    assert_eq!(
        (d.state, d.action, d.rule),
        (state, action, rule),
        "{}",
        d.reason
    );
}

#[test]
fn in_sync() {
    let decl = declaration("", "");
    let d = Case::new(&decl, ours(&[])).run();
    expect(&d, State::InSync, Action::None, Rule::InSync);
    assert!(d.drift.is_empty());
    // Most of a fleet is in sync at every cycle: its reason is a fixed
    // sentence, not a string made per resource.
    assert!(
        matches!(d.reason, std::borrow::Cow::Borrowed(_)),
        "{:?}",
        d.reason
    );
}

#[test]
fn missing_is_created() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, Observed::NotFound);
    case.memory = Memory::default();
    let d = case.run();
    expect(&d, State::Missing, Action::Create, Rule::Create);
    assert_eq!(d.changes["connectionLimit"], json!(100));
    assert_eq!(d.changes["databaseName"], json!("orders"));
}

#[test]
fn declared_change_is_applied_now() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(50))]));
    // The last apply was of an earlier spec with a limit of 50.
    case.memory.applied_spec_hash = Some(tend::testing::model::SpecHash::from("earlier-spec"));
    case.memory
        .applied_fields
        .insert("connectionLimit".into(), json!(50));
    let d = case.run();
    expect(&d, State::Drifted, Action::Update, Rule::DeclaredChange);
    assert_eq!(d.drift[0].origin, DriftOrigin::Declared);
    assert_eq!(d.changes, FlatMap::from([("connectionLimit", json!(100))]));
}

#[test]
fn out_of_band_drift_inside_grace_is_held_with_the_time_it_will_act() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.memory
        .drift_first_seen
        .insert("connectionLimit".into(), t(0));
    let d = case.run();
    expect(&d, State::Drifted, Action::Hold, Rule::DriftGrace);
    assert_eq!(d.drift[0].origin, DriftOrigin::OutOfBand);
    assert_eq!(d.act_at, Some(t(600)));
    assert!(d.reason.contains("2027-01-15T08:10:00Z"), "{}", d.reason);
    assert!(d.changes.is_empty());
}

#[test]
fn out_of_band_drift_after_grace_is_corrected() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.memory
        .drift_first_seen
        .insert("connectionLimit".into(), t(0));
    case.now = t(600);
    let d = case.run();
    expect(&d, State::Drifted, Action::Update, Rule::DriftCorrect);
    assert_eq!(d.changes["connectionLimit"], json!(100));
}

#[test]
fn with_the_spec_unchanged_since_the_last_apply_no_difference_is_declared() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(50))]));
    // Even with stale applied values, the same spec hash means no declared change.
    case.memory.applied_fields.clear();
    let d = case.run();
    expect(&d, State::Drifted, Action::Hold, Rule::DriftGrace);
    assert_eq!(d.drift[0].origin, DriftOrigin::OutOfBand);
}

#[test]
fn first_sight_without_memory_counts_as_out_of_band() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.memory = Memory::default();
    let d = case.run();
    expect(&d, State::Drifted, Action::Hold, Rule::DriftGrace);
    assert_eq!(d.drift[0].origin, DriftOrigin::OutOfBand);
}

#[test]
fn a_difference_left_by_tends_own_unconfirmed_write_is_corrected_now() {
    // An update was sent and the process died before confirming it; the
    // repository then went back to the applied spec (the intent was
    // superseded). The provider shows tend's own half-done write: not an
    // operator's change to hold for grace.
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(50))]));
    case.memory.unconfirmed_write = true;
    let d = case.run();
    expect(&d, State::Drifted, Action::Update, Rule::DeclaredChange);
    assert_eq!(d.drift[0].origin, DriftOrigin::Declared);
    // Without that write in the journal, the same sight is out-of-band.
    case.memory.unconfirmed_write = false;
    assert_eq!(case.run().drift[0].origin, DriftOrigin::OutOfBand);
}

#[test]
fn drift_policy_report_never_corrects() {
    let decl = declaration("", "  driftPolicy: Report\n");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.memory
        .drift_first_seen
        .insert("connectionLimit".into(), t(0));
    case.now = t(100_000);
    expect(
        &case.run(),
        State::Drifted,
        Action::None,
        Rule::DriftReportOnly,
    );
    // The agent-wide policy does the same.
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.policy.drift_policy = tend::testing::model::DriftPolicy::Report;
    case.now = t(100_000);
    expect(
        &case.run(),
        State::Drifted,
        Action::None,
        Rule::DriftReportOnly,
    );
}

/// `tend suspend` holds every change (create, update, delete) and keeps
/// what it observed; with `on-expiry: resume` it holds until the expiry,
/// and the resource is due again then.
#[test]
fn a_suspension_holds_every_change_until_it_ends() {
    let suspension = |on_expiry| tend::testing::engine::Suspension {
        reason: "INC-9 freeze".into(),
        since: t(0),
        expires: Some(t(500)),
        on_expiry,
        by: "uid 0 (pid 1)".into(),
    };
    let decl = declaration("", "");
    let mut case = Case::new(&decl, Observed::NotFound);
    case.memory = Memory::default();
    case.suspension = Some(suspension(tend::testing::model::OnExpiry::Resume));
    let d = case.run();
    expect(&d, State::Missing, Action::Hold, Rule::Suspended);
    assert!(
        d.reason.contains("INC-9 freeze") && d.reason.contains("would create"),
        "{}",
        d.reason
    );
    assert_eq!(
        d.act_at,
        Some(t(500)),
        "due again when the freeze ends by itself"
    );

    // A change declared in Git since the last apply.
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(50))]));
    case.memory.applied_spec_hash = Some(tend::testing::model::SpecHash::from("earlier-spec"));
    case.memory
        .applied_fields
        .insert("connectionLimit".into(), json!(50));
    case.suspension = Some(suspension(tend::testing::model::OnExpiry::Hold));
    case.now = t(100_000);
    let d = case.run();
    expect(&d, State::Drifted, Action::Hold, Rule::Suspended);
    assert_eq!(d.drift.len(), 1, "drift is still reported");
    assert!(
        d.reason.contains("EXPIRED"),
        "expired and held on: {}",
        d.reason
    );

    // Expired with `resume`: decided as without it.
    let mut case = Case::new(&decl, Observed::NotFound);
    case.memory = Memory::default();
    case.suspension = Some(suspension(tend::testing::model::OnExpiry::Resume));
    case.now = t(600);
    expect(&case.run(), State::Missing, Action::Create, Rule::Create);

    // What changes nothing is left as it is.
    let mut case = Case::new(&decl, ours(&[]));
    case.suspension = Some(suspension(tend::testing::model::OnExpiry::Hold));
    expect(&case.run(), State::InSync, Action::None, Rule::InSync);
}

/// An operation the provider refused for good is not sent again on the
/// same declaration and the same observation; a new spec or a changed
/// database is a new situation, decided as usual.
#[test]
fn a_refused_operation_is_failed_until_the_declaration_or_the_database_changes() {
    let decl = declaration("", "");
    let failure = |observed: &Observed, spec: &tend::testing::model::SpecHash| {
        tend::testing::engine::OperationFailure {
            operation_id: "1f0c5e9a27b3aa".into(),
            kind: "create".into(),
            spec_hash: spec.clone(),
            observed: tend::testing::engine::observed_fingerprint(observed),
            message: "must be member of role \"orders_app\" (42501)".into(),
            at: t(50),
        }
    };
    let mut case = Case::new(&decl, Observed::NotFound);
    case.memory = Memory {
        failure: Some(Box::new(failure(&Observed::NotFound, &decl.spec_hash))),
        ..Memory::default()
    };
    let d = case.run();
    expect(&d, State::Failed, Action::None, Rule::OperationFailed);
    assert!(
        d.reason.contains("42501") && d.reason.contains("tend reconcile orders"),
        "{}",
        d.reason
    );
    assert_eq!(d.act_at, None, "held until something changes");

    // Another spec than the refused one: sent (a new operation).
    let mut case = Case::new(&decl, Observed::NotFound);
    case.memory = Memory {
        failure: Some(Box::new(failure(
            &Observed::NotFound,
            &tend::testing::model::SpecHash::from("an-older-spec"),
        ))),
        ..Memory::default()
    };
    expect(&case.run(), State::Missing, Action::Create, Rule::Create);

    // The database changed at the provider since: decided afresh.
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.memory.failure = Some(Box::new(tend::testing::engine::OperationFailure {
        kind: "update".into(),
        ..failure(&ours(&[("connectionLimit", json!(400))]), &decl.spec_hash)
    }));
    case.now = t(100_000);
    assert_ne!(case.run().rule, Rule::OperationFailed);
}

const PAUSED: &str = "    tend.dev/paused: \"true\"\n    tend.dev/override-reason: INC-1\n";

fn annotation_overrides(decl: &Declaration, first_seen: SystemTime) -> Vec<OverrideInput> {
    OverrideInput::from_annotations(decl, first_seen)
        .into_iter()
        .collect()
}

#[test]
fn paused_changes_nothing() {
    let decl = declaration(PAUSED, "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.overrides = annotation_overrides(&decl, t(0));
    case.now = t(100_000);
    let d = case.run();
    expect(&d, State::Overridden, Action::None, Rule::Paused);
    assert!(d.overrides.paused);
    assert_eq!(d.drift.len(), 1, "drift is still reported");
    let mut case = Case::new(&decl, Observed::NotFound);
    case.overrides = annotation_overrides(&decl, t(0));
    expect(
        &case.run(),
        State::Overridden,
        Action::None,
        Rule::PausedMissing,
    );
}

#[test]
fn ignored_fields_are_left_but_others_corrected() {
    let decl = declaration(
        "    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: INC-2\n",
        "",
    );
    let mut case = Case::new(
        &decl,
        ours(&[
            ("connectionLimit", json!(500)),
            ("owner", json!("intruder")),
        ]),
    );
    case.overrides = annotation_overrides(&decl, t(0));
    case.memory.drift_first_seen.insert("owner".into(), t(0));
    case.now = t(1000);
    let d = case.run();
    expect(&d, State::Drifted, Action::Update, Rule::DriftCorrect);
    assert_eq!(d.changes, FlatMap::from([("owner", json!("app"))]));
    assert!(
        d.drift
            .iter()
            .find(|x| x.field == "connectionLimit")
            .unwrap()
            .ignored
    );

    let mut only_ignored = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    only_ignored.overrides = annotation_overrides(&decl, t(0));
    expect(
        &only_ignored.run(),
        State::Overridden,
        Action::None,
        Rule::IgnoredDrift,
    );
}

/// A database that does not exist has no value to leave alone: it is
/// created with the declared value of an ignored field too.
#[test]
fn create_with_ignore_fields_sets_the_declared_value() {
    let decl = declaration(
        "    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: INC-2\n",
        "",
    );
    let mut case = Case::new(&decl, Observed::NotFound);
    case.memory = Memory::default();
    case.overrides = annotation_overrides(&decl, t(0));
    let d = case.run();
    expect(&d, State::Missing, Action::Create, Rule::Create);
    assert_eq!(d.changes["connectionLimit"], json!(100));
    assert_eq!(d.overrides.ignore_fields, ["connectionLimit"]);
}

fn expiring(on_expiry: OnExpiry) -> OverrideInput {
    OverrideInput {
        source: OverrideSource::Annotation,
        spec: OverrideSpec {
            paused: true,
            ignore_fields: vec![],
            reason: "INC-3".into(),
            expires: Some(OverrideExpiry::After(Duration::from_secs(3600))),
            expires_text: Some("1h".into()),
            on_expiry,
        },
        first_seen: t(0),
    }
}

#[test]
fn an_override_that_will_expire_makes_the_resource_due_at_its_expiry() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.overrides = vec![expiring(OnExpiry::Resume)];
    let d = case.run();
    assert_eq!(d.rule, Rule::Paused);
    assert_eq!(
        d.act_at,
        Some(t(3600)),
        "re-decided when the override expires"
    );
    case.now = t(7200);
    assert_ne!(
        case.run().act_at,
        Some(t(3600)),
        "an expiry in the past is not a due time"
    );
}

#[test]
fn expired_override_with_hold_is_still_honoured_and_reported_expired() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.overrides = vec![expiring(OnExpiry::Hold)];
    case.now = t(7200);
    let d = case.run();
    expect(&d, State::Overridden, Action::None, Rule::Paused);
    assert!(d.overrides.expired);
    assert_eq!(d.overrides.expires, Some(t(3600)));
}

#[test]
fn expired_override_with_resume_resumes_management() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    case.overrides = vec![expiring(OnExpiry::Resume)];
    case.memory
        .drift_first_seen
        .insert("connectionLimit".into(), t(0));
    case.now = t(7200);
    let d = case.run();
    expect(&d, State::Drifted, Action::Update, Rule::DriftCorrect);
    assert!(d.overrides.expired && d.overrides.resumed && !d.overrides.paused);
}

#[test]
fn override_from_a_provider_label_is_honoured() {
    let decl = declaration("", "");
    let mut observed = ours(&[("connectionLimit", json!(500))]);
    if let Observed::Found(obs) = &mut observed {
        obs.labels
            .insert("tend.dev/ignore-fields", "connectionLimit".into());
        obs.labels
            .insert("tend.dev/override-reason", "dba on call".into());
    }
    let mut case = Case::new(&decl, observed);
    case.now = t(100_000);
    let d = case.run();
    expect(&d, State::Overridden, Action::None, Rule::IgnoredDrift);
    assert_eq!(d.overrides.sources, vec![OverrideSource::Provider]);
}

#[test]
fn an_invalid_provider_label_override_stops_all_action() {
    let decl = declaration("", "");
    let mut observed = ours(&[("connectionLimit", json!(500))]);
    if let Observed::Found(obs) = &mut observed {
        obs.labels.insert("tend.dev/pasued", "true".into());
    }
    let d = Case::new(&decl, observed).run();
    expect(
        &d,
        State::Error,
        Action::None,
        Rule::InvalidProviderOverride,
    );
}

#[test]
fn override_from_a_local_override_is_honoured() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, Observed::NotFound);
    case.memory = Memory::default();
    let mut local = expiring(OnExpiry::Hold);
    local.source = OverrideSource::Local;
    local.spec.expires = None;
    case.overrides = vec![local];
    let d = case.run();
    expect(&d, State::Overridden, Action::None, Rule::PausedMissing);
    assert_eq!(d.overrides.sources, vec![OverrideSource::Local]);
}

#[test]
fn immutable_change_is_blocked() {
    let decl = declaration("", "");
    let d = Case::new(&decl, ours(&[("encoding", json!("LATIN1"))])).run();
    expect(&d, State::Blocked, Action::None, Rule::RequiresReplacement);
    assert!(d.reason.contains("requires replacement"), "{}", d.reason);
}

#[test]
fn a_name_taken_by_someone_else_is_blocked() {
    let decl = declaration("", "");
    let d = Case::new(&decl, observation(&[], None)).run();
    expect(&d, State::Blocked, Action::None, Rule::NameTaken);
    let d = Case::new(&decl, observation(&[], Some(("agent-2", "orders")))).run();
    expect(&d, State::Blocked, Action::None, Rule::OwnedByOtherAgent);
    let d = Case::new(&decl, observation(&[], Some((AGENT, "billing")))).run();
    expect(
        &d,
        State::Blocked,
        Action::None,
        Rule::OwnedByOtherDeclaration,
    );
}

#[test]
fn adopt_takes_an_unmarked_database() {
    let decl = declaration("    tend.dev/adopt: \"true\"\n", "");
    let mut case = Case::new(&decl, observation(&[], None));
    case.memory = Memory::default();
    expect(&case.run(), State::InSync, Action::Adopt, Rule::Adopt);
}

#[test]
fn an_observation_error_is_never_acted_on() {
    let decl = declaration("", "");
    let d = Case::new(&decl, Observed::Failed("connection refused".into())).run();
    expect(&d, State::Error, Action::None, Rule::ObservationFailed);
    assert!(d.reason.contains("connection refused"));
}

#[test]
fn a_database_dropped_behind_tends_back_waits_for_grace() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, Observed::NotFound);
    case.memory.drift_first_seen.insert(String::new(), t(0));
    expect(
        &case.run(),
        State::Missing,
        Action::Hold,
        Rule::MissingOutOfBand,
    );
    case.now = t(700);
    expect(
        &case.run(),
        State::Missing,
        Action::Create,
        Rule::MissingOutOfBand,
    );
}

#[test]
fn three_failed_updates_make_a_field_unconvergeable() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(500))]));
    let attempts = |desired: i64, observed: i64| FailedAttempts {
        count: 3,
        desired: Some(json!(desired)),
        observed: Some(json!(observed)),
    };
    case.memory
        .failed_attempts
        .insert("connectionLimit".into(), attempts(100, 500));
    let stuck = case.run();
    expect(
        &stuck,
        State::Unconvergeable,
        Action::None,
        Rule::Unconvergeable,
    );
    assert!(
        stuck.reason.contains("tend state reset-attempts orders"),
        "{}",
        stuck.reason
    );
    // Counted against another declared value, or another observed one (a
    // new declaration, someone fixed the cause): tried again.
    for other in [attempts(210, 500), attempts(100, 400)] {
        case.memory
            .failed_attempts
            .insert("connectionLimit".into(), other);
        let again = case.run();
        assert_ne!(again.state, State::Unconvergeable, "{again:?}");
    }
    // A count stored before the values were: never holds a field.
    case.memory.failed_attempts.insert(
        "connectionLimit".into(),
        FailedAttempts {
            count: 9,
            ..FailedAttempts::default()
        },
    );
    assert_ne!(case.run().state, State::Unconvergeable);
}

#[test]
fn removed_parameters_are_reset() {
    let decl = declaration("", "  parameters:\n    work_mem: 64MB\n");
    let mut case = Case::new(
        &decl,
        ours(&[
            ("parameters.work_mem", json!("64MB")),
            ("parameters.old", json!("1")),
        ]),
    );
    case.memory
        .drift_first_seen
        .insert("parameters.old".into(), t(0));
    case.now = t(1000);
    let d = case.run();
    expect(&d, State::Drifted, Action::Update, Rule::DriftCorrect);
    assert_eq!(d.changes, FlatMap::from([("parameters.old", Value::Null)]));
}

fn tombstone(decl: &Declaration, policy: &str) -> Tombstone {
    let mut last = decl.manifest.clone();
    last.spec.deletion_policy = if policy == "Delete" {
        tend::testing::model::DeletionPolicy::Delete
    } else {
        tend::testing::model::DeletionPolicy::Retain
    };
    Tombstone {
        last,
        removed_at: t(0),
        removal_commit: "0123456789abcdef".into(),
        delete_requested_at: None,
        last_error: None,
    }
}

#[test]
fn removal_with_retain_releases() {
    let decl = declaration("", "");
    let tomb = tombstone(&decl, "Retain");
    let mut case = Case::new(&decl, ours(&[]));
    case.subject = Subject::Removed(&tomb);
    expect(&case.run(), State::Released, Action::Release, Rule::Release);
}

#[test]
fn removal_with_delete_waits_for_delay_guard_and_ownership() {
    let decl = declaration("", "");
    let tomb = tombstone(&decl, "Delete");
    let mut case = Case::new(&decl, ours(&[]));
    case.subject = Subject::Removed(&tomb);
    expect(
        &case.run(),
        State::Deleting,
        Action::Hold,
        Rule::DeletionDelay,
    );
    case.now = t(3600);
    expect(&case.run(), State::Deleting, Action::Delete, Rule::Delete);
    case.deletion = held();
    let d = case.run();
    expect(&d, State::Deleting, Action::Hold, Rule::DeletionGuard);
    assert!(
        d.reason.contains("5 were due together")
            && d.reason.contains("limit of 2 for 9 managed")
            && d.reason.contains("tend deletions approve orders"),
        "the reason gives the counts, the limit and the way out: {}",
        d.reason
    );
    case.deletion = DeletionGate::Approved {
        reason: "CHG-9".into(),
    };
    let d = case.run();
    expect(&d, State::Deleting, Action::Delete, Rule::DeletionApproved);
    assert!(d.reason.contains("CHG-9"), "{}", d.reason);
    case.deletion = DeletionGate::EmptyTree;
    expect(
        &case.run(),
        State::Deleting,
        Action::Hold,
        Rule::DeletionGuard,
    );
    case.deletion = DeletionGate::Allowed;
    case.observed = observation(&[], None);
    expect(
        &case.run(),
        State::Blocked,
        Action::None,
        Rule::DeletionNotOurs,
    );
    case.observed = ours(&[]);
    case.overrides = vec![expiring(OnExpiry::Hold)];
    expect(
        &case.run(),
        State::Deleting,
        Action::None,
        Rule::DeletionPaused,
    );
}

#[test]
fn a_deletion_unconfirmed_past_the_stall_time_is_stalled() {
    let decl = declaration("", "");
    let mut tomb = tombstone(&decl, "Delete");
    tomb.delete_requested_at = Some(t(3600));
    tomb.last_error = Some("database is being accessed by other users".into());
    let mut case = Case::new(&decl, ours(&[]));
    case.subject = Subject::Removed(&tomb);
    case.now = t(3600 + 3600);
    let d = case.run();
    expect(&d, State::Stalled, Action::Delete, Rule::DeletionStalled);
    assert!(d.reason.contains("other users"));
}

// ---- properties -------------------------------------------------------------

fn any_observed() -> impl Strategy<Value = Observed> {
    let fields = proptest::collection::vec(
        (
            prop_oneof![
                Just("owner"),
                Just("encoding"),
                Just("connectionLimit"),
                Just("comment"),
                Just("parameters.work_mem"),
                Just("parameters.other")
            ],
            prop_oneof![
                Just(json!(100)),
                Just(json!(7)),
                Just(json!("app")),
                Just(json!("LATIN1")),
                Just(Value::Null)
            ],
        ),
        0..4,
    );
    let marker = prop_oneof![
        Just(None),
        Just(Some((AGENT, "orders"))),
        Just(Some(("agent-2", "orders"))),
        Just(Some((AGENT, "other")))
    ];
    prop_oneof![
        Just(Observed::NotFound),
        Just(Observed::Failed("boom".into())),
        (fields, marker).prop_map(|(fields, marker)| observation(&fields, marker)),
    ]
}

fn any_declaration() -> impl Strategy<Value = Declaration> {
    let annotations = prop_oneof![
        Just(String::new()),
        Just(PAUSED.to_string()),
        Just("    tend.dev/ignore-fields: connectionLimit,parameters\n    tend.dev/override-reason: r\n".to_string()),
        Just("    tend.dev/ignore-fields: owner\n    tend.dev/override-reason: r\n".to_string()),
        Just("    tend.dev/adopt: \"true\"\n".to_string()),
    ];
    let spec = prop_oneof![
        Just(String::new()),
        Just("  parameters:\n    work_mem: 64MB\n".to_string()),
        Just("  driftPolicy: Report\n".to_string()),
    ];
    (annotations, spec).prop_map(|(a, s)| declaration(&a, &s))
}

fn any_memory() -> impl Strategy<Value = (bool, u64, u32)> {
    (any::<bool>(), 0u64..2000, 0u32..4)
}

proptest! {
    // Failures are kept in tests/decide.proptest-regressions and replayed
    // first at every run.
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn decide_is_deterministic_and_respects_overrides(
        decl in any_declaration(),
        observed in any_observed(),
        (remember, now, attempts) in any_memory(),
    ) {
        let mut case = Case::new(&decl, observed.clone());
        if !remember {
            case.memory = Memory::default();
        }
        case.memory.drift_first_seen.insert("connectionLimit".into(), t(0));
        case.memory.failed_attempts.insert(
            "owner".into(),
            FailedAttempts { count: attempts, desired: Some(json!("app")), observed: None },
        );
        case.overrides = annotation_overrides(&decl, t(0));
        case.now = t(now);
        let first = case.run();
        prop_assert_eq!(&first, &case.run());

        if decl.annotations.overrides.as_ref().is_some_and(|o| o.paused) {
            prop_assert!(!matches!(first.action, Action::Create | Action::Update | Action::Delete), "{:?}", first);
        }
        // An ignored field is never changed; a create sets it as declared
        // (there is no provider value yet to leave alone).
        if let Some(o) = &decl.annotations.overrides
            && first.action != Action::Create
        {
            for field in first.changes.keys() {
                prop_assert!(
                    !o.ignore_fields.iter().any(|i| field == i || field.starts_with(&format!("{i}."))),
                    "changed ignored field {} : {:?}", field, first
                );
            }
        }
        if let Observed::Found(obs) = &observed
            && obs.marker().is_some_and(|m| m.agent_id == AGENT)
        {
            prop_assert_ne!(first.action, Action::Create);
        }
        if matches!(observed, Observed::Failed(_)) {
            prop_assert_eq!(first.action, Action::None);
        }
    }
}

#[test]
fn an_observation_older_than_tends_last_write_is_not_used_for_a_new_write() {
    let decl = declaration("", "");
    let mut case = Case::new(&decl, ours(&[("connectionLimit", json!(50))]));
    // The last apply was of an earlier spec with a limit of 50.
    case.memory.applied_spec_hash = Some(tend::testing::model::SpecHash::from("earlier-spec"));
    case.memory
        .applied_fields
        .insert("connectionLimit".into(), json!(50));
    // The observation is from t(0); tend wrote at t(10).
    case.memory.last_write_at = Some(t(10));
    let d = case.run();
    expect(&d, State::Drifted, Action::Hold, Rule::StaleObservation);
    assert!(d.changes.is_empty());
    case.memory.last_write_at = Some(t(0));
    expect(
        &case.run(),
        State::Drifted,
        Action::Update,
        Rule::DeclaredChange,
    );
}

#[test]
fn a_new_database_name_or_provider_for_a_managed_resource_is_blocked() {
    let decl = declaration("", "  databaseName: orders_v2\n");
    let mut case = Case::new(&decl, Observed::NotFound);
    let d = case.run();
    expect(&d, State::Blocked, Action::None, Rule::RequiresReplacement);
    assert!(
        d.reason
            .contains("databaseName changed from `orders` to `orders_v2`"),
        "{}",
        d.reason
    );
    let decl = declaration("", "");
    case = Case::new(&decl, ours(&[]));
    case.memory.provider = Some("old-server".into());
    let d = case.run();
    expect(&d, State::Blocked, Action::None, Rule::RequiresReplacement);
    assert!(
        d.reason
            .contains("provider changed from `old-server` to `main`"),
        "{}",
        d.reason
    );
}

#[test]
fn a_stalled_deletion_stays_under_the_guard() {
    let decl = declaration("", "");
    let mut tomb = tombstone(&decl, "Delete");
    tomb.delete_requested_at = Some(t(3600));
    let mut case = Case::new(&decl, ours(&[]));
    case.subject = Subject::Removed(&tomb);
    case.now = t(3600 + 3600);
    case.deletion = held();
    let d = case.run();
    expect(&d, State::Stalled, Action::Hold, Rule::DeletionStalled);
}

#[test]
fn a_paused_removed_resource_keeps_its_ownership() {
    let decl = declaration("", "");
    let tomb = tombstone(&decl, "Retain");
    let mut case = Case::new(&decl, ours(&[]));
    case.subject = Subject::Removed(&tomb);
    case.overrides = vec![expiring(OnExpiry::Hold)];
    let d = case.run();
    expect(&d, State::Overridden, Action::None, Rule::DeletionPaused);
}
