//! Secret files (`*_file`, systemd `LoadCredential=`): read with a bound,
//! so `/dev/zero` cannot hang the agent, and never echoed in a message.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::ConfigError;

/// The most a secret file may hold.
pub(crate) const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// Files read ahead by [`preload`], by path.
static PRELOADED: std::sync::OnceLock<std::collections::BTreeMap<PathBuf, Vec<u8>>> =
    std::sync::OnceLock::new();

/// Reads every one of `paths` now, and serves them from memory for the
/// rest of the process: for a command run as root that is about to act as
/// the state dir's owner ([`crate::process::owner`]), who may not read
/// root-only secrets (`/etc/tend/secrets`). A file that cannot be read is
/// left out: its later read fails as it would have. Once per process; the
/// agent never calls it (a reload reads its secrets afresh).
pub(crate) fn preload(paths: impl IntoIterator<Item = PathBuf>) {
    let mut read = std::collections::BTreeMap::new();
    for path in paths {
        let bytes = crate::files::read_regular(&path, MAX_SECRET_BYTES);
        if let Ok(bytes) = bytes {
            read.insert(path, bytes);
        }
    }
    let _ = PRELOADED.set(read);
}

/// The bytes of `path` as [`preload`] read them, if it did.
pub(crate) fn preloaded(path: &Path) -> Option<&'static [u8]> {
    PRELOADED.get()?.get(path).map(Vec::as_slice)
}

/// Reads a secret: the file's text without its trailing line break.
/// Missing, unreadable, empty or oversized files are configuration errors
/// naming the setting and the path, never the content.
pub(crate) fn read(setting: &str, path: &Path) -> Result<String, ConfigError> {
    let failed = |message: String, cause: Option<std::io::Error>| ConfigError::Secret {
        setting: setting.to_string(),
        path: path.to_path_buf(),
        message,
        cause,
    };
    let fail = |message: String| failed(message, None);
    if let Some(bytes) = preloaded(path) {
        return check(bytes.to_vec(), fail);
    }
    let file = crate::files::open_regular(path).map_err(|e| {
        if super::credential_path(path).is_some() {
            failed(format!(
                "cannot open it: CREDENTIALS_DIRECTORY is not set (systemd sets it inside the service, from LoadCredential=) and {} does not exist (no tend.service is running); outside the service, point it at the directory holding the same files, e.g. `sudo CREDENTIALS_DIRECTORY=/etc/tend/secrets tend …` (docs/operations.md)",
                super::RUNNING_SERVICE_CREDENTIALS
            ), Some(e))
        } else {
            failed(format!("cannot open it: {e}"), Some(e))
        }
    })?;
    warn_if_world_readable(setting, path);
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| failed(format!("cannot read it: {e}"), Some(e)))?;
    check(bytes, fail)
}

/// A secret file's bytes as its text, or why they are not one.
fn check(bytes: Vec<u8>, fail: impl Fn(String) -> ConfigError) -> Result<String, ConfigError> {
    if bytes.len() as u64 > MAX_SECRET_BYTES {
        return Err(fail(format!(
            "it holds more than {MAX_SECRET_BYTES} bytes; a secret file holds one secret"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| fail("it is not UTF-8 text".into()))?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(fail("it is empty".into()));
    }
    // A secret of blanks is a file written wrong, and a webhook signed
    // with one would verify.
    if secret.trim().is_empty() {
        return Err(fail(
            "it holds only blanks (spaces, tabs); a secret file holds the secret".into(),
        ));
    }
    Ok(secret.to_string())
}

/// Warns when a secret file is readable by every user (its mode lets
/// anyone on the host read the token). Not an error: a credential
/// systemd hands the service is the service's alone whatever the source
/// file's mode, and refusing would stop an agent over a chmod.
fn warn_if_world_readable(setting: &str, path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o004 != 0
    {
        tracing::warn!(
            "{setting} = {}: the secret file is readable by every user (mode {:o}); `chmod o-r {}`",
            path.display(),
            meta.permissions().mode() & 0o7777,
            path.display()
        );
    }
}

impl super::Config {
    /// Every file the configuration names for a secret, a key or a
    /// certificate: what a command about to give up root reads first
    /// ([`secret::preload`]).
    pub fn secret_files(&self) -> Vec<PathBuf> {
        let s = &self.source;
        let mut files: Vec<PathBuf> = [
            &s.token_file,
            &s.ssh_key_file,
            &s.known_hosts_file,
            &s.allowed_signers_file,
            &s.gpg_keyring_file,
            &self.server.webhook_secret_file,
            &self.server.token_file,
            &self.state.password_file,
            &self.state.tls_ca_file,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        for receiver in &self.notify {
            files.extend(
                receiver
                    .url_file
                    .iter()
                    .chain(&receiver.secret_file)
                    .chain(&receiver.token_file)
                    .cloned(),
            );
        }
        for provider in self.providers.values() {
            files.extend(provider.files());
        }
        files
    }

    /// The webhook secret (`[server] webhook_secret_file`), read from its
    /// file; `None` when none is configured.
    pub fn webhook_secret(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        self.server
            .webhook_secret_file
            .as_deref()
            .map(|file| read("[server] webhook_secret_file", file).map(String::into_bytes))
            .transpose()
    }

    /// The bearer token of the server's reports and reconcile route
    /// (`[server] token_file`); `None` when none is configured.
    pub fn server_token(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        self.server
            .token_file
            .as_deref()
            .map(|file| read("[server] token_file", file).map(String::into_bytes))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_secret_file_keeps_the_io_error_as_its_cause() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let err = read("token_file", &missing).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "token_file = {}: cannot open it: No such file or directory (os error 2)",
                missing.display()
            )
        );
        let cause = std::error::Error::source(&err).expect("a cause");
        let io = cause
            .downcast_ref::<std::io::Error>()
            .expect("an I/O error");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn secrets_are_bounded_and_never_empty() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, "s3cret\n").unwrap();
        assert_eq!(read("password_file", &good).unwrap(), "s3cret");

        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let err = read("password_file", &empty).unwrap_err().to_string();
        assert!(
            err.contains("is empty") && err.contains("password_file"),
            "{err}"
        );

        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 70_000]).unwrap();
        assert!(
            read("password_file", &big)
                .unwrap_err()
                .to_string()
                .contains("more than")
        );

        let zero = read("token_file", Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(zero.contains("character device"), "{zero}");

        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; MAX_SECRET_BYTES as usize + 1]).unwrap();
        let big = read("token_file", &big).unwrap_err().to_string();
        assert!(big.contains("more than"), "{big}");

        let missing = read("token_file", &dir.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("cannot open"), "{missing}");
    }
}
