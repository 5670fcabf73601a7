//! `[source]`: the Git repository tend follows, how it authenticates and
//! verifies it, and how long a conversation with it may take.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::values;
use crate::source::auth::TokenScheme;
use crate::source::trust::{AllowedSigners, Keyring, Trust, TrustError, TrustPolicy};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Repository URL or local path.
    pub url: String,
    #[serde(default = "default_branch", deserialize_with = "values::branch")]
    pub branch: String,
    /// Directory of declarations inside the repository, normalised
    /// (`databases`, or `.` for the root).
    #[serde(default = "default_path", deserialize_with = "values::repo_path")]
    pub path: String,
    #[serde(default = "default_interval", deserialize_with = "values::duration")]
    pub interval: Duration,
    /// How long one fetch or push may take as a whole; one read waits at
    /// most this long or 30 s, a connection 10 s (the read and connect
    /// bounds take effect at the process's start).
    #[serde(
        default = "default_source_timeout",
        deserialize_with = "values::duration"
    )]
    pub timeout: Duration,
    pub depth: Option<u32>,
    /// File holding an HTTP token (systemd `LoadCredential=`).
    pub token_file: Option<PathBuf>,
    /// `basic` (with `token_username`) or `bearer`.
    #[serde(default)]
    pub token_scheme: TokenScheme,
    #[serde(default = "default_token_username")]
    pub token_username: String,
    pub ssh_key_file: Option<PathBuf>,
    pub known_hosts_file: Option<PathBuf>,
    #[serde(default)]
    pub allow_rewind: bool,
    /// Signatures a new head must carry.
    #[serde(default)]
    pub verify: VerifyMode,
    /// Every new commit, not only the head, must be signed.
    #[serde(default)]
    pub verify_all: bool,
    /// git's SSH allowed-signers file (`verify = "ssh"`).
    pub allowed_signers_file: Option<PathBuf>,
    /// Armored OpenPGP public keys (`verify = "gpg"`).
    pub gpg_keyring_file: Option<PathBuf>,
}

/// `[source] verify`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyMode {
    #[default]
    None,
    Ssh,
    Gpg,
}

impl SourceConfig {
    /// A `verify` without its keys, or keys without `verify` (an operator
    /// who set the file believes commits are checked).
    pub(super) fn trust_problem(&self) -> Option<String> {
        match (
            self.verify,
            &self.allowed_signers_file,
            &self.gpg_keyring_file,
        ) {
            (VerifyMode::Ssh, None, _) => Some(
                "[source] verify = \"ssh\" needs allowed_signers_file (git's allowed-signers format)".into(),
            ),
            (VerifyMode::Gpg, _, None) => Some(
                "[source] verify = \"gpg\" needs gpg_keyring_file (armored public keys: gpg --export --armor)".into(),
            ),
            (VerifyMode::None, Some(_), _) | (VerifyMode::None, _, Some(_)) => Some(
                "[source] names a signers file or keyring but verify = \"none\": set verify = \"ssh\" or \"gpg\", or remove the file setting".into(),
            ),
            (VerifyMode::Ssh, _, Some(_)) => Some(
                "[source] verify = \"ssh\" reads allowed_signers_file, not gpg_keyring_file: remove gpg_keyring_file".into(),
            ),
            (VerifyMode::Gpg, Some(_), _) => Some(
                "[source] verify = \"gpg\" reads gpg_keyring_file, not allowed_signers_file: remove allowed_signers_file".into(),
            ),
            (VerifyMode::None, None, None) if self.verify_all => Some(
                "[source] verify_all = true needs verify = \"ssh\" or \"gpg\"".into(),
            ),
            _ => None,
        }
    }

    /// The trust settings, with the signers file or keyring read.
    pub fn trust(&self) -> Result<Trust, TrustError> {
        let policy = match (
            self.verify,
            &self.allowed_signers_file,
            &self.gpg_keyring_file,
        ) {
            (VerifyMode::Ssh, Some(file), _) => {
                TrustPolicy::Ssh(std::sync::Arc::new(AllowedSigners::load(file)?))
            }
            (VerifyMode::Gpg, _, Some(file)) => {
                TrustPolicy::Gpg(std::sync::Arc::new(Keyring::load(file)?))
            }
            _ => TrustPolicy::None,
        };
        Ok(Trust {
            policy,
            verify_all: self.verify_all,
        })
    }
}

fn default_token_username() -> String {
    "tend".into()
}

fn default_branch() -> String {
    "main".into()
}
fn default_path() -> String {
    ".".into()
}
fn default_interval() -> Duration {
    Duration::from_secs(60)
}

fn default_source_timeout() -> Duration {
    Duration::from_secs(300)
}

/// Why a source URL must not carry credentials, if it does: a password
/// or token in the URL would be printed wherever the URL is (errors,
/// logs, reports). An SSH user name (`ssh://git@host/…`) is not a secret.
pub(super) fn credentials_in_url(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split('/').next().unwrap_or("");
    let (userinfo, host) = authority.rsplit_once('@')?;
    let secret = match scheme {
        "http" | "https" => true,
        _ => userinfo.contains(':'),
    };
    secret.then(|| {
        format!(
            "[source] url carries credentials in its user part (…@{host}): put the token in token_file (systemd LoadCredential=) and remove it from the url"
        )
    })
}
