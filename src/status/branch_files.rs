//! What the status branch holds: `status/HH/<name>.yaml` per resource,
//! `SUMMARY.md` for a reviewer in the Git web UI, and `agent.yaml`.
//!
//! # Guarantees
//! * The content is a function of what tend observed and decided, and of
//!   nothing that moves every cycle: no report time, no observation time,
//!   no count of failed polls. The same situation renders the same bytes,
//!   so an unchanged fleet makes no commit; when a status commit is made,
//!   its commit time is when tend observed what changed.
//! * A resource's file changes only when that resource's situation does.
//!   Its `decidedFrom` is the source commit at which tend came to what the
//!   file says, not the newest commit: a later commit that changes nothing
//!   for the resource leaves the file (and that field) as it is. A source
//!   commit that touches one declaration of 10,000 changes one status file
//!   and `SUMMARY.md` (which names the newest commit), and `git log` of a
//!   status file is the history of that resource.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;

use super::last_operations::LastOperationOf;
use super::report::{DriftReport, OverrideReport, Report, ResourceReport};
use crate::engine::State;
use crate::journal::{DecidedAt, DecidedFrom};

/// The version of the status branch's layout `agent.yaml` names. A tend
/// that finds a higher one does not write the branch. 2: the resources'
/// files are sharded (`status/HH/NAME.yaml`, see [`file_name`]); 1 had
/// them all in `status/` (rewritten to 2 by the next commit).
pub(crate) const STATUS_FORMAT: u32 = 2;

/// `agent.yaml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentFile {
    pub agent_id: String,
    pub tend_version: String,
    pub status_format: u32,
}

/// `status/HH/<name>.yaml`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceFile<'a> {
    name: &'a str,
    file: &'a str,
    state: &'static str,
    action: &'static str,
    reason: &'a str,
    /// The provider's value of each declared field that differs (every
    /// other declared field was observed as declared).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    observed: BTreeMap<&'a str, &'a Value>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    unobserved: &'a [String],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    drift: &'a [DriftReport],
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    override_: Option<&'a OverrideReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_operation: Option<OperationFile<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    acts_at: Option<&'a str>,
    /// How to keep a change made at the provider in Git.
    #[serde(skip_serializing_if = "Option::is_none")]
    propose: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OperationFile<'a> {
    id: &'a str,
    kind: &'a str,
    result: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    finished_at: String,
}

/// A resource's file on the branch: `status/HH/NAME.yaml`, where `HH` is
/// the first two hexadecimal digits of the SHA-256 of the name (`printf
/// %s NAME | sha256sum | cut -c1-2`).
///
/// Sharded so that a commit's cost follows what changed, not the fleet: a
/// one-resource change rewrites its file, its shard's tree (1/256th of the
/// fleet) and the two trees above, where one flat directory would rewrite
/// a tree object naming every resource (5 MB at 100,000). The name is
/// escaped: names are DNS labels, but a name read back from a damaged
/// state could be anything, and must not leave `status/`.
pub(crate) fn file_name(name: &str) -> String {
    use std::fmt::Write;
    let shard = &crate::model::hash::sha256_hex(name.as_bytes())[..SHARD_DIGITS];
    // Written into one string: a status commit names every resource's
    // file (100,000 of them at scale), and a string per character was a
    // measurable part of it.
    let mut path = String::with_capacity(name.len() + 20);
    path.push_str("status/");
    path.push_str(shard);
    path.push('/');
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            path.push(c);
        } else {
            let _ = write!(path, "%{:02X}", c as u32);
        }
    }
    path.push_str(".yaml");
    path
}

/// Hexadecimal digits of a shard's name: 256 shards.
const SHARD_DIGITS: usize = 2;

const HEADER: &str =
    "# Written by tend from what it observed; do not edit (the next change replaces it).\n";

/// A path's content on the branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileContent {
    /// These bytes.
    Bytes(Vec<u8>),
    /// The blob of this id, already in the repository the branch is
    /// built in: a whole render at 100,000 resources writes each file's
    /// blob as it is made instead of holding 27 MB of files until the
    /// tree is built ([`render`]'s `hold`).
    Blob(git2::Oid),
    /// No file (a resource no longer reported), over the commit the
    /// inputs were last rendered for.
    Removed,
}

/// What a resource's file is a function of: a digest of its fields as
/// the file shows them, and its `decidedFrom` as the state remembers it
/// (or, without one, the source commit). Equal digests render equal bytes.
pub(crate) type InputsDigest = [u8; 32];

/// The inputs kept for a file made from an operation newer than its
/// report (see [`Rendered::ahead`]): no render's (a digest of zeros), so
/// the file is made again by the next render, and kept all the same, so a
/// resource gone by then still has its file removed.
pub(crate) const AHEAD_OF_REPORT: InputsDigest = [0; 32];

/// What [`render`] knows of the last render, and whether to digest this
/// one's inputs for the next.
pub(crate) enum Inputs<'a> {
    /// A one-shot publication: nothing is kept, nothing is digested.
    Forget,
    /// The last render's digests, over the commit it published (`base`;
    /// `None`: every file is rendered), and which report entries are
    /// known to be unchanged since (saying the same, with the same last
    /// operation): their digests are taken as they were, not computed
    /// again. The digests are brought up to date in place: a resource
    /// kept costs nothing.
    Keep {
        base: Option<HashMap<String, InputsDigest>>,
        unchanged: &'a Unchanged<'a>,
        kept: Kept<'a>,
        /// Every operation finished by then is in the report (see
        /// [`Rendered::ahead`]); `None`: every one the state holds is.
        reported_until: Option<SystemTime>,
    },
}

/// The report entries (by place) a caller found kept already: in the last
/// render's digests, with a `decidedFrom` the state remembers, and
/// unchanged (what [`render`] would find itself with three lookups an
/// entry, in maps of 100,000 names at that many resources). `None`: not
/// looked for.
pub(crate) type Kept<'a> = Option<&'a [bool]>;

impl<'a> Inputs<'a> {
    /// The entries known kept over the last render, if any were looked for.
    pub(crate) fn kept(&self) -> Kept<'a> {
        match self {
            Inputs::Keep { kept, .. } => *kept,
            Inputs::Forget => None,
        }
    }
}

/// Whether a report entry is known unchanged since the last render.
/// It is told the entry's place in the report, and the entry.
pub(crate) type Unchanged<'a> = dyn Fn(usize, &ResourceReport) -> bool + 'a;

/// No entry is known unchanged.
pub(crate) fn none_unchanged(_: usize, _: &ResourceReport) -> bool {
    false
}

/// The branch's files as [`render`] made them.
pub(crate) struct Rendered {
    /// The files, by path: every file, or (`over_base`) only those that
    /// differ from the commit the last render's digests were made for.
    pub files: BTreeMap<String, FileContent>,
    /// Whether `files` is what changed over that commit: a resource's
    /// file not named in it is that commit's. At 100,000 resources a
    /// one-resource change then names one file, not 100,000.
    pub over_base: bool,
    /// What changed of each resource's digest and `decidedFrom`: the new
    /// value, or `None` when the state should remember none.
    pub decided: Vec<(String, Option<DecidedAt>)>,
    /// Each resource's inputs, for the next render (empty with
    /// [`Inputs::Forget`]).
    pub inputs: HashMap<String, InputsDigest>,
    /// How many resource files were rendered (the others are kept).
    pub rendered: usize,
    /// How many of them show a last operation that finished after the
    /// report was taken (`reported_until`): the report is behind the
    /// journal there (a cycle that began after it was taken ran the
    /// operation), and its source commit may be older than the one the
    /// operation was run for. Such a file is written, but neither its
    /// inputs ([`AHEAD_OF_REPORT`]) nor its `decidedFrom` are kept: the next render makes it
    /// again, over a report that knows the operation, and it then names
    /// that report's commit. (Kept, the next report's entry would render
    /// the same bytes, and the file would name the older commit until the
    /// resource changed again.)
    pub ahead: usize,
}

/// The branch's files, by path, and what changed of each resource's
/// digest and `decidedFrom` (`decided`: as they were, from the state).
///
/// `inputs`: [`Inputs::Forget`] for a one-shot publication (no input is
/// digested), else each resource's inputs when its file was last rendered
/// for the branch's tip. Over those, only what changed is named: a
/// resource whose inputs are the same is kept as the tip holds it, and a
/// resource no longer reported is [`FileContent::Removed`]. A change to
/// one resource of 100,000 renders one YAML file and names it alone.
///
/// `hold` is given each resource file's bytes as it is rendered and says
/// how the file is kept until the tree is built: as they are
/// ([`FileContent::Bytes`]), or written as a blob ([`FileContent::Blob`]).
pub(crate) fn render(
    report: &Report,
    last_operations: &mut dyn LastOperationOf,
    decided: &DecidedFrom,
    previous: Inputs<'_>,
    hold: &mut dyn FnMut(Vec<u8>) -> FileContent,
) -> Rendered {
    let (keep, previous, unchanged, kept, reported_until): (_, _, &Unchanged<'_>, _, _) =
        match previous {
            Inputs::Forget => (false, None, &none_unchanged, None, None),
            Inputs::Keep {
                base,
                unchanged,
                kept,
                reported_until,
            } => (true, base, unchanged, kept, reported_until),
        };
    // Over the last render's commit, its digests are this render's: a
    // resource kept is left as it is there.
    let over_base = previous.is_some();
    let mut inputs = previous.unwrap_or_default();
    let had_inputs = inputs.len();
    let mut files = BTreeMap::new();
    let mut changes = Vec::new();
    let (mut found_decided, mut found_inputs, mut rendered, mut ahead) = (0, 0, 0, 0);
    // To the millisecond, as the state keeps the times of operations: one
    // finished in the bound's own millisecond may be after it.
    let reported_until = reported_until.map(crate::journal::store::as_kept);
    let mut json = Vec::new();
    let source_commit_id = report.source.commit.as_deref();
    // One id for every file decided at this commit.
    let source_commit: Option<Arc<str>> = source_commit_id.map(Arc::from);
    for (i, r) in report.resources.iter().enumerate() {
        // Found kept by the caller: in both maps, and unchanged.
        if over_base && kept.is_some_and(|kept| kept.get(i) == Some(&true)) {
            found_decided += 1;
            found_inputs += 1;
            continue;
        }
        let was = decided.get(&r.name);
        found_decided += usize::from(was.is_some());
        let before = if over_base {
            inputs.get(&r.name).copied()
        } else {
            None
        };
        found_inputs += usize::from(before.is_some());
        let before = before.filter(|digest| *digest != AHEAD_OF_REPORT);
        // An entry saying the same as at the last render, with the same last
        // operation and `decidedFrom`: its inputs are the same (at
        // 100,000 resources, digesting them all again costs most of a
        // status commit).
        if before.is_some() && was.is_some() && unchanged(i, r) {
            continue;
        }
        let last = last_operations.of(i, &r.name);
        let newer_than_report =
            matches!((last, reported_until), (Some(o), Some(until)) if o.finished_at >= until);
        let op = last.map(|o| OperationFile {
            id: &o.id,
            kind: &o.kind,
            result: &o.result,
            error: o.error.as_deref(),
            finished_at: crate::time::rfc3339(o.finished_at),
        });
        let file = ResourceFile {
            name: &r.name,
            file: &r.file,
            state: r.state.as_str(),
            action: r.action.as_str(),
            reason: &r.reason,
            observed: r
                .drift
                .iter()
                .map(|d| (d.field.as_str(), &d.observed))
                .collect(),
            unobserved: &r.unobserved,
            drift: &r.drift,
            override_: r.override_.as_deref(),
            last_operation: op,
            acts_at: r.acts_at.as_deref(),
            propose: r.propose.as_deref(),
        };
        // As the last render stored them: with the `decidedFrom` it
        // remembered, which is what the state gives now.
        let key = match (before, was) {
            (Some(before), Some(was)) => {
                let key = inputs_of(&mut json, &file, Some(was), source_commit_id);
                if before == key {
                    continue;
                }
                Some(key)
            }
            _ => None,
        };
        rendered += 1;
        let yaml = serde_norway::to_string(&file).unwrap_or_else(|e| format!("error: {e}\n"));
        let digest = crate::model::hash::sha256(yaml.as_bytes());
        let commit = match (was, &source_commit) {
            (Some(was), _) if was.digest == digest => Some(was.commit.clone()),
            (_, Some(now)) => Some(now.clone()),
            (_, None) => None,
        };
        let decided_from = match &commit {
            // Quoted: a commit id of digits and one `e` would read as a
            // number.
            Some(c) => format!("decidedFrom: \"{c}\"\n"),
            None => String::new(),
        };
        files.insert(
            file_name(&r.name),
            hold(format!("{HEADER}{decided_from}{yaml}").into_bytes()),
        );
        if newer_than_report {
            // Made again by the next render (see `Rendered::ahead`).
            ahead += 1;
            if keep {
                inputs.insert(r.name.clone(), AHEAD_OF_REPORT);
            }
            continue;
        }
        let now = commit.map(|commit| DecidedAt { digest, commit });
        // What the next render compares: these fields, with the
        // `decidedFrom` remembered from this one (the digest above, when
        // that did not change). A file with no `decidedFrom` to remember
        // (no source commit) is made again by the next render, as one
        // ahead of its report: any other digest kept stands for a row of
        // the state, and a one-shot reads the rows of the files it renders
        // alone.
        if keep {
            let key = match key {
                _ if now.is_none() => AHEAD_OF_REPORT,
                Some(key) if now.as_ref() == was => key,
                _ => inputs_of(&mut json, &file, now.as_ref(), source_commit_id),
            };
            inputs.insert(r.name.clone(), key);
        }
        if now.as_ref() != was {
            changes.push((r.name.clone(), now));
        }
    }
    // Resources no longer reported: their files go, and so does what the
    // state remembers of them (looked for only when some are missing).
    if found_inputs < had_inputs || found_decided < decided.len() {
        let reported: std::collections::HashSet<&str> =
            report.resources.iter().map(|r| r.name.as_str()).collect();
        if found_inputs < had_inputs {
            inputs.retain(|name, _| {
                let stays = reported.contains(name.as_str());
                if !stays {
                    files.insert(file_name(name), FileContent::Removed);
                }
                stays
            });
        }
        let mut gone: Vec<&String> = decided
            .keys()
            .filter(|name| !reported.contains(name.as_str()))
            .collect();
        gone.sort();
        changes.extend(gone.into_iter().map(|name| (name.clone(), None)));
    }
    let agent = AgentFile {
        agent_id: report.agent.id.clone(),
        tend_version: report.agent.version.clone(),
        status_format: STATUS_FORMAT,
    };
    let yaml = serde_norway::to_string(&agent).unwrap_or_default();
    files.insert(
        "agent.yaml".into(),
        FileContent::Bytes(format!("{HEADER}{yaml}").into_bytes()),
    );
    files.insert(
        "SUMMARY.md".into(),
        FileContent::Bytes(summary(report).into_bytes()),
    );
    Rendered {
        files,
        over_base,
        decided: changes,
        inputs,
        rendered,
        ahead,
    }
}

/// The [`InputsDigest`] of `file`: its fields (as JSON, written into
/// `json`, a buffer reused from one resource to the next: several times
/// cheaper than the YAML the branch holds), and what the state remembers
/// of its `decidedFrom` (or, without it, the source commit).
fn inputs_of(
    json: &mut Vec<u8>,
    file: &ResourceFile<'_>,
    decided: Option<&DecidedAt>,
    commit: Option<&str>,
) -> InputsDigest {
    use sha2::Digest;
    json.clear();
    // A value that does not serialise would render as an error line, and
    // must not match another's inputs.
    if serde_json::to_writer(&mut *json, file).is_err() {
        json.extend_from_slice(b"\0unserialisable");
    }
    let mut hasher = sha2::Sha256::new();
    hasher.update(&json[..]);
    // The source commit shows in the file only when the state remembers
    // no `decidedFrom` for it (a later commit that changes nothing for the
    // resource leaves its file as it is).
    // (The digest as the hex the state stores: the same inputs digest as
    // when it was kept as a string.)
    let digest = decided.map(DecidedAt::digest_hex);
    let parts = match (decided, &digest) {
        (Some(decided), Some(digest)) => [digest.as_str(), &*decided.commit, ""],
        _ => ["", "", commit.unwrap_or("")],
    };
    for part in parts {
        hasher.update(b"\0");
        hasher.update(part.as_bytes());
    }
    hasher.finalize().into()
}

/// Orders resources for a reviewer: what needs a human first.
fn urgency(state: State) -> u8 {
    match state {
        State::Blocked | State::Stalled | State::Failed => 0,
        State::Unconvergeable | State::Error => 1,
        State::Drifted | State::Missing | State::Deleting | State::Overridden => 2,
        State::InSync | State::Released => 3,
    }
}

/// Text outside code spans.
fn md(s: &str) -> String {
    crate::escape::markdown(s)
}

/// Text inside a code span.
fn md_code(s: &str) -> String {
    crate::escape::markdown_code(s)
}

/// `SUMMARY.md`: counts, the resources (blocked and stalled first), the
/// active overrides with reason and expiry; each list at most
/// [`SUMMARY_ROWS`] long.
fn summary(report: &Report) -> String {
    use std::fmt::Write;
    let s = &report.summary;
    let mut out = String::new();
    let _ = writeln!(out, "# tend status: `{}`\n", md_code(&report.agent.id));
    let _ = writeln!(
        out,
        "Decided from commit `{}` of `{}` (branch `{}`).\n",
        md_code(report.source.commit.as_deref().unwrap_or("none")),
        md_code(&report.source.url),
        md_code(&report.source.branch)
    );
    if let Some(e) = &report.source.error {
        let _ = writeln!(
            out,
            "> **The source is failing** (since {}): {}. The commit above is the last one tend accepted.\n",
            e.since,
            md(&e.message)
        );
    }
    let _ = writeln!(
        out,
        "{}: {} in sync, {} drifted, {} missing, {} blocked, {} overridden, {} deleting, {} errors.\n",
        s.resources(),
        s.in_sync,
        s.drifted,
        s.missing,
        s.blocked,
        s.overridden,
        s.deleting,
        s.errors
    );
    let mut ordered: Vec<&ResourceReport> = report.entries().collect();
    ordered.sort_by_key(|r| (urgency(r.state), r.name.as_str()));
    let _ = writeln!(out, "| resource | state | action | reason |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    for r in ordered.iter().take(SUMMARY_ROWS) {
        let _ = writeln!(
            out,
            "| [`{}`]({}) | {} | {} | {} |",
            md_code(&r.name),
            file_name(&r.name),
            r.state.as_str(),
            r.action.as_str(),
            md(&r.reason)
        );
    }
    if let Some(rest) = ordered.get(SUMMARY_ROWS..).filter(|r| !r.is_empty()) {
        let quiet = rest.iter().filter(|r| urgency(r.state) == 3).count();
        let _ = writeln!(
            out,
            "\n{} more resources are not listed here ({quiet} of them in sync or released; the most urgent come first above). Each one's file is `status/HH/NAME.yaml`, `HH` the first two hexadecimal digits of the SHA-256 of `NAME`.",
            rest.len()
        );
    }
    let overrides: Vec<(&ResourceReport, &OverrideReport)> = ordered
        .iter()
        .filter_map(|r| r.override_.as_deref().map(|o| (*r, o)))
        .collect();
    if !overrides.is_empty() {
        let _ = writeln!(out, "\n## Active overrides\n");
        let _ = writeln!(out, "| resource | kind | source | reason | expires |");
        let _ = writeln!(out, "| --- | --- | --- | --- | --- |");
        let more = overrides.len().saturating_sub(SUMMARY_ROWS);
        for (r, o) in overrides.into_iter().take(SUMMARY_ROWS) {
            let expires = match (&o.expires, o.expired) {
                (Some(t), true) => format!("**expired** {t}"),
                (Some(t), false) => t.clone(),
                (None, _) => "never".into(),
            };
            let fields = if o.fields.is_empty() {
                String::new()
            } else {
                format!(" `{}`", md_code(&o.fields.join(", ")))
            };
            let _ = writeln!(
                out,
                "| `{}` | {}{fields} | {} | {} | {expires} |",
                md_code(&r.name),
                o.kind,
                o.source,
                md(&o.reason)
            );
        }
        more_not_listed(&mut out, more, "active overrides");
    }
    let kept: Vec<&&ResourceReport> = ordered.iter().filter(|r| r.propose.is_some()).collect();
    if !kept.is_empty() {
        let _ = writeln!(out, "\n## Changes made at the provider, to keep in Git\n");
        let more = kept.len().saturating_sub(SUMMARY_ROWS);
        for r in kept.into_iter().take(SUMMARY_ROWS) {
            let _ = writeln!(
                out,
                "- `{}`: to keep this change, run `{}`",
                md_code(&r.name),
                md_code(r.propose.as_deref().unwrap_or_default())
            );
        }
        more_not_listed(&mut out, more, "changes to keep");
    }
    if !report.errors.is_empty() {
        let _ = writeln!(out, "\n## Declaration errors\n");
        for e in report.errors.iter().take(SUMMARY_ROWS) {
            let _ = writeln!(
                out,
                "- `{}:{}:{}`: {}",
                md_code(&e.file),
                e.line,
                e.column,
                md(&e.message)
            );
        }
        more_not_listed(
            &mut out,
            report.errors.len().saturating_sub(SUMMARY_ROWS),
            "declaration errors (`tend validate` lists them all)",
        );
    }
    out
}

/// The most rows one list of `SUMMARY.md` shows, the most urgent first: a
/// page a reviewer reads in the Git web UI at any fleet size (each
/// resource's own file says the rest).
const SUMMARY_ROWS: usize = 200;

/// The line that ends a list cut at [`SUMMARY_ROWS`].
fn more_not_listed(out: &mut String, more: usize, what: &str) {
    use std::fmt::Write;
    if more > 0 {
        let _ = writeln!(out, "\n{more} more {what} are not listed here.");
    }
}

/// The status commit's message: the counts and the source commit.
pub(crate) fn commit_message(report: &Report) -> String {
    let s = &report.summary;
    let commit = report.source.commit.as_deref().unwrap_or("none");
    let short = commit.get(..12).unwrap_or(commit);
    format!(
        "tend status at {short}: {}, {} in sync, {} drifted, {} missing, {} blocked, {} overridden, {} deleting, {} errors\n\nDecided from commit {commit} of {} (branch {}) by agent {}, tend {}.\n",
        s.resources(),
        s.in_sync,
        s.drifted,
        s.missing,
        s.blocked,
        s.overridden,
        s.deleting,
        s.errors,
        report.source.url,
        report.source.branch,
        report.agent.id,
        report.agent.version
    )
}

#[cfg(test)]
#[path = "branch_files_tests.rs"]
pub(crate) mod tests;
