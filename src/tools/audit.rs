//! `fencehook audit`: the database invariants, one line per check, and with
//! `--answers FILE` the answers of a load run held against the database.
//! The result is recorded in the database (unless `--no-record`), for the
//! console's overview; a run that cannot record it is still an audit: it
//! prints and exits as the checks say, and one line says why nothing was
//! recorded.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use fencehook::config::DbArgs;
use fencehook::store::audit::{self, CheckCount, Recording, RunSummary};
use fencehook::store::StoreError;

use super::answers;

/// `fencehook audit`: the database invariants, and optionally the answers a
/// load run received.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// A `fencehook load --answers` file: every 2xx in it (other than
    /// `ignored` and `accepted`) must have a committed succeeded/failed
    /// payments row; every `accepted` a committed row (any status) and event.
    #[arg(long, value_name = "FILE")]
    pub answers: Option<PathBuf>,
    /// Only read: do not record the result in the database (for a standby
    /// or a read-only role; the console then shows the last run recorded).
    #[arg(long)]
    pub no_record: bool,
}

/// Runs the audit and prints one line per check; `Ok(true)` when clean.
/// With `answers`, the answers file is read first, so a bad file stops the
/// audit before anything is printed as "clean". Then records the result
/// (best effort: see the module).
pub async fn run(args: &AuditArgs) -> Result<bool, String> {
    let database_url = args
        .db
        .url()
        .map_err(|e| format!("invalid configuration: {e}"))?;
    let answers = args
        .answers
        .as_deref()
        .map(answers::read_answers)
        .transpose()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut checks = audit::run(database_url).await.map_err(unreadable)?;
    if let Some(answers) = &answers {
        let answer_checks = answers::check(database_url, answers)
            .await
            .map_err(unreadable)?;
        checks.extend(answer_checks);
    }
    let (payments, entries) = audit::totals(database_url).await.map_err(unreadable)?;
    println!("audit: {payments} payments, {entries} ledger entries");
    let sums = fencehook::store::ledger::sums(database_url)
        .await
        .map_err(unreadable)?;
    println!("audit: {}", sums_line(&sums));
    if let Some(answers) = &answers {
        print!(
            "audit: {} answers read, {} transactions answered 2xx to check",
            answers.lines,
            answers.transactions_2xx()
        );
        if answers.accepted.is_empty() {
            println!();
        } else {
            println!(
                " ({} answered accepted, {} with another 2xx)",
                answers.accepted.len(),
                answers.durable.len()
            );
        }
    }
    let mut clean = true;
    for c in &checks {
        let verdict = if c.total == 0 {
            "ok".to_owned()
        } else {
            format!("VIOLATED ({})", c.total)
        };
        println!("  {:<40} {verdict:<14} {}", c.name, c.description);
        for v in &c.violations {
            println!("      {v}");
        }
        clean &= c.total == 0;
    }
    let (legacy, legacy_count) = audit::legacy_refunds(database_url)
        .await
        .map_err(unreadable)?;
    if legacy_count > 0 {
        println!(
            "  note: {legacy_count} refund(s) were booked before refunds named their payment; they are not checked against one:"
        );
        for r in legacy {
            println!("      {r}");
        }
    }
    let (over, over_count) = audit::over_returned(database_url)
        .await
        .map_err(unreadable)?;
    if over_count > 0 {
        println!(
            "  warning: {over_count} payment(s) gave back more than came in (disputes booked past the amount; the money is gone):"
        );
        for p in over {
            println!("      {p}");
        }
    }
    let summary = RunSummary {
        checks: checks.iter().map(CheckCount::of).collect(),
        over_returned_payments: over_count,
        legacy_refunds: legacy_count,
        payments,
        ledger_entries: entries,
        duration: started.elapsed(),
        host: host_name(),
        with_answers: answers.is_some(),
    };
    if args.no_record {
        println!("audit: not recorded (--no-record)");
    } else {
        match audit::record(database_url, &summary).await {
            Ok(Recording::Recorded { id }) => {
                println!("audit: recorded as run {id} (the console's overview shows it)");
            }
            Ok(Recording::BeforeMigration) => eprintln!(
                "audit: not recorded: the schema has no audit_runs table (migration V14); run `fencehook migrate`"
            ),
            Err(e) => eprintln!(
                "audit: not recorded: {} (`--no-record` only reads)",
                fencehook::report::chain(&e)
            ),
        }
    }
    println!(
        "audit: {}",
        if clean { "clean" } else { "VIOLATIONS FOUND" }
    );
    Ok(clean)
}

/// The ledger's net per currency in minor units (what `export ledger`'s
/// totals equal over a window that covers the whole ledger).
fn sums_line(sums: &[fencehook::store::ledger::CurrencyTotal]) -> String {
    if sums.is_empty() {
        return "ledger sums: none (no entry)".to_owned();
    }
    let each: Vec<String> = sums
        .iter()
        .map(|s| format!("{} {} ({} entries)", s.currency, s.amount_minor, s.entries))
        .collect();
    format!("ledger sums (minor units): {}", each.join(", "))
}

/// The error line of an audit that could not read what it checks (exit 2).
fn unreadable(e: StoreError) -> String {
    format!(
        "audit could not read the database: {}",
        fencehook::report::chain(&e)
    )
}

/// This host's name, for the record of the run (Linux's, else `$HOSTNAME`).
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}
