//! What the admin listener and the periodic upkeep report about the backends:
//! readiness probes (a writable node, the schema, the lease backend,
//! synchronous replication), `fencehook_backend_up`,
//! `fencehook_db_synchronous_replication`, the pool gauges, the count of
//! payments stuck in `processing` and the newest recorded audit run
//! (`fencehook_audit_last_run_timestamp_seconds`, `fencehook_audit_violations`). Deliveries never wait on anything here:
//! they read the last sample ([`Health::refuses_bookings`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::lease::Lease;
use crate::metrics::{self, Backend, InboxStatus, Metrics};
use crate::store::audit::LastAudit;
use crate::store::migrate::MIN_SCHEMA_VERSION;
use crate::store::{NodeState, Store};

/// Bound on one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `/readyz` answers from its last probe ([`Health::probe_recent`]):
/// however often it is asked, the backends are probed once a second at most.
pub const READYZ_CACHE: Duration = Duration::from_secs(1);
/// What `/readyz` says of a check it could not make.
const UNKNOWN: &str = "unknown: PostgreSQL does not answer";
/// How often the upkeep samples gauges and probes the backends.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);
/// Least time between two probes asked for by [`Health::nudge`].
const NUDGE_SPACING: Duration = Duration::from_secs(1);
/// How often (in upkeep ticks) lease rows unused for the counter's idle
/// expiry are pruned (PostgreSQL lease backend; Redis keys expire by themselves).
const PRUNE_EVERY_TICKS: u64 = 12;
/// How often (in upkeep ticks, from the first) the newest recorded audit run
/// is read for its gauges: a minute, well inside the day the staleness alert
/// allows.
const AUDIT_EVERY_TICKS: u64 = 12;

/// The result of probing the backends: each `Err` holds the cause for `/readyz`.
#[derive(Clone)]
pub struct Probe {
    /// A pooled connection answers and its node takes writes.
    pub postgres: Result<(), String>,
    /// The schema is at least the one this configuration books on
    /// ([`crate::store::migrate::min_schema_version`]).
    pub schema: Result<(), String>,
    pub lease: Result<(), String>,
    /// Commits wait for a synchronous standby.
    pub sync_replication: Result<(), String>,
    /// `FENCEHOOK_REQUIRE_SYNC_REPLICATION`: `sync_replication` decides readiness.
    pub sync_required: bool,
}

impl Probe {
    pub fn ok(&self) -> bool {
        self.postgres.is_ok()
            && self.schema.is_ok()
            && self.lease.is_ok()
            && (self.sync_replication.is_ok() || !self.sync_required)
    }
}

/// The node's checks, from what a pooled connection found there.
fn node_checks(
    node: &NodeState,
    min_schema: i32,
) -> (Result<(), String>, Result<(), String>, Result<(), String>) {
    let postgres = if node.in_recovery {
        Err("the node is a standby (pg_is_in_recovery); writes are refused".to_owned())
    } else if node.read_only {
        Err("the node is read-only (transaction_read_only = on)".to_owned())
    } else {
        Ok(())
    };
    let schema = if node.schema_version >= min_schema {
        Ok(())
    } else {
        Err(format!(
            "schema at version {}, this binary needs at least {min_schema} here: run `fencehook migrate`",
            node.schema_version
        ))
    };
    let sync = if node.commits_wait_for_a_standby() {
        Ok(())
    } else if node.synchronous_standby_names.trim().is_empty() {
        Err("off: synchronous_standby_names is empty".to_owned())
    } else {
        Err(format!(
            "off: synchronous_commit = {}",
            node.synchronous_commit
        ))
    };
    (postgres, schema, sync)
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
    /// `FENCEHOOK_REQUIRE_SYNC_REPLICATION`.
    require_sync: bool,
    /// The oldest schema this configuration books on.
    min_schema: i32,
    /// The last sample found commits waiting for a synchronous standby.
    sync_replication: AtomicBool,
    /// The start's one warning about asynchronous replication is said.
    warned_async: AtomicBool,
    /// [`Health::nudge`]: probe before the next tick.
    nudged: tokio::sync::Notify,
    /// `/readyz`'s last probe and when it ended ([`READYZ_CACHE`]); the lock
    /// is held while a probe runs, so probes arriving meanwhile share it.
    ready: tokio::sync::Mutex<Option<(std::time::Instant, Probe)>>,
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
            require_sync: false,
            min_schema: MIN_SCHEMA_VERSION,
            sync_replication: AtomicBool::new(false),
            warned_async: AtomicBool::new(false),
            nudged: tokio::sync::Notify::new(),
            ready: tokio::sync::Mutex::new(None),
        };
        health.set_backend_up(false, false);
        health
            .metrics
            .gauge(metrics::DB_SYNCHRONOUS_REPLICATION, &[])
            .set(0.0);
        for zero in [
            metrics::PAYMENTS_STUCK_PROCESSING,
            metrics::AUDIT_LAST_RUN_TIMESTAMP_SECONDS,
            metrics::AUDIT_VIOLATIONS,
        ] {
            health.metrics.gauge(zero, &[]).set(0.0);
        }
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

    /// With `FENCEHOOK_REQUIRE_SYNC_REPLICATION=true`: deliveries are refused
    /// while commits do not wait for a synchronous standby.
    pub fn requiring_sync_replication(mut self, required: bool) -> Health {
        self.require_sync = required;
        self
    }

    /// Readiness asks for this schema version at least (default
    /// [`MIN_SCHEMA_VERSION`]).
    pub fn needing_schema(mut self, version: i32) -> Health {
        self.min_schema = version;
        self
    }

    /// Whether deliveries must be answered 503 now: synchronous replication is
    /// required and the last sample did not find it (or none was taken yet).
    /// An atomic read: no round trip per delivery.
    pub fn refuses_bookings(&self) -> bool {
        self.require_sync && !self.sync_replication.load(Ordering::Relaxed)
    }

    /// Probes PostgreSQL (a pooled connection, what its node is) and the
    /// lease backend (bounded), and updates `fencehook_backend_up` and the
    /// synchronous-replication sample.
    pub async fn probe(&self) -> Probe {
        let (pg, lease) = tokio::join!(
            tokio::time::timeout(PROBE_TIMEOUT, self.store.node_state()),
            tokio::time::timeout(PROBE_TIMEOUT, self.lease.ping()),
        );
        let (postgres, schema, sync_replication) = match pg {
            Ok(Ok(node)) => {
                let checks = node_checks(&node, self.min_schema);
                self.record_sync_replication(checks.2.is_ok(), &node);
                checks
            }
            Ok(Err(e)) => {
                let e = crate::report::chain(&e);
                (Err(e), Err(UNKNOWN.to_owned()), Err(UNKNOWN.to_owned()))
            }
            Err(_) => (
                Err("timed out".to_owned()),
                Err(UNKNOWN.to_owned()),
                Err(UNKNOWN.to_owned()),
            ),
        };
        let lease = match lease {
            Ok(r) => r.map_err(|e| crate::report::chain(&e)),
            Err(_) => Err("timed out".to_owned()),
        };
        self.set_backend_up(postgres.is_ok(), lease.is_ok());
        Probe {
            postgres,
            schema,
            lease,
            sync_replication,
            sync_required: self.require_sync,
        }
    }

    /// `/readyz`'s probe: the last one when it ended less than
    /// [`READYZ_CACHE`] ago, a new one otherwise (one at a time). A probe per
    /// request would take a connection of the delivery pool each time: a
    /// busy prober, or many, would compete with deliveries for it.
    pub async fn probe_recent(&self) -> Probe {
        let mut ready = self.ready.lock().await;
        if let Some((at, probe)) = ready.as_ref() {
            if at.elapsed() < READYZ_CACHE {
                return probe.clone();
            }
        }
        let probe = self.probe().await;
        *ready = Some((std::time::Instant::now(), probe.clone()));
        probe
    }

    /// Keeps the last answer (unknown while PostgreSQL does not answer: the
    /// last one stands), exports it, and warns once per start when commits
    /// do not wait for a standby — a probe every few seconds must not repeat it.
    fn record_sync_replication(&self, on: bool, node: &NodeState) {
        self.sync_replication.store(on, Ordering::Relaxed);
        self.metrics
            .gauge(metrics::DB_SYNCHRONOUS_REPLICATION, &[])
            .set(if on { 1.0 } else { 0.0 });
        if !on && !self.warned_async.swap(true, Ordering::Relaxed) {
            let consequence = if self.require_sync {
                format!(
                    "deliveries are answered 503 until it is ({})",
                    crate::config::setting::FENCEHOOK_REQUIRE_SYNC_REPLICATION
                )
            } else {
                "an acknowledged payment can be lost if the primary fails over".to_owned()
            };
            tracing::warn!(
                synchronous_standby_names = %node.synchronous_standby_names,
                synchronous_commit = %node.synchronous_commit,
                "PostgreSQL commits do not wait for a synchronous standby; {consequence}"
            );
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

    /// Samples `fencehook_audit_last_run_timestamp_seconds` and
    /// `fencehook_audit_violations` from the newest run `fencehook audit`
    /// recorded (0 and 0 when none is, or the schema has no `audit_runs`
    /// yet); a failed read keeps the last sample.
    pub async fn read_last_audit(&self) {
        let last = tokio::time::timeout(PROBE_TIMEOUT, self.store.last_audit()).await;
        let (finished, violations) = match last {
            Ok(Ok(LastAudit::Ran(run))) => (
                run.finished_at.unix_timestamp() as f64,
                run.checks.iter().map(|c| c.violations).sum::<i64>() as f64,
            ),
            Ok(Ok(LastAudit::Never | LastAudit::BeforeMigration)) => (0.0, 0.0),
            Ok(Err(e)) => {
                tracing::debug!(error = %crate::report::chain(&e), "the last audit run could not be read");
                return;
            }
            Err(_) => return,
        };
        let m = &self.metrics;
        m.gauge(metrics::AUDIT_LAST_RUN_TIMESTAMP_SECONDS, &[])
            .set(finished);
        m.gauge(metrics::AUDIT_VIOLATIONS, &[]).set(violations);
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
                tracing::debug!(error = %crate::report::chain(&e), "lease prune failed");
                0
            }
            Err(_) => 0,
        }
    }

    /// A delivery failed on a database error: probe now rather than at the
    /// next tick, so connections to a node that became read-only are dropped
    /// before the PSP's retry arrives.
    pub fn nudge(&self) {
        self.nudged.notify_one();
    }

    /// Every few seconds: gauges, probes, the stuck count, histogram upkeep;
    /// now and then, the lease prune; and a probe when nudged. Runs until the
    /// task is aborted.
    pub async fn upkeep(self: Arc<Self>) {
        let mut tick = tokio::time::interval(UPKEEP_EVERY);
        let mut n = 0u64;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.nudged.notified() => {
                    let _ = self.probe().await;
                    // However many deliveries fail meanwhile: a probe a second at most.
                    tokio::time::sleep(NUDGE_SPACING).await;
                    continue;
                }
            }
            n += 1;
            self.refresh_pool_gauges();
            let _ = self.probe().await;
            self.count_stuck().await;
            self.count_inbox().await;
            self.metrics.upkeep();
            if n % PRUNE_EVERY_TICKS == 0 {
                self.prune_leases().await;
            }
            // The first tick is at once: the gauges are right from start.
            if n % AUDIT_EVERY_TICKS == 1 {
                self.read_last_audit().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(standbys: &str, commit: &str) -> NodeState {
        NodeState {
            in_recovery: false,
            read_only: false,
            synchronous_standby_names: standbys.to_owned(),
            synchronous_commit: commit.to_owned(),
            schema_version: MIN_SCHEMA_VERSION,
        }
    }

    #[test]
    fn commits_wait_for_a_standby_only_with_one_named_and_a_waiting_synchronous_commit() {
        for commit in ["on", "remote_write", "remote_apply"] {
            assert!(
                node("standby1", commit).commits_wait_for_a_standby(),
                "{commit}"
            );
            assert!(
                node("ANY 1 (a, b)", commit).commits_wait_for_a_standby(),
                "{commit}"
            );
            assert!(!node("", commit).commits_wait_for_a_standby(), "{commit}");
            assert!(!node("  ", commit).commits_wait_for_a_standby(), "{commit}");
        }
        for commit in ["local", "off"] {
            assert!(
                !node("standby1", commit).commits_wait_for_a_standby(),
                "{commit}"
            );
        }
    }

    #[test]
    fn a_standby_a_read_only_node_and_an_old_schema_are_each_named() {
        let (pg, schema, sync) = node_checks(&node("s1", "on"), MIN_SCHEMA_VERSION);
        assert!(pg.is_ok() && schema.is_ok() && sync.is_ok());
        let standby = NodeState {
            in_recovery: true,
            ..node("", "on")
        };
        assert!(node_checks(&standby, MIN_SCHEMA_VERSION)
            .0
            .unwrap_err()
            .contains("standby"));
        let read_only = NodeState {
            read_only: true,
            ..node("", "on")
        };
        assert!(node_checks(&read_only, MIN_SCHEMA_VERSION)
            .0
            .unwrap_err()
            .contains("read-only"));
        let old = NodeState {
            schema_version: MIN_SCHEMA_VERSION - 1,
            ..node("", "on")
        };
        assert!(node_checks(&old, MIN_SCHEMA_VERSION)
            .1
            .unwrap_err()
            .contains("fencehook migrate"));
        let local = node("s1", "local");
        assert!(node_checks(&local, MIN_SCHEMA_VERSION)
            .2
            .unwrap_err()
            .contains("synchronous_commit = local"));
    }

    #[test]
    fn the_schema_this_binary_needs_is_one_it_carries() {
        let latest = crate::store::migrate::latest_version();
        assert!((1..=latest).contains(&MIN_SCHEMA_VERSION), "{latest}");
        for (downstream, paypal) in [(false, false), (false, true), (true, false), (true, true)] {
            let needed = crate::store::migrate::min_schema_version(downstream, paypal);
            assert!((MIN_SCHEMA_VERSION..=latest).contains(&needed), "{needed}");
        }
    }

    #[test]
    fn a_downstream_or_a_paypal_provider_needs_the_migration_it_writes() {
        use crate::store::migrate::min_schema_version;
        let at = |version| NodeState {
            schema_version: version,
            ..node("", "on")
        };
        assert!(node_checks(&at(8), min_schema_version(false, false))
            .1
            .is_ok());
        let paypal = node_checks(&at(8), min_schema_version(false, true)).1;
        assert!(paypal.unwrap_err().contains("at least 9"));
        let downstream = node_checks(&at(9), min_schema_version(true, true)).1;
        assert!(downstream.unwrap_err().contains("at least 10"));
        assert!(node_checks(&at(10), min_schema_version(true, true))
            .1
            .is_ok());
    }
}
