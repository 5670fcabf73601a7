//! Observing every routed subject: one `observe_all` per provider, all
//! providers at once, each through its own rate limiter and retry policy
//! (a slow provider delays only its own resources).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::routing::Routed;
use crate::executor::ProviderRuntime;
use crate::journal::store::Freshness;
use crate::journal::{StateStore, blocking};
use crate::provider::{Observation, Observed, Provider, ProviderError};

/// What one provider showed: every database by name, or why it could not
/// be asked.
pub(crate) type ProviderView = Result<Listing, String>;

fn view(observed: Result<Vec<Observation>, ProviderError>) -> ProviderView {
    observed.map(Listing::new).map_err(|e| e.to_string())
}

/// One provider's databases, sorted by name, one observation per name.
///
/// A sorted list, not a map by name: a cycle holds every provider's
/// listing at once, and a map of ten thousand observations kept a copy of
/// every name and a third of its slots empty (about 1.4 MB more at 10,000
/// databases). Names are looked up by binary search; a cycle takes every
/// observation out in one merge ([`distribute`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Listing(Vec<Observation>);

impl Listing {
    /// The listing of `observed`; of two observations under one name, the
    /// later stands (as the provider's answer lists it).
    pub(crate) fn new(mut observed: Vec<Observation>) -> Self {
        // Reversed, then a stable sort: the later of two stands first in
        // its run, and `dedup_by` keeps the first.
        observed.reverse();
        observed.sort_by(|a, b| a.database_name.cmp(&b.database_name));
        observed.dedup_by(|a, b| a.database_name == b.database_name);
        Listing(observed)
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0
            .binary_search_by(|o| o.database_name.as_str().cmp(name))
    }

    /// `observation` in place of what the listing holds under its name.
    pub(crate) fn insert(&mut self, observation: Observation) {
        match self.position(&observation.database_name) {
            Ok(at) => self.0[at] = observation,
            Err(at) => self.0.insert(at, observation),
        }
    }

    /// Removes the database `name` from the listing.
    pub(crate) fn remove(&mut self, name: &str) -> Option<Observation> {
        self.position(name).ok().map(|at| self.0.remove(at))
    }
}

/// Listings started before the declarations are read (a one-shot command
/// starts them beside the source fetch), for the providers whose
/// observation is one listing whatever names it is asked for (the http
/// provider): the fetch and the listing both wait on the network, and the
/// cycle then finds its observations made or under way.
///
/// # Guarantees
/// * Used only if the state is as it was when the listings started,
///   checked once the cycle has read its inputs: what it remembers is then
///   no newer than what was listed. A write meanwhile (a replayed intent,
///   or a running agent's create beside `tend plan`) could remember a
///   database the listing predates, and the cycle would call it missing:
///   then the listings are stopped and the cycle observes again.
/// * A provider no subject of the cycle is routed to is not waited for
///   (its listing is stopped).
pub(crate) struct ListingAhead {
    listings: HashMap<String, tokio::task::JoinHandle<ProviderView>>,
    /// The state when the listings started (`None`: no state to compare).
    freshness: Option<Freshness>,
}

impl ListingAhead {
    /// Starts a listing of every provider that lists everything; `None`
    /// when there is none (or the state cannot tell its freshness).
    pub(crate) fn start(
        runtimes: &BTreeMap<String, Arc<ProviderRuntime>>,
        store: Option<&StateStore>,
    ) -> Option<ListingAhead> {
        let listing = listing_everything(runtimes, |_| true);
        if listing.is_empty() {
            return None;
        }
        let freshness = match store {
            Some(store) => Some(store.freshness().ok()?),
            None => None,
        };
        Some(Self::spawn(listing, freshness))
    }

    /// `given` (the listings a one-shot command started ahead for this
    /// cycle), else new ones for `scope` (see [`ListingAhead::start_for`]).
    pub(super) async fn for_cycle(
        given: Option<ListingAhead>,
        agent: &crate::agent::Agent,
        scope: &super::Scope,
    ) -> Option<ListingAhead> {
        match given {
            Some(ahead) => Some(ahead),
            None => Self::start_for(agent.runtimes(), agent.store(), scope).await,
        }
    }

    /// The same at the start of a cycle over `scope` (the running agent's:
    /// the listing then runs while the cycle reads its inputs and routes),
    /// for the providers the scope can reach; none for a cycle over some
    /// names (which providers they are is known only once routed).
    pub(crate) async fn start_for(
        runtimes: &BTreeMap<String, Arc<ProviderRuntime>>,
        store: Option<&Arc<StateStore>>,
        scope: &super::Scope,
    ) -> Option<ListingAhead> {
        let listing = match scope {
            super::Scope::All => listing_everything(runtimes, |_| true),
            super::Scope::Provider { provider, .. } => {
                listing_everything(runtimes, |name| name == provider)
            }
            super::Scope::Only(_) => return None,
        };
        if listing.is_empty() {
            return None;
        }
        let freshness = match store {
            Some(store) => Some(blocking(store, |s| s.freshness()).await.ok()?),
            None => None,
        };
        Some(Self::spawn(listing, freshness))
    }

    fn spawn(listing: Vec<Arc<ProviderRuntime>>, freshness: Option<Freshness>) -> ListingAhead {
        let listings = listing
            .into_iter()
            .map(|runtime| {
                let name = runtime.name.clone();
                let listing = tokio::spawn(async move {
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
                    view(observed)
                });
                (name, listing)
            })
            .collect();
        ListingAhead {
            listings,
            freshness,
        }
    }

    /// The listings (finished or not), if nothing was written to the state
    /// since they started; else none (stopped: the cycle observes again).
    pub(crate) async fn if_fresh(
        mut self,
        store: Option<&Arc<StateStore>>,
    ) -> HashMap<String, tokio::task::JoinHandle<ProviderView>> {
        if let Some(store) = store {
            let now = blocking(store, |s| s.freshness()).await.ok();
            if now != self.freshness {
                tracing::debug!("the state changed while listing ahead: observing again");
                // Dropped: stopped.
                return HashMap::new();
            }
        }
        std::mem::take(&mut self.listings)
    }
}

/// Listings nobody awaits (the cycle ended early) are stopped.
impl Drop for ListingAhead {
    fn drop(&mut self) {
        for listing in self.listings.values() {
            listing.abort();
        }
    }
}

/// The runtimes of the providers `wanted` names whose observation is one
/// listing whatever it is asked for.
fn listing_everything(
    runtimes: &BTreeMap<String, Arc<ProviderRuntime>>,
    wanted: impl Fn(&str) -> bool,
) -> Vec<Arc<ProviderRuntime>> {
    runtimes
        .values()
        .filter(|r| wanted(&r.name) && r.provider.lists_everything())
        .cloned()
        .collect()
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

/// Observes the subjects of every provider, all at once; `ahead`: the
/// listings already under way (see [`ListingAhead`]), awaited instead of
/// asking those providers again.
pub(crate) async fn observe_all(
    runtimes: &BTreeMap<String, Arc<ProviderRuntime>>,
    routed: &BTreeMap<String, Vec<Routed<'_>>>,
    mut ahead: HashMap<String, tokio::task::JoinHandle<ProviderView>>,
) -> HashMap<String, ProviderView> {
    let mut tasks = tokio::task::JoinSet::new();
    for (provider, subjects) in routed {
        if let Some(listing) = ahead.remove(provider) {
            let provider = provider.clone();
            tasks.spawn(async move {
                let view = listing
                    .await
                    .unwrap_or_else(|e| Err(format!("listing the provider stopped: {e}")));
                (provider, view)
            });
            continue;
        }
        let Some(runtime) = runtimes.get(provider).cloned() else {
            continue;
        };
        let names: Vec<String> = subjects
            .iter()
            .map(|r| r.database_name.to_string())
            .collect();
        // Per-database fields (extensions) only where a declaration manages them.
        let deep: Vec<String> = subjects
            .iter()
            .filter(|r| {
                r.subject
                    .declaration()
                    .is_some_and(|d| d.manifest.spec.extensions.is_some())
            })
            .map(|r| r.database_name.to_string())
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
    // Listed ahead, but no subject of this cycle is theirs.
    for listing in ahead.values() {
        listing.abort();
    }
    collect(tasks).await
}

/// Hands each subject its observation. Usually one subject per database;
/// a tombstone and a new declaration may share one, and both must see it:
/// those are cloned, every other observation is moved to its subject.
pub(crate) fn distribute(subjects: &[Routed<'_>], view: Option<ProviderView>) -> Vec<Observed> {
    let listing = match view {
        Some(Ok(listing)) => listing,
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
    // The subjects in the listing's order, then one merge of both: each
    // observation moves to the subject that names its database (copied
    // when several do).
    let mut order: Vec<usize> = (0..subjects.len()).collect();
    order.sort_by(|a, b| subjects[*a].database_name.cmp(&subjects[*b].database_name));
    let mut observed: Vec<Observed> = subjects.iter().map(|_| Observed::NotFound).collect();
    let mut listed = listing.0.into_iter().peekable();
    for run in order.chunk_by(|a, b| subjects[*a].database_name == subjects[*b].database_name) {
        let name = &*subjects[run[0]].database_name;
        while listed
            .next_if(|o| o.database_name.as_str() < name)
            .is_some()
        {}
        let Some(found) = listed.next_if(|o| o.database_name == name) else {
            continue;
        };
        if let Some((last, others)) = run.split_last() {
            for at in others {
                observed[*at] = Observed::Found(found.clone());
            }
            observed[*last] = Observed::Found(found);
        }
    }
    observed
}

#[cfg(test)]
#[path = "observe_tests.rs"]
mod tests;
