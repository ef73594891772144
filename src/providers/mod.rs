//! Provider adapters: verify a delivery's signature, then map its payload to
//! [`CanonicalEvent`]s. Nothing here touches the lease or the database; a
//! delivery that fails here writes nothing.
//!
//! One file per scheme (SPEC §4):
//!
//! - [`standard`]: Standard Webhooks headers, the generic payload;
//! - [`stripe`]: `Stripe-Signature`, Stripe events keyed by the PaymentIntent;
//! - [`adyen`]: notification batches, one HMAC per item.
//!
//! # What must stay true
//!
//! - Verification and mapping never panic, whatever the bytes (proptest below
//!   and in each scheme's tests feeds them arbitrary input).
//! - A delivery is accepted whole or refused whole: [`Provider::accept`]
//!   verifies and maps *every* item before it returns, so one bad item in a
//!   batch rejects the batch before anything is written.
//! - Secrets never leave this module: [`Provider`]'s `Debug` hides them and no
//!   [`Reject`] message contains one.

pub mod adyen;
mod fields;
pub mod standard;
pub mod stripe;

use std::path::Path;

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

/// A verified item of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Event(CanonicalEvent),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemeKind {
    Standard,
    Stripe,
    Adyen,
}

impl SchemeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SchemeKind::Standard => "standard",
            SchemeKind::Stripe => "stripe",
            SchemeKind::Adyen => "adyen",
        }
    }
}

/// A configured provider: `POST /webhooks/{name}`.
#[derive(Clone)]
pub struct Provider {
    pub name: String,
    scheme: Scheme,
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

impl Provider {
    /// The built-in provider served when no providers file is given.
    pub fn generic(secret: &str) -> Result<Provider, String> {
        Ok(Provider {
            name: "generic".to_owned(),
            scheme: Scheme::Standard(standard::Standard::new(
                &[secret.to_owned()],
                DEFAULT_TOLERANCE_SECS,
            )?),
        })
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
        Ok(Provider {
            name: name.to_owned(),
            scheme,
        })
    }

    /// Every provider of a providers file's text (SPEC §5).
    pub fn from_toml_str(text: &str) -> Result<Vec<Provider>, String> {
        parse_file(text)
    }

    pub fn scheme(&self) -> SchemeKind {
        match &self.scheme {
            Scheme::Standard(_) => SchemeKind::Standard,
            Scheme::Stripe(_) => SchemeKind::Stripe,
            Scheme::Adyen(_) => SchemeKind::Adyen,
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
                Ok(vec![stripe::parse_event(&self.name, body)?])
            }
            Scheme::Adyen(a) => a.accept(&self.name, body),
        }
    }
}

/// Reads a providers file (SPEC §5). Errors name the provider and the field.
pub fn load_file(path: &Path) -> Result<Vec<Provider>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The settings a `[providers.<name>]` table may hold.
const ENTRY_FIELDS: &[&str] = &["scheme", "secrets", "tolerance_secs"];

// Read by hand rather than with a derived `Deserialize`: serde's messages say
// "invalid type: integer, expected a string" without the field, and every
// error here must name the provider and the field.
fn parse_file(text: &str) -> Result<Vec<Provider>, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| e.message().to_owned())?;
    for key in doc.keys() {
        if key != "providers" {
            return Err(format!(
                "`{key}`: unknown table; providers go in [providers.<name>]"
            ));
        }
    }
    let providers = match doc.get("providers") {
        Some(toml::Value::Table(t)) if !t.is_empty() => t,
        Some(toml::Value::Table(_)) | None => return Err("no [providers.<name>] table".to_owned()),
        Some(_) => return Err("`providers` must be a table of [providers.<name>]".to_owned()),
    };
    let mut out = Vec::new();
    for (name, entry) in providers {
        let in_provider = |field: &str, e: &str| format!("provider `{name}`: {field}: {e}");
        let toml::Value::Table(entry) = entry else {
            return Err(format!(
                "provider `{name}`: must be a [providers.{name}] table"
            ));
        };
        if let Some(unknown) = entry.keys().find(|k| !ENTRY_FIELDS.contains(&k.as_str())) {
            return Err(in_provider(
                unknown,
                "unknown setting (expected scheme, secrets, tolerance_secs)",
            ));
        }
        let scheme = match entry.get("scheme") {
            None => {
                return Err(in_provider(
                    "scheme",
                    "required (standard | stripe | adyen)",
                ))
            }
            Some(toml::Value::String(s)) => match s.as_str() {
                "standard" => SchemeKind::Standard,
                "stripe" => SchemeKind::Stripe,
                "adyen" => SchemeKind::Adyen,
                other => {
                    return Err(in_provider(
                        "scheme",
                        &format!("`{other}` is not one of standard | stripe | adyen"),
                    ))
                }
            },
            Some(_) => return Err(in_provider("scheme", "must be a string")),
        };
        let secrets = match entry.get("secrets") {
            None => return Err(in_provider("secrets", "required (a list of strings)")),
            Some(toml::Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| in_provider("secrets", "every secret must be a string"))?,
            Some(_) => return Err(in_provider("secrets", "must be a list of strings")),
        };
        let tolerance_secs = match entry.get("tolerance_secs") {
            None => None,
            Some(toml::Value::Integer(n)) => Some(
                u64::try_from(*n)
                    .map_err(|_| in_provider("tolerance_secs", "must not be negative"))?,
            ),
            Some(_) => {
                return Err(in_provider(
                    "tolerance_secs",
                    "must be an integer (seconds)",
                ))
            }
        };
        out.push(Provider::new(name, scheme, &secrets, tolerance_secs)?);
    }
    Ok(out)
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
            parse_file("[providers.shop]\nscheme = \"standard\"\nsecrets = []\n").unwrap_err();
        assert!(err.contains("shop") && err.contains("secrets"), "{err}");
        let err = parse_file("[providers.shop]\nscheme = \"standard\"\nsecrets = [\"nope\"]\n")
            .unwrap_err();
        assert!(err.contains("shop") && err.contains("secrets"), "{err}");
        let ok = parse_file(
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
            let err = parse_file(text).unwrap_err();
            assert!(
                err.starts_with(&format!("provider `s`: {field}:")) && !err.contains('\n'),
                "{text}: {err}"
            );
        }
        assert!(parse_file("").is_err());
        assert!(parse_file("[other]\n").is_err());
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
}
