//! The business step that leaves the database: POST the canonical
//! event to `FENCEHOOK_DOWNSTREAM_URL` with `Idempotency-Key` and
//! `Fencing-Token`. Only a 2xx counts; anything else leaves the payment
//! `processing` so the next delivery resumes it.
//!
//! The key names one business step — the object *and* the event applied to
//! it ([`idempotency_key`]) — because one object has several steps (a failure
//! then its success, a refund then its reversal), each with a body of its
//! own: a downstream that keys its deduplication on the object alone would
//! refuse the second step (another body under a known key) or answer it with
//! the first one's outcome without executing it.
//!
//! The call is a webhook the order service can trust: over `https://` the
//! downstream's certificate must verify (against
//! `FENCEHOOK_DOWNSTREAM_CA_FILE`, else the public CAs), and a certificate
//! that does not is a failed call like any unreachable downstream (503, or
//! an attempt spent), never a retry in plaintext: the TLS client speaks
//! nothing else. With `FENCEHOOK_DOWNSTREAM_SECRET` every call is signed as
//! a Standard Webhooks sender does ([`Signer`]): `webhook-id` is the
//! `Idempotency-Key`, so a retry of one step is one message to the order
//! service's verifier too. With no secret the call carries nothing more and
//! costs nothing more than before: one `Option` looked at.

use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use sha2::Sha256;

use crate::config::downstream::{DownstreamTrust, SigningKey};
use crate::outbound::{self, HttpClient, HttpsClient};

use crate::domain::CanonicalEvent;
use crate::metrics::{DownstreamResult, Metrics};
use crate::telemetry::{propagation, spans};
use tracing::Instrument;

#[derive(Debug, thiserror::Error)]
pub enum DownstreamError {
    #[error("downstream answered {status}")]
    Status {
        status: u16,
        /// The response's `Retry-After`, when it said when to come back.
        retry_after: Option<Duration>,
    },
    #[error("downstream did not answer within {0:?}")]
    Timeout(Duration),
    #[error("downstream unreachable")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
}

#[derive(Clone)]
pub struct Downstream {
    client: Client,
    url: hyper::Uri,
    timeout: Duration,
    metrics: Metrics,
    /// `None`: calls are not signed, and nothing is computed for it.
    signer: Option<Signer>,
}

/// Plain HTTP for an `http://` downstream (the client it always had), TLS
/// only for an `https://` one.
#[derive(Clone)]
enum Client {
    Plain(HttpClient),
    Tls(HttpsClient),
}

impl Downstream {
    /// The error is a sentence (the TLS set-up failed) for the caller to
    /// report.
    pub fn new(
        url: hyper::Uri,
        timeout: Duration,
        trust: &DownstreamTrust,
        metrics: Metrics,
    ) -> Result<Downstream, String> {
        let client = if url.scheme_str() == Some("https") {
            Client::Tls(outbound::https_only(timeout, trust.roots.clone())?)
        } else {
            Client::Plain(outbound::new(timeout))
        };
        Ok(Downstream {
            client,
            url,
            timeout,
            metrics,
            signer: trust.key.as_ref().map(Signer::new),
        })
    }

    pub async fn call(&self, ev: &CanonicalEvent, token: i64) -> Result<(), DownstreamError> {
        let started = std::time::Instant::now();
        let span = spans::downstream(&self.url, token);
        let result = self.send(ev, token).instrument(span.clone()).await;
        match &result {
            Ok(()) => spans::downstream_answered(&span, Some(200), None),
            Err(DownstreamError::Status { status, .. }) => {
                spans::downstream_answered(&span, Some(*status), None)
            }
            Err(DownstreamError::Timeout(_)) => {
                spans::downstream_answered(&span, None, Some("timeout"))
            }
            Err(DownstreamError::Transport(_)) => {
                spans::downstream_answered(&span, None, Some("transport"))
            }
        }
        self.metrics
            .downstream_duration()
            .record(started.elapsed().as_secs_f64());
        let label = match &result {
            Ok(()) => DownstreamResult::Ok,
            Err(DownstreamError::Timeout(_)) => DownstreamResult::Timeout,
            Err(_) => DownstreamResult::Error,
        };
        self.metrics.downstream(label).increment(1);
        result
    }

    async fn send(&self, ev: &CanonicalEvent, token: i64) -> Result<(), DownstreamError> {
        let body = Bytes::from(serde_json::to_vec(ev).expect("canonical events serialize"));
        let key = HeaderValue::try_from(idempotency_key(ev))
            .map_err(|e| DownstreamError::Transport(e.into()))?;
        let mut req = hyper::Request::post(self.url.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header("Fencing-Token", token.to_string());
        if let Some(signer) = &self.signer {
            let (timestamp, signature) = signer.sign(key.as_bytes(), unix_now(), &body);
            req = req
                .header(WEBHOOK_ID, key.clone())
                .header(WEBHOOK_TIMESTAMP, timestamp)
                .header(WEBHOOK_SIGNATURE, signature);
        }
        let mut req = req
            .header("Idempotency-Key", key)
            .body(Full::new(body))
            .map_err(|e| DownstreamError::Transport(e.into()))?;
        // `traceparent` names this call's client span: the order service's
        // spans join the delivery's trace.
        propagation::inject(req.headers_mut());
        let exchange = async {
            let resp = match &self.client {
                Client::Plain(c) => c.request(req).await,
                Client::Tls(c) => c.request(req).await,
            }
            .map_err(|e| DownstreamError::Transport(e.into()))?;
            let status = resp.status();
            let retry_after = resp
                .headers()
                .get(hyper::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| retry_after(v, std::time::SystemTime::now()));
            // Drain the body so the connection can be reused.
            let _ = resp.into_body().collect().await;
            if status.is_success() {
                Ok(())
            } else {
                Err(DownstreamError::Status {
                    status: status.as_u16(),
                    retry_after,
                })
            }
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| DownstreamError::Timeout(self.timeout))?
    }
}

impl DownstreamError {
    /// When the downstream asked to be called again, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            DownstreamError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// The Standard Webhooks headers of a signed call.
pub const WEBHOOK_ID: &str = "webhook-id";
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// Signs calls as a Standard Webhooks sender: `v1,` and the base64 of the
/// HMAC-SHA256, under the secret's key, of `<webhook-id>.<timestamp>.<body>`.
/// The key is taken into the HMAC once, at start; each call clones that
/// state.
#[derive(Clone)]
pub struct Signer(Hmac<Sha256>);

impl Signer {
    pub fn new(key: &SigningKey) -> Signer {
        Signer(Hmac::new_from_slice(key.bytes()).expect("HMAC takes keys of any length"))
    }

    /// (`webhook-timestamp`, `webhook-signature`) of `body` sent as `id` at
    /// `timestamp` (Unix seconds).
    pub fn sign(&self, id: &[u8], timestamp: i64, body: &[u8]) -> (String, String) {
        use base64::Engine as _;
        let timestamp = timestamp.to_string();
        let mut mac = self.0.clone();
        for part in [id, b".", timestamp.as_bytes(), b".", body] {
            mac.update(part);
        }
        let digest = mac.finalize().into_bytes();
        let mut signature = String::with_capacity(3 + 44);
        signature.push_str("v1,");
        base64::engine::general_purpose::STANDARD.encode_string(digest, &mut signature);
        (timestamp, signature)
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `<provider>:<transaction_id>:<event_type>`: one key per business step, so
/// one key always carries one body.
pub fn idempotency_key(ev: &CanonicalEvent) -> String {
    format!(
        "{}:{}:{}",
        ev.provider,
        ev.transaction_id,
        ev.event_type.as_str()
    )
}

/// A `Retry-After` value (RFC 9110: delay-seconds or an HTTP-date) as a wait
/// from `now`; `None` when it is neither. A date in the past means now.
pub fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for u64 is still "a very long time".
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn a_signature_is_v1_and_the_base64_hmac_of_id_timestamp_and_body() {
        // The example of the Standard Webhooks specification.
        let trust = crate::config::downstream::DownstreamArgs {
            downstream_ca_file: None,
            downstream_secret: Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
        }
        .validate(Some(&"https://orders.internal/".parse().unwrap()))
        .unwrap();
        let (ts, sig) = Signer::new(trust.key.as_ref().unwrap()).sign(
            b"msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(ts, "1614265330");
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470); // 2015-10-21 07:27:50 UTC
        assert_eq!(retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        for bad in ["", "-1", "soon"] {
            assert_eq!(retry_after(bad, now), None, "{bad:?}");
        }
    }
}
