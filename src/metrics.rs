//! Metric names (fixed by SPEC §7) and the per-application registry.
//!
//! Each [`App`](crate::app::App) owns its own Prometheus recorder instead of
//! installing a process-global one: two instances built in one test process
//! then never count into each other, and `/metrics` shows exactly what this
//! instance did. Every counter is registered at start, so it is exported at
//! zero before the first event and `rate()`/alerts work at once.

use std::collections::HashMap;
use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Key, Label, Recorder, SharedString, Unit};
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
pub const PAYMENTS_STUCK_PROCESSING: &str = "fencehook_payments_stuck_processing";
pub const BUILD_INFO: &str = "fencehook_build_info";

/// Every `result` label value of `fencehook_webhooks_total`.
pub const WEBHOOK_RESULTS: &[&str] = &[
    "processed",
    "duplicate",
    "in_progress",
    "lease_lost",
    "payload_mismatch",
    "ignored",
    "unauthorized",
    "invalid_payload",
    "too_large",
    "unsupported_media_type",
    "unavailable",
];

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const HELD_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
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
    webhooks: HashMap<String, HashMap<&'static str, Counter>>,
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
            downstream_duration: h(DOWNSTREAM_DURATION_SECONDS),
            webhook_duration: h(WEBHOOK_DURATION_SECONDS),
        };
        for outcome in ["duplicate", "in_progress", "timeout"] {
            c(INFLIGHT_WAIT_TOTAL, &[("outcome", outcome)]).increment(0);
        }
        for result in ["ok", "error", "timeout", "lease_lost"] {
            c(DOWNSTREAM_TOTAL, &[("result", result)]).increment(0);
        }
        let mut webhooks: HashMap<String, HashMap<&'static str, Counter>> = HashMap::new();
        for provider in providers {
            for result in WEBHOOK_RESULTS {
                let c = webhook_counter(&recorder, provider, result);
                c.increment(0);
                webhooks
                    .entry(provider.clone())
                    .or_default()
                    .insert(*result, c);
            }
        }
        let inner = Inner {
            recorder,
            handle,
            h: handles,
            webhooks,
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
        self.inner.handle.render()
    }

    /// Drains histogram buckets; call periodically.
    pub fn upkeep(&self) {
        self.inner.handle.run_upkeep();
    }

    /// `fencehook_webhooks_total{provider,result}`.
    pub fn webhook(&self, provider: &str, result: &'static str) -> Counter {
        match self
            .inner
            .webhooks
            .get(provider)
            .and_then(|by_result| by_result.get(result))
        {
            Some(c) => c.clone(),
            None => webhook_counter(&self.inner.recorder, provider, result),
        }
    }

    pub fn inflight_wait(&self, outcome: &'static str) -> Counter {
        counter(
            &self.inner.recorder,
            INFLIGHT_WAIT_TOTAL,
            &[("outcome", outcome)],
        )
    }

    pub fn downstream(&self, result: &'static str) -> Counter {
        counter(
            &self.inner.recorder,
            DOWNSTREAM_TOTAL,
            &[("result", result)],
        )
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
    pub fn downstream_duration(&self) -> &Histogram {
        &self.inner.h.downstream_duration
    }
    pub fn webhook_duration(&self) -> &Histogram {
        &self.inner.h.webhook_duration
    }

    /// Sum of every sample of `name` in the current exposition whose labels
    /// contain all of `labels` (`k="v"` pairs). Used by tests and `/readyz`-style checks.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        sum_samples(&self.render(), name, labels)
    }
}

/// Sums the samples named `name` (exactly, no suffix) in a Prometheus text
/// exposition whose label set contains every `labels` pair.
pub fn sum_samples(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = match series.find('{') {
                Some(i) => (&series[..i], &series[i..]),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let all = labels
                .iter()
                .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
            all.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

fn counter(
    rec: &PrometheusRecorder,
    name: &'static str,
    labels: &[(&'static str, &'static str)],
) -> Counter {
    let labels: Vec<Label> = labels.iter().map(|(k, v)| Label::new(*k, *v)).collect();
    rec.register_counter(&Key::from_parts(name, labels), &META)
}

fn webhook_counter(rec: &PrometheusRecorder, provider: &str, result: &'static str) -> Counter {
    let labels = vec![
        Label::new("provider", provider.to_owned()),
        Label::new("result", result),
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
        PAYMENTS_STUCK_PROCESSING,
        None,
        "Payments claimed but left processing for longer than the maximum lease hold (all instances see the same number).",
    );
    d(BUILD_INFO, None, "Build information; always 1.");
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
        assert!(
            text.contains(r#"fencehook_webhooks_total{provider="generic",result="processed"} 0"#)
        );
    }

    #[test]
    fn value_sums_matching_series() {
        let m = Metrics::new(&["a".to_owned(), "b".to_owned()]);
        m.webhook("a", "processed").increment(2);
        m.webhook("b", "processed").increment(3);
        assert_eq!(m.value(WEBHOOKS_TOTAL, &[("result", "processed")]), 5.0);
        assert_eq!(m.value(WEBHOOKS_TOTAL, &[("provider", "a")]), 2.0);
    }
}
