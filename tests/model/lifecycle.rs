//! A payment's life on the downstream route: its events in any order, the
//! refunds and disputes that take its money back (the cap), the money their
//! claims reserve, their reversals, and the downstream service that
//! deduplicates on `Idempotency-Key`; in inbox mode, the accept first.
//!
//! Each event is one delivery that the PSP sends again after any answer but
//! a 2xx; events of one object are kept apart by that object's lease (a
//! mutex here: what the lease and the fence do under faults is the business
//! of `protocol.rs` and `leased.rs`), except a delivery the PSP stopped
//! waiting for in its downstream call: its lease runs out, the PSP delivers
//! again, and the first run goes on beside the new one (a stale run, fenced
//! by its token). What this model explores is how the events of *different*
//! objects interleave around their payment's money, and what the downstream
//! makes of the keys it is sent.
//!
//! # What each model step stands for
//!
//! | Model step | Stands for |
//! | --- | --- |
//! | `Accept` | (inbox mode) `inbox::Inbox::accept`: the fingerprint checked against the payment's row (`domain::payment_event_matches`), a new row `queued` |
//! | `ReadRow` | `processor::Processor::settled`: `domain::decide` on the row as read answers `duplicate`, `stale` or `awaiting_payment` without the lease |
//! | `Acquire` | `lease::Lease::acquire` (held: `in_progress`, as after the in-flight wait) |
//! | `Claim` | `processor::Processor::write_around` → `store::Connection::claim`: decide on the row as it is, check the payment, reserve a refund's or dispute's amount (a refund's under the cap, `store::MOVE_PARENT_MONEY`'s condition) unless the row holds a reservation already (a claim taken over keeps it), the row's fence set to the token |
//! | `Call` | `downstream::Downstream::call` with `Idempotency-Key` and the claimed event as the body |
//! | `CallFails` | the downstream answers non-2xx (`DownstreamError::Status`: it did not execute this call): `processor::Processor::call_and_finalize` gives back what the claim reserved (`store::Connection::release`, `WHERE fence = token AND reserved`) and answers 503 |
//! | `CallTimesOut` | a timeout or a cut connection: the call may have executed, the reservation stays for the next delivery to finish; 503 |
//! | `Finalize` | `store::Connection::finalize`: status, entry, and the money move of a reversal, one transaction; a reserved amount becomes the entry's; a refund's failure that is its first settlement gives back what a timed-out claim reserved |
//! | `Redeliver` | the PSP's retry after any answer but a 2xx (in inbox mode, the worker's retry or the operator's replay) |
//! | `Bury` | (inbox mode) the worker's attempts spent: `store::Store::settle` with `DEAD`, an unsettled row `dead` |
//! | `Abandon` | the lease runs out during a slow call and the PSP, tired of waiting, delivers again: the run goes on, stale |
//! | `StaleCall` / `StaleCallFails` / `StaleFinalize` | the stale run's call and its finalize, each fenced by its token: its give-back and its finalize change nothing once a newer claim took the row |
//!
//! The inline route (no downstream: claim, money move and entry in one
//! transaction, `store::Connection::apply`) is this route with `Claim`,
//! `Call` and `Finalize` run as one step: a subset of its interleavings.
//!
//! # Properties and broken variants
//!
//! Invariants: at most one entry per object and effect; a row's entries
//! match its status (a payment's failure has none, a reversed refund or
//! dispute is `failed` with its entry and the reversal); a booked refund or
//! dispute holds its amount in the payment's money out; refunds, net of
//! reversals, never take out more than the payment; the payment's money out
//! is what its children hold; a dispute against a succeeded payment is never
//! refused; a refund the refunds still held (booked, or reserved by a claim
//! not settled) leave room for is never refused, whatever the disputes
//! took; a step the downstream executed is never refused afterwards; the
//! downstream executes each step at most once and every booked step once; a
//! payment no success settled takes a success at any amount (its failure
//! accepted, in flight or dead alike) and a failure whatever its amount; a
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
//! | a success at another amount taken only over a booked failure | a success refused while its failure's call failed; in inbox mode, while the failure is queued |
//! | the row's first amount kept | a success booked at the failure's amount |
//! | a timed-out call gives its reservation back | a refund the downstream executed, refused when it comes back (another refund took the cap) |
//! | a refund's failure keeps a timed-out claim's reservation | another refund refused though the refunds held leave room (refund capacity lost) |
//! | a refused call gives back a reservation its claim took over | a refund the downstream executed (the timed-out first call), refused when it comes back |
//! | the give-back without `fence = token` | a stale run gives back the reservation of the newer claim, which is then booked holding no money |
//!
//! # Variants that were the code
//!
//! Seven broken variants are what the code did before; each is
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
//!   queued, in flight, dead or left `processing` by a failed call the
//!   success was `payload_mismatch` (in inbox mode not even stored), and a
//!   failure at another amount always; the code takes a success at any
//!   amount until a success settles the payment, and a failure whatever its
//!   amount;
//! - a payment's success after its failure at another amount booked at the
//!   row's first amount (`Variant::FirstAmountKept`); the code re-fingerprints
//!   the row from the success (before, the fingerprint held the amount and
//!   that success was a `payload_mismatch` before it got that far);
//! - a call that timed out giving its reservation back like a refused one
//!   (`Variant::TimeoutGivesBack`); the code gives back only on a non-2xx
//!   answer, and a refund's failure that settles the row first gives back
//!   what the timed-out claim reserved.
//!
//! # A guard the model found
//!
//! `Variant::GiveBackInherited` is what the code did until the model found
//! it: a retry's claim keeps the reservation of a claim whose call timed
//! out, and when the retry's call was refused (a 409 for the first call
//! still running at the downstream, a 503) `store::Connection::release`
//! gave that reservation back, for its `WHERE fence = token AND reserved`
//! matches the retry's token. The first call may have executed; another
//! refund took the cap, and the PSP's next retry was refused though the
//! downstream executed it. The code now gives back only what the refused
//! call's own claim reserved (`store::Reserved`, its `here`; the model's
//! `Pc::Call { reserved }`), tested by
//! `money::with_a_downstream_a_refused_retry_keeps_the_reservation_a_timed_out_call_left`.
//!
//! # What the model leaves out
//!
//! - Leases and fences under faults (`protocol.rs`, `leased.rs`): one
//!   delivery of an object at a time but for the stale run of a delivery
//!   the PSP gave up on, and a delivery runs to its answer.
//! - A downstream that executes a call and still answers non-2xx (a proxy's
//!   502 after the service did the work): the give-back trusts a non-2xx.
//! - Currencies and `not_a_payment`: answered before any money moves, by one
//!   comparison. Payload mismatches are modelled for a payment's events
//!   only (its failure and success may carry different amounts).
//! - Amounts are small integers; one event of each type per object (the
//!   inbox configuration has two declines of the payment).
//! - Inbox mode here is the accept and the row's statuses; the take, the
//!   rescue and the settle are `inbox.rs`'s.

use std::fmt;

use stateright::{Model, Property};

use crate::props::{self, Memo};

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
    /// A call that timed out gives its reservation back, like one the
    /// downstream refused.
    TimeoutGivesBack,
    /// A refund's failure, first to settle a claim whose call timed out,
    /// leaves that claim's reservation where it is.
    FailureKeepsReservation,
    /// A refused call gives back the row's reservation even when its claim
    /// took it over from an earlier claim whose call timed out.
    GiveBackInherited,
    /// A refused call's give-back drops `fence = token`: a stale run gives
    /// back the reservation a newer claim took over.
    UnfencedGiveBack,
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
    /// Inbox mode: each delivery is first accepted (its fingerprint checked
    /// against the row, a new row `queued`), then worked; a worker whose
    /// attempts are spent leaves the row `dead` (a later delivery is then the
    /// operator's replay).
    pub inbox: bool,
    /// Whether the PSP may stop waiting for a delivery in its downstream
    /// call (its lease run out) and deliver again beside it.
    pub stale_calls: bool,
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
            inbox: false,
            stale_calls: false,
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
            inbox: false,
            stale_calls: false,
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
            inbox: false,
            stale_calls: false,
            variant: Variant::Correct,
        }
    }

    /// Reservations: a payment of 2 booked, a refund of 1 that may time out
    /// and then fail, a refund of 2 that fits only once the first is given
    /// back.
    pub fn reservations() -> Config {
        use EventType::*;
        Config {
            kinds: vec![Kind::Payment, Kind::Refund, Kind::Refund],
            events: vec![ev(1, Forward, 1), ev(2, Forward, 2), ev(1, Backward, 1)],
            payment_booked: Some(2),
            deliveries: 3,
            downstream: Downstream::Refuses,
            call_times_out: true,
            inbox: false,
            stale_calls: false,
            variant: Variant::Correct,
        }
    }

    /// Stale runs: a payment of 2 booked, a refund of 1 whose delivery the
    /// PSP may give up on in its call (the run goes on, stale, beside the
    /// next delivery), a refund of 2 that fits only once the first is
    /// given back.
    pub fn stale() -> Config {
        use EventType::*;
        Config {
            kinds: vec![Kind::Payment, Kind::Refund, Kind::Refund],
            events: vec![ev(1, Forward, 1), ev(2, Forward, 2)],
            payment_booked: Some(2),
            deliveries: 2,
            downstream: Downstream::Refuses,
            call_times_out: true,
            inbox: false,
            stale_calls: true,
            variant: Variant::Correct,
        }
    }

    /// Inbox mode: a payment declined at 1, declined again at 3, then
    /// captured at 2, each accepted first, each failure left unsettled as
    /// long as its worker's calls fail (its row `queued`, `processing`,
    /// `dead`).
    pub fn inbox() -> Config {
        use EventType::*;
        Config {
            kinds: vec![Kind::Payment],
            events: vec![ev(0, Backward, 1), ev(0, Backward, 3), ev(0, Forward, 2)],
            payment_booked: None,
            deliveries: 2,
            downstream: Downstream::Refuses,
            call_times_out: false,
            inbox: true,
            stale_calls: false,
            variant: Variant::Correct,
        }
    }
}

fn ev(object: usize, ty: EventType, amount: u8) -> Ev {
    Ev { object, ty, amount }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// Inbox mode: accepted, not yet worked.
    Queued,
    Processing,
    /// Inbox mode: its worker's attempts spent.
    Dead,
    Succeeded,
    Failed,
}

impl Status {
    /// Settled by a step (`succeeded`, `failed`), not merely held by a
    /// claim or the inbox.
    fn settled(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed)
    }
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
    /// The fence: the token of the last claim.
    pub fence: u8,
}

impl Row {
    /// `payments.reserved`: money held by a claim whose step is not settled
    /// (the finalize clears it, booked or not).
    fn reserved(&self) -> bool {
        self.out && !self.status.is_some_and(Status::settled)
    }
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
    let settled = status.filter(|s| s.settled());
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
    /// Inbox mode: the accept.
    Accept,
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
    /// The token of its claim (the row's fence it wrote).
    pub token: u8,
    /// An earlier delivery of this event still running after the PSP gave
    /// up waiting for it (its lease ran out).
    pub stale: Option<Stale>,
}

/// Where a stale run is: its downstream call, or its finalize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    Call { reserved: bool },
    Finalize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stale {
    pub stage: Stage,
    pub token: u8,
    pub decision: (Status, bool),
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
    /// A refund's failure gave back what a timed-out claim had reserved.
    pub failure_gave_back: bool,
    /// A stale run's refused call found its reservation taken over by a
    /// newer claim, and left it.
    pub stale_give_back_fenced: bool,
    /// A payment's success at another amount was taken over its failure
    /// still unsettled: a bit per row status it found (`Status as u8`).
    pub repriced_over: u8,
    pub deliveries: Vec<Delivery>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Accept,
    ReadRow,
    Acquire,
    Claim,
    Call,
    CallFails,
    CallTimesOut,
    Finalize,
    Redeliver,
    /// Inbox mode: the worker's attempts are spent, the event is dead.
    Bury,
    /// The PSP gives up waiting for a delivery in its call; it delivers again.
    Abandon,
    /// The stale run's call: executed, or refused.
    StaleCall,
    StaleCallFails,
    StaleFinalize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Action(pub usize, pub Op);

type QuietKey = (Vec<Row>, u8, u8, Vec<Option<usize>>, Vec<u8>, Vec<bool>);

pub struct LifecycleModel {
    pub cfg: Config,
    quiet: Memo<QuietKey>,
}

impl LifecycleModel {
    pub fn new(cfg: Config) -> LifecycleModel {
        LifecycleModel {
            cfg,
            quiet: Memo::new(),
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
            Pc::Accept => ops.push(Op::Accept),
            Pc::ReadRow => ops.push(Op::ReadRow),
            Pc::Acquire => ops.push(Op::Acquire),
            Pc::Claim => ops.push(Op::Claim),
            Pc::Call { .. } => {
                ops.push(Op::Call);
                ops.push(Op::CallFails);
                if self.cfg.call_times_out {
                    ops.push(Op::CallTimesOut);
                }
                if self.may_abandon(d) {
                    ops.push(Op::Abandon);
                }
            }
            Pc::Finalize { .. } => ops.push(Op::Finalize),
            Pc::Done(a) if !a.is_2xx() => {
                if d.deliveries < self.cfg.deliveries {
                    ops.push(Op::Redeliver);
                }
                let row = s.rows[self.cfg.events[e].object].status;
                let unsettled = matches!(row, Some(Status::Queued | Status::Processing));
                if self.cfg.inbox && a == Answer::Error && unsettled {
                    ops.push(Op::Bury);
                }
            }
            Pc::Done(_) => {}
        }
        match d.stale.map(|st| st.stage) {
            Some(Stage::Call { .. }) => {
                ops.push(Op::StaleCall);
                ops.push(Op::StaleCallFails);
            }
            Some(Stage::Finalize) => ops.push(Op::StaleFinalize),
            None => {}
        }
    }

    /// Whether the PSP may give up on this delivery in its call and send
    /// the event again (one stale run at a time).
    fn may_abandon(&self, d: &Delivery) -> bool {
        self.cfg.stale_calls && d.stale.is_none() && d.deliveries < self.cfg.deliveries
    }

    /// Where a delivery starts: the accept in inbox mode, else the row.
    fn first_pc(&self) -> Pc {
        if self.cfg.inbox {
            Pc::Accept
        } else {
            Pc::ReadRow
        }
    }

    /// The money the payment's refunds hold that can still become an
    /// entry: booked and not reversed, or reserved by a claim not settled.
    /// What a refund is capped by (a reservation left on a failed refund is
    /// capacity lost).
    fn refunds_held(&self, s: &State) -> u8 {
        self.cfg
            .events
            .iter()
            .filter(|ev| ev.ty == EventType::Forward && self.cfg.kinds[ev.object] == Kind::Refund)
            .filter(|ev| {
                let row = s.rows[ev.object];
                row.out && row.status != Some(Status::Failed)
            })
            .map(|ev| ev.amount)
            .sum()
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
            && self.refunds_held(s) + ev.amount <= s.rows[0].amount
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

    /// Records a payment's success at another amount than its row's,
    /// taken while the failure that wrote the row is unsettled.
    fn note_repriced(&self, s: &mut State, e: usize) {
        if !self.cfg.inbox {
            // Only the inbox configuration asks (a history kept elsewhere
            // would only multiply the states).
            return;
        }
        let ev = self.cfg.events[e];
        let row = s.rows[ev.object];
        if let Some(status) = row.status {
            let payment_success = self.kind(e) == Kind::Payment && ev.ty == EventType::Forward;
            if payment_success && row.amount != ev.amount && !status.settled() {
                // An inbox claim leaves a `queued` row `queued`: in flight
                // is a claim of the row whose call or finalize is to come.
                let in_flight = s.deliveries.iter().zip(&self.cfg.events).any(|(d, other)| {
                    other.object == ev.object
                        && matches!(d.pc, Pc::Call { .. } | Pc::Finalize { .. })
                });
                let status = if in_flight {
                    Status::Processing
                } else {
                    status
                };
                s.repriced_over |= 1 << status as u8;
            }
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
            (Pc::Accept, Op::Accept) if !self.same_object(s, e) => self.mismatch(s, e),
            (Pc::Accept, Op::Accept) => {
                self.note_repriced(s, e);
                let row = &mut s.rows[ev.object];
                if row.status.is_none() {
                    // The accept's row holds the first accepted event's fields.
                    row.status = Some(Status::Queued);
                    row.amount = ev.amount;
                }
                Pc::ReadRow
            }
            (Pc::ReadRow, Op::ReadRow) if !self.same_object(s, e) => self.mismatch(s, e),
            (Pc::ReadRow, Op::ReadRow) => {
                self.note_repriced(s, e);
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
            (Pc::Call { reserved }, Op::Abandon) => self.abandon(s, e, Stage::Call { reserved }),
            (pc, Op::StaleCall | Op::StaleCallFails | Op::StaleFinalize) => {
                self.stale_step(s, e, op);
                pc
            }
            (Pc::Call { reserved }, Op::CallTimesOut) => {
                let key = self.key(e);
                if s.keys[key].is_none() {
                    s.keys[key] = Some(e);
                    s.executed[e] += 1;
                }
                if self.cfg.variant == Variant::TimeoutGivesBack && reserved {
                    self.give_back(s, e);
                }
                self.answer(s, e, Answer::Error)
            }
            (Pc::Finalize { reserved }, Op::Finalize) => self.finalize(s, e, reserved),
            (Pc::Done(_), Op::Redeliver) => {
                s.deliveries[e].deliveries += 1;
                self.first_pc()
            }
            (Pc::Done(a), Op::Bury) => {
                s.rows[ev.object].status = Some(Status::Dead);
                Pc::Done(a)
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
            if let Err(refusal) = self.check_parent(s, e, row.reserved()) {
                return self.answer(s, e, refusal);
            }
            // The broken variants that take a refund's cap late reserve nothing.
            let late = self.kind(e) == Kind::Refund
                && matches!(
                    self.cfg.variant,
                    Variant::CapTakenAtFinalize | Variant::NoCap
                );
            if !row.reserved() && !late {
                self.take_out(s, e);
                reserved = true;
            }
        }
        if row.status.is_none() {
            // A new row holds its first delivery's fields.
            s.rows[ev.object].status = Some(Status::Processing);
            s.rows[ev.object].amount = ev.amount;
        }
        if self.cfg.stale_calls {
            // Without stale runs the lease alone keeps claims apart: no
            // fence to tell states apart by.
            s.rows[ev.object].fence += 1;
            s.deliveries[e].token = s.rows[ev.object].fence;
        }
        s.deliveries[e].decision = Some((to, from_settled));
        Pc::Call { reserved }
    }

    /// A call the downstream refused (non-2xx: it did not execute this
    /// call) gives back the reservation its claim took; one its claim took
    /// over from a call that timed out stays (that call may have executed).
    fn call_failed(&self, s: &mut State, e: usize, reserved: bool) -> Pc {
        let ev = self.cfg.events[e];
        let inherited = self.cfg.variant == Variant::GiveBackInherited
            && ev.ty == EventType::Forward
            && s.rows[ev.object].reserved();
        if reserved || inherited {
            self.give_back(s, e);
        }
        self.answer(s, e, Answer::Error)
    }

    /// Takes a refund's or dispute's amount out of its payment.
    fn take_out(&self, s: &mut State, e: usize) {
        let ev = self.cfg.events[e];
        match self.kind(e) {
            Kind::Refund => s.out_refunds += ev.amount,
            _ => s.out_disputes += ev.amount,
        }
        s.rows[ev.object].out = true;
    }

    /// Gives a refund's or dispute's amount back to its payment.
    fn give_back(&self, s: &mut State, e: usize) {
        let ev = self.cfg.events[e];
        match self.kind(e) {
            Kind::Refund => s.out_refunds -= ev.amount,
            _ => s.out_disputes -= ev.amount,
        }
        s.rows[ev.object].out = false;
    }

    /// `store::Connection::finalize`: the transition, its entry and its money.
    fn finalize(&self, s: &mut State, e: usize, _reserved: bool) -> Pc {
        let decision = s.deliveries[e].decision.expect("claimed");
        match self.book(s, e, decision.0) {
            Ok(()) => self.answer(s, e, Answer::Processed),
            Err(refusal) => self.answer(s, e, refusal),
        }
    }

    /// The finalize's writes (`store::Connection::finalize`): the status,
    /// the entry, the money of a give-back, a reservation that becomes the
    /// entry's. A step whose claim reserved nothing is booked without
    /// moving money, as the code's `FINALIZE` does (the broken variants
    /// that take the cap late take it here).
    fn book(&self, s: &mut State, e: usize, to: Status) -> Result<(), Answer> {
        let ev = self.cfg.events[e];
        let kind = self.kind(e);
        let amount = self.amount(s, e);
        let row = s.rows[ev.object];
        let late = matches!(
            self.cfg.variant,
            Variant::CapTakenAtFinalize | Variant::NoCap
        );
        match (kind, ev.ty) {
            (Kind::Payment, EventType::Forward) => {
                s.rows[0].amount = amount;
                s.rows[0].forward += 1;
            }
            (Kind::Payment, EventType::Backward) => s.rows[0].amount = amount,
            (Kind::Refund, EventType::Forward) => {
                if !row.out && late {
                    // Nothing reserved at the claim (a broken variant): take it now.
                    if self.cfg.variant == Variant::CapTakenAtFinalize
                        && !self.within_cap(s, ev.amount, Kind::Refund)
                    {
                        return Err(Answer::Rejected);
                    }
                    self.take_out(s, e);
                }
                s.rows[ev.object].forward += 1;
            }
            (Kind::Dispute, EventType::Forward) => s.rows[ev.object].forward += 1,
            (_, EventType::Backward) => {
                let booked = row.status == Some(Status::Succeeded);
                // Not booked: what a claim whose call timed out reserved
                // (`store::Connection::finalize`'s first settlement that
                // books nothing); booked: the reversal's give-back.
                let keep = !booked && self.cfg.variant == Variant::FailureKeepsReservation;
                if row.out && !keep {
                    // The reversal's amount is the forward step's: one amount per object.
                    self.give_back(s, e);
                    if !booked {
                        s.failure_gave_back = true;
                    }
                }
                if booked {
                    s.rows[ev.object].reversal += 1;
                }
            }
        }
        s.rows[ev.object].status = Some(to);
        s.booked[e] = true;
        Ok(())
    }

    /// The PSP stopped waiting for a delivery in its downstream call, whose
    /// lease ran out meanwhile, and delivers again: the first run goes on
    /// as a stale one, without its lease, beside the new delivery.
    fn abandon(&self, s: &mut State, e: usize, stage: Stage) -> Pc {
        let d = &mut s.deliveries[e];
        d.stale = Some(Stale {
            stage,
            token: d.token,
            decision: d.decision.expect("claimed"),
        });
        d.deliveries += 1;
        let object = self.cfg.events[e].object;
        if s.leases[object] == Some(e) {
            s.leases[object] = None;
        }
        self.first_pc()
    }

    /// A step of the stale run of event `e`: its call, or its finalize,
    /// each fenced by its token; it answers no one.
    fn stale_step(&self, s: &mut State, e: usize, op: Op) {
        let stale = s.deliveries[e].stale.expect("a stale run");
        let object = self.cfg.events[e].object;
        let ours = s.rows[object].fence == stale.token;
        let next = match (stale.stage, op) {
            (Stage::Call { reserved }, Op::StaleCall) => {
                let key = self.key(e);
                match s.keys[key] {
                    None => {
                        s.keys[key] = Some(e);
                        s.executed[e] += 1;
                        Some(Stage::Finalize)
                    }
                    Some(first) if first == e => Some(Stage::Finalize),
                    Some(_) if self.cfg.downstream == Downstream::Replays => Some(Stage::Finalize),
                    Some(_) => {
                        self.stale_give_back(s, e, reserved, ours);
                        None
                    }
                }
            }
            (Stage::Call { reserved }, Op::StaleCallFails) => {
                self.stale_give_back(s, e, reserved, ours);
                None
            }
            (Stage::Finalize, Op::StaleFinalize) => {
                if ours {
                    // Booked under its own token; a refusal answers no one.
                    let _ = self.book(s, e, stale.decision.0);
                }
                None
            }
            (stage, op) => unreachable!("{op:?} is not a step of a stale run at {stage:?}"),
        };
        s.deliveries[e].stale = next.map(|stage| Stale { stage, ..stale });
    }

    /// `store::Connection::release` for a stale run whose call was refused:
    /// `WHERE fence = token AND reserved`, so a newer claim's reservation
    /// stays (unless the variant drops the fence).
    fn stale_give_back(&self, s: &mut State, e: usize, reserved: bool, ours: bool) {
        let fenced = ours || self.cfg.variant == Variant::UnfencedGiveBack;
        let held = s.rows[self.cfg.events[e].object].reserved();
        if reserved && fenced && held {
            self.give_back(s, e);
        } else if reserved && held {
            s.stale_give_back_fenced = true;
        }
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
                fence: 0,
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
            failure_gave_back: false,
            stale_give_back_fenced: false,
            repriced_over: 0,
            deliveries: (0..n)
                .map(|_| Delivery {
                    pc: self.first_pc(),
                    deliveries: 1,
                    decision: None,
                    token: 0,
                    stale: None,
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
            Property::always(BOOKED_STEPS_HOLD_THEIR_MONEY, |m: &Self, s: &State| {
                s.rows.iter().zip(&m.cfg.kinds).all(|(r, &k)| {
                    k == Kind::Payment || r.status != Some(Status::Succeeded) || r.out
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
                SOMETIMES_A_TIMED_OUT_RESERVATION_IS_KEPT,
                |m: &Self, s: &State| {
                    s.deliveries.iter().zip(&m.cfg.events).any(|(d, ev)| {
                        let row = s.rows[ev.object];
                        ev.ty == EventType::Forward
                            && matches!(d.pc, Pc::Done(Answer::Error))
                            && row.out
                            && row.status == Some(Status::Processing)
                    })
                },
            ),
            Property::sometimes(
                SOMETIMES_A_FAILURE_GIVES_A_RESERVATION_BACK,
                |_, s: &State| s.failure_gave_back,
            ),
            Property::sometimes(SOMETIMES_A_STALE_GIVE_BACK_IS_FENCED, |_, s: &State| {
                s.stale_give_back_fenced && s.booked[0]
            }),
            Property::sometimes(SOMETIMES_REPRICED_OVER_A_QUEUED_FAILURE, |_, s: &State| {
                repriced_and_booked(s, Status::Queued)
            }),
            Property::sometimes(
                SOMETIMES_REPRICED_OVER_A_FAILURE_IN_FLIGHT,
                |_, s: &State| repriced_and_booked(s, Status::Processing),
            ),
            Property::sometimes(SOMETIMES_REPRICED_OVER_A_DEAD_FAILURE, |_, s: &State| {
                repriced_and_booked(s, Status::Dead)
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
pub const BOOKED_STEPS_HOLD_THEIR_MONEY: &str =
    "a booked refund or dispute holds its amount in its payment's money out";
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
pub const SOMETIMES_A_RESERVATION_IS_GIVEN_BACK: &str = "a refused call gives its reservation back";
pub const SOMETIMES_A_TIMED_OUT_RESERVATION_IS_KEPT: &str =
    "a call timed out and its claim keeps the reservation for the next delivery";
pub const SOMETIMES_A_FAILURE_GIVES_A_RESERVATION_BACK: &str =
    "a refund's failure gives back what its timed-out claim reserved";
pub const SOMETIMES_A_STALE_GIVE_BACK_IS_FENCED: &str =
    "a stale run's refused call leaves the newer claim's reservation, which is then booked";
pub const SOMETIMES_REPRICED_OVER_A_QUEUED_FAILURE: &str =
    "a success at another amount is booked after its failure was accepted, not worked";
pub const SOMETIMES_REPRICED_OVER_A_FAILURE_IN_FLIGHT: &str =
    "a success at another amount is booked after finding its failure's claim in flight";
pub const SOMETIMES_REPRICED_OVER_A_DEAD_FAILURE: &str =
    "a success at another amount is booked after its failure went dead";

/// The payment is booked, and its success was taken at another amount over
/// a failure left at `status`.
fn repriced_and_booked(s: &State, status: Status) -> bool {
    s.rows[0].status == Some(Status::Succeeded) && s.repriced_over & (1 << status as u8) != 0
}

pub const INVARIANTS: [&str; 12] = [
    EACH_EFFECT_AT_MOST_ONCE,
    ENTRIES_MATCH_STATUS,
    BOOKED_STEPS_HOLD_THEIR_MONEY,
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
    model.quiet.get_or(LifecycleModel::quiet_key(s), || {
        let mut run = s.clone();
        run.leases.iter_mut().for_each(|l| *l = None);
        let mut settled = true;
        for e in 0..run.deliveries.len() {
            run.deliveries[e] = Delivery {
                pc: model.first_pc(),
                deliveries: 1,
                decision: None,
                token: 0,
                stale: None,
            };
            props::run_alone(
                &mut run,
                8,
                |s, ops| model.ops(s, e, ops),
                |op| {
                    matches!(
                        op,
                        Op::CallFails | Op::CallTimesOut | Op::Redeliver | Op::Bury | Op::Abandon
                    )
                },
                |s, op| model.step(s, e, op),
            );
            settled &= matches!(
                run.deliveries[e].pc,
                Pc::Done(a) if a.is_2xx() || a == Answer::Rejected
            );
        }
        settled
    })
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
            if r.fence > 0 {
                write!(f, "@{}", r.fence)?;
            }
        }
        for (i, d) in self.deliveries.iter().enumerate() {
            write!(f, " | e{i} {:?}", d.pc)?;
            if d.token > 0 {
                write!(f, " t{}", d.token)?;
            }
            if let Some(st) = d.stale {
                write!(f, " (stale t{} {:?})", st.token, st.stage)?;
            }
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
    fn a_timed_out_call_keeps_its_reservation_and_the_refunds_failure_gives_it_back() {
        let checker = check(
            "lifecycle, reservations",
            LifecycleModel::new(Config::reservations()),
        );
        assert_safe(
            &checker,
            &INVARIANTS,
            &[
                SOMETIMES_A_TIMED_OUT_RESERVATION_IS_KEPT,
                SOMETIMES_A_FAILURE_GIVES_A_RESERVATION_BACK,
                SOMETIMES_A_RESERVATION_IS_GIVEN_BACK,
                SOMETIMES_A_REFUND_IS_REFUSED,
                SOMETIMES_EVERY_EVENT_BOOKED,
            ],
        );
    }

    #[test]
    fn a_stale_runs_refused_call_leaves_the_reservation_a_newer_claim_took_over() {
        let checker = check(
            "lifecycle, stale runs",
            LifecycleModel::new(Config::stale()),
        );
        assert_safe(
            &checker,
            &INVARIANTS,
            &[
                SOMETIMES_A_STALE_GIVE_BACK_IS_FENCED,
                SOMETIMES_A_RESERVATION_IS_GIVEN_BACK,
                SOMETIMES_A_REFUND_IS_REFUSED,
            ],
        );
    }

    #[test]
    fn a_timed_out_call_that_gives_its_reservation_back_is_caught_refusing_a_refund_it_executed() {
        // What the code did before: a call that timed out may have executed,
        // and the cap it gave back goes to another refund before the PSP
        // retries this one, which is then refused.
        let cfg = with(Config::reservations(), Variant::TimeoutGivesBack);
        let last = shortest_counterexample(
            "lifecycle, a timed-out call gives its reservation back",
            || LifecycleModel::new(cfg.clone()),
            EXECUTED_NEVER_REFUSED,
        );
        assert_eq!(last.out_refunds, 2, "the other refund took the cap");
    }

    #[test]
    fn a_refunds_failure_that_keeps_a_timed_out_reservation_is_caught_losing_refund_capacity() {
        let cfg = with(Config::reservations(), Variant::FailureKeepsReservation);
        let last = shortest_counterexample(
            "lifecycle, a failure keeps the reservation",
            || LifecycleModel::new(cfg.clone()),
            REFUNDS_CAPPED_BY_REFUNDS_ALONE,
        );
        let failed = last.rows[1];
        assert!(failed.status == Some(Status::Failed) && failed.out);
    }

    #[test]
    fn a_refused_retry_that_gives_back_a_timed_out_calls_reservation_is_caught() {
        // What `store::Connection::release` does today (`WHERE fence = token
        // AND reserved`): a retry's claim keeps the reservation of a claim
        // whose call timed out, and when the retry's call is refused (a 409
        // for the first call still running, a 503), it gives that
        // reservation back though the first call may have executed.
        let cfg = with(Config::reservations(), Variant::GiveBackInherited);
        let last = shortest_counterexample(
            "lifecycle, a refused retry gives back an inherited reservation",
            || LifecycleModel::new(cfg.clone()),
            EXECUTED_NEVER_REFUSED,
        );
        assert_eq!(last.executed[0], 1);
    }

    #[test]
    fn a_give_back_without_the_fence_is_caught_booking_a_refund_that_holds_no_money() {
        let cfg = with(Config::stale(), Variant::UnfencedGiveBack);
        let last = shortest_counterexample(
            "lifecycle, a give-back without the fence",
            || LifecycleModel::new(cfg.clone()),
            BOOKED_STEPS_HOLD_THEIR_MONEY,
        );
        assert!(last.rows[1..]
            .iter()
            .any(|r| r.status == Some(Status::Succeeded) && !r.out));
    }

    #[test]
    fn in_inbox_mode_a_success_at_another_amount_is_taken_over_its_unsettled_failure() {
        let checker = check("lifecycle, inbox", LifecycleModel::new(Config::inbox()));
        assert_safe(
            &checker,
            &INVARIANTS,
            &[
                SOMETIMES_REPRICED_OVER_A_QUEUED_FAILURE,
                SOMETIMES_REPRICED_OVER_A_FAILURE_IN_FLIGHT,
                SOMETIMES_REPRICED_OVER_A_DEAD_FAILURE,
            ],
        );
    }

    #[test]
    fn in_inbox_mode_a_payment_event_refused_at_the_accept_while_the_payment_is_unsettled_is_caught(
    ) {
        // Refused at the accept, the event is not even stored: a success
        // refused over its queued failure is a credit lost once the PSP
        // stops retrying (and a failure refused over a queued success, a
        // decline never recorded).
        let cfg = Config {
            events: vec![ev(0, EventType::Backward, 1), ev(0, EventType::Forward, 2)],
            ..with(Config::inbox(), Variant::MatchOnlyBookedFailure)
        };
        let last = shortest_counterexample(
            "lifecycle, inbox, only a booked failure matches",
            || LifecycleModel::new(cfg.clone()),
            A_PAYMENT_EVENT_MATCHES_UNTIL_A_SUCCESS,
        );
        assert_eq!(last.rows[0].status, Some(Status::Queued));
        assert!(last
            .deliveries
            .iter()
            .any(|d| d.pc == Pc::Done(Answer::Mismatch)));
    }
}
