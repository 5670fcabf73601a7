//! `tend apply`: one full cycle on the shared reconcile path (replay,
//! observe, decide, execute, confirm), then a report.

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use clap::Args;

use super::plan::ReportArgs;
use super::progress::TerminalProgress;
use super::{exit, session};
use crate::executor::{Executed, OpOutcome};
use crate::journal::Access;
use crate::reconcile::Mode;
use crate::status::Report;
use crate::status::files::ReportFiles;
use crate::status::notify::deliver::Notifier;
use crate::status::publish::StatusPublisher;
use crate::status::report::AppliedReport;

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// How to print the report of the state after the cycle.
    #[command(flatten)]
    pub output: ReportArgs,
}

/// One line per operation that did not simply finish; whether any failed.
fn print_operations(err: &mut impl Write, operations: &[Executed]) -> io::Result<bool> {
    let counts = applied(operations);
    writeln!(
        err,
        "{} operations, {} done",
        counts.operations, counts.done
    )?;
    for op in operations {
        if op.outcome == OpOutcome::Done {
            continue;
        }
        let short = op.id.0.get(..12).unwrap_or(&op.id.0);
        writeln!(
            err,
            "{} {} (op {short}): {}",
            op.kind.as_str(),
            op.name,
            op.outcome.describe()
        )?;
    }
    Ok(counts.failed > 0)
}

/// The counts of `operations` the printed report carries.
fn applied(operations: &[Executed]) -> AppliedReport {
    let count = |f: fn(&OpOutcome) -> bool| operations.iter().filter(|o| f(&o.outcome)).count();
    AppliedReport {
        operations: operations.len(),
        done: count(|o| *o == OpOutcome::Done),
        failed: count(|o| matches!(o, OpOutcome::Failed(_) | OpOutcome::Refused(_))),
    }
}

pub(super) fn run_apply(config_path: &Path, args: &ApplyArgs) -> io::Result<u8> {
    let agent = match session::open_agent(config_path, Access::Writer) {
        Ok(agent) => {
            agent.memories().retain();
            agent.with_progress(Arc::new(TerminalProgress::new()))
        }
        Err(code) => return Ok(code),
    };
    let notifier = match Notifier::from_config(agent.config()) {
        Ok(n) => n.map(Arc::new),
        Err(e) => {
            session::fail(e);
            return Ok(exit::CONFIG);
        }
    };
    let finished = |ran: &[Executed]| print_operations(&mut io::stderr().lock(), ran).map(|_| ());
    let code = session::one_cycle(&agent, Mode::Apply, finished, |result| {
        let operations = result.outcome.map_or(&[][..], |o| o.operations.as_slice());
        let failed = print_operations(&mut io::stderr().lock(), operations)?;
        let previous = ReportFiles::new(&agent.config().reports_dir(), 0).read_last_failures();
        let mut report = result.report(&agent, &previous);
        tracing::debug!("report built");
        let mut publisher = StatusPublisher::new(&agent, TITLE, &previous, notifier.clone());
        if result.outcome.is_none() {
            publisher.files_only();
        }
        let published = publisher.publish(&report, agent.clock().now());
        if let Some(e) = &published.branch_error {
            session::fail(e);
        }
        if let Some(e) = &published.files_error {
            session::fail(e);
        }
        if let Some(e) = &published.notify_error {
            session::fail(format!("notifications: {e}"));
        }
        published.proposals.log();
        // The printed report says what latest.json says: the status
        // branch this apply could not write.
        if let Some(failure) = &published.branch_report {
            report.status_branch = Some(failure.clone());
        }
        // What this cycle ran, for scripts reading `--format json` (after
        // publishing: the files and the branch stay as they were when
        // nothing ran).
        report.applied = Some(applied(operations));
        let code = print_report_and_code(&args.output, &report, failed);
        tracing::debug!("report printed");
        super::heap::release_at_exit(report);
        code
    })?;
    if let (Some(notifier), Some(store)) = (&notifier, agent.store()) {
        deliver(notifier, store, &agent);
    }
    // Last, when all is written: the status commits and fetches of this
    // and earlier runs packed, when due (see `source::cache_pack`).
    crate::source::cache_pack::pack_logged(
        &crate::source::repo_dir(&agent.config().state_dir),
        &crate::source::cache_pack::limits(),
    );
    Ok(code)
}

/// Delivers the queued notifications once (each receiver within its
/// timeout); what fails waits in the state for the next writer.
fn deliver(
    notifier: &Notifier,
    store: &Arc<crate::journal::StateStore>,
    agent: &crate::agent::Agent,
) {
    let Ok(runtime) = session::runtime() else {
        return;
    };
    if let Err(e) = runtime.block_on(notifier.deliver_due(store, agent.clock().now())) {
        session::fail(format!("notifications: {e}"));
    }
}

/// What heads the reports `tend apply` writes.
const TITLE: &str = "tend apply";

fn print_report_and_code(output: &ReportArgs, report: &Report, failed: bool) -> io::Result<u8> {
    super::plan::print_report(output, report, TITLE)?;
    Ok(if failed || report.has_errors() {
        exit::ERROR
    } else if report.has_pending() {
        exit::PENDING
    } else {
        exit::OK
    })
}
