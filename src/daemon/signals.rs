//! OS signals, translated once into what they mean to the agent.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// SIGTERM or SIGINT: stop taking work, finish what runs, exit.
    Shutdown,
    /// SIGHUP: reload the configuration.
    Reload,
}

/// The signals the agent handles.
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers (from here on these signals no longer kill
    /// the process).
    pub fn install() -> std::io::Result<Self> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next request.
    pub async fn next(&mut self) -> Request {
        tokio::select! {
            _ = self.term.recv() => Request::Shutdown,
            _ = self.int.recv() => Request::Shutdown,
            _ = self.hup.recv() => Request::Reload,
        }
    }
}
