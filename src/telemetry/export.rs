//! Finished spans to the collector: a bounded queue that a delivery never
//! waits on, emptied by one tokio task that exports in batches.
//!
//! Why not the SDK's `BatchSpanProcessor`: it runs on a thread of its own and
//! calls the exporter through a blocking executor (our HTTP client is a tokio
//! one), and it says that it dropped spans only in a log line. Here a full
//! queue drops the span at once and counts it
//! (`fencehook_trace_spans_dropped_total{reason="queue_full"}`), and a batch
//! the collector did not take is counted too (`reason="export_failed"`): a
//! collector that is down or slow costs spans, never a delivery's time.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry::Context;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::config::setting;
use crate::metrics::SpanDrop;
use crate::outbound::{self, HttpsClient};

/// The exporter's HTTP client: hyper's pooled client (the service's own)
/// over rustls with ring and Mozilla's roots, so an `https://` collector
/// needs no OpenSSL and no CA bundle on the host. Each request, the
/// collector's answer included, is bounded by the export timeout.
#[derive(Debug, Clone)]
pub struct CollectorClient {
    inner: HttpsClient,
    timeout: Duration,
}

/// A collector answers an export with a few bytes; a larger body is not read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

impl CollectorClient {
    pub fn new(timeout: Duration) -> Result<CollectorClient, String> {
        Ok(CollectorClient {
            inner: outbound::https(timeout)
                .map_err(|e| format!("{}: {e}", setting::OTEL_EXPORTER_OTLP_ENDPOINT))?,
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for CollectorClient {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, Full::new(body));
        let exchange = async {
            let response = self.inner.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, HttpError>(http::Response::from_parts(parts, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {} ms", self.timeout.as_millis()))?
    }
}

/// Spans dropped since start, by reason; read by `/metrics`.
#[derive(Debug, Default)]
pub struct Drops {
    queue_full: AtomicU64,
    export_failed: AtomicU64,
}

impl Drops {
    pub fn get(&self, reason: SpanDrop) -> u64 {
        self.counter(reason).load(Ordering::Relaxed)
    }

    fn add(&self, reason: SpanDrop, n: u64) {
        self.counter(reason).fetch_add(n, Ordering::Relaxed);
    }

    fn counter(&self, reason: SpanDrop) -> &AtomicU64 {
        match reason {
            SpanDrop::QueueFull => &self.queue_full,
            SpanDrop::ExportFailed => &self.export_failed,
        }
    }
}

/// How the queue is emptied (`OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_TIMEOUT`).
#[derive(Debug, Clone, Copy)]
pub struct BatchSettings {
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    pub schedule_delay: Duration,
    /// Bound on one export; the exporter has its own, this one holds even
    /// if it does not.
    pub export_timeout: Duration,
}

/// The span processor: `on_end` puts a sampled span in the queue or drops
/// and counts it; it never blocks.
#[derive(Debug)]
pub struct Batcher {
    queue: mpsc::Sender<SpanData>,
    /// Spans handed over and neither exported nor counted as dropped yet
    /// (queued, or in the batch being sent): what shutdown gives up on.
    queued: Arc<AtomicUsize>,
    drops: Arc<Drops>,
}

/// Stops the export task: it exports what is queued, bounded by a timeout.
#[derive(Debug)]
pub struct Flusher {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    queued: Arc<AtomicUsize>,
    drops: Arc<Drops>,
}

/// The processor for the tracer provider and the handle that flushes it;
/// the export task runs on the current tokio runtime.
pub fn batcher<E: SpanExporter + 'static>(
    exporter: E,
    settings: BatchSettings,
    drops: Arc<Drops>,
) -> (Batcher, Flusher) {
    let (tx, rx) = mpsc::channel(settings.max_queue_size);
    let (stop_tx, stop_rx) = oneshot::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(run(
        exporter,
        rx,
        stop_rx,
        settings,
        queued.clone(),
        drops.clone(),
    ));
    let batcher = Batcher {
        queue: tx,
        queued: queued.clone(),
        drops: drops.clone(),
    };
    let flusher = Flusher {
        stop: Some(stop_tx),
        task,
        queued,
        drops,
    };
    (batcher, flusher)
}

impl SpanProcessor for Batcher {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        match self.queue.try_send(span) {
            Ok(()) => {
                self.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Full(_)) => self.drops.add(SpanDrop::QueueFull, 1),
            // After shutdown: nobody exports it any more, nobody reads the count.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        // The task exports on its own schedule; shutdown flushes (async).
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // Never blocks a runtime thread: `Flusher::flush` is the shutdown.
        Ok(())
    }
}

impl Flusher {
    /// Exports what is queued and stops the task, within `timeout`; what
    /// could not be exported by then is counted as `export_failed`.
    /// Returns how many spans were given up.
    pub async fn flush(mut self, timeout: Duration) -> u64 {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(timeout, &mut self.task).await.is_ok() {
            return 0;
        }
        self.task.abort();
        let lost = self.queued.swap(0, Ordering::Relaxed) as u64;
        self.drops.add(SpanDrop::ExportFailed, lost);
        lost
    }
}

/// Exports sent at once, at most. One at a time could not keep up with one
/// instance's own spans: while a batch is encoded and sent, the next fills,
/// and on a busy machine one slow answer overflowed the queue
/// (docs/benchmarks.md). A second in flight sends it meanwhile.
const EXPORTS_IN_FLIGHT: usize = 2;

async fn run<E: SpanExporter>(
    exporter: E,
    mut rx: mpsc::Receiver<SpanData>,
    mut stop: oneshot::Receiver<()>,
    settings: BatchSettings,
    queued: Arc<AtomicUsize>,
    drops: Arc<Drops>,
) {
    let max = settings.max_export_batch_size;
    let timeout = settings.export_timeout;
    let mut exporting = Exporting {
        drops,
        queued,
        failing_since: None,
        last_warned: None,
    };
    let mut sending = FuturesUnordered::new();
    let mut batch: Vec<SpanData> = Vec::with_capacity(max);
    // When the oldest span of `batch` must leave, full or not.
    let mut due: Option<Instant> = None;
    loop {
        let wait_until = due.unwrap_or_else(|| Instant::now() + settings.schedule_delay);
        let room = max - batch.len();
        // A full batch waits here for a free export slot (the queue holds
        // what comes meanwhile).
        let ready = batch.len() >= max || (due.is_some_and(|d| d <= Instant::now()));
        let slot_free = sending.len() < EXPORTS_IN_FLIGHT;
        tokio::select! {
            biased;
            _ = &mut stop => break,
            Some((n, result)) = sending.next(), if !sending.is_empty() => {
                exporting.settled(n, result);
            }
            () = std::future::ready(()), if ready && slot_free => {
                let spans = std::mem::replace(&mut batch, Vec::with_capacity(max));
                sending.push(send(&exporter, timeout, spans));
                due = None;
            }
            n = rx.recv_many(&mut batch, room), if room > 0 => {
                if n == 0 {
                    break;
                }
                if due.is_none() {
                    due = Some(Instant::now() + settings.schedule_delay);
                }
            }
            _ = tokio::time::sleep_until(wait_until), if due.is_some() && !ready => {}
        }
    }
    // Shutdown: what is being sent is waited for, then what is queued goes
    // out, batch by batch.
    while let Some((n, result)) = sending.next().await {
        exporting.settled(n, result);
    }
    rx.close();
    loop {
        while batch.len() < max {
            match rx.try_recv() {
                Ok(span) => batch.push(span),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            break;
        }
        let (n, result) = send(&exporter, timeout, std::mem::take(&mut batch)).await;
        exporting.settled(n, result);
    }
}

/// What the export task counts and remembers of the exports' results.
struct Exporting {
    drops: Arc<Drops>,
    queued: Arc<AtomicUsize>,
    /// Set while exports fail: the log says so when it starts, at most
    /// once a minute while it lasts, and when it ends.
    failing_since: Option<Instant>,
    last_warned: Option<Instant>,
}

/// How one export ended: `Err` says why it was not taken.
type Sent = (usize, Result<(), String>);

/// One export of `spans`, bounded by `timeout`.
async fn send<E: SpanExporter>(exporter: &E, timeout: Duration, spans: Vec<SpanData>) -> Sent {
    let n = spans.len();
    let result = match tokio::time::timeout(timeout, exporter.export(spans)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    };
    (n, result)
}

impl Exporting {
    /// Counts what an export came to, and says when exports start or stop
    /// failing.
    fn settled(&mut self, n: usize, result: Result<(), String>) {
        // Counted as queued until here: a shutdown that gives up on this
        // export counts them.
        self.queued.fetch_sub(n, Ordering::Relaxed);
        let error = match result {
            Ok(()) => {
                if let Some(since) = self.failing_since.take() {
                    tracing::info!(
                        failing_for_s = since.elapsed().as_secs(),
                        "the trace collector takes spans again"
                    );
                }
                self.last_warned = None;
                return;
            }
            Err(error) => error,
        };
        self.drops.add(SpanDrop::ExportFailed, n as u64);
        let now = Instant::now();
        self.failing_since.get_or_insert(now);
        if self
            .last_warned
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
        {
            self.last_warned = Some(now);
            tracing::warn!(
                spans = n,
                error = %error,
                "could not export spans to the trace collector; they are dropped (deliveries are not affected)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
    use opentelemetry::InstrumentationScope;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanEvents, SpanLinks};
    use std::time::SystemTime;

    fn span(i: u64, sampled: bool) -> SpanData {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(u128::from(i) + 1),
                SpanId::from(i + 1),
                flags,
                false,
                Default::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "test".into(),
            start_time: SystemTime::now(),
            end_time: SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("test").build(),
        }
    }

    fn settings(queue: usize, batch: usize) -> BatchSettings {
        BatchSettings {
            max_queue_size: queue,
            max_export_batch_size: batch,
            schedule_delay: Duration::from_millis(20),
            export_timeout: Duration::from_millis(200),
        }
    }

    /// An exporter whose collector never answers.
    #[derive(Debug)]
    struct Stalled;

    impl SpanExporter for Stalled {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            std::future::pending().await
        }
    }

    async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn sampled_spans_are_exported_in_batches_and_unsampled_ones_never() {
        let exporter = InMemorySpanExporter::default();
        let drops = Arc::new(Drops::default());
        let (batcher, flusher) = batcher(exporter.clone(), settings(64, 4), drops.clone());
        for i in 0..10 {
            batcher.on_end(span(i, i % 2 == 0));
        }
        wait_for("5 spans exported", || {
            exporter.get_finished_spans().unwrap().len() == 5
        })
        .await;
        assert_eq!(flusher.flush(Duration::from_secs(5)).await, 0);
        assert_eq!(drops.get(SpanDrop::QueueFull), 0);
        assert_eq!(drops.get(SpanDrop::ExportFailed), 0);
    }

    #[tokio::test]
    async fn a_stalled_collector_drops_and_counts_spans_without_blocking_the_caller() {
        let drops = Arc::new(Drops::default());
        let (batcher, flusher) = batcher(Stalled, settings(8, 4), drops.clone());
        let started = std::time::Instant::now();
        for i in 0..1000 {
            batcher.on_end(span(i, true));
        }
        // 1,000 spans handed over while the exporter hangs: never waited for.
        assert!(started.elapsed() < Duration::from_secs(1));
        let full = drops.get(SpanDrop::QueueFull);
        // The queue (8), the batch being gathered (4) and at most two
        // batches in stalled exports (4 each) hold the rest; every other
        // span is counted.
        assert!((1000 - 20..=1000 - 8).contains(&full), "{full}");
        // The stalled exports time out (200 ms) and their spans are counted.
        wait_for("a failed export counted", || {
            drops.get(SpanDrop::ExportFailed) > 0
        })
        .await;
        // Shutdown gives up at its bound and counts what it could not send.
        let t = std::time::Instant::now();
        flusher.flush(Duration::from_millis(100)).await;
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(
            drops.get(SpanDrop::QueueFull) + drops.get(SpanDrop::ExportFailed),
            1000,
            "every span is exported or counted"
        );
    }

    /// An exporter whose first export waits until it is let go; the
    /// others are taken at once.
    #[derive(Debug)]
    struct FirstHeld {
        released: Arc<tokio::sync::Notify>,
        calls: Arc<AtomicUsize>,
        taken: Arc<AtomicUsize>,
    }

    impl SpanExporter for FirstHeld {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                self.released.notified().await;
            }
            self.taken.fetch_add(batch.len(), Ordering::SeqCst);
            Ok(())
        }
    }

    /// One slow answer from the collector does not stop the export: the
    /// next batch goes out while it is awaited (with one export at a time,
    /// the queue filled behind it and spans were dropped).
    #[tokio::test]
    async fn a_batch_is_exported_while_an_earlier_export_is_still_unanswered() {
        let released = Arc::new(tokio::sync::Notify::new());
        let taken = Arc::new(AtomicUsize::new(0));
        let exporter = FirstHeld {
            released: released.clone(),
            calls: Arc::new(AtomicUsize::new(0)),
            taken: taken.clone(),
        };
        let drops = Arc::new(Drops::default());
        let mut slow = settings(64, 4);
        slow.export_timeout = Duration::from_secs(3600);
        let (batcher, flusher) = batcher(exporter, slow, drops.clone());
        for i in 0..8 {
            batcher.on_end(span(i, true));
        }
        wait_for("the second batch exported", || {
            taken.load(Ordering::SeqCst) == 4
        })
        .await;
        released.notify_one();
        wait_for("both batches exported", || {
            taken.load(Ordering::SeqCst) == 8
        })
        .await;
        assert_eq!(flusher.flush(Duration::from_secs(5)).await, 0);
        assert_eq!(drops.get(SpanDrop::ExportFailed), 0);
    }

    #[tokio::test]
    async fn shutdown_exports_what_is_queued_before_the_schedule_delay() {
        let exporter = InMemorySpanExporter::default();
        let drops = Arc::new(Drops::default());
        let mut slow = settings(64, 16);
        slow.schedule_delay = Duration::from_secs(3600);
        let (batcher, flusher) = batcher(exporter.clone(), slow, drops.clone());
        for i in 0..40 {
            batcher.on_end(span(i, true));
        }
        assert_eq!(flusher.flush(Duration::from_secs(5)).await, 0);
        assert_eq!(exporter.get_finished_spans().unwrap().len(), 40);
    }
}
