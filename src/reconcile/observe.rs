//! Observing every routed subject: one `observe_all` per provider, all
//! providers at once, each through its own rate limiter and retry policy
//! (a slow provider delays only its own resources).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::routing::Routed;
use crate::executor::ProviderRuntime;
use crate::journal::store::Freshness;
use crate::journal::{StateStore, blocking};
use crate::provider::{Observation, Observed, Provider, ProviderError};

/// What one provider showed: every database by name, or why it could not
/// be asked.
pub type ProviderView = Result<HashMap<String, Observation>, String>;

fn view(observed: Result<Vec<Observation>, ProviderError>) -> ProviderView {
    observed
        .map(|list| {
            list.into_iter()
                .map(|o| (o.database_name.clone(), o))
                .collect()
        })
        .map_err(|e| e.to_string())
}

/// Listings started before the declarations are read (a one-shot command
/// starts them beside the source fetch), for the providers whose
/// observation is one listing whatever names it is asked for (the http
/// provider): the fetch and the listing both wait on the network, and the
/// cycle then finds its observations made.
///
/// # Guarantees
/// * Used only if the state is as it was when the listings started: what
///   is remembered is then no newer than what was listed. A write
///   meanwhile (a replayed intent, or a running agent's create beside
///   `tend plan`) could remember a database the listing predates, and the
///   cycle would call it missing: then the cycle observes again.
pub struct ListingAhead {
    listing: tokio::task::JoinHandle<HashMap<String, ProviderView>>,
    /// The state when the listings started (`None`: no state to compare).
    freshness: Option<Freshness>,
}

impl ListingAhead {
    /// Starts a listing of every provider that lists everything; `None`
    /// when there is none (or the state cannot tell its freshness).
    pub fn start(
        runtimes: &BTreeMap<String, Arc<ProviderRuntime>>,
        store: Option<&StateStore>,
    ) -> Option<ListingAhead> {
        let listing: Vec<Arc<ProviderRuntime>> = runtimes
            .values()
            .filter(|r| r.provider.lists_everything())
            .cloned()
            .collect();
        if listing.is_empty() {
            return None;
        }
        let freshness = match store {
            Some(store) => Some(store.freshness().ok()?),
            None => None,
        };
        let listing = tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for runtime in listing {
                tasks.spawn(async move {
                    let started = std::time::Instant::now();
                    let observed = runtime
                        .retry
                        .run(&runtime.limiter, || async {
                            runtime
                                .provider
                                .observe_everything()
                                .await
                                .unwrap_or_else(|| Ok(Vec::new()))
                        })
                        .await;
                    tracing::debug!(
                        "{}: listed every database ahead in {:?}",
                        runtime.name,
                        started.elapsed()
                    );
                    (runtime.name.clone(), view(observed))
                });
            }
            collect(tasks).await
        });
        Some(ListingAhead { listing, freshness })
    }

    /// The listings, if nothing was written to the state since they
    /// started; else none (the cycle observes again).
    pub async fn views(self, store: Option<&Arc<StateStore>>) -> HashMap<String, ProviderView> {
        let Ok(views) = self.listing.await else {
            return HashMap::new();
        };
        if let Some(store) = store {
            let now = blocking(store, |s| s.freshness()).await.ok();
            if now != self.freshness {
                tracing::debug!("the state changed while listing ahead: observing again");
                return HashMap::new();
            }
        }
        views
    }
}

async fn collect(
    mut tasks: tokio::task::JoinSet<(String, ProviderView)>,
) -> HashMap<String, ProviderView> {
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

/// Observes the subjects of every provider; `ahead`: the views already
/// listed (see [`ListingAhead`]), used instead of asking those providers.
pub async fn observe_all(
    runtimes: &BTreeMap<String, Arc<ProviderRuntime>>,
    routed: &BTreeMap<String, Vec<Routed<'_>>>,
    mut ahead: HashMap<String, ProviderView>,
) -> HashMap<String, ProviderView> {
    let mut views = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (provider, subjects) in routed {
        if let Some(listed) = ahead.remove(provider) {
            views.insert(provider.clone(), listed);
            continue;
        }
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
            (provider, view(observed))
        });
    }
    views.extend(collect(tasks).await);
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
