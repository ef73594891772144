//! The invariants `fencehook audit` checks against the database. Each check
//! is one query returning the offending rows; zero rows is clean.
//!
//! One invariant cannot be seen in the database alone: that every 2xx the
//! service answered corresponds to a committed row. It needs the answers the
//! service gave; the `audit --answers` tool (in the binary) reads them from a
//! load run and asks [`missing_terminal_rows`] about them (and, for inbox
//! mode's `accepted`, [`missing_rows_or_events`]).
//!
//! # The record of runs (`audit_runs`, migration V14)
//!
//! The audit is a command, so the service cannot know what it found unless
//! it is written down: [`record`] adds one row per run (whether it was
//! clean, each check's count, the warnings, the totals) and keeps the newest
//! [`KEPT_RUNS`]; the console's overview reads the newest ([`Store::last_audit`]).
//! Recording is the audit's only write, on a connection of its own after
//! every check has read its snapshot, so a database the audit may not write
//! (a standby, a schema before V14) is still audited.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio_postgres::error::SqlState;

use crate::db::tls::Target;
use crate::db::PoolBuildError;
use crate::store::{Store, StoreError};

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

/// The ledger entries each (kind, status) must have, as a sorted list of
/// effects (a failed refund: none, or its debit and its reversal).
const EXPECTED_ENTRIES: &str = "
    (VALUES ('payment', 'succeeded', ARRAY['credit']),
            ('payment', 'failed', ARRAY[]::text[]),
            ('refund', 'succeeded', ARRAY['debit']),
            ('refund', 'failed', ARRAY[]::text[]),
            ('refund', 'failed', ARRAY['debit', 'refund_reversal']),
            ('dispute', 'succeeded', ARRAY['dispute']),
            ('dispute', 'failed', ARRAY['dispute', 'dispute_reversal']),
            ('payment', 'processing', ARRAY[]::text[]),
            ('refund', 'processing', ARRAY[]::text[]),
            ('dispute', 'processing', ARRAY[]::text[]),
            ('payment', 'queued', ARRAY[]::text[]),
            ('refund', 'queued', ARRAY[]::text[]),
            ('dispute', 'queued', ARRAY[]::text[]),
            ('payment', 'dead', ARRAY[]::text[]),
            ('refund', 'dead', ARRAY[]::text[]),
            ('dispute', 'dead', ARRAY[]::text[]))
    AS expected(kind, status, effects)";

/// Every check: (name, description, query returning one line per offender).
/// `reserved` is the SQL for "this refund or dispute row holds money its
/// claim reserved" (`false` on a schema before migration V10).
fn checks(reserved: &str) -> Vec<(&'static str, &'static str, String)> {
    vec![
        (
            "one_row_per_transaction",
            "at most one payments row per (provider, transaction_id)",
            "SELECT provider || ':' || transaction_id FROM payments
              GROUP BY provider, transaction_id HAVING count(*) > 1"
                .to_owned(),
        ),
        (
            "one_entry_per_effect",
            "at most one ledger entry per row and effect",
            "SELECT payment_id::text || ':' || effect FROM ledger_entries
              GROUP BY payment_id, effect HAVING count(*) > 1"
                .to_owned(),
        ),
        (
            "entries_fit_kind_and_status",
            "each row has exactly the entries of its kind and status (a failed refund: none, or debit + reversal), each for the row's amount and currency, signed by effect",
            format!(
                "WITH entries AS (
                    SELECT p.id, p.provider, p.transaction_id, p.kind, p.status,
                           coalesce(array_agg(l.effect::text ORDER BY l.effect) FILTER (WHERE l.id IS NOT NULL), ARRAY[]::text[]) AS effects,
                           bool_and(l.id IS NULL OR (l.currency = p.currency AND l.amount_minor = p.amount_minor *
                               CASE WHEN l.effect IN ('credit', 'refund_reversal', 'dispute_reversal') THEN 1 ELSE -1 END)) AS amounts_ok
                      FROM payments p LEFT JOIN ledger_entries l ON l.payment_id = p.id
                     GROUP BY p.id)
                 SELECT e.provider || ':' || e.transaction_id || ' (' || e.kind || ' ' || e.status || ': ' || array_to_string(e.effects, '+') || ')'
                   FROM entries e
                  WHERE NOT e.amounts_ok
                     OR NOT EXISTS (SELECT 1 FROM {EXPECTED_ENTRIES}
                                     WHERE expected.kind = e.kind AND expected.status = e.status
                                       AND expected.effects = e.effects)"
            ),
        ),
        (
            "status_fits_event_type",
            "the event type that set a row's status is of its kind and says that status",
            "SELECT provider || ':' || transaction_id || ' (' || kind || ' ' || status || ' by ' || event_type || ')'
               FROM payments
              WHERE split_part(event_type, '.', 1) <> kind
                 OR (status = 'succeeded' AND event_type NOT IN ('payment.succeeded', 'refund.succeeded', 'dispute.funds_withdrawn'))
                 OR (status = 'failed' AND event_type NOT IN ('payment.failed', 'refund.failed', 'dispute.funds_reinstated'))"
                .to_owned(),
        ),
        (
            "entries_written_by_the_current_holder",
            "no entry carries a token above its row's fence; a payment's credit and a reversal carry the fence of the row they settled (no stale holder's write took effect)",
            "SELECT p.provider || ':' || p.transaction_id || ' ' || l.effect || ' fence ' || l.fence || ' row fence ' || p.fence
               FROM ledger_entries l JOIN payments p ON p.id = l.payment_id
              WHERE l.fence > p.fence
                 OR (l.effect IN ('credit', 'refund_reversal', 'dispute_reversal') AND l.fence <> p.fence)"
                .to_owned(),
        ),
        (
            "money_out_within_money_in",
            "per payment, refunds booked (net of reversals) are at most its amount; refunds and disputes booked or reserved are in its currency and equal the payment's amount_out_minor (disputes past the amount are a warning below)",
            format!("WITH children AS (
                SELECT c.provider, c.parent_transaction_id AS parent,
                       coalesce(-sum(l.amount_minor), 0)
                         + coalesce(sum(c.amount_minor) FILTER (WHERE {reserved} AND l.id IS NULL), 0) AS out_minor,
                       coalesce(-sum(l.amount_minor) FILTER (WHERE c.kind = 'refund'), 0) AS refunded_minor,
                       bool_and(coalesce(l.currency, c.currency) = par.currency) AS same_currency
                  FROM payments c
                  LEFT JOIN ledger_entries l ON l.payment_id = c.id
                  JOIN payments par ON par.provider = c.provider AND par.transaction_id = c.parent_transaction_id
                 WHERE c.kind IN ('refund', 'dispute') AND (l.id IS NOT NULL OR {reserved})
                 GROUP BY c.provider, c.parent_transaction_id)
             SELECT par.provider || ':' || par.transaction_id || ' amount ' || par.amount_minor
                    || ', out ' || coalesce(ch.out_minor, 0) || ', recorded out ' || par.amount_out_minor
                    || CASE WHEN coalesce(ch.refunded_minor, 0) > par.amount_minor
                            THEN ', refunded ' || ch.refunded_minor ELSE '' END
                    || CASE WHEN ch.same_currency IS FALSE THEN ', in another currency' ELSE '' END
               FROM payments par LEFT JOIN children ch ON ch.provider = par.provider AND ch.parent = par.transaction_id
              WHERE par.kind = 'payment'
                AND (coalesce(ch.refunded_minor, 0) > par.amount_minor
                     OR coalesce(ch.out_minor, 0) < 0
                     OR coalesce(ch.out_minor, 0) <> par.amount_out_minor
                     OR ch.same_currency IS FALSE)"),
        ),
        (
            "refunds_and_disputes_under_a_succeeded_payment",
            "every refund or dispute entry belongs to a row whose parent is a succeeded payment (refunds from before refunds named their payment are listed below, not counted)",
            "SELECT c.provider || ':' || c.transaction_id || ' ' || l.effect || ' under '
                    || c.parent_transaction_id || ' (' || coalesce(par.kind || ' ' || par.status, 'no such row') || ')'
               FROM payments c
               JOIN ledger_entries l ON l.payment_id = c.id
               LEFT JOIN payments par ON par.provider = c.provider AND par.transaction_id = c.parent_transaction_id
              WHERE c.kind IN ('refund', 'dispute') AND c.parent_transaction_id IS NOT NULL
                AND (par.id IS NULL OR par.kind <> 'payment' OR par.status <> 'succeeded')"
                .to_owned(),
        ),
        (
            "reversals_after_what_they_reverse",
            "a refund_reversal only on a row with its debit, a dispute_reversal only with its dispute",
            "SELECT p.provider || ':' || p.transaction_id || ' ' || r.effect || ' without ' || CASE r.effect WHEN 'refund_reversal' THEN 'debit' ELSE 'dispute' END
               FROM ledger_entries r JOIN payments p ON p.id = r.payment_id
              WHERE r.effect IN ('refund_reversal', 'dispute_reversal')
                AND NOT EXISTS (SELECT 1 FROM ledger_entries o WHERE o.payment_id = r.payment_id
                                   AND o.effect = CASE r.effect WHEN 'refund_reversal' THEN 'debit' ELSE 'dispute' END
                                   AND o.fence < r.fence)"
                .to_owned(),
        ),
    ]
}

/// Refunds booked before refunds named their payment (migration V4): they
/// cannot be checked against a payment, and are listed as such.
const LEGACY_REFUNDS: &str = "SELECT provider || ':' || transaction_id FROM payments
  WHERE kind = 'refund' AND parent_transaction_id IS NULL";

/// Runs every check. A connection or query failure is an error, not "clean".
pub async fn run(url: &str) -> Result<Vec<Check>, StoreError> {
    let client = connect(url).await?;
    // One snapshot for every check, so they agree with each other.
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let reserved = if has_reservations(&client).await? {
        "c.reserved"
    } else {
        "false"
    };
    let mut out = Vec::new();
    for (name, description, sql) in checks(reserved) {
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

/// Whether the schema has `payments.reserved` (migration V10): the audit
/// also reads a database an older release left, before `migrate`.
async fn has_reservations(client: &tokio_postgres::Client) -> Result<bool, StoreError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                             WHERE table_schema = current_schema() AND table_name = 'payments'
                               AND column_name = 'reserved')",
            &[],
        )
        .await?
        .get(0))
}

/// Payments that have given back more than came in: refunds and disputes
/// booked past the amount together (a chargeback larger than the charge, or
/// a chargeback and a refund in either order; refunds alone never are). The
/// money is gone, so they are booked; a warning for someone to reconcile,
/// not a violation. At most [`SHOWN_VIOLATIONS`] of them, and how many.
pub async fn over_returned(url: &str) -> Result<(Vec<String>, i64), StoreError> {
    let client = connect(url).await?;
    let sql = "SELECT provider || ':' || transaction_id || ' amount ' || amount_minor
                      || ', out ' || amount_out_minor
                 FROM payments WHERE kind = 'payment' AND amount_out_minor > amount_minor";
    let shown = client
        .query(&format!("{sql} ORDER BY id LIMIT {SHOWN_VIOLATIONS}"), &[])
        .await?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    let count: i64 = client
        .query_one(&format!("SELECT count(*) FROM ({sql}) AS o"), &[])
        .await?
        .get(0);
    Ok((shown, count))
}

/// Refunds from before refunds named their payment (not violations: they
/// cannot be checked against one); at most [`SHOWN_VIOLATIONS`] of them, and
/// how many there are.
pub async fn legacy_refunds(url: &str) -> Result<(Vec<String>, i64), StoreError> {
    let client = connect(url).await?;
    let shown = client
        .query(&format!("{LEGACY_REFUNDS} LIMIT {SHOWN_VIOLATIONS}"), &[])
        .await?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    let count: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM ({LEGACY_REFUNDS}) AS l"),
            &[],
        )
        .await?
        .get(0);
    Ok((shown, count))
}

/// Payments and entries counted, for the audit summary.
pub async fn totals(url: &str) -> Result<(i64, i64), StoreError> {
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
) -> Result<Vec<String>, StoreError> {
    offenders(
        url,
        transactions,
        "SELECT a.provider || ':' || a.transaction_id || ' answered 2xx, but '
                    || COALESCE('its row is ' || p.status, 'there is no row')
               FROM unnest($1::text[], $2::text[]) AS a(provider, transaction_id)
               LEFT JOIN payments p
                 ON p.provider = a.provider AND p.transaction_id = a.transaction_id
              WHERE p.status IS NULL OR p.status NOT IN ('succeeded', 'failed')",
    )
    .await
}

/// Of the given (provider, transaction_id) pairs, answered 2xx `accepted`
/// (inbox mode), those without a committed `payments` row (in any status: a
/// worker may not have booked it yet, or gave up) or without a stored event:
/// one line per offender. The promise of `accepted` is "stored", not "booked".
pub async fn missing_rows_or_events(
    url: &str,
    transactions: &[(String, String)],
) -> Result<Vec<String>, StoreError> {
    offenders(
        url,
        transactions,
        "SELECT a.provider || ':' || a.transaction_id || ' answered accepted, but there is '
                    || CASE WHEN p.id IS NULL AND e.id IS NULL THEN 'no row and no event'
                            WHEN p.id IS NULL THEN 'no row'
                            ELSE 'no event' END
               FROM unnest($1::text[], $2::text[]) AS a(provider, transaction_id)
               LEFT JOIN payments p
                 ON p.provider = a.provider AND p.transaction_id = a.transaction_id
               LEFT JOIN LATERAL (
                   SELECT id FROM events
                    WHERE provider = a.provider AND transaction_id = a.transaction_id
                    LIMIT 1) e ON true
              WHERE p.id IS NULL OR e.id IS NULL",
    )
    .await
}

/// The lines `sql` (a query over `unnest($1::text[], $2::text[])` of the
/// pairs) returns for `transactions`, in batches that keep each statement's
/// arrays small.
async fn offenders(
    url: &str,
    transactions: &[(String, String)],
    sql: &str,
) -> Result<Vec<String>, StoreError> {
    let client = connect(url).await?;
    let stmt = client.prepare(sql).await?;
    let mut out = Vec::new();
    for batch in transactions.chunks(5_000) {
        let providers: Vec<&str> = batch.iter().map(|(p, _)| p.as_str()).collect();
        let ids: Vec<&str> = batch.iter().map(|(_, t)| t.as_str()).collect();
        for row in client.query(&stmt, &[&providers, &ids]).await? {
            out.push(row.get::<_, String>(0));
        }
    }
    Ok(out)
}

/// Runs of the audit `audit_runs` keeps: the newest; each recording
/// deletes the older ones in its own transaction.
pub const KEPT_RUNS: i64 = 100;

/// One check of a run, counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckCount {
    pub name: String,
    /// Offenders found (0: the check holds).
    pub violations: i64,
    /// The check stopped counting at the offenders the audit lists
    /// ([`SHOWN_VIOLATIONS`]): there may be more than `violations`.
    pub at_least: bool,
}

impl CheckCount {
    pub fn of(c: &Check) -> CheckCount {
        CheckCount {
            name: c.name.to_owned(),
            violations: i64::try_from(c.total).unwrap_or(i64::MAX),
            // The database checks count what they list (at most
            // SHOWN_VIOLATIONS); at that number, there may be more.
            at_least: c.total >= SHOWN_VIOLATIONS && c.total == c.violations.len(),
        }
    }
}

/// What one run of the audit found, to be recorded.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub checks: Vec<CheckCount>,
    pub over_returned_payments: i64,
    pub legacy_refunds: i64,
    pub payments: i64,
    pub ledger_entries: i64,
    /// How long the audit's reads took.
    pub duration: Duration,
    /// The host that ran it, when its name could be read.
    pub host: Option<String>,
    /// The run also checked a load run's answers (`--answers`).
    pub with_answers: bool,
}

impl RunSummary {
    /// No check violated (warnings do not count).
    pub fn clean(&self) -> bool {
        self.checks.iter().all(|c| c.violations == 0)
    }
}

/// What became of a run's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// Written as run `id`; runs past [`KEPT_RUNS`] deleted.
    Recorded { id: i64 },
    /// Nothing written: the schema is before migration V14 (no `audit_runs`).
    BeforeMigration,
}

/// Records `run` in `audit_runs` and deletes all but the newest
/// [`KEPT_RUNS`], in one transaction. A database that refuses the write (a
/// standby, a role without the grant) is an error, for the caller to report.
pub async fn record(url: &str, run: &RunSummary) -> Result<Recording, StoreError> {
    let mut client = connect(url).await?;
    let tx = client.transaction().await?;
    let checks = serde_json::to_value(&run.checks)
        .map_err(|e| StoreError::Corrupt(format!("audit checks as JSON: {e}")))?;
    let duration_ms = i64::try_from(run.duration.as_millis()).unwrap_or(i64::MAX);
    let inserted = tx
        .query_one(
            "INSERT INTO audit_runs (duration_ms, clean, checks, over_returned_payments,
                                     legacy_refunds, payments, ledger_entries, host, version,
                                     with_answers)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             RETURNING id",
            &[
                &duration_ms,
                &run.clean(),
                &checks,
                &run.over_returned_payments,
                &run.legacy_refunds,
                &run.payments,
                &run.ledger_entries,
                &run.host,
                &env!("CARGO_PKG_VERSION"),
                &run.with_answers,
            ],
        )
        .await;
    let id: i64 = match inserted {
        Ok(row) => row.get(0),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => {
            return Ok(Recording::BeforeMigration)
        }
        Err(e) => return Err(e.into()),
    };
    tx.execute(
        "DELETE FROM audit_runs
          WHERE id <= (SELECT id FROM audit_runs ORDER BY id DESC OFFSET $1 LIMIT 1)",
        &[&KEPT_RUNS],
    )
    .await?;
    tx.commit().await?;
    Ok(Recording::Recorded { id })
}

/// A recorded run of the audit, as the console shows it.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRun {
    pub id: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub finished_at: OffsetDateTime,
    /// Seconds since it finished, by the database's clock (the one that
    /// stamped it).
    pub age_seconds: i64,
    pub duration_ms: i64,
    pub clean: bool,
    /// Every check run, in the order the audit printed them.
    pub checks: Vec<CheckCount>,
    pub over_returned_payments: i64,
    pub legacy_refunds: i64,
    pub payments: i64,
    pub ledger_entries: i64,
    pub host: Option<String>,
    pub version: String,
    pub with_answers: bool,
}

/// The newest recorded run of the audit.
#[derive(Debug, Clone)]
pub enum LastAudit {
    Ran(Box<AuditRun>),
    /// `audit_runs` is empty: no audit has recorded a run.
    Never,
    /// The schema is before migration V14: there is nowhere a run is recorded.
    BeforeMigration,
}

impl Store {
    /// The newest run `fencehook audit` recorded (one probe of the primary key).
    pub async fn last_audit(&self) -> Result<LastAudit, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT id, finished_at, extract(epoch FROM now() - finished_at)::int8,
                        duration_ms, clean, checks, over_returned_payments, legacy_refunds,
                        payments, ledger_entries, host, version, with_answers
                   FROM audit_runs ORDER BY id DESC LIMIT 1",
                &[],
            )
            .await;
        let row = match row {
            Ok(Some(row)) => row,
            Ok(None) => return Ok(LastAudit::Never),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => {
                return Ok(LastAudit::BeforeMigration)
            }
            Err(e) => return Err(e.into()),
        };
        let checks: serde_json::Value = row.get(5);
        let checks = serde_json::from_value(checks)
            .map_err(|e| StoreError::Corrupt(format!("audit_runs.checks: {e}")))?;
        Ok(LastAudit::Ran(Box::new(AuditRun {
            id: row.get(0),
            finished_at: row.get(1),
            age_seconds: row.get(2),
            duration_ms: row.get(3),
            clean: row.get(4),
            checks,
            over_returned_payments: row.get(6),
            legacy_refunds: row.get(7),
            payments: row.get(8),
            ledger_entries: row.get(9),
            host: row.get(10),
            version: row.get(11),
            with_answers: row.get(12),
        })))
    }
}

pub(crate) async fn connect(url: &str) -> Result<tokio_postgres::Client, StoreError> {
    let cfg = Target::parse(url).map_err(PoolBuildError::Url)?;
    let (client, conn) = cfg.config.connect(cfg.tls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}
