//! Migrations: the numbered files in `sql/`, embedded at compile time and
//! applied with refinery (history in `refinery_schema_history`). Several
//! instances may start at once, so the run is serialised by an advisory lock.
//! A missing database is created only when asked ([`MissingDatabase`]), and
//! a current schema costs `serve` one `SELECT`, no DDL ([`ensure_current`]).

use tokio_postgres::error::SqlState;

use crate::config::setting;
use crate::db::tls::{self, Target};

mod embedded {
    refinery::embed_migrations!("sql");
}

/// Arbitrary, fixed key of the advisory lock that serialises migration runs.
const MIGRATION_LOCK_KEY: i64 = 0x6665_6e63_6568_6f6f; // "fencehoo"

/// The oldest schema this binary books on: V7. Without a downstream service
/// and a PayPal provider it reads and writes nothing that V8's domains, V11's
/// wake-up trigger or a later migration added (domains only tighten what the
/// columns take; without the trigger, waiting events fall back to their
/// pause), so an upgrade can roll the binaries before the migration.
pub const MIN_SCHEMA_VERSION: i32 = 7;

/// PayPal deliveries bind their transmission id in `paypal_transmissions`.
const PAYPAL_SCHEMA_VERSION: i32 = 9;
/// The downstream path reserves a refund's money in `payments.reserved`.
const DOWNSTREAM_SCHEMA_VERSION: i32 = 10;

/// The oldest schema a configuration books on: [`MIN_SCHEMA_VERSION`], or
/// V9 with a PayPal provider, V10 with a downstream service. `/readyz` is
/// 503 below it, so no load balancer sends a delivery that would answer 503
/// for want of a migration.
pub fn min_schema_version(downstream: bool, paypal: bool) -> i32 {
    if downstream {
        DOWNSTREAM_SCHEMA_VERSION
    } else if paypal {
        PAYPAL_SCHEMA_VERSION
    } else {
        MIN_SCHEMA_VERSION
    }
}

/// The newest migration embedded in this binary.
pub fn latest_version() -> i32 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| m.version())
        .max()
        .unwrap_or_default()
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{}", setting::DATABASE_URL)]
    Url(#[source] tls::UrlError),
    #[error("cannot connect to PostgreSQL")]
    Connect(#[source] tokio_postgres::Error),
    /// A setting to fix (the sslmode, the CA), so it names it.
    #[error(
        "{}: no TLS connection to PostgreSQL as its sslmode asks",
        setting::DATABASE_URL
    )]
    Tls(#[source] tokio_postgres::Error),
    #[error("database `{name}` does not exist; create it with `fencehook migrate --create-database` (or fix the name in {})", setting::DATABASE_URL)]
    NoDatabase { name: String },
    #[error("cannot create database `{name}`")]
    CreateDatabase {
        name: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// The role may not create what a migration creates: `serve` started as
    /// the app role on a database nobody migrated (or not since an upgrade).
    #[error("the role `{role}` may not create fencehook's tables (permission denied): run `fencehook migrate` as the database's owner ({} of the owner role) first, then start again", setting::DATABASE_URL)]
    NoPrivilege {
        role: String,
        #[source]
        source: refinery::Error,
    },
    #[error("migration failed")]
    Run(#[from] refinery::Error),
    #[error("database error")]
    Db(#[from] tokio_postgres::Error),
}

impl MigrateError {
    fn connect(e: tokio_postgres::Error) -> MigrateError {
        if tls::is_tls_failure(&e) {
            MigrateError::Tls(e)
        } else {
            MigrateError::Connect(e)
        }
    }
}

/// What to do when the database named in the URL does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingDatabase {
    /// `fencehook migrate --create-database`: create it (a deliberate act).
    Create,
    /// Everything else: stop, and say how to create it. A mistyped database
    /// name must not become a new, empty, "ready" database.
    Refuse,
}

/// Applies every pending migration. Returns the versions applied by this call.
pub async fn run(url: &str, missing: MissingDatabase) -> Result<Vec<String>, MigrateError> {
    run_until(url, missing, refinery::Target::Latest).await
}

/// What `serve` and `work` do at start: nothing at all when the schema is
/// current — no DDL, no lock, so a role with only DML rights can run them —
/// else apply the pending migrations (which needs the owner's rights).
/// Never creates the database.
pub async fn ensure_current(url: &str) -> Result<Vec<String>, MigrateError> {
    let cfg = Target::parse(url).map_err(MigrateError::Url)?;
    let client = connect_existing(&cfg).await?;
    if schema_is_current(&client).await? {
        return Ok(Vec::new());
    }
    drop(client);
    run(url, MissingDatabase::Refuse).await
}

/// Whether every embedded migration is recorded as applied.
async fn schema_is_current(client: &tokio_postgres::Client) -> Result<bool, MigrateError> {
    let latest = latest_version();
    match client
        .query_one("SELECT max(version) FROM refinery_schema_history", &[])
        .await
    {
        Ok(row) => Ok(row.get::<_, Option<i32>>(0).unwrap_or_default() >= latest),
        // No history table yet: a new database.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(false),
        Err(e) => Err(MigrateError::Db(e)),
    }
}

/// Applies the migrations up to `version` only: a test's database as an
/// older release left it, to check what a later migration does to its rows.
#[cfg(feature = "test-support")]
pub async fn run_to(url: &str, version: i32) -> Result<Vec<String>, MigrateError> {
    run_until(
        url,
        MissingDatabase::Create,
        refinery::Target::Version(version),
    )
    .await
}

async fn run_until(
    url: &str,
    missing: MissingDatabase,
    target: refinery::Target,
) -> Result<Vec<String>, MigrateError> {
    let cfg = Target::parse(url).map_err(MigrateError::Url)?;
    let mut client = match missing {
        MissingDatabase::Create => connect_or_create(&cfg).await?,
        MissingDatabase::Refuse => connect_existing(&cfg).await?,
    };
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    let result = embedded::migrations::runner()
        .set_target(target)
        .run_async(&mut client)
        .await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    let report = result.map_err(|e| refused(e, &cfg))?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(|m| m.to_string())
        .collect())
}

/// A migration the role was not allowed to run, said as such; any other
/// failure as it is.
fn refused(e: refinery::Error, cfg: &Target) -> MigrateError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(c) = cause {
        let denied = c
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(|pg| pg.code())
            .is_some_and(|code| *code == SqlState::INSUFFICIENT_PRIVILEGE);
        if denied {
            return MigrateError::NoPrivilege {
                role: cfg.config.get_user().unwrap_or("?").to_owned(),
                source: e,
            };
        }
        cause = c.source();
    }
    MigrateError::Run(e)
}

async fn connect(cfg: &Target) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = cfg.config.connect(cfg.tls.clone()).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "migration connection closed");
        }
    });
    Ok(client)
}

/// Connects to the database, or says plainly that it does not exist.
async fn connect_existing(cfg: &Target) -> Result<tokio_postgres::Client, MigrateError> {
    match connect(cfg).await {
        Ok(c) => Ok(c),
        Err(e) if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) => {
            Err(MigrateError::NoDatabase {
                name: cfg.config.get_dbname().unwrap_or("postgres").to_owned(),
            })
        }
        Err(e) => Err(MigrateError::connect(e)),
    }
}

async fn connect_or_create(cfg: &Target) -> Result<tokio_postgres::Client, MigrateError> {
    let cfg = cfg.clone();
    match connect(&cfg).await {
        Ok(c) => Ok(c),
        Err(e) if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) => {
            let name = cfg.config.get_dbname().unwrap_or("postgres").to_owned();
            let mut admin = cfg.clone();
            admin.config.dbname("postgres");
            let client = connect(&admin).await.map_err(MigrateError::connect)?;
            let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
            match client.batch_execute(&sql).await {
                Ok(()) => tracing::info!(database = %name, "created database"),
                Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => {}
                Err(source) => return Err(MigrateError::CreateDatabase { name, source }),
            }
            connect(&cfg).await.map_err(MigrateError::connect)
        }
        Err(e) => Err(MigrateError::connect(e)),
    }
}
