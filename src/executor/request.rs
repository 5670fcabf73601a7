//! The call a decision makes: the request body and everything the journal
//! keeps to replay it and to record its effect.

use std::collections::BTreeMap;

use serde_json::Value;

use super::operation::{JournalRequest, RequestBody};
use crate::engine::desired::desired_fields;
use crate::model::{FlatMap, ManagedDatabase};
use crate::provider::{
    Capabilities, ChangeRequest, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, OperationKind,
};

/// Where a resource is and what it is declared as.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestSubject<'a> {
    pub name: &'a str,
    pub manifest: &'a ManagedDatabase,
    /// The declaration's file, relative to the repository root.
    pub file: &'a str,
    pub provider: &'a str,
    /// The commit the decision was made from.
    pub commit: Option<&'a str>,
}

fn marker(agent_id: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (OWNER_AGENT_LABEL.to_string(), agent_id.to_string()),
        (OWNER_DECLARATION_LABEL.to_string(), name.to_string()),
    ])
}

/// The request of `kind` for `subject`; `changes` are the decision's field
/// values (create and update).
pub(crate) fn build(
    kind: OperationKind,
    agent_id: &str,
    subject: RequestSubject<'_>,
    changes: &FlatMap<Value>,
    capabilities: &Capabilities,
) -> JournalRequest {
    let manifest = subject.manifest;
    let database_name = manifest.database_name();
    let change = |fields: BTreeMap<String, Value>, labels: BTreeMap<String, String>| {
        RequestBody::Change(ChangeRequest {
            database_name: database_name.clone(),
            fields,
            labels,
        })
    };
    let fields = || BTreeMap::from(changes.clone());
    let body = match kind {
        // Only the ownership marker: `metadata.labels` stay in Git (tend
        // does not reconcile labels at a provider, so it does not write
        // them there once and then leave them to drift).
        OperationKind::Create => change(fields(), marker(agent_id, subject.name)),
        OperationKind::Update => change(fields(), BTreeMap::new()),
        OperationKind::Adopt => change(BTreeMap::new(), marker(agent_id, subject.name)),
        // A label with an empty value is removed.
        OperationKind::Release => change(
            BTreeMap::new(),
            marker("", "")
                .into_keys()
                .map(|k| (k, String::new()))
                .collect(),
        ),
        OperationKind::Delete => RequestBody::Delete {
            database_name: database_name.clone(),
        },
    };
    JournalRequest {
        provider: subject.provider.to_string(),
        database_name,
        file: subject.file.to_string(),
        commit: subject.commit.map(str::to_string),
        manifest: serde_json::to_value(manifest).unwrap_or(Value::Null),
        desired: desired_fields(manifest, capabilities),
        body,
    }
}
