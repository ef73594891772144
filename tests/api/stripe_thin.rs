//! Stripe's thin events over HTTP: a signed `v2.core.event` names its
//! object (`related_object.url`); the service fetches it from Stripe's API
//! (a mock: helpers/mollie_api.rs's `MockApi`) with the provider's
//! `api_key` and books it exactly as the snapshot event of its type.

use std::time::Duration;

use fencehook::config::Config;
use fencehook::providers::{stripe, Provider};
use serde_json::{json, Value};

use crate::helpers::mollie_api::MockApi;
use crate::helpers::process::ServeProcess;
use crate::helpers::psp_http::{self, ledger};
use crate::helpers::{now, psp_sdk, wait_for, Reply, TestApp, TestContext};

const SECRET: &str = "whsec_fencehook_stripe_integration_secret";
/// A restricted key of Stripe's shape that no account has.
const KEY: &str = "rk_test_fencehookThinEvents0123456789";
const PI: &str = "pi_3PqAbC2eZvKYlo2C1aBcDeFg";

fn fixture(name: &str) -> String {
    psp_http::fixture("stripe", name)
}

/// The PaymentIntent of the snapshot fixture, as `GET /v1/payment_intents/{id}` answers it.
fn payment_intent(id: &str, amount: i64) -> Value {
    let event: Value = serde_json::from_str(&fixture("payment_intent.succeeded.json")).unwrap();
    let mut pi = event["data"]["object"].clone();
    pi["id"] = id.into();
    pi["amount"] = amount.into();
    pi["amount_received"] = amount.into();
    pi
}

/// A thin event of `event_type` about the object at `url`.
fn thin(id: &str, event_type: &str, url: &str, context: Option<&str>) -> String {
    json!({
        "id": id,
        "object": "v2.core.event",
        "type": event_type,
        "livemode": false,
        "created": "2026-12-01T10:00:00.000Z",
        "context": context,
        "related_object": {"id": url.rsplit('/').next().unwrap(), "type": "payment_intent", "url": url},
        "reason": {"type": "request", "request": {"id": "req_v2abc", "idempotency_key": "a-key"}}
    })
    .to_string()
}

fn table(api: Option<&MockApi>) -> String {
    let api = api
        .map(|a| format!("api_key = \"{KEY}\"\napi_url = \"{}\"\n", a.url))
        .unwrap_or_default();
    format!("[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"{SECRET}\"]\n{api}")
}

fn config(ctx: &TestContext, api: Option<&MockApi>) -> Config {
    let mut cfg = ctx.config();
    cfg.providers = Provider::from_toml_str(&table(api)).unwrap();
    cfg
}

async fn deliver(app: &TestApp, body: &str) -> Reply {
    let sig = stripe::sign(SECRET, now(), body.as_bytes()).unwrap();
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

#[tokio::test(flavor = "multi_thread")]
async fn a_thin_stripe_event_is_booked_as_the_snapshot_event_of_its_type_with_the_fetched_object() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, Some(&api))).await;
    api.put(
        &format!("/v1/payment_intents/{PI}"),
        payment_intent(PI, 4999),
    );
    let event = thin(
        "evt_thin_1",
        "v1.payment_intent.succeeded",
        &format!("/v1/payment_intents/{PI}"),
        None,
    );
    let r = deliver(&app, &event).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await,
        vec![(PI.to_owned(), "credit".to_owned(), 4999, "EUR".to_owned())]
    );
    let fetched = api.requests();
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].path, format!("/v1/payment_intents/{PI}"));
    assert_eq!(
        fetched[0].headers["authorization"],
        format!("Bearer {KEY}").as_str()
    );
    assert!(!fetched[0].headers.contains_key("stripe-context"));
    // Stripe retries it: a duplicate. The snapshot event of the same
    // payment (another delivery shape) is the same payment: a duplicate too.
    let r = deliver(&app, &event).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    let r = deliver(&app, &fixture("payment_intent.succeeded.json")).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    // An event about a connected account's object: fetched in its context,
    // by an absolute URL on api_url's own origin.
    let connected = "pi_3ConnectedAccount0001";
    api.put(
        &format!("/v1/payment_intents/{connected}"),
        payment_intent(connected, 1200),
    );
    let event = thin(
        "evt_thin_2",
        "v1.payment_intent.succeeded",
        &format!("{}/v1/payment_intents/{connected}", api.url),
        Some("acct_1Connected000001"),
    );
    let r = deliver(&app, &event).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let last = api.requests().pop().unwrap();
    assert_eq!(last.headers["stripe-context"], "acct_1Connected000001");
    assert_eq!(ctx.entries().await, 2);
    // Each thin delivery fetched once, its retry too (what a copy is, the
    // fetched object says).
    assert_eq!(
        app.metric(
            "fencehook_fetches_total",
            &[("provider", "stripe"), ("result", "ok")]
        ),
        3.0
    );
    // The delivery history keeps the thin event's id as the PSP's event id.
    wait_for("the history rows", Duration::from_secs(10), || async {
        ctx.count("SELECT count(*) FROM delivery_history WHERE psp_event_id = 'evt_thin_2'")
            .await
            == 1
    })
    .await;
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thin_event_the_mapping_does_not_book_is_ignored_and_a_foreign_url_refused_both_without_a_fetch(
) {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, Some(&api))).await;
    for event_type in [
        "v1.customer.created",
        "v2.core.account.updated",
        "v1.billing.meter.error_report_triggered",
    ] {
        let r = deliver(
            &app,
            &thin("evt_thin_ig", event_type, "/v1/customers/cus_1", None),
        )
        .await;
        assert_eq!(
            (r.status, r.result()),
            (200, "ignored"),
            "{event_type}: {r:?}"
        );
    }
    let other_port = api.url.rsplit_once(':').unwrap().0.to_owned() + ":1";
    for url in [
        "https://evil.example/v1/payment_intents/pi_1".to_owned(),
        "//evil.example/v1/payment_intents/pi_1".to_owned(),
        format!("{other_port}/v1/payment_intents/pi_1"),
        format!("{}.evil.example/v1/payment_intents/pi_1", api.url),
        format!("{}@evil.example/v1/payment_intents/pi_1", api.url),
        "/v1/payment_intents/../../admin".to_owned(),
        "v1/payment_intents/pi_1".to_owned(),
    ] {
        let r = deliver(
            &app,
            &thin("evt_thin_far", "v1.payment_intent.succeeded", &url, None),
        )
        .await;
        assert_eq!(
            (r.status, r.result()),
            (400, "invalid_payload"),
            "{url}: {r:?}"
        );
    }
    // Badly signed: 401, nothing fetched either.
    let body = thin(
        "evt_thin_bad",
        "v1.payment_intent.succeeded",
        "/v1/payment_intents/pi_1",
        None,
    );
    let sig = stripe::sign(
        "whsec_fencehook_stripe_secret_before_the_roll",
        now(),
        body.as_bytes(),
    )
    .unwrap();
    let r = app
        .post(
            "/webhooks/stripe",
            &[
                ("content-type", "application/json"),
                ("stripe-signature", &sig),
            ],
            body.into_bytes(),
        )
        .await;
    assert_eq!(r.status, 401, "{r:?}");
    assert!(api.requests().is_empty(), "{:?}", api.requests());
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stripes_api_down_or_not_knowing_the_object_is_503_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, Some(&api))).await;
    let event = thin(
        "evt_thin_down",
        "v1.payment_intent.succeeded",
        &format!("/v1/payment_intents/{PI}"),
        None,
    );
    // Not there (another account or mode than the key's): 503, Stripe retries.
    let r = deliver(&app, &event).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    api.put(
        &format!("/v1/payment_intents/{PI}"),
        payment_intent(PI, 4999),
    );
    api.fail_with(Some(500));
    let r = deliver(&app, &event).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    ctx.assert_nothing_written().await;
    api.fail_with(None);
    let r = deliver(&app, &event).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn in_inbox_mode_a_thin_event_is_accepted_and_booked_once() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let mut cfg = config(&ctx, Some(&api));
    cfg.inbox = ctx.inbox_config(2).inbox;
    let app = ctx.spawn(cfg).await;
    api.put(
        &format!("/v1/payment_intents/{PI}"),
        payment_intent(PI, 4999),
    );
    let event = thin(
        "evt_thin_inbox",
        "v1.payment_intent.succeeded",
        &format!("/v1/payment_intents/{PI}"),
        None,
    );
    let r = deliver(&app, &event).await;
    assert_eq!((r.status, r.result()), (200, "accepted"), "{r:?}");
    wait_for("the workers booked it", Duration::from_secs(30), || async {
        ctx.entries().await == 1
    })
    .await;
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE psp_event_id = 'evt_thin_inbox'")
            .await,
        1
    );
    let r = deliver(&app, &event).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
}

/// Without `api_key` a thin event that would book is 503 and the log says
/// what to set; the key added and the file reloaded (SIGHUP), Stripe's
/// retry books it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_api_key_a_thin_event_is_503_naming_the_setting_until_a_key_is_added_and_reloaded(
) {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    api.put(
        &format!("/v1/payment_intents/{PI}"),
        payment_intent(PI, 4999),
    );
    let dir = std::env::temp_dir().join(format!("fencehook-thin-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    std::fs::write(&file, table(None)).unwrap();
    let env = vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_PROVIDERS", file.display().to_string()),
    ];
    let p = ServeProcess::start(&env).await;
    let event = thin(
        "evt_thin_nokey",
        "v1.payment_intent.succeeded",
        &format!("/v1/payment_intents/{PI}"),
        None,
    );
    let post = |body: String| {
        let base = p.base.clone();
        async move {
            let sig = stripe::sign(SECRET, now(), body.as_bytes()).unwrap();
            let req = hyper::Request::post(format!("{base}/webhooks/stripe"))
                .header("content-type", "application/json")
                .header("stripe-signature", sig)
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap();
            crate::helpers::client()
                .request(req)
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(post(event.clone()).await, 503);
    // A type it does not book needs no key: ignored.
    assert_eq!(
        post(thin(
            "evt_thin_cus",
            "v1.customer.created",
            "/v1/customers/cus_1",
            None
        ))
        .await,
        200
    );
    wait_for("the 503 logged", Duration::from_secs(10), || async {
        !p.log_lines("api_key").is_empty()
    })
    .await;
    let line = p.log_lines("api_key").remove(0);
    assert!(line.contains("stripe") && line.contains("503"), "{line}");
    assert!(api.requests().is_empty());
    ctx.assert_nothing_written().await;
    std::fs::write(&file, table(Some(&api))).unwrap();
    p.signal("HUP");
    wait_for(
        "the key in force books the retry",
        Duration::from_secs(10),
        || async { post(event.clone()).await == 200 },
    )
    .await;
    assert_eq!(ctx.entries().await, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn stripes_own_sdk_reads_the_thin_event_and_fetches_the_object_the_service_fetches() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, Some(&api))).await;
    api.put(
        &format!("/v1/payment_intents/{PI}"),
        payment_intent(PI, 4999),
    );
    let event = thin(
        "evt_thin_sdk",
        "v1.payment_intent.succeeded",
        &format!("/v1/payment_intents/{PI}"),
        Some("acct_1Connected000001"),
    );
    let sig = stripe::sign(SECRET, now(), event.as_bytes()).unwrap();
    let (url, sdk_sig, body) = (api.url.clone(), sig.clone(), event.clone());
    let out = tokio::task::spawn_blocking(move || {
        psp_sdk::run(
            "stripe_thin.py",
            &["fetch", &url, KEY, SECRET, &sdk_sig],
            body.as_bytes(),
        )
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read["id"], "evt_thin_sdk");
    assert_eq!(read["type"], "v1.payment_intent.succeeded");
    assert_eq!(read["object_id"], PI);
    assert_eq!(read["amount_received"], 4999);
    let by_sdk = api.requests().pop().unwrap();
    // The service fetches the same object, in the same context.
    let r = deliver(&app, &event).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let by_service = api.requests().pop().unwrap();
    assert_eq!(by_service.path, by_sdk.path);
    assert_eq!(
        by_service.headers["stripe-context"],
        by_sdk.headers["stripe-context"]
    );
    assert_eq!(
        by_service.headers["authorization"],
        by_sdk.headers["authorization"]
    );
    assert_eq!(
        ledger(&ctx).await,
        vec![(PI.to_owned(), "credit".to_owned(), 4999, "EUR".to_owned())]
    );
}
