//! The `metadata.name` an imported database's declaration gets.
//!
//! # The rule (docs/import.md states it for people)
//! 1. ASCII letters are lowercased; every run of other characters than
//!    `a-z` and `0-9` becomes one `-`; `-` at either end is dropped.
//! 2. The result is cut to 63 characters (and a `-` left at its end
//!    dropped again).
//! 3. Empty (a name of only other characters): `db`.
//! 4. When two databases of one import come out the same, each of them
//!    gets `-` and the first 8 hex digits of the SHA-256 of its database
//!    name (the part before is cut so the whole stays within 63).
//!
//! The result is always a lowercase DNS label of at most 63 characters,
//! so it always validates; the declaration carries `databaseName` when the
//! name with `-` as `_` is not the database's name.

use crate::model::hash::sha256_hex;

/// The longest `metadata.name`.
const MAX_NAME: usize = 63;

/// Rules 1-3: the name `database` derives.
pub(crate) fn derived(database: &str) -> String {
    let mut out = String::with_capacity(database.len().min(MAX_NAME));
    let mut gap = false;
    for c in database.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            if gap && !out.is_empty() {
                out.push('-');
            }
            gap = false;
            out.push(c);
        } else {
            gap = true;
        }
    }
    out.truncate(MAX_NAME);
    let out = out.trim_end_matches('-');
    if out.is_empty() {
        "db".to_string()
    } else {
        out.to_string()
    }
}

/// Rule 4: `base` told apart by the hash of `database`.
pub(crate) fn disambiguated(base: &str, database: &str) -> String {
    let hash = sha256_hex(database.as_bytes());
    let suffix = &hash[..8];
    let room = MAX_NAME - 1 - suffix.len();
    let head = base.get(..room.min(base.len())).unwrap_or(base);
    format!("{}-{suffix}", head.trim_end_matches('-'))
}

/// Whether a declaration named `name` needs `databaseName` to name
/// `database` (the default is `name` with `-` as `_`).
pub(crate) fn needs_database_name(name: &str, database: &str) -> bool {
    name.replace('-', "_") != database
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::validate::is_dns_label;

    #[test]
    fn names_follow_the_rule_and_always_validate() {
        assert_eq!(derived("orders"), "orders");
        assert_eq!(derived("orders_app"), "orders-app");
        assert!(!needs_database_name("orders-app", "orders_app"));
        assert_eq!(derived("Café Orders"), "caf-orders");
        assert!(needs_database_name("caf-orders", "Café Orders"));
        assert_eq!(derived("__x__y"), "x-y");
        assert_eq!(derived("2024_archive"), "2024-archive");
        assert_eq!(derived("ünïcødé ✓"), "n-c-d");
        assert_eq!(derived("✓✓"), "db");
        assert_eq!(derived(&"a_".repeat(40)).len(), 63);
        for weird in [
            "",
            "-",
            "a-",
            "✓",
            "A B C",
            "x'); DROP",
            &"Z".repeat(200),
            "a--b",
        ] {
            let name = derived(weird);
            assert!(is_dns_label(&name), "{weird:?} → {name:?}");
            let told = disambiguated(&name, weird);
            assert!(is_dns_label(&told), "{weird:?} → {told:?}");
        }
        assert_eq!(disambiguated("orders", "Orders").len(), "orders-".len() + 8);
        assert_ne!(
            disambiguated("orders", "Orders"),
            disambiguated("orders", "ORDERS")
        );
        assert_eq!(disambiguated(&"a".repeat(63), "x").len(), 63);
    }
}
