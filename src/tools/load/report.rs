//! What a load run saw: the collector every delivery reports to, and the
//! report it becomes (a table or one JSON object).
//!
//! One task owns all the numbers and the answers file, fed by a channel, so
//! the delivery tasks share no locks and the aggregation is plain code that a
//! test can drive event by event.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use super::drain::{Drain, DrainEnd};
use super::Plan;
use crate::tools::answers::{AnswerRecord, ACCEPTED, UNLABELLED_SUCCESS};

/// Highest latency the histogram holds, in µs (the longest request timeout;
/// longer values are clamped, and they time out anyway).
const LATENCY_MAX_US: u64 = 120_000_000;

/// The answer one HTTP request got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    Http {
        status: u16,
        /// The `result` field of the body (`-` when there is none).
        result: String,
        /// From sending the request to the last byte of the body.
        latency_us: u64,
    },
    /// No complete answer within `--request-timeout`.
    Timeout,
    /// No answer: connection refused or reset, and the like.
    Error(String),
}

impl Answer {
    fn status(&self) -> Option<u16> {
        match self {
            Answer::Http { status, .. } => Some(*status),
            Answer::Timeout | Answer::Error(_) => None,
        }
    }

    fn result(&self) -> &str {
        match self {
            Answer::Http { result, .. } => result,
            Answer::Timeout => "timeout",
            Answer::Error(_) => "transport_error",
        }
    }

    fn is_200(&self) -> bool {
        self.status() == Some(200)
    }

    fn is_2xx(&self) -> bool {
        matches!(self.status(), Some(200..=299))
    }
}

/// How one delivery (one copy of a transaction) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Delivery {
    /// The last answer: the one the sender acts on.
    pub answer: Answer,
    pub retries: u32,
}

/// What delivery tasks tell the collector.
#[derive(Debug)]
pub(super) enum Event {
    /// A transaction's copies were started.
    Launched { deliveries: usize },
    /// One HTTP request ended; `retried` when the delivery will try again.
    Response {
        target: usize,
        answer: Answer,
        retried: bool,
    },
    /// Every copy of a transaction has its final answer.
    Transaction {
        transaction_id: String,
        deliveries: Vec<Delivery>,
    },
}

/// Why launching stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `--transactions` were all launched.
    Transactions,
    /// `--duration` passed.
    Duration,
    /// Stopped from outside (Ctrl-C).
    Interrupted,
}

impl StopReason {
    fn as_str(self) -> &'static str {
        match self {
            StopReason::Transactions => "transactions",
            StopReason::Duration => "duration",
            StopReason::Interrupted => "interrupted",
        }
    }
}

/// The answers file: one [`AnswerRecord`] line per final answer.
///
/// Written from the collector task with plain buffered writes: a line is a
/// few dozen bytes into an 8 KiB buffer, so the task blocks on a write(2) to
/// the page cache once per ~100 deliveries, which is not worth a blocking pool.
pub(super) struct AnswerWriter {
    path: String,
    out: Option<BufWriter<File>>,
    lines: u64,
    error: Option<String>,
}

impl AnswerWriter {
    pub(super) fn create(path: &Path) -> std::io::Result<AnswerWriter> {
        Ok(AnswerWriter {
            path: path.display().to_string(),
            out: Some(BufWriter::new(File::create(path)?)),
            lines: 0,
            error: None,
        })
    }

    /// Writes one line. After the first failure the file is incomplete and
    /// writing stops; the report says so and the run counts as failed,
    /// because an audit of a partial file would prove less than it claims.
    fn write(&mut self, record: &AnswerRecord) {
        let Some(out) = &mut self.out else { return };
        let written = serde_json::to_writer(&mut *out, record)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
        match written {
            Ok(()) => self.lines += 1,
            Err(e) => self.fail(e),
        }
    }

    fn finish(&mut self) {
        if let Some(mut out) = self.out.take() {
            if let Err(e) = out.flush() {
                self.fail(e);
            }
        }
    }

    fn fail(&mut self, e: std::io::Error) {
        self.error = Some(e.to_string());
        self.out = None;
    }
}

/// Status and result of an answer: the key the answers are counted by.
type AnswerKey = (Option<u16>, String);

/// Everything the collector counts.
pub(super) struct Stats {
    provider: String,
    /// Per answered HTTP request, µs, 3 significant digits (±0.1%).
    latency: Histogram<u64>,
    /// Exact slowest answer, µs: the histogram only knows its bucket.
    latency_max_us: u64,
    launched_transactions: u64,
    launched_deliveries: u64,
    requests: u64,
    requests_per_target: Vec<u64>,
    retries: u64,
    /// Final answers, one per delivery.
    finals: BTreeMap<AnswerKey, u64>,
    /// Answers that were followed by a retry.
    retried: BTreeMap<AnswerKey, u64>,
    deliveries: u64,
    deliveries_200: u64,
    /// Final answers 2xx: in inbox mode, the deliveries accepted.
    deliveries_2xx: u64,
    first_try_200: u64,
    transactions: u64,
    /// Transactions with at least one delivery ended 200.
    payments: u64,
    /// Transactions answered `processed` more than once: exactly-once broken
    /// as the sender sees it.
    processed_twice: u64,
    /// Transactions answered `accepted` more than once: one event stored
    /// twice, as the sender sees it (inbox mode).
    accepted_twice: u64,
    /// Deliveries answered 2xx without a result (the PSP's own `success`):
    /// whether one was booked or a duplicate, the sender cannot see.
    unlabelled_2xx: u64,
    first_error: Option<String>,
    answers: Option<AnswerWriter>,
}

impl Stats {
    pub(super) fn new(targets: usize, provider: String, answers: Option<AnswerWriter>) -> Stats {
        Stats {
            provider,
            latency: Histogram::new_with_bounds(1, LATENCY_MAX_US, 3)
                .expect("constant histogram bounds are valid"),
            latency_max_us: 0,
            launched_transactions: 0,
            launched_deliveries: 0,
            requests: 0,
            requests_per_target: vec![0; targets],
            retries: 0,
            finals: BTreeMap::new(),
            retried: BTreeMap::new(),
            deliveries: 0,
            deliveries_200: 0,
            deliveries_2xx: 0,
            first_try_200: 0,
            transactions: 0,
            payments: 0,
            processed_twice: 0,
            accepted_twice: 0,
            unlabelled_2xx: 0,
            first_error: None,
            answers,
        }
    }

    pub(super) fn record(&mut self, event: Event) {
        match event {
            Event::Launched { deliveries } => {
                self.launched_transactions += 1;
                self.launched_deliveries += deliveries as u64;
            }
            Event::Response {
                target,
                answer,
                retried,
            } => {
                self.requests += 1;
                if let Some(n) = self.requests_per_target.get_mut(target) {
                    *n += 1;
                }
                match &answer {
                    Answer::Http { latency_us, .. } => {
                        self.latency.saturating_record((*latency_us).max(1));
                        self.latency_max_us = self.latency_max_us.max(*latency_us);
                    }
                    Answer::Timeout => {}
                    Answer::Error(e) => {
                        if self.first_error.is_none() {
                            self.first_error = Some(e.clone());
                        }
                    }
                }
                if retried {
                    self.retries += 1;
                    *self
                        .retried
                        .entry((answer.status(), answer.result().to_owned()))
                        .or_default() += 1;
                }
            }
            Event::Transaction {
                transaction_id,
                deliveries,
            } => self.record_transaction(transaction_id, deliveries),
        }
    }

    fn record_transaction(&mut self, transaction_id: String, deliveries: Vec<Delivery>) {
        self.transactions += 1;
        let mut any_200 = false;
        let mut processed = 0;
        let mut accepted = 0;
        for d in &deliveries {
            self.deliveries += 1;
            *self
                .finals
                .entry((d.answer.status(), d.answer.result().to_owned()))
                .or_default() += 1;
            if d.answer.is_2xx() {
                self.deliveries_2xx += 1;
                match d.answer.result() {
                    ACCEPTED => accepted += 1,
                    UNLABELLED_SUCCESS => self.unlabelled_2xx += 1,
                    _ => {}
                }
            }
            if d.answer.is_200() {
                any_200 = true;
                self.deliveries_200 += 1;
                if d.retries == 0 {
                    self.first_try_200 += 1;
                }
                if d.answer.result() == "processed" {
                    processed += 1;
                }
            }
        }
        self.payments += u64::from(any_200);
        self.processed_twice += u64::from(processed > 1);
        self.accepted_twice += u64::from(accepted > 1);
        if let Some(w) = &mut self.answers {
            for d in &deliveries {
                w.write(&AnswerRecord {
                    provider: self.provider.clone(),
                    transaction_id: transaction_id.clone(),
                    status: d.answer.status(),
                    result: d.answer.result().to_owned(),
                });
            }
        }
    }
}

/// Receives events until every sender is gone, printing one progress line
/// per second on stderr when `progress` is set.
pub(super) async fn collect(
    mut events: mpsc::UnboundedReceiver<Event>,
    mut stats: Stats,
    started: Instant,
    progress: bool,
) -> Stats {
    let second = Duration::from_secs(1);
    let mut tick = tokio::time::interval_at(started + second, second);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let (mut last_at, mut last_requests) = (started, 0);
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(event) => stats.record(event),
                None => break,
            },
            now = tick.tick(), if progress => {
                let window = now.duration_since(last_at).as_secs_f64().max(1e-3);
                eprintln!(
                    "load: {:>5.0}s  sent {}  ok {}  rps {:.0}",
                    now.duration_since(started).as_secs_f64(),
                    stats.launched_deliveries,
                    stats.deliveries_200,
                    (stats.requests - last_requests) as f64 / window,
                );
                (last_at, last_requests) = (now, stats.requests);
            }
        }
    }
    if let Some(w) = &mut stats.answers {
        w.finish();
    }
    stats
}

/// Latency of the answered HTTP requests, µs. Percentiles are HDR
/// histogram values (3 significant digits: within 0.1%); `max_us` is exact.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p99_9_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

/// How many answers had this status and result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AnswerCount {
    /// `null` when no HTTP answer came (timeout, transport error).
    pub status: Option<u16>,
    pub result: String,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TargetCount {
    pub target: String,
    pub requests: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AnswersFile {
    pub path: String,
    pub lines: u64,
    /// Set when writing failed: the file is incomplete.
    pub error: Option<String>,
}

/// The report of one run. Rates are over the whole run, from the first
/// launch until the last delivery in flight ended.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub run_id: String,
    pub provider: String,
    /// The scheme the deliveries were signed and shaped in.
    pub scheme: String,
    pub targets: Vec<String>,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub duplicates: usize,
    pub max_retries: u32,
    pub stopped_by: StopReason,
    pub elapsed_secs: f64,
    /// Transactions launched (and ended: the run waits for all of them).
    pub transactions: u64,
    /// Deliveries (copies) ended; a retry is not a new delivery.
    pub deliveries: u64,
    pub deliveries_per_sec: f64,
    /// Transactions with a delivery that ended 200.
    pub payments: u64,
    pub payments_per_sec: f64,
    /// Transactions where no copy ended 200 (all gave up or failed).
    pub transactions_without_200: u64,
    /// HTTP requests sent: deliveries plus retries.
    pub requests: u64,
    pub requests_per_sec: f64,
    pub retries: u64,
    /// Deliveries answered 200 on their first request.
    pub first_try_200: u64,
    pub first_try_200_share: f64,
    /// Transactions answered `processed` more than once (must be 0).
    pub processed_twice: u64,
    /// Deliveries answered 2xx whose body names no result (WeChat Pay's
    /// empty 200, Alipay's `success`, Adyen's `[accepted]`): processed or
    /// duplicate, the sender cannot tell, so `processed_twice` says nothing
    /// about them; `fencehook audit --answers` checks their rows.
    pub unlabelled_2xx: u64,
    pub latency: Latency,
    /// Final answers, one per delivery.
    pub answers: Vec<AnswerCount>,
    /// Answers that were followed by a retry.
    pub retried_answers: Vec<AnswerCount>,
    pub requests_per_target: Vec<TargetCount>,
    /// The first transport error, to say why requests failed.
    pub first_error: Option<String>,
    pub answers_file: Option<AnswersFile>,
    /// Inbox mode only (`--inbox`); absent from a sync run's JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbox: Option<InboxReport>,
}

/// What an inbox-mode run adds: the accept rate, and the drain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InboxReport {
    /// Deliveries whose final answer was 2xx (`accepted`, or `duplicate` for
    /// an event accepted before).
    pub accepted_deliveries: u64,
    /// `accepted_deliveries` per second over the run: the accept rate.
    pub accept_rate: f64,
    /// Deliveries answered `accepted` (one per event stored).
    pub accepted: u64,
    /// Transactions answered `accepted` more than once (must be 0).
    pub accepted_twice: u64,
    /// The drain; `None` without `--database-url`.
    pub drain: Option<Drain>,
}

fn per_sec(count: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

fn counts(map: BTreeMap<AnswerKey, u64>) -> Vec<AnswerCount> {
    map.into_iter()
        .map(|((status, result), count)| AnswerCount {
            status,
            result,
            count,
        })
        .collect()
}

impl Report {
    pub(super) fn new(
        plan: &Plan,
        stats: Stats,
        elapsed: Duration,
        stopped_by: StopReason,
        drain: Option<Drain>,
    ) -> Report {
        let secs = elapsed.as_secs_f64();
        let h = &stats.latency;
        // A bucket's upper edge can lie above the slowest answer; no
        // percentile is slower than the maximum.
        let at = |q: f64| h.value_at_quantile(q).min(stats.latency_max_us);
        let latency = Latency {
            count: h.len(),
            p50_us: at(0.50),
            p90_us: at(0.90),
            p99_us: at(0.99),
            p99_9_us: at(0.999),
            max_us: stats.latency_max_us,
            mean_us: if h.is_empty() { 0.0 } else { h.mean() },
        };
        let inbox = plan.inbox.then(|| InboxReport {
            accepted_deliveries: stats.deliveries_2xx,
            accept_rate: per_sec(stats.deliveries_2xx, secs),
            accepted: stats
                .finals
                .iter()
                .filter(|((status, result), _)| {
                    matches!(status, Some(200..=299)) && result == ACCEPTED
                })
                .map(|(_, n)| n)
                .sum(),
            accepted_twice: stats.accepted_twice,
            drain,
        });
        Report {
            run_id: plan.run_id.clone(),
            provider: plan.provider.clone(),
            scheme: plan.scheme.as_str().to_owned(),
            targets: plan.targets.clone(),
            concurrency: plan.concurrency,
            rate: plan.rate,
            duplicates: plan.duplicates,
            max_retries: plan.max_retries,
            stopped_by,
            elapsed_secs: secs,
            transactions: stats.transactions,
            deliveries: stats.deliveries,
            deliveries_per_sec: per_sec(stats.deliveries, secs),
            payments: stats.payments,
            payments_per_sec: per_sec(stats.payments, secs),
            transactions_without_200: stats.transactions - stats.payments,
            requests: stats.requests,
            requests_per_sec: per_sec(stats.requests, secs),
            retries: stats.retries,
            first_try_200: stats.first_try_200,
            first_try_200_share: if stats.deliveries == 0 {
                0.0
            } else {
                stats.first_try_200 as f64 / stats.deliveries as f64
            },
            processed_twice: stats.processed_twice,
            unlabelled_2xx: stats.unlabelled_2xx,
            latency,
            answers: counts(stats.finals),
            retried_answers: counts(stats.retried),
            requests_per_target: plan
                .targets
                .iter()
                .zip(&stats.requests_per_target)
                .map(|(t, n)| TargetCount {
                    target: t.clone(),
                    requests: *n,
                })
                .collect(),
            first_error: stats.first_error,
            answers_file: stats.answers.map(|w| AnswersFile {
                path: w.path,
                lines: w.lines,
                error: w.error,
            }),
            inbox,
        }
    }

    /// What makes this run a failure: a transaction answered `processed`
    /// twice, no payment at all (the run proved nothing), or an incomplete
    /// answers file (an audit of it would prove less than it claims).
    /// Other statuses are load results, not failures: an overloaded service
    /// answering 503 is what a load test is for.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.processed_twice > 0 {
            out.push(format!(
                "{} transaction(s) answered `processed` more than once",
                self.processed_twice
            ));
        }
        if self.payments == 0 {
            out.push("no transaction was answered 200".to_owned());
        }
        if let Some(AnswersFile {
            path,
            error: Some(e),
            ..
        }) = &self.answers_file
        {
            out.push(format!("the answers file {path} is incomplete: {e}"));
        }
        if let Some(inbox) = &self.inbox {
            out.extend(inbox.problems(self.payments));
        }
        out
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The human-readable table.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let ms = |us: u64| format!("{:.3}", us as f64 / 1000.0);
        let pct = |share: f64| format!("{:.2}%", share * 100.0);
        let rate = self
            .rate
            .map_or("unlimited".to_owned(), |r| format!("{r}/s"));
        let mode = if self.inbox.is_some() {
            " | inbox mode"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "fencehook load: run {} | provider {} ({}) | {} target(s) | concurrency {} | rate {rate} | k={} | max {} retries{mode}",
            self.run_id,
            self.provider,
            self.scheme,
            self.targets.len(),
            self.concurrency,
            self.duplicates,
            self.max_retries,
        );
        let _ = writeln!(
            o,
            "stopped by {} after {:.2} s (drain of deliveries in flight included)",
            self.stopped_by.as_str(),
            self.elapsed_secs
        );
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "  {:<26}{:>12}  {:>12}/s",
            "deliveries",
            thousands(self.deliveries),
            rate1(self.deliveries_per_sec)
        );
        if let Some(inbox) = &self.inbox {
            let _ = writeln!(
                o,
                "  {:<26}{:>12}  {:>12}/s   accept rate; {} answered `accepted`, {} transactions without a 2xx",
                "deliveries answered 2xx",
                thousands(inbox.accepted_deliveries),
                rate1(inbox.accept_rate),
                thousands(inbox.accepted),
                thousands(self.transactions_without_200)
            );
        } else {
            let _ = writeln!(
                o,
                "  {:<26}{:>12}  {:>12}/s   of {} transactions; {} without a 200",
                "payments (ended 200)",
                thousands(self.payments),
                rate1(self.payments_per_sec),
                thousands(self.transactions),
                thousands(self.transactions_without_200)
            );
        }
        let _ = writeln!(
            o,
            "  {:<26}{:>12}  {:>12}/s   {} of them retries",
            "HTTP requests",
            thousands(self.requests),
            rate1(self.requests_per_sec),
            thousands(self.retries)
        );
        let _ = writeln!(
            o,
            "  {:<26}{:>12}   ({} deliveries)",
            "200 without a retry",
            pct(self.first_try_200_share),
            thousands(self.first_try_200)
        );
        let _ = writeln!(o);
        let l = &self.latency;
        let _ = writeln!(
            o,
            "  latency per HTTP request, ms ({} answered requests)",
            thousands(l.count)
        );
        let _ = writeln!(
            o,
            "      {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "p50", "p90", "p99", "p99.9", "max", "mean"
        );
        let _ = writeln!(
            o,
            "      {:>10} {:>10} {:>10} {:>10} {:>10} {:>10.3}",
            ms(l.p50_us),
            ms(l.p90_us),
            ms(l.p99_us),
            ms(l.p99_9_us),
            ms(l.max_us),
            l.mean_us / 1000.0
        );
        let _ = writeln!(o);
        let _ = writeln!(o, "  final answers (one per delivery)");
        render_counts(&mut o, &self.answers);
        if !self.retried_answers.is_empty() {
            let _ = writeln!(o, "  answers followed by a retry");
            render_counts(&mut o, &self.retried_answers);
        }
        let _ = writeln!(o, "  requests per target");
        for t in &self.requests_per_target {
            let _ = writeln!(o, "      {:<32}{:>12}", t.target, thousands(t.requests));
        }
        if let Some(e) = &self.first_error {
            let _ = writeln!(o, "  first transport error: {e}");
        }
        if let Some(f) = &self.answers_file {
            let _ = writeln!(
                o,
                "  answers file: {} ({} lines){}",
                f.path,
                thousands(f.lines),
                f.error
                    .as_ref()
                    .map_or(String::new(), |e| format!(", INCOMPLETE: {e}"))
            );
        }
        if let Some(inbox) = &self.inbox {
            render_drain(&mut o, inbox.drain.as_ref());
        }
        let _ = writeln!(o);
        match &self.inbox {
            _ if self.unlabelled_2xx > 0 => {
                let _ = writeln!(
                    o,
                    "exactly-once cannot be seen by the sender: {} deliveries answered 2xx `{UNLABELLED_SUCCESS}` without a result label; `fencehook audit --answers` checks the rows",
                    thousands(self.unlabelled_2xx)
                );
            }
            None if self.processed_twice == 0 => {
                let _ = writeln!(
                    o,
                    "exactly-once, as the sender sees it: no transaction answered `processed` twice"
                );
            }
            Some(inbox) if inbox.accepted_twice == 0 => {
                let _ = writeln!(
                    o,
                    "stored once, as the sender sees it: no transaction answered `accepted` twice"
                );
            }
            _ => {}
        }
        for p in self.problems() {
            let _ = writeln!(o, "PROBLEM: {p}");
        }
        o
    }
}

impl InboxReport {
    /// What makes an inbox run a failure beyond a sync run's problems: an
    /// event stored twice as the sender sees it, and — when the drain was
    /// watched — a database that could not be read, events left unfinished
    /// at the timeout, dead events, or transactions answered 2xx (of
    /// `payments`) without an event.
    fn problems(&self, payments: u64) -> Vec<String> {
        let mut out = Vec::new();
        if self.accepted_twice > 0 {
            out.push(format!(
                "{} transaction(s) answered `accepted` more than once",
                self.accepted_twice
            ));
        }
        let Some(d) = &self.drain else { return out };
        if let Some(e) = &d.error {
            out.push(format!("could not read the run's events: {e}"));
            return out;
        }
        if d.ended == DrainEnd::Timeout {
            out.push(format!(
                "{} event(s) still queued or processing after --drain-timeout {}",
                d.unfinished,
                secs(d.drain_timeout_secs)
            ));
        }
        if d.dead > 0 {
            out.push(format!(
                "{} event(s) dead: the workers gave up on them (fencehook events --status dead)",
                d.dead
            ));
        }
        if d.transactions < payments {
            let hint = if d.events == 0 {
                " (do the targets run in inbox mode, on this database?)"
            } else {
                ""
            };
            out.push(format!(
                "{} transaction(s) answered 2xx have no event in the database{hint}",
                payments - d.transactions
            ));
        }
        out
    }
}

/// The drain section of an inbox run's table.
fn render_drain(o: &mut String, drain: Option<&Drain>) {
    let _ = writeln!(o);
    let Some(d) = drain else {
        let _ = writeln!(
            o,
            "  drain: not watched (give --database-url or {} to wait for the workers and report it)",
            fencehook::config::setting::DATABASE_URL
        );
        return;
    };
    if let Some(e) = &d.error {
        let _ = writeln!(o, "  drain: could not read the run's events: {e}");
        return;
    }
    let _ = writeln!(
        o,
        "  drain of the run's events ({} after the load, {} at most: {})",
        secs(d.waited_secs),
        secs(d.drain_timeout_secs),
        d.ended.as_str()
    );
    let _ = writeln!(
        o,
        "      {:<22}{:>12}   of {} transactions",
        "events",
        thousands(d.events),
        thousands(d.transactions)
    );
    let _ = writeln!(o, "      {:<22}{:>12}", "done", thousands(d.done));
    let _ = writeln!(o, "      {:<22}{:>12}", "dead", thousands(d.dead));
    let _ = writeln!(
        o,
        "      {:<22}{:>12}",
        "queued or processing",
        thousands(d.unfinished)
    );
    match (d.drain_rate, d.span_secs) {
        (Some(rate), Some(span)) => {
            let _ = writeln!(
                o,
                "      {:<22}{:>12}/s   {} finished in {}, first acceptance to last finish",
                "drain rate",
                rate1(rate),
                thousands(d.done + d.dead),
                secs(span)
            );
        }
        _ => {
            let _ = writeln!(o, "      {:<22}{:>12}", "drain rate", "-");
        }
    }
    match &d.lag {
        Some(l) => {
            let _ = writeln!(
                o,
                "      lag per finished event, ms (finished_at - received_at)"
            );
            let _ = writeln!(
                o,
                "      {:>10} {:>10} {:>10} {:>10}",
                "p50", "p90", "p99", "max"
            );
            let _ = writeln!(
                o,
                "      {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
            );
        }
        None => {
            let _ = writeln!(o, "      lag: no event finished");
        }
    }
}

/// Seconds with two decimals and a unit.
fn secs(s: f64) -> String {
    format!("{s:.2} s")
}

fn render_counts(o: &mut String, counts: &[AnswerCount]) {
    for c in counts {
        let status = c.status.map_or("---".to_owned(), |s| s.to_string());
        let _ = writeln!(
            o,
            "      {status} {:<24}{:>12}",
            c.result,
            thousands(c.count)
        );
    }
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate with one decimal and thousands separators.
fn rate1(r: f64) -> String {
    let tenths = (r * 10.0).round().max(0.0) as u64;
    format!("{}.{}", thousands(tenths / 10), tenths % 10)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencehook::store::drain::{LagSecs, RunFigures};

    fn ok(result: &str, latency_us: u64) -> Answer {
        Answer::Http {
            status: 200,
            result: result.to_owned(),
            latency_us,
        }
    }

    fn conflict() -> Answer {
        Answer::Http {
            status: 409,
            result: "in_progress".to_owned(),
            latency_us: 1_000,
        }
    }

    fn plan() -> Plan {
        plan_with(&[])
    }

    fn plan_with(extra: &[&str]) -> Plan {
        let mut argv = vec![
            "load",
            "--secret",
            "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM=",
            "--target",
            "http://127.0.0.1:1",
            "--target",
            "http://127.0.0.1:2",
            "--duplicates",
            "2",
            "--run-id",
            "t",
        ];
        argv.extend_from_slice(extra);
        let cli = <LoadCli as clap::Parser>::try_parse_from(argv).expect("flags parse");
        Plan::from_args(&cli.load).expect("valid")
    }

    fn inbox_plan() -> Plan {
        plan_with(&[
            "--inbox",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/db",
            "--drain-timeout",
            "30s",
        ])
    }

    /// Two transactions with k=2 against inbox-mode targets: the first
    /// accepted plus a duplicate; the second accepted after a 503 and a
    /// retry, its other copy timed out.
    fn inbox_sample() -> Stats {
        let mut s = Stats::new(2, "generic".to_owned(), None);
        let unavailable = Answer::Http {
            status: 503,
            result: "unavailable".to_owned(),
            latency_us: 500,
        };
        for e in [
            Event::Launched { deliveries: 2 },
            Event::Response {
                target: 0,
                answer: ok("accepted", 1_000),
                retried: false,
            },
            Event::Response {
                target: 1,
                answer: ok("duplicate", 1_500),
                retried: false,
            },
            Event::Transaction {
                transaction_id: "load-t-0".to_owned(),
                deliveries: vec![
                    Delivery {
                        answer: ok("accepted", 1_000),
                        retries: 0,
                    },
                    Delivery {
                        answer: ok("duplicate", 1_500),
                        retries: 0,
                    },
                ],
            },
            Event::Launched { deliveries: 2 },
            Event::Response {
                target: 1,
                answer: unavailable,
                retried: true,
            },
            Event::Response {
                target: 0,
                answer: Answer::Timeout,
                retried: false,
            },
            Event::Response {
                target: 1,
                answer: ok("accepted", 2_000),
                retried: false,
            },
            Event::Transaction {
                transaction_id: "load-t-1".to_owned(),
                deliveries: vec![
                    Delivery {
                        answer: ok("accepted", 2_000),
                        retries: 1,
                    },
                    Delivery {
                        answer: Answer::Timeout,
                        retries: 0,
                    },
                ],
            },
        ] {
            s.record(e);
        }
        s
    }

    /// Both events booked: received at 0 and 1 s, finished 0.5 s and 2 s later.
    fn drained() -> Drain {
        let figures = RunFigures {
            events: 2,
            transactions: 2,
            done: 2,
            span_secs: Some(3.0),
            lag: Some(LagSecs {
                p50: 1.25,
                p90: 1.85,
                p99: 1.985,
                max: 2.0,
            }),
            ..RunFigures::default()
        };
        Drain::new(
            &figures,
            DrainEnd::Drained,
            Duration::from_millis(1_500),
            Duration::from_secs(30),
        )
    }

    #[derive(clap::Parser)]
    struct LoadCli {
        #[command(flatten)]
        load: super::super::LoadArgs,
    }

    /// Two transactions with k=2: the first processed at once plus a
    /// duplicate; the second's copies race, one waits out a 409 and retries,
    /// the other times out.
    fn sample(answers: Option<AnswerWriter>) -> Stats {
        let mut s = Stats::new(2, "generic".to_owned(), answers);
        let events = vec![
            Event::Launched { deliveries: 2 },
            Event::Response {
                target: 0,
                answer: ok("processed", 2_000),
                retried: false,
            },
            Event::Response {
                target: 1,
                answer: ok("duplicate", 4_000),
                retried: false,
            },
            Event::Transaction {
                transaction_id: "t1".to_owned(),
                deliveries: vec![
                    Delivery {
                        answer: ok("processed", 2_000),
                        retries: 0,
                    },
                    Delivery {
                        answer: ok("duplicate", 4_000),
                        retries: 0,
                    },
                ],
            },
            Event::Launched { deliveries: 2 },
            Event::Response {
                target: 1,
                answer: conflict(),
                retried: true,
            },
            Event::Response {
                target: 0,
                answer: Answer::Timeout,
                retried: false,
            },
            Event::Response {
                target: 1,
                answer: ok("duplicate", 8_000),
                retried: false,
            },
            Event::Transaction {
                transaction_id: "t2".to_owned(),
                deliveries: vec![
                    Delivery {
                        answer: ok("duplicate", 8_000),
                        retries: 1,
                    },
                    Delivery {
                        answer: Answer::Timeout,
                        retries: 0,
                    },
                ],
            },
        ];
        for e in events {
            s.record(e);
        }
        s
    }

    #[test]
    fn the_report_counts_deliveries_payments_retries_and_answers() {
        let r = Report::new(
            &plan(),
            sample(None),
            Duration::from_secs(2),
            StopReason::Duration,
            None,
        );
        assert_eq!(r.transactions, 2);
        assert_eq!(r.deliveries, 4);
        assert_eq!(r.deliveries_per_sec, 2.0);
        assert_eq!(
            r.payments, 2,
            "both transactions have a delivery that ended 200"
        );
        assert_eq!(r.payments_per_sec, 1.0);
        assert_eq!(r.transactions_without_200, 0);
        assert_eq!(r.requests, 5, "4 deliveries + 1 retry");
        assert_eq!(r.retries, 1);
        assert_eq!(r.first_try_200, 2);
        assert_eq!(r.first_try_200_share, 0.5);
        assert_eq!(r.processed_twice, 0);
        assert_eq!(
            r.answers,
            vec![
                AnswerCount {
                    status: None,
                    result: "timeout".to_owned(),
                    count: 1
                },
                AnswerCount {
                    status: Some(200),
                    result: "duplicate".to_owned(),
                    count: 2
                },
                AnswerCount {
                    status: Some(200),
                    result: "processed".to_owned(),
                    count: 1
                },
            ]
        );
        assert_eq!(
            r.retried_answers,
            vec![AnswerCount {
                status: Some(409),
                result: "in_progress".to_owned(),
                count: 1
            }]
        );
        assert_eq!(
            r.requests_per_target
                .iter()
                .map(|t| t.requests)
                .collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert!(r.problems().is_empty(), "{:?}", r.problems());
    }

    #[test]
    fn latency_covers_answered_requests_only_at_microsecond_resolution() {
        let r = Report::new(
            &plan(),
            sample(None),
            Duration::from_secs(1),
            StopReason::Duration,
            None,
        );
        let l = &r.latency;
        assert_eq!(l.count, 4, "the timeout has no latency");
        let near = |got: u64, want: u64| got.abs_diff(want) * 1000 <= want;
        assert!(near(l.p50_us, 2_000), "p50 {}", l.p50_us);
        assert!(near(l.p90_us, 8_000), "p90 {}", l.p90_us);
        assert_eq!(l.max_us, 8_000, "the maximum is exact");
        assert!(l.p90_us <= l.p99_us && l.p99_us <= l.p99_9_us && l.p99_9_us <= l.max_us);
        assert!((l.mean_us - 3_750.0).abs() < 10.0, "{}", l.mean_us);
    }

    #[test]
    fn a_transaction_processed_twice_is_a_problem() {
        let mut s = Stats::new(1, "generic".to_owned(), None);
        s.record(Event::Transaction {
            transaction_id: "t".to_owned(),
            deliveries: vec![
                Delivery {
                    answer: ok("processed", 1),
                    retries: 0,
                },
                Delivery {
                    answer: ok("processed", 1),
                    retries: 0,
                },
            ],
        });
        let r = Report::new(
            &plan(),
            s,
            Duration::from_secs(1),
            StopReason::Transactions,
            None,
        );
        assert_eq!(r.processed_twice, 1);
        assert!(r.problems()[0].contains("more than once"));
        assert!(r.render().contains("PROBLEM"));
    }

    #[test]
    fn a_run_without_any_200_is_a_problem() {
        let mut s = Stats::new(1, "generic".to_owned(), None);
        s.record(Event::Response {
            target: 0,
            answer: Answer::Error("connection refused".to_owned()),
            retried: false,
        });
        s.record(Event::Transaction {
            transaction_id: "t".to_owned(),
            deliveries: vec![Delivery {
                answer: Answer::Error("connection refused".to_owned()),
                retries: 0,
            }],
        });
        let r = Report::new(
            &plan(),
            s,
            Duration::from_secs(1),
            StopReason::Interrupted,
            None,
        );
        assert_eq!(r.transactions_without_200, 1);
        assert_eq!(r.first_error.as_deref(), Some("connection refused"));
        assert_eq!(
            r.problems(),
            vec!["no transaction was answered 200".to_owned()]
        );
        assert_eq!(r.latency.count, 0);
        assert_eq!(r.latency.mean_us, 0.0);
    }

    #[test]
    fn the_answers_file_has_one_record_per_final_answer() {
        let dir = std::env::temp_dir().join(format!("fencehook-answers-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("answers.jsonl");
        let mut stats = sample(Some(AnswerWriter::create(&path).unwrap()));
        if let Some(w) = &mut stats.answers {
            w.finish();
        }
        let r = Report::new(
            &plan(),
            stats,
            Duration::from_secs(1),
            StopReason::Duration,
            None,
        );
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let records: Vec<AnswerRecord> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(records.len(), 4);
        assert_eq!(r.answers_file.as_ref().map(|f| f.lines), Some(4));
        assert_eq!(
            records[3],
            AnswerRecord {
                provider: "generic".to_owned(),
                transaction_id: "t2".to_owned(),
                status: None,
                result: "timeout".to_owned(),
            }
        );
        assert_eq!(records.iter().filter(|r| r.claims_durable()).count(), 3);
    }

    #[test]
    fn the_json_report_is_one_object_with_the_headline_figures() {
        let r = Report::new(
            &plan(),
            sample(None),
            Duration::from_secs(2),
            StopReason::Duration,
            None,
        );
        let json = r.to_json();
        assert!(!json.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["stopped_by"], "duration");
        assert_eq!(v["deliveries"], 4);
        assert_eq!(v["payments_per_sec"], 1.0);
        assert_eq!(v["latency"]["p50_us"], 2000);
        assert_eq!(v["answers"][0]["status"], serde_json::Value::Null);
    }

    #[test]
    fn the_table_shows_every_section() {
        let table = Report::new(
            &plan(),
            sample(None),
            Duration::from_secs(2),
            StopReason::Duration,
            None,
        )
        .render();
        for needle in [
            "stopped by duration",
            "deliveries",
            "payments (ended 200)",
            "HTTP requests",
            "200 without a retry",
            "50.00%",
            "p99.9",
            "200 processed",
            "--- timeout",
            "409 in_progress",
            "http://127.0.0.1:2",
        ] {
            assert!(table.contains(needle), "missing {needle:?} in\n{table}");
        }
    }

    #[test]
    fn an_inbox_run_reports_the_accept_rate_the_drain_rate_and_the_lag() {
        let r = Report::new(
            &inbox_plan(),
            inbox_sample(),
            Duration::from_secs(2),
            StopReason::Duration,
            Some(drained()),
        );
        let inbox = r.inbox.as_ref().expect("an inbox run has inbox figures");
        assert_eq!(inbox.accepted_deliveries, 3, "two accepted, one duplicate");
        assert_eq!(inbox.accept_rate, 1.5, "3 deliveries answered 2xx in 2 s");
        assert_eq!(inbox.accepted, 2);
        assert_eq!(inbox.accepted_twice, 0);
        let d = inbox.drain.as_ref().unwrap();
        assert_eq!(d.drain_rate, Some(2.0 / 3.0), "2 finished over 3 s");
        assert_eq!(d.lag.unwrap().p50_ms, 1_250.0);
        assert_eq!(d.lag.unwrap().max_ms, 2_000.0);
        assert!(r.problems().is_empty(), "{:?}", r.problems());

        let table = r.render();
        for needle in [
            "k=2 | max 5 retries | inbox mode",
            "deliveries answered 2xx",
            "1.5/s   accept rate; 2 answered `accepted`, 0 transactions without a 2xx",
            "drain of the run's events (1.50 s after the load, 30.00 s at most: drained)",
            "0.7/s   2 finished in 3.00 s, first acceptance to last finish",
            "lag per finished event, ms (finished_at - received_at)",
            "p50        p90        p99        max",
            "1250.0     1850.0     1985.0     2000.0",
            "200 accepted",
            "503 unavailable",
            "stored once, as the sender sees it: no transaction answered `accepted` twice",
        ] {
            assert!(table.contains(needle), "missing {needle:?} in\n{table}");
        }
        assert!(!table.contains("payments (ended 200)"), "{table}");
        assert!(!table.contains("exactly-once"), "{table}");
    }

    #[test]
    fn the_json_report_of_an_inbox_run_has_the_drain_and_a_sync_run_has_no_inbox_key() {
        let r = Report::new(
            &inbox_plan(),
            inbox_sample(),
            Duration::from_secs(2),
            StopReason::Duration,
            Some(drained()),
        );
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["inbox"]["accept_rate"], 1.5);
        assert_eq!(v["inbox"]["accepted"], 2);
        let d = &v["inbox"]["drain"];
        assert_eq!(d["ended"], "drained");
        assert_eq!(d["events"], 2);
        assert_eq!(d["done"], 2);
        assert_eq!(d["dead"], 0);
        assert_eq!(d["unfinished"], 0);
        assert_eq!(d["span_secs"], 3.0);
        assert_eq!(d["lag"]["p99_ms"], 1985.0);
        assert_eq!(d["error"], serde_json::Value::Null);

        let sync = Report::new(
            &plan(),
            sample(None),
            Duration::from_secs(2),
            StopReason::Duration,
            None,
        );
        let v: serde_json::Value = serde_json::from_str(&sync.to_json()).unwrap();
        assert!(v.get("inbox").is_none(), "{v}");
    }

    #[test]
    fn dead_unfinished_or_missing_events_and_a_second_accept_are_problems() {
        let mut stats = inbox_sample();
        stats.record(Event::Transaction {
            transaction_id: "load-t-2".to_owned(),
            deliveries: vec![
                Delivery {
                    answer: ok("accepted", 1),
                    retries: 0,
                },
                Delivery {
                    answer: ok("accepted", 1),
                    retries: 0,
                },
            ],
        });
        let figures = RunFigures {
            events: 2,
            transactions: 2,
            queued: 1,
            done: 0,
            dead: 1,
            span_secs: Some(1.0),
            ..RunFigures::default()
        };
        let drain = Drain::new(
            &figures,
            DrainEnd::Timeout,
            Duration::from_secs(30),
            Duration::from_secs(30),
        );
        let r = Report::new(
            &inbox_plan(),
            stats,
            Duration::from_secs(1),
            StopReason::Duration,
            Some(drain),
        );
        let problems = r.problems();
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("answered `accepted` more than once"));
        assert!(problems[1]
            .contains("1 event(s) still queued or processing after --drain-timeout 30.00 s"));
        assert!(problems[2].contains("1 event(s) dead"));
        assert!(problems[3].contains("1 transaction(s) answered 2xx have no event"));
        let table = r.render();
        assert!(table.contains("timed out"), "{table}");
        assert!(table.contains("lag: no event finished"), "{table}");
        assert!(!table.contains("stored once"), "{table}");
    }

    #[test]
    fn an_inbox_run_without_a_database_says_the_drain_was_not_watched() {
        let r = Report::new(
            &plan_with(&["--inbox"]),
            inbox_sample(),
            Duration::from_secs(2),
            StopReason::Duration,
            None,
        );
        assert!(r.problems().is_empty(), "{:?}", r.problems());
        assert!(r.render().contains("drain: not watched"), "{}", r.render());
    }

    #[test]
    fn inbox_figures_over_sync_targets_say_what_may_be_wrong() {
        // Targets that booked (`processed`), and no event of the run stored.
        let drain = Drain::new(
            &RunFigures::default(),
            DrainEnd::Drained,
            Duration::ZERO,
            Duration::from_secs(30),
        );
        let r = Report::new(
            &inbox_plan(),
            sample(None),
            Duration::from_secs(2),
            StopReason::Duration,
            Some(drain),
        );
        assert_eq!(r.inbox.as_ref().unwrap().accepted, 0);
        assert_eq!(
            r.problems(),
            vec![
                "2 transaction(s) answered 2xx have no event in the database (do the targets run in inbox mode, on this database?)"
                    .to_owned()
            ]
        );
    }

    #[test]
    fn a_drain_that_could_not_be_read_is_a_problem() {
        let mut drain = Drain::new(
            &RunFigures::default(),
            DrainEnd::Error,
            Duration::ZERO,
            Duration::from_secs(30),
        );
        drain.error = Some("connection refused".to_owned());
        let r = Report::new(
            &inbox_plan(),
            inbox_sample(),
            Duration::from_secs(2),
            StopReason::Duration,
            Some(drain),
        );
        assert_eq!(
            r.problems(),
            vec!["could not read the run's events: connection refused".to_owned()]
        );
        assert!(r
            .render()
            .contains("drain: could not read the run's events: connection refused"));
    }

    #[test]
    fn a_success_without_a_label_is_counted_and_the_table_says_exactly_once_is_not_visible() {
        let mut s = Stats::new(2, "wechat".to_owned(), None);
        s.record(Event::Transaction {
            transaction_id: "t".to_owned(),
            deliveries: vec![
                Delivery {
                    answer: ok(UNLABELLED_SUCCESS, 1),
                    retries: 0,
                },
                Delivery {
                    answer: ok(UNLABELLED_SUCCESS, 1),
                    retries: 0,
                },
            ],
        });
        let r = Report::new(
            &plan(),
            s,
            Duration::from_secs(1),
            StopReason::Transactions,
            None,
        );
        assert_eq!(r.unlabelled_2xx, 2);
        assert_eq!(r.payments, 1);
        assert!(r.problems().is_empty(), "{:?}", r.problems());
        let table = r.render();
        assert!(
            table.contains(
                "exactly-once cannot be seen by the sender: 2 deliveries answered 2xx `success`"
            ),
            "{table}"
        );
        assert!(
            !table.contains("exactly-once, as the sender sees it"),
            "{table}"
        );
        assert!(table.contains("provider generic (standard)"), "{table}");
    }

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(rate1(1234.56), "1,234.6");
        assert_eq!(rate1(0.04), "0.0");
    }
}
