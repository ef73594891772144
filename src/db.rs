//! PostgreSQL connection pools: one builder for the store's pool and the
//! PostgreSQL lease backend's, so both connect, time out and recover alike.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use crate::config::DbConfig;

pub mod tls;

/// What a pool is for: its name in `pg_stat_activity`, its size and its bounds.
pub struct PoolSpec<'a> {
    pub application_name: &'a str,
    pub statement_timeout: Duration,
    pub size: usize,
    /// Longest a caller waits for a connection.
    pub wait: Duration,
    /// PostgreSQL's `idle_in_transaction_session_timeout`: a transaction left
    /// open and idle this long is ended by the server, its locks released.
    /// `None` leaves the server's default (tools, tests).
    pub idle_in_transaction: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum PoolBuildError {
    #[error("{}", crate::config::setting::DATABASE_URL)]
    Url(#[source] tls::UrlError),
    #[error("cannot build the connection pool")]
    Build(#[source] deadpool_postgres::BuildError),
}

/// A lazily connecting pool on `cfg.url` whose connections carry
/// `application_name`, `statement_timeout` (and the idle-in-transaction
/// timeout, when given), recycled with a cheap
/// is-closed check, so connections cut by a failure are replaced by
/// themselves. Nothing connects here: a database that is down at start makes
/// requests answer 503 (and `/readyz` say so) instead of stopping the process.
pub fn pool(cfg: &DbConfig, spec: PoolSpec<'_>) -> Result<Pool, PoolBuildError> {
    pool_with_retire(cfg, spec, &Retire::default())
}

/// Connections opened before a moment, never handed out again: set when a
/// probe finds the node read-only, so the connections a failover left on a
/// demoted primary (also those in use then) are replaced at their next
/// checkout instead of refusing writes until they break.
#[derive(Clone, Default)]
pub struct Retire(Arc<Mutex<Option<Instant>>>);

impl Retire {
    /// Retires every connection open now.
    pub fn all_open_now(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    fn retired(&self, created: Instant) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|before| created <= before)
    }
}

/// As [`pool`], with connections retired by `retire` dropped at checkout.
pub fn pool_with_retire(
    cfg: &DbConfig,
    spec: PoolSpec<'_>,
    retire: &Retire,
) -> Result<Pool, PoolBuildError> {
    let tls::Target {
        config: mut pg,
        tls,
        ..
    } = tls::Target::parse(&cfg.url).map_err(PoolBuildError::Url)?;
    pg.application_name(spec.application_name);
    let mut options = format!(
        "-c statement_timeout={}",
        spec.statement_timeout.as_millis().max(1)
    );
    if let Some(idle) = spec.idle_in_transaction {
        options.push_str(&format!(
            " -c idle_in_transaction_session_timeout={}",
            idle.as_millis().max(1)
        ));
    }
    pg.options(options);
    pg.connect_timeout(cfg.connect_timeout);
    pg.keepalives(true);
    pg.keepalives_idle(Duration::from_secs(10));
    let manager = Manager::from_config(
        pg,
        tls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let retire = retire.clone();
    Pool::builder(manager)
        .pre_recycle(Hook::sync_fn(move |_, metrics| {
            if retire.retired(metrics.created) {
                Err(HookError::message("opened on a node that became read-only"))
            } else {
                Ok(())
            }
        }))
        .max_size(spec.size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(spec.wait))
        .create_timeout(Some(cfg.connect_timeout))
        .recycle_timeout(Some(cfg.connect_timeout))
        .build()
        .map_err(PoolBuildError::Build)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retiring_covers_the_connections_open_then_and_not_later_ones() {
        let retire = Retire::default();
        let before = Instant::now();
        assert!(!retire.retired(before), "nothing retired yet");
        retire.all_open_now();
        assert!(retire.retired(before));
        std::thread::sleep(Duration::from_millis(2));
        assert!(!retire.retired(Instant::now()));
    }
}
