//! Process-level faults: real `fencehook serve` processes killed, stopped and
//! terminated; a private Redis killed and restarted empty; PostgreSQL backends
//! terminated under load.

use std::sync::Arc;
use std::time::Duration;

use fencehook::config::LeaseBackendKind;
use fencehook::metrics::{FENCE_REJECTED_TOTAL, FENCE_RESYNC_TOTAL, LEASE_LOST_TOTAL};
use serde_json::Value;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::process::{deliver_to, is_stopped, PrivateRedis, ServeProcess};
use crate::helpers::{payment, wait_for, Reply, TestContext};

fn env(ctx: &TestContext, redis_url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", redis_url.to_owned()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_LEASE_TTL_MS", "1000".to_owned()),
        ("FENCEHOOK_LEASE_TIMEOUT_MS", "250".to_owned()),
        ("FENCEHOOK_INFLIGHT_WAIT_MS", "300".to_owned()),
        ("FENCEHOOK_DB_POOL_SIZE", "4".to_owned()),
        ("FENCEHOOK_DB_POOL_WAIT_MS", "1000".to_owned()),
    ]
}

fn with(
    mut env: Vec<(&'static str, String)>,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    env.extend_from_slice(extra);
    env
}

/// Delivers until an answer is neither 409, 503 nor a transport error, like a PSP.
async fn until_settled(base: &str, p: &Value, limit: Duration) -> Vec<Reply> {
    let end = tokio::time::Instant::now() + limit;
    let mut answers = Vec::new();
    loop {
        let r = deliver_to(base, p).await;
        let retry = matches!(r.status, 0 | 409 | 503);
        answers.push(r);
        if !retry || tokio::time::Instant::now() >= end {
            return answers;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every transaction that got a 2xx (other than `ignored`) has a terminal row.
async fn assert_every_200_is_durable(ctx: &TestContext, answers: &[(String, Vec<Reply>)]) {
    for (tx, replies) in answers {
        if replies.iter().any(|r| r.status == 200) {
            let row = ctx.payment(tx).await;
            assert!(
                matches!(
                    row.as_ref().map(|r| r.0.as_str()),
                    Some("succeeded" | "failed")
                ),
                "{tx} was answered 200 but its row is {row:?}"
            );
        }
    }
}

async fn an_instance_killed_while_holding_a_lease_is_taken_over_after_the_ttl_and_books_once(
    backend: LeaseBackendKind,
) {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.gate_token(1);
    let e = with(
        env(&ctx, &ctx.redis_url),
        &[
            ("FENCEHOOK_DOWNSTREAM_URL", downstream.url().to_string()),
            ("FENCEHOOK_LEASE_BACKEND", backend.as_str().to_owned()),
        ],
    );
    let a = ServeProcess::start(&e).await;
    let b = ServeProcess::start(&e).await;
    let p = payment("tx_killed", 800);
    let a_answer = tokio::spawn({
        let (base, p) = (a.base.clone(), p.clone());
        async move { deliver_to(&base, &p).await }
    });
    wait_for("A's downstream call", Duration::from_secs(10), || async {
        !downstream.calls().is_empty()
    })
    .await;
    a.signal("KILL");
    assert_eq!(
        a_answer.await.unwrap().status,
        0,
        "A died without answering"
    );
    let answers = until_settled(&b.base, &p, Duration::from_secs(20)).await;
    assert_eq!(answers.last().unwrap().result(), "processed", "{answers:?}");
    assert_eq!(
        ctx.payment("tx_killed").await,
        Some(("succeeded".to_owned(), 2))
    );
    assert_eq!(ctx.entries().await, 1);
    downstream.open_gate();
    ctx.assert_audit_clean().await;
}

async fn an_instance_stopped_past_its_ttl_is_fenced_out_when_it_continues(
    backend: LeaseBackendKind,
) {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let e = with(
        env(&ctx, &ctx.redis_url),
        &[
            ("FENCEHOOK_DOWNSTREAM_URL", downstream.url().to_string()),
            ("FENCEHOOK_LEASE_BACKEND", backend.as_str().to_owned()),
        ],
    );
    // A stops itself (SIGSTOP) after its last lease check, right before the finalize.
    let a = ServeProcess::start(&with(
        e.clone(),
        &[("FAILPOINTS", "before_finalize=1*return(sigstop)".to_owned())],
    ))
    .await;
    let b = ServeProcess::start(&e).await;
    let p = payment("tx_stopped", 900);
    let a_answer = tokio::spawn({
        let (base, p) = (a.base.clone(), p.clone());
        async move { deliver_to(&base, &p).await }
    });
    let pid = a.pid();
    wait_for("A stopped itself", Duration::from_secs(10), || async move {
        is_stopped(pid)
    })
    .await;
    let answers = until_settled(&b.base, &p, Duration::from_secs(20)).await;
    assert_eq!(
        answers.last().unwrap().result(),
        "processed",
        "B took over: {answers:?}\nA's log: {:?}\nB's log: {:?}\ndownstream calls: {:?}",
        a.logs.lock().unwrap(),
        b.logs.lock().unwrap(),
        downstream.calls()
    );
    a.signal("CONT");
    let a_answer = a_answer.await.unwrap();
    assert_eq!(
        (a_answer.status, a_answer.result()),
        (409, "lease_lost"),
        "A must not answer 200"
    );
    assert_eq!(
        a.metric(FENCE_REJECTED_TOTAL, &[]).await,
        1.0,
        "A's finalize was refused by the fence"
    );
    assert_eq!(
        a.metric(LEASE_LOST_TOTAL, &[]).await,
        1.0,
        "A's lease loss is counted once, whichever part of A noticed it first"
    );
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(
        ctx.payment("tx_stopped").await,
        Some(("succeeded".to_owned(), 2))
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_mid_load_and_restarted_empty_answers_503_meanwhile_and_books_everything_once()
{
    let ctx = TestContext::new().await;
    let mut redis = PrivateRedis::start().await;
    let downstream = Arc::new(MockDownstream::start().await);
    let e = with(
        env(&ctx, &redis.url()),
        &[("FENCEHOOK_DOWNSTREAM_URL", downstream.url().to_string())],
    );
    let a = ServeProcess::start(&e).await;
    let b = ServeProcess::start(&e).await;

    // One payment left `processing` (its downstream failed) before the outage.
    downstream.set_status(500);
    assert_eq!(a.deliver(&payment("tx_pending", 50)).await.status, 503);
    downstream.set_status(200);

    let load = {
        let bases = [a.base.clone(), b.base.clone()];
        let mut tasks = Vec::new();
        for t in 0..30 {
            for c in 0..3 {
                let base = bases[(t + c) % 2].clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(40 * t as u64)).await;
                    let tx = format!("tx_rload_{t}");
                    let answers =
                        until_settled(&base, &payment(&tx, 10 + t as i64), Duration::from_secs(40))
                            .await;
                    (tx, answers)
                }));
            }
        }
        tasks
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    redis.kill().await;
    let during = a.deliver(&payment("tx_during_outage", 5)).await;
    assert_eq!(
        (during.status, during.result()),
        (503, "unavailable"),
        "no lease, no booking"
    );
    assert!(during.retry_after.is_some());
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.restart().await;

    let mut answers = Vec::new();
    for t in load {
        answers.push(t.await.unwrap());
    }
    for (tx, replies) in &answers {
        assert_eq!(
            replies.last().unwrap().status,
            200,
            "{tx} ends 200 once Redis is back: {replies:?}"
        );
    }
    assert_every_200_is_durable(&ctx, &answers).await;
    assert!(ctx.payment("tx_during_outage").await.is_none());

    // The restarted Redis has no counter for tx_pending; the database has fence 1.
    let r = until_settled(&b.base, &payment("tx_pending", 50), Duration::from_secs(10)).await;
    assert_eq!(r.last().unwrap().result(), "processed", "{r:?}");
    assert_eq!(
        b.metric(FENCE_RESYNC_TOTAL, &[]).await,
        1.0,
        "the lost counter was resynced"
    );
    assert_eq!(ctx.payments().await, 31);
    assert_eq!(ctx.entries().await, 31);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_backends_terminated_under_load_recover_by_themselves_and_book_everything_once() {
    let ctx = TestContext::new().await;
    let e = env(&ctx, &ctx.redis_url);
    let a = ServeProcess::start(&e).await;
    let b = ServeProcess::start(&e).await;
    let bases = [a.base.clone(), b.base.clone()];
    let mut tasks = Vec::new();
    for t in 0..40 {
        for c in 0..3 {
            let base = bases[(t + c) % 2].clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(25 * t as u64)).await;
                let tx = format!("tx_pgload_{t}");
                let answers =
                    until_settled(&base, &payment(&tx, 10 + t as i64), Duration::from_secs(40))
                        .await;
                (tx, answers)
            }));
        }
    }
    let admin = ctx.db().await;
    let mut terminated = 0i64;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rows = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND application_name = 'fencehook' AND pid <> pg_backend_pid()",
                &[&ctx.db_name],
            )
            .await
            .unwrap();
        terminated += rows.len() as i64;
    }
    assert!(terminated > 0, "some fencehook connections were terminated");
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    for (tx, replies) in &answers {
        assert_eq!(replies.last().unwrap().status, 200, "{tx}: {replies:?}");
    }
    assert_every_200_is_durable(&ctx, &answers).await;
    assert_eq!(ctx.payments().await, 40);
    assert_eq!(ctx.entries().await, 40);
    ctx.assert_audit_clean().await;
    // After the storm, a fresh delivery works at once: the pool healed itself.
    assert_eq!(
        a.deliver(&payment("tx_after_storm", 1)).await.result(),
        "processed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_during_a_slow_downstream_call_finishes_releases_and_exits_0() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_delay(Duration::from_millis(1500));
    let e = with(
        env(&ctx, &ctx.redis_url),
        &[("FENCEHOOK_DOWNSTREAM_URL", downstream.url().to_string())],
    );
    let mut a = ServeProcess::start(&e).await;
    let p = payment("tx_term", 600);
    let answer = tokio::spawn({
        let (base, p) = (a.base.clone(), p.clone());
        async move { deliver_to(&base, &p).await }
    });
    wait_for("the downstream call", Duration::from_secs(10), || async {
        !downstream.calls().is_empty()
    })
    .await;
    a.signal("TERM");
    let answer = answer.await.unwrap();
    assert_eq!(
        (answer.status, answer.result()),
        (200, "processed"),
        "the in-flight delivery finished"
    );
    let status = a
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("exits within the drain bound");
    assert!(status.success(), "exit 0, got {status:?}");
    assert_eq!(ctx.entries().await, 1);
    assert!(
        ctx.redis_keys().await.iter().all(|k| !k.ends_with(":lock")),
        "lease released"
    );
    let logs = a.logs.lock().unwrap().join("\n");
    assert!(
        logs.contains("SIGTERM received") && logs.contains("stopped"),
        "{logs}"
    );
}

// Holder crashes and stalls, against both lease backends.
crate::helpers::both_backends!(
    an_instance_killed_while_holding_a_lease_is_taken_over_after_the_ttl_and_books_once,
    an_instance_stopped_past_its_ttl_is_fenced_out_when_it_continues,
);

/// The soft open-file limit of process `pid`, from /proc.
fn soft_open_files(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// Under `ulimit -n 1024` the 1,024-connection cap was never reached:
/// accepts failed ("Too many open files", thousands of lines), deliveries
/// timed out instead of 503, nothing was counted. Now the soft limit is
/// raised where the hard one allows; where it does not, the cap is lowered
/// to fit and said, and connections past it get the counted 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_open_file_limit_is_raised_to_fit_the_caps_or_the_cap_is_lowered_to_fit_it() {
    let ctx = TestContext::new().await;
    let redis = ctx.redis_url.clone();

    let roomy = ServeProcess::start_with_open_files(&env(&ctx, &redis), 400, 8192).await;
    assert!(
        soft_open_files(roomy.pid()) >= 1024,
        "the soft limit is raised past the cap"
    );
    assert!(
        !roomy
            .logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("RLIMIT_NOFILE")),
        "{:?}",
        roomy.logs.lock().unwrap()
    );
    drop(roomy);

    let tight = ServeProcess::start_with_open_files(&env(&ctx, &redis), 400, 400).await;
    let warned = tight
        .logs
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.contains("RLIMIT_NOFILE"))
        .cloned()
        .expect("the lowered cap is said");
    let line: Value = serde_json::from_str(&warned).unwrap();
    let cap = line["max_connections"].as_u64().expect("the cap it took") as usize;
    assert!((1..400).contains(&cap), "{warned}");

    let addr = crate::helpers::socket_of(&tight.base);
    let mut held = Vec::new();
    for _ in 0..cap {
        held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    wait_for("the cap is taken", Duration::from_secs(10), || async {
        tight
            .metric("fencehook_connections_open", &[("listener", "public")])
            .await
            == cap as f64
    })
    .await;
    let mut beyond = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut beyond, &mut reply),
    )
    .await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply:?}");
    let refused = tight
        .metric(
            "fencehook_connections_refused_total",
            &[("listener", "public"), ("reason", "max_connections")],
        )
        .await;
    assert_eq!(refused, 1.0);
    let accept_errors = tight
        .metric("fencehook_accept_errors_total", &[("listener", "public")])
        .await;
    assert_eq!(accept_errors, 0.0, "no descriptor ran out");
    drop(held);
}
