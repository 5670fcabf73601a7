//! The running agent's status: the last report of each provider worker,
//! merged into one report for `/v1/status`, `/metrics` and systemd's
//! status line, and the state of the source.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::watch;

use super::Report;
use crate::source::SourceFailure;

/// The source as the agent last saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SourceStatus {
    pub commit: Option<String>,
    pub commit_time: Option<SystemTime>,
    /// The current failure, if the branch cannot be read.
    pub failure: Option<SourceFailure>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each provider worker's report. With one provider the merged report
    /// is the same `Arc`: a fleet's report is held once, not twice.
    parts: BTreeMap<String, Arc<Report>>,
    /// Merged when first asked for after a change, not at every worker's
    /// report: over many providers, each worker's cycle would otherwise
    /// copy the whole fleet's report once more (at 100,000 resources on
    /// 10 providers, ten copies of 100,000 entries for one request).
    merged: Option<Arc<Report>>,
    source: SourceStatus,
    /// Why the status branch cannot be written (the status writer says).
    status_branch: Option<super::report::StatusBranchReport>,
}

/// `report` marked with the source's failure (or its end), copied only
/// when that changes what it says.
fn with_source(report: Arc<Report>, source: &SourceStatus) -> Arc<Report> {
    let wanted = source.failure.as_ref().map(|f| {
        let since = crate::time::rfc3339(f.since);
        (f.error.to_string(), since, f.failures)
    });
    let current = report
        .source
        .error
        .as_ref()
        .map(|e| (e.message.clone(), e.since.clone(), e.failures));
    if wanted == current {
        return report;
    }
    let report = Arc::unwrap_or_clone(report);
    Arc::new(match &source.failure {
        Some(failure) => report.with_source_failure(failure, None),
        None => Report {
            source: super::report::SourceInfo {
                error: None,
                ..report.source
            },
            ..report
        },
    })
}

/// `report` with the status branch's failure, copied only when that
/// changes what it says.
fn with_status_branch(
    report: Arc<Report>,
    failure: &Option<super::report::StatusBranchReport>,
) -> Arc<Report> {
    if &report.status_branch == failure {
        return report;
    }
    let mut report = Arc::unwrap_or_clone(report);
    report.status_branch = failure.clone();
    Arc::new(report)
}

/// What a commit changes in the report of a provider none of whose
/// declarations it changed (nor removed any declaration: a removal is
/// every provider's whole cycle). Everything a cycle over no names would
/// say, derived without one:
/// * the entries stay as they are (a cycle over no names decides none);
/// * the source names the new commit; the report keeps its time, which
///   says when its entries, its suspension and its orphaned overrides
///   were read and decided (the merged report takes the suspension of
///   the part read last: a moved part dated now would pass off an old
///   reading as the newest);
/// * the files that fail to parse are the new snapshot's: a cycle reports
///   its snapshot's parse errors and then the routing errors of the
///   declarations it passes over, which the commit did not change (a
///   changed one that names this provider, or none it has, is this
///   worker's to decide);
/// * an orphaned override whose name the commit declares is no longer
///   orphaned (a commit that removes nothing makes no new orphan);
/// * the suspension is the state's, which a commit does not change.
pub(crate) struct PartMove<'a> {
    /// The new commit's source, as a cycle over it would report it.
    pub source: super::report::SourceInfo,
    /// The parse errors of the snapshot the part was decided over.
    pub errors_before: &'a [crate::model::Diagnostic],
    /// The parse errors of the new snapshot.
    pub errors_after: &'a [crate::model::Diagnostic],
    /// Whether the new snapshot declares a name.
    pub declared: &'a dyn Fn(&str) -> bool,
}

impl PartMove<'_> {
    fn apply(self, part: &mut Report) {
        use super::report::ErrorReport;
        type Key = (String, usize, usize, String);
        let key = |e: ErrorReport| (e.file, e.line, e.column, e.message);
        // The old snapshot's parse errors, each taken out once; what is
        // left are the routing errors.
        let mut before: std::collections::HashMap<Key, usize> = std::collections::HashMap::new();
        for e in self.errors_before.iter().map(ErrorReport::from) {
            *before.entry(key(e)).or_default() += 1;
        }
        let old = std::mem::take(&mut part.errors);
        part.errors = self.errors_after.iter().map(ErrorReport::from).collect();
        for e in old {
            let k = key(e.clone());
            match before.get_mut(&k) {
                Some(n) if *n > 0 => *n -= 1,
                _ => part.errors.push(e),
            }
        }
        part.orphaned_overrides
            .retain(|o| !(self.declared)(&o.name));
        part.source = self.source;
        part.summary = super::report::Summary::of(&part.resources, part.errors.len());
    }
}

/// Up to how many changed names a merged report is patched rather than
/// merged again.
const PATCHED_AT_MOST: usize = 1_000;

/// Shared between the workers (writers) and the server (reader).
#[derive(Debug)]
pub(crate) struct StatusBoard {
    inner: Mutex<Inner>,
    /// Bumped at every change, for whoever waits on one.
    changes: watch::Sender<u64>,
    /// The workers in a cycle: the status writer waits for the cycles a
    /// commit started to end (up to a bound) before it writes.
    running: watch::Sender<Vec<Began>>,
    /// The id of the next cycle counted.
    next_cycle: AtomicU64,
}

/// A cycle running, as the board counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Began {
    id: u64,
    /// The commit it decides, and that commit's committer time (RFC 3339,
    /// as reports give it).
    pub commit: String,
    pub commit_time: String,
    /// When it began, by the agent's clock.
    pub at: SystemTime,
    /// Whether it still runs (the status writer waits for it); `false`: it
    /// ended without its report (it failed), and its operations may be in
    /// the journal until one of its worker's cycles reports.
    pub runs: bool,
}

/// Until when every operation finished is in `report`, taken after `now`
/// and after `running` was (the agent's clock): `now`, or when the first
/// of the cycles running (or ended unreported) over a newer commit than
/// the report's began.
///
/// A cycle publishes its report before it ends: an operation finished
/// before `now` by a cycle no longer running is in the report. One
/// finished by a cycle still running may not be; only a cycle over a
/// newer commit (a commit no part is at yet: the report names the newest
/// of its parts') would have its operation's file name an older commit
/// than the one it was run for. One of a cycle over the report's commit
/// or an older one names that commit, and the cycle's entry, when it
/// comes, is compared with it as with any other: a cold start's
/// operations are not made again, even when a commit lands during it.
pub(crate) fn reported_until(running: &[Began], report: &Report, now: SystemTime) -> SystemTime {
    let source = &report.source;
    let Some(commit) = source.commit.as_deref() else {
        // (A report of no commit names none in any file.)
        return now;
    };
    let newer = |b: &&Began| {
        b.commit != commit
            && source
                .commit_time
                .as_deref()
                .is_none_or(|time| b.commit_time.as_str() >= time)
    };
    running
        .iter()
        .filter(newer)
        .map(|b| b.at)
        .fold(now, SystemTime::min)
}

impl Default for StatusBoard {
    fn default() -> Self {
        StatusBoard {
            inner: Mutex::default(),
            changes: watch::Sender::new(0),
            running: watch::Sender::new(Vec::new()),
            next_cycle: AtomicU64::new(0),
        }
    }
}

/// A worker's cycle, counted by the board while it is held.
pub(crate) struct RunningCycle<'b> {
    board: &'b StatusBoard,
    id: u64,
}

impl RunningCycle<'_> {
    /// The cycle ended without publishing its report (it failed): it is
    /// no longer waited for, but still bounds what the reports hold (see
    /// [`reported_until`]) until the guard is dropped, when a later cycle
    /// of its worker has reported.
    pub(crate) fn ended_unreported(self) -> Self {
        self.board.running.send_modify(|running| {
            for began in running.iter_mut().filter(|b| b.id == self.id) {
                began.runs = false;
            }
        });
        self
    }
}

impl Drop for RunningCycle<'_> {
    fn drop(&mut self) {
        self.board
            .running
            .send_modify(|running| running.retain(|b| b.id != self.id));
    }
}

impl StatusBoard {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A worker's report of `provider`. `partial`: the names it covers (the
    /// due ones, or the declarations a commit changed), which replace their
    /// earlier entries (a name the report no longer holds, such as a
    /// declaration that moved to another provider, leaves the part);
    /// `None`: it replaces the provider's report.
    pub(crate) fn publish(
        &self,
        provider: &str,
        report: Report,
        partial: Option<&std::collections::BTreeSet<String>>,
    ) {
        let mut inner = self.lock();
        // Taken first, so the part below is usually the only reference
        // and is changed in place.
        let merged = inner.merged.take();
        // The names whose merged entry may change (`None`: any).
        let mut covered: Option<Vec<String>> = None;
        let part = match (partial, inner.parts.remove(provider)) {
            (Some(names), Some(old)) => {
                let mut old = Arc::unwrap_or_clone(old);
                covered = Some(
                    names
                        .iter()
                        .cloned()
                        .chain(report.resources.iter().map(|r| r.name.clone()))
                        .collect(),
                );
                let reported: std::collections::HashSet<&str> =
                    report.resources.iter().map(|r| r.name.as_str()).collect();
                old.resources
                    .retain(|r| !names.contains(&r.name) && !reported.contains(r.name.as_str()));
                old.resources.extend(report.resources);
                old.resources.sort_by(|a, b| a.name.cmp(&b.name));
                // The report is made now: a due-time cycle's report must not
                // carry the last full cycle's time (an override shown as
                // "EXPIRED at 10:43 (in 39s)" under "report made 10:42").
                old.generated_at = report.generated_at;
                old.source = report.source;
                // Whatever its scope, a cycle reports the fleet's
                // declaration errors and orphaned overrides whole.
                old.errors = report.errors;
                old.orphaned_overrides = report.orphaned_overrides;
                old.suspended = report.suspended;
                old.summary = super::report::Summary::of(&old.resources, old.errors.len());
                Arc::new(old)
            }
            _ => Arc::new(report),
        };
        inner.parts.insert(provider.to_string(), part);
        if let (Some(merged), Some(covered)) = (merged, covered) {
            Self::patch_merged(&mut inner, merged, covered);
        }
        drop(inner);
        self.changes.send_modify(|n| *n += 1);
    }

    /// Brings the last merged report up to date with the parts where only
    /// the entries of `covered` may have changed (a partial report, a
    /// moved part), instead of merging the whole fleet again: at 100,000
    /// resources on 10 providers a merge took 130 ms of every commit's
    /// path to its status commit. Each covered name's entry is the one the
    /// merge would keep (the first part, in provider order, that holds
    /// it). Many names, or one part, are merged again when asked for.
    fn patch_merged(inner: &mut Inner, merged: Arc<Report>, mut covered: Vec<String>) {
        if inner.parts.len() < 2 || covered.len() > PATCHED_AT_MOST {
            return;
        }
        covered.sort_unstable();
        covered.dedup();
        let mut report = Arc::unwrap_or_clone(merged);
        let find = |resources: &[Arc<super::report::ResourceReport>], name: &str| {
            resources.binary_search_by(|r| r.name.as_str().cmp(name))
        };
        for name in &covered {
            let held = inner.parts.values().find_map(|part| {
                find(&part.resources, name)
                    .ok()
                    .map(|i| part.resources[i].clone())
            });
            match (find(&report.resources, name), held) {
                (Ok(i), Some(entry)) => report.resources[i] = entry,
                (Ok(i), None) => {
                    report.resources.remove(i);
                }
                (Err(i), Some(entry)) => report.resources.insert(i, entry),
                (Err(_), None) => {}
            }
        }
        let parts: Vec<&Report> = inner.parts.values().map(Arc::as_ref).collect();
        report.merge_fields(&parts);
        inner.merged = Some(with_status_branch(
            with_source(Arc::new(report), &inner.source),
            &inner.status_branch,
        ));
    }

    /// Moves `provider`'s part to a commit that changed none of the
    /// declarations its worker decides (see [`PartMove`]), without a
    /// cycle: at 100,000 declarations on 10 providers, nine cycles over no
    /// names took most of the two cores a one-file commit's own cycle
    /// waited for. Returns `false` when the board holds no part of
    /// `provider` (the worker then runs its cycle).
    pub(crate) fn advance(&self, provider: &str, moved: PartMove<'_>) -> bool {
        let mut inner = self.lock();
        let Some(old) = inner.parts.remove(provider) else {
            return false;
        };
        let merged = inner.merged.take();
        let mut part = Arc::unwrap_or_clone(old);
        moved.apply(&mut part);
        inner.parts.insert(provider.to_string(), Arc::new(part));
        if let Some(merged) = merged {
            Self::patch_merged(&mut inner, merged, Vec::new());
        }
        drop(inner);
        self.changes.send_modify(|n| *n += 1);
        true
    }

    /// Forgets every worker's report (after a reload the providers may be
    /// others); the merged report stays until a new one is published.
    pub(crate) fn reset_parts(&self) {
        let mut inner = self.lock();
        Self::merge(&mut inner);
        inner.parts.clear();
    }

    /// The merged report, once any worker reported.
    pub(crate) fn latest(&self) -> Option<Arc<Report>> {
        let mut inner = self.lock();
        Self::merge(&mut inner);
        inner.merged.clone()
    }

    /// Merges the parts if a part changed since the last merge.
    fn merge(inner: &mut Inner) {
        if inner.merged.is_some() || inner.parts.is_empty() {
            return;
        }
        let merged = match inner.parts.len() {
            1 => inner.parts.values().next().cloned(),
            _ => Report::merge(inner.parts.values().map(Arc::as_ref)).map(Arc::new),
        };
        inner.merged =
            merged.map(|r| with_status_branch(with_source(r, &inner.source), &inner.status_branch));
    }

    /// How many providers have reported since the last reset.
    pub(crate) fn reported(&self) -> usize {
        self.lock().parts.len()
    }

    /// What the source follower saw. The merged report says whether the
    /// source fails (and is changed only when that does).
    pub(crate) fn set_source(&self, source: SourceStatus) {
        let mut inner = self.lock();
        inner.source = source;
        if let Some(merged) = inner.merged.take() {
            inner.merged = Some(with_source(merged, &inner.source));
        }
        drop(inner);
        self.changes.send_modify(|n| *n += 1);
    }

    /// What the status writer found: the status branch's failure, or
    /// `None`. Changes the merged report (and notifies) only when it
    /// changes.
    pub(crate) fn set_status_branch(&self, failure: Option<super::report::StatusBranchReport>) {
        let mut inner = self.lock();
        if inner.status_branch == failure {
            return;
        }
        inner.status_branch = failure;
        if let Some(merged) = inner.merged.take() {
            inner.merged = Some(with_status_branch(merged, &inner.status_branch));
        }
        drop(inner);
        self.changes.send_modify(|n| *n += 1);
    }

    pub(crate) fn source(&self) -> SourceStatus {
        self.lock().source.clone()
    }

    /// Notified at every change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether `provider`'s last report holds a resource named `name`.
    pub(crate) fn holds(&self, provider: &str, name: &str) -> bool {
        self.lock().parts.get(provider).is_some_and(|part| {
            part.resources
                .binary_search_by(|r| r.name.as_str().cmp(name))
                .is_ok()
        })
    }

    /// Counts a cycle over `commit` (committed at `commit_time`), begun at
    /// `now` (the agent's clock), as running until the guard is dropped.
    pub(crate) fn cycle_running(
        &self,
        (commit, commit_time): (&str, SystemTime),
        now: SystemTime,
    ) -> RunningCycle<'_> {
        let id = self.next_cycle.fetch_add(1, Ordering::Relaxed);
        self.running.send_modify(|running| {
            running.push(Began {
                id,
                commit: commit.to_string(),
                commit_time: crate::time::rfc3339(commit_time),
                at: now,
                runs: true,
            })
        });
        RunningCycle { board: self, id }
    }

    /// The cycles running, watched.
    pub(crate) fn running_cycles(&self) -> watch::Receiver<Vec<Began>> {
        self.running.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    /// A configuration, a time and an empty board.
    fn setting() -> (crate::config::Config, SystemTime, StatusBoard) {
        let config = crate::config::Config::parse(
            "[source]\nurl = \"/nowhere\"\n[providers.sandbox]\nkind = \"sandbox\"\n",
            std::path::Path::new("/etc/tend/tend.toml"),
        )
        .unwrap();
        let then = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        (config, then, StatusBoard::default())
    }

    #[test]
    fn a_partial_report_is_dated_when_it_was_made() {
        let (config, then, board) = setting();
        let full = crate::status::report::empty_report(&config, "agent", then);
        board.publish("sandbox", full, None);
        let later = then + Duration::from_secs(40);
        let due = crate::status::report::empty_report(&config, "agent", later);
        let made = due.generated_at.clone();
        board.publish("sandbox", due, Some(&Default::default()));
        let latest = board.latest().unwrap();
        assert_eq!(latest.generated_at, made);
        assert_ne!(made, crate::time::rfc3339(then));
    }

    fn resource(name: &str) -> Arc<super::super::report::ResourceReport> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "name": name, "file": format!("{name}.yaml"), "state": "InSync",
                "action": "None", "reason": "", "drift": [],
            }))
            .expect("a resource report"),
        )
    }

    /// The merged report as a merge of the parts would make it now.
    fn merged_again(board: &StatusBoard) -> serde_json::Value {
        board.lock().merged = None;
        serde_json::to_value(board.latest().expect("a merged report")).expect("JSON")
    }

    #[test]
    fn a_patched_merged_report_is_the_merge_of_the_parts() {
        let (config, then, board) = setting();
        let report = |names: &[&str], reason: &str| {
            let mut r = crate::status::report::empty_report(&config, "agent", then);
            r.resources = names
                .iter()
                .map(|n| {
                    let mut e = (*resource(n)).clone();
                    e.reason = reason.to_string().into();
                    Arc::new(e)
                })
                .collect();
            r
        };
        // `billing` is in both parts (declared at one, still managed at
        // the other): the first provider's entry is the merged one.
        board.publish("a", report(&["billing", "orders"], "a"), None);
        board.publish("b", report(&["billing", "ledger"], "b"), None);
        let whole = serde_json::to_value(board.latest().expect("merged")).expect("JSON");
        assert_eq!(whole["resources"][0]["reason"], "a");
        let steps: [(&str, Vec<&str>, &[&str]); 4] = [
            // `a` no longer holds `billing`: `b`'s entry shows.
            ("a", vec!["billing"], &[]),
            // `b` changes `ledger` and adds `audit`.
            ("b", vec!["ledger"], &["audit", "ledger"]),
            // `a` takes `billing` back, and drops `orders`.
            ("a", vec!["billing", "orders"], &["billing"]),
            // Nothing covered.
            ("b", vec![], &[]),
        ];
        for (i, (provider, names, reported)) in steps.into_iter().enumerate() {
            board.latest();
            let names = names.into_iter().map(String::from).collect();
            let reason = format!("step {i}");
            board.publish(provider, report(reported, &reason), Some(&names));
            let patched = serde_json::to_value(board.latest().expect("merged")).expect("JSON");
            assert_eq!(patched, merged_again(&board), "step {i}");
        }
        // A moved part changes the report-wide fields only.
        board.latest();
        let moved = PartMove {
            source: crate::status::report::SourceInfo::of(&config, Some("c0ffee".into()), None),
            errors_before: &[],
            errors_after: &[],
            declared: &|_| false,
        };
        assert!(board.advance("a", moved));
        let patched = serde_json::to_value(board.latest().expect("merged")).expect("JSON");
        assert_eq!(patched["source"]["commit"], "c0ffee");
        assert_eq!(patched, merged_again(&board));
        let names: Vec<&str> = patched["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert_eq!(names, ["audit", "billing", "ledger"]);
    }

    #[test]
    fn a_partial_report_replaces_the_names_it_covers_and_drops_those_it_no_longer_holds() {
        let (config, then, board) = setting();
        let mut full = crate::status::report::empty_report(&config, "agent", then);
        full.resources = ["billing", "ledger", "orders"].map(resource).to_vec();
        board.publish("sandbox", full, None);
        // `ledger` moved to another provider; `orders` changed; `billing`
        // was not in the cycle's scope.
        let mut change = crate::status::report::empty_report(&config, "agent", then);
        let mut orders = (*resource("orders")).clone();
        orders.reason = "changed".into();
        change.resources = vec![Arc::new(orders)];
        let names = ["ledger", "orders"].map(String::from).into();
        board.publish("sandbox", change, Some(&names));
        let latest = board.latest().unwrap();
        let held: Vec<(&str, &str)> = latest
            .resources
            .iter()
            .map(|r| (r.name.as_str(), &*r.reason))
            .collect();
        assert_eq!(held, [("billing", ""), ("orders", "changed")]);
        assert_eq!(latest.summary.total, 2);
    }

    /// Every operation finished before the report is taken is in it,
    /// but those of the cycles running over a newer commit than the
    /// report's, since the first of them began.
    #[test]
    fn the_report_holds_the_operations_finished_but_those_of_a_newer_commit() {
        let (config, then, board) = setting();
        let at = |s: u64| then + Duration::from_secs(s);
        let (c1, c2) = (("c1", at(0)), ("c2", at(5)));
        let mut report = crate::status::report::empty_report(&config, "agent", then);
        report.source.commit = Some("c1".into());
        report.source.commit_time = Some(crate::time::rfc3339(at(0)));
        let until_of = |report: &Report, now: u64| {
            let running = board.running_cycles().borrow().clone();
            reported_until(&running, report, at(now))
        };
        let until = |now: u64| until_of(&report, now);
        assert_eq!(until(10), at(10));
        let same = board.cycle_running(c1, at(1));
        assert_eq!(until(10), at(10), "a cycle over the report's commit");
        let first = board.cycle_running(c2, at(2));
        let second = board.cycle_running(c2, at(3));
        assert_eq!(until(10), at(2));
        drop(first);
        assert_eq!(until(10), at(3));
        drop((same, second));
        assert_eq!(until(10), at(10));
        assert!(board.running_cycles().borrow().is_empty());
        // Over c2, a cycle over the older c1 bounds nothing.
        let _older = board.cycle_running(c1, at(11));
        let mut newer = report.clone();
        newer.source.commit = Some("c2".into());
        newer.source.commit_time = Some(crate::time::rfc3339(at(5)));
        assert_eq!(until_of(&newer, 12), at(12));
        assert_eq!(until(12), at(12), "c1's own");
        // A report of no commit names none.
        let _running = board.cycle_running(c2, at(13));
        assert_eq!(until(14), at(13));
        let mut none = report.clone();
        none.source.commit = None;
        assert_eq!(until_of(&none, 14), at(14));
    }

    /// The merged report names the newest commit of its parts, whichever
    /// provider's it is.
    #[test]
    fn the_merged_report_names_the_newest_commit() {
        let (config, then, board) = setting();
        let at = |s: u64| then + Duration::from_secs(s);
        let part = |commit: &str, time: SystemTime| {
            let mut r = crate::status::report::empty_report(&config, "agent", then);
            r.source =
                crate::status::report::SourceInfo::of(&config, Some(commit.into()), Some(time));
            r
        };
        board.publish("a", part("c1", at(1)), None);
        board.publish("b", part("c2", at(2)), None);
        let commit = || board.latest().and_then(|r| r.source.commit.clone());
        assert_eq!(commit().as_deref(), Some("c2"));
        board.publish("a", part("c3", at(3)), None);
        assert_eq!(commit().as_deref(), Some("c3"));
        // Of equal times, the first part's.
        board.publish("b", part("c4", at(3)), None);
        assert_eq!(commit().as_deref(), Some("c3"));
    }

    /// A cycle that ended without its report is not waited for, and
    /// bounds what the reports hold until its guard goes.
    #[test]
    fn a_cycle_ended_unreported_bounds_until_its_worker_reports() {
        let (config, then, board) = setting();
        let at = |s: u64| then + Duration::from_secs(s);
        let mut report = crate::status::report::empty_report(&config, "agent", then);
        report.source.commit = Some("c1".into());
        report.source.commit_time = Some(crate::time::rfc3339(at(0)));
        let running = || board.running_cycles().borrow().clone();
        let failed = board.cycle_running(("c2", at(5)), at(1)).ended_unreported();
        assert!(running().iter().all(|b| !b.runs), "not waited for");
        assert_eq!(reported_until(&running(), &report, at(10)), at(1));
        drop(failed);
        assert_eq!(reported_until(&running(), &report, at(10)), at(10));
    }
}
