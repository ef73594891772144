//! `serve` and `work` start before their database: when PostgreSQL does not
//! answer yet (a host booting, a failover under way, an orchestrator starting
//! everything at once), the migration step waits for it with a backoff
//! instead of ending the process. Meanwhile `serve`'s admin listener already
//! answers: `/healthz` 200, `/readyz` 503 naming what is missing. Only a
//! database that is *unreachable* is waited for: a refusal that will not go
//! away by itself (a wrong password, a missing database, a TLS handshake
//! refused by the settings, a failed migration)
//! still stops the start, and one-shot commands never come here.

use std::time::{Duration, Instant};

use crate::store::migrate::{self, MigrateError};
use crate::store::{classify, DbErrorKind};

/// First pause after a failed try; doubled after each, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The wait is logged when it starts and then at most this often, not once a try.
const LOG_EVERY: Duration = Duration::from_secs(30);

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
