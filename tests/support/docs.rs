//! The documentation's fenced command blocks (README.md, docs/,
//! docs/runbooks/), with the `<!-- doctest: … -->` directive before each:
//! what tests/cli/docs.rs runs and tests/service/systemd.rs runs under systemd.

use std::path::{Path, PathBuf};

use super::repo_root;

/// A fenced block with what precedes it.
#[derive(Debug)]
pub struct Block {
    pub file: String,
    pub line: usize,
    pub lang: String,
    pub body: Vec<String>,
    pub skip: Option<String>,
    pub setup: Option<String>,
}

pub fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "docs/runbooks"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

/// The console and sh blocks of `path`, with their directives.
pub fn blocks(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let file = path
        .strip_prefix(repo_root())
        .unwrap()
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(lang) = trimmed.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let lang = lang.trim().to_string();
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push(
                lines[i]
                    .get(indent..)
                    .unwrap_or(lines[i].trim_start())
                    .to_string(),
            );
            i += 1;
        }
        i += 1;
        if lang != "console" && lang != "sh" {
            continue;
        }
        // The directive: an HTML comment ending on the line before the
        // fence (blank lines between are allowed).
        let mut end = start;
        while end > 0 && lines[end - 1].trim().is_empty() {
            end -= 1;
        }
        let (mut skip, mut setup, mut without) = (None, None, None);
        if end > 0 && lines[end - 1].trim().ends_with("-->") {
            let mut open = end - 1;
            while !lines[open].contains("<!--") && open > 0 {
                open -= 1;
            }
            let comment = lines[open..end].join("\n");
            let inner = comment
                .trim()
                .trim_start_matches("<!--")
                .trim_end_matches("-->")
                .trim();
            if let Some(reason) = inner.strip_prefix("doctest: skip:") {
                skip = Some(reason.trim().to_string());
            } else if let Some(script) = inner.strip_prefix("doctest: setup") {
                setup = Some(script.trim().to_string());
            } else if let Some(rest) = inner.strip_prefix("doctest: without `") {
                let (line, reason) = rest.split_once('`').unwrap_or((rest, ""));
                assert!(
                    !reason.trim().is_empty(),
                    "{file}:{}: `doctest: without` must say why",
                    start + 1
                );
                without = Some(line.to_string());
            }
        }
        out.push(Block {
            file: file.clone(),
            line: start + 1,
            lang,
            body: body
                .into_iter()
                .filter(|l| without.as_deref() != Some(l.trim()))
                .collect(),
            skip,
            setup,
        });
    }
    out
}
