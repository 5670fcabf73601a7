//! The canonical spec hash.
//!
//! Input: the normalised spec (defaults applied, extension list sorted)
//! serialised as JSON with map keys sorted (`serde_json`'s map is ordered) and
//! absent optional fields omitted, so adding an optional field in a later
//! version does not change the hash of specs that do not use it. Key order,
//! quoting, comments and formatting of the YAML cannot reach the hash.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use super::declaration::ManagedDatabase;

/// The sha256 of the canonical JSON of a normalised spec, written (in the
/// state, the parse cache, reports) as 64 lower-case hex digits.
///
/// Held as its 32 bytes: every declaration, every resource's memory and
/// every planned resource carries one, and as hex text each was a 64-byte
/// allocation beside its `String`. Text that is not such a digest (the
/// empty hash of a subject without a declaration, a test's label, a state
/// row this build did not write) is kept as it was read, so it reads back
/// and compares as the same text; a digest always takes the byte form, so
/// two hashes are equal exactly when their texts are.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpecHash(HashRepr);

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum HashRepr {
    Digest([u8; 32]),
    Text(Box<str>),
}

impl SpecHash {
    /// The hash whose digest is `digest`.
    pub(crate) fn of_digest(digest: [u8; 32]) -> Self {
        SpecHash(HashRepr::Digest(digest))
    }

    /// The hash written as `text`: a digest when `text` is 64 lower-case
    /// hex digits, otherwise the text itself.
    pub fn from_text(text: &str) -> Self {
        let lower = !text.bytes().any(|b| b.is_ascii_uppercase());
        match bytes_of_hex::<32>(text) {
            Some(digest) if lower => SpecHash(HashRepr::Digest(digest)),
            _ => SpecHash(HashRepr::Text(text.into())),
        }
    }

    /// The text of the hash (64 hex digits for a digest).
    pub fn to_text(&self) -> Cow<'_, str> {
        match &self.0 {
            HashRepr::Digest(digest) => Cow::Owned(hex(digest)),
            HashRepr::Text(text) => Cow::Borrowed(text),
        }
    }
}

impl From<&str> for SpecHash {
    fn from(text: &str) -> Self {
        Self::from_text(text)
    }
}

impl From<String> for SpecHash {
    fn from(text: String) -> Self {
        Self::from_text(&text)
    }
}

impl fmt::Display for SpecHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

impl fmt::Debug for SpecHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SpecHash").field(&self.to_text()).finish()
    }
}

impl Serialize for SpecHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_text())
    }
}

impl<'de> Deserialize<'de> for SpecHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Self::from_text(&text))
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

/// The sha256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Hex sha256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&sha256(bytes))
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
        SpecHash::of_digest(sha256(canonical_spec_json(self).as_bytes()))
    }

    /// The spec hash and the normalised spec it was computed from.
    pub fn spec_hash_and_value(&self) -> (SpecHash, serde_json::Value) {
        let value = normalized_spec_value(self);
        (
            SpecHash::of_digest(sha256(value.to_string().as_bytes())),
            value,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_hash_reads_back_as_the_text_it_was_written_as() -> Result<(), serde_json::Error> {
        let decl: ManagedDatabase = serde_norway::from_str(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: a\n",
        )
        .expect("a minimal declaration parses");
        let hash = decl.spec_hash();
        let text = hash.to_string();
        assert_eq!(text, sha256_hex(canonical_spec_json(&decl).as_bytes()));
        assert_eq!(SpecHash::from(text.as_str()), hash);
        assert!(matches!(hash.0, HashRepr::Digest(_)));
        assert_eq!(serde_json::to_string(&hash)?, format!("\"{text}\""));
        assert_eq!(
            serde_json::from_str::<SpecHash>(&format!("\"{text}\""))?,
            hash
        );
        // Anything else is kept as written: upper-case hex is not the
        // digest's text, so it is not equal to it.
        for other in ["", "h", &text[1..], &text.to_uppercase()] {
            let read = SpecHash::from(other);
            assert_eq!(read.to_string(), other);
            assert_ne!(read, hash);
        }
        Ok(())
    }

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
    fn a_parsed_declaration_s_database_name_is_the_manifest_s() {
        for (name, spec) in [
            ("a-b-c", ""),
            ("abc", "spec:\n  connectionLimit: 5\n"),
            ("a-b", "spec:\n  databaseName: custom\n"),
            ("x-y", "spec:\n  databaseName: \"007\"\n"),
        ] {
            let text = format!(
                "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\n{spec}"
            );
            let parsed = crate::model::parse_file(std::path::Path::new("db.yaml"), text.as_bytes());
            assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
            let decl = &parsed.declarations[0];
            assert_eq!(
                decl.database_name(),
                decl.manifest.database_name(),
                "{name}"
            );
            assert!(
                matches!(decl.database_name(), std::borrow::Cow::Borrowed(_)),
                "{name}: built, not borrowed from the normalised spec"
            );
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
