//! Fetching from a PSP's servers while a delivery waits: PayPal's signing
//! certificates and its REST API today, and what any scheme must ask its
//! PSP for before it can book (an object a notification only names).
//!
//! Anyone can send a delivery, so what a stranger can make these fetches
//! cost is bounded, per provider: a few in flight at once (a delivery that
//! finds no slot free is answered 503 at once: the PSP retries), each within
//! a time (connection included) and a size, no redirect followed (hyper's
//! client follows none), and only under a base URL that pins the scheme and
//! the host ([`check_base`]).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::outbound::{self, HttpsClient};

/// One provider's fetches from its PSP: its client and its bounds.
pub struct Fetcher {
    client: HttpsClient,
    slots: Semaphore,
    timeout: Duration,
    max_bytes: usize,
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
        })
    }

    /// A fetch slot, when one is free now; held for as long as the fetch
    /// (or the fetches it covers) runs.
    pub fn try_slot(&self) -> Option<SemaphorePermit<'_>> {
        self.slots.try_acquire().ok()
    }

    /// The status and body of `req`'s answer, within the fetcher's time and
    /// size; the error says what failed (never a secret: no header is shown).
    pub async fn call(
        &self,
        req: http::Request<Full<Bytes>>,
    ) -> Result<(http::StatusCode, Bytes), String> {
        tokio::time::timeout(self.timeout, async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| crate::report::chain(&e))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), self.max_bytes)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            Ok((status, body))
        })
        .await
        .map_err(|_| format!("no answer within {:?}", self.timeout))?
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
}
