//! THE mapping from what happened to a delivery to what the PSP is told:
//! status, `result`, `Retry-After`, and (through the provider) the body.
//!
//! What became of an item (its [`Fate`]: a processing [`Outcome`], an
//! inbox accept, a quarantine, an ignored item, an error) or a refused
//! delivery ([`Reject`]) each become one [`Answer`]; a batch's items
//! are folded into the answer of its most serious item; the provider shapes
//! the body its PSP expects ([`Provider::ack_body`]). 5xx bodies are opaque:
//! the cause chain goes to the log, never to the client.
//!
//! Requests that are no delivery at all (scans: [`RejectReason`]) and
//! connections over a listener's cap ([`CONNECTION_REFUSED`]) get their
//! answers here too.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::json;

use super::Body;
use crate::delivery::{Fate, Handled};
use crate::metrics::{RejectReason, WebhookResult};
use crate::processor::Outcome;
use crate::providers::{AckBody, Provider, Reject};
use crate::store::inbox::Accepted;

/// Retry-After for 503s: the provider should come back soon, not hammer.
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Retry-After when our lease ended before commit: the next attempt can start at once.
const LEASE_LOST_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Retry-After when a refund waits for its payment: the payment's own
/// delivery is usually a retry or two behind.
const AWAITING_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The status of a result. 2xx only for outcomes that are durable (or, for
/// `ignored`, need nothing written).
pub fn status(result: WebhookResult) -> StatusCode {
    use WebhookResult::*;
    match result {
        Processed | Accepted | Duplicate | Ignored | Stale | Quarantined => StatusCode::OK,
        InProgress | LeaseLost | AwaitingPayment => StatusCode::CONFLICT,
        PayloadMismatch | RefundRejected => StatusCode::UNPROCESSABLE_ENTITY,
        Unauthorized => StatusCode::UNAUTHORIZED,
        InvalidPayload => StatusCode::BAD_REQUEST,
        TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// How a batch is answered: by its highest-ranked item. Any item that is not
/// durable makes the batch retryable, so the PSP redelivers it (the items
/// already done then answer `duplicate`). A payload mismatch ranks above the
/// retryable results: it will not heal by retrying and needs a person, so it
/// is what the PSP's dashboard and our metric should show. Among durable
/// items, `processed` says more than `duplicate`, which says more than
/// `stale` and `ignored`; an item the batch could not book but recorded
/// (`quarantined`) is durable too, and says more than any of them. Refusals
/// never reach a batch: they refuse the whole delivery.
fn rank(result: WebhookResult) -> u8 {
    use WebhookResult::*;
    match result {
        Ignored => 0,
        Stale => 1,
        Duplicate => 2,
        Processed | Accepted => 3,
        Quarantined => 4,
        InProgress | LeaseLost | AwaitingPayment => 5,
        Unavailable => 6,
        PayloadMismatch | RefundRejected => 7,
        Unauthorized | InvalidPayload | TooLarge | UnsupportedMediaType | RequestTimeout => 8,
    }
}

/// The whole answer to a connection beyond a listener's cap, written raw
/// before any byte is read: no request was parsed, so none is answered; the
/// client is told to come back in a second and the connection is closed.
pub const CONNECTION_REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Retry-After: 1\r\n\
Connection: close\r\n\
Content-Length: 0\r\n\
\r\n";

/// The answer to a request that is no delivery: fencehook's own JSON (no
/// provider to shape it), `result` naming the reason.
pub fn rejected(reason: RejectReason) -> Response<Body> {
    let status = match reason {
        RejectReason::UnknownProvider | RejectReason::NotFound => StatusCode::NOT_FOUND,
        RejectReason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        // Answered in the provider's shape by the delivery path; here for
        // completeness.
        RejectReason::TransmissionReused | RejectReason::EventUnconfirmed => {
            StatusCode::UNAUTHORIZED
        }
    };
    let mut resp = super::json(status, json!({ "result": reason.as_str() }));
    if reason == RejectReason::MethodNotAllowed {
        resp.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("POST"));
    }
    resp
}

/// One delivery's (or one item's) answer, with what its log line needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub result: WebhookResult,
    pub retry_after: Option<Duration>,
    /// Why a delivery was refused as invalid, or a refund rejected (the body's `reason`).
    pub reason: Option<String>,
    /// The transaction(s) answered, comma-separated for a batch (logs only).
    pub transaction_id: Option<String>,
    /// The fencing token of the attempt that answered (logs only).
    pub token: Option<i64>,
}

impl Answer {
    pub fn new(result: WebhookResult) -> Answer {
        Answer {
            result,
            retry_after: None,
            reason: None,
            transaction_id: None,
            token: None,
        }
    }

    /// `result` for one item of `transaction_id`.
    pub fn with_transaction(result: WebhookResult, transaction_id: String) -> Answer {
        Answer {
            transaction_id: Some(transaction_id),
            ..Answer::new(result)
        }
    }

    /// What became of one item of a delivery.
    pub fn of_item(item: Handled) -> Answer {
        let Handled {
            fate,
            transaction_id,
        } = item;
        let result = |result| Answer {
            transaction_id: transaction_id.clone(),
            ..Answer::new(result)
        };
        match fate {
            Fate::Ignored => result(WebhookResult::Ignored),
            Fate::Quarantined => result(WebhookResult::Quarantined),
            Fate::Stored(Accepted::New) => result(WebhookResult::Accepted),
            Fate::Stored(Accepted::Duplicate) => result(WebhookResult::Duplicate),
            Fate::Stored(Accepted::Mismatch) => result(WebhookResult::PayloadMismatch),
            Fate::Processed(outcome) => Answer::of_outcome(&outcome, transaction_id),
            Fate::Unavailable => Answer::unavailable(transaction_id),
        }
    }

    /// What the processor did with one event.
    pub fn of_outcome(outcome: &Outcome, transaction_id: Option<String>) -> Answer {
        let (result, retry_after) = match outcome {
            Outcome::Processed { .. } => (WebhookResult::Processed, None),
            Outcome::Duplicate => (WebhookResult::Duplicate, None),
            Outcome::Stale => (WebhookResult::Stale, None),
            Outcome::PayloadMismatch => (WebhookResult::PayloadMismatch, None),
            Outcome::RefundRejected(_) => (WebhookResult::RefundRejected, None),
            Outcome::AwaitingPayment => {
                (WebhookResult::AwaitingPayment, Some(AWAITING_RETRY_AFTER))
            }
            Outcome::InProgress { retry_after } => (WebhookResult::InProgress, Some(*retry_after)),
            Outcome::LeaseLost { .. } => (WebhookResult::LeaseLost, Some(LEASE_LOST_RETRY_AFTER)),
        };
        let reason = match outcome {
            Outcome::RefundRejected(why) => Some(why.as_str().to_owned()),
            _ => None,
        };
        Answer {
            result,
            retry_after,
            reason,
            transaction_id,
            token: outcome.token(),
        }
    }

    /// 503, retry soon: an event that could not be brought to a durable
    /// outcome (a processing error, whatever its cause: never a duplicate, never a
    /// 2xx), or a delivery this instance cannot take now.
    pub fn unavailable(transaction_id: Option<String>) -> Answer {
        Answer {
            retry_after: Some(UNAVAILABLE_RETRY_AFTER),
            transaction_id,
            ..Answer::new(WebhookResult::Unavailable)
        }
    }

    /// A delivery refused before anything was written.
    pub fn of_reject(reject: &Reject) -> Answer {
        match reject {
            Reject::Unauthorized(_) => Answer::new(WebhookResult::Unauthorized),
            Reject::Invalid(why) => Answer::invalid(why),
            // Opaque like every 5xx: the cause goes to the log.
            Reject::Unavailable(_) => Answer::unavailable(None),
        }
    }

    /// 400 with a human-readable reason.
    pub fn invalid(reason: &str) -> Answer {
        Answer {
            reason: Some(reason.to_owned()),
            ..Answer::new(WebhookResult::InvalidPayload)
        }
    }

    pub fn status(&self) -> StatusCode {
        status(self.result)
    }

    /// The answer of a whole delivery: its highest-ranked item (the first of
    /// equals), with the longest Retry-After of the items that want one and
    /// every item's transaction id for the log. `None` for no items.
    pub fn of_batch(answers: Vec<Answer>) -> Option<Answer> {
        let retry_after = answers.iter().filter_map(|a| a.retry_after).max();
        let ids: Vec<String> = answers
            .iter()
            .filter_map(|a| a.transaction_id.clone())
            .collect();
        let mut top = answers.into_iter().reduce(|top, a| {
            if rank(a.result) > rank(top.result) {
                a
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

    /// The response, its body in the shape `provider`'s PSP expects (or
    /// fencehook's own JSON when no provider is known).
    pub fn response(&self, provider: Option<&Provider>) -> Response<Body> {
        let status = self.status();
        let label = self.result.as_str();
        let reason = self.reason.as_deref();
        let body = match provider {
            Some(p) => p.ack_body(status.is_success(), label, reason),
            None => AckBody::Json(match reason {
                Some(reason) => json!({ "result": label, "reason": reason }),
                None => json!({ "result": label }),
            }),
        };
        let mut response = match body {
            AckBody::Json(value) => super::json(status, value),
            AckBody::Text(text) => {
                let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
                *r.status_mut() = status;
                r.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                r
            }
            AckBody::Empty => {
                let mut r = Response::new(Full::new(Bytes::new()));
                *r.status_mut() = status;
                r
            }
        };
        if let Some(after) = self.retry_after {
            // Whole seconds, at least 1.
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(RETRY_AFTER, secs.max(1).into());
        }
        if matches!(
            self.result,
            WebhookResult::RequestTimeout | WebhookResult::TooLarge
        ) {
            // The rest of the body may still be on its way (a slow client, or
            // one too large to read): the connection cannot carry another
            // request, and a slow client keeps no slot. Said in the answer, so
            // a client that pools connections does not send its next request
            // down this one while the server is closing it.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::SchemeKind;

    fn answer(result: WebhookResult, retry_secs: Option<u64>, tx: &str) -> Answer {
        Answer {
            retry_after: retry_secs.map(Duration::from_secs),
            transaction_id: Some(tx.to_owned()),
            ..Answer::new(result)
        }
    }

    fn batch(items: &[(WebhookResult, Option<u64>)]) -> Answer {
        Answer::of_batch(
            items
                .iter()
                .enumerate()
                .map(|(i, (r, s))| answer(*r, *s, &format!("t{i}")))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn a_batch_is_answered_by_its_most_serious_item() {
        use WebhookResult::*;
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
        assert!(Answer::of_batch(Vec::new()).is_none());
    }

    #[test]
    fn only_durable_results_are_2xx() {
        for &r in WebhookResult::ALL {
            let durable = matches!(
                r,
                WebhookResult::Processed
                    | WebhookResult::Accepted
                    | WebhookResult::Duplicate
                    | WebhookResult::Ignored
                    | WebhookResult::Stale
                    | WebhookResult::Quarantined
            );
            assert_eq!(status(r).is_success(), durable, "{r:?}");
        }
    }

    #[test]
    fn a_body_that_timed_out_or_is_too_large_closes_the_connection() {
        let r = Answer::new(WebhookResult::RequestTimeout).response(None);
        assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(r.headers()[CONNECTION], "close");
        let r = Answer::new(WebhookResult::TooLarge).response(None);
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(r.headers()[CONNECTION], "close");
        let ok = Answer::new(WebhookResult::Processed).response(None);
        assert!(ok.headers().get(CONNECTION).is_none());
    }

    #[test]
    fn requests_that_are_no_delivery_keep_their_404_and_405() {
        assert_eq!(
            rejected(RejectReason::UnknownProvider).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            rejected(RejectReason::NotFound).status(),
            StatusCode::NOT_FOUND
        );
        let r = rejected(RejectReason::MethodNotAllowed);
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()[ALLOW], "POST");
    }

    #[test]
    fn the_connection_refusal_is_one_complete_response() {
        let text = std::str::from_utf8(CONNECTION_REFUSED).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(text.contains("\r\nRetry-After: 1\r\n"));
        assert!(text.contains("\r\nConnection: close\r\n"));
        assert!(text.ends_with("\r\nContent-Length: 0\r\n\r\n"));
    }

    #[test]
    fn adyen_gets_accepted_as_plain_text_only_on_success() {
        let adyen = Provider::new(
            "a",
            SchemeKind::Adyen,
            &["44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056".into()],
            None,
        )
        .unwrap();
        let stripe = Provider::new("s", SchemeKind::Stripe, &["whsec_x".into()], None).unwrap();
        let ok = answer(WebhookResult::Duplicate, None, "t").response(Some(&adyen));
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[CONTENT_TYPE], "text/plain");
        let retry = answer(WebhookResult::InProgress, Some(2), "t").response(Some(&adyen));
        assert_eq!(retry.status(), StatusCode::CONFLICT);
        assert_eq!(retry.headers()[RETRY_AFTER], "2");
        let json = answer(WebhookResult::Processed, None, "t").response(Some(&stripe));
        assert_eq!(json.headers()[CONTENT_TYPE], "application/json");
    }
}
