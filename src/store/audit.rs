//! The invariants `fencehook audit` checks against the database. Each check
//! is one query returning the offending rows; zero rows is clean.
//!
//! One invariant cannot be seen in the database alone: that every 2xx the
//! service answered corresponds to a committed row. It needs the answers the
//! service gave; the `audit --answers` tool (in the binary) reads them from a
//! load run and asks [`missing_terminal_rows`] about them.

use tokio_postgres::NoTls;

/// One invariant and what violated it.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub description: &'static str,
    /// The first offenders (at most [`SHOWN_VIOLATIONS`]).
    pub violations: Vec<String>,
    /// How many offenders there are in all, when the check counts them
    /// (the answers check); otherwise `violations.len()`.
    pub total: usize,
}

/// Offending rows printed per check: enough to start digging, not a flood.
pub const SHOWN_VIOLATIONS: usize = 20;

const CHECKS: &[(&str, &str, &str)] = &[
    (
        "one_row_per_transaction",
        "at most one payments row per (provider, transaction_id)",
        "SELECT provider || ':' || transaction_id FROM payments GROUP BY provider, transaction_id HAVING count(*) > 1",
    ),
    (
        "one_entry_per_effect",
        "at most one ledger entry per payment and effect",
        "SELECT payment_id::text || ':' || effect FROM ledger_entries GROUP BY payment_id, effect HAVING count(*) > 1",
    ),
    (
        "succeeded_has_exactly_its_entry",
        "a succeeded payment has exactly one entry: +amount credit, or -amount debit for a refund",
        "SELECT p.provider || ':' || p.transaction_id FROM payments p
          WHERE p.status = 'succeeded'
            AND (SELECT count(*) FROM ledger_entries l WHERE l.payment_id = p.id) <> 1
             OR p.status = 'succeeded' AND NOT EXISTS (
                SELECT 1 FROM ledger_entries l
                 WHERE l.payment_id = p.id AND l.currency = p.currency
                   AND ((p.event_type = 'payment.succeeded' AND l.effect = 'credit' AND l.amount_minor = p.amount_minor)
                     OR (p.event_type = 'refund.succeeded' AND l.effect = 'debit' AND l.amount_minor = -p.amount_minor)))",
    ),
    (
        "unfinished_or_failed_have_no_entries",
        "processing and failed payments have no ledger entries",
        "SELECT p.provider || ':' || p.transaction_id FROM payments p
          WHERE p.status IN ('processing', 'failed')
            AND EXISTS (SELECT 1 FROM ledger_entries l WHERE l.payment_id = p.id)",
    ),
    (
        "status_fits_event_type",
        "payment.failed ends failed, the others end succeeded",
        "SELECT provider || ':' || transaction_id FROM payments
          WHERE (status = 'failed' AND event_type <> 'payment.failed')
             OR (status = 'succeeded' AND event_type = 'payment.failed')",
    ),
    (
        "entries_written_by_the_current_holder",
        "every ledger entry carries the payment's fence: no stale holder's write took effect",
        "SELECT p.provider || ':' || p.transaction_id || ' entry fence ' || l.fence || ' row fence ' || p.fence
           FROM ledger_entries l JOIN payments p ON p.id = l.payment_id
          WHERE l.fence <> p.fence",
    ),
];

/// Runs every check. A connection or query failure is an error, not "clean".
pub async fn run(url: &str) -> Result<Vec<Check>, tokio_postgres::Error> {
    let client = connect(url).await?;
    // One snapshot for every check, so they agree with each other.
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let mut out = Vec::new();
    for (name, description, sql) in CHECKS {
        let rows = client
            .query(&format!("{sql} LIMIT {SHOWN_VIOLATIONS}"), &[])
            .await?;
        let violations: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
        out.push(Check {
            name,
            description,
            total: violations.len(),
            violations,
        });
    }
    client.batch_execute("COMMIT").await?;
    Ok(out)
}

/// Payments and entries counted, for the audit summary.
pub async fn totals(url: &str) -> Result<(i64, i64), tokio_postgres::Error> {
    let client = connect(url).await?;
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM ledger_entries)",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// The ids of `transactions` (provider, transaction_id) that have no
/// terminal (`succeeded` / `failed`) row: each line says which and why.
pub async fn missing_terminal_rows(
    url: &str,
    transactions: &[(String, String)],
) -> Result<Vec<String>, tokio_postgres::Error> {
    let client = connect(url).await?;
    let stmt = client
        .prepare(
            "SELECT a.provider || ':' || a.transaction_id || ' answered 2xx, but '
                    || COALESCE('its row is ' || p.status, 'there is no row')
               FROM unnest($1::text[], $2::text[]) AS a(provider, transaction_id)
               LEFT JOIN payments p
                 ON p.provider = a.provider AND p.transaction_id = a.transaction_id
              WHERE p.status IS NULL OR p.status NOT IN ('succeeded', 'failed')",
        )
        .await?;
    let mut out = Vec::new();
    // Batches keep each statement's arrays small.
    for batch in transactions.chunks(5_000) {
        let providers: Vec<&str> = batch.iter().map(|(p, _)| p.as_str()).collect();
        let ids: Vec<&str> = batch.iter().map(|(_, t)| t.as_str()).collect();
        for row in client.query(&stmt, &[&providers, &ids]).await? {
            out.push(row.get::<_, String>(0));
        }
    }
    Ok(out)
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let cfg: tokio_postgres::Config = url.parse()?;
    let (client, conn) = cfg.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}
