//! Paddle Billing over HTTP: the fixtures of tests/fixtures/paddle/ signed as
//! Paddle signs them (`Paddle-Signature: ts=…;h1=…`), booked exactly once.

use std::sync::Arc;

use fencehook::config::Config;
use fencehook::providers::keys::RsaSigner;
use fencehook::providers::paddle;
use fencehook::providers::psp::{self, Credentials, Key, Notice, PspError};
use fencehook::providers::{Provider, SchemeKind};
use serde_json::Value;

use crate::helpers::psp_http::{self, ledger, rows, s};
use crate::helpers::{now, psp_sdk, Reply, TestApp, TestContext};

/// The notification destination's secret key, and the one before a rotation.
const SECRET: &str = "pdl_ntf_01hv8x0fencehookintegration_aW50ZWdyYXRpb24gdGVzdCBzZWNyZXQga2V5";
const OLD_SECRET: &str = "pdl_ntf_01hv8x0fencehookbeforeroll_dGhlIG9sZCBrZXkgYmVmb3JlIHRoZSByb2xs";
const UNKNOWN_SECRET: &str =
    "pdl_ntf_01hv8x0somebodyelsesdestin_bm90IG9uZSBvZiB0aGUgY29uZmlndXJlZCBrZXlz";

const TXN: &str = "txn_01hv8wptq8987qeep44cyrewp9";
/// The transaction the adjustment fixtures refund.
const REFUNDED_TXN: &str = "txn_01hvcc93znj3mpqt1tenkjb04y";
const ADJ: &str = "adj_01hvgf2s84dr6reszzg29zbvcm";

fn fixture(name: &str) -> String {
    psp_http::fixture("paddle", name)
}

fn config(ctx: &TestContext) -> Config {
    let mut cfg = ctx.config();
    cfg.providers = vec![Provider::new(
        "paddle",
        SchemeKind::Paddle,
        &[SECRET.into(), OLD_SECRET.into()],
        Some(60),
    )
    .unwrap()];
    cfg
}

async fn post(app: &TestApp, body: &str, signature: &str) -> Reply {
    app.post(
        "/webhooks/paddle",
        &[
            ("content-type", "application/json"),
            ("paddle-signature", signature),
        ],
        body.as_bytes().to_vec(),
    )
    .await
}

/// Delivers `body` signed now with the current secret.
async fn deliver(app: &TestApp, body: &str) -> Reply {
    post(app, body, &paddle::sign(SECRET, now(), body.as_bytes())).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paddle_transaction_completed_is_credited_once_and_its_copies_are_duplicates() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let body = fixture("transaction.completed.json");
    let r = deliver(&app, &body).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(r.body, serde_json::json!({"result": "processed"}));
    assert_eq!(
        rows(&ctx).await,
        vec![(
            s(TXN),
            s("payment"),
            None,
            s("payment.succeeded"),
            65215,
            s("USD"),
            s("succeeded")
        )]
    );
    assert_eq!(
        ledger(&ctx).await,
        vec![(s(TXN), s("credit"), 65215, s("USD"))]
    );
    // Paddle's retry of the same event, signed again: a duplicate.
    let r = deliver(&app, &body).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    // transaction.paid about the same transaction: not booked.
    let r = deliver(&app, &fixture("transaction.paid.json")).await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(ctx.entries().await, 1);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn paddle_signatures_one_byte_changed_another_secret_or_an_old_ts_are_401_and_two_h1_are_accepted(
) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let body = fixture("transaction.completed.json");
    let t = now();
    let tampered = body.replacen(
        "\"grand_total\": \"65215\"",
        "\"grand_total\": \"65216\"",
        1,
    );
    assert_ne!(tampered, body);
    let refused = [
        // One byte changed after signing.
        post(&app, &tampered, &paddle::sign(SECRET, t, body.as_bytes())).await,
        // Another destination's secret.
        post(
            &app,
            &body,
            &paddle::sign(UNKNOWN_SECRET, t, body.as_bytes()),
        )
        .await,
        // Signed 61 s ago, past the provider's 60 s tolerance.
        post(&app, &body, &paddle::sign(SECRET, t - 61, body.as_bytes())).await,
        // Malformed header.
        post(&app, &body, "h1=00").await,
    ];
    for r in &refused {
        assert_eq!((r.status, r.result()), (401, "unauthorized"), "{r:?}");
    }
    ctx.assert_nothing_written().await;
    // During a rotation Paddle sends one h1 per secret: accepted (here the
    // first h1 is of a secret this provider does not know).
    let two = format!(
        "ts={t};h1={};h1={}",
        paddle::signature_hex(UNKNOWN_SECRET, t, body.as_bytes()),
        paddle::signature_hex(OLD_SECRET, t, body.as_bytes())
    );
    let r = post(&app, &body, &two).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(ctx.entries().await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paddle_transaction_whose_payment_failed_then_completed_is_credited_once() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let r = deliver(&app, &fixture("transaction.payment_failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(rows(&ctx).await[0].6, "failed");
    assert_eq!(ctx.entries().await, 0, "a failure books nothing");
    let r = deliver(&app, &fixture("transaction.completed.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        rows(&ctx).await,
        vec![(
            s(TXN),
            s("payment"),
            None,
            s("payment.succeeded"),
            65215,
            s("USD"),
            s("succeeded")
        )]
    );
    // The failure re-sent after the success changes nothing.
    let r = deliver(&app, &fixture("transaction.payment_failed.json")).await;
    assert_eq!((r.status, r.result()), (200, "stale"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await,
        vec![(s(TXN), s("credit"), 65215, s("USD"))]
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partial_paddle_refund_is_a_debit_under_its_transaction_and_its_rejection_gives_it_back()
{
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    // The refund before its payment: Paddle is asked to retry.
    let r = deliver(&app, &fixture("adjustment.updated.approved.json")).await;
    assert_eq!((r.status, r.result()), (409, "awaiting_payment"), "{r:?}");
    // The refunded transaction (no fixture of it exists: the completed one
    // under the adjustment's transaction id).
    let paid = fixture("transaction.completed.json").replace(TXN, REFUNDED_TXN);
    assert_eq!(deliver(&app, &paid).await.result(), "processed");
    // Still pending approval: nothing.
    let r = deliver(&app, &fixture("adjustment.created.json")).await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    let r = deliver(&app, &fixture("adjustment.updated.approved.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = deliver(&app, &fixture("adjustment.updated.approved.json")).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(
        rows(&ctx).await[1],
        (
            s(ADJ),
            s("refund"),
            Some(s(REFUNDED_TXN)),
            s("refund.succeeded"),
            100,
            s("USD"),
            s("succeeded")
        )
    );
    assert_eq!(
        ledger(&ctx).await,
        vec![
            (s(REFUNDED_TXN), s("credit"), 65215, s("USD")),
            (s(ADJ), s("debit"), -100, s("USD")),
        ]
    );
    // Rejected after all: the money comes back once.
    let r = deliver(&app, &fixture("adjustment.updated.rejected.json")).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = deliver(&app, &fixture("adjustment.updated.rejected.json")).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await[2],
        (s(ADJ), s("refund_reversal"), 100, s("USD"))
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_well_signed_but_malformed_paddle_event_is_400_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let mut event: Value = serde_json::from_str(&fixture("transaction.completed.json")).unwrap();
    event["data"]["details"]["totals"]["grand_total"] = "652.15".into();
    let r = deliver(&app, &event.to_string()).await;
    assert_eq!((r.status, r.result()), (400, "invalid_payload"), "{r:?}");
    assert!(r.text.contains("grand_total"), "{r:?}");
    let r = deliver(&app, "{\"event_type\": \"transaction.completed\"").await;
    assert_eq!((r.status, r.result()), (400, "invalid_payload"), "{r:?}");
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_four_copies_of_each_paddle_transaction_over_three_instances_books_each_once() {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(Arc::new(ctx.spawn(config(&ctx)).await));
    }
    let payments = psp_http::payments("txn_storm_", 1000, "EUR");
    let body_of = |n: &Notice| {
        let event_id = format!("evt_{}", n.transaction_id);
        paddle::event_of(n, &event_id, now()).unwrap().to_string()
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

fn notice(event_type: &str) -> Notice {
    let refund = event_type.starts_with("refund.");
    Notice {
        transaction_id: if refund { "adj_sdk_1" } else { "txn_sdk_1" }.into(),
        amount: 4200,
        currency: "USD".into(),
        event_type: event_type.into(),
        payment_transaction_id: refund.then(|| "txn_sdk_0".to_owned()),
    }
}

#[test]
fn what_fencehook_send_signs_for_paddle_verifies_with_paddles_own_sdk() {
    // The SDK installed first (the first use installs it, which takes seconds): the
    // signatures below are made just before the SDK reads them.
    psp_sdk::python();
    let keys = Keys(vec![(psp::SECRET, SECRET.to_owned())]);
    for kind in [
        "payment.succeeded",
        "payment.failed",
        "refund.succeeded",
        "refund.failed",
    ] {
        // The delivery `fencehook send --provider paddle` builds: the
        // scheme's PSP side, signed now (paddle.py lets the SDK allow 60 s of drift).
        let delivery = SchemeKind::Paddle
            .spec()
            .deliver(&keys, &notice(kind), None, "evt_sdk_interop", now())
            .unwrap();
        let (_, header) = &delivery.headers[0];
        let out = psp_sdk::run(
            "paddle.py",
            &["verify", header, OLD_SECRET, SECRET],
            delivery.body.as_bytes(),
        );
        assert!(out.status.success(), "{kind}: {out:?}");
        // The SDK is not accepting everything: one byte changed is refused.
        let changed = delivery.body.replacen("4200", "4201", 1);
        let out = psp_sdk::run("paddle.py", &["verify", header, SECRET], changed.as_bytes());
        assert_eq!(out.status.code(), Some(1), "{kind}: {out:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn what_paddles_own_sdk_signs_is_accepted_by_the_service() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let body = fixture("transaction.completed.json");
    let ts = now().to_string();
    let out = psp_sdk::run("paddle.py", &["sign", OLD_SECRET, &ts], body.as_bytes());
    assert!(out.status.success(), "{out:?}");
    let header = String::from_utf8(out.stdout).unwrap();
    let r = post(&app, &body, header.trim()).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await,
        vec![(s(TXN), s("credit"), 65215, s("USD"))]
    );
}

/// `fencehook send ARGS` with only `env` of the FENCEHOOK_ settings: exit
/// code and standard output.
pub(crate) async fn fencehook_send(args: Vec<String>, env: Vec<(String, String)>) -> (i32, String) {
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
        for (k, _) in std::env::vars() {
            if k.starts_with("FENCEHOOK_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd.arg("send").args(args).envs(env).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn fencehook_send_with_a_paddle_provider_of_the_file_is_booked_by_the_service() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx)).await;
    let dir = std::env::temp_dir().join(format!("fencehook-send-paddle-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    std::fs::write(
        &file,
        format!("[providers.paddle]\nscheme = \"paddle\"\nsecrets = [\"{SECRET}\"]\n"),
    )
    .unwrap();
    let send = |event_type: &str, id: &str, parent: Option<&str>| {
        let mut args: Vec<String> = [
            "--url",
            &app.base,
            "--provider",
            "paddle",
            "--transaction-id",
            id,
            "--amount",
            "4200",
            "--event-type",
            event_type,
        ]
        .map(str::to_owned)
        .to_vec();
        if let Some(p) = parent {
            args.extend(["--payment-transaction-id".to_owned(), p.to_owned()]);
        }
        let env = vec![("FENCEHOOK_PROVIDERS".to_owned(), file.display().to_string())];
        fencehook_send(args, env)
    };
    let (code, out) = send("payment.succeeded", "txn_from_send", None).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("200 ") && out.contains("processed"),
        "{out}"
    );
    let (code, out) = send("refund.succeeded", "adj_from_send", Some("txn_from_send")).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("processed"), "{out}");
    assert_eq!(
        ledger(&ctx).await,
        vec![
            (s("txn_from_send"), s("credit"), 4200, s("USD")),
            (s("adj_from_send"), s("debit"), -4200, s("USD")),
        ]
    );
    let (code, out) = send("dispute.funds_withdrawn", "dp_1", Some("txn_from_send")).await;
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("paddle sends no notification"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fencehook load` from the provider `provider` of the providers file
/// `file` against `targets`: 60 transactions, 4 copies of each, racing.
/// Its JSON report.
pub(crate) async fn fencehook_load(
    file: &std::path::Path,
    provider: &str,
    targets: &[&TestApp],
) -> Value {
    let mut args: Vec<String> = [
        "load",
        "--provider",
        provider,
        "--transactions",
        "60",
        "--duplicates",
        "4",
        "--concurrency",
        "16",
        "--json",
    ]
    .map(str::to_owned)
    .to_vec();
    for app in targets {
        args.extend(["--target".to_owned(), app.base.clone()]);
    }
    let file = file.display().to_string();
    let (code, out) = tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
        for (k, _) in std::env::vars() {
            if k.starts_with("FENCEHOOK_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd
            .args(args)
            .env("FENCEHOOK_PROVIDERS", file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (
            out.status.code().unwrap_or(-1),
            format!("{}{err}", String::from_utf8_lossy(&out.stdout)),
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "a clean run exits 0: {out}");
    serde_json::from_str(out.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencehook_load_as_paddle_books_each_transaction_once_over_three_instances() {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(ctx.spawn(config(&ctx)).await);
    }
    let dir = std::env::temp_dir().join(format!("fencehook-load-paddle-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    std::fs::write(
        &file,
        format!("[providers.paddle]\nscheme = \"paddle\"\nsecrets = [\"{SECRET}\"]\n"),
    )
    .unwrap();
    let report = fencehook_load(&file, "paddle", &apps.iter().collect::<Vec<_>>()).await;
    assert_eq!(report["scheme"], "paddle");
    assert_eq!(report["transactions"], 60);
    assert_eq!(report["deliveries"], 240);
    assert_eq!(report["processed_twice"], 0, "{report}");
    assert_eq!(ctx.payments().await, 60);
    ctx.assert_audit_clean().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
