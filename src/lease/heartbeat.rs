//! The heartbeat: renews a held lease every ttl/3 and publishes its loss.
//!
//! # What must stay true
//!
//! - The local expiry only moves forward on a *confirmed* renewal, and then
//!   to the instant that renewal was **sent** plus the TTL: Redis starts its
//!   own TTL later, so the holder always believes it lost the lease first.
//! - No renewal extends the lease past the maximum hold.
//! - A renewal never waits longer than the time left before the local expiry.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tokio::time::Instant;
use uuid::Uuid;

use super::{Lease, LeaseKey, LeaseState, LossReport, LostReason};
use crate::metrics::Metrics;

/// Parameters of one heartbeat.
pub(super) struct Heartbeat {
    pub loss: Arc<LossReport>,
    pub lease: Lease,
    pub key: LeaseKey,
    pub owner: Uuid,
    pub token: Arc<Mutex<i64>>,
    pub state: watch::Sender<LeaseState>,
    pub ttl: Duration,
    pub max_hold: Duration,
    pub acquired_at: Instant,
    pub timeout: Duration,
    pub metrics: Metrics,
}

/// How soon a failed renewal is retried (bounded by the time left).
const RENEW_RETRY: Duration = Duration::from_millis(50);

impl Heartbeat {
    /// Renews every ttl/3 until aborted or the lease is lost.
    pub(super) async fn run(self) {
        let interval = self.ttl / 3;
        let mut expires_at = self.state.borrow().expires_at;
        let mut next = self.acquired_at + interval;
        let deadline = self.acquired_at + self.max_hold;
        loop {
            tokio::time::sleep_until(next).await;
            let sent = Instant::now();
            if sent >= expires_at {
                return self.lose(LostReason::Unreachable);
            }
            if sent + self.ttl > deadline {
                // Do not extend past the maximum hold; the lease ends at its expiry.
                tokio::time::sleep_until(expires_at).await;
                return self.lose(LostReason::MaxHold);
            }
            let budget = self.timeout.min(expires_at - sent);
            let result = {
                let token = self.token.lock().await;
                self.lease
                    .renew_within(&self.key, self.owner, *token, budget)
                    .await
            };
            match result {
                Ok(true) => {
                    self.metrics.renew_ok().increment(1);
                    let now = Instant::now();
                    self.metrics
                        .renew_margin()
                        .record(expires_at.saturating_duration_since(now).as_secs_f64());
                    expires_at = sent + self.ttl;
                    let _ = self.state.send(LeaseState {
                        expires_at,
                        lost: None,
                    });
                    next = sent + interval;
                }
                Ok(false) => {
                    self.metrics.renew_not_owner().increment(1);
                    return self.lose(LostReason::NotOwner);
                }
                Err(e) => {
                    self.metrics.renew_error().increment(1);
                    tracing::debug!(error = %crate::report::chain(&e), transaction_id = %self.key.transaction_id, "renewal failed");
                    // A timed-out renewal used its whole budget: try again at once.
                    let pause = if matches!(e, super::LeaseError::Timeout(_)) {
                        Duration::from_millis(10)
                    } else {
                        RENEW_RETRY
                    };
                    next = Instant::now() + pause;
                }
            }
            if next > expires_at {
                next = expires_at;
            }
        }
    }

    fn lose(&self, reason: LostReason) {
        if self.loss.report(&self.metrics) {
            let token = self.token.try_lock().map(|t| *t).unwrap_or_default();
            tracing::warn!(provider = %self.key.provider, transaction_id = %self.key.transaction_id, token,
                reason = %reason, "lease lost");
        }
        let expires_at = self.state.borrow().expires_at;
        let _ = self.state.send(LeaseState {
            expires_at,
            lost: Some(reason),
        });
    }
}
