//! Adyen (`adyen` scheme): standard notification batches.
//!
//! ```json
//! {"live": "false", "notificationItems": [{"NotificationRequestItem": {...}}, ...]}
//! ```
//!
//! # Signature
//!
//! Adyen signs each item, not the request: `additionalData.hmacSignature` is
//! the base64 HMAC-SHA256, keyed with the hex-decoded HMAC key, of
//!
//! ```text
//! pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success
//! ```
//!
//! (`value`/`currency` from `amount`; a missing field is the empty string; no
//! escaping). So the body must be parsed before anything can be verified: a
//! body that is not a notification batch at all is a 400; a batch in which
//! *any* item lacks a valid signature is a 401 for the whole batch, and
//! nothing of it is written. Any configured key may verify (rotation). There is
//! no signed timestamp, hence no tolerance: a replayed batch is absorbed by
//! the exactly-once machinery (every item answers `duplicate`).
//!
//! # Mapping (what is booked)
//!
//! | eventCode | success | booked as | transaction_id |
//! | --- | --- | --- | --- |
//! | `AUTHORISATION` | `true` | payment.succeeded (credit) | `pspReference` |
//! | `AUTHORISATION` | `false` | payment.failed | `pspReference` (each attempt has its own) |
//! | `REFUND` | `true` | refund.succeeded (debit) | `pspReference` of the refund (`originalReference` is the payment's) |
//! | anything else (`CAPTURE`, `CANCELLATION`, `REFUND_FAILED`, `REPORT_AVAILABLE`, ...) or `REFUND` with `false` | | ignored | |
//!
//! Why `AUTHORISATION` and not `CAPTURE`: with automatic capture (Adyen's
//! default and what this mapping assumes) the successful `AUTHORISATION` is
//! the booking event and the `CAPTURE` that may follow is about the same
//! money; booking both would credit the payment twice. An `AUTHORISATION` of
//! value 0 is a card verification (zero-value auth, e.g. to store a card): no
//! money moves, so it is ignored. Currency is taken as sent (Adyen uses upper
//! case; anything else is refused); amounts are minor units as sent.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fields::{
    self, amount_minor, check_currency, check_transaction_id, invalid, opt, opt_str, req_object,
    req_str, Object,
};
use super::{hmac, Item, Reject};
use crate::domain::{CanonicalEvent, EventKind};

/// What Adyen expects as the body of a successful answer: Adyen marks a
/// batch delivered only on exactly this body.
pub(crate) const ACCEPTED: &str = "[accepted]";

/// Shortest HMAC key accepted (Adyen's are 32 bytes, 64 hex digits).
const MIN_KEY_BYTES: usize = 16;

#[derive(Clone)]
pub struct Adyen {
    keys: Vec<Vec<u8>>,
}

impl Adyen {
    pub fn new(secrets: &[String]) -> Result<Adyen, String> {
        let keys = secrets
            .iter()
            .map(|s| decode_key(s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Adyen { keys })
    }

    /// Parses the batch, verifies every item, then maps every item.
    pub fn accept(&self, provider: &str, body: &[u8]) -> Result<Vec<Item>, Reject> {
        let value = fields::parse_json(body)?;
        let items = notification_items(&value)?;
        for (i, item) in items.iter().enumerate() {
            self.verify_item(i, item)?;
        }
        items
            .iter()
            .enumerate()
            .map(|(i, item)| map_item(provider, i, item))
            .collect()
    }

    fn verify_item(&self, i: usize, item: &Object) -> Result<(), Reject> {
        let path = item_path(i);
        let signed = signing_string(item, &path)?;
        let signature = match opt(item, "additionalData") {
            None => None,
            Some(Value::Object(extra)) => opt_str(
                extra,
                "hmacSignature",
                &format!("{path}.additionalData.hmacSignature"),
            )?,
            Some(_) => return Err(invalid(format!("{path}.additionalData must be an object"))),
        };
        let signature = signature.ok_or_else(|| {
            Reject::Unauthorized(format!("item {i}: no additionalData.hmacSignature"))
        })?;
        let signature = B64
            .decode(signature)
            .map_err(|_| Reject::Unauthorized(format!("item {i}: hmacSignature is not base64")))?;
        if hmac::any_key_verifies(&self.keys, &[signed.as_bytes()], &[signature]) {
            Ok(())
        } else {
            Err(Reject::Unauthorized(format!(
                "item {i}: signature does not match"
            )))
        }
    }
}

fn decode_key(secret: &str) -> Result<Vec<u8>, String> {
    let key = hex::decode(secret).map_err(|_| {
        "an adyen secret is the HMAC key of the webhook, in hex (64 hex digits)".to_owned()
    })?;
    if key.len() < MIN_KEY_BYTES {
        return Err(format!(
            "the adyen HMAC key is shorter than {MIN_KEY_BYTES} bytes"
        ));
    }
    Ok(key)
}

fn item_path(i: usize) -> String {
    format!("notificationItems[{i}].NotificationRequestItem")
}

/// The `NotificationRequestItem` of every entry of `notificationItems`.
fn notification_items(value: &Value) -> Result<Vec<&Object>, Reject> {
    let batch = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object (an Adyen notification batch)"))?;
    let entries = match opt(batch, "notificationItems") {
        None => return Err(invalid("notificationItems is required")),
        Some(Value::Array(a)) if a.is_empty() => return Err(invalid("notificationItems is empty")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(invalid("notificationItems must be an array")),
    };
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let entry = entry
                .as_object()
                .ok_or_else(|| invalid(format!("notificationItems[{i}] must be an object")))?;
            req_object(entry, "NotificationRequestItem", &item_path(i))
        })
        .collect()
}

/// The string Adyen signs for one item. Ill-typed fields are a 400: the
/// signature cannot be checked over something that is not Adyen's shape.
pub fn signing_string(item: &Object, path: &str) -> Result<String, Reject> {
    let text = |key: &str| -> Result<String, Reject> {
        Ok(opt_str(item, key, &format!("{path}.{key}"))?
            .unwrap_or_default()
            .to_owned())
    };
    let (value, currency) = match opt(item, "amount") {
        None => (String::new(), String::new()),
        Some(Value::Object(amount)) => {
            let value = match opt(amount, "value") {
                None => String::new(),
                Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                Some(_) => {
                    return Err(invalid(format!(
                        "{path}.amount.value must be an integer in minor units"
                    )))
                }
            };
            let currency = opt_str(amount, "currency", &format!("{path}.amount.currency"))?
                .unwrap_or_default()
                .to_owned();
            (value, currency)
        }
        Some(_) => return Err(invalid(format!("{path}.amount must be an object"))),
    };
    Ok([
        text("pspReference")?,
        text("originalReference")?,
        text("merchantAccountCode")?,
        text("merchantReference")?,
        value,
        currency,
        text("eventCode")?,
        text("success")?,
    ]
    .join(":"))
}

/// Base64 HMAC-SHA256 of `signed` with a hex key, as Adyen computes it.
pub fn signature(key_hex: &str, signed: &str) -> Result<String, String> {
    let key = decode_key(key_hex)?;
    Ok(B64.encode(hmac::sign(&key, &[signed.as_bytes()])))
}

/// Signs every item of a batch in place (sets `additionalData.hmacSignature`),
/// as Adyen would: for `fencehook send` and tests.
pub fn sign_batch(key_hex: &str, batch: &mut Value) -> Result<(), String> {
    let items = batch
        .get_mut("notificationItems")
        .and_then(Value::as_array_mut)
        .ok_or("the batch has no notificationItems array")?;
    for (i, entry) in items.iter_mut().enumerate() {
        let item = entry
            .get_mut("NotificationRequestItem")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| format!("notificationItems[{i}] has no NotificationRequestItem"))?;
        let signed = signing_string(item, &item_path(i)).map_err(|e| e.to_string())?;
        let sig = signature(key_hex, &signed)?;
        let extra = item
            .entry("additionalData")
            .or_insert_with(|| Value::Object(Object::new()));
        let extra = extra
            .as_object_mut()
            .ok_or_else(|| format!("notificationItems[{i}]: additionalData is not an object"))?;
        extra.insert("hmacSignature".to_owned(), Value::String(sig));
    }
    Ok(())
}

fn map_item(provider: &str, i: usize, item: &Object) -> Result<Item, Reject> {
    let path = item_path(i);
    let event_code = req_str(item, "eventCode", &format!("{path}.eventCode"))?;
    let ignored = || {
        Ok(Item::Ignored {
            event_type: event_code.to_owned(),
        })
    };
    if !matches!(event_code, "AUTHORISATION" | "REFUND") {
        return ignored();
    }
    let success = match req_str(item, "success", &format!("{path}.success"))? {
        "true" => true,
        "false" => false,
        _ => {
            return Err(invalid(format!(
                "{path}.success must be \"true\" or \"false\""
            )))
        }
    };
    let kind = match (event_code, success) {
        ("AUTHORISATION", true) => EventKind::PaymentSucceeded,
        ("AUTHORISATION", false) => EventKind::PaymentFailed,
        ("REFUND", true) => EventKind::RefundSucceeded,
        _ => return ignored(),
    };
    let amount = req_object(item, "amount", &format!("{path}.amount"))?;
    let value = opt(amount, "value");
    if event_code == "AUTHORISATION" && value.and_then(Value::as_i64) == Some(0) {
        // Zero-value authorisation: a card check, no money.
        return ignored();
    }
    let amount_minor = amount_minor(value, &format!("{path}.amount.value"))?;
    let currency = req_str(amount, "currency", &format!("{path}.amount.currency"))?;
    check_currency(currency)?;
    let transaction_id = req_str(item, "pspReference", &format!("{path}.pspReference"))?;
    check_transaction_id(transaction_id)?;
    let occurred_at = opt_str(item, "eventDate", &format!("{path}.eventDate"))?
        .map(|s| {
            OffsetDateTime::parse(s, &Rfc3339)
                .map_err(|_| invalid(format!("{path}.eventDate must be an RFC 3339 timestamp")))
        })
        .transpose()?;
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id: transaction_id.to_owned(),
        event_type: kind,
        amount_minor,
        currency: currency.to_owned(),
        parent_transaction_id: None,
        occurred_at,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::arbitrary_json;
    use proptest::prelude::*;
    use serde_json::json;

    const ADYEN_KEYS: &[&str] = &[
        "pspReference",
        "originalReference",
        "merchantAccountCode",
        "merchantReference",
        "amount",
        "value",
        "currency",
        "eventCode",
        "success",
        "eventDate",
        "additionalData",
        "hmacSignature",
    ];

    /// Keys and expected signatures from Adyen's own API libraries' test suites.
    const RUBY_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
    const PHP_KEY: &str = "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00";

    fn library_item() -> Value {
        json!({
            "pspReference": "7914073381342284",
            "merchantAccountCode": "TestMerchant",
            "merchantReference": "TestPayment-1407325143704",
            "amount": {"value": 1130, "currency": "EUR"},
            "eventCode": "AUTHORISATION",
            "success": "true",
            "paymentMethod": "visa"
        })
    }

    fn batch(items: Vec<Value>) -> Value {
        json!({
            "live": "false",
            "notificationItems": items.into_iter()
                .map(|i| json!({"NotificationRequestItem": i}))
                .collect::<Vec<_>>()
        })
    }

    fn signed(key: &str, items: Vec<Value>) -> Vec<u8> {
        let mut b = batch(items);
        sign_batch(key, &mut b).unwrap();
        b.to_string().into_bytes()
    }

    fn adyen(keys: &[&str]) -> Adyen {
        Adyen::new(&keys.iter().map(|k| k.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn matches_adyens_library_test_vectors() {
        let item = library_item();
        let s = signing_string(item.as_object().unwrap(), "item").unwrap();
        assert_eq!(
            s,
            "7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true"
        );
        assert_eq!(
            signature(RUBY_KEY, &s).unwrap(),
            "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0="
        );
        assert_eq!(
            signature(PHP_KEY, &s).unwrap(),
            "Ny9gS2veKo5E4w8/OL6xz1/wvT/hYkAXy1xNc/QvO4I="
        );
        let mut with_sig = item;
        with_sig["additionalData"] =
            json!({"hmacSignature": "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0="});
        let body = batch(vec![with_sig]).to_string();
        let items = adyen(&[RUBY_KEY]).accept("adyen", body.as_bytes()).unwrap();
        assert_eq!(items.len(), 1);
    }

    #[test]
    fn any_configured_key_verifies_and_a_wrong_one_does_not() {
        let body = signed(PHP_KEY, vec![library_item()]);
        assert!(adyen(&[RUBY_KEY, PHP_KEY]).accept("adyen", &body).is_ok());
        assert!(adyen(&[PHP_KEY, RUBY_KEY]).accept("adyen", &body).is_ok());
        assert!(matches!(
            adyen(&[RUBY_KEY]).accept("adyen", &body),
            Err(Reject::Unauthorized(_))
        ));
    }

    #[test]
    fn one_tampered_missing_or_garbled_signature_rejects_the_batch() {
        let mut second = library_item();
        second["pspReference"] = "7914073381342285".into();
        let good = signed(RUBY_KEY, vec![library_item(), second]);
        let a = adyen(&[RUBY_KEY]);
        assert_eq!(a.accept("adyen", &good).unwrap().len(), 2);
        let text = String::from_utf8(good).unwrap();
        // Change the second item's amount after signing.
        let tampered = text.replacen("1130", "9130", 2).replacen("9130", "1130", 1);
        assert!(matches!(
            a.accept("adyen", tampered.as_bytes()),
            Err(Reject::Unauthorized(_))
        ));
        let unsigned = batch(vec![library_item()]).to_string();
        assert!(matches!(
            a.accept("adyen", unsigned.as_bytes()),
            Err(Reject::Unauthorized(_))
        ));
        let mut garbled = library_item();
        garbled["additionalData"] = json!({"hmacSignature": "not base64!"});
        assert!(matches!(
            a.accept("adyen", batch(vec![garbled]).to_string().as_bytes()),
            Err(Reject::Unauthorized(_))
        ));
    }

    fn accept_one(item: Value) -> Result<Item, Reject> {
        let mut items = adyen(&[RUBY_KEY]).accept("adyen", &signed(RUBY_KEY, vec![item]))?;
        Ok(items.remove(0))
    }

    #[test]
    fn authorisations_and_refunds_are_booked_and_other_codes_ignored() {
        let Ok(Item::Event(e)) = accept_one(library_item()) else {
            panic!()
        };
        assert_eq!(
            (
                e.transaction_id.as_str(),
                e.event_type,
                e.amount_minor,
                e.currency.as_str()
            ),
            ("7914073381342284", EventKind::PaymentSucceeded, 1130, "EUR")
        );
        let mut failed = library_item();
        failed["success"] = "false".into();
        failed["eventDate"] = "2024-05-01T10:00:00+02:00".into();
        let Ok(Item::Event(f)) = accept_one(failed) else {
            panic!()
        };
        assert_eq!(f.event_type, EventKind::PaymentFailed);
        assert!(f.occurred_at.is_some());
        let mut refund = library_item();
        refund["eventCode"] = "REFUND".into();
        refund["pspReference"] = "8814073381342299".into();
        refund["originalReference"] = "7914073381342284".into();
        let Ok(Item::Event(r)) = accept_one(refund.clone()) else {
            panic!()
        };
        assert_eq!(
            (r.transaction_id.as_str(), r.event_type),
            ("8814073381342299", EventKind::RefundSucceeded)
        );
        let mut refund_failed = refund;
        refund_failed["success"] = "false".into();
        let mut zero_auth = library_item();
        zero_auth["amount"]["value"] = 0.into();
        let mut report = library_item();
        report["eventCode"] = "REPORT_AVAILABLE".into();
        report["amount"] = json!({"value": 0, "currency": "EUR"});
        for (name, item) in [
            ("capture", {
                let mut c = library_item();
                c["eventCode"] = "CAPTURE".into();
                c
            }),
            ("failed refund", refund_failed),
            ("zero-value auth", zero_auth),
            ("report", report),
        ] {
            assert!(
                matches!(accept_one(item), Ok(Item::Ignored { .. })),
                "{name}"
            );
        }
    }

    #[test]
    fn bad_shapes_are_invalid() {
        let cases: Vec<(&str, Value)> = vec![
            ("negative", json!({"value": -5, "currency": "EUR"})),
            (
                "lower-case currency",
                json!({"value": 5, "currency": "eur"}),
            ),
            ("missing currency", json!({"value": 5})),
        ];
        for (name, amount) in cases {
            let mut item = library_item();
            item["amount"] = amount;
            assert!(
                matches!(accept_one(item), Err(Reject::Invalid(_))),
                "{name}"
            );
        }
        let mut bad_success = library_item();
        bad_success["success"] = "yes".into();
        assert!(matches!(accept_one(bad_success), Err(Reject::Invalid(_))));
        let mut bad_date = library_item();
        bad_date["eventDate"] = "yesterday".into();
        assert!(matches!(accept_one(bad_date), Err(Reject::Invalid(_))));
        let mut no_psp = library_item();
        no_psp.as_object_mut().unwrap().remove("pspReference");
        assert!(matches!(accept_one(no_psp), Err(Reject::Invalid(_))));
        let a = adyen(&[RUBY_KEY]);
        for body in [
            r#"not json"#,
            r#"[]"#,
            r#"{"live":"false"}"#,
            r#"{"notificationItems":[]}"#,
            r#"{"notificationItems":{}}"#,
            r#"{"notificationItems":[1]}"#,
            r#"{"notificationItems":[{"x":{}}]}"#,
            r#"{"notificationItems":[{"NotificationRequestItem":{"amount":{"value":1.5}}}]}"#,
            r#"{"notificationItems":[{"NotificationRequestItem":{"pspReference":7}}]}"#,
        ] {
            assert!(
                matches!(a.accept("adyen", body.as_bytes()), Err(Reject::Invalid(_))),
                "{body}"
            );
        }
    }

    #[test]
    fn keys_must_be_hex_and_long_enough() {
        assert!(Adyen::new(&["not-hex".to_owned()]).is_err());
        assert!(Adyen::new(&["ABCD".to_owned()]).is_err());
        assert!(Adyen::new(&[RUBY_KEY.to_owned()]).is_ok());
    }

    #[test]
    fn deeply_nested_json_is_invalid_not_a_crash() {
        let deep = format!(
            r#"{{"notificationItems":{}{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(matches!(
            adyen(&[RUBY_KEY]).accept("adyen", deep.as_bytes()),
            Err(Reject::Invalid(_))
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = adyen(&[RUBY_KEY]).accept("adyen", &body);
        }

        #[test]
        fn arbitrary_items_never_panic_signed_or_not(
            items in proptest::collection::vec(arbitrary_json(ADYEN_KEYS), 1..4),
            sign in any::<bool>(),
        ) {
            let mut b = batch(items);
            if sign {
                let _ = sign_batch(RUBY_KEY, &mut b);
            }
            let _ = adyen(&[RUBY_KEY]).accept("adyen", b.to_string().as_bytes());
        }
    }
}
