//! `App::build(config)` binds the listeners and builds the pools; tests bind
//! port 0 and get the real server. `run_until_stopped(shutdown)` serves until
//! the given future resolves — shutdown is a parameter, not a global, so
//! several apps in one test process never stop each other.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::downstream::Downstream;
use crate::lease::{Lease, LeaseError};
use crate::metrics::{self, Metrics};
use crate::processor::{Hooks, Processor};
use crate::providers::Provider;
use crate::store::migrate::{self, MigrateError};
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
}

/// What request handlers share.
pub struct State {
    pub providers: HashMap<String, Provider>,
    pub processor: Processor,
    pub store: Store,
    pub lease: Lease,
    pub metrics: Metrics,
    pub max_body_bytes: usize,
    /// `FENCEHOOK_LEASE_MAX_MS`: past it no holder can still be working on a claim.
    pub max_hold: Duration,
    /// Bounds deliveries processed at once; a delivery that finds no permit is answered 503.
    pub inflight: tokio::sync::Semaphore,
    draining: AtomicBool,
}

impl State {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Pool gauges are sampled when scraped (and periodically).
    pub fn refresh_gauges(&self) {
        let s = self.store.pool_status();
        self.metrics
            .gauge(metrics::DB_POOL_SIZE, &[])
            .set(s.size as f64);
        self.metrics
            .gauge(metrics::DB_POOL_AVAILABLE, &[])
            .set(s.available as f64);
        self.metrics
            .gauge(metrics::DB_POOL_WAITING, &[])
            .set(s.waiting as f64);
    }

    /// Pings PostgreSQL and the lease backend (bounded) and updates
    /// `fencehook_backend_up`. Returns the two results for `/readyz`.
    pub async fn probe_backends(&self) -> (Result<(), String>, Result<(), String>) {
        let probe = Duration::from_secs(2);
        let (pg, lease) = tokio::join!(
            tokio::time::timeout(probe, self.store.ping()),
            tokio::time::timeout(probe, self.lease.ping()),
        );
        let pg = match pg {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(crate::error::chain(&e)),
            Err(_) => Err("timed out".to_owned()),
        };
        let lease = match lease {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".to_owned()),
        };
        self.set_backend_up(pg.is_ok(), lease.is_ok());
        (pg, lease)
    }

    /// Samples `fencehook_payments_stuck_processing`: rows `processing` for
    /// longer than any holder may keep its lease, so nobody is working on them.
    pub async fn count_stuck(&self) {
        let older_than = self.max_hold;
        if let Ok(Ok(n)) = tokio::time::timeout(
            Duration::from_secs(2),
            self.store.stuck_processing(older_than),
        )
        .await
        {
            self.metrics
                .gauge(metrics::PAYMENTS_STUCK_PROCESSING, &[])
                .set(n as f64);
        }
    }

    pub fn set_backend_up(&self, postgres: bool, lease: bool) {
        let b = |up: bool| if up { 1.0 } else { 0.0 };
        self.metrics
            .gauge(metrics::BACKEND_UP, &[("backend", "postgres")])
            .set(b(postgres));
        self.metrics
            .gauge(metrics::BACKEND_UP, &[("backend", "redis")])
            .set(b(lease));
    }
}

pub struct App {
    state: Arc<State>,
    listener: TcpListener,
    admin: TcpListener,
    drain: Duration,
}

impl App {
    pub async fn build(cfg: Config) -> Result<App, AppError> {
        App::build_with_hooks(cfg, Hooks::default()).await
    }

    /// As [`App::build`], with fault-injection hooks (tests only).
    pub async fn build_with_hooks(cfg: Config, hooks: Hooks) -> Result<App, AppError> {
        if cfg.migrate_on_start {
            let applied = migrate::run(&cfg.db.url).await?;
            if !applied.is_empty() {
                tracing::info!(?applied, "migrations applied");
            }
        }
        let names: Vec<String> = cfg.providers.iter().map(|p| p.name.clone()).collect();
        let metrics = Metrics::new(&names);
        let store = Store::new(&cfg.db)?;
        let lease = Lease::new(&cfg.lease, &cfg.db, metrics.clone())?;
        let downstream = cfg
            .downstream_url
            .clone()
            .map(|u| Downstream::new(u, cfg.downstream_timeout, metrics.clone()));
        let processor = Processor::new(
            store.clone(),
            lease.clone(),
            metrics.clone(),
            cfg.inflight_wait,
            downstream,
            hooks,
        );
        let listener = bind(cfg.listen).await?;
        let admin = bind(cfg.admin_listen).await?;
        let state = State {
            providers: cfg
                .providers
                .into_iter()
                .map(|p| (p.name.clone(), p))
                .collect(),
            processor,
            store,
            lease,
            metrics,
            max_body_bytes: cfg.max_body_bytes,
            max_hold: cfg.lease.max_hold,
            inflight: tokio::sync::Semaphore::new(cfg.max_inflight),
            draining: AtomicBool::new(false),
        };
        state.set_backend_up(false, false);
        state
            .metrics
            .gauge(metrics::PAYMENTS_STUCK_PROCESSING, &[])
            .set(0.0);
        state.refresh_gauges();
        Ok(App {
            state: Arc::new(state),
            listener,
            admin,
            drain: cfg.shutdown_timeout,
        })
    }

    pub fn port(&self) -> u16 {
        self.listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_default()
    }

    pub fn admin_port(&self) -> u16 {
        self.admin
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_default()
    }

    pub fn state(&self) -> Arc<State> {
        self.state.clone()
    }

    /// Serves until `shutdown` resolves; then readiness turns 503, the public
    /// listener stops accepting, in-flight deliveries finish (bounded by the
    /// shutdown timeout; past it they are dropped, which rolls back their
    /// transactions and releases their leases in the background), and the
    /// admin listener stops last.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let App {
            state,
            listener,
            admin,
            drain,
        } = self;
        let upkeep = tokio::spawn({
            let state = state.clone();
            async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                loop {
                    tick.tick().await;
                    state.refresh_gauges();
                    let _ = state.probe_backends().await;
                    state.count_stuck().await;
                    state.metrics.upkeep();
                }
            }
        });
        let (admin_stop_tx, mut admin_stop_rx) = watch::channel(false);
        let admin_task = tokio::spawn({
            let state = state.clone();
            let handler = Arc::new(move |req| crate::http::admin::handle(state.clone(), req));
            async move {
                let stop = async move {
                    let _ = admin_stop_rx.wait_for(|stop| *stop).await;
                };
                crate::http::serve(admin, handler, stop, Duration::from_secs(1)).await;
            }
        });
        let public_shutdown = {
            let state = state.clone();
            async move {
                shutdown.await;
                state.draining.store(true, Ordering::Relaxed);
                tracing::info!("shutting down: draining in-flight deliveries");
            }
        };
        let handler = {
            let state = state.clone();
            Arc::new(move |req| crate::http::webhook::handle(state.clone(), req))
        };
        crate::http::serve(listener, handler, public_shutdown, drain).await;
        let _ = admin_stop_tx.send(true);
        let _ = admin_task.await;
        upkeep.abort();
        tracing::info!("stopped");
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Bind { addr, source })
}
