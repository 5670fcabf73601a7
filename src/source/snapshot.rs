//! A snapshot: one commit's declarations, read from its tree (no work tree).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use git2::{ObjectType, Oid, Repository};

use super::SourceError;
use crate::model::DeclarationSet;

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
    /// The declarations grouped by the provider they name, made at first
    /// use: `Default::default()` when building a snapshot.
    pub provider_groups: ProviderGroups,
}

/// A snapshot's declarations grouped by `spec.provider`, as positions in
/// the sorted set: a provider worker's cycle takes its own group and the
/// declarations that name no configured provider, instead of passing over
/// the whole fleet (at 100,000 declarations over 10 providers, each of
/// the ten cycles of a no-change request spent 25 ms doing that).
///
/// Made from the declarations at first use and kept with the snapshot,
/// which is not changed once built (it is shared behind an `Arc`).
#[derive(Debug, Clone, Default)]
pub struct ProviderGroups(std::sync::OnceLock<Groups>);

#[derive(Debug, Clone, Default)]
struct Groups {
    /// By the provider named; each list ascending.
    named: std::collections::HashMap<String, Vec<usize>>,
    /// Those that name none (ascending).
    unnamed: Vec<usize>,
}

impl ProviderGroups {
    fn of<'a>(&'a self, declarations: &DeclarationSet) -> &'a Groups {
        self.0.get_or_init(|| {
            let mut groups = Groups::default();
            for (at, decl) in declarations.declarations.iter().enumerate() {
                match &decl.manifest.spec.provider {
                    // The name is copied once a provider, not once a
                    // declaration (100,000 allocations on the first cycle
                    // of every commit).
                    Some(name) => match groups.named.get_mut(&**name) {
                        Some(group) => group.push(at),
                        None => {
                            groups.named.insert(name.to_string(), vec![at]);
                        }
                    },
                    None => groups.unnamed.push(at),
                }
            }
            groups
        })
    }
}

impl Snapshot {
    /// The positions, ascending, of the declarations that name `provider`
    /// and of those whose named provider `configured` does not know, or
    /// that name none: all a cycle of `provider`'s worker routes (every
    /// other declaration belongs to another configured provider's
    /// worker).
    ///
    /// Borrowed from the snapshot exactly when the provider's own group is
    /// all of it (the usual case; every declaration then names
    /// `provider`): a copy of 10,000 positions at every cycle was a large
    /// allocation in a fragmented heap.
    pub(crate) fn routed_by(
        &self,
        provider: &str,
        configured: impl Fn(&str) -> bool,
    ) -> std::borrow::Cow<'_, [usize]> {
        let groups = self.provider_groups.of(&self.declarations);
        let own: &[usize] = groups.named.get(provider).map_or(&[], Vec::as_slice);
        let others: Vec<&Vec<usize>> = groups
            .named
            .iter()
            .filter(|(name, _)| *name != provider && !configured(name))
            .map(|(_, group)| group)
            .chain(Some(&groups.unnamed).filter(|unnamed| !unnamed.is_empty()))
            .collect();
        if others.is_empty() {
            return std::borrow::Cow::Borrowed(own);
        }
        let mut picked = own.to_vec();
        for group in others {
            picked.extend(group);
        }
        picked.sort_unstable();
        std::borrow::Cow::Owned(picked)
    }

    /// The declaration named `name` (a search of the sorted set).
    pub(crate) fn declared(&self, name: &str) -> Option<&crate::model::Declaration> {
        self.position_of(name)
            .map(|i| self.declarations.declarations[i].as_ref())
    }

    /// Where the declaration named `name` is in the sorted set.
    pub(crate) fn position_of(&self, name: &str) -> Option<usize> {
        self.declarations
            .declarations
            .binary_search_by(|d| d.name().cmp(name))
            .ok()
    }

    /// The parse results it was built from, sharing its declarations:
    /// the files (path order) with their declarations (file order), when
    /// the declarations are exactly what the files parse to alone. `None`
    /// for a snapshot with any diagnostic, since a diagnostic may be one
    /// file's view of another (a name declared in two files drops both
    /// copies, and the file that keeps its bytes would come back without
    /// its own); and for a declaration whose file is not among the files
    /// (results without it would be wrong for that file).
    ///
    /// The declarations are sorted by their file's path and merged with
    /// the files, one allocation a file (its path): grouping them in a map
    /// of paths, a list each, took 160 ms of a core at 100,000 files at
    /// every commit.
    pub(crate) fn parse_results(&self) -> Option<super::parse_cache::ParsedTree> {
        use super::parse_cache::{ParsedFile, ParsedTree, object_id};
        if !self.declarations.diagnostics.is_empty() {
            return None;
        }
        fn file_of(d: &Arc<crate::model::Declaration>) -> &[u8] {
            d.file.as_os_str().as_encoded_bytes()
        }
        let mut by_file: Vec<&Arc<crate::model::Declaration>> =
            self.declarations.declarations.iter().collect();
        by_file.sort_unstable_by(|a, b| {
            file_of(a)
                .cmp(file_of(b))
                .then((a.line, a.column).cmp(&(b.line, b.column)))
        });
        let mut out = ParsedTree {
            tree: None,
            files: Vec::with_capacity(self.files.len()),
            declarations: Vec::with_capacity(by_file.len()),
            on_disk: None,
        };
        let mut rest = by_file.as_slice();
        for (path, blob) in &self.files {
            let own = rest
                .iter()
                .take_while(|d| file_of(d) == path.as_bytes())
                .count();
            let (declarations, after) = rest.split_at(own);
            rest = after;
            out.declarations
                .extend(declarations.iter().map(|d| Arc::clone(d)));
            out.files.push(ParsedFile {
                path: path.clone(),
                blob: object_id(*blob),
                declarations: own,
                diagnostics: Vec::new(),
            });
        }
        // Each file's declarations came right before the next file's: a
        // declaration left over names a file not listed.
        rest.is_empty().then_some(out)
    }
}

/// The tree under `path` in `commit` (its id names every declaration file
/// below it, so an unchanged id means unchanged declarations) and the
/// commit's time.
pub(crate) fn declarations_tree(
    repo: &Repository,
    commit: Oid,
    path: &str,
) -> Result<(SystemTime, Oid), SourceError> {
    let repo_err = |e: git2::Error| SourceError::Repository {
        path: repo.path().display().to_string(),
        source: crate::cause::Cause::git(&e),
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

/// How many tree entries a snapshot reads at most (10,000 declarations
/// are some 10,100 entries).
pub(crate) const MAX_ENTRIES: usize = 1_000_000;

/// An entry of a declarations tree that tend reads, or reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedFile {
    /// From the repository root; a name that is not UTF-8 has its invalid
    /// bytes written as `\xNN`.
    pub path: String,
    /// The blob's id (a subtree's, for a subtree not read).
    pub id: Oid,
    /// Why the entry is an error instead of a declaration file.
    pub problem: Option<String>,
}

/// The declaration files in `tree` (found at `path`), with blob ids,
/// sorted by path, by the rules of [`crate::model::tree`] (the ones `tend
/// validate` applies on disk). The walk is iterative and bounded in depth:
/// no commit can exhaust the stack.
pub(crate) fn list_files(
    repo: &Repository,
    commit: Oid,
    tree: Oid,
    path: &str,
) -> Result<Vec<ListedFile>, SourceError> {
    let mut listing = Listing::new(repo, commit, path);
    listing.walk(vec![(listing.base(), tree, 0)])?;
    let mut files = listing.files;
    // Each directory's files come in order (Git sorts a tree's entries
    // as their paths sort), one directory after another: a stable sort
    // merges those runs instead of sorting every path again.
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// A subtree still to be listed: its directory (ending in `/`, or empty
/// at the declarations' root), its id and its depth below that root.
pub(crate) type PendingTree = (String, Oid, usize);

/// A walk over a declarations tree: the files it found (unsorted) and the
/// tree entries it read, bounded by [`MAX_ENTRIES`].
pub(crate) struct Listing<'r> {
    repo: &'r Repository,
    commit: Oid,
    /// The declarations' path in the repository, as configured.
    path: &'r str,
    pub files: Vec<ListedFile>,
    /// Tree entries read so far (or counted in by the caller).
    pub entries: usize,
    /// Trees read so far.
    pub trees: usize,
}

impl<'r> Listing<'r> {
    pub(crate) fn new(repo: &'r Repository, commit: Oid, path: &'r str) -> Self {
        Listing {
            repo,
            commit,
            path,
            files: Vec::new(),
            entries: 0,
            trees: 0,
        }
    }

    /// The directory of the declarations' root, as listed paths start.
    pub(crate) fn base(&self) -> String {
        let prefix = self.path.trim_matches('/');
        if prefix.is_empty() || prefix == "." {
            String::new()
        } else {
            format!("{prefix}/")
        }
    }

    /// Reads the tree `id`, counting its entries against the bound: a
    /// subtree can be named many times over (a few objects can spell a
    /// tree of 1000^32 paths).
    pub(crate) fn read_tree(&mut self, id: Oid) -> Result<git2::Tree<'r>, SourceError> {
        let tree = self
            .repo
            .find_tree(id)
            .map_err(|e| SourceError::Repository {
                path: self.repo.path().display().to_string(),
                source: crate::cause::Cause::git(&e),
            })?;
        self.trees += 1;
        self.entries += tree.len();
        if self.entries > MAX_ENTRIES {
            return Err(SourceError::TreeTooLarge {
                path: self.path.to_string(),
                commit: self.commit.to_string(),
                limit: MAX_ENTRIES,
            });
        }
        Ok(tree)
    }

    /// Lists the subtrees in `trees` and every one below them.
    pub(crate) fn walk(&mut self, mut trees: Vec<PendingTree>) -> Result<(), SourceError> {
        while let Some((dir, id, depth)) = trees.pop() {
            let tree = self.read_tree(id)?;
            for entry in tree.iter() {
                self.entry(&dir, &entry, depth, &mut trees);
            }
        }
        Ok(())
    }

    /// Lists one entry of the directory `dir` (at `depth`): a declaration
    /// file, or an entry that is an error, goes to `files`; a subtree to
    /// `trees`; anything else is passed over.
    pub(crate) fn entry(
        &mut self,
        dir: &str,
        entry: &git2::TreeEntry<'_>,
        depth: usize,
        trees: &mut Vec<PendingTree>,
    ) {
        use crate::model::tree::{self as rules, MAX_DEPTH};
        let name = entry.name_bytes();
        if rules::is_hidden(name) {
            return;
        }
        let kind = entry.kind();
        let is_tree = kind == Some(ObjectType::Tree);
        // Symlinks (mode 120000) are blobs holding a path.
        let is_link = kind == Some(ObjectType::Blob) && entry.filemode() == 0o120000;
        let path = || format!("{dir}{}", rules::lossy_name(name));
        if is_link {
            tracing::warn!("{}", rules::symlink_warning(Path::new(&path())));
            return;
        }
        // Submodules (commits) and other files are not declarations.
        let declaration_file = kind == Some(ObjectType::Blob) && rules::is_yaml_name(name);
        if !(is_tree || declaration_file) {
            return;
        }
        let problem = if std::str::from_utf8(name).is_err() {
            Some(rules::NOT_UTF8.to_string())
        } else if is_tree && depth >= MAX_DEPTH {
            Some(rules::too_deep())
        } else {
            None
        };
        if problem.is_none() && is_tree {
            trees.push((format!("{}/", path()), entry.id(), depth + 1));
            return;
        }
        self.files.push(ListedFile {
            path: path(),
            id: entry.id(),
            problem,
        });
    }
}
