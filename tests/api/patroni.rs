//! PostgreSQL under Patroni (Debian's packages, `make tools`): three nodes in
//! synchronous mode and etcd, run from deploy/patroni/patroni.yml, their
//! leader killed (SIGKILL of its Patroni and of its PostgreSQL) under
//! concurrent deliveries through a real `fencehook serve` whose
//! `DATABASE_URL` lists the three nodes. Deliveries are retried like a PSP
//! retries (503 and 409) until each is answered 200; then every acknowledged
//! payment is counted on the new primary, the audit is run, and the old
//! leader, started again, must rejoin as a replica.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::helpers::patroni::PatroniCluster;
use crate::helpers::process::{deliver_to, ServeProcess};
use crate::helpers::{payment, TestContext};

/// Deliveries sent at once, each its own payment, retried until answered 200.
const SENDERS: usize = 6;
/// A PSP's pause before it retries a 503 or a 409 (real ones wait longer).
const RETRY_PAUSE: Duration = Duration::from_millis(200);
const AMOUNT: i64 = 1250;

/// What the senders saw.
#[derive(Default)]
struct Seen {
    /// Every delivery: when it was sent, when answered, and its status.
    answers: Vec<(Instant, Instant, u16)>,
    /// Payments answered 200 in the end.
    acknowledged: Vec<String>,
    /// A payment whose answer was neither 200, 503 nor 409, or that never
    /// got a 200 before the deadline: (id, its answers).
    failed: Vec<(String, Vec<u16>)>,
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

async fn count(db: &tokio_postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_patroni_leader_killed_under_load_loses_and_doubles_no_acknowledged_payment_and_rejoins_as_a_replica(
) {
    let mut cluster = PatroniCluster::start().await;
    let redis = TestContext::new().await; // for its Redis key prefix
    let url = cluster.url("fencehook");
    fencehook::store::migrate::run(&url, fencehook::store::migrate::MissingDatabase::Create)
        .await
        .unwrap();
    let env = vec![
        ("DATABASE_URL", url.clone()),
        ("REDIS_URL", redis.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", redis.prefix.clone()),
        // Patroni's synchronous mode runs without a standby while none can
        // be one (right after the promotion): nothing is acknowledged then.
        ("FENCEHOOK_REQUIRE_SYNC_REPLICATION", "true".to_owned()),
        ("FENCEHOOK_DB_CONNECT_TIMEOUT_MS", "2000".to_owned()),
    ];
    let serve = ServeProcess::start(&env).await;
    let starting = serve.log_lines("fencehook starting");
    for node in &cluster.nodes {
        let host = format!("{}:{}", cluster.ip, node.pg_port);
        assert!(
            starting.iter().any(|l| l.contains(&host)),
            "the start log names {host}: {starting:?}"
        );
    }
    assert!(
        !starting
            .iter()
            .any(|l| l.contains(crate::helpers::patroni::SUPERUSER_PASSWORD)),
        "never the password: {starting:?}"
    );
    crate::helpers::wait_for("/readyz 200", Duration::from_secs(30), || async {
        serve.get_admin("/readyz").await.0 == 200
    })
    .await;
    let old = cluster.leader().await.expect("a leader");

    // Senders: each delivers payments one after the other, every one retried
    // until it is answered 200, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let senders: Vec<_> = (0..SENDERS)
        .map(|s| {
            let (base, stop, seen) = (serve.base.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let id = format!("pay_ha_{s}_{n}");
                    n += 1;
                    let ev = payment(&id, AMOUNT);
                    let end = Instant::now() + Duration::from_secs(120);
                    let mut statuses = Vec::new();
                    loop {
                        let sent = Instant::now();
                        let r = deliver_to(&base, &ev).await;
                        let answer = (sent, Instant::now(), r.status);
                        seen.lock().unwrap().answers.push(answer);
                        statuses.push(r.status);
                        match r.status {
                            200 => {
                                seen.lock().unwrap().acknowledged.push(id);
                                break;
                            }
                            503 | 409 if Instant::now() < end => {
                                tokio::time::sleep(RETRY_PAUSE).await
                            }
                            _ => {
                                seen.lock().unwrap().failed.push((id, statuses));
                                return;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let acknowledged = || seen.lock().unwrap().acknowledged.len();
    crate::helpers::wait_for(
        "payments booked before the kill",
        Duration::from_secs(30),
        || async { acknowledged() >= 30 },
    )
    .await;

    let killed_at = Instant::now();
    cluster.kill_node(old);
    let new = cluster
        .wait("a new leader", Duration::from_secs(90), |c| async move {
            c.leader().await.filter(|&l| l != old)
        })
        .await;
    // The outage: from the first delivery answered other than 200 after the
    // kill to the first one booked among those sent after that answer.
    // Load goes on until then, and a while after.
    let first_failed = || {
        seen.lock()
            .unwrap()
            .answers
            .iter()
            .filter(|(_, at, status)| *at >= killed_at && *status != 200)
            .map(|(_, at, _)| *at)
            .min()
    };
    let booked_again = |after: Instant| {
        seen.lock()
            .unwrap()
            .answers
            .iter()
            .filter(|(sent, _, status)| *sent > after && *status == 200)
            .map(|(_, at, _)| *at)
            .min()
    };
    let recovered = cluster
        .wait(
            "a delivery booked after the failover",
            Duration::from_secs(90),
            |_| async { booked_again(first_failed()?) },
        )
        .await;
    tokio::time::sleep_until(recovered + Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.await.unwrap();
    }
    let failed_at = first_failed().unwrap();

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.failed.is_empty(),
        "every delivery ends 200 after retries of 503/409: {:?}",
        seen.failed
    );
    let answers_503 = seen.answers.iter().filter(|a| a.2 == 503).count();
    let answers_409 = seen.answers.iter().filter(|a| a.2 == 409).count();
    let outage = recovered - failed_at;
    let lease_lost = serve.metric("fencehook_lease_lost_total", &[]).await;
    eprintln!(
        "patroni failover: {} payments acknowledged ({} answers), leader {} killed, {} promoted; \
         outage {:.1} s (first failed delivery to the first booked one, {:.1} s after the kill); \
         {answers_503} answers 503, {answers_409} answers 409, {lease_lost} leases lost",
        seen.acknowledged.len(),
        seen.answers.len(),
        cluster.nodes[old].name,
        cluster.nodes[new].name,
        outage.as_secs_f64(),
        (recovered - killed_at).as_secs_f64(),
    );

    // Every acknowledged payment is on the new primary, once, with one
    // ledger entry; nothing else is; the audit finds nothing.
    let acked: BTreeSet<String> = seen.acknowledged.iter().cloned().collect();
    assert_eq!(acked.len(), seen.acknowledged.len(), "each payment once");
    let db = connect(&url).await;
    let rows: BTreeSet<String> = db
        .query("SELECT transaction_id FROM payments", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        rows, acked,
        "the payments on the new primary are the acknowledged ones"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM payments").await,
        acked.len() as i64
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM ledger_entries").await,
        acked.len() as i64,
        "one ledger entry each"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM (SELECT payment_id FROM ledger_entries \
             GROUP BY payment_id HAVING count(*) <> 1) doubled"
        )
        .await,
        0
    );
    for check in fencehook::store::audit::run(&url).await.unwrap() {
        assert!(
            check.violations.is_empty(),
            "audit check {} violated: {:?}",
            check.name,
            check.violations
        );
    }
    // A PSP that sends an acknowledged payment again is told `duplicate`.
    for id in acked.iter().step_by(7) {
        let r = serve.deliver(&payment(id, AMOUNT)).await;
        assert_eq!(
            (r.status, r.result()),
            (200, "duplicate"),
            "a copy of {id}: {r:?}"
        );
    }

    // The old leader, started again, rejoins as a replica of the new one.
    cluster.restart_node(old);
    let old_name = cluster.nodes[old].name.clone();
    cluster
        .wait(
            "the old leader streaming from the new one",
            Duration::from_secs(120),
            |c| {
                let old_name = old_name.clone();
                async move {
                    let s = c.status(old).await?;
                    let replica = s["role"] == "replica" && s["state"] == "running";
                    let streaming = c
                        .streaming_from(new)
                        .await
                        .iter()
                        .any(|(name, _)| *name == old_name);
                    (replica && streaming).then_some(())
                }
            },
        )
        .await;
    let replica = connect(&cluster.node_url(old, "fencehook")).await;
    let on_replica = count(&replica, "SELECT count(*) FROM payments").await;
    let expected = acked.len() as i64;
    if on_replica != expected {
        // Replayed shortly after it streams.
        crate::helpers::wait_for(
            "the rejoined replica's copy",
            Duration::from_secs(30),
            || async { count(&replica, "SELECT count(*) FROM payments").await == expected },
        )
        .await;
    }
    assert!(
        count(&replica, "SELECT pg_is_in_recovery()::int::int8").await == 1,
        "the old leader is a standby now"
    );
}
