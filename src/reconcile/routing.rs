//! Subjects of a cycle and where they live: the snapshot's declarations,
//! the tombstones of removed ones, and managed resources that just left
//! Git, each routed to its provider.
//!
//! Pure: reads the configuration, the snapshot and the inputs; returns the
//! routed subjects, the diagnostics of declarations that cannot be routed,
//! the resources that cannot be decided at all (reported `Error`), and the
//! tombstone effects for the planner to commit.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Value;

use super::inputs::Inputs;
use super::{PlannedResource, PlannedSubject, Scope};
use crate::config::{Config, ProviderKind};
use crate::engine::deletion::is_due;
use crate::engine::{Action, Decision, Policy, Rule, State, Tombstone};
use crate::journal::effects::Effect;
use crate::model::{Declaration, Diagnostic, ManagedDatabase, SpecHash};
use crate::provider::Observed;
use crate::source::Snapshot;

/// A subject and the database it is about at its provider.
#[derive(Debug)]
pub(crate) struct Routed<'s> {
    pub subject: PlannedSubject<'s>,
    /// Borrowed from the declaration where it has one.
    pub database_name: Cow<'s, str>,
    /// A declaration's position in the snapshot (its memory is taken by
    /// it: see `Memories::align`).
    pub position: Option<usize>,
}

/// The subjects of a cycle, routed.
#[derive(Debug, Default)]
pub(crate) struct Routing<'s> {
    pub by_provider: BTreeMap<String, Vec<Routed<'s>>>,
    /// Declarations that cannot be planned (no such provider, a field the
    /// provider does not manage).
    pub diagnostics: Vec<Diagnostic>,
    /// Resources decided `Error` without observing (unreadable state, a
    /// removed declaration whose provider is gone).
    pub undecidable: Vec<PlannedResource<'s>>,
    /// Removed declarations whose deletion is due, in or out of scope (the
    /// mass-deletion guard counts the whole fleet), at a configured provider.
    pub due_deletions: Vec<String>,
    pub effects: Vec<Effect>,
    /// Renames: a removed declaration with `deletionPolicy: Delete` and a
    /// live one naming the same database at the same provider, each name
    /// to the other's (in or out of scope: a cycle woken for the removed
    /// one alone must still see the live one).
    pub renamed: HashMap<String, String>,
}

fn provider_names(config: &Config) -> String {
    config
        .providers
        .keys()
        .cloned()
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which provider a declaration uses (`spec.provider`, or the only one).
pub(crate) fn provider_name_of<'c>(
    config: &'c Config,
    manifest: &ManagedDatabase,
) -> Result<&'c str, String> {
    match &manifest.spec.provider {
        Some(name) => config
            .providers
            .get_key_value(&**name)
            .map(|(k, _)| k.as_str())
            .ok_or_else(|| {
                format!(
                    "spec.provider `{name}` is not configured: configured providers are {}",
                    provider_names(config)
                )
            }),
        None if config.providers.len() == 1 => Ok(config
            .providers
            .keys()
            .next()
            .map(String::as_str)
            .unwrap_or("")),
        None => Err(format!(
            "spec.provider is required when several providers are configured ({})",
            provider_names(config)
        )),
    }
}

/// [`provider_name_of`], and whether that provider manages every field the
/// declaration sets.
pub(crate) fn provider_of<'c>(config: &'c Config, decl: &Declaration) -> Result<&'c str, String> {
    let name = provider_name_of(config, &decl.manifest)?;
    manages_every_field(config.providers[name].kind(), name, decl)?;
    Ok(name)
}

/// Whether provider `name`, of `kind`, manages every field `decl` sets.
fn manages_every_field(kind: ProviderKind, name: &str, decl: &Declaration) -> Result<(), String> {
    // The normalised spec has the fields the manifest sets (and the
    // database name): no second serialisation of the spec per cycle.
    if kind == ProviderKind::Postgres {
        let spec = &decl.normalized_spec;
        let dbaas: Vec<&str> = crate::model::FIELDS
            .iter()
            .filter(|f| f.scope == crate::model::fields::Scope::Dbaas && spec.contains_key(f.name))
            .map(|f| f.name)
            .collect();
        if !dbaas.is_empty() {
            let (verb, pronoun) = if dbaas.len() == 1 {
                ("is", "it")
            } else {
                ("are", "them")
            };
            return Err(format!(
                "spec.{} {verb} DBaaS-only: provider `{name}` (postgres) does not manage {pronoun}; remove {pronoun} or use an http provider",
                dbaas.join(", spec."),
            ));
        }
    }
    Ok(())
}

/// A resource decided `Error` by `rule` without being observed.
pub(crate) fn undecidable<'s>(
    name: &str,
    provider: &str,
    rule: Rule,
    reason: String,
) -> PlannedResource<'s> {
    PlannedResource {
        name: name.to_string(),
        subject: PlannedSubject::Unreadable,
        file: Default::default(),
        provider: Arc::from(provider),
        spec_hash: SpecHash::from(""),
        observed: Observed::Failed("not observed".into()),
        memory: std::sync::Arc::default(),
        decision: Decision::new(State::Error, Action::None, rule, reason),
        operation: None,
    }
}

impl<'s> Routing<'s> {
    fn push(&mut self, provider: &str, routed: Routed<'s>) {
        // The provider's name is copied once a cycle, not once a subject.
        match self.by_provider.get_mut(provider) {
            Some(subjects) => subjects.push(routed),
            None => {
                self.by_provider.insert(provider.to_string(), vec![routed]);
            }
        }
    }

    /// Routes the subjects of a cycle over `snapshot` at `now`; with
    /// `only`, the declarations it names (and the tombstones in scope), for
    /// a pass that decides again what a cycle's operations changed: its
    /// caller keeps every other decision, and the declaration problems of
    /// the first pass (which depend on the configuration and the snapshot
    /// alone). Those declarations are found by name, not walked: walking
    /// 10,000 of them to decide one again was most of a one-file `tend
    /// apply`'s second pass.
    pub(crate) fn route(
        config: &Config,
        policy: &Policy,
        snapshot: &'s Snapshot,
        inputs: &mut Inputs,
        scope: &Scope,
        now: SystemTime,
        only: Option<&HashSet<String>>,
    ) -> Self {
        let mut routing = Routing::default();
        // A provider worker's cycle passes over the declarations of every
        // other configured provider (their own cycles report a
        // declaration's problems): it takes the snapshot's group of its
        // own, and those naming no configured provider.
        let all = &snapshot.declarations.declarations;
        let grouped;
        // The provider every routed declaration names, when that is known
        // without asking each: its name is then not looked up in the
        // configuration once a declaration (10,000 lookups a cycle).
        let mut named_by_all = None;
        let mut named: Vec<usize>;
        let routed: Box<dyn Iterator<Item = (usize, &Arc<Declaration>)>> = match (only, scope) {
            (Some(only), _) => {
                named = only
                    .iter()
                    .filter_map(|n| snapshot.position_of(n))
                    .collect();
                // In the snapshot's order, as a walk would give them.
                named.sort_unstable();
                Box::new(named.iter().map(|&at| (at, &all[at])))
            }
            (None, Scope::Provider { provider, .. }) => {
                grouped = snapshot.routed_by(provider, |name| config.providers.contains_key(name));
                if let (std::borrow::Cow::Borrowed(_), Some((name, configured))) =
                    (&grouped, config.providers.get_key_value(provider.as_str()))
                {
                    named_by_all = Some((name.as_str(), configured.kind()));
                }
                // Sized once: a provider's subjects are most of what it
                // routes.
                routing
                    .by_provider
                    .insert(provider.to_string(), Vec::with_capacity(grouped.len()));
                Box::new(grouped.iter().map(|&at| (at, &all[at])))
            }
            (None, _) => Box::new(all.iter().enumerate()),
        };
        // A declaration out of scope is still checked for its provider:
        // every cycle reports the fleet's declaration problems, so a
        // cycle over some names (due times, a commit's changes) never
        // drops another declaration's error from the merged report.
        for (position, decl) in routed {
            let provider = match named_by_all {
                Some((name, kind)) => manages_every_field(kind, name, decl).map(|()| name),
                None => provider_of(config, decl),
            };
            match provider {
                Ok(provider) if !scope.admits(decl.name(), provider) => {}
                Ok(provider) => {
                    let routed = Routed {
                        subject: PlannedSubject::Declared(decl),
                        database_name: decl.database_name(),
                        position: Some(position),
                    };
                    routing.push(provider, routed);
                }
                Err(message) => routing.diagnostics.push(Diagnostic {
                    file: decl.file.clone(),
                    line: decl.line,
                    column: decl.column,
                    message,
                }),
            }
        }
        // (A provider with nothing routed has no entry, as before it was
        // sized.)
        routing
            .by_provider
            .retain(|_, subjects| !subjects.is_empty());
        // Where each database is declared, for renames: only a cycle with
        // removed declarations needs it (a map of the whole fleet is not
        // built for nothing every cycle).
        let mut declared_at: HashMap<(&str, String), &str> = HashMap::new();
        let removals = !inputs.tombstones.is_empty() || !inputs.left_git.is_empty();
        for decl in snapshot
            .declarations
            .declarations
            .iter()
            .filter(|_| removals)
        {
            if let Ok(provider) = provider_name_of(config, &decl.manifest) {
                declared_at.insert((provider, decl.manifest.database_name()), decl.name());
            }
        }
        routing.route_tombstones(config, policy, snapshot, inputs, scope, now, &declared_at);
        routing.route_corrupt(inputs, scope);
        routing
    }

    /// Routes every removed declaration in scope to where tend manages it
    /// (a provider no longer configured is reported); counts the fleet's
    /// due deletions.
    #[allow(clippy::too_many_arguments)]
    fn route_tombstones(
        &mut self,
        config: &Config,
        policy: &Policy,
        snapshot: &'s Snapshot,
        inputs: &mut Inputs,
        scope: &Scope,
        now: SystemTime,
        declared_at: &HashMap<(&str, String), &str>,
    ) {
        let tombstones = self.tombstones(policy, snapshot, inputs, now);
        for tomb in tombstones {
            let name = tomb.last.metadata.name.clone();
            // Where tend manages it, else where the declaration said.
            let remembered = inputs
                .memories
                .get(&name)
                .and_then(|m| m.provider.as_deref().map(str::to_string));
            let provider = match remembered {
                Some(p) if config.providers.contains_key(&p) => Ok(p),
                Some(p) => Err(p),
                None => provider_name_of(config, &tomb.last)
                    .map(str::to_string)
                    .map_err(|_| {
                        tomb.last
                            .spec
                            .provider
                            .as_deref()
                            .unwrap_or_default()
                            .to_string()
                    }),
            };
            let renamed_to = match &provider {
                Ok(p) if tomb.last.spec.deletion_policy == crate::model::DeletionPolicy::Delete => {
                    declared_at
                        .get(&(p.as_str(), tomb.last.database_name()))
                        .copied()
                }
                _ => None,
            };
            if let Some(other) = renamed_to {
                self.renamed.insert(name.clone(), other.to_string());
                self.renamed.insert(other.to_string(), name.clone());
            }
            // Counted fleet-wide, whatever the scope; a deletion that can
            // never run (its provider is gone, or a rename holds it until
            // an operator approves it) does not count.
            let held_by_rename = renamed_to.is_some() && !inputs.approvals.contains_key(&name);
            if provider.is_ok() && !held_by_rename && is_due(&tomb, policy, now) {
                self.due_deletions.push(name.clone());
            }
            if !scope.contains(&name) {
                continue;
            }
            match provider {
                Ok(provider) if !scope.admits(&name, &provider) => {}
                Ok(provider) => {
                    let routed = Routed {
                        database_name: Cow::Owned(tomb.last.database_name()),
                        subject: PlannedSubject::Removed(Box::new(tomb)),
                        position: None,
                    };
                    self.push(&provider, routed);
                }
                Err(gone) => self.undecidable.push(undecidable(
                    &name,
                    &gone,
                    Rule::ProviderNotConfigured,
                    format!(
                        "`{name}` was removed from Git, but its provider `{gone}` is no longer configured; nothing is released or deleted until [providers.{gone}] is configured again"
                    ),
                )),
            }
        }
    }

    /// Every removed declaration: the stored tombstones (a declaration that
    /// came back clears its own), and new ones for managed resources that
    /// left Git.
    fn tombstones(
        &mut self,
        policy: &Policy,
        snapshot: &Snapshot,
        inputs: &mut Inputs,
        now: SystemTime,
    ) -> Vec<Tombstone> {
        let mut tombstones: Vec<Tombstone> = Vec::new();
        for row in std::mem::take(&mut inputs.tombstones) {
            if snapshot.declared(&row.name).is_some() {
                self.effects
                    .push(Effect::RemoveTombstone { name: row.name });
                continue;
            }
            tombstones.push(Tombstone {
                last: row.last,
                removed_at: row.removed_at,
                removal_commit: row.removal_commit,
                delete_requested_at: row.delete_requested_at,
                last_error: row.last_error,
            });
        }
        // An empty tree never removes anything: it is far more likely a
        // mistake than the end of every database. A file that fails to
        // parse (or holds a duplicate) does not prove its declarations
        // were removed either.
        use crate::sabotage::Sabotage;
        let tree_empty = snapshot.declarations.declarations.is_empty()
            && !policy.sabotaged(Sabotage::EmptyTreeNotGuarded);
        for left in std::mem::take(&mut inputs.left_git) {
            let unreadable = snapshot
                .declarations
                .diagnostics
                .iter()
                .any(|d| d.file.to_string_lossy() == left.file)
                && !policy.sabotaged(Sabotage::UnparsableFileTombstoned);
            if tree_empty || unreadable {
                continue;
            }
            let manifest = serde_json::to_value(&left.last).unwrap_or(Value::Null);
            self.effects.push(Effect::AddTombstone {
                name: left.name.clone(),
                manifest,
                at: now,
                commit: snapshot.commit.clone(),
            });
            tombstones.push(Tombstone {
                last: left.last,
                removed_at: now,
                removal_commit: snapshot.commit.clone(),
                delete_requested_at: None,
                last_error: None,
            });
        }
        tombstones
    }

    /// Resources whose remembered state cannot be read.
    fn route_corrupt(&mut self, inputs: &Inputs, scope: &Scope) {
        for (name, problems) in &inputs.corrupt {
            if !scope.contains(name) {
                continue;
            }
            // A declared resource is still observed (the report shows what
            // is there); the planner decides it `Error`. Others have no
            // subject to observe.
            let subject_routed = self
                .by_provider
                .values()
                .flatten()
                .any(|r| r.subject.name() == name);
            if !subject_routed {
                self.undecidable.push(undecidable(
                    name,
                    "",
                    Rule::CorruptState,
                    corrupt_reason(name, problems),
                ));
            }
        }
    }
}

/// The reason of a resource whose state cannot be read.
pub(crate) fn corrupt_reason(name: &str, problems: &[String]) -> String {
    format!(
        "what tend remembers of `{name}` cannot be read ({}); tend takes no action on it until the state is repaired: run `tend state check`, see docs/runbooks/rollback.md",
        problems.join("; ")
    )
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;
