//! The operators' commands of inbox mode: `inspect`, `replay`, `events`,
//! `prune`. Each reads or changes the database only; the service need not run.

use clap::Args;
use fencehook::config::DbArgs;
use fencehook::store::inbox::{EventFilter, EventRow, Replay};
use fencehook::store::Store;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// `fencehook inspect`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[arg(long)]
    pub provider: String,
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
    /// Replay this provider's dead events (with --transaction-id: of that transaction).
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
    /// queued | processing | done | dead
    #[arg(long)]
    pub status: Option<String>,
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
    #[arg(long)]
    pub json: bool,
}

/// `fencehook prune`.
#[derive(Debug, Clone, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Keep events received within this many days.
    #[arg(long, env = "FENCEHOOK_EVENT_RETENTION_DAYS", default_value_t = 30)]
    pub event_retention_days: u64,
    /// Delete dead events past retention too (kept by default: they wait for a replay).
    #[arg(long)]
    pub dead: bool,
}

/// An RFC 3339 time, or an age (`2h`, `30m`) counted back from now.
fn parse_time(text: &str) -> Result<OffsetDateTime, String> {
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
    Store::new(&cfg).map_err(|e| fencehook::error::chain(&e))
}

fn db_error(e: impl std::error::Error + 'static) -> String {
    format!("database: {}", fencehook::error::chain(&e))
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
        return Ok(found.row.is_some() || !found.events.is_empty());
    }
    match &found.row {
        None => println!("{}:{}: no payments row", args.provider, args.transaction_id),
        Some(r) => {
            println!(
                "{}:{}  {} {}  {} {}  (by {}, fence {})",
                r.provider,
                r.transaction_id,
                r.kind,
                r.status,
                r.amount_minor,
                r.currency,
                r.event_type,
                r.fence
            );
            if let Some(parent) = &r.parent_transaction_id {
                println!("  payment: {parent}");
            }
            if r.kind == "payment" {
                println!(
                    "  refunded or disputed (net): {} {}",
                    r.amount_out_minor, r.currency
                );
            }
        }
    }
    for c in &found.children {
        println!(
            "  child {}  {} {}  {} {}",
            c.transaction_id, c.kind, c.status, c.amount_minor, c.currency
        );
    }
    if !found.entries.is_empty() {
        println!("  ledger:");
        for e in &found.entries {
            println!(
                "    {:<24} {:<17} {:>12} {}  fence {}",
                e.transaction_id, e.effect, e.amount_minor, e.currency, e.fence
            );
        }
    }
    if !found.events.is_empty() {
        println!("  events:");
        print_events(&found.events, "    ");
    }
    Ok(found.row.is_some() || !found.events.is_empty())
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
    let before = fencehook::config::time_before(OffsetDateTime::now_utc(), retention).ok_or(
        "invalid configuration: FENCEHOOK_EVENT_RETENTION_DAYS: reaches back before any date",
    )?;
    let (events, items) = store(&args.db)?
        .prune(before, args.dead)
        .await
        .map_err(db_error)?;
    println!(
        "prune: deleted {events} event(s) and {items} quarantined item(s) from before {}",
        before.format(&Rfc3339).unwrap_or_default()
    );
    Ok(true)
}

fn print_events(rows: &[EventRow], indent: &str) {
    for r in rows {
        let when = r.received_at.format(&Rfc3339).unwrap_or_default();
        // Its age counts from the last replay: show it.
        let replayed = r
            .replayed_at
            .map(|at| {
                let at = at.format(&Rfc3339).unwrap_or_default();
                format!("  replayed {at} ({}x)", r.replays)
            })
            .unwrap_or_default();
        println!(
            "{indent}#{:<6} {:<10} {}:{} {:<25} received {when}{replayed}  attempts {}{}",
            r.id,
            r.status,
            r.provider,
            r.transaction_id,
            r.event_type,
            r.attempts,
            r.last_error
                .as_deref()
                .map(|e| format!("  last error: {e}"))
                .unwrap_or_default()
        );
    }
}
