//! `tend deletions list|approve`: the deletions tend has pending, and an
//! operator's approval of deletions the mass-deletion guard holds. Works
//! beside a running `tend run` or `tend apply` (no writer lock): the
//! approval is read at the next cycle.

use std::io::{self, Write};
use std::path::Path;

use clap::{Args, Subcommand};

use super::{exit, session};
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

pub fn run(config_path: &Path, command: &DeletionsCommand) -> io::Result<u8> {
    let config = match session::load_config(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let opened = match command {
        DeletionsCommand::List => StateStore::open_configured(&config, false),
        DeletionsCommand::Approve(_) => {
            StateStore::open_configured_for_overrides(&config).map(Some)
        }
    };
    let store = match opened {
        Ok(Some(store)) => store,
        Ok(None) => {
            writeln!(
                io::stdout(),
                "(no pending deletions: nothing was applied yet)"
            )?;
            return Ok(exit::OK);
        }
        Err(e) => {
            session::fail(e);
            return Ok(exit::ERROR);
        }
    };
    let result = match command {
        DeletionsCommand::List => list(&store),
        DeletionsCommand::Approve(args) => approve(&store, args),
    };
    match result {
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
fn pending_deletions(store: &StateStore) -> Result<Vec<crate::journal::TombstoneRow>, String> {
    Ok(store
        .tombstones()
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter_map(Result::ok)
        .filter(|t| t.last.spec.deletion_policy == DeletionPolicy::Delete)
        .collect())
}

fn list(store: &StateStore) -> Result<String, String> {
    let pending = pending_deletions(store)?;
    if pending.is_empty() {
        return Ok("(no pending deletions)\n".into());
    }
    let held = store.held_deletions().map_err(|e| e.to_string())?;
    let approvals = store.approvals().map_err(|e| e.to_string())?;
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

fn approve(store: &StateStore, args: &ApproveArgs) -> Result<String, String> {
    if args.reason.trim().is_empty() {
        return Err("--reason must say why (a ticket, a change request)".into());
    }
    let pending = pending_deletions(store)?;
    let unknown: Vec<&str> = args
        .names
        .iter()
        .filter(|n| !pending.iter().any(|t| &t.name == *n))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "no removed declaration with deletionPolicy Delete is named {}: `tend deletions list` shows the pending deletions",
            unknown.join(", ")
        ));
    }
    let now = std::time::SystemTime::now();
    let mut out = String::new();
    for name in &args.names {
        store
            .approve_deletion(name, args.reason.trim(), now)
            .map_err(|e| e.to_string())?;
        out.push_str(&format!(
            "approved the deletion of {}: {}\n",
            crate::escape::terminal(name),
            crate::escape::terminal(args.reason.trim())
        ));
    }
    Ok(out)
}
