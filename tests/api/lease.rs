//! Lease primitives against real Redis.

use std::time::Duration;

use fencehook::config::{LeaseBackendKind, LeaseConfig};
use fencehook::lease::{Acquire, LeaseKey, RedisLease};
use fencehook::metrics::Metrics;
use uuid::Uuid;

use crate::helpers::{wait_for, TestContext};

fn lease(ctx: &TestContext, ttl: Duration) -> RedisLease {
    let cfg = LeaseConfig {
        backend: LeaseBackendKind::Redis,
        redis_url: ctx.redis_url.clone(),
        key_prefix: ctx.prefix.clone(),
        ttl,
        max_hold: Duration::from_secs(30),
        fence_key_ttl: Duration::from_secs(86_400),
        redis_timeout: Duration::from_millis(500),
    };
    RedisLease::new(&cfg, Metrics::new(&[])).unwrap()
}

fn key(tx: &str) -> LeaseKey {
    LeaseKey {
        provider: "generic".into(),
        transaction_id: tx.into(),
    }
}

async fn get(ctx: &TestContext, k: &str) -> Option<String> {
    let mut c = ctx.redis().await;
    redis::cmd("GET").arg(k).query_async(&mut c).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn release_with_a_wrong_owner_or_token_leaves_the_lock() {
    let ctx = TestContext::new().await;
    let l = lease(&ctx, Duration::from_secs(10));
    let Acquire::Acquired(guard) = l.acquire(&key("tx_rel")).await.unwrap() else {
        panic!("free lock")
    };
    let (owner, token) = (guard.owner(), guard.token());
    assert_eq!(
        get(&ctx, &ctx.lock_key("tx_rel")).await,
        Some(format!("{owner}:{token}"))
    );
    assert!(
        !l.release(&key("tx_rel"), Uuid::new_v4(), token)
            .await
            .unwrap(),
        "other owner"
    );
    assert!(
        !l.release(&key("tx_rel"), owner, token + 1).await.unwrap(),
        "other token"
    );
    assert!(
        get(&ctx, &ctx.lock_key("tx_rel")).await.is_some(),
        "lock still there"
    );
    assert!(matches!(
        l.acquire(&key("tx_rel")).await.unwrap(),
        Acquire::Held { .. }
    ));
    guard.release().await;
    assert!(
        get(&ctx, &ctx.lock_key("tx_rel")).await.is_none(),
        "owner's release deletes it"
    );
    assert_eq!(
        get(&ctx, &ctx.fence_key("tx_rel")).await.as_deref(),
        Some("1"),
        "release never deletes the fence"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn renewing_an_expired_lock_fails_and_does_not_recreate_it() {
    let ctx = TestContext::new().await;
    let l = lease(&ctx, Duration::from_millis(300));
    let Acquire::Acquired(guard) = l.acquire(&key("tx_exp")).await.unwrap() else {
        panic!("free lock")
    };
    let (owner, token) = (guard.owner(), guard.token());
    guard.abandon();
    wait_for("lock expiry", Duration::from_secs(5), || async {
        get(&ctx, &ctx.lock_key("tx_exp")).await.is_none()
    })
    .await;
    assert!(!l.renew(&key("tx_exp"), owner, token).await.unwrap());
    assert!(
        get(&ctx, &ctx.lock_key("tx_exp")).await.is_none(),
        "renew never recreates the lock"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_strictly_increase_across_acquisitions() {
    let ctx = TestContext::new().await;
    let l = lease(&ctx, Duration::from_secs(10));
    let mut last = 0;
    for _ in 0..5 {
        let Acquire::Acquired(guard) = l.acquire(&key("tx_inc")).await.unwrap() else {
            panic!("free lock")
        };
        assert!(guard.token() > last, "{} after {last}", guard.token());
        last = guard.token();
        guard.release().await;
    }
    assert_eq!(last, 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_whose_lock_is_taken_over_is_reported_lost_by_the_heartbeat() {
    let ctx = TestContext::new().await;
    let l = lease(&ctx, Duration::from_millis(600));
    let Acquire::Acquired(guard) = l.acquire(&key("tx_steal")).await.unwrap() else {
        panic!("free lock")
    };
    let mut c = ctx.redis().await;
    let _: () = redis::cmd("SET")
        .arg(ctx.lock_key("tx_steal"))
        .arg("someone-else:99")
        .query_async(&mut c)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss reported");
    assert_eq!(reason, fencehook::lease::LostReason::NotOwner);
    assert!(!guard.is_held());
    guard.release().await;
    assert_eq!(
        get(&ctx, &ctx.lock_key("tx_steal")).await.as_deref(),
        Some("someone-else:99")
    );
}
