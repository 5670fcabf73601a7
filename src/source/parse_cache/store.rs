//! Writing the parse cache: one header line, then a checked line per
//! file (see the parent module for the layout and what it guarantees).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use git2::Oid;
use serde::Serialize;

use super::{FORMAT, Header, build_id};
use crate::model::hash::sha256_hex;
use crate::model::load::FileContents;
use crate::model::{Declaration, Diagnostic, ManagedDatabase, SpecHash};

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

/// One file's parse results as [`store`] writes them: borrowed from its
/// [`FileContents`], or gathered from a snapshot's declarations.
pub(crate) struct FileView<'a> {
    /// In the file's order.
    pub declarations: Vec<&'a Declaration>,
    pub diagnostics: &'a [Diagnostic],
}

impl<'a> From<&'a FileContents> for FileView<'a> {
    fn from(contents: &'a FileContents) -> Self {
        FileView {
            declarations: contents.declarations.iter().map(Arc::as_ref).collect(),
            diagnostics: &contents.diagnostics,
        }
    }
}

/// Replaces the cache with the parse results of `tree` (at source path
/// `path`).
pub(crate) fn store<'a>(
    file: &Path,
    path: &str,
    tree: Oid,
    files: impl ExactSizeIterator<Item = (&'a str, Oid, FileView<'a>)>,
) -> std::io::Result<()> {
    // Streamed to the file: at 100,000 declarations the whole text is
    // 50 MB, which the agent would otherwise hold beside its snapshot.
    crate::files::write_atomically_with(file, |out| {
        let header = Header {
            format: FORMAT,
            tend: build_id().to_string(),
            path: path.to_string(),
            tree: tree.to_string(),
            files: files.len(),
        };
        serde_json::to_writer(&mut *out, &header).map_err(std::io::Error::other)?;
        out.write_all(b"\n")?;
        let mut json = Vec::with_capacity(512);
        for (path, blob, contents) in files {
            write_entry(out, &mut json, path, blob, contents)?;
        }
        Ok(())
    })?;
    // A delta over the base replaced is void (see `delta`); left behind
    // (a crash here), it is over another tree, or holds over this one.
    match std::fs::remove_file(super::delta::delta_path(file)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// One checked entry line: `<sha256 hex of the JSON> <JSON>`, the JSON
/// made in `json`.
pub(super) fn write_entry(
    out: &mut impl Write,
    json: &mut Vec<u8>,
    path: &str,
    blob: Oid,
    contents: FileView<'_>,
) -> std::io::Result<()> {
    let entry = FileOut {
        path,
        blob: blob.to_string(),
        declarations: contents
            .declarations
            .into_iter()
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
    json.clear();
    serde_json::to_writer(&mut *json, &entry).map_err(std::io::Error::other)?;
    out.write_all(sha256_hex(json).as_bytes())?;
    out.write_all(b" ")?;
    out.write_all(json)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// [`store`], logged: a failure is a warning, since it costs the next
/// process some parsing, nothing else. `when` ends the debug line.
pub(crate) fn store_logged<'a>(
    file: &Path,
    path: &str,
    tree: Oid,
    files: impl ExactSizeIterator<Item = (&'a str, Oid, FileView<'a>)>,
    when: &str,
) {
    let started = std::time::Instant::now();
    match store(file, path, tree, files) {
        Ok(()) => tracing::debug!(
            "source: parse cache written in {:?}{when}",
            started.elapsed()
        ),
        Err(e) => tracing::warn!(
            "cannot write the parse cache {}: {e}; the next process parses every file",
            file.display()
        ),
    }
}
