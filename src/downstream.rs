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

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use crate::outbound::{self, HttpClient};

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
    client: HttpClient,
    url: hyper::Uri,
    timeout: Duration,
    metrics: Metrics,
}

impl Downstream {
    pub fn new(url: hyper::Uri, timeout: Duration, metrics: Metrics) -> Downstream {
        Downstream {
            client: outbound::new(timeout),
            url,
            timeout,
            metrics,
        }
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
        let body = serde_json::to_vec(ev).expect("canonical events serialize");
        let mut req = hyper::Request::post(self.url.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", idempotency_key(ev))
            .header("Fencing-Token", token.to_string())
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| DownstreamError::Transport(e.into()))?;
        // `traceparent` names this call's client span: the order service's
        // spans join the delivery's trace.
        propagation::inject(req.headers_mut());
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
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
