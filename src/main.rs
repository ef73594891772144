//! Thin: parse the command line, start telemetry, run until a signal.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fencehook::app::App;
use fencehook::cli::{self, AuditArgs, SendArgs};
use fencehook::config::{DbArgs, LogFormat, ServeArgs};
use fencehook::load::{self, LoadArgs};
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
    /// Apply the migrations in sql/ (creates the database if missing).
    Migrate(DbArgs),
    /// Check the database invariants; exits 1 on any violation.
    Audit(AuditArgs),
    /// Sign and send one generic webhook (for demos).
    Send(SendArgs),
    /// Drive one or more instances with signed deliveries, k copies each; report
    /// throughput, latency and answers. Exits 1 when the run shows a problem.
    Load(LoadArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
        Command::Serve(args) => {
            init_tracing(args.log_format);
            let cfg = match args.validate() {
                Ok(cfg) => cfg,
                Err(e) => {
                    eprintln!("fencehook: invalid configuration: {e}");
                    return ExitCode::from(2);
                }
            };
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
            match cli::audit(&args.db.database_url, args.answers.as_deref()).await {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("fencehook: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Send(args) => match cli::send(&args).await {
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
        Command::Load(args) => match load::command(&args, ctrl_c()).await {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("fencehook: {e}");
                ExitCode::from(2)
            }
        },
    }
}

/// Resolves on Ctrl-C; never, when the handler cannot be installed.
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn init_tracing(format: LogFormat) {
    let filter =
        EnvFilter::try_from_env("FENCEHOOK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
