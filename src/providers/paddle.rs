//! Paddle Billing (`paddle` scheme): the `Paddle-Signature` header and
//! Paddle Billing events (not Paddle Classic's form-encoded alerts).
//!
//! # Signature
//!
//! `Paddle-Signature: ts=<unix>;h1=<hex>[;h1=<hex>...]`, each `h1` an
//! HMAC-SHA256 over `{ts}:{raw body}` keyed with the notification
//! destination's secret key as written (`pdl_ntf_…`, its own bytes, not
//! decoded). Paddle sends several `h1` while a secret is rotated; any
//! configured secret against any `h1` verifies (rotation on both sides).
//! Keys other than `ts` and `h1` are ignored (a later hash version); a header
//! without `ts`, without an `h1`, or with a piece that is not `key=value` is
//! refused. `ts` must be within `tolerance_secs` of now, on either side
//! (default 300 s, as for Stripe; Paddle's own SDK defaults to 5 s, which
//! refuses a delivery held up a few seconds by a proxy or a slow clock).
//! Comparison is constant-time (`Mac::verify_slice`).
//!
//! # Mapping (what is booked)
//!
//! Amounts are strings of minor units (`"65215"` is USD 652.15), read
//! exactly (digits only, no float, above zero).
//!
//! | event | booked as | transaction_id | parent | amount |
//! | --- | --- | --- | --- | --- |
//! | `transaction.completed` | payment.succeeded (credit) | `data.id` (`txn_…`) | – | `data.details.totals.grand_total` |
//! | `transaction.payment_failed` | payment.failed | `data.id` | – | `data.details.totals.grand_total` |
//! | `adjustment.created`, `adjustment.updated` with `action` `refund` | `status` `approved` → refund.succeeded (debit); `rejected`, `reversed` → refund.failed; `pending_approval` ignored | `data.id` (`adj_…`) | `data.transaction_id` | `data.totals.total` |
//!
//! The currency is `data.currency_code` (Paddle sends it upper case). Every
//! other type is ignored without looking further, among them
//! `transaction.paid` (captured but not yet processed by Paddle: the
//! `transaction.completed` that follows books it) and the subscription
//! events. The event id is `event_id` (`evt_…`).
//!
//! Decisions worth knowing (docs/providers.md gives the sources):
//!
//! - `grand_total` is what the customer paid: after discount, tax and
//!   credit, before payments (`balance` is 0 once completed). A transaction
//!   whose grand total is 0 (a free trial, a 100 % discount) moved no money:
//!   ignored, not refused, so Paddle stops retrying it.
//! - A failure is keyed by the transaction, like its success: Paddle retries
//!   a declined automatic collection on the same `txn_…`, so failed →
//!   succeeded books the success, and a failure after it is `stale`.
//! - Adjustments other than refunds (`credit`, `chargeback`,
//!   `chargeback_reverse`, `chargeback_warning`, `credit_reverse`) are
//!   ignored: a credit moves no money out, and a chargeback's reversal is
//!   another adjustment with its own id, which cannot be tied back to the
//!   chargeback it reverses from the event alone.
//! - `reversed` (an approved refund taken back) is booked as a refund
//!   failure: after a booked refund it gives the money back once.
//! - The refund's amount is `totals.total` (tax included): what left the
//!   customer's payment, which is what the cap against the payment's
//!   `grand_total` compares like with like.

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fields::{self, check_currency, check_transaction_id, invalid, req_object, req_str};
use super::hmac;
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError};
use super::scheme::{Item, Reject, Scheme};
use super::setup::Setup;
use crate::domain::{CanonicalEvent, EventKind};

/// The header Paddle signs with (HTTP header names are case-insensitive).
pub const SIGNATURE_HEADER: &str = "paddle-signature";

/// A Paddle notification secret (`pdl_ntf_` and two ids) is longer than this.
const MIN_SECRET_CHARS: usize = 32;

#[derive(Clone)]
pub struct Paddle {
    secrets: Vec<Vec<u8>>,
    tolerance_secs: u64,
}

impl Paddle {
    pub fn new(secrets: &[String], tolerance_secs: u64) -> Result<Paddle, String> {
        let secrets = hmac::keys(
            secrets,
            "a paddle secret key is not empty (the notification destination's, pdl_ntf_…)",
        )?;
        Ok(Paddle {
            secrets,
            tolerance_secs,
        })
    }

    pub fn verify(&self, headers: &http::HeaderMap, body: &[u8], now: i64) -> Result<(), Reject> {
        let header = fields::signed_header(headers, SIGNATURE_HEADER)?;
        let sig = parse_signature_header(header)?;
        if now.abs_diff(sig.timestamp) > self.tolerance_secs {
            return Err(Reject::Unauthorized(
                "Paddle-Signature ts outside tolerance".to_owned(),
            ));
        }
        let message: [&[u8]; 3] = [sig.timestamp_text.as_bytes(), b":", body];
        fields::signature_matched(hmac::any_key_verifies(&self.secrets, &message, &sig.h1))
    }
}

impl Scheme for Paddle {
    const NAME: &'static str = "paddle";
    type Settings = hmac::TimedTable;
    const SIGNATURE_HEADER: Option<&'static str> = Some(SIGNATURE_HEADER);
    const CURRENCY: &'static str = "USD";
    const SENDS: &'static [EventKind] = &[
        EventKind::PaymentSucceeded,
        EventKind::PaymentFailed,
        EventKind::RefundSucceeded,
        EventKind::RefundFailed,
    ];
    const DELIVERY_ID_PREFIX: &'static str = "evt_";
    const PAYMENT_ID: Option<&'static str> = Some("the transaction id (txn_…)");
    const KEYS: &'static [Key] = &[psp::SECRET];

    fn build(settings: hmac::TimedTable, setup: &mut Setup) -> Result<Paddle, String> {
        let (secrets, tolerance) = settings.read(setup)?;
        Paddle::new(&secrets, tolerance).map_err(|e| setup.error("secrets", e))
    }

    fn short_secret(secret: &str) -> Option<String> {
        (secret.len() < MIN_SECRET_CHARS).then(|| {
            format!(
                "{} characters, shorter than the {MIN_SECRET_CHARS} of a key Paddle issues",
                secret.len()
            )
        })
    }

    fn psp_event_id(_headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
        fields::envelope_event_id(body)
    }

    async fn accept(
        &self,
        provider: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.verify(headers, body, now)?;
        parse_event(provider, body).map(|item| vec![item])
    }

    fn check(psp: &dyn Credentials) -> Result<(), PspError> {
        hmac::check_secret(psp, "a paddle secret key is not empty")
    }

    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let body = psp::body_or(body, || event_of(notice, delivery_id, ts))?;
        let signature = sign(psp.key(&psp::SECRET)?, ts, body.as_bytes());
        Ok(Delivery::json(body, vec![(SIGNATURE_HEADER, signature)]))
    }
}

/// A parsed `Paddle-Signature` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureHeader<'a> {
    /// `ts` exactly as sent: it is part of the signed payload.
    pub timestamp_text: &'a str,
    pub timestamp: i64,
    /// Decoded `h1` signatures; entries that are not hex cannot match and are dropped.
    pub h1: Vec<Vec<u8>>,
}

/// Parses `ts=<unix>;h1=<hex>[;h1=<hex>...]`. Unknown keys are ignored.
pub fn parse_signature_header(header: &str) -> Result<SignatureHeader<'_>, Reject> {
    let malformed = |why: &str| Reject::Unauthorized(format!("malformed Paddle-Signature: {why}"));
    let mut timestamp = None;
    let mut h1 = Vec::new();
    let mut saw_h1 = false;
    for piece in header.split(';') {
        let Some((key, value)) = piece.trim().split_once('=') else {
            return Err(malformed("every entry is key=value"));
        };
        match key {
            "ts" => {
                if timestamp.is_some() {
                    return Err(malformed("more than one ts"));
                }
                if value.is_empty()
                    || value.len() > 18
                    || !value.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(malformed("ts is not a unix timestamp"));
                }
                let ts: i64 = value
                    .parse()
                    .map_err(|_| malformed("ts is not a unix timestamp"))?;
                timestamp = Some((value, ts));
            }
            "h1" => {
                saw_h1 = true;
                if let Ok(sig) = hex::decode(value) {
                    h1.push(sig);
                }
            }
            _ => {}
        }
    }
    let Some((timestamp_text, timestamp)) = timestamp else {
        return Err(malformed("no ts"));
    };
    if !saw_h1 {
        return Err(malformed("no h1 signature"));
    }
    Ok(SignatureHeader {
        timestamp_text,
        timestamp,
        h1,
    })
}

/// Signs like Paddle: the `Paddle-Signature` header value for `body` at `ts`.
pub fn sign(secret: &str, ts: i64, body: &[u8]) -> String {
    format!("ts={ts};h1={}", signature_hex(secret, ts, body))
}

/// The hex `h1` signature alone (for headers with several signatures).
pub fn signature_hex(secret: &str, ts: i64, body: &[u8]) -> String {
    let prefix = format!("{ts}:");
    hex::encode(hmac::sign(secret.as_bytes(), &[prefix.as_bytes(), body]))
}

/// Maps a Paddle Billing event (see the module docs) strictly: a handled
/// type with a missing or ill-typed field is [`Reject::Invalid`]; a type we
/// do not act on is [`Item::Ignored`] without looking further.
pub fn parse_event(provider: &str, body: &[u8]) -> Result<Item, Reject> {
    let value = fields::parse_json(body)?;
    let event = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object (a Paddle event)"))?;
    let event_type = req_str(event, "event_type", "event_type")?;
    let ignored = || {
        Ok(Item::Ignored {
            event_type: event_type.to_owned(),
        })
    };
    match event_type {
        "transaction.completed"
        | "transaction.payment_failed"
        | "adjustment.created"
        | "adjustment.updated" => {}
        _ => return ignored(),
    }
    let occurred_at = match fields::opt_str(event, "occurred_at", "occurred_at")? {
        None => None,
        Some(text) => Some(
            OffsetDateTime::parse(text, &Rfc3339)
                .map_err(|_| invalid("occurred_at must be an RFC 3339 date-time"))?,
        ),
    };
    let data = req_object(event, "data", "data")?;
    let (kind, parent, amount) = match event_type {
        "transaction.completed" | "transaction.payment_failed" => {
            let details = req_object(data, "details", "data.details")?;
            let totals = req_object(details, "totals", "data.details.totals")?;
            let path = "data.details.totals.grand_total";
            let grand_total = req_str(totals, "grand_total", path)?;
            if is_zero(grand_total) {
                // A free trial or a full discount: no money moved.
                return ignored();
            }
            let kind = if event_type == "transaction.completed" {
                EventKind::PaymentSucceeded
            } else {
                EventKind::PaymentFailed
            };
            (kind, None, minor_units(grand_total, path)?)
        }
        _ => {
            // adjustment.created, adjustment.updated
            if req_str(data, "action", "data.action")? != "refund" {
                return ignored();
            }
            let kind = match req_str(data, "status", "data.status")? {
                "approved" => EventKind::RefundSucceeded,
                "rejected" | "reversed" => EventKind::RefundFailed,
                // pending_approval, or a status this mapping does not know:
                // nothing moved yet; adjustment.updated settles it.
                _ => return ignored(),
            };
            let parent = req_str(data, "transaction_id", "data.transaction_id")?;
            check_transaction_id(parent).map_err(|_| {
                invalid("data.transaction_id must be 1 to 255 printable ASCII characters, without leading or trailing whitespace")
            })?;
            let totals = req_object(data, "totals", "data.totals")?;
            let path = "data.totals.total";
            let total = req_str(totals, "total", path)?;
            (kind, Some(parent), minor_units(total, path)?)
        }
    };
    let transaction_id = req_str(data, "id", "data.id")?;
    check_transaction_id(transaction_id)?;
    let currency = req_str(data, "currency_code", "data.currency_code")?;
    check_currency(currency)?;
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id: transaction_id.to_owned(),
        event_type: kind,
        amount_minor: amount,
        currency: currency.to_owned(),
        parent_transaction_id: parent.map(str::to_owned),
        occurred_at,
        // Paddle has no merchant reference string (`custom_data` is an
        // object of the merchant's own keys): none is sent.
        merchant_reference: None,
        metadata: None,
    }))
}

/// Whether an amount string is zero (`"0"`, `"000"`).
fn is_zero(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b == b'0')
}

/// A Paddle amount: a string of digits in minor units, above zero.
fn minor_units(text: &str, path: &str) -> Result<i64, Reject> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(format!(
            "{path} must be a string of digits in minor units"
        )));
    }
    fields::decimal_minor(text, 0, path)
}

/// The Paddle Billing event of `notice`, as Paddle sends it: [`parse_event`]'s
/// inverse. A payment is a `transaction.completed` (or
/// `transaction.payment_failed`) of one item; a refund an
/// `adjustment.updated` of action `refund`, `approved` or `rejected`. Any
/// other `event_type` is sent verbatim as the type of a completed
/// transaction.
pub fn event_of(notice: &Notice, event_id: &str, ts: i64) -> Result<Value, String> {
    let at = psp::rfc3339(ts, 0)?;
    let tx = &notice.transaction_id;
    let amount = notice.amount.to_string();
    let currency = &notice.currency;
    let transaction = |status: &str, payment: Value| {
        json!({
            "id": tx, "status": status, "customer_id": "ctm_01hv6y1jedq4p1n0yqn5ba3ky4",
            "address_id": "add_01hv8gq3318ktkfengj2r75gfx", "business_id": null,
            "custom_data": null, "origin": "web", "collection_mode": "automatic",
            "subscription_id": null, "invoice_id": null, "invoice_number": null,
            "billing_details": null, "billing_period": null, "currency_code": currency,
            "discount_id": null, "created_at": at, "updated_at": at, "billed_at": at,
            "items": [{"price": {"id": "pri_01gsz8x8sawmvhz1pv30nge1ke"}, "quantity": 1}],
            "details": {"totals": {
                "subtotal": amount, "discount": "0", "tax": "0", "total": amount,
                "credit": "0", "credit_to_balance": "0", "balance": "0",
                "grand_total": amount, "fee": null, "earnings": null, "currency_code": currency
            }},
            "payments": [payment], "checkout": {"url": null}
        })
    };
    let adjustment = |status: &str| -> Result<Value, String> {
        let parent = psp::parent(notice)?;
        Ok(json!({
            "id": tx, "action": "refund", "type": "partial", "reason": "error",
            "status": status, "transaction_id": parent, "subscription_id": null,
            "customer_id": "ctm_01hv6y1jedq4p1n0yqn5ba3ky4", "currency_code": currency,
            "credit_applied_to_balance": null,
            "items": [{"id": "adjitm_01hvgf2s84dr6reszzg2gx70gj", "type": "partial",
                "amount": amount, "item_id": "txnitm_01hv8wt98jahpbm1t1tzr06z6n",
                "proration": null,
                "totals": {"subtotal": amount, "tax": "0", "total": amount}}],
            "totals": {"subtotal": amount, "tax": "0", "total": amount, "fee": "0",
                "earnings": "0", "retained_fee": "0", "currency_code": currency},
            "payout_totals": null, "tax_rates_used": null,
            "created_at": at, "updated_at": at
        }))
    };
    let captured = json!({"amount": amount, "status": "captured", "created_at": at,
        "captured_at": at, "error_code": null, "method_details": {"type": "card"}});
    let (event_type, data) = match notice.event_type.as_str() {
        "payment.succeeded" => ("transaction.completed", transaction("completed", captured)),
        "payment.failed" => (
            "transaction.payment_failed",
            transaction(
                "past_due",
                json!({"amount": amount, "status": "error", "created_at": at,
                    "captured_at": null, "error_code": "declined",
                    "method_details": {"type": "card"}}),
            ),
        ),
        "refund.succeeded" => ("adjustment.updated", adjustment("approved")?),
        "refund.failed" => ("adjustment.updated", adjustment("rejected")?),
        "dispute.funds_withdrawn" | "dispute.funds_reinstated" => {
            return Err(psp::not_sent(Paddle::NAME, Paddle::SENDS, notice))
        }
        other => (other, transaction("completed", captured)),
    };
    Ok(json!({
        "event_id": event_id, "event_type": event_type, "occurred_at": at,
        "notification_id": format!("ntf_{}", event_id.strip_prefix("evt_").unwrap_or(event_id)),
        "data": data
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{self, arbitrary_json, summary, with};
    use proptest::prelude::*;

    const SECRET: &str = "pdl_ntf_01hv8x0fencehookvectorsxx_Qm9UIGEgcmVhbCBzZWNyZXQsIGEgdmVjdG9y";
    const OLD: &str = "pdl_ntf_01hv8x0oldsecretbeforeroll_b2xkIHNlY3JldCBiZWZvcmUgdGhlIHJvbGw";

    const PADDLE_KEYS: &[&str] = &[
        "event_id",
        "event_type",
        "occurred_at",
        "data",
        "id",
        "details",
        "totals",
        "grand_total",
        "total",
        "currency_code",
        "action",
        "status",
        "transaction_id",
    ];

    fn fixture(name: &str) -> Vec<u8> {
        testing::fixture("paddle", name)
    }

    fn paddle(secrets: &[&str]) -> Paddle {
        Paddle::new(
            &secrets.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            300,
        )
        .unwrap()
    }

    fn headers(value: &str) -> http::HeaderMap {
        testing::header(SIGNATURE_HEADER, value)
    }

    fn event(body: &[u8]) -> CanonicalEvent {
        match parse_event("paddle", body) {
            Ok(Item::Event(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn paddle_sends_no_merchant_reference_even_with_custom_data() {
        let body = fixture("transaction.completed.json");
        let mut value: Value = serde_json::from_slice(&body).unwrap();
        value["data"]["custom_data"] = serde_json::json!({"order_id": "1042"});
        let e = event(&serde_json::to_vec(&value).unwrap());
        assert_eq!((e.merchant_reference, e.metadata), (None, None));
    }

    #[test]
    fn the_pinned_vectors_verify_paddles_own_and_pythons_hmac_over_the_fixtures() {
        let vectors: Vec<Value> =
            serde_json::from_slice(&fixture("vectors.json")).expect("vectors.json");
        assert_eq!(vectors.len(), 3);
        for v in &vectors {
            let secret = v["secret"].as_str().unwrap();
            let ts = v["ts"].as_i64().unwrap();
            let body = match v["file"].as_str() {
                Some(file) => fixture(file),
                None => v["body"].as_str().unwrap().as_bytes().to_vec(),
            };
            let header = v["header"].as_str().unwrap();
            // The SDK's vector carries a dummy h1 before the real one.
            let real = header.rsplit("h1=").next().unwrap();
            assert_eq!(signature_hex(secret, ts, &body), real, "{v}");
            let p = paddle(&[OLD, secret]);
            assert_eq!(p.verify(&headers(header), &body, ts + 299), Ok(()), "{v}");
            assert!(p.verify(&headers(header), &body, ts + 301).is_err());
        }
    }

    #[test]
    fn one_byte_changed_another_secret_or_an_old_ts_is_refused() {
        let body = fixture("transaction.completed.json");
        let ts = 1_712_917_130;
        let h = headers(&sign(SECRET, ts, &body));
        assert_eq!(paddle(&[SECRET]).verify(&h, &body, ts), Ok(()));
        let mut changed = body.clone();
        let i = changed.len() / 2;
        changed[i] ^= 0x01;
        assert!(matches!(
            paddle(&[SECRET]).verify(&h, &changed, ts),
            Err(Reject::Unauthorized(_))
        ));
        assert!(matches!(
            paddle(&[OLD]).verify(&h, &body, ts),
            Err(Reject::Unauthorized(_))
        ));
        for now in [ts + 301, ts - 301] {
            assert!(matches!(
                paddle(&[SECRET]).verify(&h, &body, now),
                Err(Reject::Unauthorized(why)) if why.contains("tolerance")
            ));
        }
        // The ts is signed: moving it breaks the signature.
        let moved = sign(SECRET, ts, &body).replace(&format!("ts={ts}"), &format!("ts={}", ts + 1));
        assert!(paddle(&[SECRET])
            .verify(&headers(&moved), &body, ts)
            .is_err());
    }

    #[test]
    fn during_a_rotation_either_h1_verifies_with_either_secret() {
        let body = fixture("adjustment.updated.approved.json");
        let ts = 1_713_171_250;
        let two = format!(
            "ts={ts};h1={};h1={}",
            signature_hex(OLD, ts, &body),
            signature_hex(SECRET, ts, &body)
        );
        assert_eq!(paddle(&[SECRET]).verify(&headers(&two), &body, ts), Ok(()));
        assert_eq!(paddle(&[OLD]).verify(&headers(&two), &body, ts), Ok(()));
        let unknown = "pdl_ntf_01hv8x0anothersecretxxxx_bm90IGNvbmZpZ3VyZWQgaGVyZSBhdCBhbGw";
        assert!(paddle(&[unknown])
            .verify(&headers(&two), &body, ts)
            .is_err());
    }

    #[test]
    fn malformed_headers_are_refused() {
        for header in [
            "",
            "h1=00",
            "ts=1",
            "ts=x;h1=00",
            "ts=1;ts=1;h1=00",
            "ts=1;h1",
            "ts=-1;h1=00",
            "ts=1234567890123456789;h1=00",
        ] {
            assert!(parse_signature_header(header).is_err(), "{header:?}");
        }
        let h = parse_signature_header("ts=1671552777;h1=00ff;h2=zz;h1=nothex").unwrap();
        assert_eq!(h.timestamp, 1671552777);
        assert_eq!(h.h1, vec![vec![0x00, 0xff]]);
        assert!(matches!(
            paddle(&[SECRET]).verify(&http::HeaderMap::new(), b"{}", 0),
            Err(Reject::Unauthorized(_))
        ));
    }

    #[test]
    fn each_fixture_books_what_paddle_means() {
        let txn = "txn_01hv8wptq8987qeep44cyrewp9";
        let completed = event(&fixture("transaction.completed.json"));
        assert_eq!(
            summary(&completed),
            (txn, EventKind::PaymentSucceeded, None, 65215, "USD")
        );
        assert_eq!(
            completed.occurred_at,
            OffsetDateTime::parse("2024-04-12T10:18:50.155553Z", &Rfc3339).ok()
        );
        let failed = event(&fixture("transaction.payment_failed.json"));
        assert_eq!(
            summary(&failed),
            (txn, EventKind::PaymentFailed, None, 65215, "USD")
        );
        assert_eq!(failed.fingerprint(), completed.fingerprint());
        let adj = "adj_01hvgf2s84dr6reszzg29zbvcm";
        let parent = Some("txn_01hvcc93znj3mpqt1tenkjb04y");
        let approved = event(&fixture("adjustment.updated.approved.json"));
        assert_eq!(
            summary(&approved),
            (adj, EventKind::RefundSucceeded, parent, 100, "USD")
        );
        let rejected = event(&fixture("adjustment.updated.rejected.json"));
        assert_eq!(
            summary(&rejected),
            (adj, EventKind::RefundFailed, parent, 100, "USD")
        );
        for name in ["adjustment.created.json", "transaction.paid.json"] {
            assert!(
                matches!(
                    parse_event("paddle", &fixture(name)),
                    Ok(Item::Ignored { .. })
                ),
                "{name}"
            );
        }
        assert_eq!(
            Paddle::psp_event_id(
                &http::HeaderMap::new(),
                &fixture("transaction.completed.json")
            ),
            Some("evt_01hv8x2axb33yr5y238zfwcn5p".to_owned())
        );
    }

    #[test]
    fn other_adjustments_pending_refunds_and_free_transactions_are_ignored() {
        let adj = fixture("adjustment.updated.approved.json");
        for action in [
            "credit",
            "chargeback",
            "chargeback_reverse",
            "credit_reverse",
        ] {
            let body = with(&adj, &["data", "action"], json!(action));
            assert!(
                matches!(parse_event("p", &body), Ok(Item::Ignored { .. })),
                "{action}"
            );
        }
        let pending = with(&adj, &["data", "status"], json!("pending_approval"));
        assert!(matches!(
            parse_event("p", &pending),
            Ok(Item::Ignored { .. })
        ));
        let reversed = with(&adj, &["data", "status"], json!("reversed"));
        assert_eq!(event(&reversed).event_type, EventKind::RefundFailed);
        let txn = fixture("transaction.completed.json");
        let free = with(
            &txn,
            &["data", "details", "totals", "grand_total"],
            json!("0"),
        );
        assert!(matches!(parse_event("p", &free), Ok(Item::Ignored { .. })));
        for t in [
            "subscription.created",
            "customer.created",
            "transaction.updated",
        ] {
            let body = format!(r#"{{"event_type":"{t}"}}"#);
            assert!(matches!(
                parse_event("p", body.as_bytes()),
                Ok(Item::Ignored { .. })
            ));
        }
    }

    #[test]
    fn bad_shapes_of_handled_types_are_invalid() {
        let txn = fixture("transaction.completed.json");
        let adj = fixture("adjustment.updated.approved.json");
        let cases: Vec<Vec<u8>> = vec![
            with(
                &txn,
                &["data", "details", "totals", "grand_total"],
                json!(65215),
            ),
            with(
                &txn,
                &["data", "details", "totals", "grand_total"],
                json!("652.15"),
            ),
            with(
                &txn,
                &["data", "details", "totals", "grand_total"],
                json!("-5"),
            ),
            with(
                &txn,
                &["data", "details", "totals", "grand_total"],
                json!(" 5"),
            ),
            with(
                &txn,
                &["data", "details", "totals", "grand_total"],
                json!("99999999999999999999"),
            ),
            with(&txn, &["data", "details", "totals"], json!(null)),
            with(&txn, &["data", "currency_code"], json!("usd")),
            with(&txn, &["data", "currency_code"], json!(null)),
            with(&txn, &["data", "id"], json!(" txn_1")),
            with(&txn, &["data", "id"], json!(5)),
            with(&txn, &["occurred_at"], json!("yesterday")),
            with(&txn, &["data"], json!("txn_1")),
            with(&adj, &["data", "transaction_id"], json!(null)),
            with(&adj, &["data", "transaction_id"], json!("")),
            with(&adj, &["data", "totals", "total"], json!("0")),
            with(&adj, &["data", "action"], json!(null)),
            with(&adj, &["data", "status"], json!(7)),
        ];
        for body in cases {
            assert!(
                matches!(parse_event("p", &body), Err(Reject::Invalid(_))),
                "{}",
                String::from_utf8_lossy(&body)
            );
        }
        for body in [
            &b"not json"[..],
            b"[]",
            br#"{"event_type":5}"#,
            br#"{"data":{}}"#,
        ] {
            assert!(matches!(parse_event("p", body), Err(Reject::Invalid(_))));
        }
    }

    proptest! {
        #[test]
        fn the_header_parser_never_panics(header in ".*") {
            let _ = parse_signature_header(&header);
        }

        #[test]
        fn verify_and_map_never_panic(
            header in "[ -~]{0,200}",
            body in proptest::collection::vec(any::<u8>(), 0..512),
            now in any::<i64>(),
        ) {
            let p = paddle(&[SECRET]);
            let mut h = http::HeaderMap::new();
            if let Ok(v) = header.parse() {
                h.insert(SIGNATURE_HEADER, v);
            }
            let _ = p.verify(&h, &body, now);
            let _ = parse_event("paddle", &body);
        }

        #[test]
        fn signed_arbitrary_events_never_panic(
            event_type in prop::sample::select(vec![
                "transaction.completed", "transaction.payment_failed", "adjustment.created",
                "adjustment.updated", "transaction.paid"]),
            data in arbitrary_json(PADDLE_KEYS),
            now in 0i64..4_000_000_000,
        ) {
            let body = serde_json::to_vec(&json!({"event_type": event_type, "data": data})).unwrap();
            let h = headers(&sign(SECRET, now, &body));
            prop_assert!(paddle(&[SECRET]).verify(&h, &body, now).is_ok());
            let _ = parse_event("paddle", &body);
        }
    }
}

/// The PSP side and the parser together: what the one builds and signs, the
/// other verifies and maps back to the canonical event it was built from.
#[cfg(test)]
mod round_trip {
    use proptest::prelude::*;

    use super::*;
    use crate::providers::testing::{
        at, events, ids, round_trip, round_trip_config, TestCredentials,
    };

    const SECRET: &str = "pdl_ntf_01hv8x0roundtripsecretxx_cm91bmQgdHJpcCBzZWNyZXQgZm9yIHRlc3Rz";

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(Paddle::SENDS, ids(), i64::MAX, "[A-Z]{3}"),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let scheme = Paddle::new(&[SECRET.to_owned()], 300).unwrap();
            let psp = TestCredentials::new(&[(psp::SECRET, SECRET)], None);
            // The event's `occurred_at`.
            let event = CanonicalEvent { occurred_at: at(ts), ..event };
            prop_assert_eq!(round_trip(&scheme, &psp, &event, ts)?, event);
        }
    }
}
