//! Sampling of the log lines an attacker can cause at will: refused
//! deliveries (unsigned, malformed, too large, too slow, over the in-flight
//! limit) and refused connections. A flood of them must not become a flood
//! of log lines (an unsigned flood wrote tens of MB/s), yet an operator must
//! still see that it happens and how much of it: each kind logs at most
//! [`LINES_PER_SECOND`] lines per second, and the next line it logs says how
//! many were left out. The metrics count every one.
//!
//! Deliveries that reached processing are never sampled: their line is the
//! record of what happened to a payment. The exception is a delivery all of
//! whose items were `duplicate`: nothing happened to any payment, its
//! outcome was durable (and logged) before, and a replayed batch makes them
//! by the ten thousand.
//!
//! Hand-written rather than a rate-limiting crate (`governor` and the like):
//! what is needed is a fixed one-second window per kind plus the count of
//! what was left out, which those crates do not keep; one `AtomicU64` per
//! kind does both without a lock on the request path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Lines each kind may log per one-second window.
pub const LINES_PER_SECOND: u32 = 5;

/// What a sampled line is about; each kind has its own budget, so a flood of
/// one kind never hides another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Unauthorized,
    InvalidPayload,
    TooLarge,
    UnsupportedMediaType,
    RequestTimeout,
    /// `FENCEHOOK_MAX_INFLIGHT` reached: answered 503 before processing.
    Overloaded,
    /// A connection beyond the listener's cap, answered 503 and closed.
    ConnectionRefused,
    /// What verification needs could not be had (a signing certificate did
    /// not download): answered 503.
    VerificationUnavailable,
    /// A connection the listener could not accept (out of file
    /// descriptors): it repeats for every connection waiting.
    AcceptFailed,
    /// A copy of a delivery already booked, answered `duplicate`: a replayed
    /// batch makes tens of thousands a second, and the outcome they repeat
    /// is already durable (and logged when it was booked).
    Duplicate,
}

impl Kind {
    const COUNT: usize = 10;

    fn index(self) -> usize {
        self as usize
    }
}

/// Per-kind budgets. Cheap to share: every method takes `&self`.
#[derive(Debug)]
pub struct LogSampler {
    started: Instant,
    slots: [Slot; Kind::COUNT],
}

#[derive(Debug, Default)]
struct Slot {
    /// The window (whole seconds since `started`) in the high 32 bits, the
    /// lines logged in it in the low 32: one compare-and-swap moves both.
    window: AtomicU64,
    /// Lines left out since the last one logged.
    suppressed: AtomicU64,
}

impl Default for LogSampler {
    fn default() -> Self {
        LogSampler::new()
    }
}

impl LogSampler {
    pub fn new() -> LogSampler {
        LogSampler {
            started: Instant::now(),
            slots: Default::default(),
        }
    }

    /// `Some(left_out)` when this line of `kind` may be logged, `left_out`
    /// being how many lines of its kind were dropped since the last one
    /// logged; `None` when it must be dropped (it is then counted).
    pub fn admit(&self, kind: Kind) -> Option<u64> {
        // u32 seconds: 136 years of uptime before the window number wraps.
        let window = self.started.elapsed().as_secs() as u32;
        self.admit_in(kind, window)
    }

    fn admit_in(&self, kind: Kind, window: u32) -> Option<u64> {
        let slot = &self.slots[kind.index()];
        let mut current = slot.window.load(Ordering::Relaxed);
        loop {
            let (seen, logged) = ((current >> 32) as u32, current as u32);
            let next = if seen == window {
                if logged >= LINES_PER_SECOND {
                    slot.suppressed.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                (u64::from(window) << 32) | u64::from(logged + 1)
            } else {
                (u64::from(window) << 32) | 1
            };
            match slot.window.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(slot.suppressed.swap(0, Ordering::Relaxed)),
                Err(actual) => current = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_logs_a_few_lines_per_second_and_the_next_line_counts_the_rest() {
        let s = LogSampler::new();
        let admitted: Vec<Option<u64>> = (0..100)
            .map(|_| s.admit_in(Kind::Unauthorized, 7))
            .collect();
        assert_eq!(
            admitted.iter().filter(|a| a.is_some()).count(),
            LINES_PER_SECOND as usize
        );
        assert!(admitted[..LINES_PER_SECOND as usize]
            .iter()
            .all(|a| *a == Some(0)));
        // Another kind has its own budget.
        assert_eq!(s.admit_in(Kind::TooLarge, 7), Some(0));
        // The next window's first line reports what the last one left out.
        assert_eq!(
            s.admit_in(Kind::Unauthorized, 8),
            Some(100 - u64::from(LINES_PER_SECOND))
        );
        assert_eq!(s.admit_in(Kind::Unauthorized, 8), Some(0));
    }

    #[test]
    fn concurrent_callers_never_log_more_than_the_budget_and_lose_no_count() {
        let s = std::sync::Arc::new(LogSampler::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .filter_map(|_| s.admit_in(Kind::Overloaded, 3))
                        .sum::<u64>()
                })
            })
            .collect();
        let reported: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let last = s.admit_in(Kind::Overloaded, 4).unwrap();
        let logged = u64::from(LINES_PER_SECOND) + 1;
        assert_eq!(reported + last + logged, 4000 + 1);
    }
}
