//! Money out for finance (`fencehook export ledger`: its totals equal the
//! audit's sums) and personal data out on request (`fencehook erase`: the
//! bodies go, the rows, fingerprints and ledger stay, the erasure is
//! recorded once).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::console::{Browser, TokenFiles};
use crate::helpers::process::fencehook_binary;
use crate::helpers::{payment, wait_for, TestContext};

async fn run(ctx: &TestContext, args: &[&str]) -> (i32, String, String) {
    fencehook_binary(args, &[("DATABASE_URL", &ctx.database_url)]).await
}

/// The audit's "ledger sums" line, as currency → net minor units.
async fn audit_sums(ctx: &TestContext) -> BTreeMap<String, i128> {
    let (code, out, err) = run(ctx, &["audit", "--no-record"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("audit: ledger sums (minor units): "))
        .unwrap_or_else(|| panic!("a ledger sums line: {out}"));
    line.split(", ")
        .map(|part| {
            let mut words = part.split(' ');
            let currency = words.next().unwrap().to_owned();
            (currency, words.next().unwrap().parse().unwrap())
        })
        .collect()
}

fn json_totals(export: &Value) -> BTreeMap<String, i128> {
    export["totals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["currency"].as_str().unwrap().to_owned(),
                i128::from(t["amount_minor"].as_i64().unwrap()),
            )
        })
        .collect()
}

async fn export_json(ctx: &TestContext, args: &[&str]) -> Value {
    let mut all = vec!["export", "ledger", "--format", "json"];
    all.extend_from_slice(args);
    let (code, out, err) = run(ctx, &all).await;
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// A payment of another provider, booked by hand (the test's app knows only
/// `generic`).
const OTHER_PROVIDER: &str = "\
INSERT INTO payments (provider, transaction_id, kind, event_type, amount_minor, currency,
                      fingerprint, status, fence)
VALUES ('other', 'pay_other', 'payment', 'payment.succeeded', 9000, 'USD', 'fp', 'succeeded', 1);
INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
SELECT id, 'credit', 9000, 'USD', 1 FROM payments WHERE transaction_id = 'pay_other';";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_exports_totals_equal_the_audits_sums_and_its_window_and_provider_choose_the_entries(
) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let mut usd = payment("pay_usd", 700);
    usd["currency"] = json!("USD");
    for p in [
        payment("pay_eur", 1000),
        payment("pay_old", 500),
        usd,
        json!({"transaction_id": "re_eur", "amount": 300, "currency": "EUR",
               "event_type": "refund.succeeded", "payment_transaction_id": "pay_eur"}),
    ] {
        assert_eq!(app.deliver(&p).await.result(), "processed", "{p}");
    }
    let db = ctx.db().await;
    db.batch_execute(OTHER_PROVIDER).await.unwrap();
    // pay_old was booked three days ago.
    db.batch_execute(
        "UPDATE ledger_entries SET created_at = now() - interval '3 days'
          WHERE payment_id = (SELECT id FROM payments WHERE transaction_id = 'pay_old')",
    )
    .await
    .unwrap();

    let audit = audit_sums(&ctx).await;
    assert_eq!(
        audit,
        BTreeMap::from([("EUR".to_owned(), 1200), ("USD".to_owned(), 9700)])
    );

    // A window over the whole ledger: the audit's sums, entry by entry.
    let all = export_json(&ctx, &["--since", "30d"]).await;
    assert_eq!(json_totals(&all), audit, "{all}");
    let entries = all["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 5, "{all}");
    let refund = entries
        .iter()
        .find(|e| e["transaction_id"] == "re_eur")
        .unwrap();
    assert_eq!(refund["effect"], "debit");
    assert_eq!(refund["amount_minor"], -300, "money out is negative");
    assert_eq!(refund["parent_transaction_id"], "pay_eur");
    assert!(refund["fence"].as_i64().unwrap() > 0);
    let counts: i64 = all["totals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["entries"].as_i64().unwrap())
        .sum();
    assert_eq!(counts, 5);

    // CSV: the same entries and totals, and the entries add up to the totals.
    let (code, csv, err) = run(&ctx, &["export", "ledger", "--since", "30d"]).await;
    assert_eq!(code, 0, "{csv}{err}");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("record,entry_id,booked_at,provider,transaction_id,parent_transaction_id,effect,amount_minor,currency,fence")
    );
    let (mut summed, mut totals) = (BTreeMap::new(), BTreeMap::new());
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 10, "{line}");
        let amount: i128 = f[7].parse().unwrap();
        match f[0] {
            "entry" => *summed.entry(f[8].to_owned()).or_insert(0) += amount,
            "total" => assert!(totals.insert(f[8].to_owned(), amount).is_none()),
            other => panic!("record {other}: {line}"),
        }
    }
    assert_eq!(summed, audit, "{csv}");
    assert_eq!(totals, audit, "{csv}");

    // The last day only: pay_old's credit is out of the window.
    let day = export_json(&ctx, &["--since", "1d"]).await;
    assert_eq!(
        json_totals(&day),
        BTreeMap::from([("EUR".to_owned(), 700), ("USD".to_owned(), 9700)])
    );
    // Half-open windows: the day before and the last day add up to the whole.
    let until = day["since"].as_str().unwrap();
    let before = export_json(&ctx, &["--since", "30d", "--until", until]).await;
    assert_eq!(
        json_totals(&before),
        BTreeMap::from([("EUR".to_owned(), 500)])
    );

    // One provider.
    let other = export_json(&ctx, &["--since", "30d", "--provider", "other"]).await;
    assert_eq!(other["provider"], "other");
    assert_eq!(
        json_totals(&other),
        BTreeMap::from([("USD".to_owned(), 9000)])
    );
    assert_eq!(other["entries"].as_array().unwrap().len(), 1);

    // An empty window is an export with no entry and no total.
    let none = export_json(&ctx, &["--since", "30d", "--provider", "nobody"]).await;
    assert_eq!(none["entries"], json!([]));
    assert_eq!(none["totals"], json!([]));

    // A window that ends before it starts, or a time that is none, is refused.
    let (code, out, err) = run(
        &ctx,
        &["export", "ledger", "--since", "1h", "--until", "2h"],
    )
    .await;
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("--until") && out.is_empty(), "{err}");
    let (code, _, err) = run(&ctx, &["export", "ledger", "--since", "yesterday"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--since"), "{err}");
}

/// A generic payload carrying the payer's personal data, as PSPs' do.
fn with_payer(mut p: Value, email: &str) -> Value {
    p["customer"] = json!({"name": "Ada Lovelace", "email": email});
    p
}

/// Everything an erasure must not change: the rows (fingerprints and
/// fences included), the ledger, the events' fingerprints and canonical
/// events, as text.
async fn money_and_fingerprints(ctx: &TestContext) -> Vec<String> {
    let db = ctx.db().await;
    let mut out = Vec::new();
    for sql in [
        "SELECT string_agg(p::text, '|' ORDER BY id) FROM payments p",
        "SELECT string_agg(l::text, '|' ORDER BY id) FROM ledger_entries l",
        "SELECT string_agg(id || ' ' || status || ' ' || fingerprint || ' ' || canonical::text, '|' ORDER BY id) FROM events",
        "SELECT string_agg(id || ' ' || item_sha256 || ' ' || times_seen, '|' ORDER BY id) FROM quarantined_items",
    ] {
        let row = db.query_one(sql, &[]).await.unwrap();
        out.push(row.get::<_, Option<String>>(0).unwrap_or_default());
    }
    out
}

async fn stored_containing(ctx: &TestContext, needle: &str) -> i64 {
    let db = ctx.db().await;
    let like = format!("%{needle}%");
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM events WHERE body LIKE $1)
                  + (SELECT count(*) FROM quarantined_items WHERE item LIKE $1)",
            &[&like],
        )
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erase_empties_the_objects_stored_bodies_keeps_rows_fingerprints_and_ledger_and_records_it_once(
) {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.inbox_config(2))).await;
    let mut operator = Browser::new(&app.admin);
    operator.sign_in(&files.operator).await;
    let refund = json!({"transaction_id": "re_pii", "amount": 300, "currency": "EUR",
                        "event_type": "refund.succeeded", "payment_transaction_id": "pay_pii"});
    for p in [
        with_payer(payment("pay_pii", 1000), "ada@example.com"),
        with_payer(refund, "ada@example.com"),
        with_payer(payment("pay_kept", 2000), "grace@example.com"),
    ] {
        assert_eq!(app.deliver(&p).await.result(), "accepted", "{p}");
    }
    wait_for("every event booked", Duration::from_secs(30), || async {
        ctx.count("SELECT count(*) FROM events WHERE status = 'done'")
            .await
            == 3
    })
    .await;
    // An item of a batch quarantined with the payer's data in it.
    ctx.db()
        .await
        .execute(
            "INSERT INTO quarantined_items (provider, transaction_id, reason, item, item_sha256)
             VALUES ('generic', 'pay_pii', 'test', $1, 'sha')",
            &[&with_payer(json!({}), "ada@example.com").to_string()],
        )
        .await
        .unwrap();
    assert_eq!(stored_containing(&ctx, "ada@example.com").await, 3);
    let page = operator.get("/console/payments/generic/pay_pii").await;
    assert!(page.text.contains("ada@example.com"), "{}", page.text);
    let kept = money_and_fingerprints(&ctx).await;
    let sums = audit_sums(&ctx).await;

    let (code, out, err) = run(
        &ctx,
        &[
            "erase",
            "--provider",
            "generic",
            "--transaction-id",
            "pay_pii",
            "--reason",
            "DSAR-17",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("emptied 2 event bodies and 1 quarantined item(s)"),
        "{out}"
    );
    assert!(out.contains("re_pii refund.succeeded"), "{out}");
    assert_eq!(stored_containing(&ctx, "ada@example.com").await, 0);
    assert_eq!(
        stored_containing(&ctx, "Ada Lovelace").await,
        1,
        "pay_kept's"
    );
    assert_eq!(stored_containing(&ctx, "grace@example.com").await, 1);
    assert_eq!(money_and_fingerprints(&ctx).await, kept);
    assert_eq!(audit_sums(&ctx).await, sums);
    // The operator's console shows the payment, its events, and no payer.
    for path in [
        "/console/payments/generic/pay_pii",
        "/console/payments/generic/re_pii",
    ] {
        let page = operator.get(path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(
            !page.text.contains("ada@example.com"),
            "{path}: {}",
            page.text
        );
        assert!(page.text.contains("(erased)"), "{path}: {}", page.text);
    }
    ctx.assert_audit_clean().await;
    let record = ctx
        .db()
        .await
        .query_one(
            "SELECT provider, transaction_id, events, quarantined_items, reason, erased_by, version
               FROM erasures",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(record.get::<_, String>(0), "generic");
    assert_eq!(record.get::<_, String>(1), "pay_pii");
    assert_eq!(record.get::<_, i64>(2), 2);
    assert_eq!(record.get::<_, i64>(3), 1);
    assert_eq!(
        record.get::<_, Option<String>>(4).as_deref(),
        Some("DSAR-17")
    );
    assert_eq!(record.get::<_, String>(5), "postgres");
    assert_eq!(record.get::<_, String>(6), env!("CARGO_PKG_VERSION"));

    // Again: nothing left, nothing written, said so.
    let (code, out, err) = run(
        &ctx,
        &[
            "erase",
            "--provider",
            "generic",
            "--transaction-id",
            "pay_pii",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("nothing left to erase (erased "), "{out}");
    assert_eq!(ctx.count("SELECT count(*) FROM erasures").await, 1);
    assert_eq!(money_and_fingerprints(&ctx).await, kept);

    // A re-sent delivery is still a duplicate: the fingerprint decides.
    let again = app
        .deliver(&with_payer(payment("pay_pii", 1000), "ada@example.com"))
        .await;
    assert_eq!(again.result(), "duplicate", "{again:?}");
    assert_eq!(stored_containing(&ctx, "ada@example.com").await, 0);

    // An object nothing is stored of: exit 1, nothing written.
    let (code, out, err) = run(
        &ctx,
        &[
            "erase",
            "--provider",
            "generic",
            "--transaction-id",
            "pay_nobody",
        ],
    )
    .await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("nothing written"), "{out}");
    // The provider is part of the object's name.
    let (code, _, _) = run(
        &ctx,
        &[
            "erase",
            "--provider",
            "stripe",
            "--transaction-id",
            "pay_kept",
        ],
    )
    .await;
    assert_eq!(code, 1);
    // An empty id: exit 2, nothing written.
    let (code, _, err) = run(
        &ctx,
        &["erase", "--provider", "generic", "--transaction-id", ""],
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--transaction-id"), "{err}");
    assert_eq!(ctx.count("SELECT count(*) FROM erasures").await, 1);
    assert_eq!(stored_containing(&ctx, "grace@example.com").await, 1);
    assert_eq!(money_and_fingerprints(&ctx).await, kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erase_on_a_schema_before_the_erasures_table_writes_nothing_and_says_to_migrate() {
    let ctx = TestContext::at_version(14).await;
    let db = ctx.db().await;
    db.batch_execute(OTHER_PROVIDER).await.unwrap();
    db.execute(
        "INSERT INTO quarantined_items (provider, transaction_id, reason, item, item_sha256)
         VALUES ('other', 'pay_other', 'test', 'ada@example.com', 'sha')",
        &[],
    )
    .await
    .unwrap();
    let (code, out, err) = run(
        &ctx,
        &[
            "erase",
            "--provider",
            "other",
            "--transaction-id",
            "pay_other",
        ],
    )
    .await;
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("nothing written") && err.contains("fencehook migrate"),
        "{err}"
    );
    assert_eq!(stored_containing(&ctx, "ada@example.com").await, 1);
}
