//! `fencehook migrate`: the migrations in sql/, applied with the database
//! owner's rights, once, before (or instead of) `FENCEHOOK_MIGRATE_ON_START`.

use std::process::ExitCode;

use fencehook::config::{DbArgs, LogFormat};
use fencehook::store::migrate::{self, MissingDatabase};

/// `fencehook migrate`.
#[derive(clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Create the database named in DATABASE_URL when it does not exist
    /// (without it, a missing database is an error: a typo must not become
    /// a new, empty database).
    #[arg(long)]
    create_database: bool,
}

/// Exits 0 with the count applied, 1 when a migration failed, 2 on a bad
/// DATABASE_URL.
pub async fn run(args: &MigrateArgs) -> ExitCode {
    // No trace settings: cannot fail.
    let _ = fencehook::telemetry::install(LogFormat::Text, "info", None);
    let missing = if args.create_database {
        MissingDatabase::Create
    } else {
        MissingDatabase::Refuse
    };
    let url = match args.db.url() {
        Ok(url) => url,
        Err(e) => {
            eprintln!("fencehook: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    match migrate::run(url, missing).await {
        Ok(applied) => {
            println!("migrate: {} migration(s) applied", applied.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "fencehook: migrate failed: {}",
                fencehook::report::chain(&e)
            );
            ExitCode::FAILURE
        }
    }
}
