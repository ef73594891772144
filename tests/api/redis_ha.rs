//! Redis as SREs run it: behind Redis Sentinel (a master killed mid-load is
//! replaced by its replica, and the lease follows the sentinels to it;
//! sentinels with a password of their own), and over TLS (`rediss://` with a private CA; a CA that did not sign the
//! server's certificate stops the start).

use std::sync::Arc;
use std::time::Duration;

use fencehook::config::SentinelConfig;

use crate::helpers::process::ServeProcess;
use crate::helpers::redis_ha::{PasswordSentinel, PrivateSentinels, TlsRedis, MASTER};
use crate::helpers::{payment, wait_for, TestContext};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_sentinel_a_master_killed_mid_load_is_followed_to_its_replica_and_every_payment_books_once(
) {
    let mut set = PrivateSentinels::start().await;
    let master = set.master_port.to_string();
    assert!(set.named_masters().await.iter().all(|m| *m == master));
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config();
    cfg.lease.sentinel = Some(SentinelConfig {
        sentinels: set.sentinels(),
        master: MASTER.to_owned(),
        password: None,
    });
    // Never used in Sentinel mode: a closed port, so a lease that went to it
    // could not succeed.
    cfg.lease.redis_url = format!("redis://127.0.0.1:{}", crate::helpers::closed_port().await);
    cfg.lease.ttl = Duration::from_millis(1500);
    cfg.lease.lease_timeout = Duration::from_millis(400);
    cfg.inflight_wait = Duration::from_millis(300);
    let apps = [
        Arc::new(ctx.spawn(cfg.clone()).await),
        Arc::new(ctx.spawn(cfg).await),
    ];

    let (transactions, copies) = (40usize, 3usize);
    let mut tasks = Vec::new();
    for t in 0..transactions {
        for c in 0..copies {
            let app = apps[(t + c) % 2].clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(60 * t as u64)).await;
                let tx = format!("tx_sn_{t}");
                let answers = app
                    .deliver_until_settled(&payment(&tx, 100 + t as i64), Duration::from_secs(60))
                    .await;
                (tx, answers)
            }));
        }
    }
    // The first payments are booked on the first master; kill it mid-load.
    wait_for(
        "a payment booked before the kill",
        Duration::from_secs(20),
        || async { ctx.payments().await > 0 },
    )
    .await;
    set.kill_master().await;

    let mut unavailable = 0;
    for task in tasks {
        let (tx, answers) = task.await.unwrap();
        let last = answers.last().unwrap();
        assert_eq!(
            last.status, 200,
            "{tx} ends 200 after the failover: {answers:?}"
        );
        unavailable += answers.iter().filter(|a| a.status == 503).count();
        let (status, _) = ctx.payment(&tx).await.expect("a 200 has a row");
        assert_eq!(status, "succeeded", "{tx}");
    }
    // The sentinels did fail over, and the late payments' leases were taken
    // on the promoted replica.
    let replica = set.replica_port.to_string();
    assert!(
        set.named_masters().await.iter().all(|m| *m == replica),
        "every sentinel names the replica: {:?}",
        set.named_masters().await
    );
    let last_fence: Option<i64> = redis::cmd("GET")
        .arg(ctx.fence_key(&format!("tx_sn_{}", transactions - 1)))
        .query_async(&mut set.redis(set.replica_port).await)
        .await
        .unwrap();
    assert!(
        last_fence.is_some_and(|f| f >= 1),
        "the last payment's fence counter is on the promoted replica"
    );
    assert_eq!(ctx.payments().await, transactions as i64);
    assert_eq!(
        ctx.entries().await,
        transactions as i64,
        "one ledger entry per payment"
    );
    ctx.assert_audit_clean().await;
    eprintln!(
        "sentinel failover: {unavailable} deliveries answered 503 while the replica took over"
    );
}

fn tls_env(
    ctx: &TestContext,
    redis: &TlsRedis,
    ca: &std::path::Path,
) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", redis.url()),
        ("FENCEHOOK_REDIS_CA_FILE", ca.display().to_string()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_rediss_with_a_private_ca_a_delivery_takes_its_lease_on_the_tls_redis_and_books_once()
{
    let redis = TlsRedis::start().await;
    let ctx = TestContext::new().await;
    let serve = ServeProcess::start(&tls_env(&ctx, &redis, &redis.ca.ca_file)).await;

    let r = serve.deliver(&payment("tx_tls_1", 4200)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let again = serve.deliver(&payment("tx_tls_1", 4200)).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(ctx.entries().await, 1, "one ledger entry for two copies");
    // The fence counter lives on the TLS server, not on the shared Redis.
    let fence: Option<i64> = redis::cmd("GET")
        .arg(ctx.fence_key("tx_tls_1"))
        .query_async(&mut redis.redis().await)
        .await
        .unwrap();
    assert!(
        fence.is_some_and(|f| f >= 1),
        "fence on the TLS redis: {fence:?}"
    );
    assert!(
        ctx.redis_keys().await.is_empty(),
        "nothing on the shared Redis"
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_rediss_a_ca_that_did_not_sign_the_servers_certificate_stops_the_start_naming_the_setting(
) {
    let redis = TlsRedis::start().await;
    let ctx = TestContext::new().await;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.arg("serve")
        .envs(tls_env(&ctx, &redis, &redis.other_ca.ca_file))
        .env("FENCEHOOK_GENERIC_SECRET", crate::helpers::SECRET)
        .env("FENCEHOOK_LISTEN", "127.0.0.1:0")
        .env("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:0")
        .kill_on_drop(true);
    // A start that is not refused would serve until killed.
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the start is refused, not served")
        .unwrap();
    let (code, stderr) = (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(code, Some(2), "{stderr}");
    let refusal: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("invalid configuration"))
        .collect();
    assert_eq!(refusal.len(), 1, "one line: {stderr}");
    assert!(
        refusal[0].contains("FENCEHOOK_REDIS_CA_FILE"),
        "names the setting: {stderr}"
    );
    assert!(!stderr.contains("fencehook serving"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_behind_sentinel_logs_the_sentinels_and_master_books_through_them_and_refuses_a_redis_url_beside_them(
) {
    let set = PrivateSentinels::start().await;
    let ctx = TestContext::new().await;
    let sentinels = set.sentinels().join(",");
    let env = vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("FENCEHOOK_REDIS_SENTINELS", sentinels.clone()),
        ("FENCEHOOK_REDIS_SENTINEL_MASTER", MASTER.to_owned()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
    ];
    let serve = ServeProcess::start(&env).await;
    let r = serve.deliver(&payment("tx_sn_log", 700)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(ctx.entries().await, 1);
    let fence: Option<i64> = redis::cmd("GET")
        .arg(ctx.fence_key("tx_sn_log"))
        .query_async(&mut set.redis(set.master_port).await)
        .await
        .unwrap();
    assert_eq!(
        fence,
        Some(1),
        "the lease was taken on the sentinels' master"
    );
    let logs = serve.logs.lock().unwrap().join("\n");
    let starting = logs
        .lines()
        .find(|l| l.contains("fencehook starting"))
        .unwrap_or_else(|| panic!("{logs}"));
    assert!(
        starting.contains(&format!("sentinels {sentinels} master {MASTER}")),
        "{starting}"
    );

    // REDIS_URL beside the sentinels is refused in one line, which does not
    // echo the sentinel password.
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.arg("serve")
        .envs(env)
        .env("FENCEHOOK_REDIS_SENTINEL_PASSWORD", "hunter2")
        .env("REDIS_URL", "redis://127.0.0.1:6379")
        .env("FENCEHOOK_GENERIC_SECRET", crate::helpers::SECRET)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the start is refused, not served")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("REDIS_URL"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// Sentinels with a `requirepass` of their own tell the master only to a
/// client that authenticates: `FENCEHOOK_REDIS_SENTINEL_PASSWORD` is that
/// password. Without it no master is found: 503, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_with_a_password_is_asked_with_the_sentinel_password_and_without_it_nothing_is_booked(
) {
    let password = "s3ntinel-only";
    let set = PasswordSentinel::start(password).await;
    let ctx = TestContext::new().await;
    let config = |password: Option<&str>| {
        let mut cfg = ctx.config();
        cfg.lease.sentinel = Some(SentinelConfig {
            sentinels: vec![format!("{}:{}", set.ip, set.sentinel_port)],
            master: MASTER.to_owned(),
            password: password.map(str::to_owned),
        });
        cfg
    };

    let without = ctx.spawn(config(None)).await;
    let r = without.deliver(&payment("pay_no_sentinel_pw", 300)).await;
    assert_eq!((r.status, r.result()), (503, "unavailable"), "{r:?}");
    let (status, body) = without.get_admin("/readyz").await;
    assert_eq!(status, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["lease_backend"].as_str().unwrap().starts_with("error"),
        "{body}"
    );
    assert_eq!(ctx.payments().await, 0, "nothing written");
    without.stop().await;

    let with = ctx.spawn(config(Some(password))).await;
    let r = with.deliver(&payment("pay_sentinel_pw", 300)).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let fence: Option<i64> = redis::cmd("GET")
        .arg(ctx.fence_key("pay_sentinel_pw"))
        .query_async(&mut set.master().await)
        .await
        .unwrap();
    assert_eq!(
        fence,
        Some(1),
        "the lease was taken on the master the sentinel named"
    );
    assert_eq!(ctx.entries().await, 1);
}
