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
//! body that is not a notification batch at all is a 400 (so is an item whose
//! signed fields are not even of Adyen's types: it cannot be verified); a
//! batch in which *any* item lacks a valid signature is a 401 for the whole
//! batch, and nothing of it is written. Any configured key may verify
//! (rotation). There is no signed timestamp, hence no tolerance: a replayed
//! batch is absorbed by the exactly-once machinery (every item answers
//! `duplicate`).
//!
//! Only once every item verified is any item mapped, each on its own: a
//! well-signed item that cannot be mapped (lower-case currency, no amount, a
//! refund without `originalReference`, ...) becomes [`Item::Unmappable`],
//! which the HTTP edge quarantines, and the other items of the batch are
//! booked as usual. Refusing the batch for it would make Adyen re-send the
//! whole batch, the bad item included, for days.
//!
//! # Mapping (what is booked)
//!
//! `pspReference` is the id of what the item reports (the payment, the
//! refund, the dispute); `originalReference` is the payment a modification or
//! a dispute is about, so it is the parent of refunds and disputes, and they
//! cannot be mapped without it.
//!
//! | eventCode | success | booked as | transaction_id | parent |
//! | --- | --- | --- | --- | --- |
//! | `AUTHORISATION` | `true` | payment.succeeded (credit) | `pspReference` | – |
//! | `AUTHORISATION` | `false` | payment.failed | `pspReference` (each attempt has its own) | – |
//! | `REFUND` | `true` | refund.succeeded (debit) | `pspReference` (the refund's) | `originalReference` |
//! | `REFUND` | `false` | refund.failed (nothing was refunded) | `pspReference` | `originalReference` |
//! | `REFUND_FAILED` | `true` (the failure happened) | refund.failed (after a booked refund: refund_reversal) | `pspReference` (the refund's) | `originalReference` |
//! | `REFUNDED_REVERSED` | `true` | refund.failed (uncertain: see docs/providers.md) | `pspReference` | `originalReference` |
//! | `CANCEL_OR_REFUND` | `true` | decided by the payment's row here: see below | `pspReference` | `originalReference` |
//! | `CANCEL_OR_REFUND` | `false` | refund.failed (nothing moved) | `pspReference` | `originalReference` |
//! | `CHARGEBACK` | `true` | dispute.funds_withdrawn (dispute debit) | `pspReference` (the dispute's; every stage reuses it) | `originalReference` |
//! | `CHARGEBACK_REVERSED` | `true` | dispute.funds_reinstated (dispute_reversal) | `pspReference` | `originalReference` |
//! | `SECOND_CHARGEBACK` | `true` | dispute.funds_withdrawn | `<pspReference>:second_chargeback` | `originalReference` |
//!
//! Ignored: `REFUND_FAILED`, `REFUNDED_REVERSED` and the dispute codes with
//! `success` `false` (the event did not take place), `CAPTURE`,
//! `CANCELLATION`, `NOTIFICATION_OF_CHARGEBACK`, `REQUEST_FOR_INFORMATION`,
//! `PREARBITRATION_*`, `REPORT_AVAILABLE` and every other code.
//!
//! # Only signed fields decide
//!
//! The HMAC covers the eight fields above and nothing else: `additionalData`
//! (its `modification.action` included), `eventDate`, `reason`,
//! `paymentMethod` and the rest can be changed on a captured item without
//! touching its signature, and an item never expires. So kind, amount,
//! currency, transaction id and parent come from the signed fields alone;
//! `eventDate` is kept as the row's `occurred_at` for the operator when it
//! reads as a time, and is otherwise dropped (it refuses nothing).
//!
//! `CANCEL_OR_REFUND` says only "cancelled if not yet captured, else
//! refunded" (Adyen, "Cancel or refund a payment"); which one Adyen did is in
//! `modification.action`, which is not signed. The ledger decides instead
//! ([`Item::CancelOrRefund`]): against a payment booked here as `succeeded`
//! (an `AUTHORISATION` is booked as captured: see below) it can only have
//! been a refund, of the signed amount; against a payment recorded `failed`
//! there was nothing to capture, so it was a cancel and moves nothing
//! (ignored); against one not known yet it waits as a refund waits for its
//! payment.
//!
//! Why `AUTHORISATION` and not `CAPTURE`: with automatic capture (Adyen's
//! default and what this mapping assumes) the successful `AUTHORISATION` is
//! the booking event and the `CAPTURE` that may follow is about the same
//! money; booking both would credit the payment twice. An `AUTHORISATION` of
//! value 0 is a card verification (zero-value auth, e.g. to store a card): no
//! money moves, so it is ignored. Why `:second_chargeback`: a dispute row
//! books one withdrawal and one reinstatement; a second withdrawal after a
//! reversal is a dispute object of its own. Currency is taken as sent (Adyen
//! uses upper case; anything else is unmappable); amounts are minor units as
//! sent.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fields::{
    self, amount_minor, check_currency, check_transaction_id, invalid, opt, opt_str, req_object,
    req_str, Object,
};
use super::hmac;
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError, JSON};
use super::scheme::{AckBody, Item, Reject, Scheme};
use super::setup::Setup;
use crate::domain::{CanonicalEvent, EventKind, ObjectKind};

/// What Adyen expects as the body of a successful answer: Adyen marks a
/// batch delivered only on exactly this body.
pub(crate) const ACCEPTED: &str = "[accepted]";

/// Shortest HMAC key accepted (Adyen's are 32 bytes, 64 hex digits).
const MIN_KEY_BYTES: usize = 16;

/// Shorter than this, a key is not one Adyen issued (32 bytes, 64 hex
/// digits): it starts, but is refused as exposed outside development.
const ISSUED_KEY_BYTES: usize = 32;

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

    /// Parses the batch, verifies every item, then maps every item (an item
    /// that cannot be mapped is [`Item::Unmappable`], not a refusal).
    pub fn accept_batch(&self, provider: &str, body: &[u8]) -> Result<Vec<Item>, Reject> {
        let value = fields::parse_json(body)?;
        let items = notification_items(&value)?;
        for (i, item) in items.iter().enumerate() {
            self.verify_item(i, item)?;
        }
        Ok(items.iter().map(|item| map_item(provider, item)).collect())
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

impl Scheme for Adyen {
    const NAME: &'static str = "adyen";
    type Settings = hmac::Table;
    const SIGNATURE_HEADER: Option<&'static str> = None;
    const BATCH: bool = true;
    const PAYMENT_ID: Option<&'static str> = Some("the payment's pspReference");
    const KEYS: &'static [Key] = &[psp::SECRET];

    fn not_taken(setting: &str) -> Option<&'static str> {
        (setting == "tolerance_secs")
            .then_some("adyen notifications carry no signed timestamp; remove the setting")
    }

    fn build(settings: hmac::Table, setup: &mut Setup) -> Result<Adyen, String> {
        let secrets = settings.read(setup)?;
        Adyen::new(&secrets).map_err(|e| setup.error("secrets", e))
    }

    fn short_secret(secret: &str) -> Option<String> {
        let bytes = secret.len() / 2;
        (bytes < ISSUED_KEY_BYTES).then(|| {
            format!(
                "{bytes} bytes, shorter than the {ISSUED_KEY_BYTES} (64 hex digits) Adyen issues"
            )
        })
    }

    /// The HMAC key, hex-decoded: its digits in either case are one key.
    fn key_bytes(secret: &str) -> Option<Vec<u8>> {
        hex::decode(secret).ok()
    }

    fn ack_body(success: bool, result: &str, reason: Option<&str>) -> AckBody {
        if success {
            AckBody::Text(ACCEPTED)
        } else {
            AckBody::fencehook(result, reason)
        }
    }

    async fn accept(
        &self,
        provider: &str,
        _headers: &http::HeaderMap,
        body: &[u8],
        _now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.accept_batch(provider, body)
    }

    fn check(psp: &dyn Credentials) -> Result<(), PspError> {
        signature(psp.key(&psp::SECRET)?, "")
            .map(drop)
            .map_err(|e| PspError::new("secret", e))
    }

    /// A one-item batch built from `notice`, or a batch of your own (every
    /// item's `hmacSignature` computed and set).
    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        _delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let mut batch = match body {
            Some(b) => serde_json::from_str(b).map_err(|e| format!("--body is not JSON: {e}"))?,
            None => batch_of(notice, ts)?,
        };
        sign_batch(psp.key(&psp::SECRET)?, &mut batch)?;
        Ok(Delivery {
            body: batch.to_string(),
            content_type: JSON,
            headers: Vec::new(),
        })
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

/// Maps one verified item. Never fails: an item that cannot be mapped is
/// [`Item::Unmappable`], with the reason and the item as received, so the
/// other items of its batch are still booked.
fn map_item(provider: &str, item: &Object) -> Item {
    match map_fields(provider, item) {
        Ok(mapped) => mapped,
        Err(
            Reject::Invalid(reason) | Reject::Unauthorized(reason) | Reject::Unavailable(reason),
        ) => Item::Unmappable {
            reason,
            // What the HMAC covers: the item, however its unsigned fields are
            // dressed. Verified before mapping, so it reads.
            key: signing_string(item, "item").unwrap_or_default(),
            // Only an id that could be stored as one (no control characters).
            transaction_id: opt(item, "pspReference")
                .and_then(Value::as_str)
                .filter(|id| check_transaction_id(id).is_ok())
                .map(str::to_owned),
            raw: Value::Object(item.clone()).to_string(),
        },
    }
}

/// The item as the module doc's table says, or why it cannot be. Paths in
/// the messages are relative to the item: the reason is kept with the item,
/// apart from its batch.
fn map_fields(provider: &str, item: &Object) -> Result<Item, Reject> {
    use EventKind::*;
    let event_code = req_str(item, "eventCode", "eventCode")?;
    let ignored = || {
        Ok(Item::Ignored {
            event_type: event_code.to_owned(),
        })
    };
    if !matches!(
        event_code,
        "AUTHORISATION"
            | "REFUND"
            | "REFUND_FAILED"
            | "REFUNDED_REVERSED"
            | "CANCEL_OR_REFUND"
            | "CHARGEBACK"
            | "CHARGEBACK_REVERSED"
            | "SECOND_CHARGEBACK"
    ) {
        return ignored();
    }
    let success = match req_str(item, "success", "success")? {
        "true" => true,
        "false" => false,
        _ => return Err(invalid("success must be \"true\" or \"false\"")),
    };
    // The transaction id is the pspReference, and this suffix.
    let (kind, suffix) = match (event_code, success) {
        ("AUTHORISATION", true) => (PaymentSucceeded, ""),
        ("AUTHORISATION", false) => (PaymentFailed, ""),
        ("REFUND", true) => (RefundSucceeded, ""),
        // The refund was refused: recorded failed, nothing booked.
        ("REFUND", false) => (RefundFailed, ""),
        // For these, `true` means the failure (the reversal) happened.
        ("REFUND_FAILED" | "REFUNDED_REVERSED", true) => (RefundFailed, ""),
        // A refund of the signed amount, or a cancel that moves nothing:
        // which, the payment's row decides (see the module docs), never the
        // unsigned `modification.action`.
        ("CANCEL_OR_REFUND", true) => (RefundSucceeded, ""),
        // Neither happened: a refused refund moves nothing either.
        ("CANCEL_OR_REFUND", false) => (RefundFailed, ""),
        ("CHARGEBACK", true) => (DisputeFundsWithdrawn, ""),
        ("CHARGEBACK_REVERSED", true) => (DisputeFundsReinstated, ""),
        // A second withdrawal after a reversal: a dispute row books one
        // withdrawal and one reinstatement, so this one is its own row.
        ("SECOND_CHARGEBACK", true) => (DisputeFundsWithdrawn, SECOND_CHARGEBACK_SUFFIX),
        // A failure notice or a dispute stage that did not take place.
        _ => return ignored(),
    };
    let amount = req_object(item, "amount", "amount")?;
    let value = opt(amount, "value");
    if event_code == "AUTHORISATION" && value.and_then(Value::as_i64) == Some(0) {
        // Zero-value authorisation: a card check, no money.
        return ignored();
    }
    let amount_minor = amount_minor(value, "amount.value")?;
    let currency = req_str(amount, "currency", "amount.currency")?;
    check_currency(currency).map_err(|_| {
        invalid("amount.currency must be an ISO 4217 code: three upper-case letters")
    })?;
    let psp_reference = req_str(item, "pspReference", "pspReference")?;
    let transaction_id = format!("{psp_reference}{suffix}");
    check_transaction_id(&transaction_id).map_err(|e| prefixed("pspReference", e))?;
    let parent_transaction_id = match kind.object() {
        ObjectKind::Payment => None,
        ObjectKind::Refund | ObjectKind::Dispute => {
            let parent = opt_str(item, "originalReference", "originalReference")?.ok_or_else(|| {
                invalid(format!(
                    "originalReference is required for {event_code}: it names the payment the money is taken from"
                ))
            })?;
            check_transaction_id(parent).map_err(|e| prefixed("originalReference", e))?;
            Some(parent.to_owned())
        }
    };
    // Unsigned: kept when it reads as a time, never a reason to refuse.
    let occurred_at = opt(item, "eventDate")
        .and_then(Value::as_str)
        .and_then(|s| OffsetDateTime::parse(s, &Rfc3339).ok());
    let event = CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id,
        event_type: kind,
        amount_minor,
        currency: currency.to_owned(),
        parent_transaction_id,
        occurred_at,
        merchant_reference: fields::merchant_reference(item, "merchantReference"),
        metadata: None,
    };
    Ok(if event_code == "CANCEL_OR_REFUND" && success {
        Item::CancelOrRefund(event)
    } else {
        Item::Event(event)
    })
}

/// Appended to a dispute's pspReference for the row of its second chargeback.
pub const SECOND_CHARGEBACK_SUFFIX: &str = ":second_chargeback";

/// A field check's message (`transaction_id must be ...`) naming the field.
fn prefixed(field: &str, e: Reject) -> Reject {
    match e {
        Reject::Invalid(why) => invalid(format!(
            "{field}: {}",
            why.strip_prefix("transaction_id ").unwrap_or(&why)
        )),
        other => other,
    }
}

/// A one-item notification batch of `notice`, unsigned ([`sign_batch`]
/// signs it): the inverse of the mapping of an item. Each canonical kind is sent as the
/// `eventCode` and `success` the mapping reads back as it; any other
/// `event_type` is sent verbatim as the `eventCode`, `success` `true`.
pub fn batch_of(notice: &Notice, ts: i64) -> Result<Value, String> {
    use serde_json::json;
    let (event_code, success) = match notice.event_type.as_str() {
        "payment.succeeded" => ("AUTHORISATION", "true"),
        "payment.failed" => ("AUTHORISATION", "false"),
        "refund.succeeded" => ("REFUND", "true"),
        // `true`: the failure happened.
        "refund.failed" => ("REFUND_FAILED", "true"),
        "dispute.funds_withdrawn" => ("CHARGEBACK", "true"),
        "dispute.funds_reinstated" => ("CHARGEBACK_REVERSED", "true"),
        other => (other, "true"),
    };
    let event_date = psp::rfc3339(ts, 0)?;
    let mut item = json!({
        "additionalData": {},
        "amount": {"currency": notice.currency.as_str(), "value": notice.amount},
        "eventCode": event_code,
        "eventDate": event_date,
        "merchantAccountCode": "FencehookDemoECOM",
        "merchantReference": format!("order-{}", notice.transaction_id),
        "paymentMethod": "visa",
        "pspReference": notice.transaction_id,
        "reason": "",
        "success": success
    });
    if event_code == "AUTHORISATION" {
        item["operations"] = json!(["CANCEL", "CAPTURE", "REFUND"]);
    }
    // A modification or dispute names the payment it is about.
    let original = if psp::names_a_payment(&notice.event_type) {
        Some(psp::parent(notice)?)
    } else {
        notice.payment_transaction_id.as_deref()
    };
    if let Some(original) = original {
        item["originalReference"] = json!(original);
    }
    Ok(json!({
        "live": "false",
        "notificationItems": [{"NotificationRequestItem": item}]
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
        "modification.action",
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
        let items = adyen(&[RUBY_KEY])
            .accept_batch("adyen", body.as_bytes())
            .unwrap();
        assert_eq!(items.len(), 1);
    }

    #[test]
    fn any_configured_key_verifies_and_a_wrong_one_does_not() {
        let body = signed(PHP_KEY, vec![library_item()]);
        assert!(adyen(&[RUBY_KEY, PHP_KEY])
            .accept_batch("adyen", &body)
            .is_ok());
        assert!(adyen(&[PHP_KEY, RUBY_KEY])
            .accept_batch("adyen", &body)
            .is_ok());
        assert!(matches!(
            adyen(&[RUBY_KEY]).accept_batch("adyen", &body),
            Err(Reject::Unauthorized(_))
        ));
    }

    #[test]
    fn one_tampered_missing_or_garbled_signature_rejects_the_batch() {
        let mut second = library_item();
        second["pspReference"] = "7914073381342285".into();
        let good = signed(RUBY_KEY, vec![library_item(), second]);
        let a = adyen(&[RUBY_KEY]);
        assert_eq!(a.accept_batch("adyen", &good).unwrap().len(), 2);
        let text = String::from_utf8(good).unwrap();
        // Change the second item's amount after signing.
        let tampered = text.replacen("1130", "9130", 2).replacen("9130", "1130", 1);
        assert!(matches!(
            a.accept_batch("adyen", tampered.as_bytes()),
            Err(Reject::Unauthorized(_))
        ));
        let unsigned = batch(vec![library_item()]).to_string();
        assert!(matches!(
            a.accept_batch("adyen", unsigned.as_bytes()),
            Err(Reject::Unauthorized(_))
        ));
        let mut garbled = library_item();
        garbled["additionalData"] = json!({"hmacSignature": "not base64!"});
        assert!(matches!(
            a.accept_batch("adyen", batch(vec![garbled]).to_string().as_bytes()),
            Err(Reject::Unauthorized(_))
        ));
    }

    fn accept_one(item: Value) -> Result<Item, Reject> {
        let mut items = adyen(&[RUBY_KEY]).accept_batch("adyen", &signed(RUBY_KEY, vec![item]))?;
        assert_eq!(items.len(), 1);
        Ok(items.remove(0))
    }

    /// The one item of a fixture batch from tests/fixtures/adyen/, unsigned
    /// (the fixtures carry placeholder signatures; `signed` re-signs).
    fn fixture_item(name: &str) -> Value {
        let path = format!("{}/tests/fixtures/adyen/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let batch: Value = serde_json::from_str(&text).unwrap();
        let items = batch["notificationItems"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{name}");
        items[0]["NotificationRequestItem"].clone()
    }

    fn event_of(item: Value) -> CanonicalEvent {
        match accept_one(item.clone()) {
            Ok(Item::Event(e)) => e,
            other => panic!("{item}: {other:?}"),
        }
    }

    fn fixture_event(name: &str) -> CanonicalEvent {
        event_of(fixture_item(name))
    }

    #[test]
    fn the_merchant_reference_is_the_items_merchant_reference() {
        for name in ["AUTHORISATION.openapi.json", "REFUND.openapi.json"] {
            let e = fixture_event(name);
            assert_eq!(
                e.merchant_reference.as_deref(),
                Some("YOUR_MERCHANT_REFERENCE"),
                "{name}"
            );
            assert_eq!(e.metadata, None, "{name}");
        }
        let mut item = fixture_item("AUTHORISATION.openapi.json");
        item.as_object_mut().unwrap().remove("merchantReference");
        assert_eq!(event_of(item).merchant_reference, None);
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

    /// The reason and id of an item that cannot be mapped.
    fn unmappable(item: Value) -> (String, Option<String>) {
        match accept_one(item.clone()) {
            Ok(Item::Unmappable {
                reason,
                transaction_id,
                raw,
                ..
            }) => {
                let raw: Value = serde_json::from_str(&raw).unwrap();
                assert_eq!(raw["eventCode"], item["eventCode"], "raw is the item");
                (reason, transaction_id)
            }
            other => panic!("{item}: {other:?}"),
        }
    }

    fn is_ignored(item: Value) -> bool {
        matches!(accept_one(item), Ok(Item::Ignored { .. }))
    }

    #[test]
    fn authorisations_book_the_payment_and_zero_value_ones_are_ignored() {
        let e = event_of(library_item());
        assert_eq!(
            summary(&e),
            (
                "7914073381342284",
                EventKind::PaymentSucceeded,
                None,
                1130,
                "EUR"
            )
        );
        let mut failed = library_item();
        failed["success"] = "false".into();
        failed["eventDate"] = "2024-05-01T10:00:00+02:00".into();
        let f = event_of(failed);
        assert_eq!(f.event_type, EventKind::PaymentFailed);
        assert!(f.occurred_at.is_some());
        assert_eq!(
            summary(&fixture_event("AUTHORISATION.openapi.json")),
            (
                "QFQTPCQ8HXSKGK82",
                EventKind::PaymentSucceeded,
                None,
                1000,
                "EUR"
            )
        );
        let mut zero_auth = library_item();
        zero_auth["amount"]["value"] = 0.into();
        assert!(is_ignored(zero_auth));
    }

    #[test]
    fn refunds_are_keyed_by_their_own_psp_reference_and_name_the_payment_in_original_reference() {
        let booked = fixture_event("scenario-2-REFUND.json");
        assert_eq!(
            summary(&booked),
            (
                "8826222222222222",
                EventKind::RefundSucceeded,
                Some("8816111111111111"),
                3000,
                "EUR"
            )
        );
        assert_eq!(
            summary(&fixture_event("REFUND.success-true.node-sdk.json")),
            (
                "PSP_REFERENCE",
                EventKind::RefundSucceeded,
                Some("ORIGINAL_PSP"),
                1500,
                "EUR"
            )
        );
        // Refused refunds: recorded failed.
        for name in ["REFUND.success-false.node-sdk.json", "REFUND.openapi.json"] {
            let e = fixture_event(name);
            assert_eq!(e.event_type, EventKind::RefundFailed, "{name}");
            assert!(e.parent_transaction_id.is_some(), "{name}");
        }
        // No originalReference: no payment to check it against.
        let mut orphan = fixture_item("scenario-2-REFUND.json");
        orphan.as_object_mut().unwrap().remove("originalReference");
        let (reason, id) = unmappable(orphan);
        assert!(reason.contains("originalReference"), "{reason}");
        assert_eq!(id.as_deref(), Some("8826222222222222"));
    }

    #[test]
    fn refund_failed_is_linked_by_the_refunds_psp_reference_and_success_true_means_it_failed() {
        let booked = fixture_event("scenario-2-REFUND.json");
        let failed = fixture_event("scenario-3-REFUND_FAILED.json");
        assert_eq!(
            summary(&failed),
            (
                "8826222222222222",
                EventKind::RefundFailed,
                Some("8816111111111111"),
                3000,
                "EUR"
            )
        );
        assert_eq!(
            failed.fingerprint(),
            booked.fingerprint(),
            "the same refund"
        );
        assert_eq!(
            summary(&fixture_event("REFUND_FAILED.openapi.json")),
            (
                "QFQTPCQ8HXSKGK82",
                EventKind::RefundFailed,
                Some("9913140798220028"),
                1000,
                "EUR"
            )
        );
        assert_eq!(
            fixture_event("REFUNDED_REVERSED.openapi.json").event_type,
            EventKind::RefundFailed
        );
        // success "false": the failure did not take place.
        for name in [
            "scenario-3-REFUND_FAILED.json",
            "REFUNDED_REVERSED.openapi.json",
        ] {
            let mut not_executed = fixture_item(name);
            not_executed["success"] = "false".into();
            assert!(is_ignored(not_executed), "{name}");
        }
    }

    /// The item of a `CANCEL_OR_REFUND` whose signed fields say a refund
    /// or a cancel was done, whichever it was.
    fn cancel_or_refund_of(item: Value) -> CanonicalEvent {
        match accept_one(item.clone()) {
            Ok(Item::CancelOrRefund(e)) => e,
            other => panic!("{item}: {other:?}"),
        }
    }

    #[test]
    fn cancel_or_refund_is_decided_by_the_ledger_never_by_its_unsigned_action() {
        let refund = fixture_item("CANCEL_OR_REFUND.refund.adapted.json");
        let expected = (
            "QFQTPCQ8HXSKGK82",
            EventKind::RefundSucceeded,
            Some("9913140798220028"),
            1000,
            "EUR",
        );
        assert_eq!(summary(&cancel_or_refund_of(refund.clone())), expected);
        // The action is not signed: `cancel`, none, or anything else maps alike.
        for action in [Some("cancel"), None, Some("void")] {
            let mut item = refund.clone();
            let extra = item["additionalData"].as_object_mut().unwrap();
            match action {
                Some(a) => extra.insert("modification.action".into(), a.into()),
                None => extra.remove("modification.action"),
            };
            assert_eq!(
                cancel_or_refund_of(item),
                cancel_or_refund_of(refund.clone()),
                "{action:?}"
            );
        }
        let cancel = fixture_item("CANCEL_OR_REFUND.cancel.openapi.json");
        assert_eq!(
            cancel_or_refund_of(cancel).event_type,
            EventKind::RefundSucceeded
        );
        let mut refused = refund;
        refused["success"] = "false".into();
        assert_eq!(event_of(refused).event_type, EventKind::RefundFailed);
    }

    #[test]
    fn unsigned_fields_change_nothing_that_is_booked() {
        for name in [
            "scenario-1-AUTHORISATION.json",
            "scenario-2-REFUND.json",
            "scenario-4-CHARGEBACK.json",
            "CANCEL_OR_REFUND.refund.adapted.json",
        ] {
            let original = fixture_item(name);
            let booked = |item: Value| match accept_one(item) {
                Ok(Item::Event(e) | Item::CancelOrRefund(e)) => (
                    e.transaction_id,
                    e.event_type,
                    e.parent_transaction_id,
                    e.amount_minor,
                    e.currency,
                ),
                other => panic!("{name}: {other:?}"),
            };
            let mut altered = original.clone();
            altered["eventDate"] = "yesterday".into();
            altered["reason"] = "altered".into();
            altered["paymentMethod"] = "mc".into();
            altered["operations"] = json!(["CANCEL", "REFUND"]);
            let extra = altered
                .as_object_mut()
                .unwrap()
                .entry("additionalData")
                .or_insert_with(|| json!({}));
            extra["modification.action"] = "refund".into();
            extra["grossValue"] = 99_999.into();
            extra["originalReference"] = "SOMEONE-ELSE".into();
            assert_eq!(booked(altered), booked(original), "{name}");
        }
    }

    #[test]
    fn an_unmappable_item_is_keyed_by_its_signed_fields_not_its_bytes() {
        let mut lower = fixture_item("AUTHORISATION.openapi.json");
        lower["amount"]["currency"] = "eur".into();
        let key_of = |item: Value| match accept_one(item) {
            Ok(Item::Unmappable { key, raw, .. }) => (key, raw),
            other => panic!("{other:?}"),
        };
        let (key, raw) = key_of(lower.clone());
        let mut altered = lower;
        altered["eventDate"] = "2031-01-01T00:00:00Z".into();
        let (altered_key, altered_raw) = key_of(altered);
        assert_eq!(key, altered_key);
        assert_ne!(raw, altered_raw);
        assert!(key.contains(":eur:AUTHORISATION:"), "{key}");
    }

    #[test]
    fn chargebacks_are_keyed_by_the_disputes_psp_reference_and_a_second_one_is_its_own_dispute() {
        let withdrawn = fixture_event("scenario-4-CHARGEBACK.json");
        let reinstated = fixture_event("scenario-5-CHARGEBACK_REVERSED.json");
        let parent = Some("8816111111111111");
        assert_eq!(
            summary(&withdrawn),
            (
                "8836333333333333",
                EventKind::DisputeFundsWithdrawn,
                parent,
                7000,
                "EUR"
            )
        );
        assert_eq!(
            summary(&reinstated),
            (
                "8836333333333333",
                EventKind::DisputeFundsReinstated,
                parent,
                7000,
                "EUR"
            )
        );
        assert_eq!(withdrawn.fingerprint(), reinstated.fingerprint());
        assert_eq!(
            summary(&fixture_event("CHARGEBACK.java-sdk.json")),
            (
                "9915555555555555",
                EventKind::DisputeFundsWithdrawn,
                Some("9913333333333333"),
                1000,
                "EUR"
            )
        );
        // `amount`, not additionalData.grossValue (2000).
        assert_eq!(fixture_event("CHARGEBACK.openapi.json").amount_minor, 1000);
        // Adyen's own examples of these stages omit originalReference: unmappable.
        for name in [
            "CHARGEBACK_REVERSED.openapi.json",
            "SECOND_CHARGEBACK.openapi.json",
        ] {
            let (reason, id) = unmappable(fixture_item(name));
            assert!(reason.contains("originalReference"), "{name}: {reason}");
            assert_eq!(id.as_deref(), Some("QFQTPCQ8HXSKGK82"));
        }
        let mut second = fixture_item("SECOND_CHARGEBACK.openapi.json");
        second["originalReference"] = "9913140798220028".into();
        assert_eq!(
            summary(&event_of(second)),
            (
                "QFQTPCQ8HXSKGK82:second_chargeback",
                EventKind::DisputeFundsWithdrawn,
                Some("9913140798220028"),
                1000,
                "EUR"
            )
        );
    }

    #[test]
    fn codes_that_move_no_money_here_are_ignored() {
        for name in [
            "NOTIFICATION_OF_CHARGEBACK.openapi.json",
            "CAPTURE.openapi.json",
            "CANCELLATION.openapi.json",
        ] {
            assert!(is_ignored(fixture_item(name)), "{name}");
        }
        for code in [
            "REQUEST_FOR_INFORMATION",
            "PREARBITRATION_WON",
            "PREARBITRATION_LOST",
            "REPORT_AVAILABLE",
        ] {
            let mut item = fixture_item("scenario-4-CHARGEBACK.json");
            item["eventCode"] = code.into();
            assert!(is_ignored(item), "{code}");
        }
        let mut not_charged_back = fixture_item("scenario-4-CHARGEBACK.json");
        not_charged_back["success"] = "false".into();
        assert!(is_ignored(not_charged_back));
    }

    #[test]
    fn one_unmappable_item_does_not_hold_up_the_others_of_its_batch() {
        let mut lower = fixture_item("AUTHORISATION.openapi.json");
        lower["amount"]["currency"] = "eur".into();
        let body = signed(
            RUBY_KEY,
            vec![
                fixture_item("scenario-1-AUTHORISATION.json"),
                lower.clone(),
                fixture_item("scenario-2-REFUND.json"),
            ],
        );
        let items = adyen(&[RUBY_KEY]).accept_batch("adyen", &body).unwrap();
        let [Item::Event(payment), Item::Unmappable {
            reason,
            transaction_id,
            raw,
            ..
        }, Item::Event(refund)] = items.as_slice()
        else {
            panic!("{items:?}")
        };
        assert_eq!(payment.transaction_id, "8816111111111111");
        assert_eq!(refund.transaction_id, "8826222222222222");
        assert!(reason.contains("amount.currency"), "{reason}");
        assert_eq!(transaction_id.as_deref(), Some("QFQTPCQ8HXSKGK82"));
        let raw: Value = serde_json::from_str(raw).unwrap();
        assert_eq!(raw["amount"]["currency"], "eur");
        assert!(
            raw["additionalData"]["hmacSignature"].is_string(),
            "the item as received"
        );
    }

    #[test]
    fn every_bad_field_of_a_well_signed_item_is_unmappable_with_its_reason() {
        let with = |edit: &dyn Fn(&mut Value)| {
            let mut item = fixture_item("scenario-2-REFUND.json");
            edit(&mut item);
            item
        };
        let cases: Vec<(&str, Value)> = vec![
            (
                "amount.value",
                with(&|i| i["amount"]["value"] = (-5).into()),
            ),
            ("amount.value", with(&|i| i["amount"]["value"] = 0.into())),
            (
                "amount.currency",
                with(&|i| i["amount"]["currency"] = "eur".into()),
            ),
            (
                "amount.currency",
                with(&|i| {
                    i["amount"].as_object_mut().unwrap().remove("currency");
                }),
            ),
            (
                "amount",
                with(&|i| {
                    i.as_object_mut().unwrap().remove("amount");
                }),
            ),
            ("success", with(&|i| i["success"] = "yes".into())),
            (
                "originalReference",
                with(&|i| i["originalReference"] = " 88".into()),
            ),
            ("pspReference", with(&|i| i["pspReference"] = "".into())),
        ];
        for (field, item) in cases {
            let (reason, _) = unmappable(item.clone());
            assert!(reason.contains(field), "{item}: {reason}");
        }
        // No id to show: the item is still recorded, without one.
        let no_psp = with(&|i| {
            i.as_object_mut().unwrap().remove("pspReference");
        });
        assert_eq!(unmappable(no_psp).1, None);
        let no_code = with(&|i| {
            i.as_object_mut().unwrap().remove("eventCode");
        });
        assert!(matches!(accept_one(no_code), Ok(Item::Unmappable { .. })));
    }

    #[test]
    fn a_body_that_is_no_notification_batch_is_still_invalid_whole() {
        let a = adyen(&[RUBY_KEY]);
        for body in [
            r#"not json"#,
            r#"[]"#,
            r#"{"live":"false"}"#,
            r#"{"notificationItems":[]}"#,
            r#"{"notificationItems":{}}"#,
            r#"{"notificationItems":[1]}"#,
            r#"{"notificationItems":[{"x":{}}]}"#,
            // Signed fields that are not of Adyen's types cannot even be verified.
            r#"{"notificationItems":[{"NotificationRequestItem":{"amount":{"value":1.5}}}]}"#,
            r#"{"notificationItems":[{"NotificationRequestItem":{"pspReference":7}}]}"#,
        ] {
            assert!(
                matches!(
                    a.accept_batch("adyen", body.as_bytes()),
                    Err(Reject::Invalid(_))
                ),
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
            adyen(&[RUBY_KEY]).accept_batch("adyen", deep.as_bytes()),
            Err(Reject::Invalid(_))
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = adyen(&[RUBY_KEY]).accept_batch("adyen", &body);
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
            let _ = adyen(&[RUBY_KEY]).accept_batch("adyen", b.to_string().as_bytes());
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

    const KEY: &str = "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF";

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(EventKind::ALL, ids(), i64::MAX, "[A-Z]{3}"),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let scheme = Adyen::new(&[KEY.to_owned()]).unwrap();
            let psp = TestCredentials::new(&[(psp::SECRET, KEY)], None);
            // The item's eventDate.
            let event = CanonicalEvent { occurred_at: at(ts), ..event };
            prop_assert_eq!(round_trip(&scheme, &psp, &event, ts)?, event);
        }
    }
}
