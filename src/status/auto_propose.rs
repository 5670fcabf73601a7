//! `[status] propose = true`: a proposal branch kept for every overridden
//! resource with out-of-band drift, updated while the drift lasts, deleted
//! when the declaration catches up. Part of the status step.
//!
//! # Guarantees
//! * The same rules as `tend propose --output branch`: never the tracked
//!   branch, never over someone else's commit, fast-forwards only.
//! * A branch is deleted only when every commit on it is this agent's.
//! * Nothing is fetched or pushed while what is proposable stays the same.

use std::collections::{BTreeMap, BTreeSet};

use super::report::{Report, ResourceReport};
use crate::cause::Cause;
use crate::engine::Drift;
use crate::propose::branch::{BranchOutcome, ProposalBranch, ProposalBranchError, branch_name};
use crate::propose::{ProposeError, propose};
use crate::source::{SourceError, transport};

/// Why a resource's proposal branch could not be kept.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AutoProposeError {
    /// No proposal can be made from the drift or the declaration.
    #[error(transparent)]
    Propose(#[from] ProposeError),
    /// The declaration's file cannot be read at the commit.
    #[error(transparent)]
    Declaration(#[from] Cause),
    /// The branch could not be written or deleted.
    #[error(transparent)]
    Branch(#[from] ProposalBranchError),
    /// The remote's proposal branches could not be listed.
    #[error(transparent)]
    Remote(#[from] SourceError),
}

/// What one round did.
#[derive(Debug, Default)]
pub(crate) struct AutoOutcome {
    /// Branches created or updated, by resource.
    pub pushed: Vec<(String, BranchOutcome)>,
    /// Branches deleted (the declaration caught up).
    pub deleted: Vec<String>,
    /// What could not be proposed, by resource (none for listing the
    /// remote's branches).
    pub errors: Vec<(String, AutoProposeError)>,
}

/// Keeps the proposal branches of one agent.
pub(crate) struct AutoPropose {
    pub target: ProposalBranch,
    /// What was proposable at the last round: while it stays the same,
    /// nothing is done.
    last: Option<String>,
}

/// The resources whose drift a proposal branch keeps: overridden, with
/// out-of-band drift.
fn proposable(report: &Report) -> Vec<&ResourceReport> {
    report
        .entries()
        .filter(|r| r.propose.is_some() && r.override_.is_some())
        .collect()
}

impl AutoOutcome {
    /// Logs what was done (each branch, each failure).
    pub(crate) fn log(&self) {
        for (name, outcome) in &self.pushed {
            tracing::info!(resource = %name, "proposal branch {}: {outcome}", branch_name(name));
        }
        for name in &self.deleted {
            tracing::info!(
                resource = %name,
                "proposal branch {} deleted: the declaration caught up",
                branch_name(name)
            );
        }
        for (name, error) in &self.errors {
            tracing::warn!(resource = %name, "propose: {error}");
        }
    }
}

impl AutoPropose {
    pub(crate) fn new(target: ProposalBranch) -> Self {
        AutoPropose { target, last: None }
    }

    /// One round over `report` (blocking: Git).
    pub(crate) fn run(&mut self, report: &Report) -> AutoOutcome {
        let mut out = AutoOutcome::default();
        let Some(commit) = report.source.commit.as_deref() else {
            return out;
        };
        // Only while the branch can be read: a proposal is made against
        // its head.
        if report.source.error.is_some() {
            return out;
        }
        let wanted = proposable(report);
        let key = serde_json::to_string(&(
            commit,
            wanted
                .iter()
                .map(|r| (&r.name, &r.drift))
                .collect::<Vec<_>>(),
        ))
        .unwrap_or_default();
        if self.last.as_deref() == Some(key.as_str()) {
            return out;
        }
        let mut failed = false;
        let mut names = BTreeSet::new();
        for r in &wanted {
            names.insert(r.name.clone());
            match self.propose_one(r, commit) {
                Ok(Some(o)) => out.pushed.push((r.name.clone(), o)),
                Ok(None) => {}
                Err(e) => {
                    failed = true;
                    out.errors.push((r.name.clone(), e));
                }
            }
        }
        match self.existing() {
            Ok(existing) => {
                for name in existing.difference(&names) {
                    match self.target.delete_if_ours(name, commit) {
                        Ok(true) => out.deleted.push(name.clone()),
                        Ok(false) => {}
                        Err(e) => {
                            failed = true;
                            out.errors.push((name.clone(), e.into()));
                        }
                    }
                }
            }
            Err(e) => {
                failed = true;
                out.errors.push((String::new(), e.into()));
            }
        }
        if !failed {
            self.last = Some(key);
        }
        out
    }

    fn propose_one(
        &self,
        r: &ResourceReport,
        commit: &str,
    ) -> Result<Option<BranchOutcome>, AutoProposeError> {
        let drift: Vec<Drift> = r
            .drift
            .iter()
            .map(|d| Drift {
                field: d.field.clone(),
                desired: d.desired.clone(),
                observed: d.observed.clone(),
                origin: d.origin,
                ignored: d.ignored,
            })
            .collect();
        let selected = match crate::propose::selected(&r.name, &drift, None) {
            Ok(s) => s,
            Err(ProposeError::NothingToPropose { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let text = crate::propose::file_at(&self.target.repo_dir, commit, &r.file)?;
        let reasons: Vec<String> = r
            .override_
            .iter()
            .map(|o| o.reason.clone())
            .filter(|s| !s.is_empty())
            .collect();
        let proposal = propose(
            &text,
            &r.file,
            &r.name,
            &selected,
            &BTreeMap::new(),
            &reasons,
        )?;
        let message = crate::propose::commit_message(&proposal, &self.target.agent_id, commit);
        self.target
            .push(&proposal, commit, &message)
            .map(Some)
            .map_err(AutoProposeError::from)
    }

    /// The resources that have a proposal branch at the remote.
    fn existing(&self) -> Result<BTreeSet<String>, SourceError> {
        transport::fetch_branches(
            &self.target.repo_dir,
            &self.target.url,
            &self.target.credentials,
            &branch_name(""),
            "refs/tend/propose/heads/",
        )
        .map(|names| names.into_iter().collect())
    }
}
