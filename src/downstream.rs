//! The business step that leaves the database: POST the canonical
//! event to `FENCEHOOK_DOWNSTREAM_URL` with `Idempotency-Key` and
//! `Fencing-Token`. Only a 2xx counts; anything else leaves the payment
//! `processing` so the next delivery resumes it.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use crate::http::client::{self, HttpClient};

use crate::domain::CanonicalEvent;
use crate::metrics::{DownstreamResult, Metrics};

#[derive(Debug, thiserror::Error)]
pub enum DownstreamError {
    #[error("downstream answered {0}")]
    Status(u16),
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
            client: client::new(timeout),
            url,
            timeout,
            metrics,
        }
    }

    pub async fn call(&self, ev: &CanonicalEvent, token: i64) -> Result<(), DownstreamError> {
        let started = std::time::Instant::now();
        let result = self.send(ev, token).await;
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
        let req = hyper::Request::post(self.url.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(
                "Idempotency-Key",
                format!("{}:{}", ev.provider, ev.transaction_id),
            )
            .header("Fencing-Token", token.to_string())
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| DownstreamError::Transport(e.into()))?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| DownstreamError::Transport(e.into()))?;
            let status = resp.status();
            // Drain the body so the connection can be reused.
            let _ = resp.into_body().collect().await;
            if status.is_success() {
                Ok(())
            } else {
                Err(DownstreamError::Status(status.as_u16()))
            }
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| DownstreamError::Timeout(self.timeout))?
    }
}
