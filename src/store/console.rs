//! The operator console's reads: payment search, event lists by status,
//! dead events grouped by their error, one event, stored bodies.
//!
//! # What must stay true
//!
//! Every query is bounded: a page is at most [`MAX_PAGE`] rows, and each
//! filter is served by an index, so that a search on a table of millions
//! reads about a page of rows, not the table (V12; the plans are checked on
//! a million payments by `tests/api/console.rs`):
//!
//! - newest first by provider, status and time: one range scan of
//!   `payments_console_status_idx` per (provider, status) pair, each
//!   stopping after a page, merged ([`SEARCH_BY_TIME`]). The providers are
//!   found by a loose scan of the unique key (one index probe per provider);
//! - a transaction id or a prefix: one range of
//!   `payments_console_transaction_idx` (byte order), at most
//!   [`PREFIX_CAP`] ids read; past it the page says so (both indexes are
//!   built by the instance that serves the console, [`build_indexes`]);
//! - inbox events of one status: that status's own partial index (V5, V7);
//!   a provider filter looks through the newest [`EVENT_SCAN_CAP`] of them.
//!
//! Writes (replays) are not here: they are the CLI's, [`Store::replay`].

use serde::Serialize;
use time::OffsetDateTime;

use super::inbox::{event_row, EventRow, EVENT_COLUMNS};
use super::record::{payment_record, PaymentRecord};
use super::{Store, StoreError};

/// The console's two indexes of `payments` (V12) and what each covers. V18
/// leaves them out of a new database, so that an instance without a console
/// writes each payment with two index entries fewer; an instance that serves
/// the console builds them ([`build_indexes`]).
pub const INDEXES: [(&str, &str); 2] = [
    (
        "payments_console_status_idx",
        "ON payments (provider, status, created_at, id)",
    ),
    (
        "payments_console_transaction_idx",
        "ON payments (transaction_id text_pattern_ops)",
    ),
];

/// Builds the console's indexes that are missing, or were left invalid by
/// a build that failed, with `CREATE INDEX CONCURRENTLY` (writes go on
/// meanwhile), on a connection of its own without a statement timeout.
/// Returns the names it built; nothing when both are there.
pub async fn build_indexes(url: &str) -> Result<Vec<&'static str>, StoreError> {
    let client = super::audit::connect(url).await?;
    client.batch_execute("SET statement_timeout = 0").await?;
    let mut built = Vec::new();
    for (name, covers) in INDEXES {
        let valid: Option<bool> = client
            .query_opt(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                  WHERE c.relname = $1 AND pg_table_is_visible(c.oid)",
                &[&name],
            )
            .await?
            .map(|r| r.get(0));
        match valid {
            Some(true) => continue,
            Some(false) => {
                client
                    .batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {name}"))
                    .await?
            }
            None => {}
        }
        client
            .batch_execute(&format!(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} {covers}"
            ))
            .await?;
        built.push(name);
    }
    Ok(built)
}

/// Largest page of any console list.
pub const MAX_PAGE: i64 = 200;

/// Transaction ids a prefix search reads at most.
pub const PREFIX_CAP: i64 = 1000;

/// Events of one status a provider filter (and the grouping of dead events)
/// looks through at most, newest first.
pub const EVENT_SCAN_CAP: i64 = 10_000;

/// Each count the console shows stops here: a count that reaches it reads
/// "10,000+" (counting further would read every such row on each load).
pub const COUNT_CAP: i64 = 10_000;

/// The payment statuses, in the order the console lists them.
pub const PAYMENT_STATUSES: [&str; 5] = ["queued", "processing", "succeeded", "failed", "dead"];

/// The event statuses.
pub const EVENT_STATUSES: [&str; 4] = ["queued", "processing", "done", "dead"];

/// Newest first, by provider and status (see the module's rules). $1
/// provider or NULL, $2 statuses, $3/$4 since/until or NULL, $5/$6 the
/// cursor (the last row of the page before) or NULL, $7 the page size. The
/// columns are [`super::record::RECORD_COLUMNS`]' (spelled here: a `const`).
pub const SEARCH_BY_TIME: &str = "\
WITH RECURSIVE known(p) AS (
    SELECT min(provider) FROM payments
  UNION ALL
    SELECT (SELECT min(provider) FROM payments WHERE provider > known.p)
      FROM known WHERE known.p IS NOT NULL),
providers(p) AS (
    SELECT $1::text WHERE $1::text IS NOT NULL
  UNION ALL
    SELECT p FROM known WHERE $1::text IS NULL AND p IS NOT NULL)
SELECT x.* FROM providers
 CROSS JOIN unnest($2::text[]) AS s(status)
 CROSS JOIN LATERAL (
    SELECT id, provider, transaction_id::text AS transaction_id, kind::text AS kind,
           parent_transaction_id::text AS parent_transaction_id, status::text AS status,
           event_type::text AS event_type, amount_minor::int8 AS amount_minor,
           currency::text AS currency, amount_out_minor::int8 AS amount_out_minor,
           fence::int8 AS fence, created_at, updated_at
      FROM payments
     WHERE provider = providers.p AND status = s.status
       AND created_at >= coalesce($3::timestamptz, '-infinity')
       AND created_at < coalesce($4::timestamptz, 'infinity')
       AND (created_at, id) < (coalesce($5::timestamptz, 'infinity'),
                               coalesce($6::int8, 9223372036854775807))
     ORDER BY created_at DESC, id DESC
     LIMIT $7) x
 ORDER BY x.created_at DESC, x.id DESC
 LIMIT $7";

/// The ids with a prefix, in byte order ($1 the prefix, $2 the first string
/// after every id with it), at most [`PREFIX_CAP`] + 1 of them; the other
/// filters as in [`SEARCH_BY_TIME`] ($3 to $8), newest first.
pub const SEARCH_BY_PREFIX: &str = "\
WITH m AS MATERIALIZED (
    SELECT id FROM payments
     WHERE transaction_id ~>=~ $1::text AND transaction_id ~<~ $2::text
     LIMIT 1001)
SELECT p.id, p.provider, p.transaction_id::text AS transaction_id, p.kind::text AS kind,
       p.parent_transaction_id::text AS parent_transaction_id, p.status::text AS status,
       p.event_type::text AS event_type, p.amount_minor::int8 AS amount_minor,
       p.currency::text AS currency, p.amount_out_minor::int8 AS amount_out_minor,
       p.fence::int8 AS fence, p.created_at, p.updated_at,
       (SELECT count(*) FROM m) > 1000 AS truncated
  FROM m JOIN payments p ON p.id = m.id
 WHERE starts_with(p.transaction_id::text, $1::text)
   AND ($3::text IS NULL OR p.provider = $3)
   AND p.status = ANY($4::text[])
   AND p.created_at >= coalesce($5::timestamptz, '-infinity')
   AND p.created_at < coalesce($6::timestamptz, 'infinity')
   AND (p.created_at, p.id) < (coalesce($7::timestamptz, 'infinity'),
                               coalesce($8::int8, 9223372036854775807))
 ORDER BY p.created_at DESC, p.id DESC
 LIMIT $9";

/// What the payment search asks for; `None` matches anything.
#[derive(Debug, Clone, Default)]
pub struct PaymentSearch {
    pub provider: Option<String>,
    /// A transaction id or a prefix of it (printable ASCII).
    pub transaction_id: Option<String>,
    pub status: Option<String>,
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    /// The last row of the page before (created_at, id): this page starts after it.
    pub after: Option<(OffsetDateTime, i64)>,
    pub limit: i64,
}

/// One page of a list and where the next one starts.
#[derive(Debug, Clone, Serialize)]
pub struct Page<T> {
    pub rows: Vec<T>,
    /// The cursor of the next page, when there may be one.
    pub next: Option<Cursor>,
    /// The search stopped at its bound ([`PREFIX_CAP`], [`EVENT_SCAN_CAP`]):
    /// rows beyond it were not looked at.
    pub truncated: bool,
}

/// Where a page ends: the last row's time and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Cursor {
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub id: i64,
}

/// The first string after every string starting with `prefix` in byte
/// order; `None` when there is none (an empty prefix, or one of only 0x7f+
/// characters) or the prefix is not printable ASCII.
pub fn prefix_end(prefix: &str) -> Option<String> {
    if prefix.is_empty() || !prefix.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return None;
    }
    let mut bytes = prefix.as_bytes().to_vec();
    let last = bytes.last_mut()?;
    *last += 1;
    String::from_utf8(bytes).ok()
}

/// The inbox events of a list, newest (or, for queued and processing
/// events, next due) first.
#[derive(Debug, Clone, Default)]
pub struct EventList {
    pub status: Option<String>,
    pub provider: Option<String>,
    pub after: Option<(OffsetDateTime, i64)>,
    pub limit: i64,
}

/// Dead events that failed with one error.
#[derive(Debug, Clone, Serialize)]
pub struct DeadGroup {
    pub provider: String,
    pub last_error: Option<String>,
    pub events: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub first_received_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub last_received_at: OffsetDateTime,
}

/// Quarantined batch items (`quarantined_items`), for the overview.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QuarantineSummary {
    pub items: i64,
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_seen_at: Option<OffsetDateTime>,
}

/// The order of one event status's list: its column, the direction, and the
/// partial index it reads.
fn event_order(status: Option<&str>) -> (&'static str, bool) {
    match status {
        // Due soonest first (events_due_idx, events_locked_idx).
        Some("queued") => ("next_attempt_at", false),
        Some("processing") => ("locked_until", false),
        // Newest first (events_dead_idx, events_received_idx).
        _ => ("received_at", true),
    }
}

impl Store {
    /// The inbox's events by status, each counted up to [`COUNT_CAP`]: one
    /// range of that status's partial index, stopping there.
    pub async fn inbox_counts_capped(&self) -> Result<super::inbox::Counts, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "SELECT (SELECT count(*) FROM (SELECT 1 FROM events WHERE status = 'queued' LIMIT $1) q),
                        (SELECT count(*) FROM (SELECT 1 FROM events WHERE status = 'processing' LIMIT $1) p),
                        (SELECT count(*) FROM (SELECT 1 FROM events WHERE status = 'dead' LIMIT $1) d)",
            )
            .await?;
        let row = client.query_one(&stmt, &[&COUNT_CAP]).await?;
        Ok(super::inbox::Counts {
            queued: row.get(0),
            processing: row.get(1),
            dead: row.get(2),
        })
    }

    /// A page of the payment search (see the module's rules).
    pub async fn search_payments(
        &self,
        q: &PaymentSearch,
    ) -> Result<Page<PaymentRecord>, StoreError> {
        let client = self.pool.get().await?;
        let limit = q.limit.clamp(1, MAX_PAGE);
        let statuses: Vec<String> = match &q.status {
            Some(s) => vec![s.clone()],
            None => PAYMENT_STATUSES.iter().map(|s| (*s).to_owned()).collect(),
        };
        let (after_at, after_id) = (q.after.map(|a| a.0), q.after.map(|a| a.1));
        let (rows, truncated) = match q
            .transaction_id
            .as_deref()
            .and_then(|p| Some((p, prefix_end(p)?)))
        {
            Some((prefix, end)) => {
                let rows = client
                    .query(
                        SEARCH_BY_PREFIX,
                        &[
                            &prefix,
                            &end,
                            &q.provider,
                            &statuses,
                            &q.since,
                            &q.until,
                            &after_at,
                            &after_id,
                            &limit,
                        ],
                    )
                    .await?;
                let truncated = rows.first().is_some_and(|r| r.get::<_, bool>("truncated"));
                (rows, truncated)
            }
            None => {
                let rows = client
                    .query(
                        SEARCH_BY_TIME,
                        &[
                            &q.provider,
                            &statuses,
                            &q.since,
                            &q.until,
                            &after_at,
                            &after_id,
                            &limit,
                        ],
                    )
                    .await?;
                (rows, false)
            }
        };
        let rows: Vec<PaymentRecord> = rows.iter().map(payment_record).collect();
        let next = (rows.len() as i64 == limit)
            .then(|| {
                rows.last().map(|r| Cursor {
                    at: r.created_at,
                    id: r.id,
                })
            })
            .flatten();
        Ok(Page {
            rows,
            next,
            truncated,
        })
    }

    /// A page of inbox events of one status (or of all), by that status's
    /// index (see `event_order`).
    pub async fn list_events(&self, q: &EventList) -> Result<Page<EventRow>, StoreError> {
        let client = self.pool.get().await?;
        let limit = q.limit.clamp(1, MAX_PAGE);
        let (column, newest_first) = event_order(q.status.as_deref());
        let (cmp, dir, bound) = if newest_first {
            (
                "<",
                "DESC",
                "coalesce($2::timestamptz, 'infinity'), coalesce($3::int8, 9223372036854775807)",
            )
        } else {
            (
                ">",
                "ASC",
                "coalesce($2::timestamptz, '-infinity'), coalesce($3::int8, 0)",
            )
        };
        let status = match q.status.as_deref() {
            Some(s) if EVENT_STATUSES.contains(&s) => format!("status = '{s}'"),
            _ => "true".to_owned(),
        };
        // The newest EVENT_SCAN_CAP of the status, then the provider: a
        // rare provider's events cannot make the scan read the whole table.
        let sql = format!(
            "WITH scanned AS MATERIALIZED (
                SELECT id, provider AS scanned_provider, {column} AS scanned_at FROM events
                 WHERE {status} AND ({column}, id) {cmp} ({bound})
                 ORDER BY {column} {dir}, id {dir}
                 LIMIT {EVENT_SCAN_CAP})
             SELECT {EVENT_COLUMNS}, s.scanned_at AS cursor_at,
                    (SELECT count(*) FROM scanned) AS scanned
               FROM scanned s JOIN events USING (id)
              WHERE ($1::text IS NULL OR s.scanned_provider = $1)
              ORDER BY s.scanned_at {dir}, id {dir}
              LIMIT $4"
        );
        let (after_at, after_id) = (q.after.map(|a| a.0), q.after.map(|a| a.1));
        let rows = client
            .query(&sql, &[&q.provider, &after_at, &after_id, &limit])
            .await?;
        let truncated = q.provider.is_some()
            && rows
                .first()
                .is_some_and(|r| r.get::<_, i64>("scanned") >= EVENT_SCAN_CAP);
        let next = (rows.len() as i64 == limit)
            .then(|| {
                rows.last().and_then(|r| {
                    Some(Cursor {
                        at: r.get::<_, Option<OffsetDateTime>>("cursor_at")?,
                        id: r.get("id"),
                    })
                })
            })
            .flatten();
        Ok(Page {
            rows: rows.iter().map(event_row).collect(),
            next,
            truncated,
        })
    }

    /// Dead events grouped by provider and last error, the largest groups
    /// first, over the newest [`EVENT_SCAN_CAP`] dead events (events_dead_idx).
    pub async fn dead_groups(&self, provider: Option<&str>) -> Result<Vec<DeadGroup>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT provider, last_error, count(*)::int8, min(received_at), max(received_at)
               FROM (SELECT provider, last_error, received_at FROM events WHERE status = 'dead'
                      ORDER BY received_at DESC LIMIT {EVENT_SCAN_CAP}) d
              WHERE ($1::text IS NULL OR provider = $1)
              GROUP BY provider, last_error
              ORDER BY count(*) DESC, max(received_at) DESC
              LIMIT 50"
        );
        let rows = client.query(&sql, &[&provider]).await?;
        Ok(rows
            .iter()
            .map(|r| DeadGroup {
                provider: r.get(0),
                last_error: r.get(1),
                events: r.get(2),
                first_received_at: r.get(3),
                last_received_at: r.get(4),
            })
            .collect())
    }

    /// One stored event, by id.
    pub async fn event(&self, id: i64) -> Result<Option<EventRow>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE id = $1");
        Ok(client.query_opt(&sql, &[&id]).await?.map(|r| event_row(&r)))
    }

    /// The stored bodies of these events, as received (operators only: the
    /// console decides), each cut at `max_bytes`.
    pub async fn event_bodies(
        &self,
        ids: &[i64],
        max_bytes: i32,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT id, left(body, $2) FROM events WHERE id = ANY($1) ORDER BY id",
                &[&ids, &max_bytes],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// How many batch items are quarantined, and when one was last seen.
    pub async fn quarantine_summary(&self) -> Result<QuarantineSummary, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "SELECT count(*), max(last_seen_at) FROM quarantined_items",
                &[],
            )
            .await?;
        Ok(QuarantineSummary {
            items: row.get(0),
            last_seen_at: row.get(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_its_last_byte_plus_one_and_only_printable_ascii_has_one() {
        assert_eq!(prefix_end("pay_1").as_deref(), Some("pay_2"));
        assert_eq!(prefix_end("a~").as_deref(), Some("a\u{7f}"));
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("é"), None);
        assert_eq!(prefix_end("a\nb"), None);
    }
}
