//! Which entries of a directory tree are declaration files: one set of
//! rules for a Git tree (the agent) and a directory on disk (`tend
//! validate`), so the two never disagree about what a repository declares.
//!
//! * Entries whose name starts with `.` are skipped, with what is below.
//! * Files named `*.yaml` or `*.yml` are declaration files.
//! * Symbolic links are never followed (a link can point anywhere, even
//!   outside the repository): skipped, with a warning.
//! * A name that is not UTF-8 cannot be named in a report: an error for
//!   that entry, never silently dropped.
//! * Directories nested deeper than [`MAX_DEPTH`] below the declarations
//!   path are not read: an error for that subtree only. (Unbounded depth
//!   is how a hostile commit exhausts the stack or memory of the reader.)

use std::path::Path;

/// How many directory levels below the declarations path are read.
pub(crate) const MAX_DEPTH: usize = 32;

/// Whether a file name (its bytes) is a declaration file's.
pub(crate) fn is_yaml_name(name: &[u8]) -> bool {
    name.ends_with(b".yaml") || name.ends_with(b".yml")
}

/// Whether an entry is skipped without a word.
pub(crate) fn is_hidden(name: &[u8]) -> bool {
    name.starts_with(b".")
}

/// The message for an entry whose name is not UTF-8.
pub(crate) const NOT_UTF8: &str = "the name is not valid UTF-8, so tend cannot name it in reports: rename it (nothing in it is read)";

/// The message for a subtree nested too deep.
pub(crate) fn too_deep() -> String {
    format!(
        "directories are nested more than {MAX_DEPTH} levels deep here: nothing below is read; flatten the layout"
    )
}

/// The warning for a symbolic link.
pub(crate) fn symlink_warning(path: &Path) -> String {
    format!(
        "{}: a symbolic link; tend never reads declarations through one (the agent skips it too)",
        crate::escape::terminal(&path.display().to_string())
    )
}

/// A name as reports show it: invalid bytes written as `\xNN`.
pub(crate) fn lossy_name(name: &[u8]) -> String {
    let mut out = String::new();
    for chunk in name.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}
