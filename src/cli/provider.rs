//! `tend provider check URL`: does a server keep the HTTP provider
//! contract's promises tend relies on?

use std::io::{self, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::exit;
use super::session::runtime;
use crate::provider::http::check::Outcome;

#[derive(Debug, Subcommand)]
pub enum ProviderCommand {
    /// Run the contract's conformance checks against a server (it
    /// creates, changes and deletes databases named tend-check-*): pass or
    /// fail per rule; exit 0 when every rule passes, 1 otherwise.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The server's base URL (before /v1), e.g. https://dbaas.internal
    pub url: String,
    /// A file holding the bearer token.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

pub(super) fn run(command: &ProviderCommand) -> io::Result<u8> {
    let ProviderCommand::Check(args) = command;
    let token = match &args.token_file {
        Some(file) => match crate::config::secret::read("--token-file", file) {
            Ok(token) => Some(token),
            Err(e) => {
                writeln!(io::stderr(), "tend: {e}")?;
                return Ok(exit::CONFIG);
            }
        },
        None => None,
    };
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    let verdicts = match runtime.block_on(crate::provider::http::check::run(&args.url, token)) {
        Ok(v) => v,
        Err(e) => {
            writeln!(io::stderr(), "tend: {e}")?;
            return Ok(exit::ERROR);
        }
    };
    let mut out = io::stdout().lock();
    let (mut failed, mut skipped) = (0, 0);
    for v in &verdicts {
        match &v.outcome {
            Outcome::Pass(note) => writeln!(out, "PASS {}: {note}", v.rule)?,
            Outcome::Fail(why) => {
                failed += 1;
                writeln!(out, "FAIL {}: {why}", v.rule)?
            }
            Outcome::Skip(why) => {
                skipped += 1;
                writeln!(out, "SKIP {}: {why}", v.rule)?
            }
        }
    }
    writeln!(
        out,
        "{} rules, {} passed, {failed} failed, {skipped} skipped",
        verdicts.len(),
        verdicts.len() - failed - skipped
    )?;
    Ok(if failed == 0 { exit::OK } else { exit::ERROR })
}
