//! Semantic rules that serde cannot express. Each problem names the path of
//! the offending node so [`super::locate`] can give it a line and column.

use super::declaration::{API_VERSION, KIND, ManagedDatabase};
use super::fields::is_parameter_name;
use super::overrides::{TendAnnotations, parse_annotations};

/// A rule broken at `path` (keys from the document root; list indexes as
/// decimal strings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub path: Vec<String>,
    /// The problem is the last path element's key, not its value.
    pub at_key: bool,
    pub message: String,
}

fn at(path: &[&str], message: String) -> Problem {
    Problem {
        path: path.iter().map(|s| s.to_string()).collect(),
        at_key: false,
        message,
    }
}

fn at_key(path: &[&str], message: String) -> Problem {
    Problem {
        at_key: true,
        ..at(path, message)
    }
}

/// PostgreSQL truncates identifiers at 63 bytes (NAMEDATALEN - 1); a longer
/// name would silently name a different database.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// Checks `apiVersion` and `kind` alone, before the typed parse, so a foreign
/// document (a Kubernetes `Deployment`) gets "wrong kind" rather than a list of
/// unknown fields.
pub(crate) fn check_type(api_version: Option<&str>, kind: Option<&str>) -> Vec<Problem> {
    let mut problems = Vec::new();
    match api_version {
        Some(API_VERSION) => {}
        Some(other) => problems.push(at(
            &["apiVersion"],
            format!("apiVersion must be `{API_VERSION}`, found `{other}`"),
        )),
        None => problems.push(at(
            &[],
            format!("missing field `apiVersion`: add `apiVersion: {API_VERSION}`"),
        )),
    }
    match kind {
        Some(KIND) => {}
        Some(other) => problems.push(at(
            &["kind"],
            format!(
                "kind must be `{KIND}`, found `{other}`: tend only reads ManagedDatabase documents"
            ),
        )),
        None => problems.push(at(&[], format!("missing field `kind`: add `kind: {KIND}`"))),
    }
    problems
}

/// Is `name` a lowercase DNS label of at most 63 characters?
pub(crate) fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

fn check_identifier(path: &[&str], what: &str, value: &str, problems: &mut Vec<Problem>) {
    if value.is_empty() {
        problems.push(at(path, format!("{what} must not be empty")));
    } else if value.len() > MAX_IDENTIFIER_BYTES {
        problems.push(at(
            path,
            format!(
                "{what} is {} bytes long; PostgreSQL keeps at most {MAX_IDENTIFIER_BYTES} bytes, so shorten it",
                value.len()
            ),
        ));
    } else if value.contains('\0') {
        problems.push(at(path, format!("{what} must not contain a NUL character")));
    }
}

/// Every semantic rule of one declaration. Returns the parsed `tend.dev/*`
/// annotations when they are valid.
///
/// Long on purpose: a flat list of independent checks, each a few lines,
/// in the order the declaration's fields appear; split up, a reader would
/// hunt for the rule of one field across functions.
pub(crate) fn validate(decl: &ManagedDatabase) -> (Option<TendAnnotations>, Vec<Problem>) {
    let mut problems = check_type(Some(&decl.api_version), Some(&decl.kind));
    let name = &decl.metadata.name;
    if !is_dns_label(name) {
        problems.push(at(
            &["metadata", "name"],
            format!(
                "metadata.name `{name}` is not a lowercase DNS label: use at most 63 characters of a-z, 0-9 and `-`, starting and ending with a letter or digit"
            ),
        ));
    }
    let annotations = match parse_annotations(&decl.metadata.annotations) {
        Ok(parsed) => Some(parsed),
        Err(list) => {
            for p in list {
                let path = ["metadata", "annotations", p.key.as_str()];
                problems.push(if p.unknown_key {
                    at_key(&path, p.message)
                } else {
                    at(&path, p.message)
                });
            }
            None
        }
    };

    for key in decl.metadata.labels.keys() {
        if key.starts_with("tend.dev/") {
            problems.push(at_key(
                &["metadata", "labels", key.as_str()],
                format!(
                    "label `{key}`: `tend.dev/` keys are tend's own (ownership markers and provider-side overrides); an override is an annotation (`metadata.annotations`), and labels stay in Git"
                ),
            ));
        }
    }

    let spec = &decl.spec;
    let identifiers = [
        ("provider", "spec.provider", &spec.provider),
        ("databaseName", "spec.databaseName", &spec.database_name),
        ("owner", "spec.owner", &spec.owner),
        ("encoding", "spec.encoding", &spec.encoding),
        ("locale", "spec.locale", &spec.locale),
        ("template", "spec.template", &spec.template),
        ("region", "spec.region", &spec.region),
        ("size", "spec.size", &spec.size),
        ("version", "spec.version", &spec.version),
    ];
    for (field, what, value) in identifiers {
        if let Some(value) = value {
            check_identifier(&["spec", field], what, value, &mut problems);
        }
    }
    if let Some(limit) = spec.connection_limit
        && !(-1..=i64::from(i32::MAX)).contains(&limit)
    {
        problems.push(at(
            &["spec", "connectionLimit"],
            format!("spec.connectionLimit must be -1 (no limit) or a number from 0 to {}, found {limit}", i32::MAX),
        ));
    }
    if let Some(gb) = spec.storage_gb
        && gb <= 0
    {
        problems.push(at(
            &["spec", "storageGb"],
            format!("spec.storageGb must be greater than 0, found {gb}"),
        ));
    }
    if let Some(days) = spec.backup_retention_days
        && !(0..=35).contains(&days)
    {
        problems.push(at(
            &["spec", "backupRetentionDays"],
            format!("spec.backupRetentionDays must be from 0 to 35, found {days}"),
        ));
    }
    if let Some(comment) = &spec.comment
        && comment.contains('\0')
    {
        problems.push(at(
            &["spec", "comment"],
            "spec.comment must not contain a NUL character".into(),
        ));
    }
    if let Some(parameters) = &spec.parameters {
        for (key, value) in parameters {
            if !is_parameter_name(key) {
                problems.push(at_key(
                    &["spec", "parameters", key],
                    format!(
                        "`{key}` is not a valid parameter name: use letters, digits, `_` and `.`, not starting with a digit"
                    ),
                ));
            } else if value.as_str().contains('\0') {
                problems.push(at(
                    &["spec", "parameters", key],
                    format!("spec.parameters.{key} must not contain a NUL character"),
                ));
            } else if key.eq_ignore_ascii_case("search_path")
                && value.as_str().matches('"').count() % 2 == 1
            {
                // A quoted schema name without its closing quote: the
                // server would refuse the value (or read a schema name no
                // one meant).
                problems.push(at(
                    &["spec", "parameters", key],
                    format!(
                        "spec.parameters.{key} has an unterminated quote in `{}`: each quoted schema name needs its closing `\"` (`\"$user\", public`)",
                        value.as_str()
                    ),
                ));
            }
        }
    }
    if let Some(extensions) = &spec.extensions {
        for (i, ext) in extensions.iter().enumerate() {
            let index = i.to_string();
            let ext = &ext.0;
            check_identifier(
                &["spec", "extensions", &index],
                "extension name",
                &ext.name,
                &mut problems,
            );
            if ext.name.chars().any(|c| c.is_ascii_uppercase()) {
                // Extension names are case-sensitive, and every extension
                // PostgreSQL ships (and the DBaaS offer) is lowercase:
                // `PG_TRGM` is not `pg_trgm`, and CREATE EXTENSION fails.
                problems.push(at(
                    &["spec", "extensions", &index],
                    format!(
                        "extension `{}`: extension names are lowercase; write `{}`",
                        ext.name,
                        ext.name.to_ascii_lowercase()
                    ),
                ));
            }
            if extensions[..i].iter().any(|e| e.0.name == ext.name) {
                problems.push(at(
                    &["spec", "extensions", &index],
                    format!("extension `{}` is listed twice: keep one entry", ext.name),
                ));
            }
            if let Some(schema) = &ext.schema {
                check_identifier(
                    &["spec", "extensions", &index, "schema"],
                    "extension schema",
                    schema,
                    &mut problems,
                );
            }
        }
    }
    (annotations, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(is_dns_label("orders-db"));
        assert!(is_dns_label("a"));
        assert!(is_dns_label(&"a".repeat(63)));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(!is_dns_label("Orders"));
        assert!(!is_dns_label("-orders"));
        assert!(!is_dns_label("orders-"));
        assert!(!is_dns_label("orders_db"));
        assert!(!is_dns_label(""));
    }
}
