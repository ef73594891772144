//! The figures the operator console's overview shows of this instance's
//! metrics, kept beside their series so that reading them is a few atomic
//! loads, not a render of the whole exposition parsed back.
//!
//! The exporter's recorder keeps each series in an atomic it does not lend
//! out, so a kept series is a tee: its handle adds to the exported series
//! and to an atomic of its own. Only the series the overview shows are
//! tees, and only in an app whose console is on
//! ([`super::Metrics::keeping_figures`]); elsewhere the handles are the
//! exporter's own and nothing is kept.
//!
//! # What must stay true
//!
//! A kept value moves with every update of its series, and with nothing
//! else: the overview shows what `/metrics` would say (a test renders both).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use metrics::atomics::AtomicU64;
use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn};

use crate::domain::Rejection;

/// A counter that is also counted here.
pub(super) struct KeptCounter {
    exported: Counter,
    count: AtomicU64,
}

impl CounterFn for KeptCounter {
    fn increment(&self, n: u64) {
        self.exported.increment(n);
        self.count.fetch_add(n, Relaxed);
    }

    fn absolute(&self, n: u64) {
        self.exported.absolute(n);
        self.count.fetch_max(n, Relaxed);
    }
}

/// A gauge whose value is also held here (as `f64` bits, as the exporter's).
pub(super) struct KeptGauge {
    exported: Gauge,
    value: AtomicU64,
}

impl GaugeFn for KeptGauge {
    fn increment(&self, v: f64) {
        self.exported.increment(v);
        GaugeFn::increment(&self.value, v);
    }

    fn decrement(&self, v: f64) {
        self.exported.decrement(v);
        GaugeFn::decrement(&self.value, v);
    }

    fn set(&self, v: f64) {
        self.exported.set(v);
        GaugeFn::set(&self.value, v);
    }
}

/// A histogram whose sum and count (the exposition's `_sum` and `_count`)
/// are also kept here; its buckets are the exporter's alone.
pub(super) struct KeptHistogram {
    exported: Histogram,
    /// `f64` bits.
    sum: AtomicU64,
    count: AtomicU64,
}

impl HistogramFn for KeptHistogram {
    fn record(&self, v: f64) {
        self.exported.record(v);
        GaugeFn::increment(&self.sum, v);
        self.count.fetch_add(1, Relaxed);
    }
}

/// Makes `handle` a tee of the series it was; what it counts is kept in
/// the returned value.
pub(super) fn keep_counter(handle: &mut Counter) -> Arc<KeptCounter> {
    let kept = Arc::new(KeptCounter {
        exported: handle.clone(),
        count: AtomicU64::new(0),
    });
    *handle = Counter::from_arc(kept.clone());
    kept
}

/// As [`keep_counter`], for a gauge.
pub(super) fn keep_gauge(handle: &mut Gauge) -> Arc<KeptGauge> {
    let kept = Arc::new(KeptGauge {
        exported: handle.clone(),
        value: AtomicU64::new(0f64.to_bits()),
    });
    *handle = Gauge::from_arc(kept.clone());
    kept
}

/// As [`keep_counter`], for a histogram (its sum and count).
pub(super) fn keep_histogram(handle: &mut Histogram) -> Arc<KeptHistogram> {
    let kept = Arc::new(KeptHistogram {
        exported: handle.clone(),
        sum: AtomicU64::new(0f64.to_bits()),
        count: AtomicU64::new(0),
    });
    *handle = Histogram::from_arc(kept.clone());
    kept
}

/// The kept side of the overview's series, made by the registry
/// (`Handles::keep_figures`) before any handle is lent.
pub(super) struct Kept {
    pub leases_held: Arc<KeptGauge>,
    pub lease_lost: Arc<KeptCounter>,
    pub fence_rejected: Arc<KeptCounter>,
    pub stale_events: Arc<KeptCounter>,
    pub over_returned: Arc<KeptCounter>,
    /// In [`Rejection::ALL`]'s order.
    pub refund_rejected: Vec<(Rejection, Arc<KeptCounter>)>,
    pub inbox_lag: Arc<KeptHistogram>,
}

impl Kept {
    /// The figures now.
    pub(super) fn read(&self) -> Figures {
        let count = |c: &KeptCounter| c.count.load(Relaxed);
        Figures {
            leases_held: f64::from_bits(self.leases_held.value.load(Relaxed)),
            lease_lost: count(&self.lease_lost),
            fence_rejected: count(&self.fence_rejected),
            stale_events: count(&self.stale_events),
            over_returned: count(&self.over_returned),
            refund_rejected: self
                .refund_rejected
                .iter()
                .map(|(reason, c)| (*reason, count(c)))
                .collect(),
            inbox_lag_sum: f64::from_bits(self.inbox_lag.sum.load(Relaxed)),
            inbox_lag_count: self.inbox_lag.count.load(Relaxed),
        }
    }
}

/// What this instance's metrics say, as the overview shows it: each the
/// value of its series in `/metrics` (summed over none of its labels but
/// `reason`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// [`super::LEASES_HELD`].
    pub leases_held: f64,
    /// [`super::LEASE_LOST_TOTAL`].
    pub lease_lost: u64,
    /// [`super::FENCE_REJECTED_TOTAL`].
    pub fence_rejected: u64,
    /// [`super::STALE_EVENTS_TOTAL`].
    pub stale_events: u64,
    /// [`super::PAYMENTS_OVER_RETURNED_TOTAL`].
    pub over_returned: u64,
    /// [`super::REFUND_REJECTED_TOTAL`] by reason, in [`Rejection::ALL`]'s order.
    pub refund_rejected: Vec<(Rejection, u64)>,
    /// [`super::INBOX_LAG_SECONDS`]: `_sum` and `_count`.
    pub inbox_lag_sum: f64,
    pub inbox_lag_count: u64,
}

impl Figures {
    /// The mean inbox lag since start, once an event was booked.
    pub fn inbox_lag_mean(&self) -> Option<f64> {
        (self.inbox_lag_count > 0).then(|| self.inbox_lag_sum / self.inbox_lag_count as f64)
    }
}
