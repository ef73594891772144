//! `fencehook send`: sign one delivery the way a provider's scheme does, send
//! it, print the answer. For demos and for trying a providers file by hand.
//!
//! The HMAC schemes sign with `--secret`; the RSA schemes with the private
//! key in `--private-key` (PEM, PKCS#8 or PKCS#1, as `openssl genpkey`
//! writes it), plus what each needs: `--serial` and `--apiv3-key`
//! (wechatpay), `--app-id` (alipay), `--webhook-id` and `--cert-url`
//! (paypal).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use fencehook::http::client;
use fencehook::providers::keys::RsaSigner;
use fencehook::providers::{adyen, alipay, paypal, standard, stripe, wechatpay, SchemeKind};
use http_body_util::{BodyExt, Full};
use serde_json::json;

use super::deliveries::{
    adyen_batch, alipay_params, paypal_event, stripe_event, wechatpay_resource,
};

/// `fencehook send`: sign one delivery the way the provider's scheme does and send it.
#[derive(Debug, Clone, Args)]
pub struct SendArgs {
    /// Base URL of the public listener.
    #[arg(long, env = "FENCEHOOK_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Provider name in /webhooks/{provider}.
    #[arg(long, default_value = "generic")]
    pub provider: String,
    /// Wire format: standard (Standard Webhooks, generic payload), stripe (a
    /// signed Stripe event), adyen (a one-item notification batch), wechatpay
    /// (an encrypted API v3 notification), alipay (a form-encoded
    /// notification), paypal (a v2 capture event).
    #[arg(long, default_value = "standard", value_parser = parse_scheme)]
    pub scheme: SchemeKind,
    /// Signing secret of the HMAC schemes: whsec_<base64> (standard), the
    /// endpoint's whsec_... (stripe), the HMAC key in hex (adyen).
    #[arg(long, env = "FENCEHOOK_GENERIC_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// wechatpay, alipay, paypal: the PEM file of the RSA private key that
    /// plays the PSP's (its public key or certificate is in the providers file).
    #[arg(long, value_name = "FILE")]
    pub private_key: Option<PathBuf>,
    /// wechatpay: Wechatpay-Serial, the serial (or PUB_KEY_ID_…) the
    /// providers file maps to the public key of --private-key.
    #[arg(long)]
    pub serial: Option<String>,
    /// wechatpay: the APIv3 key (32 characters) that encrypts the resource.
    #[arg(long, env = "FENCEHOOK_WECHATPAY_APIV3_KEY", hide_env_values = true)]
    pub apiv3_key: Option<String>,
    /// alipay: the application's app_id.
    #[arg(long)]
    pub app_id: Option<String>,
    /// paypal: PAYPAL-CERT-URL, where the provider fetches the certificate
    /// of --private-key (under its cert_url_prefixes).
    #[arg(long)]
    pub cert_url: Option<String>,
    /// The id of what the event is about: a payment's PaymentIntent id
    /// (stripe) or pspReference (adyen); for a refund or a dispute, its own
    /// id (`re_…`, `dp_…`; the refund's or dispute's pspReference).
    #[arg(long)]
    pub transaction_id: String,
    /// Amount in minor units (cents, fen).
    #[arg(long, default_value_t = 1000)]
    pub amount: i64,
    /// ISO 4217 code; default CNY for wechatpay and alipay, EUR otherwise.
    #[arg(long)]
    pub currency: Option<String>,
    /// payment.succeeded | payment.failed | refund.succeeded | refund.failed |
    /// dispute.funds_withdrawn | dispute.funds_reinstated, sent as the
    /// scheme's native event (see docs/providers.md); any other value is sent
    /// verbatim as the native type (e.g. customer.created, CAPTURE).
    #[arg(long, default_value = "payment.succeeded")]
    pub event_type: String,
    /// Send this raw JSON body instead of building one from the flags (adyen:
    /// every item's hmacSignature is computed and set).
    #[arg(long)]
    pub body: Option<String>,
    /// webhook-id header (standard) or event id (stripe), default a new one
    /// per call; paypal: the webhook id the provider is configured with
    /// (required: it is part of what PayPal signs).
    #[arg(long)]
    pub webhook_id: Option<String>,
    /// Refunds and disputes: the transaction id of the payment they take
    /// money from (a PaymentIntent id, or a Charge id for a payment without
    /// one, for stripe; the payment's pspReference for adyen, sent as
    /// `originalReference`). Required to build a stripe or adyen refund or
    /// dispute; the standard scheme sends what it is given.
    #[arg(long)]
    pub payment_transaction_id: Option<String>,
}

fn parse_scheme(s: &str) -> Result<SchemeKind, String> {
    s.parse()
}

impl SendArgs {
    /// `--currency`, or the scheme's usual one.
    pub fn currency(&self) -> &str {
        match (&self.currency, self.scheme) {
            (Some(c), _) => c,
            (None, SchemeKind::WechatPay | SchemeKind::Alipay) => "CNY",
            (None, _) => "EUR",
        }
    }

    fn secret(&self) -> Result<&str, String> {
        self.secret.as_deref().ok_or_else(|| {
            format!(
                "--scheme {} signs with --secret (or FENCEHOOK_GENERIC_SECRET)",
                self.scheme.as_str()
            )
        })
    }

    fn required<'a>(&self, value: &'a Option<String>, flag: &str) -> Result<&'a str, String> {
        value
            .as_deref()
            .ok_or_else(|| format!("--scheme {} needs {flag}", self.scheme.as_str()))
    }

    fn signer(&self) -> Result<RsaSigner, String> {
        let path = self.private_key.as_ref().ok_or_else(|| {
            format!(
                "--scheme {} signs with an RSA private key: --private-key FILE",
                self.scheme.as_str()
            )
        })?;
        let pem =
            std::fs::read(path).map_err(|e| format!("--private-key {}: {e}", path.display()))?;
        RsaSigner::from_pem(&pem).map_err(|e| format!("--private-key {}: {e}", path.display()))
    }
}

/// Sends the delivery; returns the HTTP status and body text.
pub async fn send(args: &SendArgs) -> Result<(u16, String), String> {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    let Delivery {
        body,
        headers,
        content_type,
    } = build_delivery(args, ts)?;
    let uri = format!(
        "{}/webhooks/{}",
        args.url.trim_end_matches('/'),
        args.provider
    );
    let mut req = hyper::Request::post(&uri).header("content-type", content_type);
    for (name, value) in headers {
        req = req.header(name, value);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("bad request for {uri}: {e}"))?;
    let resp = client::new(Duration::from_secs(5))
        .request(req)
        .await
        .map_err(|e| {
            if e.is_connect() {
                format!(
                    "cannot reach {uri}: {} (is `fencehook serve` running there?)",
                    fencehook::error::chain(&e)
                )
            } else {
                format!("POST {uri}: {}", fencehook::error::chain(&e))
            }
        })?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let mut out = String::from_utf8_lossy(&text).into_owned();
    if let Some(r) = retry_after {
        out.push_str(&format!(" (Retry-After: {r})"));
    }
    Ok((status, out))
}

/// One signed delivery: the body, its content type and the other headers.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
    pub content_type: &'static str,
}

const JSON: &str = "application/json";

/// The signed delivery, as `args.scheme` shapes and signs it, at unix time `ts`.
pub fn build_delivery(args: &SendArgs, ts: i64) -> Result<Delivery, String> {
    let delivery_id = |prefix: &str| {
        args.webhook_id
            .clone()
            .unwrap_or_else(|| format!("{prefix}{}", uuid::Uuid::new_v4().simple()))
    };
    match args.scheme {
        SchemeKind::Standard => {
            let body = args.body.clone().unwrap_or_else(|| {
                let mut body = json!({
                    "transaction_id": args.transaction_id,
                    "amount": args.amount,
                    "currency": args.currency,
                    "event_type": args.event_type,
                });
                if let Some(parent) = &args.payment_transaction_id {
                    body["payment_transaction_id"] = json!(parent);
                }
                body.to_string()
            });
            let id = delivery_id("msg_");
            let signature = standard::sign(args.secret()?, &id, ts, body.as_bytes())?;
            Ok(Delivery {
                body,
                content_type: JSON,
                headers: vec![
                    ("webhook-id", id),
                    ("webhook-timestamp", ts.to_string()),
                    ("webhook-signature", signature),
                ],
            })
        }
        SchemeKind::Stripe => {
            let body = match &args.body {
                Some(b) => b.clone(),
                None => stripe_event(args, &delivery_id("evt_"), ts)?.to_string(),
            };
            let signature = stripe::sign(args.secret()?, ts, body.as_bytes())?;
            Ok(Delivery {
                body,
                content_type: JSON,
                headers: vec![(stripe::SIGNATURE_HEADER, signature)],
            })
        }
        SchemeKind::Adyen => {
            let mut batch = match &args.body {
                Some(b) => {
                    serde_json::from_str(b).map_err(|e| format!("--body is not JSON: {e}"))?
                }
                None => adyen_batch(args, ts)?,
            };
            adyen::sign_batch(args.secret()?, &mut batch)?;
            Ok(Delivery {
                body: batch.to_string(),
                content_type: JSON,
                headers: Vec::new(),
            })
        }
        SchemeKind::WechatPay => {
            let serial = args.required(&args.serial, "--serial")?;
            let signer = args.signer()?;
            let body = match &args.body {
                Some(b) => b.clone(),
                None => {
                    let key = args.required(&args.apiv3_key, "--apiv3-key")?;
                    let (event_type, resource, original_type) = wechatpay_resource(args, ts)?;
                    let nonce = &uuid::Uuid::new_v4().simple().to_string()[..12];
                    let ciphertext = wechatpay::encrypt_resource(
                        key,
                        nonce,
                        original_type,
                        resource.to_string().as_bytes(),
                    )?;
                    json!({
                        "id": delivery_id(""), "create_time": resource["success_time"],
                        "resource_type": "encrypt-resource", "event_type": event_type,
                        "summary": "fencehook send",
                        "resource": {"original_type": original_type, "algorithm": wechatpay::ALGORITHM,
                            "ciphertext": ciphertext, "associated_data": original_type, "nonce": nonce}
                    })
                    .to_string()
                }
            };
            let nonce = uuid::Uuid::new_v4().simple().to_string();
            let signature = wechatpay::sign(&signer, ts, &nonce, body.as_bytes());
            Ok(Delivery {
                body,
                content_type: JSON,
                headers: vec![
                    (wechatpay::TIMESTAMP_HEADER, ts.to_string()),
                    (wechatpay::NONCE_HEADER, nonce),
                    (wechatpay::SERIAL_HEADER, serial.to_owned()),
                    (wechatpay::SIGNATURE_HEADER, signature),
                    (
                        wechatpay::SIGNATURE_TYPE_HEADER,
                        wechatpay::SIGNATURE_TYPE.to_owned(),
                    ),
                ],
            })
        }
        SchemeKind::Alipay => {
            let signer = args.signer()?;
            let params = match &args.body {
                // A form body of your own: decoded, re-signed.
                Some(b) => alipay::parse_form(b.as_bytes())
                    .map_err(|e| format!("--body is not a form: {e}"))?,
                None => alipay_params(args, args.required(&args.app_id, "--app-id")?, ts)?,
            };
            Ok(Delivery {
                body: alipay::sign_form(&signer, &params),
                content_type: alipay::CONTENT_TYPE,
                headers: Vec::new(),
            })
        }
        SchemeKind::Paypal => {
            let webhook_id = args.required(&args.webhook_id, "--webhook-id (the provider's)")?;
            let cert_url = args.required(&args.cert_url, "--cert-url")?;
            let signer = args.signer()?;
            let body = match &args.body {
                Some(b) => b.clone(),
                None => paypal_event(args, &format!("WH-{}", uuid::Uuid::new_v4().simple()), ts)?
                    .to_string(),
            };
            let transmission_id = uuid::Uuid::new_v4().to_string();
            let time = time::OffsetDateTime::from_unix_timestamp(ts)
                .map_err(|e| e.to_string())?
                .format(&time::format_description::well_known::Rfc3339)
                .map_err(|e| e.to_string())?;
            let signature = paypal::sign(
                &signer,
                &transmission_id,
                &time,
                webhook_id,
                body.as_bytes(),
            );
            Ok(Delivery {
                body,
                content_type: JSON,
                headers: vec![
                    (paypal::TRANSMISSION_ID_HEADER, transmission_id),
                    (paypal::TRANSMISSION_TIME_HEADER, time),
                    (paypal::TRANSMISSION_SIG_HEADER, signature),
                    (paypal::CERT_URL_HEADER, cert_url.to_owned()),
                    (paypal::AUTH_ALGO_HEADER, paypal::AUTH_ALGO.to_owned()),
                ],
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::deliveries::names_a_payment;
    use super::*;
    use fencehook::domain::{EventKind, ObjectKind};
    use fencehook::providers::{Item, Provider};

    const STANDARD: &str = "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM=";
    const STRIPE: &str = "whsec_stripe_cli_test";
    const ADYEN: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// The id `send` is given for each kind: the payment's, the refund's or
    /// the dispute's own.
    fn id_for(event_type: &str) -> &'static str {
        match event_type.split('.').next() {
            Some("refund") => "re_cli_1",
            Some("dispute") => "dp_cli_1",
            _ => "pi_cli_1",
        }
    }

    fn args(scheme: SchemeKind, secret: &str, event_type: &str) -> SendArgs {
        SendArgs {
            url: "http://127.0.0.1:1".into(),
            provider: "p".into(),
            scheme,
            secret: Some(secret.into()),
            private_key: None,
            serial: None,
            apiv3_key: None,
            app_id: None,
            cert_url: None,
            transaction_id: id_for(event_type).into(),
            amount: 1234,
            currency: Some("EUR".into()),
            event_type: event_type.into(),
            body: None,
            webhook_id: None,
            payment_transaction_id: names_a_payment(event_type).then(|| "pi_cli_0".to_owned()),
        }
    }

    /// What the provider of that scheme makes of what `send` would send.
    fn received(scheme: SchemeKind, secret: &str, event_type: &str) -> Item {
        let Delivery { body, headers, .. } =
            build_delivery(&args(scheme, secret, event_type), 1_700_000_000).expect("builds");
        let mut h = http::HeaderMap::new();
        for (name, value) in headers {
            h.insert(name, value.parse().unwrap());
        }
        let provider = Provider::new("p", scheme, &[secret.to_owned()], None).unwrap();
        let mut items = block_on(provider.accept(&h, body.as_bytes(), 1_700_000_000))
            .expect("the provider accepts what send signs");
        assert_eq!(items.len(), 1);
        items.remove(0)
    }

    #[test]
    fn send_builds_a_delivery_each_scheme_accepts_and_maps_as_asked() {
        for (scheme, secret) in [
            (SchemeKind::Standard, STANDARD),
            (SchemeKind::Stripe, STRIPE),
            (SchemeKind::Adyen, ADYEN),
        ] {
            for &kind in EventKind::ALL {
                let event_type = kind.as_str();
                match received(scheme, secret, event_type) {
                    Item::Event(e) => {
                        let parent = match kind.object() {
                            ObjectKind::Payment => None,
                            ObjectKind::Refund | ObjectKind::Dispute => Some("pi_cli_0"),
                        };
                        assert_eq!(
                            (
                                e.event_type,
                                e.transaction_id.as_str(),
                                e.parent_transaction_id.as_deref(),
                                e.amount_minor,
                                e.currency.as_str()
                            ),
                            (kind, id_for(event_type), parent, 1234, "EUR"),
                            "{scheme:?} {event_type}"
                        );
                    }
                    other => panic!("{scheme:?} {event_type}: {other:?}"),
                }
            }
        }
        for (scheme, secret, native) in [
            (SchemeKind::Stripe, STRIPE, "customer.created"),
            (SchemeKind::Adyen, ADYEN, "CAPTURE"),
        ] {
            assert!(matches!(
                received(scheme, secret, native),
                Item::Ignored { .. }
            ));
        }
    }

    #[test]
    fn a_psp_shaped_refund_or_dispute_without_its_payment_is_not_built() {
        for scheme in [SchemeKind::Stripe, SchemeKind::Adyen] {
            for event_type in ["refund.succeeded", "dispute.funds_withdrawn"] {
                let mut a = args(scheme, ADYEN, event_type);
                a.payment_transaction_id = None;
                let err = build_delivery(&a, 1_700_000_000).unwrap_err();
                assert!(err.contains("--payment-transaction-id"), "{err}");
            }
        }
    }

    #[test]
    fn a_stripe_refund_of_a_payment_without_payment_intent_names_its_charge() {
        let mut a = args(SchemeKind::Stripe, STRIPE, "refund.succeeded");
        a.payment_transaction_id = Some("ch_legacy_1".into());
        let Delivery { body, headers, .. } = build_delivery(&a, 1_700_000_000).unwrap();
        let mut h = http::HeaderMap::new();
        for (name, value) in headers {
            h.insert(name, value.parse().unwrap());
        }
        let provider = Provider::new("p", SchemeKind::Stripe, &[STRIPE.to_owned()], None).unwrap();
        let items = block_on(provider.accept(&h, body.as_bytes(), 1_700_000_000)).unwrap();
        let [Item::Event(e)] = items.as_slice() else {
            panic!("{items:?}")
        };
        assert_eq!(e.parent_transaction_id.as_deref(), Some("ch_legacy_1"));
    }
}

/// `send` for the RSA schemes, against providers that know the test keys.
#[cfg(all(test, feature = "test-support"))]
mod rsa_tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use fencehook::domain::EventKind;
    use fencehook::providers::{testkeys, Item, Provider, Settings};

    const SERIAL: &str = "PUB_KEY_ID_0000000000000024101100397200000006";
    const APIV3: &str = "fencehook-send-apiv3-key-32bytes";
    const APP_ID: &str = "2021000000000000";
    const WEBHOOK_ID: &str = "WH-SEND-TEST";
    const CERT_URL: &str = "https://api.paypal.com/v1/notifications/certs/CERT-send-test";
    const NOW: i64 = 1_700_000_000;

    /// Test key 0's private key in a file, as a user would pass it.
    fn key_file() -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "fencehook-send-test-{}-{}.pem",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&path, testkeys::private_key_pem(0)).unwrap();
        path
    }

    fn provider(scheme: SchemeKind) -> Provider {
        let settings = match scheme {
            SchemeKind::WechatPay => Settings {
                secrets: Some(vec![APIV3.into()]),
                platform_keys: Some(BTreeMap::from([(
                    SERIAL.to_owned(),
                    testkeys::public_key_pem(0).into_bytes(),
                )])),
                ..Settings::default()
            },
            SchemeKind::Alipay => Settings {
                app_id: Some(APP_ID.into()),
                public_keys: Some(vec![(
                    "alipay".into(),
                    testkeys::public_key_base64(0).into_bytes(),
                )]),
                ..Settings::default()
            },
            _ => Settings {
                webhook_id: Some(WEBHOOK_ID.into()),
                ..Settings::default()
            },
        };
        let p = Provider::with_settings("p", scheme, settings).unwrap();
        if scheme == SchemeKind::Paypal {
            let cert = testkeys::certificate(
                0,
                "0ABC",
                "CN=messageverificationcerts.paypal.com",
                0,
                4_000_000_000,
            );
            p.preload_paypal_certificate(CERT_URL, cert.as_bytes())
                .unwrap();
        }
        p
    }

    fn args(scheme: SchemeKind, event_type: &str, key: &std::path::Path) -> SendArgs {
        let refund_like = event_type.starts_with("refund.") || event_type.starts_with("dispute.");
        SendArgs {
            url: "http://127.0.0.1:1".into(),
            provider: "p".into(),
            scheme,
            secret: None,
            private_key: Some(key.to_owned()),
            serial: Some(SERIAL.into()),
            apiv3_key: Some(APIV3.into()),
            app_id: Some(APP_ID.into()),
            cert_url: Some(CERT_URL.into()),
            transaction_id: if refund_like { "RF-1" } else { "PAY-1" }.into(),
            amount: 1234,
            currency: None,
            event_type: event_type.into(),
            body: None,
            webhook_id: Some(WEBHOOK_ID.into()),
            payment_transaction_id: refund_like.then(|| "PAY-0".to_owned()),
        }
    }

    fn received(scheme: SchemeKind, a: &SendArgs) -> Result<Item, String> {
        let Delivery {
            body,
            headers,
            content_type,
        } = build_delivery(a, NOW)?;
        let mut h = http::HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
        for (name, value) in headers {
            h.insert(name, value.parse().unwrap());
        }
        let p = provider(scheme);
        assert!(p.accepts_content_type(&h), "{scheme:?}: {content_type}");
        let mut items = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(p.accept(&h, body.as_bytes(), NOW))
            .map_err(|e| format!("{scheme:?} {}: {e}", a.event_type))?;
        assert_eq!(items.len(), 1);
        Ok(items.remove(0))
    }

    #[test]
    fn send_signs_each_rsa_scheme_as_its_psp_and_the_provider_maps_every_kind_it_sends() {
        let key = key_file();
        /// (kind, transaction_id, parent, currency) of what `send` builds.
        type Kinds<'a> = &'a [(&'a str, &'a str, Option<&'a str>, &'a str)];
        let cases: &[(SchemeKind, Kinds)] = &[
            (
                SchemeKind::WechatPay,
                &[
                    ("payment.succeeded", "PAY-1", None, "CNY"),
                    ("refund.succeeded", "RF-1", Some("PAY-0"), "CNY"),
                    ("refund.failed", "RF-1", Some("PAY-0"), "CNY"),
                ],
            ),
            (
                SchemeKind::Alipay,
                &[
                    ("payment.succeeded", "PAY-1", None, "CNY"),
                    ("payment.failed", "PAY-1", None, "CNY"),
                    ("refund.succeeded", "PAY-0:refund", Some("PAY-0"), "CNY"),
                ],
            ),
            (
                SchemeKind::Paypal,
                &[
                    ("payment.succeeded", "PAY-1", None, "EUR"),
                    ("payment.failed", "PAY-1", None, "EUR"),
                    ("refund.succeeded", "RF-1", Some("PAY-0"), "EUR"),
                    ("dispute.funds_withdrawn", "RF-1", Some("PAY-0"), "EUR"),
                ],
            ),
        ];
        for (scheme, kinds) in cases {
            for (event_type, id, parent, currency) in *kinds {
                match received(*scheme, &args(*scheme, event_type, &key)) {
                    Ok(Item::Event(e)) => assert_eq!(
                        (
                            e.event_type.as_str(),
                            e.transaction_id.as_str(),
                            e.parent_transaction_id.as_deref(),
                            e.amount_minor,
                            e.currency.as_str()
                        ),
                        (*event_type, *id, *parent, 1234, *currency),
                        "{scheme:?}"
                    ),
                    other => panic!("{scheme:?} {event_type}: {other:?}"),
                }
            }
            // The kinds this PSP has no notification for are refused by send.
            for &kind in EventKind::ALL {
                if kinds.iter().all(|(k, ..)| *k != kind.as_str()) {
                    let err = build_delivery(&args(*scheme, kind.as_str(), &key), NOW).unwrap_err();
                    assert!(
                        err.contains("sends no notification"),
                        "{scheme:?} {kind:?}: {err}"
                    );
                }
            }
        }
        // Native types the provider does not book: ignored.
        for (scheme, native) in [
            (SchemeKind::WechatPay, "REFUND.ABNORMAL"),
            (SchemeKind::Alipay, "WAIT_BUYER_PAY"),
            (SchemeKind::Paypal, "PAYMENT.CAPTURE.PENDING"),
        ] {
            let mut a = args(scheme, native, &key);
            a.payment_transaction_id = Some("PAY-0".into());
            assert!(
                matches!(received(scheme, &a), Ok(Item::Ignored { .. })),
                "{scheme:?} {native}"
            );
        }
        let _ = std::fs::remove_file(key);
    }

    #[test]
    fn what_each_rsa_scheme_needs_is_asked_for_by_flag() {
        let key = key_file();
        for (scheme, clear, flag) in [
            (SchemeKind::WechatPay, "serial", "--serial"),
            (SchemeKind::WechatPay, "apiv3_key", "--apiv3-key"),
            (SchemeKind::WechatPay, "private_key", "--private-key"),
            (SchemeKind::Alipay, "app_id", "--app-id"),
            (SchemeKind::Paypal, "webhook_id", "--webhook-id"),
            (SchemeKind::Paypal, "cert_url", "--cert-url"),
        ] {
            let mut a = args(scheme, "payment.succeeded", &key);
            match clear {
                "serial" => a.serial = None,
                "apiv3_key" => a.apiv3_key = None,
                "private_key" => a.private_key = None,
                "app_id" => a.app_id = None,
                "webhook_id" => a.webhook_id = None,
                _ => a.cert_url = None,
            }
            let err = build_delivery(&a, NOW).unwrap_err();
            assert!(err.contains(flag), "{scheme:?}: {err}");
        }
        let mut a = args(SchemeKind::Alipay, "payment.succeeded", &key);
        a.currency = Some("USD".into());
        assert!(build_delivery(&a, NOW).unwrap_err().contains("CNY"));
        let mut a = args(SchemeKind::Standard, "payment.succeeded", &key);
        a.secret = None;
        assert!(build_delivery(&a, NOW).unwrap_err().contains("--secret"));
        let _ = std::fs::remove_file(key);
    }
}
