//! Leading an agent group on a shared PostgreSQL state: the lease is
//! tried while standing by and renewed while leading.
//!
//! # Guarantees
//! * A standby acts on nothing: it starts no source follower and no
//!   worker until it holds the lease.
//! * A leader steps down at the first sign it may not hold the lease any
//!   more: a renewal refused (a successor took over), a write refused by
//!   the fence, or no renewal confirmed for a whole `lease_ttl` (the
//!   database is unreachable, or this process was paused). Safety does not
//!   depend on how fast it notices: every state write is fenced.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::journal::{LeaseHolder, StateStore, blocking};

/// How an agent takes part in its group.
pub(super) struct Leadership {
    pub me: LeaseHolder,
    pub ttl: Duration,
    store: Arc<StateStore>,
}

impl Leadership {
    pub(super) fn new(store: Arc<StateStore>, agent_id: &str, ttl: Duration) -> Self {
        Leadership {
            me: LeaseHolder::this_process(agent_id),
            ttl,
            store,
        }
    }

    /// How often the lease is tried (standby) and renewed (leader).
    pub(super) fn period(&self) -> Duration {
        self.ttl / 3
    }

    /// Waits until this agent holds the lease; its fencing token.
    /// `on_standby` gets a line naming the current leader whenever it
    /// changes.
    pub(super) async fn acquire(&self, on_standby: &(dyn Fn(String) + Sync)) -> i64 {
        let mut said = String::new();
        loop {
            let (me, ttl) = (self.me.clone(), self.ttl);
            let tried = tokio::time::timeout(
                self.period(),
                blocking(&self.store, move |s| s.try_acquire_lease(&me, ttl)),
            )
            .await;
            let line = match tried {
                Ok(Ok(Some(token))) => return token,
                Ok(Ok(None)) => {
                    let agent_id = self.me.agent_id.clone();
                    match blocking(&self.store, move |s| s.lease(&agent_id)).await {
                        Ok(Some(lease)) => format!(
                            "standby: agent group {} is led by {} (token {})",
                            self.me.agent_id, lease.holder, lease.token
                        ),
                        Ok(None) => format!("standby: agent group {}", self.me.agent_id),
                        Err(e) => format!("standby: cannot read the lease: {e}"),
                    }
                }
                Ok(Err(e)) => format!("standby: cannot try the leader lease: {e}"),
                Err(_) => "standby: the state database did not answer in time".to_string(),
            };
            if line != said {
                tracing::info!("{line}");
                on_standby(line.clone());
                said = line;
            }
            tokio::time::sleep(self.period()).await;
        }
    }

    /// Keeps the lease held under `token` until it is lost; why.
    pub(super) async fn keep(&self, token: i64) -> String {
        let mut confirmed = Instant::now();
        let check = self.period().min(Duration::from_millis(250));
        let mut renew_at = Instant::now() + self.period();
        loop {
            tokio::time::sleep(check).await;
            if self.store.was_fenced() {
                return "a state write was refused: another agent holds the lease now".into();
            }
            if Instant::now() < renew_at {
                continue;
            }
            renew_at = Instant::now() + self.period();
            let (me, ttl) = (self.me.clone(), self.ttl);
            let renewed = tokio::time::timeout(
                self.period(),
                blocking(&self.store, move |s| s.renew_lease(&me, token, ttl)),
            )
            .await;
            match renewed {
                Ok(Ok(true)) => confirmed = Instant::now(),
                Ok(Ok(false)) => return "the lease was taken over by another agent".into(),
                Ok(Err(e)) => tracing::warn!("leader lease: cannot renew: {e}"),
                Err(_) => tracing::warn!("leader lease: the renewal did not finish in time"),
            }
            if confirmed.elapsed() >= self.ttl {
                return format!(
                    "no renewal of the lease was confirmed for {}",
                    crate::time::duration(self.ttl)
                );
            }
        }
    }

    /// Gives the lease up at a clean stop.
    pub(super) async fn release(&self, token: i64) {
        let me = self.me.clone();
        if let Err(e) = blocking(&self.store, move |s| s.release_lease(&me, token)).await {
            tracing::warn!(
                "leader lease: cannot release it (a standby takes over when it expires): {e}"
            );
        }
    }
}
