//! Inbox mode in a few words: an event's rows, a worker process's settings,
//! and accepts written by hand.

use std::time::Duration;

use fencehook::domain::{CanonicalEvent, EventKind};
use fencehook::store::inbox::ToAccept;

use super::downstream::MockDownstream;
use super::{wait_for, TestContext};

/// `tx` is booked: its payments row succeeded.
pub async fn booked(ctx: &TestContext, tx: &str) -> bool {
    matches!(ctx.payment(tx).await, Some((s, _)) if s == "succeeded")
}

/// (status, attempts) of each of `tx`'s events, oldest first.
pub async fn event_status(ctx: &TestContext, tx: &str) -> Vec<(String, i32)> {
    ctx.db()
        .await
        .query(
            "SELECT status, attempts FROM events WHERE transaction_id = $1 ORDER BY id",
            &[&tx],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Waits until a worker has looked at `tx` and put it back to wait, its
/// last error matching `reason` (a `LIKE` pattern).
pub async fn wait_until_put_back(ctx: &TestContext, tx: &str, reason: &str) {
    wait_for(
        "put back to wait for its payment",
        Duration::from_secs(10),
        || async {
            ctx.count(&format!(
                "SELECT count(*) FROM events WHERE transaction_id = '{tx}'
                AND status = 'queued' AND last_error LIKE '{reason}'"
            ))
            .await
                == 1
        },
    )
    .await;
}

/// The environment of a `fencehook work` process on this test's database
/// and prefix calling `downstream`: two workers, a 1 s TTL, a 3 s maximum
/// hold, with `overrides` set in place.
pub fn worker_env(
    ctx: &TestContext,
    downstream: &MockDownstream,
    overrides: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_LEASE_TTL_MS", "1000".to_owned()),
        ("FENCEHOOK_LEASE_MAX_MS", "3000".to_owned()),
        ("FENCEHOOK_DOWNSTREAM_URL", downstream.url().to_string()),
        ("FENCEHOOK_DOWNSTREAM_TIMEOUT_MS", "1500".to_owned()),
        ("FENCEHOOK_WORKERS", "2".to_owned()),
        ("FENCEHOOK_RETRY_BASE_MS", "100".to_owned()),
    ];
    for (key, value) in overrides {
        let at = env
            .iter()
            .position(|(k, _)| k == key)
            .expect("an override of a setting worker_env sets");
        env[at].1 = (*value).to_owned();
    }
    env
}

/// The canonical event of a generic payment-family delivery, as the edge
/// maps it.
pub fn generic(tx: &str, kind: EventKind, amount: i64) -> CanonicalEvent {
    CanonicalEvent {
        provider: "generic".to_owned(),
        transaction_id: tx.to_owned(),
        event_type: kind,
        amount_minor: amount,
        currency: "EUR".to_owned(),
        parent_transaction_id: None,
        occurred_at: None,
        merchant_reference: None,
        metadata: None,
    }
}

/// `event` as an accept stores it, its body `{"amount":…}`.
pub fn accept_of(event: CanonicalEvent) -> ToAccept {
    ToAccept {
        fingerprint: event.fingerprint(),
        psp_event_id: None,
        body: format!("{{\"amount\":{}}}", event.amount_minor),
        trace_context: None,
        cancel_if_payment_failed: false,
        event,
    }
}

/// A generic `payment.succeeded` of `amount` for `tx`, as an accept stores it.
pub fn to_accept(tx: &str, amount: i64) -> ToAccept {
    accept_of(generic(tx, EventKind::PaymentSucceeded, amount))
}
