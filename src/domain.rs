//! The domain: what a payment event *is*, whatever provider reported it, and
//! the states its row moves through. Nothing here knows about HTTP, Redis,
//! SQL or any provider's wire format; every other room depends on this one.

use serde::Serialize;
use time::OffsetDateTime;

/// What the payment did, after mapping a provider's own event names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventKind {
    /// Money in: one credit ledger entry.
    #[serde(rename = "payment.succeeded")]
    PaymentSucceeded,
    /// Recorded as `failed`, no ledger entry.
    #[serde(rename = "payment.failed")]
    PaymentFailed,
    /// Money out, keyed by the refund's own id: one debit entry.
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::PaymentSucceeded => "payment.succeeded",
            EventKind::PaymentFailed => "payment.failed",
            EventKind::RefundSucceeded => "refund.succeeded",
        }
    }

    /// The kind a generic payload's `event_type` names; `None` for types
    /// fencehook does not act on.
    pub fn from_generic(s: &str) -> Option<EventKind> {
        match s {
            "payment.succeeded" => Some(EventKind::PaymentSucceeded),
            "payment.failed" => Some(EventKind::PaymentFailed),
            "refund.succeeded" => Some(EventKind::RefundSucceeded),
            _ => None,
        }
    }
}

/// The one shape every provider's payload is mapped to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CanonicalEvent {
    pub provider: String,
    pub transaction_id: String,
    pub event_type: EventKind,
    pub amount_minor: i64,
    pub currency: String,
    #[serde(with = "time::serde::rfc3339::option")]
    pub occurred_at: Option<OffsetDateTime>,
}

impl CanonicalEvent {
    /// Fingerprint of what the payment *means*: the same transaction delivered
    /// again maps to the same value; another amount, currency or kind does not.
    /// Delivery metadata (event id, timestamps) is left out on purpose so that
    /// a PSP's re-send with a new envelope is still a duplicate.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for part in [
            "v1",
            &self.provider,
            &self.transaction_id,
            self.event_type.as_str(),
            &self.amount_minor.to_string(),
            &self.currency,
        ] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        hex::encode(h.finalize())
    }
}

/// Where a payments row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Processing,
    Succeeded,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Processing => "processing",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "processing" => Some(Status::Processing),
            "succeeded" => Some(Status::Succeeded),
            "failed" => Some(Status::Failed),
            _ => None,
        }
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, Status::Processing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_ignores_delivery_metadata_but_not_money() {
        let e = CanonicalEvent {
            provider: "generic".into(),
            transaction_id: "tx_1".into(),
            event_type: EventKind::PaymentSucceeded,
            amount_minor: 1000,
            currency: "EUR".into(),
            occurred_at: None,
        };
        let mut later = e.clone();
        later.occurred_at = Some(OffsetDateTime::UNIX_EPOCH);
        assert_eq!(e.fingerprint(), later.fingerprint());
        let mut other = e.clone();
        other.amount_minor = 1001;
        assert_ne!(e.fingerprint(), other.fingerprint());
    }

    #[test]
    fn every_status_round_trips_through_its_name() {
        for s in [Status::Processing, Status::Succeeded, Status::Failed] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("done"), None);
    }
}
