//! Standard Webhooks (`standard` scheme) and the generic payload schema.
//!
//! Signature: `webhook-signature` holds space-separated `v1,<base64>` entries,
//! each an HMAC-SHA256 over `{webhook-id}.{webhook-timestamp}.{raw body}` keyed
//! with the base64 part of a `whsec_` secret. Any configured secret may verify
//! (rotation). Comparison is constant-time (`Mac::verify_slice`).
//!
//! # Payload
//!
//! The generic payload is fencehook's own: `{"transaction_id", "amount"
//! (minor units), "currency", "event_type" (a canonical kind),
//! "payment_transaction_id" (refunds and disputes), "occurred_at"
//! (optional, RFC 3339)}`, read strictly ([`parse_generic`]) and built by
//! the PSP side ([`generic_body`]) beside it.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fields::{self, amount_minor, check_currency, check_transaction_id, signed_header};
use super::hmac;
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError, JSON};
use super::scheme::{Item, Reject, Scheme};
use super::setup::Setup;
use crate::domain::{CanonicalEvent, EventKind, ObjectKind};

/// The headers a delivery is signed in.
pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// Standard Webhooks senders issue keys of 24 to 64 random bytes (Svix: 24).
const MIN_KEY_BYTES: usize = 24;

#[derive(Clone)]
pub struct Standard {
    keys: Vec<Vec<u8>>,
    tolerance_secs: i64,
}

impl Standard {
    pub fn new(secrets: &[String], tolerance_secs: u64) -> Result<Standard, String> {
        let keys = secrets
            .iter()
            .map(|s| decode_secret(s))
            .collect::<Result<Vec<_>, _>>()?;
        let tolerance_secs =
            i64::try_from(tolerance_secs).map_err(|_| "tolerance_secs too large".to_owned())?;
        Ok(Standard {
            keys,
            tolerance_secs,
        })
    }

    pub fn verify(&self, headers: &http::HeaderMap, body: &[u8], now: i64) -> Result<(), Reject> {
        let header = |name: &str| signed_header(headers, name);
        let id = header(ID_HEADER)?;
        let ts_text = header(TIMESTAMP_HEADER)?;
        let signatures = header(SIGNATURE_HEADER)?;
        let ts: i64 = ts_text.parse().map_err(|_| {
            Reject::Unauthorized("webhook-timestamp is not a unix timestamp".to_owned())
        })?;
        if now.abs_diff(ts) > self.tolerance_secs.unsigned_abs() {
            return Err(Reject::Unauthorized(
                "webhook-timestamp outside tolerance".to_owned(),
            ));
        }
        let candidates: Vec<Vec<u8>> = signatures
            .split(' ')
            .filter_map(|entry| entry.strip_prefix("v1,"))
            .filter_map(|b64| B64.decode(b64).ok())
            .collect();
        if candidates.is_empty() {
            return Err(Reject::Unauthorized(
                "no v1 signature in webhook-signature".to_owned(),
            ));
        }
        let message: [&[u8]; 5] = [id.as_bytes(), b".", ts_text.as_bytes(), b".", body];
        if hmac::any_key_verifies(&self.keys, &message, &candidates) {
            Ok(())
        } else {
            Err(Reject::Unauthorized("signature does not match".to_owned()))
        }
    }
}

impl Scheme for Standard {
    const NAME: &'static str = "standard";
    type Settings = hmac::TimedTable;
    const SIGNATURE_HEADER: Option<&'static str> = Some(SIGNATURE_HEADER);
    const DELIVERY_ID_PREFIX: &'static str = "msg_";
    const KEYS: &'static [Key] = &[psp::SECRET];

    fn build(settings: hmac::TimedTable, setup: &mut Setup) -> Result<Standard, String> {
        let (secrets, tolerance) = settings.read(setup)?;
        Standard::new(&secrets, tolerance).map_err(|e| setup.error("secrets", e))
    }

    fn short_secret(secret: &str) -> Option<String> {
        let key = secret
            .strip_prefix("whsec_")
            .and_then(|b| B64.decode(b).ok());
        key.filter(|k| k.len() < MIN_KEY_BYTES).map(|k| {
            format!(
                "{} bytes, shorter than the {MIN_KEY_BYTES} a Standard Webhooks sender issues",
                k.len()
            )
        })
    }

    /// The base64 after `whsec_`, decoded.
    fn key_bytes(secret: &str) -> Option<Vec<u8>> {
        secret
            .strip_prefix("whsec_")
            .and_then(|b| B64.decode(b).ok())
    }

    fn psp_event_id(headers: &http::HeaderMap, _body: &[u8]) -> Option<String> {
        headers
            .get(ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    async fn accept(
        &self,
        provider: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.verify(headers, body, now)?;
        Ok(vec![parse_generic(provider, body)?])
    }

    fn check(psp: &dyn Credentials) -> Result<(), PspError> {
        sign(psp.key(&psp::SECRET)?, "msg_check", 0, b"")
            .map(drop)
            .map_err(|e| PspError::new("secret", format!("not a whsec_ secret: {e}")))
    }

    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let body = body
            .map(str::to_owned)
            .unwrap_or_else(|| generic_body(notice).to_string());
        let signature = sign(psp.key(&psp::SECRET)?, delivery_id, ts, body.as_bytes())?;
        Ok(Delivery {
            body,
            content_type: JSON,
            headers: vec![
                (ID_HEADER, delivery_id.to_owned()),
                (TIMESTAMP_HEADER, ts.to_string()),
                (SIGNATURE_HEADER, signature),
            ],
        })
    }
}

fn decode_secret(secret: &str) -> Result<Vec<u8>, String> {
    let b64 = secret
        .strip_prefix("whsec_")
        .ok_or("a standard secret starts with whsec_")?;
    let key = B64
        .decode(b64)
        .map_err(|_| "the part after whsec_ is not base64".to_owned())?;
    if key.len() < 8 {
        return Err("secret key is shorter than 8 bytes".to_owned());
    }
    Ok(key)
}

/// Signs like a Standard Webhooks sender: the `webhook-signature` value.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Result<String, String> {
    let key = decode_secret(secret)?;
    let prefix = format!("{id}.{timestamp}.");
    let mac = hmac::sign(&key, &[prefix.as_bytes(), body]);
    Ok(format!("v1,{}", B64.encode(mac)))
}

/// Maps the generic payload strictly: no coercion, no trimming, no defaults.
pub fn parse_generic(provider: &str, body: &[u8]) -> Result<Item, Reject> {
    let invalid = |m: &str| Reject::Invalid(m.to_owned());
    let value = fields::parse_json(body)?;
    let obj = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object"))?;
    let event_type = match obj.get("event_type") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(invalid("event_type must be a string")),
        None => return Err(invalid("event_type is required")),
    };
    let Some(kind) = EventKind::from_generic(event_type) else {
        return Ok(Item::Ignored {
            event_type: event_type.to_owned(),
        });
    };
    let transaction_id = match obj.get("transaction_id") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(invalid("transaction_id must be a string")),
        None => return Err(invalid("transaction_id is required")),
    };
    check_transaction_id(&transaction_id)?;
    let amount_minor = amount_minor(obj.get("amount"), "amount")?;
    let currency = match obj.get("currency") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(invalid("currency must be a string")),
        None => return Err(invalid("currency is required")),
    };
    check_currency(&currency)?;
    // Refunds and disputes name the payment they take money from.
    let parent_transaction_id = match (kind.object(), obj.get("payment_transaction_id")) {
        (ObjectKind::Payment, _) => None,
        (_, Some(Value::String(s))) => {
            check_transaction_id(s).map_err(|_| {
                invalid("payment_transaction_id must be 1 to 255 printable ASCII characters, without leading or trailing whitespace")
            })?;
            Some(s.clone())
        }
        (_, Some(_)) => return Err(invalid("payment_transaction_id must be a string")),
        (_, None) => {
            return Err(invalid(
                "payment_transaction_id is required for refund and dispute events",
            ))
        }
    };
    let occurred_at = match obj.get("occurred_at") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            OffsetDateTime::parse(s, &Rfc3339)
                .map_err(|_| invalid("occurred_at must be an RFC 3339 timestamp"))?,
        ),
        Some(_) => return Err(invalid("occurred_at must be an RFC 3339 string")),
    };
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id,
        event_type: kind,
        amount_minor,
        currency,
        parent_transaction_id,
        occurred_at,
        merchant_reference: fields::opt_str(obj, "merchant_reference", "merchant_reference")?
            .filter(|r| !r.is_empty())
            .map(str::to_owned),
        metadata: None,
    }))
}

/// The generic payload of `notice`: [`parse_generic`]'s inverse. Sent
/// without `occurred_at`; a refund or dispute names its payment only when
/// given one (the standard scheme sends what it is given).
pub fn generic_body(notice: &Notice) -> Value {
    let mut body = serde_json::json!({
        "transaction_id": notice.transaction_id,
        "amount": notice.amount,
        "currency": notice.currency,
        "event_type": notice.event_type,
    });
    if let Some(parent) = &notice.payment_transaction_id {
        body["payment_transaction_id"] = serde_json::json!(parent);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn headers(id: &str, ts: i64, sig: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("webhook-id", id.parse().unwrap());
        h.insert("webhook-timestamp", ts.to_string().parse().unwrap());
        h.insert("webhook-signature", sig.parse().unwrap());
        h
    }

    #[test]
    fn matches_the_standard_webhooks_reference_vector() {
        // Test vector from the Standard Webhooks specification's reference libraries.
        let body = br#"{"test": 2432232314}"#;
        let sig = sign(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body).unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn verifies_any_listed_signature_and_any_configured_secret() {
        let s = Standard::new(
            &["whsec_b2xkLXNlY3JldC1rZXk=".to_owned(), SECRET.to_owned()],
            300,
        )
        .unwrap();
        let body = b"{}";
        let good = sign(SECRET, "id1", 1000, body).unwrap();
        let multi = format!("v1,AAAA v2,xyz {good}");
        assert!(s.verify(&headers("id1", 1000, &multi), body, 1000).is_ok());
        assert!(s
            .verify(&headers("id1", 1000, &good), b"{ }", 1000)
            .is_err());
        assert!(s.verify(&headers("id2", 1000, &good), body, 1000).is_err());
    }

    #[test]
    fn timestamp_tolerance_is_inclusive_at_the_edge_and_rejects_beyond() {
        let s = Standard::new(&[SECRET.to_owned()], 300).unwrap();
        let sig = sign(SECRET, "id", 1000, b"{}").unwrap();
        assert!(s.verify(&headers("id", 1000, &sig), b"{}", 1300).is_ok());
        assert!(s.verify(&headers("id", 1000, &sig), b"{}", 700).is_ok());
        assert!(s.verify(&headers("id", 1000, &sig), b"{}", 1301).is_err());
        assert!(s.verify(&headers("id", 1000, &sig), b"{}", 699).is_err());
    }

    #[test]
    fn the_generic_payloads_merchant_reference_is_carried() {
        let with = br#"{"transaction_id":"tx_1","amount":1000,"currency":"EUR","event_type":"payment.succeeded","merchant_reference":"order-7"}"#;
        match parse_generic("generic", with) {
            Ok(Item::Event(e)) => {
                assert_eq!(e.merchant_reference.as_deref(), Some("order-7"));
                assert_eq!(e.metadata, None);
            }
            other => panic!("{other:?}"),
        }
        let without = br#"{"transaction_id":"tx_1","amount":1000,"currency":"EUR","event_type":"payment.succeeded"}"#;
        assert!(
            matches!(parse_generic("generic", without), Ok(Item::Event(e)) if e.merchant_reference.is_none())
        );
        let number = br#"{"transaction_id":"tx_1","amount":1000,"currency":"EUR","event_type":"payment.succeeded","merchant_reference":7}"#;
        assert!(parse_generic("generic", number).is_err());
    }

    #[test]
    fn generic_payload_is_strict() {
        let ok = br#"{"transaction_id":"tx_1","amount":1000,"currency":"EUR","event_type":"payment.succeeded","extra":1}"#;
        assert!(matches!(parse_generic("generic", ok), Ok(Item::Event(_))));
        for bad in [
            r#"{"transaction_id":"tx_1","amount":10.0,"currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"tx_1","amount":0,"currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"tx_1","amount":-5,"currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"tx_1","amount":"1000","currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"tx_1","amount":1000,"event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"tx_1","amount":1000,"currency":"eur","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":" tx_1","amount":1000,"currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"tx_1 ","amount":1000,"currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"","amount":1000,"currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"tx\u00e9","amount":1000,"currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":7,"amount":1000,"currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"tx_1","amount":1e3,"currency":"EUR","event_type":"payment.succeeded"}"#,
            r#"{"transaction_id":"tx_1","amount":1000,"currency":"EUR","event_type":"payment.succeeded","occurred_at":"yesterday"}"#,
            r#"[1,2]"#,
            r#"{"transaction_id":"tx_1""#,
        ] {
            assert!(
                matches!(
                    parse_generic("generic", bad.as_bytes()),
                    Err(Reject::Invalid(_))
                ),
                "{bad}"
            );
        }
        let ignored = br#"{"event_type":"customer.created"}"#;
        assert!(matches!(
            parse_generic("generic", ignored),
            Ok(Item::Ignored { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn verify_and_parse_never_panic(
            id in "[ -~]{0,40}",
            ts in "[ -~]{0,24}",
            sig in "[ -~]{0,200}",
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            now in proptest::num::i64::ANY,
        ) {
            let s = Standard::new(&[SECRET.to_owned()], 300).unwrap();
            let mut h = http::HeaderMap::new();
            for (name, value) in [("webhook-id", &id), ("webhook-timestamp", &ts), ("webhook-signature", &sig)] {
                if let Ok(v) = value.parse() {
                    h.insert(name, v);
                }
            }
            let _ = s.verify(&h, &body, now);
            let _ = parse_generic("generic", &body);
        }
    }
}

/// The PSP side and the parser together: what the one builds and signs, the
/// other verifies and maps back to the canonical event it was built from.
#[cfg(test)]
mod round_trip {
    use proptest::prelude::*;

    use super::*;
    use crate::providers::testing::{events, ids, round_trip, round_trip_config, TestCredentials};

    const SECRET: &str = "whsec_dGVzdC1zZWNyZXQtZm9yLWZlbmNlaG9vay10ZXN0cw==";

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(EventKind::ALL, ids(), i64::MAX, "[A-Z]{3}"),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let scheme = Standard::new(&[SECRET.to_owned()], 300).unwrap();
            let psp = TestCredentials::new(&[(psp::SECRET, SECRET)], None);
            // The generic payload is sent without occurred_at.
            prop_assert_eq!(round_trip(&scheme, &psp, &event, ts)?, event);
        }
    }
}
