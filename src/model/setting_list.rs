//! Settings a server parses as lists (PostgreSQL's `GUC_LIST_INPUT`:
//! `search_path`, `temp_tablespaces`, …).
//!
//! A declaration gives such a setting as one string (`"$user", public` or
//! `$user, public`). Sent as one literal it would be one element, a schema
//! literally named `"$user", public`; so the provider sends the elements,
//! and tend compares values as the server stores them: both the declared
//! and the observed text are split the way the server splits them and
//! written back in one canonical form ([`canonical`]). Either spelling in a
//! declaration then matches what the server shows.
//!
//! # Canonical form
//! The elements joined by `", "`. For a setting the server quotes
//! (`GUC_LIST_QUOTE`), an element is double-quoted unless it is a plain
//! lower-case identifier (`"$user", public`: what PostgreSQL stores). The
//! server also quotes elements that are SQL keywords (`"user"`); tend does
//! not, on either side, so the comparison is exact and only the display
//! differs. The empty list is `""`, as the server stores it.

/// A list-valued setting and whether its elements are identifiers the
/// server quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListSetting {
    /// The setting's name, lower case (names are case-insensitive).
    pub name: &'static str,
    /// `GUC_LIST_QUOTE`: elements are stored quoted where needed.
    pub quoted: bool,
}

/// The list-valued settings of PostgreSQL 13–17 that can be set per
/// database (settings only the postmaster or the configuration file can
/// set, such as `shared_preload_libraries`, are left out: `ALTER DATABASE`
/// refuses them anyway).
pub(crate) const POSTGRES_LIST_SETTINGS: &[ListSetting] = &[
    ListSetting {
        name: "search_path",
        quoted: true,
    },
    ListSetting {
        name: "temp_tablespaces",
        quoted: true,
    },
    ListSetting {
        name: "session_preload_libraries",
        quoted: true,
    },
    ListSetting {
        name: "local_preload_libraries",
        quoted: true,
    },
    ListSetting {
        name: "datestyle",
        quoted: false,
    },
    ListSetting {
        name: "wal_consistency_checking",
        quoted: false,
    },
    ListSetting {
        name: "restrict_nonsystem_relation_kind",
        quoted: false,
    },
    ListSetting {
        name: "createrole_self_grant",
        quoted: false,
    },
];

/// The list setting named `key` in `settings` (case-insensitive).
pub(crate) fn find(settings: &[ListSetting], key: &str) -> Option<ListSetting> {
    settings
        .iter()
        .copied()
        .find(|s| s.name.eq_ignore_ascii_case(key))
}

/// Splits `text` into elements as PostgreSQL's `SplitIdentifierString`
/// does: separated by commas, surrounding whitespace dropped, a
/// double-quoted element taken as written (`""` is one quote), an unquoted
/// one folded to lower case. `None` for text the server would refuse (an
/// unterminated quote, an empty element). `""` alone is the empty list.
pub(crate) fn split(text: &str) -> Option<Vec<String>> {
    let text = text.trim_matches(is_space);
    if text.is_empty() || text == "\"\"" {
        return Some(Vec::new());
    }
    let mut elements = Vec::new();
    let mut rest = text;
    loop {
        let element;
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next() {
                    None => return None,
                    Some((i, '"')) => {
                        if quoted[i + 1..].starts_with('"') {
                            value.push('"');
                            chars.next();
                        } else {
                            break i + 1;
                        }
                    }
                    Some((_, c)) => value.push(c),
                }
            };
            if value.is_empty() {
                return None;
            }
            element = value;
            rest = &quoted[end..];
        } else {
            let end = rest
                .find(|c: char| c == ',' || is_space(c))
                .unwrap_or(rest.len());
            if end == 0 {
                return None;
            }
            element = rest[..end].to_ascii_lowercase();
            rest = &rest[end..];
        }
        elements.push(element);
        rest = rest.trim_start_matches(is_space);
        if rest.is_empty() {
            return Some(elements);
        }
        rest = rest.strip_prefix(',')?.trim_start_matches(is_space);
    }
}

/// The elements in canonical form (see the module docs).
pub(crate) fn render(elements: &[String], quoted: bool) -> String {
    if elements.is_empty() {
        return "\"\"".into();
    }
    elements
        .iter()
        .map(|e| {
            if quoted && !plain_identifier(e) {
                format!("\"{}\"", e.replace('"', "\"\""))
            } else {
                e.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `text` in canonical form, or `None` when it is not a valid list (then
/// it is compared and sent as written, and the server says what is wrong).
pub(crate) fn canonical(setting: ListSetting, text: &str) -> Option<String> {
    split(text).map(|elements| render(&elements, setting.quoted))
}

/// What PostgreSQL's `quote_identifier` leaves unquoted (keywords aside).
fn plain_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// PostgreSQL's `scanner_isspace`.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> ListSetting {
        find(POSTGRES_LIST_SETTINGS, "search_path").unwrap()
    }

    #[test]
    fn both_spellings_of_a_search_path_are_one_list() {
        for text in [
            "\"$user\", public",
            "$user, public",
            "\"$user\",public",
            "  $USER ,  Public ",
        ] {
            assert_eq!(
                canonical(path(), text).as_deref(),
                Some("\"$user\", public"),
                "{text}"
            );
        }
    }

    #[test]
    fn quoted_elements_keep_case_commas_and_quotes() {
        assert_eq!(
            split("\"My Schema\", \"a,b\", \"say \"\"hi\"\"\"").unwrap(),
            ["My Schema", "a,b", "say \"hi\""]
        );
        let elements = split("\"My Schema\", \"a,b\"").unwrap();
        assert_eq!(render(&elements, true), "\"My Schema\", \"a,b\"");
        assert_eq!(split(&render(&elements, true)).unwrap(), elements);
    }

    #[test]
    fn invalid_lists_are_none() {
        for text in ["\"open", "a,,b", "a b", ",a", "a,", "\"\", a"] {
            assert_eq!(split(text), None, "{text}");
        }
    }

    #[test]
    fn the_empty_list_is_stored_as_two_quotes() {
        assert_eq!(split("").unwrap(), Vec::<String>::new());
        assert_eq!(split("\"\"").unwrap(), Vec::<String>::new());
        assert_eq!(canonical(path(), "").as_deref(), Some("\"\""));
    }

    #[test]
    fn unquoted_lists_are_joined_as_they_are() {
        let datestyle = find(POSTGRES_LIST_SETTINGS, "DateStyle").unwrap();
        assert_eq!(canonical(datestyle, "ISO,MDY").as_deref(), Some("iso, mdy"));
    }
}
