//! Writing the state. Memory changes go through [`Tx`], one transaction
//! per batch (`StateStore::write`): a cycle's effects commit together or
//! not at all, and an operation's confirmation records the applied spec
//! and finishes its intent atomically.
//!
//! SQLite transactions start `IMMEDIATE`: a transaction that starts
//! reading and later writes cannot take the write lock while another
//! connection holds it, and SQLite then fails at once instead of waiting
//! out the busy timeout ("database is locked" beside a running writer).
//!
//! On PostgreSQL, a store that holds the group's leader lease checks its
//! fencing token first in every write transaction ([`super::lease`]): a
//! leader that lost the lease writes nothing, and the row lock it takes
//! keeps a takeover from committing until the write did.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::Value;

use super::finished::REFINISHED;
use super::group_commit::{Committer, Ran};
use super::sql::{Row, SqlError, SqlValue, TxControl, args};
use super::{Backend, BackendKind, StateStore, ms};
use crate::engine::HeldDeletion;
use crate::journal::{IntentState, StateError};
use crate::model::SpecHash;

/// A write transaction on the state database.
pub struct Tx<'c> {
    conn: &'c Backend,
    store: &'c StateStore,
}

/// What a confirmed create, update or adopt put at the provider.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied<'a> {
    pub provider: &'a str,
    pub database_name: &'a str,
    pub file: &'a str,
    pub manifest: &'a Value,
    pub spec_hash: &'a SpecHash,
    pub fields: &'a BTreeMap<String, Value>,
    pub commit: Option<&'a str>,
    pub external_id: &'a str,
}

/// What a transaction's writes are to the memories' freshness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// A change cycles read: fenced, and counted.
    Change,
    /// Beside what cycles read: fenced, not counted.
    Aside,
    /// Creating the schema: neither fenced nor counted (by other
    /// processes: this one still reads again).
    Unfenced,
}

impl StateStore {
    /// Runs `f` in one transaction and commits it (checked against the
    /// leader lease when this store holds one).
    pub fn write<T>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        self.transaction(Written::Change, f)
    }

    /// [`Self::write`] of what no resource's memory is read from (the
    /// status branch's digests, the releases shown, the notification
    /// queue): fenced like any write, but not counted as a change, so the
    /// memories a running agent keeps stay in use. Every status commit
    /// writes here; counted, each made the next cycle read every memory
    /// again (0.75 s at 100,000 resources).
    pub(crate) fn write_aside<T>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        self.transaction(Written::Aside, f)
    }

    /// A transaction that no fence checks and that leaves the change
    /// counter alone: creating the schema.
    pub(super) fn write_unfenced<T>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        self.transaction(Written::Unfenced, f)
    }

    /// Runs `f` as one write: alone in a transaction, or in a savepoint of
    /// the transaction other writes waiting at the same time share
    /// ([`super::group_commit`]). Returns once the commit that holds it
    /// ran.
    fn transaction<T>(
        &self,
        written: Written,
        f: impl FnOnce(&Tx<'_>) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        // Bulk writes beside the journal (the status branch's digests) and
        // the schema's creation never share: no journal write waits behind
        // them.
        let alone = written != Written::Change;
        let mut taken = self.conn.take();
        let joined = !alone && taken.can_join();
        if !joined {
            taken.settle(&self.conn, self);
        }
        let begun = if joined {
            taken.join()
        } else {
            taken.transaction(TxControl::Begin)
        };
        if let Err(e) = begun {
            // Nothing of this write to wait for: it failed before it began.
            let _ = taken.end_write(&self.conn, joined, Ran::Undone, alone, self);
            return Err(self.err(e));
        }
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let tx = Tx {
                conn: &taken,
                store: self,
            };
            self.open_write(&tx, written, joined, taken.open_changed())?;
            f(&tx)
        }));
        let how = match &ran {
            Ok(Ok(_)) => Ran::Written {
                changed: written != Written::Aside,
            },
            _ => Ran::Undone,
        };
        let outcome = taken.end_write(&self.conn, joined, how, alone, self);
        let value = match ran {
            Ok(result) => result?,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        match outcome.map_err(|e| self.err(e))? {
            Some(commit) => commit.wait().map(|()| value),
            // A write that succeeded always has a commit to wait for.
            None => Ok(value),
        }
    }

    /// What every write checks or counts first on PostgreSQL: the leader
    /// lease (once per transaction: its row lock covers every write in
    /// it), and the change counter other processes read (once per
    /// transaction that holds a change).
    fn open_write(
        &self,
        tx: &Tx<'_>,
        written: Written,
        joined: bool,
        counted_already: bool,
    ) -> Result<(), StateError> {
        if self.kind != BackendKind::Postgres {
            return Ok(());
        }
        if !joined && written != Written::Unfenced {
            self.check_fence(tx)?;
        }
        if written == Written::Change && !counted_already {
            tx.exec(
                "INSERT INTO meta (key, value) VALUES ('changes', '1') \
                 ON CONFLICT (key) DO UPDATE SET value = (meta.value::bigint + 1)::text",
                &[],
            )?;
        }
        Ok(())
    }

    /// Journals an intent (a replay keeps the existing row) and commits it
    /// durably before the provider call. Returns the calls sent so far.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_intent(
        &self,
        op_id: &str,
        name: &str,
        kind: &str,
        spec_hash: &SpecHash,
        generation: u32,
        request: &Value,
        now: SystemTime,
    ) -> Result<u32, StateError> {
        let row = (op_id, name, kind, spec_hash, generation, request);
        self.journal_intent(row, now, false)
    }

    /// [`Self::begin_intent`] and [`Self::note_attempt`] in one
    /// transaction: the intent and the call about to be sent under it are
    /// durable together, one commit before a call instead of two (with
    /// eight calls in flight, each commit waits for the others').
    #[allow(clippy::too_many_arguments)]
    pub fn begin_intent_and_attempt(
        &self,
        op_id: &str,
        name: &str,
        kind: &str,
        spec_hash: &SpecHash,
        generation: u32,
        request: &Value,
        now: SystemTime,
    ) -> Result<u32, StateError> {
        let row = (op_id, name, kind, spec_hash, generation, request);
        self.journal_intent(row, now, true)
    }

    fn journal_intent(
        &self,
        (op_id, name, kind, spec_hash, generation, request): (
            &str,
            &str,
            &str,
            &SpecHash,
            u32,
            &Value,
        ),
        now: SystemTime,
        count_attempt: bool,
    ) -> Result<u32, StateError> {
        self.write(|tx| {
            tx.count_refinish(op_id)?;
            tx.exec(
                "INSERT INTO intents (op_id, name, kind, spec_hash, generation, request, state, attempts, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', 0, ?7, ?7)
                 ON CONFLICT(op_id) DO UPDATE SET updated_ms = excluded.updated_ms",
                args![op_id, name, kind, spec_hash.to_string(), generation, request.to_string(), ms(now)],
            )?;
            if count_attempt {
                tx.exec(
                    "UPDATE intents SET attempts = attempts + 1 WHERE op_id = ?1",
                    args![op_id],
                )?;
            }
            tx.query_one("SELECT attempts FROM intents WHERE op_id = ?1", args![op_id])
        })
    }

    /// Counts one call sent under an intent's id (every retry counts).
    pub fn note_attempt(&self, op_id: &str) -> Result<(), StateError> {
        self.write(|tx| {
            tx.exec(
                "UPDATE intents SET attempts = attempts + 1 WHERE op_id = ?1",
                args![op_id],
            )
        })
    }

    /// Records an error on a still-pending intent.
    pub fn intent_error(
        &self,
        op_id: &str,
        error: &str,
        now: SystemTime,
    ) -> Result<(), StateError> {
        self.write(|tx| tx.intent_error(op_id, error, now))
    }

    /// Marks an intent's outcome.
    pub fn finish_intent(
        &self,
        op_id: &str,
        state: IntentState,
        error: Option<&str>,
        now: SystemTime,
    ) -> Result<(), StateError> {
        self.write(|tx| tx.finish_intent(op_id, state, error, now))
    }

    /// Sets (replaces) the local override of `name`: annotation-style keys
    /// (`tend.dev/paused`, …) and their values.
    pub fn set_local_override(
        &self,
        name: &str,
        annotations: &BTreeMap<String, String>,
        now: SystemTime,
    ) -> Result<(), StateError> {
        let text = serde_json::to_string(annotations).map_err(|source| StateError::Encode {
            path: self.location.clone(),
            what: "the override".into(),
            source,
        })?;
        self.write(|tx| {
            tx.exec(
                "INSERT INTO local_overrides (name, annotations, set_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(name) DO UPDATE SET annotations = excluded.annotations, set_ms = excluded.set_ms",
                args![name, text, ms(now)],
            )
        })
    }

    /// Removes the local override of `name`; whether there was one.
    pub fn clear_local_override(&self, name: &str) -> Result<bool, StateError> {
        self.write(|tx| {
            tx.count("DELETE FROM local_overrides WHERE name = ?1", args![name])
                .map(|n| n > 0)
        })
    }

    /// Forgets the failed update attempts of `name` (`tend state
    /// reset-attempts`): an `Unconvergeable` field is tried again. Whether
    /// there were any.
    /// Forgets the operation the provider refused for `name`, so it is
    /// sent again (`tend reconcile NAME`); whether there was one.
    pub fn clear_failure(&self, name: &str) -> Result<bool, StateError> {
        if !self.has_table("failures")? {
            return Ok(false);
        }
        self.write(|tx| tx.clear_failure(name))
    }

    pub fn reset_attempts(&self, name: &str) -> Result<bool, StateError> {
        self.write(|tx| {
            tx.count("DELETE FROM attempts WHERE name = ?1", args![name])
                .map(|n| n > 0)
        })
    }

    /// Approves the deletion of `name` although the mass-deletion guard
    /// holds it (`tend deletions approve`).
    pub fn approve_deletion(
        &self,
        name: &str,
        reason: &str,
        now: SystemTime,
    ) -> Result<(), StateError> {
        self.write(|tx| {
            tx.exec(
                "INSERT INTO deletion_approvals (name, reason, approved_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(name) DO UPDATE SET reason = excluded.reason, approved_ms = excluded.approved_ms",
                args![name, reason, ms(now)],
            )
        })
    }
}

impl StateStore {
    /// Drops finished intents last updated before `cutoff`, keeping the
    /// newest `keep` finished ones of each resource (what `explain` shows)
    /// and every pending one; their counts stay in `pruned_generations`,
    /// so no operation id is ever reused. Returns how many were dropped.
    ///
    /// Finished intents are ranked as the last-operation read ranks them
    /// (newest first; of one millisecond, the lower id), and pending ones
    /// are not ranked: a prune never changes a resource's last operation,
    /// which the status writer's mark does not see change.
    pub fn prune_journal(&self, cutoff: SystemTime, keep: u32) -> Result<usize, StateError> {
        // The finished intents to drop, ranked newest first per resource.
        const PRUNABLE: &str = "SELECT op_id FROM (
                 SELECT op_id, updated_ms,
                        row_number() OVER (PARTITION BY name ORDER BY updated_ms DESC, op_id ASC) AS newest
                 FROM intents WHERE state != 'pending') AS ranked
             WHERE updated_ms < ?1 AND newest > ?2";
        self.write(|tx| {
            tx.exec(
                &format!(
                    "INSERT INTO pruned_generations (name, kind, spec_hash, count)
                     SELECT name, kind, spec_hash, count(*) FROM intents
                     WHERE op_id IN ({PRUNABLE})
                     GROUP BY name, kind, spec_hash
                     ON CONFLICT(name, kind, spec_hash) DO UPDATE SET count = pruned_generations.count + excluded.count"
                ),
                args![ms(cutoff), keep],
            )?;
            tx.count(
                &format!("DELETE FROM intents WHERE op_id IN ({PRUNABLE})"),
                args![ms(cutoff), keep],
            )
        })
    }
}

impl Tx<'_> {
    /// Runs `sql` inside the write: for tests that make a write fail at a
    /// statement the backend refuses (both backends).
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn exec_unchecked(&self, sql: &str) -> Result<(), StateError> {
        self.exec(sql, &[])
    }

    fn err(&self, e: SqlError) -> StateError {
        self.store.err(e)
    }

    pub(super) fn exec(&self, sql: &str, args: &[SqlValue]) -> Result<(), StateError> {
        self.count(sql, args).map(|_| ())
    }

    /// Runs `sql`; how many rows it changed.
    pub(super) fn count(&self, sql: &str, args: &[SqlValue]) -> Result<usize, StateError> {
        self.conn.execute(sql, args).map_err(|e| self.err(e))
    }

    pub(super) fn query(&self, sql: &str, args: &[SqlValue]) -> Result<Vec<Row>, StateError> {
        self.conn.query(sql, args).map_err(|e| self.err(e))
    }

    pub(super) fn batch(&self, sql: &str) -> Result<(), StateError> {
        self.conn.batch(sql).map_err(|e| self.err(e))
    }

    /// The first column of the first row (a missing row is an error).
    pub(super) fn query_one<T: super::sql::FromSqlValue>(
        &self,
        sql: &str,
        args: &[SqlValue],
    ) -> Result<T, StateError> {
        let rows = self.query(sql, args)?;
        let row = rows
            .first()
            .ok_or_else(|| self.err(SqlError::Type(format!("no row for `{sql}`"))))?;
        row.get(0).map_err(|e| self.err(e))
    }

    /// Records a confirmed apply: the spec and fields now at the provider.
    /// Out-of-band drift first-seen times go (the provider now shows what
    /// tend wrote).
    pub fn record_applied(
        &self,
        name: &str,
        a: &Applied<'_>,
        now: SystemTime,
    ) -> Result<(), StateError> {
        let fields = serde_json::to_string(a.fields).map_err(|source| StateError::Encode {
            path: self.store.location.clone(),
            what: format!("the applied fields of {name}"),
            source,
        })?;
        self.exec(
            "INSERT INTO resources (name, provider, database_name, file, applied_spec_hash, applied_fields, applied_commit, external_id, existed, manifest, updated_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, ?9, ?10)
             ON CONFLICT(name) DO UPDATE SET provider = excluded.provider, database_name = excluded.database_name, file = excluded.file,
               applied_spec_hash = excluded.applied_spec_hash, applied_fields = excluded.applied_fields, applied_commit = excluded.applied_commit,
               external_id = excluded.external_id, existed = 1, manifest = excluded.manifest, updated_ms = excluded.updated_ms",
            args![name, a.provider, a.database_name, a.file, a.spec_hash.to_string(), fields, a.commit, a.external_id, a.manifest.to_string(), ms(now)],
        )?;
        self.exec("DELETE FROM drift_seen WHERE name = ?1", args![name])
    }

    /// Keeps the declaration's file and manifest current for a managed
    /// resource (a future tombstone needs the last one seen).
    pub fn touch(&self, name: &str, file: &str, manifest: &Value) -> Result<(), StateError> {
        self.exec(
            "UPDATE resources SET file = ?2, manifest = ?3 WHERE name = ?1 AND (file != ?2 OR manifest != ?3)",
            args![name, file, manifest.to_string()],
        )
    }

    /// Records when tend last wrote to `name` (for the stale-read rule).
    pub fn record_write(&self, name: &str, at: SystemTime) -> Result<(), StateError> {
        self.exec(
            "UPDATE resources SET last_write_ms = ?2 WHERE name = ?1",
            args![name, ms(at)],
        )
    }

    /// Keeps first-seen times for exactly the `fields` now drifting out of
    /// band (`""` stands for "the resource went missing").
    pub fn sync_drift(
        &self,
        name: &str,
        fields: &[String],
        now: SystemTime,
    ) -> Result<(), StateError> {
        let known = self.strings("SELECT field FROM drift_seen WHERE name = ?1", name)?;
        for field in known.iter().filter(|f| !fields.contains(f)) {
            self.exec(
                "DELETE FROM drift_seen WHERE name = ?1 AND field = ?2",
                args![name, field],
            )?;
        }
        for field in fields.iter().filter(|f| !known.contains(f)) {
            self.exec(
                "INSERT INTO drift_seen (name, field, first_seen_ms) VALUES (?1, ?2, ?3)",
                args![name, field, ms(now)],
            )?;
        }
        Ok(())
    }

    /// Counts a confirmed update that left fields still different (field,
    /// value asked for, value observed); a field not listed converged and
    /// its count is cleared. A count goes on only for the same two values;
    /// other values start it again at 1 (see `FailedAttempts`).
    pub fn record_attempts(
        &self,
        name: &str,
        still_different: &[(String, Value, Value)],
    ) -> Result<(), StateError> {
        for field in self.strings("SELECT field FROM attempts WHERE name = ?1", name)? {
            if !still_different.iter().any(|(f, _, _)| *f == field) {
                self.exec(
                    "DELETE FROM attempts WHERE name = ?1 AND field = ?2",
                    args![name, field],
                )?;
            }
        }
        for (field, desired, observed) in still_different {
            let (desired, observed) = (desired.to_string(), observed.to_string());
            self.exec(
                "INSERT INTO attempts (name, field, count, desired, observed) VALUES (?1, ?2, 1, ?3, ?4) \
                 ON CONFLICT(name, field) DO UPDATE SET \
                 count = CASE WHEN attempts.desired IS NOT DISTINCT FROM excluded.desired AND attempts.observed IS NOT DISTINCT FROM excluded.observed THEN attempts.count + 1 ELSE 1 END, \
                 desired = excluded.desired, observed = excluded.observed",
                args![name, field, desired, observed],
            )?;
        }
        Ok(())
    }

    /// Counts a change to `op_id`'s row if it is finished already (begun
    /// again, finished again, or an error noted on it: a failed operation
    /// retried under its id): its row moves to a later time while the
    /// finished rows stay as many, and the status writer's mark
    /// (`FinishedMark`) counts it as one finished again. Uncounted, such a
    /// change could stand in for an operation finished since and not
    /// seen by the status files.
    fn count_refinish(&self, op_id: &str) -> Result<(), StateError> {
        let plus_one = match self.store.kind {
            BackendKind::Sqlite => "CAST(CAST(meta.value AS INTEGER) + 1 AS TEXT)",
            BackendKind::Postgres => "(meta.value::bigint + 1)::text",
        };
        self.exec(
            &format!(
                "INSERT INTO meta (key, value) SELECT '{REFINISHED}', '1' \
                 WHERE EXISTS (SELECT 1 FROM intents WHERE op_id = ?1 AND state IN ('done', 'failed')) \
                 ON CONFLICT (key) DO UPDATE SET value = {plus_one}"
            ),
            args![op_id],
        )
    }

    /// Marks an intent's outcome.
    pub fn finish_intent(
        &self,
        op_id: &str,
        state: IntentState,
        error: Option<&str>,
        now: SystemTime,
    ) -> Result<(), StateError> {
        self.count_refinish(op_id)?;
        self.exec(
            "UPDATE intents SET state = ?2, last_error = ?3, updated_ms = ?4 WHERE op_id = ?1",
            args![op_id, state.as_str(), error, ms(now)],
        )
    }

    /// Records an error on a still-pending intent.
    pub fn intent_error(
        &self,
        op_id: &str,
        error: &str,
        now: SystemTime,
    ) -> Result<(), StateError> {
        self.count_refinish(op_id)?;
        self.exec(
            "UPDATE intents SET last_error = ?2, updated_ms = ?3 WHERE op_id = ?1",
            args![op_id, error, ms(now)],
        )
    }

    /// A managed resource left Git: keep its last declaration until the
    /// provider confirms the outcome.
    pub fn add_tombstone(
        &self,
        name: &str,
        manifest: &Value,
        now: SystemTime,
        commit: &str,
    ) -> Result<(), StateError> {
        self.exec(
            "INSERT INTO tombstones (name, manifest, removed_ms, removal_commit) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            args![name, manifest.to_string(), ms(now), commit],
        )
    }

    /// A declaration came back: its tombstone, and what the deletion guard
    /// remembered of it, go.
    pub fn remove_tombstone(&self, name: &str) -> Result<(), StateError> {
        for table in ["tombstones", "deletion_holds", "deletion_approvals"] {
            self.exec(&format!("DELETE FROM {table} WHERE name = ?1"), args![name])?;
        }
        Ok(())
    }

    /// A deletion was requested (first time kept) or failed (`error`).
    pub fn tombstone_progress(
        &self,
        name: &str,
        requested: SystemTime,
        error: Option<&str>,
    ) -> Result<(), StateError> {
        self.exec(
            "UPDATE tombstones SET delete_requested_ms = coalesce(delete_requested_ms, ?2), last_error = ?3 WHERE name = ?1",
            args![name, ms(requested), error],
        )
    }

    /// The outcome of a removal is confirmed: forget the resource (its
    /// journal and generation counts stay: a declaration of the same name
    /// later must not reuse an operation id).
    pub fn forget(&self, name: &str) -> Result<(), StateError> {
        for table in [
            "tombstones",
            "resources",
            "drift_seen",
            "attempts",
            "override_seen",
            "deletion_holds",
            "deletion_approvals",
            "failures",
        ] {
            self.exec(&format!("DELETE FROM {table} WHERE name = ?1"), args![name])?;
        }
        Ok(())
    }

    /// The provider refused an operation on `name` for good.
    pub fn record_failure(
        &self,
        name: &str,
        failure: &crate::engine::OperationFailure,
    ) -> Result<(), StateError> {
        self.exec(
            "INSERT INTO failures (name, op_id, kind, spec_hash, observed, message, failed_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (name) DO UPDATE SET op_id = excluded.op_id, kind = excluded.kind, \
             spec_hash = excluded.spec_hash, observed = excluded.observed, \
             message = excluded.message, failed_ms = excluded.failed_ms",
            args![
                name,
                failure.operation_id.as_str(),
                failure.kind.as_str(),
                failure.spec_hash.to_string(),
                failure.observed.as_str(),
                failure.message.as_str(),
                ms(failure.at)
            ],
        )
    }

    /// Forgets the refused operation of `name`: it may be sent again.
    pub fn clear_failure(&self, name: &str) -> Result<bool, StateError> {
        Ok(self.count("DELETE FROM failures WHERE name = ?1", args![name])? > 0)
    }

    /// Records when an override of `name` from `source` with this content
    /// was first seen (replacing an older content's record).
    pub fn override_seen(
        &self,
        name: &str,
        source: &str,
        fingerprint: &str,
        first_seen: SystemTime,
    ) -> Result<(), StateError> {
        self.exec(
            "INSERT INTO override_seen (name, source, fingerprint, first_seen_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(name, source) DO UPDATE SET fingerprint = excluded.fingerprint, first_seen_ms = excluded.first_seen_ms",
            args![name, source, fingerprint, ms(first_seen)],
        )
    }

    /// Remembers that the guard holds exactly these deletions.
    pub fn hold_deletions(&self, names: &[String], hold: HeldDeletion) -> Result<(), StateError> {
        self.exec("DELETE FROM deletion_holds", &[])?;
        for name in names {
            self.exec(
                "INSERT INTO deletion_holds (name, since_ms, due_together) VALUES (?1, ?2, ?3)
                 ON CONFLICT(name) DO UPDATE SET since_ms = excluded.since_ms, due_together = excluded.due_together",
                args![name, ms(hold.since), i64::try_from(hold.due_together).unwrap_or(i64::MAX)],
            )?;
        }
        Ok(())
    }

    /// The guard no longer holds anything.
    pub fn release_deletions(&self) -> Result<(), StateError> {
        self.exec("DELETE FROM deletion_holds", &[])
    }

    /// The first column of every row, as text (one parameter).
    fn strings(&self, sql: &str, name: &str) -> Result<Vec<String>, StateError> {
        self.query(sql, args![name])?
            .iter()
            .map(|r| r.get(0))
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))
    }
}

impl Committer for StateStore {
    /// A transaction that held a change moves the store's freshness.
    fn committed(&self, changed: bool) {
        if changed {
            self.wrote();
        }
    }

    fn error(&self, e: SqlError) -> StateError {
        self.err(e)
    }
}
