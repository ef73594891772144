//! The scheduled reconciliation's settings (`serve` and `work`): how often,
//! how far back the first run looks, and the overlap and settle delay of
//! each window after it.

use std::time::Duration;

use clap::Args;

use super::error::{ConfigErrors, Found};
use super::setting;

/// As written.
#[derive(Debug, Clone, Args)]
pub struct ScheduleArgs {
    /// How often `serve` and `work` reconcile every provider with API
    /// credentials against its PSP's events (0: never; `fencehook
    /// reconcile` by hand or cron).
    #[arg(long, env = setting::FENCEHOOK_RECONCILE_INTERVAL_SECS, default_value_t = 0)]
    pub reconcile_interval_secs: u64,
    /// How far back a provider's first run looks (and `fencehook reconcile`
    /// without --since). Stripe and PayPal keep 30 days of events.
    #[arg(long, env = setting::FENCEHOOK_RECONCILE_LOOKBACK_SECS, default_value_t = 259_200)]
    pub reconcile_lookback_secs: u64,
    /// How far before the cursor each scheduled run starts again: events the
    /// PSP lists late (its clock, its indexing) are still seen.
    #[arg(long, env = setting::FENCEHOOK_RECONCILE_OVERLAP_SECS, default_value_t = 300)]
    pub reconcile_overlap_secs: u64,
    /// How long before now a scheduled run's window ends: an event this
    /// young is left to its webhook, which is likely on its way.
    #[arg(long, env = setting::FENCEHOOK_RECONCILE_SETTLE_SECS, default_value_t = 10)]
    pub reconcile_settle_secs: u64,
}

/// Validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileConfig {
    /// `None`: no scheduled runs.
    pub interval: Option<Duration>,
    pub lookback: Duration,
    pub overlap: Duration,
    pub settle: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> ReconcileConfig {
        ReconcileConfig {
            interval: None,
            lookback: Duration::from_secs(259_200),
            overlap: Duration::from_secs(300),
            settle: Duration::from_secs(10),
        }
    }
}

/// The longest look-back: what Stripe and PayPal keep of their events.
pub const MAX_LOOKBACK_SECS: u64 = 30 * 86_400;
/// The longest interval: a day (a longer one is a cron job's).
pub const MAX_INTERVAL_SECS: u64 = 86_400;
/// The longest settle delay: an hour.
pub const MAX_SETTLE_SECS: u64 = 3600;

impl ScheduleArgs {
    pub fn validate(&self) -> Result<ReconcileConfig, ConfigErrors> {
        let mut found = Found::default();
        if self.reconcile_interval_secs > MAX_INTERVAL_SECS {
            found.refuse(
                setting::FENCEHOOK_RECONCILE_INTERVAL_SECS,
                format!("must be at most {MAX_INTERVAL_SECS} (a day), or 0 for never"),
            );
        }
        if self.reconcile_lookback_secs == 0 || self.reconcile_lookback_secs > MAX_LOOKBACK_SECS {
            found.refuse(
                setting::FENCEHOOK_RECONCILE_LOOKBACK_SECS,
                format!("must be between 1 and {MAX_LOOKBACK_SECS} (30 days: what the PSPs keep)"),
            );
        }
        if self.reconcile_overlap_secs >= self.reconcile_lookback_secs {
            found.refuse(
                setting::FENCEHOOK_RECONCILE_OVERLAP_SECS,
                format!(
                    "must be below {}",
                    setting::FENCEHOOK_RECONCILE_LOOKBACK_SECS
                ),
            );
        }
        if self.reconcile_settle_secs > MAX_SETTLE_SECS {
            found.refuse(
                setting::FENCEHOOK_RECONCILE_SETTLE_SECS,
                format!("must be at most {MAX_SETTLE_SECS} (an hour)"),
            );
        }
        found.finish(Some(()), |()| ReconcileConfig {
            interval: (self.reconcile_interval_secs > 0)
                .then(|| Duration::from_secs(self.reconcile_interval_secs)),
            lookback: Duration::from_secs(self.reconcile_lookback_secs),
            overlap: Duration::from_secs(self.reconcile_overlap_secs),
            settle: Duration::from_secs(self.reconcile_settle_secs),
        })
    }
}
