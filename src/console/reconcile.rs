//! `/console/reconcile`: what the reconciliation did lately — the last runs
//! of each provider (when, window, counts, error), the events it booked
//! because their webhook never arrived (each linked to its payment's page),
//! and the divergences it found and wrote nowhere. Read from the
//! reconciliation's tables ([`crate::store::reconcile`]; before migration
//! V17 the page is a 503 saying the database could not be read).

use maud::{html, Markup};
use serde::Serialize;

use super::answer::{show, unavailable, Answer};
use super::auth::Session;
use super::{views, Ask, Console};
use crate::store::reconcile::{FindingRow, RunRow};

/// Runs shown per provider.
const RUNS: i64 = 10;
/// Findings shown of each kind.
const FINDINGS: i64 = 100;

#[derive(Serialize)]
pub struct ReconcileView {
    pub runs: Vec<RunRow>,
    pub recovered: Vec<FindingRow>,
    pub divergent: Vec<FindingRow>,
}

pub async fn page(console: &Console, ask: &Ask, session: &Session) -> Answer {
    let store = &console.store;
    let failed = |e| unavailable(ask, session, &e);
    let view = ReconcileView {
        runs: store.reconcile_runs(RUNS).await.map_err(failed)?,
        recovered: store
            .reconcile_findings("recovered", FINDINGS)
            .await
            .map_err(failed)?,
        divergent: store
            .reconcile_findings("divergent", FINDINGS)
            .await
            .map_err(failed)?,
    };
    Ok(show(ask, &view, |v| view_of(session, v)))
}

fn view_of(session: &Session, v: &ReconcileView) -> Markup {
    let t = |t: &time::OffsetDateTime| views::when(t);
    views::layout(
        Some(session),
        "Reconciliation",
        html! {
            h1 { "Reconciliation" }
            p { "Each provider's events, listed through its PSP's API and booked as their webhooks would be. "
                "Recovered: booked by a run, its webhook never arrived. Divergent: the PSP's record contradicts what is booked; nothing was written." }
            h2 { "Last runs" }
            @if v.runs.is_empty() { p { "No run recorded yet." } } @else {
                table {
                    thead { tr { th { "Provider" } th { "Started" } th { "By" } th { "Window" }
                        th.num { "Listed" } th.num { "Known" } th.num { "Recovered" } th.num { "Ignored" }
                        th.num { "Refused" } th.num { "Divergent" } th { "Error" } } }
                    tbody { @for r in &v.runs { tr {
                        td { (r.provider) } td { (t(&r.started_at)) } td { (r.trigger) }
                        td { (t(&r.window_since)) " – " (t(&r.window_until)) }
                        td.num { (r.counts.listed) } td.num { (r.counts.known) } td.num { (r.counts.recovered) }
                        td.num { (r.counts.ignored) } td.num { (r.counts.refused) } td.num { (r.counts.divergent) }
                        td { (r.error.clone().unwrap_or_default()) }
                    } } }
                }
            }
            h2 { "Recovered events" }
            (findings(&v.recovered))
            h2 { "Divergences" }
            (findings(&v.divergent))
        },
    )
}

fn findings(rows: &[FindingRow]) -> Markup {
    html! {
        @if rows.is_empty() { p { "None." } } @else {
            table {
                thead { tr { th { "Found" } th { "Provider" } th { "PSP event" } th { "Payment" } th { "Reason" } } }
                tbody { @for f in rows { tr {
                    td { (views::when(&f.found_at)) } td { (f.provider) } td { code { (f.psp_event_id) } }
                    td { @if let Some(tx) = &f.transaction_id {
                        a href=(views::payment_href(&f.provider, tx)) { (tx) }
                    } }
                    td { (f.reason.clone().unwrap_or_default()) }
                } } }
            }
        }
    }
}
