//! `[source]`: the Git repository tend follows, how it authenticates and
//! verifies it, and how long a conversation with it may take.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::values;

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
        self.trust_problem_in(cfg!(feature = "gpg"))
    }

    /// [`Self::trust_problem`] for a build with (`gpg_built`) or without
    /// OpenPGP verification.
    fn trust_problem_in(&self, gpg_built: bool) -> Option<String> {
        if self.verify == VerifyMode::Gpg && !gpg_built {
            return Some(
                "[source] verify = \"gpg\": this tend was built without OpenPGP verification (the cargo feature `gpg`, on by default and in the Debian package); use verify = \"ssh\", or a build with the feature".into(),
            );
        }
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
}

/// How an HTTP token is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenScheme {
    /// `Authorization: Basic` with `token_username` and the token.
    #[default]
    Basic,
    /// `Authorization: Bearer <token>`.
    Bearer,
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
/// Schemes compare without case (`HTTPS://` is what libgit2 takes as
/// `https://`), and a query string is refused outright: a Git remote
/// needs none, and `?private_token=…` is a token.
pub(super) fn credentials_in_url(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        let secret = is_http(scheme) || userinfo.contains(':');
        if secret {
            return Some(format!(
                "[source] url carries credentials in its user part (…@{host}): put the token in token_file (systemd LoadCredential=) and remove it from the url"
            ));
        }
    }
    rest.contains('?').then(|| {
        format!(
            "[source] url ({scheme}://{host}/…) carries a query string (?…), where a token can hide: a Git remote needs none; put a token in token_file (systemd LoadCredential=) and remove the query from the url"
        )
    })
}

fn is_http(scheme: &str) -> bool {
    scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
}

/// `url` as it may be shown or stored (reports, notifications, plans):
/// the user part of an HTTP URL and any password become `…`, and a query
/// string becomes `?…`. The configuration refuses URLs that need this
/// ([`credentials_in_url`]); this is the second line, for anything that
/// reaches a report by another way.
pub(crate) fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) if is_http(scheme) => format!("…@{host}"),
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:…@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let path = match path.split_once('?') {
        Some((before, after)) => {
            let fragment = after.find('#').map_or("", |i| &after[i..]);
            format!("{before}?…{fragment}")
        }
        None => path.to_string(),
    };
    format!("{scheme}://{authority}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_openpgp_refuses_verify_gpg_as_a_configuration_problem() {
        let source: SourceConfig = toml::from_str(
            "url = \"/srv/r.git\"\nverify = \"gpg\"\ngpg_keyring_file = \"/etc/tend/keys.asc\"\n",
        )
        .unwrap();
        assert_eq!(source.trust_problem_in(true), None);
        let problem = source.trust_problem_in(false).unwrap();
        assert!(
            problem.contains("built without OpenPGP verification (the cargo feature `gpg`")
                && problem.contains("use verify = \"ssh\""),
            "{problem}"
        );
        // SSH verification does not need the feature.
        let ssh: SourceConfig = toml::from_str(
            "url = \"/srv/r.git\"\nverify = \"ssh\"\nallowed_signers_file = \"/etc/tend/signers\"\n",
        )
        .unwrap();
        assert_eq!(ssh.trust_problem_in(false), None);
    }

    #[test]
    fn credentials_are_refused_whatever_the_scheme_case_and_wherever_they_sit() {
        for url in [
            "https://tok3n@git.example/r.git",
            "HTTPS://tok3n@git.example/r.git",
            "Http://user:pass@git.example/r.git",
            "ssh://git:pass@git.example/r.git",
            "https://git.example/r.git?private_token=pass",
            "HTTPS://git.example?access_token=pass",
        ] {
            let problem = credentials_in_url(url).unwrap_or_else(|| panic!("{url} accepted"));
            assert!(
                !problem.contains("tok3n")
                    && !problem.contains("pass@")
                    && !problem.contains("=pass"),
                "{problem}"
            );
        }
        for url in [
            "https://git.example/r.git",
            "ssh://git@git.example/r.git",
            "git@git.example:r.git",
            "file:///srv/r.git",
            "/srv/r.git",
        ] {
            assert_eq!(credentials_in_url(url), None, "{url}");
        }
    }

    #[test]
    fn a_shown_url_carries_no_user_part_password_or_query() {
        for (url, shown) in [
            (
                "https://tok3n@git.example/r.git",
                "https://…@git.example/r.git",
            ),
            (
                "HTTPS://u:p@git.example:8443/r.git",
                "HTTPS://…@git.example:8443/r.git",
            ),
            (
                "ssh://git:pw@git.example/r.git",
                "ssh://git:…@git.example/r.git",
            ),
            ("ssh://git@git.example/r.git", "ssh://git@git.example/r.git"),
            (
                "https://git.example/r.git?private_token=x#frag",
                "https://git.example/r.git?…#frag",
            ),
            ("https://git.example?token=x", "https://git.example?…"),
            ("/srv/r.git", "/srv/r.git"),
        ] {
            assert_eq!(redacted_url(url), shown, "{url}");
        }
    }
}
