//! The PostgreSQL settings, shared by `serve`, `work`, `migrate` and the
//! operators' commands. There is no built-in `DATABASE_URL`: a misspelt
//! variable must stop the start, never serve (or migrate) some other
//! database (`make run` supplies one for development). A URL that does not
//! say what its writer meant (a raw `@` or `/` in the password) is a setting
//! to fix, said at once, never a host to wait for.

use std::time::Duration;

use clap::Args;

use super::{bad, setting, ConfigError, ConfigErrors, Found};

/// PostgreSQL settings, shared by `serve`, `migrate` and `audit`.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL URL (required: there is no default database). Special
    /// characters in the user or password are percent-encoded (`@` as %40,
    /// `/` as %2F). `migrate --create-database` creates a missing database;
    /// nothing else does.
    #[arg(long, env = setting::DATABASE_URL, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Connections in the pool.
    #[arg(long, env = setting::FENCEHOOK_DB_POOL_SIZE, default_value_t = 16)]
    pub db_pool_size: usize,
    /// Longest a request waits for a pooled connection before answering 503.
    #[arg(long, env = setting::FENCEHOOK_DB_POOL_WAIT_MS, default_value_t = 2000)]
    pub db_pool_wait_ms: u64,
    /// statement_timeout of every connection.
    #[arg(
        long,
        env = setting::FENCEHOOK_DB_STATEMENT_TIMEOUT_MS,
        default_value_t = 5000
    )]
    pub db_statement_timeout_ms: u64,
    /// Timeout of opening one connection.
    #[arg(long, env = setting::FENCEHOOK_DB_CONNECT_TIMEOUT_MS, default_value_t = 3000)]
    pub db_connect_timeout_ms: u64,
}

/// PostgreSQL pool settings, validated.
#[derive(Debug, Clone)]
pub struct DbConfig {
    pub url: String,
    pub pool_size: usize,
    pub pool_wait: Duration,
    pub statement_timeout: Duration,
    pub connect_timeout: Duration,
}

impl DbArgs {
    /// `DATABASE_URL`, checked: set, and parsing as its writer meant. Also
    /// reads `sslrootcert`: a file that is missing or holds no certificate
    /// stops the start here, not at the first connection.
    pub fn url(&self) -> Result<&str, ConfigError> {
        let url = self
            .database_url
            .as_deref()
            .filter(|u| !u.trim().is_empty())
            .ok_or_else(|| {
                bad(
                    setting::DATABASE_URL,
                    "is not set, and fencehook has no default database: set the URL of its database (postgres://USER:PASSWORD@HOST:5432/DB; `make run` sets one for development)",
                )
            })?;
        crate::db::tls::Target::parse(url)
            .map_err(|e| bad(setting::DATABASE_URL, crate::report::chain(&e)))?;
        Ok(url)
    }

    /// Every PostgreSQL setting checked, each bad one named.
    pub fn validate(&self) -> Result<DbConfig, ConfigErrors> {
        let mut found = Found::default();
        let url = found.ok(self.url());
        if self.db_pool_size == 0 {
            found.refuse(setting::FENCEHOOK_DB_POOL_SIZE, "must be at least 1");
        }
        if self.db_statement_timeout_ms == 0 {
            found.refuse(
                setting::FENCEHOOK_DB_STATEMENT_TIMEOUT_MS,
                "must be above 0 (0 would disable the timeout)",
            );
        }
        found.finish(url, |url| DbConfig {
            url: url.to_owned(),
            pool_size: self.db_pool_size,
            pool_wait: Duration::from_millis(self.db_pool_wait_ms),
            statement_timeout: Duration::from_millis(self.db_statement_timeout_ms),
            connect_timeout: Duration::from_millis(self.db_connect_timeout_ms.max(1)),
        })
    }
}

/// Where a database URL points, for the start log: every host with its
/// port (a multi-host URL lists the nodes of a failover pair or cluster, and
/// an operator needs to see that all of them were taken) and the database
/// name; never the user or password.
pub fn database_target(url: &str) -> String {
    let Ok(target) = crate::db::tls::Target::parse(url) else {
        return "?".to_owned();
    };
    let cfg = target.config;
    let ports = cfg.get_ports();
    // One port given applies to every host; none means the default.
    let port_of = |i: usize| match ports.len() {
        0 => 5432,
        1 => ports[0],
        _ => ports.get(i).copied().unwrap_or(5432),
    };
    let hosts: Vec<String> = match cfg.get_hosts() {
        [] => vec![format!("localhost:{}", port_of(0))],
        hosts => hosts
            .iter()
            .enumerate()
            .map(|(i, h)| match h {
                tokio_postgres::config::Host::Tcp(h) => format!("{h}:{}", port_of(i)),
                tokio_postgres::config::Host::Unix(p) => format!("{}:{}", p.display(), port_of(i)),
            })
            .collect(),
    };
    format!("{}/{}", hosts.join(","), cfg.get_dbname().unwrap_or("?"))
}
