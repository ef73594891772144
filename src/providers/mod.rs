//! Provider adapters: verify a delivery's signature, then map its payload to
//! [`CanonicalEvent`]s (the domain's one event shape). Nothing here touches the lease or the database; a
//! delivery that fails here writes nothing.
//!
//! One file per scheme:
//!
//! - [`standard`]: Standard Webhooks headers, the generic payload;
//! - [`stripe`]: `Stripe-Signature`, Stripe events: payments keyed by the
//!   PaymentIntent, refunds and disputes by their own ids;
//! - [`adyen`]: notification batches, one HMAC per item.
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
//! - One delivery may map to several items: every item of an Adyen batch, and
//!   every succeeded refund of a Stripe `charge.refunded`.
//! - Secrets never leave this module: [`Provider`]'s `Debug` hides them and no
//!   [`Reject`] message contains one.

pub mod adyen;
mod fields;
mod file;
mod hmac;
pub mod standard;
pub mod stripe;

use std::str::FromStr;

use serde_json::json;

pub use self::fields::{check_currency, check_transaction_id};
pub use self::file::load_file;
use crate::domain::CanonicalEvent;

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
        /// The item's id, when it could be read.
        transaction_id: Option<String>,
        /// The item as received (JSON), for the operator.
        raw: String,
    },
    /// A well-signed event fencehook does not act on: a type it does not
    /// book, or a state that moves no money (a pending refund, an uncaptured
    /// charge, a zero-value authorisation). Answered 200, nothing written.
    Ignored {
        event_type: String,
    },
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
}

/// How a provider signs and shapes its deliveries (`scheme` in the providers file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemeKind {
    Standard,
    Stripe,
    Adyen,
}

impl SchemeKind {
    pub const ALL: &'static [SchemeKind] =
        &[SchemeKind::Standard, SchemeKind::Stripe, SchemeKind::Adyen];

    pub fn as_str(self) -> &'static str {
        match self {
            SchemeKind::Standard => "standard",
            SchemeKind::Stripe => "stripe",
            SchemeKind::Adyen => "adyen",
        }
    }

    /// `standard | stripe | adyen`, for messages.
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

/// The body of an answer, in the shape the provider's PSP expects.
#[derive(Debug, Clone, PartialEq)]
pub enum AckBody {
    /// fencehook's own `{"result": …, "reason": …}`.
    Json(serde_json::Value),
    /// A fixed text some PSPs require (Adyen's `[accepted]`).
    Text(&'static str),
}

/// A configured provider: `POST /webhooks/{name}`.
#[derive(Clone)]
pub struct Provider {
    pub name: String,
    scheme: Scheme,
    /// Settings that are allowed but probably a mistake, said at start.
    warnings: Vec<String>,
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

#[derive(Clone)]
enum Scheme {
    Standard(standard::Standard),
    Stripe(stripe::Stripe),
    Adyen(adyen::Adyen),
}

/// Timestamp window of the schemes that sign one (Standard Webhooks, Stripe).
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// Above this, a timestamp window no longer protects against replays in any
/// useful sense. Allowed (verifying a PSP's test vectors from years ago needs
/// it), but warned about at start.
pub const TOLERANCE_WARN_SECS: u64 = 3600;

/// The development secret the README and `make run` use for the built-in
/// `generic` provider. Anyone can sign with it: serving it is warned about.
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

    /// One provider, as a `[providers.<name>]` table describes it. Errors name
    /// the provider and the field: `provider `shop`: secrets: ...`.
    pub fn new(
        name: &str,
        scheme: SchemeKind,
        secrets: &[String],
        tolerance_secs: Option<u64>,
    ) -> Result<Provider, String> {
        let field = |field: &str, e: String| format!("provider `{name}`: {field}: {e}");
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        {
            return Err(format!("provider `{name}`: name must be [a-z0-9_-]+"));
        }
        if secrets.is_empty() {
            return Err(field("secrets", "at least one secret is required".into()));
        }
        if tolerance_secs == Some(0) {
            return Err(field("tolerance_secs", "must be above 0".into()));
        }
        let tolerance = tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS);
        let scheme = match scheme {
            SchemeKind::Standard => Scheme::Standard(
                standard::Standard::new(secrets, tolerance).map_err(|e| field("secrets", e))?,
            ),
            SchemeKind::Stripe => Scheme::Stripe(
                stripe::Stripe::new(secrets, tolerance).map_err(|e| field("secrets", e))?,
            ),
            SchemeKind::Adyen => {
                if tolerance_secs.is_some() {
                    return Err(field(
                        "tolerance_secs",
                        "adyen notifications carry no signed timestamp; remove the setting".into(),
                    ));
                }
                Scheme::Adyen(adyen::Adyen::new(secrets).map_err(|e| field("secrets", e))?)
            }
        };
        let mut warnings = Vec::new();
        if tolerance > TOLERANCE_WARN_SECS && !matches!(scheme, Scheme::Adyen(_)) {
            warnings.push(format!(
                "provider `{name}`: tolerance_secs = {tolerance}: signed deliveries stay replayable for that long (keep it at most {TOLERANCE_WARN_SECS} in production)"
            ));
        }
        if secrets.iter().any(|s| s == DEV_SECRET) {
            warnings.push(format!(
                "provider `{name}`: serves the DEVELOPMENT secret published in the README: anyone can sign deliveries; never use it in production"
            ));
        }
        Ok(Provider {
            name: name.to_owned(),
            scheme,
            warnings,
        })
    }

    /// Every provider of a providers file's text.
    pub fn from_toml_str(text: &str) -> Result<Vec<Provider>, String> {
        file::parse(text)
    }

    pub fn scheme(&self) -> SchemeKind {
        match &self.scheme {
            Scheme::Standard(_) => SchemeKind::Standard,
            Scheme::Stripe(_) => SchemeKind::Stripe,
            Scheme::Adyen(_) => SchemeKind::Adyen,
        }
    }

    /// The PSP's own id of a delivery, where it has one: `webhook-id`
    /// (Standard Webhooks), the event's `id` (Stripe). Adyen items carry none.
    /// Kept beside inbox events for searching; never used to deduplicate.
    pub fn psp_event_id(&self, headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
        match &self.scheme {
            Scheme::Standard(_) => headers
                .get("webhook-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            Scheme::Stripe(_) => {
                #[derive(serde::Deserialize)]
                struct Envelope {
                    id: String,
                }
                serde_json::from_slice::<Envelope>(body).ok().map(|e| e.id)
            }
            Scheme::Adyen(_) => None,
        }
    }

    /// Whether one delivery carries several independent items (Adyen's
    /// notification batches): an item that cannot be booked is then recorded
    /// and the batch acknowledged, rather than the whole delivery refused.
    pub fn is_batch(&self) -> bool {
        matches!(self.scheme, Scheme::Adyen(_))
    }

    /// The body of an answer with this `result` (and `reason`, for a 400):
    /// `success` is true for a 2xx. Only Adyen differs: it marks a batch
    /// delivered on exactly `[accepted]`.
    pub fn ack_body(&self, success: bool, result: &str, reason: Option<&str>) -> AckBody {
        match (&self.scheme, success) {
            (Scheme::Adyen(_), true) => AckBody::Text(adyen::ACCEPTED),
            _ => AckBody::Json(match reason {
                Some(reason) => json!({ "result": result, "reason": reason }),
                None => json!({ "result": result }),
            }),
        }
    }

    /// Verifies the delivery and maps every item of it. `now` is unix seconds.
    ///
    /// Standard and Stripe sign the raw bytes, which are checked before the
    /// body is parsed. Adyen signs fields of each item, so its body is parsed
    /// first, then every item is verified, then every item is mapped.
    pub fn accept(
        &self,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Vec<Item>, Reject> {
        match &self.scheme {
            Scheme::Standard(s) => {
                s.verify(headers, body, now)?;
                Ok(vec![standard::parse_generic(&self.name, body)?])
            }
            Scheme::Stripe(s) => {
                s.verify(headers, body, now)?;
                stripe::parse_event(&self.name, body)
            }
            Scheme::Adyen(a) => a.accept(&self.name, body),
        }
    }
}

/// Generators shared by the schemes' property tests.
#[cfg(test)]
pub(crate) mod testing {
    use proptest::prelude::*;
    use serde_json::Value;

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
    use super::*;

    #[test]
    fn providers_file_errors_name_provider_and_field() {
        let err =
            file::parse("[providers.shop]\nscheme = \"standard\"\nsecrets = []\n").unwrap_err();
        assert!(err.contains("shop") && err.contains("secrets"), "{err}");
        let err = file::parse("[providers.shop]\nscheme = \"standard\"\nsecrets = [\"nope\"]\n")
            .unwrap_err();
        assert!(err.contains("shop") && err.contains("secrets"), "{err}");
        let ok = file::parse(
            "[providers.shop]\nscheme = \"standard\"\nsecrets = [\"whsec_c2VjcmV0LWtleS1vbGQ=\", \"whsec_c2VjcmV0LWtleS1uZXc=\"]\ntolerance_secs = 60\n",
        )
        .unwrap();
        assert_eq!(ok[0].name, "shop");
    }

    const ADYEN_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

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
            ("[providers.s]\nscheme = \"paypal\"\nsecrets = [\"x\"]", "scheme"),
            ("[providers.s]\nsecrets = [\"x\"]", "scheme"),
            ("[providers.s]\nscheme = 5\nsecrets = [\"x\"]", "scheme"),
            ("[providers.s]\nscheme = \"stripe\"", "secrets"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = \"whsec_x\"", "secrets"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [1]", "secrets"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"sk_live_x\"]", "secrets"),
            ("[providers.s]\nscheme = \"adyen\"\nsecrets = [\"whsec_x\"]", "secrets"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance_secs = -1", "tolerance_secs"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance_secs = 0", "tolerance_secs"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance_secs = \"5m\"", "tolerance_secs"),
            (&format!("[providers.s]\nscheme = \"adyen\"\nsecrets = [\"{ADYEN_KEY}\"]\ntolerance_secs = 300"), "tolerance_secs"),
            ("[providers.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\ntolerance = 5", "tolerance"),
        ] {
            let err = file::parse(text).unwrap_err();
            assert!(
                err.starts_with(&format!("provider `s`: {field}:")) && !err.contains('\n'),
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
            p.accept(&http::HeaderMap::new(), deep.as_bytes(), 0),
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
            s.accept(&h, deep.as_bytes(), 1000),
            Err(Reject::Invalid(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn no_scheme_panics_on_arbitrary_headers_and_bytes(
            headers in proptest::collection::vec(
                (proptest::sample::select(vec![
                    "webhook-id", "webhook-timestamp", "webhook-signature", "stripe-signature",
                    "content-type",
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
            for p in [
                Provider::generic("whsec_c2VjcmV0LWtleS1vbGQ=").unwrap(),
                Provider::new("s", SchemeKind::Stripe, &["whsec_x".into()], None).unwrap(),
                Provider::new("a", SchemeKind::Adyen, &[ADYEN_KEY.into()], None).unwrap(),
            ] {
                let _ = p.accept(&h, &body, now);
            }
        }
    }
}
