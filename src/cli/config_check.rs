//! `tend config check`: whether a configuration file can work, without
//! starting anything — what `nginx -t` and `promtool check config` are to
//! their services. The unit's `ExecReload=` runs it before signalling the
//! agent, so `systemctl reload tend` fails on a file the agent would
//! refuse.
//!
//! # Guarantees
//! * Exit 0: the file parses, every secret it names is read, every
//!   provider and notification receiver builds, and the state (when there
//!   is one) is readable by this tend and kept for the configured
//!   `agent_id`.
//! * Exit 78 otherwise, naming the key or file: the same refusal the
//!   agent would give at a start or a reload.
//! * Nothing is written: the state is opened read-only, nothing is
//!   fetched, no provider is called.

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use clap::Subcommand;

use super::{exit, session};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::journal::StateStore;

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check the configuration file: exit 0 when the agent could start
    /// with it, 78 naming what cannot work (a key, a secret file, a state
    /// kept for another agent id or a newer tend). Reads, never writes.
    Check,
}

pub(super) fn run(config_path: &Path, command: &ConfigCommand) -> io::Result<u8> {
    let ConfigCommand::Check = command;
    let config = match session::load_config(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    match check(&config) {
        Ok(summary) => {
            writeln!(io::stdout(), "{}: ok ({summary})", config_path.display())?;
            Ok(exit::OK)
        }
        Err(Refusal(message)) => {
            session::fail(format!("{}: {message}", config_path.display()));
            Ok(exit::CONFIG)
        }
    }
}

/// Why the configuration cannot work: the agent's own refusal, as it
/// would print it.
struct Refusal(String);

fn refuse(e: impl std::fmt::Display) -> Refusal {
    Refusal(e.to_string())
}

/// Everything the agent builds from the file at a start or a reload,
/// built and dropped; a one-line summary.
fn check(config: &Config) -> Result<String, Refusal> {
    crate::source::tracker::SourceSettings::from_config(config).map_err(refuse)?;
    config.webhook_secret().map_err(refuse)?;
    config.server_token().map_err(refuse)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut providers = Vec::new();
    for (name, provider) in &config.providers {
        crate::provider::build::build(
            name,
            provider,
            &config.state_dir,
            &clock,
            crate::provider::build::Use::Read,
        )
        .map_err(refuse)?;
        providers.push(format!("{name} ({})", provider.kind().as_str()));
    }
    crate::status::notify::deliver::Notifier::from_config(config).map_err(refuse)?;
    let state = match StateStore::open_configured(config, false) {
        Ok(Some(store)) => match store.agent_id_for_reading(config.agent_id.as_deref()) {
            Ok(Some(id)) => format!("state {} of agent {id}", store.location()),
            Ok(None) => format!("state {}, no agent id yet", store.location()),
            Err(e) => return Err(refuse(e)),
        },
        Ok(None) => "no state yet".to_string(),
        Err(e) if e.is_configuration() => return Err(refuse(e)),
        // A state that cannot be reached now (a database down) is not the
        // file's fault: the agent retries it.
        Err(e) => format!("state not checked: {e}"),
    };
    Ok(format!(
        "{} provider{}: {}; {state}",
        providers.len(),
        if providers.len() == 1 { "" } else { "s" },
        providers.join(", ")
    ))
}
