//! Razorpay over HTTP: the events of tests/fixtures/razorpay/, signed as
//! Razorpay signs them (`X-Razorpay-Signature`), booked as the scheme's
//! table says; a storm of copies books each payment once; and Razorpay's
//! own Python SDK (tests/psp-sdks/razorpay.py) both ways.

use std::sync::Arc;
use std::time::Duration;

use fencehook::config::Config;
use fencehook::providers::psp::Notice;
use fencehook::providers::{razorpay, Provider, SchemeKind};

use crate::deploy::fencehook_command;
use crate::helpers::psp_http::{self, s};
use crate::helpers::{psp_sdk, Reply, TestApp, TestContext};

/// The webhook secret the `razorpay` provider verifies with, and the one it
/// still accepts from before a rotation.
const SECRET: &str = "fencehook-razorpay-integration-secret";
const OLD_SECRET: &str = "fencehook-razorpay-secret-before-rotation";

const PAY: &str = "pay_FPoJKWQQ8lK13n";

fn fixture(name: &str) -> String {
    psp_http::fixture("razorpay", name)
}

fn config(ctx: &TestContext) -> Config {
    let mut cfg = ctx.config();
    cfg.providers = vec![Provider::new(
        "razorpay",
        SchemeKind::Razorpay,
        &[SECRET.into(), OLD_SECRET.into()],
        None,
    )
    .unwrap()];
    cfg
}

async fn post(app: &TestApp, body: &str, signature: &str) -> Reply {
    let event_id = uuid::Uuid::new_v4().simple().to_string();
    app.post(
        "/webhooks/razorpay",
        &[
            ("content-type", "application/json"),
            ("x-razorpay-signature", signature),
            ("x-razorpay-event-id", &event_id),
        ],
        body.as_bytes().to_vec(),
    )
    .await
}

/// Delivers `body` signed with the current secret.
async fn deliver(app: &TestApp, body: &str) -> Reply {
    post(app, body, &razorpay::sign(SECRET, body.as_bytes())).await
}

#[tokio::test(flavor = "multi_thread")]
async fn each_razorpay_event_books_what_it_says_a_failed_then_captured_payment_is_credited_and_a_partial_refund_is_a_debit_under_it(
) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    // Failed first (incorrect OTP): recorded failed, nothing in the ledger.
    let r = deliver(&app, &fixture("payment.failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        psp_http::row(&ctx, "razorpay", PAY).await,
        (s("failed"), s("payment.failed"), 500000, s("INR"), None)
    );
    assert!(psp_http::entries(&ctx, "razorpay", PAY).await.is_empty());
    // Authorised (ignored), then captured: the success is booked, one credit in paise.
    let r = deliver(&app, &fixture("payment.authorized.json")).await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    let captured = fixture("payment.captured.json");
    let r = deliver(&app, &captured).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(r.body, serde_json::json!({"result": "processed"}));
    assert_eq!(
        psp_http::row(&ctx, "razorpay", PAY).await,
        (
            s("succeeded"),
            s("payment.succeeded"),
            500000,
            s("INR"),
            None
        )
    );
    assert_eq!(
        psp_http::entries(&ctx, "razorpay", PAY).await,
        vec![(s("credit"), 500000, s("INR"))]
    );
    // Razorpay's retry (another X-Razorpay-Event-Id header, the same body): a duplicate.
    let r = deliver(&app, &captured).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    // A partial refund: its own row under the payment, a debit of its amount.
    let processed = fixture("refund.processed.json");
    let r = deliver(&app, &processed).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let refund = "rfnd_FS8TWyPrCsa0OB";
    assert_eq!(
        psp_http::row(&ctx, "razorpay", refund).await,
        (
            s("succeeded"),
            s("refund.succeeded"),
            50000,
            s("INR"),
            Some(s(PAY))
        )
    );
    assert_eq!(
        psp_http::entries(&ctx, "razorpay", refund).await,
        vec![(s("debit"), -50000, s("INR"))]
    );
    let r = deliver(&app, &processed).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    // A failed refund: recorded failed under the payment, nothing moves.
    let r = deliver(&app, &fixture("refund.failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let failed_refund = "rfnd_FS8Tb7AaR5aYTe";
    assert_eq!(
        psp_http::row(&ctx, "razorpay", failed_refund).await,
        (
            s("failed"),
            s("refund.failed"),
            100000,
            s("INR"),
            Some(s(PAY))
        )
    );
    assert!(psp_http::entries(&ctx, "razorpay", failed_refund)
        .await
        .is_empty());
    assert_eq!(ctx.payments().await, 3);
    assert_eq!(ctx.entries().await, 2);
    assert_eq!(
        ctx.count("SELECT sum(amount_minor)::bigint FROM ledger_entries")
            .await,
        500000 - 50000
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn razorpay_signatures_are_checked_over_http_one_byte_changed_another_secret_and_none_are_401_and_the_old_secret_still_verifies(
) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let body = fixture("payment.captured.json");
    let good = razorpay::sign(SECRET, body.as_bytes());
    let changed = body.replacen("\"amount\": 500000", "\"amount\": 500001", 1);
    assert_eq!(changed.len(), body.len(), "one byte changed");
    assert_ne!(changed, body);
    for (what, body, sig) in [
        ("one byte changed", changed.as_str(), good.clone()),
        (
            "another secret",
            body.as_str(),
            razorpay::sign("someone-else-s-webhook-secret", body.as_bytes()),
        ),
        ("not hex", body.as_str(), "not-a-signature".to_owned()),
    ] {
        let r = post(&app, body, &sig).await;
        assert_eq!((r.status, r.result()), (401, "unauthorized"), "{what}");
    }
    let r = app
        .post(
            "/webhooks/razorpay",
            &[("content-type", "application/json")],
            body.clone().into_bytes(),
        )
        .await;
    assert_eq!(r.status, 401, "no X-Razorpay-Signature");
    ctx.assert_nothing_written().await;
    // Rotation: Razorpay retries older deliveries with the secret they were first signed with.
    let r = post(&app, &body, &razorpay::sign(OLD_SECRET, body.as_bytes())).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_well_signed_but_malformed_razorpay_event_is_400_invalid_payload_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    for body in [
        fixture("payment.captured.json").replacen("\"amount\": 500000", "\"amount\": 5000.5", 1),
        fixture("payment.captured.json").replacen(
            "\"currency\": \"INR\"",
            "\"currency\": \"inr\"",
            1,
        ),
        fixture("refund.processed.json").replacen("\"payment_id\"", "\"paymentid\"", 1),
        "not json".to_owned(),
    ] {
        let r = deliver(&app, &body).await;
        assert_eq!((r.status, r.result()), (400, "invalid_payload"), "{body}");
    }
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_k4_storm_of_razorpay_captures_over_two_instances_books_each_payment_once() {
    let ctx = TestContext::new().await;
    let apps = [
        Arc::new(ctx.spawn(config(&ctx)).await),
        Arc::new(ctx.spawn(config(&ctx)).await),
    ];
    let payments = psp_http::payments("pay_Storm", 10000, "INR");
    // One event each, delivered four times at once (Razorpay's retries).
    let body_of = |n: &Notice| {
        razorpay::event_of(n, crate::helpers::now())
            .unwrap()
            .to_string()
    };
    psp_http::storm(&ctx, &apps, payments, body_of, |app, body| async move {
        deliver(&app, &body).await
    })
    .await;
}

/// `fencehook send --provider razorpay` (the scheme and secret by flag),
/// with `extra` arguments, against `base`: its output.
async fn send(base: &str, extra: &[&str]) -> std::process::Output {
    let mut args: Vec<String> = [
        "send",
        "--url",
        base,
        "--provider",
        "razorpay",
        "--scheme",
        "razorpay",
        "--secret",
        SECRET,
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    tokio::task::spawn_blocking(move || fencehook_command().args(args).output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn what_fencehook_send_provider_razorpay_signs_is_accepted_and_booked() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let out = send(
        &app.base,
        &["--transaction-id", "pay_SentByCli01", "--amount", "4200"],
    )
    .await;
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
    let out = send(
        &app.base,
        &[
            "--transaction-id",
            "rfnd_SentByCli01",
            "--amount",
            "1200",
            "--event-type",
            "refund.succeeded",
            "--payment-transaction-id",
            "pay_SentByCli01",
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("200 ") && stdout.contains("processed"),
        "{stdout}"
    );
    assert_eq!(
        psp_http::row(&ctx, "razorpay", "pay_SentByCli01").await,
        (s("succeeded"), s("payment.succeeded"), 4200, s("INR"), None)
    );
    assert_eq!(
        psp_http::row(&ctx, "razorpay", "rfnd_SentByCli01").await,
        (
            s("succeeded"),
            s("refund.succeeded"),
            1200,
            s("INR"),
            Some(s("pay_SentByCli01"))
        )
    );
    ctx.assert_audit_clean().await;
}

/// Captures what `fencehook send` posts: a listener that answers 200 and
/// hands back the first request's signature header and body.
async fn capture_one_delivery() -> (String, tokio::task::JoinHandle<(String, Vec<u8>)>) {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = std::sync::Mutex::new(Some(tx));
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let tx = tx.lock().unwrap().take();
                async move {
                    let signature = req
                        .headers()
                        .get("x-razorpay-signature")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    let body = req.into_body().collect().await.unwrap().to_bytes().to_vec();
                    if let Some(tx) = tx {
                        let _ = tx.send((signature, body));
                    }
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(
                            b"{\"result\":\"processed\"}",
                        )),
                    ))
                }
            });
        let conn = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        tokio::spawn(conn);
        rx.await.unwrap()
    });
    (base, task)
}

#[tokio::test(flavor = "multi_thread")]
async fn what_fencehook_send_signs_verifies_with_razorpays_own_sdk_and_a_tampered_copy_does_not() {
    let (base, delivery) = capture_one_delivery().await;
    let out = send(
        &base,
        &["--transaction-id", "pay_SdkInterop01", "--amount", "73500"],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (signature, body) = tokio::time::timeout(Duration::from_secs(30), delivery)
        .await
        .expect("send posts within 30 s")
        .unwrap();
    assert_eq!(signature.len(), 64, "hex HMAC-SHA256: {signature}");
    let sdk = psp_sdk::run("razorpay.py", &["verify", SECRET, &signature], &body);
    assert_eq!(
        (
            sdk.status.code(),
            String::from_utf8_lossy(&sdk.stdout).trim()
        ),
        (Some(0), "verified"),
        "{}",
        String::from_utf8_lossy(&sdk.stderr)
    );
    // The SDK does refuse: the same signature over a changed body.
    let mut changed = body.clone();
    let at = changed.iter().position(|b| *b == b'7').unwrap();
    changed[at] = b'8';
    let sdk = psp_sdk::run("razorpay.py", &["verify", SECRET, &signature], &changed);
    assert_eq!(
        sdk.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&sdk.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn what_razorpays_sdk_rule_signs_is_accepted_by_the_service_for_every_fixture() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    for name in ["payment.captured.json", "refund.processed.json"] {
        let body = fixture(name);
        let sdk = psp_sdk::run("razorpay.py", &["sign", SECRET], body.as_bytes());
        assert_eq!(
            sdk.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&sdk.stderr)
        );
        let signature = String::from_utf8(sdk.stdout).unwrap().trim().to_owned();
        let r = post(&app, &body, &signature).await;
        assert_eq!((r.status, r.result()), (200, "processed"), "{name}: {r:?}");
    }
    // Signed by the SDK's rule with a secret the provider does not have: refused.
    let body = fixture("refund.failed.json");
    let sdk = psp_sdk::run(
        "razorpay.py",
        &["sign", "not-the-providers-secret"],
        body.as_bytes(),
    );
    let signature = String::from_utf8(sdk.stdout).unwrap().trim().to_owned();
    let r = post(&app, &body, &signature).await;
    assert_eq!((r.status, r.result()), (401, "unauthorized"), "{r:?}");
    assert_eq!(ctx.entries().await, 2);
    ctx.assert_audit_clean().await;
}
