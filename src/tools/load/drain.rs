//! After an inbox-mode load: wait until the workers have finished every event
//! of the run (done or dead), bounded by `--drain-timeout`, and take the
//! figures of the drain from the `events` table
//! ([`fencehook::store::drain`]).
//!
//! The wait polls one count; the figures (drain rate, lag percentiles) are
//! computed once at the end, in SQL, from the events' own timestamps, so how
//! often the tool looked does not change them.

use std::future::Future;
use std::time::Duration;

use fencehook::store::drain::{RunEvents, RunFigures};
use serde::Serialize;
use tokio::time::Instant;

use super::Plan;

/// How often the wait counts the run's unfinished events.
const POLL: Duration = Duration::from_millis(250);

/// How the wait for the drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainEnd {
    /// Every event of the run is done or dead.
    Drained,
    /// `--drain-timeout` passed with events still queued or processing.
    Timeout,
    /// Stopped from outside (Ctrl-C), or the load itself was.
    Interrupted,
    /// The database could not be read; see `error`.
    Error,
}

impl DrainEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainEnd::Drained => "drained",
            DrainEnd::Timeout => "timed out",
            DrainEnd::Interrupted => "interrupted",
            DrainEnd::Error => "error",
        }
    }
}

/// Percentiles of `finished_at - received_at` over the run's finished
/// events, ms (interpolated by `percentile_cont`; `max_ms` is exact).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LagMs {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// What the workers did with the run's events.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drain {
    pub ended: DrainEnd,
    /// From the end of the load to the end of the wait.
    pub waited_secs: f64,
    pub drain_timeout_secs: f64,
    /// Events of the run (`load-<run-id>-*`) in the `events` table.
    pub events: u64,
    /// Distinct transactions among them.
    pub transactions: u64,
    pub done: u64,
    pub dead: u64,
    /// Still queued or processing when the wait ended (0 when drained).
    pub unfinished: u64,
    /// From the first acceptance to the last finish (`min(received_at)` to
    /// `max(finished_at)`).
    pub span_secs: Option<f64>,
    /// Events finished (done or dead) per second over `span_secs`.
    pub drain_rate: Option<f64>,
    pub lag: Option<LagMs>,
    /// Why the database could not be read.
    pub error: Option<String>,
}

impl Drain {
    /// The drain as these figures show it.
    pub fn new(
        figures: &RunFigures,
        ended: DrainEnd,
        waited: Duration,
        timeout: Duration,
    ) -> Drain {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let finished = figures.finished();
        Drain {
            ended,
            waited_secs: waited.as_secs_f64(),
            drain_timeout_secs: timeout.as_secs_f64(),
            events: count(figures.events),
            transactions: count(figures.transactions),
            done: count(figures.done),
            dead: count(figures.dead),
            unfinished: count(figures.unfinished()),
            span_secs: figures.span_secs,
            drain_rate: figures
                .span_secs
                .filter(|secs| *secs > 0.0)
                .map(|secs| finished as f64 / secs),
            lag: figures.lag.map(|l| LagMs {
                p50_ms: l.p50 * 1000.0,
                p90_ms: l.p90 * 1000.0,
                p99_ms: l.p99 * 1000.0,
                max_ms: l.max * 1000.0,
            }),
            error: None,
        }
    }

    fn failed(
        error: &(dyn std::error::Error + 'static),
        waited: Duration,
        timeout: Duration,
    ) -> Drain {
        let mut d = Drain::new(&RunFigures::default(), DrainEnd::Error, waited, timeout);
        d.error = Some(fencehook::report::chain(error));
        d
    }
}

/// Waits until no event of the run is queued or processing, `timeout`
/// passes, or `stop` resolves; then takes the figures. Never fails: a
/// database that cannot be read gives a [`DrainEnd::Error`] drain, which the
/// report counts as a problem.
pub async fn wait(
    plan: &Plan,
    url: &str,
    timeout: Duration,
    stop: impl Future<Output = ()>,
    progress: bool,
) -> Drain {
    let started = Instant::now();
    let deadline = started + timeout;
    let events = match RunEvents::connect(url, &plan.provider, &plan.transaction_prefix()).await {
        Ok(events) => events,
        Err(e) => return Drain::failed(&e, started.elapsed(), timeout),
    };
    tokio::pin!(stop);
    let mut next_progress = started + Duration::from_secs(1);
    let ended = loop {
        let now = Instant::now();
        match events.unfinished().await {
            Err(e) => return Drain::failed(&e, started.elapsed(), timeout),
            Ok(0) => break DrainEnd::Drained,
            Ok(unfinished) => {
                if progress && now >= next_progress {
                    eprintln!(
                        "load: drain {:>4.0}s  {unfinished} event(s) queued or processing",
                        now.duration_since(started).as_secs_f64()
                    );
                    next_progress += Duration::from_secs(1);
                }
            }
        }
        // `stop` first: after an interrupted load it is ready at once, and
        // the drain is then only looked at, whatever the deadline.
        tokio::select! {
            biased;
            () = &mut stop => break DrainEnd::Interrupted,
            () = tokio::time::sleep_until((now + POLL).min(deadline)) => {}
        }
        if now >= deadline {
            break DrainEnd::Timeout;
        }
    };
    let waited = started.elapsed();
    match events.figures().await {
        Ok(figures) => Drain::new(&figures, ended, waited, timeout),
        Err(e) => Drain::failed(&e, waited, timeout),
    }
}
