//! The delivery history (sync and inbox mode): every delivery that reached
//! the fenced path is recorded with its answer, shown by `inspect` and on
//! the console's payment page, kept across restarts, pruned past retention,
//! and never in a delivery's way.

use std::time::Duration;

use fencehook::metrics::DELIVERY_HISTORY_LOST_TOTAL;
use serde_json::{json, Value};

use crate::helpers::console::{Browser, TokenFiles};
use crate::helpers::process::fencehook_binary;
use crate::helpers::{payment, wait_for, TestApp, TestContext};

fn refund(tx: &str, amount: i64, of: &str) -> Value {
    let mut r = payment(tx, amount);
    r["event_type"] = json!("refund.succeeded");
    r["payment_transaction_id"] = json!(of);
    r
}

async fn history_rows(ctx: &TestContext) -> i64 {
    ctx.count("SELECT count(*) FROM delivery_history").await
}

/// The console's payment page as JSON, read with the viewer's token.
async fn payment_json(app: &TestApp, files: &TokenFiles, tx: &str) -> (u16, Value) {
    let bearer = format!("Bearer {}", files.viewer);
    let page = Browser::new(&app.admin)
        .request(
            "GET",
            &format!("/console/payments/generic/{tx}"),
            &[("authorization", &bearer), ("accept", "application/json")],
            "",
        )
        .await;
    let json = if page.status == 200 {
        page.json()
    } else {
        Value::Null
    };
    (page.status, json)
}

async fn inspect(ctx: &TestContext, tx: &str) -> (i32, String) {
    let url = ctx.database_url.clone();
    let (code, out, err) = fencehook_binary(
        &["inspect", "--provider", "generic", "--transaction-id", tx],
        &[("DATABASE_URL", &url)],
    )
    .await;
    (code, format!("{out}{err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_mode_a_refused_refund_is_in_its_payments_history_in_inspect_and_the_console() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    assert_eq!(
        app.deliver(&payment("pay_hist", 1000)).await.result(),
        "processed"
    );
    let r = app.deliver(&refund("re_hist", 1500, "pay_hist")).await;
    assert_eq!((r.status, r.result()), (422, "refund_rejected"), "{r:?}");
    wait_for("both answers recorded", Duration::from_secs(20), || async {
        history_rows(&ctx).await == 2
    })
    .await;

    let (code, out) = inspect(&ctx, "pay_hist").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("  deliveries:\n"), "{out}");
    let lines: Vec<&str> = out.lines().filter(|l| l.contains(" answered ")).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].contains("pay_hist") && lines[0].contains("answered 200 processed"),
        "{out}"
    );
    assert!(
        lines[1].contains("re_hist")
            && lines[1].contains("refund.succeeded")
            && lines[1].contains("answered 422 refund_rejected exceeds_payment")
            && lines[1].contains("(PSP id msg_"),
        "{out}"
    );
    // The refund has no row: its own page is known by its answer.
    let (code, out) = inspect(&ctx, "re_hist").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("answered 422 refund_rejected"), "{out}");

    let (status, page) = payment_json(&app, &files, "pay_hist").await;
    assert_eq!(status, 200);
    let deliveries = page["deliveries"].as_array().expect("deliveries");
    assert_eq!(deliveries.len(), 2, "{page}");
    assert_eq!(deliveries[1]["transaction_id"], "re_hist");
    assert_eq!(deliveries[1]["parent_transaction_id"], "pay_hist");
    assert_eq!(deliveries[1]["status"], 422);
    assert_eq!(deliveries[1]["result"], "refund_rejected");
    assert_eq!(deliveries[1]["reason"], "exceeds_payment");
    let moments: Vec<&str> = page["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["what"] == "delivery")
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(moments.len(), 2, "{page}");
    assert!(
        moments.iter().any(|m| m.starts_with(
            "delivery re_hist refund.succeeded answered 422 refund_rejected exceeds_payment"
        )),
        "{moments:?}"
    );
    let (status, page) = payment_json(&app, &files, "re_hist").await;
    assert_eq!(status, 200, "a refused refund's page is no 404");
    assert_eq!(page["deliveries"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_survives_a_restart_of_the_app() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let first = ctx.spawn(files.enable(ctx.config())).await;
    assert_eq!(
        first.deliver(&payment("pay_restart", 700)).await.result(),
        "processed"
    );
    // A stop writes what the history holds before it returns.
    first.stop().await;
    assert_eq!(history_rows(&ctx).await, 1);

    let second = ctx.spawn(files.enable(ctx.config())).await;
    assert_eq!(
        second.deliver(&payment("pay_restart", 700)).await.result(),
        "duplicate"
    );
    wait_for(
        "the second answer recorded",
        Duration::from_secs(20),
        || async { history_rows(&ctx).await == 2 },
    )
    .await;
    let (status, page) = payment_json(&second, &files, "pay_restart").await;
    assert_eq!(status, 200);
    let results: Vec<&str> = page["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["processed", "duplicate"], "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_old_history_rows_by_hand_and_on_schedule() {
    let ctx = TestContext::new().await;
    let old = |tx: &str, days: i32| {
        format!(
            "INSERT INTO delivery_history (answered_at, provider, transaction_id, event_type, result, status)
             VALUES (now() - interval '{days} days', 'generic', '{tx}', 'payment.succeeded', 'processed', 200)"
        )
    };
    let db = ctx.db().await;
    db.batch_execute(&old("tx_old", 40)).await.unwrap();
    db.batch_execute(&old("tx_fresh", 0)).await.unwrap();
    let url = ctx.database_url.clone();
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("FENCEHOOK_EVENT_RETENTION_DAYS", "30"),
    ];
    let (code, out, err) = fencehook_binary(&["prune", "--dry-run"], &env).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 delivery history row(s)"), "{out}");
    assert_eq!(history_rows(&ctx).await, 2, "a dry run deletes nothing");
    let (code, out, err) = fencehook_binary(&["prune"], &env).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("deleted 0 event(s), 0 quarantined item(s) and 1 delivery history row(s)"),
        "{out}"
    );
    let left: Vec<String> = db
        .query("SELECT transaction_id FROM delivery_history", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["tx_fresh"]);

    // The scheduled prune of `serve` (sync mode) deletes them too.
    db.batch_execute(&old("tx_old_again", 3)).await.unwrap();
    let mut cfg = ctx.config();
    cfg.inbox.retention = Duration::from_secs(86_400);
    cfg.inbox.prune_interval = Some(Duration::from_secs(3600));
    let _app = ctx.spawn(cfg).await;
    wait_for("the scheduled prune", Duration::from_secs(20), || async {
        ctx.count("SELECT count(*) FROM delivery_history WHERE transaction_id = 'tx_old_again'")
            .await
            == 0
    })
    .await;
    assert_eq!(history_rows(&ctx).await, 1, "the fresh row is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_mode_records_each_accepted_delivery() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.inbox_config(1)).await;
    let r = app.deliver(&payment("pay_inbox_hist", 900)).await;
    assert_eq!((r.status, r.result()), (200, "accepted"));
    let r = app.deliver(&payment("pay_inbox_hist", 900)).await;
    assert_eq!(r.result(), "duplicate");
    wait_for("both answers recorded", Duration::from_secs(20), || async {
        history_rows(&ctx).await == 2
    })
    .await;
    let (code, out) = inspect(&ctx, "pay_inbox_hist").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("answered 200 accepted"), "{out}");
    assert!(out.contains("answered 200 duplicate"), "{out}");
}

/// The history is written off the delivery path: when it cannot be written
/// (here: its table is gone), deliveries are answered as always and the
/// rows are counted lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_answered_as_always_when_the_history_cannot_be_written() {
    let ctx = TestContext::new().await;
    ctx.db()
        .await
        .batch_execute("DROP TABLE delivery_history")
        .await
        .unwrap();
    let app = ctx.spawn(ctx.config()).await;
    let r = app.deliver(&payment("pay_no_history", 500)).await;
    assert_eq!((r.status, r.result()), (200, "processed"));
    wait_for("the lost row counted", Duration::from_secs(20), || async {
        app.metric(DELIVERY_HISTORY_LOST_TOTAL, &[]) >= 1.0
    })
    .await;
    // inspect still reads the payment (no history to show).
    let (code, out) = inspect(&ctx, "pay_no_history").await;
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("deliveries:"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_history_off_nothing_is_recorded() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config();
    cfg.delivery_history = false;
    let app = ctx.spawn(cfg).await;
    assert_eq!(
        app.deliver(&payment("pay_off", 500)).await.result(),
        "processed"
    );
    app.stop().await;
    assert_eq!(history_rows(&ctx).await, 0);
}
