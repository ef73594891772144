//! What the console's pages show, as data: each handler in [`super::pages`]
//! fills one of these, [`super::views`] renders it as HTML, and the same
//! value answers `Accept: application/json`. Nothing here reads the store or
//! writes HTML.

use serde::Serialize;
use time::OffsetDateTime;

use super::auth::Role;
use super::recent::{AnswerCount, Refusal};
use crate::store::audit::{AuditRun, LastAudit};
use crate::store::console::{DeadGroup, Page, QuarantineSummary};
use crate::store::events::Inspection;
use crate::store::inbox::{Counts, EventRow};
use crate::store::record::PaymentRecord;

/// Inbox events by status (every instance's: from the database), each
/// counted up to [`InboxCounts::cap`]: a count equal to it means at least
/// that many ("10,000+").
#[derive(Debug, Clone, Copy, Serialize)]
pub struct InboxCounts {
    pub queued: i64,
    pub processing: i64,
    pub dead: i64,
    /// [`crate::store::console::COUNT_CAP`].
    pub cap: i64,
}

impl From<Counts> for InboxCounts {
    /// Counts made by [`crate::store::Store::inbox_counts_capped`].
    fn from(c: Counts) -> InboxCounts {
        InboxCounts {
            queued: c.queued,
            processing: c.processing,
            dead: c.dead,
            cap: crate::store::console::COUNT_CAP,
        }
    }
}

/// A count as shown: "1,234", or "10,000+" once it reached its cap.
pub fn counted(n: i64, cap: i64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n >= cap {
        out.push('+');
    }
    out
}

/// What the overview shows.
#[derive(Debug, Serialize)]
pub struct Overview {
    pub role: Role,
    /// `sync` or `inbox`.
    pub mode: &'static str,
    /// This instance's answers per provider and result, last 15 minutes.
    pub answers: Vec<AnswerCount>,
    pub answers_minutes: u64,
    /// From this instance's metrics.
    pub leases_held: f64,
    pub leases_lost: f64,
    pub fence_rejected: f64,
    pub stale_events: f64,
    /// Mean time from acceptance to booking, since start (inbox mode).
    pub inbox_lag_mean_seconds: Option<f64>,
    /// Inbox events by status (from the database: every instance's).
    pub inbox: InboxCounts,
    pub refusals_kept: usize,
    pub recent_refusals: Vec<Refusal>,
    pub quarantine: QuarantineSummary,
    pub refund_rejections: Vec<(String, f64)>,
    pub over_returned: f64,
    /// The last run `fencehook audit` recorded.
    pub audit: AuditView,
    pub latest: Vec<PaymentRecord>,
}

/// A recorded audit older than this is shown as stale: the timer that runs
/// it (docs/operations.md) has stopped, or never started.
pub const AUDIT_STALE_AFTER_SECS: i64 = 24 * 3600;

/// The audit's last result, as the overview shows it.
#[derive(Debug, Serialize)]
pub struct AuditView {
    /// `recorded` (see `last_run`), `never` (no run recorded yet),
    /// `not_migrated` (the schema is before V14: nowhere to record one), or
    /// `unreadable` (the record could not be read).
    pub state: &'static str,
    pub last_run: Option<AuditRun>,
    /// The last run is older than [`AUDIT_STALE_AFTER_SECS`].
    pub stale: bool,
    /// What an operator does about it, when there is anything to do.
    pub note: Option<&'static str>,
}

impl AuditView {
    pub fn unreadable() -> AuditView {
        AuditView {
            state: "unreadable",
            last_run: None,
            stale: false,
            note: Some("the last recorded audit could not be read (the log says why)"),
        }
    }
}

impl From<LastAudit> for AuditView {
    fn from(last: LastAudit) -> AuditView {
        match last {
            LastAudit::Ran(run) => AuditView {
                state: "recorded",
                stale: run.age_seconds > AUDIT_STALE_AFTER_SECS,
                note: (run.age_seconds > AUDIT_STALE_AFTER_SECS).then_some(
                    "older than a day: is the timer that runs `fencehook audit` still running?",
                ),
                last_run: Some(*run),
            },
            LastAudit::Never => AuditView {
                state: "never",
                last_run: None,
                stale: false,
                note: Some("no audit has been recorded: `fencehook audit` records each run; run it periodically (a systemd timer or cron) to keep this fresh"),
            },
            LastAudit::BeforeMigration => AuditView {
                state: "not_migrated",
                last_run: None,
                stale: false,
                note: Some("no audit can be recorded: the schema is before migration V14 (run `fencehook migrate`)"),
            },
        }
    }
}

/// The search form's values, as asked (to fill the form again).
#[derive(Debug, Default, Serialize)]
pub struct SearchForm {
    pub provider: Option<String>,
    pub transaction_id: Option<String>,
    pub status: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SearchView {
    pub form: SearchForm,
    #[serde(flatten)]
    pub page: Page<PaymentRecord>,
    /// The query string of the next page, when there is one.
    pub next_page: Option<String>,
}

/// One line of a payment's timeline.
#[derive(Debug, Clone, Serialize)]
pub struct Moment {
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// `created`, `updated`, `received`, `attempt_failed`, `replayed`,
    /// `done`, `dead`, `ledger`, `delivery` (an answer a delivery was given),
    /// `reconciled` (booked by a reconcile run: its webhook never arrived).
    pub what: &'static str,
    pub transaction_id: String,
    pub text: String,
    /// The lease token (fence) that wrote it, for ledger entries.
    pub token: Option<i64>,
    /// The event this is about, for event lines.
    pub event_id: Option<i64>,
    /// After a ledger entry that moves money out of a payment (or back): the
    /// money out so far (refunds and disputes, net of reversals), in major units.
    pub out_so_far: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PaymentView {
    pub provider: String,
    pub transaction_id: String,
    #[serde(flatten)]
    pub found: Inspection,
    /// Every event, row and ledger entry in arrival order.
    pub timeline: Vec<Moment>,
    /// Operators only: the stored bodies, as received (cut at 64 KiB).
    pub bodies: Option<Vec<(i64, String)>>,
    /// Dead events re-queued by the request that led here.
    pub replayed: Option<i64>,
}

#[derive(Debug, Serialize)]
pub struct EventsView {
    pub status: Option<String>,
    pub provider: Option<String>,
    pub counts: InboxCounts,
    pub dead_groups: Vec<DeadGroup>,
    #[serde(flatten)]
    pub page: Page<EventRow>,
    pub next_page: Option<String>,
    /// Dead events re-queued by the request that led here.
    pub replayed: Option<i64>,
}

#[derive(Debug, Serialize)]
pub struct RefusalsView {
    pub kept_at_most: usize,
    pub refusals: Vec<Refusal>,
}

/// A path segment, percent-encoded (transaction ids may hold `/`, `?`, `#`, …).
pub fn encode_segment(s: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

/// The filter of a replay of many, as asked (also the confirmation's form).
#[derive(Debug, Default, Serialize)]
pub struct ReplayFilter {
    pub provider: Option<String>,
    pub last_error: Option<String>,
    pub since: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ReplayView {
    pub dry_run: bool,
    pub filter: ReplayFilter,
    /// Dead events matching now, counted up to [`super::replay::REPLAY_MAX`]
    /// (dry run; the confirmation replays at most these), or re-queued.
    pub matching: i64,
    /// More than `matching` match (dry run): the confirmation replays the
    /// oldest `matching`, and a second replay the rest.
    pub more: bool,
    /// The database's time of the dry run's count: the confirmation
    /// replays only events dead by then (RFC 3339).
    pub as_of: Option<String>,
    /// Statements the replay took ([`crate::store::events::REPLAY_BATCH`]
    /// events each).
    pub batches: u32,
    /// The first re-queued events (at most [`super::replay::EVENTS_SHOWN`]).
    pub events: Vec<EventRow>,
}

/// A row's status in a payments reader's words: a dispute whose money came
/// back (the merchant won it: the PSP reinstated the funds) is
/// "reinstated", never "failed", which reads as a chargeback lost.
pub fn row_status<'a>(kind: &str, status: &'a str) -> &'a str {
    match (kind, status) {
        ("dispute", "failed") => "reinstated",
        _ => status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_with_thousands_separators_and_a_plus_at_their_cap() {
        assert_eq!(counted(0, 10_000), "0");
        assert_eq!(counted(999, 10_000), "999");
        assert_eq!(counted(1_234, 10_000), "1,234");
        assert_eq!(counted(10_000, 10_000), "10,000+");
        assert_eq!(counted(123_456, 1_000_000), "123,456");
    }

    #[test]
    fn only_a_dispute_reads_reinstated_where_its_row_says_failed() {
        assert_eq!(row_status("dispute", "failed"), "reinstated");
        assert_eq!(row_status("dispute", "succeeded"), "succeeded");
        assert_eq!(row_status("refund", "failed"), "failed");
        assert_eq!(row_status("payment", "failed"), "failed");
    }
}
