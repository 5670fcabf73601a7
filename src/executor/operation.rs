//! One operation: journal → call (with retries) → confirm → journal done.
//!
//! The operation's state machine, by commit point (each has a pause point
//! in [`super::hooks`] that the kill tests stop the process at):
//! * intent journalled, call not sent (`after-intent`): the next cycle
//!   replays the call with the same id; the provider sees it for the first
//!   time.
//! * call sent, response lost or process died (`after-call`): the replay
//!   reaches the provider with the same id; it answers with the original
//!   result and changes nothing.
//! * effect observed, journal not yet done (`after-confirm`): the replay
//!   sends the same id again (answered from the provider's memory of it)
//!   and confirms.
//! * confirmed: the applied spec (or the forgotten resource) and the
//!   intent's end are committed in one transaction.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ExecContext, ProviderRuntime};
use crate::journal::effects::{AppliedRecord, Effect, commit};
use crate::journal::{IntentState, StateError, blocking};
use crate::model::SpecHash;
use crate::process::failpoint::{self, AFTER_CALL, AFTER_CONFIRM, AFTER_INTENT, commit_point};
use crate::provider::{
    ChangeRequest, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, OperationId,
    OperationKind, Provider, ProviderError,
};
use crate::sabotage::Sabotage;

/// What is sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub(crate) enum RequestBody {
    Change(ChangeRequest),
    Delete { database_name: String },
}

/// Everything needed to replay an operation after a crash and to record
/// its confirmed effect; stored as the intent's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JournalRequest {
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
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlannedOperation {
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
    /// Journalled but never sent (the agent began stopping, or a journal
    /// write of its batch failed, while it waited for a provider slot):
    /// stays pending, and the provider is as it was observed.
    NotSent(String),
    /// Not done, and not pending any more: a conflict to re-observe, a
    /// name found taken.
    Failed(String),
    /// The provider refused the call for good (a permanent error, with its
    /// message): not sent again while nothing it depends on changes (the
    /// resource is `Failed`).
    Refused(String),
}

impl OpOutcome {
    /// The `result` label of `tend_operations_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            OpOutcome::Done => "done",
            OpOutcome::DoneWithDifferences(_) => "done-with-differences",
            OpOutcome::Pending(_) | OpOutcome::NotSent(_) => "pending",
            OpOutcome::Failed(_) | OpOutcome::Refused(_) => "failed",
        }
    }

    /// A short phrase for logs and the terminal (`done`, `pending: …`).
    pub fn describe(&self) -> String {
        match self {
            OpOutcome::Done => "done".into(),
            OpOutcome::DoneWithDifferences(fields) => {
                let verb = if fields.len() == 1 {
                    "differs"
                } else {
                    "differ"
                };
                format!("done, but {} still {verb}", fields.join(", "))
            }
            OpOutcome::Pending(why) => format!("pending: {why}"),
            OpOutcome::NotSent(why) => format!("pending, not sent: {why}"),
            OpOutcome::Failed(why) => format!("failed: {why}"),
            OpOutcome::Refused(why) => format!("refused: {why}"),
        }
    }
}

/// What the provider showed of a database when an operation was
/// confirmed (the call's answer, or a later look no older than the call):
/// the state after the write, as observed. A cycle reports from it instead
/// of listing the provider again.
#[derive(Debug, Clone, PartialEq)]
pub struct Confirmation {
    pub database_name: String,
    /// `None`: the database is gone (a confirmed delete).
    pub observation: Option<Observation>,
}

/// A journal row that cannot be turned back into an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnreadableIntent(pub String);

impl PlannedOperation {
    /// Rebuilds a pending intent's operation (same id).
    pub(crate) fn from_intent(intent: &crate::journal::Intent) -> Result<Self, UnreadableIntent> {
        let request: JournalRequest =
            serde_json::from_value(intent.request.clone()).map_err(|e| {
                UnreadableIntent(format!(
                    "intent {}: the request cannot be read ({e})",
                    intent.op_id
                ))
            })?;
        let kind = match intent.kind.as_str() {
            "create" => OperationKind::Create,
            "update" => OperationKind::Update,
            "delete" => OperationKind::Delete,
            "adopt" => OperationKind::Adopt,
            "release" => OperationKind::Release,
            other => {
                return Err(UnreadableIntent(format!(
                    "intent {}: unknown kind `{other}`",
                    intent.op_id
                )));
            }
        };
        Ok(PlannedOperation {
            name: intent.name.clone(),
            kind,
            spec_hash: SpecHash::from(intent.spec_hash.as_str()),
            generation: intent.generation,
            id: OperationId(intent.op_id.clone()),
            request,
        })
    }
}

/// Runs one operation to its outcome, with the observation that confirmed
/// it (none unless it was confirmed). State-store failures are returned:
/// without the journal, tend must not act.
pub(crate) async fn run<P: Provider>(
    runtime: Arc<ProviderRuntime<P>>,
    ctx: ExecContext,
    op: PlannedOperation,
) -> Result<(OpOutcome, Option<Confirmation>), StateError> {
    let halted = ctx.halted.clone();
    let ran = journalled(runtime, ctx, op).await;
    if ran.is_err() {
        // Before any other task runs: no operation waiting for a slot is
        // sent after a journal write failed.
        halted.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    ran
}

async fn journalled<P: Provider>(
    runtime: Arc<ProviderRuntime<P>>,
    ctx: ExecContext,
    op: PlannedOperation,
) -> Result<(OpOutcome, Option<Confirmation>), StateError> {
    let request_json = serde_json::to_value(&op.request).map_err(|source| StateError::Encode {
        path: ctx.store.location().to_string(),
        what: format!("the request of {}", op.id),
        source,
    })?;
    {
        let (id, name, kind, hash, generation, now) = (
            op.id.0.clone(),
            op.name.clone(),
            op.kind.as_str(),
            op.spec_hash.clone(),
            op.generation,
            ctx.clock.now(),
        );
        // The first call is counted with the intent (one commit, not two).
        blocking(&ctx.store, move |s| {
            s.begin_intent_and_attempt(&id, &name, kind, &hash, generation, &request_json, now)
        })
        .await?;
    }
    commit_point(AFTER_INTENT, &ctx.draining);
    if failpoint::fired(failpoint::HANG_OPERATIONS).is_some() {
        std::future::pending::<()>().await;
    }

    // A provider slot covers each call to it (the call here, each
    // confirming observation in `confirm`), not tend's journal writes:
    // another operation's call proceeds while this one's intent or outcome
    // is committed.
    let slot = runtime.slots.acquire().await;
    // Journalled while it waited for a slot: if the agent began stopping
    // (or stepped down), or another operation's journal write failed,
    // meanwhile, nothing new is sent. The intent stays pending, replayed
    // with the same id by the next cycle.
    let stopping = ctx.draining.load(std::sync::atomic::Ordering::SeqCst);
    if stopping || ctx.halted.load(std::sync::atomic::Ordering::SeqCst) {
        let why = if stopping {
            "the agent is stopping"
        } else {
            "a journal write failed"
        };
        return Ok((
            OpOutcome::NotSent(format!("{why}; the intent is replayed by the next cycle")),
            None,
        ));
    }
    let sent_at = ctx.clock.now();
    let result = call(&runtime, &ctx, &op).await;
    // An answer without the database (a delete's, or a create that met an
    // existing one) is confirmed by observing at once: that observation
    // keeps the call's slot instead of queueing behind the operations
    // journalled ahead, each a whole call away.
    let observe_now = match &result {
        Ok(None) => true,
        Err(ProviderError::Conflict { .. }) => op.kind == OperationKind::Create,
        _ => false,
    };
    let slot = if observe_now {
        slot.ok()
    } else {
        drop(slot);
        None
    };
    commit_point(AFTER_CALL, &ctx.draining);
    let wrote = Effect::Wrote {
        name: op.name.clone(),
        at: sent_at,
    };
    let end = |state: IntentState, error: &ProviderError| Effect::Intent {
        op_id: op.id.0.clone(),
        state,
        error: Some(error.to_string()),
        at: ctx.clock.now(),
    };
    let answer = match result {
        Ok(answer) => answer,
        // A create that meets an existing database may meet its own earlier
        // create (sent under another id before a crash): confirmation decides.
        Err(ProviderError::Conflict { .. }) if op.kind == OperationKind::Create => None,
        Err(e) if e.is_transient() => {
            commit_blocking(&ctx, vec![wrote, end(IntentState::Pending, &e)]).await?;
            return Ok((OpOutcome::Pending(e.to_string()), None));
        }
        Err(e) => {
            commit_blocking(&ctx, vec![wrote, end(IntentState::Failed, &e)]).await?;
            let outcome = match &e {
                ProviderError::Permanent { message, .. } => OpOutcome::Refused(message.clone()),
                _ => OpOutcome::Failed(e.to_string()),
            };
            return Ok((outcome, None));
        }
    };
    let (effects, outcome, seen) =
        confirm(&runtime, &ctx, &op, sent_at, answer, wrote, slot).await?;
    if matches!(outcome, OpOutcome::Done | OpOutcome::DoneWithDifferences(_)) {
        commit_point(AFTER_CONFIRM, &ctx.draining);
    }
    commit_blocking(&ctx, effects).await?;
    Ok((outcome, seen))
}

async fn commit_blocking(ctx: &ExecContext, effects: Vec<Effect>) -> Result<(), StateError> {
    blocking(&ctx.store, move |s| commit(s, &effects)).await
}

/// The call, retried; every attempt is counted in the journal first
/// (without the journal, nothing is sent): the first with the intent,
/// each retry on its own. A create's or update's answer
/// is the provider's observation of the database after the write.
async fn call<P: Provider>(
    runtime: &ProviderRuntime<P>,
    ctx: &ExecContext,
    op: &PlannedOperation,
) -> Result<Option<Observation>, ProviderError> {
    let attempts = std::sync::atomic::AtomicU32::new(0);
    runtime
        .retry
        .run(&runtime.limiter, || async {
            let attempt = attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let sent_id = if ctx.sabotaged(Sabotage::FreshIdOnRetry) && attempt > 0 {
                OperationId(format!("{}-retry-{attempt}", op.id.0))
            } else {
                op.id.clone()
            };
            if attempt > 0 {
                let id = op.id.0.clone();
                blocking(&ctx.store, move |s| s.note_attempt(&id))
                    .await
                    .map_err(|e| ProviderError::Retryable {
                        resource: op.request.database_name.clone(),
                        message: format!("journal: {e}"),
                    })?;
            }
            match (&op.request.body, op.kind) {
                (RequestBody::Change(change), OperationKind::Create) => {
                    runtime.provider.create(&sent_id, change).await.map(Some)
                }
                (RequestBody::Change(change), _) => {
                    runtime.provider.update(&sent_id, change).await.map(Some)
                }
                (RequestBody::Delete { database_name }, _) => runtime
                    .provider
                    .delete(&sent_id, database_name)
                    .await
                    .map(|()| None),
            }
        })
        .await
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

/// What one confirming observation shows.
enum Verdict {
    /// The effect is visible: the external id and the fields that still
    /// differ (`None` for a delete).
    Confirmed(Option<(String, Vec<Differing>)>),
    /// Not visible yet: wait and look again.
    NotYet(String),
    /// It cannot become visible (the name is someone else's).
    Refused(String),
}

/// A field a confirming observation still shows different: field, value
/// asked for, value observed.
type Differing = (String, Value, Value);

fn judge(
    observed: &Result<Option<Observation>, ProviderError>,
    op: &PlannedOperation,
    agent_id: &str,
    sent_at: SystemTime,
) -> Verdict {
    let db = &op.request.database_name;
    match (observed, &op.request.body) {
        (Err(e), _) => Verdict::NotYet(e.to_string()),
        (Ok(None), RequestBody::Delete { .. }) => Verdict::Confirmed(None),
        (Ok(Some(obs)), RequestBody::Delete { .. }) => {
            Verdict::NotYet(format!("`{}` still exists", obs.database_name))
        }
        (Ok(None), RequestBody::Change(_)) => Verdict::NotYet(format!("`{db}` is not visible yet")),
        (Ok(Some(obs)), _) if obs.observed_at < sent_at => {
            Verdict::NotYet("the observation predates the call".into())
        }
        (Ok(Some(obs)), RequestBody::Change(change)) => {
            let marker_ok = match op.kind {
                OperationKind::Create | OperationKind::Adopt => ours(obs, agent_id, &op.name),
                OperationKind::Release => !obs.labels.contains_key(OWNER_AGENT_LABEL),
                _ => true,
            };
            if marker_ok {
                let differing = change
                    .fields
                    .iter()
                    .filter_map(|(f, v)| {
                        let seen = obs.fields.get(f).unwrap_or(&Value::Null);
                        (!obs.unobserved.contains(f)
                            && !crate::engine::decide::values_match(f, v, seen))
                        .then(|| (f.clone(), v.clone(), seen.clone()))
                    })
                    .collect();
                Verdict::Confirmed(Some((obs.external_id.clone(), differing)))
            } else if op.kind == OperationKind::Create {
                // A fresh observation of the database without this
                // declaration's marker: the name was taken by someone else
                // (the create met an existing database). Waiting cannot
                // change that; the next decision reports it.
                Verdict::Refused(format!(
                    "`{db}` exists without this declaration's ownership marker (name taken)"
                ))
            } else {
                Verdict::NotYet("the ownership marker is not as requested yet".into())
            }
        }
    }
}

/// What a confirmed operation changes in memory: a delete or release
/// forgets the resource; a create, update or adopt records the applied
/// spec (and the fields that still differ).
fn confirmed(
    op: &PlannedOperation,
    effect: Option<(String, Vec<Differing>)>,
    now: SystemTime,
    sent_at: SystemTime,
) -> (Vec<Effect>, OpOutcome) {
    match (op.kind, effect) {
        (OperationKind::Delete, _) => (
            vec![Effect::Forget {
                name: op.name.clone(),
            }],
            OpOutcome::Done,
        ),
        (OperationKind::Release, _) => (
            vec![
                Effect::Released(Box::new(crate::journal::Release {
                    name: op.name.clone(),
                    provider: op.request.provider.clone(),
                    database_name: op.request.database_name.clone(),
                    file: op.request.file.clone(),
                    operation_id: op.id.0.clone(),
                    removal_commit: op.request.commit.clone().unwrap_or_default(),
                    at: now,
                })),
                Effect::Forget {
                    name: op.name.clone(),
                },
            ],
            OpOutcome::Done,
        ),
        (_, Some((external_id, differing))) => {
            let r = &op.request;
            let outcome = if differing.is_empty() {
                OpOutcome::Done
            } else {
                OpOutcome::DoneWithDifferences(
                    differing.iter().map(|(f, _, _)| f.clone()).collect(),
                )
            };
            let record = AppliedRecord {
                provider: r.provider.clone(),
                database_name: r.database_name.clone(),
                file: r.file.clone(),
                manifest: r.manifest.clone(),
                spec_hash: op.spec_hash.clone(),
                fields: r.desired.clone(),
                commit: r.commit.clone(),
                external_id,
                still_different: differing,
            };
            let effects = vec![
                Effect::Applied {
                    name: op.name.clone(),
                    record: Box::new(record),
                    at: now,
                },
                Effect::Wrote {
                    name: op.name.clone(),
                    at: sent_at,
                },
            ];
            (effects, outcome)
        }
        (_, None) => (Vec::new(), OpOutcome::Done),
    }
}

/// Waits for an observation that shows the effect, no older than the call,
/// and returns the effects to commit with the outcome (and, when
/// confirmed, that observation). The call's own
/// answer (`answer`: the provider's observation after the write) is
/// judged first, by the same rules: when it shows the effect, no second
/// request is made. `slot`: the call's, kept for a first observation.
///
/// `wrote` (that the call was sent) goes first among the returned
/// effects, so an answer that confirms costs one commit; it is committed
/// on its own before the first wait, so the stale-read rule knows of the
/// write while the confirmation is still awaited.
async fn confirm<P: Provider>(
    runtime: &ProviderRuntime<P>,
    ctx: &ExecContext,
    op: &PlannedOperation,
    sent_at: SystemTime,
    mut answer: Option<Observation>,
    wrote: Effect,
    mut slot: Option<tokio::sync::SemaphorePermit<'_>>,
) -> Result<(Vec<Effect>, OpOutcome, Option<Confirmation>), StateError> {
    let mut wrote = Some(wrote);
    let deadline = tokio::time::Instant::now() + runtime.confirm_timeout;
    let mut wait = Duration::from_millis(50);
    let db = &op.request.database_name;
    loop {
        let mut observed = match answer.take() {
            Some(obs) => Ok(Some(obs)),
            None => {
                let _slot = match slot.take() {
                    Some(held) => Ok(held),
                    None => runtime.slots.acquire().await,
                };
                runtime
                    .retry
                    .run(&runtime.limiter, || runtime.provider.observe(db))
                    .await
            }
        };
        if runtime.capabilities().parameter_names_ignore_case
            && let Ok(Some(obs)) = &mut observed
        {
            obs.align_parameter_names(op.request.desired.keys().map(String::as_str));
        }
        let now = ctx.clock.now();
        let intent = |state: IntentState, error: Option<String>| Effect::Intent {
            op_id: op.id.0.clone(),
            state,
            error,
            at: now,
        };
        match judge(&observed, op, &ctx.agent_id, sent_at) {
            Verdict::Confirmed(effect) => {
                let (mut effects, outcome) = confirmed(op, effect, now, sent_at);
                if !ctx.sabotaged(Sabotage::IntentLeftPending) {
                    effects.push(intent(IntentState::Done, None));
                }
                let seen = observed.ok().map(|observation| Confirmation {
                    database_name: db.clone(),
                    observation,
                });
                return Ok((with_wrote(wrote, effects), outcome, seen));
            }
            Verdict::Refused(why) => {
                let failed = intent(
                    IntentState::Failed,
                    Some("the name is taken by a database that is not this declaration's".into()),
                );
                return Ok((
                    with_wrote(wrote, vec![failed]),
                    OpOutcome::Failed(why),
                    None,
                ));
            }
            Verdict::NotYet(why) => {
                if tokio::time::Instant::now() >= deadline {
                    let message = format!(
                        "not confirmed within {}: {why}",
                        humantime::format_duration(runtime.confirm_timeout)
                    );
                    let pending = intent(IntentState::Pending, Some(message.clone()));
                    return Ok((
                        with_wrote(wrote, vec![pending]),
                        OpOutcome::Pending(message),
                        None,
                    ));
                }
                if let Some(wrote) = wrote.take() {
                    commit_blocking(ctx, vec![wrote]).await?;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// `wrote`, when not committed yet, before `effects`.
fn with_wrote(wrote: Option<Effect>, effects: Vec<Effect>) -> Vec<Effect> {
    wrote.into_iter().chain(effects).collect()
}
