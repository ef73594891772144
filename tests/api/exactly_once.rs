//! The guarantee itself: concurrent duplicates across instances book once.

use std::collections::HashMap;
use std::time::Duration;

use fencehook::config::LeaseBackendKind;
use fencehook::metrics::{LEASE_ACQUIRE_TOTAL, LEASE_RENEW_TOTAL};

use crate::helpers::{downstream::MockDownstream, payment, TestContext};

async fn fifty_concurrent_deliveries_over_three_instances_book_one_payment(
    backend: LeaseBackendKind,
) {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(std::sync::Arc::new(
            ctx.spawn(ctx.config_for(backend)).await,
        ));
    }
    let p = payment("tx_storm", 4200);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let app = apps[i % 3].clone();
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            app.deliver_until_settled(&p, Duration::from_secs(20)).await
        }));
    }
    let mut finals: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        let answers = t.await.unwrap();
        let last = answers.last().unwrap();
        assert_eq!(last.status, 200, "every delivery ends 200, got {answers:?}");
        *finals.entry(last.result().to_owned()).or_default() += 1;
        for a in &answers[..answers.len() - 1] {
            assert_eq!(
                (a.status, a.result()),
                (409, "in_progress"),
                "only in_progress before the end: {answers:?}"
            );
        }
    }
    assert_eq!(finals.get("processed"), Some(&1), "{finals:?}");
    assert_eq!(finals.get("duplicate"), Some(&49), "{finals:?}");
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(
        ctx.count("SELECT sum(amount_minor)::bigint FROM ledger_entries")
            .await,
        4200
    );
    ctx.assert_audit_clean().await;
}

async fn many_transactions_with_duplicates_leave_the_audit_clean(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(std::sync::Arc::new(
            ctx.spawn(ctx.config_for(backend)).await,
        ));
    }
    let (transactions, copies) = (40, 4);
    let mut tasks = Vec::new();
    for t in 0..transactions {
        for c in 0..copies {
            let app = apps[(t + c) % 3].clone();
            let mut p = payment(&format!("tx_many_{t}"), 100 + t as i64);
            if t % 5 == 0 {
                p["event_type"] = "payment.failed".into();
            } else if t % 7 == 0 {
                // Refunds of tx_many_1 (101): 5 of 10 fit, racing each other
                // and, maybe, the payment (a refund first waits for it).
                p["event_type"] = "refund.succeeded".into();
                p["amount"] = 10.into();
                p["payment_transaction_id"] = "tx_many_1".into();
            }
            tasks.push(tokio::spawn(async move {
                let answers = app.deliver_until_settled(&p, Duration::from_secs(30)).await;
                (p["transaction_id"].as_str().unwrap().to_owned(), answers)
            }));
        }
    }
    let mut processed: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        let (tx, answers) = t.await.unwrap();
        let last = answers.last().unwrap();
        assert_eq!(last.status, 200, "{tx}: {answers:?}");
        // Invariant 3: every 2xx corresponds to a committed terminal row.
        let (status, _) = ctx.payment(&tx).await.expect("a 200 has a row");
        assert!(
            status == "succeeded" || status == "failed",
            "{tx} answered 200 but is {status}"
        );
        if last.result() == "processed" {
            *processed.entry(tx).or_default() += 1;
        }
    }
    assert_eq!(
        processed.len(),
        transactions,
        "each transaction processed by someone"
    );
    assert!(
        processed.values().all(|n| *n == 1),
        "each processed exactly once: {processed:?}"
    );
    assert_eq!(ctx.payments().await, transactions as i64);
    assert_eq!(
        ctx.count("SELECT count(*) FROM payments WHERE status = 'failed'")
            .await,
        8
    );
    assert_eq!(ctx.entries().await, transactions as i64 - 8);
    assert_eq!(
        ctx.count("SELECT count(*) FROM ledger_entries WHERE effect = 'debit'")
            .await,
        4
    );
    ctx.assert_audit_clean().await;
}

async fn a_downstream_slower_than_the_ttl_keeps_one_holder_by_renewing(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let ttl = Duration::from_millis(900);
    downstream.set_delay(ttl * 3);
    let mut cfg = ctx.config_for(backend);
    cfg.lease.ttl = ttl;
    cfg.lease.lease_timeout = Duration::from_millis(250);
    cfg.downstream_url = Some(downstream.url());
    cfg.inflight_wait = Duration::from_millis(200);
    let a = std::sync::Arc::new(ctx.spawn(cfg.clone()).await);
    let b = ctx.spawn(cfg).await;
    let p = payment("tx_slow", 999);
    let first = tokio::spawn({
        let (a, p) = (a.clone(), p.clone());
        async move { a.deliver(&p).await }
    });
    crate::helpers::wait_for("first downstream call", Duration::from_secs(5), || async {
        !downstream.calls().is_empty()
    })
    .await;
    // While A holds the lease well past its TTL, B is told in_progress, again and again.
    let mut b_answers = Vec::new();
    while !first.is_finished() {
        b_answers.push(b.deliver(&p).await);
        // While A's outcome is not committed, B must never have held the lease.
        if ctx.payment("tx_slow").await.unwrap().0 == "processing" {
            assert_eq!(
                b.metric(LEASE_ACQUIRE_TOTAL, &[("result", "acquired")]),
                0.0,
                "B held the lease during A's call"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = first.await.unwrap();
    assert_eq!((first.status, first.result()), (200, "processed"));
    assert!(
        b_answers.iter().any(|r| r.status == 409),
        "B saw the holder: {b_answers:?}"
    );
    // B is told to come back (409 while A holds the lease, or 503 when B's
    // own lease call outlives its 250 ms bound on a machine the rest of the
    // suite saturates) or, after A's commit, that the payment is done. Never
    // that it booked it: one downstream call, below.
    for r in &b_answers {
        assert!(
            r.status == 409
                || (r.status == 503 && r.result() == "unavailable")
                || (r.status == 200 && r.result() == "duplicate"),
            "{r:?}"
        );
    }
    assert_eq!(
        downstream.calls().len(),
        1,
        "no second holder called downstream"
    );
    let renewals = a.metric(LEASE_RENEW_TOTAL, &[("result", "ok")]);
    assert!(
        renewals >= 6.0,
        "a 2.7 s call under a 0.9 s TTL renews every 0.3 s; saw {renewals}"
    );
    assert_eq!(ctx.entries().await, 1);
    let call = &downstream.calls()[0];
    assert_eq!(call.idempotency_key, "generic:tx_slow:payment.succeeded");
    assert_eq!(call.body["amount_minor"], 999);
    ctx.assert_audit_clean().await;
}

crate::helpers::both_backends!(
    fifty_concurrent_deliveries_over_three_instances_book_one_payment,
    many_transactions_with_duplicates_leave_the_audit_clean,
    a_downstream_slower_than_the_ttl_keeps_one_holder_by_renewing,
);
