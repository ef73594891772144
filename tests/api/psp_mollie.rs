//! Mollie over HTTP: a notification names a payment (`id=tr_…`, no
//! signature), the service fetches it and its refunds from Mollie's API (a
//! mock: helpers/mollie_api.rs) and books what the API says, exactly once;
//! the fetches stay within `max_fetches_in_flight` whatever a stranger posts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencehook::config::Config;
use fencehook::providers::Provider;

use crate::helpers::mollie_api::MockApi;
use crate::helpers::psp_http::{ledger, s};
use crate::helpers::{psp_sdk, wait_for, Reply, TestApp, TestContext};

/// The suite's Mollie API key (a test key no Mollie account has).
const KEY: &str = "test_fencehookIntegrationKey0123456789";

fn config_with(ctx: &TestContext, api: &MockApi, extra: &str) -> Config {
    let mut cfg = ctx.config();
    cfg.providers = Provider::from_toml_str(&format!(
        "[providers.mollie]\nscheme = \"mollie\"\napi_key = \"{KEY}\"\napi_url = \"{}\"\n{extra}",
        api.url
    ))
    .unwrap();
    cfg
}

fn config(ctx: &TestContext, api: &MockApi) -> Config {
    config_with(ctx, api, "")
}

async fn post(app: &TestApp, body: &str) -> Reply {
    app.post(
        "/webhooks/mollie",
        &[("content-type", "application/x-www-form-urlencoded")],
        body.as_bytes().to_vec(),
    )
    .await
}

/// What Mollie posts about payment `id`.
async fn notify(app: &TestApp, id: &str) -> Reply {
    post(app, &format!("id={id}")).await
}

/// (transaction_id, kind, parent, event_type, amount, currency, status) of
/// every row, by transaction id (a notification's items are booked side by side).
async fn rows(
    ctx: &TestContext,
) -> Vec<(String, String, Option<String>, String, i64, String, String)> {
    ctx.db()
        .await
        .query(
            "SELECT transaction_id, kind, parent_transaction_id, event_type, amount_minor, currency, status \
             FROM payments ORDER BY transaction_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)))
        .collect()
}

fn fetches(app: &TestApp, result: &str) -> f64 {
    app.metric(
        "fencehook_fetches_total",
        &[("provider", "mollie"), ("result", result)],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn each_mollie_payment_status_is_booked_as_mollies_api_says_and_a_repeat_is_a_duplicate() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, &api)).await;
    // Nothing moved yet: 200 ignored, nothing written.
    for (id, status) in [
        ("tr_open1", "open"),
        ("tr_pending1", "pending"),
        ("tr_authorized1", "authorized"),
    ] {
        api.mollie_payment(id, status, "10.00", "EUR");
        let r = notify(&app, id).await;
        assert_eq!((r.status, r.result()), (200, "ignored"), "{status}: {r:?}");
    }
    ctx.assert_nothing_written().await;
    // Settled: booked at the fetched amount, converted exactly.
    api.mollie_payment("tr_paid1", "paid", "1234.56", "EUR");
    api.mollie_payment("tr_yen1", "paid", "1500", "JPY");
    api.mollie_payment("tr_failed1", "failed", "10.00", "EUR");
    api.mollie_payment("tr_canceled1", "canceled", "10.00", "EUR");
    api.mollie_payment("tr_expired1", "expired", "10.00", "EUR");
    for id in [
        "tr_paid1",
        "tr_yen1",
        "tr_failed1",
        "tr_canceled1",
        "tr_expired1",
    ] {
        let r = notify(&app, id).await;
        assert_eq!((r.status, r.result()), (200, "processed"), "{id}: {r:?}");
    }
    let failed = |id: &str| {
        (
            s(id),
            s("payment"),
            None,
            s("payment.failed"),
            1000,
            s("EUR"),
            s("failed"),
        )
    };
    assert_eq!(
        rows(&ctx).await,
        vec![
            failed("tr_canceled1"),
            failed("tr_expired1"),
            failed("tr_failed1"),
            (
                s("tr_paid1"),
                s("payment"),
                None,
                s("payment.succeeded"),
                123_456,
                s("EUR"),
                s("succeeded")
            ),
            (
                s("tr_yen1"),
                s("payment"),
                None,
                s("payment.succeeded"),
                1500,
                s("JPY"),
                s("succeeded")
            ),
        ]
    );
    assert_eq!(
        ledger(&ctx).await,
        vec![
            (s("tr_paid1"), s("credit"), 123_456, s("EUR")),
            (s("tr_yen1"), s("credit"), 1500, s("JPY"))
        ]
    );
    // Mollie retries a notification it thinks failed: the same states, a duplicate.
    for id in ["tr_paid1", "tr_failed1"] {
        let r = notify(&app, id).await;
        assert_eq!((r.status, r.result()), (200, "duplicate"), "{id}: {r:?}");
    }
    assert_eq!(ctx.entries().await, 2);
    // Each fetch carried the key; a paid payment's refunds were asked for.
    let requests = api.requests();
    assert!(requests
        .iter()
        .all(|r| r.headers["authorization"] == format!("Bearer {KEY}").as_str()));
    assert_eq!(api.hits("/v2/payments/tr_paid1/refunds"), 2);
    assert_eq!(api.hits("/v2/payments/tr_failed1/refunds"), 0);
    assert_eq!(fetches(&app, "ok"), requests.len() as f64);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mollie_payments_refunds_are_booked_by_their_own_ids_once_settled() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, &api)).await;
    let pay = "tr_WDqYK6vllg";
    api.mollie_payment(pay, "paid", "100.00", "EUR");
    assert_eq!(notify(&app, pay).await.result(), "processed");
    // Three refunds: one settled, one on its way, one canceled before it left.
    api.mollie_refunds(
        pay,
        &[
            ("re_4qqhO89gsT", "refunded", "25.00", "EUR"),
            ("re_onitsway1", "pending", "10.00", "EUR"),
            ("re_canceled1", "canceled", "5.00", "EUR"),
        ],
    );
    let r = notify(&app, pay).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await,
        vec![
            (s(pay), s("credit"), 10_000, s("EUR")),
            (s("re_4qqhO89gsT"), s("debit"), -2500, s("EUR")),
        ]
    );
    let refund_rows: Vec<_> = rows(&ctx)
        .await
        .into_iter()
        .filter(|r| r.1 == "refund")
        .map(|r| (r.0, r.2, r.3, r.6))
        .collect();
    assert_eq!(
        refund_rows,
        vec![
            (
                s("re_4qqhO89gsT"),
                Some(s(pay)),
                s("refund.succeeded"),
                s("succeeded")
            ),
            (
                s("re_canceled1"),
                Some(s(pay)),
                s("refund.failed"),
                s("failed")
            ),
        ]
    );
    // The same notification again: every object a duplicate.
    let r = notify(&app, pay).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    // The refund on its way settles; the booked one fails afterwards (given back).
    api.mollie_refunds(
        pay,
        &[
            ("re_4qqhO89gsT", "failed", "25.00", "EUR"),
            ("re_onitsway1", "refunded", "10.00", "EUR"),
            ("re_canceled1", "canceled", "5.00", "EUR"),
        ],
    );
    let r = notify(&app, pay).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    // Booked side by side: in either order.
    let mut later = ledger(&ctx).await.split_off(2);
    later.sort();
    assert_eq!(
        later,
        [
            (s("re_4qqhO89gsT"), s("refund_reversal"), 2500, s("EUR")),
            (s("re_onitsway1"), s("debit"), -1000, s("EUR")),
        ]
    );
    assert_eq!(
        ctx.count("SELECT sum(amount_minor)::bigint FROM ledger_entries")
            .await,
        9000
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_notification_finding_a_payment_and_its_refunds_books_the_payment_before_them() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, &api)).await;
    // The payment's own notification was lost: the refund's finds both.
    for n in 0..10 {
        let pay = format!("tr_late{n}");
        api.mollie_payment(&pay, "paid", "50.00", "EUR");
        let refunds: Vec<String> = (0..3).map(|i| format!("re_late{n}x{i}")).collect();
        api.mollie_refunds(
            &pay,
            &refunds
                .iter()
                .map(|re| (re.as_str(), "refunded", "5.00", "EUR"))
                .collect::<Vec<_>>(),
        );
        let r = notify(&app, &pay).await;
        assert_eq!((r.status, r.result()), (200, "processed"), "{n}: {r:?}");
    }
    assert_eq!(ctx.payments().await, 40);
    assert_eq!(
        ctx.count("SELECT sum(amount_minor)::bigint FROM ledger_entries")
            .await,
        10 * (5000 - 3 * 500)
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_mollie_id_is_200_ignored_other_objects_are_not_fetched_and_bad_forms_are_400() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, &api)).await;
    let r = notify(&app, "tr_madeup12345").await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    assert_eq!(api.hits("/v2/payments/tr_madeup12345"), 1);
    assert_eq!(fetches(&app, "not_found"), 1.0);
    // An order's or a subscription's notification: nothing booked, nothing fetched.
    for id in ["ord_kEn1PlbGa", "sub_8JfGzs6v3K"] {
        let r = notify(&app, id).await;
        assert_eq!((r.status, r.result()), (200, "ignored"), "{id}: {r:?}");
    }
    // No Mollie id: 400, nothing fetched.
    for body in [
        "id=tr_..%2F..%2Fv2%2Frefunds",
        "id=tr_a%20b",
        "id=",
        "payment=tr_abc",
        "id=tr_a&id=tr_b",
    ] {
        let r = post(&app, body).await;
        assert_eq!(
            (r.status, r.result()),
            (400, "invalid_payload"),
            "{body}: {r:?}"
        );
    }
    // Mollie posts a form: JSON is 415.
    let r = app
        .post(
            "/webhooks/mollie",
            &[("content-type", "application/json")],
            br#"{"id":"tr_abc"}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 415, "{r:?}");
    assert_eq!(api.requests().len(), 1);
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mollies_api_down_refusing_the_key_or_too_slow_is_503_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, &api)).await;
    api.mollie_payment("tr_retry1", "paid", "10.00", "EUR");
    for status in [500, 502, 429, 401] {
        api.fail_with(Some(status));
        let r = notify(&app, "tr_retry1").await;
        assert_eq!(
            (r.status, r.result()),
            (503, "unavailable"),
            "{status}: {r:?}"
        );
        assert!(r.retry_after.is_some(), "{r:?}");
    }
    assert_eq!(fetches(&app, "error"), 4.0);
    api.fail_with(None);
    // Slower than the fetch timeout (5 s): 503 once it runs out.
    api.slow_down(Duration::from_secs(8));
    let started = Instant::now();
    let r = notify(&app, "tr_retry1").await;
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(fetches(&app, "timeout"), 1.0);
    ctx.assert_nothing_written().await;
    // Mollie retries once its API answers again: booked.
    api.slow_down(Duration::ZERO);
    let r = notify(&app, "tr_retry1").await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(ctx.entries().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_made_up_ids_never_has_more_than_max_fetches_in_flight_at_mollies_api() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = Arc::new(
        ctx.spawn(config_with(&ctx, &api, "max_fetches_in_flight = 4"))
            .await,
    );
    // 200 made-up ids at once, each fetch taking 20 ms: four at a time, the
    // rest waiting their turn (well within the fetch timeout).
    api.slow_down(Duration::from_millis(20));
    let flood = |n: usize, tag: &'static str| {
        futures_util::future::join_all((0..n).map(|i| {
            let app = app.clone();
            async move { notify(&app, &format!("tr_{tag}{i}")).await }
        }))
    };
    let replies = flood(200, "madeup").await;
    let answered: Vec<(u16, &str)> = replies.iter().map(|r| (r.status, r.result())).collect();
    assert!(
        answered
            .iter()
            .all(|a| matches!(a, (200, "ignored") | (503, "unavailable"))),
        "{answered:?}"
    );
    let ignored = answered.iter().filter(|a| a.0 == 200).count();
    assert_eq!(
        api.requests().len(),
        ignored,
        "one fetch per notification answered"
    );
    let peak = api.peak_in_flight();
    assert!(
        (1..=4).contains(&peak),
        "at most 4 fetches at once, saw {peak}"
    );
    assert!(
        ignored >= 100,
        "the flood was served, not refused: {ignored} of 200"
    );
    // An API that hangs: the four in flight hold their slots for the whole
    // fetch timeout, every other notification is 503 after waiting as long,
    // and Mollie's API saw a few requests, not fifty (four, and at most four
    // more taken by notifications whose wait ended as the first four gave up).
    let before = api.requests().len();
    api.slow_down(Duration::from_secs(30));
    let replies = flood(50, "stalled").await;
    assert!(replies.iter().all(|r| r.status == 503), "{replies:?}");
    let asked = api.requests().len() - before;
    assert!((4..=8).contains(&asked), "{asked} requests reached the API");
    assert!(fetches(&app, "busy") >= 42.0, "{}", fetches(&app, "busy"));
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_inbox_mode_a_mollie_payment_and_its_refund_are_accepted_and_booked_once() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let mut cfg = config(&ctx, &api);
    cfg.inbox = ctx.inbox_config(2).inbox;
    let app = ctx.spawn(cfg).await;
    let pay = "tr_inbox1";
    api.mollie_payment(pay, "paid", "80.00", "EUR");
    api.mollie_refunds(pay, &[("re_inbox1", "refunded", "30.00", "EUR")]);
    let r = notify(&app, pay).await;
    assert_eq!((r.status, r.result()), (200, "accepted"), "{r:?}");
    wait_for(
        "the workers booked both",
        Duration::from_secs(30),
        || async { ctx.entries().await == 2 },
    )
    .await;
    let r = notify(&app, pay).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    api.mollie_payment("tr_inboxopen", "open", "80.00", "EUR");
    let r = notify(&app, "tr_inboxopen").await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    let r = notify(&app, "tr_inboxunknown").await;
    assert_eq!((r.status, r.result()), (200, "ignored"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await,
        vec![
            (s(pay), s("credit"), 8000, s("EUR")),
            (s("re_inbox1"), s("debit"), -3000, s("EUR")),
        ]
    );
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 2);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mollies_own_client_reads_the_mock_api_as_the_service_books_it() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, &api)).await;
    let pay = "tr_sdk1";
    api.mollie_payment(pay, "paid", "42.10", "EUR");
    api.mollie_refunds(pay, &[("re_sdk1", "refunded", "2.10", "EUR")]);
    let url = api.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        psp_sdk::run("mollie.py", &["read", &url, KEY, pay], b"")
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let read: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        read,
        serde_json::json!({
            "id": pay, "status": "paid", "is_paid": true,
            "amount": {"value": "42.10", "currency": "EUR"},
            "refunds": [{"id": "re_sdk1", "status": "refunded", "amount": {"value": "2.10", "currency": "EUR"}}]
        })
    );
    let r = notify(&app, pay).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(
        ledger(&ctx).await,
        vec![
            (s(pay), s("credit"), 4210, s("EUR")),
            (s("re_sdk1"), s("debit"), -210, s("EUR")),
        ]
    );
    // Mollie's client refuses a key that is not Mollie's shape, as the providers file does.
    let url = api.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        psp_sdk::run("mollie.py", &["read", &url, "sk_test_123", pay], b"")
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fencehook_send_as_mollie_posts_the_form_and_the_service_books_what_the_api_says() {
    let ctx = TestContext::new().await;
    let api = MockApi::start(KEY).await;
    let app = ctx.spawn(config(&ctx, &api)).await;
    api.mollie_payment("tr_send1", "paid", "12.34", "EUR");
    let dir = std::env::temp_dir().join(format!("fencehook-send-mollie-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    std::fs::write(
        &file,
        format!(
            "[providers.mollie]\nscheme = \"mollie\"\napi_key = \"{KEY}\"\napi_url = \"{}\"\n",
            api.url
        ),
    )
    .unwrap();
    let args = [
        "--url",
        &app.base,
        "--provider",
        "mollie",
        "--transaction-id",
        "tr_send1",
    ]
    .map(str::to_owned)
    .to_vec();
    let env = vec![("FENCEHOOK_PROVIDERS".to_owned(), file.display().to_string())];
    let (code, out) = crate::psp_paddle::fencehook_send(args, env).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("200 ") && out.contains("processed"),
        "{out}"
    );
    // The amount is the API's, not send's default.
    assert_eq!(
        ledger(&ctx).await,
        vec![(s("tr_send1"), s("credit"), 1234, s("EUR"))]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
