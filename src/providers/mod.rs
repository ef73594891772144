//! Provider adapters: verify a delivery's signature over the raw bytes, then
//! map its payload to one [`CanonicalEvent`]. Nothing here touches the lease or
//! the database; a delivery that fails here writes nothing.
//!
//! Schemes built: `standard` (Standard Webhooks, with the generic payload).
//! `stripe` and `adyen` are named in SPEC §4 and are not built yet: a providers
//! file that asks for them is refused at start.

pub mod standard;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
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
    /// A well-signed event of a type fencehook does not act on.
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemeKind {
    Standard,
    Stripe,
    Adyen,
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
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
enum Scheme {
    Standard(standard::Standard),
}

impl Provider {
    /// The built-in provider served when no providers file is given.
    pub fn generic(secret: &str) -> Result<Provider, String> {
        Ok(Provider {
            name: "generic".to_owned(),
            scheme: Scheme::Standard(standard::Standard::new(&[secret.to_owned()], 300)?),
        })
    }

    /// Verifies the signature over the raw body, then maps the payload.
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
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProvidersFile {
    providers: BTreeMap<String, ProviderEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderEntry {
    scheme: SchemeKind,
    secrets: Vec<String>,
    tolerance_secs: Option<u64>,
}

/// Reads a providers file (SPEC §5). Errors name the provider and the field.
pub fn load_file(path: &Path) -> Result<Vec<Provider>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse_file(text: &str) -> Result<Vec<Provider>, String> {
    let file: ProvidersFile = toml::from_str(text).map_err(|e| e.message().to_owned())?;
    if file.providers.is_empty() {
        return Err("no [providers.<name>] table".to_owned());
    }
    let mut out = Vec::new();
    for (name, entry) in file.providers {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        {
            return Err(format!("provider `{name}`: name must be [a-z0-9_-]+"));
        }
        if entry.secrets.is_empty() {
            return Err(format!(
                "provider `{name}`: secrets: at least one secret is required"
            ));
        }
        let scheme = match entry.scheme {
            SchemeKind::Standard => Scheme::Standard(
                standard::Standard::new(&entry.secrets, entry.tolerance_secs.unwrap_or(300))
                    .map_err(|e| format!("provider `{name}`: secrets: {e}"))?,
            ),
            SchemeKind::Stripe | SchemeKind::Adyen => {
                return Err(format!(
                    "provider `{name}`: scheme: stripe and adyen are not built yet"
                ))
            }
        };
        out.push(Provider { name, scheme });
    }
    Ok(out)
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
