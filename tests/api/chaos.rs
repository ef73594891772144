//! `make chaos`: a seeded, bounded run. Three `fencehook serve` processes take
//! a duplicate-heavy load (each event delivered k times at once, every
//! delivery retried like a PSP until it gets a 200) of payments' whole lives —
//! failures then successes, partial refunds, refund failures, disputes and
//! their reinstatements, each life's events launched in a random order —
//! while a random schedule of
//! faults fires: instances SIGKILLed and restarted, SIGSTOPped past their TTL,
//! Redis killed and restarted empty or stalled, PostgreSQL cut or its backends
//! terminated. Afterwards it checks the history against the database:
//! every 200 has a committed terminal row, every event eventually got a 200,
//! each object's ledger comes to what its set of events says (whatever the
//! order), and the audit (one entry per effect, money out within money in)
//! is clean.
//!
//! `CHAOS_SEED` replays a run; `CHAOS_DURATION_SECS` (default 60) bounds it.
//! Ignored in `cargo test`; run by `make chaos`
//! (`cargo test --test api chaos:: -- --ignored`).
//!
//! `CHAOS_MODE=inbox` (`make chaos-inbox`) runs the instances in inbox mode
//! (`FENCEHOOK_MODE=inbox`, two workers each): deliveries are answered
//! `accepted` once stored and workers book them, retrying a failed downstream
//! call with backoff. Two more faults join the schedule: an instance
//! SIGKILLed while its workers hold leases (mid-attempt) and restarted, and a
//! downstream that answers 500 for a while. Afterwards the run waits (at most
//! [`DRAIN_WAIT`]) until no event is queued or processing, then checks that
//! every event answered 200 has a row and an event, that no event is dead
//! (with 1000 attempts and the downstream back up, none may die), and the
//! same ledger and audit checks as sync mode.
//!
//! A share of the lives goes through a `stripe` provider, and the PSP
//! "forgets" some of their webhooks: each Stripe event is put in a mock of
//! Stripe's events API (the PSP's record) and delivered like the rest,
//! except a seeded [`FORGOTTEN`] share that is never delivered. The
//! instances reconcile on a schedule (every [`RECONCILE_INTERVAL_SECS`]) while
//! the faults fire, and one `fencehook reconcile` runs after the load; then
//! every event the PSP holds must be booked exactly once (one row per
//! transaction, the ledger as its events say), the forgotten ones included.
//! The Stripe lives draw from a randomness of their own, so a seed's generic
//! lives and fault schedule are the same as without them.
//!
//! `CHAOS_LEASE_BACKEND=postgres` runs the instances on the PostgreSQL lease
//! backend, and `CHAOS_DOWNSTREAM=off` without a downstream service: both
//! together exercise the lease taken inside the write. The Redis faults still
//! fire; with the PostgreSQL backend they hit nothing the instances use.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use fencehook::providers::psp::Notice;
use fencehook::providers::stripe;
use serde_json::{json, Value};

use crate::helpers::downstream::MockDownstream;
use crate::helpers::process::{
    deliver_stripe_to, deliver_to, fencehook_tool, PrivateRedis, ServeProcess,
};
use crate::helpers::proxy::FaultProxy;
use crate::helpers::psp_api::{MockPspApi, STRIPE_KEY};
use crate::helpers::{expected_net, now, payment, socket_of, Reply, TestContext, SECRET};

const INSTANCES: usize = 3;
const DUPLICATES: usize = 4;
const TTL_MS: u64 = 1000;
/// The mock downstream's answer time outside faults.
const DOWNSTREAM_DELAY: Duration = Duration::from_millis(20);
/// Inbox mode: longest wait after the load for the workers to finish.
const DRAIN_WAIT: Duration = Duration::from_secs(90);
/// A Stripe life starts this often (the generic ones every 25 ms).
const STRIPE_EVERY: Duration = Duration::from_millis(250);
/// The share of Stripe events whose webhooks the PSP never sends.
const FORGOTTEN: f64 = 0.2;
/// How often each instance runs a scheduled reconcile: several runs while
/// the faults fire.
const RECONCILE_INTERVAL_SECS: u64 = 2;
/// The `stripe` provider's endpoint secret.
const STRIPE_SECRET: &str = "whsec_fencehook_chaos_stripe_endpoint_secret";
/// Longest the final `fencehook reconcile` waits for a scheduled run that
/// holds the provider.
const RECONCILE_BUSY_WAIT: Duration = Duration::from_secs(120);

/// `CHAOS_MODE`: how the instances answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Book, then answer (`processed`).
    Sync,
    /// Store, answer `accepted`, book in the background.
    Inbox,
}

impl Mode {
    fn from_env() -> Mode {
        match std::env::var("CHAOS_MODE").as_deref() {
            Err(_) | Ok("" | "sync") => Mode::Sync,
            Ok("inbox") => Mode::Inbox,
            Ok(other) => panic!("CHAOS_MODE must be sync or inbox, not {other:?}"),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Inbox => "inbox",
        }
    }
}

/// One event the PSP holds: in its events API, delivered as a webhook
/// unless forgotten.
struct PspEvent {
    id: String,
    transaction_id: String,
    event_type: String,
    forgotten: bool,
}

#[derive(Default)]
struct History {
    /// Every answer, per (transaction, event type).
    answers: HashMap<(String, String), Vec<Reply>>,
    /// What each object's ledger must come to, from its set of events.
    expected_net: HashMap<String, i64>,
    faults: BTreeMap<&'static str, usize>,
    log: Vec<String>,
    /// What the PSP (Stripe) holds, in the order it took them.
    psp: Vec<PspEvent>,
}

struct Env {
    mode: Mode,
    ctx: TestContext,
    pg_proxy: FaultProxy,
    redis_proxy: FaultProxy,
    redis: tokio::sync::Mutex<PrivateRedis>,
    downstream: MockDownstream,
    /// `CHAOS_LEASE_BACKEND`: `redis` (the default) or `postgres`.
    lease_backend: String,
    /// `CHAOS_DOWNSTREAM`: `on` (the default) or `off` (the inline path).
    downstream_on: bool,
    /// Stripe's events API: the PSP's record.
    psp: MockPspApi,
    /// The providers file: `generic` and `stripe` (with API credentials).
    providers: std::path::PathBuf,
}

impl Env {
    fn serve_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (
                "DATABASE_URL",
                self.ctx.database_url_via(self.pg_proxy.addr()),
            ),
            ("REDIS_URL", format!("redis://{}", self.redis_proxy.addr())),
            ("FENCEHOOK_REDIS_KEY_PREFIX", self.ctx.prefix.clone()),
            ("FENCEHOOK_LEASE_TTL_MS", TTL_MS.to_string()),
            ("FENCEHOOK_LEASE_TIMEOUT_MS", "250".to_owned()),
            ("FENCEHOOK_INFLIGHT_WAIT_MS", "500".to_owned()),
            ("FENCEHOOK_DB_POOL_SIZE", "6".to_owned()),
            ("FENCEHOOK_DB_POOL_WAIT_MS", "1000".to_owned()),
            ("FENCEHOOK_DB_STATEMENT_TIMEOUT_MS", "3000".to_owned()),
            ("FENCEHOOK_DB_CONNECT_TIMEOUT_MS", "1000".to_owned()),
            (
                "FENCEHOOK_DOWNSTREAM_URL",
                self.downstream.url().to_string(),
            ),
            ("FENCEHOOK_DOWNSTREAM_TIMEOUT_MS", "2000".to_owned()),
            ("FENCEHOOK_LEASE_BACKEND", self.lease_backend.clone()),
            (
                "FENCEHOOK_LOG",
                "warn,fencehook=info,fencehook::http::webhook=warn".to_owned(),
            ),
            ("FENCEHOOK_PROVIDERS", self.providers.display().to_string()),
            (
                "FENCEHOOK_RECONCILE_INTERVAL_SECS",
                RECONCILE_INTERVAL_SECS.to_string(),
            ),
            // The whole run, from the first scheduled run on.
            ("FENCEHOOK_RECONCILE_LOOKBACK_SECS", "3600".to_owned()),
            // Runs race webhooks still on their way, as they may.
            ("FENCEHOOK_RECONCILE_SETTLE_SECS", "1".to_owned()),
        ];
        if !self.downstream_on {
            env.retain(|(name, _)| *name != "FENCEHOOK_DOWNSTREAM_URL");
        }
        if self.mode == Mode::Inbox {
            env.extend([
                ("FENCEHOOK_MODE", "inbox".to_owned()),
                ("FENCEHOOK_WORKERS", "2".to_owned()),
                // Flapping downstream: retried, never given up.
                ("FENCEHOOK_MAX_ATTEMPTS", "1000".to_owned()),
                ("FENCEHOOK_RETRY_BASE_MS", "50".to_owned()),
                ("FENCEHOOK_RETRY_MAX_MS", "1000".to_owned()),
                // A worker owns a taken event for max hold + TTL; 10 s (not the
                // default 60 s) so the events of a SIGKILLed worker are taken
                // again well within the drain wait. Still above the downstream
                // timeout + TTL, as the configuration requires.
                ("FENCEHOOK_LEASE_MAX_MS", "10000".to_owned()),
            ]);
        }
        env
    }

    /// Writes the providers file: the generic provider the load signs for,
    /// and a Stripe one that can reconcile against the mock.
    fn write_providers(path: &std::path::Path, psp: &MockPspApi) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            path,
            format!(
                "[providers.generic]\nscheme = \"standard\"\nsecrets = [\"{SECRET}\"]\n\n\
                 [providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"{STRIPE_SECRET}\"]\n\
                 api_key = \"{STRIPE_KEY}\"\napi_url = \"{}\"\n",
                psp.url()
            ),
        )
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long-running; run with `make chaos`"]
async fn chaos() {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let secs: u64 = std::env::var("CHAOS_DURATION_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let mode = Mode::from_env();
    let lease_backend = match std::env::var("CHAOS_LEASE_BACKEND").as_deref() {
        Err(_) | Ok("" | "redis") => "redis",
        Ok("postgres") => "postgres",
        Ok(other) => panic!("CHAOS_LEASE_BACKEND must be redis or postgres, not {other:?}"),
    };
    let downstream_on = match std::env::var("CHAOS_DOWNSTREAM").as_deref() {
        Err(_) | Ok("" | "on") => true,
        Ok("off") => false,
        Ok(other) => panic!("CHAOS_DOWNSTREAM must be on or off, not {other:?}"),
    };
    println!(
        "chaos: seed {seed} (replay with CHAOS_SEED={seed}{} CHAOS_LEASE_BACKEND={lease_backend} CHAOS_DOWNSTREAM={}), {secs} s, {INSTANCES} instances, k={DUPLICATES}, {} mode",
        if mode == Mode::Inbox { " CHAOS_MODE=inbox" } else { "" },
        if downstream_on { "on" } else { "off" },
        mode.as_str()
    );
    let mut rng = StdRng::seed_from_u64(seed);

    let ctx = TestContext::new().await;
    let redis = PrivateRedis::start().await;
    let redis_proxy = FaultProxy::start(redis.addr).await;
    let pg_proxy = FaultProxy::start(socket_of(&ctx.database_url)).await;
    let downstream = MockDownstream::start().await;
    downstream.set_delay(DOWNSTREAM_DELAY);
    let psp = MockPspApi::start().await;
    let providers = std::env::temp_dir()
        .join(format!("fh-chaos-{}", ctx.prefix))
        .join("providers.toml");
    Env::write_providers(&providers, &psp);
    let env = Arc::new(Env {
        mode,
        ctx,
        pg_proxy,
        redis_proxy,
        redis: tokio::sync::Mutex::new(redis),
        downstream,
        lease_backend: lease_backend.to_owned(),
        downstream_on,
        psp,
        providers,
    });

    let mut procs = Vec::new();
    for _ in 0..INSTANCES {
        procs.push(Some(ServeProcess::start(&env.serve_env()).await));
    }
    let bases: Arc<RwLock<Vec<String>>> = Arc::new(RwLock::new(
        procs
            .iter()
            .map(|p| p.as_ref().unwrap().base.clone())
            .collect(),
    ));
    let history = Arc::new(Mutex::new(History::default()));
    let start = Instant::now();
    let load_end = start + Duration::from_secs(secs);
    // Deliveries keep retrying (like a PSP) for a while after the faults stop.
    let settle_end = load_end + Duration::from_secs(45);

    // The load: a new payment life every 25 ms, its events launched in a
    // random order, each event delivered k times at once (children twice).
    let load = {
        let (bases, history) = (bases.clone(), history.clone());
        let mut load_rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        tokio::spawn(async move {
            let mut deliveries = Vec::new();
            let mut t = 0usize;
            while Instant::now() < load_end {
                let events = life(Names::GENERIC, t, &mut load_rng);
                expect(&history, &events);
                for (n, e) in events.into_iter().enumerate() {
                    let copies = if n == 0 { DUPLICATES } else { 2 };
                    let delay = Duration::from_millis(load_rng.gen_range(0..300));
                    for _ in 0..copies {
                        let first = load_rng.gen_range(0..INSTANCES);
                        let (bases, history) = (bases.clone(), history.clone());
                        let delivery = Delivery {
                            key: key_of(&e),
                            webhook: Webhook::Generic(e.clone()),
                        };
                        deliveries.push(tokio::spawn(
                            delivery.until_200(bases, history, first, delay, settle_end),
                        ));
                    }
                }
                t += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            for d in deliveries {
                let _ = d.await;
            }
        })
    };

    // The Stripe lives, from a randomness of their own: each event goes
    // into the PSP's record, then out as k webhooks like the rest, unless
    // the PSP forgets it.
    let stripe_load = {
        let (bases, history, env) = (bases.clone(), history.clone(), env.clone());
        let mut psp_rng = StdRng::seed_from_u64(seed ^ 0x0057_219e);
        tokio::spawn(async move {
            let mut deliveries = Vec::new();
            let mut t = 0usize;
            while Instant::now() < load_end {
                let events = life(Names::STRIPE, t, &mut psp_rng);
                expect(&history, &events);
                for (n, e) in events.into_iter().enumerate() {
                    let id = format!("evt_chaos_{t}_{n}");
                    let event = stripe::event_of(&notice_of(&e), &id, now()).unwrap();
                    env.psp.add_stripe(event.clone());
                    let forgotten = psp_rng.gen_bool(FORGOTTEN);
                    let key = key_of(&e);
                    history.lock().unwrap().psp.push(PspEvent {
                        id,
                        transaction_id: key.0.clone(),
                        event_type: key.1.clone(),
                        forgotten,
                    });
                    if forgotten {
                        continue;
                    }
                    let copies = if n == 0 { DUPLICATES } else { 2 };
                    let delay = Duration::from_millis(psp_rng.gen_range(0..300));
                    for _ in 0..copies {
                        let first = psp_rng.gen_range(0..INSTANCES);
                        let delivery = Delivery {
                            key: key.clone(),
                            webhook: Webhook::Stripe(event.clone()),
                        };
                        deliveries.push(tokio::spawn(delivery.until_200(
                            bases.clone(),
                            history.clone(),
                            first,
                            delay,
                            settle_end,
                        )));
                    }
                }
                t += 1;
                tokio::time::sleep(STRIPE_EVERY).await;
            }
            for d in deliveries {
                let _ = d.await;
            }
        })
    };

    // The faults.
    while Instant::now() + Duration::from_secs(3) < load_end {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(1500..4000))).await;
        let at = start.elapsed().as_secs_f64();
        // Sync mode draws from the first six exactly as before, so its seeds
        // replay the same schedules.
        let kinds = if mode == Mode::Inbox { 8 } else { 6 };
        let kind = rng.gen_range(0..kinds);
        let mut detail = String::new();
        let name = match kind {
            0 => {
                let i = rng.gen_range(0..INSTANCES);
                procs[i].as_ref().unwrap().signal("KILL");
                procs[i] = None;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(500..2000))).await;
                let p = ServeProcess::start(&env.serve_env()).await;
                bases.write().unwrap()[i] = p.base.clone();
                procs[i] = Some(p);
                "instance SIGKILL + restart"
            }
            1 => {
                let i = rng.gen_range(0..INSTANCES);
                let p = procs[i].as_ref().unwrap();
                p.signal("STOP");
                tokio::time::sleep(Duration::from_millis(
                    rng.gen_range(TTL_MS * 3 / 2..TTL_MS * 3),
                ))
                .await;
                p.signal("CONT");
                "instance SIGSTOP past TTL"
            }
            2 => {
                let mut redis = env.redis.lock().await;
                redis.kill().await;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(500..2000))).await;
                redis.restart().await;
                "redis SIGKILL + restart empty"
            }
            3 => {
                env.redis_proxy.pause();
                tokio::time::sleep(Duration::from_millis(rng.gen_range(300..2000))).await;
                env.redis_proxy.resume();
                "redis traffic paused"
            }
            4 => {
                env.pg_proxy.cut();
                tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
                env.pg_proxy.restore();
                "postgres connections cut"
            }
            5 => {
                let _ = env
                    .ctx
                    .db()
                    .await
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE datname = $1 AND application_name LIKE 'fencehook%'",
                        &[&env.ctx.db_name],
                    )
                    .await;
                "postgres backends terminated"
            }
            6 => {
                // Inbox only: kill an instance in the middle of its workers'
                // attempts. A slow downstream keeps them there; the instance's
                // own gauge of leases held says when it holds work.
                let i = rng.gen_range(0..INSTANCES);
                let slow = Duration::from_millis(rng.gen_range(300..1500));
                let pause = Duration::from_millis(rng.gen_range(500..2000));
                env.downstream.set_delay(slow);
                let p = procs[i].as_ref().unwrap();
                let mut held = 0.0;
                let give_up = Instant::now() + Duration::from_secs(3);
                while Instant::now() < give_up {
                    held = p.metric("fencehook_leases_held", &[]).await;
                    if held >= 1.0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let processing = env
                    .ctx
                    .count("SELECT count(*) FROM events WHERE status = 'processing'")
                    .await;
                p.signal("KILL");
                procs[i] = None;
                env.downstream.set_delay(DOWNSTREAM_DELAY);
                detail = format!(
                    " (instance {i} held {held} lease(s); {processing} event(s) processing)"
                );
                tokio::time::sleep(pause).await;
                let p = ServeProcess::start(&env.serve_env()).await;
                bases.write().unwrap()[i] = p.base.clone();
                procs[i] = Some(p);
                if held >= 1.0 {
                    "instance SIGKILL mid-attempt + restart"
                } else {
                    "instance SIGKILL (idle) + restart"
                }
            }
            7 => {
                // Inbox only: the downstream fails for a while; workers retry
                // with backoff, spending attempts.
                env.downstream.set_status(500);
                tokio::time::sleep(Duration::from_millis(rng.gen_range(500..2000))).await;
                env.downstream.set_status(200);
                "downstream answering 500"
            }
            _ => unreachable!("fault kinds are 0..{kinds}"),
        };
        let mut h = history.lock().unwrap();
        *h.faults.entry(name).or_default() += 1;
        h.log.push(format!("  t={at:6.1}s  {name}{detail}"));
    }
    load.await.unwrap();
    stripe_load.await.unwrap();

    // Every delivery has its answer; one reconcile after the faults books
    // whatever the scheduled ones did not get to (deterministically).
    let final_run = final_reconcile(&env).await;

    // Inbox mode: the workers finish what was accepted (and reconciled).
    let drain = match mode {
        Mode::Sync => None,
        Mode::Inbox => Some(wait_for_drain(&env.ctx).await),
    };
    // (transaction, event type) → status of every stored event.
    let events: HashMap<(String, String), String> = env
        .ctx
        .db()
        .await
        .query("SELECT transaction_id, event_type, status FROM events", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();

    // Check the history against the database.
    let h = std::mem::take(&mut *history.lock().unwrap());
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    let mut violations = Vec::new();
    let mut deliveries = 0;
    for ((tx, event_type), answers) in &h.answers {
        for a in answers {
            deliveries += 1;
            let label = if a.status == 0 {
                "000 (no answer)".to_owned()
            } else {
                format!("{} {}", a.status, a.result())
            };
            *by_status.entry(label).or_default() += 1;
        }
        let got_200 = answers.iter().any(|a| a.status == 200);
        if !got_200 {
            violations.push(format!("{tx} {event_type}: never answered 200"));
            continue;
        }
        let row: Option<(String, i64)> = env.ctx.payment(tx).await;
        match (mode, row.as_ref().map(|r| r.0.as_str())) {
            (_, Some("succeeded" | "failed")) => {}
            (Mode::Sync, other) => violations.push(format!(
                "{tx} {event_type}: answered 200 but the row is {other:?}"
            )),
            (Mode::Inbox, None) => violations.push(format!(
                "{tx} {event_type}: answered 200 but there is no row"
            )),
            // `accepted` promises a row in any status; once the inbox is
            // drained with no event dead, every row is booked.
            (Mode::Inbox, Some(status)) => violations.push(format!(
                "{tx} {event_type}: answered 200, the inbox drained, but the row is {status}"
            )),
        }
        if mode == Mode::Inbox && !events.contains_key(&(tx.clone(), event_type.clone())) {
            violations.push(format!(
                "{tx} {event_type}: answered 200 but no event is stored"
            ));
        }
    }
    violations.extend(psp_violations(&env, &h.psp, &events, &final_run).await);
    if mode == Mode::Inbox {
        // With 1000 attempts and the downstream up at the end, nothing may
        // die; nothing may be left over either.
        for r in env
            .ctx
            .db()
            .await
            .query(
                "SELECT transaction_id, event_type, status, attempts, coalesce(last_error, '')
                   FROM events WHERE status <> 'done' ORDER BY id",
                &[],
            )
            .await
            .unwrap()
        {
            let (tx, event_type, status): (String, String, String) = (r.get(0), r.get(1), r.get(2));
            let (attempts, error): (i32, String) = (r.get(3), r.get(4));
            violations.push(format!(
                "{tx} {event_type}: event {status} after the drain wait ({attempts} attempt(s); last error: {error})"
            ));
        }
    }
    let nets: HashMap<String, i64> = env
        .ctx
        .db()
        .await
        .query(
            "SELECT p.transaction_id, coalesce(sum(l.amount_minor), 0)::bigint
               FROM payments p LEFT JOIN ledger_entries l ON l.payment_id = p.id
              GROUP BY p.transaction_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (tx, want) in &h.expected_net {
        let got = nets.get(tx).copied().unwrap_or(0);
        if got != *want {
            violations.push(format!(
                "{tx}: its ledger comes to {got}, its events to {want}"
            ));
        }
    }
    for c in fencehook::store::audit::run(&env.ctx.database_url)
        .await
        .unwrap()
    {
        for v in c.violations {
            violations.push(format!("audit {}: {v}", c.name));
        }
    }
    let payments = env.ctx.payments().await;
    let entries = env.ctx.entries().await;

    println!("\nchaos summary (seed {seed}, {secs} s)");
    println!("  objects               {:>8}", h.expected_net.len());
    println!("  events                {:>8}", h.answers.len());
    println!("  deliveries (attempts) {deliveries:>8}");
    println!("  payments rows         {payments:>8}");
    println!("  ledger entries        {entries:>8}");
    println!("  answers:");
    for (k, v) in &by_status {
        println!("    {k:<28}{v:>8}");
    }
    print_reconcile(&env.ctx, &h.psp, &final_run).await;
    println!("  faults injected:");
    for (k, v) in &h.faults {
        println!("    {k:<28}{v:>8}");
    }
    println!("  fault timeline:");
    for l in &h.log {
        println!("  {l}");
    }
    if let Some((waited, drained)) = drain {
        let by: BTreeMap<&str, usize> = events.values().fold(BTreeMap::new(), |mut m, s| {
            *m.entry(s.as_str()).or_default() += 1;
            m
        });
        let n = |s: &str| by.get(s).copied().unwrap_or(0);
        println!("  events stored         {:>8}", events.len());
        println!(
            "    queued {}  processing {}  done {}  dead {}",
            n("queued"),
            n("processing"),
            n("done"),
            n("dead")
        );
        let r = env
            .ctx
            .db()
            .await
            .query_one(
                "SELECT coalesce(sum(attempts), 0)::bigint, count(*) FILTER (WHERE attempts > 0),
                        percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                            ORDER BY extract(epoch FROM finished_at - received_at)::float8),
                        extract(epoch FROM max(finished_at - received_at))::float8
                   FROM events",
                &[],
            )
            .await
            .unwrap();
        let (spent, retried): (i64, i64) = (r.get(0), r.get(1));
        let lag: Vec<f64> = r.get::<_, Option<Vec<f64>>>(2).unwrap_or_default();
        let max: f64 = r.get::<_, Option<f64>>(3).unwrap_or_default();
        println!("    {spent} attempt(s) spent on failed downstream calls, by {retried} event(s)");
        if let [p50, p99] = lag[..] {
            println!(
                "    lag (finished - received) p50 {:.0} ms  p99 {:.0} ms  max {:.0} ms",
                p50 * 1000.0,
                p99 * 1000.0,
                max * 1000.0
            );
        }
        println!(
            "  drain wait            {:>7.1}s  ({})",
            waited.as_secs_f64(),
            if drained {
                "nothing left queued or processing"
            } else {
                "TIMED OUT"
            }
        );
    }
    println!("  violations            {:>8}", violations.len());
    for v in violations.iter().take(20) {
        println!("    {v}");
    }
    assert!(
        violations.is_empty(),
        "chaos found {} violation(s); replay with CHAOS_SEED={seed}",
        violations.len()
    );
}

/// The webhooks the load sends.
#[derive(Clone)]
enum Webhook {
    /// A generic payload, to `/webhooks/generic`.
    Generic(Value),
    /// A Stripe event, signed, to `/webhooks/stripe`.
    Stripe(Value),
}

impl Webhook {
    async fn to(&self, base: &str) -> Reply {
        match self {
            Webhook::Generic(e) => deliver_to(base, e).await,
            Webhook::Stripe(e) => deliver_stripe_to(base, "stripe", e, STRIPE_SECRET).await,
        }
    }
}

/// One copy of an event's webhook, its answers kept under `key`.
struct Delivery {
    /// (transaction, event type).
    key: (String, String),
    webhook: Webhook,
}

impl Delivery {
    /// Sends it after `delay` to instance `first`, then again every 200 ms,
    /// each time to the next instance (a PSP's retry may land on another),
    /// until it is answered 200 or `settle_end` passes.
    async fn until_200(
        self,
        bases: Arc<RwLock<Vec<String>>>,
        history: Arc<Mutex<History>>,
        first: usize,
        delay: Duration,
        settle_end: Instant,
    ) {
        tokio::time::sleep(delay).await;
        let mut i = first;
        loop {
            let base = bases.read().unwrap()[i % INSTANCES].clone();
            let r = self.webhook.to(&base).await;
            let done = r.status == 200;
            history
                .lock()
                .unwrap()
                .answers
                .entry(self.key.clone())
                .or_default()
                .push(r);
            if done || Instant::now() >= settle_end {
                return;
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// (transaction, event type) of a generic payload.
fn key_of(e: &Value) -> (String, String) {
    (
        e["transaction_id"].as_str().unwrap().to_owned(),
        e["event_type"].as_str().unwrap().to_owned(),
    )
}

/// Records what each object's ledger must come to after `events`.
fn expect(history: &Mutex<History>, events: &[Value]) {
    let mut h = history.lock().unwrap();
    for (tx, net) in expected_net(events) {
        h.expected_net.insert(tx, net);
    }
}

/// The generic payload `e` as the notice a PSP's event is made of.
fn notice_of(e: &Value) -> Notice {
    Notice {
        transaction_id: e["transaction_id"].as_str().unwrap().to_owned(),
        amount: e["amount"].as_i64().unwrap(),
        currency: e["currency"].as_str().unwrap().to_owned(),
        event_type: e["event_type"].as_str().unwrap().to_owned(),
        payment_transaction_id: e["payment_transaction_id"].as_str().map(str::to_owned),
    }
}

/// The `fencehook reconcile` run after the load.
struct FinalRun {
    code: i32,
    /// Its `--json` line for `stripe`.
    report: Value,
    /// How often it found a scheduled run holding the provider first.
    busy: usize,
}

/// Runs `fencehook reconcile --provider stripe` with the instances'
/// settings, again while a scheduled run holds the provider (at most
/// [`RECONCILE_BUSY_WAIT`]).
async fn final_reconcile(env: &Env) -> FinalRun {
    let started = Instant::now();
    let mut busy = 0;
    loop {
        let (code, out, err) = fencehook_tool(
            &["reconcile", "--provider", "stripe", "--json"],
            &env.serve_env(),
        )
        .await;
        let report: Value = out
            .lines()
            .next()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| json!({"status": "no output", "error": err}));
        if report["status"] == "busy" && started.elapsed() < RECONCILE_BUSY_WAIT {
            busy += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        return FinalRun { code, report, busy };
    }
}

/// Every event the PSP holds is booked exactly once: the final reconcile
/// completed without a divergence, each of its transactions has one row, of
/// the `stripe` provider, booked (`succeeded` or `failed`), and in inbox
/// mode each event is stored. (Its ledger is checked with the rest.)
async fn psp_violations(
    env: &Env,
    psp: &[PspEvent],
    events: &HashMap<(String, String), String>,
    run: &FinalRun,
) -> Vec<String> {
    let mut violations = Vec::new();
    if run.code != 0 || run.report["status"] != "completed" {
        violations.push(format!(
            "the final reconcile exited {}: {}",
            run.code, run.report
        ));
    }
    // transaction → (provider, status) of each of its rows.
    let mut rows: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for r in env
        .ctx
        .db()
        .await
        .query("SELECT transaction_id, provider, status FROM payments", &[])
        .await
        .unwrap()
    {
        rows.entry(r.get(0)).or_default().push((r.get(1), r.get(2)));
    }
    for e in psp {
        let how = if e.forgotten {
            "forgotten"
        } else {
            "delivered"
        };
        let (tx, event_type) = (&e.transaction_id, &e.event_type);
        match rows.get(tx).map(Vec::as_slice).unwrap_or_default() {
            [(provider, status)]
                if provider == "stripe" && (status == "succeeded" || status == "failed") => {}
            other => violations.push(format!(
                "{tx} {event_type} ({}, {how}): the PSP holds it, its rows are {other:?}",
                e.id
            )),
        }
        if env.mode == Mode::Inbox && !events.contains_key(&(tx.clone(), event_type.clone())) {
            violations.push(format!(
                "{tx} {event_type} ({}, {how}): the PSP holds it, no event is stored",
                e.id
            ));
        }
    }
    violations
}

/// What the PSP held, and what the reconciliation recovered: by the
/// scheduled runs during the faults, and by the final run.
async fn print_reconcile(ctx: &TestContext, psp: &[PspEvent], run: &FinalRun) {
    let forgotten: std::collections::HashSet<&str> = psp
        .iter()
        .filter(|e| e.forgotten)
        .map(|e| e.id.as_str())
        .collect();
    let db = ctx.db().await;
    // trigger → (runs, failed runs, recovered, recovered that were forgotten)
    let mut by: BTreeMap<String, (i64, i64, i64, usize)> = BTreeMap::new();
    for r in db
        .query(
            "SELECT trigger, count(*), count(*) FILTER (WHERE error IS NOT NULL),
                    coalesce(sum(recovered), 0)::bigint
               FROM reconcile_runs GROUP BY trigger",
            &[],
        )
        .await
        .unwrap()
    {
        by.insert(r.get(0), (r.get(1), r.get(2), r.get(3), 0));
    }
    for r in db
        .query(
            "SELECT r.trigger, f.psp_event_id FROM reconcile_findings f
               JOIN reconcile_runs r ON r.id = f.run_id WHERE f.result = 'recovered'",
            &[],
        )
        .await
        .unwrap()
    {
        let (trigger, id): (String, String) = (r.get(0), r.get(1));
        if forgotten.contains(id.as_str()) {
            by.entry(trigger).or_default().3 += 1;
        }
    }
    println!(
        "  stripe events the PSP holds {:>6}  ({} forgotten: never delivered)",
        psp.len(),
        forgotten.len()
    );
    for (trigger, (runs, failed, recovered, of_forgotten)) in &by {
        println!(
            "    {trigger:<9} runs {runs:>4} ({failed} failed)  recovered {recovered:>5} ({of_forgotten} forgotten, {} late webhooks)",
            *recovered - *of_forgotten as i64
        );
    }
    let r = &run.report;
    println!(
        "    final reconcile: exit {}, {} (after {} busy), listed {} known {} recovered {} ignored {} refused {} divergent {}",
        run.code, r["status"], run.busy, r["listed"], r["known"], r["recovered"], r["ignored"], r["refused"], r["divergent"]
    );
}

/// Inbox mode: waits (at most [`DRAIN_WAIT`]) until no event is queued or
/// processing. Returns how long it waited and whether the inbox drained.
async fn wait_for_drain(ctx: &TestContext) -> (Duration, bool) {
    let started = Instant::now();
    loop {
        let unfinished = ctx
            .count("SELECT count(*) FROM events WHERE status IN ('queued', 'processing')")
            .await;
        if unfinished == 0 {
            return (started.elapsed(), true);
        }
        if started.elapsed() >= DRAIN_WAIT {
            return (started.elapsed(), false);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How a life's transactions are named: `{payment}_{tag}_{t}` for the
/// payment, `re_{tag}_{t}` and `dp_{tag}_{t}` for its children.
#[derive(Clone, Copy)]
struct Names {
    payment: &'static str,
    tag: &'static str,
}

impl Names {
    const GENERIC: Names = Names {
        payment: "tx",
        tag: "chaos",
    };
    /// Stripe's own prefix for a PaymentIntent; a tag of their own.
    const STRIPE: Names = Names {
        payment: "pi",
        tag: "chaos_stripe",
    };
}

/// The events of one payment's life, in a random order: a payment (5 %
/// failed for good, 10 % failed before it succeeds), and for a fifth of them
/// a partial refund, sometimes a second one that fails, sometimes a dispute
/// that may be reinstated. Children never take more than the payment.
fn life(names: Names, t: usize, rng: &mut StdRng) -> Vec<serde_json::Value> {
    let Names {
        payment: prefix,
        tag,
    } = names;
    let pay = format!("{prefix}_{tag}_{t}");
    let amount = rng.gen_range(4..100_000);
    let child = |event_type: &str, tx: String, amount: i64| {
        let mut e = payment(&tx, amount);
        e["event_type"] = event_type.into();
        e["payment_transaction_id"] = pay.clone().into();
        e
    };
    let with_type = |event_type: &str| {
        let mut e = payment(&pay, amount);
        e["event_type"] = event_type.into();
        e
    };
    if rng.gen_bool(0.05) {
        return vec![with_type("payment.failed")];
    }
    let mut events = vec![payment(&pay, amount)];
    if rng.gen_bool(0.1) {
        events.push(with_type("payment.failed"));
    }
    if rng.gen_bool(0.2) {
        let quarter = amount / 4;
        events.push(child("refund.succeeded", format!("re_{tag}_{t}"), quarter));
        if rng.gen_bool(0.5) {
            let tx = format!("re_{tag}_{t}_b");
            events.push(child("refund.succeeded", tx.clone(), quarter));
            events.push(child("refund.failed", tx, quarter));
        }
        if rng.gen_bool(0.5) {
            let tx = format!("dp_{tag}_{t}");
            events.push(child("dispute.funds_withdrawn", tx.clone(), quarter));
            if rng.gen_bool(0.5) {
                events.push(child("dispute.funds_reinstated", tx, quarter));
            }
        }
    }
    events.shuffle(rng);
    events
}
