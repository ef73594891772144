//! `POST /webhooks/{provider}` and the one mapping from outcomes and errors to
//! HTTP answers (SPEC §1). 5xx bodies are opaque; the cause chain goes to the log.
//!
//! A delivery may carry several items (an Adyen batch). Each event item is
//! processed on its own, under its own lease, concurrently; the delivery's
//! answer is the one of its most serious item ([`ItemResult::rank`]), so a
//! PSP is told success only when every item is durable.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::{json, with_retry_after, Body};
use crate::app::State;
use crate::error::Error;
use crate::processor::Outcome;
use crate::providers::{adyen, Item, Provider, Reject, SchemeKind};

/// Retry-After for 503s: the provider should come back soon, not hammer.
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Items of one delivery processed at once: enough that a batch is not
/// serialised, few enough that one large batch cannot take the whole database
/// pool from other deliveries.
const BATCH_CONCURRENCY: usize = 8;
/// Retry-After when our lease ended before commit: the next attempt can start at once.
const LEASE_LOST_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One delivery's answer plus what the request log line needs.
struct Answer {
    response: Response<Body>,
    result: &'static str,
    transaction_id: Option<String>,
    token: Option<i64>,
    items: usize,
}

impl Answer {
    fn plain(status: StatusCode, result: &'static str) -> Answer {
        Answer {
            response: json(status, json!({ "result": result })),
            result,
            transaction_id: None,
            token: None,
            items: 0,
        }
    }

    fn reason(status: StatusCode, result: &'static str, reason: &str) -> Answer {
        Answer {
            response: json(status, json!({ "result": result, "reason": reason })),
            result,
            transaction_id: None,
            token: None,
            items: 0,
        }
    }
}

/// What one item of a delivery came to, after processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ItemResult {
    Processed,
    Duplicate,
    Ignored,
    InProgress,
    LeaseLost,
    PayloadMismatch,
    Unavailable,
}

impl ItemResult {
    fn of(outcome: &Outcome) -> ItemResult {
        match outcome {
            Outcome::Processed { .. } => ItemResult::Processed,
            Outcome::Duplicate => ItemResult::Duplicate,
            Outcome::PayloadMismatch => ItemResult::PayloadMismatch,
            Outcome::InProgress { .. } => ItemResult::InProgress,
            Outcome::LeaseLost { .. } => ItemResult::LeaseLost,
        }
    }

    /// The `result` label (response body, log, metric).
    fn label(self) -> &'static str {
        match self {
            ItemResult::Processed => "processed",
            ItemResult::Duplicate => "duplicate",
            ItemResult::Ignored => "ignored",
            ItemResult::InProgress => "in_progress",
            ItemResult::LeaseLost => "lease_lost",
            ItemResult::PayloadMismatch => "payload_mismatch",
            ItemResult::Unavailable => "unavailable",
        }
    }

    /// THE mapping of a processing result to a status (SPEC §1). 2xx only for
    /// outcomes that are durable (or, for `ignored`, need nothing written).
    fn status(self) -> StatusCode {
        match self {
            ItemResult::Processed | ItemResult::Duplicate | ItemResult::Ignored => StatusCode::OK,
            ItemResult::InProgress | ItemResult::LeaseLost => StatusCode::CONFLICT,
            ItemResult::PayloadMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            ItemResult::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// How a batch is answered: by its highest-ranked item. Any item that is
    /// not durable makes the batch retryable, so the PSP redelivers it (the
    /// items already done then answer `duplicate`). A payload mismatch ranks
    /// above the retryable results: it will not heal by retrying and needs a
    /// person, so it is what the PSP's dashboard and our metric should show.
    /// Among durable items, `processed` says more than `duplicate`, which
    /// says more than `ignored`.
    fn rank(self) -> u8 {
        match self {
            ItemResult::Ignored => 0,
            ItemResult::Duplicate => 1,
            ItemResult::Processed => 2,
            ItemResult::InProgress | ItemResult::LeaseLost => 3,
            ItemResult::Unavailable => 4,
            ItemResult::PayloadMismatch => 5,
        }
    }
}

/// One item's result with what its answer and log line need.
#[derive(Debug, Clone)]
struct Verdict {
    result: ItemResult,
    retry_after: Option<Duration>,
    transaction_id: Option<String>,
    token: Option<i64>,
}

impl Verdict {
    fn of_outcome(outcome: &Outcome, transaction_id: String) -> Verdict {
        let retry_after = match outcome {
            Outcome::InProgress { retry_after } => Some(*retry_after),
            Outcome::LeaseLost { .. } => Some(LEASE_LOST_RETRY_AFTER),
            Outcome::Processed { .. } | Outcome::Duplicate | Outcome::PayloadMismatch => None,
        };
        Verdict {
            result: ItemResult::of(outcome),
            retry_after,
            transaction_id: Some(transaction_id),
            token: outcome.token(),
        }
    }

    fn unavailable(transaction_id: Option<String>) -> Verdict {
        Verdict {
            result: ItemResult::Unavailable,
            retry_after: Some(UNAVAILABLE_RETRY_AFTER),
            transaction_id,
            token: None,
        }
    }

    fn ignored() -> Verdict {
        Verdict {
            result: ItemResult::Ignored,
            retry_after: None,
            transaction_id: None,
            token: None,
        }
    }

    /// The verdict of a whole delivery: its highest-ranked item (the first
    /// of equals), with the longest Retry-After of the items that want one
    /// and every item's transaction id for the log.
    fn of_batch(verdicts: Vec<Verdict>) -> Option<Verdict> {
        let retry_after = verdicts.iter().filter_map(|v| v.retry_after).max();
        let ids: Vec<String> = verdicts
            .iter()
            .filter_map(|v| v.transaction_id.clone())
            .collect();
        let mut top = verdicts.into_iter().reduce(|top, v| {
            if v.result.rank() > top.result.rank() {
                v
            } else {
                top
            }
        })?;
        if top.retry_after.is_some() {
            top.retry_after = retry_after;
        }
        top.transaction_id = (!ids.is_empty()).then(|| ids.join(","));
        Some(top)
    }

    /// The response, in the shape the provider expects.
    fn into_answer(self, scheme: SchemeKind, items: usize) -> Answer {
        let status = self.result.status();
        let label = self.result.label();
        let mut response = match scheme {
            // Adyen marks a batch delivered only on exactly this body.
            SchemeKind::Adyen if status == StatusCode::OK => text(status, adyen::ACCEPTED),
            SchemeKind::Adyen | SchemeKind::Standard | SchemeKind::Stripe => {
                json(status, json!({ "result": label }))
            }
        };
        if let Some(after) = self.retry_after {
            response = with_retry_after(response, after);
        }
        Answer {
            response,
            result: label,
            transaction_id: self.transaction_id,
            token: self.token,
            items,
        }
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    resp
}

pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let path = req.uri().path().to_owned();
    let Some(name) = path
        .strip_prefix("/webhooks/")
        .filter(|n| !n.is_empty() && !n.contains('/'))
    else {
        return json(StatusCode::NOT_FOUND, json!({"result": "not_found"}));
    };
    let Some(provider) = state.providers.get(name).cloned() else {
        return json(StatusCode::NOT_FOUND, json!({"result": "unknown_provider"}));
    };
    if req.method() != Method::POST {
        let mut resp = json(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"result": "method_not_allowed"}),
        );
        resp.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("POST"),
        );
        return resp;
    }
    let answer = deliver(&state, &provider, req).await;
    let elapsed = started.elapsed();
    state
        .metrics
        .webhook(&provider.name, answer.result)
        .increment(1);
    state
        .metrics
        .webhook_duration()
        .record(elapsed.as_secs_f64());
    tracing::info!(
        provider = %provider.name,
        transaction_id = answer.transaction_id.as_deref().unwrap_or("-"),
        token = answer.token,
        items = answer.items,
        result = answer.result,
        status = answer.response.status().as_u16(),
        latency_ms = elapsed.as_secs_f64() * 1000.0,
        "delivery"
    );
    answer.response
}

async fn deliver(state: &State, provider: &Provider, req: Request<Incoming>) -> Answer {
    if !is_json(req.headers()) {
        return Answer::plain(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type");
    }
    let limit = state.max_body_bytes;
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Answer::plain(StatusCode::PAYLOAD_TOO_LARGE, "too_large");
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return Answer::plain(StatusCode::PAYLOAD_TOO_LARGE, "too_large");
        }
        Err(_) => {
            return Answer::reason(
                StatusCode::BAD_REQUEST,
                "invalid_payload",
                "could not read the body",
            )
        }
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let items = match provider.accept(&parts.headers, &body, now) {
        Ok(items) => items,
        Err(Reject::Unauthorized(why)) => {
            tracing::debug!(provider = %provider.name, reason = %why, "signature rejected");
            return Answer::plain(StatusCode::UNAUTHORIZED, "unauthorized");
        }
        Err(Reject::Invalid(why)) => {
            return Answer::reason(StatusCode::BAD_REQUEST, "invalid_payload", &why)
        }
    };
    let count = items.len();
    let draining = state.is_draining();
    // FENCEHOOK_MAX_INFLIGHT bounds the deliveries this instance works on at once.
    let Ok(_permit) = state.inflight.try_acquire() else {
        tracing::warn!(provider = %provider.name, "FENCEHOOK_MAX_INFLIGHT reached; answered 503");
        return Verdict::unavailable(None).into_answer(provider.scheme(), count);
    };
    // Every item on its own, under its own lease, several at once.
    let verdicts: Vec<Verdict> = stream::iter(items.into_iter().map(|item| async move {
        match item {
            Item::Ignored { event_type } => {
                tracing::debug!(provider = %provider.name, %event_type, "event type not acted on");
                Verdict::ignored()
            }
            Item::Event(ev) if draining => Verdict::unavailable(Some(ev.transaction_id)),
            Item::Event(ev) => match state.processor.process(&ev).await {
                Ok(outcome) => Verdict::of_outcome(&outcome, ev.transaction_id),
                Err(e) => {
                    tracing::error!(provider = %provider.name, transaction_id = %ev.transaction_id,
                        kind = e.kind(), error = %crate::error::chain(&e as &Error), "item failed; answered 503");
                    Verdict::unavailable(Some(ev.transaction_id))
                }
            },
        }
    }))
    .buffered(BATCH_CONCURRENCY)
    .collect()
    .await;
    match Verdict::of_batch(verdicts) {
        Some(verdict) => verdict.into_answer(provider.scheme(), count),
        None => Answer::reason(
            StatusCode::BAD_REQUEST,
            "invalid_payload",
            "no event in the delivery",
        ),
    }
}

fn is_json(headers: &hyper::HeaderMap) -> bool {
    let Some(ct) = headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(result: ItemResult, retry_secs: Option<u64>, tx: &str) -> Verdict {
        Verdict {
            result,
            retry_after: retry_secs.map(Duration::from_secs),
            transaction_id: Some(tx.to_owned()),
            token: None,
        }
    }

    fn batch(items: &[(ItemResult, Option<u64>)]) -> Verdict {
        Verdict::of_batch(
            items
                .iter()
                .enumerate()
                .map(|(i, (r, s))| verdict(*r, *s, &format!("t{i}")))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn a_batch_is_answered_by_its_most_serious_item() {
        use ItemResult::*;
        let v = batch(&[(Processed, None), (Duplicate, None), (Ignored, None)]);
        assert_eq!(v.result, Processed);
        assert_eq!(v.transaction_id.as_deref(), Some("t0,t1,t2"));
        assert_eq!(
            batch(&[(Ignored, None), (Duplicate, None)]).result,
            Duplicate
        );
        let v = batch(&[
            (Processed, None),
            (InProgress, Some(3)),
            (LeaseLost, Some(1)),
        ]);
        assert_eq!(
            (v.result, v.retry_after),
            (InProgress, Some(Duration::from_secs(3)))
        );
        let v = batch(&[(InProgress, Some(4)), (Unavailable, Some(1))]);
        assert_eq!(
            (v.result, v.retry_after),
            (Unavailable, Some(Duration::from_secs(4)))
        );
        let v = batch(&[
            (Unavailable, Some(1)),
            (PayloadMismatch, None),
            (Processed, None),
        ]);
        assert_eq!((v.result, v.retry_after), (PayloadMismatch, None));
        assert!(Verdict::of_batch(Vec::new()).is_none());
    }

    #[test]
    fn only_durable_results_are_2xx() {
        use ItemResult::*;
        for r in [Processed, Duplicate, Ignored] {
            assert_eq!(r.status(), StatusCode::OK, "{r:?}");
        }
        for r in [InProgress, LeaseLost, PayloadMismatch, Unavailable] {
            assert!(!r.status().is_success(), "{r:?}");
        }
    }

    #[test]
    fn adyen_gets_accepted_as_plain_text_only_on_success() {
        let ok = verdict(ItemResult::Duplicate, None, "t").into_answer(SchemeKind::Adyen, 1);
        assert_eq!(ok.response.status(), StatusCode::OK);
        assert_eq!(
            ok.response.headers()[hyper::header::CONTENT_TYPE],
            "text/plain"
        );
        let retry = verdict(ItemResult::InProgress, Some(2), "t").into_answer(SchemeKind::Adyen, 1);
        assert_eq!(retry.response.status(), StatusCode::CONFLICT);
        assert_eq!(retry.response.headers()[hyper::header::RETRY_AFTER], "2");
        let stripe = verdict(ItemResult::Processed, None, "t").into_answer(SchemeKind::Stripe, 1);
        assert_eq!(
            stripe.response.headers()[hyper::header::CONTENT_TYPE],
            "application/json"
        );
    }
}
