//! Log lines: text or JSON on stderr. With tracing on, a JSON line written
//! inside a traced span starts with the trace's `trace_id` and the span's
//! `span_id` (lowercase hex, as in `traceparent`), so a log search leads to
//! the trace and a trace's span to its log lines.

use std::fmt;
use std::sync::{Arc, OnceLock};

use opentelemetry::trace::TraceContextExt;
use tracing::dispatcher::WeakDispatch;
use tracing::{Dispatch, Event, Subscriber};
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

use crate::config::LogFormat;

/// The log layer, whichever format.
pub(super) type LogLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// The log layer; `traced`: JSON lines gain the trace ids.
pub(super) fn layer(kind: LogFormat, traced: bool) -> LogLayer {
    // Colour codes only for a person at a terminal: in a pipe, a file or a
    // log shipper they are noise that breaks searching.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let base = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let json = || {
        format()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
    };
    match (kind, traced) {
        (LogFormat::Text, _) => base.boxed(),
        (LogFormat::Json, false) => base.json().event_format(json()).boxed(),
        (LogFormat::Json, true) => {
            let dispatch = Arc::new(OnceLock::new());
            base.json()
                .event_format(TraceIds(json(), dispatch.clone()))
                .and_then(DispatchOf(dispatch))
                .boxed()
        }
    }
}

fn format() -> format::Format {
    format::Format::default()
}

/// A JSON event format with `trace_id` and `span_id` first when the line is
/// written inside a traced span. The span is the subscriber's current one,
/// asked of the subscriber itself ([`DispatchOf`]): the tracing layer does not
/// attach an OpenTelemetry context at every entry of a span (that cost a
/// traced delivery about a tenth of its instructions), and inside a
/// subscriber's callback `Span::current()` answers nothing under a scoped
/// subscriber.
pub(super) struct TraceIds<F>(pub(super) F, pub(super) Arc<OnceLock<WeakDispatch>>);

/// Keeps the subscriber this layer was registered with, for [`TraceIds`].
pub(super) struct DispatchOf(pub(super) Arc<OnceLock<WeakDispatch>>);

impl<S: Subscriber> Layer<S> for DispatchOf {
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        let _ = self.0.set(subscriber.downgrade());
    }
}

impl<S, N, F> FormatEvent<S, N> for TraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let cx = self.1.get().and_then(WeakDispatch::upgrade).and_then(|d| {
            let current = d.current_span();
            tracing_opentelemetry::get_otel_context(current.id()?, &d)
        });
        let Some(cx) = cx else {
            return self.0.format_event(ctx, writer, event);
        };
        let span = cx.span();
        let ids = span.span_context();
        if !ids.is_valid() {
            return self.0.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => {
                let sep = if rest.starts_with('}') { "" } else { "," };
                write!(
                    writer,
                    "{{\"trace_id\":\"{}\",\"span_id\":\"{}\"{sep}{rest}",
                    ids.trace_id(),
                    ids.span_id()
                )
            }
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::propagation;
    use std::sync::{Arc, Mutex};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_json_line_inside_a_traced_span_carries_its_trace_and_span_ids() {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let lines = Lines::default();
        let writer = lines.clone();
        let dispatch = Arc::new(OnceLock::new());
        let log = tracing_subscriber::fmt::layer()
            .json()
            .event_format(TraceIds(
                format()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false),
                dispatch.clone(),
            ))
            .with_writer(move || writer.clone())
            .and_then(DispatchOf(dispatch))
            .with_filter(tracing_subscriber::filter::filter_fn(|m| m.is_event()));
        // As the service installs it: no OpenTelemetry context attached on entry.
        let otel = tracing_opentelemetry::layer()
            .with_context_activation(false)
            .with_tracer(opentelemetry::trace::TracerProvider::tracer(&provider, "t"));
        let subscriber = tracing_subscriber::registry().with(log).with(otel);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside");
            let span = tracing::info_span!("fencehook.test");
            let parent =
                propagation::context_of("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
                    .unwrap();
            span.set_parent(parent).unwrap();
            let _entered = span.enter();
            tracing::info!(provider = "stripe", "inside");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let parsed: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        assert_eq!(parsed.len(), 2, "{text}");
        assert!(parsed[0].get("trace_id").is_none(), "{text}");
        assert_eq!(parsed[1]["trace_id"], "0af7651916cd43dd8448eb211c80319c");
        let span_id = parsed[1]["span_id"].as_str().unwrap();
        assert_eq!(span_id.len(), 16);
        assert_ne!(
            span_id, "b7ad6b7169203331",
            "the span's own id, not its parent's"
        );
        assert_eq!(parsed[1]["provider"], "stripe");
        assert_eq!(parsed[1]["message"], "inside");
    }
}
