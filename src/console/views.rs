//! The console's HTML, as maud templates: checked when fencehook compiles,
//! and every value spliced in with `(value)` is HTML-escaped. Nothing here
//! uses `PreEscaped` on data. No page carries a script: forms and links do
//! everything, so the pages work with JavaScript off (and the CSP forbids it).

use hyper::StatusCode;
use maud::{html, Markup, DOCTYPE};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::auth::{Role, Session};
use super::model::{
    counted, encode_segment, row_status, AuditView, EventsView, Moment, Overview, PaymentView,
    RefusalsView, ReplayView, SearchView,
};
use crate::config::setting;
use crate::domain::amount::major_units;
use crate::store::console::{EVENT_STATUSES, PAYMENT_STATUSES};
use crate::store::inbox::EventRow;
use crate::store::record::PaymentRecord;

/// The console's stylesheet (served at `/console/style.css`: the CSP allows
/// no inline style).
pub const STYLE: &str = include_str!("style.css");

/// A time for people: UTC, to the second.
pub fn when(t: &OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let text = t.format(&Rfc3339).unwrap_or_default();
    let text = text
        .split('.')
        .next()
        .unwrap_or(&text)
        .trim_end_matches('Z');
    format!("{} UTC", text.replacen('T', " ", 1))
}

/// [`when`] with milliseconds, for the lines of a timeline that share a
/// second: without them their order reads as arbitrary.
pub fn when_ms(t: &OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let text = when(&t);
    let seconds = text.trim_end_matches(" UTC");
    format!("{seconds}.{:03} UTC", t.millisecond())
}

/// How long ago, for people: the largest whole unit (`42 seconds ago`,
/// `3 minutes ago`, `2 hours ago`, `5 days ago`).
pub fn ago(secs: i64) -> String {
    let secs = secs.max(0);
    let (n, unit) = match secs {
        0..=119 => (secs, "second"),
        120..=7_199 => (secs / 60, "minute"),
        7_200..=172_799 => (secs / 3600, "hour"),
        _ => (secs / 86_400, "day"),
    };
    format!("{n} {unit}{} ago", if n == 1 { "" } else { "s" })
}

fn when_unix(secs: i64) -> String {
    OffsetDateTime::from_unix_timestamp(secs)
        .map(|t| when(&t))
        .unwrap_or_default()
}

pub(super) fn payment_href(provider: &str, transaction_id: &str) -> String {
    format!(
        "/console/payments/{}/{}",
        encode_segment(provider),
        encode_segment(transaction_id)
    )
}

fn badge(status: &str) -> Markup {
    html! { span class={ "badge s-" (status) } { (status) } }
}

/// The page around every signed-in view.
pub(super) fn layout(session: Option<&Session>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · fencehook console" }
                link rel="stylesheet" href="/console/style.css";
            }
            body {
                header {
                    span.brand { "fencehook" }
                    @if session.is_some() {
                        nav {
                            a href="/console" { "Overview" }
                            a href="/console/payments" { "Payments" }
                            a href="/console/events?status=dead" { "Dead events" }
                            a href="/console/events" { "Inbox" }
                            a href="/console/refusals" { "Refusals" }
                            a href="/console/reconcile" { "Reconciliation" }
                        }
                    }
                    @if let Some(s) = session {
                        div.who {
                            span { "signed in as " strong { (s.role.as_str()) } }
                            @if let Some(csrf) = &s.csrf {
                                form method="post" action="/console/logout" {
                                    input type="hidden" name="csrf" value=(csrf);
                                    button type="submit" { "Sign out" }
                                }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

pub fn login(message: Option<&str>) -> Markup {
    layout(
        None,
        "Sign in",
        html! {
            div.login {
                h1 { "Operator console" }
                @if let Some(m) = message { p.error { (m) } }
                form method="post" action="/console/login" {
                    label for="token" { "Token (the viewer's or the operator's)" }
                    input type="password" id="token" name="token" autocomplete="current-password" required autofocus;
                    button.primary type="submit" { "Sign in" }
                }
                p.muted { "A session lasts 12 hours, or until its token file changes." }
            }
        },
    )
}

pub fn failure(session: Option<&Session>, status: StatusCode, message: &str) -> Markup {
    layout(
        session,
        status.canonical_reason().unwrap_or("Error"),
        html! {
            h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
            p.error { (message) }
            p { a href="/console" { "Back to the overview" } }
        },
    )
}

fn card(label: &str, value: impl std::fmt::Display) -> Markup {
    html! { div.card { div.label { (label) } div.value { (value.to_string()) } } }
}

fn payments_table(rows: &[PaymentRecord]) -> Markup {
    html! {
        table {
            thead { tr { th { "Created" } th { "Provider" } th { "Transaction" } th { "Kind" } th { "Status" } th.num { "Amount" } th.num { "Fence" } } }
            tbody {
                @for r in rows {
                    tr {
                        td { (when(&r.created_at)) }
                        td { (r.provider) }
                        td.mono { a href=(payment_href(&r.provider, &r.transaction_id)) { (r.transaction_id) } }
                        td { (r.kind) @if let Some(p) = &r.parent_transaction_id { " of " a.mono href=(payment_href(&r.provider, p)) { (p) } } }
                        td { (badge(row_status(&r.kind, &r.status))) }
                        td.num { (major_units(r.amount_minor, &r.currency)) }
                        td.num { (r.fence) }
                    }
                }
                @if rows.is_empty() { tr { td colspan="7" .muted { "No payment matches." } } }
            }
        }
    }
}

pub fn overview(session: &Session, v: &Overview) -> Markup {
    layout(
        Some(session),
        "Overview",
        html! {
            h1 { "Overview" span.muted { " · " (v.mode) " mode" } }
            div.cards {
                (card("Inbox queued", counted(v.inbox.queued, v.inbox.cap)))
                (card("Inbox processing", counted(v.inbox.processing, v.inbox.cap)))
                (card("Inbox dead", counted(v.inbox.dead, v.inbox.cap)))
                (card("Mean inbox lag (s)", v.inbox_lag_mean_seconds.map(|s| format!("{s:.3}")).unwrap_or_else(|| "–".to_owned())))
                (card("Leases held now", v.leases_held))
                (card("Leases lost", v.leases_lost))
                (card("Fence-rejected writes", v.fence_rejected))
                (card("Stale events", v.stale_events))
                (card("Quarantined items", v.quarantine.items))
                (card("Refusals kept", v.refusals_kept))
                (card("Over-returned payments", v.over_returned))
            }
            @if v.inbox.dead > 0 {
                p.warn { (counted(v.inbox.dead, v.inbox.cap)) " dead event(s) wait for a replay: " a href="/console/events?status=dead" { "see them grouped by error" } }
            }
            @if v.audit.last_run.as_ref().is_some_and(|r| !r.clean) {
                p.error { "The last audit found violations: " a href="#audit" { "see which checks" } }
            }
            h2 { "Answers of this instance, last " (v.answers_minutes) " minutes" }
            table {
                thead { tr { th { "Provider" } th { "Result" } th.num { "Answers" } } }
                tbody {
                    @for a in &v.answers { tr { td { (a.provider) } td { (a.result) } td.num { (a.count) } } }
                    @if v.answers.is_empty() { tr { td colspan="3" .muted { "No delivery in that time." } } }
                }
            }
            h2 { "Refund rejections (since start)" }
            table {
                thead { tr { th { "Reason" } th.num { "Count" } } }
                tbody { @for (reason, n) in &v.refund_rejections { tr { td { (reason) } td.num { (n) } } } }
            }
            h2 { "Latest refusals" }
            (refusals_table(&v.recent_refusals))
            p { a href="/console/refusals" { "All refusals kept" } }
            h2 { "Latest payments" }
            (payments_table(&v.latest))
            h2 id="audit" { "Audit" }
            (audit_panel(&v.audit))
            @if let Some(at) = v.quarantine.last_seen_at { p.muted { "Last quarantined item seen " (when(&at)) "." } }
        },
    )
}

/// The last recorded run of `fencehook audit`: when, clean or the checks
/// it found violated, its warnings; or why there is none.
fn audit_panel(a: &AuditView) -> Markup {
    html! {
        @if let Some(run) = &a.last_run {
            p.audit-result {
                @if run.clean { (badge("clean")) } @else { span class="badge s-violations" { "VIOLATIONS" } }
                @if a.stale { " " (badge("stale")) }
                " last run finished " (when(&run.finished_at)) " (" (ago(run.age_seconds)) ")"
                @if let Some(host) = &run.host { " on " code { (host) } }
                ", took " (run.duration_ms) " ms, read " (run.payments) " payments and "
                (run.ledger_entries) " ledger entries"
                @if run.with_answers { ", with a load run's answers" }
                "."
            }
            @if let Some(note) = a.note { p.warn { (note) } }
            @if !run.clean {
                table {
                    thead { tr { th { "Violated check" } th.num { "Offenders" } } }
                    tbody {
                        @for c in run.checks.iter().filter(|c| c.violations > 0) {
                            tr {
                                td.mono { (c.name) }
                                td.num { (c.violations) @if c.at_least { " or more" } }
                            }
                        }
                    }
                }
                p.muted { "Run " code { "fencehook audit" } " to list the offenders." }
            }
            table {
                thead { tr { th { "Warning (not a violation)" } th.num { "Count" } } }
                tbody {
                    tr { td { "Payments that gave back more than came in (disputes past the amount)" } td.num { (run.over_returned_payments) } }
                    tr { td { "Refunds from before refunds named their payment (not checked against one)" } td.num { (run.legacy_refunds) } }
                }
            }
        } @else {
            p.warn { (a.note.unwrap_or("no audit has been recorded")) }
        }
    }
}

pub fn search(session: &Session, v: &SearchView) -> Markup {
    let f = &v.form;
    let val = |o: &Option<String>| o.clone().unwrap_or_default();
    layout(
        Some(session),
        "Payments",
        html! {
            h1 { "Payments" }
            form.filters method="get" action="/console/payments" {
                label { "Provider" input name="provider" value=(val(&f.provider)) placeholder="any"; }
                label { "Transaction id or prefix" input name="transaction_id" value=(val(&f.transaction_id)) size="28"; }
                label { "Status"
                    select name="status" {
                        option value="" { "any" }
                        @for s in PAYMENT_STATUSES { option value=(s) selected[f.status.as_deref() == Some(s)] { (s) } }
                    }
                }
                label { "Since (UTC, or 2h)" input name="since" value=(val(&f.since)) size="18"; }
                label { "Until" input name="until" value=(val(&f.until)) size="18"; }
                button.primary type="submit" { "Search" }
            }
            @if v.page.truncated {
                p.warn { "More than 1,000 transaction ids start with this prefix: only the first 1,000 (in byte order) were searched. Give a longer prefix." }
            }
            (payments_table(&v.page.rows))
            @if let Some(next) = &v.next_page {
                p.pager { a href={ "/console/payments?" (next) } { "Older →" } }
            }
        },
    )
}

fn row_summary(r: &PaymentRecord) -> Markup {
    html! {
        dl.summary {
            dt { "Status" } dd { (badge(row_status(&r.kind, &r.status))) " by " code { (r.event_type) } }
            dt { "Amount" } dd.amount { (major_units(r.amount_minor, &r.currency)) }
            @if r.kind == "payment" {
                dt { "Refunded or disputed (net)" } dd { (major_units(r.amount_out_minor, &r.currency)) }
            }
            dt { "Kind" } dd { (r.kind) }
            @if let Some(p) = &r.parent_transaction_id {
                dt { "Payment" } dd { a.mono href=(payment_href(&r.provider, p)) { (p) } }
            }
            dt { "Fence (last lease token)" } dd.mono { (r.fence) }
            dt { "Recorded" } dd { (when(&r.created_at)) }
            dt { "Last change" } dd { (when(&r.updated_at)) }
        }
    }
}

fn replay_button(session: &Session, ev: &EventRow, back: &str) -> Markup {
    html! {
        @if session.role == Role::Operator && ev.status == "dead" {
            @if let Some(csrf) = &session.csrf {
                form method="post" action={ "/console/events/" (ev.id) "/replay" } {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="back" value=(back);
                    button.replay type="submit" { "Replay" }
                }
            } @else {
                span.muted { "replay: POST /console/events/" (ev.id) "/replay" }
            }
        }
    }
}

fn events_table(session: &Session, rows: &[EventRow], back: &str) -> Markup {
    html! {
        table {
            thead { tr { th { "#" } th { "Received" } th { "Provider" } th { "Transaction" } th { "Event" } th { "Status" } th.num { "Attempts" } th { "Last error" } th { "" } } }
            tbody {
                @for e in rows {
                    tr {
                        td.mono { (e.id) }
                        td { (when(&e.received_at)) }
                        td { (e.provider) }
                        td.mono { a href=(payment_href(&e.provider, &e.transaction_id)) { (e.transaction_id) } }
                        td.mono { (e.event_type) }
                        td { (badge(&e.status)) }
                        td.num { (e.attempts) @if e.replays > 0 { span.muted { " (replayed " (e.replays) "×)" } } }
                        td { @if let Some(err) = &e.last_error { (err) } }
                        td { (replay_button(session, e, back)) }
                    }
                }
                @if rows.is_empty() { tr { td colspan="9" .muted { "No event." } } }
            }
        }
    }
}

pub fn payment(session: &Session, v: &PaymentView) -> Markup {
    let here = payment_href(&v.provider, &v.transaction_id);
    let found = &v.found;
    layout(
        Some(session),
        &v.transaction_id,
        html! {
            h1 { span.muted { (v.provider) " / " } span.mono { (v.transaction_id) } }
            @if let Some(n) = v.replayed { p.notice { "Replay asked: " (n) " dead event(s) re-queued." } }
            @match &found.row {
                Some(r) => (row_summary(r)),
                None => p.warn { "No payments row (yet): only events are stored." },
            }
            @if !found.children.is_empty() {
                h2 { "Refunds and disputes" }
                table {
                    thead { tr { th { "Transaction" } th { "Kind" } th { "Status" } th.num { "Amount" } th.num { "Fence" } th { "Recorded" } } }
                    tbody {
                        @for c in &found.children {
                            tr {
                                td.mono { a href=(payment_href(&c.provider, &c.transaction_id)) { (c.transaction_id) } }
                                td { (c.kind) } td { (badge(row_status(&c.kind, &c.status))) }
                                td.num { (major_units(c.amount_minor, &c.currency)) }
                                td.num { (c.fence) } td { (when(&c.created_at)) }
                            }
                        }
                    }
                }
            }
            h2 { "Ledger" }
            table {
                thead { tr { th { "Booked" } th { "Transaction" } th { "Effect" } th.num { "Amount" } th.num { "Written by lease token" } } }
                tbody {
                    @for e in &found.entries {
                        tr { td { (when(&e.created_at)) } td.mono { (e.transaction_id) } td { (e.effect) } td.num { (major_units(e.amount_minor, &e.currency)) } td.num { (e.fence) } }
                    }
                    @if found.entries.is_empty() { tr { td colspan="5" .muted { "No ledger entry." } } }
                }
            }
            h2 { "Timeline" }
            ol.timeline {
                @for (i, m) in v.timeline.iter().enumerate() {
                    li class={ "t-" (m.what) } {
                        span.when { @if shares_a_second(&v.timeline, i) { (when_ms(&m.at)) } @else { (when(&m.at)) } }
                        (m.text)
                        @if let Some(t) = m.token { span.tok { "lease token " (t) } }
                        @if let Some(o) = &m.out_so_far { span.tok { "· out so far " (o) } }
                    }
                }
            }
            h2 { "Deliveries and their answers" }
            table {
                thead { tr { th { "Answered" } th { "Transaction" } th { "Event type" } th { "PSP event id" } th.num { "Status" } th { "Result" } } }
                tbody {
                    @for d in &found.deliveries {
                        tr {
                            td { (when(&d.answered_at)) } td.mono { (d.transaction_id) } td { (d.event_type) }
                            td.mono { (d.psp_event_id.as_deref().unwrap_or("—")) } td.num { (d.status) }
                            td { (d.result) @if let Some(r) = &d.reason { " " (r) } }
                        }
                    }
                    @if found.deliveries.is_empty() { tr { td colspan="6" .muted { "No delivery recorded (kept for " (setting::FENCEHOOK_EVENT_RETENTION_DAYS) "; off with " (setting::FENCEHOOK_DELIVERY_HISTORY) "=false)." } } }
                }
            }
            h2 { "Events and attempts" }
            (events_table(session, &found.events, &here))
            @if let Some(bodies) = &v.bodies {
                h2 { "Stored bodies (operators only)" }
                @for (id, body) in bodies {
                    @if body.is_empty() {
                        details { summary { "event #" (id) " (erased)" } p.muted { "Emptied by fencehook erase; the row and the ledger are kept." } }
                    } @else {
                        details { summary { "event #" (id) } pre.body { (body) } }
                    }
                }
            }
        },
    )
}

/// Whether another line of the timeline falls in the second of line `i`
/// (the timeline is in time order: a neighbour would).
fn shares_a_second(timeline: &[Moment], i: usize) -> bool {
    let second = |j: usize| timeline.get(j).map(|m| m.at.unix_timestamp());
    let own = second(i);
    (i > 0 && second(i - 1) == own) || second(i + 1) == own
}

pub fn events(session: &Session, v: &EventsView) -> Markup {
    let mut back = String::from("/console/events");
    if let Some(s) = &v.status {
        back.push_str(&format!("?status={s}"));
    }
    layout(
        Some(session),
        "Inbox events",
        html! {
            h1 { "Inbox events" @if let Some(s) = &v.status { " · " (s) } }
            @if let Some(n) = v.replayed { p.notice { "Replay done: " (n) " dead event(s) re-queued." } }
            div.cards {
                (card("Queued", counted(v.counts.queued, v.counts.cap)))
                (card("Processing", counted(v.counts.processing, v.counts.cap)))
                (card("Dead", counted(v.counts.dead, v.counts.cap)))
            }
            form.filters method="get" action="/console/events" {
                label { "Status"
                    select name="status" {
                        option value="" { "any" }
                        @for s in EVENT_STATUSES { option value=(s) selected[v.status.as_deref() == Some(s)] { (s) } }
                    }
                }
                label { "Provider" input name="provider" value=(v.provider.clone().unwrap_or_default()) placeholder="any"; }
                button.primary type="submit" { "Show" }
            }
            @if !v.dead_groups.is_empty() {
                h2 { "Dead events by last error" }
                table {
                    thead { tr { th { "Provider" } th { "Last error" } th.num { "Events" } th { "Received" } th { "" } } }
                    tbody {
                        @for g in &v.dead_groups {
                            tr {
                                td { (g.provider) }
                                td { @match &g.last_error { Some(e) => (e), None => span.muted { "(none)" } } }
                                td.num { (g.events) }
                                td { (when(&g.first_received_at)) " – " (when(&g.last_received_at)) }
                                td {
                                    @if session.role == Role::Operator {
                                        @if let Some(csrf) = &session.csrf {
                                            form method="post" action="/console/events/replay" {
                                                input type="hidden" name="csrf" value=(csrf);
                                                input type="hidden" name="provider" value=(g.provider);
                                                @if let Some(e) = &g.last_error { input type="hidden" name="last_error" value=(e); }
                                                input type="hidden" name="dry_run" value="true";
                                                button.replay-many type="submit" { "Replay these…" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Events" }
            @if v.page.truncated { p.warn { "Only the newest 10,000 events of this status were looked through for this provider." } }
            (events_table(session, &v.page.rows, &back))
            @if let Some(next) = &v.next_page { p.pager { a href={ "/console/events?" (next) } { "More →" } } }
        },
    )
}

pub fn replay_confirm(session: &Session, v: &ReplayView) -> Markup {
    let f = &v.filter;
    layout(
        Some(session),
        "Replay",
        html! {
            h1 { "Replay dead events" }
            dl.summary {
                dt { "Provider" } dd { (f.provider.clone().unwrap_or_else(|| "any".to_owned())) }
                dt { "Last error" } dd { (f.last_error.clone().unwrap_or_else(|| "any".to_owned())) }
                dt { "Received since" } dd { (f.since.clone().unwrap_or_else(|| "any time".to_owned())) }
                dt { "Dead events matching now" } dd.amount { (v.matching) @if v.more { "+" } }
            }
            @if v.more {
                p.warn { "More than " (v.matching) " match: this replays the oldest " (v.matching) "; ask again for the rest." }
            }
            @if v.matching > 0 {
                @if let Some(csrf) = &session.csrf {
                    form method="post" action="/console/events/replay" {
                        input type="hidden" name="csrf" value=(csrf);
                        @if let Some(p) = &f.provider { input type="hidden" name="provider" value=(p); }
                        @if let Some(e) = &f.last_error { input type="hidden" name="last_error" value=(e); }
                        @if let Some(s) = &f.since { input type="hidden" name="since" value=(s); }
                        input type="hidden" name="count" value=(v.matching);
                        @if let Some(t) = &v.as_of { input type="hidden" name="as_of" value=(t); }
                        input type="hidden" name="dry_run" value="false";
                        p { button.replay type="submit" { "Replay " (v.matching) " event(s)" } }
                    }
                }
                p.muted { "Each is re-queued once: one already re-queued or booked is not touched again. Events that die after this count are not replayed by it." }
            } @else {
                p { "Nothing to replay." }
            }
            p { a href="/console/events?status=dead" { "Back to the dead events" } }
        },
    )
}

fn refusals_table(rows: &[super::recent::Refusal]) -> Markup {
    html! {
        table {
            thead { tr { th { "When" } th { "Provider" } th { "Answer" } th { "What failed" } th { "Peer" } } }
            tbody {
                @for r in rows {
                    tr {
                        td { (when_unix(r.at)) }
                        td { (r.provider) }
                        td { (r.status) " " code { (r.result) } }
                        td { (r.reason.clone().unwrap_or_default()) }
                        td.mono { (r.peer.clone().unwrap_or_default()) }
                    }
                }
                @if rows.is_empty() { tr { td colspan="5" .muted { "No refused delivery kept." } } }
            }
        }
    }
}

pub fn refusals(session: &Session, v: &RefusalsView) -> Markup {
    layout(
        Some(session),
        "Refusals",
        html! {
            h1 { "Refused deliveries" }
            p.muted { "The last " (v.kept_at_most) " refused by this instance, newest first, kept in memory: when, which provider, the answer, what failed, and the peer's address (behind a proxy, the proxy's). Never the body or a signature." }
            (refusals_table(&v.refusals))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::audit::{AuditRun, CheckCount, LastAudit};

    #[test]
    fn times_in_a_shared_second_show_milliseconds() {
        let t = OffsetDateTime::from_unix_timestamp_nanos(1_700_000_000_042_900_000).unwrap();
        assert_eq!(when(&t), "2023-11-14 22:13:20 UTC");
        assert_eq!(when_ms(&t), "2023-11-14 22:13:20.042 UTC");
    }

    fn run(age_seconds: i64, violations: i64) -> AuditRun {
        AuditRun {
            id: 7,
            finished_at: OffsetDateTime::UNIX_EPOCH,
            age_seconds,
            duration_ms: 12,
            clean: violations == 0,
            checks: vec![
                CheckCount {
                    name: "one_row_per_transaction".into(),
                    violations: 0,
                    at_least: false,
                },
                CheckCount {
                    name: "money_out_within_money_in".into(),
                    violations,
                    at_least: violations >= 20,
                },
            ],
            over_returned_payments: 3,
            legacy_refunds: 0,
            payments: 10,
            ledger_entries: 9,
            host: Some("<fh1>".into()),
            version: "0.1.0".into(),
            with_answers: false,
        }
    }

    #[test]
    fn ages_read_in_the_largest_whole_unit() {
        assert_eq!(ago(0), "0 seconds ago");
        assert_eq!(ago(1), "1 second ago");
        assert_eq!(ago(119), "119 seconds ago");
        assert_eq!(ago(120), "2 minutes ago");
        assert_eq!(ago(7_199), "119 minutes ago");
        assert_eq!(ago(7_200), "2 hours ago");
        assert_eq!(ago(90_000), "25 hours ago");
        assert_eq!(ago(172_800), "2 days ago");
        assert_eq!(ago(-5), "0 seconds ago", "a clock a little ahead");
    }

    #[test]
    fn the_audit_panel_names_each_violated_check_marks_a_day_old_run_stale_and_escapes_the_host() {
        let fresh: AuditView = LastAudit::Ran(Box::new(run(60, 0))).into();
        assert!(!fresh.stale);
        let html = audit_panel(&fresh).into_string();
        assert!(
            html.contains("s-clean") && !html.contains("s-stale"),
            "{html}"
        );
        assert!(
            html.contains("&lt;fh1&gt;") && !html.contains("<fh1>"),
            "{html}"
        );

        let old: AuditView = LastAudit::Ran(Box::new(run(86_401, 25))).into();
        assert!(old.stale);
        let html = audit_panel(&old).into_string();
        assert!(
            html.contains("VIOLATIONS") && html.contains("s-stale"),
            "{html}"
        );
        assert!(html.contains("money_out_within_money_in"), "{html}");
        assert!(
            !html.contains("one_row_per_transaction"),
            "only violated checks: {html}"
        );
        assert!(html.contains("25 or more"), "{html}");

        let never: AuditView = LastAudit::Never.into();
        assert_eq!(never.state, "never");
        let html = audit_panel(&never).into_string();
        assert!(
            html.contains("no audit has been recorded") && html.contains("fencehook audit"),
            "{html}"
        );
        let before: AuditView = LastAudit::BeforeMigration.into();
        assert!(audit_panel(&before)
            .into_string()
            .contains("fencehook migrate"));
    }
}
