//! The money path end to end: one downstream step per idempotency key, a
//! failure that moves no money, copies that answer as copies, the cap
//! reserved before the downstream is called, disputes booked past the
//! payment, a stalled transaction that does not block its payment, and
//! refunds from before the lifecycle that keep matching.

use std::sync::Arc;
use std::time::Duration;

use fencehook::config::LeaseBackendKind;
use fencehook::domain::EventKind;
use fencehook::metrics::{PAYMENTS_OVER_RETURNED_TOTAL, REFUND_REJECTED_TOTAL};
use fencehook::store::inbox::{Accepted, ToAccept};
use fencehook::store::Store;
use serde_json::{json, Value};

use crate::helpers::downstream::MockDownstream;
use crate::helpers::inbox::{accept_of, generic};
use crate::helpers::money::{effects, event, net, send};
use crate::helpers::process::{deliver_to, fencehook_binary, is_stopped, ServeProcess};
use crate::helpers::{wait_for, TestApp, TestContext};

/// (status, amount) of one row.
async fn row_of(ctx: &TestContext, tx: &str) -> (String, i64) {
    let row = ctx
        .db()
        .await
        .query_one(
            "SELECT status, amount_minor FROM payments WHERE transaction_id = $1",
            &[&tx],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// A downstream that deduplicates by `Idempotency-Key` (refusing a reused
/// key with another body) executes every step of an object: a failure and
/// its success, a refund and its reversal, each under a key of its own.
#[tokio::test(flavor = "multi_thread")]
async fn every_step_of_an_object_is_executed_by_a_downstream_that_keeps_its_idempotency_keys() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.strict_idempotency();
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    let steps = [
        event("payment.failed", "pay_steps", 1000, None),
        event("payment.succeeded", "pay_steps", 1000, None),
        event("refund.succeeded", "re_steps", 400, Some("pay_steps")),
        event("refund.failed", "re_steps", 400, Some("pay_steps")),
    ];
    for step in &steps {
        assert_eq!(send(&app, step).await, (200, "processed".into()), "{step}");
    }
    let executed = downstream.executed();
    for key in [
        "generic:pay_steps:payment.failed",
        "generic:pay_steps:payment.succeeded",
        "generic:re_steps:refund.succeeded",
        "generic:re_steps:refund.failed",
    ] {
        let event_type = key.rsplit(':').next().unwrap();
        assert_eq!(
            executed.get(key).map(|b| b["event_type"].clone()),
            Some(json!(event_type)),
            "{key} executed: {executed:?}"
        );
    }
    assert_eq!(effects(&ctx, "pay_steps").await, ["credit"]);
    assert_eq!(
        effects(&ctx, "re_steps").await,
        ["debit", "refund_reversal"]
    );
    // A re-sent step is a duplicate and calls nothing.
    let calls = downstream.calls().len();
    assert_eq!(send(&app, &steps[1]).await, (200, "duplicate".into()));
    assert_eq!(downstream.calls().len(), calls);
    ctx.assert_audit_clean().await;
}

/// A payment declined at 1000 and then paid at 1200 (Stripe lets a
/// PaymentIntent's amount change after a decline): the failure moved no
/// money, so the success is booked at its own amount; the row takes it.
async fn a_payment_that_failed_at_one_amount_is_credited_at_the_amount_it_succeeds_with(
    backend: LeaseBackendKind,
) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config_for(backend)).await;
    let failed = event("payment.failed", "pay_reprice", 1000, None);
    let succeeded = event("payment.succeeded", "pay_reprice", 1200, None);
    assert_eq!(send(&app, &failed).await, (200, "processed".into()));
    assert_eq!(send(&app, &succeeded).await, (200, "processed".into()));
    assert_eq!(send(&app, &succeeded).await, (200, "duplicate".into()));
    assert_eq!(net(&ctx, "pay_reprice").await, 1200);
    assert_eq!(
        ctx.count("SELECT amount_minor FROM payments WHERE transaction_id = 'pay_reprice'")
            .await,
        1200
    );
    // Its refunds are capped by what came in.
    let refund = event("refund.succeeded", "re_reprice", 1100, Some("pay_reprice"));
    assert_eq!(send(&app, &refund).await, (200, "processed".into()));
    // Once it succeeded, another amount is a mismatch again.
    let other = event("payment.succeeded", "pay_reprice", 1300, None);
    assert_eq!(send(&app, &other).await, (422, "payload_mismatch".into()));
    ctx.assert_audit_clean().await;
}

/// A payment declined at 1000, paid at 1200, then a late copy of the
/// decline: the failure answers by status (`stale`), whatever its amount;
/// one credit, at 1200.
async fn a_late_copy_of_a_decline_after_a_repriced_success_is_stale(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config_for(backend)).await;
    let failed = event("payment.failed", "pay_late_decline", 1000, None);
    let succeeded = event("payment.succeeded", "pay_late_decline", 1200, None);
    assert_eq!(send(&app, &failed).await, (200, "processed".into()));
    assert_eq!(send(&app, &succeeded).await, (200, "processed".into()));
    assert_eq!(send(&app, &failed).await, (200, "stale".into()));
    assert_eq!(effects(&ctx, "pay_late_decline").await, ["credit"]);
    assert_eq!(net(&ctx, "pay_late_decline").await, 1200);
    assert_eq!(
        row_of(&ctx, "pay_late_decline").await,
        ("succeeded".to_owned(), 1200)
    );
    ctx.assert_audit_clean().await;
}

/// A payment declined at 1000 and declined again at 1300 (re-priced between
/// two attempts): a decline moves no money, so the second is a copy of the
/// first (`duplicate`), never a mismatch; nothing is booked, and a success
/// at a third amount is still credited.
async fn a_decline_at_another_amount_is_answered_as_a_copy(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config_for(backend)).await;
    let first = event("payment.failed", "pay_declined_twice", 1000, None);
    let second = event("payment.failed", "pay_declined_twice", 1300, None);
    assert_eq!(send(&app, &first).await, (200, "processed".into()));
    assert_eq!(send(&app, &second).await, (200, "duplicate".into()));
    assert_eq!(ctx.entries().await, 0);
    let succeeded = event("payment.succeeded", "pay_declined_twice", 1500, None);
    assert_eq!(send(&app, &succeeded).await, (200, "processed".into()));
    assert_eq!(net(&ctx, "pay_declined_twice").await, 1500);
    assert_eq!(ctx.entries().await, 1);
    ctx.assert_audit_clean().await;
}

/// Inbox mode on an accept-only instance (no workers: the failure stays
/// queued): a success at another amount is accepted and *stored*, not
/// refused while the failure is unbooked; once workers run, it is credited
/// at its own amount, once.
#[tokio::test(flavor = "multi_thread")]
async fn in_inbox_mode_a_repriced_success_is_stored_while_its_failure_is_queued() {
    let ctx = TestContext::new().await;
    let accept_only = ctx.spawn(ctx.inbox_config(0)).await;
    let failed = event("payment.failed", "pay_queued_decline", 1000, None);
    let succeeded = event("payment.succeeded", "pay_queued_decline", 1200, None);
    assert_eq!(send(&accept_only, &failed).await, (200, "accepted".into()));
    assert_eq!(
        send(&accept_only, &succeeded).await,
        (200, "accepted".into())
    );
    assert_eq!(
        send(&accept_only, &succeeded).await,
        (200, "duplicate".into())
    );
    // A decline at another amount is a copy of the stored one.
    let repriced_decline = event("payment.failed", "pay_queued_decline", 1300, None);
    assert_eq!(
        send(&accept_only, &repriced_decline).await,
        (200, "duplicate".into())
    );
    let stored = "SELECT count(*) FROM events WHERE transaction_id = 'pay_queued_decline'";
    assert_eq!(ctx.count(stored).await, 2, "the failure and the success");
    let _workers = ctx.spawn(ctx.inbox_config(2)).await;
    wait_for("both events done", Duration::from_secs(30), || async {
        ctx.count(
            "SELECT count(*) FROM events
              WHERE transaction_id = 'pay_queued_decline' AND status = 'done'",
        )
        .await
            == 2
    })
    .await;
    assert_eq!(effects(&ctx, "pay_queued_decline").await, ["credit"]);
    assert_eq!(net(&ctx, "pay_queued_decline").await, 1200);
    assert_eq!(
        row_of(&ctx, "pay_queued_decline").await,
        ("succeeded".to_owned(), 1200)
    );
    ctx.assert_audit_clean().await;
}

/// Sync mode with the downstream down for the failure (its claim is left
/// `processing`), then up: the success at another amount is booked at its
/// amount, sent at it, and the failure's retry is `stale`.
#[tokio::test(flavor = "multi_thread")]
async fn a_repriced_success_is_booked_while_the_downstream_has_not_taken_the_failure() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    downstream.set_status(503);
    let failed = event("payment.failed", "pay_ds_down", 1000, None);
    assert_eq!(send(&app, &failed).await.0, 503);
    assert_eq!(
        ctx.payment("pay_ds_down").await.map(|p| p.0),
        Some("processing".to_owned())
    );
    downstream.set_status(200);
    let succeeded = event("payment.succeeded", "pay_ds_down", 1200, None);
    assert_eq!(send(&app, &succeeded).await, (200, "processed".into()));
    let last = downstream.calls().pop().unwrap();
    assert_eq!(
        (
            last.body["event_type"].clone(),
            last.body["amount_minor"].clone()
        ),
        (json!("payment.succeeded"), json!(1200))
    );
    assert_eq!(send(&app, &failed).await, (200, "stale".into()));
    assert_eq!(effects(&ctx, "pay_ds_down").await, ["credit"]);
    assert_eq!(net(&ctx, "pay_ds_down").await, 1200);
    ctx.assert_audit_clean().await;
}

/// The same with a downstream: the success is sent, and booked, at its amount.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_downstream_a_payment_that_failed_is_sent_and_credited_at_its_success_amount() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    send(&app, &event("payment.failed", "pay_ds_reprice", 1000, None)).await;
    let succeeded = event("payment.succeeded", "pay_ds_reprice", 1200, None);
    assert_eq!(send(&app, &succeeded).await, (200, "processed".into()));
    let last = downstream.calls().pop().unwrap();
    assert_eq!(last.body["event_type"], "payment.succeeded");
    assert_eq!(last.body["amount_minor"], 1200);
    assert_eq!(net(&ctx, "pay_ds_reprice").await, 1200);
    ctx.assert_audit_clean().await;
}

/// Each copy delivered to its own instance at once, retried like a PSP until
/// it is neither 409 nor 503: the last answer of each.
async fn copies_at_once(apps: &[Arc<TestApp>], ev: &Value) -> Vec<String> {
    let tasks: Vec<_> = apps
        .iter()
        .map(|app| {
            let (app, ev) = (app.clone(), ev.clone());
            tokio::spawn(async move {
                let last = app
                    .deliver_until_settled(&ev, Duration::from_secs(30))
                    .await
                    .pop()
                    .unwrap();
                format!("{} {}", last.status, last.result())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers.sort();
    answers
}

/// Three copies of one refund of 600 against a payment of 1,000, at once on
/// three instances, then three copies of its failure: one copy books, the
/// others answer as copies (`duplicate`), never `refund_rejected` (the first
/// copy's money moved before theirs) or 503.
async fn copies_of_a_refund_and_of_its_failure_answer_as_copies(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(Arc::new(ctx.spawn(ctx.config_for(backend)).await));
    }
    for round in 0..6 {
        let (p, r) = (format!("pay_copies_{round}"), format!("re_copies_{round}"));
        send(&apps[0], &event("payment.succeeded", &p, 1000, None)).await;
        let refund = event("refund.succeeded", &r, 600, Some(&p));
        assert_eq!(
            copies_at_once(&apps, &refund).await,
            ["200 duplicate", "200 duplicate", "200 processed"],
            "round {round}"
        );
        let failed = event("refund.failed", &r, 600, Some(&p));
        assert_eq!(
            copies_at_once(&apps, &failed).await,
            ["200 duplicate", "200 duplicate", "200 processed"],
            "round {round}"
        );
        assert_eq!(effects(&ctx, &r).await, ["debit", "refund_reversal"]);
        assert_eq!(
            ctx.count(&format!(
                "SELECT amount_out_minor FROM payments WHERE transaction_id = '{p}'"
            ))
            .await,
            0
        );
    }
    for app in &apps {
        assert_eq!(app.metric(REFUND_REJECTED_TOTAL, &[]), 0.0);
    }
    ctx.assert_audit_clean().await;
}

/// With a downstream, a refund and a second refund of one payment claimed
/// side by side: the first reserves its money at the claim, so the second is
/// refused before the downstream is called — not after the downstream
/// executed it (a 422 with its row left `processing` for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_downstream_the_cap_is_reserved_before_the_call() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = Arc::new(ctx.spawn(cfg).await);
    send(&app, &event("payment.succeeded", "pay_side", 1000, None)).await;
    // Every first claim of an object carries token 1: hold them at the gate.
    downstream.gate_token(1);
    let first = tokio::spawn({
        let app = app.clone();
        async move {
            let ev = event("refund.succeeded", "re_side_a", 600, Some("pay_side"));
            send(&app, &ev).await
        }
    });
    wait_for(
        "the first refund's call",
        Duration::from_secs(10),
        || async { downstream.calls().len() == 2 },
    )
    .await;
    let second = tokio::spawn({
        let app = app.clone();
        async move {
            let ev = event("refund.succeeded", "re_side_b", 600, Some("pay_side"));
            send(&app, &ev).await
        }
    });
    // Let the second one run its course (or reach the downstream) first.
    wait_for(
        "the second refund answered or called",
        Duration::from_secs(10),
        || async { second.is_finished() || downstream.calls().len() > 2 },
    )
    .await;
    downstream.open_gate();
    assert_eq!(first.await.unwrap(), (200, "processed".into()));
    assert_eq!(second.await.unwrap(), (422, "refund_rejected".into()));
    assert!(
        downstream
            .calls()
            .iter()
            .all(|c| c.body["transaction_id"] != "re_side_b"),
        "the refused refund was never sent downstream: {:?}",
        downstream.calls()
    );
    assert_eq!(ctx.payment("re_side_b").await, None, "nothing written");
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_side'")
            .await,
        600
    );
    ctx.assert_audit_clean().await;
}

/// A call the downstream refuses gives the reserved money back: another
/// refund may have it, and the refused one is refused when it comes back.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_downstream_a_refused_call_gives_its_reservation_back() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    send(
        &app,
        &event("payment.succeeded", "pay_given_back", 1000, None),
    )
    .await;
    let first = event(
        "refund.succeeded",
        "re_refused",
        600,
        Some("pay_given_back"),
    );
    downstream.set_status(500);
    assert_eq!(send(&app, &first).await.0, 503);
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_given_back'")
            .await,
        0,
        "the reservation was given back"
    );
    downstream.set_status(200);
    let other = event("refund.succeeded", "re_other", 700, Some("pay_given_back"));
    assert_eq!(send(&app, &other).await, (200, "processed".into()));
    assert_eq!(send(&app, &first).await, (422, "refund_rejected".into()));
    ctx.assert_audit_clean().await;
}

/// A dispute larger than its charge (currency fluctuation), and a
/// chargeback after a full refund (the double dip): the money is gone, so
/// both are booked past the payment's amount, counted and alerted, and the
/// audit warns instead of failing. Refunds keep the cap.
async fn disputes_are_booked_past_the_payment_and_refunds_keep_the_cap(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config_for(backend)).await;
    send(&app, &event("payment.succeeded", "pay_fx", 1000, None)).await;
    let big = event("dispute.funds_withdrawn", "dp_fx", 1200, Some("pay_fx"));
    assert_eq!(send(&app, &big).await, (200, "processed".into()));
    assert_eq!(send(&app, &big).await, (200, "duplicate".into()));

    send(&app, &event("payment.succeeded", "pay_dip", 1000, None)).await;
    let refund = event("refund.succeeded", "re_dip", 1000, Some("pay_dip"));
    assert_eq!(send(&app, &refund).await, (200, "processed".into()));
    let dip = event("dispute.funds_withdrawn", "dp_dip", 1000, Some("pay_dip"));
    assert_eq!(send(&app, &dip).await, (200, "processed".into()));
    let more = event("refund.succeeded", "re_more", 1, Some("pay_dip"));
    let r = app.deliver(&more).await;
    assert_eq!((r.status, r.result()), (422, "refund_rejected"), "{r:?}");
    assert_eq!(r.body["reason"], "exceeds_payment");

    assert_eq!(net(&ctx, "dp_fx").await, -1200);
    assert_eq!(net(&ctx, "dp_dip").await, -1000);
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_dip'")
            .await,
        2000
    );
    assert_eq!(app.metric(PAYMENTS_OVER_RETURNED_TOTAL, &[]), 2.0);
    // The dispute won back gives its money back.
    let won = event("dispute.funds_reinstated", "dp_dip", 1000, Some("pay_dip"));
    assert_eq!(send(&app, &won).await, (200, "processed".into()));
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_dip'")
            .await,
        1000
    );
    ctx.assert_audit_clean().await;
    let (code, out, _) = fencehook_binary(&["audit"], &[("DATABASE_URL", &ctx.database_url)]).await;
    assert_eq!(code, 0, "a warning, not a violation: {out}");
    assert!(
        out.contains("warning: 1 payment(s) gave back more than came in"),
        "{out}"
    );
    assert!(
        out.contains("generic:pay_fx amount 1000, out 1200"),
        "{out}"
    );
}

/// Payment 1000, a chargeback of 1000 and a refund of 600, in both orders:
/// refunds are capped by refunds alone, so the refund after the chargeback
/// is booked as the one before it is (it used to be 422 `exceeds_payment`).
/// The same facts give the same ledger; each payment is reported
/// over-returned once (counted, and an `audit` warning), whatever the order.
async fn a_refund_after_its_chargeback_is_booked_as_one_before_it(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config_for(backend)).await;
    let orders = [
        ("pay_cb_first", ["dispute", "refund"]),
        ("pay_re_first", ["refund", "dispute"]),
    ];
    for (pay, order) in orders {
        send(&app, &event("payment.succeeded", pay, 1000, None)).await;
        for kind in order {
            let (ev, tx) = match kind {
                "dispute" => ("dispute.funds_withdrawn", format!("dp_{pay}")),
                _ => ("refund.succeeded", format!("re_{pay}")),
            };
            let amount = if kind == "dispute" { 1000 } else { 600 };
            let ev = event(ev, &tx, amount, Some(pay));
            assert_eq!(
                send(&app, &ev).await,
                (200, "processed".into()),
                "{pay}: {kind}"
            );
        }
    }
    for (pay, _) in orders {
        assert_eq!(
            effects(&ctx, &format!("dp_{pay}")).await,
            ["dispute"],
            "{pay}"
        );
        assert_eq!(
            effects(&ctx, &format!("re_{pay}")).await,
            ["debit"],
            "{pay}"
        );
        let out = format!("SELECT amount_out_minor FROM payments WHERE transaction_id = '{pay}'");
        assert_eq!(ctx.count(&out).await, 1600, "{pay}");
    }
    assert_eq!(
        ctx.count("SELECT sum(amount_minor)::int8 FROM ledger_entries")
            .await,
        -1200
    );
    assert_eq!(app.metric(PAYMENTS_OVER_RETURNED_TOTAL, &[]), 2.0);
    // The refunds alone still keep the cap: 400 more is all there is.
    let more = event("refund.succeeded", "re_more_cb", 401, Some("pay_cb_first"));
    let r = app.deliver(&more).await;
    assert_eq!((r.status, r.result()), (422, "refund_rejected"), "{r:?}");
    assert_eq!(r.body["reason"], "exceeds_payment");
    let rest = event("refund.succeeded", "re_rest_cb", 400, Some("pay_cb_first"));
    assert_eq!(send(&app, &rest).await, (200, "processed".into()));
    ctx.assert_audit_clean().await;
    let (code, out, _) = fencehook_binary(&["audit"], &[("DATABASE_URL", &ctx.database_url)]).await;
    assert_eq!(code, 0, "a warning, not a violation: {out}");
    assert!(
        out.contains("warning: 2 payment(s) gave back more than came in"),
        "{out}"
    );
}

/// With a downstream (the money reserved at the claim): a refund after its
/// payment's chargeback is booked too.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_downstream_a_refund_after_its_chargeback_is_booked() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    send(&app, &event("payment.succeeded", "pay_ds_cb", 1000, None)).await;
    let cb = event(
        "dispute.funds_withdrawn",
        "dp_ds_cb",
        1000,
        Some("pay_ds_cb"),
    );
    assert_eq!(send(&app, &cb).await, (200, "processed".into()));
    let refund = event("refund.succeeded", "re_ds_cb", 600, Some("pay_ds_cb"));
    assert_eq!(send(&app, &refund).await, (200, "processed".into()));
    assert_eq!(effects(&ctx, "re_ds_cb").await, ["debit"]);
    assert_eq!(app.metric(PAYMENTS_OVER_RETURNED_TOTAL, &[]), 1.0);
    let more = event("refund.succeeded", "re_ds_cb_more", 401, Some("pay_ds_cb"));
    assert_eq!(send(&app, &more).await, (422, "refund_rejected".into()));
    ctx.assert_audit_clean().await;
}

/// The same with a downstream: the dispute is reserved at its claim past
/// the payment's amount, executed, and booked.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_downstream_a_dispute_after_a_refund_is_booked() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    send(&app, &event("payment.succeeded", "pay_ds_dip", 800, None)).await;
    let refund = event("refund.succeeded", "re_ds_dip", 800, Some("pay_ds_dip"));
    assert_eq!(send(&app, &refund).await, (200, "processed".into()));
    let dip = event(
        "dispute.funds_withdrawn",
        "dp_ds_dip",
        800,
        Some("pay_ds_dip"),
    );
    assert_eq!(send(&app, &dip).await, (200, "processed".into()));
    assert_eq!(effects(&ctx, "dp_ds_dip").await, ["dispute"]);
    assert_eq!(app.metric(PAYMENTS_OVER_RETURNED_TOTAL, &[]), 1.0);
    ctx.assert_audit_clean().await;
}

/// Refund rows a release before V4 booked have no parent and a fingerprint
/// with an empty one; every adapter now names the parent. One was in flight
/// at the upgrade (`processing`): its success is booked against its payment,
/// which it now names. One was booked: a re-send is a duplicate, and its
/// failure is reversed without giving its payment money it never took.
async fn refunds_from_before_the_lifecycle_keep_matching_the_events_that_name_their_payment(
    backend: LeaseBackendKind,
) {
    let ctx = TestContext::at_version(3).await;
    ctx.db()
        .await
        .batch_execute(
            "INSERT INTO payments (provider, transaction_id, event_type, amount_minor, currency, fingerprint, status, fence)
             VALUES ('generic', 'old_paid', 'payment.succeeded', 1000, 'EUR', 'v1-fp', 'succeeded', 1),
                    ('generic', 'old_booked', 'refund.succeeded', 200, 'EUR', 'v1-fp', 'succeeded', 1),
                    ('generic', 'old_in_flight', 'refund.succeeded', 300, 'EUR', 'v1-fp', 'processing', 1);
             INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
             SELECT id, 'credit', 1000, 'EUR', 1 FROM payments WHERE transaction_id = 'old_paid';
             INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
             SELECT id, 'debit', -200, 'EUR', 1 FROM payments WHERE transaction_id = 'old_booked';",
        )
        .await
        .unwrap();
    fencehook::store::migrate::run(
        &ctx.database_url,
        fencehook::store::migrate::MissingDatabase::Refuse,
    )
    .await
    .unwrap();
    let app = ctx.spawn(ctx.config_for(backend)).await;
    let in_flight = event("refund.succeeded", "old_in_flight", 300, Some("old_paid"));
    assert_eq!(send(&app, &in_flight).await, (200, "processed".into()));
    assert_eq!(send(&app, &in_flight).await, (200, "duplicate".into()));
    assert_eq!(effects(&ctx, "old_in_flight").await, ["debit"]);
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM payments WHERE transaction_id = 'old_in_flight'
                AND parent_transaction_id = 'old_paid'"
        )
        .await,
        1,
        "it names its payment now"
    );
    let booked = event("refund.succeeded", "old_booked", 200, Some("old_paid"));
    assert_eq!(send(&app, &booked).await, (200, "duplicate".into()));
    let failed = event("refund.failed", "old_booked", 200, Some("old_paid"));
    assert_eq!(send(&app, &failed).await, (200, "processed".into()));
    assert_eq!(send(&app, &failed).await, (200, "duplicate".into()));
    assert_eq!(
        effects(&ctx, "old_booked").await,
        ["debit", "refund_reversal"]
    );
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'old_paid'")
            .await,
        300,
        "only the refund booked now took its payment's money"
    );
    // Another amount is still another object.
    let other = event("refund.succeeded", "old_booked", 201, Some("old_paid"));
    assert_eq!(send(&app, &other).await, (422, "payload_mismatch".into()));
    ctx.assert_audit_clean().await;
}

/// A refund's transaction frozen between its money move and its COMMIT (its
/// process SIGSTOPped, the connection up) holds its payment row. Another
/// refund of that payment answers 409 within the in-flight wait instead of
/// queueing on the lock until the statement timeout (503); once the frozen
/// transaction has been idle for a lease TTL the server ends it, and both
/// refunds are booked. The frozen instance, continued, does not answer 200.
async fn a_refund_frozen_before_its_commit_does_not_block_its_payment(backend: LeaseBackendKind) {
    let ctx = TestContext::new().await;
    let env = vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_LEASE_BACKEND", backend.as_str().to_owned()),
        ("FENCEHOOK_LEASE_TTL_MS", "3000".to_owned()),
        ("FENCEHOOK_LEASE_TIMEOUT_MS", "250".to_owned()),
        ("FENCEHOOK_INFLIGHT_WAIT_MS", "300".to_owned()),
        ("FENCEHOOK_DB_STATEMENT_TIMEOUT_MS", "20000".to_owned()),
        ("FENCEHOOK_DB_POOL_SIZE", "4".to_owned()),
    ];
    let mut frozen_env = env.clone();
    frozen_env.push((
        "FAILPOINTS",
        "before_money_commit=1*return(sigstop)".to_owned(),
    ));
    let a = ServeProcess::start(&frozen_env).await;
    let b = ServeProcess::start(&env).await;
    let p = event("payment.succeeded", "pay_frozen", 1000, None);
    assert_eq!(b.deliver(&p).await.result(), "processed");
    let first = event("refund.succeeded", "re_frozen", 400, Some("pay_frozen"));
    let a_answer = tokio::spawn({
        let (base, ev) = (a.base.clone(), first.clone());
        async move { deliver_to(&base, &ev).await }
    });
    let pid = a.pid();
    wait_for("A stopped itself", Duration::from_secs(10), || async move {
        is_stopped(pid)
    })
    .await;
    let second = event("refund.succeeded", "re_waiting", 300, Some("pay_frozen"));
    let started = tokio::time::Instant::now();
    let r = b.deliver(&second).await;
    assert_eq!((r.status, r.result()), (409, "in_progress"), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "answered within the in-flight wait, not after a lock wait: {:?}",
        started.elapsed()
    );
    assert!(r.retry_after.is_some());
    // The server ends the frozen transaction after a TTL idle: both book.
    for ev in [&second, &first] {
        let end = tokio::time::Instant::now() + Duration::from_secs(30);
        let last = loop {
            let r = b.deliver(ev).await;
            if !matches!(r.status, 409 | 503) || tokio::time::Instant::now() >= end {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(last.result(), "processed", "{ev}: {last:?}");
    }
    a.signal("CONT");
    let a_answer = a_answer.await.unwrap();
    assert_ne!(
        a_answer.status, 200,
        "A's transaction was ended: {a_answer:?}"
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM ledger_entries WHERE effect = 'debit'")
            .await,
        2
    );
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_frozen'")
            .await,
        700
    );
    ctx.assert_audit_clean().await;
}

crate::helpers::both_backends!(
    a_refund_after_its_chargeback_is_booked_as_one_before_it,
    a_payment_that_failed_at_one_amount_is_credited_at_the_amount_it_succeeds_with,
    a_late_copy_of_a_decline_after_a_repriced_success_is_stale,
    a_decline_at_another_amount_is_answered_as_a_copy,
    copies_of_a_refund_and_of_its_failure_answer_as_copies,
    disputes_are_booked_past_the_payment_and_refunds_keep_the_cap,
    refunds_from_before_the_lifecycle_keep_matching_the_events_that_name_their_payment,
    a_refund_frozen_before_its_commit_does_not_block_its_payment,
);

/// A refund's call that timed out keeps its reservation (the downstream may
/// have executed it); when the PSP then says the refund failed, the money
/// goes back to the payment with the failure.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_downstream_a_refund_that_fails_after_a_timed_out_call_gives_its_reservation_back() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    cfg.downstream_timeout = Duration::from_millis(300);
    let app = ctx.spawn(cfg).await;
    send(
        &app,
        &event("payment.succeeded", "pay_timed_out", 1000, None),
    )
    .await;
    downstream.set_delay(Duration::from_secs(2));
    let refund = event(
        "refund.succeeded",
        "re_timed_out",
        600,
        Some("pay_timed_out"),
    );
    assert_eq!(send(&app, &refund).await.0, 503);
    let out = "SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_timed_out'";
    assert_eq!(
        ctx.count(out).await,
        600,
        "kept: the step may have been executed"
    );
    downstream.set_delay(Duration::ZERO);
    let failed = event("refund.failed", "re_timed_out", 600, Some("pay_timed_out"));
    assert_eq!(send(&app, &failed).await, (200, "processed".into()));
    assert_eq!(ctx.count(out).await, 0);
    assert_eq!(effects(&ctx, "re_timed_out").await, Vec::<String>::new());
    ctx.assert_audit_clean().await;
}

/// A retry that takes over a timed-out call's reservation and is refused
/// by the downstream (the first call may still be running there: 409) does
/// not give that reservation back: the first call may have executed the
/// refund, so the cap stays held for it, another refund past the rest of the
/// cap is refused, and the retry that finally goes through is booked.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_downstream_a_refused_retry_keeps_the_reservation_a_timed_out_call_left() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    cfg.downstream_timeout = Duration::from_millis(300);
    let app = ctx.spawn(cfg).await;
    send(
        &app,
        &event("payment.succeeded", "pay_inherited", 1000, None),
    )
    .await;
    let out = "SELECT amount_out_minor FROM payments WHERE transaction_id = 'pay_inherited'";
    let first = event(
        "refund.succeeded",
        "re_inherited",
        600,
        Some("pay_inherited"),
    );
    downstream.set_delay(Duration::from_secs(2));
    assert_eq!(send(&app, &first).await.0, 503, "the call timed out");
    assert_eq!(
        ctx.count(out).await,
        600,
        "kept: the step may have been executed"
    );
    downstream.set_delay(Duration::ZERO);
    downstream.set_status(409);
    assert_eq!(
        send(&app, &first).await.0,
        503,
        "the retry's call was refused"
    );
    assert_eq!(
        ctx.count(out).await,
        600,
        "the timed-out call's reservation is not the refused retry's to give back"
    );
    downstream.set_status(200);
    let other = event("refund.succeeded", "re_beyond", 700, Some("pay_inherited"));
    assert_eq!(send(&app, &other).await, (422, "refund_rejected".into()));
    assert_eq!(send(&app, &first).await, (200, "processed".into()));
    assert_eq!(ctx.count(out).await, 600);
    ctx.assert_audit_clean().await;
}

/// Inbox mode accepts what sync mode books: a failed payment's success at
/// another amount, and the failure of a refund from before the lifecycle.
#[tokio::test(flavor = "multi_thread")]
async fn in_inbox_mode_a_repriced_success_and_a_pre_lifecycle_refund_failure_are_accepted_and_booked(
) {
    let ctx = TestContext::at_version(3).await;
    ctx.db()
        .await
        .batch_execute(
            "INSERT INTO payments (provider, transaction_id, event_type, amount_minor, currency, fingerprint, status, fence)
             VALUES ('generic', 'old_inbox_paid', 'payment.succeeded', 1000, 'EUR', 'v1-fp', 'succeeded', 1),
                    ('generic', 'old_inbox_refund', 'refund.succeeded', 200, 'EUR', 'v1-fp', 'succeeded', 1);
             INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
             SELECT id, 'credit', 1000, 'EUR', 1 FROM payments WHERE transaction_id = 'old_inbox_paid';
             INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
             SELECT id, 'debit', -200, 'EUR', 1 FROM payments WHERE transaction_id = 'old_inbox_refund';",
        )
        .await
        .unwrap();
    fencehook::store::migrate::run(
        &ctx.database_url,
        fencehook::store::migrate::MissingDatabase::Refuse,
    )
    .await
    .unwrap();
    let app = ctx.spawn(ctx.inbox_config(2)).await;
    let failed = event("payment.failed", "pay_inbox_reprice", 1000, None);
    assert_eq!(send(&app, &failed).await, (200, "accepted".into()));
    wait_for("the failure booked", Duration::from_secs(20), || async {
        ctx.payment("pay_inbox_reprice").await.map(|p| p.0) == Some("failed".to_owned())
    })
    .await;
    let succeeded = event("payment.succeeded", "pay_inbox_reprice", 1200, None);
    assert_eq!(send(&app, &succeeded).await, (200, "accepted".into()));
    let refund_failed = event(
        "refund.failed",
        "old_inbox_refund",
        200,
        Some("old_inbox_paid"),
    );
    assert_eq!(send(&app, &refund_failed).await, (200, "accepted".into()));
    wait_for("both booked", Duration::from_secs(20), || async {
        net(&ctx, "pay_inbox_reprice").await == 1200 && net(&ctx, "old_inbox_refund").await == 0
    })
    .await;
    assert_eq!(
        effects(&ctx, "old_inbox_refund").await,
        ["debit", "refund_reversal"]
    );
    assert_eq!(
        ctx.count("SELECT amount_out_minor FROM payments WHERE transaction_id = 'old_inbox_paid'")
            .await,
        0
    );
    ctx.assert_audit_clean().await;
}

/// Accepts stored together answer as they would alone: a failed payment's
/// success at another amount is new, another amount for a failed payment's
/// failure is a copy (a decline moves no money).
#[tokio::test(flavor = "multi_thread")]
async fn a_batched_accept_takes_a_failed_payments_success_at_another_amount() {
    let ctx = TestContext::new().await;
    let store = Store::new(&ctx.config().db).unwrap();
    let item = |tx: &str, kind: EventKind, amount: i64| accept_of(generic(tx, kind, amount));
    for tx in ["tx_b_declined", "tx_b_declined_2"] {
        let first = item(tx, EventKind::PaymentFailed, 1000);
        store
            .accept(
                &first.event,
                &first.fingerprint,
                None,
                &first.body,
                None,
                false,
            )
            .await
            .unwrap();
        ctx.db()
            .await
            .execute(
                "UPDATE payments SET status = 'failed' WHERE transaction_id = $1",
                &[&tx],
            )
            .await
            .unwrap();
    }
    let batch = [
        item("tx_b_declined", EventKind::PaymentSucceeded, 1200),
        item("tx_b_declined_2", EventKind::PaymentFailed, 1100),
    ];
    let batch: Vec<&ToAccept> = batch.iter().collect();
    assert_eq!(
        store.accept_many(&batch).await.unwrap(),
        [Accepted::New, Accepted::Duplicate]
    );
}

/// A refund and then a dispute of one payment claimed side by side, both
/// held in their downstream calls: both were executed, so both are booked
/// (the dispute past the payment's amount) — never one refused after its
/// call, its row left `processing`. (The other way round, the refund is
/// refused at its claim, before its call: the dispute reserved the money.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_downstream_a_refund_and_a_dispute_claimed_side_by_side_are_both_booked() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = Arc::new(ctx.spawn(cfg).await);
    send(&app, &event("payment.succeeded", "pay_both", 1000, None)).await;
    downstream.gate_token(1);
    let deliver = |ev: Value| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, &ev).await })
    };
    let refund = deliver(event("refund.succeeded", "re_both", 600, Some("pay_both")));
    wait_for(
        "the refund's call held",
        Duration::from_secs(10),
        || async { downstream.calls().len() == 2 },
    )
    .await;
    let dispute = deliver(event(
        "dispute.funds_withdrawn",
        "dp_both",
        600,
        Some("pay_both"),
    ));
    wait_for(
        "the dispute's call held",
        Duration::from_secs(10),
        || async { downstream.calls().len() == 3 },
    )
    .await;
    downstream.open_gate();
    assert_eq!(refund.await.unwrap(), (200, "processed".into()));
    assert_eq!(dispute.await.unwrap(), (200, "processed".into()));
    assert_eq!(effects(&ctx, "re_both").await, ["debit"]);
    assert_eq!(effects(&ctx, "dp_both").await, ["dispute"]);
    assert_eq!(
        ctx.count("SELECT count(*) FROM payments WHERE status = 'processing'")
            .await,
        0
    );
    assert_eq!(app.metric(PAYMENTS_OVER_RETURNED_TOTAL, &[]), 1.0);
    ctx.assert_audit_clean().await;
}
