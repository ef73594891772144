//! Square over HTTP: the fixtures of tests/fixtures/square/ signed as Square
//! signs them (base64 HMAC-SHA256 of the notification URL and the body),
//! booked exactly once.

use std::sync::Arc;

use fencehook::config::Config;
use fencehook::providers::keys::RsaSigner;
use fencehook::providers::psp::{self, Credentials, Key, Notice, PspError};
use fencehook::providers::{square, Provider, SchemeKind};
use serde_json::Value;

use crate::helpers::psp_http::{self, ledger, rows, s};
use crate::helpers::{psp_sdk, Reply, TestApp, TestContext};

/// The subscription's signature key, and the one before a rotation.
const KEY: &str = "fencehook-square-integration-key";
const OLD_KEY: &str = "fencehook-square-key-before-rotation";
const URL: &str = "https://hooks.example.com/webhooks/square";

const PAYMENT: &str = "hYy9pRFVxpDsO1FB05SunFWUe9JZY";
/// The payment the refund fixtures refund, and the refund.
const REFUNDED: &str = "KkAkhdMsgzn59SM8A89WgKwekxLZY";
const REFUND: &str = "KkAkhdMsgzn59SM8A89WgKwekxLZY_ptNBVqHYxt5gAdfcobBe4u1AZsXhoz06KTtuq9Ls24P";

fn fixture(name: &str) -> String {
    psp_http::fixture("square", name)
}

fn config(ctx: &TestContext) -> Config {
    let mut cfg = ctx.config();
    cfg.providers = Provider::from_toml_str(&format!(
        "[providers.square]\nscheme = \"square\"\nsecrets = [\"{KEY}\", \"{OLD_KEY}\"]\nnotification_url = \"{URL}\"\n"
    ))
    .unwrap();
    cfg
}

async fn post(app: &TestApp, body: &str, signature: &str) -> Reply {
    app.post(
        "/webhooks/square",
        &[
            ("content-type", "application/json"),
            ("x-square-hmacsha256-signature", signature),
        ],
        body.as_bytes().to_vec(),
    )
    .await
}

/// Delivers `body` signed as Square signs it for the registered URL.
async fn deliver(app: &TestApp, body: &str) -> Reply {
    post(app, body, &square::sign(KEY, URL, body.as_bytes())).await
}

/// The completed payment fixture about `id`, for `total` cents.
fn completed_payment(id: &str, total: i64) -> String {
    let mut event: Value =
        serde_json::from_str(&fixture("payment.updated.completed.json")).unwrap();
    let payment = &mut event["data"]["object"]["payment"];
    payment["id"] = id.into();
    for money in ["amount_money", "total_money", "approved_money"] {
        payment[money]["amount"] = total.into();
    }
    event.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_completed_square_payment_is_credited_once_and_its_copies_are_duplicates() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    // Authorised, not captured: nothing yet.
    let r = deliver(&app, &fixture("payment.created.approved.json")).await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    let body = fixture("payment.updated.completed.json");
    let r = deliver(&app, &body).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(r.body, serde_json::json!({"result": "processed"}));
    assert_eq!(
        rows(&ctx).await,
        vec![(
            s(PAYMENT),
            s("payment"),
            None,
            s("payment.succeeded"),
            100,
            s("USD"),
            s("succeeded")
        )]
    );
    assert_eq!(
        ledger(&ctx).await,
        vec![(s(PAYMENT), s("credit"), 100, s("USD"))]
    );
    let r = deliver(&app, &body).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(ctx.entries().await, 1);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn square_signatures_one_byte_changed_another_key_or_another_url_are_401() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let body = fixture("payment.updated.completed.json");
    let tampered = body.replacen("\"amount\": 100,", "\"amount\": 900,", 1);
    assert_ne!(tampered, body);
    let refused = [
        post(&app, &tampered, &square::sign(KEY, URL, body.as_bytes())).await,
        post(
            &app,
            &body,
            &square::sign("another-subscriptions-signature-key", URL, body.as_bytes()),
        )
        .await,
        // What a proxy that rewrote the host, or a trailing slash, makes of it.
        post(
            &app,
            &body,
            &square::sign(
                KEY,
                "https://internal.example.net/webhooks/square",
                body.as_bytes(),
            ),
        )
        .await,
        post(
            &app,
            &body,
            &square::sign(KEY, &format!("{URL}/"), body.as_bytes()),
        )
        .await,
        post(&app, &body, "not base64").await,
    ];
    for r in &refused {
        assert_eq!((r.status, r.result()), (401, "unauthorized"), "{r:?}");
    }
    ctx.assert_nothing_written().await;
    // The key before a rotation still verifies.
    let r = post(&app, &body, &square::sign(OLD_KEY, URL, body.as_bytes())).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_square_payment_that_failed_then_completed_is_credited_once() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let r = deliver(&app, &fixture("payment.updated.failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(rows(&ctx).await[0].6, "failed");
    assert_eq!(ctx.entries().await, 0);
    let r = deliver(&app, &fixture("payment.updated.completed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = deliver(&app, &fixture("payment.updated.failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "stale"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await,
        vec![(s(PAYMENT), s("credit"), 100, s("USD"))]
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partial_square_refund_is_a_debit_under_its_payment_and_its_failure_gives_it_back() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    // A tipped payment: USD 25.00 + 5.00 tip; credited what came in.
    let mut paid: Value = serde_json::from_str(&completed_payment(REFUNDED, 2500)).unwrap();
    paid["data"]["object"]["payment"]["tip_money"] =
        serde_json::json!({"amount": 500, "currency": "USD"});
    paid["data"]["object"]["payment"]["total_money"]["amount"] = 3000.into();
    assert_eq!(deliver(&app, &paid.to_string()).await.result(), "processed");
    let r = deliver(&app, &fixture("refund.created.pending.json")).await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    let r = deliver(&app, &fixture("refund.updated.completed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = deliver(&app, &fixture("refund.updated.completed.json")).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(
        rows(&ctx).await[1],
        (
            s(REFUND),
            s("refund"),
            Some(s(REFUNDED)),
            s("refund.succeeded"),
            1000,
            s("USD"),
            s("succeeded")
        )
    );
    assert_eq!(
        ledger(&ctx).await,
        vec![
            (s(REFUNDED), s("credit"), 3000, s("USD")),
            (s(REFUND), s("debit"), -1000, s("USD")),
        ]
    );
    let r = deliver(&app, &fixture("refund.updated.failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await[2],
        (s(REFUND), s("refund_reversal"), 1000, s("USD"))
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_well_signed_but_malformed_square_event_is_400_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let mut event: Value =
        serde_json::from_str(&fixture("payment.updated.completed.json")).unwrap();
    event["data"]["object"]["payment"]["amount_money"]["amount"] = "100".into();
    let r = deliver(&app, &event.to_string()).await;
    assert_eq!((r.status, r.result()), (400, "invalid_payload"), "{r:?}");
    assert!(r.text.contains("amount_money"), "{r:?}");
    let r = deliver(&app, "{\"type\": \"payment.updated\", \"data\": []}").await;
    assert_eq!((r.status, r.result()), (400, "invalid_payload"), "{r:?}");
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_four_copies_of_each_square_payment_over_three_instances_books_each_once() {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(Arc::new(ctx.spawn(config(&ctx)).await));
    }
    let payments = psp_http::payments("sq_storm_", 500, "USD");
    let body_of = |n: &Notice| {
        let event_id = format!("event-{}", n.transaction_id);
        square::event_of(n, &event_id, crate::helpers::now())
            .unwrap()
            .to_string()
    };
    psp_http::storm(&ctx, &apps, payments, body_of, |app, body| async move {
        deliver(&app, &body).await
    })
    .await;
}

/// What a PSP side signs with: the keys `fencehook send` would have gathered.
struct Keys(Vec<(Key, String)>);

impl Credentials for Keys {
    fn key(&self, key: &Key) -> Result<&str, PspError> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| PspError::new(key.flag, "not given"))
    }
    fn signer(&self) -> Result<&RsaSigner, PspError> {
        Err(PspError::new(
            "private-key",
            "an HMAC scheme signs with none",
        ))
    }
}

#[test]
fn what_fencehook_send_signs_for_square_verifies_with_squares_own_sdk() {
    let keys = Keys(vec![
        (psp::SECRET, KEY.to_owned()),
        (square::NOTIFICATION_URL, URL.to_owned()),
    ]);
    for kind in [
        "payment.succeeded",
        "payment.failed",
        "refund.succeeded",
        "refund.failed",
    ] {
        let refund = kind.starts_with("refund.");
        let notice = Notice {
            transaction_id: if refund {
                "sq_refund_sdk"
            } else {
                "sq_payment_sdk"
            }
            .into(),
            amount: 4200,
            currency: "USD".into(),
            event_type: kind.into(),
            payment_transaction_id: refund.then(|| "sq_payment_sdk_0".to_owned()),
        };
        // The delivery `fencehook send --provider square` builds: the
        // scheme's PSP side.
        let delivery = SchemeKind::Square
            .spec()
            .deliver(
                &keys,
                &notice,
                None,
                "event-sdk-interop",
                crate::helpers::now(),
            )
            .unwrap();
        let (_, signature) = &delivery.headers[0];
        let out = psp_sdk::run(
            "square.py",
            &["verify", signature, KEY, URL],
            delivery.body.as_bytes(),
        );
        assert!(out.status.success(), "{kind}: {out:?}");
        // Another URL (a trailing slash) is refused by the SDK too.
        let other = format!("{URL}/");
        let out = psp_sdk::run(
            "square.py",
            &["verify", signature, KEY, &other],
            delivery.body.as_bytes(),
        );
        assert_eq!(out.status.code(), Some(1), "{kind}: {out:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn what_squares_own_sdk_signs_is_accepted_by_the_service() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let body = fixture("payment.updated.completed.json");
    let out = psp_sdk::run("square.py", &["sign", KEY, URL], body.as_bytes());
    assert!(out.status.success(), "{out:?}");
    let signature = String::from_utf8(out.stdout).unwrap();
    let r = post(&app, &body, signature.trim()).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await,
        vec![(s(PAYMENT), s("credit"), 100, s("USD"))]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fencehook_send_with_a_square_provider_of_the_file_is_booked_by_the_service() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let dir = std::env::temp_dir().join(format!("fencehook-send-square-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    // The file gives the key and the notification URL.
    std::fs::write(
        &file,
        format!("[providers.square]\nscheme = \"square\"\nsecrets = [\"{KEY}\"]\nnotification_url = \"{URL}\"\n"),
    )
    .unwrap();
    let send = |extra: &[&str]| {
        let mut args: Vec<String> = [
            "--url",
            &app.base,
            "--provider",
            "square",
            "--transaction-id",
            "sq_from_send",
            "--amount",
            "4200",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        let env = vec![("FENCEHOOK_PROVIDERS".to_owned(), file.display().to_string())];
        crate::psp_paddle::fencehook_send(args, env)
    };
    // --notification-url wins over the file: another URL is refused (401).
    let (code, out) = send(&["--notification-url", "https://elsewhere.example.com/square"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("401 "), "{out}");
    let (code, out) = send(&[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("200 ") && out.contains("processed"),
        "{out}"
    );
    assert_eq!(
        ledger(&ctx).await,
        vec![(s("sq_from_send"), s("credit"), 4200, s("USD"))]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencehook_load_as_square_books_each_payment_once_over_three_instances() {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(ctx.spawn(config(&ctx)).await);
    }
    let dir = std::env::temp_dir().join(format!("fencehook-load-square-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    std::fs::write(
        &file,
        format!("[providers.square]\nscheme = \"square\"\nsecrets = [\"{KEY}\"]\nnotification_url = \"{URL}\"\n"),
    )
    .unwrap();
    let report =
        crate::psp_paddle::fencehook_load(&file, "square", &apps.iter().collect::<Vec<_>>()).await;
    assert_eq!(report["scheme"], "square");
    assert_eq!(report["transactions"], 60);
    assert_eq!(report["deliveries"], 240);
    assert_eq!(report["processed_twice"], 0, "{report}");
    assert_eq!(ctx.payments().await, 60);
    ctx.assert_audit_clean().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
