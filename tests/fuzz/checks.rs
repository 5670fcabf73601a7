// What each fuzz target asserts, shared by the libFuzzer targets
// (fuzz_targets/) and the corpus replay in the test suite
// (tests/library/fuzz_corpus.rs), so the two cannot drift apart.

use std::path::Path;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// Declaration parsing and validation: never a panic; every diagnostic is
/// inside the file (YAML line breaks: `\n`, `\r\n` and a lone `\r`).
pub fn declaration(data: &[u8]) {
    let contents = tend::testing::model::parse_file(Path::new("fuzz.yaml"), data);
    let breaks = data
        .iter()
        .enumerate()
        .filter(|(i, b)| **b == b'\n' || (**b == b'\r' && data.get(i + 1) != Some(&b'\n')))
        .count();
    let lines = breaks + 1;
    for d in &contents.diagnostics {
        assert!(
            d.line >= 1 && d.line <= lines + 1,
            "{d:?} outside {lines} lines"
        );
    }
    let _ = tend::testing::model::DeclarationSet::from_files(vec![contents]);
}

/// The configuration file: an error or a configuration, never a panic.
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = tend::testing::config::Config::parse(text, Path::new("/etc/tend/tend.toml"));
    }
}

/// The parse cache reader: any content reads as a cache or as empty.
/// (The file is removed after each input: a fuzzing process ends with
/// `exit`, which runs no destructor, and left a directory in the temporary
/// directory at every run.)
pub fn parse_cache(data: &[u8]) {
    let dir = std::env::temp_dir().join(format!("tend-fuzz-cache-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join("parse-cache.jsonl");
    if std::fs::write(&file, data).is_ok() {
        let _ = tend::testing::source::parse_cache::load(&file, "databases");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Webhook verification: header lines `name: value` up to a blank line,
/// then the body. Never a panic, never accepted without the secret.
pub fn webhook(data: &[u8]) {
    let split = data
        .windows(2)
        .position(|w| w == b"\n\n")
        .unwrap_or(data.len());
    let (head, body) = data.split_at(split);
    let body = body.get(2..).unwrap_or(&[]);
    let mut headers = HeaderMap::new();
    for line in head.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name),
            HeaderValue::from_bytes(value.trim_ascii()),
        ) {
            headers.append(name, value);
        }
    }
    let secret = b"fuzz-secret";
    if tend::testing::server::webhook::verify(&headers, body, secret).is_ok() {
        let signed = tend::testing::server::webhook::sign(secret, body);
        let carried = headers.values().any(|v| {
            let text = String::from_utf8_lossy(v.as_bytes())
                .trim()
                .to_ascii_lowercase();
            text.strip_prefix("sha256=").unwrap_or(&text) == signed || v.as_bytes() == secret
        });
        assert!(carried, "accepted without the secret: {headers:?}");
    }
}
