//! One payments row as operators read it: `fencehook inspect`, the
//! console's payment page and its lists (the search, the overview's latest
//! payments) all show this one model, mapped from a row in one place.
//!
//! A query that reads it selects [`RECORD_COLUMNS`] (or the same names,
//! cast as there, in a query that must spell its columns itself: the
//! console's searches) and maps each row with [`payment_record`].

use serde::Serialize;
use time::OffsetDateTime;

use crate::domain::amount::major_amount;

/// One payments row, with its amounts also in major units.
#[derive(Debug, Clone, Serialize)]
pub struct PaymentRecord {
    pub id: i64,
    pub provider: String,
    pub transaction_id: String,
    /// `payment`, `refund` or `dispute`.
    pub kind: String,
    /// The payment a refund or a dispute belongs to.
    pub parent_transaction_id: Option<String>,
    pub status: String,
    /// The event that wrote the row last.
    pub event_type: String,
    pub amount_minor: i64,
    /// `amount_minor` in major units (`"100.00"`); `None` for a currency
    /// without a known exponent.
    pub amount: Option<String>,
    pub currency: String,
    /// What refunds and disputes took out of a payment (net of reversals).
    pub amount_out_minor: i64,
    /// `amount_out_minor` in major units, as `amount`.
    pub amount_out: Option<String>,
    /// The lease token of the last write.
    pub fence: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// The columns [`payment_record`] reads, for `SELECT {RECORD_COLUMNS} FROM payments`.
pub const RECORD_COLUMNS: &str = "id, provider, transaction_id::text AS transaction_id, \
     kind::text AS kind, parent_transaction_id::text AS parent_transaction_id, \
     status::text AS status, event_type::text AS event_type, amount_minor::int8 AS amount_minor, \
     currency::text AS currency, amount_out_minor::int8 AS amount_out_minor, fence::int8 AS fence, \
     created_at, updated_at";

/// The record of a row read with [`RECORD_COLUMNS`]' names.
pub fn payment_record(r: &tokio_postgres::Row) -> PaymentRecord {
    let (amount_minor, amount_out_minor, currency): (i64, i64, String) = (
        r.get("amount_minor"),
        r.get("amount_out_minor"),
        r.get("currency"),
    );
    PaymentRecord {
        amount: major_amount(amount_minor, &currency),
        amount_out: major_amount(amount_out_minor, &currency),
        id: r.get("id"),
        provider: r.get("provider"),
        transaction_id: r.get("transaction_id"),
        kind: r.get("kind"),
        parent_transaction_id: r.get("parent_transaction_id"),
        status: r.get("status"),
        event_type: r.get("event_type"),
        amount_minor,
        currency,
        amount_out_minor,
        fence: r.get("fence"),
        created_at: r.get("created_at"),
        updated_at: r.get("updated_at"),
    }
}
