//! Progress of a cycle's operations on the terminal: a bar when stderr is
//! a terminal, a log line per operation otherwise. The core only reports
//! finished operations ([`Progress`]); drawing is the CLI's business.

use std::io::{IsTerminal, Write};

use crate::executor::Executed;
use crate::executor::queue::Progress;

/// Draws operations as they finish.
#[derive(Debug)]
pub(super) struct TerminalProgress {
    tty: bool,
}

impl TerminalProgress {
    pub(super) fn new() -> Self {
        TerminalProgress {
            tty: std::io::stderr().is_terminal(),
        }
    }
}

impl Default for TerminalProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress for TerminalProgress {
    fn finished(&self, done: usize, total: usize, executed: &Executed) {
        if self.tty && total > 1 {
            let width = 30;
            let filled = width * done / total.max(1);
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r[{}{}] {done}/{total} operations",
                "#".repeat(filled),
                " ".repeat(width - filled),
            );
            if done == total {
                let _ = writeln!(err);
            }
        } else {
            tracing::info!(
                "[{done}/{total}] {} {}: {}",
                executed.kind.as_str(),
                executed.name,
                executed.outcome.describe()
            );
        }
    }
}
