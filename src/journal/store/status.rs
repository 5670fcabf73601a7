//! What the status step keeps in the state: each resource's last
//! finished operation and the commit its status file was decided from
//! (the status branch shows both), and the notifications.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::time::SystemTime;

use super::read::SharedStrings;
use super::sql::args;
use super::{StateStore, ms, time};
use crate::journal::StateError;

/// The newest finished operation of a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastOperation {
    pub id: String,
    pub kind: String,
    /// `done` or `failed`.
    pub result: String,
    /// Why it failed (or the last error before it succeeded).
    pub error: Option<String>,
    pub finished_at: SystemTime,
}

impl StateStore {
    /// The newest finished (done or failed) operation of every resource
    /// that has one (of two finished in the same millisecond, the lower
    /// id: always the same one).
    ///
    /// The status writer reads these by name ([`Self::last_operations_of`],
    /// along its render) or since a mark ([`Self::last_operations_since`]),
    /// never all at once: this whole read is the reference those are
    /// checked against in tests (at 100,000 resources it held tens of
    /// megabytes at the running agent's peak). Every finished row is read
    /// and the newest kept here.
    pub fn last_operations(&self) -> Result<HashMap<String, LastOperation>, StateError> {
        let rows = self.map_rows(
            "SELECT name, op_id, kind, state, last_error, updated_ms FROM intents \
             WHERE state IN ('done', 'failed')",
            &[],
            finished_row,
        )?;
        let mut out: HashMap<String, LastOperation> = HashMap::with_capacity(rows.len());
        for (name, op) in rows {
            keep_newest(&mut out, name, op);
        }
        Ok(out)
    }

    /// [`Self::last_operations`] of `names` alone (by the journal's index
    /// on names, a query for each hundred): the few resources a status
    /// commit over a known render renders, or a whole render's, a
    /// thousand at a time.
    pub fn last_operations_of(
        &self,
        names: &[&str],
    ) -> Result<HashMap<String, LastOperation>, StateError> {
        let mut out = HashMap::with_capacity(names.len());
        self.each_of_names(
            names,
            |names_in| {
                format!(
                    "SELECT name, op_id, kind, state, last_error, updated_ms FROM intents \
                     WHERE name IN ({names_in}) AND state IN ('done', 'failed')"
                )
            },
            &mut |r| {
                let (name, op) = finished_row(r)?;
                keep_newest(&mut out, name, op);
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// Calls `f` with each row of the query `sql` makes of a list of
    /// placeholders, for each hundred of `names` (by the index on names).
    fn each_of_names(
        &self,
        names: &[&str],
        sql: impl Fn(&str) -> String,
        f: &mut dyn FnMut(&super::sql::Row) -> Result<(), super::sql::SqlError>,
    ) -> Result<(), StateError> {
        for chunk in names.chunks(100) {
            let sql = sql(&super::sql::placeholders(chunk.len()));
            let args: Vec<super::sql::SqlValue> = chunk
                .iter()
                .map(|&name| super::sql::SqlValue::from(name))
                .collect();
            self.conn().each(&sql, &args, f).map_err(|e| self.err(e))?;
        }
        Ok(())
    }
}

/// Keeps `op` as `name`'s last operation if it is newer than the one
/// kept (of two finished in the same millisecond, the lower id: always the
/// same one).
/// `t` as the state keeps the time an operation finished: to the
/// millisecond below.
pub(crate) fn as_kept(t: SystemTime) -> SystemTime {
    time(ms(t))
}

fn keep_newest(out: &mut HashMap<String, LastOperation>, name: String, op: LastOperation) {
    match out.entry(name) {
        Entry::Occupied(mut kept) => {
            let newer = (op.finished_at, std::cmp::Reverse(&op.id))
                > (kept.get().finished_at, std::cmp::Reverse(&kept.get().id));
            if newer {
                kept.insert(op);
            }
        }
        Entry::Vacant(slot) => {
            slot.insert(op);
        }
    }
}

pub(super) fn finished_row(
    r: &super::sql::Row,
) -> Result<(String, LastOperation), super::sql::SqlError> {
    Ok((
        r.get::<String>(0)?,
        LastOperation {
            id: r.get(1)?,
            kind: r.get(2)?,
            result: r.get(3)?,
            error: r.get(4)?,
            finished_at: time(r.get(5)?),
        },
    ))
}

/// Where each status file's `decidedFrom` comes from, by resource.
pub(crate) type DecidedFrom = HashMap<String, DecidedAt>;

/// Where one status file's `decidedFrom` comes from: the SHA-256 of what
/// the file says, and the source commit it was first said at.
///
/// The digest is kept as its 32 bytes and the commit id is shared: the
/// running agent keeps one of these per resource between commits, and a
/// fleet decided at one commit names it once (at 100,000 resources, two
/// strings each came to about 13 MB more). The state stores both as hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidedAt {
    pub digest: [u8; 32],
    pub commit: Arc<str>,
}

impl DecidedAt {
    /// The digest as the state stores it: lowercase hex.
    pub fn digest_hex(&self) -> String {
        crate::model::hash::hex(&self.digest)
    }
}

/// A `status_decided` row (name, digest, commit) into `decided`, its
/// digest and commit borrowed from the row (a one-shot's status commit may
/// read every resource's).
fn decided_row(
    r: &super::sql::Row,
    commits: &mut SharedStrings,
    decided: &mut DecidedFrom,
) -> Result<(), super::sql::SqlError> {
    let digest = crate::model::hash::bytes_of_hex(r.text(1)?).unwrap_or(NO_FILE_DIGEST);
    let commit = commits.share(r.text(2)?);
    decided.insert(r.get(0)?, DecidedAt { digest, commit });
    Ok(())
}

/// What an unreadable digest reads as: no file's (a SHA-256 of all zeros
/// is not known to exist).
const NO_FILE_DIGEST: [u8; 32] = [0; 32];

impl StateStore {
    /// Every resource's status digest and the commit it was decided from.
    /// A state written before format 6 has none (every file is decided
    /// from the current commit once).
    ///
    /// A row whose digest is not a SHA-256 in hex reads as a digest no file
    /// has: its file is decided again, from the commit the next render is
    /// made at, and the row is forgotten like any other once its resource
    /// is gone.
    pub fn status_decided(&self) -> Result<DecidedFrom, StateError> {
        if !self.has_table("status_decided")? {
            return Ok(Default::default());
        }
        let (mut decided, mut commits) = (HashMap::new(), SharedStrings::default());
        self.conn()
            .each(
                "SELECT name, digest, commit_id FROM status_decided",
                &[],
                &mut |r| decided_row(r, &mut commits, &mut decided),
            )
            .map_err(|e| self.err(e))?;
        Ok(decided)
    }

    /// [`Self::status_decided`] of the resources `names` alone (those a
    /// status commit renders), a hundred a query.
    pub fn status_decided_of(&self, names: &[&str]) -> Result<DecidedFrom, StateError> {
        let mut decided = HashMap::with_capacity(names.len());
        if names.is_empty() || !self.has_table("status_decided")? {
            return Ok(decided);
        }
        let mut commits = SharedStrings::default();
        self.each_of_names(
            names,
            |names_in| {
                format!(
                    "SELECT name, digest, commit_id FROM status_decided WHERE name IN ({names_in})"
                )
            },
            &mut |r| decided_row(r, &mut commits, &mut decided),
        )?;
        Ok(decided)
    }

    /// Replaces the status digests with `current` (resources not in it
    /// are forgotten), writing only the rows that changed.
    pub fn record_status_decided(
        &self,
        changes: &[(String, Option<DecidedAt>)],
    ) -> Result<(), StateError> {
        if changes.is_empty() {
            return Ok(());
        }
        self.write_aside(|tx| {
            for (name, now) in changes {
                match now {
                    None => tx.exec(
                        "DELETE FROM status_decided WHERE name = ?1",
                        args![name],
                    )?,
                    Some(at) => tx.exec(
                        "INSERT INTO status_decided (name, digest, commit_id) VALUES (?1, ?2, ?3) \
                         ON CONFLICT (name) DO UPDATE SET digest = excluded.digest, commit_id = excluded.commit_id",
                        args![name, at.digest_hex(), &*at.commit],
                    )?,
                }
            }
            Ok(())
        })
    }
}

/// A notification not delivered yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingNotification {
    pub id: i64,
    pub receiver: String,
    pub event: String,
    /// The resource, or `""` for the source.
    pub subject: String,
    /// The body as it will be sent (formatted for its receiver).
    pub body: String,
    pub attempts: u32,
    pub created_at: SystemTime,
}

/// The event a commit status is queued under: the newest supersedes one
/// still waiting for the same receiver.
pub(crate) const COMMIT_STATUS_EVENT: &str = "commit-status";

/// The prefix of a resolved alert's event (`resolved:drift-detected`):
/// queuing one drops the firing alert of the same receiver, subject and
/// event still waiting.
pub(crate) const RESOLVED_PREFIX: &str = "resolved:";

/// A notification to queue: receiver, event, subject, body.
pub(crate) type QueuedNotification = (String, String, String, String);

impl StateStore {
    /// The conditions last notified, as `(subject, condition)`. A state
    /// written before notifications existed has none.
    pub fn notify_conditions(
        &self,
    ) -> Result<std::collections::BTreeSet<(String, String)>, StateError> {
        if !self.has_table("notify_conditions")? {
            return Ok(Default::default());
        }
        Ok(self
            .map_rows(
                "SELECT subject, condition FROM notify_conditions",
                &[],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .into_iter()
            .collect())
    }

    /// Remembers `current` as the conditions notified and queues
    /// `notifications`, in one transaction: a crash loses neither, and a
    /// restart does not send them again.
    ///
    /// `marks` are what each commit-status receiver was now sent; a
    /// commit status queued supersedes the one still waiting for the same
    /// receiver (only the newest state is worth sending).
    pub fn record_notifications(
        &self,
        current: &std::collections::BTreeSet<(String, String)>,
        notifications: &[QueuedNotification],
        marks: &[(String, String)],
        now: SystemTime,
    ) -> Result<(), StateError> {
        let now = super::ms(now);
        let previous = self.notify_conditions()?;
        self.write_aside(|tx| {
            for (subject, condition) in previous.difference(current) {
                tx.exec(
                    "DELETE FROM notify_conditions WHERE subject = ?1 AND condition = ?2",
                    args![subject, condition],
                )?;
            }
            for (subject, condition) in current {
                tx.exec(
                    "INSERT INTO notify_conditions (subject, condition, since_ms) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                    args![subject, condition, now],
                )?;
            }
            for (receiver, mark) in marks {
                tx.exec(
                    "INSERT INTO notify_marks (receiver, mark) VALUES (?1, ?2) \
                     ON CONFLICT (receiver) DO UPDATE SET mark = excluded.mark",
                    args![receiver, mark],
                )?;
            }
            for (receiver, event, subject, body) in notifications {
                if let Some(firing) = event.strip_prefix(RESOLVED_PREFIX) {
                    tx.exec(
                        "DELETE FROM notify_outbox WHERE receiver = ?1 AND event = ?2 AND subject = ?3",
                        args![receiver, firing, subject],
                    )?;
                }
                if event == COMMIT_STATUS_EVENT {
                    // The newest state of the same commit replaces one still
                    // waiting; another commit keeps its own last word.
                    tx.exec(
                        "DELETE FROM notify_outbox WHERE receiver = ?1 AND event = ?2 AND subject = ?3",
                        args![receiver, event, subject],
                    )?;
                }
                tx.exec(
                    "INSERT INTO notify_outbox (receiver, event, subject, body, next_ms, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                    args![receiver, event, subject, body, now],
                )?;
            }
            Ok(())
        })
    }

    /// What each commit-status receiver was last sent (format 8).
    pub fn notify_marks(&self) -> Result<std::collections::HashMap<String, String>, StateError> {
        if !self.has_table("notify_marks")? {
            return Ok(Default::default());
        }
        Ok(self
            .map_rows("SELECT receiver, mark FROM notify_marks", &[], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .into_iter()
            .collect())
    }

    /// Notifications due for delivery at `now`, oldest first.
    pub fn due_notifications(
        &self,
        now: SystemTime,
        limit: usize,
    ) -> Result<Vec<PendingNotification>, StateError> {
        if !self.has_table("notify_outbox")? {
            return Ok(Vec::new());
        }
        self.map_rows(
            "SELECT id, receiver, event, subject, body, attempts, created_ms FROM notify_outbox \
             WHERE next_ms <= ?1 ORDER BY id LIMIT ?2",
            args![super::ms(now), limit],
            |r| {
                Ok(PendingNotification {
                    id: r.get(0)?,
                    receiver: r.get(1)?,
                    event: r.get(2)?,
                    subject: r.get(3)?,
                    body: r.get(4)?,
                    attempts: r.get(5)?,
                    created_at: time(r.get(6)?),
                })
            },
        )
    }

    /// When the next queued notification falls due, if any is queued.
    pub fn next_notification_due(&self) -> Result<Option<SystemTime>, StateError> {
        if !self.has_table("notify_outbox")? {
            return Ok(None);
        }
        Ok(self
            .map_rows("SELECT min(next_ms) FROM notify_outbox", &[], |r| {
                r.get::<Option<i64>>(0)
            })?
            .first()
            .copied()
            .flatten()
            .map(time))
    }

    /// A notification was delivered (or given up): it leaves the queue.
    pub fn notification_done(&self, id: i64) -> Result<(), StateError> {
        self.write_aside(|tx| tx.exec("DELETE FROM notify_outbox WHERE id = ?1", args![id]))
    }

    /// A delivery failed: tried again at `next`.
    pub fn notification_failed(
        &self,
        id: i64,
        error: &str,
        next: SystemTime,
    ) -> Result<(), StateError> {
        self.write_aside(|tx| {
            tx.exec(
                "UPDATE notify_outbox SET attempts = attempts + 1, last_error = ?2, next_ms = ?3 WHERE id = ?1",
                args![id, error, super::ms(next)],
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::FinishedMark;
    use crate::journal::IntentState;
    use crate::model::SpecHash;
    use std::collections::{BTreeSet, HashSet};
    use std::time::{Duration, UNIX_EPOCH};

    type Outcome = Result<(), Box<dyn std::error::Error>>;

    /// Journals `op` for `name` and finishes it at `ms`.
    fn finished(store: &StateStore, op: &str, name: &str, ms: u64) -> Outcome {
        let at = UNIX_EPOCH + Duration::from_millis(ms);
        let hash = SpecHash::from("h");
        store.begin_intent(op, name, "update", &hash, 1, &serde_json::json!({}), at)?;
        store.finish_intent(op, IntentState::Done, None, at)?;
        Ok(())
    }

    /// The last operations since `then`, checked against a whole read of
    /// the same resources, and which changed (`None`: every resource's is
    /// to be read, nothing was).
    fn same_as_whole(
        store: &StateStore,
        then: FinishedMark,
    ) -> Result<Option<Vec<String>>, Box<dyn std::error::Error>> {
        let now = store.finished_operations_mark()?;
        let Some((read, changed)) = store.last_operations_since(then, now)? else {
            return Ok(None);
        };
        let whole = store.last_operations()?;
        for (name, op) in &read {
            assert_eq!(Some(op), whole.get(name), "{name}");
        }
        let mut changed: Vec<String> = changed.into_iter().collect();
        changed.sort();
        Ok(Some(changed))
    }

    #[test]
    fn last_operations_since_a_mark_are_what_a_whole_read_gives() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        let names = |names: &[&str]| Some(names.iter().map(|n| n.to_string()).collect());
        // (Times from 100 s: the window before a mark is 10 s.)
        finished(&store, "op-1", "orders", 100_000)?;
        finished(&store, "op-2", "billing", 100_000)?;
        let mark = store.finished_operations_mark()?;
        assert_eq!(same_as_whole(&store, mark)?, Some(vec![]));
        // Newer, and two in the same millisecond (the lower id is the one).
        finished(&store, "op-4", "orders", 102_000)?;
        finished(&store, "op-3", "orders", 102_000)?;
        // (billing finished in the mark's own millisecond, counted by it:
        // the two newer ones are every operation counted since, so they
        // alone changed, and the window is not read.)
        assert_eq!(same_as_whole(&store, mark)?, names(&["orders"]));
        assert_eq!(store.last_operations()?["orders"].id, "op-3");
        // Finished in the mark's own millisecond after it (a cold start
        // finishes many to a millisecond), or stamped before the mark and
        // written after it (within the window): told apart, and changed.
        let mark = store.finished_operations_mark()?;
        finished(&store, "op-6", "ledger", 102_000)?;
        finished(&store, "op-7", "audit", 102_000)?;
        finished(&store, "op-8", "cache", 95_000)?;
        assert_eq!(
            same_as_whole(&store, mark)?,
            names(&["audit", "billing", "cache", "ledger", "orders"])
        );
        // Finished before the window (a clock stepped back): read whole.
        let mark = store.finished_operations_mark()?;
        finished(&store, "op-0", "ledger", 50_000)?;
        assert_eq!(same_as_whole(&store, mark)?, None);
        // Pruned beside a newer one: the count takes in what was pruned,
        // so what finished since is still read alone, and is right.
        let mark = store.finished_operations_mark()?;
        finished(&store, "op-5", "orders", 103_000)?;
        assert!(store.prune_journal(UNIX_EPOCH + Duration::from_millis(200_000), 1)? > 0);
        // (The newer one is every operation counted since: it alone.)
        assert_eq!(same_as_whole(&store, mark)?, names(&["orders"]));
        Ok(())
    }

    /// A failed operation begun again under its id and finished again (a
    /// retry) moves its row later while the finished rows stay as many:
    /// each change to a finished row is counted, so a retry never stands
    /// in for an operation finished since and not read (stamped before
    /// the window, or with a clock stepped back). Such a retry is not told
    /// apart from the rest (`None`: every last operation is read), whether
    /// it began before the mark or after it; uncounted, each case below
    /// gave a `Some` without the late operation.
    #[test]
    fn an_operation_finished_again_hides_none() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        let (hash, json) = (SpecHash::from("h"), serde_json::json!({}));
        let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        let (begin, finish) = (&StateStore::begin_intent, &StateStore::finish_intent);
        for (op, name, ms) in [("op-2", "billing", 50_000), ("op-8", "queue", 20_000)] {
            begin(&store, op, name, "update", &hash, 1, &json, at(ms))?;
            finish(&store, op, IntentState::Failed, Some("refused"), at(ms))?;
        }
        finished(&store, "op-1", "orders", 100_000)?;
        // Begun and finished again after the mark, beside one stamped
        // long before.
        let mark = store.finished_operations_mark()?;
        finished(&store, "op-3", "late", 10_000)?;
        begin(
            &store,
            "op-2",
            "billing",
            "update",
            &hash,
            1,
            &json,
            at(130_000),
        )?;
        finish(&store, "op-2", IntentState::Done, None, at(130_000))?;
        assert_eq!(same_as_whole(&store, mark)?, None, "late would go unseen");
        assert_eq!(store.last_operations()?["billing"].result, "done");
        // Begun again before the mark and finished after it.
        begin(
            &store,
            "op-8",
            "queue",
            "update",
            &hash,
            1,
            &json,
            at(140_000),
        )?;
        let mark = store.finished_operations_mark()?;
        finished(&store, "op-4", "later", 20_000)?;
        finish(&store, "op-8", IntentState::Done, None, at(150_000))?;
        assert_eq!(same_as_whole(&store, mark)?, None, "later would go unseen");
        // An error noted on a finished row is counted too.
        let mark = store.finished_operations_mark()?;
        finished(&store, "op-5", "last", 30_000)?;
        store.intent_error("op-8", "refused again", at(160_000))?;
        assert_eq!(same_as_whole(&store, mark)?, None, "last would go unseen");
        Ok(())
    }

    /// A prune never changes a resource's last operation (the mark does
    /// not see it): of two finished in one millisecond, the one the read
    /// gives (the lower id) is kept, and a newer pending intent does not
    /// push the last finished one out.
    #[test]
    fn a_prune_keeps_every_last_operation() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        finished(&store, "op-1", "orders", 1_000)?;
        finished(&store, "op-2", "orders", 1_000)?;
        finished(&store, "op-3", "billing", 1_000)?;
        let at = UNIX_EPOCH + Duration::from_millis(2_000);
        let (hash, json) = (SpecHash::from("h"), serde_json::json!({}));
        store.begin_intent("op-4", "billing", "update", &hash, 2, &json, at)?;
        let before = store.last_operations()?;
        assert_eq!(before["orders"].id, "op-1");
        let pruned = store.prune_journal(UNIX_EPOCH + Duration::from_millis(10_000), 1)?;
        assert_eq!(pruned, 1, "orders' op-2");
        assert_eq!(store.last_operations()?, before);
        Ok(())
    }

    /// Operations finished after the caller took its mark and before the
    /// rows are read (a cold start finishes hundreds a second): the rows
    /// are counted as they are read, and told apart.
    #[test]
    fn operations_finished_while_the_caller_reads_are_told_apart() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        finished(&store, "op-1", "orders", 100_000)?;
        let then = store.finished_operations_mark()?;
        finished(&store, "op-2", "billing", 100_000)?;
        let now = store.finished_operations_mark()?;
        finished(&store, "op-3", "ledger", 100_000)?;
        let (read, changed) = store
            .last_operations_since(then, now)?
            .ok_or("not told apart")?;
        let changed: BTreeSet<String> = changed.into_iter().collect();
        assert_eq!(
            changed,
            ["billing", "ledger", "orders"].map(String::from).into()
        );
        assert_eq!(read["ledger"].id, "op-3");
        Ok(())
    }

    /// The mark is counted once per state: asked again with nothing
    /// written, it is the same; an operation finished by another process
    /// (another connection to the file) moves it at once.
    #[test]
    fn the_mark_is_kept_while_nothing_is_written_and_moves_with_anothers_write() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        finished(&store, "op-1", "orders", 1_000)?;
        let mark = store.finished_operations_mark()?;
        let at = |count, newest_ms, recent| FinishedMark {
            count,
            newest_ms,
            recent,
        };
        assert_eq!(mark, at(1, 1_000, 1));
        assert_eq!(store.finished_operations_mark()?, mark);
        let other = StateStore::open(dir.path(), true)?.ok_or("no second state store")?;
        finished(&other, "op-2", "billing", 2_000)?;
        assert_eq!(store.finished_operations_mark()?, at(2, 2_000, 2));
        // Behind tend's back (a raw connection, as an older binary).
        let raw = rusqlite::Connection::open(dir.path().join("state.db"))?;
        raw.execute(
            "UPDATE intents SET updated_ms = 3000 WHERE op_id = 'op-2'",
            [],
        )?;
        assert_eq!(store.finished_operations_mark()?, at(2, 3_000, 2));
        // This store's own write.
        finished(&store, "op-3", "ledger", 4_000)?;
        assert_eq!(store.finished_operations_mark()?, at(3, 4_000, 3));
        Ok(())
    }

    /// A prune beside an operation finished in the mark's own millisecond
    /// left the mark as it was: the operation went unseen.
    #[test]
    fn an_operation_finished_beside_a_prune_is_not_missed() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        finished(&store, "op-1", "orders", 1_000)?;
        finished(&store, "op-2", "orders", 1_500)?;
        finished(&store, "op-3", "billing", 2_000)?;
        let mark = store.finished_operations_mark()?;
        // orders' older operation is pruned; ledger's finishes in the
        // mark's millisecond.
        assert_eq!(
            store.prune_journal(UNIX_EPOCH + Duration::from_millis(1_800), 1)?,
            1
        );
        finished(&store, "op-4", "ledger", 2_000)?;
        let changed = same_as_whole(&store, mark)?;
        assert!(
            changed
                .as_ref()
                .is_none_or(|c| c.contains(&"ledger".to_string())),
            "{changed:?}"
        );
        Ok(())
    }

    #[test]
    fn since_a_mark_only_what_finished_after_it_is_read_and_the_rest_by_name() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        finished(&store, "op-1", "orders", 1_000)?;
        finished(&store, "op-2", "billing", 1_000)?;
        finished(&store, "op-3", "ledger", 20_000)?;
        let mark = store.finished_operations_mark()?;
        let (none, changed) = store
            .last_operations_since(mark, mark)?
            .ok_or("nothing finished: told apart")?;
        assert!(none.is_empty());
        assert_eq!(changed, HashSet::new(), "nothing finished since");
        finished(&store, "op-5", "orders", 21_000)?;
        finished(&store, "op-4", "orders", 21_000)?;
        let now = store.finished_operations_mark()?;
        let (newer, changed) = store
            .last_operations_since(mark, now)?
            .ok_or("newer operations: told apart")?;
        // The two after the mark's millisecond are every one counted
        // since: they alone are read. ledger finished in the mark's own
        // millisecond (counted by it) and billing 19 s before.
        let changed: BTreeSet<String> = changed.into_iter().collect();
        assert_eq!(changed, ["orders"].map(String::from).into());
        let read: Vec<&String> = newer.keys().collect();
        assert_eq!(read, ["orders"]);
        assert_eq!(
            newer["orders"].id, "op-4",
            "the lower id of one millisecond"
        );
        // The others by name, as the whole read gives them.
        let whole = store.last_operations()?;
        let named = store.last_operations_of(&["billing", "orders", "unknown"])?;
        assert_eq!(named.len(), 2);
        assert_eq!(named["billing"], whole["billing"]);
        assert_eq!(named["orders"], whole["orders"]);
        let many: Vec<String> = (0..250).map(|i| format!("db-{i}")).collect();
        for (i, name) in many.iter().enumerate() {
            finished(&store, &format!("many-{i}"), name, 3_000)?;
        }
        let names: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(store.last_operations_of(&names)?.len(), 250, "in chunks");
        Ok(())
    }

    #[test]
    fn decided_from_reads_back_as_written_and_shares_each_commit() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        let at = |byte: u8, commit: &str| DecidedAt {
            digest: [byte; 32],
            commit: commit.into(),
        };
        let expected: DecidedFrom = [
            ("billing", at(1, "c0ffee")),
            ("ledger", at(2, "decade")),
            ("orders", at(0xab, "c0ffee")),
        ]
        .into_iter()
        .map(|(name, at)| (name.to_string(), at))
        .collect();
        let written: Vec<_> = expected
            .iter()
            .map(|(name, at)| (name.clone(), Some(at.clone())))
            .collect();
        store.record_status_decided(&written)?;
        let read = store.status_decided()?;
        assert_eq!(read, expected);
        // By name: those named alone, an unknown name left out.
        let named = store.status_decided_of(&["orders", "ledger", "unknown"])?;
        let mut names: Vec<&String> = named.keys().collect();
        names.sort();
        assert_eq!(names, ["ledger", "orders"]);
        assert_eq!(named["orders"], expected["orders"]);
        assert!(store.status_decided_of(&[])?.is_empty());
        assert_eq!(read["orders"].digest_hex(), "ab".repeat(32));
        assert!(
            Arc::ptr_eq(&read["billing"].commit, &read["orders"].commit),
            "one commit id for the files decided at it"
        );
        // Forgotten, and a row whose digest is not hex read as no file's
        // (decided again at the next render, forgotten when it goes).
        store.record_status_decided(&[("ledger".to_string(), None)])?;
        store.write_aside(|tx| {
            tx.exec(
                "UPDATE status_decided SET digest = 'not hex' WHERE name = ?1",
                args!["billing"],
            )
        })?;
        let read = store.status_decided()?;
        let mut names: Vec<&String> = read.keys().collect();
        names.sort();
        assert_eq!(names, ["billing", "orders"]);
        assert_eq!(read["billing"].digest, NO_FILE_DIGEST);
        assert_eq!(read["orders"].digest, [0xab; 32]);
        Ok(())
    }
}
