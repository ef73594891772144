//! The state machine of one event:
//!
//! 1. fast path: the row (if any) and the lifecycle rule
//!    ([`domain::decide`](crate::domain::decide)) answer `duplicate`,
//!    `stale` or `payload_mismatch` without touching the lease;
//! 2. acquire the lease; if another holder has it, wait (bounded by
//!    `FENCEHOOK_INFLIGHT_WAIT_MS`) for its outcome, else answer `in_progress`;
//! 3. fenced claim → business step → fenced finalize, in one transaction, or —
//!    with a downstream service — claim committed first, downstream call under
//!    the heartbeat, then the fenced finalize; a refund or dispute takes its
//!    money from its payment in the same transaction as its entry (with a
//!    downstream: as its claim, before the call), or waits
//!    (`awaiting_payment`), or is refused (`refund_rejected`); a payment row
//!    another transaction holds is polled like a held lease (`in_progress`);
//! 4. release the lease (compare-and-delete) and answer.
//!
//! With a lease backend that can take the lease inside a payment write
//! ([`InlineLease`], the PostgreSQL backend) and no downstream, steps 2–4 are
//! one statement: the lease is taken and given back inside the write. Either
//! way one loop (`Processor::attempts`) runs the attempts: each is `Held`
//! (wait), answered, or `NotWritten` (re-read, decide again).
//!
//! The processor never answers `processed` unless the commit that made the
//! outcome durable succeeded; every error is an [`Error`] (answered 503),
//! never a duplicate.

use std::ops::ControlFlow;
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::{
    decide, payment_event_matches, CanonicalEvent, Decision, ObjectKind, Rejection, Status,
    Transition,
};
use crate::downstream::{Downstream, DownstreamError};
use crate::error::Error;
use crate::lease::{Acquire, InlineLease, Lease, LeaseGuard, LeaseKey, LostReason};
use crate::metrics::{DownstreamResult, InflightWait, Metrics};
use crate::store::{
    Applied, Claimed, Connection, Finalized, LeasedApply, ParentRefusal, PaymentRow, Reserved,
    Store, StoreError,
};
use crate::telemetry::spans;

/// The answer for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Processed now; the outcome is committed.
    Processed { token: i64, status: Status },
    /// The row already says what this event says.
    Duplicate,
    /// The event is older than the row's state (a payment's failure after its
    /// success): nothing changed.
    Stale,
    /// Same (provider, transaction_id), different payload.
    PayloadMismatch,
    /// Another holder is processing it; retry after this long.
    InProgress { retry_after: Duration },
    /// A refund or dispute whose payment is not `succeeded` here yet (or a
    /// reinstatement before its withdrawal): retry later.
    AwaitingPayment,
    /// A refund or dispute its payment cannot give: nothing booked.
    RefundRejected(Rejection),
    /// Our lease ended (or a newer token owns the row) before we could commit.
    LeaseLost { token: i64 },
}

impl Outcome {
    pub fn token(&self) -> Option<i64> {
        match self {
            Outcome::Processed { token, .. } | Outcome::LeaseLost { token } => Some(*token),
            _ => None,
        }
    }
}

/// Fault-injection points for in-process tests (the `test-support` feature).
#[cfg(feature = "test-support")]
pub mod hooks {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;

    use crate::domain::CanonicalEvent;

    type HookFn = dyn Fn(&CanonicalEvent) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

    /// `before_finalize` runs *after* the last lease check and right before
    /// the fenced finalize of the downstream path: it stands for a
    /// stop-the-world pause (GC, swapped-out process) at the worst moment,
    /// which is exactly what the fence must survive. `before_write` runs once
    /// a holder has its connection, *before* it checks its lease and writes:
    /// a pause there is one the holder must notice by itself.
    #[derive(Clone, Default)]
    pub struct Hooks {
        pub(crate) before_finalize: Option<Arc<HookFn>>,
        pub(crate) before_write: Option<Arc<HookFn>>,
    }

    impl Hooks {
        pub fn before_write<F, Fut>(f: F) -> Hooks
        where
            F: Fn(&CanonicalEvent) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = ()> + Send + 'static,
        {
            Hooks {
                before_write: Some(Arc::new(move |ev| Box::pin(f(ev)))),
                ..Hooks::default()
            }
        }

        pub fn before_finalize<F, Fut>(f: F) -> Hooks
        where
            F: Fn(&CanonicalEvent) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = ()> + Send + 'static,
        {
            Hooks {
                before_finalize: Some(Arc::new(move |ev| Box::pin(f(ev)))),
                ..Hooks::default()
            }
        }
    }
}

#[derive(Clone)]
pub struct Processor {
    store: Store,
    lease: Lease,
    metrics: Metrics,
    inflight_wait: Duration,
    downstream: Option<Downstream>,
    #[cfg(feature = "test-support")]
    hooks: hooks::Hooks,
}

/// First pause of the in-flight wait; doubles up to [`MAX_POLL`]. A holder
/// without a downstream call commits in a few milliseconds.
const FIRST_POLL: Duration = Duration::from_millis(2);
/// `Retry-After` of an `in_progress` answer, at most.
const IN_PROGRESS_RETRY_AFTER: Duration = Duration::from_secs(1);
const MAX_POLL: Duration = Duration::from_millis(100);
/// Rounds of write → re-read → decide under one lease before giving up.
const MAX_ROUNDS: usize = 4;

/// Where one delivery's in-flight wait stands.
struct InflightWaiting {
    deadline: Instant,
    pause: Duration,
    /// It paused at least once.
    waited: bool,
}

impl InflightWaiting {
    fn new(wait: Duration) -> InflightWaiting {
        InflightWaiting {
            deadline: Instant::now() + wait,
            pause: FIRST_POLL,
            waited: false,
        }
    }
}

/// How one delivery holds its transaction's lease.
enum Holding {
    /// Taken and given back inside each write: a token per attempt.
    Inside(InlineLease),
    /// Held around the writes: taken by the first attempt, kept for the next
    /// ones, released once the delivery is answered.
    Around {
        key: LeaseKey,
        guard: Option<LeaseGuard>,
    },
}

/// The lease one attempt wrote under.
enum HeldLease<'h> {
    /// Taken with `token` inside the write, and given back with it.
    Inside {
        lease: &'h InlineLease,
        token: i64,
    },
    Around(&'h mut LeaseGuard),
}

impl HeldLease<'_> {
    /// The token now (a guard's changes with a resync).
    fn token(&self) -> i64 {
        match self {
            HeldLease::Inside { token, .. } => *token,
            HeldLease::Around(guard) => guard.token(),
        }
    }
}

/// What one attempt came to, whichever way it held the lease.
enum Attempt<'h> {
    /// Another holder has the lease, or the payment row a refund or dispute
    /// takes its money from (for `remaining` at most): poll the row.
    Held { remaining: Duration },
    /// The answer: committed, refused, the lease lost, or nothing to write.
    Answered(Outcome),
    /// The conditioned write of `t` under `lease` wrote nothing: the row,
    /// re-read, to decide again.
    NotWritten {
        lease: HeldLease<'h>,
        row: PaymentRow,
        t: Transition,
    },
}

impl Processor {
    pub fn new(
        store: Store,
        lease: Lease,
        metrics: Metrics,
        inflight_wait: Duration,
        downstream: Option<Downstream>,
    ) -> Processor {
        Processor {
            store,
            lease,
            metrics,
            inflight_wait,
            downstream,
            #[cfg(feature = "test-support")]
            hooks: hooks::Hooks::default(),
        }
    }

    /// This processor without the in-flight wait: an inbox worker that finds
    /// the lease held moves on to other work instead of waiting.
    pub fn without_inflight_wait(&self) -> Processor {
        Processor {
            inflight_wait: Duration::ZERO,
            ..self.clone()
        }
    }

    #[cfg(feature = "test-support")]
    pub fn with_hooks(mut self, hooks: hooks::Hooks) -> Processor {
        self.hooks = hooks;
        self
    }

    pub async fn process(&self, ev: &CanonicalEvent) -> Result<Outcome, Error> {
        let row = spans::leaf(spans::fast_path(), self.lookup(ev)).await?;
        self.process_after(ev, row).await
    }

    /// [`Processor::process`] after its fast-path lookup, given the row it
    /// would have read (inbox workers read it with the take).
    pub async fn process_after(
        &self,
        ev: &CanonicalEvent,
        row: Option<PaymentRow>,
    ) -> Result<Outcome, Error> {
        let parentless;
        let ev = match row.as_ref().and_then(|r| settled_before_parents(r, ev)) {
            Some(old) => {
                parentless = old;
                &parentless
            }
            None => ev,
        };
        let fp = ev.fingerprint();
        if let Some(done) = self.settled(ev, &fp, row.as_ref()) {
            return Ok(done);
        }
        // A downstream call must run under a lease that outlives one write.
        let inline = self.downstream.is_none().then(|| self.lease.inline());
        let mut holding = match inline.flatten() {
            Some(inline) => Holding::Inside(inline),
            None => Holding::Around {
                key: LeaseKey {
                    provider: ev.provider.clone(),
                    transaction_id: ev.transaction_id.clone(),
                },
                guard: None,
            },
        };
        let result = self.attempts(&mut holding, ev, &fp, row).await;
        if let Holding::Around {
            guard: Some(guard), ..
        } = holding
        {
            let token = guard.token();
            spans::leaf(spans::lease_release(token), guard.release()).await;
        }
        result
    }

    /// The attempts of one delivery until one is answered: each holds the
    /// lease (`holding`), decides on the row as last read and writes what it
    /// decided, conditioned on its token. A lease or payment row another
    /// holder has is waited for; a conditioned write that did not apply
    /// re-reads the row and decides again. The row can move a few times
    /// (another holder settled it, a counter was behind), never forever: each
    /// round needs a newer token.
    async fn attempts(
        &self,
        holding: &mut Holding,
        ev: &CanonicalEvent,
        fp: &str,
        mut row: Option<PaymentRow>,
    ) -> Result<Outcome, Error> {
        let mut wait = InflightWaiting::new(self.inflight_wait);
        let mut resynced = false;
        let mut rounds = 0;
        loop {
            // One attempt on the row as last read: the lease (taken around
            // the writes by the first attempt, or inside this attempt's
            // write), the decision, a pooled connection and the write.
            let attempt = match &mut *holding {
                Holding::Inside(inline) => self.write_inside(inline, ev, fp, row.as_ref()).await?,
                Holding::Around { key, guard } => 'around: {
                    let guard = match guard {
                        Some(guard) => guard,
                        None => match self.acquire(key, &mut wait).await? {
                            Acquire::Acquired(taken) => guard.insert(taken),
                            Acquire::Held { remaining } => {
                                break 'around Attempt::Held { remaining }
                            }
                        },
                    };
                    self.write_around(guard, ev, fp, row.as_ref()).await?
                }
            };
            let (mut lease, now, t) = match attempt {
                Attempt::Answered(outcome) => return Ok(outcome),
                Attempt::Held { remaining } => {
                    match self.wait_for_holder(ev, fp, &mut wait, remaining).await? {
                        ControlFlow::Break(answer) => return Ok(answer),
                        ControlFlow::Continue(now) => row = now,
                    }
                    continue;
                }
                Attempt::NotWritten { lease, row, t } => (lease, row, t),
            };
            rounds += 1;
            if !is_the_same_object(&now, ev, fp) {
                return Ok(Outcome::PayloadMismatch);
            }
            let token = lease.token();
            if decide(ev.event_type, Some(now.status)) == Decision::Apply(t) && now.fence >= token {
                // The row still needs our transition, so its fence is at or
                // past our token while we hold the lease: the lease store
                // lost its counter. Pass it, once.
                if resynced {
                    return Ok(self.fence_rejected(&lease, ev, Some(now.fence)));
                }
                resynced = true;
                if let Some(answer) = self.resync(&mut lease, ev, now.fence).await? {
                    return Ok(answer);
                }
            }
            if rounds == MAX_ROUNDS {
                return Ok(self.fence_rejected(&lease, ev, Some(now.fence)));
            }
            row = Some(now);
        }
    }

    /// Takes the lease to hold around the writes. Once it is taken, the
    /// in-flight wait starts again, for a payment row busy under it.
    async fn acquire(&self, key: &LeaseKey, wait: &mut InflightWaiting) -> Result<Acquire, Error> {
        let span = spans::lease_acquire();
        let acquired = spans::leaf(span.clone(), self.lease.acquire(key)).await?;
        let token = match &acquired {
            Acquire::Acquired(guard) => Some(guard.token()),
            Acquire::Held { .. } => None,
        };
        spans::lease_acquired(span, token);
        if token.is_some() {
            if wait.waited {
                tracing::debug!(transaction_id = %key.transaction_id, "previous holder let go; took over");
            }
            *wait = InflightWaiting::new(self.inflight_wait);
        }
        Ok(acquired)
    }

    /// The transition `row` needs and a pooled connection to write it, once
    /// the `before_write` hook ran; `Break` with the answer when the row
    /// needs no write.
    async fn ready_to_write(
        &self,
        ev: &CanonicalEvent,
        row: Option<&PaymentRow>,
    ) -> Result<ControlFlow<Outcome, (Transition, Connection)>, Error> {
        let t = match decide(ev.event_type, row.map(|r| r.status)) {
            Decision::Apply(t) => t,
            other => return Ok(ControlFlow::Break(self.answer_without_write(ev, other))),
        };
        let conn = self.store.connection().await?;
        #[cfg(feature = "test-support")]
        if let Some(hook) = &self.hooks.before_write {
            hook(ev).await;
        }
        Ok(ControlFlow::Continue((t, conn)))
    }

    /// The write that takes the lease inside it ([`Connection::apply_leased`],
    /// see [`InlineLease`]). Another copy of the event finds the lease taken
    /// and polls the row; a lease taken the other way (a holder calling a
    /// downstream, an instance configured differently) is waited for alike.
    /// The token is taken above the fence last read, so a counter the lease
    /// store lost is passed on the next attempt (counted as a resync).
    async fn write_inside<'h>(
        &self,
        inline: &'h InlineLease,
        ev: &CanonicalEvent,
        fp: &str,
        row: Option<&PaymentRow>,
    ) -> Result<Attempt<'h>, Error> {
        let fence_floor = row.map_or(0, |r| r.fence);
        let (t, mut conn) = match self.ready_to_write(ev, row).await? {
            ControlFlow::Break(answer) => return Ok(Attempt::Answered(answer)),
            ControlFlow::Continue(ready) => ready,
        };
        let started = Instant::now();
        let written = spans::leaf(
            spans::commit_leased(),
            conn.apply_leased(ev, fp, fence_floor, t),
        )
        .await?;
        Ok(match written {
            LeasedApply::Held { remaining } => {
                inline.held_by_other();
                Attempt::Held {
                    remaining: remaining.unwrap_or(IN_PROGRESS_RETRY_AFTER),
                }
            }
            LeasedApply::Parent(refusal) => self.refused(ev, refusal),
            LeasedApply::Committed {
                token,
                status,
                over_returned,
            } => {
                inline.taken(started);
                Attempt::Answered(self.committed(ev, token, status, over_returned))
            }
            LeasedApply::NotWritten { token, row } => {
                inline.taken(started);
                Attempt::NotWritten {
                    lease: HeldLease::Inside {
                        lease: inline,
                        token,
                    },
                    row,
                    t,
                }
            }
        })
    }

    /// Claim, business step and finalize while `guard` holds the lease: one
    /// transaction, or the claim, the downstream call and the finalize.
    ///
    /// Every write first takes a pooled connection, *then* checks the lease:
    /// waiting for a connection can take up to the pool wait, and a write sent
    /// after the local expiry could only be fenced out (or, with nobody else
    /// there, start work the lease no longer covers).
    async fn write_around<'h>(
        &self,
        guard: &'h mut LeaseGuard,
        ev: &CanonicalEvent,
        fp: &str,
        row: Option<&PaymentRow>,
    ) -> Result<Attempt<'h>, Error> {
        let (t, mut conn) = match self.ready_to_write(ev, row).await? {
            ControlFlow::Break(answer) => return Ok(Attempt::Answered(answer)),
            ControlFlow::Continue(ready) => ready,
        };
        if let Some(reason) = guard.loss_reason() {
            return Ok(Attempt::Answered(self.lease_lost(guard, reason)));
        }
        let token = guard.token();
        Ok(match &self.downstream {
            None => match spans::leaf(spans::commit(token), conn.apply(ev, fp, token, t)).await? {
                Applied::Committed {
                    status,
                    over_returned,
                } => Attempt::Answered(self.committed(ev, token, status, over_returned)),
                Applied::Parent(refusal) => self.refused(ev, refusal),
                Applied::NotWritten(row) => Attempt::NotWritten {
                    lease: HeldLease::Around(guard),
                    row,
                    t,
                },
            },
            Some(downstream) => {
                match spans::leaf(spans::claim(token), conn.claim(ev, fp, token, t)).await? {
                    Claimed::Claimed {
                        payment_id,
                        event,
                        reserved,
                    } => {
                        drop(conn);
                        let answer = self
                            .call_and_finalize(downstream, guard, &event, payment_id, t, reserved)
                            .await?;
                        Attempt::Answered(answer)
                    }
                    Claimed::Parent(refusal) => self.refused(ev, refusal),
                    Claimed::NotWritten(row) => Attempt::NotWritten {
                        lease: HeldLease::Around(guard),
                        row,
                        t,
                    },
                }
            }
        })
    }

    /// Committed: `processed` (and a dispute that took its payment past its
    /// amount reported).
    fn committed(
        &self,
        ev: &CanonicalEvent,
        token: i64,
        status: Status,
        over_returned: bool,
    ) -> Outcome {
        if over_returned {
            self.over_returned(ev);
        }
        Outcome::Processed { token, status }
    }

    /// A refund or dispute whose payment did not give its money. A payment
    /// row another transaction holds (another refund committing, or one
    /// stalled before its commit) is polled within the in-flight wait, as a
    /// held lease is, instead of queueing on the lock.
    fn refused(&self, ev: &CanonicalEvent, refusal: ParentRefusal) -> Attempt<'static> {
        match refusal {
            ParentRefusal::Busy => Attempt::Held {
                remaining: IN_PROGRESS_RETRY_AFTER,
            },
            refusal => Attempt::Answered(self.parent_refused(ev, refusal)),
        }
    }

    /// The lease store lost its counter: the row wants our transition at
    /// `db_fence`, at or past our token. A lease taken inside the write needs
    /// no more (the next write takes its token past the fence it reads); a
    /// guard's counter is fast-forwarded inside the lease. `Some` with the
    /// answer when the lease is no longer ours.
    async fn resync(
        &self,
        lease: &mut HeldLease<'_>,
        ev: &CanonicalEvent,
        db_fence: i64,
    ) -> Result<Option<Outcome>, Error> {
        let old_token = lease.token();
        match lease {
            HeldLease::Inside { .. } => {
                self.metrics.fence_resync().increment(1);
                tracing::warn!(provider = %ev.provider, transaction_id = %ev.transaction_id,
                    old_token, db_fence,
                    "fence resync: lease counter was behind the database; taking a token past it");
            }
            HeldLease::Around(guard) => match guard.resync(db_fence).await? {
                Some(new) => {
                    self.metrics.fence_resync().increment(1);
                    tracing::warn!(provider = %ev.provider, transaction_id = %ev.transaction_id,
                        old_token, db_fence, new_token = new,
                        "fence resync: lease counter was behind the database");
                }
                None => return Ok(Some(self.fence_rejected(lease, ev, Some(db_fence)))),
            },
        }
        Ok(None)
    }

    /// Another holder has the lease: `Break` with the answer when the
    /// in-flight wait is over or the holder's outcome settles this event;
    /// otherwise, after a pause, `Continue` with the row as it is now.
    #[tracing::instrument(name = "fencehook.wait_for_holder", level = "info", skip_all)]
    async fn wait_for_holder(
        &self,
        ev: &CanonicalEvent,
        fp: &str,
        wait: &mut InflightWaiting,
        remaining: Duration,
    ) -> Result<ControlFlow<Outcome, Option<PaymentRow>>, Error> {
        let now = Instant::now();
        if now >= wait.deadline {
            let outcome = if self.inflight_wait.is_zero() {
                InflightWait::InProgress
            } else {
                InflightWait::Timeout
            };
            self.metrics.inflight_wait(outcome).increment(1);
            // The holder usually commits within milliseconds; its lock's full
            // TTL would send the PSP away for seconds.
            return Ok(ControlFlow::Break(Outcome::InProgress {
                retry_after: remaining.min(IN_PROGRESS_RETRY_AFTER),
            }));
        }
        tokio::time::sleep(wait.pause.min(wait.deadline - now)).await;
        wait.pause = (wait.pause * 2).min(MAX_POLL);
        wait.waited = true;
        // Look at the row before trying the lease again: a holder that
        // finished has released it, and taking it only to find the row done
        // would cost a token and two writes.
        let row = self.lookup(ev).await?;
        if let Some(done) = self.settled(ev, fp, row.as_ref()) {
            self.metrics
                .inflight_wait(InflightWait::Duplicate)
                .increment(1);
            return Ok(ControlFlow::Break(done));
        }
        Ok(ControlFlow::Continue(row))
    }

    async fn lookup(&self, ev: &CanonicalEvent) -> Result<Option<PaymentRow>, StoreError> {
        self.store.lookup(&ev.provider, &ev.transaction_id).await
    }

    /// The answer when the row (or its absence) settles this event without
    /// the lease: nothing to write.
    fn settled(&self, ev: &CanonicalEvent, fp: &str, row: Option<&PaymentRow>) -> Option<Outcome> {
        if row.is_some_and(|r| !is_the_same_object(r, ev, fp)) {
            return Some(Outcome::PayloadMismatch);
        }
        let status = row.map(|r| r.status);
        match decide(ev.event_type, status) {
            Decision::Apply(_) => None,
            // A claim in progress (or queued) may be the very event awaited:
            // ask under the lease.
            Decision::Await if status.is_some() => None,
            other => Some(self.answer_without_write(ev, other)),
        }
    }

    /// `duplicate`, `stale` (counted) or `awaiting_payment`.
    fn answer_without_write(&self, ev: &CanonicalEvent, decision: Decision) -> Outcome {
        match decision {
            Decision::Duplicate | Decision::Apply(_) => Outcome::Duplicate,
            Decision::Stale => {
                self.metrics.stale_events().increment(1);
                tracing::info!(provider = %ev.provider, transaction_id = %ev.transaction_id,
                    event_type = ev.event_type.as_str(), "stale event: the row is past it; nothing changed");
                Outcome::Stale
            }
            Decision::Await => Outcome::AwaitingPayment,
        }
    }

    /// A refund or dispute its payment did not give money for.
    fn parent_refused(&self, ev: &CanonicalEvent, refusal: ParentRefusal) -> Outcome {
        match refusal {
            ParentRefusal::NotYet => Outcome::AwaitingPayment,
            // Its payment row stayed busy for the whole in-flight wait.
            ParentRefusal::Busy => Outcome::InProgress {
                retry_after: IN_PROGRESS_RETRY_AFTER,
            },
            ParentRefusal::Rejected(reason) => {
                self.metrics.refund_rejected(reason).increment(1);
                tracing::warn!(provider = %ev.provider, transaction_id = %ev.transaction_id,
                    payment = ev.parent_transaction_id.as_deref().unwrap_or("-"),
                    event_type = ev.event_type.as_str(), amount_minor = ev.amount_minor,
                    currency = %ev.currency, reason = reason.as_str(),
                    "refund rejected: nothing booked");
                Outcome::RefundRejected(reason)
            }
        }
    }

    /// A refund or a dispute took its payment past its amount (refunds and
    /// disputes together; refunds alone never do): booked (the money is
    /// gone), counted and logged for someone to reconcile.
    fn over_returned(&self, ev: &CanonicalEvent) {
        self.metrics.payments_over_returned().increment(1);
        tracing::warn!(provider = %ev.provider, transaction_id = %ev.transaction_id,
            payment = ev.parent_transaction_id.as_deref().unwrap_or("-"),
            event_type = ev.event_type.as_str(), amount_minor = ev.amount_minor,
            currency = %ev.currency,
            "payment over-returned: its refunds and disputes took more than came in; booked");
    }

    /// The downstream call under the heartbeat, then the fenced finalize.
    /// `event` is the claimed row's facts and the event being applied: every
    /// retry of one event sends one body.
    async fn call_and_finalize(
        &self,
        downstream: &Downstream,
        guard: &mut LeaseGuard,
        event: &CanonicalEvent,
        payment_id: i64,
        t: Transition,
        reserved: Reserved,
    ) -> Result<Outcome, Error> {
        let token = guard.token();
        tokio::select! {
            biased;
            reason = guard.lost() => {
                self.metrics.downstream(DownstreamResult::LeaseLost).increment(1);
                tracing::warn!(provider = %event.provider, transaction_id = %event.transaction_id, token,
                    %reason, "lease lost during the downstream call; not finalising");
                return Ok(self.lease_lost(guard, reason));
            }
            result = downstream.call(event, token) => if let Err(e) = result {
                // A non-2xx says this call was not executed: the money this
                // claim reserved goes back. A timeout or a cut connection
                // says nothing, and the step may have been executed: the
                // reservation stays for the next delivery to finish. A
                // reservation this claim took over from such a call is not
                // its to give back (that call may have run): it stays too.
                if reserved.here && matches!(e, DownstreamError::Status { .. }) {
                    let give_back = self.release(payment_id, event, token, t);
                    spans::leaf(spans::give_back(token), give_back).await;
                }
                return Err(e.into());
            },
        }
        let mut wait = InflightWaiting::new(self.inflight_wait);
        loop {
            let mut conn = self.store.connection().await?;
            if let Some(reason) = guard.loss_reason() {
                return Ok(self.lease_lost(guard, reason));
            }
            #[cfg(feature = "test-support")]
            if let Some(hook) = &self.hooks.before_finalize {
                hook(event).await;
            }
            failpoint_before_finalize();
            let finalize = conn.finalize(payment_id, event, token, t);
            return match spans::leaf(spans::finalize(token), finalize).await? {
                Finalized::Applied(status) => {
                    if reserved.over_returned {
                        self.over_returned(event);
                    }
                    Ok(Outcome::Processed { token, status })
                }
                Finalized::FenceRejected => {
                    Ok(self.fence_rejected(&HeldLease::Around(guard), event, None))
                }
                Finalized::Parent(ParentRefusal::Busy) if Instant::now() < wait.deadline => {
                    // A give-back's payment row is busy: the step is
                    // executed, so try again (the lease is still ours)
                    // rather than have the PSP call it again.
                    drop(conn);
                    tokio::time::sleep(wait.pause.min(wait.deadline - Instant::now())).await;
                    wait.pause = (wait.pause * 2).min(MAX_POLL);
                    continue;
                }
                Finalized::Parent(refusal) => Ok(self.parent_refused(event, refusal)),
            };
        }
    }

    /// Gives back what a claim reserved; a failure is logged, not answered
    /// (the delivery is answered for the downstream's refusal either way, and
    /// a reservation left in place is kept by the next claim).
    async fn release(&self, payment_id: i64, ev: &CanonicalEvent, token: i64, t: Transition) {
        let released = match self.store.connection().await {
            Ok(mut conn) => conn.release(payment_id, ev, token, t).await,
            Err(e) => Err(e),
        };
        if let Err(e) = released {
            tracing::warn!(provider = %ev.provider, transaction_id = %ev.transaction_id, token,
                error = %e, "could not give back the money reserved for a refused downstream call; the next claim keeps it");
        }
    }

    /// The lease ended before we finished: counted once, answered `lease_lost`.
    fn lease_lost(&self, guard: &LeaseGuard, reason: LostReason) -> Outcome {
        spans::lease_lost(guard.token(), &reason.to_string());
        guard.report_lost(reason);
        Outcome::LeaseLost {
            token: guard.token(),
        }
    }

    /// The database refused our token: a newer holder owns the payment, so
    /// our lease had ended (whether or not the heartbeat noticed; a lease
    /// taken inside the write ended with it).
    fn fence_rejected(
        &self,
        lease: &HeldLease<'_>,
        ev: &CanonicalEvent,
        db_fence: Option<i64>,
    ) -> Outcome {
        self.metrics.fence_rejected().increment(1);
        tracing::warn!(provider = %ev.provider, transaction_id = %ev.transaction_id, token = lease.token(), db_fence,
            "fence rejected: a newer token owns this payment; nothing written");
        match lease {
            HeldLease::Inside { lease, token } => {
                lease.lost();
                Outcome::LeaseLost { token: *token }
            }
            HeldLease::Around(guard) => self.lease_lost(guard, LostReason::Superseded),
        }
    }
}

/// Whether `row` is the object `ev` (fingerprint `fp`) is about: the same
/// fingerprint, or a payment's event that another amount cannot make another
/// object ([`domain::payment_event_matches`](crate::domain::payment_event_matches)):
/// a success while no success has settled the payment (a failure moved no
/// money, whether it is booked, queued, in flight or dead, and a PSP may
/// change a payment's amount after a decline: Stripe lets a PaymentIntent's
/// amount change), and a failure, which then answers by status (`stale`
/// after a success, `duplicate` after a failure). The write re-fingerprints
/// the row (`fenced_upsert!`). Every other difference is a mismatch.
fn is_the_same_object(row: &PaymentRow, ev: &CanonicalEvent, fp: &str) -> bool {
    row.fingerprint == fp
        || payment_event_matches(row.kind, row.status, ev.event_type)
        || (!row.status.is_settled() && is_from_before_parents(row, ev))
}

/// Whether `row` is `ev`'s refund as a release before refunds named their
/// payment booked it (migration V4 fingerprinted it with an empty parent),
/// while every adapter now names the parent.
fn is_from_before_parents(row: &PaymentRow, ev: &CanonicalEvent) -> bool {
    row.kind == ObjectKind::Refund
        && ev.event_type.object() == ObjectKind::Refund
        && ev.parent_transaction_id.is_some()
        && row.fingerprint == without_parent(ev).fingerprint()
}

/// `ev` without its parent, for a refund settled before refunds named their
/// payment: its debit never took its payment's money, so its later events
/// (a duplicate, its failure) are applied to it as it is, parentless, and
/// move no payment's money. An unsettled one is written with its parent
/// (its money is taken now).
fn settled_before_parents(row: &PaymentRow, ev: &CanonicalEvent) -> Option<CanonicalEvent> {
    (row.status.is_settled() && is_from_before_parents(row, ev)).then(|| without_parent(ev))
}

fn without_parent(ev: &CanonicalEvent) -> CanonicalEvent {
    CanonicalEvent {
        parent_transaction_id: None,
        ..ev.clone()
    }
}

/// Failpoint for process-level fault tests (compiled in only with the
/// `test-support` feature): `FAILPOINTS=before_finalize=1*return(sigstop)` makes
/// the process SIGSTOP itself after the last lease check, right before the
/// fenced finalize — a stop-the-world pause at the worst moment. The test
/// SIGCONTs it once another instance has taken over.
fn failpoint_before_finalize() {
    fail::fail_point!("before_finalize", |arg: Option<String>| {
        if arg.as_deref() == Some("sigstop") {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-STOP", &pid])
                .status();
            // The stop reaches every thread asynchronously: this one can return
            // from `kill` and run on for a moment. Sleeping here makes sure it
            // is frozen before it can send the finalize; after SIGCONT the
            // sleep ends and the stale holder carries on.
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    });
}
