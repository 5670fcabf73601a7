//! `[control]`: where operators' commands reach the running agent.

use std::path::PathBuf;

use serde::Deserialize;

use super::{Config, ConfigError};

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

    /// `[control] group`, resolved; a group that does not exist is a
    /// configuration error.
    pub fn control_group(&self) -> Result<Option<crate::control::Group>, ConfigError> {
        let Some(name) = &self.control.group else {
            return Ok(None);
        };
        crate::control::group_by_name(name)
            .map(Some)
            .ok_or_else(|| ConfigError::NoGroup { name: name.clone() })
    }
}
