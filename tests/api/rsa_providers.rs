//! The RSA-signed PSPs over HTTP: WeChat Pay, Alipay and PayPal
//! notifications in their documented shapes, signed with keys and
//! certificates the tests generate (`providers::testkeys`), answered in the
//! shape each PSP reads. PayPal's certificate comes from a local mock server
//! (over plain http: the configured prefix, not the scheme, is the guard).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fencehook::config::Config;
use fencehook::providers::{alipay, paypal, testkeys, wechatpay, Provider};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::helpers::{now, Reply, TestApp, TestContext};

// WeChat Pay: key 0 as a platform certificate, key 1 as a WeChat Pay public
// key (the switch-over WeChat ramps merchants through); two APIv3 keys.
const WECHAT_CERT_SERIAL: &str = "5157F09EFDC096DE15EBE81A47057A7232F1B8E1";
const WECHAT_PUB_KEY_ID: &str = "PUB_KEY_ID_0000000000000024101100397200000006";
const APIV3_NEW: &str = "fencehook-TEST-apiv3-key-32bytes";
const APIV3_OLD: &str = "fencehook-OLD-apiv3-key-32-bytes";
const APIV3_UNKNOWN: &str = "fencehook-NONE-apiv3-key-32bytes";
// Alipay: keys 0 (bare base64, as Alipay's console gives it) and 1 (PEM).
const APP_ID: &str = "2021002150672444";
// PayPal: the webhook id this provider is configured with.
const WEBHOOK_ID: &str = "WH-7Y7254563A4550640-11V2185806837105M";

/// Request headers as (name, value).
type Headers = Vec<(String, String)>;

/// Key 2 is configured nowhere.
const UNKNOWN_KEY: usize = 2;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A local server of PayPal signing certificates: serves `certs` by path
/// and counts every request by path.
struct CertServer {
    addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    /// Requests being answered now, and the most there were at once.
    open: Arc<Mutex<(usize, usize)>>,
    task: tokio::task::JoinHandle<()>,
}

/// Paths with this in them are answered after [`SLOW_FOR`]: fetches that
/// stay in flight long enough to be counted.
const SLOW: &str = "slow";
const SLOW_FOR: Duration = Duration::from_millis(400);

impl CertServer {
    async fn start(certs: HashMap<String, String>) -> CertServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let open: Arc<Mutex<(usize, usize)>> = Arc::default();
        let certs = Arc::new(certs);
        let task = tokio::spawn({
            let (hits, open) = (hits.clone(), open.clone());
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (hits, certs, open) = (hits.clone(), certs.clone(), open.clone());
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                            let path = req.uri().path().to_owned();
                            *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
                            let slow = path.contains(SLOW);
                            let open = open.clone();
                            {
                                let mut o = open.lock().unwrap();
                                o.0 += 1;
                                o.1 = o.1.max(o.0);
                            }
                            let resp = match certs.get(&path) {
                                Some(pem) => {
                                    hyper::Response::new(Full::new(Bytes::from(pem.clone())))
                                }
                                None => {
                                    let mut r = hyper::Response::new(Full::new(Bytes::new()));
                                    *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                                    r
                                }
                            };
                            async move {
                                if slow {
                                    tokio::time::sleep(SLOW_FOR).await;
                                }
                                open.lock().unwrap().0 -= 1;
                                Ok::<_, Infallible>(resp)
                            }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            }
        });
        CertServer {
            addr,
            hits,
            open,
            task,
        }
    }

    fn prefix(&self) -> String {
        format!("http://{}/v1/notifications/certs/", self.addr)
    }

    fn url(&self, name: &str) -> String {
        format!("{}{name}", self.prefix())
    }

    fn hits(&self, name: &str) -> usize {
        let path = format!("/v1/notifications/certs/{name}");
        self.hits.lock().unwrap().get(&path).copied().unwrap_or(0)
    }

    fn total_hits(&self) -> usize {
        self.hits.lock().unwrap().values().sum()
    }
}

impl Drop for CertServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// PayPal's two certificates (rotation), served by a CertServer.
const PAYPAL_CERT: &str = "CERT-360caa42-fca2a594-fencehook0";
const PAYPAL_NEXT_CERT: &str = "CERT-360caa42-fca2a594-fencehook1";

async fn cert_server() -> CertServer {
    cert_server_with(HashMap::new()).await
}

/// [`cert_server`] serving `more` too.
async fn cert_server_with(more: HashMap<String, String>) -> CertServer {
    let far = now() as u64 + 86_400 * 365;
    let cert = |key| {
        testkeys::certificate(
            key,
            &format!("0{key}A1B2C3"),
            "CN=messageverificationcerts.paypal.com,O=PayPal Inc.",
            0,
            far,
        )
    };
    let mut certs = more;
    certs.extend([
        (format!("/v1/notifications/certs/{PAYPAL_CERT}"), cert(0)),
        (
            format!("/v1/notifications/certs/{PAYPAL_NEXT_CERT}"),
            cert(1),
        ),
        (
            "/v1/notifications/certs/CERT-unknown-key".to_owned(),
            cert(UNKNOWN_KEY),
        ),
        (
            "/v1/notifications/certs/CERT-expired".to_owned(),
            testkeys::certificate(0, "0E", "CN=messageverificationcerts.paypal.com", 0, 1000),
        ),
        (
            "/v1/notifications/certs/not-a-certificate".to_owned(),
            "hello".to_owned(),
        ),
    ]);
    CertServer::start(certs).await
}

/// The three RSA providers: `wechat`, `alipay`, `paypal` (certificates
/// fetched under `cert_prefix`), read from a providers file with their key
/// files beside it.
fn config(ctx: &TestContext, cert_prefix: &str) -> Config {
    let mut cfg = ctx.config();
    let far = now() as u64 + 86_400 * 365;
    let wechat_cert = testkeys::certificate(0, WECHAT_CERT_SERIAL, "CN=Tenpay.com", 0, far);
    let wechat_key = testkeys::public_key_pem(1);
    let alipay_new = testkeys::public_key_base64(0);
    let alipay_old = testkeys::public_key_pem(1);
    let text = format!(
        r#"
[providers.wechat]
scheme = "wechatpay"
secrets = ["{APIV3_NEW}", "{APIV3_OLD}"]
platform_keys = {{ "{WECHAT_CERT_SERIAL}" = "wechat-cert.pem", "{WECHAT_PUB_KEY_ID}" = "wechat-key.pem" }}
tolerance_secs = 300

[providers.alipay]
scheme = "alipay"
app_id = "{APP_ID}"
public_keys = ["alipay-new.txt", "alipay-old.pem"]

[providers.paypal]
scheme = "paypal"
webhook_id = "{WEBHOOK_ID}"
cert_url_prefixes = ["{cert_prefix}"]
"#
    );
    cfg.providers = testkeys::providers_file(
        &text,
        &[
            ("wechat-cert.pem", wechat_cert.as_bytes()),
            ("wechat-key.pem", wechat_key.as_bytes()),
            ("alipay-new.txt", alipay_new.as_bytes()),
            ("alipay-old.pem", alipay_old.as_bytes()),
        ],
    )
    .unwrap();
    cfg
}

// ---- WeChat Pay -------------------------------------------------------------

const WECHAT_TX: &str = "4200001948202310234938573822";
const WECHAT_REFUND: &str = "50300407182023102400011301001";

/// A WeChat notification of `event_type`, its `resource` encrypted with `apiv3`.
fn wechat_body(event_type: &str, resource: &Value, apiv3: &str) -> Vec<u8> {
    let nonce = "fH7kQ2mZ9xLp";
    let aad = if event_type.starts_with("REFUND") {
        "refund"
    } else {
        "transaction"
    };
    let ciphertext =
        wechatpay::encrypt_resource(apiv3, nonce, aad, resource.to_string().as_bytes()).unwrap();
    json!({
        "id": uuid::Uuid::new_v4().to_string(), "create_time": "2023-10-23T10:34:57+08:00",
        "resource_type": "encrypt-resource", "event_type": event_type, "summary": "支付成功",
        "resource": {"original_type": aad, "algorithm": "AEAD_AES_256_GCM",
            "ciphertext": ciphertext, "associated_data": aad, "nonce": nonce}
    })
    .to_string()
    .into_bytes()
}

fn wechat_payment(total: i64) -> Value {
    let mut v: Value =
        serde_json::from_slice(&fixture("wechatpay/transaction_success.resource.json")).unwrap();
    v["amount"]["total"] = total.into();
    v["amount"]["payer_total"] = total.into();
    v
}

fn wechat_refund() -> Value {
    serde_json::from_slice(&fixture("wechatpay/refund_success.resource.json")).unwrap()
}

/// The headers WeChat signs `body` with, with test key `key` under `serial`, at `ts`.
fn wechat_headers(key: usize, serial: &str, ts: i64, body: &[u8]) -> Vec<(String, String)> {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let signature = wechatpay::sign(&testkeys::signer(key), ts, &nonce, body);
    vec![
        ("content-type".into(), "application/json".into()),
        (wechatpay::TIMESTAMP_HEADER.into(), ts.to_string()),
        (wechatpay::NONCE_HEADER.into(), nonce),
        (wechatpay::SERIAL_HEADER.into(), serial.into()),
        (wechatpay::SIGNATURE_HEADER.into(), signature),
        (
            wechatpay::SIGNATURE_TYPE_HEADER.into(),
            wechatpay::SIGNATURE_TYPE.into(),
        ),
    ]
}

async fn post(app: &TestApp, provider: &str, headers: &[(String, String)], body: &[u8]) -> Reply {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    app.post(&format!("/webhooks/{provider}"), &headers, body.to_vec())
        .await
}

/// Delivers a WeChat notification signed now with the platform certificate.
async fn deliver_wechat(app: &TestApp, body: &[u8]) -> Reply {
    post(
        app,
        "wechat",
        &wechat_headers(0, WECHAT_CERT_SERIAL, now(), body),
        body,
    )
    .await
}

/// WeChat reads the status alone; a success must carry no body.
fn assert_wechat_ok(r: &Reply) {
    assert_eq!((r.status, r.text.as_str()), (200, ""), "{r:?}");
}

/// WeChat's failure shape: `{"code":"FAIL","message":…}` with a 4xx/5xx.
fn assert_wechat_fail(r: &Reply, status: u16, message: &str) {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.body["code"], "FAIL", "{r:?}");
    let m = r.body["message"].as_str().unwrap_or_default();
    assert!(m.starts_with(message), "{message}: {r:?}");
}

fn result_count(apps: &[&TestApp], provider: &str, result: &str) -> f64 {
    apps.iter()
        .map(|a| {
            a.metric(
                "fencehook_webhooks_total",
                &[("provider", provider), ("result", result)],
            )
        })
        .sum()
}

async fn ledger_sum(ctx: &TestContext) -> i64 {
    ctx.count("SELECT coalesce(sum(amount_minor), 0)::bigint FROM ledger_entries")
        .await
}

async fn entries_of(ctx: &TestContext, effect: &str) -> i64 {
    ctx.count(&format!(
        "SELECT count(*) FROM ledger_entries WHERE effect = '{effect}'"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wechat_payment_then_its_refund_book_one_credit_and_one_debit_answered_with_empty_200s() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await;
    let payment = wechat_body("TRANSACTION.SUCCESS", &wechat_payment(100), APIV3_NEW);
    assert_wechat_ok(&deliver_wechat(&app, &payment).await);
    // WeChat's retry of the same notification: nothing new.
    assert_wechat_ok(&deliver_wechat(&app, &payment).await);
    let refund = wechat_body("REFUND.SUCCESS", &wechat_refund(), APIV3_NEW);
    assert_wechat_ok(&deliver_wechat(&app, &refund).await);
    assert_eq!(ctx.payments().await, 2, "the payment and its refund");
    assert_eq!(entries_of(&ctx, "credit").await, 1);
    assert_eq!(entries_of(&ctx, "debit").await, 1);
    assert_eq!(ledger_sum(&ctx).await, 100 - 40);
    assert_eq!(ctx.payment(WECHAT_TX).await.unwrap().0, "succeeded");
    assert_eq!(ctx.payment(WECHAT_REFUND).await.unwrap().0, "succeeded");
    assert_eq!(result_count(&[&app], "wechat", "duplicate"), 1.0);
    // An abnormal refund is not final: ignored, nothing written.
    let mut abnormal = wechat_refund();
    abnormal["refund_status"] = "ABNORMAL".into();
    abnormal["refund_id"] = "50300407182023102400011301002".into();
    let r = deliver_wechat(&app, &wechat_body("REFUND.ABNORMAL", &abnormal, APIV3_NEW)).await;
    assert_wechat_ok(&r);
    assert_eq!(ctx.payments().await, 2);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wechat_refund_before_its_payment_waits_then_books_once_the_payment_is_in() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await;
    let refund = wechat_body("REFUND.SUCCESS", &wechat_refund(), APIV3_NEW);
    let r = deliver_wechat(&app, &refund).await;
    assert_wechat_fail(&r, 409, "awaiting_payment");
    assert!(r.retry_after.is_some());
    let payment = wechat_body("TRANSACTION.SUCCESS", &wechat_payment(100), APIV3_NEW);
    assert_wechat_ok(&deliver_wechat(&app, &payment).await);
    assert_wechat_ok(&deliver_wechat(&app, &refund).await);
    assert_eq!(ledger_sum(&ctx).await, 60);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wechat_rotation_accepts_both_platform_keys_and_both_apiv3_keys() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await;
    // The payment signed with the public key (PUB_KEY_ID_…), encrypted with the old APIv3 key.
    let payment = wechat_body("TRANSACTION.SUCCESS", &wechat_payment(100), APIV3_OLD);
    let r = post(
        &app,
        "wechat",
        &wechat_headers(1, WECHAT_PUB_KEY_ID, now(), &payment),
        &payment,
    )
    .await;
    assert_wechat_ok(&r);
    // The same payment, another envelope, the certificate and the new key: a duplicate.
    let again = wechat_body("TRANSACTION.SUCCESS", &wechat_payment(100), APIV3_NEW);
    assert_wechat_ok(&deliver_wechat(&app, &again).await);
    assert_eq!(result_count(&[&app], "wechat", "processed"), 1.0);
    assert_eq!(result_count(&[&app], "wechat", "duplicate"), 1.0);
    assert_eq!(ctx.entries().await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_wechat_notifications_are_refused_in_wechats_shape_and_write_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await;
    let body = wechat_body("TRANSACTION.SUCCESS", &wechat_payment(100), APIV3_NEW);
    let good = wechat_headers(0, WECHAT_CERT_SERIAL, now(), &body);
    let edit = |name: &str, value: Option<&str>| -> Vec<(String, String)> {
        let mut h: Vec<(String, String)> =
            good.iter().filter(|(k, _)| k != name).cloned().collect();
        if let Some(v) = value {
            h.push((name.to_owned(), v.to_owned()));
        }
        h
    };
    let mut tampered = body.clone();
    let at = tampered.len() - 3;
    tampered[at] ^= 1;
    let cases: Vec<(&str, Headers, Vec<u8>, u16, &str)> = vec![
        (
            "no signature",
            edit(wechatpay::SIGNATURE_HEADER, None),
            body.clone(),
            401,
            "unauthorized",
        ),
        (
            "no serial",
            edit(wechatpay::SERIAL_HEADER, None),
            body.clone(),
            401,
            "unauthorized",
        ),
        (
            "no timestamp",
            edit(wechatpay::TIMESTAMP_HEADER, None),
            body.clone(),
            401,
            "unauthorized",
        ),
        (
            "no nonce",
            edit(wechatpay::NONCE_HEADER, None),
            body.clone(),
            401,
            "unauthorized",
        ),
        (
            "signature not base64",
            edit(wechatpay::SIGNATURE_HEADER, Some("@@@")),
            body.clone(),
            401,
            "unauthorized",
        ),
        (
            "wrong serial",
            edit(wechatpay::SERIAL_HEADER, Some("PUB_KEY_ID_0123")),
            body.clone(),
            401,
            "unauthorized",
        ),
        (
            "other signature type",
            edit(
                wechatpay::SIGNATURE_TYPE_HEADER,
                Some("WECHATPAY2-SM2-WITH-SM3"),
            ),
            body.clone(),
            401,
            "unauthorized",
        ),
        (
            "unknown key",
            wechat_headers(UNKNOWN_KEY, WECHAT_CERT_SERIAL, now(), &body),
            body.clone(),
            401,
            "unauthorized",
        ),
        (
            "signature over other bytes",
            good.clone(),
            tampered,
            401,
            "unauthorized",
        ),
        (
            "timestamp 301 s old",
            wechat_headers(0, WECHAT_CERT_SERIAL, now() - 301, &body),
            body.clone(),
            401,
            "unauthorized",
        ),
        (
            "timestamp 330 s ahead",
            wechat_headers(0, WECHAT_CERT_SERIAL, now() + 330, &body),
            body.clone(),
            401,
            "unauthorized",
        ),
    ];
    for (name, headers, body, status, message) in cases {
        let r = post(&app, "wechat", &headers, &body).await;
        assert_eq!(r.status, status, "{name}: {r:?}");
        assert_wechat_fail(&r, status, message);
    }
    // Well signed, but no configured APIv3 key opens the resource.
    let sealed = wechat_body("TRANSACTION.SUCCESS", &wechat_payment(100), APIV3_UNKNOWN);
    let r = deliver_wechat(&app, &sealed).await;
    assert_wechat_fail(&r, 400, "invalid_payload: resource does not decrypt");
    // Amounts that are not integer fen.
    for bad in [json!(20.5), json!("100"), json!(-1), json!(0), json!(1e2)] {
        let mut resource = wechat_payment(100);
        resource["amount"]["total"] = bad.clone();
        let r = deliver_wechat(
            &app,
            &wechat_body("TRANSACTION.SUCCESS", &resource, APIV3_NEW),
        )
        .await;
        assert_wechat_fail(&r, 400, "invalid_payload");
    }
    // Not JSON: 415, in WeChat's shape too.
    let mut form = good.clone();
    form[0].1 = "application/x-www-form-urlencoded".into();
    let r = post(&app, "wechat", &form, &body).await;
    assert_wechat_fail(&r, 415, "unsupported_media_type");
    ctx.assert_nothing_written().await;
}

/// Delivers `send` until it is neither 409 nor 503, as a PSP retries.
async fn settle<F, Fut>(mut send: F) -> Reply
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Reply>,
{
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = send().await;
        if !(r.status == 409 || r.status == 503) || tokio::time::Instant::now() >= end {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` copies of one notification to two instances at once; returns the answers.
async fn concurrently<F, Fut>(a: &Arc<TestApp>, b: &Arc<TestApp>, n: usize, send: F) -> Vec<Reply>
where
    F: Fn(Arc<TestApp>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Reply> + Send,
{
    let mut tasks = Vec::new();
    for i in 0..n {
        let app = if i % 2 == 0 { a.clone() } else { b.clone() };
        let send = send.clone();
        tasks.push(tokio::spawn(
            async move { settle(|| send(app.clone())).await },
        ));
    }
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_wechat_notification_to_two_instances_at_once_is_credited_once() {
    let ctx = TestContext::new().await;
    let a = Arc::new(ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await);
    let b = Arc::new(ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await);
    let body = Arc::new(wechat_body(
        "TRANSACTION.SUCCESS",
        &wechat_payment(100),
        APIV3_NEW,
    ));
    let replies = concurrently(&a, &b, 10, move |app| {
        let body = body.clone();
        async move { deliver_wechat(&app, &body).await }
    })
    .await;
    for r in &replies {
        assert_wechat_ok(r);
    }
    assert_eq!(result_count(&[&*a, &*b], "wechat", "processed"), 1.0);
    assert_eq!(result_count(&[&*a, &*b], "wechat", "duplicate"), 9.0);
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(ctx.entries().await, 1, "exactly one credit");
    ctx.assert_audit_clean().await;
}

// ---- Alipay -----------------------------------------------------------------

const TRADE_NO: &str = "2021071422001435011433387454";

fn alipay_kv(name: &str) -> Vec<(String, String)> {
    serde_json::from_slice(&fixture(&format!("alipay/{name}"))).unwrap()
}

fn set(mut params: Vec<(String, String)>, key: &str, value: &str) -> Vec<(String, String)> {
    match params.iter_mut().find(|(k, _)| k == key) {
        Some(p) => p.1 = value.to_owned(),
        None => params.push((key.to_owned(), value.to_owned())),
    }
    params
}

/// The payment notification of the real full-refund fixture's trade (0.60 CNY).
fn alipay_payment() -> Vec<(String, String)> {
    let params: Vec<(String, String)> = alipay_kv("refund_full_trade_closed.kv.json")
        .into_iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "gmt_refund" | "refund_fee" | "out_biz_no" | "gmt_close"
            )
        })
        .collect();
    set(params, "trade_status", "TRADE_SUCCESS")
}

async fn post_alipay(app: &TestApp, key: usize, params: &[(String, String)]) -> Reply {
    let body = alipay::sign_form(&testkeys::signer(key), params);
    post_alipay_raw(app, &body).await
}

async fn post_alipay_raw(app: &TestApp, body: &str) -> Reply {
    app.post(
        "/webhooks/alipay",
        &[(
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8",
        )],
        body.as_bytes().to_vec(),
    )
    .await
}

fn assert_alipay(r: &Reply, status: u16, body: &str) {
    assert_eq!((r.status, r.text.as_str()), (status, body), "{r:?}");
    assert_eq!(r.content_type.as_deref(), Some("text/plain"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_alipay_payment_then_its_refund_book_one_credit_and_one_debit_answered_success() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await;
    assert_alipay(
        &post_alipay(&app, 0, &alipay_payment()).await,
        200,
        "success",
    );
    // TRADE_FINISHED about the same trade: the same payment.
    let finished = set(alipay_payment(), "trade_status", "TRADE_FINISHED");
    assert_alipay(&post_alipay(&app, 0, &finished).await, 200, "success");
    assert_eq!(result_count(&[&app], "alipay", "duplicate"), 1.0);
    // The partial refund (cumulative 0.20), then Alipay's redelivery of it.
    let partial = alipay_kv("refund_partial_trade_success.CONSTRUCTED.kv.json");
    assert_alipay(&post_alipay(&app, 0, &partial).await, 200, "success");
    assert_alipay(&post_alipay(&app, 0, &partial).await, 200, "success");
    assert_eq!(entries_of(&ctx, "credit").await, 1);
    assert_eq!(entries_of(&ctx, "debit").await, 1);
    assert_eq!(ledger_sum(&ctx).await, 60 - 20);
    let refund_key = format!("{TRADE_NO}:refund");
    assert_eq!(ctx.payment(&refund_key).await.unwrap().0, "succeeded");
    // The trade's second refund carries the new running total (0.60): it
    // cannot be told apart statelessly, so it is a mismatch, never a second debit.
    let full = alipay_kv("refund_full_trade_closed.kv.json");
    assert_alipay(&post_alipay(&app, 0, &full).await, 422, "fail");
    assert_eq!(ctx.entries().await, 2);
    assert_eq!(ledger_sum(&ctx).await, 40);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_alipay_full_refund_is_booked_whole_and_a_closed_unpaid_trade_is_a_failed_payment() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await;
    assert_alipay(
        &post_alipay(&app, 0, &alipay_payment()).await,
        200,
        "success",
    );
    // The real production full refund's parameters, re-signed with our key.
    let full = alipay_kv("refund_full_trade_closed.kv.json");
    assert_alipay(&post_alipay(&app, 1, &full).await, 200, "success");
    assert_eq!(ledger_sum(&ctx).await, 0, "fully refunded");
    // Another trade, closed before it was paid.
    let closed = set(
        set(alipay_payment(), "trade_no", "2021071422001435011400000001"),
        "trade_status",
        "TRADE_CLOSED",
    );
    assert_alipay(&post_alipay(&app, 0, &closed).await, 200, "success");
    assert_eq!(
        ctx.payment("2021071422001435011400000001").await.unwrap().0,
        "failed"
    );
    assert_eq!(ctx.entries().await, 2);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_alipay_notifications_are_answered_fail_and_write_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await;
    let payment = alipay_payment();
    let good = alipay::sign_form(&testkeys::signer(0), &payment);
    let cases: Vec<(&str, String, u16)> = vec![
        (
            "unknown key",
            alipay::sign_form(&testkeys::signer(UNKNOWN_KEY), &payment),
            401,
        ),
        (
            "another app_id",
            alipay::sign_form(
                &testkeys::signer(0),
                &set(payment.clone(), "app_id", "2021000000000000"),
            ),
            401,
        ),
        (
            "sign_type RSA",
            good.replace("sign_type=RSA2", "sign_type=RSA"),
            401,
        ),
        (
            "signed over other bytes",
            good.replace("total_amount=0.60", "total_amount=6.00"),
            401,
        ),
        (
            "no sign",
            good.split("&sign=").next().unwrap().to_owned(),
            401,
        ),
        (
            "20.001",
            alipay::sign_form(
                &testkeys::signer(0),
                &set(payment.clone(), "total_amount", "20.001"),
            ),
            400,
        ),
        (
            "1e2",
            alipay::sign_form(
                &testkeys::signer(0),
                &set(payment.clone(), "total_amount", "1e2"),
            ),
            400,
        ),
        (
            "-1",
            alipay::sign_form(
                &testkeys::signer(0),
                &set(payment.clone(), "total_amount", "-1"),
            ),
            400,
        ),
        (
            "1,00",
            alipay::sign_form(
                &testkeys::signer(0),
                &set(payment.clone(), "total_amount", "1,00"),
            ),
            400,
        ),
        ("repeated parameter", format!("{good}&trade_no=1"), 400),
        ("not a form", "{\"trade_no\":1}".to_owned(), 400),
    ];
    for (name, body, status) in cases {
        let r = post_alipay_raw(&app, &body).await;
        assert_eq!(
            (r.status, r.text.as_str()),
            (status, "fail"),
            "{name}: {r:?}"
        );
    }
    // JSON is not what Alipay posts: 415, answered `fail`.
    let r = app
        .post(
            "/webhooks/alipay",
            &[("content-type", "application/json")],
            good.into_bytes(),
        )
        .await;
    assert_alipay(&r, 415, "fail");
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_alipay_notification_to_two_instances_at_once_is_credited_once() {
    let ctx = TestContext::new().await;
    let a = Arc::new(ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await);
    let b = Arc::new(ctx.spawn(config(&ctx, "http://127.0.0.1:9/")).await);
    let body = Arc::new(alipay::sign_form(&testkeys::signer(1), &alipay_payment()));
    let replies = concurrently(&a, &b, 10, move |app| {
        let body = body.clone();
        async move { post_alipay_raw(&app, &body).await }
    })
    .await;
    for r in &replies {
        assert_alipay(r, 200, "success");
    }
    assert_eq!(result_count(&[&*a, &*b], "alipay", "processed"), 1.0);
    assert_eq!(result_count(&[&*a, &*b], "alipay", "duplicate"), 9.0);
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(ledger_sum(&ctx).await, 60);
}

// ---- PayPal -----------------------------------------------------------------

/// PayPal's headers for `body`, signed now with test key `key`, naming `cert_url`.
fn paypal_headers(key: usize, cert_url: &str, body: &[u8]) -> Vec<(String, String)> {
    paypal_headers_at(key, cert_url, body, now())
}

/// [`paypal_headers`] with a transmission time of `at` (unix seconds).
fn paypal_headers_at(key: usize, cert_url: &str, body: &[u8], at: i64) -> Vec<(String, String)> {
    let id = uuid::Uuid::new_v4().to_string();
    let time = &time::OffsetDateTime::from_unix_timestamp(at)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let sig = paypal::sign(&testkeys::signer(key), &id, time, WEBHOOK_ID, body);
    vec![
        ("content-type".into(), "application/json".into()),
        (paypal::TRANSMISSION_ID_HEADER.into(), id),
        (paypal::TRANSMISSION_TIME_HEADER.into(), time.into()),
        (paypal::TRANSMISSION_SIG_HEADER.into(), sig),
        (paypal::CERT_URL_HEADER.into(), cert_url.into()),
        (paypal::AUTH_ALGO_HEADER.into(), paypal::AUTH_ALGO.into()),
        ("paypal-auth-version".into(), "v2".into()),
    ]
}

/// A fixture's body with the capture it is about (refund's `up` link) set
/// to `capture`, and its own id to `id`.
fn paypal_fixture(name: &str, id: &str, capture: Option<&str>) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&fixture(&format!("paypal/{name}"))).unwrap();
    v["resource"]["id"] = id.into();
    if let Some(capture) = capture {
        for link in v["resource"]["links"].as_array_mut().unwrap() {
            if link["rel"] == "up" {
                link["href"] =
                    format!("https://api.paypal.com/v2/payments/captures/{capture}").into();
            }
        }
    }
    v.to_string().into_bytes()
}

const CAPTURE: &str = "12A34567BC123456S";

#[tokio::test(flavor = "multi_thread")]
async fn paypal_fetches_its_certificate_once_and_books_a_capture_its_refund_and_a_reversal() {
    let ctx = TestContext::new().await;
    let certs = cert_server().await;
    let app = ctx.spawn(config(&ctx, &certs.prefix())).await;
    let url = certs.url(PAYPAL_CERT);
    // The real simulator delivery of a USD 30.00 capture, signed with our key.
    let capture = fixture("paypal/capture_completed.body.json");
    let r = post(&app, "paypal", &paypal_headers(0, &url, &capture), &capture).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = post(&app, "paypal", &paypal_headers(0, &url, &capture), &capture).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    // A refund of 0.99 and a reversal of 2.51 against that capture.
    let refund = paypal_fixture(
        "capture_refunded.body.json",
        "1Y107995YT783435V",
        Some(CAPTURE),
    );
    let r = post(&app, "paypal", &paypal_headers(0, &url, &refund), &refund).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let reversal = paypal_fixture(
        "capture_reversed.body.json",
        "09E71677NS257044M",
        Some(CAPTURE),
    );
    let r = post(
        &app,
        "paypal",
        &paypal_headers(0, &url, &reversal),
        &reversal,
    )
    .await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(certs.hits(PAYPAL_CERT), 1, "fetched once, then cached");
    assert_eq!(entries_of(&ctx, "credit").await, 1);
    assert_eq!(entries_of(&ctx, "debit").await, 1);
    assert_eq!(
        entries_of(&ctx, "dispute").await,
        1,
        "a reversal is PayPal taking the money back"
    );
    assert_eq!(ledger_sum(&ctx).await, 3000 - 99 - 251);
    // Rotation: PayPal's next certificate, another URL, another key.
    let r = post(
        &app,
        "paypal",
        &paypal_headers(1, &certs.url(PAYPAL_NEXT_CERT), &refund),
        &refund,
    )
    .await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(certs.hits(PAYPAL_NEXT_CERT), 1);
    // A denied capture of another payment: recorded failed.
    let denied = paypal_fixture(
        "capture_denied.CONSTRUCTED.body.json",
        "7U133281TB3277399",
        None,
    );
    let r = post(&app, "paypal", &paypal_headers(0, &url, &denied), &denied).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(ctx.payment("7U133281TB3277399").await.unwrap().0, "failed");
    assert_eq!(certs.hits(PAYPAL_CERT), 1);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_paypal_deliveries_are_refused_and_a_cert_url_outside_the_prefixes_is_never_fetched() {
    let ctx = TestContext::new().await;
    let certs = cert_server().await;
    let app = ctx.spawn(config(&ctx, &certs.prefix())).await;
    let body = fixture("paypal/capture_completed.body.json");
    let url = certs.url(PAYPAL_CERT);
    let good = paypal_headers(0, &url, &body);
    let edit = |name: &str, value: Option<&str>| -> Vec<(String, String)> {
        let mut h: Vec<(String, String)> =
            good.iter().filter(|(k, _)| k != name).cloned().collect();
        if let Some(v) = value {
            h.push((name.to_owned(), v.to_owned()));
        }
        h
    };
    let outside = format!("http://{}/elsewhere/{PAYPAL_CERT}", certs.addr);
    let cases: Vec<(&str, Headers, u16)> = vec![
        (
            "cert URL outside the prefixes",
            paypal_headers(0, &outside, &body),
            401,
        ),
        (
            "PayPal's own host, not configured",
            paypal_headers(
                0,
                "https://api.paypal.com/v1/notifications/certs/CERT-1",
                &body,
            ),
            401,
        ),
        ("no cert URL", edit(paypal::CERT_URL_HEADER, None), 401),
        (
            "no signature",
            edit(paypal::TRANSMISSION_SIG_HEADER, None),
            401,
        ),
        (
            "no transmission id",
            edit(paypal::TRANSMISSION_ID_HEADER, None),
            401,
        ),
        (
            "algorithm not pinned",
            edit(paypal::AUTH_ALGO_HEADER, Some("SHA1withRSA")),
            401,
        ),
        (
            "signature not base64",
            edit(paypal::TRANSMISSION_SIG_HEADER, Some("%%%")),
            401,
        ),
        (
            "another transmission id",
            edit(paypal::TRANSMISSION_ID_HEADER, Some("x")),
            401,
        ),
        ("unknown key", paypal_headers(UNKNOWN_KEY, &url, &body), 401),
        (
            "the certificate of another key",
            paypal_headers(0, &certs.url("CERT-unknown-key"), &body),
            401,
        ),
        (
            "an expired certificate",
            paypal_headers(0, &certs.url("CERT-expired"), &body),
            401,
        ),
        (
            "no certificate served",
            paypal_headers(0, &certs.url("not-a-certificate"), &body),
            401,
        ),
        (
            "no certificate there",
            paypal_headers(0, &certs.url("CERT-404"), &body),
            503,
        ),
    ];
    for (name, headers, status) in cases {
        let r = post(&app, "paypal", &headers, &body).await;
        assert_eq!(r.status, status, "{name}: {r:?}");
    }
    assert_eq!(
        certs.total_hits(),
        5,
        "only URLs under the prefix were fetched: {:?}",
        certs.hits.lock().unwrap()
    );
    // Signed over other bytes.
    let mut other = body.clone();
    other.push(b' ');
    let r = post(&app, "paypal", &good, &other).await;
    assert_eq!((r.status, r.result()), (401, "unauthorized"));
    // Amounts that are not exact in the currency.
    for (value, currency) in [
        ("20.001", "USD"),
        ("1e2", "USD"),
        ("-1", "USD"),
        ("12.5", "JPY"),
        ("1.00", "XYZ"),
    ] {
        let mut v: Value = serde_json::from_slice(&body).unwrap();
        v["resource"]["amount"] = json!({"currency_code": currency, "value": value});
        let b = v.to_string().into_bytes();
        let r = post(&app, "paypal", &paypal_headers(0, &url, &b), &b).await;
        assert_eq!(
            (r.status, r.result()),
            (400, "invalid_payload"),
            "{value} {currency}"
        );
    }
    // A 503 is retried; the failure is remembered a while, not fetched again
    // for every delivery that names the URL.
    let r = post(
        &app,
        "paypal",
        &paypal_headers(0, &certs.url("CERT-404"), &body),
        &body,
    )
    .await;
    assert_eq!(r.status, 503);
    assert!(r.retry_after.is_some());
    assert_eq!(certs.hits("CERT-404"), 1);
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_paypal_event_to_two_instances_at_once_is_credited_once_and_each_fetches_its_certificate_once(
) {
    let ctx = TestContext::new().await;
    let certs = cert_server().await;
    let a = Arc::new(ctx.spawn(config(&ctx, &certs.prefix())).await);
    let b = Arc::new(ctx.spawn(config(&ctx, &certs.prefix())).await);
    let body = Arc::new(fixture("paypal/capture_completed.body.json"));
    let url = Arc::new(certs.url(PAYPAL_CERT));
    let replies = concurrently(&a, &b, 10, move |app| {
        let (body, url) = (body.clone(), url.clone());
        async move { post(&app, "paypal", &paypal_headers(0, &url, &body), &body).await }
    })
    .await;
    for r in &replies {
        assert_eq!(r.status, 200, "{r:?}");
    }
    assert_eq!(result_count(&[&*a, &*b], "paypal", "processed"), 1.0);
    assert_eq!(result_count(&[&*a, &*b], "paypal", "duplicate"), 9.0);
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(ledger_sum(&ctx).await, 3000);
    assert!(
        certs.hits(PAYPAL_CERT) <= 2,
        "one fetch per instance at most, concurrent first deliveries share it: {}",
        certs.hits(PAYPAL_CERT)
    );
    ctx.assert_audit_clean().await;
}

// ---- PayPal: what CRC-32 and an unlimited transmission time leave open ------

/// `prefix`, 64 characters each `A` or `@`, then `suffix`: chosen so that the
/// whole has the CRC-32 `target`. CRC-32 is affine over GF(2) for a fixed
/// length, so flipping bit 0 of a character XORs a fixed 32-bit vector into
/// the CRC; solving for the flips that reach `target` is Gaussian
/// elimination. Both characters are plain in a JSON string.
fn crc_forged(prefix: &[u8], suffix: &[u8], target: u32) -> Vec<u8> {
    const PAD: usize = 64;
    let build = |flips: u64| -> Vec<u8> {
        let mut b = prefix.to_vec();
        b.extend((0..PAD).map(|i| if flips >> i & 1 == 1 { b'@' } else { b'A' }));
        b.extend_from_slice(suffix);
        b
    };
    let base = crc32fast::hash(&build(0));
    // Rows: (the CRC change of flipping this set of characters, the set).
    let mut rows: Vec<(u32, u64)> = (0..PAD)
        .map(|i| (crc32fast::hash(&build(1 << i)) ^ base, 1u64 << i))
        .collect();
    let (mut want, mut flips) = (base ^ target, 0u64);
    for bit in (0..32).rev() {
        let Some(pivot) = rows.iter().position(|(v, _)| v >> bit & 1 == 1) else {
            continue;
        };
        let (pv, pf) = rows.swap_remove(pivot);
        for row in rows.iter_mut().filter(|(v, _)| v >> bit & 1 == 1) {
            *row = (row.0 ^ pv, row.1 ^ pf);
        }
        if want >> bit & 1 == 1 {
            want ^= pv;
            flips ^= pf;
        }
    }
    assert_eq!(want, 0, "the pad spans every CRC");
    let forged = build(flips);
    assert_eq!(crc32fast::hash(&forged), target);
    forged
}

/// A PayPal capture of `value` USD with its own `id`.
fn paypal_capture(id: &str, value: &str) -> Value {
    let mut v: Value =
        serde_json::from_slice(&fixture("paypal/capture_completed.body.json")).unwrap();
    v["resource"]["id"] = id.into();
    v["resource"]["amount"] = json!({"currency_code": "USD", "value": value});
    v
}

/// A capture of `value` whose body has the CRC-32 of `genuine`: PayPal's
/// signature over `genuine` verifies it too.
fn crc_forged_capture(genuine: &[u8], id: &str, value: &str) -> Vec<u8> {
    let mut v = paypal_capture(id, value);
    v["summary"] = "PAD".into();
    let text = v.to_string();
    let (prefix, suffix) = text.split_once("PAD").unwrap();
    crc_forged(
        prefix.as_bytes(),
        suffix.as_bytes(),
        crc32fast::hash(genuine),
    )
}

fn header<'a>(headers: &'a Headers, name: &str) -> &'a str {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn crc_forged_paypal_bodies_and_an_old_transmission_time_are_refused_in_both_modes_while_the_genuine_delivery_is_booked(
) {
    for inbox in [false, true] {
        let ctx = TestContext::new().await;
        let certs = cert_server().await;
        let mut cfg = config(&ctx, &certs.prefix());
        if inbox {
            cfg.inbox = ctx.inbox_config(0).inbox;
        }
        let app = ctx.spawn(cfg).await;
        let url = certs.url(PAYPAL_CERT);
        let genuine = paypal_capture("CAPTURE-GENUINE-10", "10.00")
            .to_string()
            .into_bytes();
        let headers = paypal_headers(0, &url, &genuine);
        // Three bodies of 99,999.00 with new capture ids, each with the CRC
        // of the genuine one: PayPal's signature covers all of them.
        let forged: Vec<Vec<u8>> = (1..=3)
            .map(|i| crc_forged_capture(&genuine, &format!("CAPTURE-FORGED-{i}"), "99999.00"))
            .collect();
        let signed = |body: &[u8]| {
            paypal::signed_message(
                header(&headers, paypal::TRANSMISSION_ID_HEADER),
                header(&headers, paypal::TRANSMISSION_TIME_HEADER),
                WEBHOOK_ID,
                body,
            )
        };
        for body in &forged {
            assert_eq!(signed(body), signed(&genuine), "the same signed message");
        }
        let expected = if inbox { "accepted" } else { "processed" };
        let r = post(&app, "paypal", &headers, &genuine).await;
        assert_eq!((r.status, r.result()), (200, expected), "{r:?}");
        for body in &forged {
            let r = post(&app, "paypal", &headers, body).await;
            assert_eq!((r.status, r.result()), (401, "unauthorized"), "{r:?}");
        }
        // A transmission time of 2000-01-01, correctly signed: outside the window.
        let old_body = paypal_capture("CAPTURE-OLD", "99999.00")
            .to_string()
            .into_bytes();
        let old = paypal_headers_at(0, &url, &old_body, 946_684_800);
        let r = post(&app, "paypal", &old, &old_body).await;
        assert_eq!((r.status, r.result()), (401, "unauthorized"), "{r:?}");
        // Ahead of the clock by an hour: outside the skew.
        let ahead = paypal_headers_at(0, &url, &old_body, now() + 3600);
        let r = post(&app, "paypal", &ahead, &old_body).await;
        assert_eq!((r.status, r.result()), (401, "unauthorized"), "{r:?}");
        // PayPal's retry of the genuine delivery (same headers, same body).
        let r = post(&app, "paypal", &headers, &genuine).await;
        assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
        assert_eq!(
            app.metric(
                "fencehook_requests_rejected_total",
                &[("reason", "transmission_reused")]
            ),
            3.0
        );
        assert_eq!(ctx.payments().await, 1, "inbox: {inbox}");
        assert_eq!(
            ctx.count(
                "SELECT amount_minor FROM payments WHERE transaction_id = 'CAPTURE-GENUINE-10'"
            )
            .await,
            1000,
            "inbox: {inbox}"
        );
        if inbox {
            assert_eq!(ctx.count("SELECT count(*) FROM events").await, 1);
        } else {
            assert_eq!(ledger_sum(&ctx).await, 1000);
        }
        assert_eq!(
            ctx.count("SELECT count(*) FROM paypal_transmissions").await,
            1,
            "only the verified, accepted transmission is remembered"
        );
        ctx.assert_audit_clean().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paypal_certificate_fetches_are_bounded_remembered_when_they_fail_and_never_push_out_a_verified_certificate(
) {
    let ctx = TestContext::new().await;
    // Strangers' URLs under the prefix that do serve a certificate (of a key
    // that signed nothing here).
    let strangers = 2 * paypal::CACHE_ENTRIES;
    let stranger_cert = testkeys::certificate(
        UNKNOWN_KEY,
        "0FF1CE",
        "CN=messageverificationcerts.paypal.com",
        0,
        now() as u64 + 86_400,
    );
    let certs = cert_server_with(
        (0..strangers)
            .map(|i| {
                (
                    format!("/v1/notifications/certs/CERT-stranger-{i}"),
                    stranger_cert.clone(),
                )
            })
            .collect(),
    )
    .await;
    let app = Arc::new(ctx.spawn(config(&ctx, &certs.prefix())).await);
    let capture = Arc::new(fixture("paypal/capture_completed.body.json"));
    let r = post(
        &app,
        "paypal",
        &paypal_headers(0, &certs.url(PAYPAL_CERT), &capture),
        &capture,
    )
    .await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    // 40 requests at once, each naming a new slow URL: a few fetches at a
    // time, the rest answered 503 at once.
    let replies = futures_util::future::join_all((0..40).map(|i| {
        let (app, capture, url) = (
            app.clone(),
            capture.clone(),
            certs.url(&format!("CERT-{SLOW}-{i}")),
        );
        async move { post(&app, "paypal", &paypal_headers(0, &url, &capture), &capture).await }
    }))
    .await;
    for r in &replies {
        assert!(matches!(r.status, 401 | 503), "{r:?}");
    }
    let most = certs.open.lock().unwrap().1;
    assert!(
        (1..=paypal::MAX_CONCURRENT_FETCHES).contains(&most),
        "at most {} fetches at once, saw {most}",
        paypal::MAX_CONCURRENT_FETCHES
    );
    // A URL that failed is not fetched again for the next delivery naming it.
    let fetched = (0..40)
        .find(|i| certs.hits(&format!("CERT-{SLOW}-{i}")) == 1)
        .expect("some URL was fetched");
    let url = certs.url(&format!("CERT-{SLOW}-{fetched}"));
    let r = post(&app, "paypal", &paypal_headers(0, &url, &capture), &capture).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(certs.hits(&format!("CERT-{SLOW}-{fetched}")), 1);
    // Twice as many certificates as the cache keeps, none of which any
    // signature verifies with: they push out each other, not PayPal's.
    for i in 0..strangers {
        let url = certs.url(&format!("CERT-stranger-{i}"));
        let r = post(&app, "paypal", &paypal_headers(0, &url, &capture), &capture).await;
        assert_eq!(r.status, 401, "{i}: {r:?}");
        assert_eq!(certs.hits(&format!("CERT-stranger-{i}")), 1);
    }
    let r = post(
        &app,
        "paypal",
        &paypal_headers(0, &certs.url(PAYPAL_CERT), &capture),
        &capture,
    )
    .await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(
        certs.hits(PAYPAL_CERT),
        1,
        "PayPal's certificate stayed cached"
    );
    assert_eq!(ctx.payments().await, 1);
    ctx.assert_audit_clean().await;
}

// ---- PayPal: confirm = "api" --------------------------------------------------

const API_CLIENT_ID: &str = "fencehook-test-client";
const API_CLIENT_SECRET: &str = "fencehook-test-secret";
const API_TOKEN: &str = "A21AAF-fencehook-test-token";

/// PayPal's REST API as far as the confirm mode uses it: an OAuth2 token for
/// the test app's credentials, and the events PayPal knows, by id. Counts
/// tokens issued and fetches by event id; `down` answers every event 500.
struct PaypalApi {
    addr: SocketAddr,
    events: Arc<Mutex<HashMap<String, Value>>>,
    calls: Arc<Mutex<HashMap<String, usize>>>,
    down: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl PaypalApi {
    async fn start() -> PaypalApi {
        use base64::Engine;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let events: Arc<Mutex<HashMap<String, Value>>> = Arc::default();
        let calls: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let down: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{API_CLIENT_ID}:{API_CLIENT_SECRET}"))
        );
        let task = tokio::spawn({
            let (events, calls, down) = (events.clone(), calls.clone(), down.clone());
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (events, calls, down, basic) =
                        (events.clone(), calls.clone(), down.clone(), basic.clone());
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                            let path = req.uri().path().to_owned();
                            *calls.lock().unwrap().entry(path.clone()).or_default() += 1;
                            let auth = req
                                .headers()
                                .get("authorization")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_owned();
                            let (status, body) = if path == "/v1/oauth2/token" {
                                if req.method() == hyper::Method::POST && auth == basic {
                                    (
                                        200,
                                        json!({"access_token": API_TOKEN, "token_type": "Bearer", "expires_in": 32400}),
                                    )
                                } else {
                                    (401, json!({"error": "invalid_client"}))
                                }
                            } else if let Some(id) =
                                path.strip_prefix("/v1/notifications/webhooks-events/")
                            {
                                if auth != format!("Bearer {API_TOKEN}") {
                                    (401, json!({"name": "AUTHENTICATION_FAILURE"}))
                                } else if down.load(std::sync::atomic::Ordering::SeqCst) {
                                    (500, json!({"name": "INTERNAL_SERVICE_ERROR"}))
                                } else {
                                    match events.lock().unwrap().get(id) {
                                        Some(event) => (200, event.clone()),
                                        None => (404, json!({"name": "INVALID_RESOURCE_ID"})),
                                    }
                                }
                            } else {
                                (404, json!({}))
                            };
                            let mut resp =
                                hyper::Response::new(Full::new(Bytes::from(body.to_string())));
                            *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                            async move { Ok::<_, Infallible>(resp) }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            }
        });
        PaypalApi {
            addr,
            events,
            calls,
            down,
            task,
        }
    }

    fn knows(&self, event: &Value) {
        let id = event["id"].as_str().unwrap().to_owned();
        self.events.lock().unwrap().insert(id, event.clone());
    }

    fn fetches(&self, event_id: &str) -> usize {
        let path = format!("/v1/notifications/webhooks-events/{event_id}");
        self.calls.lock().unwrap().get(&path).copied().unwrap_or(0)
    }
}

impl Drop for PaypalApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A PayPal capture event `event_id` of `value` USD, capture `capture_id`.
fn paypal_event(event_id: &str, capture_id: &str, value: &str) -> Value {
    let mut v = paypal_capture(capture_id, value);
    v["id"] = event_id.into();
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn with_confirm_api_a_paypal_event_is_booked_only_as_paypals_api_knows_it() {
    let ctx = TestContext::new().await;
    let certs = cert_server().await;
    let api = PaypalApi::start().await;
    let mut cfg = config(&ctx, &certs.prefix());
    cfg.providers.retain(|p| p.name != "paypal");
    cfg.providers.push(
        Provider::from_toml_str(&format!(
            r#"
[providers.paypal]
scheme = "paypal"
webhook_id = "{WEBHOOK_ID}"
cert_url_prefixes = ["{}"]
confirm = "api"
api_url = "http://{}/"
client_id = "{API_CLIENT_ID}"
client_secret = "{API_CLIENT_SECRET}"
"#,
            certs.prefix(),
            api.addr
        ))
        .unwrap()
        .remove(0),
    );
    let app = ctx.spawn(cfg).await;
    let url = certs.url(PAYPAL_CERT);
    let deliver = |event: &Value| {
        let body = event.to_string().into_bytes();
        (paypal_headers(0, &url, &body), body)
    };
    // A genuine event: confirmed, booked; PayPal's retry is not asked about again.
    let first = paypal_event("WH-CONFIRM-1", "CAP-CONFIRM-1", "10.00");
    api.knows(&first);
    let (h1, b1) = deliver(&first);
    let r = post(&app, "paypal", &h1, &b1).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = post(&app, "paypal", &h1, &b1).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(api.fetches("WH-CONFIRM-1"), 1);
    // A CRC-forged body under the genuine headers that arrives *before* the
    // genuine delivery: PayPal's API knows the event otherwise, so it is
    // refused, and the genuine body can still take the headers.
    let genuine = paypal_event("WH-CONFIRM-2", "CAP-CONFIRM-2", "10.00");
    api.knows(&genuine);
    let (h2, b2) = deliver(&genuine);
    let mut forged = paypal_event("WH-CONFIRM-2", "CAP-CONFIRM-2", "99999.00");
    forged["summary"] = "PAD".into();
    let text = forged.to_string();
    let (prefix, suffix) = text.split_once("PAD").unwrap();
    let forged = crc_forged(prefix.as_bytes(), suffix.as_bytes(), crc32fast::hash(&b2));
    let r = post(&app, "paypal", &h2, &forged).await;
    assert_eq!((r.status, r.result()), (401, "unauthorized"), "{r:?}");
    assert_eq!(ctx.payment("CAP-CONFIRM-2").await, None);
    let r = post(&app, "paypal", &h2, &b2).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    // An event PayPal does not know at all.
    let (h3, b3) = deliver(&paypal_event("WH-CONFIRM-3", "CAP-CONFIRM-3", "10.00"));
    let r = post(&app, "paypal", &h3, &b3).await;
    assert_eq!((r.status, r.result()), (401, "unauthorized"), "{r:?}");
    assert_eq!(
        app.metric(
            "fencehook_requests_rejected_total",
            &[("reason", "event_unconfirmed")]
        ),
        2.0
    );
    // PayPal's API down: 503, and PayPal's retry books once it is back.
    let fourth = paypal_event("WH-CONFIRM-4", "CAP-CONFIRM-4", "10.00");
    api.knows(&fourth);
    let (h4, b4) = deliver(&fourth);
    api.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = post(&app, "paypal", &h4, &b4).await;
    assert_eq!(r.status, 503, "{r:?}");
    api.down.store(false, std::sync::atomic::Ordering::SeqCst);
    let r = post(&app, "paypal", &h4, &b4).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        api.calls.lock().unwrap().get("/v1/oauth2/token").copied(),
        Some(1),
        "one access token, kept"
    );
    assert_eq!(ctx.payments().await, 3);
    assert_eq!(ledger_sum(&ctx).await, 3000);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_paypal_transmission_ids_are_pruned_a_few_at_a_time_by_new_ones() {
    let ctx = TestContext::new().await;
    let certs = cert_server().await;
    let app = ctx.spawn(config(&ctx, &certs.prefix())).await;
    ctx.db()
        .await
        .batch_execute(
            "INSERT INTO paypal_transmissions (provider, transmission_id, body_sha256, expires_at)
             SELECT 'paypal', 'old-' || i, 'x', now() - interval '1 hour' FROM generate_series(1, 20) i;
             INSERT INTO paypal_transmissions (provider, transmission_id, body_sha256, expires_at)
             VALUES ('paypal', 'current', 'y', now() + interval '1 hour')",
        )
        .await
        .unwrap();
    let url = certs.url(PAYPAL_CERT);
    let expired =
        || ctx.count("SELECT count(*) FROM paypal_transmissions WHERE expires_at < now()");
    let mut left = expired().await;
    assert_eq!(left, 20);
    for i in 0..3 {
        let body = paypal_capture(&format!("CAPTURE-PRUNE-{i}"), "1.00")
            .to_string()
            .into_bytes();
        let r = post(&app, "paypal", &paypal_headers(0, &url, &body), &body).await;
        assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
        let now_left = expired().await;
        assert!(now_left < left || now_left == 0, "{now_left} after {left}");
        assert!(left - now_left <= 8, "a bounded prune: {left} → {now_left}");
        left = now_left;
    }
    assert_eq!(left, 0);
    assert_eq!(
        ctx.count("SELECT count(*) FROM paypal_transmissions").await,
        1 + 3,
        "the current row and the three new ones stay"
    );
}
