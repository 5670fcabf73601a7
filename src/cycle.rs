//! Cycles: load the snapshot, observe, decide (`plan`); and act on the
//! decisions through the executor (`apply`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Value;

use crate::config::{Config, ProviderKind};
use crate::engine::desired::desired_fields;
use crate::engine::{
    Action, DecideInput, Decision, DriftOrigin, Memory, OverrideInput, OverrideSource, Subject,
    Tombstone, decide,
};
use crate::executor::{
    ExecContext, ExecLimits, JournalRequest, OpOutcome, PlannedOperation, RequestBody, operation,
};
use crate::journal::{StateError, StateLock, StateStore, StoredMemories};
use crate::model::{Declaration, DeclarationSet, Diagnostic, ManagedDatabase, SpecHash};
use crate::provider::postgres::{PostgresProvider, PostgresSettings};
use crate::provider::sandbox::SandboxProvider;
use crate::provider::{
    AnyProvider, ChangeRequest, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, Observed,
    OperationId, OperationKind, Provider,
};
use crate::source::{Snapshot, Source, SourceError};

/// A problem that stops a cycle before any decision.
#[derive(Debug, thiserror::Error)]
pub enum CycleError {
    #[error(
        "provider `{provider}` (kind {kind}) is not available in this build yet; use kind = \"sandbox\""
    )]
    UnsupportedProvider { provider: String, kind: String },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("provider `{provider}`: {message}")]
    Provider { provider: String, message: String },
    #[error("source: {error}")]
    Source {
        #[from]
        error: SourceError,
    },
    #[error("{error}")]
    State {
        #[from]
        error: StateError,
    },
}

/// What a planned resource is about. Boxed: a cycle moves thousands of
/// these through several lists, and a pointer moves cheaper than a
/// declaration.
#[derive(Debug, Clone)]
pub enum PlannedSubject {
    Declared(Box<Declaration>),
    Removed(Box<Tombstone>),
}

/// The decision for one resource with everything a report shows.
#[derive(Debug, Clone)]
pub struct PlannedResource {
    pub name: String,
    pub subject: PlannedSubject,
    /// Path of the file relative to the repository root.
    pub file: String,
    pub provider: String,
    pub spec_hash: SpecHash,
    pub observed: Observed,
    pub memory: Memory,
    pub decision: Decision,
    /// The id the executor uses for the decision's action.
    pub operation: Option<(OperationKind, OperationId)>,
}

impl PlannedResource {
    pub fn declaration(&self) -> Option<&Declaration> {
        match &self.subject {
            PlannedSubject::Declared(d) => Some(d),
            PlannedSubject::Removed(_) => None,
        }
    }

    fn manifest(&self) -> &ManagedDatabase {
        match &self.subject {
            PlannedSubject::Declared(d) => &d.manifest,
            PlannedSubject::Removed(t) => &t.last,
        }
    }
}

/// The outcome of observing and deciding.
#[derive(Debug, Clone)]
pub struct Plan {
    /// This installation's agent id.
    pub agent_id: String,
    /// The source commit the declarations come from.
    pub commit: Option<String>,
    pub resources: Vec<PlannedResource>,
    /// Declaration files that failed to parse, or were not assigned a provider.
    pub errors: Vec<Diagnostic>,
    /// Declarations that could not be planned (no such provider); kept so
    /// a later pass over the same snapshot still counts them as declared.
    pub unplanned: Vec<Declaration>,
    pub now: SystemTime,
}

/// The configured providers, built.
pub type Providers = BTreeMap<String, Arc<AnyProvider>>;

/// The sandbox provider a config names.
pub fn sandbox_provider(config: &Config, name: &str) -> Result<SandboxProvider, CycleError> {
    let p = &config.providers[name];
    match p.kind {
        ProviderKind::Sandbox => Ok(SandboxProvider::new(
            name,
            &config.state_dir,
            p.provisioning_delay,
            p.faults.clone(),
        )),
        kind => Err(CycleError::UnsupportedProvider {
            provider: name.to_string(),
            kind: format!("{kind:?}").to_lowercase(),
        }),
    }
}

/// Builds every configured provider.
pub fn providers(config: &Config) -> Result<Providers, CycleError> {
    config
        .providers
        .iter()
        .map(|(name, p)| {
            let provider = match p.kind {
                ProviderKind::Sandbox => {
                    AnyProvider::Sandbox(Box::new(sandbox_provider(config, name)?))
                }
                ProviderKind::Postgres => {
                    let password = match &p.password_file {
                        Some(file) => Some(
                            std::fs::read_to_string(file)
                                .map_err(|e| CycleError::Provider {
                                    provider: name.clone(),
                                    message: format!(
                                        "cannot read password_file {}: {e}",
                                        file.display()
                                    ),
                                })?
                                .trim_end_matches(['\n', '\r'])
                                .to_string(),
                        ),
                        None => None,
                    };
                    let settings = PostgresSettings {
                        url: p.url.clone().unwrap_or_default(),
                        password,
                        create_owner: p.create_owner,
                        force_drop: p.force_drop,
                        max_connections: p.max_concurrency,
                        tls_ca_file: p.tls_ca_file.clone(),
                    };
                    AnyProvider::Postgres(Box::new(PostgresProvider::new(settings).map_err(
                        |message| CycleError::Provider {
                            provider: name.clone(),
                            message,
                        },
                    )?))
                }
                kind => {
                    return Err(CycleError::UnsupportedProvider {
                        provider: name.clone(),
                        kind: format!("{kind:?}").to_lowercase(),
                    });
                }
            };
            Ok((name.clone(), Arc::new(provider)))
        })
        .collect()
}

fn provider_names(config: &Config) -> String {
    config
        .providers
        .keys()
        .cloned()
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which provider a declaration uses (`spec.provider`, or the only one),
/// and whether that provider understands every field it sets.
fn provider_of<'a>(config: &'a Config, manifest: &ManagedDatabase) -> Result<&'a str, String> {
    let name = provider_name_of(config, manifest)?;
    if config.providers[name].kind == ProviderKind::Postgres
        && let Ok(Value::Object(spec)) = serde_json::to_value(&manifest.spec)
    {
        let dbaas: Vec<&str> = crate::model::FIELDS
            .iter()
            .filter(|f| f.scope == crate::model::fields::Scope::Dbaas && spec.contains_key(f.name))
            .map(|f| f.name)
            .collect();
        if !dbaas.is_empty() {
            return Err(format!(
                "spec.{} {} DBaaS-only: provider `{name}` (postgres) does not manage {}; remove {} or use an http provider",
                dbaas.join(", spec."),
                if dbaas.len() == 1 { "is" } else { "are" },
                if dbaas.len() == 1 { "it" } else { "them" },
                if dbaas.len() == 1 { "it" } else { "them" },
            ));
        }
    }
    Ok(name)
}

fn provider_name_of<'a>(config: &'a Config, manifest: &ManagedDatabase) -> Result<&'a str, String> {
    match &manifest.spec.provider {
        Some(name) => config
            .providers
            .get_key_value(name)
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

fn runtime() -> Result<tokio::runtime::Runtime, CycleError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CycleError::Runtime)
}

/// Fetches the source once. `persist`: advance the accepted commit (writers).
pub fn snapshot_once(
    config: &Config,
    now: SystemTime,
    persist: bool,
) -> Result<Arc<Snapshot>, CycleError> {
    let source = Source::open(&config.state_dir, config.source_settings()?, persist)?;
    let outcome = source.poll_once(now);
    match (outcome.snapshot, outcome.failure) {
        (Some(snapshot), _) => Ok(snapshot),
        (None, Some(failure)) => Err(failure.error.into()),
        (None, None) => Err(SourceError::Fetch {
            url: config.source.url.clone(),
            message: "no snapshot and no error".into(),
        }
        .into()),
    }
}

/// One read-only cycle: snapshot, observe, decide. Reads the state dir
/// (memory, tombstones) without writing it; safe beside a running writer.
pub fn plan(config: &Config, now: SystemTime) -> Result<Plan, CycleError> {
    let started = std::time::Instant::now();
    let store = StateStore::open(&config.state_dir, false)?;
    let (snapshot, preloaded) = snapshot_and_memories(config, now, false, store.as_ref());
    let snapshot = snapshot?;
    tracing::debug!("snapshot: {:?}", started.elapsed());
    let agent_id = match &store {
        Some(s) => s.meta("agent_id")?.or_else(|| config.agent_id.clone()),
        None => config.agent_id.clone(),
    }
    .unwrap_or_else(|| config.agent_id());
    let providers = providers(config)?;
    let mut snapshot = Arc::unwrap_or_clone(snapshot);
    let declarations = std::mem::take(&mut snapshot.declarations.declarations);
    runtime()?.block_on(observe_and_decide(
        config,
        &snapshot,
        declarations,
        store.as_ref(),
        &agent_id,
        &providers,
        now,
        false,
        preloaded,
    ))
}

/// The snapshot, and every resource's memory read on another thread
/// meanwhile (the fetch waits on the network; the read does not need the
/// declarations). A failed read is not an error here: the cycle reads
/// the memory again and reports that.
fn snapshot_and_memories(
    config: &Config,
    now: SystemTime,
    persist: bool,
    store: Option<&StateStore>,
) -> (Result<Arc<Snapshot>, CycleError>, Option<StoredMemories>) {
    std::thread::scope(|scope| {
        let reader = store.map(|s| {
            scope.spawn(|| {
                // The executor's rate limiters share a clock that calibrates
                // itself on first use (a busy loop of a few milliseconds):
                // done here, off the cycle's path.
                let _ = governor::clock::DefaultClock::default();
                s.read_memories()
            })
        });
        let snapshot = snapshot_once(config, now, persist);
        let memories = reader.and_then(|r| r.join().ok()).and_then(Result::ok);
        (snapshot, memories)
    })
}

/// The subjects of a cycle: the snapshot's declarations, and tombstones for
/// managed resources no longer declared. With `persist`, new tombstones
/// are written and returning declarations clear theirs.
fn subjects(
    snapshot: &Snapshot,
    declarations: &[Declaration],
    memories: &std::collections::HashMap<String, Memory>,
    store: Option<&StateStore>,
    now: SystemTime,
    persist: bool,
) -> Result<Vec<Tombstone>, StateError> {
    let set: &DeclarationSet = &snapshot.declarations;
    let declared: std::collections::HashSet<&str> = declarations.iter().map(|d| d.name()).collect();
    let mut tombstones = Vec::new();
    if let Some(store) = store {
        let stored = store.tombstones()?;
        for row in &stored {
            if declared.contains(row.name.as_str()) {
                if persist {
                    store.remove_tombstone(&row.name)?;
                }
                continue;
            }
            if let Ok(last) = serde_json::from_value::<ManagedDatabase>(row.manifest.clone()) {
                tombstones.push(Tombstone {
                    last,
                    removed_at: row.removed_at,
                    removal_commit: row.removal_commit.clone(),
                    delete_requested_at: row.delete_requested_at,
                    last_error: row.last_error.clone(),
                });
            }
        }
        // An empty tree never removes anything: it is far more likely a
        // mistake than the end of every database.
        if !declarations.is_empty() {
            // Managed and no longer declared: found from the memory already
            // loaded, so only those few rows are read again.
            let gone: Vec<&String> = memories
                .iter()
                .filter(|(name, m)| m.existed && !declared.contains(name.as_str()))
                .map(|(name, _)| name)
                .collect();
            for managed in gone {
                let managed = managed.clone();
                let already = stored.iter().any(|t| t.name == managed);
                let Some((manifest, file)) = store.manifest_and_file(&managed)? else {
                    continue;
                };
                // A file that fails to parse (or holds a duplicate) does not
                // prove its declarations were removed.
                let unreadable = set
                    .diagnostics
                    .iter()
                    .any(|d| d.file.to_string_lossy() == file);
                if already || unreadable {
                    continue;
                }
                let Ok(last) = serde_json::from_value::<ManagedDatabase>(manifest.clone()) else {
                    continue;
                };
                if persist {
                    store.add_tombstone(&managed, &manifest, now, &snapshot.commit)?;
                }
                tombstones.push(Tombstone {
                    last,
                    removed_at: now,
                    removal_commit: snapshot.commit.clone(),
                    delete_requested_at: None,
                    last_error: None,
                });
            }
        }
    }
    Ok(tombstones)
}

fn override_fingerprint(o: &crate::model::OverrideSpec) -> String {
    format!(
        "{:?}|{:?}|{}|{:?}",
        o.paused, o.ignore_fields, o.reason, o.expires_text
    )
}

/// Observes every subject at its provider and decides.
/// `declarations` are the snapshot's, moved in (a cycle over thousands
/// must not copy them); the snapshot supplies the commit and diagnostics.
#[allow(clippy::too_many_arguments)]
pub async fn observe_and_decide(
    config: &Config,
    snapshot: &Snapshot,
    declarations: Vec<Declaration>,
    store: Option<&StateStore>,
    agent_id: &str,
    providers: &Providers,
    now: SystemTime,
    persist: bool,
    preloaded: Option<StoredMemories>,
) -> Result<Plan, CycleError> {
    let phase = std::time::Instant::now();
    let mut memories = match store {
        Some(s) => {
            let stored = match preloaded {
                Some(stored) => stored,
                None => s.read_memories()?,
            };
            let current: std::collections::HashMap<&str, &SpecHash> = declarations
                .iter()
                .map(|d| (d.name(), &d.spec_hash))
                .collect();
            stored.resolve(&current, s)?
        }
        None => Default::default(),
    };
    tracing::debug!("memories: {:?}", phase.elapsed());
    let tombstones = subjects(snapshot, &declarations, &memories, store, now, persist)?;
    let local: BTreeMap<
        String,
        (
            BTreeMap<String, crate::model::declaration::ScalarString>,
            SystemTime,
        ),
    > = match store {
        Some(s) => s
            .local_overrides()?
            .into_iter()
            .map(|o| {
                let annotations = o
                    .annotations
                    .into_iter()
                    .map(|(k, v)| (k, crate::model::declaration::ScalarString(v)))
                    .collect();
                (o.name, (annotations, o.set_at))
            })
            .collect(),
        None => BTreeMap::new(),
    };
    let declared_count = declarations.len();
    tracing::debug!("subjects: {:?}", phase.elapsed());
    let mut errors: Vec<Diagnostic> = snapshot.declarations.diagnostics.clone();
    let mut policy = config.policy();
    policy.agent_id = agent_id.to_string();

    // Group subjects by provider.
    let mut unplanned = Vec::new();
    let mut by_provider: BTreeMap<String, Vec<PlannedSubject>> = BTreeMap::new();
    for decl in declarations {
        match provider_of(config, &decl.manifest) {
            Ok(p) => by_provider
                .entry(p.to_string())
                .or_default()
                .push(PlannedSubject::Declared(Box::new(decl))),
            Err(message) => {
                errors.push(Diagnostic {
                    file: decl.file.clone(),
                    line: decl.line,
                    column: decl.column,
                    message,
                });
                unplanned.push(decl);
            }
        }
    }
    for tomb in tombstones {
        if let Ok(p) = provider_of(config, &tomb.last) {
            by_provider
                .entry(p.to_string())
                .or_default()
                .push(PlannedSubject::Removed(Box::new(tomb)));
        }
    }
    // The resources tend manages (the mass-deletion guard's base), from the
    // memory already loaded rather than another scan of the store.
    let managed_count = memories.values().filter(|m| m.existed).count();
    let deletion_budget = config
        .reconcile
        .max_deletions
        .min((managed_count * usize::from(config.reconcile.max_deletion_percent) / 100).max(1));
    let mut deletions = 0usize;

    let mut resources = Vec::new();
    for (provider_name, subjects) in by_provider {
        let Some(provider) = providers.get(&provider_name) else {
            continue;
        };
        let caps = provider.capabilities();
        let names: Vec<String> = subjects
            .iter()
            .map(|s| match s {
                PlannedSubject::Declared(d) => d.manifest.database_name(),
                PlannedSubject::Removed(t) => t.last.database_name(),
            })
            .collect();
        let retry = config.retry_policy();
        let limiter = governor::RateLimiter::direct(governor::Quota::per_second(
            std::num::NonZeroU32::MIN.saturating_add(99),
        ));
        // Per-database fields (extensions) only where a declaration manages them.
        let deep: Vec<String> = subjects
            .iter()
            .filter_map(|s| match s {
                PlannedSubject::Declared(d) if d.manifest.spec.extensions.is_some() => {
                    Some(d.manifest.database_name())
                }
                _ => None,
            })
            .collect();
        let observed_all = retry
            .run(&limiter, || provider.observe_all(&names, &deep))
            .await;
        tracing::debug!("observe_all: {:?}", phase.elapsed());
        // Usually one subject per database; a tombstone and a new
        // declaration may share one, and both must see it: those are
        // cloned, every other observation is moved to its subject.
        let shared: std::collections::HashSet<&str> = {
            let mut sorted: Vec<&str> = names.iter().map(String::as_str).collect();
            sorted.sort_unstable();
            sorted
                .windows(2)
                .filter(|pair| pair[0] == pair[1])
                .map(|pair| pair[0])
                .collect()
        };
        let shared: std::collections::HashSet<String> =
            shared.into_iter().map(str::to_string).collect();
        let (mut by_name, failure): (
            std::collections::HashMap<String, Observation>,
            Option<String>,
        ) = match observed_all {
            Ok(list) => (
                list.into_iter()
                    .map(|o| (o.database_name.clone(), o))
                    .collect(),
                None,
            ),
            Err(e) => (std::collections::HashMap::new(), Some(e.to_string())),
        };
        resources.reserve(subjects.len());
        for (subject, database_name) in subjects.into_iter().zip(names) {
            let observed = match &failure {
                Some(e) => Observed::Failed(e.clone()),
                None => match if shared.contains(&database_name) {
                    by_name.get(&database_name).cloned()
                } else {
                    by_name.remove(&database_name)
                } {
                    Some(o) => Observed::Found(o),
                    None => Observed::NotFound,
                },
            };
            let (name, file, spec_hash) = match &subject {
                PlannedSubject::Declared(d) => (
                    d.name().to_string(),
                    d.file.to_string_lossy().into_owned(),
                    d.spec_hash.clone(),
                ),
                PlannedSubject::Removed(t) => (
                    t.last.metadata.name.clone(),
                    String::new(),
                    t.last.spec_hash(),
                ),
            };
            let memory = memories.remove(&name).unwrap_or_default();
            let mut overrides = Vec::new();
            if let PlannedSubject::Declared(d) = &subject
                && let Some(spec) = &d.annotations.overrides
            {
                let fingerprint = override_fingerprint(spec);
                let first_seen = match (store, persist) {
                    (Some(s), true) => s.override_first_seen(
                        &name,
                        OverrideSource::Annotation.as_str(),
                        &fingerprint,
                        now,
                    )?,
                    _ => now,
                };
                overrides.extend(OverrideInput::from_annotations(d, first_seen));
            }
            // Local overrides (`tend override set`): a duration counts from
            // when the operator set it.
            if let Some((annotations, set_at)) = local.get(&name) {
                match crate::model::overrides::parse_annotations(annotations) {
                    Ok(parsed) => overrides.extend(parsed.overrides.map(|spec| OverrideInput {
                        source: OverrideSource::Local,
                        spec,
                        first_seen: *set_at,
                    })),
                    Err(problems) => {
                        // A broken local override must not be ignored: pause.
                        let reason = problems
                            .into_iter()
                            .map(|p| p.message)
                            .collect::<Vec<_>>()
                            .join("; ");
                        overrides.push(OverrideInput {
                            source: OverrideSource::Local,
                            spec: crate::model::OverrideSpec {
                                paused: true,
                                ignore_fields: Vec::new(),
                                reason: format!(
                                    "invalid local override, treated as a pause: {reason}"
                                ),
                                expires: None,
                                expires_text: None,
                                on_expiry: crate::model::OnExpiry::Hold,
                            },
                            first_seen: *set_at,
                        });
                    }
                }
            }
            // Provider-label overrides: a duration expiry counts from when tend
            // first saw that override (kept in the state dir).
            let mut memory = memory;
            if let (Observed::Found(obs), Some(s)) = (&observed, store) {
                let labels: Vec<String> = obs
                    .labels
                    .iter()
                    .filter(|(k, _)| {
                        k.starts_with("tend.dev/") && !k.starts_with("tend.dev/owner-")
                    })
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                if !labels.is_empty() {
                    let fingerprint = labels.join("\n");
                    let seen = if persist {
                        Some(s.override_first_seen(
                            &name,
                            OverrideSource::Provider.as_str(),
                            &fingerprint,
                            now,
                        )?)
                    } else {
                        s.override_seen_at(&name, OverrideSource::Provider.as_str(), &fingerprint)?
                    };
                    memory
                        .drift_first_seen
                        .insert(PROVIDER_OVERRIDE_SEEN.to_string(), seen.unwrap_or(now));
                }
            }
            let is_delete_candidate = matches!(&subject, PlannedSubject::Removed(t) if t.last.spec.deletion_policy == crate::model::DeletionPolicy::Delete);
            let deletion_allowed = declared_count > 0 && deletions < deletion_budget;
            let engine_subject = match &subject {
                PlannedSubject::Declared(d) => Subject::Declared(d),
                PlannedSubject::Removed(t) => Subject::Removed(t),
            };
            let decision = decide(&DecideInput {
                subject: engine_subject,
                observed: &observed,
                memory: &memory,
                overrides: &overrides,
                policy: &policy,
                capabilities: &caps,
                deletion_allowed,
                provider: &provider_name,
                now,
            });
            if is_delete_candidate && decision.action == Action::Delete {
                deletions += 1;
            }
            if persist && let Some(s) = store {
                // A removed resource no longer at the provider is done with:
                // its tombstone and memory go (and it leaves the count the
                // mass-deletion guard is a percentage of).
                if matches!(subject, PlannedSubject::Removed(_))
                    && matches!(observed, Observed::NotFound)
                {
                    s.forget(&name)?;
                }
                if matches!(subject, PlannedSubject::Declared(_)) {
                    remember_drift(s, &name, &decision, &observed, &memory, now)?;
                }
                // Keep the last declaration (for a future tombstone) when it
                // changed; an unchanged spec needs no write.
                if let PlannedSubject::Declared(d) = &subject
                    && memory.existed
                    && memory.applied_spec_hash.as_ref() != Some(&d.spec_hash)
                {
                    s.touch(
                        &name,
                        &file,
                        &serde_json::to_value(&d.manifest).unwrap_or(Value::Null),
                    )?;
                }
            }
            let operation = operation_kind(decision.action).map(|kind| {
                let generation = store
                    .and_then(|s| s.next_generation(&name, kind.as_str(), &spec_hash).ok())
                    .unwrap_or(0);
                (
                    kind,
                    OperationId::derive_nth(agent_id, &name, kind, &spec_hash, generation),
                )
            });
            resources.push(PlannedResource {
                name,
                subject,
                file,
                provider: provider_name.clone(),
                spec_hash,
                observed,
                memory,
                decision,
                operation,
            });
        }
    }
    tracing::debug!("decided: {:?}", phase.elapsed());
    // Declarations arrive sorted; only tombstones or several providers
    // leave anything to sort (and moving large entries is not free).
    if !resources.is_sorted_by(|a, b| a.name <= b.name) {
        resources.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(Plan {
        agent_id: agent_id.to_string(),
        commit: Some(snapshot.commit.clone()),
        resources,
        errors,
        unplanned,
        now,
    })
}

/// The memory key under which the decision core finds when a provider-label
/// override was first seen.
const PROVIDER_OVERRIDE_SEEN: &str = "override:provider";

/// First-seen times of out-of-band drift, so `drift_grace` counts from the
/// first sighting across cycles and restarts.
fn remember_drift(
    store: &StateStore,
    name: &str,
    decision: &Decision,
    observed: &Observed,
    memory: &Memory,
    now: SystemTime,
) -> Result<(), StateError> {
    let mut fields: Vec<String> = decision
        .drift
        .iter()
        .filter(|d| d.origin == DriftOrigin::OutOfBand)
        .map(|d| d.field.clone())
        .collect();
    if matches!(observed, Observed::NotFound) && memory.existed {
        fields.push(String::new());
    }
    if matches!(observed, Observed::Failed(_)) {
        return Ok(());
    }
    // Most cycles change nothing here: write only when the set changed.
    if fields.len() == memory.drift_first_seen.len()
        && fields
            .iter()
            .all(|f| memory.drift_first_seen.contains_key(f))
    {
        return Ok(());
    }
    store.sync_drift(name, &fields, now)
}

pub fn operation_kind(action: Action) -> Option<OperationKind> {
    match action {
        Action::Create => Some(OperationKind::Create),
        Action::Update => Some(OperationKind::Update),
        Action::Delete => Some(OperationKind::Delete),
        Action::Adopt => Some(OperationKind::Adopt),
        Action::Release => Some(OperationKind::Release),
        Action::None | Action::Hold => None,
    }
}

fn marker(agent_id: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (OWNER_AGENT_LABEL.to_string(), agent_id.to_string()),
        (OWNER_DECLARATION_LABEL.to_string(), name.to_string()),
    ])
}

/// The operation that carries out a decision.
fn operation_for(
    store: &StateStore,
    agent_id: &str,
    plan_commit: Option<&str>,
    r: &PlannedResource,
    caps: &crate::provider::Capabilities,
) -> Result<Option<PlannedOperation>, StateError> {
    let Some((kind, _)) = r.operation else {
        return Ok(None);
    };
    let manifest = r.manifest();
    let database_name = manifest.database_name();
    let body = match kind {
        OperationKind::Create => {
            let mut labels: BTreeMap<String, String> = manifest
                .metadata
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect();
            labels.extend(marker(agent_id, &r.name));
            RequestBody::Change(ChangeRequest {
                database_name: database_name.clone(),
                fields: r.decision.changes.clone(),
                labels,
            })
        }
        OperationKind::Update => RequestBody::Change(ChangeRequest {
            database_name: database_name.clone(),
            fields: r.decision.changes.clone(),
            labels: BTreeMap::new(),
        }),
        OperationKind::Adopt => RequestBody::Change(ChangeRequest {
            database_name: database_name.clone(),
            fields: BTreeMap::new(),
            labels: marker(agent_id, &r.name),
        }),
        OperationKind::Release => RequestBody::Change(ChangeRequest {
            database_name: database_name.clone(),
            fields: BTreeMap::new(),
            labels: marker("", "")
                .into_keys()
                .map(|k| (k, String::new()))
                .collect(),
        }),
        OperationKind::Delete => RequestBody::Delete {
            database_name: database_name.clone(),
        },
    };
    let request = JournalRequest {
        provider: r.provider.clone(),
        database_name,
        file: r.file.clone(),
        commit: plan_commit.map(str::to_string),
        manifest: serde_json::to_value(manifest).unwrap_or(Value::Null),
        desired: desired_fields(manifest, caps),
        body,
    };
    PlannedOperation::new(store, agent_id, &r.name, kind, &r.spec_hash, request).map(Some)
}

/// Why a pending intent must not be replayed, if it must not.
fn superseded(op: &PlannedOperation, declared: Option<&Declaration>) -> Option<&'static str> {
    let paused =
        declared.is_some_and(|d| d.annotations.overrides.as_ref().is_some_and(|o| o.paused));
    match (op.kind, declared) {
        (_, Some(_)) if paused => Some("the resource is paused now"),
        (OperationKind::Delete | OperationKind::Release, Some(_)) => {
            Some("the declaration is back in Git")
        }
        (OperationKind::Create | OperationKind::Update, Some(d)) if d.spec_hash != op.spec_hash => {
            Some("the declaration changed since; the next decision uses the new spec")
        }
        _ => None,
    }
}

/// What `tend apply` did.
#[derive(Debug, Clone)]
pub struct ApplyOutcome {
    /// Operations run this cycle (pending intents resolved first).
    pub operations: Vec<(String, OperationKind, OperationId, OpOutcome)>,
    /// The state after the cycle (observed again).
    pub after: Plan,
}

/// Progress of a cycle's operations: a bar on a terminal, lines otherwise.
struct Progress {
    total: usize,
    done: usize,
    tty: bool,
}

impl Progress {
    fn step(&mut self, name: &str, kind: OperationKind, outcome: &OpOutcome) {
        self.done += 1;
        if self.tty {
            let width = 30;
            let filled = width * self.done / self.total.max(1);
            eprint!(
                "\r[{}{}] {}/{} operations",
                "#".repeat(filled),
                " ".repeat(width - filled),
                self.done,
                self.total
            );
            if self.done == self.total {
                eprintln!();
            }
        } else {
            tracing::info!(
                "[{}/{}] {} {name}: {outcome:?}",
                self.done,
                self.total,
                kind.as_str()
            );
        }
    }
}

/// Runs operations concurrently (bounded per provider) and collects outcomes.
/// Runs operations, at most each provider's `max_concurrency` at a time.
/// Work waits in a queue per provider as `T` and becomes an operation
/// (`build`: the journal request, kilobytes of JSON) and a task only when
/// a slot is free: ten thousand built and spawned at once held well over
/// 100 MB while they waited.
async fn execute<T>(
    contexts: &BTreeMap<String, Arc<ExecContext<AnyProvider>>>,
    queued: Vec<T>,
    provider_of: impl Fn(&T) -> &str,
    mut build: impl FnMut(T) -> Result<Option<PlannedOperation>, CycleError>,
) -> Result<Vec<(String, OperationKind, OperationId, OpOutcome)>, CycleError> {
    type Finished = (
        String,
        String,
        OperationKind,
        OperationId,
        Result<Result<OpOutcome, StateError>, tokio::task::JoinError>,
    );
    let mut progress = Progress {
        total: queued.len(),
        done: 0,
        tty: std::io::stderr().is_terminal() && queued.len() > 1,
    };
    let mut queues: BTreeMap<String, std::collections::VecDeque<T>> = BTreeMap::new();
    for item in queued {
        let provider = provider_of(&item);
        if contexts.contains_key(provider) {
            queues
                .entry(provider.to_string())
                .or_default()
                .push_back(item);
        }
    }
    let mut tasks: tokio::task::JoinSet<Finished> = tokio::task::JoinSet::new();
    // Starts the next queued operation of `provider`, if any.
    let mut start_next = |tasks: &mut tokio::task::JoinSet<Finished>,
                          queues: &mut BTreeMap<String, std::collections::VecDeque<T>>,
                          provider: &str|
     -> Result<(), CycleError> {
        let Some(ctx) = contexts.get(provider).cloned() else {
            return Ok(());
        };
        while let Some(item) = queues.get_mut(provider).and_then(|q| q.pop_front()) {
            let Some(op) = build(item)? else { continue };
            let provider = provider.to_string();
            tasks.spawn(async move {
                let (name, kind, id) = (op.name.clone(), op.kind, op.id.clone());
                // Its own task, so a panic still tells which provider's
                // slot came free (the intent stays pending for next cycle).
                let outcome = tokio::spawn(operation::run(ctx, op)).await;
                (provider, name, kind, id, outcome)
            });
            break;
        }
        Ok(())
    };
    // The first error stops new work; operations already running finish
    // (a call may have reached the provider: its outcome must be recorded),
    // then the error is returned.
    let mut failure: Option<CycleError> = None;
    let providers: Vec<String> = queues.keys().cloned().collect();
    'fill: for provider in &providers {
        let slots = contexts.get(provider).map_or(1, |c| c.max_concurrency);
        for _ in 0..slots {
            if let Err(e) = start_next(&mut tasks, &mut queues, provider) {
                failure = Some(e);
                break 'fill;
            }
        }
    }
    let mut results = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let Ok((provider, name, kind, id, outcome)) = joined else {
            continue;
        };
        if failure.is_none()
            && let Err(e) = start_next(&mut tasks, &mut queues, &provider)
        {
            failure = Some(e);
        }
        let outcome = match outcome {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => {
                failure.get_or_insert(e.into());
                continue;
            }
            Err(e) => {
                tracing::error!(
                    "{} {name} ({id}) stopped: {e}; its intent stays pending for the next cycle",
                    kind.as_str()
                );
                continue;
            }
        };
        progress.step(&name, kind, &outcome);
        results.push((name, kind, id, outcome));
    }
    if let Some(e) = failure {
        return Err(e);
    }
    results.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(results)
}

/// One full cycle: snapshot, resolve pending intents, observe, decide,
/// execute, confirm, and observe again for the report. Holds the state
/// dir's writer lock throughout.
pub fn apply(config: &Config) -> Result<ApplyOutcome, CycleError> {
    let started = std::time::Instant::now();
    let _lock = StateLock::acquire(&config.state_dir)?;
    let store =
        Arc::new(
            StateStore::open(&config.state_dir, true)?.ok_or_else(|| StateError::Io {
                path: config.state_dir.display().to_string(),
                message: "the state database could not be created".into(),
            })?,
        );
    let agent_id = store.agent_id(config.agent_id.as_deref())?;
    tracing::debug!("state opened: {:?}", started.elapsed());
    let (snapshot, mut preloaded) =
        snapshot_and_memories(config, SystemTime::now(), true, Some(&store));
    let snapshot = snapshot?;
    tracing::debug!("snapshot: {:?}", started.elapsed());
    let providers = providers(config)?;
    let contexts: BTreeMap<String, Arc<ExecContext<AnyProvider>>> = providers
        .iter()
        .map(|(name, provider)| {
            let p = &config.providers[name];
            (
                name.clone(),
                Arc::new(ExecContext::new(
                    provider.clone(),
                    name,
                    store.clone(),
                    &agent_id,
                    ExecLimits {
                        max_concurrency: p
                            .max_concurrency
                            .min(config.reconcile.max_concurrency.max(1)),
                        rate_per_second: p.rate_limit,
                        retry: config.retry_policy(),
                        confirm_timeout: config.reconcile.confirm_timeout,
                    },
                )),
            )
        })
        .collect();

    runtime()?.block_on(async {
        // Pending intents first: finish what a lost response or a crash
        // left, with the same ids, before any new work.
        // A pending intent the repository has since overtaken is superseded,
        // not replayed: a delete of a declaration that came back, anything
        // on a resource now paused, a create or update of an older spec.
        let current: BTreeMap<&str, &Declaration> = snapshot
            .declarations
            .declarations
            .iter()
            .map(|d| (d.name(), d))
            .collect();
        // Paused on this host (`tend override set --pause`).
        let locally_paused: BTreeSet<String> = store
            .local_overrides()?
            .into_iter()
            .filter(|o| {
                o.annotations
                    .get(crate::model::overrides::PAUSED)
                    .map(String::as_str)
                    == Some("true")
            })
            .map(|o| o.name)
            .collect();
        let mut pending = Vec::new();
        for op in store
            .pending_intents()?
            .iter()
            .filter_map(PlannedOperation::from_intent)
        {
            let now = SystemTime::now();
            let verdict = if locally_paused.contains(&op.name) {
                Some("the resource is paused on this host")
            } else {
                superseded(&op, current.get(op.name.as_str()).copied())
            };
            match verdict {
                Some(why) => {
                    tracing::warn!(
                        "not replaying {} {} ({}): {why}",
                        op.kind.as_str(),
                        op.name,
                        op.id
                    );
                    store.finish_intent(
                        &op.id.0,
                        crate::journal::IntentState::Failed,
                        Some(&format!("superseded: {why}")),
                        now,
                    )?;
                }
                None => pending.push(op),
            }
        }
        let unresolved_before: BTreeSet<String> =
            pending.iter().map(|op| op.name.clone()).collect();
        // Replayed intents change what is remembered: read it again.
        if !pending.is_empty() {
            preloaded = None;
        }
        let mut operations = execute(
            &contexts,
            pending,
            |op| op.request.provider.as_str(),
            |op| Ok(Some(op)),
        )
        .await?;
        let still_pending: BTreeSet<String> = store
            .pending_intents()?
            .into_iter()
            .map(|i| i.name)
            .collect();

        tracing::debug!("pending intents resolved: {:?}", started.elapsed());
        let now = SystemTime::now();
        let mut snapshot = Arc::unwrap_or_clone(snapshot);
        let declarations = std::mem::take(&mut snapshot.declarations.declarations);
        let plan = observe_and_decide(
            config,
            &snapshot,
            declarations,
            Some(&store),
            &agent_id,
            &providers,
            now,
            true,
            preloaded.take(),
        )
        .await?;
        let mut work = Vec::new();
        for r in &plan.resources {
            // A resource whose earlier intent is still unconfirmed gets no
            // new work: its observation may not show that intent yet.
            if r.operation.is_none()
                || still_pending.contains(&r.name)
                || (unresolved_before.contains(&r.name) && r.decision.action == Action::Create)
            {
                continue;
            }
            if matches!(r.operation, Some((OperationKind::Delete, _))) {
                store.tombstone_progress(&r.name, now, None)?;
            }
            work.push(r);
        }
        let capabilities: BTreeMap<&str, crate::provider::Capabilities> = providers
            .iter()
            .map(|(name, p)| (name.as_str(), p.capabilities()))
            .collect();
        operations.extend(
            execute(
                &contexts,
                work,
                |r| r.provider.as_str(),
                |r| {
                    let Some(caps) = capabilities.get(r.provider.as_str()) else {
                        return Ok(None);
                    };
                    Ok(operation_for(
                        &store,
                        &agent_id,
                        plan.commit.as_deref(),
                        r,
                        caps,
                    )?)
                },
            )
            .await?,
        );
        for (name, kind, _, outcome) in &operations {
            if *kind == OperationKind::Delete
                && let OpOutcome::Pending(e) | OpOutcome::Failed(e) = outcome
            {
                store.tombstone_progress(name, now, Some(e))?;
            }
        }
        // Nothing ran: the plan is already the state after the cycle.
        let after = if operations.is_empty() {
            plan
        } else {
            // The same declarations, taken back from the plan.
            let mut declarations: Vec<Declaration> = plan
                .resources
                .into_iter()
                .filter_map(|r| match r.subject {
                    PlannedSubject::Declared(d) => Some(*d),
                    PlannedSubject::Removed(_) => None,
                })
                .collect();
            declarations.extend(plan.unplanned);
            observe_and_decide(
                config,
                &snapshot,
                declarations,
                Some(&store),
                &agent_id,
                &providers,
                SystemTime::now(),
                false,
                None,
            )
            .await?
        };
        Ok(ApplyOutcome { operations, after })
    })
}
