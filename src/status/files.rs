//! The report files in `reports_dir`: `latest.json` (the report contract),
//! `latest.md`, `latest.html`, and a bounded history.
//!
//! # Guarantees
//! * A reader never sees half a file: each is written beside its final
//!   name, flushed to disk, then renamed over it (and the directory is
//!   synced, so the rename survives a crash).
//! * `history/` keeps at most `keep_reports` JSON reports, named by the
//!   time they were made (`20270115T080000Z-000.json`), so names sort by
//!   time. A report is added only when what it says changed from the
//!   newest one kept ([`Report::content_digest`]): a quiet fleet does not
//!   rotate a day's history away in an hour.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::report::Report;
use super::{html, render};

/// Why report files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportFilesError {
    /// A file or directory under `reports_dir` could not be written.
    #[error("cannot write {path}: {source}; check that [status] reports_dir is writable by tend")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Where the reports go, and how many to keep.
#[derive(Debug, Clone)]
pub struct ReportFiles {
    dir: PathBuf,
    keep: usize,
}

impl ReportFiles {
    pub fn new(dir: &Path, keep: usize) -> Self {
        ReportFiles {
            dir: dir.to_path_buf(),
            keep,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the three `latest.*` files and, when the content changed, a
    /// history entry. `title` heads the Markdown and HTML (`tend apply`).
    pub fn write(&self, report: &Report, title: &str) -> Result<(), ReportFilesError> {
        let at = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReportFilesError::Write { path, source }
        };
        fs::create_dir_all(&self.dir).map_err(at(&self.dir))?;
        let json = serde_json::to_vec_pretty(report).map_err(io::Error::other);
        let json = json.map_err(at(&self.dir.join("latest.json")))?;
        for (name, bytes) in [
            ("latest.json", json.as_slice()),
            ("latest.md", render::markdown(report, title).as_bytes()),
            ("latest.html", html::page(report, title).as_bytes()),
        ] {
            let path = self.dir.join(name);
            write_atomically(&path, bytes).map_err(at(&path))?;
        }
        if self.keep > 0 {
            let history = self.dir.join("history");
            self.add_to_history(&history, report, &json)
                .map_err(at(&history))?;
        }
        sync_dir(&self.dir).map_err(at(&self.dir))
    }

    /// The report in `latest.json`, if there is a readable one.
    pub fn read_latest(&self) -> Option<Report> {
        let bytes = fs::read(self.dir.join("latest.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn add_to_history(&self, history: &Path, report: &Report, json: &[u8]) -> io::Result<()> {
        fs::create_dir_all(history)?;
        let mut kept = entries(history)?;
        let digest = report.content_digest();
        let unchanged = kept
            .last()
            .and_then(|newest| fs::read(history.join(newest)).ok())
            .and_then(|bytes| serde_json::from_slice::<Report>(&bytes).ok())
            .is_some_and(|newest| newest.content_digest() == digest);
        if !unchanged {
            // Reports made in the same second are numbered after the
            // newest of that second, so names keep sorting by time.
            let stem = compact_time(&report.generated_at);
            let next = kept
                .iter()
                .filter_map(|n| n.strip_prefix(&format!("{stem}-"))?.strip_suffix(".json"))
                .filter_map(|n| n.parse::<u32>().ok())
                .max()
                .map_or(0, |n| n + 1);
            let name = format!("{stem}-{next:03}.json");
            write_atomically(&history.join(&name), json)?;
            kept.push(name);
            kept.sort();
        }
        let excess = kept.len().saturating_sub(self.keep);
        for old in &kept[..excess] {
            fs::remove_file(history.join(old))?;
        }
        sync_dir(history)
    }
}

/// The history entries, oldest first.
fn entries(history: &Path) -> io::Result<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(history)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
        .collect();
    names.sort();
    Ok(names)
}

/// `2027-01-15T08:00:00Z` as `20270115T080000Z`: sortable, and a valid
/// file name everywhere.
fn compact_time(rfc3339: &str) -> String {
    let compact: String = rfc3339
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    if compact.is_empty() {
        "unknown".into()
    } else {
        compact
    }
}

/// Writes `bytes` to `path` through a temporary file beside it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut file = fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, path)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_names_sort_by_time() {
        assert_eq!(compact_time("2027-01-15T08:00:00Z"), "20270115T080000Z");
        assert!(compact_time("2027-01-15T08:00:00Z") < compact_time("2027-01-15T10:00:00Z"));
        assert_eq!(compact_time(""), "unknown");
    }
}
