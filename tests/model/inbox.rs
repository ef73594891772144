//! Inbox mode: an accepted event taken by workers, attempted with the
//! lease and the fence, and settled under the take's lock; rescued when its
//! worker stalls or dies, given up on (`dead`), and replayed.
//!
//! One payment's event (`payment.succeeded`, its row `queued` at accept), an
//! event of another transaction whose stored row cannot be decoded, two
//! workers, a downstream that may fail, a worker that may stall at any
//! moment (its lease and its take's lock then run out), the event growing
//! older than `FENCEHOOK_MAX_AGE_SECS`, and the operator's `fencehook replay`.
//!
//! # What each model step stands for
//!
//! | Model step | Stands for |
//! | --- | --- |
//! | `Take` | `inbox::Inbox::work` → `store::Store::take_after` (`store::inbox::TAKE`): every due `queued` event `processing`, locked until now + the lock, with its row; a row that cannot be decoded is settled `dead` alone |
//! | `FastPath` | `processor::Processor::process_after` on the take's row: `settled` answers `duplicate` |
//! | `Acquire` | `lease::Lease::acquire` (held: `in_progress`, no in-flight wait: `Processor::without_inflight_wait`) |
//! | `Claim` | `store::Connection::claim` (`fence < token`, status `queued` / `processing` / `dead`), its re-read on a conflict |
//! | `Call` / `CallFails` | `downstream::Downstream::call`; a failure spends an attempt (`inbox::Inbox::settle_for`: `Settle::Retry`, or `Settle::Dead` at `FENCEHOOK_MAX_ATTEMPTS`) |
//! | `Finalize` | `store::Connection::finalize` (`fence = token`), then `lease::LeaseGuard::release` |
//! | `Settle` | `inbox::Inbox::attempts` → `store::Store::settle` (`RETRY`, `REQUEUE`, `DEAD`) for the results not done; the done ones by the worker's next take (`store::Store::take_after`: `store::inbox::TAKE` records them in the statement that takes the next events) or, when it stops, `store::Store::settle_done` (`DONE`); each `WHERE status = 'processing' AND locked_until = <the take's>`; `DEAD` marks an unsettled row `dead` too |
//! | `Stall` | the worker pauses (GC, SIGSTOP) or dies: its heartbeat stops renewing the lease and the take's lock |
//! | `LeaseExpires` | the stalled worker's lease runs out (`lease/heartbeat.rs` renews it no more) |
//! | `LockExpires` | a take's lock runs out: it is renewed with the lease's heartbeat, so only while no live worker attempts its event (a stalled or dead one, or a take that failed) |
//! | `Rescue` | `inbox::Inbox::rescue_on_schedule`, a task of its own in each process with workers, every second → `store::Store::rescue` (`RESCUE`): `processing` events whose lock ran out are `queued` again; an actor of its own, interleaved with the workers, held up by none |
//! | `SlowCall` / `Finish` | (`Config::rescue`) a worker takes another payment's event and sits in its slow downstream call (`Elsewhere`), its own lock renewed, then is idle again |
//! | `Ages` | the event grows older than `FENCEHOOK_MAX_AGE_SECS`: a re-queue is `dead` instead |
//! | `Replay` | `fencehook replay` → `store::Store::replay`: dead events `queued` with attempts from zero and the age clock restarted, their `dead` rows `queued` |
//!
//! # Properties and broken variants
//!
//! Invariants: booked at most once however often replayed; the row's credit
//! matches its status; a done event stays done and is done only once booked;
//! an event is dead only after its attempts or when too old since it was
//! (re)queued; a dead row's event is dead; a worker attempts an event only
//! while its take's lock holds (or after it ran out); a worker that did not
//! stall has its result recorded; an event whose lock ran out can be
//! rescued at once, whatever the live workers are doing; and, from every
//! state, after a replay one more quiet worker books the event exactly once.
//!
//! | Variant | Caught by |
//! | --- | --- |
//! | a settle that ignores the take's lock | a stalled worker's re-queue undoing a newer attempt's `done` |
//! | a rescue that ignores the lock | a live worker's event handed to another |
//! | the take's lock not renewed with the heartbeat | a live worker's result not recorded |
//! | an undecodable row fails the whole take | the good event never booked |
//! | a replay that keeps the age clock | a replayed event dead again with attempts to spare |
//! | the rescue a worker's chore between its takes | a dead worker's event left `processing` while the live worker sits in a slow call elsewhere |
//!
//! # Variants that were the code
//!
//! Four broken variants are what the code did before the inbox's lock was
//! renewed, its rows read one by one, its replays aged anew and its rescue
//! given a timer of its own; each is kept so a return to it is caught:
//!
//! - a lock of fixed length that a slow attempt outlives
//!   (`Variant::NoLockRenewal`); the code renews the take's lock every third
//!   of a TTL while its attempts live (`Inbox::attempts`, `Store::renew_locks`);
//! - `Store::take` failing as a whole on a row it cannot decode
//!   (`Variant::UndecodableFailsTheTake`); the code settles that row `dead`
//!   alone (`Store::settle_unreadable`);
//! - an age counted from `received_at` whatever the replays
//!   (`Variant::ReplayKeepsTheAge`); the code counts it from the last replay;
//! - the rescue run by worker 0 between its takes
//!   (`Variant::RescueBetweenTakes`): a dead worker's events waited for as
//!   long as that worker's downstream call took; the code rescues on a timer
//!   of its own (`Inbox::rescue_on_schedule`).
//!
//! # What the model leaves out
//!
//! - The lease store's own faults and the resync (`protocol.rs`); here a
//!   lease ends only when its worker stalls, and a worker never checks its
//!   lease before a write (the fence alone must stop it: strictly more
//!   behaviours than the code's `is_held()` checks allow).
//! - Accepts, `NOTIFY`, the batch of sixteen (a take here takes every due
//!   event), backoff delays (a retried event is due at once).
//! - Refunds waiting for their payment (`lifecycle.rs` has the lifecycle).
//! - A worker's done recorded by the statement of its next take: here they
//!   are two steps (`Settle`, then `Take`), which allows every order the one
//!   statement does, and more.
//! - PostgreSQL's crashes: the take and the done commit without waiting for
//!   the WAL flush, so a crash may undo one (its event taken again, found
//!   booked by the lifecycle); the model's database never loses a commit.

use std::fmt;

use stateright::{Model, Property};

use crate::props::{self, Memo};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Correct,
    /// A settle conditioned on the event's id alone, not on the take's lock.
    SettleIgnoresLock,
    /// Rescue takes back `processing` events whose lock has not run out.
    RescueIgnoresLock,
    /// The take's lock is not renewed with the heartbeat: it runs out while
    /// its worker is still at work.
    NoLockRenewal,
    /// A row that cannot be decoded fails the whole take.
    UndecodableFailsTheTake,
    /// A replay leaves the age clock where it was.
    ReplayKeepsTheAge,
    /// The rescue is a worker's chore between its takes (each worker its
    /// own process, as with `fencehook work` per host): it runs only while
    /// some live worker is idle.
    RescueBetweenTakes,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub workers: usize,
    /// Takes in one run (a re-queue is taken again and again while a
    /// stalled worker holds the lease: this keeps the state space finite).
    pub takes: u8,
    /// `FENCEHOOK_MAX_ATTEMPTS`.
    pub max_attempts: u8,
    pub stalls: u8,
    pub replays: u8,
    /// Whether the undecodable event is there.
    pub poison: bool,
    /// Whether an idle worker may take another payment's event and sit in
    /// its slow downstream call (`Elsewhere`) for as long as it likes.
    pub busy: bool,
    pub variant: Variant,
}

impl Config {
    pub fn standard() -> Config {
        Config {
            workers: 2,
            takes: 6,
            max_attempts: 2,
            stalls: 2,
            replays: 2,
            poison: true,
            busy: false,
            variant: Variant::Correct,
        }
    }

    /// The rescue against busy workers: a worker may sit in a slow call on
    /// another payment's event while the other dies holding this one.
    pub fn rescue() -> Config {
        Config {
            workers: 2,
            takes: 4,
            max_attempts: 2,
            stalls: 1,
            replays: 1,
            poison: false,
            busy: true,
            variant: Variant::Correct,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvStatus {
    Queued,
    Processing,
    Done,
    Dead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event {
    pub status: EvStatus,
    /// The take id of its lock (0: none).
    pub lock: u8,
    /// The lock ran out.
    pub expired: bool,
    pub attempts: u8,
    /// Older than the age limit, by its `received_at`.
    pub old: bool,
    /// Older than the age limit since it was (re)queued by an accept or a replay.
    pub aged_since_queued: bool,
}

impl Event {
    fn queued() -> Event {
        Event {
            status: EvStatus::Queued,
            lock: 0,
            expired: false,
            attempts: 0,
            old: false,
            aged_since_queued: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowStatus {
    Queued,
    Processing,
    Succeeded,
    Dead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub status: RowStatus,
    pub fence: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Settle {
    Done,
    Retry,
    Requeue,
    /// `spent`: the failed call that gave up spends an attempt.
    Dead {
        spent: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pc {
    Idle,
    FastPath,
    Acquire,
    Claim,
    Call,
    Finalize,
    Settle(Settle),
    /// In a slow downstream call on another payment's event (its own lock
    /// renewed by its heartbeat: nothing of it runs out).
    Elsewhere,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Worker {
    pub pc: Pc,
    /// The take id of the current attempt.
    pub take: u8,
    /// The event's attempts as taken.
    pub attempts: u8,
    pub hint: Row,
    pub token: u8,
    pub stalled: bool,
    /// The lock of the event this worker attempts ran out meanwhile.
    pub lock_expired: bool,
    /// A fenced write of this attempt matched nothing.
    pub fenced: bool,
}

impl Worker {
    fn idle() -> Worker {
        Worker {
            pc: Pc::Idle,
            take: 0,
            attempts: 0,
            hint: Row {
                status: RowStatus::Queued,
                fence: 0,
            },
            token: 0,
            stalled: false,
            lock_expired: false,
            fenced: false,
        }
    }

    /// Attempting this model's event (not idle, not elsewhere).
    fn attempting(&self) -> bool {
        !matches!(self.pc, Pc::Idle | Pc::Elsewhere)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub event: Event,
    /// The undecodable event of another transaction (`None`: not there).
    pub poison: Option<Event>,
    pub takes: u8,
    pub row: Row,
    pub ledger: u8,
    pub lease: Option<(usize, u8)>,
    pub counter: u8,
    pub stalls: u8,
    pub replays: u8,
    pub aged: bool,
    /// The event was done at some point.
    pub was_done: bool,
    /// A worker that never stalled had its result refused by the settle.
    pub live_result_lost: bool,
    /// The event was rescued while no live worker was idle.
    pub rescued_while_busy: bool,
    pub workers: Vec<Worker>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Take,
    FastPath,
    Acquire,
    Claim,
    Call,
    CallFails,
    Finalize,
    Settle,
    Stall,
    /// An idle worker takes another payment's event: a slow call.
    SlowCall,
    /// The slow call ends; the worker is idle again.
    Finish,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Worker(usize, Op),
    LeaseExpires,
    /// The lock of the event (`false`) or of the undecodable one (`true`).
    LockExpires(bool),
    Rescue,
    Ages,
    Replay,
}

type QuietKey = (Event, Option<Event>, Row, u8, u8);

pub struct InboxModel {
    pub cfg: Config,
    quiet: Memo<QuietKey>,
}

impl InboxModel {
    pub fn new(cfg: Config) -> InboxModel {
        InboxModel {
            cfg,
            quiet: Memo::new(),
        }
    }

    fn worker_ops(&self, s: &State, w: usize, ops: &mut Vec<Op>) {
        let worker = &s.workers[w];
        match worker.pc {
            Pc::Idle => {
                let due = s.event.status == EvStatus::Queued
                    || s.poison.is_some_and(|p| p.status == EvStatus::Queued);
                if due {
                    ops.push(Op::Take);
                }
                if self.cfg.busy {
                    ops.push(Op::SlowCall);
                }
            }
            Pc::Elsewhere => ops.push(Op::Finish),
            Pc::FastPath => ops.push(Op::FastPath),
            Pc::Acquire => ops.push(Op::Acquire),
            Pc::Claim => ops.push(Op::Claim),
            Pc::Call => {
                ops.push(Op::Call);
                ops.push(Op::CallFails);
            }
            Pc::Finalize => ops.push(Op::Finalize),
            Pc::Settle(_) => ops.push(Op::Settle),
        }
        if worker.attempting() && !worker.stalled && s.stalls < self.cfg.stalls {
            ops.push(Op::Stall);
        }
    }

    /// Whether a take's lock on an event may run out now: only while no live
    /// worker attempts it (the heartbeat renews it), unless renewal is off.
    fn lock_may_expire(&self, s: &State, ev: &Event, poison: bool) -> bool {
        if ev.status != EvStatus::Processing || ev.expired {
            return false;
        }
        if self.cfg.variant == Variant::NoLockRenewal || poison {
            return true;
        }
        !s.workers
            .iter()
            .any(|w| w.attempting() && w.take == ev.lock && !w.stalled)
    }

    /// The processor's answer: release the lease, then what to settle.
    fn answer(&self, s: &mut State, w: usize, settle: Settle) -> Pc {
        if s.lease == Some((w, s.workers[w].token)) {
            s.lease = None;
        }
        Pc::Settle(settle)
    }

    /// `Settle::Requeue`, or `dead` once the event is too old.
    fn requeue(&self, s: &State) -> Settle {
        if s.event.old {
            Settle::Dead { spent: false }
        } else {
            Settle::Requeue
        }
    }

    fn step(&self, s: &mut State, w: usize, op: Op) {
        let next = match (s.workers[w].pc, op) {
            (_, Op::Stall) => {
                s.stalls += 1;
                s.workers[w].stalled = true;
                s.workers[w].pc
            }
            (Pc::Idle, Op::Take) => self.take(s, w),
            (Pc::Idle, Op::SlowCall) => Pc::Elsewhere,
            (Pc::Elsewhere, Op::Finish) => Pc::Idle,
            (Pc::FastPath, Op::FastPath) => {
                if s.workers[w].hint.status == RowStatus::Succeeded {
                    Pc::Settle(Settle::Done)
                } else {
                    Pc::Acquire
                }
            }
            (Pc::Acquire, Op::Acquire) => {
                if s.lease.is_some() {
                    Pc::Settle(self.requeue(s))
                } else {
                    s.counter += 1;
                    s.lease = Some((w, s.counter));
                    s.workers[w].token = s.counter;
                    Pc::Claim
                }
            }
            (Pc::Claim, Op::Claim) => {
                let token = s.workers[w].token;
                let open = matches!(
                    s.row.status,
                    RowStatus::Queued | RowStatus::Processing | RowStatus::Dead
                );
                if open && s.row.fence < token {
                    s.row = Row {
                        status: RowStatus::Processing,
                        fence: token,
                    };
                    Pc::Call
                } else if s.row.status == RowStatus::Succeeded {
                    self.answer(s, w, Settle::Done)
                } else {
                    s.workers[w].fenced = true;
                    let requeue = self.requeue(s);
                    self.answer(s, w, requeue)
                }
            }
            (Pc::Call, Op::Call) => Pc::Finalize,
            (Pc::Call, Op::CallFails) => {
                let spent = s.workers[w].attempts + 1 >= self.cfg.max_attempts;
                let settle = if spent || s.event.old {
                    Settle::Dead { spent: true }
                } else {
                    Settle::Retry
                };
                self.answer(s, w, settle)
            }
            (Pc::Finalize, Op::Finalize) => {
                let token = s.workers[w].token;
                if s.row.status == RowStatus::Processing && s.row.fence == token {
                    s.row.status = RowStatus::Succeeded;
                    s.ledger += 1;
                    self.answer(s, w, Settle::Done)
                } else {
                    s.workers[w].fenced = true;
                    let requeue = self.requeue(s);
                    self.answer(s, w, requeue)
                }
            }
            (Pc::Settle(settle), Op::Settle) => {
                self.settle(s, w, settle);
                s.workers[w] = Worker::idle();
                Pc::Idle
            }
            (pc, op) => unreachable!("{op:?} is not a step of a worker at {pc:?}"),
        };
        s.workers[w].pc = next;
    }

    /// `TAKE`: every due event, one lock for all of them.
    fn take(&self, s: &mut State, w: usize) -> Pc {
        s.takes += 1;
        let take = s.takes;
        let mut took_event = false;
        let lock = |ev: &mut Event| {
            ev.status = EvStatus::Processing;
            ev.lock = take;
            ev.expired = false;
        };
        if s.event.status == EvStatus::Queued {
            lock(&mut s.event);
            took_event = true;
        }
        let mut took_poison = false;
        if let Some(p) = s.poison.as_mut().filter(|p| p.status == EvStatus::Queued) {
            lock(p);
            took_poison = true;
        }
        if took_poison {
            if self.cfg.variant == Variant::UndecodableFailsTheTake {
                // The take answers an error: every event it locked waits
                // for its lock to run out.
                return Pc::Idle;
            }
            let p = s.poison.as_mut().expect("taken");
            p.status = EvStatus::Dead;
            p.lock = 0;
        }
        if !took_event {
            return Pc::Idle;
        }
        let worker = &mut s.workers[w];
        worker.take = take;
        worker.attempts = s.event.attempts;
        worker.hint = s.row;
        worker.stalled = false;
        worker.lock_expired = false;
        Pc::FastPath
    }

    /// The settle statements, conditioned on the take's lock.
    fn settle(&self, s: &mut State, w: usize, settle: Settle) {
        let worker = &s.workers[w];
        let ours = s.event.status == EvStatus::Processing && s.event.lock == worker.take;
        if !ours && self.cfg.variant != Variant::SettleIgnoresLock {
            if !worker.stalled {
                s.live_result_lost = true;
            }
            return;
        }
        let ev = &mut s.event;
        ev.lock = 0;
        ev.expired = false;
        match settle {
            Settle::Done => {
                ev.status = EvStatus::Done;
                s.was_done = true;
            }
            Settle::Retry => {
                ev.status = EvStatus::Queued;
                ev.attempts += 1;
            }
            Settle::Requeue => ev.status = EvStatus::Queued,
            Settle::Dead { spent } => {
                ev.status = EvStatus::Dead;
                ev.attempts += u8::from(spent);
                if matches!(s.row.status, RowStatus::Queued | RowStatus::Processing) {
                    s.row.status = RowStatus::Dead;
                }
            }
        }
    }

    /// `RESCUE`: processing events whose lock ran out are queued again.
    fn rescue(&self, s: &mut State) {
        let ignore = self.cfg.variant == Variant::RescueIgnoresLock;
        for ev in std::iter::once(&mut s.event).chain(s.poison.as_mut()) {
            if ev.status == EvStatus::Processing && (ev.expired || ignore) {
                ev.status = EvStatus::Queued;
                ev.lock = 0;
                ev.expired = false;
            }
        }
    }

    fn rescuable(&self, s: &State) -> bool {
        let ignore = self.cfg.variant == Variant::RescueIgnoresLock;
        std::iter::once(&s.event)
            .chain(s.poison.as_ref())
            .any(|ev| ev.status == EvStatus::Processing && (ev.expired || ignore))
    }

    /// Whether the rescue can run now: on its own timer always
    /// (`inbox::Inbox::rescue_on_schedule`); as a chore between takes only
    /// while some live worker is idle.
    fn rescuer_free(&self, s: &State) -> bool {
        self.cfg.variant != Variant::RescueBetweenTakes || some_worker_idle(s)
    }

    /// `fencehook replay`: dead events queued again, their dead rows too.
    fn replay(&self, s: &mut State) {
        let keep_age = self.cfg.variant == Variant::ReplayKeepsTheAge;
        for ev in std::iter::once(&mut s.event).chain(s.poison.as_mut()) {
            if ev.status == EvStatus::Dead {
                ev.status = EvStatus::Queued;
                ev.attempts = 0;
                ev.lock = 0;
                ev.aged_since_queued = false;
                if !keep_age {
                    ev.old = false;
                }
            }
        }
        if s.row.status == RowStatus::Dead {
            s.row.status = RowStatus::Queued;
        }
    }
}

impl Model for InboxModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            event: Event::queued(),
            poison: self.cfg.poison.then(Event::queued),
            takes: 0,
            row: Row {
                status: RowStatus::Queued,
                fence: 0,
            },
            ledger: 0,
            lease: None,
            counter: 0,
            stalls: 0,
            replays: 0,
            aged: false,
            was_done: false,
            live_result_lost: false,
            rescued_while_busy: false,
            workers: (0..self.cfg.workers).map(|_| Worker::idle()).collect(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let mut ops = Vec::new();
        for w in 0..s.workers.len() {
            ops.clear();
            self.worker_ops(s, w, &mut ops);
            let more = s.takes < self.cfg.takes;
            actions.extend(
                ops.iter()
                    .filter(|&&op| op != Op::Take || more)
                    .map(|&op| Action::Worker(w, op)),
            );
        }
        if s.lease.is_some_and(|(w, _)| s.workers[w].stalled) {
            actions.push(Action::LeaseExpires);
        }
        if self.lock_may_expire(s, &s.event, false) {
            actions.push(Action::LockExpires(false));
        }
        if s.poison.is_some_and(|p| self.lock_may_expire(s, &p, true)) {
            actions.push(Action::LockExpires(true));
        }
        if self.rescuable(s) && self.rescuer_free(s) {
            actions.push(Action::Rescue);
        }
        if !s.aged {
            actions.push(Action::Ages);
        }
        let dead = s.event.status == EvStatus::Dead
            || s.poison.is_some_and(|p| p.status == EvStatus::Dead);
        if s.replays < self.cfg.replays && dead {
            actions.push(Action::Replay);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Worker(w, op) => self.step(&mut s, w, op),
            Action::LeaseExpires => s.lease = None,
            Action::LockExpires(false) => {
                s.event.expired = true;
                let lock = s.event.lock;
                for w in &mut s.workers {
                    if w.attempting() && w.take == lock {
                        w.lock_expired = true;
                    }
                }
            }
            Action::LockExpires(true) => {
                s.poison.as_mut().expect("there").expired = true;
            }
            Action::Rescue => {
                if self.cfg.busy && !some_worker_idle(&s) {
                    s.rescued_while_busy = true;
                }
                self.rescue(&mut s);
            }
            Action::Ages => {
                s.aged = true;
                s.event.old = true;
                s.event.aged_since_queued = true;
            }
            Action::Replay => {
                s.replays += 1;
                self.replay(&mut s);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(BOOKED_AT_MOST_ONCE, |_, s: &State| s.ledger <= 1),
            Property::always(ROW_MATCHES_LEDGER, |_, s: &State| {
                props::entry_matches_status(s.row.status == RowStatus::Succeeded, s.ledger)
            }),
            Property::always(DONE_IS_FINAL, |_, s: &State| {
                !s.was_done || s.event.status == EvStatus::Done
            }),
            Property::always(DONE_ONLY_WHEN_BOOKED, |_, s: &State| {
                s.event.status != EvStatus::Done || s.row.status == RowStatus::Succeeded
            }),
            Property::always(DEAD_FOR_A_REASON, |m: &Self, s: &State| {
                s.event.status != EvStatus::Dead
                    || s.event.aged_since_queued
                    || s.event.attempts >= m.cfg.max_attempts
            }),
            Property::always(A_DEAD_ROW_HAS_A_DEAD_EVENT, |_, s: &State| {
                s.row.status != RowStatus::Dead || s.event.status == EvStatus::Dead
            }),
            Property::always(ONE_WORKER_PER_LOCK, |_, s: &State| {
                s.workers
                    .iter()
                    .all(|w| !w.attempting() || w.take == s.event.lock || w.lock_expired)
            }),
            Property::always(A_LIVE_WORKERS_RESULT_IS_RECORDED, |_, s: &State| {
                !s.live_result_lost
            }),
            Property::always(RESCUE_WAITS_FOR_NO_WORKER, |m: &Self, s: &State| {
                let stranded = s.event.status == EvStatus::Processing && s.event.expired;
                !stranded || m.rescuer_free(s)
            }),
            Property::always(ONE_MORE_QUIET_RUN_BOOKS_IT, one_more_quiet_run),
            Property::sometimes(SOMETIMES_BOOKED, |_, s: &State| {
                s.event.status == EvStatus::Done && s.ledger == 1
            }),
            Property::sometimes(SOMETIMES_RESCUED_AND_BOOKED, |_, s: &State| {
                s.stalls > 0 && s.takes >= 2 && s.event.status == EvStatus::Done
            }),
            Property::sometimes(SOMETIMES_REPLAYED_AND_BOOKED, |_, s: &State| {
                s.replays > 0 && s.event.status == EvStatus::Done
            }),
            Property::sometimes(SOMETIMES_A_STALE_WORKER_IS_FENCED, |_, s: &State| {
                s.workers.iter().any(|w| w.stalled && w.fenced)
            }),
            Property::sometimes(
                SOMETIMES_RESCUED_WHILE_EVERY_WORKER_IS_BUSY,
                |_, s: &State| s.rescued_while_busy && s.event.status == EvStatus::Done,
            ),
            Property::sometimes(SOMETIMES_DEAD_AFTER_ITS_ATTEMPTS, |m: &Self, s: &State| {
                s.event.status == EvStatus::Dead && s.event.attempts >= m.cfg.max_attempts
            }),
        ]
    }
}

pub const BOOKED_AT_MOST_ONCE: &str = "the event is booked at most once, however often replayed";
pub const ROW_MATCHES_LEDGER: &str = "a succeeded row has its credit, any other none";
pub const DONE_IS_FINAL: &str = "a done event stays done";
pub const DONE_ONLY_WHEN_BOOKED: &str = "an event is done only once its row is booked";
pub const DEAD_FOR_A_REASON: &str =
    "an event is dead only after its attempts, or too old since it was (re)queued";
pub const A_DEAD_ROW_HAS_A_DEAD_EVENT: &str = "a dead row's event is dead";
pub const ONE_WORKER_PER_LOCK: &str =
    "a worker attempts an event only while its take's lock holds, or after it ran out";
pub const A_LIVE_WORKERS_RESULT_IS_RECORDED: &str =
    "a worker that did not stall has its result recorded";
pub const RESCUE_WAITS_FOR_NO_WORKER: &str =
    "an event whose lock ran out can be rescued at once, whatever the live workers are doing";
pub const ONE_MORE_QUIET_RUN_BOOKS_IT: &str =
    "after a replay, one more quiet worker books the event exactly once";

pub const SOMETIMES_BOOKED: &str = "the event is booked and done";
pub const SOMETIMES_RESCUED_AND_BOOKED: &str = "a stalled worker's event is rescued and booked";
pub const SOMETIMES_REPLAYED_AND_BOOKED: &str = "a dead event is replayed and booked";
pub const SOMETIMES_A_STALE_WORKER_IS_FENCED: &str = "a stalled worker's write is fenced";
pub const SOMETIMES_DEAD_AFTER_ITS_ATTEMPTS: &str = "an event is dead after its attempts";
pub const SOMETIMES_RESCUED_WHILE_EVERY_WORKER_IS_BUSY: &str =
    "a dead worker's event is rescued while every live worker is in a call, and booked";

/// A worker that is alive and between takes.
fn some_worker_idle(s: &State) -> bool {
    s.workers.iter().any(|w| w.pc == Pc::Idle && !w.stalled)
}

pub const INVARIANTS: [&str; 10] = [
    BOOKED_AT_MOST_ONCE,
    ROW_MATCHES_LEDGER,
    DONE_IS_FINAL,
    DONE_ONLY_WHEN_BOOKED,
    DEAD_FOR_A_REASON,
    A_DEAD_ROW_HAS_A_DEAD_EVENT,
    ONE_WORKER_PER_LOCK,
    A_LIVE_WORKERS_RESULT_IS_RECORDED,
    RESCUE_WAITS_FOR_NO_WORKER,
    ONE_MORE_QUIET_RUN_BOOKS_IT,
];

/// Liveness as a state property: from this state every worker stops for
/// good (its lease and its locks run out), the operator replays what is
/// dead, and one worker runs alone with a downstream that does not fail,
/// rescuing and taking until nothing is due. The event must end `done`,
/// its row booked once.
fn one_more_quiet_run(model: &InboxModel, s: &State) -> bool {
    let key = (s.event, s.poison, s.row, s.ledger, s.counter);
    model.quiet.get_or(key, || {
        let mut run = State {
            lease: None,
            workers: vec![Worker::idle()],
            ..s.clone()
        };
        model.replay(&mut run);
        for _ in 0..4 {
            for ev in std::iter::once(&mut run.event).chain(run.poison.as_mut()) {
                if ev.status == EvStatus::Processing {
                    ev.expired = true;
                }
            }
            model.rescue(&mut run);
            props::run_alone(
                &mut run,
                8,
                |s, ops| model.worker_ops(s, 0, ops),
                |op| matches!(op, Op::CallFails | Op::Stall | Op::SlowCall),
                |s, op| model.step(s, 0, op),
            );
        }
        run.event.status == EvStatus::Done
            && run.row.status == RowStatus::Succeeded
            && run.ledger == 1
    })
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Worker(w, op) => write!(f, "w{w} {op:?}"),
            Action::LeaseExpires => f.write_str("the stalled worker's lease expires"),
            Action::LockExpires(false) => f.write_str("the event's lock runs out"),
            Action::LockExpires(true) => f.write_str("the undecodable event's lock runs out"),
            Action::Rescue => f.write_str("rescue"),
            Action::Ages => f.write_str("the event is older than the age limit"),
            Action::Replay => f.write_str("fencehook replay"),
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ev = |f: &mut fmt::Formatter<'_>, e: &Event| {
            write!(f, "{:?}", e.status)?;
            if e.lock != 0 {
                write!(f, "/L{}{}", e.lock, if e.expired { "x" } else { "" })?;
            }
            if e.attempts > 0 {
                write!(f, " a{}", e.attempts)?;
            }
            if e.old {
                f.write_str(" old")?;
            }
            Ok(())
        };
        f.write_str("event=")?;
        ev(f, &self.event)?;
        if let Some(p) = &self.poison {
            f.write_str(" undecodable=")?;
            ev(f, p)?;
        }
        write!(
            f,
            " row={:?}@{} ledger={}",
            self.row.status, self.row.fence, self.ledger
        )?;
        match self.lease {
            Some((w, t)) => write!(f, " lease=w{w}:t{t}")?,
            None => f.write_str(" lease=-")?,
        }
        for (i, w) in self.workers.iter().enumerate() {
            write!(f, " | w{i} {:?}", w.pc)?;
            if w.attempting() {
                write!(f, " L{} t{}", w.take, w.token)?;
            }
            if w.stalled {
                f.write_str(" (stalled)")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::{assert_safe, check, shortest_counterexample};

    fn with(variant: Variant) -> Config {
        Config {
            variant,
            ..Config::standard()
        }
    }

    #[test]
    fn an_inbox_event_is_booked_exactly_once_however_it_is_taken_rescued_or_replayed() {
        let checker = check("inbox, correct", InboxModel::new(Config::standard()));
        assert_safe(
            &checker,
            &INVARIANTS,
            &[
                SOMETIMES_BOOKED,
                SOMETIMES_RESCUED_AND_BOOKED,
                SOMETIMES_REPLAYED_AND_BOOKED,
                SOMETIMES_A_STALE_WORKER_IS_FENCED,
                SOMETIMES_DEAD_AFTER_ITS_ATTEMPTS,
            ],
        );
    }

    #[test]
    fn a_dead_workers_event_is_rescued_while_the_live_workers_are_in_slow_calls() {
        let checker = check(
            "inbox, rescue, busy workers",
            InboxModel::new(Config::rescue()),
        );
        assert_safe(
            &checker,
            &INVARIANTS,
            &[
                SOMETIMES_BOOKED,
                SOMETIMES_RESCUED_AND_BOOKED,
                SOMETIMES_RESCUED_WHILE_EVERY_WORKER_IS_BUSY,
                SOMETIMES_A_STALE_WORKER_IS_FENCED,
            ],
        );
    }

    #[test]
    fn a_rescue_run_between_a_workers_takes_is_caught_waiting_for_a_slow_call() {
        let cfg = Config {
            variant: Variant::RescueBetweenTakes,
            ..Config::rescue()
        };
        let last = shortest_counterexample(
            "inbox, rescue between takes",
            || InboxModel::new(cfg.clone()),
            RESCUE_WAITS_FOR_NO_WORKER,
        );
        assert!(last.workers.iter().any(|w| w.pc == Pc::Elsewhere));
    }

    #[test]
    fn a_settle_that_ignores_the_takes_lock_undoes_a_newer_attempts_done() {
        let cfg = with(Variant::SettleIgnoresLock);
        shortest_counterexample(
            "inbox, settle ignores the lock",
            || InboxModel::new(cfg.clone()),
            DONE_IS_FINAL,
        );
    }

    #[test]
    fn a_rescue_that_ignores_the_lock_hands_a_live_workers_event_to_another() {
        let cfg = with(Variant::RescueIgnoresLock);
        shortest_counterexample(
            "inbox, rescue ignores the lock",
            || InboxModel::new(cfg.clone()),
            ONE_WORKER_PER_LOCK,
        );
    }

    #[test]
    fn a_take_lock_not_renewed_with_the_heartbeat_loses_a_live_workers_result() {
        let cfg = with(Variant::NoLockRenewal);
        let last = shortest_counterexample(
            "inbox, no lock renewal",
            || InboxModel::new(cfg.clone()),
            A_LIVE_WORKERS_RESULT_IS_RECORDED,
        );
        assert_eq!(last.stalls, 0);
    }

    #[test]
    fn an_undecodable_row_that_fails_the_whole_take_holds_up_the_good_event_for_ever() {
        let cfg = with(Variant::UndecodableFailsTheTake);
        let last = shortest_counterexample(
            "inbox, an undecodable row fails the take",
            || InboxModel::new(cfg.clone()),
            ONE_MORE_QUIET_RUN_BOOKS_IT,
        );
        assert_eq!(last.ledger, 0);
    }

    #[test]
    fn a_replay_that_keeps_the_age_clock_sends_the_event_straight_back_to_dead() {
        let cfg = with(Variant::ReplayKeepsTheAge);
        let last = shortest_counterexample(
            "inbox, replay keeps the age",
            || InboxModel::new(cfg.clone()),
            DEAD_FOR_A_REASON,
        );
        assert!(last.replays > 0 && last.event.attempts < cfg.max_attempts);
    }
}
