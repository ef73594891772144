//! `fencehook send`: sign one delivery the way a provider's scheme does, send
//! it, print the answer. For demos and for trying a providers file by hand.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use fencehook::http::client;
use fencehook::providers::{adyen, standard, stripe, SchemeKind};
use http_body_util::{BodyExt, Full};
use serde_json::json;

use super::deliveries::{adyen_batch, stripe_event};

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
    /// signed Stripe event), adyen (a one-item notification batch).
    #[arg(long, default_value = "standard", value_parser = parse_scheme)]
    pub scheme: SchemeKind,
    /// Signing secret: whsec_<base64> (standard), the endpoint's whsec_... (stripe),
    /// the HMAC key in hex (adyen).
    #[arg(long, env = "FENCEHOOK_GENERIC_SECRET", hide_env_values = true)]
    pub secret: String,
    /// The id of what the event is about: a payment's PaymentIntent id
    /// (stripe) or pspReference (adyen); for a refund or a dispute, its own
    /// id (`re_…`, `dp_…`; the refund's or dispute's pspReference).
    #[arg(long)]
    pub transaction_id: String,
    /// Amount in minor units (cents).
    #[arg(long, default_value_t = 1000)]
    pub amount: i64,
    #[arg(long, default_value = "EUR")]
    pub currency: String,
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
    /// webhook-id header (standard) or event id (stripe); default: a new one per call.
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

/// Sends the delivery; returns the HTTP status and body text.
pub async fn send(args: &SendArgs) -> Result<(u16, String), String> {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    let Delivery { body, headers } = build_delivery(args, ts)?;
    let uri = format!(
        "{}/webhooks/{}",
        args.url.trim_end_matches('/'),
        args.provider
    );
    let mut req = hyper::Request::post(&uri).header("content-type", "application/json");
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

/// One signed delivery: the body and the headers besides `content-type`.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
}

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
            let signature = standard::sign(&args.secret, &id, ts, body.as_bytes())?;
            Ok(Delivery {
                body,
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
            let signature = stripe::sign(&args.secret, ts, body.as_bytes())?;
            Ok(Delivery {
                body,
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
            adyen::sign_batch(&args.secret, &mut batch)?;
            Ok(Delivery {
                body: batch.to_string(),
                headers: Vec::new(),
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
            secret: secret.into(),
            transaction_id: id_for(event_type).into(),
            amount: 1234,
            currency: "EUR".into(),
            event_type: event_type.into(),
            body: None,
            webhook_id: None,
            payment_transaction_id: names_a_payment(event_type).then(|| "pi_cli_0".to_owned()),
        }
    }

    /// What the provider of that scheme makes of what `send` would send.
    fn received(scheme: SchemeKind, secret: &str, event_type: &str) -> Item {
        let Delivery { body, headers } =
            build_delivery(&args(scheme, secret, event_type), 1_700_000_000).expect("builds");
        let mut h = http::HeaderMap::new();
        for (name, value) in headers {
            h.insert(name, value.parse().unwrap());
        }
        let provider = Provider::new("p", scheme, &[secret.to_owned()], None).unwrap();
        let mut items = provider
            .accept(&h, body.as_bytes(), 1_700_000_000)
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
        let Delivery { body, headers } = build_delivery(&a, 1_700_000_000).unwrap();
        let mut h = http::HeaderMap::new();
        for (name, value) in headers {
            h.insert(name, value.parse().unwrap());
        }
        let provider = Provider::new("p", SchemeKind::Stripe, &[STRIPE.to_owned()], None).unwrap();
        let items = provider.accept(&h, body.as_bytes(), 1_700_000_000).unwrap();
        let [Item::Event(e)] = items.as_slice() else {
            panic!("{items:?}")
        };
        assert_eq!(e.parent_transaction_id.as_deref(), Some("ch_legacy_1"));
    }
}
