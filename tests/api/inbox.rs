//! Inbox mode: accept in one write (no Redis on that path), book
//! asynchronously with leased workers; retries, dead events and replay.

use std::sync::Arc;
use std::time::Duration;

use fencehook::metrics::{INBOX_ATTEMPTS_TOTAL, INBOX_LAG_SECONDS, INBOX_ROWS};
use fencehook::store::events::Replay;
use fencehook::store::inbox::{Accepted, Settle, ToAccept};
use fencehook::store::{DbErrorKind, Store, StoreError};
use serde_json::json;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::inbox::{booked, event_status, to_accept, wait_until_put_back, worker_env};
use crate::helpers::process::{PrivateRedis, WorkProcess};
use crate::helpers::{payment, wait_for, TestContext};

/// Waits until a worker has looked at `tx` and put it back to wait for its
/// payment; then checks no attempt was spent on it.
async fn wait_until_put_back_to_wait(ctx: &TestContext, tx: &str, reason: &str) {
    wait_until_put_back(ctx, tx, reason).await;
    assert_eq!(
        event_status(ctx, tx).await,
        [("queued".to_owned(), 0)],
        "waiting, no attempt spent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_accepted_event_wakes_idle_workers_and_is_booked() {
    let ctx = TestContext::new().await;
    // Workers that would poll only once a minute: done within the deadline
    // means a notification woke them.
    let mut cfg = ctx.inbox_config(2);
    cfg.inbox.idle_poll = Duration::from_secs(60);
    let app = ctx.spawn(cfg.clone()).await;
    // Another instance's workers hear of it through PostgreSQL's NOTIFY,
    // sent after the accept's commit.
    let mut accept_only = cfg;
    accept_only.inbox.workers = 0;
    let elsewhere = ctx.spawn(accept_only).await;
    // Give the workers a moment to find nothing and go to sleep (if they
    // have not yet, the test proves less; it cannot fail wrongly).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = elsewhere.deliver(&payment("tx_inbox_0", 4100)).await;
    assert_eq!((r.status, r.result()), (200, "accepted"), "{r:?}");
    wait_for(
        "done, woken by the NOTIFY of another instance",
        Duration::from_secs(20),
        || async { event_status(&ctx, "tx_inbox_0").await == [("done".to_owned(), 0)] },
    )
    .await;
    let r = app.deliver(&payment("tx_inbox_1", 4200)).await;
    assert_eq!((r.status, r.result()), (200, "accepted"), "{r:?}");
    wait_for(
        "done, woken by the notification",
        Duration::from_secs(20),
        || async { event_status(&ctx, "tx_inbox_1").await == [("done".to_owned(), 0)] },
    )
    .await;
    assert!(booked(&ctx, "tx_inbox_1").await);
    assert_eq!(ctx.entries().await, 2);
    let r = app.deliver(&payment("tx_inbox_1", 4200)).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"));
    let r = app.deliver(&payment("tx_inbox_1", 4201)).await;
    assert_eq!((r.status, r.result()), (422, "payload_mismatch"));
    assert!(app.metric(INBOX_LAG_SECONDS, &[]) >= 0.0);
    assert_eq!(app.metric(INBOX_ATTEMPTS_TOTAL, &[("result", "done")]), 2.0);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn accepting_needs_no_redis_and_the_event_is_booked_when_redis_returns() {
    let ctx = TestContext::new().await;
    let mut redis = PrivateRedis::start().await;
    let mut cfg = ctx.inbox_config(2);
    cfg.lease.redis_url = redis.url();
    let app = ctx.spawn(cfg).await;
    redis.kill().await;
    for i in 0..5 {
        let r = app
            .deliver(&payment(&format!("tx_no_redis_{i}"), 100 + i))
            .await;
        assert_eq!((r.status, r.result()), (200, "accepted"), "{r:?}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ctx.entries().await, 0, "nothing booked without a lease");
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE attempts > 0")
            .await,
        0,
        "a lease backend down spends no attempt"
    );
    redis.restart().await;
    wait_for("all five booked", Duration::from_secs(20), || async {
        ctx.entries().await == 5
    })
    .await;
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_over_three_instances_are_accepted_once_and_booked_once() {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(Arc::new(ctx.spawn(ctx.inbox_config(2)).await));
    }
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let app = apps[i % 3].clone();
            tokio::spawn(async move { app.deliver(&payment("tx_inbox_dup", 999)).await })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap().result().to_owned());
    }
    assert_eq!(
        results.iter().filter(|r| *r == "accepted").count(),
        1,
        "{results:?}"
    );
    assert!(
        results.iter().all(|r| r == "accepted" || r == "duplicate"),
        "{results:?}"
    );
    wait_for("booked", Duration::from_secs(10), || {
        booked(&ctx, "tx_inbox_dup")
    })
    .await;
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 1);
    assert_eq!(ctx.entries().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flaky_downstream_is_retried_with_one_key_and_rising_tokens_until_it_recovers() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_status(503);
    let mut cfg = ctx.inbox_config(1);
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    assert_eq!(
        app.deliver(&payment("tx_flaky", 300)).await.result(),
        "accepted"
    );
    wait_for("three failed attempts", Duration::from_secs(20), || async {
        downstream.calls().len() >= 3
    })
    .await;
    downstream.set_status(200);
    wait_for("done", Duration::from_secs(20), || async {
        event_status(&ctx, "tx_flaky").await[0].0 == "done"
    })
    .await;
    let calls = downstream.calls();
    assert!(calls
        .windows(2)
        .all(|w| w[0].idempotency_key == w[1].idempotency_key));
    assert!(
        calls
            .windows(2)
            .all(|w| w[0].fencing_token < w[1].fencing_token),
        "every attempt under a newer token: {:?}",
        calls.iter().map(|c| c.fencing_token).collect::<Vec<_>>()
    );
    assert!(
        calls.windows(2).all(|w| w[0].body == w[1].body),
        "one body per key"
    );
    let (status, attempts) = event_status(&ctx, "tx_flaky").await.remove(0);
    assert_eq!(status, "done");
    assert_eq!(
        attempts as usize,
        calls.len() - 1,
        "only failed attempts are counted"
    );
    let errors: i64 = ctx
        .count("SELECT jsonb_array_length(errors)::bigint FROM events WHERE transaction_id = 'tx_flaky'")
        .await;
    assert_eq!(
        errors,
        i64::from(attempts),
        "each failure kept with its error"
    );
    assert_eq!(ctx.entries().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_is_dead_after_max_attempts_and_a_replay_books_it_once() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_status(500);
    let mut cfg = ctx.inbox_config(1);
    cfg.downstream_url = Some(downstream.url());
    cfg.inbox.max_attempts = 3;
    let db = cfg.db.clone();
    let app = ctx.spawn(cfg).await;
    assert_eq!(
        app.deliver(&payment("tx_dies", 700)).await.result(),
        "accepted"
    );
    wait_for("dead", Duration::from_secs(20), || async {
        event_status(&ctx, "tx_dies").await == [("dead".to_owned(), 3)]
    })
    .await;
    assert_eq!(ctx.payment("tx_dies").await.unwrap().0, "dead");
    wait_for("the dead gauge", Duration::from_secs(10), || async {
        app.state.health.count_inbox().await;
        app.metric(INBOX_ROWS, &[("status", "dead")]) == 1.0
    })
    .await;
    assert_eq!(app.metric(INBOX_ATTEMPTS_TOTAL, &[("result", "dead")]), 1.0);

    downstream.set_status(200);
    let store = Store::new(&db).unwrap();
    let one = Replay {
        provider: Some("generic".into()),
        transaction_id: Some("tx_dies".into()),
        since: None,
        ..Replay::default()
    };
    assert_eq!(store.replay(&one).await.unwrap().len(), 1);
    wait_for("booked after the replay", Duration::from_secs(20), || {
        booked(&ctx, "tx_dies")
    })
    .await;
    assert_eq!(
        store.replay(&one).await.unwrap().len(),
        0,
        "a second replay finds nothing dead"
    );
    assert_eq!(ctx.entries().await, 1);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_accepted_before_its_payment_waits_without_spending_attempts() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.inbox_config(2)).await;
    let mut refund = payment("re_inbox", 300);
    refund["event_type"] = json!("refund.succeeded");
    refund["payment_transaction_id"] = json!("pay_inbox");
    assert_eq!(app.deliver(&refund).await.result(), "accepted");
    wait_until_put_back_to_wait(&ctx, "re_inbox", "waiting for payment pay_inbox").await;
    assert_eq!(
        app.deliver(&payment("pay_inbox", 1000)).await.result(),
        "accepted"
    );
    wait_for(
        "the refund done once its payment is booked",
        Duration::from_secs(10),
        || async { event_status(&ctx, "re_inbox").await == [("done".to_owned(), 0)] },
    )
    .await;
    assert!(booked(&ctx, "re_inbox").await);
    // A refund its payment cannot give is dead with its reason.
    let mut too_much = payment("re_inbox_big", 900);
    too_much["event_type"] = json!("refund.succeeded");
    too_much["payment_transaction_id"] = json!("pay_inbox");
    assert_eq!(app.deliver(&too_much).await.result(), "accepted");
    wait_for("rejected and dead", Duration::from_secs(10), || async {
        event_status(&ctx, "re_inbox_big").await == [("dead".to_owned(), 0)]
    })
    .await;
    let reason: String = ctx
        .db()
        .await
        .query_one(
            "SELECT last_error FROM events WHERE transaction_id = 're_inbox_big'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(reason, "refund_rejected: exceeds_payment");
    ctx.assert_audit_clean().await;
}

/// A worker SIGKILLed in the middle of its downstream call: its event is
/// taken again once its lock runs out, booked by another worker under a
/// newer token, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_whose_worker_was_killed_is_booked_by_another_once() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    // Accept only, in process: the workers are the processes below.
    let app = ctx.spawn(ctx.inbox_config(0)).await;
    downstream.gate_token(1);
    let env = worker_env(&ctx, &downstream, &[]);
    let a = WorkProcess::start(&env).await;
    assert_eq!(
        app.deliver(&payment("tx_orphaned", 610)).await.result(),
        "accepted"
    );
    wait_for("A's downstream call", Duration::from_secs(10), || async {
        !downstream.calls().is_empty()
    })
    .await;
    a.signal("KILL");
    let _b = WorkProcess::start(&env).await;
    wait_for("done by B", Duration::from_secs(20), || async {
        event_status(&ctx, "tx_orphaned").await == [("done".to_owned(), 0)]
    })
    .await;
    assert_eq!(
        ctx.payment("tx_orphaned").await,
        Some(("succeeded".to_owned(), 2))
    );
    assert_eq!(ctx.entries().await, 1);
    downstream.open_gate();
    ctx.assert_audit_clean().await;
}

/// SIGTERM while workers are mid-call: the process ends its current
/// attempts and exits 0; whatever it did not finish is booked by the next
/// worker — nothing accepted is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_stopped_with_work_in_flight_loses_nothing() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_delay(Duration::from_millis(700));
    let app = ctx.spawn(ctx.inbox_config(0)).await;
    for i in 0..6 {
        let r = app.deliver(&payment(&format!("tx_term_{i}"), 10 + i)).await;
        assert_eq!(r.result(), "accepted");
    }
    let env = worker_env(&ctx, &downstream, &[]);
    let mut a = WorkProcess::start(&env).await;
    wait_for("A at work", Duration::from_secs(10), || async {
        !downstream.calls().is_empty()
    })
    .await;
    a.signal("TERM");
    let exit = a.wait_exit(Duration::from_secs(15)).await.expect("A exits");
    assert!(exit.success(), "{exit:?}");
    assert!(
        a.logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("letting the current attempts end")),
        "A ended its attempts before it stopped"
    );
    let b = WorkProcess::start(&env).await;
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while ctx
        .count("SELECT count(*) FROM events WHERE status = 'done'")
        .await
        < 6
    {
        if tokio::time::Instant::now() > end {
            let rows: Vec<String> = ctx
                .db()
                .await
                .query("SELECT format('%s %s %s %s %s', transaction_id, status, attempts, locked_until, last_error) FROM events ORDER BY id", &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            panic!(
                "not all six events done in 30 s: {rows:#?}\nA: {:#?}\nB: {:#?}",
                a.logs.lock().unwrap(),
                b.logs.lock().unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ctx.entries().await, 6, "each booked once");
    ctx.assert_audit_clean().await;
}

/// Runs the `fencehook` binary; (exit code, stdout, stderr).
async fn fencehook_binary(args: &[&str], database_url: &str) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .await
        .expect("the fencehook binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What an operator sees and does: `inspect` (text and JSON) shows the row,
/// its refund, their entries and events (the text in major units, the JSON
/// in the stored minor units); `events` searches them; `replay`
/// prints what it re-queued; `prune` drops finished events past retention
/// (and with `--dry-run` only counts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inspect_events_replay_and_prune_show_and_do_what_they_say() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.inbox_config(2)).await;
    app.deliver(&payment("pay_ops", 5000)).await;
    let mut refund = payment("re_ops", 2000);
    refund["event_type"] = json!("refund.succeeded");
    refund["payment_transaction_id"] = json!("pay_ops");
    app.deliver(&refund).await;
    wait_for("both events done", Duration::from_secs(10), || async {
        ctx.count("SELECT count(*) FROM events WHERE status = 'done'")
            .await
            == 2
    })
    .await;
    assert!(booked(&ctx, "pay_ops").await && booked(&ctx, "re_ops").await);
    let url = ctx.database_url.clone();

    let (code, out, err) = fencehook_binary(
        &[
            "inspect",
            "--provider",
            "generic",
            "--transaction-id",
            "pay_ops",
        ],
        &url,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("generic:pay_ops  payment succeeded  50.00 EUR"),
        "{out}"
    );
    assert!(
        out.contains("refunded or disputed (net): 20.00 EUR"),
        "{out}"
    );
    assert!(
        out.contains("child re_ops  refund succeeded  20.00 EUR"),
        "{out}"
    );
    assert!(out.contains("credit") && out.contains("debit"), "{out}");
    assert!(
        out.contains("done") && out.contains("refund.succeeded"),
        "{out}"
    );
    let (code, out, _) = fencehook_binary(
        &[
            "inspect",
            "--provider",
            "generic",
            "--transaction-id",
            "pay_ops",
            "--json",
        ],
        &url,
    )
    .await;
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json is JSON");
    assert_eq!(v["row"]["status"], "succeeded");
    assert_eq!(v["row"]["amount_minor"], 5000);
    assert_eq!(v["row"]["amount"], "50.00", "and beside it in major units");
    assert_eq!(v["row"]["amount_out"], "20.00");
    assert_eq!(v["entries"][0]["amount"], "50.00");
    assert_eq!(v["children"].as_array().unwrap().len(), 1);
    assert_eq!(v["entries"].as_array().unwrap().len(), 2);
    assert_eq!(v["events"].as_array().unwrap().len(), 2);
    let (code, _, _) = fencehook_binary(
        &[
            "inspect",
            "--provider",
            "generic",
            "--transaction-id",
            "nope",
        ],
        &url,
    )
    .await;
    assert_eq!(code, 1, "an unknown transaction exits 1");

    let (code, out, _) = fencehook_binary(&["events", "--transaction-id", "pay_ops"], &url).await;
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().count(),
        2,
        "the payment's and its refund's: {out}"
    );
    let (_, out, _) = fencehook_binary(&["events", "--status", "dead", "--json"], &url).await;
    assert!(out.trim().is_empty(), "nothing dead: {out}");

    let (code, out, _) = fencehook_binary(&["replay", "--dead"], &url).await;
    assert_eq!(code, 0);
    assert!(out.contains("nothing re-queued"), "{out}");
    ctx.db()
        .await
        .batch_execute(
            "UPDATE events SET status = 'dead', last_error = 'planted' WHERE transaction_id = 're_ops'",
        )
        .await
        .unwrap();
    let (_, out, _) = fencehook_binary(&["replay", "--dead", "--since", "1h"], &url).await;
    assert!(
        out.contains("re-queued 1 dead event(s)") && out.contains("re_ops"),
        "{out}"
    );
    wait_for(
        "the replayed event done",
        Duration::from_secs(10),
        || async { event_status(&ctx, "re_ops").await == [("done".to_owned(), 0)] },
    )
    .await;
    assert_eq!(
        ctx.entries().await,
        2,
        "a replay of a booked refund books nothing more"
    );

    let (code, out, _) = fencehook_binary(&["prune", "--event-retention-days", "1"], &url).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("deleted 0 event(s)"),
        "nothing is a day old: {out}"
    );
    ctx.db()
        .await
        .batch_execute("UPDATE events SET received_at = now() - interval '40 days'")
        .await
        .unwrap();
    let (code, out, _) = fencehook_binary(&["prune", "--dry-run"], &url).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("would delete 2 event(s)") && out.contains("nothing deleted"),
        "{out}"
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM events").await,
        2,
        "a dry run deletes nothing"
    );
    let (_, out, _) = fencehook_binary(&["prune"], &url).await;
    assert!(out.contains("deleted 2 event(s)"), "{out}");
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 0);
}

/// Inbox events cost up to the body limit each and nothing bounded them:
/// `serve` prunes finished events past retention on a schedule of its own,
/// and the events table's size on disk is a gauge (and an alert).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_prunes_finished_events_on_its_own_schedule_and_reports_the_stored_bytes() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.inbox_config(1);
    cfg.inbox.prune_interval = Some(Duration::from_millis(200));
    let app = ctx.spawn(cfg).await;
    wait_for(
        "the stored bytes sampled",
        Duration::from_secs(15),
        || async { app.metric("fencehook_inbox_stored_bytes", &[]) > 0.0 },
    )
    .await;
    app.deliver(&payment("pay_old", 5000)).await;
    app.deliver(&payment("pay_recent", 5000)).await;
    wait_for("both events done", Duration::from_secs(10), || async {
        ctx.count("SELECT count(*) FROM events WHERE status = 'done'")
            .await
            == 2
    })
    .await;
    ctx.db()
        .await
        .batch_execute(
            "UPDATE events SET received_at = now() - interval '2 days' WHERE transaction_id = 'pay_old'",
        )
        .await
        .unwrap();
    wait_for("the old event pruned", Duration::from_secs(10), || async {
        ctx.count("SELECT count(*) FROM events WHERE transaction_id = 'pay_old'")
            .await
            == 0
    })
    .await;
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE transaction_id = 'pay_recent'")
            .await,
        1,
        "within retention (a day): kept"
    );
    // The prune counts what it deleted once its DELETE has answered: the row
    // can be gone a moment before the counter moves.
    wait_for("the prune counted", Duration::from_secs(10), || async {
        app.metric("fencehook_pruned_total", &[]) == 1.0
    })
    .await;
    assert!(booked(&ctx, "pay_old").await, "the booking stays");
}

/// A "keep forever" retention (u64::MAX days) once wrapped to −1 days and
/// `prune` deleted every finished event; `--since 100000y` panicked. Both
/// are refused now, naming what is wrong, and nothing is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_and_ages_beyond_the_calendar_are_refused_and_prune_deletes_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.inbox_config(1)).await;
    app.deliver(&payment("pay_keep", 5000)).await;
    wait_for("the event done", Duration::from_secs(10), || async {
        ctx.count("SELECT count(*) FROM events WHERE status = 'done'")
            .await
            == 1
    })
    .await;
    let url = ctx.database_url.clone();
    for days in ["18446744073709551615", "36501", "0"] {
        let (code, out, err) =
            fencehook_binary(&["prune", "--event-retention-days", days], &url).await;
        assert_eq!(code, 2, "{days}: {out}{err}");
        assert!(
            err.contains("FENCEHOOK_EVENT_RETENTION_DAYS") && err.lines().count() == 1,
            "{days}: {err}"
        );
    }
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 1);
    let (code, out, _) =
        fencehook_binary(&["prune", "--event-retention-days", "36500"], &url).await;
    assert_eq!(code, 0);
    assert!(out.contains("deleted 0 event(s)"), "{out}");
    for args in [
        &["events", "--since", "100000y"][..],
        &["replay", "--dead", "--since", "100000y"][..],
    ] {
        let (code, _, err) = fencehook_binary(args, &url).await;
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("before any date"), "{args:?}: {err}");
    }
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 1);
}

/// A failed payment can still succeed (the lifecycle moves `failed` to
/// `succeeded`), so a refund taken while its payment's row says `failed`
/// waits for it like for a payment not booked yet; it is not given up.
/// Found by `CHAOS_MODE=inbox make chaos` (seed 1): a refund accepted between
/// a payment's failure and its success was dead, and never booked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_of_a_failed_payment_waits_for_its_success_instead_of_dying() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.inbox_config(2)).await;
    let mut failed = payment("pay_fails_first", 1000);
    failed["event_type"] = json!("payment.failed");
    assert_eq!(app.deliver(&failed).await.result(), "accepted");
    wait_for("the failure booked", Duration::from_secs(10), || async {
        matches!(ctx.payment("pay_fails_first").await, Some((s, _)) if s == "failed")
    })
    .await;

    let mut refund = payment("re_after_failure", 300);
    refund["event_type"] = json!("refund.succeeded");
    refund["payment_transaction_id"] = json!("pay_fails_first");
    assert_eq!(app.deliver(&refund).await.result(), "accepted");
    wait_until_put_back_to_wait(
        &ctx,
        "re_after_failure",
        "payment pay_fails_first failed; waiting for it to succeed",
    )
    .await;

    assert_eq!(
        app.deliver(&payment("pay_fails_first", 1000))
            .await
            .result(),
        "accepted"
    );
    wait_for(
        "the refund done once its payment succeeded",
        Duration::from_secs(10),
        || async { event_status(&ctx, "re_after_failure").await == [("done".to_owned(), 0)] },
    )
    .await;
    assert!(booked(&ctx, "re_after_failure").await);
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE status = 'dead'")
            .await,
        0
    );
    ctx.assert_audit_clean().await;
}

/// A worker that stalls past its lock, while another takes the event again,
/// must not record its result over the newer attempt: each take's lock is
/// the attempt's token, and settling checks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attempt_that_outlived_its_lock_records_nothing_over_the_newer_one() {
    let ctx = TestContext::new().await;
    // Accept only: this test is the worker.
    let app = ctx.spawn(ctx.inbox_config(0)).await;
    assert_eq!(
        app.deliver(&payment("tx_two_takes", 55)).await.result(),
        "accepted"
    );
    let store = Store::new(&ctx.config().db).unwrap();
    let stalled = store
        .take(Duration::from_millis(50), 1)
        .await
        .unwrap()
        .pop()
        .expect("the first take")
        .unwrap();
    wait_for(
        "the first lock rescued",
        Duration::from_secs(10),
        || async { store.rescue().await.unwrap() == 1 },
    )
    .await;
    let newer = store
        .take(Duration::from_secs(60), 1)
        .await
        .unwrap()
        .pop()
        .expect("taken again")
        .unwrap();
    assert_eq!(newer.id, stalled.id);
    let dead = Settle::Dead {
        error: "the stalled worker's verdict".to_owned(),
        spent: true,
    };
    assert!(
        !store.settle(&stalled, &dead).await.unwrap(),
        "the stale attempt is not recorded"
    );
    assert_eq!(
        event_status(&ctx, "tx_two_takes").await,
        [("processing".to_owned(), 0)]
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM payments WHERE status = 'dead'")
            .await,
        0
    );
    let retry = Settle::Retry {
        delay: Duration::from_millis(1),
        error: "the newer attempt's".to_owned(),
    };
    assert!(store.settle(&newer, &retry).await.unwrap());
    assert_eq!(
        event_status(&ctx, "tx_two_takes").await,
        [("queued".to_owned(), 1)]
    );
}

/// Events whose worker died are put back while the other workers have a
/// backlog, not only once the queue is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_orphaned_event_is_rescued_while_a_backlog_keeps_the_workers_busy() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_delay(Duration::from_millis(300));
    let mut cfg = ctx.inbox_config(0);
    cfg.downstream_url = Some(downstream.url());
    let accepting = ctx.spawn(cfg.clone()).await;
    assert_eq!(
        accepting.deliver(&payment("tx_orphan", 9)).await.result(),
        "accepted"
    );
    // Its worker died holding it: processing, with a lock that ran out.
    ctx.db()
        .await
        .batch_execute(
            "UPDATE events SET status = 'processing', locked_until = now() - interval '1 second'
              WHERE transaction_id = 'tx_orphan'",
        )
        .await
        .unwrap();
    // A worker takes sixteen at a time: 400 events are 25 takes of 300 ms.
    for i in 0..400 {
        let r = accepting
            .deliver(&payment(&format!("tx_backlog_{i}"), 10 + i))
            .await;
        assert_eq!(r.result(), "accepted");
    }
    cfg.inbox.workers = 1;
    let _worker = ctx.spawn(cfg).await;
    wait_for("the orphan rescued", Duration::from_secs(8), || async {
        event_status(&ctx, "tx_orphan").await[0].0 != "processing"
    })
    .await;
    let waiting = ctx
        .count("SELECT count(*) FROM events WHERE status = 'queued' AND transaction_id LIKE 'tx_backlog_%'")
        .await;
    assert!(
        waiting >= 50,
        "rescued with the backlog still there ({waiting} queued)"
    );
}

/// Tuples read from `events` and `payments`, as PostgreSQL's statistics
/// count them once they show `inserted` events inserted and `updated`
/// updated (a backend reports its counters within a second of going idle;
/// a booked event's last statement is the update that records it done).
async fn tuples_read_once_reported(ctx: &TestContext, inserted: i64, updated: i64) -> i64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let row = ctx
            .db()
            .await
            .query_one(
                "SELECT n_tup_ins, n_tup_upd,
                        ((SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables
                           WHERE relname IN ('events', 'payments'))
                         + (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes
                             WHERE relname IN ('events', 'payments')))::bigint
                   FROM pg_stat_user_tables WHERE relname = 'events'",
                &[],
            )
            .await
            .unwrap();
        if row.get::<_, i64>(0) >= inserted && row.get::<_, i64>(1) >= updated {
            return row.get(2);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the statistics never showed {inserted} events inserted and {updated} updated"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A statement planned while `events` was nearly empty keeps its plan on
/// that connection; no statement may then read the whole table per
/// delivery. (The accept's duplicate check once did: its cached plan looked
/// up the event by provider alone, every event of the provider per accept.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn accepting_and_booking_read_no_more_rows_as_the_events_table_grows() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.inbox_config(1);
    // One connection: every statement runs on it often enough to be planned
    // once for all (PostgreSQL's generic plan, after five executions).
    cfg.db.pool_size = 1;
    let app = ctx.spawn(cfg).await;
    let mut delivered = 0;
    let mut deliver_and_book = |n: usize| {
        let app = &app;
        let start = delivered;
        delivered += n;
        async move {
            for i in start..start + n {
                let r = app
                    .deliver(&payment(&format!("tx_grow_{i}"), 100 + i as i64))
                    .await;
                assert_eq!((r.status, r.result()), (200, "accepted"), "{r:?}");
            }
            wait_for("every event booked", Duration::from_secs(30), || async {
                app.metric(INBOX_ATTEMPTS_TOTAL, &[("result", "done")]) >= (start + n) as f64
            })
            .await;
        }
    };
    deliver_and_book(10).await;
    // The table grows behind the cached plans: 20,000 booked events of the
    // same provider (no ANALYZE: that would re-plan them).
    const OLD: i64 = 20_000;
    ctx.db()
        .await
        .batch_execute(&format!(
            "INSERT INTO events (provider, transaction_id, event_type, delivery_id, fingerprint,
                                 canonical, body, status, finished_at)
             SELECT 'generic', 'old_' || g, 'payment.succeeded', 'old_' || g || ':payment.succeeded',
                    'fp', '{{}}', '{{}}', 'done', now()
               FROM generate_series(1, {OLD}) g"
        ))
        .await
        .unwrap();
    // Taken and recorded done: two updates per event.
    let before = tuples_read_once_reported(&ctx, OLD + 10, 2 * 10).await;
    deliver_and_book(20).await;
    let read = tuples_read_once_reported(&ctx, OLD + 30, 2 * 30).await - before;
    assert!(
        read < OLD,
        "20 deliveries read {read} tuples of events and payments: a statement scans the \
         {OLD} old events (a plan made on the empty table)"
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM payments WHERE status = 'succeeded'")
            .await,
        30
    );
    ctx.assert_audit_clean().await;
}

/// Accepts that arrive together are stored by one statement; each must get
/// the answer it would get alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batched_accept_answers_each_event_as_it_would_be_answered_alone() {
    let ctx = TestContext::new().await;
    let store = Store::new(&ctx.config().db).unwrap();
    let alone = |item: ToAccept| {
        let store = store.clone();
        async move {
            store
                .accept(
                    &item.event,
                    &item.fingerprint,
                    None,
                    &item.body,
                    None,
                    false,
                )
                .await
                .unwrap()
        }
    };
    assert_eq!(alone(to_accept("tx_b_seen", 100)).await, Accepted::New);
    assert_eq!(alone(to_accept("tx_b_other", 200)).await, Accepted::New);
    let batch = [
        to_accept("tx_b_seen", 100),  // the same event again
        to_accept("tx_b_new", 300),   // new
        to_accept("tx_b_other", 201), // another payload for a stored object
        to_accept("tx_b_new_2", 400), // new
    ];
    let batch: Vec<&ToAccept> = batch.iter().collect();
    let answers = store.accept_many(&batch).await.unwrap();
    assert_eq!(
        answers,
        [
            Accepted::Duplicate,
            Accepted::New,
            Accepted::Mismatch,
            Accepted::New
        ]
    );
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 4);
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM payments WHERE status = 'queued'
              AND transaction_id IN ('tx_b_seen', 'tx_b_other', 'tx_b_new', 'tx_b_new_2')"
        )
        .await,
        4
    );
    assert_eq!(
        ctx.count("SELECT amount_minor FROM payments WHERE transaction_id = 'tx_b_other'")
            .await,
        200,
        "the mismatched payload wrote nothing"
    );
    // The same batch again: every event is now stored.
    let again = store.accept_many(&batch).await.unwrap();
    assert_eq!(
        again,
        [
            Accepted::Duplicate,
            Accepted::Duplicate,
            Accepted::Mismatch,
            Accepted::Duplicate
        ]
    );
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 4);
}

/// Copies of one delivery arriving at once on one instance may share a
/// batched accept: one is `accepted`, the others `duplicate`, one event each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_on_one_instance_are_accepted_once_each() {
    let ctx = TestContext::new().await;
    let app = Arc::new(ctx.spawn(ctx.inbox_config(0)).await);
    let mut tasks = tokio::task::JoinSet::new();
    for copy in 0..3 {
        for i in 0..40 {
            let app = app.clone();
            tasks.spawn(async move {
                let r = app
                    .deliver(&payment(&format!("tx_copies_{i}"), 500 + i))
                    .await;
                assert_eq!(r.status, 200, "copy {copy} of {i}: {r:?}");
                r.result().to_owned()
            });
        }
    }
    let mut answers = std::collections::BTreeMap::<String, usize>::new();
    while let Some(answer) = tasks.join_next().await {
        *answers.entry(answer.unwrap()).or_default() += 1;
    }
    assert_eq!(
        answers,
        [("accepted".to_owned(), 40), ("duplicate".to_owned(), 80)].into()
    );
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 40);
    assert_eq!(
        ctx.count("SELECT count(DISTINCT transaction_id) FROM payments WHERE status = 'queued'")
            .await,
        40
    );
}

/// One event the database refuses fails a batched accept: its events are
/// then accepted one by one, and only the refused one gets the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_with_an_event_the_database_refuses_answers_the_others_as_alone() {
    let ctx = TestContext::new().await;
    let store = Store::new(&ctx.config().db).unwrap();
    // Lower-case currency: the HTTP edge refuses it, the CHECK too.
    let mut refused = to_accept("tx_t_refused", 50);
    refused.event.currency = "eur".to_owned();
    refused.fingerprint = refused.event.fingerprint();
    let batch = [
        to_accept("tx_t_1", 100),
        refused,
        to_accept("tx_t_2", 200),
        to_accept("tx_t_1", 100), // a copy: goes alone after the statement
    ];
    let answers = store.accept_together(&batch).await;
    assert!(matches!(answers[0], Ok(Accepted::New)), "{answers:?}");
    assert!(
        matches!(
            answers[1],
            Err(StoreError::Db {
                kind: DbErrorKind::Constraint,
                ..
            })
        ),
        "{answers:?}"
    );
    assert!(matches!(answers[2], Ok(Accepted::New)), "{answers:?}");
    assert!(matches!(answers[3], Ok(Accepted::Duplicate)), "{answers:?}");
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 2);
    assert_eq!(
        ctx.count("SELECT count(*) FROM payments WHERE transaction_id = 'tx_t_refused'")
            .await,
        0
    );
    // Without the refused event the same kind of batch is one statement, and
    // a copy in it is answered after it.
    let answers = store
        .accept_together(&[
            to_accept("tx_t_3", 300),
            to_accept("tx_t_2", 200),
            to_accept("tx_t_3", 300),
        ])
        .await;
    assert!(
        matches!(
            answers[..],
            [
                Ok(Accepted::New),
                Ok(Accepted::Duplicate),
                Ok(Accepted::Duplicate)
            ]
        ),
        "{answers:?}"
    );
}

/// Two batched accepts that carry the same transactions in opposite orders
/// (copies that came to both at once) take their locks in one order: no
/// deadlock, which PostgreSQL would break only after a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_accepts_of_the_same_transactions_in_opposite_orders_do_not_deadlock() {
    let ctx = TestContext::new().await;
    let store = Store::new(&ctx.config().db).unwrap();
    for round in 0..30 {
        let forward: Vec<ToAccept> = (0..6)
            .map(|i| to_accept(&format!("tx_order_{round}_{i}"), 10 + i))
            .collect();
        let backward: Vec<ToAccept> = forward.iter().rev().cloned().collect();
        let (a, b) = tokio::join!(
            store.accept_together(&forward),
            store.accept_together(&backward)
        );
        for answer in a.iter().chain(&b) {
            assert!(
                matches!(answer, Ok(Accepted::New | Accepted::Duplicate)),
                "{answer:?}"
            );
        }
    }
    assert_eq!(ctx.count("SELECT count(*) FROM events").await, 180);
    drop(store);
    // Each connection's counters reach the statistics when it closes.
    wait_for(
        "the store's connections closed",
        Duration::from_secs(30),
        || async {
            ctx.count(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .await
                == 0
        },
    )
    .await;
    assert_eq!(
        ctx.count("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            .await,
        0
    );
}
