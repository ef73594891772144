//! The downstream call names the merchant's own order: `merchant_reference`
//! from each PSP's merchant-side field (Adyen `merchantReference`, …) and,
//! for Stripe, the object's `metadata`, in sync mode and through the inbox
//! (`events.canonical`). Neither is part of the fingerprint, and `erase`
//! takes both out of the stored event.

use std::time::Duration;

use fencehook::config::Config;
use fencehook::domain::CanonicalEvent;
use fencehook::providers::{stripe, Provider, SchemeKind};
use fencehook::store::erase::{self, Erasure};
use serde_json::{json, Value};

use crate::helpers::downstream::{Call, MockDownstream};
use crate::helpers::{now, wait_for, Reply, TestApp, TestContext, SECRET};

const STRIPE_SECRET: &str = "whsec_fencehook_stripe_integration_secret";
/// Adyen's published sample HMAC key, which signs tests/fixtures/adyen/.
const ADYEN_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
const PI: &str = "pi_3PqAbC2eZvKYlo2C1aBcDeFg";
/// A batch of two payments signed with [`ADYEN_KEY`]; the first and its
/// `merchantReference`.
const ADYEN_BATCH: &str = "adyen/authorisation_batch.json";
const ADYEN_PAYMENT: &str = "QFQTPCQ8HXSKGK82";
const ADYEN_REFERENCE: &str = "order-2001";

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `base` with Stripe and Adyen, calling `mock`.
fn config(base: Config, mock: &MockDownstream) -> Config {
    let mut cfg = base;
    cfg.downstream_url = Some(mock.url());
    cfg.providers = vec![
        Provider::generic(SECRET).unwrap(),
        Provider::new(
            "stripe",
            SchemeKind::Stripe,
            &[STRIPE_SECRET.into()],
            Some(60),
        )
        .unwrap(),
        Provider::new("adyen", SchemeKind::Adyen, &[ADYEN_KEY.into()], None).unwrap(),
    ];
    cfg
}

async fn deliver_stripe(app: &TestApp, body: &str) -> Reply {
    let sig = stripe::sign(STRIPE_SECRET, now(), body.as_bytes()).unwrap();
    app.post(
        "/webhooks/stripe",
        &[
            ("content-type", "application/json"),
            ("stripe-signature", &sig),
        ],
        body.as_bytes().to_vec(),
    )
    .await
}

async fn deliver_adyen(app: &TestApp, body: &str) -> Reply {
    app.post(
        "/webhooks/adyen",
        &[("content-type", "application/json")],
        body.as_bytes().to_vec(),
    )
    .await
}

/// The Stripe fixture's PaymentIntent with `metadata` replaced.
fn stripe_payment_with(metadata: Value) -> String {
    let mut event: Value =
        serde_json::from_str(&fixture("stripe/payment_intent.succeeded.json")).unwrap();
    event["data"]["object"]["metadata"] = metadata;
    event.to_string()
}

fn call_for(calls: &[Call], transaction_id: &str) -> Value {
    let matching: Vec<&Call> = calls
        .iter()
        .filter(|c| c.body["transaction_id"] == transaction_id)
        .collect();
    assert_eq!(matching.len(), 1, "{transaction_id}: {calls:?}");
    matching[0].body.clone()
}

async fn stored_canonical(ctx: &TestContext, transaction_id: &str) -> Value {
    ctx.db()
        .await
        .query_one(
            "SELECT canonical FROM events WHERE transaction_id = $1",
            &[&transaction_id],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_and_adyen_deliveries_carry_their_merchant_reference_downstream_in_sync_and_inbox_mode(
) {
    for inbox in [false, true] {
        let ctx = TestContext::new().await;
        let mock = MockDownstream::start().await;
        let base = if inbox {
            ctx.inbox_config(2)
        } else {
            ctx.config()
        };
        let app = ctx.spawn(config(base, &mock)).await;
        let answer = if inbox { "accepted" } else { "processed" };
        let r = deliver_stripe(&app, &fixture("stripe/payment_intent.succeeded.json")).await;
        assert_eq!(
            (r.status, r.result()),
            (200, answer),
            "inbox {inbox}: {r:?}"
        );
        let r = deliver_adyen(&app, &fixture(ADYEN_BATCH)).await;
        assert_eq!(r.status, 200, "inbox {inbox}: {r:?}");
        wait_for("three calls made", Duration::from_secs(30), || async {
            mock.calls().len() >= 3
        })
        .await;
        let calls = mock.calls();
        assert_eq!(calls.len(), 3, "inbox {inbox}: {calls:?}");
        assert_eq!(
            call_for(&calls, "V4HZ4RBFJGXXGN82")["merchant_reference"],
            "order-2002"
        );

        let stripe = call_for(&calls, PI);
        assert_eq!(stripe["metadata"], json!({"order_id": "1042"}), "{stripe}");
        assert_eq!(stripe["merchant_reference"], Value::Null, "{stripe}");
        assert!(
            stripe
                .as_object()
                .unwrap()
                .contains_key("merchant_reference"),
            "null, not absent: {stripe}"
        );
        let adyen = call_for(&calls, ADYEN_PAYMENT);
        assert_eq!(adyen["merchant_reference"], ADYEN_REFERENCE, "{adyen}");
        assert!(adyen.get("metadata").is_none(), "{adyen}");

        if inbox {
            // What the worker claimed came from events.canonical: it is
            // stored there, and reads back as the event it was.
            let stored = stored_canonical(&ctx, PI).await;
            assert_eq!(stored["metadata"], json!({"order_id": "1042"}));
            let read: CanonicalEvent = serde_json::from_value(stored).unwrap();
            assert_eq!(read.metadata, Some(json!({"order_id": "1042"})));
            let stored = stored_canonical(&ctx, ADYEN_PAYMENT).await;
            assert_eq!(stored["merchant_reference"], ADYEN_REFERENCE);
        }
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_payment_redelivered_with_other_metadata_is_a_duplicate_in_both_modes() {
    for inbox in [false, true] {
        let ctx = TestContext::new().await;
        let mock = MockDownstream::start().await;
        let base = if inbox {
            ctx.inbox_config(2)
        } else {
            ctx.config()
        };
        let app = ctx.spawn(config(base, &mock)).await;
        let r = deliver_stripe(&app, &stripe_payment_with(json!({"order_id": "1042"}))).await;
        assert_eq!(r.status, 200, "{r:?}");
        wait_for("the payment booked", Duration::from_secs(30), || async {
            ctx.entries().await == 1
        })
        .await;
        let r = deliver_stripe(
            &app,
            &stripe_payment_with(json!({"order_id": "2001", "note": "edited"})),
        )
        .await;
        assert_eq!(r.status, 200, "inbox {inbox}: {r:?}");
        if !inbox {
            assert_eq!(r.result(), "duplicate", "{r:?}");
        }
        assert_eq!(ctx.payments().await, 1, "inbox {inbox}");
        if inbox {
            assert_eq!(
                ctx.count("SELECT count(*) FROM events").await,
                1,
                "one stored event"
            );
        }
        let calls = mock.calls();
        assert_eq!(calls.len(), 1, "inbox {inbox}: {calls:?}");
        assert_eq!(calls[0].body["metadata"], json!({"order_id": "1042"}));
        assert_eq!(ctx.entries().await, 1);
        ctx.assert_audit_clean().await;
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erase_takes_the_merchant_reference_and_metadata_out_of_the_stored_event() {
    let ctx = TestContext::new().await;
    let mock = MockDownstream::start().await;
    let app = ctx.spawn(config(ctx.inbox_config(2), &mock)).await;
    let personal = json!({"order_id": "1042", "email": "ada@example.com"});
    let r = deliver_stripe(&app, &stripe_payment_with(personal.clone())).await;
    assert_eq!(r.result(), "accepted", "{r:?}");
    let r = deliver_adyen(&app, &fixture(ADYEN_BATCH)).await;
    assert_eq!(r.status, 200, "{r:?}");
    wait_for("every event done", Duration::from_secs(30), || async {
        ctx.count("SELECT count(*) FROM events WHERE status = 'done'")
            .await
            == 3
    })
    .await;
    app.stop().await;
    assert_eq!(stored_canonical(&ctx, PI).await["metadata"], personal);
    let fingerprints = "SELECT count(DISTINCT fingerprint) FROM events";
    let before = ctx.count(fingerprints).await;

    for (provider, transaction_id) in [("stripe", PI), ("adyen", ADYEN_PAYMENT)] {
        let erased = erase::erase(
            &ctx.database_url,
            &erase::Request {
                provider: provider.to_owned(),
                transaction_id: transaction_id.to_owned(),
                reason: Some("DSAR-18".to_owned()),
                host: None,
            },
        )
        .await
        .unwrap();
        assert!(matches!(erased, Erasure::Erased { .. }), "{erased:?}");
        let stored = stored_canonical(&ctx, transaction_id).await;
        let keys = stored.as_object().unwrap();
        assert!(
            !keys.contains_key("metadata") && !keys.contains_key("merchant_reference"),
            "{stored}"
        );
        // What the money needs stays, and still reads as an event.
        let read: CanonicalEvent = serde_json::from_value(stored).unwrap();
        assert_eq!(read.transaction_id, transaction_id);
        assert_eq!((read.merchant_reference, read.metadata), (None, None));
    }
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE canonical::text LIKE '%ada@example.com%'")
            .await,
        0
    );
    assert_eq!(ctx.count(fingerprints).await, before);
    assert_eq!(ctx.entries().await, 3);
    // The batch's other payment was not named: its reference stays.
    assert_eq!(
        stored_canonical(&ctx, "V4HZ4RBFJGXXGN82").await["merchant_reference"],
        "order-2002"
    );
    // Run again: nothing left, nothing written.
    let again = erase::erase(
        &ctx.database_url,
        &erase::Request {
            provider: "stripe".to_owned(),
            transaction_id: PI.to_owned(),
            reason: None,
            host: None,
        },
    )
    .await
    .unwrap();
    assert!(matches!(again, Erasure::AlreadyErased { .. }), "{again:?}");
    ctx.assert_audit_clean().await;
}
