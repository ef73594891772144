//! PayPal webhooks (`paypal` scheme), verified offline.
//!
//! # Signature
//!
//! Headers `PAYPAL-TRANSMISSION-ID`, `PAYPAL-TRANSMISSION-TIME`,
//! `PAYPAL-TRANSMISSION-SIG` (base64), `PAYPAL-CERT-URL` and
//! `PAYPAL-AUTH-ALGO`, which is pinned: only `SHA256withRSA` (PayPal's Java
//! SDK hands the sender's value to `Signature.getInstance`; we do not). The
//! signature is SHA256withRSA (PKCS#1 v1.5) over
//!
//! ```text
//! {transmission_id}|{transmission_time}|{webhook_id}|{crc32}
//! ```
//!
//! where `webhook_id` is this provider's configured webhook id and `crc32`
//! the CRC-32 (IEEE) of the raw body as an unsigned decimal, with the key of
//! the certificate at `PAYPAL-CERT-URL`, which must be within its validity
//! period at `now`.
//!
//! # What the signature does not prove, and what is added
//!
//! CRC-32 is linear: any body can be padded to the CRC of another, so one
//! genuine set of headers verifies any number of forged bodies, and nothing
//! in PayPal's scheme limits how old a transmission may be. So, on top:
//!
//! - `PAYPAL-TRANSMISSION-TIME` must lie within `max_age_secs` (default 3
//!   days, PayPal's retry period) before `now`, and at most
//!   `future_skew_secs` (default 300) after it: else 401.
//! - The transmission id is bound to the SHA-256 of the first body seen
//!   with it, for as long as its time is inside that window ([`Paypal::transmission`];
//!   kept in PostgreSQL, `paypal_transmissions`, shared by every instance).
//!   The same id with another body is a 401, counted
//!   (`fencehook_requests_rejected_total{reason="transmission_reused"}`).
//!
//! # The certificate URL is the sender's
//!
//! So it is fetched only when it starts with one of `cert_url_prefixes`
//! (default `https://api.paypal.com/` and `https://api.sandbox.paypal.com/`):
//! the prefix, which pins the scheme and the host (a prefix must end its
//! host with `/`), is the guard, and TLS to PayPal's host authenticates what
//! is served there. Any other URL is a 401 before any network call. A
//! fetch follows no redirect, takes at most [`FETCH_TIMEOUT`] and
//! [`MAX_CERT_BYTES`]; a fetch that fails is a 503 (PayPal retries), a body
//! that is no certificate a 401. Certificates are cached per URL; what a
//! stranger's URLs can cost is bounded (see `CertCache`): a few fetches at
//! once ([`MAX_CONCURRENT_FETCHES`]), one per URL, failures remembered for
//! [`NEGATIVE_TTL`], and a certificate a signature verified with is never
//! pushed out by certificates none has. Fetching is the only `await` of any
//! scheme's verification.
//!
//! # Mapping
//!
//! | event_type | booked as | transaction_id | parent | amount |
//! | --- | --- | --- | --- | --- |
//! | `PAYMENT.CAPTURE.COMPLETED` | payment.succeeded | the capture's `id` | – | `amount` |
//! | `PAYMENT.CAPTURE.DENIED`, `PAYMENT.CAPTURE.DECLINED` | payment.failed | the capture's `id` | – | `amount` |
//! | `PAYMENT.CAPTURE.REFUNDED` | refund.succeeded | the refund's `id` | the capture of its `up` link | `amount` (this refund's) |
//! | `PAYMENT.CAPTURE.REVERSED` | dispute.funds_withdrawn | the reversal's `id` | the capture of its `up` link | `amount` |
//! | anything else (`PAYMENT.CAPTURE.PENDING`, `CHECKOUT.*`, …) | ignored | | | |
//!
//! A REVERSED is PayPal taking the money back from the merchant ("PayPal
//! reverses a payment capture": a chargeback or a buyer complaint decided
//! against the merchant), not a refund the merchant chose, so it is booked
//! as a dispute: the ledger's `debit` stays what the merchant refunded, and
//! both count against the capture's amount. Its object carries its own id
//! (a refund-shaped resource), the dispute's key.
//!
//! Amounts are decimal strings converted exactly with the currency's ISO
//! 4217 exponent (JPY 0, USD 2, KWD 3); a currency outside the table, or
//! more digits than its exponent, is a 400.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio::time::Instant;

use super::fetch::{check_base, ApiError, Fetcher};
use super::fields::{
    self, check_currency, check_transaction_id, decimal_minor, invalid, opt, opt_str, req_object,
    req_str, signed_header, Object,
};
use super::keys::{CertificateInfo, RsaSigner};
use super::paypal_api::{Api, ApiSettings, DEFAULT_API_URL};
use super::paypal_certs::{Cell, CertCache};
pub use super::paypal_certs::{CACHE_ENTRIES, NEGATIVE_ENTRIES};
use super::psp::{self, Credentials, Delivery, Key, Notice, PspError, JSON};
pub use super::scheme::TransmissionKey;
use super::scheme::{self, EventsApi, Item, Listed, Reject, Scheme};
use super::setup::{SettingError, Setup};
use crate::domain::amount::minor_unit_exponent;
use crate::domain::{CanonicalEvent, EventKind};

pub const TRANSMISSION_ID_HEADER: &str = "paypal-transmission-id";
pub const TRANSMISSION_TIME_HEADER: &str = "paypal-transmission-time";
pub const TRANSMISSION_SIG_HEADER: &str = "paypal-transmission-sig";
pub const CERT_URL_HEADER: &str = "paypal-cert-url";
pub const AUTH_ALGO_HEADER: &str = "paypal-auth-algo";
/// The only `PAYPAL-AUTH-ALGO` accepted.
pub const AUTH_ALGO: &str = "SHA256withRSA";
/// Where PayPal serves its signing certificates (live and sandbox).
pub const DEFAULT_CERT_URL_PREFIXES: &[&str] =
    &["https://api.paypal.com/", "https://api.sandbox.paypal.com/"];
/// The longest a certificate fetch may take, connection included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest certificate body read (a PEM leaf and its chain are ~5 KiB).
pub const MAX_CERT_BYTES: usize = 64 * 1024;
/// Certificate fetches in flight at once, per provider: PayPal needs one a
/// year; a stranger naming new URLs must not hold many outbound connections.
pub const MAX_CONCURRENT_FETCHES: usize = 4;
/// How long a URL whose fetch failed answers as it did without a new fetch.
/// Short against PayPal's retries (minutes to days apart).
pub const NEGATIVE_TTL: Duration = Duration::from_secs(60);
/// The longest `PAYPAL-CERT-URL` looked at.
const MAX_URL_LEN: usize = 2048;
/// `max_age_secs`: PayPal retries a delivery for up to 3 days.
pub const DEFAULT_MAX_AGE_SECS: u64 = 3 * 86_400;
/// The longest `max_age_secs`: a year, far past any retry (and far from
/// overflowing the expiry arithmetic).
pub const MAX_MAX_AGE_SECS: u64 = 366 * 86_400;
/// `future_skew_secs`: how far ahead of our clock PayPal's may run.
pub const DEFAULT_FUTURE_SKEW_SECS: u64 = 300;
/// Above this, a "skew" lets a transmission time stay valid for hours longer.
pub const MAX_FUTURE_SKEW_SECS: u64 = 3600;

/// How old (and how far ahead) a `PAYPAL-TRANSMISSION-TIME` may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub max_age_secs: u64,
    pub future_skew_secs: u64,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            max_age_secs: DEFAULT_MAX_AGE_SECS,
            future_skew_secs: DEFAULT_FUTURE_SKEW_SECS,
        }
    }
}

/// `confirm`: signature, time window and transmission id binding only (the
/// default), or each new event fetched from PayPal's API too.
pub const CONFIRM_OFFLINE: &str = "offline";
pub const CONFIRM_API: &str = "api";

/// The provider's webhook id, which the tools sign into a delivery.
pub const WEBHOOK_ID: Key = Key {
    flag: "webhook-id",
    what: "the provider's webhook id, part of what PayPal signs",
    in_file: true,
};

/// `PAYPAL-CERT-URL` of what the tools sign: where the service fetches the
/// certificate of their private key.
pub const CERT_URL: Key = Key {
    flag: "cert-url",
    what: "PAYPAL-CERT-URL, where the service fetches the certificate of --private-key",
    in_file: false,
};

/// A `paypal` provider's table.
#[derive(serde::Deserialize)]
pub struct Settings {
    /// The webhook's id at PayPal: part of what PayPal signs.
    webhook_id: Option<String>,
    /// Where a certificate may be fetched from (default
    /// [`DEFAULT_CERT_URL_PREFIXES`]).
    cert_url_prefixes: Option<Vec<String>>,
    /// How old a transmission time may be (default 3 days).
    max_age_secs: Option<u64>,
    /// How far ahead of the clock a transmission time may be.
    future_skew_secs: Option<u64>,
    /// [`CONFIRM_OFFLINE`] (the default) or [`CONFIRM_API`].
    confirm: Option<String>,
    /// With `confirm = "api"`: the REST API's base URL and the app's credentials.
    api_url: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
}

#[derive(Clone)]
pub struct Paypal {
    webhook_id: String,
    prefixes: Vec<String>,
    window: Window,
    cache: Arc<CertCache>,
    /// The certificate fetches, bounded ([`MAX_CONCURRENT_FETCHES`] at once).
    fetcher: Arc<Fetcher>,
    /// `confirm = "api"`: each new event is fetched from PayPal's API first.
    confirm: Option<Arc<Api>>,
    /// PayPal's API with the provider's credentials (`client_id`,
    /// `client_secret`), whatever `confirm` says: the reconciliation lists
    /// events with it.
    api: Option<Arc<Api>>,
}

/// Why a fetch gave no certificate.
enum FetchError {
    /// Every fetch slot was taken: says nothing about the URL, not remembered.
    Busy,
    /// The URL failed (unreachable, not a certificate): remembered a while.
    Failed(Reject),
    /// It failed for a delivery that fetched first while this one waited.
    Remembered(Reject),
}

impl Paypal {
    pub fn new(
        webhook_id: &str,
        cert_url_prefixes: Option<&[String]>,
        window: Window,
    ) -> Result<Paypal, SettingError> {
        if !(1..=MAX_MAX_AGE_SECS).contains(&window.max_age_secs) {
            return Err((
                "max_age_secs",
                format!(
                    "must be between 1 and {MAX_MAX_AGE_SECS} (PayPal retries for 3 days: {DEFAULT_MAX_AGE_SECS})"
                ),
            ));
        }
        if window.future_skew_secs > MAX_FUTURE_SKEW_SECS {
            return Err((
                "future_skew_secs",
                format!("must be at most {MAX_FUTURE_SKEW_SECS} (a clock skew, not a window)"),
            ));
        }
        if webhook_id.is_empty() || !webhook_id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err((
                "webhook_id",
                "the webhook's id from PayPal's dashboard (printable ASCII, e.g. WH-… or 1AB23…)"
                    .into(),
            ));
        }
        let prefixes: Vec<String> = match cert_url_prefixes {
            Some(p) => p.to_vec(),
            None => DEFAULT_CERT_URL_PREFIXES
                .iter()
                .map(|p| (*p).to_owned())
                .collect(),
        };
        if prefixes.is_empty() {
            return Err((
                "cert_url_prefixes",
                "at least one prefix (or leave it out for PayPal's)".into(),
            ));
        }
        for p in &prefixes {
            check_base(p).map_err(|e| ("cert_url_prefixes", format!("{p}: {e}")))?;
        }
        Ok(Paypal {
            webhook_id: webhook_id.to_owned(),
            prefixes,
            window,
            cache: Arc::default(),

            confirm: None,
            api: None,
            fetcher: Arc::new(
                Fetcher::new(MAX_CONCURRENT_FETCHES, FETCH_TIMEOUT, MAX_CERT_BYTES)
                    .map_err(|e| ("cert_url_prefixes", e))?,
            ),
        })
    }

    /// Turns on the fetch-to-confirm mode (`confirm = "api"`, see `paypal_api`).
    pub fn with_api_confirm(mut self, settings: ApiSettings) -> Result<Paypal, SettingError> {
        self.with_api(settings)?;
        self.confirm = self.api.clone();
        Ok(self)
    }

    /// Gives the provider PayPal's API (for the reconciliation), without
    /// confirming deliveries with it.
    fn with_api(&mut self, settings: ApiSettings) -> Result<(), SettingError> {
        self.api = Some(Arc::new(Api::new(settings)?));
        Ok(())
    }

    /// Whether a configured prefix (or the API's URL) is reached without
    /// TLS (a local test server).
    pub fn allows_plain_http(&self) -> bool {
        self.prefixes.iter().any(|p| p.starts_with("http://"))
            || self.api.as_ref().is_some_and(|c| c.allows_plain_http())
    }

    /// Whether events are confirmed with PayPal's API before booking.
    pub fn confirms_with_api(&self) -> bool {
        self.confirm.is_some()
    }

    pub async fn verify(
        &self,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<(), Reject> {
        let unauthorized = |m: &str| Reject::Unauthorized(m.to_owned());
        let header = |name: &str| signed_header(headers, name);
        if header(AUTH_ALGO_HEADER)? != AUTH_ALGO {
            return Err(unauthorized("PAYPAL-AUTH-ALGO must be SHA256withRSA"));
        }
        let id = header(TRANSMISSION_ID_HEADER)?;
        let time = header(TRANSMISSION_TIME_HEADER)?;
        // Before any fetch: an old transmission costs nothing to refuse.
        let sent = transmission_time(time)?;
        if now.saturating_sub(sent) > self.window.max_age_secs as i64 {
            return Err(unauthorized(
                "PAYPAL-TRANSMISSION-TIME is older than max_age_secs",
            ));
        }
        if sent.saturating_sub(now) > self.window.future_skew_secs as i64 {
            return Err(unauthorized(
                "PAYPAL-TRANSMISSION-TIME is ahead of the clock by more than future_skew_secs",
            ));
        }
        let signature = B64
            .decode(header(TRANSMISSION_SIG_HEADER)?)
            .map_err(|_| unauthorized("PAYPAL-TRANSMISSION-SIG is not base64"))?;
        let url = header(CERT_URL_HEADER)?;
        if url.len() > MAX_URL_LEN
            || !url.bytes().all(|b| b.is_ascii_graphic())
            || !self.prefixes.iter().any(|p| url.starts_with(p.as_str()))
        {
            return Err(unauthorized(
                "PAYPAL-CERT-URL is outside the configured cert_url_prefixes",
            ));
        }
        let (cert, cell) = self.certificate(url).await?;
        if !cert.is_valid_at(now) {
            return Err(unauthorized(
                "the certificate at PAYPAL-CERT-URL is outside its validity period",
            ));
        }
        if cert.key.verifies(
            signed_message(id, time, &self.webhook_id, body).as_bytes(),
            &signature,
        ) {
            self.cache.mark_verified(url, &cell);
            Ok(())
        } else {
            Err(unauthorized("signature does not match"))
        }
    }

    /// The certificate at `url`: from the cache, or fetched once (within the
    /// bounds of [`CertCache`]).
    async fn certificate(&self, url: &str) -> Result<(Arc<CertificateInfo>, Cell), Reject> {
        let cell = self.cache.cell(url, Instant::now())?;
        let got = cell
            // Boxed: the fetch's future is a few KB, and every provider's
            // delivery future is as large as the largest scheme's accept.
            .get_or_try_init(|| {
                Box::pin(async {
                    // Deliveries that waited on this cell while its fetch failed
                    // each try in turn (the cell stays empty): the failure was
                    // remembered meanwhile, so they do not fetch again.
                    if let Some(reject) = self.cache.remembered(url, Instant::now()) {
                        return Err(FetchError::Remembered(reject));
                    }
                    // Not waited for: a delivery that would queue behind other
                    // fetches is answered 503 at once (PayPal retries).
                    let _slot = self.fetcher.try_slot().ok_or(FetchError::Busy)?;
                    fetch(&self.fetcher, url).await.map_err(FetchError::Failed)
                })
            })
            .await
            .cloned();
        match got {
            Ok(cert) => Ok((cert, cell)),
            Err(FetchError::Busy) => {
                self.cache.forget_failed(url, &cell, None);
                Err(Reject::Unavailable(
                    "PAYPAL-CERT-URL: every certificate fetch slot is in use".to_owned(),
                ))
            }
            Err(FetchError::Remembered(reject)) => Err(reject),
            Err(FetchError::Failed(reject)) => {
                let until = Instant::now() + NEGATIVE_TTL;
                self.cache
                    .forget_failed(url, &cell, Some((until, reject.clone())));
                Err(reject)
            }
        }
    }

    /// Puts a certificate in the cache as if fetched from `url` (tests and
    /// unit vectors whose URL is PayPal's, which no test may reach).
    #[cfg(any(test, feature = "test-support"))]
    pub fn preload(&self, url: &str, pem: &[u8]) -> Result<(), String> {
        let cert = Arc::new(CertificateInfo::parse(pem)?);
        self.cache
            .cell(url, Instant::now())
            .map_err(|e| e.to_string())?
            .set(cert)
            .map_err(|_| "already cached".to_owned())
    }
}

impl Scheme for Paypal {
    const NAME: &'static str = "paypal";
    type Settings = Settings;
    const SIGNATURE_HEADER: Option<&'static str> = Some(TRANSMISSION_SIG_HEADER);
    const SENDS: &'static [EventKind] = &[
        EventKind::PaymentSucceeded,
        EventKind::PaymentFailed,
        EventKind::RefundSucceeded,
        EventKind::DisputeFundsWithdrawn,
    ];
    const DELIVERY_ID_PREFIX: &'static str = "WH-";
    const PAYMENT_ID: Option<&'static str> = Some("the capture id");
    const KEYS: &'static [Key] = &[WEBHOOK_ID, CERT_URL];

    fn build(settings: Settings, setup: &mut Setup) -> Result<Paypal, String> {
        let api = (settings.api_url, settings.client_id, settings.client_secret);
        let webhook_id = setup.required(
            settings.webhook_id,
            "webhook_id",
            "the webhook's id at PayPal",
        )?;
        setup.offer(&WEBHOOK_ID, &webhook_id);
        let p = Paypal::new(
            &webhook_id,
            settings.cert_url_prefixes.as_deref(),
            Window {
                max_age_secs: settings.max_age_secs.unwrap_or(DEFAULT_MAX_AGE_SECS),
                future_skew_secs: settings
                    .future_skew_secs
                    .unwrap_or(DEFAULT_FUTURE_SKEW_SECS),
            },
        )
        .map_err(|e| setup.setting(e))?;
        let p = match settings.confirm.as_deref().unwrap_or(CONFIRM_OFFLINE) {
            // Offline, the API's credentials serve the reconciliation alone:
            // both or neither.
            CONFIRM_OFFLINE => match api {
                (None, None, None) => p,
                (url, Some(client_id), Some(client_secret)) => {
                    let mut p = p;
                    p.with_api(ApiSettings {
                        api_url: url.unwrap_or_else(|| DEFAULT_API_URL.to_owned()),
                        client_id,
                        client_secret,
                    })
                    .map_err(|e| setup.setting(e))?;
                    p
                }
                (_, None, _) => {
                    return Err(setup.error(
                        "client_id",
                        "required with client_secret or api_url (the REST app's client id)",
                    ))
                }
                (_, Some(_), None) => {
                    return Err(setup.error(
                        "client_secret",
                        "required with client_id (the REST app's secret)",
                    ))
                }
            },
            CONFIRM_API => p
                .with_api_confirm(ApiSettings {
                    api_url: api.0.unwrap_or_else(|| DEFAULT_API_URL.to_owned()),
                    client_id: setup.required(
                        api.1,
                        "client_id",
                        "the REST app's client id, with confirm = \"api\"",
                    )?,
                    client_secret: setup.required(
                        api.2,
                        "client_secret",
                        "the REST app's secret, with confirm = \"api\"",
                    )?,
                })
                .map_err(|e| setup.setting(e))?,
            other => {
                return Err(setup.error(
                    "confirm",
                    format!("`{other}` is not one of {CONFIRM_OFFLINE} | {CONFIRM_API}"),
                ))
            }
        };
        if p.allows_plain_http() {
            setup.warn("cert_url_prefixes or api_url is http://: PayPal reached without TLS (for a local test server only)");
        }
        Ok(p)
    }

    fn psp_event_id(_headers: &http::HeaderMap, body: &[u8]) -> Option<String> {
        event_id(body)
    }

    /// Verifies (fetching the certificate when it is not cached), then maps.
    async fn accept(
        &self,
        provider: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Vec<Item>, Reject> {
        self.verify(headers, body, now).await?;
        Ok(vec![parse_event(provider, body)?])
    }

    /// The transmission id of a delivery [`Paypal::verify`] accepted, with
    /// the SHA-256 of its body and how long the binding must be kept: until
    /// its time leaves the window (after that it is refused on its time
    /// alone), plus the skew allowed between clocks. `None` when the headers
    /// are not those of a verified delivery.
    fn transmission(&self, headers: &http::HeaderMap, body: &[u8]) -> Option<TransmissionKey> {
        use sha2::{Digest, Sha256};
        let id = signed_header(headers, TRANSMISSION_ID_HEADER).ok()?;
        let sent =
            transmission_time(signed_header(headers, TRANSMISSION_TIME_HEADER).ok()?).ok()?;
        let keep = self.window.max_age_secs + self.window.future_skew_secs;
        let expires_at =
            OffsetDateTime::from_unix_timestamp(sent.checked_add(keep as i64)?).ok()?;
        Some(TransmissionKey {
            id: id.to_owned(),
            body_sha256: hex::encode(Sha256::digest(body)),
            expires_at,
        })
    }

    fn confirms(&self) -> bool {
        self.confirms_with_api()
    }

    fn events_api(&self) -> EventsApi {
        match self.api {
            Some(_) => EventsApi::Ready,
            None => EventsApi::NoCredentials,
        }
    }

    async fn list_events(&self, window: scheme::Window) -> Result<Vec<Listed>, ApiError> {
        match &self.api {
            Some(api) => api.events(window).await,
            None => Ok(Vec::new()),
        }
    }

    fn map_listed(&self, provider: &str, listed: &Listed) -> Result<Vec<Item>, Reject> {
        Ok(vec![parse_event(provider, &listed.body)?])
    }

    /// In the fetch-to-confirm mode, checks `item` (what `body` mapped to)
    /// against PayPal's API; nothing to do otherwise.
    async fn confirm(&self, provider: &str, body: &[u8], item: &Item) -> Result<(), Reject> {
        match &self.confirm {
            Some(api) => confirm_with(api, provider, body, item).await,
            None => Ok(()),
        }
    }

    #[cfg(any(test, feature = "test-support"))]
    fn preload_certificate(&self, url: &str, pem: &[u8]) -> Option<Result<(), String>> {
        Some(self.preload(url, pem))
    }

    fn check(psp: &dyn Credentials) -> Result<(), PspError> {
        psp.signer()
            .and(psp.key(&WEBHOOK_ID))
            .and(psp.key(&CERT_URL))
            .map(drop)
    }

    /// An event built from `notice`, or a body of your own, signed for the
    /// provider's webhook id with the certificate at `--cert-url`.
    fn deliver(
        psp: &dyn Credentials,
        notice: &Notice,
        body: Option<&str>,
        delivery_id: &str,
        ts: i64,
    ) -> Result<Delivery, String> {
        let webhook_id = psp.key(&WEBHOOK_ID)?;
        let cert_url = psp.key(&CERT_URL)?;
        let signer = psp.signer()?;
        let body = match body {
            Some(b) => b.to_owned(),
            None => event_of(notice, delivery_id, ts)?.to_string(),
        };
        let transmission_id = uuid::Uuid::new_v4().to_string();
        let time = psp::rfc3339(ts, 0)?;
        let signature = sign(signer, &transmission_id, &time, webhook_id, body.as_bytes());
        Ok(Delivery {
            body,
            content_type: JSON,
            headers: vec![
                (TRANSMISSION_ID_HEADER, transmission_id),
                (TRANSMISSION_TIME_HEADER, time),
                (TRANSMISSION_SIG_HEADER, signature),
                (CERT_URL_HEADER, cert_url.to_owned()),
                (AUTH_ALGO_HEADER, AUTH_ALGO.to_owned()),
            ],
        })
    }
}

async fn fetch(fetcher: &Fetcher, url: &str) -> Result<Arc<CertificateInfo>, Reject> {
    let unavailable = |why: String| Reject::Unavailable(format!("PAYPAL-CERT-URL: {why}"));
    let uri: http::Uri = url
        .parse()
        .map_err(|_| Reject::Unauthorized("PAYPAL-CERT-URL is not a URL".to_owned()))?;
    let req = http::Request::get(uri)
        .header(http::header::USER_AGENT, "fencehook")
        .body(Full::new(Bytes::new()))
        .map_err(|e| unavailable(e.to_string()))?;
    let (status, body) = fetcher.call(req).await.map_err(unavailable)?;
    if status != http::StatusCode::OK {
        return Err(unavailable(format!("answered {status}")));
    }
    let cert = CertificateInfo::parse(&body).map_err(|e| {
        Reject::Unauthorized(format!("PAYPAL-CERT-URL serves no usable certificate: {e}"))
    })?;
    Ok(Arc::new(cert))
}

/// In the fetch-to-confirm mode: the delivered event, fetched by its id from
/// PayPal's API, must map to exactly what was delivered (`delivered`, what
/// `body` mapped to): the same event id and `event_type`, and the same
/// resource id, amount, currency and parent capture. Unauthorized when
/// PayPal knows no such event or knows it otherwise; unavailable when
/// PayPal's API could not be asked.
async fn confirm_with(
    api: &Api,
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
    let fetched = api.event(id).await?;
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

/// What an item books, without `occurred_at` (a time PayPal may restate).
fn booked(item: &Item) -> Item {
    match item {
        Item::Event(e) => Item::Event(CanonicalEvent {
            occurred_at: None,
            merchant_reference: None,
            ..e.clone()
        }),
        other => other.clone(),
    }
}

/// `PAYPAL-TRANSMISSION-TIME` (RFC 3339, as PayPal sends it) in unix seconds.
fn transmission_time(time: &str) -> Result<i64, Reject> {
    OffsetDateTime::parse(time, &Rfc3339)
        .map(OffsetDateTime::unix_timestamp)
        .map_err(|_| {
            Reject::Unauthorized("PAYPAL-TRANSMISSION-TIME is not an RFC 3339 time".to_owned())
        })
}

/// `{transmission_id}|{transmission_time}|{webhook_id}|{crc32}`: what PayPal signs.
pub fn signed_message(transmission_id: &str, time: &str, webhook_id: &str, body: &[u8]) -> String {
    format!(
        "{transmission_id}|{time}|{webhook_id}|{}",
        crc32fast::hash(body)
    )
}

/// The `PAYPAL-TRANSMISSION-SIG` of a delivery, signed as PayPal signs.
pub fn sign(
    signer: &RsaSigner,
    transmission_id: &str,
    time: &str,
    webhook_id: &str,
    body: &[u8],
) -> String {
    signer.sign_base64(signed_message(transmission_id, time, webhook_id, body).as_bytes())
}

/// The event's own id (`id`, `WH-…`), kept beside inbox events.
pub fn event_id(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    value.get("id")?.as_str().map(str::to_owned)
}

/// Maps a verified event (see the module docs).
pub fn parse_event(provider: &str, body: &[u8]) -> Result<Item, Reject> {
    let value = fields::parse_json(body)?;
    let event = value
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object (a PayPal event)"))?;
    let event_type = req_str(event, "event_type", "event_type")?;
    let (kind, names_capture) = match event_type {
        "PAYMENT.CAPTURE.COMPLETED" => (EventKind::PaymentSucceeded, false),
        "PAYMENT.CAPTURE.DENIED" | "PAYMENT.CAPTURE.DECLINED" => (EventKind::PaymentFailed, false),
        "PAYMENT.CAPTURE.REFUNDED" => (EventKind::RefundSucceeded, true),
        "PAYMENT.CAPTURE.REVERSED" => (EventKind::DisputeFundsWithdrawn, true),
        _ => {
            return Ok(Item::Ignored {
                event_type: event_type.to_owned(),
            })
        }
    };
    let resource = req_object(event, "resource", "resource")?;
    let id = req_str(resource, "id", "resource.id")?;
    check_transaction_id(id)?;
    let amount = req_object(resource, "amount", "resource.amount")?;
    let currency = req_str(amount, "currency_code", "resource.amount.currency_code")?;
    check_currency(currency)?;
    let exponent = minor_unit_exponent(currency).ok_or_else(|| {
        invalid(format!(
            "resource.amount.currency_code {currency} has no minor unit known to fencehook"
        ))
    })?;
    let amount_minor = decimal_minor(
        req_str(amount, "value", "resource.amount.value")?,
        exponent,
        "resource.amount.value",
    )?;
    let parent = if names_capture {
        Some(up_capture(resource)?)
    } else {
        None
    };
    let when = match opt_str(resource, "update_time", "resource.update_time")? {
        Some(t) => Some((t, "resource.update_time")),
        None => opt_str(resource, "create_time", "resource.create_time")?
            .map(|t| (t, "resource.create_time"))
            .or(opt_str(event, "create_time", "create_time")?.map(|t| (t, "create_time"))),
    };
    let occurred_at = when
        .map(|(t, path)| {
            OffsetDateTime::parse(t, &Rfc3339)
                .map_err(|_| invalid(format!("{path} must be an RFC 3339 timestamp")))
        })
        .transpose()?;
    Ok(Item::Event(CanonicalEvent {
        provider: provider.to_owned(),
        transaction_id: id.to_owned(),
        event_type: kind,
        amount_minor,
        currency: currency.to_owned(),
        parent_transaction_id: parent,
        occurred_at,
        merchant_reference: fields::merchant_reference(resource, "custom_id")
            .or_else(|| fields::merchant_reference(resource, "invoice_id")),
        metadata: None,
    }))
}

/// The capture id of a refund's `links[rel=up]`: the last segment of
/// `…/v2/payments/captures/{id}`.
fn up_capture(resource: &Object) -> Result<String, Reject> {
    const CAPTURES: &str = "/v2/payments/captures/";
    let links = match opt(resource, "links") {
        Some(Value::Array(links)) => links,
        Some(_) => return Err(invalid("resource.links must be an array")),
        None => {
            return Err(invalid(
                "resource.links is required (its `up` link names the capture)",
            ))
        }
    };
    let up = links
        .iter()
        .filter_map(Value::as_object)
        .find(|l| l.get("rel").and_then(Value::as_str) == Some("up"))
        .ok_or_else(|| invalid("resource.links has no `up` link to the capture"))?;
    let href = req_str(up, "href", "resource.links[up].href")?;
    let id = href
        .find(CAPTURES)
        .map(|at| &href[at + CAPTURES.len()..])
        .map(|rest| rest.split(['?', '#']).next().unwrap_or(""))
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .ok_or_else(|| {
            invalid("resource.links[up].href is not a /v2/payments/captures/{id} URL")
        })?;
    check_transaction_id(id)
        .map_err(|_| invalid("resource.links[up].href names no valid capture id"))?;
    Ok(id.to_owned())
}

/// A PayPal event of `notice` (v2 payments shapes, as the webhooks simulator
/// sends them): [`parse_event`]'s inverse. Amounts are written with the
/// currency's exponent; a refund and a reversal name their capture in an
/// `up` link. A canonical kind PayPal has no event for is refused; any other
/// `event_type` is sent verbatim, with a pending capture.
pub fn event_of(notice: &Notice, event_id: &str, ts: i64) -> Result<Value, String> {
    use serde_json::json;
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
    let when = psp::rfc3339(ts, 0)?;
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
        let capture_id = psp::parent(notice)?;
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
            return Err(psp::not_sent(Paypal::NAME, Paypal::SENDS, notice))
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

#[cfg(test)]
mod tests {
    use super::super::testkeys;
    use super::*;
    use proptest::prelude::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/paypal");
    const PROD_CERT_URL: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-1a5f47cb";
    const TEST_CERT_URL: &str = "https://api.paypal.com/v1/notifications/certs/CERT-fencehook-test";
    const WEBHOOK_ID: &str = "WH-FENCEHOOK-TEST";
    const NOW: i64 = 1_700_000_000;

    fn read(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    #[test]
    fn the_merchant_reference_is_custom_id_else_invoice_id() {
        let reference = |name: &str| match parse_event("paypal", &read(name)) {
            Ok(Item::Event(e)) => e.merchant_reference,
            other => panic!("{name}: {other:?}"),
        };
        // Both set: custom_id, the merchant's own.
        assert_eq!(
            reference("capture_declined.body.json").as_deref(),
            Some("CUSTOMID-1001")
        );
        assert_eq!(
            reference("capture_completed.body.json").as_deref(),
            Some("5840243-146")
        );
        assert_eq!(reference("capture_refunded.body.json"), None);
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn headers_of(map: &serde_json::Map<String, Value>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (name, value) in map {
            if let Ok(name) = http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()) {
                h.insert(name, value.as_str().unwrap().parse().unwrap());
            }
        }
        h
    }

    /// A provider that has test key 0's certificate cached at TEST_CERT_URL.
    fn paypal() -> Paypal {
        let p = Paypal::new(WEBHOOK_ID, None, Window::default()).unwrap();
        let cert = testkeys::certificate(
            0,
            "0A1B",
            "CN=messageverificationcerts.paypal.com",
            0,
            4_000_000_000,
        );
        p.preload(TEST_CERT_URL, cert.as_bytes()).unwrap();
        p
    }

    fn signed(key: usize, url: &str, body: &[u8]) -> http::HeaderMap {
        let id = "b2384410-f8d2-11e8-8f60-2b25b2c5c0f3";
        let time = &OffsetDateTime::from_unix_timestamp(NOW)
            .unwrap()
            .format(&Rfc3339)
            .unwrap();
        let mut h = http::HeaderMap::new();
        h.insert(TRANSMISSION_ID_HEADER, id.parse().unwrap());
        h.insert(TRANSMISSION_TIME_HEADER, time.parse().unwrap());
        h.insert(CERT_URL_HEADER, url.parse().unwrap());
        h.insert(AUTH_ALGO_HEADER, AUTH_ALGO.parse().unwrap());
        let sig = sign(&testkeys::signer(key), id, time, WEBHOOK_ID, body);
        h.insert(TRANSMISSION_SIG_HEADER, sig.parse().unwrap());
        h
    }

    fn summary(item: &Item) -> (&str, EventKind, Option<&str>, i64, &str) {
        match item {
            Item::Event(e) => (
                &e.transaction_id,
                e.event_type,
                e.parent_transaction_id.as_deref(),
                e.amount_minor,
                &e.currency,
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn five_real_deliveries_verify_with_paypals_production_certificate() {
        // Traktormaster/paypal2 paypal2_tests/const.py: simulator deliveries
        // (webhook id WEBHOOK_ID) signed with PayPal's 2024 certificate.
        let p = Paypal::new("WEBHOOK_ID", None, Window::default()).unwrap();
        p.preload(PROD_CERT_URL, &read("CERT-360caa42-fca2a594-1a5f47cb.pem"))
            .unwrap();
        type Expected<'a> = Option<(&'a str, EventKind, Option<&'a str>, i64, &'a str)>;
        let cases: [(&str, Expected); 5] = [
            (
                "capture_completed",
                Some((
                    "12A34567BC123456S",
                    EventKind::PaymentSucceeded,
                    None,
                    3000,
                    "USD",
                )),
            ),
            (
                "capture_refunded",
                Some((
                    "1Y107995YT783435V",
                    EventKind::RefundSucceeded,
                    Some("0JF852973C016714D"),
                    99,
                    "USD",
                )),
            ),
            (
                "capture_reversed",
                Some((
                    "09E71677NS257044M",
                    EventKind::DisputeFundsWithdrawn,
                    Some("4L335234718889942"),
                    251,
                    "USD",
                )),
            ),
            (
                "capture_declined",
                Some((
                    "7U133281TB3277326",
                    EventKind::PaymentFailed,
                    None,
                    18510,
                    "USD",
                )),
            ),
            ("capture_pending", None),
        ];
        for (name, expected) in cases {
            let body = read(&format!("{name}.body.json"));
            let h = headers_of(
                &serde_json::from_slice(&read(&format!("{name}.headers.json"))).unwrap(),
            );
            let time = h[TRANSMISSION_TIME_HEADER].to_str().unwrap();
            let at = OffsetDateTime::parse(time, &Rfc3339)
                .unwrap()
                .unix_timestamp();
            let items = block_on(p.accept("paypal", &h, &body, at))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            match expected {
                Some(e) => assert_eq!(summary(&items[0]), e, "{name}"),
                None => assert!(matches!(items[0], Item::Ignored { .. }), "{name}"),
            }
            // Another webhook id, another body, or after the certificate expired: refused.
            let other = Paypal::new("WH-OTHER", None, Window::default()).unwrap();
            other
                .preload(PROD_CERT_URL, &read("CERT-360caa42-fca2a594-1a5f47cb.pem"))
                .unwrap();
            assert!(block_on(other.verify(&h, &body, at)).is_err(), "{name}");
            let mut tampered = body.clone();
            tampered.push(b'\n');
            assert!(block_on(p.verify(&h, &tampered, at)).is_err(), "{name}");
            assert!(
                block_on(p.verify(&h, &body, 1_741_478_400)).is_err(),
                "{name}: expired"
            );
        }
    }

    #[test]
    fn the_java_sdks_sandbox_vector_verifies() {
        // paypal/PayPal-Java-SDK ValidateCertTest: body, headers, webhook id, certificate.
        let dir = "sdk_vector_paypal_java";
        let body = read(&format!("{dir}/body.json"));
        let map: serde_json::Map<String, Value> =
            serde_json::from_slice(&read(&format!("{dir}/headers.json"))).unwrap();
        let h = headers_of(&map);
        let url = h[CERT_URL_HEADER].to_str().unwrap().to_owned();
        let p = Paypal::new("96605875FF6516633", None, Window::default()).unwrap();
        p.preload(&url, &read(&format!("{dir}/testClientCert.crt")))
            .unwrap();
        // 2017-03-30, within the certificate's validity.
        let at = 1_490_904_245;
        let items = block_on(p.accept("paypal", &h, &body, at)).unwrap();
        assert!(
            matches!(&items[0], Item::Ignored { event_type } if event_type == "BILLING.PLAN.CREATED")
        );
    }

    #[test]
    fn the_constructed_denied_capture_is_a_failed_payment() {
        let body = read("capture_denied.CONSTRUCTED.body.json");
        let p = paypal();
        let items =
            block_on(p.accept("paypal", &signed(0, TEST_CERT_URL, &body), &body, NOW)).unwrap();
        assert_eq!(summary(&items[0]).1, EventKind::PaymentFailed);
    }

    #[test]
    fn bad_headers_urls_algorithms_and_keys_are_401_before_any_fetch() {
        let p = paypal();
        let body = read("capture_completed.body.json");
        let good = signed(0, TEST_CERT_URL, &body);
        assert!(block_on(p.verify(&good, &body, NOW)).is_ok());
        let mut cases = Vec::new();
        for name in [
            TRANSMISSION_ID_HEADER,
            TRANSMISSION_TIME_HEADER,
            TRANSMISSION_SIG_HEADER,
            CERT_URL_HEADER,
            AUTH_ALGO_HEADER,
        ] {
            let mut h = good.clone();
            h.remove(name);
            cases.push((name.to_owned(), h));
        }
        for (name, value) in [
            (AUTH_ALGO_HEADER, "SHA1withRSA"),
            (AUTH_ALGO_HEADER, "sha256withrsa"),
            (TRANSMISSION_SIG_HEADER, "%%%"),
            (
                CERT_URL_HEADER,
                "https://api.paypal.com.example.org/v1/notifications/certs/x",
            ),
            (
                CERT_URL_HEADER,
                "http://api.paypal.com/v1/notifications/certs/x",
            ),
            (
                CERT_URL_HEADER,
                "https://evil.example/https://api.paypal.com/",
            ),
            (CERT_URL_HEADER, "file:///etc/passwd"),
            (TRANSMISSION_ID_HEADER, "another-transmission"),
        ] {
            let mut h = good.clone();
            h.insert(name, value.parse().unwrap());
            cases.push((format!("{name}: {value}"), h));
        }
        cases.push(("an unknown key".into(), signed(1, TEST_CERT_URL, &body)));
        for (name, h) in cases {
            assert!(
                matches!(
                    block_on(p.verify(&h, &body, NOW)),
                    Err(Reject::Unauthorized(_))
                ),
                "{name}"
            );
        }
    }

    #[test]
    fn a_transmission_time_outside_the_window_is_401_and_inside_it_binds_until_it_leaves() {
        let p = paypal();
        let body = read("capture_completed.body.json");
        let h = signed(0, TEST_CERT_URL, &body);
        let max_age = DEFAULT_MAX_AGE_SECS as i64;
        let skew = DEFAULT_FUTURE_SKEW_SECS as i64;
        // Signed at NOW: verified from `skew` before it to `max_age` after it.
        for now in [NOW - skew, NOW, NOW + max_age] {
            assert!(block_on(p.verify(&h, &body, now)).is_ok(), "{now}");
        }
        for now in [NOW - skew - 1, NOW + max_age + 1] {
            assert!(
                matches!(
                    block_on(p.verify(&h, &body, now)),
                    Err(Reject::Unauthorized(_))
                ),
                "{now}"
            );
        }
        let mut garbled = h.clone();
        garbled.insert(TRANSMISSION_TIME_HEADER, "yesterday".parse().unwrap());
        assert!(matches!(
            block_on(p.verify(&garbled, &body, NOW)),
            Err(Reject::Unauthorized(_))
        ));
        let key = p.transmission(&h, &body).unwrap();
        assert_eq!(key.id, "b2384410-f8d2-11e8-8f60-2b25b2c5c0f3");
        assert_eq!(key.expires_at.unix_timestamp(), NOW + max_age + skew);
        let mut other = body.clone();
        other.push(b' ');
        assert_ne!(
            p.transmission(&h, &other).unwrap().body_sha256,
            key.body_sha256
        );
    }

    #[test]
    fn an_unreachable_certificate_is_503_and_remembered_without_a_new_fetch() {
        // A prefix that points at a closed local port: the fetch fails fast.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let prefix = format!("http://127.0.0.1:{port}/");
        let p = Paypal::new(
            WEBHOOK_ID,
            Some(std::slice::from_ref(&prefix)),
            Window::default(),
        )
        .unwrap();
        let body = read("capture_completed.body.json");
        let h = signed(0, &format!("{prefix}certs/1"), &body);
        assert!(matches!(
            block_on(p.verify(&h, &body, NOW)),
            Err(Reject::Unavailable(_))
        ));
        let e = p.cache.entries.lock().unwrap();
        assert!(e.cells.is_empty(), "no certificate kept");
        assert!(
            e.failed.contains_key(&format!("{prefix}certs/1")),
            "the failure is"
        );
    }

    #[test]
    fn prefixes_must_pin_a_host() {
        for bad in [
            "https://api.paypal.com",
            "ftp://api.paypal.com/",
            "https://user@api.paypal.com/",
            "https:///",
            "api.paypal.com/",
        ] {
            assert!(
                Paypal::new(WEBHOOK_ID, Some(&[bad.to_owned()]), Window::default()).is_err(),
                "{bad}"
            );
        }
        assert!(Paypal::new(WEBHOOK_ID, Some(&[]), Window::default()).is_err());
        assert!(Paypal::new("", None, Window::default()).is_err());
        assert!(Paypal::new(
            WEBHOOK_ID,
            Some(&["http://127.0.0.1:8181/certs/".to_owned()]),
            Window::default()
        )
        .is_ok());
    }

    fn event(event_type: &str, resource: Value) -> Vec<u8> {
        serde_json::json!({"id": "WH-1", "event_type": event_type, "resource_type": "capture",
            "create_time": "2024-08-02T19:35:04Z", "resource": resource})
        .to_string()
        .into_bytes()
    }

    fn capture(value: &str, currency: &str) -> Value {
        serde_json::json!({"id": "5O190127TN364715T", "status": "COMPLETED",
            "amount": {"currency_code": currency, "value": value}})
    }

    #[test]
    fn amounts_use_the_currencys_exponent_exactly() {
        for (value, currency, minor) in [
            ("30.00", "USD", 3000),
            ("1234", "JPY", 1234),
            ("1.234", "KWD", 1234),
            ("100", "HUF", 10_000),
            ("0.5", "EUR", 50),
        ] {
            let item = parse_event(
                "paypal",
                &event("PAYMENT.CAPTURE.COMPLETED", capture(value, currency)),
            )
            .unwrap();
            assert_eq!(summary(&item).3, minor, "{value} {currency}");
        }
        for (value, currency) in [
            ("20.001", "USD"),
            ("1e2", "USD"),
            ("-1", "USD"),
            ("1,00", "USD"),
            ("12.5", "JPY"),
            ("1.2345", "KWD"),
            ("10.00", "XYZ"),
            ("10.00", "usd"),
            ("0.00", "USD"),
        ] {
            assert!(
                matches!(
                    parse_event(
                        "paypal",
                        &event("PAYMENT.CAPTURE.COMPLETED", capture(value, currency))
                    ),
                    Err(Reject::Invalid(_))
                ),
                "{value} {currency}"
            );
        }
    }

    #[test]
    fn a_refund_must_name_its_capture_in_an_up_link() {
        let refund = |links: Value| {
            serde_json::json!({"id": "1Y107995YT783435V", "status": "COMPLETED",
                "amount": {"currency_code": "USD", "value": "0.99"}, "links": links})
        };
        let ok = refund(serde_json::json!([
            {"href": "https://api.paypal.com/v2/payments/refunds/1Y107995YT783435V", "rel": "self"},
            {"href": "https://api.paypal.com/v2/payments/captures/0JF852973C016714D", "rel": "up"}
        ]));
        let item = parse_event("paypal", &event("PAYMENT.CAPTURE.REFUNDED", ok)).unwrap();
        assert_eq!(summary(&item).2, Some("0JF852973C016714D"));
        for links in [
            serde_json::json!([]),
            serde_json::json!("up"),
            serde_json::json!([{"href": "https://api.paypal.com/v2/checkout/orders/1AB", "rel": "up"}]),
            serde_json::json!([{"href": "https://api.paypal.com/v2/payments/captures/", "rel": "up"}]),
            serde_json::json!([{"href": "https://api.paypal.com/v2/payments/captures/A/B", "rel": "up"}]),
            serde_json::json!([{"href": 5, "rel": "up"}]),
        ] {
            assert!(
                matches!(
                    parse_event(
                        "paypal",
                        &event("PAYMENT.CAPTURE.REFUNDED", refund(links.clone()))
                    ),
                    Err(Reject::Invalid(_))
                ),
                "{links}"
            );
        }
    }

    const PAYPAL_KEYS: &[&str] = &[
        "id",
        "amount",
        "currency_code",
        "value",
        "links",
        "href",
        "rel",
        "status",
        "update_time",
        "create_time",
    ];

    proptest! {
        #[test]
        fn verify_and_map_never_panic(
            headers in proptest::collection::vec(
                (prop::sample::select(vec![TRANSMISSION_ID_HEADER, TRANSMISSION_TIME_HEADER,
                    TRANSMISSION_SIG_HEADER, CERT_URL_HEADER, AUTH_ALGO_HEADER]),
                 prop_oneof![Just(TEST_CERT_URL.to_owned()), Just(AUTH_ALGO.to_owned()), "[ -~]{0,80}"]),
                0..6,
            ),
            body in proptest::collection::vec(any::<u8>(), 0..512),
            now in any::<i64>(),
        ) {
            let p = paypal();
            let mut h = http::HeaderMap::new();
            for (name, value) in headers {
                if let Ok(v) = value.parse() {
                    h.insert(name, v);
                }
            }
            let _ = block_on(p.accept("paypal", &h, &body, now));
            let _ = parse_event("paypal", &body);
        }

        #[test]
        fn signed_arbitrary_events_never_panic(
            event_type in prop::sample::select(vec!["PAYMENT.CAPTURE.COMPLETED",
                "PAYMENT.CAPTURE.DENIED", "PAYMENT.CAPTURE.REFUNDED", "PAYMENT.CAPTURE.REVERSED",
                "PAYMENT.CAPTURE.PENDING"]),
            resource in crate::providers::testing::arbitrary_json(PAYPAL_KEYS),
        ) {
            let p = paypal();
            let body = event(event_type, resource);
            let h = signed(0, TEST_CERT_URL, &body);
            prop_assert!(block_on(p.verify(&h, &body, NOW)).is_ok());
            let _ = block_on(p.accept("paypal", &h, &body, NOW));
        }
    }
}

/// The PSP side and the parser together: what the one builds and signs, the
/// other verifies and maps back to the canonical event it was built from.
#[cfg(test)]
mod round_trip {
    use proptest::prelude::*;

    use super::*;
    use crate::providers::testing::{at, events, round_trip, round_trip_config, TestCredentials};
    use crate::providers::testkeys;
    use std::sync::LazyLock;

    const WEBHOOK_ID: &str = "WH-ROUND-TRIP";
    const CERT_URL: &str = "https://api.paypal.com/v1/notifications/certs/CERT-round-trip";

    /// Test key 0 plays PayPal; its certificate is cached at CERT_URL.
    static SIDES: LazyLock<(Paypal, TestCredentials)> = LazyLock::new(|| {
        let scheme = Paypal::new(WEBHOOK_ID, None, Window::default()).unwrap();
        let cert = testkeys::certificate(
            0,
            "0ABC",
            "CN=messageverificationcerts.paypal.com",
            0,
            4_000_000_000,
        );
        scheme.preload(CERT_URL, cert.as_bytes()).unwrap();
        let psp = TestCredentials::new(
            &[(super::WEBHOOK_ID, WEBHOOK_ID), (super::CERT_URL, CERT_URL)],
            Some(testkeys::signer(0)),
        );
        (scheme, psp)
    });

    /// PayPal's ids: capture and refund ids are upper-case letters and
    /// digits (a refund names its capture in a URL path).
    fn paypal_ids() -> impl Strategy<Value = String> + Clone {
        "[A-Z0-9]{1,20}"
    }

    /// Every currency whose minor unit is known, of 0, 2 and 3 decimals.
    fn currencies() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["JPY", "KRW", "USD", "EUR", "GBP", "CNY", "KWD", "BHD"])
            .prop_map(str::to_owned)
    }

    proptest! {
        #![proptest_config(round_trip_config())]

        #[test]
        fn a_canonical_event_built_and_signed_as_the_psp_sends_it_maps_back_to_itself(
            event in events(Paypal::SENDS, paypal_ids(), i64::MAX, currencies()),
            ts in 1_000_000_000i64..4_000_000_000,
        ) {
            let (scheme, psp) = &*SIDES;
            // The resource's update_time.
            let event = CanonicalEvent { occurred_at: at(ts), ..event };
            prop_assert_eq!(round_trip(scheme, psp, &event, ts)?, event);
        }
    }
}
