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

use crate::helpers::downstream::MockDownstream;
use crate::helpers::process::{deliver_to, PrivateRedis, ServeProcess};
use crate::helpers::proxy::FaultProxy;
use crate::helpers::{expected_net, payment, socket_of, Reply, TestContext};

const INSTANCES: usize = 3;
const DUPLICATES: usize = 4;
const TTL_MS: u64 = 1000;
/// The mock downstream's answer time outside faults.
const DOWNSTREAM_DELAY: Duration = Duration::from_millis(20);
/// Inbox mode: longest wait after the load for the workers to finish.
const DRAIN_WAIT: Duration = Duration::from_secs(90);

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

#[derive(Default)]
struct History {
    /// Every answer, per (transaction, event type).
    answers: HashMap<(String, String), Vec<Reply>>,
    /// What each object's ledger must come to, from its set of events.
    expected_net: HashMap<String, i64>,
    faults: BTreeMap<&'static str, usize>,
    log: Vec<String>,
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
    let env = Arc::new(Env {
        mode,
        ctx,
        pg_proxy,
        redis_proxy,
        redis: tokio::sync::Mutex::new(redis),
        downstream,
        lease_backend: lease_backend.to_owned(),
        downstream_on,
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
                let events = life(t, &mut load_rng);
                {
                    let mut h = history.lock().unwrap();
                    for (tx, net) in expected_net(&events) {
                        h.expected_net.insert(tx, net);
                    }
                }
                for (n, e) in events.into_iter().enumerate() {
                    let copies = if n == 0 { DUPLICATES } else { 2 };
                    let delay = Duration::from_millis(load_rng.gen_range(0..300));
                    for _ in 0..copies {
                        let first = load_rng.gen_range(0..INSTANCES);
                        let (bases, history, e) = (bases.clone(), history.clone(), e.clone());
                        let key = (
                            e["transaction_id"].as_str().unwrap().to_owned(),
                            e["event_type"].as_str().unwrap().to_owned(),
                        );
                        deliveries.push(tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            let mut i = first;
                            loop {
                                let base = bases.read().unwrap()[i % INSTANCES].clone();
                                let r = deliver_to(&base, &e).await;
                                let done = r.status == 200;
                                history
                                    .lock()
                                    .unwrap()
                                    .answers
                                    .entry(key.clone())
                                    .or_default()
                                    .push(r);
                                if done || Instant::now() >= settle_end {
                                    return;
                                }
                                i += 1; // a PSP retry may land on another instance
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        }));
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

    // Inbox mode: every delivery has its answer; now the workers finish
    // what was accepted.
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

/// The events of one payment's life, in a random order: a payment (5 %
/// failed for good, 10 % failed before it succeeds), and for a fifth of them
/// a partial refund, sometimes a second one that fails, sometimes a dispute
/// that may be reinstated. Children never take more than the payment.
fn life(t: usize, rng: &mut StdRng) -> Vec<serde_json::Value> {
    let pay = format!("tx_chaos_{t}");
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
        events.push(child("refund.succeeded", format!("re_chaos_{t}"), quarter));
        if rng.gen_bool(0.5) {
            let tx = format!("re_chaos_{t}_b");
            events.push(child("refund.succeeded", tx.clone(), quarter));
            events.push(child("refund.failed", tx, quarter));
        }
        if rng.gen_bool(0.5) {
            let tx = format!("dp_chaos_{t}");
            events.push(child("dispute.funds_withdrawn", tx.clone(), quarter));
            if rng.gen_bool(0.5) {
                events.push(child("dispute.funds_reinstated", tx, quarter));
            }
        }
    }
    events.shuffle(rng);
    events
}
