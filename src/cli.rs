//! The `send` and `audit` subcommands.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::config::DbArgs;
use crate::providers::{adyen, standard, stripe, SchemeKind};
use crate::store::audit;

/// `fencehook audit`: the database invariants, and optionally the answers a
/// load run received.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// A `fencehook load --answers` file: every 2xx in it (other than
    /// `ignored`) must have a committed succeeded/failed payments row.
    #[arg(long, value_name = "FILE")]
    pub answers: Option<PathBuf>,
}

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
    #[arg(long, value_enum, default_value = "standard")]
    pub scheme: SchemeKind,
    /// Signing secret: whsec_<base64> (standard), the endpoint's whsec_... (stripe),
    /// the HMAC key in hex (adyen).
    #[arg(long, env = "FENCEHOOK_GENERIC_SECRET", hide_env_values = true)]
    pub secret: String,
    /// The payment's id: a PaymentIntent id (stripe), a pspReference (adyen);
    /// for refunds the refund's own id.
    #[arg(long)]
    pub transaction_id: String,
    /// Amount in minor units (cents).
    #[arg(long, default_value_t = 1000)]
    pub amount: i64,
    #[arg(long, default_value = "EUR")]
    pub currency: String,
    /// payment.succeeded | payment.failed | refund.succeeded, sent as the
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
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("POST {uri}: {e}"))?;
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
                json!({
                    "transaction_id": args.transaction_id,
                    "amount": args.amount,
                    "currency": args.currency,
                    "event_type": args.event_type,
                })
                .to_string()
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
                None => stripe_event(args, &delivery_id("evt_"), ts).to_string(),
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

/// A Stripe event as Stripe sends it (API 2024-06-20 shapes).
fn stripe_event(args: &SendArgs, event_id: &str, ts: i64) -> Value {
    let tx = &args.transaction_id;
    let currency = args.currency.to_ascii_lowercase();
    let charge = format!("ch_{}", tx.trim_start_matches("pi_"));
    let payment_intent = |status: &str, received: i64| {
        json!({
            "id": tx, "object": "payment_intent", "amount": args.amount,
            "amount_capturable": 0, "amount_received": received, "capture_method": "automatic",
            "created": ts, "currency": currency, "latest_charge": charge, "livemode": false,
            "metadata": {}, "payment_method": "pm_card_visa", "payment_method_types": ["card"],
            "status": status
        })
    };
    let (event_type, object) = match args.event_type.as_str() {
        "payment.succeeded" => (
            "payment_intent.succeeded",
            payment_intent("succeeded", args.amount),
        ),
        "payment.failed" => {
            let mut pi = payment_intent("requires_payment_method", 0);
            pi["last_payment_error"] = json!({
                "charge": charge, "code": "card_declined", "decline_code": "generic_decline",
                "message": "Your card was declined.", "type": "card_error"
            });
            ("payment_intent.payment_failed", pi)
        }
        "refund.succeeded" => (
            "refund.created",
            json!({
                "id": tx, "object": "refund", "amount": args.amount, "charge": charge,
                "created": ts, "currency": currency, "metadata": {},
                "payment_intent": format!("pi_{}", tx.trim_start_matches("re_")),
                "reason": "requested_by_customer", "status": "succeeded"
            }),
        ),
        other => (other, payment_intent("succeeded", args.amount)),
    };
    json!({
        "id": event_id, "object": "event", "api_version": "2024-06-20", "created": ts,
        "data": {"object": object}, "livemode": false, "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null}, "type": event_type
    })
}

/// A one-item Adyen notification batch (unsigned; [`adyen::sign_batch`] signs it).
fn adyen_batch(args: &SendArgs, ts: i64) -> Result<Value, String> {
    let (event_code, success) = match args.event_type.as_str() {
        "payment.succeeded" => ("AUTHORISATION", "true"),
        "payment.failed" => ("AUTHORISATION", "false"),
        "refund.succeeded" => ("REFUND", "true"),
        other => (other, "true"),
    };
    let event_date = OffsetDateTime::from_unix_timestamp(ts)
        .map_err(|e| e.to_string())?
        .format(&Rfc3339)
        .map_err(|e| e.to_string())?;
    Ok(json!({
        "live": "false",
        "notificationItems": [{"NotificationRequestItem": {
            "additionalData": {},
            "amount": {"currency": args.currency, "value": args.amount},
            "eventCode": event_code,
            "eventDate": event_date,
            "merchantAccountCode": "FencehookDemoECOM",
            "merchantReference": format!("order-{}", args.transaction_id),
            "operations": ["CANCEL", "CAPTURE", "REFUND"],
            "paymentMethod": "visa",
            "pspReference": args.transaction_id,
            "reason": "",
            "success": success
        }}]
    }))
}

/// Runs the audit and prints one line per check; `Ok(true)` when clean.
/// With `answers`, the answers file is read first, so a bad file stops the
/// audit before anything is printed as "clean".
pub async fn audit(database_url: &str, answers: Option<&Path>) -> Result<bool, String> {
    let answers = answers
        .map(audit::read_answers)
        .transpose()
        .map_err(|e| e.to_string())?;
    let mut checks = audit::run(database_url)
        .await
        .map_err(|e| format!("audit could not read the database: {e}"))?;
    if let Some(answers) = &answers {
        let check = audit::check_answers(database_url, answers)
            .await
            .map_err(|e| format!("audit could not read the database: {e}"))?;
        checks.push(check);
    }
    let (payments, entries) = audit::totals(database_url)
        .await
        .map_err(|e| e.to_string())?;
    println!("audit: {payments} payments, {entries} ledger entries");
    if let Some(answers) = &answers {
        println!(
            "audit: {} answers read, {} transactions answered 2xx to check",
            answers.lines,
            answers.durable.len()
        );
    }
    let mut clean = true;
    for c in &checks {
        let verdict = if c.total == 0 {
            "ok".to_owned()
        } else {
            format!("VIOLATED ({})", c.total)
        };
        println!("  {:<40} {verdict:<14} {}", c.name, c.description);
        for v in &c.violations {
            println!("      {v}");
        }
        clean &= c.total == 0;
    }
    println!(
        "audit: {}",
        if clean { "clean" } else { "VIOLATIONS FOUND" }
    );
    Ok(clean)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::{EventKind, Item, Provider};

    const STANDARD: &str = "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM=";
    const STRIPE: &str = "whsec_stripe_cli_test";
    const ADYEN: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

    fn args(scheme: SchemeKind, secret: &str, event_type: &str) -> SendArgs {
        SendArgs {
            url: "http://127.0.0.1:1".into(),
            provider: "p".into(),
            scheme,
            secret: secret.into(),
            transaction_id: "pi_cli_1".into(),
            amount: 1234,
            currency: "EUR".into(),
            event_type: event_type.into(),
            body: None,
            webhook_id: None,
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
            for (event_type, kind) in [
                ("payment.succeeded", EventKind::PaymentSucceeded),
                ("payment.failed", EventKind::PaymentFailed),
                ("refund.succeeded", EventKind::RefundSucceeded),
            ] {
                match received(scheme, secret, event_type) {
                    Item::Event(e) => {
                        assert_eq!(e.event_type, kind, "{scheme:?} {event_type}");
                        assert_eq!((e.amount_minor, e.currency.as_str()), (1234, "EUR"));
                    }
                    other => panic!("{scheme:?} {event_type}: {other:?}"),
                }
            }
        }
        let Item::Event(e) = received(SchemeKind::Stripe, STRIPE, "payment.succeeded") else {
            panic!()
        };
        assert_eq!(e.transaction_id, "pi_cli_1");
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
}
