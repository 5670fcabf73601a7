//! Override annotations (docs/declarations.md): parsing and validation.
//!
//! A typo in an override must never silently do nothing, so every
//! `tend.dev/*` key is checked against [`KNOWN_ANNOTATIONS`] and every value
//! is parsed strictly. The same [`OverrideSpec`] is produced from local
//! overrides and provider labels, so the decision core sees one shape.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::declaration::ScalarString;
use super::fields::check_ignorable;

pub(crate) const PAUSED: &str = "tend.dev/paused";
pub(crate) const IGNORE_FIELDS: &str = "tend.dev/ignore-fields";
pub(crate) const OVERRIDE_REASON: &str = "tend.dev/override-reason";
pub(crate) const OVERRIDE_EXPIRES: &str = "tend.dev/override-expires";
pub(crate) const OVERRIDE_ON_EXPIRY: &str = "tend.dev/override-on-expiry";
pub(crate) const ADOPT: &str = "tend.dev/adopt";

/// Every annotation under `tend.dev/` this build understands.
pub const KNOWN_ANNOTATIONS: &[&str] = &[
    PAUSED,
    IGNORE_FIELDS,
    OVERRIDE_REASON,
    OVERRIDE_EXPIRES,
    OVERRIDE_ON_EXPIRY,
    ADOPT,
];

/// When an override stops being honoured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverrideExpiry {
    /// An absolute time (RFC 3339 in the annotation).
    At(SystemTime),
    /// A duration counted from when tend first saw the override (kept in the
    /// state dir, so a restart does not extend it).
    After(Duration),
}

/// What happens when an override expires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnExpiry {
    /// Keep honouring the override, report it `expired` and alert.
    #[default]
    Hold,
    /// Resume managing the resource.
    Resume,
}

/// One override, whatever its source (annotation, local, provider label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideSpec {
    pub paused: bool,
    /// Dotted field paths (`connectionLimit`, `parameters.work_mem`).
    pub ignore_fields: Vec<String>,
    pub reason: String,
    pub expires: Option<OverrideExpiry>,
    /// The annotation text of `expires`, for reports.
    pub expires_text: Option<String>,
    pub on_expiry: OnExpiry,
}

/// One problem with an annotation: the annotation key and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AnnotationProblem {
    pub key: String,
    /// The key itself is wrong (unknown), not its value.
    pub unknown_key: bool,
    pub message: String,
}

/// The parsed `tend.dev/*` annotations of one declaration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TendAnnotations {
    /// Boxed: few declarations carry one, and every declaration is kept
    /// (16 bytes a declaration instead of 112).
    pub overrides: Option<Box<OverrideSpec>>,
    pub adopt: bool,
}

/// Parses and validates the `tend.dev/*` annotations; other annotations are
/// left alone. Returns every problem, not just the first.
///
/// Long on purpose: one pass over the annotation keys, then one short
/// check per annotation, every problem collected into one list.
pub(crate) fn parse_annotations(
    annotations: &BTreeMap<String, ScalarString>,
) -> Result<TendAnnotations, Vec<AnnotationProblem>> {
    let mut problems = Vec::new();
    for key in annotations.keys() {
        if key.starts_with("tend.dev/") && !KNOWN_ANNOTATIONS.contains(&key.as_str()) {
            let hint = super::suggest::closest(key, KNOWN_ANNOTATIONS)
                .map(|k| format!("did you mean `{k}`? "))
                .unwrap_or_default();
            problems.push(AnnotationProblem {
                key: key.to_owned(),
                unknown_key: true,
                message: format!(
                    "unknown annotation `{key}`: {hint}known tend.dev annotations are {}",
                    KNOWN_ANNOTATIONS.join(", ")
                ),
            });
        }
    }
    let mut problem = |key: &str, message: String| {
        let problem = AnnotationProblem {
            key: key.to_owned(),
            unknown_key: false,
            message,
        };
        if !problems.contains(&problem) {
            problems.push(problem);
        }
    };
    let get = |key: &str| annotations.get(key).map(|v| v.as_str().trim());

    let mut flag = |key: &str| match get(key) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            problem(
                key,
                format!("`{key}` must be \"true\" or \"false\", found \"{other}\""),
            );
            false
        }
    };
    let paused = flag(PAUSED);
    let adopt = flag(ADOPT);

    let mut ignore_fields = Vec::new();
    if let Some(list) = get(IGNORE_FIELDS) {
        for item in list.split(',').map(str::trim) {
            if item.is_empty() {
                problem(
                    IGNORE_FIELDS,
                    format!(
                        "`{IGNORE_FIELDS}` has an empty entry: list field paths separated by commas, e.g. \"connectionLimit,parameters.work_mem\""
                    ),
                );
            } else if let Err(message) = check_ignorable(item) {
                problem(IGNORE_FIELDS, message);
            } else if !ignore_fields.iter().any(|f| f == item) {
                ignore_fields.push(item.to_owned());
            }
        }
    }

    let reason = get(OVERRIDE_REASON).unwrap_or("").to_owned();
    let expires_text = get(OVERRIDE_EXPIRES).map(str::to_owned);
    let expires = match expires_text.as_deref() {
        None => None,
        Some(text) => match parse_expiry(text) {
            Ok(expiry) => Some(expiry),
            Err(message) => {
                problem(OVERRIDE_EXPIRES, message);
                None
            }
        },
    };
    let on_expiry = match get(OVERRIDE_ON_EXPIRY) {
        None | Some("hold") => OnExpiry::Hold,
        Some("resume") => OnExpiry::Resume,
        Some(other) => {
            problem(
                OVERRIDE_ON_EXPIRY,
                format!("`{OVERRIDE_ON_EXPIRY}` must be \"hold\" or \"resume\", found \"{other}\""),
            );
            OnExpiry::Hold
        }
    };

    let has_override = paused || !ignore_fields.is_empty();
    if has_override && reason.is_empty() {
        let key = if paused { PAUSED } else { IGNORE_FIELDS };
        problem(
            key,
            format!(
                "an override needs `{OVERRIDE_REASON}`: say why (a ticket or an incident) so the next operator knows when it may go"
            ),
        );
    }
    // An override that is there but wrong (a misspelt field) was reported
    // already: its expiry is not "without an override" too.
    if !has_override && !paused && get(IGNORE_FIELDS).is_none() {
        for key in [OVERRIDE_EXPIRES, OVERRIDE_ON_EXPIRY] {
            if annotations.contains_key(key) {
                problem(
                    key,
                    format!(
                        "`{key}` has no override to apply to: set `{PAUSED}: \"true\"` or `{IGNORE_FIELDS}`, or remove it"
                    ),
                );
            }
        }
    }

    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(TendAnnotations {
        overrides: has_override.then(|| {
            Box::new(OverrideSpec {
                paused,
                ignore_fields,
                reason,
                expires,
                expires_text,
                on_expiry,
            })
        }),
        adopt,
    })
}

/// [`parse_annotations`] over plain strings (local overrides, provider
/// labels): the same rules, every problem in one message.
pub(crate) fn parse_override_strings<'a, K: AsRef<str>>(
    pairs: impl IntoIterator<Item = (K, &'a String)>,
) -> Result<TendAnnotations, String> {
    let annotations = pairs
        .into_iter()
        .map(|(k, v)| (k.as_ref().to_owned(), ScalarString(v.clone())))
        .collect();
    parse_annotations(&annotations).map_err(|problems| {
        problems
            .into_iter()
            .map(|p| p.message)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// Parses `tend.dev/override-expires`: RFC 3339 (with `Z` or a numeric
/// offset) or a duration such as `4h` or `2d 12h`.
pub(crate) fn parse_expiry(text: &str) -> Result<OverrideExpiry, String> {
    if let Ok(duration) = humantime::parse_duration(text) {
        if duration.is_zero() {
            return Err(format!(
                "`{OVERRIDE_EXPIRES}` duration \"{text}\" is zero: give a positive duration such as \"4h\""
            ));
        }
        return crate::time::check_duration(text, duration)
            .map(OverrideExpiry::After)
            .map_err(|why| format!("`{OVERRIDE_EXPIRES}` duration {why}"));
    }
    crate::time::parse_rfc3339(text).map(OverrideExpiry::At).ok_or_else(|| {
        format!(
            "`{OVERRIDE_EXPIRES}` must be an RFC 3339 time (\"2026-12-01T18:00:00Z\") or a duration (\"4h\"), found \"{text}\""
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, ScalarString> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), ScalarString::from(*v)))
            .collect()
    }

    #[test]
    fn a_full_override_parses() {
        let parsed = parse_annotations(&annotations(&[
            (PAUSED, "true"),
            (OVERRIDE_REASON, "INC-1234"),
            (OVERRIDE_EXPIRES, "4h"),
            (OVERRIDE_ON_EXPIRY, "resume"),
        ]))
        .unwrap();
        let o = parsed.overrides.unwrap();
        assert!(o.paused);
        assert_eq!(
            o.expires,
            Some(OverrideExpiry::After(Duration::from_secs(4 * 3600)))
        );
        assert_eq!(o.on_expiry, OnExpiry::Resume);
    }

    #[test]
    fn absurd_expiry_durations_are_refused() {
        for text in ["999999999y", "8000y", "11y"] {
            let err = parse_expiry(text).unwrap_err();
            assert!(err.contains("10 years"), "{text}: {err}");
        }
        assert!(parse_expiry("9y").is_ok());
    }

    #[test]
    fn typo_suggests_the_known_key() {
        let problems = parse_annotations(&annotations(&[("tend.dev/pasued", "true")])).unwrap_err();
        assert!(
            problems[0]
                .message
                .contains("did you mean `tend.dev/paused`")
        );
    }
}
