//! `tend apply` and `tend state show|check`.

use std::io::{self, Write};
use std::path::Path;

use clap::{Args, Subcommand};

use super::exit;
use super::plan::ReportFormat;
use crate::config::Config;
use crate::cycle::apply;
use crate::executor::OpOutcome;
use crate::journal::StateStore;
use crate::status::{Report, build_report, render};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// How to print the report of the state after the cycle.
    #[arg(long, value_enum, default_value = "text")]
    pub format: ReportFormat,
}

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// A readable summary of the state dir.
    Show,
    /// Integrity check (exit 1 on problems).
    Check,
}

fn load(config_path: &Path) -> Result<Config, u8> {
    Config::load(config_path).map_err(|e| {
        let _ = writeln!(io::stderr(), "tend: {e}");
        exit::CONFIG
    })
}

/// Writes the latest report as JSON and Markdown into `reports_dir`
/// (atomically: a reader never sees half a report).
fn write_reports(config: &Config, report: &Report) -> io::Result<()> {
    let Some(dir) = &config.status.reports_dir else {
        return Ok(());
    };
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_vec_pretty(report).map_err(io::Error::other)?;
    for (name, bytes) in [
        ("latest.json", json),
        ("latest.md", render::markdown(report).into_bytes()),
    ] {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(name))?;
    }
    Ok(())
}

pub fn run_apply(config_path: &Path, args: &ApplyArgs) -> io::Result<u8> {
    let config = match load(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let outcome = match apply(&config) {
        Ok(o) => o,
        Err(e) => {
            writeln!(io::stderr(), "tend: {e}")?;
            return Ok(exit::ERROR);
        }
    };
    let mut failed = false;
    let mut err = io::stderr().lock();
    let done = outcome
        .operations
        .iter()
        .filter(|o| o.3 == OpOutcome::Done)
        .count();
    writeln!(err, "{} operations, {done} done", outcome.operations.len())?;
    for (name, kind, id, result) in &outcome.operations {
        let short = id.0.get(..12).unwrap_or(&id.0);
        let line = match result {
            OpOutcome::Done => continue,
            OpOutcome::DoneWithDifferences(fields) => {
                format!("done, but {} still differ", fields.join(", "))
            }
            OpOutcome::Pending(why) => format!("pending: {why}"),
            OpOutcome::Failed(why) => {
                failed = true;
                format!("FAILED: {why}")
            }
        };
        writeln!(err, "{} {name} (op {short}): {line}", kind.as_str())?;
    }
    let report = build_report(&config, &outcome.after);
    tracing::debug!("report built");
    if let Err(e) = write_reports(&config, &report) {
        writeln!(
            err,
            "tend: cannot write reports to {:?}: {e}",
            config.status.reports_dir
        )?;
    }
    drop(err);
    super::plan::print_report(args.format, &report)?;
    tracing::debug!("report printed");
    let code = if failed || report.has_errors() {
        exit::ERROR
    } else if report.has_pending() {
        exit::PENDING
    } else {
        exit::OK
    };
    super::heap::release_at_exit((outcome, report));
    Ok(code)
}

pub fn run_state(config_path: &Path, command: &StateCommand) -> io::Result<u8> {
    let config = match load(config_path) {
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
            writeln!(io::stderr(), "tend: {e}")?;
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
            writeln!(io::stderr(), "tend: {e}")?;
            Ok(exit::ERROR)
        }
    }
}
