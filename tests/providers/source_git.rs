//! The Git source against real repositories and real transports.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use support::git::{GitDaemon, HttpGitServer, TestRepo, git, manifest};
use tend::testing::source::auth::{Credentials, TokenScheme};
use tend::testing::source::tracker::SourceSettings;
use tend::testing::source::{PollOutcome, Source, SourceError, Wakeups, follow};

fn settings(url: &str, branch: &str, path: &str) -> SourceSettings {
    SourceSettings {
        url: url.to_string(),
        branch: branch.to_string(),
        path: path.to_string(),
        depth: None,
        allow_rewind: false,
        credentials: Credentials::default(),
        trust: Default::default(),
    }
}

fn open(state: &Path, settings: SourceSettings) -> Source {
    Source::open(state, settings, tend::testing::journal::Access::Writer).unwrap()
}

fn names(outcome: &PollOutcome) -> Vec<String> {
    declarations(outcome)
        .iter()
        .map(|d| d.name().to_string())
        .collect()
}

fn error(outcome: &PollOutcome) -> &SourceError {
    &outcome
        .failure
        .as_ref()
        .expect("the poll should have failed")
        .error
}

fn repo_with(files: &[(&str, &str, u32)]) -> TestRepo {
    let repo = TestRepo::new();
    for (file, name, limit) in files {
        repo.write(file, &manifest(name, *limit));
    }
    repo.write("README.md", "not a declaration\n");
    repo.commit("initial");
    repo
}

/// The declarations of a poll, compared whole (manifest, file, position,
/// hash, annotations).
fn declarations(outcome: &PollOutcome) -> Vec<tend::testing::model::Declaration> {
    outcome
        .snapshot
        .as_ref()
        .unwrap()
        .declarations
        .declarations
        .iter()
        .map(|d| (**d).clone())
        .collect()
}

#[test]
fn a_new_process_reuses_the_parse_cache_in_the_state_dir() {
    let repo = repo_with(&[
        ("db/a.yaml", "a", 1),
        ("db/b.yaml", "b", 2),
        ("db/c.yaml", "c", 3),
    ]);
    repo.write("db/bad.yaml", "apiVersion: tend.dev/v1alpha1\nkind: Nope\n");
    // Two files declaring one name: neither is applied, from the cache too.
    repo.write("db/dup-1.yaml", &manifest("dup", 1));
    repo.write("db/dup-2.yaml", &manifest("dup", 2));
    repo.commit("a bad file and a duplicate");
    let state = tempfile::tempdir().unwrap();
    let cache = state.path().join("source/parse-cache.jsonl");
    let now = SystemTime::now();

    let mut first = open(state.path(), settings(&repo.url(), "main", "db"));
    let parsed = first.poll(now);
    assert_eq!(first.parse_count(), 6);
    assert_eq!(names(&parsed), ["a", "b", "c"]);
    drop(first);

    // A new `Source` stands for a new process: it reads the cache.
    let mut second = open(state.path(), settings(&repo.url(), "main", "db"));
    let cached = second.poll(now);
    assert_eq!(second.parse_count(), 0, "nothing parsed again");
    assert_eq!(declarations(&cached), declarations(&parsed));
    let diagnostics = |o: &PollOutcome| {
        o.snapshot
            .as_ref()
            .unwrap()
            .declarations
            .diagnostics
            .clone()
    };
    assert_eq!(diagnostics(&cached), diagnostics(&parsed));
    assert!(
        !diagnostics(&cached).is_empty(),
        "a bad file's problems are cached too"
    );
    drop(second);

    // One changed file: exactly that file is parsed in the next process.
    repo.write("db/b.yaml", &manifest("b", 20));
    repo.commit("raise b");
    let mut third = open(state.path(), settings(&repo.url(), "main", "db"));
    let changed = third.poll(now);
    assert_eq!(third.parse_count(), 1);
    let b = &declarations(&changed)[1];
    assert_eq!(b.manifest.spec.connection_limit, Some(20));
    drop(third);

    // A corrupt cache costs parsing, never a wrong snapshot; a read-only
    // source (`tend plan`) does not repair it, a writer does.
    std::fs::write(&cache, b"{\"format\": 1, \"files\": [").unwrap();
    let mut reader = Source::open(
        state.path(),
        settings(&repo.url(), "main", "db"),
        tend::testing::journal::Access::ReadOnly,
    )
    .unwrap();
    let reparsed = reader.poll(now);
    assert_eq!(reader.parse_count(), 6);
    assert_eq!(declarations(&reparsed), declarations(&changed));
    assert_eq!(
        std::fs::read(&cache).unwrap(),
        b"{\"format\": 1, \"files\": ["
    );
    let mut writer = open(state.path(), settings(&repo.url(), "main", "db"));
    writer.poll(now);
    assert_eq!(writer.parse_count(), 6);
    let mut after = open(state.path(), settings(&repo.url(), "main", "db"));
    assert_eq!(declarations(&after.poll(now)), declarations(&changed));
    assert_eq!(after.parse_count(), 0, "the writer rewrote the cache");
}

#[test]
fn first_clone_new_commit_unchanged_poll_one_changed_file_and_deletion() {
    let repo = repo_with(&[
        ("db/a.yaml", "a", 1),
        ("db/b.yaml", "b", 2),
        ("db/team/c.yml", "c", 3),
    ]);
    let state = tempfile::tempdir().unwrap();
    let mut source = open(state.path(), settings(&repo.url(), "main", "db"));

    let first = source.poll(SystemTime::now());
    assert!(first.changed && first.failure.is_none());
    let snap = first.snapshot.clone().unwrap();
    assert_eq!(snap.commit, repo.head());
    assert_eq!(names(&first), ["a", "b", "c"]);
    assert_eq!(snap.files.len(), 3, "README.md is not a declaration file");
    let c = snap
        .declarations
        .declarations
        .iter()
        .find(|d| d.name() == "c")
        .unwrap();
    assert_eq!(
        c.file,
        Path::new("db/team/c.yml"),
        "each declaration keeps its file"
    );
    assert_eq!(source.parse_count(), 3);

    // Unchanged: one fetch, one comparison, zero parses.
    let again = source.poll(SystemTime::now());
    assert!(!again.changed && again.failure.is_none());
    assert_eq!(source.parse_count(), 3);

    // A commit that changes one file re-parses exactly that file.
    repo.write("db/b.yaml", &manifest("b", 20));
    let second = repo.commit("raise b");
    let changed = source.poll(SystemTime::now());
    assert!(changed.changed);
    assert_eq!(changed.snapshot.as_ref().unwrap().commit, second);
    assert_eq!(source.parse_count(), 4);
    let b = &changed.snapshot.as_ref().unwrap().declarations.declarations[1];
    assert_eq!(b.manifest.spec.connection_limit, Some(20));

    // A commit that touches no declaration re-parses nothing.
    repo.write("README.md", "still not a declaration\n");
    repo.commit("docs");
    assert!(source.poll(SystemTime::now()).changed);
    assert_eq!(source.parse_count(), 4);

    // A deleted file removes its declaration (a successfully read commit).
    repo.remove("db/a.yaml");
    repo.commit("remove a");
    let removed = source.poll(SystemTime::now());
    assert_eq!(names(&removed), ["b", "c"]);
    assert_eq!(source.parse_count(), 4);
}

#[test]
fn a_missing_path_keeps_the_last_snapshot() {
    let repo = repo_with(&[("db/a.yaml", "a", 1)]);
    let state = tempfile::tempdir().unwrap();
    let mut source = open(state.path(), settings(&repo.url(), "main", "db"));
    let good = source
        .poll(SystemTime::now())
        .snapshot
        .unwrap()
        .commit
        .clone();

    repo.git(&["mv", "db", "databases"]);
    repo.commit("rename the directory");
    let t0 = SystemTime::now();
    let outcome = source.poll(t0);
    assert!(
        matches!(error(&outcome), SourceError::PathMissing { path, .. } if path == "db"),
        "{:?}",
        outcome.failure
    );
    assert_eq!(outcome.snapshot.as_ref().unwrap().commit, good);
    assert_eq!(names(&outcome), ["a"]);
    // The failure keeps its start time and counts consecutive polls.
    let later = source.poll(t0 + Duration::from_secs(30));
    assert_eq!(later.failure.as_ref().unwrap().since, t0);
    assert_eq!(later.failure.as_ref().unwrap().failures, 2);
}

#[test]
fn a_deleted_branch_keeps_the_last_snapshot() {
    let repo = repo_with(&[("a.yaml", "a", 1)]);
    repo.git(&["branch", "release"]);
    let state = tempfile::tempdir().unwrap();
    let mut source = open(state.path(), settings(&repo.url(), "release", "."));
    assert_eq!(names(&source.poll(SystemTime::now())), ["a"]);
    repo.git(&["branch", "-D", "release"]);
    let outcome = source.poll(SystemTime::now());
    assert!(
        matches!(error(&outcome), SourceError::BranchMissing { branch, .. } if branch == "release")
    );
    assert_eq!(names(&outcome), ["a"]);
    assert!(
        error(&outcome)
            .to_string()
            .contains("check [source] branch")
    );
}

#[test]
fn a_tree_where_every_file_fails_keeps_the_last_snapshot() {
    let repo = repo_with(&[("a.yaml", "a", 1), ("b.yaml", "b", 1)]);
    let state = tempfile::tempdir().unwrap();
    let mut source = open(state.path(), settings(&repo.url(), "main", "."));
    source.poll(SystemTime::now());
    repo.write("a.yaml", "kind: [broken\n")
        .write("b.yaml", "apiVersion: nope\n");
    repo.commit("break everything");
    let outcome = source.poll(SystemTime::now());
    assert!(matches!(
        error(&outcome),
        SourceError::AllFilesInvalid { files: 2, .. }
    ));
    assert_eq!(names(&outcome), ["a", "b"]);
    // One bad file among good ones is an error for that file only.
    repo.write("a.yaml", &manifest("a", 5));
    repo.commit("fix a");
    let outcome = source.poll(SystemTime::now());
    assert!(outcome.failure.is_none());
    assert_eq!(names(&outcome), ["a"]);
    let diagnostics = &outcome.snapshot.as_ref().unwrap().declarations.diagnostics;
    assert!(!diagnostics.is_empty());
    assert!(
        diagnostics.iter().all(|d| d.file == Path::new("b.yaml")),
        "{diagnostics:?}"
    );
}

#[test]
fn a_force_pushed_rewind_is_refused_then_accepted_with_allow_rewind() {
    let repo = repo_with(&[("a.yaml", "a", 1)]);
    repo.write("a.yaml", &manifest("a", 2));
    let second = repo.commit("two");
    let state = tempfile::tempdir().unwrap();
    let mut source = open(state.path(), settings(&repo.url(), "main", "."));
    assert_eq!(
        source.poll(SystemTime::now()).snapshot.unwrap().commit,
        second
    );

    repo.git(&["reset", "-q", "--hard", "HEAD~1"]);
    repo.write("a.yaml", &manifest("a", 3));
    let rewritten = repo.commit("rewritten");
    let outcome = source.poll(SystemTime::now());
    assert!(
        matches!(error(&outcome), SourceError::Rewind { old, new } if *old == second && *new == rewritten)
    );
    assert_eq!(outcome.snapshot.as_ref().unwrap().commit, second);

    // The refusal survives a restart: the accepted commit is in the state dir.
    let mut restarted = open(state.path(), settings(&repo.url(), "main", "."));
    assert!(matches!(
        error(&restarted.poll(SystemTime::now())),
        SourceError::Rewind { .. }
    ));

    let mut opted_out = settings(&repo.url(), "main", ".");
    opted_out.allow_rewind = true;
    let mut source = open(state.path(), opted_out);
    let outcome = source.poll(SystemTime::now());
    assert!(outcome.failure.is_none());
    assert_eq!(outcome.snapshot.unwrap().commit, rewritten);
    assert_eq!(
        source.accepted_commit().as_deref(),
        Some(rewritten.as_str())
    );
}

#[test]
fn git_daemon_transport_and_an_unreachable_remote() {
    let repo = repo_with(&[("a.yaml", "a", 1)]);
    let served = tempfile::tempdir().unwrap();
    repo.bare_clone(served.path());
    let daemon = GitDaemon::start(served.path());
    let state = tempfile::tempdir().unwrap();
    let mut source = open(state.path(), settings(&daemon.url("repo.git"), "main", "."));
    let first = source.poll(SystemTime::now());
    assert!(first.failure.is_none(), "{:?}", first.failure);
    assert_eq!(names(&first), ["a"]);

    drop(daemon);
    let outcome = source.poll(SystemTime::now());
    assert!(
        matches!(error(&outcome), SourceError::Fetch { .. }),
        "{:?}",
        outcome.failure
    );
    assert_eq!(names(&outcome), ["a"], "the last snapshot is kept");
}

#[test]
fn a_corrupted_pack_keeps_the_last_snapshot() {
    let repo = repo_with(&[("a.yaml", "a", 1)]);
    let served = tempfile::tempdir().unwrap();
    let bare = repo.bare_clone(served.path());
    let state = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bare.display());
    let mut source = open(state.path(), settings(&url, "main", "."));
    assert_eq!(names(&source.poll(SystemTime::now())), ["a"]);

    // New history at the server, then its objects are damaged.
    repo.write("b.yaml", &manifest("b", 1));
    repo.commit("add b");
    repo.git(&["push", "-q", &url, "main"]);
    git(&bare, &["repack", "-q", "-a", "-d"]);
    for entry in std::fs::read_dir(bare.join("objects/pack")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "pack") {
            let mut bytes = std::fs::read(&path).unwrap();
            let middle = bytes.len() / 2;
            for b in &mut bytes[middle..middle + 64] {
                *b ^= 0xff;
            }
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                .unwrap();
            std::fs::write(&path, bytes).unwrap();
        }
    }
    let outcome = source.poll(SystemTime::now());
    // A damaged pack is a failed fetch (the objects cannot be read), never
    // a snapshot of whatever could be read.
    let e = error(&outcome);
    assert!(matches!(e, SourceError::Fetch { .. }), "{e:?}");
    assert_eq!(names(&outcome), ["a"]);
}

#[test]
fn smart_http_with_and_without_a_token() {
    let repo = repo_with(&[("a.yaml", "a", 1)]);
    let served = tempfile::tempdir().unwrap();
    repo.bare_clone(served.path());

    let open_server = HttpGitServer::start(served.path(), None);
    let state = tempfile::tempdir().unwrap();
    let outcome = open(
        state.path(),
        settings(&open_server.url("repo.git"), "main", "."),
    )
    .poll(SystemTime::now());
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    assert_eq!(names(&outcome), ["a"]);

    let guarded = HttpGitServer::start(served.path(), Some("s3cret"));
    for scheme in [TokenScheme::Basic, TokenScheme::Bearer] {
        let state = tempfile::tempdir().unwrap();
        let mut s = settings(&guarded.url("repo.git"), "main", ".");
        s.credentials = Credentials {
            token: Some("s3cret".into()),
            token_scheme: scheme,
            token_username: "tend".into(),
            ..Credentials::default()
        };
        let outcome = open(state.path(), s).poll(SystemTime::now());
        assert!(
            outcome.failure.is_none(),
            "{scheme:?}: {:?}",
            outcome.failure
        );
        assert_eq!(names(&outcome), ["a"]);
    }

    let state = tempfile::tempdir().unwrap();
    let mut wrong = settings(&guarded.url("repo.git"), "main", ".");
    wrong.credentials = Credentials {
        token: Some("wrong".into()),
        token_username: "tend".into(),
        ..Credentials::default()
    };
    let outcome = open(state.path(), wrong).poll(SystemTime::now());
    let e = error(&outcome);
    assert!(matches!(e, SourceError::Auth { .. }), "{e:?}");
    assert!(e.to_string().contains("check token_file"), "{e}");
    // libgit2's own failure is kept as the cause, not only as text.
    let cause = std::error::Error::source(e).and_then(std::error::Error::source);
    assert!(
        cause.is_some_and(|c| c.is::<git2::Error>()),
        "the cause of {e:?}"
    );
    assert!(
        !e.to_string().contains("wrong"),
        "the token never appears in messages: {e}"
    );
}

#[test]
fn a_local_commit_is_noticed_through_the_filesystem_watch() {
    let repo = repo_with(&[("a.yaml", "a", 1)]);
    let state = tempfile::tempdir().unwrap();
    let source = open(
        state.path(),
        settings(&repo.path().display().to_string(), "main", "."),
    );
    // An hour between polls: only the watch can notice the commit in time.
    let wakeups = Wakeups::new(
        Duration::from_secs(3600),
        &repo.path().display().to_string(),
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (tx, mut rx) = tokio::sync::watch::channel(None);
        let stop = tokio_util::sync::CancellationToken::new();
        let follower = tokio::spawn(follow(source, wakeups, tx, stop.clone()));
        rx.changed().await.unwrap();
        let first = rx.borrow_and_update().clone().unwrap();
        assert_eq!(names(&first), ["a"]);

        repo.write("b.yaml", &manifest("b", 1));
        let head = repo.commit("add b");
        let started = Instant::now();
        let seen = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                rx.changed().await.unwrap();
                let outcome = rx.borrow_and_update().clone().unwrap();
                if outcome.snapshot.as_ref().is_some_and(|s| s.commit == head) {
                    return outcome;
                }
            }
        })
        .await
        .expect("the new commit was not noticed without the poll interval");
        assert_eq!(names(&seen), ["a", "b"]);
        println!("new local commit noticed after {:?}", started.elapsed());
        follower.abort();
    });
}

#[test]
fn a_long_running_writer_keeps_parse_results_on_disk_and_still_parses_only_changes() {
    let repo = repo_with(&[
        ("db/a.yaml", "a", 1),
        ("db/b.yaml", "b", 2),
        ("db/c.yaml", "c", 3),
    ]);
    let state = tempfile::tempdir().unwrap();
    let mut source = open(state.path(), settings(&repo.url(), "main", "db")).parses_on_disk();
    let now = SystemTime::now();
    let first = source.poll(now);
    assert_eq!(names(&first), ["a", "b", "c"]);
    assert_eq!(source.parse_count(), 3);
    repo.write("db/b.yaml", &manifest("b", 20));
    repo.remove("db/c.yaml");
    repo.commit("change b, remove c");
    let second = source.poll(now);
    assert!(second.changed);
    assert_eq!(
        source.parse_count(),
        4,
        "only the changed file is parsed again"
    );
    assert_eq!(names(&second), ["a", "b"]);
    let b = &declarations(&second)[1];
    assert_eq!(b.manifest.spec.connection_limit, Some(20));
    // A poll of the same head parses nothing and keeps the snapshot.
    let third = source.poll(now);
    assert!(!third.changed);
    assert_eq!(source.parse_count(), 4);
    assert_eq!(declarations(&third), declarations(&second));
}

/// Between two commits the running agent takes the parse results its
/// cache writer made from the last snapshot (or copies them from the
/// snapshot, when that thread is not done) instead of reading the disk
/// cache again: with that file gone, still only the changed file is
/// parsed, into exactly what a fresh parse gives. A snapshot with a diagnostic is not copied: a name
/// declared in two files is dropped from both, and the copy that stays
/// must come back when the other goes.
#[test]
fn a_long_running_writer_takes_parse_results_made_beside_its_cycles() {
    let repo = repo_with(&[("db/a.yaml", "a", 1), ("db/b.yaml", "b", 2)]);
    let state = tempfile::tempdir().unwrap();
    let mut source = open(state.path(), settings(&repo.url(), "main", "db")).parses_on_disk();
    let now = SystemTime::now();
    assert_eq!(names(&source.poll(now)), ["a", "b"]);
    assert_eq!(source.parse_count(), 2);
    // (Written on a thread of its own once the source is quiet for five
    // seconds: renamed into place when done.)
    let written = Instant::now();
    let cache = loop {
        let found = walk(state.path())
            .into_iter()
            .find(|p| p.ends_with("parse-cache.jsonl"));
        match found {
            Some(cache) if source.parse_results_made() => break cache,
            _ if written.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => panic!("no parse cache was written on disk, or no parse results made"),
        }
    };
    std::fs::remove_file(&cache).unwrap();

    repo.write("db/b.yaml", &manifest("b", 20));
    repo.commit("b: 20");
    let second = source.poll(now);
    assert_eq!(source.parse_count(), 3, "only the changed file is parsed");
    // (Counted: the writer's thread may already have made the next
    // results from this snapshot.)
    assert_eq!(
        source.parse_results_taken(),
        1,
        "the results made were not taken"
    );
    let fresh_state = tempfile::tempdir().unwrap();
    let fresh = open(fresh_state.path(), settings(&repo.url(), "main", "db")).poll(now);
    assert_eq!(declarations(&second), declarations(&fresh));

    repo.write("db/copy.yaml", &manifest("a", 1));
    repo.commit("a declared twice");
    assert_eq!(names(&source.poll(now)), ["b"]);
    repo.remove("db/copy.yaml");
    repo.commit("the copy removed");
    let fourth = source.poll(now);
    assert_eq!(names(&fourth), ["a", "b"], "the copy that stayed is back");
    // What the running writer left on disk (written beside, finished when
    // it goes) is a next process's whole parse.
    drop(source);
    let mut next = open(state.path(), settings(&repo.url(), "main", "db"));
    let reread = next.poll(now);
    assert_eq!(next.parse_count(), 0, "a file parsed again");
    assert_eq!(declarations(&reread), declarations(&fourth));
}

/// The running agent's parse cache waits for a quiet source: the parse
/// results for the next commit are made at once, the file is not written
/// within the quiet time, a newer commit's write supersedes the waiting
/// one, and the source going writes the newest at once (a next process
/// parses nothing and reads the newest commit's declarations).
#[test]
fn a_running_writers_parse_cache_waits_for_a_quiet_source() {
    let repo = repo_with(&[("db/a.yaml", "a", 1), ("db/b.yaml", "b", 2)]);
    // Two declarations in one file, in a subdirectory: the results made
    // from the snapshot give each file its own.
    let two = format!("{}---\n{}", manifest("d", 4), manifest("c", 3));
    repo.write("db/sub/two.yaml", &two);
    repo.commit("two in one file");
    let state = tempfile::tempdir().unwrap();
    let cache = state.path().join("source/parse-cache.jsonl");
    let mut source = open(state.path(), settings(&repo.url(), "main", "db")).parses_on_disk();
    let now = SystemTime::now();
    let polled = Instant::now();
    assert_eq!(names(&source.poll(now)), ["a", "b", "c", "d"]);
    while !source.parse_results_made() {
        assert!(
            polled.elapsed() < Duration::from_secs(10),
            "no parse results made"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // (Five seconds of quiet; this test's polls take milliseconds.)
    assert!(!cache.exists(), "the parse cache was written at once");
    repo.write("db/b.yaml", &manifest("b", 20));
    repo.commit("b: 20");
    let second = source.poll(now);
    assert_eq!(source.parse_count(), 4, "only the changed file is parsed");
    assert!(
        !cache.exists(),
        "the first commit's parse cache was written"
    );
    assert!(
        polled.elapsed() < Duration::from_secs(5),
        "the test was too slow to tell"
    );
    drop(source);
    assert!(
        cache.exists(),
        "the source went without writing its parse cache"
    );
    let mut next = open(state.path(), settings(&repo.url(), "main", "db"));
    let reread = next.poll(now);
    assert_eq!(next.parse_count(), 0, "a file parsed again");
    assert_eq!(declarations(&reread), declarations(&second));
    let fresh_state = tempfile::tempdir().unwrap();
    let fresh = open(fresh_state.path(), settings(&repo.url(), "main", "db")).poll(now);
    assert_eq!(declarations(&second), declarations(&fresh));
}

/// Every file below `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// A shallow first fetch (`depth = 1`) accepts the later commits that
/// descend from it: the shallow boundary is not a rewind. Over git:// and
/// smart HTTP, with three later commits; then a real rewind is still
/// refused.
#[test]
fn a_shallow_clone_accepts_later_commits_and_still_refuses_a_rewind() {
    let repo = repo_with(&[("a.yaml", "a", 1)]);
    repo.write("b.yaml", &manifest("b", 1));
    repo.commit("history before the shallow boundary");
    let served = tempfile::tempdir().unwrap();
    let bare = repo.bare_clone(served.path());
    let push = format!("file://{}", bare.display());
    let daemon = GitDaemon::start(served.path());
    let http = HttpGitServer::start(served.path(), None);
    let mut sources: Vec<(&str, tempfile::TempDir, Source)> = [
        ("git://", daemon.url("repo.git")),
        ("http://", http.url("repo.git")),
    ]
    .into_iter()
    .map(|(name, url)| {
        let state = tempfile::tempdir().unwrap();
        let mut s = settings(&url, "main", ".");
        s.depth = Some(1);
        let source = open(state.path(), s);
        (name, state, source)
    })
    .collect();
    for (name, state, source) in &mut sources {
        let first = source.poll(SystemTime::now());
        assert!(first.failure.is_none(), "{name}: {:?}", first.failure);
        let shallow = state.path().join("source/repo.git/shallow");
        assert!(shallow.exists(), "{name}: the first fetch is shallow");
    }
    for i in 0..3 {
        let file = format!("later-{i}.yaml");
        repo.write(&file, &manifest(&format!("later-{i}"), 1));
        let head = repo.commit(&format!("later commit {i}"));
        repo.git(&["push", "-q", &push, "main"]);
        for (name, _, source) in &mut sources {
            let outcome = source.poll(SystemTime::now());
            assert!(
                outcome.failure.is_none(),
                "{name}, commit {i}: {:?}",
                outcome.failure
            );
            assert_eq!(outcome.snapshot.as_ref().unwrap().commit, head, "{name}");
        }
    }
    // History rewritten behind the shallow clone: still a rewind.
    repo.git(&["reset", "-q", "--hard", "HEAD~2"]);
    repo.write("c.yaml", &manifest("c", 1));
    repo.commit("rewritten");
    repo.git(&["push", "-q", "-f", &push, "main"]);
    for (name, _, source) in &mut sources {
        let outcome = source.poll(SystemTime::now());
        assert!(
            matches!(error(&outcome), SourceError::Rewind { .. }),
            "{name}: {:?}",
            outcome.failure
        );
    }
}

/// A writer killed while libgit2 moved the tracking ref leaves
/// `<ref>.lock`; every later fetch failed on it. The next writer removes
/// it (it holds the state dir's lock); a reader's lock is left alone.
#[test]
fn a_ref_lock_left_by_a_killed_writer_does_not_stop_the_next_fetch() {
    let repo = repo_with(&[("orders.yaml", "orders", 10)]);
    let state = tempfile::tempdir().unwrap();
    let first = open(state.path(), settings(&repo.url(), "main", ".")).poll_once(SystemTime::now());
    assert!(first.failure.is_none(), "{:?}", first.failure);
    let git = state.path().join("source/repo.git");
    let stale = git.join("refs/tend/source/heads/main.lock");
    std::fs::write(&stale, "").unwrap();
    let reader = git.join("refs/tend/readers/1-2-3/heads/main.lock");
    std::fs::create_dir_all(reader.parent().unwrap()).unwrap();
    std::fs::write(&reader, "").unwrap();
    repo.write("billing.yaml", &manifest("billing", 5));
    repo.commit("billing");
    let next = open(state.path(), settings(&repo.url(), "main", ".")).poll_once(SystemTime::now());
    assert!(next.failure.is_none(), "{:?}", next.failure);
    assert_eq!(names(&next), vec!["billing", "orders"]);
    assert!(!stale.exists(), "the writer's stale lock is removed");
    assert!(reader.exists(), "a reader's lock is its own");
}

/// A writer killed while libgit2 created the bare repository leaves
/// `config.lock`; every later open then failed ("failed to lock file
/// config.lock", found by the apply crash loop) until someone deleted it.
#[test]
fn a_config_lock_left_by_a_writer_killed_while_creating_the_repository_is_removed() {
    let repo = repo_with(&[("orders.yaml", "orders", 10)]);
    let state = tempfile::tempdir().unwrap();
    let git = state.path().join("source/repo.git");
    std::fs::create_dir_all(&git).unwrap();
    std::fs::write(git.join("config.lock"), "").unwrap();
    let first = open(state.path(), settings(&repo.url(), "main", ".")).poll_once(SystemTime::now());
    assert!(first.failure.is_none(), "{:?}", first.failure);
    assert_eq!(names(&first), vec!["orders"]);
    assert!(!git.join("config.lock").exists());
}
