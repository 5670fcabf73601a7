//! Which commits tend takes desired state from when `[source] verify` is
//! set: signed ones, by an allowed key (docs/source.md, "Signed commits").
//!
//! # Guarantees
//! * With a policy, a new head is accepted only when its commit carries a
//!   valid signature by an allowed key at the time of the check; with
//!   `verify_all`, every commit after the last accepted one up to the
//!   head too, merge commits included.
//! * A refusal is a [`SourceError::Unverified`] naming the commit, the
//!   signer (or "unsigned") and why: the last accepted snapshot stays in
//!   force, and nothing ever falls back to unverified.
//! * A commit is checked once per process: the result is cached by its
//!   id (the policy is fixed for a process's configuration; a reload
//!   builds a new one). An unchanged poll checks nothing.
//!
//! Validity windows (`valid-after`, `valid-before`) are compared with the
//! time of the check, not the commit's date: the date is written by
//! whoever made the commit, and an expired key must not be able to bring
//! in a new head by backdating it.

pub(crate) mod allowed_signers;
#[cfg(feature = "gpg")]
pub(crate) mod keyring;

use std::collections::HashMap;
use std::path::PathBuf;

/// The most an allowed-signers file or keyring may hold.
const MAX_TRUST_FILE_BYTES: u64 = 16 * 1024 * 1024;
use std::sync::Arc;
use std::time::SystemTime;

use git2::{Oid, Repository};

pub use allowed_signers::AllowedSigners;
#[cfg(feature = "gpg")]
pub(crate) use keyring::Keyring;

use super::SourceError;

/// Reading a trust file failed; the configuration cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrustError {
    #[error("cannot read {}: {message}", file.display())]
    Read { file: PathBuf, message: String },
    #[error("{}:{line}: {message}", file.display())]
    Invalid {
        file: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{} holds no {what}: tend would refuse every commit", file.display())]
    Empty { file: PathBuf, what: &'static str },
    /// A `verify` mode this build leaves out (a cargo feature).
    #[error(
        "verify = \"{verify}\" is not in this build (cargo feature `{verify}`): use a build with it"
    )]
    NotBuilt { verify: &'static str },
}

/// The text of a signers file or keyring.
fn read_file(file: &std::path::Path) -> Result<String, TrustError> {
    if let Some(bytes) = crate::config::secret::preloaded(file) {
        return String::from_utf8(bytes.to_vec()).map_err(|e| TrustError::Read {
            file: file.to_path_buf(),
            message: e.to_string(),
        });
    }
    crate::files::read_regular_to_string(file, MAX_TRUST_FILE_BYTES).map_err(|e| TrustError::Read {
        file: file.to_path_buf(),
        message: e.to_string(),
    })
}

/// Why one commit's signature was not accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub signer: String,
    pub reason: String,
    /// Refused for a validity window only (then not cached: the window
    /// may open while the process runs).
    timed: bool,
}

impl Refused {
    pub fn new(signer: impl Into<String>, reason: impl Into<String>) -> Self {
        Refused {
            signer: signer.into(),
            reason: reason.into(),
            timed: false,
        }
    }

    pub(super) fn timed(signer: impl Into<String>, reason: impl Into<String>) -> Self {
        Refused {
            timed: true,
            ..Refused::new(signer, reason)
        }
    }
}

/// `[source] verify`.
#[derive(Debug, Clone, Default)]
pub enum TrustPolicy {
    /// Every commit is accepted (the default).
    #[default]
    None,
    Ssh(Arc<AllowedSigners>),
    #[cfg(feature = "gpg")]
    Gpg(Arc<Keyring>),
}

/// The source's trust settings.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    pub policy: TrustPolicy,
    /// Every new commit, not only the head.
    pub verify_all: bool,
}

impl Trust {
    /// `[source] verify`'s trust, with the signers file or keyring read.
    pub fn from_config(source: &crate::config::SourceConfig) -> Result<Trust, TrustError> {
        use crate::config::VerifyMode;
        let policy = match (
            source.verify,
            &source.allowed_signers_file,
            &source.gpg_keyring_file,
        ) {
            (VerifyMode::Ssh, Some(file), _) => {
                TrustPolicy::Ssh(Arc::new(AllowedSigners::load(file)?))
            }
            #[cfg(feature = "gpg")]
            (VerifyMode::Gpg, _, Some(file)) => TrustPolicy::Gpg(Arc::new(Keyring::load(file)?)),
            // Never "accept everything" for a verify this build cannot do.
            #[cfg(not(feature = "gpg"))]
            (VerifyMode::Gpg, _, _) => return Err(TrustError::NotBuilt { verify: "gpg" }),
            _ => TrustPolicy::None,
        };
        Ok(Trust {
            policy,
            verify_all: source.verify_all,
        })
    }

    pub fn is_enabled(&self) -> bool {
        !matches!(self.policy, TrustPolicy::None)
    }
}

/// Checks new heads against a [`Trust`], caching results by commit id.
#[derive(Debug, Default)]
pub(crate) struct Verifier {
    trust: Trust,
    /// Commit → its signer, or why it was refused.
    checked: HashMap<Oid, Result<String, Refused>>,
}

impl Verifier {
    pub(crate) fn new(trust: Trust) -> Self {
        Verifier {
            trust,
            checked: HashMap::new(),
        }
    }

    /// Whether `head` may become the accepted commit after `accepted`.
    pub(crate) fn check(
        &mut self,
        repo: &Repository,
        head: Oid,
        accepted: Option<Oid>,
        now: SystemTime,
    ) -> Result<(), SourceError> {
        if !self.trust.is_enabled() || Some(head) == accepted {
            return Ok(());
        }
        self.check_one(repo, head, now)?;
        if !self.trust.verify_all {
            return Ok(());
        }
        // The first accepted commit is checked alone: the history before
        // it is what the operator pointed tend at.
        let Some(accepted) = accepted else {
            return Ok(());
        };
        let range = new_commits(repo, head, accepted).map_err(|e| SourceError::Repository {
            path: repo.path().display().to_string(),
            source: crate::cause::Cause::explained(
                format!("cannot list the commits after {accepted}: {}", e.message()),
                e,
            ),
        })?;
        let checked = range.len();
        for commit in range {
            self.check_one(repo, commit, now)?;
        }
        tracing::debug!("source: {checked} new commits verified up to {head}");
        Ok(())
    }

    fn check_one(
        &mut self,
        repo: &Repository,
        commit: Oid,
        now: SystemTime,
    ) -> Result<(), SourceError> {
        let result = match self.checked.get(&commit) {
            Some(result) => result.clone(),
            None => {
                let result = self.verify(repo, commit, now);
                if let Ok(signer) = &result {
                    tracing::info!("source: commit {commit} is signed by {signer}");
                }
                if !matches!(&result, Err(r) if r.timed) {
                    self.checked.insert(commit, result.clone());
                }
                result
            }
        };
        result.map(|_| ()).map_err(|r| SourceError::Unverified {
            commit: commit.to_string(),
            signer: r.signer,
            reason: r.reason,
        })
    }

    fn verify(&self, repo: &Repository, commit: Oid, now: SystemTime) -> Result<String, Refused> {
        let (signature, data) = match repo.extract_signature(&commit, None) {
            Ok(found) => found,
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                return Err(Refused::new("unsigned", "the commit carries no signature"));
            }
            Err(e) => {
                return Err(Refused::new(
                    "unknown",
                    format!("cannot read the commit's signature: {}", e.message()),
                ));
            }
        };
        let Ok(armored) = std::str::from_utf8(&signature) else {
            return Err(Refused::new(
                "an unreadable signature",
                "the signature is not text",
            ));
        };
        match &self.trust.policy {
            TrustPolicy::None => Ok("nobody (verify = \"none\")".into()),
            TrustPolicy::Ssh(signers) => signers.verify(armored, &data, now),
            #[cfg(feature = "gpg")]
            TrustPolicy::Gpg(keyring) => keyring.verify(armored, &data, now),
        }
    }
}

/// The commits reachable from `head` and not from `accepted`, merge
/// commits included.
fn new_commits(repo: &Repository, head: Oid, accepted: Oid) -> Result<Vec<Oid>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    // An accepted commit missing from the local data (a shallow clone
    // that never had it) hides nothing: every commit is checked.
    if repo.find_commit(accepted).is_ok() {
        walk.hide(accepted)?;
    }
    walk.collect()
}
