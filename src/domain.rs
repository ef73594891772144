//! The domain: what a payment event *is*, whatever provider reported it, the
//! states a row moves through, and the rules of a payment's life. Nothing
//! here knows about HTTP, Redis, SQL or any provider's wire format; every
//! other room depends on this one.
//!
//! Amounts are minor units; how many make a major unit of each currency,
//! and an amount written for people, is [`amount`].
//!
//! # The lifecycle (what must stay true)
//!
//! A row is one money object the PSP reports: a payment, a refund or a
//! dispute. Events arrive in any order and more than once; [`decide`] says
//! what an event does to its row, from the row's status alone:
//!
//! | event | no row / `processing` | `succeeded` | `failed` |
//! | --- | --- | --- | --- |
//! | `payment.succeeded` | → succeeded, credit | duplicate | → succeeded, credit (a retried payment) |
//! | `payment.failed` | → failed | stale | duplicate |
//! | `refund.succeeded` | → succeeded, debit¹ | duplicate | stale |
//! | `refund.failed` | → failed | → failed, refund_reversal | duplicate |
//! | `dispute.funds_withdrawn` | → succeeded, dispute¹ | duplicate | stale |
//! | `dispute.funds_reinstated` | wait for the withdrawal | → failed, dispute_reversal | duplicate |
//!
//! ¹ Only against a `succeeded` payment of the same currency, and, for a
//! refund, only while the refunds booked against it (net of reversals) plus
//! this one stay within its amount (a dispute is money already gone: not
//! capped, and a payment its refunds and disputes together took past its
//! amount is reported over-returned); checked and booked atomically with the
//! entry (see `store`). A payment not yet succeeded here makes the refund wait; a
//! failed payment, another currency or too much is a [`Rejection`].
//!
//! `queued`, `processing` and `dead` mean no event has settled the row yet
//! (no money moved), so they decide like "no row". Transitions out of a
//! settled status keep the row's status until their final write.

pub mod amount;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// What kind of money object a row is (the `kind` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectKind {
    Payment,
    Refund,
    Dispute,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Payment => "payment",
            ObjectKind::Refund => "refund",
            ObjectKind::Dispute => "dispute",
        }
    }

    pub fn parse(s: &str) -> Option<ObjectKind> {
        [ObjectKind::Payment, ObjectKind::Refund, ObjectKind::Dispute]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// What happened to the money object, after mapping a provider's own event names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// Money in: one credit ledger entry.
    #[serde(rename = "payment.succeeded")]
    PaymentSucceeded,
    /// Recorded as `failed`, no ledger entry; a later success is still booked.
    #[serde(rename = "payment.failed")]
    PaymentFailed,
    /// Money out, keyed by the refund's own id: one debit entry.
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
    /// Before a success: recorded `failed`. After a booked success: the money
    /// comes back (one `refund_reversal` credit).
    #[serde(rename = "refund.failed")]
    RefundFailed,
    /// A chargeback took money out, keyed by the dispute's id: one `dispute` debit.
    #[serde(rename = "dispute.funds_withdrawn")]
    DisputeFundsWithdrawn,
    /// The chargeback was won: one `dispute_reversal` credit, only after the withdrawal.
    #[serde(rename = "dispute.funds_reinstated")]
    DisputeFundsReinstated,
}

impl EventKind {
    pub const ALL: &'static [EventKind] = &[
        EventKind::PaymentSucceeded,
        EventKind::PaymentFailed,
        EventKind::RefundSucceeded,
        EventKind::RefundFailed,
        EventKind::DisputeFundsWithdrawn,
        EventKind::DisputeFundsReinstated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::PaymentSucceeded => "payment.succeeded",
            EventKind::PaymentFailed => "payment.failed",
            EventKind::RefundSucceeded => "refund.succeeded",
            EventKind::RefundFailed => "refund.failed",
            EventKind::DisputeFundsWithdrawn => "dispute.funds_withdrawn",
            EventKind::DisputeFundsReinstated => "dispute.funds_reinstated",
        }
    }

    /// The kind a generic payload's `event_type` names (the same names);
    /// `None` for types fencehook does not act on.
    pub fn from_generic(s: &str) -> Option<EventKind> {
        EventKind::ALL.iter().copied().find(|k| k.as_str() == s)
    }

    /// The object this event is about.
    pub fn object(self) -> ObjectKind {
        match self {
            EventKind::PaymentSucceeded | EventKind::PaymentFailed => ObjectKind::Payment,
            EventKind::RefundSucceeded | EventKind::RefundFailed => ObjectKind::Refund,
            EventKind::DisputeFundsWithdrawn | EventKind::DisputeFundsReinstated => {
                ObjectKind::Dispute
            }
        }
    }
}

/// The one shape every provider's payload is mapped to (and, in inbox mode,
/// stored in `events.canonical` for the workers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanonicalEvent {
    pub provider: String,
    pub transaction_id: String,
    pub event_type: EventKind,
    pub amount_minor: i64,
    pub currency: String,
    /// Refunds and disputes: the `transaction_id` of the payment they take
    /// money from. `None` for payments.
    pub parent_transaction_id: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub occurred_at: Option<OffsetDateTime>,
    /// The merchant's own reference for the object, from the PSP's
    /// merchant-side field where it has one (Adyen `merchantReference`,
    /// PayPal `custom_id` else `invoice_id`, `out_trade_no`, …); `null` in
    /// the downstream body when it has none. Not part of the
    /// [`fingerprint`](CanonicalEvent::fingerprint): the same object re-sent
    /// with another reference is a duplicate.
    #[serde(default)]
    pub merchant_reference: Option<String>,
    /// Stripe: the PaymentIntent's (or Charge's, Refund's, Dispute's)
    /// `metadata` object as the merchant set it. Absent for every other
    /// scheme, and left out of the body and of `events.canonical` then. Not
    /// part of the fingerprint either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

/// The version tag of [`CanonicalEvent::fingerprint`].
pub const FINGERPRINT_VERSION: &str = "v2";
/// Separates the fingerprint's parts. No part can contain it: transaction ids
/// are printable ASCII, and PostgreSQL (which recomputes fingerprints in the
/// migration that introduced this version) allows it in text, unlike NUL.
pub const FINGERPRINT_SEPARATOR: char = '\u{1f}';

impl CanonicalEvent {
    /// Fingerprint of what the object *is*: provider, transaction id, kind,
    /// amount, currency and parent — not its state, so `payment.failed` and
    /// `payment.succeeded` of one payment share it, while another amount or
    /// currency for the same id is a mismatch. Delivery metadata (event id,
    /// timestamps) is left out so a PSP's re-send with a new envelope is a
    /// duplicate. SHA-256, hex, over the parts joined by
    /// [`FINGERPRINT_SEPARATOR`] (the SQL of migration V4 computes the same).
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let amount = self.amount_minor.to_string();
        let parts = [
            FINGERPRINT_VERSION,
            &self.provider,
            &self.transaction_id,
            self.event_type.object().as_str(),
            &amount,
            &self.currency,
            self.parent_transaction_id.as_deref().unwrap_or(""),
        ];
        let mut h = Sha256::new();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                let mut sep = [0u8; 4];
                h.update(FINGERPRINT_SEPARATOR.encode_utf8(&mut sep).as_bytes());
            }
            h.update(part.as_bytes());
        }
        hex::encode(h.finalize())
    }
}

/// Where a payments row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Inbox mode: accepted, not yet claimed by any worker.
    Queued,
    /// Claimed by a holder that has not finished (no money moved yet).
    Processing,
    Succeeded,
    Failed,
    /// Inbox mode: its first event was given up on (see its events); nothing
    /// moved. A replay or a new delivery starts it again.
    Dead,
}

impl Status {
    pub const ALL: &'static [Status] = &[
        Status::Queued,
        Status::Processing,
        Status::Succeeded,
        Status::Failed,
        Status::Dead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Processing => "processing",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.iter().copied().find(|st| st.as_str() == s)
    }

    /// Whether money may have moved: the row was settled by an event.
    pub fn is_settled(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed)
    }
}

/// A ledger entry's effect (the `effect` column). At most one per row and effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Payment in.
    Credit,
    /// Refund out.
    Debit,
    /// A booked refund that later failed: the money comes back.
    RefundReversal,
    /// Chargeback: money out.
    Dispute,
    /// Chargeback won: the money comes back.
    DisputeReversal,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Credit => "credit",
            Effect::Debit => "debit",
            Effect::RefundReversal => "refund_reversal",
            Effect::Dispute => "dispute",
            Effect::DisputeReversal => "dispute_reversal",
        }
    }

    /// Sign of the entry's amount: money in positive, money out negative.
    pub fn sign(self) -> i64 {
        match self {
            Effect::Credit | Effect::RefundReversal | Effect::DisputeReversal => 1,
            Effect::Debit | Effect::Dispute => -1,
        }
    }

    /// How the entry moves its parent payment's money out (refunds and
    /// disputes booked, net of reversals): +1 takes, -1 gives back, 0 for a
    /// payment's own credit.
    pub fn parent_delta(self) -> i64 {
        match self {
            Effect::Credit => 0,
            Effect::Debit | Effect::Dispute => 1,
            Effect::RefundReversal | Effect::DisputeReversal => -1,
        }
    }
}

/// A move of a row to `to`, booking `effect`, allowed from `from` (and from
/// no row or `processing`, when `from` says so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The row's status this move starts from: `None` for a first
    /// settlement (no row, or a `processing` claim).
    pub from: Option<Status>,
    pub to: Status,
    pub effect: Option<Effect>,
}

impl Transition {
    /// The statuses the conditioned write may find on the row: for a first
    /// settlement, any unsettled one (queued, a claim left `processing` and
    /// taken over with a higher token, dead); else `from` (a transition's
    /// claim leaves the row's status alone until its finalize).
    pub fn from_statuses(self) -> Vec<&'static str> {
        match self.from {
            None => [Status::Queued, Status::Processing, Status::Dead]
                .iter()
                .map(|s| s.as_str())
                .collect(),
            Some(from) => vec![from.as_str()],
        }
    }
}

/// Whether an event of a payment matches its row (of `kind`, in `status`)
/// whatever its amount and currency: a failure moves no money, so until a
/// success has settled the payment a success is taken at its own amount (the
/// row takes it), and a failure answers by the row's status (`stale` after a
/// success, `duplicate` after a failure; an unsettled row takes it). A
/// success at another amount than a settled success is a mismatch, as is
/// every other difference (a refund's failure gives back the refund's
/// amount, so it must match).
pub fn payment_event_matches(kind: ObjectKind, status: Status, event: EventKind) -> bool {
    kind == ObjectKind::Payment
        && match event {
            EventKind::PaymentSucceeded => status != Status::Succeeded,
            EventKind::PaymentFailed => true,
            _ => false,
        }
}

/// Whether a refund its PSP may have meant as a cancel (Adyen's
/// `CANCEL_OR_REFUND`, which says which only in a field it does not sign)
/// was a cancel, which moves nothing: so when its payment is recorded
/// `failed`; otherwise it is the refund, booked (or waiting for its
/// payment) as every refund is. Decided when it is booked, by its payment's
/// row (`kind`, `status`) as it stands then.
pub fn cancelled(payment_kind: ObjectKind, payment_status: Status) -> bool {
    payment_kind == ObjectKind::Payment && payment_status == Status::Failed
}

/// What an event does to its row (see the table in the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The row already says this: nothing to do.
    Duplicate,
    /// The event is older than the row's state: nothing changes.
    Stale,
    /// It must wait for another event first (a reinstatement for its withdrawal).
    Await,
    Apply(Transition),
}

/// The lifecycle rule: what `event` does to a row whose status is `current`.
pub fn decide(event: EventKind, current: Option<Status>) -> Decision {
    use EventKind::*;
    use Status::*;
    let settled = current.filter(|s| s.is_settled());
    let first = |to, effect| {
        Decision::Apply(Transition {
            from: None,
            to,
            effect,
        })
    };
    let from = |from, to, effect| {
        Decision::Apply(Transition {
            from: Some(from),
            to,
            effect,
        })
    };
    match (event, settled) {
        (PaymentSucceeded, None) => first(Succeeded, Some(Effect::Credit)),
        (PaymentSucceeded, Some(Failed)) => from(Failed, Succeeded, Some(Effect::Credit)),
        (PaymentSucceeded, Some(_)) => Decision::Duplicate,
        (PaymentFailed, None) => first(Failed, None),
        (PaymentFailed, Some(Succeeded)) => Decision::Stale,
        (PaymentFailed, Some(_)) => Decision::Duplicate,
        (RefundSucceeded, None) => first(Succeeded, Some(Effect::Debit)),
        (RefundSucceeded, Some(Succeeded)) => Decision::Duplicate,
        (RefundSucceeded, Some(_)) => Decision::Stale,
        (RefundFailed, None) => first(Failed, None),
        (RefundFailed, Some(Succeeded)) => from(Succeeded, Failed, Some(Effect::RefundReversal)),
        (RefundFailed, Some(_)) => Decision::Duplicate,
        (DisputeFundsWithdrawn, None) => first(Succeeded, Some(Effect::Dispute)),
        (DisputeFundsWithdrawn, Some(Succeeded)) => Decision::Duplicate,
        (DisputeFundsWithdrawn, Some(_)) => Decision::Stale,
        (DisputeFundsReinstated, None) => Decision::Await,
        (DisputeFundsReinstated, Some(Succeeded)) => {
            from(Succeeded, Failed, Some(Effect::DisputeReversal))
        }
        (DisputeFundsReinstated, Some(_)) => Decision::Duplicate,
    }
}

/// Why a refund or a dispute cannot take money from its payment (the
/// `reason` of a `refund_rejected` answer, and of the metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rejection {
    /// The payment failed: nothing came in to give back.
    PaymentFailed,
    /// Another currency than the payment's.
    CurrencyMismatch,
    /// With the refunds already booked, more would be refunded than came in.
    ExceedsPayment,
    /// The parent id names a refund or a dispute, not a payment.
    NotAPayment,
}

impl Rejection {
    pub const ALL: &'static [Rejection] = &[
        Rejection::PaymentFailed,
        Rejection::CurrencyMismatch,
        Rejection::ExceedsPayment,
        Rejection::NotAPayment,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::PaymentFailed => "payment_failed",
            Rejection::CurrencyMismatch => "currency_mismatch",
            Rejection::ExceedsPayment => "exceeds_payment",
            Rejection::NotAPayment => "not_a_payment",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payment() -> CanonicalEvent {
        CanonicalEvent {
            provider: "generic".into(),
            transaction_id: "tx_1".into(),
            event_type: EventKind::PaymentSucceeded,
            amount_minor: 1000,
            currency: "EUR".into(),
            parent_transaction_id: None,
            occurred_at: None,
            merchant_reference: None,
            metadata: None,
        }
    }

    #[test]
    fn the_fingerprint_is_what_the_object_is_not_its_state_or_envelope() {
        let e = payment();
        let mut later = e.clone();
        later.occurred_at = Some(OffsetDateTime::UNIX_EPOCH);
        assert_eq!(e.fingerprint(), later.fingerprint());
        let mut failed = e.clone();
        failed.event_type = EventKind::PaymentFailed;
        assert_eq!(
            e.fingerprint(),
            failed.fingerprint(),
            "same payment, other state"
        );
        let mut other = e.clone();
        other.amount_minor = 1001;
        assert_ne!(e.fingerprint(), other.fingerprint());
        let mut refund = e.clone();
        refund.event_type = EventKind::RefundSucceeded;
        refund.parent_transaction_id = Some("tx_0".into());
        assert_ne!(e.fingerprint(), refund.fingerprint(), "another kind");
        let mut moved = refund.clone();
        moved.parent_transaction_id = Some("tx_2".into());
        assert_ne!(refund.fingerprint(), moved.fingerprint(), "another parent");
    }

    #[test]
    fn a_payment_no_success_settled_takes_a_success_at_any_amount_and_a_failure_always() {
        use EventKind::*;
        for &status in Status::ALL {
            assert_eq!(
                payment_event_matches(ObjectKind::Payment, status, PaymentSucceeded),
                status != Status::Succeeded,
                "{status:?}"
            );
            assert!(payment_event_matches(
                ObjectKind::Payment,
                status,
                PaymentFailed
            ));
            for kind in [ObjectKind::Refund, ObjectKind::Dispute] {
                for &event in EventKind::ALL {
                    assert!(
                        !payment_event_matches(kind, status, event),
                        "{kind:?} {event:?}"
                    );
                }
            }
            assert!(!payment_event_matches(
                ObjectKind::Payment,
                status,
                RefundFailed
            ));
        }
    }

    #[test]
    fn the_merchant_reference_and_metadata_are_not_part_of_the_fingerprint() {
        let e = payment();
        let mut resent = e.clone();
        resent.merchant_reference = Some("order-42".into());
        resent.metadata = Some(serde_json::json!({"order_id": "42", "email": "a@example.com"}));
        assert_eq!(e.fingerprint(), resent.fingerprint());
        let mut other = resent.clone();
        other.merchant_reference = Some("order-43".into());
        other.metadata = Some(serde_json::json!({}));
        assert_eq!(resent.fingerprint(), other.fingerprint());
    }

    #[test]
    fn the_merchant_side_round_trips_and_an_event_stored_without_it_still_reads() {
        let mut e = payment();
        let plain = serde_json::to_value(&e).unwrap();
        assert_eq!(plain["merchant_reference"], serde_json::Value::Null);
        assert!(plain.get("metadata").is_none(), "{plain}");
        e.merchant_reference = Some("order-42".into());
        e.metadata = Some(serde_json::json!({"order_id": "42"}));
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<CanonicalEvent>(&text).unwrap(), e);
        let mut before = plain;
        let obj = before.as_object_mut().unwrap();
        obj.remove("merchant_reference");
        assert_eq!(
            serde_json::from_value::<CanonicalEvent>(before).unwrap(),
            payment()
        );
    }

    #[test]
    fn every_status_and_kind_round_trips_through_its_name() {
        for &s in Status::ALL {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        for &k in EventKind::ALL {
            assert_eq!(EventKind::from_generic(k.as_str()), Some(k));
            assert_eq!(ObjectKind::parse(k.object().as_str()), Some(k.object()));
        }
        assert_eq!(Status::parse("done"), None);
    }

    #[test]
    fn a_failed_payment_can_still_succeed_but_a_success_is_final() {
        use EventKind::*;
        let s = Some(Status::Succeeded);
        let f = Some(Status::Failed);
        assert!(matches!(
            decide(PaymentSucceeded, f),
            Decision::Apply(Transition {
                from: Some(Status::Failed),
                to: Status::Succeeded,
                effect: Some(Effect::Credit)
            })
        ));
        assert_eq!(decide(PaymentFailed, s), Decision::Stale);
        assert_eq!(decide(PaymentSucceeded, s), Decision::Duplicate);
        assert_eq!(decide(RefundSucceeded, f), Decision::Stale);
        assert_eq!(decide(DisputeFundsReinstated, None), Decision::Await);
        assert_eq!(
            decide(DisputeFundsReinstated, Some(Status::Processing)),
            Decision::Await,
            "a claim in progress has booked nothing yet"
        );
    }

    #[test]
    fn every_event_applied_twice_is_a_duplicate_and_reversals_give_back_what_was_taken() {
        for &event in EventKind::ALL {
            let mut status = None;
            let mut booked = Vec::new();
            // Apply until the event is settled, at most twice.
            for _ in 0..3 {
                match decide(event, status) {
                    Decision::Apply(t) => {
                        status = Some(t.to);
                        booked.extend(t.effect);
                    }
                    Decision::Await => {
                        // The withdrawal it waits for.
                        status = Some(Status::Succeeded);
                        booked.push(Effect::Dispute);
                    }
                    Decision::Duplicate | Decision::Stale => break,
                }
            }
            assert_eq!(decide(event, status), Decision::Duplicate, "{event:?}");
            let out: i64 = booked.iter().map(|e| e.parent_delta()).sum();
            assert!(out >= 0, "{event:?}: never gives back more than it took");
        }
    }
}
