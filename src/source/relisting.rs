//! A tree's declaration files listed over the listing of an earlier tree:
//! only the subtrees whose ids differ between the two are read.
//!
//! A commit that changes one file changes the ids of the trees on that
//! file's path and no other: listing the new tree whole reads every
//! subtree again (at 100,000 files, 100 ms of the agent's one-file commit;
//! 8 ms of a one-shot `tend apply` at 10,000). Here the two trees are
//! walked side by side, an entry with the same id and mode in both is the
//! same (a tree id names every byte below it), and the earlier listing
//! gives the files under it.
//!
//! # Guarantees
//! * The result is what [`list_files`] gives for the new tree, path for
//!   path and id for id, or nothing: whenever the walk meets what it does
//!   not handle (the earlier tree gone from the repository, a name that is
//!   not UTF-8, the entry bound reached, any read error), it gives up and
//!   the caller lists the tree whole, which reports what it finds.
//! * `previous` must be the listing of `old` (as the parse results of a
//!   tree are: see `ParsedTree::tree`).

use git2::{ObjectType, Oid, Repository};

use super::SourceError;
use super::parse_cache::{ParsedFile, ParsedTree};
use super::snapshot::{ListedFile, Listing, PendingTree, list_files};
use crate::model::tree::{self as rules, MAX_DEPTH};

/// The files of `new` (at `path`), listed over `previous`'s files when
/// it knows their tree and that can be done, else listed whole.
pub(crate) fn list_files_over(
    repo: &Repository,
    commit: Oid,
    new: Oid,
    path: &str,
    previous: &ParsedTree,
) -> Result<Vec<ListedFile>, SourceError> {
    if let Some(old) = previous.tree.and_then(|t| Oid::from_bytes(&t).ok())
        && old != new
        && let Some(listed) = list_files_since(repo, commit, old, new, path, &previous.files)
    {
        return Ok(listed);
    }
    list_files(repo, commit, new, path)
}

/// The files of `new` from those of `old` and the subtrees that differ;
/// `None` where the tree must be listed whole (see the module's
/// guarantees).
pub(crate) fn list_files_since(
    repo: &Repository,
    commit: Oid,
    old: Oid,
    new: Oid,
    path: &str,
    previous: &[ParsedFile],
) -> Option<Vec<ListedFile>> {
    walk(repo, commit, old, new, path, previous).map(|(listed, _)| listed)
}

/// [`list_files_since`], and how many trees it read.
fn walk(
    repo: &Repository,
    commit: Oid,
    old: Oid,
    new: Oid,
    path: &str,
    previous: &[ParsedFile],
) -> Option<(Vec<ListedFile>, usize)> {
    let started = std::time::Instant::now();
    let mut listing = Listing::new(repo, commit, path);
    // The files kept count toward the bound as their entries did.
    listing.entries = previous.len();
    // Paths whose earlier entries are gone or changed: an entry's path,
    // and the same ending in `/` for what was listed below it.
    let mut removed: Vec<String> = Vec::new();
    let mut pairs = vec![(listing.base(), old, new, 0usize)];
    while let Some((dir, old, new, depth)) = pairs.pop() {
        let before = repo.find_tree(old).ok()?;
        let after = listing.read_tree(new).ok()?;
        let mut added: Vec<PendingTree> = Vec::new();
        for entry in after.iter() {
            let name = entry.name_bytes();
            if rules::is_hidden(name) {
                continue;
            }
            let name = std::str::from_utf8(name).ok()?;
            let earlier = before.get_name(name);
            let same =
                |e: &git2::TreeEntry<'_>| e.id() == entry.id() && e.filemode() == entry.filemode();
            match earlier {
                Some(e) if same(&e) => {}
                // Both directories, within the depth read: compared in
                // their turn.
                Some(e)
                    if e.kind() == Some(ObjectType::Tree)
                        && entry.kind() == Some(ObjectType::Tree)
                        && depth < MAX_DEPTH =>
                {
                    pairs.push((format!("{dir}{name}/"), e.id(), entry.id(), depth + 1));
                }
                earlier => {
                    if earlier.is_some() {
                        removed.push(format!("{dir}{name}"));
                        removed.push(format!("{dir}{name}/"));
                    }
                    listing.entry(&dir, &entry, depth, &mut added);
                }
            }
        }
        for entry in before.iter() {
            let name = entry.name_bytes();
            if rules::is_hidden(name) {
                continue;
            }
            let name = std::str::from_utf8(name).ok()?;
            if after.get_name(name).is_none() {
                removed.push(format!("{dir}{name}"));
                removed.push(format!("{dir}{name}/"));
            }
        }
        listing.walk(added).ok()?;
    }
    let trees = listing.trees;
    let mut added = listing.files;
    added.sort_by(|a, b| a.path.cmp(&b.path));
    removed.sort_unstable();
    let changed = added.len();
    let listed = merge(previous, &removed, added)?;
    tracing::debug!(
        "source: {} files listed over the last tree's in {:?}: {trees} trees read, {changed} files new or changed",
        listed.len(),
        started.elapsed()
    );
    Some((listed, trees))
}

/// `previous` (sorted by path) less what `removed` (sorted) covers, with
/// `added` (sorted) in path order; `None` for an id that is not one.
///
/// Every path that starts with a directory's `dir/` sorts in one run from
/// `dir/` on, so one pass over both lists finds what a removed path or
/// directory covers.
fn merge(
    previous: &[ParsedFile],
    removed: &[String],
    added: Vec<ListedFile>,
) -> Option<Vec<ListedFile>> {
    let covers = |r: &str, path: &str| path == r || (r.ends_with('/') && path.starts_with(r));
    let mut out = Vec::with_capacity(previous.len() + added.len());
    let mut added = added.into_iter().peekable();
    let mut r = 0;
    for file in previous {
        while r < removed.len()
            && removed[r].as_str() < file.path.as_str()
            && !covers(&removed[r], &file.path)
        {
            r += 1;
        }
        if r < removed.len() && covers(&removed[r], &file.path) {
            continue;
        }
        while let Some(new) = added.next_if(|a| a.path < file.path) {
            out.push(new);
        }
        out.push(ListedFile {
            path: file.path.clone(),
            id: Oid::from_bytes(&file.blob).ok()?,
            problem: None,
        });
    }
    out.extend(added);
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use git2::{Oid, Repository};

    use super::{list_files_over, list_files_since};
    use crate::source::parse_cache::{ParsedFile, ParsedTree, object_id};
    use crate::source::snapshot::{ListedFile, list_files};

    type Outcome = Result<(), Box<dyn std::error::Error>>;

    const LINK: i32 = 0o120000;
    const BLOB: i32 = 0o100644;

    /// Writes the tree of `files` (path → (mode, bytes)), subtrees and all.
    fn tree(repo: &Repository, files: &BTreeMap<&str, (i32, &str)>) -> Result<Oid, git2::Error> {
        let mut here: BTreeMap<&str, (i32, &str)> = BTreeMap::new();
        let mut below: BTreeMap<&str, BTreeMap<&str, (i32, &str)>> = BTreeMap::new();
        for (path, file) in files {
            match path.split_once('/') {
                Some((dir, rest)) => {
                    below.entry(dir).or_default().insert(rest, *file);
                }
                None => {
                    here.insert(path, *file);
                }
            }
        }
        let mut builder = repo.treebuilder(None)?;
        for (name, (mode, bytes)) in here {
            builder.insert(name, repo.blob(bytes.as_bytes())?, mode)?;
        }
        for (name, files) in below {
            builder.insert(name, tree(repo, &files)?, 0o040000)?;
        }
        builder.write()
    }

    fn parsed(listed: &[ListedFile]) -> Vec<ParsedFile> {
        listed
            .iter()
            .map(|f| ParsedFile {
                path: f.path.clone(),
                blob: object_id(f.id),
                declarations: 0,
                diagnostics: Vec::new(),
            })
            .collect()
    }

    /// Every step's tree listed over the one before is the tree listed
    /// whole, and reads only the trees on the changed paths.
    #[test]
    fn a_tree_listed_over_the_last_is_the_tree_listed_whole() -> Outcome {
        let dir = tempfile::tempdir()?;
        let repo = Repository::init_bare(dir.path())?;
        let commit = Oid::ZERO_SHA1;
        let mut files: BTreeMap<&str, (i32, &str)> = BTreeMap::new();
        for (path, bytes) in [
            ("a.yaml", "a"),
            ("a-b.yaml", "ab"),
            ("a/x.yaml", "ax"),
            ("a/y.yml", "ay"),
            ("a/deep/z.yaml", "az"),
            ("b/one.yaml", "b1"),
            ("b/two.yaml", "b2"),
            ("b/notes.txt", "not a declaration"),
            ("c/.hidden.yaml", "hidden"),
            ("c/three.yaml", "c3"),
        ] {
            files.insert(path, (BLOB, bytes));
        }
        // (what changes, the trees the listing over the last reads at most)
        type Step = (&'static str, fn(&mut BTreeMap<&str, (i32, &str)>), usize);
        let steps: Vec<Step> = vec![
            (
                "one file's bytes",
                |f| {
                    f.insert("b/one.yaml", (BLOB, "b1 again"));
                },
                2,
            ),
            (
                "a file added",
                |f| {
                    f.insert("b/zero.yaml", (BLOB, "b0"));
                },
                2,
            ),
            (
                "a file removed",
                |f| {
                    f.remove("b/two.yaml");
                },
                2,
            ),
            (
                "a deep file",
                |f| {
                    f.insert("a/deep/z.yaml", (BLOB, "az again"));
                },
                3,
            ),
            (
                "a directory added",
                |f| {
                    f.insert("d/e/f.yaml", (BLOB, "def"));
                    f.insert("d/g.yaml", (BLOB, "dg"));
                },
                3,
            ),
            (
                "a directory removed",
                |f| {
                    f.remove("c/three.yaml");
                    f.remove("c/.hidden.yaml");
                },
                1,
            ),
            (
                "a file made a directory",
                |f| {
                    f.remove("a.yaml");
                    f.insert("a.yaml/inner.yaml", (BLOB, "inner"));
                },
                2,
            ),
            (
                "a directory made a file",
                |f| {
                    f.remove("a.yaml/inner.yaml");
                    f.insert("a.yaml", (BLOB, "a file again"));
                },
                1,
            ),
            (
                "a file made a link, another a directory's only file",
                |f| {
                    f.insert("b/one.yaml", (LINK, "../a.yaml"));
                    f.remove("a/deep/z.yaml");
                    f.insert("a/deep/w.yaml", (BLOB, "aw"));
                },
                4,
            ),
            (
                "a link made a file again, a non-declaration changed",
                |f| {
                    f.insert("b/one.yaml", (BLOB, "b1"));
                    f.insert("b/notes.txt", (BLOB, "other notes"));
                },
                2,
            ),
            (
                "a file made a link to its own bytes",
                |f| {
                    f.insert("a/y.yml", (LINK, "ay"));
                },
                2,
            ),
            (
                "nothing but a hidden file",
                |f| {
                    f.insert("a/.hidden.yaml", (BLOB, "hidden"));
                },
                2,
            ),
        ];
        let mut old = tree(&repo, &files)?;
        let mut previous = list_files(&repo, commit, old, "")?;
        assert!(previous.iter().any(|f| f.path == "a/deep/z.yaml"));
        for (what, change, most) in steps {
            change(&mut files);
            let new = tree(&repo, &files)?;
            let whole = list_files(&repo, commit, new, "")?;
            let over = list_files_since(&repo, commit, old, new, "", &parsed(&previous));
            assert_eq!(over.as_ref(), Some(&whole), "{what}");
            // Read again to count the trees (a walk that read every tree
            // gives the same files).
            let mut counted = crate::source::snapshot::Listing::new(&repo, commit, "");
            counted.walk(vec![(String::new(), new, 0)])?;
            assert!(counted.trees > most, "{what}: the test's tree is too small");
            let trees = trees_read(&repo, old, new, &parsed(&previous));
            assert!(
                trees <= most,
                "{what}: {trees} trees read, at most {most} expected"
            );
            (old, previous) = (new, whole);
        }
        Ok(())
    }

    /// How many trees a listing over the last reads.
    fn trees_read(repo: &Repository, old: Oid, new: Oid, previous: &[ParsedFile]) -> usize {
        super::walk(repo, Oid::ZERO_SHA1, old, new, "", previous)
            .map_or(usize::MAX, |(_, trees)| trees)
    }

    /// What the walk cannot vouch for is listed whole: an earlier tree the
    /// repository lacks, a name that is not UTF-8, a source path below the
    /// root.
    #[test]
    fn what_the_walk_cannot_vouch_for_is_listed_whole() -> Outcome {
        let dir = tempfile::tempdir()?;
        let repo = Repository::init_bare(dir.path())?;
        let commit = Oid::ZERO_SHA1;
        let mut files: BTreeMap<&str, (i32, &str)> = BTreeMap::new();
        files.insert("fleet/one.yaml", (BLOB, "1"));
        files.insert("fleet/two/three.yaml", (BLOB, "3"));
        let old_root = tree(&repo, &files)?;
        let old = repo.find_tree(old_root)?.get_name("fleet").map(|e| e.id());
        let old = old.ok_or("no fleet")?;
        files.insert("fleet/two/four.yaml", (BLOB, "4"));
        let new_root = tree(&repo, &files)?;
        let new = repo.find_tree(new_root)?.get_name("fleet").map(|e| e.id());
        let new = new.ok_or("no fleet")?;
        let previous = list_files(&repo, commit, old, "fleet")?;
        assert_eq!(previous[0].path, "fleet/one.yaml");
        let whole = list_files(&repo, commit, new, "fleet")?;
        let over = list_files_since(&repo, commit, old, new, "fleet", &parsed(&previous));
        assert_eq!(over.as_ref(), Some(&whole));
        // An earlier tree not in the repository.
        let missing = Oid::from_str("1234567890123456789012345678901234567890")?;
        let gone = list_files_since(&repo, commit, missing, new, "fleet", &parsed(&previous));
        assert_eq!(gone, None);
        let cache = ParsedTree {
            tree: Some(object_id(missing)),
            files: parsed(&previous),
            ..ParsedTree::default()
        };
        assert_eq!(list_files_over(&repo, commit, new, "fleet", &cache)?, whole);
        // A name that is not UTF-8, in a directory compared.
        let mut builder = repo.treebuilder(Some(&repo.find_tree(new)?))?;
        builder.insert(b"bad\xff.yaml".as_slice(), repo.blob(b"x")?, BLOB)?;
        let bad = builder.write()?;
        let over = list_files_since(&repo, commit, new, bad, "fleet", &parsed(&whole));
        assert_eq!(over, None);
        let cache = ParsedTree {
            tree: Some(object_id(new)),
            files: parsed(&whole),
            ..ParsedTree::default()
        };
        let listed = list_files_over(&repo, commit, bad, "fleet", &cache)?;
        assert_eq!(listed, list_files(&repo, commit, bad, "fleet")?);
        assert!(listed.iter().any(|f| f.problem.is_some()));
        Ok(())
    }
}
