//! A snapshot: one commit's declarations, read from its tree (no work tree).

use std::collections::BTreeMap;
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
    /// Declaration files (paths from the repository root) and their blob ids.
    pub files: BTreeMap<String, String>,
    /// Parsed declarations and diagnostics; file paths are relative to the
    /// repository root.
    pub declarations: DeclarationSet,
}

/// The declaration files under `path` in `commit`'s tree, with blob ids.
pub fn list_files(
    repo: &Repository,
    commit: Oid,
    path: &str,
) -> Result<(SystemTime, BTreeMap<String, Oid>), SourceError> {
    let repo_err = |e: git2::Error| SourceError::Repository {
        path: repo.path().display().to_string(),
        message: e.message().to_string(),
    };
    let commit_obj = repo.find_commit(commit).map_err(repo_err)?;
    let seconds = u64::try_from(commit_obj.time().seconds()).unwrap_or(0);
    let time = SystemTime::UNIX_EPOCH + Duration::from_secs(seconds);
    let root = commit_obj.tree().map_err(repo_err)?;
    let prefix = path.trim_matches('/');
    let tree = if prefix.is_empty() || prefix == "." {
        root
    } else {
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
        repo.find_tree(entry.id()).map_err(repo_err)?
    };
    let base = if prefix.is_empty() || prefix == "." {
        String::new()
    } else {
        format!("{prefix}/")
    };
    let mut files = BTreeMap::new();
    tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        let name = entry.name().unwrap_or("");
        if name.starts_with('.') {
            return TreeWalkResult::Skip;
        }
        // Symlinks (mode 120000) are blobs holding a path: never declarations.
        if entry.kind() == Some(ObjectType::Blob) && entry.filemode() != 0o120000 {
            let file = format!("{base}{dir}{name}");
            if is_yaml(Path::new(&file)) {
                files.insert(file, entry.id());
            }
        }
        TreeWalkResult::Ok
    })
    .map_err(repo_err)?;
    Ok((time, files))
}
