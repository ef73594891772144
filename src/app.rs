//! `App::build(config)` binds the listeners and builds the pools; tests bind
//! port 0 and get the real server. `run_until_stopped(shutdown)` serves until
//! the given future resolves — shutdown is a parameter, not a global, so
//! several apps in one test process never stop each other.
//! `Workers::build(config)` is `fencehook work`'s: the same rooms, built by
//! the same constructor (`Parts::build`), without the listeners.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;

use crate::config::{setting, Config, Mode};
use crate::delivery::Deliveries;
use crate::downstream::Downstream;
use crate::health::Health;
use crate::http::state::{RequestLimits, State};
use crate::http::Limits;
use crate::inbox::Inbox;
use crate::lease::{Lease, LeaseError};
use crate::metrics::{Listener, Metrics, Reload};
use crate::processor::Processor;
use crate::startup::Role;
use crate::store::migrate::MigrateError;
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot bind {addr}")]
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
    /// The downstream call's TLS could not be set up.
    #[error("{}: {}", crate::config::setting::FENCEHOOK_DOWNSTREAM_URL, .0)]
    Downstream(String),
}

/// Connections the admin listener takes at once: a fixed few, its own, so
/// that `/readyz` and `/metrics` answer even while the public listener is full.
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// Longest a client of the admin listener may take to send a request head:
/// a probe or a scrape sends it at once.
const ADMIN_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the admin listener's connections get to finish at shutdown.
const ADMIN_DRAIN: Duration = Duration::from_secs(1);

pub struct App {
    state: Arc<State>,
    /// Re-read on SIGHUP.
    providers_file: Option<std::path::PathBuf>,
    /// SIGHUP, listened for from the build on: one that arrives as soon as
    /// the start is logged must not find the default action (exit) in place.
    hangup: Option<Signal>,
    /// Inbox mode: the inbox whose workers run beside the listeners.
    inbox: Option<Arc<Inbox>>,
    /// Inbox workers to run beside the listeners.
    workers: usize,
    listener: TcpListener,
    /// The admin listener serves from the build on (see [`App::build`]).
    admin: AdminServer,
    /// The health sampler, likewise running from the build on (and stopped
    /// with the app, also when it is dropped unrun).
    upkeep: AbortOnDrop,
    /// With a console: the build of its indexes, when they are missing.
    _console_indexes: Option<AbortOnDrop>,
    /// The public listener's bounds.
    limits: Limits,
    /// `FENCEHOOK_ALLOW_PUBLISHED_SECRETS`, for the file re-read on SIGHUP.
    allow_published_secrets: bool,
    /// The scheduled prune, unless `FENCEHOOK_PRUNE_INTERVAL_SECS` is 0.
    prune: Option<Prune>,
    /// The delivery history's writer, unless `FENCEHOOK_DELIVERY_HISTORY` is false.
    history: Option<crate::history::Writer>,
    /// The scheduled reconciliation, unless off.
    schedule: Option<crate::reconcile::Schedule>,
}

/// What the scheduled prune needs ([`crate::inbox::prune_on_schedule`]).
struct Prune {
    store: Store,
    metrics: Metrics,
    retention: Duration,
    every: Duration,
}

impl Prune {
    fn of(cfg: &Config, store: &Store, metrics: &Metrics) -> Option<Prune> {
        Some(Prune {
            store: store.clone(),
            metrics: metrics.clone(),
            retention: cfg.inbox.retention,
            every: cfg.inbox.prune_interval?,
        })
    }

    fn spawn(prune: Option<Prune>) -> Option<tokio::task::JoinHandle<()>> {
        prune.map(|p| {
            tokio::spawn(crate::inbox::prune_on_schedule(
                p.store,
                p.metrics,
                p.retention,
                p.every,
            ))
        })
    }
}

/// The admin listener, serving: its address, and how to stop it.
struct AdminServer {
    addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// The rooms `serve` and `work` both run on, built once from the
/// configuration: the metrics registry, the store and the lease backend,
/// the processor with its downstream call, the health probes and the
/// scheduled prune. Pools connect lazily: nothing here needs the database up.
struct Parts {
    metrics: Metrics,
    store: Store,
    processor: Processor,
    health: Arc<Health>,
    prune: Option<Prune>,
    /// Whether events are booked by inbox workers (always, for `work`).
    inbox_mode: bool,
}

impl Parts {
    /// What differs between the roles: `work` verifies no signatures, so it
    /// registers no provider's metrics, and it is the inbox whatever
    /// `FENCEHOOK_MODE` says.
    fn build(
        cfg: &Config,
        role: Role,
        processor_with: impl FnOnce(Processor) -> Processor,
    ) -> Result<Parts, AppError> {
        let inbox_mode = role == Role::Work || cfg.inbox.mode == Mode::Inbox;
        let names: Vec<String> = match role {
            Role::Serve => cfg.providers.iter().map(|p| p.name.clone()).collect(),
            Role::Work => Vec::new(),
        };
        // Only a console reads the overview's figures: without one, no
        // series keeps a copy of its value.
        let metrics = if role == Role::Serve && cfg.console.enabled() {
            Metrics::keeping_figures(&names)
        } else {
            Metrics::new(&names)
        };
        metrics.count_span_drops_from(crate::telemetry::spans_dropped);
        crate::reconcile::register_metrics(&metrics, &cfg.providers);
        let store = Store::for_service(&cfg.db, cfg.lease.ttl)?;
        let lease = Lease::new(&cfg.lease, &cfg.db, metrics.clone())?;
        let downstream = cfg
            .downstream_url
            .clone()
            .map(|u| {
                Downstream::new(
                    u,
                    cfg.downstream_timeout,
                    &cfg.downstream_trust,
                    metrics.clone(),
                )
            })
            .transpose()
            .map_err(AppError::Downstream)?;
        let processor = processor_with(Processor::new(
            store.clone(),
            lease.clone(),
            metrics.clone(),
            cfg.inflight_wait,
            downstream,
        ));
        let prune = Prune::of(cfg, &store, &metrics);
        let health = Arc::new(
            Health::new(
                store.clone(),
                lease,
                metrics.clone(),
                cfg.lease.max_hold,
                cfg.lease.fence_key_ttl,
                inbox_mode,
            )
            .requiring_sync_replication(cfg.require_sync_replication)
            .needing_schema(schema_needed(cfg)),
        );
        Ok(Parts {
            metrics,
            store,
            processor,
            health,
            prune,
            inbox_mode,
        })
    }

    /// The reconciliation's runner, booking through its own delivery room
    /// (the same store, processor, inbox and health as the webhooks').
    fn reconciler(&self, inbox: Option<Arc<Inbox>>) -> crate::reconcile::Reconciler {
        let deliveries = Deliveries::new(
            self.store.clone(),
            self.processor.clone(),
            inbox,
            self.metrics.clone(),
            self.health.clone(),
        );
        crate::reconcile::Reconciler::new(
            Arc::new(deliveries),
            self.store.clone(),
            self.metrics.clone(),
        )
    }

    /// The scheduled reconciliation, when `FENCEHOOK_RECONCILE_INTERVAL_SECS`
    /// is set. Each run reads `providers` as they are then: where SIGHUP
    /// reloads them (`serve`), a provider given API credentials later is
    /// reconciled from the next run on; where nothing reloads them
    /// (`work`), no provider with credentials means nothing to schedule.
    fn schedule(
        &self,
        cfg: &Config,
        inbox: Option<Arc<Inbox>>,
        providers: crate::providers::InForce,
        reloaded: bool,
    ) -> Option<crate::reconcile::Schedule> {
        let every = cfg.reconcile.interval?;
        let ready = providers
            .all()
            .iter()
            .any(|p| p.events_api() == crate::providers::EventsApi::Ready);
        if !ready {
            tracing::warn!(
                "{} is set, but no provider has API credentials: nothing to reconcile{}",
                setting::FENCEHOOK_RECONCILE_INTERVAL_SECS,
                if reloaded {
                    " until a reload (SIGHUP) adds them"
                } else {
                    ""
                }
            );
            if !reloaded {
                return None;
            }
        }
        Some(crate::reconcile::Schedule {
            reconciler: self.reconciler(inbox),
            providers,
            cfg: cfg.reconcile.clone(),
            every,
        })
    }

    /// The inbox of this configuration: workers book with the sync processor
    /// minus its in-flight wait, and own a taken event for one lease TTL past
    /// the last renewal of its lock (renewed every third of it, as the lease is),
    /// so a dead worker's events are taken again about when its leases expire.
    fn inbox(&self, cfg: &Config) -> Arc<Inbox> {
        Arc::new(Inbox::new(
            self.store.clone(),
            self.processor.without_inflight_wait(),
            self.metrics.clone(),
            cfg.inbox.clone(),
            cfg.db.clone(),
            cfg.lease.ttl,
        ))
    }
}

/// `fencehook reconcile`'s runner: the rooms `serve` books with, built
/// from the same configuration (the inbox, in inbox mode: its workers, in
/// `serve` and `work`, book what a run stores), without listeners. The
/// health is probed once, as `serve`'s sampler would have: with
/// `FENCEHOOK_REQUIRE_SYNC_REPLICATION`, bookings wait for a sample.
pub async fn reconciler(cfg: &Config) -> Result<crate::reconcile::Reconciler, AppError> {
    let parts = Parts::build(cfg, Role::Serve, |p| p)?;
    parts.health.probe().await;
    let inbox = parts.inbox_mode.then(|| parts.inbox(cfg));
    Ok(parts.reconciler(inbox))
}

impl App {
    /// Builds the rooms, binds the admin listener and serves it at once, then
    /// (with `FENCEHOOK_MIGRATE_ON_START`) waits for PostgreSQL and migrates,
    /// and only then binds the public listener: during the wait `/healthz`
    /// says the process is alive and `/readyz` names what is missing, and no
    /// delivery reaches a database that is not there yet or not migrated.
    pub async fn build(cfg: Config) -> Result<App, AppError> {
        App::assemble(cfg, |p| p).await
    }

    /// As [`App::build`], with fault-injection hooks in the processor.
    #[cfg(feature = "test-support")]
    pub async fn build_with_hooks(
        cfg: Config,
        hooks: crate::processor::hooks::Hooks,
    ) -> Result<App, AppError> {
        App::assemble(cfg, |p| p.with_hooks(hooks)).await
    }

    async fn assemble(
        cfg: Config,
        processor_with: impl FnOnce(Processor) -> Processor,
    ) -> Result<App, AppError> {
        let hangup = listen_for_sighup();
        let parts = Parts::build(&cfg, Role::Serve, processor_with)?;
        let inbox = parts.inbox_mode.then(|| parts.inbox(&cfg));
        // One set of providers for the handlers and the scheduled runs:
        // what SIGHUP reloads, both use.
        let providers = crate::providers::InForce::new(cfg.providers.clone());
        let schedule = parts.schedule(&cfg, inbox.clone(), providers.clone(), true);
        let Parts {
            metrics,
            store,
            processor,
            health,
            prune,
            inbox_mode,
        } = parts;
        let console =
            crate::console::Console::new(&cfg.console, store.clone(), &metrics, inbox_mode);
        let mut limits = Limits::public(&cfg, metrics.clone());
        limits.max_connections = fit_open_files(&cfg);
        let allow_published_secrets = cfg.allow_published_secrets;
        let workers = cfg.inbox.workers;
        let providers_file = cfg.providers_file.clone();
        let deliveries = Deliveries::new(
            store.clone(),
            processor,
            inbox.clone(),
            metrics.clone(),
            health.clone(),
        );
        let (history, history_writer) = if cfg.delivery_history {
            let (history, writer) = crate::history::History::spawn(
                store.clone(),
                metrics.clone(),
                crate::history::CAPACITY,
            );
            (history, Some(writer))
        } else {
            (crate::history::History::off(metrics.clone()), None)
        };
        let state = Arc::new(State::new(
            providers,
            deliveries,
            metrics,
            health,
            history,
            RequestLimits {
                max_body_bytes: cfg.max_body_bytes,
                body_timeout: cfg.body_timeout,
                max_inflight: cfg.max_inflight,
            },
        ));
        state.serve_console(console);
        // An error below drops these, which stops the admin listener and the sampler.
        let admin = serve_admin(state.clone(), bind(cfg.admin_listen).await?);
        let upkeep = AbortOnDrop(tokio::spawn(state.health.clone().upkeep()));
        if cfg.migrate_on_start {
            let applied = crate::startup::migrate_when_reachable(&cfg.db.url).await?;
            if !applied.is_empty() {
                tracing::info!(?applied, "migrations applied");
            }
        }
        let console_indexes = state
            .console()
            .map(|_| AbortOnDrop(tokio::spawn(build_console_indexes(cfg.db.url.clone()))));
        // Test seam (`test-support`): `FAILPOINTS=before_public_bind=sleep(8000)`
        // holds the start here, the admin listener up and the schema current.
        fail::fail_point!("before_public_bind");
        let listener = bind(cfg.listen).await?;
        state.start_listening();
        Ok(App {
            state,
            providers_file,
            hangup,
            listener,
            admin,
            upkeep,
            _console_indexes: console_indexes,
            limits,
            allow_published_secrets,
            prune,
            history: history_writer,
            inbox,
            workers,
            schedule,
        })
    }

    pub fn port(&self) -> u16 {
        self.listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_default()
    }

    pub fn admin_port(&self) -> u16 {
        self.admin.addr.map(|a| a.port()).unwrap_or_default()
    }

    /// The handlers' shared state (tests read its metrics).
    pub fn state(&self) -> Arc<State> {
        self.state.clone()
    }

    /// Serves until `shutdown` resolves; then readiness turns 503, the public
    /// listener stops accepting, in-flight deliveries finish (bounded by the
    /// shutdown timeout; past it their connections are aborted and this
    /// returns only once they are gone; see [`crate::http::serve`] for what
    /// that does to their work), and the admin listener stops last.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let App {
            state,
            listener,
            admin,
            upkeep,
            _console_indexes,
            limits,
            allow_published_secrets,
            prune,
            history,
            inbox,
            workers,
            providers_file,
            hangup,
            schedule,
        } = self;
        let pruning = Prune::spawn(prune);
        // On its own task: a stalled PSP API stalls the run, not a delivery.
        let reconciling = schedule.map(|s| AbortOnDrop(tokio::spawn(s.run())));
        let drain = limits.drain;
        let reloads = tokio::spawn(reload_on_sighup(
            state.clone(),
            providers_file,
            hangup,
            allow_published_secrets,
        ));
        let (workers_stop, workers_stopped) = watch::channel(false);
        let workers_task = inbox.map(|inbox| tokio::spawn(inbox.run(workers, workers_stopped)));
        let public_shutdown = {
            let state = state.clone();
            async move {
                shutdown.await;
                state.start_draining();
                tracing::info!("shutting down: draining in-flight deliveries");
            }
        };
        let handler = {
            let state = state.clone();
            Arc::new(move |req| crate::http::webhook::handle(state.clone(), req))
        };
        crate::http::serve(listener, handler, public_shutdown, limits).await;
        drop(reconciling);
        // Workers finish (or abandon, fenced) their current attempt; every
        // accepted event is in the database for the next worker.
        let _ = workers_stop.send(true);
        if let Some(task) = workers_task {
            if tokio::time::timeout(drain, task).await.is_err() {
                tracing::warn!("inbox workers still busy past the drain timeout; their events will be taken again");
            }
        }
        // Every delivery is answered: what the history still holds is written.
        if let Some(writer) = history {
            writer.stop(drain).await;
        }
        let _ = admin.stop.send(true);
        let _ = admin.task.await;
        drop(upkeep);
        reloads.abort();
        if let Some(p) = pruning {
            p.abort();
        }
        tracing::info!("stopped");
    }
}

/// SIGHUP re-reads the providers file: new secrets verify without a restart.
/// A file that does not parse leaves the providers in force and says why.
/// Without a file there is nothing to re-read, and SIGHUP is said to be
/// ignored — not left to its default action, which ends the process
/// without a drain.
async fn reload_on_sighup(
    state: Arc<State>,
    path: Option<std::path::PathBuf>,
    hangup: Option<Signal>,
    allow_published_secrets: bool,
) {
    let Some(mut hup) = hangup else {
        return;
    };
    while hup.recv().await.is_some() {
        if let Some(console) = state.console() {
            console.reload_tokens();
        }
        let Some(path) = &path else {
            if state.console().is_none() {
                tracing::warn!(
                    "SIGHUP ignored: no providers file ({}) to re-read",
                    setting::FENCEHOOK_PROVIDERS
                );
            }
            continue;
        };
        let read = tokio::task::spawn_blocking({
            let path = path.clone();
            move || {
                // Every error of the file, on the one log line.
                let providers =
                    crate::providers::load_file(&path).map_err(|e| e.lines().join("; "))?;
                // What the start refuses, a reload refuses too.
                match providers.iter().flat_map(|p| p.exposures()).next() {
                    Some(e) if !allow_published_secrets => Err(e.clone()),
                    _ => Ok(providers),
                }
            }
        })
        .await;
        match read {
            Ok(Ok(providers)) => {
                let names: Vec<String> = providers.iter().map(|p| p.name.clone()).collect();
                for warning in providers.iter().flat_map(|p| p.warnings()) {
                    tracing::warn!("{warning}");
                }
                state.replace_providers(providers);
                state.metrics.providers_reloads(Reload::Ok).increment(1);
                tracing::info!(file = %path.display(), ?names, "SIGHUP: providers file re-read; new secrets in force");
            }
            Ok(Err(e)) => {
                state.metrics.providers_reloads(Reload::Error).increment(1);
                tracing::error!(file = %path.display(), error = %e,
                    "SIGHUP: the providers file does not parse; the providers in force are kept");
            }
            Err(e) => {
                state.metrics.providers_reloads(Reload::Error).increment(1);
                tracing::error!(error = %e, "SIGHUP: reading the providers file failed");
            }
        }
    }
}

/// `fencehook work`: inbox workers alone, no listeners.
pub struct Workers {
    hangup: Option<Signal>,
    schedule: Option<crate::reconcile::Schedule>,
    prune: Option<Prune>,
    inbox: Arc<Inbox>,
    health: Arc<Health>,
    workers: usize,
    drain: Duration,
}

impl Workers {
    pub async fn build(cfg: Config) -> Result<Workers, AppError> {
        // Before the wait for the database: a SIGHUP meanwhile must not end it.
        let hangup = listen_for_sighup();
        if cfg.migrate_on_start {
            crate::startup::migrate_when_reachable(&cfg.db.url).await?;
        }
        let parts = Parts::build(&cfg, Role::Work, |p| p)?;
        let inbox = parts.inbox(&cfg);
        // `work` reloads nothing: its runs use the providers of its start.
        let providers = crate::providers::InForce::new(cfg.providers.clone());
        let schedule = parts.schedule(&cfg, Some(inbox.clone()), providers, false);
        Ok(Workers {
            hangup,
            schedule,
            prune: parts.prune,
            inbox,
            health: parts.health,
            workers: cfg.inbox.workers.max(1),
            drain: cfg.shutdown_timeout,
        })
    }

    /// Works until `shutdown` resolves, then lets the current attempts end
    /// (bounded by the shutdown timeout).
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let upkeep = tokio::spawn(self.health.clone().upkeep());
        let hangups = tokio::spawn(ignore_sighup(self.hangup));
        let pruning = Prune::spawn(self.prune);
        let reconciling = self.schedule.map(|s| AbortOnDrop(tokio::spawn(s.run())));
        let (stop, stopped) = watch::channel(false);
        let mut task = tokio::spawn(self.inbox.run(self.workers, stopped));
        tokio::select! {
            _ = &mut task => {}
            () = shutdown => {
                tracing::info!("shutting down: letting the current attempts end");
                let _ = stop.send(true);
                if tokio::time::timeout(self.drain, task).await.is_err() {
                    tracing::warn!("inbox workers still busy past the drain timeout; their events will be taken again");
                }
            }
        }
        drop(reconciling);
        upkeep.abort();
        hangups.abort();
        if let Some(p) = pruning {
            p.abort();
        }
        tracing::info!("stopped");
    }
}

/// Serves the admin listener until its `stop` is sent (or dropped).
fn serve_admin(state: Arc<State>, admin: TcpListener) -> AdminServer {
    let addr = admin.local_addr().ok();
    if let Some(addr) = addr {
        tracing::info!(
            admin_port = addr.port(),
            "admin listener up: /healthz, /readyz, /metrics"
        );
    }
    let (stop, mut stopped) = watch::channel(false);
    // Probes and scrapers come from a few addresses (no per-peer cap);
    // half-open connections cannot keep them out, because a new connection
    // takes the slot of the oldest one between requests.
    let limits = Limits {
        listener: Listener::Admin,
        max_connections: ADMIN_MAX_CONNECTIONS,
        max_per_peer: usize::MAX,
        peer_ipv6_prefix: 128,
        max_requests: u64::MAX,
        max_age: Duration::MAX,
        head_timeout: ADMIN_HEAD_TIMEOUT,
        evict_idle: true,
        drain: ADMIN_DRAIN,
        metrics: state.metrics.clone(),
    };
    let task = tokio::spawn(async move {
        let handler = Arc::new(move |req| crate::http::admin::handle(state.clone(), req));
        let stop = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        crate::http::serve(admin, handler, stop, limits).await;
    });
    AdminServer { addr, stop, task }
}

/// The oldest schema this configuration books on (readiness waits for it).
fn schema_needed(cfg: &Config) -> i32 {
    let paypal = cfg
        .providers
        .iter()
        .any(|p| p.scheme() == crate::providers::SchemeKind::Paypal);
    crate::store::migrate::min_schema_version(cfg.downstream_url.is_some(), paypal)
}

/// Builds the console's indexes when they are missing (see
/// [`crate::store::console::build_indexes`]); tried again every five minutes
/// while it fails (the database down, or a role that may not create them:
/// said once, with the statements to run by hand).
async fn build_console_indexes(url: String) {
    let mut said = false;
    loop {
        match crate::store::console::build_indexes(&url).await {
            Ok(built) => {
                if !built.is_empty() {
                    tracing::info!(
                        ?built,
                        "built the console's indexes of payments (CONCURRENTLY)"
                    );
                }
                return;
            }
            Err(e) if !said => {
                said = true;
                let statements: Vec<String> = crate::store::console::INDEXES
                    .iter()
                    .map(|(name, covers)| {
                        format!("CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} {covers}")
                    })
                    .collect();
                tracing::warn!(error = %crate::report::chain(&e), ?statements,
                    "could not build the console's indexes: its searches read more rows without them; \
                     tried again every 5 minutes, or run the statements as the table's owner");
            }
            Err(e) => {
                tracing::debug!(error = %crate::report::chain(&e), "the console's indexes: not built yet")
            }
        }
        tokio::time::sleep(Duration::from_secs(300)).await;
    }
}

/// Aborts a task when dropped: a build that fails halfway leaves nothing running.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn listen_for_sighup() -> Option<Signal> {
    signal(SignalKind::hangup())
        .inspect_err(|e| {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; the providers file is read at start only");
        })
        .ok()
}

/// Workers verify no signatures, so `systemctl reload` has nothing to do;
/// SIGHUP's default action would end the process without a drain.
async fn ignore_sighup(hangup: Option<Signal>) {
    let Some(mut hup) = hangup else {
        return;
    };
    while hup.recv().await.is_some() {
        tracing::warn!("SIGHUP ignored: `fencehook work` has no providers to re-read");
    }
}

/// File descriptors a `serve` process needs beside its public
/// connections: the admin listener's, the refusals being written on both
/// listeners, the database pool (and the inbox's notification connection),
/// Redis, one downstream connection per delivery in flight, PayPal
/// certificate fetches, and a reserve for the listeners themselves, the
/// runtime, logs and DNS.
fn other_descriptors(cfg: &Config) -> u64 {
    let downstream = if cfg.downstream_url.is_some() {
        cfg.max_inflight
    } else {
        0
    };
    let others = ADMIN_MAX_CONNECTIONS
        + 2 * crate::http::MAX_REFUSING
        + cfg.db.pool_size
        + 2
        + 16
        + downstream
        + 8
        + 64;
    others as u64
}

/// The public listener's connection cap the open-file limit can carry.
///
/// Under `ulimit -n 1024` the default cap of 1,024 was never reached:
/// accepts failed with "Too many open files" instead, deliveries timed
/// out rather than being answered 503, and nothing was counted. So the
/// soft limit is raised to what the caps need where the hard limit allows;
/// where it does not, the cap is lowered to fit, and said.
fn fit_open_files(cfg: &Config) -> usize {
    use rlimit::Resource;
    let others = other_descriptors(cfg);
    let wanted = cfg.max_connections as u64 + others;
    let soft = match rlimit::increase_nofile_limit(wanted) {
        Ok(soft) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-file limit (RLIMIT_NOFILE); {} is kept as set", setting::FENCEHOOK_MAX_CONNECTIONS);
            return cfg.max_connections;
        }
    };
    if soft >= wanted {
        tracing::debug!(open_files = soft, wanted, "open-file limit fits the caps");
        return cfg.max_connections;
    }
    let hard = Resource::NOFILE.get().map(|(_, hard)| hard).unwrap_or(soft);
    let lowered = usize::try_from(soft.saturating_sub(others))
        .unwrap_or(usize::MAX)
        .clamp(1, cfg.max_connections);
    tracing::warn!(
        open_files = soft,
        hard_limit = hard,
        wanted,
        max_connections = lowered,
        "the open-file limit (RLIMIT_NOFILE, LimitNOFILE in systemd) cannot carry {} ({}) plus the pools and outbound connections ({others}): the public listener takes at most {lowered}; raise the limit to {wanted}",
        setting::FENCEHOOK_MAX_CONNECTIONS,
        cfg.max_connections
    );
    lowered
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Bind { addr, source })
}
