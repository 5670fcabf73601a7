//! Git's SSH allowed-signers file (`gpg.ssh.allowedSignersFile`, the
//! format of `ssh-keygen -Y verify`) and the check of one SSH signature
//! (`SSHSIG`, namespace `git`) against it.
//!
//! Each line is `principals [options] keytype base64-key [comment]`. The
//! options tend reads are `namespaces="…"`, `valid-after="…"` and
//! `valid-before="…"`; any other option (`cert-authority` among them)
//! refuses the file, so a line is never half understood.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ssh_key::authorized_keys;
use ssh_key::{HashAlg, PublicKey, SshSig};

use super::{Refused, TrustError};

/// The namespace git signs commits in (`ssh-keygen -Y sign -n git`).
const GIT_NAMESPACE: &str = "git";

/// One line of the file.
#[derive(Debug, Clone)]
struct AllowedSigner {
    principals: String,
    /// `None`: every namespace.
    namespaces: Option<Vec<String>>,
    valid_after: Option<SystemTime>,
    valid_before: Option<SystemTime>,
    key: PublicKey,
    line: usize,
}

impl AllowedSigner {
    fn allows_git(&self) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|ns| ns.iter().any(|n| n == GIT_NAMESPACE || n == "*"))
    }
}

/// The keys allowed to sign, read once (a reload of the configuration
/// reads the file again).
#[derive(Debug, Clone)]
pub struct AllowedSigners {
    file: PathBuf,
    entries: Vec<AllowedSigner>,
}

impl AllowedSigners {
    pub fn load(file: &Path) -> Result<Self, TrustError> {
        Self::parse(&super::read_file(file)?, file)
    }

    pub fn parse(text: &str, file: &Path) -> Result<Self, TrustError> {
        let invalid = |line: usize, message: String| TrustError::Invalid {
            file: file.to_path_buf(),
            line,
            message,
        };
        let mut entries = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let (principals, rest) = split_principals(trimmed)
                .ok_or_else(|| invalid(line, "expected principals, then a public key".into()))?;
            let (options, key) = split_options(rest);
            let key = PublicKey::from_openssh(key).map_err(|e| {
                invalid(
                    line,
                    format!("expected `[options] keytype base64-key` after the principals ({e})"),
                )
            })?;
            let options = authorized_keys::ConfigOptsIter::new(options).map_err(|e| {
                invalid(
                    line,
                    format!("the options `{options}` cannot be read ({e})"),
                )
            })?;
            let mut signer = AllowedSigner {
                principals: principals.to_string(),
                namespaces: None,
                valid_after: None,
                valid_before: None,
                key,
                line,
            };
            for option in options {
                let (name, value) = option.split_once('=').unwrap_or((option, ""));
                let value = value.trim_matches('"');
                match name.to_ascii_lowercase().as_str() {
                    "namespaces" => {
                        signer.namespaces = Some(value.split(',').map(str::to_string).collect());
                    }
                    "valid-after" => {
                        signer.valid_after = Some(parse_time(value).map_err(|m| invalid(line, m))?);
                    }
                    "valid-before" => {
                        signer.valid_before =
                            Some(parse_time(value).map_err(|m| invalid(line, m))?);
                    }
                    "cert-authority" => {
                        return Err(invalid(
                            line,
                            "cert-authority entries are not supported: list each signer's own key"
                                .into(),
                        ));
                    }
                    other => {
                        return Err(invalid(line, format!("unknown option `{other}`")));
                    }
                }
            }
            entries.push(signer);
        }
        if entries.is_empty() {
            return Err(TrustError::Empty {
                file: file.to_path_buf(),
                what: "allowed signers",
            });
        }
        Ok(AllowedSigners {
            file: file.to_path_buf(),
            entries,
        })
    }

    /// Checks `armored` (a commit's `gpgsig` header) over `data` (the
    /// commit without it) at `now`: the signer's description, or why not.
    pub fn verify(&self, armored: &str, data: &[u8], now: SystemTime) -> Result<String, Refused> {
        if armored.contains("BEGIN PGP SIGNATURE") {
            return Err(Refused::new(
                "an OpenPGP key",
                "the commit is signed with OpenPGP, and verify = \"ssh\"",
            ));
        }
        let signature = SshSig::from_pem(armored.trim()).map_err(|e| {
            Refused::new(
                "an unreadable signature",
                format!("the signature is not an SSH signature tend can read ({e})"),
            )
        })?;
        let key = PublicKey::from(signature.public_key().clone());
        let fingerprint = key.fingerprint(HashAlg::Sha256);
        let unknown = format!("SSH key {fingerprint}");
        let candidates: Vec<&AllowedSigner> = self
            .entries
            .iter()
            .filter(|e| e.key.key_data() == signature.public_key())
            .collect();
        let Some(first) = candidates.first() else {
            return Err(Refused::new(
                unknown,
                format!("the key is not in {}", self.file.display()),
            ));
        };
        let named = |e: &AllowedSigner| format!("{} (SSH key {fingerprint})", e.principals);
        if signature.namespace() != GIT_NAMESPACE {
            return Err(Refused::new(
                named(first),
                format!(
                    "signed for the namespace `{}`, not `git`",
                    signature.namespace()
                ),
            ));
        }
        let for_git: Vec<&AllowedSigner> = candidates
            .iter()
            .copied()
            .filter(|e| e.allows_git())
            .collect();
        let Some(first) = for_git.first() else {
            return Err(Refused::new(
                named(first),
                format!(
                    "line {} of {} does not allow the `git` namespace",
                    first.line,
                    self.file.display()
                ),
            ));
        };
        let Some(valid) = for_git.iter().find(|e| {
            e.valid_after.is_none_or(|t| now >= t) && e.valid_before.is_none_or(|t| now < t)
        }) else {
            let e = first;
            let window = match (e.valid_after, e.valid_before) {
                (Some(after), _) if now < after => {
                    format!("is valid only after {}", crate::time::rfc3339(after))
                }
                (_, Some(before)) => {
                    format!("was valid only before {}", crate::time::rfc3339(before))
                }
                _ => "is not valid now".to_string(),
            };
            return Err(Refused::timed(
                named(e),
                format!(
                    "the key {window} (line {} of {})",
                    e.line,
                    self.file.display()
                ),
            ));
        };
        key.verify(GIT_NAMESPACE, data, &signature).map_err(|_| {
            Refused::new(
                named(valid),
                "the signature does not match the commit's content (altered after signing?)",
            )
        })?;
        Ok(named(valid))
    }
}

/// The principals field (quoted when it holds spaces) and the rest.
fn split_principals(line: &str) -> Option<(&str, &str)> {
    if let Some(quoted) = line.strip_prefix('"') {
        let (principals, rest) = quoted.split_once('"')?;
        return Some((principals, rest.trim_start()));
    }
    let (principals, rest) = line.split_once(char::is_whitespace)?;
    Some((principals, rest.trim_start()))
}

/// The options field (absent when the key type comes first) and the key.
/// Options hold no unquoted whitespace.
fn split_options(rest: &str) -> (&str, &str) {
    let key_type =
        |s: &str| s.starts_with("ssh-") || s.starts_with("ecdsa-") || s.starts_with("sk-");
    if key_type(rest) {
        return ("", rest);
    }
    let mut quoted = false;
    for (i, c) in rest.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => return (&rest[..i], rest[i..].trim_start()),
            _ => {}
        }
    }
    (rest, "")
}

/// `YYYYMMDD[HHMM[SS]][Z]`, read as UTC (ssh-keygen reads a time without
/// `Z` as the host's local time; tend's hosts keep UTC, and a trust rule
/// must not move with a time zone setting).
fn parse_time(value: &str) -> Result<SystemTime, String> {
    let digits = value.strip_suffix(['Z', 'z']).unwrap_or(value);
    let bad =
        || format!("`{value}` is not a time (expected YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS)");
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let (date, time) = match digits.len() {
        8 => (digits, "000000".to_string()),
        12 => (&digits[..8], format!("{}00", &digits[8..])),
        14 => (&digits[..8], digits[8..].to_string()),
        _ => return Err(bad()),
    };
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &date[..4],
        &date[4..6],
        &date[6..8],
        &time[..2],
        &time[2..4],
        &time[4..6]
    );
    humantime::parse_rfc3339(&rfc3339).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE6JZUUoW8FVth3yBPI9h6Il/Y1jruBtxeEKyRpGKPGb";

    #[test]
    fn lines_with_options_and_quoted_principals_parse() {
        let text = format!(
            "# team\nalice@example.com {KEY} alice\n\"bob@example.com,carol@example.com\" namespaces=\"git,file\",valid-before=\"20300101Z\" {KEY}\n"
        );
        let signers = AllowedSigners::parse(&text, Path::new("signers")).unwrap();
        assert_eq!(signers.entries.len(), 2);
        assert_eq!(signers.entries[0].principals, "alice@example.com");
        assert!(signers.entries[0].namespaces.is_none());
        assert_eq!(
            signers.entries[1].principals,
            "bob@example.com,carol@example.com"
        );
        assert_eq!(
            signers.entries[1].valid_before,
            Some(humantime::parse_rfc3339("2030-01-01T00:00:00Z").unwrap())
        );
        assert_eq!(signers.entries[1].line, 3);
    }

    #[test]
    fn unknown_options_and_certificate_authorities_refuse_the_file() {
        for (line, needle) in [
            (format!("a@b cert-authority {KEY}"), "cert-authority"),
            (format!("a@b no-touch-required {KEY}"), "unknown option"),
            (format!("a@b valid-before=\"2030\" {KEY}"), "not a time"),
            ("a@b".to_string(), "expected principals"),
        ] {
            let e = AllowedSigners::parse(&line, Path::new("signers")).unwrap_err();
            assert!(e.to_string().contains(needle), "{line}: {e}");
            assert!(e.to_string().contains("signers:1"), "{e}");
        }
        let e = AllowedSigners::parse("# nothing\n", Path::new("signers")).unwrap_err();
        assert!(matches!(e, TrustError::Empty { .. }), "{e}");
    }

    #[test]
    fn times_are_read_as_utc() {
        assert_eq!(
            parse_time("202401021530").unwrap(),
            humantime::parse_rfc3339("2024-01-02T15:30:00Z").unwrap()
        );
        assert_eq!(
            parse_time("20240102153045Z").unwrap(),
            humantime::parse_rfc3339("2024-01-02T15:30:45Z").unwrap()
        );
        assert!(parse_time("2024-01-02").is_err());
    }
}
