//! The lease + fence protocol as a [`stateright::Model`]: one payment, a lease
//! store that can expire, forget and fail over, a database row and its ledger,
//! and a bounded number of holders (deliveries of that payment on different
//! instances) interleaved in every possible order.
//!
//! Every holder step is one atomic round trip in the code (one Lua script, one
//! SQL statement, one HTTP call, one local clock check), so anything another
//! holder or the lease store does can fall between two of them. See the table
//! in `main.rs` for which function each step stands for.

use std::fmt;

use stateright::{Model, Property};

use crate::props::{self, Memo};
pub use crate::props::{
    ONE_MORE_DELIVERY_BOOKS_IT, ONE_WRITER_PER_TOKEN, PROCESSED_AFTER_COMMIT, SOMETIMES_BOOKED,
    SOMETIMES_RESYNC_THEN_COMMIT,
};

/// Which protocol the model runs: the one in the code, or one with a guard
/// removed, to show that the model notices when a guard is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// As implemented today.
    Correct,
    /// The claim drops `fence < token` and the finalize drops `fence = token`.
    NoFenceCondition,
    /// Only the finalize drops `fence = token`.
    FinalizeIgnoresToken,
    /// The claim takes over a row at `fence <= token` instead of `fence < token`.
    ClaimAcceptsEqualToken,
    /// No write checks the row's status (`status = ANY(from)`, here
    /// `processing`): the fence alone guards them.
    NoStatusGuard,
    /// RELEASE deletes the lock without comparing it with `owner:token`.
    ReleaseWithoutCompare,
    /// A stale claim answers `lease_lost` at once instead of resyncing.
    NoResync,
}

/// Where the business step happens for one holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// No downstream: claim, final status and ledger entry in one statement.
    Inline,
    /// Claim committed first, then the downstream call, then the fenced finalize.
    Downstream,
}

/// Which route the instances take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routes {
    Inline,
    Downstream,
    /// Instances disagree (a rollout of `FENCEHOOK_DOWNSTREAM_URL`): even
    /// holders call downstream, odd holders book inline.
    Mixed,
}

/// The bounds of one check. Everything that makes the state space finite is here.
#[derive(Clone, Debug)]
pub struct Config {
    /// Deliveries of the same payment, each processed by its own holder with
    /// its own owner id. A delivery that has not taken its first step yet
    /// has simply not arrived, so holders start at any time.
    pub holders: usize,
    pub routes: Routes,
    /// ACQUIREs one delivery makes before it answers `in_progress` (it may
    /// also give up earlier: the in-flight deadline is a nondeterministic choice).
    pub acquire_attempts: u8,
    /// Redis restarts without persistence: lock and counter gone.
    pub data_losses: u8,
    /// Failovers to a replica that missed the last INCR: the counter goes
    /// back by one, so a later ACQUIRE hands out a token already issued.
    pub failovers: u8,
    /// Whether the downstream call may fail (answer 503, row left `processing`).
    pub downstream_failures: bool,
    /// Model `UNIQUE (payment_id, effect)` on the ledger. Off by default: the
    /// safety properties must hold without it.
    pub ledger_unique: bool,
    pub variant: Variant,
}

impl Config {
    /// Three deliveries, every lease-store fault once, failing downstream,
    /// no ledger constraint, the protocol as implemented.
    pub fn standard(routes: Routes) -> Config {
        Config {
            holders: 3,
            routes,
            acquire_attempts: 2,
            data_losses: 1,
            failovers: 1,
            downstream_failures: true,
            ledger_unique: false,
            variant: Variant::Correct,
        }
    }

    fn route(&self, holder: usize) -> Route {
        match self.routes {
            Routes::Inline => Route::Inline,
            Routes::Downstream => Route::Downstream,
            Routes::Mixed if holder % 2 == 0 => Route::Downstream,
            Routes::Mixed => Route::Inline,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Processing,
    Succeeded,
}

/// The payments row of this (provider, transaction_id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub status: Status,
    pub fence: u8,
}

/// The lock value `owner:token`; the owner id is the holder's index (each
/// holder acquires at most once, so that is a fresh id per acquisition).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lock {
    pub owner: usize,
    pub token: u8,
}

/// Why a holder answered `lease_lost` (409).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lost {
    /// `is_held()` was false before a write.
    NotHeld,
    /// A fenced write matched no row: a newer token owns the payment.
    FenceRejected,
    /// The claim was stale and RESYNC found the lock no longer ours.
    ResyncRefused,
}

/// What a delivery answers the PSP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// 2xx: booked by this delivery.
    Processed,
    /// 2xx: already booked.
    Duplicate,
    /// 409: another holder has it; the PSP redelivers.
    InProgress,
    /// 409: the lease ended (or a newer token owns the row); nothing written.
    LeaseLost(Lost),
    /// 503: downstream failed, or the ledger constraint refused a statement.
    Error,
}

impl Answer {
    pub fn is_2xx(self) -> bool {
        matches!(self, Answer::Processed | Answer::Duplicate)
    }
}

/// Where a holder is: the step it takes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pc {
    /// Fast path: read the row (not yet delivered while it has not run).
    FastPath,
    Acquire,
    /// ACQUIRE said "held": wait, then re-read the row, or give up.
    Waiting,
    /// `is_held()` before the claim (or the inline statement).
    IsHeld,
    /// The claim (downstream route) or the one-statement booking (inline).
    Write,
    /// The write changed nothing: re-read the row.
    Reread,
    /// The row is `processing` at `db_fence >= token`: RESYNC.
    Resync {
        db_fence: u8,
    },
    /// Claim committed: call downstream.
    Downstream,
    /// `is_held()` after the downstream call.
    IsHeldBeforeFinalize,
    Finalize,
    /// RELEASE, then answer.
    Release(Answer),
    Done(Answer),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    pub route: Route,
    pub pc: Pc,
    /// Current token (0: none yet); changes on a successful RESYNC.
    pub token: u8,
    pub acquires: u8,
    pub resynced: bool,
    /// The local lease view: what `is_held()` answers. Ends when Redis lets
    /// the lock expire (the local expiry always comes first) but *not* when
    /// Redis loses the lock by a fault: the heartbeat notices that only later.
    pub view: bool,
    /// This holder's booking (inline statement or finalize) committed.
    pub committed: bool,
    /// Tokens under which a write of this holder took effect (bit per token).
    pub wrote: u32,
}

impl Holder {
    fn new(route: Route) -> Holder {
        Holder {
            route,
            pc: Pc::FastPath,
            token: 0,
            acquires: 0,
            resynced: false,
            view: false,
            committed: false,
            wrote: 0,
        }
    }

    pub fn answer(&self) -> Option<Answer> {
        match self.pc {
            Pc::Done(a) => Some(a),
            _ => None,
        }
    }

    /// Between a successful ACQUIRE and RELEASE.
    fn in_lease(&self) -> bool {
        !matches!(
            self.pc,
            Pc::FastPath | Pc::Acquire | Pc::Waiting | Pc::Done(_)
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    // Lease store.
    pub lock: Option<Lock>,
    pub counter: u8,
    pub data_losses: u8,
    pub failovers: u8,
    // Database.
    pub row: Option<Row>,
    /// Ledger entries (payment, `credit`) that exist.
    pub ledger: u8,
    /// Ledger inserts attempted by statements whose fenced write matched,
    /// including those a UNIQUE constraint then refused.
    pub ledger_writes: u8,
    /// Some write took effect with a token lower than the row's fence at that moment.
    pub stale_write: bool,
    pub holders: Vec<Holder>,
}

impl State {
    fn new(cfg: &Config) -> State {
        State {
            lock: None,
            counter: 0,
            data_losses: 0,
            failovers: 0,
            row: None,
            ledger: 0,
            ledger_writes: 0,
            stale_write: false,
            holders: (0..cfg.holders)
                .map(|h| Holder::new(cfg.route(h)))
                .collect(),
        }
    }

    pub fn row_terminal(&self) -> bool {
        matches!(self.row, Some(r) if r.status == Status::Succeeded)
    }

    pub fn booked_once(&self) -> bool {
        self.row_terminal() && self.ledger == 1 && self.ledger_writes == 1
    }
}

/// One holder step, named after what it does (the pc already fixes which).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    ReadRow,
    Acquire,
    /// In-flight wait: re-read the row, then ACQUIRE again.
    Settled,
    /// In-flight deadline passed: answer `in_progress`.
    GiveUp,
    IsHeld,
    Claim,
    ClaimAndFinalize,
    Reread,
    Resync,
    CallDownstream,
    DownstreamFails,
    Finalize,
    Release,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Holder(usize, Op),
    /// The lock's TTL runs out.
    LockExpires,
    /// Redis restarts without persistence.
    RedisLosesData,
    /// A replica that missed the last INCR is promoted; `lock_survives`
    /// tells whether it has the lock (it may have missed that SET too).
    Failover {
        lock_survives: bool,
    },
}

/// The model: a configuration, everything else is in [`State`].
pub struct FenceModel {
    pub cfg: Config,
    /// Answers of [`one_more_delivery_books_it`] by the only parts of the
    /// state that its fault-free run reads (row, counter, ledger): millions of
    /// states share a few dozen of them.
    quiet_delivery: Memo<QuietKey>,
}

/// Row, counter, ledger entries, ledger writes.
type QuietKey = (Option<Row>, u8, u8, u8);

impl FenceModel {
    pub fn new(cfg: Config) -> FenceModel {
        FenceModel {
            cfg,
            quiet_delivery: Memo::new(),
        }
    }

    /// The conflict branch of the fenced upsert (`store::Connection::claim`
    /// and `store::Connection::apply`): does it update the existing row?
    fn upsert_matches(&self, row: Row, token: u8) -> bool {
        let status = row.status == Status::Processing || self.cfg.variant == Variant::NoStatusGuard;
        let fence = match self.cfg.variant {
            Variant::NoFenceCondition => true,
            Variant::ClaimAcceptsEqualToken => row.fence <= token,
            _ => row.fence < token,
        };
        status && fence
    }

    /// The WHERE of `store::Connection::finalize`.
    fn finalize_matches(&self, row: Row, token: u8) -> bool {
        let status = row.status == Status::Processing || self.cfg.variant == Variant::NoStatusGuard;
        let fence = match self.cfg.variant {
            Variant::NoFenceCondition | Variant::FinalizeIgnoresToken => true,
            _ => row.fence == token,
        };
        status && fence
    }

    /// Applies a write that matched: records a stale token, sets the row, and
    /// with `entry` inserts the ledger entry in the same statement. Returns
    /// false when the ledger constraint refused the statement (nothing changed).
    fn apply_write(&self, s: &mut State, h: usize, row: Row, entry: bool) -> bool {
        let token = s.holders[h].token;
        assert!(
            token < 32,
            "`wrote` has a bit per token: keep the bounds small"
        );
        if entry {
            s.ledger_writes += 1;
            if self.cfg.ledger_unique && s.ledger > 0 {
                return false;
            }
            s.ledger += 1;
        }
        if matches!(s.row, Some(old) if token < old.fence) {
            s.stale_write = true;
        }
        s.row = Some(row);
        s.holders[h].wrote |= 1 << token;
        true
    }

    fn holder_ops(&self, s: &State, h: usize, ops: &mut Vec<Op>) {
        let holder = &s.holders[h];
        match holder.pc {
            Pc::FastPath => ops.push(Op::ReadRow),
            Pc::Acquire => ops.push(Op::Acquire),
            Pc::Waiting => {
                if holder.acquires < self.cfg.acquire_attempts {
                    ops.push(Op::Settled);
                }
                ops.push(Op::GiveUp);
            }
            Pc::IsHeld | Pc::IsHeldBeforeFinalize => ops.push(Op::IsHeld),
            Pc::Write => ops.push(match holder.route {
                Route::Inline => Op::ClaimAndFinalize,
                Route::Downstream => Op::Claim,
            }),
            Pc::Reread => ops.push(Op::Reread),
            Pc::Resync { .. } => ops.push(Op::Resync),
            Pc::Downstream => {
                ops.push(Op::CallDownstream);
                if self.cfg.downstream_failures {
                    ops.push(Op::DownstreamFails);
                }
            }
            Pc::Finalize => ops.push(Op::Finalize),
            Pc::Release(_) => ops.push(Op::Release),
            Pc::Done(_) => {}
        }
    }

    fn step(&self, s: &mut State, h: usize, op: Op) {
        let pc = s.holders[h].pc;
        let next = match (pc, op) {
            (Pc::FastPath, Op::ReadRow) => {
                if s.row_terminal() {
                    Pc::Done(Answer::Duplicate)
                } else {
                    Pc::Acquire
                }
            }
            (Pc::Acquire, Op::Acquire) => {
                s.holders[h].acquires += 1;
                if s.lock.is_some() {
                    Pc::Waiting
                } else {
                    s.counter += 1;
                    s.lock = Some(Lock {
                        owner: h,
                        token: s.counter,
                    });
                    let holder = &mut s.holders[h];
                    holder.token = s.counter;
                    holder.view = true;
                    Pc::IsHeld
                }
            }
            (Pc::Waiting, Op::Settled) => {
                if s.row_terminal() {
                    Pc::Done(Answer::Duplicate)
                } else {
                    Pc::Acquire
                }
            }
            (Pc::Waiting, Op::GiveUp) => Pc::Done(Answer::InProgress),
            (Pc::IsHeld | Pc::IsHeldBeforeFinalize, Op::IsHeld) => {
                if !s.holders[h].view {
                    Pc::Release(Answer::LeaseLost(Lost::NotHeld))
                } else if pc == Pc::IsHeld {
                    Pc::Write
                } else {
                    Pc::Finalize
                }
            }
            (Pc::Write, Op::Claim | Op::ClaimAndFinalize) => {
                let token = s.holders[h].token;
                let matches = s.row.is_none_or(|row| self.upsert_matches(row, token));
                if !matches {
                    Pc::Reread
                } else if op == Op::Claim {
                    let row = Row {
                        status: Status::Processing,
                        fence: token,
                    };
                    self.apply_write(s, h, row, false);
                    Pc::Downstream
                } else {
                    let row = Row {
                        status: Status::Succeeded,
                        fence: token,
                    };
                    if self.apply_write(s, h, row, true) {
                        s.holders[h].committed = true;
                        Pc::Release(Answer::Processed)
                    } else {
                        Pc::Release(Answer::Error)
                    }
                }
            }
            (Pc::Reread, Op::Reread) => match s.row {
                Some(row) if row.status == Status::Succeeded => Pc::Release(Answer::Duplicate),
                Some(row) if !s.holders[h].resynced && self.cfg.variant != Variant::NoResync => {
                    Pc::Resync {
                        db_fence: row.fence,
                    }
                }
                _ => Pc::Release(Answer::LeaseLost(Lost::FenceRejected)),
            },
            (Pc::Resync { db_fence }, Op::Resync) => {
                s.holders[h].resynced = true;
                let ours = Lock {
                    owner: h,
                    token: s.holders[h].token,
                };
                if s.lock == Some(ours) {
                    s.counter = s.counter.max(db_fence) + 1;
                    s.lock = Some(Lock {
                        owner: h,
                        token: s.counter,
                    });
                    s.holders[h].token = s.counter;
                    Pc::IsHeld
                } else {
                    Pc::Release(Answer::LeaseLost(Lost::ResyncRefused))
                }
            }
            (Pc::Downstream, Op::CallDownstream) => Pc::IsHeldBeforeFinalize,
            (Pc::Downstream, Op::DownstreamFails) => Pc::Release(Answer::Error),
            (Pc::Finalize, Op::Finalize) => {
                let token = s.holders[h].token;
                match s.row {
                    Some(row) if self.finalize_matches(row, token) => {
                        let done = Row {
                            status: Status::Succeeded,
                            fence: row.fence,
                        };
                        if self.apply_write(s, h, done, true) {
                            s.holders[h].committed = true;
                            Pc::Release(Answer::Processed)
                        } else {
                            Pc::Release(Answer::Error)
                        }
                    }
                    _ => Pc::Release(Answer::LeaseLost(Lost::FenceRejected)),
                }
            }
            (Pc::Release(answer), Op::Release) => {
                let ours = Lock {
                    owner: h,
                    token: s.holders[h].token,
                };
                if s.lock == Some(ours) || self.cfg.variant == Variant::ReleaseWithoutCompare {
                    s.lock = None;
                }
                s.holders[h].view = false;
                Pc::Done(answer)
            }
            (pc, op) => unreachable!("{op:?} is not a step of a holder at {pc:?}"),
        };
        s.holders[h].pc = next;
    }
}

impl Model for FenceModel {
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
        if s.lock.is_some() {
            actions.push(Action::LockExpires);
        }
        let redis_has_data = s.lock.is_some() || s.counter > 0;
        if s.data_losses < self.cfg.data_losses && redis_has_data {
            actions.push(Action::RedisLosesData);
        }
        if s.failovers < self.cfg.failovers && s.counter > 0 {
            actions.push(Action::Failover {
                lock_survives: true,
            });
            if s.lock.is_some() {
                actions.push(Action::Failover {
                    lock_survives: false,
                });
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Holder(h, op) => self.step(&mut s, h, op),
            Action::LockExpires => {
                let lock = s.lock.take().expect("only offered while a lock exists");
                // The holder's local expiry is computed from when it *sent*
                // the acquire/renew, so its view has ended before Redis's TTL.
                s.holders[lock.owner].view = false;
            }
            Action::RedisLosesData => {
                s.lock = None;
                s.counter = 0;
                s.data_losses += 1;
            }
            Action::Failover { lock_survives } => {
                s.counter -= 1;
                s.failovers += 1;
                if !lock_survives {
                    s.lock = None;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONE_ENTRY, |_, s: &State| s.ledger_writes <= 1),
            Property::always(NO_STALE_WRITE, |_, s: &State| !s.stale_write),
            Property::always(ONE_WRITER_PER_TOKEN, |_, s: &State| {
                props::one_writer_per_token(s.holders.iter().map(|h| h.wrote))
            }),
            Property::always(PROCESSED_AFTER_COMMIT, |_, s: &State| {
                props::processed_only_after_commit(
                    s.holders
                        .iter()
                        .map(|h| (h.answer() == Some(Answer::Processed), h.committed)),
                )
            }),
            Property::always(TWO_XX_ON_TERMINAL_ROW, |_, s: &State| {
                s.holders
                    .iter()
                    .all(|h| !h.answer().is_some_and(Answer::is_2xx) || s.row_terminal())
            }),
            Property::always(STATUS_MATCHES_LEDGER, |_, s: &State| {
                props::entry_matches_status(s.row_terminal(), s.ledger)
            }),
            Property::always(EXCLUSIVE_LEASE_WITHOUT_FAULTS, |_, s: &State| {
                s.data_losses > 0
                    || s.failovers > 0
                    || s.holders.iter().filter(|h| h.in_lease() && h.view).count() <= 1
            }),
            Property::always(ONE_MORE_DELIVERY_BOOKS_IT, one_more_delivery_books_it),
            Property::sometimes(SOMETIMES_BOOKED, |_, s: &State| s.booked_once()),
            Property::sometimes(SOMETIMES_WRITES_AFTER_LEASE_ENDED, |_, s: &State| {
                s.holders
                    .iter()
                    .any(|h| matches!(h.pc, Pc::Write | Pc::Finalize) && !h.view)
            }),
            Property::sometimes(SOMETIMES_FENCE_REJECTS_A_STALE_HOLDER, |_, s: &State| {
                s.holders.iter().any(|h| {
                    h.wrote != 0 && h.answer() == Some(Answer::LeaseLost(Lost::FenceRejected))
                })
            }),
            Property::sometimes(SOMETIMES_TOKEN_ISSUED_TWICE, |_, s: &State| {
                s.holders.iter().enumerate().any(|(i, a)| {
                    s.holders[i + 1..]
                        .iter()
                        .any(|b| a.token != 0 && a.token == b.token)
                })
            }),
            Property::sometimes(
                SOMETIMES_A_STALE_RELEASE_FINDS_A_NEWER_LOCK,
                |_, s: &State| {
                    s.holders.iter().enumerate().any(|(h, holder)| {
                        matches!(holder.pc, Pc::Release(_))
                            && s.lock
                                .is_some_and(|l| l.owner != h && s.holders[l.owner].in_lease())
                    })
                },
            ),
            Property::sometimes(SOMETIMES_RESYNC_THEN_COMMIT, |_, s: &State| {
                s.holders.iter().any(|h| h.resynced && h.committed)
            }),
        ]
    }
}

pub const AT_MOST_ONE_ENTRY: &str =
    "at most one ledger entry per payment and effect (counting writes a constraint refused)";
pub const NO_STALE_WRITE: &str = "no write takes effect with a token lower than the row's fence";
pub const TWO_XX_ON_TERMINAL_ROW: &str = "every 2xx answer stands on a terminal row";
pub const STATUS_MATCHES_LEDGER: &str = "a succeeded row has its entry, any other row none";
pub const EXCLUSIVE_LEASE_WITHOUT_FAULTS: &str =
    "without lease-store faults at most one holder believes it holds the lease";

pub const SOMETIMES_WRITES_AFTER_LEASE_ENDED: &str =
    "a holder is about to write after its lease ended";
pub const SOMETIMES_FENCE_REJECTS_A_STALE_HOLDER: &str =
    "a holder that claimed is fence-rejected later";
pub const SOMETIMES_TOKEN_ISSUED_TWICE: &str = "two holders hold the same token";
pub const SOMETIMES_A_STALE_RELEASE_FINDS_A_NEWER_LOCK: &str =
    "a holder whose lock ran out releases while a newer holder has the lock";

/// Every `always` property (safety, and liveness in its state form): the
/// correct protocol must violate none.
pub const INVARIANTS: [&str; 8] = [
    AT_MOST_ONE_ENTRY,
    NO_STALE_WRITE,
    ONE_WRITER_PER_TOKEN,
    PROCESSED_AFTER_COMMIT,
    TWO_XX_ON_TERMINAL_ROW,
    STATUS_MATCHES_LEDGER,
    EXCLUSIVE_LEASE_WITHOUT_FAULTS,
    ONE_MORE_DELIVERY_BOOKS_IT,
];

/// Liveness as a state property. Stateright's `eventually` cannot express
/// "under fair redelivery", so instead: from this state, let every holder in
/// flight stop for good (crashed, or paused forever: it renews nothing, so
/// its lock runs out), and run one more delivery with no faults and a
/// working downstream. It must end with the row `succeeded` and exactly one
/// ledger entry. Holding in *every* reachable state, this says that no
/// sequence of faults and stale holders can leave the payment unbookable:
/// the PSP's next delivery in a quiet moment books it.
fn one_more_delivery_books_it(model: &FenceModel, s: &State) -> bool {
    if s.row_terminal() {
        return s.booked_once();
    }
    let key = (s.row, s.counter, s.ledger, s.ledger_writes);
    model
        .quiet_delivery
        .get_or(key, || quiet_delivery_books_it(model, s))
}

/// The fault-free run of [`one_more_delivery_books_it`], on every route the
/// configuration uses.
fn quiet_delivery_books_it(model: &FenceModel, s: &State) -> bool {
    let routes: &[Route] = match model.cfg.routes {
        Routes::Inline => &[Route::Inline],
        Routes::Downstream => &[Route::Downstream],
        Routes::Mixed => &[Route::Inline, Route::Downstream],
    };
    routes.iter().all(|&route| {
        // The stopped holders take no more steps, so they can be left out:
        // the new delivery runs alone against the lease store and database.
        let mut run = State {
            lock: None,
            holders: vec![Holder::new(route)],
            ..s.clone()
        };
        props::run_alone(
            &mut run,
            32,
            |s, ops| model.holder_ops(s, 0, ops),
            |op| matches!(op, Op::GiveUp | Op::DownstreamFails),
            |s, op| model.step(s, 0, op),
        );
        run.holders[0].answer() == Some(Answer::Processed) && run.booked_once()
    })
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Holder(h, op) => write!(f, "h{h} {op:?}"),
            Action::LockExpires => f.write_str("lock expires"),
            Action::RedisLosesData => f.write_str("Redis loses its data"),
            Action::Failover { lock_survives } => write!(
                f,
                "failover, counter back by one ({})",
                if *lock_survives {
                    "lock kept"
                } else {
                    "lock lost"
                }
            ),
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lock {
            Some(l) => write!(f, "lock=h{}:t{}", l.owner, l.token)?,
            None => f.write_str("lock=-    ")?,
        }
        write!(f, " counter={}", self.counter)?;
        match self.row {
            Some(r) => write!(f, " row={:?}@{}", r.status, r.fence)?,
            None => f.write_str(" row=-")?,
        }
        write!(f, " ledger={}", self.ledger)?;
        if self.ledger_writes > self.ledger {
            write!(f, " (+{} refused)", self.ledger_writes - self.ledger)?;
        }
        for (i, h) in self.holders.iter().enumerate() {
            write!(f, " | h{i} {:?} t{}", h.pc, h.token)?;
            if h.in_lease() && !h.view {
                f.write_str(" (lease ended)")?;
            }
        }
        Ok(())
    }
}
