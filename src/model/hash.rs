//! The canonical spec hash.
//!
//! Input: the normalised spec (defaults applied, extension list sorted)
//! serialised as JSON with map keys sorted (`serde_json`'s map is ordered) and
//! absent optional fields omitted, so adding an optional field in a later
//! version does not change the hash of specs that do not use it. Key order,
//! quoting, comments and formatting of the YAML cannot reach the hash.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::declaration::ManagedDatabase;

/// Hex sha256 of the canonical JSON of a normalised spec.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SpecHash(pub String);

impl fmt::Display for SpecHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lower-case hex of a byte string (sha2 0.11 digests have no `LowerHex`).
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

/// [`hex`], appended to `out` (a file of thousands of digests writes them
/// without a string each, nor a formatter call per byte).
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
}

/// The `N` bytes `text` spells in hex (either case); `None` for any other
/// length or character.
pub(crate) fn bytes_of_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut bytes = [0; N];
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(bytes)
}

/// Hex sha256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The canonical JSON text of a declaration's normalised spec.
pub(crate) fn canonical_spec_json(decl: &ManagedDatabase) -> String {
    normalized_spec_value(decl).to_string()
}

/// The normalised spec as a JSON value (sorted keys, absent fields omitted).
pub(crate) fn normalized_spec_value(decl: &ManagedDatabase) -> serde_json::Value {
    const SERIALISES: &str =
        "a Spec always serialises: it has only strings, numbers, bools and string-keyed maps";
    // Without copying the spec first when only the default database name
    // is missing (the usual case): the map's keys are sorted, so adding it
    // afterwards gives the same value as serialising the normalised spec.
    let in_order = decl.spec.extensions.as_ref().is_none_or(|e| e.is_sorted());
    if !in_order {
        return serde_json::to_value(decl.normalized_spec()).expect(SERIALISES);
    }
    let mut value = serde_json::to_value(&decl.spec).expect(SERIALISES);
    if decl.spec.database_name.is_none()
        && let Some(map) = value.as_object_mut()
    {
        map.insert(
            "databaseName".to_string(),
            serde_json::Value::String(decl.database_name()),
        );
    }
    value
}

impl ManagedDatabase {
    /// See the module docs.
    pub fn spec_hash(&self) -> SpecHash {
        SpecHash(sha256_hex(canonical_spec_json(self).as_bytes()))
    }

    /// The spec hash and the normalised spec it was computed from.
    pub fn spec_hash_and_value(&self) -> (SpecHash, serde_json::Value) {
        let value = normalized_spec_value(self);
        (SpecHash(sha256_hex(value.to_string().as_bytes())), value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_normalised_value_equals_the_normalised_spec_serialised() {
        for spec in [
            "owner: app",
            "databaseName: custom\n  owner: app",
            "extensions: [pg_trgm, btree_gin]",
            "extensions: [btree_gin, {name: postgis, version: \"3\"}]\n  parameters: {work_mem: 4MB}",
        ] {
            let text = format!(
                "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: a-b\nspec:\n  {spec}\n"
            );
            let decl: ManagedDatabase = serde_norway::from_str(&text).unwrap();
            assert_eq!(
                normalized_spec_value(&decl),
                serde_json::to_value(decl.normalized_spec()).unwrap(),
                "{spec}"
            );
        }
    }

    #[test]
    fn is_database_name_agrees_with_database_name() {
        let with = |name: &str, explicit: &str| -> ManagedDatabase {
            let spec = if explicit.is_empty() {
                String::new()
            } else {
                format!("spec:\n  databaseName: {explicit}\n")
            };
            serde_norway::from_str(&format!(
                "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\n{spec}"
            ))
            .unwrap()
        };
        for (decl, candidates) in [
            (with("a-b-c", ""), ["a_b_c", "a-b-c", "a_b_", "a_b_cd"]),
            (with("abc", ""), ["abc", "ab", "abd", "ABC"]),
            (with("a-b", "custom"), ["custom", "a_b", "a-b", "custo"]),
        ] {
            for candidate in candidates {
                assert_eq!(
                    decl.is_database_name(candidate),
                    decl.database_name() == candidate,
                    "{} vs {candidate}",
                    decl.metadata.name
                );
            }
        }
    }

    #[test]
    fn hex_decodes_what_it_encodes_and_nothing_else() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff];
        assert_eq!(bytes_of_hex::<4>(&hex(&bytes)), Some(bytes));
        assert_eq!(bytes_of_hex::<4>("000FA5FF"), Some(bytes));
        assert_eq!(bytes_of_hex::<4>("000fa5f"), None, "a digit short");
        assert_eq!(bytes_of_hex::<4>("000fa5fg"), None, "not hex");
        assert_eq!(bytes_of_hex::<4>("000fa5é"), None, "not ASCII");
    }

    #[test]
    fn hex_encodes_every_nibble() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
