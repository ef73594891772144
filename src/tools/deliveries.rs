//! Deliveries in the shape each PSP sends them (field names, nesting, the
//! native event names), built from a few flags: for `send` and `load`.
//!
//! Each canonical kind is sent as the native event the provider maps back to
//! it (see docs/providers.md): refunds and disputes name their payment the
//! way the PSP does (a Stripe Refund's `payment_intent`, an Adyen item's
//! `originalReference`, a WeChat refund's `transaction_id`, an Alipay
//! refund's `trade_no`, a PayPal refund's `up` link).
//!
//! The RSA schemes have no notification for some kinds (WeChat Pay sends no
//! payment failure, PayPal no refund failure, ...): asking for one is an
//! error that names what the PSP does send.

use fencehook::providers::{minor_unit_exponent, SchemeKind};
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// What one delivery announces: `send`'s flags, or one transaction of `load`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The id of what the event is about: the payment's, the refund's or the
    /// dispute's own.
    pub transaction_id: String,
    /// Minor units (cents, fen).
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// A canonical kind (`payment.succeeded`, ...), sent as the scheme's
    /// native event; anything else is sent verbatim as the native type.
    pub event_type: String,
    /// Refunds and disputes: the payment they take money from.
    pub payment_transaction_id: Option<String>,
}

/// The currency a scheme's deliveries are in when none is asked for: CNY for
/// the Chinese PSPs (Alipay's notifications carry no other), EUR otherwise.
pub fn default_currency(scheme: SchemeKind) -> &'static str {
    match scheme {
        SchemeKind::WechatPay | SchemeKind::Alipay => "CNY",
        _ => "EUR",
    }
}

/// The canonical kinds that take money from a payment and must name it.
pub(crate) fn names_a_payment(event_type: &str) -> bool {
    event_type.starts_with("refund.") || event_type.starts_with("dispute.")
}

/// The `--payment-transaction-id` a refund or dispute needs to be built in a
/// PSP's shape.
fn parent(notice: &Notice) -> Result<&str, String> {
    notice.payment_transaction_id.as_deref().ok_or_else(|| {
        format!(
            "--event-type {} takes money from a payment: give it with --payment-transaction-id (a PaymentIntent or Charge id for stripe, the payment's pspReference for adyen, transaction_id for wechatpay, trade_no for alipay, the capture id for paypal)",
            notice.event_type
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
pub(crate) fn stripe_event(notice: &Notice, event_id: &str, ts: i64) -> Result<Value, String> {
    let tx = &notice.transaction_id;
    let currency = notice.currency.to_ascii_lowercase();
    let payment_intent = |status: &str, received: i64| {
        json!({
            "id": tx, "object": "payment_intent", "amount": notice.amount,
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
        let (pi, charge) = links(parent(notice)?);
        let mut r = json!({
            "id": tx, "object": "refund", "amount": notice.amount, "charge": charge,
            "created": ts, "currency": currency, "metadata": {}, "payment_intent": pi,
            "reason": "requested_by_customer", "status": status
        });
        if status == "failed" {
            r["failure_reason"] = json!("expired_or_canceled_card");
        }
        Ok(r)
    };
    let dispute = |status: &str| -> Result<Value, String> {
        let (pi, charge) = links(parent(notice)?);
        Ok(json!({
            "id": tx, "object": "dispute", "amount": notice.amount, "balance_transactions": [],
            "charge": charge, "created": ts, "currency": currency, "is_charge_refundable": false,
            "livemode": false, "metadata": {}, "payment_intent": pi, "reason": "fraudulent",
            "status": status
        }))
    };
    let mut previous_attributes = None;
    let (event_type, object) = match notice.event_type.as_str() {
        "payment.succeeded" => (
            "payment_intent.succeeded",
            payment_intent("succeeded", notice.amount),
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
        other => (other, payment_intent("succeeded", notice.amount)),
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
pub(crate) fn adyen_batch(notice: &Notice, ts: i64) -> Result<Value, String> {
    let (event_code, success) = match notice.event_type.as_str() {
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
        "amount": {"currency": notice.currency.as_str(), "value": notice.amount},
        "eventCode": event_code,
        "eventDate": event_date,
        "merchantAccountCode": "FencehookDemoECOM",
        "merchantReference": format!("order-{}", notice.transaction_id),
        "paymentMethod": "visa",
        "pspReference": notice.transaction_id,
        "reason": "",
        "success": success
    });
    if event_code == "AUTHORISATION" {
        item["operations"] = json!(["CANCEL", "CAPTURE", "REFUND"]);
    }
    // A modification or dispute names the payment it is about.
    let original = if names_a_payment(&notice.event_type) {
        Some(parent(notice)?)
    } else {
        notice.payment_transaction_id.as_deref()
    };
    if let Some(original) = original {
        item["originalReference"] = json!(original);
    }
    Ok(json!({
        "live": "false",
        "notificationItems": [{"NotificationRequestItem": item}]
    }))
}

/// `--event-type` names a kind the scheme has no notification for.
fn not_sent(scheme: &str, notice: &Notice, sends: &str) -> String {
    format!(
        "{scheme} sends no notification fencehook books as {}; it sends {sends}",
        notice.event_type
    )
}

fn rfc3339(ts: i64) -> Result<String, String> {
    OffsetDateTime::from_unix_timestamp(ts)
        .map_err(|e| e.to_string())?
        .format(&Rfc3339)
        .map_err(|e| e.to_string())
}

/// A WeChat Pay notification: the `event_type` and the plaintext `resource`
/// (JSON) to encrypt, with its `original_type` (also the AAD).
pub(crate) fn wechatpay_resource(
    notice: &Notice,
    ts: i64,
) -> Result<(String, Value, &'static str), String> {
    const SENDS: &str = "payment.succeeded, refund.succeeded, refund.failed";
    let when = OffsetDateTime::from_unix_timestamp(ts)
        .map_err(|e| e.to_string())?
        .to_offset(time::UtcOffset::from_hms(8, 0, 0).map_err(|e| e.to_string())?)
        .format(&Rfc3339)
        .map_err(|e| e.to_string())?;
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
        let payment = parent(notice)?;
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
            return Err(not_sent("wechatpay", notice, SENDS))
        }
        other if other.starts_with("REFUND.") => (
            other.into(),
            refund(other.trim_start_matches("REFUND."))?,
            "refund",
        ),
        other => (other.into(), transaction(), "transaction"),
    })
}

/// An Alipay notification's parameters (unsigned; alipay::sign_form signs
/// them). `amount` is in fen; the refund is a full refund of a trade of
/// that amount (Alipay's `refund_fee` is the trade's refunded total).
pub(crate) fn alipay_params(
    notice: &Notice,
    app_id: &str,
    ts: i64,
) -> Result<Vec<(String, String)>, String> {
    const SENDS: &str = "payment.succeeded, payment.failed, refund.succeeded";
    if notice.currency != "CNY" {
        return Err("alipay notifications are in CNY: --currency CNY".into());
    }
    let beijing = OffsetDateTime::from_unix_timestamp(ts)
        .map_err(|e| e.to_string())?
        .to_offset(time::UtcOffset::from_hms(8, 0, 0).map_err(|e| e.to_string())?);
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
        "refund.succeeded" => (parent(notice)?.to_owned(), "TRADE_CLOSED", true),
        other if other.contains('.') => return Err(not_sent("alipay", notice, SENDS)),
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

/// A PayPal event (v2 payments shapes, as the webhooks simulator sends them).
pub(crate) fn paypal_event(notice: &Notice, event_id: &str, ts: i64) -> Result<Value, String> {
    const SENDS: &str =
        "payment.succeeded, payment.failed, refund.succeeded, dispute.funds_withdrawn";
    let currency = notice.currency.as_str();
    let exponent = minor_unit_exponent(currency)
        .ok_or_else(|| format!("no minor unit known for currency {currency}"))?;
    let scale = 10i64.pow(exponent);
    let value = if exponent == 0 {
        notice.amount.to_string()
    } else {
        format!(
            "{}.{:0width$}",
            notice.amount / scale,
            notice.amount % scale,
            width = exponent as usize
        )
    };
    let when = rfc3339(ts)?;
    let api = "https://api.paypal.com/v2";
    let tx = &notice.transaction_id;
    let amount = json!({"currency_code": currency, "value": value});
    let capture = |status: &str| {
        json!({
            "id": tx, "amount": amount, "final_capture": true, "status": status,
            "create_time": when, "update_time": when,
            "supplementary_data": {"related_ids": {"order_id": format!("ORDER-{tx}")}},
            "links": [
                {"href": format!("{api}/payments/captures/{tx}"), "rel": "self", "method": "GET"},
                {"href": format!("{api}/payments/captures/{tx}/refund"), "rel": "refund", "method": "POST"},
                {"href": format!("{api}/checkout/orders/ORDER-{tx}"), "rel": "up", "method": "GET"}
            ]
        })
    };
    let refund = |note: Option<&str>| -> Result<Value, String> {
        let capture_id = parent(notice)?;
        let mut r = json!({
            "id": tx, "amount": amount, "status": "COMPLETED",
            "create_time": when, "update_time": when,
            "links": [
                {"href": format!("{api}/payments/refunds/{tx}"), "rel": "self", "method": "GET"},
                {"href": format!("{api}/payments/captures/{capture_id}"), "rel": "up", "method": "GET"}
            ]
        });
        if let Some(note) = note {
            r["note_to_payer"] = json!(note);
        }
        Ok(r)
    };
    let (event_type, resource_type, resource) = match notice.event_type.as_str() {
        "payment.succeeded" => ("PAYMENT.CAPTURE.COMPLETED", "capture", capture("COMPLETED")),
        "payment.failed" => ("PAYMENT.CAPTURE.DENIED", "capture", capture("DECLINED")),
        "refund.succeeded" => ("PAYMENT.CAPTURE.REFUNDED", "refund", refund(None)?),
        "dispute.funds_withdrawn" => (
            "PAYMENT.CAPTURE.REVERSED",
            "refund",
            refund(Some("Payment reversed"))?,
        ),
        other if other.contains('.') && other.chars().any(|c| c.is_ascii_lowercase()) => {
            return Err(not_sent("paypal", notice, SENDS))
        }
        other => (other, "capture", capture("PENDING")),
    };
    Ok(json!({
        "id": event_id, "event_version": "1.0", "create_time": when,
        "resource_type": resource_type, "resource_version": "2.0",
        "event_type": event_type, "summary": format!("{event_type} (fencehook send)"),
        "resource": resource,
        "links": [
            {"href": format!("https://api.paypal.com/v1/notifications/webhooks-events/{event_id}"),
             "rel": "self", "method": "GET"}
        ]
    }))
}
