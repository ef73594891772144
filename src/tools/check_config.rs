//! `fencehook check-config`: the settings and the providers file validated
//! as `serve` would, without starting; every bad one said in one run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fencehook::config::ServeArgs;

/// `fencehook check-config`.
#[derive(clap::Args)]
pub struct CheckConfigArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Read the settings from this file first, as the systemd units'
    /// `EnvironmentFile=` does (`NAME=value` lines, `#` comments, quotes
    /// taken off); its values win over the environment's.
    #[arg(long, value_name = "FILE")]
    pub env_file: Option<PathBuf>,
}

/// `check-config --env-file FILE`: the file's settings put in the
/// environment before the command line is parsed (its settings are read
/// from there). Called before the runtime starts: no other thread reads the
/// environment yet.
pub fn load_env_file(argv: &[std::ffi::OsString]) -> Result<(), String> {
    if argv.get(1).is_none_or(|a| a != "check-config") {
        return Ok(());
    }
    let args: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let file = args
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix("--env-file") {
            Some("") => args.get(i + 1).cloned(),
            Some(rest) => rest.strip_prefix('=').map(str::to_owned),
            None => None,
        });
    let Some(file) = file else {
        return Ok(());
    };
    for (name, value) in read_env_file(Path::new(&file))? {
        std::env::set_var(name, value);
    }
    Ok(())
}

/// The `NAME=value` lines of an environment file as systemd reads one:
/// blank lines and `#` or `;` comments skipped, one pair of surrounding
/// quotes taken off a value (backslash escapes kept only inside double
/// quotes, as systemd does).
pub fn read_env_file(path: &Path) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--env-file: cannot read {}: {e}", path.display()))?;
    let mut vars = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!(
                "--env-file: {}:{}: not NAME=value",
                path.display(),
                n + 1
            ));
        };
        vars.push((name.trim().to_owned(), unquote(value.trim())));
    }
    Ok(vars)
}

fn unquote(value: &str) -> String {
    let quoted = |q: char| value.len() >= 2 && value.starts_with(q) && value.ends_with(q);
    if quoted('\'') {
        return value[1..value.len() - 1].to_owned();
    }
    if !quoted('"') {
        return value.to_owned();
    }
    let mut out = String::new();
    let mut chars = value[1..value.len() - 1].chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// A person's command: plain lines, whatever FENCEHOOK_LOG_FORMAT says.
/// (`--env-file` was read before the command line: [`load_env_file`].)
/// Prints the `unknown` settings' warnings and the configuration's, then one
/// line summing it up (exit 0); or one line per bad setting (exit 2): the
/// values that did not parse at all (`unparsable`, already said as lines,
/// left out of `args`), then every check that failed.
pub fn run(args: &CheckConfigArgs, unknown: &[String], unparsable: &[String]) -> ExitCode {
    let args = &args.serve;
    for warning in unknown {
        eprintln!("fencehook: warning: {warning}");
    }
    for line in unparsable {
        eprintln!("fencehook: {line}");
    }
    match args.validate() {
        Ok(_) if !unparsable.is_empty() => ExitCode::from(2),
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
                cfg.downstream_url.as_ref().map_or("none".to_owned(), |u| {
                    let trust = &cfg.downstream_trust;
                    format!(
                        "{} ({}{})",
                        fencehook::config::redacted_url(u),
                        if trust.key.is_some() { "signed" } else { "unsigned" },
                        if trust.roots.is_some() { ", its CA file" } else { "" }
                    )
                }),
                cfg.traces.as_ref().map_or("off".to_owned(), |t| format!("to {}", t.target())),
            );
            let reconcile: Vec<String> = cfg
                .providers
                .iter()
                .map(|p| format!("{} ({})", p.name, p.events_api().as_str()))
                .collect();
            println!("reconcile: {}", reconcile.join(", "));
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in errors.all() {
                eprintln!("fencehook: invalid configuration: {e}");
            }
            ExitCode::from(2)
        }
    }
}
