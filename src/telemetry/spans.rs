//! Every span the service opens, with its attributes: one place, so the
//! code that opens them stays one line, and docs/reference.md lists exactly
//! these ("Traces"). Names follow OpenTelemetry's HTTP semantic conventions
//! where one applies (`http.*`, `url.*`, `server.*`); fencehook's own
//! attributes are under `fencehook.`.
//!
//! No attribute ever holds a secret, a signature, a header value other than
//! the user agent, or a body. `fencehook.transaction_id` (the PSP's id of a
//! payment, refund or dispute: no secret, and what an operator searches by)
//! is set on the delivery and on the spans of one item.
//!
//! Integers are recorded as `i64`: the tracing layer exports an unsigned
//! one as a string.
//!
//! With tracing off no layer wants these spans: each macro below is a
//! disabled callsite, and recording into its span does nothing.

use std::future::Future;

use futures_util::FutureExt;
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::propagation;
use crate::domain::CanonicalEvent;

/// `fut` as the whole of the leaf span `span`: the span is open from its
/// making until `fut` is done, and never entered. `Instrument` enters a span
/// and exits it at every poll of its future, and with tracing on each entry
/// and exit costs the subscriber a lookup of the span (its exit also stamps
/// an end time); a leaf — a single statement, a lease call — has no span
/// below it to parent, so it needs neither. A log line written inside one
/// carries the ids of the span around it.
pub fn leaf<F: Future>(span: Span, fut: F) -> impl Future<Output = F::Output> {
    fut.map(move |out| {
        drop(span);
        out
    })
}

/// `POST /webhooks/{provider}`, the server span of one delivery: its parent
/// is the request's `traceparent`, when it carries a valid one.
pub fn delivery(provider: &str, path: &str, headers: &http::HeaderMap) -> Span {
    let span = tracing::info_span!(
        "fencehook.delivery",
        otel.name = "POST /webhooks/{provider}",
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = "POST",
        http.route = "/webhooks/{provider}",
        url.path = path,
        url.scheme = "http",
        user_agent.original = Empty,
        http.response.status_code = Empty,
        fencehook.provider = provider,
        fencehook.result = Empty,
        fencehook.transaction_id = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(agent) = headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
    {
        span.record("user_agent.original", agent);
    }
    if let Some(parent) = propagation::parent_of(headers) {
        // Before the span is first entered: its parent is fixed then.
        let _ = span.set_parent(parent);
    }
    span
}

/// The answer of a delivery on its span: the result label, the status, and
/// the error status for a 5xx (a 4xx is the PSP's fault, not the server's).
pub fn answered(span: &Span, result: &str, status: u16, transaction_id: Option<&str>) {
    span.record("fencehook.result", result);
    span.record("http.response.status_code", i64::from(status));
    if let Some(id) = transaction_id {
        span.record("fencehook.transaction_id", id);
    }
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// `fencehook.verify`: the provider checks the signature and maps the body
/// (PayPal's transmission binding and confirmation included).
pub fn verify(provider: &str) -> Span {
    tracing::info_span!(
        "fencehook.verify",
        fencehook.provider = provider,
        fencehook.verified = Empty,
        fencehook.items = Empty,
    )
}

/// What the verification found: whether the delivery verified and mapped,
/// and into how many items. The span ends here, as [`lease_acquired`]'s.
pub fn verified<T, E>(span: Span, accepted: &Result<Vec<T>, E>, gate_passed: bool) {
    match accepted {
        Ok(items) => {
            span.record("fencehook.verified", gate_passed);
            span.record("fencehook.items", items.len() as i64);
        }
        Err(_) => {
            span.record("fencehook.verified", false);
        }
    }
}

/// `POST`, the client span of one downstream call; the request carries its
/// `traceparent`.
pub fn downstream(url: &http::Uri, token: i64) -> Span {
    let span = tracing::info_span!(
        "fencehook.downstream",
        otel.name = "POST",
        otel.kind = "client",
        otel.status_code = Empty,
        http.request.method = "POST",
        server.address = url.host().unwrap_or(""),
        server.port = i64::from(url.port_u16().unwrap_or(80)),
        url.full = Empty,
        http.response.status_code = Empty,
        error.type = Empty,
        fencehook.fencing_token = token,
    );
    if !span.is_disabled() {
        span.record("url.full", call_url(url));
    }
    span
}

/// What stands for a downstream URL's path and query in its span.
const REDACTED: &str = "REDACTED";

/// `url.full` of a downstream call: its scheme, host and port, the path and
/// query replaced by [`REDACTED`] (as OpenTelemetry's conventions redact a
/// URL's credentials). A downstream URL may carry a token in its path
/// (`/hooks/<token>`), and every span goes to the collector: the URL itself
/// is in the settings, and `check-config` shows it.
fn call_url(url: &http::Uri) -> String {
    let mut out = format!(
        "{}://{}",
        url.scheme_str().unwrap_or("http"),
        url.host().unwrap_or("")
    );
    if let Some(port) = url.port_u16() {
        out.push_str(&format!(":{port}"));
    }
    match (url.path(), url.query()) {
        ("" | "/", None) => out.push('/'),
        _ => {
            out.push('/');
            out.push_str(REDACTED);
        }
    }
    out
}

/// The downstream's answer on its span: the status, or why there was none.
pub fn downstream_answered(span: &Span, status: Option<u16>, error: Option<&str>) {
    if let Some(status) = status {
        span.record("http.response.status_code", i64::from(status));
        if !(200..300).contains(&status) {
            span.record("error.type", tracing::field::display(status));
            span.record("otel.status_code", "ERROR");
        }
    }
    if let Some(error) = error {
        span.record("error.type", error);
        span.record("otel.status_code", "ERROR");
    }
}

/// `fencehook.process`: one event of a delivery, booked under its own lease
/// (sync mode).
pub fn process(ev: &CanonicalEvent) -> Span {
    tracing::info_span!(
        "fencehook.process",
        fencehook.transaction_id = %ev.transaction_id,
        fencehook.event_type = ev.event_type.as_str(),
    )
}

/// `fencehook.fast_path`: the read of the object's row that settles a copy
/// already booked without the lease.
pub fn fast_path() -> Span {
    tracing::info_span!("fencehook.fast_path")
}

/// `fencehook.lease.acquire`: one attempt at the lease; its token when it
/// was taken, `fencehook.lease.result` = `acquired` or `held` (another
/// holder has it).
pub fn lease_acquire() -> Span {
    tracing::info_span!(
        "fencehook.lease.acquire",
        fencehook.lease.result = Empty,
        fencehook.fencing_token = Empty,
    )
}

/// What an acquire got: the token, or `None` when another holder has it.
/// The span ends here (a step's span is never entered: it ends when its
/// last handle goes).
pub fn lease_acquired(span: Span, token: Option<i64>) {
    match token {
        Some(token) => {
            span.record("fencehook.lease.result", "acquired");
            span.record("fencehook.fencing_token", token);
        }
        None => {
            span.record("fencehook.lease.result", "held");
        }
    }
}

/// `fencehook.wait_for_holder`: another holder has the lease (or the
/// payment's row): a pause, then a read of the row.
pub fn wait_for_holder() -> Span {
    tracing::info_span!("fencehook.wait_for_holder")
}

/// `fencehook.commit`: the inline path's one transaction (claim, booking
/// and finalize at once), under `token`.
pub fn commit(token: i64) -> Span {
    tracing::info_span!("fencehook.commit", fencehook.fencing_token = token)
}

/// `fencehook.commit` with the PostgreSQL lease taken inside the same
/// transaction (no separate acquire or release).
pub fn commit_leased() -> Span {
    tracing::info_span!("fencehook.commit", fencehook.lease.inside = true)
}

/// `fencehook.claim`: the fenced claim before a downstream call.
pub fn claim(token: i64) -> Span {
    tracing::info_span!("fencehook.claim", fencehook.fencing_token = token)
}

/// `fencehook.finalize`: the fenced finalize after the downstream's 2xx.
pub fn finalize(token: i64) -> Span {
    tracing::info_span!("fencehook.finalize", fencehook.fencing_token = token)
}

/// `fencehook.give_back`: a refund's reserved money returned after the
/// downstream refused the step.
pub fn give_back(token: i64) -> Span {
    tracing::info_span!("fencehook.give_back", fencehook.fencing_token = token)
}

/// `fencehook.lease.release`: the compare-and-delete of the lease.
pub fn lease_release(token: i64) -> Span {
    tracing::info_span!("fencehook.lease.release", fencehook.fencing_token = token)
}

/// The lease ended before the work did (a renewal lost, a newer token in
/// the database): an event `fencehook.lease.lost` on the current span, with
/// the token and why.
pub fn lease_lost(token: i64, reason: &str) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.add_event(
        "fencehook.lease.lost",
        vec![
            opentelemetry::KeyValue::new("fencehook.fencing_token", token),
            opentelemetry::KeyValue::new("fencehook.lease.lost_reason", reason.to_owned()),
        ],
    );
}

/// `fencehook.inbox.accept`: inbox mode's one durable write of an event;
/// the context stored with the event is this span's.
pub fn inbox_accept(ev: &CanonicalEvent) -> Span {
    tracing::info_span!(
        "fencehook.inbox.accept",
        fencehook.transaction_id = %ev.transaction_id,
        fencehook.event_type = ev.event_type.as_str(),
    )
}

/// `fencehook.inbox.attempt`: one worker attempt at a stored event. Its
/// parent and its link are the accept's span (the context stored with the
/// event), so the attempts join the PSP's trace; an event stored with no
/// context (tracing off at the accept) starts a trace of its own.
pub fn inbox_attempt(ev: &CanonicalEvent, attempt: i32, stored: Option<&str>) -> Span {
    let span = tracing::info_span!(
        "fencehook.inbox.attempt",
        fencehook.transaction_id = %ev.transaction_id,
        fencehook.event_type = ev.event_type.as_str(),
        fencehook.inbox.attempt = attempt,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(accepted) = stored.and_then(propagation::context_of) {
        let linked = {
            use opentelemetry::trace::TraceContextExt;
            accepted.span().span_context().clone()
        };
        span.add_link(linked);
        let _ = span.set_parent(accepted);
    }
    span
}

#[cfg(test)]
mod tests {
    //! Span structure, through the SDK's in-memory exporter.

    use super::*;
    use opentelemetry::trace::{SpanKind, Status, TracerProvider as _};
    use opentelemetry::Value;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// Runs `f` under a subscriber with the OpenTelemetry layer (as
    /// `telemetry::install` builds it) and returns the finished spans.
    fn traced(f: impl FnOnce()) -> Vec<SpanData> {
        crate::telemetry::enable_for_tests();
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("fencehook"))
            .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.is_span() && m.target().starts_with("fencehook")
            }));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
        exporter.get_finished_spans().unwrap()
    }

    fn attr(span: &SpanData, key: &str) -> Option<Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    }

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_delivery_is_a_server_span_under_the_requests_traceparent_and_carries_its_answer() {
        let spans = traced(|| {
            let h = headers(&[("traceparent", TRACEPARENT), ("user-agent", "Stripe/1.0")]);
            let span = delivery("stripe", "/webhooks/stripe", &h);
            let _in = span.enter();
            let child = verify("stripe");
            child.in_scope(|| {});
            answered(&span, "unavailable", 503, Some("pi_1"));
        });
        let server = spans
            .iter()
            .find(|s| s.name == "POST /webhooks/{provider}")
            .unwrap();
        assert_eq!(server.span_kind, SpanKind::Server);
        assert_eq!(
            server.span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(server.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert!(server.parent_span_is_remote);
        assert_eq!(attr(server, "http.request.method"), Some("POST".into()));
        assert_eq!(
            attr(server, "http.route"),
            Some("/webhooks/{provider}".into())
        );
        assert_eq!(attr(server, "url.path"), Some("/webhooks/stripe".into()));
        assert_eq!(
            attr(server, "user_agent.original"),
            Some("Stripe/1.0".into())
        );
        assert_eq!(
            attr(server, "http.response.status_code"),
            Some(503_i64.into())
        );
        assert_eq!(attr(server, "fencehook.result"), Some("unavailable".into()));
        assert_eq!(
            attr(server, "fencehook.transaction_id"),
            Some("pi_1".into())
        );
        assert!(
            matches!(server.status, Status::Error { .. }),
            "a 5xx is an error"
        );
        let verify = spans.iter().find(|s| s.name == "fencehook.verify").unwrap();
        assert_eq!(verify.parent_span_id, server.span_context.span_id());
        assert_eq!(verify.span_kind, SpanKind::Internal);
    }

    #[test]
    fn a_downstream_call_is_a_client_span_and_a_refusal_marks_it_an_error() {
        let spans = traced(|| {
            let url: http::Uri = "http://orders.internal:8081/hooks/s3cret/payments?k=v"
                .parse()
                .unwrap();
            let span = downstream(&url, 7);
            downstream_answered(&span, Some(409), None);
        });
        let call = &spans[0];
        assert_eq!(call.name, "POST");
        assert_eq!(call.span_kind, SpanKind::Client);
        assert_eq!(attr(call, "server.address"), Some("orders.internal".into()));
        assert_eq!(attr(call, "server.port"), Some(8081_i64.into()));
        assert_eq!(
            attr(call, "url.full"),
            Some("http://orders.internal:8081/REDACTED".into()),
            "no path, no query string"
        );
        assert_eq!(attr(call, "fencehook.fencing_token"), Some(7_i64.into()));
        assert_eq!(
            attr(call, "http.response.status_code"),
            Some(409_i64.into())
        );
        assert!(matches!(call.status, Status::Error { .. }));
    }

    #[test]
    fn an_inbox_attempt_is_a_child_of_and_linked_to_the_accept_it_was_stored_under() {
        let ev = CanonicalEvent {
            provider: "generic".to_owned(),
            transaction_id: "pay_inbox".to_owned(),
            event_type: crate::domain::EventKind::PaymentSucceeded,
            amount_minor: 100,
            currency: "EUR".to_owned(),
            parent_transaction_id: None,
            occurred_at: None,
            merchant_reference: None,
            metadata: None,
        };
        let spans = traced(|| {
            let h = headers(&[("traceparent", TRACEPARENT)]);
            let server = delivery("generic", "/webhooks/generic", &h);
            let stored = server.in_scope(|| inbox_accept(&ev).in_scope(propagation::current));
            let stored = stored.expect("a context is stored");
            inbox_attempt(&ev, 1, Some(&stored)).in_scope(|| {
                lease_acquire().in_scope(|| {});
            });
        });
        let accept = spans
            .iter()
            .find(|s| s.name == "fencehook.inbox.accept")
            .unwrap();
        let attempt = spans
            .iter()
            .find(|s| s.name == "fencehook.inbox.attempt")
            .unwrap();
        assert_eq!(
            attempt.span_context.trace_id(),
            accept.span_context.trace_id(),
            "the PSP's trace"
        );
        assert_eq!(attempt.parent_span_id, accept.span_context.span_id());
        let links: Vec<_> = attempt
            .links
            .iter()
            .map(|l| l.span_context.span_id())
            .collect();
        assert_eq!(links, vec![accept.span_context.span_id()]);
        assert_eq!(attr(attempt, "fencehook.inbox.attempt"), Some(1_i64.into()));
        let acquire = spans
            .iter()
            .find(|s| s.name == "fencehook.lease.acquire")
            .unwrap();
        assert_eq!(acquire.parent_span_id, attempt.span_context.span_id());
    }

    #[test]
    fn without_the_tracing_layer_every_span_is_disabled() {
        let log = tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(tracing_subscriber::filter::filter_fn(|m| m.is_event()));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(log), || {
            let h = headers(&[("traceparent", TRACEPARENT)]);
            assert!(delivery("generic", "/webhooks/generic", &h).is_disabled());
            assert!(lease_acquire().is_disabled());
            assert!(commit(1).is_disabled());
        });
    }
}
