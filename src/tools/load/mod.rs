//! `fencehook load`: plays a payment provider that delivers every transaction
//! several times at once, against one or more fencehook instances, and reports
//! throughput, latency and the answers.
//!
//! The point is the condition fencehook exists for: `--duplicates k` copies of
//! one transaction are launched together, each to a different target (round
//! robin per copy), so they race for the lease on different instances. A copy
//! answered 409/503 follows `Retry-After` like a PSP would; that is a retry of
//! the same delivery, not a new one.
//!
//! Everything is bounded, so a run always ends: launching stops at
//! `--transactions` or `--duration`, whichever comes first (or at the `stop`
//! future, Ctrl-C for the CLI); each delivery makes at most
//! `1 + --max-retries` requests, each request is cut at `--request-timeout`
//! and each retry wait at [`MAX_RETRY_WAIT`], so the drain after the deadline
//! is bounded too. Targets must be loopback addresses: this is a bench tool,
//! and a mistyped URL must not send signed payment traffic elsewhere.
//!
//! With `--inbox` the targets run in inbox mode: a 2xx (`accepted`) means
//! "stored", and booking happens later. The report then gives the accept
//! rate, and with `--database-url` the load waits (at most
//! `--drain-timeout`) until the workers have finished every event of the run,
//! and reports the drain rate and the lag from the `events` table ([`drain`]).

mod drain;
mod report;

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use fencehook::http::client::{self, HttpClient};
use fencehook::providers::standard;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use report::{Answer, Delivery, Event, Stats};
pub use report::{Report, StopReason};

/// Most requests in flight: each is a socket, and the default soft limit on
/// open files is 1024.
pub const MAX_CONCURRENCY: usize = 1024;
/// Most copies of one transaction (they must all fit in `--concurrency`).
pub const MAX_DUPLICATES: usize = 64;
/// Most retries of one delivery.
pub const MAX_RETRIES: u32 = 20;
/// Longest run.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Longest request timeout.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest `--drain-timeout`.
pub const MAX_DRAIN_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Highest `--rate`, deliveries per second.
pub const MAX_RATE: f64 = 1_000_000.0;
/// Longest wait before a retry, whatever `Retry-After` says: keeps the drain
/// after the deadline bounded.
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(30);
/// Wait before a retry when a 409/503 carries no usable `Retry-After`.
pub const DEFAULT_RETRY_WAIT: Duration = Duration::from_secs(1);
/// Amounts are drawn from 1..=this, in minor units.
const MAX_AMOUNT: i64 = 100_000;
const CURRENCY: &str = "EUR";

/// Flags of `fencehook load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Base URL of a public listener (loopback only); repeat for several
    /// instances. Copies of one transaction go to different targets.
    #[arg(
        long = "target",
        value_name = "URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub targets: Vec<String>,
    /// Provider name in /webhooks/{provider}; a `standard`-scheme provider.
    #[arg(long, default_value = "generic")]
    pub provider: String,
    /// Signing secret (whsec_<base64>).
    #[arg(long, env = "FENCEHOOK_GENERIC_SECRET", hide_env_values = true)]
    pub secret: String,
    /// Most HTTP requests in flight at once (retry waits included).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Deliveries started per second, every copy counted; as fast as
    /// `--concurrency` allows when absent.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop launching after this many transactions.
    #[arg(long, default_value_t = 1_000_000)]
    pub transactions: u64,
    /// Stop launching after this long (e.g. 30s, 500ms, 2m; a bare number is seconds).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Copies of each transaction (k), launched together to different targets.
    #[arg(long, default_value_t = 1)]
    pub duplicates: usize,
    /// Retries of one delivery answered 409/503, each after its Retry-After.
    #[arg(long, default_value_t = 5)]
    pub max_retries: u32,
    /// Share of transactions sent as payment.failed (0 to 1); the rest are payment.succeeded.
    #[arg(long, default_value_t = 0.05)]
    pub failed_share: f64,
    /// Part of every transaction id (load-<run-id>-<n>), so runs never collide;
    /// random when absent.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Timeout of one HTTP request, connect to last body byte.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Write one JSON line per final answer (provider, transaction_id, status,
    /// result), for `fencehook audit --answers FILE`.
    #[arg(long, value_name = "FILE")]
    pub answers: Option<PathBuf>,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The targets run in inbox mode (`FENCEHOOK_MODE=inbox`): report the
    /// accept rate and, with --database-url, wait for the drain and report it.
    #[arg(long)]
    pub inbox: bool,
    /// With --inbox: the targets' database, read after the load to wait until
    /// every event of the run is done or dead, and to report the drain rate
    /// and lag. Ignored without --inbox.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// With --inbox and --database-url: longest wait for the drain after the
    /// load (e.g. 60s, 2m; a bare number is seconds).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
}

/// A flag that cannot be used, and why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--{flag}: {reason}")]
pub struct ArgError {
    pub flag: &'static str,
    pub reason: String,
}

fn bad(flag: &'static str, reason: impl Into<String>) -> ArgError {
    ArgError {
        flag,
        reason: reason.into(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Args(#[from] ArgError),
    #[error("cannot create the answers file {path}: {source}")]
    Answers {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the collector task failed: {0}")]
    Collector(String),
}

/// The signing secret, kept out of `{:?}` output: a plan may be logged.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Validated settings of one run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Base URLs as given (trailing `/` trimmed), for the report.
    pub targets: Vec<String>,
    /// `<base>/webhooks/<provider>` per target.
    endpoints: Vec<hyper::Uri>,
    pub provider: String,
    secret: Secret,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub transactions: u64,
    pub duration: Duration,
    pub duplicates: usize,
    pub max_retries: u32,
    pub failed_share: f64,
    pub run_id: String,
    pub request_timeout: Duration,
    pub answers: Option<PathBuf>,
    /// The targets run in inbox mode.
    pub inbox: bool,
    /// Inbox mode only: where to watch the drain (kept out of `{:?}`: a URL
    /// may carry a password).
    database_url: Option<Secret>,
    pub drain_timeout: Duration,
}

impl Plan {
    /// Checks every flag and the rules between them.
    pub fn from_args(args: &LoadArgs) -> Result<Plan, ArgError> {
        if args.targets.is_empty() {
            return Err(bad("target", "give at least one"));
        }
        if !is_name(&args.provider, 64) {
            return Err(bad(
                "provider",
                "1-64 characters of A-Z, a-z, 0-9, '-' and '_'",
            ));
        }
        let mut targets = Vec::new();
        let mut endpoints = Vec::new();
        for t in &args.targets {
            let base = check_target(t)?;
            let endpoint = format!("{base}/webhooks/{}", args.provider)
                .parse::<hyper::Uri>()
                .map_err(|e| bad("target", format!("`{t}`: {e}")))?;
            targets.push(base);
            endpoints.push(endpoint);
        }
        standard::sign(&args.secret, "msg_check", 0, b"")
            .map_err(|e| bad("secret", format!("not a whsec_ secret: {e}")))?;
        if args.concurrency == 0 || args.concurrency > MAX_CONCURRENCY {
            return Err(bad(
                "concurrency",
                format!("must be 1 to {MAX_CONCURRENCY}"),
            ));
        }
        if args.duplicates == 0 || args.duplicates > MAX_DUPLICATES {
            return Err(bad("duplicates", format!("must be 1 to {MAX_DUPLICATES}")));
        }
        // The copies of one transaction are in flight together; they cannot
        // race if they do not fit.
        if args.duplicates > args.concurrency {
            return Err(bad(
                "duplicates",
                format!(
                    "{} copies cannot be in flight together with --concurrency {}",
                    args.duplicates, args.concurrency
                ),
            ));
        }
        if let Some(rate) = args.rate {
            if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE) {
                return Err(bad(
                    "rate",
                    format!("must be above 0 and at most {MAX_RATE} deliveries/s"),
                ));
            }
        }
        if args.transactions == 0 {
            return Err(bad("transactions", "must be at least 1"));
        }
        if args.duration.is_zero() || args.duration > MAX_DURATION {
            return Err(bad("duration", "must be above 0 and at most 24h"));
        }
        if args.max_retries > MAX_RETRIES {
            return Err(bad("max-retries", format!("must be at most {MAX_RETRIES}")));
        }
        if !(0.0..=1.0).contains(&args.failed_share) {
            return Err(bad("failed-share", "must be between 0 and 1"));
        }
        if args.request_timeout.is_zero() || args.request_timeout > MAX_REQUEST_TIMEOUT {
            return Err(bad("request-timeout", "must be above 0 and at most 120s"));
        }
        let run_id = match &args.run_id {
            Some(id) if is_name(id, 64) => id.clone(),
            Some(_) => {
                return Err(bad(
                    "run-id",
                    "1-64 characters of A-Z, a-z, 0-9, '-' and '_'",
                ))
            }
            None => uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
        };
        if args.drain_timeout.is_zero() || args.drain_timeout > MAX_DRAIN_TIMEOUT {
            return Err(bad("drain-timeout", "must be above 0 and at most 24h"));
        }
        // The URL matters only in inbox mode: DATABASE_URL is often set for
        // other reasons, and a sync run must not refuse to start over it.
        let database_url = match &args.database_url {
            Some(url) if args.inbox => {
                url.parse::<tokio_postgres::Config>()
                    .map_err(|e| bad("database-url", format!("not a PostgreSQL URL: {e}")))?;
                Some(Secret(url.clone()))
            }
            _ => None,
        };
        Ok(Plan {
            targets,
            endpoints,
            provider: args.provider.clone(),
            secret: Secret(args.secret.clone()),
            concurrency: args.concurrency,
            rate: args.rate,
            transactions: args.transactions,
            duration: args.duration,
            duplicates: args.duplicates,
            max_retries: args.max_retries,
            failed_share: args.failed_share,
            run_id,
            request_timeout: args.request_timeout,
            answers: args.answers.clone(),
            inbox: args.inbox,
            database_url,
            drain_timeout: args.drain_timeout,
        })
    }

    /// What every transaction id of this run starts with.
    pub fn transaction_prefix(&self) -> String {
        format!("load-{}-", self.run_id)
    }

    /// The id of transaction `n` of this run.
    pub fn transaction_id(&self, n: u64) -> String {
        format!("{}{n}", self.transaction_prefix())
    }

    /// The target of copy `copy` of transaction `n`: round robin per copy,
    /// starting one further per transaction, so the copies of one transaction
    /// land on different instances and every instance gets the same share.
    pub fn target_of(&self, n: u64, copy: usize) -> usize {
        let count = self.endpoints.len();
        ((n % count as u64) as usize + copy) % count
    }
}

fn is_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// An `http://` base URL on a loopback host, returned without a trailing `/`.
fn check_target(target: &str) -> Result<String, ArgError> {
    let base = target.trim_end_matches('/');
    let uri: hyper::Uri = base
        .parse()
        .map_err(|_| bad("target", format!("`{target}` is not a URL")))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad("target", format!("`{target}` is not an http:// URL")));
    }
    if uri.query().is_some() {
        return Err(bad("target", format!("`{target}` has a query")));
    }
    let host = uri.host().unwrap_or("");
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Err(bad(
            "target",
            format!("`{target}` is not on a loopback address (127.0.0.0/8, ::1, localhost)"),
        ));
    }
    Ok(base.to_owned())
}

/// Parses a duration the way `humantime` does (`500ms`, `30s`, `2m`,
/// `1h 30m`), or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| format!("`{text}` is too long"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration like 500ms, 30s, 2m, 1h ({e})"))
}

/// The wait a `Retry-After` value asks for, capped at [`MAX_RETRY_WAIT`].
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    fencehook::downstream::retry_after(value, now).map(|d| d.min(MAX_RETRY_WAIT))
}

/// Runs the load and prints the report (table or JSON) on stdout; progress
/// goes to stderr. `Ok(false)` when the run shows a problem (see
/// [`Report::problems`]).
pub async fn command(args: &LoadArgs, stop: impl Future<Output = ()>) -> Result<bool, LoadError> {
    let plan = Plan::from_args(args)?;
    let report = run(plan, stop, true).await?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render());
    }
    Ok(report.problems().is_empty())
}

/// One transaction: the same signed body for every copy.
struct Transaction {
    n: u64,
    id: String,
    webhook_id: String,
    body: Bytes,
}

impl Transaction {
    fn new(plan: &Plan, n: u64, rng: &mut impl Rng) -> Transaction {
        let id = plan.transaction_id(n);
        let event_type = if rng.gen_bool(plan.failed_share) {
            "payment.failed"
        } else {
            "payment.succeeded"
        };
        let body = serde_json::json!({
            "transaction_id": id,
            "amount": rng.gen_range(1..=MAX_AMOUNT),
            "currency": CURRENCY,
            "event_type": event_type,
        })
        .to_string();
        Transaction {
            n,
            // One message id for all copies: to the receiver they are
            // redeliveries of the same message, as from a real PSP.
            webhook_id: format!("msg_{}_{n}", plan.run_id),
            id,
            body: Bytes::from(body),
        }
    }
}

/// What the delivery tasks share.
struct Shared {
    plan: Plan,
    client: HttpClient,
    events: mpsc::UnboundedSender<Event>,
}

/// Runs one load: launches transactions until a bound is hit or `stop`
/// resolves, waits for every delivery in flight to end, in inbox mode with a
/// database waits for the drain too (see [`drain`]), and returns the report.
pub async fn run(
    plan: Plan,
    stop: impl Future<Output = ()>,
    progress: bool,
) -> Result<Report, LoadError> {
    let answers = match &plan.answers {
        Some(path) => {
            Some(
                report::AnswerWriter::create(path).map_err(|source| LoadError::Answers {
                    path: path.display().to_string(),
                    source,
                })?,
            )
        }
        None => None,
    };
    let client = client::new(plan.request_timeout);
    let (events, rx) = mpsc::unbounded_channel();
    let started = Instant::now();
    let stats = Stats::new(plan.endpoints.len(), plan.provider.clone(), answers);
    let collector = tokio::spawn(report::collect(rx, stats, started, progress));
    let shared = Arc::new(Shared {
        plan,
        client,
        events,
    });

    tokio::pin!(stop);
    let stopped_by = launch(&shared, started, stop.as_mut()).await;

    // The event sender lives in `Shared`, which every transaction task holds:
    // once ours is dropped, the collector ends exactly when the last delivery
    // in flight has ended and reported.
    let plan = shared.plan.clone();
    drop(shared);
    let stats = collector
        .await
        .map_err(|e| LoadError::Collector(e.to_string()))?;
    let elapsed = started.elapsed();
    let drain = match (plan.inbox, &plan.database_url) {
        (true, Some(url)) => {
            // `stop` has resolved when the run was interrupted: it must not be
            // polled again, and the drain is only looked at, not waited for.
            let interrupted = stopped_by == StopReason::Interrupted;
            let timeout = if interrupted {
                Duration::ZERO
            } else {
                plan.drain_timeout
            };
            let until = async {
                if !interrupted {
                    stop.as_mut().await;
                }
            };
            Some(drain::wait(&plan, &url.0, timeout, until, progress).await)
        }
        _ => None,
    };
    Ok(Report::new(&plan, stats, elapsed, stopped_by, drain))
}

/// The launch loop: one transaction after another, each once `k` request
/// slots are free (so its copies start together), paced by `--rate`.
async fn launch(
    shared: &Arc<Shared>,
    started: Instant,
    stop: impl Future<Output = ()>,
) -> StopReason {
    let plan = &shared.plan;
    let k = plan.duplicates;
    let deadline = started + plan.duration;
    let slots = Arc::new(Semaphore::new(plan.concurrency));
    // StdRng rather than thread_rng: it is Send, so a run can be spawned.
    let mut rng = StdRng::from_entropy();
    tokio::pin!(stop);
    for n in 0..plan.transactions {
        if let Some(rate) = plan.rate {
            // Open loop: transaction n is due when n*k deliveries have been
            // started at `rate`. A run that fell behind catches up, bounded by
            // the free slots.
            let due = started + Duration::from_secs_f64(n as f64 * k as f64 / rate);
            if due >= deadline {
                return StopReason::Duration;
            }
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = &mut stop => return StopReason::Interrupted,
            }
        }
        let mut permits: Vec<OwnedSemaphorePermit> = Vec::with_capacity(k);
        while permits.len() < k {
            tokio::select! {
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(p) => permits.push(p),
                    // The semaphore is never closed; if it were, nothing more can start.
                    Err(_) => return StopReason::Interrupted,
                },
                () = tokio::time::sleep_until(deadline) => return StopReason::Duration,
                () = &mut stop => return StopReason::Interrupted,
            }
        }
        if Instant::now() >= deadline {
            return StopReason::Duration;
        }
        let tx = Transaction::new(plan, n, &mut rng);
        let _ = shared.events.send(Event::Launched { deliveries: k });
        tokio::spawn(run_transaction(shared.clone(), tx, permits));
    }
    StopReason::Transactions
}

/// Delivers the `k` copies of one transaction concurrently and reports them
/// together, so the collector can see per transaction what happened.
async fn run_transaction(shared: Arc<Shared>, tx: Transaction, permits: Vec<OwnedSemaphorePermit>) {
    let copies = permits
        .into_iter()
        .enumerate()
        .map(|(copy, permit)| deliver(&shared, &tx, shared.plan.target_of(tx.n, copy), permit));
    let deliveries = join_all(copies).await;
    let _ = shared.events.send(Event::Transaction {
        transaction_id: tx.id,
        deliveries,
    });
}

/// One delivery: the first request and its retries. Holds its slot for the
/// whole time, retry waits included: a PSP worker waiting to retry is busy too.
async fn deliver(
    shared: &Shared,
    tx: &Transaction,
    target: usize,
    _slot: OwnedSemaphorePermit,
) -> Delivery {
    let mut retries = 0;
    loop {
        let (answer, retry_after) = send_once(shared, tx, target).await;
        let retry = matches!(
            answer,
            Answer::Http {
                status: 409 | 503,
                ..
            }
        ) && retries < shared.plan.max_retries;
        let _ = shared.events.send(Event::Response {
            target,
            answer: answer.clone(),
            retried: retry,
        });
        if !retry {
            return Delivery { answer, retries };
        }
        retries += 1;
        tokio::time::sleep(retry_after.unwrap_or(DEFAULT_RETRY_WAIT)).await;
    }
}

/// One signed request; the answer and the `Retry-After` it carried.
async fn send_once(shared: &Shared, tx: &Transaction, target: usize) -> (Answer, Option<Duration>) {
    let plan = &shared.plan;
    let now = SystemTime::now();
    let ts = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    // Signed per request: a retry carries a fresh timestamp, like a PSP's.
    let signature = match standard::sign(&plan.secret.0, &tx.webhook_id, ts, &tx.body) {
        Ok(s) => s,
        Err(e) => return (Answer::Error(format!("signing failed: {e}")), None),
    };
    let request = hyper::Request::post(plan.endpoints[target].clone())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header("webhook-id", tx.webhook_id.as_str())
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", signature)
        .body(Full::new(tx.body.clone()));
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            return (
                Answer::Error(format!("cannot build the request: {e}")),
                None,
            )
        }
    };
    let sent = Instant::now();
    let exchange = async {
        let response = shared
            .client
            .request(request)
            .await
            .map_err(|e| fencehook::error::chain(&e))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, now));
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| fencehook::error::chain(&e))?
            .to_bytes();
        Ok::<_, String>((status, retry_after, body))
    };
    match tokio::time::timeout(plan.request_timeout, exchange).await {
        Err(_) => (Answer::Timeout, None),
        Ok(Err(e)) => (Answer::Error(e), None),
        Ok(Ok((status, retry_after, body))) => {
            let latency = sent.elapsed();
            (
                Answer::Http {
                    status,
                    result: result_field(&body),
                    latency_us: u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
                },
                retry_after,
            )
        }
    }
}

/// The `result` field of a JSON answer body; `-` when there is none.
fn result_field(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("result")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "-".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    const SECRET: &str = "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM=";

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan, ArgError> {
        let mut argv = vec!["load", "--secret", SECRET];
        argv.extend_from_slice(args);
        Plan::from_args(&Cli::try_parse_from(argv).expect("flags parse").load)
    }

    #[test]
    fn defaults_are_valid() {
        let p = plan(&[]).expect("defaults validate");
        assert_eq!(p.concurrency, 32);
        assert_eq!(p.duration, Duration::from_secs(30));
        assert_eq!(p.transactions, 1_000_000);
        assert_eq!(p.max_retries, 5);
        assert_eq!(p.duplicates, 1);
        assert_eq!(p.targets, vec!["http://127.0.0.1:8080".to_owned()]);
        assert_eq!(p.run_id.len(), 12);
    }

    #[test]
    fn the_secret_stays_out_of_debug_output() {
        let shown = format!("{:?}", plan(&[]).unwrap());
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains("Secret(***)"));
    }

    #[test]
    fn two_runs_get_different_run_ids() {
        assert_ne!(plan(&[]).unwrap().run_id, plan(&[]).unwrap().run_id);
    }

    #[test]
    fn targets_must_be_http_on_loopback() {
        for ok in [
            "http://127.0.0.1:1/",
            "http://127.0.0.2:1",
            "http://localhost:1",
            "http://[::1]:1",
        ] {
            plan(&["--target", ok]).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (target, why) in [
            ("http://10.0.0.1:8080", "loopback"),
            ("http://example.com", "loopback"),
            ("https://127.0.0.1:1", "http://"),
            ("127.0.0.1:8080", "http://"),
            ("http://127.0.0.1:1/?x=1", "query"),
        ] {
            let err = plan(&["--target", target]).unwrap_err();
            assert_eq!(err.flag, "target");
            assert!(err.reason.contains(why), "{target}: {err}");
        }
    }

    #[test]
    fn the_endpoint_is_the_base_url_plus_the_provider_path() {
        let p = plan(&["--target", "http://127.0.0.1:9/", "--provider", "psp_1"]).unwrap();
        assert_eq!(
            p.endpoints[0].to_string(),
            "http://127.0.0.1:9/webhooks/psp_1"
        );
    }

    #[test]
    fn out_of_range_flags_name_the_flag() {
        for (args, flag) in [
            (&["--concurrency", "0"][..], "concurrency"),
            (&["--concurrency", "5000"][..], "concurrency"),
            (&["--duplicates", "0"][..], "duplicates"),
            (
                &["--duplicates", "8", "--concurrency", "4"][..],
                "duplicates",
            ),
            (&["--rate", "0"][..], "rate"),
            (&["--rate", "NaN"][..], "rate"),
            (&["--transactions", "0"][..], "transactions"),
            (&["--duration", "0s"][..], "duration"),
            (&["--duration", "25h"][..], "duration"),
            (&["--max-retries", "21"][..], "max-retries"),
            (&["--failed-share", "1.5"][..], "failed-share"),
            (&["--failed-share=-0.1"][..], "failed-share"),
            (&["--request-timeout", "0ms"][..], "request-timeout"),
            (&["--run-id", "has space"][..], "run-id"),
            (&["--run-id", ""][..], "run-id"),
            (&["--provider", "a/b"][..], "provider"),
            (&["--drain-timeout", "0s"][..], "drain-timeout"),
            (&["--drain-timeout", "25h"][..], "drain-timeout"),
            (
                &["--inbox", "--database-url", "not a url"][..],
                "database-url",
            ),
        ] {
            let err = plan(args).unwrap_err();
            assert_eq!(err.flag, flag, "{args:?}: {err}");
        }
    }

    #[test]
    fn the_database_url_is_kept_for_inbox_runs_only_and_out_of_debug_output() {
        let url = "postgres://postgres:hunter2@127.0.0.1:5432/fencehook";
        let inbox = plan(&["--inbox", "--database-url", url]).unwrap();
        assert!(inbox.inbox);
        assert!(inbox.database_url.is_some());
        assert_eq!(inbox.drain_timeout, Duration::from_secs(60));
        assert!(!format!("{inbox:?}").contains("hunter2"));
        // DATABASE_URL is often set for other tools; a sync run ignores it,
        // even when it would not parse.
        let sync = plan(&["--database-url", "not a url"]).unwrap();
        assert!(!sync.inbox);
        assert!(sync.database_url.is_none());
        assert_eq!(
            inbox.transaction_prefix(),
            format!("load-{}-", inbox.run_id)
        );
        assert!(inbox
            .transaction_id(7)
            .starts_with(&inbox.transaction_prefix()));
    }

    #[test]
    fn a_secret_that_is_not_whsec_is_refused() {
        let cli = Cli::try_parse_from(["load", "--secret", "hunter2"]).unwrap();
        assert_eq!(Plan::from_args(&cli.load).unwrap_err().flag, "secret");
    }

    #[test]
    fn copies_of_one_transaction_go_to_different_targets_and_spread_evenly() {
        let p = plan(&[
            "--target",
            "http://127.0.0.1:1",
            "--target",
            "http://127.0.0.1:2",
            "--target",
            "http://127.0.0.1:3",
            "--duplicates",
            "3",
        ])
        .unwrap();
        let mut per_target = [0; 3];
        for n in 0..30 {
            let mut seen: Vec<usize> = (0..3).map(|copy| p.target_of(n, copy)).collect();
            for t in &seen {
                per_target[*t] += 1;
            }
            seen.sort_unstable();
            assert_eq!(seen, vec![0, 1, 2], "transaction {n}");
        }
        assert_eq!(per_target, [30, 30, 30]);
        // With k=1 the transactions themselves rotate over the targets.
        assert_eq!(
            (0..3).map(|n| p.target_of(n, 0)).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn transaction_ids_carry_the_run_id_and_fit_the_schema() {
        let p = plan(&["--run-id", &"r".repeat(64)]).unwrap();
        let id = p.transaction_id(u64::MAX);
        assert!(id.starts_with(&format!("load-{}-", "r".repeat(64))));
        assert!(id.len() <= 255);
    }

    #[test]
    fn generated_payloads_follow_the_generic_schema_and_the_mix() {
        let p = plan(&["--run-id", "t", "--failed-share", "0.5"]).unwrap();
        let mut rng = rand::thread_rng();
        let mut failed = 0;
        for n in 0..2000 {
            let tx = Transaction::new(&p, n, &mut rng);
            let item = standard::parse_generic("generic", &tx.body).expect("valid payload");
            let fencehook::providers::Item::Event(ev) = item else {
                panic!("payment events are acted on")
            };
            assert_eq!(ev.transaction_id, tx.id);
            assert!((1..=MAX_AMOUNT).contains(&ev.amount_minor));
            assert_eq!(ev.currency, "EUR");
            let v: serde_json::Value = serde_json::from_slice(&tx.body).unwrap();
            if v["event_type"] == "payment.failed" {
                failed += 1;
            }
        }
        assert!(
            (800..1200).contains(&failed),
            "{failed} of 2000 failed at share 0.5"
        );
        let none = plan(&["--failed-share", "0"]).unwrap();
        let tx = Transaction::new(&none, 1, &mut rng);
        assert!(String::from_utf8_lossy(&tx.body).contains("payment.succeeded"));
    }

    #[test]
    fn durations_take_units_and_bare_seconds() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        for bad in ["", "s", "-1s", "10x", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn retry_after_takes_seconds_or_an_http_date_and_is_capped() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470); // 2015-10-21 07:27:50 UTC
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("3600", now), Some(MAX_RETRY_WAIT));
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(MAX_RETRY_WAIT)
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        for bad in ["", "-1", "1.5", "soon"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn the_result_field_is_read_from_json_bodies_only() {
        assert_eq!(result_field(br#"{"result":"duplicate"}"#), "duplicate");
        assert_eq!(result_field(br#"{"result":7}"#), "-");
        assert_eq!(result_field(b"[accepted]"), "-");
        assert_eq!(result_field(b""), "-");
    }
}
