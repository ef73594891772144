//! Metric names, their label values, and the per-application registry.
//!
//! Names are part of fencehook's contract with the dashboards and alert rules
//! in `deploy/`; each is declared once, with its kind, labels and help text,
//! in [`TABLE`], and the registry is derived from it. Label values are enums,
//! never loose strings: every value of a label is listed once (`ALL`), so each
//! series is registered at zero from start and a new value cannot be forgotten.
//!
//! Each [`App`](crate::app::App) owns its own Prometheus recorder instead of
//! installing a process-global one: two instances built in one test process
//! then never count into each other, and `/metrics` shows exactly what this
//! instance did. Every counter is registered at start, so it is exported at
//! zero before the first event and `rate()`/alerts work at once.

mod figures;
mod table;

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, Label, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

pub use self::figures::Figures;
pub use self::table::*;
use crate::domain::Rejection;
use crate::providers::fetch::FetchCounts;

/// One label's values: a label enum.
pub trait LabelValue: Copy + Eq + Hash + Send + Sync + 'static {
    /// Every value, for registering each series at zero.
    fn values() -> &'static [Self];
    /// The label value.
    fn value(self) -> &'static str;
}

/// The values of all of a metric's labels, in the order [`TABLE`] names
/// them: `()`, one label enum, or a pair.
pub trait Labels: Copy + Eq + Hash + Send + Sync + 'static {
    /// Every combination of values.
    fn every() -> Vec<Self>;
    fn values(self) -> Vec<&'static str>;
}

impl Labels for () {
    fn every() -> Vec<()> {
        vec![()]
    }
    fn values(self) -> Vec<&'static str> {
        Vec::new()
    }
}

impl<A: LabelValue> Labels for A {
    fn every() -> Vec<A> {
        A::values().to_vec()
    }
    fn values(self) -> Vec<&'static str> {
        vec![self.value()]
    }
}

impl<A: LabelValue, B: LabelValue> Labels for (A, B) {
    fn every() -> Vec<(A, B)> {
        A::values()
            .iter()
            .flat_map(|&a| B::values().iter().map(move |&b| (a, b)))
            .collect()
    }
    fn values(self) -> Vec<&'static str> {
        vec![self.0.value(), self.1.value()]
    }
}

/// Makes enums that have `ALL` and `as_str` of their own (declared by the
/// room that owns them) label values.
macro_rules! label_values {
    ($($name:ty),+ $(,)?) => {
        $(impl $crate::metrics::LabelValue for $name {
            fn values() -> &'static [Self] {
                &<$name>::ALL
            }
            fn value(self) -> &'static str {
                <$name>::as_str(self)
            }
        })+
    };
}
pub(crate) use label_values;

label_values!(Rejection);

/// Declares a label enum: its variants, their label values, and `ALL`.
macro_rules! label_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $value:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// Every value, for registering each series at zero.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $value),+
                }
            }
        }

        label_values!($name);
    };
}

label_enum! {
    /// The `result` of an answer to a delivery: the body's `result`, the log
    /// line's `result`, and the label of [`WEBHOOKS_TOTAL`].
    WebhookResult {
        Processed => "processed",
        /// Inbox mode: durably queued for the workers.
        Accepted => "accepted",
        Duplicate => "duplicate",
        /// Older than the row's state: nothing changed.
        Stale => "stale",
        /// A batch's items that could not be booked were recorded (and the
        /// rest are durable).
        Quarantined => "quarantined",
        /// A refund or dispute waits for its payment.
        AwaitingPayment => "awaiting_payment",
        /// A refund or dispute its payment cannot give.
        RefundRejected => "refund_rejected",
        InProgress => "in_progress",
        LeaseLost => "lease_lost",
        PayloadMismatch => "payload_mismatch",
        Ignored => "ignored",
        Unauthorized => "unauthorized",
        InvalidPayload => "invalid_payload",
        TooLarge => "too_large",
        UnsupportedMediaType => "unsupported_media_type",
        /// The body did not arrive within `FENCEHOOK_BODY_TIMEOUT_MS`.
        RequestTimeout => "request_timeout",
        Unavailable => "unavailable",
    }
}

label_enum! {
    /// Why a request on the public listener was not a delivery at all
    /// ([`REQUESTS_REJECTED_TOTAL`]`{reason}`): scans and probes, and
    /// signed headers lifted onto a body they were not sent with. A bounded
    /// label: the requested name or path is never one.
    RejectReason {
        /// `/webhooks/{name}` with a name no provider has.
        UnknownProvider => "unknown_provider",
        /// A path outside `/webhooks/{provider}`.
        NotFound => "not_found",
        /// A known provider's path with another method than POST.
        MethodNotAllowed => "method_not_allowed",
        /// A PayPal transmission id already seen with another body: its
        /// signature verifies (PayPal signs only the body's CRC-32), but
        /// the body is not the one it was sent with. Answered 401.
        TransmissionReused => "transmission_reused",
        /// `confirm = "api"`: PayPal's API knows no such event, or knows it
        /// otherwise than delivered. Answered 401.
        EventUnconfirmed => "event_unconfirmed",
    }
}

label_enum! {
    /// Why a finished span was not exported
    /// ([`TRACE_SPANS_DROPPED_TOTAL`]`{reason}`); see `telemetry::export`.
    SpanDrop {
        /// The export queue (`OTEL_BSP_MAX_QUEUE_SIZE`) was full: the
        /// collector is slower than the spans come, or down.
        QueueFull => "queue_full",
        /// The collector refused the batch, did not answer within
        /// `OTEL_EXPORTER_OTLP_TIMEOUT`, or shutdown's bound ran out.
        ExportFailed => "export_failed",
    }
}

label_enum! {
    /// Which listener a connection metric is about (`listener`).
    Listener {
        Public => "public",
        Admin => "admin",
    }
}

label_enum! {
    /// Why a connection was answered 503 and closed at once
    /// ([`CONNECTIONS_REFUSED_TOTAL`]`{listener,reason}`).
    ConnectionRefusal {
        /// The listener had `FENCEHOOK_MAX_CONNECTIONS` open.
        MaxConnections => "max_connections",
        /// The peer's address had `FENCEHOOK_MAX_CONNECTIONS_PER_PEER` open.
        PerPeer => "per_peer",
    }
}

label_enum! {
    /// [`PROVIDERS_RELOADS_TOTAL`]`{result}`: SIGHUP re-reading the providers file.
    Reload {
        Ok => "ok",
        /// The file did not parse: the providers in force were kept.
        Error => "error",
    }
}

label_enum! {
    /// How an inbox worker's attempt at an event ended
    /// ([`INBOX_ATTEMPTS_TOTAL`]`{result}`).
    InboxAttempt {
        /// Booked, or found booked: the event is done.
        Done => "done",
        /// The business step failed: an attempt spent, retried after a backoff.
        Retry => "retry",
        /// Put back without spending an attempt (lease held elsewhere, a
        /// store down, a refund waiting for its payment).
        Requeued => "requeued",
        /// Given up until replayed.
        Dead => "dead",
    }
}

label_enum! {
    /// [`INBOX_ROWS`]`{status}`: events by status.
    InboxStatus {
        Queued => "queued",
        Processing => "processing",
        Dead => "dead",
    }
}

label_enum! {
    /// Why a batch item was quarantined ([`ITEMS_QUARANTINED_TOTAL`]`{reason}`).
    QuarantineReason {
        /// Well signed, but its fields could not be mapped.
        Unmappable => "unmappable",
        /// A refund or dispute its payment cannot give.
        RefundRejected => "refund_rejected",
    }
}

label_enum! {
    /// How a delivery that found the lease held ended its wait
    /// ([`INFLIGHT_WAIT_TOTAL`]`{outcome}`).
    InflightWait {
        /// The holder committed meanwhile: answered `duplicate`.
        Duplicate => "duplicate",
        /// No wait configured: answered `in_progress` at once.
        InProgress => "in_progress",
        /// Still held when the wait ran out: answered `in_progress`.
        Timeout => "timeout",
    }
}

label_enum! {
    /// [`DOWNSTREAM_TOTAL`]`{result}`.
    DownstreamResult {
        Ok => "ok",
        Error => "error",
        Timeout => "timeout",
        /// The lease ended while the call was in flight; its answer was not used.
        LeaseLost => "lease_lost",
    }
}

label_enum! {
    /// [`BACKEND_UP`]`{backend}`.
    Backend {
        Postgres => "postgres",
        /// The lease backend: Redis, or PostgreSQL with `FENCEHOOK_LEASE_BACKEND=postgres`.
        Lease => "lease",
    }
}

label_enum! {
    /// [`LEASE_ACQUIRE_TOTAL`]`{result}`.
    LeaseAcquire {
        Acquired => "acquired",
        /// Held by another owner.
        Held => "held",
        Error => "error",
    }
}

label_enum! {
    /// [`LEASE_RENEW_TOTAL`]`{result}`.
    LeaseRenew {
        Ok => "ok",
        /// Refused: the lease is lost.
        NotOwner => "not_owner",
        /// The backend did not answer.
        Error => "error",
    }
}

/// The series of one metric, one per combination of its label values, each
/// registered (so exported at zero) when the family is made.
pub struct Family<L, H> {
    series: HashMap<L, H>,
}

impl<L: Labels, H: Series> Family<L, H> {
    fn register(rec: &PrometheusRecorder, name: &'static str) -> Family<L, H> {
        let series = L::every()
            .into_iter()
            .map(|labels| {
                let values = labels.values().into_iter().map(SharedString::const_str);
                (labels, register(rec, name, values.collect()))
            })
            .collect();
        Family { series }
    }

    /// The series of these label values.
    pub fn get(&self, labels: L) -> &H {
        &self.series[&labels]
    }

    fn get_mut(&mut self, labels: L) -> &mut H {
        self.series
            .get_mut(&labels)
            .expect("every combination of label values is registered")
    }
}

/// A counter, a gauge or a histogram handle.
pub trait Series: Sized {
    fn register(rec: &PrometheusRecorder, key: &Key) -> Self;
    fn is(kind: Kind) -> bool;
}

impl Series for Counter {
    fn register(rec: &PrometheusRecorder, key: &Key) -> Counter {
        rec.register_counter(key, &META)
    }
    fn is(kind: Kind) -> bool {
        kind == Kind::Counter
    }
}

impl Series for Gauge {
    fn register(rec: &PrometheusRecorder, key: &Key) -> Gauge {
        rec.register_gauge(key, &META)
    }
    fn is(kind: Kind) -> bool {
        kind == Kind::Gauge
    }
}

impl Series for Histogram {
    fn register(rec: &PrometheusRecorder, key: &Key) -> Histogram {
        rec.register_histogram(key, &META)
    }
    fn is(kind: Kind) -> bool {
        matches!(kind, Kind::Histogram(_))
    }
}

/// Registers the series of `name` with these label values (in the table's
/// order of its labels). A name, kind or label count the table does not have
/// is a bug of the caller, found by the first test that builds an app.
fn register<H: Series>(
    rec: &PrometheusRecorder,
    name: &'static str,
    values: Vec<SharedString>,
) -> H {
    let def = def(name).unwrap_or_else(|| panic!("{name} is no metric of the table"));
    assert!(H::is(def.kind), "{name} is a {}", def.kind.as_str());
    assert_eq!(
        def.labels.len(),
        values.len(),
        "{name} has the labels {:?}",
        def.labels
    );
    let labels: Vec<Label> = def
        .labels
        .iter()
        .zip(values)
        .map(|(&k, v)| Label::new(k, v))
        .collect();
    H::register(rec, &Key::from_parts(name, labels))
}

/// The type of a family's label values, from an accessor's argument types.
macro_rules! labels_type {
    () => {
        ()
    };
    ($a:ty) => {
        $a
    };
    ($a:ty, $b:ty) => {
        ($a, $b)
    };
}

/// The label values of a family's series, from an accessor's arguments.
macro_rules! labels_of {
    () => {
        ()
    };
    ($a:ident) => {
        $a
    };
    ($a:ident, $b:ident) => {
        ($a, $b)
    };
}

impl Handles {
    /// Makes tees of the series the console's overview shows ([`Figures`]),
    /// before any handle is lent.
    fn keep_figures(&mut self) -> figures::Kept {
        figures::Kept {
            leases_held: figures::keep_gauge(self.leases_held.get_mut(())),
            lease_lost: figures::keep_counter(self.lease_lost.get_mut(())),
            fence_rejected: figures::keep_counter(self.fence_rejected.get_mut(())),
            stale_events: figures::keep_counter(self.stale_events.get_mut(())),
            over_returned: figures::keep_counter(self.payments_over_returned.get_mut(())),
            refund_rejected: Rejection::ALL
                .iter()
                .map(|&r| (r, figures::keep_counter(self.refund_rejected.get_mut(r))))
                .collect(),
            inbox_lag: figures::keep_histogram(self.inbox_lag.get_mut(())),
        }
    }
}

/// `accessor(label: Enum, ...) -> Handle = METRIC;` rows: a [`Family`] per
/// metric the service updates, registered at start, and its accessor.
macro_rules! handles {
    ($($(#[$doc:meta])* $acc:ident($($arg:ident: $ty:ty),*) -> $handle:ident = $metric:ident;)+) => {
        struct Handles {
            $($acc: Family<labels_type!($($ty),*), $handle>,)+
        }

        impl Handles {
            fn register(rec: &PrometheusRecorder) -> Handles {
                Handles {
                    $($acc: Family::register(rec, $metric),)+
                }
            }
        }

        impl Metrics {
            $(
                #[doc = concat!("[`", stringify!($metric), "`].")]
                $(#[$doc])*
                pub fn $acc(&self, $($arg: $ty),*) -> &$handle {
                    self.inner.h.$acc.get(labels_of!($($arg),*))
                }
            )+
        }
    };
}

handles! {
    lease_acquire(result: LeaseAcquire) -> Counter = LEASE_ACQUIRE_TOTAL;
    lease_renew(result: LeaseRenew) -> Counter = LEASE_RENEW_TOTAL;
    lease_lost() -> Counter = LEASE_LOST_TOTAL;
    lease_held_seconds() -> Histogram = LEASE_HELD_SECONDS;
    renew_margin() -> Histogram = LEASE_RENEW_MARGIN_SECONDS;
    leases_held() -> Gauge = LEASES_HELD;
    fence_rejected() -> Counter = FENCE_REJECTED_TOTAL;
    fence_resync() -> Counter = FENCE_RESYNC_TOTAL;
    stale_events() -> Counter = STALE_EVENTS_TOTAL;
    payments_over_returned() -> Counter = PAYMENTS_OVER_RETURNED_TOTAL;
    inbox_lag() -> Histogram = INBOX_LAG_SECONDS;
    downstream_duration() -> Histogram = DOWNSTREAM_DURATION_SECONDS;
    webhook_duration() -> Histogram = WEBHOOK_DURATION_SECONDS;
    inflight_wait(outcome: InflightWait) -> Counter = INFLIGHT_WAIT_TOTAL;
    downstream(result: DownstreamResult) -> Counter = DOWNSTREAM_TOTAL;
    backend_up(backend: Backend) -> Gauge = BACKEND_UP;
    request_rejected(reason: RejectReason) -> Counter = REQUESTS_REJECTED_TOTAL;
    refund_rejected(reason: Rejection) -> Counter = REFUND_REJECTED_TOTAL;
    inbox_attempts(result: InboxAttempt) -> Counter = INBOX_ATTEMPTS_TOTAL;
    providers_reloads(result: Reload) -> Counter = PROVIDERS_RELOADS_TOTAL;
    inbox_rows(status: InboxStatus) -> Gauge = INBOX_ROWS;
    quarantined(reason: QuarantineReason) -> Counter = ITEMS_QUARANTINED_TOTAL;
    connections_open(listener: Listener) -> Gauge = CONNECTIONS_OPEN;
    connection_refused(listener: Listener, reason: ConnectionRefusal) -> Counter = CONNECTIONS_REFUSED_TOTAL;
    accept_errors(listener: Listener) -> Counter = ACCEPT_ERRORS_TOTAL;
    inbox_stored_bytes() -> Gauge = INBOX_STORED_BYTES;
    /// Events deleted by the scheduled prune.
    pruned() -> Counter = PRUNED_TOTAL;
    /// Delivery history rows not written (see [`crate::history`]).
    delivery_history_lost() -> Counter = DELIVERY_HISTORY_LOST_TOTAL;
    spans_dropped(reason: SpanDrop) -> Counter = TRACE_SPANS_DROPPED_TOTAL;
}

/// Handles to every metric the service updates, registered once at start.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    h: Handles,
    /// [`WEBHOOKS_TOTAL`] per (provider, result), registered once so the
    /// request path does not build a key and hash it on every delivery.
    webhooks: HashMap<String, HashMap<WebhookResult, Counter>>,
    /// Where the process's span exporter keeps its drop counts, given by
    /// whoever wires the service together (the telemetry room sits above
    /// this one); unset, nothing is copied in.
    span_drops: OnceLock<fn(SpanDrop) -> u64>,
    /// What the console's overview reads, when this app has a console.
    kept: Option<figures::Kept>,
}

static META: metrics::Metadata<'static> =
    metrics::Metadata::new("fencehook", metrics::Level::INFO, Some(module_path!()));

impl Metrics {
    /// Builds the registry and registers every metric for `providers`.
    pub fn new(providers: &[String]) -> Metrics {
        Metrics::build(providers, false)
    }

    /// As [`Metrics::new`], keeping the overview's [`Figures`] beside their
    /// series: for an app whose console is on (one more relaxed atomic
    /// update per update of those series; none without a console).
    pub fn keeping_figures(providers: &[String]) -> Metrics {
        Metrics::build(providers, true)
    }

    fn build(providers: &[String], keep_figures: bool) -> Metrics {
        let recorder = TABLE
            .iter()
            .try_fold(PrometheusBuilder::new(), |b, m| match m.kind {
                Kind::Histogram(buckets) => {
                    b.set_buckets_for_metric(Matcher::Full(m.name.into()), buckets)
                }
                Kind::Counter | Kind::Gauge => Ok(b),
            })
            .expect("bucket lists are non-empty constants")
            .build_recorder();
        let handle = recorder.handle();
        describe(&recorder);

        let webhooks = providers
            .iter()
            .map(|provider| {
                let by_result = WebhookResult::ALL
                    .iter()
                    .map(|&r| (r, webhook_counter(&recorder, provider, r)))
                    .collect();
                (provider.clone(), by_result)
            })
            .collect();
        let mut h = Handles::register(&recorder);
        let kept = keep_figures.then(|| h.keep_figures());
        let inner = Inner {
            h,
            recorder,
            handle,
            webhooks,
            span_drops: OnceLock::new(),
            kept,
        };
        let metrics = Metrics {
            inner: Arc::new(inner),
        };
        metrics
            .gauge(BUILD_INFO, &[("version", env!("CARGO_PKG_VERSION"))])
            .set(1.0);
        metrics
    }

    /// Reads [`TRACE_SPANS_DROPPED_TOTAL`] from `dropped` at each
    /// [`Metrics::render`] (the process's span exporter; set once).
    pub fn count_span_drops_from(&self, dropped: fn(SpanDrop) -> u64) {
        let _ = self.inner.span_drops.set(dropped);
    }

    /// Prometheus text exposition of everything registered.
    pub fn render(&self) -> String {
        // The span exporter is the process's, not this instance's: its
        // counts are copied in when they are read.
        if let Some(dropped) = self.inner.span_drops.get() {
            for &reason in SpanDrop::ALL {
                self.spans_dropped(reason).absolute(dropped(reason));
            }
        }
        self.inner.handle.render()
    }

    /// The overview's figures now, when they are kept
    /// ([`Metrics::keeping_figures`]).
    pub fn figures(&self) -> Option<Figures> {
        self.inner.kept.as_ref().map(figures::Kept::read)
    }

    /// Drains histogram buckets; call periodically.
    pub fn upkeep(&self) {
        self.inner.handle.run_upkeep();
    }

    /// [`FETCHES_TOTAL`]`{provider,result}` of `provider`, every result
    /// registered now.
    pub fn fetches(&self, provider: &str) -> FetchCounts {
        let provider = SharedString::from(provider.to_owned());
        FetchCounts::new(|result| {
            let values = vec![provider.clone(), SharedString::const_str(result.as_str())];
            register(&self.inner.recorder, FETCHES_TOTAL, values)
        })
    }

    /// [`WEBHOOKS_TOTAL`]`{provider,result}`.
    pub fn webhook(&self, provider: &str, result: WebhookResult) -> Counter {
        match self
            .inner
            .webhooks
            .get(provider)
            .and_then(|by_result| by_result.get(&result))
        {
            Some(c) => c.clone(),
            None => webhook_counter(&self.inner.recorder, provider, result),
        }
    }

    /// A metric's family registered by the room that owns its label values
    /// (the console's, registered at zero when it is built).
    pub fn family<L: Labels, H: Series>(&self, name: &'static str) -> Family<L, H> {
        Family::register(&self.inner.recorder, name)
    }

    /// [`RECONCILE_EVENTS_TOTAL`]`{provider,result}` (once per run: the
    /// series is looked up, not kept).
    pub fn reconcile_events(&self, provider: &str, result: &'static str) -> Counter {
        let values = vec![
            SharedString::from(provider.to_owned()),
            SharedString::const_str(result),
        ];
        register(&self.inner.recorder, RECONCILE_EVENTS_TOTAL, values)
    }

    /// [`RECONCILE_ERRORS_TOTAL`]`{provider,reason}`.
    pub fn reconcile_errors(&self, provider: &str, reason: &'static str) -> Counter {
        let values = vec![
            SharedString::from(provider.to_owned()),
            SharedString::const_str(reason),
        ];
        register(&self.inner.recorder, RECONCILE_ERRORS_TOTAL, values)
    }

    /// [`RECONCILE_LAST_SUCCESS_TIMESTAMP_SECONDS`]`{provider}`.
    pub fn reconcile_last_success(&self, provider: &str) -> Gauge {
        let values = vec![SharedString::from(provider.to_owned())];
        register(
            &self.inner.recorder,
            RECONCILE_LAST_SUCCESS_TIMESTAMP_SECONDS,
            values,
        )
    }

    /// A gauge whose label values are not an enum (or that has none).
    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &'static str)]) -> Gauge {
        let names: Vec<&str> = labels.iter().map(|(k, _)| *k).collect();
        let def = def(name).unwrap_or_else(|| panic!("{name} is no metric of the table"));
        assert_eq!(names, def.labels, "{name}: label names");
        let values = labels.iter().map(|(_, v)| SharedString::const_str(v));
        register(&self.inner.recorder, name, values.collect())
    }

    pub fn lease_acquired(&self) -> &Counter {
        self.lease_acquire(LeaseAcquire::Acquired)
    }
    pub fn lease_held_by_other(&self) -> &Counter {
        self.lease_acquire(LeaseAcquire::Held)
    }
    pub fn lease_acquire_error(&self) -> &Counter {
        self.lease_acquire(LeaseAcquire::Error)
    }
    pub fn renew_ok(&self) -> &Counter {
        self.lease_renew(LeaseRenew::Ok)
    }
    pub fn renew_not_owner(&self) -> &Counter {
        self.lease_renew(LeaseRenew::NotOwner)
    }
    pub fn renew_error(&self) -> &Counter {
        self.lease_renew(LeaseRenew::Error)
    }
}

fn webhook_counter(rec: &PrometheusRecorder, provider: &str, result: WebhookResult) -> Counter {
    let values = vec![
        SharedString::from(provider.to_owned()),
        SharedString::const_str(result.as_str()),
    ];
    register(rec, WEBHOOKS_TOTAL, values)
}

/// Every metric's `# HELP`, from the table.
fn describe(rec: &PrometheusRecorder) {
    for m in TABLE {
        let unit = if m.name.ends_with("_seconds") {
            Some(Unit::Seconds)
        } else if m.name.ends_with("_bytes") {
            Some(Unit::Bytes)
        } else {
            None
        };
        let help = SharedString::const_str(m.help);
        match m.kind {
            Kind::Counter => rec.describe_counter(m.name.into(), unit, help),
            Kind::Gauge => rec.describe_gauge(m.name.into(), unit, help),
            Kind::Histogram(_) => rec.describe_histogram(m.name.into(), unit, help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_exported_at_zero_from_start() {
        let m = Metrics::new(&["generic".to_owned()]);
        let text = m.render();
        for name in [LEASE_LOST_TOTAL, FENCE_REJECTED_TOTAL, FENCE_RESYNC_TOTAL] {
            assert!(
                text.contains(&format!("{name} 0")),
                "{name} missing in\n{text}"
            );
        }
    }

    #[test]
    fn what_is_exported_is_typed_and_described_as_the_table_says() {
        let text = Metrics::new(&["generic".to_owned()]).render();
        for m in TABLE {
            if text.contains(&format!("# TYPE {} ", m.name)) {
                let type_line = format!("# TYPE {} {}\n", m.name, m.kind.as_str());
                assert!(text.contains(&type_line), "{type_line} missing");
                let help_line = format!("# HELP {} {}\n", m.name, m.help);
                assert!(text.contains(&help_line), "{help_line} missing");
            }
        }
    }

    #[test]
    #[should_panic(expected = "label names")]
    fn a_gauge_is_registered_only_with_the_labels_of_the_table() {
        Metrics::new(&[])
            .gauge(BUILD_INFO, &[("release", "1")])
            .set(1.0);
    }

    #[test]
    fn every_label_value_is_exported_at_zero_from_start() {
        let text = Metrics::new(&["generic".to_owned()]).render();
        for r in WebhookResult::ALL {
            let series = format!(
                r#"{WEBHOOKS_TOTAL}{{provider="generic",result="{}"}} 0"#,
                r.as_str()
            );
            assert!(text.contains(&series), "{series} missing");
        }
        for o in InflightWait::ALL {
            assert!(text.contains(&format!(r#"outcome="{}"}} 0"#, o.as_str())));
        }
        for r in LeaseAcquire::ALL {
            let series = format!(r#"{LEASE_ACQUIRE_TOTAL}{{result="{}"}} 0"#, r.as_str());
            assert!(text.contains(&series), "{series} missing");
        }
        for r in LeaseRenew::ALL {
            let series = format!(r#"{LEASE_RENEW_TOTAL}{{result="{}"}} 0"#, r.as_str());
            assert!(text.contains(&series), "{series} missing");
        }
        for r in DownstreamResult::ALL {
            assert!(text.contains(&format!(
                r#"{DOWNSTREAM_TOTAL}{{result="{}"}} 0"#,
                r.as_str()
            )));
        }
        for r in RejectReason::ALL {
            let series = format!(r#"{REQUESTS_REJECTED_TOTAL}{{reason="{}"}} 0"#, r.as_str());
            assert!(text.contains(&series), "{series} missing");
        }
        for l in Listener::ALL {
            for name in [CONNECTIONS_OPEN, ACCEPT_ERRORS_TOTAL] {
                let series = format!(r#"{name}{{listener="{}"}} 0"#, l.as_str());
                assert!(text.contains(&series), "{series} missing");
            }
            for r in ConnectionRefusal::ALL {
                let series = format!(
                    r#"{CONNECTIONS_REFUSED_TOTAL}{{listener="{}",reason="{}"}} 0"#,
                    l.as_str(),
                    r.as_str()
                );
                assert!(text.contains(&series), "{series} missing");
            }
        }
    }

    /// The value of one series in an exposition (`name{labels}` as written).
    fn sample(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
    }

    #[test]
    fn the_figures_say_what_metrics_says() {
        let m = Metrics::keeping_figures(&[]);
        m.leases_held().increment(3.0);
        m.leases_held().decrement(1.0);
        m.lease_lost().increment(1);
        m.fence_rejected().increment(2);
        m.stale_events().increment(4);
        m.payments_over_returned().increment(5);
        m.refund_rejected(Rejection::ExceedsPayment).increment(6);
        m.inbox_lag().record(0.5);
        m.inbox_lag().record(1.5);

        let f = m.figures().expect("kept");
        let text = m.render();
        assert_eq!(f.leases_held, sample(&text, LEASES_HELD));
        assert_eq!(f.lease_lost as f64, sample(&text, LEASE_LOST_TOTAL));
        assert_eq!(f.fence_rejected as f64, sample(&text, FENCE_REJECTED_TOTAL));
        assert_eq!(f.stale_events as f64, sample(&text, STALE_EVENTS_TOTAL));
        assert_eq!(
            f.over_returned as f64,
            sample(&text, PAYMENTS_OVER_RETURNED_TOTAL)
        );
        for (reason, n) in &f.refund_rejected {
            let series = format!(r#"{REFUND_REJECTED_TOTAL}{{reason="{}"}}"#, reason.as_str());
            assert_eq!(*n as f64, sample(&text, &series), "{series}");
        }
        let reasons: Vec<Rejection> = f.refund_rejected.iter().map(|(r, _)| *r).collect();
        assert_eq!(reasons, Rejection::ALL);
        let lag = INBOX_LAG_SECONDS;
        assert_eq!(f.inbox_lag_sum, sample(&text, &format!("{lag}_sum")));
        assert_eq!(
            f.inbox_lag_count as f64,
            sample(&text, &format!("{lag}_count"))
        );
        assert_eq!(f.inbox_lag_mean(), Some(1.0));
        assert_eq!((f.leases_held, f.fence_rejected), (2.0, 2));
    }

    #[test]
    fn without_a_console_nothing_is_kept() {
        let m = Metrics::new(&[]);
        m.lease_lost().increment(1);
        assert_eq!(m.figures(), None);
    }
}
