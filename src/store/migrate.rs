//! Migrations: the numbered files in `sql/`, embedded at compile time and
//! applied with refinery (history in `refinery_schema_history`). Several
//! instances may start at once, so the run is serialised by an advisory lock.

use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

mod embedded {
    refinery::embed_migrations!("sql");
}

/// Arbitrary, fixed key of the advisory lock that serialises migration runs.
const MIGRATION_LOCK_KEY: i64 = 0x6665_6e63_6568_6f6f; // "fencehoo"

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot connect to PostgreSQL")]
    Connect(#[source] tokio_postgres::Error),
    #[error("cannot create database `{name}`")]
    CreateDatabase {
        name: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("migration failed")]
    Run(#[from] refinery::Error),
    #[error("database error")]
    Db(#[from] tokio_postgres::Error),
}

/// Applies every pending migration; creates the database first when it does
/// not exist. Returns the versions applied by this call.
pub async fn run(url: &str) -> Result<Vec<String>, MigrateError> {
    run_until(url, refinery::Target::Latest).await
}

/// Applies the migrations up to `version` only: a test's database as an
/// older release left it, to check what a later migration does to its rows.
#[cfg(feature = "test-support")]
pub async fn run_to(url: &str, version: i32) -> Result<Vec<String>, MigrateError> {
    run_until(url, refinery::Target::Version(version)).await
}

async fn run_until(url: &str, target: refinery::Target) -> Result<Vec<String>, MigrateError> {
    let mut client = connect_or_create(url).await?;
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
    let report = result?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(|m| m.to_string())
        .collect())
}

async fn connect(
    cfg: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = cfg.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "migration connection closed");
        }
    });
    Ok(client)
}

async fn connect_or_create(url: &str) -> Result<tokio_postgres::Client, MigrateError> {
    let cfg: tokio_postgres::Config = url.parse().map_err(MigrateError::Connect)?;
    match connect(&cfg).await {
        Ok(c) => Ok(c),
        Err(e) if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) => {
            let name = cfg.get_dbname().unwrap_or("postgres").to_owned();
            let mut admin = cfg.clone();
            admin.dbname("postgres");
            let client = connect(&admin).await.map_err(MigrateError::Connect)?;
            let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
            match client.batch_execute(&sql).await {
                Ok(()) => tracing::info!(database = %name, "created database"),
                Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => {}
                Err(source) => return Err(MigrateError::CreateDatabase { name, source }),
            }
            connect(&cfg).await.map_err(MigrateError::Connect)
        }
        Err(e) => Err(MigrateError::Connect(e)),
    }
}
