//! `tend validate` and `tend schema` through the real binary.

use crate::support;

use std::fs;

use serde_json::Value;
use support::{TendCommand, repo_root};

const GOOD: &str = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: good\nspec:\n  owner: app\n";
const BAD: &str = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: bad\nspec:\n  conectionLimit: 5\n";

#[test]
fn validate_accepts_the_examples() {
    let run = TendCommand::new(&["validate", "examples/databases"])
        .current_dir(&repo_root())
        .expect_code(0);
    assert_eq!(run.stdout.trim(), "6 declarations, 0 errors");
    assert_eq!(run.stderr, "");
}

#[test]
fn validate_reports_file_line_column_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("team")).unwrap();
    fs::write(dir.path().join("good.yaml"), GOOD).unwrap();
    fs::write(dir.path().join("team/bad.yml"), BAD).unwrap();
    fs::write(dir.path().join("notes.txt"), "not yaml: [").unwrap();
    let run = TendCommand::new(&["validate", "."])
        .current_dir(dir.path())
        .expect_code(1);
    assert_eq!(
        run.stderr.lines().collect::<Vec<_>>(),
        vec![
            "./team/bad.yml:6:3: spec: unknown field `conectionLimit` (did you mean `connectionLimit`?); the fields are `provider`, `databaseName`, `owner`, `encoding`, `locale`, `template`, `connectionLimit`, `allowConnections`, `extensions`, `parameters`, `comment`, `engine`, `version`, `size`, `storageGb`, `highAvailability`, `backupRetentionDays`, `region`, `deletionPolicy`, `driftPolicy`"
        ]
    );
    assert_eq!(run.stdout.trim(), "1 declaration, 1 error");
}

#[test]
fn validate_json_lists_every_error() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("good.yaml"), GOOD).unwrap();
    fs::write(dir.path().join("bad.yaml"), BAD).unwrap();
    fs::write(dir.path().join("empty.yaml"), "").unwrap();
    let run = TendCommand::new(&[
        "validate",
        "--format",
        "json",
        "good.yaml",
        "bad.yaml",
        "empty.yaml",
    ])
    .current_dir(dir.path())
    .expect_code(1);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["declarations"], 1);
    let errors = report["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2);
    assert_eq!(errors[0]["file"], "bad.yaml");
    assert_eq!(errors[0]["line"], 6);
    assert_eq!(errors[0]["column"], 3);
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `conectionLimit`")
    );
    assert_eq!(errors[1]["file"], "empty.yaml");
    assert_eq!(
        errors[1].as_object().unwrap().len(),
        4,
        "exactly file, line, column, message"
    );

    let ok = TendCommand::new(&["validate", "--format", "json", "good.yaml"])
        .current_dir(dir.path())
        .expect_code(0);
    let report: Value = serde_json::from_str(&ok.stdout).unwrap();
    assert_eq!(report, serde_json::json!({"declarations": 1, "errors": []}));
}

#[test]
fn validate_of_a_missing_path_is_an_error() {
    let run = TendCommand::new(&["validate", "does/not/exist"]).expect_code(1);
    assert!(
        run.stderr.contains("does/not/exist:1:1: cannot read"),
        "{}",
        run.stderr
    );
}

#[test]
fn usage_errors_exit_1_never_2() {
    let run = TendCommand::new(&["validate"]).expect_code(1);
    assert!(run.stderr.contains("required"), "{}", run.stderr);
    TendCommand::new(&["--help"]).expect_code(0);
}

fn yaml_documents_as_json(text: &str) -> Vec<Value> {
    text.split("\n---\n")
        .map(|doc| {
            serde_json::to_value(serde_norway::from_str::<serde_norway::Value>(doc).unwrap())
                .unwrap()
        })
        .collect()
}

#[test]
fn schema_is_draft07_and_validates_the_examples() {
    let run = TendCommand::new(&["schema"]).expect_code(0);
    let schema: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    let validator = jsonschema::draft7::new(&schema).expect("a valid draft-07 schema");

    let mut checked = 0;
    for entry in fs::read_dir(repo_root().join("examples/databases")).unwrap() {
        let text = fs::read_to_string(entry.unwrap().path()).unwrap();
        for doc in yaml_documents_as_json(&text) {
            let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{errors:?}\n{doc}");
            checked += 1;
        }
    }
    assert_eq!(checked, 6);

    // The schema has teeth: what the parser rejects, editors flag too.
    for bad in [
        BAD,
        "apiVersion: tend.dev/v1\nkind: ManagedDatabase\nmetadata:\n  name: x\n",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: x\n  annotations:\n    tend.dev/pasued: \"true\"\n",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: x\nspec:\n  backupRetentionDays: 99\n",
    ] {
        let doc = &yaml_documents_as_json(bad)[0];
        assert!(!validator.is_valid(doc), "schema accepted:\n{bad}");
    }
    let spec = &schema["definitions"]["Spec"]["properties"];
    assert_eq!(spec["encoding"]["x-tend-mutability"], "immutable");
    assert_eq!(spec["connectionLimit"]["x-tend-mutability"], "mutable");
}

#[test]
fn committed_schema_matches_the_binary() {
    let run = TendCommand::new(&["schema"]).expect_code(0);
    let committed =
        fs::read_to_string(repo_root().join("docs/schema/managed-database.schema.json")).unwrap();
    assert!(
        committed == run.stdout,
        "docs/schema/managed-database.schema.json is stale: run `cargo run -- schema > docs/schema/managed-database.schema.json`"
    );
}

#[test]
fn declaration_docs_list_every_field_with_its_mutability() {
    let docs = fs::read_to_string(repo_root().join("docs/declarations.md")).unwrap();
    for field in tend::testing::model::FIELDS {
        let row = docs
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", field.name)))
            .unwrap_or_else(|| {
                panic!("docs/declarations.md has no table row for `{}`", field.name)
            });
        assert!(
            row.contains(&format!("| {} |", field.mutability.as_str())),
            "docs/declarations.md: `{}` should be {}: {row}",
            field.name,
            field.mutability.as_str()
        );
    }
    for annotation in tend::testing::model::overrides::KNOWN_ANNOTATIONS {
        assert!(
            docs.contains(&format!("`{annotation}`")),
            "docs/declarations.md does not describe {annotation}"
        );
    }
}

/// Which invalid declarations an editor's JSON Schema validator flags: a
/// second, independent implementation (the `jsonschema` crate) over every
/// case of `tests/corpus/bad/`. Every case must be flagged by the schema,
/// or be listed here with why only `tend validate` can catch it; the list
/// is exact, so a rule the schema loses (or gains) shows up here.
#[test]
fn an_independent_schema_validator_flags_every_bad_case_draft07_can_express() {
    let run = TendCommand::new(&["schema"]).expect_code(0);
    let schema: Value = serde_json::from_str(&run.stdout).unwrap();
    let validator = jsonschema::draft7::new(&schema).unwrap();
    let only_tend: std::collections::BTreeMap<&str, &str> = [
        ("alias-bomb", "not YAML an editor's schema check gets to see: the expansion is refused before any schema applies"),
        ("duplicate-key", "a key twice in one mapping: YAML parsers refuse it or keep one value silently, and no schema sees the other"),
        ("duplicate-annotation", "the same: a map's key twice (the second pause value would silently win)"),
        ("syntax-error", "not YAML"),
        ("tab-indentation", "not YAML"),
        ("duplicate-names", "two documents naming one resource: a schema checks one document at a time"),
        ("expires-zero", "a zero duration is well-formed; that it is zero is a rule about its value"),
        ("extension-duplicate", "the same extension twice in two spellings (`pg_trgm` and `{name: pg_trgm, version: …}`): `uniqueItems` compares whole items, which differ"),
    ]
    .into_iter()
    .collect();
    let mut flagged = Vec::new();
    let mut missed = Vec::new();
    for entry in fs::read_dir(repo_root().join("tests/corpus/bad")).unwrap() {
        let path = entry.unwrap().path();
        let case = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = fs::read_to_string(&path).unwrap_or_default();
        let docs: Result<Vec<Value>, String> = text
            .split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| {
                serde_norway::from_str::<serde_norway::Value>(d)
                    .map_err(|e| e.to_string())
                    .and_then(|v| serde_json::to_value(v).map_err(|e| e.to_string()))
            })
            .collect();
        let caught = match &docs {
            Ok(docs) => !docs.is_empty() && docs.iter().any(|d| !validator.is_valid(d)),
            Err(_) => false,
        };
        if caught {
            flagged.push(case);
        } else {
            missed.push(case);
        }
    }
    println!("flagged by the schema: {}", flagged.join(", "));
    for case in &missed {
        println!(
            "only tend validate: {case}: {}",
            only_tend.get(case.as_str()).unwrap_or(&"(no reason given)")
        );
    }
    let missed_set: std::collections::BTreeSet<&str> = missed.iter().map(String::as_str).collect();
    let expected: std::collections::BTreeSet<&str> = only_tend.keys().copied().collect();
    assert_eq!(
        missed_set, expected,
        "the cases the schema misses are not the ones listed with a reason"
    );
}

/// Each mistake is said in words, at its place: the type wanted and what
/// was written, a tab as a tab, the field a misspelt name meant, and
/// values the server would refuse.
#[test]
fn validate_says_each_mistake_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let head = |name: &str| {
        format!("apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\n")
    };
    for (file, spec) in [
        ("a.yaml", "spec:\n  connectionLimit: fifty\n"),
        ("b.yaml", "spec:\n  connectionLimit: 1e3\n"),
        ("c.yaml", "spec:\n\tconnectionLimit: 5\n"),
        ("d.yaml", "spec:\n  ownr: app\n"),
        ("e.yaml", "spec:\n  extensions:\n    - PG_TRGM\n"),
        (
            "f.yaml",
            "spec:\n  parameters:\n    search_path: '\"$user, public'\n",
        ),
        ("g.yaml", "spec:\n  allowConnections: 1\n"),
    ] {
        let name = file.trim_end_matches(".yaml");
        fs::write(dir.path().join(file), format!("{}{spec}", head(name))).unwrap();
    }
    let run = TendCommand::new(&["validate", "."])
        .current_dir(dir.path())
        .expect_code(1);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(
        lines,
        [
            "./a.yaml:6:20: spec.connectionLimit must be a whole number, not the text \"fifty\"",
            "./b.yaml:6:20: spec.connectionLimit must be a whole number, not 1e3; write 1000",
            "./c.yaml:6:1: a tab character: YAML indents with spaces only; replace the tab with spaces",
            "./d.yaml:6:3: spec: unknown field `ownr` (did you mean `owner`?); the fields are `provider`, `databaseName`, `owner`, `encoding`, `locale`, `template`, `connectionLimit`, `allowConnections`, `extensions`, `parameters`, `comment`, `engine`, `version`, `size`, `storageGb`, `highAvailability`, `backupRetentionDays`, `region`, `deletionPolicy`, `driftPolicy`",
            "./e.yaml:7:7: extension `PG_TRGM`: extension names are lowercase; write `pg_trgm`",
            "./f.yaml:7:18: spec.parameters.search_path has an unterminated quote in `\"$user, public`: each quoted schema name needs its closing `\"` (`\"$user\", public`)",
            "./g.yaml:6:21: spec.allowConnections must be true or false, not the number 1",
        ],
        "{}",
        run.stderr
    );
}
