//! Stripe (`stripe` scheme): the `Stripe-Signature` header and Stripe events.
//!
//! # Signature
//!
//! `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`, each `v1` an
//! HMAC-SHA256 over `{t}.{raw body}` keyed with the endpoint secret's own bytes
//! (`whsec_...` is used as-is, not decoded). Other schemes (`v0`) are ignored;
//! a header without `t`, without a `v1`, or with a piece that is not
//! `key=value` is refused. Any configured secret may verify (rotation: Stripe
//! signs with every secret that is live during a roll). Comparison is
//! constant-time (`Mac::verify_slice`); `t` must be within the tolerance of now,
//! on either side.
//!
//! # Mapping (what is booked)
//!
//! A payment is keyed by its PaymentIntent id (a Charge without one: by its
//! own id), never by the event id: a payment announced by both
//! `payment_intent.succeeded` and `charge.succeeded` is one transaction with
//! one fingerprint, so the second is a `duplicate`. A refund is keyed by the
//! Refund id and a dispute by the Dispute id; both name the payment they take
//! money from (`parent_transaction_id`), which must be that payment's key.
//!
//! | event | booked as | transaction_id | parent | amount |
//! | --- | --- | --- | --- | --- |
//! | `payment_intent.succeeded` | payment.succeeded (credit) | PaymentIntent `id` | – | `amount_received`, else `amount`; before API 2025-03-31.basil the larger of the two |
//! | `payment_intent.payment_failed` | payment.failed | PaymentIntent `id` | – | `amount` |
//! | `charge.succeeded` (`captured: true`) | payment.succeeded (credit) | the Charge's `payment_intent`, else the Charge `id` | – | `amount_captured`, else `amount`; before basil the larger of the two |
//! | `charge.failed` | payment.failed | the Charge's `payment_intent`, else the Charge `id` | – | `amount` |
//! | `refund.created`, `refund.updated`, `charge.refund.updated` | `status` `succeeded` → refund.succeeded (debit); `failed`, `canceled` → refund.failed; other statuses ignored | Refund `id` | Refund `payment_intent`, else its `charge` | Refund `amount` |
//! | `refund.failed` | refund.failed | Refund `id` | as above | Refund `amount` |
//! | `charge.refunded` | one refund.succeeded per `succeeded` Refund in `refunds.data` | each Refund's `id` | the Refund's `payment_intent`, else the Charge's, else the Charge `id` | each Refund's `amount` |
//! | `charge.dispute.funds_withdrawn` | dispute.funds_withdrawn (dispute debit) | Dispute `id` | Dispute `payment_intent`, else its `charge` | Dispute `amount` |
//! | `charge.dispute.funds_reinstated` | dispute.funds_reinstated (dispute_reversal) | Dispute `id` | as above | Dispute `amount` |
//!
//! Every other type is ignored without looking further; among them
//! `charge.dispute.created`, `.updated` and `.closed`, which move no money
//! (the `funds_*` events do).
//!
//! Decisions worth knowing (docs/providers.md gives the sources):
//!
//! - A failure is keyed by the PaymentIntent, like its success: the lifecycle
//!   books failed → succeeded, so a PaymentIntent whose first attempt was
//!   declined is still credited when a later attempt succeeds, and a failure
//!   arriving after the success is `stale`. Until a success settles the
//!   payment, the success's amount stands (a failure moves no money).
//! - Capture reversals, on both sides of API version 2025-03-31.basil.
//!   Before it, Stripe booked a manual capture of less than was authorised
//!   as a capture of the whole authorisation plus a Refund of the rest, and
//!   the cancellation (or expiry) of an uncaptured payment as a Refund of
//!   all of it with no balance transaction. So before basil a success
//!   credits the authorised `amount` (when larger than what was received)
//!   and the remainder's Refund is booked as a refund, netting it to what was
//!   captured; a Refund with a null `balance_transaction`, or any refund of
//!   a Charge never captured, released an authorisation and is ignored. From
//!   basil on neither Refund exists: the success credits what was received.
//!   The event's `api_version` decides.
//! - `charge.succeeded` for an uncaptured charge (manual capture) is only an
//!   authorisation: ignored; `payment_intent.succeeded` books it on capture.
//! - `charge.refunded` is one delivery of as many items as its refund list
//!   holds succeeded refunds. Since API version 2022-11-15 the list is not in
//!   the event (and events cannot be expanded): it is then ignored, and the
//!   refunds are booked from `refund.*` events. Every route keys a refund by
//!   its id, so a refund seen through several events is booked once.
//! - Refunds `pending` or `requires_action` (or in a status this mapping does
//!   not know) are ignored: a later `refund.updated` settles them. `refund.failed`
//!   is a failure whatever the object's `status` says.
//! - A refund or dispute naming neither a PaymentIntent nor a Charge cannot be
//!   checked against a payment: the delivery is refused (400).
//! - Disputes book the principal (`amount`, `currency`); Stripe's dispute fee
//!   is not booked.
//! - Stripe's lower-case currency is upper-cased; amounts are taken as sent in
//!   the currency's minor unit (JPY has none, KWD has three decimals: Stripe
//!   already sends the integer it charges).
//! - A thin event (`"object": "v2.core.event"`, verified as every event) is
//!   not the record: its object is fetched with the provider's `api_key` and
//!   it is mapped as the snapshot event of its type (`stripe_thin`).

use std::sync::Arc;

use serde_json::Value;
use time::OffsetDateTime;

use super::fetch::{ApiError, Fetcher};
use super::fields::{
    self, amount_minor, check_currency, check_transaction_id, invalid, opt, req_object, req_str,
    Object,
};
use super::hmac;
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError, JSON};
use super::scheme::{EventsApi, Item, Listed, Reject, Scheme, Window};
use super::settings::{Secrets, Tolerance};
use super::setup::Setup;
use super::stripe_api::{Api, DEFAULT_API_URL};
use super::stripe_thin::{self, Snapshot, ThinEvents};
use crate::domain::{CanonicalEvent, EventKind};

/// The header Stripe signs with (HTTP header names are case-insensitive).
pub const SIGNATURE_HEADER: &str = "stripe-signature";

/// A Stripe endpoint secret is `whsec_` and at least this many characters.
const MIN_CHARS_AFTER_PREFIX: usize = 32;

#[derive(Clone)]
pub struct Stripe {
    secrets: Vec<Vec<u8>>,
    tolerance_secs: u64,
    /// Stripe's API, when the provider has an `api_key`.
    api: Option<Arc<Api>>,
    /// Thin events' objects, fetched with the `api_key` (`stripe_thin`).
    thin: Arc<ThinEvents>,
}

/// A `stripe` provider's table: the webhook endpoint's secrets and
/// timestamp window, and optionally the API's credentials (reconciliation
/// reads the account's events with them).
#[derive(serde::Deserialize)]
pub struct Settings {
    secrets: Option<Secrets>,
    tolerance_secs: Option<Tolerance>,
    /// A restricted key with Events read (or a secret key); never logged.
    api_key: Option<String>,
    /// Default [`DEFAULT_API_URL`]; tests point it at a mock.
    api_url: Option<String>,
}

impl Stripe {
    pub fn new(secrets: &[String], tolerance_secs: u64) -> Result<Stripe, String> {
        let secrets = secrets
            .iter()
            .map(|s| {
                check_secret(s)?;
                Ok(s.as_bytes().to_vec())
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Stripe {
            secrets,
            tolerance_secs,
            api: None,
            thin: Arc::new(ThinEvents::keyless()),
        })
    }

    /// Stripe's API with these credentials, when the provider has them.
    pub fn api(&self) -> Option<&Api> {
        self.api.as_deref()
    }

    pub fn verify(&self, headers: &http::HeaderMap, body: &[u8], now: i64) -> Result<(), Reject> {
        let header = headers
            .get(SIGNATURE_HEADER)
            .ok_or_else(|| Reject::Unauthorized("missing Stripe-Signature header".to_owned()))?
            .to_str()
            .map_err(|_| Reject::Unauthorized("Stripe-Signature is not ASCII".to_owned()))?;
        let sig = parse_signature_header(header)?;
        if now.abs_diff(sig.timestamp) > self.tolerance_secs {
            return Err(Reject::Unauthorized(
                "Stripe-Signature timestamp outside tolerance".to_owned(),
            ));
        }
        let message: [&[u8]; 3] = [sig.timestamp_text.as_bytes(), b".", body];
        if hmac::any_key_verifies(&self.secrets, &message, &sig.v1) {
            Ok(())
        } else {
            Err(Reject::Unauthorized("signature does not match".to_owned()))
        }
    }
}

impl Scheme for Stripe {
    const NAME: &'static str = "stripe";
    type Settings = Settings;
    const SIGNATURE_HEADER: Option<&'static str> = Some(SIGNATURE_HEADER);
    const DELIVERY_ID_PREFIX: &'static str = "evt_";
    const PAYMENT_ID: Option<&'static str> = Some("a PaymentIntent or Charge id");

    const KEYS: &'static [Key] = &[psp::SECRET];

    fn build(settings: Settings, setup: &mut Setup) -> Result<Stripe, String> {
        let webhook = hmac::TimedTable {
            secrets: settings.secrets,
            tolerance_secs: settings.tolerance_secs,
        };
        let (secrets, tolerance) = webhook.read(setup)?;
        let mut stripe = Stripe::new(&secrets, tolerance).map_err(|e| setup.error("secrets", e))?;
        match (settings.api_key, settings.api_url) {
            (None, None) => {}
            (None, Some(_)) => {
                return Err(setup.error("api_url", "only with api_key (Stripe's API needs a key)"))
            }
            (Some(key), url) => {
                let url = url.unwrap_or_else(|| DEFAULT_API_URL.to_owned());
                let api = Api::new(&key, &url).map_err(|e| setup.setting(e))?;
                setup.api_key("api_key", &key);
                if api.allows_plain_http() {
                    setup.warn("api_url is http://: Stripe's API reached without TLS (for a local test server only)");
                }
                let thin = ThinEvents::new(api.url(), api.authorization())
                    .map_err(|e| setup.error("api_url", e))?;
                stripe.thin = Arc::new(thin);
                stripe.api = Some(Arc::new(api));
            }
        }
        Ok(stripe)
    }

    fn short_secret(secret: &str) -> Option<String> {
        let rest = secret.strip_prefix("whsec_").unwrap_or(secret);
        (rest.len() < MIN_CHARS_AFTER_PREFIX).then(|| {
            format!(
                "whsec_ and {} characters, shorter than the {MIN_CHARS_AFTER_PREFIX} Stripe issues",
                rest.len()
            )
        })
    }

    fn events_api(&self) -> EventsApi {
        match self.api {
            Some(_) => EventsApi::Ready,
            None => EventsApi::NoCredentials,
        }
    }

    async fn list_events(&self, window: Window) -> Result<Vec<Listed>, ApiError> {
        match &self.api {
            Some(api) => api.events(window, BOOKED_TYPES).await,
            None => Ok(Vec::new()),
        }
    }

    fn map_listed(&self, provider: &str, listed: &Listed) -> Result<Vec<Item>, Reject> {
        parse_event(provider, &listed.body)
    }

    fn psp_event_id(_headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Envelope {
            id: String,
        }
        serde_json::from_slice::<Envelope>(body).ok().map(|e| e.id)
    }

    async fn accept(
        &self,
        provider: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.verify(headers, body, now)?;
        match stripe_thin::thin_event(body)? {
            None => parse_event(provider, body),
            // Boxed: the fetch's future is a few KB, and every delivery's
            // future (snapshot or not) would be as large.
            Some(thin) => match Box::pin(self.thin.snapshot(&thin, books)).await? {
                Snapshot::NotBooked(event_type) => Ok(vec![Item::Ignored { event_type }]),
                Snapshot::Event(snapshot) => parse_event(provider, &snapshot),
            },
        }
    }

    fn fetcher(&self) -> Option<&Fetcher> {
        self.thin.fetcher()
    }

    fn check(psp: &dyn Credentials) -> Result<(), PspError> {
        sign(psp.key(&psp::SECRET)?, 0, b"")
            .map(drop)
            .map_err(|e| PspError::new("secret", e))
    }

    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let body = match body {
            Some(b) => b.to_owned(),
            None => event_of(notice, delivery_id, ts)?.to_string(),
        };
        let signature = sign(psp.key(&psp::SECRET)?, ts, body.as_bytes())?;
        Ok(Delivery {
            body,
            content_type: JSON,
            headers: vec![(SIGNATURE_HEADER, signature)],
        })
    }
}

fn check_secret(secret: &str) -> Result<(), String> {
    match secret.strip_prefix("whsec_") {
        Some(rest) if !rest.is_empty() => Ok(()),
        _ => Err(
            "a stripe signing secret starts with whsec_ (the endpoint's signing secret, not an API key)"
                .to_owned(),
        ),
    }
}

/// A parsed `Stripe-Signature` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureHeader<'a> {
    /// `t` exactly as sent: it is part of the signed payload.
    pub timestamp_text: &'a str,
    pub timestamp: i64,
    /// Decoded `v1` signatures; entries that are not hex cannot match and are dropped.
    pub v1: Vec<Vec<u8>>,
}

/// Parses `t=<unix>,v1=<hex>[,v1=<hex>...]`. Unknown keys (`v0`) are ignored.
pub fn parse_signature_header(header: &str) -> Result<SignatureHeader<'_>, Reject> {
    let malformed = |why: &str| Reject::Unauthorized(format!("malformed Stripe-Signature: {why}"));
    let mut timestamp = None;
    let mut v1 = Vec::new();
    let mut saw_v1 = false;
    for piece in header.split(',') {
        let Some((key, value)) = piece.trim().split_once('=') else {
            return Err(malformed("every entry is key=value"));
        };
        match key {
            "t" => {
                if timestamp.is_some() {
                    return Err(malformed("more than one t"));
                }
                if value.is_empty()
                    || value.len() > 18
                    || !value.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(malformed("t is not a unix timestamp"));
                }
                let ts: i64 = value
                    .parse()
                    .map_err(|_| malformed("t is not a unix timestamp"))?;
                timestamp = Some((value, ts));
            }
            "v1" => {
                saw_v1 = true;
                if let Ok(sig) = hex::decode(value) {
                    v1.push(sig);
                }
            }
            _ => {}
        }
    }
    let Some((timestamp_text, timestamp)) = timestamp else {
        return Err(malformed("no t"));
    };
    if !saw_v1 {
        return Err(malformed("no v1 signature"));
    }
    Ok(SignatureHeader {
        timestamp_text,
        timestamp,
        v1,
    })
}

/// Signs like Stripe: the `Stripe-Signature` header value for `body` at `timestamp`.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> Result<String, String> {
    check_secret(secret)?;
    Ok(format!(
        "t={timestamp},v1={}",
        signature_hex(secret, timestamp, body)
    ))
}

/// The hex `v1` signature alone (for headers with several signatures).
pub fn signature_hex(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let prefix = format!("{timestamp}.");
    hex::encode(hmac::sign(secret.as_bytes(), &[prefix.as_bytes(), body]))
}

/// The object an event type of the mapping carries; `None` for a type it
/// does not book.
fn object_of(event_type: &str) -> Option<&'static str> {
    Some(match event_type {
        "payment_intent.succeeded" | "payment_intent.payment_failed" => "payment_intent",
        "charge.succeeded" | "charge.failed" | "charge.refunded" => "charge",
        "refund.created" | "refund.updated" | "refund.failed" | "charge.refund.updated" => "refund",
        "charge.dispute.funds_withdrawn" | "charge.dispute.funds_reinstated" => "dispute",
        _ => return None,
    })
}

/// Whether the mapping books events of `event_type` (a thin event of any
/// other type is ignored without a fetch).
pub fn books(event_type: &str) -> bool {
    object_of(event_type).is_some()
}

/// The event types the mapping books (every other type is ignored without
/// a look): what reconciliation asks Stripe's events API for (`types[]`).
pub const BOOKED_TYPES: &[&str] = &[
    "payment_intent.succeeded",
    "payment_intent.payment_failed",
    "charge.succeeded",
    "charge.failed",
    "charge.refunded",
    "refund.created",
    "refund.updated",
    "refund.failed",
    "charge.refund.updated",
    "charge.dispute.funds_withdrawn",
    "charge.dispute.funds_reinstated",
];

/// Maps a Stripe event (see the module docs) strictly: a handled type with a
/// missing or ill-typed field is [`Reject::Invalid`]; a type we do not act on
/// is one [`Item::Ignored`] without looking further. Most events map to one
/// item; a `charge.refunded` with its refund list maps to one per succeeded
/// refund.
pub fn parse_event(provider: &str, body: &[u8]) -> Result<Vec<Item>, Reject> {
    let value = fields::parse_json(body)?;
    let event = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object (a Stripe event)"))?;
    let event_type = req_str(event, "type", "type")?;
    let ignored = || {
        Ok(vec![Item::Ignored {
            event_type: event_type.to_owned(),
        }])
    };
    let Some(object_kind) = object_of(event_type) else {
        return ignored();
    };
    let occurred_at = match opt(event, "created") {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok())
                .ok_or_else(|| invalid("created must be a unix timestamp (integer)"))?,
        ),
    };
    let before_basil = before_basil(event)?;
    let data = req_object(event, "data", "data")?;
    let object = req_object(data, "object", "data.object")?;
    let declared = req_str(object, "object", "data.object.object")?;
    if declared != object_kind {
        return Err(invalid(format!(
            "data.object.object is `{declared}`, but a {event_type} event carries a {object_kind}"
        )));
    }
    const OBJECT: &str = "data.object";
    let mapped: Vec<Mapped> = match event_type {
        "payment_intent.succeeded" => vec![Mapped {
            kind: EventKind::PaymentSucceeded,
            transaction_id: req_str(object, "id", "data.object.id")?,
            parent: None,
            amount: credited(object, "amount_received", before_basil)?,
            currency: req_str(object, "currency", "data.object.currency")?,
            path: OBJECT,
        }],
        // Keyed like the success: a PaymentIntent may fail, then succeed.
        // The intended amount: amount_received is 0 on a failure.
        "payment_intent.payment_failed" => vec![Mapped {
            kind: EventKind::PaymentFailed,
            transaction_id: req_str(object, "id", "data.object.id")?,
            parent: None,
            amount: amount_minor(opt(object, "amount"), "data.object.amount")?,
            currency: req_str(object, "currency", "data.object.currency")?,
            path: OBJECT,
        }],
        "charge.succeeded" => {
            let captured = match opt(object, "captured") {
                None => true,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(invalid("data.object.captured must be a boolean")),
            };
            if !captured {
                return ignored();
            }
            vec![Mapped {
                kind: EventKind::PaymentSucceeded,
                transaction_id: charge_payment_key(object)?,
                parent: None,
                amount: credited(object, "amount_captured", before_basil)?,
                currency: req_str(object, "currency", "data.object.currency")?,
                path: OBJECT,
            }]
        }
        "charge.failed" => vec![Mapped {
            kind: EventKind::PaymentFailed,
            transaction_id: charge_payment_key(object)?,
            parent: None,
            amount: amount_minor(opt(object, "amount"), "data.object.amount")?,
            currency: req_str(object, "currency", "data.object.currency")?,
            path: OBJECT,
        }],
        "charge.refunded" => succeeded_refunds(object, before_basil)?,
        "refund.failed" => vec![refund_mapped(object, EventKind::RefundFailed)?],
        "refund.created" | "refund.updated" | "charge.refund.updated" => {
            match req_str(object, "status", "data.object.status")? {
                // A released authorisation moved no money.
                "succeeded" if before_basil && releases_an_authorisation(object) => Vec::new(),
                "succeeded" => vec![refund_mapped(object, EventKind::RefundSucceeded)?],
                // `canceled` is reachable only from `requires_action`, so never
                // after a success: recorded failed, like a refused refund.
                "failed" | "canceled" => vec![refund_mapped(object, EventKind::RefundFailed)?],
                // pending, requires_action, or a status this mapping does not
                // know: nothing moved yet; a later refund.updated settles it.
                _ => Vec::new(),
            }
        }
        "charge.dispute.funds_withdrawn" => {
            vec![dispute_mapped(object, EventKind::DisputeFundsWithdrawn)?]
        }
        _ => {
            // charge.dispute.funds_reinstated
            vec![dispute_mapped(object, EventKind::DisputeFundsReinstated)?]
        }
    };
    if mapped.is_empty() {
        return ignored();
    }
    // The merchant's own keys on the object (a PaymentIntent's `metadata`),
    // passed on as they are; not part of what is booked.
    let metadata = opt(object, "metadata").filter(|m| m.is_object());
    mapped
        .into_iter()
        .map(|m| m.into_item(provider, occurred_at, metadata))
        .collect()
}

/// The first API version that no longer models a partial capture or a
/// cancelled authorisation as a refund (Stripe's changelog, 2025-03-31.basil).
const BASIL: &str = "2025-03-31";

/// Whether the event is rendered in an API version before
/// [`BASIL`] (2025-03-31.basil): its `api_version` (`YYYY-MM-DD` or
/// `YYYY-MM-DD.<name>`) sorts before it. Stripe leaves `api_version` null only
/// on events from before 2014-10-31: before too.
fn before_basil(event: &Object) -> Result<bool, Reject> {
    let version = match opt(event, "api_version") {
        None => return Ok(true),
        Some(Value::String(v)) => v.as_str(),
        Some(_) => return Err(invalid("api_version must be a string")),
    };
    let date = version.get(..10).filter(|d| {
        d.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        })
    });
    match date {
        Some(date) if version.len() == 10 || version[10..].starts_with('.') => Ok(date < BASIL),
        _ => Err(invalid(format!(
            "api_version `{version}` is not a Stripe API version (YYYY-MM-DD[.name])"
        ))),
    }
}

/// What a payment's success credits: what was received (`received`: a
/// PaymentIntent's `amount_received`, a Charge's `amount_captured`), else the
/// `amount`. Before 2025-03-31.basil, a capture of less than was authorised
/// was booked by Stripe as a capture of the whole authorisation and a refund
/// of the rest (a Refund object, its own balance transaction, a
/// `charge.refunded`): the authorised `amount` is credited then, and that
/// refund, booked as every refund is, nets it to what was captured. From
/// basil on no such refund exists: what was received is credited.
fn credited(object: &Object, received: &str, before_basil: bool) -> Result<i64, Reject> {
    let amount = || amount_minor(opt(object, "amount"), "data.object.amount");
    let Some(v) = opt(object, received) else {
        return amount();
    };
    let received = amount_minor(Some(v), &format!("data.object.{received}"))?;
    if before_basil && opt(object, "amount").is_some() {
        Ok(received.max(amount()?))
    } else {
        Ok(received)
    }
}

/// Whether a succeeded Refund released an authorisation rather than
/// returning money (before 2025-03-31.basil, the cancellation or expiry of an
/// uncaptured payment made one): it has no balance transaction, as nothing
/// had reached the balance. Only a Refund that says so (`balance_transaction`
/// present and null) is one; one without the field is a refund.
fn releases_an_authorisation(refund: &Object) -> bool {
    matches!(refund.get("balance_transaction"), Some(Value::Null))
}

/// One booking read from a Stripe object, before its fields are checked.
struct Mapped<'a> {
    kind: EventKind,
    transaction_id: &'a str,
    parent: Option<&'a str>,
    amount: i64,
    currency: &'a str,
    /// Where in the event the object sits, for messages.
    path: &'a str,
}

impl Mapped<'_> {
    fn into_item(
        self,
        provider: &str,
        occurred_at: Option<OffsetDateTime>,
        metadata: Option<&Value>,
    ) -> Result<Item, Reject> {
        check_transaction_id(self.transaction_id)?;
        if let Some(parent) = self.parent {
            check_transaction_id(parent).map_err(|_| {
                invalid(format!(
                    "{}: the payment it names must be 1 to 255 printable ASCII characters, without leading or trailing whitespace",
                    self.path
                ))
            })?;
        }
        Ok(Item::Event(CanonicalEvent {
            provider: provider.to_owned(),
            transaction_id: self.transaction_id.to_owned(),
            event_type: self.kind,
            amount_minor: self.amount,
            currency: normalise_currency(self.currency, self.path)?,
            parent_transaction_id: self.parent.map(str::to_owned),
            occurred_at,
            merchant_reference: None,
            metadata: metadata.cloned(),
        }))
    }
}

/// Stripe sends ISO 4217 codes in lower case; the ledger keeps upper case.
fn normalise_currency(c: &str, path: &str) -> Result<String, Reject> {
    if c.len() == 3 && c.bytes().all(|b| b.is_ascii_alphabetic()) {
        let upper = c.to_ascii_uppercase();
        check_currency(&upper)?;
        Ok(upper)
    } else {
        Err(invalid(format!(
            "{path}.currency must be a three-letter ISO 4217 code"
        )))
    }
}

/// An id field that Stripe sends either as a string or, when expanded, as an
/// object with an `id`.
fn id_or_expanded<'a>(obj: &'a Object, key: &str, path: &str) -> Result<Option<&'a str>, Reject> {
    match opt(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(Value::Object(o)) => Ok(Some(req_str(o, "id", &format!("{path}.id"))?)),
        Some(_) => Err(invalid(format!(
            "{path} must be an id string or an expanded object"
        ))),
    }
}

/// The payment a Charge belongs to: its PaymentIntent, or itself when it has none.
fn charge_payment_key(charge: &Object) -> Result<&str, Reject> {
    match id_or_expanded(charge, "payment_intent", "data.object.payment_intent")? {
        Some(pi) => Ok(pi),
        None => req_str(charge, "id", "data.object.id"),
    }
}

/// The payment a Refund or a Dispute (at `data.object`) takes money from:
/// its PaymentIntent, else its Charge (a payment without a PaymentIntent is
/// keyed by its Charge). Neither: it cannot be checked against a payment.
fn parent_payment<'a>(object: &'a Object, what: &str) -> Result<&'a str, Reject> {
    if let Some(pi) = id_or_expanded(object, "payment_intent", "data.object.payment_intent")? {
        return Ok(pi);
    }
    id_or_expanded(object, "charge", "data.object.charge")?.ok_or_else(|| {
        invalid(format!(
            "a {what} with neither data.object.payment_intent nor data.object.charge cannot be checked against a payment"
        ))
    })
}

/// A Refund event's object as `kind`.
fn refund_mapped(refund: &Object, kind: EventKind) -> Result<Mapped<'_>, Reject> {
    Ok(Mapped {
        kind,
        transaction_id: req_str(refund, "id", "data.object.id")?,
        parent: Some(parent_payment(refund, "refund")?),
        amount: amount_minor(opt(refund, "amount"), "data.object.amount")?,
        currency: req_str(refund, "currency", "data.object.currency")?,
        path: "data.object",
    })
}

/// A Dispute event's object as `kind`: its principal, not Stripe's fee.
fn dispute_mapped(dispute: &Object, kind: EventKind) -> Result<Mapped<'_>, Reject> {
    Ok(Mapped {
        kind,
        transaction_id: req_str(dispute, "id", "data.object.id")?,
        parent: Some(parent_payment(dispute, "dispute")?),
        amount: amount_minor(opt(dispute, "amount"), "data.object.amount")?,
        currency: req_str(dispute, "currency", "data.object.currency")?,
        path: "data.object",
    })
}

/// `charge.refunded`: every `succeeded` refund of the Charge's refund list,
/// in list order. None when the list is absent (API 2022-11-15 and later) or
/// holds no succeeded refund: other statuses are settled by `refund.*`
/// events. A list with `has_more` is booked as far as it goes; the refunds
/// beyond it come through `refund.*` events too. Before 2025-03-31.basil,
/// the refunds of a Charge never captured, and refunds without a balance
/// transaction, released an authorisation: none is booked.
fn succeeded_refunds(charge: &Object, before_basil: bool) -> Result<Vec<Mapped<'_>>, Reject> {
    const PATH: &str = "data.object.refunds.data[]";
    if before_basil && matches!(opt(charge, "captured"), Some(Value::Bool(false))) {
        return Ok(Vec::new());
    }
    let list = match opt(charge, "refunds") {
        None => return Ok(Vec::new()),
        Some(Value::Object(list)) => list,
        Some(_) => return Err(invalid("data.object.refunds must be a list object")),
    };
    let data = match opt(list, "data") {
        None => return Ok(Vec::new()),
        Some(Value::Array(data)) => data,
        Some(_) => return Err(invalid("data.object.refunds.data must be an array")),
    };
    let mut mapped = Vec::new();
    for refund in data {
        let refund = refund
            .as_object()
            .ok_or_else(|| invalid(format!("{PATH} must be refund objects")))?;
        if req_str(refund, "status", &format!("{PATH}.status"))? != "succeeded"
            || (before_basil && releases_an_authorisation(refund))
        {
            continue;
        }
        let parent =
            match id_or_expanded(refund, "payment_intent", &format!("{PATH}.payment_intent"))? {
                Some(pi) => pi,
                None => charge_payment_key(charge)?,
            };
        mapped.push(Mapped {
            kind: EventKind::RefundSucceeded,
            transaction_id: req_str(refund, "id", &format!("{PATH}.id"))?,
            parent: Some(parent),
            amount: amount_minor(opt(refund, "amount"), &format!("{PATH}.amount"))?,
            currency: req_str(refund, "currency", &format!("{PATH}.currency"))?,
            path: PATH,
        });
    }
    Ok(mapped)
}

/// The Charge id the PSP side gives a PaymentIntent's (or a refund's) charge.
fn charge_of(payment: &str) -> String {
    match payment.strip_prefix("pi_") {
        Some(rest) => format!("ch_{rest}"),
        None => format!("ch_{payment}"),
    }
}

/// The Stripe event of `notice`, as Stripe sends it (API 2024-06-20 shapes;
/// `refund.failed` exists from 2024-10-28): [`parse_event`]'s inverse. Each
/// canonical kind is the native event the mapping reads back as it
/// (`refund.succeeded` as a `refund.updated` to `succeeded`); any other
/// `event_type` is sent verbatim as the type of a succeeded PaymentIntent.
pub fn event_of(notice: &Notice, event_id: &str, ts: i64) -> Result<Value, String> {
    use serde_json::json;
    let tx = &notice.transaction_id;
    let currency = notice.currency.to_ascii_lowercase();
    let payment_intent = |status: &str, received: i64| {
        json!({
            "id": tx, "object": "payment_intent", "amount": notice.amount,
            "amount_capturable": 0, "amount_received": received, "capture_method": "automatic",
            "created": ts, "currency": currency, "latest_charge": charge_of(tx), "livemode": false,
            "metadata": {}, "payment_method": "pm_card_visa", "payment_method_types": ["card"],
            "status": status
        })
    };
    // A Refund or Dispute names its payment by PaymentIntent, or by Charge
    // when the payment has none (then that Charge is the payment's key).
    let links = |parent: &str| {
        if parent.starts_with("ch_") || parent.starts_with("py_") {
            (Value::Null, json!(parent))
        } else {
            (json!(parent), json!(charge_of(parent)))
        }
    };
    let refund = |status: &str| -> Result<Value, String> {
        let (pi, charge) = links(psp::parent(notice)?);
        let mut r = json!({
            "id": tx, "object": "refund", "amount": notice.amount, "charge": charge,
            "created": ts, "currency": currency, "metadata": {}, "payment_intent": pi,
            "reason": "requested_by_customer", "status": status
        });
        if status == "failed" {
            r["failure_reason"] = json!("expired_or_canceled_card");
        }
        Ok(r)
    };
    let dispute = |status: &str| -> Result<Value, String> {
        let (pi, charge) = links(psp::parent(notice)?);
        Ok(json!({
            "id": tx, "object": "dispute", "amount": notice.amount, "balance_transactions": [],
            "charge": charge, "created": ts, "currency": currency, "is_charge_refundable": false,
            "livemode": false, "metadata": {}, "payment_intent": pi, "reason": "fraudulent",
            "status": status
        }))
    };
    let mut previous_attributes = None;
    let (event_type, object) = match notice.event_type.as_str() {
        "payment.succeeded" => (
            "payment_intent.succeeded",
            payment_intent("succeeded", notice.amount),
        ),
        "payment.failed" => {
            let mut pi = payment_intent("requires_payment_method", 0);
            pi["last_payment_error"] = json!({
                "charge": charge_of(tx), "code": "card_declined",
                "decline_code": "generic_decline", "message": "Your card was declined.",
                "type": "card_error"
            });
            ("payment_intent.payment_failed", pi)
        }
        "refund.succeeded" => {
            previous_attributes = Some(json!({"status": "pending"}));
            ("refund.updated", refund("succeeded")?)
        }
        "refund.failed" => ("refund.failed", refund("failed")?),
        "dispute.funds_withdrawn" => ("charge.dispute.funds_withdrawn", dispute("needs_response")?),
        "dispute.funds_reinstated" => ("charge.dispute.funds_reinstated", dispute("won")?),
        other => (other, payment_intent("succeeded", notice.amount)),
    };
    let mut data = json!({"object": object});
    if let Some(previous) = previous_attributes {
        data["previous_attributes"] = previous;
    }
    Ok(json!({
        "id": event_id, "object": "event", "api_version": "2024-06-20", "created": ts,
        "data": data, "livemode": false, "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null}, "type": event_type
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::arbitrary_json;
    use proptest::prelude::*;

    /// What reconciliation asks Stripe for and what a thin event is fetched
    /// for are one list of types.
    #[test]
    fn the_types_listed_are_the_types_thin_events_fetch_for() {
        for t in BOOKED_TYPES {
            assert!(books(t), "{t}");
        }
        for t in [
            "payment_intent.created",
            "customer.created",
            "charge.captured",
        ] {
            assert!(!books(t) && !BOOKED_TYPES.contains(&t), "{t}");
        }
    }

    const STRIPE_KEYS: &[&str] = &[
        "id",
        "object",
        "amount",
        "amount_received",
        "amount_captured",
        "captured",
        "currency",
        "payment_intent",
        "status",
        "created",
        "refunds",
        "data",
        "last_payment_error",
        "charge",
        "latest_charge",
        "has_more",
        "reason",
    ];

    const SECRET: &str = "whsec_test_secret_for_fencehook_unit_tests";
    const OLD: &str = "whsec_the_old_secret_before_the_roll";

    fn headers(value: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(SIGNATURE_HEADER, value.parse().unwrap());
        h
    }

    fn stripe(secrets: &[&str]) -> Stripe {
        Stripe::new(
            &secrets.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            300,
        )
        .unwrap()
    }

    #[test]
    fn signature_matches_an_independent_hmac() {
        // printf '1492774577.{"id":"evt_1"}' | openssl dgst -sha256 -hmac "$SECRET"
        assert_eq!(
            signature_hex(SECRET, 1492774577, br#"{"id":"evt_1"}"#),
            "c62c74be83bf90fc7fd50fd5f300b08b9422fa8f94a3512cbf7603665610ac52"
        );
    }

    #[test]
    fn the_header_parser_takes_t_and_every_v1_and_ignores_other_schemes() {
        let h = parse_signature_header("t=1492774577,v1=00ff,v0=zz,v1=abcd").unwrap();
        assert_eq!(h.timestamp, 1492774577);
        assert_eq!(h.timestamp_text, "1492774577");
        assert_eq!(h.v1, vec![vec![0x00, 0xff], vec![0xab, 0xcd]]);
        // Not hex: cannot match, dropped (the header is still well-formed).
        assert_eq!(parse_signature_header("t=1,v1=xyz").unwrap().v1.len(), 0);
        for bad in [
            "",
            "t=1",
            "v1=00ff",
            "t=1,v0=00ff",
            "t=,v1=00",
            "t=-1,v1=00",
            "t=+1,v1=00",
            "t=1x,v1=00",
            "t=1,t=2,v1=00",
            "t=1,v1",
            "t=1,,v1=00",
            "t=99999999999999999999,v1=00",
        ] {
            assert!(
                matches!(parse_signature_header(bad), Err(Reject::Unauthorized(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn verifies_valid_and_rejects_tampered_wrong_secret_missing_and_malformed() {
        let s = stripe(&[SECRET]);
        let body = br#"{"type":"payment_intent.succeeded"}"#;
        let good = sign(SECRET, 1000, body).unwrap();
        assert!(s.verify(&headers(&good), body, 1000).is_ok());
        assert!(s.verify(&headers(&good), br#"{"type":"x"}"#, 1000).is_err());
        let other = sign("whsec_someone_else", 1000, body).unwrap();
        assert!(s.verify(&headers(&other), body, 1000).is_err());
        assert!(s.verify(&http::HeaderMap::new(), body, 1000).is_err());
        assert!(s.verify(&headers("garbage"), body, 1000).is_err());
        // The signed t is the header's: moving t breaks the signature.
        let moved = good.replace("t=1000", "t=1001");
        assert!(s.verify(&headers(&moved), body, 1000).is_err());
    }

    #[test]
    fn any_configured_secret_and_any_listed_signature_verifies() {
        let s = stripe(&[OLD, SECRET]);
        let body = b"{}";
        for secret in [OLD, SECRET] {
            let h = sign(secret, 1000, body).unwrap();
            assert!(s.verify(&headers(&h), body, 1000).is_ok(), "{secret}");
        }
        // During a roll Stripe sends one v1 per live secret.
        let both = format!(
            "t=1000,v1={},v0=dead,v1={}",
            signature_hex("whsec_unknown", 1000, body),
            signature_hex(SECRET, 1000, body)
        );
        assert!(stripe(&[SECRET])
            .verify(&headers(&both), body, 1000)
            .is_ok());
    }

    #[test]
    fn timestamp_tolerance_is_inclusive_at_the_edge_and_rejects_beyond() {
        let s = stripe(&[SECRET]);
        let h = sign(SECRET, 1000, b"{}").unwrap();
        for now in [700, 1300] {
            assert!(s.verify(&headers(&h), b"{}", now).is_ok(), "{now}");
        }
        for now in [699, 1301] {
            assert!(s.verify(&headers(&h), b"{}", now).is_err(), "{now}");
        }
    }

    #[test]
    fn secrets_must_be_endpoint_signing_secrets() {
        assert!(Stripe::new(&["sk_test_123".to_owned()], 300).is_err());
        assert!(Stripe::new(&["whsec_".to_owned()], 300).is_err());
    }

    fn event(event_type: &str, object: Value) -> Vec<u8> {
        serde_json::json!({
            "id": "evt_1", "object": "event", "created": 1_700_000_000,
            "type": event_type, "data": {"object": object}
        })
        .to_string()
        .into_bytes()
    }

    /// [`event`] rendered in API version `version`.
    fn event_at(version: &str, event_type: &str, object: Value) -> Vec<u8> {
        serde_json::json!({
            "id": "evt_1", "object": "event", "created": 1_700_000_000, "api_version": version,
            "type": event_type, "data": {"object": object}
        })
        .to_string()
        .into_bytes()
    }

    fn items_at(version: &str, event_type: &str, object: Value) -> Vec<Item> {
        parse_event("stripe", &event_at(version, event_type, object))
            .unwrap_or_else(|e| panic!("{event_type}: {e}"))
    }

    fn pi(extra: Value) -> Value {
        let mut o = serde_json::json!({
            "id": "pi_1", "object": "payment_intent", "amount": 2000,
            "amount_received": 2000, "currency": "eur"
        });
        for (k, v) in extra.as_object().unwrap() {
            o[k] = v.clone();
        }
        o
    }

    fn charge(extra: Value) -> Value {
        let mut o = serde_json::json!({
            "id": "ch_1", "object": "charge", "amount": 2000, "amount_captured": 2000,
            "captured": true, "currency": "eur", "payment_intent": "pi_1"
        });
        for (k, v) in extra.as_object().unwrap() {
            o[k] = v.clone();
        }
        o
    }

    fn items(event_type: &str, object: Value) -> Vec<Item> {
        parse_event("stripe", &event(event_type, object))
            .unwrap_or_else(|e| panic!("{event_type}: {e}"))
    }

    fn mapped(event_type: &str, object: Value) -> CanonicalEvent {
        match items(event_type, object).as_slice() {
            [Item::Event(e)] => e.clone(),
            other => panic!("{event_type}: {other:?}"),
        }
    }

    fn is_ignored(items: &[Item]) -> bool {
        matches!(items, [Item::Ignored { .. }])
    }

    /// A fixture from tests/fixtures/stripe/, as Stripe sends it.
    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/stripe/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn stripe_carries_the_objects_metadata_and_no_merchant_reference() {
        let one = |name: &str| match parse_event("stripe", &fixture(name)).as_deref() {
            Ok([Item::Event(e)]) => e.clone(),
            other => panic!("{name}: {other:?}"),
        };
        let e = one("payment_intent.succeeded.json");
        assert_eq!(e.metadata, Some(serde_json::json!({"order_id": "1042"})));
        assert_eq!(e.merchant_reference, None);
        assert_eq!(
            one("charge.succeeded.json").metadata,
            Some(serde_json::json!({"order_id": "1042"}))
        );
        assert_eq!(
            one("payment_intent.payment_failed.json").metadata,
            Some(serde_json::json!({}))
        );
    }

    fn fixture_events(name: &str) -> Vec<CanonicalEvent> {
        parse_event("stripe", &fixture(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .into_iter()
            .map(|item| match item {
                Item::Event(e) => e,
                other => panic!("{name}: {other:?}"),
            })
            .collect()
    }

    /// (transaction_id, kind, parent, amount, currency) of an event.
    fn summary(e: &CanonicalEvent) -> (&str, EventKind, Option<&str>, i64, &str) {
        (
            &e.transaction_id,
            e.event_type,
            e.parent_transaction_id.as_deref(),
            e.amount_minor,
            &e.currency,
        )
    }

    #[test]
    fn payment_intent_and_charge_of_one_payment_have_one_key_and_fingerprint() {
        let a = mapped("payment_intent.succeeded", pi(serde_json::json!({})));
        let b = mapped("charge.succeeded", charge(serde_json::json!({})));
        assert_eq!(a.transaction_id, "pi_1");
        assert_eq!(a.currency, "EUR");
        assert_eq!(a.event_type, EventKind::PaymentSucceeded);
        assert_eq!(a.parent_transaction_id, None);
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(
            a.occurred_at,
            Some(OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap())
        );
        // Expanded payment_intent on the charge; a charge without one is its own payment.
        let c = mapped(
            "charge.succeeded",
            charge(
                serde_json::json!({"payment_intent": {"id": "pi_1", "object": "payment_intent"}}),
            ),
        );
        assert_eq!(c.transaction_id, "pi_1");
        let d = mapped(
            "charge.succeeded",
            charge(serde_json::json!({"payment_intent": null})),
        );
        assert_eq!(d.transaction_id, "ch_1");
    }

    #[test]
    fn amounts_fall_back_and_zero_and_three_decimal_currencies_are_kept_as_sent() {
        let e = mapped(
            "payment_intent.succeeded",
            pi(serde_json::json!({"amount_received": null, "amount": 500, "currency": "jpy"})),
        );
        assert_eq!((e.amount_minor, e.currency.as_str()), (500, "JPY"));
        let e = mapped(
            "charge.succeeded",
            charge(serde_json::json!({"amount_captured": null, "amount": 1230, "currency": "kwd"})),
        );
        assert_eq!((e.amount_minor, e.currency.as_str()), (1230, "KWD"));
    }

    #[test]
    fn a_failed_payment_intent_is_keyed_by_the_payment_intent_so_its_later_success_is_the_same_payment(
    ) {
        let failed = fixture_events("payment_intent.payment_failed.json");
        let succeeded = fixture_events("payment_intent.succeeded.after-failure.json");
        assert_eq!(
            summary(&failed[0]),
            (
                "pi_3SfZt1B7WZ01zgkW1kQ4Dm9x",
                EventKind::PaymentFailed,
                None,
                5000,
                "USD"
            ),
            "the PaymentIntent, not the declined charge in last_payment_error"
        );
        assert_eq!(
            summary(&succeeded[0]),
            (
                "pi_3SfZt1B7WZ01zgkW1kQ4Dm9x",
                EventKind::PaymentSucceeded,
                None,
                5000,
                "USD"
            )
        );
        // One payment: the lifecycle books failed → succeeded under one fingerprint.
        assert_eq!(failed[0].fingerprint(), succeeded[0].fingerprint());
        // No charge at all (authentication failed before any attempt): still the PaymentIntent.
        let e = mapped(
            "payment_intent.payment_failed",
            pi(serde_json::json!({"amount_received": 0})),
        );
        assert_eq!(
            (e.transaction_id.as_str(), e.event_type, e.amount_minor),
            ("pi_1", EventKind::PaymentFailed, 2000)
        );
        // charge.failed: the Charge's PaymentIntent, else the Charge itself.
        let f = mapped(
            "charge.failed",
            charge(
                serde_json::json!({"id": "ch_declined", "captured": false, "amount_captured": 0}),
            ),
        );
        assert_eq!(
            (f.transaction_id.as_str(), f.event_type),
            ("pi_1", EventKind::PaymentFailed)
        );
        assert_eq!(f.fingerprint(), e.fingerprint());
        let g = mapped(
            "charge.failed",
            charge(serde_json::json!({"id": "ch_legacy", "payment_intent": null})),
        );
        assert_eq!(g.transaction_id, "ch_legacy");
    }

    #[test]
    fn a_partial_capture_after_a_failure_maps_to_another_amount_under_the_same_key() {
        // The store takes it: no success had settled the payment.
        let failed = mapped(
            "payment_intent.payment_failed",
            pi(serde_json::json!({"amount_received": 0})),
        );
        let partial = match items_at(
            "2025-03-31.basil",
            "payment_intent.succeeded",
            pi(serde_json::json!({"amount_received": 1500})),
        )
        .as_slice()
        {
            [Item::Event(e)] => e.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(failed.transaction_id, partial.transaction_id);
        assert_eq!(partial.amount_minor, 1500);
        assert_ne!(failed.fingerprint(), partial.fingerprint());
    }

    fn amount_of(items: &[Item]) -> i64 {
        match items {
            [Item::Event(e)] => e.amount_minor,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn before_basil_a_partial_capture_credits_the_authorisation_and_from_basil_what_was_captured() {
        let partial = || pi(serde_json::json!({"amount": 1000, "amount_received": 600}));
        let charge = || charge(serde_json::json!({"amount": 1000, "amount_captured": 600}));
        for version in ["2024-06-20", "2025-02-24.acacia"] {
            for (event_type, object) in [
                ("payment_intent.succeeded", partial()),
                ("charge.succeeded", charge()),
            ] {
                assert_eq!(
                    amount_of(&items_at(version, event_type, object)),
                    1000,
                    "{version}"
                );
            }
        }
        assert_eq!(
            amount_of(&items("payment_intent.succeeded", partial())),
            1000,
            "no version: pre-2014"
        );
        for version in [
            "2025-03-31.basil",
            "2025-09-30.clover",
            "2026-01-28.clover",
            "2025-04-30",
        ] {
            for (event_type, object) in [
                ("payment_intent.succeeded", partial()),
                ("charge.succeeded", charge()),
            ] {
                assert_eq!(
                    amount_of(&items_at(version, event_type, object)),
                    600,
                    "{version}"
                );
            }
        }
        // An over-capture: what was received, on both sides.
        let over = || pi(serde_json::json!({"amount": 1000, "amount_received": 1100}));
        assert_eq!(
            amount_of(&items_at("2024-06-20", "payment_intent.succeeded", over())),
            1100
        );
        assert_eq!(
            amount_of(&items_at(
                "2025-03-31.basil",
                "payment_intent.succeeded",
                over()
            )),
            1100
        );
        for bad in ["basil", "2025-3-31", "20250331", "2025-03-31basil"] {
            assert!(
                parse_event(
                    "stripe",
                    &event_at(bad, "payment_intent.succeeded", partial())
                )
                .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn before_basil_a_refund_without_a_balance_transaction_released_an_authorisation() {
        let refund = |bt: Value| {
            serde_json::json!({
                "id": "re_1", "object": "refund", "amount": 1000, "currency": "eur",
                "payment_intent": "pi_1", "charge": "ch_1", "status": "succeeded",
                "balance_transaction": bt, "reason": "expired_uncaptured_charge"
            })
        };
        for event_type in ["refund.created", "refund.updated", "charge.refund.updated"] {
            assert!(is_ignored(&items_at(
                "2024-06-20",
                event_type,
                refund(Value::Null)
            )));
            assert_eq!(
                amount_of(&items_at(
                    "2024-06-20",
                    event_type,
                    refund(serde_json::json!("txn_1"))
                )),
                1000
            );
            // From basil no such refund exists: a refund is a refund.
            assert_eq!(
                amount_of(&items_at(
                    "2025-03-31.basil",
                    event_type,
                    refund(Value::Null)
                )),
                1000
            );
        }
        // charge.refunded of a Charge never captured: nothing.
        let uncaptured = charge(serde_json::json!({
            "captured": false, "amount_captured": 0, "amount_refunded": 1000,
            "refunds": {"object": "list", "has_more": false,
                        "data": [refund(serde_json::json!("txn_1"))]}
        }));
        assert!(is_ignored(&items_at(
            "2022-08-01",
            "charge.refunded",
            uncaptured
        )));
    }

    #[test]
    fn the_capture_reversal_fixtures_net_to_what_was_captured_on_both_sides_of_basil() {
        let credit = |name: &str| fixture_events(name)[0].amount_minor;
        let refunds = |name: &str| -> i64 {
            parse_event("stripe", &fixture(name))
                .unwrap()
                .iter()
                .map(|item| match item {
                    Item::Event(e) => e.amount_minor,
                    Item::Ignored { .. } => 0,
                    other => panic!("{name}: {other:?}"),
                })
                .sum()
        };
        // A manual capture of 60.00 of 100.00.
        assert_eq!(
            credit("capture-partial.pre-basil.payment_intent.succeeded.json")
                - refunds("capture-partial.pre-basil.refund.created.json"),
            6000
        );
        assert_eq!(
            credit("capture-partial.basil.payment_intent.succeeded.json"),
            6000
        );
        // A cancelled (expired) authorisation of 100.00: nothing moves.
        assert_eq!(refunds("cancel.pre-basil.charge.refunded.json"), 0);
        assert_eq!(refunds("cancel.pre-basil.refund.updated.json"), 0);
        assert_eq!(refunds("cancel.basil.payment_intent.canceled.json"), 0);
    }

    #[test]
    fn charge_refunded_with_two_succeeded_refunds_is_two_refund_items_of_the_payment_intent() {
        let events = fixture_events("charge.refunded.expanded-refunds.json");
        let pi = Some("pi_3QfhkRB7WZ01zgkW0Yq2bC7d");
        assert_eq!(
            events.iter().map(summary).collect::<Vec<_>>(),
            vec![
                (
                    "re_3QfhkRB7WZ01zgkW0xR2bB02",
                    EventKind::RefundSucceeded,
                    pi,
                    2000,
                    "USD"
                ),
                (
                    "re_3QfhkRB7WZ01zgkW0xR1aA01",
                    EventKind::RefundSucceeded,
                    pi,
                    3000,
                    "USD"
                ),
            ]
        );
        // The same refund announced by refund.created: one refund, one fingerprint.
        let created = fixture_events("refund.created.succeeded.json");
        assert_eq!(created[0].fingerprint(), events[1].fingerprint());
        // Since API 2022-11-15 the list is not in the event: ignored.
        assert!(is_ignored(
            &parse_event("stripe", &fixture("charge.refunded.no-refunds.json")).unwrap()
        ));
    }

    #[test]
    fn charge_refunded_books_only_succeeded_refunds_and_falls_back_to_the_charges_payment() {
        let refund = |id: &str, status: &str, extra: Value| {
            let mut r = serde_json::json!({
                "id": id, "object": "refund", "amount": 500, "currency": "eur",
                "charge": "ch_1", "status": status
            });
            for (k, v) in extra.as_object().unwrap() {
                r[k] = v.clone();
            }
            r
        };
        let list = |refunds: Vec<Value>, extra: Value| {
            let mut c = charge(serde_json::json!({"refunds": {"object": "list", "data": refunds}}));
            for (k, v) in extra.as_object().unwrap() {
                c[k] = v.clone();
            }
            c
        };
        let got = items(
            "charge.refunded",
            list(
                vec![
                    refund("re_3", "pending", serde_json::json!({})),
                    refund("re_2", "failed", serde_json::json!({})),
                    refund(
                        "re_1",
                        "succeeded",
                        serde_json::json!({"payment_intent": null}),
                    ),
                ],
                serde_json::json!({}),
            ),
        );
        let [Item::Event(e)] = got.as_slice() else {
            panic!("{got:?}")
        };
        assert_eq!(
            (
                e.transaction_id.as_str(),
                e.parent_transaction_id.as_deref()
            ),
            ("re_1", Some("pi_1")),
            "no payment_intent on the refund: the charge's"
        );
        let got = items(
            "charge.refunded",
            list(
                vec![refund("re_1", "succeeded", serde_json::json!({}))],
                serde_json::json!({"payment_intent": null}),
            ),
        );
        let [Item::Event(e)] = got.as_slice() else {
            panic!("{got:?}")
        };
        assert_eq!(
            e.parent_transaction_id.as_deref(),
            Some("ch_1"),
            "no PaymentIntent anywhere: the charge"
        );
        // Nothing succeeded in the list: ignored.
        assert!(is_ignored(&items(
            "charge.refunded",
            list(
                vec![refund("re_1", "pending", serde_json::json!({}))],
                serde_json::json!({})
            )
        )));
    }

    #[test]
    fn refund_events_map_by_status_and_name_their_payment() {
        let created = fixture_events("refund.created.succeeded.json");
        assert_eq!(
            summary(&created[0]),
            (
                "re_3QfhkRB7WZ01zgkW0xR1aA01",
                EventKind::RefundSucceeded,
                Some("pi_3QfhkRB7WZ01zgkW0Yq2bC7d"),
                3000,
                "USD"
            )
        );
        // The same refund failing later, announced twice: one refund.failed.
        let updated = fixture_events("refund.updated.succeeded-to-failed.json");
        let failed = fixture_events("refund.failed.json");
        for e in [&updated[0], &failed[0]] {
            assert_eq!(
                summary(e),
                (
                    "re_3QfhkRB7WZ01zgkW0xR1aA01",
                    EventKind::RefundFailed,
                    Some("pi_3QfhkRB7WZ01zgkW0Yq2bC7d"),
                    3000,
                    "USD"
                )
            );
            assert_eq!(e.fingerprint(), created[0].fingerprint());
        }
        let refund = |status: &str, extra: Value| {
            let mut r = serde_json::json!({
                "id": "re_1", "object": "refund", "amount": 500, "currency": "eur",
                "charge": "ch_1", "payment_intent": "pi_1", "status": status
            });
            for (k, v) in extra.as_object().unwrap() {
                r[k] = v.clone();
            }
            r
        };
        for (event_type, status, kind) in [
            (
                "charge.refund.updated",
                "succeeded",
                EventKind::RefundSucceeded,
            ),
            ("refund.updated", "canceled", EventKind::RefundFailed),
            ("charge.refund.updated", "failed", EventKind::RefundFailed),
            // The event type decides: a refund.failed is a failure.
            ("refund.failed", "succeeded", EventKind::RefundFailed),
        ] {
            let e = mapped(event_type, refund(status, serde_json::json!({})));
            assert_eq!(e.event_type, kind, "{event_type} {status}");
        }
        for status in ["pending", "requires_action", "some_future_status"] {
            assert!(
                is_ignored(&items(
                    "refund.updated",
                    refund(status, serde_json::json!({}))
                )),
                "{status}"
            );
        }
        // Parent: the payment_intent (also expanded), else the charge.
        let e = mapped(
            "refund.updated",
            refund(
                "succeeded",
                serde_json::json!({"payment_intent": {"id": "pi_9", "object": "payment_intent"}}),
            ),
        );
        assert_eq!(e.parent_transaction_id.as_deref(), Some("pi_9"));
        let e = mapped(
            "refund.updated",
            refund("succeeded", serde_json::json!({"payment_intent": null})),
        );
        assert_eq!(e.parent_transaction_id.as_deref(), Some("ch_1"));
        // Neither: it cannot be checked against a payment.
        let orphan = refund(
            "succeeded",
            serde_json::json!({"payment_intent": null, "charge": null}),
        );
        match parse_event("stripe", &event("refund.updated", orphan)) {
            Err(Reject::Invalid(why)) => assert!(why.contains("payment_intent"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn dispute_fund_movements_are_keyed_by_the_dispute_and_book_its_principal() {
        let withdrawn = fixture_events("charge.dispute.funds_withdrawn.json");
        let reinstated = fixture_events("charge.dispute.funds_reinstated.json");
        let parent = Some("pi_1JAyTwJSZQVUcJYgBbsz0NuH");
        assert_eq!(
            summary(&withdrawn[0]),
            (
                "dp_1JAyTwJSZQVUcJYgPqasUEn1",
                EventKind::DisputeFundsWithdrawn,
                parent,
                1000,
                "USD"
            ),
            "the amount, not the balance transaction's net with the 15.00 fee"
        );
        assert_eq!(
            summary(&reinstated[0]),
            (
                "dp_1JAyTwJSZQVUcJYgPqasUEn1",
                EventKind::DisputeFundsReinstated,
                parent,
                1000,
                "USD"
            )
        );
        assert_eq!(withdrawn[0].fingerprint(), reinstated[0].fingerprint());
        let dispute = serde_json::json!({
            "id": "dp_1", "object": "dispute", "amount": 700, "currency": "eur",
            "charge": "ch_1", "payment_intent": null, "status": "needs_response"
        });
        let e = mapped("charge.dispute.funds_withdrawn", dispute.clone());
        assert_eq!(e.parent_transaction_id.as_deref(), Some("ch_1"));
        for t in [
            "charge.dispute.created",
            "charge.dispute.updated",
            "charge.dispute.closed",
        ] {
            assert!(is_ignored(&items(t, dispute.clone())), "{t}");
        }
        let mut orphan = dispute;
        orphan["charge"] = Value::Null;
        assert!(matches!(
            parse_event("stripe", &event("charge.dispute.funds_withdrawn", orphan)),
            Err(Reject::Invalid(_))
        ));
    }

    #[test]
    fn unhandled_types_and_uncaptured_charges_are_ignored() {
        for (t, o) in [
            (
                "customer.created",
                serde_json::json!({"id": "cus_1", "object": "customer"}),
            ),
            ("payment_intent.created", pi(serde_json::json!({}))),
            (
                "charge.succeeded",
                charge(serde_json::json!({"captured": false})),
            ),
        ] {
            assert!(is_ignored(&items(t, o)), "{t}");
        }
        // Unhandled types need nothing but a type.
        assert!(is_ignored(
            &parse_event("stripe", br#"{"type":"balance.available"}"#).unwrap()
        ));
    }

    #[test]
    fn bad_shapes_of_handled_types_are_invalid() {
        let cases = [
            (
                "payment_intent.succeeded",
                pi(serde_json::json!({"amount_received": 0})),
            ),
            (
                "payment_intent.succeeded",
                pi(serde_json::json!({"amount_received": 20.5})),
            ),
            (
                "payment_intent.succeeded",
                pi(serde_json::json!({"amount_received": "2000"})),
            ),
            (
                "payment_intent.succeeded",
                pi(serde_json::json!({"amount_received": -1})),
            ),
            (
                "payment_intent.succeeded",
                pi(serde_json::json!({"currency": "euro"})),
            ),
            (
                "payment_intent.succeeded",
                pi(serde_json::json!({"currency": "e1r"})),
            ),
            (
                "payment_intent.succeeded",
                pi(serde_json::json!({"currency": null})),
            ),
            (
                "payment_intent.succeeded",
                pi(serde_json::json!({"id": " pi_1"})),
            ),
            ("payment_intent.succeeded", pi(serde_json::json!({"id": 7}))),
            (
                "payment_intent.succeeded",
                pi(serde_json::json!({"object": "charge"})),
            ),
            (
                "charge.succeeded",
                charge(serde_json::json!({"payment_intent": 5})),
            ),
            (
                "charge.succeeded",
                charge(serde_json::json!({"captured": "yes"})),
            ),
            (
                "refund.updated",
                serde_json::json!({"id": "re_1", "object": "refund", "status": "succeeded", "currency": "eur"}),
            ),
            (
                "refund.updated",
                serde_json::json!({"id": "re_1", "object": "refund", "status": "succeeded",
                    "amount": 500, "currency": "eur", "payment_intent": " pi_1"}),
            ),
            (
                "refund.failed",
                serde_json::json!({"id": "re_1", "object": "refund", "amount": 500, "currency": "eur"}),
            ),
            (
                "charge.refunded",
                charge(serde_json::json!({"refunds": {"object": "list", "data": [
                    {"id": "re_1", "object": "refund", "status": "succeeded", "amount": 0,
                     "currency": "eur"}]}})),
            ),
            (
                "charge.refunded",
                charge(serde_json::json!({"refunds": {"object": "list", "data": "all"}})),
            ),
            (
                "charge.dispute.funds_reinstated",
                serde_json::json!({"id": "dp_1", "object": "dispute", "amount": 700,
                    "currency": "eur", "payment_intent": 5}),
            ),
            (
                "charge.dispute.funds_withdrawn",
                serde_json::json!({"id": "dp_1", "object": "charge", "amount": 700,
                    "currency": "eur", "charge": "ch_1"}),
            ),
            ("payment_intent.succeeded", Value::String("nope".into())),
        ];
        for (t, o) in cases {
            assert!(
                matches!(
                    parse_event("stripe", &event(t, o.clone())),
                    Err(Reject::Invalid(_))
                ),
                "{t} {o}"
            );
        }
        for body in [
            &b"not json"[..],
            b"[]",
            br#"{"type":5}"#,
            br#"{"data":{}}"#,
            br#"{"type":"charge.succeeded","created":"now","data":{"object":{}}}"#,
            br#"{"type":"charge.succeeded"}"#,
        ] {
            assert!(
                matches!(parse_event("stripe", body), Err(Reject::Invalid(_))),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn deeply_nested_json_is_invalid_not_a_crash() {
        let deep = format!(
            r#"{{"type":"payment_intent.succeeded","data":{}{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(matches!(
            parse_event("stripe", deep.as_bytes()),
            Err(Reject::Invalid(_))
        ));
    }

    proptest! {
        #[test]
        fn the_header_parser_never_panics(header in ".*") {
            let _ = parse_signature_header(&header);
        }

        #[test]
        fn header_shaped_input_never_panics(
            pieces in proptest::collection::vec("(t|v1|v0|x)?=?[0-9a-fA-F+-]{0,70}", 0..6)
        ) {
            let _ = parse_signature_header(&pieces.join(","));
        }

        #[test]
        fn verify_and_map_never_panic(
            header in "[ -~]{0,200}",
            body in proptest::collection::vec(any::<u8>(), 0..512),
            now in any::<i64>(),
        ) {
            let s = stripe(&[SECRET]);
            let mut h = http::HeaderMap::new();
            if let Ok(v) = header.parse() {
                h.insert(SIGNATURE_HEADER, v);
            }
            let _ = s.verify(&h, &body, now);
            let _ = parse_event("stripe", &body);
        }

        #[test]
        fn signed_arbitrary_events_never_panic(
            event_type in prop::sample::select(vec![
                "payment_intent.succeeded", "payment_intent.payment_failed", "charge.succeeded",
                "charge.failed", "charge.refunded", "refund.created", "refund.updated",
                "refund.failed", "charge.refund.updated", "charge.dispute.funds_withdrawn",
                "charge.dispute.funds_reinstated", "charge.dispute.closed", "customer.created"]),
            object in arbitrary_json(STRIPE_KEYS),
            now in 0i64..4_000_000_000,
        ) {
            let body = event(event_type, object);
            let h = headers(&sign(SECRET, now, &body).unwrap());
            let s = stripe(&[SECRET]);
            prop_assert!(s.verify(&h, &body, now).is_ok());
            let _ = parse_event("stripe", &body);
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

    const SECRET: &str = "whsec_test_secret_for_fencehook_unit_tests";

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(EventKind::ALL, ids(), i64::MAX, "[A-Z]{3}"),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let scheme = Stripe::new(&[SECRET.to_owned()], 300).unwrap();
            let psp = TestCredentials::new(&[(psp::SECRET, SECRET)], None);
            // The event's `created`.
            let event = CanonicalEvent { occurred_at: at(ts), ..event };
            prop_assert_eq!(round_trip(&scheme, &psp, &event, ts)?, event);
        }
    }
}
