//! The operator console in a real browser: headless Chromium through
//! chromedriver (see helpers/browser.rs; `make tools` installs both). What
//! an operator does at 3 a.m.: sign in, search, open a payment with its
//! refunds, open the dead events, replay one and see it booked, once, even
//! when a stale page's button is clicked again; and what a viewer and a
//! forged cross-origin form cannot do. The screenshots of the README and
//! docs/console.md are taken here (target/console-screenshots/).

use std::time::Duration;

use fantoccini::Locator;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::browser::Chrome;
use crate::helpers::console::TokenFiles;
use crate::helpers::downstream::MockDownstream;
use crate::helpers::{payment, wait_for, TestApp, TestContext};

/// An inbox-mode app with the console on: `pay_1042` (€100.00) with two
/// refunds booked, and `pay_1043` dead (its downstream failed), the
/// downstream failing until the test says otherwise.
async fn a_night_on_call(ctx: &TestContext, files: &TokenFiles) -> (TestApp, MockDownstream) {
    let downstream = MockDownstream::start().await;
    let mut cfg = files.enable(ctx.inbox_config(1));
    cfg.downstream_url = Some(downstream.url());
    cfg.inbox.max_attempts = 1;
    let app = ctx.spawn(cfg).await;
    let refund = |tx: &str, amount: i64| {
        json!({"transaction_id": tx, "payment_transaction_id": "pay_1042", "amount": amount,
               "currency": "EUR", "event_type": "refund.succeeded"})
    };
    for p in [
        payment("pay_1041", 2500),
        payment("pay_1042", 10000),
        refund("re_1042_a", 2050),
        refund("re_1042_b", 1000),
    ] {
        assert_eq!(app.deliver(&p).await.result(), "accepted");
    }
    wait_for(
        "the payment and its refunds booked",
        Duration::from_secs(30),
        || async {
            ctx.count("SELECT count(*) FROM payments WHERE status = 'succeeded'")
                .await
                == 4
        },
    )
    .await;
    downstream.set_status(503);
    assert_eq!(
        app.deliver(&payment("pay_1043", 4200)).await.result(),
        "accepted"
    );
    wait_for("pay_1043 dead", Duration::from_secs(30), || async {
        ctx.count("SELECT count(*) FROM events WHERE status = 'dead'")
            .await
            == 1
    })
    .await;
    (app, downstream)
}

async fn sign_in(chrome: &Chrome, admin: &str, token: &str) {
    let c = &chrome.client;
    chrome.goto(&format!("{admin}/console")).await;
    assert_eq!(
        chrome.path().await,
        "/console/login",
        "no session: the sign-in page"
    );
    chrome.fill("input#token", token).await;
    chrome.click(Locator::Css("button[type=submit]")).await;
    if c.wait()
        .for_element(Locator::Css("header nav"))
        .await
        .is_err()
    {
        panic!(
            "not signed in: at {} showing {}",
            chrome.path().await,
            chrome.text().await
        );
    }
    assert_eq!(chrome.path().await, "/console");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_finds_a_payment_with_refunds_and_replays_a_dead_event_which_is_booked_once() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let (app, downstream) = a_night_on_call(&ctx, &files).await;
    let chrome = Chrome::start().await;
    let c = &chrome.client;
    sign_in(&chrome, &app.admin, &files.operator).await;
    let overview = chrome.text().await;
    assert!(
        overview.contains("signed in as operator") && overview.contains("Inbox dead"),
        "{overview}"
    );
    chrome.screenshot("overview").await;

    // Search by a prefix of the id, then open the payment.
    chrome.click(Locator::LinkText("Payments")).await;
    chrome.fill("input[name=transaction_id]", "pay_104").await;
    chrome.click(Locator::Css("form.filters button")).await;
    chrome.wait_for(Locator::LinkText("pay_1042")).await;
    let results = chrome.text().await;
    assert!(
        results.contains("pay_1041") && results.contains("pay_1043"),
        "{results}"
    );
    assert!(
        !results.contains("re_1042_a"),
        "refund ids do not start with the prefix"
    );
    chrome.screenshot("search").await;
    chrome.click(Locator::LinkText("pay_1042")).await;
    chrome.wait_for(Locator::Css("ol.timeline")).await;
    let page = chrome.text().await;
    for shown in [
        "100.00 EUR",
        "re_1042_a",
        "re_1042_b",
        "out so far 30.50 EUR of 100.00 EUR",
        "lease token",
        "refunded or disputed (net)".to_uppercase().as_str(),
    ] {
        assert!(
            page.to_uppercase().contains(&shown.to_uppercase()),
            "{shown} in {page}"
        );
    }
    assert!(!page.contains("10000 EUR"));
    // Tall enough for the README's picture to reach the timeline.
    c.set_window_size(1280, 1560).await.unwrap();
    chrome.screenshot("payment").await;
    c.set_window_size(1280, 1000).await.unwrap();
    // A refund links back to its payment.
    chrome.click(Locator::LinkText("re_1042_a")).await;
    chrome.wait_for(Locator::LinkText("pay_1042")).await;

    // The dead events, grouped by their error; a second window keeps the
    // page (and its Replay button) as it is now.
    chrome.click(Locator::LinkText("Dead events")).await;
    chrome.wait_for(Locator::Css("button.replay")).await;
    let dead = chrome.text().await;
    assert!(
        dead.contains("pay_1043") && dead.contains("DEAD EVENTS BY LAST ERROR"),
        "{dead}"
    );
    chrome.screenshot("dead-events").await;
    let first = c.window().await.unwrap();
    let stale = c.new_window(false).await.unwrap().handle;
    c.switch_to_window(stale.clone()).await.unwrap();
    chrome
        .goto(&format!("{}/console/events?status=dead", app.admin))
        .await;
    chrome.wait_for(Locator::Css("table button.replay")).await;
    c.switch_to_window(first).await.unwrap();

    downstream.set_status(200);
    chrome.click(Locator::Css("table button.replay")).await;
    chrome.wait_for(Locator::Css("p.notice")).await;
    assert_eq!(
        chrome.path().await,
        "/console/events?status=dead&replayed=1",
        "back to the list it was asked from"
    );
    assert!(chrome.text().await.contains("1 dead event(s) re-queued"));
    wait_for("pay_1043 booked", Duration::from_secs(30), || async {
        matches!(ctx.payment("pay_1043").await, Some((s, _)) if s == "succeeded")
    })
    .await;
    chrome
        .goto(&format!("{}/console/payments/generic/pay_1043", app.admin))
        .await;
    chrome
        .wait_for(Locator::Css("span.badge.s-succeeded"))
        .await;
    let booked = chrome.text().await;
    assert!(
        booked.contains("credit") && booked.contains("42.00 EUR"),
        "{booked}"
    );
    chrome.screenshot("replayed").await;

    // The stale page's button, clicked after the booking: nothing again.
    c.switch_to_window(stale).await.unwrap();
    chrome.click(Locator::Css("table button.replay")).await;
    chrome.wait_for(Locator::Css("p.notice")).await;
    assert!(chrome.text().await.contains("0 dead event(s) re-queued"));
    let entries = ctx
        .count("SELECT count(*) FROM ledger_entries l JOIN payments p ON p.id = l.payment_id WHERE p.transaction_id = 'pay_1043'")
        .await;
    assert_eq!(entries, 1, "booked exactly once");
    chrome.close().await;
}

/// A page on another origin (another port of the same host: the same
/// site, so a SameSite=Strict cookie still goes along) with a form that
/// posts a replay to the console, as an attacker's page would.
async fn forger(target: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let target = target.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let page = format!(
                    "<!doctype html><title>prize</title><form method=post action=\"{target}\">\
                     <input type=hidden name=csrf value=guessed><button id=win type=submit>Claim</button></form>"
                );
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_viewer_sees_no_replay_button_and_a_forged_cross_origin_post_is_refused() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let (app, _downstream) = a_night_on_call(&ctx, &files).await;
    let id: i64 = ctx
        .db()
        .await
        .query_one("SELECT id FROM events WHERE status = 'dead'", &[])
        .await
        .unwrap()
        .get(0);

    let chrome = Chrome::start().await;
    let c = &chrome.client;
    sign_in(&chrome, &app.admin, &files.viewer).await;
    chrome
        .goto(&format!("{}/console/events?status=dead", app.admin))
        .await;
    let dead = chrome.text().await;
    assert!(
        dead.contains("pay_1043"),
        "the viewer sees the dead event: {dead}"
    );
    assert!(
        c.find_all(Locator::Css("button.replay"))
            .await
            .unwrap()
            .is_empty(),
        "but no replay button"
    );
    assert!(c
        .find_all(Locator::Css("form[action*='replay']"))
        .await
        .unwrap()
        .is_empty());
    chrome
        .goto(&format!("{}/console/payments/generic/pay_1043", app.admin))
        .await;
    assert!(
        !chrome.text().await.contains("Stored bodies"),
        "and no raw body"
    );
    chrome.close().await;

    // An operator, signed in, lured to another origin's page.
    let chrome = Chrome::start().await;
    sign_in(&chrome, &app.admin, &files.operator).await;
    let evil = forger(format!("{}/console/events/{id}/replay", app.admin)).await;
    chrome.goto(&evil).await;
    chrome.click(Locator::Id("win")).await;
    chrome.wait_for(Locator::Css("p.error")).await;
    let refused = chrome.text().await;
    assert!(
        refused.contains("403") && refused.contains("another origin"),
        "{refused}"
    );
    let status: String = ctx
        .db()
        .await
        .query_one("SELECT status::text FROM events WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "dead", "nothing changed");
    chrome.close().await;
}
