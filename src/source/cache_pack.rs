//! Packing the Git cache in the state dir, as `git gc --auto` would: the
//! status branch writes each resource's status file as a loose object
//! (100,000 files after a first render at 100,000 resources, 4 KB of disk
//! each), and every fetch that brings something adds a pack. Left alone,
//! the cache grows by one file per change for the life of the host, and
//! every process start lists it (the state dir's trust check).
//!
//! When the loose objects are many ([`Limits::loose`], estimated the way
//! Git does, from one of the 256 fan-out directories), they are written
//! into new packs; when the packs are many ([`Limits::packs`]), every
//! object is written into at most 16 packs that replace them. A new pack
//! holds at most [`Limits::batch`] objects, which bounds the memory
//! libgit2 takes to write it.
//!
//! # Guarantees
//! * No object is dropped, reachable or not: a loose file is removed only
//!   once it was written into a new pack, an old pack only when every
//!   object the cache held went into the new ones; and only after those
//!   packs and their indexes are synced to disk. A failure anywhere before
//!   removes nothing.
//! * A pack killed half-way leaves the cache as it was, plus at most a
//!   temporary file (`pack_git2_*`, `tmp_object_git2_*`), which a later
//!   pack removes once it is an hour old (older than any write under way).
//! * Files written while a pack runs (a fetch's pack, a new status blob)
//!   are never removed by it: only what was listed before is.
//! * A reader that knew an object at a removed place (another thread, a
//!   `tend plan` borrowing the cache's objects as alternates) finds it
//!   again: libgit2 looks the object up once more among the packs present
//!   when it is not where it was.
//! * One pack at a time in a process, and only by the state dir's writer
//!   (the process holding its lock).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use git2::{Oid, Repository};

use super::SourceError;

/// When the cache is due for a pack.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Loose objects (estimated) above which they are packed: Git's
    /// `gc.auto`.
    pub loose: usize,
    /// Packs above which they are packed into one: Git's
    /// `gc.autoPackLimit`.
    pub packs: usize,
    /// Objects in one new pack: libgit2 holds a pack's objects in memory
    /// while it writes it (62 MB for 100,000 status files, 11 MB for
    /// 5,000).
    pub batch: usize,
}

/// Git's defaults.
pub(crate) const LIMITS: Limits = Limits {
    loose: 6_700,
    packs: 50,
    batch: 5_000,
};

/// [`LIMITS`], or (test builds) with the failpoint `git-pack-loose`'s
/// number of loose objects.
pub(crate) fn limits() -> Limits {
    use crate::process::failpoint::{GIT_PACK_LOOSE, fired};
    Limits {
        loose: fired(GIT_PACK_LOOSE)
            .and_then(|n| n.parse().ok())
            .unwrap_or(LIMITS.loose),
        ..LIMITS
    }
}

/// What a pack takes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// The loose objects.
    Loose,
    /// Every object: the packs are many.
    All,
}

/// What a pack did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Packed {
    /// Objects written into the new pack.
    pub objects: usize,
    /// Loose object files removed.
    pub loose_removed: usize,
    /// Old packs removed.
    pub packs_removed: usize,
}

/// How old a temporary file of libgit2's must be before a pack removes it.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// One pack at a time in this process (the source's poll and the status
/// writer both ask).
static PACKING: Mutex<()> = Mutex::new(());

/// Whether the cache at `repo_dir` is due for a pack: two directory
/// listings, cheap enough to ask after every fetch and status commit.
pub(crate) fn due(repo_dir: &Path, limits: &Limits) -> Option<Due> {
    let objects = repo_dir.join("objects");
    if packs(&objects.join("pack")).len() > limits.packs {
        return Some(Due::All);
    }
    // A limit finer than the estimate below can tell: counted.
    if limits.loose < 256 {
        let loose = list_loose(&objects).map_or(0, |l| l.len());
        return (loose > limits.loose).then_some(Due::Loose);
    }
    // As Git estimates it: object ids are spread evenly over the 256
    // fan-out directories, so one of them, times 256, is the whole.
    let sample = fs::read_dir(objects.join("17"))
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| loose_id("17", &e.file_name()).is_some())
                .count()
        })
        .unwrap_or(0);
    (sample * 256 > limits.loose).then_some(Due::Loose)
}

/// Packs the cache at `repo_dir` on a thread of its own when it is due
/// (the running agent: its cycles and status commits do not wait for it).
/// Logs what it did.
pub(crate) fn pack_beside(repo_dir: &Path) {
    let limits = limits();
    if due(repo_dir, &limits).is_none() {
        return;
    }
    let dir = repo_dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("git-pack".into())
        .spawn(move || pack_logged(&dir, &limits));
    if let Err(e) = spawned {
        tracing::warn!("source: cannot start packing the Git cache: {e}");
    }
}

/// How many packs one ask makes at most. Objects written while a pack
/// runs are not in it, and an ask made meanwhile (after a status commit)
/// finds the pack under way and returns: the pack that ran asks again
/// when it is done, or those objects would stay loose until the next
/// commit, however many they are.
const ROUNDS: usize = 3;

/// Packs the cache at `repo_dir` when it is due (a one-shot command, at
/// its end), again while it is still due after a pack (up to
/// [`ROUNDS`]). Logs what it did; a failure is a warning: the cache works
/// unpacked, and the next pack tries again.
pub(crate) fn pack_logged(repo_dir: &Path, limits: &Limits) {
    pack_rounds(repo_dir, limits, || {});
}

/// [`pack_logged`], calling `between` after each pack made.
fn pack_rounds(repo_dir: &Path, limits: &Limits, mut between: impl FnMut()) {
    for _ in 0..ROUNDS {
        let started = Instant::now();
        match pack_if_due(repo_dir, limits) {
            Ok(Some(packed)) => tracing::info!(
                "source: packed {} objects of the Git cache in {:?} ({} loose files and {} packs removed)",
                packed.objects,
                started.elapsed(),
                packed.loose_removed,
                packed.packs_removed
            ),
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(
                    "source: cannot pack the Git cache: {e}; it keeps working unpacked, and the next pack tries again"
                );
                return;
            }
        }
        between();
    }
}

/// Packs the cache when it is due and no other pack of this process is
/// under way; `None` when nothing was done.
pub(crate) fn pack_if_due(repo_dir: &Path, limits: &Limits) -> Result<Option<Packed>, SourceError> {
    let Ok(_packing) = PACKING.try_lock() else {
        return Ok(None);
    };
    match due(repo_dir, limits) {
        Some(due) => pack(repo_dir, due, limits).map(Some),
        None => Ok(None),
    }
}

/// Writes the loose objects (`Due::Loose`) or every object (`Due::All`)
/// into new packs, syncs them, then removes what they hold.
pub(crate) fn pack(repo_dir: &Path, due: Due, limits: &Limits) -> Result<Packed, SourceError> {
    let written = write_pack(repo_dir, due, limits)?;
    Ok(remove_packed(written))
}

/// What the new packs hold, and the files they made redundant (not yet
/// removed).
#[derive(Debug)]
pub(crate) struct Written {
    pub objects: usize,
    loose: Vec<PathBuf>,
    packs: Vec<PathBuf>,
}

/// Writes and syncs the new packs, of at most [`Limits::batch`] objects
/// each (a pack of every object: of at most 16 packs); removes nothing
/// (but stale temporary files).
pub(crate) fn write_pack(
    repo_dir: &Path,
    due: Due,
    limits: &Limits,
) -> Result<Written, SourceError> {
    let objects = repo_dir.join("objects");
    let pack_dir = objects.join("pack");
    let repository = |e: git2::Error| SourceError::Repository {
        path: repo_dir.display().to_string(),
        source: crate::cause::Cause::explained(
            format!("cannot pack its objects: {}", e.message()),
            e,
        ),
    };
    if let Ok(entries) = fs::read_dir(&pack_dir) {
        for entry in entries.flatten() {
            remove_if_stale(&entry, "pack_git2_");
        }
    }
    // Listed before the objects are read: whatever comes later is left.
    let old_packs = match due {
        Due::All => packs(&pack_dir),
        Due::Loose => Vec::new(),
    };
    let loose = list_loose(&objects)?;
    super::libgit2();
    let repo = Repository::open_bare(repo_dir).map_err(repository)?;
    narrow_the_delta_window(&repo).map_err(repository)?;
    let (ids, packed_loose) = match due {
        Due::Loose => {
            let ids = loose.iter().map(|(id, _)| *id).collect();
            (ids, loose)
        }
        Due::All => {
            // Every object, or nothing removed: an old pack goes only
            // when all it held is in the new ones.
            let mut ids = Vec::new();
            repo.odb()
                .map_err(repository)?
                .foreach(|id| {
                    ids.push(*id);
                    true
                })
                .map_err(repository)?;
            (ids, loose)
        }
    };
    // A pack of every object is made of at most 16 packs, so that it
    // brings their number well under the limit whatever the cache's size.
    let batch = match due {
        Due::Loose => limits.batch,
        Due::All => limits.batch.max(ids.len().div_ceil(16)),
    };
    let mut unreadable = HashSet::new();
    let mut new_packs = Vec::new();
    let mut objects_written = 0;
    for chunk in ids.chunks(batch) {
        if let Some((pack, count)) =
            write_one_pack(&repo, &pack_dir, chunk, due, &mut unreadable).map_err(repository)?
        {
            sync(&pack)?;
            sync(&pack.with_extension("idx"))?;
            new_packs.push(pack);
            objects_written += count;
        }
    }
    if !new_packs.is_empty() {
        sync(&pack_dir)?;
    }
    Ok(Written {
        objects: objects_written,
        loose: packed_loose
            .into_iter()
            .filter(|(id, _)| !unreadable.contains(id))
            .map(|(_, path)| path)
            .collect(),
        packs: old_packs
            .into_iter()
            .filter(|p| !new_packs.contains(p))
            .collect(),
    })
}

/// Writes `ids` into one new pack under `pack_dir`: its `.pack` file and
/// how many objects it holds (`None`: no object could be read). A loose
/// object libgit2 cannot read (`Due::Loose`) is left out and named in
/// `unreadable`, and stays as it is: the rest is packed all the same. In
/// a pack of every object, any unreadable object fails the pack.
fn write_one_pack(
    repo: &Repository,
    pack_dir: &Path,
    ids: &[Oid],
    due: Due,
    unreadable: &mut HashSet<Oid>,
) -> Result<Option<(PathBuf, usize)>, git2::Error> {
    let mut builder = repo.packbuilder()?;
    for id in ids {
        match (builder.insert_object(*id, None), due) {
            (Ok(()), _) => {}
            (Err(e), Due::Loose) => {
                tracing::warn!(
                    "source: the Git cache's object {id} cannot be read, left loose: {}",
                    e.message()
                );
                unreadable.insert(*id);
            }
            (Err(e), Due::All) => return Err(e),
        }
    }
    let count = builder.object_count();
    if count == 0 {
        return Ok(None);
    }
    builder.write(pack_dir, 0)?;
    let name = builder
        .name()?
        .ok_or_else(|| git2::Error::from_str("libgit2 wrote a pack without a name"))?;
    Ok(Some((pack_dir.join(format!("pack-{name}.pack")), count)))
}

/// libgit2 looks for each object's delta among the ten before it, which
/// doubles the CPU of a pack (8.2 s against 4.3 s for 100,000 loose
/// objects) and gains nothing here: the cache's loose objects are status
/// files with no name to sort them by, and a pack of them is as small
/// either way (21.8 MB). `pack.windowMemory` of one byte keeps the window
/// at one object. Written into the cache's own configuration once.
fn narrow_the_delta_window(repo: &Repository) -> Result<(), git2::Error> {
    let mut config = repo.config()?;
    if config.get_i64(WINDOW_MEMORY).ok() != Some(1) {
        config.set_i64(WINDOW_MEMORY, 1)?;
    }
    Ok(())
}

const WINDOW_MEMORY: &str = "pack.windowMemory";

/// Removes what a written (and synced) pack holds. A file that cannot be
/// removed is left: it is redundant, never wrong.
pub(crate) fn remove_packed(written: Written) -> Packed {
    let loose_removed = written
        .loose
        .iter()
        .filter(|path| fs::remove_file(path).is_ok())
        .count();
    let mut packs_removed = 0;
    for pack in &written.packs {
        // The index last: a pack without its index is never read, and one
        // whose index is gone is no longer listed.
        for ext in ["pack", "rev", "bitmap", "idx"] {
            let _ = fs::remove_file(pack.with_extension(ext));
        }
        packs_removed += 1;
    }
    Packed {
        objects: written.objects,
        loose_removed,
        packs_removed,
    }
}

/// The packs under `pack_dir` that a pack of every object may replace:
/// indexed, and not marked to be kept (`.keep`).
fn packs(pack_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(pack_dir) else {
        return Vec::new();
    };
    let mut packs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension() == Some(OsStr::new("pack"))
                && p.with_extension("idx").is_file()
                && !p.with_extension("keep").exists()
        })
        .collect();
    packs.sort();
    packs
}

/// Every loose object under `objects`, by id and file. Stale temporary
/// files of a killed write are removed on the way.
fn list_loose(objects: &Path) -> Result<Vec<(Oid, PathBuf)>, SourceError> {
    let io = |path: &Path, e: std::io::Error| SourceError::Io {
        path: path.display().to_string(),
        source: crate::cause::Cause::new(e),
    };
    let mut loose = Vec::new();
    for entry in fs::read_dir(objects).map_err(|e| io(objects, e))?.flatten() {
        let fan_out = entry.file_name();
        let Some(prefix) = fan_out
            .to_str()
            .filter(|n| n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            continue;
        };
        let dir = entry.path();
        let files = match fs::read_dir(&dir) {
            Ok(files) => files,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&dir, e)),
        };
        for file in files.flatten() {
            match loose_id(prefix, &file.file_name()) {
                Some(id) => loose.push((id, file.path())),
                None => remove_if_stale(&file, "tmp_object_git2_"),
            }
        }
    }
    Ok(loose)
}

/// The object id of a loose object file named `name` in fan-out directory
/// `prefix`.
fn loose_id(prefix: &str, name: &OsStr) -> Option<Oid> {
    let name = name.to_str()?;
    if name.len() != 38 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Oid::from_str(&format!("{prefix}{name}")).ok()
}

/// Removes `entry` when it is named `prefix…` and older than
/// [`STALE_TEMPORARY`]: a temporary file left by a write that was killed.
fn remove_if_stale(entry: &fs::DirEntry, prefix: &str) {
    let stale = entry
        .file_name()
        .to_str()
        .is_some_and(|n| n.starts_with(prefix))
        && entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_TEMPORARY);
    if stale && fs::remove_file(entry.path()).is_ok() {
        tracing::info!(
            "source: removed {}, left by a Git write that was killed",
            entry.path().display()
        );
    }
}

/// Syncs `path` (a file, or a directory's entries) to disk.
fn sync(path: &Path) -> Result<(), SourceError> {
    crate::files::sync_path(path).map_err(|e| SourceError::Io {
        path: path.display().to_string(),
        source: crate::cause::Cause::explained(format!("cannot sync the new pack to disk: {e}"), e),
    })
}

#[cfg(test)]
#[path = "cache_pack_tests.rs"]
mod tests;
