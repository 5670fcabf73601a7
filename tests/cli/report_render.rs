//! Snapshots of the text and markdown reports for a fixed situation.

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::json;
use tend::testing::config::Config;
use tend::testing::engine::{DecideInput, Memory, OverrideInput, Policy, Subject, decide};
use tend::testing::engine::{DeletionGate, DeletionGuard};
use tend::testing::model::DeclarationSet;
use tend::testing::model::{Diagnostic, load_paths};
use tend::testing::provider::sandbox::SANDBOX_FIELDS;
use tend::testing::provider::{
    Capabilities, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, Observed, ResourceStatus,
};
use tend::testing::reconcile::{
    OrphanedOverride, Plan, PlannedOperationId, PlannedResource, PlannedSubject,
};
use tend::testing::status::{build_report, render};

fn config() -> Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tend.toml");
    std::fs::write(
        &path,
        "agent_id = \"snap\"\n[source]\nurl = \"https://git.example/platform/databases.git\"\npath = \"examples/databases\"\n[providers.sandbox]\nkind = \"sandbox\"\n",
    )
    .unwrap();
    Config::load(&path).unwrap()
}

fn examples() -> DeclarationSet {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    load_paths(&[root.join("examples/databases")])
}

fn fixed_plan(set: &DeclarationSet) -> Plan<'_> {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let caps = Capabilities::for_fields(SANDBOX_FIELDS, true);
    let policy = Policy {
        agent_id: "snap".into(),
        ..Policy::default()
    };
    let mut resources = Vec::new();
    for decl in &set.declarations {
        let name = decl.name().to_string();
        let mut fields = tend::testing::engine::desired::desired_fields(&decl.manifest, &caps);
        let mut labels = std::collections::BTreeMap::from([
            (OWNER_AGENT_LABEL.to_string(), "snap".to_string()),
            (OWNER_DECLARATION_LABEL.to_string(), name.clone()),
        ]);
        let observed = match name.as_str() {
            "identity" => Observed::NotFound,
            "sessions" => {
                labels.clear();
                Observed::Found(Observation {
                    database_name: name.clone(),
                    external_id: "db-s".into(),
                    status: ResourceStatus::Ready,
                    fields: fields.into_iter().collect(),
                    labels: labels.into_iter().collect(),
                    observed_at: now,
                    unobserved: Vec::new(),
                })
            }
            _ => {
                if name == "orders" || name == "billing" {
                    fields.insert("connectionLimit".into(), json!(500));
                }
                if name == "analytics" {
                    fields.insert("storageGb".into(), json!(400));
                }
                Observed::Found(Observation {
                    database_name: name.clone(),
                    external_id: format!("db-{name}"),
                    status: ResourceStatus::Ready,
                    fields: fields.into_iter().collect(),
                    labels: labels.into_iter().collect(),
                    observed_at: now,
                    unobserved: Vec::new(),
                })
            }
        };
        let memory = Memory::default();
        let overrides: Vec<OverrideInput> = OverrideInput::from_annotations(decl, now)
            .into_iter()
            .collect();
        let decision = decide(&DecideInput {
            subject: Subject::Declared(decl),
            observed: &observed,
            memory: &memory,
            overrides: &overrides,
            policy: &policy,
            capabilities: &caps,
            deletion: &DeletionGate::Allowed,
            provider_override_seen: None,
            provider: "sandbox",
            suspension: None,
            renamed: None,
            now,
        });
        let operation =
            tend::testing::reconcile::plan::operation_kind(decision.action).map(|kind| {
                PlannedOperationId {
                    kind,
                    id: tend::testing::provider::OperationId::derive(
                        "snap",
                        &name,
                        kind,
                        &decl.spec_hash,
                    ),
                    generation: 0,
                }
            });
        resources.push(PlannedResource {
            name: name.clone(),
            file: decl
                .file
                .strip_prefix(root)
                .unwrap()
                .display()
                .to_string()
                .into(),
            provider: "sandbox".into(),
            spec_hash: decl.spec_hash.clone(),
            subject: PlannedSubject::Declared(decl),
            observed,
            memory: std::sync::Arc::new(memory),
            decision,
            operation,
        });
    }
    let errors = vec![Diagnostic {
        file: "examples/databases/broken.yaml".into(),
        line: 4,
        column: 9,
        message: "metadata.name `Broken` is not a lowercase DNS label".into(),
    }];
    Plan {
        agent_id: "snap".into(),
        commit: Some("4b825dc642cb6eb9a060e54bf8d69288fbee4904".into()),
        commit_time: Some(now - Duration::from_secs(26 * 3600)),
        resources,
        errors,
        intents: Vec::new(),
        suspension: None,
        // Released by the cycle before: shown once.
        released: vec![tend::testing::journal::Release {
            name: "legacy".into(),
            provider: "sandbox".into(),
            database_name: "legacy".into(),
            file: "examples/databases/legacy.yaml".into(),
            operation_id: "op-release-legacy".into(),
            removal_commit: "9fceb02d0ae598e95dc970b74767f19372d61af8".into(),
            at: now - Duration::from_secs(600),
        }],
        // A typo in an emergency, with a reason that tries to forge a line
        // and clear the screen: shown, escaped.
        orphaned_overrides: vec![OrphanedOverride {
            name: "odrers".into(),
            reason: "INC-9\norders  InSync  None\x1b[2J".into(),
            set_at: now,
        }],
        guard: DeletionGuard {
            due: 0,
            managed: 0,
            limit: 5,
            trip: None,
            empty_tree: false,
        },
        now,
    }
}

#[test]
fn text_report_snapshot() {
    let set = examples();
    let report = build_report(&config(), &fixed_plan(&set));
    insta::assert_snapshot!(render::text(&report, false, false));
}

#[test]
fn markdown_report_snapshot() {
    let set = examples();
    let report = build_report(&config(), &fixed_plan(&set));
    insta::assert_snapshot!(render::markdown(&report, "tend plan", false));
}

#[test]
fn html_report_snapshot() {
    let set = examples();
    let report = build_report(&config(), &fixed_plan(&set));
    insta::assert_snapshot!(tend::testing::status::html::page(&report, "tend apply"));
}

/// A decision that stands from a cycle's first pass is reported in the
/// plan of its second pass, made later: an override's `firstSeen` is when
/// it was first seen, not moved by the time between the passes (which
/// changed the status branch's file of a resource nothing had changed
/// for, whenever the passes fell in different seconds).
#[test]
fn an_override_is_reported_first_seen_when_it_was_whatever_the_plan_time() {
    let set = examples();
    let mut plan = fixed_plan(&set);
    let decided_at = plan.now;
    plan.now = decided_at + Duration::from_millis(1_500);
    let report = serde_json::to_value(build_report(&config(), &plan)).unwrap();
    let billing = report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "billing")
        .unwrap();
    assert_eq!(
        billing["override"]["firstSeen"], "2027-01-15T08:00:00Z",
        "{billing:#}"
    );
}
