//! Thin: parse the command line, start telemetry, run the command until a
//! signal. The service is the `fencehook` library; the other commands' code
//! lives in `tools/`, a module tree of this binary only.

mod tools;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use fencehook::app::App;
use fencehook::config::{DbArgs, LogFormat, ServeArgs};
use tools::audit::AuditArgs;
use tools::load::LoadArgs;
use tools::send::SendArgs;

/// `fencehook migrate`.
#[derive(clap::Args)]
struct MigrateArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Create the database named in DATABASE_URL when it does not exist
    /// (without it, a missing database is an error: a typo must not become
    /// a new, empty database).
    #[arg(long)]
    create_database: bool,
}

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
    /// Apply the migrations in sql/ (needs the database owner's rights).
    Migrate(MigrateArgs),
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
    let cli = match parse_cli() {
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

/// The command line, with `--help` naming each setting's variable without its
/// current value (`[env: DATABASE_URL]`): values can be secrets, and an unset
/// one would print as `[env: X=]`.
fn parse_cli() -> Result<Cli, clap::Error> {
    let cmd = hide_env_values(Cli::command());
    let matches = cmd.try_get_matches()?;
    Cli::from_arg_matches(&matches)
}

fn hide_env_values(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    let cmd = cmd.mut_args(|a| a.hide_env_values(true));
    names.iter().fold(cmd, |cmd, name| {
        cmd.mut_subcommand(name, |sub| sub.mut_args(|a| a.hide_env_values(true)))
    })
}

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::CheckConfig(args) => {
            // A person's command: plain lines, whatever FENCEHOOK_LOG_FORMAT says.
            for warning in unknown_settings() {
                eprintln!("fencehook: warning: {warning}");
            }
            match args.validate() {
                Ok(cfg) => {
                    for warning in cfg.warnings() {
                        eprintln!("fencehook: warning: {warning}");
                    }
                    let names: Vec<&str> = cfg.providers.iter().map(|p| p.name.as_str()).collect();
                    println!(
                        "configuration ok: providers [{}], lease backend {:?} (ttl {} ms, renew every {} ms), downstream {}, traces {}",
                        names.join(", "),
                        cfg.lease.backend,
                        cfg.lease.ttl.as_millis(),
                        cfg.lease.renew_interval().as_millis(),
                        cfg.downstream_url.as_ref().map_or("none".to_owned(), fencehook::config::redacted_url),
                        cfg.traces.as_ref().map_or("off".to_owned(), |t| format!("to {}", t.target())),
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
            let telemetry = match start_telemetry(&args).await {
                Ok(t) => t,
                Err(code) => return code,
            };
            for warning in unknown_settings() {
                tracing::warn!("{warning}");
            }
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
            log_targets(&cfg);
            if let Err(e) = fencehook::lease::redis::verify_tls(&cfg.lease).await {
                eprintln!("fencehook: invalid configuration: {e}");
                return ExitCode::from(2);
            }
            let app = match App::build(cfg).await {
                Ok(app) => app,
                Err(e) => {
                    eprintln!("fencehook: cannot start: {}", fencehook::error::chain(&e));
                    return ExitCode::FAILURE;
                }
            };
            warn_unreachable(&app.state().health).await;
            tracing::info!(
                port = app.port(),
                admin_port = app.admin_port(),
                "fencehook serving"
            );
            let drain = drain_bound(&args);
            app.run_until_stopped(shutdown_signal()).await;
            telemetry.shutdown(drain).await;
            ExitCode::SUCCESS
        }
        Command::Work(args) => {
            let telemetry = match start_telemetry(&args).await {
                Ok(t) => t,
                Err(code) => return code,
            };
            for warning in unknown_settings() {
                tracing::warn!("{warning}");
            }
            let cfg = match args.validate_for_workers() {
                Ok(cfg) => cfg,
                Err(e) => {
                    eprintln!("fencehook: invalid configuration: {e}");
                    return ExitCode::from(2);
                }
            };
            log_targets(&cfg);
            if let Err(e) = fencehook::lease::redis::verify_tls(&cfg.lease).await {
                eprintln!("fencehook: invalid configuration: {e}");
                return ExitCode::from(2);
            }
            let workers = match fencehook::app::Workers::build(cfg).await {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("fencehook: cannot start: {}", fencehook::error::chain(&e));
                    return ExitCode::FAILURE;
                }
            };
            tracing::info!("fencehook working");
            let drain = drain_bound(&args);
            workers.run_until_stopped(shutdown_signal()).await;
            telemetry.shutdown(drain).await;
            ExitCode::SUCCESS
        }
        Command::Migrate(args) => {
            // No trace settings: cannot fail.
            let _ = fencehook::telemetry::install(LogFormat::Text, "info", None);
            use fencehook::store::migrate::{self, MissingDatabase};
            let missing = if args.create_database {
                MissingDatabase::Create
            } else {
                MissingDatabase::Refuse
            };
            match migrate::run(&args.db.database_url, missing).await {
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
        Command::Audit(args) => match tools::audit::run(&args).await {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("fencehook: {e}");
                ExitCode::from(2)
            }
        },
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
    // A value parser's own reason (`--since 100000y`: before any date).
    let why = std::error::Error::source(&e)
        .map(|reason| format!(": {reason}"))
        .unwrap_or_default();
    eprintln!("fencehook: invalid configuration: {setting}: invalid value `{value}`{valid}{why}");
    ExitCode::from(2)
}

/// The warnings about variables that look like settings but are none:
/// unknown `FENCEHOOK_*` ones and near misses of any setting
/// (`DATABSE_URL`). A typo would otherwise leave a default silently in force.
/// `serve` and `work` log them (as JSON with `FENCEHOOK_LOG_FORMAT=json`, so
/// that every start line parses), `check-config` prints them.
fn unknown_settings() -> Vec<String> {
    let cmd = Cli::command();
    let mut known: Vec<String> = cmd
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect();
    known.sort();
    known.dedup();
    fencehook::config::misspelt_settings(&known, std::env::vars())
        .into_iter()
        .map(|(name, near)| {
            let renamed = fencehook::config::RENAMED_SETTINGS
                .iter()
                .find(|(old, _)| *old == name);
            match (renamed, near) {
                (Some((_, new)), _) => format!("{name} is ignored: it was renamed to {new}"),
                (None, Some(near)) => {
                    format!("{name} is not a setting and is ignored; did you mean {near}?")
                }
                (None, None) => format!("unknown setting {name} is ignored"),
            }
        })
        .collect()
}

/// The start log says where the data goes: which database and which Redis
/// (never a password), the lease backend and the mode.
fn log_targets(cfg: &fencehook::config::Config) {
    tracing::info!(
        database = %fencehook::config::database_target(&cfg.db.url),
        redis = %cfg.lease.redis_target(),
        lease_backend = cfg.lease.backend.as_str(),
        mode = ?cfg.inbox.mode,
        providers = ?cfg.providers.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        "fencehook starting"
    );
}

/// A backend that does not answer at start is said at once, not when the
/// first delivery fails: the process still starts (it recovers by itself
/// when the backend comes back; `/readyz` says 503 meanwhile).
async fn warn_unreachable(health: &fencehook::health::Health) {
    let probe = health.probe().await;
    if let Err(e) = &probe.postgres {
        tracing::warn!(error = %e, "PostgreSQL is not ready at start (unreachable, or takes no writes); deliveries answer 503 until it is");
    }
    if let Err(e) = &probe.lease {
        tracing::warn!(error = %e, "the lease backend does not answer at start; deliveries answer 503 until it does");
    }
    if let (Ok(()), Err(e)) = (&probe.postgres, &probe.schema) {
        tracing::warn!(error = %e, "the schema is older than this binary needs; /readyz says 503 until it is migrated");
    }
}

/// Log lines and, when an OTLP endpoint is set, traces; before anything
/// else, so that every start line is in the chosen format. A bad trace
/// setting stops the start here, naming it (exit 2).
async fn start_telemetry(args: &ServeArgs) -> Result<fencehook::telemetry::Telemetry, ExitCode> {
    let traces = args.traces.validate().map_err(|e| {
        eprintln!("fencehook: invalid configuration: {e}");
        ExitCode::from(2)
    })?;
    let telemetry = fencehook::telemetry::install(args.log_format, &args.log, traces.as_ref())
        .map_err(|e| {
            eprintln!("fencehook: invalid configuration: {e}");
            ExitCode::from(2)
        })?;
    if let Some(t) = &traces {
        tracing::info!(
            collector = %t.target(),
            protocol = ?t.protocol,
            sampler = ?t.sampler,
            service_name = %t.service_name,
            "tracing on: spans exported over OTLP/HTTP"
        );
    }
    Ok(telemetry)
}

/// FENCEHOOK_SHUTDOWN_TIMEOUT_MS: the drain bound, which also bounds the
/// last export of spans.
fn drain_bound(args: &ServeArgs) -> std::time::Duration {
    std::time::Duration::from_millis(args.shutdown_timeout_ms)
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

#[cfg(test)]
mod tests {
    //! docs/reference.md is the user's reference: these keep it from rotting
    //! as settings, metrics and alerts are added.

    use super::*;

    const ROOT: &str = env!("CARGO_MANIFEST_DIR");

    fn reference() -> String {
        std::fs::read_to_string(format!("{ROOT}/docs/reference.md")).expect("docs/reference.md")
    }

    fn env_names(cmd: &clap::Command, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env() {
                out.push(env.to_string_lossy().into_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            env_names(sub, out);
        }
    }

    #[test]
    fn every_setting_of_every_command_is_in_the_reference() {
        let doc = reference();
        let mut names = Vec::new();
        env_names(&Cli::command(), &mut names);
        names.sort();
        names.dedup();
        assert!(names.len() > 20, "found only {names:?}");
        let missing: Vec<_> = names
            .iter()
            .filter(|n| !doc.contains(&format!("`{n}`")))
            .collect();
        assert!(missing.is_empty(), "docs/reference.md lacks {missing:?}");
    }

    /// `path --flag` of every argument of `cmd` and its subcommands that
    /// `--help` would list without a description.
    fn undescribed(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if arg.is_hide_set() || arg.get_help().is_some() || arg.get_long_help().is_some() {
                continue;
            }
            let name = arg
                .get_long()
                .map_or_else(|| arg.get_id().to_string(), |l| format!("--{l}"));
            out.push(format!("{path} {name}"));
        }
        for sub in cmd.get_subcommands() {
            undescribed(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_flag_of_every_command_has_a_description_in_its_help() {
        let mut missing = Vec::new();
        undescribed(&Cli::command(), "fencehook", &mut missing);
        assert!(
            missing.is_empty(),
            "--help lists these without a word: {missing:#?}"
        );
    }

    /// Every name `pattern` finds in the lines of `path` (an alert's
    /// `alert:` line) appears in the reference.
    fn names_in(path: &str, pattern: impl Fn(&str) -> Option<String>) -> Vec<String> {
        let text = std::fs::read_to_string(format!("{ROOT}/{path}")).expect(path);
        let mut names: Vec<String> = text.lines().filter_map(pattern).collect();
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn every_metric_and_alert_is_in_the_reference() {
        let doc = reference();
        let metrics: Vec<String> = fencehook::metrics::TABLE
            .iter()
            .map(|m| m.name.to_owned())
            .collect();
        let alerts = names_in("deploy/alerts.yml", |line| {
            Some(line.trim().strip_prefix("- alert: ")?.trim().to_string())
        });
        assert!(
            metrics.len() > 20 && alerts.len() > 5,
            "{metrics:?} {alerts:?}"
        );
        let missing: Vec<_> = metrics
            .iter()
            .chain(&alerts)
            .filter(|n| !doc.contains(n.as_str()))
            .collect();
        assert!(missing.is_empty(), "docs/reference.md lacks {missing:?}");
    }
}
