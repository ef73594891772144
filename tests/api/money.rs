//! The money path end to end: one downstream step per idempotency key, a
//! failure that moves no money, copies that answer as copies, the cap
//! reserved before the downstream is called, disputes booked past the
//! payment, a stalled transaction that does not block its payment, and
//! refunds from before the lifecycle that keep matching.

use fencehook::config::LeaseBackendKind;
use serde_json::{json, Value};

use crate::helpers::downstream::MockDownstream;
use crate::helpers::{TestApp, TestContext};

fn event(event_type: &str, tx: &str, amount: i64, parent: Option<&str>) -> Value {
    let mut v = json!({
        "transaction_id": tx,
        "amount": amount,
        "currency": "EUR",
        "event_type": event_type,
    });
    if let Some(parent) = parent {
        v["payment_transaction_id"] = json!(parent);
    }
    v
}

/// (status code, result) of one delivery.
async fn send(app: &TestApp, ev: &Value) -> (u16, String) {
    let r = app.deliver(ev).await;
    (r.status, r.result().to_owned())
}

/// Sum of the ledger entries of one row.
async fn net(ctx: &TestContext, tx: &str) -> i64 {
    ctx.db()
        .await
        .query_one(
            "SELECT coalesce(sum(l.amount_minor), 0)::bigint FROM ledger_entries l
               JOIN payments p ON p.id = l.payment_id WHERE p.transaction_id = $1",
            &[&tx],
        )
        .await
        .unwrap()
        .get(0)
}

async fn effects(ctx: &TestContext, tx: &str) -> Vec<String> {
    ctx.db()
        .await
        .query(
            "SELECT l.effect FROM ledger_entries l JOIN payments p ON p.id = l.payment_id
              WHERE p.transaction_id = $1 ORDER BY l.id",
            &[&tx],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
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
    // Out of `failed` only a payment's success may change the amount.
    send(&app, &event("payment.failed", "pay_declined", 500, None)).await;
    let again = event("payment.failed", "pay_declined", 600, None);
    assert_eq!(send(&app, &again).await, (422, "payload_mismatch".into()));
    ctx.assert_audit_clean().await;
}

crate::helpers::both_backends!(
    a_payment_that_failed_at_one_amount_is_credited_at_the_amount_it_succeeds_with
);

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
