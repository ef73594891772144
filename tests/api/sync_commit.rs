//! A commit that waits for a synchronous standby: PostgreSQL's statement
//! timeout does not end the wait (it must not: a cancelled wait leaves the
//! commit visible unreplicated), and fencehook bounds it on its own side
//! without cancelling it — the delivery is answered 503, the pool is not
//! filled by waiting commits, and the commit lands once when a standby (here:
//! the setting cleared) lets it. A private PostgreSQL whose
//! `synchronous_standby_names` names a standby that never connects.

use std::future::Future;
use std::time::Duration;

use fencehook::config::Config;
use fencehook::providers::{adyen, Provider, SchemeKind};
use serde_json::Value;
use tokio::time::Instant;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::postgres::PrivatePostgres;
use crate::helpers::process::ServeProcess;
use crate::helpers::{payment, wait_for, Reply, TestApp, TestContext, SECRET};

/// PostgreSQL's own message when a commit's wait is cancelled.
const CANCELLED_WAIT: &str = "canceling wait for synchronous replication";

async fn session(url: &str, options: &str) -> tokio_postgres::Client {
    let mut cfg: tokio_postgres::Config = url.parse().unwrap();
    cfg.options(options);
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A session whose commits do not wait for a standby: the test's own.
async fn local(url: &str) -> tokio_postgres::Client {
    session(url, "-c synchronous_commit=local").await
}

async fn count(db: &tokio_postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.unwrap().get(0)
}

/// Names a standby that is not there (`fake_standby`), or none (`None`).
async fn name_standby(admin: &tokio_postgres::Client, standby: Option<&str>) {
    let sql = match standby {
        Some(name) => format!("ALTER SYSTEM SET synchronous_standby_names = '{name}'"),
        None => "ALTER SYSTEM RESET synchronous_standby_names".to_owned(),
    };
    admin.batch_execute(&sql).await.unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    let expected = standby.unwrap_or("");
    wait_for("the setting reloaded", Duration::from_secs(20), || async {
        let row = admin
            .query_one("SELECT current_setting('synchronous_standby_names')", &[])
            .await
            .unwrap();
        row.get::<_, String>(0) == expected
    })
    .await;
    // Whether a commit waits is decided from shared memory the checkpointer
    // updates when it handles the reload, after (and apart from) the
    // backends: a checkpoint requested now runs after that handling, so once
    // it returns every new commit sees the new setting.
    admin.batch_execute("CHECKPOINT").await.unwrap();
}

/// Backends waiting for a synchronous standby, by application name.
async fn waiting_for_standby(admin: &tokio_postgres::Client, application: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' \
             AND application_name = $1",
            &[&application],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statement_timeout_does_not_cancel_a_commit_waiting_for_a_synchronous_standby() {
    let pg = PrivatePostgres::start(&[]).await;
    let url = pg.url("postgres");
    let admin = local(&url).await;
    admin
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .unwrap();
    name_standby(&admin, Some("fake_standby")).await;

    // A statement that commits by itself, and an explicit COMMIT, each on a
    // session whose statement_timeout is 1.5 s: long enough that the INSERT
    // itself finishes within it on a loaded machine (at 200 ms a CI run's
    // INSERT was cancelled before it reached its commit), short beside the
    // wait below.
    let options = "-c statement_timeout=1500 -c application_name=waiter";
    let implicit = tokio::spawn({
        let writer = session(&url, options).await;
        async move { writer.execute("INSERT INTO t VALUES (1)", &[]).await }
    });
    let explicit = tokio::spawn({
        let writer = session(&url, options).await;
        async move {
            writer.batch_execute("BEGIN").await?;
            writer.execute("INSERT INTO t VALUES (2)", &[]).await?;
            writer.batch_execute("COMMIT").await
        }
    });
    // Both wait, far past their statement timeout, and stay invisible.
    wait_for("both commits waiting", Duration::from_secs(20), || async {
        waiting_for_standby(&admin, "waiter").await == 2
    })
    .await;
    // Past every statement timeout: the statements began before they waited.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        waiting_for_standby(&admin, "waiter").await,
        2,
        "still waiting"
    );
    assert_eq!(
        count(&admin, "SELECT count(*) FROM t").await,
        0,
        "not visible"
    );
    name_standby(&admin, None).await;
    implicit
        .await
        .unwrap()
        .expect("the statement commits once the wait ends");
    explicit
        .await
        .unwrap()
        .expect("the COMMIT commits once the wait ends");
    assert_eq!(count(&admin, "SELECT count(*) FROM t").await, 2);
    assert!(!pg.log().contains(CANCELLED_WAIT), "{}", pg.log());
}

/// The serve on a private PostgreSQL, commits bounded at 2 × 1 s (a statement
/// that commits by itself), a pool of two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_waiting_for_a_missing_standby_answers_503_leaves_the_pool_free_and_lands_once_when_the_standby_returns(
) {
    let pg = PrivatePostgres::start(&[]).await;
    let ctx = TestContext::new().await; // for its Redis prefix
    let admin = local(&pg.url("postgres")).await;
    admin
        .batch_execute("CREATE DATABASE fh_sync")
        .await
        .unwrap();
    let url = pg.url("fh_sync");
    fencehook::store::migrate::run(&url, fencehook::store::migrate::MissingDatabase::Refuse)
        .await
        .unwrap();
    let db = local(&url).await;
    let env = vec![
        ("DATABASE_URL", url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_DB_STATEMENT_TIMEOUT_MS", "1000".to_owned()),
        ("FENCEHOOK_DB_POOL_SIZE", "2".to_owned()),
    ];
    let p = ServeProcess::start(&env).await;
    let booked = payment("pay_sync_before", 700);
    let r = p.deliver(&booked).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");

    name_standby(&admin, Some("fake_standby")).await;
    let waiting = payment("pay_sync_waiting", 800);
    let sent = Instant::now();
    let r = p.deliver(&waiting).await;
    let took = sent.elapsed();
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(15),
        "answered once the bound (2 s) passed, not when the commit did: {took:?}"
    );
    assert_eq!(
        waiting_for_standby(&admin, "fencehook").await,
        1,
        "the commit still waits: not cancelled"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM payments WHERE transaction_id = 'pay_sync_waiting'"
        )
        .await,
        0,
        "not visible while it waits"
    );

    // Meanwhile: new writes are refused without waiting for the bound, reads
    // still answer (a copy of a booked payment is a duplicate), /readyz says
    // why, and no second commit joins the first.
    let other = payment("pay_sync_other", 900);
    let mut refused = Duration::ZERO;
    for _ in 0..4 {
        let sent = Instant::now();
        let r = p.deliver(&other).await;
        assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
        refused = refused.max(sent.elapsed());
        assert!(refused < Duration::from_secs(10), "{refused:?}");
    }
    let r = p.deliver(&booked).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    let sent = Instant::now();
    let (status, body) = p.get_admin("/readyz").await;
    let readyz = sent.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("wait past their bound"), "{body}");
    eprintln!(
        "commit bound: the waiting commit's delivery answered 503 after {:.2} s, later writes \
         within {} ms, /readyz within {} ms",
        took.as_secs_f64(),
        refused.as_millis(),
        readyz.as_millis()
    );
    assert!(
        !p.log_lines("writes are refused until it answers")
            .is_empty(),
        "the first commit past its bound is logged"
    );
    assert_eq!(waiting_for_standby(&admin, "fencehook").await, 1);
    assert!(
        p.metric("fencehook_db_pool_size", &[]).await <= 2.0,
        "the pool stays within its size"
    );

    // The standby "returns": the waiting commit lands, once, and writes are
    // taken again.
    name_standby(&admin, None).await;
    wait_for(
        "the waiting commit answered",
        Duration::from_secs(20),
        || async {
            !p.log_lines("a commit that waited past its bound has answered")
                .is_empty()
        },
    )
    .await;
    wait_for("/readyz 200", Duration::from_secs(20), || async {
        p.get_admin("/readyz").await.0 == 200
    })
    .await;
    let r = p.deliver(&waiting).await;
    assert_eq!(
        (r.status, r.result()),
        (200, "duplicate"),
        "the retry: {r:?}"
    );
    let r = p.deliver(&other).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(count(&db, "SELECT count(*) FROM payments").await, 3);
    assert_eq!(
        count(&db, "SELECT count(*) FROM ledger_entries").await,
        3,
        "each booked once"
    );
    assert!(!pg.log().contains(CANCELLED_WAIT), "{}", pg.log());
}

/// Inbox mode: the accept (one statement that commits by itself) is bounded
/// the same way; the event lands once, and its retry is `duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_inbox_mode_an_accept_waiting_for_a_missing_standby_answers_503_and_lands_once() {
    let pg = PrivatePostgres::start(&[]).await;
    let ctx = TestContext::new().await; // for its Redis prefix
    let admin = local(&pg.url("postgres")).await;
    admin
        .batch_execute("CREATE DATABASE fh_inbox_sync")
        .await
        .unwrap();
    let url = pg.url("fh_inbox_sync");
    fencehook::store::migrate::run(&url, fencehook::store::migrate::MissingDatabase::Refuse)
        .await
        .unwrap();
    let db = local(&url).await;
    let env = vec![
        ("DATABASE_URL", url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_MODE", "inbox".to_owned()),
        ("FENCEHOOK_WORKERS", "0".to_owned()),
        ("FENCEHOOK_DB_STATEMENT_TIMEOUT_MS", "1000".to_owned()),
    ];
    let p = ServeProcess::start(&env).await;
    name_standby(&admin, Some("fake_standby")).await;
    let ev = payment("pay_inbox_waiting", 650);
    let sent = Instant::now();
    let r = p.deliver(&ev).await;
    let took = sent.elapsed();
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert_eq!(waiting_for_standby(&admin, "fencehook").await, 1);
    let r = p.deliver(&payment("pay_inbox_other", 660)).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");

    name_standby(&admin, None).await;
    wait_for(
        "the waiting accept answered",
        Duration::from_secs(20),
        || async {
            !p.log_lines("a commit that waited past its bound has answered")
                .is_empty()
        },
    )
    .await;
    let r = p.deliver(&ev).await;
    assert_eq!(
        (r.status, r.result()),
        (200, "duplicate"),
        "the retry: {r:?}"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM events WHERE transaction_id = 'pay_inbox_waiting'"
        )
        .await,
        1,
        "stored once"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM events WHERE transaction_id = 'pay_inbox_other'"
        )
        .await,
        0,
        "refused while the first waited: nothing stored"
    );
    assert!(!pg.log().contains(CANCELLED_WAIT), "{}", pg.log());
}

/// Adyen's published sample HMAC key (tests/api/providers.rs).
const ADYEN_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

/// A private PostgreSQL with a migrated database `name`, and the test's own
/// session on it (whose commits do not wait for a standby).
async fn private_database(name: &str) -> (PrivatePostgres, String, tokio_postgres::Client) {
    let pg = PrivatePostgres::start(&[]).await;
    let admin = local(&pg.url("postgres")).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let url = pg.url(name);
    fencehook::store::migrate::run(&url, fencehook::store::migrate::MissingDatabase::Refuse)
        .await
        .unwrap();
    (pg, url, admin)
}

/// The in-process app on `url`: commits bounded at 2 × 1 s (a statement
/// that commits by itself), a pool of `pool`.
fn bounded_config(ctx: &TestContext, url: &str, pool: usize) -> Config {
    let mut cfg = ctx.config();
    cfg.db.url = url.to_owned();
    cfg.db.statement_timeout = Duration::from_secs(1);
    cfg.db.pool_size = pool;
    cfg
}

/// `answer`, or a failure naming `what` when it has not come within `limit`:
/// a write that waits without bound must fail the test, not hang it.
async fn within<T>(what: &str, limit: Duration, answer: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, answer).await {
        Ok(answer) => answer,
        Err(_) => panic!("{what}: no answer within {limit:?}"),
    }
}

fn adyen_item(name: &str, i: usize) -> Value {
    let path = format!("{}/tests/fixtures/adyen/{name}", env!("CARGO_MANIFEST_DIR"));
    let batch: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    batch["notificationItems"][i]["NotificationRequestItem"].clone()
}

/// A batch of these items, signed with [`ADYEN_KEY`].
fn adyen_batch(items: Vec<Value>) -> String {
    let mut batch = serde_json::json!({
        "live": "false",
        "notificationItems": items.into_iter()
            .map(|i| serde_json::json!({"NotificationRequestItem": i}))
            .collect::<Vec<_>>()
    });
    adyen::sign_batch(ADYEN_KEY, &mut batch).unwrap();
    batch.to_string()
}

/// A batch of one item Adyen signed but the ledger cannot book (a lower-case
/// currency), its own `pspReference`: quarantined, never booked.
fn unmappable_batch(psp_reference: &str) -> String {
    let mut bad = adyen_item("scenario-2-REFUND.json", 0);
    bad["amount"]["currency"] = "eur".into();
    bad["pspReference"] = psp_reference.into();
    adyen_batch(vec![bad])
}

async fn post_adyen(app: &TestApp, body: &str) -> Reply {
    let post = app.post(
        "/webhooks/adyen",
        &[("content-type", "application/json")],
        body.as_bytes().to_vec(),
    );
    within("an Adyen batch", Duration::from_secs(20), post).await
}

/// The Adyen quarantine is a write like a booking: with the synchronous
/// standby missing, a batch with an unmappable item answers 503 once the
/// bound passed instead of waiting for the standby, later ones are refused at
/// once, the pool stays free for reads (a copy of a booked batch is
/// `[accepted]`, `/readyz` answers and says why), and the quarantine row
/// lands once when the standby returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_adyen_quarantine_waiting_for_a_missing_standby_answers_503_within_the_bound_and_copies_stay_accepted(
) {
    let (pg, url, admin) = private_database("fh_sync_quarantine").await;
    let ctx = TestContext::new().await; // for its Redis prefix
    let db = local(&url).await;
    let mut cfg = bounded_config(&ctx, &url, 2);
    cfg.providers = vec![
        Provider::generic(SECRET).unwrap(),
        Provider::new("adyen", SchemeKind::Adyen, &[ADYEN_KEY.into()], None).unwrap(),
    ];
    let app = ctx.spawn(cfg).await;
    let booked = adyen_batch(vec![adyen_item("scenario-1-AUTHORISATION.json", 0)]);
    let r = post_adyen(&app, &booked).await;
    assert_eq!((r.status, r.text.as_str()), (200, "[accepted]"), "{r:?}");

    name_standby(&admin, Some("fake_standby")).await;
    let sent = Instant::now();
    let r = post_adyen(&app, &unmappable_batch("QUARANTINE_WAITS")).await;
    let took = sent.elapsed();
    assert_eq!(r.status, 503, "{r:?}");
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(15),
        "answered once the bound (2 s) passed: {took:?}"
    );
    // Two more, as the review's three batches: refused at once, none of them
    // joins the waiting commit or takes a connection.
    let mut refused = Duration::ZERO;
    for reference in ["QUARANTINE_OTHER_1", "QUARANTINE_OTHER_2"] {
        let sent = Instant::now();
        let r = post_adyen(&app, &unmappable_batch(reference)).await;
        assert_eq!(r.status, 503, "{r:?}");
        refused = refused.max(sent.elapsed());
    }
    assert!(refused < Duration::from_secs(10), "{refused:?}");
    let r = post_adyen(&app, &booked).await;
    assert_eq!(
        (r.status, r.text.as_str()),
        (200, "[accepted]"),
        "a copy of the booked batch is a duplicate: {r:?}"
    );
    assert_eq!(
        app.metric(
            "fencehook_webhooks_total",
            &[("provider", "adyen"), ("result", "duplicate")]
        ),
        1.0
    );
    let sent = Instant::now();
    let (status, body) = within("/readyz", Duration::from_secs(10), app.get_admin("/readyz")).await;
    let readyz = sent.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("wait past their bound"), "{body}");
    assert_eq!(waiting_for_standby(&admin, "fencehook").await, 1);
    eprintln!(
        "quarantine under the commit bound: 503 after {:.2} s, later batches within {} ms, \
         /readyz within {} ms",
        took.as_secs_f64(),
        refused.as_millis(),
        readyz.as_millis()
    );

    name_standby(&admin, None).await;
    wait_for("/readyz 200", Duration::from_secs(20), || async {
        app.get_admin("/readyz").await.0 == 200
    })
    .await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM quarantined_items").await,
        1,
        "the waiting quarantine landed, the refused ones wrote nothing"
    );
    for reference in [
        "QUARANTINE_WAITS",
        "QUARANTINE_OTHER_1",
        "QUARANTINE_OTHER_2",
    ] {
        let r = post_adyen(&app, &unmappable_batch(reference)).await;
        assert_eq!((r.status, r.text.as_str()), (200, "[accepted]"), "{r:?}");
    }
    assert_eq!(
        count(&db, "SELECT count(*) FROM quarantined_items").await,
        3
    );
    assert_eq!(
        count(&db, "SELECT max(times_seen) FROM quarantined_items").await,
        2,
        "the Adyen retry of the waiting one found its row"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM ledger_entries").await, 1);
    assert!(!pg.log().contains(CANCELLED_WAIT), "{}", pg.log());
}

/// Inbox mode: a worker's lock renewal is a write like a booking. With the
/// standby missing while an attempt's downstream call is in flight, the
/// renewal answers once the bound passed instead of waiting for the standby
/// (`/readyz` says commits wait, one backend waits, not one per statement),
/// and the event is booked once when the standby returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_inbox_mode_a_lock_renewal_waiting_for_a_missing_standby_is_bounded_and_the_event_is_booked_once(
) {
    let (pg, url, admin) = private_database("fh_sync_renewal").await;
    let ctx = TestContext::new().await; // for its Redis prefix
    let db = local(&url).await;
    let downstream = MockDownstream::start().await;
    downstream.gate_token(1);
    let mut cfg = bounded_config(&ctx, &url, 3);
    cfg.inbox.mode = fencehook::config::Mode::Inbox;
    cfg.inbox.workers = 1;
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    let ev = payment("pay_inbox_renewal", 720);
    let r = within("the accept", Duration::from_secs(20), app.deliver(&ev)).await;
    assert_eq!((r.status, r.result()), (200, "accepted"), "{r:?}");
    wait_for("the downstream call", Duration::from_secs(20), || async {
        !downstream.calls().is_empty()
    })
    .await;

    // The attempt waits at the gate; its lock is renewed every third of the
    // TTL (2 s), and the next renewal waits for the missing standby.
    name_standby(&admin, Some("fake_standby")).await;
    let named = Instant::now();
    wait_for(
        "/readyz says commits wait past their bound",
        Duration::from_secs(15),
        || async {
            let (status, body) =
                within("/readyz", Duration::from_secs(10), app.get_admin("/readyz")).await;
            status == 503 && body.contains("wait past their bound")
        },
    )
    .await;
    eprintln!(
        "lock renewal under the commit bound: /readyz said so {:.2} s after the standby went missing",
        named.elapsed().as_secs_f64()
    );
    assert_eq!(waiting_for_standby(&admin, "fencehook").await, 1);

    name_standby(&admin, None).await;
    wait_for("/readyz 200", Duration::from_secs(20), || async {
        app.get_admin("/readyz").await.0 == 200
    })
    .await;
    downstream.open_gate();
    wait_for("the event booked", Duration::from_secs(30), || async {
        count(
            &db,
            "SELECT count(*) FROM events WHERE transaction_id = 'pay_inbox_renewal' \
             AND status = 'done'",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM ledger_entries").await,
        1,
        "booked once"
    );
    assert!(!pg.log().contains(CANCELLED_WAIT), "{}", pg.log());
}

/// The PayPal transmission binding is a write like a booking (even a
/// retry's conflict updates the row): with the standby missing it answers
/// once the bound passed, and while that commit waits a transmission bound
/// before is answered from its row (a PayPal retry stays `duplicate`-able,
/// a forged body on its id is still refused); only a new one, which must be
/// written, is refused, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paypal_binding_waiting_for_a_missing_standby_is_bounded_and_a_bound_transmission_is_read_from_its_row(
) {
    use fencehook::store::transmissions::Transmission;
    use fencehook::store::{Store, StoreError};

    let (pg, url, admin) = private_database("fh_sync_paypal").await;
    let ctx = TestContext::new().await;
    let store = Store::new(&bounded_config(&ctx, &url, 2).db).unwrap();
    let expires = time::OffsetDateTime::now_utc() + time::Duration::days(3);
    let bind = |id: &'static str, body: &'static str| {
        let store = store.clone();
        async move {
            within(
                "a binding",
                Duration::from_secs(20),
                store.bind_transmission("paypal", id, body, expires),
            )
            .await
        }
    };
    assert_eq!(bind("tx-bound", "sha-a").await.unwrap(), Transmission::New);

    name_standby(&admin, Some("fake_standby")).await;
    let sent = Instant::now();
    let waited = bind("tx-new", "sha-b").await;
    let took = sent.elapsed();
    assert!(
        matches!(waited, Err(StoreError::CommitWaiting { .. })),
        "{waited:?}"
    );
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(15),
        "answered once the bound (2 s) passed: {took:?}"
    );
    let sent = Instant::now();
    assert_eq!(
        bind("tx-bound", "sha-a").await.unwrap(),
        Transmission::SameBody { confirmed: false },
        "a PayPal retry: read from the row"
    );
    assert_eq!(
        bind("tx-bound", "sha-forged").await.unwrap(),
        Transmission::OtherBody,
        "headers lifted onto another body are refused still"
    );
    let refused = bind("tx-other", "sha-c").await;
    assert!(
        matches!(refused, Err(StoreError::CommitsWaiting { .. })),
        "a new transmission must be written: {refused:?}"
    );
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(waiting_for_standby(&admin, "fencehook").await, 1);

    name_standby(&admin, None).await;
    let db = local(&url).await;
    wait_for(
        "the waiting binding landed",
        Duration::from_secs(20),
        || async {
            count(
                &db,
                "SELECT count(*) FROM paypal_transmissions WHERE transmission_id = 'tx-new'",
            )
            .await
                == 1
        },
    )
    .await;
    assert!(!pg.log().contains(CANCELLED_WAIT), "{}", pg.log());
}
