//! Deserializers for bounded configuration values. A value outside its
//! bounds is refused where it is written (toml reports the line and the
//! key), never clamped: a silent `max_concurrency = 0 → 1` hides a typo.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration like `10m`, at most [`crate::time::MAX_DURATION`].
pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    let parsed = humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!("`{text}` is not a duration like \"10m\" ({e})"))
    })?;
    crate::time::check_duration(&text, parsed).map_err(serde::de::Error::custom)
}

/// `max_concurrency`: at least 1, at most 1,024.
pub(super) fn concurrency<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    bounded(d, "max_concurrency", 1, 1024, "concurrent operations")
}

/// `parallel_cycles`: at least 1, at most 1,024.
pub(super) fn parallel_cycles<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    bounded(d, "parallel_cycles", 1, 1024, "whole cycles at once")
}

/// `rate_limit` (calls per second): at least 1, at most 10,000.
pub(super) fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    bounded(d, "rate_limit", 1, 10_000, "calls per second").map(|v| v as u32)
}

/// The key is named in the message: inside a `[providers.NAME]` table
/// toml can only point at the table, not at the key.
fn bounded<'de, D: Deserializer<'de>>(
    d: D,
    key: &str,
    min: u64,
    max: u64,
    what: &str,
) -> Result<usize, D::Error> {
    let value = i64::deserialize(d)?;
    if value < min as i64 || value > max as i64 {
        return Err(serde::de::Error::custom(format!(
            "{key} = {value} is out of range: give {min} to {max} {what}"
        )));
    }
    Ok(value as usize)
}

/// Whether git accepts `refs/heads/{name}` as a reference name (and the
/// name does not start with `-`, which git's commands would read as an
/// option). A name of letters, digits, `-` and `_` alone (`main`,
/// `tend-status`) breaks none of git's rules, so it is accepted without
/// asking libgit2: asking waits for libgit2's initialisation (OpenSSL
/// loading the system's trusted roots, tens of milliseconds), which a
/// one-shot command otherwise runs beside its start. Any other name is
/// libgit2's to judge.
pub(super) fn is_branch_name(name: &str) -> bool {
    // `HEAD` as a branch makes `refs/heads/HEAD`, which git then reads
    // ambiguously against the remote's own HEAD.
    if name.is_empty() || name.starts_with('-') || name == "HEAD" {
        return false;
    }
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    plain || git2::Reference::is_valid_name(&format!("refs/heads/{name}"))
}

/// A branch name git accepts (`refs/heads/NAME` is a valid reference
/// name): `*`, `a..b` or `-x` are refused here, not reported later as a
/// missing branch.
pub(super) fn branch<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    if !is_branch_name(&name) {
        return Err(serde::de::Error::custom(format!(
            "branch = {:?} is not a branch name git accepts (no spaces, `..`, `*`, `?`, `[`, `~`, `^`, `:` or `\\`, no leading `-` or `/`, no `.lock` at the end): give the branch as `git branch` shows it",
            name
        )));
    }
    Ok(name)
}

/// `[status] branch`: a branch name git accepts, or empty (no status
/// branch).
pub(super) fn status_branch<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    if name.is_empty() {
        return Ok(name);
    }
    if !is_branch_name(&name) {
        return Err(serde::de::Error::custom(format!(
            "[status] branch = {name:?} is not a branch name git accepts: give a name like \"tend-status\", or \"\" for no status branch"
        )));
    }
    Ok(name)
}

/// The declarations directory inside the repository, normalised:
/// `./databases/`, `/databases` and `databases` are one path; `.` (or
/// empty) is the root. A `..` component would leave the repository and is
/// refused.
pub(super) fn repo_path<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let text = String::deserialize(d)?;
    normalise_repo_path(&text).map_err(serde::de::Error::custom)
}

pub(super) fn normalise_repo_path(text: &str) -> Result<String, String> {
    let mut parts = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(format!(
                    "path = {text:?} leaves the repository (`..`): give the directory from the repository's root, like \"databases\""
                ));
            }
            part => parts.push(part),
        }
    }
    Ok(if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_paths_are_normalised_and_never_leave_the_repository() {
        for (given, expect) in [
            ("./databases", "databases"),
            ("/databases/", "databases"),
            ("databases//team-a/./x", "databases/team-a/x"),
            ("", "."),
            ("./", "."),
        ] {
            assert_eq!(normalise_repo_path(given).as_deref(), Ok(expect), "{given}");
        }
        assert!(normalise_repo_path("../etc").is_err());
        assert!(normalise_repo_path("a/../../b").is_err());
    }

    #[test]
    fn branch_names_outside_the_plain_alphabet_are_libgit2s_to_judge() {
        for good in ["main", "tend-status", "release/1.2", "v1.0", "user@host"] {
            assert!(is_branch_name(good), "{good}");
        }
        for bad in [
            "", "-x", "a..b", "*", "a b", "x.lock", ".hidden", "a/", "a@{1}",
        ] {
            assert!(!is_branch_name(bad), "{bad}");
        }
    }

    proptest::proptest! {
        /// The shortcut accepts only names libgit2 accepts too.
        #[test]
        fn a_plain_name_is_one_libgit2_accepts(name in "[A-Za-z0-9_][A-Za-z0-9_-]{0,40}") {
            let full = format!("refs/heads/{name}");
            proptest::prop_assert!(is_branch_name(&name));
            proptest::prop_assert!(git2::Reference::is_valid_name(&full));
        }
    }
}
