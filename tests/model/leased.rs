//! The lease inside the write: the inline path of the PostgreSQL lease
//! backend, where one statement (`store::APPLY_LEASED`: the lease backend's
//! fragment, `take_inside!` in `lease/postgres.rs`, then the store's fenced
//! upsert) takes the lease, writes the payment and its entry, and gives the
//! lease back, and the lease is held by that transaction's row lock until
//! its commit.
//!
//! One payment, deliveries of `payment.succeeded` and `payment.failed` (a
//! failed payment can still succeed), a `leases` table that PostgreSQL
//! empties when it restarts (it is unlogged), and a delivery on an instance
//! that takes its lease the other way (Redis, or a downstream route) and
//! claims the row at a fence of its own counter.
//!
//! # What each model step stands for
//!
//! | Model step | Stands for |
//! | --- | --- |
//! | the holder's whole program | `processor::Processor::attempts` with the lease taken inside each write (`processor::Processor::write_inside`) |
//! | `ReadRow` | `processor::Processor::settled` on the row `process` (or the inbox take) read: `domain::decide` answers `duplicate` / `stale` without a write |
//! | `Write` | `store::Connection::apply_leased` → `store::APPLY_LEASED` up to its commit: `pg_try_advisory_xact_lock` (taken: `LeasedApply::Held`), the `leases` upsert (`take_inside!` in `lease/postgres.rs`: token = greatest(counter, fence floor) + 1, the row lock held to the commit), the fenced claim and the ledger insert from that token |
//! | `Blocked` | (broken variant only) the upsert queueing on another transaction's lock of the `leases` row |
//! | `Commit` | the statement's commit: the row, the entry and the raised counter become visible, both locks go |
//! | `Poll` / `GiveUp` | `processor::Processor::wait_for_holder` after `LeasedApply::Held`: re-read the row, or the in-flight deadline (`in_progress`) |
//! | `Reread` | `LeasedApply::NotWritten` → `store::reread`, then the round's decision in `processor::Processor::attempts`: a row that still wants this transition at `fence >= token` is a counter behind (a resync, once), else decide again; `MAX_ROUNDS` rounds at most |
//! | `Crash` | PostgreSQL restarts: transactions in flight roll back (their deliveries answer 503), the unlogged `leases` table comes back empty |
//! | `ForeignClaim` | a delivery on an instance with the Redis backend or a downstream route (`store::Connection::claim`): the row `processing` at a fence the `leases` table never issued |
//!
//! # Properties and broken variants
//!
//! Invariants: at most one credit; every write raises the fence; one writer
//! per token; the credit matches the status (`failed` has none); every 2xx
//! stands on a row that says at least as much; `processed` only after its
//! own commit; at most one delivery holds an uncommitted token; no copy
//! queues on another's lock; `lease_lost` only when another write came
//! after the delivery's first token; and, from every state, one more quiet
//! delivery books the payment exactly once.
//!
//! | Variant (a guard removed) | Caught by |
//! | --- | --- |
//! | no advisory try-lock | a copy queueing on the `leases` row lock, and nothing else: the books stay right |
//! | the lease in its own statement, given back before the write | two deliveries holding uncommitted tokens |
//! | the token ignores the fence floor | a claim left by another instance that one more delivery cannot take over |
//! | no resync round | `lease_lost` for a row the delivery could have booked |
//!
//! # What the model leaves out
//!
//! - The money move (`store::move_parent_money`), which runs before the
//!   statement in its transaction: see `lifecycle.rs` for the cap.
//! - A lease taken the other way on the *same* `leases` row (the PostgreSQL
//!   backend's `lease::postgres` acquire, `owner` set): the upsert's `WHERE`
//!   refuses it and the delivery answers as for the advisory lock.
//! - A hash collision of the advisory key with another payment's: one more
//!   `Held` round, which the model already has.
//! - The foreign claim never races a leased transaction in flight (it would
//!   queue on the payments row's lock, which the model does not split out).

use std::fmt;

use stateright::{Model, Property};

use crate::props::{self, Memo};
pub use crate::props::{
    ONE_MORE_DELIVERY_BOOKS_IT, ONE_WRITER_PER_TOKEN, PROCESSED_AFTER_COMMIT, SOMETIMES_BOOKED,
    SOMETIMES_RESYNC_THEN_COMMIT,
};

/// Rounds of write → re-read → decide under one delivery (the code's `MAX_ROUNDS`).
const MAX_ROUNDS: u8 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Correct,
    /// No `pg_try_advisory_xact_lock`: a copy queues on the `leases` row lock.
    NoAdvisoryLock,
    /// The lease taken by its own statement (committed, lock gone) before the write.
    LeaseOutsideTheWrite,
    /// The token is the counter + 1, ignoring the fence last read.
    NoFenceFloor,
    /// A row at `fence >= token` answers `lease_lost` at once instead of another round.
    NoResyncRound,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// The event of each delivery.
    pub events: Vec<Event>,
    /// Polls of one delivery that found the lease held before it answers `in_progress`.
    pub polls: u8,
    pub crashes: u8,
    pub foreign_claims: u8,
    pub variant: Variant,
}

impl Config {
    /// Two copies of the success, one failure, two restarts, one foreign claim.
    pub fn standard() -> Config {
        Config {
            events: vec![Event::Succeeded, Event::Succeeded, Event::Failed],
            polls: 2,
            crashes: 2,
            foreign_claims: 1,
            variant: Variant::Correct,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// `payment.succeeded`: a credit.
    Succeeded,
    /// `payment.failed`: no money.
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Processing,
    Succeeded,
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub status: Status,
    pub fence: u8,
}

/// `domain::decide` for a payment: the transition (`from` statuses, `to`), or the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Decision {
    Apply { from_settled: bool, to: Status },
    Duplicate,
    Stale,
}

fn decide(ev: Event, row: Option<Row>) -> Decision {
    let settled = row.map(|r| r.status).filter(|s| *s != Status::Processing);
    match (ev, settled) {
        (Event::Succeeded, None) => Decision::Apply {
            from_settled: false,
            to: Status::Succeeded,
        },
        (Event::Succeeded, Some(Status::Failed)) => Decision::Apply {
            from_settled: true,
            to: Status::Succeeded,
        },
        (Event::Succeeded, Some(_)) => Decision::Duplicate,
        (Event::Failed, None) => Decision::Apply {
            from_settled: false,
            to: Status::Failed,
        },
        (Event::Failed, Some(Status::Succeeded)) => Decision::Stale,
        (Event::Failed, Some(_)) => Decision::Duplicate,
    }
}

/// Whether the status is one the transition's conditioned write may find
/// (`domain::Transition::from_statuses`).
fn starts_from(d: Decision, status: Status) -> bool {
    match d {
        Decision::Apply {
            from_settled: false,
            ..
        } => status == Status::Processing,
        Decision::Apply {
            from_settled: true, ..
        } => status == Status::Failed,
        _ => false,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    Processed,
    Duplicate,
    Stale,
    InProgress,
    LeaseLost,
    /// 503: the database restarted under the statement.
    Error,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pc {
    ReadRow,
    Write,
    /// The upsert waits for another transaction's lock on the `leases` row.
    Blocked,
    /// The lease statement committed on its own; the write is still to come.
    Claim,
    Commit,
    /// `LeasedApply::Held`: poll the row or give up.
    Waiting,
    Reread,
    Done(Answer),
}

/// What the statement will make visible at its commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pending {
    pub row: Option<Row>,
    pub entry: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    pub event: Event,
    pub pc: Pc,
    /// The row as last read (`None`: no row).
    pub read: Option<Row>,
    pub decision: Option<DecisionKey>,
    pub token: u8,
    pub resynced: bool,
    pub rounds: u8,
    pub polls: u8,
    pub pending: Option<Pending>,
    /// Tokens under which a write of this holder took effect (bit per token).
    pub wrote: u32,
    /// Another delivery's write committed since this one took its first token.
    pub superseded: bool,
    pub committed: bool,
}

/// The transition a delivery is on, kept to compare rounds (the code's `t`).
pub type DecisionKey = (bool, Status);

impl Holder {
    fn new(event: Event) -> Holder {
        Holder {
            event,
            pc: Pc::ReadRow,
            read: None,
            decision: None,
            token: 0,
            resynced: false,
            rounds: 0,
            polls: 0,
            pending: None,
            wrote: 0,
            superseded: false,
            committed: false,
        }
    }

    pub fn answer(&self) -> Option<Answer> {
        match self.pc {
            Pc::Done(a) => Some(a),
            _ => None,
        }
    }

    /// Holds a token whose write has not committed.
    fn in_lease(&self) -> bool {
        matches!(self.pc, Pc::Commit | Pc::Claim)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The `leases` row's counter (`None`: no row, or emptied by a restart).
    pub lease: Option<u8>,
    /// The holder whose transaction has the advisory lock.
    pub advisory: Option<usize>,
    /// The holder whose transaction has the `leases` row locked.
    pub row_lock: Option<usize>,
    pub row: Option<Row>,
    /// Credit entries committed, and the inserts of committed writes.
    pub ledger: u8,
    pub ledger_writes: u8,
    pub crashes: u8,
    pub foreign_claims: u8,
    /// Some write took effect at a token not above the row's fence.
    pub stale_write: bool,
    pub holders: Vec<Holder>,
}

impl State {
    fn new(cfg: &Config) -> State {
        State {
            lease: None,
            advisory: None,
            row_lock: None,
            row: None,
            ledger: 0,
            ledger_writes: 0,
            crashes: 0,
            foreign_claims: 0,
            stale_write: false,
            holders: cfg.events.iter().map(|&e| Holder::new(e)).collect(),
        }
    }

    pub fn booked_once(&self) -> bool {
        matches!(self.row, Some(r) if r.status == Status::Succeeded)
            && self.ledger == 1
            && self.ledger_writes == 1
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    ReadRow,
    Write,
    Blocked,
    Claim,
    Commit,
    Poll,
    GiveUp,
    Reread,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Holder(usize, Op),
    Crash,
    ForeignClaim,
}

pub struct LeasedModel {
    pub cfg: Config,
    /// Answers of [`one_more_delivery_books_it`] by the parts of the state
    /// its quiet run reads.
    quiet: Memo<QuietKey>,
}

/// Row, leases counter, ledger entries, ledger writes.
type QuietKey = (Option<Row>, Option<u8>, u8, u8);

impl LeasedModel {
    pub fn new(cfg: Config) -> LeasedModel {
        LeasedModel {
            cfg,
            quiet: Memo::new(),
        }
    }

    /// Decides on the row as read: the next pc.
    fn decide_next(&self, s: &mut State, h: usize) -> Pc {
        let holder = &mut s.holders[h];
        match decide(holder.event, holder.read) {
            Decision::Apply { from_settled, to } => {
                holder.decision = Some((from_settled, to));
                Pc::Write
            }
            Decision::Duplicate => Pc::Done(Answer::Duplicate),
            Decision::Stale => Pc::Done(Answer::Stale),
        }
    }

    /// The `leases` upsert: the token, taken above the counter and the floor.
    fn take_token(&self, s: &mut State, h: usize) -> u8 {
        let floor = s.holders[h].read.map_or(0, |r| r.fence);
        let token = match (self.cfg.variant, s.lease) {
            (Variant::NoFenceFloor, l) => l.unwrap_or(0) + 1,
            (_, None) => floor + 1,
            (_, Some(l)) => l.max(floor) + 1,
        };
        let holder = &mut s.holders[h];
        if holder.token == 0 {
            holder.superseded = false;
        }
        holder.token = token;
        token
    }

    /// The fenced claim of `APPLY_LEASED` against the committed row.
    fn claim(&self, s: &State, h: usize) -> Pending {
        let holder = &s.holders[h];
        let (from_settled, to) = holder.decision.expect("decided before the write");
        let d = Decision::Apply { from_settled, to };
        let matches = match s.row {
            None => !from_settled,
            Some(r) => starts_from(d, r.status) && r.fence < holder.token,
        };
        if matches {
            Pending {
                row: Some(Row {
                    status: to,
                    fence: holder.token,
                }),
                entry: to == Status::Succeeded,
            }
        } else {
            Pending {
                row: None,
                entry: false,
            }
        }
    }

    /// Makes a write visible (the commit, or the variant's own statement).
    fn commit(&self, s: &mut State, h: usize, p: Pending) {
        let token = s.holders[h].token;
        if s.lease.is_none_or(|l| l < token) {
            s.lease = Some(token);
        }
        if let Some(row) = p.row {
            if s.row.is_some_and(|old| old.fence >= token) {
                s.stale_write = true;
            }
            s.row = Some(row);
            s.holders[h].wrote |= 1 << token;
            s.holders[h].committed = true;
            for (i, other) in s.holders.iter_mut().enumerate() {
                if i != h {
                    other.superseded = true;
                }
            }
        }
        if p.entry {
            s.ledger += 1;
            s.ledger_writes += 1;
        }
    }

    fn holder_ops(&self, s: &State, h: usize, ops: &mut Vec<Op>) {
        let holder = &s.holders[h];
        match holder.pc {
            Pc::ReadRow => ops.push(Op::ReadRow),
            Pc::Write => ops.push(Op::Write),
            Pc::Blocked if s.row_lock.is_none() => ops.push(Op::Blocked),
            Pc::Blocked => {}
            Pc::Claim => ops.push(Op::Claim),
            Pc::Commit => ops.push(Op::Commit),
            Pc::Waiting => {
                if holder.polls < self.cfg.polls {
                    ops.push(Op::Poll);
                }
                ops.push(Op::GiveUp);
            }
            Pc::Reread => ops.push(Op::Reread),
            Pc::Done(_) => {}
        }
    }

    fn step(&self, s: &mut State, h: usize, op: Op) {
        let next = match (s.holders[h].pc, op) {
            (Pc::ReadRow, Op::ReadRow) => {
                s.holders[h].read = s.row;
                self.decide_next(s, h)
            }
            (Pc::Write, Op::Write) => {
                let advisory = self.cfg.variant != Variant::NoAdvisoryLock;
                if advisory && s.advisory.is_some() {
                    Pc::Waiting
                } else if self.cfg.variant == Variant::LeaseOutsideTheWrite {
                    let token = self.take_token(s, h);
                    if s.lease.is_none_or(|l| l < token) {
                        s.lease = Some(token);
                    }
                    Pc::Claim
                } else {
                    if advisory {
                        s.advisory = Some(h);
                    }
                    if s.row_lock.is_some() {
                        Pc::Blocked
                    } else {
                        self.upsert(s, h)
                    }
                }
            }
            (Pc::Blocked, Op::Blocked) => self.upsert(s, h),
            (Pc::Claim, Op::Claim) => {
                let p = self.claim(s, h);
                self.commit(s, h, p);
                self.after_commit(s, h, p)
            }
            (Pc::Commit, Op::Commit) => {
                let p = s.holders[h].pending.take().expect("a pending write");
                self.commit(s, h, p);
                if s.advisory == Some(h) {
                    s.advisory = None;
                }
                s.row_lock = None;
                self.after_commit(s, h, p)
            }
            (Pc::Waiting, Op::Poll) => {
                s.holders[h].polls += 1;
                s.holders[h].read = s.row;
                self.decide_next(s, h)
            }
            (Pc::Waiting, Op::GiveUp) => Pc::Done(Answer::InProgress),
            (Pc::Reread, Op::Reread) => self.round(s, h),
            (pc, op) => unreachable!("{op:?} is not a step of a holder at {pc:?}"),
        };
        s.holders[h].pc = next;
    }

    /// The `leases` upsert and the claim, in the statement; visible at its commit.
    fn upsert(&self, s: &mut State, h: usize) -> Pc {
        s.row_lock = Some(h);
        self.take_token(s, h);
        let p = self.claim(s, h);
        s.holders[h].pending = Some(p);
        Pc::Commit
    }

    fn after_commit(&self, _s: &mut State, _h: usize, p: Pending) -> Pc {
        if p.row.is_some() {
            Pc::Done(Answer::Processed)
        } else {
            Pc::Reread
        }
    }

    /// After `NotWritten`: the re-read row and the round's decision.
    fn round(&self, s: &mut State, h: usize) -> Pc {
        let now = s.row.expect("a write that matched nothing found a row");
        let holder = &mut s.holders[h];
        let (from_settled, to) = holder.decision.expect("decided");
        let same = decide(holder.event, Some(now)) == Decision::Apply { from_settled, to };
        if same && now.fence >= holder.token {
            if holder.resynced || self.cfg.variant == Variant::NoResyncRound {
                return Pc::Done(Answer::LeaseLost);
            }
            holder.resynced = true;
        }
        holder.rounds += 1;
        if holder.rounds == MAX_ROUNDS {
            return Pc::Done(Answer::LeaseLost);
        }
        holder.read = Some(now);
        self.decide_next(s, h)
    }
}

impl Model for LeasedModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::new(&self.cfg)]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let mut ops = Vec::new();
        for h in 0..s.holders.len() {
            ops.clear();
            self.holder_ops(s, h, &mut ops);
            actions.extend(ops.iter().map(|&op| Action::Holder(h, op)));
        }
        if s.crashes < self.cfg.crashes && (s.lease.is_some() || s.row_lock.is_some()) {
            actions.push(Action::Crash);
        }
        let unsettled = s.row.is_none_or(|r| r.status == Status::Processing);
        let in_flight = s.holders.iter().any(|h| h.pc == Pc::Commit);
        if s.foreign_claims < self.cfg.foreign_claims && unsettled && !in_flight {
            actions.push(Action::ForeignClaim);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Holder(h, op) => self.step(&mut s, h, op),
            Action::Crash => {
                s.crashes += 1;
                s.lease = None;
                s.advisory = None;
                s.row_lock = None;
                for holder in &mut s.holders {
                    if matches!(holder.pc, Pc::Commit | Pc::Blocked) {
                        holder.pending = None;
                        holder.pc = Pc::Done(Answer::Error);
                    }
                }
            }
            Action::ForeignClaim => {
                s.foreign_claims += 1;
                let fence = s.row.map_or(0, |r| r.fence) + 2;
                s.row = Some(Row {
                    status: Status::Processing,
                    fence,
                });
                for holder in &mut s.holders {
                    holder.superseded = true;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONE_CREDIT, |_, s: &State| s.ledger_writes <= 1),
            Property::always(FENCE_RISES, |_, s: &State| !s.stale_write),
            Property::always(ONE_WRITER_PER_TOKEN, |_, s: &State| {
                props::one_writer_per_token(s.holders.iter().map(|h| h.wrote))
            }),
            Property::always(LEDGER_MATCHES_STATUS, |_, s: &State| {
                let succeeded = matches!(s.row, Some(r) if r.status == Status::Succeeded);
                props::entry_matches_status(succeeded, s.ledger)
            }),
            Property::always(TWO_XX_STANDS_ON_THE_ROW, |_, s: &State| {
                s.holders.iter().all(|h| {
                    let two_xx = matches!(
                        h.answer(),
                        Some(Answer::Processed | Answer::Duplicate | Answer::Stale)
                    );
                    let status = s.row.map(|r| r.status);
                    !two_xx
                        || status == Some(Status::Succeeded)
                        || (h.event == Event::Failed && status == Some(Status::Failed))
                })
            }),
            Property::always(PROCESSED_AFTER_COMMIT, |_, s: &State| {
                props::processed_only_after_commit(
                    s.holders
                        .iter()
                        .map(|h| (h.answer() == Some(Answer::Processed), h.committed)),
                )
            }),
            Property::always(EXCLUSIVE_LEASE, |_, s: &State| {
                s.holders.iter().filter(|h| h.in_lease()).count() <= 1
            }),
            Property::always(NO_COPY_QUEUES, |_, s: &State| {
                s.holders.iter().all(|h| h.pc != Pc::Blocked)
            }),
            Property::always(LOST_ONLY_TO_A_LATER_WRITE, |_, s: &State| {
                s.holders
                    .iter()
                    .all(|h| h.answer() != Some(Answer::LeaseLost) || h.superseded)
            }),
            Property::always(ONE_MORE_DELIVERY_BOOKS_IT, one_more_delivery_books_it),
            Property::sometimes(SOMETIMES_BOOKED, |_, s: &State| s.booked_once()),
            Property::sometimes(SOMETIMES_A_COPY_POLLS, |_, s: &State| {
                s.holders.iter().any(|h| h.polls > 0)
            }),
            Property::sometimes(SOMETIMES_RESYNC_THEN_COMMIT, |_, s: &State| {
                s.holders.iter().any(|h| h.resynced && h.committed)
            }),
            Property::sometimes(SOMETIMES_BOOKED_AFTER_A_CRASH, |_, s: &State| {
                s.crashes > 0 && s.booked_once()
            }),
            Property::sometimes(SOMETIMES_FAILED_THEN_BOOKED, |_, s: &State| {
                s.booked_once()
                    && s.holders
                        .iter()
                        .any(|h| h.event == Event::Failed && h.answer() == Some(Answer::Processed))
            }),
        ]
    }
}

pub const AT_MOST_ONE_CREDIT: &str = "at most one credit per payment";
pub const FENCE_RISES: &str = "every write takes the row's fence higher";
pub const LEDGER_MATCHES_STATUS: &str = "a succeeded payment has its credit, any other none";
pub const TWO_XX_STANDS_ON_THE_ROW: &str = "every 2xx stands on a row that says at least as much";
pub const EXCLUSIVE_LEASE: &str = "at most one delivery holds a token it has not committed";
pub const NO_COPY_QUEUES: &str = "no copy queues on another delivery's lock (it polls the row)";
pub const LOST_ONLY_TO_A_LATER_WRITE: &str =
    "`lease_lost` only when another write came after the delivery's first token";

pub const SOMETIMES_A_COPY_POLLS: &str = "a copy finds the lease held and polls";
pub const SOMETIMES_BOOKED_AFTER_A_CRASH: &str = "booked after the leases table was emptied";
pub const SOMETIMES_FAILED_THEN_BOOKED: &str = "a failure is recorded, then the success booked";

pub const INVARIANTS: [&str; 10] = [
    AT_MOST_ONE_CREDIT,
    FENCE_RISES,
    ONE_WRITER_PER_TOKEN,
    LEDGER_MATCHES_STATUS,
    TWO_XX_STANDS_ON_THE_ROW,
    PROCESSED_AFTER_COMMIT,
    EXCLUSIVE_LEASE,
    NO_COPY_QUEUES,
    LOST_ONLY_TO_A_LATER_WRITE,
    ONE_MORE_DELIVERY_BOOKS_IT,
];

/// From this state, every delivery in flight stops for good (its
/// transaction rolls back when its connection goes: locks and pending
/// write gone) and one more `payment.succeeded` runs alone with no faults.
/// It must end `processed` or `duplicate` with the payment booked once.
fn one_more_delivery_books_it(model: &LeasedModel, s: &State) -> bool {
    let key = (s.row, s.lease, s.ledger, s.ledger_writes);
    model.quiet.get_or(key, || {
        let mut run = State {
            advisory: None,
            row_lock: None,
            holders: vec![Holder::new(Event::Succeeded)],
            ..s.clone()
        };
        props::run_alone(
            &mut run,
            32,
            |s, ops| model.holder_ops(s, 0, ops),
            |op| op == Op::GiveUp,
            |s, op| model.step(s, 0, op),
        );
        let answered = matches!(
            run.holders[0].answer(),
            Some(Answer::Processed | Answer::Duplicate)
        );
        answered && run.booked_once()
    })
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Holder(h, op) => write!(f, "h{h} {op:?}"),
            Action::Crash => f.write_str("PostgreSQL restarts (leases emptied)"),
            Action::ForeignClaim => f.write_str("another instance claims the row"),
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lease {
            Some(t) => write!(f, "leases={t}")?,
            None => f.write_str("leases=-")?,
        }
        match self.row {
            Some(r) => write!(f, " row={:?}@{}", r.status, r.fence)?,
            None => f.write_str(" row=-")?,
        }
        write!(f, " ledger={}", self.ledger)?;
        for (i, h) in self.holders.iter().enumerate() {
            write!(f, " | h{i} {:?} {:?} t{}", h.event, h.pc, h.token)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::{assert_safe, check, shortest_counterexample, violated};

    fn with(variant: Variant) -> Config {
        Config {
            variant,
            ..Config::standard()
        }
    }

    #[test]
    fn the_lease_inside_the_write_never_books_twice_under_any_interleaving() {
        let checker = check(
            "lease inside the write, correct",
            LeasedModel::new(Config::standard()),
        );
        assert_safe(
            &checker,
            &INVARIANTS,
            &[
                SOMETIMES_BOOKED,
                SOMETIMES_A_COPY_POLLS,
                SOMETIMES_RESYNC_THEN_COMMIT,
                SOMETIMES_BOOKED_AFTER_A_CRASH,
                SOMETIMES_FAILED_THEN_BOOKED,
            ],
        );
    }

    #[test]
    fn without_the_advisory_lock_a_copy_queues_on_the_row_lock_but_books_nothing_twice() {
        let cfg = with(Variant::NoAdvisoryLock);
        shortest_counterexample(
            "leased, no advisory lock",
            || LeasedModel::new(cfg.clone()),
            NO_COPY_QUEUES,
        );
        let checker = check(
            "leased, no advisory lock, every violation",
            LeasedModel::new(cfg),
        );
        assert_eq!(violated(&checker, &INVARIANTS), [NO_COPY_QUEUES]);
    }

    #[test]
    fn a_lease_given_back_before_the_write_lets_two_deliveries_hold_it() {
        let cfg = with(Variant::LeaseOutsideTheWrite);
        let last = shortest_counterexample(
            "leased, lease outside the write",
            || LeasedModel::new(cfg.clone()),
            EXCLUSIVE_LEASE,
        );
        assert_eq!(last.holders.iter().filter(|h| h.pc == Pc::Claim).count(), 2);
    }

    #[test]
    fn a_token_that_ignores_the_fence_floor_strands_a_claim_left_by_another_instance() {
        let cfg = with(Variant::NoFenceFloor);
        let last = shortest_counterexample(
            "leased, no fence floor",
            || LeasedModel::new(cfg.clone()),
            ONE_MORE_DELIVERY_BOOKS_IT,
        );
        let row = last.row.expect("a claimed row");
        assert!(row.status == Status::Processing && row.fence > last.lease.unwrap_or(0) + 1);
    }

    #[test]
    fn without_the_resync_round_a_delivery_gives_up_on_a_row_it_could_book() {
        let cfg = with(Variant::NoResyncRound);
        shortest_counterexample(
            "leased, no resync round",
            || LeasedModel::new(cfg.clone()),
            LOST_ONLY_TO_A_LATER_WRITE,
        );
    }
}
