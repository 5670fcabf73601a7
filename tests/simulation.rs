//! A seeded simulation of the real agent: the real decision core,
//! executor, journal and state store, the sandbox provider, a simulated
//! clock and an in-memory source, driven by a random schedule of events
//! (declarations added, edited, removed; overrides added and removed;
//! out-of-band edits and drops; lost responses and failing calls; crashes
//! that drop the process's state and keep the state store and provider;
//! time passing). Invariants are checked after every step; a failure
//! prints the seed, the step and the events so far.
//!
//! `TEND_SIM_SEEDS=N` runs N seeds (CI: 1,000, about two minutes),
//! `TEND_SIM_SEED=S` replays one.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use support::dice::Dice;
use tend::agent::Agent;
use tend::clock::{Clock, ManualClock};
use tend::config::Config;
use tend::engine::{Action, State};
use tend::journal::Access;
use tend::model::{DeclarationSet, parse_file};
use tend::provider::sandbox::SandboxProvider;
use tend::reconcile::{Mode, Scope, reconcile};
use tend::source::Snapshot;

const NAMES: &[&str] = &["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];
const GRACE: Duration = Duration::from_secs(600);
const DELETION_DELAY: Duration = Duration::from_secs(300);
const MAX_DELETIONS: usize = 2;

/// What Git declares for one name.
#[derive(Debug, Clone, PartialEq)]
struct Declared {
    limit: i64,
    delete: bool,
    ignore: bool,
}

fn yaml(name: &str, d: &Declared) -> String {
    let annotations = if d.ignore {
        "  annotations:\n    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: \"INC-1: simulated\"\n    tend.dev/override-expires: 720h\n"
    } else {
        ""
    };
    format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\n{annotations}spec:\n  connectionLimit: {}\n  deletionPolicy: {}\n",
        d.limit,
        if d.delete { "Delete" } else { "Retain" }
    )
}

fn snapshot(declared: &BTreeMap<String, Declared>, step: usize) -> Arc<Snapshot> {
    let files = declared
        .iter()
        .map(|(name, d)| parse_file(Path::new(&format!("{name}.yaml")), yaml(name, d).as_bytes()))
        .collect();
    Arc::new(Snapshot {
        commit: format!("{step:040x}"),
        commit_time: SystemTime::UNIX_EPOCH,
        files: Vec::new(),
        declarations: DeclarationSet::from_files(files),
    })
}

/// What the simulation itself did to a database at the provider, and when.
#[derive(Debug, Clone)]
struct OutOfBand {
    limit: i64,
    at: SystemTime,
}

/// A deliberately broken tend, to show an invariant catches it: tend runs
/// with a setting that breaks the promise the invariants hold it to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sabotage {
    None,
    /// tend corrects out-of-band drift at once (no grace).
    NoGrace,
    /// tend deletes as soon as a declaration is removed.
    NoDeletionDelay,
    /// tend's mass-deletion guard lets everything through.
    NoGuard,
}

struct World {
    sabotage: Sabotage,
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    declared: BTreeMap<String, Declared>,
    /// When each name was last removed from Git, and what it declared.
    removed_at: BTreeMap<String, (SystemTime, Declared)>,
    /// When each name's declaration last changed.
    changed_at: BTreeMap<String, SystemTime>,
    out_of_band: BTreeMap<String, OutOfBand>,
    /// A database someone else owns (no marker): must never change.
    foreign: (String, BTreeMap<String, Value>),
    history: Vec<String>,
}

impl World {
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

    fn config(&self, faults: &str) -> Config {
        let path = self.dir.path().join("tend.toml");
        std::fs::write(
            &path,
            format!(
                "agent_id = \"sim\"\nstate_dir = \"state\"\n[source]\nurl = \"/nonexistent\"\n[status]\nbranch = \"\"\nkeep_reports = 1\n[reconcile]\ndrift_grace = \"{}s\"\ndeletion_delay = \"{}s\"\nmax_deletions = {}\nmax_deletion_percent = 100\nretry_min_delay = \"1ms\"\nmax_retries = 2\nconfirm_timeout = \"50ms\"\n[providers.sandbox]\nkind = \"sandbox\"\nrate_limit = 10000\n[providers.sandbox.faults]\n{faults}",
                if self.sabotage == Sabotage::NoGrace { 0 } else { GRACE.as_secs() },
                if self.sabotage == Sabotage::NoDeletionDelay { 0 } else { DELETION_DELAY.as_secs() },
                if self.sabotage == Sabotage::NoGuard { 100 } else { MAX_DELETIONS },
            ),
        )
        .unwrap();
        Config::load(&path).unwrap()
    }

    fn limits(&self) -> BTreeMap<String, i64> {
        self.sandbox()
            .load()
            .unwrap()
            .databases
            .iter()
            .map(|(n, db)| {
                (
                    n.clone(),
                    db.fields
                        .get("connectionLimit")
                        .and_then(Value::as_i64)
                        .unwrap_or(-1),
                )
            })
            .collect()
    }
}

/// Runs one seed; `Err` names the broken invariant.
async fn run_seed(seed: u64, steps: usize, sabotage: Sabotage) -> Result<(), String> {
    let mut dice = Dice(seed | 1);
    let base = if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let mut w = World {
        sabotage,
        dir: base,
        clock: Arc::new(ManualClock::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        )),
        declared: BTreeMap::new(),
        removed_at: BTreeMap::new(),
        changed_at: BTreeMap::new(),
        out_of_band: BTreeMap::new(),
        foreign: ("zulu".into(), BTreeMap::new()),
        history: Vec::new(),
    };
    // Someone else's database, planted before tend starts.
    {
        let sandbox = w.sandbox();
        let mut state = sandbox.load().unwrap();
        let mut db = serde_json::from_value::<tend::provider::sandbox::SandboxDatabase>(json!({
            "id": "foreign-1", "fields": {"connectionLimit": 7}, "labels": {}, "created_at": 0, "ready_at": 0
        }))
        .unwrap();
        db.labels.clear();
        w.foreign.1 = db.fields.clone();
        state.databases.insert(w.foreign.0.clone(), db);
        sandbox.save(&state).unwrap();
    }
    let mut agent =
        Agent::open(w.config(""), Access::Writer, w.clock.clone()).map_err(|e| e.to_string())?;
    for step in 0..steps {
        let now = w.clock.now();
        let name = NAMES[dice.below(NAMES.len() as u64) as usize].to_string();
        let event = match dice.below(12) {
            0 | 1 => {
                let d = Declared {
                    limit: 10 + dice.below(40) as i64,
                    delete: dice.below(2) == 0,
                    ignore: false,
                };
                w.declared.insert(name.clone(), d);
                w.changed_at.insert(name.clone(), now);
                w.removed_at.remove(&name);
                format!("declare {name}")
            }
            2 if w.declared.contains_key(&name) => {
                let limit = 10 + dice.below(40) as i64;
                w.declared.get_mut(&name).unwrap().limit = limit;
                w.changed_at.insert(name.clone(), now);
                format!("edit {name} limit={limit}")
            }
            3 if w.declared.contains_key(&name) => {
                let d = w.declared.remove(&name).unwrap();
                w.removed_at.insert(name.clone(), (now, d));
                format!("remove {name}")
            }
            4 if w.declared.contains_key(&name) => {
                let d = w.declared.get_mut(&name).unwrap();
                d.ignore = !d.ignore;
                w.changed_at.insert(name.clone(), now);
                format!("ignore-fields {name} = {}", d.ignore)
            }
            5 => {
                let sandbox = w.sandbox();
                let mut state = sandbox.load().unwrap();
                match state.databases.get_mut(&name) {
                    Some(db) => {
                        let limit = 100 + dice.below(100) as i64;
                        // Still showing the last out-of-band value: the same
                        // spell of drift, whose grace runs from its start.
                        let current = db.fields.get("connectionLimit").and_then(Value::as_i64);
                        let at = match w.out_of_band.get(&name) {
                            Some(o) if Some(o.limit) == current => o.at,
                            _ => now,
                        };
                        db.fields.insert("connectionLimit".into(), json!(limit));
                        sandbox.save(&state).unwrap();
                        w.out_of_band.insert(name.clone(), OutOfBand { limit, at });
                        format!("out-of-band {name} limit={limit}")
                    }
                    None => "nothing".into(),
                }
            }
            6 => {
                let sandbox = w.sandbox();
                let mut state = sandbox.load().unwrap();
                if state.databases.remove(&name).is_some() {
                    sandbox.save(&state).unwrap();
                    w.out_of_band.remove(&name);
                    format!("out-of-band drop {name}")
                } else {
                    "nothing".into()
                }
            }
            7 => {
                let d = Duration::from_secs(1 + dice.below(900));
                w.clock.advance(d);
                format!("advance {}s", d.as_secs())
            }
            8 => {
                let faults: String = match dice.below(3) {
                    0 => "lose_responses = 1\n".into(),
                    1 => "fail_calls = 2\n".into(),
                    _ => String::new(),
                };
                // The process dies: its memory goes, the state store and
                // the provider stay.
                drop(agent);
                agent = Agent::open(w.config(&faults), Access::Writer, w.clock.clone())
                    .map_err(|e| e.to_string())?;
                format!("crash; restart with faults {:?}", faults.trim())
            }
            9 if w.declared.len() > 1 => {
                // A large removal: everything but one declaration.
                let keep = w.declared.keys().next().cloned().unwrap();
                let gone: Vec<String> =
                    w.declared.keys().filter(|n| **n != keep).cloned().collect();
                for n in &gone {
                    let d = w.declared.remove(n).unwrap();
                    w.removed_at.insert(n.clone(), (now, d));
                }
                format!("remove all but {keep}: {gone:?}")
            }
            _ => {
                w.clock.advance(Duration::from_secs(30));
                "advance 30s".into()
            }
        };
        w.history.push(format!("step {step}: {event}"));
        let before = w.limits();
        let snap = snapshot(&w.declared, step);
        let outcome = reconcile(&agent, &snap, Mode::Apply, &Scope::All).await;
        let after = w.limits();
        let now = w.clock.now();
        let fail = |what: String| {
            Err(format!(
                "seed {seed}, step {step}: {what}\n{}",
                w.history.join("\n")
            ))
        };
        // Someone else's database is never touched.
        match w.sandbox().load().unwrap().databases.get(&w.foreign.0) {
            Some(db) if db.fields == w.foreign.1 => {}
            other => return fail(format!("the foreign database changed: {other:?}")),
        }
        // The mass-deletion guard: more due deletions than the limit hold
        // them all, so one cycle never deletes more than the limit.
        let deleted = before.keys().filter(|db| !after.contains_key(*db)).count();
        let dropped_by_sim = usize::from(event.starts_with("out-of-band drop"));
        if deleted.saturating_sub(dropped_by_sim) > MAX_DELETIONS {
            return fail(format!(
                "{deleted} databases deleted in one cycle (the guard allows {MAX_DELETIONS})"
            ));
        }
        for (db, limit) in &before {
            match after.get(db) {
                // Gone: only a declaration removed from Git with Delete,
                // after deletion_delay.
                None => {
                    let removed = w.removed_at.get(db);
                    match removed {
                        Some((at, d))
                            if d.delete
                                && now.duration_since(*at).unwrap_or_default()
                                    >= DELETION_DELAY => {}
                        _ => {
                            return fail(format!(
                                "{db} was deleted (removed: {removed:?}, now {now:?})"
                            ));
                        }
                    }
                }
                Some(new) if new != limit => {
                    // tend changed it. Never an ignored field, never an
                    // out-of-band value before grace (unless Git changed since).
                    if let Some(d) = w.declared.get(db)
                        && d.ignore
                    {
                        return fail(format!(
                            "{db}: ignored connectionLimit changed {limit} -> {new}"
                        ));
                    }
                    if let Some(oob) = w.out_of_band.get(db)
                        && oob.limit == *limit
                        && now.duration_since(oob.at).unwrap_or_default() < GRACE
                        && w.changed_at.get(db).is_none_or(|c| *c < oob.at)
                    {
                        return fail(format!(
                            "{db}: out-of-band {limit} corrected to {new} before drift_grace"
                        ));
                    }
                }
                _ => {}
            }
        }
        // Never two databases for one declaration; never InSync when it differs.
        let state = w.sandbox().load().unwrap();
        let mut owners: BTreeMap<String, usize> = BTreeMap::new();
        for db in state.databases.values() {
            if let Some(decl) = db.labels.get("tend.dev/owner-declaration") {
                *owners.entry(decl.clone()).or_default() += 1;
            }
        }
        if let Some((decl, n)) = owners.iter().find(|(_, n)| **n > 1) {
            return fail(format!("{n} databases for {decl}"));
        }
        if let Ok(outcome) = &outcome {
            for r in &outcome.latest().resources {
                if r.decision.state == State::InSync
                    && let Some(d) = w.declared.get(&r.name)
                    && after.get(&r.name) != Some(&d.limit)
                    && !d.ignore
                {
                    return fail(format!(
                        "{} reported InSync with {:?} declared {}",
                        r.name,
                        after.get(&r.name),
                        d.limit
                    ));
                }
            }
        }
    }
    // The faults stop: everything converges within a bounded number of cycles.
    drop(agent);
    let agent =
        Agent::open(w.config(""), Access::Writer, w.clock.clone()).map_err(|e| e.to_string())?;
    w.clock.advance(GRACE + DELETION_DELAY);
    let snap = snapshot(&w.declared, steps);
    let mut last = None;
    for _ in 0..6 {
        let outcome = reconcile(&agent, &snap, Mode::Apply, &Scope::All)
            .await
            .map_err(|e| e.to_string())?;
        // Converged, or held with a reason the report gives: an override,
        // a block, an unconvergeable field, a deletion the guard holds (an
        // empty tree never deletes).
        let settled = outcome.latest().resources.iter().all(|r| {
            matches!(
                r.decision.state,
                State::InSync | State::Overridden | State::Blocked | State::Unconvergeable
            ) || (r.decision.state == State::Deleting && r.decision.action == Action::Hold)
        });
        last = Some(
            outcome
                .latest()
                .resources
                .iter()
                .map(|r| format!("{} {:?}: {}", r.name, r.decision.state, r.decision.reason))
                .collect::<Vec<_>>(),
        );
        if settled {
            return Ok(());
        }
        w.clock.advance(Duration::from_secs(60));
    }
    Err(format!(
        "seed {seed}: did not converge after the faults stopped: {last:#?}\n{}",
        w.history.join("\n")
    ))
}

#[test]
fn seeded_schedules_keep_every_promise() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let seeds: Vec<u64> = match std::env::var("TEND_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("TEND_SIM_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("TEND_SIM_SEEDS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000);
            (1..=n).collect()
        }
    };
    for seed in &seeds {
        if let Err(e) = runtime.block_on(run_seed(*seed, 25, Sabotage::None)) {
            panic!("{e}\nreplay: TEND_SIM_SEED={seed} cargo nextest run --test simulation");
        }
    }
    println!(
        "simulation: {} seeds, 25 steps each, every invariant held",
        seeds.len()
    );
}

/// Each invariant catches the bug it exists for: tend run with the
/// promise broken is refuted within the CI seed budget, by that invariant.
#[test]
fn the_simulation_refutes_a_tend_that_breaks_a_promise() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (sabotage, expected) in [
        (Sabotage::NoGrace, "before drift_grace"),
        (Sabotage::NoDeletionDelay, "was deleted"),
        (Sabotage::NoGuard, "in one cycle (the guard allows"),
    ] {
        let found = (1..=1000u64).find_map(|seed| {
            runtime
                .block_on(run_seed(seed, 25, sabotage))
                .err()
                .map(|e| (seed, e))
        });
        let (seed, error) =
            found.unwrap_or_else(|| panic!("{sabotage:?} was never caught in 1,000 seeds"));
        assert!(
            error.contains(expected),
            "{sabotage:?} (seed {seed}) failed otherwise: {error}"
        );
        println!("simulation: {sabotage:?} caught by seed {seed}");
    }
}
