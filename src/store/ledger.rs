//! The ledger as finance reads it: every entry booked in a window, and the
//! net per currency (`fencehook export ledger`), and the audit's sums of the
//! whole ledger per currency ([`sums`]).
//!
//! What must stay true: an export's totals are the sums of the entries it
//! wrote, and over a window that covers the whole ledger they equal the
//! audit's sums. Both are read in one snapshot (the entries are streamed and
//! summed as they are written, so a million-entry month is never held in
//! memory), and both sum the signed `amount_minor` (money in positive, money
//! out negative) per currency.
//!
//! A window is half-open, `since <= booked_at < until`: consecutive windows
//! (each day's export) never count an entry twice nor miss one.

use std::collections::BTreeMap;

use futures_util::{pin_mut, TryStreamExt};
use serde::Serialize;
use time::OffsetDateTime;

use crate::store::audit::connect;
use crate::store::StoreError;

/// One ledger entry, as the export writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub entry_id: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub booked_at: OffsetDateTime,
    pub provider: String,
    /// The row the entry books: a payment's, a refund's or a dispute's id.
    pub transaction_id: String,
    /// A refund's or dispute's payment.
    pub parent_transaction_id: Option<String>,
    /// `credit`, `debit`, `refund_reversal`, `dispute`, `dispute_reversal`.
    pub effect: String,
    /// Signed: money in positive, money out (debits, disputes) negative.
    pub amount_minor: i64,
    pub currency: String,
    /// The fencing token of the holder that booked it.
    pub fence: i64,
}

/// The net of one currency's entries, and how many there are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CurrencyTotal {
    pub currency: String,
    /// The signed sum in minor units (i128: no month of bigints overflows it).
    #[serde(serialize_with = "as_string_if_huge")]
    pub amount_minor: i128,
    pub entries: i64,
}

/// JSON numbers past 2^53 lose digits in most readers: such a sum is written
/// as a string of digits, every other as a number.
fn as_string_if_huge<S: serde::Serializer>(v: &i128, s: S) -> Result<S::Ok, S::Error> {
    const SAFE: i128 = (1 << 53) - 1;
    if (-SAFE..=SAFE).contains(v) {
        s.serialize_i64(*v as i64)
    } else {
        s.serialize_str(&v.to_string())
    }
}

/// Which entries an export writes.
#[derive(Debug, Clone)]
pub struct Window {
    pub since: OffsetDateTime,
    pub until: OffsetDateTime,
    pub provider: Option<String>,
}

/// Sums entries per currency, in the order of their codes.
#[derive(Debug, Default)]
pub struct Totals(BTreeMap<String, (i128, i64)>);

impl Totals {
    pub fn add(&mut self, e: &Entry) {
        let t = self.0.entry(e.currency.clone()).or_default();
        t.0 += i128::from(e.amount_minor);
        t.1 += 1;
    }

    pub fn list(&self) -> Vec<CurrencyTotal> {
        self.0
            .iter()
            .map(|(currency, (amount_minor, entries))| CurrencyTotal {
                currency: currency.clone(),
                amount_minor: *amount_minor,
                entries: *entries,
            })
            .collect()
    }
}

const ENTRIES: &str = "\
SELECT l.id, l.created_at, p.provider, p.transaction_id, p.parent_transaction_id,
       l.effect::text, l.amount_minor, l.currency::text, l.fence
  FROM ledger_entries l JOIN payments p ON p.id = l.payment_id
 WHERE l.created_at >= $1 AND l.created_at < $2
   AND ($3::text IS NULL OR p.provider = $3)
 ORDER BY l.id";

/// Streams every entry of `window` to `each`, oldest first, in one
/// read-only snapshot; returns the totals of what it streamed. `each`
/// failing (stdout closed) stops the read and is returned.
pub async fn export<E>(
    url: &str,
    window: &Window,
    mut each: impl FnMut(&Entry) -> Result<(), E>,
) -> Result<Result<Totals, E>, StoreError> {
    let client = connect(url).await?;
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
        [&window.since, &window.until, &window.provider];
    let rows = client.query_raw(ENTRIES, params).await?;
    pin_mut!(rows);
    let mut totals = Totals::default();
    while let Some(r) = rows.try_next().await? {
        let e = Entry {
            entry_id: r.get(0),
            booked_at: r.get(1),
            provider: r.get(2),
            transaction_id: r.get(3),
            parent_transaction_id: r.get(4),
            effect: r.get(5),
            amount_minor: r.get(6),
            currency: r.get(7),
            fence: r.get(8),
        };
        if let Err(e) = each(&e) {
            return Ok(Err(e));
        }
        totals.add(&e);
    }
    client.batch_execute("COMMIT").await?;
    Ok(Ok(totals))
}

/// The whole ledger's net per currency, as `fencehook audit` prints it.
pub async fn sums(url: &str) -> Result<Vec<CurrencyTotal>, StoreError> {
    let client = connect(url).await?;
    let rows = client
        .query(
            "SELECT currency::text, sum(amount_minor)::text, count(*)
               FROM ledger_entries GROUP BY currency ORDER BY currency",
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let sum: String = r.get(1);
            Ok(CurrencyTotal {
                currency: r.get(0),
                amount_minor: sum
                    .parse()
                    .map_err(|_| StoreError::Corrupt(format!("a ledger sum of {sum}")))?,
                entries: r.get(2),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_net_each_currency_and_big_sums_stay_exact_in_json() {
        let entry = |amount_minor, currency: &str| Entry {
            entry_id: 1,
            booked_at: OffsetDateTime::UNIX_EPOCH,
            provider: "generic".to_owned(),
            transaction_id: "t".to_owned(),
            parent_transaction_id: None,
            effect: "credit".to_owned(),
            amount_minor,
            currency: currency.to_owned(),
            fence: 1,
        };
        let mut t = Totals::default();
        for e in [
            entry(1000, "EUR"),
            entry(-250, "EUR"),
            entry(i64::MAX, "USD"),
            entry(i64::MAX, "USD"),
        ] {
            t.add(&e);
        }
        let list = t.list();
        assert_eq!(list[0].currency, "EUR");
        assert_eq!((list[0].amount_minor, list[0].entries), (750, 2));
        assert_eq!(list[1].amount_minor, 2 * i128::from(i64::MAX));
        let json = serde_json::to_value(&list).unwrap();
        assert_eq!(json[0]["amount_minor"], 750);
        assert_eq!(json[1]["amount_minor"], "18446744073709551614");
    }
}
