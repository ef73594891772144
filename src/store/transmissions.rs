//! `paypal_transmissions`: which body a PayPal transmission id was first seen
//! with (V9). PayPal's signature covers only the CRC-32 of the body, which
//! anyone can match with another body, so the headers of a delivery are bound
//! to its body here, for every instance at once.

use time::OffsetDateTime;

use super::{Store, StoreError};

/// How many expired rows each new transmission deletes: enough to keep up
/// with the rate rows are added (one per new transmission), few enough that
/// the statement stays a single-row write.
const PRUNE_BATCH: i64 = 8;

/// Records `$2 → $3` for provider `$1` until `$4`, and answers whether the id
/// was new (`inserted`) and whether its body is the one given (`same`), in
/// one round trip. `DO UPDATE` rather than `DO NOTHING`: with a concurrent
/// first insert of the same id, only `DO UPDATE` returns the row (after
/// waiting for the other transaction), where `DO NOTHING` would return
/// nothing this statement's snapshot could read. It changes nothing (the
/// body and the expiry stay the first delivery's). Expired rows, other than
/// the one being written, are pruned in the same statement, a few at a time
/// and skipping rows another instance is pruning.
const BIND: &str = "\
WITH pruned AS (
    DELETE FROM paypal_transmissions
     WHERE (provider, transmission_id) IN (
           SELECT provider, transmission_id FROM paypal_transmissions
            WHERE expires_at < now() AND NOT (provider = $1 AND transmission_id = $2)
            LIMIT $5 FOR UPDATE SKIP LOCKED)),
bound AS (
    INSERT INTO paypal_transmissions AS t (provider, transmission_id, body_sha256, expires_at)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT ON CONSTRAINT paypal_transmissions_pkey DO UPDATE
       SET expires_at = t.expires_at
    RETURNING (xmax = 0) AS inserted, body_sha256 = $3 AS same, confirmed_at IS NOT NULL AS confirmed)
SELECT inserted, same, confirmed FROM bound";

/// The binding of `$2` for provider `$1`, read without writing: whether it is
/// to body `$3`, and whether PayPal's API confirmed it.
const BOUND: &str = "SELECT body_sha256 = $3, confirmed_at IS NOT NULL FROM paypal_transmissions \
     WHERE provider = $1 AND transmission_id = $2";

/// Marks a binding confirmed by PayPal's API.
const CONFIRM: &str = "UPDATE paypal_transmissions SET confirmed_at = now() \
     WHERE provider = $1 AND transmission_id = $2 AND body_sha256 = $3";

/// Drops a binding PayPal's API contradicted, so the genuine body can take
/// the id when PayPal delivers (or retries) it. Never a confirmed one.
const UNBIND: &str = "DELETE FROM paypal_transmissions \
     WHERE provider = $1 AND transmission_id = $2 AND body_sha256 = $3 AND confirmed_at IS NULL";

/// What [`Store::bind_transmission`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transmission {
    /// First seen now: bound to this body.
    New,
    /// Seen before with this very body: a PayPal retry; `confirmed` when
    /// PayPal's API confirmed it already (`confirm = "api"`).
    SameBody { confirmed: bool },
    /// Seen before with another body: the headers were lifted onto a forged one.
    OtherBody,
}

impl Store {
    /// Binds `transmission_id` to the SHA-256 (hex) of its body until
    /// `expires_at`, or says which body it is bound to already.
    ///
    /// The statement writes (even a retry's conflict updates the row), so
    /// its commit is bounded like a booking's. While commits wait past their
    /// bound and writes are refused, a transmission bound already is answered
    /// from its row: a PayPal retry of an event booked before is still
    /// answered `duplicate` then, as other PSPs' copies are; only a new
    /// transmission, which must be written, is refused.
    pub async fn bind_transmission(
        &self,
        provider: &str,
        transmission_id: &str,
        body_sha256: &str,
        expires_at: OffsetDateTime,
    ) -> Result<Transmission, StoreError> {
        let client = match self.writer().await {
            Ok(client) => client,
            Err(refused @ StoreError::CommitsWaiting { .. }) => {
                return self
                    .bound_transmission(provider, transmission_id, body_sha256)
                    .await?
                    .ok_or(refused);
            }
            Err(e) => return Err(e),
        };
        let stmt = client.prepare_cached(BIND).await?;
        let row = client
            .watch()
            .statement(client.query_one(
                &stmt,
                &[
                    &provider,
                    &transmission_id,
                    &body_sha256,
                    &expires_at,
                    &PRUNE_BATCH,
                ],
            ))
            .await?;
        Ok(match (row.get::<_, bool>(0), row.get::<_, bool>(1)) {
            (true, _) => Transmission::New,
            (false, true) => Transmission::SameBody {
                confirmed: row.get(2),
            },
            (false, false) => Transmission::OtherBody,
        })
    }

    /// What `transmission_id` is bound to now, read only; `None` when it is
    /// not bound.
    async fn bound_transmission(
        &self,
        provider: &str,
        transmission_id: &str,
        body_sha256: &str,
    ) -> Result<Option<Transmission>, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(BOUND).await?;
        let row = client
            .query_opt(&stmt, &[&provider, &transmission_id, &body_sha256])
            .await?;
        Ok(row.map(|row| match row.get::<_, bool>(0) {
            true => Transmission::SameBody {
                confirmed: row.get(1),
            },
            false => Transmission::OtherBody,
        }))
    }

    /// Records that PayPal's API confirmed the body bound to `transmission_id`.
    pub async fn confirm_transmission(
        &self,
        provider: &str,
        transmission_id: &str,
        body_sha256: &str,
    ) -> Result<(), StoreError> {
        let client = self.writer().await?;
        let stmt = client.prepare_cached(CONFIRM).await?;
        client
            .watch()
            .statement(client.execute(&stmt, &[&provider, &transmission_id, &body_sha256]))
            .await?;
        Ok(())
    }

    /// Forgets the unconfirmed binding of `transmission_id` to this body.
    pub async fn unbind_transmission(
        &self,
        provider: &str,
        transmission_id: &str,
        body_sha256: &str,
    ) -> Result<(), StoreError> {
        let client = self.writer().await?;
        let stmt = client.prepare_cached(UNBIND).await?;
        client
            .watch()
            .statement(client.execute(&stmt, &[&provider, &transmission_id, &body_sha256]))
            .await?;
        Ok(())
    }
}
