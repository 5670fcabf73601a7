//! The running agent's status writer: one task (it owns the status
//! branch) that publishes the board's merged report whenever it changes.
//!
//! # Guarantees
//! * Reconciliation never waits for it: workers publish to the board and
//!   go on; this task writes on the blocking pool, and a burst of
//!   publications (every provider finishing a cycle) is one write, made
//!   once the cycles running end (or after a bound); publications start
//!   at most one a second, sooner when they are quick; the last change is
//!   always written. A report whose times alone moved may leave the report
//!   files as they are for a while (see `times_only`): the writer comes
//!   back for it when they are due.
//! * A failure is logged once per distinct error and shows in the report;
//!   it is retried at the next change, or a minute later when nothing
//!   changes. It never stops the agent.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::board::StatusBoard;
use super::publish::StatusPublisher;
use crate::clock::Clock;
use crate::telemetry::Metrics;

/// How long the writer waits after a change for the ones that follow it.
/// Short: it then waits for the cycles running to end, and a provider
/// worker counts as running from the moment it takes a new snapshot up,
/// so the other workers' reports moving to a commit do not start a
/// publication before the one cycle the commit needs. At 200 ms it was a
/// seventh of a one-file commit's way to its status commit at 100,000.
const COALESCE: Duration = Duration::from_millis(50);
/// How long it then waits, at most, for the cycles still running to end:
/// a commit starts one cycle per provider, and a report written before the
/// slowest (the one the commit changed a declaration at, which calls its
/// provider) is followed by a second publication, which at 100,000
/// resources costs seconds.
const SETTLE: Duration = Duration::from_secs(3);
/// The least time between the starts of two publications is twice the
/// last one's length, within these bounds: cycles that follow each other
/// closely (due times, webhooks) must not spend more than a third of the
/// cores on reports no one reads in between. The last change is always
/// published.
const MIN_INTERVAL: Duration = Duration::from_millis(200);
const MAX_INTERVAL: Duration = Duration::from_secs(1);

/// What heads the reports the running agent writes.
pub(crate) const TITLE: &str = "tend run";

/// How long after a failed publication it is tried again, even if the
/// fleet's report does not change.
const RETRY_FAILED: Duration = Duration::from_secs(60);

/// Publishes the board's report (the status branch, the report files) at
/// every change until `stop` turns true.
pub(crate) async fn run(
    board: Arc<StatusBoard>,
    publisher: StatusPublisher,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    deliveries: Arc<tokio::sync::Notify>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut publisher = publisher.keeping_renders();
    let mut changes = board.subscribe();
    let mut running = board.running_cycles();
    let mut last_error: Option<String> = None;
    // When the last publication may be followed by the next.
    let mut next_allowed: Option<tokio::time::Instant> = None;
    // When the report files left as they were are due.
    let mut files_due: Option<tokio::time::Instant> = None;
    loop {
        let failing = publisher.failing();
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep(RETRY_FAILED), if failing => {}
            _ = tokio::time::sleep_until(files_due.unwrap_or_else(tokio::time::Instant::now)),
                if files_due.is_some() => {}
            _ = stop.cancelled() => return,
        }
        // Set again by the publication below if the files wait still.
        files_due = None;
        tokio::time::sleep(COALESCE).await;
        if let Some(at) = next_allowed {
            tokio::time::sleep_until(at).await;
        }
        // Right before the report is taken: a commit's cycles may have
        // started while the writer waited for its turn.
        tokio::select! {
            _ = running.wait_for(|cycles| cycles.iter().all(|b| !b.runs)) => {}
            _ = tokio::time::sleep(SETTLE) => {}
            _ = stop.cancelled() => return,
        }
        changes.borrow_and_update();
        let started = tokio::time::Instant::now();
        panic_point();
        // Asked before the report is taken: the state is read after it,
        // and may hold operations it does not (see `publish_as_of`).
        let now = clock.now();
        let cycles = running.borrow().clone();
        let Some(report) = board.latest() else {
            continue;
        };
        let reported_until = super::board::reported_until(&cycles, &report, now);
        let published = tokio::task::spawn_blocking(move || {
            use crate::process::failpoint::{STATUS_WRITER_TAKEN, stop_point};
            stop_point(STATUS_WRITER_TAKEN);
            let outcome = publisher.publish_as_of(&report, SystemTime::now(), reported_until);
            (publisher, outcome)
        })
        .await;
        let took = started.elapsed();
        next_allowed = Some(started + (took * 2).clamp(MIN_INTERVAL, MAX_INTERVAL));
        let outcome = match published {
            Ok((returned, outcome)) => {
                publisher = returned;
                outcome
            }
            Err(e) => {
                tracing::error!("status: the publishing task failed: {e}; the status writer stops");
                return;
            }
        };
        files_due = outcome.files_deferred.map(|wait| {
            tracing::debug!(
                "status: only the report's times moved; its files are written in {wait:?}"
            );
            tokio::time::Instant::now() + wait
        });
        if let Some(commit) = &outcome.committed {
            tracing::info!(commit = %commit, "status branch: committed");
        }
        if outcome.transitions > 0 {
            deliveries.notify_one();
        }
        outcome.proposals.log();
        board.set_status_branch(outcome.branch_report.clone());
        let errors: Vec<String> = [
            outcome.branch_error.map(|e| e.to_string()),
            outcome.files_error.map(|e| format!("reports: {e}")),
            outcome.notify_error.map(|e| format!("notifications: {e}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let error = (!errors.is_empty()).then(|| errors.join("; "));
        metrics.status_published(outcome.committed.is_some(), error.is_some());
        if error != last_error {
            match &error {
                Some(e) => tracing::warn!("status: {e}"),
                None => tracing::info!("status: written again"),
            }
        }
        last_error = error;
    }
}

/// Test-only (the failpoint `status-writer-panic`): the first status
/// writer of the process panics before its first publication, so a test
/// can see it started again.
fn panic_point() {
    use crate::process::failpoint::{STATUS_WRITER_PANIC, fired};
    use std::sync::atomic::{AtomicBool, Ordering};
    static DONE: AtomicBool = AtomicBool::new(false);
    if fired(STATUS_WRITER_PANIC).is_some() && !DONE.swap(true, Ordering::SeqCst) {
        panic!("injected status writer panic (failpoint {STATUS_WRITER_PANIC})");
    }
}
