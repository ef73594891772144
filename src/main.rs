//! Thin: parse the command line, start telemetry, run the command until a
//! signal. The service is the `fencehook` library; the other commands' code
//! lives in `tools/`, a module tree of this binary only.

mod tools;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use fencehook::app::App;
use fencehook::config::{DbArgs, LogFormat, ServeArgs};
use tools::audit::AuditArgs;
use tools::load::LoadArgs;
use tools::send::SendArgs;
use tracing_subscriber::EnvFilter;

/// Payment-webhook receiver that applies every payment exactly once.
#[derive(Parser)]
#[command(name = "fencehook", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve webhooks (public listener) and /metrics, /healthz, /readyz (admin listener).
    Serve(ServeArgs),
    /// Inbox mode: run workers only (no listeners) that book the accepted
    /// events; takes the same settings as `serve`.
    Work(ServeArgs),
    /// Apply the migrations in sql/ (creates the database if missing).
    Migrate(DbArgs),
    /// Validate the settings and the providers file without starting; exits 2 on the first bad one.
    CheckConfig(ServeArgs),
    /// Check the database invariants; exits 1 on any violation.
    Audit(AuditArgs),
    /// Show one transaction: its row, its refunds and disputes, their ledger
    /// entries and their events (attempts, last error). Exits 1 when unknown.
    Inspect(tools::ops::InspectArgs),
    /// Re-queue dead inbox events (one transaction's, or every dead one
    /// since a time); prints what it re-queued.
    Replay(tools::ops::ReplayArgs),
    /// List or search the stored inbox events.
    Events(tools::ops::EventsArgs),
    /// Delete finished inbox events (and quarantined items) past retention.
    Prune(tools::ops::PruneArgs),
    /// Sign and send one webhook as a standard, stripe, adyen, wechatpay,
    /// alipay or paypal provider would (for demos).
    Send(SendArgs),
    /// Drive one or more instances with signed deliveries, k copies each; report
    /// throughput, latency and answers. Exits 1 when the run shows a problem.
    Load(LoadArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return bad_arguments(e),
    };
    // Arms failpoints from FAILPOINTS; a no-op unless built with `--features test-support`.
    let _failpoints = fail::FailScenario::setup();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencehook: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::CheckConfig(args) => {
            warn_unknown_settings();
            match args.validate() {
                Ok(cfg) => {
                    for warning in cfg.warnings() {
                        eprintln!("fencehook: warning: {warning}");
                    }
                    let names: Vec<&str> = cfg.providers.iter().map(|p| p.name.as_str()).collect();
                    println!(
                        "configuration ok: providers [{}], lease backend {:?} (ttl {} ms, renew every {} ms), downstream {}",
                        names.join(", "),
                        cfg.lease.backend,
                        cfg.lease.ttl.as_millis(),
                        cfg.lease.renew_interval().as_millis(),
                        cfg.downstream_url.as_ref().map_or("none".to_owned(), fencehook::config::redacted_url),
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("fencehook: invalid configuration: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Serve(args) => {
            init_tracing(args.log_format);
            warn_unknown_settings();
            let cfg = match args.validate() {
                Ok(cfg) => cfg,
                Err(e) => {
                    eprintln!("fencehook: invalid configuration: {e}");
                    return ExitCode::from(2);
                }
            };
            for warning in cfg.warnings() {
                tracing::warn!("{warning}");
            }
            let app = match App::build(cfg).await {
                Ok(app) => app,
                Err(e) => {
                    eprintln!("fencehook: cannot start: {}", fencehook::error::chain(&e));
                    return ExitCode::FAILURE;
                }
            };
            tracing::info!(
                port = app.port(),
                admin_port = app.admin_port(),
                "fencehook serving"
            );
            app.run_until_stopped(shutdown_signal()).await;
            ExitCode::SUCCESS
        }
        Command::Work(args) => {
            init_tracing(args.log_format);
            warn_unknown_settings();
            let cfg = match args.validate_for_workers() {
                Ok(cfg) => cfg,
                Err(e) => {
                    eprintln!("fencehook: invalid configuration: {e}");
                    return ExitCode::from(2);
                }
            };
            let workers = match fencehook::app::Workers::build(cfg).await {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("fencehook: cannot start: {}", fencehook::error::chain(&e));
                    return ExitCode::FAILURE;
                }
            };
            tracing::info!("fencehook working");
            workers.run_until_stopped(shutdown_signal()).await;
            ExitCode::SUCCESS
        }
        Command::Migrate(db) => {
            init_tracing(LogFormat::Text);
            match fencehook::store::migrate::run(&db.database_url).await {
                Ok(applied) => {
                    println!("migrate: {} migration(s) applied", applied.len());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("fencehook: migrate failed: {}", fencehook::error::chain(&e));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Audit(args) => {
            match tools::audit::run(&args.db.database_url, args.answers.as_deref()).await {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("fencehook: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Inspect(args) => exit(tools::ops::inspect(&args).await),
        Command::Replay(args) => exit(tools::ops::replay(&args).await),
        Command::Events(args) => exit(tools::ops::events(&args).await),
        Command::Prune(args) => exit(tools::ops::prune(&args).await),
        Command::Send(args) => match tools::send::send(&args).await {
            Ok((status, body)) => {
                println!("{status} {body}");
                if (200..300).contains(&status) {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("fencehook: {e}");
                ExitCode::from(2)
            }
        },
        // Ctrl-C stops launching; deliveries in flight end and are reported.
        Command::Load(args) => match tools::load::command(&args, ctrl_c()).await {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("fencehook: {e}");
                ExitCode::from(2)
            }
        },
    }
}

/// Exit 0 when the command did what was asked, 1 when it found nothing, 2
/// when it could not run.
fn exit(result: Result<bool, String>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fencehook: {e}");
            ExitCode::from(2)
        }
    }
}

/// Resolves on Ctrl-C; never, when the handler cannot be installed.
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A value clap could not parse (`FENCEHOOK_LEASE_TTL_MS=abc`) stops the
/// start with one line naming the environment variable, like every other bad
/// setting; help, version and usage errors are printed as clap formats them.
fn bad_arguments(e: clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        let _ = e.print();
        return if e.use_stderr() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let arg = e
        .get(ContextKind::InvalidArg)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let long = arg
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_start_matches('-')
        .to_owned();
    let cmd = Cli::command();
    let setting = cmd
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .find(|a| a.get_long() == Some(long.as_str()))
        .and_then(|a| a.get_env().map(|env| env.to_string_lossy().into_owned()))
        .unwrap_or_else(|| format!("--{long}"));
    let value = e
        .get(ContextKind::InvalidValue)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let valid = e
        .get(ContextKind::ValidValue)
        .map(|v| format!(" (one of: {v})"))
        .unwrap_or_default();
    eprintln!("fencehook: invalid configuration: {setting}: invalid value `{value}`{valid}");
    ExitCode::from(2)
}

/// Warns about `FENCEHOOK_*` variables that no setting reads (a typo would
/// otherwise leave a default silently in force).
fn warn_unknown_settings() {
    let cmd = Cli::command();
    let mut known: Vec<String> = cmd
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect();
    known.extend(["FENCEHOOK_LOG".to_owned(), "FENCEHOOK_URL".to_owned()]);
    for name in fencehook::config::unknown_settings(&known, std::env::vars()) {
        match fencehook::config::RENAMED_SETTINGS
            .iter()
            .find(|(old, _)| *old == name)
        {
            Some((_, new)) => {
                eprintln!("fencehook: warning: {name} is ignored: it was renamed to {new}")
            }
            None => eprintln!("fencehook: warning: unknown setting {name} is ignored"),
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter =
        EnvFilter::try_from_env("FENCEHOOK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour codes only for a person at a terminal: in a pipe, a file or a
    // log shipper they are noise that breaks searching.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
