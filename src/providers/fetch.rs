//! Fetching from a PSP's servers while a delivery waits: PayPal's signing
//! certificates and its REST API today, and what any scheme must ask its
//! PSP for before it can book (an object a notification only names).
//!
//! Anyone can send a delivery, so what a stranger can make these fetches
//! cost is bounded, per provider: a few in flight at once, each within a
//! time (connection included) and a size, no redirect followed (hyper's
//! client follows none), and only under a base URL that pins the scheme and
//! the host ([`check_base`]). A delivery that finds every slot taken either
//! is answered 503 at once ([`Fetcher::try_slot`]: PayPal's certificates,
//! where one stranger's URL should not queue behind another's) or waits its
//! turn for at most the fetch timeout, then 503 ([`Fetcher::slot`]: a
//! fetch-first scheme, whose every genuine notification needs a fetch; the
//! queue is the semaphore's own, first come first served). Either way the
//! PSP's API never sees more than the bound at once, whatever a flood of
//! made-up notifications asks for.
//!
//! Each fetch is counted by result (`fencehook_fetches_total`) once the
//! service has given the fetcher its provider's counters
//! ([`Fetcher::count_into`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::outbound::{self, HttpsClient};

/// How a fetch from a PSP's API ended (`fencehook_fetches_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FetchResult {
    /// Answered 2xx.
    Ok,
    /// Answered 404: the PSP knows no such object.
    NotFound,
    /// Answered another status, or the connection or the answer failed.
    Error,
    /// No answer within the fetch timeout.
    Timeout,
    /// Not fetched: every slot stayed taken for the fetch timeout.
    Busy,
}

impl FetchResult {
    pub const ALL: &'static [FetchResult] = &[
        FetchResult::Ok,
        FetchResult::NotFound,
        FetchResult::Error,
        FetchResult::Timeout,
        FetchResult::Busy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FetchResult::Ok => "ok",
            FetchResult::NotFound => "not_found",
            FetchResult::Error => "error",
            FetchResult::Timeout => "timeout",
            FetchResult::Busy => "busy",
        }
    }
}

/// One provider's fetch counters, one per [`FetchResult`], made by the
/// service's metrics (`fencehook_fetches_total{provider,result}`).
#[derive(Clone)]
pub struct FetchCounts {
    /// In [`FetchResult::ALL`]'s order.
    by_result: Arc<[metrics::Counter]>,
}

impl FetchCounts {
    /// The counters `counter` gives for each result.
    pub fn new(counter: impl Fn(FetchResult) -> metrics::Counter) -> FetchCounts {
        FetchCounts {
            by_result: FetchResult::ALL.iter().map(|&r| counter(r)).collect(),
        }
    }

    fn count(&self, result: FetchResult) {
        let i = FetchResult::ALL
            .iter()
            .position(|&r| r == result)
            .expect("every result is in ALL");
        self.by_result[i].increment(1);
    }
}

/// One provider's fetches from its PSP: its client and its bounds.
pub struct Fetcher {
    client: HttpsClient,
    slots: Semaphore,
    timeout: Duration,
    max_bytes: usize,
    /// Set once, by the service that serves the provider; tools that build
    /// providers count nothing.
    counts: OnceLock<FetchCounts>,
}

impl Fetcher {
    /// At most `in_flight` fetches at once, each answered within `timeout`
    /// with at most `max_bytes`. The error is a sentence for the caller to
    /// prefix with the setting it serves.
    pub fn new(in_flight: usize, timeout: Duration, max_bytes: usize) -> Result<Fetcher, String> {
        Ok(Fetcher {
            client: outbound::https(timeout)?,
            slots: Semaphore::new(in_flight),
            timeout,
            max_bytes,
            counts: OnceLock::new(),
        })
    }

    /// Counts this fetcher's fetches into `counts` from now on (the first
    /// call wins: a provider is served by one service).
    pub fn count_into(&self, counts: FetchCounts) {
        let _ = self.counts.set(counts);
    }

    fn count(&self, result: FetchResult) {
        if let Some(counts) = self.counts.get() {
            counts.count(result);
        }
    }

    /// The longest one call may take, connection included; also the longest
    /// [`Fetcher::slot`] waits.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A fetch slot, when one is free now; held for as long as the fetch
    /// (or the fetches it covers) runs.
    pub fn try_slot(&self) -> Option<SemaphorePermit<'_>> {
        self.slots.try_acquire().ok()
    }

    /// A fetch slot, waiting for one (in arrival order) for at most the
    /// fetch timeout; `None` (counted `busy`) when none came free. Held for
    /// as long as the fetches it covers run.
    pub async fn slot(&self) -> Option<SemaphorePermit<'_>> {
        match tokio::time::timeout(self.timeout, self.slots.acquire()).await {
            Ok(Ok(permit)) => Some(permit),
            // Timed out, or closed (never: no one closes it).
            _ => {
                self.count(FetchResult::Busy);
                None
            }
        }
    }

    /// The status and body of `req`'s answer, within the fetcher's time and
    /// size; the error says what failed (never a secret: no header is shown).
    pub async fn call(
        &self,
        req: http::Request<Full<Bytes>>,
    ) -> Result<(http::StatusCode, Bytes), String> {
        let answered = self.exchange(req).await;
        self.count(match &answered {
            Ok((status, _, _)) if status.is_success() => FetchResult::Ok,
            Ok((http::StatusCode::NOT_FOUND, _, _)) => FetchResult::NotFound,
            Err(e) if e.starts_with(NO_ANSWER) => FetchResult::Timeout,
            _ => FetchResult::Error,
        });
        answered.map(|(status, _, body)| (status, body))
    }

    /// A request of a run that lists a PSP's events (the reconciliation):
    /// waits for a slot rather than refusing (nobody is waiting for an
    /// answer), and retries what the PSP asks to be retried: a 429 after its
    /// `Retry-After` (at most [`MAX_RETRY_AFTER`]), a 5xx, a timeout or a
    /// failed connection after a doubling backoff; [`LIST_ATTEMPTS`] in all,
    /// then the run fails. `make` builds the request afresh for each try.
    pub async fn call_patiently(
        &self,
        make: impl Fn() -> Result<http::Request<Full<Bytes>>, String>,
    ) -> Result<Bytes, ApiError> {
        let mut backoff = LIST_BACKOFF;
        let mut last = ApiError::new(ApiFailure::Unavailable, "not tried");
        for attempt in 1..=LIST_ATTEMPTS {
            let answer = {
                let _slot =
                    self.slots.acquire().await.map_err(|_| {
                        ApiError::new(ApiFailure::Unavailable, "the fetcher is closed")
                    })?;
                self.exchange(make().map_err(|e| ApiError::new(ApiFailure::Malformed, e))?)
                    .await
            };
            let wait = match answer {
                Ok((status, _, body)) if status.is_success() => return Ok(body),
                Ok((status, headers, _)) if status == http::StatusCode::TOO_MANY_REQUESTS => {
                    last = ApiError::new(ApiFailure::RateLimited, format!("answered {status}"));
                    retry_after(&headers).unwrap_or(backoff)
                }
                Ok((status, _, _)) if status.is_server_error() => {
                    last = ApiError::new(ApiFailure::Unavailable, format!("answered {status}"));
                    backoff
                }
                Ok((status, _, _))
                    if matches!(status.as_u16(), 401 | 403) =>
                {
                    return Err(ApiError::new(
                        ApiFailure::Credentials,
                        format!("answered {status}: the API key (or client id and secret) is refused or lacks the permission"),
                    ))
                }
                Ok((status, _, body)) => {
                    let said = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                    return Err(ApiError::new(ApiFailure::Status, format!("answered {status}: {said}")));
                }
                Err(e) => {
                    let failure = if e.starts_with(NO_ANSWER) {
                        ApiFailure::Timeout
                    } else {
                        ApiFailure::Unavailable
                    };
                    last = ApiError::new(failure, e);
                    backoff
                }
            };
            if attempt < LIST_ATTEMPTS {
                tracing::warn!(failure = last.failure.as_str(), error = %last.why, attempt,
                    wait_ms = wait.as_millis() as u64, "PSP API: retrying");
                tokio::time::sleep(wait).await;
                backoff = (backoff * 2).min(MAX_RETRY_AFTER);
            }
        }
        Err(last)
    }

    /// The status, headers and body of `req`'s answer (see [`Fetcher::call`]).
    async fn exchange(
        &self,
        req: http::Request<Full<Bytes>>,
    ) -> Result<(http::StatusCode, http::HeaderMap, Bytes), String> {
        tokio::time::timeout(self.timeout, async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| crate::report::chain(&e))?;
            let status = resp.status();
            let headers = resp.headers().clone();
            let body = Limited::new(resp.into_body(), self.max_bytes)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            Ok((status, headers, body))
        })
        .await
        .map_err(|_| format!("{NO_ANSWER} {:?}", self.timeout))?
    }
}

/// How an error of a request that timed out begins.
const NO_ANSWER: &str = "no answer within";

/// Tries of one request of a listing run before the run fails.
pub const LIST_ATTEMPTS: u32 = 4;
/// The first wait after a failed try of a listing request; doubled each time.
pub const LIST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest a PSP's `Retry-After` (or the backoff) is waited for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// `Retry-After` in seconds (the form PSPs' APIs send), at most
/// [`MAX_RETRY_AFTER`].
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// Why a PSP's API could not be read: the kind (a metric's `reason`) and
/// what happened (never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {why}", failure.as_str())]
pub struct ApiError {
    pub failure: ApiFailure,
    pub why: String,
}

impl ApiError {
    pub fn new(failure: ApiFailure, why: impl Into<String>) -> ApiError {
        ApiError {
            failure,
            why: why.into(),
        }
    }
}

/// The kinds of [`ApiError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFailure {
    /// 401 or 403: the credentials are the operator's to fix.
    Credentials,
    /// 429 on every try.
    RateLimited,
    /// No answer in time on the last try.
    Timeout,
    /// A 5xx or a failed connection on the last try.
    Unavailable,
    /// Another 4xx: the request is wrong for this API.
    Status,
    /// The answer is not the API's documented shape.
    Malformed,
}

impl ApiFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            ApiFailure::Credentials => "credentials",
            ApiFailure::RateLimited => "rate_limited",
            ApiFailure::Timeout => "timeout",
            ApiFailure::Unavailable => "unavailable",
            ApiFailure::Status => "status",
            ApiFailure::Malformed => "malformed",
        }
    }
}

/// A base URL fetched under must be `http(s)://host[:port]/…`: ending the
/// host with `/` pins it (`https://api.paypal.com` alone would let
/// `https://api.paypal.com.example/` through).
pub fn check_base(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must start with https:// (or http:// for a local test server)")?;
    let host_end = rest
        .find('/')
        .ok_or("must end the host with / (e.g. https://api.paypal.com/)")?;
    let host = &rest[..host_end];
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
    {
        return Err("the host is not a plain host name (no user, no odd characters)".into());
    }
    Ok(())
}

/// A PSP API's base URL (`api_url`): `https://host[:port][/path]`, or plain
/// `http://` only to a loopback host (a test's mock of the PSP): an API key
/// sent in clear over a network is a key given away. The error is a
/// sentence for the caller to prefix with the setting.
pub fn check_api_url(url: &str) -> Result<(), String> {
    let with_slash = if url.ends_with('/') {
        url.to_owned()
    } else {
        format!("{url}/")
    };
    check_base(&with_slash)?;
    if let Some(rest) = url.strip_prefix("http://") {
        let authority = rest.split('/').next().unwrap_or_default();
        let host = match authority.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => authority,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Err(
                "must start with https:// (http:// only to a loopback host, for a test server)"
                    .into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_url_is_https_or_plain_http_to_loopback_only() {
        for ok in [
            "https://api.stripe.com",
            "https://api.stripe.com/",
            "http://127.0.0.1:4010",
            "http://localhost:1/",
            "http://[::1]:80",
        ] {
            assert_eq!(check_api_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://api.stripe.com",
            "http://10.0.0.1:80",
            "ftp://api.stripe.com",
            "https://user@api.stripe.com",
            "api.stripe.com",
        ] {
            assert!(check_api_url(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_slot_is_waited_for_up_to_the_timeout_in_arrival_order() {
        let fetcher = Fetcher::new(1, Duration::from_millis(200), 1024).unwrap();
        let held = fetcher.slot().await.expect("a free slot");
        assert!(fetcher.try_slot().is_none(), "try_slot does not wait");
        // Still held when the wait runs out: none.
        let started = std::time::Instant::now();
        assert!(fetcher.slot().await.is_none());
        assert!(started.elapsed() >= Duration::from_millis(200));
        // Given back while another waits: that one gets it.
        let waiting = fetcher.slot();
        let release = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(held);
        };
        let (got, ()) = tokio::join!(waiting, release);
        assert!(got.is_some());
    }
}
