//! The leader lease of an agent group sharing a PostgreSQL state: one row
//! per `agent_id` with the holder, its expiry and a fencing token.
//!
//! # Guarantees
//! * At most one holder at a time: a lease is taken only when it is free
//!   or expired by the database's clock (hosts' clocks play no part), and
//!   every takeover raises the token.
//! * A store given a [`Fence`] checks the token in every write
//!   transaction, under a row lock a takeover must wait for: a write
//!   either commits before the takeover or is refused after it
//!   ([`StateError::Fenced`]). A leader that was paused, cut off or slow
//!   journals and confirms nothing once a successor holds the lease.

use std::time::{Duration, SystemTime};

use super::sql::{SqlError, args};
use super::write::Tx;
use super::{BackendKind, StateStore, time};
use crate::journal::StateError;

/// The database's clock, in milliseconds since the epoch.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// One agent process of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    pub agent_id: String,
    /// Unique per process: a restarted agent is a new holder and waits for
    /// its predecessor's lease to expire like anyone else.
    pub holder: String,
    pub host: String,
    pub pid: u32,
}

impl LeaseHolder {
    /// This process, as a member of `agent_id`'s group.
    pub fn this_process(agent_id: &str) -> Self {
        let host = hostname();
        let pid = std::process::id();
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(pid);
        LeaseHolder {
            agent_id: agent_id.to_string(),
            holder: format!("{host}/{pid}/{:08x}", h.finish() as u32),
            host,
            pid,
        }
    }
}

/// The host's name (`/proc/sys/kernel/hostname`, else `HOSTNAME`).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into())
}

/// The token a leader's writes are checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub agent_id: String,
    pub token: i64,
}

/// A group's lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub agent_id: String,
    pub holder: String,
    pub host: String,
    pub pid: u32,
    pub token: i64,
    pub acquired: SystemTime,
    pub renewed: SystemTime,
    pub expires: SystemTime,
    /// The database's clock when this was read: the lease is live while
    /// `expires` is after it.
    pub read_at: SystemTime,
}

impl LeaseRow {
    pub fn is_live(&self) -> bool {
        self.expires > self.read_at
    }
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

impl StateStore {
    fn require_postgres(&self) -> Result<(), StateError> {
        match self.kind {
            BackendKind::Postgres => Ok(()),
            BackendKind::Sqlite => Err(StateError::Unsupported {
                path: self.location.clone(),
                problem: "a leader lease needs the postgres state backend ([state] backend = \"postgres\")",
            }),
        }
    }

    /// Takes the group's lease if it is free or expired; the new fencing
    /// token when taken, `None` when another holder's lease is live.
    pub fn try_acquire_lease(
        &self,
        me: &LeaseHolder,
        ttl: Duration,
    ) -> Result<Option<i64>, StateError> {
        self.require_postgres()?;
        let sql = format!(
            "INSERT INTO leases (agent_id, holder, host, pid, token, acquired_ms, renewed_ms, expires_ms)
             VALUES (?1, ?2, ?3, ?4, 1, {NOW_MS}, {NOW_MS}, {NOW_MS} + ?5)
             ON CONFLICT (agent_id) DO UPDATE SET holder = excluded.holder, host = excluded.host,
               pid = excluded.pid, token = leases.token + 1, acquired_ms = excluded.acquired_ms,
               renewed_ms = excluded.renewed_ms, expires_ms = excluded.expires_ms
             WHERE leases.expires_ms <= excluded.acquired_ms
             RETURNING token"
        );
        Ok(self
            .map_rows(
                &sql,
                args![
                    me.agent_id.as_str(),
                    me.holder.as_str(),
                    me.host.as_str(),
                    i64::from(me.pid),
                    ttl_ms(ttl)
                ],
                |r| r.get::<i64>(0),
            )?
            .first()
            .copied())
    }

    /// Extends the lease held under `token`; `false` when it is no longer
    /// this holder's (a successor took over).
    pub fn renew_lease(
        &self,
        me: &LeaseHolder,
        token: i64,
        ttl: Duration,
    ) -> Result<bool, StateError> {
        self.require_postgres()?;
        let sql = format!(
            "UPDATE leases SET renewed_ms = {NOW_MS}, expires_ms = {NOW_MS} + ?4
             WHERE agent_id = ?1 AND holder = ?2 AND token = ?3 RETURNING token"
        );
        Ok(!self
            .map_rows(
                &sql,
                args![me.agent_id.as_str(), me.holder.as_str(), token, ttl_ms(ttl)],
                |r| r.get::<i64>(0),
            )?
            .is_empty())
    }

    /// Gives the lease up (a clean stop): a standby takes over at its next
    /// try instead of waiting out the expiry.
    pub fn release_lease(&self, me: &LeaseHolder, token: i64) -> Result<(), StateError> {
        self.require_postgres()?;
        self.map_rows(
            "UPDATE leases SET expires_ms = 0 WHERE agent_id = ?1 AND holder = ?2 AND token = ?3 RETURNING token",
            args![me.agent_id.as_str(), me.holder.as_str(), token],
            |r| r.get::<i64>(0),
        )
        .map(|_| ())
    }

    /// The group's lease, if one was ever taken.
    pub fn lease(&self, agent_id: &str) -> Result<Option<LeaseRow>, StateError> {
        if self.kind != BackendKind::Postgres {
            return Ok(None);
        }
        let sql = format!(
            "SELECT agent_id, holder, host, pid, token, acquired_ms, renewed_ms, expires_ms, {NOW_MS}
             FROM leases WHERE agent_id = ?1"
        );
        Ok(self
            .map_rows(&sql, args![agent_id], |r| {
                Ok(LeaseRow {
                    agent_id: r.get(0)?,
                    holder: r.get(1)?,
                    host: r.get(2)?,
                    pid: r.get(3)?,
                    token: r.get(4)?,
                    acquired: time(r.get(5)?),
                    renewed: time(r.get(6)?),
                    expires: time(r.get(7)?),
                    read_at: time(r.get(8)?),
                })
            })?
            .into_iter()
            .next())
    }

    /// Checks every later write against `fence` (`None`: no lease, no
    /// check). Clears the "fenced" mark.
    pub fn set_fence(&self, fence: Option<Fence>) {
        *self.fence.lock().unwrap_or_else(|p| p.into_inner()) = fence;
        self.fenced
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a write was refused because the lease moved on.
    pub fn was_fenced(&self) -> bool {
        self.fenced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Inside a write transaction: refuses it unless this store's fence
    /// still holds the lease. `FOR SHARE` makes a takeover wait for this
    /// transaction (and this transaction see a takeover that committed).
    pub(super) fn check_fence(&self, tx: &Tx<'_>) -> Result<(), StateError> {
        let Some(fence) = self.fence.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            return Ok(());
        };
        let current = tx
            .query(
                "SELECT token, holder FROM leases WHERE agent_id = ?1 FOR SHARE",
                args![fence.agent_id.as_str()],
            )?
            .first()
            .map(|r| -> Result<(i64, String), SqlError> { Ok((r.get(0)?, r.get(1)?)) })
            .transpose()
            .map_err(|e| self.err(e))?;
        if current.as_ref().map(|(t, _)| *t) == Some(fence.token) {
            return Ok(());
        }
        self.fenced.store(true, std::sync::atomic::Ordering::SeqCst);
        Err(StateError::Fenced {
            location: self.location.clone(),
            agent_id: fence.agent_id,
            token: fence.token,
            now: match current {
                Some((token, holder)) => format!("token {token}, held by {holder}"),
                None => "gone".into(),
            },
        })
    }
}

/// The lease taken by a one-shot writer (`tend apply`) on a shared state:
/// renewed by a thread of its own while held, given up when dropped. Its
/// store's writes are fenced like a daemon leader's.
pub(crate) struct HeldLease {
    store: std::sync::Arc<StateStore>,
    me: LeaseHolder,
    token: i64,
    stop: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    renewer: Option<std::thread::JoinHandle<()>>,
}

impl HeldLease {
    /// Takes the group's lease or says who holds it.
    pub(crate) fn take(
        store: std::sync::Arc<StateStore>,
        agent_id: &str,
        ttl: Duration,
    ) -> Result<Self, StateError> {
        let me = LeaseHolder::this_process(agent_id);
        let Some(token) = store.try_acquire_lease(&me, ttl)? else {
            let lease = store.lease(agent_id)?;
            return Err(StateError::LeaseHeld {
                agent_id: agent_id.to_string(),
                leader: lease.map_or_else(
                    || "another agent".to_string(),
                    |l| format!("{} on host {} (token {})", l.holder, l.host, l.token),
                ),
            });
        };
        store.set_fence(Some(Fence {
            agent_id: agent_id.to_string(),
            token,
        }));
        let stop = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let renewer = {
            let (store, me, stop) = (store.clone(), me.clone(), stop.clone());
            std::thread::Builder::new()
                .name("tend-lease".into())
                .spawn(move || {
                    let (lock, wake) = &*stop;
                    let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                    while !*stopped {
                        stopped = wake
                            .wait_timeout(stopped, ttl / 3)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                        if *stopped {
                            break;
                        }
                        match store.renew_lease(&me, token, ttl) {
                            Ok(true) => {}
                            Ok(false) => {
                                tracing::error!("the leader lease was taken over: this apply's next write is refused");
                                break;
                            }
                            Err(e) => tracing::warn!("leader lease: cannot renew: {e}"),
                        }
                    }
                })
                .map_err(|source| StateError::LeaseThread { source })?
        };
        Ok(HeldLease {
            store,
            me,
            token,
            stop,
            renewer: Some(renewer),
        })
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.join();
        }
        if let Err(e) = self.store.release_lease(&self.me, self.token) {
            tracing::warn!("leader lease: cannot release it (it expires on its own): {e}");
        }
    }
}
