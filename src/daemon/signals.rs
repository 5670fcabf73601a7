//! OS signals, translated once into what they mean to the agent.
//!
//! # Guarantees
//! * A second SIGTERM or SIGINT exits the process at once, whatever the
//!   agent is doing or waiting for (a reload, a shutdown that drains, a
//!   blocked task): a task of its own watches the signals, so nothing the
//!   coordinator waits on can hold it. Unfinished operations stay
//!   journalled and are resolved at the next start.

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

/// Exit code when a second signal cuts the shutdown short.
pub(super) const EXIT_INTERRUPTED: u8 = 130;

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Request {
    /// SIGTERM or SIGINT: stop taking work, finish what runs, exit.
    Shutdown,
    /// SIGHUP: reload the configuration.
    Reload,
}

/// The signals the agent handles.
pub(super) struct Signals {
    requests: mpsc::UnboundedReceiver<Request>,
}

impl Signals {
    /// Installs the handlers (from here on these signals no longer kill
    /// the process) and the task that watches them.
    pub(super) fn install() -> std::io::Result<Self> {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let (tx, requests) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut shutdowns = 0u32;
            loop {
                let request = tokio::select! {
                    _ = term.recv() => Request::Shutdown,
                    _ = int.recv() => Request::Shutdown,
                    _ = hup.recv() => Request::Reload,
                };
                if request == Request::Shutdown {
                    shutdowns += 1;
                    if shutdowns >= 2 {
                        tracing::warn!(
                            "second signal: exiting now; unfinished operations stay journalled"
                        );
                        std::process::exit(i32::from(EXIT_INTERRUPTED));
                    }
                }
                if tx.send(request).is_err() {
                    return;
                }
            }
        });
        Ok(Signals { requests })
    }

    /// The next request (never ends once the watcher is gone: a shutdown
    /// is then asked for).
    pub(super) async fn next(&mut self) -> Request {
        self.requests.recv().await.unwrap_or(Request::Shutdown)
    }
}
