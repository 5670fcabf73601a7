//! The status step of a writing cycle: the status branch, then the report
//! files (which say whether the branch could be written), then the
//! notifications of the transitions (queued; delivered apart). `tend apply`
//! runs it once after its cycle; `tend run`'s status writer runs it after
//! every change of the fleet's report.
//!
//! # Guarantees
//! * Nothing here changes what reconciliation does or when: a failure is
//!   reported (in the report, the log and the metrics), never raised.
//! * An unchanged fleet costs no network: the branch is fetched and
//!   compared only when the files differ from the last ones published.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::auto_propose::{AutoOutcome, AutoPropose};
use super::branch::{Published, StatusBranch, StatusBranchError};
use super::branch_files::{AHEAD_OF_REPORT, Inputs, InputsDigest, Rendered};
use super::files::{ReportFiles, ReportFilesError};
use super::last_operations::render_reading;
use super::notify::deliver::Notifier;
use super::report::{Report, ResourceReport, StatusBranchReport};
use super::report_digest::{Digested, EntryDigests};
use super::times_only::FilesSaid;
use crate::agent::Agent;
use crate::journal::{DecidedFrom, FinishedMark, StateStore};
use crate::propose::branch::ProposalBranch;

/// What publishing did.
#[derive(Debug, Default)]
pub(crate) struct PublishOutcome {
    /// The status branch's failure, if it has one.
    pub branch_error: Option<StatusBranchError>,
    /// The same as the reports show it.
    pub branch_report: Option<StatusBranchReport>,
    /// A commit was pushed to the status branch.
    pub committed: Option<String>,
    pub files_error: Option<ReportFilesError>,
    /// Notifications queued (transitions, alerts, a commit status): the
    /// deliveries are woken when there are any.
    pub transitions: usize,
    /// The notifications could not be recorded.
    pub notify_error: Option<crate::journal::StateError>,
    /// What `[status] propose` did.
    pub proposals: AutoOutcome,
    /// The report files were left as they are: the report says what they
    /// say, and only its times moved (see [`FilesSaid`]). They are
    /// due this long from now.
    pub files_deferred: Option<Duration>,
}

/// The status step of one agent.
pub(crate) struct StatusPublisher {
    files: ReportFiles,
    branch: Option<StatusBranch>,
    store: Option<Arc<StateStore>>,
    title: &'static str,
    notifier: Option<Arc<Notifier>>,
    /// `[status] propose = true`.
    auto_propose: Option<AutoPropose>,
    /// What the branch's files were last published from (see
    /// `publish_branch`), and the file in the state dir that keeps it.
    published: Option<String>,
    key_file: Option<std::path::PathBuf>,
    /// What this process last published the branch's files from (without
    /// the tip): while it stays the same, the running agent does not even
    /// fetch the branch.
    published_content: Option<String>,
    /// Since when the branch has been failing.
    failing_since: Option<SystemTime>,
    /// Whether this publisher publishes again (the running agent's): only
    /// then are the resources' inputs digested and kept.
    keeps_renders: bool,
    /// The commit this process last published, and each resource's
    /// inputs then: over that tip, a resource whose inputs are the same is
    /// not rendered again. Read from `renders_file` at the first
    /// publication (what the last process kept), written there when the
    /// publisher goes.
    rendered: Option<(String, HashMap<String, InputsDigest>)>,
    /// The digests of that render's report entries, to know an entry that
    /// says the same at the next, and the state's finished-operations mark
    /// then (for this process's next render, and kept for the next
    /// process with `rendered`).
    rendered_entries: Option<(EntryDigests, FinishedMark)>,
    /// Whether the state remembers what that render decided each file
    /// from, as the render did: only then are its entries' digests
    /// trusted, in this process or the next.
    entries_recorded: bool,
    /// `status-inputs` in the state dir (with a state).
    renders_file: Option<std::path::PathBuf>,
    /// Whether `renders_file` was read, and whether it holds `rendered`.
    renders_loaded: bool,
    renders_saved: bool,
    /// The running agent's: what each file was decided from as this
    /// publisher last recorded it (it alone writes it while it runs), so
    /// it is not read back at every status commit. `None`: read it.
    decided: Option<DecidedFrom>,
    /// The running agent's: what its report files were last written
    /// from, and when.
    files_said: FilesSaid,
    /// The running agent's: every operation finished by then is in the
    /// report being published (see [`Self::publish_as_of`]).
    reported_until: Option<SystemTime>,
}

impl StatusPublisher {
    /// The publisher of `agent`. `previous`: what the last report written
    /// said was failing (a one-shot command learns since when the branch
    /// has been failing from it).
    pub(crate) fn new(
        agent: &Agent,
        title: &'static str,
        previous: &super::files::LastFailures,
        notifier: Option<Arc<Notifier>>,
    ) -> Self {
        let config = agent.config();
        let failing_since = previous
            .status_branch_since
            .as_deref()
            .and_then(|since| humantime::parse_rfc3339(since).ok());
        StatusPublisher {
            files: ReportFiles::new(&config.reports_dir(), config.status.keep_reports),
            branch: StatusBranch::of(agent),
            store: agent.store().cloned(),
            key_file: agent
                .store()
                .map(|_| config.state_dir.join("status-branch-published")),
            title,
            notifier,
            auto_propose: config.status.propose.then(|| {
                let source = agent.source_settings();
                AutoPropose::new(ProposalBranch {
                    repo_dir: crate::source::repo_dir(&config.state_dir),
                    url: source.url.clone(),
                    credentials: source.credentials.clone(),
                    agent_id: agent.agent_id().to_string(),
                    base_branch: source.branch.clone(),
                })
            }),
            published: None,
            published_content: None,
            failing_since,
            keeps_renders: false,
            renders_file: agent
                .store()
                .map(|_| super::kept_renders::path(&config.state_dir)),
            rendered_entries: None,
            entries_recorded: false,
            renders_loaded: false,
            renders_saved: true,
            decided: None,
            rendered: None,
            files_said: FilesSaid::default(),
            reported_until: None,
        }
    }

    /// The same publisher, publishing again and again (the running
    /// agent's status writer): each status commit renders only the files
    /// whose resource changed since the commit it last published.
    pub(crate) fn keeping_renders(mut self) -> Self {
        self.keeps_renders = true;
        self
    }

    /// What a render is told of `base`, the last render's digests.
    fn inputs<'a>(
        &self,
        base: Option<HashMap<String, InputsDigest>>,
        unchanged: &'a super::branch_files::Unchanged<'a>,
        kept: super::branch_files::Kept<'a>,
    ) -> Inputs<'a> {
        if self.keeps_renders || self.renders_file.is_some() {
            Inputs::Keep {
                base,
                unchanged,
                kept,
                reported_until: self.reported_until,
            }
        } else {
            Inputs::Forget
        }
    }

    /// Writes the report files only: a report with nothing decided must
    /// not empty the status branch, nor end every resource's conditions.
    pub(crate) fn files_only(&mut self) {
        self.branch = None;
        self.notifier = None;
        self.auto_propose = None;
    }

    /// Whether the last publication of the branch failed (the caller
    /// tries again later even if nothing changes).
    pub(crate) fn failing(&self) -> bool {
        self.failing_since.is_some()
    }

    /// [`Self::publish`] of a report that holds every operation finished
    /// by `reported_until` (the running agent's: the state is read after
    /// the report is taken, and may hold newer ones, whose files are then
    /// made again by the next publication; see `Rendered::ahead`).
    pub(crate) fn publish_as_of(
        &mut self,
        report: &Report,
        now: SystemTime,
        reported_until: SystemTime,
    ) -> PublishOutcome {
        self.reported_until = Some(reported_until);
        self.publish(report, now)
    }

    /// Publishes `report` (blocking: Git and file I/O) at `now`.
    pub(crate) fn publish(&mut self, report: &Report, now: SystemTime) -> PublishOutcome {
        let mut outcome = PublishOutcome::default();
        let mut report_with = None;
        // A one-shot command writes the files beside the branch's
        // publication while the branch works (the report digested, the tip
        // fetched over the network, a commit pushed): they say what the
        // report says unless the branch fails now, and are then written
        // again, marked. A branch that failed last time is published
        // first. The running agent does the same, with the report digested
        // first: a commit is reconciled when both are written, and one
        // after the other they took 0.45 s more at 100,000 resources (its
        // parse cache, written beside them until then, now waits for a
        // quiet source and leaves them a core).
        let mut beside = None;
        let mut written_beside = None;
        // The running agent's report is digested first: the branch's key,
        // and what tells the report files that the history holds what it
        // says already. A one-shot command's is digested where the branch
        // is published, beside the files.
        let digested = self.keeps_renders.then(|| timed_digest(report));
        let files_may_wait = self.files_said.may_wait(
            digested.as_ref().map(|d| d.report.as_str()),
            self.failing_since.is_none() && report.status_branch.is_none(),
            now,
        );
        let branch_result = match self.branch.clone() {
            Some(branch)
                if !self.keeps_renders
                    && self.failing_since.is_none()
                    && report.status_branch.is_none() =>
            {
                // The history gets the report once the branch's outcome
                // says which one it is (below).
                let title = self.title;
                let (published, written) = self.publish_beside(&branch, report, None, |files| {
                    let started = std::time::Instant::now();
                    let written = files.write_latest(report, title);
                    tracing::debug!("report files written in {:?}", started.elapsed());
                    written
                });
                beside = Some(written);
                Some((branch, published))
            }
            // The running agent's, digested already, over a render of
            // its own (a first render, every file at once, is not run
            // beside the report files: together they raised the peak
            // memory of a cold start at 10,000 resources).
            Some(branch)
                if self.keeps_renders
                    && self.failing_since.is_none()
                    && self.rendered.is_some()
                    && files_may_wait.is_none() =>
            {
                let title = self.title;
                let digest = digested.as_ref().map(|d| d.report.as_str());
                let (published, written) =
                    self.publish_beside(&branch, report, digested.as_ref(), |files| {
                        Self::write_files(files, report, title, digest)
                    });
                written_beside = Some(written);
                Some((branch, published))
            }
            Some(branch) => {
                let published = self.publish_branch(&branch, report, digested.as_ref());
                Some((branch, published))
            }
            None => None,
        };
        if let Some((branch, published)) = branch_result {
            match published {
                Ok(committed) => {
                    self.failing_since = None;
                    // The running agent's status commits add loose
                    // objects to the Git cache: packed beside the next
                    // publications when due (a one-shot command packs at
                    // its end).
                    if committed.is_some() && self.keeps_renders {
                        crate::source::cache_pack::pack_beside(&branch.repo_dir);
                    }
                    outcome.committed = committed;
                    if report.status_branch.is_some() {
                        let mut cleared = report.clone();
                        cleared.status_branch = None;
                        report_with = Some(cleared);
                    }
                }
                Err(e) => {
                    let since = *self.failing_since.get_or_insert(now);
                    let failure = StatusBranchReport {
                        branch: branch.branch.clone(),
                        error: e.to_string(),
                        since: crate::time::rfc3339(since),
                    };
                    if report.status_branch.as_ref() != Some(&failure) {
                        let mut marked = report.clone();
                        marked.status_branch = Some(failure.clone());
                        report_with = Some(marked);
                    }
                    outcome.branch_report = Some(failure);
                    outcome.branch_error = Some(e);
                }
            }
        }
        let files = match (beside, written_beside, &report_with) {
            // Only the times moved, and the branch committed nothing: the
            // files are written later (or with the next change).
            (None, None, None) if files_may_wait.is_some() && outcome.committed.is_none() => {
                outcome.files_deferred = files_may_wait;
                Ok(())
            }
            (_, Some(written), None) => written,
            (Some(written), _, None) => {
                written.and_then(|digest| self.files.add_history(report, digest))
            }
            (_, _, Some(written)) => Self::write_files(&mut self.files, written, self.title, None),
            (_, _, None) => Self::write_files(
                &mut self.files,
                report,
                self.title,
                digested.as_ref().map(|d| d.report.as_str()),
            ),
        };
        match files {
            Err(e) => outcome.files_error = Some(e),
            Ok(()) if outcome.files_deferred.is_some() => {}
            Ok(()) => {
                let digest = digested.as_ref().filter(|_| report_with.is_none());
                self.files_said
                    .written(digest.map(|d| d.report.as_str()), now);
            }
        }
        // A release is shown once: once the report that shows it is
        // written (and committed, with a status branch), later reports
        // leave it out.
        if outcome.files_error.is_none()
            && outcome.branch_error.is_none()
            && let Some(store) = &self.store
        {
            let shown: Vec<String> = report
                .resources
                .iter()
                .filter(|r| r.is_shown_release())
                .map(|r| r.name.clone())
                .collect();
            if let Err(e) = store.releases_shown(&shown) {
                tracing::warn!("status: cannot record the releases shown: {e}");
            }
        }
        if let (Some(notifier), Some(store)) = (&self.notifier, &self.store) {
            match notifier.record(store, report, now) {
                Ok((_, queued)) => outcome.transitions = queued,
                Err(e) => outcome.notify_error = Some(e),
            }
        }
        if let Some(auto) = &mut self.auto_propose {
            outcome.proposals = auto.run(report);
        }
        outcome
    }

    /// Publishes the branch while `write` writes the report files on a
    /// thread of its own (their state is this publisher's again after).
    fn publish_beside<T: Send>(
        &mut self,
        branch: &StatusBranch,
        report: &Report,
        digested: Option<&Digested>,
        write: impl FnOnce(&mut ReportFiles) -> T + Send,
    ) -> (Result<Option<String>, StatusBranchError>, T) {
        let mut files = self.files.clone();
        let (published, written) = std::thread::scope(|scope| {
            let writing = scope.spawn(|| write(&mut files));
            let published = self.publish_branch(branch, report, digested);
            let written = writing.join().unwrap_or_else(|panic| {
                std::panic::resume_unwind(panic);
            });
            (published, written)
        });
        self.files = files;
        (published, written)
    }

    /// Writes the report files of `report`, timed in the debug log.
    fn write_files(
        files: &mut ReportFiles,
        report: &Report,
        title: &str,
        digest: Option<&str>,
    ) -> Result<(), super::files::ReportFilesError> {
        let writing = std::time::Instant::now();
        let written = files.write(report, title, digest);
        tracing::debug!("report files written in {:?}", writing.elapsed());
        written
    }

    /// `digested`: `report`'s digest, if made already.
    fn publish_branch(
        &mut self,
        branch: &StatusBranch,
        report: &Report,
        digested: Option<&Digested>,
    ) -> Result<Option<String>, StatusBranchError> {
        // What the branch's files are a function of: the report (without
        // its moving times) and the journal's finished operations; and
        // what the branch holds: its tip. While both stay the same,
        // nothing is rendered, written or pushed; the key survives
        // processes in the state dir, so an unchanged `tend apply` costs a
        // digest and a fetch that finds nothing new, not ten thousand
        // files. Someone else's push moves the tip, and the files are
        // checked again. Within one process, the content alone decides:
        // the running agent does not fetch the branch while its files stay
        // the same (a file someone edited there is put right with the next
        // change).
        let mark = self
            .store
            .as_ref()
            .and_then(|s| s.finished_operations_mark().ok());
        let finished = mark.unwrap_or_default();
        let made;
        let Digested {
            report: report_digest,
            entries: entry_digests,
        } = match digested {
            Some(digested) => digested,
            None => {
                made = timed_digest(report);
                &made
            }
        };
        let content = format!(
            "{}\n{} {} {}\n{}\n{}\n{}",
            report_digest,
            finished.count,
            finished.newest_ms,
            finished.recent,
            branch.url,
            branch.branch,
            env!("CARGO_PKG_VERSION")
        );
        if self.published_content.as_deref() == Some(content.as_str()) {
            return Ok(None);
        }
        let key_at = |tip: Option<&str>| {
            crate::model::hash::sha256_hex(format!("{content}\n{tip:?}").as_bytes())
        };
        let tip = branch.tip()?;
        let key = key_at(tip.as_deref());
        if self.published.is_none() {
            self.published = self
                .key_file
                .as_ref()
                .and_then(|f| std::fs::read_to_string(f).ok())
                .map(|k| k.trim().to_string());
        }
        if self.published.as_deref() == Some(key.as_str()) {
            self.published_content = Some(content);
            return Ok(None);
        }
        let started = std::time::Instant::now();
        // Over the commit a render left (this process's, or the last
        // process's), only what changed is rendered; over any other tip
        // (someone else's push, a first publication) every file is, and
        // checked against the branch.
        if !self.renders_loaded {
            self.renders_loaded = true;
            if let Some(kept) = self
                .renders_file
                .as_deref()
                .and_then(super::kept_renders::load)
            {
                self.rendered = Some((kept.commit, kept.inputs));
                self.entries_recorded = kept.entries.is_some();
                self.rendered_entries = kept.entries;
            }
        }
        // Over a render whose entries it knows (this process's last, or
        // the last process's), only the operations finished since that
        // render's mark are read, and then the last operation of each
        // resource it renders, by name: nothing is kept between commits.
        let over_render = self
            .rendered
            .as_ref()
            .is_some_and(|(commit, _)| tip.as_deref() == Some(commit.as_str()));
        let since_render = match (&self.rendered_entries, mark) {
            (Some((_, at)), Some(now)) if self.entries_recorded && over_render => Some((*at, now)),
            _ => None,
        };
        // A render made without every last operation it needed is not
        // trusted by the next: its files are rendered again.
        let mut operations_unread = false;
        let partial = since_render.is_some();
        // Every resource's last operation is read along the render
        // ([`ReadAlong`]), not before it (also when what finished since
        // cannot be told apart from the rest).
        let mut read_along = false;
        let taken = match (&self.store, since_render) {
            (Some(store), Some((then, now))) => store.last_operations_since(then, now).map(|t| {
                read_along = t.is_none();
                t.map_or_else(Default::default, |(operations, changed)| {
                    (operations, Some(changed))
                })
            }),
            (Some(_), None) => {
                let recorded = self.entries_recorded;
                tracing::debug!(
                    "status branch: no render to go on from (over it: {over_render}, its entries recorded: {recorded})"
                );
                read_along = true;
                Ok(Default::default())
            }
            (None, _) => Ok(Default::default()),
        };
        // A failed read of what finished since: every resource's is read
        // along the render instead, and every file digested again over the
        // last render's (a file committed without its last operation
        // would say there was none).
        let (mut last_operations, operations_changed) = taken.unwrap_or_else(|e| {
            tracing::warn!(
                "status branch: cannot read the operations finished since the last render: {e}; reading every resource's along the render"
            );
            read_along = true;
            Default::default()
        });
        // (Without what changed, every file is digested, and every last
        // operation is read along.)
        let partial = partial && operations_changed.is_some();
        // A one-shot over the render reads the rows of the files it
        // renders alone, once it knows them (see `decided_read`).
        let by_name = partial && !self.keeps_renders && self.decided.is_none();
        let mut decided = match (self.decided.take(), &self.store) {
            (Some(kept), _) => kept,
            (None, Some(_)) if by_name => Default::default(),
            (None, Some(store)) => read_decided(store.status_decided()),
            (None, None) => Default::default(),
        };
        let (base_commit, base_digests) = match self
            .rendered
            .take()
            .filter(|(commit, _)| tip.as_deref() == Some(commit.as_str()))
        {
            Some((commit, digests)) => (Some(commit), Some(digests)),
            None => (None, None),
        };
        // Entries known unchanged only over what the state remembers as the
        // render decided it (a `decidedFrom` read back may differ from it
        // otherwise).
        let entries = self
            .rendered_entries
            .take()
            .filter(|_| self.entries_recorded);
        let unchanged = |i: usize, r: &ResourceReport| {
            entries
                .as_ref()
                .is_some_and(|(e, _)| e.holds(&entry_digests[i]))
                && operations_changed
                    .as_ref()
                    .is_some_and(|changed| !changed.contains(&r.name))
        };
        let (mut read_by_name, mut decided_of) = (None, None);
        // The entries found kept here are told to the render, which then
        // looks nothing up again for them (at 100,000 resources the
        // lookups were most of the files' making).
        let mut kept = None;
        if partial && let Some(store) = &self.store {
            let is_kept = |i: usize, r: &ResourceReport| {
                base_digests
                    .as_ref()
                    .and_then(|base| base.get(&r.name))
                    .is_some_and(|digest| *digest != AHEAD_OF_REPORT)
                    && (by_name || decided.contains_key(&r.name))
                    && unchanged(i, r)
            };
            let found: Vec<bool> = report
                .resources
                .iter()
                .enumerate()
                .map(|(i, r)| is_kept(i, r))
                .collect();
            if let (true, Some(base)) = (by_name, &base_digests) {
                decided = read_decided(super::decided_read::of_rendered(
                    store, report, &found, base,
                ));
                decided_of = Some(decided.len());
            }
            let to_render: Vec<&str> = report
                .resources
                .iter()
                .zip(&found)
                .filter(|(r, kept)| !**kept && !last_operations.contains_key(&r.name))
                .map(|(r, _)| r.name.as_str())
                .collect();
            kept = Some(found);
            if to_render.len() > READ_BY_NAME_AT_MOST {
                // Read along the render: those it renders, not those kept
                // or finished since.
                read_along = true;
            } else {
                read_by_name = Some(to_render.len());
                match store.last_operations_of(&to_render) {
                    Ok(read) => {
                        for (name, op) in read {
                            last_operations.entry(name).or_insert(op);
                        }
                    }
                    Err(e) => {
                        tracing::warn!("status branch: cannot read the last operations: {e}");
                        operations_unread = true;
                    }
                }
            }
        }
        let message = super::branch_files::commit_message(report);
        let read = started.elapsed();
        // Each file's blob is written as it is rendered: a whole render
        // holds ids, not files.
        let mut hold = branch.blob_writer();
        let mut rendered = render_reading(
            report,
            self.store.as_deref().filter(|_| read_along),
            &mut last_operations,
            &mut operations_unread,
            &decided,
            self.inputs(base_digests, &unchanged, kept.as_deref()),
            &mut hold,
        );
        // Only what changed over that commit, or every file.
        let over = base_commit.as_deref().filter(|_| rendered.over_base);
        let made = started.elapsed();
        let mut published = branch.publish(&rendered.files, &message, over, Some(tip.clone()))?;
        // (The tip moved under the changes: rendered whole and published
        // again, so such a cycle may push up to twice `attempts` times.)
        if matches!(published, Published::NeedsEveryFile) {
            // (After a partial read, every resource's is read along, and
            // what each file was decided from.)
            drop(rendered);
            if let (true, Some(store)) = (by_name, &self.store) {
                decided = read_decided(store.status_decided());
            }
            rendered = render_reading(
                report,
                self.store.as_deref().filter(|_| read_along || partial),
                &mut last_operations,
                &mut operations_unread,
                &decided,
                self.inputs(None, &super::branch_files::none_unchanged, None),
                &mut hold,
            );
            published = branch.publish(&rendered.files, &message, None, None)?;
            if matches!(published, Published::NeedsEveryFile) {
                // Cannot happen with every file; nothing was written, so
                // nothing is remembered as published.
                return Ok(None);
            }
        }
        tracing::debug!(
            "status branch: {} resource files rendered, {} kept; the state read in {read:?}, the files made in {:?}, published in {:?}{}{}{}",
            rendered.rendered,
            report.resources.len() - rendered.rendered,
            made - read,
            started.elapsed() - made,
            read_by_name
                .map(|n| format!("; the last operations of {n} resources read by name"))
                .unwrap_or_default(),
            decided_of
                .map(|n| format!("; what {n} files were decided from read"))
                .unwrap_or_default(),
            match rendered.ahead {
                0 => String::new(),
                n => format!("; {n} with an operation newer than the report, made again next"),
            }
        );
        let Rendered {
            decided: changes,
            inputs,
            ahead,
            ..
        } = rendered;
        // Remembered once the files are on the branch (a failed push keeps
        // the old commits, which the next attempt still finds).
        if let Some(store) = &self.store {
            let recorded = store.record_status_decided(&changes);
            self.entries_recorded = recorded.is_ok() && !operations_unread;
            match recorded {
                Ok(()) if self.keeps_renders => {
                    let mut decided = decided;
                    for (name, now) in changes {
                        match now {
                            Some(now) => decided.insert(name, now),
                            None => decided.remove(&name),
                        };
                    }
                    self.decided = Some(decided);
                }
                Ok(()) => {}
                Err(e) => tracing::warn!(
                    "status branch: cannot remember what each file was decided from: {e}"
                ),
            }
        }
        // The key of what the branch holds now; none, when files were
        // made from operations newer than the report: the next
        // publication makes them again, even of the same report and mark.
        let (key, now_at) = match &published {
            Published::Committed(id) | Published::Unchanged(id) => {
                (key_at(Some(id)), Some(id.clone()))
            }
            // (Returned above.)
            Published::NeedsEveryFile => (key, None),
        };
        let (key, content) = match ahead {
            0 => (key, content),
            _ => (String::new(), String::new()),
        };
        self.rendered = now_at
            .filter(|_| !inputs.is_empty())
            .map(|commit| (commit, inputs));
        self.rendered_entries = self
            .rendered
            .as_ref()
            .and(mark)
            .map(|mark| (EntryDigests::of(entry_digests), mark));
        self.renders_saved = false;
        if let Some(file) = &self.key_file
            && let Err(e) = super::files::write_atomically(file, format!("{key}\n").as_bytes())
        {
            tracing::warn!(
                "status branch: cannot remember what was published in {}: {e}",
                file.display()
            );
        }
        self.published = Some(key);
        self.published_content = Some(content);
        Ok(match published {
            Published::Committed(id) => Some(id),
            Published::Unchanged(_) | Published::NeedsEveryFile => None,
        })
    }
}

/// What was rendered is kept for the next process when the publisher goes
/// (once, not at every status commit: at 100,000 resources the file is
/// 8 MB). A process killed before leaves an older file, for an older
/// commit: the next renders every file once.
impl Drop for StatusPublisher {
    fn drop(&mut self) {
        if self.renders_saved {
            return;
        }
        if let Some(file) = &self.renders_file {
            let entries = self
                .rendered_entries
                .as_ref()
                .filter(|_| self.entries_recorded)
                .map(|(entries, mark)| (entries, *mark));
            super::kept_renders::keep_logged(file, self.rendered.as_ref(), entries);
        }
    }
}

/// What each file was decided from, or (warned) nothing: every file is
/// decided again, from the commit the render is made at.
fn read_decided(read: Result<DecidedFrom, crate::journal::StateError>) -> DecidedFrom {
    read.unwrap_or_else(|e| {
        tracing::warn!("status branch: cannot read what each file was decided from: {e}");
        Default::default()
    })
}

/// The most resources whose last operations a status commit over a known
/// render reads by name before rendering, a hundred a query; with more,
/// every resource's is read along the render, a thousand at a time
/// ([`super::last_operations::ReadAlong`]).
const READ_BY_NAME_AT_MOST: usize = 200;

/// `report`'s digest, timed in the debug log.
fn timed_digest(report: &Report) -> Digested {
    let started = std::time::Instant::now();
    let digested = super::report_digest::digest(report);
    tracing::debug!("the report digested in {:?}", started.elapsed());
    digested
}
