//! PostgreSQL: the final arbiter of who processed a payment.
//!
//! # The fencing rule (must stay true)
//!
//! Every write of a processing attempt carries the attempt's fencing token and
//! is conditioned on it in SQL:
//!
//! - the claim raises `payments.fence` to the token only while the row is
//!   `processing`, its fence is *lower* than the token, and the fingerprint is
//!   the same; otherwise it changes nothing and the row is re-read;
//! - finalize (status + ledger entry, one statement) applies only where
//!   `fence = token AND status = 'processing'`.
//!
//! So a holder that stalled past its lease and resumes after a newer holder
//! claimed the row cannot change anything: its write matches no row and is
//! reported as [`Finalize::FenceRejected`]. Conflicts are resolved with
//! `ON CONFLICT ON CONSTRAINT payments_provider_transaction_id_key`: only that
//! constraint can send a delivery down the "row exists" branch, and that branch
//! always re-reads the row to tell duplicate from payload mismatch. Every other
//! database error is an error ([`StoreError`]), never a duplicate.

pub mod audit;
pub mod migrate;

use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool, PoolError};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::config::DbConfig;
use crate::db::{self, PoolBuildError, PoolSpec};
use crate::domain::{CanonicalEvent, EventKind, Status};

/// What the database holds for one (provider, transaction_id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRow {
    pub id: i64,
    pub status: Status,
    pub fingerprint: String,
    pub fence: i64,
}

/// Result of a fenced claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The row is ours at `fence = token`, status `processing`. `event` is
    /// what the row holds (its first delivery's fields): the business step is
    /// sent this, so one Idempotency-Key always carries one body, whichever
    /// delivery resumes the payment.
    Claimed {
        payment_id: i64,
        event: CanonicalEvent,
    },
    /// Already terminal with the same fingerprint: a duplicate.
    AlreadyDone(Status),
    /// Same (provider, transaction_id), different fingerprint.
    Mismatch,
    /// Still `processing`, but the database fence is at or above our token.
    Stale { db_fence: i64 },
}

/// Result of a fenced finalize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalize {
    Applied(Status),
    /// No row had `fence = token AND status = 'processing'`: a newer holder owns it.
    FenceRejected,
}

/// Result of [`Store::claim_and_finalize`], the one-statement path (no downstream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAndFinalize {
    Committed(Status),
    NotClaimed(Claim),
}

/// How a database error is classified. Exhaustive on purpose: adding a kind
/// forces every caller to decide what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
///
/// There is no "payment exists" kind: claims resolve conflicts with
/// `ON CONFLICT ON CONSTRAINT payments_provider_transaction_id_key`, so a
/// duplicate never surfaces as an error; a unique violation that does surface
/// is a bug, not a duplicate.
pub enum DbErrorKind {
    /// An integrity violation: a bug or a corrupt row, never a duplicate.
    Constraint,
    /// Serialization failure or deadlock: safe to retry.
    Conflict,
    /// statement_timeout / query cancelled.
    Timeout,
    /// Connection lost, server shutting down, cannot connect.
    Connection,
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no database connection available")]
    Pool(#[from] PoolError),
    #[error("database error ({kind:?})")]
    Db {
        kind: DbErrorKind,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("unexpected database state: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Build(#[from] PoolBuildError),
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(source: tokio_postgres::Error) -> StoreError {
        StoreError::Db {
            kind: classify(&source),
            source,
        }
    }
}

/// Classifies by SQLSTATE.
pub fn classify(e: &tokio_postgres::Error) -> DbErrorKind {
    let Some(db) = e.as_db_error() else {
        return DbErrorKind::Connection;
    };
    let code = db.code();
    if code.code().starts_with("23") {
        DbErrorKind::Constraint
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
    {
        DbErrorKind::Conflict
    } else if *code == SqlState::QUERY_CANCELED || *code == SqlState::LOCK_NOT_AVAILABLE {
        DbErrorKind::Timeout
    } else if code.code().starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
    {
        DbErrorKind::Connection
    } else {
        DbErrorKind::Other
    }
}

const SELECT_PAYMENT: &str =
    "SELECT id, status, fingerprint, fence FROM payments WHERE provider = $1 AND transaction_id = $2";

/// The fenced upsert both paths share. Parameters: $1 provider,
/// $2 transaction_id, $3 event_type, $4 amount_minor, $5 currency,
/// $6 fingerprint, $7 status to write, $8 token, $9 occurred_at.
macro_rules! fenced_upsert {
    () => {
        "INSERT INTO payments (provider, transaction_id, event_type, amount_minor, currency, fingerprint, status, fence, occurred_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT ON CONSTRAINT payments_provider_transaction_id_key DO UPDATE
   SET fence = EXCLUDED.fence, status = EXCLUDED.status, updated_at = now()
 WHERE payments.status = 'processing'
   AND payments.fence < EXCLUDED.fence
   AND payments.fingerprint = EXCLUDED.fingerprint
RETURNING id, event_type, amount_minor, currency, occurred_at"
    };
}

/// The claim of the downstream path: the upsert with status `processing`.
const CLAIM: &str = fenced_upsert!();

/// The one-statement inline path: the upsert writes the final status at once,
/// and the ledger entry (effect `$10`, sign `$11`; none when `$10` is NULL) is
/// inserted only for a row the upsert wrote.
const CLAIM_AND_FINALIZE: &str = concat!(
    "WITH claim AS (",
    fenced_upsert!(),
    "),
entry AS (
    INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
    SELECT id, $10, amount_minor * $11, currency, $8 FROM claim WHERE $10::text IS NOT NULL
    RETURNING payment_id)
SELECT id FROM claim"
);

/// Status and ledger entry in one statement, both conditioned on the token.
const FINALIZE_WITH_ENTRY: &str = "\
WITH upd AS (
    UPDATE payments SET status = 'succeeded', updated_at = now()
     WHERE id = $1 AND fence = $2 AND status = 'processing'
    RETURNING id, amount_minor, currency)
INSERT INTO ledger_entries (payment_id, effect, amount_minor, currency, fence)
SELECT id, $3, amount_minor * $4, currency, $2 FROM upd
RETURNING payment_id";

const FINALIZE_FAILED: &str = "\
UPDATE payments SET status = 'failed', updated_at = now()
 WHERE id = $1 AND fence = $2 AND status = 'processing'
RETURNING id";

/// The pooled PostgreSQL store.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
}

impl Store {
    /// Builds the pool. Connections are opened lazily, so a database that is
    /// down at start makes requests answer 503 (and `/readyz` say so) instead
    /// of stopping the process.
    pub fn new(cfg: &DbConfig) -> Result<Store, StoreError> {
        let pool = db::pool(
            cfg,
            PoolSpec {
                application_name: "fencehook",
                statement_timeout: cfg.statement_timeout,
                size: cfg.pool_size,
                wait: cfg.pool_wait,
            },
        )?;
        Ok(Store { pool })
    }

    pub fn pool_status(&self) -> deadpool_postgres::Status {
        self.pool.status()
    }

    /// Payments left `processing` for longer than `older_than`: claims whose
    /// holder died or whose downstream kept failing, waiting for the PSP's
    /// next retry. A number that stays above zero needs a human.
    pub async fn stuck_processing(&self, older_than: Duration) -> Result<i64, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "SELECT count(*) FROM payments WHERE status = 'processing' \
                 AND updated_at < now() - $1 * interval '1 millisecond'",
            )
            .await?;
        let ms = older_than.as_millis() as f64;
        Ok(client.query_one(&stmt, &[&ms]).await?.get(0))
    }

    /// Readiness probe.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client.simple_query("SELECT 1").await?;
        Ok(())
    }

    pub async fn lookup(
        &self,
        provider: &str,
        transaction_id: &str,
    ) -> Result<Option<PaymentRow>, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(SELECT_PAYMENT).await?;
        let row = client
            .query_opt(&stmt, &[&provider, &transaction_id])
            .await?;
        row.map(|r| to_payment(&r)).transpose()
    }

    /// A pooled connection for the fenced writes of one attempt. Waiting
    /// for it may take up to the pool wait: the caller checks its lease
    /// *after* this returns and before it writes.
    pub async fn connection(&self) -> Result<Connection, StoreError> {
        Ok(Connection(self.pool.get().await?))
    }
}

/// A connection taken from the pool for the fenced writes of one attempt.
pub struct Connection(deadpool_postgres::Object);

impl Connection {
    /// Fenced claim in its own transaction (used when the business step leaves
    /// the database: the claim must be durable before the downstream call).
    pub async fn claim(
        &self,
        ev: &CanonicalEvent,
        fingerprint: &str,
        token: i64,
    ) -> Result<Claim, StoreError> {
        claim_on(&self.0, ev, fingerprint, token).await
    }

    /// Fenced finalize: `succeeded` + ledger entry (or `failed`), one statement.
    pub async fn finalize(
        &self,
        payment_id: i64,
        kind: EventKind,
        token: i64,
    ) -> Result<Finalize, StoreError> {
        finalize_on(&self.0, payment_id, kind, token).await
    }

    /// Claim, business effect and final status in one statement (one
    /// transaction, one round trip): the fenced upsert writes the final status
    /// directly and feeds the ledger insert. The statement is fenced, so a
    /// holder that stalls after its last lease check changes nothing if a
    /// newer token has claimed the row.
    pub async fn claim_and_finalize(
        &self,
        ev: &CanonicalEvent,
        fingerprint: &str,
        token: i64,
    ) -> Result<ClaimAndFinalize, StoreError> {
        let client = &self.0;
        let Booking {
            status,
            effect,
            sign,
        } = booking(ev.event_type);
        let stmt = client.prepare_cached(CLAIM_AND_FINALIZE).await?;
        let text = UpsertText {
            event_type: ev.event_type.as_str(),
            fingerprint,
            status: status.as_str(),
        };
        let mut params: Vec<&(dyn ToSql + Sync)> = upsert_params(ev, &text, &token).to_vec();
        params.extend_from_slice(&[&effect, &sign]);
        let row = client.query_opt(&stmt, &params).await?;
        if row.is_some() {
            return Ok(ClaimAndFinalize::Committed(status));
        }
        Ok(ClaimAndFinalize::NotClaimed(
            reread(client, ev, fingerprint).await?,
        ))
    }
}

/// The nine parameters of [`fenced_upsert!`], in order.
fn upsert_params<'a>(
    ev: &'a CanonicalEvent,
    text: &'a UpsertText<'a>,
    token: &'a i64,
) -> [&'a (dyn ToSql + Sync); 9] {
    [
        &ev.provider,
        &ev.transaction_id,
        &text.event_type,
        &ev.amount_minor,
        &ev.currency,
        &text.fingerprint,
        &text.status,
        token,
        &ev.occurred_at,
    ]
}

/// The text parameters of the upsert that are not fields of the event.
struct UpsertText<'a> {
    event_type: &'static str,
    fingerprint: &'a str,
    status: &'static str,
}

async fn claim_on<C: GenericClient>(
    client: &C,
    ev: &CanonicalEvent,
    fingerprint: &str,
    token: i64,
) -> Result<Claim, StoreError> {
    let stmt = client.prepare_cached(CLAIM).await?;
    let text = UpsertText {
        event_type: ev.event_type.as_str(),
        fingerprint,
        status: Status::Processing.as_str(),
    };
    let row = client
        .query_opt(&stmt, &upsert_params(ev, &text, &token))
        .await?;
    if let Some(row) = row {
        let event_type: &str = row.get(1);
        return Ok(Claim::Claimed {
            payment_id: row.get(0),
            event: CanonicalEvent {
                provider: ev.provider.clone(),
                transaction_id: ev.transaction_id.clone(),
                event_type: EventKind::from_generic(event_type).ok_or_else(|| {
                    StoreError::Corrupt(format!("unknown event type `{event_type}`"))
                })?,
                amount_minor: row.get(2),
                currency: row.get(3),
                occurred_at: row.get(4),
            },
        });
    }
    reread(client, ev, fingerprint).await
}

/// The conflict branch: re-read the row to tell duplicate, mismatch and stale apart.
async fn reread<C: GenericClient>(
    client: &C,
    ev: &CanonicalEvent,
    fingerprint: &str,
) -> Result<Claim, StoreError> {
    let stmt = client.prepare_cached(SELECT_PAYMENT).await?;
    let row = client
        .query_opt(&stmt, &[&ev.provider, &ev.transaction_id])
        .await?
        .ok_or_else(|| StoreError::Corrupt("claim conflicted but no row exists".to_owned()))?;
    let existing = to_payment(&row)?;
    Ok(if existing.fingerprint != fingerprint {
        Claim::Mismatch
    } else if existing.status.is_terminal() {
        Claim::AlreadyDone(existing.status)
    } else {
        Claim::Stale {
            db_fence: existing.fence,
        }
    })
}

/// What an event kind books: the final status and the ledger effect (none for a failure).
struct Booking {
    status: Status,
    effect: Option<&'static str>,
    /// Sign of the entry's amount: credits positive, debits negative.
    sign: i64,
}

fn booking(kind: EventKind) -> Booking {
    match kind {
        EventKind::PaymentSucceeded => Booking {
            status: Status::Succeeded,
            effect: Some("credit"),
            sign: 1,
        },
        EventKind::RefundSucceeded => Booking {
            status: Status::Succeeded,
            effect: Some("debit"),
            sign: -1,
        },
        EventKind::PaymentFailed => Booking {
            status: Status::Failed,
            effect: None,
            sign: 0,
        },
    }
}

async fn finalize_on<C: GenericClient>(
    client: &C,
    payment_id: i64,
    kind: EventKind,
    token: i64,
) -> Result<Finalize, StoreError> {
    let Booking {
        status,
        effect,
        sign,
    } = booking(kind);
    let row = match effect {
        None => {
            let stmt = client.prepare_cached(FINALIZE_FAILED).await?;
            client.query_opt(&stmt, &[&payment_id, &token]).await?
        }
        Some(effect) => {
            let stmt = client.prepare_cached(FINALIZE_WITH_ENTRY).await?;
            client
                .query_opt(&stmt, &[&payment_id, &token, &effect, &sign])
                .await?
        }
    };
    Ok(match row {
        Some(_) => Finalize::Applied(status),
        None => Finalize::FenceRejected,
    })
}

fn to_payment(row: &tokio_postgres::Row) -> Result<PaymentRow, StoreError> {
    let status: &str = row.get(1);
    Ok(PaymentRow {
        id: row.get(0),
        status: Status::parse(status)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown payment status `{status}`")))?,
        fingerprint: row.get(2),
        fence: row.get(3),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `make bench` measures the PostgreSQL ceiling with pgbench running the
    /// same per-delivery SQL as the service: `scripts/bench-delivery.sql` is
    /// this module's fast-path lookup and one-statement claim with pgbench
    /// variables for the parameters. It must not drift from the code.
    #[test]
    fn the_pgbench_script_runs_the_stores_own_sql() {
        let params: [(&str, &str); 11] = [
            ("$11", "1"),
            ("$10", "'credit'"),
            ("$9", "NULL"),
            ("$8", "1"),
            ("$7", "'succeeded'"),
            ("$6", "md5('pg-' || :tx)"),
            ("$5", "'EUR'"),
            ("$4", ":amount"),
            ("$3", "'payment.succeeded'"),
            ("$2", "'pg-' || :tx"),
            ("$1", "'pgbench'"),
        ];
        let render = |sql: &str| {
            params
                .iter()
                .fold(sql.to_owned(), |sql, (p, v)| sql.replace(p, v))
        };
        let expected = format!(
            "\\set tx random(1, 1000000000000)\n\\set amount random(1, 100000)\n{};\n{};\n",
            render(SELECT_PAYMENT),
            render(CLAIM_AND_FINALIZE)
        );
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench-delivery.sql");
        if std::env::var_os("BLESS").is_some() {
            std::fs::write(path, &expected).unwrap();
        }
        let script = std::fs::read_to_string(path).unwrap_or_default();
        assert_eq!(
            script, expected,
            "scripts/bench-delivery.sql is out of step with the store's SQL (BLESS=1 rewrites it)"
        );
    }
}
