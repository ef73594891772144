//! Metric names, their label values, and the per-application registry.
//!
//! Names are part of fencehook's contract with the dashboards and alert rules
//! in `deploy/`. Label values are enums, never loose strings: every value of
//! a label is listed once (`ALL`), so each series is registered at zero from
//! start and a new value cannot be forgotten.
//!
//! Each [`App`](crate::app::App) owns its own Prometheus recorder instead of
//! installing a process-global one: two instances built in one test process
//! then never count into each other, and `/metrics` shows exactly what this
//! instance did. Every counter is registered at start, so it is exported at
//! zero before the first event and `rate()`/alerts work at once.

use std::collections::HashMap;
use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Key, Label, Recorder, SharedString, Unit};

use crate::domain::Rejection;
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

pub const WEBHOOKS_TOTAL: &str = "fencehook_webhooks_total";
pub const WEBHOOK_DURATION_SECONDS: &str = "fencehook_webhook_duration_seconds";
pub const LEASE_ACQUIRE_TOTAL: &str = "fencehook_lease_acquire_total";
pub const LEASE_RENEW_TOTAL: &str = "fencehook_lease_renew_total";
pub const LEASE_LOST_TOTAL: &str = "fencehook_lease_lost_total";
pub const LEASE_HELD_SECONDS: &str = "fencehook_lease_held_seconds";
pub const LEASE_RENEW_MARGIN_SECONDS: &str = "fencehook_lease_renew_margin_seconds";
pub const LEASES_HELD: &str = "fencehook_leases_held";
pub const FENCE_REJECTED_TOTAL: &str = "fencehook_fence_rejected_total";
pub const FENCE_RESYNC_TOTAL: &str = "fencehook_fence_resync_total";
pub const INFLIGHT_WAIT_TOTAL: &str = "fencehook_inflight_wait_total";
pub const DOWNSTREAM_TOTAL: &str = "fencehook_downstream_requests_total";
pub const DOWNSTREAM_DURATION_SECONDS: &str = "fencehook_downstream_duration_seconds";
pub const DB_POOL_SIZE: &str = "fencehook_db_pool_size";
pub const DB_POOL_AVAILABLE: &str = "fencehook_db_pool_available";
pub const DB_POOL_WAITING: &str = "fencehook_db_pool_waiting";
pub const BACKEND_UP: &str = "fencehook_backend_up";
pub const DB_SYNCHRONOUS_REPLICATION: &str = "fencehook_db_synchronous_replication";
pub const PAYMENTS_STUCK_PROCESSING: &str = "fencehook_payments_stuck_processing";
pub const BUILD_INFO: &str = "fencehook_build_info";
pub const REQUESTS_REJECTED_TOTAL: &str = "fencehook_requests_rejected_total";
pub const STALE_EVENTS_TOTAL: &str = "fencehook_stale_events_total";
pub const PROVIDERS_RELOADS_TOTAL: &str = "fencehook_providers_reloads_total";
pub const INBOX_ROWS: &str = "fencehook_inbox_rows";
pub const INBOX_LAG_SECONDS: &str = "fencehook_inbox_lag_seconds";
pub const INBOX_ATTEMPTS_TOTAL: &str = "fencehook_inbox_attempts_total";
pub const REFUND_REJECTED_TOTAL: &str = "fencehook_refund_rejected_total";
pub const PAYMENTS_OVER_RETURNED_TOTAL: &str = "fencehook_payments_over_returned_total";
pub const ITEMS_QUARANTINED_TOTAL: &str = "fencehook_items_quarantined_total";
pub const CONNECTIONS_OPEN: &str = "fencehook_connections_open";
pub const CONNECTIONS_REFUSED_TOTAL: &str = "fencehook_connections_refused_total";
pub const ACCEPT_ERRORS_TOTAL: &str = "fencehook_accept_errors_total";
pub const INBOX_STORED_BYTES: &str = "fencehook_inbox_stored_bytes";
pub const PRUNED_TOTAL: &str = "fencehook_pruned_total";
pub const CONSOLE_SIGNINS_TOTAL: &str = "fencehook_console_signins_total";
pub const CONSOLE_REPLAYS_TOTAL: &str = "fencehook_console_replays_total";
pub const TRACE_SPANS_DROPPED_TOTAL: &str = "fencehook_trace_spans_dropped_total";

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
    };
}

label_enum! {
    /// The `result` of an answer to a delivery: the body's `result`, the log
    /// line's `result`, and the label of `fencehook_webhooks_total`.
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
    /// (`fencehook_requests_rejected_total{reason}`): scans and probes, and
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
    /// (`fencehook_trace_spans_dropped_total{reason}`); see `telemetry::export`.
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
    /// (`fencehook_connections_refused_total{listener,reason}`).
    ConnectionRefusal {
        /// The listener had `FENCEHOOK_MAX_CONNECTIONS` open.
        MaxConnections => "max_connections",
        /// The peer's address had `FENCEHOOK_MAX_CONNECTIONS_PER_PEER` open.
        PerPeer => "per_peer",
    }
}

label_enum! {
    /// `fencehook_providers_reloads_total{result}`: SIGHUP re-reading the providers file.
    Reload {
        Ok => "ok",
        /// The file did not parse: the providers in force were kept.
        Error => "error",
    }
}

label_enum! {
    /// How an inbox worker's attempt at an event ended
    /// (`fencehook_inbox_attempts_total{result}`).
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
    /// `fencehook_inbox_rows{status}`: events by status.
    InboxStatus {
        Queued => "queued",
        Processing => "processing",
        Dead => "dead",
    }
}

label_enum! {
    /// Why a batch item was quarantined (`fencehook_items_quarantined_total{reason}`).
    QuarantineReason {
        /// Well signed, but its fields could not be mapped.
        Unmappable => "unmappable",
        /// A refund or dispute its payment cannot give.
        RefundRejected => "refund_rejected",
    }
}

label_enum! {
    /// How a delivery that found the lease held ended its wait
    /// (`fencehook_inflight_wait_total{outcome}`).
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
    /// `fencehook_downstream_requests_total{result}`.
    DownstreamResult {
        Ok => "ok",
        Error => "error",
        Timeout => "timeout",
        /// The lease ended while the call was in flight; its answer was not used.
        LeaseLost => "lease_lost",
    }
}

label_enum! {
    /// `fencehook_backend_up{backend}`.
    Backend {
        Postgres => "postgres",
        /// The lease backend: Redis, or PostgreSQL with `FENCEHOOK_LEASE_BACKEND=postgres`.
        Lease => "lease",
    }
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const HELD_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Inbox lag: milliseconds when workers keep up, hours when a downstream is down.
const LAG_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0,
    86400.0,
];
const MARGIN_BUCKETS: &[f64] = &[
    0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 30.0,
];

/// Handles to every metric the service updates, registered once at start.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    h: Handles,
    /// `fencehook_webhooks_total` per (provider, result), registered once so
    /// the request path does not build a key and hash it on every delivery.
    webhooks: HashMap<String, HashMap<WebhookResult, Counter>>,
    inflight_wait: HashMap<InflightWait, Counter>,
    downstream: HashMap<DownstreamResult, Counter>,
    backend_up: HashMap<Backend, Gauge>,
    requests_rejected: HashMap<RejectReason, Counter>,
    refund_rejected: HashMap<Rejection, Counter>,
    inbox_attempts: HashMap<InboxAttempt, Counter>,
    reloads: HashMap<Reload, Counter>,
    inbox_rows: HashMap<InboxStatus, Gauge>,
    quarantined: HashMap<QuarantineReason, Counter>,
    connections_open: HashMap<Listener, Gauge>,
    connections_refused: HashMap<(Listener, ConnectionRefusal), Counter>,
    accept_errors: HashMap<Listener, Counter>,
    inbox_stored_bytes: Gauge,
    pruned: Counter,
    spans_dropped: HashMap<SpanDrop, Counter>,
}

struct Handles {
    lease_acquired: Counter,
    lease_held_by_other: Counter,
    lease_acquire_error: Counter,
    renew_ok: Counter,
    renew_not_owner: Counter,
    renew_error: Counter,
    lease_lost: Counter,
    lease_held_seconds: Histogram,
    renew_margin: Histogram,
    leases_held: Gauge,
    fence_rejected: Counter,
    fence_resync: Counter,
    stale_events: Counter,
    payments_over_returned: Counter,
    inbox_lag: Histogram,
    downstream_duration: Histogram,
    webhook_duration: Histogram,
}

static META: metrics::Metadata<'static> =
    metrics::Metadata::new("fencehook", metrics::Level::INFO, Some(module_path!()));

impl Metrics {
    /// Builds the registry and registers every metric for `providers`.
    pub fn new(providers: &[String]) -> Metrics {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(WEBHOOK_DURATION_SECONDS.into()),
                LATENCY_BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(DOWNSTREAM_DURATION_SECONDS.into()),
                    LATENCY_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(LEASE_HELD_SECONDS.into()), HELD_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(INBOX_LAG_SECONDS.into()), LAG_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(LEASE_RENEW_MARGIN_SECONDS.into()),
                    MARGIN_BUCKETS,
                )
            })
            .expect("bucket lists are non-empty constants")
            .build_recorder();
        let handle = recorder.handle();
        describe(&recorder);

        let c = |name: &'static str, labels: &[(&'static str, &'static str)]| {
            counter(&recorder, name, labels)
        };
        let h =
            |name: &'static str| recorder.register_histogram(&Key::from_static_name(name), &META);
        let handles = Handles {
            lease_acquired: c(LEASE_ACQUIRE_TOTAL, &[("result", "acquired")]),
            lease_held_by_other: c(LEASE_ACQUIRE_TOTAL, &[("result", "held")]),
            lease_acquire_error: c(LEASE_ACQUIRE_TOTAL, &[("result", "error")]),
            renew_ok: c(LEASE_RENEW_TOTAL, &[("result", "ok")]),
            renew_not_owner: c(LEASE_RENEW_TOTAL, &[("result", "not_owner")]),
            renew_error: c(LEASE_RENEW_TOTAL, &[("result", "error")]),
            lease_lost: c(LEASE_LOST_TOTAL, &[]),
            lease_held_seconds: h(LEASE_HELD_SECONDS),
            renew_margin: h(LEASE_RENEW_MARGIN_SECONDS),
            leases_held: recorder.register_gauge(&Key::from_static_name(LEASES_HELD), &META),
            fence_rejected: c(FENCE_REJECTED_TOTAL, &[]),
            fence_resync: c(FENCE_RESYNC_TOTAL, &[]),
            stale_events: c(STALE_EVENTS_TOTAL, &[]),
            // Present from the start, so an alert on its increase sees the first one.
            payments_over_returned: {
                let counter = c(PAYMENTS_OVER_RETURNED_TOTAL, &[]);
                counter.increment(0);
                counter
            },
            inbox_lag: h(INBOX_LAG_SECONDS),
            downstream_duration: h(DOWNSTREAM_DURATION_SECONDS),
            webhook_duration: h(WEBHOOK_DURATION_SECONDS),
        };
        let zero = |counter: Counter| {
            counter.increment(0);
            counter
        };
        let inflight_wait = InflightWait::ALL
            .iter()
            .map(|&o| (o, zero(c(INFLIGHT_WAIT_TOTAL, &[("outcome", o.as_str())]))))
            .collect();
        let downstream = DownstreamResult::ALL
            .iter()
            .map(|&r| (r, zero(c(DOWNSTREAM_TOTAL, &[("result", r.as_str())]))))
            .collect();
        let backend_up = Backend::ALL
            .iter()
            .map(|&b| {
                let key = Key::from_parts(BACKEND_UP, vec![Label::new("backend", b.as_str())]);
                (b, recorder.register_gauge(&key, &META))
            })
            .collect();
        let requests_rejected = RejectReason::ALL
            .iter()
            .map(|&r| {
                let reason = ("reason", r.as_str());
                (r, zero(c(REQUESTS_REJECTED_TOTAL, &[reason])))
            })
            .collect();
        let refund_rejected = Rejection::ALL
            .iter()
            .map(|&r| (r, zero(c(REFUND_REJECTED_TOTAL, &[("reason", r.as_str())]))))
            .collect();
        let inbox_attempts = InboxAttempt::ALL
            .iter()
            .map(|&r| (r, zero(c(INBOX_ATTEMPTS_TOTAL, &[("result", r.as_str())]))))
            .collect();
        let reloads = Reload::ALL
            .iter()
            .map(|&r| {
                (
                    r,
                    zero(c(PROVIDERS_RELOADS_TOTAL, &[("result", r.as_str())])),
                )
            })
            .collect();
        let inbox_rows = InboxStatus::ALL
            .iter()
            .map(|&st| {
                let key = Key::from_parts(INBOX_ROWS, vec![Label::new("status", st.as_str())]);
                let gauge = recorder.register_gauge(&key, &META);
                gauge.set(0.0);
                (st, gauge)
            })
            .collect();
        let quarantined = QuarantineReason::ALL
            .iter()
            .map(|&r| {
                (
                    r,
                    zero(c(ITEMS_QUARANTINED_TOTAL, &[("reason", r.as_str())])),
                )
            })
            .collect();
        let connections_refused = Listener::ALL
            .iter()
            .flat_map(|&l| ConnectionRefusal::ALL.iter().map(move |&r| (l, r)))
            .map(|(l, r)| {
                let labels = [("listener", l.as_str()), ("reason", r.as_str())];
                ((l, r), zero(c(CONNECTIONS_REFUSED_TOTAL, &labels)))
            })
            .collect();
        let accept_errors = Listener::ALL
            .iter()
            .map(|&l| (l, zero(c(ACCEPT_ERRORS_TOTAL, &[("listener", l.as_str())]))))
            .collect();
        let inbox_stored_bytes =
            recorder.register_gauge(&Key::from_static_name(INBOX_STORED_BYTES), &META);
        inbox_stored_bytes.set(0.0);
        let pruned = zero(c(PRUNED_TOTAL, &[]));
        let spans_dropped = SpanDrop::ALL
            .iter()
            .map(|&r| {
                let reason = [("reason", r.as_str())];
                (r, zero(c(TRACE_SPANS_DROPPED_TOTAL, &reason)))
            })
            .collect();
        let connections_open = Listener::ALL
            .iter()
            .map(|&l| {
                let key =
                    Key::from_parts(CONNECTIONS_OPEN, vec![Label::new("listener", l.as_str())]);
                let gauge = recorder.register_gauge(&key, &META);
                gauge.set(0.0);
                (l, gauge)
            })
            .collect();
        let webhooks = providers
            .iter()
            .map(|provider| {
                let by_result = WebhookResult::ALL
                    .iter()
                    .map(|&r| (r, zero(webhook_counter(&recorder, provider, r))))
                    .collect();
                (provider.clone(), by_result)
            })
            .collect();
        let inner = Inner {
            recorder,
            handle,
            h: handles,
            webhooks,
            inflight_wait,
            downstream,
            backend_up,
            requests_rejected,
            refund_rejected,
            inbox_attempts,
            reloads,
            inbox_rows,
            quarantined,
            connections_open,
            connections_refused,
            accept_errors,
            inbox_stored_bytes,
            pruned,
            spans_dropped,
        };
        let metrics = Metrics {
            inner: Arc::new(inner),
        };
        metrics
            .gauge(BUILD_INFO, &[("version", env!("CARGO_PKG_VERSION"))])
            .set(1.0);
        metrics
    }

    /// Prometheus text exposition of everything registered.
    pub fn render(&self) -> String {
        // The span exporter is the process's, not this instance's: its
        // counts are copied in when they are read.
        for (&reason, counter) in &self.inner.spans_dropped {
            counter.absolute(crate::telemetry::spans_dropped(reason));
        }
        self.inner.handle.render()
    }

    /// Drains histogram buckets; call periodically.
    pub fn upkeep(&self) {
        self.inner.handle.run_upkeep();
    }

    /// `fencehook_webhooks_total{provider,result}`.
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

    pub fn inflight_wait(&self, outcome: InflightWait) -> &Counter {
        &self.inner.inflight_wait[&outcome]
    }

    pub fn downstream(&self, result: DownstreamResult) -> &Counter {
        &self.inner.downstream[&result]
    }

    pub fn backend_up(&self, backend: Backend) -> &Gauge {
        &self.inner.backend_up[&backend]
    }

    /// `fencehook_requests_rejected_total{reason}`.
    pub fn request_rejected(&self, reason: RejectReason) -> &Counter {
        &self.inner.requests_rejected[&reason]
    }

    /// `fencehook_connections_open{listener}`.
    pub fn connections_open(&self, listener: Listener) -> &Gauge {
        &self.inner.connections_open[&listener]
    }

    /// `fencehook_connections_refused_total{listener,reason}`.
    pub fn connection_refused(&self, listener: Listener, reason: ConnectionRefusal) -> &Counter {
        &self.inner.connections_refused[&(listener, reason)]
    }

    /// `fencehook_accept_errors_total{listener}`.
    pub fn accept_errors(&self, listener: Listener) -> &Counter {
        &self.inner.accept_errors[&listener]
    }

    /// `fencehook_inbox_stored_bytes`.
    pub fn inbox_stored_bytes(&self) -> &Gauge {
        &self.inner.inbox_stored_bytes
    }

    /// `fencehook_pruned_total`: events deleted by the scheduled prune.
    pub fn pruned(&self) -> &Counter {
        &self.inner.pruned
    }

    /// A counter registered by the room that owns it (the console's,
    /// registered at zero when it is built).
    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &'static str)]) -> Counter {
        counter(&self.inner.recorder, name, labels)
    }

    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &'static str)]) -> Gauge {
        let labels: Vec<Label> = labels.iter().map(|(k, v)| Label::new(*k, *v)).collect();
        self.inner
            .recorder
            .register_gauge(&Key::from_parts(name, labels), &META)
    }

    pub fn lease_acquired(&self) -> &Counter {
        &self.inner.h.lease_acquired
    }
    pub fn lease_held_by_other(&self) -> &Counter {
        &self.inner.h.lease_held_by_other
    }
    pub fn lease_acquire_error(&self) -> &Counter {
        &self.inner.h.lease_acquire_error
    }
    pub fn renew_ok(&self) -> &Counter {
        &self.inner.h.renew_ok
    }
    pub fn renew_not_owner(&self) -> &Counter {
        &self.inner.h.renew_not_owner
    }
    pub fn renew_error(&self) -> &Counter {
        &self.inner.h.renew_error
    }
    pub fn lease_lost(&self) -> &Counter {
        &self.inner.h.lease_lost
    }
    pub fn lease_held_seconds(&self) -> &Histogram {
        &self.inner.h.lease_held_seconds
    }
    pub fn renew_margin(&self) -> &Histogram {
        &self.inner.h.renew_margin
    }
    pub fn leases_held(&self) -> &Gauge {
        &self.inner.h.leases_held
    }
    pub fn fence_rejected(&self) -> &Counter {
        &self.inner.h.fence_rejected
    }
    pub fn fence_resync(&self) -> &Counter {
        &self.inner.h.fence_resync
    }
    pub fn stale_events(&self) -> &Counter {
        &self.inner.h.stale_events
    }
    pub fn payments_over_returned(&self) -> &Counter {
        &self.inner.h.payments_over_returned
    }
    pub fn providers_reloads(&self, result: Reload) -> &Counter {
        &self.inner.reloads[&result]
    }
    pub fn inbox_attempts(&self, result: InboxAttempt) -> &Counter {
        &self.inner.inbox_attempts[&result]
    }
    pub fn inbox_rows(&self, status: InboxStatus) -> &Gauge {
        &self.inner.inbox_rows[&status]
    }
    pub fn inbox_lag(&self) -> &Histogram {
        &self.inner.h.inbox_lag
    }
    pub fn refund_rejected(&self, reason: Rejection) -> &Counter {
        &self.inner.refund_rejected[&reason]
    }
    pub fn quarantined(&self, reason: QuarantineReason) -> &Counter {
        &self.inner.quarantined[&reason]
    }
    pub fn downstream_duration(&self) -> &Histogram {
        &self.inner.h.downstream_duration
    }
    pub fn webhook_duration(&self) -> &Histogram {
        &self.inner.h.webhook_duration
    }
}

fn counter(
    rec: &PrometheusRecorder,
    name: &'static str,
    labels: &[(&'static str, &'static str)],
) -> Counter {
    let labels: Vec<Label> = labels.iter().map(|(k, v)| Label::new(*k, *v)).collect();
    rec.register_counter(&Key::from_parts(name, labels), &META)
}

fn webhook_counter(rec: &PrometheusRecorder, provider: &str, result: WebhookResult) -> Counter {
    let labels = vec![
        Label::new("provider", provider.to_owned()),
        Label::new("result", result.as_str()),
    ];
    rec.register_counter(&Key::from_parts(WEBHOOKS_TOTAL, labels), &META)
}

fn describe(rec: &PrometheusRecorder) {
    let d = |name: &'static str, unit: Option<Unit>, help: &'static str| {
        rec.describe_counter(name.into(), unit, SharedString::const_str(help));
    };
    d(
        WEBHOOKS_TOTAL,
        None,
        "Webhook deliveries answered, by provider and result.",
    );
    d(
        WEBHOOK_DURATION_SECONDS,
        Some(Unit::Seconds),
        "Time from request to answer.",
    );
    d(
        LEASE_ACQUIRE_TOTAL,
        None,
        "Lease acquisition attempts: acquired, held (by another owner), error.",
    );
    d(
        LEASE_RENEW_TOTAL,
        None,
        "Heartbeat renewals: ok, not_owner (lease lost), error (backend unreachable).",
    );
    d(
        LEASE_LOST_TOTAL,
        None,
        "Leases lost while held (renewal refused, backend unreachable past expiry, or max hold).",
    );
    d(
        LEASE_HELD_SECONDS,
        Some(Unit::Seconds),
        "How long each lease was held, acquire to release.",
    );
    d(
        LEASE_RENEW_MARGIN_SECONDS,
        Some(Unit::Seconds),
        "Time left before local expiry when a renewal was confirmed; near zero means leases are about to be lost.",
    );
    d(LEASES_HELD, None, "Leases this instance holds right now.");
    d(
        FENCE_REJECTED_TOTAL,
        None,
        "Writes refused because a newer fencing token owns the payment.",
    );
    d(
        FENCE_RESYNC_TOTAL,
        None,
        "Times the Redis fence counter was behind the database and was fast-forwarded.",
    );
    d(
        INFLIGHT_WAIT_TOTAL,
        None,
        "Deliveries that waited for another holder: duplicate, in_progress, timeout.",
    );
    d(
        DOWNSTREAM_TOTAL,
        None,
        "Calls to the downstream business service, by result.",
    );
    d(
        DOWNSTREAM_DURATION_SECONDS,
        Some(Unit::Seconds),
        "Downstream call latency.",
    );
    d(
        DB_POOL_SIZE,
        None,
        "PostgreSQL connections open in the pool.",
    );
    d(
        DB_POOL_AVAILABLE,
        None,
        "PostgreSQL connections idle in the pool.",
    );
    d(
        DB_POOL_WAITING,
        None,
        "Requests waiting for a PostgreSQL connection.",
    );
    d(
        BACKEND_UP,
        None,
        "1 when the last health probe of the backend succeeded.",
    );
    d(
        DB_SYNCHRONOUS_REPLICATION,
        None,
        "1 when the last health probe found PostgreSQL's commits waiting for a synchronous standby; 0 otherwise (or not yet known).",
    );
    d(
        PAYMENTS_STUCK_PROCESSING,
        None,
        "Payments claimed but left processing for longer than the maximum lease hold (all instances see the same number).",
    );
    d(BUILD_INFO, None, "Build information; always 1.");
    d(
        STALE_EVENTS_TOTAL,
        None,
        "Events older than their row's state (a payment's failure after its success): answered stale, nothing changed.",
    );
    d(
        REFUND_REJECTED_TOTAL,
        None,
        "Refunds and disputes their payment cannot give (failed payment, other currency, more than came in): nothing booked.",
    );
    d(
        PAYMENTS_OVER_RETURNED_TOTAL,
        None,
        "Disputes booked past their payment's amount (a chargeback larger than the charge, or after a refund): more went out than came in.",
    );
    d(
        PROVIDERS_RELOADS_TOTAL,
        None,
        "Providers file re-read on SIGHUP: ok (new secrets in force), error (the old ones kept).",
    );
    d(
        INBOX_ROWS,
        None,
        "Inbox events by status: queued (waiting), processing (taken by a worker), dead (given up until replayed).",
    );
    d(
        INBOX_LAG_SECONDS,
        Some(Unit::Seconds),
        "Inbox: from an event's acceptance to its booking.",
    );
    d(
        INBOX_ATTEMPTS_TOTAL,
        None,
        "Inbox workers' attempts by result: done, retry (an attempt spent), requeued (none spent), dead.",
    );
    d(
        ITEMS_QUARANTINED_TOTAL,
        None,
        "Batch items recorded in quarantined_items instead of booked, by reason.",
    );
    d(
        REQUESTS_REJECTED_TOTAL,
        None,
        "Requests on the public listener that were no delivery: unknown_provider, not_found, method_not_allowed (scans), transmission_reused (a PayPal delivery's signed headers on another body), event_unconfirmed (a PayPal event its API does not confirm).",
    );
    d(
        CONNECTIONS_OPEN,
        None,
        "Connections open on a listener right now.",
    );
    d(
        CONNECTIONS_REFUSED_TOTAL,
        None,
        "Connections answered 503 and closed at once, by reason: max_connections (the listener had its maximum open), per_peer (the peer address had its maximum open).",
    );
    d(
        ACCEPT_ERRORS_TOTAL,
        None,
        "Connections the listener could not accept (most often: out of file descriptors).",
    );
    d(
        INBOX_STORED_BYTES,
        Some(Unit::Bytes),
        "Inbox: bytes the events table takes on disk (rows, indexes, TOAST).",
    );
    d(
        CONSOLE_SIGNINS_TOTAL,
        None,
        "Operator console sign-ins (form or Bearer token) by result: ok, wrong_token, throttled (too many failures from the peer).",
    );
    d(
        CONSOLE_REPLAYS_TOTAL,
        None,
        "Replays asked for from the operator console, by scope: event (one dead event), filter (every dead event matching a filter).",
    );
    d(
        PRUNED_TOTAL,
        None,
        "Finished inbox events deleted past FENCEHOOK_EVENT_RETENTION_DAYS by the scheduled prune.",
    );
    d(
        TRACE_SPANS_DROPPED_TOTAL,
        None,
        "Finished trace spans not exported, by reason (queue_full, export_failed); 0 with tracing off.",
    );
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
    fn every_label_value_is_exported_at_zero_from_start() {
        let text = Metrics::new(&["generic".to_owned()]).render();
        for r in WebhookResult::ALL {
            let series = format!(
                r#"fencehook_webhooks_total{{provider="generic",result="{}"}} 0"#,
                r.as_str()
            );
            assert!(text.contains(&series), "{series} missing");
        }
        for o in InflightWait::ALL {
            assert!(text.contains(&format!(r#"outcome="{}"}} 0"#, o.as_str())));
        }
        for r in DownstreamResult::ALL {
            assert!(text.contains(&format!(
                r#"fencehook_downstream_requests_total{{result="{}"}} 0"#,
                r.as_str()
            )));
        }
        for r in RejectReason::ALL {
            let series = format!(
                r#"fencehook_requests_rejected_total{{reason="{}"}} 0"#,
                r.as_str()
            );
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
}
