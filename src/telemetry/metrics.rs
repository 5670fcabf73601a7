//! The agent's metrics (OpenMetrics text through `prometheus-client`).
//!
//! Counters are updated where things happen (a cycle, an operation, a
//! fetch, a reload); gauges that describe the fleet are set from the merged
//! status report after every cycle, so `/metrics` and `/v1/status` count
//! the same resources.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The fleet gauges' values, counted from the merged report by the
/// status layer (metrics read no report: they sit below it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fleet {
    /// Resources per state name, every state listed (0 included).
    pub states: Vec<(&'static str, usize)>,
    /// Drifted fields per origin (`declared`, `out-of-band`).
    pub drifted_fields: Vec<(&'static str, usize)>,
    pub overrides_active: usize,
    pub overrides_expired: usize,
    /// Each active override with an expiry: resource, Unix seconds.
    pub override_expiries: Vec<(String, i64)>,
    /// Deleting or Stalled.
    pub pending_deletions: usize,
    pub suspended: bool,
}

/// Labels: a list of (name, value) pairs.
type Labels = Vec<(&'static str, String)>;

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

fn histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    cycles: Family<Labels, Counter>,
    cycle_seconds: Family<Labels, Histogram>,
    resources: Family<Labels, Gauge>,
    drifted_fields: Family<Labels, Gauge>,
    overrides: Family<Labels, Gauge>,
    /// When each active override with an expiry expires (Unix seconds):
    /// an alert compares it with `time()`, so "expiring soon" needs no
    /// report to be made at the right moment.
    override_expiry: Family<Labels, Gauge>,
    pending_deletions: Gauge,
    operations: Family<Labels, Counter>,
    provider_errors: Family<Labels, Counter>,
    queue_depth: Family<Labels, Gauge>,
    source_commit: Family<Labels, Gauge>,
    source_commit_age: Gauge<f64, AtomicU64>,
    fetch_errors: Counter,
    last_success: Gauge<f64, AtomicU64>,
    reloads: Family<Labels, Counter>,
    config_stale: Gauge,
    ready: Gauge,
    leader: Gauge,
    status_commits: Counter,
    status_failing: Gauge,
    suspended: Gauge,
    /// The commit label currently set (replaced, not accumulated).
    commit: Mutex<Option<String>>,
    /// Held by a scrape from setting the fleet's gauges to encoding them:
    /// `override_expiry` is cleared and filled again, and two scrapes at
    /// once (two Prometheus servers) on the agent's two threads would
    /// otherwise encode it empty, or mixed from two reports.
    scrapes: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("tend"),
            cycles: Family::default(),
            cycle_seconds: Family::new_with_constructor(histogram),
            resources: Family::default(),
            drifted_fields: Family::default(),
            overrides: Family::default(),
            override_expiry: Family::default(),
            pending_deletions: Gauge::default(),
            operations: Family::default(),
            provider_errors: Family::default(),
            queue_depth: Family::default(),
            source_commit: Family::default(),
            source_commit_age: Gauge::default(),
            fetch_errors: Counter::default(),
            last_success: Gauge::default(),
            reloads: Family::default(),
            config_stale: Gauge::default(),
            ready: Gauge::default(),
            leader: Gauge::default(),
            status_commits: Counter::default(),
            status_failing: Gauge::default(),
            suspended: Gauge::default(),
            commit: Mutex::new(None),
            scrapes: Mutex::new(()),
        };
        let r = &mut m.registry;
        r.register(
            "cycles",
            "Reconcile cycles by provider, scope and result",
            m.cycles.clone(),
        );
        r.register(
            "cycle_duration_seconds",
            "Duration of reconcile cycles by provider and phase",
            m.cycle_seconds.clone(),
        );
        r.register(
            "resources",
            "Resources by state (as in /v1/status)",
            m.resources.clone(),
        );
        r.register(
            "drifted_fields",
            "Drifted fields by origin",
            m.drifted_fields.clone(),
        );
        r.register(
            "overrides",
            "Overrides by status (active, expired)",
            m.overrides.clone(),
        );
        r.register(
            "override_expiry_timestamp_seconds",
            "When each active override with an expiry expires, by resource (Unix seconds)",
            m.override_expiry.clone(),
        );
        r.register(
            "pending_deletions",
            "Removed declarations waiting to be deleted",
            m.pending_deletions.clone(),
        );
        r.register(
            "operations",
            "Operations by kind and result",
            m.operations.clone(),
        );
        r.register(
            "provider_errors",
            "Provider errors by provider and kind",
            m.provider_errors.clone(),
        );
        r.register(
            "queue_depth",
            "Resources waiting for a due time, by provider",
            m.queue_depth.clone(),
        );
        r.register(
            "source_commit",
            "The source commit in force (label commit)",
            m.source_commit.clone(),
        );
        r.register(
            "source_commit_age_seconds",
            "Age of the source commit in force",
            m.source_commit_age.clone(),
        );
        r.register(
            "fetch_errors",
            "Failed polls of the source",
            m.fetch_errors.clone(),
        );
        r.register(
            "last_successful_cycle_timestamp_seconds",
            "When a cycle last finished without error (Unix time)",
            m.last_success.clone(),
        );
        r.register(
            "config_reloads",
            "Configuration reloads by result",
            m.reloads.clone(),
        );
        r.register(
            "config_reload_failed",
            "1 while the running configuration is not the file's (the last reload was refused)",
            m.config_stale.clone(),
        );
        r.register(
            "ready",
            "1 once the first snapshot was reconciled",
            m.ready.clone(),
        );
        r.register(
            "leader",
            "1 while this agent leads its group (always, with the sqlite state); 0 while it stands by",
            m.leader.clone(),
        );
        r.register(
            "status_commits",
            "Commits pushed to the status branch",
            m.status_commits.clone(),
        );
        r.register(
            "status_publish_failing",
            "1 while the status branch or the report files cannot be written",
            m.status_failing.clone(),
        );
        r.register(
            "suspended",
            "1 while the agent is suspended (tend suspend) and holds every change",
            m.suspended.clone(),
        );
        // Counters a dashboard alerts on exist from the start, at zero.
        for result in ["ok", "refused"] {
            drop(m.reloads.get_or_create(&labels(&[("result", result)])));
        }
        m
    }

    /// The OpenMetrics text of a scrape, the fleet's gauges set from
    /// `fleet` first (one scrape at a time).
    pub fn scrape(&self, fleet: Option<&Fleet>) -> String {
        let _one_at_a_time = self.scrapes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(fleet) = fleet {
            self.fleet(fleet);
        }
        self.encode()
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// A cycle of `provider` over `scope` (`full` or `due`) ended.
    pub fn cycle(&self, provider: &str, scope: &str, ok: bool, seconds: f64) {
        let result = if ok { "ok" } else { "error" };
        self.cycles
            .get_or_create(&labels(&[
                ("provider", provider),
                ("scope", scope),
                ("result", result),
            ]))
            .inc();
        self.cycle_seconds
            .get_or_create(&labels(&[("provider", provider), ("phase", "reconcile")]))
            .observe(seconds);
    }

    /// The operations a cycle ran, as (kind, result) labels
    /// (`executor::Executed::metric_labels`).
    pub fn operations<'a>(&self, operations: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for (kind, result) in operations {
            self.operations
                .get_or_create(&labels(&[("kind", kind), ("result", result)]))
                .inc();
        }
    }

    /// A provider's error series exist from its worker's start, at 0: an
    /// absent series hides the first error from `increase()` alerts and
    /// from a runbook's `grep`.
    pub fn provider_known(&self, provider: &str) {
        for kind in ["observe", "operation"] {
            drop(
                self.provider_errors
                    .get_or_create(&labels(&[("provider", provider), ("kind", kind)])),
            );
        }
    }

    /// A provider could not be observed (`kind`: what failed).
    pub fn provider_error(&self, provider: &str, kind: &str) {
        self.provider_errors
            .get_or_create(&labels(&[("provider", provider), ("kind", kind)]))
            .inc();
    }

    pub fn queue_depth(&self, provider: &str, depth: usize) {
        self.queue_depth
            .get_or_create(&labels(&[("provider", provider)]))
            .set(depth as i64);
    }

    /// What the last status publication did.
    pub fn status_published(&self, committed: bool, failing: bool) {
        if committed {
            self.status_commits.inc();
        }
        self.status_failing.set(i64::from(failing));
    }

    pub fn fetch_error(&self) {
        self.fetch_errors.inc();
    }

    pub fn succeeded_at(&self, unix_seconds: f64) {
        self.last_success.set(unix_seconds);
    }

    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "refused" };
        self.reloads
            .get_or_create(&labels(&[("result", result)]))
            .inc();
        self.config_stale.set(i64::from(!ok));
    }

    pub fn ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    pub fn leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The source commit in force and its age.
    pub fn source(&self, commit: &str, age_seconds: f64) {
        let mut current = self.commit.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_deref() != Some(commit) {
            if let Some(old) = current.take() {
                self.source_commit.remove(&labels(&[("commit", &old)]));
            }
            self.source_commit
                .get_or_create(&labels(&[("commit", commit)]))
                .set(1);
            *current = Some(commit.to_string());
        }
        self.source_commit_age.set(age_seconds);
    }

    /// Sets the fleet gauges (from the merged report: see
    /// `status::Report::fleet`).
    pub fn fleet(&self, fleet: &Fleet) {
        for (state, count) in &fleet.states {
            self.resources
                .get_or_create(&labels(&[("state", state)]))
                .set(*count as i64);
        }
        for (origin, count) in &fleet.drifted_fields {
            self.drifted_fields
                .get_or_create(&labels(&[("origin", origin)]))
                .set(*count as i64);
        }
        for (status, count) in [
            ("active", fleet.overrides_active),
            ("expired", fleet.overrides_expired),
        ] {
            self.overrides
                .get_or_create(&labels(&[("status", status)]))
                .set(count as i64);
        }
        // Replaced whole: an override that went (or expired) leaves no
        // series behind.
        self.override_expiry.clear();
        for (resource, at) in &fleet.override_expiries {
            self.override_expiry
                .get_or_create(&labels(&[("resource", resource)]))
                .set(*at);
        }
        self.pending_deletions.set(fleet.pending_deletions as i64);
        self.suspended.set(i64::from(fleet.suspended));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two scrapes at once never encode the override expiries cleared by
    /// the other, nor a mix of two reports' (the agent serves scrapes on
    /// two threads).
    #[test]
    fn scrapes_at_once_each_see_one_report_s_override_expiries() {
        let metrics = Metrics::new();
        let fleet = |resource: &str| Fleet {
            override_expiries: vec![(resource.to_string(), 1_800_000_000)],
            ..Fleet::default()
        };
        let (a, b) = (fleet("billing"), fleet("orders"));
        std::thread::scope(|s| {
            for mine in [&a, &b] {
                let metrics = &metrics;
                s.spawn(move || {
                    for _ in 0..2_000 {
                        let text = metrics.scrape(Some(mine));
                        let series = text
                            .lines()
                            .filter(|l| l.starts_with("tend_override_expiry_timestamp"))
                            .count();
                        assert_eq!(series, 1, "a scrape encoded {series} expiries:\n{text}");
                    }
                });
            }
        });
    }
}
