//! The status branch's render digests, kept in the state dir between
//! processes (`status-inputs`): the next process (`tend apply` from a
//! timer, a restarted agent) renders only the resources whose inputs
//! changed since the commit they were rendered for, not every file.
//!
//! # Invariants
//! * Only a cache: a missing, unreadable or damaged file, one written by
//!   another build of tend (whose files may render differently), or one
//!   for another commit than the branch's tip, is ignored, and every file
//!   is rendered.
//! * A digest is the render's own ([`super::branch_files::InputsDigest`]):
//!   a damaged one matches no resource's inputs, so its file is rendered.
//! * The file is replaced atomically, so a crash leaves the old digests
//!   (for an older commit: ignored) or the new ones.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::branch_files::InputsDigest;

/// What the first line starts with (bumped when the layout changes).
const MAGIC: &str = "tend-status-inputs 1";

/// The file in the state dir.
pub(crate) fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("status-inputs")
}

/// The commit the digests were rendered for, and each resource's digest;
/// `None` when the file is missing, damaged or another build's.
pub(crate) fn load(file: &Path) -> Option<(String, HashMap<String, InputsDigest>)> {
    let text = std::fs::read_to_string(file).ok()?;
    let mut lines = text.lines();
    let header = lines.next()?.strip_prefix(MAGIC)?.strip_prefix(' ')?;
    let (commit, build) = header.split_once(' ')?;
    if build != crate::source::parse_cache::build_id() {
        return None;
    }
    let mut inputs = HashMap::new();
    for line in lines {
        let (hex, name) = line.split_once(' ')?;
        inputs.insert(name.to_string(), digest(hex)?);
    }
    Some((commit.to_string(), inputs))
}

/// Writes the digests rendered for `commit`. Digests with a name that
/// would not fit one line (a damaged state's) are not kept at all, and the
/// file goes: over the commit, the next render names only what changed,
/// and a resource the file left out would never have its file removed.
pub(crate) fn store(
    file: &Path,
    commit: &str,
    inputs: &HashMap<String, InputsDigest>,
) -> std::io::Result<()> {
    if inputs.keys().any(|name| name.contains(['\n', '\r'])) {
        return match std::fs::remove_file(file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let build = crate::source::parse_cache::build_id();
    let mut text = String::with_capacity(inputs.len() * 96);
    let _ = writeln!(text, "{MAGIC} {commit} {build}");
    for (name, digest) in inputs {
        for byte in digest {
            let _ = write!(text, "{byte:02x}");
        }
        let _ = writeln!(text, " {name}");
    }
    super::files::write_atomically(file, text.as_bytes())
}

/// 32 bytes from 64 hexadecimal digits.
fn digest(hex: &str) -> Option<InputsDigest> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Outcome = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn digests_come_back_as_written_and_a_damaged_file_reads_as_none() -> Outcome {
        let dir = tempfile::tempdir()?;
        let file = path(dir.path());
        assert!(load(&file).is_none(), "no file");
        let inputs: HashMap<String, InputsDigest> = [
            ("orders".to_string(), [7u8; 32]),
            ("billing".to_string(), [255u8; 32]),
        ]
        .into();
        store(&file, "c0ffee", &inputs)?;
        assert_eq!(load(&file), Some(("c0ffee".to_string(), inputs)));

        let text = std::fs::read_to_string(&file)?;
        for damaged in [
            text.replacen("tend-status-inputs 1", "tend-status-inputs 2", 1),
            text.replacen(crate::source::parse_cache::build_id(), "0.0.1 1 1", 1),
            text.replacen(" orders", "orders", 1),
            text.replacen("07", "zz", 1),
        ] {
            std::fs::write(&file, damaged)?;
            assert_eq!(load(&file), None);
        }
        Ok(())
    }

    #[test]
    fn digests_with_a_name_that_does_not_fit_a_line_are_not_kept() -> Outcome {
        let dir = tempfile::tempdir()?;
        let file = path(dir.path());
        let fine: HashMap<String, InputsDigest> = [("orders".to_string(), [7u8; 32])].into();
        store(&file, "c0ffee", &fine)?;
        // Left out, its file would never be removed over the commit.
        let mut damaged = fine.clone();
        damaged.insert("a\nb".to_string(), [1u8; 32]);
        store(&file, "c0ffee", &damaged)?;
        assert_eq!(load(&file), None, "kept without one of its resources");
        assert!(!file.exists());
        Ok(())
    }
}
