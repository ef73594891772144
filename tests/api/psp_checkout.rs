//! Checkout.com over HTTP: the events of tests/fixtures/checkout/, signed
//! as Checkout.com signs them (`Cko-Signature`), booked as the scheme's
//! table says; a storm of copies books each payment once.

use std::sync::Arc;

use fencehook::config::Config;
use fencehook::providers::psp::Notice;
use fencehook::providers::{checkout, Provider, SchemeKind};

use crate::deploy::fencehook_command;
use crate::helpers::psp_http::{self, s};
use crate::helpers::{Reply, TestApp, TestContext};

/// The signature key the `checkout` provider verifies with, and the one it
/// still accepts from before a rotation.
const KEY: &str = "fencehook-checkout-integration-key";
const OLD_KEY: &str = "fencehook-checkout-key-before-rotation";

const PAY: &str = "pay_vti5layihapu5bhbn5tjtk6eem";

fn fixture(name: &str) -> String {
    psp_http::fixture("checkout", name)
}

fn config(ctx: &TestContext) -> Config {
    let mut cfg = ctx.config();
    cfg.providers = vec![Provider::new(
        "checkout",
        SchemeKind::Checkout,
        &[KEY.into(), OLD_KEY.into()],
        None,
    )
    .unwrap()];
    cfg
}

async fn post(app: &TestApp, body: &str, signature: &str) -> Reply {
    app.post(
        "/webhooks/checkout",
        &[
            ("content-type", "application/json"),
            ("cko-signature", signature),
        ],
        body.as_bytes().to_vec(),
    )
    .await
}

/// Delivers `body` signed with the current key.
async fn deliver(app: &TestApp, body: &str) -> Reply {
    post(app, body, &checkout::sign(KEY, body.as_bytes())).await
}

#[tokio::test(flavor = "multi_thread")]
async fn each_checkout_event_books_what_it_says_a_declined_capture_then_the_capture_is_credited_and_a_partial_refund_is_a_debit_under_it(
) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    // The capture declined first: a failed payment, nothing in the ledger.
    let r = deliver(&app, &fixture("payment_capture_declined.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        psp_http::row(&ctx, "checkout", PAY).await,
        (s("failed"), s("payment.failed"), 10000, s("EUR"), None)
    );
    assert!(psp_http::entries(&ctx, "checkout", PAY).await.is_empty());
    // Then captured: the success is booked, one credit.
    let captured = fixture("payment_captured.json");
    let r = deliver(&app, &captured).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(r.body, serde_json::json!({"result": "processed"}));
    assert_eq!(
        psp_http::row(&ctx, "checkout", PAY).await,
        (
            s("succeeded"),
            s("payment.succeeded"),
            10000,
            s("EUR"),
            None
        )
    );
    assert_eq!(
        psp_http::entries(&ctx, "checkout", PAY).await,
        vec![(s("credit"), 10000, s("EUR"))]
    );
    // Checkout.com's retry of the same event: a duplicate.
    let r = deliver(&app, &captured).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    // A partial refund: its own row under the payment, a debit of its amount.
    let refunded = fixture("payment_refunded.json");
    let r = deliver(&app, &refunded).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let refund = "act_7fmebms4rtmuja2poigylogjk4";
    assert_eq!(
        psp_http::row(&ctx, "checkout", refund).await,
        (
            s("succeeded"),
            s("refund.succeeded"),
            2500,
            s("EUR"),
            Some(s(PAY))
        )
    );
    assert_eq!(
        psp_http::entries(&ctx, "checkout", refund).await,
        vec![(s("debit"), -2500, s("EUR"))]
    );
    let r = deliver(&app, &refunded).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    // A declined refund: recorded failed under the payment, nothing moves.
    let r = deliver(&app, &fixture("payment_refund_declined.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let declined_refund = "act_ewvmcqu4uq4e3nhjkitdvymkge";
    assert_eq!(
        psp_http::row(&ctx, "checkout", declined_refund).await,
        (
            s("failed"),
            s("refund.failed"),
            1000,
            s("EUR"),
            Some(s(PAY))
        )
    );
    assert!(psp_http::entries(&ctx, "checkout", declined_refund)
        .await
        .is_empty());
    // A declined payment of its own.
    let r = deliver(&app, &fixture("payment_declined.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        psp_http::row(&ctx, "checkout", "pay_mlbkttmkrlrubmdfzqw7kbrbvq").await,
        (s("failed"), s("payment.failed"), 4599, s("GBP"), None)
    );
    // An authorisation moves no money: ignored, nothing written.
    let before = ctx.payments().await;
    let r = deliver(&app, &fixture("payment_approved.json")).await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    assert_eq!(ctx.payments().await, before);
    assert_eq!(ctx.payments().await, 4);
    assert_eq!(ctx.entries().await, 2);
    assert_eq!(
        ctx.count("SELECT sum(amount_minor)::bigint FROM ledger_entries")
            .await,
        10000 - 2500
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn checkout_signatures_are_checked_over_http_one_byte_changed_another_key_and_none_are_401_and_the_old_key_still_verifies(
) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let body = fixture("payment_captured.json");
    let good = checkout::sign(KEY, body.as_bytes());
    let changed = body.replacen("\"amount\": 10000", "\"amount\": 10001", 1);
    assert_eq!(changed.len(), body.len(), "one byte changed");
    assert_ne!(changed, body);
    for (what, body, sig) in [
        ("one byte changed", changed.as_str(), good.clone()),
        (
            "another key",
            body.as_str(),
            checkout::sign("someone-else-s-signature-key", body.as_bytes()),
        ),
        ("not hex", body.as_str(), "not-a-signature".to_owned()),
    ] {
        let r = post(&app, body, &sig).await;
        assert_eq!((r.status, r.result()), (401, "unauthorized"), "{what}");
    }
    let r = app
        .post(
            "/webhooks/checkout",
            &[("content-type", "application/json")],
            body.clone().into_bytes(),
        )
        .await;
    assert_eq!(r.status, 401, "no Cko-Signature");
    ctx.assert_nothing_written().await;
    // Rotation: the key from before still verifies.
    let r = post(&app, &body, &checkout::sign(OLD_KEY, body.as_bytes())).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_well_signed_but_malformed_checkout_event_is_400_invalid_payload_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    for body in [
        fixture("payment_captured.json").replacen("\"amount\": 10000", "\"amount\": \"100\"", 1),
        fixture("payment_captured.json").replacen(
            "\"currency\": \"EUR\"",
            "\"currency\": \"eur\"",
            1,
        ),
        fixture("payment_refunded.json").replacen("\"action_id\"", "\"actionid\"", 1),
        "not json".to_owned(),
    ] {
        let r = deliver(&app, &body).await;
        assert_eq!((r.status, r.result()), (400, "invalid_payload"), "{body}");
    }
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_k4_storm_of_checkout_captures_over_two_instances_books_each_payment_once() {
    let ctx = TestContext::new().await;
    let apps = [
        Arc::new(ctx.spawn(config(&ctx)).await),
        Arc::new(ctx.spawn(config(&ctx)).await),
    ];
    let payments = psp_http::payments("pay_storm", 1000, "EUR");
    // One event each, delivered four times at once (Checkout.com's retries).
    let body_of = |n: &Notice| {
        let event_id = format!("evt_{}", n.transaction_id);
        checkout::event_of(n, &event_id, crate::helpers::now())
            .unwrap()
            .to_string()
    };
    psp_http::storm(&ctx, &apps, payments, body_of, |app, body| async move {
        deliver(&app, &body).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn what_fencehook_send_provider_checkout_signs_is_accepted_and_booked() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let base = app.base.clone();
    let run = move |args: Vec<&'static str>| {
        let base = base.clone();
        tokio::task::spawn_blocking(move || {
            fencehook_command()
                .arg("send")
                .args([
                    "--url",
                    &base,
                    "--provider",
                    "checkout",
                    "--scheme",
                    "checkout",
                ])
                .args(["--secret", KEY])
                .args(args)
                .output()
                .unwrap()
        })
    };
    let out = run(vec![
        "--transaction-id",
        "pay_sent_by_cli",
        "--amount",
        "4200",
    ])
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("200 ") && stdout.contains("processed"),
        "{stdout}"
    );
    let out = run(vec![
        "--transaction-id",
        "act_sent_by_cli",
        "--amount",
        "1200",
        "--event-type",
        "refund.succeeded",
        "--payment-transaction-id",
        "pay_sent_by_cli",
    ])
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("200 ") && stdout.contains("processed"),
        "{stdout}"
    );
    assert_eq!(
        psp_http::row(&ctx, "checkout", "pay_sent_by_cli").await,
        (s("succeeded"), s("payment.succeeded"), 4200, s("EUR"), None)
    );
    assert_eq!(
        psp_http::row(&ctx, "checkout", "act_sent_by_cli").await,
        (
            s("succeeded"),
            s("refund.succeeded"),
            1200,
            s("EUR"),
            Some(s("pay_sent_by_cli"))
        )
    );
    ctx.assert_audit_clean().await;
}
