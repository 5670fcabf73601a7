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

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use git2::Oid;
use serde::{Deserialize, Serialize};

use crate::model::load::FileContents;
use crate::model::overrides::parse_annotations;
use crate::model::{Declaration, Diagnostic, ManagedDatabase, SpecHash};

/// Bumped whenever the layout below changes.
const FORMAT: u32 = 1;

/// Parse results by (path from the repository root, blob id).
pub type ParsedFiles = HashMap<(String, Oid), FileContents>;

#[derive(Serialize)]
struct CacheOut<'a> {
    format: u32,
    tend: &'a str,
    files: Vec<FileOut<'a>>,
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
    normalized_spec: &'a serde_json::Value,
}

#[derive(Deserialize)]
struct CacheIn {
    format: u32,
    tend: String,
    files: Vec<FileIn>,
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
    normalized_spec: serde_json::Value,
}

/// Where the cache lives in the source's directory.
pub fn cache_path(source_dir: &Path) -> PathBuf {
    source_dir.join("parse-cache.json")
}

/// Reads the cache; anything unusable reads as empty (see the module docs).
pub fn load(file: &Path) -> ParsedFiles {
    let bytes = match fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(
                    "ignoring the parse cache {}: {e}; every file is parsed",
                    file.display()
                );
            }
            return ParsedFiles::new();
        }
    };
    let cache: CacheIn = match serde_json::from_slice(&bytes) {
        Ok(cache) => cache,
        Err(e) => {
            tracing::warn!(
                "ignoring the parse cache {}: {e}; every file is parsed",
                file.display()
            );
            return ParsedFiles::new();
        }
    };
    if cache.format != FORMAT || cache.tend != env!("CARGO_PKG_VERSION") {
        tracing::debug!(
            "parse cache {} is from tend {} (format {}): not used",
            file.display(),
            cache.tend,
            cache.format
        );
        return ParsedFiles::new();
    }
    let mut parsed = ParsedFiles::with_capacity(cache.files.len());
    for entry in cache.files {
        let Ok(blob) = Oid::from_str(&entry.blob) else {
            continue;
        };
        if let Some(contents) = contents_of(&entry.path, entry.declarations, entry.diagnostics) {
            parsed.insert((entry.path, blob), contents);
        }
    }
    parsed
}

fn contents_of(
    path: &str,
    declarations: Vec<DeclarationIn>,
    diagnostics: Vec<(usize, usize, String)>,
) -> Option<FileContents> {
    let file = PathBuf::from(path);
    let declarations = declarations
        .into_iter()
        .map(|d| {
            // Annotations are not stored: they are re-derived from the
            // manifest, so the cache cannot carry a stale interpretation.
            let annotations = parse_annotations(&d.manifest.metadata.annotations).ok()?;
            Some(Declaration {
                manifest: d.manifest,
                file: file.clone(),
                line: d.line,
                column: d.column,
                annotations,
                spec_hash: d.spec_hash,
                normalized_spec: d.normalized_spec,
            })
        })
        .collect::<Option<Vec<_>>>()?;
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
        declarations,
        diagnostics,
    })
}

/// Replaces the cache with `files` (the current snapshot's parse results).
pub fn store<'a>(
    file: &Path,
    files: impl Iterator<Item = (&'a str, Oid, &'a FileContents)>,
) -> std::io::Result<()> {
    let cache = CacheOut {
        format: FORMAT,
        tend: env!("CARGO_PKG_VERSION"),
        files: files
            .map(|(path, blob, contents)| FileOut {
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
                        normalized_spec: &d.normalized_spec,
                    })
                    .collect(),
                diagnostics: contents
                    .diagnostics
                    .iter()
                    .map(|d| (d.line, d.column, d.message.as_str()))
                    .collect(),
            })
            .collect(),
    };
    let bytes = serde_json::to_vec(&cache).map_err(std::io::Error::other)?;
    let tmp = file.with_extension("tmp");
    let mut out = fs::File::create(&tmp)?;
    out.write_all(&bytes)?;
    out.sync_all()?;
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

    #[test]
    fn round_trip_keeps_every_declaration_and_diagnostic() {
        let dir = tempfile::tempdir().unwrap();
        let file = cache_path(dir.path());
        let entries = [
            entry("dbs/orders.yaml", GOOD),
            entry("dbs/empty.yaml", "# nothing\n"),
        ];
        assert!(!entries[0].2.declarations.is_empty());
        assert!(!entries[0].2.diagnostics.is_empty());
        store(&file, entries.iter().map(|(p, o, c)| (p.as_str(), *o, c))).unwrap();
        let loaded = load(&file);
        assert_eq!(loaded.len(), 2);
        for (path, blob, contents) in &entries {
            let back = &loaded[&(path.clone(), *blob)];
            assert_eq!(back.declarations, contents.declarations);
            assert_eq!(back.diagnostics, contents.diagnostics);
        }
    }

    #[test]
    fn corrupt_or_foreign_cache_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = cache_path(dir.path());
        assert!(load(&file).is_empty(), "missing");
        fs::write(&file, b"{\"format\": 1, \"tend\": ").unwrap();
        assert!(load(&file).is_empty(), "truncated");
        let entries = [entry("a.yaml", GOOD)];
        store(&file, entries.iter().map(|(p, o, c)| (p.as_str(), *o, c))).unwrap();
        let text = fs::read_to_string(&file).unwrap();
        let foreign = text.replacen(env!("CARGO_PKG_VERSION"), "0.0.0-other", 1);
        assert_ne!(foreign, text);
        fs::write(&file, foreign).unwrap();
        assert!(load(&file).is_empty(), "another tend version's cache");
    }
}
