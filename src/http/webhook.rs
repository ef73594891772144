//! `POST /webhooks/{provider}`: check the content type the provider's PSP
//! posts ([`Provider::accepts_content_type`]: JSON, or Alipay's form), read
//! the body within its limits (size and time), let the provider verify and
//! map it (awaited: a PayPal provider may fetch its signing certificate; a
//! certificate it cannot get is a 503), process every item, answer (see
//! [`super::answer`]). Requests that are no delivery are counted by reason
//! (`fencehook_requests_rejected_total`); refused deliveries are logged
//! sampled ([`super::log_sample`]), processed ones always.
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
use hyper::{Method, Request, Response};

use super::answer::{self, Answer};
use super::log_sample::Kind;
use super::state::State;
use super::Body;
use crate::metrics::{QuarantineReason, RejectReason, WebhookResult};
use crate::processor::Outcome;
use crate::providers::{Item, Provider, Reject};
use crate::store::inbox::Accepted;

/// Items of one delivery processed at once: enough that a batch is not
/// serialised, few enough that one large batch cannot take the whole database
/// pool from other deliveries.
const BATCH_CONCURRENCY: usize = 8;

pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let path = req.uri().path();
    let Some(name) = path
        .strip_prefix("/webhooks/")
        .filter(|n| !n.is_empty() && !n.contains('/'))
    else {
        return rejected(&state, RejectReason::NotFound);
    };
    let Some(provider) = state.provider(name) else {
        return rejected(&state, RejectReason::UnknownProvider);
    };
    if req.method() != Method::POST {
        return rejected(&state, RejectReason::MethodNotAllowed);
    }
    let delivery = deliver(&state, &provider, req).await;
    let elapsed = started.elapsed();
    let answer = match &delivery {
        Delivery::Refused { answer, .. } | Delivery::Processed(answer) => answer,
    };
    state
        .metrics
        .webhook(&provider.name, answer.result)
        .increment(1);
    state
        .metrics
        .webhook_duration()
        .record(elapsed.as_secs_f64());
    let response = answer.response(Some(&provider));
    let status = response.status().as_u16();
    // Rounded to the microsecond: a float printed in full reads 0.018427000000000002.
    let latency_ms = (elapsed.as_secs_f64() * 1_000_000.0).round() / 1000.0;
    match &delivery {
        Delivery::Processed(answer) => tracing::info!(
            provider = %provider.name,
            transaction_id = answer.transaction_id.as_deref().unwrap_or("-"),
            token = answer.token,
            result = answer.result.as_str(),
            status,
            latency_ms,
            "delivery"
        ),
        Delivery::Refused { kind, answer, why } => {
            // Anyone can send these, as fast as they like: sampled (see log_sample).
            let Some(suppressed) = state.log_sample.admit(*kind) else {
                return response;
            };
            let result = answer.result.as_str();
            if *kind == Kind::Overloaded {
                tracing::warn!(provider = %provider.name, result, status, latency_ms, suppressed,
                    "FENCEHOOK_MAX_INFLIGHT reached; answered 503");
            } else if *kind == Kind::VerificationUnavailable {
                tracing::warn!(provider = %provider.name, result, status, latency_ms, suppressed,
                    reason = why.as_deref().unwrap_or("-"),
                    "could not verify the delivery now; answered 503");
            } else {
                tracing::info!(provider = %provider.name, result, status, latency_ms, suppressed,
                    "delivery");
            }
        }
    }
    response
}

/// A request that is no delivery (a scan): answered as before, counted, not logged.
fn rejected(state: &State, reason: RejectReason) -> Response<Body> {
    state.metrics.request_rejected(reason).increment(1);
    answer::rejected(reason)
}

/// How far a delivery got, which decides how it is logged.
enum Delivery {
    /// Refused before processing: its line is sampled per kind. `why` is
    /// logged for a 503, whose body says nothing.
    Refused {
        kind: Kind,
        answer: Answer,
        why: Option<String>,
    },
    /// Verified and mapped, every item processed: its line is always written.
    Processed(Answer),
}

fn refused(kind: Kind, answer: Answer) -> Delivery {
    Delivery::Refused {
        kind,
        answer,
        why: None,
    }
}

async fn deliver(state: &State, provider: &Provider, req: Request<Incoming>) -> Delivery {
    if !provider.accepts_content_type(req.headers()) {
        return refused(
            Kind::UnsupportedMediaType,
            Answer::new(WebhookResult::UnsupportedMediaType),
        );
    }
    let limit = state.max_body_bytes;
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return refused(Kind::TooLarge, Answer::new(WebhookResult::TooLarge));
    }
    let (parts, body) = req.into_parts();
    // The whole body, not each read: a client that trickles a byte at a time
    // would otherwise hold a connection (and its slot) for as long as it likes.
    let read = tokio::time::timeout(state.body_timeout, Limited::new(body, limit).collect());
    let body = match read.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return refused(Kind::TooLarge, Answer::new(WebhookResult::TooLarge));
        }
        Ok(Err(_)) => {
            return refused(
                Kind::InvalidPayload,
                Answer::invalid("could not read the body"),
            )
        }
        Err(_elapsed) => {
            return refused(
                Kind::RequestTimeout,
                Answer::new(WebhookResult::RequestTimeout),
            )
        }
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let items = match provider.accept(&parts.headers, &body, now).await {
        Ok(items) => items,
        Err(reject) => {
            tracing::debug!(provider = %provider.name, reason = %reject, "delivery refused");
            let (kind, why) = match &reject {
                Reject::Unauthorized(_) => (Kind::Unauthorized, None),
                Reject::Invalid(_) => (Kind::InvalidPayload, None),
                Reject::Unavailable(why) => (Kind::VerificationUnavailable, Some(why.clone())),
            };
            return Delivery::Refused {
                kind,
                answer: Answer::of_reject(&reject),
                why,
            };
        }
    };
    let draining = state.is_draining();
    // Inbox mode keeps each event as received, with the PSP's id of the delivery.
    let received = String::from_utf8_lossy(&body);
    let psp_event_id = state
        .inbox
        .is_some()
        .then(|| provider.psp_event_id(&parts.headers, &body))
        .flatten();
    let (received, psp_event_id) = (&*received, psp_event_id.as_deref());
    // FENCEHOOK_MAX_INFLIGHT bounds the deliveries this instance works on at once.
    let Ok(_permit) = state.inflight.try_acquire() else {
        return refused(Kind::Overloaded, Answer::unavailable(None));
    };
    // Every item on its own, under its own lease, several at once.
    let answers: Vec<Answer> = stream::iter(items.into_iter().map(|item| async move {
        match item {
            Item::Ignored { event_type } => {
                tracing::debug!(provider = %provider.name, %event_type, "event type not acted on");
                Answer::new(WebhookResult::Ignored)
            }
            Item::Unmappable {
                reason,
                transaction_id,
                raw,
            } => {
                let why = format!("unmappable: {reason}");
                quarantine(state, provider, transaction_id, &why, &raw, QuarantineReason::Unmappable).await
            }
            Item::Event(ev) if draining => Answer::unavailable(Some(ev.transaction_id)),
            // FENCEHOOK_REQUIRE_SYNC_REPLICATION and the last sample found
            // commits not waiting for a standby: an acknowledgement could be
            // lost in a failover, so none is given.
            Item::Event(ev) if state.health.refuses_bookings() => Answer::unavailable(Some(ev.transaction_id)),
            Item::Event(ev) if state.inbox.is_some() => {
                let inbox = state.inbox.as_ref().expect("checked");
                match inbox.accept(&ev, psp_event_id, received).await {
                    Ok(Accepted::New) => Answer::with_transaction(WebhookResult::Accepted, ev.transaction_id),
                    Ok(Accepted::Duplicate) => Answer::with_transaction(WebhookResult::Duplicate, ev.transaction_id),
                    Ok(Accepted::Mismatch) => Answer::with_transaction(WebhookResult::PayloadMismatch, ev.transaction_id),
                    Err(e) => {
                        if matches!(e, crate::error::Error::Store(_)) {
                            state.health.nudge();
                        }
                        tracing::error!(provider = %provider.name, transaction_id = %ev.transaction_id,
                            kind = e.kind(), error = %crate::error::chain(&e), "could not accept; answered 503");
                        Answer::unavailable(Some(ev.transaction_id))
                    }
                }
            }
            Item::Event(ev) => match state.processor.process(&ev).await {
                // In a batch, a refund its payment cannot give must not hold
                // up the other items: it is recorded, and the batch goes on.
                Ok(Outcome::RefundRejected(why)) if provider.is_batch() => {
                    let item = serde_json::to_string(&ev).unwrap_or_default();
                    let reason = format!("refund_rejected: {}", why.as_str());
                    quarantine(state, provider, Some(ev.transaction_id), &reason, &item, QuarantineReason::RefundRejected).await
                }
                Ok(outcome) => Answer::of_outcome(&outcome, ev.transaction_id),
                Err(e) => {
                    if matches!(e, crate::error::Error::Store(_)) {
                        state.health.nudge();
                    }
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
    Delivery::Processed(
        Answer::of_batch(answers).unwrap_or_else(|| Answer::invalid("no event in the delivery")),
    )
}

/// Records a batch item that cannot be booked; durable once written (the
/// batch may be acknowledged), 503 when the write fails.
async fn quarantine(
    state: &State,
    provider: &Provider,
    transaction_id: Option<String>,
    reason: &str,
    item: &str,
    kind: QuarantineReason,
) -> Answer {
    match state
        .processor
        .quarantine(&provider.name, transaction_id.as_deref(), reason, item)
        .await
    {
        Ok(first) => {
            // A PSP re-sends the batch: the item is counted (and logged) once.
            if first {
                state.metrics.quarantined(kind).increment(1);
                tracing::warn!(provider = %provider.name, transaction_id = transaction_id.as_deref().unwrap_or("-"),
                    %reason, "batch item quarantined: recorded, not booked");
            }
            Answer {
                transaction_id,
                ..Answer::new(WebhookResult::Quarantined)
            }
        }
        Err(e) => {
            tracing::error!(provider = %provider.name, error = %crate::error::chain(&e),
                "could not quarantine a batch item; answered 503");
            Answer::unavailable(transaction_id)
        }
    }
}
