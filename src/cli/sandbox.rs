//! `tend sandbox list|edit|drop`: the sandbox provider's "dashboard", to
//! change external state as an operator would.

use std::io::{self, Write};
use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::command_error::CommandError;
use super::exit;
use crate::config::{Config, ProviderConfig};
use crate::provider::sandbox::{SandboxDatabase, SandboxProvider};

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// List the sandbox's databases.
    List(SandboxTarget),
    /// Change a database behind tend's back.
    Edit(EditArgs),
    /// Drop a database behind tend's back.
    Drop(DropArgs),
}

#[derive(Debug, Args)]
pub struct SandboxTarget {
    /// The sandbox provider (default: the only one configured).
    #[arg(long)]
    pub provider: Option<String>,
}

#[derive(Debug, Args)]
pub struct EditArgs {
    /// Database name at the provider.
    pub name: String,
    #[command(flatten)]
    pub target: SandboxTarget,
    /// Set a field: `connectionLimit=500`, `parameters.work_mem=8MB` (JSON
    /// values are parsed; anything else is a string; empty unsets).
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub set: Vec<String>,
    /// Set a label (`k=v`), or remove it (`k=`).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Create the database (without a tend marker) if it does not exist.
    #[arg(long)]
    pub create: bool,
}

#[derive(Debug, Args)]
pub struct DropArgs {
    pub name: String,
    #[command(flatten)]
    pub target: SandboxTarget,
}

/// `config` (loaded from `config_path`)'s sandbox provider the target names.
fn open(
    config: &Config,
    config_path: &Path,
    target: &SandboxTarget,
) -> Result<SandboxProvider, CommandError> {
    let sandboxes: Vec<&String> = config
        .providers
        .iter()
        .filter(|(_, p)| matches!(p, ProviderConfig::Sandbox(_)))
        .map(|(n, _)| n)
        .collect();
    let name = match (&target.provider, sandboxes.as_slice()) {
        (Some(n), _) if sandboxes.contains(&n) => n.clone(),
        (Some(n), _) => {
            return Err(CommandError::Refused(format!(
                "`{n}` is not a sandbox provider in {}",
                config_path.display()
            )));
        }
        (None, [one]) => (*one).clone(),
        (None, []) => {
            return Err(CommandError::Refused(format!(
                "no sandbox provider in {}",
                config_path.display()
            )));
        }
        (None, _) => return Err("several sandbox providers: pass --provider".into()),
    };
    match &config.providers[&name] {
        ProviderConfig::Sandbox(c) => Ok(SandboxProvider::new(
            &name,
            &config.state_dir,
            c.provisioning_delay,
            c.faults.clone(),
        )),
        _ => Err(CommandError::Refused(format!(
            "`{name}` is not a sandbox provider"
        ))),
    }
}

fn split(pair: &str) -> Result<(&str, &str), String> {
    pair.split_once('=')
        .ok_or_else(|| format!("`{pair}` is not KEY=VALUE"))
}

pub(super) fn run(config_path: &Path, command: &SandboxCommand) -> io::Result<u8> {
    // A configuration that cannot be loaded exits 78, as for every command.
    let config = match super::session::load_config(config_path) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    // Editing is the operator's change at the "provider", whose data is
    // in the state dir: made as the state dir's owner when run as root.
    if !matches!(command, SandboxCommand::List(_))
        && let Err(code) = super::operator::become_state_owner(&config, &[])
    {
        return Ok(code);
    }
    let result = match command {
        SandboxCommand::List(target) => list(&config, config_path, target),
        SandboxCommand::Edit(args) => edit(&config, config_path, args),
        SandboxCommand::Drop(args) => drop_db(&config, config_path, args),
    };
    match result {
        Ok(text) => {
            write!(io::stdout(), "{text}")?;
            Ok(exit::OK)
        }
        Err(message) => {
            writeln!(io::stderr(), "tend sandbox: {message}")?;
            Ok(exit::ERROR)
        }
    }
}

fn list(
    config: &Config,
    config_path: &Path,
    target: &SandboxTarget,
) -> Result<String, CommandError> {
    let sandbox = open(config, config_path, target)?.read_only();
    let state = sandbox.load()?;
    let mut out = String::new();
    for (name, db) in &state.databases {
        let owner = db
            .labels
            .get(crate::provider::OWNER_AGENT_LABEL)
            .map_or("-", String::as_str);
        out.push_str(&format!("{name}  id={}  owner-agent={owner}\n", db.id));
        for (field, value) in &db.fields {
            out.push_str(&format!("    {field} = {value}\n"));
        }
        for (k, v) in &db.labels {
            out.push_str(&format!("    label {k} = {v}\n"));
        }
    }
    if out.is_empty() {
        out.push_str("(no databases)\n");
    }
    Ok(out)
}

fn edit(config: &Config, config_path: &Path, args: &EditArgs) -> Result<String, CommandError> {
    let sandbox = open(config, config_path, &args.target)?;
    let mut state = sandbox.load()?;
    if !state.databases.contains_key(&args.name) {
        if !args.create {
            return Err(CommandError::Refused(format!(
                "no database `{}` (pass --create to make one)",
                args.name
            )));
        }
        let id = format!("sbx-manual-{}", state.databases.len() + 1);
        state.databases.insert(
            args.name.clone(),
            SandboxDatabase {
                id,
                fields: [("databaseName".to_string(), Value::from(args.name.clone()))].into(),
                labels: Default::default(),
                created_at: 0,
                ready_at: 0,
                written_at_ms: 0,
                previous: None,
            },
        );
    }
    let db = state
        .databases
        .get_mut(&args.name)
        .ok_or_else(|| format!("no database `{}`", args.name))?;
    for pair in &args.set {
        let (field, raw) = split(pair)?;
        if raw.is_empty() {
            db.fields.remove(field);
        } else {
            let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::from(raw));
            db.fields.insert(field.to_string(), value);
        }
    }
    for pair in &args.labels {
        let (key, value) = split(pair)?;
        if value.is_empty() {
            db.labels.remove(key);
        } else {
            db.labels.insert(key.to_string(), value.to_string());
        }
    }
    sandbox.save(&state)?;
    Ok(format!("edited {}\n", args.name))
}

fn drop_db(config: &Config, config_path: &Path, args: &DropArgs) -> Result<String, CommandError> {
    let sandbox = open(config, config_path, &args.target)?;
    let mut state = sandbox.load()?;
    if state.databases.remove(&args.name).is_none() {
        return Err(CommandError::Refused(format!(
            "no database `{}`",
            args.name
        )));
    }
    sandbox.save(&state)?;
    Ok(format!("dropped {}\n", args.name))
}
