//! Observing every routed subject: one `observe_all` per provider, all
//! providers at once, each through its own rate limiter and retry policy
//! (a slow provider delays only its own resources).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::routing::Routed;
use crate::executor::ProviderRuntime;
use crate::provider::{Observation, Observed, Provider};

/// What one provider showed: every database by name, or why it could not
/// be asked.
pub type ProviderView = Result<HashMap<String, Observation>, String>;

/// Observes the subjects of every provider.
pub async fn observe_all(
    runtimes: &BTreeMap<String, Arc<ProviderRuntime>>,
    routed: &BTreeMap<String, Vec<Routed<'_>>>,
) -> HashMap<String, ProviderView> {
    let mut tasks = tokio::task::JoinSet::new();
    for (provider, subjects) in routed {
        let Some(runtime) = runtimes.get(provider).cloned() else {
            continue;
        };
        let names: Vec<String> = subjects.iter().map(|r| r.database_name.clone()).collect();
        // Per-database fields (extensions) only where a declaration manages them.
        let deep: Vec<String> = subjects
            .iter()
            .filter(|r| {
                r.subject
                    .declaration()
                    .is_some_and(|d| d.manifest.spec.extensions.is_some())
            })
            .map(|r| r.database_name.clone())
            .collect();
        let provider = provider.clone();
        tasks.spawn(async move {
            let observed = runtime
                .retry
                .run(&runtime.limiter, || {
                    runtime.provider.observe_all(&names, &deep)
                })
                .await;
            let view = observed
                .map(|list| {
                    list.into_iter()
                        .map(|o| (o.database_name.clone(), o))
                        .collect()
                })
                .map_err(|e| e.to_string());
            (provider, view)
        });
    }
    let mut views = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((provider, view)) => {
                views.insert(provider, view);
            }
            Err(e) => tracing::error!("observing a provider stopped: {e}"),
        }
    }
    views
}

/// Hands each subject its observation. Usually one subject per database;
/// a tombstone and a new declaration may share one, and both must see it:
/// those are cloned, every other observation is moved to its subject.
pub fn distribute(subjects: &[Routed<'_>], view: Option<ProviderView>) -> Vec<Observed> {
    let mut by_name = match view {
        Some(Ok(by_name)) => by_name,
        Some(Err(message)) => {
            return subjects
                .iter()
                .map(|_| Observed::Failed(message.clone()))
                .collect();
        }
        None => {
            return subjects
                .iter()
                .map(|_| Observed::Failed("the provider was not observed".into()))
                .collect();
        }
    };
    let shared: HashSet<&str> = {
        let mut sorted: Vec<&str> = subjects.iter().map(|r| r.database_name.as_str()).collect();
        sorted.sort_unstable();
        sorted
            .windows(2)
            .filter(|pair| pair[0] == pair[1])
            .map(|pair| pair[0])
            .collect()
    };
    subjects
        .iter()
        .map(|r| {
            let found = if shared.contains(r.database_name.as_str()) {
                by_name.get(&r.database_name).cloned()
            } else {
                by_name.remove(&r.database_name)
            };
            found.map_or(Observed::NotFound, Observed::Found)
        })
        .collect()
}
