//! `tend state show|check`: the state dir, read-only.

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
}

pub fn run(config_path: &Path, command: &StateCommand) -> io::Result<u8> {
    let config = match session::load_config(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
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
    let result = match command {
        StateCommand::Show => store.summary().map(|s| (s, exit::OK)),
        StateCommand::Check => store.check().map(|problems| {
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
        }),
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
