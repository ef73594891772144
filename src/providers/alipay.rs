//! Alipay asynchronous notifications (`alipay` scheme): form-encoded POSTs
//! signed with RSA2.
//!
//! # Signature
//!
//! The body is `application/x-www-form-urlencoded`. Alipay signs the
//! parameters, not the bytes: SHA256withRSA (PKCS#1 v1.5, "RSA2") over every
//! parameter with a non-empty value except `sign` and `sign_type`, values
//! URL-decoded, sorted by key (byte order) and joined `k=v&k=v`. `sign` is
//! base64. `sign_type` is not signed, so whatever it says only `RSA2` is
//! accepted (a 401 otherwise); `charset`, when sent, must be UTF-8. Any
//! configured Alipay public key may verify (rotation); keys are the bare
//! base64 SubjectPublicKeyInfo Alipay's console hands out, or PEM. The body
//! is decoded strictly first: a repeated key, a pair without `=`, a bad
//! percent escape or invalid UTF-8 is a 400 (a signature over such a body
//! means nothing definite). Then `app_id` must be the configured one (401):
//! a notification for another application signed by Alipay is not ours.
//!
//! # Mapping
//!
//! Only `notify_type=trade_status_sync` is read. A notification is a
//! *refund* when it carries `gmt_refund` and a `refund_fee` above zero (a
//! payment notification may carry `refund_fee=0.00`, and `gmt_close`).
//!
//! | trade_status | refund? | booked as | transaction_id | parent | amount |
//! | --- | --- | --- | --- | --- | --- |
//! | `TRADE_SUCCESS`, `TRADE_FINISHED` | no | payment.succeeded | `trade_no` | – | `total_amount` |
//! | `TRADE_CLOSED` | no | payment.failed (closed unpaid: no money moved) | `trade_no` | – | `total_amount` |
//! | any | yes | refund.succeeded | `{trade_no}:refund` | `trade_no` | `refund_fee` |
//! | `WAIT_BUYER_PAY`, other | – | ignored | | | |
//!
//! Payments are keyed by Alipay's `trade_no` rather than the merchant's
//! `out_trade_no`: it is the PSP's own id of the payment, and one
//! `out_trade_no` is unique only within one merchant application.
//!
//! **Refunds.** `refund_fee` is the total refunded on the trade *so far*,
//! not this refund's amount, and nothing in a notification says how much
//! was refunded before it; the amount of refund n is only
//! `refund_fee(n) - refund_fee(n-1)`, which a stateless mapping cannot know.
//! Keying each notification by its own refund (`out_biz_no`) would book the
//! running total again and again (20, then 50 for refunds of 20 and 30). So
//! every refund of a trade is mapped to **one** refund object,
//! `{trade_no}:refund`, with the cumulative `refund_fee`: the first refund
//! notification that arrives is booked exactly (a single refund, partial or
//! full, is the common case, and its cumulative total is its amount); a
//! redelivery of it is a duplicate; a later refund of the same trade carries
//! another total, which contradicts the booked row: `payload_mismatch`
//! (422), nothing written, Alipay answered `fail` and retrying, the
//! operator's alert raised. Nothing is ever booked twice or at a wrong
//! amount; a second refund of one trade needs a person (docs/providers.md).
//!
//! Amounts are yuan as decimal strings, converted to fen exactly (no float
//! anywhere): `20.001`, `1e2`, `-1`, `1,00` are a 400. Notifications carry
//! no currency: CNY (a `trans_currency` other than CNY is refused).
//! `gmt_payment` / `gmt_refund` / `gmt_close` (Beijing time, `+08:00`)
//! become `occurred_at`.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time, UtcOffset};

use super::fields::{check_transaction_id, decimal_minor, invalid};
use super::keys::{RsaPublicKey, RsaSigner};
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError};
use super::scheme::{AckBody, Item, Reject, Scheme};
use super::setup::{SettingError, Setup};
use crate::domain::{CanonicalEvent, EventKind};

/// Alipay marks a notification delivered only on exactly this body.
pub(crate) const SUCCESS: &str = "success";
/// What any other answer carries (Alipay retries on anything but `success`).
pub(crate) const FAIL: &str = "fail";
/// The content type Alipay posts with.
pub const CONTENT_TYPE: &str = "application/x-www-form-urlencoded";
const CURRENCY: &str = "CNY";
/// Suffix of the refund object of a trade (see the module docs).
pub const REFUND_SUFFIX: &str = ":refund";

/// The application's `app_id`, which the tools put in a notification.
pub const APP_ID: Key = Key {
    flag: "app-id",
    what: "the application's app_id",
    in_file: true,
};

/// An `alipay` provider's table.
#[derive(serde::Deserialize)]
pub struct Settings {
    /// The application's `app_id`, which every notification must carry.
    app_id: Option<String>,
    /// Files of Alipay's public keys (PEM or bare base64); several: rotation.
    public_keys: Option<Vec<String>>,
}

#[derive(Clone)]
pub struct Alipay {
    app_id: String,
    public_keys: Vec<RsaPublicKey>,
}

impl Alipay {
    /// `public_keys` as (where it came from, contents).
    pub fn new(app_id: &str, public_keys: &[(String, Vec<u8>)]) -> Result<Alipay, SettingError> {
        if app_id.is_empty() || !app_id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(("app_id", "an Alipay app_id is digits".into()));
        }
        if public_keys.is_empty() {
            return Err((
                "public_keys",
                "at least one Alipay public key file is required".into(),
            ));
        }
        let public_keys = public_keys
            .iter()
            .map(|(origin, contents)| {
                RsaPublicKey::parse(contents).map_err(|e| ("public_keys", format!("{origin}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Alipay {
            app_id: app_id.to_owned(),
            public_keys,
        })
    }

    /// Decodes, verifies, checks `app_id`, maps.
    pub fn accept_form(&self, provider: &str, body: &[u8]) -> Result<Vec<Item>, Reject> {
        let params = parse_form(body)?;
        self.verify(&params)?;
        Ok(vec![map(provider, &params)?])
    }

    fn verify(&self, params: &[(String, String)]) -> Result<(), Reject> {
        let unauthorized = |m: &str| Reject::Unauthorized(m.to_owned());
        match get(params, "sign_type") {
            Some("RSA2") => {}
            Some(_) => return Err(unauthorized("sign_type must be RSA2")),
            None => return Err(unauthorized("no sign_type")),
        }
        if let Some(charset) = get(params, "charset") {
            if !charset.eq_ignore_ascii_case("utf-8") {
                return Err(invalid("charset must be utf-8"));
            }
        }
        let sign = get(params, "sign").ok_or_else(|| unauthorized("no sign"))?;
        let sign = B64
            .decode(sign)
            .map_err(|_| unauthorized("sign is not base64"))?;
        let content = signing_content(params);
        if !self
            .public_keys
            .iter()
            .any(|k| k.verifies(content.as_bytes(), &sign))
        {
            return Err(unauthorized("signature does not match"));
        }
        if get(params, "app_id") != Some(self.app_id.as_str()) {
            return Err(unauthorized("app_id is not this provider's"));
        }
        Ok(())
    }
}

impl Scheme for Alipay {
    const NAME: &'static str = "alipay";
    type Settings = Settings;
    const SIGNATURE_HEADER: Option<&'static str> = None;
    const CURRENCY: &'static str = CURRENCY;
    const SENDS: &'static [EventKind] = &[
        EventKind::PaymentSucceeded,
        EventKind::PaymentFailed,
        EventKind::RefundSucceeded,
    ];
    const PAYMENT_ID: Option<&'static str> = Some("trade_no");
    const KEYS: &'static [Key] = &[APP_ID];

    fn build(settings: Settings, setup: &mut Setup) -> Result<Alipay, String> {
        let app_id = setup.required(settings.app_id, "app_id", "the application's app_id")?;
        setup.offer(&APP_ID, &app_id);
        let files = setup.required(
            settings.public_keys,
            "public_keys",
            "a list of Alipay public key files",
        )?;
        let mut keys: Vec<(String, Vec<u8>)> = Vec::with_capacity(files.len());
        for path in files {
            let contents = setup.key_file("public_keys", None, &path)?;
            keys.push((path, contents));
        }
        Alipay::new(&app_id, &keys).map_err(|e| setup.setting(e))
    }

    fn accepts_content_type(essence: &str) -> bool {
        essence == CONTENT_TYPE
    }

    fn psp_event_id(_headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
        notification_id(body)
    }

    /// Exactly `success`, else `fail` (Alipay retries anything but `success`).
    fn ack_body(success: bool, _result: &str, _reason: Option<&str>) -> AckBody {
        AckBody::Text(if success { SUCCESS } else { FAIL })
    }

    async fn accept(
        &self,
        provider: &str,
        _headers: &http::HeaderMap,
        body: &[u8],
        _now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.accept_form(provider, body)
    }

    fn check(psp: &dyn Credentials) -> Result<(), PspError> {
        psp.signer().and(psp.key(&APP_ID)).map(drop)
    }

    /// A notification built from `notice`, or a form body of your own
    /// (decoded, re-signed).
    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        _delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let signer = psp.signer()?;
        let params = match body {
            Some(b) => {
                parse_form(b.as_bytes()).map_err(|e| format!("--body is not a form: {e}"))?
            }
            None => params_of(notice, psp.key(&APP_ID)?, ts)?,
        };
        Ok(Delivery {
            body: sign_form(signer, &params),
            content_type: CONTENT_TYPE,
            headers: Vec::new(),
        })
    }
}

/// The value of `key`.
fn get<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Decodes a form body strictly: `&`-separated `key=value` pairs, `+` is a
/// space, percent escapes must be complete and decode to UTF-8, no key twice.
pub fn parse_form(body: &[u8]) -> Result<Vec<(String, String)>, Reject> {
    if body.is_empty() {
        return Err(invalid("the body is empty"));
    }
    let mut params: Vec<(String, String)> = Vec::new();
    for pair in body.split(|b| *b == b'&') {
        let Some(eq) = pair.iter().position(|b| *b == b'=') else {
            return Err(invalid("every parameter is key=value"));
        };
        let key = decode(&pair[..eq])?;
        let value = decode(&pair[eq + 1..])?;
        if key.is_empty() {
            return Err(invalid("a parameter has no name"));
        }
        if params.iter().any(|(k, _)| *k == key) {
            let shown: String = key.chars().take(64).collect();
            return Err(invalid(format!("repeated parameter {shown:?}")));
        }
        params.push((key, value));
    }
    Ok(params)
}

fn decode(raw: &[u8]) -> Result<String, Reject> {
    // A `%` must start a complete escape (percent_decode passes a bad one through).
    for (i, b) in raw.iter().enumerate() {
        if *b == b'%'
            && !(raw.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && raw.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        {
            return Err(invalid("a bad percent escape in the body"));
        }
    }
    let spaced: Vec<u8> = raw
        .iter()
        .map(|b| if *b == b'+' { b' ' } else { *b })
        .collect();
    percent_encoding::percent_decode(&spaced)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| invalid("the body does not decode to UTF-8"))
}

/// What Alipay signs: the non-empty parameters but `sign` and `sign_type`,
/// sorted by key, `k=v` joined with `&`.
pub fn signing_content(params: &[(String, String)]) -> String {
    let mut signed: Vec<&(String, String)> = params
        .iter()
        .filter(|(k, v)| !v.is_empty() && k != "sign" && k != "sign_type")
        .collect();
    signed.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    signed
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Signs `params` as Alipay does (sets `sign_type=RSA2` and `sign`) and
/// returns the form body: for `fencehook send` and the tests.
pub fn sign_form(signer: &RsaSigner, params: &[(String, String)]) -> String {
    let mut params: Vec<(String, String)> = params
        .iter()
        .filter(|(k, _)| k != "sign" && k != "sign_type")
        .cloned()
        .collect();
    params.push(("sign_type".into(), "RSA2".into()));
    let sign = signer.sign_base64(signing_content(&params).as_bytes());
    params.push(("sign".into(), sign));
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .finish()
}

/// The notification's own id (`notify_id`), kept beside inbox events.
pub fn notification_id(body: &[u8]) -> Option<String> {
    let params = parse_form(body).ok()?;
    get(&params, "notify_id").map(str::to_owned)
}

fn map(provider: &str, params: &[(String, String)]) -> Result<Item, Reject> {
    let required =
        |key: &str| get(params, key).ok_or_else(|| invalid(format!("{key} is required")));
    let notify_type = required("notify_type")?;
    let trade_status = required("trade_status")?;
    if notify_type != "trade_status_sync" {
        return Ok(Item::Ignored {
            event_type: format!("{notify_type} {trade_status}"),
        });
    }
    if let Some(currency) = get(params, "trans_currency") {
        if currency != CURRENCY {
            return Err(invalid("trans_currency must be CNY"));
        }
    }
    let trade_no = required("trade_no")?;
    check_transaction_id(trade_no).map_err(|_| invalid("trade_no is not a valid id"))?;
    let gmt_refund = get(params, "gmt_refund").filter(|v| !v.is_empty());
    let refund_fee = get(params, "refund_fee")
        .filter(|v| !v.is_empty())
        .map(|v| yuan(v, "refund_fee", true))
        .transpose()?
        .filter(|fee| *fee > 0);
    let (kind, transaction_id, parent, amount, when) = match (gmt_refund, refund_fee) {
        (Some(at), Some(fee)) => (
            EventKind::RefundSucceeded,
            format!("{trade_no}{REFUND_SUFFIX}"),
            Some(trade_no.to_owned()),
            fee,
            Some(("gmt_refund", at)),
        ),
        _ => {
            let kind = match trade_status {
                "TRADE_SUCCESS" | "TRADE_FINISHED" => EventKind::PaymentSucceeded,
                "TRADE_CLOSED" => EventKind::PaymentFailed,
                _ => {
                    return Ok(Item::Ignored {
                        event_type: trade_status.to_owned(),
                    })
                }
            };
            let when = match kind {
                EventKind::PaymentSucceeded => {
                    get(params, "gmt_payment").map(|t| ("gmt_payment", t))
                }
                _ => get(params, "gmt_close").map(|t| ("gmt_close", t)),
            };
            (
                kind,
                trade_no.to_owned(),
                None,
                yuan(required("total_amount")?, "total_amount", false)?,
                when,
            )
        }
    };
    check_transaction_id(&transaction_id)?;
    let occurred_at = when
        .filter(|(_, t)| !t.is_empty())
        .map(|(field, t)| {
            beijing_time(t).ok_or_else(|| invalid(format!("{field} must be yyyy-MM-dd HH:mm:ss")))
        })
        .transpose()?;
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id,
        event_type: kind,
        amount_minor: amount,
        currency: CURRENCY.to_owned(),
        parent_transaction_id: parent,
        occurred_at,
        merchant_reference: get(params, "out_trade_no")
            .filter(|r| !r.is_empty())
            .map(str::to_owned),
        metadata: None,
    }))
}

/// Yuan to fen, exactly. `zero_ok`: `0.00` reads as 0 (a `refund_fee` of a
/// payment notification), not as a refusal.
fn yuan(text: &str, field: &str, zero_ok: bool) -> Result<i64, Reject> {
    if zero_ok && matches!(text, "0" | "0.0" | "0.00") {
        return Ok(0);
    }
    decimal_minor(text, 2, field)
}

/// `yyyy-MM-dd HH:mm:ss[.SSS]`, Beijing time (Alipay sends no offset).
fn beijing_time(text: &str) -> Option<OffsetDateTime> {
    let (date, time) = text.split_once(' ')?;
    let (time, millis) = match time.split_once('.') {
        Some((t, m)) => (t, Some(m)),
        None => (time, None),
    };
    let number = |s: &str, len: usize| -> Option<u32> {
        (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let mut d = date.split('-');
    let (y, mo, da) = (
        number(d.next()?, 4)?,
        number(d.next()?, 2)?,
        number(d.next()?, 2)?,
    );
    let mut t = time.split(':');
    let (h, mi, s) = (
        number(t.next()?, 2)?,
        number(t.next()?, 2)?,
        number(t.next()?, 2)?,
    );
    if d.next().is_some() || t.next().is_some() {
        return None;
    }
    let ms = match millis {
        Some(m) => number(m, 3)?,
        None => 0,
    };
    let date = Date::from_calendar_date(
        i32::try_from(y).ok()?,
        Month::try_from(u8::try_from(mo).ok()?).ok()?,
        u8::try_from(da).ok()?,
    )
    .ok()?;
    let time = Time::from_hms_milli(
        u8::try_from(h).ok()?,
        u8::try_from(mi).ok()?,
        u8::try_from(s).ok()?,
        u16::try_from(ms).ok()?,
    )
    .ok()?;
    let beijing = UtcOffset::from_hms(8, 0, 0).ok()?;
    Some(PrimitiveDateTime::new(date, time).assume_offset(beijing))
}

/// An Alipay notification's parameters for `notice`, unsigned ([`sign_form`]
/// signs them): the inverse of the mapping. `amount` is in fen; a refund is a full
/// refund of a trade of that amount (`refund_fee` is the trade's refunded
/// total), so it maps back as `{trade_no}:refund`. Any other `event_type`
/// without a `.` is sent verbatim as the `trade_status`.
pub fn params_of(notice: &Notice, app_id: &str, ts: i64) -> Result<Vec<(String, String)>, String> {
    if notice.currency != CURRENCY {
        return Err("alipay notifications are in CNY: --currency CNY".into());
    }
    let beijing = OffsetDateTime::from_unix_timestamp(ts)
        .map_err(|e| e.to_string())?
        .to_offset(UtcOffset::from_hms(8, 0, 0).map_err(|e| e.to_string())?);
    let when = format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        beijing.year(),
        u8::from(beijing.month()),
        beijing.day(),
        beijing.hour(),
        beijing.minute(),
        beijing.second()
    );
    let yuan = format!("{}.{:02}", notice.amount / 100, notice.amount % 100);
    let (trade_no, status, refund) = match notice.event_type.as_str() {
        "payment.succeeded" => (notice.transaction_id.clone(), "TRADE_SUCCESS", false),
        "payment.failed" => (notice.transaction_id.clone(), "TRADE_CLOSED", false),
        "refund.succeeded" => (psp::parent(notice)?.to_owned(), "TRADE_CLOSED", true),
        other if other.contains('.') => {
            return Err(psp::not_sent(Alipay::NAME, Alipay::SENDS, notice))
        }
        other => (notice.transaction_id.clone(), other, false),
    };
    let mut params: Vec<(String, String)> = [
        ("gmt_create", when.as_str()),
        ("charset", "utf-8"),
        ("seller_email", "merchant@example.com"),
        ("subject", "fencehook demo"),
        ("buyer_id", "2088102170344093"),
        (
            "notify_id",
            uuid::Uuid::new_v4().simple().to_string().as_str(),
        ),
        ("notify_type", "trade_status_sync"),
        ("trade_status", status),
        ("app_id", app_id),
        ("seller_id", "2088102169708990"),
        ("notify_time", when.as_str()),
        ("version", "1.0"),
        ("out_trade_no", format!("order-{trade_no}").as_str()),
        ("total_amount", yuan.as_str()),
        ("trade_no", trade_no.as_str()),
        ("auth_app_id", app_id),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let mut add = |k: &str, v: &str| params.push((k.to_owned(), v.to_owned()));
    match (status, refund) {
        ("TRADE_SUCCESS" | "TRADE_FINISHED", _) => {
            add("gmt_payment", &when);
            add("receipt_amount", &yuan);
            add("buyer_pay_amount", &yuan);
            add("invoice_amount", &yuan);
            add("point_amount", "0.00");
            add(
                "fund_bill_list",
                &format!(r#"[{{"amount":"{yuan}","fundChannel":"ALIPAYACCOUNT"}}]"#),
            );
        }
        (_, true) => {
            add("gmt_payment", &when);
            add("gmt_refund", &format!("{when}.000"));
            add("gmt_close", &when);
            add("refund_fee", &yuan);
            add("out_biz_no", &notice.transaction_id);
        }
        _ => add("gmt_close", &when),
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::super::testkeys;
    use super::*;
    use proptest::prelude::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/alipay");
    const APP_ID: &str = "2021002150672444";

    fn read(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn alipay(app_id: &str, keys: &[Vec<u8>]) -> Alipay {
        let keys: Vec<(String, Vec<u8>)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (format!("key {i}"), k.clone()))
            .collect();
        Alipay::new(app_id, &keys).unwrap()
    }

    /// Test keys 0 (bare base64, as Alipay's console gives it) and 1 (PEM).
    fn ours() -> Alipay {
        alipay(
            APP_ID,
            &[
                testkeys::public_key_base64(0).into_bytes(),
                testkeys::public_key_pem(1).into_bytes(),
            ],
        )
    }

    /// A fixture's `.kv.json` as pairs.
    fn kv(name: &str) -> Vec<(String, String)> {
        let pairs: Vec<(String, String)> = serde_json::from_slice(&read(name)).unwrap();
        pairs
    }

    fn with(mut params: Vec<(String, String)>, key: &str, value: &str) -> Vec<(String, String)> {
        match params.iter_mut().find(|(k, _)| k == key) {
            Some(p) => p.1 = value.to_owned(),
            None => params.push((key.to_owned(), value.to_owned())),
        }
        params
    }

    fn without(params: Vec<(String, String)>, key: &str) -> Vec<(String, String)> {
        params.into_iter().filter(|(k, _)| k != key).collect()
    }

    fn event(item: Result<Vec<Item>, Reject>) -> CanonicalEvent {
        match item.as_deref() {
            Ok([Item::Event(e)]) => e.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_merchant_reference_is_out_trade_no() {
        let mapped = |params: &[(String, String)]| match map("alipay", params) {
            Ok(Item::Event(e)) => e,
            other => panic!("{other:?}"),
        };
        let payment = mapped(&kv("payment_trade_success.sandbox.kv.json"));
        assert_eq!(
            payment.merchant_reference.as_deref(),
            Some("157650159962208381158722")
        );
        let refund = mapped(&kv("refund_full_trade_closed.kv.json"));
        assert_eq!(
            refund.merchant_reference.as_deref(),
            Some("1415126234332921856")
        );
        let none = mapped(&without(
            kv("payment_trade_success.sandbox.kv.json"),
            "out_trade_no",
        ));
        assert_eq!(none.merchant_reference, None);
    }

    #[test]
    fn the_real_sandbox_payment_verifies_with_alipays_key_and_books_the_trade() {
        // hocgin/payment-project: a sandbox TRADE_SUCCESS and its Alipay key.
        let body = read("payment_trade_success.sandbox.body.txt");
        let a = alipay(
            "2016080300154586",
            &[read("payment_trade_success.sandbox.alipay_public_key.txt")],
        );
        let e = event(a.accept_form("alipay", body.trim_ascii_end()));
        assert_eq!(
            (
                e.transaction_id.as_str(),
                e.event_type,
                e.amount_minor,
                e.currency.as_str(),
                e.parent_transaction_id
            ),
            (
                "2019121622001444091000069166",
                EventKind::PaymentSucceeded,
                1,
                "CNY",
                None
            )
        );
        assert_eq!(
            e.occurred_at,
            beijing_time("2019-12-16 21:06:58"),
            "gmt_payment, Beijing time"
        );
        // The same notification for another application: 401.
        let other = alipay(
            "2016000000000000",
            &[read("payment_trade_success.sandbox.alipay_public_key.txt")],
        );
        assert!(matches!(
            other.accept_form("alipay", body.trim_ascii_end()),
            Err(Reject::Unauthorized(_))
        ));
        // Another key: 401.
        assert!(matches!(
            ours().accept_form("alipay", body.trim_ascii_end()),
            Err(Reject::Unauthorized(_))
        ));
    }

    #[test]
    fn the_real_full_refund_verifies_and_books_one_refund_of_the_trade() {
        let body = read("refund_full_trade_closed.body.txt");
        let a = alipay(
            APP_ID,
            &[read("refund_full_trade_closed.alipay_public_key.txt")],
        );
        let e = event(a.accept_form("alipay", body.trim_ascii_end()));
        assert_eq!(
            (
                e.transaction_id.as_str(),
                e.event_type,
                e.parent_transaction_id.as_deref(),
                e.amount_minor
            ),
            (
                "2021071422001435011433387454:refund",
                EventKind::RefundSucceeded,
                Some("2021071422001435011433387454"),
                60
            )
        );
        assert_eq!(e.occurred_at, beijing_time("2021-07-14 09:51:36.631"));
        // Decoded and re-encoded by us, the same parameters verify too.
        let params = parse_form(body.trim_ascii_end()).unwrap();
        assert_eq!(params, kv("refund_full_trade_closed.kv.json"));
        let reencoded = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .finish();
        assert!(a.accept_form("alipay", reencoded.as_bytes()).is_ok());
    }

    #[test]
    fn gopays_rsa2_vector_verifies_with_its_bare_base64_key() {
        // go-pay/gopay alipay/sign_test.go TestSyncVerifySign: the primitive.
        let v: serde_json::Value =
            serde_json::from_slice(&read("rsa2_response_vector_gopay.json")).unwrap();
        let key = RsaPublicKey::parse(v["alipay_public_key"].as_str().unwrap().as_bytes()).unwrap();
        let sign = B64.decode(v["sign"].as_str().unwrap()).unwrap();
        let content = v["signed_content"].as_str().unwrap();
        assert!(key.verifies(content.as_bytes(), &sign));
        assert!(!key.verifies(&content.as_bytes()[1..], &sign));
    }

    #[test]
    fn every_trade_status_maps_as_documented() {
        let a = ours();
        let payment = without(
            without(kv("refund_full_trade_closed.kv.json"), "gmt_refund"),
            "refund_fee",
        );
        let accept = |params: Vec<(String, String)>, key: usize| {
            a.accept_form(
                "alipay",
                sign_form(&testkeys::signer(key), &params).as_bytes(),
            )
        };
        let paid = event(accept(
            with(payment.clone(), "trade_status", "TRADE_SUCCESS"),
            0,
        ));
        assert_eq!(
            (
                paid.event_type,
                paid.amount_minor,
                paid.transaction_id.as_str()
            ),
            (
                EventKind::PaymentSucceeded,
                60,
                "2021071422001435011433387454"
            )
        );
        let finished = event(accept(
            with(payment.clone(), "trade_status", "TRADE_FINISHED"),
            1,
        ));
        assert_eq!(
            finished.fingerprint(),
            paid.fingerprint(),
            "the same payment"
        );
        let closed = event(accept(
            without(
                with(payment.clone(), "trade_status", "TRADE_CLOSED"),
                "gmt_payment",
            ),
            0,
        ));
        assert_eq!(closed.event_type, EventKind::PaymentFailed);
        assert_eq!(closed.occurred_at, beijing_time("2021-07-14 09:51:36"));
        // A payment notification with refund_fee 0.00 (the official example's shape).
        let zero = event(accept(
            with(
                with(payment.clone(), "trade_status", "TRADE_SUCCESS"),
                "refund_fee",
                "0.00",
            ),
            0,
        ));
        assert_eq!(zero.event_type, EventKind::PaymentSucceeded);
        for status in ["WAIT_BUYER_PAY", "SOMETHING_NEW"] {
            assert!(matches!(
                accept(with(payment.clone(), "trade_status", status), 0).as_deref(),
                Ok([Item::Ignored { .. }])
            ));
        }
        assert!(matches!(
            accept(with(payment.clone(), "notify_type", "other_sync"), 0).as_deref(),
            Ok([Item::Ignored { .. }])
        ));
        // A partial refund (the constructed fixture): cumulative 0.20, one object per trade.
        let partial = event(accept(
            kv("refund_partial_trade_success.CONSTRUCTED.kv.json"),
            0,
        ));
        assert_eq!(
            (
                partial.transaction_id.as_str(),
                partial.event_type,
                partial.amount_minor
            ),
            (
                "2021071422001435011433387454:refund",
                EventKind::RefundSucceeded,
                20
            )
        );
        let full = event(accept(kv("refund_full_trade_closed.kv.json"), 0));
        assert_eq!(full.transaction_id, partial.transaction_id);
        assert_ne!(
            full.fingerprint(),
            partial.fingerprint(),
            "a second refund of a trade contradicts the first: payload_mismatch, never a second debit"
        );
    }

    #[test]
    fn amounts_that_are_not_exact_yuan_are_400() {
        let a = ours();
        let payment = with(
            without(
                without(kv("refund_full_trade_closed.kv.json"), "gmt_refund"),
                "refund_fee",
            ),
            "trade_status",
            "TRADE_SUCCESS",
        );
        for bad in ["20.001", "1e2", "-1", "1,00", "0.00", "", " 1", "1.", "NaN"] {
            let body = sign_form(
                &testkeys::signer(0),
                &with(payment.clone(), "total_amount", bad),
            );
            assert!(
                matches!(
                    a.accept_form("alipay", body.as_bytes()),
                    Err(Reject::Invalid(_))
                ),
                "{bad:?}"
            );
        }
        let refund = kv("refund_full_trade_closed.kv.json");
        for bad in ["0.601", "6e-1", "-0.60"] {
            let body = sign_form(
                &testkeys::signer(0),
                &with(refund.clone(), "refund_fee", bad),
            );
            assert!(
                matches!(
                    a.accept_form("alipay", body.as_bytes()),
                    Err(Reject::Invalid(_))
                ),
                "{bad:?}"
            );
        }
        let body = sign_form(
            &testkeys::signer(0),
            &with(payment.clone(), "trans_currency", "USD"),
        );
        assert!(matches!(
            a.accept_form("alipay", body.as_bytes()),
            Err(Reject::Invalid(_))
        ));
        let body = sign_form(
            &testkeys::signer(0),
            &with(payment, "gmt_payment", "2021/07/14 09:49:30"),
        );
        assert!(matches!(
            a.accept_form("alipay", body.as_bytes()),
            Err(Reject::Invalid(_))
        ));
    }

    #[test]
    fn signatures_sign_types_app_ids_and_bodies_are_checked() {
        let a = ours();
        let params = kv("refund_full_trade_closed.kv.json");
        let good = sign_form(&testkeys::signer(0), &params);
        assert!(a.accept_form("alipay", good.as_bytes()).is_ok());
        let unauthorized = [
            ("unknown key", sign_form(&testkeys::signer(2), &params)),
            (
                "other app",
                sign_form(
                    &testkeys::signer(0),
                    &with(params.clone(), "app_id", "2021000000000000"),
                ),
            ),
            ("RSA", good.replace("sign_type=RSA2", "sign_type=RSA")),
            ("no sign_type", good.replace("&sign_type=RSA2", "")),
            ("no sign", good.split("&sign=").next().unwrap().to_owned()),
            (
                "signed over other bytes",
                good.replace("total_amount=0.60", "total_amount=0.70"),
            ),
        ];
        for (name, body) in unauthorized {
            assert!(
                matches!(
                    a.accept_form("alipay", body.as_bytes()),
                    Err(Reject::Unauthorized(_))
                ),
                "{name}"
            );
        }
        for (name, body) in [
            ("empty", String::new()),
            ("no =", format!("{good}&flag")),
            ("repeated key", format!("{good}&app_id={APP_ID}")),
            ("bad escape", format!("{good}&x=%zz")),
            ("cut escape", format!("{good}&x=%4")),
            ("not utf-8", format!("{good}&x=%ff")),
            ("GBK", good.replace("charset=UTF-8", "charset=GBK")),
            ("empty key", format!("{good}&=1")),
        ] {
            assert!(
                matches!(
                    a.accept_form("alipay", body.as_bytes()),
                    Err(Reject::Invalid(_))
                ),
                "{name}"
            );
        }
        // Empty values are not signed (Alipay leaves them out), and a `+` is a space.
        let extra = sign_form(
            &testkeys::signer(0),
            &with(with(params, "passback_params", ""), "subject", "a b+c"),
        );
        assert!(extra.contains("passback_params=&") || extra.ends_with("passback_params="));
        assert!(a.accept_form("alipay", extra.as_bytes()).is_ok());
    }

    #[test]
    fn settings_are_checked_at_start() {
        assert_eq!(
            Alipay::new("", &[("k".into(), testkeys::public_key_pem(0).into())])
                .err()
                .unwrap()
                .0,
            "app_id"
        );
        assert_eq!(Alipay::new(APP_ID, &[]).err().unwrap().0, "public_keys");
        assert_eq!(
            Alipay::new(APP_ID, &[("k".into(), b"junk".to_vec())])
                .err()
                .unwrap()
                .0,
            "public_keys"
        );
    }

    const ALIPAY_KEYS: &[&str] = &[
        "notify_type",
        "trade_status",
        "trade_no",
        "total_amount",
        "refund_fee",
        "gmt_refund",
        "gmt_payment",
        "gmt_close",
        "app_id",
        "charset",
        "trans_currency",
    ];

    proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = ours().accept_form("alipay", &body);
            let _ = parse_form(&body);
        }

        #[test]
        fn form_shaped_bodies_never_panic(body in "([a-z_]{0,12}=[%0-9A-Fa-f+.a-z ]{0,12}&?){0,8}") {
            let _ = ours().accept_form("alipay", body.as_bytes());
        }

        #[test]
        fn signed_arbitrary_notifications_never_panic(
            pairs in proptest::collection::vec(
                (prop::sample::select(ALIPAY_KEYS), prop_oneof![
                    Just("trade_status_sync".to_owned()), Just("TRADE_SUCCESS".to_owned()),
                    Just("TRADE_CLOSED".to_owned()), Just("TRADE_FINISHED".to_owned()),
                    Just(APP_ID.to_owned()), Just("2021-07-14 09:51:36.631".to_owned()),
                    "[0-9.e,-]{0,8}", "[ -~]{0,12}", "\\PC{0,6}",
                ]),
                0..12,
            ),
        ) {
            let mut params: Vec<(String, String)> = Vec::new();
            for (k, v) in pairs {
                params = with(params, k, &v);
            }
            let body = sign_form(&testkeys::signer(0), &params);
            let _ = ours().accept_form("alipay", body.as_bytes());
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
    use crate::providers::testkeys;
    use std::sync::LazyLock;

    const APP_ID: &str = "2021000000000000";

    /// Test key 0 plays Alipay; one provider knows its public key.
    static SIDES: LazyLock<(Alipay, TestCredentials)> = LazyLock::new(|| {
        let key = testkeys::public_key_base64(0).into_bytes();
        let scheme = Alipay::new(APP_ID, &[("k".to_owned(), key)]).unwrap();
        let psp = TestCredentials::new(&[(super::APP_ID, APP_ID)], Some(testkeys::signer(0)));
        (scheme, psp)
    });

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(Alipay::SENDS, ids(), i64::MAX, Just(CURRENCY.to_owned())),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let (scheme, psp) = &*SIDES;
            // gmt_payment, gmt_close or gmt_refund; every refund of a trade
            // is its one refund object (see the module docs).
            let event = match &event.parent_transaction_id {
                Some(trade) => CanonicalEvent {
                    transaction_id: format!("{trade}{REFUND_SUFFIX}"),
                    occurred_at: at(ts),
                    ..event
                },
                None => CanonicalEvent { occurred_at: at(ts), ..event },
            };
            prop_assert_eq!(round_trip(scheme, psp, &event, ts)?, event);
        }
    }
}
