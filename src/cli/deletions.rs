//! `tend deletions list|approve`: the deletions tend has pending, and an
//! operator's approval of deletions the mass-deletion guard holds (carried
//! out by the running agent when there is one: [`super::operator`]).

use std::io::{self, Write};
use std::path::Path;

use clap::{Args, Subcommand};

use super::command_error::CommandError;
use super::{exit, session};
use crate::control::Request;
use crate::journal::StateStore;
use crate::model::DeletionPolicy;

#[derive(Debug, Subcommand)]
pub enum DeletionsCommand {
    /// Removed declarations with deletionPolicy Delete, and whether the
    /// mass-deletion guard holds them.
    List,
    /// Approve held deletions by name (journalled; shown in reports).
    Approve(ApproveArgs),
}

#[derive(Debug, Args)]
pub struct ApproveArgs {
    /// The removed declarations' metadata.name.
    #[arg(required = true)]
    pub names: Vec<String>,
    /// Why (a ticket, a change request). Required.
    #[arg(long)]
    pub reason: String,
}

pub(super) fn run(config_path: &Path, command: &DeletionsCommand) -> io::Result<u8> {
    if let DeletionsCommand::Approve(args) = command {
        return super::operator::run(
            config_path,
            &Request::DeletionsApprove {
                names: args.names.clone(),
                reason: args.reason.clone(),
            },
        );
    }
    let config = match session::load_config(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let store = match StateStore::open_configured(&config, false) {
        Ok(Some(store)) => store,
        Ok(None) => {
            writeln!(
                io::stdout(),
                "(no pending deletions: nothing was applied yet)"
            )?;
            return Ok(exit::OK);
        }
        Err(e) => return Ok(session::state_failed(&e)),
    };
    match list(&store) {
        Ok(text) => {
            write!(io::stdout(), "{text}")?;
            Ok(exit::OK)
        }
        Err(message) => {
            writeln!(io::stderr(), "tend deletions: {message}")?;
            Ok(exit::ERROR)
        }
    }
}

/// Names of removed declarations whose deletion tend will attempt.
fn pending_deletions(
    store: &StateStore,
) -> Result<Vec<crate::journal::TombstoneRow>, CommandError> {
    Ok(store
        .tombstones()?
        .into_iter()
        .filter_map(Result::ok)
        .filter(|t| t.last.spec.deletion_policy == DeletionPolicy::Delete)
        .collect())
}

fn list(store: &StateStore) -> Result<String, CommandError> {
    let pending = pending_deletions(store)?;
    if pending.is_empty() {
        return Ok("(no pending deletions)\n".into());
    }
    let held = store.held_deletions()?;
    let approvals = store.approvals()?;
    let mut out = String::new();
    for t in pending {
        let status = match (held.get(&t.name), approvals.get(&t.name)) {
            (_, Some(a)) => format!(
                "approved {}: {}",
                crate::time::rfc3339(a.approved_at),
                crate::escape::terminal(&a.reason)
            ),
            (Some(h), None) => format!(
                "HELD by the mass-deletion guard since {} ({} due together)",
                crate::time::rfc3339(h.since),
                h.due_together
            ),
            (None, None) => "not held".into(),
        };
        out.push_str(&format!(
            "{}  removed {} in {}  {status}\n",
            crate::escape::terminal(&t.name),
            crate::time::rfc3339(t.removed_at),
            t.removal_commit.get(..12).unwrap_or(&t.removal_commit),
        ));
    }
    Ok(out)
}
