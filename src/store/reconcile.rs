//! The reconciliation's tables (migration V17): the cursor and last success
//! per provider (`reconcile_cursors`), every run (`reconcile_runs`) and what
//! it found (`reconcile_findings`), and the lock that lets one runner per
//! provider run at a time. The owner of those tables.
//!
//! # The lock: a PostgreSQL session advisory lock
//!
//! One runner per provider, across instances and CLI runs, is a
//! `pg_try_advisory_lock` held on one pooled connection for the run. Not a
//! row lock: that needs a transaction open for the whole run (minutes of
//! API calls), which holds back vacuum and the idle-in-transaction timeout
//! the service's pool sets would end it. A session lock needs no
//! transaction, and it goes with its connection: a runner that dies (its
//! process killed, its connection cut) frees it at once, without a lease
//! to expire. Taken with `try`, so a busy provider is skipped, never
//! waited on. (Behind a pooler in transaction mode a session lock does not
//! hold; fencehook's pool talks to PostgreSQL directly.)

use deadpool_postgres::Object;
use serde::Serialize;
use time::OffsetDateTime;

use super::{Store, StoreError};

/// The first key of the two-key advisory lock: fencehook's reconciliation
/// (the second is the provider's name, hashed).
const LOCK_CLASS: i32 = 0x7265_636e; // "recn"

/// What a run counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub listed: i64,
    pub known: i64,
    pub recovered: i64,
    pub ignored: i64,
    pub stale: i64,
    pub refused: i64,
    pub divergent: i64,
}

/// An event worth a person's look.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub psp_event_id: String,
    pub transaction_id: Option<String>,
    /// `recovered`, `divergent` or `refused`.
    pub result: &'static str,
    pub reason: Option<String>,
}

/// Who ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Scheduled,
    Cli,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Scheduled => "scheduled",
            Trigger::Cli => "cli",
        }
    }
}

/// A finished run, to be recorded.
pub struct RunRecord<'a> {
    pub provider: &'a str,
    pub trigger: Trigger,
    pub started_at: OffsetDateTime,
    pub since: OffsetDateTime,
    pub until: OffsetDateTime,
    pub counts: &'a Counts,
    pub findings: &'a [Finding],
    /// Why it did not complete; `None` when it did.
    pub error: Option<&'a str>,
}

/// One provider's runner lock, held on its own connection
/// ([`Store::try_lock_reconcile`]). Let go by [`RunnerLock::release`]; a
/// lock dropped unreleased closes its connection, which frees it too.
pub struct RunnerLock {
    client: Option<Object>,
    provider: String,
}

impl RunnerLock {
    pub async fn release(mut self) {
        if let Some(client) = self.client.take() {
            let unlocked = client
                .query_one(
                    "SELECT pg_advisory_unlock($1, hashtext($2))",
                    &[&LOCK_CLASS, &self.provider],
                )
                .await;
            if !matches!(unlocked.map(|r| r.get::<_, bool>(0)), Ok(true)) {
                // Not back to the pool with a lock it may still hold.
                drop(Object::take(client));
            }
        }
    }
}

impl Drop for RunnerLock {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            drop(Object::take(client));
        }
    }
}

impl Store {
    /// The runner lock of `provider`, when no other runner holds it.
    pub async fn try_lock_reconcile(
        &self,
        provider: &str,
    ) -> Result<Option<RunnerLock>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "SELECT pg_try_advisory_lock($1, hashtext($2))",
                &[&LOCK_CLASS, &provider],
            )
            .await?;
        Ok(row.get::<_, bool>(0).then(|| RunnerLock {
            client: Some(client),
            provider: provider.to_owned(),
        }))
    }

    /// Where the scheduled runs of `provider` have reached.
    pub async fn reconcile_cursor(
        &self,
        provider: &str,
    ) -> Result<Option<OffsetDateTime>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT cursor_at FROM reconcile_cursors WHERE provider = $1",
                &[&provider],
            )
            .await?;
        Ok(row.and_then(|r| r.get(0)))
    }

    /// Records a run and its findings; a completed one sets the provider's
    /// last success, and a completed scheduled one moves its cursor to the
    /// end of its window. One transaction: a cursor never moves past a run
    /// that is not recorded.
    pub async fn record_reconcile_run(&self, run: &RunRecord<'_>) -> Result<i64, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let c = run.counts;
        let count = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
        let id: i64 = tx
            .query_one(
                "INSERT INTO reconcile_runs (provider, trigger, started_at, finished_at, \
                 window_since, window_until, listed, known, recovered, ignored, stale, \
                 refused, divergent, error) \
                 VALUES ($1, $2, $3, now(), $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING id",
                &[
                    &run.provider,
                    &run.trigger.as_str(),
                    &run.started_at,
                    &run.since,
                    &run.until,
                    &count(c.listed),
                    &count(c.known),
                    &count(c.recovered),
                    &count(c.ignored),
                    &count(c.stale),
                    &count(c.refused),
                    &count(c.divergent),
                    &run.error,
                ],
            )
            .await?
            .get(0);
        if !run.findings.is_empty() {
            let events: Vec<&str> = run
                .findings
                .iter()
                .map(|f| f.psp_event_id.as_str())
                .collect();
            let txs: Vec<Option<&str>> = run
                .findings
                .iter()
                .map(|f| f.transaction_id.as_deref())
                .collect();
            let results: Vec<&str> = run.findings.iter().map(|f| f.result).collect();
            let reasons: Vec<Option<&str>> =
                run.findings.iter().map(|f| f.reason.as_deref()).collect();
            tx.execute(
                "INSERT INTO reconcile_findings (run_id, provider, psp_event_id, transaction_id, result, reason) \
                 SELECT $1, $2, e, t, r, w FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS f(e, t, r, w)",
                &[&id, &run.provider, &events, &txs, &results, &reasons],
            )
            .await?;
        }
        if run.error.is_none() {
            let cursor = (run.trigger == Trigger::Scheduled).then_some(run.until);
            tx.execute(
                "INSERT INTO reconcile_cursors (provider, cursor_at, last_success_at) VALUES ($1, $2, now()) \
                 ON CONFLICT (provider) DO UPDATE SET last_success_at = now(), \
                 cursor_at = GREATEST(reconcile_cursors.cursor_at, EXCLUDED.cursor_at)",
                &[&run.provider, &cursor],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(id)
    }
}

/// A recorded run, as the console lists it.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub id: i64,
    pub provider: String,
    pub trigger: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub window_since: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub window_until: OffsetDateTime,
    pub counts: Counts,
    pub error: Option<String>,
}

/// A recorded finding, as the console lists it.
#[derive(Debug, Clone, Serialize)]
pub struct FindingRow {
    pub run_id: i64,
    pub provider: String,
    pub psp_event_id: String,
    pub transaction_id: Option<String>,
    pub result: String,
    pub reason: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub found_at: OffsetDateTime,
}

impl Store {
    /// The last `per_provider` runs of each provider, newest first.
    pub async fn reconcile_runs(&self, per_provider: i64) -> Result<Vec<RunRow>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT id, provider, trigger, started_at, window_since, window_until, listed, known, \
                 recovered, ignored, stale, refused, divergent, error FROM ( \
                   SELECT *, row_number() OVER (PARTITION BY provider ORDER BY started_at DESC, id DESC) AS n \
                   FROM reconcile_runs) r WHERE n <= $1 ORDER BY provider, started_at DESC, id DESC",
                &[&per_provider],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| RunRow {
                id: r.get(0),
                provider: r.get(1),
                trigger: r.get(2),
                started_at: r.get(3),
                window_since: r.get(4),
                window_until: r.get(5),
                counts: Counts {
                    listed: r.get::<_, i32>(6).into(),
                    known: r.get::<_, i32>(7).into(),
                    recovered: r.get::<_, i32>(8).into(),
                    ignored: r.get::<_, i32>(9).into(),
                    stale: r.get::<_, i32>(10).into(),
                    refused: r.get::<_, i32>(11).into(),
                    divergent: r.get::<_, i32>(12).into(),
                },
                error: r.get(13),
            })
            .collect())
    }

    /// The newest `limit` findings of `result` (`recovered`, `divergent`, `refused`).
    pub async fn reconcile_findings(
        &self,
        result: &str,
        limit: i64,
    ) -> Result<Vec<FindingRow>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT run_id, provider, psp_event_id, transaction_id, result, reason, found_at \
                 FROM reconcile_findings WHERE result = $1 ORDER BY found_at DESC, id DESC LIMIT $2",
                &[&result, &limit],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| FindingRow {
                run_id: r.get(0),
                provider: r.get(1),
                psp_event_id: r.get(2),
                transaction_id: r.get(3),
                result: r.get(4),
                reason: r.get(5),
                found_at: r.get(6),
            })
            .collect())
    }
}

/// An event of a transaction that a run booked because its webhook never
/// arrived: what the payment timeline and `fencehook inspect` say of it.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveredBy {
    pub psp_event_id: String,
    pub transaction_id: String,
    pub run_id: i64,
    /// `scheduled` or `cli`.
    pub trigger: String,
    /// When the run that booked it was recorded.
    #[serde(with = "time::serde::rfc3339")]
    pub found_at: OffsetDateTime,
}

impl RecoveredBy {
    /// How it reads on the payment timeline and in `fencehook inspect`.
    pub fn describe(&self) -> String {
        format!(
            "event {} of {} booked by reconciliation ({} run #{}), not by a webhook",
            self.psp_event_id, self.transaction_id, self.trigger, self.run_id
        )
    }
}

impl Store {
    /// The events of `transaction_id` (and of its refunds and disputes)
    /// booked by reconciliation, oldest first. Read from the run's findings,
    /// not marked on the booking: the delivery path writes nothing more for
    /// it. Before migration V17 there are none.
    pub async fn recovered_by_reconcile(
        &self,
        provider: &str,
        transaction_id: &str,
    ) -> Result<Vec<RecoveredBy>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT f.psp_event_id, f.transaction_id, f.run_id, r.trigger, f.found_at \
                 FROM reconcile_findings f JOIN reconcile_runs r ON r.id = f.run_id \
                 WHERE f.provider = $1 AND f.result = 'recovered' AND (f.transaction_id = $2 \
                   OR f.transaction_id IN (SELECT transaction_id FROM payments \
                                           WHERE provider = $1 AND parent_transaction_id = $2)) \
                 ORDER BY f.found_at, f.id",
                &[&provider, &transaction_id],
            )
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e.into()),
        };
        Ok(rows
            .iter()
            .map(|r| RecoveredBy {
                psp_event_id: r.get(0),
                transaction_id: r.get(1),
                run_id: r.get(2),
                trigger: r.get(3),
                found_at: r.get(4),
            })
            .collect())
    }
}
