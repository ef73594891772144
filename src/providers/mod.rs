//! Provider adapters: verify a delivery's signature, then map its payload to
//! [`CanonicalEvent`](crate::domain::CanonicalEvent)s (the domain's one event
//! shape). Nothing here touches the lease or the database; a delivery that
//! fails here writes nothing.
//!
//! # One scheme, one file, one registry line
//!
//! Every PSP's scheme implements [`Scheme`] in its own file: the settings it
//! takes (its own table of the providers file, a serde struct), how a
//! provider of it is built, verification and mapping, the answer body its
//! PSP reads and, for the tools that play the PSP, the PSP's side (its body
//! built from a canonical event, signed as the PSP signs, with the keys it
//! asks the tools for by name). The registry below lists the schemes once;
//! it makes [`SchemeKind`] and the one place a configured scheme is
//! dispatched. [`Provider`] is the same for every scheme: what differs, it
//! asks the scheme; no file but the scheme's names one of its settings.
//!
//! - [`standard`]: Standard Webhooks headers, the generic payload;
//! - [`stripe`]: `Stripe-Signature`, Stripe events: payments keyed by the
//!   PaymentIntent, refunds and disputes by their own ids;
//! - [`adyen`]: notification batches, one HMAC per item;
//! - [`wechatpay`]: WeChat Pay API v3, SHA256withRSA headers, an AES-256-GCM
//!   encrypted resource;
//! - [`alipay`]: form-encoded notifications signed with RSA2;
//! - [`paypal`]: SHA256withRSA with a certificate fetched from PayPal (the
//!   one scheme whose verification awaits: [`Provider::accept`] is async);
//! - [`paddle`]: Paddle Billing, `Paddle-Signature` (`ts` and `h1`);
//! - [`square`]: `x-square-hmacsha256-signature` over the notification URL
//!   and the body;
//! - [`checkout`]: Checkout.com's `Cko-Signature`, payments by `pay_` id,
//!   refunds by their action id;
//! - [`razorpay`]: `X-Razorpay-Signature`, payments and refunds by their ids;
//! - [`mollie`]: a form naming a payment, no signature: the payment and its
//!   refunds are fetched from Mollie's API and booked as it says.
//!
//! Shared: [`scheme`] (the trait, [`Item`], [`Reject`], [`AckBody`]),
//! `file.rs` (the providers file), [`settings`] (one provider's table read
//! for its scheme: unknown keys, type errors, the value types schemes
//! share), [`setup`] (what a scheme builds a provider with: key files,
//! exposed secrets, warnings), [`psp`] (what the PSP side of every scheme
//! builds with), `published.rs` (secrets that must never serve), `fields.rs`
//! (strict JSON readers, exact decimal amounts), `hmac.rs` (the HMAC
//! schemes' check and tables), [`keys`] (RSA public keys and certificates,
//! the SHA256withRSA check).
//!
//! # What must stay true
//!
//! - Verification and mapping never panic, whatever the bytes (proptest below
//!   and in each scheme's tests feeds them arbitrary input).
//! - A signature is accepted whole or refused whole: [`Provider::accept`]
//!   verifies *every* item before it maps any, so one badly signed item in a
//!   batch refuses the batch (401) before anything is written.
//! - A single-event delivery that cannot be mapped is refused (400); a
//!   well-signed batch item that cannot be mapped is [`Item::Unmappable`] and
//!   does not hold up the other items (Adyen would re-send the whole batch).
//! - One delivery may map to several items: every item of an Adyen batch,
//!   every succeeded refund of a Stripe `charge.refunded`, a Mollie payment
//!   and its refunds.
//! - What a scheme's PSP side builds, its own verification and mapping read
//!   back as the canonical event it was built from (each scheme's round-trip
//!   property test).
//! - Secrets never leave this module but through [`Provider::psp_value`],
//!   which only the tools that play the PSP read (`fencehook send`, `load`):
//!   [`Provider`]'s `Debug` hides them and no [`Reject`] message contains one.

pub mod adyen;
pub mod alipay;
pub mod checkout;
pub mod fetch;
mod fields;
mod file;
mod hmac;
mod in_force;
pub mod keys;
pub mod mollie;
pub mod paddle;
pub mod paypal;
pub mod paypal_api;
mod paypal_certs;
pub mod psp;
mod published;
pub mod razorpay;
pub mod scheme;
pub mod settings;
pub mod setup;
pub mod square;
pub mod standard;
pub mod stripe;
pub mod stripe_api;
pub mod stripe_thin;
#[cfg(any(test, feature = "test-support"))]
pub mod testkeys;
pub mod wechatpay;

use std::path::Path;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

pub use self::fetch::{ApiError, ApiFailure};
pub use self::fields::{check_currency, check_transaction_id};
pub use self::file::load_file;
pub use self::in_force::InForce;
use self::psp::Key;
pub use self::scheme::{
    AckBody, EventsApi, Item, Listed, Reject, Scheme, Spec, TransmissionKey, Window,
};
pub use self::settings::SettingErrors;
use self::setup::Setup;

/// Makes the registry's types from its list: [`SchemeKind`] (a scheme before
/// any provider of it is configured) and `Configured` (a configured
/// provider's scheme), and dispatches both, once, to each scheme's
/// [`Scheme`] impl.
macro_rules! registry {
    ($($(#[$doc:meta])* $kind:ident => $scheme:ty,)+) => {
        /// How a provider signs and shapes its deliveries (`scheme` in the
        /// providers file): one per scheme of the registry.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum SchemeKind {
            $($(#[$doc])* $kind,)+
        }

        impl SchemeKind {
            /// Every scheme, in the registry's order.
            pub const ALL: &'static [SchemeKind] = &[$(SchemeKind::$kind,)+];

            /// What the scheme is, before any provider of it is configured.
            pub fn spec(self) -> &'static Spec {
                match self {
                    $(SchemeKind::$kind => &const { Spec::of::<$scheme>() },)+
                }
            }

            /// A provider's scheme from its table (see [`Scheme::build`]).
            fn build(self, table: toml::Table, setup: &mut Setup) -> Result<Configured, SettingErrors> {
                match self {
                    $(SchemeKind::$kind => {
                        settings::build::<$scheme>(table, setup).map(Configured::$kind)
                    })+
                }
            }
        }

        /// A configured provider's scheme.
        #[derive(Clone)]
        enum Configured {
            $($kind($scheme),)+
        }

        impl Configured {
            fn kind(&self) -> SchemeKind {
                match self {
                    $(Configured::$kind(_) => SchemeKind::$kind,)+
                }
            }

            async fn accept(
                &self,
                provider: &str,
                headers: &http::HeaderMap,
                body: &[u8],
                now: i64,
            ) -> Result<Vec<Item>, Reject> {
                match self {
                    $(Configured::$kind(s) => s.accept(provider, headers, body, now).await,)+
                }
            }

            fn transmission(&self, headers: &http::HeaderMap, body: &[u8]) -> Option<TransmissionKey> {
                match self {
                    $(Configured::$kind(s) => s.transmission(headers, body),)+
                }
            }

            fn confirms(&self) -> bool {
                match self {
                    $(Configured::$kind(s) => s.confirms(),)+
                }
            }

            async fn confirm(&self, provider: &str, body: &[u8], item: &Item) -> Result<(), Reject> {
                match self {
                    $(Configured::$kind(s) => s.confirm(provider, body, item).await,)+
                }
            }

            fn events_api(&self) -> EventsApi {
                match self {
                    $(Configured::$kind(s) => s.events_api(),)+
                }
            }

            fn fetcher(&self) -> Option<&fetch::Fetcher> {
                match self {
                    $(Configured::$kind(s) => s.fetcher(),)+
                }
            }

            async fn list_events(&self, window: Window) -> Result<Vec<Listed>, ApiError> {
                match self {
                    $(Configured::$kind(s) => s.list_events(window).await,)+
                }
            }

            fn map_listed(&self, provider: &str, listed: &Listed) -> Result<Vec<Item>, Reject> {
                match self {
                    $(Configured::$kind(s) => s.map_listed(provider, listed),)+
                }
            }

            #[cfg(any(test, feature = "test-support"))]
            fn preload_certificate(&self, url: &str, pem: &[u8]) -> Option<Result<(), String>> {
                match self {
                    $(Configured::$kind(s) => s.preload_certificate(url, pem),)+
                }
            }
        }
    };
}

// The registry: every scheme, once. A scheme of its own is a file (or a
// folder) implementing `Scheme`, its `mod` line above, and one line here.
// The order is the order of `SchemeKind::ALL` and of the choices in messages.
registry! {
    Standard => standard::Standard,
    Stripe => stripe::Stripe,
    Adyen => adyen::Adyen,
    WechatPay => wechatpay::WechatPay,
    Alipay => alipay::Alipay,
    Paypal => paypal::Paypal,
    Paddle => paddle::Paddle,
    Square => square::Square,
    Checkout => checkout::Checkout,
    Razorpay => razorpay::Razorpay,
    Mollie => mollie::Mollie,
}

impl SchemeKind {
    /// `scheme = "…"` in the providers file.
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// `standard | stripe | adyen | …`, for messages.
    pub fn choices() -> String {
        SchemeKind::ALL
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

impl FromStr for SchemeKind {
    type Err = String;

    fn from_str(s: &str) -> Result<SchemeKind, String> {
        SchemeKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not one of {}", SchemeKind::choices()))
    }
}

/// A configured provider: `POST /webhooks/{name}`.
#[derive(Clone)]
pub struct Provider {
    pub name: String,
    scheme: Configured,
    /// Settings that are allowed but probably a mistake, said at start.
    warnings: Vec<String>,
    /// Secrets and keys anyone could sign with (published, or too short):
    /// refused at start unless development is said (see [`Provider::exposures`]).
    exposures: Vec<String>,
    /// What a sender playing this provider's PSP signs with, as the file
    /// gives it, by the flag of its [`Key`]: the scheme's own types keep
    /// only the decoded keys.
    psp_side: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for Provider {
    // Secrets are never printed, not even in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name)
            .field("scheme", &self.scheme())
            .finish_non_exhaustive()
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// The development secret the README and `make run` use for the built-in
/// `generic` provider. Anyone can sign with it: serving it is refused
/// unless `FENCEHOOK_ALLOW_PUBLISHED_SECRETS` says this is development.
pub const DEV_SECRET: &str = "whsec_ZmVuY2Vob29rLWRldi1zZWNyZXQtZG8tbm90LXVzZQ==";

impl Provider {
    /// The built-in provider served when no providers file is given.
    pub fn generic(secret: &str) -> Result<Provider, String> {
        Provider::new("generic", SchemeKind::Standard, &[secret.to_owned()], None)
    }

    /// Settings of this provider that start but are probably a mistake.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Its secrets and keys that are published in fencehook's own files or
    /// shorter than their PSP issues, one line each naming the provider and
    /// the field. The configuration refuses a provider with any, unless
    /// `FENCEHOOK_ALLOW_PUBLISHED_SECRETS` is set.
    pub fn exposures(&self) -> &[String] {
        &self.exposures
    }

    /// One provider of a scheme whose settings are its HMAC keys and
    /// timestamp window in seconds (standard, stripe; adyen without a
    /// window). Errors name the provider and the field.
    pub fn new(
        name: &str,
        scheme: SchemeKind,
        hmac_keys: &[String],
        window_secs: Option<u64>,
    ) -> Result<Provider, String> {
        let table = hmac::table(hmac_keys, window_secs);
        Provider::build(name, scheme, table, Path::new(".")).map_err(String::from)
    }

    /// One provider, as its `[providers.<name>]` table describes it: its
    /// `scheme`, then the settings that scheme takes, read by the scheme
    /// ([`Scheme::Settings`]). Key files are read relative to `dir`. Errors
    /// name the provider and the field: `provider `shop`: <field>: ...`.
    pub fn from_table(
        name: &str,
        mut table: toml::Table,
        dir: &Path,
    ) -> Result<Provider, SettingErrors> {
        let error = |why: String| SettingErrors::one(format!("provider `{name}`: scheme: {why}"));
        let kind = match table.remove("scheme") {
            Some(toml::Value::String(s)) => s.parse::<SchemeKind>().map_err(error)?,
            Some(_) => {
                return Err(error(format!(
                    "must be a string ({})",
                    SchemeKind::choices()
                )))
            }
            None => return Err(error(format!("required ({})", SchemeKind::choices()))),
        };
        Provider::build(name, kind, table, dir)
    }

    /// A provider of scheme `kind` from the rest of its table.
    fn build(
        name: &str,
        kind: SchemeKind,
        table: toml::Table,
        dir: &Path,
    ) -> Result<Provider, SettingErrors> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        {
            return Err(SettingErrors::one(format!(
                "provider `{name}`: name must be [a-z0-9_-]+"
            )));
        }
        let short_secret = |secret: &str| kind.spec().short_secret(secret);
        let key_bytes = |secret: &str| kind.spec().key_bytes(secret);
        let mut setup = Setup::new(name, dir, unix_now(), &short_secret, &key_bytes);
        let scheme = kind.build(table, &mut setup)?;
        let found = setup.into_found();
        Ok(Provider {
            name: name.to_owned(),
            scheme,
            warnings: found.warnings,
            exposures: found.exposures,
            psp_side: found.psp_side,
        })
    }

    /// Every provider of a providers file's text.
    pub fn from_toml_str(text: &str) -> Result<Vec<Provider>, SettingErrors> {
        file::parse(text)
    }

    pub fn scheme(&self) -> SchemeKind {
        self.scheme.kind()
    }

    fn spec(&self) -> &'static Spec {
        self.scheme().spec()
    }

    /// What this provider's table gives of `key`, as written (what its
    /// scheme offered while the provider was built, `Setup::offer`): what
    /// the tools that play its PSP (`fencehook send`, `load`) sign with when
    /// no flag gives it. The service never reads it back.
    pub fn psp_value(&self, key: &Key) -> Option<&str> {
        self.psp_side
            .iter()
            .find(|(flag, _)| *flag == key.flag)
            .map(|(_, value)| value.as_str())
    }

    /// Whether a delivery carries the header its signature is read from, for
    /// the schemes that sign in a header; Adyen and Alipay sign inside the
    /// body, so always. Checked before a body is invited
    /// (`Expect: 100-continue`): a delivery that cannot be signed is
    /// answered 401 without asking for its body.
    pub fn has_signature_header(&self, headers: &http::HeaderMap) -> bool {
        match self.spec().signature_header {
            Some(name) => headers.contains_key(name),
            None => true,
        }
    }

    /// Whether a delivery's `Content-Type` is what this scheme's PSP posts:
    /// JSON (`application/json`, `application/*+json`) for every scheme but
    /// Alipay, whose notifications are `application/x-www-form-urlencoded`.
    /// Parameters (`; charset=utf-8`) are allowed; anything else is a 415.
    pub fn accepts_content_type(&self, headers: &http::HeaderMap) -> bool {
        let Some(ct) = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let essence = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        self.spec().accepts_content_type(&essence)
    }

    /// The PSP's own id of a delivery, where it has one: `webhook-id`
    /// (Standard Webhooks), the event's `id` (Stripe, PayPal), the
    /// notification's `id` (WeChat Pay), `notify_id` (Alipay). Adyen items
    /// carry none.
    /// Kept beside inbox events for searching; never used to deduplicate.
    pub fn psp_event_id(&self, headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
        self.spec().psp_event_id(headers, body)
    }

    /// Whether one delivery carries several independent items (Adyen's
    /// notification batches): an item that cannot be booked is then recorded
    /// and the batch acknowledged, rather than the whole delivery refused.
    pub fn is_batch(&self) -> bool {
        self.spec().batch
    }

    /// The body of an answer with this `result` (and `reason`, for a 400):
    /// `success` is true for a 2xx. Adyen marks a batch delivered on exactly
    /// `[accepted]`; Alipay a notification on exactly `success` (anything
    /// else, `fail` here, is retried); WeChat Pay wants an empty success and
    /// `{"code":"FAIL","message":…}` with any failure status. Standard,
    /// Stripe and PayPal read only the status: fencehook's own JSON.
    pub fn ack_body(&self, success: bool, result: &str, reason: Option<&str>) -> AckBody {
        self.spec().ack_body(success, result, reason)
    }

    /// Verifies the delivery and maps every item of it. `now` is unix seconds.
    ///
    /// Standard, Stripe, WeChat Pay and PayPal sign the raw bytes, which are
    /// checked before the body is parsed (WeChat's resource is decrypted
    /// after). Adyen signs fields of each item, so its body is parsed first,
    /// then every item is verified, then every item is mapped; Alipay signs
    /// the decoded form parameters, so the form is decoded (strictly) first.
    ///
    /// Async for PayPal alone, whose certificate may have to be fetched: the
    /// other schemes never wait, so their future is ready on its first poll.
    pub async fn accept(
        &self,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.scheme.accept(&self.name, headers, body, now).await
    }

    /// The transmission id of a delivery whose signature verified, to be
    /// bound to its body, for a scheme whose signature does not cover the
    /// body well (PayPal's covers only its CRC-32; see `paypal`'s docs).
    /// `None` for the other schemes.
    pub fn transmission(&self, headers: &http::HeaderMap, body: &[u8]) -> Option<TransmissionKey> {
        self.scheme.transmission(headers, body)
    }

    /// Whether deliveries are confirmed with the PSP's API before booking
    /// (PayPal with `confirm = "api"`).
    pub fn confirms(&self) -> bool {
        self.scheme.confirms()
    }

    /// Checks what the delivery mapped to against the PSP's API, when the
    /// provider [`confirms`](Provider::confirms). Ok for every other provider.
    pub async fn confirm(&self, body: &[u8], item: &Item) -> Result<(), Reject> {
        self.scheme.confirm(&self.name, body, item).await
    }

    /// Whether this provider can list its PSP's events (reconciliation).
    pub fn events_api(&self) -> EventsApi {
        self.scheme.events_api()
    }

    /// What the provider fetches from its PSP's API with while a delivery
    /// waits (a `mollie` provider's payments and refunds, a `stripe` one's
    /// thin events' objects when it has an `api_key`), for the service to
    /// count its fetches.
    pub fn fetcher(&self) -> Option<&fetch::Fetcher> {
        self.scheme.fetcher()
    }

    /// Every event its PSP's API lists in `window` that the mapping may
    /// book, oldest first (see [`Scheme::list_events`]).
    pub async fn list_events(&self, window: Window) -> Result<Vec<Listed>, ApiError> {
        self.scheme.list_events(window).await
    }

    /// A listed event mapped as a delivery of it would be.
    pub fn map_listed(&self, listed: &Listed) -> Result<Vec<Item>, Reject> {
        self.scheme.map_listed(&self.name, listed)
    }

    /// PayPal: puts a certificate in the provider's cache as if fetched from
    /// `url` (for tests whose deliveries name a PayPal URL).
    #[cfg(any(test, feature = "test-support"))]
    pub fn preload_paypal_certificate(&self, url: &str, pem: &[u8]) -> Result<(), String> {
        self.scheme
            .preload_certificate(url, pem)
            .unwrap_or_else(|| Err(format!("provider `{}` is not a paypal provider", self.name)))
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use futures_util::FutureExt;
    use proptest::prelude::*;
    use serde_json::Value;

    use super::keys::RsaSigner;
    use super::psp::{Credentials, Delivery, Key, Notice, PspError};
    use super::{Item, Reject, Scheme};
    use crate::domain::{CanonicalEvent, EventKind, ObjectKind};

    /// Transaction ids as a PSP may send them: 1 to 40 printable ASCII
    /// characters, no leading or trailing space.
    pub(crate) fn ids() -> impl Strategy<Value = String> + Clone {
        "[!-~]([ -~]{0,38}[!-~])?"
    }

    /// Canonical events of the `kinds` a scheme's PSP sends, with ids from
    /// `id`, amounts of 1 minor unit up to `max_amount`, in `currency`.
    /// Refunds and disputes name their payment (another id), payments none.
    /// `provider` is `p`; `occurred_at` is left for the scheme to say.
    pub(crate) fn events(
        kinds: &'static [EventKind],
        id: impl Strategy<Value = String> + Clone,
        max_amount: i64,
        currency: impl Strategy<Value = String>,
    ) -> impl Strategy<Value = CanonicalEvent> {
        (
            prop::sample::select(kinds),
            id.clone(),
            id,
            1..=max_amount,
            currency,
        )
            .prop_map(|(kind, transaction_id, parent, amount_minor, currency)| {
                CanonicalEvent {
                    provider: "p".to_owned(),
                    transaction_id,
                    event_type: kind,
                    amount_minor,
                    currency,
                    parent_transaction_id: (kind.object() != ObjectKind::Payment).then_some(parent),
                    occurred_at: None,
                    merchant_reference: None,
                    metadata: None,
                }
            })
    }

    /// What the tools ask a scheme's PSP side to send for `event`.
    pub(crate) fn notice_of(event: &CanonicalEvent) -> Notice {
        Notice {
            transaction_id: event.transaction_id.clone(),
            amount: event.amount_minor,
            currency: event.currency.clone(),
            event_type: event.event_type.as_str().to_owned(),
            payment_transaction_id: event.parent_transaction_id.clone(),
        }
    }

    /// What a provider of scheme `S` makes of `delivery` at `now`, as the
    /// HTTP edge hands it over (its content type checked first). Verification
    /// that has nothing to fetch never waits.
    pub(crate) fn received<S: Scheme>(
        scheme: &S,
        delivery: &Delivery,
        now: i64,
    ) -> Result<Vec<Item>, Reject> {
        assert!(
            S::accepts_content_type(delivery.content_type),
            "{} refuses its own content type {}",
            S::NAME,
            delivery.content_type
        );
        let mut headers = http::HeaderMap::new();
        for (name, value) in &delivery.headers {
            headers.insert(*name, value.parse().expect("a header value"));
        }
        scheme
            .accept("p", &headers, delivery.body.as_bytes(), now)
            .now_or_never()
            .expect("verification without a fetch never waits")
    }

    /// The round trip of one canonical event: built into the PSP's body and
    /// signed by `S`'s PSP side at `ts`, then verified and mapped by
    /// `scheme` at `ts`. The one event it maps back to, without its
    /// merchant side (`merchant_reference`, `metadata`): a notice names none,
    /// and what a PSP side makes up for it (Adyen's `order-…`) is no part of
    /// what is booked.
    pub(crate) fn round_trip<S: Scheme>(
        scheme: &S,
        psp: &dyn Credentials,
        event: &CanonicalEvent,
        ts: i64,
    ) -> Result<CanonicalEvent, TestCaseError> {
        let delivery_id = format!("{}round-trip", S::DELIVERY_ID_PREFIX);
        let delivery = S::deliver(psp, &notice_of(event), None, &delivery_id, ts)
            .map_err(|e| TestCaseError::fail(format!("{} builds no delivery: {e}", S::NAME)))?;
        match received(scheme, &delivery, ts) {
            Ok(items) => match items.as_slice() {
                [Item::Event(mapped)] => Ok(CanonicalEvent {
                    merchant_reference: None,
                    metadata: None,
                    ..mapped.clone()
                }),
                other => Err(TestCaseError::fail(format!("{other:?}"))),
            },
            Err(e) => Err(TestCaseError::fail(format!("{e}: {}", delivery.body))),
        }
    }

    /// A fixture of `scheme`'s, from `tests/fixtures/<scheme>/`.
    pub(crate) fn fixture(scheme: &str, name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/{scheme}/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Headers holding one: `name: value`.
    pub(crate) fn header(name: &'static str, value: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(name, value.parse().unwrap());
        h
    }

    /// (transaction_id, kind, parent, amount, currency) of an event.
    pub(crate) fn summary(e: &CanonicalEvent) -> (&str, EventKind, Option<&str>, i64, &str) {
        (
            &e.transaction_id,
            e.event_type,
            e.parent_transaction_id.as_deref(),
            e.amount_minor,
            &e.currency,
        )
    }

    /// A JSON `body` with the value at `path` (object keys) replaced.
    pub(crate) fn with(body: &[u8], path: &[&str], value: Value) -> Vec<u8> {
        let mut v: Value = serde_json::from_slice(body).unwrap();
        let mut at = &mut v;
        for p in &path[..path.len() - 1] {
            at = &mut at[*p];
        }
        at[path[path.len() - 1]] = value;
        serde_json::to_vec(&v).unwrap()
    }

    /// Unix seconds as an `occurred_at`.
    pub(crate) fn at(ts: i64) -> Option<time::OffsetDateTime> {
        time::OffsetDateTime::from_unix_timestamp(ts).ok()
    }

    /// The bounded case count of the round trips: each case signs (RSA for
    /// three schemes) and verifies once; unit tests must stay fast.
    pub(crate) fn round_trip_config() -> ProptestConfig {
        ProptestConfig::with_cases(64)
    }

    /// Credentials a test hands a scheme's PSP side directly.
    pub(crate) struct TestCredentials {
        keys: Vec<(Key, String)>,
        signer: Option<RsaSigner>,
    }

    impl TestCredentials {
        /// Giving each of `keys` its value, and signing with `signer`.
        pub(crate) fn new(keys: &[(Key, &str)], signer: Option<RsaSigner>) -> TestCredentials {
            TestCredentials {
                keys: keys.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
                signer,
            }
        }
    }

    impl Credentials for TestCredentials {
        fn key(&self, key: &Key) -> Result<&str, PspError> {
            self.keys
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
                .ok_or_else(|| PspError::new(key.flag, "none"))
        }
        fn signer(&self) -> Result<&RsaSigner, PspError> {
            self.signer
                .as_ref()
                .ok_or_else(|| PspError::new("private-key", "none"))
        }
    }

    /// JSON objects built from `keys` (and a few likely values) with arbitrary
    /// types at every level, so the mappings meet every wrong shape.
    pub(crate) fn arbitrary_json(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| {
                serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
            }),
            "[ -~]{0,12}".prop_map(Value::from),
            prop::sample::select(vec![
                "pi_1",
                "ch_1",
                "re_1",
                "eur",
                "EUR",
                "jpy",
                "succeeded",
                "payment_intent",
                "charge",
                "refund",
                "list",
                "true",
                "false",
                "AUTHORISATION",
                "REFUND",
                "REFUND_FAILED",
                "REFUNDED_REVERSED",
                "CANCEL_OR_REFUND",
                "CHARGEBACK",
                "CHARGEBACK_REVERSED",
                "SECOND_CHARGEBACK",
                "cancel",
                "dispute",
                "dp_1",
                "failed",
                "canceled",
                "pending",
            ])
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 64, 8, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop::sample::select(keys).prop_map(str::to_owned),
                    inner,
                    0..8,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn providers_file_errors_name_provider_and_field() {
        let err = file::parse("[providers.shop]\nscheme = \"standard\"\nsecrets = []\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("shop") && err.contains("secrets"), "{err}");
        let err = file::parse("[providers.shop]\nscheme = \"standard\"\nsecrets = [\"nope\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("shop") && err.contains("secrets"), "{err}");
        let ok = file::parse(
            "[providers.shop]\nscheme = \"standard\"\nsecrets = [\"whsec_c2VjcmV0LWtleS1vbGQ=\", \"whsec_c2VjcmV0LWtleS1uZXc=\"]\ntolerance_secs = 60\n",
        )
        .unwrap();
        assert_eq!(ok[0].name, "shop");
    }

    const ADYEN_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

    #[test]
    fn messages_that_name_every_scheme_are_made_from_the_registry_word_for_word() {
        assert_eq!(
            SchemeKind::choices(),
            "standard | stripe | adyen | wechatpay | alipay | paypal | paddle | square | checkout | razorpay | mollie"
        );
        let err = file::parse(
            "[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance = 5",
        )
        .unwrap_err();
        assert_eq!(
            err.lines(),
            ["provider `s`: tolerance: not a setting of scheme stripe; did you mean tolerance_secs? (it takes secrets, tolerance_secs, api_key, api_url)"]
        );
        let refund = psp::Notice {
            transaction_id: "re_1".into(),
            amount: 1,
            currency: "EUR".into(),
            event_type: "refund.succeeded".into(),
            payment_transaction_id: None,
        };
        assert_eq!(
            psp::parent(&refund).unwrap_err(),
            "--event-type refund.succeeded takes money from a payment: give it with --payment-transaction-id (a PaymentIntent or Charge id for stripe, the payment's pspReference for adyen, transaction_id for wechatpay, trade_no for alipay, the capture id for paypal, the transaction id (txn_…) for paddle, the payment's id for square, the payment's pay_ id for checkout, the payment's pay_ id for razorpay, the payment's tr_ id for mollie)"
        );
        let failure = psp::Notice {
            event_type: "payment.failed".into(),
            ..refund
        };
        assert_eq!(
            psp::not_sent("wechatpay", wechatpay::WechatPay::SENDS, &failure),
            "wechatpay sends no notification fencehook books as payment.failed; it sends payment.succeeded, refund.succeeded, refund.failed"
        );
        assert_eq!(
            psp::not_sent("paypal", paypal::Paypal::SENDS, &failure),
            "paypal sends no notification fencehook books as payment.failed; it sends payment.succeeded, payment.failed, refund.succeeded, dispute.funds_withdrawn"
        );
    }

    #[test]
    fn a_providers_file_declares_every_scheme() {
        let text = format!(
            r#"
[providers.generic]
scheme = "standard"
secrets = ["whsec_c2VjcmV0LWtleS1vbGQ="]

[providers.stripe]
scheme = "stripe"
secrets = ["whsec_new", "whsec_old"]
tolerance_secs = 600

[providers.adyen-eu]
scheme = "adyen"
secrets = ["{ADYEN_KEY}"]
"#
        );
        let providers = Provider::from_toml_str(&text).unwrap();
        let schemes: Vec<_> = providers
            .iter()
            .map(|p| (p.name.as_str(), p.scheme()))
            .collect();
        assert_eq!(
            schemes,
            vec![
                ("adyen-eu", SchemeKind::Adyen),
                ("generic", SchemeKind::Standard),
                ("stripe", SchemeKind::Stripe)
            ]
        );
    }

    #[test]
    fn every_providers_file_error_is_one_line_naming_provider_and_field() {
        for (text, field) in [
            ("[providers.s]\nscheme = \"not-a-scheme\"\nsecrets = [\"x\"]", "scheme"),
            ("[providers.s]\nsecrets = [\"x\"]", "scheme"),
            ("[providers.s]\nscheme = 5\nsecrets = [\"x\"]", "scheme"),
            ("[providers.s]\nscheme = \"stripe\"", "secrets"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = \"whsec_x\"", "secrets"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [1]", "secrets"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"sk_live_x\"]", "secrets"),
            ("[providers.s]\nscheme = \"adyen\"\nsecrets = [\"whsec_x\"]", "secrets"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance_secs = -1", "tolerance_secs"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance_secs = 0", "tolerance_secs"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance_secs = 4000000000", "tolerance_secs"),
            ("[providers.s]\nscheme = \"standard\"\nsecrets = [\"whsec_c2VjcmV0LWtleS1vbGQ=\"]\ntolerance_secs = 9223372036854775807", "tolerance_secs"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance_secs = \"5m\"", "tolerance_secs"),
            (&format!("[providers.s]\nscheme = \"adyen\"\nsecrets = [\"{ADYEN_KEY}\"]\ntolerance_secs = 300"), "tolerance_secs"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance = 5", "tolerance"),
            ("[providers.s]\nscheme = \"paypal\"\nwebhook_id = \"WH-1\"\nmax_age_secs = 0", "max_age_secs"),
            ("[providers.s]\nscheme = \"paypal\"\nwebhook_id = \"WH-1\"\nmax_age_secs = -5", "max_age_secs"),
            ("[providers.s]\nscheme = \"paypal\"\nwebhook_id = \"WH-1\"\nfuture_skew_secs = 86400", "future_skew_secs"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\nmax_age_secs = 60", "max_age_secs"),
            ("[providers.s]\nscheme = \"paypal\"\nwebhook_id = \"WH-1\"\nconfirm = \"maybe\"", "confirm"),
            ("[providers.s]\nscheme = \"paypal\"\nwebhook_id = \"WH-1\"\nclient_id = \"abc\"", "client_secret"),
            ("[providers.s]\nscheme = \"paypal\"\nwebhook_id = \"WH-1\"\nconfirm = \"api\"\nclient_secret = \"x\"", "client_id"),
            ("[providers.s]\nscheme = \"paypal\"\nwebhook_id = \"WH-1\"\nconfirm = \"api\"\nclient_id = \"abc\"", "client_secret"),
            ("[providers.s]\nscheme = \"paypal\"\nwebhook_id = \"WH-1\"\nconfirm = \"api\"\nclient_id = \"abc\"\nclient_secret = \"x\"\napi_url = \"https://api-m.paypal.com\"", "api_url"),
        ] {
            let err = file::parse(text).unwrap_err();
            assert!(
                matches!(err.lines(), [line] if line.starts_with(&format!("provider `s`: {field}:")) && !line.contains('\n')),
                "{text}: {err}"
            );
        }
        assert!(file::parse("").is_err());
        assert!(file::parse("[other]\n").is_err());
    }

    #[test]
    fn debug_output_never_shows_a_secret() {
        let p = Provider::new("s", SchemeKind::Stripe, &["whsec_topsecret".into()], None).unwrap();
        let shown = format!("{p:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
        let p = Provider::new("a", SchemeKind::Adyen, &[ADYEN_KEY.into()], None).unwrap();
        assert!(!format!("{p:?}").contains("44782DEF"));
    }

    /// One provider of every scheme, the RSA ones with test keys.
    fn every_scheme() -> Vec<Provider> {
        let key = testkeys::public_key_pem(0);
        let mut all = vec![
            Provider::generic("whsec_c2VjcmV0LWtleS1vbGQ=").unwrap(),
            Provider::new("s", SchemeKind::Stripe, &["whsec_x".into()], None).unwrap(),
            Provider::new("a", SchemeKind::Adyen, &[ADYEN_KEY.into()], None).unwrap(),
            Provider::new("pd", SchemeKind::Paddle, &["pdl_ntf_x".into()], None).unwrap(),
            Provider::new(
                "c",
                SchemeKind::Checkout,
                &["fencehook-checkout-unit-key".into()],
                None,
            )
            .unwrap(),
            Provider::new(
                "r",
                SchemeKind::Razorpay,
                &["fencehook-razorpay-unit-secret".into()],
                None,
            )
            .unwrap(),
        ];
        all.extend(
            Provider::from_toml_str(
                "[providers.sq]\nscheme = \"square\"\nsecrets = [\"k\"]\nnotification_url = \"https://x.example/sq\"",
            )
            .unwrap(),
        );
        let rsa = testkeys::providers_file(
            r#"
[providers.w]
scheme = "wechatpay"
secrets = ["0123456789abcdef0123456789abcdef"]
platform_keys = { PUB_KEY_ID_1 = "key.pem" }

[providers.alipay]
scheme = "alipay"
app_id = "2021000000000000"
public_keys = ["key.pem"]

[providers.p]
scheme = "paypal"
webhook_id = "WH-1"
"#,
            &[("key.pem", key.as_bytes())],
        );
        all.extend(rsa.unwrap());
        all
    }

    #[test]
    fn a_providers_file_reads_the_rsa_schemes_key_files_relative_to_itself() {
        let dir = std::env::temp_dir().join(format!(
            "fencehook-providers-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(dir.join("keys")).unwrap();
        let serial = "5157F09EFDC096DE15EBE81A47057A7232F1B8E1";
        std::fs::write(
            dir.join("keys/platform.pem"),
            testkeys::certificate(0, serial, "CN=Tenpay.com", 0, 4_000_000_000),
        )
        .unwrap();
        std::fs::write(dir.join("keys/pub.pem"), testkeys::public_key_pem(1)).unwrap();
        std::fs::write(dir.join("keys/alipay.txt"), testkeys::public_key_base64(0)).unwrap();
        let text = format!(
            r#"
[providers.wechat]
scheme = "wechatpay"
secrets = ["0123456789abcdef0123456789abcdef"]
platform_keys = {{ "{serial}" = "keys/platform.pem", "PUB_KEY_ID_0001" = "keys/pub.pem" }}
tolerance_secs = 300

[providers.alipay]
scheme = "alipay"
app_id = "2021000000000000"
public_keys = ["keys/alipay.txt", "keys/pub.pem"]

[providers.paypal]
scheme = "paypal"
webhook_id = "WH-1"
cert_url_prefixes = ["https://api.paypal.com/"]
"#
        );
        let path = dir.join("providers.toml");
        std::fs::write(&path, &text).unwrap();
        let providers = load_file(&path).unwrap();
        let schemes: Vec<_> = providers.iter().map(|p| p.scheme()).collect();
        assert_eq!(
            schemes,
            vec![
                SchemeKind::Alipay,
                SchemeKind::Paypal,
                SchemeKind::WechatPay
            ]
        );
        // A missing file and a certificate under another serial name their field.
        std::fs::write(&path, text.replace("keys/alipay.txt", "keys/missing.txt")).unwrap();
        let err = load_file(&path).unwrap_err().to_string();
        assert!(err.contains("provider `alipay`: public_keys:"), "{err}");
        std::fs::write(&path, text.replace(serial, "ABCDEF")).unwrap();
        let err = load_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("provider `wechat`: platform_keys: ABCDEF:"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn each_scheme_takes_its_own_content_type() {
        let with = |ct: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
            h
        };
        for p in every_scheme() {
            let form = p.scheme() == SchemeKind::Alipay;
            assert_eq!(p.accepts_content_type(&with("application/json")), !form);
            assert_eq!(
                p.accepts_content_type(&with("application/json; charset=utf-8")),
                !form
            );
            assert_eq!(
                p.accepts_content_type(&with("application/x-www-form-urlencoded; charset=utf-8")),
                form
            );
            assert!(!p.accepts_content_type(&with("text/plain")));
            assert!(!p.accepts_content_type(&http::HeaderMap::new()));
        }
    }

    #[test]
    fn each_psp_gets_the_answer_body_it_reads() {
        let p = every_scheme();
        let by = |k: SchemeKind| p.iter().find(|p| p.scheme() == k).unwrap();
        assert_eq!(
            by(SchemeKind::Alipay).ack_body(true, "processed", None),
            AckBody::Text("success")
        );
        assert_eq!(
            by(SchemeKind::Alipay).ack_body(false, "invalid_payload", Some("x")),
            AckBody::Text("fail")
        );
        assert_eq!(
            by(SchemeKind::WechatPay).ack_body(true, "duplicate", None),
            AckBody::Empty
        );
        assert_eq!(
            by(SchemeKind::WechatPay).ack_body(false, "invalid_payload", Some("amount")),
            AckBody::Json(json!({"code": "FAIL", "message": "invalid_payload: amount"}))
        );
        assert_eq!(
            by(SchemeKind::Paypal).ack_body(true, "processed", None),
            AckBody::Json(json!({"result": "processed"}))
        );
    }

    #[test]
    fn rsa_schemes_take_only_their_own_settings() {
        let key = testkeys::public_key_pem(0);
        let err = |table: &str| {
            let text = format!("[providers.p]\n{table}");
            let errors =
                testkeys::providers_file(&text, &[("key.pem", key.as_bytes())]).unwrap_err();
            assert_eq!(errors.lines().len(), 1, "{errors}");
            errors.lines()[0].clone()
        };
        let e = err("scheme = \"alipay\"\napp_id = \"2021000000000000\"\npublic_keys = [\"key.pem\"]\nsecrets = [\"x\"]");
        assert!(
            e.starts_with("provider `p`: secrets: not a setting of scheme alipay (it takes app_id, public_keys)"),
            "{e}"
        );
        let e = err("scheme = \"alipay\"");
        assert!(e.starts_with("provider `p`: app_id: required"), "{e}");
        let e = err("scheme = \"paypal\"");
        assert!(e.starts_with("provider `p`: webhook_id: required"), "{e}");
        let e = err("scheme = \"wechatpay\"\nsecrets = [\"0123456789abcdef0123456789abcdef\"]");
        assert!(
            e.starts_with("provider `p`: platform_keys: required"),
            "{e}"
        );
        let e = err("scheme = \"stripe\"\nsecrets = [\"whsec_x\"]\nwebhook_id = \"WH-1\"");
        assert!(
            e.starts_with("provider `p`: webhook_id: not a setting"),
            "{e}"
        );
        let local = Provider::from_toml_str(
            "[providers.p]\nscheme = \"paypal\"\nwebhook_id = \"WH-1\"\ncert_url_prefixes = [\"http://127.0.0.1:9/\"]",
        )
        .unwrap();
        assert!(
            local[0].warnings()[0].contains("http://"),
            "{:?}",
            local[0].warnings()
        );
    }

    #[test]
    fn every_provider_of_a_file_and_every_unknown_key_is_reported_in_one_read() {
        let errors = file::parse(
            r#"
[extra]
[providers.a]
scheme = "stripe"
secrets = ["whsec_x"]
tolerence_secs = 60
webhook = "x"

[providers.b]
scheme = "stripe"

[providers.c]
scheme = "stripe"
secrets = ["whsec_x"]
"#,
        )
        .unwrap_err();
        assert_eq!(
            errors.lines(),
            [
                "`extra`: unknown table; providers go in [providers.<name>]",
                "provider `a`: tolerence_secs: not a setting of scheme stripe; did you mean tolerance_secs? (it takes secrets, tolerance_secs, api_key, api_url)",
                "provider `a`: webhook: not a setting of scheme stripe (it takes secrets, tolerance_secs, api_key, api_url)",
                "provider `b`: secrets: required (a list of strings)",
            ]
        );
        let syntax = file::parse("[providers.a]\nscheme = stripe\n").unwrap_err();
        assert!(
            syntax.lines()[0].starts_with("not TOML: line 2, column 10: "),
            "{syntax}"
        );
    }

    #[test]
    fn debug_output_never_shows_an_apiv3_key() {
        let p = every_scheme();
        for p in &p {
            let shown = format!("{p:?}");
            assert!(!shown.contains("0123456789abcdef"), "{shown}");
        }
    }

    #[test]
    fn a_deeply_nested_body_is_a_400_for_every_scheme() {
        let deep = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
        assert!(matches!(
            standard::parse_generic("generic", deep.as_bytes()),
            Err(Reject::Invalid(_))
        ));
        assert!(matches!(
            stripe::parse_event("stripe", deep.as_bytes()),
            Err(Reject::Invalid(_))
        ));
        let p = Provider::new("a", SchemeKind::Adyen, &[ADYEN_KEY.into()], None).unwrap();
        assert!(matches!(
            ready(p.accept(&http::HeaderMap::new(), deep.as_bytes(), 0)),
            Err(Reject::Invalid(_))
        ));
        // Signed, through the whole of accept: still a 400.
        let s = Provider::new("s", SchemeKind::Stripe, &["whsec_x".into()], None).unwrap();
        let mut h = http::HeaderMap::new();
        h.insert(
            stripe::SIGNATURE_HEADER,
            stripe::sign("whsec_x", 1000, deep.as_bytes())
                .unwrap()
                .parse()
                .unwrap(),
        );
        assert!(matches!(
            ready(s.accept(&h, deep.as_bytes(), 1000)),
            Err(Reject::Invalid(_))
        ));
    }

    /// The output of a future that must not wait (every scheme but a PayPal
    /// certificate fetch): the HMAC schemes pay nothing for `accept` being async.
    fn ready<F: std::future::Future>(f: F) -> F::Output {
        use futures_util::FutureExt;
        f.now_or_never()
            .expect("verification without a fetch never waits")
    }

    proptest::proptest! {
        #[test]
        fn no_scheme_panics_on_arbitrary_headers_and_bytes(
            headers in proptest::collection::vec(
                (proptest::sample::select(vec![
                    "webhook-id", "webhook-timestamp", "webhook-signature", "stripe-signature",
                    "content-type", wechatpay::TIMESTAMP_HEADER, wechatpay::NONCE_HEADER,
                    wechatpay::SIGNATURE_HEADER, wechatpay::SERIAL_HEADER,
                    paypal::TRANSMISSION_ID_HEADER, paypal::TRANSMISSION_TIME_HEADER,
                    paypal::TRANSMISSION_SIG_HEADER, paypal::CERT_URL_HEADER,
                    paypal::AUTH_ALGO_HEADER, paddle::SIGNATURE_HEADER,
                    square::SIGNATURE_HEADER,
                    checkout::SIGNATURE_HEADER,
                    razorpay::SIGNATURE_HEADER, razorpay::EVENT_ID_HEADER,
                ]), proptest::collection::vec(proptest::num::u8::ANY, 0..120)),
                0..5,
            ),
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            now in proptest::num::i64::ANY,
        ) {
            let mut h = http::HeaderMap::new();
            for (name, value) in headers {
                if let Ok(v) = http::HeaderValue::from_bytes(&value) {
                    h.append(name, v);
                }
            }
            for p in every_scheme() {
                // No header can name a URL under PayPal's prefixes here, so
                // no scheme waits.
                let _ = ready(p.accept(&h, &body, now));
            }
        }
    }
}
