//! The running agent's status writer: one task that turns the board's
//! merged report into the report files whenever it changes.
//!
//! # Guarantees
//! * Reconciliation never waits for it: workers publish to the board and
//!   go on; this task writes on the blocking pool, and a burst of
//!   publications (every provider finishing a cycle) is one write.
//! * A failure to write is logged once per distinct error, and retried at
//!   the next change; it never stops the agent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::board::StatusBoard;
use super::files::ReportFiles;

/// How long the writer waits after a change for the ones that follow it.
const COALESCE: Duration = Duration::from_millis(200);

/// What heads the reports the running agent writes.
pub const TITLE: &str = "tend run";

/// Writes the board's report to `files` at every change until `stop`
/// turns true.
pub async fn run(board: Arc<StatusBoard>, files: ReportFiles, mut stop: watch::Receiver<bool>) {
    let mut changes = board.subscribe();
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stop.wait_for(|s| *s) => return,
        }
        tokio::time::sleep(COALESCE).await;
        changes.borrow_and_update();
        let Some(report) = board.latest() else {
            continue;
        };
        let target = files.clone();
        let written = tokio::task::spawn_blocking(move || target.write(&report, TITLE)).await;
        match written {
            Ok(Ok(())) => {
                if last_error.take().is_some() {
                    tracing::info!("reports: written to {} again", files.dir().display());
                }
            }
            Ok(Err(e)) => {
                let message = e.to_string();
                if last_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!("reports: {message}");
                }
                last_error = Some(message);
            }
            Err(e) => tracing::warn!("reports: the writer task failed: {e}"),
        }
    }
}
