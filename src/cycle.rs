//! One read-only cycle: load the declarations, observe them at their
//! providers, decide. `tend plan` prints it; `tend apply` (later) acts on it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::{Config, ProviderKind};
use crate::engine::{DecideInput, Decision, Memory, OverrideInput, Subject, decide};
use crate::model::{Declaration, DeclarationSet, Diagnostic};
use crate::provider::sandbox::SandboxProvider;
use crate::provider::{Observation, Observed, Provider};
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
    #[error("source: {error}")]
    Source {
        #[from]
        error: SourceError,
    },
}

/// The decision for one declaration with everything a report shows.
#[derive(Debug, Clone)]
pub struct PlannedResource {
    pub declaration: Declaration,
    /// Path of the file relative to the source root.
    pub file: String,
    pub provider: String,
    pub observed: Observed,
    pub memory: Memory,
    pub decision: Decision,
}

/// The outcome of a read-only cycle.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The source commit the declarations come from.
    pub commit: Option<String>,
    pub resources: Vec<PlannedResource>,
    /// Declaration files that failed to parse, or were not assigned a provider.
    pub errors: Vec<Diagnostic>,
    pub now: SystemTime,
}

/// The sandbox provider a config names (the only kind this build runs).
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

fn provider_names(config: &Config) -> String {
    config
        .providers
        .keys()
        .cloned()
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which provider a declaration uses: `spec.provider`, or the only one.
fn provider_of<'a>(config: &'a Config, decl: &Declaration) -> Result<&'a str, String> {
    match &decl.manifest.spec.provider {
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

/// Fetches the source once, read-only: the accepted commit is checked
/// (anti-rollback) but not advanced.
pub fn snapshot_once(config: &Config, now: SystemTime) -> Result<Arc<Snapshot>, CycleError> {
    let mut source = Source::open(&config.state_dir, config.source_settings()?, false)?;
    let outcome = source.poll(now);
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

/// Runs one read-only cycle: snapshot the source, observe, decide.
pub fn plan(config: &Config, now: SystemTime) -> Result<Plan, CycleError> {
    let snapshot = snapshot_once(config, now)?;
    plan_snapshot(config, &snapshot, now)
}

/// Observes and decides the declarations of one snapshot.
pub fn plan_snapshot(
    config: &Config,
    snapshot: &Arc<Snapshot>,
    now: SystemTime,
) -> Result<Plan, CycleError> {
    let set: DeclarationSet = snapshot.declarations.clone();
    let mut errors: Vec<Diagnostic> = set.diagnostics;

    let mut by_provider: BTreeMap<&str, Vec<Declaration>> = BTreeMap::new();
    for decl in set.declarations {
        match provider_of(config, &decl) {
            Ok(p) => by_provider.entry(p).or_default().push(decl),
            Err(message) => errors.push(Diagnostic {
                file: decl.file.clone(),
                line: decl.line,
                column: decl.column,
                message,
            }),
        }
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CycleError::Runtime)?;
    let policy = config.policy();
    let mut resources = Vec::new();
    for (provider_name, decls) in by_provider {
        let provider = sandbox_provider(config, provider_name)?;
        let caps = provider.capabilities();
        let names: Vec<String> = decls.iter().map(|d| d.manifest.database_name()).collect();
        let observed_all = runtime.block_on(provider.observe_all(&names));
        let by_name: BTreeMap<String, Observation> = match &observed_all {
            Ok(list) => list
                .iter()
                .map(|o| (o.database_name.clone(), o.clone()))
                .collect(),
            Err(_) => BTreeMap::new(),
        };
        for decl in decls {
            let observed = match &observed_all {
                Err(e) => Observed::Failed(e.to_string()),
                Ok(_) => match by_name.get(&decl.manifest.database_name()) {
                    Some(o) => Observed::Found(o.clone()),
                    None => Observed::NotFound,
                },
            };
            let memory = Memory::default();
            let overrides: Vec<OverrideInput> = OverrideInput::from_annotations(&decl, now)
                .into_iter()
                .collect();
            let decision = decide(&DecideInput {
                subject: Subject::Declared(&decl),
                observed: &observed,
                memory: &memory,
                overrides: &overrides,
                policy: &policy,
                capabilities: &caps,
                deletion_allowed: false,
                now,
            });
            resources.push(PlannedResource {
                file: decl.file.display().to_string(),
                provider: provider_name.to_string(),
                declaration: decl,
                observed,
                memory,
                decision,
            });
        }
    }
    resources.sort_by(|a, b| a.declaration.name().cmp(b.declaration.name()));
    Ok(Plan {
        commit: Some(snapshot.commit.clone()),
        resources,
        errors,
        now,
    })
}
