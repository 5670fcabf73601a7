//! The parse cache's delta: what changed since the cache file was written
//! whole (its base), in a small file beside it. A one-shot `tend apply`
//! of a one-file commit wrote the whole cache again (10,000 lines, 18 ms
//! of a core beside its cycle, which ran 10-14 ms slower for it on two
//! cores); over a delta it writes the files changed since the base.
//!
//! # Invariants
//! * A delta is bound to its base by the base's tree, source path and
//!   build: the whole cache of one tree is the same bytes whoever writes
//!   it, so a delta over tree `T` holds over any base of `T`. A delta over
//!   another base is ignored (the base alone is read).
//! * A delta is read whole or not at all: its header line is checked like
//!   an entry (it names the files removed and the tree the whole is of),
//!   and one entry failing its check voids the delta. A delta can cost a
//!   re-parse, never a wrong snapshot: with it ignored the base's tree
//!   does not match the new head's, so the tree is listed and every file
//!   checked by blob.
//! * The delta is cumulative over its base: each write replaces it with
//!   every file changed since the base. Past [`max_changes`] the whole
//!   cache is written again and the delta removed.
//! * A delta is written only over a base read whole by the same process
//!   (every line passed, the tree known): only then are the changes since
//!   the base known.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use git2::Oid;
use serde::{Deserialize, Serialize};

use super::store::{FileView, write_entry};
use super::{
    FORMAT, ObjectId, ParsedFile, ParsedTree, build_id, checked_entry, parse_object_id, read_lines,
};
use crate::model::hash::sha256_hex;
use crate::model::load::FileContents;

/// The delta beside the cache file `file`.
pub(crate) fn delta_path(file: &Path) -> PathBuf {
    file.with_file_name("parse-cache-delta.jsonl")
}

/// How many changed and removed files a delta holds at most over a base
/// of `files` files: past that, writing the whole cache again costs less
/// than carrying the changes (each is read twice, once in the base).
pub(crate) fn max_changes(files: usize) -> usize {
    (files / 16).max(64)
}

/// A delta's first line (checked, like an entry).
#[derive(Serialize, Deserialize)]
struct Header {
    format: u32,
    tend: String,
    path: String,
    /// The tree of the base it applies to.
    base: String,
    /// The tree the base and the delta together are of.
    tree: String,
    /// Files in the whole, once applied.
    files: usize,
    /// Entry lines after this one.
    entries: usize,
    /// The base's files not in the whole, sorted.
    removed: Vec<String>,
}

/// What the cache read from disk held over its base: where the next
/// delta starts from.
#[derive(Debug, Clone, Default)]
pub(crate) struct OnDisk {
    base_tree: ObjectId,
    /// The delta's files (changed or added since the base), sorted.
    pub(super) changed: Vec<String>,
    /// The base's files removed since, sorted.
    removed: Vec<String>,
}

/// The files changed since a base, for the next delta: every file in
/// `changed` is written again from the new tree's parse results.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CacheDelta {
    base_tree: ObjectId,
    /// Sorted, each in the new tree.
    pub(crate) changed: Vec<String>,
    /// Sorted, none in the new tree.
    removed: Vec<String>,
}

impl OnDisk {
    /// The delta over the same base once `changed` (files parsed again or
    /// new, sorted) and `gone` (files no longer in the tree, sorted)
    /// since the cache was read; `None` past `limit` changes.
    pub(crate) fn next(
        self,
        changed: Vec<String>,
        gone: Vec<String>,
        limit: usize,
    ) -> Option<CacheDelta> {
        let gone: BTreeSet<String> = gone.into_iter().collect();
        let changed: BTreeSet<String> = self
            .changed
            .into_iter()
            .chain(changed)
            .filter(|p| !gone.contains(p))
            .collect();
        let removed: BTreeSet<String> = self
            .removed
            .into_iter()
            .chain(gone)
            .filter(|p| !changed.contains(p))
            .collect();
        (changed.len() + removed.len() <= limit).then(|| CacheDelta {
            base_tree: self.base_tree,
            changed: changed.into_iter().collect(),
            removed: removed.into_iter().collect(),
        })
    }
}

/// Applies the delta beside `file` to `base`, a base read whole (its tree
/// known); anything unusable leaves the base alone (see the module docs).
pub(super) fn apply(file: &Path, path: &str, base: ParsedTree) -> ParsedTree {
    let Some(base_tree) = base.tree else {
        return base;
    };
    let on_disk = |changed, removed| OnDisk {
        base_tree,
        changed,
        removed,
    };
    // No delta read: the next one starts from the base alone.
    let base_alone = |base| ParsedTree {
        on_disk: Some(on_disk(Vec::new(), Vec::new())),
        ..base
    };
    let delta_file = delta_path(file);
    let bytes = match fs::read(&delta_file) {
        Ok(bytes) => bytes,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(
                    "ignoring the parse cache's delta {}: {e}",
                    delta_file.display()
                );
            }
            return base_alone(base);
        }
    };
    match read(&bytes, path, base_tree, &base) {
        Ok((header, delta)) => {
            let merged = merge(base, delta, &header.removed);
            ParsedTree {
                tree: parse_object_id(&header.tree),
                on_disk: Some(on_disk(merged.1, header.removed)),
                ..merged.0
            }
        }
        Err(why) => {
            // Over another base is what a crash between a whole write and
            // the delta's removal leaves; anything else is damage.
            if why == OTHER_BASE {
                tracing::debug!("parse cache delta {} not used: {why}", delta_file.display());
            } else {
                tracing::warn!(
                    "ignoring the parse cache's delta {}: {why}; the files changed since the cache was written whole are parsed",
                    delta_file.display()
                );
            }
            base_alone(base)
        }
    }
}

/// Why a delta left over from another cache is not read.
const OTHER_BASE: &str = "written over another base, by another tend or for another source path";

/// The delta's header and entries, when they apply to `base`.
fn read(
    bytes: &[u8],
    path: &str,
    base_tree: ObjectId,
    base: &ParsedTree,
) -> Result<(Header, ParsedTree), String> {
    let (first, body) = match bytes.iter().position(|b| *b == b'\n') {
        Some(end) => (&bytes[..end], &bytes[end + 1..]),
        None => (bytes, &[][..]),
    };
    let json = checked_entry(first).ok_or("its header fails its check")?;
    let header: Header = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    if header.format != FORMAT
        || header.tend != build_id()
        || header.path != path
        || parse_object_id(&header.base) != Some(base_tree)
    {
        return Err(OTHER_BASE.into());
    }
    if !header.removed.is_sorted_by(|a, b| a < b) {
        return Err("its removed files are out of order".into());
    }
    let lines = read_lines(body).map_err(|e| e.to_string())?;
    if !lines.complete || lines.entries != header.entries {
        return Err("an entry fails its check, or is missing".into());
    }
    if !lines.files.is_sorted_by(|a, b| a.path < b.path) {
        return Err("its entries are out of order".into());
    }
    let delta = ParsedTree {
        tree: None,
        files: lines.files,
        declarations: lines.declarations,
        on_disk: None,
    };
    // The whole's size, known before anything is moved.
    let replaced = base
        .files
        .iter()
        .filter(|f| {
            header.removed.binary_search(&f.path).is_ok()
                || delta
                    .files
                    .binary_search_by(|d| d.path.as_str().cmp(&f.path))
                    .is_ok()
        })
        .count();
    if base.files.len() - replaced + delta.files.len() != header.files {
        return Err("it does not add up to its whole".into());
    }
    Ok((header, delta))
}

/// `base` with `removed` and the delta's files taken out, and the delta's
/// files put in (path order), and the delta's paths. Each file and
/// declaration is moved once, in the flat lists (no list a file).
fn merge(base: ParsedTree, delta: ParsedTree, removed: &[String]) -> (ParsedTree, Vec<String>) {
    let changed: Vec<String> = delta.files.iter().map(|f| f.path.clone()).collect();
    let mut whole = ParsedTree {
        files: Vec::with_capacity(base.files.len() + delta.files.len()),
        declarations: Vec::with_capacity(base.declarations.len() + delta.declarations.len()),
        ..ParsedTree::default()
    };
    let mut added = delta.files.into_iter().peekable();
    let mut added_declarations = delta.declarations.into_iter();
    let mut base_declarations = base.declarations.into_iter();
    let put = |whole: &mut ParsedTree, file: ParsedFile, from: &mut std::vec::IntoIter<_>| {
        whole
            .declarations
            .extend(from.by_ref().take(file.declarations));
        whole.files.push(file);
    };
    for file in base.files {
        while let Some(next) = added.next_if(|a| a.path < file.path) {
            put(&mut whole, next, &mut added_declarations);
        }
        if removed.binary_search(&file.path).is_err() && changed.binary_search(&file.path).is_err()
        {
            put(&mut whole, file, &mut base_declarations);
        } else {
            base_declarations
                .by_ref()
                .take(file.declarations)
                .for_each(drop);
        }
    }
    for next in added {
        put(&mut whole, next, &mut added_declarations);
    }
    (whole, changed)
}

/// Replaces the delta beside `file` with `delta` (of `tree`, `files`
/// files in the whole), whose changed files' results are `entries` (in
/// the delta's order).
pub(crate) fn store<'a>(
    file: &Path,
    path: &str,
    tree: Oid,
    files: usize,
    delta: &CacheDelta,
    entries: impl Iterator<Item = (&'a str, Oid, FileView<'a>)>,
) -> std::io::Result<()> {
    crate::files::write_atomically_with(&delta_path(file), |out| {
        let header = Header {
            format: FORMAT,
            tend: build_id().to_string(),
            path: path.to_string(),
            base: Oid::from_bytes(&delta.base_tree)
                .map_err(std::io::Error::other)?
                .to_string(),
            tree: tree.to_string(),
            files,
            entries: delta.changed.len(),
            removed: delta.removed.clone(),
        };
        let json = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
        out.write_all(sha256_hex(&json).as_bytes())?;
        out.write_all(b" ")?;
        out.write_all(&json)?;
        out.write_all(b"\n")?;
        let mut json = Vec::with_capacity(512);
        let mut written = 0;
        for (path, blob, view) in entries {
            write_entry(out, &mut json, path, blob, view)?;
            written += 1;
        }
        if written != delta.changed.len() {
            return Err(std::io::Error::other(format!(
                "{written} of the delta's {} files were given",
                delta.changed.len()
            )));
        }
        Ok(())
    })
}

/// The results of the delta's changed files, out of the new tree's
/// `files` and `contents` (both in path order).
pub(crate) fn entries_of<'a>(
    delta: &'a CacheDelta,
    files: &'a [(String, Oid)],
    contents: &'a [FileContents],
) -> Vec<(String, Oid, FileContents)> {
    let mut out = Vec::with_capacity(delta.changed.len());
    let mut at = 0;
    for path in &delta.changed {
        while at < files.len() && files[at].0 < *path {
            at += 1;
        }
        if let (Some((p, blob)), Some(c)) = (files.get(at), contents.get(at))
            && p == path
        {
            out.push((p.clone(), *blob, c.clone()));
        }
    }
    out
}

/// [`store`] of `entries` (from [`entries_of`]), logged: a failure is a
/// warning (the next process parses the files changed since the base,
/// and the delta left is over another tree, so the tree is listed).
pub(crate) fn store_logged(
    file: &Path,
    path: &str,
    tree: Oid,
    files: usize,
    delta: &CacheDelta,
    entries: &[(String, Oid, FileContents)],
    when: &str,
) {
    let started = std::time::Instant::now();
    let views = entries
        .iter()
        .map(|(p, blob, c)| (p.as_str(), *blob, FileView::from(c)));
    match store(file, path, tree, files, delta, views) {
        Ok(()) => tracing::debug!(
            "source: parse cache delta of {} files ({} removed) written in {:?}{when}",
            delta.changed.len(),
            delta.removed.len(),
            started.elapsed()
        ),
        Err(e) => tracing::warn!(
            "cannot write the parse cache's delta {}: {e}; the next process parses the files changed",
            delta_path(file).display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::store as store_whole;
    use super::super::{CachedFiles, cache_path, load, object_id};
    use super::*;
    use crate::model::parse_file;

    type Outcome = Result<(), Box<dyn std::error::Error>>;
    type File = (String, Oid, FileContents);

    /// A file declaring `name` with connection limit `limit`.
    fn file(path: &str, name: &str, limit: u32) -> Result<File, git2::Error> {
        let text = format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  connectionLimit: {limit}\n"
        );
        let blob = Oid::hash_object(git2::ObjectType::Blob, text.as_bytes())?;
        let contents = parse_file(Path::new(path), text.as_bytes());
        Ok((path.into(), blob, contents))
    }

    /// Files named by `(path, name, limit)`.
    fn files(list: &[(&str, &str, u32)]) -> Result<Vec<File>, git2::Error> {
        list.iter().map(|(p, n, l)| file(p, n, *l)).collect()
    }

    fn tree(n: u8) -> Result<Oid, git2::Error> {
        Oid::hash_object(git2::ObjectType::Tree, &[n])
    }

    /// The cache written whole, of tree `n`.
    fn write_whole(cache: &Path, n: u8, files: &[File]) -> Outcome {
        let views = files.iter().map(|(p, b, c)| (p.as_str(), *b, c.into()));
        store_whole(cache, "db", tree(n)?, views)?;
        Ok(())
    }

    /// What a process does: reads the cache, takes the new tree's files
    /// out of it in order, and writes the delta (`None`: none written).
    fn poll(
        cache: &Path,
        n: u8,
        new: &[File],
    ) -> Result<Option<CacheDelta>, Box<dyn std::error::Error>> {
        let mut cached = CachedFiles::new(load(cache, "db"));
        for (path, blob, _) in new {
            let _ = cached.take(path, object_id(*blob));
        }
        let (_, delta) = cached.finish();
        let Some(delta) = delta else {
            return Ok(None);
        };
        let files: Vec<(String, Oid)> = new.iter().map(|(p, b, _)| (p.clone(), *b)).collect();
        let contents: Vec<FileContents> = new.iter().map(|(.., c)| c.clone()).collect();
        let entries = entries_of(&delta, &files, &contents);
        let views = entries
            .iter()
            .map(|(p, b, c)| (p.as_str(), *b, FileView::from(c)));
        store(cache, "db", tree(n)?, new.len(), &delta, views)?;
        Ok(Some(delta))
    }

    /// The loaded cache's tree, and each file's path and limit.
    fn read_back(cache: &Path) -> (Option<ObjectId>, Vec<(String, Option<i64>)>) {
        let loaded = load(cache, "db");
        let tree = loaded.tree;
        (tree, limits(loaded.into_contents()))
    }

    /// Each file's path and connection limit.
    fn limits<B>(
        list: impl IntoIterator<Item = (String, B, FileContents)>,
    ) -> Vec<(String, Option<i64>)> {
        list.into_iter()
            .map(|(path, _, c)| (path, c.declarations[0].manifest.spec.connection_limit))
            .collect()
    }

    fn paths(list: &[&str]) -> Vec<String> {
        list.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn a_delta_over_the_base_reads_as_the_new_tree_whole() -> Outcome {
        let dir = tempfile::tempdir()?;
        let cache = cache_path(dir.path());
        let base = files(&[("a.yaml", "a", 1), ("b.yaml", "b", 2), ("c.yaml", "c", 3)])?;
        write_whole(&cache, 1, &base)?;
        assert_eq!(read_back(&cache).0, Some(object_id(tree(1)?)));

        // b changed, c removed, d added.
        let second = files(&[("a.yaml", "a", 1), ("b.yaml", "b", 20), ("d.yaml", "d", 4)])?;
        let delta = poll(&cache, 2, &second)?.ok_or("no delta")?;
        assert_eq!(delta.changed, paths(&["b.yaml", "d.yaml"]));
        assert_eq!(delta.removed, paths(&["c.yaml"]));
        assert!(fs::read(&cache)?.len() > fs::read(delta_path(&cache))?.len());
        assert_eq!(
            read_back(&cache),
            (Some(object_id(tree(2)?)), limits(second))
        );

        // Over the same base, cumulative: d goes, c comes back with other
        // bytes, a is untouched.
        let third = files(&[("a.yaml", "a", 1), ("b.yaml", "b", 20), ("c.yaml", "c", 30)])?;
        let delta = poll(&cache, 3, &third)?.ok_or("no delta")?;
        assert_eq!(delta.changed, paths(&["b.yaml", "c.yaml"]));
        assert_eq!(
            read_back(&cache),
            (Some(object_id(tree(3)?)), limits(third))
        );
        // Back to the base's bytes: nothing left in the delta but b.
        let fourth = files(&[("a.yaml", "a", 1), ("b.yaml", "b", 2), ("c.yaml", "c", 30)])?;
        poll(&cache, 4, &fourth)?.ok_or("no delta")?;
        assert_eq!(
            read_back(&cache),
            (Some(object_id(tree(4)?)), limits(fourth.clone()))
        );

        // The whole written again removes the delta.
        write_whole(&cache, 4, &fourth)?;
        assert!(!delta_path(&cache).exists());
        assert_eq!(
            read_back(&cache),
            (Some(object_id(tree(4)?)), limits(fourth))
        );
        Ok(())
    }

    #[test]
    fn a_delta_over_another_base_or_edited_is_not_read() -> Outcome {
        let dir = tempfile::tempdir()?;
        let cache = cache_path(dir.path());
        let base = files(&[("a.yaml", "a", 1), ("b.yaml", "b", 2)])?;
        write_whole(&cache, 1, &base)?;
        let second = files(&[("a.yaml", "a", 1), ("b.yaml", "b", 20)])?;
        poll(&cache, 2, &second)?.ok_or("no delta")?;
        let delta_text = fs::read_to_string(delta_path(&cache))?;
        let base_only = (Some(object_id(tree(1)?)), limits(base.clone()));

        // An entry edited (the same blob id, another value).
        let edited = delta_text.replacen("\"connectionLimit\":20", "\"connectionLimit\":999", 1);
        assert_ne!(edited, delta_text);
        fs::write(delta_path(&cache), &edited)?;
        assert_eq!(read_back(&cache), base_only);
        // Its header edited: it names no removed file it was not written with.
        let edited = delta_text.replacen("\"removed\":[]", "\"removed\":[\"a.yaml\"]", 1);
        assert_ne!(edited, delta_text);
        fs::write(delta_path(&cache), &edited)?;
        assert_eq!(read_back(&cache), base_only);
        // Its last line lost.
        let cut = delta_text.lines().next().unwrap_or_default().to_string() + "\n";
        fs::write(delta_path(&cache), &cut)?;
        assert_eq!(read_back(&cache), base_only);

        // Over another base (another tree's whole, the delta left behind).
        write_whole(&cache, 7, &base)?;
        fs::write(delta_path(&cache), &delta_text)?;
        assert_eq!(
            read_back(&cache),
            (Some(object_id(tree(7)?)), base_only.1.clone())
        );
        // Over a base of the delta's own base tree: it holds.
        write_whole(&cache, 1, &base)?;
        fs::write(delta_path(&cache), &delta_text)?;
        assert_eq!(read_back(&cache).0, Some(object_id(tree(2)?)));
        Ok(())
    }

    #[test]
    fn past_its_bound_the_cache_is_written_whole() -> Outcome {
        let dir = tempfile::tempdir()?;
        let cache = cache_path(dir.path());
        let many = (0..100)
            .map(|i| file(&format!("f{i:03}.yaml"), &format!("f{i:03}"), 1))
            .collect::<Result<Vec<_>, _>>()?;
        write_whole(&cache, 1, &many)?;
        assert_eq!(max_changes(many.len()), 64);
        let mut changed = many.clone();
        for (i, f) in changed.iter_mut().enumerate().take(64) {
            *f = file(&f.0.clone(), &format!("f{i:03}"), 2)?;
        }
        assert_eq!(
            poll(&cache, 2, &changed)?.map(|d| d.changed.len()),
            Some(64)
        );
        let mut more = changed.clone();
        more[64] = file("f064.yaml", "f064", 2)?;
        assert_eq!(poll(&cache, 3, &more)?, None, "65 changes since the base");
        // Files removed count too.
        assert_eq!(poll(&cache, 3, &changed[..30])?, None);
        Ok(())
    }
}
