//! Opening a SQLite database (tend's state, the sandbox) to read it
//! without leaving a trace in a directory another user owns.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

/// SQLite's page cache per connection, in KiB (SQLite's own default is
/// about 2,000), for tend's state and the sandbox provider's database.
///
/// Neither reads the same pages over and over: a cycle no longer reads
/// every resource's row (the memories are brought up to date from the rows
/// written since the last read), and the sandbox's listing scans a table
/// larger than any cache of this order, so each scan reads every page
/// again whatever the size. What a cache holds is what the last writes
/// touched: the cold start's creates filled each to its size, and it stayed
/// resident for the process's life. With 2 MiB each, `tend run` over
/// 10,000 sandbox declarations peaked 2.2-3.5 MiB higher than with 512 KiB
/// (interleaved runs; a third of its 64 MB budget's margin), with no-change
/// cycles as long and the cold start of 100,000 as long either way (with 8
/// MiB before that, the agent held 8-10 MB more). The operating system's
/// page cache still holds the files: a page not in this cache costs a
/// `pread`, not a disk read.
pub(crate) const PAGE_CACHE_KIB: i64 = 512;

/// `path` with `suffix` appended to its file name (`state.db-wal`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Whether a write-ahead log is beside the database `path`.
pub(crate) fn has_log(path: &Path) -> bool {
    with_suffix(path, "-wal").exists()
}

/// Opens `path` read-only, leaving its directory as it found it when
/// another user (root beside the agent) reads it. With no write-ahead log
/// beside the database (no writer has it open, none was killed with
/// changes in its log) the file alone is the database: another user reads
/// it immutable, so SQLite creates no `-shm` there. With a log, the shared
/// memory is needed to read it; one this process had to create is handed
/// to the database's owner ([`super::owner::give_to_owner_of`]: a `-shm`
/// left owned by root would stop the agent's user from opening its
/// database). The owner itself reads it as SQLite does, seeing what a
/// writer commits meanwhile.
///
/// # Caveats
/// An immutable reader does not see what a writer that starts after it
/// opened commits: it reads the state as it was when it started.
///
/// A connection that cannot set up the shared memory where it may not
/// write (a directory this user may only read, and so no writer of its
/// own running there) falls back to reading immutable.
pub(crate) fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY;
    if !has_log(path) && !owned_by_me(path) {
        return open_immutable(path);
    }
    let shm = with_suffix(path, "-shm");
    let had_shm = shm.exists();
    let conn = Connection::open_with_flags(path, flags)?;
    // The shared memory is only set up on the first read.
    let first_read = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    });
    if !had_shm && shm.exists() {
        super::owner::give_to_owner_of(&shm, path);
    }
    match first_read {
        Ok(_) => Ok(conn),
        Err(e) if is_readonly_error(&e) => {
            drop(conn);
            open_immutable(path)
        }
        Err(e) => Err(e),
    }
}

/// Whether this process runs as the owner of `path`.
fn owned_by_me(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    std::fs::metadata(path).is_ok_and(|m| m.uid() == me)
}

/// Opens `path` read-only and immutable (no WAL, no locks, no files).
pub(crate) fn open_immutable(path: &Path) -> rusqlite::Result<Connection> {
    Connection::open_with_flags(
        immutable_uri(path),
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
    )
}

/// SQLite could not set up what a read needs (the WAL's shared memory) in
/// a place it may not write.
fn is_readonly_error(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
    )
}

/// `file:` URI of `path` opened immutable (read-only, no WAL, no locks).
/// Characters that end a URI's path are escaped.
pub(crate) fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for c in path.display().to_string().chars() {
        match c {
            '%' => uri.push_str("%25"),
            '?' => uri.push_str("%3f"),
            '#' => uri.push_str("%23"),
            c => uri.push(c),
        }
    }
    uri.push_str("?immutable=1");
    uri
}
