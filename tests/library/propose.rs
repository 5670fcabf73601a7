//! `tend propose` against real repositories and the sandbox: the edit
//! changes exactly the drifted values, the result plans InSync, and the
//! branch output never writes the tracked branch or a human's commits.

use crate::support;

use support::TendCommand;
use support::config::TendConfig;
use support::fixture::Fixture;
use support::git::{TestRepo, git};

/// Comments, flow and block style, quoted and plain values, two documents.
const ORDERS: &str = "# The orders database: the checkout team's.
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: orders   # never rename: the database keeps its name
  annotations:
    team.example/owner: checkout
    tend.dev/ignore-fields: \"connectionLimit,parameters.work_mem\"
    tend.dev/override-reason: 'INC-4821: invoice run'
    tend.dev/override-expires: \"2099-01-01T00:00:00Z\"
spec:
  owner: \"orders_app\"
  connectionLimit: 50      # raised by hand during INC-4821
  parameters: {work_mem: '64MB', statement_timeout: 30s}
  comment: Orders and carts
---
# A second document in the same file, untouched.
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata: {name: carts}
spec:
    connectionLimit: 5
    parameters:
        work_mem: 4MB
";

/// A [`Fixture`] whose agent (`prop-agent`) has applied its declarations.
struct Env(Fixture);

impl std::ops::Deref for Env {
    type Target = Fixture;
    fn deref(&self) -> &Fixture {
        &self.0
    }
}

impl Env {
    fn new(files: &[(&str, &str)], change: impl FnOnce(TendConfig) -> TendConfig) -> Self {
        let env = Env(Fixture::with_config(files, |c| {
            change(c.top("agent_id", Some("\"prop-agent\"")))
        }));
        env.tend(&["apply"], 0);
        env
    }

    /// `tend` with its default logging (the fixture's logs warnings only).
    fn tend(&self, args: &[&str], code: i32) -> support::RunOutput {
        support::tend(self.config_path(), args, code)
    }

    fn edit(&self, name: &str, sets: &[&str]) {
        let mut args = vec!["sandbox", "edit", name];
        for s in sets {
            args.extend(["--set", s]);
        }
        self.tend(&args, 0);
    }

    /// Applies a patch from `tend propose` to the work tree and commits it.
    fn apply_patch(&self, patch: &str) {
        let file = self.dir.path().join("proposal.patch");
        std::fs::write(&file, patch).unwrap();
        self.repo.git(&["apply", &file.display().to_string()]);
        self.repo.commit("keep the change made at the provider");
    }

    fn state_of(&self, name: &str) -> String {
        let plan = self.tend(&["plan", "--format", "json"], 0).json();
        plan["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["state"].as_str().unwrap().to_string())
            .unwrap()
    }
}

#[test]
fn propose_changes_exactly_the_drifted_values_and_the_result_plans_in_sync() {
    let env = Env::new(&[("orders.yaml", ORDERS)], |c| c);
    env.edit(
        "orders",
        &["connectionLimit=500", "parameters.work_mem=\"128MB\""],
    );
    assert_eq!(env.state_of("orders"), "Overridden");
    // Every report says how to keep the change.
    let text = env.tend(&["plan"], 0).stdout;
    assert!(
        text.contains("to keep this change, run `tend propose orders`"),
        "{text}"
    );
    let json = env.tend(&["plan", "--format", "json"], 0).json();
    let orders = json["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "orders")
        .unwrap()
        .clone();
    assert_eq!(orders["propose"], "tend propose orders");
    env.tend(&["apply"], 2);
    let reports = env.dir.path().join("state/reports");
    for file in ["latest.md", "latest.html"] {
        let page = std::fs::read_to_string(reports.join(file)).unwrap();
        assert!(page.contains("tend propose orders"), "{file}: {page}");
    }
    let run = env.tend(&["propose", "orders"], 0);
    assert!(
        run.stderr
            .contains("connectionLimit: declared 50, the provider shows 500"),
        "{}",
        run.stderr
    );
    let expected = ORDERS
        .replace(
            "    tend.dev/ignore-fields: \"connectionLimit,parameters.work_mem\"\n    tend.dev/override-reason: 'INC-4821: invoice run'\n    tend.dev/override-expires: \"2099-01-01T00:00:00Z\"\n",
            "",
        )
        .replace("connectionLimit: 50      #", "connectionLimit: 500      #")
        .replace("{work_mem: '64MB',", "{work_mem: '128MB',");
    env.apply_patch(&run.stdout);
    let written = std::fs::read_to_string(env.repo.path().join("orders.yaml")).unwrap();
    assert_eq!(written, expected, "every other byte stays");
    TendCommand::new(&[
        "validate",
        &env.repo.path().join("orders.yaml").display().to_string(),
    ])
    .expect_code(0);
    assert_eq!(env.state_of("orders"), "InSync");
    assert_eq!(env.state_of("carts"), "InSync");
}

#[test]
fn a_parameter_that_was_absent_is_added_with_the_files_indentation() {
    let env = Env::new(&[("orders.yaml", ORDERS)], |c| c);
    env.edit(
        "carts",
        &["parameters.statement_timeout=\"45s\"", "connectionLimit=9"],
    );
    let run = env.tend(
        &[
            "propose",
            "carts",
            "--fields",
            "parameters.statement_timeout",
        ],
        0,
    );
    env.apply_patch(&run.stdout);
    let written = std::fs::read_to_string(env.repo.path().join("orders.yaml")).unwrap();
    assert_eq!(
        written,
        ORDERS.replace(
            "        work_mem: 4MB\n",
            "        work_mem: 4MB\n        statement_timeout: 45s\n"
        )
    );
    // connectionLimit was not proposed: still drifted (held for grace).
    assert_eq!(env.state_of("carts"), "Drifted");
}

#[test]
fn removing_an_override_for_one_field_keeps_the_rest() {
    let two = ORDERS.replace(
        "\"connectionLimit,parameters.work_mem\"",
        "\"connectionLimit,comment\"",
    );
    let env = Env::new(&[("orders.yaml", &two)], |c| c);
    env.edit(
        "orders",
        &["connectionLimit=77", "comment=\"changed by hand\""],
    );
    let run = env.tend(&["propose", "orders", "--fields", "connectionLimit"], 0);
    env.apply_patch(&run.stdout);
    let written = std::fs::read_to_string(env.repo.path().join("orders.yaml")).unwrap();
    assert_eq!(
        written,
        two.replace("\"connectionLimit,comment\"", "\"comment\"")
            .replace("connectionLimit: 50      #", "connectionLimit: 77      #")
    );
    assert!(written.contains("team.example/owner: checkout"));
    assert!(written.contains("tend.dev/override-reason: 'INC-4821: invoice run'"));
}

#[test]
fn nothing_to_propose_is_an_error_with_the_reason() {
    let env = Env::new(&[("orders.yaml", ORDERS)], |c| c);
    let run = env.tend(&["propose", "orders"], 1);
    assert!(
        run.stderr
            .contains("nothing to propose for `orders`: it has no out-of-band drift"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.is_empty());
    env.edit("orders", &["connectionLimit=60"]);
    let run = env.tend(&["propose", "orders", "--fields", "owner"], 1);
    assert!(
        run.stderr
            .contains("`orders` has no out-of-band drift on owner; it has on: connectionLimit"),
        "{}",
        run.stderr
    );
}

#[test]
fn the_branch_output_pushes_a_proposal_branch_and_never_over_a_humans_commit() {
    let served = tempfile::tempdir().unwrap();
    let seed = TestRepo::new();
    seed.write("orders.yaml", ORDERS);
    seed.commit("declarations");
    let bare = seed.bare_clone(served.path());
    let url = format!("file://{}", bare.display());
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &url)
        .top("agent_id", Some("\"prop-agent\""))
        .write()
        .display()
        .to_string();
    let tend = |args: &[&str], code: i32| {
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        TendCommand::new(&all).expect_code(code)
    };
    tend(&["apply"], 0);
    tend(
        &["sandbox", "edit", "orders", "--set", "connectionLimit=500"],
        0,
    );
    // A cycle sees it (and remembers since when): Overridden, pending.
    tend(&["apply"], 2);
    let main = git(&bare, &["rev-parse", "main"]);
    let run = tend(&["propose", "orders", "--output", "branch"], 0);
    assert!(
        run.stdout.starts_with("tend/propose/orders: created at "),
        "{}",
        run.stdout
    );
    let log = git(&bare, &["log", "--format=%an|%P|%s", "tend/propose/orders"]);
    let first = log.lines().next().unwrap();
    assert!(
        first.starts_with(&format!(
            "tend (prop-agent)|{main}|propose: declare what the provider shows for orders"
        )),
        "{log}"
    );
    let body = git(&bare, &["log", "-1", "--format=%b", "tend/propose/orders"]);
    assert!(
        body.contains("connectionLimit: 50 -> 500 (first seen "),
        "{body}"
    );
    assert!(
        body.contains("Override reason: INC-4821: invoice run"),
        "{body}"
    );
    let file = git(&bare, &["show", "tend/propose/orders:orders.yaml"]);
    assert!(
        file.contains("connectionLimit: 500      # raised by hand"),
        "{file}"
    );

    // The same again: unchanged, no commit.
    let run = tend(&["propose", "orders", "--output", "branch"], 0);
    assert!(run.stdout.contains(": unchanged at "), "{}", run.stdout);
    // The provider changes again: a fast-forward on tend's own commit.
    tend(
        &["sandbox", "edit", "orders", "--set", "connectionLimit=600"],
        0,
    );
    let before = git(&bare, &["rev-parse", "tend/propose/orders"]);
    let run = tend(&["propose", "orders", "--output", "branch"], 0);
    assert!(run.stdout.contains(": updated to "), "{}", run.stdout);
    let parents = git(&bare, &["log", "-1", "--format=%P", "tend/propose/orders"]);
    assert_eq!(parents, before, "updated without force: on the earlier tip");

    // A human commits on the branch: tend does not push over it.
    let work = served.path().join("work");
    git(
        served.path(),
        &[
            "clone",
            "-q",
            "-b",
            "tend/propose/orders",
            &bare.display().to_string(),
            "work",
        ],
    );
    std::fs::write(work.join("NOTE.md"), "reviewed\n").unwrap();
    git(&work, &["add", "NOTE.md"]);
    git(&work, &["commit", "-q", "-m", "a reviewer's note"]);
    git(&work, &["push", "-q", "origin", "tend/propose/orders"]);
    let human_tip = git(&bare, &["rev-parse", "tend/propose/orders"]);
    tend(
        &["sandbox", "edit", "orders", "--set", "connectionLimit=700"],
        0,
    );
    let run = tend(&["propose", "orders", "--output", "branch"], 1);
    assert!(
        run.stderr
            .contains("tend/propose/orders has commits that are not tend's"),
        "{}",
        run.stderr
    );
    assert_eq!(git(&bare, &["rev-parse", "tend/propose/orders"]), human_tip);
    // The tracked branch never moved.
    assert_eq!(git(&bare, &["rev-parse", "main"]), main);
}

mod property {
    //! For random declarations (styles, comments, a second document) and
    //! random values at the provider for their mutable fields, the
    //! proposal decides InSync against the provider's values, and every
    //! line outside the proposed values is unchanged.

    use std::collections::BTreeMap;
    use std::path::Path;
    use std::time::{Duration, SystemTime};

    use proptest::prelude::*;
    use serde_json::{Value, json};
    use tend::testing::engine::{
        DecideInput, DeletionGate, Drift, DriftOrigin, Memory, Policy, State, Subject, decide,
    };
    use tend::testing::model::{DeclarationSet, parse_file};
    use tend::testing::provider::{
        Capabilities, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation, Observed,
        ResourceStatus,
    };

    #[derive(Debug, Clone, Copy)]
    enum Quote {
        Plain,
        Single,
        Double,
    }

    fn quote(s: &str, q: Quote) -> String {
        match q {
            Quote::Plain => s.to_string(),
            Quote::Single => format!("'{}'", s.replace('\'', "''")),
            Quote::Double => serde_json::to_string(s).unwrap(),
        }
    }

    fn quote_style() -> impl Strategy<Value = Quote> {
        prop_oneof![Just(Quote::Plain), Just(Quote::Single), Just(Quote::Double)]
    }

    /// Words safe to write plain (the declaration's own values).
    fn word() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9_]{0,8}"
    }

    /// Values at the provider: plain-safe, or needing quotes.
    fn provider_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z][a-z0-9_]{0,8}",
            "[a-zA-Z0-9 ]{1,10}: [a-z#]{1,5}",
            Just("true".to_string()),
            Just("123".to_string()),
            Just("it's \"quoted\"".to_string()),
            Just("# not a comment".to_string()),
        ]
    }

    #[derive(Debug, Clone)]
    struct Case {
        owner: (String, Quote),
        limit: i64,
        comment: Option<(String, Quote)>,
        /// Parameters: none, block or flow.
        params: Option<(bool, Vec<(String, String)>)>,
        second_document: bool,
        /// Changes at the provider.
        new_owner: Option<String>,
        new_limit: Option<i64>,
        new_comment: Option<String>,
        new_param: Option<(usize, Option<String>)>,
        added_param: Option<String>,
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            (word(), quote_style()),
            0i64..1000,
            proptest::option::of((word(), quote_style())),
            proptest::option::of((
                any::<bool>(),
                proptest::collection::vec(("p[a-z]{1,5}", word()), 1..3),
            )),
            any::<bool>(),
            proptest::option::of("[a-z][a-z0-9_]{1,8}"),
            proptest::option::of(0i64..5000),
            proptest::option::of(provider_text()),
            proptest::option::of((0usize..3, proptest::option::of(provider_text()))),
            proptest::option::of(provider_text()),
        )
            .prop_map(
                |(owner, limit, comment, params, second, no, nl, nc, np, ap)| Case {
                    owner,
                    limit,
                    comment,
                    params: params.map(|(flow, mut p)| {
                        p.sort();
                        p.dedup_by(|a, b| a.0 == b.0);
                        (flow, p)
                    }),
                    second_document: second,
                    new_owner: no,
                    new_limit: nl,
                    new_comment: nc,
                    new_param: np,
                    added_param: ap,
                },
            )
    }

    fn text(c: &Case) -> String {
        let mut t = String::from(
            "# generated\napiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: db   # the name\nspec:\n",
        );
        t.push_str(&format!("  owner: {}\n", quote(&c.owner.0, c.owner.1)));
        t.push_str(&format!("  connectionLimit: {} # a comment\n", c.limit));
        if let Some((comment, q)) = &c.comment {
            t.push_str(&format!("  comment: {}\n", quote(comment, *q)));
        }
        match &c.params {
            Some((true, p)) => {
                let inner: Vec<String> = p.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                t.push_str(&format!("  parameters: {{{}}}\n", inner.join(", ")));
            }
            Some((false, p)) => {
                t.push_str("  parameters:\n");
                for (k, v) in p {
                    t.push_str(&format!("    {k}: {v}   # why\n"));
                }
            }
            None => {}
        }
        if c.second_document {
            t.push_str("---\napiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata: {name: other}\nspec: {connectionLimit: 3}\n");
        }
        t
    }

    fn caps() -> Capabilities {
        Capabilities::for_fields(
            &[
                "databaseName",
                "owner",
                "connectionLimit",
                "parameters",
                "comment",
            ],
            true,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn proposing_then_planning_is_in_sync_and_keeps_every_other_byte(c in case()) {
            let before = text(&c);
            let parsed = parse_file(Path::new("db.yaml"), before.as_bytes());
            prop_assert!(parsed.diagnostics.is_empty(), "{:?}\n{before}", parsed.diagnostics);
            let decl = parsed.declarations.iter().find(|d| d.name() == "db").unwrap().clone();
            // The provider: as declared, then changed by hand.
            let mut provider = tend::testing::engine::desired::desired_fields(&decl.manifest, &caps());
            let mut drift = Vec::new();
            let mut change = |field: &str, new: Value| {
                let old = provider.get(field).cloned().unwrap_or(Value::Null);
                if old != new {
                    drift.push(Drift { field: field.into(), desired: old, observed: new.clone(), origin: DriftOrigin::OutOfBand, ignored: false });
                    if new.is_null() { provider.remove(field); } else { provider.insert(field.into(), new); }
                }
            };
            if let Some(o) = &c.new_owner { change("owner", json!(o)); }
            if let Some(l) = c.new_limit { change("connectionLimit", json!(l)); }
            if let (Some(n), Some(_)) = (&c.new_comment, &c.comment) { change("comment", json!(n)); }
            if let (Some((i, v)), Some((_, params))) = (&c.new_param, &c.params) {
                let (k, _) = &params[i % params.len()];
                change(&format!("parameters.{k}"), v.as_ref().map_or(Value::Null, |v| json!(v)));
            }
            if let (Some(v), Some(_)) = (&c.added_param, &c.params) {
                change("parameters.zz_added", json!(v));
            }
            prop_assume!(!drift.is_empty());
            let refs: Vec<&Drift> = drift.iter().collect();
            let proposal = tend::testing::propose::propose(&before, "db.yaml", "db", &refs, &BTreeMap::new(), &[]);
            let proposal = match proposal {
                Ok(p) => p,
                Err(e) => return Err(TestCaseError::fail(format!("{e}\n{before}"))),
            };
            let after = &proposal.after;
            // Decided against the provider's values: in sync.
            let set = DeclarationSet::from_files(vec![parse_file(Path::new("db.yaml"), after.as_bytes())]);
            prop_assert!(set.diagnostics.is_empty(), "{:?}\n{after}", set.diagnostics);
            let new = set.declarations.iter().find(|d| d.name() == "db").unwrap();
            let mut fields = provider.clone();
            fields.insert("databaseName".into(), json!("db"));
            let observed = Observed::Found(Observation {
                database_name: "db".into(),
                external_id: "x".into(),
                status: ResourceStatus::Ready,
                fields: fields.into_iter().collect(),
                labels: tend::testing::model::FlatMap::from([
                    (OWNER_AGENT_LABEL.to_string(), "a".to_string()),
                    (OWNER_DECLARATION_LABEL.to_string(), "db".to_string()),
                ]),
                observed_at: SystemTime::UNIX_EPOCH + Duration::from_secs(100),
                unobserved: Vec::new(),
            });
            let memory = Memory { existed: true, ..Memory::default() };
            let policy = Policy { agent_id: "a".into(), ..Policy::default() };
            let decision = decide(&DecideInput {
                subject: Subject::Declared(new),
                observed: &observed,
                memory: &memory,
                overrides: &[],
                policy: &policy,
                capabilities: &caps(),
                deletion: &DeletionGate::Allowed,
                provider_override_seen: None,
                provider: "main",
                suspension: None,
                renamed: None,
                now: SystemTime::UNIX_EPOCH + Duration::from_secs(200),
            });
            prop_assert_eq!(decision.state, State::InSync, "{}\n{}\n{:?}", after, decision.reason, decision.drift);
            // Every line that changed names a proposed field.
            let keys: Vec<String> = drift
                .iter()
                .map(|d| d.field.strip_prefix("parameters.").unwrap_or(&d.field).to_string())
                .chain(std::iter::once("parameters".to_string()))
                .collect();
            let diff = similar::TextDiff::from_lines(&before, after);
            for change in diff.iter_all_changes() {
                if change.tag() == similar::ChangeTag::Equal {
                    continue;
                }
                let line = change.value();
                prop_assert!(
                    keys.iter().any(|k| line.contains(&format!("{k}:"))),
                    "line {line:?} changed, not a proposed field:\n{before}\n---\n{after}"
                );
            }
        }
    }
}

/// `[status] propose = true`: a proposal branch for an overridden
/// resource with out-of-band drift, updated while it lasts, deleted once
/// Git declares the change.
#[test]
fn status_propose_keeps_a_branch_while_the_drift_lasts() {
    let served = tempfile::tempdir().unwrap();
    let seed = TestRepo::new();
    seed.write("orders.yaml", ORDERS);
    seed.commit("declarations");
    let bare = seed.bare_clone(served.path());
    let url = format!("file://{}", bare.display());
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &url)
        .top("agent_id", Some("\"auto-agent\""))
        .status("propose", "true")
        .write()
        .display()
        .to_string();
    let tend = |args: &[&str], code: i32| {
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        TendCommand::new(&all).expect_code(code)
    };
    let branches = || {
        git(
            &bare,
            &["for-each-ref", "--format=%(refname:short)", "refs/heads/"],
        )
    };
    tend(&["apply"], 0);
    assert_eq!(branches(), "main");
    tend(
        &["sandbox", "edit", "orders", "--set", "connectionLimit=500"],
        0,
    );
    tend(&["apply"], 2);
    assert_eq!(branches(), "main\ntend/propose/orders");
    let first = git(&bare, &["rev-parse", "tend/propose/orders"]);
    // Unchanged: no new commit.
    tend(&["apply"], 2);
    assert_eq!(git(&bare, &["rev-parse", "tend/propose/orders"]), first);
    // The drift moves: the branch follows, fast-forward.
    tend(
        &["sandbox", "edit", "orders", "--set", "connectionLimit=600"],
        0,
    );
    tend(&["apply"], 2);
    assert_eq!(
        git(&bare, &["log", "-1", "--format=%P", "tend/propose/orders"]),
        first
    );
    // Merged: Git declares it now, the branch goes.
    let work = served.path().join("merge");
    git(
        served.path(),
        &["clone", "-q", &bare.display().to_string(), "merge"],
    );
    git(&work, &["fetch", "-q", "origin", "tend/propose/orders"]);
    git(&work, &["merge", "-q", "--ff-only", "FETCH_HEAD"]);
    git(&work, &["push", "-q", "origin", "main"]);
    tend(&["apply"], 0);
    assert_eq!(branches(), "main");
}

/// A provider that reports a setting as a number (`128`, not `"128"`):
/// proposed as the setting's text, and the result plans in sync (it was
/// refused as an unsound edit, "Please report this").
#[test]
fn a_numeric_setting_at_the_provider_is_proposed_as_text() {
    let env = Env::new(&[("orders.yaml", ORDERS)], |c| c);
    env.edit("carts", &["parameters.work_mem=128"]);
    let run = env.tend(&["propose", "carts"], 0);
    assert!(
        run.stdout.contains("+        work_mem: 128"),
        "{}",
        run.stdout
    );
    env.apply_patch(&run.stdout);
    assert_eq!(env.state_of("carts"), "InSync");
}

/// A file whose `owner` carries a YAML anchor an annotation refers to:
/// `tend.dev/paused: *v` means the last `&v` before it, `"false"`.
/// Rewriting `owner` would drop that anchor and `*v` would mean the first
/// one, `"true"`: the declaration paused with no expiry, a change the
/// proposal never showed. tend refuses the edit and says why (it proposed
/// it before, and "Please report this" was the message for other
/// refusals).
#[test]
fn an_edit_to_an_anchored_value_is_refused_with_the_reason() {
    const ANCHORED: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
spec:
  comment: &v \"true\"
  owner: &v \"false\"
  connectionLimit: 5
metadata:
  name: orders
  annotations:
    tend.dev/paused: *v
";
    let env = Env::new(&[("orders.yaml", ANCHORED)], |c| c);
    env.edit("orders", &["owner=\"alice\""]);
    let run = env.tend(&["propose", "orders"], 1);
    assert!(
        run.stderr.contains(
            "orders.yaml: tend does not edit owner of `orders`: the change touches `&v \"false\"`, a YAML anchor"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("Edit the file by hand"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("Please report"), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "no patch is offered: {}", run.stdout);
    // A field the anchors do not touch is still proposed, and the
    // merged result plans without a pause.
    env.edit("orders", &["owner=\"false\"", "connectionLimit=7"]);
    let run = env.tend(&["propose", "orders"], 0);
    env.apply_patch(&run.stdout);
    let written = std::fs::read_to_string(env.repo.path().join("orders.yaml")).unwrap();
    assert!(written.contains("  connectionLimit: 7\n"), "{written}");
    assert!(written.contains("tend.dev/paused: *v"), "{written}");
    assert_eq!(env.state_of("orders"), "InSync");
}
