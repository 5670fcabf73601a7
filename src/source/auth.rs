//! Credentials for fetching: an HTTP token (basic or bearer) and SSH keys
//! with a known_hosts check. Secrets are read from files, never logged.

use std::path::{Path, PathBuf};

use std::str::FromStr;

use git2::cert::Cert;
use git2::{CertificateCheckStatus, Cred, CredentialType};
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use ssh_key::{HashAlg, PublicKey, known_hosts};

use super::SourceError;

pub use crate::config::TokenScheme;

/// `scheme://host[:port]` of a URL, without a user part or path
/// (lower-cased: hosts and schemes compare case-insensitively).
pub(crate) fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    Some(format!("{scheme}://{host}").to_ascii_lowercase())
}

/// Everything a fetch needs to authenticate.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub token: Option<String>,
    pub token_scheme: TokenScheme,
    pub token_username: String,
    pub ssh_key_file: Option<PathBuf>,
    pub known_hosts_file: Option<PathBuf>,
}

fn read_secret(path: &Path) -> Result<String, SourceError> {
    if let Some(bytes) = crate::config::secret::preloaded(path) {
        return Ok(String::from_utf8_lossy(bytes).trim().to_string());
    }
    crate::files::read_regular_to_string(path, crate::config::secret::MAX_SECRET_BYTES)
        .map(|s| s.trim().to_string())
        .map_err(|e| SourceError::Io {
            path: path.display().to_string(),
            source: crate::cause::Cause::new(e),
        })
}

impl Credentials {
    /// Extra HTTP headers (the bearer token).
    pub fn headers(&self) -> Vec<String> {
        match (&self.token, self.token_scheme) {
            (Some(token), TokenScheme::Bearer) => vec![format!("Authorization: Bearer {token}")],
            _ => Vec::new(),
        }
    }

    /// Whether a token is configured (then redirects are not followed:
    /// libgit2 would send a bearer header, or answer a basic challenge, at
    /// whatever host a redirect names).
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The libgit2 credential callback for a fetch of `origin_url`. `url`
    /// is where libgit2 is now; credentials go to the configured origin
    /// (scheme, host, port) only. `attempts` stops libgit2 from asking
    /// forever when the server keeps refusing.
    pub fn credential(
        &self,
        origin_url: &str,
        url: &str,
        username_from_url: Option<&str>,
        allowed: CredentialType,
        attempts: &mut u32,
    ) -> Result<Cred, git2::Error> {
        *attempts += 1;
        if origin(url) != origin(origin_url) {
            return Err(git2::Error::from_str(&format!(
                "refusing to send credentials to {}: it is not the configured origin {} (a redirect?)",
                origin(url).unwrap_or_else(|| "an unknown host".into()),
                origin(origin_url).unwrap_or_else(|| "?".into())
            )));
        }
        if *attempts > 1
            && allowed.contains(CredentialType::SSH_KEY)
            && let Some(key) = &self.ssh_key_file
        {
            // The file's path, never its content.
            return Err(git2::Error::from_str(&format!(
                "the server refused the SSH key {} (is its public half in the server's authorized keys for this user?)",
                key.display()
            )));
        }
        if *attempts > 1 {
            return Err(git2::Error::from_str(
                match (&self.token, self.token_scheme) {
                    (Some(_), TokenScheme::Bearer) => {
                        "the server refused the bearer token (Authorization: Bearer); check token_file and token_scheme"
                    }
                    _ => "the server refused the credentials",
                },
            ));
        }
        if let (Some(_), TokenScheme::Bearer) = (&self.token, self.token_scheme) {
            // The token went as a header and the server still asks.
            return Err(git2::Error::from_str(
                "the server refused the bearer token (Authorization: Bearer); check token_file and token_scheme",
            ));
        }
        if allowed.contains(CredentialType::USER_PASS_PLAINTEXT)
            && let (Some(token), TokenScheme::Basic) = (&self.token, self.token_scheme)
        {
            return Cred::userpass_plaintext(&self.token_username, token);
        }
        if allowed.contains(CredentialType::SSH_KEY)
            && let Some(key) = &self.ssh_key_file
        {
            let user = username_from_url.unwrap_or("git");
            // Read ahead by a command that gave up root: libgit2 may no
            // longer open the file itself.
            if let Some(private) = crate::config::secret::preloaded(key)
                .and_then(|bytes| std::str::from_utf8(bytes).ok())
            {
                return Cred::ssh_key_from_memory(user, None, private, None);
            }
            return Cred::ssh_key(user, None, key, None);
        }
        if allowed.contains(CredentialType::USERNAME) {
            return Cred::username(username_from_url.unwrap_or("git"));
        }
        Err(git2::Error::from_str(
            "the server asks for credentials and none are configured",
        ))
    }

    /// Checks an SSH host key against `known_hosts_file`, for `host` on
    /// `port` (libgit2 passes the bare host name; the port comes from the
    /// configured URL). TLS certificates are left to libgit2's own
    /// verification.
    pub fn check_certificate(
        &self,
        cert: &Cert<'_>,
        host: &str,
        port: u16,
    ) -> Result<CertificateCheckStatus, SourceError> {
        let Some(hostkey) = cert.as_hostkey() else {
            return Ok(CertificateCheckStatus::CertificatePassthrough);
        };
        let refuse = |message: String| SourceError::HostKey {
            host: host.to_string(),
            message,
        };
        let Some(raw) = hostkey.hostkey() else {
            return Err(refuse("the server sent no raw host key to compare".into()));
        };
        let key = PublicKey::from_bytes(raw)
            .map_err(|e| refuse(format!("the server's host key cannot be read ({e})")))?;
        let fingerprint = key.fingerprint(HashAlg::Sha256);
        let algorithm = key.algorithm();
        // What ssh-keyscan writes for this host: `host`, or `[host]:port`
        // off port 22.
        let name = known_hosts_name(host, port);
        let keyscan = if port == 22 {
            format!("ssh-keyscan {host}")
        } else {
            format!("ssh-keyscan -p {port} {host}")
        };
        let Some(file) = &self.known_hosts_file else {
            return Err(refuse(format!(
                "no known_hosts_file is configured; verify the key ({algorithm} {fingerprint}) and add it: {keyscan} > known_hosts, then set known_hosts_file"
            )));
        };
        let text = read_secret(file)?;
        let mut host_known = false;
        for (number, line) in text.lines().enumerate() {
            let entry = match line.trim() {
                "" => continue,
                l if l.starts_with('#') => continue,
                l => match known_hosts::Entry::from_str(l) {
                    Ok(entry) => entry,
                    Err(e) => {
                        tracing::warn!(
                            "{}:{}: not a known_hosts entry tend can read ({e}); skipped",
                            file.display(),
                            number + 1
                        );
                        continue;
                    }
                },
            };
            if !entry_matches(entry.host_patterns(), &name) {
                continue;
            }
            let same_key = entry.public_key().key_data() == key.key_data();
            match entry.marker() {
                Some(known_hosts::Marker::Revoked) if same_key => {
                    return Err(refuse(format!(
                        "the host key {algorithm} {fingerprint} is marked @revoked in {}",
                        file.display()
                    )));
                }
                Some(_) => continue,
                None => {}
            }
            host_known = true;
            if same_key {
                return Ok(CertificateCheckStatus::CertificateOk);
            }
        }
        Err(refuse(if host_known {
            format!(
                "the host key CHANGED (now {algorithm} {fingerprint}); this may be an attack. If the change is expected, replace the entry for {name} in {}",
                file.display()
            )
        } else {
            format!(
                "{name} is not in {}; verify its key ({algorithm} {fingerprint}) and add it with: {keyscan} >> {}",
                file.display(),
                file.display()
            )
        }))
    }
}

/// The name a known_hosts file records for `host` on `port`.
fn known_hosts_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// Whether an entry's host field names `name` (`host` or `[host]:port`):
/// a hashed entry (`|1|salt|hash`, what `ssh-keyscan -H` and
/// `HashKnownHosts yes` write) by its HMAC-SHA1, a pattern list by its
/// patterns, where a matching negated pattern (`!host`) excludes.
fn entry_matches(patterns: &known_hosts::HostPatterns, name: &str) -> bool {
    match patterns {
        known_hosts::HostPatterns::HashedName { salt, hash } => {
            let Ok(mut mac) = Hmac::<Sha1>::new_from_slice(salt) else {
                return false;
            };
            mac.update(name.as_bytes());
            mac.verify_slice(hash).is_ok()
        }
        known_hosts::HostPatterns::Patterns(patterns) => {
            let mut matched = false;
            for pattern in patterns {
                if let Some(negated) = pattern.strip_prefix('!') {
                    if glob(negated, name) {
                        return false;
                    }
                } else if glob(pattern, name) {
                    matched = true;
                }
            }
            matched
        }
    }
}

/// OpenSSH's host pattern: `*` any run, `?` one character, compared
/// case-insensitively.
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (
        pattern.to_ascii_lowercase().chars().collect(),
        name.to_ascii_lowercase().chars().collect(),
    );
    // Iterative wildcard matching with one backtrack point.
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ssh-keyscan -H`'s entry for `[127.0.0.1]:2222`, made with this salt.
    fn hashed(name: &str, salt: &[u8]) -> known_hosts::HostPatterns {
        let mut mac = Hmac::<Sha1>::new_from_slice(salt).unwrap();
        mac.update(name.as_bytes());
        let hash: [u8; 20] = mac.finalize().into_bytes().into();
        known_hosts::HostPatterns::HashedName {
            salt: salt.to_vec(),
            hash,
        }
    }

    #[test]
    fn hashed_entries_match_their_host_and_port_only() {
        let entry = hashed("[127.0.0.1]:2222", b"salt-of-twenty-bytes");
        assert!(entry_matches(&entry, &known_hosts_name("127.0.0.1", 2222)));
        assert!(!entry_matches(&entry, &known_hosts_name("127.0.0.1", 22)));
        assert!(!entry_matches(&entry, &known_hosts_name("127.0.0.2", 2222)));
        let plain = hashed("git.example", b"salt");
        assert!(entry_matches(&plain, &known_hosts_name("git.example", 22)));
    }

    #[test]
    fn a_hashed_line_as_ssh_keygen_writes_it_parses() {
        // `ssh-keygen -H` output for host `git.example`.
        let salt = b"0123456789abcdefghij";
        let known_hosts::HostPatterns::HashedName { hash, .. } = hashed("git.example", salt) else {
            unreachable!()
        };
        use base64ct::{Base64, Encoding};
        let line = format!(
            "|1|{}|{} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE6JZUUoW8FVth3yBPI9h6Il/Y1jruBtxeEKyRpGKPGb",
            Base64::encode_string(salt),
            Base64::encode_string(&hash)
        );
        let entry = known_hosts::Entry::from_str(&line).unwrap();
        assert!(entry_matches(entry.host_patterns(), "git.example"));
        assert!(!entry_matches(entry.host_patterns(), "other.example"));
    }

    #[test]
    fn patterns_follow_openssh() {
        let patterns = |list: &[&str]| {
            known_hosts::HostPatterns::Patterns(list.iter().map(|s| s.to_string()).collect())
        };
        assert!(entry_matches(
            &patterns(&["git.example", "10.0.0.1"]),
            "10.0.0.1"
        ));
        assert!(entry_matches(&patterns(&["*.example"]), "git.example"));
        assert!(entry_matches(
            &patterns(&["[git.example]:2222"]),
            "[git.example]:2222"
        ));
        assert!(!entry_matches(
            &patterns(&["git.example"]),
            "[git.example]:2222"
        ));
        assert!(!entry_matches(
            &patterns(&["*.example", "!bad.example"]),
            "bad.example"
        ));
        assert!(entry_matches(&patterns(&["GIT.example"]), "git.example"));
        assert!(entry_matches(&patterns(&["git?.example"]), "git1.example"));
        assert!(!entry_matches(&patterns(&["other"]), "git.example"));
    }
}
