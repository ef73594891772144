//! Injected failures: a cut database connection, an unreachable Redis, a
//! holder that stalls past its lease, a Redis that lost its fence counter.

use std::sync::Arc;
use std::time::Duration;

use fencehook::metrics::{FENCE_REJECTED_TOTAL, FENCE_RESYNC_TOTAL, LEASE_LOST_TOTAL};
use fencehook::processor::hooks::Hooks;
use tokio::sync::Notify;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::proxy::FaultProxy;
use crate::helpers::{closed_port, payment, socket_of, wait_for, TestContext};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_cut_mid_processing_answers_503_writes_nothing_half_and_a_retry_books_once() {
    let ctx = TestContext::new().await;
    let proxy = Arc::new(FaultProxy::start(socket_of(&ctx.database_url)).await);
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.db.url = ctx.database_url_via(proxy.addr());
    cfg.downstream_url = Some(downstream.url());
    // Cut the database between the downstream call and the finalize.
    let cut_once = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let hooks = Hooks::before_finalize({
        let (proxy, cut_once) = (proxy.clone(), cut_once.clone());
        move |_| {
            let (proxy, cut_once) = (proxy.clone(), cut_once.clone());
            async move {
                if cut_once.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    proxy.cut();
                }
            }
        }
    });
    let app = ctx.spawn_with_hooks(cfg, hooks).await;
    let p = payment("tx_dbcut", 1500);

    let first = app.deliver(&p).await;
    assert_eq!(
        (first.status, first.result()),
        (503, "unavailable"),
        "a database error is never a 200 or a duplicate"
    );
    assert!(first.retry_after.is_some(), "503 carries Retry-After");
    assert_eq!(
        ctx.payment("tx_dbcut").await,
        Some(("processing".to_owned(), 1)),
        "claim durable, not finalised"
    );
    assert_eq!(
        ctx.entries().await,
        0,
        "no ledger entry from the failed attempt"
    );

    // While the database stays unreachable, deliveries keep answering 503.
    let during = app.deliver(&p).await;
    assert_eq!(during.status, 503);

    proxy.restore();
    let answers = app.deliver_until_settled(&p, Duration::from_secs(10)).await;
    let last = answers.last().unwrap();
    assert_eq!(
        (last.status, last.result()),
        (200, "processed"),
        "{answers:?}"
    );
    let again = app.deliver(&p).await;
    assert_eq!((again.status, again.result()), (200, "duplicate"));
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(ctx.payment("tx_dbcut").await.unwrap().0, "succeeded");
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_that_is_unreachable_before_the_claim_answers_503_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let proxy = FaultProxy::start(socket_of(&ctx.database_url)).await;
    let mut cfg = ctx.config();
    cfg.db.url = ctx.database_url_via(proxy.addr());
    let app = ctx.spawn(cfg).await;
    proxy.cut();
    let r = app.deliver(&payment("tx_nodb", 10)).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"));
    assert!(r.retry_after.is_some());
    assert_eq!(ctx.payments().await, 0);
    proxy.restore();
    let answers = app
        .deliver_until_settled(&payment("tx_nodb", 10), Duration::from_secs(10))
        .await;
    assert_eq!(
        answers.last().unwrap().result(),
        "processed",
        "the pool recovers by itself: {answers:?}"
    );
    assert_eq!(ctx.entries().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_unreachable_answers_503_with_retry_after_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config();
    cfg.lease.redis_url = format!("redis://127.0.0.1:{}", closed_port().await);
    let app = ctx.spawn(cfg).await;
    let r = app.deliver(&payment("tx_noredis", 10)).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"));
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    assert_eq!(ctx.payments().await, 0);
    let (ready, body) = app.get_admin("/readyz").await;
    assert_eq!(ready, 503);
    assert!(
        body.contains("lease_backend") && body.contains("error"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_redis_connection_answers_503_then_books_once_after_it_returns() {
    let ctx = TestContext::new().await;
    let proxy = FaultProxy::start(socket_of(&ctx.redis_url)).await;
    let mut cfg = ctx.config();
    cfg.lease.redis_url = format!("redis://{}", proxy.addr());
    let app = ctx.spawn(cfg).await;
    assert_eq!(
        app.deliver(&payment("tx_warm", 1)).await.result(),
        "processed"
    );
    proxy.cut();
    let r = app.deliver(&payment("tx_rcut", 10)).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"));
    assert!(
        ctx.payment("tx_rcut").await.is_none(),
        "nothing written without a lease"
    );
    proxy.restore();
    let answers = app
        .deliver_until_settled(&payment("tx_rcut", 10), Duration::from_secs(10))
        .await;
    assert_eq!(answers.last().unwrap().result(), "processed", "{answers:?}");
    assert_eq!(ctx.entries().await, 2);
}

/// A (stalled, its Redis traffic paused) resumes after B took over: A's
/// finalize is refused by the database fence, and A's release leaves B's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_holder_that_resumes_after_a_takeover_is_fenced_out() {
    let ctx = TestContext::new().await;
    let downstream = Arc::new(MockDownstream::start().await);
    let redis_proxy = Arc::new(FaultProxy::start(socket_of(&ctx.redis_url)).await);
    let ttl = Duration::from_millis(900);
    let mut cfg = ctx.config();
    cfg.lease.ttl = ttl;
    cfg.lease.lease_timeout = Duration::from_millis(250);
    cfg.downstream_url = Some(downstream.url());
    cfg.inflight_wait = Duration::from_millis(300);

    let a_stalled = Arc::new(Notify::new());
    let a_resume = Arc::new(Notify::new());
    let mut a_cfg = cfg.clone();
    a_cfg.lease.redis_url = format!("redis://{}", redis_proxy.addr());
    let hooks = Hooks::before_finalize({
        let (proxy, stalled, resume) = (redis_proxy.clone(), a_stalled.clone(), a_resume.clone());
        move |_| {
            let (proxy, stalled, resume) = (proxy.clone(), stalled.clone(), resume.clone());
            async move {
                // A stop-the-world pause right before the finalize: A's Redis
                // traffic is frozen too, so its lease runs out.
                proxy.pause();
                stalled.notify_one();
                resume.notified().await;
                proxy.resume();
            }
        }
    });
    let a = Arc::new(ctx.spawn_with_hooks(a_cfg, hooks).await);
    let b = Arc::new(ctx.spawn(cfg).await);
    let p = payment("tx_stale", 2500);

    let a_answer = tokio::spawn({
        let (a, p) = (a.clone(), p.clone());
        async move { a.deliver(&p).await }
    });
    a_stalled.notified().await;
    // B takes over once A's lock expires in Redis; its downstream call is held
    // so that B still holds the lease when A comes back.
    downstream.gate_token(2);
    let b_answer = tokio::spawn({
        let (b, p) = (b.clone(), p.clone());
        async move { b.deliver_until_settled(&p, Duration::from_secs(20)).await }
    });
    wait_for(
        "B's downstream call with token 2",
        Duration::from_secs(10),
        || async { downstream.calls().iter().any(|c| c.fencing_token == 2) },
    )
    .await;
    assert_eq!(
        ctx.payment("tx_stale").await,
        Some(("processing".to_owned(), 2)),
        "B claimed with a higher token"
    );

    a_resume.notify_one();
    let a_answer = a_answer.await.unwrap();
    assert_eq!(
        (a_answer.status, a_answer.result()),
        (409, "lease_lost"),
        "A must not answer processed"
    );
    assert_eq!(
        a.metric(FENCE_REJECTED_TOTAL, &[]),
        1.0,
        "A's finalize was refused by the fence"
    );
    assert_eq!(
        a.metric(LEASE_LOST_TOTAL, &[]),
        1.0,
        "A's lease loss is counted, once, whoever noticed it first"
    );
    let mut redis = ctx.redis().await;
    let lock: Option<String> = redis::cmd("GET")
        .arg(ctx.lock_key("tx_stale"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        lock.as_deref().is_some_and(|v| v.ends_with(":2")),
        "A's release left B's lock: {lock:?}"
    );

    downstream.open_gate();
    let b_answers = b_answer.await.unwrap();
    assert_eq!(
        b_answers.last().unwrap().result(),
        "processed",
        "{b_answers:?}"
    );
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(
        ctx.count("SELECT fence FROM ledger_entries").await,
        2,
        "the entry is B's"
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_fence_counter_is_resynced_from_the_database_and_books_once() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    let p = payment("tx_resync", 700);

    downstream.set_status(500);
    let first = app.deliver(&p).await;
    assert_eq!(
        (first.status, first.result()),
        (503, "unavailable"),
        "downstream failure leaves it retryable"
    );
    assert_eq!(
        ctx.payment("tx_resync").await,
        Some(("processing".to_owned(), 1))
    );

    // Redis loses the counter (restart without persistence, failover, eviction).
    let mut redis = ctx.redis().await;
    let _: i64 = redis::cmd("DEL")
        .arg(ctx.fence_key("tx_resync"))
        .query_async(&mut redis)
        .await
        .unwrap();

    downstream.set_status(200);
    let second = app.deliver(&p).await;
    assert_eq!((second.status, second.result()), (200, "processed"));
    assert_eq!(app.metric(FENCE_RESYNC_TOTAL, &[]), 1.0);
    assert_eq!(
        ctx.payment("tx_resync").await,
        Some(("succeeded".to_owned(), 2))
    );
    assert_eq!(ctx.entries().await, 1);
    let tokens: Vec<i64> = downstream.calls().iter().map(|c| c.fencing_token).collect();
    assert_eq!(tokens, vec![1, 2], "the retry ran under the resynced token");
    ctx.assert_audit_clean().await;
}
