//! What the checks send, chosen from the server's own capabilities: a
//! create carries only fields the server lists, the field a `PATCH`
//! changes is one it lists as mutable, the immutability check uses one it
//! lists as immutable, and the unknown-field check a name it does not
//! list.

use serde_json::{Value, json};

use super::super::wire::CapabilitiesDoc;

/// A field the checks can use, and its two values.
type Candidate = (&'static str, fn() -> (Value, Value));

/// Mutable fields the checks can change, in order of preference, with two
/// values each.
const MUTABLE: &[Candidate] = &[
    ("comment", || (json!("tend check a"), json!("tend check b"))),
    ("size", || (json!("db-small"), json!("db-medium"))),
    ("connectionLimit", || (json!(10), json!(20))),
    ("storageGb", || (json!(10), json!(20))),
    ("owner", || (json!("tend_check_a"), json!("tend_check_b"))),
];

/// Immutable fields the checks can try to change, with a created value and
/// another (`engine` takes the server's first engine).
const IMMUTABLE: &[Candidate] = &[
    ("region", || {
        (json!("check-region-a"), json!("check-region-b"))
    }),
    ("encoding", || (json!("UTF8"), json!("LATIN1"))),
    ("locale", || (json!("C"), json!("POSIX"))),
];

/// The fields the checks use against one server.
#[derive(Debug, Clone, Default)]
pub(super) struct Probe {
    /// A mutable field and its created and changed values.
    pub mutable: Option<(String, Value, Value)>,
    /// An immutable field and its created and attempted values.
    pub immutable: Option<(String, Value, Value)>,
    /// Fields a create must carry besides those (the engine, when the
    /// server manages one).
    pub required: Vec<(String, Value)>,
    /// A field name the server does not manage.
    pub unknown: String,
}

impl Probe {
    pub(super) fn from_capabilities(doc: &CapabilitiesDoc) -> Self {
        let mutability = |name: &str| doc.fields.get(name).map(String::as_str);
        let mutable = MUTABLE
            .iter()
            .find(|(name, _)| mutability(name) == Some("mutable"))
            .map(|(name, values)| {
                let (a, b) = values();
                (name.to_string(), a, b)
            });
        let engines = &doc.engines;
        let immutable = match mutability("engine") {
            Some("immutable") if engines.len() >= 2 => {
                Some(("engine".to_string(), json!(engines[0]), json!(engines[1])))
            }
            _ => IMMUTABLE
                .iter()
                .find(|(name, _)| mutability(name) == Some("immutable"))
                .map(|(name, values)| {
                    let (a, b) = values();
                    (name.to_string(), a, b)
                }),
        };
        let required = match (mutability("engine"), engines.first()) {
            (Some(_), Some(engine)) if immutable.as_ref().is_none_or(|i| i.0 != "engine") => {
                vec![("engine".to_string(), json!(engine))]
            }
            _ => Vec::new(),
        };
        Probe {
            mutable,
            immutable,
            required,
            unknown: "tendCheckUnknownField".into(),
        }
    }

    /// A create's fields: the required ones, the mutable field's first
    /// value and the immutable field's.
    pub(super) fn create_fields(&self) -> Value {
        let mut fields = serde_json::Map::new();
        for (name, value) in &self.required {
            fields.insert(name.clone(), value.clone());
        }
        if let Some((name, a, _)) = &self.mutable {
            fields.insert(name.clone(), a.clone());
        }
        if let Some((name, a, _)) = &self.immutable {
            fields.insert(name.clone(), a.clone());
        }
        Value::Object(fields)
    }

    /// The same create with the mutable field's other value (a different
    /// request under the same key); `None` without a mutable field.
    pub(super) fn other_create_fields(&self) -> Option<Value> {
        let (name, _, b) = self.mutable.as_ref()?;
        let mut fields = self.create_fields();
        fields[name.as_str()] = b.clone();
        Some(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(fields: &[(&str, &str)], engines: &[&str]) -> CapabilitiesDoc {
        CapabilitiesDoc {
            version: "v1".into(),
            engines: engines.iter().map(|e| e.to_string()).collect(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            labels: true,
        }
    }

    #[test]
    fn the_probe_sends_only_what_the_server_lists() {
        let small = Probe::from_capabilities(&doc(
            &[
                ("owner", "mutable"),
                ("comment", "mutable"),
                ("connectionLimit", "mutable"),
                ("parameters", "mutable"),
            ],
            &[],
        ));
        assert_eq!(small.create_fields(), json!({"comment": "tend check a"}));
        assert!(small.immutable.is_none());
        let full = Probe::from_capabilities(&doc(
            &[
                ("engine", "immutable"),
                ("size", "mutable"),
                ("region", "immutable"),
            ],
            &["postgres", "mysql"],
        ));
        assert_eq!(
            full.create_fields(),
            json!({"engine": "postgres", "size": "db-small"})
        );
        assert_eq!(full.immutable.unwrap().2, json!("mysql"));
    }
}
