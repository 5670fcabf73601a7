//! The parse cache on disk: what every declaration file of the last accepted
//! snapshot parsed to, keyed by (path, blob id), so a new process (`tend
//! apply` from a timer, a restarted agent) does not parse 10,000 unchanged
//! files again.
//!
//! # Invariants
//! * A blob id names the file's exact bytes, so an entry is valid for as long
//!   as the parser that wrote it is the same: the file records tend's version
//!   and a format number, and any other version's cache is ignored whole.
//! * The cache can only save work, never change an outcome: a missing,
//!   unreadable, corrupt or foreign cache file is ignored (the files are
//!   parsed), and an entry whose declarations no longer pass the annotation
//!   rules is dropped and re-parsed.
//! * Every entry is bound to its own text: a line starts with the sha256
//!   of the JSON after it, checked on read. An entry edited by hand, or
//!   damaged on disk, fails its check and its file is parsed again; a
//!   cache can cost a re-parse, never a wrong snapshot. (A blob id keys an
//!   entry, but nothing but this check ties the entry's content to it.)
//! * No number read from the cache sizes an allocation: counts are only
//!   trusted as far as the bytes present go.
//! * The file is replaced atomically (write, fsync, rename), so a crash
//!   leaves the old cache or the new one, never half of one.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use git2::Oid;
use serde::{Deserialize, Serialize};

use crate::model::hash::sha256_hex;
use crate::model::load::FileContents;
use crate::model::overrides::parse_annotations;
use crate::model::{Declaration, Diagnostic, ManagedDatabase, NormalizedSpec, SpecHash};

mod delta;
mod store;

pub(crate) use delta::{CacheDelta, OnDisk};
pub(crate) use store::{FileView, store_logged};

/// The delta's writing, for the tracker.
pub(crate) mod delta_write {
    pub(crate) use super::delta::{entries_of, store_logged};
}

/// Bumped whenever the layout below changes.
const FORMAT: u32 = 3;

/// Which build wrote a cache: the version, and the size and modification
/// time of the running executable. Parsing rules can change between two
/// builds of one version; a cache from any other build is ignored. Without
/// an executable to identify, nothing is ever reused.
pub(crate) fn build_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let exe = std::env::current_exe().and_then(std::fs::metadata);
        match exe {
            Ok(meta) => {
                let modified = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                format!("{} {} {modified}", env!("CARGO_PKG_VERSION"), meta.len())
            }
            Err(_) => format!("unidentified {:?}", std::time::SystemTime::now()),
        }
    })
}

/// The parse results of one tree: every declaration file under the
/// source path, sorted by path, and their declarations in one list (in
/// file order), which is what a snapshot of an unchanged tree takes over
/// without copying.
#[derive(Debug, Clone, Default)]
pub struct ParsedTree {
    /// The tree the files were read from; `None` when unknown (a cache
    /// written for another source path). The same tree id means the same
    /// files with the same bytes, so they need not even be listed again.
    pub tree: Option<ObjectId>,
    pub files: Vec<ParsedFile>,
    pub declarations: Vec<Arc<Declaration>>,
    /// What the cache file read held over its base, when it was read
    /// whole: where a delta of the next tree starts from.
    pub(crate) on_disk: Option<OnDisk>,
}

impl ParsedTree {
    /// Flattens per-file results.
    pub fn from_contents(
        tree: Option<ObjectId>,
        files: impl IntoIterator<Item = (String, ObjectId, FileContents)>,
    ) -> Self {
        let mut out = ParsedTree {
            tree,
            ..ParsedTree::default()
        };
        for (path, blob, contents) in files {
            out.files.push(ParsedFile {
                path,
                blob,
                declarations: contents.declarations.len(),
                diagnostics: contents.diagnostics,
            });
            out.declarations.extend(contents.declarations);
        }
        out
    }

    /// The per-file results again.
    pub fn into_contents(self) -> Vec<(String, ObjectId, FileContents)> {
        let mut declarations = self.declarations.into_iter();
        self.files
            .into_iter()
            .map(|f| {
                let contents = FileContents {
                    declarations: declarations.by_ref().take(f.declarations).collect(),
                    diagnostics: f.diagnostics,
                };
                (f.path, f.blob, contents)
            })
            .collect()
    }
}

/// The parse results of the last tree, taken file by file by the next
/// tree's listing. Both are sorted by path, so this is a merge of the two
/// lists. A map of every cached file, looked up with a copy of each path,
/// took about half of a one-file commit's parse at 100,000 files.
pub(crate) struct CachedFiles {
    files: std::vec::IntoIter<ParsedFile>,
    declarations: std::vec::IntoIter<Arc<Declaration>>,
    /// The next file, looked at but not taken.
    next: Option<ParsedFile>,
    /// Whether a cached file was passed over: its path left the tree, or
    /// its blob changed.
    passed_over: bool,
    /// Changes since the cache read from disk, for a delta over its base
    /// ([`delta`]); `None` without one, or past its bound.
    changes: Option<Changes>,
}

/// The files taken from a cache read from disk, and where they changed.
struct Changes {
    on_disk: OnDisk,
    /// Not taken from the cache (new, or other bytes), in path order.
    changed: Vec<String>,
    /// Passed over and not in the tree, in path order.
    gone: Vec<String>,
    /// How many changes a delta holds ([`delta::max_changes`]).
    limit: usize,
}

impl CachedFiles {
    pub(crate) fn new(mut tree: ParsedTree) -> Self {
        let limit = delta::max_changes(tree.files.len());
        let mut changes = tree.on_disk.take().map(|on_disk| Changes {
            on_disk,
            changed: Vec::new(),
            gone: Vec::new(),
            limit,
        });
        // Written in path order; sorted here should anything else be.
        let tree = if tree.files.is_sorted_by(|a, b| a.path < b.path) {
            tree
        } else {
            changes = None;
            let mut contents = tree.into_contents();
            contents.sort_by(|a, b| a.0.cmp(&b.0));
            ParsedTree::from_contents(None, contents)
        };
        CachedFiles {
            files: tree.files.into_iter(),
            declarations: tree.declarations.into_iter(),
            next: None,
            passed_over: false,
            changes,
        }
    }

    /// The results of `path`, if they were cached for `blob`. The paths
    /// asked for must come in order (the files before `path` are passed
    /// over).
    pub(crate) fn take(&mut self, path: &str, blob: ObjectId) -> Option<FileContents> {
        let taken = self.take_cached(path, blob);
        if taken.is_none()
            && let Some(changes) = &mut self.changes
        {
            changes.changed.push(path.to_string());
            self.changes = self.changes.take().filter(Changes::within_limit);
        }
        taken
    }

    fn take_cached(&mut self, path: &str, blob: ObjectId) -> Option<FileContents> {
        loop {
            if self.next.is_none() {
                self.next = self.files.next();
            }
            let order = self.next.as_ref()?.path.as_str().cmp(path);
            if order == std::cmp::Ordering::Greater {
                return None;
            }
            let file = self.next.take()?;
            let declarations: Vec<Arc<Declaration>> =
                self.declarations.by_ref().take(file.declarations).collect();
            if order == std::cmp::Ordering::Equal && file.blob == blob {
                return Some(FileContents {
                    declarations,
                    diagnostics: file.diagnostics,
                });
            }
            self.passed_over = true;
            if order == std::cmp::Ordering::Equal {
                return None;
            }
            if let Some(changes) = &mut self.changes {
                changes.gone.push(file.path);
                self.changes = self.changes.take().filter(Changes::within_limit);
            }
        }
    }

    /// Whether any cached file was not taken, and the delta over the
    /// cache's base on disk, when one was read and the changes are within
    /// a delta's bound.
    pub(crate) fn finish(self) -> (bool, Option<CacheDelta>) {
        let left = usize::from(self.next.is_some()) + self.files.len();
        let stale = self.passed_over || left > 0;
        let within = |c: &Changes| c.changed.len() + c.gone.len() + left <= c.limit;
        let delta = self.changes.filter(within).and_then(|mut changes| {
            changes
                .gone
                .extend(self.next.into_iter().chain(self.files).map(|f| f.path));
            changes
                .on_disk
                .next(changes.changed, changes.gone, changes.limit)
        });
        (stale, delta)
    }

    /// The files not taken yet, with their results.
    pub(crate) fn rest(self) -> impl Iterator<Item = (String, ObjectId, FileContents)> {
        let mut declarations = self.declarations;
        self.next.into_iter().chain(self.files).map(move |f| {
            let contents = FileContents {
                declarations: declarations.by_ref().take(f.declarations).collect(),
                diagnostics: f.diagnostics,
            };
            (f.path, f.blob, contents)
        })
    }
}

impl Changes {
    fn within_limit(&self) -> bool {
        self.changed.len() + self.gone.len() <= self.limit
    }
}

/// A Git object id as its 20 bytes. Reading the cache does not touch
/// libgit2: its first use initialises TLS (tens of milliseconds), and the
/// cache is read beside that, not after it.
pub(crate) type ObjectId = [u8; 20];

/// The bytes of a Git object id.
pub(crate) fn object_id(oid: Oid) -> ObjectId {
    let mut id = [0; 20];
    id.copy_from_slice(&oid.as_bytes()[..20]);
    id
}

fn parse_object_id(hex: &str) -> Option<ObjectId> {
    crate::model::hash::bytes_of_hex(hex)
}

/// One file's parse result.
#[derive(Debug, Clone)]
pub struct ParsedFile {
    /// From the repository root.
    pub path: String,
    pub blob: ObjectId,
    /// How many of the tree's `declarations` are this file's.
    pub declarations: usize,
    pub diagnostics: Vec<Diagnostic>,
}

/// The first line: what wrote the cache, and for which tree.
#[derive(Serialize, Deserialize)]
struct Header {
    format: u32,
    tend: String,
    path: String,
    tree: String,
    files: usize,
}

#[derive(Deserialize)]
struct FileIn {
    path: String,
    blob: String,
    declarations: Vec<DeclarationIn>,
    diagnostics: Vec<(usize, usize, String)>,
}

#[derive(Deserialize)]
struct DeclarationIn {
    manifest: ManagedDatabase,
    line: usize,
    column: usize,
    spec_hash: SpecHash,
}

/// Where the cache lives in the source's directory.
pub(crate) fn cache_path(source_dir: &Path) -> PathBuf {
    source_dir.join("parse-cache.jsonl")
}

/// Reads the cache written for the source path `path`; anything unusable
/// reads as empty (see the module docs).
pub fn load(file: &Path, path: &str) -> ParsedTree {
    let started = std::time::Instant::now();
    let bytes = match fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(
                    "ignoring the parse cache {}: {e}; every file is parsed",
                    file.display()
                );
            }
            return ParsedTree::default();
        }
    };
    match read(&bytes, path) {
        Ok(Some(parsed)) => {
            let read = started.elapsed();
            let parsed = delta::apply(file, path, parsed);
            let changed = parsed.on_disk.as_ref().map_or(0, |d| d.changed.len());
            tracing::debug!(
                "source: parse cache read in {read:?}, its delta of {changed} files in {:?}",
                started.elapsed() - read
            );
            parsed
        }
        Ok(None) => {
            tracing::debug!(
                "parse cache {} was written by another tend: not used",
                file.display()
            );
            ParsedTree::default()
        }
        Err(e) => {
            tracing::warn!(
                "ignoring the parse cache {}: {e}; every file is parsed",
                file.display()
            );
            ParsedTree::default()
        }
    }
}

/// One JSON document per line: the header, then a file per line. The
/// lines are independent, so a large cache is read by a few threads, each
/// over its own run of lines.
fn read(bytes: &[u8], path: &str) -> Result<Option<ParsedTree>, serde_json::Error> {
    let (header, body) = match bytes.iter().position(|b| *b == b'\n') {
        Some(end) => (&bytes[..end], &bytes[end + 1..]),
        None => (bytes, &[][..]),
    };
    let header: Header = serde_json::from_slice(header)?;
    if header.format != FORMAT || header.tend != build_id() {
        return Ok(None);
    }
    let tree = parse_object_id(&header.tree).filter(|_| header.path == path);
    let chunks = split_lines(body, reader_threads(body.len()));
    let parts: Vec<Result<Lines, serde_json::Error>> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| scope.spawn(move || read_lines(chunk)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                // A lost run of lines must void the cache, never shorten
                // the snapshot.
                h.join().unwrap_or_else(|_| {
                    Err(serde::de::Error::custom("a cache reader thread panicked"))
                })
            })
            .collect()
    });
    let mut out = ParsedTree {
        tree,
        ..ParsedTree::default()
    };
    let parts = parts.into_iter().collect::<Result<Vec<Lines>, _>>()?;
    // Sized by what was read, never by the header's count.
    let files = parts.iter().map(|p| p.files.len()).sum::<usize>();
    let declarations = parts.iter().map(|p| p.declarations.len()).sum::<usize>();
    let mut entries = 0;
    for mut part in parts {
        entries += part.entries;
        if out.files.is_empty() {
            // The first run's lists are kept (and grown), not copied.
            std::mem::swap(&mut out.files, &mut part.files);
            std::mem::swap(&mut out.declarations, &mut part.declarations);
            out.files.reserve(files - out.files.len());
            out.declarations
                .reserve(declarations - out.declarations.len());
        }
        // An entry that no longer passes is parsed again; the tree cannot
        // then be trusted to be complete.
        if !part.complete {
            out.tree = None;
        }
        out.files.extend(part.files);
        out.declarations.extend(part.declarations);
    }
    // Lines lost at the end (a cut file, a partial copy) must not pass for
    // files deleted from the tree: the entries stay usable by blob id, but
    // the tree is listed again.
    if entries != header.files {
        out.tree = None;
    }
    Ok(Some(out))
}

/// What a run of lines holds.
struct Lines {
    files: Vec<ParsedFile>,
    declarations: Vec<Arc<Declaration>>,
    /// Every entry was usable.
    complete: bool,
    /// Entries read, usable or not.
    entries: usize,
}

/// Threads worth starting for `bytes` of cache: one per 256 KiB, at most
/// one per core (and four).
fn reader_threads(bytes: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (bytes / (256 << 10)).clamp(1, cores.min(4))
}

/// `bytes` cut into about `parts` runs of whole lines.
fn split_lines(bytes: &[u8], parts: usize) -> Vec<&[u8]> {
    let mut out = Vec::with_capacity(parts);
    let mut rest = bytes;
    for left in (1..=parts).rev() {
        if left == 1 || rest.is_empty() {
            out.push(rest);
            break;
        }
        let target = rest.len() / left;
        let cut = rest[target..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(rest.len(), |i| target + i + 1);
        let (head, tail) = rest.split_at(cut);
        out.push(head);
        rest = tail;
    }
    out
}

/// The entries of a run of lines.
///
/// A line is `<sha256 hex of the JSON> <JSON>`. A line whose check fails
/// is an unusable entry (its file is parsed again); a line whose check
/// passes but which does not read as an entry was written by a broken
/// tend, and voids the cache.
fn read_lines(bytes: &[u8]) -> Result<Lines, serde_json::Error> {
    // One entry per line, usually one declaration per entry.
    let entries = bytes.iter().filter(|b| **b == b'\n').count() + 1;
    let mut lines = Lines {
        files: Vec::with_capacity(entries),
        declarations: Vec::with_capacity(entries),
        complete: true,
        entries: 0,
    };
    for line in bytes.split(|b| *b == b'\n') {
        if line.is_empty() {
            continue;
        }
        lines.entries += 1;
        let Some(json) = checked_entry(line) else {
            lines.complete = false;
            continue;
        };
        let entry: FileIn = serde_json::from_slice(json)?;
        let file = PathBuf::from(&entry.path);
        let (Some(blob), Some(count)) = (
            parse_object_id(&entry.blob),
            read_declarations(&file, entry.declarations, &mut lines.declarations),
        ) else {
            lines.complete = false;
            continue;
        };
        lines.files.push(ParsedFile {
            path: entry.path,
            blob,
            declarations: count,
            diagnostics: entry
                .diagnostics
                .into_iter()
                .map(|(line, column, message)| Diagnostic {
                    file: file.clone(),
                    line,
                    column,
                    message,
                })
                .collect(),
        });
    }
    Ok(lines)
}

/// Length of the check that starts every entry line (hex sha256).
const CHECK_LEN: usize = 64;

/// The JSON of an entry line whose check matches it.
fn checked_entry(line: &[u8]) -> Option<&[u8]> {
    if line.len() <= CHECK_LEN || line[CHECK_LEN] != b' ' {
        return None;
    }
    let (check, json) = (&line[..CHECK_LEN], &line[CHECK_LEN + 1..]);
    (check == sha256_hex(json).as_bytes()).then_some(json)
}

/// Appends one file's declarations to `out`; `None` (and nothing added)
/// when one no longer passes.
fn read_declarations(
    file: &Path,
    declarations: Vec<DeclarationIn>,
    out: &mut Vec<Arc<Declaration>>,
) -> Option<usize> {
    let count = declarations.len();
    let mut read = Vec::with_capacity(count);
    for d in declarations {
        // Annotations and the normalised spec are not stored: they are
        // derived from the manifest, so the cache cannot carry a stale
        // interpretation of either.
        let annotations = parse_annotations(&d.manifest.metadata.annotations).ok()?;
        let normalized_spec = NormalizedSpec::of(&d.manifest);
        read.push(Arc::new(Declaration {
            manifest: d.manifest,
            file: file.to_path_buf(),
            line: d.line,
            column: d.column,
            annotations,
            spec_hash: d.spec_hash,
            normalized_spec,
        }));
    }
    out.append(&mut read);
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::store::store;
    use super::*;
    use crate::model::parse_file;

    fn entry(path: &str, text: &str) -> (String, Oid, FileContents) {
        let blob = Oid::hash_object(git2::ObjectType::Blob, text.as_bytes()).unwrap();
        (
            path.to_string(),
            blob,
            parse_file(Path::new(path), text.as_bytes()),
        )
    }

    const GOOD: &str = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n  labels: {team: 7}\n  annotations:\n    tend.dev/override-reason: \"incident 42\"\n    tend.dev/override-expires: 2h\n    tend.dev/ignore-fields: connectionLimit\nspec:\n  owner: app\n  connectionLimit: 20\n  parameters: {work_mem: 64MB}\n  extensions: [pg_trgm, {name: postgis, version: \"3.4\"}]\n  deletionPolicy: Delete\n---\napiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: Bad_Name\n";

    fn tree() -> Oid {
        Oid::hash_object(git2::ObjectType::Tree, b"").unwrap()
    }

    fn store_all(file: &Path, path: &str, entries: &[(String, Oid, FileContents)]) {
        store(
            file,
            path,
            tree(),
            entries.iter().map(|(p, o, c)| (p.as_str(), *o, c.into())),
        )
        .unwrap();
    }

    /// A declaration file of one database.
    fn declaring(name: &str) -> String {
        format!("apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\n")
    }

    #[test]
    fn cached_files_are_taken_in_path_order_and_what_is_passed_over_is_stale() {
        let cached = [
            entry("a/billing.yaml", &declaring("billing")),
            entry("a/ledger.yaml", &declaring("ledger")),
            entry("b/orders.yaml", &declaring("orders")),
            entry("c/payments.yaml", &declaring("payments")),
        ];
        let blob = |i: usize| object_id(cached[i].1);
        let tree_of = |order: &mut dyn Iterator<Item = &(String, Oid, FileContents)>| {
            let entries: Vec<_> = order
                .map(|(p, o, c)| (p.clone(), object_id(*o), c.clone()))
                .collect();
            ParsedTree::from_contents(None, entries)
        };
        // Written out of order: sorted on the way in.
        let tree = tree_of(&mut cached.iter().rev());
        let mut files = CachedFiles::new(tree);
        let name = |c: Option<FileContents>| c.map(|c| c.declarations[0].name().to_string());
        // `a/billing.yaml` left the tree; `a/ledger.yaml` is taken.
        assert_eq!(
            name(files.take("a/ledger.yaml", blob(1))),
            Some("ledger".into())
        );
        // A new file between two cached ones.
        assert_eq!(name(files.take("a/new.yaml", blob(2))), None);
        // `b/orders.yaml` with other bytes: not taken.
        assert_eq!(name(files.take("b/orders.yaml", blob(0))), None);
        let rest: Vec<(String, Option<String>)> = files
            .rest()
            .map(|(path, _, c)| (path, c.declarations.first().map(|d| d.name().to_string())))
            .collect();
        assert_eq!(
            rest,
            [("c/payments.yaml".to_string(), Some("payments".to_string()))]
        );

        let mut all = CachedFiles::new(tree_of(&mut cached.iter()));
        for (i, (path, _, _)) in cached.iter().enumerate() {
            assert!(all.take(path, blob(i)).is_some(), "{path}");
        }
        assert!(!all.finish().0, "every file was taken");
        let mut passed = CachedFiles::new(tree_of(&mut cached.iter()));
        assert!(passed.take("c/payments.yaml", blob(3)).is_some());
        assert!(passed.finish().0, "three files were passed over");
        let mut left = CachedFiles::new(tree_of(&mut cached.iter()));
        assert!(left.take("a/billing.yaml", blob(0)).is_some());
        assert!(left.finish().0, "three files were left");
    }

    #[test]
    fn round_trip_keeps_every_declaration_and_diagnostic() {
        let dir = tempfile::tempdir().unwrap();
        let file = cache_path(dir.path());
        let entries = [
            entry("dbs/empty.yaml", "# nothing\n"),
            entry("dbs/orders.yaml", GOOD),
        ];
        assert!(!entries[1].2.declarations.is_empty());
        assert!(!entries[1].2.diagnostics.is_empty());
        store_all(&file, "dbs", &entries);
        let loaded = load(&file, "dbs");
        assert_eq!(loaded.tree, Some(object_id(tree())));
        assert_eq!(loaded.files.len(), 2);
        let back = loaded.into_contents();
        for ((path, blob, contents), (back_path, back_blob, back)) in entries.iter().zip(&back) {
            assert_eq!((back_path, *back_blob), (path, object_id(*blob)));
            assert_eq!(back.declarations, contents.declarations);
            assert_eq!(back.diagnostics, contents.diagnostics);
        }
        // Written for another source path: entries usable, the tree not.
        let other = load(&file, "elsewhere");
        assert_eq!(other.tree, None);
        assert_eq!(other.files.len(), 2);
    }

    #[test]
    fn an_edited_entry_is_parsed_again_never_used() {
        let dir = tempfile::tempdir().unwrap();
        let file = cache_path(dir.path());
        store_all(&file, "", &[entry("a.yaml", GOOD), entry("b.yaml", GOOD)]);
        let text = fs::read_to_string(&file).unwrap();
        // The same blob id, a different value: what an attacker with write
        // access to the state dir, or a flipped bit, would leave.
        let edited = text.replacen("\"connectionLimit\":20", "\"connectionLimit\":999", 1);
        assert_ne!(edited, text);
        fs::write(&file, &edited).unwrap();
        let loaded = load(&file, "");
        assert_eq!(
            loaded.tree, None,
            "the tree must be listed (and a.yaml parsed) again"
        );
        assert_eq!(loaded.files.len(), 1);
        assert_eq!(loaded.files[0].path, "b.yaml");
        for d in &loaded.declarations {
            assert_eq!(d.manifest.spec.connection_limit, Some(20));
        }
    }

    #[test]
    fn object_ids_read_back_as_git_writes_them() {
        let oid = tree();
        assert_eq!(parse_object_id(&oid.to_string()), Some(object_id(oid)));
        assert_eq!(parse_object_id("zz"), None);
        assert_eq!(parse_object_id(&"g".repeat(40)), None);
    }

    #[test]
    fn lines_are_split_into_runs_of_whole_lines() {
        let text = b"a\nbb\nccc\ndddd\n";
        for parts in 1..6 {
            let chunks = split_lines(text, parts);
            assert!(chunks.len() <= parts);
            assert_eq!(chunks.concat(), text, "{parts} parts");
            for chunk in &chunks[..chunks.len() - 1] {
                assert!(chunk.ends_with(b"\n"), "{parts} parts: {chunks:?}");
            }
        }
        assert_eq!(split_lines(b"", 3), [b""]);
    }

    #[test]
    fn corrupt_or_foreign_cache_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = cache_path(dir.path());
        assert!(load(&file, "").files.is_empty(), "missing");
        fs::write(&file, b"{\"format\": 3, \"tend\": ").unwrap();
        assert!(load(&file, "").files.is_empty(), "truncated header");
        store_all(&file, "", &[entry("a.yaml", GOOD), entry("b.yaml", GOOD)]);
        let text = fs::read_to_string(&file).unwrap();
        let cut = &text[..text.len() - 40];
        fs::write(&file, cut).unwrap();
        let loaded = load(&file, "");
        assert_eq!(
            (loaded.files.len(), loaded.tree),
            (1, None),
            "a truncated entry is parsed again, and the tree listed again"
        );
        // Cut at a line break: the entries left are usable, the tree is not.
        let whole_lines = text.lines().take(2).collect::<Vec<_>>().join("\n");
        fs::write(&file, format!("{whole_lines}\n")).unwrap();
        let loaded = load(&file, "");
        assert_eq!(loaded.files.len(), 1);
        assert_eq!(
            loaded.tree, None,
            "a missing line must not pass for a deleted file"
        );
        // A header promising far more lines than there are reads the same.
        let huge = text.replacen("\"files\":2", "\"files\":18446744073709551615", 1);
        assert_ne!(huge, text);
        fs::write(&file, huge).unwrap();
        let loaded = load(&file, "");
        assert_eq!((loaded.files.len(), loaded.tree), (2, None));
        // A line whose check passes but which is no entry: a broken
        // writer, so nothing of the cache is trusted.
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let junk = "[1,2]";
        lines[1] = format!("{} {junk}", sha256_hex(junk.as_bytes()));
        fs::write(&file, lines.join("\n") + "\n").unwrap();
        assert!(
            load(&file, "").files.is_empty(),
            "a checked line that is no entry"
        );
        let foreign = text.replacen(build_id(), "0.0.0-other", 1);
        assert_ne!(foreign, text);
        fs::write(&file, foreign).unwrap();
        assert!(
            load(&file, "").files.is_empty(),
            "another tend version's cache"
        );
    }
}
