//! Inbox mode never wedges: a dead worker's event is taken again within
//! about a lease TTL, an unreadable event is dead alone, a replay restarts
//! the age clock, an accept that loses a race answers as sync mode would, and
//! what waits for a payment is woken when the payment is booked.

use std::time::Duration;

use fencehook::domain::{CanonicalEvent, EventKind};
use fencehook::metrics::INBOX_ATTEMPTS_TOTAL;
use fencehook::store::events::Replay;
use fencehook::store::inbox::{Accepted, Settle};
use fencehook::store::Store;
use serde_json::json;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::inbox::{
    booked, event_status, generic, to_accept, wait_until_put_back, worker_env,
};
use crate::helpers::process::WorkProcess;
use crate::helpers::{payment, wait_for, TestContext};

fn refund_of(payment_tx: &str, tx: &str, amount: i64) -> serde_json::Value {
    let mut refund = payment(tx, amount);
    refund["event_type"] = json!("refund.succeeded");
    refund["payment_transaction_id"] = json!(payment_tx);
    refund
}

/// Moves `tx`'s next look an hour away, deep into a waiting event's pause,
/// once it is queued (not while a worker has it, whose re-queue would set
/// its own pause).
async fn push_its_next_look_an_hour_away(ctx: &TestContext, tx: &str) {
    wait_for("the event queued", Duration::from_secs(10), || async {
        ctx.db()
            .await
            .execute(
                "UPDATE events SET next_attempt_at = now() + interval '1 hour'
                  WHERE transaction_id = $1 AND status = 'queued'",
                &[&tx],
            )
            .await
            .unwrap()
            == 1
    })
    .await;
}

/// A worker frozen (SIGSTOP) in the middle of its downstream call, with a
/// maximum hold far longer than its TTL: another worker books its event
/// within about one TTL, because the event's lock is only renewed while
/// the attempt lives. Woken up, the frozen worker books nothing: exactly
/// one ledger entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_workers_event_is_booked_by_another_within_about_one_ttl_and_once() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    // Accept only, in process: the workers are the processes below.
    let app = ctx.spawn(ctx.inbox_config(0)).await;
    downstream.gate_token(1);
    let env = worker_env(
        &ctx,
        &downstream,
        // Before the lock was renewed, a taken event was locked for the
        // maximum hold plus a TTL: 31 s here.
        &[("FENCEHOOK_LEASE_MAX_MS", "30000")],
    );
    let a = WorkProcess::start(&env).await;
    assert_eq!(
        app.deliver(&payment("tx_frozen", 610)).await.result(),
        "accepted"
    );
    wait_for("A's downstream call", Duration::from_secs(10), || async {
        !downstream.calls().is_empty()
    })
    .await;
    let b = WorkProcess::start(&env).await;
    a.signal("STOP");
    // One TTL for A's lease and its event's lock to run out, a second for the
    // rescue to look, and room for a loaded machine; far below 31 s.
    wait_for(
        "booked by B within about one TTL",
        Duration::from_secs(7),
        || async { event_status(&ctx, "tx_frozen").await == [("done".to_owned(), 0)] },
    )
    .await;
    assert_eq!(
        ctx.payment("tx_frozen").await,
        Some(("succeeded".to_owned(), 2)),
        "booked under B's newer token"
    );
    downstream.open_gate();
    a.signal("CONT");
    wait_for(
        "A noticed it lost its lease",
        Duration::from_secs(10),
        || async {
            a.logs
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains("lease lost") || l.contains("fence rejected"))
        },
    )
    .await;
    assert_eq!(ctx.entries().await, 1, "booked once");
    assert_eq!(
        event_status(&ctx, "tx_frozen").await,
        [("done".to_owned(), 0)],
        "A recorded nothing over B's attempt"
    );
    ctx.assert_audit_clean().await;
    drop(b);
}

/// The rescue runs on a clock of its own: a SIGKILLed worker's event is put
/// back in the queue within about one TTL while the only worker of the
/// process that rescues is in a slow downstream call (it used to rescue
/// only between its own takes: the event waited as long as that call), and
/// is booked once when a worker is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_workers_event_is_rescued_within_about_one_ttl_while_the_rescuers_worker_is_in_a_slow_call(
) {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    // Both first attempts (each transaction's first token) wait at the gate.
    downstream.gate_token(1);
    let app = ctx.spawn(ctx.inbox_config(0)).await;
    let env = worker_env(
        &ctx,
        &downstream,
        &[
            ("FENCEHOOK_LEASE_MAX_MS", "60000"),
            ("FENCEHOOK_DOWNSTREAM_TIMEOUT_MS", "45000"),
            ("FENCEHOOK_WORKERS", "1"),
        ],
    );
    let rescuer = WorkProcess::start(&env).await;
    assert_eq!(
        app.deliver(&payment("tx_slow_call", 630)).await.result(),
        "accepted"
    );
    wait_for(
        "the rescuer's slow call",
        Duration::from_secs(10),
        || async { downstream.calls().len() == 1 },
    )
    .await;
    let killed = WorkProcess::start(&env).await;
    assert_eq!(
        app.deliver(&payment("tx_killed", 640)).await.result(),
        "accepted"
    );
    wait_for(
        "the doomed worker's call",
        Duration::from_secs(10),
        || async { downstream.calls().len() == 2 },
    )
    .await;
    killed.signal("KILL");
    let killed_at = tokio::time::Instant::now();
    // One TTL for the lock to run out, a second for the rescue's tick, and
    // room for a loaded machine; the slow call lasts until the gate opens.
    wait_for(
        "the killed worker's event back in the queue",
        Duration::from_secs(7),
        || async { event_status(&ctx, "tx_killed").await == [("queued".to_owned(), 0)] },
    )
    .await;
    let rescued_after = killed_at.elapsed();
    eprintln!(
        "rescue on its own clock: the killed worker's event was queued again {:.2} s after \
         the kill (TTL 1 s), the rescuer's only worker still in its call",
        rescued_after.as_secs_f64()
    );
    assert_eq!(
        event_status(&ctx, "tx_slow_call").await,
        [("processing".to_owned(), 0)],
        "the rescuer's worker is still in its slow call"
    );
    assert_eq!(
        downstream.calls().len(),
        2,
        "nobody took the rescued event yet"
    );
    // The rescue logs after its statement commits, and its log reaches the test through a pipe:
    // waited for, not read at once.
    wait_for(
        "the rescuer's log says it put it back",
        Duration::from_secs(10),
        || async {
            rescuer
                .logs
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains("events taken again: their worker's lock ran out"))
        },
    )
    .await;

    downstream.open_gate();
    wait_for("both booked", Duration::from_secs(30), || async {
        booked(&ctx, "tx_slow_call").await && booked(&ctx, "tx_killed").await
    })
    .await;
    wait_for("both done", Duration::from_secs(10), || async {
        event_status(&ctx, "tx_killed").await[0].0 == "done"
            && event_status(&ctx, "tx_slow_call").await[0].0 == "done"
    })
    .await;
    assert_eq!(ctx.entries().await, 2, "each booked once");
    ctx.assert_audit_clean().await;
}

/// An event whose stored canonical form this binary cannot decode (here a
/// hand edit to an event kind it does not know) does not fail the take it
/// is in: it is dead with the reason, counted, and the events taken with it
/// are booked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_this_binary_cannot_read_is_dead_alone_and_the_others_of_its_take_are_booked() {
    let ctx = TestContext::new().await;
    let accepting = ctx.spawn(ctx.inbox_config(0)).await;
    for (i, tx) in ["tx_read_1", "tx_unreadable", "tx_read_2"]
        .iter()
        .enumerate()
    {
        let r = accepting.deliver(&payment(tx, 100 + i as i64)).await;
        assert_eq!(r.result(), "accepted");
    }
    ctx.db()
        .await
        .batch_execute(
            "UPDATE events SET canonical = jsonb_set(canonical, '{event_type}', '\"payment.teleported\"')
              WHERE transaction_id = 'tx_unreadable'",
        )
        .await
        .unwrap();
    // One worker takes all three in one take.
    let worker = ctx.spawn(ctx.inbox_config(1)).await;
    wait_for(
        "the readable events booked",
        Duration::from_secs(10),
        || async { booked(&ctx, "tx_read_1").await && booked(&ctx, "tx_read_2").await },
    )
    .await;
    wait_for(
        "the unreadable event dead",
        Duration::from_secs(10),
        || async { event_status(&ctx, "tx_unreadable").await == [("dead".to_owned(), 0)] },
    )
    .await;
    let reason: String = ctx
        .db()
        .await
        .query_one(
            "SELECT last_error FROM events WHERE transaction_id = 'tx_unreadable'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        reason.starts_with("unreadable: ") && reason.contains("payment.teleported"),
        "{reason}"
    );
    assert_eq!(
        ctx.payment("tx_unreadable").await.map(|(s, _)| s),
        Some("dead".to_owned()),
        "its row is dead with it, for the replay"
    );
    assert_eq!(ctx.entries().await, 2);
    assert!(worker.metric(INBOX_ATTEMPTS_TOTAL, &[("result", "dead")]) >= 1.0);
}

/// After a long outage an event older than FENCEHOOK_MAX_AGE_SECS is
/// replayed: its age counts from the replay, so its first failure after it
/// is retried, not dead; `inspect` shows the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_event_ages_from_its_replay_and_its_next_failure_is_retried() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_status(500);
    let mut cfg = ctx.inbox_config(1);
    cfg.downstream_url = Some(downstream.url());
    cfg.inbox.max_attempts = 2;
    cfg.inbox.max_age = Duration::from_secs(3600);
    // A retry waits one to two seconds: long enough to be seen queued.
    cfg.inbox.retry_base = Duration::from_secs(2);
    cfg.inbox.retry_max = Duration::from_secs(2);
    let _app = ctx.spawn(cfg).await;
    let store = Store::new(&ctx.config().db).unwrap();
    assert_eq!(
        _app.deliver(&payment("tx_outage", 77)).await.result(),
        "accepted"
    );
    wait_for(
        "dead after two failures",
        Duration::from_secs(15),
        || async { event_status(&ctx, "tx_outage").await == [("dead".to_owned(), 2)] },
    )
    .await;
    // The outage lasted longer than the age limit.
    ctx.db()
        .await
        .batch_execute(
            "UPDATE events SET received_at = now() - interval '2 hours'
              WHERE transaction_id = 'tx_outage'",
        )
        .await
        .unwrap();
    let calls_before = downstream.calls().len();
    let replayed = store
        .replay(&Replay {
            transaction_id: Some("tx_outage".to_owned()),
            ..Replay::default()
        })
        .await
        .unwrap();
    assert_eq!(replayed.len(), 1);
    wait_for(
        "the replayed event's first failure",
        Duration::from_secs(15),
        || async { downstream.calls().len() > calls_before },
    )
    .await;
    wait_for("retried, not dead", Duration::from_secs(10), || async {
        let status = event_status(&ctx, "tx_outage").await;
        assert_ne!(
            status[0].0, "dead",
            "dead on its first failure after the replay"
        );
        status[0].1 >= 1
    })
    .await;
    downstream.set_status(200);
    wait_for("booked", Duration::from_secs(15), || async {
        booked(&ctx, "tx_outage").await
    })
    .await;
    assert_eq!(ctx.entries().await, 1);
    let inspection = store.inspect("generic", "tx_outage").await.unwrap();
    let event = &inspection.events[0];
    assert_eq!(event.replays, 1);
    assert!(event.replayed_at.is_some_and(|at| at > event.received_at));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"))
        .args([
            "inspect",
            "--provider",
            "generic",
            "--transaction-id",
            "tx_outage",
        ])
        .env("DATABASE_URL", &ctx.database_url)
        .env("FENCEHOOK_MIGRATE_ON_START", "false")
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(" replayed ") && text.contains("(1x)"),
        "{text}"
    );
}

/// Opens a transaction that stores `ev` (its event and its payments row) as
/// an accept would, and keeps it open: the winner of a race, not committed
/// yet.
async fn uncommitted_accept(ctx: &TestContext, ev: &CanonicalEvent) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&ctx.database_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let fp = ev.fingerprint();
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute(
            "INSERT INTO events (provider, transaction_id, event_type, delivery_id, fingerprint,
                                 canonical, body)
             VALUES ($1, $2, $3, $2 || ':' || $3, $4, $5, '{}')",
            &[
                &ev.provider,
                &ev.transaction_id,
                &ev.event_type.as_str(),
                &fp,
                &tokio_postgres::types::Json(ev),
            ],
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO payments (provider, transaction_id, kind, event_type, amount_minor,
                                   currency, fingerprint, status, fence)
             VALUES ($1, $2::text, 'payment', $3::text, $4::int8, 'EUR', $5, 'queued', 0)",
            &[
                &ev.provider,
                &ev.transaction_id,
                &ev.event_type.as_str(),
                &ev.amount_minor,
                &fp,
            ],
        )
        .await
        .unwrap();
    client
}

/// Waits until a statement of this test's database waits for a row lock:
/// the racing accept has met the winner's uncommitted rows.
async fn wait_until_an_accept_waits(ctx: &TestContext) {
    wait_for(
        "the accept waiting for the winner",
        Duration::from_secs(10),
        || async {
            ctx.count(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .await
                >= 1
        },
    )
    .await;
}

/// Two accepts of one new event with different payloads at once: the one
/// whose insert met the other's (its snapshot saw no event) must answer as
/// sync mode would, 422 `payload_mismatch`, not `duplicate` for a payload
/// never stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_accept_racing_another_payload_of_the_same_event_is_answered_payload_mismatch() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.inbox_config(0)).await;
    let winner =
        uncommitted_accept(&ctx, &generic("tx_race", EventKind::PaymentSucceeded, 999)).await;
    let loser = tokio::spawn({
        let app_base = app.base.clone();
        async move { crate::helpers::process::deliver_to(&app_base, &payment("tx_race", 500)).await }
    });
    wait_until_an_accept_waits(&ctx).await;
    winner.batch_execute("COMMIT").await.unwrap();
    let r = loser.await.unwrap();
    assert_eq!((r.status, r.result()), (422, "payload_mismatch"), "{r:?}");
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE transaction_id = 'tx_race'")
            .await,
        1,
        "only the winner's event"
    );
    // The same payload is a duplicate, as always.
    let r = app.deliver(&payment("tx_race", 999)).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
}

/// The same race inside a batched accept (one statement for several
/// events): the event that met the winner's is answered `payload_mismatch`,
/// the others of its statement as they would be alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batched_accept_racing_another_payload_answers_that_event_payload_mismatch() {
    let ctx = TestContext::new().await;
    let store = Store::new(&ctx.config().db).unwrap();
    let winner = uncommitted_accept(
        &ctx,
        &generic("tx_race_b", EventKind::PaymentSucceeded, 999),
    )
    .await;
    let batch = vec![to_accept("tx_race_b", 500), to_accept("tx_alone_b", 10)];
    let loser = tokio::spawn({
        let store = store.clone();
        async move { store.accept_together(&batch).await }
    });
    wait_until_an_accept_waits(&ctx).await;
    winner.batch_execute("COMMIT").await.unwrap();
    let answers: Vec<Accepted> = loser
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(answers, [Accepted::Mismatch, Accepted::New]);
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE transaction_id = 'tx_race_b'")
            .await,
        1,
        "only the winner's event"
    );
}

/// Two accepts of new events under one transaction id that cannot be one
/// object (a payment's success and a refund) at once: the one whose row
/// insert met the other's is answered `payload_mismatch` and its event is
/// not kept. (A payment's failure at another amount would be the same
/// object: it answers by status.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_accept_racing_another_payload_of_the_same_object_is_answered_payload_mismatch() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.inbox_config(0)).await;
    let winner = uncommitted_accept(
        &ctx,
        &generic("tx_race_obj", EventKind::PaymentSucceeded, 999),
    )
    .await;
    let mut refund = payment("tx_race_obj", 500);
    refund["event_type"] = json!("refund.succeeded");
    refund["payment_transaction_id"] = json!("pay_race_obj");
    let loser = tokio::spawn({
        let app_base = app.base.clone();
        async move { crate::helpers::process::deliver_to(&app_base, &refund).await }
    });
    wait_until_an_accept_waits(&ctx).await;
    winner.batch_execute("COMMIT").await.unwrap();
    let r = loser.await.unwrap();
    assert_eq!((r.status, r.result()), (422, "payload_mismatch"), "{r:?}");
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM events WHERE transaction_id = 'tx_race_obj'
                AND event_type = 'refund.succeeded'"
        )
        .await,
        0,
        "the loser's event is not kept"
    );
}

/// Whether the trigger that wakes events waiting for their payment is on.
async fn wakes_on(ctx: &TestContext) -> bool {
    ctx.count(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'payments'::regclass
            AND tgname = 'payments_wake_waiting' AND tgenabled = 'O'",
    )
    .await
        == 1
}

/// Sync mode pays nothing for the inbox's wake-ups: on a database no inbox
/// has used the trigger is off (V18) and sync bookings leave it off; the
/// first accept of an inbox instance switches it on before its event is
/// stored, and a sync instance's booking then wakes what waits (the test
/// below).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wake_trigger_is_off_until_an_inbox_instance_first_accepts() {
    let ctx = TestContext::new().await;
    assert!(!wakes_on(&ctx).await, "off on a new database");
    let sync = ctx.spawn(ctx.config()).await;
    assert_eq!(
        sync.deliver(&payment("pay_off", 1000)).await.result(),
        "processed"
    );
    assert!(!wakes_on(&ctx).await, "a sync booking leaves it off");
    let inbox = ctx.spawn(ctx.inbox_config(0)).await;
    assert!(
        !wakes_on(&ctx).await,
        "an inbox start that accepted nothing leaves it off"
    );
    assert_eq!(
        inbox
            .deliver(&refund_of("pay_on", "re_on", 300))
            .await
            .result(),
        "accepted"
    );
    assert!(wakes_on(&ctx).await, "on once an inbox accepted an event");
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE transaction_id = 're_on'")
            .await,
        1
    );
}

/// A database that has held events keeps the trigger on through V18: an
/// inbox fleet that upgrades does not lose its wake-ups.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_that_held_events_keeps_the_wake_trigger_on_through_the_migration() {
    let ctx = TestContext::at_version(17).await;
    assert!(wakes_on(&ctx).await, "on before V18");
    let inbox = ctx.spawn(ctx.inbox_config(0)).await;
    assert_eq!(
        inbox
            .deliver(&refund_of("pay_held", "re_held", 300))
            .await
            .result(),
        "accepted"
    );
    inbox.stop().await;
    ctx.migrate_to_latest().await;
    assert!(wakes_on(&ctx).await, "still on after V18");
    let fresh = TestContext::new().await;
    assert!(
        !wakes_on(&fresh).await,
        "and off on a database with no event"
    );
}

/// A refund waiting for its payment (far into its pause) is woken when a
/// sync instance books the payment, not at the end of its pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_refund_is_woken_when_a_sync_instance_books_its_payment() {
    let ctx = TestContext::new().await;
    let inbox = ctx.spawn(ctx.inbox_config(1)).await;
    assert_eq!(
        inbox
            .deliver(&refund_of("pay_sync", "re_sync", 300))
            .await
            .result(),
        "accepted"
    );
    wait_until_put_back(&ctx, "re_sync", "waiting for payment %").await;
    // Deep into its wait: the fallback would take an hour.
    push_its_next_look_an_hour_away(&ctx, "re_sync").await;
    let sync = ctx.spawn(ctx.config()).await;
    assert_eq!(
        sync.deliver(&payment("pay_sync", 1000)).await.result(),
        "processed"
    );
    wait_for(
        "the refund booked once its payment is",
        Duration::from_secs(5),
        || async { booked(&ctx, "re_sync").await },
    )
    .await;
    assert_eq!(ctx.entries().await, 2);
    ctx.assert_audit_clean().await;
}

/// A refund whose worker saw its payment not booked yet, and re-queues it
/// just after the payment was booked: the re-queue makes it due at once
/// instead of after its pause, and it is booked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_re_queued_just_after_its_payment_was_booked_is_due_at_once() {
    let ctx = TestContext::new().await;
    let accepting = ctx.spawn(ctx.inbox_config(0)).await;
    assert_eq!(
        accepting
            .deliver(&refund_of("pay_late", "re_late", 300))
            .await
            .result(),
        "accepted"
    );
    let store = Store::new(&ctx.config().db).unwrap();
    let taken = store
        .take(Duration::from_secs(60), 1)
        .await
        .unwrap()
        .pop()
        .expect("the refund taken")
        .unwrap();
    // While this worker has it, the payment is booked (here by a sync
    // instance); then the worker puts the refund back to wait.
    let sync = ctx.spawn(ctx.config()).await;
    assert_eq!(
        sync.deliver(&payment("pay_late", 1000)).await.result(),
        "processed"
    );
    let requeue = Settle::Requeue {
        delay: Duration::from_secs(3600),
        reason: "waiting for payment pay_late".to_owned(),
    };
    assert!(store.settle(&taken, &requeue).await.unwrap());
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM events WHERE transaction_id = 're_late'
                AND status = 'queued' AND next_attempt_at <= now()"
        )
        .await,
        1,
        "due at once"
    );
    let _worker = ctx.spawn(ctx.inbox_config(1)).await;
    wait_for("the refund booked", Duration::from_secs(5), || async {
        booked(&ctx, "re_late").await
    })
    .await;
    assert_eq!(ctx.entries().await, 2);
}

/// A dispute's reinstatement accepted before its withdrawal waits (far into
/// its pause) and is woken when the withdrawal is booked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reinstatement_waiting_for_its_withdrawal_is_woken_when_the_withdrawal_is_booked() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.inbox_config(1)).await;
    assert_eq!(
        app.deliver(&payment("pay_disputed", 1000)).await.result(),
        "accepted"
    );
    wait_for("the payment booked", Duration::from_secs(10), || async {
        booked(&ctx, "pay_disputed").await
    })
    .await;
    let dispute = |event_type: &str| {
        let mut ev = payment("dp_1", 400);
        ev["event_type"] = json!(event_type);
        ev["payment_transaction_id"] = json!("pay_disputed");
        ev
    };
    assert_eq!(
        app.deliver(&dispute("dispute.funds_reinstated"))
            .await
            .result(),
        "accepted"
    );
    wait_until_put_back(&ctx, "dp_1", "waiting for payment %").await;
    push_its_next_look_an_hour_away(&ctx, "dp_1").await;
    assert_eq!(
        app.deliver(&dispute("dispute.funds_withdrawn"))
            .await
            .result(),
        "accepted"
    );
    wait_for(
        "the reinstatement booked once its withdrawal is",
        Duration::from_secs(5),
        || async {
            event_status(&ctx, "dp_1").await == [("done".to_owned(), 0), ("done".to_owned(), 0)]
        },
    )
    .await;
    assert_eq!(ctx.entries().await, 3, "credit, dispute, dispute_reversal");
    ctx.assert_audit_clean().await;
}
