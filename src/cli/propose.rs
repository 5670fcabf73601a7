//! `tend propose NAME`: the declaration change that makes Git declare what
//! the provider shows, as a patch or a branch in the source remote.

use std::io::{self, Write};
use std::path::Path;

use clap::{Args, ValueEnum};

use super::{exit, session};
use crate::escape::terminal as esc;
use crate::journal::Access;
use crate::propose::branch::{ProposalBranch, branch_name, pull_request_url};
use crate::propose::{Proposal, ProposeError, propose, selected, unified_diff};
use crate::reconcile::Mode;
use crate::status::render::value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProposeOutput {
    /// A unified diff on stdout (`git apply`, `patch -p1`).
    Patch,
    /// A commit on `tend/propose/NAME` in the source remote.
    Branch,
}

#[derive(Debug, Args)]
pub struct ProposeArgs {
    /// The declaration's metadata.name.
    pub name: String,
    /// Only these fields (comma-separated paths: connectionLimit,
    /// parameters.work_mem); default: every field with out-of-band drift.
    #[arg(long, value_delimiter = ',')]
    pub fields: Option<Vec<String>>,
    #[arg(long, value_enum, default_value = "patch")]
    pub output: ProposeOutput,
}

pub(super) fn run(config_path: &Path, args: &ProposeArgs) -> io::Result<u8> {
    let agent = match session::open_agent(config_path, Access::ReadOnly) {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    session::one_cycle(
        &agent,
        Mode::Plan,
        |_| Ok(()),
        |result| {
            let mut err = io::stderr().lock();
            if result.source_failure.is_some() {
                writeln!(
                    err,
                    "tend: the tracked branch cannot be read (above): a proposal is made against its head, so nothing is proposed"
                )?;
                return Ok(exit::ERROR);
            }
            let Some(plan) = result.outcome.map(|o| o.latest()) else {
                return Ok(exit::ERROR);
            };
            let Some(r) = plan.resources.iter().find(|r| r.name == args.name) else {
                writeln!(
                    err,
                    "tend: no declaration named `{}` at commit {}",
                    esc(&args.name),
                    plan.commit.as_deref().unwrap_or("?")
                )?;
                return Ok(exit::ERROR);
            };
            let Some(commit) = plan.commit.as_deref() else {
                return Ok(exit::ERROR);
            };
            let d = &r.decision;
            let drift = match selected(&r.name, &d.drift, args.fields.as_deref()) {
                Ok(drift) => drift,
                Err(e) => {
                    writeln!(err, "tend: {}", esc(&e.to_string()))?;
                    return Ok(exit::ERROR);
                }
            };
            let repo_dir = agent.source_repo_dir();
            let text = match crate::propose::file_at(&repo_dir, commit, &r.file) {
                Ok(t) => t,
                Err(e) => {
                    writeln!(err, "tend: cannot read the declaration: {e}")?;
                    return Ok(exit::ERROR);
                }
            };
            let proposal = match propose(
                &text,
                &r.file,
                &r.name,
                &drift,
                &r.memory.drift_first_seen,
                &d.overrides.reasons,
            ) {
                Ok(p) => p,
                Err(e @ ProposeError::NothingToPropose { .. }) => {
                    writeln!(err, "tend: {e}")?;
                    return Ok(exit::ERROR);
                }
                Err(e) => {
                    writeln!(err, "tend: {}", esc(&e.to_string()))?;
                    return Ok(exit::ERROR);
                }
            };
            for c in &proposal.changes {
                writeln!(
                    err,
                    "{}: {}: declared {}, the provider shows {}",
                    esc(&proposal.file),
                    esc(&c.field),
                    value(&c.declared),
                    value(&c.observed)
                )?;
            }
            if !proposal.removed_annotations.is_empty() {
                writeln!(
                    err,
                    "removes {} (they existed only for these fields)",
                    proposal.removed_annotations.join(", ")
                )?;
            }
            if d.overrides
                .sources
                .contains(&crate::engine::OverrideSource::Local)
            {
                writeln!(
                    err,
                    "a local override is set on this host: `tend override clear {}` once the change is merged",
                    esc(&r.name)
                )?;
            }
            match args.output {
                ProposeOutput::Patch => {
                    write!(io::stdout().lock(), "{}", unified_diff(&proposal))?;
                    Ok(exit::OK)
                }
                ProposeOutput::Branch => push_branch(&agent, &proposal, commit, &mut err),
            }
        },
    )
}

fn push_branch(
    agent: &crate::agent::Agent,
    proposal: &Proposal,
    base: &str,
    err: &mut impl Write,
) -> io::Result<u8> {
    push_to_branch(
        agent,
        &branch_name(&proposal.name),
        &[(proposal.file.clone(), proposal.after.clone())],
        false,
        base,
        &crate::propose::commit_message(proposal, agent.agent_id(), base),
        err,
    )
}

/// Commits `files` on `branch` of the source remote (on top of the
/// tracked commit `base`) and says where, with the pull-request page
/// when the host has one: `tend propose` and `tend import`. `new_files`:
/// refuse a path the tracked commit has (import never overwrites).
pub(super) fn push_to_branch(
    agent: &crate::agent::Agent,
    branch: &str,
    files: &[(String, String)],
    new_files: bool,
    base: &str,
    message: &str,
    err: &mut impl Write,
) -> io::Result<u8> {
    let source = agent.source_settings();
    let target = ProposalBranch {
        repo_dir: agent.source_repo_dir(),
        url: source.url.clone(),
        credentials: source.credentials.clone(),
        agent_id: agent.agent_id().to_string(),
        base_branch: source.branch.clone(),
    };
    let outcome = match target.push_files(branch, files, new_files, base, message) {
        Ok(o) => o,
        Err(e) => {
            writeln!(err, "tend: {}", esc(&e.to_string()))?;
            return Ok(exit::ERROR);
        }
    };
    let mut out = io::stdout().lock();
    writeln!(out, "{branch}: {outcome}")?;
    if let Some(pr) = pull_request_url(&source.url, &source.branch, branch) {
        writeln!(out, "open a pull request: {pr}")?;
    }
    Ok(exit::OK)
}
