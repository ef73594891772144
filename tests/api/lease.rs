//! Lease primitives against the real stores, for both backends.

use std::time::Duration;

use fencehook::config::{LeaseBackendKind, LeaseConfig};
use fencehook::lease::{Acquire, Lease, LeaseKey, LostReason};
use fencehook::metrics::Metrics;
use uuid::Uuid;

use crate::helpers::{wait_for, TestContext};

fn lease(ctx: &TestContext, backend: LeaseBackendKind, ttl: Duration) -> Lease {
    let cfg = LeaseConfig {
        backend,
        redis_url: ctx.redis_url.clone(),
        sentinel: None,
        redis_tls: Default::default(),
        key_prefix: ctx.prefix.clone(),
        ttl,
        max_hold: Duration::from_secs(30),
        fence_key_ttl: Duration::from_secs(86_400),
        lease_timeout: Duration::from_millis(500),
    };
    Lease::new(&cfg, &ctx.config().db, Metrics::new(&[])).unwrap()
}

fn key(tx: &str) -> LeaseKey {
    LeaseKey {
        provider: "generic".into(),
        transaction_id: tx.into(),
    }
}

async fn acquired(l: &Lease, tx: &str) -> fencehook::lease::LeaseGuard {
    match l.acquire(&key(tx)).await.unwrap() {
        Acquire::Acquired(g) => g,
        Acquire::Held { .. } => panic!("{tx}: expected a free lease"),
    }
}

/// Whether the store still holds a live lease for `tx`, read from the store itself.
async fn live(ctx: &TestContext, backend: LeaseBackendKind, tx: &str) -> bool {
    match backend {
        LeaseBackendKind::Redis => {
            let mut c = ctx.redis().await;
            let v: Option<String> = redis::cmd("GET").arg(ctx.lock_key(tx)).query_async(&mut c).await.unwrap();
            v.is_some()
        }
        LeaseBackendKind::Postgres => ctx
            .db()
            .await
            .query_opt(
                "SELECT 1 FROM leases WHERE transaction_id = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp()",
                &[&tx],
            )
            .await
            .unwrap()
            .is_some(),
        LeaseBackendKind::UniqueOnly => unreachable!("not a lease store"),
    }
}

/// Another owner takes the lease over behind our back.
async fn steal(ctx: &TestContext, backend: LeaseBackendKind, tx: &str) {
    match backend {
        LeaseBackendKind::Redis => {
            let mut c = ctx.redis().await;
            let _: () = redis::cmd("SET")
                .arg(ctx.lock_key(tx))
                .arg("someone-else:99")
                .query_async(&mut c)
                .await
                .unwrap();
        }
        LeaseBackendKind::Postgres => {
            ctx.db()
                .await
                .execute(
                    "UPDATE leases SET owner = $2, token = 99 WHERE transaction_id = $1",
                    &[&tx, &Uuid::new_v4()],
                )
                .await
                .unwrap();
        }
        LeaseBackendKind::UniqueOnly => unreachable!("not a lease store"),
    }
}

async fn release_with_a_wrong_owner_or_token_leaves_the_lock(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let l = lease(&ctx, backend, Duration::from_secs(10));
    let guard = acquired(&l, "tx_rel").await;
    let (owner, token) = (guard.owner(), guard.token());
    assert_eq!(token, 1);
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
    assert!(live(&ctx, backend, "tx_rel").await, "lock still there");
    assert!(matches!(
        l.acquire(&key("tx_rel")).await.unwrap(),
        Acquire::Held { .. }
    ));
    guard.release().await;
    assert!(
        !live(&ctx, backend, "tx_rel").await,
        "the owner's release frees it"
    );
    assert_eq!(
        acquired(&l, "tx_rel").await.token(),
        2,
        "release never resets the fence counter"
    );
}

async fn renewing_an_expired_lock_fails_and_does_not_recreate_it(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let l = lease(&ctx, backend, Duration::from_millis(300));
    let guard = acquired(&l, "tx_exp").await;
    let (owner, token) = (guard.owner(), guard.token());
    guard.abandon(); // a crashed holder: no more renewals, no release
    wait_for("lock expiry", Duration::from_secs(5), || async {
        !live(&ctx, backend, "tx_exp").await
    })
    .await;
    assert!(!l.renew(&key("tx_exp"), owner, token).await.unwrap());
    assert!(
        !live(&ctx, backend, "tx_exp").await,
        "renew never recreates the lock"
    );
    assert_eq!(
        acquired(&l, "tx_exp").await.token(),
        2,
        "the next holder gets a higher token"
    );
}

async fn tokens_strictly_increase_across_acquisitions(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let l = lease(&ctx, backend, Duration::from_secs(10));
    let mut last = 0;
    for _ in 0..5 {
        let guard = acquired(&l, "tx_inc").await;
        assert!(guard.token() > last, "{} after {last}", guard.token());
        last = guard.token();
        guard.release().await;
    }
    assert_eq!(last, 5);
}

async fn a_lease_taken_over_is_reported_lost_and_its_release_leaves_the_new_owner(
    backend: LeaseBackendKind,
) {
    let ctx = TestContext::new().await;
    let l = lease(&ctx, backend, Duration::from_millis(600));
    let guard = acquired(&l, "tx_steal").await;
    steal(&ctx, backend, "tx_steal").await;
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss reported");
    assert_eq!(reason, LostReason::NotOwner);
    assert!(!guard.is_held());
    guard.release().await;
    assert!(
        live(&ctx, backend, "tx_steal").await,
        "the new owner's lock survives our release"
    );
}

async fn resync_raises_the_token_past_the_database_fence_only_inside_our_lease(
    backend: LeaseBackendKind,
) {
    let ctx = TestContext::new().await;
    let l = lease(&ctx, backend, Duration::from_secs(10));
    let mut guard = acquired(&l, "tx_rs").await;
    assert_eq!(guard.resync(41).await.unwrap(), Some(42));
    assert_eq!(guard.token(), 42);
    assert!(
        l.renew(&key("tx_rs"), guard.owner(), 42).await.unwrap(),
        "the lease now carries the new token"
    );
    assert!(
        l.resync(&key("tx_rs"), Uuid::new_v4(), 42, 100)
            .await
            .unwrap()
            .is_none(),
        "not ours: refused"
    );
    guard.release().await;
}

crate::helpers::both_backends!(
    release_with_a_wrong_owner_or_token_leaves_the_lock,
    renewing_an_expired_lock_fails_and_does_not_recreate_it,
    tokens_strictly_increase_across_acquisitions,
    a_lease_taken_over_is_reported_lost_and_its_release_leaves_the_new_owner,
    resync_raises_the_token_past_the_database_fence_only_inside_our_lease,
);
