//! Square (`square` scheme): the `x-square-hmacsha256-signature` header and
//! Square's payment and refund events.
//!
//! # Signature
//!
//! `x-square-hmacsha256-signature` is the base64 of an HMAC-SHA256 over
//! `{notification_url}{raw body}`, keyed with the webhook subscription's
//! signature key as written (its own bytes, not decoded). Any configured key
//! verifies (rotation: Square's `UpdateWebhookSubscriptionSignatureKey`
//! switches keys at once, so list the new one beside the old for the
//! deliveries still in retry). Square also sends the legacy
//! `x-square-signature` (HMAC-SHA1); it is not read. Comparison is
//! constant-time (`Mac::verify_slice`). Square signs no timestamp: a captured
//! delivery can be replayed, and is then a `duplicate` by its object's key.
//!
//! `notification_url` is part of what is signed, so it must be, byte for
//! byte, the URL the subscription is registered with at Square: the scheme,
//! host, port, path and query as Square has them. What breaks it: a proxy or
//! load balancer that makes the public URL differ from what was registered
//! (another host name, `http` vs `https`, a default port written out), a
//! trailing slash on one side only, a different letter case in the path.
//! fencehook never derives it from the request (whose Host a proxy may
//! rewrite): it is the setting alone.
//!
//! # Mapping (what is booked)
//!
//! | event | booked as | transaction_id | parent | amount |
//! | --- | --- | --- | --- | --- |
//! | `payment.created`, `payment.updated` | `status` `COMPLETED` → payment.succeeded (credit); `FAILED`, `CANCELED` → payment.failed; `APPROVED`, `PENDING` ignored | `data.object.payment.id` | – | `total_money`, else `amount_money` |
//! | `refund.created`, `refund.updated` | `status` `COMPLETED` → refund.succeeded (debit); `FAILED`, `REJECTED` → refund.failed; `PENDING` ignored | `data.object.refund.id` | `data.object.refund.payment_id` | `amount_money` |
//!
//! Every other type is ignored without looking further. The event id is
//! `event_id`; `occurred_at` is the event's `created_at`.
//!
//! Decisions worth knowing (docs/providers.md gives the sources):
//!
//! - A payment is credited its `total_money` (`amount_money` plus the tip),
//!   not `amount_money` alone: it is what came in, and Square lets a
//!   refund take back up to `total_money` (tip included), so crediting
//!   `amount_money` would make the full refund of a tipped payment exceed
//!   its payment and be refused. Without `total_money`, `amount_money`.
//!   Both must be in the same currency.
//! - `data.id` is not the key: Square's own example carries a `data.id`
//!   that differs from the payment's `id`; the object's `id` is.
//! - A payment announced by `payment.created` and by `payment.updated`
//!   (both `COMPLETED`, two event ids) is one transaction: the second is a
//!   `duplicate`. An `APPROVED` (authorised, not captured) payment moves no
//!   money yet: ignored; its `COMPLETED` update books it.

use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fields::{
    self, amount_minor, check_currency, check_transaction_id, invalid, opt, req_object, req_str,
    Object,
};
use super::hmac;
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError};
use super::scheme::{Item, Reject, Scheme};
use super::settings::Secrets;
use super::setup::Setup;
use crate::domain::{CanonicalEvent, EventKind};

/// The header Square signs with (HTTP header names are case-insensitive).
pub const SIGNATURE_HEADER: &str = "x-square-hmacsha256-signature";

/// A Square signature key is 22 characters (16 bytes, base64url).
const MIN_SECRET_CHARS: usize = 22;

/// The URL the subscription is registered with, which Square signs: offered
/// to the tools that play Square (`--notification-url`).
pub const NOTIFICATION_URL: Key = Key {
    flag: "notification-url",
    what: "the notification URL the webhook subscription is registered with",
    in_file: true,
};

/// `[providers.<name>]` of a `square` provider.
#[derive(Deserialize)]
pub struct Settings {
    /// The subscription's signature keys (several: rotation).
    secrets: Option<Secrets>,
    /// The subscription's notification URL, byte for byte.
    notification_url: Option<String>,
}

#[derive(Clone)]
pub struct Square {
    keys: Vec<Vec<u8>>,
    notification_url: String,
}

impl Square {
    pub fn new(keys: &[String], notification_url: &str) -> Result<Square, String> {
        check_url(notification_url)?;
        Ok(Square {
            keys: hmac::keys(keys, "a square signature key is not empty")?,
            notification_url: notification_url.to_owned(),
        })
    }

    pub fn verify(&self, headers: &http::HeaderMap, body: &[u8]) -> Result<(), Reject> {
        let header = fields::signed_header(headers, SIGNATURE_HEADER)?;
        let signature = base64::engine::general_purpose::STANDARD
            .decode(header)
            .map_err(|_| Reject::Unauthorized(format!("{SIGNATURE_HEADER} is not base64")))?;
        let message: [&[u8]; 2] = [self.notification_url.as_bytes(), body];
        if hmac::any_key_verifies(&self.keys, &message, &[signature]) {
            Ok(())
        } else {
            Err(Reject::Unauthorized(
                "signature does not match (is notification_url the subscription's, byte for byte?)"
                    .to_owned(),
            ))
        }
    }
}

/// An absolute `http(s)://` URL without whitespace; kept as written.
fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(rest) if !rest.is_empty() && !url.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) => Ok(()),
        _ => Err(format!(
            "must be the absolute https:// URL the webhook subscription is registered with, byte for byte (got {url:?})"
        )),
    }
}

impl Scheme for Square {
    const NAME: &'static str = "square";
    type Settings = Settings;
    const SIGNATURE_HEADER: Option<&'static str> = Some(SIGNATURE_HEADER);
    const CURRENCY: &'static str = "USD";
    const SENDS: &'static [EventKind] = &[
        EventKind::PaymentSucceeded,
        EventKind::PaymentFailed,
        EventKind::RefundSucceeded,
        EventKind::RefundFailed,
    ];
    const PAYMENT_ID: Option<&'static str> = Some("the payment's id");
    const KEYS: &'static [Key] = &[psp::SECRET, NOTIFICATION_URL];

    fn build(settings: Settings, setup: &mut Setup) -> Result<Square, String> {
        let secrets = setup.required(settings.secrets, "secrets", "a list of strings")?;
        let url = setup.required(
            settings.notification_url,
            "notification_url",
            "the URL the webhook subscription is registered with at Square",
        )?;
        check_url(&url).map_err(|e| setup.error("notification_url", e))?;
        if url.starts_with("http://") {
            setup.warn("notification_url is http://: Square delivers only to https:// URLs");
        }
        let secrets = setup.secrets("secrets", secrets.into_vec());
        setup.offer(&psp::SECRET, &secrets[0]);
        setup.offer(&NOTIFICATION_URL, &url);
        Square::new(&secrets, &url).map_err(|e| setup.error("secrets", e))
    }

    fn short_secret(secret: &str) -> Option<String> {
        (secret.len() < MIN_SECRET_CHARS).then(|| {
            format!(
                "{} characters, shorter than the {MIN_SECRET_CHARS} of a key Square issues",
                secret.len()
            )
        })
    }

    fn psp_event_id(_headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
        fields::envelope_event_id(body)
    }

    async fn accept(
        &self,
        provider: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        _now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.verify(headers, body)?;
        parse_event(provider, body).map(|item| vec![item])
    }

    fn check(psp: &dyn Credentials) -> Result<(), PspError> {
        hmac::check_secret(psp, "a square signature key is not empty")?;
        check_url(psp.key(&NOTIFICATION_URL)?).map_err(|e| PspError::new(NOTIFICATION_URL.flag, e))
    }

    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let url = psp.key(&NOTIFICATION_URL)?;
        let body = psp::body_or(body, || event_of(notice, delivery_id, ts))?;
        let signature = sign(psp.key(&psp::SECRET)?, url, body.as_bytes());
        Ok(Delivery::json(body, vec![(SIGNATURE_HEADER, signature)]))
    }
}

/// Signs like Square: the `x-square-hmacsha256-signature` value for `body`
/// posted to `notification_url`.
pub fn sign(key: &str, notification_url: &str, body: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(hmac::sign(
        key.as_bytes(),
        &[notification_url.as_bytes(), body],
    ))
}

/// A Money object (`{"amount": <minor units>, "currency": "USD"}`) at `path`.
fn money<'a>(obj: &'a Object, key: &str, path: &str) -> Result<(i64, &'a str), Reject> {
    let m = req_object(obj, key, path)?;
    let amount = amount_minor(opt(m, "amount"), &format!("{path}.amount"))?;
    let currency = req_str(m, "currency", &format!("{path}.currency"))?;
    check_currency(currency)?;
    Ok((amount, currency))
}

/// Maps a Square event (see the module docs) strictly: a handled type with a
/// missing or ill-typed field is [`Reject::Invalid`]; a type we do not act on
/// is [`Item::Ignored`] without looking further.
pub fn parse_event(provider: &str, body: &[u8]) -> Result<Item, Reject> {
    let value = fields::parse_json(body)?;
    let event = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object (a Square event)"))?;
    let event_type = req_str(event, "type", "type")?;
    let ignored = || {
        Ok(Item::Ignored {
            event_type: event_type.to_owned(),
        })
    };
    let object_kind = match event_type {
        "payment.created" | "payment.updated" => "payment",
        "refund.created" | "refund.updated" => "refund",
        _ => return ignored(),
    };
    let occurred_at = match fields::opt_str(event, "created_at", "created_at")? {
        None => None,
        Some(text) => Some(
            OffsetDateTime::parse(text, &Rfc3339)
                .map_err(|_| invalid("created_at must be an RFC 3339 date-time"))?,
        ),
    };
    let data = req_object(event, "data", "data")?;
    let object = req_object(data, "object", "data.object")?;
    let path = format!("data.object.{object_kind}");
    let obj = req_object(object, object_kind, &path)?;
    let status = req_str(obj, "status", &format!("{path}.status"))?;
    let (kind, parent, (amount, currency)) = if object_kind == "payment" {
        let kind = match status {
            "COMPLETED" => EventKind::PaymentSucceeded,
            "FAILED" | "CANCELED" => EventKind::PaymentFailed,
            // APPROVED (authorised, not captured), PENDING, or a status this
            // mapping does not know: no money moved yet.
            _ => return ignored(),
        };
        let (amount, currency) = money(obj, "amount_money", &format!("{path}.amount_money"))?;
        let total = match opt(obj, "total_money") {
            None => (amount, currency),
            Some(_) => money(obj, "total_money", &format!("{path}.total_money"))?,
        };
        if total.1 != currency {
            return Err(invalid(format!(
                "{path}.total_money is in {} but amount_money in {currency}",
                total.1
            )));
        }
        (kind, None, total)
    } else {
        let kind = match status {
            "COMPLETED" => EventKind::RefundSucceeded,
            "FAILED" | "REJECTED" => EventKind::RefundFailed,
            // PENDING: a refund.updated settles it.
            _ => return ignored(),
        };
        let parent = req_str(obj, "payment_id", &format!("{path}.payment_id"))?;
        check_transaction_id(parent).map_err(|_| {
            invalid(format!("{path}.payment_id must be 1 to 255 printable ASCII characters, without leading or trailing whitespace"))
        })?;
        let money = money(obj, "amount_money", &format!("{path}.amount_money"))?;
        (kind, Some(parent), money)
    };
    let transaction_id = req_str(obj, "id", &format!("{path}.id"))?;
    check_transaction_id(transaction_id)?;
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id: transaction_id.to_owned(),
        event_type: kind,
        amount_minor: amount,
        currency: currency.to_owned(),
        parent_transaction_id: parent.map(str::to_owned),
        occurred_at,
        merchant_reference: fields::merchant_reference(obj, "reference_id"),
        metadata: None,
    }))
}

/// The Square event of `notice`, as Square sends it: [`parse_event`]'s
/// inverse. A payment is a `payment.updated` (`COMPLETED` or `FAILED`), a
/// refund a `refund.updated` (`COMPLETED` or `FAILED`). Any other
/// `event_type` is sent verbatim as the type of a completed payment.
pub fn event_of(notice: &Notice, event_id: &str, ts: i64) -> Result<Value, String> {
    let at = psp::rfc3339(ts, 0)?;
    let tx = &notice.transaction_id;
    let money = json!({"amount": notice.amount, "currency": notice.currency});
    let payment = |status: &str, card_status: &str| {
        json!({"payment": {
            "id": tx, "created_at": at, "updated_at": at, "amount_money": money,
            "total_money": money, "approved_money": money, "status": status,
            "source_type": "CARD", "location_id": "S8GWD5R9QB376",
            "order_id": "03O3USaPaAaFnI6kkwB1JxGgBsUZY", "reference_id": null,
            "card_details": {"status": card_status, "entry_method": "KEYED",
                "card": {"card_brand": "VISA", "last_4": "1111"}},
            "version_token": "FfQhQJf9r3VSQIgyWBk1oqhIwiznLwVwJbVVA0bdyEv6o"
        }})
    };
    let refund = |status: &str| -> Result<Value, String> {
        Ok(json!({"refund": {
            "id": tx, "created_at": at, "updated_at": at, "amount_money": money,
            "status": status, "location_id": "S8GWD5R9QB376",
            "payment_id": psp::parent(notice)?, "reason": "Requested by customer"
        }}))
    };
    let (event_type, kind, object) = match notice.event_type.as_str() {
        "payment.succeeded" => (
            "payment.updated",
            "payment",
            payment("COMPLETED", "CAPTURED"),
        ),
        "payment.failed" => ("payment.updated", "payment", payment("FAILED", "FAILED")),
        "refund.succeeded" => ("refund.updated", "refund", refund("COMPLETED")?),
        "refund.failed" => ("refund.updated", "refund", refund("FAILED")?),
        "dispute.funds_withdrawn" | "dispute.funds_reinstated" => {
            return Err(psp::not_sent(Square::NAME, Square::SENDS, notice))
        }
        other => (other, "payment", payment("COMPLETED", "CAPTURED")),
    };
    Ok(json!({
        "merchant_id": "6SSW7HV8K2ST5", "type": event_type, "event_id": event_id,
        "created_at": at, "data": {"type": kind, "id": tx, "object": object}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{self, arbitrary_json, summary, with};
    use proptest::prelude::*;

    const KEY: &str = "fencehook-square-test-signature-key";
    const OLD: &str = "fencehook-square-key-before-the-rotation";
    const URL: &str = "https://hooks.example.com/webhooks/square";

    const SQUARE_KEYS: &[&str] = &[
        "type",
        "event_id",
        "created_at",
        "data",
        "object",
        "payment",
        "refund",
        "id",
        "status",
        "amount_money",
        "total_money",
        "amount",
        "currency",
        "payment_id",
    ];

    fn fixture(name: &str) -> Vec<u8> {
        testing::fixture("square", name)
    }

    fn square(keys: &[&str], url: &str) -> Square {
        Square::new(&keys.iter().map(|s| s.to_string()).collect::<Vec<_>>(), url).unwrap()
    }

    fn headers(value: &str) -> http::HeaderMap {
        testing::header(SIGNATURE_HEADER, value)
    }

    fn event(body: &[u8]) -> CanonicalEvent {
        match parse_event("square", body) {
            Ok(Item::Event(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_merchant_reference_is_the_payments_reference_id() {
        let body = fixture("payment.updated.completed.json");
        // The documentation's example sets none.
        assert_eq!(event(&body).merchant_reference, None);
        let mut value: Value = serde_json::from_slice(&body).unwrap();
        value["data"]["object"]["payment"]["reference_id"] = "order-1042".into();
        let e = event(&serde_json::to_vec(&value).unwrap());
        assert_eq!(e.merchant_reference.as_deref(), Some("order-1042"));
        assert_eq!(e.metadata, None);
    }

    #[test]
    fn the_pinned_vectors_verify_squares_own_and_pythons_hmac_over_the_fixtures() {
        let vectors: Vec<Value> =
            serde_json::from_slice(&fixture("vectors.json")).expect("vectors.json");
        assert_eq!(vectors.len(), 3);
        for v in &vectors {
            let key = v["signature_key"].as_str().unwrap();
            let url = v["notification_url"].as_str().unwrap();
            let body = match v["file"].as_str() {
                Some(file) => fixture(file),
                None => v["body"].as_str().unwrap().as_bytes().to_vec(),
            };
            let signature = v["signature"].as_str().unwrap();
            assert_eq!(sign(key, url, &body), signature, "{v}");
            assert_eq!(
                square(&[OLD, key], url).verify(&headers(signature), &body),
                Ok(()),
                "{v}"
            );
        }
    }

    #[test]
    fn one_byte_changed_another_key_or_another_url_is_refused() {
        let body = fixture("payment.updated.completed.json");
        let h = headers(&sign(KEY, URL, &body));
        assert_eq!(square(&[KEY], URL).verify(&h, &body), Ok(()));
        let mut changed = body.clone();
        let i = changed.len() / 2;
        changed[i] ^= 0x01;
        assert!(matches!(
            square(&[KEY], URL).verify(&h, &changed),
            Err(Reject::Unauthorized(_))
        ));
        assert!(square(&[OLD], URL).verify(&h, &body).is_err());
        for other in [
            "https://hooks.example.com/webhooks/square/",
            "http://hooks.example.com/webhooks/square",
            "https://hooks.example.com:443/webhooks/square",
            "https://HOOKS.example.com/webhooks/square",
            "https://internal-lb.example.net/webhooks/square",
        ] {
            assert!(
                matches!(square(&[KEY], other).verify(&h, &body), Err(Reject::Unauthorized(why)) if why.contains("notification_url")),
                "{other}"
            );
        }
        for bad in ["", "not base64!", "AAAA"] {
            let mut h = http::HeaderMap::new();
            h.insert(SIGNATURE_HEADER, bad.parse().unwrap());
            assert!(square(&[KEY], URL).verify(&h, &body).is_err(), "{bad:?}");
        }
        assert!(square(&[KEY], URL)
            .verify(&http::HeaderMap::new(), &body)
            .is_err());
    }

    #[test]
    fn after_a_key_rotation_both_keys_verify() {
        let body = fixture("refund.updated.completed.json");
        let s = square(&[KEY, OLD], URL);
        for key in [KEY, OLD] {
            assert_eq!(s.verify(&headers(&sign(key, URL, &body)), &body), Ok(()));
        }
    }

    #[test]
    fn a_notification_url_that_is_not_an_absolute_url_is_refused() {
        for url in [
            "",
            "hooks.example.com/x",
            "https://",
            "https://a b",
            "ftp://x",
        ] {
            assert!(Square::new(&[KEY.to_owned()], url).is_err(), "{url:?}");
        }
        assert!(Square::new(&[String::new()], URL).is_err());
    }

    #[test]
    fn a_square_provider_needs_its_notification_url_and_keeps_it_as_written() {
        let table = |rest: &str| {
            crate::providers::Provider::from_toml_str(&format!(
                "[providers.sq]\nscheme = \"square\"\n{rest}"
            ))
        };
        let err = table("secrets = [\"fencehook-square-test-signature-key\"]").unwrap_err();
        assert!(
            matches!(err.lines(), [line] if line.starts_with("provider `sq`: notification_url: required")),
            "{err}"
        );
        let err =
            table("secrets = [\"k\"]\nnotification_url = \"hooks.example.com/sq\"").unwrap_err();
        assert!(
            err.lines()[0].starts_with("provider `sq`: notification_url: must be the absolute"),
            "{err}"
        );
        let http = table("secrets = [\"fencehook-square-test-signature-key\"]\nnotification_url = \"http://127.0.0.1:8080/webhooks/sq/\"")
            .unwrap();
        assert!(
            http[0].warnings()[0].contains("https://"),
            "{:?}",
            http[0].warnings()
        );
        // Kept byte for byte, trailing slash included: what send signs for.
        assert_eq!(
            http[0].psp_value(&NOTIFICATION_URL),
            Some("http://127.0.0.1:8080/webhooks/sq/")
        );
        // A key shorter than Square's is an exposure (refused at start).
        let with_key = |key: &str| {
            table(&format!(
                "secrets = [\"{key}\"]\nnotification_url = \"https://x.example/sq\""
            ))
            .unwrap()
            .remove(0)
        };
        let short = with_key("a-21-character-key-xx");
        assert!(
            short.exposures()[0].starts_with("provider `sq`: secrets: "),
            "{:?}",
            short.exposures()
        );
        assert!(with_key("a-22-character-key-xxx").exposures().is_empty());
    }

    #[test]
    fn each_fixture_books_what_square_means() {
        let pay = "hYy9pRFVxpDsO1FB05SunFWUe9JZY";
        let completed = event(&fixture("payment.updated.completed.json"));
        assert_eq!(
            summary(&completed),
            (pay, EventKind::PaymentSucceeded, None, 100, "USD")
        );
        assert_eq!(
            completed.occurred_at,
            OffsetDateTime::parse("2020-02-06T21:27:34.308Z", &Rfc3339).ok()
        );
        let failed = event(&fixture("payment.updated.failed.json"));
        assert_eq!(
            summary(&failed),
            (pay, EventKind::PaymentFailed, None, 100, "USD")
        );
        assert_eq!(failed.fingerprint(), completed.fingerprint());
        let refund = "KkAkhdMsgzn59SM8A89WgKwekxLZY_ptNBVqHYxt5gAdfcobBe4u1AZsXhoz06KTtuq9Ls24P";
        let parent = Some("KkAkhdMsgzn59SM8A89WgKwekxLZY");
        assert_eq!(
            summary(&event(&fixture("refund.updated.completed.json"))),
            (refund, EventKind::RefundSucceeded, parent, 1000, "USD")
        );
        assert_eq!(
            summary(&event(&fixture("refund.updated.failed.json"))),
            (refund, EventKind::RefundFailed, parent, 1000, "USD")
        );
        for name in [
            "payment.created.approved.json",
            "refund.created.pending.json",
        ] {
            assert!(
                matches!(
                    parse_event("square", &fixture(name)),
                    Ok(Item::Ignored { .. })
                ),
                "{name}"
            );
        }
        assert_eq!(
            Square::psp_event_id(
                &http::HeaderMap::new(),
                &fixture("refund.updated.completed.json")
            ),
            Some("bc316346-6691-4243-88ed-6d651a0d0c47".to_owned())
        );
    }

    const PAYMENT: &[&str] = &["data", "object", "payment"];

    fn at_payment(field: &str) -> Vec<&str> {
        let mut p = PAYMENT.to_vec();
        p.push(field);
        p
    }

    #[test]
    fn a_tipped_payment_is_credited_its_total_money() {
        let body = fixture("payment.updated.completed.json");
        let tipped = with(
            &body,
            &at_payment("tip_money"),
            json!({"amount": 20, "currency": "USD"}),
        );
        let tipped = with(
            &tipped,
            &at_payment("total_money"),
            json!({"amount": 120, "currency": "USD"}),
        );
        assert_eq!(event(&tipped).amount_minor, 120);
        let no_total = with(&body, &at_payment("total_money"), Value::Null);
        assert_eq!(event(&no_total).amount_minor, 100);
        let mixed = with(
            &body,
            &at_payment("total_money"),
            json!({"amount": 100, "currency": "EUR"}),
        );
        assert!(matches!(parse_event("p", &mixed), Err(Reject::Invalid(_))));
    }

    #[test]
    fn other_statuses_and_types_are_ignored() {
        let body = fixture("payment.updated.completed.json");
        let canceled = with(&body, &at_payment("status"), json!("CANCELED"));
        assert_eq!(event(&canceled).event_type, EventKind::PaymentFailed);
        for status in ["APPROVED", "PENDING", "SOMETHING_NEW"] {
            let b = with(&body, &at_payment("status"), json!(status));
            assert!(
                matches!(parse_event("p", &b), Ok(Item::Ignored { .. })),
                "{status}"
            );
        }
        let refund = fixture("refund.updated.completed.json");
        let rejected = with(
            &refund,
            &["data", "object", "refund", "status"],
            json!("REJECTED"),
        );
        assert_eq!(event(&rejected).event_type, EventKind::RefundFailed);
        for t in [
            "order.updated",
            "dispute.created",
            "webhooks.test_notification",
        ] {
            let b = format!(r#"{{"type":"{t}"}}"#);
            assert!(matches!(
                parse_event("p", b.as_bytes()),
                Ok(Item::Ignored { .. })
            ));
        }
    }

    #[test]
    fn bad_shapes_of_handled_types_are_invalid() {
        let pay = fixture("payment.updated.completed.json");
        let refund = fixture("refund.updated.completed.json");
        let r = |f: &'static str| vec!["data", "object", "refund", f];
        let cases: Vec<Vec<u8>> = vec![
            with(
                &pay,
                &at_payment("amount_money"),
                json!({"amount": "100", "currency": "USD"}),
            ),
            with(
                &pay,
                &at_payment("amount_money"),
                json!({"amount": 1.5, "currency": "USD"}),
            ),
            with(
                &pay,
                &at_payment("amount_money"),
                json!({"amount": 0, "currency": "USD"}),
            ),
            with(
                &pay,
                &at_payment("amount_money"),
                json!({"amount": 100, "currency": "usd"}),
            ),
            with(&pay, &at_payment("amount_money"), Value::Null),
            with(
                &pay,
                &at_payment("total_money"),
                json!({"amount": -1, "currency": "USD"}),
            ),
            with(&pay, &at_payment("id"), json!(" x")),
            with(&pay, &at_payment("id"), Value::Null),
            with(&pay, &at_payment("status"), json!(5)),
            with(&pay, &["created_at"], json!("yesterday")),
            with(&pay, &["data", "object"], json!("payment")),
            with(&refund, &r("payment_id"), Value::Null),
            with(&refund, &r("payment_id"), json!("")),
            with(&refund, &r("amount_money"), json!({"amount": 1000})),
        ];
        for body in cases {
            assert!(
                matches!(parse_event("p", &body), Err(Reject::Invalid(_))),
                "{}",
                String::from_utf8_lossy(&body)
            );
        }
        for body in [&b"not json"[..], b"[]", br#"{"type":5}"#, br#"{"data":{}}"#] {
            assert!(matches!(parse_event("p", body), Err(Reject::Invalid(_))));
        }
    }

    proptest! {
        #[test]
        fn verify_and_map_never_panic(
            header in "[ -~]{0,100}",
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let s = square(&[KEY], URL);
            let mut h = http::HeaderMap::new();
            if let Ok(v) = header.parse() {
                h.insert(SIGNATURE_HEADER, v);
            }
            let _ = s.verify(&h, &body);
            let _ = parse_event("square", &body);
        }

        #[test]
        fn signed_arbitrary_events_never_panic(
            event_type in prop::sample::select(vec![
                "payment.created", "payment.updated", "refund.created", "refund.updated",
                "order.updated"]),
            data in arbitrary_json(SQUARE_KEYS),
        ) {
            let body = serde_json::to_vec(&json!({"type": event_type, "data": data})).unwrap();
            let h = headers(&sign(KEY, URL, &body));
            prop_assert!(square(&[KEY], URL).verify(&h, &body).is_ok());
            let _ = parse_event("square", &body);
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

    const KEY: &str = "fencehook-square-round-trip-key";
    const URL: &str = "https://hooks.example.com/webhooks/square";

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(Square::SENDS, ids(), i64::MAX, "[A-Z]{3}"),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let scheme = Square::new(&[KEY.to_owned()], URL).unwrap();
            let psp = TestCredentials::new(&[(psp::SECRET, KEY), (NOTIFICATION_URL, URL)], None);
            // The event's `created_at`.
            let event = CanonicalEvent { occurred_at: at(ts), ..event };
            prop_assert_eq!(round_trip(&scheme, &psp, &event, ts)?, event);
        }
    }
}
