//! Stripe's thin events (`"object": "v2.core.event"`): a verified event
//! that names the object it is about (`related_object.url`) instead of
//! carrying it. The object is fetched with the provider's `api_key` and the
//! event is mapped exactly as the snapshot event of its type would be (the
//! type without its `v1.` prefix, the fetched object as `data.object`); the
//! thin event's `id` stays the PSP event id.
//!
//! What must stay true:
//!
//! - Only a path, or an absolute URL on `api_url`'s own origin, is fetched
//!   (a path is appended to `api_url`); anything else is 400
//!   `invalid_payload` and nothing is fetched: the URL is the sender's, and
//!   a signed event is no licence to make the service fetch elsewhere.
//! - A type the mapping does not book is 200 `ignored` without a fetch.
//! - Without `api_key`, a thin event that would book is 503 (Stripe
//!   retries; a key added and reloaded then books it), and the log says the
//!   provider needs `api_key`.
//! - The object is fetched as [`STRIPE_VERSION`] shapes it
//!   (`Stripe-Version`), and mapped with that version's rules, whatever the
//!   account's default version is.
//! - Fetches share the bounds of every fetch (`providers::fetch`): a few at
//!   once per provider, a notification waiting its turn for at most the
//!   fetch timeout, each within a time and a size; counted by result.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fetch::Fetcher;
use super::fields::{self, invalid, opt, req_object, req_str, Object};
use super::scheme::Reject;
use super::stripe_api::DEFAULT_API_URL;

/// What `"object"` says of a thin event.
pub const THIN_OBJECT: &str = "v2.core.event";
/// The API version objects are fetched in (and mapped as).
pub const STRIPE_VERSION: &str = "2025-03-31.basil";
/// Objects fetched at once per provider.
pub const MAX_FETCHES_IN_FLIGHT: usize = 8;
/// The longest one fetch may take (and a delivery waits for a slot).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest object read.
pub const MAX_OBJECT_BYTES: usize = 256 * 1024;
/// The longest `related_object.url` read.
const MAX_URL_CHARS: usize = 512;

/// What a thin event stands for.
#[derive(Debug, PartialEq, Eq)]
pub enum Snapshot {
    /// A type the mapping does not book (its name): nothing was fetched.
    NotBooked(String),
    /// The snapshot event (JSON) of its type, around the fetched object.
    Event(Vec<u8>),
}

/// A provider's access to Stripe's API for its thin events.
pub struct ThinEvents {
    /// `api_url` without its trailing `/`.
    base: String,
    /// `scheme://host[:port]` of `api_url`.
    origin: String,
    /// `Bearer {api_key}` and the fetcher, when the provider has a key.
    access: Option<(String, Fetcher)>,
}

impl ThinEvents {
    /// Without `api_key`: thin events are read (and ignored or refused as
    /// they would be), never fetched.
    pub fn keyless() -> ThinEvents {
        ThinEvents::at(DEFAULT_API_URL, None)
    }

    /// Fetching under `api_url` (checked by whoever read it) with the
    /// `Authorization` value `bearer`. The error is a sentence for `api_url`.
    pub fn new(api_url: &str, bearer: &str) -> Result<ThinEvents, String> {
        let fetcher = Fetcher::new(MAX_FETCHES_IN_FLIGHT, FETCH_TIMEOUT, MAX_OBJECT_BYTES)?;
        Ok(ThinEvents::at(api_url, Some((bearer.to_owned(), fetcher))))
    }

    fn at(api_url: &str, access: Option<(String, Fetcher)>) -> ThinEvents {
        let base = api_url.trim_end_matches('/').to_owned();
        let after_scheme = base.find("://").map_or(0, |i| i + 3);
        let origin = match base[after_scheme..].find('/') {
            Some(i) => base[..after_scheme + i].to_owned(),
            None => base.clone(),
        };
        ThinEvents {
            base,
            origin,
            access,
        }
    }

    pub fn fetcher(&self) -> Option<&Fetcher> {
        self.access.as_ref().map(|(_, fetcher)| fetcher)
    }

    /// What a verified thin `event` stands for: nothing to book when its
    /// type (without `v1.`) is not one the mapping `books`, else its object
    /// fetched and the snapshot event of its type around it, for the mapping
    /// to read as Stripe's own.
    pub async fn snapshot(
        &self,
        event: &Object,
        books: fn(&str) -> bool,
    ) -> Result<Snapshot, Reject> {
        let thin_type = req_str(event, "type", "type")?;
        let Some(event_type) = thin_type.strip_prefix("v1.").filter(|t| books(t)) else {
            return Ok(Snapshot::NotBooked(thin_type.to_owned()));
        };
        let id = req_str(event, "id", "id")?;
        let related = req_object(event, "related_object", "related_object")?;
        let url = self.url_of(req_str(related, "url", "related_object.url")?)?;
        let context = fields::opt_str(event, "context", "context")?;
        let created = created(event)?;
        let Some((bearer, fetcher)) = &self.access else {
            return Err(Reject::Unavailable(
                "api_key is not set: a thin event's object is fetched with the provider's api_key (set it and reload; Stripe retries)".to_owned(),
            ));
        };
        let object = fetch(fetcher, &url, bearer, context).await?;
        let snapshot = json!({
            "id": id,
            "object": "event",
            "type": event_type,
            "api_version": STRIPE_VERSION,
            "created": created,
            "data": {"object": object},
        });
        Ok(Snapshot::Event(snapshot.to_string().into_bytes()))
    }

    /// The URL `related_object.url` names: a path (appended to `api_url`)
    /// or an absolute URL on `api_url`'s origin; anything else is refused.
    fn url_of(&self, named: &str) -> Result<String, Reject> {
        let refused = || {
            invalid("related_object.url must be a path or a URL on api_url's origin: nothing was fetched")
        };
        let plain = named.len() <= MAX_URL_CHARS
            && named.bytes().all(|b| b.is_ascii_graphic())
            && !named.contains(['#', '\\', '@'])
            && !named.split(['/', '?']).any(|part| part == "..");
        if !plain {
            return Err(refused());
        }
        if named.starts_with('/') && !named.starts_with("//") {
            return Ok(format!("{}{named}", self.base));
        }
        match named.strip_prefix(&self.origin) {
            Some(rest) if rest.starts_with('/') && !rest.starts_with("//") => Ok(named.to_owned()),
            _ => Err(refused()),
        }
    }
}

/// The object at `url`, within the fetcher's bounds.
async fn fetch(
    fetcher: &Fetcher,
    url: &str,
    bearer: &str,
    context: Option<&str>,
) -> Result<Value, Reject> {
    let unavailable = |why: String| Reject::Unavailable(format!("Stripe API: {why}"));
    let Some(_slot) = fetcher.slot().await else {
        return Err(unavailable(format!(
            "every fetch slot stayed taken for {FETCH_TIMEOUT:?}"
        )));
    };
    let mut req = http::Request::get(url)
        .header(http::header::AUTHORIZATION, bearer)
        .header("stripe-version", STRIPE_VERSION);
    if let Some(context) = context {
        req = req.header("stripe-context", context);
    }
    let req = req
        .body(Full::new(Bytes::new()))
        .map_err(|_| invalid("related_object.url or context is not a valid request"))?;
    let (status, body) = fetcher.call(req).await.map_err(unavailable)?;
    match status {
        http::StatusCode::OK => {
            let value = fields::parse_json(&body)
                .map_err(|_| unavailable("the object is not JSON".to_owned()))?;
            if value.is_object() {
                Ok(value)
            } else {
                Err(unavailable("the object is not a JSON object".to_owned()))
            }
        }
        // The event is Stripe's (signed): an object its key cannot see is
        // the key's or the context's to fix, not the sender's.
        http::StatusCode::UNAUTHORIZED | http::StatusCode::FORBIDDEN | http::StatusCode::NOT_FOUND => Err(unavailable(format!(
            "answered {status} for the thin event's object: check the provider's api_key (its account and mode) and the event's context"
        ))),
        other => Err(unavailable(format!("answered {other}"))),
    }
}

/// The body as a thin event's object, when it is one (`"object":
/// "v2.core.event"`); `None` for every other event, which is mapped as it
/// is. A body that does not name the thin object anywhere is not parsed here.
pub fn thin_event(body: &[u8]) -> Result<Option<Object>, Reject> {
    let named = body
        .windows(THIN_OBJECT.len())
        .any(|w| w == THIN_OBJECT.as_bytes());
    if !named {
        return Ok(None);
    }
    match fields::parse_json(body)? {
        Value::Object(event) if matches!(opt(&event, "object"), Some(Value::String(s)) if s == THIN_OBJECT) => {
            Ok(Some(event))
        }
        _ => Ok(None),
    }
}

/// The thin event's `created` (RFC 3339) as the unix seconds a snapshot
/// event carries; absent stays absent.
fn created(event: &Object) -> Result<Option<i64>, Reject> {
    match fields::opt_str(event, "created", "created")? {
        None => Ok(None),
        Some(text) => OffsetDateTime::parse(text, &Rfc3339)
            .map(|t| Some(t.unix_timestamp()))
            .map_err(|_| invalid("created must be an RFC 3339 date-time")),
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    fn event(event_type: &str, url: &str) -> Object {
        match json!({
            "id": "evt_test_1", "object": THIN_OBJECT, "type": event_type,
            "created": "2026-12-01T10:00:00.000Z",
            "related_object": {"id": "pi_1", "type": "payment_intent", "url": url},
        }) {
            Value::Object(o) => o,
            _ => unreachable!(),
        }
    }

    fn books(event_type: &str) -> bool {
        event_type == "payment_intent.succeeded"
    }

    fn keyless(event: &Object) -> Result<Snapshot, Reject> {
        ThinEvents::keyless()
            .snapshot(event, books)
            .now_or_never()
            .expect("nothing is fetched without a key")
    }

    #[test]
    fn only_a_thin_event_is_read_as_one() {
        let thin = serde_json::to_vec(&event("v1.payment_intent.succeeded", "/v1/x")).unwrap();
        assert!(thin_event(&thin).unwrap().is_some());
        let snapshot = br#"{"id":"evt_1","object":"event","type":"payment_intent.succeeded","data":{"object":{"description":"v2.core.event"}}}"#;
        assert_eq!(thin_event(snapshot), Ok(None));
        assert_eq!(thin_event(br#"{"object":"event"}"#), Ok(None));
        assert!(thin_event(b"v2.core.event {").is_err());
    }

    #[test]
    fn without_a_key_a_booked_type_is_unavailable_and_the_rest_is_decided_first() {
        let url = "/v1/payment_intents/pi_1";
        assert!(matches!(
            keyless(&event("v1.payment_intent.succeeded", url)),
            Err(Reject::Unavailable(why)) if why.contains("api_key")
        ));
        for ignored in [
            "v1.customer.created",
            "payment_intent.succeeded",
            "v2.core.account.updated",
        ] {
            assert!(
                matches!(keyless(&event(ignored, url)), Ok(Snapshot::NotBooked(_))),
                "{ignored}"
            );
        }
        assert!(matches!(
            keyless(&event(
                "v1.payment_intent.succeeded",
                "https://evil.example/v1/x"
            )),
            Err(Reject::Invalid(_))
        ));
    }

    #[test]
    fn only_a_path_or_a_url_on_api_urls_origin_is_fetched() {
        let thin = ThinEvents::at("https://proxy.example.com/stripe/", None);
        assert_eq!(
            thin.url_of("/v1/payment_intents/pi_1").unwrap(),
            "https://proxy.example.com/stripe/v1/payment_intents/pi_1"
        );
        assert_eq!(
            thin.url_of("https://proxy.example.com/v1/refunds/re_1?expand[]=charge")
                .unwrap(),
            "https://proxy.example.com/v1/refunds/re_1?expand[]=charge"
        );
        for bad in [
            "https://proxy.example.com.evil/v1/x",
            "https://proxy.example.com:8443/v1/x",
            "http://proxy.example.com/v1/x",
            "https://evil.example/v1/x",
            "//evil.example/v1/x",
            "https://proxy.example.com//evil.example/x",
            "/v1/../../x",
            "/v1/x#y",
            "/v1/x y",
            "/v1/x@evil",
            "v1/x",
            "",
        ] {
            assert!(matches!(thin.url_of(bad), Err(Reject::Invalid(_))), "{bad}");
        }
        let long = format!("/v1/{}", "a".repeat(MAX_URL_CHARS));
        assert!(thin.url_of(&long).is_err());
    }
}
