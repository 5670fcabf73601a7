//! Loading declarations from files: every problem is a [`Diagnostic`] with a
//! file, line and column; one bad file or document never hides the others.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::declaration::ManagedDatabase;
use super::hash::SpecHash;
use super::normalized::NormalizedSpec;
use super::overrides::TendAnnotations;
use super::validate::{Problem, check_type, validate};
use super::yaml::{
    Document, GUARD_MESSAGES, MAX_FLOW_OPENERS, Shape, guarded_shape, locate, split_documents,
    too_many_flow_openers,
};

/// Files larger than this are refused unread.
pub(crate) const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// One problem in one file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Diagnostic {
    pub file: PathBuf,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters as libyaml counts them.
    pub column: usize,
    pub message: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            crate::escape::terminal(&self.file.display().to_string()),
            self.line,
            self.column,
            crate::escape::terminal(&self.message)
        )
    }
}

/// A valid declaration and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Declaration {
    pub manifest: ManagedDatabase,
    pub file: PathBuf,
    /// Position of `metadata.name`.
    pub line: usize,
    pub column: usize,
    pub annotations: TendAnnotations,
    pub spec_hash: SpecHash,
    /// The normalised spec (computed once with the hash; the planner
    /// compares field values from it).
    pub normalized_spec: NormalizedSpec,
}

impl Declaration {
    pub fn name(&self) -> &str {
        &self.manifest.metadata.name
    }

    /// [`ManagedDatabase::database_name`], borrowed from the normalised
    /// spec (which always names the database) instead of built: a cycle
    /// routes every declaration of its provider.
    pub fn database_name(&self) -> std::borrow::Cow<'_, str> {
        match self
            .normalized_spec
            .get("databaseName")
            .and_then(serde_json::Value::as_str)
        {
            Some(name) => std::borrow::Cow::Borrowed(name),
            None => std::borrow::Cow::Owned(self.manifest.database_name()),
        }
    }
}

/// What one file holds.
#[derive(Debug, Clone, Default)]
pub struct FileContents {
    /// Shared: a snapshot's declarations are the parse results' own, and
    /// the next snapshot takes over those of the files that kept their
    /// bytes without copying them.
    pub declarations: Vec<Arc<Declaration>>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Parses one file's bytes (from disk or a Git blob).
pub fn parse_file(file: &Path, bytes: &[u8]) -> FileContents {
    let mut out = FileContents::default();
    let diagnostic = |line: usize, column: usize, message: String| Diagnostic {
        file: file.to_path_buf(),
        line,
        column,
        message,
    };
    if bytes.len() as u64 > MAX_FILE_BYTES {
        out.diagnostics.push(diagnostic(
            1,
            1,
            format!(
                "file is {} bytes, over the 1 MiB limit for a declaration file: split it into smaller files",
                bytes.len()
            ),
        ));
        return out;
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let (line, column) =
                position_after(&String::from_utf8_lossy(&bytes[..e.valid_up_to()]));
            out.diagnostics.push(diagnostic(
                line,
                column,
                "file is not valid UTF-8: save it as UTF-8".to_string(),
            ));
            return out;
        }
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let documents = split_documents(text);
    let mut seen_document = false;
    for document in documents {
        match parse_document(document) {
            DocumentOutcome::Empty => {}
            DocumentOutcome::Declaration(decl, (line, column)) => {
                seen_document = true;
                let (spec_hash, normalized_spec) = decl.0.spec_hash_and_value();
                out.declarations.push(Arc::new(Declaration {
                    manifest: decl.0,
                    file: file.to_path_buf(),
                    line,
                    column,
                    annotations: decl.1,
                    spec_hash,
                    normalized_spec: NormalizedSpec::from_value(normalized_spec),
                }));
            }
            DocumentOutcome::Problems(problems) => {
                seen_document = true;
                for (line, column, message) in problems {
                    out.diagnostics.push(diagnostic(line, column, message));
                }
            }
        }
    }
    if !seen_document {
        out.diagnostics.push(diagnostic(
            1,
            1,
            "file has no YAML documents (it is empty or only comments): add a ManagedDatabase or remove the file".to_string(),
        ));
    }
    out
}

/// The 1-based line and column (in characters) of what follows `before`.
fn position_after(before: &str) -> (usize, usize) {
    let line = 1 + before.matches('\n').count();
    let last_line = before.rsplit_once('\n').map_or(before, |(_, last)| last);
    (line, 1 + last_line.chars().count())
}

enum DocumentOutcome {
    Empty,
    Declaration(Box<(ManagedDatabase, TendAnnotations)>, (usize, usize)),
    Problems(Vec<(usize, usize, String)>),
}

fn parse_document(document: Document<'_>) -> DocumentOutcome {
    let offset = document.line_offset;
    let text = document.text;
    let root = || {
        locate(text, &[], false)
            .map(|(l, c)| (l + offset, c))
            .unwrap_or((offset + 1, 1))
    };
    let place = |problem: Problem| {
        let (line, column) = locate(text, &problem.path, problem.at_key)
            .map(|(l, c)| (l + offset, c))
            .unwrap_or_else(root);
        (line, column, problem.message)
    };
    let from_yaml = |e: serde_norway::Error| {
        // The error's own " at line N column M" counts from the start of this
        // document, not of the file; the diagnostic carries the position.
        let message = strip_positions(&e.to_string());
        match e.location() {
            Some(l) => {
                // What is written where the parser stopped (`1e3`, a tab).
                let token = text
                    .lines()
                    .nth(l.line().saturating_sub(1))
                    .and_then(|line| line.get(l.column().saturating_sub(1)..))
                    .map(|rest| {
                        if rest.starts_with('\t') {
                            rest
                        } else {
                            rest.split([' ', '\t', '#']).next().unwrap_or(rest)
                        }
                    });
                let message = super::messages::humanize(&message, token);
                (l.line() + offset, l.column(), message)
            }
            None => {
                let (line, column) = root();
                (line, column, message)
            }
        }
    };

    if let Some(at) = too_many_flow_openers(text) {
        let (line, column) = position_after(&text[..at]);
        return DocumentOutcome::Problems(vec![(
            line + offset,
            column,
            format!(
                "the document has more than {MAX_FLOW_OPENERS} `[` and `{{`: tend does not parse it (nesting that deep takes the YAML parser minutes, and a declaration never needs it); flatten the document"
            ),
        )]);
    }
    let shape = match guarded_shape(text) {
        Ok(shape) => shape,
        Err(e) => {
            let (line, column, message) = from_yaml(e);
            // The path of a node 64 levels down is noise; the position says where.
            let message = match GUARD_MESSAGES.iter().find_map(|m| message.find(m)) {
                Some(start) => message[start..].to_string(),
                None => message,
            };
            return DocumentOutcome::Problems(vec![(line, column, message)]);
        }
    };
    let (api_version, kind) = match shape {
        Shape::Null => return DocumentOutcome::Empty,
        Shape::Mapping { api_version, kind } => (api_version, kind),
        Shape::Scalar(_) | Shape::List => {
            let what = if shape == Shape::List {
                "a list"
            } else {
                "a scalar"
            };
            let (line, column) = root();
            return DocumentOutcome::Problems(vec![(
                line,
                column,
                format!(
                    "document is {what}, but a declaration is a mapping with apiVersion, kind, metadata and spec"
                ),
            )]);
        }
    };
    let type_problems = check_type(api_version.as_deref(), kind.as_deref());
    if !type_problems.is_empty() {
        return DocumentOutcome::Problems(type_problems.into_iter().map(place).collect());
    }
    let manifest: ManagedDatabase =
        match ManagedDatabase::deserialize(serde_norway::Deserializer::from_str(text)) {
            Ok(m) => m,
            Err(e) => return DocumentOutcome::Problems(vec![from_yaml(e)]),
        };
    let (annotations, problems) = validate(&manifest);
    match annotations {
        Some(annotations) if problems.is_empty() => {
            let name_at = locate(text, &["metadata".into(), "name".into()], false)
                .map(|(l, c)| (l + offset, c))
                .unwrap_or_else(root);
            DocumentOutcome::Declaration(Box::new((manifest, annotations)), name_at)
        }
        _ => DocumentOutcome::Problems(problems.into_iter().map(place).collect()),
    }
}

/// Removes every " at line N column M" that libyaml and serde_norway put in
/// their messages.
fn strip_positions(message: &str) -> String {
    const AT_LINE: &str = " at line ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find(AT_LINE) {
        out.push_str(&rest[..i]);
        let after = &rest[i + AT_LINE.len()..];
        let digits = |s: &str| s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let line_digits = digits(after);
        let tail = &after[line_digits..];
        match tail.strip_prefix(" column ") {
            Some(col) if line_digits > 0 && digits(col) > 0 => rest = &col[digits(col)..],
            _ => {
                out.push_str(AT_LINE);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A declaration's database name, compared without building it. Names
/// that differ never clash; equal names go to the slow path, which decides
/// by provider (see [`DeclarationSet::from_parsed`]).
#[derive(Clone, Copy)]
struct DatabaseKey<'a>(&'a ManagedDatabase);

impl<'a> DatabaseKey<'a> {
    fn bytes(&self) -> impl Iterator<Item = u8> + 'a {
        self.0.database_name_bytes()
    }
}

impl PartialEq for DatabaseKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes().eq(other.bytes())
    }
}

impl Eq for DatabaseKey<'_> {}

impl std::hash::Hash for DatabaseKey<'_> {
    /// Fed in chunks of a fixed size (so equal names give equal chunks):
    /// a byte at a time, hashing 100,000 names took most of a snapshot's
    /// 180 ms of set building.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut chunk = [0u8; 32];
        let mut len = 0;
        for b in self.bytes() {
            chunk[len] = b;
            len += 1;
            if len == chunk.len() {
                state.write(&chunk);
                len = 0;
            }
        }
        state.write(&chunk[..len]);
    }
}

/// A name's first 16 bytes as a number that orders as the bytes do
/// (shorter names padded with zeros, which sort first as a prefix does).
fn name_prefix(name: &str) -> u128 {
    let mut bytes = [0u8; 16];
    let head = &name.as_bytes()[..name.len().min(16)];
    bytes[..head.len()].copy_from_slice(head);
    u128::from_be_bytes(bytes)
}

/// Declarations and diagnostics of a whole set of files.
#[derive(Debug, Clone, Default)]
pub struct DeclarationSet {
    /// Sorted by name; names are unique.
    pub declarations: Vec<Arc<Declaration>>,
    /// Sorted by file, line, column.
    pub diagnostics: Vec<Diagnostic>,
    /// Files read.
    pub files: usize,
}

impl DeclarationSet {
    /// Builds a set from parsed files: duplicate names become an error on
    /// every place they occur, and none of them is kept.
    pub fn from_files(files: Vec<FileContents>) -> Self {
        let count = files.len();
        let mut declarations = Vec::with_capacity(files.iter().map(|f| f.declarations.len()).sum());
        let mut diagnostics = Vec::new();
        for file in files {
            declarations.extend(file.declarations);
            diagnostics.extend(file.diagnostics);
        }
        Self::from_parsed(declarations, diagnostics, count)
    }

    /// [`Self::from_files`] over declarations and diagnostics already
    /// gathered from `files` files.
    ///
    /// Long on purpose: the common case (names in order, databases
    /// distinct: no copy) and the checks that report duplicates on both
    /// sides, kept together so the two cannot disagree.
    pub fn from_parsed(
        declarations: Vec<Arc<Declaration>>,
        mut diagnostics: Vec<Diagnostic>,
        files: usize,
    ) -> Self {
        let count = files;
        // Names in strictly increasing order are distinct: nothing to sort.
        let mut declarations = if declarations.is_sorted_by(|a, b| a.name() < b.name()) {
            declarations
        } else {
            Self::sorted_unique_names(declarations, &mut diagnostics)
        };
        // Usually every database is distinct: one pass over a set says so
        // without building and sorting every database name.
        let distinct = {
            let mut databases = std::collections::HashSet::with_capacity(declarations.len());
            declarations
                .iter()
                .all(|d| databases.insert(DatabaseKey(&d.manifest)))
        };
        if distinct {
            diagnostics.sort();
            return DeclarationSet {
                declarations,
                diagnostics,
                files: count,
            };
        }
        // Two declarations for one database (same provider, same database
        // name) would fight over it: an error on each, neither applied. A
        // declaration without spec.provider is routed to the only
        // configured provider, so it is the same database as one naming
        // any provider with that database name: whenever both can be
        // routed at all, the named provider is that only one. The check
        // needs no configuration, and `validate` and the agent agree.
        let keys: Vec<(String, Option<&str>)> = declarations
            .iter()
            .map(|d| {
                (
                    d.manifest.database_name(),
                    d.manifest.spec.provider.as_deref(),
                )
            })
            .collect();
        let mut by_database: Vec<usize> = (0..declarations.len()).collect();
        by_database.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
        let mut clashing: Vec<usize> = Vec::new();
        for group in by_database.chunk_by(|&a, &b| keys[a].0 == keys[b].0) {
            if group.len() < 2 {
                continue;
            }
            let database = &keys[group[0]].0;
            let same_database = |i: usize, j: usize| {
                i != j && (keys[i].1.is_none() || keys[j].1.is_none() || keys[i].1 == keys[j].1)
            };
            for &i in group {
                let decl = &declarations[i];
                let others: Vec<String> = group
                    .iter()
                    .filter(|&&j| same_database(i, j))
                    .map(|&j| {
                        format!(
                            "`{}` at {}:{}",
                            declarations[j].name(),
                            declarations[j].file.display(),
                            declarations[j].line
                        )
                    })
                    .collect();
                if others.is_empty() {
                    continue;
                }
                diagnostics.push(Diagnostic {
                    file: decl.file.clone(),
                    line: decl.line,
                    column: decl.column,
                    message: format!(
                        "database `{database}` is also declared by {}: two declarations would manage one database, so neither is applied; give each its own spec.databaseName",
                        others.join(", ")
                    ),
                });
                clashing.push(i);
            }
        }
        drop(keys);
        if !clashing.is_empty() {
            let mut index = 0;
            declarations.retain(|_| {
                let keep = !clashing.contains(&index);
                index += 1;
                keep
            });
        }
        diagnostics.sort();
        DeclarationSet {
            declarations,
            diagnostics,
            files: count,
        }
    }

    /// `declarations` sorted by name, without the names declared more than
    /// once: each of those copies gets an error in `diagnostics`.
    fn sorted_unique_names(
        declarations: Vec<Arc<Declaration>>,
        diagnostics: &mut Vec<Diagnostic>,
    ) -> Vec<Arc<Declaration>> {
        // Sorted through an index (thousands of declarations are not moved
        // around); runs of one name are duplicates. Each name's first 16
        // bytes are compared as one number before the names themselves:
        // at 100,000 declarations the sort chased two pointers per
        // comparison into declarations scattered over the heap.
        let mut order: Vec<(u128, &str, usize)> = declarations
            .iter()
            .enumerate()
            .map(|(i, d)| (name_prefix(d.name()), d.name(), i))
            .collect();
        order.sort_unstable();
        let mut unique = Vec::with_capacity(order.len());
        for group in order.chunk_by(|a, b| a.1 == b.1) {
            if let [(_, _, only)] = group {
                unique.push(*only);
                continue;
            }
            for &(_, _, i) in group {
                let decl = &declarations[i];
                let others: Vec<String> = group
                    .iter()
                    .filter(|&&(_, _, j)| j != i)
                    .map(|&(_, _, j)| {
                        format!(
                            "{}:{}",
                            declarations[j].file.display(),
                            declarations[j].line
                        )
                    })
                    .collect();
                diagnostics.push(Diagnostic {
                    file: decl.file.clone(),
                    line: decl.line,
                    column: decl.column,
                    message: format!(
                        "duplicate metadata.name `{}` (also at {}): names must be unique in the repository, so neither declaration is applied",
                        decl.name(),
                        others.join(", ")
                    ),
                });
            }
        }
        drop(order);
        let mut all: Vec<Option<Arc<Declaration>>> = declarations.into_iter().map(Some).collect();
        unique.into_iter().filter_map(|i| all[i].take()).collect()
    }
}

/// Loads files and directory trees (`*.yaml` and `*.yml`, hidden entries and
/// symlinked directories skipped). A path named explicitly is read whatever
/// its extension.
pub fn load_paths(paths: &[PathBuf]) -> DeclarationSet {
    load_paths_warning(paths).set
}

/// What [`load_paths_warning`] read, and what it skipped with a warning
/// (symbolic links; see [`super::tree`]).
#[derive(Debug)]
pub(crate) struct Loaded {
    pub set: DeclarationSet,
    pub warnings: Vec<String>,
}

/// Reads files and directories by the rules of [`super::tree`], the rules
/// the agent applies to a Git tree. A directory named as an argument is
/// read even through a symbolic link (the operator named it); a file is
/// not, as the agent would not read it.
pub(crate) fn load_paths_warning(paths: &[PathBuf]) -> Loaded {
    let mut files = Vec::new();
    let mut warnings = Vec::new();
    for path in paths {
        let mut found = Vec::new();
        match fs::metadata(path) {
            Ok(meta) if meta.is_dir() => walk(path, &mut found, &mut files, &mut warnings),
            Ok(_) if fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink()) => {
                warnings.push(super::tree::symlink_warning(path));
            }
            Ok(_) => found.push(path.clone()),
            Err(e) => files.push(io_failure(path, "cannot read", &e)),
        }
        found.sort();
        for file in found {
            files.push(read_file(&file));
        }
    }
    Loaded {
        set: DeclarationSet::from_files(files),
        warnings,
    }
}

fn io_failure(path: &Path, what: &str, e: &std::io::Error) -> FileContents {
    FileContents {
        declarations: Vec::new(),
        diagnostics: vec![Diagnostic {
            file: path.to_path_buf(),
            line: 1,
            column: 1,
            message: format!("{what}: {e}"),
        }],
    }
}

/// Lists the declaration files under `root` (iteratively: depth is
/// bounded, never the stack). Problems with an entry become that entry's
/// diagnostic in `problems`.
fn walk(
    root: &Path,
    found: &mut Vec<PathBuf>,
    problems: &mut Vec<FileContents>,
    warnings: &mut Vec<String>,
) {
    use std::os::unix::ffi::OsStrExt;
    let entry_problem = |file: PathBuf, message: String| FileContents {
        declarations: Vec::new(),
        diagnostics: vec![Diagnostic {
            file,
            line: 1,
            column: 1,
            message,
        }],
    };
    let mut dirs = vec![(root.to_path_buf(), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => {
                problems.push(entry_problem(dir, format!("cannot list directory: {e}")));
                continue;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.as_bytes();
            if super::tree::is_hidden(name) {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_symlink() {
                warnings.push(super::tree::symlink_warning(&path));
                continue;
            }
            let declaration_file = kind.is_file() && super::tree::is_yaml_name(name);
            if !(kind.is_dir() || declaration_file) {
                continue;
            }
            if std::str::from_utf8(name).is_err() {
                let shown = dir.join(super::tree::lossy_name(name));
                problems.push(entry_problem(shown, super::tree::NOT_UTF8.into()));
            } else if !kind.is_dir() {
                found.push(path);
            } else if depth >= super::tree::MAX_DEPTH {
                problems.push(entry_problem(path, super::tree::too_deep()));
            } else {
                dirs.push((path, depth + 1));
            }
        }
    }
}

fn read_file(path: &Path) -> FileContents {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return io_failure(path, "cannot open", &e),
    };
    // Read one byte past the limit so an oversized file is refused without
    // reading it all.
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return io_failure(path, "cannot read", &e);
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        let size = fs::metadata(path)
            .map(|m| m.len())
            .unwrap_or(bytes.len() as u64);
        return FileContents {
            declarations: Vec::new(),
            diagnostics: vec![Diagnostic {
                file: path.to_path_buf(),
                line: 1,
                column: 1,
                message: format!(
                    "file is {size} bytes, over the 1 MiB limit for a declaration file: split it into smaller files"
                ),
            }],
        };
    }
    parse_file(path, &bytes)
}
