//! The module graph: which top-level modules of `src/` name which others
//! (`crate::X` outside `#[cfg(test)]` code), and its cycles.
//!
//! The layers are acyclic (model and time at the bottom, the commands on
//! top): any cycle fails, printing every edge of it with a place that
//! makes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Edges between top-level modules, each with one place that makes it.
fn edges(root: &Path) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    let mut files = Vec::new();
    collect(&root.join("src"), &mut files);
    for file in files {
        let rel = file.strip_prefix(root.join("src")).unwrap();
        let from = match rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy())
        {
            Some(first) => first.trim_end_matches(".rs").to_string(),
            None => continue,
        };
        if from == "main" || from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            let code = line.split("//").next().unwrap_or("");
            for (at, _) in code.match_indices("crate::") {
                let to: String = code[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                    .collect();
                if to.is_empty() || to == from {
                    continue;
                }
                out.entry((from.clone(), to))
                    .or_insert_with(|| format!("{}:{}", rel.display(), n + 1));
            }
        }
    }
    out
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The strongly connected components with more than one module (Tarjan).
fn cycles(edges: &BTreeMap<(String, String), String>) -> Vec<BTreeSet<String>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().push(to);
        graph.entry(to).or_default();
    }
    struct Tarjan<'a> {
        graph: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for &w in &self.graph[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.insert(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.out.push(group);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

/// Every edge inside `group`, with its place.
fn shown(group: &BTreeSet<String>, edges: &BTreeMap<(String, String), String>) -> String {
    edges
        .iter()
        .filter(|((a, b), _)| group.contains(a) && group.contains(b))
        .map(|((a, b), at)| format!("  {a} -> {b}   ({at})\n"))
        .collect()
}

#[test]
fn the_module_graph_has_no_cycle() {
    let edges = edges(&support_root());
    let problems: String = cycles(&edges)
        .iter()
        .map(|group| {
            format!(
                "a cycle through {}:\n{}",
                group.iter().cloned().collect::<Vec<_>>().join(", "),
                shown(group, &edges)
            )
        })
        .collect();
    assert!(
        problems.is_empty(),
        "modules that name each other (move what one needs below both):\n{problems}"
    );
}

#[test]
fn the_check_finds_a_cycle_it_is_shown() {
    let edges: BTreeMap<(String, String), String> = [
        (("model", "time"), "m.rs:1"),
        (("engine", "model"), "e.rs:1"),
        (("model", "engine"), "m.rs:2"),
        (("cli", "engine"), "c.rs:1"),
    ]
    .into_iter()
    .map(|((a, b), at)| ((a.to_string(), b.to_string()), at.to_string()))
    .collect();
    let found = cycles(&edges);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].iter().cloned().collect::<Vec<_>>(),
        ["engine", "model"]
    );
    assert_eq!(
        shown(&found[0], &edges),
        "  engine -> model   (e.rs:1)\n  model -> engine   (m.rs:2)\n"
    );
}

fn support_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
