//! The PostgreSQL lease backend (`FENCEHOOK_LEASE_BACKEND=postgres`): the same
//! guarantees without Redis, for small deployments and as the baseline the
//! Redis path is measured against.
//!
//! A row per transaction in `leases` holds the owner, the token (the fence
//! counter, which only grows) and the expiry, all judged by the database's own
//! clock (`clock_timestamp()`), so instances never compare wall clocks. Each
//! operation is one statement, atomic by itself. The backend has its own small
//! pool so renewals never queue behind payment writes.
//!
//! These statements serve holders that keep the lease around a downstream
//! call. Without a downstream, deliveries take the lease inside their own
//! write instead ([`super::InlineLease`]): the store composes this module's
//! fragment (`take_inside!`, below) with its fenced upsert into one
//! statement. The same row, the same condition and the same counter, held
//! by the row's lock for that write's transaction only.

use std::time::Duration;

use deadpool_postgres::Pool;
use uuid::Uuid;

use super::{LeaseError, LeaseKey, RawAcquire};
use crate::config::{DbConfig, LeaseConfig};
use crate::db::{self, PoolSpec};

/// Takes a free or expired lease, raising the token; returns nothing when held.
/// The clock is read once, in the proposed row: the conflict clause compares
/// with `EXCLUDED.expires_at - ttl` (that same instant) and calls no function.
const ACQUIRE: &str = "\
INSERT INTO leases AS l (provider, transaction_id, owner, token, expires_at)
VALUES ($1, $2, $3, 1, clock_timestamp() + $4 * interval '1 millisecond')
ON CONFLICT (provider, transaction_id) DO UPDATE
   SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at
 WHERE l.owner IS NULL OR l.expires_at <= EXCLUDED.expires_at - $4 * interval '1 millisecond'
RETURNING token";

/// Milliseconds left on a lease held by someone else ($1 provider, $2
/// transaction_id): a query of its own after [`ACQUIRE`], and a subquery of
/// the write that found the lease held (`take_inside!`).
macro_rules! remaining_ms {
    () => {
        "SELECT greatest(0, (extract(epoch FROM (expires_at - clock_timestamp())) * 1000)::bigint)
  FROM leases WHERE provider = $1::text AND transaction_id = $2::text"
    };
}
pub(crate) use remaining_ms;

/// See [`remaining_ms`].
const REMAINING: &str = remaining_ms!();

/// The lease taken inside a payment write: a CTE `lease` for the head of the
/// store's one-statement write (`APPLY_LEASED` in `store`), whose fenced
/// upsert takes its rows `FROM lease` and fences with its `token`. It answers
/// that token, or no row when the lease is someone else's; the write then
/// answers the holder's time left with [`remaining_ms`]. Parameters, as the
/// store's write numbers them: `$1` provider, `$2` transaction_id, `$10` the
/// payment's fence as last read (0: no row).
///
/// The lease row is taken only when free or expired (the condition of
/// [`ACQUIRE`]), its token raised past both its own counter and `$10` (a
/// floor for a counter the unlogged table lost), and given back at once
/// (`owner` stays NULL): the row lock the write holds until its commit is
/// what keeps every other taker out meanwhile. Before it touches the row, the
/// write takes a transaction-scoped advisory lock on the key *without
/// waiting*: a copy of the same event finds it taken and answers as for a
/// held lease (and polls the row, as with Redis), instead of queueing on the
/// row lock and writing a token of its own once the first copy is done. A
/// hash collision with another transaction's key only sends a delivery round
/// that loop once more. The parameters are cast because a `SELECT` list does
/// not take its types from the columns it feeds, as `VALUES` does.
macro_rules! take_inside {
    () => {
        "lease AS (
    INSERT INTO leases AS l (provider, transaction_id, owner, token, expires_at)
    SELECT $1::text, $2::text, NULL::uuid, $10::int8 + 1, clock_timestamp()
     WHERE pg_try_advisory_xact_lock(hashtextextended($1::text || ':' || $2::text, 0))
    ON CONFLICT (provider, transaction_id) DO UPDATE
       SET token = greatest(l.token, $10::int8) + 1, expires_at = EXCLUDED.expires_at
     WHERE l.owner IS NULL OR l.expires_at <= EXCLUDED.expires_at
    RETURNING token)"
    };
}
pub(crate) use take_inside;

/// Extends only our own, unexpired lease; never revives an expired one.
const RENEW: &str = "\
UPDATE leases SET expires_at = clock_timestamp() + $5 * interval '1 millisecond'
 WHERE provider = $1 AND transaction_id = $2 AND owner = $3 AND token = $4
   AND expires_at > clock_timestamp()";

/// Compare-and-release: clears the owner, keeps the token. `expires_at`
/// keeps the release time, so rows long unused can be pruned.
const RELEASE: &str = "\
UPDATE leases SET owner = NULL, expires_at = clock_timestamp()
 WHERE provider = $1 AND transaction_id = $2 AND owner = $3 AND token = $4";

/// Cancel an acquire whose answer was lost: release whatever token `owner` holds.
const CANCEL: &str = "\
UPDATE leases SET owner = NULL, expires_at = clock_timestamp()
 WHERE provider = $1 AND transaction_id = $2 AND owner = $3";

/// Rows nobody has held for `$1` ms: their counter is no longer needed
/// (the payments fence and resync cover a counter that starts again at 1).
/// One instance at a time (the advisory lock), in bounded batches.
const PRUNE: &str = "\
WITH gone AS (
    DELETE FROM leases WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM leases
         WHERE expires_at < clock_timestamp() - $1 * interval '1 millisecond'
         LIMIT 10000))
    RETURNING 1)
SELECT count(*) FROM gone";

/// Fence resync inside our lease: raise the token past the payments fence.
const RESYNC: &str = "\
UPDATE leases SET token = greatest(token, $5) + 1
 WHERE provider = $1 AND transaction_id = $2 AND owner = $3 AND token = $4
   AND expires_at > clock_timestamp()
RETURNING token";

#[derive(Clone)]
pub struct PgLease {
    pool: Pool,
    ttl: Duration,
}

impl PgLease {
    pub fn new(cfg: &LeaseConfig, db: &DbConfig) -> Result<PgLease, LeaseError> {
        // The lease facade bounds each call by the lease timeout; the pool's
        // wait and the statement timeout are that same bound, not another one.
        let pool = db::pool(
            db,
            PoolSpec {
                application_name: "fencehook-lease",
                statement_timeout: cfg.lease_timeout,
                size: (db.pool_size / 2).clamp(2, 8),
                wait: cfg.lease_timeout,
                // The inline path holds the lease row in the payment's own
                // transaction (see `Store::for_service`).
                idle_in_transaction: Some(cfg.ttl),
            },
        )?;
        Ok(PgLease { pool, ttl: cfg.ttl })
    }

    fn ttl_ms(&self) -> f64 {
        self.ttl.as_millis() as f64
    }

    pub async fn acquire(&self, key: &LeaseKey, owner: Uuid) -> Result<RawAcquire, LeaseError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(ACQUIRE).await?;
        let ttl = self.ttl_ms();
        let row = client
            .query_opt(&stmt, &[&key.provider, &key.transaction_id, &owner, &ttl])
            .await?;
        if let Some(row) = row {
            return Ok(RawAcquire::Acquired { token: row.get(0) });
        }
        let stmt = client.prepare_cached(REMAINING).await?;
        let ms: Option<i64> = client
            .query_opt(&stmt, &[&key.provider, &key.transaction_id])
            .await?
            .map(|r| r.get(0));
        Ok(RawAcquire::Held {
            remaining: ms
                .map(|m| Duration::from_millis(m as u64))
                .unwrap_or(self.ttl),
        })
    }

    pub async fn renew(&self, key: &LeaseKey, owner: Uuid, token: i64) -> Result<bool, LeaseError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(RENEW).await?;
        let ttl = self.ttl_ms();
        let n = client
            .execute(
                &stmt,
                &[&key.provider, &key.transaction_id, &owner, &token, &ttl],
            )
            .await?;
        Ok(n == 1)
    }

    pub async fn release(
        &self,
        key: &LeaseKey,
        owner: Uuid,
        token: i64,
    ) -> Result<bool, LeaseError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(RELEASE).await?;
        let n = client
            .execute(&stmt, &[&key.provider, &key.transaction_id, &owner, &token])
            .await?;
        Ok(n == 1)
    }

    pub async fn cancel(&self, key: &LeaseKey, owner: Uuid) -> Result<bool, LeaseError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(CANCEL).await?;
        let n = client
            .execute(&stmt, &[&key.provider, &key.transaction_id, &owner])
            .await?;
        Ok(n == 1)
    }

    /// Deletes up to a batch of lease rows unused for `idle`; returns how many.
    pub async fn prune(&self, idle: Duration) -> Result<i64, LeaseError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(PRUNE).await?;
        let ms = idle.as_millis() as f64;
        Ok(client.query_one(&stmt, &[&ms]).await?.get(0))
    }

    pub async fn resync(
        &self,
        key: &LeaseKey,
        owner: Uuid,
        token: i64,
        db_fence: i64,
    ) -> Result<Option<i64>, LeaseError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(RESYNC).await?;
        let row = client
            .query_opt(
                &stmt,
                &[
                    &key.provider,
                    &key.transaction_id,
                    &owner,
                    &token,
                    &db_fence,
                ],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    pub async fn ping(&self) -> Result<(), LeaseError> {
        let client = self.pool.get().await?;
        client.simple_query("SELECT 1").await?;
        Ok(())
    }
}
