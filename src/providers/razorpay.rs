//! Razorpay (`razorpay` scheme): the `X-Razorpay-Signature` header and
//! Razorpay's payment and refund events.
//!
//! # Signature
//!
//! `X-Razorpay-Signature` is the hex HMAC-SHA256 of the raw body, keyed with
//! the webhook secret (its bytes, as set in the Razorpay Dashboard). Nothing
//! else is signed: no timestamp, so no window (a captured delivery replays
//! as a duplicate, booked once). Any configured secret may verify (rotation:
//! Razorpay retries older deliveries signed with the secret they were first
//! sent with, so keep the old secret listed until its retries are over).
//! Comparison is constant-time (`Mac::verify_slice`); hex of either case is
//! read. The delivery's event id is the `X-Razorpay-Event-Id` header
//! (unsigned: kept beside inbox events for searching, never used to
//! deduplicate).
//!
//! # Mapping (what is booked)
//!
//! | event | booked as | transaction_id | parent | amount |
//! | --- | --- | --- | --- | --- |
//! | `payment.captured` | payment.succeeded (credit) | `payload.payment.entity.id` (`pay_…`) | – | its `amount` |
//! | `payment.failed` | payment.failed | `payload.payment.entity.id` | – | its `amount` |
//! | `refund.processed` | refund.succeeded (debit) | `payload.refund.entity.id` (`rfnd_…`) | its `payment_id` | its `amount` |
//! | `refund.failed` | refund.failed | `payload.refund.entity.id` | its `payment_id` | its `amount` |
//!
//! Amounts are Razorpay's smallest currency unit (paise) as sent; the
//! `currency` must be ISO 4217 upper case, as Razorpay sends it. Every other
//! event is ignored without looking further: `payment.authorized` (money not
//! yet taken), `refund.created` (a refund is booked when `refund.processed`
//! says so), `order.paid` (the same payment as its `payment.captured`),
//! disputes (`payment.dispute.*`, not booked by this scheme). `occurred_at`
//! is the event's `created_at` (unix seconds).
//!
//! Decisions worth knowing (docs/providers.md gives the sources):
//!
//! - A failed payment is keyed like its success: Razorpay can authorise a
//!   payment after reporting it failed (late authorisation), then capture
//!   it; the lifecycle books failed → succeeded.
//! - Each refund is its own row under its payment: a partial refund is a
//!   debit of its amount.
//! - Razorpay reads only the status of the answer (2xx within 5 s):
//!   fencehook's own JSON body.

use serde_json::{json, Value};
use time::OffsetDateTime;

use super::fields::{
    self, amount_minor, check_currency, check_transaction_id, invalid, opt, req_object, req_str,
    Object,
};
use super::hmac;
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError};
use super::scheme::{Item, Reject, Scheme};
use super::setup::Setup;
use crate::domain::{CanonicalEvent, EventKind};

/// The header Razorpay signs with (HTTP header names are case-insensitive).
pub const SIGNATURE_HEADER: &str = "x-razorpay-signature";
/// The delivery's event id (not signed).
pub const EVENT_ID_HEADER: &str = "x-razorpay-event-id";

/// Secrets shorter than this are a guess away (fencehook's floor: the
/// merchant chooses the webhook secret in the Dashboard, in no fixed format).
const MIN_SECRET_BYTES: usize = 16;

#[derive(Clone)]
pub struct Razorpay {
    secrets: Vec<Vec<u8>>,
}

impl Razorpay {
    pub fn new(secrets: &[String]) -> Result<Razorpay, String> {
        let secrets = hmac::keys(secrets, "a Razorpay webhook secret is not empty")?;
        Ok(Razorpay { secrets })
    }

    pub fn verify(&self, headers: &http::HeaderMap, body: &[u8]) -> Result<(), Reject> {
        let signature = fields::hex_signature(headers, SIGNATURE_HEADER, "X-Razorpay-Signature")?;
        fields::signature_matched(hmac::any_key_verifies(&self.secrets, &[body], &[signature]))
    }
}

impl Scheme for Razorpay {
    const NAME: &'static str = "razorpay";
    type Settings = hmac::Table;
    const SIGNATURE_HEADER: Option<&'static str> = Some(SIGNATURE_HEADER);
    const DELIVERY_ID_PREFIX: &'static str = "";
    const PAYMENT_ID: Option<&'static str> = Some("the payment's pay_ id");
    const CURRENCY: &'static str = "INR";
    const SENDS: &'static [EventKind] = &[
        EventKind::PaymentSucceeded,
        EventKind::PaymentFailed,
        EventKind::RefundSucceeded,
        EventKind::RefundFailed,
    ];
    const KEYS: &'static [Key] = &[psp::SECRET];

    fn build(settings: hmac::Table, setup: &mut Setup) -> Result<Razorpay, String> {
        let secrets = settings.read(setup)?;
        Razorpay::new(&secrets).map_err(|e| setup.error("secrets", e))
    }

    fn short_secret(secret: &str) -> Option<String> {
        (secret.len() < MIN_SECRET_BYTES).then(|| {
            format!(
                "{} bytes, shorter than the {MIN_SECRET_BYTES} fencehook asks of a Razorpay webhook secret",
                secret.len()
            )
        })
    }

    fn psp_event_id(headers: &http::HeaderMap, _body: &[u8]) -> Option<String> {
        headers
            .get(EVENT_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
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
        hmac::check_secret(psp, "an empty webhook secret")
    }

    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let body = psp::body_or(body, || event_of(notice, ts))?;
        let signature = sign(psp.key(&psp::SECRET)?, body.as_bytes());
        Ok(Delivery::json(
            body,
            vec![
                (SIGNATURE_HEADER, signature),
                (EVENT_ID_HEADER, delivery_id.to_owned()),
            ],
        ))
    }
}

/// Signs like Razorpay: the `X-Razorpay-Signature` value (lower-case hex) of `body`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    hex::encode(hmac::sign(secret.as_bytes(), &[body]))
}

/// Maps a Razorpay event (see the module docs) strictly: a handled event
/// with a missing or ill-typed field is [`Reject::Invalid`]; an event we do
/// not act on is [`Item::Ignored`] without looking further.
pub fn parse_event(provider: &str, body: &[u8]) -> Result<Item, Reject> {
    let value = fields::parse_json(body)?;
    let event = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object (a Razorpay event)"))?;
    let event_type = req_str(event, "event", "event")?;
    let (kind, entity) = match event_type {
        "payment.captured" => (EventKind::PaymentSucceeded, "payment"),
        "payment.failed" => (EventKind::PaymentFailed, "payment"),
        "refund.processed" => (EventKind::RefundSucceeded, "refund"),
        "refund.failed" => (EventKind::RefundFailed, "refund"),
        _ => {
            return Ok(Item::Ignored {
                event_type: event_type.to_owned(),
            })
        }
    };
    let occurred_at = match opt(event, "created_at") {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok())
                .ok_or_else(|| invalid("created_at must be a unix timestamp (integer)"))?,
        ),
    };
    let payload = req_object(event, "payload", "payload")?;
    let path = format!("payload.{entity}.entity");
    let object: &Object = req_object(
        req_object(payload, entity, &format!("payload.{entity}"))?,
        "entity",
        &path,
    )?;
    let field = |name: &str| format!("{path}.{name}");
    let id = req_str(object, "id", &field("id"))?;
    check_transaction_id(id)?;
    let amount_minor = amount_minor(opt(object, "amount"), &field("amount"))?;
    let currency = req_str(object, "currency", &field("currency"))?;
    check_currency(currency)?;
    let parent = if entity == "refund" {
        let payment_id = req_str(object, "payment_id", &field("payment_id"))?;
        check_transaction_id(payment_id)?;
        Some(payment_id.to_owned())
    } else {
        None
    };
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id: id.to_owned(),
        event_type: kind,
        amount_minor,
        currency: currency.to_owned(),
        parent_transaction_id: parent,
        occurred_at,
        merchant_reference: fields::merchant_reference(object, "order_id"),
        metadata: None,
    }))
}

/// The Razorpay event `notice` is announced by, as Razorpay sends it
/// (`created_at` `ts`): [`parse_event`]'s inverse. A kind Razorpay sends no
/// event for is refused; any other `event_type` is sent verbatim as the
/// event, about a payment.
pub fn event_of(notice: &Notice, ts: i64) -> Result<Value, String> {
    let kind = EventKind::from_generic(&notice.event_type);
    if let Some(kind) = kind {
        if !Razorpay::SENDS.contains(&kind) {
            return Err(psp::not_sent(Razorpay::NAME, Razorpay::SENDS, notice));
        }
    }
    let tx = notice.transaction_id.as_str();
    let payment = |id: &str, status: &str, amount: i64| {
        let failed = status == "failed";
        json!({
            "id": id, "entity": "payment", "amount": amount, "currency": notice.currency,
            "status": status, "order_id": null, "invoice_id": null, "international": false,
            "method": "upi", "amount_refunded": 0, "refund_status": null,
            "captured": status == "captured", "description": null, "vpa": "gaurav.kumar@exampleupi",
            "email": "gaurav.kumar@example.com", "contact": "+919876543210", "notes": [],
            "error_code": if failed { json!("BAD_REQUEST_ERROR") } else { Value::Null },
            "error_description": if failed { json!("Payment was unsuccessful as the customer's UPI app declined it.") } else { Value::Null },
            "created_at": ts
        })
    };
    let refund = |status: &str| -> Result<Value, String> {
        Ok(json!({
            "id": tx, "entity": "refund", "amount": notice.amount, "currency": notice.currency,
            "payment_id": psp::parent(notice)?, "notes": [], "receipt": null,
            "acquirer_data": {"arn": null}, "created_at": ts, "batch_id": null,
            "status": status, "speed_processed": "normal", "speed_requested": "normal"
        }))
    };
    let (event, contains, payload) = match kind {
        Some(EventKind::PaymentSucceeded) | None => (
            kind.map_or(notice.event_type.as_str(), |_| "payment.captured"),
            json!(["payment"]),
            json!({"payment": {"entity": payment(tx, "captured", notice.amount)}}),
        ),
        Some(EventKind::PaymentFailed) => (
            "payment.failed",
            json!(["payment"]),
            json!({"payment": {"entity": payment(tx, "failed", notice.amount)}}),
        ),
        Some(EventKind::RefundSucceeded) => (
            "refund.processed",
            json!(["refund"]),
            json!({"refund": {"entity": refund("processed")?}}),
        ),
        Some(_) => (
            "refund.failed",
            json!(["refund"]),
            json!({"refund": {"entity": refund("failed")?}}),
        ),
    };
    Ok(json!({
        "entity": "event",
        "account_id": "acc_FencehookSend01",
        "event": event,
        "contains": contains,
        "payload": payload,
        "created_at": ts
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{self, arbitrary_json, summary};
    use futures_util::FutureExt;
    use proptest::prelude::*;

    /// The secret tests/fixtures/razorpay/signatures.txt was computed with.
    const SECRET: &str = "fencehook-razorpay-test-key-not-a-secret";
    const OLD: &str = "fencehook-razorpay-secret-before-the-roll";

    fn fixture(name: &str) -> Vec<u8> {
        testing::fixture("razorpay", name)
    }

    fn headers(signature: &str) -> http::HeaderMap {
        testing::header(SIGNATURE_HEADER, signature)
    }

    fn razorpay(secrets: &[&str]) -> Razorpay {
        Razorpay::new(&secrets.iter().map(|k| k.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn accepted(r: &Razorpay, h: &http::HeaderMap, body: &[u8]) -> Result<Vec<Item>, Reject> {
        r.accept("razorpay", h, body, 0)
            .now_or_never()
            .expect("never waits")
    }

    fn mapped(name: &str) -> CanonicalEvent {
        match parse_event("razorpay", &fixture(name)) {
            Ok(Item::Event(e)) => e,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn the_merchant_reference_is_the_payments_order_id() {
        for name in ["payment.captured.json", "payment.failed.json"] {
            assert_eq!(
                mapped(name).merchant_reference.as_deref(),
                Some("order_FPoIeimWki9j8A"),
                "{name}"
            );
        }
        // A refund entity names no order.
        assert_eq!(mapped("refund.processed.json").merchant_reference, None);
    }

    #[test]
    fn every_fixture_verifies_with_the_signature_python_computed_and_sign_agrees() {
        // tests/fixtures/razorpay/signatures.txt: Python's hmac over each file's bytes
        // (tests/fixtures/README.md gives the command).
        let vectors = String::from_utf8(fixture("signatures.txt")).unwrap();
        let r = razorpay(&[SECRET]);
        let mut n = 0;
        for line in vectors.lines() {
            let (name, hex_sig) = line.split_once(" sha256=").unwrap();
            let body = fixture(name);
            assert_eq!(sign(SECRET, &body), hex_sig, "{name}");
            assert!(r.verify(&headers(hex_sig), &body).is_ok(), "{name}");
            n += 1;
        }
        assert_eq!(n, 5);
    }

    #[test]
    fn a_changed_byte_another_secret_a_missing_or_malformed_header_are_refused() {
        let r = razorpay(&[SECRET]);
        let body = fixture("payment.captured.json");
        let good = sign(SECRET, &body);
        let mut changed = body.clone();
        let at = changed.iter().position(|b| *b == b'5').unwrap();
        changed[at] = b'6';
        for (what, h, b) in [
            ("one byte changed", headers(&good), changed.as_slice()),
            (
                "another secret",
                headers(&sign("someone-else-s-secret", &body)),
                &body,
            ),
            ("no header", http::HeaderMap::new(), &body),
            ("not hex", headers("not-hex"), &body),
            ("empty", headers(""), &body),
        ] {
            assert!(
                matches!(accepted(&r, &h, b), Err(Reject::Unauthorized(_))),
                "{what}"
            );
        }
    }

    #[test]
    fn any_configured_secret_verifies_during_a_rotation() {
        let r = razorpay(&[SECRET, OLD]);
        let body = fixture("refund.processed.json");
        for secret in [OLD, SECRET] {
            assert!(
                r.verify(&headers(&sign(secret, &body)), &body).is_ok(),
                "{secret}"
            );
        }
    }

    #[test]
    fn each_event_maps_as_the_table_says() {
        let pay = "pay_FPoJKWQQ8lK13n";
        assert_eq!(
            summary(&mapped("payment.captured.json")),
            (pay, EventKind::PaymentSucceeded, None, 500000, "INR")
        );
        assert_eq!(
            summary(&mapped("payment.failed.json")),
            (pay, EventKind::PaymentFailed, None, 500000, "INR")
        );
        assert_eq!(
            summary(&mapped("refund.processed.json")),
            (
                "rfnd_FS8TWyPrCsa0OB",
                EventKind::RefundSucceeded,
                Some(pay),
                50000,
                "INR"
            )
        );
        assert_eq!(
            summary(&mapped("refund.failed.json")),
            (
                "rfnd_FS8Tb7AaR5aYTe",
                EventKind::RefundFailed,
                Some(pay),
                100000,
                "INR"
            )
        );
        // Failed, then authorised late and captured: one payment.
        assert_eq!(
            mapped("payment.failed.json").fingerprint(),
            mapped("payment.captured.json").fingerprint()
        );
        assert_eq!(
            mapped("payment.captured.json").occurred_at,
            OffsetDateTime::from_unix_timestamp(1597734060).ok()
        );
        let mut h = http::HeaderMap::new();
        h.insert(EVENT_ID_HEADER, "Jvhsd8pDB6gvkS".parse().unwrap());
        assert_eq!(
            Razorpay::psp_event_id(&h, b"{}").as_deref(),
            Some("Jvhsd8pDB6gvkS")
        );
    }

    #[test]
    fn other_events_are_ignored() {
        assert!(matches!(
            parse_event("razorpay", &fixture("payment.authorized.json")),
            Ok(Item::Ignored { .. })
        ));
        for t in ["refund.created", "order.paid", "payment.dispute.created"] {
            let body = json!({"entity": "event", "event": t}).to_string();
            assert!(
                matches!(
                    parse_event("razorpay", body.as_bytes()),
                    Ok(Item::Ignored { .. })
                ),
                "{t}"
            );
        }
    }

    /// A change made to a well-formed event.
    type Change = Box<dyn Fn(&mut Value)>;

    #[test]
    fn bad_shapes_of_handled_events_are_invalid() {
        let base =
            || -> Value { serde_json::from_slice(&fixture("refund.processed.json")).unwrap() };
        let cases: Vec<(&str, Change)> = vec![
            (
                "amount float",
                Box::new(|v| v["payload"]["refund"]["entity"]["amount"] = json!(500.0)),
            ),
            (
                "amount string",
                Box::new(|v| v["payload"]["refund"]["entity"]["amount"] = json!("50000")),
            ),
            (
                "amount zero",
                Box::new(|v| v["payload"]["refund"]["entity"]["amount"] = json!(0)),
            ),
            (
                "lower-case currency",
                Box::new(|v| v["payload"]["refund"]["entity"]["currency"] = json!("inr")),
            ),
            (
                "no payment_id",
                Box::new(|v| v["payload"]["refund"]["entity"]["payment_id"] = Value::Null),
            ),
            (
                "padded id",
                Box::new(|v| v["payload"]["refund"]["entity"]["id"] = json!("rfnd_1 ")),
            ),
            (
                "no refund",
                Box::new(|v| v["payload"]["refund"] = Value::Null),
            ),
            (
                "entity an array",
                Box::new(|v| v["payload"]["refund"]["entity"] = json!([])),
            ),
            ("no payload", Box::new(|v| v["payload"] = Value::Null)),
            (
                "created_at a string",
                Box::new(|v| v["created_at"] = json!("1597734083")),
            ),
            ("event a number", Box::new(|v| v["event"] = json!(5))),
        ];
        for (what, change) in cases {
            let mut v = base();
            change(&mut v);
            assert!(
                matches!(
                    parse_event("razorpay", v.to_string().as_bytes()),
                    Err(Reject::Invalid(_))
                ),
                "{what}"
            );
        }
        for body in [&b"not json"[..], b"[]", b"{}"] {
            assert!(matches!(
                parse_event("razorpay", body),
                Err(Reject::Invalid(_))
            ));
        }
        // Signed, through accept: still a 400.
        let body = br#"{"event":"payment.captured","payload":{"payment":{"entity":{"id":"pay_1","amount":1.5,"currency":"INR"}}}}"#;
        assert!(matches!(
            accepted(&razorpay(&[SECRET]), &headers(&sign(SECRET, body)), body),
            Err(Reject::Invalid(_))
        ));
    }

    #[test]
    fn short_secrets_are_exposures_and_empty_ones_refused() {
        assert!(Razorpay::short_secret("mysecret").is_some());
        assert!(Razorpay::short_secret(SECRET).is_none());
        assert!(Razorpay::new(&[String::new()]).is_err());
    }

    const KEYS: &[&str] = &[
        "event",
        "payload",
        "payment",
        "refund",
        "entity",
        "id",
        "amount",
        "currency",
        "payment_id",
        "created_at",
    ];

    proptest! {
        #[test]
        fn verify_and_map_never_panic(
            header in "[ -~]{0,80}",
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let r = razorpay(&[SECRET]);
            let mut h = http::HeaderMap::new();
            if let Ok(v) = header.parse() {
                h.insert(SIGNATURE_HEADER, v);
            }
            let _ = r.verify(&h, &body);
            let _ = parse_event("razorpay", &body);
        }

        #[test]
        fn signed_arbitrary_events_never_panic(
            event in prop::sample::select(vec![
                "payment.captured", "payment.failed", "refund.processed", "refund.failed",
                "payment.authorized"]),
            payload in arbitrary_json(KEYS),
        ) {
            let body = json!({"entity": "event", "event": event, "payload": payload}).to_string();
            let r = razorpay(&[SECRET]);
            let _ = accepted(&r, &headers(&sign(SECRET, body.as_bytes())), body.as_bytes());
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

    const SECRET: &str = "fencehook-razorpay-round-trip-secret";

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(Razorpay::SENDS, ids(), i64::MAX, "[A-Z]{3}"),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let scheme = Razorpay::new(&[SECRET.to_owned()]).unwrap();
            let psp = TestCredentials::new(&[(psp::SECRET, SECRET)], None);
            // The event's `created_at`.
            let event = CanonicalEvent { occurred_at: at(ts), ..event };
            prop_assert_eq!(round_trip(&scheme, &psp, &event, ts)?, event);
        }
    }
}
