//! WeChat Pay API v3 (`wechatpay` scheme): signed notifications whose
//! payload is encrypted.
//!
//! # Signature
//!
//! Headers `Wechatpay-Timestamp` (unix seconds), `Wechatpay-Nonce`,
//! `Wechatpay-Signature` (base64) and `Wechatpay-Serial`; `Wechatpay-Signature-Type`,
//! when sent, must be `WECHATPAY2-SHA256-RSA2048` (the SDKs assume it when it
//! is absent). The signature is SHA256withRSA (PKCS#1 v1.5) over
//!
//! ```text
//! {Wechatpay-Timestamp}\n{Wechatpay-Nonce}\n{raw body}\n
//! ```
//!
//! with the platform key the serial names: a platform certificate's serial
//! (hex) or a WeChat Pay public key's id (`PUB_KEY_ID_…`). WeChat moves
//! merchants from certificates to public keys on a ramp, signing with either
//! meanwhile, so the key is chosen by serial, never by trying each; an
//! unknown serial is a 401. The timestamp must be within `tolerance_secs`
//! of now, either side. All of this is checked on the raw bytes, before the
//! body is parsed.
//!
//! # Payload
//!
//! `{id, create_time, event_type, resource_type, resource: {algorithm,
//! ciphertext, associated_data, nonce, original_type}, summary}`. The
//! `resource` of a handled event is decrypted: AEAD_AES_256_GCM with the
//! APIv3 key (any configured key may open it: rotation), the 12-byte
//! `nonce` and `associated_data` as AAD; `ciphertext` is base64 of the
//! encrypted bytes followed by the 16-byte tag. A resource no configured key
//! opens is a 400 (WeChat retries any non-2xx, so fixing the key lets the
//! retries through).
//!
//! # Mapping
//!
//! | event_type | booked as | transaction_id | parent | amount |
//! | --- | --- | --- | --- | --- |
//! | `TRANSACTION.SUCCESS` (`trade_state` SUCCESS) | payment.succeeded | `transaction_id` | – | `amount.total` |
//! | `REFUND.SUCCESS` | refund.succeeded | `refund_id` | `transaction_id` | `amount.refund` |
//! | `REFUND.CLOSED` | refund.failed (closed = failed, no money left) | `refund_id` | `transaction_id` | `amount.refund` |
//! | `REFUND.ABNORMAL`, anything else | ignored | | | |
//!
//! Payments are keyed by WeChat's `transaction_id`, not the merchant's
//! `out_trade_no`: it is WeChat's own id of the payment (unique across
//! merchants, where `out_trade_no` is unique only within one `mchid`), every
//! payment and refund notice carries it, and a refund names its payment by
//! it, so the refund's parent is the payment's key. `REFUND.ABNORMAL` (the
//! refund could not reach the buyer's card; the merchant re-routes it by hand)
//! is not final: ignored, a later SUCCESS or CLOSED settles it. Amounts are
//! integer fen as sent (`total` and `refund`, the list prices, so the refund
//! cap compares like with like); the currency is `amount.currency` and, where
//! a notice has none (refunds), CNY: domestic merchant ids take only CNY.

use std::collections::HashMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fields::{
    self, amount_minor, check_currency, check_transaction_id, invalid, opt, opt_str, req_object,
    req_str, signed_header, Object,
};
use super::keys::{CertificateInfo, RsaPublicKey, RsaSigner};
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError, JSON};
use super::scheme::{AckBody, Item, Reject, Scheme};
use super::settings::{Secrets, Tolerance};
pub use super::setup::SettingError;
use super::setup::Setup;
use crate::domain::{CanonicalEvent, EventKind};

pub const TIMESTAMP_HEADER: &str = "wechatpay-timestamp";
pub const NONCE_HEADER: &str = "wechatpay-nonce";
pub const SIGNATURE_HEADER: &str = "wechatpay-signature";
pub const SERIAL_HEADER: &str = "wechatpay-serial";
pub const SIGNATURE_TYPE_HEADER: &str = "wechatpay-signature-type";
/// The only signature type of API v3 merchant notifications.
pub const SIGNATURE_TYPE: &str = "WECHATPAY2-SHA256-RSA2048";
/// The only `resource.algorithm` accepted.
pub const ALGORITHM: &str = "AEAD_AES_256_GCM";
/// An APIv3 key is 32 ASCII characters, used as the AES-256 key as is.
pub const APIV3_KEY_LEN: usize = 32;
/// The currency of a notice that names none.
const DEFAULT_CURRENCY: &str = "CNY";

/// `Wechatpay-Serial` of what the tools sign: the serial the providers file
/// maps to the public key of their private key.
pub const SERIAL: Key = Key {
    flag: "serial",
    what: "Wechatpay-Serial: the serial the providers file maps to the public key of --private-key",
    in_file: false,
};

/// The APIv3 key the tools encrypt a notification's resource with.
pub const APIV3_KEY: Key = Key {
    flag: "apiv3-key",
    what: "the APIv3 key that encrypts the resource",
    in_file: true,
};

/// A `wechatpay` provider's table.
#[derive(serde::Deserialize)]
pub struct Settings {
    /// The APIv3 keys (32 ASCII bytes each) that decrypt `resource`;
    /// several: rotation.
    secrets: Option<Secrets>,
    /// `Wechatpay-Serial` → the file of the platform certificate or public
    /// key it names; several: rotation.
    platform_keys: Option<std::collections::BTreeMap<String, String>>,
    tolerance_secs: Option<Tolerance>,
}

#[derive(Clone)]
pub struct WechatPay {
    apiv3_keys: Vec<[u8; APIV3_KEY_LEN]>,
    /// Platform key by `Wechatpay-Serial`.
    platform_keys: HashMap<String, RsaPublicKey>,
    tolerance_secs: u64,
}

impl WechatPay {
    /// `apiv3_keys` from `secrets`; `platform_keys` as (serial, file
    /// contents). Returns the warnings worth saying at start (an expired
    /// certificate) beside the scheme.
    pub fn new(
        apiv3_keys: &[String],
        platform_keys: &[(String, Vec<u8>)],
        tolerance_secs: u64,
        now: i64,
    ) -> Result<(WechatPay, Vec<String>), SettingError> {
        let apiv3_keys = apiv3_keys
            .iter()
            .map(|k| apiv3_key(k).map_err(|e| ("secrets", e)))
            .collect::<Result<Vec<_>, _>>()?;
        if platform_keys.is_empty() {
            return Err((
                "platform_keys",
                "at least one platform key is required ({ \"<serial>\" = \"file.pem\" })".into(),
            ));
        }
        let mut warnings = Vec::new();
        let mut keys = HashMap::new();
        for (serial, contents) in platform_keys {
            let bad = |e: String| ("platform_keys", format!("{serial}: {e}"));
            if serial.is_empty()
                || !serial
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Err(bad("a serial is letters, digits and _".into()));
            }
            let key = match CertificateInfo::parse(contents) {
                Ok(cert) => {
                    if !cert
                        .serial_hex
                        .eq_ignore_ascii_case(serial.trim_start_matches('0'))
                    {
                        return Err(bad(format!(
                            "the certificate's serial is {}, not {serial}",
                            cert.serial_hex
                        )));
                    }
                    if !cert.is_valid_at(now) {
                        warnings.push(format!(
                            "platform_keys: {serial}: the certificate is outside its validity period (WeChat signs with a current one)"
                        ));
                    }
                    cert.key
                }
                Err(_) => RsaPublicKey::parse(contents).map_err(bad)?,
            };
            keys.insert(serial.clone(), key);
        }
        Ok((
            WechatPay {
                apiv3_keys,
                platform_keys: keys,
                tolerance_secs,
            },
            warnings,
        ))
    }

    /// Checks the headers and the signature over the raw body.
    pub fn verify(&self, headers: &http::HeaderMap, body: &[u8], now: i64) -> Result<(), Reject> {
        let unauthorized = |m: &str| Reject::Unauthorized(m.to_owned());
        let header = |name: &str| signed_header(headers, name);
        if let Some(kind) = headers.get(SIGNATURE_TYPE_HEADER) {
            if kind.as_bytes() != SIGNATURE_TYPE.as_bytes() {
                return Err(unauthorized(
                    "Wechatpay-Signature-Type is not WECHATPAY2-SHA256-RSA2048",
                ));
            }
        }
        let ts_text = header(TIMESTAMP_HEADER)?;
        let nonce = header(NONCE_HEADER)?;
        let signature = header(SIGNATURE_HEADER)?;
        let serial = header(SERIAL_HEADER)?;
        if ts_text.len() > 18 || !ts_text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(unauthorized("Wechatpay-Timestamp is not a unix timestamp"));
        }
        let ts: i64 = ts_text
            .parse()
            .map_err(|_| unauthorized("Wechatpay-Timestamp is not a unix timestamp"))?;
        if now.abs_diff(ts) > self.tolerance_secs {
            return Err(unauthorized("Wechatpay-Timestamp outside tolerance"));
        }
        let key = self
            .platform_keys
            .get(serial)
            .ok_or_else(|| unauthorized("Wechatpay-Serial names no configured platform key"))?;
        let signature = B64
            .decode(signature)
            .map_err(|_| unauthorized("Wechatpay-Signature is not base64"))?;
        if key.verifies(&signed_message(ts_text, nonce, body), &signature) {
            Ok(())
        } else {
            Err(unauthorized("signature does not match"))
        }
    }

    /// Verifies, then decrypts and maps the notification.
    pub fn accept_notification(
        &self,
        provider: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.verify(headers, body, now)?;
        Ok(vec![parse_event(provider, body, &self.apiv3_keys)?])
    }
}

impl Scheme for WechatPay {
    const NAME: &'static str = "wechatpay";
    type Settings = Settings;
    const SIGNATURE_HEADER: Option<&'static str> = Some(SIGNATURE_HEADER);
    const CURRENCY: &'static str = DEFAULT_CURRENCY;
    const SENDS: &'static [EventKind] = &[
        EventKind::PaymentSucceeded,
        EventKind::RefundSucceeded,
        EventKind::RefundFailed,
    ];
    const PAYMENT_ID: Option<&'static str> = Some("transaction_id");
    const KEYS: &'static [Key] = &[SERIAL, APIV3_KEY];

    fn build(settings: Settings, setup: &mut Setup) -> Result<WechatPay, String> {
        let secrets = setup.required(settings.secrets, "secrets", "a list of APIv3 keys")?;
        let secrets = setup.secrets("secrets", secrets.into_vec());
        setup.offer(&APIV3_KEY, &secrets[0]);
        let files = setup.required(
            settings.platform_keys,
            "platform_keys",
            "a table of serial = \"key or certificate file\"",
        )?;
        let mut keys: Vec<(String, Vec<u8>)> = Vec::with_capacity(files.len());
        for (serial, path) in files {
            let contents = setup.key_file("platform_keys", Some(&serial), &path)?;
            keys.push((serial, contents));
        }
        let tolerance = Tolerance::secs(settings.tolerance_secs, "tolerance_secs", setup);
        let (w, warned) = WechatPay::new(&secrets, &keys, tolerance, setup.now())
            .map_err(|e| setup.setting(e))?;
        for warning in warned {
            setup.warn(warning);
        }
        Ok(w)
    }

    fn psp_event_id(_headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
        notification_id(body)
    }

    /// An empty success; `{"code":"FAIL","message":…}` with any failure status.
    fn ack_body(success: bool, result: &str, reason: Option<&str>) -> AckBody {
        if success {
            return AckBody::Empty;
        }
        AckBody::Json(serde_json::json!({
            "code": "FAIL",
            "message": match reason {
                Some(reason) => format!("{result}: {reason}"),
                None => result.to_owned(),
            },
        }))
    }

    async fn accept(
        &self,
        provider: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.accept_notification(provider, headers, body, now)
    }

    fn check(psp: &dyn Credentials) -> Result<(), PspError> {
        psp.signer()?;
        psp.key(&SERIAL)?;
        encrypt_resource(psp.key(&APIV3_KEY)?, "000000000000", "", b"")
            .map(drop)
            .map_err(|e| PspError::new("apiv3-key", e))
    }

    /// A notification built from `notice` (its resource encrypted with the
    /// APIv3 key), or a body of your own, signed with the private key.
    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let serial = psp.key(&SERIAL)?;
        let signer = psp.signer()?;
        let body = match body {
            Some(b) => b.to_owned(),
            None => {
                let key = psp.key(&APIV3_KEY)?;
                let (event_type, resource, original_type) = resource_of(notice, ts)?;
                let nonce = &uuid::Uuid::new_v4().simple().to_string()[..12];
                let ciphertext =
                    encrypt_resource(key, nonce, original_type, resource.to_string().as_bytes())?;
                serde_json::json!({
                    "id": delivery_id, "create_time": resource["success_time"],
                    "resource_type": "encrypt-resource", "event_type": event_type,
                    "summary": "fencehook send",
                    "resource": {"original_type": original_type, "algorithm": ALGORITHM,
                        "ciphertext": ciphertext, "associated_data": original_type, "nonce": nonce}
                })
                .to_string()
            }
        };
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let signature = sign(signer, ts, &nonce, body.as_bytes());
        Ok(Delivery {
            body,
            content_type: JSON,
            headers: vec![
                (TIMESTAMP_HEADER, ts.to_string()),
                (NONCE_HEADER, nonce),
                (SERIAL_HEADER, serial.to_owned()),
                (SIGNATURE_HEADER, signature),
                (SIGNATURE_TYPE_HEADER, SIGNATURE_TYPE.to_owned()),
            ],
        })
    }
}

fn apiv3_key(key: &str) -> Result<[u8; APIV3_KEY_LEN], String> {
    if key.len() != APIV3_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "an APIv3 key is {APIV3_KEY_LEN} printable ASCII characters"
        ));
    }
    let mut out = [0; APIV3_KEY_LEN];
    out.copy_from_slice(key.as_bytes());
    Ok(out)
}

/// `{timestamp}\n{nonce}\n{body}\n`: what WeChat Pay signs.
pub fn signed_message(timestamp: &str, nonce: &str, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(timestamp.len() + nonce.len() + body.len() + 3);
    for part in [
        timestamp.as_bytes(),
        b"\n",
        nonce.as_bytes(),
        b"\n",
        body,
        b"\n",
    ] {
        m.extend_from_slice(part);
    }
    m
}

/// The `Wechatpay-Signature` of a delivery, signed as WeChat Pay signs.
pub fn sign(signer: &RsaSigner, timestamp: i64, nonce: &str, body: &[u8]) -> String {
    signer.sign_base64(&signed_message(&timestamp.to_string(), nonce, body))
}

/// `resource.ciphertext` for `plaintext`: AES-256-GCM under the APIv3 key,
/// base64 of the ciphertext and its tag. `nonce` must be 12 bytes.
pub fn encrypt_resource(
    apiv3_key_text: &str,
    nonce: &str,
    associated_data: &str,
    plaintext: &[u8],
) -> Result<String, String> {
    let key = apiv3_key(apiv3_key_text)?;
    let nonce = Nonce::try_assume_unique_for_key(nonce.as_bytes())
        .map_err(|_| "the nonce must be 12 bytes".to_owned())?;
    let mut in_out = plaintext.to_vec();
    aead_key(&key)
        .seal_in_place_append_tag(nonce, Aad::from(associated_data.as_bytes()), &mut in_out)
        .map_err(|_| "encryption failed".to_owned())?;
    Ok(B64.encode(in_out))
}

fn aead_key(key: &[u8; APIV3_KEY_LEN]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("32 bytes is an AES-256 key"))
}

/// The plaintext of `resource` under any of `keys`.
fn decrypt(resource: &Object, keys: &[[u8; APIV3_KEY_LEN]]) -> Result<Vec<u8>, Reject> {
    let algorithm = req_str(resource, "algorithm", "resource.algorithm")?;
    if algorithm != ALGORITHM {
        return Err(invalid(format!(
            "resource.algorithm must be {ALGORITHM} (got {algorithm:?})"
        )));
    }
    let nonce = req_str(resource, "nonce", "resource.nonce")?;
    let nonce: [u8; 12] = nonce
        .as_bytes()
        .try_into()
        .map_err(|_| invalid("resource.nonce must be 12 bytes"))?;
    let aad = opt_str(resource, "associated_data", "resource.associated_data")?.unwrap_or("");
    let ciphertext = B64
        .decode(req_str(resource, "ciphertext", "resource.ciphertext")?)
        .map_err(|_| invalid("resource.ciphertext is not base64"))?;
    for key in keys {
        let mut in_out = ciphertext.clone();
        let opened = aead_key(key).open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad.as_bytes()),
            &mut in_out,
        );
        if let Ok(plaintext) = opened {
            return Ok(plaintext.to_vec());
        }
    }
    Err(invalid(
        "resource does not decrypt with any configured APIv3 key (or was altered)",
    ))
}

/// Maps a verified notification (see the module docs): the envelope is read,
/// a handled event's resource decrypted and read strictly.
pub fn parse_event(
    provider: &str,
    body: &[u8],
    apiv3_keys: &[[u8; APIV3_KEY_LEN]],
) -> Result<Item, Reject> {
    let value = fields::parse_json(body)?;
    let envelope = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object (a WeChat Pay notification)"))?;
    let event_type = req_str(envelope, "event_type", "event_type")?;
    let kind = match event_type {
        "TRANSACTION.SUCCESS" => EventKind::PaymentSucceeded,
        "REFUND.SUCCESS" => EventKind::RefundSucceeded,
        "REFUND.CLOSED" => EventKind::RefundFailed,
        // ABNORMAL is not final (a refund re-routed by hand); every other
        // type moves no money here.
        _ => {
            return Ok(Item::Ignored {
                event_type: event_type.to_owned(),
            })
        }
    };
    let created = occurred_at(
        opt_str(envelope, "create_time", "create_time")?,
        "create_time",
    )?;
    let resource = req_object(envelope, "resource", "resource")?;
    let plaintext = decrypt(resource, apiv3_keys)?;
    let decrypted = fields::parse_json(&plaintext)
        .map_err(|e| invalid(format!("the decrypted resource: {e}")))?;
    let object = decrypted
        .as_object()
        .ok_or_else(|| invalid("the decrypted resource must be a JSON object"))?;
    let amount = req_object(object, "amount", "resource.amount")?;
    let (transaction_id, parent, amount_minor, state_field, state) = match kind {
        EventKind::PaymentSucceeded => (
            req_str(object, "transaction_id", "resource.transaction_id")?,
            None,
            amount_minor(opt(amount, "total"), "resource.amount.total")?,
            "trade_state",
            "SUCCESS",
        ),
        _ => (
            req_str(object, "refund_id", "resource.refund_id")?,
            Some(req_str(
                object,
                "transaction_id",
                "resource.transaction_id",
            )?),
            amount_minor(opt(amount, "refund"), "resource.amount.refund")?,
            "refund_status",
            if kind == EventKind::RefundSucceeded {
                "SUCCESS"
            } else {
                "CLOSED"
            },
        ),
    };
    let actual = req_str(object, state_field, &format!("resource.{state_field}"))?;
    if actual != state {
        return Err(invalid(format!(
            "a {event_type} notification whose resource.{state_field} is {actual:?}"
        )));
    }
    check_transaction_id(transaction_id)?;
    if let Some(parent) = parent {
        check_transaction_id(parent)
            .map_err(|_| invalid("resource.transaction_id is not a valid id"))?;
    }
    let currency =
        opt_str(amount, "currency", "resource.amount.currency")?.unwrap_or(DEFAULT_CURRENCY);
    check_currency(currency)?;
    let success_time = occurred_at(
        opt_str(object, "success_time", "resource.success_time")?,
        "resource.success_time",
    )?;
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id: transaction_id.to_owned(),
        event_type: kind,
        amount_minor,
        currency: currency.to_owned(),
        parent_transaction_id: parent.map(str::to_owned),
        occurred_at: success_time.or(created),
        merchant_reference: fields::merchant_reference(object, "out_trade_no"),
        metadata: None,
    }))
}

fn occurred_at(text: Option<&str>, path: &str) -> Result<Option<OffsetDateTime>, Reject> {
    text.map(|t| {
        OffsetDateTime::parse(t, &Rfc3339)
            .map_err(|_| invalid(format!("{path} must be an RFC 3339 timestamp")))
    })
    .transpose()
}

/// The notification's own id (`id`), kept beside inbox events.
pub fn notification_id(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    value.get("id")?.as_str().map(str::to_owned)
}

/// A notification of `notice`: its `event_type` and the plaintext
/// `resource` (JSON) to encrypt, with its `original_type` (also the AAD):
/// [`parse_event`]'s inverse. A canonical kind WeChat Pay has no
/// notification for is refused; `REFUND.<status>` is sent as a refund in
/// that status, anything else as a transaction.
pub fn resource_of(notice: &Notice, ts: i64) -> Result<(String, Value, &'static str), String> {
    use serde_json::json;
    let when = psp::rfc3339(ts, 8)?;
    let tx = &notice.transaction_id;
    let currency = notice.currency.as_str();
    let transaction = || {
        json!({
            "appid": "wxd678efh567hg6787", "mchid": "1230000109",
            "out_trade_no": format!("order-{tx}"), "transaction_id": tx,
            "trade_type": "JSAPI", "trade_state": "SUCCESS", "trade_state_desc": "支付成功",
            "bank_type": "OTHERS", "attach": "", "success_time": when,
            "payer": {"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"},
            "amount": {"total": notice.amount, "payer_total": notice.amount,
                "currency": currency, "payer_currency": currency}
        })
    };
    let refund = |status: &str| -> Result<Value, String> {
        let payment = psp::parent(notice)?;
        let mut r = json!({
            "mchid": "1230000109", "transaction_id": payment,
            "out_trade_no": format!("order-{payment}"), "refund_id": tx,
            "out_refund_no": format!("refund-{tx}"), "refund_status": status,
            "user_received_account": "支付用户零钱",
            "amount": {"total": notice.amount, "refund": notice.amount,
                "payer_total": notice.amount, "payer_refund": notice.amount}
        });
        if status == "SUCCESS" {
            r["success_time"] = json!(when);
        }
        Ok(r)
    };
    Ok(match notice.event_type.as_str() {
        "payment.succeeded" => ("TRANSACTION.SUCCESS".into(), transaction(), "transaction"),
        "refund.succeeded" => ("REFUND.SUCCESS".into(), refund("SUCCESS")?, "refund"),
        "refund.failed" => ("REFUND.CLOSED".into(), refund("CLOSED")?, "refund"),
        other if other.contains('.') && other.chars().any(|c| c.is_ascii_lowercase()) => {
            return Err(psp::not_sent(WechatPay::NAME, WechatPay::SENDS, notice))
        }
        other if other.starts_with("REFUND.") => (
            other.into(),
            refund(other.trim_start_matches("REFUND."))?,
            "refund",
        ),
        other => (other.into(), transaction(), "transaction"),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testkeys;
    use super::*;
    use proptest::prelude::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/wechatpay");
    /// The made-up APIv3 key the constructed fixtures are encrypted with.
    const FIXTURE_KEY: &str = "fencehook-TEST-apiv3-key-32bytes";
    const OTHER_KEY: &str = "another-TEST-apiv3-key-32-bytes!";
    const SERIAL: &str = "5157F09EFDC096DE15EBE81A47057A7232F1B8E1";
    const PUB_KEY_ID: &str = "PUB_KEY_ID_0000000000000024101100397200000006";
    const NOW: i64 = 1_700_000_000;

    fn read(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// A provider that knows test key 0 as a certificate (SERIAL) and test
    /// key 1 as a public key (PUB_KEY_ID): WeChat's switch-over.
    fn wechat(apiv3: &[&str]) -> WechatPay {
        let cert = testkeys::certificate(0, SERIAL, "CN=Tenpay.com Root CA", 0, 4_000_000_000);
        let keys = vec![
            (SERIAL.to_owned(), cert.into_bytes()),
            (
                PUB_KEY_ID.to_owned(),
                testkeys::public_key_pem(1).into_bytes(),
            ),
        ];
        let apiv3: Vec<String> = apiv3.iter().map(|k| (*k).to_owned()).collect();
        WechatPay::new(&apiv3, &keys, 300, NOW).unwrap().0
    }

    fn headers(ts: i64, nonce: &str, serial: &str, signature: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(TIMESTAMP_HEADER, ts.to_string().parse().unwrap());
        h.insert(NONCE_HEADER, nonce.parse().unwrap());
        h.insert(SERIAL_HEADER, serial.parse().unwrap());
        h.insert(SIGNATURE_HEADER, signature.parse().unwrap());
        h.insert(SIGNATURE_TYPE_HEADER, SIGNATURE_TYPE.parse().unwrap());
        h
    }

    /// Headers signing `body` at NOW with test key `key` under `serial`.
    fn signed(key: usize, serial: &str, body: &[u8]) -> http::HeaderMap {
        let nonce = "n0nce-of-32-chars-abcdefghijklmn";
        headers(
            NOW,
            nonce,
            serial,
            &sign(&testkeys::signer(key), NOW, nonce, body),
        )
    }

    /// An envelope of `event_type` whose resource is `resource` encrypted
    /// with `key`.
    fn envelope(event_type: &str, resource: &Value, key: &str) -> Vec<u8> {
        let nonce = "fH7kQ2mZ9xLp";
        let ciphertext =
            encrypt_resource(key, nonce, "refund", resource.to_string().as_bytes()).unwrap();
        serde_json::json!({
            "id": "EV-2018022511223320873", "create_time": "2023-10-24T09:01:13+08:00",
            "resource_type": "encrypt-resource", "event_type": event_type, "summary": "x",
            "resource": {"original_type": "refund", "algorithm": ALGORITHM,
                "ciphertext": ciphertext, "associated_data": "refund", "nonce": nonce}
        })
        .to_string()
        .into_bytes()
    }

    fn accept(w: &WechatPay, h: &http::HeaderMap, body: &[u8]) -> Result<Item, Reject> {
        w.accept_notification("wechat", h, body, NOW)
            .map(|mut items| {
                assert_eq!(items.len(), 1);
                items.remove(0)
            })
    }

    fn event(item: Result<Item, Reject>) -> CanonicalEvent {
        match item {
            Ok(Item::Event(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_go_sdks_own_vector_verifies_with_its_test_certificate_at_its_time() {
        // wechatpay-go core/notify/notify_test.go: body, headers, certificate.
        let vector = "sdk_vector_wechatpay_go";
        let body = read(&format!("{vector}/body.json"));
        let cert = read(&format!("{vector}/platform_cert_test.pem"));
        let h: serde_json::Map<String, Value> =
            serde_json::from_slice(&read(&format!("{vector}/headers.json"))).unwrap();
        let mut headers = http::HeaderMap::new();
        for (name, value) in &h {
            headers.insert(
                http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).unwrap(),
                value.as_str().unwrap().parse().unwrap(),
            );
        }
        assert_eq!(
            signed_message("1624523846", h["Wechatpay-Nonce"].as_str().unwrap(), &body),
            read(&format!("{vector}/signed_message.txt")),
            "the message is built byte for byte as the SDK builds it"
        );
        let (w, warnings) = WechatPay::new(
            &[FIXTURE_KEY.to_owned()],
            &[("D7CE59D1F522D701".to_owned(), cert)],
            300,
            1_624_523_846,
        )
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(w.verify(&headers, &body, 1_624_523_846), Ok(()));
        assert_eq!(w.verify(&headers, &body, 1_624_523_846 + 300), Ok(()));
        assert!(w.verify(&headers, &body, 1_624_523_846 + 301).is_err());
        let mut other = body.clone();
        other.push(b' ');
        assert!(w.verify(&headers, &other, 1_624_523_846).is_err());
        // A PAYSCORE event: verified, then ignored without decrypting (the
        // vector's APIv3 key is a 16-byte test key).
        assert_eq!(
            w.accept_notification("wechat", &headers, &body, 1_624_523_846),
            Ok(vec![Item::Ignored {
                event_type: "PAYSCORE.USER_OPEN_SERVICE".into()
            }])
        );
    }

    #[test]
    fn the_merchant_reference_is_the_resources_out_trade_no() {
        let w = wechat(&[OTHER_KEY, FIXTURE_KEY]);
        let payment = read("transaction_success.envelope.json");
        let e = event(accept(&w, &signed(0, SERIAL, &payment), &payment));
        assert_eq!(e.merchant_reference.as_deref(), Some("FH20231023103400001"));
        let refund = read("refund_success.envelope.json");
        let r = event(accept(&w, &signed(1, PUB_KEY_ID, &refund), &refund));
        assert_eq!(r.merchant_reference.as_deref(), Some("FH20231023103400001"));
    }

    #[test]
    fn the_constructed_fixtures_decrypt_and_map_to_a_payment_and_its_refund() {
        let w = wechat(&[OTHER_KEY, FIXTURE_KEY]);
        let payment = read("transaction_success.envelope.json");
        let e = event(accept(&w, &signed(0, SERIAL, &payment), &payment));
        assert_eq!(
            (
                e.transaction_id.as_str(),
                e.event_type,
                e.parent_transaction_id.as_deref(),
                e.amount_minor,
                e.currency.as_str()
            ),
            (
                "4200001948202310234938573822",
                EventKind::PaymentSucceeded,
                None,
                100,
                "CNY"
            )
        );
        assert_eq!(
            e.occurred_at.unwrap().unix_timestamp(),
            OffsetDateTime::parse("2023-10-23T10:34:56+08:00", &Rfc3339)
                .unwrap()
                .unix_timestamp()
        );
        let refund = read("refund_success.envelope.json");
        // Signed with the public key (PUB_KEY_ID) during the switch-over.
        let r = event(accept(&w, &signed(1, PUB_KEY_ID, &refund), &refund));
        assert_eq!(
            (
                r.transaction_id.as_str(),
                r.event_type,
                r.parent_transaction_id.as_deref(),
                r.amount_minor,
                r.currency.as_str()
            ),
            (
                "50300407182023102400011301001",
                EventKind::RefundSucceeded,
                Some("4200001948202310234938573822"),
                40,
                "CNY"
            ),
            "the refund names the payment by its key; no currency in the notice: CNY"
        );
    }

    #[test]
    fn closed_refunds_fail_and_abnormal_ones_are_ignored() {
        let w = wechat(&[FIXTURE_KEY]);
        let closed: Value = serde_json::from_slice(&read("refund_closed.resource.json")).unwrap();
        let body = envelope("REFUND.CLOSED", &closed, FIXTURE_KEY);
        let e = event(accept(&w, &signed(0, SERIAL, &body), &body));
        assert_eq!(e.event_type, EventKind::RefundFailed);
        assert_eq!(e.transaction_id, "50300407182023102400011301003");
        let abnormal: Value =
            serde_json::from_slice(&read("refund_abnormal.resource.json")).unwrap();
        let body = envelope("REFUND.ABNORMAL", &abnormal, FIXTURE_KEY);
        assert_eq!(
            accept(&w, &signed(0, SERIAL, &body), &body),
            Ok(Item::Ignored {
                event_type: "REFUND.ABNORMAL".into()
            })
        );
        // The event type and the resource must agree.
        let body = envelope("REFUND.SUCCESS", &closed, FIXTURE_KEY);
        assert!(matches!(
            accept(&w, &signed(0, SERIAL, &body), &body),
            Err(Reject::Invalid(_))
        ));
    }

    #[test]
    fn bad_headers_serials_signatures_and_timestamps_are_401() {
        let w = wechat(&[FIXTURE_KEY]);
        let body = read("transaction_success.envelope.json");
        let good = signed(0, SERIAL, &body);
        assert!(w.verify(&good, &body, NOW).is_ok());
        let mut cases: Vec<(&str, http::HeaderMap)> = Vec::new();
        for name in [
            TIMESTAMP_HEADER,
            NONCE_HEADER,
            SIGNATURE_HEADER,
            SERIAL_HEADER,
        ] {
            let mut h = good.clone();
            h.remove(name);
            cases.push(("missing header", h));
            let mut h = good.clone();
            h.insert(name, "".parse().unwrap());
            cases.push(("empty header", h));
        }
        let mut h = good.clone();
        h.insert(
            SIGNATURE_TYPE_HEADER,
            "WECHATPAY2-SM2-WITH-SM3".parse().unwrap(),
        );
        cases.push(("other signature type", h));
        let mut h = good.clone();
        h.insert(SERIAL_HEADER, "PUB_KEY_ID_0000".parse().unwrap());
        cases.push(("unknown serial", h));
        cases.push(("the other key's serial", signed(0, PUB_KEY_ID, &body)));
        cases.push(("an unknown key", signed(2, SERIAL, &body)));
        let mut h = good.clone();
        h.insert(SIGNATURE_HEADER, "%%%".parse().unwrap());
        cases.push(("signature not base64", h));
        let mut h = good.clone();
        h.insert(TIMESTAMP_HEADER, "17e8".parse().unwrap());
        cases.push(("timestamp not digits", h));
        for (name, h) in cases {
            assert!(
                matches!(w.verify(&h, &body, NOW), Err(Reject::Unauthorized(_))),
                "{name}"
            );
        }
        // Signed over other bytes.
        let mut other = body.clone();
        other[10] ^= 1;
        assert!(w.verify(&good, &other, NOW).is_err());
        // Out of the window, either side.
        assert!(w.verify(&good, &body, NOW + 301).is_err());
        assert!(w.verify(&good, &body, NOW - 301).is_err());
        assert!(w.verify(&good, &body, NOW + 300).is_ok());
        // No signature type header: the SDKs assume the v3 one.
        let mut h = good.clone();
        h.remove(SIGNATURE_TYPE_HEADER);
        assert!(w.verify(&h, &body, NOW).is_ok());
    }

    #[test]
    fn a_resource_no_configured_key_opens_is_400() {
        let body = read("transaction_success.envelope.json");
        let w = wechat(&[OTHER_KEY]);
        match accept(&w, &signed(0, SERIAL, &body), &body) {
            Err(Reject::Invalid(why)) => assert!(why.contains("decrypt"), "{why}"),
            other => panic!("{other:?}"),
        }
        // An altered ciphertext, re-signed: the tag does not match.
        let mut v: Value = serde_json::from_slice(&body).unwrap();
        let ct = v["resource"]["ciphertext"].as_str().unwrap().to_owned();
        let mut raw = B64.decode(ct).unwrap();
        raw[0] ^= 1;
        v["resource"]["ciphertext"] = B64.encode(raw).into();
        let altered = v.to_string().into_bytes();
        let w = wechat(&[FIXTURE_KEY]);
        assert!(matches!(
            accept(&w, &signed(0, SERIAL, &altered), &altered),
            Err(Reject::Invalid(_))
        ));
        for (field, value) in [
            ("algorithm", Value::from("AEAD_SM4_GCM")),
            ("nonce", Value::from("short")),
            ("associated_data", Value::from("other")),
            ("ciphertext", Value::from("%%%")),
        ] {
            let mut v: Value = serde_json::from_slice(&body).unwrap();
            v["resource"][field] = value;
            let b = v.to_string().into_bytes();
            assert!(
                matches!(
                    accept(&w, &signed(0, SERIAL, &b), &b),
                    Err(Reject::Invalid(_))
                ),
                "{field}"
            );
        }
    }

    #[test]
    fn settings_are_checked_at_start() {
        let cert = testkeys::certificate(0, SERIAL, "CN=x", 0, 4_000_000_000);
        let ok = vec![(SERIAL.to_owned(), cert.clone().into_bytes())];
        for (keys, apiv3, field) in [
            (ok.clone(), vec!["short".to_owned()], "secrets"),
            (Vec::new(), vec![FIXTURE_KEY.to_owned()], "platform_keys"),
            (
                vec![("ABCDEF".to_owned(), cert.clone().into_bytes())],
                vec![FIXTURE_KEY.to_owned()],
                "platform_keys",
            ),
            (
                vec![(SERIAL.to_owned(), b"junk".to_vec())],
                vec![FIXTURE_KEY.to_owned()],
                "platform_keys",
            ),
        ] {
            let err = WechatPay::new(&apiv3, &keys, 300, NOW).err().unwrap();
            assert_eq!(err.0, field, "{}", err.1);
        }
        let expired = testkeys::certificate(0, SERIAL, "CN=x", 0, 1000);
        let (_, warnings) = WechatPay::new(
            &[FIXTURE_KEY.to_owned()],
            &[(SERIAL.to_owned(), expired.into_bytes())],
            300,
            NOW,
        )
        .unwrap();
        assert_eq!(warnings.len(), 1);
    }

    const WECHAT_KEYS: &[&str] = &[
        "transaction_id",
        "refund_id",
        "amount",
        "total",
        "refund",
        "currency",
        "trade_state",
        "refund_status",
        "success_time",
    ];

    proptest! {
        #[test]
        fn verify_and_map_never_panic(
            ts in "[ -~]{0,24}",
            nonce in "[ -~]{0,40}",
            serial in prop::sample::select(vec![SERIAL, PUB_KEY_ID, "x", ""]),
            sig in "[ -~]{0,400}",
            body in proptest::collection::vec(any::<u8>(), 0..512),
            now in any::<i64>(),
        ) {
            let w = wechat(&[FIXTURE_KEY]);
            let mut h = http::HeaderMap::new();
            for (name, value) in [(TIMESTAMP_HEADER, ts.as_str()), (NONCE_HEADER, &nonce),
                (SERIAL_HEADER, serial), (SIGNATURE_HEADER, &sig)] {
                if let Ok(v) = value.parse() {
                    h.insert(name, v);
                }
            }
            let _ = w.accept_notification("wechat", &h, &body, now);
            let _ = parse_event("wechat", &body, &[*b"fencehook-TEST-apiv3-key-32bytes"]);
        }

        #[test]
        fn signed_arbitrary_resources_never_panic(
            event_type in prop::sample::select(vec!["TRANSACTION.SUCCESS", "REFUND.SUCCESS",
                "REFUND.CLOSED", "REFUND.ABNORMAL", "OTHER"]),
            resource in crate::providers::testing::arbitrary_json(WECHAT_KEYS),
        ) {
            let w = wechat(&[FIXTURE_KEY]);
            let body = envelope(event_type, &resource, FIXTURE_KEY);
            let h = signed(0, SERIAL, &body);
            prop_assert!(w.verify(&h, &body, NOW).is_ok());
            let _ = w.accept_notification("wechat", &h, &body, NOW);
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

    const APIV3: &str = "fencehook-round-trip-apiv3-key-!";
    const SERIAL: &str = "PUB_KEY_ID_0000000000000024101100397200000006";

    /// Test key 0 plays WeChat Pay; one provider knows its public key.
    static SIDES: LazyLock<(WechatPay, TestCredentials)> = LazyLock::new(|| {
        let key = testkeys::public_key_pem(0).into_bytes();
        let (scheme, _) =
            WechatPay::new(&[APIV3.to_owned()], &[(SERIAL.to_owned(), key)], 300, 0).unwrap();
        let psp = TestCredentials::new(
            &[(super::SERIAL, SERIAL), (APIV3_KEY, APIV3)],
            Some(testkeys::signer(0)),
        );
        (scheme, psp)
    });

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(WechatPay::SENDS, ids(), i64::MAX, "[A-Z]{3}"),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let (scheme, psp) = &*SIDES;
            let event = match event.event_type {
                // A payment's success_time.
                EventKind::PaymentSucceeded => CanonicalEvent { occurred_at: at(ts), ..event },
                // A refund notice names no currency (CNY is all it can
                // be); a closed refund has no success_time.
                EventKind::RefundSucceeded => CanonicalEvent {
                    currency: DEFAULT_CURRENCY.into(),
                    occurred_at: at(ts),
                    ..event
                },
                _ => CanonicalEvent { currency: DEFAULT_CURRENCY.into(), ..event },
            };
            prop_assert_eq!(round_trip(scheme, psp, &event, ts)?, event);
        }
    }
}
