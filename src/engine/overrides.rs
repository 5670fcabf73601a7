//! Combining overrides from their three sources into one effective override.

use std::time::SystemTime;

use serde::Serialize;

use crate::model::{OnExpiry, OverrideExpiry, OverrideSpec};

/// Where an override was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OverrideSource {
    /// An annotation on the declaration in Git.
    Annotation,
    /// `tend override set` on the agent's host.
    Local,
    /// A label at the provider.
    Provider,
}

impl OverrideSource {
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideSource::Annotation => "annotation",
            OverrideSource::Local => "local",
            OverrideSource::Provider => "provider",
        }
    }
}

/// One override as the decision core receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct OverrideInput {
    pub source: OverrideSource,
    pub spec: OverrideSpec,
    /// When tend first saw this override (a duration expiry counts from here).
    pub first_seen: SystemTime,
}

impl OverrideInput {
    /// The override a declaration's annotations set, if any, as first seen
    /// at `first_seen`.
    pub fn from_annotations(
        decl: &crate::model::Declaration,
        first_seen: SystemTime,
    ) -> Option<Self> {
        decl.annotations
            .overrides
            .as_ref()
            .map(|spec| OverrideInput {
                source: OverrideSource::Annotation,
                spec: OverrideSpec::clone(spec),
                first_seen,
            })
    }

    /// The absolute expiry time, if any.
    pub fn expires_at(&self) -> Option<SystemTime> {
        match self.spec.expires {
            Some(OverrideExpiry::At(t)) => Some(t),
            Some(OverrideExpiry::After(d)) => Some(crate::time::add(self.first_seen, d)),
            None => None,
        }
    }
}

/// The identity of an override's content, stored with its first sighting:
/// a changed override starts a new duration, an unchanged one keeps its
/// clock across cycles and restarts. Canonical JSON of named parts (not
/// `Debug` output), so renaming a Rust field cannot restart every expiry.
/// `on-expiry` is not part of it: changing what happens at expiry does not
/// move the expiry.
pub(crate) fn fingerprint(spec: &OverrideSpec) -> String {
    serde_json::json!({
        "v": 1,
        "paused": spec.paused,
        "ignoreFields": spec.ignore_fields,
        "reason": spec.reason,
        "expires": spec.expires_text,
    })
    .to_string()
}

/// The fingerprint state formats up to 2 stored (`Debug` output). Kept only
/// to recognise those rows and carry their first sighting over to
/// [`fingerprint`]; never written.
pub(crate) fn legacy_fingerprint(spec: &OverrideSpec) -> String {
    format!(
        "{:?}|{:?}|{}|{:?}",
        spec.paused, spec.ignore_fields, spec.reason, spec.expires_text
    )
}

/// All overrides of a resource folded into one: what is honoured now, and
/// everything a report must show.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EffectiveOverride {
    /// Sources, in order (annotation, local, provider).
    pub sources: Vec<OverrideSource>,
    /// Honoured now: no create, update or delete.
    pub paused: bool,
    /// Honoured now: fields left as they are.
    pub ignore_fields: Vec<String>,
    pub reasons: Vec<String>,
    /// The earliest expiry among the overrides.
    pub expires: Option<SystemTime>,
    /// Some override has expired (held, or resumed).
    pub expired: bool,
    /// Expired overrides with `on-expiry: resume` that are no longer honoured.
    pub resumed: bool,
    /// When the oldest override was first seen. Kept as a time, not as
    /// an age at the decision's `now`: a decision that stands from a
    /// cycle's first pass is reported with its second pass's `now`, and
    /// `now - age` then moved the time a report shows (and the status
    /// branch's file with it) by the time between the passes.
    pub first_seen: Option<SystemTime>,
    /// What the overrides declare, honoured or not (an expired one with
    /// `on-expiry: resume` still declares the pause it no longer holds):
    /// what reports name as its kind and fields.
    pub declared_paused: bool,
    pub declared_fields: Vec<String>,
}

/// No override at all: what [`DecidedOverrides`] reads as when it holds
/// none.
static NO_OVERRIDE: EffectiveOverride = EffectiveOverride {
    sources: Vec::new(),
    paused: false,
    ignore_fields: Vec::new(),
    reasons: Vec::new(),
    expires: None,
    expired: false,
    resumed: false,
    first_seen: None,
    declared_paused: false,
    declared_fields: Vec::new(),
};

/// A decision's overrides, boxed and only when there are any: most of a
/// fleet has none, an [`EffectiveOverride`] is well over a hundred bytes,
/// and a cycle holds a decision for every resource. Reads as the
/// overrides themselves ([`Deref`](std::ops::Deref)); none reads as an
/// empty [`EffectiveOverride`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DecidedOverrides(Option<Box<EffectiveOverride>>);

impl From<EffectiveOverride> for DecidedOverrides {
    fn from(overrides: EffectiveOverride) -> Self {
        DecidedOverrides((overrides != NO_OVERRIDE).then(|| Box::new(overrides)))
    }
}

impl std::ops::Deref for DecidedOverrides {
    type Target = EffectiveOverride;

    fn deref(&self) -> &EffectiveOverride {
        self.0.as_deref().unwrap_or(&NO_OVERRIDE)
    }
}

impl EffectiveOverride {
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Whether a field path is left alone: named directly, or as part of a
    /// named map (`parameters` covers `parameters.work_mem`). A setting
    /// named in another case is the same setting (`parameters.Work_Mem`
    /// covers `parameters.work_mem`): PostgreSQL's names are
    /// case-insensitive, and an override that names it at all must hold.
    pub fn ignores(&self, path: &str) -> bool {
        self.ignore_fields.iter().any(|f| {
            f == path
                || (path.starts_with("parameters.") && f.eq_ignore_ascii_case(path))
                || path
                    .strip_prefix(f.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
        })
    }

    /// `paused`, `ignore-fields`, or both: what the overrides declare
    /// (honoured or, expired with `resume`, not any more).
    pub fn kind(&self) -> &'static str {
        match (self.declared_paused, self.declared_fields.is_empty()) {
            (true, true) => "paused",
            (true, false) => "paused,ignore-fields",
            (false, _) => "ignore-fields",
        }
    }
}

/// Folds overrides into one. An expired override with `hold` stays
/// honoured (and is reported expired); with `resume` it stops being honoured.
pub(crate) fn effective(inputs: &[OverrideInput], now: SystemTime) -> EffectiveOverride {
    let mut out = EffectiveOverride::default();
    let mut sorted: Vec<&OverrideInput> = inputs.iter().collect();
    sorted.sort_by_key(|o| o.source);
    for o in sorted {
        let expires = o.expires_at();
        let expired = expires.is_some_and(|t| now >= t);
        let honoured = !expired || o.spec.on_expiry == OnExpiry::Hold;
        if !out.sources.contains(&o.source) {
            out.sources.push(o.source);
        }
        if !o.spec.reason.is_empty() && !out.reasons.contains(&o.spec.reason) {
            out.reasons.push(o.spec.reason.clone());
        }
        out.expires = match (out.expires, expires) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        out.expired |= expired;
        out.resumed |= !honoured;
        out.first_seen = Some(out.first_seen.map_or(o.first_seen, |t| t.min(o.first_seen)));
        out.declared_paused |= o.spec.paused;
        for f in &o.spec.ignore_fields {
            if !out.declared_fields.contains(f) {
                out.declared_fields.push(f.clone());
            }
        }
        if honoured {
            out.paused |= o.spec.paused;
            for f in &o.spec.ignore_fields {
                if !out.ignore_fields.contains(f) {
                    out.ignore_fields.push(f.clone());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_setting_named_in_another_case_is_ignored_all_the_same() {
        let ov = EffectiveOverride {
            ignore_fields: vec!["parameters.Work_Mem".into(), "connectionLimit".into()],
            ..EffectiveOverride::default()
        };
        assert!(ov.ignores("parameters.work_mem"));
        assert!(ov.ignores("parameters.Work_Mem"));
        assert!(!ov.ignores("parameters.work_mem_extra"));
        assert!(
            !ov.ignores("connectionlimit"),
            "only settings' names ignore case"
        );
    }

    #[test]
    fn a_decision_holds_no_box_without_overrides_and_reads_them_as_they_are_with() {
        let none = DecidedOverrides::from(EffectiveOverride::default());
        assert!(none.0.is_none(), "no override, nothing allocated");
        assert!(none.is_empty() && !none.paused);
        // Anything set is kept, even without a source.
        let seen = EffectiveOverride {
            first_seen: Some(SystemTime::UNIX_EPOCH),
            ..EffectiveOverride::default()
        };
        assert_eq!(*DecidedOverrides::from(seen.clone()), seen);
        let paused = EffectiveOverride {
            sources: vec![OverrideSource::Local],
            paused: true,
            reasons: vec!["incident".into()],
            ..EffectiveOverride::default()
        };
        let decided = DecidedOverrides::from(paused.clone());
        assert!(decided.paused && decided.reasons == ["incident"]);
        assert_eq!(*decided, paused);
    }

    fn spec() -> OverrideSpec {
        OverrideSpec {
            paused: true,
            ignore_fields: vec!["connectionLimit".into()],
            reason: "INC-7|pipes".into(),
            expires: Some(OverrideExpiry::After(Duration::from_secs(4 * 3600))),
            expires_text: Some("4h".into()),
            on_expiry: OnExpiry::Hold,
        }
    }

    #[test]
    fn the_fingerprint_is_canonical_json_of_named_parts() {
        // A stored value: changing this string restarts every stored
        // duration-based expiry, so it changes only with a migration.
        assert_eq!(
            fingerprint(&spec()),
            r#"{"expires":"4h","ignoreFields":["connectionLimit"],"paused":true,"reason":"INC-7|pipes","v":1}"#
        );
        let mut resume = spec();
        resume.on_expiry = OnExpiry::Resume;
        assert_eq!(fingerprint(&resume), fingerprint(&spec()));
        let mut other = spec();
        other.reason = "INC-8".into();
        assert_ne!(fingerprint(&other), fingerprint(&spec()));
    }

    #[test]
    fn the_legacy_fingerprint_is_what_format_2_stored() {
        assert_eq!(
            legacy_fingerprint(&spec()),
            r#"true|["connectionLimit"]|INC-7|pipes|Some("4h")"#
        );
    }

    #[test]
    fn an_absurd_duration_expiry_saturates_instead_of_panicking() {
        let mut long = spec();
        long.expires = Some(OverrideExpiry::After(Duration::from_secs(u64::MAX / 4)));
        let input = OverrideInput {
            source: OverrideSource::Annotation,
            spec: long,
            first_seen: SystemTime::now(),
        };
        assert_eq!(input.expires_at(), Some(crate::time::latest()));
        assert!(!effective(&[input], SystemTime::now()).expired);
    }

    /// An expired pause with `on-expiry: resume` holds nothing any more,
    /// and is still reported as the pause it was (not as an ignore-fields
    /// override with no fields).
    #[test]
    fn an_expired_pause_that_resumed_is_reported_as_a_pause() {
        let spec = OverrideSpec {
            paused: true,
            ignore_fields: Vec::new(),
            on_expiry: OnExpiry::Resume,
            ..spec()
        };
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let input = OverrideInput {
            source: OverrideSource::Annotation,
            spec,
            first_seen: start,
        };
        let ov = effective(&[input], start + Duration::from_secs(5 * 3600));
        assert!(ov.expired && ov.resumed && !ov.paused, "{ov:?}");
        assert_eq!(ov.kind(), "paused");
        assert!(ov.declared_fields.is_empty());
    }
}
