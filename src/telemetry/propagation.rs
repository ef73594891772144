//! W3C trace context (`traceparent`, `tracestate`) in and out: a PSP's
//! request (or the TLS front's) names the delivery span's parent, the
//! downstream request names the client span, and an inbox event keeps the
//! context it was accepted under. Each helper does nothing with tracing off.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The remote parent named by `headers`, when they carry a valid
/// `traceparent` and tracing is on.
pub fn parent_of(headers: &http::HeaderMap) -> Option<Context> {
    if !super::enabled() || !headers.contains_key("traceparent") {
        return None;
    }
    valid(TraceContextPropagator::new().extract(&HeaderExtractor(headers)))
}

/// Names the current span in `headers` (`traceparent`, and `tracestate`
/// when the trace has one), so the receiver's spans join the trace.
pub fn inject(headers: &mut http::HeaderMap) {
    if !super::enabled() {
        return;
    }
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
}

/// The current span as a `traceparent` value (with `tracestate` after a
/// newline when there is one), to be stored with an inbox event; `None`
/// with tracing off or outside a traced span.
pub fn current() -> Option<String> {
    if !super::enabled() {
        return None;
    }
    let cx = tracing::Span::current().context();
    let mut fields = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut fields);
    let parent = fields.remove("traceparent")?;
    Some(
        match fields.remove("tracestate").filter(|s| !s.is_empty()) {
            Some(state) => format!("{parent}\n{state}"),
            None => parent,
        },
    )
}

/// The context a stored value of [`current`] names, when it is valid.
pub fn context_of(stored: &str) -> Option<Context> {
    let (parent, state) = stored.split_once('\n').unwrap_or((stored, ""));
    let mut fields = HashMap::new();
    fields.insert("traceparent".to_owned(), parent.trim().to_owned());
    if !state.is_empty() {
        fields.insert("tracestate".to_owned(), state.trim().to_owned());
    }
    valid(TraceContextPropagator::new().extract(&fields))
}

fn valid(cx: Context) -> Option<Context> {
    cx.span().span_context().is_valid().then_some(cx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_trace_context_names_its_trace_and_parent_and_bad_ones_are_none() {
        let cx = context_of("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\nvendor=x")
            .expect("valid");
        let span = cx.span();
        let sc = span.span_context();
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.span_id().to_string(), "b7ad6b7169203331");
        assert!(sc.is_sampled() && sc.is_remote());
        assert_eq!(sc.trace_state().get("vendor"), Some("x"));
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        ] {
            assert!(context_of(bad).is_none(), "{bad:?}");
        }
    }
}
