//! `POST /webhooks/{provider}` and the one mapping from outcomes and errors to
//! HTTP answers (SPEC §1). 5xx bodies are opaque; the cause chain goes to the log.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::{json, with_retry_after, Body};
use crate::app::State;
use crate::error::Error;
use crate::processor::Outcome;
use crate::providers::{Item, Reject};

/// Retry-After for 503s: the provider should come back soon, not hammer.
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One delivery's answer plus what the request log line needs.
struct Answer {
    response: Response<Body>,
    result: &'static str,
    transaction_id: Option<String>,
    token: Option<i64>,
}

impl Answer {
    fn plain(status: StatusCode, result: &'static str) -> Answer {
        Answer {
            response: json(status, json!({ "result": result })),
            result,
            transaction_id: None,
            token: None,
        }
    }

    fn reason(status: StatusCode, result: &'static str, reason: &str) -> Answer {
        Answer {
            response: json(status, json!({ "result": result, "reason": reason })),
            result,
            transaction_id: None,
            token: None,
        }
    }
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
        result = answer.result,
        status = answer.response.status().as_u16(),
        latency_ms = elapsed.as_secs_f64() * 1000.0,
        "delivery"
    );
    answer.response
}

async fn deliver(
    state: &State,
    provider: &crate::providers::Provider,
    req: Request<Incoming>,
) -> Answer {
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
    // The generic scheme carries exactly one item.
    let Some(item) = items.into_iter().next() else {
        return Answer::reason(
            StatusCode::BAD_REQUEST,
            "invalid_payload",
            "no event in the delivery",
        );
    };
    let ev = match item {
        Item::Ignored { event_type } => {
            tracing::debug!(provider = %provider.name, %event_type, "event type not acted on");
            return Answer::plain(StatusCode::OK, "ignored");
        }
        Item::Event(ev) => ev,
    };
    if state.is_draining() {
        return Answer {
            transaction_id: Some(ev.transaction_id),
            ..unavailable_answer()
        };
    }
    let Ok(_permit) = state.inflight.try_acquire() else {
        tracing::warn!(transaction_id = %ev.transaction_id, "FENCEHOOK_MAX_INFLIGHT reached; answered 503");
        return Answer {
            transaction_id: Some(ev.transaction_id),
            ..unavailable_answer()
        };
    };
    let result = state.processor.process(&ev).await;
    let mut answer = match result {
        Ok(outcome) => outcome_answer(&outcome),
        Err(e) => error_answer(&e, &ev.transaction_id),
    };
    answer.transaction_id = Some(ev.transaction_id);
    answer
}

/// The mapping of a processing outcome to its answer.
fn outcome_answer(outcome: &Outcome) -> Answer {
    let result = outcome.result();
    let (status, retry_after) = match outcome {
        Outcome::Processed { .. } | Outcome::Duplicate => (StatusCode::OK, None),
        Outcome::PayloadMismatch => (StatusCode::UNPROCESSABLE_ENTITY, None),
        Outcome::InProgress { retry_after } => (StatusCode::CONFLICT, Some(*retry_after)),
        Outcome::LeaseLost { .. } => (StatusCode::CONFLICT, Some(Duration::from_secs(1))),
    };
    let mut response = json(status, json!({ "result": result }));
    if let Some(after) = retry_after {
        response = with_retry_after(response, after);
    }
    Answer {
        response,
        result,
        transaction_id: None,
        token: outcome.token(),
    }
}

fn unavailable_answer() -> Answer {
    let response = with_retry_after(
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"result": "unavailable"}),
        ),
        UNAVAILABLE_RETRY_AFTER,
    );
    Answer {
        response,
        result: "unavailable",
        transaction_id: None,
        token: None,
    }
}

/// The mapping of an error to its answer: always 503, never a 2xx.
fn error_answer(e: &Error, transaction_id: &str) -> Answer {
    tracing::error!(transaction_id, kind = e.kind(), error = %crate::error::chain(e), "delivery failed; answered 503");
    unavailable_answer()
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
