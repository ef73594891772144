//! The lease on a Redis Cluster: hash-tagged keys keep a transaction's lock and
//! counter in one slot; a primary killed mid-load fails over to its replica and
//! exactly-once still holds (the database fence is the arbiter).

use std::sync::Arc;
use std::time::Duration;

use crate::helpers::cluster::PrivateCluster;
use crate::helpers::{payment, TestContext};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_redis_cluster_a_primary_killed_mid_load_fails_over_and_every_payment_books_once() {
    let mut cluster = PrivateCluster::start().await;
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config();
    cfg.lease.redis_url = cluster.url();
    cfg.lease.ttl = Duration::from_millis(1500);
    cfg.lease.lease_timeout = Duration::from_millis(400);
    cfg.inflight_wait = Duration::from_millis(300);
    let apps = [
        Arc::new(ctx.spawn(cfg.clone()).await),
        Arc::new(ctx.spawn(cfg).await),
    ];

    // Lock and fence of one transaction live in one slot (one primary).
    let lock = ctx.lock_key("tx_cl_0");
    let fence = ctx.fence_key("tx_cl_0");
    assert_eq!(
        cluster.primary_for(&lock).await,
        cluster.primary_for(&fence).await
    );

    let (transactions, copies) = (40usize, 3usize);
    let mut tasks = Vec::new();
    for t in 0..transactions {
        for c in 0..copies {
            let app = apps[(t + c) % 2].clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50 * t as u64)).await;
                let tx = format!("tx_cl_{t}");
                let answers = app
                    .deliver_until_settled(&payment(&tx, 100 + t as i64), Duration::from_secs(60))
                    .await;
                (tx, answers)
            }));
        }
    }
    // Mid-load, kill the primary that serves a transaction still to come.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let victim = cluster
        .primary_for(&ctx.lock_key(&format!("tx_cl_{}", transactions - 1)))
        .await;
    cluster.kill(victim).await;

    let mut unavailable = 0;
    for task in tasks {
        let (tx, answers) = task.await.unwrap();
        let last = answers.last().unwrap();
        assert_eq!(
            last.status, 200,
            "{tx} ends 200 after the failover: {answers:?}"
        );
        unavailable += answers.iter().filter(|a| a.status == 503).count();
        let (status, _) = ctx.payment(&tx).await.expect("a 200 has a row");
        assert_eq!(status, "succeeded", "{tx}");
    }
    cluster.wait_ok().await;
    assert_eq!(ctx.payments().await, transactions as i64);
    assert_eq!(
        ctx.entries().await,
        transactions as i64,
        "one ledger entry per payment"
    );
    ctx.assert_audit_clean().await;
    eprintln!(
        "cluster failover: {unavailable} deliveries answered 503 while the replica took over"
    );
}
