//! Leases: who is processing a transaction *now*.
//!
//! # What must stay true
//!
//! - A lease is an owner UUID and a token with a TTL, per (provider,
//!   transaction_id). The token comes from a per-transaction counter that
//!   only grows (Redis `INCR`, or the `leases.token` column), so it strictly
//!   increases; the owner UUID is new for every acquisition. Both backends
//!   ([`redis`], [`postgres`]) keep these semantics; this module is the facade
//!   over them, the guard, and the one timeout around each command.
//! - The holder believes it holds the lease only until a *locally computed*
//!   expiry: the monotonic instant the acquire (or last confirmed renewal)
//!   was **sent**, plus the TTL. The backend starts its TTL later than that,
//!   so the local view always ends first (see `heartbeat.rs`).
//! - Losing the lease (renewal refused, backend unreachable past the local
//!   expiry, or the maximum hold reached) is published on a `watch` channel;
//!   the processor selects on it and must not start new writes afterwards.
//! - The lease is only an optimisation for liveness and for answering
//!   `in_progress`. Safety comes from the database: every write is conditioned
//!   on the token (see `store`), so a holder that is wrong about its lease
//!   (stalled process, lost Redis writes) still cannot commit.

mod heartbeat;
pub mod postgres;
pub mod redis;
pub mod sentinel;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::{DbConfig, LeaseBackendKind, LeaseConfig};
use crate::db::PoolBuildError;
use crate::metrics::Metrics;

use self::heartbeat::Heartbeat;

pub use self::postgres::PgLease;
pub use self::redis::RedisLease;

/// What a backend's acquire answered, before a guard is built around it.
pub enum RawAcquire {
    Acquired { token: i64 },
    Held { remaining: Duration },
}

#[derive(Clone)]
enum Backend {
    Redis(RedisLease),
    Postgres(PgLease),
    /// `unique-only`: no lease store; see [`LeaseBackendKind::UniqueOnly`].
    UniqueOnly,
}

/// The lease store, whichever backend keeps it; cheap to clone.
#[derive(Clone)]
pub struct Lease {
    inner: Arc<LeaseInner>,
}

struct LeaseInner {
    backend: Backend,
    ttl: Duration,
    max_hold: Duration,
    timeout: Duration,
    metrics: Metrics,
}

impl Lease {
    /// Builds the configured backend. Connections are lazy: a store that is
    /// down at start makes deliveries answer 503 until it is back.
    pub fn new(cfg: &LeaseConfig, db: &DbConfig, metrics: Metrics) -> Result<Lease, LeaseError> {
        let backend = match cfg.backend {
            LeaseBackendKind::Redis => Backend::Redis(RedisLease::new(cfg)?),
            LeaseBackendKind::Postgres => Backend::Postgres(PgLease::new(cfg, db)?),
            LeaseBackendKind::UniqueOnly => Backend::UniqueOnly,
        };
        Ok(Lease {
            inner: Arc::new(LeaseInner {
                backend,
                ttl: cfg.ttl,
                max_hold: cfg.max_hold,
                timeout: cfg.lease_timeout,
                metrics,
            }),
        })
    }

    /// Bounds one backend call. This is the only timeout around a lease
    /// command: the backends set none of their own (the Redis client has no
    /// response timeout, the lease pool's wait is this same bound), so a
    /// caller with less time left (the heartbeat near expiry) can pass a
    /// shorter `budget` and be sure it is the one that applies.
    ///
    /// A combinator, not an `async fn`: one that awaits the future it was
    /// given keeps it twice in its state, and every future around a lease
    /// call grew by that much (copied whole at each await).
    fn bounded<T>(
        &self,
        budget: Duration,
        fut: impl std::future::Future<Output = Result<T, LeaseError>>,
    ) -> impl std::future::Future<Output = Result<T, LeaseError>> {
        tokio::time::timeout(budget, fut)
            .map(move |r| r.unwrap_or(Err(LeaseError::Timeout(budget))))
    }

    /// One atomic acquisition with a new owner UUID. On success a heartbeat
    /// starts with the guard; its local expiry counts from when this was sent.
    pub async fn acquire(&self, key: &LeaseKey) -> Result<Acquire, LeaseError> {
        let owner = Uuid::new_v4();
        let sent = Instant::now();
        let m = &self.inner.metrics;
        let budget = self.inner.timeout;
        let raw = match &self.inner.backend {
            Backend::Redis(r) => self.bounded(budget, r.acquire(key, owner)).await,
            Backend::Postgres(p) => self.bounded(budget, p.acquire(key, owner)).await,
            // Every copy "holds" token 1: only the database decides.
            Backend::UniqueOnly => Ok(RawAcquire::Acquired { token: 1 }),
        };
        let token = match raw {
            Err(e) => {
                m.lease_acquire_error().increment(1);
                // The script may have run and only its answer been lost (our
                // timeout, a cut connection): a lock taken for this owner
                // would keep every copy out for a whole TTL. Cancel it.
                self.cancel_in_background(key, owner);
                return Err(e);
            }
            Ok(RawAcquire::Held { remaining }) => {
                m.lease_held_by_other().increment(1);
                return Ok(Acquire::Held { remaining });
            }
            Ok(RawAcquire::Acquired { token }) => token,
        };
        m.lease_acquired().increment(1);
        m.leases_held().increment(1.0);
        let (tx, rx) = watch::channel(LeaseState {
            expires_at: sent + self.inner.ttl,
            lost: None,
        });
        let token_cell = Arc::new(Mutex::new(token));
        let loss = Arc::new(LossReport::default());
        let heartbeat = Heartbeat {
            loss: loss.clone(),
            lease: self.clone(),
            key: key.clone(),
            owner,
            token: token_cell.clone(),
            state: tx,
            ttl: self.inner.ttl,
            max_hold: self.inner.max_hold,
            acquired_at: sent,
            timeout: self.inner.timeout,
            metrics: m.clone(),
        };
        let heartbeat = tokio::spawn(heartbeat.run());
        Ok(Acquire::Acquired(LeaseGuard {
            lease: self.clone(),
            key: key.clone(),
            owner,
            token: token_cell,
            token_now: token,
            state: rx,
            heartbeat,
            acquired_at: sent,
            released: false,
            loss,
            metrics: m.clone(),
        }))
    }

    /// The lease taken inside a payment write, when the backend offers it:
    /// the PostgreSQL backend, whose lease rows live in the database the
    /// payments do. `None` with the others: their lease is held around the
    /// writes ([`Lease::acquire`]).
    pub fn inline(&self) -> Option<InlineLease> {
        match &self.inner.backend {
            Backend::Postgres(_) => Some(InlineLease {
                metrics: self.inner.metrics.clone(),
            }),
            Backend::Redis(_) | Backend::UniqueOnly => None,
        }
    }

    /// Releases whatever lock `owner` may hold for `key`, without waiting.
    fn cancel_in_background(&self, key: &LeaseKey, owner: Uuid) {
        let lease = self.clone();
        let key = key.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let budget = lease.inner.timeout;
                let cancelled = match &lease.inner.backend {
                    Backend::Redis(r) => lease.bounded(budget, r.cancel(&key, owner)).await,
                    Backend::Postgres(p) => lease.bounded(budget, p.cancel(&key, owner)).await,
                    Backend::UniqueOnly => Ok(false),
                };
                if let Ok(true) = cancelled {
                    tracing::info!(provider = %key.provider, transaction_id = %key.transaction_id,
                        "cancelled a lock taken by an acquire whose answer was lost");
                }
            });
        }
    }

    /// With the PostgreSQL backend: deletes a batch of lease rows unused for
    /// `idle`, returning how many (0 with Redis, whose keys expire by themselves).
    pub async fn prune(&self, idle: Duration) -> Result<i64, LeaseError> {
        match &self.inner.backend {
            Backend::Redis(_) | Backend::UniqueOnly => Ok(0),
            Backend::Postgres(p) => p.prune(idle).await,
        }
    }

    /// Extends the lease only if it is still `owner`'s with `token`.
    pub async fn renew(&self, key: &LeaseKey, owner: Uuid, token: i64) -> Result<bool, LeaseError> {
        self.renew_within(key, owner, token, self.inner.timeout)
            .await
    }

    /// [`Lease::renew`] within `budget` (the heartbeat's time left).
    async fn renew_within(
        &self,
        key: &LeaseKey,
        owner: Uuid,
        token: i64,
        budget: Duration,
    ) -> Result<bool, LeaseError> {
        match &self.inner.backend {
            Backend::Redis(r) => self.bounded(budget, r.renew(key, owner, token)).await,
            Backend::Postgres(p) => self.bounded(budget, p.renew(key, owner, token)).await,
            Backend::UniqueOnly => Ok(true),
        }
    }

    /// Compare-and-delete: never releases a lease that is not ours.
    pub async fn release(
        &self,
        key: &LeaseKey,
        owner: Uuid,
        token: i64,
    ) -> Result<bool, LeaseError> {
        let budget = self.inner.timeout;
        match &self.inner.backend {
            Backend::Redis(r) => self.bounded(budget, r.release(key, owner, token)).await,
            Backend::Postgres(p) => self.bounded(budget, p.release(key, owner, token)).await,
            Backend::UniqueOnly => Ok(true),
        }
    }

    /// See [`LeaseGuard::resync`].
    pub async fn resync(
        &self,
        key: &LeaseKey,
        owner: Uuid,
        token: i64,
        db_fence: i64,
    ) -> Result<Option<i64>, LeaseError> {
        let budget = self.inner.timeout;
        match &self.inner.backend {
            Backend::Redis(r) => {
                self.bounded(budget, r.resync(key, owner, token, db_fence))
                    .await
            }
            Backend::Postgres(p) => {
                self.bounded(budget, p.resync(key, owner, token, db_fence))
                    .await
            }
            // Nothing to raise: a claim that lost is answered as lost.
            Backend::UniqueOnly => Ok(None),
        }
    }

    /// Readiness probe.
    pub async fn ping(&self) -> Result<(), LeaseError> {
        let budget = self.inner.timeout;
        match &self.inner.backend {
            Backend::Redis(r) => self.bounded(budget, r.ping()).await,
            Backend::Postgres(p) => self.bounded(budget, p.ping()).await,
            Backend::UniqueOnly => Ok(()),
        }
    }
}

/// The lease taken inside a payment write ([`Lease::inline`]): the write's
/// statement starts with the backend's fragment (`postgres::take_inside!`,
/// composed with the store's fenced upsert as `APPLY_LEASED`), which takes
/// the lease and fences the write with its token; its commit gives the lease
/// back. The lease is held for exactly as long as that transaction, by the
/// lease row's lock, so there is no heartbeat, no release and no time during
/// which a stalled holder could still believe it holds the lease; and no
/// guard. This counts such a lease as a guard counts one held around writes.
#[derive(Clone)]
pub struct InlineLease {
    metrics: Metrics,
}

impl InlineLease {
    /// A write took the lease `started` ago and its commit gave it back:
    /// counted as an acquisition, held for as long as the write took.
    pub fn taken(&self, started: Instant) {
        self.metrics.lease_acquired().increment(1);
        self.metrics
            .lease_held_seconds()
            .record(started.elapsed().as_secs_f64());
    }

    /// A write found the lease held by someone else.
    pub fn held_by_other(&self) {
        self.metrics.lease_held_by_other().increment(1);
    }

    /// The database refused the token a write took: the lease ended with
    /// that write, so its loss is counted here, once.
    pub fn lost(&self) {
        self.metrics.lease_lost().increment(1);
    }
}

/// Result of an acquisition attempt.
pub enum Acquire {
    Acquired(LeaseGuard),
    /// Another owner holds it; its lock expires in `remaining` at the latest.
    Held {
        remaining: Duration,
    },
}

/// Why a lease command got no answer. Every variant means "unknown": the
/// command may or may not have taken effect, so callers treat it as the
/// backend being unavailable, never as "not acquired" or "not ours".
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("redis")]
    Redis(#[from] ::redis::RedisError),
    #[error("postgres")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("no lease-backend connection available")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("lease backend timed out after {0:?}")]
    Timeout(Duration),
    #[error("cannot set up the lease backend")]
    Build(#[from] PoolBuildError),
}

/// Why a held lease ended before its holder finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// A renewal found another value under the lock (or none).
    NotOwner,
    /// No renewal got through before the local expiry.
    Unreachable,
    /// Held for `FENCEHOOK_LEASE_MAX_MS`; renewals stopped.
    MaxHold,
    /// The holder found its local expiry passed before the heartbeat said
    /// anything (the holder itself was frozen, or its heartbeat starved).
    Expired,
    /// The database refused a write: a newer token owns the payment.
    Superseded,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::NotOwner => "renewal refused: no longer the owner",
            LostReason::Unreachable => "lease backend unreachable until the lease expired",
            LostReason::MaxHold => "maximum hold time reached",
            LostReason::Expired => "local expiry passed before the holder finished",
            LostReason::Superseded => "a newer token owns the payment",
        })
    }
}

/// One lease's loss, counted once in `fencehook_lease_lost_total` by
/// whichever part of the code notices it first: the heartbeat (renewal
/// refused, backend unreachable, maximum hold) or the holder (its clock ran
/// out, the database fence refused it). SREs alert on this counter; it must
/// count every loss, and each only once.
#[derive(Default)]
pub(crate) struct LossReport {
    counted: AtomicBool,
}

impl LossReport {
    /// Counts the loss unless it was counted already; true for the first report.
    pub(crate) fn report(&self, metrics: &Metrics) -> bool {
        let first = !self.counted.swap(true, Ordering::AcqRel);
        if first {
            metrics.lease_lost().increment(1);
        }
        first
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
    lease: Lease,
    key: LeaseKey,
    owner: Uuid,
    /// Current token; changes only on a fence resync. The heartbeat holds this
    /// lock while a renewal is in flight so a resync never races a renewal.
    token: Arc<Mutex<i64>>,
    /// The same token, readable without awaiting the lock (it changes only
    /// in `resync`, which takes `&mut self`).
    token_now: i64,
    state: watch::Receiver<LeaseState>,
    heartbeat: JoinHandle<()>,
    acquired_at: Instant,
    released: bool,
    loss: Arc<LossReport>,
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
        self.loss_reason().is_none()
    }

    /// Why the lease is no longer held, if it is not.
    pub fn loss_reason(&self) -> Option<LostReason> {
        let st = *self.state.borrow();
        match st.lost {
            Some(reason) => Some(reason),
            None if Instant::now() >= st.expires_at => Some(LostReason::Expired),
            None => None,
        }
    }

    /// The holder noticed the loss (its clock, a select on [`LeaseGuard::lost`],
    /// or a fence rejection): counted in `fencehook_lease_lost_total` unless
    /// the heartbeat counted it first, and logged once.
    pub fn report_lost(&self, reason: LostReason) {
        if self.loss.report(&self.metrics) {
            tracing::warn!(provider = %self.key.provider, transaction_id = %self.key.transaction_id,
                token = self.token_now, %reason, "lease lost");
        }
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

    /// Fence resync: the database holds a fence `>= db_fence` for
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
    /// would: the lock stays until its TTL runs out.
    #[cfg(feature = "test-support")]
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
