//! What the status step keeps in the state: each resource's last
//! finished operation and the commit its status file was decided from
//! (the status branch shows both), and the notifications.

use std::collections::HashMap;
use std::time::SystemTime;

use super::sql::args;
use super::{StateStore, time};
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
    /// How many operations have finished and when the newest did: it
    /// moves whenever one finishes (a cheap stand-in for every last
    /// operation).
    pub fn finished_operations_mark(&self) -> Result<(i64, i64), StateError> {
        Ok(self
            .map_rows(
                "SELECT count(*), coalesce(max(updated_ms), 0) FROM intents WHERE state IN ('done', 'failed')",
                &[],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .first()
            .copied()
            .unwrap_or((0, 0)))
    }

    /// The newest finished (done or failed) operation of every resource
    /// that has one.
    pub fn last_operations(&self) -> Result<HashMap<String, LastOperation>, StateError> {
        let rows = self.map_rows(
            "SELECT i.name, i.op_id, i.kind, i.state, i.last_error, i.updated_ms FROM intents i \
             JOIN (SELECT name, MAX(updated_ms) AS newest FROM intents \
                   WHERE state IN ('done', 'failed') GROUP BY name) n \
             ON n.name = i.name AND n.newest = i.updated_ms \
             WHERE i.state IN ('done', 'failed') ORDER BY i.op_id",
            &[],
            |r| {
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
            },
        )?;
        let mut out = HashMap::new();
        for (name, op) in rows {
            // Two finished in the same millisecond: one, always the same.
            out.entry(name).or_insert(op);
        }
        Ok(out)
    }
}

/// Where each status file's `decidedFrom` comes from: by resource, the
/// digest of what the file says and the source commit it was first said
/// at.
pub(crate) type DecidedFrom = HashMap<String, (String, String)>;

impl StateStore {
    /// Every resource's status digest and the commit it was decided from.
    /// A state written before format 6 has none (every file is decided
    /// from the current commit once).
    pub fn status_decided(&self) -> Result<DecidedFrom, StateError> {
        if !self.has_table("status_decided")? {
            return Ok(Default::default());
        }
        Ok(self
            .map_rows(
                "SELECT name, digest, commit_id FROM status_decided",
                &[],
                |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))),
            )?
            .into_iter()
            .collect())
    }

    /// Replaces the status digests with `current` (resources not in it
    /// are forgotten), writing only the rows that changed.
    pub fn record_status_decided(
        &self,
        previous: &DecidedFrom,
        current: &DecidedFrom,
    ) -> Result<(), StateError> {
        if previous == current {
            return Ok(());
        }
        self.write(|tx| {
            for name in previous.keys().filter(|n| !current.contains_key(*n)) {
                tx.exec(
                    "DELETE FROM status_decided WHERE name = ?1",
                    args![name],
                )?;
            }
            for (name, (digest, commit)) in current {
                if previous.get(name) != Some(&(digest.clone(), commit.clone())) {
                    tx.exec(
                        "INSERT INTO status_decided (name, digest, commit_id) VALUES (?1, ?2, ?3) \
                         ON CONFLICT (name) DO UPDATE SET digest = excluded.digest, commit_id = excluded.commit_id",
                        args![name, digest, commit],
                    )?;
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
        self.write(|tx| {
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
        self.write(|tx| tx.exec("DELETE FROM notify_outbox WHERE id = ?1", args![id]))
    }

    /// A delivery failed: tried again at `next`.
    pub fn notification_failed(
        &self,
        id: i64,
        error: &str,
        next: SystemTime,
    ) -> Result<(), StateError> {
        self.write(|tx| {
            tx.exec(
                "UPDATE notify_outbox SET attempts = attempts + 1, last_error = ?2, next_ms = ?3 WHERE id = ?1",
                args![id, error, super::ms(next)],
            )
        })
    }
}
