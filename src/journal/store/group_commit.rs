//! Group commit: write transactions that meet at the store's connection
//! share one commit.
//!
//! Every journal write is durable before the call it describes
//! (`synchronous = FULL`: an fsync of the log per commit). With dozens of
//! operations in flight those commits queued on the one connection, each
//! waiting out the fsync of the one before: at 100,000 creates the cold
//! start spent about half its time there (100.5 s against 48.2 s with the
//! fsync left out, measured). Now a write that finds others waiting for
//! the connection leaves its transaction open for them; the last of them
//! commits it once for all.
//!
//! # Guarantees
//! * A write returns only after the commit that holds it: what it wrote is
//!   durable when the caller goes on (an intent before its call).
//! * Each write runs in a savepoint of the shared transaction: one that
//!   fails (or panics) is undone alone, and the others commit.
//! * A commit that fails fails every write in it: none of them returns
//!   `Ok`, and nothing of them is in the state. Each is told the commit's
//!   own error (a damaged database stays "damaged"), and how many other
//!   writes it held.
//! * Nothing but a write ever runs on an open shared transaction: any
//!   other use of the connection (a read, a backup) commits it first, so
//!   nothing reads what is not committed.
//! * A write with nobody waiting commits at once, as a lone transaction
//!   always did; at most [`MAX_MEMBERS`] writes (failed ones counted)
//!   share a commit, so the first waits a bounded time. A write made
//!   `alone` (bulk writes beside the journal: the status branch's
//!   digests) commits what is open first and then itself, so no journal
//!   write waits behind it.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::Backend;
use super::sql::{SqlError, TxControl};
use crate::journal::StateError;

/// At most this many writes share one commit: the first of them waits
/// for the others' statements (each well under a millisecond). In
/// practice a commit holds at most as many writes as there are blocking
/// threads to wait in.
pub(super) const MAX_MEMBERS: usize = 64;

/// The savepoint each write after the first runs in.
const SAVEPOINT: &str = "tend_write";

/// What the store does when a shared transaction ends.
pub(super) trait Committer {
    /// It committed; `changed`: it held a change the memories are read
    /// from.
    fn committed(&self, changed: bool);
    /// The error a failure of the store's backend is.
    fn error(&self, e: SqlError) -> StateError;
}

/// The store's one connection, and the shared transaction open on it.
#[derive(Debug)]
pub(super) struct Connection {
    held: Mutex<Held>,
    /// Threads about to take the connection: a write leaves its
    /// transaction open only while one is coming.
    waiting: AtomicUsize,
    /// Commits of write transactions (shared or not), and the writes
    /// they held: for tests and the debug log.
    commits: AtomicU64,
    writes: AtomicU64,
}

/// What the connection's lock holds.
#[derive(Debug)]
pub(super) struct Held {
    backend: Backend,
    open: Option<OpenBatch>,
}

/// A write transaction that succeeded writes wait in for their commit.
#[derive(Debug)]
struct OpenBatch {
    /// Writes that succeeded in it.
    members: usize,
    /// Writes that joined it, failed ones included (the bound).
    joined: usize,
    /// Whether any member is a change the memories are read from.
    changed: bool,
    outcome: Arc<Outcome>,
}

/// The commit's result, for the writes waiting on it.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    result: Mutex<Option<Settled>>,
    settled: Condvar,
}

#[derive(Debug)]
struct Settled {
    /// The commit's error, if it failed.
    error: Option<Arc<StateError>>,
    /// The writes it held.
    members: usize,
}

impl Outcome {
    fn settle(&self, error: Option<StateError>, members: usize) {
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(Settled {
            error: error.map(Arc::new),
            members,
        });
        self.settled.notify_all();
    }

    /// Waits until the commit the write is in ran. A write alone in a
    /// failed commit gets the commit's error itself; one of several, the
    /// error shared.
    pub(super) fn wait(&self) -> Result<(), StateError> {
        let guard = self.result.lock().unwrap_or_else(|p| p.into_inner());
        let mut guard = self
            .settled
            .wait_while(guard, |r| r.is_none())
            .unwrap_or_else(|p| p.into_inner());
        let Some(settled) = guard.as_mut() else {
            return Ok(());
        };
        let others = settled.members.saturating_sub(1);
        match &settled.error {
            None => Ok(()),
            Some(error) if others > 0 => Err(StateError::SharedCommit {
                commit: error.clone(),
                others,
            }),
            // The only write waiting: the error is its own.
            Some(_) => match settled.error.take().map(Arc::try_unwrap) {
                Some(Ok(error)) => Err(error),
                Some(Err(commit)) => Err(StateError::SharedCommit { commit, others }),
                None => Ok(()),
            },
        }
    }
}

/// The connection, taken; dereferences to the backend.
pub(super) struct Taken<'a>(MutexGuard<'a, Held>);

impl Deref for Taken<'_> {
    type Target = Backend;
    fn deref(&self) -> &Backend {
        &self.0.backend
    }
}

impl DerefMut for Taken<'_> {
    fn deref_mut(&mut self) -> &mut Backend {
        &mut self.0.backend
    }
}

/// How a write's statements went, for [`Taken::end_write`].
pub(super) enum Ran {
    /// Its statements succeeded: it waits for the commit.
    Written { changed: bool },
    /// It failed or panicked: it is undone.
    Undone,
}

impl Connection {
    pub(super) fn new(backend: Backend) -> Self {
        Connection {
            held: Mutex::new(Held {
                backend,
                open: None,
            }),
            waiting: AtomicUsize::new(0),
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    /// Write transactions committed so far.
    pub(super) fn commits(&self) -> u64 {
        self.commits.load(Ordering::SeqCst)
    }

    /// Writes committed so far (each commit holds one or more).
    pub(super) fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Threads waiting to take the connection now.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Takes the connection as it is: a shared transaction may be open
    /// (a write joins it with [`Taken::join`]).
    pub(super) fn take(&self) -> Taken<'_> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let guard = self.held.lock().unwrap_or_else(|p| p.into_inner());
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        Taken(guard)
    }

    /// Takes the connection with nothing open on it: a shared transaction
    /// is committed first.
    pub(super) fn take_settled(&self, store: &dyn Committer) -> Taken<'_> {
        let mut taken = self.take();
        taken.settle(self, store);
        taken
    }
}

impl Taken<'_> {
    /// Whether a write may join the shared transaction open now.
    pub(super) fn can_join(&self) -> bool {
        self.0.open.as_ref().is_some_and(|b| b.joined < MAX_MEMBERS)
    }

    /// Whether the shared transaction open now holds a change.
    pub(super) fn open_changed(&self) -> bool {
        self.0.open.as_ref().is_some_and(|b| b.changed)
    }

    /// Starts a write inside the open shared transaction.
    pub(super) fn join(&mut self) -> Result<(), SqlError> {
        if let Some(batch) = self.0.open.as_mut() {
            batch.joined += 1;
        }
        self.0.backend.batch(&format!("SAVEPOINT {SAVEPOINT}"))
    }

    /// Commits the open shared transaction, if any, and tells its writes.
    pub(super) fn settle(&mut self, connection: &Connection, store: &dyn Committer) {
        let Some(batch) = self.0.open.take() else {
            return;
        };
        let error = match commit(&self.0.backend, connection) {
            Ok(()) => {
                connection
                    .writes
                    .fetch_add(batch.members as u64, Ordering::SeqCst);
                store.committed(batch.changed);
                None
            }
            Err(e) => Some(store.error(e)),
        };
        batch.outcome.settle(error, batch.members);
    }

    /// Ends a write: a joined one's savepoint is released or undone; a
    /// first one that failed is rolled back. A write that succeeded
    /// becomes a member of the shared transaction, which is committed
    /// now unless another write is coming (and it has room), and gets the
    /// commit to wait for. An undone joined write still commits the
    /// others when nobody else is coming. `Err`: the write's own
    /// savepoint could not be released (the whole transaction is lost).
    pub(super) fn end_write(
        mut self,
        connection: &Connection,
        joined: bool,
        ran: Ran,
        alone: bool,
        store: &dyn Committer,
    ) -> Result<Option<Arc<Outcome>>, SqlError> {
        let outcome = match ran {
            Ran::Written { changed } => {
                if joined && let Err(e) = self.0.backend.batch(&format!("RELEASE {SAVEPOINT}")) {
                    self.abandon(&e, store);
                    return Err(e);
                }
                let batch = self.0.open.get_or_insert_with(|| OpenBatch {
                    members: 0,
                    joined: 1,
                    changed: false,
                    outcome: Arc::new(Outcome::default()),
                });
                batch.members += 1;
                batch.changed |= changed;
                Some(batch.outcome.clone())
            }
            Ran::Undone if joined => {
                let undone = self
                    .0
                    .backend
                    .batch(&format!("ROLLBACK TO {SAVEPOINT}; RELEASE {SAVEPOINT}"));
                if let Err(e) = undone {
                    self.abandon(&e, store);
                }
                None
            }
            Ran::Undone => {
                let _ = self.0.backend.transaction(TxControl::Rollback);
                None
            }
        };
        if alone || !self.can_join() || connection.waiting() == 0 {
            self.settle(connection, store);
        }
        Ok(outcome)
    }

    /// Rolls the open shared transaction back after `e` broke it: each of
    /// its writes gets the failure.
    fn abandon(&mut self, e: &SqlError, store: &dyn Committer) {
        let _ = self.0.backend.transaction(TxControl::Rollback);
        if let Some(batch) = self.0.open.take() {
            let error = store.error(SqlError::Savepoint(e.to_string()));
            batch.outcome.settle(Some(error), batch.members);
        }
    }
}

fn commit(backend: &Backend, connection: &Connection) -> Result<(), SqlError> {
    if let Err(e) = backend.transaction(TxControl::Commit) {
        let _ = backend.transaction(TxControl::Rollback);
        return Err(e);
    }
    connection.commits.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Two writes made to meet: the first, inside its statements (the
    //! connection held), says so and waits until the second is at the
    //! connection, so the first leaves its transaction open for it.
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use super::super::StateStore;
    use crate::journal::StateError;

    fn store() -> (tempfile::TempDir, StateStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path(), true).unwrap().unwrap();
        store
            .write(|tx| tx.exec("CREATE TABLE t (v TEXT NOT NULL)", &[]))
            .unwrap();
        (dir, store)
    }

    fn insert(tx: &super::super::Tx<'_>, v: &str) -> Result<(), StateError> {
        tx.exec("INSERT INTO t (v) VALUES (?1)", &[v.into()])
    }

    fn values(store: &StateStore) -> Vec<String> {
        store
            .rows("SELECT v FROM t ORDER BY v", &[])
            .unwrap()
            .into_iter()
            .map(|r| match &r.0[0] {
                super::super::sql::SqlValue::Text(t) => t.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// Inside the first write: tells the second to go, then blocks until
    /// it waits for the connection.
    fn until_another_waits(store: &StateStore, inside: &AtomicBool) {
        inside.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.conn.waiting() == 0 {
            assert!(Instant::now() < deadline, "the second never came");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs `first` (which calls [`until_another_waits`] inside its write)
    /// and `second` (started once the first is inside) on two threads.
    fn meet<A: Send, B: Send>(
        store: &StateStore,
        first: impl FnOnce(&StateStore, &AtomicBool) -> A + Send,
        second: impl FnOnce(&StateStore) -> B + Send,
    ) -> (A, std::thread::Result<B>) {
        let inside = AtomicBool::new(false);
        std::thread::scope(|s| {
            let b = s.spawn(|| {
                let deadline = Instant::now() + Duration::from_secs(30);
                while !inside.load(Ordering::SeqCst) {
                    assert!(Instant::now() < deadline, "the first never began");
                    std::thread::sleep(Duration::from_millis(1));
                }
                second(store)
            });
            let a = first(store, &inside);
            (a, b.join())
        })
    }

    /// The first write: `v`, then waits for the second.
    fn first_writes(v: &str) -> impl FnOnce(&StateStore, &AtomicBool) -> Result<(), StateError> {
        move |s, inside| {
            s.write(|tx| {
                insert(tx, v)?;
                until_another_waits(s, inside);
                Ok(())
            })
        }
    }

    #[test]
    fn writes_that_meet_share_one_commit_and_each_returns_after_it() {
        let (_dir, store) = store();
        let before = store.conn.commits();
        let second_wrote = AtomicBool::new(false);
        let (a, b) = meet(
            &store,
            |s, inside| {
                let r = first_writes("a")(s, inside);
                // Returned only once the commit ran, after the second's
                // statements.
                (r, second_wrote.load(Ordering::SeqCst))
            },
            |s| {
                s.write(|tx| {
                    insert(tx, "b")?;
                    second_wrote.store(true, Ordering::SeqCst);
                    Ok(())
                })
            },
        );
        let (a, second_first) = a;
        a.unwrap();
        b.unwrap().unwrap();
        assert!(
            second_first,
            "the first write returned before the shared commit"
        );
        assert_eq!(
            store.conn.commits() - before,
            1,
            "one commit for two writes"
        );
        assert_eq!(values(&store), ["a", "b"]);
        // Alone, a write commits at once.
        store.write(|tx| insert(tx, "c")).unwrap();
        assert_eq!(store.conn.commits() - before, 2);
    }

    #[test]
    fn a_failed_write_is_undone_alone_and_the_others_commit() {
        let (_dir, store) = store();
        let (a, b) = meet(&store, first_writes("a"), |s| {
            s.write(|tx| {
                insert(tx, "b")?;
                tx.exec("INSERT INTO no_such_table (v) VALUES (1)", &[])
            })
        });
        a.unwrap();
        let err = b.unwrap().unwrap_err().to_string();
        assert!(err.contains("no_such_table"), "{err}");
        assert_eq!(values(&store), ["a"]);
    }

    #[test]
    fn a_write_that_panics_is_undone_alone_and_the_store_goes_on() {
        let (_dir, store) = store();
        let (a, b) = meet(&store, first_writes("a"), |s| {
            s.write(|tx| -> Result<(), StateError> {
                insert(tx, "b")?;
                panic!("a write that panics");
            })
        });
        a.unwrap();
        assert!(b.is_err(), "the panic reaches its own caller");
        store.write(|tx| insert(tx, "c")).unwrap();
        assert_eq!(values(&store), ["a", "c"]);
    }

    #[test]
    fn a_failed_commit_fails_every_write_in_it_with_its_own_error() {
        let (_dir, store) = store();
        // A deferred foreign key fails at COMMIT, not at the statement.
        store.execute_unchecked("PRAGMA foreign_keys = ON").unwrap();
        store
            .write(|tx| {
                tx.exec("CREATE TABLE parent (id INTEGER PRIMARY KEY)", &[])?;
                tx.exec(
                    "CREATE TABLE child (p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)",
                    &[],
                )
            })
            .unwrap();
        let orphan = |tx: &super::super::Tx<'_>| tx.exec("INSERT INTO child (p) VALUES (42)", &[]);
        let (a, b) = meet(&store, first_writes("a"), |s| {
            s.write(|tx| {
                insert(tx, "b")?;
                orphan(tx)
            })
        });
        for err in [a.unwrap_err(), b.unwrap().unwrap_err()] {
            assert!(
                matches!(&err, StateError::SharedCommit { commit, others: 1 }
                    if matches!(**commit, StateError::Database { .. })),
                "{err:?}"
            );
            assert!(err.to_string().contains("FOREIGN KEY"), "{err}");
        }
        assert!(
            values(&store).is_empty(),
            "nothing of a failed commit is kept"
        );
        // Alone, a write's failed commit is its own error, as before.
        let alone = store.write(orphan).unwrap_err();
        assert!(matches!(alone, StateError::Database { .. }), "{alone:?}");
        store.write(|tx| insert(tx, "c")).unwrap();
        assert_eq!(values(&store), ["c"]);
    }

    #[test]
    fn a_read_commits_the_open_write_first() {
        let (_dir, store) = store();
        let before = store.conn.commits();
        let (a, read) = meet(&store, first_writes("a"), |s| {
            let read = values(s);
            let committed = s.conn.commits() - before;
            if committed == 0 {
                // Broken: let the first write go, so the test fails
                // instead of hanging.
                s.write(|_| Ok(())).unwrap();
            }
            (read, committed)
        });
        a.unwrap();
        let (read, committed) = read.unwrap();
        assert_eq!(
            committed, 1,
            "the read committed the open write before it read"
        );
        assert_eq!(read, ["a"]);
    }

    #[test]
    fn a_write_beside_the_journal_never_waits_in_a_shared_commit() {
        let (_dir, store) = store();
        let before = store.conn.commits();
        let (a, b) = meet(&store, first_writes("a"), |s| {
            s.write_aside(|tx| insert(tx, "b"))
        });
        a.unwrap();
        b.unwrap().unwrap();
        assert_eq!(
            store.conn.commits() - before,
            2,
            "the first committed before the aside write began, which committed alone"
        );
    }
}
