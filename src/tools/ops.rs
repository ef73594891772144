//! The operators' commands of inbox mode: `inspect`, `replay`, `events`,
//! `prune`. Each reads or changes the database only; the service need not run.

use clap::Args;
use fencehook::config::{setting, DbArgs};
use fencehook::domain::amount::major_units;
use fencehook::store::console::EVENT_STATUSES;
use fencehook::store::events::{EventFilter, Inspection, Replay};
use fencehook::store::history::DeliveryRow;
use fencehook::store::inbox::EventRow;
use fencehook::store::Store;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// `fencehook inspect`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The provider's name (its path, /webhooks/<name>).
    #[arg(long)]
    pub provider: String,
    /// The transaction (a payment's, or a refund's or dispute's own id).
    #[arg(long)]
    pub transaction_id: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `fencehook replay`.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Which provider: with --transaction-id, the one of that transaction;
    /// with --dead, replay only this provider's dead events. Alone it
    /// replays nothing (say --transaction-id or --dead).
    #[arg(long)]
    pub provider: Option<String>,
    /// Replay the dead events of this transaction (needs --provider).
    #[arg(long, requires = "provider")]
    pub transaction_id: Option<String>,
    /// Replay every dead event (of --provider, when given).
    #[arg(long, conflicts_with = "transaction_id")]
    pub dead: bool,
    /// With --dead: only events received since then (RFC 3339, or an age like 2h).
    #[arg(long, requires = "dead", value_parser = parse_time)]
    pub since: Option<OffsetDateTime>,
}

/// `fencehook events`.
#[derive(Debug, Clone, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Only this provider's events.
    #[arg(long)]
    pub provider: Option<String>,
    /// The transaction, or the payment whose refunds and disputes to list.
    #[arg(long)]
    pub transaction_id: Option<String>,
    /// Received since (RFC 3339, or an age like 2h).
    #[arg(long, value_parser = parse_time)]
    pub since: Option<OffsetDateTime>,
    /// Received before (RFC 3339, or an age like 30m).
    #[arg(long, value_parser = parse_time)]
    pub until: Option<OffsetDateTime>,
    /// Only events in this status, spelled exactly (anything else is
    /// refused, naming the statuses: a typo must not read as "none").
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(EVENT_STATUSES))]
    pub status: Option<String>,
    /// At most this many events, newest first (1 to 100000).
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `fencehook prune`.
#[derive(Debug, Clone, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Keep events received within this many days.
    #[arg(long, env = setting::FENCEHOOK_EVENT_RETENTION_DAYS, default_value_t = 30)]
    pub event_retention_days: u64,
    /// Delete dead events past retention too (kept by default: they wait for a replay).
    #[arg(long)]
    pub dead: bool,
    /// Print what would be deleted (counts) and delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// An RFC 3339 time, or an age (`2h`, `30m`) counted back from now.
pub fn parse_time(text: &str) -> Result<OffsetDateTime, String> {
    if let Ok(t) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(t);
    }
    let ago = humantime::parse_duration(text)
        .map_err(|_| format!("`{text}` is neither an RFC 3339 time nor an age like 2h"))?;
    fencehook::config::time_before(OffsetDateTime::now_utc(), ago)
        .ok_or_else(|| format!("`{text}` reaches back before any date"))
}

fn store(db: &DbArgs) -> Result<Store, String> {
    let cfg = db
        .validate()
        .map_err(|e| format!("invalid configuration: {e}"))?;
    Store::new(&cfg).map_err(|e| fencehook::report::chain(&e))
}

fn db_error(e: impl std::error::Error + 'static) -> String {
    format!("database: {}", fencehook::report::chain(&e))
}

pub async fn inspect(args: &InspectArgs) -> Result<bool, String> {
    let found = store(&args.db)?
        .inspect(&args.provider, &args.transaction_id)
        .await
        .map_err(db_error)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&found).map_err(|e| e.to_string())?
        );
        return Ok(found.is_known());
    }
    print!(
        "{}",
        inspection_text(&found, &args.provider, &args.transaction_id)
    );
    Ok(found.is_known())
}

/// `inspect`'s text: amounts in major units with their currency (the JSON
/// keeps the stored minor units).
fn inspection_text(found: &Inspection, provider: &str, transaction_id: &str) -> String {
    let mut out = String::new();
    match &found.row {
        None => out.push_str(&format!("{provider}:{transaction_id}: no payments row\n")),
        Some(r) => {
            out.push_str(&format!(
                "{}:{}  {} {}  {}  (by {}, fence {})\n",
                r.provider,
                r.transaction_id,
                r.kind,
                r.status,
                major_units(r.amount_minor, &r.currency),
                r.event_type,
                r.fence
            ));
            if let Some(parent) = &r.parent_transaction_id {
                out.push_str(&format!("  payment: {parent}\n"));
            }
            if r.kind == "payment" {
                out.push_str(&format!(
                    "  refunded or disputed (net): {}\n",
                    major_units(r.amount_out_minor, &r.currency)
                ));
            }
        }
    }
    for c in &found.children {
        out.push_str(&format!(
            "  child {}  {} {}  {}\n",
            c.transaction_id,
            c.kind,
            c.status,
            major_units(c.amount_minor, &c.currency)
        ));
    }
    if !found.entries.is_empty() {
        out.push_str("  ledger:\n");
        for e in &found.entries {
            out.push_str(&format!(
                "    {:<24} {:<17} {:>16}  fence {}\n",
                e.transaction_id,
                e.effect,
                major_units(e.amount_minor, &e.currency),
                e.fence
            ));
        }
    }
    if !found.events.is_empty() {
        out.push_str("  events:\n");
        out.push_str(&events_text(&found.events, "    "));
    }
    if !found.deliveries.is_empty() {
        out.push_str("  deliveries:\n");
        for d in &found.deliveries {
            out.push_str(&format!("    {}\n", delivery_line(d)));
        }
    }
    if !found.recovered.is_empty() {
        out.push_str("  booked by reconciliation (no webhook arrived):\n");
        for r in &found.recovered {
            out.push_str(&format!(
                "    {}  {}\n",
                r.found_at.format(&Rfc3339).unwrap_or_default(),
                r.describe()
            ));
        }
    }
    out
}

/// One line of the delivery history: when, what, and the answer.
fn delivery_line(d: &DeliveryRow) -> String {
    format!(
        "{} {:<24} {:<25} answered {} {}{}{}",
        d.answered_at.format(&Rfc3339).unwrap_or_default(),
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
            .map(|p| format!("  (PSP id {p})"))
            .unwrap_or_default(),
    )
}

pub async fn replay(args: &ReplayArgs) -> Result<bool, String> {
    if !args.dead && args.transaction_id.is_none() {
        return Err(
            "say what to replay: --provider P --transaction-id X, or --dead [--since T]".to_owned(),
        );
    }
    let which = Replay {
        provider: args.provider.clone(),
        transaction_id: args.transaction_id.clone(),
        since: args.since,
        ..Replay::default()
    };
    let again = store(&args.db)?.replay(&which).await.map_err(db_error)?;
    if again.is_empty() {
        println!("replay: no dead event matched; nothing re-queued");
    } else {
        println!("replay: re-queued {} dead event(s):", again.len());
        print_events(&again, "  ");
    }
    Ok(true)
}

pub async fn events(args: &EventsArgs) -> Result<bool, String> {
    let filter = EventFilter {
        provider: args.provider.clone(),
        transaction_id: args.transaction_id.clone(),
        since: args.since,
        until: args.until,
        status: args.status.clone(),
        limit: args.limit.clamp(1, 100_000),
    };
    let rows = store(&args.db)?.events(&filter).await.map_err(db_error)?;
    if args.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
        }
    } else if rows.is_empty() {
        println!("events: none matched");
    } else {
        print_events(&rows, "");
    }
    Ok(true)
}

pub async fn prune(args: &PruneArgs) -> Result<bool, String> {
    let retention = fencehook::config::retention(args.event_retention_days)
        .map_err(|e| format!("invalid configuration: {e}"))?;
    let before =
        fencehook::config::time_before(OffsetDateTime::now_utc(), retention).ok_or_else(|| {
            format!(
                "invalid configuration: {}: reaches back before any date",
                setting::FENCEHOOK_EVENT_RETENTION_DAYS
            )
        })?;
    let store = store(&args.db)?;
    let before_text = before.format(&Rfc3339).unwrap_or_default();
    if args.dry_run {
        let (events, items) = store
            .prune_count(before, args.dead)
            .await
            .map_err(db_error)?;
        let history = store
            .prune_deliveries_count(before)
            .await
            .map_err(db_error)?;
        println!(
            "prune: would delete {events} event(s), {items} quarantined item(s) and {history} delivery history row(s) from before {before_text} (dry run: nothing deleted)"
        );
        return Ok(true);
    }
    let (events, items) = store.prune(before, args.dead).await.map_err(db_error)?;
    let history = store.prune_deliveries(before).await.map_err(db_error)?;
    println!(
        "prune: deleted {events} event(s), {items} quarantined item(s) and {history} delivery history row(s) from before {before_text}"
    );
    Ok(true)
}

fn print_events(rows: &[EventRow], indent: &str) {
    print!("{}", events_text(rows, indent));
}

fn events_text(rows: &[EventRow], indent: &str) -> String {
    let mut out = String::new();
    for r in rows {
        let when = r.received_at.format(&Rfc3339).unwrap_or_default();
        // A replay starts the attempts (and the age) again: say so, and say
        // whether the error shown is from before it, or an operator takes
        // the old failure for a new one.
        let attempts = match r.replayed_at {
            Some(at) => format!(
                "  replayed {} ({}x), {} attempt(s) since",
                at.format(&Rfc3339).unwrap_or_default(),
                r.replays,
                r.attempts
            ),
            None => format!("  attempts {}", r.attempts),
        };
        let error = match r.last_error.as_deref() {
            None => String::new(),
            Some(e) if error_predates_replay(r) => format!("  last error (before the replay): {e}"),
            Some(e) => format!("  last error: {e}"),
        };
        out.push_str(&format!(
            "{indent}#{:<6} {:<10} {}:{} {:<25} received {when}{attempts}{error}\n",
            r.id, r.status, r.provider, r.transaction_id, r.event_type,
        ));
    }
    out
}

/// Whether the event's `last_error` was set before its last replay: no
/// failure is in its history since the replay and the error is the last one
/// from before it. (A requeue records no history, only `last_error`: an
/// error that differs from the one before the replay is a newer one.)
fn error_predates_replay(r: &EventRow) -> bool {
    let Some(history) = r.errors.as_array() else {
        return false;
    };
    let Some(replay) = history.iter().rposition(|e| e.get("replay").is_some()) else {
        return false;
    };
    if history[replay..].iter().any(|e| e.get("error").is_some()) {
        return false;
    }
    let before = history[..replay]
        .iter()
        .rev()
        .find_map(|e| e.get("error").and_then(|e| e.as_str()));
    before.is_some() && before == r.last_error.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencehook::store::record::PaymentRecord;
    use serde_json::json;

    fn at(text: &str) -> OffsetDateTime {
        OffsetDateTime::parse(text, &Rfc3339).unwrap()
    }

    fn row(kind: &str, tx: &str, amount_minor: i64, currency: &str) -> PaymentRecord {
        PaymentRecord {
            id: 1,
            provider: "generic".to_owned(),
            transaction_id: tx.to_owned(),
            kind: kind.to_owned(),
            parent_transaction_id: None,
            status: "succeeded".to_owned(),
            event_type: format!("{kind}.succeeded"),
            amount_minor,
            amount: None,
            currency: currency.to_owned(),
            amount_out_minor: 0,
            amount_out: None,
            fence: 3,
            created_at: at("2026-01-01T00:00:00Z"),
            updated_at: at("2026-01-01T00:00:00Z"),
        }
    }

    fn event(attempts: i32, last_error: Option<&str>, errors: serde_json::Value) -> EventRow {
        let replays = errors.as_array().map_or(0, |h| {
            h.iter().filter(|e| e.get("replay").is_some()).count()
        });
        EventRow {
            id: 7,
            status: "queued".to_owned(),
            provider: "generic".to_owned(),
            transaction_id: "tx".to_owned(),
            event_type: "payment.succeeded".to_owned(),
            psp_event_id: None,
            received_at: at("2026-01-01T00:00:00Z"),
            replayed_at: (replays > 0).then(|| at("2026-01-01T02:00:00Z")),
            replays: i32::try_from(replays).unwrap(),
            attempts,
            next_attempt_at: None,
            last_error: last_error.map(str::to_owned),
            errors,
            finished_at: None,
        }
    }

    #[test]
    fn inspect_text_shows_amounts_in_major_units_with_their_currency() {
        let mut payment = row("payment", "pay", 10000, "EUR");
        payment.amount_out_minor = 2050;
        let found = Inspection {
            row: Some(payment),
            children: vec![row("refund", "re", 2050, "EUR")],
            entries: vec![],
            events: vec![],
            deliveries: vec![],
            recovered: vec![],
        };
        let text = inspection_text(&found, "generic", "pay");
        assert!(
            text.contains("payment succeeded  100.00 EUR  (by"),
            "{text}"
        );
        assert!(
            text.contains("refunded or disputed (net): 20.50 EUR"),
            "{text}"
        );
        assert!(
            text.contains("child re  refund succeeded  20.50 EUR"),
            "{text}"
        );
        for (minor, currency, shown) in [(1000, "JPY", "1000 JPY"), (1000, "KWD", "1.000 KWD")] {
            let found = Inspection {
                row: Some(row("payment", "pay", minor, currency)),
                children: vec![],
                entries: vec![],
                events: vec![],
                deliveries: vec![],
                recovered: vec![],
            };
            let text = inspection_text(&found, "generic", "pay");
            assert!(text.contains(&format!("succeeded  {shown}  (by")), "{text}");
        }
    }

    #[test]
    fn after_a_replay_the_events_text_shows_the_replay_and_the_attempts_since_it() {
        let failed = json!([
            {"at": "2026-01-01T00:01:00Z", "attempt": 1, "error": "downstream 500"},
            {"at": "2026-01-01T00:02:00Z", "attempt": 2, "error": "downstream 500"},
        ]);
        let mut replayed = failed.clone();
        replayed
            .as_array_mut()
            .unwrap()
            .push(json!({"at": "2026-01-01T02:00:00Z", "replay": 1}));
        let text = events_text(&[event(0, Some("downstream 500"), replayed.clone())], "");
        assert!(
            text.contains("replayed 2026-01-01T02:00:00Z (1x), 0 attempt(s) since"),
            "{text}"
        );
        assert!(
            text.contains("last error (before the replay): downstream 500"),
            "{text}"
        );

        // A failure since the replay is the last error, plainly.
        let mut failed_again = replayed;
        failed_again
            .as_array_mut()
            .unwrap()
            .push(json!({"at": "2026-01-01T02:01:00Z", "attempt": 1, "error": "downstream 503"}));
        let text = events_text(&[event(1, Some("downstream 503"), failed_again)], "");
        assert!(text.contains("(1x), 1 attempt(s) since"), "{text}");
        assert!(text.contains("  last error: downstream 503"), "{text}");
        assert!(!text.contains("before the replay"), "{text}");

        // Never replayed: the attempts and the error as they are.
        let text = events_text(&[event(2, Some("downstream 500"), failed)], "");
        assert!(
            text.contains("  attempts 2  last error: downstream 500"),
            "{text}"
        );
        assert!(!text.contains("replayed"), "{text}");
    }
}
