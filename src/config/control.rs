//! `[control]`: where operators' commands reach the running agent.

use std::path::PathBuf;

use serde::Deserialize;

use super::Config;

/// `[control]`: the local channel operators' commands reach the running
/// agent through (docs/operations.md, "Commands beside the agent").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// The Unix socket; [`Config::control_socket`] gives the default.
    pub socket: Option<PathBuf>,
    /// A group whose members may use it, besides root and the agent's
    /// own user.
    pub group: Option<String>,
}

impl Config {
    /// The control socket: `[control] socket`, by default
    /// `<state_dir>/control.sock` (the state dir is the agent's: only its
    /// user and root reach a socket in it).
    pub fn control_socket(&self) -> PathBuf {
        self.control
            .socket
            .clone()
            .unwrap_or_else(|| self.state_dir.join("control.sock"))
    }
}
