//! The inline path with the PostgreSQL lease backend takes the lease inside
//! its own write: held by the lease row's lock for as long as the write's
//! transaction, never around it. What that must keep: nobody writes while
//! the row is locked, a copy of an event in flight polls instead of queueing,
//! a lease taken the other way keeps the write out, and a lost counter is
//! passed without a second write.

use std::sync::Arc;
use std::time::Duration;

use fencehook::config::{LeaseBackendKind, LeaseConfig};
use fencehook::lease::{Acquire, Lease, LeaseKey};
use fencehook::metrics::{Metrics, FENCE_RESYNC_TOTAL, INFLIGHT_WAIT_TOTAL, LEASE_ACQUIRE_TOTAL};

use crate::helpers::{downstream::MockDownstream, payment, wait_for, TestContext};

/// A lease taken the separate way (acquire, heartbeat, release), as a holder
/// calling a downstream service takes it.
fn separate_lease(ctx: &TestContext) -> Lease {
    let cfg = LeaseConfig {
        backend: LeaseBackendKind::Postgres,
        ..ctx.config().lease
    };
    Lease::new(&cfg, &ctx.config().db, Metrics::new(&[])).unwrap()
}

/// A connection of the test's own with a transaction left open after `sql`
/// (what it locks stays locked until the test sends `COMMIT`).
async fn open_transaction(ctx: &TestContext, sql: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&ctx.database_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!("BEGIN; {sql};"))
        .await
        .unwrap();
    client
}

fn key(tx: &str) -> LeaseKey {
    LeaseKey {
        provider: "generic".into(),
        transaction_id: tx.into(),
    }
}

/// The lease row's lock is what keeps takers of either kind apart: a delivery
/// that finds the row locked (here by a test transaction, standing for an
/// acquire or a renewal of the other kind in flight) waits for that
/// transaction instead of writing beside it. It blocks on the row lock (seen
/// in `pg_stat_activity`), and books only once the lock is gone, with the
/// token after the one the row had.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_waits_for_a_statement_that_holds_the_lease_row() {
    let ctx = TestContext::new().await;
    let lease = separate_lease(&ctx);
    match lease.acquire(&key("tx_row_locked")).await.unwrap() {
        Acquire::Acquired(guard) => guard.release().await,
        Acquire::Held { .. } => panic!("a fresh lease is free"),
    }
    let app = Arc::new(ctx.spawn(ctx.config_for(LeaseBackendKind::Postgres)).await);
    // Another write's transaction, stopped while it holds the lease row.
    let in_flight = open_transaction(
        &ctx,
        "SELECT 1 FROM leases WHERE transaction_id = 'tx_row_locked' FOR UPDATE",
    )
    .await;
    let p = payment("tx_row_locked", 1200);
    let delivery = tokio::spawn({
        let (app, p) = (app.clone(), p.clone());
        async move { app.deliver(&p).await }
    });
    wait_for(
        "the delivery waiting on the lease row's lock",
        Duration::from_secs(10),
        || async {
            ctx.count(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name = 'fencehook'
                    AND wait_event_type = 'Lock'",
            )
            .await
                == 1
        },
    )
    .await;
    assert_eq!(ctx.payments().await, 0, "nothing written while it waits");
    assert!(!delivery.is_finished());
    in_flight.batch_execute("COMMIT").await.unwrap();
    let r = delivery.await.unwrap();
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ctx.payment("tx_row_locked").await,
        Some(("succeeded".to_owned(), 2))
    );
    assert_eq!(ctx.entries().await, 1);
    ctx.assert_audit_clean().await;
}

/// A copy of an event whose write is in flight (its advisory lock taken, here
/// by a test transaction) does not queue behind it: it answers as for a held
/// lease, polling the row for the in-flight wait, then 409 `in_progress`,
/// with nothing written. Once the write is gone it books with token 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_of_an_event_whose_write_is_in_flight_polls_instead_of_queueing() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config_for(LeaseBackendKind::Postgres);
    cfg.inflight_wait = Duration::from_millis(150);
    let app = ctx.spawn(cfg).await;
    let in_flight = open_transaction(
        &ctx,
        "SELECT pg_advisory_xact_lock(hashtextextended('generic:tx_in_flight', 0))",
    )
    .await;
    let p = payment("tx_in_flight", 1250);
    let r = app.deliver(&p).await;
    assert_eq!((r.status, r.result()), (409, "in_progress"), "{r:?}");
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    assert_eq!(ctx.payments().await, 0);
    assert_eq!(ctx.count("SELECT count(*) FROM leases").await, 0);
    assert!(
        app.metric(LEASE_ACQUIRE_TOTAL, &[("result", "held")]) >= 2.0,
        "it polled"
    );
    assert_eq!(
        app.metric(INFLIGHT_WAIT_TOTAL, &[("outcome", "timeout")]),
        1.0
    );
    in_flight.batch_execute("COMMIT").await.unwrap();
    let r = app.deliver(&p).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ctx.payment("tx_in_flight").await,
        Some(("succeeded".to_owned(), 1))
    );
    ctx.assert_audit_clean().await;
}

/// A lease held the separate way (here: by a holder calling a downstream) keeps
/// the inline write out: nothing is written, the answer is 409 `in_progress`
/// with a short `Retry-After`, and once the holder releases it the write takes
/// the next token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_held_around_a_downstream_call_keeps_the_inline_write_out() {
    let ctx = TestContext::new().await;
    let lease = separate_lease(&ctx);
    let guard = match lease.acquire(&key("tx_held_apart")).await.unwrap() {
        Acquire::Acquired(guard) => guard,
        Acquire::Held { .. } => panic!("a fresh lease is free"),
    };
    let mut cfg = ctx.config_for(LeaseBackendKind::Postgres);
    cfg.inflight_wait = Duration::from_millis(100);
    let app = ctx.spawn(cfg).await;
    let p = payment("tx_held_apart", 1300);
    let r = app.deliver(&p).await;
    assert_eq!((r.status, r.result()), (409, "in_progress"), "{r:?}");
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    assert_eq!(ctx.payments().await, 0);
    assert_eq!(ctx.entries().await, 0);
    assert!(app.metric(LEASE_ACQUIRE_TOTAL, &[("result", "held")]) >= 1.0);
    let held_token = guard.token();
    guard.release().await;
    let r = app.deliver(&p).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ctx.payment("tx_held_apart").await,
        Some(("succeeded".to_owned(), held_token + 1))
    );
    assert_eq!(
        app.metric(LEASE_ACQUIRE_TOTAL, &[("result", "acquired")]),
        1.0
    );
    ctx.assert_audit_clean().await;
}

/// The unlogged `leases` table emptied (a PostgreSQL crash) under a payment
/// left `processing` at fence 2 by a downstream holder that failed twice: the
/// inline write takes its token above the fence it read, so it books at once
/// (token 3), with no resync round and one entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_inline_write_after_the_lease_table_was_emptied_takes_a_token_past_the_fence() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_status(500);
    let mut with_downstream = ctx.config_for(LeaseBackendKind::Postgres);
    with_downstream.downstream_url = Some(downstream.url());
    let calling = ctx.spawn(with_downstream).await;
    let p = payment("tx_counter_lost", 1400);
    for _ in 0..2 {
        assert_eq!(calling.deliver(&p).await.status, 503);
    }
    calling.stop().await;
    assert_eq!(
        ctx.payment("tx_counter_lost").await,
        Some(("processing".to_owned(), 2))
    );
    ctx.db()
        .await
        .batch_execute("TRUNCATE leases")
        .await
        .unwrap();
    let inline = ctx.spawn(ctx.config_for(LeaseBackendKind::Postgres)).await;
    let r = inline.deliver(&p).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ctx.payment("tx_counter_lost").await,
        Some(("succeeded".to_owned(), 3))
    );
    assert_eq!(inline.metric(FENCE_RESYNC_TOTAL, &[]), 0.0);
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(
        ctx.count(
            "SELECT token FROM leases WHERE transaction_id = 'tx_counter_lost' AND owner IS NULL"
        )
        .await,
        3,
        "the counter is raised to the token taken and the lease given back"
    );
    ctx.assert_audit_clean().await;
}
