//! An older state is migrated by its writer only: `tend plan`,
//! `tend deletions list` and `tend state show` read a format-2 state
//! (tests/fixtures/state-format-2.sql, the layout tend 0.1 wrote) and leave
//! it byte for byte as they found it, at format 2.

use crate::support;

use std::path::Path;

use support::TendCommand;
use support::config::TendConfig;
use support::git::{TestRepo, manifest};

fn format_of(db: &Path) -> String {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.query_row("SELECT value FROM meta WHERE key = 'format'", [], |r| {
        r.get(0)
    })
    .unwrap()
}

/// Every file under `dir` with its bytes.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    out.sort();
    out
}

#[test]
fn readers_never_migrate_an_older_state() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::new();
    repo.write("orders.yaml", &manifest("orders", 10))
        .write("billing.yaml", &manifest("billing", 20));
    repo.commit("two databases");
    let config = TendConfig::new(dir.path(), &repo.url()).write();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let db = state.join("state.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(include_str!("../fixtures/state-format-2.sql"))
        .unwrap();
    assert_eq!(format_of(&db), "2");
    let before = contents(&state);

    let config = config.display().to_string();
    for (args, code) in [
        (&["plan"][..], 0),
        (&["deletions", "list"], 0),
        (&["state", "show"], 0),
    ] {
        let mut all = vec!["--config", config.as_str()];
        all.extend_from_slice(args);
        let run = TendCommand::new(&all)
            .current_dir(dir.path())
            .expect_code(code);
        if args == ["state", "show"] {
            assert!(
                run.stdout.contains("format 2") || run.stdout.contains("format: 2"),
                "state show reports the file's own format:\n{}",
                run.stdout
            );
        }
        assert_eq!(
            format_of(&db),
            "2",
            "`tend {}` migrated the state",
            args.join(" ")
        );
        assert!(
            contents(&state) == before,
            "`tend {}` changed the state's files (before: {:?}, after: {:?})",
            args.join(" "),
            before.iter().map(|(p, b)| (p, b.len())).collect::<Vec<_>>(),
            contents(&state)
                .iter()
                .map(|(p, b)| (p.clone(), b.len()))
                .collect::<Vec<_>>()
        );
    }
}
