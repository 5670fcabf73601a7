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

#[test]
fn override_set_works_every_time_beside_a_long_apply() {
    let repo = support::git::repo_with_declarations(500);
    let dir = tempfile::tempdir().unwrap();
    // 500 creates at 60 calls a second: an apply that journals for ~8 s.
    let config = TendConfig::new(dir.path(), &repo.url())
        .sandbox("rate_limit", "60")
        .write();
    let config = config.display().to_string();
    let mut apply = std::process::Command::new(env!("CARGO_BIN_EXE_tend"))
        .args(["--config", &config, "apply"])
        .env("TEND_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the apply has the state open and is writing.
    let db = dir.path().join("state/state.db");
    let started = std::time::Instant::now();
    while !db.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "apply never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut beside_apply = 0;
    for i in 0..40 {
        let name = format!("db-{:05}", i * 7);
        let run = TendCommand::new(&[
            "--config",
            &config,
            "override",
            "set",
            &name,
            "--pause",
            "--reason",
            &format!("incident {i}"),
        ])
        .expect_code(0);
        assert!(
            run.stdout.contains("set a local override"),
            "{}",
            run.stdout
        );
        if apply.try_wait().unwrap().is_none() {
            beside_apply += 1;
        }
    }
    // 2: done, with the paused declarations pending.
    let status = apply.wait().unwrap();
    assert!(matches!(status.code(), Some(0 | 2)), "{status:?}");
    assert!(
        beside_apply >= 30,
        "only {beside_apply} of 40 attempts ran beside the apply: make it longer"
    );
    let list = TendCommand::new(&["--config", &config, "override", "list"]).expect_code(0);
    assert_eq!(list.stdout.lines().count(), 40, "{}", list.stdout);
}

/// A repository with one declaration and a config for it in `dir`.
fn one_declaration(dir: &std::path::Path) -> (TestRepo, String) {
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 20));
    repo.commit("orders");
    let config = TendConfig::new(dir, &repo.url()).write();
    (repo, config.display().to_string())
}

#[test]
fn damaged_state_is_refused_never_started_afresh() {
    for (what, bytes) in [
        ("is empty", &b""[..]),
        ("is not a readable SQLite database", &b"not a database at all, but long enough to be read as a header by SQLite: 0123456789abcdef0123456789abcdef0123456789abcdef"[..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (_repo, config) = one_declaration(dir.path());
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::write(state.join("state.db"), bytes).unwrap();
        for command in [&["apply"][..], &["plan"], &["state", "show"], &["override", "set", "orders", "--pause", "--reason", "x"]] {
            let mut args = vec!["--config", config.as_str()];
            args.extend(command);
            let run = TendCommand::new(&args).expect_code(1);
            assert!(
                run.stderr.contains(what) && run.stderr.contains("docs/runbooks/state-recovery.md"),
                "{what}, {command:?}: {}",
                run.stderr
            );
        }
        assert_eq!(std::fs::read(state.join("state.db")).unwrap(), bytes, "{what}: the file was changed");
    }
}

#[test]
fn a_state_dir_that_is_a_file_is_an_error_not_no_state() {
    let dir = tempfile::tempdir().unwrap();
    let (_repo, config) = one_declaration(dir.path());
    std::fs::write(dir.path().join("state"), "I am a file").unwrap();
    for command in [
        &["state", "show"][..],
        &["state", "check"],
        &["override", "list"],
        &["plan"],
        &["apply"],
    ] {
        let mut args = vec!["--config", config.as_str()];
        args.extend(command);
        let run = TendCommand::new(&args).expect_code(1);
        assert!(
            run.stderr.contains("is not a directory"),
            "{command:?}: {}",
            run.stderr
        );
        assert!(
            !run.stdout.contains("no state yet"),
            "{command:?}: {}",
            run.stdout
        );
    }
}

#[test]
fn override_list_works_on_a_state_dir_it_may_only_read() {
    // Another user than the state's owner (root), who may only read.
    let dir = tempfile::tempdir().unwrap();
    let (_repo, config) = one_declaration(dir.path());
    TendCommand::new(&["--config", &config, "apply"]).expect_code(0);
    TendCommand::new(&[
        "--config", &config, "override", "set", "orders", "--pause", "--reason", "INC-7",
    ])
    .expect_code(0);
    let state = dir.path().join("state");
    let chmod = |mode: &str, path: &std::path::Path| {
        assert!(
            std::process::Command::new("chmod")
                .args([mode, &path.display().to_string()])
                .status()
                .unwrap()
                .success()
        );
    };
    chmod("755", dir.path());
    chmod("755", &state);
    chmod("644", &state.join("state.db"));
    chmod("644", &dir.path().join("tend.toml"));
    assert!(!state.join("state.db-shm").exists(), "no writer is running");
    let list = std::process::Command::new("runuser")
        .args([
            "-u",
            "postgres",
            "--",
            env!("CARGO_BIN_EXE_tend"),
            "--config",
            &config,
            "override",
            "list",
        ])
        .current_dir(dir.path())
        .env_remove("TEND_CONFIG")
        .output()
        .expect("runuser (util-linux) runs the command as the `postgres` OS user");
    let stdout = String::from_utf8_lossy(&list.stdout);
    let stderr = String::from_utf8_lossy(&list.stderr);
    assert_eq!(list.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("orders") && stdout.contains("INC-7"),
        "{stdout}{stderr}"
    );
    assert!(
        !state.join("state.db-shm").exists(),
        "the reader wrote into the state dir"
    );
}

#[test]
fn the_lock_never_follows_a_symlink_and_the_state_dir_must_be_private() {
    let dir = tempfile::tempdir().unwrap();
    let (_repo, config) = one_declaration(dir.path());
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let victim = dir.path().join("precious");
    std::fs::write(&victim, "do not truncate me").unwrap();
    std::os::unix::fs::symlink(&victim, state.join("lock")).unwrap();
    let run = TendCommand::new(&["--config", &config, "apply"]).expect_code(1);
    assert!(run.stderr.contains("symbolic link"), "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "do not truncate me"
    );
    std::fs::remove_file(state.join("lock")).unwrap();

    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    for command in [
        &["apply"][..],
        &["override", "set", "orders", "--pause", "--reason", "x"],
    ] {
        let mut args = vec!["--config", config.as_str()];
        args.extend(command);
        let run = TendCommand::new(&args).expect_code(1);
        assert!(
            run.stderr.contains("writable by every user") && run.stderr.contains("chmod o-w"),
            "{command:?}: {}",
            run.stderr
        );
    }
    assert!(!state.join("state.db").exists());
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    TendCommand::new(&["--config", &config, "apply"]).expect_code(0);
}
