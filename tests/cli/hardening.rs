//! What an adversarial probe of the binary found: hostile commits, leaked
//! tokens, a break-glass that failed when needed. Each test reproduces
//! the finding against the real binary.

use crate::support;
use crate::support::tend;

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
        // Schemes are not case sensitive for libgit2, nor here.
        "HTTPS://ghp_tokenInUser@git.example/repo.git",
        "Http://user:hunter2pass@git.example/repo.git",
        // A token in the query string.
        "https://git.example/repo.git?private_token=hunter2pass",
        "HTTPS://git.example/repo.git?access_token=ghp_tokenInUser",
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
    std::fs::write(dir.path().join("huge"), vec![b'x'; 70_000]).unwrap();
    std::fs::write(dir.path().join("blank"), " \n").unwrap();
    for (file, expect) in [
        ("/dev/zero", "a character device, not a regular file"),
        ("huge", "more than"),
        ("empty", "is empty"),
        ("blank", "holds only blanks"),
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

    // Readable by every user: accepted, with a warning that says how to
    // fix it.
    use std::os::unix::fs::PermissionsExt;
    let world = dir.path().join("world");
    std::fs::write(&world, "hook-secret\n").unwrap();
    std::fs::set_permissions(&world, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .server("webhook_secret_file", "\"world\"")
        .write();
    let run = TendCommand::new(&["--config", &config.display().to_string(), "config", "check"])
        .expect_code(0);
    assert!(
        run.stderr.contains("readable by every user (mode 644)")
            && run
                .stderr
                .contains(&format!("chmod o-r {}", world.display())),
        "{}",
        run.stderr
    );
}

/// `tend apply` writes the parse cache of a new commit while its cycle
/// runs (whole, then the files changed since as a delta); the process
/// ends only once the file is whole, so the next process parses nothing
/// and no temporary file is left beside it.
#[test]
fn a_one_shot_apply_leaves_its_parse_cache_whole() {
    let repo = TestRepo::new();
    for i in 0..50 {
        repo.write(
            &format!("db-{i:02}.yaml"),
            &manifest(&format!("db-{i:02}"), 20),
        );
    }
    repo.commit("fifty");
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &repo.url()).write();
    let config = config.display().to_string();
    let apply = || {
        TendCommand::new(&["--config", &config, "apply"])
            .env("TEND_LOG", "debug")
            .expect_code(0)
    };
    let first = apply();
    assert!(
        first.stderr.contains("source: parse cache written in")
            && first.stderr.contains("beside the cycles"),
        "{}",
        first.stderr
    );
    repo.write("db-07.yaml", &manifest("db-07", 21));
    repo.commit("raise db-07");
    let changed = apply();
    // Only the changed file is parsed, and written: a delta over the
    // cache written whole. The tree is listed over the cache's: its one
    // tree read, one file found changed.
    assert!(
        changed.stderr.contains("1 files parsed, 49 from the cache")
            && changed
                .stderr
                .contains("50 files listed over the last tree's in")
            && changed
                .stderr
                .contains("1 trees read, 1 files new or changed")
            && changed
                .stderr
                .contains("parse cache delta of 1 files (0 removed) written in")
            && !changed.stderr.contains("source: parse cache written in"),
        "{}",
        changed.stderr
    );
    // The delta is cumulative over the same whole.
    repo.write("db-08.yaml", &manifest("db-08", 21));
    repo.remove("db-09.yaml");
    repo.commit("raise db-08, remove db-09");
    let again = apply();
    assert!(
        again.stderr.contains("1 files parsed, 48 from the cache")
            && again
                .stderr
                .contains("49 files listed over the last tree's in")
            && again
                .stderr
                .contains("1 trees read, 1 files new or changed")
            && again
                .stderr
                .contains("parse cache delta of 2 files (1 removed) written in"),
        "{}",
        again.stderr
    );
    let next = TendCommand::new(&["--config", &config, "plan"])
        .env("TEND_LOG", "debug")
        .expect_code(0);
    // The cache holds the applied commit's tree: nothing is parsed.
    assert!(
        next.stderr.contains("parse cache of 49 files loaded")
            && !next.stderr.contains("files parsed"),
        "{}",
        next.stderr
    );
    let source = dir.path().join("state/source");
    let left: Vec<String> = std::fs::read_dir(&source)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
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
    // (As a JSON number: a commit id may hold the digits 999.)
    assert!(!after.to_string().contains(":999"), "{after:#}");
    // The same decisions; when each was observed is each plan's own.
    let decided = |report: &serde_json::Value| {
        let mut resources = report["resources"].clone();
        for r in resources.as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("observedAt");
        }
        resources
    };
    assert_eq!(decided(&before), decided(&after));
}

#[test]
fn override_set_works_every_time_beside_a_long_apply() {
    let repo = support::git::repo_with_declarations(500);
    let dir = tempfile::tempdir().unwrap();
    // The first apply creates them; the declarations then change, so the
    // second apply updates all 500 at 20 calls a second: it journals for
    // 25 s, and 40 override sets (checking names against the accepted
    // commit, then writing) run beside it.
    let config = TendConfig::new(dir.path(), &repo.url())
        .sandbox("rate_limit", "10000")
        .sandbox("max_concurrency", "16")
        .write();
    let config = config.display().to_string();
    TendCommand::new(&["--config", &config, "apply"]).expect_code(0);
    for i in 0..500 {
        repo.write(
            &format!("databases/team-{:02}/db-{i:05}.yaml", i % 100),
            &manifest(&format!("db-{i:05}"), 1000 + i),
        );
    }
    repo.commit("every connection limit changes");
    TendConfig::new(dir.path(), &repo.url())
        .sandbox("rate_limit", "20")
        .write();
    let mut apply = std::process::Command::new(env!("CARGO_BIN_EXE_tend"))
        .args(["--config", &config, "apply"])
        .env("TEND_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the apply is sending updates (and journalling them).
    let calls = dir.path().join("state/sandbox/sandbox/calls.log");
    let created = std::fs::read_to_string(&calls).unwrap().lines().count();
    support::eventually(
        "the apply sending updates",
        Duration::from_secs(30),
        || support::holds(std::fs::read_to_string(&calls).unwrap().lines().count() > created),
        String::new,
    );
    for i in 0..40 {
        assert!(
            apply.try_wait().unwrap().is_none(),
            "the apply ended before attempt {i}: make it longer"
        );
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
    }
    assert!(
        apply.try_wait().unwrap().is_none(),
        "every attempt must run beside the apply: make it longer"
    );
    // The rest of the apply is not this test's concern (a killed apply is
    // another's): stop it, and the next one converges.
    apply.kill().unwrap();
    apply.wait().unwrap();
    TendConfig::new(dir.path(), &repo.url())
        .sandbox("rate_limit", "10000")
        .write();
    let after = TendCommand::new(&["--config", &config, "apply", "--format", "json"])
        .expect_code(2)
        .json();
    assert_eq!(after["summary"]["overridden"], 40, "{after:#}");
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
        // 78: restarting cannot help (systemd's RestartPreventExitStatus).
        for command in [&["apply"][..], &["plan"], &["state", "show"], &["override", "set", "orders", "--pause", "--reason", "x"]] {
            let mut args = vec!["--config", config.as_str()];
            args.extend(command);
            let run = TendCommand::new(&args).expect_code(78);
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
        let run = TendCommand::new(&args).expect_code(78);
        assert!(
            run.stderr.contains("writable by every user") && run.stderr.contains("chmod o-w"),
            "{command:?}: {}",
            run.stderr
        );
    }
    assert!(!state.join("state.db").exists());
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    TendCommand::new(&["--config", &config, "apply"]).expect_code(0);

    // Once the state exists, a command that writes it without the lock
    // (an override beside a one-shot apply, the operator commands) checks
    // the directory too, as the lock's holders do.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    for command in [
        &["override", "set", "orders", "--pause", "--reason", "x"][..],
        &["suspend", "--reason", "x"],
        &["apply"],
    ] {
        let mut args = vec!["--config", config.as_str()];
        args.extend(command);
        let run = TendCommand::new(&args).expect_code(78);
        assert!(
            run.stderr.contains("writable by every user"),
            "{command:?}: {}",
            run.stderr
        );
    }
}

#[test]
fn override_set_checks_the_name_and_reports_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let (_repo, config) = one_declaration(dir.path());
    tend(&config, &["apply"], 0);
    let long = "a".repeat(5000);
    for bad in ["../x", "", long.as_str(), "Orders", "orders\n"] {
        let run = tend(
            &config,
            &[
                "override", "set", bad, "--pause", "--reason", "x", "--force",
            ],
            1,
        );
        assert!(run.stderr.contains("DNS label"), "{bad:?}: {}", run.stderr);
    }
    let pause_until = |expires: &str| {
        tend(
            &config,
            &[
                "override",
                "set",
                "orders",
                "--pause",
                "--reason",
                "INC-8",
                "--expires",
                expires,
            ],
            0,
        )
    };
    // An expiry already past: set (a runbook rehearses with one), with a
    // warning that says what it means.
    let run = pause_until("2020-01-01T00:00:00Z");
    assert!(
        run.stdout.contains(
            "warning: --expires 2020-01-01T00:00:00Z is already past: the override is reported EXPIRED from the start and still honoured (on expiry: hold)"
        ),
        "{}",
        run.stdout
    );
    let run = pause_until("4h");
    assert!(!run.stdout.contains("warning"), "{}", run.stdout);
    tend(&config, &["override", "clear", "orders"], 0);
    // A typo in an emergency: refused, and says why.
    let run = tend(
        &config,
        &["override", "set", "odrers", "--pause", "--reason", "INC-9"],
        1,
    );
    assert!(
        run.stderr.contains("no declaration named `odrers`") && run.stderr.contains("--force"),
        "{}",
        run.stderr
    );
    assert!(
        tend(&config, &["override", "list"], 0)
            .stdout
            .contains("no local overrides")
    );
    // Forced: stored, and reported as orphaned wherever overrides show.
    let run = tend(
        &config,
        &[
            "override", "set", "odrers", "--pause", "--reason", "INC-9", "--force",
        ],
        0,
    );
    assert!(run.stdout.contains("orphaned"), "{}", run.stdout);
    let list = tend(&config, &["override", "list"], 0);
    assert!(
        list.stdout.contains("odrers") && list.stdout.contains("ORPHANED"),
        "{}",
        list.stdout
    );
    let plan = tend(&config, &["plan"], 0);
    assert!(
        plan.stdout.contains("orphaned override: `odrers`"),
        "{}",
        plan.stdout
    );
    let json = tend(&config, &["plan", "--format", "json"], 0).json();
    assert_eq!(json["orphanedOverrides"][0]["name"], "odrers", "{json:#}");
    assert_eq!(json["orphanedOverrides"][0]["reason"], "INC-9");
    // A declared name is not orphaned.
    tend(
        &config,
        &["override", "set", "orders", "--pause", "--reason", "INC-10"],
        0,
    );
    let list = tend(&config, &["override", "list"], 0);
    let orders = list
        .stdout
        .lines()
        .find(|l| l.starts_with("orders"))
        .unwrap();
    assert!(!orders.contains("ORPHANED"), "{}", list.stdout);
    let json = tend(&config, &["plan", "--format", "json"], 0).json();
    assert_eq!(json["orphanedOverrides"].as_array().map(Vec::len), Some(1));
}

#[test]
fn control_characters_in_reasons_are_escaped_on_terminals_and_kept_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let (_repo, config) = one_declaration(dir.path());
    tend(&config, &["apply"], 0);
    let reason = "INC-1\norders  InSync  None  forged\x1b[2J\x1b[31m\u{202e}";
    tend(
        &config,
        &["override", "set", "orders", "--pause", "--reason", reason],
        0,
    );
    for args in [
        &["override", "list"][..],
        &["plan"],
        &["explain", "orders"],
        &["plan", "--format", "markdown"],
    ] {
        let mut all = vec!["--config", config.as_str()];
        all.extend(args);
        let run = TendCommand::new(&all).expect_code(0);
        let out = format!("{}{}", run.stdout, run.stderr);
        assert!(
            !out.contains('\x1b') && !out.contains('\u{202e}'),
            "{args:?}: {out:?}"
        );
        assert!(
            !out.lines()
                .any(|l| l.contains("forged") && !l.contains("INC-1")),
            "{args:?}: a forged line:\n{out}"
        );
        // Markdown shows the escape's backslash as an entity.
        assert!(
            out.contains("INC-1\\norders") || out.contains("INC-1&#92;norders"),
            "{args:?}: {out}"
        );
    }
    let json = tend(&config, &["plan", "--format", "json"], 0).json();
    assert_eq!(json["resources"][0]["override"]["reason"], reason);
}

#[test]
fn the_reason_and_the_drift_list_agree_about_ignored_fields() {
    let repo = TestRepo::new();
    repo.write(
        "billing.yaml",
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: billing\n  annotations:\n    tend.dev/ignore-fields: connectionLimit\n    tend.dev/override-reason: \"finance tunes this\"\nspec:\n  connectionLimit: 50\n",
    );
    repo.commit("billing");
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .write()
        .display()
        .to_string();
    tend(&config, &["apply"], 0);
    tend(
        &config,
        &["sandbox", "edit", "billing", "--set", "connectionLimit=500"],
        0,
    );
    let plan = tend(&config, &["plan"], 0);
    let drift = plan
        .stdout
        .lines()
        .find(|l| l.contains("drift connectionLimit"))
        .unwrap_or_else(|| panic!("{}", plan.stdout));
    assert!(drift.contains("ignored by the override"), "{}", plan.stdout);
    let json = tend(&config, &["plan", "--format", "json"], 0).json();
    assert_eq!(
        json["resources"][0]["drift"][0]["ignored"], true,
        "{json:#}"
    );
    let explain = tend(&config, &["explain", "billing"], 0);
    assert!(
        explain.stdout.contains("ignored by the override"),
        "{}",
        explain.stdout
    );
    // Paused as well: the reason must not say "no drift" above a drift line.
    tend(
        &config,
        &["override", "set", "billing", "--pause", "--reason", "INC-3"],
        0,
    );
    let plan = tend(&config, &["plan"], 0);
    let line = plan
        .stdout
        .lines()
        .find(|l| l.starts_with("billing"))
        .unwrap();
    assert!(!line.contains("no drift"), "{}", plan.stdout);
    assert!(line.contains("connectionLimit differs"), "{}", plan.stdout);
}

/// Commits, on top of `repo`'s head, the head's tree plus `extra` (name
/// bytes, tree id) entries at the root: for trees the `git` CLI will not
/// build (names that are not UTF-8, 100,000 levels deep).
fn commit_entries(repo: &TestRepo, extra: &[(&[u8], git2::Oid, i32)], message: &str) {
    use std::os::unix::ffi::OsStrExt;
    let git = git2::Repository::open(repo.path()).unwrap();
    let head = git.head().unwrap().peel_to_commit().unwrap();
    let mut root = git.treebuilder(Some(&head.tree().unwrap())).unwrap();
    for (name, id, mode) in extra {
        root.insert(
            std::path::Path::new(std::ffi::OsStr::from_bytes(name)),
            *id,
            *mode,
        )
        .unwrap();
    }
    let tree = git.find_tree(root.write().unwrap()).unwrap();
    let sig = git2::Signature::now("Test Author", "author@example.test").unwrap();
    git.commit(Some("HEAD"), &sig, &sig, message, &tree, &[&head])
        .unwrap();
}

/// A tree of `levels` directories `d/d/…/d` above `file` (a declaration),
/// written straight to the object database (the tree builder is ten times
/// slower at 100,000 levels).
fn nested_tree(git: &git2::Repository, levels: usize, file: git2::Oid) -> git2::Oid {
    let odb = git.odb().unwrap();
    let entry = |mode: &str, name: &str, id: git2::Oid| {
        let mut bytes = format!("{mode} {name}\0").into_bytes();
        bytes.extend_from_slice(id.as_bytes());
        bytes
    };
    let mut tree = odb
        .write(git2::ObjectType::Tree, &entry("100644", "deep.yaml", file))
        .unwrap();
    for _ in 0..levels {
        tree = odb
            .write(git2::ObjectType::Tree, &entry("40000", "d", tree))
            .unwrap();
    }
    tree
}

#[test]
fn a_tree_nested_too_deep_is_an_error_for_that_subtree_only() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, config) = one_declaration(dir.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    let blob = git.blob(manifest("deep", 1).as_bytes()).unwrap();
    let tree = nested_tree(&git, 40, blob);
    commit_entries(&repo, &[(b"nest", tree, 0o040000)], "a deep tree");
    let plan = tend(&config, &["plan", "--format", "json"], 1).json();
    let errors = plan["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{plan:#}");
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .contains("nested more than 32 levels"),
        "{plan:#}"
    );
    assert_eq!(
        errors[0]["file"],
        format!("nest/{}", "d/".repeat(31) + "d"),
        "{plan:#}"
    );
    // Everything else is planned.
    assert_eq!(plan["resources"][0]["name"], "orders", "{plan:#}");
    assert_eq!(plan["summary"]["total"], 1, "{plan:#}");
}

#[test]
fn a_tree_nested_20000_deep_is_refused_before_anything_walks_it() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, config) = one_declaration(dir.path());
    tend(&config, &["apply"], 0);
    let git = git2::Repository::open(repo.path()).unwrap();
    let blob = git.blob(manifest("deep", 1).as_bytes()).unwrap();
    // 100,000 levels killed every cycle of the main thread (SIGABRT: stack
    // overflow while libgit2 copied it); 20,000 are past what a 2 MiB
    // worker thread survives, and a fifth of the time to build.
    let tree = nested_tree(&git, 20_000, blob);
    commit_entries(&repo, &[(b"nest", tree, 0o040000)], "a hostile tree");
    for _ in 0..2 {
        let run = tend(&config, &["apply"], 1);
        assert!(
            run.stderr.contains("more than 4096 levels deep"),
            "{}",
            run.stderr
        );
    }
    // The state is intact: the commit before it is still the accepted one.
    let status = tend(&config, &["state", "show"], 0);
    assert!(
        status.stdout.contains("resources managed: 1"),
        "{}",
        status.stdout
    );
}

#[test]
fn a_tree_of_a_billion_paths_through_shared_subtrees_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, config) = one_declaration(dir.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    let blob = git.blob(manifest("wide", 1).as_bytes()).unwrap();
    // Four objects: 1,000 names for one subtree, three levels deep.
    let mut tree = nested_tree(&git, 0, blob);
    for _ in 0..3 {
        let mut b = git.treebuilder(None).unwrap();
        for i in 0..1000 {
            b.insert(format!("e{i:03}"), tree, 0o040000).unwrap();
        }
        tree = b.write().unwrap();
    }
    commit_entries(&repo, &[(b"wide", tree, 0o040000)], "a billion paths");
    let run = tend(&config, &["plan"], 1);
    assert!(
        run.stderr.contains("more than 1000000 entries"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_file_name_that_is_not_utf8_is_an_error_in_plan_and_validate() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, config) = one_declaration(dir.path());
    let git = git2::Repository::open(repo.path()).unwrap();
    let blob = git.blob(manifest("latin", 1).as_bytes()).unwrap();
    commit_entries(
        &repo,
        &[(b"caf\xe9.yaml", blob, 0o100644)],
        "a latin-1 name",
    );
    let plan = tend(&config, &["plan", "--format", "json"], 1).json();
    assert_eq!(plan["errors"][0]["file"], "caf\\xe9.yaml", "{plan:#}");
    assert!(
        plan["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("not valid UTF-8")
    );
    // validate, on a checkout, says the same.
    use std::os::unix::ffi::OsStrExt;
    let checkout = tempfile::tempdir().unwrap();
    std::fs::write(checkout.path().join("orders.yaml"), manifest("orders", 1)).unwrap();
    std::fs::write(
        checkout
            .path()
            .join(std::ffi::OsStr::from_bytes(b"caf\xe9.yaml")),
        manifest("latin", 1),
    )
    .unwrap();
    let run =
        TendCommand::new(&["validate", &checkout.path().display().to_string()]).expect_code(1);
    assert!(
        run.stderr.contains("caf\\xe9.yaml") && run.stderr.contains("not valid UTF-8"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("1 declaration, 1 error"),
        "{}",
        run.stdout
    );
}

#[test]
fn validate_and_the_agent_both_skip_symlinks_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, config) = one_declaration(dir.path());
    std::fs::create_dir(repo.path().join("linked")).unwrap();
    std::fs::write(dir.path().join("outside.yaml"), manifest("outside", 1)).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", repo.path().join("passwd.yaml")).unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("outside.yaml"),
        repo.path().join("linked/outside.yaml"),
    )
    .unwrap();
    repo.commit("symlinks");
    let run = tend(&config, &["plan", "--format", "json"], 0);
    let plan = run.json();
    assert_eq!(plan["summary"]["total"], 1, "{plan:#}");
    assert!(
        run.stderr.contains("passwd.yaml: a symbolic link"),
        "{}",
        run.stderr
    );
    let validate = |path: &str| {
        let run = TendCommand::new(&["validate", "--format", "json", path]).expect_code(0);
        assert!(
            !run.stdout.contains("root:") && !run.stderr.contains("root:"),
            "{}\n{}",
            run.stdout,
            run.stderr
        );
        run.json()
    };
    let skipped = |report: &serde_json::Value, file: &str| {
        report["warnings"].as_array().is_some_and(|w| {
            w.iter()
                .any(|w| w.as_str().is_some_and(|w| w.contains(file)))
        })
    };
    let report = validate(&repo.path().display().to_string());
    assert_eq!(report["declarations"], 1, "{report:#}");
    assert_eq!(report["errors"], serde_json::json!([]), "{report:#}");
    assert!(
        skipped(&report, "passwd.yaml: a symbolic link")
            && skipped(&report, "outside.yaml: a symbolic link"),
        "{report:#}"
    );
    // Named on the command line, a linked file is skipped all the same.
    let report = validate(&repo.path().join("passwd.yaml").display().to_string());
    assert_eq!(report["declarations"], 0, "{report:#}");
    assert!(skipped(&report, "a symbolic link"), "{report:#}");
}

#[test]
fn one_database_declared_with_and_without_the_only_provider_is_a_clash() {
    let repo = TestRepo::new();
    repo.write("a.yaml", "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: a\nspec:\n  databaseName: shared\n");
    repo.write("b.yaml", "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: b\nspec:\n  provider: sandbox\n  databaseName: shared\n");
    repo.commit("two declarations of one database");
    let run = TendCommand::new(&["validate", &repo.path().display().to_string()]).expect_code(1);
    assert_eq!(
        run.stderr
            .matches("database `shared` is also declared by")
            .count(),
        2,
        "{}",
        run.stderr
    );
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .write()
        .display()
        .to_string();
    let plan = tend(&config, &["apply", "--format", "json"], 1).json();
    assert_eq!(plan["summary"]["total"], 0, "neither is applied: {plan:#}");
    assert_eq!(plan["errors"].as_array().map(Vec::len), Some(2), "{plan:#}");
    let sandbox = tend(&config, &["sandbox", "list"], 0);
    assert!(!sandbox.stdout.contains("shared"), "{}", sandbox.stdout);
}

#[test]
fn configuration_values_are_checked_where_they_are_written() {
    let repo = TestRepo::new();
    repo.write("databases/orders.yaml", &manifest("orders", 20));
    repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    let base = || TendConfig::new(dir.path(), &repo.url());
    for (config, expect) in [
        (
            base().source("branch", "\"*\""),
            "branch = \"*\" is not a branch name",
        ),
        (
            base().source("branch", "\"main..x\""),
            "is not a branch name",
        ),
        (base().source("path", "\"../etc\""), "leaves the repository"),
        (
            base().status("branch", "\"HEAD\""),
            "[status] branch = \"HEAD\" is not a branch name git accepts",
        ),
        (
            base().sandbox("max_concurrency", "0"),
            "max_concurrency = 0 is out of range",
        ),
        (
            base().sandbox("rate_limit", "0"),
            "rate_limit = 0 is out of range",
        ),
    ] {
        let path = config.write().display().to_string();
        let run = TendCommand::new(&["--config", &path, "plan"]).expect_code(78);
        assert!(run.stderr.contains(expect), "{expect}: {}", run.stderr);
    }
    // `./databases`, `/databases/` and `databases` are one directory.
    for path in ["\"./databases\"", "\"/databases/\"", "\"databases\""] {
        let config = base().source("path", path).write().display().to_string();
        let plan = tend(&config, &["plan", "--format", "json"], 0).json();
        assert_eq!(
            plan["resources"][0]["file"], "databases/orders.yaml",
            "{path}: {plan:#}"
        );
    }
}

#[test]
fn a_password_in_a_postgres_url_is_refused_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "postgres://tend:hunter2pass@127.0.0.1:1/postgres",
        "postgres://tend@127.0.0.1:1/postgres?password=hunter2pass",
        "host=127.0.0.1 user=tend password=hunter2pass",
    ] {
        let config = TendConfig::new(dir.path(), "file:///nonexistent")
            .section("providers.pg", "kind", "\"postgres\"")
            .section("providers.pg", "url", &format!("{url:?}"))
            .write();
        let run =
            TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(78);
        assert!(
            run.stderr.contains("password_file"),
            "{url}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains("hunter2pass"), "{url}: {}", run.stderr);
    }
}

/// The sandbox's fault injection is refused on any other provider: a test
/// facility never sits silently in a production configuration.
#[test]
fn sandbox_faults_on_a_postgres_provider_are_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tend.toml");
    std::fs::write(
        &config,
        "state_dir = \"state\"\n[source]\nurl = \"/nonexistent\"\n[providers.pg]\nkind = \"postgres\"\nurl = \"postgres://tend@127.0.0.1:1/postgres\"\n[providers.pg.faults]\nlose_responses = 1\n",
    )
    .unwrap();
    let run =
        TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(78);
    assert!(
        run.stderr.contains("unknown field `faults`"),
        "{}",
        run.stderr
    );
}

/// Every command that reads the configuration exits 78 (sysexits
/// EX_CONFIG) when it cannot: scripts and systemd tell a configuration
/// error from a failed cycle by it.
#[test]
fn every_command_that_reads_the_configuration_exits_78_without_one() {
    for command in [
        &["plan"][..],
        &["apply"],
        &["run"],
        &["status"],
        &["explain", "orders"],
        &["propose", "orders"],
        &["sandbox", "list"],
        &["override", "list"],
        &["state", "show"],
        &["deletions", "list"],
    ] {
        let mut args = vec!["--config", "/nonexistent/tend.toml"];
        args.extend_from_slice(command);
        let run = TendCommand::new(&args).expect_code(78);
        assert!(
            run.stderr.contains("/nonexistent/tend.toml"),
            "{command:?}: {}",
            run.stderr
        );
    }
}

/// Markup through what a declaration's author controls (a file name, an
/// override reason) into `plan --format markdown`, which CI posts as a
/// pull-request comment, and into `latest.md`: shown as text, never
/// rendered as HTML, a link, an image or a mention.
#[test]
fn markdown_output_carries_no_markup_from_file_names_or_reasons() {
    let repo = TestRepo::new();
    let reason = "INC-1 @platform-team <img src=https://evil.example/p.png> [click](https://evil.example) ![i](https://evil.example/i.png) </details> | x";
    repo.write(
        "orders.yaml",
        &format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: orders\n  annotations:\n    tend.dev/paused: \"true\"\n    tend.dev/override-reason: \"{reason}\"\nspec:\n  connectionLimit: 5\n"
        ),
    )
    .write("evil\n<!-- hide.yaml", "apiVersion: tend.dev/v1alpha1\nkind: Nope\n");
    repo.commit("hostile strings");
    let dir = tempfile::tempdir().unwrap();
    let config = TendConfig::new(dir.path(), &repo.url())
        .status("reports_dir", "\"reports\"")
        .write();
    let config = config.display().to_string();
    let plan = TendCommand::new(&["--config", &config, "plan", "--format", "markdown"]).run();
    TendCommand::new(&["--config", &config, "apply"]).run();
    let latest = std::fs::read_to_string(dir.path().join("reports/latest.md")).unwrap();
    for (what, markdown) in [
        ("plan --format markdown", &plan.stdout),
        ("latest.md", &latest),
    ] {
        assert!(
            markdown.contains("INC-1"),
            "{what} shows the reason:\n{markdown}"
        );
        for raw in [
            "<img",
            "<!--",
            "</details>",
            "](https://",
            "@platform-team",
            "| x",
        ] {
            assert!(
                !outside_code_spans(markdown, raw),
                "{what} carries `{raw}` as markup:\n{markdown}"
            );
        }
        assert!(
            markdown
                .lines()
                .all(|l| !l.starts_with("<!--") && !l.starts_with(" hide.yaml")),
            "{what}: a file name's newline split a line:\n{markdown}"
        );
    }
}

/// Whether `raw` occurs in `markdown` outside a code span (an even number
/// of backticks before it on its line): inside one, nothing renders.
fn outside_code_spans(markdown: &str, raw: &str) -> bool {
    markdown.lines().any(|line| {
        line.match_indices(raw)
            .any(|(i, _)| line[..i].matches('`').count() % 2 == 0)
    })
}

/// A local source path that does not exist is named as such, not as
/// libgit2's "unsupported URL protocol".
#[test]
fn a_missing_local_source_says_the_path_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "/nonexistent/declarations",
        "file:///nonexistent/declarations",
    ] {
        let config = TendConfig::new(dir.path(), url).write();
        let run =
            TendCommand::new(&["--config", &config.display().to_string(), "plan"]).expect_code(1);
        assert!(
            run.stderr
                .contains("the local repository /nonexistent/declarations does not exist")
                && !run.stderr.contains("unsupported URL protocol"),
            "{url}: {}",
            run.stderr
        );
    }
}

/// A truncated state database is named damaged, with the runbook, not
/// only "malformed".
#[test]
fn a_truncated_state_database_names_the_runbook() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, config) = one_declaration(dir.path());
    for i in 0..40 {
        repo.write(&format!("db{i}.yaml"), &manifest(&format!("db{i}"), i));
    }
    repo.commit("forty more");
    TendCommand::new(&["--config", &config, "apply"]).expect_code(0);
    let db = dir.path().join("state/state.db");
    let len = std::fs::metadata(&db).unwrap().len();
    assert!(len > 16384, "the state is large enough to cut: {len}");
    let file = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    file.set_len(len / 2).unwrap();
    drop(file);
    let run = TendCommand::new(&["--config", &config, "plan"]).run();
    assert!(
        run.stderr.contains("docs/runbooks/state-recovery.md"),
        "{}",
        run.stderr
    );
}

/// A local source owned by another user (root's checkout, read by the
/// unit's dynamic user) is fetched: tend only reads it, so libgit2's
/// "repository path is not owned by current user" must not stop it.
#[test]
fn a_local_source_owned_by_another_user_is_read() {
    use std::os::unix::fs::PermissionsExt;
    use support::users::{AGENT, require_root, state_dir_for};
    require_root();
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 20));
    repo.commit("orders");
    // Root's repository, readable by everyone (a tempdir is 0700).
    std::fs::set_permissions(repo.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    state_dir_for(AGENT, &dir.path().join("state"));
    let config = TendConfig::new(dir.path(), &repo.url()).write();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = TendCommand::new(&["--config", &config.display().to_string(), "apply"])
        .run_as(AGENT)
        .expect_code(0);
    assert!(
        !run.stderr.contains("not owned by current user"),
        "{}",
        run.stderr
    );
}
