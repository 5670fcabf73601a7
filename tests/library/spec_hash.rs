//! The spec hash is canonical: it ignores key order, quoting, comments,
//! block/flow style and explicit defaults, and changes when any value does.

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;
use tend::testing::model::{DeclarationSet, SpecHash, parse_file};

#[derive(Debug, Clone)]
enum Value {
    Text(String),
    Int(i64),
    Flag(bool),
    Names(Vec<String>),
    Settings(BTreeMap<String, String>),
}

/// How one rendering writes things down.
#[derive(Debug, Clone)]
struct Style {
    order: Vec<usize>,
    quote: u8,
    flow: bool,
    comments: bool,
}

fn ident() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,10}"
}

fn spec_fields() -> impl Strategy<Value = Vec<(String, Value)>> {
    (
        ident(),
        prop_oneof![Just("UTF8".to_string()), Just("LATIN1".to_string())],
        "[A-Za-z][A-Za-z ,.]{0,30}[a-z]",
        -1i64..10_000,
        any::<bool>(),
        proptest::collection::btree_set(ident(), 0..4),
        proptest::collection::btree_map("[a-z][a-z_]{0,12}", "[0-9]{1,4}(MB|kB|s|ms)?", 0..4),
        1i64..5000,
        0i64..=35,
        prop_oneof![Just("Retain".to_string()), Just("Delete".to_string())],
        "[0-9]{1,2}",
    )
        .prop_map(
            |(
                owner,
                encoding,
                comment,
                limit,
                allow,
                exts,
                params,
                storage,
                days,
                deletion,
                version,
            )| {
                vec![
                    ("owner".into(), Value::Text(owner)),
                    ("encoding".into(), Value::Text(encoding)),
                    ("comment".into(), Value::Text(comment)),
                    ("connectionLimit".into(), Value::Int(limit)),
                    ("allowConnections".into(), Value::Flag(allow)),
                    (
                        "extensions".into(),
                        Value::Names(exts.into_iter().collect()),
                    ),
                    ("parameters".into(), Value::Settings(params)),
                    ("storageGb".into(), Value::Int(storage)),
                    ("backupRetentionDays".into(), Value::Int(days)),
                    ("deletionPolicy".into(), Value::Text(deletion)),
                    ("version".into(), Value::Text(version)),
                ]
            },
        )
}

fn style(fields: usize) -> impl Strategy<Value = Style> {
    (
        Just((0..fields).collect::<Vec<_>>()).prop_shuffle(),
        0u8..3,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(order, quote, flow, comments)| Style {
            order,
            quote,
            flow,
            comments,
        })
}

fn scalar(text: &str, quote: u8, must_quote: bool) -> String {
    match quote {
        1 => format!("'{}'", text.replace('\'', "''")),
        2 => format!("\"{text}\""),
        _ if must_quote || text.contains(", ") || text.contains(": ") => format!("\"{text}\""),
        _ => text.to_string(),
    }
}

fn render(fields: &[(String, Value)], style: &Style) -> String {
    let mut out = String::from(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: hashed\nspec:\n",
    );
    for &i in &style.order {
        let (key, value) = &fields[i];
        if style.comments {
            out.push_str("  # a comment that must not matter\n");
        }
        let rendered = match value {
            // `version: 16` would be an integer; it is a string field.
            Value::Text(t) => scalar(t, style.quote, key == "version"),
            Value::Int(n) => n.to_string(),
            Value::Flag(b) => b.to_string(),
            Value::Names(names) if style.flow || names.is_empty() => format!(
                "[{}]",
                names
                    .iter()
                    .map(|n| scalar(n, style.quote, false))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Names(names) => names
                .iter()
                .enumerate()
                .map(|(j, n)| {
                    // Alternate the two spellings of an extension.
                    if j % 2 == 0 {
                        format!("\n    - {}", scalar(n, style.quote, false))
                    } else {
                        format!("\n    - name: {}", scalar(n, style.quote, false))
                    }
                })
                .collect(),
            Value::Settings(map) if style.flow || map.is_empty() => format!(
                "{{{}}}",
                map.iter()
                    .rev()
                    .map(|(k, v)| format!("{k}: {}", scalar(v, style.quote, false)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Settings(map) => map
                .iter()
                .rev()
                .map(|(k, v)| format!("\n    {k}: {}", scalar(v, style.quote, false)))
                .collect(),
        };
        let trailing = if style.comments && !rendered.starts_with('\n') {
            "  # trailing"
        } else {
            ""
        };
        out.push_str(&format!("  {key}: {rendered}{trailing}\n"));
    }
    out
}

fn hash_of(text: &str) -> SpecHash {
    let set = DeclarationSet::from_files(vec![parse_file(Path::new("p.yaml"), text.as_bytes())]);
    assert!(set.diagnostics.is_empty(), "{:?}\n{text}", set.diagnostics);
    assert_eq!(set.declarations.len(), 1);
    set.declarations[0].spec_hash.clone()
}

fn mutate(value: &Value, key: &str) -> Value {
    match value {
        Value::Text(t) if key == "deletionPolicy" => {
            Value::Text(if t == "Retain" { "Delete" } else { "Retain" }.into())
        }
        Value::Text(t) if key == "encoding" => {
            Value::Text(if t == "UTF8" { "LATIN1" } else { "UTF8" }.into())
        }
        Value::Text(t) if key == "version" => Value::Text(format!("{t}1")),
        Value::Text(t) => Value::Text(format!("{t}x")),
        Value::Int(n) if key == "backupRetentionDays" => {
            Value::Int(if *n == 35 { 0 } else { n + 1 })
        }
        Value::Int(n) => Value::Int(n + 1),
        Value::Flag(b) => Value::Flag(!b),
        Value::Names(names) => {
            let mut names = names.clone();
            names.push("zz_added".into());
            Value::Names(names)
        }
        Value::Settings(map) => {
            let mut map = map.clone();
            map.insert("zz_added".into(), "1".into());
            Value::Settings(map)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn hash_ignores_order_quoting_comments_and_style(
        fields in spec_fields(),
        a in style(11),
        b in style(11),
    ) {
        prop_assert_eq!(hash_of(&render(&fields, &a)), hash_of(&render(&fields, &b)));
    }

    #[test]
    fn hash_changes_when_any_value_changes(
        fields in spec_fields(),
        s in style(11),
        which in 0usize..11,
    ) {
        let mut changed = fields.clone();
        let (key, value) = &fields[which];
        changed[which].1 = mutate(value, key);
        prop_assert_ne!(hash_of(&render(&fields, &s)), hash_of(&render(&changed, &s)), "changed {}", key);
    }
}

#[test]
fn explicit_defaults_hash_like_absent_ones() {
    let base = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders-db\nspec:\n  owner: app\n";
    let explicit = format!(
        "{base}  deletionPolicy: Retain\n  driftPolicy: Correct\n  databaseName: orders_db\n"
    );
    assert_eq!(hash_of(base), hash_of(&explicit));
    let renamed = format!("{base}  databaseName: orders\n");
    assert_ne!(hash_of(base), hash_of(&renamed));
}

#[test]
fn good_declarations_round_trip() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let set = tend::testing::model::load_paths(&[
        root.join("examples/databases"),
        root.join("tests/corpus/good"),
    ]);
    assert!(set.diagnostics.is_empty(), "{:?}", set.diagnostics);
    assert!(set.declarations.len() >= 6);
    for decl in &set.declarations {
        let yaml = serde_norway::to_string(&decl.manifest).unwrap();
        let again =
            DeclarationSet::from_files(vec![parse_file(Path::new("again.yaml"), yaml.as_bytes())]);
        assert!(
            again.diagnostics.is_empty(),
            "{}: {:?}\n{yaml}",
            decl.name(),
            again.diagnostics
        );
        assert_eq!(
            again.declarations[0].manifest,
            decl.manifest,
            "{}",
            decl.name()
        );
        assert_eq!(
            again.declarations[0].spec_hash,
            decl.spec_hash,
            "{}",
            decl.name()
        );
        assert_eq!(
            again.declarations[0].annotations,
            decl.annotations,
            "{}",
            decl.name()
        );
    }
}
