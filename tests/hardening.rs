//! What an adversarial probe of the binary found: hostile commits, leaked
//! tokens, a break-glass that failed when needed. Each test reproduces
//! the finding against the real binary.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::TendCommand;
use support::config::TendConfig;
use support::git::{TestRepo, manifest};

/// An HTTP server that answers every request with `status` and
/// `headers`, and records the request heads it saw.
fn recording_server(status: &'static str, headers: String) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            log.lock().unwrap().push(head);
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    (port, seen)
}

fn plan_with_token(url: &str, scheme: &str) -> support::RunOutput {
    let dir = tempfile::tempdir().unwrap();
    const TOKEN: &str = "tok_SECRET_value_42";
    std::fs::write(dir.path().join("token"), TOKEN).unwrap();
    let config = TendConfig::new(dir.path(), url)
        .source("token_file", "\"token\"")
        .source("token_scheme", &format!("\"{scheme}\""))
        .write();
    let run = TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(1);
    assert!(!run.stderr.contains(TOKEN) && !run.stdout.contains(TOKEN));
    run
}

#[test]
fn a_token_is_never_sent_across_a_redirect() {
    for scheme in ["bearer", "basic"] {
        // The attacker's host asks for credentials, and records them.
        let (evil, seen) = recording_server(
            "401 Unauthorized",
            "WWW-Authenticate: Basic realm=\"x\"\r\n".into(),
        );
        let (redirector, _) = recording_server(
            "302 Found",
            // Another host name for the same loopback address (`127.1` is
            // 127.0.0.1): another origin, reachable if a redirect is followed.
            format!("Location: http://127.1:{evil}/repo.git/info/refs?service=git-upload-pack\r\n"),
        );
        let run = plan_with_token(&format!("http://127.0.0.1:{redirector}/repo.git"), scheme);
        assert!(run.stderr.contains("redirect"), "{scheme}: {}", run.stderr);
        std::thread::sleep(Duration::from_millis(100));
        for head in seen.lock().unwrap().iter() {
            assert!(
                !head.to_ascii_lowercase().contains("authorization"),
                "{scheme}: credentials reached the redirect's host:\n{head}"
            );
        }
    }
}

#[test]
fn a_refused_bearer_token_is_named_as_such() {
    let (server, seen) = recording_server(
        "401 Unauthorized",
        "WWW-Authenticate: Bearer realm=\"x\"\r\n".into(),
    );
    let run = plan_with_token(&format!("http://127.0.0.1:{server}/repo.git"), "bearer");
    assert!(
        run.stderr.contains("refused the bearer token"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("none are configured"),
        "{}",
        run.stderr
    );
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|h| h.contains("Authorization: Bearer"))
    );
}

#[test]
fn credentials_in_the_source_url_are_refused_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "https://user:hunter2pass@git.example/repo.git",
        "https://ghp_tokenInUser@git.example/repo.git",
        "ssh://git:hunter2pass@git.example/repo.git",
    ] {
        let config = TendConfig::new(dir.path(), url).write();
        let run =
            TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(78);
        assert!(run.stderr.contains("token_file"), "{}", run.stderr);
        assert!(
            !run.stderr.contains("hunter2pass") && !run.stderr.contains("ghp_tokenInUser"),
            "{}",
            run.stderr
        );
    }
    // An SSH user name is not a secret.
    let config = TendConfig::new(dir.path(), "ssh://git@127.0.0.1:1/repo.git").write();
    TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(1);
}

#[test]
fn token_files_are_bounded_and_must_exist_and_hold_something() {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 1));
    repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("empty"), "\n").unwrap();
    for (file, expect) in [
        ("/dev/zero", "more than"),
        ("empty", "is empty"),
        ("missing", "cannot open"),
    ] {
        let config = TendConfig::new(dir.path(), &repo.url())
            .source("token_file", &format!("\"{file}\""))
            .write();
        let run =
            TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(78);
        assert!(
            run.stderr.contains(expect) && run.stderr.contains("token_file"),
            "{file}: {}",
            run.stderr
        );
    }
}

#[test]
fn an_edited_parse_cache_never_changes_the_plan() {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 20));
    repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &repo.url()).write();
    let config = config.display().to_string();
    let plan = || {
        TendCommand::new(&["--config", &config, "plan", "--format", "json"])
            .expect_code(0)
            .json()
    };
    // `apply` writes the cache (a plan only reads it).
    TendCommand::new(&["--config", &config, "apply"]).expect_code(0);
    let before = plan();
    let cache = dir.path().join("state/source/parse-cache.jsonl");
    let text = std::fs::read_to_string(&cache).unwrap();
    // Same blob id, another value.
    let edited = text.replace("\"connectionLimit\":20", "\"connectionLimit\":999");
    assert_ne!(edited, text, "the cache holds the value: {text}");
    std::fs::write(&cache, edited).unwrap();
    let after = plan();
    assert!(!after.to_string().contains("999"), "{after:#}");
    assert_eq!(before["resources"], after["resources"]);
}
