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
//! With tracing off no layer wants these spans: each macro below is a
//! disabled callsite, and recording into its span does nothing.

use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::propagation;

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
    span.record("http.response.status_code", status);
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
/// and into how many items.
pub fn verified<T, E>(span: &Span, accepted: &Result<Vec<T>, E>, gate_passed: bool) {
    match accepted {
        Ok(items) => {
            span.record("fencehook.verified", gate_passed);
            span.record("fencehook.items", items.len());
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
        server.port = url.port_u16().unwrap_or(80),
        url.full = Empty,
        http.response.status_code = Empty,
        error.type = Empty,
        fencehook.fencing_token = token,
    );
    if !span.is_disabled() {
        span.record("url.full", crate::config::redacted_url(url));
    }
    span
}

/// The downstream's answer on its span: the status, or why there was none.
pub fn downstream_answered(span: &Span, status: Option<u16>, error: Option<&str>) {
    if let Some(status) = status {
        span.record("http.response.status_code", status);
        if !(200..300).contains(&status) {
            span.record("error.type", status);
            span.record("otel.status_code", "ERROR");
        }
    }
    if let Some(error) = error {
        span.record("error.type", error);
        span.record("otel.status_code", "ERROR");
    }
}
