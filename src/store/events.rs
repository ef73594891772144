//! Stored events as operators see and handle them: listed (`fencehook
//! events`, the console), dead ones re-queued in batches (`fencehook replay`,
//! the console), old ones pruned, and one transaction inspected whole (its
//! row, its refunds' and disputes', their ledger entries and events). The
//! inbox's own path (accept, take, settle) is [`super::inbox`].

use serde::Serialize;
use time::OffsetDateTime;

use super::inbox::{event_row, EventRow, EVENT_COLUMNS};
use super::record::{payment_record, PaymentRecord, RECORD_COLUMNS};
use super::{Store, StoreError};
use crate::domain::amount::major_amount;

impl Store {
    /// The stored events matching every given filter, newest first.
    pub async fn events(&self, filter: &EventFilter) -> Result<Vec<EventRow>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events
              WHERE ($1::text IS NULL OR provider = $1)
                AND ($2::text IS NULL OR transaction_id = $2 OR parent_transaction_id = $2)
                AND ($3::timestamptz IS NULL OR received_at >= $3)
                AND ($4::timestamptz IS NULL OR received_at < $4)
                AND ($5::text IS NULL OR status = $5)
              ORDER BY received_at DESC, id DESC LIMIT $6"
        );
        let rows = client
            .query(
                &sql,
                &[
                    &filter.provider,
                    &filter.transaction_id,
                    &filter.since,
                    &filter.until,
                    &filter.status,
                    &filter.limit,
                ],
            )
            .await?;
        Ok(rows.iter().map(event_row).collect())
    }

    /// Puts every matching dead event back in the queue (`fencehook
    /// replay`), [`REPLAY_BATCH`] per statement: [`Store::replay_in_batches`].
    /// Returns what was re-queued.
    pub async fn replay(&self, which: &Replay) -> Result<Vec<EventRow>, StoreError> {
        Ok(self
            .replay_in_batches(which, None, usize::MAX)
            .await?
            .events)
    }

    /// Puts dead events back in the queue (attempts from zero, their age
    /// from now: the replay is an entry of their history, `{at, replay}`);
    /// their rows too. Oldest first, [`REPLAY_BATCH`] per statement (each
    /// its own transaction: a large replay holds no lock for long and never
    /// reads every match at once), `at_most` of them when given. Returns
    /// how many were re-queued, in how many statements, and the first `keep`
    /// of them.
    pub async fn replay_in_batches(
        &self,
        which: &Replay,
        at_most: Option<i64>,
        keep: usize,
    ) -> Result<Replayed, StoreError> {
        let client = self.writer().await?;
        let sql = format!(
            "WITH pick AS (
                SELECT id FROM events
                 WHERE {REPLAY_MATCH}
                   AND ($7::timestamptz IS NULL OR (received_at, id) > ($7, $8::int8))
                 ORDER BY received_at, id LIMIT $9
                 FOR UPDATE SKIP LOCKED),
             again AS (
                UPDATE events SET status = 'queued', attempts = 0, next_attempt_at = now(),
                       locked_until = NULL, finished_at = NULL,
                       errors = errors || jsonb_build_array(jsonb_build_object(
                           'at', now(), 'replay', 1 + (SELECT count(*) FROM jsonb_array_elements(errors) e
                                                        WHERE e ? 'replay')))
                 WHERE id IN (SELECT id FROM pick) AND status = 'dead'
                RETURNING *),
             rows AS (
                UPDATE payments p SET status = 'queued', updated_at = now()
                  FROM again WHERE p.provider = again.provider
                   AND p.transaction_id = again.transaction_id AND p.status = 'dead'
                RETURNING p.id),
             wake AS (SELECT pg_notify('fencehook_inbox', '') FROM again LIMIT 1)
             SELECT {EVENT_COLUMNS} FROM again
              WHERE (SELECT count(*) FROM rows) >= 0 AND (SELECT count(*) FROM wake) >= 0
              ORDER BY received_at, id"
        );
        let mut done = Replayed::default();
        let mut after: (Option<OffsetDateTime>, i64) = (None, 0);
        loop {
            let room = at_most.map_or(REPLAY_BATCH, |n| (n - done.count).min(REPLAY_BATCH));
            if room <= 0 {
                break;
            }
            let rows = client
                .watch()
                .statement(client.query(
                    &sql,
                    &[
                        &which.provider,
                        &which.transaction_id,
                        &which.since,
                        &which.event_id,
                        &which.last_error,
                        &which.died_by,
                        &after.0,
                        &after.1,
                        &room,
                    ],
                ))
                .await?;
            done.batches += 1;
            done.count += rows.len() as i64;
            let Some(last) = rows.last() else { break };
            after = (Some(last.get("received_at")), last.get("id"));
            let room_left = keep.saturating_sub(done.events.len());
            done.events
                .extend(rows.iter().take(room_left).map(event_row));
            if (rows.len() as i64) < room {
                break;
            }
        }
        Ok(done)
    }

    /// How many dead events [`Store::replay`] would re-queue now (counted up
    /// to `cap`, plus one to tell there are more), re-queuing nothing (the
    /// console's dry run): the same conditions. Also the database's time of
    /// the count, the bound of a confirmation ([`Replay::died_by`]).
    pub async fn replay_count(
        &self,
        which: &Replay,
        cap: i64,
    ) -> Result<(i64, OffsetDateTime), StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT count(*), now() FROM (SELECT 1 FROM events WHERE {REPLAY_MATCH} LIMIT $7) m"
        );
        let row = client
            .query_one(
                &sql,
                &[
                    &which.provider,
                    &which.transaction_id,
                    &which.since,
                    &which.event_id,
                    &which.last_error,
                    &which.died_by,
                    &(cap.saturating_add(1)),
                ],
            )
            .await?;
        Ok((row.get(0), row.get(1)))
    }

    /// Deletes finished events received before `before` (and quarantined
    /// items last seen before it). Dead events are kept until replayed or
    /// pruned with `dead`. Returns (events, quarantined items) deleted.
    pub async fn prune(
        &self,
        before: OffsetDateTime,
        dead: bool,
    ) -> Result<(u64, u64), StoreError> {
        let client = self.writer().await?;
        let watch = client.watch();
        let events = watch
            .statement(client.execute(
                "DELETE FROM events WHERE received_at < $1
                   AND (status = 'done' OR ($2 AND status = 'dead'))",
                &[&before, &dead],
            ))
            .await?;
        let items = watch
            .statement(client.execute(
                "DELETE FROM quarantined_items WHERE last_seen_at < $1",
                &[&before],
            ))
            .await?;
        Ok((events, items))
    }

    /// What [`Store::prune`] would delete now, deleting nothing: (events,
    /// quarantined items), counted with the same conditions.
    pub async fn prune_count(
        &self,
        before: OffsetDateTime,
        dead: bool,
    ) -> Result<(u64, u64), StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM events WHERE received_at < $1
                           AND (status = 'done' OR ($2 AND status = 'dead'))),
                        (SELECT count(*) FROM quarantined_items WHERE last_seen_at < $1)",
                &[&before, &dead],
            )
            .await?;
        let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Ok((count(0), count(1)))
    }
}

/// Filters of `fencehook events`; `None` matches anything.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub provider: Option<String>,
    /// Matches the event's own transaction or its parent payment.
    pub transaction_id: Option<String>,
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    pub status: Option<String>,
    pub limit: i64,
}

/// Which dead events `fencehook replay` (and the console) re-queues; `None`
/// matches anything.
#[derive(Debug, Clone, Default)]
pub struct Replay {
    pub provider: Option<String>,
    pub transaction_id: Option<String>,
    pub since: Option<OffsetDateTime>,
    /// One event (the console's replay button).
    pub event_id: Option<i64>,
    /// The dead events that failed with this error (a group of the
    /// console's dead events).
    pub last_error: Option<String>,
    /// The dead events that died by then (a confirmation replays what its
    /// dry run counted, not what died since).
    pub died_by: Option<OffsetDateTime>,
}

/// Dead events re-queued per statement by [`Store::replay_in_batches`].
pub const REPLAY_BATCH: i64 = 500;

/// What [`Store::replay_in_batches`] did.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Events re-queued.
    pub count: i64,
    /// Statements it took (the last one may re-queue none).
    pub batches: u32,
    /// The first of them, oldest first, as many as asked to keep.
    pub events: Vec<EventRow>,
}

/// The dead events a [`Replay`] matches (parameters $1 to $6, in its
/// fields' order). Only `dead` ones: replaying what is queued or done
/// changes nothing, so a replay asked twice re-queues once.
const REPLAY_MATCH: &str = "status = 'dead'
                   AND ($1::text IS NULL OR provider = $1)
                   AND ($2::text IS NULL OR transaction_id = $2)
                   AND ($3::timestamptz IS NULL OR received_at >= $3)
                   AND ($4::int8 IS NULL OR id = $4)
                   AND ($5::text IS NULL OR last_error = $5)
                   AND ($6::timestamptz IS NULL OR finished_at <= $6)";

/// One ledger entry, as `inspect` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct EntryView {
    pub transaction_id: String,
    pub effect: String,
    pub amount_minor: i64,
    /// `amount_minor` in major units, as in [`PaymentRecord`].
    pub amount: Option<String>,
    pub currency: String,
    pub fence: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// Everything known about one transaction: its row, its children (refunds
/// and disputes of a payment), their ledger entries, their events and the
/// answers their deliveries were given.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub row: Option<PaymentRecord>,
    pub children: Vec<PaymentRecord>,
    pub entries: Vec<EntryView>,
    pub events: Vec<EventRow>,
    /// Its delivery history and its refunds' and disputes', oldest first
    /// (both modes: see [`crate::store::history`]).
    pub deliveries: Vec<super::history::DeliveryRow>,
    /// Its events (and its refunds' and disputes') that reconciliation
    /// booked because their webhook never arrived, with the run that did.
    pub recovered: Vec<super::reconcile::RecoveredBy>,
}

impl Inspection {
    /// Whether anything of the transaction is stored: its row, an event, or
    /// an answered delivery (a refused refund has no row, only its answer).
    pub fn is_known(&self) -> bool {
        self.row.is_some() || !self.events.is_empty() || !self.deliveries.is_empty()
    }
}

impl Store {
    /// What `fencehook inspect` shows for (provider, transaction_id).
    pub async fn inspect(
        &self,
        provider: &str,
        transaction_id: &str,
    ) -> Result<Inspection, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                &format!("SELECT {RECORD_COLUMNS} FROM payments WHERE provider = $1 AND transaction_id = $2"),
                &[&provider, &transaction_id],
            )
            .await?
            .map(|r| payment_record(&r));
        let children = client
            .query(
                &format!(
                    "SELECT {RECORD_COLUMNS} FROM payments WHERE provider = $1 AND parent_transaction_id = $2 ORDER BY id"
                ),
                &[&provider, &transaction_id],
            )
            .await?
            .iter()
            .map(payment_record)
            .collect();
        let entries = client
            .query(
                "SELECT p.transaction_id, l.effect, l.amount_minor, l.currency, l.fence, l.created_at
                   FROM ledger_entries l JOIN payments p ON p.id = l.payment_id
                  WHERE p.provider = $1 AND (p.transaction_id = $2 OR p.parent_transaction_id = $2)
                  ORDER BY l.id",
                &[&provider, &transaction_id],
            )
            .await?
            .iter()
            .map(|r| {
                let (amount_minor, currency): (i64, String) = (r.get(2), r.get(3));
                EntryView {
                    transaction_id: r.get(0),
                    effect: r.get(1),
                    amount: major_amount(amount_minor, &currency),
                    amount_minor,
                    currency,
                    fence: r.get(4),
                    created_at: r.get(5),
                }
            })
            .collect();
        let events = self
            .events(&EventFilter {
                provider: Some(provider.to_owned()),
                transaction_id: Some(transaction_id.to_owned()),
                limit: 1000,
                ..EventFilter::default()
            })
            .await?;
        let deliveries = self.deliveries(provider, transaction_id).await?;
        let recovered = self
            .recovered_by_reconcile(provider, transaction_id)
            .await?;
        Ok(Inspection {
            row,
            children,
            entries,
            events,
            deliveries,
            recovered,
        })
    }
}
