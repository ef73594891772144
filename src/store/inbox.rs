//! The inbox's SQL: accept an event in one statement, take due events
//! without blocking other workers, and settle each attempt's result.
//!
//! # What must stay true
//!
//! - Accepting is one statement (one transaction): the event, and the
//!   payments row of a new object (`queued`), or nothing. Its commit is the
//!   `accepted` answer's promise; the `NOTIFY` that wakes the workers follows
//!   in a statement of its own (`crate::inbox`).
//! - An event is deduplicated by (provider, transaction id, event type): a
//!   PSP's re-send under a new envelope is the same event.
//! - A worker owns an event only while `locked_until` is ahead; past it (the
//!   worker died) another may take it. The worker extends the lock while its
//!   attempt lives ([`Store::renew_locks`]), so the lock is short and a dead
//!   worker's event is taken again soon. Each take's (and renewal's) lock
//!   value is the attempt's mark: its result is recorded only while the event
//!   still carries it. The booking itself is fenced by the lease's token like
//!   every write (`store::Connection`), so a worker rescued too early still
//!   cannot book twice.
//! - The accept, and every settle but done, are flushed before they answer.
//!   The take and the done are not (`unflushed!`): losing either to a crash
//!   of PostgreSQL only has an event taken again, which the lifecycle then
//!   finds booked; a done never outlives the booking it records.
//! - Every taken event is read alone: one this binary cannot read is given
//!   back as [`Unreadable`] (and made `dead` by the worker), never failing the
//!   take of the others.
//! - No statement's work grows with the table. Every lookup names all the
//!   columns of the index it is meant to use, so a plan cached while the
//!   table was empty cannot fall back on another index that ties with it on
//!   an empty table (the accept's duplicate check once read every event of
//!   its provider that way). The two statements over arrays of events (take
//!   and done) are sent unprepared, so each is planned for the table as it is
//!   (a plan cached on an empty table scans it whole).

use std::time::Duration;

use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio_postgres::types::{Json, Type};

use super::{payment_at, PaymentRow, Store, StoreError};
use crate::domain::{payment_event_matches, CanonicalEvent, EventKind, ObjectKind, Status};

/// The channel accepts notify and workers listen on.
pub const CHANNEL: &str = "fencehook_inbox";

/// What an accept found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Stored: the event will be booked.
    New,
    /// This event (same transaction, type and payload) was accepted before.
    Duplicate,
    /// Same transaction (or same event), another payload.
    Mismatch,
}

/// One delivery's event, for [`Store::accept_many`].
#[derive(Debug, Clone)]
pub struct ToAccept {
    pub event: CanonicalEvent,
    pub fingerprint: String,
    pub psp_event_id: Option<String>,
    pub body: String,
    /// The W3C trace context it was accepted under (tracing on), kept for
    /// the workers' attempts ([`crate::telemetry::propagation`]).
    pub trace_context: Option<String>,
    /// A refund its PSP may have meant as a cancel: which it was is decided
    /// by the worker that books it ([`crate::domain::cancelled`]).
    pub cancel_if_payment_failed: bool,
}

/// What `events.canonical` holds: the canonical event and, beside it, the
/// trace context it was accepted under and whether it may be a cancel. Kept
/// in the event's own JSON rather than columns of their own, so that inbox
/// mode runs on every schema it ran on (a column would need a migration
/// first); the workers read the event with serde, which passes over the
/// extra keys.
#[derive(Debug, Serialize)]
struct Stored<'a> {
    #[serde(flatten)]
    event: &'a CanonicalEvent,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_context: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    cancel_if_payment_failed: bool,
}

/// What a worker reads of `events.canonical` beside the event (see [`Stored`]).
#[derive(Debug, Deserialize)]
struct StoredMarks {
    #[serde(default)]
    cancel_if_payment_failed: bool,
}

/// What an accept statement returned for one event.
struct Seen {
    /// The object's stored fingerprint, as the statement's snapshot saw it.
    existing: Option<String>,
    /// The event's id, when the statement inserted it.
    inserted: Option<i64>,
    /// Whether it inserted the object's payments row.
    row_inserted: bool,
    /// The stored event's fingerprint, as the snapshot saw it.
    event_fp: Option<String>,
}

/// What an accept found, from what its statement returned; `None` when its
/// snapshot cannot tell. The statement's snapshot is taken when it starts:
/// a concurrent accept of the same event (or object) that commits meanwhile
/// makes its insert do nothing, yet is invisible to its reads. Then only a
/// look after the statement knows ([`Store::after_race`]).
fn accepted(event: EventKind, fingerprint: &str, seen: &Seen) -> Option<Accepted> {
    if seen.existing.as_deref().is_some_and(|fp| fp != fingerprint) {
        Some(Accepted::Mismatch)
    } else if seen.inserted.is_some() {
        // The object was there (with this payload), or we stored it; else
        // another accept stored it meanwhile, maybe with another payload.
        (seen.existing.is_some() || seen.row_inserted).then_some(Accepted::New)
    } else {
        // None: our insert met an event our snapshot does not see.
        seen.event_fp
            .as_deref()
            .map(|fp| as_stored(event, fp == fingerprint))
    }
}

/// The answer to an event of a type its object already has stored: a copy
/// when the payloads are the same, or when it is a payment's failure (a
/// decline moves no money, whatever its amount: the one stored is as good);
/// else a mismatch.
fn as_stored(event: EventKind, same_payload: bool) -> Accepted {
    if same_payload || event == EventKind::PaymentFailed {
        Accepted::Duplicate
    } else {
        Accepted::Mismatch
    }
}

fn seen(row: &tokio_postgres::Row, at: usize) -> Seen {
    Seen {
        existing: row.get(at),
        inserted: row.get(at + 1),
        row_inserted: row.get(at + 2),
        event_fp: row.get(at + 3),
    }
}

/// An event a worker took.
#[derive(Debug, Clone)]
pub struct Taken {
    pub id: i64,
    pub event: CanonicalEvent,
    /// Attempts spent before this one.
    pub attempts: i32,
    pub received_at: OffsetDateTime,
    /// What its age (`FENCEHOOK_MAX_AGE_SECS`) counts from: its last replay,
    /// or its acceptance.
    pub age_from: OffsetDateTime,
    /// The trace context it was accepted under, if it was traced.
    pub trace_context: Option<String>,
    /// See [`ToAccept::cancel_if_payment_failed`].
    pub cancel_if_payment_failed: bool,
    /// When it was taken (the database's clock): a `next_attempt_at` past it
    /// means what it waits for was booked during the attempt (V11's trigger).
    pub taken_at: OffsetDateTime,
    /// The lock this take (or its last renewal) set: the attempt's result is
    /// recorded only while the event still carries it. A worker that stalled
    /// past its lock, whose event was taken again, records nothing over the
    /// new attempt.
    pub locked_until: OffsetDateTime,
    /// Its object's payments row as the take read it: the worker's fast-path
    /// lookup, one statement fewer per event. Only a hint, as in sync mode:
    /// the fenced claim decides.
    pub row: Option<PaymentRow>,
}

/// A taken event this binary cannot read (its stored canonical form does not
/// decode: a rollback to an older binary after a new event kind, a hand
/// edit). Taken like the others, so it can be made `dead` under its lock.
#[derive(Debug, Clone)]
pub struct Unreadable {
    pub id: i64,
    pub locked_until: OffsetDateTime,
    /// Why it cannot be read.
    pub error: String,
}

/// What [`Store::take_after`] did.
#[derive(Debug)]
pub struct Took {
    /// The ids of the previous take's events recorded done: one missing no
    /// longer carried that take's lock (see [`Store::settle`]).
    pub done: Vec<i64>,
    /// The events taken now.
    pub taken: Vec<Result<Taken, Unreadable>>,
}

/// How an attempt ended, for the event's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// Applied, or found already applied: done.
    Done,
    /// The business step failed: one attempt spent, next try after `delay`.
    Retry { delay: Duration, error: String },
    /// Not this worker's fault (lease held elsewhere, a store down, a refund
    /// waiting for its payment): no attempt spent, next try after `delay`.
    Requeue { delay: Duration, reason: String },
    /// Given up until replayed.
    Dead { error: String, spent: bool },
}

/// The events of one status, counted for `fencehook_inbox_rows`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub queued: i64,
    pub processing: i64,
    pub dead: i64,
}

/// One stored event, as `inspect` and `events` show it.
#[derive(Debug, Clone, Serialize)]
pub struct EventRow {
    pub id: i64,
    pub status: String,
    pub provider: String,
    pub transaction_id: String,
    pub event_type: String,
    pub psp_event_id: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    /// The last replay (from its history): the event's age counts from it.
    #[serde(with = "time::serde::rfc3339::option")]
    pub replayed_at: Option<OffsetDateTime>,
    pub replays: i32,
    pub attempts: i32,
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt_at: Option<OffsetDateTime>,
    pub last_error: Option<String>,
    pub errors: serde_json::Value,
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
}

/// `existing` is the fingerprint of the object's row, taken as the event's
/// own where the fenced write matches the row anyway (`fenced_upsert!` in
/// the store): a payment's success while no success has settled it (its
/// amount and currency stand, whether the failure before it is booked,
/// queued or dead), a payment's failure (it answers by status) and a refund from before refunds named their payment (fingerprinted with
/// an empty parent). A row is still *there* in those cases: an accept that
/// raced another is told apart from one that found the row by it.
const ACCEPT: &str = "\
WITH existing AS (
    SELECT CASE WHEN (kind = 'payment' AND $10 = 'payment'
                      AND (status <> 'succeeded' OR $3 = 'payment.failed'))
                  OR (kind = 'refund' AND parent_transaction_id IS NULL
                      AND fingerprint = encode(sha256(convert_to(concat_ws(chr(31), 'v2', $1::text, $2::text,
                          'refund', $11::int8::text, $12::text, ''), 'UTF8')), 'hex'))
                THEN $7::text ELSE fingerprint::text END AS fingerprint
      FROM payments WHERE provider = $1 AND transaction_id = $2),
ev AS (
    INSERT INTO events (provider, transaction_id, event_type, parent_transaction_id,
                        delivery_id, psp_event_id, fingerprint, canonical, body)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
     WHERE NOT EXISTS (SELECT 1 FROM existing WHERE fingerprint <> $7)
    ON CONFLICT ON CONSTRAINT events_provider_transaction_id_event_type_key DO NOTHING
    RETURNING id),
row AS (
    INSERT INTO payments (provider, transaction_id, kind, parent_transaction_id, event_type,
                          amount_minor, currency, fingerprint, status, fence, occurred_at)
    SELECT $1, $2::text, $10::text, $4::text, $3::text, $11::int8, $12::text, $7, 'queued', 0, $13
     WHERE EXISTS (SELECT 1 FROM ev)
    ON CONFLICT ON CONSTRAINT payments_provider_transaction_id_key DO NOTHING
    RETURNING id)
SELECT (SELECT fingerprint FROM existing),
       (SELECT id FROM ev),
       EXISTS (SELECT 1 FROM row),
       (SELECT fingerprint FROM events
         WHERE provider = $1 AND transaction_id = $2 AND event_type = $3)";

/// [`ACCEPT`] for several events of distinct transactions at once: the
/// same statement over arrays, one row per event (`n`, its place) with what
/// the single statement returns. Distinct transactions make each event's
/// checks independent of the others', so the answers are those the events
/// would get one by one. Unprepared: see the module's rules.
const ACCEPT_MANY: &str = "\
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                         $7::text[], $8::text[], $9::text[], $10::text[], $11::int8[], $12::text[],
                         $13::timestamptz[])
           WITH ORDINALITY AS i(provider, transaction_id, event_type, parent, delivery_id,
                                psp_event_id, fingerprint, canonical, body, kind, amount, currency,
                                occurred_at, n)),
existing AS (
    SELECT i.n,
           CASE WHEN (p.kind = 'payment' AND i.kind = 'payment'
                      AND (p.status <> 'succeeded' OR i.event_type = 'payment.failed'))
                  OR (p.kind = 'refund' AND p.parent_transaction_id IS NULL
                      AND p.fingerprint = encode(sha256(convert_to(concat_ws(chr(31), 'v2', i.provider,
                          i.transaction_id, 'refund', i.amount::text, i.currency, ''), 'UTF8')), 'hex'))
                THEN i.fingerprint ELSE p.fingerprint::text END AS fingerprint
      FROM input i
      JOIN payments p ON p.provider = i.provider AND p.transaction_id = i.transaction_id),
ev AS (
    INSERT INTO events (provider, transaction_id, event_type, parent_transaction_id,
                        delivery_id, psp_event_id, fingerprint, canonical, body)
    SELECT provider, transaction_id, event_type, parent, delivery_id, psp_event_id, fingerprint,
           canonical::jsonb, body
      FROM input i
     WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.n = i.n AND e.fingerprint <> i.fingerprint)
     ORDER BY i.n
    ON CONFLICT ON CONSTRAINT events_provider_transaction_id_event_type_key DO NOTHING
    RETURNING id, provider, transaction_id),
row AS (
    INSERT INTO payments (provider, transaction_id, kind, parent_transaction_id, event_type,
                          amount_minor, currency, fingerprint, status, fence, occurred_at)
    SELECT i.provider, i.transaction_id, i.kind, i.parent, i.event_type, i.amount, i.currency,
           i.fingerprint, 'queued', 0, i.occurred_at
      FROM input i JOIN ev ON ev.provider = i.provider AND ev.transaction_id = i.transaction_id
     ORDER BY i.n
    ON CONFLICT ON CONSTRAINT payments_provider_transaction_id_key DO NOTHING
    RETURNING provider, transaction_id)
SELECT i.n,
       (SELECT e.fingerprint FROM existing e WHERE e.n = i.n),
       (SELECT ev.id FROM ev WHERE ev.provider = i.provider AND ev.transaction_id = i.transaction_id),
       EXISTS (SELECT 1 FROM row WHERE row.provider = i.provider
                                   AND row.transaction_id = i.transaction_id),
       (SELECT x.fingerprint FROM events x
         WHERE x.provider = i.provider AND x.transaction_id = i.transaction_id
           AND x.event_type = i.event_type)
  FROM input i ORDER BY i.n";

const NOTIFY: &str = "SELECT pg_notify('fencehook_inbox', '')";
const WAKES_OFF: &str = "SELECT 1 FROM pg_trigger
    WHERE tgrelid = 'payments'::regclass AND tgname = 'payments_wake_waiting' AND tgenabled = 'D'";

/// The part of [`TAKE`] and [`DONE`] (a `WITH` query) that lets their
/// commit return before the WAL is flushed (`synchronous_commit = off` for
/// that transaction only): a flush costs milliseconds, which a worker spent
/// waiting twice between two takes, and what either records can be lost to
/// a crash of PostgreSQL without harm. The bookings they record were committed, flushed, before
/// (a done is recorded only after its booking's commit, and the WAL is
/// flushed in order, so no done outlives its booking); a lost done leaves
/// its event `processing` until its lock runs out, then it is taken again
/// and the lifecycle finds it booked (done, nothing written); a lost take
/// leaves its events queued, taken again while the first attempt's result
/// is not recorded (the take's lock is gone). The accept, the bookings, and
/// every other settle (a retry spends an attempt) are flushed before they
/// answer, as always.
macro_rules! unflushed {
    () => {
        "unflushed AS (SELECT set_config('synchronous_commit', 'off', true))"
    };
}

/// Up to `$2` due queued events, locked until `$1` ms from now (one lock
/// value for all of them: `now()` is the statement's), each with its
/// payments row as the fast-path lookup reads it; and, in the same
/// statement, the events `$3` of the worker's previous take (lock `$4`)
/// recorded done ([`DONE`]'s update; their ids in column 12). One row
/// per event taken, or one row of NULLs besides the done ids when none is
/// due. Its commit is not waited for (`unflushed!`). Unprepared: see the
/// module's rules.
const TAKE: &str = concat!(
    "\
WITH done AS (
    UPDATE events SET status = 'done', finished_at = now(), locked_until = NULL
     WHERE id = ANY($3) AND status = 'processing' AND locked_until = $4
    RETURNING id),
taken AS (
    UPDATE events SET status = 'processing', locked_until = now() + $1 * interval '1 millisecond'
     WHERE id = ANY(ARRAY(SELECT id FROM events WHERE status = 'queued' AND next_attempt_at <= now()
                           ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING id, provider, transaction_id, canonical, attempts, received_at, locked_until,
              coalesce((SELECT max((e->>'at')::timestamptz) FROM jsonb_array_elements(errors) e
                         WHERE e ? 'replay'), received_at) AS age_from),
",
    unflushed!(),
    "
SELECT t.id, t.canonical, t.attempts, t.received_at, t.locked_until,
       p.id, p.kind, p.status, p.fingerprint, p.fence, t.age_from, now(),
       (SELECT array_agg(id) FROM done),
       t.canonical->>'trace_context'
  FROM unflushed LEFT JOIN (taken t LEFT JOIN payments p
       ON p.provider = t.provider AND p.transaction_id = t.transaction_id) ON true"
);

/// Extends the lock `$2` of the events `$1` still carrying it to `$3` ms
/// from now; returns the new lock (one value: `now()` is the statement's).
/// Unprepared: see the module's rules.
const RENEW: &str = "\
UPDATE events SET locked_until = now() + $3 * interval '1 millisecond'
 WHERE id = ANY($1) AND status = 'processing' AND locked_until = $2
RETURNING locked_until";

/// Events whose worker's lock ran out (it died, or stalled): due again.
const RESCUE: &str = "\
WITH again AS (
    UPDATE events SET status = 'queued', locked_until = NULL, next_attempt_at = now()
     WHERE id IN (SELECT id FROM events WHERE status = 'processing' AND locked_until <= now()
                   LIMIT 1000 FOR UPDATE SKIP LOCKED)
    RETURNING id)
SELECT count(*) FROM again";

/// Records the events `$1` of one take (lock `$2`) done; returns the ids
/// recorded. (What waited for a payment among them is woken by the booking
/// itself: V11's trigger on `payments`.) A worker records its done events
/// with its next take ([`TAKE`]); this is for the last ones, when it stops.
/// Its commit is not waited for (`unflushed!`). Unprepared: see the
/// module's rules.
const DONE: &str = concat!(
    "\
WITH done AS (
    UPDATE events SET status = 'done', finished_at = now(), locked_until = NULL
     WHERE id = ANY($1) AND status = 'processing' AND locked_until = $2
    RETURNING id),
",
    unflushed!(),
    "
SELECT done.id FROM unflushed, done"
);

const RETRY: &str = "\
UPDATE events SET status = 'queued', attempts = attempts + 1, locked_until = NULL,
       next_attempt_at = now() + $2 * interval '1 millisecond', last_error = $3,
       errors = errors || jsonb_build_array(jsonb_build_object(
           'at', now(), 'attempt', attempts + 1, 'error', $3::text))
 WHERE id = $1 AND status = 'processing' AND locked_until = $4";

/// Puts an event back without spending an attempt; due at once when what
/// it waits for was booked during the attempt (V11's trigger moved its
/// `next_attempt_at` past `$5`, when it was taken).
const REQUEUE: &str = "\
UPDATE events SET status = 'queued', locked_until = NULL, last_error = $3,
       next_attempt_at = CASE WHEN next_attempt_at > $5 THEN now()
                              ELSE now() + $2 * interval '1 millisecond' END
 WHERE id = $1 AND status = 'processing' AND locked_until = $4";

/// Gives up on an event; its object's row, if no event ever settled it, is
/// marked `dead` too.
const DEAD: &str = "\
WITH ev AS (
    UPDATE events SET status = 'dead', locked_until = NULL, finished_at = now(), last_error = $2,
           attempts = attempts + $3,
           errors = CASE WHEN $3 = 1 THEN errors || jsonb_build_array(jsonb_build_object(
               'at', now(), 'attempt', attempts + 1, 'error', $2::text)) ELSE errors END
     WHERE id = $1 AND status = 'processing' AND locked_until = $4
    RETURNING provider, transaction_id),
pay AS (
    UPDATE payments p SET status = 'dead', updated_at = now()
      FROM ev WHERE p.provider = ev.provider AND p.transaction_id = ev.transaction_id
       AND p.status IN ('queued', 'processing'))
SELECT count(*) FROM ev";

const COUNTS: &str = "\
SELECT (SELECT count(*) FROM events WHERE status = 'queued'),
       (SELECT count(*) FROM events WHERE status = 'processing'),
       (SELECT count(*) FROM events WHERE status = 'dead')";

/// An event's replays are entries of its history (`errors`: `{at, replay}`).
pub(super) const EVENT_COLUMNS: &str =
    "id, status, provider, transaction_id, event_type, psp_event_id, \
     received_at, attempts, next_attempt_at, last_error, errors, finished_at, \
     (SELECT max((e->>'at')::timestamptz) FROM jsonb_array_elements(errors) e \
       WHERE e ? 'replay') AS replayed_at, \
     (SELECT count(*)::int4 FROM jsonb_array_elements(errors) e WHERE e ? 'replay') AS replays";

impl Store {
    /// Stores an accepted event (and the row of a new object) in one statement.
    pub async fn accept(
        &self,
        ev: &CanonicalEvent,
        fingerprint: &str,
        psp_event_id: Option<&str>,
        body: &str,
        trace_context: Option<&str>,
        cancel_if_payment_failed: bool,
    ) -> Result<Accepted, StoreError> {
        let client = self.writer().await?;
        let stmt = client.prepare_cached(ACCEPT).await?;
        let delivery_id = delivery_id(ev);
        let row = client
            .watch()
            .statement(client.query_one(
                &stmt,
                &[
                    &ev.provider,
                    &ev.transaction_id,
                    &ev.event_type.as_str(),
                    &ev.parent_transaction_id,
                    &delivery_id,
                    &psp_event_id,
                    &fingerprint,
                    &Json(Stored {
                        event: ev,
                        trace_context,
                        cancel_if_payment_failed,
                    }),
                    &body,
                    &ev.event_type.object().as_str(),
                    &ev.amount_minor,
                    &ev.currency,
                    &ev.occurred_at,
                ],
            ))
            .await?;
        let seen = seen(&row, 0);
        match accepted(ev.event_type, fingerprint, &seen) {
            Some(answer) => Ok(answer),
            None => self.after_race(ev, fingerprint, seen.inserted).await,
        }
    }

    /// The answer of an accept whose statement raced another accept of the
    /// same event or object (see [`accepted`]), from what is committed now
    /// (the other statement's insert waited for it): the payload sync mode
    /// would compare against. An event we stored for an object stored
    /// meanwhile with another payload is deleted again while no worker has
    /// taken it (one that took it finds the mismatch and makes it `dead`).
    async fn after_race(
        &self,
        ev: &CanonicalEvent,
        fingerprint: &str,
        inserted: Option<i64>,
    ) -> Result<Accepted, StoreError> {
        let reader = self.pool.get().await?;
        let row = reader
            .query_one(
                "SELECT p.fingerprint, p.kind, p.status,
                        (SELECT fingerprint FROM events
                          WHERE provider = $1 AND transaction_id = $2 AND event_type = $3)
                   FROM (SELECT 1) one
                   LEFT JOIN payments p ON p.provider = $1 AND p.transaction_id = $2",
                &[&ev.provider, &ev.transaction_id, &ev.event_type.as_str()],
            )
            .await?;
        drop(reader);
        let existing: Option<String> = row.get(0);
        let matches_anyway = match (row.get::<_, Option<&str>>(1), row.get(2)) {
            (Some(kind), Some(status)) => ObjectKind::parse(kind)
                .zip(Status::parse(status))
                .is_some_and(|(kind, status)| payment_event_matches(kind, status, ev.event_type)),
            _ => false,
        };
        let event_fp: Option<String> = row.get(3);
        match inserted {
            Some(id)
                if !matches_anyway && existing.as_deref().is_some_and(|fp| fp != fingerprint) =>
            {
                let client = self.writer().await?;
                client
                    .watch()
                    .statement(client.execute(
                        "DELETE FROM events WHERE id = $1 AND status = 'queued' AND attempts = 0",
                        &[&id],
                    ))
                    .await?;
                Ok(Accepted::Mismatch)
            }
            Some(_) => Ok(Accepted::New),
            None => match event_fp {
                Some(fp) => Ok(as_stored(ev.event_type, fp == fingerprint)),
                None => Err(StoreError::Corrupt(
                    "an accept's insert met an event that is gone".to_owned(),
                )),
            },
        }
    }

    /// Accepts several events with as few statements as it can, each
    /// answered as it would be alone, in their order: one statement
    /// ([`Store::accept_many`]) for the first event of each transaction, then
    /// the others each alone, side by side, as if they had arrived just after.
    /// When that statement fails, the first events are tried alone, side by
    /// side, before the others: one event's error is its own answer only, and
    /// a database that does not answer costs one wait, not one per event.
    pub async fn accept_together(&self, items: &[ToAccept]) -> Vec<Result<Accepted, StoreError>> {
        let key = |i: usize| (&items[i].event.provider, &items[i].event.transaction_id);
        let mut seen = std::collections::HashSet::new();
        let (mut firsts, others): (Vec<usize>, Vec<usize>) =
            (0..items.len()).partition(|&i| seen.insert(key(i)));
        // In key order: two statements that insert the same transactions
        // (copies that came to both) then take their locks in the same order
        // and cannot deadlock.
        firsts.sort_by_key(|&i| key(i));
        let mut results: Vec<Option<Result<Accepted, StoreError>>> =
            items.iter().map(|_| None).collect();
        let mut alone = firsts.clone();
        if firsts.len() > 1 {
            let batch: Vec<&ToAccept> = firsts.iter().map(|&i| &items[i]).collect();
            match self.accept_many_each(&batch).await {
                Ok(answers) => {
                    for (&i, answer) in firsts.iter().zip(answers) {
                        results[i] = Some(answer);
                    }
                    alone.clear();
                }
                Err(e) => {
                    tracing::debug!(events = batch.len(), error = %crate::report::chain(&e),
                        "a batched accept failed; accepting its events one by one");
                }
            }
        }
        for round in [alone, others] {
            let answers = join_all(round.iter().map(|&i| {
                let item = &items[i];
                self.accept(
                    &item.event,
                    &item.fingerprint,
                    item.psp_event_id.as_deref(),
                    &item.body,
                    item.trace_context.as_deref(),
                    item.cancel_if_payment_failed,
                )
            }))
            .await;
            for (&i, answer) in round.iter().zip(answers) {
                results[i] = Some(answer);
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every event answered"))
            .collect()
    }

    /// [`Store::accept`] for several events in one statement, answered in
    /// their order. Their transactions must be distinct (a caller with two
    /// events of one transaction accepts the second after the first).
    pub async fn accept_many(&self, items: &[&ToAccept]) -> Result<Vec<Accepted>, StoreError> {
        self.accept_many_each(items).await?.into_iter().collect()
    }

    /// [`Store::accept_many`], with the answer of each event apart once the
    /// statement committed: a look after a race that fails is that event's
    /// error only (accepting the others again would answer them `duplicate`).
    async fn accept_many_each(
        &self,
        items: &[&ToAccept],
    ) -> Result<Vec<Result<Accepted, StoreError>>, StoreError> {
        let mut keys: Vec<(&str, &str)> = items
            .iter()
            .map(|i| (i.event.provider.as_str(), i.event.transaction_id.as_str()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(
            keys.len(),
            items.len(),
            "accept_many: one event per transaction"
        );
        let col =
            |f: fn(&ToAccept) -> Option<String>| items.iter().map(|i| f(i)).collect::<Vec<_>>();
        let provider = col(|i| Some(i.event.provider.clone()));
        let transaction = col(|i| Some(i.event.transaction_id.clone()));
        let event_type = col(|i| Some(i.event.event_type.as_str().to_owned()));
        let parent = col(|i| i.event.parent_transaction_id.clone());
        let delivery = col(|i| Some(delivery_id(&i.event)));
        let psp_event_id = col(|i| i.psp_event_id.clone());
        let fingerprint = col(|i| Some(i.fingerprint.clone()));
        let canonical = items
            .iter()
            .map(|i| {
                serde_json::to_string(&Stored {
                    event: &i.event,
                    trace_context: i.trace_context.as_deref(),
                    cancel_if_payment_failed: i.cancel_if_payment_failed,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StoreError::Corrupt(format!("an event that does not serialize: {e}")))?;
        let body = col(|i| Some(i.body.clone()));
        let kind = col(|i| Some(i.event.event_type.object().as_str().to_owned()));
        let amount: Vec<i64> = items.iter().map(|i| i.event.amount_minor).collect();
        let currency = col(|i| Some(i.event.currency.clone()));
        let occurred: Vec<Option<OffsetDateTime>> =
            items.iter().map(|i| i.event.occurred_at).collect();
        let client = self.writer().await?;
        let rows = client
            .watch()
            .statement(client.query_typed(
                ACCEPT_MANY,
                &[
                    (&provider, Type::TEXT_ARRAY),
                    (&transaction, Type::TEXT_ARRAY),
                    (&event_type, Type::TEXT_ARRAY),
                    (&parent, Type::TEXT_ARRAY),
                    (&delivery, Type::TEXT_ARRAY),
                    (&psp_event_id, Type::TEXT_ARRAY),
                    (&fingerprint, Type::TEXT_ARRAY),
                    (&canonical, Type::TEXT_ARRAY),
                    (&body, Type::TEXT_ARRAY),
                    (&kind, Type::TEXT_ARRAY),
                    (&amount, Type::INT8_ARRAY),
                    (&currency, Type::TEXT_ARRAY),
                    (&occurred, Type::TIMESTAMPTZ_ARRAY),
                ],
            ))
            .await?;
        if rows.len() != items.len() {
            return Err(StoreError::Corrupt(format!(
                "{} answers to an accept of {} events",
                rows.len(),
                items.len()
            )));
        }
        drop(client);
        let mut answers = Vec::with_capacity(items.len());
        for (row, item) in rows.iter().zip(items) {
            let seen = seen(row, 1);
            answers.push(
                match accepted(item.event.event_type, &item.fingerprint, &seen) {
                    Some(answer) => Ok(answer),
                    None => {
                        self.after_race(&item.event, &item.fingerprint, seen.inserted)
                            .await
                    }
                },
            );
        }
        Ok(answers)
    }

    /// Takes up to `limit` due events, oldest due first, locked for `lock`;
    /// none when nothing is due. Each is read alone: one this binary cannot
    /// read comes back as [`Unreadable`], the others as they are.
    pub async fn take(
        &self,
        lock: Duration,
        limit: i64,
    ) -> Result<Vec<Result<Taken, Unreadable>>, StoreError> {
        Ok(self.take_after(&[], lock, limit).await?.taken)
    }

    /// [`Store::take`], recording in the same statement the events `done`
    /// of the worker's previous take done (as [`Store::settle_done`]; they
    /// must share one lock): a worker goes from one take's attempts straight
    /// to its next take, and the statement and commit of its done are saved.
    pub async fn take_after(
        &self,
        done: &[&Taken],
        lock: Duration,
        limit: i64,
    ) -> Result<Took, StoreError> {
        let done_lock = done.first().map(|t| t.locked_until);
        debug_assert!(done.iter().all(|t| Some(t.locked_until) == done_lock));
        let done_ids: Vec<i64> = done.iter().map(|t| t.id).collect();
        let client = self.writer().await?;
        let ms = lock.as_millis() as f64;
        let rows = client
            .watch()
            .statement(client.query_typed(
                TAKE,
                &[
                    (&ms, Type::FLOAT8),
                    (&limit, Type::INT8),
                    (&done_ids, Type::INT8_ARRAY),
                    (&done_lock, Type::TIMESTAMPTZ),
                ],
            ))
            .await?;
        let done = match rows.first() {
            Some(row) => row.try_get::<_, Option<Vec<i64>>>(12)?.unwrap_or_default(),
            None => Vec::new(),
        };
        let mut taken = Vec::with_capacity(rows.len());
        for row in &rows {
            // The one row of a take that found nothing due.
            let Some(id) = row.try_get::<_, Option<i64>>(0)? else {
                continue;
            };
            let locked_until: OffsetDateTime = row.try_get(4)?;
            taken.push(taken_row(row).map_err(|e| Unreadable {
                id,
                locked_until,
                error: crate::report::chain(&e),
            }));
        }
        Ok(Took { done, taken })
    }

    /// Extends the lock `lock` of the events `ids` by `duration` from now,
    /// for those still carrying it; the new lock, or `None` when none did
    /// (each was recorded, or taken again by another worker).
    pub async fn renew_locks(
        &self,
        ids: &[i64],
        lock: OffsetDateTime,
        duration: Duration,
    ) -> Result<Option<OffsetDateTime>, StoreError> {
        let client = self.writer().await?;
        let ms = duration.as_millis() as f64;
        let rows = client
            .watch()
            .statement(client.query_typed(
                RENEW,
                &[
                    (&ids, Type::INT8_ARRAY),
                    (&lock, Type::TIMESTAMPTZ),
                    (&ms, Type::FLOAT8),
                ],
            ))
            .await?;
        Ok(rows.first().map(|row| row.get(0)))
    }

    /// Records events of one take done, in one statement. Returns the ids
    /// recorded: an event missing from it no longer carries the take's lock
    /// (see [`Store::settle`]).
    pub async fn settle_done(&self, taken: &[&Taken]) -> Result<Vec<i64>, StoreError> {
        let Some(first) = taken.first() else {
            return Ok(Vec::new());
        };
        debug_assert!(taken.iter().all(|t| t.locked_until == first.locked_until));
        let client = self.writer().await?;
        let ids: Vec<i64> = taken.iter().map(|t| t.id).collect();
        let rows = client
            .watch()
            .statement(client.query_typed(
                DONE,
                &[
                    (&ids, Type::INT8_ARRAY),
                    (&first.locked_until, Type::TIMESTAMPTZ),
                ],
            ))
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// Makes an event this binary cannot read `dead` with the reason (no
    /// attempt spent); `false` when it no longer carries its take's lock.
    pub async fn settle_unreadable(&self, event: &Unreadable) -> Result<bool, StoreError> {
        let client = self.writer().await?;
        let stmt = client.prepare_cached(DEAD).await?;
        let error = format!("unreadable: {}", event.error);
        let row = client
            .watch()
            .statement(client.query_one(&stmt, &[&event.id, &error, &0i32, &event.locked_until]))
            .await?;
        Ok(row.get::<_, i64>(0) > 0)
    }

    /// Puts events whose worker's lock ran out back in the queue; how many.
    pub async fn rescue(&self) -> Result<i64, StoreError> {
        let client = self.writer().await?;
        let stmt = client.prepare_cached(RESCUE).await?;
        let row = client
            .watch()
            .statement(client.query_one(&stmt, &[]))
            .await?;
        Ok(row.get(0))
    }

    /// Records how an attempt ended; `false` when the event no longer
    /// carries this take's lock (it ran out and another worker took it, or a
    /// replay re-queued it): then the newer attempt's result stands.
    pub async fn settle(&self, taken: &Taken, settle: &Settle) -> Result<bool, StoreError> {
        let client = self.writer().await?;
        let watch = client.watch();
        let ms = |d: &Duration| d.as_millis() as f64;
        let (id, lock) = (&taken.id, &taken.locked_until);
        let rows = match settle {
            Settle::Done => {
                drop(client);
                return Ok(!self.settle_done(&[taken]).await?.is_empty());
            }
            Settle::Retry { delay, error } => {
                let stmt = client.prepare_cached(RETRY).await?;
                watch
                    .statement(client.execute(&stmt, &[id, &ms(delay), error, lock]))
                    .await?
            }
            Settle::Requeue { delay, reason } => {
                let stmt = client.prepare_cached(REQUEUE).await?;
                watch
                    .statement(
                        client.execute(&stmt, &[id, &ms(delay), reason, lock, &taken.taken_at]),
                    )
                    .await?
            }
            Settle::Dead { error, spent } => {
                let stmt = client.prepare_cached(DEAD).await?;
                let row = watch
                    .statement(client.query_one(&stmt, &[id, error, &i32::from(*spent), lock]))
                    .await?;
                row.get::<_, i64>(0) as u64
            }
        };
        Ok(rows > 0)
    }

    /// Tells every process's inbox listener that events were accepted. Its
    /// own statement, never inside an accept: PostgreSQL serializes the
    /// commits of transactions that NOTIFY behind one global lock, which
    /// halved the accept rate (docs/benchmarks.md).
    /// A NOTIFY takes a transaction id, so its commit waits for a
    /// synchronous standby like a write's: it is bounded like one.
    pub async fn notify_inbox(&self) -> Result<(), StoreError> {
        let client = self.writer().await?;
        let stmt = client.prepare_cached(NOTIFY).await?;
        client.watch().statement(client.execute(&stmt, &[])).await?;
        Ok(())
    }

    /// Switches on the trigger that wakes the events waiting for a payment
    /// once it is booked (V11), which V18 leaves off on a database that has
    /// held no event: sync mode alone then pays nothing for it. Returns
    /// whether it was off. Switching it on takes the `payments` table's lock
    /// for a moment (waiting at most 2 s for the writes in flight), once. Its
    /// commit does not wait for a synchronous standby (it is no money, and
    /// the accept behind it has its own bound): a failover that loses it
    /// leaves waiting events to their pause until an instance starts again.
    pub async fn switch_on_payment_wakes(&self) -> Result<bool, StoreError> {
        let mut client = self.writer().await?;
        if client.query_opt(WAKES_OFF, &[]).await?.is_none() {
            return Ok(false);
        }
        let watch = client.watch();
        let tx = client.transaction().await?;
        tx.batch_execute(
            "SET LOCAL lock_timeout = '2s';
             SET LOCAL synchronous_commit = local;
             ALTER TABLE payments ENABLE TRIGGER payments_wake_waiting",
        )
        .await?;
        watch.commit(tx.commit()).await?;
        Ok(true)
    }

    /// Events queued, being processed, and dead.
    pub async fn inbox_counts(&self) -> Result<Counts, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(COUNTS).await?;
        let row = client.query_one(&stmt, &[]).await?;
        Ok(Counts {
            queued: row.get(0),
            processing: row.get(1),
            dead: row.get(2),
        })
    }

    /// Bytes the events table takes on disk: its rows, indexes and TOAST
    /// (`fencehook_inbox_stored_bytes`).
    pub async fn events_stored_bytes(&self) -> Result<i64, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached("SELECT pg_total_relation_size('events')")
            .await?;
        Ok(client.query_one(&stmt, &[]).await?.get(0))
    }
}

/// One row of [`TAKE`] as a [`Taken`]; an error when this binary cannot read it.
fn taken_row(row: &tokio_postgres::Row) -> Result<Taken, StoreError> {
    let Json(event): Json<CanonicalEvent> = row.try_get(1)?;
    let Json(marks): Json<StoredMarks> = row.try_get(1)?;
    Ok(Taken {
        id: row.try_get(0)?,
        event,
        attempts: row.try_get(2)?,
        received_at: row.try_get(3)?,
        locked_until: row.try_get(4)?,
        row: payment_at(row, 5)?,
        age_from: row.try_get(10)?,
        taken_at: row.try_get(11)?,
        trace_context: row.try_get(13)?,
        cancel_if_payment_failed: marks.cancel_if_payment_failed,
    })
}

/// The key events are deduplicated on.
pub fn delivery_id(ev: &CanonicalEvent) -> String {
    format!("{}:{}", ev.transaction_id, ev.event_type.as_str())
}

pub(super) fn event_row(r: &tokio_postgres::Row) -> EventRow {
    EventRow {
        id: r.get("id"),
        status: r.get("status"),
        provider: r.get("provider"),
        transaction_id: r.get("transaction_id"),
        event_type: r.get("event_type"),
        psp_event_id: r.get("psp_event_id"),
        received_at: r.get("received_at"),
        replayed_at: r.get("replayed_at"),
        replays: r.get("replays"),
        attempts: r.get("attempts"),
        next_attempt_at: r.get("next_attempt_at"),
        last_error: r.get("last_error"),
        errors: r.get("errors"),
        finished_at: r.get("finished_at"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(existing: Option<&str>, inserted: bool, row: bool, event: Option<&str>) -> Seen {
        Seen {
            existing: existing.map(str::to_owned),
            inserted: inserted.then_some(1),
            row_inserted: row,
            event_fp: event.map(str::to_owned),
        }
    }

    #[test]
    fn an_accept_is_answered_from_its_snapshot_only_when_the_snapshot_can_tell() {
        let fp = "ours";
        // Alone: a new object, a new event of a known object, a repeat.
        assert_eq!(
            accepted(
                EventKind::PaymentSucceeded,
                fp,
                &seen(None, true, true, None)
            ),
            Some(Accepted::New)
        );
        assert_eq!(
            accepted(
                EventKind::PaymentSucceeded,
                fp,
                &seen(Some(fp), true, false, None)
            ),
            Some(Accepted::New)
        );
        assert_eq!(
            accepted(
                EventKind::PaymentSucceeded,
                fp,
                &seen(Some(fp), false, false, Some(fp))
            ),
            Some(Accepted::Duplicate)
        );
        // Another payload stored before.
        assert_eq!(
            accepted(
                EventKind::PaymentSucceeded,
                fp,
                &seen(Some("theirs"), false, false, None)
            ),
            Some(Accepted::Mismatch)
        );
        assert_eq!(
            accepted(
                EventKind::PaymentSucceeded,
                fp,
                &seen(None, false, false, Some("theirs"))
            ),
            Some(Accepted::Mismatch)
        );
        // A payment's failure at another amount than the one stored: a copy
        // of the decline.
        assert_eq!(
            accepted(
                EventKind::PaymentFailed,
                fp,
                &seen(Some(fp), false, false, Some("theirs"))
            ),
            Some(Accepted::Duplicate)
        );
        // Raced: our insert met an event we cannot see, or our event went in
        // but the object's row was stored meanwhile by another accept.
        assert_eq!(
            accepted(
                EventKind::PaymentSucceeded,
                fp,
                &seen(None, false, false, None)
            ),
            None
        );
        assert_eq!(
            accepted(
                EventKind::PaymentSucceeded,
                fp,
                &seen(None, true, false, None)
            ),
            None
        );
    }
}
