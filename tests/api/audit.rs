//! `fencehook audit` records each run (`audit_runs`, V14) and the console's
//! overview shows the last one; on a schema before V14, or a database it may
//! not write, the audit still checks, prints and exits as its checks say.

use serde_json::{json, Value};

use crate::helpers::console::{Browser, TokenFiles};
use crate::helpers::process::fencehook_binary;
use crate::helpers::{payment, TestContext};

/// A refund booked before refunds named their payment, written by hand: a
/// warning of the audit, not a violation.
const LEGACY_REFUND: &str = "\
INSERT INTO payments (provider, transaction_id, kind, event_type, amount_minor, currency,
                      fingerprint, status, fence)
VALUES ('generic', 're_legacy', 'refund', 'refund.succeeded', 200, 'EUR', 'x', 'succeeded', 1);
INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
SELECT id, 'debit', -200, 'EUR', 1 FROM payments WHERE transaction_id = 're_legacy';";

/// A second refund of `pay_audit` written behind the service's back, past
/// the payment's amount (the service would refuse it).
const FORGED_REFUND: &str = "\
INSERT INTO payments (provider, transaction_id, kind, parent_transaction_id, event_type,
                      amount_minor, currency, fingerprint, status, fence)
VALUES ('generic', 're_forged', 'refund', 'pay_audit', 'refund.succeeded', 900, 'EUR', 'x',
        'succeeded', 1);
INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
SELECT id, 'debit', -900, 'EUR', 1 FROM payments WHERE transaction_id = 're_forged';";

/// One good payment and its credit, written by hand (for a schema no
/// service of this release is started on).
const GOOD_PAYMENT: &str = "\
INSERT INTO payments (provider, transaction_id, kind, event_type, amount_minor, currency,
                      fingerprint, status, fence)
VALUES ('generic', 'pay_audit', 'payment', 'payment.succeeded', 1000, 'EUR', 'fp', 'succeeded', 1);
INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
SELECT id, 'credit', 1000, 'EUR', 1 FROM payments WHERE transaction_id = 'pay_audit';";

async fn audit(ctx: &TestContext, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["audit"];
    all.extend_from_slice(args);
    fencehook_binary(&all, &[("DATABASE_URL", &ctx.database_url)]).await
}

/// The run number of an audit's "recorded as run N" line.
fn recorded_run(out: &str) -> i64 {
    let line = out
        .lines()
        .find(|l| l.starts_with("audit: recorded as run "))
        .unwrap_or_else(|| panic!("a recorded line: {out}"));
    line["audit: recorded as run ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn check<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("check {name} in {run}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_audit_run_is_recorded_and_the_overview_shows_the_last_clean_or_violated_and_stale_after_a_day(
) {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    let mut b = Browser::new(&app.admin);
    b.sign_in(&files.viewer).await;

    // Nothing recorded yet: the overview says so, and how to record one.
    let o = b.get_json("/console").await.json();
    assert_eq!(o["audit"]["state"], "never", "{o}");
    assert_eq!(o["audit"]["last_run"], Value::Null);
    let html = b.get("/console").await.text;
    assert!(
        html.contains("no audit has been recorded") && html.contains("records each run"),
        "{html}"
    );

    assert_eq!(
        app.deliver(&payment("pay_audit", 1000)).await.result(),
        "processed"
    );
    let refund = json!({
        "transaction_id": "re_audit", "amount": 300, "currency": "EUR",
        "event_type": "refund.succeeded", "payment_transaction_id": "pay_audit",
    });
    assert_eq!(app.deliver(&refund).await.result(), "processed");
    ctx.db().await.batch_execute(LEGACY_REFUND).await.unwrap();

    let (code, out, err) = audit(&ctx, &[]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().last(), Some("audit: clean"), "{out}");
    assert!(
        out.contains("note: 1 refund(s) were booked before refunds named their payment"),
        "{out}"
    );
    let first = recorded_run(&out);
    assert_eq!(ctx.count("SELECT count(*) FROM audit_runs").await, 1);

    let o = b.get_json("/console").await.json();
    let a = &o["audit"];
    assert_eq!(a["state"], "recorded", "{o}");
    assert_eq!(a["stale"], false);
    let run = &a["last_run"];
    assert_eq!(run["id"], first);
    assert_eq!(run["clean"], true);
    assert_eq!(
        run["payments"], 3,
        "the payment, its refund, the legacy refund"
    );
    assert_eq!(run["ledger_entries"], 3);
    assert_eq!(run["legacy_refunds"], 1);
    assert_eq!(run["over_returned_payments"], 0);
    assert!(run["age_seconds"].as_i64().unwrap() < 3600, "{run}");
    assert_eq!(check(run, "money_out_within_money_in")["violations"], 0);
    assert!(
        run["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["violations"] == 0),
        "{run}"
    );
    let html = b.get("/console").await.text;
    assert!(
        html.contains("badge s-clean") && !html.contains("s-violations"),
        "{html}"
    );
    assert!(
        html.contains("last run finished") && html.contains("seconds ago"),
        "{html}"
    );
    assert!(!html.contains("s-stale"), "{html}");
    assert!(!html.contains("The last audit found violations"), "{html}");

    // A violation planted behind the service's back: the audit exits 1,
    // prints it as before, and the overview shows the check and its count.
    ctx.db().await.batch_execute(FORGED_REFUND).await.unwrap();
    let (code, out, err) = audit(&ctx, &[]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(out.lines().last(), Some("audit: VIOLATIONS FOUND"), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("money_out_within_money_in"))
        .unwrap_or_default();
    assert!(line.contains("VIOLATED (1)"), "{out}");
    let second = recorded_run(&out);
    assert!(second > first);

    let o = b.get_json("/console").await.json();
    let run = &o["audit"]["last_run"];
    assert_eq!(run["id"], second, "{o}");
    assert_eq!(run["clean"], false);
    let violated: Vec<(String, i64)> = run["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["violations"] != 0)
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["violations"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        violated,
        [("money_out_within_money_in".to_owned(), 1)],
        "{run}"
    );
    assert_eq!(run["legacy_refunds"], 1);
    let html = b.get("/console").await.text;
    assert!(
        html.contains("VIOLATIONS") && html.contains("money_out_within_money_in"),
        "{html}"
    );
    assert!(
        html.contains("The last audit found violations"),
        "said at the top: {html}"
    );
    assert!(
        !html.contains("<td class=\"mono\">one_row_per_transaction"),
        "only the violated checks are listed: {html}"
    );

    // A run older than a day is stale.
    ctx.db()
        .await
        .execute(
            "UPDATE audit_runs SET finished_at = now() - interval '25 hours' WHERE id = $1",
            &[&second],
        )
        .await
        .unwrap();
    let o = b.get_json("/console").await.json();
    assert_eq!(o["audit"]["stale"], true, "{o}");
    assert!(o["audit"]["last_run"]["age_seconds"].as_i64().unwrap() >= 25 * 3600);
    let html = b.get("/console").await.text;
    assert!(
        html.contains("s-stale")
            && html.contains("older than a day")
            && html.contains("25 hours ago"),
        "{html}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_schema_before_v14_the_audit_checks_prints_and_exits_as_before_and_says_it_did_not_record(
) {
    let ctx = TestContext::at_version(13).await;
    ctx.db().await.batch_execute(GOOD_PAYMENT).await.unwrap();

    let (code, out, err) = audit(&ctx, &[]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.lines().next(),
        Some("audit: 1 payments, 1 ledger entries")
    );
    assert_eq!(out.lines().last(), Some("audit: clean"), "{out}");
    assert!(!out.contains("recorded as run"), "{out}");
    assert_eq!(
        err.trim(),
        "audit: not recorded: the schema has no audit_runs table (migration V14); run `fencehook migrate`",
        "one line says why"
    );
    // The lines are those of a run that does not record, but for that line.
    let (_, read_only, _) = audit(&ctx, &["--no-record"]).await;
    assert_eq!(
        read_only.replace("audit: not recorded (--no-record)\n", ""),
        out
    );

    ctx.db().await.batch_execute(FORGED_REFUND).await.unwrap();
    let (code, out, err) = audit(&ctx, &[]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("VIOLATED"), "{out}");
    assert_eq!(out.lines().last(), Some("audit: VIOLATIONS FOUND"));
    assert!(err.contains("not recorded"), "{err}");
    assert_eq!(
        ctx.count("SELECT count(*) FROM pg_tables WHERE tablename = 'audit_runs'")
            .await,
        0
    );

    // The console on that schema says where the record would be.
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    let mut b = Browser::new(&app.admin);
    b.sign_in(&files.viewer).await;
    let o = b.get_json("/console").await.json();
    assert_eq!(o["audit"]["state"], "not_migrated", "{o}");
    assert!(b.get("/console").await.text.contains("migration V14"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_database_it_may_not_write_the_audit_exits_as_its_checks_say_and_says_why_it_did_not_record(
) {
    let ctx = TestContext::new().await;
    ctx.db().await.batch_execute(GOOD_PAYMENT).await.unwrap();
    // Every new session of this database is read-only, as on a standby.
    ctx.db()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            ctx.db_name
        ))
        .await
        .unwrap();
    let (code, out, err) = audit(&ctx, &[]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().last(), Some("audit: clean"), "{out}");
    assert!(
        err.starts_with("audit: not recorded: ") && err.contains("read-only"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(ctx.count("SELECT count(*) FROM audit_runs").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_keeps_the_newest_hundred_runs_and_no_record_writes_none() {
    let ctx = TestContext::new().await;
    // 150 older runs, as a timer would have left them.
    ctx.db()
        .await
        .batch_execute(
            "INSERT INTO audit_runs (finished_at, duration_ms, clean, checks, over_returned_payments,
                                     legacy_refunds, payments, ledger_entries, host, version)
             SELECT now() - make_interval(hours => 151 - n), 5, true, '[]', 0, 0, 0, 0, 'old', '0.0.0'
               FROM generate_series(1, 150) AS n",
        )
        .await
        .unwrap();
    let (code, out, err) = audit(&ctx, &[]).await;
    assert_eq!(code, 0, "{out}{err}");
    let id = recorded_run(&out);
    let db = ctx.db().await;
    let row = db
        .query_one(
            "SELECT count(*), min(id), max(id), count(*) FILTER (WHERE host = 'old') FROM audit_runs",
            &[],
        )
        .await
        .unwrap();
    let (count, min, max, old): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(count, 100);
    assert_eq!(max, id, "the run just recorded is kept");
    assert_eq!(min, id - 99, "the newest hundred: the oldest 51 deleted");
    assert_eq!(old, 99);

    let (code, out, err) = audit(&ctx, &["--no-record"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("audit: not recorded (--no-record)"), "{out}");
    assert!(err.is_empty(), "{err}");
    assert_eq!(ctx.count("SELECT count(*) FROM audit_runs").await, 100);
    assert_eq!(ctx.count("SELECT max(id) FROM audit_runs").await, id);
}

/// The audit is a command, so an alert cannot see it fail or stop running
/// unless serve exports what its newest recorded run found: at zero from
/// start while none is recorded, read at start (no scrape or call needed),
/// and read again by the upkeep (here: the read it makes every minute, made
/// at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_exports_the_time_and_violations_of_the_newest_recorded_audit_run() {
    use fencehook::metrics::{AUDIT_LAST_RUN_TIMESTAMP_SECONDS, AUDIT_VIOLATIONS};
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let (_, exposition) = app.get_admin("/metrics").await;
    for name in [AUDIT_LAST_RUN_TIMESTAMP_SECONDS, AUDIT_VIOLATIONS] {
        assert!(
            exposition.lines().any(|l| l == format!("{name} 0")),
            "{name} exported at 0 while no run is recorded:\n{exposition}"
        );
    }
    app.stop().await;

    let app = ctx.spawn(ctx.config()).await;
    assert_eq!(
        app.deliver(&payment("pay_audit", 1000)).await.result(),
        "processed"
    );
    let before = crate::helpers::now();
    let (code, out, err) = audit(&ctx, &[]).await;
    assert_eq!(code, 0, "{out}{err}");
    app.stop().await;
    let app = ctx.spawn(ctx.config()).await;
    crate::helpers::wait_for(
        "the newest run read at start",
        std::time::Duration::from_secs(10),
        || async { app.metric(AUDIT_LAST_RUN_TIMESTAMP_SECONDS, &[]) >= (before - 5) as f64 },
    )
    .await;
    assert_eq!(app.metric(AUDIT_VIOLATIONS, &[]), 0.0);

    ctx.db().await.batch_execute(FORGED_REFUND).await.unwrap();
    let (code, out, err) = audit(&ctx, &[]).await;
    assert_eq!(code, 1, "the forged refund is a violation: {out}{err}");
    app.state.health.read_last_audit().await;
    assert!(
        app.metric(AUDIT_VIOLATIONS, &[]) >= 1.0,
        "{}",
        app.get_admin("/metrics").await.1
    );
}
