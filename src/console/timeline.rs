//! A payment's timeline: its rows created and changed, its events received
//! and their attempts, the answers its deliveries were given, its ledger entries with the fence that wrote each
//! and the money out so far, and the events reconciliation booked (their webhook never arrived), in the order they happened.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::model::{row_status, Moment};
use crate::domain::amount::major_units;
use crate::store::events::Inspection;

/// The timeline of an inspection: rows created and changed, events received
/// and their attempts, ledger entries with the token that wrote them and the
/// running amount out, sorted by time (ties in that order).
pub fn timeline(found: &Inspection) -> Vec<Moment> {
    let mut out: Vec<(OffsetDateTime, u8, Moment)> = Vec::new();
    let moment = |at, what, tx: &str, text: String| Moment {
        at,
        what,
        transaction_id: tx.to_owned(),
        text,
        token: None,
        event_id: None,
        out_so_far: None,
    };
    for row in found.row.iter().chain(&found.children) {
        let created = format!(
            "{} {} of {} recorded",
            row.kind,
            row.transaction_id,
            major_units(row.amount_minor, &row.currency)
        );
        out.push((
            row.created_at,
            0,
            moment(row.created_at, "created", &row.transaction_id, created),
        ));
        if row.updated_at > row.created_at {
            let text = format!(
                "{} is {} (last change, fence {})",
                row.transaction_id,
                row_status(&row.kind, &row.status),
                row.fence
            );
            out.push((
                row.updated_at,
                5,
                moment(row.updated_at, "updated", &row.transaction_id, text),
            ));
        }
    }
    for ev in &found.events {
        let mut m = moment(
            ev.received_at,
            "received",
            &ev.transaction_id,
            format!(
                "event #{} {} received{}",
                ev.id,
                ev.event_type,
                ev.psp_event_id
                    .as_deref()
                    .map(|p| format!(" (PSP id {p})"))
                    .unwrap_or_default()
            ),
        );
        m.event_id = Some(ev.id);
        out.push((ev.received_at, 1, m));
        for entry in ev.errors.as_array().into_iter().flatten() {
            let Some(at) = entry
                .get("at")
                .and_then(|a| a.as_str())
                .and_then(|a| OffsetDateTime::parse(a, &Rfc3339).ok())
            else {
                continue;
            };
            let (what, text) = match (entry.get("replay"), entry.get("error")) {
                (Some(n), _) => (
                    "replayed",
                    format!("event #{} replayed (replay {n})", ev.id),
                ),
                (None, Some(e)) => (
                    "attempt_failed",
                    format!(
                        "event #{} attempt {} failed: {}",
                        ev.id,
                        entry
                            .get("attempt")
                            .map(|a| a.to_string())
                            .unwrap_or_default(),
                        e.as_str().unwrap_or_default()
                    ),
                ),
                _ => continue,
            };
            let mut m = moment(at, what, &ev.transaction_id, text);
            m.event_id = Some(ev.id);
            out.push((at, 2, m));
        }
        if let Some(at) = ev.finished_at {
            let text = match &ev.last_error {
                Some(e) if ev.status == "dead" => format!("event #{} dead: {e}", ev.id),
                _ => format!("event #{} {}", ev.id, ev.status),
            };
            let what = if ev.status == "dead" { "dead" } else { "done" };
            let mut m = moment(at, what, &ev.transaction_id, text);
            m.event_id = Some(ev.id);
            out.push((at, 4, m));
        }
    }
    // The answers its deliveries were given (both modes): an answer
    // follows its commit, so a tie sorts it after what it booked.
    for d in &found.deliveries {
        let text = format!(
            "delivery {} {} answered {} {}{}{}",
            d.transaction_id,
            d.event_type,
            d.status,
            d.result,
            d.reason
                .as_deref()
                .map(|r| format!(" {r}"))
                .unwrap_or_default(),
            d.psp_event_id
                .as_deref()
                .map(|p| format!(" (PSP id {p})"))
                .unwrap_or_default()
        );
        out.push((
            d.answered_at,
            6,
            moment(d.answered_at, "delivery", &d.transaction_id, text),
        ));
    }
    // What reconciliation booked: its webhook never arrived. Dated when the
    // run was recorded, so it follows what the run booked.
    for r in &found.recovered {
        out.push((
            r.found_at,
            7,
            moment(r.found_at, "reconciled", &r.transaction_id, r.describe()),
        ));
    }
    let mut ledger: Vec<_> = found.entries.iter().collect();
    ledger.sort_by_key(|e| e.created_at);
    let mut money_out: i64 = 0;
    let payment = found.row.as_ref().filter(|r| r.kind == "payment");
    for e in ledger {
        let mut m = moment(
            e.created_at,
            "ledger",
            &e.transaction_id,
            format!(
                "{} {} booked",
                e.effect,
                major_units(e.amount_minor, &e.currency)
            ),
        );
        m.token = Some(e.fence);
        if let Some(p) = payment.filter(|_| e.effect != "credit") {
            money_out -= e.amount_minor;
            m.out_so_far = Some(format!(
                "{} of {}",
                major_units(money_out, &p.currency),
                major_units(p.amount_minor, &p.currency)
            ));
        }
        out.push((e.created_at, 3, m));
    }
    out.sort_by_key(|a| (a.0, a.1));
    out.into_iter().map(|(_, _, m)| m).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_runs_the_money_out_through_refunds_reversals_and_disputes_in_time_order() {
        use crate::store::events::EntryView;
        use crate::store::record::PaymentRecord;
        let t =
            |s: &str| OffsetDateTime::parse(&format!("2026-01-31T12:00:{s}Z"), &Rfc3339).unwrap();
        let row = PaymentRecord {
            id: 1,
            provider: "generic".into(),
            transaction_id: "pay".into(),
            kind: "payment".into(),
            parent_transaction_id: None,
            status: "succeeded".into(),
            event_type: "payment.succeeded".into(),
            amount_minor: 10000,
            amount: None,
            currency: "EUR".into(),
            amount_out_minor: 0,
            amount_out: None,
            fence: 4,
            created_at: t("00"),
            updated_at: t("00"),
        };
        let entry = |tx: &str, effect: &str, minor: i64, at: &str, fence: i64| EntryView {
            transaction_id: tx.into(),
            effect: effect.into(),
            amount_minor: minor,
            amount: None,
            currency: "EUR".into(),
            fence,
            created_at: t(at),
        };
        let found = Inspection {
            row: Some(row),
            children: vec![],
            // Listed out of time order: the timeline sorts them.
            deliveries: vec![],
            recovered: vec![],
            entries: vec![
                entry("dp", "dispute", -5000, "04", 2),
                entry("pay", "credit", 10000, "01", 1),
                entry("re", "debit", -2050, "02", 1),
                entry("re", "refund_reversal", 2050, "03", 2),
            ],
            events: vec![],
        };
        let ledger: Vec<(String, Option<i64>, Option<String>)> = timeline(&found)
            .into_iter()
            .filter(|m| m.what == "ledger")
            .map(|m| (m.text, m.token, m.out_so_far))
            .collect();
        let out = |s: &str| Some(format!("{s} EUR of 100.00 EUR"));
        assert_eq!(
            ledger,
            [
                ("credit 100.00 EUR booked".to_owned(), Some(1), None),
                ("debit -20.50 EUR booked".to_owned(), Some(1), out("20.50")),
                (
                    "refund_reversal 20.50 EUR booked".to_owned(),
                    Some(2),
                    out("0.00")
                ),
                (
                    "dispute -50.00 EUR booked".to_owned(),
                    Some(2),
                    out("50.00")
                ),
            ]
        );
    }
}
