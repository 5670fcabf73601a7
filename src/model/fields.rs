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
pub fn field_info(name: &str) -> Option<&'static FieldInfo> {
    FIELDS.iter().find(|f| f.name == name)
}

/// Whether `path` names a field that `tend.dev/ignore-fields` may list: a
/// mutable field, or one key under `parameters` (`parameters.work_mem`).
pub fn check_ignorable(path: &str) -> Result<(), String> {
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
pub fn is_parameter_name(name: &str) -> bool {
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
