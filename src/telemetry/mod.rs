//! The process's telemetry: log lines (text or JSON) and, when an OTLP
//! endpoint is set, OpenTelemetry traces.
//!
//! The service's `tracing` spans (their names and attributes in [`spans`])
//! become OpenTelemetry spans through `tracing-opentelemetry`'s layer, which
//! is installed only when tracing is configured: otherwise no layer asks for
//! a span, every span callsite is disabled once (its interest is `never`,
//! cached at the callsite: see `EventsOnly`), and a span costs a branch.
//! Log lines never carry spans (their layer filters them out), so a log line
//! reads the same with tracing on or off, save the `trace_id`/`span_id` a
//! JSON line gains inside a traced delivery (`telemetry/logs.rs`).
//!
//! Export: [`export`] (a bounded queue, one tokio task, drops counted),
//! to the collector in protobuf by `otlp.rs` (in JSON by the SDK's exporter).
//! W3C trace context in and out: [`propagation`].

pub mod export;
mod logs;
mod otlp;
pub mod propagation;
pub mod spans;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter as _};
use opentelemetry_sdk::Resource;
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::filter::Filtered;
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use self::logs::LogLayer;
use crate::config::{setting, LogFormat, OtlpProtocol, Sampler, SamplerRoot, TraceConfig};
use crate::metrics::SpanDrop;

/// Whether this process exports traces: the edges (extracting an incoming
/// `traceparent`, injecting one downstream) skip their work when it does not.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The drop counts of the process's exporter, for `/metrics`.
static DROPS: OnceLock<Arc<export::Drops>> = OnceLock::new();

/// True when OpenTelemetry traces are on in this process.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The unit tests of span structure install the tracing layer themselves.
#[cfg(test)]
pub(crate) fn enable_for_tests() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Spans dropped since start for `reason` (0 with tracing off).
pub fn spans_dropped(reason: SpanDrop) -> u64 {
    DROPS.get().map_or(0, |d| d.get(reason))
}

/// What must be flushed at shutdown.
pub struct Telemetry {
    traces: Option<(SdkTracerProvider, export::Flusher)>,
}

impl Telemetry {
    /// Exports the spans still queued, within `timeout` (the drain bound):
    /// a collector that does not answer delays the exit by at most that.
    pub async fn shutdown(self, timeout: Duration) {
        let Some((provider, flusher)) = self.traces else {
            return;
        };
        let lost = flusher.flush(timeout).await;
        if lost > 0 {
            tracing::warn!(
                spans = lost,
                "spans still queued at shutdown were not exported within {}",
                setting::FENCEHOOK_SHUTDOWN_TIMEOUT_MS
            );
        }
        ENABLED.store(false, Ordering::Relaxed);
        drop(provider);
    }
}

/// Installs the process's subscriber: log lines at `levels` in `format`,
/// and with `traces` the OpenTelemetry layer and its exporter (whose task
/// runs on the current runtime). `Err` is one line: the exporter could not
/// be built from the settings.
pub fn install(
    format: LogFormat,
    levels: &str,
    traces: Option<&TraceConfig>,
) -> Result<Telemetry, String> {
    let traced = match traces {
        Some(cfg) => Some(tracer_provider(cfg)?),
        None => None,
    };
    // Logged once the subscriber is up, in its format: a plain line first
    // would break a reader of JSON lines.
    let mut bad_filter = None;
    let filter = EnvFilter::try_new(levels).unwrap_or_else(|e| {
        bad_filter = Some(format!(
            "{} `{levels}` is not a log filter ({e}); using info",
            setting::FENCEHOOK_LOG
        ));
        EnvFilter::new("info")
    });
    let logs = logs::layer(format, traced.is_some()).with_filter(EventsOnly(filter));
    match &traced {
        Some((provider, _)) => {
            let otel = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("fencehook"))
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                .with_level(false)
                .with_tracked_inactivity(false)
                // Nothing reads the OpenTelemetry context a span's entry
                // would attach (the log lines ask the subscriber, see
                // `logs::TraceIds`), and attaching it at every poll of every
                // instrumented future was ~20,000 instructions a delivery.
                .with_context_activation(false)
                .with_filter(OwnSpans);
            tracing_subscriber::registry().with(logs).with(otel).init();
        }
        None => untraced(logs).init(),
    }
    if let Some(warning) = bad_filter {
        tracing::warn!("{warning}");
    }
    if traced.is_some() {
        ENABLED.store(true, Ordering::Relaxed);
    }
    Ok(Telemetry { traces: traced })
}

/// The subscriber with tracing off: the log layer alone. No tracing layer
/// at all rather than an absent one: an absent layer (`Option::None`)
/// answers every callsite `always`, which left each span callsite
/// `sometimes`, asked of the filters at every span of every delivery.
fn untraced(logs: Filtered<LogLayer, EventsOnly, Registry>) -> impl Subscriber + Send + Sync {
    tracing_subscriber::registry().with(logs)
}

/// The log layer's filter: the events `FENCEHOOK_LOG` lets through, and
/// never a span (log lines do not carry spans). Decided per callsite, once:
/// a span callsite's interest is `never`, so with tracing off the span
/// macros on a delivery's path return a disabled span without asking any
/// filter, where a per-call filter made every span evaluate the log filter.
struct EventsOnly(EnvFilter);

impl<S: Subscriber> Filter<S> for EventsOnly {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        meta.is_event() && Filter::<S>::enabled(&self.0, meta, cx)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if meta.is_event() {
            Filter::<S>::callsite_enabled(&self.0, meta)
        } else {
            Interest::never()
        }
    }

    /// `FENCEHOOK_LOG`'s most verbose level: the process's maximum level
    /// (with tracing off), so a `debug` record of a library stops at the
    /// level check. (A filter combined with a closure had no hint, which
    /// made the maximum `trace`.)
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Filter::<S>::max_level_hint(&self.0)
    }
}

/// The tracing layer's filter: the service's own spans only (not a
/// library's), and no event (a log line may hold what no attribute may).
/// Decided per callsite, once.
struct OwnSpans;

impl OwnSpans {
    fn wants(meta: &Metadata<'_>) -> bool {
        meta.is_span() && meta.target().starts_with("fencehook")
    }
}

impl<S: Subscriber> Filter<S> for OwnSpans {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        OwnSpans::wants(meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if OwnSpans::wants(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    /// Every span of [`spans`] is at `info`: without a hint the process's
    /// maximum level would be `trace`, and every `log` record of a library
    /// (tokio-postgres writes one per statement at `debug`) would be built
    /// and handed to the filters instead of stopped by the level check.
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::INFO)
    }
}

/// The tracer provider: sampler, resource, and the OTLP/HTTP exporter
/// behind the batching queue.
fn tracer_provider(cfg: &TraceConfig) -> Result<(SdkTracerProvider, export::Flusher), String> {
    let resource = resource(cfg);
    let client = export::CollectorClient::new(cfg.timeout)?;
    let drops = DROPS.get_or_init(Default::default).clone();
    let settings = export::BatchSettings {
        max_queue_size: cfg.max_queue_size,
        max_export_batch_size: cfg.max_export_batch_size,
        schedule_delay: cfg.schedule_delay,
        // The exporter's own bound covers its retries; a little more
        // for encoding, so that this one fires only if that one did not.
        export_timeout: cfg.timeout + Duration::from_millis(500),
    };
    let (batcher, flusher) = match cfg.protocol {
        OtlpProtocol::Protobuf => {
            let mut exporter = otlp::ProtobufExporter::new(
                client,
                cfg.endpoint.clone(),
                &cfg.headers,
                cfg.timeout,
            );
            exporter.set_resource(&resource);
            export::batcher(exporter, settings, drops)
        }
        OtlpProtocol::Json => {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_endpoint(cfg.endpoint.to_string())
                .with_protocol(opentelemetry_otlp::Protocol::HttpJson)
                .with_timeout(cfg.timeout)
                .with_headers(cfg.headers.iter().cloned().collect())
                .build()
                .map_err(|e| format!("{}: {e}", setting::OTEL_EXPORTER_OTLP_ALL))?;
            exporter.set_resource(&resource);
            export::batcher(exporter, settings, drops)
        }
    };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(batcher)
        .with_sampler(sampler(cfg.sampler))
        .with_resource(resource)
        .build();
    Ok((provider, flusher))
}

/// `service.name`, `service.version` and `OTEL_RESOURCE_ATTRIBUTES`.
fn resource(cfg: &TraceConfig) -> Resource {
    Resource::builder_empty()
        .with_attributes(
            cfg.resource_attributes
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .with_service_name(cfg.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}

pub(crate) fn sampler(s: Sampler) -> opentelemetry_sdk::trace::Sampler {
    use opentelemetry_sdk::trace::Sampler as Sdk;
    let root = match s.root {
        SamplerRoot::AlwaysOn => Sdk::AlwaysOn,
        SamplerRoot::AlwaysOff => Sdk::AlwaysOff,
        SamplerRoot::Ratio(r) => Sdk::TraceIdRatioBased(r),
    };
    if s.parent_based {
        Sdk::ParentBased(Box::new(root))
    } else {
        root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A span callsite of the service's, as the spans module opens them.
    fn span_callsite() -> &'static Metadata<'static> {
        tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            tracing::info_span!(target: "fencehook::http::webhook", "fencehook.delivery")
                .metadata()
                .expect("a bare registry enables every span")
        })
    }

    #[test]
    fn with_tracing_off_span_callsites_are_never_enabled_and_the_level_is_the_log_filters() {
        let logs = logs::layer(LogFormat::Json, false).with_filter(EventsOnly(EnvFilter::new(
            "warn,fencehook=info,fencehook::http::webhook=warn",
        )));
        let subscriber = untraced(logs);
        // `never` is cached at the callsite: the span macro returns a
        // disabled span without asking any filter again.
        assert!(subscriber.register_callsite(span_callsite()).is_never());
        // And the log crate's records of the libraries stop at the level.
        assert_eq!(subscriber.max_level_hint(), Some(LevelFilter::INFO));
    }

    #[test]
    fn the_tracing_layer_wants_the_services_spans_only_decided_per_callsite() {
        let own = span_callsite();
        assert!(Filter::<Registry>::callsite_enabled(&OwnSpans, own).is_always());
        let library = tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            tracing::info_span!(target: "hyper::proto", "parse")
                .metadata()
                .expect("enabled")
        });
        assert!(Filter::<Registry>::callsite_enabled(&OwnSpans, library).is_never());
    }
}
