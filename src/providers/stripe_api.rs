//! Stripe's API, as fencehook reads it with a provider's `api_key`: the
//! credentials (here) and what is asked with them.
//!
//! The key is a restricted key with Events read (or a secret key); it
//! reads the merchant's account, so it is never logged, never in a
//! `Debug` output, and a key published in Stripe's docs or fencehook's own
//! files is refused like a published webhook secret (`Setup::api_key`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::Value;
use time::OffsetDateTime;

use super::fetch::{ApiError, ApiFailure, Fetcher};
use super::scheme::{Listed, Window};

/// Stripe's production API.
pub const DEFAULT_API_URL: &str = "https://api.stripe.com";

/// What a Stripe API key starts with: a secret key or a restricted key, live
/// or test mode. A publishable key (`pk_`) reads nothing.
const KEY_PREFIXES: [&str; 4] = ["sk_live_", "sk_test_", "rk_live_", "rk_test_"];

/// Requests to Stripe's API in flight at once, per provider: one, so a
/// run never competes with the merchant's own use of the key's rate limit.
pub const IN_FLIGHT: usize = 1;
/// The longest one request may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest page read (100 events of a few KiB each).
pub const MAX_PAGE_BYTES: usize = 16 * 1024 * 1024;
/// Events per page: Stripe's largest.
pub const PAGE: u32 = 100;

/// One provider's access to Stripe's API.
pub struct Api {
    /// Without a trailing `/`; paths are appended (`/v1/events`).
    url: String,
    /// `Bearer <api_key>`; never logged.
    bearer: String,
    fetcher: Fetcher,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Api {
    /// The API at `url` with `key`; the error names the setting at fault.
    pub fn new(key: &str, url: &str) -> Result<Api, (&'static str, String)> {
        super::fetch::check_api_url(url).map_err(|e| ("api_url", format!("{url}: {e}")))?;
        let prefixed = KEY_PREFIXES.iter().any(|p| {
            key.strip_prefix(p).is_some_and(|rest| {
                !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric())
            })
        });
        if !prefixed {
            return Err((
                "api_key",
                "a Stripe API key starts with sk_live_, sk_test_, rk_live_ or rk_test_ (a restricted key with Events read will do; not the webhook's whsec_ secret)".into(),
            ));
        }
        Ok(Api {
            url: url.trim_end_matches('/').to_owned(),
            bearer: format!("Bearer {key}"),
            fetcher: Fetcher::new(IN_FLIGHT, TIMEOUT, MAX_PAGE_BYTES)
                .map_err(|e| ("api_url", e))?,
        })
    }

    /// The base URL, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The `Authorization` header's value.
    pub fn authorization(&self) -> &str {
        &self.bearer
    }

    /// Every event of `types` created in `window`, oldest first:
    /// `GET /v1/events` with `created[gte]`/`created[lte]`, [`PAGE`] a page,
    /// paged with `starting_after` (Stripe lists newest first). Every event
    /// in the window, delivered or not (`delivery_success` is not asked):
    /// an event whose webhook was answered 2xx is booked already and comes
    /// back `known`, which costs a lookup and proves the booking.
    pub async fn events(&self, window: Window, types: &[&str]) -> Result<Vec<Listed>, ApiError> {
        let mut listed = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let uri = self.events_uri(window, types, after.as_deref());
            let body = self
                .fetcher
                .call_patiently(|| {
                    http::Request::get(&uri)
                        .header(http::header::AUTHORIZATION, &self.bearer)
                        .header(http::header::ACCEPT, "application/json")
                        .body(Full::new(Bytes::new()))
                        .map_err(|e| e.to_string())
                })
                .await?;
            let page: Page = serde_json::from_slice(&body).map_err(|e| {
                ApiError::new(
                    ApiFailure::Malformed,
                    format!("GET /v1/events: not Stripe's list: {e}"),
                )
            })?;
            let last = page.data.last().map(|e| e.id.clone());
            for event in page.data {
                listed.push(event.listed()?);
            }
            match (page.has_more, last) {
                (true, Some(last)) => after = Some(last),
                _ => break,
            }
        }
        listed.reverse();
        Ok(listed)
    }

    fn events_uri(&self, window: Window, types: &[&str], after: Option<&str>) -> String {
        use std::fmt::Write;
        let mut uri = format!(
            "{}/v1/events?limit={PAGE}&created%5Bgte%5D={}&created%5Blte%5D={}",
            self.url,
            window.since.unix_timestamp(),
            window.until.unix_timestamp()
        );
        for t in types {
            let _ = write!(uri, "&types%5B%5D={t}");
        }
        if let Some(after) = after {
            let _ = write!(uri, "&starting_after={}", encode(after));
        }
        uri
    }

    /// Whether the API is reached without TLS (a local test server).
    pub fn allows_plain_http(&self) -> bool {
        self.url.starts_with("http://")
    }
}

/// One page of `GET /v1/events`.
#[derive(serde::Deserialize)]
struct Page {
    data: Vec<Event>,
    has_more: bool,
}

/// An event of a page: what the listing reads of it, and all of it.
#[derive(serde::Deserialize)]
struct Event {
    id: String,
    created: i64,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

impl Event {
    fn listed(self) -> Result<Listed, ApiError> {
        let created = OffsetDateTime::from_unix_timestamp(self.created).map_err(|_| {
            ApiError::new(
                ApiFailure::Malformed,
                format!("event {}: created is out of range", self.id),
            )
        })?;
        let mut whole = self.rest;
        whole.insert("id".into(), Value::String(self.id.clone()));
        whole.insert("created".into(), Value::from(self.created));
        Ok(Listed {
            body: Bytes::from(Value::Object(whole).to_string()),
            id: self.id,
            created,
        })
    }
}

/// An id as a query value: Stripe's ids are `[A-Za-z0-9_]`, anything else
/// is percent-encoded.
fn encode(id: &str) -> String {
    percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[cfg(test)]
mod tests {
    use crate::providers::{EventsApi, Provider};

    const SECRET: &str = "whsec_test_secret_for_fencehook_unit_tests";

    fn stripe(extra: &str) -> Result<Provider, String> {
        Provider::from_toml_str(&format!(
            "[providers.shop]\nscheme = \"stripe\"\nsecrets = [\"{SECRET}\"]\n{extra}"
        ))
        .map(|mut p| p.remove(0))
        .map_err(|e| e.lines().join("; "))
    }

    #[test]
    fn a_stripe_provider_without_a_key_cannot_reconcile_and_with_one_can() {
        assert_eq!(stripe("").unwrap().events_api(), EventsApi::NoCredentials);
        let p = stripe("api_key = \"rk_test_51Abc0Events0Read\"").unwrap();
        assert_eq!(p.events_api(), EventsApi::Ready);
        assert!(p.exposures().is_empty() && p.warnings().is_empty());
        let local =
            stripe("api_key = \"sk_test_x1\"\napi_url = \"http://127.0.0.1:4010\"").unwrap();
        assert!(
            local.warnings()[0].contains("api_url is http://"),
            "{:?}",
            local.warnings()
        );
    }

    #[test]
    fn stripe_api_settings_are_checked_naming_the_setting() {
        let e = stripe("api_key = \"whsec_abc\"").unwrap_err();
        assert!(
            e.starts_with("provider `shop`: api_key: a Stripe API key starts with"),
            "{e}"
        );
        let e = stripe("api_key = \"pk_test_abc\"").unwrap_err();
        assert!(e.starts_with("provider `shop`: api_key:"), "{e}");
        let e = stripe("api_url = \"https://api.stripe.com\"").unwrap_err();
        assert!(
            e.starts_with("provider `shop`: api_url: only with api_key"),
            "{e}"
        );
        let e =
            stripe("api_key = \"sk_test_x1\"\napi_url = \"http://api.stripe.com\"").unwrap_err();
        assert!(
            e.starts_with(
                "provider `shop`: api_url: http://api.stripe.com: must start with https://"
            ),
            "{e}"
        );
        let e = stripe("api_keys = \"sk_test_x1\"").unwrap_err();
        assert!(e.contains("did you mean api_key?"), "{e}");
    }

    #[test]
    fn stripe_docs_example_keys_are_refused_like_published_secrets() {
        for key in [
            "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
            "sk_test_BQokikJOvBiI2HlWgH4olfQ2",
        ] {
            let p = stripe(&format!("api_key = \"{key}\"")).unwrap();
            assert_eq!(
                p.exposures(),
                ["provider `shop`: api_key: is an API key published in the PSP's docs or fencehook's own files, not your account's"],
            );
        }
    }

    /// `types[]` asks Stripe for exactly what the mapping books: each listed
    /// type is mapped (refused here for its empty object, not ignored), and
    /// a type left out is ignored without a look.
    #[test]
    fn the_types_asked_for_are_the_types_the_mapping_books() {
        use crate::providers::stripe::{parse_event, BOOKED_TYPES};
        use crate::providers::Item;
        for t in BOOKED_TYPES {
            let body =
                format!(r#"{{"id":"evt_1","type":"{t}","created":1,"data":{{"object":{{}}}}}}"#);
            assert!(parse_event("s", body.as_bytes()).is_err(), "{t} is mapped");
        }
        for t in [
            "charge.dispute.created",
            "customer.created",
            "payment_intent.created",
        ] {
            let body = format!(r#"{{"id":"evt_1","type":"{t}","data":{{"object":{{}}}}}}"#);
            assert!(
                matches!(
                    parse_event("s", body.as_bytes()).as_deref(),
                    Ok([Item::Ignored { .. }])
                ),
                "{t}"
            );
        }
    }

    #[test]
    fn the_key_is_never_in_debug_output() {
        let api = super::Api::new("sk_test_secretvalue1", "https://api.stripe.com").unwrap();
        assert!(!format!("{api:?}").contains("secretvalue1"));
        let p = stripe("api_key = \"sk_test_secretvalue1\"").unwrap();
        assert!(!format!("{p:?}").contains("secretvalue1"));
    }
}
