//! Checkout.com (`checkout` scheme): the `Cko-Signature` header and
//! Checkout.com's payment events.
//!
//! # Signature
//!
//! `Cko-Signature` is the hex HMAC-SHA256 of the raw body, keyed with the
//! webhook's signature key (its bytes as configured; Checkout.com signs with
//! the key as text). Nothing else is signed: there is no timestamp, so no
//! window (a captured delivery replays as a duplicate, booked once). Any
//! configured key may verify (rotation: list the new key beside the old one
//! while Checkout.com switches). Comparison is constant-time
//! (`Mac::verify_slice`); hex of either case is read.
//!
//! # Mapping (what is booked)
//!
//! | event | booked as | transaction_id | parent | amount |
//! | --- | --- | --- | --- | --- |
//! | `payment_captured` | payment.succeeded (credit) | `data.id` (`pay_…`) | – | `data.amount` |
//! | `payment_declined`, `payment_capture_declined` | payment.failed | `data.id` | – | `data.amount` |
//! | `payment_refunded` | refund.succeeded (debit) | `data.action_id` (`act_…`) | `data.id` | `data.amount` |
//! | `payment_refund_declined` | refund.failed | `data.action_id` | `data.id` | `data.amount` |
//!
//! Amounts are Checkout.com's minor units as sent; `data.currency` must be
//! ISO 4217 upper case, as Checkout.com sends it. Every other type is
//! ignored without looking further (`payment_approved`, an authorisation
//! that moves no money yet; `payment_refund_pending`; disputes, which this
//! scheme does not book). A declined payment of amount 0 (a card
//! verification) moves no money: ignored. `occurred_at` is the event's
//! `timestamp` (current format) or `created_on` (earlier format), RFC 3339.
//!
//! Decisions worth knowing (docs/providers.md gives the sources):
//!
//! - A payment is keyed by `data.id` in every event about it, so a declined
//!   capture followed by a successful one is one payment: failed, then
//!   succeeded (the lifecycle books it).
//! - A refund is keyed by its action id: each refund of a payment is its own
//!   row, a partial refund a debit of its own amount under the payment.
//! - Checkout.com reads only the status of the answer (2xx): fencehook's own
//!   JSON body.

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fields::{
    self, amount_minor, check_currency, check_transaction_id, invalid, opt, req_object, req_str,
};
use super::hmac;
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError};
use super::scheme::{Item, Reject, Scheme};
use super::setup::Setup;
use crate::domain::{CanonicalEvent, EventKind};

/// The header Checkout.com signs with (HTTP header names are case-insensitive).
pub const SIGNATURE_HEADER: &str = "cko-signature";

/// Keys shorter than this are a guess away (fencehook's floor: the key is
/// chosen or generated in Checkout.com's Dashboard, in no fixed format).
const MIN_KEY_BYTES: usize = 16;

#[derive(Clone)]
pub struct Checkout {
    keys: Vec<Vec<u8>>,
}

impl Checkout {
    pub fn new(secrets: &[String]) -> Result<Checkout, String> {
        let keys = hmac::keys(secrets, "a Checkout.com signature key is not empty")?;
        Ok(Checkout { keys })
    }

    pub fn verify(&self, headers: &http::HeaderMap, body: &[u8]) -> Result<(), Reject> {
        let signature = fields::hex_signature(headers, SIGNATURE_HEADER, "Cko-Signature")?;
        fields::signature_matched(hmac::any_key_verifies(&self.keys, &[body], &[signature]))
    }
}

impl Scheme for Checkout {
    const NAME: &'static str = "checkout";
    type Settings = hmac::Table;
    const SIGNATURE_HEADER: Option<&'static str> = Some(SIGNATURE_HEADER);
    const DELIVERY_ID_PREFIX: &'static str = "evt_";
    const PAYMENT_ID: Option<&'static str> = Some("the payment's pay_ id");
    const SENDS: &'static [EventKind] = &[
        EventKind::PaymentSucceeded,
        EventKind::PaymentFailed,
        EventKind::RefundSucceeded,
        EventKind::RefundFailed,
    ];
    const KEYS: &'static [Key] = &[psp::SECRET];

    fn build(settings: hmac::Table, setup: &mut Setup) -> Result<Checkout, String> {
        let secrets = settings.read(setup)?;
        Checkout::new(&secrets).map_err(|e| setup.error("secrets", e))
    }

    fn short_secret(secret: &str) -> Option<String> {
        (secret.len() < MIN_KEY_BYTES).then(|| {
            format!(
                "{} bytes, shorter than the {MIN_KEY_BYTES} fencehook asks of a Checkout.com signature key",
                secret.len()
            )
        })
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
        _now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.verify(headers, body)?;
        Ok(vec![parse_event(provider, body)?])
    }

    fn check(psp: &dyn Credentials) -> Result<(), PspError> {
        hmac::check_secret(psp, "an empty signature key")
    }

    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let body = psp::body_or(body, || event_of(notice, delivery_id, ts))?;
        let signature = sign(psp.key(&psp::SECRET)?, body.as_bytes());
        Ok(Delivery::json(body, vec![(SIGNATURE_HEADER, signature)]))
    }
}

/// Signs like Checkout.com: the `Cko-Signature` value (lower-case hex) of `body`.
pub fn sign(key: &str, body: &[u8]) -> String {
    hex::encode(hmac::sign(key.as_bytes(), &[body]))
}

/// Maps a Checkout.com event (see the module docs) strictly: a handled type
/// with a missing or ill-typed field is [`Reject::Invalid`]; a type we do not
/// act on is [`Item::Ignored`] without looking further.
pub fn parse_event(provider: &str, body: &[u8]) -> Result<Item, Reject> {
    let value = fields::parse_json(body)?;
    let event = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object (a Checkout.com event)"))?;
    let event_type = req_str(event, "type", "type")?;
    let ignored = || {
        Ok(Item::Ignored {
            event_type: event_type.to_owned(),
        })
    };
    let kind = match event_type {
        "payment_captured" => EventKind::PaymentSucceeded,
        "payment_declined" | "payment_capture_declined" => EventKind::PaymentFailed,
        "payment_refunded" => EventKind::RefundSucceeded,
        "payment_refund_declined" => EventKind::RefundFailed,
        _ => return ignored(),
    };
    let occurred_at = match opt(event, "timestamp").or_else(|| opt(event, "created_on")) {
        None => None,
        Some(Value::String(s)) => Some(
            OffsetDateTime::parse(s, &Rfc3339)
                .map_err(|_| invalid("timestamp must be an RFC 3339 timestamp"))?,
        ),
        Some(_) => return Err(invalid("timestamp must be an RFC 3339 string")),
    };
    let data = req_object(event, "data", "data")?;
    let payment_id = req_str(data, "id", "data.id")?;
    check_transaction_id(payment_id)?;
    let currency = req_str(data, "currency", "data.currency")?;
    check_currency(currency)?;
    // A declined card verification (amount 0) moves no money.
    if kind == EventKind::PaymentFailed
        && matches!(opt(data, "amount"), Some(v) if v.as_i64() == Some(0))
    {
        return ignored();
    }
    let amount_minor = amount_minor(opt(data, "amount"), "data.amount")?;
    let (transaction_id, parent) = match kind {
        EventKind::PaymentSucceeded | EventKind::PaymentFailed => (payment_id, None),
        _ => {
            let action_id = req_str(data, "action_id", "data.action_id")?;
            check_transaction_id(action_id)?;
            (action_id, Some(payment_id.to_owned()))
        }
    };
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id: transaction_id.to_owned(),
        event_type: kind,
        amount_minor,
        currency: currency.to_owned(),
        parent_transaction_id: parent,
        occurred_at,
        merchant_reference: fields::merchant_reference(data, "reference"),
        metadata: None,
    }))
}

/// The Checkout.com event `notice` is announced by, as Checkout.com sends it
/// (current format, `timestamp` at `ts`): [`parse_event`]'s inverse. A kind
/// Checkout.com sends no event for is refused; any other `event_type` is
/// sent verbatim as the type, about a payment.
pub fn event_of(notice: &Notice, event_id: &str, ts: i64) -> Result<Value, String> {
    let kind = EventKind::from_generic(&notice.event_type);
    if let Some(kind) = kind {
        if !Checkout::SENDS.contains(&kind) {
            return Err(psp::not_sent(Checkout::NAME, Checkout::SENDS, notice));
        }
    }
    let timestamp = psp::rfc3339(ts, 0)?;
    let tx = notice.transaction_id.as_str();
    let (event_type, payment, action, code, summary) = match kind {
        Some(EventKind::PaymentSucceeded) => ("payment_captured", tx, None, "10000", "Approved"),
        Some(EventKind::PaymentFailed) => {
            ("payment_declined", tx, None, "20051", "Insufficient Funds")
        }
        Some(EventKind::RefundSucceeded) => (
            "payment_refunded",
            psp::parent(notice)?,
            Some(tx),
            "10000",
            "Approved",
        ),
        Some(_) => (
            "payment_refund_declined",
            psp::parent(notice)?,
            Some(tx),
            "20057",
            "Transaction not permitted to cardholder",
        ),
        None => (notice.event_type.as_str(), tx, None, "10000", "Approved"),
    };
    let action_id = action.map_or_else(
        || format!("act_{}", event_id.trim_start_matches("evt_")),
        str::to_owned,
    );
    Ok(json!({
        "id": event_id,
        "source": "gateway",
        "type": event_type,
        "timestamp": timestamp,
        "version": "1.0.29",
        "data": {
            "id": payment,
            "action_id": action_id,
            "reference": "ORD-fencehook",
            "amount": notice.amount,
            "processed_on": timestamp,
            "response_code": code,
            "response_summary": summary,
            "metadata": {},
            "currency": notice.currency,
        },
        "_links": {
            "self": {"href": format!("https://api.checkout.com/workflows/events/{event_id}")},
            "subject": {"href": format!("https://api.checkout.com/workflows/events/subject/{payment}")}
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{self, arbitrary_json, summary};
    use futures_util::FutureExt;
    use proptest::prelude::*;

    /// The key tests/fixtures/checkout/signatures.txt was computed with.
    const KEY: &str = "fencehook-checkout-test-key-not-a-secret";
    const OLD: &str = "fencehook-checkout-key-before-the-roll";

    fn fixture(name: &str) -> Vec<u8> {
        testing::fixture("checkout", name)
    }

    fn headers(signature: &str) -> http::HeaderMap {
        testing::header(SIGNATURE_HEADER, signature)
    }

    fn checkout(keys: &[&str]) -> Checkout {
        Checkout::new(&keys.iter().map(|k| k.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn accepted(c: &Checkout, h: &http::HeaderMap, body: &[u8]) -> Result<Vec<Item>, Reject> {
        c.accept("checkout", h, body, 0)
            .now_or_never()
            .expect("never waits")
    }

    fn mapped(name: &str) -> CanonicalEvent {
        match parse_event("checkout", &fixture(name)) {
            Ok(Item::Event(e)) => e,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn the_merchant_reference_is_the_payments_reference() {
        assert_eq!(
            mapped("payment_captured.json")
                .merchant_reference
                .as_deref(),
            Some("ORD-5023-4E89")
        );
        assert_eq!(
            mapped("payment_refunded.json")
                .merchant_reference
                .as_deref(),
            Some("ORD-5023-4E89")
        );
        assert_eq!(
            mapped("payment_declined.json")
                .merchant_reference
                .as_deref(),
            Some("ORD-5024-0F11")
        );
    }

    #[test]
    fn every_fixture_verifies_with_the_signature_python_computed_and_sign_agrees() {
        // tests/fixtures/checkout/signatures.txt: Python's hmac over each file's bytes
        // (tests/fixtures/README.md gives the command).
        let vectors = String::from_utf8(fixture("signatures.txt")).unwrap();
        let c = checkout(&[KEY]);
        let mut n = 0;
        for line in vectors.lines() {
            let (name, hex_sig) = line.split_once(" sha256=").unwrap();
            let body = fixture(name);
            assert_eq!(sign(KEY, &body), hex_sig, "{name}");
            assert!(c.verify(&headers(hex_sig), &body).is_ok(), "{name}");
            assert!(
                c.verify(&headers(&hex_sig.to_ascii_uppercase()), &body)
                    .is_ok(),
                "{name}: upper-case hex"
            );
            n += 1;
        }
        assert_eq!(n, 6);
    }

    #[test]
    fn a_changed_byte_another_key_a_missing_or_malformed_header_are_refused() {
        let c = checkout(&[KEY]);
        let body = fixture("payment_captured.json");
        let good = sign(KEY, &body);
        let mut changed = body.clone();
        let at = changed.iter().position(|b| *b == b'1').unwrap();
        changed[at] = b'2';
        for (what, h, b) in [
            ("one byte changed", headers(&good), changed.as_slice()),
            (
                "another key",
                headers(&sign("someone-else-s-key-000", &body)),
                &body,
            ),
            ("no header", http::HeaderMap::new(), &body),
            ("not hex", headers("zz"), &body),
            ("empty", headers(""), &body),
            ("truncated", headers(&good[..62]), &body),
        ] {
            assert!(
                matches!(accepted(&c, &h, b), Err(Reject::Unauthorized(_))),
                "{what}"
            );
        }
    }

    #[test]
    fn any_configured_key_verifies_during_a_rotation() {
        let c = checkout(&[OLD, KEY]);
        let body = fixture("payment_refunded.json");
        for key in [OLD, KEY] {
            assert!(
                c.verify(&headers(&sign(key, &body)), &body).is_ok(),
                "{key}"
            );
        }
        assert!(checkout(&[KEY])
            .verify(&headers(&sign(OLD, &body)), &body)
            .is_err());
    }

    #[test]
    fn each_event_type_maps_as_the_table_says() {
        let pay = "pay_vti5layihapu5bhbn5tjtk6eem";
        assert_eq!(
            summary(&mapped("payment_captured.json")),
            (pay, EventKind::PaymentSucceeded, None, 10000, "EUR")
        );
        assert_eq!(
            summary(&mapped("payment_capture_declined.json")),
            (pay, EventKind::PaymentFailed, None, 10000, "EUR")
        );
        assert_eq!(
            summary(&mapped("payment_declined.json")),
            (
                "pay_mlbkttmkrlrubmdfzqw7kbrbvq",
                EventKind::PaymentFailed,
                None,
                4599,
                "GBP"
            )
        );
        assert_eq!(
            summary(&mapped("payment_refunded.json")),
            (
                "act_7fmebms4rtmuja2poigylogjk4",
                EventKind::RefundSucceeded,
                Some(pay),
                2500,
                "EUR"
            )
        );
        assert_eq!(
            summary(&mapped("payment_refund_declined.json")),
            (
                "act_ewvmcqu4uq4e3nhjkitdvymkge",
                EventKind::RefundFailed,
                Some(pay),
                1000,
                "EUR"
            )
        );
        // The capture declined, then made: one payment, one fingerprint.
        assert_eq!(
            mapped("payment_capture_declined.json").fingerprint(),
            mapped("payment_captured.json").fingerprint()
        );
        // Both timestamp formats.
        assert_eq!(
            mapped("payment_captured.json").occurred_at,
            Some(OffsetDateTime::parse("2023-05-24T09:12:32.357+00:00", &Rfc3339).unwrap())
        );
        assert_eq!(
            mapped("payment_refunded.json").occurred_at,
            Some(OffsetDateTime::parse("2023-05-25T11:35:03Z", &Rfc3339).unwrap())
        );
    }

    #[test]
    fn other_types_and_zero_amount_declines_are_ignored() {
        assert!(matches!(
            parse_event("checkout", &fixture("payment_approved.json")),
            Ok(Item::Ignored { .. })
        ));
        for t in [
            "payment_refund_pending",
            "dispute_received",
            "card_verified",
        ] {
            let body = json!({"id": "evt_1", "type": t}).to_string();
            assert!(
                matches!(
                    parse_event("checkout", body.as_bytes()),
                    Ok(Item::Ignored { .. })
                ),
                "{t}"
            );
        }
        let verification = json!({"id": "evt_1", "type": "payment_declined",
            "data": {"id": "pay_1", "amount": 0, "currency": "EUR"}});
        assert!(matches!(
            parse_event("checkout", verification.to_string().as_bytes()),
            Ok(Item::Ignored { .. })
        ));
    }

    /// A change made to a well-formed event.
    type Change = Box<dyn Fn(&mut Value)>;

    #[test]
    fn bad_shapes_of_handled_types_are_invalid() {
        let base =
            || -> Value { serde_json::from_slice(&fixture("payment_refunded.json")).unwrap() };
        let cases: Vec<(&str, Change)> = vec![
            (
                "amount float",
                Box::new(|v| v["data"]["amount"] = json!(25.0)),
            ),
            (
                "amount string",
                Box::new(|v| v["data"]["amount"] = json!("2500")),
            ),
            ("amount zero", Box::new(|v| v["data"]["amount"] = json!(0))),
            (
                "amount negative",
                Box::new(|v| v["data"]["amount"] = json!(-1)),
            ),
            ("no amount", Box::new(|v| v["data"]["amount"] = Value::Null)),
            (
                "lower-case currency",
                Box::new(|v| v["data"]["currency"] = json!("eur")),
            ),
            (
                "no currency",
                Box::new(|v| v["data"]["currency"] = Value::Null),
            ),
            (
                "no action_id",
                Box::new(|v| v["data"]["action_id"] = Value::Null),
            ),
            ("padded id", Box::new(|v| v["data"]["id"] = json!(" pay_1"))),
            ("id a number", Box::new(|v| v["data"]["id"] = json!(7))),
            ("no data", Box::new(|v| v["data"] = Value::Null)),
            ("data a string", Box::new(|v| v["data"] = json!("x"))),
            (
                "bad created_on",
                Box::new(|v| v["created_on"] = json!("yesterday")),
            ),
            ("type a number", Box::new(|v| v["type"] = json!(5))),
        ];
        for (what, change) in cases {
            let mut v = base();
            change(&mut v);
            assert!(
                matches!(
                    parse_event("checkout", v.to_string().as_bytes()),
                    Err(Reject::Invalid(_))
                ),
                "{what}"
            );
        }
        for body in [
            &b"not json"[..],
            b"[]",
            b"{}",
            br#"{"type":"payment_captured","type":"x"}"#,
        ] {
            assert!(matches!(
                parse_event("checkout", body),
                Err(Reject::Invalid(_))
            ));
        }
    }

    #[test]
    fn a_signed_but_malformed_body_is_invalid_through_accept() {
        let c = checkout(&[KEY]);
        let body = br#"{"id":"evt_1","type":"payment_captured","data":{"id":"pay_1","amount":"10","currency":"EUR"}}"#;
        assert!(matches!(
            accepted(&c, &headers(&sign(KEY, body)), body),
            Err(Reject::Invalid(_))
        ));
    }

    #[test]
    fn short_keys_are_exposures_and_empty_ones_refused() {
        assert!(Checkout::short_secret("short-key").is_some());
        assert!(Checkout::short_secret(KEY).is_none());
        assert!(Checkout::new(&[String::new()]).is_err());
    }

    const KEYS: &[&str] = &[
        "id",
        "type",
        "data",
        "amount",
        "currency",
        "action_id",
        "timestamp",
        "created_on",
    ];

    proptest! {
        #[test]
        fn verify_and_map_never_panic(
            header in "[ -~]{0,80}",
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let c = checkout(&[KEY]);
            let mut h = http::HeaderMap::new();
            if let Ok(v) = header.parse() {
                h.insert(SIGNATURE_HEADER, v);
            }
            let _ = c.verify(&h, &body);
            let _ = parse_event("checkout", &body);
        }

        #[test]
        fn signed_arbitrary_events_never_panic(
            event_type in prop::sample::select(vec![
                "payment_captured", "payment_declined", "payment_capture_declined",
                "payment_refunded", "payment_refund_declined", "payment_approved"]),
            data in arbitrary_json(KEYS),
        ) {
            let body = json!({"id": "evt_1", "type": event_type, "data": data}).to_string();
            let c = checkout(&[KEY]);
            let _ = accepted(&c, &headers(&sign(KEY, body.as_bytes())), body.as_bytes());
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

    const KEY: &str = "fencehook-checkout-round-trip-key";

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(Checkout::SENDS, ids(), i64::MAX, "[A-Z]{3}"),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let scheme = Checkout::new(&[KEY.to_owned()]).unwrap();
            let psp = TestCredentials::new(&[(psp::SECRET, KEY)], None);
            // The event's `timestamp`.
            let event = CanonicalEvent { occurred_at: at(ts), ..event };
            prop_assert_eq!(round_trip(&scheme, &psp, &event, ts)?, event);
        }
    }
}
