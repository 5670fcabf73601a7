//! A map of a few entries kept as one sorted vector of pairs.
//!
//! An observation holds two maps for every database of the fleet (its
//! fields and its labels, two to twenty entries each), and a provider's
//! whole listing is held while its cycle decides. A `BTreeMap` allocates a
//! node sized for eleven entries whatever it holds (about 600 bytes for
//! `String` keys), so two entries cost as much as eleven; here they cost
//! their own size. Lookups are a binary search, iteration is in key order
//! as a `BTreeMap`'s is, and it reads and writes as the same JSON object.
//!
//! Keys that every map of a fleet repeats (a spec field's name, a
//! `tend.dev/` label's) are borrowed from the binary ([`Key`]): a listing
//! of 10,000 databases read every cycle allocated four key strings for
//! each, to hold `connectionLimit` and `tend.dev/owner-agent` once more.

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A [`FlatMap`] key: text that compares, reads and writes as the string
/// it is, held without an allocation when it is one of the names
/// tend itself defines ([`known_key`]).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key(Cow<'static, str>);

/// The name `text` is, when tend defines it: a spec field, an ownership
/// marker label, or a `tend.dev/` annotation a provider label may carry.
fn known_key(text: &str) -> Option<&'static str> {
    if let Some(field) = super::fields::field_info(text) {
        return Some(field.name);
    }
    [
        super::observation::OWNER_AGENT_LABEL,
        super::observation::OWNER_DECLARATION_LABEL,
    ]
    .into_iter()
    .chain(super::overrides::KNOWN_ANNOTATIONS.iter().copied())
    .find(|known| *known == text)
}

impl Key {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Key {
    fn from(text: &str) -> Self {
        Key(match known_key(text) {
            Some(known) => Cow::Borrowed(known),
            None => Cow::Owned(text.to_owned()),
        })
    }
}

impl From<String> for Key {
    fn from(text: String) -> Self {
        Key(match known_key(&text) {
            Some(known) => Cow::Borrowed(known),
            None => Cow::Owned(text),
        })
    }
}

impl From<Key> for String {
    fn from(key: Key) -> Self {
        key.0.into_owned()
    }
}

impl Deref for Key {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Key {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl Visitor<'_> for KeyVisitor {
            type Value = Key;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            // A borrowed or transient string is looked up before anything
            // is allocated: a known key costs nothing.
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Key, E> {
                Ok(Key::from(text))
            }

            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Key, E> {
                Ok(Key::from(text))
            }
        }

        deserializer.deserialize_str(KeyVisitor)
    }
}

/// A map from string keys, sorted by key, each key once.
///
/// Invariant: `entries` is sorted by key with no key twice (every
/// constructor and mutator keeps it), so lookups may binary-search and
/// equality is that of the maps.
#[derive(Clone, PartialEq, Eq)]
pub struct FlatMap<V> {
    entries: Vec<(Key, V)>,
}

impl<V> Default for FlatMap<V> {
    fn default() -> Self {
        FlatMap::new()
    }
}

/// The iterator of [`FlatMap::iter`].
pub(crate) type Iter<'a, V> =
    std::iter::Map<std::slice::Iter<'a, (Key, V)>, fn(&'a (Key, V)) -> (&'a str, &'a V)>;

/// `entries` as a [`FlatMap::iter`] gives them.
fn pairs<V>(entries: &[(Key, V)]) -> Iter<'_, V> {
    fn pair_ref<V>(entry: &(Key, V)) -> (&str, &V) {
        (&entry.0, &entry.1)
    }
    entries.iter().map(pair_ref as fn(&(Key, V)) -> (&str, &V))
}

impl<V> FlatMap<V> {
    /// An empty map (allocates nothing).
    pub const fn new() -> Self {
        FlatMap {
            entries: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Where `key` is, or where it would go.
    fn position(&self, key: &str) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.position(key).ok().map(|at| &self.entries[at].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// Sets `key` to `value`; the value it had, if any.
    pub fn insert(&mut self, key: impl Into<Key>, value: V) -> Option<V> {
        let key = key.into();
        match self.position(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                self.entries.insert(at, (key, value));
                None
            }
        }
    }

    /// Takes `key` out; its value, if it had one.
    pub fn remove(&mut self, key: &str) -> Option<V> {
        self.position(key).ok().map(|at| self.entries.remove(at).1)
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The entries in key order.
    pub fn iter(&self) -> Iter<'_, V> {
        pairs(&self.entries)
    }

    /// The entries from `key` on (its own, if present, first), in key
    /// order: the entries of a prefix start there.
    pub fn iter_from(&self, key: &str) -> Iter<'_, V> {
        let at = self.position(key).unwrap_or_else(|at| at);
        pairs(&self.entries[at..])
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// From pairs in any order; of a key given twice, the last value.
    fn from_pairs(mut entries: Vec<(Key, V)>) -> Self {
        // A stable sort keeps a key's values in the order given; `dedup_by`
        // keeps the first of a run, so it takes each later value into it.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                std::mem::swap(&mut later.1, &mut kept.1);
            }
            same
        });
        entries.shrink_to_fit();
        FlatMap { entries }
    }
}

/// `map[key]`: the value of a key the caller knows is there (panics
/// otherwise, as a `BTreeMap`'s does).
impl<V> std::ops::Index<&str> for FlatMap<V> {
    type Output = V;

    fn index(&self, key: &str) -> &V {
        self.get(key).expect("no entry for the key in the map")
    }
}

impl<V, K: Into<Key>> FromIterator<(K, V)> for FlatMap<V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        FlatMap::from_pairs(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl<V, K: Into<Key>, const N: usize> From<[(K, V); N]> for FlatMap<V> {
    fn from(pairs: [(K, V); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl<V, K: Into<Key>> Extend<(K, V)> for FlatMap<V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, pairs: I) {
        for (k, v) in pairs {
            self.insert(k, v);
        }
    }
}

/// The same map as a `BTreeMap` (what the provider requests carry).
impl<V> From<FlatMap<V>> for std::collections::BTreeMap<String, V> {
    fn from(map: FlatMap<V>) -> Self {
        map.into_iter().map(|(k, v)| (String::from(k), v)).collect()
    }
}

impl<V> IntoIterator for FlatMap<V> {
    type Item = (Key, V);
    type IntoIter = std::vec::IntoIter<(Key, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a, V> IntoIterator for &'a FlatMap<V> {
    type Item = (&'a str, &'a V);
    type IntoIter = Iter<'a, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<V: fmt::Debug> fmt::Debug for FlatMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V: Serialize> Serialize for FlatMap<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for FlatMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs<V>(PhantomData<V>);

        impl<'de, V: Deserialize<'de>> Visitor<'de> for Pairs<V> {
            type Value = FlatMap<V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                // The hint is the sender's word: bounded, so a damaged one
                // cannot reserve memory the input does not fill.
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
                while let Some(pair) = map.next_entry::<Key, V>()? {
                    entries.push(pair);
                }
                Ok(FlatMap::from_pairs(entries))
            }
        }

        deserializer.deserialize_map(Pairs(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_a_sorted_map_with_the_last_value_of_a_key_given_twice() {
        let map: FlatMap<u32> = [
            ("b".to_string(), 1),
            ("a".to_string(), 2),
            ("b".to_string(), 3),
        ]
        .into();
        assert_eq!(map.len(), 2);
        assert_eq!(map.get("b"), Some(&3));
        assert_eq!(map.keys().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn insert_and_remove_keep_it_sorted() {
        let mut map = FlatMap::new();
        for key in ["m", "c", "x", "a"] {
            assert_eq!(map.insert(key.to_string(), key.len()), None);
        }
        assert_eq!(map.insert("c".to_string(), 9), Some(1));
        assert_eq!(map.remove("m"), Some(1));
        assert_eq!(map.remove("m"), None);
        let pairs: Vec<(&str, usize)> = map.iter().map(|(k, v)| (k, *v)).collect();
        assert_eq!(pairs, [("a", 1), ("c", 9), ("x", 1)]);
        assert!(map.contains_key("x") && !map.contains_key("m"));
    }

    #[test]
    fn it_reads_and_writes_as_the_json_object_a_btree_map_does() {
        let json = r#"{"z":1,"a":{"k":[2]},"z":3}"#;
        let flat: FlatMap<serde_json::Value> = serde_json::from_str(json).unwrap();
        let tree: std::collections::BTreeMap<String, serde_json::Value> =
            serde_json::from_str(json).unwrap();
        assert_eq!(
            serde_json::to_string(&flat).unwrap(),
            serde_json::to_string(&tree).unwrap()
        );
        assert_eq!(format!("{flat:?}"), format!("{tree:?}"));
    }

    #[test]
    fn keys_tend_defines_are_borrowed_and_others_owned() -> Result<(), serde_json::Error> {
        let json = r#"{"work_mem":"4MB","tend.dev/owner-agent":"a","connectionLimit":1}"#;
        let map: FlatMap<serde_json::Value> = serde_json::from_str(json)?;
        let borrowed: Vec<(&str, bool)> = map
            .entries
            .iter()
            .map(|(k, _)| (k.as_str(), matches!(k.0, Cow::Borrowed(_))))
            .collect();
        assert_eq!(
            borrowed,
            [
                ("connectionLimit", true),
                ("tend.dev/owner-agent", true),
                ("work_mem", false)
            ]
        );
        // Either way a key is the text it was read from.
        assert_eq!(Key::from("owner"), Key::from("owner".to_string()));
        assert_eq!(map.get("work_mem"), Some(&serde_json::json!("4MB")));
        Ok(())
    }
}
