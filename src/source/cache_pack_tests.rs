use std::path::Path;
use std::time::{Duration, SystemTime};

use git2::{Oid, Repository};

use super::*;

type Outcome = Result<(), Box<dyn std::error::Error>>;

/// Held by each test: a pack takes the process's one `PACKING` lock, and
/// a test's ask made while another test's pack runs finds it under way
/// and does nothing.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// `count` status-like blobs written loose, from `from` on; their ids.
fn write_blobs(repo: &Repository, from: usize, count: usize) -> Result<Vec<Oid>, git2::Error> {
    (from..from + count)
        .map(|i| repo.blob(format!("name: db-{i:06}\nstate: InSync\nreason: in sync\n").as_bytes()))
        .collect()
}

/// The packs and loose objects of the repository at `dir`.
fn shape(dir: &Path) -> Result<(Vec<PathBuf>, usize), SourceError> {
    let objects = dir.join("objects");
    Ok((packs(&objects.join("pack")), list_loose(&objects)?.len()))
}

/// Every blob of `ids` reads back, from a repository opened now, with the
/// content it was written with.
fn all_readable(dir: &Path, ids: &[Oid]) -> Outcome {
    let repo = Repository::open_bare(dir)?;
    for (i, id) in ids.iter().enumerate() {
        let blob = repo.find_blob(*id)?;
        assert!(
            blob.content().starts_with(b"name: db-"),
            "blob {i} ({id}) reads back wrong"
        );
    }
    Ok(())
}

#[test]
fn loose_objects_past_the_limit_are_packed_in_batches_and_removed_and_every_one_reads_back()
-> Outcome {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir()?;
    let repo = Repository::init_bare(dir.path())?;
    // Enough blobs that two land in the fan-out directory the estimate
    // samples (objects/17): estimated at 512.
    let mut ids = Vec::new();
    while ids
        .iter()
        .filter(|id: &&Oid| id.to_string().starts_with("17"))
        .count()
        < 2
    {
        ids.extend(write_blobs(&repo, ids.len(), 1)?);
    }
    let written = ids.len();
    // Packs of at most 100 objects each.
    let limits = Limits {
        loose: 500,
        packs: 50,
        batch: 100,
    };
    // Below the limit: nothing done.
    let high = Limits {
        loose: 1_000_000,
        ..limits
    };
    assert_eq!(pack_if_due(dir.path(), &high)?, None);
    assert_eq!(shape(dir.path())?.1, written);

    assert_eq!(due(dir.path(), &limits), Some(Due::Loose));
    let packed = pack_if_due(dir.path(), &limits)?;
    assert_eq!(
        packed,
        Some(Packed {
            objects: written,
            loose_removed: written,
            packs_removed: 0
        })
    );
    let (packs, loose) = shape(dir.path())?;
    assert_eq!((packs.len(), loose), (written.div_ceil(100), 0));
    all_readable(dir.path(), &ids)?;
    assert_eq!(due(dir.path(), &limits), None, "packed: no longer due");
    Ok(())
}

#[test]
fn many_packs_become_one_holding_every_object_and_a_kept_pack_stays() -> Outcome {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir()?;
    let repo = Repository::init_bare(dir.path())?;
    let mut ids = Vec::new();
    for batch in 0..5 {
        ids.extend(write_blobs(&repo, batch * 40, 40)?);
        pack(dir.path(), Due::Loose, &LIMITS)?;
    }
    // One pack someone marked to keep, and objects still loose.
    ids.extend(write_blobs(&repo, 200, 10)?);
    pack(dir.path(), Due::Loose, &LIMITS)?;
    let (packs_before, _) = shape(dir.path())?;
    assert_eq!(packs_before.len(), 6);
    let kept = packs_before[0].clone();
    std::fs::write(kept.with_extension("keep"), "")?;
    ids.extend(write_blobs(&repo, 300, 7)?);
    assert_eq!(shape(dir.path())?, (packs_before[1..].to_vec(), 7));

    let limits = Limits {
        loose: 1_000_000,
        packs: 3,
        batch: 5_000,
    };
    assert_eq!(due(dir.path(), &limits), Some(Due::All));
    let packed = pack_if_due(dir.path(), &limits)?.ok_or("a pack")?;
    assert_eq!(packed.packs_removed, 5);
    assert_eq!(packed.loose_removed, 7);
    assert_eq!(packed.objects, 217, "every object, the kept pack's too");
    let (packs, loose) = shape(dir.path())?;
    assert_eq!(
        (packs.len(), loose),
        (1, 0),
        "one pack besides the kept one"
    );
    assert!(kept.exists(), "a kept pack is never removed");
    all_readable(dir.path(), &ids)?;
    Ok(())
}

/// The fault where it hurts: the process is killed after the pack is
/// written and before anything is removed. Nothing is lost, the next pack
/// finishes the work, and a reader that opened the repository before
/// reads every object after the loose files are gone.
#[test]
fn a_pack_killed_before_it_removes_anything_loses_nothing_and_the_next_one_finishes() -> Outcome {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir()?;
    let repo = Repository::init_bare(dir.path())?;
    let ids = write_blobs(&repo, 0, 300)?;
    let reader = Repository::open_bare(dir.path())?;
    assert!(reader.find_blob(ids[0]).is_ok());
    // A temporary file of a write killed long ago, and one under way.
    let pack_dir = dir.path().join("objects").join("pack");
    let stale = pack_dir.join("pack_git2_stale");
    let fresh = pack_dir.join("pack_git2_fresh");
    std::fs::write(&stale, "half a pack")?;
    std::fs::write(&fresh, "a pack being written")?;
    std::fs::File::options()
        .write(true)
        .open(&stale)?
        .set_modified(SystemTime::now() - Duration::from_secs(7200))?;

    let written = write_pack(dir.path(), Due::Loose, &LIMITS)?;
    assert_eq!(written.objects, 300);
    // Killed here: the pack is there, every loose file too.
    drop(written);
    assert_eq!(shape(dir.path())?.1, 300);
    all_readable(dir.path(), &ids)?;
    assert!(!stale.exists(), "an hour-old temporary file is removed");
    assert!(fresh.exists(), "a write under way is left alone");

    let packed = pack(dir.path(), Due::Loose, &LIMITS)?;
    assert_eq!(packed.loose_removed, 300);
    assert_eq!(shape(dir.path())?.1, 0);
    all_readable(dir.path(), &ids)?;
    // The reader opened before: its objects moved into the packs.
    for id in &ids {
        assert!(
            reader.find_blob(*id).is_ok(),
            "the earlier reader lost {id}"
        );
    }
    Ok(())
}

/// Objects written while a pack runs are packed by the round after it
/// when they are due by then (an ask made meanwhile found the pack under
/// way and returned); once nothing is due, no round runs.
#[test]
fn objects_written_during_a_pack_are_packed_by_the_round_after_it() -> Outcome {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir()?;
    let repo = Repository::init_bare(dir.path())?;
    let mut ids = write_blobs(&repo, 0, 60)?;
    // Counted exactly (a limit under 256).
    let limits = Limits {
        loose: 50,
        packs: 50,
        batch: 1000,
    };
    assert_eq!(due(dir.path(), &limits), Some(Due::Loose));
    let mut rounds = 0;
    let mut failed = None;
    pack_rounds(dir.path(), &limits, || {
        rounds += 1;
        // Written "during" the first pack: due again.
        if rounds == 1 {
            match write_blobs(&repo, 60, 60) {
                Ok(more) => ids.extend(more),
                Err(e) => failed = Some(e),
            }
        }
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    assert_eq!(ids.len(), 120);
    assert_eq!(rounds, 2, "a round after the last pack found nothing due");
    let (packs, loose) = shape(dir.path())?;
    assert_eq!((packs.len(), loose), (2, 0));
    all_readable(dir.path(), &ids)?;
    Ok(())
}
