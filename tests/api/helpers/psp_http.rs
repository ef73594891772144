//! What the tests of one PSP over HTTP share (psp_*.rs): its fixtures, its
//! rows and ledger as booked, and a storm of copies of each payment's event
//! over several instances.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fencehook::providers::psp::Notice;

use super::{Reply, TestApp, TestContext};

/// A fixture of `scheme`'s, from `tests/fixtures/<scheme>/`.
pub fn fixture(scheme: &str, name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/{scheme}/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn s(v: &str) -> String {
    v.to_owned()
}

/// (status, event_type, amount_minor, currency, parent) of `provider`'s row `tx`.
pub async fn row(
    ctx: &TestContext,
    provider: &str,
    tx: &str,
) -> (String, String, i64, String, Option<String>) {
    let r = ctx
        .db()
        .await
        .query_one(
            "SELECT status, event_type, amount_minor, currency, parent_transaction_id \
             FROM payments WHERE provider = $1 AND transaction_id = $2",
            &[&provider, &tx],
        )
        .await
        .unwrap_or_else(|e| panic!("{tx}: {e}"));
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
}

/// The ledger entries of `provider`'s row `tx`: (effect, signed amount, currency).
pub async fn entries(ctx: &TestContext, provider: &str, tx: &str) -> Vec<(String, i64, String)> {
    ctx.db()
        .await
        .query(
            "SELECT e.effect, e.amount_minor, e.currency FROM ledger_entries e \
             JOIN payments p ON p.id = e.payment_id \
             WHERE p.provider = $1 AND p.transaction_id = $2 ORDER BY e.id",
            &[&provider, &tx],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// (transaction_id, kind, parent, event_type, amount, currency, status) of every row.
pub async fn rows(
    ctx: &TestContext,
) -> Vec<(String, String, Option<String>, String, i64, String, String)> {
    ctx.db()
        .await
        .query(
            "SELECT transaction_id, kind, parent_transaction_id, event_type, amount_minor, currency, status \
             FROM payments ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)))
        .collect()
}

/// (transaction_id, effect, amount, currency) of every ledger entry.
pub async fn ledger(ctx: &TestContext) -> Vec<(String, String, i64, String)> {
    ctx.db()
        .await
        .query(
            "SELECT p.transaction_id, e.effect, e.amount_minor, e.currency FROM ledger_entries e \
             JOIN payments p ON p.id = e.payment_id ORDER BY e.id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// Twelve successful payments in `currency`: ids `{prefix}00` to
/// `{prefix}11`, amounts `base` to `base + 11`.
pub fn payments(prefix: &str, base: i64, currency: &str) -> Vec<Notice> {
    (0..12)
        .map(|p| Notice {
            transaction_id: format!("{prefix}{p:02}"),
            amount: base + p,
            currency: currency.into(),
            event_type: "payment.succeeded".into(),
            payment_transaction_id: None,
        })
        .collect()
}

/// A storm: four copies of each payment's event (the body the PSP sends
/// for it, `body_of`) delivered at once, over `apps` in turn (the PSP's
/// retries reaching several instances), each copy sent again while it is
/// answered 409 or 503, for 30 s at most. Then every copy was answered
/// 200, exactly one copy of each payment `processed` (the others
/// `duplicate`), and each payment is one row and one ledger entry of its
/// amount, with a clean audit.
pub async fn storm<F, Fut>(
    ctx: &TestContext,
    apps: &[Arc<TestApp>],
    payments: Vec<Notice>,
    body_of: impl Fn(&Notice) -> String,
    deliver: F,
) where
    F: Fn(Arc<TestApp>, String) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let copies = 4;
    let events: Vec<(Notice, String)> = payments
        .into_iter()
        .map(|n| {
            let body = body_of(&n);
            (n, body)
        })
        .collect();
    let mut tasks = Vec::new();
    for (p, (notice, body)) in events.iter().enumerate() {
        for c in 0..copies {
            let app = apps[(p + c) % apps.len()].clone();
            let (body, tx, deliver) =
                (body.clone(), notice.transaction_id.clone(), deliver.clone());
            tasks.push(tokio::spawn(async move {
                let end = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    let r = deliver(app.clone(), body.clone()).await;
                    if (r.status != 409 && r.status != 503) || tokio::time::Instant::now() >= end {
                        return (tx, r);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }));
        }
    }
    let mut processed: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        let (tx, r) = t.await.unwrap();
        assert_eq!(r.status, 200, "{tx}: {r:?}");
        match r.result() {
            "processed" => *processed.entry(tx).or_default() += 1,
            "duplicate" => {}
            other => panic!("{tx}: {other}"),
        }
    }
    let payments = events.len();
    assert_eq!(processed.len(), payments, "{processed:?}");
    assert!(processed.values().all(|n| *n == 1), "{processed:?}");
    assert_eq!(ctx.payments().await, payments as i64);
    assert_eq!(ctx.entries().await, payments as i64);
    assert_eq!(
        ctx.count("SELECT sum(amount_minor)::bigint FROM ledger_entries")
            .await,
        events.iter().map(|(n, _)| n.amount).sum::<i64>()
    );
    ctx.assert_audit_clean().await;
}
