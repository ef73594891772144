//! `fencehook audit`: the database invariants, one line per check, and with
//! `--answers FILE` the answers of a load run held against the database.

use std::path::{Path, PathBuf};

use clap::Args;
use fencehook::config::DbArgs;
use fencehook::store::audit;

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
}

/// Runs the audit and prints one line per check; `Ok(true)` when clean.
/// With `answers`, the answers file is read first, so a bad file stops the
/// audit before anything is printed as "clean".
pub async fn run(database_url: &str, answers: Option<&Path>) -> Result<bool, String> {
    let answers = answers
        .map(answers::read_answers)
        .transpose()
        .map_err(|e| e.to_string())?;
    let mut checks = audit::run(database_url).await.map_err(|e| {
        format!(
            "audit could not read the database: {}",
            fencehook::error::chain(&e)
        )
    })?;
    if let Some(answers) = &answers {
        let answer_checks = answers::check(database_url, answers).await.map_err(|e| {
            format!(
                "audit could not read the database: {}",
                fencehook::error::chain(&e)
            )
        })?;
        checks.extend(answer_checks);
    }
    let (payments, entries) = audit::totals(database_url).await.map_err(|e| {
        format!(
            "audit could not read the database: {}",
            fencehook::error::chain(&e)
        )
    })?;
    println!("audit: {payments} payments, {entries} ledger entries");
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
    let (legacy, legacy_count) = audit::legacy_refunds(database_url).await.map_err(|e| {
        format!(
            "audit could not read the database: {}",
            fencehook::error::chain(&e)
        )
    })?;
    if legacy_count > 0 {
        println!(
            "  note: {legacy_count} refund(s) were booked before refunds named their payment; they are not checked against one:"
        );
        for r in legacy {
            println!("      {r}");
        }
    }
    let (over, over_count) = audit::over_returned(database_url).await.map_err(|e| {
        format!(
            "audit could not read the database: {}",
            fencehook::error::chain(&e)
        )
    })?;
    if over_count > 0 {
        println!(
            "  warning: {over_count} payment(s) gave back more than came in (disputes booked past the amount; the money is gone):"
        );
        for p in over {
            println!("      {p}");
        }
    }
    println!(
        "audit: {}",
        if clean { "clean" } else { "VIOLATIONS FOUND" }
    );
    Ok(clean)
}
