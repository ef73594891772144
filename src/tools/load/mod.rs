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
//! Every scheme can be played (`--scheme`, or the providers file's
//! `--provider`), signed by `fencehook send`'s code ([`build_delivery`]). An
//! RSA signature costs about 0.7 ms, so each transaction is signed once and
//! its k copies share that request; a retry is signed afresh. PayPal's
//! certificate can be served by the load itself (`--serve-cert`, [`cert`]).
//! WeChat Pay and Alipay acknowledge in their own words, without fencehook's
//! `result` label ([`answer_label`]).
//!
//! With `--inbox` the targets run in inbox mode: a 2xx (`accepted`) means
//! "stored", and booking happens later. The report then gives the accept
//! rate, and with `--database-url` the load waits (at most
//! `--drain-timeout`) until the workers have finished every event of the run,
//! and reports the drain rate and the lag from the `events` table ([`drain`]).

mod cert;
mod drain;
mod report;

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use fencehook::config::setting;
use fencehook::domain::EventKind;
use fencehook::outbound::{self, HttpClient};
use fencehook::providers::SchemeKind;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use report::{Answer, Delivery, Event, Stats};
pub use report::{Report, StopReason};

use crate::tools::answers::UNLABELLED_SUCCESS;
use crate::tools::send::{build_delivery, Notice, Psp, PspArgs};

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
/// `--failed-share` when none is given (wechatpay: 0, it sends no failure).
const DEFAULT_FAILED_SHARE: f64 = 0.05;

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
    #[command(flatten)]
    pub psp: PspArgs,
    /// paypal: the webhook id the provider is configured with (part of what
    /// PayPal signs; the providers file's when absent).
    #[arg(long)]
    pub webhook_id: Option<String>,
    /// paypal: serve this PEM certificate (of --private-key's key) at
    /// --cert-url for the run, from a listener on that URL's loopback
    /// host:port, so the targets can fetch it (their provider's
    /// cert_url_prefixes must allow the URL).
    #[arg(long, value_name = "FILE")]
    pub serve_cert: Option<PathBuf>,
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
    /// Share of transactions sent as payment.failed (0 to 1); the rest are
    /// payment.succeeded. Default 0.05; 0 for wechatpay, which sends no
    /// payment failure.
    #[arg(long)]
    pub failed_share: Option<f64>,
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
    #[arg(long, env = setting::DATABASE_URL, hide_env_values = true)]
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
    #[error("--serve-cert: cannot listen on {addr}: {source}")]
    CertServer {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A secret kept out of `{:?}` output: a plan may be logged.
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
    pub scheme: SchemeKind,
    /// Who the deliveries are signed as (its `Debug` shows no key).
    psp: Psp,
    /// paypal: the certificate the load serves itself.
    cert: Option<cert::CertFile>,
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
        if !is_name(&args.psp.provider, 64) {
            return Err(bad(
                "provider",
                "1-64 characters of A-Z, a-z, 0-9, '-' and '_'",
            ));
        }
        let mut targets = Vec::new();
        let mut endpoints = Vec::new();
        for t in &args.targets {
            let base = check_target(t)?;
            let endpoint = format!("{base}/webhooks/{}", args.psp.provider)
                .parse::<hyper::Uri>()
                .map_err(|e| bad("target", format!("`{t}`: {e}")))?;
            targets.push(base);
            endpoints.push(endpoint);
        }
        let psp = args
            .psp
            .resolve(args.webhook_id.as_deref())
            .map_err(|e| bad(e.flag, e.reason))?;
        // Every delivery would fail the same way: refuse to start instead.
        psp.check().map_err(|e| bad(e.flag, e.reason))?;
        // A PSP without a payment failure notification (wechatpay) sends none.
        let sends_failures = psp.scheme.spec().sends(EventKind::PaymentFailed);
        let failed_share = match (args.failed_share, sends_failures) {
            (Some(share), _) if !(0.0..=1.0).contains(&share) => {
                return Err(bad("failed-share", "must be between 0 and 1"))
            }
            (Some(share), false) if share > 0.0 => {
                let name = psp.scheme.as_str();
                return Err(bad(
                    "failed-share",
                    format!(
                        "{name} sends no payment failure notification: leave it out (0 for {name})"
                    ),
                ));
            }
            (Some(share), _) => share,
            (None, false) => 0.0,
            (None, true) => DEFAULT_FAILED_SHARE,
        };
        let cert = match &args.serve_cert {
            None => None,
            Some(_) if psp.scheme != SchemeKind::Paypal => {
                return Err(bad(
                    "serve-cert",
                    format!(
                        "only paypal fetches a certificate; the scheme is {}",
                        psp.scheme.as_str()
                    ),
                ))
            }
            Some(path) => Some(cert::CertFile::read(path, &psp, unix_now())?),
        };
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
                fencehook::db::tls::Target::parse(url)
                    .map_err(|e| bad("database-url", fencehook::report::chain(&e)))?;
                Some(Secret(url.clone()))
            }
            _ => None,
        };
        Ok(Plan {
            targets,
            endpoints,
            provider: psp.provider.clone(),
            scheme: psp.scheme,
            psp,
            cert,
            concurrency: args.concurrency,
            rate: args.rate,
            transactions: args.transactions,
            duration: args.duration,
            duplicates: args.duplicates,
            max_retries: args.max_retries,
            failed_share,
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

    /// The delivery's own id of transaction `n` (standard's webhook-id, the
    /// event id of stripe and paypal, wechatpay's notification id): the same
    /// for every copy and retry, so to the receiver they are redeliveries of
    /// one message, as from a real PSP.
    fn delivery_id(&self, n: u64) -> String {
        let prefix = self.scheme.spec().delivery_id_prefix;
        format!("{prefix}{}_{n}", self.run_id)
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
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

/// One transaction: what its deliveries announce.
struct Transaction {
    n: u64,
    delivery_id: String,
    notice: Notice,
}

impl Transaction {
    fn new(plan: &Plan, n: u64, rng: &mut impl Rng) -> Transaction {
        let event_type = if rng.gen_bool(plan.failed_share) {
            "payment.failed"
        } else {
            "payment.succeeded"
        };
        Transaction {
            n,
            delivery_id: plan.delivery_id(n),
            notice: Notice {
                transaction_id: plan.transaction_id(n),
                amount: rng.gen_range(1..=MAX_AMOUNT),
                currency: plan.scheme.spec().currency.to_owned(),
                event_type: event_type.to_owned(),
                payment_transaction_id: None,
            },
        }
    }
}

/// A signed request, ready to send to any target.
struct Signed {
    body: Bytes,
    content_type: &'static str,
    headers: Vec<(&'static str, String)>,
}

/// Transaction `tx` signed now, as the plan's scheme signs it.
fn sign(plan: &Plan, tx: &Transaction) -> Result<Arc<Signed>, String> {
    let d = build_delivery(
        &plan.psp,
        &tx.notice,
        None,
        Some(&tx.delivery_id),
        unix_now(),
    )?;
    Ok(Arc::new(Signed {
        body: Bytes::from(d.body),
        content_type: d.content_type,
        headers: d.headers,
    }))
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
    // Listening before the first delivery: the targets fetch the
    // certificate on their first paypal delivery.
    let _cert_server = match &plan.cert {
        Some(c) => Some(c.serve().await.map_err(|source| LoadError::CertServer {
            addr: c.addr,
            source,
        })?),
        None => None,
    };
    let client = outbound::new(plan.request_timeout);
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
    // One signature for all k copies: they leave together, so one request
    // serves them all, and an RSA signature (~0.7 ms of CPU, here on a
    // runtime worker) is then paid once per transaction rather than k times.
    let signed = sign(&shared.plan, &tx);
    let copies = permits.into_iter().enumerate().map(|(copy, permit)| {
        deliver(
            &shared,
            &tx,
            signed.clone(),
            shared.plan.target_of(tx.n, copy),
            permit,
        )
    });
    let deliveries = join_all(copies).await;
    let _ = shared.events.send(Event::Transaction {
        transaction_id: tx.notice.transaction_id,
        deliveries,
    });
}

/// One delivery: the first request and its retries. Holds its slot for the
/// whole time, retry waits included: a PSP worker waiting to retry is busy too.
async fn deliver(
    shared: &Shared,
    tx: &Transaction,
    mut signed: Result<Arc<Signed>, String>,
    target: usize,
    _slot: OwnedSemaphorePermit,
) -> Delivery {
    let mut retries = 0;
    loop {
        let (answer, retry_after) = match &signed {
            Ok(request) => send_once(shared, request, target).await,
            Err(e) => (Answer::Error(format!("signing failed: {e}")), None),
        };
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
        // A retry carries a fresh timestamp, like a PSP's: after the waits
        // the first one could be outside a timestamp window (300 s).
        signed = sign(&shared.plan, tx);
    }
}

/// One signed request; the answer and the `Retry-After` it carried.
async fn send_once(shared: &Shared, signed: &Signed, target: usize) -> (Answer, Option<Duration>) {
    let plan = &shared.plan;
    let now = SystemTime::now();
    let mut request = hyper::Request::post(plan.endpoints[target].clone())
        .header(hyper::header::CONTENT_TYPE, signed.content_type);
    for (name, value) in &signed.headers {
        request = request.header(*name, value.as_str());
    }
    let request = match request.body(Full::new(signed.body.clone())) {
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
            .map_err(|e| fencehook::report::chain(&e))?;
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
            .map_err(|e| fencehook::report::chain(&e))?
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
                    result: answer_label(status, &body),
                    latency_us: u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
                },
                retry_after,
            )
        }
    }
}

/// The result an answer names. fencehook's own JSON carries it as `result`;
/// WeChat Pay's failure body, `{"code":"FAIL","message":"<result>[:
/// <reason>]"}`, at the head of its message. A success that a PSP reads in
/// its own words names none (WeChat Pay's empty 200, Alipay's `success`,
/// Adyen's `[accepted]`): it is [`UNLABELLED_SUCCESS`], processed or
/// duplicate, which the sender cannot tell apart. Any other answer without
/// a label (Alipay's `fail`) is `-`: its status says what it was.
fn answer_label(status: u16, body: &[u8]) -> String {
    let json = serde_json::from_slice::<serde_json::Value>(body).ok();
    let field = |name: &str| json.as_ref()?.get(name)?.as_str();
    if let Some(result) = field("result") {
        return result.to_owned();
    }
    if field("code") == Some("FAIL") {
        if let Some(message) = field("message") {
            return message.split(':').next().unwrap_or(message).to_owned();
        }
    }
    if (200..300).contains(&status) {
        UNLABELLED_SUCCESS.to_owned()
    } else {
        "-".to_owned()
    }
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
        plan_of(argv)
    }

    /// The plan of a command line, whatever FENCEHOOK_PROVIDERS the
    /// environment running the tests holds.
    fn plan_of(argv: Vec<&str>) -> Result<Plan, ArgError> {
        let mut cli = Cli::try_parse_from(argv).expect("flags parse");
        cli.load.psp.providers = None;
        Plan::from_args(&cli.load)
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
        assert!(shown.contains("Psp { provider: \"generic\""), "{shown}");
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
        assert_eq!(
            plan_of(vec!["load", "--secret", "hunter2"])
                .unwrap_err()
                .flag,
            "secret"
        );
    }

    #[test]
    fn what_a_scheme_needs_is_asked_for_before_the_run_by_its_flag() {
        for (args, flag) in [
            (&["--scheme", "wechatpay"][..], "private-key"),
            (&["--scheme", "alipay"][..], "private-key"),
            (&["--scheme", "paypal"][..], "private-key"),
            (&["--scheme", "adyen"][..], "secret"),
            (
                &["--private-key", "/nonexistent/key.pem"][..],
                "private-key",
            ),
            (&["--serve-cert", "cert.pem"][..], "serve-cert"),
        ] {
            let err = plan(args).unwrap_err();
            assert_eq!(err.flag, flag, "{args:?}: {err}");
        }
        let err = plan(&["--scheme", "wechatpay", "--failed-share", "0.1"]).unwrap_err();
        // The private key is checked first; the share is refused on its own.
        assert_eq!(err.flag, "private-key");
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
            let signed = sign(&p, &tx).expect("signs");
            assert_eq!(
                signed.headers[0],
                ("webhook-id", format!("msg_t_{n}")),
                "one message id for every copy"
            );
            let body = &signed.body;
            let item = fencehook::providers::standard::parse_generic("generic", body)
                .expect("valid payload");
            let fencehook::providers::Item::Event(ev) = item else {
                panic!("payment events are acted on")
            };
            assert_eq!(ev.transaction_id, tx.notice.transaction_id);
            assert!((1..=MAX_AMOUNT).contains(&ev.amount_minor));
            assert_eq!(ev.currency, "EUR");
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
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
        assert_eq!(tx.notice.event_type, "payment.succeeded");
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
    fn an_answer_is_labelled_by_its_result_or_by_its_status_when_it_names_none() {
        for (status, body, label) in [
            (200, &br#"{"result":"duplicate"}"#[..], "duplicate"),
            (409, br#"{"result":"in_progress"}"#, "in_progress"),
            (200, br#"{"result":7}"#, UNLABELLED_SUCCESS),
            // WeChat Pay: an empty success; a failure names the result first.
            (200, b"", UNLABELLED_SUCCESS),
            (
                400,
                br#"{"code":"FAIL","message":"invalid_payload: resource: no key opens it"}"#,
                "invalid_payload",
            ),
            (
                503,
                br#"{"code":"FAIL","message":"unavailable"}"#,
                "unavailable",
            ),
            // Alipay's words, Adyen's.
            (200, b"success", UNLABELLED_SUCCESS),
            (409, b"fail", "-"),
            (200, b"[accepted]", UNLABELLED_SUCCESS),
            (503, b"", "-"),
        ] {
            assert_eq!(
                answer_label(status, body),
                label,
                "{status} {}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

/// The RSA schemes' plans, with the tests' own keys.
#[cfg(all(test, feature = "test-support"))]
mod rsa_tests {
    use super::*;
    use clap::Parser;
    use fencehook::providers::testkeys;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    /// A temporary file holding `text`, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, text: &str) -> TempFile {
            let path = std::env::temp_dir().join(format!(
                "fencehook-load-{}-{name}",
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::write(&path, text).unwrap();
            TempFile(path)
        }

        fn path(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn plan(key: &TempFile, args: &[&str]) -> Result<Plan, ArgError> {
        let mut argv = vec!["load", "--private-key", key.path()];
        argv.extend_from_slice(args);
        let mut cli = Cli::try_parse_from(argv).expect("flags parse");
        cli.load.psp.providers = None;
        Plan::from_args(&cli.load)
    }

    const WECHAT: &[&str] = &[
        "--scheme",
        "wechatpay",
        "--serial",
        "PUB_KEY_ID_0000000000000024101100397200000006",
        "--apiv3-key",
        "fencehook-load-apiv3-key-32bytes",
    ];

    #[test]
    fn wechatpay_sends_no_payment_failure_so_its_failed_share_is_zero() {
        let key = TempFile::new("key.pem", &testkeys::private_key_pem(0));
        assert_eq!(plan(&key, WECHAT).unwrap().failed_share, 0.0);
        let mut args = WECHAT.to_vec();
        args.extend(["--failed-share", "0.1"]);
        assert_eq!(plan(&key, &args).unwrap_err().flag, "failed-share");
        let alipay = plan(
            &key,
            &["--scheme", "alipay", "--app-id", "2021000000000000"],
        )
        .unwrap();
        assert_eq!(alipay.failed_share, DEFAULT_FAILED_SHARE);
    }

    #[test]
    fn the_certificate_to_serve_must_be_of_the_private_key_valid_and_at_a_loopback_url() {
        let key = TempFile::new("key.pem", &testkeys::private_key_pem(0));
        let far = unix_now() as u64 + 86_400;
        let cert = |key: usize, not_after: u64| {
            testkeys::certificate(
                key,
                "0A",
                "CN=messageverificationcerts.paypal.com",
                0,
                not_after,
            )
        };
        let ours = TempFile::new("ours.crt", &cert(0, far));
        let paypal = |cert: &TempFile, url: &str| {
            plan(
                &key,
                &[
                    "--scheme",
                    "paypal",
                    "--webhook-id",
                    "WH-LOAD",
                    "--cert-url",
                    url,
                    "--serve-cert",
                    cert.path(),
                ],
            )
        };
        let p = paypal(&ours, "http://127.0.0.1:8099/certs/psp.crt").unwrap();
        let served = p.cert.as_ref().expect("served by the load");
        assert_eq!(served.addr, "127.0.0.1:8099".parse().unwrap());

        let other = TempFile::new("other.crt", &cert(1, far));
        let expired = TempFile::new("expired.crt", &cert(0, 1_000));
        let not_a_cert = TempFile::new("key.crt", &testkeys::public_key_pem(0));
        for (file, url, flag, why) in [
            (
                &other,
                "http://127.0.0.1:8099/c",
                "serve-cert",
                "--private-key's key",
            ),
            (
                &expired,
                "http://127.0.0.1:8099/c",
                "serve-cert",
                "validity",
            ),
            (
                &not_a_cert,
                "http://127.0.0.1:8099/c",
                "serve-cert",
                "CERTIFICATE",
            ),
            (&ours, "https://api.paypal.com/c", "cert-url", "http://"),
        ] {
            let err = paypal(file, url).unwrap_err();
            assert_eq!(err.flag, flag, "{err}");
            assert!(err.reason.contains(why), "{err}");
        }
        let alipay = plan(
            &key,
            &[
                "--scheme",
                "alipay",
                "--app-id",
                "1",
                "--serve-cert",
                ours.path(),
            ],
        );
        assert_eq!(alipay.unwrap_err().flag, "serve-cert");
    }
}
