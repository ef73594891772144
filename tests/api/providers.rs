//! Real providers over HTTP: Stripe events and Adyen batches from
//! tests/fixtures/, signed as the PSPs sign them. Exactly-once is checked by
//! counting rows.

use std::sync::Arc;
use std::time::Duration;

use fencehook::config::{Config, Mode};
use fencehook::lease::{Acquire, Lease, LeaseKey};
use fencehook::metrics::Metrics;
use fencehook::providers::{adyen, standard, stripe, Provider, SchemeKind};
use serde_json::Value;

use crate::helpers::{now, wait_for, Reply, TestApp, TestContext, SECRET};

/// The endpoint secret the `stripe` provider verifies with, and the one it
/// still accepts from before a roll.
const STRIPE_SECRET: &str = "whsec_fencehook_stripe_integration_secret";
const STRIPE_OLD_SECRET: &str = "whsec_fencehook_stripe_secret_before_the_roll";
/// Adyen's published sample HMAC key (its API libraries' tests use it); the
/// fixtures under tests/fixtures/adyen/ are signed with it.
const ADYEN_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
const ADYEN_OLD_KEY: &str = "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00";
const ADYEN_UNKNOWN_KEY: &str = "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF";

const PI: &str = "pi_3PqAbC2eZvKYlo2C1aBcDeFg";
const REFUND: &str = "re_3PqAbC2eZvKYlo2C1rStUvWx";

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn config(ctx: &TestContext) -> Config {
    let mut cfg = ctx.config();
    cfg.providers = vec![
        Provider::generic(SECRET).unwrap(),
        Provider::new(
            "stripe",
            SchemeKind::Stripe,
            &[STRIPE_SECRET.into(), STRIPE_OLD_SECRET.into()],
            Some(60),
        )
        .unwrap(),
        Provider::new(
            "adyen",
            SchemeKind::Adyen,
            &[ADYEN_KEY.into(), ADYEN_OLD_KEY.into()],
            None,
        )
        .unwrap(),
        Provider::new(
            "shop",
            SchemeKind::Standard,
            &[
                "whsec_c2hvcC1uZXctc2VjcmV0LWtleQ==".into(),
                "whsec_c2hvcC1vbGQtc2VjcmV0LWtleQ==".into(),
            ],
            None,
        )
        .unwrap(),
    ];
    cfg
}

async fn post_stripe(app: &TestApp, body: &str, signature: &str) -> Reply {
    app.post(
        "/webhooks/stripe",
        &[
            ("content-type", "application/json; charset=utf-8"),
            ("stripe-signature", signature),
        ],
        body.as_bytes().to_vec(),
    )
    .await
}

/// Delivers a Stripe event signed now with the current secret.
async fn deliver_stripe(app: &TestApp, body: &str) -> Reply {
    let sig = stripe::sign(STRIPE_SECRET, now(), body.as_bytes()).unwrap();
    post_stripe(app, body, &sig).await
}

async fn post_adyen(app: &TestApp, body: &str) -> Reply {
    app.post(
        "/webhooks/adyen",
        &[("content-type", "application/json")],
        body.as_bytes().to_vec(),
    )
    .await
}

fn assert_accepted(r: &Reply) {
    assert_eq!(
        (r.status, r.text.as_str()),
        (200, "[accepted]"),
        "Adyen needs exactly [accepted]: {r:?}"
    );
    assert_eq!(r.content_type.as_deref(), Some("text/plain"));
}

async fn ledger_sum(ctx: &TestContext) -> i64 {
    ctx.count("SELECT coalesce(sum(amount_minor), 0)::bigint FROM ledger_entries")
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stripe_payment_is_credited_once_whether_announced_by_payment_intent_or_charge() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let r = deliver_stripe(&app, &fixture("stripe/payment_intent.succeeded.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(r.body, serde_json::json!({"result": "processed"}));
    let row = ctx
        .db()
        .await
        .query_one(
            "SELECT provider, transaction_id, event_type, amount_minor, currency, status FROM payments",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, String>(2),
            row.get::<_, i64>(3),
            row.get::<_, String>(4),
            row.get::<_, String>(5),
        ),
        (
            "stripe".to_owned(),
            PI.to_owned(),
            "payment.succeeded".to_owned(),
            4999,
            "EUR".to_owned(),
            "succeeded".to_owned()
        )
    );
    // Another event id about the same payment: the same transaction, a duplicate.
    let r = deliver_stripe(&app, &fixture("stripe/charge.succeeded.json")).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    // Stripe's own redelivery of the first event: a duplicate too.
    let r = deliver_stripe(&app, &fixture("stripe/payment_intent.succeeded.json")).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(ledger_sum(&ctx).await, 4999);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unhandled_stripe_event_type_is_ignored_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let r = deliver_stripe(&app, &fixture("stripe/customer.created.json")).await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    ctx.assert_nothing_written().await;
    assert_eq!(
        app.metric(
            "fencehook_webhooks_total",
            &[("provider", "stripe"), ("result", "ignored")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stripe_refund_is_debited_once_whichever_event_announces_it() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let r = deliver_stripe(&app, &fixture("stripe/payment_intent.succeeded.json")).await;
    assert_eq!(r.result(), "processed");
    let r = deliver_stripe(&app, &fixture("stripe/charge.refunded.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = deliver_stripe(&app, &fixture("stripe/refund.updated.json")).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(ctx.payments().await, 2, "the payment and its refund");
    assert_eq!(ctx.entries().await, 2, "one credit, one debit");
    assert_eq!(
        ctx.count(&format!(
            "SELECT e.amount_minor FROM ledger_entries e JOIN payments p ON p.id = e.payment_id \
             WHERE p.transaction_id = '{REFUND}' AND e.effect = 'debit'"
        ))
        .await,
        -1500
    );
    assert_eq!(ledger_sum(&ctx).await, 4999 - 1500);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stripe_signatures_are_checked_over_http_tampered_wrong_stale_and_malformed_are_401() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let body = fixture("stripe/payment_intent.succeeded.json");
    let t = now();
    let tampered = body.replace("\"amount_received\": 4999", "\"amount_received\": 9999");
    assert_ne!(tampered, body);
    let good = stripe::sign(STRIPE_SECRET, t, body.as_bytes()).unwrap();
    let cases: Vec<(&str, String, String)> = vec![
        ("tampered body", tampered, good.clone()),
        (
            "wrong secret",
            body.clone(),
            stripe::sign("whsec_not_ours", t, body.as_bytes()).unwrap(),
        ),
        (
            // Tolerance is 60 s for this provider.
            "61 s old",
            body.clone(),
            stripe::sign(STRIPE_SECRET, t - 61, body.as_bytes()).unwrap(),
        ),
        (
            "65 s in the future",
            body.clone(),
            stripe::sign(STRIPE_SECRET, t + 65, body.as_bytes()).unwrap(),
        ),
        (
            "no t",
            body.clone(),
            good.split_once(',').unwrap().1.to_owned(),
        ),
        ("no v1", body.clone(), format!("t={t},v0=abcdef")),
        ("not key=value", body.clone(), format!("{good},garbage")),
        (
            "t not a number",
            body.clone(),
            good.replacen("t=", "t=x", 1),
        ),
    ];
    for (name, body, sig) in cases {
        let r = post_stripe(&app, &body, &sig).await;
        assert_eq!((r.status, r.result()), (401, "unauthorized"), "{name}");
    }
    let r = app
        .post(
            "/webhooks/stripe",
            &[("content-type", "application/json")],
            body.clone().into_bytes(),
        )
        .await;
    assert_eq!(r.status, 401, "no Stripe-Signature header");
    ctx.assert_nothing_written().await;

    // Within the tolerance, with several signatures of which one is ours.
    let several = format!(
        "t={},v1={},v0=deadbeef,v1={}",
        t - 50,
        stripe::signature_hex("whsec_someone_else", t - 50, body.as_bytes()),
        stripe::signature_hex(STRIPE_SECRET, t - 50, body.as_bytes())
    );
    let r = post_stripe(&app, &body, &several).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    // Rotation: the secret from before the roll still verifies.
    let old = fixture("stripe/charge.succeeded.json");
    let sig = stripe::sign(STRIPE_OLD_SECRET, now(), old.as_bytes()).unwrap();
    let r = post_stripe(&app, &old, &sig).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(ctx.entries().await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn standard_rotated_secrets_and_several_signatures_verify_over_http() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let body = crate::helpers::payment("tx_shop", 700).to_string();
    let new = "whsec_c2hvcC1uZXctc2VjcmV0LWtleQ==";
    let old = "whsec_c2hvcC1vbGQtc2VjcmV0LWtleQ==";
    let r = app.post_signed("shop", body.as_bytes(), now(), old).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = app.post_signed("shop", body.as_bytes(), now(), new).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    let r = app
        .post_signed("shop", body.as_bytes(), now(), SECRET)
        .await;
    assert_eq!(r.status, 401, "another provider's secret");
    let (id, ts) = ("msg_several", now());
    let ours = standard::sign(new, id, ts, body.as_bytes()).unwrap();
    let theirs = standard::sign(SECRET, id, ts, body.as_bytes()).unwrap();
    let r = app
        .post(
            "/webhooks/shop",
            &[
                ("content-type", "application/json"),
                ("webhook-id", id),
                ("webhook-timestamp", &ts.to_string()),
                ("webhook-signature", &format!("{theirs} v1a,xyz {ours}")),
            ],
            body.into_bytes(),
        )
        .await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(ctx.entries().await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adyen_batch_books_every_item_answers_accepted_and_its_redelivery_adds_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let batch = fixture("adyen/authorisation_batch.json");
    let r = post_adyen(&app, &batch).await;
    assert_accepted(&r);
    assert_eq!(ctx.payments().await, 2);
    assert_eq!(ctx.entries().await, 2);
    assert_eq!(ledger_sum(&ctx).await, 2500 + 120_000);
    assert_eq!(
        ctx.count("SELECT amount_minor FROM payments WHERE currency = 'JPY'")
            .await,
        120_000,
        "zero-decimal currency kept as sent"
    );
    let r = post_adyen(&app, &batch).await;
    assert_accepted(&r);
    assert_eq!(ctx.payments().await, 2, "no new rows");
    assert_eq!(ctx.entries().await, 2);
    // One delivery, one count: the batch's overall result.
    for (result, n) in [("processed", 1.0), ("duplicate", 1.0)] {
        assert_eq!(
            app.metric(
                "fencehook_webhooks_total",
                &[("provider", "adyen"), ("result", result)]
            ),
            n,
            "{result}"
        );
    }
    // A refund of the first payment and a CAPTURE (ignored: with automatic
    // capture the AUTHORISATION already booked the money).
    let r = post_adyen(&app, &fixture("adyen/refund_and_capture_batch.json")).await;
    assert_accepted(&r);
    assert_eq!(ctx.payments().await, 3);
    assert_eq!(ledger_sum(&ctx).await, 2500 + 120_000 - 1000);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adyen_batch_with_one_bad_signature_is_401_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let good: Value = serde_json::from_str(&fixture("adyen/authorisation_batch.json")).unwrap();
    let mut tampered = good.clone();
    tampered["notificationItems"][1]["NotificationRequestItem"]["amount"]["value"] = 130_000.into();
    let mut unsigned = good.clone();
    unsigned["notificationItems"][0]["NotificationRequestItem"]["additionalData"]
        .as_object_mut()
        .unwrap()
        .remove("hmacSignature");
    let mut wrong_key = good.clone();
    adyen::sign_batch(ADYEN_UNKNOWN_KEY, &mut wrong_key).unwrap();
    let mut garbled = good.clone();
    garbled["notificationItems"][1]["NotificationRequestItem"]["additionalData"]["hmacSignature"] =
        "%%%".into();
    for (name, body) in [
        ("second item tampered", tampered),
        ("first item unsigned", unsigned),
        ("unknown key", wrong_key),
        ("signature not base64", garbled),
    ] {
        let r = post_adyen(&app, &body.to_string()).await;
        assert_eq!((r.status, r.result()), (401, "unauthorized"), "{name}");
    }
    ctx.assert_nothing_written().await;
    // Rotation: a batch signed with the older configured key is accepted.
    let mut old = good;
    adyen::sign_batch(ADYEN_OLD_KEY, &mut old).unwrap();
    assert_accepted(&post_adyen(&app, &old.to_string()).await);
    assert_eq!(ctx.payments().await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adyen_batch_with_an_item_in_flight_elsewhere_is_retried_until_every_item_is_durable() {
    let ctx = TestContext::new().await;
    let mut cfg = config(&ctx);
    cfg.inflight_wait = Duration::from_millis(200);
    // Another instance holds the second item's lease.
    let elsewhere = Lease::new(&cfg.lease, &cfg.db, Metrics::new(&[])).unwrap();
    let app = ctx.spawn(cfg).await;
    let key = LeaseKey {
        provider: "adyen".into(),
        transaction_id: "V4HZ4RBFJGXXGN82".into(),
    };
    let Acquire::Acquired(guard) = elsewhere.acquire(&key).await.unwrap() else {
        panic!("the lease is free")
    };
    let batch = fixture("adyen/authorisation_batch.json");
    let r = post_adyen(&app, &batch).await;
    assert_eq!((r.status, r.result()), (409, "in_progress"), "{r:?}");
    assert!(r.retry_after.is_some(), "Retry-After on a retryable batch");
    assert_eq!(ctx.payments().await, 1, "the free item was booked");
    guard.release().await;
    let r = post_adyen(&app, &batch).await;
    assert_accepted(&r);
    assert_eq!(ctx.payments().await, 2);
    assert_eq!(ctx.entries().await, 2);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adyen_item_that_contradicts_a_booked_one_makes_the_batch_422() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let good: Value = serde_json::from_str(&fixture("adyen/authorisation_batch.json")).unwrap();
    assert_accepted(&post_adyen(&app, &good.to_string()).await);
    let mut other = good;
    other["notificationItems"][0]["NotificationRequestItem"]["amount"]["value"] = 2600.into();
    adyen::sign_batch(ADYEN_KEY, &mut other).unwrap();
    let r = post_adyen(&app, &other.to_string()).await;
    assert_eq!((r.status, r.result()), (422, "payload_mismatch"), "{r:?}");
    assert_eq!(ctx.payments().await, 2);
    assert_eq!(ledger_sum(&ctx).await, 2500 + 120_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_stripe_payment_announced_by_two_event_types_to_two_instances_at_once_is_credited_once()
{
    let ctx = TestContext::new().await;
    let a = Arc::new(ctx.spawn(config(&ctx)).await);
    let b = Arc::new(ctx.spawn(config(&ctx)).await);
    let pi = fixture("stripe/payment_intent.succeeded.json");
    let charge = fixture("stripe/charge.succeeded.json");
    let mut tasks = Vec::new();
    for i in 0..12 {
        // Alternate event types across the instances, all at once.
        let (app, body) = if i % 2 == 0 {
            (a.clone(), pi.clone())
        } else {
            (b.clone(), charge.clone())
        };
        tasks.push(tokio::spawn(async move {
            let end = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let r = deliver_stripe(&app, &body).await;
                if !(r.status == 409 || r.status == 503) || tokio::time::Instant::now() >= end {
                    return r;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        results.push(r.result().to_owned());
    }
    assert_eq!(
        results.iter().filter(|r| *r == "processed").count(),
        1,
        "{results:?}"
    );
    assert_eq!(
        results.iter().filter(|r| *r == "duplicate").count(),
        11,
        "{results:?}"
    );
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(ctx.entries().await, 1, "exactly one credit");
    assert_eq!(ledger_sum(&ctx).await, 4999);
    ctx.assert_audit_clean().await;
}

/// An Adyen fixture batch, re-signed with [`ADYEN_KEY`] (the lifecycle
/// fixtures carry placeholder signatures; see tests/fixtures/README.md).
fn adyen_fixture(name: &str) -> String {
    let mut batch: Value = serde_json::from_str(&fixture(&format!("adyen/{name}"))).unwrap();
    adyen::sign_batch(ADYEN_KEY, &mut batch).unwrap();
    batch.to_string()
}

/// The `NotificationRequestItem` of item `i` of an Adyen fixture batch.
fn adyen_item(name: &str, i: usize) -> Value {
    let batch: Value = serde_json::from_str(&fixture(&format!("adyen/{name}"))).unwrap();
    batch["notificationItems"][i]["NotificationRequestItem"].clone()
}

/// A batch of these items, signed with [`ADYEN_KEY`].
fn adyen_batch(items: Vec<Value>) -> String {
    let mut batch = serde_json::json!({
        "live": "false",
        "notificationItems": items.into_iter()
            .map(|i| serde_json::json!({"NotificationRequestItem": i}))
            .collect::<Vec<_>>()
    });
    adyen::sign_batch(ADYEN_KEY, &mut batch).unwrap();
    batch.to_string()
}

async fn entries_of(ctx: &TestContext, effect: &str) -> i64 {
    ctx.count(&format!(
        "SELECT count(*) FROM ledger_entries WHERE effect = '{effect}'"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adyen_batch_with_one_unmappable_item_books_the_others_and_quarantines_it_once() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    // A lower-case currency: well signed, but not something the ledger can book.
    let mut bad = adyen_item("scenario-2-REFUND.json", 0);
    bad["amount"]["currency"] = "eur".into();
    let batch = adyen_batch(vec![
        adyen_item("scenario-1-AUTHORISATION.json", 0),
        bad,
        adyen_item("authorisation_batch.json", 1),
    ]);
    let r = post_adyen(&app, &batch).await;
    assert_accepted(&r);
    assert_eq!(
        ctx.payments().await,
        2,
        "both authorisations, not the bad item"
    );
    assert_eq!(entries_of(&ctx, "credit").await, 2);
    assert_eq!(ctx.entries().await, 2);
    assert_eq!(ledger_sum(&ctx).await, 10_000 + 120_000);
    let row = ctx
        .db()
        .await
        .query_one(
            "SELECT provider, transaction_id, reason, item, times_seen FROM quarantined_items",
            &[],
        )
        .await
        .unwrap();
    let (provider, transaction_id, reason, item, times_seen): (
        String,
        Option<String>,
        String,
        String,
        i64,
    ) = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    assert_eq!(provider, "adyen");
    assert_eq!(transaction_id.as_deref(), Some("8826222222222222"));
    assert!(
        reason.starts_with("unmappable:") && reason.contains("amount.currency"),
        "{reason}"
    );
    let item: Value = serde_json::from_str(&item).unwrap();
    assert_eq!(item["amount"]["currency"], "eur", "the item as received");
    assert_eq!(times_seen, 1);
    assert_eq!(
        app.metric(
            "fencehook_items_quarantined_total",
            &[("reason", "unmappable")]
        ),
        1.0
    );
    // Adyen re-sends the same batch: nothing new is booked or recorded.
    let r = post_adyen(&app, &batch).await;
    assert_accepted(&r);
    assert_eq!(ctx.payments().await, 2);
    assert_eq!(ctx.entries().await, 2);
    assert_eq!(ctx.count("SELECT count(*) FROM quarantined_items").await, 1);
    assert_eq!(
        ctx.count("SELECT times_seen FROM quarantined_items").await,
        2
    );
    assert_eq!(
        app.metric(
            "fencehook_items_quarantined_total",
            &[("reason", "unmappable")]
        ),
        1.0,
        "a re-sent item is counted once"
    );
    ctx.assert_audit_clean().await;
}

/// The PaymentIntent of the failed-then-succeeded fixtures.
const RETRIED_PI: &str = "pi_3SfZt1B7WZ01zgkW1kQ4Dm9x";

#[tokio::test(flavor = "multi_thread")]
async fn a_stripe_payment_intent_that_fails_then_succeeds_is_credited_once() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let r = deliver_stripe(&app, &fixture("stripe/payment_intent.payment_failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(ctx.payment(RETRIED_PI).await.unwrap().0, "failed");
    assert_eq!(ctx.entries().await, 0, "a failure books nothing");
    let r = deliver_stripe(
        &app,
        &fixture("stripe/payment_intent.succeeded.after-failure.json"),
    )
    .await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(ctx.payment(RETRIED_PI).await.unwrap().0, "succeeded");
    // Stripe re-sends the failure: the success stands.
    let r = deliver_stripe(&app, &fixture("stripe/payment_intent.payment_failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "stale"), "{r:?}");
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(entries_of(&ctx, "credit").await, 1);
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(ledger_sum(&ctx).await, 5000);
    ctx.assert_audit_clean().await;
}

/// A PaymentIntent declined at its full amount, then captured in part by
/// hand: its success names `amount_received` below `amount`. Out of
/// `failed` the success's amount stands, so the credit is what was received.
#[tokio::test(flavor = "multi_thread")]
async fn a_stripe_payment_intent_that_failed_then_was_captured_in_part_is_credited_what_was_received(
) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let r = deliver_stripe(&app, &fixture("stripe/payment_intent.payment_failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let mut captured: Value = serde_json::from_str(&fixture(
        "stripe/payment_intent.succeeded.after-failure.json",
    ))
    .unwrap();
    let pi = &mut captured["data"]["object"];
    assert_eq!(pi["amount"], 5000, "the fixture's intended amount");
    pi["amount_received"] = 3000.into();
    pi["capture_method"] = "manual".into();
    let r = deliver_stripe(&app, &captured.to_string()).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(ctx.payment(RETRIED_PI).await.unwrap().0, "succeeded");
    assert_eq!(entries_of(&ctx, "credit").await, 1);
    assert_eq!(ledger_sum(&ctx).await, 3000, "credited what was received");
    // The same capture again is a copy; another amount now is not.
    let r = deliver_stripe(&app, &captured.to_string()).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    captured["data"]["object"]["amount_received"] = 3500.into();
    captured["id"] = "evt_partial_capture_other_amount".into();
    let r = deliver_stripe(&app, &captured.to_string()).await;
    assert_eq!((r.status, r.result()), (422, "payload_mismatch"), "{r:?}");
    assert_eq!(ledger_sum(&ctx).await, 3000);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stripe_payment_failure_that_arrives_after_the_success_is_stale() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let r = deliver_stripe(
        &app,
        &fixture("stripe/payment_intent.succeeded.after-failure.json"),
    )
    .await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = deliver_stripe(&app, &fixture("stripe/payment_intent.payment_failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "stale"), "{r:?}");
    assert_eq!(ctx.payment(RETRIED_PI).await.unwrap().0, "succeeded");
    assert_eq!(entries_of(&ctx, "credit").await, 1);
    assert_eq!(ctx.entries().await, 1);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stripe_charge_refunded_with_two_succeeded_refunds_debits_each_once() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    // The payment the refunded charge belongs to (the charge.refunded fixture
    // is a USD 100.00 charge of this PaymentIntent); built from our
    // payment_intent.succeeded fixture with its id, amount and currency.
    let mut payment: Value =
        serde_json::from_str(&fixture("stripe/payment_intent.succeeded.json")).unwrap();
    let pi = &mut payment["data"]["object"];
    pi["id"] = "pi_3QfhkRB7WZ01zgkW0Yq2bC7d".into();
    pi["amount"] = 10_000.into();
    pi["amount_received"] = 10_000.into();
    pi["currency"] = "usd".into();
    pi["latest_charge"] = "ch_3QfhkRB7WZ01zgkW0aS1cD8e".into();
    let r = deliver_stripe(&app, &payment.to_string()).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let refunded = fixture("stripe/charge.refunded.expanded-refunds.json");
    let r = deliver_stripe(&app, &refunded).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(entries_of(&ctx, "debit").await, 2, "one debit per refund");
    assert_eq!(ledger_sum(&ctx).await, 10_000 - 3000 - 2000);
    // The same refunds again, by a re-send and by refund.created: nothing new.
    let r = deliver_stripe(&app, &refunded).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    let r = deliver_stripe(&app, &fixture("stripe/refund.created.succeeded.json")).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(ctx.payments().await, 3, "the payment and its two refunds");
    assert_eq!(ctx.entries().await, 3);
    assert_eq!(
        ctx.count(
            "SELECT amount_out_minor FROM payments WHERE transaction_id = 'pi_3QfhkRB7WZ01zgkW0Yq2bC7d'"
        )
        .await,
        5000
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adyen_refund_that_fails_after_it_was_booked_gives_the_money_back_once() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    for name in [
        "scenario-1-AUTHORISATION.json",
        "scenario-2-REFUND.json",
        "scenario-3-REFUND_FAILED.json",
    ] {
        assert_accepted(&post_adyen(&app, &adyen_fixture(name)).await);
    }
    assert_eq!(entries_of(&ctx, "credit").await, 1);
    assert_eq!(entries_of(&ctx, "debit").await, 1);
    assert_eq!(entries_of(&ctx, "refund_reversal").await, 1);
    assert_eq!(
        ctx.count(
            "SELECT coalesce(sum(e.amount_minor), 0)::bigint FROM ledger_entries e \
             JOIN payments p ON p.id = e.payment_id WHERE p.transaction_id = '8826222222222222'"
        )
        .await,
        0,
        "net zero for the refund"
    );
    assert_eq!(ledger_sum(&ctx).await, 10_000);
    assert_eq!(ctx.payment("8826222222222222").await.unwrap().0, "failed");
    // Adyen re-sends both: the failure is a duplicate, the success stale.
    for name in ["scenario-3-REFUND_FAILED.json", "scenario-2-REFUND.json"] {
        assert_accepted(&post_adyen(&app, &adyen_fixture(name)).await);
    }
    assert_eq!(ctx.entries().await, 3);
    assert_eq!(ledger_sum(&ctx).await, 10_000);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adyen_chargeback_and_its_reversal_book_a_dispute_and_give_it_back() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    assert_accepted(&post_adyen(&app, &adyen_fixture("scenario-1-AUTHORISATION.json")).await);
    // The reversal before its chargeback waits for it (Adyen retries the batch).
    let reversed = adyen_fixture("scenario-5-CHARGEBACK_REVERSED.json");
    let r = post_adyen(&app, &reversed).await;
    assert_eq!((r.status, r.result()), (409, "awaiting_payment"), "{r:?}");
    assert_accepted(&post_adyen(&app, &adyen_fixture("scenario-4-CHARGEBACK.json")).await);
    assert_eq!(ledger_sum(&ctx).await, 10_000 - 7000);
    assert_accepted(&post_adyen(&app, &reversed).await);
    assert_eq!(entries_of(&ctx, "dispute").await, 1);
    assert_eq!(entries_of(&ctx, "dispute_reversal").await, 1);
    assert_eq!(ledger_sum(&ctx).await, 10_000);
    assert_eq!(ctx.payment("8836333333333333").await.unwrap().0, "failed");
    assert_accepted(&post_adyen(&app, &reversed).await);
    assert_eq!(ctx.entries().await, 3);
    ctx.assert_audit_clean().await;
}

// ---- Adyen: only the signed fields decide -----------------------------------

/// A well-signed Adyen item: `code` about `psp` (and `original`), `value` EUR.
fn adyen_signed_item(
    code: &str,
    psp: &str,
    original: Option<&str>,
    value: i64,
    success: bool,
) -> Value {
    let mut item = serde_json::json!({
        "amount": {"currency": "EUR", "value": value},
        "eventCode": code,
        "eventDate": "2026-01-01T01:00:00+01:00",
        "merchantAccountCode": "FencehookTest",
        "merchantReference": format!("order-{psp}"),
        "pspReference": psp,
        "success": if success { "true" } else { "false" },
    });
    if let Some(original) = original {
        item["originalReference"] = original.into();
    }
    item
}

/// `item` with `additionalData.modification.action` set: not signed.
fn with_action(mut item: Value, action: &str) -> Value {
    item["additionalData"] = serde_json::json!({"modification.action": action});
    item
}

async fn ledger(ctx: &TestContext) -> Vec<(String, String, i64)> {
    ctx.db()
        .await
        .query(
            "SELECT p.transaction_id, l.effect, l.amount_minor FROM ledger_entries l
               JOIN payments p ON p.id = l.payment_id ORDER BY l.id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adyen_cancel_or_refund_is_decided_by_the_ledger_so_an_altered_action_moves_no_money() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    // A payment booked here (AUTHORISATION, booked as captured), then Adyen's
    // genuine CANCEL_OR_REFUND of it saying `cancel`: against a captured
    // payment it can only have been a refund, of the signed amount.
    let auth = adyen_signed_item("AUTHORISATION", "PAY-BOOKED", None, 5000, true);
    assert_accepted(&post_adyen(&app, &adyen_batch(vec![auth])).await);
    let cor = adyen_signed_item("CANCEL_OR_REFUND", "MOD-1", Some("PAY-BOOKED"), 5000, true);
    let genuine = with_action(cor.clone(), "cancel");
    assert_accepted(&post_adyen(&app, &adyen_batch(vec![genuine])).await);
    let booked = ledger(&ctx).await;
    assert_eq!(
        booked,
        vec![
            ("PAY-BOOKED".to_owned(), "credit".to_owned(), 5000),
            ("MOD-1".to_owned(), "debit".to_owned(), -5000),
        ]
    );
    // The same item with its unsigned action changed (same signature):
    // nothing more moves, whatever it says.
    for action in ["refund", "cancel", "void"] {
        let altered = with_action(cor.clone(), action);
        assert_accepted(&post_adyen(&app, &adyen_batch(vec![altered])).await);
        assert_eq!(ledger(&ctx).await, booked, "action {action}");
    }
    // Against a payment recorded failed there was nothing to capture: a
    // cancel, which moves nothing, even when the altered item says `refund`.
    let refused = adyen_signed_item("AUTHORISATION", "PAY-REFUSED", None, 5000, false);
    assert_accepted(&post_adyen(&app, &adyen_batch(vec![refused])).await);
    let altered = with_action(
        adyen_signed_item("CANCEL_OR_REFUND", "MOD-2", Some("PAY-REFUSED"), 5000, true),
        "refund",
    );
    assert_accepted(&post_adyen(&app, &adyen_batch(vec![altered])).await);
    assert_eq!(ctx.payment("MOD-2").await, None, "nothing recorded");
    assert_eq!(ctx.count("SELECT count(*) FROM quarantined_items").await, 0);
    assert_eq!(
        app.metric(
            "fencehook_refund_rejected_total",
            &[("reason", "payment_failed")]
        ),
        0.0
    );
    // A payment not known yet: it waits as a refund waits, then books.
    let early = adyen_batch(vec![adyen_signed_item(
        "CANCEL_OR_REFUND",
        "MOD-3",
        Some("PAY-LATER"),
        700,
        true,
    )]);
    let r = post_adyen(&app, &early).await;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(ctx.payment("MOD-3").await, None);
    let later = adyen_signed_item("AUTHORISATION", "PAY-LATER", None, 700, true);
    assert_accepted(&post_adyen(&app, &adyen_batch(vec![later])).await);
    assert_accepted(&post_adyen(&app, &early).await);
    assert_eq!(ledger_sum(&ctx).await, 0, "each payment in and out once");
    assert_eq!(ctx.entries().await, 4);
    ctx.assert_audit_clean().await;
}

/// Inbox mode decides a CANCEL_OR_REFUND when a worker books it, as sync
/// mode does when it is delivered: one accepted while its payment was not
/// known yet, whose AUTHORISATION was then refused, was a cancel (done,
/// nothing booked), not a refund left waiting for its payment to succeed
/// until it is dead.
#[tokio::test(flavor = "multi_thread")]
async fn in_inbox_mode_a_cancel_or_refund_accepted_before_its_payment_failed_is_a_cancel_not_a_dead_refund(
) {
    let ctx = TestContext::new().await;
    let mut inbox = config(&ctx);
    inbox.inbox.mode = Mode::Inbox;
    inbox.inbox.workers = 0;
    // Short: a refund still waiting for a failed payment past it is dead.
    inbox.inbox.max_age = Duration::from_secs(2);
    let accepting = ctx.spawn(inbox.clone()).await;
    let cor = adyen_signed_item(
        "CANCEL_OR_REFUND",
        "MOD-INBOX",
        Some("PAY-INBOX"),
        5000,
        true,
    );
    assert_accepted(&post_adyen(&accepting, &adyen_batch(vec![cor])).await);
    // Its payment's refused AUTHORISATION, booked before any worker runs.
    let sync = ctx.spawn(config(&ctx)).await;
    let refused = adyen_signed_item("AUTHORISATION", "PAY-INBOX", None, 5000, false);
    assert_accepted(&post_adyen(&sync, &adyen_batch(vec![refused])).await);
    assert_eq!(ctx.payment("PAY-INBOX").await.unwrap().0, "failed");
    inbox.inbox.workers = 2;
    let _working = ctx.spawn(inbox).await;
    let status = || async {
        ctx.db()
            .await
            .query_one(
                "SELECT status FROM events WHERE transaction_id = 'MOD-INBOX'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, String>(0)
    };
    wait_for(
        "the CANCEL_OR_REFUND settled, done or dead",
        Duration::from_secs(30),
        || async { matches!(status().await.as_str(), "done" | "dead") },
    )
    .await;
    assert_eq!(
        status().await,
        "done",
        "a cancel, not a refund waiting for a payment that failed"
    );
    assert_eq!(ctx.entries().await, 0, "nothing booked");
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE status = 'dead'")
            .await,
        0
    );
    ctx.assert_audit_clean().await;
}

/// The same when both wait in the inbox together, the refused AUTHORISATION
/// and the CANCEL_OR_REFUND, and the workers take them side by side: the
/// CANCEL_OR_REFUND waits as a refund while the failure is not booked, then
/// is a cancel. Its refused payment and nothing else is booked.
#[tokio::test(flavor = "multi_thread")]
async fn in_inbox_mode_a_cancel_or_refund_queued_with_its_refused_authorisation_is_a_cancel() {
    let ctx = TestContext::new().await;
    let mut inbox = config(&ctx);
    inbox.inbox.mode = Mode::Inbox;
    inbox.inbox.workers = 0;
    let accepting = ctx.spawn(inbox.clone()).await;
    let refused = adyen_signed_item("AUTHORISATION", "PAY-QUEUED", None, 800, false);
    let cor = adyen_signed_item(
        "CANCEL_OR_REFUND",
        "MOD-QUEUED",
        Some("PAY-QUEUED"),
        800,
        true,
    );
    assert_accepted(&post_adyen(&accepting, &adyen_batch(vec![refused, cor])).await);
    inbox.inbox.workers = 2;
    let _working = ctx.spawn(inbox).await;
    wait_for("both events done", Duration::from_secs(30), || async {
        ctx.count("SELECT count(*) FROM events WHERE status = 'done'")
            .await
            == 2
    })
    .await;
    assert_eq!(ctx.payment("PAY-QUEUED").await.unwrap().0, "failed");
    assert_eq!(ctx.entries().await, 0, "nothing booked");
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_captured_adyen_item_resent_with_altered_unsigned_fields_is_one_quarantined_row() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    // Unmappable for a signed reason (a lower-case currency) ...
    let mut unmappable = adyen_signed_item("AUTHORISATION", "PAY-LOWER", None, 100, true);
    unmappable["amount"]["currency"] = "eur".into();
    // ... and a refund its payment cannot give (the payment failed).
    let refused = adyen_signed_item("AUTHORISATION", "PAY-FAILED", None, 900, false);
    assert_accepted(&post_adyen(&app, &adyen_batch(vec![refused])).await);
    let refund = adyen_signed_item("REFUND", "REF-OF-FAILED", Some("PAY-FAILED"), 900, true);
    const COPIES: usize = 60;
    for i in 0..COPIES {
        let mut items = vec![unmappable.clone(), refund.clone()];
        for item in &mut items {
            item["eventDate"] = format!("2026-01-01T00:{:02}:{:02}Z", i / 60, i % 60).into();
            item["reason"] = format!("copy {i}").into();
        }
        assert_accepted(&post_adyen(&app, &adyen_batch(items)).await);
    }
    let rows = ctx
        .db()
        .await
        .query(
            "SELECT transaction_id, times_seen FROM quarantined_items ORDER BY transaction_id",
            &[],
        )
        .await
        .unwrap();
    let rows: Vec<(Option<String>, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        rows,
        vec![
            (Some("PAY-LOWER".to_owned()), COPIES as i64),
            (Some("REF-OF-FAILED".to_owned()), COPIES as i64),
        ],
        "one row per signed item, however its unsigned fields vary"
    );
    for reason in ["unmappable", "refund_rejected"] {
        assert_eq!(
            app.metric("fencehook_items_quarantined_total", &[("reason", reason)]),
            1.0,
            "{reason}: counted (and alerted) once"
        );
    }
    assert_eq!(ctx.entries().await, 0);
    ctx.assert_audit_clean().await;
}

/// `ledger_entries` of one object: (effect, amount), in order.
async fn entries_of_object(ctx: &TestContext, tx: &str) -> Vec<(String, i64)> {
    ctx.db()
        .await
        .query(
            "SELECT l.effect, l.amount_minor FROM ledger_entries l
               JOIN payments p ON p.id = l.payment_id
              WHERE p.transaction_id = $1 ORDER BY l.id",
            &[&tx],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The Refund of what is left after a refund of the remainder: `re_` id,
/// `amount`, of `payment_intent`, as `refund.updated` to `succeeded` in
/// API version `version`.
fn stripe_refund_of(version: &str, id: &str, pi: &str, amount: i64) -> String {
    serde_json::json!({
        "id": format!("evt_{id}"), "object": "event", "api_version": version,
        "created": 1_744_000_000, "type": "refund.updated",
        "data": {"object": {
            "id": id, "object": "refund", "amount": amount, "currency": "eur",
            "balance_transaction": format!("txn_{id}"), "charge": format!("ch_{}", &pi[3..]),
            "payment_intent": pi, "reason": "requested_by_customer", "status": "succeeded"
        }}
    })
    .to_string()
}

/// A manual capture of 60.00 out of an authorisation of 100.00, on both
/// sides of API version 2025-03-31.basil: before it, Stripe books the whole
/// authorisation and a Refund of the 40.00 left (fixtures
/// `capture-partial.pre-basil.*`), after it only the capture
/// (`capture-partial.basil.*`). Either way the payment nets to 60.00, and
/// the customer can still be refunded those 60.00, not a cent more.
#[tokio::test(flavor = "multi_thread")]
async fn a_stripe_partial_capture_nets_to_what_was_captured_before_and_after_basil() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let pre = "pi_3RcAp1B7WZ01zgkW0pArT1aL";
    for name in [
        "stripe/capture-partial.pre-basil.payment_intent.succeeded.json",
        "stripe/capture-partial.pre-basil.refund.created.json",
        "stripe/capture-partial.basil.payment_intent.succeeded.json",
    ] {
        let r = deliver_stripe(&app, &fixture(name)).await;
        assert_eq!((r.status, r.result()), (200, "processed"), "{name}: {r:?}");
    }
    assert_eq!(
        entries_of_object(&ctx, pre).await,
        [("credit".to_owned(), 10000)],
        "before basil: the authorisation"
    );
    assert_eq!(
        entries_of_object(&ctx, "re_3RcAp1B7WZ01zgkW0rEmNdR1").await,
        [("debit".to_owned(), -4000)],
        "and the Refund of what was not captured"
    );
    let basil = "pi_3RcAp2B7WZ01zgkW0pArT2bS";
    assert_eq!(
        entries_of_object(&ctx, basil).await,
        [("credit".to_owned(), 6000)],
        "from basil: what was captured"
    );
    assert_eq!(ledger_sum(&ctx).await, 12000, "60.00 + 60.00");
    for (version, pi) in [("2024-06-20", pre), ("2025-03-31.basil", basil)] {
        let too_much = stripe_refund_of(version, &format!("re_much_{}", &pi[3..]), pi, 6001);
        let r = deliver_stripe(&app, &too_much).await;
        assert_eq!(
            (r.status, r.result()),
            (422, "refund_rejected"),
            "{version}: {r:?}"
        );
        let all = stripe_refund_of(version, &format!("re_all_{}", &pi[3..]), pi, 6000);
        let r = deliver_stripe(&app, &all).await;
        assert_eq!(
            (r.status, r.result()),
            (200, "processed"),
            "{version}: {r:?}"
        );
    }
    assert_eq!(ledger_sum(&ctx).await, 0);
    ctx.assert_audit_clean().await;
}

/// A cancelled (expired) authorisation before basil: Stripe made a Refund of
/// all of it, with no balance transaction (fixtures `cancel.pre-basil.*`),
/// for a payment never credited. Nothing moved: the Refund is `ignored`,
/// never `awaiting_payment` until the PSP gives up. From basil on there is no
/// Refund, and `payment_intent.canceled` moves nothing either.
#[tokio::test(flavor = "multi_thread")]
async fn a_stripe_cancelled_authorisation_books_nothing_before_and_after_basil() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    for name in [
        "stripe/cancel.pre-basil.refund.updated.json",
        "stripe/cancel.pre-basil.charge.refunded.json",
        "stripe/cancel.basil.payment_intent.canceled.json",
    ] {
        let r = deliver_stripe(&app, &fixture(name)).await;
        assert_eq!((r.status, r.result()), (200, "ignored"), "{name}: {r:?}");
    }
    ctx.assert_nothing_written().await;
}
