//! A payment's life in a few words: the events of one object, one delivery's
//! answer, and what the ledger booked for a row.

use serde_json::{json, Value};

use super::{TestApp, TestContext};

/// A generic event of `event_type` for `tx`; `parent` names the payment a
/// refund or dispute belongs to.
pub fn event(event_type: &str, tx: &str, amount: i64, parent: Option<&str>) -> Value {
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
pub async fn send(app: &TestApp, ev: &Value) -> (u16, String) {
    let r = app.deliver(ev).await;
    (r.status, r.result().to_owned())
}

/// Sum of the ledger entries of one row.
pub async fn net(ctx: &TestContext, tx: &str) -> i64 {
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

/// The effects of one row's ledger entries, in booking order.
pub async fn effects(ctx: &TestContext, tx: &str) -> Vec<String> {
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
