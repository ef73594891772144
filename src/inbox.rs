//! Inbox mode (`FENCEHOOK_MODE=inbox`): accept fast, book asynchronously,
//! never lose an event.
//!
//! The HTTP edge verifies, maps and validates a delivery as in sync mode,
//! then [`Inbox::accept`] stores each event in one statement and the PSP is
//! answered `accepted` — no Redis on that path. Workers ([`Inbox::run`], in
//! `serve` and in `fencehook work`) take due events, up to sixteen at a time,
//! and book each with the very state machine of sync mode ([`Processor`]):
//! lease → fenced claim → business step → fenced finalize; the events of one
//! take are attempted side by side and the done ones recorded together, by
//! the statement of the worker's next take.
//!
//! # What must stay true
//!
//! - `accepted` is answered only once the event is committed; a worker
//!   books it exactly once however often it is taken, retried or replayed
//!   (the lifecycle decides duplicates, the fence stops a rescued worker).
//! - Only a failed business step (the downstream's error or timeout) spends
//!   an attempt. A store or lease backend down, the lease held by another
//!   worker, or a refund waiting for its payment (not booked yet, or failed:
//!   a failed payment may still succeed) re-queue the event without
//!   spending one; the refund is dead only at the age limit.
//! - An idle worker hears of a new event within milliseconds: after an
//!   accept commits, a `NOTIFY fencehook_inbox` follows in a statement of its
//!   own (one in flight per process, accepts meanwhile folded into the next:
//!   in the accept's transaction it would serialize every accept's commit),
//!   and one `LISTEN` connection per process wakes the workers; this
//!   process's own workers are woken at once. Polling every second is only
//!   the fallback, for a NOTIFY lost with its process.
//! - A worker's lock on the events it took is short (one lease TTL) and
//!   extended every third of it while their attempts live, so a dead
//!   worker's events are taken again within about a TTL; the fence stops
//!   the dead worker if it wakes up. The rescue that puts such events back
//!   runs every second in each process with workers, on a timer of its own
//!   ([`Inbox::run`]): a worker in a slow downstream call does not hold it
//!   up. An event this binary cannot read is made
//!   `dead` alone, with the reason; the others of its take are attempted.
//! - What waits for a payment (a refund, a dispute, a reinstatement waiting
//!   for its withdrawal) is woken by the booking it waits for, in either mode
//!   (V11's trigger on `payments`), including one booked while its worker
//!   had it; its pause is only the fallback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_postgres::AsyncMessage;

use crate::config::{setting, DbConfig, InboxConfig};
use crate::domain::{CanonicalEvent, Rejection};
use crate::error::Error;
use crate::metrics::{InboxAttempt, Metrics};
use crate::processor::{Outcome, Processor};
use crate::store::inbox::{Accepted, Settle, Taken, ToAccept, Unreadable, CHANNEL};
use crate::store::{Store, StoreError};
use crate::telemetry::spans;
use tracing::Instrument;

/// How soon a worker tries a store or lease backend again after it failed.
const BACKEND_RETRY: Duration = Duration::from_secs(1);
/// How soon an event held by another worker is looked at again.
const HELD_RETRY: Duration = Duration::from_millis(200);
/// Longest pause of a refund waiting for its payment (its payment's booking
/// wakes it at once, V11's trigger; this is the fallback, for a wake-up lost
/// to a failed statement).
const AWAIT_RETRY_MAX: Duration = Duration::from_secs(60);

/// How often each process with workers looks for events whose lock ran out
/// (their worker died or froze), on a timer of its own: never behind its
/// workers' attempts, however slow their downstream calls.
const RESCUE_EVERY: Duration = Duration::from_secs(1);

/// How many due events a worker takes at once. One statement takes them,
/// their attempts run side by side, and the done ones are recorded by the
/// next take's statement: taking and settling each event alone were two of
/// the three commits a drained event cost (docs/benchmarks.md). Sixteen
/// drained a backlog about a quarter faster than eight (8 workers); 32 no
/// faster.
const TAKE_BATCH: i64 = 16;

pub struct Inbox {
    store: Store,
    /// The sync processor, without an in-flight wait: a worker that finds
    /// the lease held moves on to other work.
    processor: Processor,
    metrics: Metrics,
    cfg: InboxConfig,
    db: DbConfig,
    /// How long a worker owns an event it took past the lock's last renewal
    /// (past it another may take it); renewed every third of it.
    lock: Duration,
    /// This process's idle workers wait on it.
    wake: Arc<Notify>,
    notifier: Arc<Notifier>,
    /// Accepts that arrive together are written together ([`Batcher`]).
    batcher: mpsc::Sender<Pending>,
}

/// Most events one accept statement stores.
const ACCEPT_BATCH: usize = 64;
/// Accept statements in flight at once; the accepts that arrive meanwhile
/// wait and go together in the next. Two accepted about 8 % more than four,
/// for a fifth less CPU per delivery (larger batches: each statement's
/// parse, plan and commit shared by more events; docs/benchmarks.md).
const ACCEPTS_IN_FLIGHT: usize = 2;

/// An accept waiting for its statement.
struct Pending {
    item: ToAccept,
    answer: oneshot::Sender<Result<Accepted, StoreError>>,
}

/// Writes the accepts that arrive together in one statement: while
/// [`ACCEPTS_IN_FLIGHT`] statements run, the accepts that come meanwhile
/// wait and are then stored by one statement (up to [`ACCEPT_BATCH`]), with
/// one commit. Nothing waits on a timer: an accept that finds a statement
/// slot free goes at once, alone. Each accept is answered only once its
/// statement is committed, with what it would have been answered alone.
struct Batcher {
    store: Store,
    slots: Arc<Semaphore>,
    wakes: Arc<Wakes>,
}

/// Whether the trigger that wakes an event waiting for its payment (V11) is
/// known to be on: V18 leaves it off on a database that has held no event,
/// and this process switches it on before it stores its first one.
#[derive(Default)]
struct Wakes {
    on: AtomicBool,
    /// When switching it on last failed: tried again a minute later.
    failed_at: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Wakes {
    async fn switch_on(&self, store: &Store) {
        if self.on.load(Ordering::Acquire) {
            return;
        }
        {
            let failed_at = self.failed_at.lock().expect("not poisoned");
            if failed_at.is_some_and(|at| at.elapsed() < Duration::from_secs(60)) {
                return;
            }
        }
        match store.switch_on_payment_wakes().await {
            Ok(switched) => {
                if switched {
                    tracing::info!("switched on the trigger that wakes inbox events waiting for their payment (off on a database no inbox had used)");
                }
                self.on.store(true, Ordering::Release);
            }
            Err(e) => {
                tracing::warn!(error = %crate::report::chain(&e),
                    "could not switch on the trigger that wakes inbox events waiting for their payment: \
                     until it is on they are looked at again after their pause (up to a minute); tried again in a minute");
                *self.failed_at.lock().expect("not poisoned") = Some(std::time::Instant::now());
            }
        }
    }
}

impl Batcher {
    async fn run(self, mut queue: mpsc::Receiver<Pending>) {
        while let Some(first) = queue.recv().await {
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < ACCEPT_BATCH {
                match queue.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let store = self.store.clone();
            let wakes = self.wakes.clone();
            tokio::spawn(async move {
                wakes.switch_on(&store).await;
                write_accepts(&store, batch).await;
                drop(slot);
            });
        }
    }
}

/// Stores a batch of accepts ([`Store::accept_together`]) and answers each.
async fn write_accepts(store: &Store, batch: Vec<Pending>) {
    let (items, answers): (Vec<ToAccept>, Vec<_>) =
        batch.into_iter().map(|p| (p.item, p.answer)).unzip();
    let results = store.accept_together(&items).await;
    for (answer, result) in answers.into_iter().zip(results) {
        let _ = answer.send(result);
    }
}

/// Sends the NOTIFY that follows accepts: at most one in flight, the accepts
/// that commit meanwhile folded into the next one.
struct Notifier {
    store: Store,
    /// An accept committed since the last NOTIFY was sent.
    pending: AtomicBool,
    /// A task is sending NOTIFYs.
    sending: AtomicBool,
}

impl Notifier {
    fn accepted(self: &Arc<Self>) {
        self.pending.store(true, Ordering::SeqCst);
        if self.sending.swap(true, Ordering::SeqCst) {
            return;
        }
        let notifier = self.clone();
        tokio::spawn(async move {
            loop {
                while notifier.pending.swap(false, Ordering::SeqCst) {
                    if let Err(e) = notifier.store.notify_inbox().await {
                        // Workers elsewhere find the event at their next poll.
                        tracing::debug!(error = %crate::report::chain(&e), "inbox NOTIFY not sent");
                    }
                }
                notifier.sending.store(false, Ordering::SeqCst);
                // An accept that came between the last swap and the store
                // above found `sending` still set: take it up.
                if !notifier.pending.load(Ordering::SeqCst)
                    || notifier.sending.swap(true, Ordering::SeqCst)
                {
                    return;
                }
            }
        });
    }
}

impl Inbox {
    pub fn new(
        store: Store,
        processor: Processor,
        metrics: Metrics,
        cfg: InboxConfig,
        db: DbConfig,
        lock: Duration,
    ) -> Inbox {
        let notifier = Arc::new(Notifier {
            store: store.clone(),
            pending: AtomicBool::new(false),
            sending: AtomicBool::new(false),
        });
        let (batcher, queue) = mpsc::channel(ACCEPT_BATCH * ACCEPTS_IN_FLIGHT);
        tokio::spawn(
            Batcher {
                store: store.clone(),
                slots: Arc::new(Semaphore::new(ACCEPTS_IN_FLIGHT)),
                wakes: Arc::default(),
            }
            .run(queue),
        );
        Inbox {
            store,
            processor,
            metrics,
            cfg,
            db,
            lock,
            wake: Arc::new(Notify::new()),
            notifier,
            batcher,
        }
    }

    /// Stores an event for the workers; the one durable write of inbox mode.
    /// `cancel_if_payment_failed`: a refund its PSP may have meant as a
    /// cancel, which the worker that books it decides by the ledger.
    pub async fn accept(
        &self,
        ev: &CanonicalEvent,
        cancel_if_payment_failed: bool,
        psp_event_id: Option<&str>,
        body: &str,
    ) -> Result<Accepted, Error> {
        // The accept's span (the caller's): the workers' attempts join it.
        let trace_context = crate::telemetry::propagation::current();
        let item = ToAccept {
            event: ev.clone(),
            fingerprint: ev.fingerprint(),
            psp_event_id: psp_event_id.map(str::to_owned),
            body: body.to_owned(),
            trace_context: trace_context.clone(),
            cancel_if_payment_failed,
        };
        let (answer, answered) = oneshot::channel();
        let accepted = match self.batcher.send(Pending { item, answer }).await {
            Ok(()) => answered.await.ok(),
            Err(_) => None,
        };
        let accepted = match accepted {
            Some(accepted) => accepted?,
            // The batcher is gone (only while the runtime shuts down).
            None => {
                let fp = ev.fingerprint();
                self.store
                    .accept(
                        ev,
                        &fp,
                        psp_event_id,
                        body,
                        trace_context.as_deref(),
                        cancel_if_payment_failed,
                    )
                    .await?
            }
        };
        if accepted == Accepted::New {
            self.wake.notify_waiters();
            self.notifier.accepted();
        }
        Ok(accepted)
    }

    /// Runs `workers` workers and the listener until `stop` turns true; each
    /// worker finishes (or abandons, fenced) its current attempt first.
    pub async fn run(self: Arc<Self>, workers: usize, stop: watch::Receiver<bool>) {
        if workers == 0 {
            return;
        }
        let mut tasks = JoinSet::new();
        tasks.spawn(self.clone().listen(stop.clone()));
        tasks.spawn(self.clone().rescue_on_schedule(stop.clone()));
        for n in 0..workers {
            tasks.spawn(self.clone().work(n, stop.clone()));
        }
        tracing::info!(workers, "inbox workers started");
        while tasks.join_next().await.is_some() {}
    }

    async fn work(self: Arc<Self>, n: usize, mut stop: watch::Receiver<bool>) {
        // The events of the last take found done, recorded with the next
        // take (`Store::take_after`), or alone when the worker stops.
        let mut done: Vec<Taken> = Vec::new();
        loop {
            if *stop.borrow() {
                self.record_done(&done).await;
                return;
            }
            let recording: Vec<&Taken> = done.iter().collect();
            let took = self
                .store
                .take_after(&recording, self.lock, TAKE_BATCH)
                .await;
            report_done(&done, took.as_ref().map(|t| &t.done[..]));
            done.clear();
            match took.map(|t| t.taken) {
                Ok(taken) if !taken.is_empty() => {
                    let (taken, unreadable): (Vec<_>, Vec<_>) =
                        taken.into_iter().partition(Result::is_ok);
                    for event in unreadable.into_iter().filter_map(Result::err) {
                        self.bury(&event).await;
                    }
                    let taken: Vec<Taken> = taken.into_iter().filter_map(Result::ok).collect();
                    if !taken.is_empty() {
                        done = self.attempts(taken).await;
                    }
                }
                Ok(_) => {
                    tokio::select! {
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep(self.cfg.idle_poll) => {}
                        _ = stop.changed() => {}
                    }
                }
                Err(e) => {
                    tracing::debug!(worker = n, error = %crate::report::chain(&e), "cannot take work");
                    tokio::select! {
                        () = tokio::time::sleep(BACKEND_RETRY) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
    }

    /// Records the events of one take done, alone (a stopping worker's last
    /// ones; the others go with the next take).
    async fn record_done(&self, done: &[Taken]) {
        if done.is_empty() {
            return;
        }
        let recording: Vec<&Taken> = done.iter().collect();
        let recorded = self.store.settle_done(&recording).await;
        report_done(done, recorded.as_ref().map(|ids| &ids[..]));
    }

    /// Every [`RESCUE_EVERY`] until `stop`: the events whose worker's lock
    /// ran out back in the queue, and this process's idle workers woken to
    /// take them. Its own task, not a worker's chore between takes: a
    /// worker in a slow downstream call held up a dead worker's events for
    /// as long as its call took, far past the lock's TTL.
    async fn rescue_on_schedule(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(RESCUE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if *stop.borrow() {
                return;
            }
            tokio::select! {
                _ = tick.tick() => {}
                changed = stop.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => return,
                },
            }
            if self.rescue().await {
                self.wake.notify_waiters();
            }
        }
    }

    /// Puts events whose worker's lock ran out back in the queue; whether
    /// there were any.
    async fn rescue(&self) -> bool {
        match self.store.rescue().await {
            Ok(0) | Err(_) => false,
            Ok(rescued) => {
                tracing::warn!(rescued, "events taken again: their worker's lock ran out");
                true
            }
        }
    }

    /// Makes an event this binary cannot read `dead` with the reason: taken
    /// again and again it would only fail again.
    async fn bury(&self, event: &Unreadable) {
        self.metrics.inbox_attempts(InboxAttempt::Dead).increment(1);
        tracing::warn!(event = event.id, error = %event.error,
            "an event this binary cannot read is dead; replay it with a binary that can");
        if let Err(e) = self.store.settle_unreadable(event).await {
            tracing::warn!(event = event.id, error = %crate::report::chain(&e),
                "could not record an unreadable event dead; it will be taken again");
        }
    }

    /// The attempts at the events of one take, side by side, their lock
    /// renewed while they run, and the results not done recorded, one by
    /// one; the done ones are returned, to be recorded together with the
    /// worker's next take (their lock set to the last renewal's).
    async fn attempts(&self, taken: Vec<Taken>) -> Vec<Taken> {
        let ids: Vec<i64> = taken.iter().map(|t| t.id).collect();
        // One take, one lock value (see `Store::take`).
        let Some(taken_lock) = taken.first().map(|t| t.locked_until) else {
            return Vec::new();
        };
        let (finished, mut running) = watch::channel(false);
        let attempts = async {
            let results = join_all(taken.into_iter().map(|t| self.attempt(t))).await;
            let _ = finished.send(true);
            results
        };
        let renewal = async {
            let mut lock = taken_lock;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(self.lock / 3) => {}
                    _ = running.changed() => return lock,
                }
                // Never cut short: the lock it sets is the one the results
                // are recorded under.
                match self.store.renew_locks(&ids, lock, self.lock).await {
                    Ok(Some(renewed)) => lock = renewed,
                    // Each was taken again (our lock ran out): their results
                    // will not be recorded, whatever we do.
                    Ok(None) => {
                        let _ = running.changed().await;
                        return lock;
                    }
                    // Tried again next tick. Had it committed after all (its
                    // answer lost), the events carry a lock we do not know:
                    // the next renewals find none, their results are not
                    // recorded, and the rescue hands them on once it runs
                    // out (the lifecycle then finds what was booked).
                    Err(e) => {
                        tracing::debug!(error = %crate::report::chain(&e), "could not renew the lock of taken events");
                    }
                }
            }
        };
        let (mut results, lock) = tokio::join!(attempts, renewal);
        for (taken, _) in &mut results {
            taken.locked_until = lock;
        }
        let (done, others): (Vec<_>, Vec<_>) = results
            .into_iter()
            .partition(|(_, settle)| *settle == Settle::Done);
        for (taken, settle) in &others {
            let recorded = self.store.settle(taken, settle).await;
            report_settle(taken, settle, recorded.as_ref().copied());
        }
        done.into_iter().map(|(taken, _)| taken).collect()
    }

    /// One attempt at one event: what its row should record.
    async fn attempt(&self, taken: Taken) -> (Taken, Settle) {
        let age = age_of(taken.age_from);
        let span = spans::inbox_attempt(
            &taken.event,
            taken.attempts + 1,
            taken.trace_context.as_deref(),
        );
        let (settle, counted) = match self.cancelled(&taken).await {
            // A cancel: it moves nothing, and there is nothing to book.
            Ok(true) => (Settle::Done, InboxAttempt::Done),
            Ok(false) => {
                let outcome = self
                    .processor
                    .process_after(&taken.event, taken.row.clone())
                    .instrument(span)
                    .await;
                self.settle_for(&taken, age, outcome)
            }
            Err(e) => self.settle_for(&taken, age, Err(e)),
        };
        self.metrics.inbox_attempts(counted).increment(1);
        if settle == Settle::Done {
            self.metrics
                .inbox_lag()
                .record(age_of(taken.received_at).as_secs_f64());
        }
        (taken, settle)
    }

    /// Whether the event is a refund its PSP may have meant as a cancel and
    /// was one: decided here, when it is booked, by its payment's row as it
    /// stands now (at accept, the payment's failure may still have been
    /// queued; see [`crate::domain::cancelled`]).
    async fn cancelled(&self, taken: &Taken) -> Result<bool, Error> {
        if !taken.cancel_if_payment_failed {
            return Ok(false);
        }
        let ev = &taken.event;
        let parent = ev.parent_transaction_id.as_deref().unwrap_or_default();
        let payment = self.store.lookup(&ev.provider, parent).await?;
        let cancelled = payment.is_some_and(|p| crate::domain::cancelled(p.kind, p.status));
        if cancelled {
            tracing::debug!(provider = %ev.provider, transaction_id = %ev.transaction_id,
                payment = parent, "a refund of a failed payment that was a cancel: nothing to book");
        }
        Ok(cancelled)
    }

    /// What an attempt's outcome means for its event.
    fn settle_for(
        &self,
        taken: &Taken,
        age: Duration,
        outcome: Result<Outcome, Error>,
    ) -> (Settle, InboxAttempt) {
        let ev = &taken.event;
        let too_old = age >= self.cfg.max_age;
        let requeue = |delay: Duration, reason: String| {
            if too_old {
                let error = format!(
                    "older than {}; last: {reason}",
                    setting::FENCEHOOK_MAX_AGE_SECS
                );
                (
                    Settle::Dead {
                        error,
                        spent: false,
                    },
                    InboxAttempt::Dead,
                )
            } else {
                (Settle::Requeue { delay, reason }, InboxAttempt::Requeued)
            }
        };
        let dead = |error: String| {
            (
                Settle::Dead {
                    error,
                    spent: false,
                },
                InboxAttempt::Dead,
            )
        };
        match outcome {
            Ok(Outcome::Processed { .. } | Outcome::Duplicate | Outcome::Stale) => {
                (Settle::Done, InboxAttempt::Done)
            }
            Ok(Outcome::InProgress { .. }) => {
                requeue(HELD_RETRY, "held by another worker".to_owned())
            }
            Ok(Outcome::LeaseLost { .. }) => {
                requeue(HELD_RETRY, "lease lost before the commit".to_owned())
            }
            Ok(Outcome::AwaitingPayment) => {
                // Woken at once when the payment is booked (V11's trigger),
                // even while we hold it; this is the fallback.
                let payment = ev.parent_transaction_id.as_deref().unwrap_or("-");
                requeue(
                    self.await_delay(age),
                    format!("waiting for payment {payment}"),
                )
            }
            Ok(Outcome::RefundRejected(Rejection::PaymentFailed)) => {
                // A failed payment can still succeed (the lifecycle moves
                // `failed` to `succeeded`), and the events of one payment come
                // in any order: wait for it as for a payment not booked yet
                // (its success wakes this event), dead only at the age limit.
                // Sync mode answers 422 here, and the PSP's retry gets the
                // same second chance.
                let payment = ev.parent_transaction_id.as_deref().unwrap_or("-");
                requeue(
                    self.await_delay(age),
                    format!("payment {payment} failed; waiting for it to succeed"),
                )
            }
            Ok(Outcome::RefundRejected(why)) => dead(format!("refund_rejected: {}", why.as_str())),
            Ok(Outcome::PayloadMismatch) => {
                dead("payload_mismatch: the row holds another payload".to_owned())
            }
            Err(Error::Downstream(e)) => {
                let attempt = taken.attempts as u32 + 1;
                let error = crate::report::chain(&e);
                if attempt >= self.cfg.max_attempts || too_old {
                    (Settle::Dead { error, spent: true }, InboxAttempt::Dead)
                } else {
                    let delay = e
                        .retry_after()
                        .map(|after| after.min(self.cfg.retry_max))
                        .unwrap_or_else(|| self.backoff(attempt));
                    (Settle::Retry { delay, error }, InboxAttempt::Retry)
                }
            }
            Err(e) => requeue(BACKEND_RETRY, crate::report::chain(&e)),
        }
    }

    /// Pause of an event waiting for its payment: a quarter of its age,
    /// from the retry base up to [`AWAIT_RETRY_MAX`].
    fn await_delay(&self, age: Duration) -> Duration {
        (age / 4).clamp(self.cfg.retry_base, AWAIT_RETRY_MAX)
    }

    /// Exponential backoff from the base, capped, with jitter (half fixed,
    /// half random) so retries of many events do not arrive together.
    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.cfg.retry_base.saturating_mul(
            1u32.checked_shl(attempt.saturating_sub(1))
                .unwrap_or(u32::MAX),
        );
        let full = exp.min(self.cfg.retry_max);
        let half = full / 2;
        half + half.mul_f64(rand::thread_rng().gen::<f64>())
    }

    /// One `LISTEN` connection per process: every notification wakes the
    /// idle workers. Reconnects after a failure; the workers poll meanwhile.
    async fn listen(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            if let Err(e) = self.listen_once(&mut stop).await {
                tracing::debug!(error = %crate::report::chain(&e), "inbox listener lost its connection");
            }
            tokio::select! {
                () = tokio::time::sleep(BACKEND_RETRY) => {}
                _ = stop.changed() => {}
            }
        }
    }

    async fn listen_once(&self, stop: &mut watch::Receiver<bool>) -> Result<(), StoreError> {
        let mut cfg = crate::db::tls::Target::parse(&self.db.url)
            .map_err(|e| StoreError::Build(crate::db::PoolBuildError::Url(e)))?;
        cfg.config.application_name("fencehook-inbox-listen");
        cfg.config.connect_timeout(self.db.connect_timeout);
        let (client, mut conn) = cfg.config.connect(cfg.tls).await?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
            use futures_util::StreamExt;
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => {
                        let _ = tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        // Events that arrived while nobody listened.
        self.wake.notify_waiters();
        let result = loop {
            tokio::select! {
                got = rx.recv() => match got {
                    Some(()) => self.wake.notify_waiters(),
                    None => break Ok(()),
                },
                _ = stop.changed() => break Ok(()),
            }
        };
        driver.abort();
        result
    }
}

/// Logs an attempt's result that was not recorded.
fn report_settle(taken: &Taken, settle: &Settle, recorded: Result<bool, &StoreError>) {
    match recorded {
        Ok(true) => {}
        Ok(false) => {
            // Our lock ran out mid-attempt and the event was taken again
            // (or replayed): the newer attempt's result stands; what we
            // booked, if anything, was fenced.
            tracing::warn!(
                event = taken.id,
                ?settle,
                "an attempt outlived its lock; its result is not recorded over the newer attempt's"
            );
        }
        Err(e) => {
            // The event stays `processing` until its lock runs out; then a
            // worker takes it again and the lifecycle finds what was done.
            tracing::warn!(event = taken.id, error = %crate::report::chain(e),
                "could not record an attempt's result; the event will be taken again");
        }
    }
}

/// Logs the done events of one take whose result was not recorded: `done`
/// is the ids recorded, or the statement's error.
fn report_done(done: &[Taken], recorded: Result<&[i64], &StoreError>) {
    for taken in done {
        report_settle(
            taken,
            &Settle::Done,
            recorded.map(|ids| ids.contains(&taken.id)),
        );
    }
}

fn age_of(since: OffsetDateTime) -> Duration {
    Duration::try_from(OffsetDateTime::now_utc() - since).unwrap_or(Duration::ZERO)
}

/// The scheduled prune of `serve` and `work` (`FENCEHOOK_PRUNE_INTERVAL_SECS`):
/// what `fencehook prune` does, every `every`, the first time at start.
/// Finished events past `retention`, quarantined items last seen before
/// it and delivery history rows answered before it are deleted; dead events are kept for a replay. Every instance runs
/// it: the deletes are idempotent, and a second one finds nothing. Runs
/// until the task is aborted.
pub async fn prune_on_schedule(
    store: Store,
    metrics: Metrics,
    retention: Duration,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(before) = crate::config::time_before(OffsetDateTime::now_utc(), retention) else {
            // Bounded at start (FENCEHOOK_EVENT_RETENTION_DAYS); cannot happen.
            return;
        };
        match store.prune(before, false).await {
            Ok((events, items)) => {
                metrics.pruned().increment(events);
                if events + items > 0 {
                    tracing::info!(events, quarantined_items = items, "pruned past retention");
                }
            }
            Err(e) => {
                tracing::warn!(error = %crate::report::chain(&e), "scheduled prune failed; tried again at the next interval");
            }
        }
        // The delivery history is kept as long as the events.
        match store.prune_deliveries(before).await {
            Ok(0) => {}
            Ok(rows) => tracing::info!(rows, "delivery history pruned past retention"),
            Err(e) => {
                tracing::warn!(error = %crate::report::chain(&e), "scheduled prune of the delivery history failed; tried again at the next interval");
            }
        }
    }
}
