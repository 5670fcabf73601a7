//! The one table of declaration fields.
//!
//! The planner (what is compared and what may be changed in place), the
//! validator (`tend.dev/ignore-fields` only takes mutable fields), the JSON
//! Schema (`x-tend-mutability`) and `docs/declarations.md` (checked by a test)
//! all read this table, so a field's mutability is stated exactly once.

use serde::Serialize;

/// How tend may treat a difference between the declared and observed value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mutability {
    /// Corrected in place at the provider.
    Mutable,
    /// Fixed at creation; a later difference is `Blocked: requires replacement`,
    /// never a silent drop and recreate.
    Immutable,
    /// Used when the database is created and never observed afterwards.
    CreateOnly,
    /// Steers tend itself; never sent to or observed at a provider.
    Behaviour,
}

impl Mutability {
    pub fn as_str(self) -> &'static str {
        match self {
            Mutability::Mutable => "mutable",
            Mutability::Immutable => "immutable",
            Mutability::CreateOnly => "create-only",
            Mutability::Behaviour => "behaviour",
        }
    }
}

/// Which kinds of provider understand a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Every provider.
    Any,
    /// Database servers: the `postgres` provider and the sandbox.
    Server,
    /// DBaaS providers reached over HTTP, and the sandbox.
    Dbaas,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Any => "any",
            Scope::Server => "server",
            Scope::Dbaas => "dbaas",
        }
    }
}

/// One field of `spec`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FieldInfo {
    /// The camelCase name under `spec`.
    pub name: &'static str,
    pub mutability: Mutability,
    pub scope: Scope,
    /// Human-readable type, as the docs show it.
    pub value_type: &'static str,
    /// The default when the field is absent (`-`: nothing is managed).
    pub default: &'static str,
}

const fn field(
    name: &'static str,
    mutability: Mutability,
    scope: Scope,
    value_type: &'static str,
    default: &'static str,
) -> FieldInfo {
    FieldInfo {
        name,
        mutability,
        scope,
        value_type,
        default,
    }
}

use Mutability::*;
use Scope::*;

/// Every field of `spec`, in the order the docs list them.
pub const FIELDS: &[FieldInfo] = &[
    field(
        "provider",
        Immutable,
        Any,
        "string",
        "the only configured provider",
    ),
    field(
        "databaseName",
        Immutable,
        Any,
        "string",
        "metadata.name with - as _",
    ),
    field("owner", Mutable, Server, "string", "-"),
    field("encoding", Immutable, Server, "string", "-"),
    field("locale", Immutable, Server, "string", "-"),
    field("template", CreateOnly, Server, "string", "-"),
    field("connectionLimit", Mutable, Server, "integer >= -1", "-"),
    field("allowConnections", Mutable, Server, "boolean", "-"),
    field(
        "extensions",
        Mutable,
        Server,
        "list of name or {name, version, schema}",
        "-",
    ),
    field(
        "parameters",
        Mutable,
        Server,
        "map of string to string",
        "-",
    ),
    field("comment", Mutable, Any, "string", "-"),
    field("engine", Immutable, Dbaas, "postgres | mysql", "-"),
    field("version", Mutable, Dbaas, "string", "-"),
    field("size", Mutable, Dbaas, "string", "-"),
    field("storageGb", Mutable, Dbaas, "integer > 0", "-"),
    field("highAvailability", Mutable, Dbaas, "boolean", "-"),
    field("backupRetentionDays", Mutable, Dbaas, "integer 0..=35", "-"),
    field("region", Immutable, Dbaas, "string", "-"),
    field(
        "deletionPolicy",
        Behaviour,
        Any,
        "Retain | Delete",
        "Retain",
    ),
    field("driftPolicy", Behaviour, Any, "Correct | Report", "Correct"),
];

/// Looks a top-level spec field up by its camelCase name.
pub(crate) fn field_info(name: &str) -> Option<&'static FieldInfo> {
    field_index(name).map(|i| &FIELDS[i])
}

/// The position of the field `name` in [`FIELDS`]. A `match` rather than a
/// search of the table: the decision core looks up every declared field of
/// every resource in every cycle (a test keeps the two in step).
pub(crate) fn field_index(name: &str) -> Option<usize> {
    Some(match name {
        "provider" => 0,
        "databaseName" => 1,
        "owner" => 2,
        "encoding" => 3,
        "locale" => 4,
        "template" => 5,
        "connectionLimit" => 6,
        "allowConnections" => 7,
        "extensions" => 8,
        "parameters" => 9,
        "comment" => 10,
        "engine" => 11,
        "version" => 12,
        "size" => 13,
        "storageGb" => 14,
        "highAvailability" => 15,
        "backupRetentionDays" => 16,
        "region" => 17,
        "deletionPolicy" => 18,
        "driftPolicy" => 19,
        _ => return None,
    })
}

/// The spec fields a provider manages, each with its mutability there: one
/// slot per row of [`FIELDS`], so a lookup is an index, not a search (it
/// runs for every declared field of every resource in every cycle).
/// Names come out in alphabetical order, as a sorted map gave them.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct FieldSet {
    slots: [Option<Mutability>; FIELDS.len()],
}

impl FieldSet {
    /// Whether the provider manages the top-level field `name`.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The field's mutability at the provider, if it manages it.
    pub fn get(&self, name: &str) -> Option<Mutability> {
        self.slots[field_index(name)?]
    }

    /// Manages `name` with `mutability`. A name the field table does not
    /// have is not a field: nothing changes.
    pub fn insert(&mut self, name: &str, mutability: Mutability) {
        if let Some(i) = field_index(name) {
            self.slots[i] = Some(mutability);
        }
    }

    /// Keeps the fields for which `keep` says so; `keep` may change a
    /// field's mutability.
    pub fn retain(&mut self, mut keep: impl FnMut(&'static str, &mut Mutability) -> bool) {
        for (slot, field) in self.slots.iter_mut().zip(FIELDS) {
            if let Some(mutability) = slot
                && !keep(field.name, mutability)
            {
                *slot = None;
            }
        }
    }

    /// Each managed field and its mutability, in alphabetical order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, Mutability)> + use<> {
        let mut managed: Vec<(&'static str, Mutability)> = self
            .slots
            .iter()
            .zip(FIELDS)
            .filter_map(|(slot, field)| slot.map(|m| (field.name, m)))
            .collect();
        managed.sort_unstable_by_key(|(name, _)| *name);
        managed.into_iter()
    }

    /// The managed fields' names, in alphabetical order.
    pub fn keys(&self) -> impl Iterator<Item = &'static str> + use<> {
        self.iter().map(|(name, _)| name)
    }
}

impl std::fmt::Debug for FieldSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl FromIterator<(&'static str, Mutability)> for FieldSet {
    /// Names that are not fields of the table are left out.
    fn from_iter<I: IntoIterator<Item = (&'static str, Mutability)>>(fields: I) -> Self {
        let mut set = FieldSet::default();
        for (name, mutability) in fields {
            set.insert(name, mutability);
        }
        set
    }
}

/// Whether `path` names a field that `tend.dev/ignore-fields` may list: a
/// mutable field, or one key under `parameters` (`parameters.work_mem`).
pub(crate) fn check_ignorable(path: &str) -> Result<(), String> {
    if let Some(key) = path.strip_prefix("parameters.") {
        return if is_parameter_name(key) {
            Ok(())
        } else {
            Err(format!(
                "`{path}` is not a valid parameter path: a parameter name has letters, digits, `_` and `.` and does not start with a digit"
            ))
        };
    }
    match field_info(path) {
        Some(f) if f.mutability == Mutable => Ok(()),
        Some(f) => Err(format!(
            "field `{path}` is {}: only mutable fields can be ignored ({})",
            f.mutability.as_str(),
            mutable_field_names().join(", ")
        )),
        None => {
            let known: Vec<&str> = FIELDS.iter().map(|f| f.name).collect();
            let hint = super::suggest::closest(path, &known)
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            Err(format!(
                "unknown field `{path}`{hint} in tend.dev/ignore-fields: expected one of {} or `parameters.<name>`",
                mutable_field_names().join(", ")
            ))
        }
    }
}

fn mutable_field_names() -> Vec<&'static str> {
    FIELDS
        .iter()
        .filter(|f| f.mutability == Mutable)
        .map(|f| f.name)
        .collect()
}

/// A PostgreSQL configuration parameter name (GUC): letters, digits, `_` and
/// `.` (for extension-namespaced settings such as `pg_stat_statements.max`),
/// not starting with a digit or a dot.
pub(crate) fn is_parameter_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    name.len() <= 63
        && !name.ends_with('.')
        && !name.contains("..")
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_unique() {
        for (i, a) in FIELDS.iter().enumerate() {
            assert!(
                FIELDS[i + 1..].iter().all(|b| b.name != a.name),
                "{} twice",
                a.name
            );
        }
    }

    #[test]
    fn every_field_is_found_at_its_row() {
        for (i, f) in FIELDS.iter().enumerate() {
            assert_eq!(field_index(f.name), Some(i), "{}", f.name);
        }
        assert_eq!(field_index("labels"), None);
        assert_eq!(field_index("Owner"), None);
        assert_eq!(field_index(""), None);
    }

    #[test]
    fn a_field_set_looks_up_and_lists_like_a_sorted_map() {
        let mut set: FieldSet = [
            ("owner", Mutable),
            ("databaseName", Immutable),
            ("notAField", Mutable),
        ]
        .into_iter()
        .collect();
        assert_eq!(set.keys().count(), 2);
        assert!(set.contains_key("owner"));
        assert!(!set.contains_key("notAField"));
        assert_eq!(set.get("databaseName"), Some(Immutable));
        assert_eq!(set.keys().collect::<Vec<_>>(), ["databaseName", "owner"]);
        set.retain(|name, mutability| {
            *mutability = CreateOnly;
            name == "owner"
        });
        assert_eq!(set.iter().collect::<Vec<_>>(), [("owner", CreateOnly)]);
        assert_eq!(format!("{set:?}"), r#"{"owner": CreateOnly}"#);
        assert_eq!(FieldSet::default().keys().count(), 0);
    }

    #[test]
    fn ignorable_paths_follow_mutability() {
        assert!(check_ignorable("connectionLimit").is_ok());
        assert!(check_ignorable("parameters.work_mem").is_ok());
        assert!(check_ignorable("parameters.pg_stat_statements.max").is_ok());
        assert!(
            check_ignorable("encoding")
                .unwrap_err()
                .contains("immutable")
        );
        assert!(check_ignorable("parameters.1x").is_err());
        assert!(
            check_ignorable("nope")
                .unwrap_err()
                .contains("unknown field")
        );
    }
}
