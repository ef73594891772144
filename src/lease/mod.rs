//! Leases: who is processing a transaction *now*.
//!
//! # What must stay true
//!
//! - A lease is `<owner-uuid>:<token>` under `…:lock` with a TTL; the token
//!   comes from `INCR` on `…:fence`, so it strictly increases per transaction.
//!   The owner UUID is new for every acquisition.
//! - The holder believes it holds the lease only until a *locally computed*
//!   expiry: the monotonic instant the acquire (or last successful renew) was
//!   **sent**, plus the TTL. Redis starts its TTL later than that, so the local
//!   view always ends first.
//! - Losing the lease (renewal refused, Redis unreachable past the local
//!   expiry, or the maximum hold reached) is published on a `watch` channel;
//!   the processor selects on it and must not start new writes afterwards.
//! - The lease is only an optimisation for liveness and for answering
//!   `in_progress`. Safety comes from the database: every write is conditioned
//!   on the token (see `store`), so a holder that is wrong about its lease
//!   (stalled process, lost Redis writes) still cannot commit.

pub mod redis;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

use crate::metrics::Metrics;

pub use self::redis::RedisLease;

/// Result of an acquisition attempt.
pub enum Acquire {
    Acquired(LeaseGuard),
    /// Another owner holds it; its lock expires in `remaining` at the latest.
    Held {
        remaining: Duration,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("lease backend unreachable: {0}")]
    Unavailable(String),
    #[error("lease backend timed out after {0:?}")]
    Timeout(Duration),
    #[error("unexpected reply from the lease backend: {0}")]
    Protocol(String),
}

/// Why a held lease ended before release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// A renewal found another value under the lock (or none).
    NotOwner,
    /// No renewal got through before the local expiry.
    Unreachable,
    /// Held for `FENCEHOOK_LEASE_MAX_MS`; renewals stopped.
    MaxHold,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::NotOwner => "renewal refused: no longer the owner",
            LostReason::Unreachable => "lease backend unreachable until the lease expired",
            LostReason::MaxHold => "maximum hold time reached",
        })
    }
}

/// What the heartbeat publishes.
#[derive(Debug, Clone, Copy)]
pub struct LeaseState {
    /// Local (monotonic) expiry: send time of the last confirmed acquire/renew + TTL.
    pub expires_at: Instant,
    pub lost: Option<LostReason>,
}

/// Identifies a transaction's lease.
#[derive(Debug, Clone)]
pub struct LeaseKey {
    pub provider: String,
    pub transaction_id: String,
}

/// A held lease. The heartbeat task lives exactly as long as the guard:
/// dropping the guard stops renewals (and releases the lock in the background
/// if `release` was not called).
pub struct LeaseGuard {
    lease: RedisLease,
    key: LeaseKey,
    owner: Uuid,
    /// Current token; changes only on a fence resync. The heartbeat holds this
    /// lock while a renewal is in flight so a resync never races a renewal.
    token: Arc<Mutex<i64>>,
    token_now: i64,
    state: watch::Receiver<LeaseState>,
    heartbeat: JoinHandle<()>,
    acquired_at: Instant,
    released: bool,
    metrics: Metrics,
}

impl LeaseGuard {
    pub fn token(&self) -> i64 {
        self.token_now
    }

    pub fn owner(&self) -> Uuid {
        self.owner
    }

    /// True while no loss was reported *and* the local expiry has not passed
    /// (checked against the clock, so a starved heartbeat cannot make it lie).
    pub fn is_held(&self) -> bool {
        let st = *self.state.borrow();
        st.lost.is_none() && Instant::now() < st.expires_at
    }

    /// Resolves when the lease is lost (reported by the heartbeat, or the local
    /// expiry passes without a renewal).
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.state.clone();
        loop {
            let st = *rx.borrow_and_update();
            if let Some(reason) = st.lost {
                return reason;
            }
            if Instant::now() >= st.expires_at {
                return LostReason::Unreachable;
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // Heartbeat gone: only the clock can tell now.
                        tokio::time::sleep_until(st.expires_at).await;
                        return rx.borrow().lost.unwrap_or(LostReason::Unreachable);
                    }
                }
                _ = tokio::time::sleep_until(st.expires_at) => {}
            }
        }
    }

    /// Fence resync (SPEC §2): the database holds a fence `>= db_fence` for
    /// this transaction, at or above our token, so Redis lost its counter.
    /// Inside our lease, fast-forward the counter past `db_fence` and take the
    /// new token. `None` when the lock is no longer ours.
    pub async fn resync(&mut self, db_fence: i64) -> Result<Option<i64>, LeaseError> {
        let mut token = self.token.lock().await;
        let new = self
            .lease
            .resync(&self.key, self.owner, *token, db_fence)
            .await?;
        if let Some(t) = new {
            *token = t;
            self.token_now = t;
        }
        Ok(new)
    }

    /// Stops the heartbeat and deletes the lock if it is still ours.
    pub async fn release(mut self) {
        self.released = true;
        self.heartbeat.abort();
        let token = *self.token.lock().await;
        if let Err(e) = self.lease.release(&self.key, self.owner, token).await {
            tracing::warn!(provider = %self.key.provider, transaction_id = %self.key.transaction_id, token,
                error = %e, "lease release failed; the lock expires by its TTL");
        }
        self.finish();
    }

    /// Stops renewing and walks away without releasing, as a crashed holder
    /// would: the lock stays until its TTL runs out. For tests and drills.
    pub fn abandon(mut self) {
        self.released = true;
        self.heartbeat.abort();
        self.finish();
    }

    fn finish(&self) {
        self.metrics
            .lease_held_seconds()
            .record(self.acquired_at.elapsed().as_secs_f64());
        self.metrics.leases_held().decrement(1.0);
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.heartbeat.abort();
        self.finish();
        // Cancelled (client gone, shutdown timeout): release in the background.
        let lease = self.lease.clone();
        let key = self.key.clone();
        let owner = self.owner;
        let token = self.token_now;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = lease.release(&key, owner, token).await;
            });
        }
    }
}

/// Parameters of one heartbeat.
pub(crate) struct Heartbeat {
    pub lease: RedisLease,
    pub key: LeaseKey,
    pub owner: Uuid,
    pub token: Arc<Mutex<i64>>,
    pub state: watch::Sender<LeaseState>,
    pub ttl: Duration,
    pub max_hold: Duration,
    pub acquired_at: Instant,
    pub timeout: Duration,
    pub metrics: Metrics,
}

/// How soon a failed renewal is retried (bounded by the time left).
const RENEW_RETRY: Duration = Duration::from_millis(50);

impl Heartbeat {
    /// Renews every ttl/3 until aborted or the lease is lost.
    pub(crate) async fn run(self) {
        let interval = self.ttl / 3;
        let mut expires_at = self.state.borrow().expires_at;
        let mut next = self.acquired_at + interval;
        let deadline = self.acquired_at + self.max_hold;
        loop {
            tokio::time::sleep_until(next).await;
            let sent = Instant::now();
            if sent >= expires_at {
                return self.lose(LostReason::Unreachable);
            }
            if sent + self.ttl > deadline {
                // Do not extend past the maximum hold; the lease ends at its expiry.
                tokio::time::sleep_until(expires_at).await;
                return self.lose(LostReason::MaxHold);
            }
            let budget = self.timeout.min(expires_at - sent);
            let result = {
                let token = self.token.lock().await;
                tokio::time::timeout(budget, self.lease.renew(&self.key, self.owner, *token)).await
            };
            match result {
                Ok(Ok(true)) => {
                    self.metrics.renew_ok().increment(1);
                    let now = Instant::now();
                    self.metrics
                        .renew_margin()
                        .record(expires_at.saturating_duration_since(now).as_secs_f64());
                    expires_at = sent + self.ttl;
                    let _ = self.state.send(LeaseState {
                        expires_at,
                        lost: None,
                    });
                    next = sent + interval;
                }
                Ok(Ok(false)) => {
                    self.metrics.renew_not_owner().increment(1);
                    return self.lose(LostReason::NotOwner);
                }
                Ok(Err(e)) => {
                    self.metrics.renew_error().increment(1);
                    tracing::debug!(error = %e, transaction_id = %self.key.transaction_id, "renewal failed");
                    next = Instant::now() + RENEW_RETRY;
                }
                Err(_) => {
                    self.metrics.renew_error().increment(1);
                    next = Instant::now() + RENEW_RETRY.min(Duration::from_millis(10));
                }
            }
            if next > expires_at {
                next = expires_at;
            }
        }
    }

    fn lose(&self, reason: LostReason) {
        self.metrics.lease_lost().increment(1);
        let token = self.token.try_lock().map(|t| *t).unwrap_or_default();
        tracing::warn!(provider = %self.key.provider, transaction_id = %self.key.transaction_id, token,
            reason = %reason, "lease lost");
        let expires_at = self.state.borrow().expires_at;
        let _ = self.state.send(LeaseState {
            expires_at,
            lost: Some(reason),
        });
    }
}
