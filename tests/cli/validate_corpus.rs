//! The corpus of bad declarations: every file under `tests/corpus/bad` ends
//! with `# expect: LINE:COLUMN: message fragment` lines (and optionally
//! `# expect-declarations: N`); the parser must report exactly those
//! problems, at exactly those places.

use crate::support;

use std::fs;
use std::path::Path;

use tend::testing::model::{DeclarationSet, Diagnostic, parse_file};

#[derive(Debug)]
struct Expected {
    line: usize,
    column: usize,
    fragment: String,
}

fn expectations(text: &str) -> (Vec<Expected>, usize) {
    let mut expected = Vec::new();
    let mut declarations = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# expect: ") {
            let mut parts = rest.splitn(3, ':');
            let line_no = parts.next().unwrap().parse().unwrap();
            let column = parts.next().unwrap().parse().unwrap();
            let fragment = parts.next().unwrap().trim().to_string();
            expected.push(Expected {
                line: line_no,
                column,
                fragment,
            });
        } else if let Some(n) = line.strip_prefix("# expect-declarations: ") {
            declarations = n.parse().unwrap();
        }
    }
    (expected, declarations)
}

fn check(file: &Path, set: &DeclarationSet, expected: &[Expected], declarations: usize) {
    let shown: Vec<String> = set.diagnostics.iter().map(Diagnostic::to_string).collect();
    assert_eq!(
        set.diagnostics.len(),
        expected.len(),
        "{}: expected {} problems, got:\n{}",
        file.display(),
        expected.len(),
        shown.join("\n")
    );
    for (want, got) in expected.iter().zip(&set.diagnostics) {
        assert!(
            got.line == want.line
                && got.column == want.column
                && got.message.contains(&want.fragment),
            "{}: expected {}:{}: …{}…, got {got}",
            file.display(),
            want.line,
            want.column,
            want.fragment
        );
    }
    assert_eq!(
        set.declarations.len(),
        declarations,
        "{}: valid declarations kept",
        file.display()
    );
}

#[test]
fn every_bad_declaration_is_reported_at_its_place() {
    let dir = support::repo_root().join("tests/corpus/bad");
    let mut files: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 40, "the corpus has {} files", files.len());
    for file in files {
        let bytes = fs::read(&file).unwrap();
        let (expected, declarations) = expectations(&String::from_utf8_lossy(&bytes));
        assert!(
            !expected.is_empty(),
            "{} has no `# expect:` line",
            file.display()
        );
        let set = DeclarationSet::from_files(vec![parse_file(&file, &bytes)]);
        check(&file, &set, &expected, declarations);
    }
}

#[test]
fn a_file_over_one_mebibyte_is_refused_unparsed() {
    let mut text = String::from(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: big\n",
    );
    while text.len() <= 1024 * 1024 {
        text.push_str("# padding padding padding padding padding padding padding\n");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.yaml");
    fs::write(&file, &text).unwrap();
    let set = tend::testing::model::load_paths(std::slice::from_ref(&file));
    assert_eq!(set.diagnostics.len(), 1);
    let d = &set.diagnostics[0];
    assert_eq!((d.line, d.column), (1, 1));
    assert!(d.message.contains("over the 1 MiB limit"), "{d}");
}

#[test]
fn non_utf8_bytes_are_reported_where_they_are() {
    let mut bytes =
        b"apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: caf".to_vec();
    bytes.extend_from_slice(&[0xe9, b'\n']);
    let set = DeclarationSet::from_files(vec![parse_file(Path::new("latin1.yaml"), &bytes)]);
    assert_eq!(set.diagnostics.len(), 1);
    let d = &set.diagnostics[0];
    assert_eq!((d.line, d.column), (4, 12));
    assert!(d.message.contains("not valid UTF-8"), "{d}");
}

#[test]
fn a_completely_empty_file_is_an_error() {
    let set = DeclarationSet::from_files(vec![parse_file(Path::new("empty.yaml"), b"")]);
    assert_eq!(set.diagnostics.len(), 1);
    assert!(set.diagnostics[0].message.contains("no YAML documents"));
}

#[test]
fn duplicates_across_files_are_errors_in_both_and_neither_is_kept() {
    let doc = |limit: u32| {
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\nspec:\n  connectionLimit: {limit}\n"
        )
    };
    let other =
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: billing\n";
    let set = DeclarationSet::from_files(vec![
        parse_file(Path::new("a.yaml"), doc(1).as_bytes()),
        parse_file(Path::new("b.yaml"), doc(2).as_bytes()),
        parse_file(Path::new("c.yaml"), other.as_bytes()),
    ]);
    let places: Vec<_> = set
        .diagnostics
        .iter()
        .map(|d| (d.file.display().to_string(), d.line, d.column))
        .collect();
    assert_eq!(
        places,
        vec![("a.yaml".to_string(), 4, 9), ("b.yaml".to_string(), 4, 9)]
    );
    assert!(set.diagnostics[0].message.contains("also at b.yaml:4"));
    let names: Vec<_> = set.declarations.iter().map(|d| d.name()).collect();
    assert_eq!(names, vec!["billing"]);
}

#[test]
fn positions_count_from_the_start_of_the_file_in_later_documents() {
    let text = "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: a\n---\n# comment\napiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: b\nspec:\n  owner: [x]\n";
    let set = DeclarationSet::from_files(vec![parse_file(Path::new("m.yaml"), text.as_bytes())]);
    assert_eq!(set.declarations.len(), 1);
    assert_eq!(set.diagnostics.len(), 1, "{:?}", set.diagnostics);
    assert_eq!(
        (set.diagnostics[0].line, set.diagnostics[0].column),
        (12, 10),
        "{}",
        set.diagnostics[0]
    );
    assert!(!set.diagnostics[0].message.contains(" at line "));
}

#[test]
fn two_declarations_of_one_database_are_errors_and_neither_is_kept() {
    let doc = |name: &str| {
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  databaseName: shared\n"
        )
    };
    let set = DeclarationSet::from_files(vec![
        parse_file(Path::new("a.yaml"), doc("first").as_bytes()),
        parse_file(Path::new("b.yaml"), doc("second").as_bytes()),
        parse_file(
            Path::new("c.yaml"),
            doc("orders-db")
                .replace("  databaseName: shared\n", "")
                .as_bytes(),
        ),
    ]);
    assert_eq!(set.diagnostics.len(), 2, "{:?}", set.diagnostics);
    assert!(
        set.diagnostics[0]
            .message
            .contains("database `shared` is also declared by `second` at b.yaml:4")
    );
    let names: Vec<_> = set.declarations.iter().map(|d| d.name()).collect();
    assert_eq!(names, vec!["orders-db"]);
}
