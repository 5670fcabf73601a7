//! `tend override set|clear|list`: break-glass overrides on the agent's
//! host, for when Git is unreachable. Reported as `source: local` until Git
//! carries the override; they work beside a running `tend run`/`apply`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use std::time::SystemTime;

use clap::{Args, Subcommand};

use super::exit;
use crate::config::Config;
use crate::journal::StateStore;
use crate::model::overrides::{
    IGNORE_FIELDS, OVERRIDE_EXPIRES, OVERRIDE_ON_EXPIRY, OVERRIDE_REASON, PAUSED,
    parse_override_strings,
};

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
}

/// The state store: read-write for `set` and `clear`, read-only for
/// `list` (which must work on a state dir this user may only read).
/// `None`: a read-only open of a state dir with no state yet.
fn open(config_path: &Path, writer: bool) -> Result<Option<StateStore>, u8> {
    let config = Config::load(config_path).map_err(|e| {
        let _ = writeln!(io::stderr(), "tend: {e}");
        exit::CONFIG
    })?;
    let opened = if writer {
        StateStore::open_for_overrides(&config.state_dir).map(Some)
    } else {
        StateStore::open(&config.state_dir, false)
    };
    opened.map_err(|e| {
        let _ = writeln!(io::stderr(), "tend: {e}");
        exit::ERROR
    })
}

pub fn run(config_path: &Path, command: &OverrideCommand) -> io::Result<u8> {
    let store = match open(config_path, !matches!(command, OverrideCommand::List)) {
        Ok(Some(s)) => s,
        Ok(None) => {
            writeln!(io::stdout(), "(no local overrides)")?;
            return Ok(exit::OK);
        }
        Err(code) => return Ok(code),
    };
    let result = match command {
        OverrideCommand::Set(args) => set(&store, args),
        OverrideCommand::Clear { name } => match store.clear_local_override(name) {
            Ok(true) => Ok(format!("cleared the local override of {name}\n")),
            Ok(false) => Ok(format!("{name} has no local override\n")),
            Err(e) => Err(e.to_string()),
        },
        OverrideCommand::List => list(&store),
    };
    match result {
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

fn set(store: &StateStore, args: &SetArgs) -> Result<String, String> {
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
    // The same rules as annotations in Git: a typo is refused, never stored.
    let parsed = parse_override_strings(&annotations)?;
    if parsed.overrides.is_none() {
        return Err("give --pause or --ignore-fields".into());
    }
    store
        .set_local_override(&args.name, &annotations, SystemTime::now())
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "set a local override on {} (reported as source local until Git carries an override)\n",
        args.name
    ))
}

fn list(store: &StateStore) -> Result<String, String> {
    let rows = store.local_overrides().map_err(|e| e.to_string())?;
    if rows.is_empty() {
        return Ok("(no local overrides)\n".into());
    }
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
                    corrupt.name, corrupt.problem
                ));
                continue;
            }
        };
        let short = |k: &str| k.strip_prefix("tend.dev/").unwrap_or(k).to_string();
        let details: Vec<String> = annotations
            .iter()
            .map(|(k, v)| format!("{}={v}", short(k)))
            .collect();
        out.push_str(&format!(
            "{name}  set {}  {}\n",
            crate::time::rfc3339(set_at),
            details.join("  ")
        ));
    }
    Ok(out)
}
