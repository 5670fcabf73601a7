//! Credentials for fetching: an HTTP token (basic or bearer) and SSH keys
//! with a known_hosts check. Secrets are read from files, never logged.

use std::fs;
use std::path::{Path, PathBuf};

use git2::cert::Cert;
use git2::{CertificateCheckStatus, Cred, CredentialType};

use super::SourceError;

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

/// `scheme://host[:port]` of a URL, without a user part or path
/// (lower-cased: hosts and schemes compare case-insensitively).
pub fn origin(url: &str) -> Option<String> {
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
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| SourceError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
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
            return Cred::ssh_key(username_from_url.unwrap_or("git"), None, key, None);
        }
        if allowed.contains(CredentialType::USERNAME) {
            return Cred::username(username_from_url.unwrap_or("git"));
        }
        Err(git2::Error::from_str(
            "the server asks for credentials and none are configured",
        ))
    }

    /// Checks an SSH host key against `known_hosts_file`. TLS certificates
    /// are left to libgit2's own verification.
    pub fn check_certificate(
        &self,
        cert: &Cert<'_>,
        host: &str,
    ) -> Result<CertificateCheckStatus, SourceError> {
        let Some(hostkey) = cert.as_hostkey() else {
            return Ok(CertificateCheckStatus::CertificatePassthrough);
        };
        let (Some(key), Some(kind)) = (hostkey.hostkey(), hostkey.hostkey_type()) else {
            return Err(SourceError::HostKey {
                host: host.to_string(),
                message: "the server sent no raw host key to compare".into(),
            });
        };
        let fingerprint = format!(
            "SHA256:{}",
            base64_encode(&sha256(key)).trim_end_matches('=')
        );
        let Some(file) = &self.known_hosts_file else {
            return Err(SourceError::HostKey {
                host: host.to_string(),
                message: format!(
                    "no known_hosts_file is configured; verify the key ({fingerprint}) and add it: ssh-keyscan {host} > known_hosts, then set known_hosts_file"
                ),
            });
        };
        let text = read_secret(file)?;
        let name = kind.name();
        let mut host_known = false;
        for entry in parse_known_hosts(&text) {
            if !entry.hosts.iter().any(|h| host_matches(h, host)) {
                continue;
            }
            host_known = true;
            if entry.key_type == name && entry.key == key {
                return Ok(CertificateCheckStatus::CertificateOk);
            }
        }
        let message = if host_known {
            format!(
                "the host key CHANGED (now {name} {fingerprint}); this may be an attack. If the change is expected, replace the entry for {host} in {}",
                file.display()
            )
        } else {
            format!(
                "{host} is not in {}; verify its key ({name} {fingerprint}) and add it with: ssh-keyscan {host} >> {}",
                file.display(),
                file.display()
            )
        };
        Err(SourceError::HostKey {
            host: host.to_string(),
            message,
        })
    }
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

/// One plain known_hosts line (hashed `|1|` entries are skipped: they need
/// HMAC-SHA1; use plain entries for tend's file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownHost {
    pub hosts: Vec<String>,
    pub key_type: String,
    pub key: Vec<u8>,
}

pub fn parse_known_hosts(text: &str) -> Vec<KnownHost> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.is_empty()
                || line.starts_with('#')
                || line.starts_with('|')
                || line.starts_with('@')
            {
                return None;
            }
            let mut parts = line.split_whitespace();
            let hosts = parts.next()?.split(',').map(str::to_string).collect();
            let key_type = parts.next()?.to_string();
            let key = base64_decode(parts.next()?)?;
            Some(KnownHost {
                hosts,
                key_type,
                key,
            })
        })
        .collect()
}

/// `host` or `[host]:port` (libgit2 passes the bare host name).
fn host_matches(pattern: &str, host: &str) -> bool {
    pattern == host
        || pattern
            .strip_prefix('[')
            .and_then(|p| p.split_once("]:"))
            .is_some_and(|(h, _)| h == host)
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (known_hosts keys and fingerprints only).
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for input in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar"] {
            assert_eq!(base64_decode(&base64_encode(input)).unwrap(), input);
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
    }

    #[test]
    fn known_hosts_lines_parse() {
        let text = "# comment\ngit.example,10.0.0.1 ssh-ed25519 Zm9vYmFy\n[git.example]:2222 ssh-rsa Zm8=\n|1|hashed|entry ssh-rsa Zm8=\n";
        let entries = parse_known_hosts(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].hosts, vec!["git.example", "10.0.0.1"]);
        assert_eq!(entries[0].key, b"foobar");
        assert!(host_matches(&entries[1].hosts[0], "git.example"));
        assert!(!host_matches("other", "git.example"));
    }
}
