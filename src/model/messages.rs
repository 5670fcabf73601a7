//! The YAML parser's and serde's messages, said to the person who wrote
//! the file: what the field must be and what was found, in words
//! (`must be a whole number, not the text "fifty"`), the text as written
//! (`1e3`, not `1000.0`), a tab called a tab, and the field a misspelt
//! name probably meant.

use super::suggest::closest;

/// `message` (positions already stripped) in words. `token` is the text
/// of the file where the parser stopped, when known.
pub(crate) fn humanize(message: &str, token: Option<&str>) -> String {
    if message.starts_with("found character that cannot start any token")
        && token.is_some_and(|t| t.starts_with('\t'))
    {
        return "a tab character: YAML indents with spaces only; replace the tab with spaces"
            .into();
    }
    if let Some(better) = invalid_type(message, token) {
        return better;
    }
    if let Some(better) = unknown_field(message) {
        return better;
    }
    message.to_string()
}

/// `PATH: invalid type: FOUND, expected WANTED`.
fn invalid_type(message: &str, token: Option<&str>) -> Option<String> {
    let (path, rest) = match message.split_once(": invalid type: ") {
        Some((path, rest)) => (Some(path), rest),
        None => (None, message.strip_prefix("invalid type: ")?),
    };
    let (found, expected) = rest.rsplit_once(", expected ")?;
    let wanted = match expected {
        "i64" | "i32" | "i16" | "i8" | "u64" | "u32" | "u16" | "u8" | "usize" | "isize" => {
            "a whole number"
        }
        "f64" | "f32" => "a number",
        "a boolean" => "true or false",
        "a string" => "a string",
        "a sequence" => "a list",
        e if e.starts_with("struct ") || e == "a map" => "a mapping (`key: value` lines)",
        e => e,
    };
    let written = token.map(|t| t.trim_end_matches(',').to_string());
    let what = if let Some(v) = found.strip_prefix("string ") {
        format!("the text {v}")
    } else if let Some(v) = found.strip_prefix("floating point ") {
        let value = v.trim_matches('`');
        let shown = written.unwrap_or_else(|| value.to_string());
        // A whole value written with a fraction or exponent: say how to
        // write it.
        match value.parse::<f64>() {
            Ok(n) if wanted == "a whole number" && n.fract() == 0.0 && n.abs() < 1e15 => {
                format!("{shown}; write {}", n as i64)
            }
            _ => format!("the number {shown}"),
        }
    } else if let Some(v) = found.strip_prefix("integer ") {
        format!("the number {}", v.trim_matches('`'))
    } else if let Some(v) = found.strip_prefix("boolean ") {
        v.trim_matches('`').to_string()
    } else if found == "sequence" {
        "a list".into()
    } else if found == "map" {
        "a mapping".into()
    } else if found == "unit value" {
        "nothing (an empty value)".into()
    } else {
        found.to_string()
    };
    Some(match path {
        Some(path) => format!("{path} must be {wanted}, not {what}"),
        None => format!("must be {wanted}, not {what}"),
    })
}

/// `PATH: unknown field `NAME`, expected one of `A`, `B`, …`.
fn unknown_field(message: &str) -> Option<String> {
    let at = message.find("unknown field `")?;
    let (head, rest) = message.split_at(at);
    let rest = &rest["unknown field `".len()..];
    let (name, rest) = rest.split_once('`')?;
    // serde's own message (tend's other "unknown field" messages carry
    // their suggestion already).
    if !rest.starts_with(", expected") {
        return None;
    }
    let known: Vec<&str> = rest
        .strip_prefix(", expected one of ")
        .or_else(|| rest.strip_prefix(", expected "))
        .map(|list| {
            list.split(", ")
                .map(|k| k.trim_matches('`'))
                .filter(|k| !k.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let hint = match closest(name, &known) {
        Some(k) => format!(" (did you mean `{k}`?)"),
        None => String::new(),
    };
    let list = known
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    Some(if list.is_empty() {
        format!("{head}unknown field `{name}`{hint}")
    } else {
        format!("{head}unknown field `{name}`{hint}; the fields are {list}")
    })
}

#[cfg(test)]
mod tests {
    use super::humanize;

    #[test]
    fn serde_types_are_said_in_words() {
        assert_eq!(
            humanize(
                "spec.connectionLimit: invalid type: string \"fifty\", expected i64",
                Some("fifty")
            ),
            "spec.connectionLimit must be a whole number, not the text \"fifty\""
        );
        assert_eq!(
            humanize(
                "spec.connectionLimit: invalid type: floating point `1000.0`, expected i64",
                Some("1e3")
            ),
            "spec.connectionLimit must be a whole number, not 1e3; write 1000"
        );
        assert_eq!(
            humanize(
                "spec.connectionLimit: invalid type: floating point `2.5`, expected i64",
                Some("2.5")
            ),
            "spec.connectionLimit must be a whole number, not the number 2.5"
        );
        assert_eq!(
            humanize(
                "spec.allowConnections: invalid type: integer `1`, expected a boolean",
                Some("1")
            ),
            "spec.allowConnections must be true or false, not the number 1"
        );
    }

    #[test]
    fn a_tab_is_called_a_tab() {
        assert!(
            humanize(
                "found character that cannot start any token, while scanning for the next token",
                Some("\tconnectionLimit: 5")
            )
            .starts_with("a tab character")
        );
        // Another character keeps the parser's words.
        assert!(
            humanize(
                "found character that cannot start any token, while scanning for the next token",
                Some("@x")
            )
            .starts_with("found character")
        );
    }

    #[test]
    fn a_misspelt_field_gets_a_suggestion() {
        assert_eq!(
            humanize(
                "spec: unknown field `conectionLimit`, expected one of `owner`, `connectionLimit`",
                None
            ),
            "spec: unknown field `conectionLimit` (did you mean `connectionLimit`?); the fields are `owner`, `connectionLimit`"
        );
        assert_eq!(
            humanize(
                "metadata: unknown field `zzz`, expected one of `name`, `labels`",
                None
            ),
            "metadata: unknown field `zzz`; the fields are `name`, `labels`"
        );
    }
}
