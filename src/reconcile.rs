//! Reconciliation: every payment that happened at the PSP is booked here
//! exactly once, whether or not its webhook arrived.
//!
//! A run lists one provider's events in a window through its PSP's API
//! ([`Provider::list_events`]: Stripe's events, PayPal's webhook events)
//! and hands each, mapped by the scheme's own mapping, to the delivery room
//! ([`Deliveries::book`]) exactly as a webhook of it would be: the rule
//! table, the lease, the fence, the downstream or the inbox. An event and
//! its webhook are one event, so whichever comes second is a duplicate
//! (`known`), and a live retry racing a run books once: the lease and the
//! fence decide, not the runner.
//!
//! What must stay true:
//!
//! - Nothing is overwritten: what a webhook of the event would be answered
//!   422 (`payload_mismatch`, `refund_rejected`) is `divergent`, written
//!   nowhere but the run's findings.
//! - One runner per provider at a time, across instances and CLI runs (the
//!   store's advisory lock, [`Store::try_lock_reconcile`]); a dry run takes
//!   it too, so its answer is not raced by a run's.
//! - A run uses the PSP's API through its own bounded fetcher and books
//!   through the same pool as deliveries, one event at a time: a stalled or
//!   failing API stalls the run, never a delivery.
//! - Only a completed scheduled run moves the provider's cursor.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use crate::delivery::{Deliveries, Fate, Received};
use crate::domain::CanonicalEvent;
use crate::metrics::Metrics;
use crate::processor::Outcome;
use crate::providers::{ApiError, EventsApi, Item, Listed, Provider, Window};
use crate::store::inbox::Accepted;
use crate::store::reconcile::{Counts, Finding, RunRecord, Trigger};
use crate::store::Store;

/// Tries of one event whose transaction another holder is booking (a
/// webhook racing the run) before it is counted refused.
const BUSY_TRIES: u32 = 20;
/// Tries of one event the database did not take before the run fails.
const UNAVAILABLE_TRIES: u32 = 3;
/// The wait between tries of an event the database did not take.
const UNAVAILABLE_WAIT: Duration = Duration::from_millis(500);

/// The runner: the rooms a run books through.
#[derive(Clone)]
pub struct Reconciler {
    deliveries: Arc<Deliveries>,
    store: Store,
    metrics: Metrics,
}

/// How a run is asked for.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    pub window: Window,
    pub trigger: Trigger,
    /// Writes nothing: says what it would book.
    pub dry_run: bool,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Every listed event was looked at.
    Completed,
    /// The scheme has no events API.
    NoEventsApi,
    /// The provider has no credentials for its PSP's API.
    NoCredentials,
    /// Another runner holds the provider.
    Busy,
    /// The PSP's API (or the database) failed the run: `reason` is the
    /// metric's label.
    Failed { reason: &'static str, why: String },
}

/// One provider's run: how it ended, what it counted and found.
#[derive(Debug, Clone)]
pub struct Report {
    pub provider: String,
    pub window: Window,
    pub ending: Ending,
    pub counts: Counts,
    pub findings: Vec<Finding>,
    /// A dry run: the events it would book (PSP event id, transaction id).
    pub would_book: Vec<(String, String)>,
}

impl Report {
    fn new(provider: &Provider, window: Window, ending: Ending) -> Report {
        Report {
            provider: provider.name.clone(),
            window,
            ending,
            counts: Counts::default(),
            findings: Vec::new(),
            would_book: Vec::new(),
        }
    }

    /// The exit code it asks for: 2 for a configuration or API error, 1 for
    /// a divergence, 0 otherwise ("no events API" included).
    pub fn exit_code(&self) -> u8 {
        match self.ending {
            Ending::Failed { .. } | Ending::NoCredentials | Ending::Busy => 2,
            _ if self.counts.divergent > 0 => 1,
            _ => 0,
        }
    }
}

/// What became of one listed event's item.
enum Verdict {
    Known,
    Recovered,
    Ignored,
    Stale,
    Refused(String),
    Divergent(String),
    /// Another holder has its transaction: try again after this long.
    Busy(Duration),
    /// The database did not take it now.
    Unavailable,
}

impl Reconciler {
    pub fn new(deliveries: Arc<Deliveries>, store: Store, metrics: Metrics) -> Reconciler {
        Reconciler {
            deliveries,
            store,
            metrics,
        }
    }

    /// The store runs are recorded in (the schedule reads its cursors).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// One run of `provider`: listed, booked (unless a dry run), recorded
    /// (unless a dry run), counted in the metrics.
    pub async fn run(&self, provider: &Provider, ask: Ask) -> Report {
        match provider.events_api() {
            EventsApi::None => return Report::new(provider, ask.window, Ending::NoEventsApi),
            EventsApi::NoCredentials => {
                return Report::new(provider, ask.window, Ending::NoCredentials)
            }
            EventsApi::Ready => {}
        }
        let lock = match self.store.try_lock_reconcile(&provider.name).await {
            Ok(Some(lock)) => lock,
            Ok(None) => return Report::new(provider, ask.window, Ending::Busy),
            Err(e) => {
                let ending = failed("database", crate::report::chain(&e));
                return self
                    .finish(
                        provider,
                        ask,
                        OffsetDateTime::now_utc(),
                        Report::new(provider, ask.window, ending),
                    )
                    .await;
            }
        };
        let started_at = OffsetDateTime::now_utc();
        let report = self.listed_and_booked(provider, ask).await;
        let report = self.finish(provider, ask, started_at, report).await;
        lock.release().await;
        report
    }

    async fn listed_and_booked(&self, provider: &Provider, ask: Ask) -> Report {
        let mut report = Report::new(provider, ask.window, Ending::Completed);
        let listed = match provider.list_events(ask.window).await {
            Ok(listed) => listed,
            Err(ApiError { failure, why }) => {
                report.ending = failed(failure.as_str(), why);
                return report;
            }
        };
        // Oldest first: a payment is booked before the refunds of it.
        for event in &listed {
            report.counts.listed += 1;
            if let Err(ending) = self.one(provider, event, ask.dry_run, &mut report).await {
                report.ending = ending;
                break;
            }
        }
        report
    }

    /// Every item of one listed event, counted in `report`.
    async fn one(
        &self,
        provider: &Provider,
        event: &Listed,
        dry_run: bool,
        report: &mut Report,
    ) -> Result<(), Ending> {
        let items = match provider.map_listed(event) {
            Ok(items) => items,
            Err(reject) => {
                report.counts.refused += 1;
                report
                    .findings
                    .push(finding(event, None, "refused", Some(reject.to_string())));
                return Ok(());
            }
        };
        for item in items {
            let transaction_id = match &item {
                Item::Event(ev) | Item::CancelOrRefund(ev) => Some(ev.transaction_id.clone()),
                _ => None,
            };
            let verdict = if dry_run {
                self.would(provider, &item).await
            } else {
                self.book(provider, event, item).await
            };
            let verdict = verdict.map_err(|why| failed("database", why))?;
            let c = &mut report.counts;
            match verdict {
                Verdict::Known => c.known += 1,
                Verdict::Ignored => c.ignored += 1,
                Verdict::Stale => {
                    c.ignored += 1;
                    c.stale += 1;
                }
                Verdict::Recovered => {
                    c.recovered += 1;
                    let tx = transaction_id.clone().unwrap_or_default();
                    if dry_run {
                        report.would_book.push((event.id.clone(), tx));
                    } else {
                        report
                            .findings
                            .push(finding(event, transaction_id, "recovered", None));
                    }
                }
                Verdict::Refused(why) => {
                    c.refused += 1;
                    report
                        .findings
                        .push(finding(event, transaction_id, "refused", Some(why)));
                }
                Verdict::Divergent(why) => {
                    c.divergent += 1;
                    tracing::warn!(provider = %provider.name, psp_event_id = %event.id,
                        transaction_id = transaction_id.as_deref().unwrap_or("-"), reason = %why,
                        "reconcile: the PSP's event contradicts what is booked; nothing written");
                    report
                        .findings
                        .push(finding(event, transaction_id, "divergent", Some(why)));
                }
                Verdict::Busy(_) | Verdict::Unavailable => unreachable!("retried by book"),
            }
        }
        Ok(())
    }

    /// Books one item as a delivery of its event would be, trying again
    /// while a webhook of it holds its transaction; the error says why the
    /// database did not take it.
    async fn book(
        &self,
        provider: &Provider,
        event: &Listed,
        item: Item,
    ) -> Result<Verdict, String> {
        let body = String::from_utf8_lossy(&event.body);
        let (mut busy, mut unavailable) = (0, 0);
        loop {
            let received = Received {
                psp_event_id: Some(&event.id),
                body: &body,
                draining: false,
            };
            let handled = self
                .deliveries
                .book(provider, vec![item.clone()], received)
                .await
                .pop()
                .expect("one fate per item");
            match verdict_of(handled.fate) {
                Verdict::Busy(wait) if busy < BUSY_TRIES => {
                    busy += 1;
                    tokio::time::sleep(wait.max(Duration::from_millis(50))).await;
                }
                Verdict::Busy(_) => return Ok(Verdict::Refused("in_progress".into())),
                Verdict::Unavailable if unavailable < UNAVAILABLE_TRIES => {
                    unavailable += 1;
                    tokio::time::sleep(UNAVAILABLE_WAIT).await;
                }
                Verdict::Unavailable => {
                    return Err(format!(
                        "event {}: not booked after {UNAVAILABLE_TRIES} tries (the database, the lease or the downstream)",
                        event.id
                    ))
                }
                verdict => return Ok(verdict),
            }
        }
    }

    /// What booking one item would do, writing nothing: only whether its
    /// object is booked here yet (no lease is taken, so a dry run cannot
    /// say what the rule table would make of an object that is).
    async fn would(&self, provider: &Provider, item: &Item) -> Result<Verdict, String> {
        let ev: &CanonicalEvent = match item {
            Item::Event(ev) | Item::CancelOrRefund(ev) => ev,
            Item::Ignored { .. } => return Ok(Verdict::Ignored),
            Item::Unmappable { reason, .. } => return Ok(Verdict::Refused(reason.clone())),
        };
        let row = self
            .store
            .lookup(&provider.name, &ev.transaction_id)
            .await
            .map_err(|e| crate::report::chain(&e))?;
        Ok(match row {
            None => Verdict::Recovered,
            Some(_) => Verdict::Known,
        })
    }

    /// Records the run (unless a dry run) and counts it in the metrics.
    async fn finish(
        &self,
        provider: &Provider,
        ask: Ask,
        started_at: OffsetDateTime,
        mut report: Report,
    ) -> Report {
        if !ask.dry_run {
            let error = match &report.ending {
                Ending::Failed { why, .. } => Some(why.as_str()),
                _ => None,
            };
            let record = RunRecord {
                provider: &provider.name,
                trigger: ask.trigger,
                started_at,
                since: ask.window.since,
                until: ask.window.until,
                counts: &report.counts,
                findings: &report.findings,
                error,
            };
            if let Err(e) = self.store.record_reconcile_run(&record).await {
                if report.ending == Ending::Completed {
                    report.ending = failed(
                        "database",
                        format!("recording the run: {}", crate::report::chain(&e)),
                    );
                }
            }
        }
        self.count(&report, ask.dry_run);
        report
    }

    /// The run in the metrics: its events by result, its error, its success.
    fn count(&self, report: &Report, dry_run: bool) {
        let m = &self.metrics;
        let p = report.provider.as_str();
        if !dry_run {
            let c = &report.counts;
            for (result, n) in [
                ("known", c.known),
                ("recovered", c.recovered),
                ("ignored", c.ignored),
                ("refused", c.refused),
                ("divergent", c.divergent),
            ] {
                if n > 0 {
                    m.reconcile_events(p, result).increment(n as u64);
                }
            }
        }
        match &report.ending {
            Ending::Completed if !dry_run => m
                .reconcile_last_success(p)
                .set(OffsetDateTime::now_utc().unix_timestamp() as f64),
            Ending::Failed { reason, why } => {
                m.reconcile_errors(p, reason).increment(1);
                tracing::error!(provider = %p, reason = %reason, error = %why, "reconcile run failed");
            }
            _ => {}
        }
    }
}

/// The results [`Reconciler`] counts events by.
pub const RESULTS: &[&str] = &["known", "recovered", "ignored", "refused", "divergent"];
/// The reasons a run fails by: the API's ([`crate::providers::ApiFailure`]) and the database.
pub const ERROR_REASONS: &[&str] = &[
    "credentials",
    "rate_limited",
    "timeout",
    "unavailable",
    "status",
    "malformed",
    "database",
];

/// Registers the reconciliation's series of every provider at start, the
/// counters at zero (as every counter is) and the last-success gauge at 0
/// ("never"; the alert reads only the ones above 0), so the dashboard and
/// the alerts find them before a first run.
pub fn register_metrics(metrics: &Metrics, providers: &[Provider]) {
    for p in providers {
        for result in RESULTS {
            metrics.reconcile_events(&p.name, result).increment(0);
        }
        for reason in ERROR_REASONS {
            metrics.reconcile_errors(&p.name, reason).increment(0);
        }
        metrics.reconcile_last_success(&p.name).increment(0.0);
    }
}

fn failed(reason: &'static str, why: String) -> Ending {
    Ending::Failed { reason, why }
}

fn finding(
    event: &Listed,
    transaction_id: Option<String>,
    result: &'static str,
    reason: Option<String>,
) -> Finding {
    Finding {
        psp_event_id: event.id.clone(),
        transaction_id,
        result,
        reason,
    }
}

/// What a delivery's fate means for the run.
fn verdict_of(fate: Fate) -> Verdict {
    match fate {
        Fate::Ignored => Verdict::Ignored,
        Fate::Quarantined => Verdict::Refused("quarantined".into()),
        Fate::Stored(Accepted::New) => Verdict::Recovered,
        Fate::Stored(Accepted::Duplicate) => Verdict::Known,
        Fate::Stored(Accepted::Mismatch) => Verdict::Divergent("payload_mismatch".into()),
        Fate::Processed(outcome) => match outcome {
            Outcome::Processed { .. } => Verdict::Recovered,
            Outcome::Duplicate => Verdict::Known,
            Outcome::Stale => Verdict::Stale,
            Outcome::PayloadMismatch => Verdict::Divergent("payload_mismatch".into()),
            Outcome::RefundRejected(why) => {
                Verdict::Divergent(format!("refund_rejected: {}", why.as_str()))
            }
            Outcome::AwaitingPayment => Verdict::Refused("awaiting_payment".into()),
            Outcome::InProgress { retry_after } => Verdict::Busy(retry_after),
            Outcome::LeaseLost { .. } => Verdict::Busy(Duration::ZERO),
        },
        Fate::Unavailable => Verdict::Unavailable,
    }
}

/// The scheduled runs of `serve` and `work`: what they run with.
pub struct Schedule {
    pub reconciler: Reconciler,
    /// The providers in force, read at each run: one given API credentials
    /// and reloaded (SIGHUP) is reconciled from the next run on.
    pub providers: crate::providers::InForce,
    pub cfg: crate::config::reconcile::ReconcileConfig,
    pub every: Duration,
}

impl Schedule {
    /// Every `every`, each provider in turn from its cursor minus the
    /// overlap (a first run: now minus the look-back) to now minus the
    /// settle delay. A provider another runner holds is skipped this time.
    /// Runs until the task is dropped; a run in flight then stops where it
    /// is (its lock goes with its connection, and what it booked is booked).
    pub async fn run(self) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut scheduled = std::collections::HashSet::new();
        loop {
            tick.tick().await;
            for provider in self.providers.all() {
                if provider.events_api() != EventsApi::Ready {
                    continue;
                }
                if !scheduled.contains(&provider.name) {
                    // From its first sight on, a provider whose runs never
                    // complete is alerted on two intervals later, as one
                    // whose runs stopped would be.
                    let now = OffsetDateTime::now_utc().unix_timestamp() as f64;
                    self.reconciler
                        .metrics
                        .reconcile_last_success(&provider.name)
                        .set(now);
                    scheduled.insert(provider.name.clone());
                }
                let provider = &*provider;
                let Some(window) = self.window(provider).await else {
                    continue;
                };
                let ask = Ask {
                    window,
                    trigger: Trigger::Scheduled,
                    dry_run: false,
                };
                let report = self.reconciler.run(provider, ask).await;
                match &report.ending {
                    Ending::Completed => tracing::info!(provider = %provider.name,
                        listed = report.counts.listed, known = report.counts.known,
                        recovered = report.counts.recovered, divergent = report.counts.divergent,
                        "reconcile run completed"),
                    Ending::Busy => tracing::debug!(provider = %provider.name,
                        "reconcile: another runner has the provider; skipped"),
                    _ => {}
                }
            }
        }
    }

    /// The next window of `provider`; `None` when there is none yet (the
    /// cursor is within the settle delay of now) or the cursor cannot be read.
    async fn window(&self, provider: &Provider) -> Option<Window> {
        let now = OffsetDateTime::now_utc();
        let until = now - self.cfg.settle;
        let since = match self.reconciler.store.reconcile_cursor(&provider.name).await {
            Ok(Some(cursor)) => cursor - self.cfg.overlap,
            Ok(None) => now - self.cfg.lookback,
            Err(e) => {
                self.reconciler
                    .metrics
                    .reconcile_errors(&provider.name, "database")
                    .increment(1);
                tracing::error!(provider = %provider.name, error = %crate::report::chain(&e),
                    "reconcile: cannot read the cursor; the run is skipped");
                return None;
            }
        };
        (since < until).then_some(Window { since, until })
    }
}
