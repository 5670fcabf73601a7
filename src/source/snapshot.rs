//! A snapshot: one commit's declarations, read from its tree (no work tree).

use std::path::Path;
use std::time::{Duration, SystemTime};

use git2::{ObjectType, Oid, Repository, TreeWalkMode, TreeWalkResult};

use super::SourceError;
use crate::model::{DeclarationSet, is_yaml};

/// What one commit declares.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Full hex commit id.
    pub commit: String,
    pub commit_time: SystemTime,
    /// Declaration files (paths from the repository root) and their blob
    /// ids, sorted by path.
    pub files: Vec<(String, Oid)>,
    /// Parsed declarations and diagnostics; file paths are relative to the
    /// repository root.
    pub declarations: DeclarationSet,
}

/// The tree under `path` in `commit` (its id names every declaration file
/// below it, so an unchanged id means unchanged declarations) and the
/// commit's time.
pub fn declarations_tree(
    repo: &Repository,
    commit: Oid,
    path: &str,
) -> Result<(SystemTime, Oid), SourceError> {
    let repo_err = |e: git2::Error| SourceError::Repository {
        path: repo.path().display().to_string(),
        message: e.message().to_string(),
    };
    let commit_obj = repo.find_commit(commit).map_err(repo_err)?;
    let seconds = u64::try_from(commit_obj.time().seconds()).unwrap_or(0);
    let time = SystemTime::UNIX_EPOCH + Duration::from_secs(seconds);
    let root = commit_obj.tree().map_err(repo_err)?;
    let prefix = path.trim_matches('/');
    if prefix.is_empty() || prefix == "." {
        return Ok((time, root.id()));
    }
    let entry = root
        .get_path(Path::new(prefix))
        .map_err(|_| SourceError::PathMissing {
            path: prefix.to_string(),
            commit: commit.to_string(),
        })?;
    if entry.kind() != Some(ObjectType::Tree) {
        return Err(SourceError::PathMissing {
            path: prefix.to_string(),
            commit: commit.to_string(),
        });
    }
    // Only the id: reading a tree of thousands of entries is left to
    // `list_files`, which is not called when the id is unchanged.
    Ok((time, entry.id()))
}

/// The declaration files in `tree` (found at `path`), with blob ids,
/// sorted by path.
pub fn list_files(
    repo: &Repository,
    tree: Oid,
    path: &str,
) -> Result<Vec<(String, Oid)>, SourceError> {
    let repo_err = |e: git2::Error| SourceError::Repository {
        path: repo.path().display().to_string(),
        message: e.message().to_string(),
    };
    let tree = repo.find_tree(tree).map_err(repo_err)?;
    let prefix = path.trim_matches('/');
    let base = if prefix.is_empty() || prefix == "." {
        String::new()
    } else {
        format!("{prefix}/")
    };
    let mut files = Vec::new();
    tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        let name = entry.name().unwrap_or("");
        if name.starts_with('.') {
            return TreeWalkResult::Skip;
        }
        // Symlinks (mode 120000) are blobs holding a path: never declarations.
        if entry.kind() == Some(ObjectType::Blob) && entry.filemode() != 0o120000 {
            let file = format!("{base}{dir}{name}");
            if is_yaml(Path::new(&file)) {
                files.push((file, entry.id()));
            }
        }
        TreeWalkResult::Ok
    })
    .map_err(repo_err)?;
    files.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}
