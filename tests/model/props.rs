//! The properties several models check, written once: who wrote under which
//! token, `processed` only after a commit, an entry per booked status, and
//! the quiet run that stands for liveness (one actor alone, no faults) with
//! its memo. Each model states its own invariants by calling these on its
//! own state, so that a rule that changes changes here, for every model.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

pub const ONE_WRITER_PER_TOKEN: &str = "no two deliveries write under the same token";
pub const PROCESSED_AFTER_COMMIT: &str = "`processed` only after the delivery's own commit";
pub const ONE_MORE_DELIVERY_BOOKS_IT: &str =
    "one more fault-free delivery books the payment exactly once";
pub const SOMETIMES_BOOKED: &str = "the payment gets booked";
pub const SOMETIMES_RESYNC_THEN_COMMIT: &str = "a delivery resyncs its token and then commits";

/// No token is written under by two actors: `wrote` is each actor's set of
/// tokens (a bit per token) under which one of its writes took effect.
pub fn one_writer_per_token(wrote: impl IntoIterator<Item = u32>) -> bool {
    let mut seen = 0u32;
    wrote.into_iter().all(|w| {
        let fresh = seen & w == 0;
        seen |= w;
        fresh
    })
}

/// Every actor that answered `processed` committed its own write first:
/// each item is (answered `processed`, committed).
pub fn processed_only_after_commit(actors: impl IntoIterator<Item = (bool, bool)>) -> bool {
    actors
        .into_iter()
        .all(|(processed, committed)| !processed || committed)
}

/// A row whose status books money has exactly its one entry, any other none.
pub fn entry_matches_status(booked_status: bool, entries: u8) -> bool {
    entries == u8::from(booked_status)
}

/// The answers of a model's quiet run (its liveness check), by the only
/// parts of the state the run reads: millions of states share a few dozen.
pub struct Memo<K>(Mutex<HashMap<K, bool>>);

impl<K: Hash + Eq> Memo<K> {
    pub fn new() -> Memo<K> {
        Memo(Mutex::new(HashMap::new()))
    }

    /// The answer for `key`, computed by `run` the first time.
    pub fn get_or(&self, key: K, run: impl FnOnce() -> bool) -> bool {
        if let Some(&known) = self.0.lock().unwrap().get(&key) {
            return known;
        }
        let answer = run();
        self.0.lock().unwrap().insert(key, answer);
        answer
    }
}

/// Runs one actor alone: at each step its first enabled step that is not a
/// fault (a failed call, a stall, giving up), until it has none or after
/// `max_steps` (every program here ends well before).
pub fn run_alone<S, Op: Copy>(
    state: &mut S,
    max_steps: usize,
    ops: impl Fn(&S, &mut Vec<Op>),
    is_fault: impl Fn(Op) -> bool,
    mut step: impl FnMut(&mut S, Op),
) {
    let mut enabled = Vec::new();
    for _ in 0..max_steps {
        enabled.clear();
        ops(state, &mut enabled);
        match enabled.iter().copied().find(|&op| !is_fault(op)) {
            Some(op) => step(state, op),
            None => return,
        }
    }
}
