//! Where a reader (`tend plan`, `explain`, `propose`) fetches: a bare
//! repository of its own, never the state dir's.
//!
//! The state dir belongs to the agent's user. A reader run by another user
//! (root beside the shipped unit) that fetched there would leave packs and
//! refs the agent cannot write past, and the agent would fail every fetch
//! and publish until someone ran `chown -R`. So a reader fetches into a
//! cache under its own home (`$XDG_CACHE_HOME/tend/…`, else
//! `$HOME/.cache/tend/…`), or into a temporary directory removed when it
//! ends, and only reads the state dir.
//!
//! # Guarantees
//! * Nothing under the state dir is created, changed or removed.
//! * The reader's repository borrows the state dir's objects (Git
//!   alternates) and starts its negotiation from the last accepted commit,
//!   so a reader fetches only what the agent has not: a new cache is not a
//!   new clone.
//! * A cache directory another user owns or may write is never used (a
//!   planted repository would decide what the reader sees): the reader
//!   falls back to a temporary directory.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use super::SourceError;

/// The reader's repository, and the temporary directory holding it when
/// no cache under the home could be used (removed when this is dropped).
#[derive(Debug)]
pub struct ReaderRepo {
    pub dir: PathBuf,
    _temporary: Option<tempfile::TempDir>,
}

/// The name of the ref that tells the remote what the reader already has.
const BASE_REF: &str = "refs/tend/base";

/// Prepares the reader's repository for the source of `state_dir` at
/// `url`: its own cache when it can be trusted, else a temporary one.
pub(crate) fn prepare(state_dir: &Path, url: &str) -> Result<ReaderRepo, SourceError> {
    let key = crate::model::hash::sha256_hex(
        format!("{}\n{url}", absolute(state_dir).display()).as_bytes(),
    );
    let cached = cache_root().and_then(|root| {
        let dir = root.join("tend").join(&key[..16]).join("repo.git");
        trusted_dir(&dir).then_some(dir)
    });
    let (dir, temporary) = match cached {
        Some(dir) => (dir, None),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("tend-reader-")
                .tempdir()
                .map_err(|e| SourceError::Io {
                    path: std::env::temp_dir().display().to_string(),
                    source: crate::cause::Cause::explained(
                        format!("cannot make a directory to fetch into: {e}"),
                        e,
                    ),
                })?;
            (temp.path().join("repo.git"), Some(temp))
        }
    };
    drop(super::fetch::open_or_init(&dir)?);
    borrow_objects(&dir, state_dir);
    Ok(ReaderRepo {
        dir,
        _temporary: temporary,
    })
}

/// `$XDG_CACHE_HOME`, else `$HOME/.cache` (absolute paths only).
fn cache_root() -> Option<PathBuf> {
    let from = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    from("XDG_CACHE_HOME").or_else(|| from("HOME").map(|home| home.join(".cache")))
}

/// Creates `dir` (0700) where missing and says whether every directory
/// from the cache root down is this user's and writable by no one else.
fn trusted_dir(dir: &Path) -> bool {
    if fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .is_err()
    {
        return false;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    // From `…/tend` down: the directories tend made.
    let mut at = Some(dir);
    let mut checked = 0;
    while let Some(path) = at {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return false;
        };
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
            return false;
        }
        checked += 1;
        if checked == 3 {
            break;
        }
        at = path.parent();
    }
    true
}

fn absolute(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Points the reader's repository at the state dir's objects (read only)
/// and at the last accepted commit, so that its fetch asks only for what
/// is new. Best effort: without it the fetch is whole, never wrong.
fn borrow_objects(dir: &Path, state_dir: &Path) {
    let agents = absolute(&super::repo_dir(state_dir));
    let objects = agents.join("objects");
    if !objects.is_dir() {
        return;
    }
    let alternates = dir.join("objects").join("info").join("alternates");
    let wanted = format!("{}\n", objects.display());
    if fs::read_to_string(&alternates).ok().as_deref() != Some(wanted.as_str()) {
        let written = alternates
            .parent()
            .map_or(Ok(()), fs::create_dir_all)
            .and_then(|()| fs::write(&alternates, &wanted));
        if let Err(e) = written {
            tracing::debug!("source: cannot borrow the agent's objects: {e}");
            return;
        }
    }
    // A shallow agent repository: the reader's is shallow at the same
    // commits, or its history walk would miss the parents beyond them.
    if let Ok(shallow) = fs::read(agents.join("shallow")) {
        let _ = fs::write(dir.join("shallow"), shallow);
    }
    let accepted = fs::read_to_string(state_dir.join("source").join("accepted-commit"))
        .ok()
        .and_then(|text| Oid::from_str(text.trim()).ok());
    // Opened again: the object database reads the alternates at open.
    if let Some(commit) = accepted
        && let Ok(repo) = Repository::open_bare(dir)
        && repo.find_commit(commit).is_ok()
    {
        let _ = repo.reference(
            BASE_REF,
            commit,
            true,
            "tend: the agent's last accepted commit",
        );
    }
}
