//! Deliveries in the shape each PSP sends them (field names, nesting, the
//! native event names), built from a few flags: for `send` and `load`.
//!
//! Each canonical kind is sent as the native event the provider maps back to
//! it (see docs/providers.md): refunds and disputes name their payment the
//! way the PSP does (a Stripe Refund's `payment_intent`, an Adyen item's
//! `originalReference`).

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::send::SendArgs;

/// The canonical kinds that take money from a payment and must name it.
pub(crate) fn names_a_payment(event_type: &str) -> bool {
    event_type.starts_with("refund.") || event_type.starts_with("dispute.")
}

/// The `--payment-transaction-id` a refund or dispute needs to be built in a
/// PSP's shape.
fn parent(args: &SendArgs) -> Result<&str, String> {
    args.payment_transaction_id.as_deref().ok_or_else(|| {
        format!(
            "--event-type {} takes money from a payment: give it with --payment-transaction-id (a PaymentIntent or Charge id for stripe, the payment's pspReference for adyen)",
            args.event_type
        )
    })
}

/// The Charge id `send` gives a PaymentIntent's (or a refund's) charge.
fn charge_of(payment: &str) -> String {
    match payment.strip_prefix("pi_") {
        Some(rest) => format!("ch_{rest}"),
        None => format!("ch_{payment}"),
    }
}

/// A Stripe event as Stripe sends it (API 2024-06-20 shapes; `refund.failed`
/// exists from 2024-10-28).
pub(crate) fn stripe_event(args: &SendArgs, event_id: &str, ts: i64) -> Result<Value, String> {
    let tx = &args.transaction_id;
    let currency = args.currency.to_ascii_lowercase();
    let payment_intent = |status: &str, received: i64| {
        json!({
            "id": tx, "object": "payment_intent", "amount": args.amount,
            "amount_capturable": 0, "amount_received": received, "capture_method": "automatic",
            "created": ts, "currency": currency, "latest_charge": charge_of(tx), "livemode": false,
            "metadata": {}, "payment_method": "pm_card_visa", "payment_method_types": ["card"],
            "status": status
        })
    };
    // A Refund or Dispute names its payment by PaymentIntent, or by Charge
    // when the payment has none (then that Charge is the payment's key).
    let links = |parent: &str| {
        if parent.starts_with("ch_") || parent.starts_with("py_") {
            (Value::Null, json!(parent))
        } else {
            (json!(parent), json!(charge_of(parent)))
        }
    };
    let refund = |status: &str| -> Result<Value, String> {
        let (pi, charge) = links(parent(args)?);
        let mut r = json!({
            "id": tx, "object": "refund", "amount": args.amount, "charge": charge,
            "created": ts, "currency": currency, "metadata": {}, "payment_intent": pi,
            "reason": "requested_by_customer", "status": status
        });
        if status == "failed" {
            r["failure_reason"] = json!("expired_or_canceled_card");
        }
        Ok(r)
    };
    let dispute = |status: &str| -> Result<Value, String> {
        let (pi, charge) = links(parent(args)?);
        Ok(json!({
            "id": tx, "object": "dispute", "amount": args.amount, "balance_transactions": [],
            "charge": charge, "created": ts, "currency": currency, "is_charge_refundable": false,
            "livemode": false, "metadata": {}, "payment_intent": pi, "reason": "fraudulent",
            "status": status
        }))
    };
    let mut previous_attributes = None;
    let (event_type, object) = match args.event_type.as_str() {
        "payment.succeeded" => (
            "payment_intent.succeeded",
            payment_intent("succeeded", args.amount),
        ),
        "payment.failed" => {
            let mut pi = payment_intent("requires_payment_method", 0);
            pi["last_payment_error"] = json!({
                "charge": charge_of(tx), "code": "card_declined",
                "decline_code": "generic_decline", "message": "Your card was declined.",
                "type": "card_error"
            });
            ("payment_intent.payment_failed", pi)
        }
        "refund.succeeded" => {
            previous_attributes = Some(json!({"status": "pending"}));
            ("refund.updated", refund("succeeded")?)
        }
        "refund.failed" => ("refund.failed", refund("failed")?),
        "dispute.funds_withdrawn" => ("charge.dispute.funds_withdrawn", dispute("needs_response")?),
        "dispute.funds_reinstated" => ("charge.dispute.funds_reinstated", dispute("won")?),
        other => (other, payment_intent("succeeded", args.amount)),
    };
    let mut data = json!({"object": object});
    if let Some(previous) = previous_attributes {
        data["previous_attributes"] = previous;
    }
    Ok(json!({
        "id": event_id, "object": "event", "api_version": "2024-06-20", "created": ts,
        "data": data, "livemode": false, "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null}, "type": event_type
    }))
}

/// A one-item Adyen notification batch (unsigned; [`adyen::sign_batch`] signs it).
///
/// [`adyen::sign_batch`]: fencehook::providers::adyen::sign_batch
pub(crate) fn adyen_batch(args: &SendArgs, ts: i64) -> Result<Value, String> {
    let (event_code, success) = match args.event_type.as_str() {
        "payment.succeeded" => ("AUTHORISATION", "true"),
        "payment.failed" => ("AUTHORISATION", "false"),
        "refund.succeeded" => ("REFUND", "true"),
        // `true`: the failure happened.
        "refund.failed" => ("REFUND_FAILED", "true"),
        "dispute.funds_withdrawn" => ("CHARGEBACK", "true"),
        "dispute.funds_reinstated" => ("CHARGEBACK_REVERSED", "true"),
        other => (other, "true"),
    };
    let event_date = OffsetDateTime::from_unix_timestamp(ts)
        .map_err(|e| e.to_string())?
        .format(&Rfc3339)
        .map_err(|e| e.to_string())?;
    let mut item = json!({
        "additionalData": {},
        "amount": {"currency": args.currency, "value": args.amount},
        "eventCode": event_code,
        "eventDate": event_date,
        "merchantAccountCode": "FencehookDemoECOM",
        "merchantReference": format!("order-{}", args.transaction_id),
        "paymentMethod": "visa",
        "pspReference": args.transaction_id,
        "reason": "",
        "success": success
    });
    if event_code == "AUTHORISATION" {
        item["operations"] = json!(["CANCEL", "CAPTURE", "REFUND"]);
    }
    // A modification or dispute names the payment it is about.
    let original = if names_a_payment(&args.event_type) {
        Some(parent(args)?)
    } else {
        args.payment_transaction_id.as_deref()
    };
    if let Some(original) = original {
        item["originalReference"] = json!(original);
    }
    Ok(json!({
        "live": "false",
        "notificationItems": [{"NotificationRequestItem": item}]
    }))
}
