//! Bad input gets its documented answer and writes nothing.

use serde_json::json;

use crate::helpers::{now, payment, TestApp, TestContext, SECRET};

async fn raw(app: &TestApp, body: &str) -> (u16, String, String) {
    let r = app
        .post_signed("generic", body.as_bytes(), now(), SECRET)
        .await;
    (
        r.status,
        r.result().to_owned(),
        r.body["reason"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_signatures_and_stale_timestamps_are_401_and_write_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let body = payment("tx_sig", 100).to_string();
    let other_secret = "whsec_c29tZS1vdGhlci1zZWNyZXQta2V5";
    let r = app
        .post_signed("generic", body.as_bytes(), now(), other_secret)
        .await;
    assert_eq!((r.status, r.result()), (401, "unauthorized"));
    for skew in [-301, 301, -3600] {
        let r = app
            .post_signed("generic", body.as_bytes(), now() + skew, SECRET)
            .await;
        assert_eq!(
            (r.status, r.result()),
            (401, "unauthorized"),
            "timestamp skew {skew}"
        );
    }
    let r = app
        .post(
            "/webhooks/generic",
            &[("content-type", "application/json")],
            body.clone().into_bytes(),
        )
        .await;
    assert_eq!(r.status, 401, "missing signature headers");
    // A valid signature over other bytes: the body was tampered with.
    let id = "msg_1";
    let ts = now().to_string();
    let sig = fencehook::providers::standard::sign(SECRET, id, now(), body.as_bytes()).unwrap();
    let tampered = body.replace("100", "900");
    let r = app
        .post(
            "/webhooks/generic",
            &[
                ("content-type", "application/json"),
                ("webhook-id", id),
                ("webhook-timestamp", &ts),
                ("webhook-signature", &sig),
            ],
            tampered.into_bytes(),
        )
        .await;
    assert_eq!(r.status, 401, "tampered body");
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_payloads_are_400_with_a_reason_and_write_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let cases = [
        ("malformed json", r#"{"transaction_id": "tx_1", "amount": "#.to_owned()),
        ("float amount", json!({"transaction_id": "tx_1", "amount": 10.5, "currency": "EUR", "event_type": "payment.succeeded"}).to_string()),
        ("zero amount", json!({"transaction_id": "tx_1", "amount": 0, "currency": "EUR", "event_type": "payment.succeeded"}).to_string()),
        ("string amount", json!({"transaction_id": "tx_1", "amount": "100", "currency": "EUR", "event_type": "payment.succeeded"}).to_string()),
        ("id with surrounding whitespace", json!({"transaction_id": " tx_1 ", "amount": 100, "currency": "EUR", "event_type": "payment.succeeded"}).to_string()),
        ("missing currency", json!({"transaction_id": "tx_1", "amount": 100, "event_type": "payment.succeeded"}).to_string()),
        ("lower-case currency", json!({"transaction_id": "tx_1", "amount": 100, "currency": "eur", "event_type": "payment.succeeded"}).to_string()),
        ("missing event_type", json!({"transaction_id": "tx_1", "amount": 100, "currency": "EUR"}).to_string()),
    ];
    for (name, body) in cases {
        let (status, result, reason) = raw(&app, &body).await;
        assert_eq!(
            (status, result.as_str()),
            (400, "invalid_payload"),
            "{name}"
        );
        assert!(!reason.is_empty(), "{name}: a human-readable reason");
    }
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn size_content_type_and_unknown_provider_get_their_statuses_and_write_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let mut big = payment("tx_big", 100);
    big["padding"] = "x".repeat(70 * 1024).into();
    let r = app
        .post_signed("generic", big.to_string().as_bytes(), now(), SECRET)
        .await;
    assert_eq!((r.status, r.result()), (413, "too_large"));
    // The rest of the body was never read: the answer says the connection
    // closes, so the client's pool does not reuse it for the next request.
    assert_eq!(r.connection.as_deref(), Some("close"));

    let body = payment("tx_ct", 100).to_string();
    let r = app
        .post(
            "/webhooks/generic",
            &[("content-type", "text/plain")],
            body.clone().into_bytes(),
        )
        .await;
    assert_eq!(r.status, 415);
    let r = app
        .post(
            "/webhooks/nope",
            &[("content-type", "application/json")],
            body.into_bytes(),
        )
        .await;
    assert_eq!(r.status, 404);
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unhandled_event_types_are_ignored_with_200_and_write_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let r = app
        .deliver(&json!({"event_type": "customer.created", "id": "cus_1"}))
        .await;
    assert_eq!((r.status, r.result()), (200, "ignored"));
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_transaction_with_another_amount_is_422_and_changes_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    assert_eq!(
        app.deliver(&payment("tx_mm", 1000)).await.result(),
        "processed"
    );
    let r = app.deliver(&payment("tx_mm", 1001)).await;
    assert_eq!((r.status, r.result()), (422, "payload_mismatch"));
    let mut other_currency = payment("tx_mm", 1000);
    other_currency["currency"] = "USD".into();
    assert_eq!(app.deliver(&other_currency).await.status, 422);
    assert_eq!(
        app.deliver(&payment("tx_mm", 1000)).await.result(),
        "duplicate"
    );
    assert_eq!(ctx.count("SELECT amount_minor FROM payments").await, 1000);
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(
        app.metric(
            "fencehook_webhooks_total",
            &[("result", "payload_mismatch")]
        ),
        2.0
    );
}
