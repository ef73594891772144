//! The lease's edges: every loss counted once, tokens of any size, a lost
//! acquire reply leaves no orphan lock, the lease checked after waiting for a
//! connection, one downstream body per Idempotency-Key, counters that expire
//! without harm.

use std::sync::Arc;
use std::time::Duration;

use fencehook::config::LeaseBackendKind;
use fencehook::metrics::{FENCE_RESYNC_TOTAL, LEASE_LOST_TOTAL};
use fencehook::processor::hooks::Hooks;
use serde_json::json;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::proxy::FaultProxy;
use crate::helpers::{payment, socket_of, wait_for, TestContext};

/// A holder frozen past its TTL (the whole process: its heartbeat cannot run
/// either) and then resumed sees its own clock run out before it writes: that
/// loss is counted, once. A current-thread runtime and a blocking sleep freeze
/// every task of the app, as a GC pause or SIGSTOP would.
#[tokio::test(flavor = "current_thread")]
async fn a_holder_frozen_past_its_ttl_counts_exactly_one_lease_loss() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config();
    cfg.lease.ttl = Duration::from_millis(300);
    cfg.lease.lease_timeout = Duration::from_millis(75);
    let hooks = Hooks::before_write(|_| async {
        std::thread::sleep(Duration::from_millis(600));
    });
    let app = ctx.spawn_with_hooks(cfg, hooks).await;
    let r = app.deliver(&payment("tx_frozen", 700)).await;
    assert_eq!((r.status, r.result()), (409, "lease_lost"), "{r:?}");
    assert_eq!(ctx.payments().await, 0, "nothing written after the loss");
    assert_eq!(
        app.metric(LEASE_LOST_TOTAL, &[]),
        1.0,
        "the loss is counted once"
    );
}

/// From 10^14 on, a token formatted by Lua reads `1e+14` and matches nothing;
/// a downstream slower than a TTL needs renewals that must still match.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_above_ten_to_the_fourteenth_renew_and_book() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_delay(Duration::from_millis(1500));
    let mut cfg = ctx.config();
    cfg.lease.ttl = Duration::from_millis(600);
    cfg.lease.lease_timeout = Duration::from_millis(150);
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    let mut redis = ctx.redis().await;
    let _: () = redis::cmd("SET")
        .arg(ctx.fence_key("tx_big"))
        .arg("99999999999999")
        .query_async(&mut redis)
        .await
        .unwrap();
    let r = app.deliver(&payment("tx_big", 1234)).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ctx.payment("tx_big").await,
        Some(("succeeded".to_owned(), 100_000_000_000_000))
    );
    assert_eq!(downstream.calls()[0].fencing_token, 100_000_000_000_000);
    assert_eq!(app.metric(LEASE_LOST_TOTAL, &[]), 0.0);
    ctx.assert_audit_clean().await;
}

/// Resync raises the counter past a database fence above 2^53 exactly (a
/// double cannot hold 2^53 + 5).
#[tokio::test(flavor = "multi_thread")]
async fn a_resync_past_a_fence_above_two_to_the_fifty_third_is_exact() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let fence: i64 = (1 << 53) + 5;
    let p = payment("tx_huge", 500);
    // A claim left `processing` by a holder whose token came from a counter
    // that has since been lost.
    ctx.db()
        .await
        .execute(
            "INSERT INTO payments (provider, transaction_id, event_type, amount_minor, currency, fingerprint, status, fence)
             VALUES ('generic', 'tx_huge', 'payment.succeeded', 500, 'EUR', $1, 'processing', $2::int8)",
            &[&fingerprint_of(&p), &fence],
        )
        .await
        .unwrap();
    let r = app.deliver(&p).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ctx.payment("tx_huge").await,
        Some(("succeeded".to_owned(), fence + 1))
    );
    assert_eq!(app.metric(FENCE_RESYNC_TOTAL, &[]), 1.0);
    ctx.assert_audit_clean().await;
}

fn fingerprint_of(p: &serde_json::Value) -> String {
    let ev = fencehook::domain::CanonicalEvent {
        provider: "generic".into(),
        transaction_id: p["transaction_id"].as_str().unwrap().into(),
        event_type: fencehook::domain::EventKind::PaymentSucceeded,
        amount_minor: p["amount"].as_i64().unwrap(),
        currency: p["currency"].as_str().unwrap().into(),
        parent_transaction_id: None,
        occurred_at: None,
        merchant_reference: None,
        metadata: None,
    };
    ev.fingerprint()
}

/// The acquire ran in Redis but its reply came too late: the lock it took
/// must not keep every copy out for a whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acquire_whose_reply_is_lost_leaves_no_orphan_lock() {
    let ctx = TestContext::new().await;
    let proxy = FaultProxy::start(socket_of(&ctx.redis_url)).await;
    let mut cfg = ctx.config();
    cfg.lease.redis_url = format!("redis://{}", proxy.addr());
    // A TTL far longer than the test: only a cancel can free the lock in time.
    cfg.lease.ttl = Duration::from_secs(60);
    cfg.lease.max_hold = Duration::from_secs(120);
    cfg.lease.lease_timeout = Duration::from_millis(300);
    cfg.inflight_wait = Duration::from_millis(100);
    let app = ctx.spawn(cfg).await;
    let p = payment("tx_lost_reply", 800);
    // The lease connection is up (a reply-less proxy would stall its handshake).
    let warm = app.deliver(&payment("tx_warm_up", 1)).await;
    assert_eq!(warm.result(), "processed");

    proxy.pause_replies();
    let r = app.deliver(&p).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    let redis = ctx.redis().await;
    let lock_key = ctx.lock_key("tx_lost_reply");
    wait_for("the orphan lock cancelled", Duration::from_secs(10), || {
        let (mut redis, key) = (redis.clone(), lock_key.clone());
        async move {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut redis)
                .await
                .unwrap();
            exists == 0
        }
    })
    .await;
    proxy.resume();
    let answers = app.deliver_until_settled(&p, Duration::from_secs(5)).await;
    assert_eq!(answers.last().unwrap().result(), "processed", "{answers:?}");
    assert_eq!(ctx.entries().await, 2);
}

/// ACQUIRE run twice by the same owner (a cluster client's retry after an
/// I/O error) answers the same token and takes one from the counter.
#[tokio::test(flavor = "multi_thread")]
async fn acquire_and_resync_rerun_by_their_owner_answer_what_the_first_run_did() {
    let ctx = TestContext::new().await;
    let mut redis = ctx.redis().await;
    let (lock, fence) = (ctx.lock_key("tx_rerun"), ctx.fence_key("tx_rerun"));
    let acquire = redis::Script::new(fencehook::lease::redis::ACQUIRE_LUA);
    let run = |owner: &str| {
        let mut inv = acquire.key(&lock);
        inv.key(&fence).arg(owner).arg(10_000).arg(600_000);
        inv
    };
    let first: (i64, i64) = run("owner-a").invoke_async(&mut redis).await.unwrap();
    let again: (i64, i64) = run("owner-a").invoke_async(&mut redis).await.unwrap();
    assert_eq!(first, (1, 1));
    assert_eq!(again, (1, 1), "the same token, not a refusal");
    let other: (i64, i64) = run("owner-b").invoke_async(&mut redis).await.unwrap();
    assert_eq!(other.0, 0, "another owner is refused");
    let counter: String = redis::cmd("GET")
        .arg(&fence)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(counter, "1", "one token taken");

    let resync = redis::Script::new(fencehook::lease::redis::RESYNC_LUA);
    let run = |token: &str| {
        let mut inv = resync.key(&lock);
        inv.key(&fence)
            .arg("owner-a")
            .arg(token)
            .arg("41")
            .arg(600_000);
        inv
    };
    let first: i64 = run("1").invoke_async(&mut redis).await.unwrap();
    let again: i64 = run("1").invoke_async(&mut redis).await.unwrap();
    assert_eq!((first, again), (42, 42));
    let counter: String = redis::cmd("GET")
        .arg(&fence)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(counter, "42");
}

/// The holder waited for a pooled connection (to finalize, after its
/// downstream call) while its heartbeat could not renew (Redis paused): once
/// the connection comes, it must not send the write its lease no longer
/// covers — even though nobody took over and the fence would let it through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_that_waited_for_a_connection_past_its_lease_writes_nothing() {
    let ctx = TestContext::new().await;
    let proxy = Arc::new(FaultProxy::start(socket_of(&ctx.redis_url)).await);
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.lease.redis_url = format!("redis://{}", proxy.addr());
    cfg.lease.ttl = Duration::from_millis(800);
    cfg.lease.lease_timeout = Duration::from_millis(200);
    cfg.db.pool_size = 1;
    cfg.db.pool_wait = Duration::from_secs(20);
    cfg.downstream_url = Some(downstream.url());
    let app = Arc::new(ctx.spawn(cfg).await);
    let pool = |name: &'static str| {
        let app = app.clone();
        async move {
            let (_, text) = app.get_admin("/metrics").await;
            crate::helpers::metrics::sum(&text, name, &[])
        }
    };

    // A claims and is held in its downstream call.
    downstream.gate_token(1);
    let a = tokio::spawn({
        let app = app.clone();
        async move { app.deliver(&payment("tx_waiter", 200)).await }
    });
    wait_for("A's downstream call", Duration::from_secs(10), || async {
        !downstream.calls().is_empty()
    })
    .await;

    // B's claim blocks on a row lock the test holds, keeping the pool's only
    // connection busy.
    let p_b = payment("tx_blocker", 100);
    ctx.db()
        .await
        .execute(
            "INSERT INTO payments (provider, transaction_id, event_type, amount_minor, currency, fingerprint, status, fence)
             VALUES ('generic', 'tx_blocker', 'payment.succeeded', 100, 'EUR', $1, 'processing', 1)",
            &[&fingerprint_of(&p_b)],
        )
        .await
        .unwrap();
    let (locker, conn) = tokio_postgres::connect(&ctx.database_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    locker
        .batch_execute(
            "BEGIN; SELECT 1 FROM payments WHERE transaction_id = 'tx_blocker' FOR UPDATE",
        )
        .await
        .unwrap();
    let b = tokio::spawn({
        let app = app.clone();
        async move { app.deliver(&p_b).await }
    });
    wait_for(
        "B's claim blocked, holding the connection",
        Duration::from_secs(10),
        || async {
            pool("fencehook_db_pool_available").await == 0.0
                && pool("fencehook_leases_held").await == 2.0
        },
    )
    .await;

    // A's call returns; A waits for the connection to finalize, and while it
    // waits its lease runs out.
    downstream.open_gate();
    wait_for(
        "A waiting for the connection",
        Duration::from_secs(10),
        || async { pool("fencehook_db_pool_waiting").await >= 1.0 },
    )
    .await;
    proxy.pause();
    wait_for(
        "the leases lost while they wait",
        Duration::from_secs(10),
        || async { app.metric(LEASE_LOST_TOTAL, &[]) >= 2.0 },
    )
    .await;
    locker.batch_execute("ROLLBACK").await.unwrap();
    proxy.resume();
    let a = a.await.unwrap();
    let _ = b.await.unwrap();
    assert_eq!((a.status, a.result()), (409, "lease_lost"), "{a:?}");
    assert_eq!(
        ctx.payment("tx_waiter").await,
        Some(("processing".to_owned(), 1)),
        "A's finalize was never sent"
    );
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM ledger_entries l JOIN payments p ON p.id = l.payment_id
              WHERE p.transaction_id = 'tx_waiter'"
        )
        .await,
        0
    );
}

/// A PSP re-sends a payment with another `occurred_at` (same payment, same
/// fingerprint) after the downstream failed: the retry under the same
/// Idempotency-Key carries the body of the first, as the row has it.
#[tokio::test(flavor = "multi_thread")]
async fn the_downstream_gets_one_body_per_idempotency_key() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    let mut p = payment("tx_one_body", 4200);
    p["occurred_at"] = json!("2026-11-30T10:00:00Z");
    downstream.set_status(500);
    assert_eq!(app.deliver(&p).await.status, 503);
    downstream.set_status(200);
    p["occurred_at"] = json!("2026-11-30T10:05:00Z");
    let r = app.deliver(&p).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let calls = downstream.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].idempotency_key, calls[1].idempotency_key);
    assert_eq!(calls[0].body, calls[1].body, "one body per Idempotency-Key");
    assert_eq!(calls[1].body["occurred_at"], "2026-11-30T10:00:00Z");
}

/// A fence counter may expire (Redis key TTL, or a pruned lease row): the
/// next holder starts from a low token, the claim finds the database fence
/// ahead, and the resync inside the lease fast-forwards past it.
async fn an_expired_counter_is_fast_forwarded_past_the_database_fence(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config_for(backend);
    cfg.lease.ttl = Duration::from_millis(500);
    cfg.lease.lease_timeout = Duration::from_millis(120);
    cfg.lease.max_hold = Duration::from_secs(1);
    cfg.downstream_timeout = Duration::from_millis(400);
    cfg.lease.fence_key_ttl = Duration::from_secs(1);
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    let p = payment("tx_counter_gone", 333);
    downstream.set_status(500);
    assert_eq!(app.deliver(&p).await.status, 503);
    assert_eq!(
        ctx.payment("tx_counter_gone").await,
        Some(("processing".to_owned(), 1))
    );
    match backend {
        LeaseBackendKind::Redis => {
            let key = ctx.fence_key("tx_counter_gone");
            let redis = ctx.redis().await;
            wait_for("the counter expired", Duration::from_secs(10), || {
                let (key, mut redis) = (key.clone(), redis.clone());
                async move {
                    let n: i64 = redis::cmd("EXISTS")
                        .arg(&key)
                        .query_async(&mut redis)
                        .await
                        .unwrap();
                    n == 0
                }
            })
            .await;
        }
        LeaseBackendKind::Postgres => {
            wait_for("the lease row pruned", Duration::from_secs(10), || async {
                app.state.health.prune_leases().await;
                ctx.count("SELECT count(*) FROM leases").await == 0
            })
            .await;
        }
        LeaseBackendKind::UniqueOnly => unreachable!("not a lease store"),
    }
    downstream.set_status(200);
    let r = app.deliver(&p).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(app.metric(FENCE_RESYNC_TOTAL, &[]), 1.0);
    assert_eq!(
        ctx.payment("tx_counter_gone").await,
        Some(("succeeded".to_owned(), 2))
    );
    ctx.assert_audit_clean().await;
}

crate::helpers::both_backends!(an_expired_counter_is_fast_forwarded_past_the_database_fence);

/// The PostgreSQL backend's `leases` table is unlogged (V6): a crash, or a
/// failover to a standby, leaves it empty. Emptied while a holder is stalled
/// in its downstream call, the next copy's counter starts again at 1 — below
/// the stored fence — is raised past it by the resync, and books; the stalled
/// holder's write is refused by the fence. One entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_emptied_lease_table_loses_no_fence_and_books_once() {
    let ctx = TestContext::new().await;
    let persistence: i8 = ctx
        .db()
        .await
        .query_one(
            "SELECT relpersistence::\"char\" FROM pg_class WHERE relname = 'leases'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(persistence as u8, b'u', "leases is unlogged");
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config_for(LeaseBackendKind::Postgres);
    cfg.downstream_url = Some(downstream.url());
    cfg.inflight_wait = Duration::ZERO;
    let app = Arc::new(ctx.spawn(cfg).await);
    downstream.gate_token(1);
    let p = payment("tx_leases_wiped", 640);
    let stalled = tokio::spawn({
        let (app, p) = (app.clone(), p.clone());
        async move { app.deliver(&p).await }
    });
    wait_for(
        "the first holder in its downstream call",
        Duration::from_secs(10),
        || async { !downstream.calls().is_empty() },
    )
    .await;
    // What a crash of PostgreSQL does to an unlogged table.
    ctx.db()
        .await
        .batch_execute("TRUNCATE leases")
        .await
        .unwrap();
    let second = app.deliver(&p).await;
    assert_eq!(
        (second.status, second.result()),
        (200, "processed"),
        "{second:?}"
    );
    downstream.open_gate();
    let first = stalled.await.unwrap();
    assert_eq!(
        (first.status, first.result()),
        (409, "lease_lost"),
        "{first:?}"
    );
    assert_eq!(
        ctx.payment("tx_leases_wiped").await,
        Some(("succeeded".to_owned(), 2))
    );
    assert_eq!(ctx.entries().await, 1);
    ctx.assert_audit_clean().await;
}
