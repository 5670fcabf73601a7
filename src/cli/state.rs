//! `tend state show|check` (the state dir, read-only) and `tend state
//! reset-attempts`.

use std::io::{self, Write};
use std::path::Path;

use clap::Subcommand;

use super::{exit, session};
use crate::journal::StateStore;

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// A readable summary of the state dir.
    Show,
    /// Integrity check, unreadable rows included (exit 1 on problems).
    Check,
    /// Forget the failed update attempts of a resource, so a field held
    /// `Unconvergeable` is tried again (works beside a running agent).
    ResetAttempts {
        /// The declaration's metadata.name.
        name: String,
    },
}

pub fn run(config_path: &Path, command: &StateCommand) -> io::Result<u8> {
    let config = match session::load_config(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let check = match command {
        StateCommand::ResetAttempts { name } => return reset_attempts(&config.state_dir, name),
        StateCommand::Show => false,
        StateCommand::Check => true,
    };
    let store = match StateStore::open(&config.state_dir, false) {
        Ok(Some(store)) => store,
        Ok(None) => {
            writeln!(
                io::stdout(),
                "no state yet in {} (nothing was applied)",
                config.state_dir.display()
            )?;
            return Ok(exit::OK);
        }
        Err(e) => {
            session::fail(e);
            return Ok(exit::ERROR);
        }
    };
    let result = if !check {
        store.summary().map(|s| (s, exit::OK))
    } else {
        store.check().map(|problems| {
            if problems.is_empty() {
                (format!("{}: ok\n", store.path().display()), exit::OK)
            } else {
                (
                    problems
                        .iter()
                        .map(|p| format!("{}: {p}\n", store.path().display()))
                        .collect(),
                    exit::ERROR,
                )
            }
        })
    };
    match result {
        Ok((text, code)) => {
            write!(io::stdout(), "{text}")?;
            Ok(code)
        }
        Err(e) => {
            session::fail(e);
            Ok(exit::ERROR)
        }
    }
}

fn reset_attempts(state_dir: &Path, name: &str) -> io::Result<u8> {
    let reset = StateStore::open_for_overrides(state_dir).and_then(|s| s.reset_attempts(name));
    match reset {
        Ok(true) => {
            writeln!(
                io::stdout(),
                "forgot the failed update attempts of {}: the next cycle tries its fields again",
                crate::escape::terminal(name)
            )?;
            Ok(exit::OK)
        }
        Ok(false) => {
            writeln!(
                io::stdout(),
                "{} has no failed update attempts",
                crate::escape::terminal(name)
            )?;
            Ok(exit::OK)
        }
        Err(e) => {
            session::fail(e);
            Ok(exit::ERROR)
        }
    }
}
