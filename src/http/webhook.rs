//! `POST /webhooks/{provider}`: read the body within its limits, let the
//! provider verify and map it, process every item, answer (see [`super::answer`]).
//!
//! A delivery may carry several items (an Adyen batch). Each event item is
//! processed on its own, under its own lease, concurrently; the delivery is
//! answered by its most serious item, so a PSP is told success only when
//! every item is durable.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use futures_util::stream::{self, StreamExt};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::answer::Answer;
use super::state::State;
use super::{json, Body};
use crate::metrics::WebhookResult;
use crate::providers::{Item, Provider};

/// Items of one delivery processed at once: enough that a batch is not
/// serialised, few enough that one large batch cannot take the whole database
/// pool from other deliveries.
const BATCH_CONCURRENCY: usize = 8;

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
    let response = answer.response(Some(&provider));
    tracing::info!(
        provider = %provider.name,
        transaction_id = answer.transaction_id.as_deref().unwrap_or("-"),
        token = answer.token,
        result = answer.result.as_str(),
        status = response.status().as_u16(),
        latency_ms = elapsed.as_secs_f64() * 1000.0,
        "delivery"
    );
    response
}

async fn deliver(state: &State, provider: &Provider, req: Request<Incoming>) -> Answer {
    if !is_json(req.headers()) {
        return Answer::new(WebhookResult::UnsupportedMediaType);
    }
    let limit = state.max_body_bytes;
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Answer::new(WebhookResult::TooLarge);
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return Answer::new(WebhookResult::TooLarge);
        }
        Err(_) => return Answer::invalid("could not read the body"),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let items = match provider.accept(&parts.headers, &body, now) {
        Ok(items) => items,
        Err(reject) => {
            tracing::debug!(provider = %provider.name, reason = %reject, "delivery refused");
            return Answer::of_reject(&reject);
        }
    };
    let draining = state.is_draining();
    // FENCEHOOK_MAX_INFLIGHT bounds the deliveries this instance works on at once.
    let Ok(_permit) = state.inflight.try_acquire() else {
        tracing::warn!(provider = %provider.name, "FENCEHOOK_MAX_INFLIGHT reached; answered 503");
        return Answer::unavailable(None);
    };
    // Every item on its own, under its own lease, several at once.
    let answers: Vec<Answer> = stream::iter(items.into_iter().map(|item| async move {
        match item {
            Item::Ignored { event_type } => {
                tracing::debug!(provider = %provider.name, %event_type, "event type not acted on");
                Answer::new(WebhookResult::Ignored)
            }
            Item::Event(ev) if draining => Answer::unavailable(Some(ev.transaction_id)),
            Item::Event(ev) => match state.processor.process(&ev).await {
                Ok(outcome) => Answer::of_outcome(&outcome, ev.transaction_id),
                Err(e) => {
                    tracing::error!(provider = %provider.name, transaction_id = %ev.transaction_id,
                        kind = e.kind(), error = %crate::error::chain(&e), "item failed; answered 503");
                    Answer::unavailable(Some(ev.transaction_id))
                }
            },
        }
    }))
    .buffered(BATCH_CONCURRENCY)
    .collect()
    .await;
    Answer::of_batch(answers).unwrap_or_else(|| Answer::invalid("no event in the delivery"))
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
