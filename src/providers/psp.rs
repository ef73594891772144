//! The PSP's side of the schemes: what a delivery is built from and what it
//! is signed with, for the tools that play a PSP (`fencehook send`, `load`).
//! Each scheme builds its PSP's body next to the parser that reads it back
//! (`Scheme::deliver`); this module holds
//! what they share.
//!
//! Each canonical kind is sent as the native event the provider maps back to
//! it (see docs/providers.md): refunds and disputes name their payment the
//! way the PSP does (a Stripe Refund's `payment_intent`, an Adyen item's
//! `originalReference`, a WeChat refund's `transaction_id`, an Alipay
//! refund's `trade_no`, a PayPal refund's `up` link). A PSP that has no
//! notification for a kind (WeChat Pay sends no payment failure, PayPal no
//! refund failure, ...) refuses to build one, naming what it does send.
//!
//! Nothing here signs by itself: the keys come from the tools
//! ([`Credentials`]), which read them from flags and the providers file;
//! a scheme asks for each by name ([`Key`]).

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::keys::RsaSigner;
use super::SchemeKind;
use crate::domain::EventKind;

/// What one delivery announces: `send`'s flags, or one transaction of `load`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The id of what the event is about: the payment's, the refund's or the
    /// dispute's own.
    pub transaction_id: String,
    /// Minor units (cents, fen).
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// A canonical kind (`payment.succeeded`, ...), sent as the scheme's
    /// native event; anything else is sent verbatim as the native type.
    pub event_type: String,
    /// Refunds and disputes: the payment they take money from.
    pub payment_transaction_id: Option<String>,
}

/// One signed delivery: the body, its content type and the other headers.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
    pub content_type: &'static str,
}

/// The content type of every scheme's deliveries but Alipay's.
pub const JSON: &str = "application/json";

impl Delivery {
    /// A JSON delivery of `body` with these (signature) headers.
    pub(crate) fn json(body: String, headers: Vec<(&'static str, String)>) -> Delivery {
        Delivery {
            body,
            content_type: JSON,
            headers,
        }
    }
}

/// The body of a JSON delivery: the one asked for (`send --body`), else the
/// PSP's event the scheme `builds`.
pub(crate) fn body_or(
    asked: Option<&str>,
    builds: impl FnOnce() -> Result<serde_json::Value, String>,
) -> Result<String, String> {
    match asked {
        Some(body) => Ok(body.to_owned()),
        None => Ok(builds()?.to_string()),
    }
}

/// A value a scheme's PSP side signs or shapes deliveries with, which the
/// tools are asked for by name: the flag of `send` and `load` that gives it
/// (without `--`), what it is, and whether a provider of the providers file
/// can give it (the scheme offers it while it is built,
/// [`Setup::offer`](super::setup::Setup::offer)). Each scheme declares
/// its own ([`Scheme::KEYS`](super::Scheme::KEYS)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub flag: &'static str,
    pub what: &'static str,
    pub in_file: bool,
}

/// The HMAC schemes' signing secret: the first of a provider's secrets.
pub const SECRET: Key = Key {
    flag: "secret",
    what: "a signing secret",
    in_file: true,
};

/// What a PSP signs (and encrypts) with, as the tools gathered it from their
/// flags and the providers file.
pub trait Credentials {
    /// The value of `key`, or the error naming its flag.
    fn key(&self, key: &Key) -> Result<&str, PspError>;
    /// The RSA schemes' private key.
    fn signer(&self) -> Result<&RsaSigner, PspError>;
}

/// A flag that cannot be used, or one a scheme needs and did not get: one
/// line naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {reason}")]
pub struct PspError {
    /// The flag's long name, without `--`.
    pub flag: &'static str,
    pub reason: String,
}

impl PspError {
    pub fn new(flag: &'static str, reason: impl Into<String>) -> PspError {
        PspError {
            flag,
            reason: reason.into(),
        }
    }
}

impl From<PspError> for String {
    fn from(e: PspError) -> String {
        e.to_string()
    }
}

/// The canonical kinds that take money from a payment and must name it.
pub fn names_a_payment(event_type: &str) -> bool {
    event_type.starts_with("refund.") || event_type.starts_with("dispute.")
}

/// The `--payment-transaction-id` a refund or dispute needs to be built in a
/// PSP's shape; the message says what each scheme names a payment by.
pub(crate) fn parent(notice: &Notice) -> Result<&str, String> {
    notice.payment_transaction_id.as_deref().ok_or_else(|| {
        let by: Vec<String> = SchemeKind::ALL
            .iter()
            .filter_map(|k| Some(format!("{} for {}", k.spec().payment_id?, k.as_str())))
            .collect();
        format!(
            "--event-type {} takes money from a payment: give it with --payment-transaction-id ({})",
            notice.event_type,
            by.join(", ")
        )
    })
}

/// `--event-type` names a kind `scheme` has no notification for; it `sends`
/// these.
pub(crate) fn not_sent(scheme: &str, sends: &[EventKind], notice: &Notice) -> String {
    let sends: Vec<&str> = sends.iter().map(|k| k.as_str()).collect();
    format!(
        "{scheme} sends no notification fencehook books as {}; it sends {}",
        notice.event_type,
        sends.join(", ")
    )
}

/// Unix seconds as RFC 3339, at `offset` hours from UTC.
pub(crate) fn rfc3339(ts: i64, offset_hours: i8) -> Result<String, String> {
    let offset = time::UtcOffset::from_hms(offset_hours, 0, 0).map_err(|e| e.to_string())?;
    OffsetDateTime::from_unix_timestamp(ts)
        .map_err(|e| e.to_string())?
        .to_offset(offset)
        .format(&Rfc3339)
        .map_err(|e| e.to_string())
}
