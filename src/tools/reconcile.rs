//! `fencehook reconcile`: one run per provider over a window, by hand (the
//! scheduled runs of `serve` and `work` are the same runner). Per provider:
//! a line of counts and the events worth a look on stderr, or with `--json`
//! one JSON object per provider per line on stdout. Exit 0 when every run
//! completed, 1 when one found a divergence, 2 on a configuration or API
//! error (2 beats 1 beats 0).

use std::process::ExitCode;

use clap::Args;
use fencehook::config::ServeArgs;
use fencehook::providers::{Provider, Window};
use fencehook::reconcile::{Ask, Ending, Report};
use fencehook::store::reconcile::Trigger;
use serde_json::json;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::ops::parse_time;

/// `fencehook reconcile`: the settings of `serve`, and the run's own flags.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Only this provider (repeat for several); default: every provider.
    #[arg(long = "provider", value_name = "NAME")]
    pub only: Vec<String>,
    /// The window's start (RFC 3339, or an age like 72h); default: the
    /// look-back (FENCEHOOK_RECONCILE_LOOKBACK_SECS) before now.
    #[arg(long, value_parser = parse_time)]
    pub since: Option<OffsetDateTime>,
    /// The window's end (RFC 3339, or an age like 10m); default: now.
    #[arg(long, value_parser = parse_time)]
    pub until: Option<OffsetDateTime>,
    /// Write nothing: list what would be booked.
    #[arg(long)]
    pub dry_run: bool,
    /// One JSON object per provider, one a line, on stdout.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &ReconcileArgs) -> ExitCode {
    let _telemetry =
        match fencehook::telemetry::install(args.serve.log_format, &args.serve.log, None) {
            Ok(t) => t,
            Err(e) => return bad(&e),
        };
    let cfg = match args.serve.validate() {
        Ok(cfg) => cfg,
        Err(e) => return bad(&format!("invalid configuration: {e}")),
    };
    let now = OffsetDateTime::now_utc();
    let window = Window {
        since: args.since.unwrap_or(now - cfg.reconcile.lookback),
        until: args.until.unwrap_or(now),
    };
    if window.since >= window.until {
        return bad("--since must be before --until");
    }
    let providers = match chosen(&cfg.providers, &args.only) {
        Ok(p) => p,
        Err(e) => return bad(&e),
    };
    let reconciler = match fencehook::app::reconciler(&cfg).await {
        Ok(r) => r,
        Err(e) => return bad(&fencehook::report::chain(&e)),
    };
    let ask = Ask {
        window,
        trigger: Trigger::Cli,
        dry_run: args.dry_run,
    };
    let mut code = 0;
    for provider in providers {
        let report = reconciler.run(provider, ask).await;
        let named = args.only.contains(&provider.name);
        let exit = match report.ending {
            // Asked for by name, it must be able to run.
            Ending::NoCredentials if !named => 0,
            _ => report.exit_code(),
        };
        code = code.max(exit);
        say(&report, args);
    }
    ExitCode::from(code)
}

/// The providers asked for (every one when none is named); a name no
/// provider has is an error naming it.
fn chosen<'a>(all: &'a [Provider], only: &[String]) -> Result<Vec<&'a Provider>, String> {
    if only.is_empty() {
        return Ok(all.iter().collect());
    }
    only.iter()
        .map(|name| {
            all.iter().find(|p| p.name == *name).ok_or_else(|| {
                let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
                format!(
                    "--provider {name}: no such provider (configured: {})",
                    names.join(", ")
                )
            })
        })
        .collect()
}

/// The run, as a person reads it (stderr) or as one JSON line (stdout).
fn say(report: &Report, args: &ReconcileArgs) {
    let p = &report.provider;
    if args.json {
        println!("{}", as_json(report, args.dry_run));
        return;
    }
    let c = &report.counts;
    let counts = format!(
        "listed {}, known {}, recovered {}{}, ignored {} (stale {}), refused {}, divergent {}",
        c.listed,
        c.known,
        c.recovered,
        if args.dry_run { " (would book)" } else { "" },
        c.ignored,
        c.stale,
        c.refused,
        c.divergent
    );
    match &report.ending {
        Ending::Completed => eprintln!(
            "{p}: {counts} [{} .. {}]",
            rfc(report.window.since),
            rfc(report.window.until)
        ),
        Ending::NoEventsApi => eprintln!("{p}: no events API (its PSP lists no past events)"),
        Ending::NoCredentials => eprintln!(
            "{p}: no API credentials (api_key; for paypal client_id and client_secret): not reconciled"
        ),
        Ending::Busy => eprintln!("{p}: another runner is reconciling it now; try again later"),
        Ending::Failed { reason, why } => eprintln!("{p}: failed ({reason}): {why}; so far {counts}"),
    }
    for (event, tx) in &report.would_book {
        eprintln!("  would book {event} ({tx})");
    }
    for f in &report.findings {
        let tx = f.transaction_id.as_deref().unwrap_or("-");
        match &f.reason {
            Some(why) => eprintln!("  {} {} ({tx}): {why}", f.result, f.psp_event_id),
            None => eprintln!("  {} {} ({tx})", f.result, f.psp_event_id),
        }
    }
}

fn as_json(report: &Report, dry_run: bool) -> serde_json::Value {
    let c = &report.counts;
    let (status, error) = match &report.ending {
        Ending::Completed => ("completed", None),
        Ending::NoEventsApi => ("no_events_api", None),
        Ending::NoCredentials => ("no_credentials", None),
        Ending::Busy => ("busy", None),
        Ending::Failed { reason, why } => ("failed", Some(format!("{reason}: {why}"))),
    };
    json!({
        "provider": report.provider,
        "status": status,
        "error": error,
        "dry_run": dry_run,
        "since": rfc(report.window.since),
        "until": rfc(report.window.until),
        "listed": c.listed,
        "known": c.known,
        "recovered": c.recovered,
        "ignored": c.ignored,
        "stale": c.stale,
        "refused": c.refused,
        "divergent": c.divergent,
        "findings": report.findings,
        "would_book": report.would_book.iter().map(|(e, t)| json!({"psp_event_id": e, "transaction_id": t})).collect::<Vec<_>>(),
    })
}

fn rfc(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

fn bad(e: &str) -> ExitCode {
    eprintln!("fencehook: {e}");
    ExitCode::from(2)
}
