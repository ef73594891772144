//! `fencehook check-config`: the settings and the providers file validated
//! as `serve` would, without starting.

use std::process::ExitCode;

use fencehook::config::ServeArgs;

/// A person's command: plain lines, whatever FENCEHOOK_LOG_FORMAT says.
/// Prints the `unknown` settings' warnings and the configuration's, then one
/// line summing it up (exit 0), or the first bad setting (exit 2).
pub fn run(args: &ServeArgs, unknown: &[String]) -> ExitCode {
    for warning in unknown {
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
