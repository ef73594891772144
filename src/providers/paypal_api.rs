//! PayPal's fetch-to-confirm mode (`confirm = "api"` on a paypal provider):
//! before a new event is booked, the event is fetched from PayPal's REST API
//! (`GET /v1/notifications/webhooks-events/{id}`, with an OAuth2 access token
//! from `POST /v1/oauth2/token`, client id and secret) and must map to exactly
//! what was delivered: the same event id, `event_type`, resource id, amount,
//! currency and parent capture.
//!
//! Why it exists: PayPal's signature covers the body's CRC-32 only, so a body
//! with the CRC of a genuine one verifies under the genuine headers. The
//! offline checks (transmission time window, transmission id bound to its
//! first body) refuse such a body once the genuine delivery has been seen;
//! an attacker who sees the headers *before* PayPal's delivery lands could
//! still be first. What PayPal's API says the event is cannot be forged that
//! way. The price: an outbound call per new event on the booking path, and
//! PayPal's API's availability becomes the booking's (a call that fails is a
//! 503, which PayPal retries). Hence not the default.
//!
//! Bounded like the certificate fetches: at most [`MAX_CONCURRENT_CALLS`]
//! calls at once (a delivery that finds none free is a 503), each within
//! [`CALL_TIMEOUT`] and [`MAX_EVENT_BYTES`]; the access token is kept until
//! shortly before PayPal says it expires.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use super::paypal::{check_prefix, parse_event};
use super::scheme::{Item, Reject};
use crate::outbound::{self, HttpsClient};

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

pub struct ApiConfirm {
    api_url: String,
    /// `Basic base64(client_id:client_secret)`; never logged.
    basic: String,
    client: HttpsClient,
    token: Mutex<Option<(String, Instant)>>,
    calls: Semaphore,
}

impl ApiConfirm {
    pub fn new(s: ApiSettings) -> Result<ApiConfirm, super::setup::SettingError> {
        check_prefix(&s.api_url).map_err(|e| ("api_url", format!("{}: {e}", s.api_url)))?;
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
        Ok(ApiConfirm {
            basic: format!(
                "Basic {}",
                B64.encode(format!("{}:{}", s.client_id, s.client_secret))
            ),
            api_url: s.api_url,
            client: outbound::https(CALL_TIMEOUT).map_err(|e| ("api_url", e))?,
            token: Mutex::new(None),
            calls: Semaphore::new(MAX_CONCURRENT_CALLS),
        })
    }

    pub fn allows_plain_http(&self) -> bool {
        self.api_url.starts_with("http://")
    }

    /// Fetches the delivered event from PayPal's API and checks that it maps
    /// to `delivered` (the item the delivered body mapped to). Unauthorized
    /// when PayPal knows no such event or knows it otherwise; unavailable
    /// when PayPal's API could not be asked.
    pub async fn confirm(
        &self,
        provider: &str,
        body: &[u8],
        delivered: &Item,
    ) -> Result<(), Reject> {
        let delivered_json: Value = serde_json::from_slice(body)
            .map_err(|_| Reject::Invalid("body must be a JSON object".into()))?;
        let id = delivered_json
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| {
                !id.is_empty()
                    && id.len() <= 64
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
            .ok_or_else(|| {
                Reject::Unauthorized("the event has no id PayPal's API could be asked for".into())
            })?;
        let _call = self
            .calls
            .try_acquire()
            .map_err(|_| Reject::Unavailable("PayPal API: every call slot is in use".to_owned()))?;
        let fetched = self.event(id).await?;
        let fetched_json: Value = serde_json::from_slice(&fetched).map_err(|_| {
            Reject::Unavailable("PayPal API: the event answered is not JSON".to_owned())
        })?;
        let differs = || {
            Reject::Unauthorized(format!(
                "the delivered event {id} differs from PayPal's record of it"
            ))
        };
        for field in ["id", "event_type"] {
            if fetched_json.get(field) != delivered_json.get(field) {
                return Err(differs());
            }
        }
        let fetched_item = parse_event(provider, &fetched).map_err(|_| differs())?;
        if booked(&fetched_item) != booked(delivered) {
            return Err(differs());
        }
        Ok(())
    }

    /// `GET /v1/notifications/webhooks-events/{id}`; a token PayPal no
    /// longer takes is dropped (the next delivery gets a new one).
    async fn event(&self, id: &str) -> Result<Bytes, Reject> {
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
        tokio::time::timeout(CALL_TIMEOUT, async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| unavailable(crate::report::chain(&e)))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_EVENT_BYTES)
                .collect()
                .await
                .map_err(|e| unavailable(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok((status, body))
        })
        .await
        .map_err(|_| unavailable(format!("no answer within {CALL_TIMEOUT:?}")))?
    }
}

/// What an item books, without `occurred_at` (a time PayPal may restate).
fn booked(item: &Item) -> Item {
    match item {
        Item::Event(e) => Item::Event(crate::domain::CanonicalEvent {
            occurred_at: None,
            ..e.clone()
        }),
        other => other.clone(),
    }
}

fn unavailable(why: String) -> Reject {
    Reject::Unavailable(format!("PayPal API: {why}"))
}
