//! `tend apply`: one full cycle on the shared reconcile path (replay,
//! observe, decide, execute, confirm), then a report.

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use clap::Args;

use super::plan::ReportFormat;
use super::progress::TerminalProgress;
use super::{exit, session};
use crate::config::Config;
use crate::executor::{Executed, OpOutcome};
use crate::journal::Access;
use crate::reconcile::Mode;
use crate::status::{Report, build_report, render};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// How to print the report of the state after the cycle.
    #[arg(long, value_enum, default_value = "text")]
    pub format: ReportFormat,
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

/// One line per operation that did not simply finish; whether any failed.
fn print_operations(err: &mut impl Write, operations: &[Executed]) -> io::Result<bool> {
    let done = operations
        .iter()
        .filter(|o| o.outcome == OpOutcome::Done)
        .count();
    writeln!(err, "{} operations, {done} done", operations.len())?;
    let mut failed = false;
    for op in operations {
        if op.outcome == OpOutcome::Done {
            continue;
        }
        failed |= matches!(op.outcome, OpOutcome::Failed(_));
        let short = op.id.0.get(..12).unwrap_or(&op.id.0);
        writeln!(
            err,
            "{} {} (op {short}): {}",
            op.kind.as_str(),
            op.name,
            op.outcome.describe()
        )?;
    }
    Ok(failed)
}

pub fn run_apply(config_path: &Path, args: &ApplyArgs) -> io::Result<u8> {
    let agent = match session::open_agent(config_path, Access::Writer) {
        Ok(agent) => agent.with_progress(Arc::new(TerminalProgress::new())),
        Err(code) => return Ok(code),
    };
    let finished = |ran: &[Executed]| print_operations(&mut io::stderr().lock(), ran).map(|_| ());
    session::one_cycle(&agent, Mode::Apply, finished, |outcome| {
        let failed = print_operations(&mut io::stderr().lock(), &outcome.operations)?;
        let report = build_report(agent.config(), outcome.latest());
        tracing::debug!("report built");
        if let Err(e) = write_reports(agent.config(), &report) {
            session::fail(format!(
                "cannot write reports to {:?}: {e}",
                agent.config().status.reports_dir
            ));
        }
        let code = print_report_and_code(args.format, &report, failed);
        tracing::debug!("report printed");
        super::heap::release_at_exit(report);
        code
    })
}

fn print_report_and_code(format: ReportFormat, report: &Report, failed: bool) -> io::Result<u8> {
    super::plan::print_report(format, report)?;
    Ok(if failed || report.has_errors() {
        exit::ERROR
    } else if report.has_pending() {
        exit::PENDING
    } else {
        exit::OK
    })
}
