//! The long-lived agent through the library: opened once, reconciled many
//! times inside the caller's runtime, with an injected clock that moves
//! time without sleeping.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::json;
use support::config::TendConfig;
use support::git::{TestRepo, manifest};
use tend::testing::agent::Agent;
use tend::testing::clock::{Clock, ManualClock};
use tend::testing::config::Config;
use tend::testing::engine::{Action, Rule, State};
use tend::testing::journal::Access;
use tend::testing::provider::sandbox::SandboxProvider;
use tend::testing::reconcile::{Mode, Scope, reconcile};
use tend::testing::source::Snapshot;

struct Fixture {
    _repo: TestRepo,
    dir: tempfile::TempDir,
    config: Config,
    clock: Arc<ManualClock>,
}

fn fixture(config: impl FnOnce(TendConfig) -> TendConfig) -> Fixture {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10));
    repo.write("billing.yaml", &manifest("billing", 10));
    repo.commit("declarations");
    let dir = tempfile::tempdir().unwrap();
    let path = config(TendConfig::new(dir.path(), &repo.url())).write();
    Fixture {
        _repo: repo,
        config: Config::load(&path).unwrap(),
        dir,
        clock: Arc::new(ManualClock::new(SystemTime::now())),
    }
}

impl Fixture {
    fn agent(&self, access: Access) -> Agent {
        let clock: Arc<dyn Clock> = self.clock.clone();
        Agent::open(self.config.clone(), access, clock).unwrap()
    }

    fn sandbox(&self) -> SandboxProvider {
        let clock: Arc<dyn Clock> = self.clock.clone();
        SandboxProvider::new(
            "sandbox",
            &self.dir.path().join("state"),
            Duration::ZERO,
            Default::default(),
        )
        .with_clock(clock)
    }

    /// An operator changes `name`'s connection limit behind tend's back.
    fn change_limit_at_the_provider(&self, name: &str, limit: i64) {
        support::fixture::change_limit(&self.sandbox(), name, limit);
    }
}

async fn snapshot(agent: &Agent) -> Arc<Snapshot> {
    let source = agent.source().unwrap();
    let now = agent.clock().now();
    tokio::task::spawn_blocking(move || source.poll_once(now))
        .await
        .unwrap()
        .snapshot
        .unwrap()
}

#[tokio::test]
async fn one_agent_reconciles_again_and_again_on_the_callers_runtime() {
    let f = fixture(|c| c);
    let agent = f.agent(Access::Writer);
    let snapshot = snapshot(&agent).await;
    let first = reconcile(&agent, &snapshot, Mode::Apply, &Scope::All)
        .await
        .unwrap();
    assert_eq!(first.operations.len(), 2);
    for _ in 0..3 {
        let again = reconcile(&agent, &snapshot, Mode::Apply, &Scope::All)
            .await
            .unwrap();
        assert!(
            again.operations.is_empty(),
            "a no-change cycle does nothing"
        );
        assert!(
            again
                .latest()
                .resources
                .iter()
                .all(|r| r.decision.state == State::InSync)
        );
    }
}

#[tokio::test]
async fn the_injected_clock_ends_drift_grace_without_sleeping() {
    let f = fixture(|c| c.reconcile("drift_grace", "\"10m\""));
    let agent = f.agent(Access::Writer);
    let snapshot = snapshot(&agent).await;
    reconcile(&agent, &snapshot, Mode::Apply, &Scope::All)
        .await
        .unwrap();

    // An operator changes the limit behind tend's back.
    f.change_limit_at_the_provider("orders", 99);
    let sandbox = f.sandbox();
    f.clock.advance(Duration::from_secs(1));

    let held = reconcile(&agent, &snapshot, Mode::Apply, &Scope::All)
        .await
        .unwrap();
    let orders = held
        .latest()
        .resources
        .iter()
        .find(|r| r.name == "orders")
        .unwrap();
    assert_eq!(
        (orders.decision.action, orders.decision.rule),
        (Action::Hold, Rule::DriftGrace)
    );
    let due = held.due();
    assert_eq!(due.len(), 1, "only orders waits for something: {due:?}");
    assert_eq!(due[0].0, "orders");
    assert_eq!(
        due[0].1,
        f.clock.now() + Duration::from_secs(600),
        "drift_grace from the first sighting"
    );

    f.clock.set(due[0].1);
    let corrected = reconcile(&agent, &snapshot, Mode::Apply, &Scope::All)
        .await
        .unwrap();
    assert_eq!(corrected.operations.len(), 1, "{:?}", corrected.operations);
    assert_eq!(
        sandbox.load().unwrap().databases["orders"].fields["connectionLimit"],
        json!(10)
    );
}

/// What a report shows of each resource's decision.
fn decisions(plan: &tend::testing::reconcile::Plan<'_>) -> Vec<String> {
    plan.resources
        .iter()
        .map(|r| {
            let d = &r.decision;
            format!(
                "{} {:?} {:?} {:?} {:?} {:?} {}",
                r.name, d.state, d.action, d.rule, d.act_at, d.changes, d.reason
            )
        })
        .collect()
}

#[tokio::test]
async fn after_an_operation_the_report_shows_what_a_fresh_plan_decides() {
    let f = fixture(|c| c.reconcile("drift_grace", "\"10m\""));
    f._repo.write("payments.yaml", &manifest("payments", 10));
    f._repo.commit("payments");
    let agent = f.agent(Access::Writer);
    let snapshot = snapshot(&agent).await;
    reconcile(&agent, &snapshot, Mode::Apply, &Scope::All)
        .await
        .unwrap();
    // billing drifts out of band, and is held by drift_grace.
    f.change_limit_at_the_provider("billing", 99);
    f.clock.advance(Duration::from_secs(1));
    reconcile(&agent, &snapshot, Mode::Apply, &Scope::All)
        .await
        .unwrap();

    // orders changes in Git: one update, and the report decided after it.
    f._repo.write("orders.yaml", &manifest("orders", 20));
    f._repo.commit("raise orders");
    f.clock.advance(Duration::from_secs(1));
    let snapshot = self::snapshot(&agent).await;
    let applied = reconcile(&agent, &snapshot, Mode::Apply, &Scope::All)
        .await
        .unwrap();
    assert_eq!(applied.operations.len(), 1, "{:?}", applied.operations);
    let planned = reconcile(&agent, &snapshot, Mode::Plan, &Scope::All)
        .await
        .unwrap();
    let shown = decisions(applied.latest());
    assert_eq!(shown, decisions(planned.latest()));
    assert!(shown[1].starts_with("orders InSync"), "{shown:#?}");
    assert!(
        shown[0].starts_with("billing Drifted Hold DriftGrace"),
        "{shown:#?}"
    );
}

#[tokio::test]
async fn a_scope_decides_only_the_named_resources() {
    let f = fixture(|c| c);
    let agent = f.agent(Access::Writer);
    let snapshot = snapshot(&agent).await;
    let only = Scope::Only(["billing".to_string()].into());
    let outcome = reconcile(&agent, &snapshot, Mode::Apply, &only)
        .await
        .unwrap();
    let names: Vec<&str> = outcome
        .latest()
        .resources
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["billing"]);
    assert_eq!(
        f.sandbox()
            .load()
            .unwrap()
            .databases
            .keys()
            .collect::<Vec<_>>(),
        ["billing"]
    );
}

#[tokio::test]
async fn observation_goes_through_the_providers_configured_rate_limit() {
    let f = fixture(|c| c.sandbox("rate_limit", "1"));
    let agent = f.agent(Access::ReadOnly);
    let snapshot = snapshot(&agent).await;
    let limiter = &agent.runtimes()["sandbox"].limiter;
    assert!(
        limiter.check().is_ok(),
        "a fresh limiter has its one call per second"
    );
    // Refill (one token per second), then plan: the observation takes it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    reconcile(&agent, &snapshot, Mode::Plan, &Scope::All)
        .await
        .unwrap();
    assert!(
        limiter.check().is_err(),
        "the observation did not go through the provider's limiter"
    );
}

#[tokio::test]
async fn a_reader_writes_nothing() {
    let f = fixture(|c| c);
    {
        let writer = f.agent(Access::Writer);
        let snapshot = snapshot(&writer).await;
        reconcile(&writer, &snapshot, Mode::Apply, &Scope::All)
            .await
            .unwrap();
    }
    let db = f.dir.path().join("state/state.db");
    let version = || {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row("SELECT count(*) FROM override_seen", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
    };
    let before = std::fs::read(&db).unwrap();
    let reader = f.agent(Access::ReadOnly);
    let snapshot = snapshot(&reader).await;
    let outcome = reconcile(&reader, &snapshot, Mode::Plan, &Scope::All)
        .await
        .unwrap();
    assert_eq!(outcome.plan.resources.len(), 2);
    assert!(matches!(
        reconcile(&reader, &snapshot, Mode::Apply, &Scope::All).await,
        Err(tend::testing::reconcile::ReconcileError::ReadOnly)
    ));
    assert_eq!(version(), 0);
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "the state file changed under a reader"
    );
}
