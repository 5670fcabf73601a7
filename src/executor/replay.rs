//! Pending intents at the start of a cycle: each is replayed with its own
//! id, or superseded when the repository has overtaken it (the verdict is
//! the decision core's, [`crate::engine::intents::verdict`]).

use std::collections::HashSet;
use std::time::SystemTime;

use super::operation::PlannedOperation;
use crate::engine::intents::{IntentVerdict, verdict};
use crate::journal::IntentState;
use crate::journal::effects::Effect;
use crate::model::Declaration;

/// What happens to each pending intent.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Replay {
    /// Replayed with the same ids, before any new work.
    pub replay: Vec<PlannedOperation>,
    /// Dropped, with why.
    pub superseded: Vec<(PlannedOperation, &'static str)>,
}

impl Replay {
    /// Sorts pending intents by their verdict against the current
    /// declarations and this host's pauses.
    /// `declared`: the current declaration of a name.
    pub(crate) fn sort<'d>(
        pending: Vec<PlannedOperation>,
        declared: impl Fn(&str) -> Option<&'d Declaration>,
        paused_locally: &HashSet<&str>,
    ) -> Self {
        let mut out = Replay::default();
        for op in pending {
            let declared = declared(op.name.as_str());
            match verdict(
                op.kind,
                &op.spec_hash,
                declared,
                paused_locally.contains(op.name.as_str()),
            ) {
                IntentVerdict::Replay => out.replay.push(op),
                IntentVerdict::Supersede(why) => out.superseded.push((op, why)),
            }
        }
        out
    }

    /// The journal entries that end the superseded intents.
    pub(crate) fn superseded_effects(&self, now: SystemTime) -> Vec<Effect> {
        self.superseded
            .iter()
            .map(|(op, why)| Effect::Intent {
                op_id: op.id.0.clone(),
                state: IntentState::Failed,
                error: Some(format!("superseded: {why}")),
                at: now,
            })
            .collect()
    }
}
