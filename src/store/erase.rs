//! `fencehook erase`: one object's personal data out of the database, the
//! money kept. The owner of `erasures` (migration V15).
//!
//! What fencehook stores of a delivery that can name a person: the body of
//! each inbox event as received (`events.body`), the merchant's side of its
//! canonical event (`merchant_reference` and Stripe's `metadata` in
//! `events.canonical`: a merchant may put an e-mail there) and each
//! quarantined batch item (`quarantined_items.item`). No header of a
//! delivery is stored. An erasure empties those of the object named and of
//! the refunds and disputes that name it as their payment (a PSP repeats the
//! payer's details in them), and keeps what the money needs: the rows, their
//! fingerprints, the rest of the canonical events (ids, amounts, currencies,
//! times; no personal data) and the ledger. It then records itself in `erasures`, in the same transaction:
//! either the bodies are gone and the record says so, or nothing changed.
//!
//! What must stay true: an erasure changes no payments row, no ledger entry
//! and no fingerprint; running it again on the same object changes nothing
//! and records nothing (it says when the object was erased), unless bodies
//! stored since (a PSP's late re-send of a new event) are there to empty.

use time::OffsetDateTime;
use tokio_postgres::error::SqlState;

use crate::store::audit::connect;
use crate::store::StoreError;

/// What to erase, and the operator's note of why.
#[derive(Debug, Clone)]
pub struct Request {
    pub provider: String,
    pub transaction_id: String,
    /// A ticket or request id, kept in the record.
    pub reason: Option<String>,
    /// The host that ran it, when its name could be read.
    pub host: Option<String>,
}

/// One event whose body an erasure emptied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasedEvent {
    pub id: i64,
    pub transaction_id: String,
    pub event_type: String,
}

/// What became of an erasure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Erasure {
    /// Emptied these events' bodies and `items` quarantined items (either may
    /// be none: an object booked in sync mode has no stored body) and
    /// recorded it as `id`.
    Erased {
        id: i64,
        events: Vec<ErasedEvent>,
        items: u64,
    },
    /// Nothing left to empty, and erased before (the newest record's time):
    /// nothing written.
    AlreadyErased { at: OffsetDateTime },
    /// No row, event or quarantined item of this object: nothing written.
    Unknown,
    /// The schema has no `erasures` table (before migration V15): nothing written.
    BeforeMigration,
}

/// The object and the refunds and disputes that name it as their payment.
const OBJECT_IDS: &str = "\
SELECT $2::text
 UNION SELECT transaction_id FROM payments WHERE provider = $1 AND parent_transaction_id = $2
 UNION SELECT transaction_id FROM events WHERE provider = $1 AND parent_transaction_id = $2";

/// An event whose canonical form holds the merchant's side: a
/// `merchant_reference` (not `null`) or a `metadata` object.
const MERCHANT_SIDE: &str =
    "(canonical->>'merchant_reference' IS NOT NULL OR canonical ? 'metadata')";

/// Erases `req`'s object (see the module) in one transaction.
pub async fn erase(url: &str, req: &Request) -> Result<Erasure, StoreError> {
    let mut client = connect(url).await?;
    let tx = client.transaction().await?;
    let known: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM payments WHERE provider = $1 AND transaction_id = $2)
                 OR EXISTS (SELECT 1 FROM events WHERE provider = $1 AND transaction_id = $2)
                 OR EXISTS (SELECT 1 FROM quarantined_items WHERE provider = $1 AND transaction_id = $2)",
            &[&req.provider, &req.transaction_id],
        )
        .await?
        .get(0);
    if !known {
        return Ok(Erasure::Unknown);
    }
    let before = match tx
        .query_opt(
            "SELECT max(erased_at) FROM erasures WHERE provider = $1 AND transaction_id = $2",
            &[&req.provider, &req.transaction_id],
        )
        .await
    {
        Ok(row) => row.and_then(|r| r.get::<_, Option<OffsetDateTime>>(0)),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => {
            return Ok(Erasure::BeforeMigration)
        }
        Err(e) => return Err(e.into()),
    };
    let events: Vec<ErasedEvent> = tx
        .query(
            &format!(
                "UPDATE events SET body = '',
                        canonical = CASE WHEN {MERCHANT_SIDE}
                                         THEN canonical - 'merchant_reference' - 'metadata'
                                         ELSE canonical END
                  WHERE provider = $1 AND transaction_id IN ({OBJECT_IDS})
                    AND (body <> '' OR {MERCHANT_SIDE})
              RETURNING id, transaction_id, event_type::text"
            ),
            &[&req.provider, &req.transaction_id],
        )
        .await?
        .iter()
        .map(|r| ErasedEvent {
            id: r.get(0),
            transaction_id: r.get(1),
            event_type: r.get(2),
        })
        .collect();
    let items = tx
        .execute(
            &format!(
                "UPDATE quarantined_items SET item = ''
                  WHERE provider = $1 AND transaction_id IN ({OBJECT_IDS}) AND item <> ''"
            ),
            &[&req.provider, &req.transaction_id],
        )
        .await?;
    if let (Some(at), true, 0) = (before, events.is_empty(), items) {
        return Ok(Erasure::AlreadyErased { at });
    }
    let mut events = events;
    events.sort_by_key(|e| e.id);
    let id: i64 = tx
        .query_one(
            "INSERT INTO erasures (provider, transaction_id, events, quarantined_items, reason,
                                   host, version)
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
            &[
                &req.provider,
                &req.transaction_id,
                &(events.len() as i64),
                &i64::try_from(items).unwrap_or(i64::MAX),
                &req.reason,
                &req.host,
                &env!("CARGO_PKG_VERSION"),
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    Ok(Erasure::Erased { id, events, items })
}
