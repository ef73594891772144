//! Money out for finance, personal data out on request: `fencehook export
//! ledger` and `fencehook erase`. Both talk to the database only; the
//! service need not run.

use std::io::Write;

use clap::{Args, Subcommand, ValueEnum};
use fencehook::config::DbArgs;
use fencehook::store::erase::{self, Erasure};
use fencehook::store::ledger::{self, CurrencyTotal, Entry, Window};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::ops::parse_time;

/// `fencehook export`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    #[command(subcommand)]
    pub what: Export,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Export {
    /// Every ledger entry booked in a window, and the net per currency
    /// (equal to `fencehook audit`'s sums over a window that covers the
    /// whole ledger). Signed amounts in minor units: money in positive,
    /// refunds and disputes negative. To stdout.
    Ledger(LedgerArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Csv,
    Json,
}

/// `fencehook export ledger`.
#[derive(Debug, Clone, Args)]
pub struct LedgerArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Entries booked at or after this time (RFC 3339, or an age like 24h).
    #[arg(long, value_parser = parse_time)]
    pub since: OffsetDateTime,
    /// Entries booked before this time (RFC 3339, or an age); default now.
    /// The window is half-open, so consecutive windows count each entry once.
    #[arg(long, value_parser = parse_time)]
    pub until: Option<OffsetDateTime>,
    /// Only this provider's entries.
    #[arg(long)]
    pub provider: Option<String>,
    /// csv: one line per entry (`record` = `entry`), then one per currency
    /// (`record` = `total`); json: one object with `entries` and `totals`.
    #[arg(long, value_enum, default_value_t = Format::Csv)]
    pub format: Format,
}

/// `fencehook erase`.
#[derive(Debug, Clone, Args)]
pub struct EraseArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The provider's name (its path, /webhooks/<name>).
    #[arg(long)]
    pub provider: String,
    /// The object whose stored bodies to erase (a payment's id erases its
    /// refunds' and disputes' too).
    #[arg(long)]
    pub transaction_id: String,
    /// Why (a ticket or request id), kept in the record of the erasure.
    #[arg(long)]
    pub reason: Option<String>,
}

const CSV_HEADER: &str = "record,entry_id,booked_at,provider,transaction_id,parent_transaction_id,effect,amount_minor,currency,fence";

pub async fn export(args: &ExportArgs) -> Result<bool, String> {
    match &args.what {
        Export::Ledger(args) => export_ledger(args).await,
    }
}

async fn export_ledger(args: &LedgerArgs) -> Result<bool, String> {
    let url = args
        .db
        .url()
        .map_err(|e| format!("invalid configuration: {e}"))?;
    let window = Window {
        since: args.since,
        until: args.until.unwrap_or_else(OffsetDateTime::now_utc),
        provider: args.provider.clone(),
    };
    if window.until <= window.since {
        return Err(format!(
            "--until ({}) must be after --since ({})",
            rfc3339(window.until),
            rfc3339(window.since)
        ));
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let format = args.format;
    let mut first = true;
    let head = match format {
        Format::Csv => writeln!(out, "{CSV_HEADER}"),
        Format::Json => write!(
            out,
            "{{\"since\":{},\"until\":{},\"provider\":{},\"entries\":[",
            json(&rfc3339(window.since)),
            json(&rfc3339(window.until)),
            json(&window.provider)
        ),
    };
    head.map_err(output_error)?;
    let totals = ledger::export(url, &window, |e: &Entry| match format {
        Format::Csv => writeln!(out, "{}", csv_entry(e)),
        Format::Json => {
            let sep = if std::mem::take(&mut first) { "" } else { "," };
            write!(out, "{sep}\n{}", json(e))
        }
    })
    .await
    .map_err(|e| {
        format!(
            "export could not read the database: {}",
            fencehook::report::chain(&e)
        )
    })?
    .map_err(output_error)?
    .list();
    match format {
        Format::Csv => totals
            .iter()
            .try_for_each(|t| writeln!(out, "{}", csv_total(t, window.provider.as_deref()))),
        Format::Json => writeln!(out, "\n],\"totals\":{}}}", json(&totals)),
    }
    .and_then(|()| out.flush())
    .map_err(output_error)?;
    Ok(true)
}

fn output_error(e: std::io::Error) -> String {
    format!("export: cannot write the output: {e}")
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

fn json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("plain data serializes")
}

/// One CSV field (RFC 4180): quoted when it holds a comma, a quote or a line
/// break, quotes doubled.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn csv_entry(e: &Entry) -> String {
    format!(
        "entry,{},{},{},{},{},{},{},{},{}",
        e.entry_id,
        rfc3339(e.booked_at),
        csv_field(&e.provider),
        csv_field(&e.transaction_id),
        csv_field(e.parent_transaction_id.as_deref().unwrap_or("")),
        e.effect,
        e.amount_minor,
        e.currency,
        e.fence
    )
}

/// A currency's total: its net in `amount_minor`, the provider when the
/// export is one provider's; the entry columns empty (the count of entries
/// is in the JSON only).
fn csv_total(t: &CurrencyTotal, provider: Option<&str>) -> String {
    format!(
        "total,,,{},,,,{},{},",
        csv_field(provider.unwrap_or("")),
        t.amount_minor,
        t.currency
    )
}

pub async fn erase(args: &EraseArgs) -> Result<bool, String> {
    let url = args
        .db
        .url()
        .map_err(|e| format!("invalid configuration: {e}"))?;
    if args.transaction_id.trim().is_empty() || args.provider.trim().is_empty() {
        return Err("erase: --provider and --transaction-id must not be empty".to_owned());
    }
    let req = erase::Request {
        provider: args.provider.clone(),
        transaction_id: args.transaction_id.clone(),
        reason: args.reason.clone(),
        host: super::audit::host_name(),
    };
    let object = format!("{}:{}", args.provider, args.transaction_id);
    match erase::erase(url, &req)
        .await
        .map_err(|e| format!("erase: database: {}", fencehook::report::chain(&e)))?
    {
        Erasure::Erased { id, events, items } => {
            println!(
                "erase: {object}: emptied {} event bod{} and {items} quarantined item(s); rows, fingerprints and ledger kept; recorded as erasure {id}",
                events.len(),
                if events.len() == 1 { "y" } else { "ies" }
            );
            for e in &events {
                println!("  event #{} {} {}", e.id, e.transaction_id, e.event_type);
            }
            Ok(true)
        }
        Erasure::AlreadyErased { at } => {
            println!(
                "erase: {object}: nothing left to erase (erased {}); nothing written",
                rfc3339(at)
            );
            Ok(true)
        }
        Erasure::Unknown => {
            println!("erase: {object}: no row, event or quarantined item; nothing written");
            Ok(false)
        }
        Erasure::BeforeMigration => Err(format!(
            "erase: {object}: nothing written: the schema has no erasures table (migration V15); run `fencehook migrate`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_with_commas_or_quotes_are_quoted_and_totals_fill_their_columns() {
        assert_eq!(csv_field("pay_1"), "pay_1");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        let total = CurrencyTotal {
            currency: "EUR".to_owned(),
            amount_minor: -250,
            entries: 2,
        };
        let line = csv_total(&total, Some("stripe"));
        assert_eq!(
            line.split(',').count(),
            CSV_HEADER.split(',').count(),
            "{line}"
        );
        assert_eq!(line, "total,,,stripe,,,,-250,EUR,");
    }
}
