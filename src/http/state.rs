//! What the public listener's handlers share. Built by `App::build`; the HTTP
//! edge reads it and never reaches back into the app.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::log_sample::LogSampler;
use crate::delivery::Deliveries;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::providers::{InForce, Provider};

pub struct State {
    /// The providers by name; replaced whole when SIGHUP re-reads the
    /// providers file (a delivery keeps the provider it looked up). Shared
    /// with the scheduled reconciliation ([`State::providers_in_force`]).
    providers: InForce,
    /// Where verified items go to be booked (or stored, in inbox mode).
    pub deliveries: Deliveries,
    pub metrics: Metrics,
    pub health: Arc<Health>,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Longest the whole body may take to arrive.
    pub body_timeout: Duration,
    /// Budgets of the log lines for refused deliveries.
    pub log_sample: LogSampler,
    /// Bounds deliveries processed at once; a delivery that finds no permit is answered 503.
    pub inflight: Semaphore,
    /// The operator console, when a token file is configured (set once,
    /// before the admin listener serves).
    console: std::sync::OnceLock<crate::console::Console>,
    /// The answers and refusals of late, for the console.
    pub recent: crate::console::recent::Recent,
    /// Where answered items are recorded (`FENCEHOOK_DELIVERY_HISTORY`).
    pub history: crate::history::History,
    listening: AtomicBool,
    draining: AtomicBool,
}

/// The bounds a delivery is held to (see [`State`]).
pub struct RequestLimits {
    pub max_body_bytes: usize,
    pub body_timeout: Duration,
    pub max_inflight: usize,
}

impl State {
    pub fn new(
        providers: InForce,
        deliveries: Deliveries,
        metrics: Metrics,
        health: Arc<Health>,
        history: crate::history::History,
        limits: RequestLimits,
    ) -> State {
        let RequestLimits {
            max_body_bytes,
            body_timeout,
            max_inflight,
        } = limits;
        State {
            providers: counting_fetches(providers, &metrics),
            deliveries,
            metrics,
            health,
            max_body_bytes,
            body_timeout,
            log_sample: LogSampler::new(),
            inflight: Semaphore::new(max_inflight),
            console: Default::default(),
            recent: Default::default(),
            history,
            listening: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        }
    }

    /// Serves the operator console (`None`: `/console` stays 404). Only the
    /// first call counts.
    pub fn serve_console(&self, console: Option<crate::console::Console>) {
        if let Some(console) = console {
            let _ = self.console.set(console);
        }
    }

    /// The operator console, when it is served.
    pub fn console(&self) -> Option<&crate::console::Console> {
        self.console.get()
    }

    /// The provider served at `/webhooks/{name}`.
    pub fn provider(&self, name: &str) -> Option<Arc<Provider>> {
        self.providers.get(name)
    }

    /// The providers in force, as a handle that sees each reload.
    pub fn providers_in_force(&self) -> InForce {
        self.providers.clone()
    }

    /// Replaces every provider at once (secret rotation without a restart).
    pub fn replace_providers(&self, providers: Vec<Provider>) {
        for p in &providers {
            count_fetches(p, &self.metrics);
        }
        self.providers.replace(providers);
    }

    /// Once the public listener is bound: before it, readiness fails (a
    /// delivery routed here would find no listener; the admin listener and
    /// the schema can be ready first, while the start's migration step runs).
    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    pub fn start_listening(&self) {
        self.listening.store(true, Ordering::Relaxed);
    }

    /// After shutdown was asked for: readiness fails, new items answer 503.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }
}

/// The providers, each one that fetches from its PSP counting its fetches
/// into this service's metrics.
fn counting_fetches(providers: InForce, metrics: &Metrics) -> InForce {
    for p in providers.all() {
        count_fetches(&p, metrics);
    }
    providers
}

fn count_fetches(p: &Provider, metrics: &Metrics) {
    if let Some(fetcher) = p.fetcher() {
        fetcher.count_into(metrics.fetches(&p.name));
    }
}
