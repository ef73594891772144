//! A payment's whole life, in any delivery order: failure then success,
//! refunds against their payment (waiting for it, capped by it, racing each
//! other), refund failures and their reversals, disputes. Generic payloads;
//! the PSP mappings have their own tests in providers.rs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fencehook::config::LeaseBackendKind;
use fencehook::metrics::{REFUND_REJECTED_TOTAL, STALE_EVENTS_TOTAL};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::helpers::downstream::MockDownstream;
use crate::helpers::money::{effects, event, net, send};
use crate::helpers::process::fencehook_binary;
use crate::helpers::{expected_net, TestContext};

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_payment_that_later_succeeds_is_credited_and_a_late_failure_is_stale() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let failed = event("payment.failed", "pay_retry", 5000, None);
    let succeeded = event("payment.succeeded", "pay_retry", 5000, None);
    assert_eq!(send(&app, &failed).await, (200, "processed".into()));
    assert_eq!(send(&app, &failed).await, (200, "duplicate".into()));
    assert_eq!(send(&app, &succeeded).await, (200, "processed".into()));
    assert_eq!(effects(&ctx, "pay_retry").await, ["credit"]);
    assert_eq!(
        send(&app, &failed).await,
        (200, "stale".into()),
        "success is final"
    );
    assert_eq!(app.metric(STALE_EVENTS_TOTAL, &[]), 1.0);
    assert_eq!(
        ctx.payment("pay_retry").await,
        Some(("succeeded".to_owned(), 2))
    );

    // The other order: the success first, its (older) failure late.
    let succeeded = event("payment.succeeded", "pay_late_fail", 700, None);
    let failed = event("payment.failed", "pay_late_fail", 700, None);
    assert_eq!(send(&app, &succeeded).await, (200, "processed".into()));
    assert_eq!(send(&app, &failed).await, (200, "stale".into()));
    assert_eq!(effects(&ctx, "pay_late_fail").await, ["credit"]);
    // A failure answers by status whatever its amount; another amount for
    // a success after the success is a mismatch.
    let other = event("payment.failed", "pay_late_fail", 701, None);
    assert_eq!(send(&app, &other).await, (200, "stale".into()));
    let other = event("payment.succeeded", "pay_late_fail", 701, None);
    assert_eq!(send(&app, &other).await, (422, "payload_mismatch".into()));
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refund_waits_for_its_payment_and_is_capped_by_it() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let refund = event("refund.succeeded", "re_early", 300, Some("pay_capped"));
    let r = app.deliver(&refund).await;
    assert_eq!((r.status, r.result()), (409, "awaiting_payment"), "{r:?}");
    assert!(r.retry_after.is_some(), "the PSP is told when to come back");
    assert_eq!(ctx.payments().await, 0, "nothing written while it waits");

    let payment = event("payment.succeeded", "pay_capped", 1000, None);
    assert_eq!(send(&app, &payment).await, (200, "processed".into()));
    assert_eq!(send(&app, &refund).await, (200, "processed".into()));
    let second = event("refund.succeeded", "re_second", 600, Some("pay_capped"));
    assert_eq!(send(&app, &second).await, (200, "processed".into()));

    // 300 + 600 are out; 200 more would take more than came in.
    let too_much = event("refund.succeeded", "re_too_much", 200, Some("pay_capped"));
    let r = app.deliver(&too_much).await;
    assert_eq!((r.status, r.result()), (422, "refund_rejected"), "{r:?}");
    assert_eq!(r.body["reason"], "exceeds_payment");
    assert_eq!(
        ctx.payment("re_too_much").await,
        None,
        "a rejected refund writes nothing"
    );
    let exact = event("refund.succeeded", "re_exact", 100, Some("pay_capped"));
    assert_eq!(
        send(&app, &exact).await,
        (200, "processed".into()),
        "up to the amount"
    );
    assert_eq!(net(&ctx, "pay_capped").await, 1000);
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_capped'")
            .await,
        1000
    );
    assert_eq!(
        app.metric(REFUND_REJECTED_TOTAL, &[("reason", "exceeds_payment")]),
        1.0
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refunds_of_a_failed_payment_or_in_another_currency_are_rejected() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    send(&app, &event("payment.failed", "pay_declined", 900, None)).await;
    let r = app
        .deliver(&event(
            "refund.succeeded",
            "re_of_failed",
            100,
            Some("pay_declined"),
        ))
        .await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (422, Some("payment_failed"))
    );

    send(&app, &event("payment.succeeded", "pay_eur", 900, None)).await;
    let mut usd = event("refund.succeeded", "re_usd", 100, Some("pay_eur"));
    usd["currency"] = json!("USD");
    let r = app.deliver(&usd).await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (422, Some("currency_mismatch"))
    );

    // A refund that names a refund, not a payment.
    send(
        &app,
        &event("refund.succeeded", "re_ok", 100, Some("pay_eur")),
    )
    .await;
    let r = app
        .deliver(&event(
            "refund.succeeded",
            "re_of_refund",
            10,
            Some("re_ok"),
        ))
        .await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (422, Some("not_a_payment"))
    );
    assert_eq!(
        app.metric(REFUND_REJECTED_TOTAL, &[]),
        3.0,
        "every rejection counted, by reason"
    );
    assert_eq!(ctx.payments().await, 3, "two payments and one refund");
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refund_that_fails_after_it_was_booked_is_reversed_once() {
    let ctx = TestContext::new().await;
    let apps = [ctx.spawn(ctx.config()).await, ctx.spawn(ctx.config()).await];
    send(&apps[0], &event("payment.succeeded", "pay_rf", 2000, None)).await;
    let booked = event("refund.succeeded", "re_bounces", 500, Some("pay_rf"));
    let failed = event("refund.failed", "re_bounces", 500, Some("pay_rf"));
    assert_eq!(send(&apps[0], &booked).await, (200, "processed".into()));
    assert_eq!(net(&ctx, "pay_rf").await, 2000);
    let answers = futures_util::future::join_all((0..6).map(|i| {
        let (app, failed) = (&apps[i % 2], failed.clone());
        async move {
            app.deliver_until_settled(&failed, Duration::from_secs(20))
                .await
        }
    }))
    .await;
    let processed = answers
        .iter()
        .filter(|a| a.last().unwrap().result() == "processed")
        .count();
    assert_eq!(processed, 1, "{answers:?}");
    assert!(answers.iter().all(|a| a.last().unwrap().status == 200));
    assert_eq!(
        effects(&ctx, "re_bounces").await,
        ["debit", "refund_reversal"]
    );
    assert_eq!(net(&ctx, "re_bounces").await, 0);
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_rf'")
            .await,
        0,
        "the payment's money is back"
    );
    assert_eq!(
        send(&apps[1], &booked).await,
        (200, "stale".into()),
        "a failed refund stays failed"
    );
    // A refund that failed before it ever succeeded moves nothing.
    let never = event("refund.failed", "re_never", 300, Some("pay_rf"));
    assert_eq!(send(&apps[0], &never).await, (200, "processed".into()));
    assert_eq!(ctx.payment("re_never").await.unwrap().0, "failed");
    assert!(effects(&ctx, "re_never").await.is_empty());
    let late = event("refund.succeeded", "re_never", 300, Some("pay_rf"));
    assert_eq!(send(&apps[1], &late).await, (200, "stale".into()));
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispute_withdraws_and_its_reinstatement_waits_for_it() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    send(
        &app,
        &event("payment.succeeded", "pay_disputed", 1500, None),
    )
    .await;
    send(
        &app,
        &event("refund.succeeded", "re_part", 1000, Some("pay_disputed")),
    )
    .await;
    let reinstated = event(
        "dispute.funds_reinstated",
        "dp_1",
        500,
        Some("pay_disputed"),
    );
    let r = app.deliver(&reinstated).await;
    assert_eq!(
        (r.status, r.result()),
        (409, "awaiting_payment"),
        "before its withdrawal"
    );
    let too_much = event("refund.succeeded", "re_big", 600, Some("pay_disputed"));
    assert_eq!(
        app.deliver(&too_much).await.body["reason"],
        "exceeds_payment",
        "refunds are capped by what came in"
    );
    let withdrawn = event("dispute.funds_withdrawn", "dp_1", 500, Some("pay_disputed"));
    assert_eq!(send(&app, &withdrawn).await, (200, "processed".into()));
    assert_eq!(send(&app, &withdrawn).await, (200, "duplicate".into()));
    assert_eq!(send(&app, &reinstated).await, (200, "processed".into()));
    assert_eq!(send(&app, &withdrawn).await, (200, "stale".into()));
    assert_eq!(effects(&ctx, "dp_1").await, ["dispute", "dispute_reversal"]);
    assert_eq!(net(&ctx, "pay_disputed").await, 1500);
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_disputed'")
            .await,
        1000
    );
    ctx.assert_audit_clean().await;
}

/// Twenty refunds of 100 race on three instances (each delivered twice)
/// against a payment of 1,000: exactly ten are booked, whoever wins, and
/// every copy answers as its refund's fate says: a booked refund's copies
/// `processed` and `duplicate` (never `refund_rejected`: its own money is
/// not another refund's), a refused refund's both `refund_rejected`.
async fn refunds_racing_on_several_instances_never_take_more_than_came_in(
    backend: LeaseBackendKind,
) {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(Arc::new(ctx.spawn(ctx.config_for(backend)).await));
    }
    send(
        &apps[0],
        &event("payment.succeeded", "pay_raced", 1000, None),
    )
    .await;
    let mut tasks = Vec::new();
    for r in 0..20 {
        for copy in 0..2 {
            let app = apps[(r + copy) % 3].clone();
            let refund = event(
                "refund.succeeded",
                &format!("re_race_{r}"),
                100,
                Some("pay_raced"),
            );
            tasks.push(tokio::spawn(async move {
                let last = app
                    .deliver_until_settled(&refund, Duration::from_secs(30))
                    .await
                    .pop()
                    .unwrap();
                (r, last)
            }));
        }
    }
    let mut results: HashMap<String, usize> = HashMap::new();
    let mut per_refund: HashMap<usize, Vec<String>> = HashMap::new();
    for t in tasks {
        let (r, last) = t.await.unwrap();
        *results.entry(last.result().to_owned()).or_default() += 1;
        per_refund
            .entry(r)
            .or_default()
            .push(last.result().to_owned());
    }
    assert_eq!(
        ctx.count("SELECT count(*) FROM ledger_entries WHERE effect = 'debit'")
            .await,
        10,
        "answers: {results:?}"
    );
    assert_eq!(net(&ctx, "pay_raced").await, 1000);
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_raced'")
            .await,
        1000
    );
    assert_eq!(results.get("processed"), Some(&10), "{results:?}");
    for (r, mut answers) in per_refund {
        answers.sort();
        assert!(
            answers == ["duplicate", "processed"]
                || answers == ["refund_rejected", "refund_rejected"],
            "re_race_{r}: {answers:?} ({results:?})"
        );
    }
    ctx.assert_audit_clean().await;
}

crate::helpers::both_backends!(refunds_racing_on_several_instances_never_take_more_than_came_in);

/// With a downstream service, a refund's reversal goes through the claim,
/// the call and the fenced finalize like any first booking.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_downstream_the_lifecycle_is_the_same() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    send(&app, &event("payment.failed", "pay_ds", 800, None)).await;
    assert_eq!(
        send(&app, &event("payment.succeeded", "pay_ds", 800, None)).await,
        (200, "processed".into())
    );
    let refund = event("refund.succeeded", "re_ds", 300, Some("pay_ds"));
    assert_eq!(send(&app, &refund).await, (200, "processed".into()));
    // The downstream fails the reversal once: the refund stays booked.
    downstream.set_status(500);
    let failed = event("refund.failed", "re_ds", 300, Some("pay_ds"));
    assert_eq!(send(&app, &failed).await.0, 503);
    assert_eq!(ctx.payment("re_ds").await.unwrap().0, "succeeded");
    assert_eq!(effects(&ctx, "re_ds").await, ["debit"]);
    downstream.set_status(200);
    assert_eq!(send(&app, &failed).await, (200, "processed".into()));
    assert_eq!(effects(&ctx, "re_ds").await, ["debit", "refund_reversal"]);
    // Too much is refused before the downstream is called.
    let calls = downstream.calls().len();
    let r = app
        .deliver(&event("refund.succeeded", "re_ds_big", 900, Some("pay_ds")))
        .await;
    assert_eq!(r.body["reason"], "exceeds_payment");
    assert_eq!(downstream.calls().len(), calls);
    let kinds: Vec<String> = downstream
        .calls()
        .iter()
        .map(|c| c.body["event_type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "payment.failed",
            "payment.succeeded",
            "refund.succeeded",
            "refund.failed",
            "refund.failed"
        ]
    );
    ctx.assert_audit_clean().await;
}

/// A payment's events — a failure and its success, two refunds (one of which
/// fails), a dispute and maybe its reinstatement — delivered in a random
/// order, each one or more times, to three instances at once, every copy
/// retried like a PSP until it gets a 2xx: the ledger always comes out as the
/// set of events says, whatever the order. (A PSP retries every non-2xx: a
/// refund that arrives while its payment is `failed` is answered 422 and
/// booked on a retry once the payment's success is in.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_order_of_a_payments_events_on_several_instances_books_the_same_ledger() {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(Arc::new(ctx.spawn(ctx.config()).await));
    }
    let seed = std::env::var("LIFECYCLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let mut rng = StdRng::seed_from_u64(seed);
    for case in 0..12 {
        let p = format!("pay_{case}");
        let (r1, r2, d) = (
            format!("re_a_{case}"),
            format!("re_b_{case}"),
            format!("dp_{case}"),
        );
        let mut events = vec![
            event("payment.failed", &p, 1000, None),
            event("payment.succeeded", &p, 1000, None),
            event("refund.succeeded", &r1, 300, Some(&p)),
            event("refund.succeeded", &r2, 200, Some(&p)),
            event("refund.failed", &r2, 200, Some(&p)),
            event("dispute.funds_withdrawn", &d, 400, Some(&p)),
        ];
        if rng.gen_bool(0.5) {
            events.push(event("dispute.funds_reinstated", &d, 400, Some(&p)));
        }
        let expected = expected_net(&events);
        let mut deliveries: Vec<Value> = Vec::new();
        for e in &events {
            for _ in 0..rng.gen_range(1..=3) {
                deliveries.push(e.clone());
            }
        }
        deliveries.shuffle(&mut rng);
        let tasks: Vec<_> = deliveries
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                let app = apps[rng.gen_range(0..3)].clone();
                let start = Duration::from_millis(i as u64 * rng.gen_range(0..15));
                tokio::spawn(async move {
                    tokio::time::sleep(start).await;
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                    loop {
                        let r = app.deliver(&e).await;
                        if r.status == 200 || tokio::time::Instant::now() >= deadline {
                            return (e, r);
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            let (e, last) = t.await.unwrap();
            assert_eq!(
                last.status, 200,
                "seed {seed} case {case}: {e} ended {last:?}"
            );
        }
        for (tx, want) in &expected {
            assert_eq!(
                net(&ctx, tx).await,
                *want,
                "seed {seed} case {case}: {tx} in {events:?}"
            );
        }
    }
    ctx.assert_audit_clean().await;
}

/// Rows booked before the lifecycle (migration V4) stay valid: payments and
/// refunds get their kind, fingerprints are recomputed to what the code
/// computes now (a re-sent old payment is still a duplicate), the audit is
/// clean, and refunds that named no payment are listed, not counted.
#[tokio::test(flavor = "multi_thread")]
async fn rows_from_before_the_lifecycle_migrate_valid_and_audit_clean() {
    let ctx = TestContext::at_version(3).await;
    ctx.db()
        .await
        .batch_execute(
            "INSERT INTO payments (provider, transaction_id, event_type, amount_minor, currency, fingerprint, status, fence)
             VALUES ('generic', 'old_pay', 'payment.succeeded', 1200, 'EUR', 'v1-fp', 'succeeded', 1),
                    ('generic', 'old_fail', 'payment.failed', 300, 'EUR', 'v1-fp', 'failed', 1),
                    ('generic', 'old_refund', 'refund.succeeded', 200, 'EUR', 'v1-fp', 'succeeded', 1);
             INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
             SELECT id, 'credit', 1200, 'EUR', 1 FROM payments WHERE transaction_id = 'old_pay';
             INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
             SELECT id, 'debit', -200, 'EUR', 1 FROM payments WHERE transaction_id = 'old_refund';",
        )
        .await
        .unwrap();
    let applied = fencehook::store::migrate::run(
        &ctx.database_url,
        fencehook::store::migrate::MissingDatabase::Refuse,
    )
    .await
    .unwrap();
    assert!(
        applied.iter().any(|m| m.contains("lifecycle")),
        "{applied:?}"
    );
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM payments WHERE kind = 'refund' AND transaction_id = 'old_refund'"
        )
        .await,
        1
    );
    ctx.assert_audit_clean().await;
    let app = ctx.spawn(ctx.config()).await;
    let r = app
        .deliver(&event("payment.succeeded", "old_pay", 1200, None))
        .await;
    assert_eq!(
        r.result(),
        "duplicate",
        "the recomputed fingerprint is the code's"
    );
    let r = app
        .deliver(&event("payment.succeeded", "old_fail", 300, None))
        .await;
    assert_eq!(r.result(), "processed", "an old failure can still succeed");
    let (code, out, _) = fencehook_binary(&["audit"], &[("DATABASE_URL", &ctx.database_url)]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("1 refund(s) were booked before refunds named their payment"),
        "{out}"
    );
    assert!(out.contains("generic:old_refund"), "{out}");
}

/// The audit catches money out beyond money in, planted behind the
/// service's back, and exits non-zero naming the check.
#[tokio::test(flavor = "multi_thread")]
async fn the_audit_exits_non_zero_when_more_went_out_than_came_in() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    send(&app, &event("payment.succeeded", "pay_planted", 500, None)).await;
    send(
        &app,
        &event("refund.succeeded", "re_planted", 400, Some("pay_planted")),
    )
    .await;
    let (code, out, _) = fencehook_binary(&["audit"], &[("DATABASE_URL", &ctx.database_url)]).await;
    assert_eq!(code, 0, "{out}");
    // A second refund written by hand, past the cap (the service would refuse it).
    ctx.db()
        .await
        .batch_execute(
            "INSERT INTO payments (provider, transaction_id, kind, parent_transaction_id, event_type, amount_minor, currency, fingerprint, status, fence)
             VALUES ('generic', 're_forged', 'refund', 'pay_planted', 'refund.succeeded', 300, 'EUR', 'x', 'succeeded', 1);
             INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
             SELECT id, 'debit', -300, 'EUR', 1 FROM payments WHERE transaction_id = 're_forged';",
        )
        .await
        .unwrap();
    let (code, out, _) = fencehook_binary(&["audit"], &[("DATABASE_URL", &ctx.database_url)]).await;
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("money_out_within_money_in"))
        .unwrap_or_default();
    assert!(line.contains("VIOLATED"), "{out}");
    assert!(
        out.contains("generic:pay_planted amount 500, out 700"),
        "{out}"
    );
}
