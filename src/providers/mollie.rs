//! Mollie (`mollie` scheme): a notification that is not the record. Mollie
//! posts `id=tr_…` (a form, no signature, nothing else) to a payment's
//! webhook URL whenever the payment or one of its refunds changes; what
//! changed is Mollie's API's to say. So the service asks it, and books what
//! it answers:
//!
//! 1. `GET {api_url}/v2/payments/{id}` (`Authorization: Bearer {api_key}`);
//! 2. for a `paid` payment (the only kind with refunds),
//!    `GET {api_url}/v2/payments/{id}/refunds` (`_embedded.refunds`, every
//!    page).
//!
//! # Mapping (what is booked)
//!
//! | fetched | booked as | transaction_id | parent | amount |
//! | --- | --- | --- | --- | --- |
//! | payment `paid` | payment.succeeded (credit) | the payment's `id` (`tr_…`) | – | `amount` |
//! | payment `failed`, `canceled`, `expired` | payment.failed | the payment's `id` | – | `amount` |
//! | payment `open`, `pending`, `authorized` | ignored: no money moved yet | | | |
//! | refund `refunded` | refund.succeeded (debit) | the refund's `id` (`re_…`) | the payment's `id` | the refund's `amount` |
//! | refund `failed`, `canceled` | refund.failed | the refund's `id` | the payment's `id` | the refund's `amount` |
//! | refund `queued`, `pending`, `processing` | nothing yet (a later notification settles it) | | | |
//!
//! `amount` is `{"value": "10.00", "currency": "EUR"}`: the decimal string
//! converted exactly with the currency's exponent (never a float); a
//! currency without a known exponent is refused (400). A payment unknown to
//! Mollie (404: a made-up id, or a key of another account or mode) is 200
//! `ignored`, nothing written, so Mollie stops and a stranger learns
//! nothing. A fetch that fails or times out is 503: Mollie retries. An `id`
//! of another object (`ord_…`, `sub_…`: a webhook URL shared with orders
//! or subscriptions) is 200 `ignored` without a fetch; anything that is no
//! Mollie id is 400, nothing fetched.
//!
//! # What makes a repeated notification a duplicate
//!
//! Mollie gives a notification no id of its own, and a retry is
//! byte-for-byte the first one. What it names is the *state* of objects, so
//! each fetched object is an item keyed by what it is: the payment by its
//! `tr_` id, each refund by its `re_` id, each with the canonical event of
//! the status it has reached (the inbox keeps one event per object and
//! event type). A notification repeated while nothing changed fetches the
//! same states and is a `duplicate`; one sent because a refund was made
//! finds the payment a duplicate and books the refund alone; a refund that
//! failed after it was booked is that refund's `refund.failed` (a
//! reversal). No PSP event id is kept (the delivery history shows none):
//! the form's `id` is the payment, already the transaction id.
//!
//! # Bounded: what a stranger's notifications can cost
//!
//! Anyone can post `id=tr_…`. Each notification takes one fetch slot of its
//! provider for all its fetches; at most `max_fetches_in_flight` (default
//! [`DEFAULT_MAX_FETCHES_IN_FLIGHT`]) run at once, so Mollie's API never
//! sees more requests at once from this provider, whatever a flood of
//! made-up ids asks for. A notification that finds them all taken waits its
//! turn for at most [`FETCH_TIMEOUT`], then is answered 503. Each request is
//! answered within [`FETCH_TIMEOUT`] and [`MAX_ANSWER_BYTES`]; no redirect is
//! followed. Every fetch is counted (`fencehook_fetches_total`).
//!
//! Not booked: chargebacks (`amountChargedBack`), captures of authorised
//! payments before they are `paid`, orders.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde::Deserialize;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::alipay::parse_form;
use super::fetch::{self, Fetcher};
use super::fields::{
    self, check_currency, check_transaction_id, decimal_minor, invalid, opt, req_object, req_str,
    Object,
};
use super::psp::{self, Credentials, Delivery, Notice, PspError};
use super::scheme::{Item, Reject, Scheme};
use super::setup::{SettingError, Setup};
use crate::domain::amount::minor_unit_exponent;
use crate::domain::{CanonicalEvent, EventKind};

/// Mollie's API, unless `api_url` says otherwise (a test server).
pub const DEFAULT_API_URL: &str = "https://api.mollie.com";
/// Notifications fetching from Mollie's API at once, per provider, unless
/// `max_fetches_in_flight` says otherwise.
pub const DEFAULT_MAX_FETCHES_IN_FLIGHT: u32 = 8;
/// The most `max_fetches_in_flight` may say: far past what a webhook
/// receiver should ask of Mollie at once.
pub const MAX_FETCHES_IN_FLIGHT: u32 = 256;
/// The longest one request to Mollie may take, connection included; also
/// the longest a notification waits for a fetch slot.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read: a page of 250 refunds is well under it.
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// Refunds asked for per page (Mollie's most).
const REFUNDS_PER_PAGE: u32 = 250;
/// Pages of refunds followed for one payment; past them the notification
/// is refused rather than booked in part.
const MAX_REFUND_PAGES: usize = 8;
/// What Mollie posts.
const FORM: &str = "application/x-www-form-urlencoded";

/// `[providers.<name>]` of a `mollie` provider.
#[derive(Deserialize)]
pub struct Settings {
    /// The API key (`live_…` or `test_…`) the payments are fetched with.
    api_key: Option<String>,
    /// Where Mollie's API is (default [`DEFAULT_API_URL`]).
    api_url: Option<String>,
    /// Notifications fetching at once (default [`DEFAULT_MAX_FETCHES_IN_FLIGHT`]).
    max_fetches_in_flight: Option<u32>,
}

/// A configured `mollie` provider: its access to Mollie's API, shared by
/// every copy of the provider (one bound per provider).
#[derive(Clone)]
pub struct Mollie {
    api: Arc<Api>,
}

struct Api {
    /// `api_url` without a trailing `/`.
    base: String,
    /// `Bearer {api_key}`; never logged.
    bearer: String,
    fetcher: Fetcher,
}

impl Mollie {
    /// A provider fetching from `api_url` with `api_key`, at most
    /// `in_flight` notifications at once. The error names the setting.
    pub fn new(api_key: &str, api_url: &str, in_flight: u32) -> Result<Mollie, SettingError> {
        check_api_key(api_key).map_err(|e| ("api_key", e))?;
        let base = check_api_url(api_url).map_err(|e| ("api_url", e))?;
        if !(1..=MAX_FETCHES_IN_FLIGHT).contains(&in_flight) {
            return Err((
                "max_fetches_in_flight",
                format!("must be 1 to {MAX_FETCHES_IN_FLIGHT} (got {in_flight})"),
            ));
        }
        let fetcher = Fetcher::new(in_flight as usize, FETCH_TIMEOUT, MAX_ANSWER_BYTES)
            .map_err(|e| ("api_url", e))?;
        Ok(Mollie {
            api: Arc::new(Api {
                base,
                bearer: format!("Bearer {api_key}"),
                fetcher,
            }),
        })
    }
}

/// `live_` or `test_` and the key's letters and digits, as Mollie issues
/// them (30 after the prefix; at least that many are asked for).
fn check_api_key(key: &str) -> Result<(), String> {
    let rest = key
        .strip_prefix("live_")
        .or_else(|| key.strip_prefix("test_"));
    match rest {
        Some(rest) if rest.len() >= 30 && rest.bytes().all(|b| b.is_ascii_alphanumeric()) => Ok(()),
        _ => Err(
            "must be a Mollie API key: live_ or test_ and the 30 letters and digits after it (Dashboard → Developers → API keys)"
                .to_owned(),
        ),
    }
}

/// `api_url` without its trailing `/`: `https://` with a plain host (an
/// optional path), or `http://` to a loopback host alone (a test server).
fn check_api_url(url: &str) -> Result<String, String> {
    fetch::check_api_url(url).map_err(|e| format!("{url}: {e}"))?;
    if url.contains(['?', '#']) {
        return Err(format!("{url}: no query or fragment"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

impl Scheme for Mollie {
    const NAME: &'static str = "mollie";
    type Settings = Settings;
    const SIGNATURE_HEADER: Option<&'static str> = None;
    const SENDS: &'static [EventKind] = &[
        EventKind::PaymentSucceeded,
        EventKind::PaymentFailed,
        EventKind::RefundSucceeded,
        EventKind::RefundFailed,
    ];
    const PAYMENT_ID: Option<&'static str> = Some("the payment's tr_ id");

    fn build(settings: Settings, setup: &mut Setup) -> Result<Mollie, String> {
        let api_key = setup.required(
            settings.api_key,
            "api_key",
            "the Mollie API key payments are fetched with, live_… or test_…",
        )?;
        let api_url = settings
            .api_url
            .unwrap_or_else(|| DEFAULT_API_URL.to_owned());
        let in_flight = settings
            .max_fetches_in_flight
            .unwrap_or(DEFAULT_MAX_FETCHES_IN_FLIGHT);
        let mollie = Mollie::new(&api_key, &api_url, in_flight).map_err(|e| setup.setting(e))?;
        setup.api_key("api_key", &api_key);
        if api_url.starts_with("http://") {
            setup.warn("api_url is http://: a local test server, not Mollie's API");
        }
        Ok(mollie)
    }

    fn accepts_content_type(essence: &str) -> bool {
        essence == FORM
    }

    async fn accept(
        &self,
        provider: &str,
        _headers: &http::HeaderMap,
        body: &[u8],
        _now: i64,
    ) -> Result<Vec<Item>, Reject> {
        match notified(body)? {
            // Boxed: the fetch's future is a few KB, and every provider's
            // delivery future is as large as the largest scheme's accept.
            Notified::Payment(id) => Box::pin(self.api.payment(provider, &id)).await,
            Notified::Other(prefix) => Ok(vec![Item::Ignored {
                event_type: format!("{prefix} notification"),
            }]),
        }
    }

    fn fetcher(&self) -> Option<&Fetcher> {
        Some(&self.api.fetcher)
    }

    fn check(_psp: &dyn Credentials) -> Result<(), PspError> {
        // Nothing signs a Mollie notification.
        Ok(())
    }

    fn deliver(
        _psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        _delivery_id: &str,
        _ts: i64,
    ) -> Result<Delivery, String> {
        let body = match body {
            Some(b) => b.to_owned(),
            None => notification_of(notice)?,
        };
        Ok(Delivery {
            body,
            content_type: FORM,
            headers: Vec::new(),
        })
    }
}

/// What a notification's form names.
#[derive(Debug, PartialEq, Eq)]
enum Notified {
    /// A payment (`tr_…`): fetched.
    Payment(String),
    /// Another of Mollie's objects, by its id's prefix (`ord`, `sub`): not
    /// booked here, not fetched.
    Other(String),
}

/// The longest id read (Mollie's are about 10 to 20 characters).
const MAX_ID_CHARS: usize = 64;

/// The form's `id`: a Mollie id is a lower-case prefix, `_`, and letters
/// and digits. Anything else is refused before any fetch (it would become a
/// path on Mollie's API).
fn notified(body: &[u8]) -> Result<Notified, Reject> {
    let params = parse_form(body)?;
    let id = params
        .iter()
        .find(|(k, _)| k == "id")
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| invalid("id is required (Mollie posts id=tr_…)"))?;
    let shape = id.split_once('_').filter(|(prefix, rest)| {
        !prefix.is_empty()
            && prefix.bytes().all(|b| b.is_ascii_lowercase())
            && !rest.is_empty()
            && rest.bytes().all(|b| b.is_ascii_alphanumeric())
            && id.len() <= MAX_ID_CHARS
    });
    match shape {
        Some(("tr", _)) => Ok(Notified::Payment(id.to_owned())),
        Some((prefix, _)) => Ok(Notified::Other(prefix.to_owned())),
        None => Err(invalid(
            "id must be a Mollie id: a prefix such as tr, _, then letters and digits",
        )),
    }
}

/// The form Mollie posts about `notice`'s payment: `id=tr_…` (for a
/// refund, its payment's id). What is booked is what Mollie's API says of
/// it, not the notice's amount or type.
fn notification_of(notice: &Notice) -> Result<String, String> {
    let id = match EventKind::from_generic(&notice.event_type) {
        Some(kind) if !Mollie::SENDS.contains(&kind) => {
            return Err(psp::not_sent(Mollie::NAME, Mollie::SENDS, notice))
        }
        _ if psp::names_a_payment(&notice.event_type) => psp::parent(notice)?,
        _ => notice.transaction_id.as_str(),
    };
    Ok(form_urlencoded::Serializer::new(String::new())
        .append_pair("id", id)
        .finish())
}

/// What one request to Mollie found.
enum Fetched {
    Found(Bytes),
    NotFound,
}

impl Api {
    /// The payment `id` and, when it is paid, its refunds, fetched in one
    /// slot and mapped.
    async fn payment(&self, provider: &str, id: &str) -> Result<Vec<Item>, Reject> {
        let Some(_slot) = self.fetcher.slot().await else {
            return Err(unavailable(format!(
                "every fetch slot (max_fetches_in_flight) stayed taken for {:?}",
                self.fetcher.timeout()
            )));
        };
        let body = match self.get(&format!("{}/v2/payments/{id}", self.base)).await? {
            Fetched::Found(body) => body,
            Fetched::NotFound => {
                return Ok(vec![Item::Ignored {
                    event_type: "unknown payment".to_owned(),
                }])
            }
        };
        let payment = map_payment(provider, id, &body)?;
        let mut items = vec![payment.item];
        if payment.paid {
            items.extend(self.refunds(provider, id).await?);
        }
        Ok(items)
    }

    /// Every refund of the paid payment `id` that is settled, page by page.
    async fn refunds(&self, provider: &str, id: &str) -> Result<Vec<Item>, Reject> {
        let mut url = format!(
            "{}/v2/payments/{id}/refunds?limit={REFUNDS_PER_PAGE}",
            self.base
        );
        let mut items = Vec::new();
        for _ in 0..MAX_REFUND_PAGES {
            let body = match self.get(&url).await? {
                Fetched::Found(body) => body,
                Fetched::NotFound => {
                    return Err(unavailable(format!(
                        "the refunds of the paid payment {id} answered 404"
                    )))
                }
            };
            let page = map_refunds(provider, id, &body)?;
            items.extend(page.items);
            match page.next {
                None => return Ok(items),
                // Only under api_url: a link elsewhere is not followed.
                Some(next) if next.starts_with(&format!("{}/", self.base)) => url = next,
                Some(_) => {
                    return Err(invalid("_links.next of the refunds points outside api_url"))
                }
            }
        }
        Err(invalid(format!(
            "the payment {id} has more than {} refunds",
            MAX_REFUND_PAGES * REFUNDS_PER_PAGE as usize
        )))
    }

    /// `GET url` with the API key.
    async fn get(&self, url: &str) -> Result<Fetched, Reject> {
        let req = http::Request::get(url)
            .header(http::header::AUTHORIZATION, &self.bearer)
            .header(http::header::ACCEPT, "application/hal+json")
            .header(http::header::USER_AGENT, "fencehook")
            .body(Full::new(Bytes::new()))
            .map_err(|e| unavailable(e.to_string()))?;
        let (status, body) = self.fetcher.call(req).await.map_err(unavailable)?;
        match status {
            http::StatusCode::OK => Ok(Fetched::Found(body)),
            http::StatusCode::NOT_FOUND => Ok(Fetched::NotFound),
            http::StatusCode::UNAUTHORIZED | http::StatusCode::FORBIDDEN => Err(unavailable(
                format!("answered {status}: Mollie refuses the provider's api_key"),
            )),
            other => Err(unavailable(format!("answered {other}"))),
        }
    }
}

fn unavailable(why: String) -> Reject {
    Reject::Unavailable(format!("Mollie API: {why}"))
}

/// A fetched payment, mapped.
pub struct Payment {
    pub item: Item,
    /// `paid`: its refunds are fetched too.
    pub paid: bool,
}

/// Maps the payment `id` as Mollie's API answered it (see the module's
/// table), strictly: a missing or ill-typed field of a payment that books
/// is [`Reject::Invalid`].
pub fn map_payment(provider: &str, id: &str, body: &[u8]) -> Result<Payment, Reject> {
    let value = fields::parse_json(body)?;
    let payment = value
        .as_object()
        .ok_or_else(|| invalid("the payment must be a JSON object"))?;
    if req_str(payment, "id", "payment.id")? != id {
        return Err(invalid(format!(
            "Mollie answered another payment than {id}"
        )));
    }
    let status = req_str(payment, "status", "payment.status")?;
    let (kind, at) = match status {
        "paid" => (EventKind::PaymentSucceeded, "paidAt"),
        "failed" => (EventKind::PaymentFailed, "failedAt"),
        "canceled" => (EventKind::PaymentFailed, "canceledAt"),
        "expired" => (EventKind::PaymentFailed, "expiredAt"),
        // open, pending, authorized, or a status this mapping does not
        // know: no money moved yet.
        _ => {
            return Ok(Payment {
                item: Item::Ignored {
                    event_type: format!("payment {status}"),
                },
                paid: false,
            })
        }
    };
    let (amount_minor, currency) = amount(payment, "payment.amount")?;
    check_transaction_id(id)?;
    Ok(Payment {
        item: Item::Event(CanonicalEvent {
            provider: provider.to_owned(),
            transaction_id: id.to_owned(),
            event_type: kind,
            amount_minor,
            currency,
            parent_transaction_id: None,
            occurred_at: timestamp(payment, at, "payment")?.or(timestamp(
                payment,
                "createdAt",
                "payment",
            )?),
            merchant_reference: None,
            metadata: None,
        }),
        paid: kind == EventKind::PaymentSucceeded,
    })
}

/// One page of a payment's refunds, mapped.
pub struct RefundsPage {
    /// The settled refunds (those still on their way book nothing yet).
    pub items: Vec<Item>,
    /// `_links.next.href`, when there is a next page.
    pub next: Option<String>,
}

/// Maps a page of `GET /v2/payments/{payment_id}/refunds` (see the module's
/// table).
pub fn map_refunds(provider: &str, payment_id: &str, body: &[u8]) -> Result<RefundsPage, Reject> {
    let value = fields::parse_json(body)?;
    let list = value
        .as_object()
        .ok_or_else(|| invalid("the refunds must be a JSON object (a list)"))?;
    let refunds = match opt(list, "_embedded") {
        None => &[][..],
        Some(_) => match opt(req_object(list, "_embedded", "_embedded")?, "refunds") {
            None => &[][..],
            Some(Value::Array(refunds)) => refunds.as_slice(),
            Some(_) => return Err(invalid("_embedded.refunds must be a list")),
        },
    };
    let mut items = Vec::with_capacity(refunds.len());
    for (i, refund) in refunds.iter().enumerate() {
        let path = format!("_embedded.refunds[{i}]");
        let refund = refund
            .as_object()
            .ok_or_else(|| invalid(format!("{path} must be an object")))?;
        if let Some(item) = map_refund(provider, payment_id, refund, &path)? {
            items.push(item);
        }
    }
    let next = match opt(list, "_links").and_then(|l| l.get("next")) {
        None | Some(Value::Null) => None,
        Some(link) => Some(
            link.get("href")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("_links.next.href must be a string"))?
                .to_owned(),
        ),
    };
    Ok(RefundsPage { items, next })
}

/// One refund of the list: `None` while it is on its way.
fn map_refund(
    provider: &str,
    payment_id: &str,
    refund: &Object,
    path: &str,
) -> Result<Option<Item>, Reject> {
    let status = req_str(refund, "status", &format!("{path}.status"))?;
    let kind = match status {
        "refunded" => EventKind::RefundSucceeded,
        "failed" | "canceled" => EventKind::RefundFailed,
        // queued, pending, processing: a later notification settles it.
        _ => return Ok(None),
    };
    if let Some(named) = fields::opt_str(refund, "paymentId", &format!("{path}.paymentId"))? {
        if named != payment_id {
            return Err(invalid(format!(
                "{path}.paymentId is {named}, not the payment {payment_id}"
            )));
        }
    }
    let id = req_str(refund, "id", &format!("{path}.id"))?;
    check_transaction_id(id)?;
    let (amount_minor, currency) = amount(refund, &format!("{path}.amount"))?;
    Ok(Some(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id: id.to_owned(),
        event_type: kind,
        amount_minor,
        currency,
        parent_transaction_id: Some(payment_id.to_owned()),
        occurred_at: timestamp(refund, "createdAt", path)?,
        merchant_reference: None,
        metadata: None,
    })))
}

/// `{"value": "10.00", "currency": "EUR"}` at `path`, in minor units.
fn amount(obj: &Object, path: &str) -> Result<(i64, String), Reject> {
    let key = path.rsplit('.').next().unwrap_or(path);
    let amount = req_object(obj, key, path)?;
    let currency = req_str(amount, "currency", &format!("{path}.currency"))?;
    check_currency(currency)?;
    let exponent = minor_unit_exponent(currency).ok_or_else(|| {
        invalid(format!(
            "{path}.currency {currency} has no known number of decimals: it cannot be converted exactly"
        ))
    })?;
    let value = req_str(amount, "value", &format!("{path}.value"))?;
    let minor = decimal_minor(value, exponent, &format!("{path}.value"))?;
    Ok((minor, currency.to_owned()))
}

/// An RFC 3339 time at `key`, when there is one.
fn timestamp(obj: &Object, key: &str, path: &str) -> Result<Option<OffsetDateTime>, Reject> {
    let path = format!("{path}.{key}");
    match fields::opt_str(obj, key, &path)? {
        None => Ok(None),
        Some(text) => OffsetDateTime::parse(text, &Rfc3339)
            .map(Some)
            .map_err(|_| invalid(format!("{path} must be an RFC 3339 date-time"))),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::domain::amount::major_amount;
    use crate::providers::testing::at;
    use crate::providers::Provider;

    const KEY: &str = "test_fencehookUnitTestKey0123456789abc";

    /// Mollie's payment `id` in `status`, as its API answers it.
    fn payment_json(id: &str, status: &str, minor: i64, currency: &str, ts: i64) -> Value {
        let when = psp::rfc3339(ts, 0).unwrap();
        let mut p = json!({
            "resource": "payment", "id": id, "mode": "test", "status": status,
            "createdAt": when, "isCancelable": false,
            "amount": {"value": major_amount(minor, currency).unwrap(), "currency": currency},
            "description": "Order #12345", "method": "ideal", "metadata": null,
            "profileId": "pfl_QkEhN94Ba", "sequenceType": "oneoff",
            "redirectUrl": "https://webshop.example.org/order/12345/",
            "webhookUrl": "https://webshop.example.org/payments/webhook/",
            "_links": {"self": {"href": format!("https://api.mollie.com/v2/payments/{id}"), "type": "application/hal+json"}}
        });
        let at = match status {
            "paid" => Some("paidAt"),
            "failed" => Some("failedAt"),
            "canceled" => Some("canceledAt"),
            "expired" => Some("expiredAt"),
            _ => None,
        };
        if let Some(at) = at {
            p[at] = when.into();
        }
        p
    }

    /// One refund of `payment`, as the refunds list embeds it.
    fn refund_json(
        id: &str,
        payment: &str,
        status: &str,
        minor: i64,
        currency: &str,
        ts: i64,
    ) -> Value {
        json!({
            "resource": "refund", "id": id, "status": status, "paymentId": payment,
            "createdAt": psp::rfc3339(ts, 0).unwrap(), "description": "Order #12345",
            "amount": {"value": major_amount(minor, currency).unwrap(), "currency": currency},
            "_links": {"self": {"href": format!("https://api.mollie.com/v2/payments/{payment}/refunds/{id}")}}
        })
    }

    fn list(refunds: Vec<Value>, next: Option<&str>) -> Vec<u8> {
        let next = next.map(|href| json!({"href": href, "type": "application/hal+json"}));
        serde_json::to_vec(&json!({
            "count": refunds.len(),
            "_embedded": {"refunds": refunds},
            "_links": {"self": {"href": "https://api.mollie.com/v2/payments/tr_x/refunds"}, "previous": null, "next": next}
        }))
        .unwrap()
    }

    fn event(item: Item) -> CanonicalEvent {
        match item {
            Item::Event(e) => e,
            other => panic!("{other:?}"),
        }
    }

    fn payment(status: &str, value: Value) -> Result<Payment, Reject> {
        let mut p = payment_json("tr_WDqYK6vllg", status, 1000, "EUR", 1_700_000_000);
        p["amount"] = value;
        map_payment("m", "tr_WDqYK6vllg", &serde_json::to_vec(&p).unwrap())
    }

    #[test]
    fn each_payment_status_books_what_it_means() {
        for (status, kind) in [
            ("paid", Some(EventKind::PaymentSucceeded)),
            ("failed", Some(EventKind::PaymentFailed)),
            ("canceled", Some(EventKind::PaymentFailed)),
            ("expired", Some(EventKind::PaymentFailed)),
            ("open", None),
            ("pending", None),
            ("authorized", None),
            ("something-new", None),
        ] {
            let p = payment(status, json!({"value": "10.00", "currency": "EUR"})).unwrap();
            assert_eq!(p.paid, status == "paid", "{status}");
            match kind {
                Some(kind) => {
                    let e = event(p.item);
                    assert_eq!(
                        (
                            e.event_type,
                            e.amount_minor,
                            e.currency.as_str(),
                            e.transaction_id.as_str()
                        ),
                        (kind, 1000, "EUR", "tr_WDqYK6vllg"),
                        "{status}"
                    );
                    assert_eq!(e.occurred_at, at(1_700_000_000));
                }
                None => assert!(matches!(p.item, Item::Ignored { .. }), "{status}"),
            }
        }
    }

    #[test]
    fn amounts_are_converted_exactly_with_the_currencys_exponent() {
        let minor = |value: &str, currency: &str| {
            payment("paid", json!({"value": value, "currency": currency}))
                .map(|p| event(p.item).amount_minor)
        };
        assert_eq!(minor("10.00", "EUR"), Ok(1000));
        assert_eq!(minor("0.01", "EUR"), Ok(1));
        assert_eq!(minor("1000", "JPY"), Ok(1000));
        assert_eq!(minor("1.500", "KWD"), Ok(1500));
        assert_eq!(minor("92233720368547758.07", "EUR"), Ok(i64::MAX));
        for (value, currency) in [
            ("10.001", "EUR"),
            ("10.5", "JPY"),
            ("1e3", "EUR"),
            ("-1.00", "EUR"),
            ("0.00", "EUR"),
            ("10,00", "EUR"),
            ("92233720368547758.08", "EUR"),
            ("10.00", "eur"),
            ("10.00", "XXX"),
        ] {
            assert!(
                matches!(minor(value, currency), Err(Reject::Invalid(_))),
                "{value} {currency}"
            );
        }
        for bad in [
            json!({"value": 10, "currency": "EUR"}),
            json!({"currency": "EUR"}),
            json!("10.00"),
        ] {
            assert!(
                matches!(payment("paid", bad.clone()), Err(Reject::Invalid(_))),
                "{bad}"
            );
        }
        // Another payment than asked for, or no JSON, is refused.
        let other = payment_json("tr_other", "paid", 1000, "EUR", 1);
        assert!(map_payment("m", "tr_asked", &serde_json::to_vec(&other).unwrap()).is_err());
        assert!(map_payment("m", "tr_asked", b"<html>").is_err());
    }

    #[test]
    fn settled_refunds_book_and_those_on_their_way_wait() {
        let pay = "tr_WDqYK6vllg";
        let refunds: Vec<Value> = [
            ("re_1", "refunded"),
            ("re_2", "failed"),
            ("re_3", "canceled"),
            ("re_4", "queued"),
            ("re_5", "pending"),
            ("re_6", "processing"),
        ]
        .iter()
        .map(|(id, status)| refund_json(id, pay, status, 250, "EUR", 1_700_000_100))
        .collect();
        let page = map_refunds("m", pay, &list(refunds, None)).unwrap();
        assert_eq!(page.next, None);
        let got: Vec<(String, EventKind, Option<String>, i64)> = page
            .items
            .into_iter()
            .map(event)
            .map(|e| {
                (
                    e.transaction_id,
                    e.event_type,
                    e.parent_transaction_id,
                    e.amount_minor,
                )
            })
            .collect();
        let p = Some(pay.to_owned());
        assert_eq!(
            got,
            vec![
                ("re_1".into(), EventKind::RefundSucceeded, p.clone(), 250),
                ("re_2".into(), EventKind::RefundFailed, p.clone(), 250),
                ("re_3".into(), EventKind::RefundFailed, p, 250),
            ]
        );
        let next = "https://api.mollie.com/v2/payments/tr_x/refunds?from=re_9&limit=250";
        assert_eq!(
            map_refunds("m", pay, &list(vec![], Some(next)))
                .unwrap()
                .next
                .as_deref(),
            Some(next)
        );
        assert!(map_refunds("m", pay, br#"{"count":0}"#)
            .unwrap()
            .items
            .is_empty());
        // A refund of another payment is refused.
        let stray = refund_json("re_1", "tr_other", "refunded", 250, "EUR", 1);
        assert!(matches!(
            map_refunds("m", pay, &list(vec![stray], None)),
            Err(Reject::Invalid(_))
        ));
    }

    #[test]
    fn only_a_mollie_id_is_read_from_the_form_and_only_a_payments_is_fetched() {
        assert_eq!(
            notified(b"id=tr_WDqYK6vllg"),
            Ok(Notified::Payment("tr_WDqYK6vllg".into()))
        );
        assert_eq!(
            notified(b"id=ord_kEn1PlbGa"),
            Ok(Notified::Other("ord".into()))
        );
        assert_eq!(
            notified(b"id=sub_8JfGzs6v3K&testByMerchant=1"),
            Ok(Notified::Other("sub".into()))
        );
        for bad in [
            &b""[..],
            b"id=",
            b"id=tr_",
            b"id=tr_../../v2/refunds",
            b"id=tr_abc%2Fdef",
            b"id=tr_abc?x=1",
            b"id=TR_abc",
            b"id=tr_a&id=tr_b",
            b"payment=tr_abc",
            b"{\"id\":\"tr_abc\"}",
        ] {
            assert!(
                matches!(notified(bad), Err(Reject::Invalid(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("id=tr_{}", "a".repeat(MAX_ID_CHARS));
        assert!(notified(long.as_bytes()).is_err());
    }

    fn table(rest: &str) -> Result<Vec<Provider>, crate::providers::SettingErrors> {
        Provider::from_toml_str(&format!("[providers.m]\nscheme = \"mollie\"\n{rest}"))
    }

    fn first_error(rest: &str) -> String {
        let err = table(rest).unwrap_err();
        assert_eq!(err.lines().len(), 1, "{err}");
        err.lines()[0].clone()
    }

    #[test]
    fn a_mollie_provider_needs_a_key_of_mollies_shape_and_a_pinned_api_url() {
        assert!(first_error("").starts_with("provider `m`: api_key: required"));
        for key in [
            "sk_test_abc",
            "test_short",
            "live_0123456789012345678901234567-9",
            "access_0123456789012345678901234567890",
        ] {
            let e = first_error(&format!("api_key = \"{key}\""));
            assert!(
                e.starts_with("provider `m`: api_key: must be a Mollie API key"),
                "{e}"
            );
            assert!(!e.contains(key), "the key is never shown: {e}");
        }
        let key = format!("api_key = \"{KEY}\"");
        for (url, why) in [
            ("http://api.mollie.com", "http:// only"),
            ("http://10.0.0.1:8080", "http:// only"),
            ("ftp://api.mollie.com", "must start with https://"),
            ("https://user@api.mollie.com", "plain host"),
            ("https://api.mollie.com/?x=1", "no query"),
        ] {
            let e = first_error(&format!("{key}\napi_url = \"{url}\""));
            assert!(
                e.starts_with("provider `m`: api_url: ") && e.contains(why),
                "{url}: {e}"
            );
        }
        for n in [0, MAX_FETCHES_IN_FLIGHT + 1] {
            let e = first_error(&format!("{key}\nmax_fetches_in_flight = {n}"));
            assert!(
                e.starts_with("provider `m`: max_fetches_in_flight: "),
                "{e}"
            );
        }
        let e = first_error(&format!("{key}\nsecrets = [\"x\"]"));
        assert!(e.starts_with("provider `m`: secrets: not a setting of scheme mollie (it takes api_key, api_url, max_fetches_in_flight)"), "{e}");
        // Defaults, a local test server (warned about), a path under the host.
        let p = table(&key).unwrap().remove(0);
        assert!(p.warnings().is_empty() && p.exposures().is_empty());
        let local = table(&format!("{key}\napi_url = \"http://127.0.0.1:9/\""))
            .unwrap()
            .remove(0);
        assert!(
            local.warnings()[0].contains("http://"),
            "{:?}",
            local.warnings()
        );
        assert_eq!(
            check_api_url("https://proxy.example.com/mollie/").unwrap(),
            "https://proxy.example.com/mollie"
        );
        assert_eq!(
            check_api_url("http://[::1]:8080").unwrap(),
            "http://[::1]:8080"
        );
        assert_eq!(
            check_api_url("http://localhost").unwrap(),
            "http://localhost"
        );
        assert!(format!("{p:?}").find("fencehookUnitTestKey").is_none());
    }

    #[test]
    fn mollies_documentation_keys_are_refused_as_published() {
        for key in [
            "test_dHar4XY7LxsDOtmnkVtjNVWXLSlXsM",
            "live_dHar4XY7LxsDOtmnkVtjNVWXLSlXsM",
        ] {
            let p = table(&format!("api_key = \"{key}\"")).unwrap().remove(0);
            assert!(
                p.exposures()
                    .first()
                    .is_some_and(|e| e.starts_with("provider `m`: api_key: ")
                        && e.contains("published")
                        && !e.contains(key)),
                "{key}: {:?}",
                p.exposures()
            );
        }
    }

    #[test]
    fn send_posts_the_form_mollie_posts_naming_the_payment() {
        let notice = |event_type: &str, parent: Option<&str>| Notice {
            transaction_id: "re_1".into(),
            amount: 1,
            currency: "EUR".into(),
            event_type: event_type.into(),
            payment_transaction_id: parent.map(str::to_owned),
        };
        let creds = crate::providers::testing::TestCredentials::new(&[], None);
        let d = Mollie::deliver(&creds, &notice("payment.succeeded", None), None, "", 0).unwrap();
        assert_eq!((d.body.as_str(), d.content_type), ("id=re_1", FORM));
        assert!(d.headers.is_empty());
        assert!(
            Mollie::accepts_content_type(d.content_type)
                && !Mollie::accepts_content_type("application/json")
        );
        let d =
            Mollie::deliver(&creds, &notice("refund.failed", Some("tr_9")), None, "", 0).unwrap();
        assert_eq!(d.body, "id=tr_9");
        assert!(Mollie::deliver(&creds, &notice("refund.succeeded", None), None, "", 0).is_err());
        let err = Mollie::deliver(
            &creds,
            &notice("dispute.funds_withdrawn", Some("tr_9")),
            None,
            "",
            0,
        )
        .unwrap_err();
        assert!(err.contains("sends no notification"), "{err}");
    }

    proptest! {
        #[test]
        fn mapping_never_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = notified(&body);
            let _ = map_payment("m", "tr_x", &body);
            let _ = map_refunds("m", "tr_x", &body);
        }

        #[test]
        fn arbitrary_json_payments_and_refunds_never_panic(
            v in crate::providers::testing::arbitrary_json(&[
                "id", "status", "amount", "value", "currency", "paidAt", "createdAt",
                "_embedded", "refunds", "paymentId", "_links", "next", "href"]),
        ) {
            let body = serde_json::to_vec(&v).unwrap();
            let _ = map_payment("m", "tr_x", &body);
            let _ = map_refunds("m", "tr_x", &body);
        }
    }
}

/// What Mollie's API answers of a canonical event (a payment in the status
/// it books as, or a payment's refund), mapped back: the same event.
#[cfg(test)]
mod round_trip {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::domain::amount::major_amount;
    use crate::providers::testing::{at, events, round_trip_config};

    /// Ids as Mollie makes them: a prefix and letters and digits.
    fn mollie_ids() -> impl Strategy<Value = String> + Clone {
        "tr_[A-Za-z0-9]{1,20}"
    }

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_as_mollies_api_answers_it_maps_back_to_itself(
            event in events(
                Mollie::SENDS,
                mollie_ids(),
                i64::MAX,
                prop::sample::select(vec!["EUR", "JPY", "KWD", "GBP", "CHF"]).prop_map(str::to_owned),
            ),
            ts in 1_000_000_000i64..4_000_000_000,
            failure in prop::sample::select(vec!["failed", "canceled", "expired"]),
        ) {
            let when = psp::rfc3339(ts, 0).unwrap();
            let money = json!({
                "value": major_amount(event.amount_minor, &event.currency).unwrap(),
                "currency": event.currency,
            });
            let event = CanonicalEvent { provider: "p".into(), occurred_at: at(ts), ..event };
            let mapped = match event.event_type.object() {
                crate::domain::ObjectKind::Payment => {
                    let (status, at_key) = if event.event_type == EventKind::PaymentSucceeded {
                        ("paid", "paidAt")
                    } else {
                        (failure, match failure { "failed" => "failedAt", "canceled" => "canceledAt", _ => "expiredAt" })
                    };
                    let mut p = json!({"resource": "payment", "id": event.transaction_id,
                        "status": status, "amount": money, "createdAt": "2020-01-01T00:00:00+00:00"});
                    p[at_key] = when.into();
                    let mapped = map_payment("p", &event.transaction_id, &serde_json::to_vec(&p).unwrap())
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    match mapped.item {
                        Item::Event(e) => e,
                        other => return Err(TestCaseError::fail(format!("{other:?}"))),
                    }
                }
                _ => {
                    let status = if event.event_type == EventKind::RefundSucceeded { "refunded" } else { failure };
                    let status = if status == "expired" { "canceled" } else { status };
                    let parent = event.parent_transaction_id.clone().unwrap();
                    let list = json!({"count": 1, "_embedded": {"refunds": [{
                        "resource": "refund", "id": event.transaction_id, "status": status,
                        "paymentId": parent, "amount": money, "createdAt": when}]}});
                    let mut page = map_refunds("p", &parent, &serde_json::to_vec(&list).unwrap())
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(page.items.len(), 1);
                    match page.items.remove(0) {
                        Item::Event(e) => e,
                        other => return Err(TestCaseError::fail(format!("{other:?}"))),
                    }
                }
            };
            prop_assert_eq!(mapped, event);
        }
    }
}
