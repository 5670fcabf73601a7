//! The finished-operations mark: how the status writer knows, between
//! two renders, which resources' last operations changed, and reads
//! those alone.

use std::collections::{HashMap, HashSet};

use super::sql::args;
use super::status::{LastOperation, finished_row};
use super::{StateStore, time};
use crate::journal::StateError;

/// How many operations have finished, when the newest did and how many
/// finished in the [`RECENT_MS`] before it: it moves whenever one
/// finishes (a cheap stand-in for every last operation), and over an
/// earlier mark it tells whether what finished since can be read alone
/// ([`StateStore::last_operations_since`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FinishedMark {
    /// Operations finished, those pruned from the journal since included,
    /// and each finished again (begun again once finished) counted again.
    pub count: i64,
    /// When the newest finished (milliseconds since the epoch; 0: none).
    pub newest_ms: i64,
    /// How many of the journal's finished operations finished in the
    /// [`RECENT_MS`] up to `newest_ms`.
    pub recent: i64,
}

/// How far before a mark's newest operation the operations finished since
/// it are looked for. An operation is stamped when its result is
/// confirmed and written to the journal after: with hundreds confirmed at
/// once (a cold start), one stamped before the mark is often written
/// after it. Those stamped this long before are not told apart from the
/// rest (every last operation is read then).
pub(crate) const RECENT_MS: i64 = 10_000;

/// The `meta` key counting the changes to intents already finished (a
/// failed operation retried under its id: begun again, finished again):
/// each moves its row to a later time without the count of finished rows
/// moving ([`StateStore`]'s `count_refinish`).
pub(crate) const REFINISHED: &str = "refinished";

impl StateStore {
    /// The state's [`FinishedMark`]. The count takes in the operations
    /// pruned from the journal (`pruned_generations`), so a prune does not lower it: a
    /// prune and an operation finished beside it would otherwise leave the
    /// count where it was, and an operation finished in the newest
    /// millisecond (or with an older time) would go unseen.
    ///
    /// Counted again only when the state has changed since the last count
    /// (its [`Freshness`](super::Freshness), taken before the count: a
    /// write that commits between the two moves it, and the next call
    /// counts again). Every finished operation is a counted write, and the
    /// count walks every finished row: 100,000 of them took about 9 ms at
    /// each status publication of a running agent that had written
    /// nothing.
    pub fn finished_operations_mark(&self) -> Result<FinishedMark, StateError> {
        let freshness = self.freshness()?;
        let mut last = self.finished_mark.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, mark)) = *last
            && at == freshness
        {
            return Ok(mark);
        }
        let mark = self.count_finished_operations()?;
        *last = Some((freshness, mark));
        Ok(mark)
    }

    fn count_finished_operations(&self) -> Result<FinishedMark, StateError> {
        let sql = format!("SELECT {}", self.mark_columns()?);
        Ok(self
            .map_rows(&sql, &[], |r| mark_at(r, 0))?
            .first()
            .copied()
            .unwrap_or_default())
    }

    /// The [`FinishedMark`]'s three columns, as scalar subqueries: in one
    /// statement, of one snapshot of the journal (with the rows it reads).
    fn mark_columns(&self) -> Result<String, StateError> {
        const FINISHED: &str = "FROM intents WHERE state IN ('done', 'failed')";
        let pruned = if self.has_table("pruned_generations")? {
            " + CAST(coalesce((SELECT sum(count) FROM pruned_generations), 0) AS BIGINT)"
        } else {
            ""
        };
        Ok(format!(
            "(SELECT count(*) {FINISHED}){pruned} \
               + coalesce((SELECT CAST(value AS BIGINT) FROM meta WHERE key = '{REFINISHED}'), 0), \
             (SELECT coalesce(max(updated_ms), 0) {FINISHED}), \
             (SELECT count(*) {FINISHED} AND updated_ms >= (SELECT max(updated_ms) {FINISHED}) - {RECENT_MS})"
        ))
    }

    /// Every operation finished at or after `since_ms` (`after`: only
    /// those finished after it), and the state's mark as they were read
    /// (`None` without a row).
    fn finished_since(&self, since_ms: i64, after: bool) -> Result<FinishedSince, StateError> {
        let sql = format!(
            "SELECT name, op_id, kind, state, last_error, updated_ms, {} FROM intents \
             WHERE state IN ('done', 'failed') AND updated_ms {} ?1 ORDER BY op_id",
            self.mark_columns()?,
            if after { ">" } else { ">=" }
        );
        let mut mark = None;
        let rows = self.map_rows(&sql, args![since_ms], |r| {
            let row = finished_row(r)?;
            Ok((row, mark_at(r, 6)?))
        })?;
        let rows = rows
            .into_iter()
            .map(|(row, at)| {
                mark = Some(at);
                row
            })
            .collect();
        Ok((rows, mark))
    }
}

/// The operations [`StateStore::finished_since`] reads, and the mark then.
type FinishedSince = (Vec<(String, LastOperation)>, Option<FinishedMark>);

/// The [`FinishedMark`] in a row's columns from `first` on.
fn mark_at(r: &super::sql::Row, first: usize) -> Result<FinishedMark, super::sql::SqlError> {
    Ok(FinishedMark {
        count: r.get(first)?,
        newest_ms: r.get(first + 1)?,
        recent: r.get(first + 2)?,
    })
}

/// What [`StateStore::last_operations_since`] returns: last operations by
/// resource, and the resources whose last operation changed.
pub(crate) type Taken = (HashMap<String, LastOperation>, HashSet<String>);

impl StateStore {
    /// The last operations finished since `then` (a
    /// [`Self::finished_operations_mark`] read at an earlier status
    /// render), up to date with the state at `now` (its mark, read by the
    /// caller), with the resources they belong to as the changed ones: a
    /// status render over that earlier one renders those and reads the
    /// last operation of any other file it renders by name, instead of
    /// every resource's (hundreds of milliseconds and tens of megabytes at
    /// 100,000 resources, held by the running agent between commits
    /// before).
    ///
    /// What finished since is read alone when the rows finished after the
    /// mark's newest millisecond are as many as finished since (then they
    /// are what changed: every operation of an earlier millisecond was
    /// counted by the mark), or the rows finished in the [`RECENT_MS`]
    /// before it or after are those the mark counted then and every one
    /// counted since: then none finished earlier, and what finished in
    /// that window, after the mark or not, is among those read (again,
    /// and changed at worst: a file rendered again, never one kept that
    /// changed). When the counts show
    /// something else changed (an operation pruned, or finished earlier
    /// than that window), `None`: any
    /// resource's may have changed, and the caller reads every resource's
    /// along its render (`status::last_operations::ReadAlong`), a
    /// thousand at a time. A whole read here held 100,000 of them at once,
    /// at the end of a cold start: the running agent's peak.
    pub fn last_operations_since(
        &self,
        then: FinishedMark,
        now: FinishedMark,
    ) -> Result<Option<Taken>, StateError> {
        use crate::process::failpoint::{LAST_OPERATIONS_UNREAD, fired};
        if fired(LAST_OPERATIONS_UNREAD).is_some() {
            return Err(StateError::Io {
                path: self.location.clone(),
                source: std::io::Error::other("the read failed (failpoint)"),
            });
        }
        if then == now {
            return Ok(Some((HashMap::new(), HashSet::new())));
        }
        // First what finished after the mark's newest millisecond: when
        // those are every operation counted since, they are all that
        // changed (an operation of the window was counted by the mark,
        // and the render it was taken for showed it). Only otherwise is
        // the window read, and every operation in it taken as changed:
        // within seconds of a cold start, that window holds every
        // resource's create, and reading it at each one-file `tend apply`
        // rendered every file's inputs again.
        let (rows, read_at) = self.finished_since(then.newest_ms, true)?;
        let now_after = read_at.unwrap_or(now);
        let went_back =
            |now: FinishedMark| now.count < then.count || now.newest_ms < then.newest_ms;
        let rows = if !went_back(now_after)
            && i64::try_from(rows.len()).ok() == Some(now_after.count - then.count)
        {
            rows
        } else {
            let (rows, read_at) =
                self.finished_since(then.newest_ms.saturating_sub(RECENT_MS), false)?;
            // (Counted as the rows were read: operations finish after
            // `now` was taken, and they are read too.)
            let now = read_at.unwrap_or(now);
            if went_back(now) {
                tracing::debug!(
                    "status branch: the finished operations went back from {then:?} to {now:?}"
                );
                return Ok(None);
            }
            let since = now.count - then.count;
            let newer = rows
                .iter()
                .filter(|(_, op)| op.finished_at > time(then.newest_ms))
                .count();
            // Every one since finished after the mark's millisecond (those
            // of the window may have been pruned since), or in the window
            // or after and those of it are all still there.
            let told_apart = i64::try_from(newer).ok() == Some(since)
                || i64::try_from(rows.len()).ok() == then.recent.checked_add(since);
            if !told_apart {
                tracing::debug!(
                    "status branch: the operations finished since {then:?} cannot be told apart at {now:?}: {} rows from the window, {newer} newer",
                    rows.len()
                );
                return Ok(None);
            }
            rows
        };
        let mut operations: HashMap<String, LastOperation> = HashMap::new();
        for (name, op) in rows {
            // The newest; of two in the same millisecond, the lower id (as
            // the whole read chooses).
            let newer = operations.get(&name).is_none_or(|was| {
                (op.finished_at, std::cmp::Reverse(&op.id))
                    > (was.finished_at, std::cmp::Reverse(&was.id))
            });
            if newer {
                operations.insert(name, op);
            }
        }
        let changed = operations.keys().cloned().collect();
        Ok(Some((operations, changed)))
    }
}
