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
use crate::escape::terminal as esc;
use crate::journal::{Access, StateStore};
use crate::model::overrides::{
    IGNORE_FIELDS, OVERRIDE_EXPIRES, OVERRIDE_ON_EXPIRY, OVERRIDE_REASON, PAUSED,
    parse_override_strings,
};
use crate::model::validate::is_dns_label;
use crate::source::{Snapshot, Source};
use std::sync::Arc;

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

/// The state store: read-write for `set` and `clear`, read-only for
/// `list` (which must work on a state dir this user may only read).
/// `None`: a read-only open of a state dir with no state yet.
fn open(config_path: &Path, writer: bool) -> Result<(Config, Option<StateStore>), u8> {
    let config = Config::load(config_path).map_err(|e| {
        let _ = writeln!(io::stderr(), "tend: {e}");
        exit::CONFIG
    })?;
    let opened = if writer {
        StateStore::open_configured_for_overrides(&config).map(Some)
    } else {
        StateStore::open_configured(&config, false)
    };
    let store = opened.map_err(|e| {
        let _ = writeln!(io::stderr(), "tend: {e}");
        exit::ERROR
    })?;
    Ok((config, store))
}

pub fn run(config_path: &Path, command: &OverrideCommand) -> io::Result<u8> {
    let (config, store) = match open(config_path, !matches!(command, OverrideCommand::List)) {
        Ok((config, Some(s))) => (config, s),
        Ok((_, None)) => {
            writeln!(io::stdout(), "(no local overrides)")?;
            return Ok(exit::OK);
        }
        Err(code) => return Ok(code),
    };
    let result = match command {
        OverrideCommand::Set(args) => set(&config, &store, args),
        OverrideCommand::Clear { name } => match store.clear_local_override(name) {
            Ok(true) => Ok(format!("cleared the local override of {name}\n")),
            Ok(false) => Ok(format!("{name} has no local override\n")),
            Err(e) => Err(e.to_string()),
        },
        OverrideCommand::List => list(&config, &store),
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

/// The declarations of the last accepted commit, read from the state dir
/// without fetching (Git may be what is down).
fn accepted_declarations(config: &Config) -> Result<Option<Arc<Snapshot>>, String> {
    let settings = config.source_settings().map_err(|e| e.to_string())?;
    Source::open(&config.state_dir, settings, Access::ReadOnly)
        .and_then(Source::accepted_snapshot)
        .map_err(|e| e.to_string())
}

/// Whether `name` is a declaration of `snapshot` or a resource of the
/// state (a removed declaration whose database tend still owns counts:
/// pausing its deletion is a fair emergency).
fn is_known(name: &str, snapshot: &Snapshot, store: &StateStore) -> Result<bool, String> {
    Ok(crate::reconcile::inputs::declared(snapshot, name).is_some()
        || store.knows_resource(name).map_err(|e| e.to_string())?)
}

fn set(config: &Config, store: &StateStore, args: &SetArgs) -> Result<String, String> {
    // Never stored, even with --force: no declaration can have this name.
    if !is_dns_label(&args.name) {
        return Err(format!(
            "`{}` cannot be a declaration's name: metadata.name is a lowercase DNS label (a-z, 0-9 and `-`, at most 63 characters)",
            esc(&args.name)
        ));
    }
    let unknown = match accepted_declarations(config) {
        Ok(Some(snapshot)) => (!is_known(&args.name, &snapshot, store)?).then(|| {
            format!(
                "no declaration named `{}` in the last accepted commit {} ({} declarations) and no such resource in the state",
                args.name,
                snapshot.commit.get(..12).unwrap_or(&snapshot.commit),
                snapshot.declarations.declarations.len()
            )
        }),
        Ok(None) => (!store.knows_resource(&args.name).map_err(|e| e.to_string())?)
            .then(|| "no commit has been accepted yet, so the name cannot be checked".to_string()),
        Err(e) => (!store.knows_resource(&args.name).map_err(|e| e.to_string())?)
            .then(|| format!("the last accepted commit cannot be read ({e}), so the name cannot be checked")),
    };
    if let Some(why) = &unknown
        && !args.force
    {
        return Err(format!(
            "{why}. Check the name (`tend plan` lists every resource); to set it anyway, add --force"
        ));
    }
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
    let now = SystemTime::now();
    store
        .set_local_override(&args.name, &annotations, now)
        .map_err(|e| e.to_string())?;
    let mut out = format!(
        "set a local override on {} (reported as source local until Git carries an override)\n",
        args.name
    );
    // An expiry already past is allowed (a runbook rehearses with one), but
    // in an emergency it is more likely a typo in the date.
    if let Some(spec) = &parsed.overrides
        && let Some(crate::model::OverrideExpiry::At(at)) = spec.expires
        && at <= now
    {
        let honoured = match spec.on_expiry {
            crate::model::OnExpiry::Hold => "still honoured (on expiry: hold)",
            crate::model::OnExpiry::Resume => "not honoured (on expiry: resume)",
        };
        out.push_str(&format!(
            "warning: --expires {} is already past: the override is reported EXPIRED from the start and {honoured}; was another date meant?\n",
            spec.expires_text.as_deref().unwrap_or("")
        ));
    }
    if let Some(why) = unknown {
        out.push_str(&format!(
            "warning: {why}: the override is orphaned and protects nothing until a declaration of that name exists\n"
        ));
    }
    Ok(out)
}

fn list(config: &Config, store: &StateStore) -> Result<String, String> {
    let rows = store.local_overrides().map_err(|e| e.to_string())?;
    if rows.is_empty() {
        return Ok("(no local overrides)\n".into());
    }
    // Without the last accepted commit, orphans cannot be told apart: the
    // list is still shown (it is what an operator needs in an outage).
    let snapshot = accepted_declarations(config).unwrap_or_else(|e| {
        let _ = writeln!(
            io::stderr(),
            "tend override: cannot tell orphaned overrides apart: {}",
            esc(&e)
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
