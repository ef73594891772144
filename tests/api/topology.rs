//! The topology an SRE runs: a start that does not race the database, a
//! `/readyz` that tells the truth (a writable node, the schema this binary
//! needs, the lease backend, synchronous replication when required), and a
//! read-only node answered 503 with nothing written. Real `fencehook serve`
//! processes against the machine's PostgreSQL and Redis, through proxies
//! where a backend must be down.

use std::time::Duration;

use crate::helpers::postgres::PrivatePostgres;
use crate::helpers::process::{ServeProcess, WorkProcess};
use crate::helpers::proxy::FaultProxy;
use crate::helpers::{payment, socket_of, wait_for, TestContext};

fn env(ctx: &TestContext) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
    ]
}

fn readyz_json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_started_before_postgres_and_redis_waits_for_them_then_migrates_and_books_once() {
    let ctx = TestContext::empty().await;
    let pg = FaultProxy::start(socket_of(&ctx.database_url)).await;
    let redis = FaultProxy::start(socket_of(&ctx.redis_url)).await;
    pg.cut();
    redis.cut();
    let mut e = env(&ctx);
    e.retain(|(k, _)| *k != "DATABASE_URL" && *k != "REDIS_URL");
    e.push(("DATABASE_URL", ctx.database_url_via(pg.addr())));
    e.push(("REDIS_URL", format!("redis://{}/0", redis.addr())));
    e.push(("FENCEHOOK_MIGRATE_ON_START", "true".to_owned()));
    let mut p = ServeProcess::start_admin_first(&e).await;

    // Both down: alive, not ready, and each missing backend named. It stays
    // so (no exit) for as long as they are down.
    let outage = tokio::time::Instant::now();
    while outage.elapsed() < Duration::from_secs(2) {
        assert_eq!(p.get_admin("/healthz").await.0, 200);
        let (status, body) = p.get_admin("/readyz").await;
        assert_eq!(status, 503, "{body}");
        let v = readyz_json(&body);
        assert!(
            v["postgres"].as_str().unwrap().starts_with("error"),
            "{body}"
        );
        assert!(
            v["lease_backend"].as_str().unwrap().starts_with("error"),
            "{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        p.log_lines("fencehook serving").is_empty(),
        "no public listener before the database"
    );

    pg.restore();
    redis.restore();
    p.wait_serving(Duration::from_secs(30)).await;
    wait_for("/readyz 200", Duration::from_secs(30), || async {
        p.get_admin("/readyz").await.0 == 200
    })
    .await;
    let waiting = p.log_lines("PostgreSQL does not answer; waiting for it");
    let answered = p.log_lines("PostgreSQL answers; the start goes on");
    assert_eq!(
        waiting.len(),
        1,
        "the wait is logged once, not per try: {waiting:?}"
    );
    let tries = readyz_json(&answered[0])["tries"].as_u64().unwrap();
    assert!(tries >= 3, "it tried again and again: {answered:?}");
    assert_eq!(
        ctx.count("SELECT count(*) FROM pg_tables WHERE tablename = 'payments'")
            .await,
        1,
        "migrated once PostgreSQL answered"
    );

    let ev = payment("pay_boot", 1200);
    let r = p.deliver(&ev).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = p.deliver(&ev).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(ctx.entries().await, 1, "booked once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_database_url_stops_the_start_with_one_line_naming_it() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"))
        .arg("serve")
        .env("DATABASE_URL", "postgresql://u:s3cret@h1:notaport/db")
        .env("FENCEHOOK_GENERIC_SECRET", crate::helpers::SECRET)
        .env("FENCEHOOK_LISTEN", "127.0.0.1:0")
        .env("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:0")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("invalid configuration: DATABASE_URL"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
}

/// The start's migration step runs after the admin listener is up and
/// before the public one is bound: with a current schema every backend check
/// passes meanwhile, and a readiness of 200 would route deliveries to a port
/// nobody listens on yet (seen from a container started after its migrate
/// Job). Held there by a failpoint, `/readyz` is 503 until the listener is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_is_503_until_the_public_listener_is_bound_even_with_every_backend_ready() {
    let ctx = TestContext::new().await;
    let mut e = env(&ctx);
    e.push(("FENCEHOOK_MIGRATE_ON_START", "true".to_owned()));
    e.push(("FAILPOINTS", "before_public_bind=sleep(8000)".to_owned()));
    let mut p = ServeProcess::start_admin_first(&e).await;
    let (status, body) = p.get_admin("/readyz").await;
    let v = readyz_json(&body);
    assert!(
        p.log_lines("fencehook serving").is_empty(),
        "still held before the public listener"
    );
    for check in ["postgres", "schema", "lease_backend"] {
        assert_eq!(v[check], "ok", "{check}: {body}");
    }
    assert_eq!(v["listening"], false, "{body}");
    assert_eq!(status, 503, "{body}");

    p.wait_serving(Duration::from_secs(30)).await;
    let (status, body) = p.get_admin("/readyz").await;
    assert_eq!(
        (status, &readyz_json(&body)["listening"]),
        (200, &serde_json::json!(true)),
        "{body}"
    );
    let r = p.deliver(&payment("tx_listening_1", 100)).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unmigrated_database_without_migrate_on_start_is_not_ready_and_readyz_names_the_schema()
{
    let ctx = TestContext::empty().await;
    let p = ServeProcess::start(&env(&ctx)).await;
    let (status, body) = p.get_admin("/readyz").await;
    assert_eq!(status, 503, "{body}");
    let v = readyz_json(&body);
    assert_eq!(v["postgres"], "ok", "{body}");
    assert_eq!(v["lease_backend"], "ok", "{body}");
    let schema = v["schema"].as_str().unwrap();
    assert!(
        schema.contains("version 0") && schema.contains("fencehook migrate"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schema_at_the_oldest_version_this_binary_books_on_is_ready() {
    let ctx = TestContext::at_version(fencehook::store::migrate::MIN_SCHEMA_VERSION).await;
    let p = ServeProcess::start(&env(&ctx)).await;
    let (status, body) = p.get_admin("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(readyz_json(&body)["schema"], "ok", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_database_is_not_ready_its_deliveries_answer_503_and_its_connections_are_dropped(
) {
    let ctx = TestContext::new().await;
    ctx.db()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
            ctx.db_name
        ))
        .await
        .unwrap();
    let p = ServeProcess::start(&env(&ctx)).await;
    let (status, body) = p.get_admin("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        readyz_json(&body)["postgres"]
            .as_str()
            .unwrap()
            .contains("read-only"),
        "{body}"
    );
    for n in 0..3 {
        let r = p.deliver(&payment(&format!("pay_ro_{n}"), 500)).await;
        assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    }
    assert_eq!(ctx.payments().await, 0, "nothing written");
    assert_eq!(ctx.entries().await, 0, "nothing written");
    // A refused write asks for a probe, which finds the node read-only and
    // drops the deliveries' connections rather than keep handing them out.
    wait_for(
        "the read-only node's connections dropped",
        Duration::from_secs(20),
        || async { p.metric("fencehook_db_pool_size", &[]).await == 0.0 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_synchronous_replication_required_and_no_standby_readyz_and_deliveries_answer_503() {
    let ctx = TestContext::new().await;
    let mut e = env(&ctx);
    e.push(("FENCEHOOK_REQUIRE_SYNC_REPLICATION", "true".to_owned()));
    let p = ServeProcess::start(&e).await;
    let (status, body) = p.get_admin("/readyz").await;
    assert_eq!(status, 503, "{body}");
    let v = readyz_json(&body);
    assert!(
        v["synchronous_replication"]
            .as_str()
            .unwrap()
            .contains("synchronous_standby_names is empty (required)"),
        "{body}"
    );
    assert_eq!(
        (v["postgres"].as_str(), v["schema"].as_str()),
        (Some("ok"), Some("ok")),
        "{body}"
    );
    let r = p.deliver(&payment("pay_async", 900)).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    assert_eq!(ctx.payments().await, 0, "nothing booked");
    assert_eq!(
        p.metric("fencehook_db_synchronous_replication", &[]).await,
        0.0
    );
    assert!(
        crate::helpers::metrics::exposed(
            &p.get_admin("/metrics").await.1,
            "fencehook_db_synchronous_replication"
        ),
        "the gauge is exported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_requirement_asynchronous_replication_is_warned_about_once_and_deliveries_are_booked(
) {
    let ctx = TestContext::new().await;
    let p = ServeProcess::start(&env(&ctx)).await;
    let warning = "PostgreSQL commits do not wait for a synchronous standby";
    wait_for("the start warning", Duration::from_secs(20), || async {
        !p.log_lines(warning).is_empty()
    })
    .await;
    let (status, body) = p.get_admin("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        readyz_json(&body)["synchronous_replication"]
            .as_str()
            .unwrap()
            .ends_with("(not required)"),
        "{body}"
    );
    let r = p.deliver(&payment("pay_async_ok", 900)).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(
        p.metric("fencehook_db_synchronous_replication", &[]).await,
        0.0
    );
    for _ in 0..3 {
        assert_eq!(p.get_admin("/readyz").await.0, 200);
    }
    let lines = p.log_lines(warning);
    assert_eq!(lines.len(), 1, "once per start, not per probe: {lines:?}");
    assert!(lines[0].contains("WARN"), "{lines:?}");
}

/// A session on `url` whose commits do not wait for the (fake) standby.
async fn local_commit_session(url: &str) -> tokio_postgres::Client {
    let mut cfg: tokio_postgres::Config = url.parse().unwrap();
    cfg.options("-c synchronous_commit=local");
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A private cluster names a standby that never connects: the probe's reads
/// never wait for it, so the check is seen from both sides without a commit
/// hanging (the database is migrated with `synchronous_commit = local`, and no
/// delivery is sent while commits would wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn synchronous_replication_is_seen_on_a_primary_naming_a_standby_and_off_with_a_local_commit()
{
    let pg = PrivatePostgres::start(&["synchronous_standby_names=fake_standby"]).await;
    let ctx = TestContext::new().await; // for its Redis prefix
    let admin = local_commit_session(&pg.url("postgres")).await;
    for sql in [
        "CREATE DATABASE fh_sync",
        "ALTER DATABASE fh_sync SET synchronous_commit = local",
    ] {
        admin.batch_execute(sql).await.unwrap();
    }
    let url = pg.url("fh_sync");
    fencehook::store::migrate::run(&url, fencehook::store::migrate::MissingDatabase::Refuse)
        .await
        .unwrap();
    admin
        .batch_execute("ALTER DATABASE fh_sync RESET synchronous_commit")
        .await
        .unwrap();
    let mut e = env(&ctx);
    e.retain(|(k, _)| *k != "DATABASE_URL");
    e.push(("DATABASE_URL", url.clone()));
    e.push(("FENCEHOOK_REQUIRE_SYNC_REPLICATION", "true".to_owned()));

    let p = ServeProcess::start(&e).await;
    let (status, body) = p.get_admin("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        readyz_json(&body)["synchronous_replication"],
        "ok",
        "{body}"
    );
    wait_for("the gauge at 1", Duration::from_secs(20), || async {
        p.metric("fencehook_db_synchronous_replication", &[]).await == 1.0
    })
    .await;
    assert!(p
        .log_lines("do not wait for a synchronous standby")
        .is_empty());
    drop(p);

    // The same cluster, but this database's sessions commit locally.
    admin
        .batch_execute("ALTER DATABASE fh_sync SET synchronous_commit = local")
        .await
        .unwrap();
    let p = ServeProcess::start(&e).await;
    let (status, body) = p.get_admin("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        readyz_json(&body)["synchronous_replication"]
            .as_str()
            .unwrap()
            .contains("synchronous_commit = local (required)"),
        "{body}"
    );
    assert_eq!(
        p.metric("fencehook_db_synchronous_replication", &[]).await,
        0.0
    );
    let r = p.deliver(&payment("pay_local_commit", 400)).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    let check = local_commit_session(&url).await;
    let n: i64 = check
        .query_one("SELECT count(*) FROM payments", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing booked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn work_started_before_postgres_waits_for_it_then_migrates_and_starts_its_workers() {
    let ctx = TestContext::empty().await;
    let pg = FaultProxy::start(socket_of(&ctx.database_url)).await;
    pg.cut();
    let mut e = env(&ctx);
    e.retain(|(k, _)| *k != "DATABASE_URL");
    e.push(("DATABASE_URL", ctx.database_url_via(pg.addr())));
    e.push(("FENCEHOOK_MIGRATE_ON_START", "true".to_owned()));
    // The outage lasts two seconds: long enough for several tries.
    let (w, ()) = tokio::join!(WorkProcess::start(&e), async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        pg.restore();
    });
    let logs = w.logs.lock().unwrap().clone();
    let waiting = logs
        .iter()
        .filter(|l| l.contains("PostgreSQL does not answer; waiting for it"))
        .count();
    assert_eq!(waiting, 1, "{logs:?}");
    assert!(
        logs.iter()
            .any(|l| l.contains("PostgreSQL answers; the start goes on")),
        "{logs:?}"
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM pg_tables WHERE tablename = 'events'")
            .await,
        1,
        "migrated once PostgreSQL answered"
    );
}

/// A session on `url` that stays writable whatever the server's default.
async fn writable_session(url: &str) -> tokio_postgres::Client {
    let mut cfg: tokio_postgres::Config = url.parse().unwrap();
    cfg.options("-c default_transaction_read_only=off");
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Waits until a new session starts read-only. The postmaster signals every
/// running backend as it reloads, before it forks a new one: once a new
/// session sees the setting, each pooled connection applies it before its
/// next statement. (Delivering right after `pg_reload_conf()` raced the
/// postmaster: a CI run's delivery was booked by a backend not yet told.)
async fn read_only_seen_by_new_sessions(url: &str) {
    wait_for(
        "new sessions start read-only",
        Duration::from_secs(20),
        || async {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let row = client
                .query_one("SHOW default_transaction_read_only", &[])
                .await
                .unwrap();
            row.get::<_, String>(0) == "on"
        },
    )
    .await;
}

async fn fencehook_backends(admin: &tokio_postgres::Client) -> Vec<i32> {
    admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'fencehook'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A private cluster turned read-only under a running instance (as a
/// demoted primary is): its pooled connections' writes are refused with
/// SQLSTATE 25006, answered 503, those connections are dropped, and once the
/// node takes writes again the retry is booked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_becomes_read_only_is_answered_503_its_connections_dropped_and_the_retry_booked_once(
) {
    let pg = PrivatePostgres::start(&[]).await;
    let ctx = TestContext::new().await; // for its Redis prefix
    let admin = writable_session(&pg.url("postgres")).await;
    admin.batch_execute("CREATE DATABASE fh_ro").await.unwrap();
    let url = pg.url("fh_ro");
    fencehook::store::migrate::run(&url, fencehook::store::migrate::MissingDatabase::Refuse)
        .await
        .unwrap();
    let db = writable_session(&url).await;
    let count = |sql: &'static str| {
        let db = &db;
        async move { db.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    let mut e = env(&ctx);
    e.retain(|(k, _)| *k != "DATABASE_URL");
    e.push(("DATABASE_URL", url.clone()));
    let p = ServeProcess::start(&e).await;
    let first = payment("pay_before", 100);
    let r = p.deliver(&first).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let before = fencehook_backends(&admin).await;
    assert!(!before.is_empty());

    admin
        .batch_execute("ALTER SYSTEM SET default_transaction_read_only = on")
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    read_only_seen_by_new_sessions(&url).await;
    let second = payment("pay_during", 200);
    wait_for(
        "a delivery refused by the read-only node",
        Duration::from_secs(20),
        || async {
            let r = p.deliver(&second).await;
            assert_ne!(r.status, 200, "nothing acknowledged once read-only: {r:?}");
            r.status == 503
        },
    )
    .await;
    assert_eq!(
        count("SELECT count(*) FROM payments WHERE transaction_id = 'pay_during'").await,
        0
    );
    wait_for(
        "the connections to the read-only node dropped",
        Duration::from_secs(20),
        || async {
            let now = fencehook_backends(&admin).await;
            before.iter().all(|pid| !now.contains(pid))
        },
    )
    .await;

    admin
        .batch_execute("ALTER SYSTEM RESET default_transaction_read_only")
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    wait_for("/readyz 200 again", Duration::from_secs(20), || async {
        p.get_admin("/readyz").await.0 == 200
    })
    .await;
    let r = p.deliver(&second).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = p.deliver(&first).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(count("SELECT count(*) FROM payments").await, 2);
    assert_eq!(
        count("SELECT count(*) FROM ledger_entries").await,
        2,
        "each booked once"
    );
}
