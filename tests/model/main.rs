//! An exhaustive model check of the lease + fence protocol with `stateright`.
//!
//! `make model` (`cargo test --locked --release --test model -- --nocapture`)
//! explores, breadth first, every interleaving of a few deliveries of one
//! payment with every fault of the lease store, and checks that a payment is
//! booked at most once, that no holder whose lease ended can write over a
//! newer one, and that the payment cannot get stuck. It then removes one guard
//! at a time from the protocol and checks that the model finds the
//! counterexample, so a green run is not a vacuous one.
//!
//! The real tests (`tests/api`, `tests/chaos`) run the code against real
//! PostgreSQL and Redis, but only on the interleavings that their timing
//! happens to produce; this model runs no code of the crate but covers all
//! interleavings within its bounds. When the protocol changes, change
//! `protocol.rs` with it.
//!
//! # What each model step stands for
//!
//! Every holder step is one atomic round trip in the code. Anything can happen
//! between two steps of one holder: other holders' steps, lock expiry, Redis
//! faults. That is how a stop-the-world pause (GC, SIGSTOP) is modelled: a
//! holder passes `is_held()`, the lock expires and a newer holder takes over,
//! and only then does the paused holder send its write.
//!
//! | Model step | Stands for |
//! | --- | --- |
//! | the holder's whole program (`Pc`) | `processor::Processor::process` (the state machine) |
//! | `ReadRow` (fast path) | `processor::Processor::settled` before the lease: a terminal row answers `duplicate` |
//! | `Acquire` | `lease::Lease::acquire` → `lease::redis::ACQUIRE_LUA` (lock exists: "held"; else INCR → token, SET `owner:token` PX ttl) |
//! | `Settled` (in-flight wait) | `processor::Processor::settled` in the in-flight wait of `process`, then `acquire` again |
//! | `GiveUp` | the in-flight deadline in `process`: answer `in_progress` (409) |
//! | `IsHeld` | `lease::LeaseGuard::loss_reason` in `processor::Processor::under_lease` and `call_and_finalize`: once the attempt has its pooled connection (`store::Store::connection`), right before the claim or the inline statement, and before the finalize |
//! | `ClaimAndFinalize` (inline route) | `store::Connection::claim_and_finalize`: the fenced upsert writes `succeeded` and feeds the ledger insert, one statement |
//! | `Claim` (downstream route) | `store::Connection::claim`: the fenced upsert writes `processing` |
//! | `Reread` | the conflict re-read inside `store::Connection::claim` / `claim_and_finalize` (`Claim::AlreadyDone` or `Claim::Stale`) |
//! | `Resync` | `lease::LeaseGuard::resync` → `lease::redis::RESYNC_LUA` (only if the lock is ours: counter = max(counter, db fence), INCR, relabel) |
//! | `CallDownstream` / `DownstreamFails` | `downstream::Downstream::call` (a failure answers 503 and leaves the row `processing`) |
//! | `Finalize` | `store::Connection::finalize`: `succeeded` + ledger entry `WHERE fence = token AND status = 'processing'`, one statement |
//! | `Release` | `lease::LeaseGuard::release` → `lease::redis::RELEASE_LUA` (compare-and-delete), then the answer |
//! | `LockExpires` | the lock's TTL running out because the heartbeat (`lease/heartbeat.rs`, `Heartbeat::run`, renewing with `lease::redis::RENEW_LUA`) got no renewal through or reached the maximum hold; the holder's local view, which always ends first, has ended too |
//! | `RedisLosesData` | Redis restarting without persistence: lock and counter gone; holders' local views go on until their heartbeat notices |
//! | `Failover` | a replica that missed the last INCR promoted: the counter goes back by one (with or without the lock), so a later ACQUIRE issues a token twice |
//!
//! `RENEW_LUA` has no step of its own: without real time a successful
//! renewal changes nothing, and no step ever recreates a missing lock (RENEW
//! never does). The heartbeat noticing a lost lock only makes `is_held()`
//! false earlier; the holder then writes nothing and answers `lease_lost`,
//! which the model covers with a holder that takes no further step (its
//! RELEASE would find the lock not ours).
//!
//! # Properties
//!
//! Invariants (stateright `always`, checked in every reachable state):
//!
//! - at most one ledger entry per payment and effect, counting every insert of
//!   a statement whose fenced condition matched, even one a UNIQUE constraint
//!   would refuse (the constraint is a model option, off by default: the
//!   fence and status guards must suffice without it);
//! - no write takes effect with a token lower than the row's fence at that moment;
//! - no two holders write under the same token (a failover or data loss
//!   issues tokens twice; the strict `fence < token` and RESYNC keep them apart);
//! - `processed` is answered only after the holder's own commit, and every 2xx
//!   (`processed`, `duplicate`) stands on a terminal row (rows never leave a
//!   terminal status, so "at that moment" and "from then on" are the same);
//! - a `succeeded` row has exactly its one entry, any other row none;
//! - without lease-store faults, at most one holder believes it holds the
//!   lease (the lease itself is exclusive; with faults only the fence is);
//! - liveness, as a state property: from every reachable state, if every
//!   holder in flight stops for good and one more delivery runs with no
//!   faults and a working downstream, the payment ends `succeeded` with
//!   exactly one entry. Stateright's `eventually` checks terminal paths and
//!   has no fairness, and with bounded deliveries "the PSP keeps delivering"
//!   cannot be a path property, so this is the form it takes: no fault,
//!   stale token or half-done holder can leave the payment unbookable, and
//!   the PSP's next delivery in a quiet moment books it.
//!
//! Reachability (`sometimes`), so the safety checks are not vacuous: the
//! payment gets booked; a holder reaches a write after its lease ended; a
//! holder that claimed is later fence-rejected; two holders hold the same
//! token; a holder resyncs and then commits.
//!
//! # Broken variants
//!
//! Each test below removes one guard and asserts that the model finds the
//! counterexample it should (`protocol::Variant`):
//!
//! | Variant | Caught by |
//! | --- | --- |
//! | no fence condition in the writes | a stale write (and two writers under one token) |
//! | finalize without `fence = token` | a stale write |
//! | claim with `fence <= token` | two writers under one token, after a failover |
//! | no `status = 'processing'` guard | a second ledger entry (or, with the UNIQUE constraint, a refused insert answered 503) |
//! | release without compare | two holders believing they hold the lease, and nothing else: the ledger stays right |
//! | no resync | a payment that one more delivery cannot book after Redis lost its counter |
//!
//! The first and fourth say which guard does what: without the fence, the
//! status guard still keeps the ledger to one entry but a holder whose lease
//! ended commits over a newer holder's claim; without the status guard, the
//! fence alone books twice (a later token re-claims a `succeeded` row).
//!
//! # What the model leaves out
//!
//! - Real time. TTLs, the local expiry, the heartbeat's schedule, the
//!   in-flight deadline and `Retry-After` are nondeterministic choices: the
//!   lock may expire at any moment, a waiting delivery may give up at any
//!   moment. Only the ordering guarantee is kept: a holder's local view ends
//!   no later than Redis's TTL (not so after a Redis fault).
//! - The network. Each script, statement or HTTP call is one atomic step. A
//!   call that fails or whose reply is lost (503, lock left to its TTL, maybe
//!   committed) behaves like a holder that stops taking steps, which every
//!   path prefix already covers. The `guard.lost()` select during the
//!   downstream call is folded into the `is_held()` check after it.
//! - The PostgreSQL lease backend (`lease::postgres`): the same acquire,
//!   renew, release and resync semantics in SQL, minus the Redis faults.
//! - Redis Cluster routing, connection pools, metrics, logging, the drop-guard's
//!   background release (a compare-and-delete at any later time: harmless,
//!   like a lock that expires).
//! - Payload: one event, one fingerprint (no `payload_mismatch`), one event
//!   kind (`payment.succeeded`, ledger effect `credit`). `payment.failed`
//!   and refunds differ only in the final status and effect.
//! - The downstream service's own deduplication (`Idempotency-Key`): it may be
//!   called more than once per payment; which call "counts" is its business.
//! - The database is not faulty: PostgreSQL commits are durable and atomic.
//!
//! Bounds are in [`protocol::Config`]; the defaults ([`Config::standard`]):
//! three deliveries, two ACQUIREs each, one Redis data loss, one failover,
//! lock expiry at any time without limit, a downstream that may fail.

mod protocol;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path};

use protocol::{
    Action, Answer, Config, FenceModel, Pc, Routes, State, Status, Variant, AT_MOST_ONE_ENTRY,
    EXCLUSIVE_LEASE_WITHOUT_FAULTS, INVARIANTS, NO_STALE_WRITE, ONE_MORE_DELIVERY_BOOKS_IT,
    ONE_WRITER_PER_TOKEN, SOMETIMES_BOOKED, SOMETIMES_FENCE_REJECTS_A_STALE_HOLDER,
    SOMETIMES_RESYNC_THEN_COMMIT, SOMETIMES_TOKEN_ISSUED_TWICE, SOMETIMES_WRITES_AFTER_LEASE_ENDED,
};

/// Deepest bound [`shortest_counterexample`] tries; the correct model's
/// whole state space is less than 40 steps deep.
const MAX_DEPTH: usize = 48;

/// Explores the whole state space with a single-threaded BFS (the machine's
/// other core is left to the other tests) and prints its size and time.
fn check(label: &str, cfg: Config) -> impl Checker<FenceModel> {
    let started = Instant::now();
    let checker = FenceModel::new(cfg).checker().spawn_bfs().join();
    println!(
        "model: {label}: {} states ({} generated), depth {}, {:.2} s, exhaustive",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64(),
    );
    assert!(checker.is_done(), "the search did not finish");
    checker
}

/// A shortest counterexample for `name`, printed. Stateright records the
/// *last* violating state it meets (in blocks of 1,500 states), not the
/// first, so this bounds the BFS at depth 1, 2, … and stops at the first
/// bound with a discovery: every violation seen then is a first one.
fn shortest_counterexample(label: &str, cfg: &Config, name: &'static str) -> State {
    let started = Instant::now();
    for depth in 1..=MAX_DEPTH {
        let checker = FenceModel::new(cfg.clone())
            .checker()
            .target_max_depth(depth)
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])))
            .spawn_bfs()
            .join();
        if let Some(path) = checker.discovery(name) {
            println!(
                "model: {label}: caught, {} states in the last bounded search, {:.2} s\n{}",
                checker.unique_state_count(),
                started.elapsed().as_secs_f64(),
                render(name, &path),
            );
            return path.last_state().clone();
        }
        assert!(
            checker.is_done(),
            "the search at depth {depth} did not finish"
        );
    }
    panic!("{label}: no counterexample for \"{name}\" within {MAX_DEPTH} steps");
}

/// Asserts that no invariant has a counterexample and that the listed
/// reachability properties have examples.
fn assert_safe(checker: &impl Checker<FenceModel>, reachable: &[&'static str]) {
    for name in INVARIANTS {
        if let Some(path) = checker.discovery(name) {
            panic!("counterexample\n{}", render(name, &path));
        }
    }
    for &name in reachable {
        assert!(
            checker.discovery(name).is_some(),
            "\"{name}\" was never reached: the check would be vacuous"
        );
    }
}

/// The invariants an exhaustive run found counterexamples for.
fn violated(checker: &impl Checker<FenceModel>) -> Vec<&'static str> {
    INVARIANTS
        .into_iter()
        .filter(|&name| checker.discovery(name).is_some())
        .collect()
}

/// One line per step: the action, then the state it led to. Built as one
/// string so that tests running in parallel do not interleave their lines.
fn render(name: &str, path: &Path<State, Action>) -> String {
    let steps = path.clone().into_vec();
    let mut out = format!(
        "  counterexample for \"{name}\" ({} steps):",
        steps.len() - 1
    );
    for pair in steps.windows(2) {
        let action = pair[0].1.expect("every state but the last has an action");
        write!(out, "\n    {:<42} {}", action.to_string(), pair[1].0).unwrap();
    }
    out
}

#[test]
fn the_protocol_never_books_twice_under_any_interleaving() {
    let checker = check(
        "correct, downstream route",
        Config::standard(Routes::Downstream),
    );
    assert_safe(
        &checker,
        &[
            SOMETIMES_BOOKED,
            SOMETIMES_WRITES_AFTER_LEASE_ENDED,
            SOMETIMES_FENCE_REJECTS_A_STALE_HOLDER,
            SOMETIMES_TOKEN_ISSUED_TWICE,
            SOMETIMES_RESYNC_THEN_COMMIT,
        ],
    );
}

#[test]
fn the_inline_route_never_books_twice_under_any_interleaving() {
    let checker = check("correct, inline route", Config::standard(Routes::Inline));
    // Inline rows are never left `processing`, so no claim is ever stale and
    // no holder resyncs or is fence-rejected after writing.
    assert_safe(
        &checker,
        &[
            SOMETIMES_BOOKED,
            SOMETIMES_WRITES_AFTER_LEASE_ENDED,
            SOMETIMES_TOKEN_ISSUED_TWICE,
        ],
    );
}

#[test]
fn instances_that_disagree_about_the_route_never_book_twice() {
    let checker = check("correct, mixed routes", Config::standard(Routes::Mixed));
    assert_safe(
        &checker,
        &[
            SOMETIMES_BOOKED,
            SOMETIMES_WRITES_AFTER_LEASE_ENDED,
            SOMETIMES_FENCE_REJECTS_A_STALE_HOLDER,
            SOMETIMES_TOKEN_ISSUED_TWICE,
            SOMETIMES_RESYNC_THEN_COMMIT,
        ],
    );
}

#[test]
fn removing_the_fence_condition_is_caught_by_the_model() {
    let cfg = Config {
        variant: Variant::NoFenceCondition,
        ..Config::standard(Routes::Downstream)
    };
    let last = shortest_counterexample("no fence condition", &cfg, NO_STALE_WRITE);
    assert!(last.stale_write);

    let checker = check("no fence condition, every violation", cfg);
    let violated = violated(&checker);
    println!("  violated: {violated:?}");
    assert!(violated.contains(&ONE_WRITER_PER_TOKEN));
    // The status guard alone still keeps the ledger to one entry: what the
    // fence adds is that a holder whose lease ended cannot commit over a
    // newer holder's claim.
    assert!(!violated.contains(&AT_MOST_ONE_ENTRY));
}

#[test]
fn a_finalize_that_ignores_the_token_is_caught_by_the_model() {
    let cfg = Config {
        variant: Variant::FinalizeIgnoresToken,
        ..Config::standard(Routes::Downstream)
    };
    let last = shortest_counterexample("finalize ignores the token", &cfg, NO_STALE_WRITE);
    assert_eq!(last.row.map(|r| r.status), Some(Status::Succeeded));
}

#[test]
fn a_claim_that_accepts_an_equal_token_is_caught_after_a_failover() {
    let cfg = Config {
        variant: Variant::ClaimAcceptsEqualToken,
        data_losses: 0,
        ..Config::standard(Routes::Downstream)
    };
    let last = shortest_counterexample("claim accepts fence = token", &cfg, ONE_WRITER_PER_TOKEN);
    assert_eq!(last.failovers, 1);
}

#[test]
fn without_the_status_guard_the_fence_alone_books_twice() {
    let cfg = Config {
        variant: Variant::NoStatusGuard,
        ..Config::standard(Routes::Downstream)
    };
    let last = shortest_counterexample("no status guard", &cfg, AT_MOST_ONE_ENTRY);
    assert_eq!(last.ledger, 2, "without the constraint both entries exist");

    // With `UNIQUE (payment_id, effect)` the second insert becomes an error
    // (503) instead of a second entry; the model still counts the attempt.
    let cfg = Config {
        ledger_unique: true,
        ..cfg
    };
    let last = shortest_counterexample(
        "no status guard, ledger constraint on",
        &cfg,
        AT_MOST_ONE_ENTRY,
    );
    assert_eq!((last.ledger, last.ledger_writes), (1, 2));
    assert!(last
        .holders
        .iter()
        .any(|h| h.pc == Pc::Release(Answer::Error)));
}

#[test]
fn a_release_without_compare_breaks_the_lease_but_not_the_ledger() {
    let cfg = Config {
        variant: Variant::ReleaseWithoutCompare,
        ..Config::standard(Routes::Downstream)
    };
    shortest_counterexample(
        "release without compare",
        &cfg,
        EXCLUSIVE_LEASE_WITHOUT_FAULTS,
    );
    // The lease is only an optimisation: the fence still keeps the books right.
    let checker = check("release without compare, every violation", cfg);
    assert_eq!(violated(&checker), [EXCLUSIVE_LEASE_WITHOUT_FAULTS]);
}

#[test]
fn dropping_the_resync_strands_the_payment_after_redis_loses_its_data() {
    let cfg = Config {
        variant: Variant::NoResync,
        ..Config::standard(Routes::Downstream)
    };
    let last = shortest_counterexample("no resync", &cfg, ONE_MORE_DELIVERY_BOOKS_IT);
    // The row is `processing` at a fence the reset counter has not passed.
    let row = last.row.expect("a claimed row");
    assert!(row.status == Status::Processing && row.fence > last.counter);
}
