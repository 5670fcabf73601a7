//! `tend override set|clear|list`: break-glass overrides on the agent's
//! host, for when Git is unreachable. Reported as `source: local` until Git
//! carries the override. `set` and `clear` are carried out by the running
//! agent when there is one ([`super::operator`]).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

use clap::{Args, Subcommand};

use super::command_error::CommandError;
use super::exit;
use crate::config::Config;
use crate::control::Request;
use crate::escape::terminal as esc;
use crate::journal::StateStore;
use crate::model::overrides::{
    IGNORE_FIELDS, OVERRIDE_EXPIRES, OVERRIDE_ON_EXPIRY, OVERRIDE_REASON, PAUSED,
};
use crate::source::Snapshot;

#[derive(Debug, Subcommand)]
pub enum OverrideCommand {
    /// Set (replace) the local override of a declaration.
    Set(SetArgs),
    /// Remove the local override of a declaration.
    Clear {
        /// The declaration's metadata.name.
        name: String,
    },
    /// List local overrides.
    List,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// The declaration's metadata.name.
    pub name: String,
    /// Observe and report, change nothing.
    #[arg(long)]
    pub pause: bool,
    /// Leave these fields as they are (comma-separated; mutable fields or
    /// `parameters.<name>`).
    #[arg(long, value_name = "FIELDS")]
    pub ignore_fields: Option<String>,
    /// Why (a ticket, an incident). Required.
    #[arg(long)]
    pub reason: String,
    /// RFC 3339 time or a duration (`4h`) counted from now.
    #[arg(long)]
    pub expires: Option<String>,
    /// `hold` (default) or `resume`.
    #[arg(long, value_name = "hold|resume")]
    pub on_expiry: Option<String>,
    /// Set it although no declaration of that name is known (it is then
    /// reported as orphaned until one exists).
    #[arg(long)]
    pub force: bool,
}

pub(super) fn run(config_path: &Path, command: &OverrideCommand) -> io::Result<u8> {
    match command {
        OverrideCommand::Set(args) => super::operator::run(config_path, &set_request(args)),
        OverrideCommand::Clear { name } => {
            super::operator::run(config_path, &Request::OverrideClear { name: name.clone() })
        }
        OverrideCommand::List => run_list(config_path),
    }
}

/// The request `tend override set` makes: the annotations the flags stand
/// for (checked where it is carried out, by the rules of annotations).
fn set_request(args: &SetArgs) -> Request {
    let mut annotations = BTreeMap::new();
    if args.pause {
        annotations.insert(PAUSED.to_string(), "true".to_string());
    }
    if let Some(fields) = &args.ignore_fields {
        annotations.insert(IGNORE_FIELDS.to_string(), fields.clone());
    }
    annotations.insert(OVERRIDE_REASON.to_string(), args.reason.clone());
    if let Some(expires) = &args.expires {
        annotations.insert(OVERRIDE_EXPIRES.to_string(), expires.clone());
    }
    if let Some(on_expiry) = &args.on_expiry {
        annotations.insert(OVERRIDE_ON_EXPIRY.to_string(), on_expiry.clone());
    }
    Request::OverrideSet {
        name: args.name.clone(),
        annotations,
        force: args.force,
    }
}

/// `tend override list`: read-only (it works on a state dir this user may
/// only read).
fn run_list(config_path: &Path) -> io::Result<u8> {
    let config = match super::session::load_config(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let store = match StateStore::open_configured(&config, false) {
        Ok(Some(store)) => store,
        Ok(None) => {
            writeln!(io::stdout(), "(no local overrides)")?;
            return Ok(exit::OK);
        }
        Err(e) => return Ok(super::session::state_failed(&e)),
    };
    match list(&config, &store) {
        Ok(text) => {
            write!(io::stdout(), "{text}")?;
            Ok(exit::OK)
        }
        Err(message) => {
            writeln!(io::stderr(), "tend override: {message}")?;
            Ok(exit::ERROR)
        }
    }
}

/// Whether `name` is a declaration of `snapshot` or a resource of the
/// state (a removed declaration whose database tend still owns counts:
/// pausing its deletion is a fair emergency).
fn is_known(name: &str, snapshot: &Snapshot, store: &StateStore) -> Result<bool, CommandError> {
    Ok(snapshot.declared(name).is_some() || store.knows_resource(name)?)
}

fn list(config: &Config, store: &StateStore) -> Result<String, CommandError> {
    let rows = store.local_overrides()?;
    if rows.is_empty() {
        return Ok("(no local overrides)\n".into());
    }
    // Without the last accepted commit, orphans cannot be told apart: the
    // list is still shown (it is what an operator needs in an outage).
    let snapshot = super::operator::accepted_declarations(config).unwrap_or_else(|e| {
        let _ = writeln!(
            io::stderr(),
            "tend override: cannot tell orphaned overrides apart: {}",
            esc(&e.to_string())
        );
        None
    });
    let mut out = String::new();
    for row in rows {
        let crate::journal::LocalOverride {
            name,
            annotations,
            set_at,
        } = match row {
            Ok(o) => o,
            Err(corrupt) => {
                // An unreadable override is shown, never hidden: the
                // resource it belongs to is held in `Error` until repaired.
                out.push_str(&format!(
                    "{}  UNREADABLE: {}\n",
                    esc(&corrupt.name),
                    esc(&corrupt.problem)
                ));
                continue;
            }
        };
        let short = |k: &str| k.strip_prefix("tend.dev/").unwrap_or(k).to_string();
        let details: Vec<String> = annotations
            .iter()
            .map(|(k, v)| format!("{}={}", esc(&short(k)), esc(v)))
            .collect();
        let orphaned = match &snapshot {
            Some(snapshot) => !is_known(&name, snapshot, store)?,
            None => false,
        };
        out.push_str(&format!(
            "{}  set {}  {}{}\n",
            esc(&name),
            crate::time::rfc3339(set_at),
            details.join("  "),
            if orphaned {
                "  ORPHANED: no declaration or resource of this name; it protects nothing"
            } else {
                ""
            }
        ));
    }
    Ok(out)
}
