//! PayPal's REST API, as the fetch-to-confirm mode (`confirm = "api"` on a
//! paypal provider) asks it: an event by its id
//! (`GET /v1/notifications/webhooks-events/{id}`), with an OAuth2 access
//! token from `POST /v1/oauth2/token` (client id and secret). What the event
//! fetched must match is the scheme's to say (`paypal.rs`): it maps to
//! exactly what was delivered.
//!
//! Why the mode exists: PayPal's signature covers the body's CRC-32 only, so a body
//! with the CRC of a genuine one verifies under the genuine headers. The
//! offline checks (transmission time window, transmission id bound to its
//! first body) refuse such a body once the genuine delivery has been seen;
//! an attacker who sees the headers *before* PayPal's delivery lands could
//! still be first. What PayPal's API says the event is cannot be forged that
//! way. The price: an outbound call per new event on the booking path, and
//! PayPal's API's availability becomes the booking's (a call that fails is a
//! 503, which PayPal retries). Hence not the default.
//!
//! Bounded like every fetch (`providers::fetch`): at most
//! [`MAX_CONCURRENT_CALLS`] events asked at once (a delivery that finds none
//! free is a 503), each call within [`CALL_TIMEOUT`] and [`MAX_EVENT_BYTES`];
//! the access token is kept until shortly before PayPal says it expires.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::Mutex;
use tokio::time::Instant;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::fetch::{check_base, ApiError, ApiFailure, Fetcher};
use super::scheme::{Listed, Reject, Window};
use super::setup::SettingError;

/// PayPal's live REST API (sandbox: `https://api-m.sandbox.paypal.com/`).
pub const DEFAULT_API_URL: &str = "https://api-m.paypal.com/";
/// Calls to PayPal's API in flight at once, per provider.
pub const MAX_CONCURRENT_CALLS: usize = 4;
/// The longest one call (token or event) may take, connection included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read (an event is a few KiB).
pub const MAX_EVENT_BYTES: usize = 256 * 1024;
/// A token is renewed this long before PayPal says it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);

/// The providers-file settings of the mode, as written.
#[derive(Clone)]
pub struct ApiSettings {
    pub api_url: String,
    pub client_id: String,
    pub client_secret: String,
}

/// One provider's access to PayPal's REST API.
pub struct Api {
    api_url: String,
    /// `Basic base64(client_id:client_secret)`; never logged.
    basic: String,
    fetcher: Fetcher,
    /// The reconciliation's listing: one request at a time, patient.
    lister: Fetcher,
    token: Mutex<Option<(String, Instant)>>,
}

/// Events per page of a listing.
pub const LIST_PAGE: u32 = 100;
/// The longest one listing request may take.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest listing page read.
pub const MAX_PAGE_BYTES: usize = 16 * 1024 * 1024;

impl Api {
    pub fn new(s: ApiSettings) -> Result<Api, SettingError> {
        check_base(&s.api_url).map_err(|e| ("api_url", format!("{}: {e}", s.api_url)))?;
        if s.client_id.is_empty() || !s.client_id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err((
                "client_id",
                "the REST app's client id (printable ASCII)".into(),
            ));
        }
        if s.client_secret.is_empty() || !s.client_secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err((
                "client_secret",
                "the REST app's secret (printable ASCII)".into(),
            ));
        }
        Ok(Api {
            basic: format!(
                "Basic {}",
                B64.encode(format!("{}:{}", s.client_id, s.client_secret))
            ),
            api_url: s.api_url,
            fetcher: Fetcher::new(MAX_CONCURRENT_CALLS, CALL_TIMEOUT, MAX_EVENT_BYTES)
                .map_err(|e| ("api_url", e))?,
            lister: Fetcher::new(1, LIST_TIMEOUT, MAX_PAGE_BYTES).map_err(|e| ("api_url", e))?,
            token: Mutex::new(None),
        })
    }

    pub fn allows_plain_http(&self) -> bool {
        self.api_url.starts_with("http://")
    }

    /// The event `id` as PayPal's API has it (its JSON), in one call slot.
    /// Unauthorized when PayPal knows no such event; unavailable when
    /// PayPal's API could not be asked.
    pub async fn event(&self, id: &str) -> Result<Bytes, Reject> {
        let _call = self
            .fetcher
            .try_slot()
            .ok_or_else(|| unavailable("every call slot is in use".to_owned()))?;
        self.fetch_event(id).await
    }

    /// Every event created in `window`, oldest first:
    /// `GET /v1/notifications/webhooks-events` with `start_time`, `end_time`
    /// and `page_size`, following each page's `next` link (only on
    /// `api_url`: the token is never sent elsewhere).
    pub async fn events(&self, window: Window) -> Result<Vec<Listed>, ApiError> {
        let rfc = |t: OffsetDateTime| {
            t.format(&Rfc3339)
                .map(|s| s.replace(':', "%3A").replace('+', "%2B"))
                .map_err(|e| ApiError::new(ApiFailure::Malformed, e.to_string()))
        };
        let mut next = Some(format!(
            "{}v1/notifications/webhooks-events?page_size={LIST_PAGE}&start_time={}&end_time={}",
            self.api_url,
            rfc(window.since)?,
            rfc(window.until)?
        ));
        let mut listed = Vec::new();
        while let Some(uri) = next.take() {
            let token = self
                .access_token()
                .await
                .map_err(|e| ApiError::new(ApiFailure::Credentials, e.to_string()))?;
            let bearer = format!("Bearer {token}");
            let body = self
                .lister
                .call_patiently(|| {
                    http::Request::get(&uri)
                        .header(http::header::AUTHORIZATION, &bearer)
                        .header(http::header::ACCEPT, "application/json")
                        .body(Full::new(Bytes::new()))
                        .map_err(|e| e.to_string())
                })
                .await?;
            let page: EventsPage = serde_json::from_slice(&body).map_err(|e| {
                ApiError::new(
                    ApiFailure::Malformed,
                    format!("the events list: not PayPal's shape: {e}"),
                )
            })?;
            for event in page.events {
                listed.push(event.listed()?);
            }
            if let Some(link) = page.links.into_iter().find(|l| l.rel == "next") {
                if !link.href.starts_with(&self.api_url) {
                    return Err(ApiError::new(
                        ApiFailure::Malformed,
                        "the events list's next link leaves api_url",
                    ));
                }
                next = Some(link.href);
            }
        }
        listed.sort_by_key(|l| l.created);
        Ok(listed)
    }

    /// `GET /v1/notifications/webhooks-events/{id}`; a token PayPal no
    /// longer takes is dropped (the next delivery gets a new one).
    async fn fetch_event(&self, id: &str) -> Result<Bytes, Reject> {
        let token = self.access_token().await?;
        let uri = format!("{}v1/notifications/webhooks-events/{id}", self.api_url);
        let req = http::Request::get(uri)
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|e| unavailable(e.to_string()))?;
        let (status, body) = self.call(req).await?;
        match status {
            http::StatusCode::OK => Ok(body),
            http::StatusCode::NOT_FOUND => Err(Reject::Unauthorized(format!(
                "PayPal's API knows no event {id}"
            ))),
            http::StatusCode::UNAUTHORIZED => {
                *self.token.lock().await = None;
                Err(unavailable("the access token was refused".into()))
            }
            other => Err(unavailable(format!("the event: answered {other}"))),
        }
    }

    /// The cached access token, or a new one (`client_credentials`).
    async fn access_token(&self) -> Result<String, Reject> {
        let mut cached = self.token.lock().await;
        if let Some((token, until)) = &*cached {
            if Instant::now() < *until {
                return Ok(token.clone());
            }
        }
        let req = http::Request::post(format!("{}v1/oauth2/token", self.api_url))
            .header(http::header::AUTHORIZATION, &self.basic)
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from_static(
                b"grant_type=client_credentials",
            )))
            .map_err(|e| unavailable(e.to_string()))?;
        let (status, body) = self.call(req).await?;
        if status != http::StatusCode::OK {
            // 401 here is our client id or secret: the operator's to fix.
            return Err(unavailable(format!("the access token: answered {status}")));
        }
        #[derive(serde::Deserialize)]
        struct Token {
            access_token: String,
            expires_in: u64,
        }
        let t: Token = serde_json::from_slice(&body)
            .map_err(|_| unavailable("the access token: not PayPal's token shape".into()))?;
        let life = Duration::from_secs(t.expires_in).saturating_sub(TOKEN_MARGIN);
        *cached = Some((t.access_token.clone(), Instant::now() + life));
        Ok(t.access_token)
    }

    async fn call(
        &self,
        req: http::Request<Full<Bytes>>,
    ) -> Result<(http::StatusCode, Bytes), Reject> {
        self.fetcher.call(req).await.map_err(unavailable)
    }
}

/// A page of PayPal's events list.
#[derive(serde::Deserialize)]
struct EventsPage {
    #[serde(default)]
    events: Vec<ListedEvent>,
    #[serde(default)]
    links: Vec<Link>,
}

#[derive(serde::Deserialize)]
struct Link {
    href: String,
    rel: String,
}

/// An event of a page: what the listing reads of it, and all of it.
#[derive(serde::Deserialize)]
struct ListedEvent {
    id: String,
    create_time: String,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

impl ListedEvent {
    fn listed(self) -> Result<Listed, ApiError> {
        let created = OffsetDateTime::parse(&self.create_time, &Rfc3339).map_err(|_| {
            ApiError::new(
                ApiFailure::Malformed,
                format!("event {}: create_time is not RFC 3339", self.id),
            )
        })?;
        let mut whole = self.rest;
        whole.insert("id".into(), self.id.clone().into());
        whole.insert("create_time".into(), self.create_time.into());
        Ok(Listed {
            body: Bytes::from(serde_json::Value::Object(whole).to_string()),
            id: self.id,
            created,
        })
    }
}

fn unavailable(why: String) -> Reject {
    Reject::Unavailable(format!("PayPal API: {why}"))
}
