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
//! The business key is the PaymentIntent id, never the event id: a payment
//! announced by both `payment_intent.succeeded` and `charge.succeeded` maps to
//! one transaction with one fingerprint, so the second is a `duplicate`.
//!
//! | event | booked as | transaction_id | amount |
//! | --- | --- | --- | --- |
//! | `payment_intent.succeeded` | payment.succeeded (credit) | PaymentIntent `id` | `amount_received`, else `amount` |
//! | `charge.succeeded` (captured) | payment.succeeded (credit) | the Charge's `payment_intent`, else the Charge `id` | `amount_captured`, else `amount` |
//! | `charge.failed` | payment.failed | the Charge `id` | `amount` |
//! | `payment_intent.payment_failed` | payment.failed | the failed Charge (`last_payment_error.charge`, else `latest_charge`) | `amount` |
//! | `charge.refunded` | refund.succeeded (debit) | the latest succeeded refund in `refunds.data` | that refund's `amount` |
//! | `refund.created`, `refund.updated`, `charge.refund.updated` with `status: succeeded` | refund.succeeded (debit) | the Refund `id` | the Refund's `amount` |
//!
//! Decisions worth knowing:
//!
//! - A *failed attempt* is keyed by its Charge, not by the PaymentIntent: a
//!   PaymentIntent whose first card is declined can still succeed with another
//!   attempt, and recording the failure under the PaymentIntent id would turn
//!   that later success into a `payload_mismatch` (the row would already say
//!   `failed`) and the credit would never be booked. A failed PaymentIntent
//!   with no Charge (e.g. authentication failed before any attempt reached the
//!   card network) has nothing to record and is `ignored`.
//! - `charge.succeeded` for an uncaptured charge (manual capture) is only an
//!   authorisation: `ignored`; `payment_intent.succeeded` books it on capture.
//! - `charge.refunded` carries the Charge, whose refund list Stripe orders
//!   newest first; we take the succeeded refund with the greatest `created`
//!   (the first listed on a tie), which is the refund that fired this event.
//!   Since API version 2022-11-15 the list is not included unless expanded;
//!   then the event is `ignored` and the refund is booked from `refund.*`
//!   events (subscribe to them). Both routes key by the refund id, so a refund
//!   seen through both is booked once.
//! - Refunds that are not `succeeded` yet (`pending`, `requires_action`) or
//!   never will be (`failed`, `canceled`) are `ignored`; the later
//!   `refund.updated` to `succeeded` books them.
//! - Stripe's lower-case currency is upper-cased; amounts are taken as sent in
//!   the currency's minor unit (JPY has none, KWD has three decimals: Stripe
//!   already sends the integer it charges).

use serde_json::Value;
use time::OffsetDateTime;

use super::fields::{
    self, amount_minor, check_currency, check_transaction_id, invalid, opt, opt_str, req_object,
    req_str, Object,
};
use super::{hmac, Item, Reject};
use crate::domain::{CanonicalEvent, EventKind};

/// The header Stripe signs with (HTTP header names are case-insensitive).
pub const SIGNATURE_HEADER: &str = "stripe-signature";

#[derive(Clone)]
pub struct Stripe {
    secrets: Vec<Vec<u8>>,
    tolerance_secs: u64,
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
        })
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

/// Maps a Stripe event (see the module docs) strictly: a handled type with a
/// missing or ill-typed field is [`Reject::Invalid`]; a type we do not act on
/// is [`Item::Ignored`] without looking further.
pub fn parse_event(provider: &str, body: &[u8]) -> Result<Item, Reject> {
    let value = fields::parse_json(body)?;
    let event = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object (a Stripe event)"))?;
    let event_type = req_str(event, "type", "type")?;
    let ignored = || {
        Ok(Item::Ignored {
            event_type: event_type.to_owned(),
        })
    };
    let object_kind = match event_type {
        "payment_intent.succeeded" | "payment_intent.payment_failed" => "payment_intent",
        "charge.succeeded" | "charge.failed" | "charge.refunded" => "charge",
        "refund.created" | "refund.updated" | "charge.refund.updated" => "refund",
        _ => return ignored(),
    };
    let occurred_at = match opt(event, "created") {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok())
                .ok_or_else(|| invalid("created must be a unix timestamp (integer)"))?,
        ),
    };
    let data = req_object(event, "data", "data")?;
    let object = req_object(data, "object", "data.object")?;
    let declared = req_str(object, "object", "data.object.object")?;
    if declared != object_kind {
        return Err(invalid(format!(
            "data.object.object is `{declared}`, but a {event_type} event carries a {object_kind}"
        )));
    }
    let mapped = match event_type {
        "payment_intent.succeeded" => Some(Mapped {
            kind: EventKind::PaymentSucceeded,
            transaction_id: req_str(object, "id", "data.object.id")?,
            amount: match opt(object, "amount_received") {
                Some(v) => amount_minor(Some(v), "data.object.amount_received")?,
                None => amount_minor(opt(object, "amount"), "data.object.amount")?,
            },
            currency: req_str(object, "currency", "data.object.currency")?,
        }),
        "payment_intent.payment_failed" => match failed_attempt_charge(object)? {
            None => None,
            Some(charge) => Some(Mapped {
                kind: EventKind::PaymentFailed,
                transaction_id: charge,
                // The attempt's amount: amount_received is 0 on a failure.
                amount: amount_minor(opt(object, "amount"), "data.object.amount")?,
                currency: req_str(object, "currency", "data.object.currency")?,
            }),
        },
        "charge.succeeded" => {
            let captured = match opt(object, "captured") {
                None => true,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(invalid("data.object.captured must be a boolean")),
            };
            if !captured {
                return ignored();
            }
            Some(Mapped {
                kind: EventKind::PaymentSucceeded,
                transaction_id: charge_payment_key(object)?,
                amount: match opt(object, "amount_captured") {
                    Some(v) => amount_minor(Some(v), "data.object.amount_captured")?,
                    None => amount_minor(opt(object, "amount"), "data.object.amount")?,
                },
                currency: req_str(object, "currency", "data.object.currency")?,
            })
        }
        "charge.failed" => Some(Mapped {
            kind: EventKind::PaymentFailed,
            transaction_id: req_str(object, "id", "data.object.id")?,
            amount: amount_minor(opt(object, "amount"), "data.object.amount")?,
            currency: req_str(object, "currency", "data.object.currency")?,
        }),
        "charge.refunded" => latest_succeeded_refund(object)?
            .map(|refund| refund_mapped(refund, "data.object.refunds.data[]"))
            .transpose()?,
        _ => {
            // refund.created, refund.updated, charge.refund.updated: a Refund.
            let status = req_str(object, "status", "data.object.status")?;
            if status == "succeeded" {
                Some(refund_mapped(object, "data.object")?)
            } else {
                None
            }
        }
    };
    let Some(m) = mapped else {
        return ignored();
    };
    check_transaction_id(m.transaction_id)?;
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id: m.transaction_id.to_owned(),
        event_type: m.kind,
        amount_minor: m.amount,
        currency: normalise_currency(m.currency)?,
        parent_transaction_id: None,
        occurred_at,
    }))
}

struct Mapped<'a> {
    kind: EventKind,
    transaction_id: &'a str,
    amount: i64,
    currency: &'a str,
}

/// Stripe sends ISO 4217 codes in lower case; the ledger keeps upper case.
fn normalise_currency(c: &str) -> Result<String, Reject> {
    if c.len() == 3 && c.bytes().all(|b| b.is_ascii_alphabetic()) {
        let upper = c.to_ascii_uppercase();
        check_currency(&upper)?;
        Ok(upper)
    } else {
        Err(invalid(
            "data.object.currency must be a three-letter ISO 4217 code",
        ))
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

/// The Charge of a PaymentIntent's failed attempt, when there was one.
fn failed_attempt_charge(pi: &Object) -> Result<Option<&str>, Reject> {
    let from_error = match opt(pi, "last_payment_error") {
        None => None,
        Some(Value::Object(err)) => {
            opt_str(err, "charge", "data.object.last_payment_error.charge")?
        }
        Some(_) => return Err(invalid("data.object.last_payment_error must be an object")),
    };
    match from_error {
        Some(charge) => Ok(Some(charge)),
        None => id_or_expanded(pi, "latest_charge", "data.object.latest_charge"),
    }
}

/// `charge.refunded`: the succeeded refund with the greatest `created` in the
/// Charge's refund list (first listed on a tie); `None` when the list is absent
/// (not expanded) or holds no succeeded refund.
fn latest_succeeded_refund(charge: &Object) -> Result<Option<&Object>, Reject> {
    let list = match opt(charge, "refunds") {
        None => return Ok(None),
        Some(Value::Object(list)) => list,
        Some(_) => return Err(invalid("data.object.refunds must be a list object")),
    };
    let data = match opt(list, "data") {
        None => return Ok(None),
        Some(Value::Array(data)) => data,
        Some(_) => return Err(invalid("data.object.refunds.data must be an array")),
    };
    let mut best: Option<(i64, &Object)> = None;
    for refund in data {
        let refund = refund
            .as_object()
            .ok_or_else(|| invalid("data.object.refunds.data[] must be refund objects"))?;
        if req_str(refund, "status", "data.object.refunds.data[].status")? != "succeeded" {
            continue;
        }
        let created = match opt(refund, "created") {
            None => i64::MIN,
            Some(v) => v.as_i64().ok_or_else(|| {
                invalid("data.object.refunds.data[].created must be a unix timestamp (integer)")
            })?,
        };
        if best.is_none_or(|(t, _)| created > t) {
            best = Some((created, refund));
        }
    }
    Ok(best.map(|(_, r)| r))
}

fn refund_mapped<'a>(refund: &'a Object, path: &str) -> Result<Mapped<'a>, Reject> {
    Ok(Mapped {
        kind: EventKind::RefundSucceeded,
        transaction_id: req_str(refund, "id", &format!("{path}.id"))?,
        amount: amount_minor(opt(refund, "amount"), &format!("{path}.amount"))?,
        currency: req_str(refund, "currency", &format!("{path}.currency"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::arbitrary_json;
    use proptest::prelude::*;

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

    fn mapped(event_type: &str, object: Value) -> CanonicalEvent {
        match parse_event("stripe", &event(event_type, object)) {
            Ok(Item::Event(e)) => e,
            other => panic!("{event_type}: {other:?}"),
        }
    }

    #[test]
    fn payment_intent_and_charge_of_one_payment_have_one_key_and_fingerprint() {
        let a = mapped("payment_intent.succeeded", pi(serde_json::json!({})));
        let b = mapped("charge.succeeded", charge(serde_json::json!({})));
        assert_eq!(a.transaction_id, "pi_1");
        assert_eq!(a.currency, "EUR");
        assert_eq!(a.event_type, EventKind::PaymentSucceeded);
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
    fn failures_are_keyed_by_the_failed_attempt() {
        let e = mapped(
            "payment_intent.payment_failed",
            pi(serde_json::json!({"amount_received": 0,
                "last_payment_error": {"charge": "ch_declined", "code": "card_declined"}})),
        );
        assert_eq!(
            (e.transaction_id.as_str(), e.event_type, e.amount_minor),
            ("ch_declined", EventKind::PaymentFailed, 2000)
        );
        let f = mapped(
            "charge.failed",
            charge(
                serde_json::json!({"id": "ch_declined", "captured": false, "amount_captured": 0}),
            ),
        );
        assert_eq!(e.fingerprint(), f.fingerprint());
        let latest = mapped(
            "payment_intent.payment_failed",
            pi(serde_json::json!({"amount_received": 0, "latest_charge": "ch_2"})),
        );
        assert_eq!(latest.transaction_id, "ch_2");
        // No attempt reached the card network: nothing to record.
        assert!(matches!(
            parse_event(
                "stripe",
                &event(
                    "payment_intent.payment_failed",
                    pi(serde_json::json!({"amount_received": 0}))
                )
            ),
            Ok(Item::Ignored { .. })
        ));
    }

    #[test]
    fn refunds_are_keyed_by_the_refund_and_only_succeeded_ones_count() {
        let refund = serde_json::json!({
            "id": "re_1", "object": "refund", "amount": 500, "currency": "eur",
            "charge": "ch_1", "payment_intent": "pi_1", "status": "succeeded", "created": 10
        });
        let e = mapped("refund.updated", refund.clone());
        assert_eq!(
            (e.transaction_id.as_str(), e.event_type, e.amount_minor),
            ("re_1", EventKind::RefundSucceeded, 500)
        );
        let mut pending = refund.clone();
        pending["status"] = "pending".into();
        assert!(matches!(
            parse_event("stripe", &event("refund.created", pending.clone())),
            Ok(Item::Ignored { .. })
        ));
        // charge.refunded: the latest succeeded refund.
        let mut older = refund.clone();
        older["id"] = "re_0".into();
        older["created"] = 5.into();
        let mut newest_pending = pending;
        newest_pending["id"] = "re_2".into();
        newest_pending["created"] = 20.into();
        let c = mapped(
            "charge.refunded",
            charge(
                serde_json::json!({"refunded": true, "refunds": {"object": "list",
                "data": [newest_pending, older, refund]}}),
            ),
        );
        assert_eq!(c.transaction_id, "re_1");
        assert_eq!(c.fingerprint(), e.fingerprint());
        // Not expanded (API >= 2022-11-15): ignored, booked from refund.* events.
        assert!(matches!(
            parse_event(
                "stripe",
                &event("charge.refunded", charge(serde_json::json!({})))
            ),
            Ok(Item::Ignored { .. })
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
            assert!(
                matches!(
                    parse_event("stripe", &event(t, o)),
                    Ok(Item::Ignored { .. })
                ),
                "{t}"
            );
        }
        // Unhandled types need nothing but a type.
        assert!(matches!(
            parse_event("stripe", br#"{"type":"balance.available"}"#),
            Ok(Item::Ignored { .. })
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
                "charge.refund.updated", "customer.created"]),
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
