//! Why a command's step failed: tend's own refusal, or a lower layer's
//! error kept whole (its `source()` chain reaches the I/O, SQLite or
//! libgit2 error). The command prints it after its own prefix
//! (`tend sandbox: …`); the text reads as the layer's error does.

use crate::config::ConfigError;
use crate::journal::StateError;
use crate::provider::sandbox::SandboxError;
use crate::source::SourceError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum CommandError {
    /// What is wrong with the request, and what to do instead.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

impl From<String> for CommandError {
    fn from(text: String) -> Self {
        CommandError::Refused(text)
    }
}

impl From<&str> for CommandError {
    fn from(text: &str) -> Self {
        CommandError::Refused(text.to_string())
    }
}
