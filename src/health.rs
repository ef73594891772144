//! What the admin listener and the periodic upkeep report about the backends:
//! readiness probes, `fencehook_backend_up`, the pool gauges and the count of
//! payments stuck in `processing`. Deliveries never wait on anything here.

use std::sync::Arc;
use std::time::Duration;

use crate::lease::Lease;
use crate::metrics::{self, Backend, InboxStatus, Metrics};
use crate::store::Store;

/// Bound on one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the upkeep samples gauges and probes the backends.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);
/// How often (in upkeep ticks) lease rows unused for the counter's idle
/// expiry are pruned (PostgreSQL lease backend; Redis keys expire by themselves).
const PRUNE_EVERY_TICKS: u64 = 12;

/// The result of probing both backends: `Err` holds the cause for `/readyz`.
pub struct Probe {
    pub postgres: Result<(), String>,
    pub lease: Result<(), String>,
}

impl Probe {
    pub fn ok(&self) -> bool {
        self.postgres.is_ok() && self.lease.is_ok()
    }
}

pub struct Health {
    store: Store,
    lease: Lease,
    metrics: Metrics,
    /// `FENCEHOOK_LEASE_MAX_MS`: past it no holder can still be working on a claim.
    max_hold: Duration,
    /// `FENCEHOOK_FENCE_KEY_TTL_SECS`: an idle counter older than this is dropped.
    counter_idle: Duration,
    /// Inbox mode: sample `fencehook_inbox_rows`.
    inbox: bool,
}

impl Health {
    pub fn new(
        store: Store,
        lease: Lease,
        metrics: Metrics,
        max_hold: Duration,
        counter_idle: Duration,
        inbox: bool,
    ) -> Health {
        let health = Health {
            store,
            lease,
            metrics,
            max_hold,
            counter_idle,
            inbox,
        };
        health.set_backend_up(false, false);
        health
            .metrics
            .gauge(metrics::PAYMENTS_STUCK_PROCESSING, &[])
            .set(0.0);
        health.refresh_pool_gauges();
        health
    }

    /// Pool gauges are sampled when scraped (and periodically).
    pub fn refresh_pool_gauges(&self) {
        let s = self.store.pool_status();
        let m = &self.metrics;
        m.gauge(metrics::DB_POOL_SIZE, &[]).set(s.size as f64);
        m.gauge(metrics::DB_POOL_AVAILABLE, &[])
            .set(s.available as f64);
        m.gauge(metrics::DB_POOL_WAITING, &[]).set(s.waiting as f64);
    }

    /// Pings PostgreSQL and the lease backend (bounded) and updates
    /// `fencehook_backend_up`.
    pub async fn probe(&self) -> Probe {
        let (pg, lease) = tokio::join!(
            tokio::time::timeout(PROBE_TIMEOUT, self.store.ping()),
            tokio::time::timeout(PROBE_TIMEOUT, self.lease.ping()),
        );
        let pg = match pg {
            Ok(r) => r.map_err(|e| crate::error::chain(&e)),
            Err(_) => Err("timed out".to_owned()),
        };
        let lease = match lease {
            Ok(r) => r.map_err(|e| crate::error::chain(&e)),
            Err(_) => Err("timed out".to_owned()),
        };
        self.set_backend_up(pg.is_ok(), lease.is_ok());
        Probe {
            postgres: pg,
            lease,
        }
    }

    /// Samples `fencehook_payments_stuck_processing`: rows `processing` for
    /// longer than any holder may keep its lease, so nobody is working on them.
    pub async fn count_stuck(&self) {
        let counted =
            tokio::time::timeout(PROBE_TIMEOUT, self.store.stuck_processing(self.max_hold)).await;
        if let Ok(Ok(n)) = counted {
            self.metrics
                .gauge(metrics::PAYMENTS_STUCK_PROCESSING, &[])
                .set(n as f64);
        }
    }

    fn set_backend_up(&self, postgres: bool, lease: bool) {
        let up = |b: bool| if b { 1.0 } else { 0.0 };
        self.metrics.backend_up(Backend::Postgres).set(up(postgres));
        self.metrics.backend_up(Backend::Lease).set(up(lease));
    }

    /// Samples `fencehook_inbox_rows{status}` and
    /// `fencehook_inbox_stored_bytes` (inbox mode).
    pub async fn count_inbox(&self) {
        if !self.inbox {
            return;
        }
        if let Ok(Ok(c)) = tokio::time::timeout(PROBE_TIMEOUT, self.store.inbox_counts()).await {
            let m = &self.metrics;
            m.inbox_rows(InboxStatus::Queued).set(c.queued as f64);
            m.inbox_rows(InboxStatus::Processing)
                .set(c.processing as f64);
            m.inbox_rows(InboxStatus::Dead).set(c.dead as f64);
        }
        let stored = tokio::time::timeout(PROBE_TIMEOUT, self.store.events_stored_bytes()).await;
        if let Ok(Ok(bytes)) = stored {
            self.metrics.inbox_stored_bytes().set(bytes as f64);
        }
    }

    /// Drops lease rows (PostgreSQL backend) nobody has used for the
    /// counter's idle expiry, a batch at a time, so the table stays bounded.
    pub async fn prune_leases(&self) -> i64 {
        match tokio::time::timeout(PROBE_TIMEOUT, self.lease.prune(self.counter_idle)).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                tracing::debug!(error = %crate::error::chain(&e), "lease prune failed");
                0
            }
            Err(_) => 0,
        }
    }

    /// Every few seconds: gauges, probes, the stuck count, histogram upkeep;
    /// now and then, the lease prune. Runs until the task is aborted.
    pub async fn upkeep(self: Arc<Self>) {
        let mut tick = tokio::time::interval(UPKEEP_EVERY);
        for n in 0u64.. {
            tick.tick().await;
            self.refresh_pool_gauges();
            let _ = self.probe().await;
            self.count_stuck().await;
            self.count_inbox().await;
            self.metrics.upkeep();
            if n % PRUNE_EVERY_TICKS == PRUNE_EVERY_TICKS - 1 {
                self.prune_leases().await;
            }
        }
    }
}
