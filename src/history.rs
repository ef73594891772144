//! The delivery history's writer: every item of a delivery that reached
//! the fenced path is recorded with its answer (`delivery_history`, see
//! [`crate::store::history`]), in sync and inbox mode alike.
//!
//! Off the delivery path: the handler hands each row to a bounded channel
//! ([`History::record`], never waiting) and one background task
//! ([`History::spawn`]) drains it: after the first row of a batch it lets
//! the rows of the next tenth of a second gather, then writes them all in
//! one multi-row insert. A delivery therefore pays for a channel send, not for
//! a round trip to PostgreSQL; under load the batches grow and the inserts
//! per delivery fall. A row the channel has no room for, or whose batch the
//! database refuses, is lost, never waited for: counted in
//! `fencehook_delivery_history_lost_total`. The history is a record for
//! people, not the money's truth (the payments rows and the ledger are,
//! written in the fenced transaction as before).
//!
//! What must stay true: recording never delays or changes an answer.

use tokio::sync::{mpsc, watch};

use crate::metrics::Metrics;
use crate::store::history::DeliveryRow;
use crate::store::Store;

/// Rows waiting for the writer, at most: about a second of a busy
/// instance's deliveries, a few MB.
pub const CAPACITY: usize = 8192;
/// Rows in one insert, at most.
const BATCH: usize = 1000;
/// How long the writer lets rows gather after the first of a batch. The
/// rows are read by people, for whom a tenth of a second is nothing; each
/// batch costs the service several thousand instructions and PostgreSQL a
/// commit whatever its size: a batch per 5 ms (one or two rows at a few
/// hundred deliveries a second) cost the writer about 9,200 instructions a
/// delivery, one per 100 ms about 2,600, most of it per row
/// (docs/benchmarks.md).
const GATHER: std::time::Duration = std::time::Duration::from_millis(100);

/// Where the handler records answered items; `off` records nothing.
#[derive(Clone)]
pub struct History {
    sender: Option<mpsc::Sender<DeliveryRow>>,
    metrics: Metrics,
}

/// The writer task, and how to stop it.
pub struct Writer {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl History {
    /// No history (`FENCEHOOK_DELIVERY_HISTORY=false`): nothing is built
    /// per delivery, nothing sent.
    pub fn off(metrics: Metrics) -> History {
        History {
            sender: None,
            metrics,
        }
    }

    /// A history of `capacity` rows waiting at most, and its writer, running.
    pub fn spawn(store: Store, metrics: Metrics, capacity: usize) -> (History, Writer) {
        let (sender, rows) = mpsc::channel(capacity.max(1));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(write(store, metrics.clone(), rows, stopped));
        let history = History {
            sender: Some(sender),
            metrics,
        };
        (history, Writer { stop, task })
    }

    /// Whether rows are recorded (the handler builds them only then).
    pub fn is_on(&self) -> bool {
        self.sender.is_some()
    }

    /// Hands a row to the writer without waiting: with no room for it, it is
    /// counted lost.
    pub fn record(&self, row: DeliveryRow) {
        let Some(sender) = &self.sender else {
            return;
        };
        if sender.try_send(row).is_err() {
            self.metrics.delivery_history_lost().increment(1);
        }
    }
}

impl Writer {
    /// Writes what is waiting and stops, within `bound`; past it, what is
    /// left is lost (counted).
    pub async fn stop(self, bound: std::time::Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(bound, &mut task).await.is_err() {
            task.abort();
            tracing::warn!("delivery history: rows still unwritten at the drain timeout; dropped");
        }
    }
}

/// The writer: waits for a row, takes every row waiting (up to [`BATCH`]),
/// writes them in one statement; on stop, writes what is left and ends.
async fn write(
    store: Store,
    metrics: Metrics,
    mut rows: mpsc::Receiver<DeliveryRow>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut warned = Warned::default();
    loop {
        let stopping = tokio::select! {
            got = rows.recv_many(&mut batch, BATCH) => got == 0,
            _ = stopped.changed() => true,
        };
        if !stopping && batch.len() < BATCH {
            // A moment for the rows of the deliveries in flight to join
            // this one: one statement for many rows, not one each.
            tokio::time::sleep(GATHER).await;
            while batch.len() < BATCH {
                match rows.try_recv() {
                    Ok(row) => batch.push(row),
                    Err(_) => break,
                }
            }
        }
        if stopping {
            rows.close();
            while rows.recv_many(&mut batch, BATCH).await > 0 {
                flush(&store, &metrics, &mut batch, &mut warned).await;
            }
            flush(&store, &metrics, &mut batch, &mut warned).await;
            return;
        }
        flush(&store, &metrics, &mut batch, &mut warned).await;
    }
}

/// A failing insert is logged at most once a minute (a database outage
/// fails every batch; the deliveries' own lines say so already).
#[derive(Default)]
struct Warned(Option<std::time::Instant>);

const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

async fn flush(
    store: &Store,
    metrics: &Metrics,
    batch: &mut Vec<DeliveryRow>,
    warned: &mut Warned,
) {
    if batch.is_empty() {
        return;
    }
    if let Err(e) = store.record_deliveries(batch).await {
        metrics
            .delivery_history_lost()
            .increment(batch.len() as u64);
        if warned.0.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            warned.0 = Some(std::time::Instant::now());
            tracing::warn!(rows = batch.len(), error = %crate::report::chain(&e),
                "could not write the delivery history (before migration V16? run `fencehook migrate`); \
                 these rows are lost, the deliveries are not affected (fencehook_delivery_history_lost_total); \
                 said at most once a minute");
        }
    }
    batch.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tx: &str) -> DeliveryRow {
        DeliveryRow {
            answered_at: time::OffsetDateTime::now_utc(),
            provider: "generic".into(),
            transaction_id: tx.into(),
            parent_transaction_id: None,
            event_type: "payment.succeeded".into(),
            psp_event_id: None,
            result: "processed".into(),
            status: 200,
            reason: None,
        }
    }

    fn lost(metrics: &Metrics) -> String {
        metrics
            .render()
            .lines()
            .find(|l| l.starts_with("fencehook_delivery_history_lost_total "))
            .unwrap_or_default()
            .to_owned()
    }

    /// A writer that does not keep up (here: none drains the queue) costs a
    /// delivery nothing but the count of the rows it drops.
    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_counts_a_loss_and_never_waits() {
        let metrics = Metrics::new(&[]);
        let (sender, mut rows) = mpsc::channel(2);
        let history = History {
            sender: Some(sender),
            metrics: metrics.clone(),
        };
        // On a current-thread runtime, a record that waited for room would
        // never return: nothing else runs until it does.
        for i in 0..5 {
            history.record(row(&format!("tx_{i}")));
        }
        assert_eq!(lost(&metrics), "fencehook_delivery_history_lost_total 3");
        assert_eq!(rows.recv().await.unwrap().transaction_id, "tx_0");
        assert_eq!(rows.recv().await.unwrap().transaction_id, "tx_1");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn with_the_history_off_nothing_is_sent_or_counted() {
        let metrics = Metrics::new(&[]);
        let history = History::off(metrics.clone());
        assert!(!history.is_on());
        history.record(row("tx"));
        assert_eq!(lost(&metrics), "fencehook_delivery_history_lost_total 0");
    }
}
