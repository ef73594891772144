//! `POST /webhooks/{provider}`: check the content type the provider's PSP
//! posts ([`Provider::accepts_content_type`]: JSON, or Alipay's form), read
//! the body within its limits (size and time), let the provider verify and
//! map it (awaited: a PayPal provider may fetch its signing certificate; a
//! certificate it cannot get is a 503), process every item, answer (see
//! [`super::answer`]). Requests that are no delivery are counted by reason
//! (`fencehook_requests_rejected_total`); refused deliveries and copies
//! answered `duplicate` are logged sampled ([`super::log_sample`]), other
//! processed ones always.
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
use crate::domain::{CanonicalEvent, ObjectKind, Status};
use crate::metrics::{QuarantineReason, RejectReason, WebhookResult};
use crate::processor::Outcome;
use crate::providers::{Item, Provider, Reject};
use crate::store::inbox::Accepted;
use crate::store::transmissions::Transmission;
use crate::telemetry::spans;
use tracing::Instrument;

/// Items of one delivery processed at once: enough that a batch is not
/// serialised, few enough that one large batch cannot take the whole database
/// pool from other deliveries.
const BATCH_CONCURRENCY: usize = 8;

pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let peer = req.extensions().get::<super::PeerAddr>().map(|p| p.0);
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
    // The delivery's server span: every span and log line below is in it.
    let span = spans::delivery(&provider.name, path, req.headers());
    respond(state, provider, req, started, peer)
        .instrument(span)
        .await
}

/// Processes a delivery, counts, logs and answers it (inside its span).
async fn respond(
    state: Arc<State>,
    provider: Arc<Provider>,
    req: Request<Incoming>,
    started: Instant,
    peer: Option<std::net::SocketAddr>,
) -> Response<Body> {
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
    // The console's view of late answers and refusals (memory, bounded).
    state.recent.answered(&provider.name, answer.result);
    if let Delivery::Refused { cause, why, .. } = &delivery {
        let reason = cause
            .as_deref()
            .or(why.as_deref())
            .or(answer.reason.as_deref());
        state
            .recent
            .refused(&provider.name, answer.result, status, reason, peer);
    }
    spans::answered(
        &tracing::Span::current(),
        answer.result.as_str(),
        status,
        answer.transaction_id.as_deref(),
    );
    // Rounded to the microsecond: a float printed in full reads 0.018427000000000002.
    let latency_ms = (elapsed.as_secs_f64() * 1_000_000.0).round() / 1000.0;
    match &delivery {
        Delivery::Processed(answer) if answer.result == WebhookResult::Duplicate => {
            // Nothing happened to any payment: the outcome this copy repeats
            // was durable, and logged, before. A replayed batch makes these
            // by the ten thousand a second: sampled.
            let Some(suppressed) = state.log_sample.admit(Kind::Duplicate) else {
                return response;
            };
            tracing::info!(
                provider = %provider.name,
                transaction_id = answer.transaction_id.as_deref().unwrap_or("-"),
                result = answer.result.as_str(),
                status,
                latency_ms,
                suppressed,
                "delivery"
            )
        }
        Delivery::Processed(answer) => tracing::info!(
            provider = %provider.name,
            transaction_id = answer.transaction_id.as_deref().unwrap_or("-"),
            token = answer.token,
            result = answer.result.as_str(),
            status,
            latency_ms,
            "delivery"
        ),
        Delivery::Refused {
            kind,
            answer,
            why,
            cause,
        } => {
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
            } else if let Some(reason) = why {
                // A forged delivery (a PayPal transmission id reused, an event
                // PayPal's API does not confirm): worth a warning, still sampled.
                tracing::warn!(provider = %provider.name, result, status, latency_ms, suppressed,
                    %reason, "delivery refused");
            } else if let Some(cause) = cause {
                // What failed (the signature, the timestamp, a header), so
                // that a wrong secret is told from a clock off: never the
                // secret or the signature itself, which no cause holds.
                tracing::info!(provider = %provider.name, result, status, latency_ms, suppressed,
                    %cause, "delivery");
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
    /// logged for a 503, whose body says nothing, and for a delivery
    /// refused as forged; `cause` is what failed the verification of a 401
    /// (its body says only `unauthorized`).
    Refused {
        kind: Kind,
        answer: Answer,
        why: Option<String>,
        cause: Option<String>,
    },
    /// Verified and mapped, every item processed: its line is always written.
    Processed(Answer),
}

fn refused(kind: Kind, answer: Answer) -> Delivery {
    Delivery::Refused {
        kind,
        answer,
        why: None,
        cause: None,
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
    // hyper answers `Expect: 100-continue` when the body is first read: only
    // for a delivery that could be signed. One without its signature header
    // is refused as it would be after reading.
    let expects_continue = req
        .headers()
        .get(hyper::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue && !provider.has_signature_header(req.headers()) {
        let reject = Reject::Unauthorized("no signature header".to_owned());
        return Delivery::Refused {
            kind: Kind::Unauthorized,
            answer: Answer::of_reject(&reject),
            why: None,
            cause: Some("no signature header".to_owned()),
        };
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
    let verify = spans::verify(&provider.name);
    let (accepted, gate) = async {
        let accepted = provider.accept(&parts.headers, &body, now).await;
        let gate = paypal_gate(state, provider, &parts.headers, &body, &accepted).await;
        (accepted, gate)
    }
    .instrument(verify.clone())
    .await;
    spans::verified(&verify, &accepted, gate.is_ok());
    if let Err(refusal) = gate {
        return refusal;
    }
    let items = match accepted {
        Ok(items) => items,
        Err(reject) => {
            tracing::debug!(provider = %provider.name, reason = %reject, "delivery refused");
            let (kind, why, cause) = match &reject {
                Reject::Unauthorized(cause) => (Kind::Unauthorized, None, Some(cause.clone())),
                Reject::Invalid(_) => (Kind::InvalidPayload, None, None),
                Reject::Unavailable(why) => {
                    (Kind::VerificationUnavailable, Some(why.clone()), None)
                }
            };
            return Delivery::Refused {
                kind,
                answer: Answer::of_reject(&reject),
                why,
                cause,
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
        let item = match item {
            Item::CancelOrRefund(ev) => match cancel_or_refund(state, ev).await {
                Ok(item) => item,
                Err(answer) => return answer,
            },
            item => item,
        };
        match item {
            Item::Ignored { event_type } => {
                tracing::debug!(provider = %provider.name, %event_type, "event type not acted on");
                Answer::new(WebhookResult::Ignored)
            }
            Item::Unmappable {
                reason,
                key,
                transaction_id,
                raw,
            } => {
                let why = format!("unmappable: {reason}");
                let item = Quarantined { raw: &raw, key: &key };
                quarantine(state, provider, transaction_id, &why, item, QuarantineReason::Unmappable).await
            }
            Item::CancelOrRefund(_) => unreachable!("resolved above"),
            Item::Event(ev) if draining => Answer::unavailable(Some(ev.transaction_id)),
            // FENCEHOOK_REQUIRE_SYNC_REPLICATION and the last sample found
            // commits not waiting for a standby: an acknowledgement could be
            // lost in a failover, so none is given.
            Item::Event(ev) if state.health.refuses_bookings() => Answer::unavailable(Some(ev.transaction_id)),
            Item::Event(ev) if state.inbox.is_some() => {
                let inbox = state.inbox.as_ref().expect("checked");
                let accepting = spans::inbox_accept(&ev);
                match inbox.accept(&ev, psp_event_id, received).instrument(accepting).await {
                    Ok(Accepted::New) => Answer::with_transaction(WebhookResult::Accepted, ev.transaction_id),
                    Ok(Accepted::Duplicate) => Answer::with_transaction(WebhookResult::Duplicate, ev.transaction_id),
                    Ok(Accepted::Mismatch) => Answer::with_transaction(WebhookResult::PayloadMismatch, ev.transaction_id),
                    Err(e) => {
                        if matches!(e, crate::error::Error::Store(_)) {
                            state.health.nudge();
                        }
                        tracing::error!(provider = %provider.name, transaction_id = %ev.transaction_id,
                            kind = e.kind(), error = %crate::report::chain(&e), "could not accept; answered 503");
                        Answer::unavailable(Some(ev.transaction_id))
                    }
                }
            }
            Item::Event(ev) => match state.processor.process(&ev).instrument(spans::process(&ev)).await {
                // In a batch, a refund its payment cannot give must not hold
                // up the other items: it is recorded, and the batch goes on.
                Ok(Outcome::RefundRejected(why)) if provider.is_batch() => {
                    let raw = serde_json::to_string(&ev).unwrap_or_default();
                    // The event's identity and kind, not its JSON: that
                    // carries `occurred_at`, which no PSP need sign.
                    let key = format!("{}:{}", ev.fingerprint(), ev.event_type.as_str());
                    let reason = format!("refund_rejected: {}", why.as_str());
                    let item = Quarantined { raw: &raw, key: &key };
                    quarantine(state, provider, Some(ev.transaction_id), &reason, item, QuarantineReason::RefundRejected).await
                }
                Ok(outcome) => Answer::of_outcome(&outcome, ev.transaction_id),
                Err(e) => {
                    if matches!(e, crate::error::Error::Store(_)) {
                        state.health.nudge();
                    }
                    tracing::error!(provider = %provider.name, transaction_id = %ev.transaction_id,
                        kind = e.kind(), error = %crate::report::chain(&e), "item failed; answered 503");
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

/// PayPal signs only the CRC-32 of the body, which any body can be made to
/// match: a verified delivery's headers are bound to the first body seen with
/// them before anything is booked (also when the body does not map, a 400
/// after the signature verified, so those headers cannot carry another body
/// later), and with `confirm = "api"` a new event is fetched from PayPal's
/// API and must be what was delivered. Nothing for other providers.
async fn paypal_gate(
    state: &State,
    provider: &Provider,
    headers: &http::HeaderMap,
    body: &[u8],
    accepted: &Result<Vec<Item>, Reject>,
) -> Result<(), Delivery> {
    if !matches!(accepted, Ok(_) | Err(Reject::Invalid(_))) {
        return Ok(());
    }
    let Some(key) = provider.paypal_transmission(headers, body) else {
        return Ok(());
    };
    let unavailable = |e: crate::error::Error, what: &str| {
        tracing::error!(provider = %provider.name, kind = e.kind(),
            error = %crate::report::chain(&e), "could not {what}; answered 503");
        refused(Kind::VerificationUnavailable, Answer::unavailable(None))
    };
    // Anyone holding one set of PayPal's headers can send these as fast as
    // they like: logged through the sampler like every refusal (see `handle`).
    let unauthorized = |reason: RejectReason, why: &str| {
        state.metrics.request_rejected(reason).increment(1);
        Delivery::Refused {
            kind: Kind::Unauthorized,
            answer: Answer::new(WebhookResult::Unauthorized),
            why: Some(format!("{why} (transmission id {})", key.id)),
            cause: None,
        }
    };
    let confirmed = match state
        .processor
        .bind_transmission(&provider.name, &key)
        .await
    {
        Ok(Transmission::New) => false,
        Ok(Transmission::SameBody { confirmed }) => confirmed,
        Ok(Transmission::OtherBody) => {
            return Err(unauthorized(
                RejectReason::TransmissionReused,
                "a transmission id seen before with another body",
            ))
        }
        Err(e) => return Err(unavailable(e, "record the transmission id")),
    };
    // Only an event that would be booked is worth PayPal's API's time.
    let item = match accepted {
        Ok(items) => match items.as_slice() {
            [item @ Item::Event(_)] => item,
            _ => return Ok(()),
        },
        Err(_) => return Ok(()),
    };
    if confirmed || !provider.paypal_confirms() {
        return Ok(());
    }
    match provider.paypal_confirm(body, item).await {
        Ok(()) => state
            .processor
            .settle_transmission(&provider.name, &key, true)
            .await
            .map_err(|e| unavailable(e, "record the confirmation")),
        Err(Reject::Unauthorized(why)) => {
            // Dropped, so that the genuine body can still take the id.
            if let Err(e) = state
                .processor
                .settle_transmission(&provider.name, &key, false)
                .await
            {
                return Err(unavailable(e, "drop a contradicted transmission id"));
            }
            Err(unauthorized(RejectReason::EventUnconfirmed, &why))
        }
        Err(reject) => {
            let (kind, why) = match &reject {
                Reject::Invalid(_) => (Kind::InvalidPayload, None),
                _ => (Kind::VerificationUnavailable, Some(reject.to_string())),
            };
            Err(Delivery::Refused {
                kind,
                answer: Answer::of_reject(&reject),
                why,
                cause: None,
            })
        }
    }
}

/// Adyen's `CANCEL_OR_REFUND`, decided by the ledger (the unsigned
/// `modification.action` is never read): against a payment recorded `failed`
/// here it was a cancel, which moves nothing; otherwise it is the refund of
/// the signed amount, which books against a `succeeded` payment and waits,
/// as every refund does, for one not settled yet. An `Err` is the answer
/// when the payment could not be looked up.
async fn cancel_or_refund(state: &State, ev: CanonicalEvent) -> Result<Item, Answer> {
    let parent = ev.parent_transaction_id.as_deref().unwrap_or_default();
    match state.processor.payment_row(&ev.provider, parent).await {
        Ok(Some(row)) if row.kind == ObjectKind::Payment && row.status == Status::Failed => {
            Ok(Item::Ignored {
                event_type: "CANCEL_OR_REFUND of a failed payment (a cancel)".to_owned(),
            })
        }
        Ok(_) => Ok(Item::Event(ev)),
        Err(e) => {
            tracing::error!(provider = %ev.provider, transaction_id = %ev.transaction_id,
                kind = e.kind(), error = %crate::report::chain(&e), "could not look up the payment of a CANCEL_OR_REFUND; answered 503");
            Err(Answer::unavailable(Some(ev.transaction_id)))
        }
    }
}

/// A batch item to quarantine: as received, and what identifies it.
struct Quarantined<'a> {
    raw: &'a str,
    key: &'a str,
}

/// Records a batch item that cannot be booked, once per key; durable once
/// written (the batch may be acknowledged), 503 when the write fails.
async fn quarantine(
    state: &State,
    provider: &Provider,
    transaction_id: Option<String>,
    reason: &str,
    item: Quarantined<'_>,
    kind: QuarantineReason,
) -> Answer {
    match state
        .processor
        .quarantine(
            &provider.name,
            transaction_id.as_deref(),
            reason,
            item.raw,
            item.key,
        )
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
            tracing::error!(provider = %provider.name, error = %crate::report::chain(&e),
                "could not quarantine a batch item; answered 503");
            Answer::unavailable(transaction_id)
        }
    }
}
