//! Databases a crashed test run left behind. Each test database's name
//! carries its creation time (`fh_test_<unix seconds>_<random>`); the first
//! test context of a process drops every `fh_test_*` database older than an
//! hour that no session is connected to. The age keeps it off a database a
//! concurrently running test process is using (no test runs for an hour),
//! the connection check off one a hung but living process still holds. A
//! name without a time (older harnesses) is aged by its directory's last
//! change, when the server lets this user read it (`pg_stat_file`).

use std::time::Duration;

/// How old a test database must be before a test run drops it.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// A new test database's name, created at `unix` seconds.
pub fn database_name(unix: i64) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("fh_test_{unix}_{}", &id[..12])
}

/// The creation time a test database's name carries.
fn created_at(name: &str) -> Option<i64> {
    let (unix, _) = name.strip_prefix("fh_test_")?.split_once('_')?;
    unix.parse().ok()
}

/// Sweeps once per test process (the first test context waits for it; its
/// errors are printed, never a test's failure).
pub async fn once() {
    static SWEPT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SWEPT
        .get_or_init(|| async {
            if let Err(e) = stale_databases(&super::database_admin_url(), STALE_AFTER).await {
                eprintln!("sweeping stale fh_test_* databases: {e}");
            }
        })
        .await;
}

/// Drops every `fh_test_*` database older than `older_than` with no session
/// on it; returns the names dropped.
pub async fn stale_databases(
    admin_url: &str,
    older_than: Duration,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let (admin, conn) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let idle = "FROM pg_database d WHERE d.datname LIKE 'fh\\_test\\_%' \
                AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datid = d.oid)";
    let rows = match admin
        .query(
            &format!(
                "SELECT d.datname, extract(epoch FROM \
                 (pg_stat_file('base/' || d.oid, true)).modification)::bigint {idle}"
            ),
            &[],
        )
        .await
    {
        Ok(rows) => rows,
        // No right to read the data directory: names with a time only.
        Err(_) => {
            admin
                .query(&format!("SELECT d.datname, NULL::bigint {idle}"), &[])
                .await?
        }
    };
    let now = super::now();
    let mut dropped = Vec::new();
    for row in rows {
        let name: String = row.get(0);
        let changed: Option<i64> = row.get(1);
        let Some(created) = created_at(&name).or(changed) else {
            continue;
        };
        if now - created < older_than.as_secs() as i64 {
            continue;
        }
        // No FORCE: a session that connected since the check keeps it.
        if admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\""))
            .await
            .is_ok()
        {
            dropped.push(name);
        }
    }
    Ok(dropped)
}

#[test]
fn a_test_database_name_carries_its_creation_time() {
    let name = database_name(1_765_000_000);
    assert!(name.starts_with("fh_test_1765000000_"), "{name}");
    assert!(name.len() <= 63, "fits PostgreSQL's name limit: {name}");
    assert_eq!(created_at(&name), Some(1_765_000_000));
    assert_eq!(created_at("fh_test_89517559fb5341bd"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_runs_database_is_swept_and_a_fresh_or_used_one_stays() {
    let admin_url = super::database_admin_url();
    let (admin, conn) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let two_hours_ago = super::now() - 7200;
    let stale = database_name(two_hours_ago);
    let stale_in_use = database_name(two_hours_ago);
    let fresh = database_name(super::now());
    for name in [&stale, &stale_in_use, &fresh] {
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap();
    }
    let (user, conn) = tokio_postgres::connect(
        &super::with_dbname(&admin_url, &stale_in_use),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    let held = tokio::spawn(conn);

    stale_databases(&admin_url, STALE_AFTER).await.unwrap();

    let exists = |name: String| {
        let admin = &admin;
        async move {
            admin
                .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
                .await
                .unwrap()
                .is_some()
        }
    };
    let (stale_left, in_use_left, fresh_left) = (
        exists(stale.clone()).await,
        exists(stale_in_use.clone()).await,
        exists(fresh.clone()).await,
    );
    drop(user);
    let _ = held.await;
    for name in [&stale, &stale_in_use, &fresh] {
        let _ = admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await;
    }
    assert!(!stale_left, "the crashed run's database is dropped");
    assert!(in_use_left, "a database a session is on stays, however old");
    assert!(fresh_left, "a database younger than an hour stays");
}
