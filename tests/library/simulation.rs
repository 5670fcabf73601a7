//! A seeded simulation of the real agent: the real decision core,
//! executor, journal and state store, the sandbox provider, a simulated
//! clock and an in-memory source, driven by a schedule of events generated
//! from a seed: declarations added, edited, renamed, moved between files
//! and removed; `ignore-fields` annotations, local pauses (`tend override
//! set`) and pauses in provider labels set, expiring and cleared;
//! out-of-band edits and drops at the provider; crashes that drop the
//! process's state and keep the state store and the provider, between
//! cycles (restarting with lost responses, failing calls, 429 bursts or
//! stale reads) and inside one, at an operation's commit point; a
//! declaration naming someone else's database; a source
//! that refuses new heads (a rewritten history, an unreachable remote), an
//! empty tree and a file that does not parse; configuration reloads that
//! change the drift policy and grace; time passing. Invariants are checked
//! after every step. A failing schedule is shrunk to a short one that
//! breaks the same invariant, and printed with its replay command.
//!
//! `TEND_SIM_SEEDS=N` runs N seeds (CI: 1,000), `TEND_SIM_SEED=S` replays
//! one (`TEND_SIM_TRACE=1` prints every cycle's decisions). The provider keeps databases by id, not by name
//! (`names_not_unique`): only tend's operation ids stand between a
//! retried create and a second database.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use support::dice::Dice;
use tend::testing::agent::Agent;
use tend::testing::clock::{Clock, ManualClock};
use tend::testing::config::Config;
use tend::testing::engine::{Action, State};
use tend::testing::journal::{Access, IntentState, StateStore};
use tend::testing::model::{DeclarationSet, parse_file};
use tend::testing::process::failpoint::{AFTER_CALL, AFTER_CONFIRM, AFTER_INTENT, SimulatedCrash};
use tend::testing::provider::Observed;
use tend::testing::provider::sandbox::{SandboxProvider, SandboxState};
use tend::testing::reconcile::{Mode, Scope, reconcile};
use tend::testing::sabotage::Sabotage;
use tend::testing::source::Snapshot;

/// Names the simulation declares; the last is someone else's database
/// (no marker), which a declaration may name but nothing else touches.
const NAMES: &[&str] = &[
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "zulu",
];
/// The names events at the provider pick from (all but the foreign one).
const OWNED: u64 = 6;
const DELETION_DELAY: Duration = Duration::from_secs(300);
const MAX_DELETIONS: usize = 1;
/// How long a pause set by the simulation lasts (`override-expires`).
const PAUSE_FOR: Duration = Duration::from_secs(2 * 3600);
const STEPS: usize = 25;

/// What Git declares for one name.
#[derive(Debug, Clone, PartialEq)]
struct Declared {
    limit: i64,
    delete: bool,
    ignore: bool,
    /// In `moved/NAME.yaml` instead of `NAME.yaml`.
    moved: bool,
}

impl Declared {
    fn file(&self, name: &str) -> String {
        if self.moved {
            format!("moved/{name}.yaml")
        } else {
            format!("{name}.yaml")
        }
    }

    fn yaml(&self, name: &str) -> String {
        let annotations = if self.ignore {
            "  annotations:\n    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: \"INC-1: simulated\"\n    tend.dev/override-expires: 720h\n"
        } else {
            ""
        };
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\n{annotations}spec:\n  connectionLimit: {}\n  deletionPolicy: {}\n",
            self.limit,
            if self.delete { "Delete" } else { "Retain" }
        )
    }
}

/// Faults the provider shows after a restart.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    LostResponse,
    FailingCalls,
    RateLimited,
    StaleReads,
}

impl Fault {
    fn toml(self) -> &'static str {
        match self {
            Fault::None => "",
            Fault::LostResponse => "lose_responses = 1\n",
            Fault::FailingCalls => "fail_calls = 2\n",
            Fault::RateLimited => "rate_limit_calls = 3\nretry_after = \"1ms\"\n",
            Fault::StaleReads => "stale_reads = \"120s\"\n",
        }
    }
}

/// One event of a schedule. Names are indices into `NAMES`; an event that
/// does not apply to the world as it is (editing an undeclared name) does
/// nothing, so any subsequence of a schedule is a schedule (what shrinking
/// needs).
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Declare {
        name: usize,
        limit: i64,
        delete: bool,
    },
    Edit {
        name: usize,
        limit: i64,
    },
    Remove {
        name: usize,
    },
    /// `metadata.name` (and the file) renamed.
    Rename {
        from: usize,
        to: usize,
    },
    /// The file moves to another directory; the declaration stays.
    Move {
        name: usize,
    },
    IgnoreFields {
        name: usize,
        on: bool,
    },
    /// `tend override set NAME --pause` / `tend override clear NAME`.
    LocalPause {
        name: usize,
        on: bool,
    },
    /// Pause labels set / removed at the provider.
    LabelPause {
        name: usize,
        on: bool,
    },
    OutOfBand {
        name: usize,
        limit: i64,
    },
    Drop {
        name: usize,
    },
    Advance {
        secs: u64,
    },
    /// The process dies between cycles and restarts with a fault.
    Crash {
        fault: Fault,
    },
    /// The process dies in this cycle when an operation reaches a commit
    /// point (after its intent, after its call, after its confirmation)
    /// the `nth` time, and restarts.
    CrashAt {
        point: &'static str,
        nth: u32,
    },
    RemoveAllButOne,
    /// The next `cycles` cycles decide from a commit whose tree is empty.
    EmptyTree {
        cycles: usize,
    },
    /// One cycle decides from a commit in which this file does not parse.
    Unparsable {
        name: usize,
    },
    /// The source refuses new heads (rewritten history, unreachable
    /// remote): tend decides from the last accepted commit until it
    /// accepts again.
    SourceRefuses {
        on: bool,
    },
    /// The configuration is reloaded with a drift policy and grace.
    Reload {
        report_only: bool,
        grace_secs: u64,
    },
}

fn generate(seed: u64, steps: usize) -> Vec<Event> {
    let mut dice = Dice(seed | 1);
    (0..steps)
        .map(|_| {
            let name = dice.below(OWNED) as usize;
            let on = dice.below(2) == 0;
            match dice.below(24) {
                0..=2 => Event::Declare {
                    // Now and then the foreign database's name.
                    name: dice.below(NAMES.len() as u64) as usize,
                    limit: 10 + dice.below(40) as i64,
                    delete: dice.below(2) == 0,
                },
                3 => Event::Edit {
                    name,
                    limit: 10 + dice.below(40) as i64,
                },
                4 => Event::Remove { name },
                5 => Event::Rename {
                    from: name,
                    to: dice.below(OWNED) as usize,
                },
                6 => Event::Move { name },
                7 => Event::IgnoreFields { name, on },
                8 => Event::LocalPause { name, on },
                9 => Event::LabelPause { name, on },
                10 | 11 => Event::OutOfBand {
                    name,
                    limit: 100 + dice.below(100) as i64,
                },
                12 => Event::Drop { name },
                13 | 14 => Event::Advance {
                    secs: 1 + dice.below(900),
                },
                15 => Event::Crash {
                    fault: [
                        Fault::None,
                        Fault::LostResponse,
                        Fault::FailingCalls,
                        Fault::RateLimited,
                        Fault::StaleReads,
                    ][dice.below(5) as usize],
                },
                16 | 23 => Event::RemoveAllButOne,
                // One to three cycles (from the name drawn already, so the
                // rest of the schedule is what the seed always made).
                17 => Event::EmptyTree {
                    cycles: 1 + name % 3,
                },
                18 => Event::Unparsable { name },
                19 => Event::SourceRefuses { on },
                21 | 22 => Event::CrashAt {
                    point: [AFTER_INTENT, AFTER_CALL, AFTER_CONFIRM][dice.below(3) as usize],
                    nth: 1 + dice.below(3) as u32,
                },
                20 => Event::Reload {
                    report_only: dice.below(3) == 0,
                    grace_secs: [0, 300, 600, 1800][dice.below(4) as usize],
                },
                _ => unreachable!("below(24)"),
            }
        })
        .collect()
}

/// A broken promise: which invariant, at which step, and what was seen.
#[derive(Debug, Clone)]
struct Violation {
    invariant: &'static str,
    step: usize,
    detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant `{}` broken at step {}: {}",
            self.invariant, self.step, self.detail
        )
    }
}

/// What the simulation itself did to a database at the provider, and when.
#[derive(Debug, Clone)]
struct OutOfBand {
    limit: i64,
    at: SystemTime,
}

struct World {
    sabotage: Sabotage,
    setting: Setting,
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    /// The tracked branch.
    git: BTreeMap<String, Declared>,
    /// What tend's snapshots hold: the branch, unless the source refuses.
    accepted: BTreeMap<String, Declared>,
    refusing: bool,
    /// When each name last left the accepted commit, and what it declared.
    removed_at: BTreeMap<String, (SystemTime, Declared)>,
    /// Names that left the accepted commit declaring `Retain`: tend
    /// released their databases, and declaring one again is a name clash
    /// (it is adopted only with `tend.dev/adopt`).
    released: BTreeSet<String>,
    /// When each name's accepted declaration last changed.
    changed_at: BTreeMap<String, SystemTime>,
    out_of_band: BTreeMap<String, OutOfBand>,
    /// Pauses the simulation set, by name: when.
    local_pauses: BTreeMap<String, SystemTime>,
    label_pauses: BTreeMap<String, SystemTime>,
    report_only: bool,
    grace: Duration,
    fault: Fault,
    /// Cycles still to decide from an empty tree.
    empty_cycles: usize,
    /// The configured `deletion_delay` (what the invariants hold tend to).
    deletion_delay: Duration,
    /// A database someone else owns (no marker): must never change.
    foreign: (String, tend::testing::model::FlatMap<Value>),
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

    /// The configuration the operator wrote, except where `setting` runs
    /// tend with a promise broken (the invariants still hold it to the
    /// configured values).
    fn config(&self) -> Config {
        let path = self.dir.path().join("tend.toml");
        let s = self.setting;
        let grace = if s.no_grace { 0 } else { self.grace.as_secs() };
        let deletion_delay = if s.no_deletion_delay {
            0
        } else {
            self.deletion_delay.as_secs()
        };
        let max_deletions = if s.no_guard { 100 } else { MAX_DELETIONS };
        std::fs::write(
            &path,
            format!(
                "agent_id = \"sim\"\nstate_dir = \"state\"\n[source]\nurl = \"/nonexistent\"\n[status]\nbranch = \"\"\nkeep_reports = 1\n[reconcile]\ndrift_policy = \"{}\"\ndrift_grace = \"{grace}s\"\ndeletion_delay = \"{deletion_delay}s\"\nmax_deletions = {max_deletions}\nmax_deletion_percent = 100\nretry_min_delay = \"1ms\"\nmax_retries = 2\nconfirm_timeout = \"50ms\"\n[providers.sandbox]\nkind = \"sandbox\"\nrate_limit = 10000\n[providers.sandbox.faults]\nnames_not_unique = true\n{}",
                if self.report_only { "report" } else { "correct" },
                self.fault.toml(),
            ),
        )
        .unwrap();
        Config::load(&path).unwrap()
    }

    fn open(&self) -> Result<Agent, String> {
        let mut agent = Agent::open(self.config(), Access::Writer, self.clock.clone())
            .map_err(|e| e.to_string())?;
        agent.sabotage(self.sabotage);
        Ok(agent)
    }

    /// Every database at the provider, as the provider stores it.
    fn provider_state(&self) -> SandboxState {
        self.sandbox().load().unwrap()
    }

    fn paused(&self, name: &str, now: SystemTime) -> bool {
        let active = |at: &SystemTime| now.duration_since(*at).unwrap_or_default() < PAUSE_FOR;
        self.local_pauses.get(name).is_some_and(active)
            || self.label_pauses.get(name).is_some_and(active)
    }

    fn snapshot(&self, step: usize, tree: &Tree) -> Arc<Snapshot> {
        let files = self
            .accepted
            .iter()
            .filter(|_| *tree != Tree::Empty)
            .map(|(name, d)| {
                let text = match tree {
                    Tree::Unparsable(broken) if broken == name => {
                        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata: [\n"
                            .to_string()
                    }
                    _ => d.yaml(name),
                };
                parse_file(Path::new(&d.file(name)), text.as_bytes())
            })
            .collect();
        Arc::new(Snapshot {
            commit: format!("{step:040x}"),
            commit_time: SystemTime::UNIX_EPOCH,
            files: Vec::new(),
            declarations: DeclarationSet::from_files(files),
            provider_groups: Default::default(),
        })
    }

    /// The branch reaches tend (unless the source refuses it): what left
    /// or changed is noted with the time.
    fn accept(&mut self, now: SystemTime) {
        if self.refusing {
            return;
        }
        for (name, d) in &self.accepted {
            if !self.git.contains_key(name) {
                self.removed_at.insert(name.clone(), (now, d.clone()));
                if !d.delete {
                    self.released.insert(name.clone());
                }
            }
        }
        for (name, d) in &self.git {
            match self.accepted.get(name) {
                Some(old) if old.limit == d.limit && old.ignore == d.ignore => {}
                _ => {
                    self.changed_at.insert(name.clone(), now);
                    self.removed_at.remove(name);
                }
            }
        }
        self.accepted = self.git.clone();
    }

    /// Whether a declaration of `name` clashes with a database it may not
    /// take over: someone else's, or one tend released.
    fn clashes(&self, name: &str) -> bool {
        name == self.foreign.0 || self.released.contains(name)
    }

    fn store(&self) -> StateStore {
        StateStore::open_for_overrides(&self.dir.path().join("state")).unwrap()
    }
}

/// Each database's connection limit (-1: none).
fn limits(state: &SandboxState) -> BTreeMap<String, i64> {
    state
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

/// What one cycle decides from.
#[derive(Debug, Clone, PartialEq)]
enum Tree {
    Accepted,
    Empty,
    Unparsable(String),
}

/// Runs a schedule; `Err` names the broken invariant.
async fn run_schedule(
    events: &[Event],
    sabotage: Sabotage,
    setting: Setting,
) -> Result<(), Violation> {
    let base = if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let mut w = World {
        sabotage,
        setting,
        dir: base,
        clock: Arc::new(ManualClock::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        )),
        git: BTreeMap::new(),
        accepted: BTreeMap::new(),
        refusing: false,
        removed_at: BTreeMap::new(),
        released: BTreeSet::new(),
        changed_at: BTreeMap::new(),
        out_of_band: BTreeMap::new(),
        local_pauses: BTreeMap::new(),
        label_pauses: BTreeMap::new(),
        report_only: false,
        grace: Duration::from_secs(600),
        fault: Fault::None,
        empty_cycles: 0,
        deletion_delay: if setting.zero_delay {
            Duration::ZERO
        } else {
            DELETION_DELAY
        },
        foreign: ("zulu".into(), Default::default()),
    };
    let broken = |step: usize, invariant: &'static str, detail: String| Violation {
        invariant,
        step,
        detail,
    };
    // Someone else's database, planted before tend starts.
    {
        let sandbox = w.sandbox();
        let mut state = sandbox.load().unwrap();
        let mut db = serde_json::from_value::<tend::testing::provider::sandbox::SandboxDatabase>(json!({
            "id": "foreign-1", "fields": {"databaseName": "zulu", "connectionLimit": 7}, "labels": {}, "created_at": 0, "ready_at": 0
        }))
        .unwrap();
        db.labels.clear();
        w.foreign.1 = db.fields.clone();
        state.databases.insert(w.foreign.0.clone(), db);
        sandbox.save(&state).unwrap();
    }
    let open = |w: &World| w.open().map_err(|e| broken(0, "the agent opens", e));
    let mut agent = open(&w)?;
    for (step, event) in events.iter().enumerate() {
        let now = w.clock.now();
        let mut tree = Tree::Accepted;
        let mut dropped = None;
        let name_of = |i: &usize| NAMES[*i].to_string();
        match event {
            Event::Declare {
                name,
                limit,
                delete,
            } => {
                // A declaration written again keeps its file and
                // annotations.
                let (moved, ignore) = w
                    .git
                    .get(&name_of(name))
                    .map_or((false, false), |d| (d.moved, d.ignore));
                w.git.insert(
                    name_of(name),
                    Declared {
                        limit: *limit,
                        delete: *delete,
                        ignore,
                        moved,
                    },
                );
            }
            Event::Edit { name, limit } => {
                if let Some(d) = w.git.get_mut(&name_of(name)) {
                    d.limit = *limit;
                }
            }
            Event::Remove { name } => {
                w.git.remove(&name_of(name));
            }
            Event::Rename { from, to } => {
                if !w.git.contains_key(&name_of(to))
                    && let Some(d) = w.git.remove(&name_of(from))
                {
                    w.git.insert(name_of(to), d);
                }
            }
            Event::Move { name } => {
                if let Some(d) = w.git.get_mut(&name_of(name)) {
                    d.moved = !d.moved;
                }
            }
            Event::IgnoreFields { name, on } => {
                if let Some(d) = w.git.get_mut(&name_of(name)) {
                    d.ignore = *on;
                }
            }
            Event::LocalPause { name, on } => {
                let store = w.store();
                if *on {
                    let annotations = BTreeMap::from([
                        ("tend.dev/paused".to_string(), "true".to_string()),
                        (
                            "tend.dev/override-reason".to_string(),
                            "INC-2: simulated".to_string(),
                        ),
                        ("tend.dev/override-expires".to_string(), "2h".to_string()),
                    ]);
                    store
                        .set_local_override(&name_of(name), &annotations, now)
                        .unwrap();
                    w.local_pauses.insert(name_of(name), now);
                } else {
                    store.clear_local_override(&name_of(name)).unwrap();
                    w.local_pauses.remove(&name_of(name));
                }
            }
            Event::LabelPause { name, on } => {
                let sandbox = w.sandbox();
                let mut state = sandbox.load().unwrap();
                if let Some(db) = state.databases.get_mut(&name_of(name)) {
                    let keys = [
                        ("tend.dev/paused", "true"),
                        ("tend.dev/override-reason", "INC-3: simulated"),
                        ("tend.dev/override-expires", "2h"),
                    ];
                    for (k, v) in keys {
                        if *on {
                            db.labels.insert(k, v.into());
                        } else {
                            db.labels.remove(k);
                        }
                    }
                    sandbox.save(&state).unwrap();
                    if *on {
                        w.label_pauses.entry(name_of(name)).or_insert(now);
                    } else {
                        w.label_pauses.remove(&name_of(name));
                    }
                }
            }
            Event::OutOfBand { name, limit } => {
                let sandbox = w.sandbox();
                let mut state = sandbox.load().unwrap();
                if let Some(db) = state.databases.get_mut(&name_of(name)) {
                    // Still showing the last out-of-band value: the same
                    // spell of drift, whose grace runs from its start.
                    let current = db.fields.get("connectionLimit").and_then(Value::as_i64);
                    let at = match w.out_of_band.get(&name_of(name)) {
                        Some(o) if Some(o.limit) == current => o.at,
                        _ => now,
                    };
                    db.fields.insert("connectionLimit", json!(limit));
                    sandbox.save(&state).unwrap();
                    w.out_of_band
                        .insert(name_of(name), OutOfBand { limit: *limit, at });
                }
            }
            Event::Drop { name } => {
                let sandbox = w.sandbox();
                let mut state = sandbox.load().unwrap();
                if state.databases.remove(&name_of(name)).is_some() {
                    sandbox.save(&state).unwrap();
                    w.out_of_band.remove(&name_of(name));
                    w.label_pauses.remove(&name_of(name));
                    dropped = Some(name_of(name));
                }
            }
            Event::Advance { secs } => w.clock.advance(Duration::from_secs(*secs)),
            Event::Crash { fault } => {
                // The process dies: its memory goes, the state store and
                // the provider stay.
                drop(agent);
                w.fault = *fault;
                agent = open(&w)?;
            }
            Event::RemoveAllButOne => {
                let keep = w.git.keys().next().cloned();
                w.git.retain(|n, _| Some(n) == keep.as_ref());
            }
            Event::CrashAt { point, nth } => agent.crash_switch().arm(point, *nth),
            Event::EmptyTree { cycles } => w.empty_cycles = *cycles,
            Event::Unparsable { name } => {
                if w.accepted.contains_key(&name_of(name)) {
                    tree = Tree::Unparsable(name_of(name));
                }
            }
            Event::SourceRefuses { on } => w.refusing = *on,
            Event::Reload {
                report_only,
                grace_secs,
            } => {
                drop(agent);
                w.report_only = *report_only;
                w.grace = Duration::from_secs(*grace_secs);
                agent = open(&w)?;
            }
        }
        if w.empty_cycles > 0 {
            w.empty_cycles -= 1;
            tree = Tree::Empty;
        }
        let now = w.clock.now();
        w.accept(now);
        let before = limits(&w.provider_state());
        let snap = w.snapshot(step, &tree);
        let outcome = reconcile(&agent, &snap, Mode::Apply, &Scope::All).await;
        if agent.crash_switch().take_fired() {
            // The process died at the commit point: what it held goes.
            drop(agent);
            agent = open(&w)?;
        }
        // Read once: every check below looks at this state.
        let state = w.provider_state();
        let after = limits(&state);
        if std::env::var_os("TEND_SIM_TRACE").is_some() {
            eprintln!("step {step}: {event:?}");
            match &outcome {
                Ok(outcome) => {
                    for r in &outcome.latest().resources {
                        eprintln!(
                            "  {} {} {}: {}",
                            r.name, r.decision.state, r.decision.action, r.decision.reason
                        );
                    }
                    for e in &outcome.operations {
                        eprintln!(
                            "  ran {} {}: {}",
                            e.kind.as_str(),
                            e.name,
                            e.outcome.describe()
                        );
                    }
                }
                Err(e) => eprintln!("  error: {e}"),
            }
        }
        let now = w.clock.now();

        // Someone else's database is never touched.
        match state.databases.get(&w.foreign.0) {
            Some(db) if db.fields == w.foreign.1 => {}
            other => {
                return Err(broken(
                    step,
                    "foreign database untouched",
                    format!("it changed: {other:?}"),
                ));
            }
        }
        // The mass-deletion guard: more due deletions than the limit hold
        // them all, so one cycle never deletes more than the limit.
        let deleted: Vec<&String> = before
            .keys()
            .filter(|db| !after.contains_key(*db) && Some(*db) != dropped.as_ref())
            .collect();
        if deleted.len() > MAX_DELETIONS {
            return Err(broken(
                step,
                "mass-deletion guard",
                format!(
                    "{} databases deleted in one cycle (the guard allows {MAX_DELETIONS}): {deleted:?}",
                    deleted.len()
                ),
            ));
        }
        if tree == Tree::Empty && !deleted.is_empty() {
            return Err(broken(
                step,
                "no deletion from an empty tree",
                format!("{deleted:?} deleted"),
            ));
        }
        for (db, limit) in &before {
            match after.get(db) {
                // Gone: only a declaration removed from Git with Delete,
                // after deletion_delay, and not paused.
                None if Some(db) != dropped.as_ref() => {
                    let removed = w.removed_at.get(db);
                    let due = matches!(removed, Some((at, d))
                        if d.delete
                            && now.duration_since(*at).unwrap_or_default() >= w.deletion_delay);
                    if !due || w.accepted.contains_key(db) {
                        return Err(broken(
                            step,
                            "deletion only when removed with Delete, after deletion_delay",
                            format!("{db} was deleted (removed: {removed:?}, now {now:?})"),
                        ));
                    }
                    if w.paused(db, now) {
                        return Err(broken(
                            step,
                            "nothing paused changes",
                            format!("{db} was deleted while paused"),
                        ));
                    }
                }
                Some(new) if new != limit => {
                    // tend changed it. Never an ignored or paused field,
                    // never an out-of-band value before grace or under the
                    // report policy (unless Git changed since).
                    if w.accepted.get(db).is_some_and(|d| d.ignore) {
                        return Err(broken(
                            step,
                            "ignored fields never change",
                            format!("{db}: ignored connectionLimit changed {limit} -> {new}"),
                        ));
                    }
                    if w.paused(db, now) {
                        return Err(broken(
                            step,
                            "nothing paused changes",
                            format!("{db}: paused connectionLimit changed {limit} -> {new}"),
                        ));
                    }
                    if let Some(oob) = w.out_of_band.get(db)
                        && oob.limit == *limit
                        && w.changed_at.get(db).is_none_or(|c| *c < oob.at)
                    {
                        if now.duration_since(oob.at).unwrap_or_default() < w.grace {
                            return Err(broken(
                                step,
                                "no out-of-band correction before drift_grace",
                                format!("{db}: out-of-band {limit} corrected to {new}"),
                            ));
                        }
                        if w.report_only {
                            return Err(broken(
                                step,
                                "no out-of-band correction under drift_policy report",
                                format!("{db}: out-of-band {limit} corrected to {new}"),
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(db) = after
            .keys()
            .find(|db| !before.contains_key(*db) && w.paused(db, now))
        {
            return Err(broken(
                step,
                "nothing paused changes",
                format!("{db} was created while paused"),
            ));
        }
        // Never two databases for one declaration.
        let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (db_name, db) in &state.databases {
            if let Some(decl) = db.labels.get("tend.dev/owner-declaration") {
                owners
                    .entry(decl.clone())
                    .or_default()
                    .push(db_name.clone());
            }
        }
        if let Some((decl, dbs)) = owners.iter().find(|(_, dbs)| dbs.len() > 1) {
            return Err(broken(
                step,
                "one database per declaration",
                format!("{decl} has {dbs:?}"),
            ));
        }
        // Never InSync when the latest observation differs from Git.
        if let Ok(outcome) = &outcome {
            for r in &outcome.latest().resources {
                let Some(d) = w.accepted.get(&r.name) else {
                    continue;
                };
                let seen = match &r.observed {
                    Observed::Found(obs) => {
                        obs.fields.get("connectionLimit").and_then(Value::as_i64)
                    }
                    _ => None,
                };
                if r.decision.state == State::InSync && seen != Some(d.limit) && !d.ignore {
                    return Err(broken(
                        step,
                        "InSync only when observed as declared",
                        format!(
                            "{} reported InSync, observed {seen:?}, declared {}",
                            r.name, d.limit
                        ),
                    ));
                }
            }
        }
    }
    // The faults stop: everything converges within a bounded number of
    // cycles, and every journalled intent is resolved.
    drop(agent);
    w.fault = Fault::None;
    w.refusing = false;
    let agent = open(&w)?;
    w.clock.advance(w.grace + w.deletion_delay + PAUSE_FOR);
    let now = w.clock.now();
    w.accept(now);
    let steps = events.len();
    let snap = w.snapshot(steps, &Tree::Accepted);
    let mut last = Vec::new();
    for _ in 0..6 {
        let outcome = reconcile(&agent, &snap, Mode::Apply, &Scope::All)
            .await
            .map_err(|e| broken(steps, "convergence", e.to_string()))?;
        // Nothing the sandbox does is unconvergeable, and the only block a
        // schedule can make is a declaration naming someone else's
        // database.
        let pending = || -> BTreeSet<String> {
            w.store()
                .all_intents()
                .unwrap()
                .into_iter()
                .filter(|i| i.state == IntentState::Pending)
                .map(|i| format!("{} {} {}", i.kind, i.name, i.op_id))
                .collect()
        };
        for r in &outcome.latest().resources {
            if r.decision.state == State::Unconvergeable {
                // An intent that never resolves is what makes a resource
                // unconvergeable here: named as such.
                let pending = pending();
                if !pending.is_empty() {
                    return Err(broken(
                        steps,
                        "every journalled intent is resolved",
                        format!("{} unconvergeable behind {pending:?}", r.name),
                    ));
                }
                return Err(broken(
                    steps,
                    "never Unconvergeable",
                    format!("{}: {}", r.name, r.decision.reason),
                ));
            }
            if r.decision.state == State::Blocked && !w.clashes(&r.name) {
                return Err(broken(
                    steps,
                    "Blocked only on a name clash",
                    format!("{}: {}", r.name, r.decision.reason),
                ));
            }
        }
        // Converged, or held with a reason the report gives: an override,
        // the name clash, a deletion the guard or an override holds,
        // drift the report policy only reports.
        let settled = outcome.latest().resources.iter().all(|r| {
            matches!(r.decision.state, State::InSync | State::Overridden)
                || r.decision.state == State::Blocked
                || (r.decision.state == State::Deleting
                    && matches!(r.decision.action, Action::Hold | Action::None))
                || (matches!(r.decision.state, State::Drifted | State::Missing)
                    && w.report_only
                    && r.decision.reason.contains("driftPolicy Report"))
        });
        last = outcome
            .latest()
            .resources
            .iter()
            .map(|r| format!("{} {:?}: {}", r.name, r.decision.state, r.decision.reason))
            .collect::<Vec<_>>();
        if settled {
            let pending = pending();
            if !pending.is_empty() {
                return Err(broken(
                    steps,
                    "every journalled intent is resolved",
                    format!("pending after convergence: {pending:?}"),
                ));
            }
            return provider_holds_what_git_declares(&w, steps, &last);
        }
        // What the last cycle first saw (drift found only now, a pause
        // that ended) has its grace and delay to run.
        w.clock.advance(w.grace + w.deletion_delay);
    }
    Err(broken(
        steps,
        "convergence",
        format!("did not converge after the faults stopped: {last:#?}"),
    ))
}

/// Once the faults stopped and tend settled, the provider itself (not
/// tend's report of it) holds what Git declares: exactly one database
/// marked as each accepted declaration's (none for the name someone else's
/// database has; at most one for a name whose database tend released),
/// with the declared `connectionLimit` unless the field is ignored or a
/// pause holds it. Under `drift_policy = report` a dropped database is only
/// reported and out-of-band values stay, so there at most one, any value.
/// Grace has run out by then.
fn provider_holds_what_git_declares(
    w: &World,
    step: usize,
    report: &[String],
) -> Result<(), Violation> {
    let state = w.provider_state();
    let broken = |detail: String| Violation {
        invariant: "the provider holds what Git declares",
        step,
        detail,
    };
    for (name, d) in &w.accepted {
        let marked: Vec<(&String, i64)> = state
            .databases
            .iter()
            .filter(|(_, db)| {
                db.labels
                    .get("tend.dev/owner-declaration")
                    .map(String::as_str)
                    == Some(name)
            })
            .map(|(db_name, db)| {
                let limit = db
                    .fields
                    .get("connectionLimit")
                    .and_then(Value::as_i64)
                    .unwrap_or(-1);
                (db_name, limit)
            })
            .collect();
        if *name == w.foreign.0 {
            if !marked.is_empty() {
                return Err(broken(format!(
                    "{name} names someone else's database, yet {marked:?} carry its marker"
                )));
            }
            continue;
        }
        // A database tend released and Git declares again (Blocked until
        // adopted), or one a pause holds (an expired pause still holds:
        // `override-on-expiry: hold`, the default): at most the one
        // database, whatever it holds.
        let paused = w.local_pauses.contains_key(name) || w.label_pauses.contains_key(name);
        if (w.released.contains(name) || paused) && marked.len() <= 1 {
            continue;
        }
        match (&marked[..], w.report_only) {
            ([], true) => {}
            ([(_, limit)], _) if d.ignore || w.report_only || *limit == d.limit => {}
            _ => {
                return Err(broken(format!(
                    "{name} declares connectionLimit {}{}, the provider has {marked:?}; tend reported {:?}",
                    d.limit,
                    if d.ignore { " (ignored)" } else { "" },
                    report.iter().find(|l| l.starts_with(&format!("{name} ")))
                )));
            }
        }
    }
    Ok(())
}

/// Settings that break a promise, for the refutation tests: tend runs
/// with them while the invariants hold it to the configured values.
#[derive(Debug, Clone, Copy)]
struct Setting {
    /// drift_grace 0 (out-of-band drift corrected at once).
    no_grace: bool,
    /// deletion_delay 0 (deletes as soon as a declaration goes).
    no_deletion_delay: bool,
    /// A mass-deletion guard that allows everything.
    no_guard: bool,
    /// Not a broken promise: the operator configures `deletion_delay` 0
    /// (a deletion is due the cycle its declaration goes), and the
    /// invariants expect it. Only the rules that hold a deletion for other
    /// reasons (an empty tree, a file that does not parse, the guard)
    /// then stand between a commit and a deletion.
    zero_delay: bool,
}

impl Setting {
    const KEPT: Setting = Setting {
        no_grace: false,
        no_deletion_delay: false,
        no_guard: false,
        zero_delay: false,
    };

    /// The configuration a seed runs with: one seed in four with
    /// `deletion_delay` 0.
    fn for_seed(seed: u64) -> Setting {
        Setting {
            zero_delay: seed.is_multiple_of(4),
            ..Setting::KEPT
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    // A simulated crash is a panic its operation's task contains: keep it
    // out of the output (any other panic is printed as usual).
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<SimulatedCrash>().is_none() {
                default(info);
            }
        }));
    });
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Removes events while the same invariant still breaks: chunks of half
/// the schedule, then quarters, down to single events (a simple
/// delta-debugging pass, repeated until nothing more goes).
fn shrink(
    runtime: &tokio::runtime::Runtime,
    events: &[Event],
    sabotage: Sabotage,
    setting: Setting,
    invariant: &str,
) -> Vec<Event> {
    let fails = |candidate: &[Event]| {
        runtime
            .block_on(run_schedule(candidate, sabotage, setting))
            .err()
            .is_some_and(|v| v.invariant == invariant)
    };
    let mut current = events.to_vec();
    let mut budget = 300;
    loop {
        let mut removed_any = false;
        let mut chunk = current.len().div_ceil(2).max(1);
        while chunk >= 1 && budget > 0 {
            let mut start = 0;
            while start < current.len() && budget > 0 {
                let end = (start + chunk).min(current.len());
                let candidate: Vec<Event> = current[..start]
                    .iter()
                    .chain(&current[end..])
                    .cloned()
                    .collect();
                budget -= 1;
                if fails(&candidate) {
                    current = candidate;
                    removed_any = true;
                } else {
                    start = end;
                }
            }
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
        if !removed_any || budget == 0 {
            return current;
        }
    }
}

fn describe(events: &[Event]) -> String {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| format!("  step {i}: {e:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn seeded_schedules_keep_every_promise() {
    let runtime = runtime();
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
        let events = generate(*seed, STEPS);
        let setting = Setting::for_seed(*seed);
        if let Err(v) = runtime.block_on(run_schedule(&events, Sabotage::None, setting)) {
            let failing = &events[..=v.step.min(events.len() - 1)];
            let short = shrink(&runtime, failing, Sabotage::None, setting, v.invariant);
            let again = runtime
                .block_on(run_schedule(&short, Sabotage::None, setting))
                .err();
            panic!(
                "seed {seed}: {v}\nschedule:\n{}\nshrunk to {} events ({}):\n{}\nreplay: TEND_SIM_SEED={seed} cargo nextest run --test library simulation::seeded_schedules_keep_every_promise",
                describe(failing),
                short.len(),
                again.map_or("no longer failing".into(), |v| v.to_string()),
                describe(&short),
            );
        }
    }
    println!(
        "simulation: {} seeds, {STEPS} steps each, every invariant held",
        seeds.len()
    );
}

/// Each invariant catches the bug it exists for: tend with the promise
/// broken is refuted within the CI seed budget, by that invariant, and the
/// failing schedule shrinks to a short one that still breaks it.
#[test]
fn the_simulation_refutes_a_tend_that_breaks_a_promise() {
    let runtime = runtime();
    let kept = Setting::KEPT;
    let zero_delay = Setting {
        zero_delay: true,
        ..kept
    };
    let cases: [(&str, Sabotage, Setting, &str); 12] = [
        (
            "ownership not checked",
            Sabotage::OwnershipNotChecked,
            kept,
            "foreign database untouched",
        ),
        (
            "no grace",
            Sabotage::None,
            Setting {
                no_grace: true,
                ..kept
            },
            "no out-of-band correction before drift_grace",
        ),
        (
            "no deletion delay",
            Sabotage::None,
            Setting {
                no_deletion_delay: true,
                ..kept
            },
            "deletion only when removed with Delete, after deletion_delay",
        ),
        (
            "no guard",
            Sabotage::None,
            Setting {
                no_guard: true,
                ..kept
            },
            "mass-deletion guard",
        ),
        (
            "ignore-fields not honoured",
            Sabotage::IgnoreFieldsNotHonoured,
            kept,
            "ignored fields never change",
        ),
        (
            "pauses not honoured",
            Sabotage::PauseNotHonoured,
            kept,
            "nothing paused changes",
        ),
        (
            "held drift reported InSync",
            Sabotage::HeldDriftReportedInSync,
            kept,
            "InSync only when observed as declared",
        ),
        (
            "a fresh operation id on retry",
            Sabotage::FreshIdOnRetry,
            kept,
            "one database per declaration",
        ),
        (
            "intents left pending",
            Sabotage::IntentLeftPending,
            kept,
            "every journalled intent is resolved",
        ),
        (
            "the report policy ignored",
            Sabotage::ReportPolicyIgnored,
            kept,
            "no out-of-band correction under drift_policy report",
        ),
        (
            "an empty tree not guarded",
            Sabotage::EmptyTreeNotGuarded,
            zero_delay,
            "no deletion from an empty tree",
        ),
        (
            "a file that does not parse taken for a removal",
            Sabotage::UnparsableFileTombstoned,
            zero_delay,
            "deletion only when removed with Delete, after deletion_delay",
        ),
    ];
    for (what, sabotage, setting, expected) in cases {
        let found = (1..=1000u64).find_map(|seed| {
            let events = generate(seed, STEPS);
            runtime
                .block_on(run_schedule(&events, sabotage, setting))
                .err()
                .map(|v| (seed, events, v))
        });
        let (seed, events, violation) =
            found.unwrap_or_else(|| panic!("{what} was never caught in 1,000 seeds"));
        assert_eq!(
            violation.invariant, expected,
            "{what} (seed {seed}) broke another invariant first: {violation}"
        );
        let failing = &events[..=violation.step.min(events.len() - 1)];
        let short = shrink(&runtime, failing, sabotage, setting, expected);
        let again = runtime.block_on(run_schedule(&short, sabotage, setting));
        assert!(
            again.as_ref().is_err_and(|v| v.invariant == expected),
            "{what}: the shrunk schedule no longer breaks `{expected}`: {again:?}\n{}",
            describe(&short)
        );
        assert!(short.len() <= failing.len());
        println!(
            "simulation: {what} caught by seed {seed} at step {}; shrunk from {} to {} events:\n{}",
            violation.step,
            failing.len(),
            short.len(),
            describe(&short)
        );
    }
}
