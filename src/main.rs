//! Thin: parse the command line, start telemetry, build the app (or the
//! workers), run it until a signal. The service is the `fencehook` library
//! (how `serve` and `work` start: `fencehook::startup`); the other commands'
//! code lives in `tools/`, a module tree of this binary only.

mod tools;

/// mimalloc instead of glibc's malloc: a delivery makes a few hundred small
/// allocations across the runtime's threads, where glibc's arenas spent
/// about a tenth of the service's CPU (perf, `make bench`'s k = 1 row);
/// mimalloc's thread-local free lists serve them in a fraction of it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use fencehook::app::{App, AppError, Workers};
use fencehook::config::ServeArgs;
use fencehook::startup::{self, Role};
use tools::audit::AuditArgs;
use tools::load::LoadArgs;
use tools::migrate::MigrateArgs;
use tools::send::SendArgs;

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
    /// Validate the settings and the providers file without starting; exits
    /// 2 with one line per bad setting, every one found.
    CheckConfig(tools::check_config::CheckConfigArgs),
    /// Check the database invariants; exits 1 on any violation.
    Audit(AuditArgs),
    /// Show one transaction: its row, its refunds and disputes, their ledger
    /// entries, their events (attempts, last error) and the answers their
    /// deliveries were given. Exits 1 when unknown.
    Inspect(tools::ops::InspectArgs),
    /// Re-queue dead inbox events (one transaction's, or every dead one
    /// since a time); prints what it re-queued.
    Replay(tools::ops::ReplayArgs),
    /// List or search the stored inbox events.
    Events(tools::ops::EventsArgs),
    /// Delete finished inbox events (and quarantined items, and the delivery
    /// history) past retention.
    Prune(tools::ops::PruneArgs),
    /// Write data out for finance: `export ledger` (every ledger entry in a
    /// window, and the net per currency), CSV or JSON to stdout.
    Export(tools::finance::ExportArgs),
    /// Erase the stored bodies of one object's events (personal data),
    /// keeping its rows, fingerprints and ledger; records the erasure. Exits
    /// 1 when nothing of the object is stored.
    Erase(tools::finance::EraseArgs),
    /// List providers' events through their PSP's API and book those whose
    /// webhook never arrived, exactly once; report what is known, recovered
    /// and divergent. Exits 1 on a divergence, 2 on a configuration or API error.
    Reconcile(tools::reconcile::ReconcileArgs),
    /// Sign and send one webhook as a standard, stripe, adyen, wechatpay,
    /// alipay or paypal provider would (for demos).
    Send(SendArgs),
    /// Drive one or more instances with signed deliveries, k copies each; report
    /// throughput, latency and answers. Exits 1 when the run shows a problem.
    Load(LoadArgs),
}

fn main() -> ExitCode {
    if let Err(e) = tools::check_config::load_env_file(&std::env::args_os().collect::<Vec<_>>()) {
        eprintln!("fencehook: invalid configuration: {e}");
        return ExitCode::from(2);
    }
    let (cli, unparsable) = match parse_cli() {
        Ok(parsed) => parsed,
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
    runtime.block_on(run(cli, unparsable))
}

/// The command line, with `--help` naming each setting's variable without its
/// current value (`[env: DATABASE_URL]`): values can be secrets, and an unset
/// one would print as `[env: X=]`.
///
/// `check-config` names every bad setting in one run, those clap cannot
/// parse too (a word where a number goes): each is said (the lines
/// returned), left out, and the rest parsed again, so the checks after the
/// parse still run.
fn parse_cli() -> Result<(Cli, Vec<String>), clap::Error> {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let checking = argv.get(1).is_some_and(|a| a == "check-config");
    let mut unparsable = Vec::new();
    loop {
        let parsed = hide_env_values(Cli::command())
            .try_get_matches_from(&argv)
            .and_then(|m| Cli::from_arg_matches(&m));
        let e = match parsed {
            Ok(cli) => return Ok((cli, unparsable)),
            Err(e) => e,
        };
        match invalid_value(&e) {
            Some(bad) if checking && leave_out(&mut argv, &bad) => unparsable.push(bad.line),
            _ => return Err(e),
        }
    }
}

/// A value clap could not parse: the flag, the setting (its variable, or
/// the flag when it has none), and the line that says so.
struct InvalidValue {
    long: String,
    setting: Option<String>,
    line: String,
}

/// Takes the value of `bad` out of the command line (`--flag value`,
/// `--flag=value`) or, when it came from the environment, out of that.
/// Whether there was one to take out.
fn leave_out(argv: &mut Vec<std::ffi::OsString>, bad: &InvalidValue) -> bool {
    let flag = format!("--{}", bad.long);
    let with_value = format!("{flag}=");
    if let Some(i) = argv.iter().position(|a| *a == *flag) {
        argv.drain(i..(i + 2).min(argv.len()));
        return true;
    }
    if let Some(i) = argv
        .iter()
        .position(|a| a.to_string_lossy().starts_with(&with_value))
    {
        argv.remove(i);
        return true;
    }
    match &bad.setting {
        // Before the runtime starts: no other thread reads the environment.
        Some(var) if std::env::var_os(var).is_some() => {
            std::env::remove_var(var);
            true
        }
        _ => false,
    }
}

/// Every command's, and every nested command's (`export ledger`).
fn hide_env_values(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    let cmd = cmd.mut_args(|a| a.hide_env_values(true));
    names
        .iter()
        .fold(cmd, |cmd, name| cmd.mut_subcommand(name, hide_env_values))
}

async fn run(cli: Cli, unparsable: Vec<String>) -> ExitCode {
    match cli.command {
        Command::CheckConfig(args) => {
            tools::check_config::run(&args, &unknown_settings(), &unparsable)
        }
        Command::Serve(args) => run_until_signal(&args, Role::Serve).await,
        Command::Work(args) => run_until_signal(&args, Role::Work).await,
        Command::Migrate(args) => tools::migrate::run(&args).await,
        Command::Audit(args) => exit(tools::audit::run(&args).await),
        Command::Inspect(args) => exit(tools::ops::inspect(&args).await),
        Command::Replay(args) => exit(tools::ops::replay(&args).await),
        Command::Events(args) => exit(tools::ops::events(&args).await),
        Command::Prune(args) => exit(tools::ops::prune(&args).await),
        Command::Export(args) => exit(tools::finance::export(&args).await),
        Command::Erase(args) => exit(tools::finance::erase(&args).await),
        Command::Reconcile(args) => tools::reconcile::run(&args).await,
        Command::Send(args) => exit(tools::send::send(&args).await.map(|(status, body)| {
            println!("{status} {body}");
            (200..300).contains(&status)
        })),
        // Ctrl-C stops launching; deliveries in flight end and are reported.
        Command::Load(args) => exit(
            tools::load::command(&args, ctrl_c())
                .await
                .map_err(|e| e.to_string()),
        ),
    }
}

/// `serve` or `work` until SIGTERM or SIGINT: telemetry first, then the
/// settings (exit 2 naming a bad one), then the build (exit 1 when it
/// fails), then the run and its drain, which also bounds the last export of
/// spans (FENCEHOOK_SHUTDOWN_TIMEOUT_MS).
async fn run_until_signal(args: &ServeArgs, role: Role) -> ExitCode {
    let telemetry = match startup::telemetry(args).await {
        Ok(t) => t,
        Err(e) => return invalid_configuration(&e),
    };
    let cfg = match startup::settings(args, role, &unknown_settings()).await {
        Ok(cfg) => cfg,
        Err(e) => return invalid_configuration(&e),
    };
    let drain = std::time::Duration::from_millis(args.shutdown_timeout_ms);
    match role {
        Role::Serve => {
            let app = match App::build(cfg).await {
                Ok(app) => app,
                Err(e) => return cannot_start(&e),
            };
            startup::warn_unreachable(&app.state().health).await;
            tracing::info!(
                port = app.port(),
                admin_port = app.admin_port(),
                "fencehook serving"
            );
            app.run_until_stopped(shutdown_signal()).await;
        }
        Role::Work => {
            let workers = match Workers::build(cfg).await {
                Ok(w) => w,
                Err(e) => return cannot_start(&e),
            };
            tracing::info!("fencehook working");
            workers.run_until_stopped(shutdown_signal()).await;
        }
    }
    telemetry.shutdown(drain).await;
    ExitCode::SUCCESS
}

/// A bad setting: one line naming it, exit 2.
fn invalid_configuration(e: &str) -> ExitCode {
    eprintln!("fencehook: invalid configuration: {e}");
    ExitCode::from(2)
}

/// The build failed (a listener that cannot bind, a failed migration): exit 1.
fn cannot_start(e: &AppError) -> ExitCode {
    eprintln!("fencehook: cannot start: {}", fencehook::report::chain(e));
    ExitCode::FAILURE
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
/// setting; a bad value of a flag that is no setting (`events --status
/// deadd`) names the flag and the values it takes. Help, version and usage
/// errors are printed as clap formats them.
fn bad_arguments(e: clap::Error) -> ExitCode {
    match invalid_value(&e) {
        Some(bad) => {
            eprintln!("fencehook: {}", bad.line);
            ExitCode::from(2)
        }
        None => {
            let _ = e.print();
            if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

/// What `e` says of a value it could not parse; `None` for other errors.
fn invalid_value(e: &clap::Error) -> Option<InvalidValue> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
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
        .and_then(|a| a.get_env().map(|env| env.to_string_lossy().into_owned()));
    let value = e
        .get(ContextKind::InvalidValue)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let valid = e
        .get(ContextKind::ValidValue)
        .map(|v| format!(" (one of: {v})"))
        .unwrap_or_default();
    let suggested = match e.get(ContextKind::SuggestedValue) {
        Some(ContextValue::String(near)) => format!("; did you mean `{near}`?"),
        _ => String::new(),
    };
    // A value parser's own reason (`--since 100000y`: before any date).
    let why = std::error::Error::source(e)
        .map(|reason| format!(": {reason}"))
        .unwrap_or_default();
    let line = match &setting {
        Some(setting) => format!(
            "invalid configuration: {setting}: invalid value `{value}`{valid}{suggested}{why}"
        ),
        None => format!("--{long}: invalid value `{value}`{valid}{suggested}{why}"),
    };
    Some(InvalidValue {
        long,
        setting,
        line,
    })
}

/// The warnings about variables that look like settings but are none
/// ([`startup::unknown_settings`]), given every command's setting variables.
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
    startup::unknown_settings(&known)
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
