//! Changes to what tend remembers, as data.
//!
//! The planner computes effects (a new tombstone, first-seen times of
//! drift and overrides, the deletion guard's holds) without touching the
//! store; the executor computes the effects of a confirmed operation.
//! [`commit`] is the one function that writes them, each batch in one
//! transaction, so a cycle's memory changes land together or not at all.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::Value;

use super::{Applied, IntentState, StateError, StateStore, Tx};
use crate::engine::HeldDeletion;
use crate::model::SpecHash;

/// A confirmed create, update or adopt (owned form of [`Applied`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AppliedRecord {
    pub provider: String,
    pub database_name: String,
    pub file: String,
    pub manifest: Value,
    pub spec_hash: SpecHash,
    pub fields: BTreeMap<String, Value>,
    pub commit: Option<String>,
    pub external_id: String,
    /// Fields the confirming observation still showed different: field,
    /// value asked for, value observed.
    pub still_different: Vec<(String, Value, Value)>,
}

/// One change to the state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// A managed declaration left Git.
    AddTombstone {
        name: String,
        manifest: Value,
        at: SystemTime,
        commit: String,
    },
    /// A removed declaration came back.
    RemoveTombstone { name: String },
    /// The outcome of a removal is confirmed (deleted, released, gone).
    Forget { name: String },
    /// tend released a database (before its resource is forgotten): the
    /// release is kept to be shown once and named if the declaration
    /// comes back.
    Released(Box<crate::journal::Release>),
    /// Exactly these fields drift out of band now (`""`: the database is
    /// missing); new ones are first seen at `at`.
    SyncDrift {
        name: String,
        fields: Vec<String>,
        at: SystemTime,
    },
    /// The declaration of a managed resource changed: keep the last one.
    Touch {
        name: String,
        file: String,
        manifest: Value,
    },
    /// An override (by source) with this content was first seen at
    /// `first_seen`.
    OverrideSeen {
        name: String,
        source: &'static str,
        fingerprint: String,
        first_seen: SystemTime,
    },
    /// The mass-deletion guard holds exactly these deletions.
    HoldDeletions {
        names: Vec<String>,
        hold: HeldDeletion,
    },
    /// The guard holds nothing any more.
    ReleaseDeletions,
    /// A deletion was requested (`error`: and failed for now).
    DeletionProgress {
        name: String,
        at: SystemTime,
        error: Option<String>,
    },
    /// tend wrote to the resource at `at` (the stale-read rule).
    Wrote { name: String, at: SystemTime },
    /// An operation was confirmed with this effect.
    Applied {
        name: String,
        record: Box<AppliedRecord>,
        at: SystemTime,
    },
    /// The provider refused an operation for good: held as `Failed`.
    OperationFailed {
        name: String,
        failure: Box<crate::engine::OperationFailure>,
    },
    /// A journalled intent ended (or, `Pending` with an error, did not).
    Intent {
        op_id: String,
        state: IntentState,
        error: Option<String>,
        at: SystemTime,
    },
}

/// Writes `effects` in one transaction, in order.
pub(crate) fn commit(store: &StateStore, effects: &[Effect]) -> Result<(), StateError> {
    if effects.is_empty() {
        return Ok(());
    }
    store.write(|tx| effects.iter().try_for_each(|e| apply(tx, e)))
}

fn apply(tx: &Tx<'_>, effect: &Effect) -> Result<(), StateError> {
    match effect {
        Effect::AddTombstone {
            name,
            manifest,
            at,
            commit,
        } => tx.add_tombstone(name, manifest, *at, commit),
        Effect::RemoveTombstone { name } => tx.remove_tombstone(name),
        Effect::Forget { name } => tx.forget(name),
        Effect::Released(release) => tx.record_release(release),
        Effect::SyncDrift { name, fields, at } => tx.sync_drift(name, fields, *at),
        Effect::Touch {
            name,
            file,
            manifest,
        } => tx.touch(name, file, manifest),
        Effect::OverrideSeen {
            name,
            source,
            fingerprint,
            first_seen,
        } => tx.override_seen(name, source, fingerprint, *first_seen),
        Effect::HoldDeletions { names, hold } => tx.hold_deletions(names, *hold),
        Effect::ReleaseDeletions => tx.release_deletions(),
        Effect::DeletionProgress { name, at, error } => {
            tx.tombstone_progress(name, *at, error.as_deref())
        }
        Effect::Wrote { name, at } => tx.record_write(name, *at),
        Effect::Applied { name, record, at } => {
            let r = record.as_ref();
            tx.record_applied(
                name,
                &Applied {
                    provider: &r.provider,
                    database_name: &r.database_name,
                    file: &r.file,
                    manifest: &r.manifest,
                    spec_hash: &r.spec_hash,
                    fields: &r.fields,
                    commit: r.commit.as_deref(),
                    external_id: &r.external_id,
                },
                *at,
            )?;
            // An operation went through: whatever was refused before is
            // over, and a database released before is managed again.
            tx.clear_failure(name)?;
            tx.clear_release(name)?;
            tx.record_attempts(name, &r.still_different)
        }
        Effect::OperationFailed { name, failure } => tx.record_failure(name, failure),
        Effect::Intent {
            op_id,
            state: IntentState::Pending,
            error,
            at,
        } => tx.intent_error(op_id, error.as_deref().unwrap_or(""), *at),
        Effect::Intent {
            op_id,
            state,
            error,
            at,
        } => tx.finish_intent(op_id, *state, error.as_deref(), *at),
    }
}
