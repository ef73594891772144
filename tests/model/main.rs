//! Exhaustive model checks of fencehook's protocols with `stateright`.
//!
//! `make model` (`cargo test --locked --release --test model -- --nocapture`)
//! explores, breadth first, every interleaving of a few deliveries with every
//! fault the model allows, and checks safety invariants (nothing booked
//! twice, no stale holder's write, money within its bounds) and liveness in
//! the form of a state property (from every state, one more quiet delivery
//! settles it). Each model then removes one guard at a time and checks that
//! it finds the counterexample, so a green run is not a vacuous one.
//!
//! The real tests (`tests/api`, `tests/chaos`) run the code against real
//! PostgreSQL and Redis, but only on the interleavings that their timing
//! happens to produce; these models run no code of the crate but cover all
//! interleavings within their bounds. Several small models, each exhaustive
//! in a few seconds, instead of one that could not be:
//!
//! | Model | File | What it covers |
//! | --- | --- | --- |
//! | the lease + fence protocol (Redis) | `protocol.rs`, tests below | one payment, lease-store faults, inline and downstream routes |
//! | the lease inside the write | `leased.rs` | the PostgreSQL backend's one-statement inline path: advisory try-lock, row lock, fence floor, resync rounds |
//! | a payment's life | `lifecycle.rs` | statuses and moves out of settled ones, the money cap with several children and reversals, the reservations (kept by a timed-out call, given back by a refused call or a refund's failure, fenced against a stale run), one `Idempotency-Key` per step, the fingerprint rule with the inbox's accept |
//! | the inbox | `inbox.rs` | take, rescue (an actor of its own), settle under the take's lock, dead events, replay |
//!
//! `props.rs` holds what several models check alike (one writer per token,
//! `processed` after a commit, an entry per booked status) and the quiet run
//! that stands for liveness, with its memo.
//!
//! Each file's module doc has its table of model steps → the code's
//! functions: when a step changes, change the table and the model with it.
//! A renamed function fails `every_function_the_model_tables_name_exists_in_the_code`
//! (below) until its table follows. `harness.rs` runs the models.
//!
//! # The lease + fence protocol (`protocol.rs`)
//!
//! One payment (`payment.succeeded`), a few deliveries of it, every fault of
//! the Redis lease store. Checks that it is booked at most once, that no
//! holder whose lease ended can write over a newer one, and that the payment
//! cannot get stuck.
//!
//! ## What each model step stands for
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
//! | `IsHeld` | `lease::LeaseGuard::loss_reason` in `processor::Processor::write_around` and `call_and_finalize`: once the attempt has its pooled connection (`store::Store::connection`), right before the claim or the inline statement, and before the finalize |
//! | `ClaimAndFinalize` (inline route) | `store::Connection::apply` → `store::sql::APPLY`: the fenced upsert writes `succeeded` and feeds the ledger insert, one statement |
//! | `Claim` (downstream route) | `store::Connection::claim` → `store::sql::CLAIM`: the fenced upsert writes `processing` |
//! | `Reread` | the conflict re-read (`store::reread`: `Claimed::NotWritten` / `Applied::NotWritten`), then `domain::decide` again in `processor::Processor::attempts`: `duplicate`, or a row that still wants the transition at `fence >= token` (resync, once) |
//! | `Resync` | `lease::LeaseGuard::resync` → `lease::redis::RESYNC_LUA` (only if the lock is ours: counter = max(counter, db fence), INCR, relabel) |
//! | `CallDownstream` / `DownstreamFails` | `downstream::Downstream::call` (a failure answers 503 and leaves the row `processing`) |
//! | `Finalize` | `store::Connection::finalize` → `store::sql::FINALIZE`: `succeeded` + ledger entry `WHERE fence = token AND status = ANY(from)`, one statement |
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
//! ## Properties
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
//! - the payment's row has its credit if `succeeded`, none in any other
//!   status (for a payment; a reversed refund or dispute is `failed` with
//!   two entries: `lifecycle.rs` checks the rule for every kind);
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
//! ## Broken variants
//!
//! Each test below removes one guard and asserts that the model finds the
//! counterexample it should (`protocol::Variant`):
//!
//! | Variant | Caught by |
//! | --- | --- |
//! | no fence condition in the writes | a stale write (and two writers under one token) |
//! | finalize without `fence = token` | a stale write |
//! | claim with `fence <= token` | two writers under one token, after a failover |
//! | no status guard (`status = ANY(from)`: `processing` here) | a second ledger entry (or, with the UNIQUE constraint, a refused insert answered 503) |
//! | release without compare | two holders believing they hold the lease, and nothing else: the ledger stays right |
//! | no resync | a payment that one more delivery cannot book after Redis lost its counter |
//!
//! The release is fenced like the writes: a holder whose lock ran out and
//! was taken by another releases it (reachable: "a holder whose lock ran out
//! releases while a newer holder has the lock"), and the compare-and-delete
//! leaves the newer lock. Without the compare the newer lock goes and a
//! third holder takes the lease beside the second, yet the fence keeps the
//! ledger right: the lease is what keeps copies from working twice, the
//! fence what keeps the books. (A release that gives money back is
//! `store::Connection::release`, fenced by `fence = token`: `lifecycle.rs`.)
//!
//! The first and fourth say which guard does what: without the fence, the
//! status guard still keeps the ledger to one entry but a holder whose lease
//! ended commits over a newer holder's claim; without the status guard, the
//! fence alone books twice (a later token re-claims a `succeeded` row).
//!
//! ## What the model leaves out
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
//! - The PostgreSQL lease backend (`lease::postgres`): with a downstream, the
//!   same acquire, renew, release and resync semantics in SQL, minus the
//!   Redis faults; without one, the lease inside the write (`leased.rs`).
//! - Redis Cluster routing, connection pools, metrics, logging, the drop-guard's
//!   background release (a compare-and-delete at any later time: harmless,
//!   like a lock that expires).
//! - Payload: one event, one fingerprint (no `payload_mismatch`), one event
//!   kind (`payment.succeeded`, ledger effect `credit`). The other events
//!   and the statuses they move through are `lifecycle.rs`'s and `leased.rs`'s.
//! - The downstream service's own deduplication (`Idempotency-Key`): here it
//!   may be called more than once per payment; `lifecycle.rs` models the key.
//! - The database is not faulty: PostgreSQL commits are durable and atomic.
//!
//! Bounds are in `protocol::Config`; the defaults (`Config::standard`):
//! three deliveries, two ACQUIREs each, one Redis data loss, one failover,
//! lock expiry at any time without limit, a downstream that may fail.

mod harness;
mod inbox;
mod leased;
mod lifecycle;
mod props;
mod protocol;

use harness::{check, shortest_counterexample, violated};
use protocol::{
    Answer, Config, FenceModel, Pc, Routes, Status, Variant, AT_MOST_ONE_ENTRY,
    EXCLUSIVE_LEASE_WITHOUT_FAULTS, INVARIANTS, NO_STALE_WRITE, ONE_MORE_DELIVERY_BOOKS_IT,
    ONE_WRITER_PER_TOKEN, SOMETIMES_A_STALE_RELEASE_FINDS_A_NEWER_LOCK, SOMETIMES_BOOKED,
    SOMETIMES_FENCE_REJECTS_A_STALE_HOLDER, SOMETIMES_RESYNC_THEN_COMMIT,
    SOMETIMES_TOKEN_ISSUED_TWICE, SOMETIMES_WRITES_AFTER_LEASE_ENDED,
};

/// Asserts that no invariant has a counterexample and that the listed
/// reachability properties have examples.
fn assert_safe(checker: &impl stateright::Checker<FenceModel>, reachable: &[&'static str]) {
    harness::assert_safe(checker, &INVARIANTS, reachable);
}

#[test]
fn the_protocol_never_books_twice_under_any_interleaving() {
    let checker = check(
        "correct, downstream route",
        FenceModel::new(Config::standard(Routes::Downstream)),
    );
    assert_safe(
        &checker,
        &[
            SOMETIMES_BOOKED,
            SOMETIMES_WRITES_AFTER_LEASE_ENDED,
            SOMETIMES_A_STALE_RELEASE_FINDS_A_NEWER_LOCK,
            SOMETIMES_FENCE_REJECTS_A_STALE_HOLDER,
            SOMETIMES_TOKEN_ISSUED_TWICE,
            SOMETIMES_RESYNC_THEN_COMMIT,
        ],
    );
}

#[test]
fn the_inline_route_never_books_twice_under_any_interleaving() {
    let checker = check(
        "correct, inline route",
        FenceModel::new(Config::standard(Routes::Inline)),
    );
    // Inline rows are never left `processing`, so no claim is ever stale and
    // no holder resyncs or is fence-rejected after writing.
    assert_safe(
        &checker,
        &[
            SOMETIMES_BOOKED,
            SOMETIMES_WRITES_AFTER_LEASE_ENDED,
            SOMETIMES_A_STALE_RELEASE_FINDS_A_NEWER_LOCK,
            SOMETIMES_TOKEN_ISSUED_TWICE,
        ],
    );
}

#[test]
fn instances_that_disagree_about_the_route_never_book_twice() {
    let checker = check(
        "correct, mixed routes",
        FenceModel::new(Config::standard(Routes::Mixed)),
    );
    assert_safe(
        &checker,
        &[
            SOMETIMES_BOOKED,
            SOMETIMES_WRITES_AFTER_LEASE_ENDED,
            SOMETIMES_A_STALE_RELEASE_FINDS_A_NEWER_LOCK,
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
    let last = shortest_counterexample(
        "no fence condition",
        || FenceModel::new(cfg.clone()),
        NO_STALE_WRITE,
    );
    assert!(last.stale_write);

    let checker = check("no fence condition, every violation", FenceModel::new(cfg));
    let violated = violated(&checker, &INVARIANTS);
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
    let last = shortest_counterexample(
        "finalize ignores the token",
        || FenceModel::new(cfg.clone()),
        NO_STALE_WRITE,
    );
    assert_eq!(last.row.map(|r| r.status), Some(Status::Succeeded));
}

#[test]
fn a_claim_that_accepts_an_equal_token_is_caught_after_a_failover() {
    let cfg = Config {
        variant: Variant::ClaimAcceptsEqualToken,
        data_losses: 0,
        ..Config::standard(Routes::Downstream)
    };
    let last = shortest_counterexample(
        "claim accepts fence = token",
        || FenceModel::new(cfg.clone()),
        ONE_WRITER_PER_TOKEN,
    );
    assert_eq!(last.failovers, 1);
}

#[test]
fn without_the_status_guard_the_fence_alone_books_twice() {
    let cfg = Config {
        variant: Variant::NoStatusGuard,
        ..Config::standard(Routes::Downstream)
    };
    let last = shortest_counterexample(
        "no status guard",
        || FenceModel::new(cfg.clone()),
        AT_MOST_ONE_ENTRY,
    );
    assert_eq!(last.ledger, 2, "without the constraint both entries exist");

    // With `UNIQUE (payment_id, effect)` the second insert becomes an error
    // (503) instead of a second entry; the model still counts the attempt.
    let cfg = Config {
        ledger_unique: true,
        ..cfg
    };
    let last = shortest_counterexample(
        "no status guard, ledger constraint on",
        || FenceModel::new(cfg.clone()),
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
        || FenceModel::new(cfg.clone()),
        EXCLUSIVE_LEASE_WITHOUT_FAULTS,
    );
    // The lease is only an optimisation: the fence still keeps the books right.
    let checker = check(
        "release without compare, every violation",
        FenceModel::new(cfg),
    );
    assert_eq!(
        violated(&checker, &INVARIANTS),
        [EXCLUSIVE_LEASE_WITHOUT_FAULTS]
    );
}

#[test]
fn dropping_the_resync_strands_the_payment_after_redis_loses_its_data() {
    let cfg = Config {
        variant: Variant::NoResync,
        ..Config::standard(Routes::Downstream)
    };
    let last = shortest_counterexample(
        "no resync",
        || FenceModel::new(cfg.clone()),
        ONE_MORE_DELIVERY_BOOKS_IT,
    );
    // The row is `processing` at a fence the reset counter has not passed.
    let row = last.row.expect("a claimed row");
    assert!(row.status == Status::Processing && row.fence > last.counter);
}

/// The tables of the model files name the code's functions, constants and
/// types (`store::Connection::claim`, `store::inbox::TAKE`, …): each must
/// still exist, so a rename in the code fails here instead of leaving a
/// table that names what is gone.
#[test]
fn every_function_the_model_tables_name_exists_in_the_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut named = 0;
    for file in [
        "main.rs",
        "protocol.rs",
        "leased.rs",
        "lifecycle.rs",
        "inbox.rs",
        "props.rs",
    ] {
        let text = std::fs::read_to_string(root.join("tests/model").join(file)).unwrap();
        let docs = text.lines().filter_map(|l| l.strip_prefix("//!"));
        let quoted = docs.flat_map(|l| l.split('`').skip(1).step_by(2).collect::<Vec<_>>());
        for path in quoted {
            let segments: Vec<&str> = path.split("::").collect();
            let modules = [
                "processor",
                "store",
                "lease",
                "inbox",
                "downstream",
                "domain",
            ];
            let is_path = segments.len() > 1
                && modules.contains(&segments[0])
                && segments
                    .iter()
                    .all(|s| !s.is_empty() && s.chars().all(|c| c == '_' || c.is_alphanumeric()));
            if !is_path {
                continue;
            }
            named += 1;
            if !names_something(root, &segments) {
                missing.push(format!("{file}: `{path}`"));
            }
        }
    }
    assert!(
        named > 40,
        "only {named} names found: is the parsing right?"
    );
    assert!(
        missing.is_empty(),
        "the model tables name what the code no longer has:\n  {}",
        missing.join("\n  ")
    );
}

/// Whether `segments` (a module path, then items of that module) name a
/// module, or a function (`fn`), a constant (`const`) or a type or variant
/// in the module's file or its submodules' (`impl Store` is spread over
/// `store/*.rs`).
fn names_something(root: &std::path::Path, segments: &[&str]) -> bool {
    let mut dir = root.join("src");
    let mut file = None;
    let mut rest = segments;
    while let Some((first, tail)) = rest.split_first() {
        let as_file = dir.join(format!("{first}.rs"));
        let as_dir = dir.join(first).join("mod.rs");
        if as_file.exists() {
            file = Some(as_file);
        } else if as_dir.exists() {
            file = Some(as_dir);
        } else {
            break;
        }
        dir = dir.join(first);
        rest = tail;
    }
    let Some(file) = file else {
        return false;
    };
    let Some(last) = rest.last() else {
        return true;
    };
    let mut text = std::fs::read_to_string(file).unwrap();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                text.push_str(&std::fs::read_to_string(path).unwrap());
            }
        }
    }
    let word = |w: &str| {
        text.match_indices(w).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + w.len()..].chars().next();
            let edge = |c: Option<char>| !c.is_some_and(|c| c == '_' || c.is_alphanumeric());
            edge(before) && edge(after)
        })
    };
    let item = if last.chars().all(|c| c == '_' || c.is_ascii_uppercase()) {
        word(&format!("const {last}"))
    } else if last.starts_with(|c: char| c.is_ascii_lowercase()) {
        word(&format!("fn {last}"))
    } else {
        word(last)
    };
    item && rest[..rest.len() - 1].iter().all(|t| word(t))
}
