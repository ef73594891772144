//! Reconciliation: a provider's events listed through its PSP's API (a mock
//! implementing the documented semantics) booked by the same fenced path as
//! their webhooks, exactly once whichever way each came.

use std::time::{Duration, Instant};

use fencehook::config::Config;
use fencehook::providers::psp::Notice;
use fencehook::providers::{paypal, stripe, Provider, Window};
use fencehook::reconcile::{Ask, Ending, Report};
use fencehook::store::reconcile::Trigger;
use serde_json::Value;
use time::OffsetDateTime;

use crate::helpers::psp_api::{
    Fault, MockPspApi, PAYPAL_CLIENT_ID, PAYPAL_CLIENT_SECRET, STRIPE_KEY,
};
use crate::helpers::{now, wait_for, TestApp, TestContext};

/// The stripe provider's endpoint secret (the integration tests' own).
const STRIPE_SECRET: &str = "whsec_fencehook_stripe_integration_secret";

fn stripe_table(api_url: &str) -> String {
    format!(
        "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"{STRIPE_SECRET}\"]\napi_key = \"{STRIPE_KEY}\"\napi_url = \"{api_url}\"\n"
    )
}

fn stripe_provider(mock: &MockPspApi) -> Provider {
    Provider::from_toml_str(&stripe_table(&mock.url()))
        .unwrap()
        .remove(0)
}

fn config(ctx: &TestContext, providers: Vec<Provider>) -> Config {
    let mut cfg = ctx.config();
    cfg.providers = providers;
    cfg
}

/// A Stripe `payment_intent.succeeded` of `pi` for `amount` cents, created at `created`.
fn stripe_payment(event_id: &str, pi: &str, amount: i64, created: i64) -> Value {
    let notice = Notice {
        transaction_id: pi.to_owned(),
        amount,
        currency: "EUR".into(),
        event_type: "payment.succeeded".into(),
        payment_transaction_id: None,
    };
    stripe::event_of(&notice, event_id, created).unwrap()
}

async fn deliver_stripe(app: &TestApp, event: &Value) -> crate::helpers::Reply {
    let body = event.to_string();
    let sig = stripe::sign(STRIPE_SECRET, now(), body.as_bytes()).unwrap();
    app.post(
        "/webhooks/stripe",
        &[
            ("stripe-signature", &sig),
            ("content-type", "application/json"),
        ],
        body.into_bytes(),
    )
    .await
}

fn window_back(secs: i64) -> Window {
    let now = OffsetDateTime::now_utc();
    Window {
        since: now - time::Duration::seconds(secs),
        until: now,
    }
}

async fn reconcile(cfg: &Config, provider: &Provider, dry_run: bool) -> Report {
    let reconciler = fencehook::app::reconciler(cfg).await.unwrap();
    reconciler
        .run(
            provider,
            Ask {
                window: window_back(3600),
                trigger: Trigger::Cli,
                dry_run,
            },
        )
        .await
}

/// A reproducible share of `n`: those `keep` says so of (a small LCG).
fn dropped(n: usize, seed: u64) -> Vec<bool> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % 3 == 0
        })
        .collect()
}

/// `n` payments the PSP holds, created over the last half hour; the
/// `dropped` ones never delivered, the others delivered now.
async fn some_delivered(app: &TestApp, mock: &MockPspApi, tag: &str, n: usize) -> usize {
    let base = now() - 1800;
    let lost = dropped(n, 7);
    for (i, &lost) in lost.iter().enumerate() {
        let ev = stripe_payment(
            &format!("evt_{tag}{i}"),
            &format!("pi_{tag}{i}"),
            1000 + i as i64,
            base + i as i64,
        );
        mock.add_stripe(ev.clone());
        if !lost {
            let r = deliver_stripe(app, &ev).await;
            assert!(r.status == 200 || r.status == 202, "{r:?}");
        }
    }
    dropped(n, 7).iter().filter(|d| **d).count()
}

#[tokio::test]
async fn reconcile_books_exactly_the_webhooks_that_never_arrived_and_a_rerun_books_nothing() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let cfg = config(&ctx, vec![provider.clone()]);
    let app = ctx.spawn(cfg.clone()).await;
    let n = 40;
    let missing = some_delivered(&app, &mock, "a", n).await;
    assert!(missing > 5 && missing < 30, "{missing}");
    assert_eq!(ctx.payments().await, (n - missing) as i64);

    let first = reconcile(&cfg, &provider, false).await;
    assert_eq!(first.ending, Ending::Completed, "{first:?}");
    let c = &first.counts;
    assert_eq!(
        (c.listed, c.recovered, c.known),
        (n as i64, missing as i64, (n - missing) as i64),
        "{c:?}"
    );
    assert_eq!((c.divergent, c.refused), (0, 0));
    assert_eq!(ctx.payments().await, n as i64, "every payment booked once");
    assert_eq!(ctx.entries().await, n as i64, "one ledger entry each");
    assert_eq!(
        ctx.count("SELECT count(*) FROM reconcile_findings WHERE result = 'recovered'")
            .await,
        missing as i64
    );

    let again = reconcile(&cfg, &provider, false).await;
    assert_eq!(
        (again.counts.recovered, again.counts.known),
        (0, n as i64),
        "{again:?}"
    );
    assert_eq!(ctx.entries().await, n as i64);

    // A webhook PSP retries late, after its event was recovered: a duplicate.
    let late = dropped(n, 7).iter().position(|d| *d).unwrap();
    let ev = stripe_payment(
        &format!("evt_a{late}"),
        &format!("pi_a{late}"),
        1000 + late as i64,
        now() - 1800 + late as i64,
    );
    let r = deliver_stripe(&app, &ev).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(ctx.entries().await, n as i64);
    assert_eq!(
        ctx.count("SELECT count(*) FROM reconcile_runs WHERE error IS NULL")
            .await,
        2
    );
    assert!(ctx.count("SELECT count(*) FROM reconcile_cursors WHERE last_success_at IS NOT NULL AND cursor_at IS NULL").await == 1,
        "a CLI run sets the last success, never the cursor");
    ctx.assert_audit_clean().await;
    app.stop().await;
}

#[tokio::test]
async fn in_inbox_mode_reconcile_stores_the_missing_events_for_the_workers_once() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let mut cfg = ctx.inbox_config(2);
    cfg.providers = vec![provider.clone()];
    let app = ctx.spawn(cfg.clone()).await;
    let n = 30;
    let missing = some_delivered(&app, &mock, "b", n).await;
    let report = reconcile(&cfg, &provider, false).await;
    assert_eq!(report.ending, Ending::Completed, "{report:?}");
    assert_eq!(
        (report.counts.recovered, report.counts.known),
        (missing as i64, (n - missing) as i64)
    );
    wait_for(
        "every payment booked by the workers",
        Duration::from_secs(60),
        || async { ctx.entries().await == n as i64 },
    )
    .await;
    let again = reconcile(&cfg, &provider, false).await;
    assert_eq!(
        (again.counts.recovered, again.counts.known),
        (0, n as i64),
        "{again:?}"
    );
    assert_eq!(ctx.payments().await, n as i64);
    app.stop().await;
    ctx.assert_audit_clean().await;
}

#[tokio::test]
async fn a_webhook_racing_a_reconcile_run_books_once() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let cfg = config(&ctx, vec![provider.clone()]);
    let app = ctx.spawn(cfg.clone()).await;
    let reconciler = fencehook::app::reconciler(&cfg).await.unwrap();
    let rounds = 12;
    let mut recovered_by_run = 0;
    for round in 0..rounds {
        let ev = stripe_payment(
            &format!("evt_race{round}"),
            &format!("pi_race{round}"),
            500,
            now() - 60,
        );
        mock.add_stripe(ev.clone());
        let ask = Ask {
            window: window_back(600),
            trigger: Trigger::Cli,
            dry_run: false,
        };
        // The webhook a little later each round: some rounds the run is first.
        let late = Duration::from_millis(3 * round as u64);
        let webhook = async {
            tokio::time::sleep(late).await;
            deliver_stripe(&app, &ev).await
        };
        let (reply, report) = tokio::join!(webhook, reconciler.run(&provider, ask));
        assert_eq!(report.ending, Ending::Completed, "{report:?}");
        assert!(
            matches!(reply.result(), "processed" | "duplicate"),
            "{reply:?}"
        );
        // This round's event: booked by exactly one of the two.
        let run_booked = report
            .findings
            .iter()
            .any(|f| f.psp_event_id == format!("evt_race{round}"));
        assert_eq!(
            run_booked,
            reply.result() == "duplicate",
            "round {round}: {reply:?} {report:?}"
        );
        recovered_by_run += report.counts.recovered;
        assert_eq!(ctx.entries().await, round + 1, "round {round}");
    }
    assert_eq!(ctx.payments().await, rounds);
    eprintln!(
        "race: {recovered_by_run} of {rounds} rounds booked by the run, the rest by the webhook"
    );
    ctx.assert_audit_clean().await;
    app.stop().await;
}

#[tokio::test]
async fn rate_limits_are_waited_out_as_retry_after_says_with_one_request_in_flight() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let cfg = config(&ctx, vec![provider.clone()]);
    for i in 0..150 {
        mock.add_stripe(stripe_payment(
            &format!("evt_rl{i}"),
            &format!("pi_rl{i}"),
            100,
            now() - 900 + i,
        ));
    }
    mock.fail(
        Fault::RateLimited {
            retry_after_secs: 1,
        },
        Some(2),
    );
    let report = reconcile(&cfg, &provider, false).await;
    assert_eq!(report.ending, Ending::Completed, "{report:?}");
    assert_eq!(report.counts.recovered, 150);
    let arrivals = mock.arrivals();
    assert_eq!(arrivals.len(), 4, "two 429s, then two pages of 100");
    for pair in arrivals.windows(2).take(2) {
        let waited = pair[1] - pair[0];
        assert!(
            waited >= Duration::from_millis(950),
            "Retry-After: 1 honoured: {waited:?}"
        );
    }
    assert_eq!(mock.max_in_flight(), 1);
}

#[tokio::test]
async fn paypal_events_are_listed_page_by_page_and_the_missing_ones_booked() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let table = format!(
        "[providers.paypal]\nscheme = \"paypal\"\nwebhook_id = \"WH-RECONCILE-1\"\nclient_id = \"{PAYPAL_CLIENT_ID}\"\nclient_secret = \"{PAYPAL_CLIENT_SECRET}\"\napi_url = \"{}/\"\n",
        mock.url()
    );
    let provider = Provider::from_toml_str(&table).unwrap().remove(0);
    assert_eq!(
        provider.events_api(),
        fencehook::providers::EventsApi::Ready
    );
    let cfg = config(&ctx, vec![provider.clone()]);
    for i in 0..250 {
        let notice = Notice {
            transaction_id: format!("CAP{i:05}"),
            amount: 1999,
            currency: "USD".into(),
            event_type: "payment.succeeded".into(),
            payment_transaction_id: None,
        };
        mock.add_paypal(paypal::event_of(&notice, &format!("WH-EV{i}"), now() - 1200 + i).unwrap());
    }
    let report = reconcile(&cfg, &provider, false).await;
    assert_eq!(report.ending, Ending::Completed, "{report:?}");
    assert_eq!((report.counts.listed, report.counts.recovered), (250, 250));
    assert_eq!(ctx.payments().await, 250);
    let again = reconcile(&cfg, &provider, false).await;
    assert_eq!((again.counts.recovered, again.counts.known), (0, 250));
}

/// `fencehook reconcile <args>` against the test's database and Redis,
/// with the providers file `providers`: (exit code, stdout, stderr).
/// Off the test's runtime: the mock PSP API serves on it meanwhile.
async fn cli(ctx: &TestContext, providers: &str, args: &[&str]) -> (i32, String, String) {
    let (db, redis, prefix) = (
        ctx.database_url.clone(),
        ctx.redis_url.clone(),
        ctx.prefix.clone(),
    );
    let (providers, args): (String, Vec<String>) = (
        providers.to_owned(),
        args.iter().map(|a| (*a).to_owned()).collect(),
    );
    tokio::task::spawn_blocking(move || cli_blocking(&db, &redis, &prefix, &providers, &args))
        .await
        .unwrap()
}

fn cli_blocking(
    database_url: &str,
    redis_url: &str,
    prefix: &str,
    providers: &str,
    args: &[String],
) -> (i32, String, String) {
    let dir = std::env::temp_dir().join(format!("fh-reconcile-{prefix}"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    std::fs::write(&file, providers).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.arg("reconcile").args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("FENCEHOOK_") || k == "DATABASE_URL" || k == "REDIS_URL" {
            cmd.env_remove(k);
        }
    }
    cmd.env("DATABASE_URL", database_url)
        .env("REDIS_URL", redis_url)
        .env("FENCEHOOK_REDIS_KEY_PREFIX", prefix)
        .env("FENCEHOOK_PROVIDERS", &file)
        .env("FENCEHOOK_LOG", "warn");
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn json_lines(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn a_dry_run_writes_nothing_and_lists_what_it_would_book() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    for i in 0..5 {
        mock.add_stripe(stripe_payment(
            &format!("evt_dry{i}"),
            &format!("pi_dry{i}"),
            700,
            now() - 300 + i,
        ));
    }
    let (code, out, err) = cli(
        &ctx,
        &stripe_table(&mock.url()),
        &["--dry-run", "--json", "--since", "1h"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(
        (lines[0]["listed"].as_i64(), lines[0]["recovered"].as_i64()),
        (Some(5), Some(5)),
        "{out}"
    );
    assert_eq!(lines[0]["would_book"].as_array().unwrap().len(), 5);
    ctx.assert_nothing_written().await;
    assert_eq!(ctx.count("SELECT count(*) FROM reconcile_runs").await, 0);
    assert_eq!(ctx.count("SELECT count(*) FROM reconcile_cursors").await, 0);
    // The person's version names them on stderr.
    let (code, _, err) = cli(&ctx, &stripe_table(&mock.url()), &["--dry-run"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("would book evt_dry3 (pi_dry3)"), "{err}");
    ctx.assert_nothing_written().await;
}

#[tokio::test]
async fn a_divergent_event_changes_nothing_is_reported_and_exits_1() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let app = ctx.spawn(config(&ctx, vec![provider])).await;
    let booked = stripe_payment("evt_div1", "pi_div", 1000, now() - 600);
    assert_eq!(deliver_stripe(&app, &booked).await.result(), "processed");
    // The PSP's API says another amount for the same PaymentIntent.
    mock.add_stripe(stripe_payment("evt_div2", "pi_div", 2500, now() - 500));
    let (code, out, err) = cli(
        &ctx,
        &stripe_table(&mock.url()),
        &["--json", "--provider", "stripe"],
    )
    .await;
    assert_eq!(code, 1, "{out}{err}");
    let line = &json_lines(&out)[0];
    assert_eq!(
        (line["divergent"].as_i64(), line["recovered"].as_i64()),
        (Some(1), Some(0)),
        "{out}"
    );
    assert_eq!(line["findings"][0]["reason"], "payload_mismatch", "{out}");
    assert_eq!(
        ctx.payment("pi_div").await,
        Some(("succeeded".to_owned(), 1)),
        "untouched: fence 1"
    );
    assert_eq!(ctx.entries().await, 1);
    assert_eq!(
        ctx.count("SELECT coalesce(sum(amount_minor), 0)::bigint FROM ledger_entries")
            .await,
        1000
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM reconcile_findings WHERE result = 'divergent' AND psp_event_id = 'evt_div2'").await,
        1
    );
    app.stop().await;
}

#[tokio::test]
async fn an_api_that_is_down_fails_the_run_with_exit_2_and_a_provider_without_credentials_is_named()
{
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    mock.add_stripe(stripe_payment("evt_down", "pi_down", 100, now() - 60));
    mock.fail(Fault::Down, None);
    let started = Instant::now();
    let (code, out, err) = cli(&ctx, &stripe_table(&mock.url()), &["--json"]).await;
    assert_eq!(code, 2, "{out}{err}");
    let line = &json_lines(&out)[0];
    assert_eq!(line["status"], "failed", "{out}");
    assert!(
        line["error"]
            .as_str()
            .unwrap()
            .starts_with("unavailable: answered 500"),
        "{out}"
    );
    assert_eq!(mock.arrivals().len(), 4, "tried four times, backing off");
    assert!(
        started.elapsed() >= Duration::from_millis(3000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM reconcile_runs WHERE error LIKE 'answered 500%'")
            .await,
        1
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM reconcile_cursors").await,
        0,
        "no success"
    );

    // A provider asked for by name without credentials: exit 2, named; a
    // scheme without an events API: said, exit 0.
    let no_key =
        format!("[providers.shop]\nscheme = \"stripe\"\nsecrets = [\"{STRIPE_SECRET}\"]\n");
    let (code, _, err) = cli(&ctx, &no_key, &["--provider", "shop"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("shop: no API credentials"), "{err}");
    let (code, _, err) = cli(&ctx, &no_key, &[]).await;
    assert_eq!(code, 0, "not asked for by name: {err}");
    let adyen = "[providers.ady]\nscheme = \"adyen\"\nsecrets = [\"00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF\"]\n";
    let (code, out, err) = cli(&ctx, adyen, &["--json", "--provider", "ady"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json_lines(&out)[0]["status"], "no_events_api");
}

/// The latency of `n` live deliveries, one after the other.
async fn delivery_latencies(app: &TestApp, tag: &str, n: usize) -> Vec<Duration> {
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let ev = stripe_payment(
            &format!("evt_{tag}{i}"),
            &format!("pi_{tag}{i}"),
            300,
            now(),
        );
        let t = Instant::now();
        let r = deliver_stripe(app, &ev).await;
        took.push(t.elapsed());
        assert_eq!(r.result(), "processed", "{r:?}");
    }
    took.sort();
    took
}

#[tokio::test]
async fn a_stalled_psp_api_during_a_scheduled_run_does_not_slow_live_deliveries() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let baseline_app = ctx.spawn(config(&ctx, vec![provider.clone()])).await;
    let before = delivery_latencies(&baseline_app, "base", 100).await;
    baseline_app.stop().await;

    mock.fail(Fault::Stall, None);
    let mut cfg = config(&ctx, vec![provider]);
    cfg.reconcile.interval = Some(Duration::from_secs(1));
    cfg.reconcile.settle = Duration::ZERO;
    let app = ctx.spawn(cfg).await;
    wait_for(
        "the scheduled run is waiting on the stalled API",
        Duration::from_secs(30),
        || async { mock.in_flight() == 1 },
    )
    .await;
    let during = delivery_latencies(&app, "live", 100).await;
    assert_eq!(mock.in_flight(), 1, "the run is still stalled");
    let pct = |v: &[Duration], p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
    eprintln!(
        "delivery latency p50/p99/max: without a run {:?}/{:?}/{:?}; with a run stalled on the PSP's API {:?}/{:?}/{:?}",
        pct(&before, 50), pct(&before, 99), before[before.len() - 1],
        pct(&during, 50), pct(&during, 99), during[during.len() - 1]
    );
    assert!(
        pct(&during, 99) < pct(&before, 99) * 3 + Duration::from_millis(50),
        "{during:?} vs {before:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn scheduled_runs_on_two_instances_book_each_missed_event_once_and_resume_from_the_cursor() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let n = 60;
    for i in 0..n {
        mock.add_stripe(stripe_payment(
            &format!("evt_s{i}"),
            &format!("pi_s{i}"),
            900,
            now() - 1200 + i,
        ));
    }
    let mut cfg = config(&ctx, vec![provider]);
    cfg.reconcile.interval = Some(Duration::from_secs(1));
    cfg.reconcile.lookback = Duration::from_secs(3600);
    cfg.reconcile.overlap = Duration::from_secs(5);
    cfg.reconcile.settle = Duration::ZERO;
    let (a, b) = (ctx.spawn(cfg.clone()).await, ctx.spawn(cfg.clone()).await);
    wait_for(
        "every missed event booked",
        Duration::from_secs(60),
        || async { ctx.entries().await == n },
    )
    .await;
    wait_for("runs after the first", Duration::from_secs(30), || async {
        ctx.count("SELECT count(*) FROM reconcile_runs").await >= 3
    })
    .await;
    let recovered = |app: &TestApp| {
        app.metric(
            "fencehook_reconcile_events_total",
            &[("provider", "stripe"), ("result", "recovered")],
        )
    };
    assert_eq!(
        recovered(&a) + recovered(&b),
        n as f64,
        "counted once, by whichever booked"
    );
    let success = |app: &TestApp| {
        app.metric(
            "fencehook_reconcile_last_success_timestamp_seconds",
            &[("provider", "stripe")],
        )
    };
    assert!(success(&a) > 0.0 && success(&b) > 0.0);
    a.stop().await;
    b.stop().await;
    assert_eq!(
        ctx.count("SELECT coalesce(sum(recovered), 0)::bigint FROM reconcile_runs")
            .await,
        n,
        "each booked by one run"
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM reconcile_runs WHERE error IS NOT NULL")
            .await,
        0
    );
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM reconcile_runs a JOIN reconcile_runs b ON a.provider = b.provider \
             AND a.id < b.id AND a.started_at < b.finished_at AND b.started_at < a.finished_at"
        )
        .await,
        0,
        "one runner per provider at a time: no two runs overlap"
    );
    let cursor: OffsetDateTime = ctx
        .db()
        .await
        .query_one(
            "SELECT cursor_at FROM reconcile_cursors WHERE provider = 'stripe'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let runs_before = ctx.count("SELECT count(*) FROM reconcile_runs").await;

    // While nothing runs, the PSP takes two more payments; a restart resumes
    // from the cursor (minus the overlap), not from the look-back.
    for i in 0..2 {
        mock.add_stripe(stripe_payment(
            &format!("evt_t{i}"),
            &format!("pi_t{i}"),
            900,
            now(),
        ));
    }
    let c = ctx.spawn(cfg).await;
    wait_for(
        "the new events booked after the restart",
        Duration::from_secs(60),
        || async {
            ctx.entries().await == n + 2
                && ctx.count("SELECT count(*) FROM reconcile_runs").await > runs_before
        },
    )
    .await;
    c.stop().await;
    let first_since: OffsetDateTime = ctx
        .db()
        .await
        .query_one(
            "SELECT window_since FROM reconcile_runs ORDER BY id OFFSET $1 LIMIT 1",
            &[&runs_before],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        first_since,
        cursor - time::Duration::seconds(5),
        "resumed from the cursor"
    );
    ctx.assert_audit_clean().await;
}

#[tokio::test]
async fn a_reconcile_run_lists_and_books_two_thousand_missed_events() {
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let cfg = config(&ctx, vec![provider.clone()]);
    let n = 2000;
    for i in 0..n {
        mock.add_stripe(stripe_payment(
            &format!("evt_m{i}"),
            &format!("pi_m{i}"),
            1234,
            now() - 3000 + i / 2,
        ));
    }
    let t = Instant::now();
    let report = reconcile(&cfg, &provider, false).await;
    let took = t.elapsed();
    assert_eq!(report.ending, Ending::Completed);
    assert_eq!(report.counts.recovered, n);
    assert_eq!(ctx.entries().await, n);
    let t = Instant::now();
    let again = reconcile(&cfg, &provider, false).await;
    let known_took = t.elapsed();
    assert_eq!(again.counts.known, n);
    eprintln!(
        "reconcile throughput: {n} missed events listed and booked in {took:?} ({:.0}/s); rerun, all known: {known_took:?} ({:.0}/s)",
        n as f64 / took.as_secs_f64(),
        n as f64 / known_took.as_secs_f64()
    );
}

#[tokio::test]
async fn check_config_says_which_providers_can_reconcile() {
    let dir =
        std::env::temp_dir().join(format!("fh-reconcile-cc-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    let with_key = stripe_table("https://api.stripe.com");
    std::fs::write(
        &file,
        format!("{with_key}\n[providers.plain]\nscheme = \"stripe\"\nsecrets = [\"{STRIPE_SECRET}\"]\n\n[providers.ady]\nscheme = \"adyen\"\nsecrets = [\"00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF\"]\n"),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencehook"))
        .arg("check-config")
        .env("FENCEHOOK_PROVIDERS", &file)
        .env(
            "DATABASE_URL",
            "postgres://fencehook_app@127.0.0.1:5432/fencehook",
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(
            "reconcile: stripe (can reconcile), plain (no API credentials), ady (no events API)"
        ) || stdout.lines().any(|l| l.starts_with("reconcile: ")
            && l.contains("stripe (can reconcile)")
            && l.contains("plain (no API credentials)")
            && l.contains("ady (no events API)")),
        "{stdout}"
    );
    assert!(
        !stdout.contains(STRIPE_KEY),
        "the key is never printed: {stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_the_last_runs_the_recovered_events_linked_to_their_payments_and_the_divergences(
) {
    use crate::helpers::console::{Browser, TokenFiles};
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let files = TokenFiles::new();
    let cfg = files.enable(config(&ctx, vec![provider.clone()]));
    let app = ctx.spawn(cfg.clone()).await;
    let booked = stripe_payment("evt_c1", "pi_console_div", 1000, now() - 600);
    assert_eq!(deliver_stripe(&app, &booked).await.result(), "processed");
    mock.add_stripe(stripe_payment(
        "evt_c2",
        "pi_console_div",
        4200,
        now() - 500,
    ));
    mock.add_stripe(stripe_payment(
        "evt_c3",
        "pi_console_lost",
        300,
        now() - 400,
    ));
    let report = reconcile(&cfg, &provider, false).await;
    assert_eq!(
        (report.counts.recovered, report.counts.divergent),
        (1, 1),
        "{report:?}"
    );

    let mut b = Browser::new(&app.admin);
    b.sign_in(&files.viewer).await;
    let page = b.get("/console/reconcile").await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(
        page.text
            .contains("href=\"/console/payments/stripe/pi_console_lost\""),
        "{}",
        page.text
    );
    assert!(
        page.text.contains("evt_c2") && page.text.contains("payload_mismatch"),
        "{}",
        page.text
    );
    let json = b.get_json("/console/reconcile").await.json();
    assert_eq!(json["runs"][0]["provider"], "stripe");
    assert_eq!(json["runs"][0]["counts"]["recovered"], 1);
    assert_eq!(json["recovered"][0]["psp_event_id"], "evt_c3");
    assert_eq!(json["divergent"][0]["transaction_id"], "pi_console_div");
    app.stop().await;
}

/// `fencehook inspect`'s text for a stripe transaction.
async fn inspect(ctx: &TestContext, tx: &str) -> String {
    let url = ctx.database_url.clone();
    let (code, out, err) = crate::helpers::process::fencehook_binary(
        &["inspect", "--provider", "stripe", "--transaction-id", tx],
        &[("DATABASE_URL", &url)],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payment_timeline_and_inspect_say_a_booking_came_from_reconciliation_and_a_webhooks_does_not(
) {
    use crate::helpers::console::{Browser, TokenFiles};
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    let provider = stripe_provider(&mock);
    let files = TokenFiles::new();
    let cfg = files.enable(config(&ctx, vec![provider.clone()]));
    let app = ctx.spawn(cfg.clone()).await;
    let hooked = stripe_payment("evt_m1", "pi_marks_hook", 1000, now() - 600);
    mock.add_stripe(hooked.clone());
    assert_eq!(deliver_stripe(&app, &hooked).await.result(), "processed");
    mock.add_stripe(stripe_payment("evt_m2", "pi_marks_lost", 300, now() - 400));
    let report = reconcile(&cfg, &provider, false).await;
    assert_eq!(
        (report.counts.known, report.counts.recovered),
        (1, 1),
        "{report:?}"
    );
    let run_id = ctx.count("SELECT max(id) FROM reconcile_runs").await;

    let mut b = Browser::new(&app.admin);
    b.sign_in(&files.viewer).await;
    let said = format!("evt_m2 of pi_marks_lost booked by reconciliation (cli run #{run_id})");
    let lost = b.get("/console/payments/stripe/pi_marks_lost").await;
    assert_eq!(lost.status, 200, "{}", lost.text);
    assert!(lost.text.contains(&said), "{}", lost.text);
    let json = b
        .get_json("/console/payments/stripe/pi_marks_lost")
        .await
        .json();
    let reconciled: Vec<&Value> = json["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["what"] == "reconciled")
        .collect();
    assert_eq!(reconciled.len(), 1, "{json}");
    assert_eq!(json["recovered"][0]["run_id"], run_id);
    assert_eq!(json["recovered"][0]["trigger"], "cli");
    let hook = b.get("/console/payments/stripe/pi_marks_hook").await;
    assert_eq!(hook.status, 200, "{}", hook.text);
    assert!(!hook.text.contains("reconciliation"), "{}", hook.text);

    let out = inspect(&ctx, "pi_marks_lost").await;
    assert!(
        out.contains("booked by reconciliation (no webhook arrived)"),
        "{out}"
    );
    assert!(out.contains(&said), "{out}");
    let out = inspect(&ctx, "pi_marks_hook").await;
    assert!(!out.contains("reconciliation"), "{out}");
    app.stop().await;
}

/// A provider started without `api_key` is not reconciled; once the key is
/// added to the providers file and SIGHUP reloads it, the next scheduled
/// run lists the PSP's events and books the missed ones — no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_added_and_reloaded_by_sighup_is_used_by_the_next_scheduled_run() {
    use crate::helpers::process::ServeProcess;
    let ctx = TestContext::new().await;
    let mock = MockPspApi::start().await;
    for i in 0..3 {
        mock.add_stripe(stripe_payment(
            &format!("evt_h{i}"),
            &format!("pi_hup{i}"),
            700,
            now() - 600 + i,
        ));
    }
    let dir = std::env::temp_dir().join(format!("fencehook-reconcile-hup-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    std::fs::write(
        &file,
        format!("[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"{STRIPE_SECRET}\"]\n"),
    )
    .unwrap();
    let env = vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_PROVIDERS", file.display().to_string()),
        ("FENCEHOOK_RECONCILE_INTERVAL_SECS", "1".into()),
        ("FENCEHOOK_RECONCILE_SETTLE_SECS", "0".into()),
    ];
    let p = ServeProcess::start(&env).await;
    wait_for(
        "the start said no provider has credentials",
        Duration::from_secs(10),
        || async { !p.log_lines("no provider has API credentials").is_empty() },
    )
    .await;
    assert_eq!(ctx.count("SELECT count(*) FROM reconcile_runs").await, 0);

    std::fs::write(&file, stripe_table(&mock.url())).unwrap();
    p.signal("HUP");
    wait_for(
        "the next scheduled run books the missed events",
        Duration::from_secs(30),
        || async { ctx.entries().await == 3 },
    )
    .await;
    assert!(
        ctx.count(
            "SELECT count(*) FROM reconcile_runs WHERE trigger = 'scheduled' AND recovered = 3"
        )
        .await
            == 1
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
