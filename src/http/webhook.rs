//! `POST /webhooks/{provider}`: check the content type the provider's PSP
//! posts ([`Provider::accepts_content_type`]: JSON, or Alipay's form), read
//! the body within its limits (size and time), let the provider verify and
//! map it (awaited: a provider may have to fetch what it verifies with; what
//! it cannot get is a 503), hand the verified items to the delivery room
//! ([`crate::delivery`]), answer (see [`super::answer`]). Requests that are
//! no delivery are counted by reason (`fencehook_requests_rejected_total`);
//! refused deliveries and copies answered `duplicate` are logged sampled
//! ([`super::log_sample`]), other processed ones always.
//!
//! A delivery may carry several items (an Adyen batch); the delivery room
//! books each on its own; the delivery is answered by its most serious
//! item, so a PSP is told success only when every item is durable.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};

use super::answer::{self, Answer};
use super::log_sample::Kind;
use super::state::State;
use super::Body;
use crate::config::setting;
use crate::delivery::{Received, Refusal};
use crate::metrics::{RejectReason, WebhookResult};
use crate::providers::{Item, Provider, Reject};
use crate::store::history::DeliveryRow;
use crate::telemetry::spans;
use tracing::Instrument;

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
                    "{} reached; answered 503", setting::FENCEHOOK_MAX_INFLIGHT);
            } else if *kind == Kind::VerificationUnavailable {
                tracing::warn!(provider = %provider.name, result, status, latency_ms, suppressed,
                    reason = why.as_deref().unwrap_or("-"),
                    "could not verify the delivery now; answered 503");
            } else if let Some(reason) = why {
                // A forged delivery (a transmission id reused with another
                // body, an event the PSP's API does not confirm): worth a
                // warning, still sampled.
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
    let (headers, body) = match read(state, provider, req).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let verify = spans::verify(&provider.name);
    let checks = async {
        let accepted = provider.accept(&headers, &body, now).await;
        let deliveries = &state.deliveries;
        let admitted = deliveries.admit(provider, &headers, &body, &accepted).await;
        (accepted, admitted)
    };
    let (accepted, admitted) = spans::leaf(verify.clone(), checks).await;
    spans::verified(verify, &accepted, admitted.is_ok());
    if let Err(refusal) = admitted {
        return not_admitted(refusal);
    }
    let items = match accepted {
        Ok(items) => items,
        Err(reject) => return not_verified(provider, &reject),
    };
    // Inbox mode keeps each event as received, with the PSP's id of the
    // delivery; the delivery history keeps that id too. Sync mode reads
    // neither body text (checking a body's UTF-8 again cost about 1,900
    // instructions a delivery).
    let stores_events = state.deliveries.stores_events();
    let body_text = if stores_events {
        String::from_utf8_lossy(&body)
    } else {
        std::borrow::Cow::Borrowed("")
    };
    let keeps_history = state.history.is_on();
    let psp_event_id = (stores_events || keeps_history)
        .then(|| provider.psp_event_id(&headers, &body))
        .flatten();
    let received = Received {
        psp_event_id: psp_event_id.as_deref(),
        body: &body_text,
        draining: state.is_draining(),
    };
    // FENCEHOOK_MAX_INFLIGHT bounds the deliveries this instance works on at once.
    let Ok(_permit) = state.inflight.try_acquire() else {
        return refused(Kind::Overloaded, Answer::unavailable(None));
    };
    let named = keeps_history.then(|| items.iter().map(Named::of).collect::<Vec<_>>());
    let handled = state.deliveries.book(provider, items, received).await;
    let answers: Vec<Answer> = handled.into_iter().map(Answer::of_item).collect();
    if let Some(named) = named {
        record(state, provider, psp_event_id.as_deref(), named, &answers);
    }
    Delivery::Processed(
        Answer::of_batch(answers).unwrap_or_else(|| Answer::invalid("no event in the delivery")),
    )
}

/// What the delivery history keeps of an item that is an event: the
/// transaction, the payment it names, its type. `None` for an item that is
/// no event (ignored or unmappable: nothing reaches the fenced path).
struct Named(Option<(String, Option<String>, &'static str)>);

impl Named {
    fn of(item: &Item) -> Named {
        Named(item.event().map(|ev| {
            (
                ev.transaction_id.clone(),
                ev.parent_transaction_id.clone(),
                ev.event_type.as_str(),
            )
        }))
    }
}

/// Hands each answered event of the delivery to the history (never waiting:
/// see [`crate::history`]). `book` answers in the items' order.
fn record(
    state: &State,
    provider: &Provider,
    psp_event_id: Option<&str>,
    named: Vec<Named>,
    answers: &[Answer],
) {
    let answered_at = time::OffsetDateTime::now_utc();
    for (Named(named), answer) in named.into_iter().zip(answers) {
        let Some((transaction_id, parent_transaction_id, event_type)) = named else {
            continue;
        };
        state.history.record(DeliveryRow {
            answered_at,
            provider: provider.name.clone(),
            transaction_id,
            parent_transaction_id,
            event_type: event_type.to_owned(),
            psp_event_id: psp_event_id.map(str::to_owned),
            result: answer.result.as_str().to_owned(),
            status: answer::status(answer.result).as_u16() as i16,
            reason: answer.reason.clone(),
        });
    }
}

/// The delivery's headers and whole body, read within its limits: the
/// content type its PSP posts, the size, the time; a delivery that could
/// not be signed is refused before its body is invited.
async fn read(
    state: &State,
    provider: &Provider,
    req: Request<Incoming>,
) -> Result<(http::HeaderMap, bytes::Bytes), Delivery> {
    if !provider.accepts_content_type(req.headers()) {
        return Err(refused(
            Kind::UnsupportedMediaType,
            Answer::new(WebhookResult::UnsupportedMediaType),
        ));
    }
    let limit = state.max_body_bytes;
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(refused(
            Kind::TooLarge,
            Answer::new(WebhookResult::TooLarge),
        ));
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
        return Err(Delivery::Refused {
            kind: Kind::Unauthorized,
            answer: Answer::of_reject(&reject),
            why: None,
            cause: Some("no signature header".to_owned()),
        });
    }
    let (parts, body) = req.into_parts();
    // The whole body, not each read: a client that trickles a byte at a time
    // would otherwise hold a connection (and its slot) for as long as it likes.
    let read = tokio::time::timeout(state.body_timeout, Limited::new(body, limit).collect());
    match read.await {
        Ok(Ok(collected)) => Ok((parts.headers, collected.to_bytes())),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(refused(
                Kind::TooLarge,
                Answer::new(WebhookResult::TooLarge),
            ))
        }
        Ok(Err(_)) => Err(refused(
            Kind::InvalidPayload,
            Answer::invalid("could not read the body"),
        )),
        Err(_elapsed) => Err(refused(
            Kind::RequestTimeout,
            Answer::new(WebhookResult::RequestTimeout),
        )),
    }
}

/// A delivery its provider did not verify or map.
fn not_verified(provider: &Provider, reject: &Reject) -> Delivery {
    tracing::debug!(provider = %provider.name, reason = %reject, "delivery refused");
    let (kind, why, cause) = match reject {
        Reject::Unauthorized(cause) => (Kind::Unauthorized, None, Some(cause.clone())),
        Reject::Invalid(_) => (Kind::InvalidPayload, None, None),
        Reject::Unavailable(why) => (Kind::VerificationUnavailable, Some(why.clone()), None),
    };
    Delivery::Refused {
        kind,
        answer: Answer::of_reject(reject),
        why,
        cause,
    }
}

/// A verified delivery the delivery room would not book (see
/// [`Deliveries::admit`](crate::delivery::Deliveries::admit)). A forged
/// one can be sent by anyone holding one set of the PSP's headers, as fast
/// as they like: logged through the sampler like every refusal.
fn not_admitted(refusal: Refusal) -> Delivery {
    match refusal {
        Refusal::Forged { why } => Delivery::Refused {
            kind: Kind::Unauthorized,
            answer: Answer::new(WebhookResult::Unauthorized),
            why: Some(why),
            cause: None,
        },
        Refusal::Unavailable => refused(Kind::VerificationUnavailable, Answer::unavailable(None)),
        Refusal::Rejected(reject) => {
            let (kind, why) = match &reject {
                Reject::Invalid(_) => (Kind::InvalidPayload, None),
                _ => (Kind::VerificationUnavailable, Some(reject.to_string())),
            };
            Delivery::Refused {
                kind,
                answer: Answer::of_reject(&reject),
                why,
                cause: None,
            }
        }
    }
}
