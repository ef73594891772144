//! Deliveries in the shape each PSP sends them (field names, nesting, the
//! native event names), built from a few flags: for `send` and `load`.

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::send::SendArgs;

/// A Stripe event as Stripe sends it (API 2024-06-20 shapes).
pub(crate) fn stripe_event(args: &SendArgs, event_id: &str, ts: i64) -> Value {
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
pub(crate) fn adyen_batch(args: &SendArgs, ts: i64) -> Result<Value, String> {
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
