//! One operation: journal → call (with retries) → confirm → journal done.
//!
//! The operation's state machine, by commit point:
//! * intent journalled, call not sent (crash here): the next cycle replays
//!   the call with the same id; the provider sees it for the first time.
//! * call sent, response lost or process died: the replay reaches the
//!   provider with the same id; it answers with the original result and
//!   changes nothing.
//! * call confirmed by an observation: journal done, memory updated.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ExecContext;
use super::hooks::{AFTER_CALL, AFTER_INTENT, pause_point};
use crate::journal::{IntentState, StateError};
use crate::model::SpecHash;
use crate::provider::{
    ChangeRequest, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, OperationId,
    OperationKind, Provider, ProviderError,
};

/// What is sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum RequestBody {
    Change(ChangeRequest),
    Delete { database_name: String },
}

/// Everything needed to replay an operation after a crash and to record
/// its confirmed effect; stored as the intent's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalRequest {
    pub provider: String,
    pub database_name: String,
    pub file: String,
    pub commit: Option<String>,
    /// The declaration as last seen.
    pub manifest: Value,
    /// Every desired field value (recorded as applied once confirmed).
    pub desired: BTreeMap<String, Value>,
    pub body: RequestBody,
}

/// An operation to run.
#[derive(Debug, Clone)]
pub struct PlannedOperation {
    pub name: String,
    pub kind: OperationKind,
    pub spec_hash: SpecHash,
    pub generation: u32,
    pub id: OperationId,
    pub request: JournalRequest,
}

/// How an operation ended this cycle.
#[derive(Debug, Clone, PartialEq)]
pub enum OpOutcome {
    /// Confirmed by an observation.
    Done,
    /// Confirmed, but these fields still differ (counts toward Unconvergeable).
    DoneWithDifferences(Vec<String>),
    /// Sent (or maybe sent) but not confirmed yet: stays pending.
    Pending(String),
    /// Refused for good (or a conflict to re-observe): not pending any more.
    Failed(String),
}

impl PlannedOperation {
    /// The operation for a decision, its generation from the journal.
    pub fn new(
        store: &crate::journal::StateStore,
        agent_id: &str,
        name: &str,
        kind: OperationKind,
        spec_hash: &SpecHash,
        request: JournalRequest,
    ) -> Result<Self, StateError> {
        let generation = store.next_generation(name, kind.as_str(), spec_hash)?;
        Ok(PlannedOperation {
            name: name.to_string(),
            kind,
            spec_hash: spec_hash.clone(),
            generation,
            id: OperationId::derive_nth(agent_id, name, kind, spec_hash, generation),
            request,
        })
    }

    /// Rebuilds a pending intent's operation (same id).
    pub fn from_intent(intent: &crate::journal::Intent) -> Option<Self> {
        let request: JournalRequest = serde_json::from_value(intent.request.clone()).ok()?;
        let kind = match intent.kind.as_str() {
            "create" => OperationKind::Create,
            "update" => OperationKind::Update,
            "delete" => OperationKind::Delete,
            "adopt" => OperationKind::Adopt,
            "release" => OperationKind::Release,
            _ => return None,
        };
        Some(PlannedOperation {
            name: intent.name.clone(),
            kind,
            spec_hash: SpecHash(intent.spec_hash.clone()),
            generation: intent.generation,
            id: OperationId(intent.op_id.clone()),
            request,
        })
    }
}

/// Runs one operation to its outcome. State-store failures are returned:
/// without the journal, tend must not act.
pub async fn run<P: Provider>(
    ctx: Arc<ExecContext<P>>,
    op: PlannedOperation,
) -> Result<OpOutcome, StateError> {
    let _slot = ctx.slots.acquire().await;
    let store = &ctx.store;
    let request_json = serde_json::to_value(&op.request).unwrap_or(Value::Null);
    store.begin_intent(
        &op.id.0,
        &op.name,
        op.kind.as_str(),
        &op.spec_hash,
        op.generation,
        &request_json,
        SystemTime::now(),
    )?;
    pause_point(AFTER_INTENT);

    let sent_at = SystemTime::now();
    let provider = ctx.provider.clone();
    let result = match &op.request.body {
        RequestBody::Change(change) => {
            let create = op.kind == OperationKind::Create;
            ctx.retry
                .run(&ctx.limiter, || {
                    let provider = provider.clone();
                    let id = op.id.clone();
                    let change = change.clone();
                    let noted = store.note_attempt(&op.id.0);
                    async move {
                        // Without the journal, tend must not act: nothing is
                        // sent, and the intent stays pending.
                        noted.map_err(|e| ProviderError::Retryable {
                            resource: change.database_name.clone(),
                            message: format!("journal: {e}"),
                        })?;
                        if create {
                            provider.create(&id, &change).await.map(|_| ())
                        } else {
                            provider.update(&id, &change).await.map(|_| ())
                        }
                    }
                })
                .await
        }
        RequestBody::Delete { database_name } => {
            ctx.retry
                .run(&ctx.limiter, || {
                    let provider = provider.clone();
                    let id = op.id.clone();
                    let db = database_name.clone();
                    let noted = store.note_attempt(&op.id.0);
                    async move {
                        noted.map_err(|e| ProviderError::Retryable {
                            resource: db.clone(),
                            message: format!("journal: {e}"),
                        })?;
                        provider.delete(&id, &db).await
                    }
                })
                .await
        }
    };
    pause_point(AFTER_CALL);
    store.record_write(&op.name, sent_at)?;

    match result {
        Ok(()) => {}
        // A create that meets an existing database may meet its own earlier
        // create (sent under another id before a crash): confirmation decides.
        Err(ProviderError::Conflict { .. }) if op.kind == OperationKind::Create => {}
        Err(e) if e.is_transient() => {
            store.intent_error(&op.id.0, &e.to_string(), SystemTime::now())?;
            return Ok(OpOutcome::Pending(e.to_string()));
        }
        Err(e) => {
            store.finish_intent(
                &op.id.0,
                IntentState::Failed,
                Some(&e.to_string()),
                SystemTime::now(),
            )?;
            return Ok(OpOutcome::Failed(e.to_string()));
        }
    }
    confirm(&ctx, &op, sent_at).await
}

fn ours(obs: &Observation, agent_id: &str, name: &str) -> bool {
    obs.labels
        .get(OWNER_AGENT_LABEL)
        .is_some_and(|a| a == agent_id)
        && obs
            .labels
            .get(OWNER_DECLARATION_LABEL)
            .is_some_and(|d| d == name)
}

/// Waits for an observation that shows the effect, no older than the call.
async fn confirm<P: Provider>(
    ctx: &ExecContext<P>,
    op: &PlannedOperation,
    sent_at: SystemTime,
) -> Result<OpOutcome, StateError> {
    let store = &ctx.store;
    let deadline = tokio::time::Instant::now() + ctx.confirm_timeout;
    let mut wait = Duration::from_millis(50);
    let db = &op.request.database_name;
    loop {
        let observed = ctx
            .retry
            .run(&ctx.limiter, || ctx.provider.observe(db))
            .await;
        let now = SystemTime::now();
        let verdict = match (&observed, &op.request.body) {
            (Err(e), _) => Err(e.to_string()),
            (Ok(None), RequestBody::Delete { .. }) => Ok(None),
            (Ok(Some(obs)), RequestBody::Delete { .. }) => {
                Err(format!("`{}` still exists", obs.database_name))
            }
            (Ok(None), RequestBody::Change(_)) => Err(format!("`{db}` is not visible yet")),
            (Ok(Some(obs)), _) if obs.observed_at < sent_at => {
                Err("the observation predates the call".into())
            }
            (Ok(Some(obs)), RequestBody::Change(change)) => {
                let marker_ok = match op.kind {
                    OperationKind::Create | OperationKind::Adopt => {
                        ours(obs, &ctx.agent_id, &op.name)
                    }
                    OperationKind::Release => !obs.labels.contains_key(OWNER_AGENT_LABEL),
                    _ => true,
                };
                if marker_ok {
                    let differing: Vec<String> = change
                        .fields
                        .iter()
                        .filter(|(f, v)| {
                            !obs.unobserved.contains(f)
                                && !crate::engine::decide::values_match(
                                    f,
                                    v,
                                    obs.fields.get(*f).unwrap_or(&Value::Null),
                                )
                        })
                        .map(|(f, _)| f.clone())
                        .collect();
                    Ok(Some((obs.external_id.clone(), differing)))
                } else if op.kind == OperationKind::Create {
                    // A fresh observation of the database without this
                    // declaration's marker: the name was taken by someone
                    // else (the create met an existing database). Waiting
                    // cannot change that; the next decision reports it.
                    store.finish_intent(
                        &op.id.0,
                        IntentState::Failed,
                        Some("the name is taken by a database that is not this declaration's"),
                        now,
                    )?;
                    return Ok(OpOutcome::Failed(format!(
                        "`{db}` exists without this declaration's ownership marker (name taken)"
                    )));
                } else {
                    Err("the ownership marker is not as requested yet".into())
                }
            }
        };
        match verdict {
            Ok(effect) => {
                let outcome = match (op.kind, effect) {
                    (OperationKind::Delete | OperationKind::Release, _) => {
                        store.forget(&op.name)?;
                        OpOutcome::Done
                    }
                    (_, Some((external_id, differing))) => {
                        let r = &op.request;
                        store.record_applied(
                            &op.name,
                            &r.provider,
                            &r.database_name,
                            &r.file,
                            &r.manifest,
                            &op.spec_hash,
                            &r.desired,
                            r.commit.as_deref(),
                            &external_id,
                            now,
                        )?;
                        store.record_write(&op.name, sent_at)?;
                        store.record_attempts(&op.name, &differing)?;
                        if differing.is_empty() {
                            OpOutcome::Done
                        } else {
                            OpOutcome::DoneWithDifferences(differing)
                        }
                    }
                    (_, None) => OpOutcome::Done,
                };
                store.finish_intent(&op.id.0, IntentState::Done, None, now)?;
                return Ok(outcome);
            }
            Err(why) => {
                if tokio::time::Instant::now() >= deadline {
                    let message = format!("not confirmed within {:?}: {why}", ctx.confirm_timeout);
                    store.intent_error(&op.id.0, &message, now)?;
                    return Ok(OpOutcome::Pending(message));
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        }
    }
}
