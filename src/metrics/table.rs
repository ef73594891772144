//! The one table of every metric fencehook exports: its name, its kind, its
//! label names and its help text, each written here and nowhere else.
//!
//! The registry ([`super::Metrics`]) registers, buckets and describes from
//! [`TABLE`]; the reference check (every metric is in `docs/reference.md`)
//! and the deploy check (every metric a dashboard or an alert uses is one of
//! these) read it too. A new metric is one line here, plus its handle in the
//! registry when the service updates it.

/// What a metric is, and for a histogram its bucket boundaries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram(&'static [f64]),
}

impl Kind {
    /// The Prometheus `# TYPE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram(_) => "histogram",
        }
    }
}

/// One row of [`TABLE`].
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// The exported name: part of the contract with dashboards and alerts.
    pub name: &'static str,
    pub kind: Kind,
    /// Label names, in the order a series' label values are given.
    pub labels: &'static [&'static str],
    /// `# HELP`.
    pub help: &'static str,
}

/// The row of `name`, if it is a metric of the table.
pub fn def(name: &str) -> Option<&'static MetricDef> {
    TABLE.iter().find(|m| m.name == name)
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

/// `CONST = "name", kind, [labels], "help";` rows: a documented const per
/// name (its doc is the help text) and [`TABLE`] in the same order.
macro_rules! metric_table {
    ($($const:ident = $name:literal, $kind:ident $(($buckets:expr))?, [$($label:ident),*], $help:literal;)+) => {
        $(
            #[doc = concat!("`", $name, "`: ", $help)]
            pub const $const: &str = $name;
        )+

        /// Every metric fencehook exports.
        pub const TABLE: &[MetricDef] = &[$(MetricDef {
            name: $const,
            kind: metric_table!(@kind $kind $(($buckets))?),
            labels: &[$(stringify!($label)),*],
            help: $help,
        }),+];
    };
    (@kind counter) => { Kind::Counter };
    (@kind gauge) => { Kind::Gauge };
    (@kind histogram($buckets:expr)) => { Kind::Histogram($buckets) };
}

metric_table! {
    WEBHOOKS_TOTAL = "fencehook_webhooks_total", counter, [provider, result],
        "Webhook deliveries answered, by provider and result.";
    WEBHOOK_DURATION_SECONDS = "fencehook_webhook_duration_seconds", histogram(LATENCY_BUCKETS), [],
        "Time from request to answer.";
    LEASE_ACQUIRE_TOTAL = "fencehook_lease_acquire_total", counter, [result],
        "Lease acquisition attempts: acquired, held (by another owner), error.";
    LEASE_RENEW_TOTAL = "fencehook_lease_renew_total", counter, [result],
        "Heartbeat renewals: ok, not_owner (lease lost), error (backend unreachable).";
    LEASE_LOST_TOTAL = "fencehook_lease_lost_total", counter, [],
        "Leases lost while held (renewal refused, backend unreachable past expiry, or max hold).";
    LEASE_HELD_SECONDS = "fencehook_lease_held_seconds", histogram(HELD_BUCKETS), [],
        "How long each lease was held, acquire to release.";
    LEASE_RENEW_MARGIN_SECONDS = "fencehook_lease_renew_margin_seconds", histogram(MARGIN_BUCKETS), [],
        "Time left before local expiry when a renewal was confirmed; near zero means leases are about to be lost.";
    LEASES_HELD = "fencehook_leases_held", gauge, [],
        "Leases this instance holds right now.";
    FENCE_REJECTED_TOTAL = "fencehook_fence_rejected_total", counter, [],
        "Writes refused because a newer fencing token owns the payment.";
    FENCE_RESYNC_TOTAL = "fencehook_fence_resync_total", counter, [],
        "Times the lease backend's fence counter (a Redis key or a leases row) was behind the database and was fast-forwarded.";
    INFLIGHT_WAIT_TOTAL = "fencehook_inflight_wait_total", counter, [outcome],
        "Deliveries that waited for another holder: duplicate, in_progress, timeout.";
    DOWNSTREAM_TOTAL = "fencehook_downstream_requests_total", counter, [result],
        "Calls to the downstream business service, by result.";
    DOWNSTREAM_DURATION_SECONDS = "fencehook_downstream_duration_seconds", histogram(LATENCY_BUCKETS), [],
        "Downstream call latency.";
    DB_POOL_SIZE = "fencehook_db_pool_size", gauge, [],
        "PostgreSQL connections open in the pool.";
    DB_POOL_AVAILABLE = "fencehook_db_pool_available", gauge, [],
        "PostgreSQL connections idle in the pool.";
    DB_POOL_WAITING = "fencehook_db_pool_waiting", gauge, [],
        "Requests waiting for a PostgreSQL connection.";
    BACKEND_UP = "fencehook_backend_up", gauge, [backend],
        "1 when the last health probe of the backend succeeded.";
    DB_SYNCHRONOUS_REPLICATION = "fencehook_db_synchronous_replication", gauge, [],
        "1 when the last health probe found PostgreSQL's commits waiting for a synchronous standby; 0 otherwise (or not yet known).";
    PAYMENTS_STUCK_PROCESSING = "fencehook_payments_stuck_processing", gauge, [],
        "Payments claimed but left processing for longer than the maximum lease hold (all instances see the same number).";
    BUILD_INFO = "fencehook_build_info", gauge, [version],
        "Build information; always 1.";
    STALE_EVENTS_TOTAL = "fencehook_stale_events_total", counter, [],
        "Events older than their row's state (a payment's failure after its success): answered stale, nothing changed.";
    REFUND_REJECTED_TOTAL = "fencehook_refund_rejected_total", counter, [reason],
        "Refunds and disputes their payment cannot give (failed payment, other currency, more than came in): nothing booked.";
    PAYMENTS_OVER_RETURNED_TOTAL = "fencehook_payments_over_returned_total", counter, [],
        "Refunds and disputes booked past their payment's amount together, whichever came last (a chargeback larger than the charge, or beside a refund): more went out than came in.";
    PROVIDERS_RELOADS_TOTAL = "fencehook_providers_reloads_total", counter, [result],
        "Providers file re-read on SIGHUP: ok (new secrets in force), error (the old ones kept).";
    INBOX_ROWS = "fencehook_inbox_rows", gauge, [status],
        "Inbox events by status: queued (waiting), processing (taken by a worker), dead (given up until replayed).";
    INBOX_LAG_SECONDS = "fencehook_inbox_lag_seconds", histogram(LAG_BUCKETS), [],
        "Inbox: from an event's acceptance to its booking.";
    INBOX_ATTEMPTS_TOTAL = "fencehook_inbox_attempts_total", counter, [result],
        "Inbox workers' attempts by result: done, retry (an attempt spent), requeued (none spent), dead.";
    ITEMS_QUARANTINED_TOTAL = "fencehook_items_quarantined_total", counter, [reason],
        "Batch items recorded in quarantined_items instead of booked, by reason.";
    REQUESTS_REJECTED_TOTAL = "fencehook_requests_rejected_total", counter, [reason],
        "Requests on the public listener that were no delivery: unknown_provider, not_found, method_not_allowed (scans), transmission_reused (a PayPal delivery's signed headers on another body), event_unconfirmed (a PayPal event its API does not confirm).";
    CONNECTIONS_OPEN = "fencehook_connections_open", gauge, [listener],
        "Connections open on a listener right now.";
    CONNECTIONS_REFUSED_TOTAL = "fencehook_connections_refused_total", counter, [listener, reason],
        "Connections answered 503 and closed at once, by reason: max_connections (the listener had its maximum open), per_peer (the peer address had its maximum open).";
    ACCEPT_ERRORS_TOTAL = "fencehook_accept_errors_total", counter, [listener],
        "Connections the listener could not accept (most often: out of file descriptors).";
    INBOX_STORED_BYTES = "fencehook_inbox_stored_bytes", gauge, [],
        "Inbox: bytes the events table takes on disk (rows, indexes, TOAST).";
    CONSOLE_SIGNINS_TOTAL = "fencehook_console_signins_total", counter, [result],
        "Operator console sign-ins (form or Bearer token) by result: ok, wrong_token, throttled (too many failures from the peer).";
    CONSOLE_REPLAYS_TOTAL = "fencehook_console_replays_total", counter, [scope],
        "Replays asked for from the operator console, by scope: event (one dead event), filter (every dead event matching a filter).";
    PRUNED_TOTAL = "fencehook_pruned_total", counter, [],
        "Finished inbox events deleted past FENCEHOOK_EVENT_RETENTION_DAYS by the scheduled prune.";
    DELIVERY_HISTORY_LOST_TOTAL = "fencehook_delivery_history_lost_total", counter, [],
        "Delivery history rows not written: the writer's queue was full, or the database refused their batch. The deliveries themselves were answered as always.";
    AUDIT_LAST_RUN_TIMESTAMP_SECONDS = "fencehook_audit_last_run_timestamp_seconds", gauge, [],
        "When the newest run of `fencehook audit` recorded in the database finished (Unix time); 0 while none is recorded. Read at start and every minute.";
    AUDIT_VIOLATIONS = "fencehook_audit_violations", gauge, [],
        "Invariant violations the newest recorded run of `fencehook audit` found, over all its checks; 0 while none is recorded. Read at start and every minute.";
    FETCHES_TOTAL = "fencehook_fetches_total", counter, [provider, result],
        "Fetches from a PSP's API while a delivery waits (Mollie's payments and refunds, the objects of Stripe's thin events), by provider and result: ok, not_found, error (another status, or no answer), timeout, busy (no fetch slot came free within the fetch timeout: not fetched, answered 503).";
    TRACE_SPANS_DROPPED_TOTAL = "fencehook_trace_spans_dropped_total", counter, [reason],
        "Finished trace spans not exported, by reason (queue_full, export_failed); 0 with tracing off.";
    RECONCILE_EVENTS_TOTAL = "fencehook_reconcile_events_total", counter, [provider, result],
        "Events the reconciliation listed from a PSP's API, by result: known (already booked), recovered (booked now: its webhook never arrived), ignored (stale included), refused, divergent (contradicts what is booked; nothing written).";
    RECONCILE_ERRORS_TOTAL = "fencehook_reconcile_errors_total", counter, [provider, reason],
        "Reconciliation runs that failed, by reason: credentials, rate_limited, timeout, unavailable, status, malformed (the PSP's API), database.";
    RECONCILE_LAST_SUCCESS_TIMESTAMP_SECONDS = "fencehook_reconcile_last_success_timestamp_seconds", gauge, [provider],
        "When this process last completed a reconciliation run of the provider (Unix time; divergences included); the start time while none has, with the schedule on; 0 without it.";
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = env!("CARGO_MANIFEST_DIR");

    #[test]
    fn names_are_unique_and_counters_end_in_total() {
        for (i, m) in TABLE.iter().enumerate() {
            assert!(m.name.starts_with("fencehook_"), "{}", m.name);
            assert!(
                TABLE[..i].iter().all(|other| other.name != m.name),
                "{} twice",
                m.name
            );
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}: counters, and only they, end in _total",
                m.name
            );
            assert!(m.help.ends_with('.'), "{}: {}", m.name, m.help);
        }
    }

    /// Metric names (`fencehook_…` words) a text mentions, with a
    /// histogram's `_bucket`/`_sum`/`_count` series named by their metric.
    fn metrics_named_in(path: &str) -> Vec<String> {
        let text = std::fs::read_to_string(format!("{ROOT}/{path}")).expect(path);
        let mut names: Vec<String> = text
            .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .filter(|w| w.starts_with("fencehook_"))
            .map(|w| {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .filter_map(|s| w.strip_suffix(s))
                    .find(
                        |base| matches!(def(base), Some(m) if matches!(m.kind, Kind::Histogram(_))),
                    )
                    .unwrap_or(w)
                    .to_owned()
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn every_metric_the_dashboard_and_the_alerts_use_is_in_the_table() {
        for path in ["deploy/alerts.yml", "deploy/grafana-dashboard.json"] {
            let used = metrics_named_in(path);
            assert!(used.len() > 5, "{path}: {used:?}");
            let unknown: Vec<_> = used.iter().filter(|n| def(n).is_none()).collect();
            assert!(
                unknown.is_empty(),
                "{path} uses {unknown:?}, no metric of the table"
            );
        }
    }
}
