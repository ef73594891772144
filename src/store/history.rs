//! The delivery history (migration V16): one row per item of a delivery
//! that reached the fenced path, with the answer it was given, in both modes.
//! The owner of `delivery_history`.
//!
//! Rows are written in batches off the delivery path ([`crate::history`]):
//! one multi-row `INSERT … SELECT FROM unnest(…)` per batch. Reads tolerate
//! a schema from before V16 (no history: nothing to show), and so does the
//! prune. The table holds ids and answers, never a body or a header.

use serde::Serialize;
use time::OffsetDateTime;
use tokio_postgres::error::SqlState;

use super::{Store, StoreError};

/// One answered item, as the writer records it and `inspect` and the
/// console show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeliveryRow {
    #[serde(with = "time::serde::rfc3339")]
    pub answered_at: OffsetDateTime,
    pub provider: String,
    pub transaction_id: String,
    pub parent_transaction_id: Option<String>,
    pub event_type: String,
    pub psp_event_id: Option<String>,
    /// The answer's `result` (`processed`, `refund_rejected`, …).
    pub result: String,
    /// The answer's HTTP status.
    pub status: i16,
    /// A refused refund's why (`exceeds_payment`, …).
    pub reason: Option<String>,
}

/// Rows shown for one transaction, newest kept: a payment a PSP retried
/// for days stays readable.
const SHOWN: i64 = 1000;

/// One batch, one statement: a row per element of the arrays. Its commit
/// waits for the primary's own flush but not for a synchronous standby
/// (`synchronous_commit = local` for this transaction only): the history is
/// the operators' record, not money, and a batch waiting on a missing
/// standby would hold a connection and join the waits the commit bound
/// counts. A failover can lose the newest batches, as a full queue can.
const INSERT: &str = "INSERT INTO delivery_history (answered_at, provider, transaction_id,
        parent_transaction_id, event_type, psp_event_id, result, status, reason)
 SELECT u.* FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[],
        $5::text[], $6::text[], $7::text[], $8::int2[], $9::text[]) u,
        (SELECT set_config('synchronous_commit', 'local', true)) AS local_commit";

impl Store {
    /// Writes a batch of history rows in one statement.
    pub async fn record_deliveries(&self, rows: &[DeliveryRow]) -> Result<u64, StoreError> {
        if rows.is_empty() {
            return Ok(0);
        }
        // Columns of borrowed text: the rows are not copied again.
        let column = |f: fn(&DeliveryRow) -> &str| rows.iter().map(f).collect::<Vec<_>>();
        let optional = |f: fn(&DeliveryRow) -> Option<&str>| rows.iter().map(f).collect::<Vec<_>>();
        let at: Vec<OffsetDateTime> = rows.iter().map(|r| r.answered_at).collect();
        let status: Vec<i16> = rows.iter().map(|r| r.status).collect();
        let (provider, tx, event_type, result) = (
            column(|r| &r.provider),
            column(|r| &r.transaction_id),
            column(|r| &r.event_type),
            column(|r| &r.result),
        );
        let (parent, psp_event_id, reason) = (
            optional(|r| r.parent_transaction_id.as_deref()),
            optional(|r| r.psp_event_id.as_deref()),
            optional(|r| r.reason.as_deref()),
        );
        let client = self.writer().await?;
        let watch = client.watch();
        // Prepared once per pooled connection: a batch is one round trip.
        let insert = client.prepare_cached(INSERT).await?;
        watch
            .statement(client.execute(
                &insert,
                &[
                    &at,
                    &provider,
                    &tx,
                    &parent,
                    &event_type,
                    &psp_event_id,
                    &result,
                    &status,
                    &reason,
                ],
            ))
            .await
    }

    /// The history of a transaction and of the refunds and disputes that
    /// name it as their payment, oldest first (the newest thousand).
    /// Empty on a schema from before V16.
    pub async fn deliveries(
        &self,
        provider: &str,
        transaction_id: &str,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT answered_at, provider, transaction_id, parent_transaction_id, event_type,
                        psp_event_id, result, status, reason
                   FROM (SELECT * FROM delivery_history
                          WHERE provider = $1 AND transaction_id = $2
                         UNION ALL
                         SELECT * FROM delivery_history
                          WHERE provider = $1 AND parent_transaction_id = $2
                            AND transaction_id <> $2
                         ORDER BY id DESC LIMIT $3) h
                  ORDER BY id",
                &[&provider, &transaction_id, &SHOWN],
            )
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        Ok(rows
            .iter()
            .map(|r| DeliveryRow {
                answered_at: r.get(0),
                provider: r.get(1),
                transaction_id: r.get(2),
                parent_transaction_id: r.get(3),
                event_type: r.get(4),
                psp_event_id: r.get(5),
                result: r.get(6),
                status: r.get(7),
                reason: r.get(8),
            })
            .collect())
    }

    /// Deletes history rows answered before `before`; 0 on a schema from
    /// before V16.
    pub async fn prune_deliveries(&self, before: OffsetDateTime) -> Result<u64, StoreError> {
        let client = self.writer().await?;
        let watch = client.watch();
        let deleted = watch
            .statement(client.execute(
                "DELETE FROM delivery_history WHERE answered_at < $1",
                &[&before],
            ))
            .await;
        match deleted {
            Err(StoreError::Db { source, .. })
                if source.code() == Some(&SqlState::UNDEFINED_TABLE) =>
            {
                Ok(0)
            }
            other => other,
        }
    }

    /// What [`Store::prune_deliveries`] would delete now.
    pub async fn prune_deliveries_count(&self, before: OffsetDateTime) -> Result<u64, StoreError> {
        let client = self.pool.get().await?;
        let counted = client
            .query_one(
                "SELECT count(*) FROM delivery_history WHERE answered_at < $1",
                &[&before],
            )
            .await;
        match counted {
            Ok(row) => Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0)),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }
}
