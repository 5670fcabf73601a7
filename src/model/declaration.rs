//! The `ManagedDatabase` declaration as it is written in Git.
//!
//! These types mirror the YAML exactly (`deny_unknown_fields` everywhere) so a
//! typo is an error with a position, never a silently ignored field. Semantic
//! rules that serde cannot express live in [`super::validate`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The only `apiVersion` this build understands.
pub(crate) const API_VERSION: &str = "tend.dev/v1alpha1";
/// The only `kind` this build understands.
pub(crate) const KIND: &str = "ManagedDatabase";

/// One `ManagedDatabase` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "ManagedDatabase")]
pub struct ManagedDatabase {
    /// Always `tend.dev/v1alpha1`.
    #[serde(deserialize_with = "api_version")]
    pub api_version: Cow<'static, str>,
    /// Always `ManagedDatabase`.
    #[serde(deserialize_with = "kind")]
    pub kind: Cow<'static, str>,
    pub metadata: Metadata,
    /// The desired state. Absent fields are not managed (except the policies,
    /// which have defaults).
    #[serde(default)]
    pub spec: Spec,
}

/// `apiVersion` as read: the only one this build understands borrowed
/// (every declaration of a fleet names it: no string of its own each),
/// anything else kept for validation to refuse.
fn api_version<'de, D: Deserializer<'de>>(d: D) -> Result<Cow<'static, str>, D::Error> {
    known_or_owned(d, API_VERSION)
}

/// `kind` as read, as [`api_version`] reads `apiVersion`.
fn kind<'de, D: Deserializer<'de>>(d: D) -> Result<Cow<'static, str>, D::Error> {
    known_or_owned(d, KIND)
}

fn known_or_owned<'de, D: Deserializer<'de>>(
    d: D,
    known: &'static str,
) -> Result<Cow<'static, str>, D::Error> {
    let read = String::deserialize(d)?;
    Ok(if read == known {
        Cow::Borrowed(known)
    } else {
        Cow::Owned(read)
    })
}

/// Identity and annotations of a declaration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metadata {
    /// Unique in the repository: a lowercase DNS label of at most 63 characters.
    pub name: String,
    /// Free-form labels for people and tools reading the repository:
    /// they stay in Git (not sent to a provider); `tend.dev/` keys are
    /// refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, ScalarString>,
    /// Free-form annotations; `tend.dev/*` keys are overrides and must be known.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, ScalarString>,
}

// Its strings are `Box<str>`, not `String`: every declaration is held for
// as long as its commit is the agent's, and a spec's ten optional strings
// take 16 bytes each that way instead of 24, set or not. (A plain comment:
// the doc comment below is the schema's description.)
/// The desired state of one database.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    /// Name of a configured provider; may be omitted when only one is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Box<str>>,
    /// Name of the database at the provider (default: `metadata.name` with `-` as `_`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_name: Option<Box<str>>,
    /// Role that owns the database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Box<str>>,
    /// Character encoding, e.g. `UTF8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Box<str>>,
    /// Collation and ctype locale, e.g. `en_US.UTF-8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale: Option<Box<str>>,
    /// Template database used when the database is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Box<str>>,
    /// Maximum concurrent connections; -1 means no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1, max = 2147483647))]
    pub connection_limit: Option<i64>,
    /// Whether new connections are accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_connections: Option<bool>,
    /// Extensions to create in the database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<Extension>>,
    /// Per-database settings (`ALTER DATABASE … SET`), e.g. `work_mem: 64MB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, ScalarString>>,
    /// Comment on the database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<Box<str>>,
    /// DBaaS: database engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Engine>,
    /// DBaaS: engine version, e.g. `16`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<Box<str>>,
    /// DBaaS: size tier, e.g. `db-small`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Box<str>>,
    /// DBaaS: allocated storage in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub storage_gb: Option<i64>,
    /// DBaaS: run a standby in another zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<bool>,
    /// DBaaS: days of backups kept (0–35).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 35))]
    pub backup_retention_days: Option<i64>,
    /// DBaaS: region the database lives in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Box<str>>,
    /// What removing the declaration from Git does.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Whether out-of-band drift is corrected or only reported.
    #[serde(default)]
    pub drift_policy: DriftPolicy,
}

/// A DBaaS engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Postgres,
    Mysql,
}

/// What removing a declaration from Git does (docs/apply.md, "Removed declarations").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DeletionPolicy {
    /// Release ownership and leave the database in place.
    #[default]
    Retain,
    /// Delete the database, under the deletion guards.
    Delete,
}

/// Whether out-of-band drift is corrected (docs/reports.md, drift origin).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DriftPolicy {
    /// Correct out-of-band drift after `drift_grace`.
    #[default]
    Correct,
    /// Only report drift; never correct it.
    Report,
}

/// An extension: written as a bare name or as `{name, version, schema}`,
/// always held (and hashed) in the object form.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(inline)]
pub struct ExtensionFields {
    /// Extension name, e.g. `pg_trgm`.
    pub name: String,
    /// Version to install (default: the server's default version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Schema to install into (default: the server's choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
}

/// See [`ExtensionFields`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, JsonSchema)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct Extension(#[schemars(with = "ExtensionSchema")] pub ExtensionFields);

/// Schema-only type: the two spellings of an extension.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum ExtensionSchema {
    Name(String),
    Full(ExtensionFields),
}

impl<'de> Deserialize<'de> for Extension {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ExtensionVisitor;
        impl<'de> Visitor<'de> for ExtensionVisitor {
            type Value = Extension;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an extension name or a mapping {name, version, schema}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Extension, E> {
                Ok(Extension(ExtensionFields {
                    name: v.to_owned(),
                    version: None,
                    schema: None,
                }))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Extension, A::Error> {
                ExtensionFields::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(Extension)
            }
        }
        deserializer.deserialize_any(ExtensionVisitor)
    }
}

/// A string that may be written unquoted as a number or boolean
/// (`work_mem: 64MB`, `max_parallel_workers: 4`, `tend.dev/paused: true`):
/// YAML's typing of unquoted scalars must not turn into a type error for
/// values that are strings to PostgreSQL and to tend.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, JsonSchema)]
#[schemars(with = "ScalarStringSchema")]
pub struct ScalarString(pub String);

#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum ScalarStringSchema {
    Text(String),
    Number(f64),
    Flag(bool),
}

impl ScalarString {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ScalarString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ScalarString {
    fn from(s: &str) -> Self {
        ScalarString(s.to_owned())
    }
}

impl Serialize for ScalarString {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ScalarString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        impl Visitor<'_> for ScalarVisitor {
            type Value = ScalarString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string (quote it: \"...\")")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ScalarString, E> {
                Ok(ScalarString(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<ScalarString, E> {
                Ok(ScalarString(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ScalarString, E> {
                Ok(ScalarString(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ScalarString, E> {
                Ok(ScalarString(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ScalarString, E> {
                Ok(ScalarString(v.to_string()))
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}

impl ManagedDatabase {
    /// The database name at the provider: `spec.databaseName`, or
    /// `metadata.name` with `-` turned into `_`.
    pub fn database_name(&self) -> String {
        match &self.spec.database_name {
            Some(name) => name.to_string(),
            None => self.metadata.name.replace('-', "_"),
        }
    }

    /// The bytes of [`Self::database_name`], without building it (a cycle
    /// compares thousands of database names).
    pub fn database_name_bytes(&self) -> impl Iterator<Item = u8> + '_ {
        let (name, derived) = match &self.spec.database_name {
            Some(name) => (&**name, false),
            None => (self.metadata.name.as_str(), true),
        };
        name.bytes()
            .map(move |b| if derived && b == b'-' { b'_' } else { b })
    }

    /// Whether [`Self::database_name`] is `name`, without building it.
    pub fn is_database_name(&self, name: &str) -> bool {
        self.database_name_bytes().eq(name.bytes())
    }

    /// The spec with defaults applied and lists in canonical order: the input
    /// of the spec hash and what the planner compares against.
    pub fn normalized_spec(&self) -> Spec {
        let mut spec = self.spec.clone();
        spec.database_name = Some(self.database_name().into());
        if let Some(extensions) = spec.extensions.as_mut() {
            extensions.sort();
        }
        spec
    }

    /// Annotation value by key.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.get(key).map(ScalarString::as_str)
    }
}
