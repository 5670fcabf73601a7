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
//! * The file is replaced atomically (write, fsync, rename), so a crash
//!   leaves the old cache or the new one, never half of one.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use git2::Oid;
use serde::{Deserialize, Serialize};

use crate::model::hash::normalized_spec_value;
use crate::model::load::FileContents;
use crate::model::overrides::parse_annotations;
use crate::model::{Declaration, Diagnostic, ManagedDatabase, SpecHash};

/// Bumped whenever the layout below changes.
const FORMAT: u32 = 2;

/// The parse results of one tree: every declaration file under the
/// source path, sorted by path.
#[derive(Debug, Clone, Default)]
pub struct ParsedTree {
    /// The tree the files were read from; `None` when unknown (a cache
    /// written for another source path). The same tree id means the same
    /// files with the same bytes, so they need not even be listed again.
    pub tree: Option<Oid>,
    pub files: Vec<ParsedFile>,
}

/// One file's parse result.
#[derive(Debug, Clone)]
pub struct ParsedFile {
    /// From the repository root.
    pub path: String,
    pub blob: Oid,
    pub contents: FileContents,
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

#[derive(Serialize)]
struct FileOut<'a> {
    path: &'a str,
    blob: String,
    declarations: Vec<DeclarationOut<'a>>,
    diagnostics: Vec<(usize, usize, &'a str)>,
}

#[derive(Serialize)]
struct DeclarationOut<'a> {
    manifest: &'a ManagedDatabase,
    line: usize,
    column: usize,
    spec_hash: &'a SpecHash,
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
pub fn cache_path(source_dir: &Path) -> PathBuf {
    source_dir.join("parse-cache.jsonl")
}

/// Reads the cache written for the source path `path`; anything unusable
/// reads as empty (see the module docs).
pub fn load(file: &Path, path: &str) -> ParsedTree {
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
        Ok(Some(parsed)) => parsed,
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

/// One JSON document per line: the header, then a file per line (streamed,
/// so ten thousand entries never sit in one growing vector twice).
fn read(bytes: &[u8], path: &str) -> Result<Option<ParsedTree>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let header = Header::deserialize(&mut de)?;
    if header.format != FORMAT || header.tend != env!("CARGO_PKG_VERSION") {
        return Ok(None);
    }
    let tree = Oid::from_str(&header.tree)
        .ok()
        .filter(|_| header.path == path);
    let mut files = Vec::with_capacity(header.files);
    for entry in de.into_iter::<FileIn>() {
        let entry = entry?;
        let Ok(blob) = Oid::from_str(&entry.blob) else {
            continue;
        };
        // An entry that no longer passes is parsed again; the tree cannot
        // then be trusted to be complete.
        match contents_of(&entry.path, entry.declarations, entry.diagnostics) {
            Some(contents) => files.push(ParsedFile {
                path: entry.path,
                blob,
                contents,
            }),
            None => return Ok(Some(ParsedTree { tree: None, files })),
        }
    }
    Ok(Some(ParsedTree { tree, files }))
}

fn contents_of(
    path: &str,
    declarations: Vec<DeclarationIn>,
    diagnostics: Vec<(usize, usize, String)>,
) -> Option<FileContents> {
    let file = PathBuf::from(path);
    // Exactly sized: most files hold one declaration, and a vector grown
    // by pushes would keep room for four.
    let mut out = Vec::with_capacity(declarations.len());
    for d in declarations {
        // Annotations and the normalised spec are not stored: they are
        // derived from the manifest, so the cache cannot carry a stale
        // interpretation of either.
        let annotations = parse_annotations(&d.manifest.metadata.annotations).ok()?;
        let normalized_spec = normalized_spec_value(&d.manifest);
        out.push(Declaration {
            manifest: d.manifest,
            file: file.clone(),
            line: d.line,
            column: d.column,
            annotations,
            spec_hash: d.spec_hash,
            normalized_spec,
        });
    }
    let diagnostics = diagnostics
        .into_iter()
        .map(|(line, column, message)| Diagnostic {
            file: file.clone(),
            line,
            column,
            message,
        })
        .collect();
    Some(FileContents {
        declarations: out,
        diagnostics,
    })
}

/// Replaces the cache with the parse results of `tree` (at source path
/// `path`).
pub fn store<'a>(
    file: &Path,
    path: &str,
    tree: Oid,
    files: impl ExactSizeIterator<Item = (&'a str, Oid, &'a FileContents)>,
) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(files.len() * 512);
    let header = Header {
        format: FORMAT,
        tend: env!("CARGO_PKG_VERSION").to_string(),
        path: path.to_string(),
        tree: tree.to_string(),
        files: files.len(),
    };
    serde_json::to_writer(&mut out, &header).map_err(std::io::Error::other)?;
    out.push(b'\n');
    for (path, blob, contents) in files {
        let entry = FileOut {
            path,
            blob: blob.to_string(),
            declarations: contents
                .declarations
                .iter()
                .map(|d| DeclarationOut {
                    manifest: &d.manifest,
                    line: d.line,
                    column: d.column,
                    spec_hash: &d.spec_hash,
                })
                .collect(),
            diagnostics: contents
                .diagnostics
                .iter()
                .map(|d| (d.line, d.column, d.message.as_str()))
                .collect(),
        };
        serde_json::to_writer(&mut out, &entry).map_err(std::io::Error::other)?;
        out.push(b'\n');
    }
    let tmp = file.with_extension("tmp");
    let mut f = fs::File::create(&tmp)?;
    f.write_all(&out)?;
    f.sync_all()?;
    fs::rename(&tmp, file)
}

#[cfg(test)]
mod tests {
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
            entries.iter().map(|(p, o, c)| (p.as_str(), *o, c)),
        )
        .unwrap();
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
        assert_eq!(loaded.tree, Some(tree()));
        assert_eq!(loaded.files.len(), 2);
        for ((path, blob, contents), back) in entries.iter().zip(&loaded.files) {
            assert_eq!((&back.path, back.blob), (path, *blob));
            assert_eq!(back.contents.declarations, contents.declarations);
            assert_eq!(back.contents.diagnostics, contents.diagnostics);
        }
        // Written for another source path: entries usable, the tree not.
        let other = load(&file, "elsewhere");
        assert_eq!(other.tree, None);
        assert_eq!(other.files.len(), 2);
    }

    #[test]
    fn corrupt_or_foreign_cache_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = cache_path(dir.path());
        assert!(load(&file, "").files.is_empty(), "missing");
        fs::write(&file, b"{\"format\": 2, \"tend\": ").unwrap();
        assert!(load(&file, "").files.is_empty(), "truncated header");
        store_all(&file, "", &[entry("a.yaml", GOOD), entry("b.yaml", GOOD)]);
        let text = fs::read_to_string(&file).unwrap();
        let cut = &text[..text.len() - 40];
        fs::write(&file, cut).unwrap();
        let loaded = load(&file, "");
        assert!(loaded.files.is_empty(), "a truncated entry voids the cache");
        let foreign = text.replacen(env!("CARGO_PKG_VERSION"), "0.0.0-other", 1);
        assert_ne!(foreign, text);
        fs::write(&file, foreign).unwrap();
        assert!(
            load(&file, "").files.is_empty(),
            "another tend version's cache"
        );
    }
}
