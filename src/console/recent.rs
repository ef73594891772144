//! What this instance answered lately, kept in memory for the console: the
//! answers per provider and result over the last [`MINUTES`] minutes, and
//! the last [`MAX_REFUSALS`] refused deliveries.
//!
//! Bounded by construction: a fixed ring of refusals, and one counter per
//! (provider, result, minute) for the configured providers only. A refusal
//! keeps when, which provider, the answer, what failed (the verification's
//! cause or the sender's reason, both free of secrets and cut short) and the
//! peer's address; never the body, a header or a signature.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::metrics::WebhookResult;

/// Refused deliveries kept.
pub const MAX_REFUSALS: usize = 200;

/// Minutes of answers kept.
pub const MINUTES: u64 = 15;

/// Longest reason kept, in characters.
const MAX_REASON: usize = 200;

/// Providers counted at once: a providers file re-read with new names
/// cannot grow the table without end.
const MAX_PROVIDERS: usize = 64;

/// One refused delivery.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    /// Unix seconds.
    pub at: i64,
    pub provider: String,
    /// The answer's `result` (`unauthorized`, `invalid_payload`, …).
    pub result: &'static str,
    pub status: u16,
    /// What failed, when known.
    pub reason: Option<String>,
    /// The peer's address (behind a proxy: the proxy's).
    pub peer: Option<String>,
}

/// Answers of one provider and result in one minute.
#[derive(Debug, Clone, Serialize)]
pub struct AnswerCount {
    pub provider: String,
    pub result: &'static str,
    pub count: u64,
}

/// One counter per minute of the last [`MINUTES`]: (minute, count).
type Slots = [(u64, u64); MINUTES as usize];

#[derive(Default)]
struct Inner {
    refusals: VecDeque<Refusal>,
    /// provider → result → its counters.
    answers: HashMap<String, HashMap<WebhookResult, Slots>>,
}

/// Shared by the webhook handler (writes) and the console (reads).
#[derive(Default)]
pub struct Recent {
    inner: Mutex<Inner>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl Recent {
    /// Counts one answer to a delivery (on every delivery's path: one short
    /// lock, no allocation once its provider has been seen).
    pub fn answered(&self, provider: &str, result: WebhookResult) {
        let minute = now_secs() / 60;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !inner.answers.contains_key(provider) {
            if inner.answers.len() >= MAX_PROVIDERS {
                return;
            }
            inner.answers.insert(provider.to_owned(), HashMap::new());
        }
        let Some(by_result) = inner.answers.get_mut(provider) else {
            return;
        };
        let slots = by_result
            .entry(result)
            .or_insert([(0, 0); MINUTES as usize]);
        let slot = &mut slots[(minute % MINUTES) as usize];
        if slot.0 != minute {
            *slot = (minute, 0);
        }
        slot.1 += 1;
    }

    /// Keeps one refused delivery (the oldest kept is dropped past the bound).
    pub fn refused(
        &self,
        provider: &str,
        result: WebhookResult,
        status: u16,
        reason: Option<&str>,
        peer: Option<SocketAddr>,
    ) {
        let refusal = Refusal {
            at: now_secs() as i64,
            provider: provider.to_owned(),
            result: result.as_str(),
            status,
            reason: reason.map(|r| r.chars().take(MAX_REASON).collect()),
            peer: peer.map(|p| p.ip().to_string()),
        };
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.refusals.len() >= MAX_REFUSALS {
            inner.refusals.pop_front();
        }
        inner.refusals.push_back(refusal);
    }

    /// The refusals kept, newest first.
    pub fn refusals(&self) -> Vec<Refusal> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.refusals.iter().rev().cloned().collect()
    }

    /// Answers per provider and result over the last `minutes` (at most
    /// [`MINUTES`]), largest first.
    pub fn answers(&self, minutes: u64) -> Vec<AnswerCount> {
        let now = now_secs() / 60;
        let from = now.saturating_sub(minutes.clamp(1, MINUTES) - 1);
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<AnswerCount> = inner
            .answers
            .iter()
            .flat_map(|(provider, by_result)| by_result.iter().map(move |r| (provider, r)))
            .map(|(provider, (result, slots))| AnswerCount {
                provider: provider.clone(),
                result: result.as_str(),
                count: slots
                    .iter()
                    .filter(|(m, _)| *m >= from && *m <= now)
                    .map(|(_, c)| c)
                    .sum(),
            })
            .filter(|a| a.count > 0)
            .collect();
        out.sort_by(|a, b| (&a.provider, b.count).cmp(&(&b.provider, a.count)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_bounded_newest_first_and_reasons_cut_short() {
        let r = Recent::default();
        for i in 0..MAX_REFUSALS + 5 {
            r.refused(
                "generic",
                WebhookResult::Unauthorized,
                401,
                Some(&format!("n{i}")),
                None,
            );
        }
        let kept = r.refusals();
        assert_eq!(kept.len(), MAX_REFUSALS);
        assert_eq!(
            kept[0].reason.as_deref(),
            Some(format!("n{}", MAX_REFUSALS + 4).as_str())
        );
        r.refused(
            "generic",
            WebhookResult::InvalidPayload,
            400,
            Some(&"x".repeat(1000)),
            None,
        );
        assert_eq!(r.refusals()[0].reason.as_ref().unwrap().len(), MAX_REASON);
    }

    #[test]
    fn answers_are_counted_per_provider_and_result() {
        let r = Recent::default();
        r.answered("generic", WebhookResult::Processed);
        r.answered("generic", WebhookResult::Processed);
        r.answered("stripe", WebhookResult::Unauthorized);
        let a = r.answers(MINUTES);
        assert_eq!(a.len(), 2);
        assert_eq!(
            (a[0].provider.as_str(), a[0].result, a[0].count),
            ("generic", "processed", 2)
        );
    }
}
