//! How `serve` and `work` start, in this order: log lines (and traces) in
//! the chosen format first, so that every start line is in it
//! ([`telemetry`]); then the settings, validated, with where the data goes
//! logged ([`settings`]); once built, the backends that do not answer yet
//! are said ([`warn_unreachable`]).
//!
//! Both start before their database: when PostgreSQL does not
//! answer yet (a host booting, a failover under way, an orchestrator starting
//! everything at once), the migration step waits for it with a backoff
//! instead of ending the process. Meanwhile `serve`'s admin listener already
//! answers: `/healthz` 200, `/readyz` 503 naming what is missing. Only a
//! database that is *unreachable* is waited for: a refusal that will not go
//! away by itself (a wrong password, a missing database, a TLS handshake
//! refused by the settings, a failed migration)
//! still stops the start, and one-shot commands never come here.

use std::time::{Duration, Instant};

use crate::config::{Config, ServeArgs};
use crate::health::Health;
use crate::store::migrate::{self, MigrateError};
use crate::store::{classify, DbErrorKind};
use crate::telemetry::Telemetry;

/// First pause after a failed try; doubled after each, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The wait is logged when it starts and then at most this often, not once a try.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// The two long-running commands, which start alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `fencehook serve`: the listeners, and the inbox's workers in inbox mode.
    Serve,
    /// `fencehook work`: the inbox's workers, no listeners.
    Work,
}

/// Log lines and, when an OTLP endpoint is set, traces; before anything
/// else, so that every start line is in the chosen format. An `Err` is a
/// bad trace setting, named (the command exits 2).
pub async fn telemetry(args: &ServeArgs) -> Result<Telemetry, String> {
    let traces = args.traces.validate().map_err(|e| e.to_string())?;
    let telemetry = crate::telemetry::install(args.log_format, &args.log, traces.as_ref())?;
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

/// The settings of `role`, validated once telemetry is up: `unknown` (the
/// variables that look like settings but are none) and the configuration's
/// own warnings are logged (`work` has no providers or admin listener to
/// warn about), then where the data goes, then the Redis TLS is checked
/// against its node. An `Err` is one line naming the bad setting (the
/// command exits 2).
pub async fn settings(args: &ServeArgs, role: Role, unknown: &[String]) -> Result<Config, String> {
    for warning in unknown {
        tracing::warn!("{warning}");
    }
    let cfg = match role {
        Role::Serve => args.validate(),
        Role::Work => args.validate_for_workers(),
    }
    .map_err(|e| e.to_string())?;
    if role == Role::Serve {
        for warning in cfg.warnings() {
            tracing::warn!("{warning}");
        }
    }
    log_targets(&cfg);
    crate::lease::redis::verify_tls(&cfg.lease)
        .await
        .map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// The start log says where the data goes: which database and which Redis
/// (never a password), the lease backend and the mode.
fn log_targets(cfg: &Config) {
    tracing::info!(
        database = %crate::config::database_target(&cfg.db.url),
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
pub async fn warn_unreachable(health: &Health) {
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

/// The warnings about variables that look like settings but are none,
/// given every setting's variable (`known`): unknown `FENCEHOOK_*` ones,
/// renamed ones and near misses of any setting (`DATABSE_URL`). A typo would
/// otherwise leave a default silently in force. `serve` and `work` log them
/// (as JSON with `FENCEHOOK_LOG_FORMAT=json`, so that every start line
/// parses), `check-config` prints them.
pub fn unknown_settings(known: &[String]) -> Vec<String> {
    crate::config::misspelt_settings(known, std::env::vars())
        .into_iter()
        .map(|(name, near)| {
            let renamed = crate::config::RENAMED_SETTINGS
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

/// Whether `e` says the database is not reachable (yet), as opposed to a
/// refusal that retrying will not cure.
fn worth_waiting_for(e: &MigrateError) -> bool {
    match e {
        // A TLS handshake that fails (a wrong CA, a server without TLS under
        // `sslmode=require`) is a setting to fix: it never cures itself.
        MigrateError::Connect(e) | MigrateError::Db(e) => {
            classify(e) == DbErrorKind::Connection && !crate::db::tls::is_tls_failure(e)
        }
        _ => false,
    }
}

/// The next pause of the backoff.
fn next_backoff(pause: Duration) -> Duration {
    (pause * 2).min(MAX_BACKOFF)
}

/// [`migrate::ensure_current`], once PostgreSQL answers: tries again with a
/// backoff while it is unreachable. Returns the migrations applied.
pub async fn migrate_when_reachable(url: &str) -> Result<Vec<String>, MigrateError> {
    let started = Instant::now();
    let mut pause = FIRST_BACKOFF;
    let mut tries = 0u64;
    let mut logged: Option<Instant> = None;
    loop {
        tries += 1;
        match migrate::ensure_current(url).await {
            Ok(applied) => {
                if logged.is_some() {
                    tracing::info!(
                        tries,
                        waited_secs = started.elapsed().as_secs(),
                        "PostgreSQL answers; the start goes on"
                    );
                }
                return Ok(applied);
            }
            Err(e) if worth_waiting_for(&e) => {
                if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                    tracing::warn!(
                        tries,
                        waited_secs = started.elapsed().as_secs(),
                        error = %crate::report::chain(&e),
                        "PostgreSQL does not answer; waiting for it before migrating (/readyz says 503 meanwhile)"
                    );
                    logged = Some(Instant::now());
                }
                tokio::time::sleep(pause).await;
                pause = next_backoff(pause);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_bound() {
        let mut pause = FIRST_BACKOFF;
        let mut seen = vec![pause];
        for _ in 0..8 {
            pause = next_backoff(pause);
            seen.push(pause);
        }
        assert_eq!(seen[1], FIRST_BACKOFF * 2);
        assert_eq!(*seen.last().unwrap(), MAX_BACKOFF);
        assert!(seen.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_missing_database_is_not_waited_for() {
        let e = MigrateError::NoDatabase {
            name: "x".to_owned(),
        };
        assert!(!worth_waiting_for(&e));
    }
}
