//! What a scheme is: the one trait every PSP's scheme implements
//! ([`Scheme`]), and what it produces ([`Item`], [`Reject`], [`AckBody`]).
//!
//! A scheme owns everything about its PSP, in its own file: the settings it
//! takes and how a provider of it is built from them, how a delivery is
//! verified and mapped to canonical events, what the PSP expects as the
//! answer's body, and, for the tools that play the PSP (`fencehook send`,
//! `load`), the other direction: a canonical event built into the PSP's body
//! and signed as the PSP signs it. The parser and its inverse sit side by
//! side, so each scheme's round-trip property test (canonical → PSP body and
//! signature → verify and map → the same canonical) checks them together.
//!
//! The registry in `providers/mod.rs` lists the schemes once; everything that
//! differs between schemes is reached through this trait from there
//! ([`Spec`] for what needs no configured provider), never by a `match` on
//! the scheme elsewhere.

use std::future::Future;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::json;
use time::OffsetDateTime;

use super::fetch::{ApiError, Fetcher};
use super::psp::{Credentials, Delivery, Key, Notice, PspError};
use super::setup::Setup;
use crate::domain::{CanonicalEvent, EventKind};

/// One PSP's scheme: a provider of it, configured, is a value of the type.
///
/// Constants and associated functions describe the scheme itself (the
/// registry reads them as a [`Spec`]); methods are a configured provider's
/// verification. The defaults are what most schemes do: JSON bodies,
/// fencehook's own answer body, one event per delivery, no id of the PSP's.
pub trait Scheme: Clone + Send + Sync + Sized + 'static {
    /// `scheme = "…"` in the providers file.
    const NAME: &'static str;
    /// Its `[providers.<name>]` table, as written: the struct's fields are
    /// the settings it takes (the required ones first, each an `Option`
    /// that [`Scheme::build`] requires, so that its message says what the
    /// setting is); any other key is refused, naming them. Values are
    /// checked by type as the table is read; shared kinds of values have
    /// types of their own (`settings::Secrets`, `settings::Tolerance`).
    type Settings: DeserializeOwned;
    /// The header a delivery's signature is read from; `None` when the
    /// scheme signs inside the body. Checked before a body is invited
    /// (`Expect: 100-continue`).
    const SIGNATURE_HEADER: Option<&'static str>;
    /// Whether one delivery carries several independent items (a batch): an
    /// item that cannot be booked is then recorded and the batch
    /// acknowledged, rather than the whole delivery refused.
    const BATCH: bool = false;

    /// Why `setting`, which it does not take, is refused, when "not a
    /// setting of scheme …" would not say enough.
    fn not_taken(_setting: &str) -> Option<&'static str> {
        None
    }

    /// A provider of this scheme from its table. Errors and warnings name
    /// the provider and the field; key files are read, secrets checked
    /// against the published ones and values offered to the tools through
    /// [`Setup`].
    fn build(settings: Self::Settings, setup: &mut Setup) -> Result<Self, String>;

    /// What is wrong with one of its `secrets` for being shorter than the
    /// PSP issues (`"24 bytes, shorter than …"`), if anything.
    fn short_secret(_secret: &str) -> Option<String> {
        None
    }

    /// The key one of its `secrets` signs with, when it decodes (the
    /// secret's own bytes unless the scheme decodes it): published secrets
    /// are compared by it, so another spelling of a published key that the
    /// scheme reads as the same key (hex in lower case, another base64
    /// padding) is refused as the published one is.
    fn key_bytes(secret: &str) -> Option<Vec<u8>> {
        Some(secret.as_bytes().to_vec())
    }

    /// Whether a delivery's `Content-Type` (its essence, lower case, without
    /// parameters) is what the PSP posts: JSON unless the scheme says otherwise.
    fn accepts_content_type(essence: &str) -> bool {
        essence == "application/json"
            || (essence.starts_with("application/") && essence.ends_with("+json"))
    }

    /// The PSP's own id of a delivery, where it has one: kept beside inbox
    /// events for searching, never used to deduplicate.
    fn psp_event_id(_headers: &http::HeaderMap, _body: &[u8]) -> Option<String> {
        None
    }

    /// The body of an answer with this `result` (and `reason`, for a 400):
    /// `success` is true for a 2xx. fencehook's own JSON unless the PSP reads
    /// the body.
    fn ack_body(_success: bool, result: &str, reason: Option<&str>) -> AckBody {
        AckBody::fencehook(result, reason)
    }

    /// Verifies the delivery and maps every item of it; `now` is unix
    /// seconds. A scheme verifies every item before it maps any. Ready on
    /// its first poll unless the scheme has to fetch something to verify.
    fn accept(
        &self,
        provider: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> impl Future<Output = Result<Vec<Item>, Reject>> + Send;

    /// A verified delivery's transmission id, to be bound to its body (for a
    /// scheme whose signature does not cover the body well: PayPal's).
    fn transmission(&self, _headers: &http::HeaderMap, _body: &[u8]) -> Option<TransmissionKey> {
        None
    }

    /// Whether each mapped event is confirmed with the PSP's API before it
    /// is booked.
    fn confirms(&self) -> bool {
        false
    }

    /// Confirms what `body` mapped to with the PSP's API, when
    /// [`Scheme::confirms`].
    fn confirm(
        &self,
        _provider: &str,
        _body: &[u8],
        _item: &Item,
    ) -> impl Future<Output = Result<(), Reject>> + Send {
        async { Ok(()) }
    }

    /// Whether a provider of the scheme can list its PSP's events (the
    /// reconciliation reads them): most PSPs have no events API.
    fn events_api(&self) -> EventsApi {
        EventsApi::None
    }

    /// The fetcher a provider of it fetches from its PSP's API with while a
    /// delivery waits, when it has one: the service counts its fetches.
    fn fetcher(&self) -> Option<&Fetcher> {
        None
    }

    /// Every event the PSP's API lists in `window` that the mapping may
    /// book, oldest first. Only called when [`Scheme::events_api`] is
    /// [`EventsApi::Ready`].
    fn list_events(
        &self,
        _window: Window,
    ) -> impl Future<Output = Result<Vec<Listed>, ApiError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// A listed event mapped as a delivery of it would be (the same
    /// mapping, without the signature: the PSP's API said it).
    fn map_listed(&self, _provider: &str, _listed: &Listed) -> Result<Vec<Item>, Reject> {
        Err(Reject::Invalid("no events API".into()))
    }

    /// Puts a certificate in the provider's cache as if fetched from `url`;
    /// `None` for a scheme that fetches none.
    #[cfg(any(test, feature = "test-support"))]
    fn preload_certificate(&self, _url: &str, _pem: &[u8]) -> Option<Result<(), String>> {
        None
    }

    // The PSP side, for the tools that play the PSP.

    /// The currency its deliveries are in when none is asked for.
    const CURRENCY: &'static str = "EUR";
    /// The canonical kinds the PSP has a notification for.
    const SENDS: &'static [EventKind] = EventKind::ALL;
    /// What starts a delivery's own id (a webhook id, an event id), when the
    /// tools make one up.
    const DELIVERY_ID_PREFIX: &'static str = "";
    /// How a refund or dispute names its payment, for messages: `None` when
    /// the scheme's body need not name it.
    const PAYMENT_ID: Option<&'static str> = None;
    /// What its PSP side asks the tools for by name, besides the private
    /// key of the RSA schemes ([`Credentials::key`]).
    const KEYS: &'static [Key] = &[];

    /// Checks that what it signs a built delivery with is there and usable,
    /// so a run can refuse to start rather than fail every delivery.
    fn check(psp: &dyn Credentials) -> Result<(), PspError>;

    /// The delivery of `notice`, shaped and signed as the PSP does at unix
    /// time `ts`. `body` replaces the built body (signed as the scheme signs
    /// a body of its own); `delivery_id` is the delivery's own id where the
    /// scheme has one.
    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String>;
}

/// What a scheme is before any provider of it is configured: its
/// [`Scheme`]'s constants and associated functions, as one table the
/// registry hands out ([`SchemeKind::spec`](super::SchemeKind::spec)).
#[derive(Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    pub signature_header: Option<&'static str>,
    pub batch: bool,
    pub currency: &'static str,
    pub sends: &'static [EventKind],
    pub delivery_id_prefix: &'static str,
    pub payment_id: Option<&'static str>,
    pub keys: &'static [Key],
    short_secret_fn: fn(&str) -> Option<String>,
    key_bytes_fn: fn(&str) -> Option<Vec<u8>>,
    accepts_content_type_fn: fn(&str) -> bool,
    psp_event_id_fn: fn(&http::HeaderMap, &[u8]) -> Option<String>,
    ack_body_fn: fn(bool, &str, Option<&str>) -> AckBody,
    check_fn: fn(&dyn Credentials) -> Result<(), PspError>,
    deliver_fn: DeliverFn,
}

/// [`Scheme::deliver`] as a function pointer.
type DeliverFn = fn(&dyn Credentials, &Notice, Option<&str>, &str, i64) -> Result<Delivery, String>;

impl Spec {
    /// The table of scheme `S`.
    pub const fn of<S: Scheme>() -> Spec {
        Spec {
            name: S::NAME,
            signature_header: S::SIGNATURE_HEADER,
            batch: S::BATCH,
            currency: S::CURRENCY,
            sends: S::SENDS,
            delivery_id_prefix: S::DELIVERY_ID_PREFIX,
            payment_id: S::PAYMENT_ID,
            keys: S::KEYS,
            short_secret_fn: S::short_secret,
            key_bytes_fn: S::key_bytes,
            accepts_content_type_fn: S::accepts_content_type,
            psp_event_id_fn: S::psp_event_id,
            ack_body_fn: S::ack_body,
            check_fn: S::check,
            deliver_fn: S::deliver,
        }
    }

    /// See [`Scheme::short_secret`].
    pub fn short_secret(&self, secret: &str) -> Option<String> {
        (self.short_secret_fn)(secret)
    }

    /// See [`Scheme::key_bytes`].
    pub fn key_bytes(&self, secret: &str) -> Option<Vec<u8>> {
        (self.key_bytes_fn)(secret)
    }

    /// See [`Scheme::accepts_content_type`].
    pub fn accepts_content_type(&self, essence: &str) -> bool {
        (self.accepts_content_type_fn)(essence)
    }

    /// See [`Scheme::psp_event_id`].
    pub fn psp_event_id(&self, headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
        (self.psp_event_id_fn)(headers, body)
    }

    /// See [`Scheme::ack_body`].
    pub fn ack_body(&self, success: bool, result: &str, reason: Option<&str>) -> AckBody {
        (self.ack_body_fn)(success, result, reason)
    }

    /// Whether the PSP has a notification for `kind`.
    pub fn sends(&self, kind: EventKind) -> bool {
        self.sends.contains(&kind)
    }

    /// See [`Scheme::check`].
    pub fn check(&self, psp: &dyn Credentials) -> Result<(), PspError> {
        (self.check_fn)(psp)
    }

    /// See [`Scheme::deliver`].
    pub fn deliver(
        &self,
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        (self.deliver_fn)(psp, notice, body, delivery_id, ts)
    }
}

/// What a provider offers the reconciliation ([`Scheme::events_api`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsApi {
    /// The PSP has no API that lists past events.
    None,
    /// It has one; the provider has no credentials for it.
    NoCredentials,
    /// It has one, and the provider has credentials.
    Ready,
}

impl EventsApi {
    /// How `check-config` and `reconcile` say it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventsApi::None => "no events API",
            EventsApi::NoCredentials => "no API credentials",
            EventsApi::Ready => "can reconcile",
        }
    }
}

/// A time window of the PSP's events, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub since: OffsetDateTime,
    pub until: OffsetDateTime,
}

/// One event as a PSP's API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The PSP's event id (Stripe's `evt_…`, PayPal's `WH-…`): what makes
    /// it and a webhook of it one event.
    pub id: String,
    /// When the PSP created it.
    pub created: OffsetDateTime,
    /// The event's JSON, as a webhook of it carries it.
    pub body: Bytes,
}

/// A verified item of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Event(CanonicalEvent),
    /// A well-signed item of a batch that cannot be mapped (a lower-case
    /// currency, a missing field): never booked, recorded with its reason,
    /// and it does not hold up the other items of its delivery. Only batch
    /// schemes produce it; a single-item delivery that cannot be mapped is
    /// refused whole ([`Reject::Invalid`]).
    Unmappable {
        reason: String,
        /// What identifies the item whatever is changed around it: the
        /// fields its signature covers. Quarantined once per key, so a
        /// captured item re-sent with altered unsigned fields is one row.
        key: String,
        /// The item's id, when it could be read.
        transaction_id: Option<String>,
        /// The item as received (JSON), for the operator.
        raw: String,
    },
    /// Adyen's `CANCEL_OR_REFUND`: the refund (`refund.succeeded`, the signed
    /// amount) when its payment is booked here as `succeeded`, a cancel that
    /// moves nothing when the payment is recorded `failed`, and, when neither
    /// is known yet, a refund waiting for its payment. Which it was is only
    /// said by an unsigned field, so the ledger decides (`adyen`'s docs).
    CancelOrRefund(CanonicalEvent),
    /// A well-signed event fencehook does not act on: a type it does not
    /// book, or a state that moves no money (a pending refund, an uncaptured
    /// charge, a zero-value authorisation). Answered 200, nothing written.
    Ignored {
        event_type: String,
    },
}

impl Item {
    /// The canonical event the item carries, whatever the fenced path then
    /// decides it is (an Adyen `CANCEL_OR_REFUND` is one); `None` for an item
    /// that never reaches it.
    pub fn event(&self) -> Option<&CanonicalEvent> {
        match self {
            Item::Event(ev) | Item::CancelOrRefund(ev) => Some(ev),
            Item::Ignored { .. } | Item::Unmappable { .. } => None,
        }
    }
}

/// Why a delivery was refused before anything was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// 401: signature missing or wrong, timestamp outside tolerance.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// 400: the payload is not what the scheme promises.
    #[error("invalid payload: {0}")]
    Invalid(String),
    /// 503: what verification needs could not be had now (PayPal's
    /// certificate did not download); the PSP should retry.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// The body of an answer, in the shape the provider's PSP expects.
#[derive(Debug, Clone, PartialEq)]
pub enum AckBody {
    /// fencehook's own `{"result": …, "reason": …}`.
    Json(serde_json::Value),
    /// A fixed text some PSPs require (Adyen's `[accepted]`, Alipay's `success`).
    Text(&'static str),
    /// No body at all (WeChat Pay's success).
    Empty,
}

impl AckBody {
    /// fencehook's own body: `{"result": …}`, with `reason` when there is one.
    pub fn fencehook(result: &str, reason: Option<&str>) -> AckBody {
        AckBody::Json(match reason {
            Some(reason) => json!({ "result": result, "reason": reason }),
            None => json!({ "result": result }),
        })
    }
}

/// A verified delivery's transmission id and the SHA-256 (hex) of its body,
/// to be bound for as long as its transmission time is inside the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransmissionKey {
    pub id: String,
    pub body_sha256: String,
    pub expires_at: OffsetDateTime,
}
