//! A payment's life on the downstream route: its events in any order, the
//! refunds and disputes that take its money back (the cap), their reversals,
//! and the downstream service that deduplicates on `Idempotency-Key`.
//!
//! Each event is one delivery that the PSP sends again after any answer but
//! a 2xx; events of one object are kept apart by that object's lease (a
//! mutex here: what the lease and the fence do under faults is the business
//! of `protocol.rs` and `leased.rs`). What this model explores is how the
//! events of *different* objects interleave around their payment's money,
//! and what the downstream makes of the keys it is sent.
//!
//! # What each model step stands for
//!
//! | Model step | Stands for |
//! | --- | --- |
//! | `ReadRow` | `processor::Processor::settled`: `domain::decide` on the row as read answers `duplicate`, `stale` or `awaiting_payment` without the lease |
//! | `Acquire` | `lease::Lease::acquire` (held: `in_progress`, as after the in-flight wait) |
//! | `Claim` | `processor::Processor::write_around` → `store::Connection::claim`: decide on the row as it is, check the payment, reserve a refund's amount under the cap (`store::MOVE_PARENT_MONEY`'s condition), row `processing` |
//! | `Call` / `CallFails` / `CallTimesOut` | `downstream::Downstream::call` with `Idempotency-Key` and the claimed event as the body; a failure gives the reservation back and answers 503 |
//! | `Finalize` | `store::Connection::finalize`: status, entry, and the money move of a dispute or a reversal, one transaction; a refund's reserved amount becomes booked |
//! | `Redeliver` | the PSP's retry after any answer but a 2xx |
//!
//! The inline route (no downstream: claim, money move and entry in one
//! transaction, `store::Connection::apply`) is this route with `Claim`,
//! `Call` and `Finalize` run as one step: a subset of its interleavings.
//!
//! # Properties and broken variants
//!
//! Invariants: at most one entry per object and effect; a row's entries
//! match its status (a payment's failure has none, a reversed refund or
//! dispute is `failed` with its entry and the reversal); refunds, net of
//! reversals, never take out more than the payment; the payment's money out
//! is what its children hold; a dispute against a succeeded payment is never
//! refused; a refund the refunds leave room for is never refused, whatever
//! the disputes took; a step the downstream executed is never refused afterwards; the
//! downstream executes each step at most once and every booked step once; a
//! success after a failure is booked at its own amount; and, from every
//! state, one more quiet round of every event settles each.
//!
//! | Variant | Caught by |
//! | --- | --- |
//! | one key per object, a downstream that refuses a reused key | a step (the success after the failure) that no retry gets through |
//! | one key per object, a downstream that replays its first answer | a step booked that the downstream never executed |
//! | the cap checked at the claim, taken at the finalize | a refund the downstream executed, then refused |
//! | no cap | refunds taking out more than the payment |
//! | disputes held to the cap | a chargeback refused |
//! | refunds capped by refunds and disputes together | a refund after its chargeback refused (booked in the other order) |
//! | a success at another amount taken only over a booked failure | a success refused while its failure's call failed |
//! | the row's first amount kept | a success booked at the failure's amount |
//!
//! A known limit, shown by its own test: a call that timed out *after* the
//! downstream executed it gives its reservation back like any failed call,
//! and another refund may take that cap before the PSP's retry, which is
//! then refused.
//!
//! # Variants that were the code
//!
//! Six broken variants are what the code did before; each is
//! kept so a return to it is caught:
//!
//! - the key `<provider>:<transaction_id>` for every step of an object
//!   (`Variant::KeyPerObject`); the code sends one `Idempotency-Key` per
//!   business step, `<provider>:<transaction_id>:<event_type>`
//!   (`downstream::Downstream::call`);
//! - the cap checked at the claim and the money moved only at the finalize
//!   (`Variant::CapTakenAtFinalize`); the code reserves the money at the
//!   claim (`payments.reserved`) and gives it back when the call is refused;
//! - disputes held to the cap (`Variant::DisputesCapped`); the code books
//!   them past the payment's amount and counts the over-returned payment;
//! - refunds capped by the refunds and the disputes together
//!   (`Variant::RefundsCappedWithDisputes`): a refund after its payment's
//!   chargeback was refused, one before it booked; the code caps refunds by
//!   the refunds alone;
//! - a payment's success at another amount taken only out of a booked
//!   failure (`Variant::MatchOnlyBookedFailure`): while the failure was
//!   queued, in flight or left `processing` by a failed call the success was
//!   `payload_mismatch` (and a failure at another amount always); the code
//!   takes a success at any amount until a success settles the payment, and
//!   a failure whatever its amount;
//! - a payment's success after its failure at another amount booked at the
//!   row's first amount (`Variant::FirstAmountKept`); the code re-fingerprints
//!   the row from the success (before, the fingerprint held the amount and
//!   that success was a `payload_mismatch` before it got that far).
//!
//! # What the model leaves out
//!
//! - Leases and fences under faults (`protocol.rs`, `leased.rs`): one
//!   delivery of an object at a time, and a delivery runs to its answer.
//! - Currencies and `not_a_payment`: answered before any money moves, by one
//!   comparison. Payload mismatches are modelled for a payment's events
//!   only (its failure and success may carry different amounts).
//! - Amounts are small integers; one event of each type per object.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use stateright::{Model, Property};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Correct,
    /// The downstream's key is `<provider>:<transaction_id>`: one per object.
    KeyPerObject,
    /// The refund cap is checked at the claim but taken only at the finalize
    /// (after the downstream call), which may then refuse.
    CapTakenAtFinalize,
    /// The claim checks nothing: refunds are booked whatever the payment gave.
    NoCap,
    /// Disputes are held to the cap like refunds.
    DisputesCapped,
    /// Refunds are capped by the refunds and the disputes together.
    RefundsCappedWithDisputes,
    /// A payment's event at another amount matches its row only as a
    /// success out of a *booked* failure: a success over a failure still
    /// `processing` (its call failed) is `payload_mismatch`, as is a failure
    /// at another amount.
    MatchOnlyBookedFailure,
    /// A success after a failure is sent and booked at the failure's amount
    /// (the row's first amount).
    FirstAmountKept,
}

/// What the downstream does with a key it has seen, sent another body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Downstream {
    /// Refuses it (422) and executes nothing.
    Refuses,
    /// Answers what it answered the first time (200) and executes nothing.
    Replays,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Payment,
    Refund,
    Dispute,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// `payment.succeeded`, `refund.succeeded`, `dispute.funds_withdrawn`.
    Forward,
    /// `payment.failed`, `refund.failed`, `dispute.funds_reinstated`.
    Backward,
}

/// One event the PSP reports: its object (0 is the payment), type, amount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ev {
    pub object: usize,
    pub ty: EventType,
    pub amount: u8,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// Object 0 is the payment; the others name it as their parent.
    pub kinds: Vec<Kind>,
    /// In the PSP's order (the order of the quiet round of the liveness check).
    pub events: Vec<Ev>,
    /// The payment already booked at this amount when the run starts.
    pub payment_booked: Option<u8>,
    /// Deliveries of one event at most (the first and the PSP's retries).
    pub deliveries: u8,
    pub downstream: Downstream,
    /// Whether a call may execute the step and still answer an error (a timeout).
    pub call_times_out: bool,
    pub variant: Variant,
}

impl Config {
    /// The cap: a payment of 2 booked; a refund of 1 and its reversal, a
    /// refund of 2, a dispute of 1 and its reinstatement.
    pub fn cap() -> Config {
        use EventType::*;
        Config {
            kinds: vec![Kind::Payment, Kind::Refund, Kind::Refund, Kind::Dispute],
            events: vec![
                ev(1, Forward, 1),
                ev(2, Forward, 2),
                ev(3, Forward, 1),
                ev(1, Backward, 1),
                ev(3, Backward, 1),
            ],
            payment_booked: Some(2),
            deliveries: 2,
            downstream: Downstream::Refuses,
            call_times_out: false,
            variant: Variant::Correct,
        }
    }

    /// The steps of one object: a payment that fails at 1 and succeeds at
    /// 2, a refund of 1 and its reversal.
    pub fn steps(downstream: Downstream) -> Config {
        use EventType::*;
        Config {
            kinds: vec![Kind::Payment, Kind::Refund],
            events: vec![
                ev(0, Backward, 1),
                ev(0, Forward, 2),
                ev(1, Forward, 1),
                ev(1, Backward, 1),
            ],
            payment_booked: None,
            deliveries: 3,
            downstream,
            call_times_out: false,
            variant: Variant::Correct,
        }
    }

    /// A dispute withdrawn and reinstated next to a refund of the whole payment.
    pub fn dispute() -> Config {
        use EventType::*;
        Config {
            kinds: vec![Kind::Payment, Kind::Refund, Kind::Dispute],
            events: vec![ev(1, Forward, 2), ev(2, Forward, 2), ev(2, Backward, 2)],
            payment_booked: Some(2),
            deliveries: 3,
            downstream: Downstream::Refuses,
            call_times_out: false,
            variant: Variant::Correct,
        }
    }
}

fn ev(object: usize, ty: EventType, amount: u8) -> Ev {
    Ev { object, ty, amount }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Processing,
    Succeeded,
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Row {
    pub status: Option<Status>,
    /// The payment's amount as booked (the settling event's).
    pub amount: u8,
    /// A child's amount counts in its payment's money out (reserved by a
    /// claim in flight, or booked and not reversed).
    pub out: bool,
    /// Entries written: the forward one (credit, debit, dispute) and the reversal.
    pub forward: u8,
    pub reversal: u8,
}

/// `domain::decide`, by object kind and event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Decision {
    /// To `to`, from a settled status (`true`) or from none / `processing`.
    Apply {
        to: Status,
        from_settled: bool,
    },
    Duplicate,
    Stale,
    Await,
}

fn decide(kind: Kind, ty: EventType, status: Option<Status>) -> Decision {
    use EventType::*;
    use Status::*;
    let settled = status.filter(|s| *s != Processing);
    let apply = |to, from_settled| Decision::Apply { to, from_settled };
    match (kind, ty, settled) {
        (_, Forward, None) => apply(Succeeded, false),
        (Kind::Payment, Forward, Some(Failed)) => apply(Succeeded, true),
        (_, Forward, Some(Succeeded)) => Decision::Duplicate,
        (_, Forward, Some(_)) => Decision::Stale,
        (Kind::Dispute, Backward, None) => Decision::Await,
        (_, Backward, None) => apply(Failed, false),
        (Kind::Payment, Backward, Some(Succeeded)) => Decision::Stale,
        (_, Backward, Some(Succeeded)) => apply(Failed, true),
        (_, Backward, Some(_)) => Decision::Duplicate,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    Processed,
    Duplicate,
    Stale,
    /// 409 `awaiting_payment`.
    Awaiting,
    /// 409 `in_progress`.
    InProgress,
    /// 422 `refund_rejected`.
    Rejected,
    /// 503: the downstream failed (or refused the key).
    Error,
    /// 422 `payload_mismatch`: another payload for the row's object.
    Mismatch,
}

impl Answer {
    fn is_2xx(self) -> bool {
        matches!(self, Answer::Processed | Answer::Duplicate | Answer::Stale)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pc {
    ReadRow,
    Acquire,
    Claim,
    /// Claimed (with a reservation, when `reserved`): call downstream.
    Call {
        reserved: bool,
    },
    Finalize {
        reserved: bool,
    },
    Done(Answer),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Delivery {
    pub pc: Pc,
    pub deliveries: u8,
    /// The transition this delivery claimed.
    pub decision: Option<(Status, bool)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub rows: Vec<Row>,
    /// The payment's money out (`amount_out_minor`): refunds and disputes, net.
    pub out_refunds: u8,
    pub out_disputes: u8,
    /// The holder of each object's lease (a delivery index).
    pub leases: Vec<Option<usize>>,
    /// The downstream: the first event sent under each key.
    pub keys: Vec<Option<usize>>,
    /// Times the downstream executed each event's step.
    pub executed: Vec<u8>,
    /// Each event's step was booked (its delivery answered `processed`).
    pub booked: Vec<bool>,
    /// An event the downstream executed was later answered `refund_rejected`.
    pub refused_after_execution: bool,
    /// A refund the payment's refunds left room for was answered
    /// `refund_rejected` (refused for a dispute's money).
    pub refund_refused_within_the_refunds: bool,
    /// A payment's success was answered `payload_mismatch` while no success
    /// had settled the payment, or a failure was answered it at all.
    pub payment_event_mismatched: bool,
    pub deliveries: Vec<Delivery>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    ReadRow,
    Acquire,
    Claim,
    Call,
    CallFails,
    CallTimesOut,
    Finalize,
    Redeliver,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Action(pub usize, pub Op);

type QuietKey = (Vec<Row>, u8, u8, Vec<Option<usize>>, Vec<u8>, Vec<bool>);

pub struct LifecycleModel {
    pub cfg: Config,
    quiet: Mutex<HashMap<QuietKey, bool>>,
}

impl LifecycleModel {
    pub fn new(cfg: Config) -> LifecycleModel {
        LifecycleModel {
            cfg,
            quiet: Mutex::new(HashMap::new()),
        }
    }

    fn kind(&self, e: usize) -> Kind {
        self.cfg.kinds[self.cfg.events[e].object]
    }

    fn key(&self, e: usize) -> usize {
        match self.cfg.variant {
            Variant::KeyPerObject => self.cfg.events[e].object,
            _ => e,
        }
    }

    /// The amount the downstream is sent and the entry books.
    fn amount(&self, s: &State, e: usize) -> u8 {
        let ev = self.cfg.events[e];
        let row = s.rows[ev.object];
        if self.cfg.variant == Variant::FirstAmountKept && row.status.is_some() {
            row.amount
        } else {
            ev.amount
        }
    }

    fn ops(&self, s: &State, e: usize, ops: &mut Vec<Op>) {
        let d = &s.deliveries[e];
        match d.pc {
            Pc::ReadRow => ops.push(Op::ReadRow),
            Pc::Acquire => ops.push(Op::Acquire),
            Pc::Claim => ops.push(Op::Claim),
            Pc::Call { .. } => {
                ops.push(Op::Call);
                ops.push(Op::CallFails);
                if self.cfg.call_times_out {
                    ops.push(Op::CallTimesOut);
                }
            }
            Pc::Finalize { .. } => ops.push(Op::Finalize),
            Pc::Done(a) if !a.is_2xx() && d.deliveries < self.cfg.deliveries => {
                ops.push(Op::Redeliver)
            }
            Pc::Done(_) => {}
        }
    }

    /// An answer without a write, releasing the lease if held.
    fn answer(&self, s: &mut State, e: usize, a: Answer) -> Pc {
        let object = self.cfg.events[e].object;
        if s.leases[object] == Some(e) {
            s.leases[object] = None;
        }
        if a == Answer::Rejected && s.executed[e] > 0 {
            s.refused_after_execution = true;
        }
        let ev = self.cfg.events[e];
        if a == Answer::Rejected
            && self.kind(e) == Kind::Refund
            && ev.ty == EventType::Forward
            && s.rows[0].status == Some(Status::Succeeded)
            && s.out_refunds + ev.amount <= s.rows[0].amount
        {
            s.refund_refused_within_the_refunds = true;
        }
        Pc::Done(a)
    }

    fn answer_for(&self, d: Decision) -> Answer {
        match d {
            Decision::Duplicate | Decision::Apply { .. } => Answer::Duplicate,
            Decision::Stale => Answer::Stale,
            Decision::Await => Answer::Awaiting,
        }
    }

    /// Whether the payment can give `amount` more to a refund (or a capped
    /// dispute): refunds are capped by the refunds alone
    /// (`store::MOVE_PARENT_MONEY`'s condition); a capped dispute, or a
    /// refund of the variant that counts them, by refunds and disputes.
    fn within_cap(&self, s: &State, amount: u8, kind: Kind) -> bool {
        let disputes =
            if kind == Kind::Dispute || self.cfg.variant == Variant::RefundsCappedWithDisputes {
                s.out_disputes
            } else {
                0
            };
        s.out_refunds + disputes + amount <= s.rows[0].amount
    }

    /// The claim's check of the payment; `Err` with the refusal.
    fn check_parent(&self, s: &State, e: usize, reserved: bool) -> Result<(), Answer> {
        match s.rows[0].status {
            Some(Status::Succeeded) => Ok(()),
            Some(Status::Failed) => Err(Answer::Rejected),
            _ => Err(Answer::Awaiting),
        }
        .and_then(|()| {
            let capped = match self.kind(e) {
                Kind::Refund => self.cfg.variant != Variant::NoCap,
                Kind::Dispute => self.cfg.variant == Variant::DisputesCapped,
                Kind::Payment => false,
            };
            if capped && !reserved && !self.within_cap(s, self.cfg.events[e].amount, self.kind(e)) {
                Err(Answer::Rejected)
            } else {
                Ok(())
            }
        })
    }

    /// Whether event `e` is about its row's object (`processor::is_the_same_object`,
    /// `fenced_upsert!`, the inbox accept): the same amount, or a payment's
    /// event the amount cannot make another object
    /// (`domain::payment_event_matches`): a success while no success has
    /// settled the payment, a failure whatever the row's status. The model's
    /// refunds and disputes come with one amount each.
    fn same_object(&self, s: &State, e: usize) -> bool {
        let ev = self.cfg.events[e];
        let row = s.rows[ev.object];
        if row.status.is_none() || row.amount == ev.amount || self.kind(e) != Kind::Payment {
            return true;
        }
        match (ev.ty, self.cfg.variant) {
            (EventType::Forward, Variant::MatchOnlyBookedFailure) => {
                row.status == Some(Status::Failed)
            }
            (EventType::Forward, _) => row.status != Some(Status::Succeeded),
            (EventType::Backward, Variant::MatchOnlyBookedFailure) => false,
            (EventType::Backward, _) => true,
        }
    }

    /// `payload_mismatch`, recorded when the rule says the payment should
    /// have taken the event.
    fn mismatch(&self, s: &mut State, e: usize) -> Pc {
        let ev = self.cfg.events[e];
        let unsettled = s.rows[ev.object].status != Some(Status::Succeeded);
        if ev.ty == EventType::Backward || unsettled {
            s.payment_event_mismatched = true;
        }
        self.answer(s, e, Answer::Mismatch)
    }

    fn step(&self, s: &mut State, e: usize, op: Op) {
        let ev = self.cfg.events[e];
        let kind = self.kind(e);
        let next = match (s.deliveries[e].pc, op) {
            (Pc::ReadRow, Op::ReadRow) if !self.same_object(s, e) => self.mismatch(s, e),
            (Pc::ReadRow, Op::ReadRow) => {
                match decide(kind, ev.ty, s.rows[ev.object].status) {
                    Decision::Apply { .. } => Pc::Acquire,
                    // A claim in progress may be the very event awaited: ask under the lease.
                    Decision::Await if s.rows[ev.object].status.is_some() => Pc::Acquire,
                    d => self.answer(s, e, self.answer_for(d)),
                }
            }
            (Pc::Acquire, Op::Acquire) => {
                if s.leases[ev.object].is_some() {
                    Pc::Done(Answer::InProgress)
                } else {
                    s.leases[ev.object] = Some(e);
                    Pc::Claim
                }
            }
            (Pc::Claim, Op::Claim) => self.claim(s, e),
            (Pc::Call { reserved }, Op::Call) => {
                let key = self.key(e);
                match s.keys[key] {
                    None => {
                        s.keys[key] = Some(e);
                        s.executed[e] += 1;
                        Pc::Finalize { reserved }
                    }
                    Some(first) if first == e => Pc::Finalize { reserved },
                    Some(_) => match self.cfg.downstream {
                        Downstream::Replays => Pc::Finalize { reserved },
                        Downstream::Refuses => self.call_failed(s, e, reserved),
                    },
                }
            }
            (Pc::Call { reserved }, Op::CallFails) => self.call_failed(s, e, reserved),
            (Pc::Call { reserved }, Op::CallTimesOut) => {
                let key = self.key(e);
                if s.keys[key].is_none() {
                    s.keys[key] = Some(e);
                    s.executed[e] += 1;
                }
                self.call_failed(s, e, reserved)
            }
            (Pc::Finalize { reserved }, Op::Finalize) => self.finalize(s, e, reserved),
            (Pc::Done(_), Op::Redeliver) => {
                s.deliveries[e].deliveries += 1;
                Pc::ReadRow
            }
            (pc, op) => unreachable!("{op:?} is not a step of a delivery at {pc:?}"),
        };
        s.deliveries[e].pc = next;
    }

    /// `store::Connection::claim` under the lease.
    fn claim(&self, s: &mut State, e: usize) -> Pc {
        let ev = self.cfg.events[e];
        let row = s.rows[ev.object];
        if !self.same_object(s, e) {
            return self.mismatch(s, e);
        }
        let (to, from_settled) = match decide(self.kind(e), ev.ty, row.status) {
            Decision::Apply { to, from_settled } => (to, from_settled),
            d => return self.answer(s, e, self.answer_for(d)),
        };
        let takes = ev.ty == EventType::Forward && self.kind(e) != Kind::Payment;
        let mut reserved = false;
        if takes {
            // A claim left by a delivery that stopped keeps its reservation.
            if let Err(refusal) = self.check_parent(s, e, row.out) {
                return self.answer(s, e, refusal);
            }
            let reserves = self.kind(e) == Kind::Refund
                && !row.out
                && !matches!(
                    self.cfg.variant,
                    Variant::CapTakenAtFinalize | Variant::NoCap
                );
            if reserves {
                s.out_refunds += ev.amount;
                s.rows[ev.object].out = true;
                reserved = true;
            }
        }
        if row.status.is_none() {
            // A new row holds its first delivery's fields.
            s.rows[ev.object].status = Some(Status::Processing);
            s.rows[ev.object].amount = ev.amount;
        }
        s.deliveries[e].decision = Some((to, from_settled));
        Pc::Call { reserved }
    }

    /// A failed call gives back the reservation its claim took.
    fn call_failed(&self, s: &mut State, e: usize, reserved: bool) -> Pc {
        let ev = self.cfg.events[e];
        if reserved {
            s.out_refunds -= ev.amount;
            s.rows[ev.object].out = false;
        }
        self.answer(s, e, Answer::Error)
    }

    /// `store::Connection::finalize`: the transition, its entry and its money.
    fn finalize(&self, s: &mut State, e: usize, _reserved: bool) -> Pc {
        let ev = self.cfg.events[e];
        let kind = self.kind(e);
        let (to, _) = s.deliveries[e].decision.expect("claimed");
        let amount = self.amount(s, e);
        let row = s.rows[ev.object];
        match (kind, ev.ty) {
            (Kind::Payment, EventType::Forward) => {
                s.rows[0].amount = amount;
                s.rows[0].forward += 1;
            }
            (Kind::Payment, EventType::Backward) => s.rows[0].amount = amount,
            (Kind::Refund, EventType::Forward) => {
                if !row.out {
                    // Nothing reserved at the claim (a broken variant): take it now.
                    if self.cfg.variant == Variant::CapTakenAtFinalize
                        && !self.within_cap(s, ev.amount, Kind::Refund)
                    {
                        return self.answer(s, e, Answer::Rejected);
                    }
                    s.out_refunds += ev.amount;
                    s.rows[ev.object].out = true;
                }
                s.rows[ev.object].forward += 1;
            }
            (Kind::Dispute, EventType::Forward) => {
                s.out_disputes += ev.amount;
                s.rows[ev.object].out = true;
                s.rows[ev.object].forward += 1;
            }
            (_, EventType::Backward) => {
                if row.out {
                    match kind {
                        Kind::Refund => s.out_refunds -= ev.amount,
                        _ => s.out_disputes -= ev.amount,
                    }
                    s.rows[ev.object].out = false;
                }
                if row.status == Some(Status::Succeeded) {
                    s.rows[ev.object].reversal += 1;
                }
            }
        }
        s.rows[ev.object].status = Some(to);
        s.booked[e] = true;
        self.answer(s, e, Answer::Processed)
    }

    fn quiet_key(s: &State) -> QuietKey {
        (
            s.rows.clone(),
            s.out_refunds,
            s.out_disputes,
            s.keys.clone(),
            s.executed.clone(),
            s.booked.clone(),
        )
    }
}

impl Model for LifecycleModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut rows = vec![Row::default(); self.cfg.kinds.len()];
        if let Some(amount) = self.cfg.payment_booked {
            rows[0] = Row {
                status: Some(Status::Succeeded),
                amount,
                out: false,
                forward: 1,
                reversal: 0,
            };
        }
        let n = self.cfg.events.len();
        vec![State {
            rows,
            out_refunds: 0,
            out_disputes: 0,
            leases: vec![None; self.cfg.kinds.len()],
            keys: vec![None; n],
            executed: vec![0; n],
            booked: vec![false; n],
            refused_after_execution: false,
            refund_refused_within_the_refunds: false,
            payment_event_mismatched: false,
            deliveries: (0..n)
                .map(|_| Delivery {
                    pc: Pc::ReadRow,
                    deliveries: 1,
                    decision: None,
                })
                .collect(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let mut ops = Vec::new();
        for e in 0..s.deliveries.len() {
            ops.clear();
            self.ops(s, e, &mut ops);
            actions.extend(ops.iter().map(|&op| Action(e, op)));
        }
    }

    fn next_state(&self, last: &State, Action(e, op): Action) -> Option<State> {
        let mut s = last.clone();
        self.step(&mut s, e, op);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(EACH_EFFECT_AT_MOST_ONCE, |_, s: &State| {
                s.rows.iter().all(|r| r.forward <= 1 && r.reversal <= 1)
            }),
            Property::always(ENTRIES_MATCH_STATUS, |m: &Self, s: &State| {
                s.rows.iter().zip(&m.cfg.kinds).all(|(r, &kind)| {
                    let entries = (r.forward, r.reversal);
                    match (r.status, kind) {
                        (Some(Status::Succeeded), _) => entries == (1, 0),
                        // A payment's failure moves no money.
                        (Some(Status::Failed), Kind::Payment) => entries == (0, 0),
                        // A reversed refund or dispute: its entry and the reversal.
                        (Some(Status::Failed), _) => entries == (0, 0) || entries == (1, 1),
                        (_, _) => entries == (0, 0),
                    }
                })
            }),
            Property::always(REFUNDS_WITHIN_THE_PAYMENT, |_, s: &State| {
                s.out_refunds <= s.rows[0].amount
            }),
            Property::always(MONEY_OUT_ADDS_UP, |m: &Self, s: &State| {
                let held = |k: Kind| -> u8 {
                    m.cfg
                        .events
                        .iter()
                        .filter(|ev| {
                            ev.ty == EventType::Forward
                                && m.cfg.kinds[ev.object] == k
                                && s.rows[ev.object].out
                        })
                        .map(|ev| ev.amount)
                        .sum()
                };
                s.out_refunds == held(Kind::Refund) && s.out_disputes == held(Kind::Dispute)
            }),
            Property::always(DISPUTES_ALWAYS_BOOKED, |m: &Self, s: &State| {
                let paid = s.rows[0].status == Some(Status::Succeeded);
                !paid
                    || s.deliveries.iter().zip(&m.cfg.events).all(|(d, ev)| {
                        m.cfg.kinds[ev.object] != Kind::Dispute
                            || d.pc != Pc::Done(Answer::Rejected)
                    })
            }),
            Property::always(EXECUTED_NEVER_REFUSED, |_, s: &State| {
                !s.refused_after_execution
            }),
            Property::always(REFUNDS_CAPPED_BY_REFUNDS_ALONE, |_, s: &State| {
                !s.refund_refused_within_the_refunds
            }),
            Property::always(A_PAYMENT_EVENT_MATCHES_UNTIL_A_SUCCESS, |_, s: &State| {
                !s.payment_event_mismatched
            }),
            Property::always(BOOKED_ONLY_WHAT_RAN, |_, s: &State| {
                s.executed.iter().all(|&n| n <= 1)
                    && s.booked
                        .iter()
                        .zip(&s.executed)
                        .all(|(&b, &n)| !b || n == 1)
            }),
            Property::always(CREDIT_IS_THE_SUCCESS_AMOUNT, |m: &Self, s: &State| {
                let success = m
                    .cfg
                    .events
                    .iter()
                    .find(|ev| ev.object == 0 && ev.ty == EventType::Forward);
                match (s.rows[0].status, success) {
                    (Some(Status::Succeeded), Some(ev)) if m.cfg.payment_booked.is_none() => {
                        s.rows[0].amount == ev.amount
                    }
                    _ => true,
                }
            }),
            Property::always(ONE_MORE_ROUND_SETTLES_EVERY_EVENT, one_more_round),
            Property::sometimes(SOMETIMES_A_REFUND_IS_REFUSED, |_, s: &State| {
                s.deliveries
                    .iter()
                    .any(|d| d.pc == Pc::Done(Answer::Rejected))
            }),
            Property::sometimes(SOMETIMES_OVER_RETURNED_BY_A_DISPUTE, |_, s: &State| {
                s.out_refunds + s.out_disputes > s.rows[0].amount
            }),
            Property::sometimes(SOMETIMES_A_REVERSAL_IS_BOOKED, |_, s: &State| {
                s.rows.iter().any(|r| r.reversal == 1)
            }),
            Property::sometimes(SOMETIMES_EVERY_EVENT_BOOKED, |_, s: &State| {
                s.booked.iter().all(|&b| b)
            }),
            Property::sometimes(
                SOMETIMES_A_RESERVATION_IS_GIVEN_BACK,
                |m: &Self, s: &State| {
                    s.rows.iter().zip(&m.cfg.kinds).any(|(r, &k)| {
                        k == Kind::Refund && r.status == Some(Status::Processing) && !r.out
                    })
                },
            ),
        ]
    }
}

pub const EACH_EFFECT_AT_MOST_ONCE: &str = "at most one entry per object and effect";
pub const ENTRIES_MATCH_STATUS: &str =
    "a row's entries match its status (a reversed refund or dispute is failed with two)";
pub const REFUNDS_WITHIN_THE_PAYMENT: &str =
    "refunds never take out more than the payment (net of reversals)";
pub const MONEY_OUT_ADDS_UP: &str =
    "the payment's money out is what its children hold (booked or reserved)";
pub const DISPUTES_ALWAYS_BOOKED: &str =
    "a dispute against a succeeded payment is never refused (the PSP took the money)";
pub const EXECUTED_NEVER_REFUSED: &str =
    "a step the downstream executed is never answered refund_rejected";
pub const REFUNDS_CAPPED_BY_REFUNDS_ALONE: &str =
    "a refund the payment's refunds leave room for is never refused (whatever the disputes took)";
pub const A_PAYMENT_EVENT_MATCHES_UNTIL_A_SUCCESS: &str =
    "a payment no success settled takes a success at any amount, and a failure answers by status";
pub const BOOKED_ONLY_WHAT_RAN: &str =
    "the downstream executes each step at most once, and every booked step once";
pub const CREDIT_IS_THE_SUCCESS_AMOUNT: &str =
    "a payment that failed, then succeeded, is booked at the success's amount";
pub const ONE_MORE_ROUND_SETTLES_EVERY_EVENT: &str =
    "one more fault-free round of every event settles each (2xx or a refusal)";

pub const SOMETIMES_A_REFUND_IS_REFUSED: &str = "a refund is refused at the cap";
pub const SOMETIMES_OVER_RETURNED_BY_A_DISPUTE: &str =
    "a dispute takes the payment past its amount (a warning, not a refusal)";
pub const SOMETIMES_A_REVERSAL_IS_BOOKED: &str =
    "a reversal is booked: its row failed with two entries (what the old invariant forbade)";
pub const SOMETIMES_EVERY_EVENT_BOOKED: &str = "every event is booked";
pub const SOMETIMES_A_RESERVATION_IS_GIVEN_BACK: &str = "a failed call gives its reservation back";

pub const INVARIANTS: [&str; 11] = [
    EACH_EFFECT_AT_MOST_ONCE,
    ENTRIES_MATCH_STATUS,
    REFUNDS_WITHIN_THE_PAYMENT,
    MONEY_OUT_ADDS_UP,
    DISPUTES_ALWAYS_BOOKED,
    EXECUTED_NEVER_REFUSED,
    REFUNDS_CAPPED_BY_REFUNDS_ALONE,
    A_PAYMENT_EVENT_MATCHES_UNTIL_A_SUCCESS,
    BOOKED_ONLY_WHAT_RAN,
    CREDIT_IS_THE_SUCCESS_AMOUNT,
    ONE_MORE_ROUND_SETTLES_EVERY_EVENT,
];

/// Liveness as a state property: from this state, every delivery in flight
/// stops for good (its lease is let go; its claim and reservation stay, as
/// a dead holder leaves them) and the PSP delivers every event once more,
/// one at a time in its order, with a downstream that does not fail. Each
/// must then be settled: answered a 2xx, or refused for good
/// (`refund_rejected`); none may be left answering 503 or 409.
fn one_more_round(model: &LifecycleModel, s: &State) -> bool {
    let key = LifecycleModel::quiet_key(s);
    if let Some(&known) = model.quiet.lock().unwrap().get(&key) {
        return known;
    }
    let mut run = s.clone();
    run.leases.iter_mut().for_each(|l| *l = None);
    let mut settled = true;
    for e in 0..run.deliveries.len() {
        run.deliveries[e] = Delivery {
            pc: Pc::ReadRow,
            deliveries: 1,
            decision: None,
        };
        let mut ops = Vec::new();
        for _ in 0..8 {
            ops.clear();
            model.ops(&run, e, &mut ops);
            match ops
                .iter()
                .copied()
                .find(|op| !matches!(op, Op::CallFails | Op::CallTimesOut | Op::Redeliver))
            {
                Some(op) => model.step(&mut run, e, op),
                None => break,
            }
        }
        settled &= matches!(
            run.deliveries[e].pc,
            Pc::Done(a) if a.is_2xx() || a == Answer::Rejected
        );
    }
    model.quiet.lock().unwrap().insert(key, settled);
    settled
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{} {:?}", self.0, self.1)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "out={}+{}", self.out_refunds, self.out_disputes)?;
        for (i, r) in self.rows.iter().enumerate() {
            write!(f, " o{i}=")?;
            match r.status {
                Some(st) => write!(f, "{st:?}")?,
                None => f.write_str("-")?,
            }
            if i == 0 {
                write!(f, "/{}", r.amount)?;
            }
            if r.out {
                f.write_str("*")?;
            }
            if r.forward + r.reversal > 0 {
                write!(f, "[{}{}]", r.forward, r.reversal)?;
            }
        }
        for (i, d) in self.deliveries.iter().enumerate() {
            write!(f, " | e{i} {:?}", d.pc)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::{assert_safe, check, shortest_counterexample};

    fn with(cfg: Config, variant: Variant) -> Config {
        Config { variant, ..cfg }
    }

    #[test]
    fn refunds_never_take_out_more_than_the_payment_and_disputes_are_always_booked() {
        let checker = check("lifecycle, cap", LifecycleModel::new(Config::cap()));
        assert_safe(
            &checker,
            &INVARIANTS,
            &[
                SOMETIMES_A_REFUND_IS_REFUSED,
                SOMETIMES_OVER_RETURNED_BY_A_DISPUTE,
                SOMETIMES_A_REVERSAL_IS_BOOKED,
                SOMETIMES_A_RESERVATION_IS_GIVEN_BACK,
            ],
        );
    }

    #[test]
    fn a_withdrawn_then_reinstated_dispute_gives_its_money_back_once() {
        let checker = check("lifecycle, dispute", LifecycleModel::new(Config::dispute()));
        assert_safe(
            &checker,
            &INVARIANTS,
            &[
                SOMETIMES_OVER_RETURNED_BY_A_DISPUTE,
                SOMETIMES_A_REVERSAL_IS_BOOKED,
                SOMETIMES_EVERY_EVENT_BOOKED,
            ],
        );
    }

    #[test]
    fn one_key_per_step_gets_every_step_to_a_downstream_that_refuses_a_reused_key() {
        let checker = check(
            "lifecycle, steps, downstream refuses",
            LifecycleModel::new(Config::steps(Downstream::Refuses)),
        );
        assert_safe(
            &checker,
            &INVARIANTS,
            &[SOMETIMES_EVERY_EVENT_BOOKED, SOMETIMES_A_REVERSAL_IS_BOOKED],
        );
    }

    #[test]
    fn one_key_per_step_gets_every_step_to_a_downstream_that_replays_a_reused_key() {
        let checker = check(
            "lifecycle, steps, downstream replays",
            LifecycleModel::new(Config::steps(Downstream::Replays)),
        );
        assert_safe(&checker, &INVARIANTS, &[SOMETIMES_EVERY_EVENT_BOOKED]);
    }

    #[test]
    fn one_key_per_object_loses_a_step_at_a_downstream_that_refuses_a_reused_key() {
        let cfg = with(Config::steps(Downstream::Refuses), Variant::KeyPerObject);
        // Caught in the very first state: the PSP's own order (the failure,
        // then the success at another amount) sends the payment's key twice
        // with two bodies, and the success is refused however often it comes.
        let last = shortest_counterexample(
            "lifecycle, key per object, downstream refuses",
            || LifecycleModel::new(cfg.clone()),
            ONE_MORE_ROUND_SETTLES_EVERY_EVENT,
        );
        assert_eq!(last.rows[0].status, None);
    }

    #[test]
    fn one_key_per_object_books_a_step_a_replaying_downstream_never_ran() {
        let cfg = with(Config::steps(Downstream::Replays), Variant::KeyPerObject);
        let last = shortest_counterexample(
            "lifecycle, key per object, downstream replays",
            || LifecycleModel::new(cfg.clone()),
            BOOKED_ONLY_WHAT_RAN,
        );
        assert!(last
            .booked
            .iter()
            .zip(&last.executed)
            .any(|(&b, &n)| b && n == 0));
    }

    #[test]
    fn a_cap_taken_only_at_the_finalize_refuses_a_refund_the_downstream_executed() {
        let cfg = with(Config::cap(), Variant::CapTakenAtFinalize);
        shortest_counterexample(
            "lifecycle, cap taken at the finalize",
            || LifecycleModel::new(cfg.clone()),
            EXECUTED_NEVER_REFUSED,
        );
    }

    #[test]
    fn without_the_cap_refunds_take_out_more_than_the_payment() {
        let cfg = with(Config::cap(), Variant::NoCap);
        let last = shortest_counterexample(
            "lifecycle, no cap",
            || LifecycleModel::new(cfg.clone()),
            REFUNDS_WITHIN_THE_PAYMENT,
        );
        assert!(last.out_refunds > last.rows[0].amount);
    }

    #[test]
    fn a_dispute_held_to_the_cap_is_caught_refusing_a_chargeback_the_psp_already_took() {
        let cfg = with(Config::cap(), Variant::DisputesCapped);
        shortest_counterexample(
            "lifecycle, disputes capped",
            || LifecycleModel::new(cfg.clone()),
            DISPUTES_ALWAYS_BOOKED,
        );
    }

    #[test]
    fn refunds_capped_with_the_disputes_refuse_a_refund_after_its_chargeback() {
        let cfg = with(Config::dispute(), Variant::RefundsCappedWithDisputes);
        let last = shortest_counterexample(
            "lifecycle, refunds capped with the disputes",
            || LifecycleModel::new(cfg.clone()),
            REFUNDS_CAPPED_BY_REFUNDS_ALONE,
        );
        assert!(last.out_disputes > 0, "the dispute came first");
    }

    #[test]
    fn a_success_refused_while_its_failure_is_not_booked_is_caught() {
        let cfg = with(
            Config::steps(Downstream::Refuses),
            Variant::MatchOnlyBookedFailure,
        );
        let last = shortest_counterexample(
            "lifecycle, only a booked failure matches",
            || LifecycleModel::new(cfg.clone()),
            A_PAYMENT_EVENT_MATCHES_UNTIL_A_SUCCESS,
        );
        assert_ne!(last.rows[0].status, Some(Status::Succeeded));
    }

    #[test]
    fn a_success_booked_at_the_failures_amount_is_caught() {
        let cfg = with(Config::steps(Downstream::Refuses), Variant::FirstAmountKept);
        let last = shortest_counterexample(
            "lifecycle, first amount kept",
            || LifecycleModel::new(cfg.clone()),
            CREDIT_IS_THE_SUCCESS_AMOUNT,
        );
        assert_eq!(last.rows[0].amount, 1);
    }

    #[test]
    fn a_refund_whose_call_timed_out_after_executing_can_be_refused_when_it_comes_back() {
        // A known limit of giving the reservation back on any failed call:
        // a call that timed out may have executed, and the cap it gave back
        // can go to another refund before the PSP retries this one.
        let cfg = Config {
            call_times_out: true,
            ..Config::cap()
        };
        shortest_counterexample(
            "lifecycle, a call times out after executing",
            || LifecycleModel::new(cfg.clone()),
            EXECUTED_NEVER_REFUSED,
        );
    }
}
