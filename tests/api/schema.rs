//! The schema's own guard: the rules the database enforces whatever the
//! writer, and the migration that moved the single-column ones into domains.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{payment, wait_for, TestContext};

/// One good payment and its credit, written by hand; each case below breaks
/// one rule of a copy of them.
const GOOD_PAYMENT: &str = "\
INSERT INTO payments (provider, transaction_id, kind, event_type, amount_minor, currency,
                      fingerprint, status, fence)
VALUES ('generic', 'pay_good', 'payment', 'payment.succeeded', 500, 'EUR', 'fp', 'succeeded', 1);
INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
SELECT id, 'credit', 500, 'EUR', 1 FROM payments WHERE transaction_id = 'pay_good';
INSERT INTO events (provider, transaction_id, event_type, delivery_id, fingerprint, canonical, body)
VALUES ('generic', 'pay_good', 'payment.succeeded', 'pay_good:payment.succeeded', 'fp', '{}', '{}');
INSERT INTO leases (provider, transaction_id, token) VALUES ('generic', 'pay_good', 1);";

/// A payments row like the good one but with `column` set to `value`.
fn payment_with(column: &str, value: &str) -> String {
    let mut values = [
        ("transaction_id", "'pay_bad'"),
        ("kind", "'payment'"),
        ("event_type", "'payment.succeeded'"),
        ("amount_minor", "500"),
        ("currency", "'EUR'"),
        ("status", "'succeeded'"),
        ("fence", "1"),
        ("parent_transaction_id", "NULL"),
        ("amount_out_minor", "0"),
    ];
    let slot = values.iter_mut().find(|(c, _)| *c == column).unwrap();
    slot.1 = value;
    let (columns, values): (Vec<&str>, Vec<&str>) = values.into_iter().unzip();
    format!(
        "INSERT INTO payments (provider, fingerprint, {}) VALUES ('generic', 'fp', {})",
        columns.join(", "),
        values.join(", ")
    )
}

#[tokio::test]
async fn the_database_refuses_every_value_its_rules_forbid_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let db = ctx.db().await;
    db.batch_execute(GOOD_PAYMENT).await.unwrap();
    let entry = |effect: &str, amount: &str, currency: &str, fence: &str| {
        format!(
            "INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
             SELECT id, {effect}, {amount}, {currency}, {fence} FROM payments
              WHERE transaction_id = 'pay_good'"
        )
    };
    // (what is written, the constraint that must refuse it)
    let cases: Vec<(String, &str)> = vec![
        (
            payment_with("transaction_id", "''"),
            "psp_transaction_id_length",
        ),
        (
            payment_with("transaction_id", "repeat('x', 256)"),
            "psp_transaction_id_length",
        ),
        (payment_with("kind", "'chargeback'"), "payment_kind_known"),
        (
            payment_with("event_type", "'payment.captured'"),
            "payment_event_type_known",
        ),
        (payment_with("status", "'done'"), "payment_status_known"),
        (payment_with("currency", "'eur'"), "currency_code_iso_4217"),
        (payment_with("currency", "'EURO'"), "currency_code_iso_4217"),
        (
            payment_with("amount_minor", "0"),
            "positive_amount_above_zero",
        ),
        (
            payment_with("amount_minor", "-5"),
            "positive_amount_above_zero",
        ),
        (payment_with("fence", "-1"), "payment_fence_not_negative"),
        (
            payment_with("parent_transaction_id", "'pay_good'"),
            "payments_payment_has_no_parent",
        ),
        (
            payment_with("amount_out_minor", "-1"),
            "payments_amount_out_not_negative",
        ),
        (
            "INSERT INTO payments (provider, fingerprint, transaction_id, kind, parent_transaction_id,
                                   event_type, amount_minor, currency, status, fence, amount_out_minor)
             VALUES ('generic', 'fp', 're_bad', 'refund', 'pay_good', 'refund.succeeded', 100, 'EUR',
                     'succeeded', 1, 50)"
                .into(),
            "payments_only_payments_pay_out",
        ),
        (
            "UPDATE payments SET amount_out_minor = -1 WHERE transaction_id = 'pay_good'".into(),
            "payments_amount_out_not_negative",
        ),
        (
            "UPDATE payments SET reserved = true WHERE transaction_id = 'pay_good'".into(),
            "payments_only_refunds_and_disputes_reserve",
        ),
        (
            "UPDATE payments SET status = 'refunded' WHERE transaction_id = 'pay_good'".into(),
            "payment_status_known",
        ),
        (
            "UPDATE payments SET fence = -2 WHERE transaction_id = 'pay_good'".into(),
            "payment_fence_not_negative",
        ),
        (
            entry("'chargeback'", "-500", "'EUR'", "2"),
            "ledger_effect_known",
        ),
        (
            entry("'debit'", "0", "'EUR'", "2"),
            "signed_amount_not_zero",
        ),
        (
            entry("'debit'", "500", "'EUR'", "2"),
            "ledger_entries_sign_fits_effect",
        ),
        (
            entry("'dispute_reversal'", "-500", "'EUR'", "2"),
            "ledger_entries_sign_fits_effect",
        ),
        (
            entry("'debit'", "-500", "'usd'", "2"),
            "currency_code_iso_4217",
        ),
        (
            entry("'debit'", "-500", "'EUR'", "0"),
            "fencing_token_above_zero",
        ),
        (
            "UPDATE events SET status = 'succeeded'".into(),
            "event_status_known",
        ),
        (
            "UPDATE leases SET token = 0".into(),
            "fencing_token_above_zero",
        ),
    ];
    for (sql, constraint) in &cases {
        let e = db
            .batch_execute(sql)
            .await
            .expect_err(&format!("accepted: {sql}"));
        let db_error = e.as_db_error().expect("a database error");
        assert_eq!(db_error.code().code(), "23514", "{sql}: {db_error}");
        assert_eq!(
            db_error.constraint(),
            Some(*constraint),
            "{sql}: {db_error}"
        );
    }
    for table in ["payments", "ledger_entries", "events", "leases"] {
        let rows = ctx.count(&format!("SELECT count(*) FROM {table}")).await;
        assert_eq!(rows, 1, "{table}: nothing but the good row");
    }
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM payments
              WHERE amount_out_minor = 0 AND status = 'succeeded' AND fence = 1"
        )
        .await,
        1,
        "the good row unchanged"
    );
}

/// Each table's file on disk (`relfilenode`): a rewrite gives it a new one.
async fn table_files(ctx: &TestContext) -> Vec<(String, i64)> {
    ctx.db()
        .await
        .query(
            "SELECT relname::text, pg_relation_filenode(oid::regclass)::int8 FROM pg_class
              WHERE relname IN ('payments', 'ledger_entries', 'events', 'leases') ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn the_domains_migration_keeps_every_row_and_rewrites_no_table() {
    let ctx = TestContext::at_version(7).await;
    ctx.db().await.batch_execute(GOOD_PAYMENT).await.unwrap();
    let before = table_files(&ctx).await;
    assert_eq!(before.len(), 4, "{before:?}");
    let applied = fencehook::store::migrate::run(
        &ctx.database_url,
        fencehook::store::migrate::MissingDatabase::Refuse,
    )
    .await
    .unwrap();
    assert!(applied.iter().any(|m| m.contains("domains")), "{applied:?}");
    assert_eq!(table_files(&ctx).await, before, "a table was rewritten");
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM payments p JOIN ledger_entries l ON l.payment_id = p.id
              WHERE p.transaction_id = 'pay_good' AND p.status = 'succeeded' AND l.effect = 'credit'
                AND l.amount_minor = 500 AND l.currency = 'EUR'"
        )
        .await,
        1
    );
    ctx.assert_audit_clean().await;
    // The rules hold on the migrated database too.
    let e = ctx
        .db()
        .await
        .batch_execute(&payment_with("status", "'done'"))
        .await
        .unwrap_err();
    assert_eq!(
        e.as_db_error().and_then(|d| d.constraint()),
        Some("payment_status_known")
    );
}

/// What lets instances be replaced before the migration (docs/operations.md):
/// this release's statements cast what they bind to the domains' base types,
/// so they run unchanged on the schema before V8, in both modes.
#[tokio::test]
async fn this_release_books_on_the_schema_before_the_domains_in_both_modes() {
    let ctx = TestContext::at_version(7).await;
    let app = ctx.spawn(ctx.config()).await;
    let refund = json!({
        "transaction_id": "re_v7", "amount": 300, "currency": "EUR",
        "event_type": "refund.succeeded", "payment_transaction_id": "pay_v7",
    });
    for (ev, result) in [
        (payment("pay_v7", 1000), "processed"),
        (refund.clone(), "processed"),
        (refund, "duplicate"),
    ] {
        let r = app.deliver(&ev).await;
        assert_eq!((r.status, r.result()), (200, result), "{r:?}");
    }
    app.stop().await;
    let inbox = ctx.spawn(ctx.inbox_config(2)).await;
    let r = inbox.deliver(&payment("pay_v7_inbox", 700)).await;
    assert_eq!((r.status, r.result()), (200, "accepted"), "{r:?}");
    wait_for(
        "the accepted payment booked",
        Duration::from_secs(20),
        || async {
            ctx.count(
                "SELECT count(*) FROM ledger_entries l JOIN payments p ON p.id = l.payment_id
                    WHERE p.transaction_id = 'pay_v7_inbox' AND p.status = 'succeeded'",
            )
            .await
                == 1
        },
    )
    .await;
    inbox.stop().await;
    assert_eq!(
        ctx.count("SELECT max(version)::int8 FROM refinery_schema_history")
            .await,
        7
    );
    assert_eq!(ctx.entries().await, 3, "credit, debit, inbox credit");
    ctx.assert_audit_clean().await;
}

/// V19 swaps the money rules of `payments` and `ledger_entries` for rules
/// that call one function each (cheaper to check in every write): rows
/// written before it stay as they were, no table is rewritten, and a write
/// that breaks a rule still names the rule it breaks.
#[tokio::test]
async fn the_money_rules_migration_keeps_every_row_and_every_rule_name() {
    let ctx = TestContext::at_version(18).await;
    let db = ctx.db().await;
    db.batch_execute(GOOD_PAYMENT).await.unwrap();
    db.batch_execute(
        "UPDATE payments SET amount_out_minor = 200 WHERE transaction_id = 'pay_good';
         INSERT INTO payments (provider, transaction_id, kind, parent_transaction_id, event_type,
                               amount_minor, currency, fingerprint, status, fence, reserved)
         VALUES ('generic', 're_good', 'refund', 'pay_good', 'refund.succeeded', 200, 'EUR',
                 'fp', 'processing', 2, true);",
    )
    .await
    .unwrap();
    let before = table_files(&ctx).await;
    ctx.migrate_to_latest().await;
    assert_eq!(table_files(&ctx).await, before, "a table was rewritten");
    let rules = |table: &'static str| {
        let ctx = &ctx;
        async move {
            ctx.db()
                .await
                .query(
                    "SELECT conname::text FROM pg_constraint
                      WHERE conrelid = $1::text::regclass AND contype = 'c' ORDER BY 1",
                    &[&table],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(rules("payments").await, ["payments_money_rules"]);
    assert_eq!(
        rules("ledger_entries").await,
        ["ledger_entries_sign_fits_effect"]
    );
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM payments
              WHERE (transaction_id = 'pay_good' AND amount_out_minor = 200 AND NOT reserved)
                 OR (transaction_id = 're_good' AND reserved AND amount_out_minor = 0)"
        )
        .await,
        2,
        "both rows as written"
    );
    assert_eq!(ctx.entries().await, 1, "the credit");
    for (sql, rule) in [
        (
            "UPDATE payments SET amount_out_minor = -1 WHERE transaction_id = 'pay_good'",
            "payments_amount_out_not_negative",
        ),
        (
            "UPDATE payments SET amount_out_minor = 5 WHERE transaction_id = 're_good'",
            "payments_only_payments_pay_out",
        ),
        (
            "UPDATE payments SET reserved = true WHERE transaction_id = 'pay_good'",
            "payments_only_refunds_and_disputes_reserve",
        ),
        (
            "UPDATE payments SET parent_transaction_id = 'pay_other' WHERE transaction_id = 'pay_good'",
            "payments_payment_has_no_parent",
        ),
        (
            "UPDATE ledger_entries SET amount_minor = -500 WHERE effect = 'credit'",
            "ledger_entries_sign_fits_effect",
        ),
    ] {
        let e = db.batch_execute(sql).await.expect_err(sql);
        let db_error = e.as_db_error().expect("a database error");
        assert_eq!(db_error.code().code(), "23514", "{sql}: {db_error}");
        assert_eq!(db_error.constraint(), Some(rule), "{sql}: {db_error}");
    }
}
