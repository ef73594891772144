//! The operator console over HTTP: every rule of its contract (off by
//! default, token files, sign-in, sessions, roles, CSRF and Origin, the
//! headers of every answer, escaping), its pages' data, its replays (the
//! CLI's: booked once however often asked), and its queries' plans on a
//! million payments. The same pages in a real browser: console_browser.rs.

use std::time::Duration;

use fencehook::metrics::{CONSOLE_REPLAYS_TOTAL, CONSOLE_SIGNINS_TOTAL};
use serde_json::{json, Value};

use crate::helpers::console::{Browser, TokenFiles};
use crate::helpers::downstream::MockDownstream;
use crate::helpers::process::ServeProcess;
use crate::helpers::{payment, wait_for, TestApp, TestContext};

/// An inbox-mode app with the console on, whose downstream fails: every
/// event delivered dies at its first attempt.
async fn app_with_dead_events(
    ctx: &TestContext,
    files: &TokenFiles,
    txs: &[&str],
) -> (TestApp, MockDownstream) {
    let downstream = MockDownstream::start().await;
    downstream.set_status(500);
    let mut cfg = files.enable(ctx.inbox_config(1));
    cfg.downstream_url = Some(downstream.url());
    cfg.inbox.max_attempts = 1;
    let app = ctx.spawn(cfg).await;
    for tx in txs {
        assert_eq!(app.deliver(&payment(tx, 1500)).await.result(), "accepted");
    }
    let n = txs.len() as i64;
    wait_for("every event dead", Duration::from_secs(30), || async {
        ctx.count("SELECT count(*) FROM events WHERE status = 'dead'")
            .await
            == n
    })
    .await;
    (app, downstream)
}

async fn event_id(ctx: &TestContext, tx: &str) -> i64 {
    ctx.db()
        .await
        .query_one("SELECT id FROM events WHERE transaction_id = $1", &[&tx])
        .await
        .unwrap()
        .get(0)
}

async fn event_status(ctx: &TestContext, tx: &str) -> String {
    ctx.db()
        .await
        .query_one(
            "SELECT status::text FROM events WHERE transaction_id = $1",
            &[&tx],
        )
        .await
        .unwrap()
        .get(0)
}

/// Runs `fencehook check-config` with only these settings.
fn check_config(env: &[(&str, String)]) -> (i32, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.arg("check-config");
    for (k, _) in std::env::vars() {
        if k.starts_with("FENCEHOOK_") || k == "DATABASE_URL" || k == "REDIS_URL" {
            cmd.env_remove(k);
        }
    }
    cmd.env("FENCEHOOK_GENERIC_SECRET", crate::helpers::SECRET);
    cmd.env(
        "DATABASE_URL",
        "postgres://fencehook_app@127.0.0.1:5432/fencehook",
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The 404 of a console that is off says which settings turn it on: a bare
/// 404 reads as a wrong path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_file_the_console_is_404_naming_the_settings_and_never_on_the_public_listener(
) {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let off = Browser::new(&app.admin);
    for path in [
        "/console",
        "/console/login",
        "/console/payments",
        "/console/style.css",
    ] {
        let page = off.get(path).await;
        assert_eq!(page.status, 404, "{path}");
        assert_eq!(page.text.lines().count(), 1, "{path}: {}", page.text);
        assert!(
            page.text.starts_with("the console is off: set FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE and/or FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE")
                && page.text.contains("make run CONSOLE=1"),
            "{path}: {}",
            page.text
        );
    }
    let page = off.get_json("/console").await;
    assert_eq!(page.status, 404);
    assert_eq!(page.json()["result"], "not_found");
    assert!(
        page.json()["reason"]
            .as_str()
            .is_some_and(|r| r.contains("FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE")),
        "{}",
        page.text
    );
    app.stop().await;

    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    assert_eq!(
        Browser::new(&app.admin).get("/console/login").await.status,
        200
    );
    let public = Browser::new(&app.base);
    assert_eq!(
        public.get("/console/login").await.status,
        404,
        "never on the public port"
    );
    assert_eq!(
        public
            .post("/console/login", &[("token", &files.operator)], &[])
            .await
            .status,
        404
    );
}

#[test]
fn a_short_unreadable_world_readable_or_other_group_readable_token_file_stops_the_start_naming_its_setting(
) {
    let files = TokenFiles::new();
    let path = |name: &str| files.path(name).display().to_string();
    let (code, err) = check_config(&[("FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE", path("operator"))]);
    assert_eq!(code, 0, "a good file starts: {err}");

    files.write("short", &"s".repeat(31));
    let (code, err) = check_config(&[("FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE", path("short"))]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE: ") && err.contains("at least 32"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    // Readable by its group: by fencehook's own group (a Kubernetes Secret
    // mounted for the pod's fsGroup), fine; by any other group, refused.
    // Giving the file a group needs root; tests run as root.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::set_permissions(
        files.path("operator"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let own = std::fs::metadata(files.path("operator")).unwrap().gid();
    let (code, err) = check_config(&[("FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE", path("operator"))]);
    assert_eq!(code, 0, "its group is the process's own: {err}");
    std::os::unix::fs::chown(files.path("operator"), None, Some(own + 1))
        .expect("chown: the test runs as root");
    let (code, err) = check_config(&[("FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE", path("operator"))]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE: ") && err.contains("group or others"),
        "{err}"
    );
    std::fs::set_permissions(
        files.path("operator"),
        std::fs::Permissions::from_mode(0o604),
    )
    .unwrap();
    let (code, _) = check_config(&[("FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE", path("operator"))]);
    assert_eq!(code, 2, "world-readable is refused too");

    let (code, err) = check_config(&[("FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE", path("missing"))]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE: ") && err.contains("cannot read"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_sets_a_strict_http_only_console_cookie_for_twelve_hours_and_a_wrong_token_gets_401_and_no_cookie(
) {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    let mut b = Browser::new(&app.admin);

    let form = b.get("/console/login").await;
    assert_eq!(form.status, 200);
    assert!(
        form.text.contains("name=\"token\"") && form.text.contains("type=\"password\""),
        "{}",
        form.text
    );

    let wrong = b
        .post(
            "/console/login",
            &[("token", "not-the-token-not-the-token-xxxxx")],
            &[],
        )
        .await;
    assert_eq!(wrong.status, 401);
    assert!(
        wrong.header("set-cookie").is_none(),
        "no cookie for a wrong token"
    );
    assert_eq!(
        app.metric(CONSOLE_SIGNINS_TOTAL, &[("result", "wrong_token")]),
        1.0
    );

    let ok = b.sign_in(&files.viewer).await;
    assert_eq!(ok.header("location").as_deref(), Some("/console"));
    let cookie = ok.header("set-cookie").unwrap();
    for part in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/console",
        "Max-Age=43200",
    ] {
        assert!(cookie.contains(part), "{part} in {cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "Secure only when configured: {cookie}"
    );
    assert!(
        !cookie.contains(&files.viewer),
        "the cookie is not the token"
    );
    assert_eq!(app.metric(CONSOLE_SIGNINS_TOTAL, &[("result", "ok")]), 1.0);
    let overview = b.get("/console").await;
    assert_eq!(overview.status, 200);
    assert!(
        overview
            .text
            .contains("signed in as <strong>viewer</strong>"),
        "{}",
        overview.text
    );

    // Signing out ends the cookie.
    let csrf = overview.csrf().unwrap();
    let out = b.post("/console/logout", &[("csrf", &csrf)], &[]).await;
    assert_eq!(out.status, 303);
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
    app.stop().await;

    // FENCEHOOK_CONSOLE_SECURE_COOKIE=true: Secure.
    let mut cfg = files.enable(ctx.config());
    cfg.console.secure_cookie = true;
    let app = ctx.spawn(cfg).await;
    let ok = Browser::new(&app.admin)
        .post("/console/login", &[("token", &files.operator)], &[])
        .await;
    assert!(ok.header("set-cookie").unwrap().contains("; Secure"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_wrong_tokens_from_one_address_lock_it_out_even_with_the_right_token() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    let b = Browser::new(&app.admin);
    for _ in 0..5 {
        let p = b
            .post(
                "/console/login",
                &[("token", "guess-guess-guess-guess-guess-guess")],
                &[],
            )
            .await;
        assert_eq!(p.status, 401);
    }
    let locked = b
        .post("/console/login", &[("token", &files.operator)], &[])
        .await;
    assert_eq!(locked.status, 429, "{}", locked.text);
    assert!(locked.header("set-cookie").is_none());
    let wait: u64 = locked.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    let bearer = format!("Bearer {}", files.operator);
    let script = b
        .request(
            "GET",
            "/console",
            &[("authorization", &bearer), ("accept", "application/json")],
            "",
        )
        .await;
    assert_eq!(script.status, 429, "Bearer tokens are throttled alike");
    assert_eq!(
        app.metric(CONSOLE_SIGNINS_TOTAL, &[("result", "wrong_token")]),
        5.0
    );
    assert_eq!(
        app.metric(CONSOLE_SIGNINS_TOTAL, &[("result", "throttled")]),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_session_pages_redirect_to_sign_in_json_gets_401_and_a_bearer_token_reads() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    let b = Browser::new(&app.admin);
    for path in [
        "/console",
        "/console/payments",
        "/console/events",
        "/console/refusals",
        "/console/payments/generic/x",
    ] {
        let p = b.get(path).await;
        assert_eq!(
            (p.status, p.header("location").as_deref()),
            (303, Some("/console/login")),
            "{path}"
        );
        let j = b.get_json(path).await;
        assert_eq!(j.status, 401, "{path}");
        assert!(j.json()["error"].is_string());
    }
    let forged = Browser {
        admin: app.admin.clone(),
        cookie: Some("operator.99999999999.00.00".to_owned()),
    };
    assert_eq!(
        forged.get("/console").await.status,
        303,
        "a forged cookie is no session"
    );

    let bearer = format!("Bearer {}", files.viewer);
    let read = b
        .request(
            "GET",
            "/console/payments",
            &[("authorization", &bearer), ("accept", "application/json")],
            "",
        )
        .await;
    assert_eq!(read.status, 200, "{}", read.text);
    assert!(read.json()["rows"].is_array());
    let wrong = b
        .request(
            "GET",
            "/console",
            &[("authorization", "Bearer nope-nope-nope-nope-nope-nope-nope")],
            "",
        )
        .await;
    assert_eq!(wrong.status, 401);
    assert!(wrong
        .header("www-authenticate")
        .unwrap()
        .starts_with("Bearer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_answer_carries_a_no_script_csp_deny_framing_and_no_store() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let (app, _downstream) = app_with_dead_events(&ctx, &files, &["tx_headers"]).await;
    let anonymous = Browser::new(&app.admin);
    let mut op = Browser::new(&app.admin);
    op.sign_in(&files.operator).await;
    let csrf = op.csrf().await;
    let id = event_id(&ctx, "tx_headers").await.to_string();
    let mut answers = vec![
        ("login form", anonymous.get("/console/login").await),
        ("stylesheet", anonymous.get("/console/style.css").await),
        ("no session", anonymous.get("/console").await),
        (
            "no session, JSON",
            anonymous.get_json("/console/events").await,
        ),
        (
            "wrong token",
            anonymous
                .post("/console/login", &[("token", "x")], &[])
                .await,
        ),
        (
            "signed in",
            Browser::new(&app.admin)
                .post("/console/login", &[("token", &files.viewer)], &[])
                .await,
        ),
        ("bad filter", op.get("/console/payments?status=lost").await),
        ("unknown page", op.get("/console/nothing-here").await),
        (
            "forbidden",
            op.post(&format!("/console/events/{id}/replay"), &[], &[])
                .await,
        ),
        (
            "bulk dry run",
            op.post("/console/events/replay", &[("csrf", &csrf)], &[])
                .await,
        ),
    ];
    for path in [
        "/console",
        "/console/payments",
        "/console/payments/generic/tx_headers",
        "/console/events?status=dead",
        "/console/refusals",
    ] {
        answers.push((path, op.get(path).await));
        answers.push((path, op.get_json(path).await));
    }
    for (what, page) in &answers {
        let csp = page.header("content-security-policy").unwrap_or_default();
        assert!(
            csp.contains("default-src 'none'") && !csp.contains("script-src"),
            "{what}: {csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
        assert_eq!(
            page.header("x-frame-options").as_deref(),
            Some("DENY"),
            "{what}"
        );
        assert_eq!(
            page.header("cache-control").as_deref(),
            Some("no-store"),
            "{what}"
        );
        assert!(
            !page.text.contains("<script"),
            "{what}: no page carries a script"
        );
    }
    let statuses: Vec<u16> = answers.iter().map(|(_, p)| p.status).collect();
    assert_eq!(
        &statuses[..10],
        &[200, 200, 303, 401, 401, 303, 400, 404, 403, 200],
        "{statuses:?}"
    );
    assert!(statuses[10..].iter().all(|s| *s == 200), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_without_its_sessions_csrf_from_another_origin_or_by_a_viewer_is_403_and_changes_nothing(
) {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let (app, _downstream) = app_with_dead_events(&ctx, &files, &["tx_forged"]).await;
    let replay = format!(
        "/console/events/{}/replay",
        event_id(&ctx, "tx_forged").await
    );
    let mut op = Browser::new(&app.admin);
    op.sign_in(&files.operator).await;
    let csrf = op.csrf().await;
    let mut other = Browser::new(&app.admin);
    other.sign_in(&files.operator).await;
    let others_csrf = other.csrf().await;
    let mut viewer = Browser::new(&app.admin);
    viewer.sign_in(&files.viewer).await;
    let viewers_csrf = viewer.csrf().await;
    let own = app.admin.clone();

    let refused = [
        ("no csrf", op.post(&replay, &[], &[]).await),
        (
            "a wrong csrf",
            op.post(&replay, &[("csrf", "00ff")], &[]).await,
        ),
        (
            "another session's csrf",
            op.post(&replay, &[("csrf", &others_csrf)], &[]).await,
        ),
        (
            "another origin",
            op.post(
                &replay,
                &[("csrf", &csrf)],
                &[("origin", "http://evil.example")],
            )
            .await,
        ),
        (
            "a null origin",
            op.post(&replay, &[("csrf", &csrf)], &[("origin", "null")])
                .await,
        ),
        (
            "a viewer",
            viewer
                .post(&replay, &[("csrf", &viewers_csrf)], &[("origin", &own)])
                .await,
        ),
        (
            "a viewer, many",
            viewer
                .post(
                    "/console/events/replay",
                    &[("csrf", &viewers_csrf), ("dry_run", "false")],
                    &[],
                )
                .await,
        ),
        (
            "no csrf, many",
            op.post("/console/events/replay", &[("dry_run", "false")], &[])
                .await,
        ),
    ];
    for (what, page) in &refused {
        assert_eq!(page.status, 403, "{what}: {}", page.text);
    }
    assert_eq!(
        event_status(&ctx, "tx_forged").await,
        "dead",
        "nothing changed"
    );
    assert_eq!(
        app.metric(CONSOLE_REPLAYS_TOTAL, &[("scope", "event")]),
        0.0
    );

    // The viewer's pages offer no replay; the operator's do.
    let dead = viewer.get("/console/events?status=dead").await;
    assert!(
        !dead.text.contains("/replay\"") && !dead.text.contains("Replay"),
        "{}",
        dead.text
    );
    assert!(op
        .get("/console/events?status=dead")
        .await
        .text
        .contains(&format!("action=\"{replay}\"")));

    // The genuine form, from the console's own origin, is taken.
    let ok = op
        .post(&replay, &[("csrf", &csrf)], &[("origin", &own)])
        .await;
    assert_eq!(ok.status, 303, "{}", ok.text);
    assert_ne!(event_status(&ctx, "tx_forged").await, "dead");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_event_replayed_from_the_console_many_times_at_once_is_booked_exactly_once() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let (app, downstream) = app_with_dead_events(&ctx, &files, &["tx_again"]).await;
    downstream.set_status(200);
    let mut op = Browser::new(&app.admin);
    op.sign_in(&files.operator).await;
    let csrf = op.csrf().await;
    let id = event_id(&ctx, "tx_again").await;
    let path = format!("/console/events/{id}/replay");
    let clicks = (0..8).map(|_| {
        let (op, path, csrf) = (op.clone(), path.clone(), csrf.clone());
        async move {
            op.request(
                "POST",
                &path,
                &[("accept", "application/json")],
                &format!("csrf={csrf}"),
            )
            .await
        }
    });
    let answers = futures_util::future::join_all(clicks).await;
    let replayed: u64 = answers
        .iter()
        .map(|p| {
            assert_eq!(p.status, 200, "{}", p.text);
            p.json()["replayed"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(
        replayed, 1,
        "one click re-queued it; the others found nothing dead"
    );
    wait_for(
        "booked and its event done",
        Duration::from_secs(20),
        || async {
            matches!(ctx.payment("tx_again").await, Some((s, _)) if s == "succeeded")
                && event_status(&ctx, "tx_again").await == "done"
        },
    )
    .await;
    // And once more after it is booked.
    let late = op
        .request(
            "POST",
            &path,
            &[("accept", "application/json")],
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(late.json()["replayed"], 0);
    assert_eq!(late.json()["was"], "done");
    assert_eq!(ctx.entries().await, 1, "one ledger entry");
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(
        app.metric(CONSOLE_REPLAYS_TOTAL, &[("scope", "event")]),
        9.0,
        "every ask counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_of_many_counts_first_then_requeues_each_matching_dead_event_once() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let (app, downstream) = app_with_dead_events(&ctx, &files, &["tx_m1", "tx_m2", "tx_m3"]).await;
    ctx.db()
        .await
        .execute(
            "UPDATE events SET last_error = 'another error' WHERE transaction_id = 'tx_m3'",
            &[],
        )
        .await
        .unwrap();
    let mut op = Browser::new(&app.admin);
    op.sign_in(&files.operator).await;
    let csrf = op.csrf().await;

    // The dead events, grouped by their error, each group with its form.
    let groups = op.get_json("/console/events?status=dead").await.json();
    let groups = groups["dead_groups"].as_array().unwrap().clone();
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert_eq!(groups[0]["events"], 2);
    let error = groups[0]["last_error"].as_str().unwrap().to_owned();

    let filter = [
        ("csrf", csrf.as_str()),
        ("provider", "generic"),
        ("last_error", error.as_str()),
    ];
    let dry = op.post("/console/events/replay", &filter, &[]).await;
    assert_eq!(dry.status, 200);
    assert!(dry.text.contains("Replay 2 event(s)"), "{}", dry.text);
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE status = 'dead'")
            .await,
        3,
        "a dry run changes nothing"
    );
    let asked = op
        .request(
            "POST",
            "/console/events/replay",
            &[("accept", "application/json")],
            &crate::helpers::console::form(&filter),
        )
        .await;
    assert_eq!(
        asked.json()["dry_run"],
        true,
        "a dry run unless dry_run=false is said"
    );
    assert_eq!(asked.json()["matching"], 2);

    downstream.set_status(200);
    let mut real = filter.to_vec();
    real.push(("dry_run", "false"));
    let done = op.post("/console/events/replay", &real, &[]).await;
    assert_eq!(done.status, 303);
    assert_eq!(
        done.header("location").as_deref(),
        Some("/console/events?status=queued&replayed=2")
    );
    wait_for("both booked", Duration::from_secs(20), || async {
        ctx.count("SELECT count(*) FROM payments WHERE status = 'succeeded'")
            .await
            == 2
    })
    .await;
    let again = op
        .request(
            "POST",
            "/console/events/replay",
            &[("accept", "application/json")],
            &crate::helpers::console::form(&real),
        )
        .await;
    assert_eq!(again.json()["matching"], 0, "nothing dead matches any more");
    assert_eq!(
        event_status(&ctx, "tx_m3").await,
        "dead",
        "the other error's event is untouched"
    );
    assert_eq!(ctx.entries().await, 2);
    assert_eq!(
        app.metric(CONSOLE_REPLAYS_TOTAL, &[("scope", "filter")]),
        2.0
    );
}

/// Inserts a payments row as a booking would leave it (no ledger: the
/// search reads rows only).
async fn insert_payment(
    ctx: &TestContext,
    provider: &str,
    tx: &str,
    status: &str,
    minutes_ago: i64,
) {
    ctx.db()
        .await
        .execute(
            "INSERT INTO payments (provider, transaction_id, kind, event_type, amount_minor, currency,
                                   fingerprint, status, fence, created_at, updated_at)
             VALUES ($1, $2::text, 'payment', 'payment.succeeded', 1234, 'EUR', 'fp', $3::text, 1,
                     now() - $4 * interval '1 minute', now() - $4 * interval '1 minute')",
            &[&provider, &tx, &status, &(minutes_ago as f64)],
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_finds_by_id_prefix_provider_status_and_time_newest_first_in_pages() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    for i in 0..7 {
        insert_payment(&ctx, "generic", &format!("pay_{i}"), "succeeded", 10 * i).await;
    }
    insert_payment(&ctx, "generic", "pay_dead", "dead", 1).await;
    insert_payment(&ctx, "stripe", "pi_1", "succeeded", 2).await;
    insert_payment(&ctx, "generic", "pay%_x", "failed", 3).await;
    let mut b = Browser::new(&app.admin);
    b.sign_in(&files.viewer).await;
    let ids = |page: &Value| -> Vec<String> {
        page["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["transaction_id"].as_str().unwrap().to_owned())
            .collect()
    };

    let all = b.get_json("/console/payments").await.json();
    assert_eq!(
        ids(&all),
        [
            "pay_0", "pay_dead", "pi_1", "pay%_x", "pay_1", "pay_2", "pay_3", "pay_4", "pay_5",
            "pay_6"
        ]
    );
    assert_eq!(all["rows"][0]["amount"], "12.34");
    // One read model: a search row is the row the payment page (and `inspect`) shows.
    let page = b.get_json("/console/payments/generic/pay_0").await.json();
    assert_eq!(all["rows"][0], page["row"], "{page}");

    // Pages of 3, newest first, following the cursor.
    let mut seen = Vec::new();
    let mut next = Some("limit=3&provider=generic".to_owned());
    while let Some(q) = next {
        let page = b.get_json(&format!("/console/payments?{q}")).await.json();
        seen.extend(ids(&page));
        next = page["next_page"].as_str().map(str::to_owned);
    }
    assert_eq!(
        seen,
        ["pay_0", "pay_dead", "pay%_x", "pay_1", "pay_2", "pay_3", "pay_4", "pay_5", "pay_6"]
    );

    let q = |query: &str| {
        let b = b.clone();
        let query = query.to_owned();
        async move {
            ids(&b
                .get_json(&format!("/console/payments?{query}"))
                .await
                .json())
        }
    };
    assert_eq!(
        q("transaction_id=pay_").await,
        ["pay_0", "pay_dead", "pay_1", "pay_2", "pay_3", "pay_4", "pay_5", "pay_6"]
    );
    assert_eq!(
        q("transaction_id=pay%25").await,
        ["pay%_x"],
        "% and _ are plain characters"
    );
    assert_eq!(q("transaction_id=pay_3").await, ["pay_3"]);
    assert_eq!(
        q("transaction_id=pi_1&provider=generic").await,
        Vec::<String>::new()
    );
    assert_eq!(q("status=dead").await, ["pay_dead"]);
    assert_eq!(q("provider=stripe").await, ["pi_1"]);
    assert_eq!(
        q("since=25m&provider=generic&status=succeeded").await,
        ["pay_0", "pay_1", "pay_2"]
    );
    assert_eq!(q("until=45m&status=succeeded").await, ["pay_5", "pay_6"]);

    for bad in [
        "status=lost",
        "since=yesterday",
        "transaction_id=caf%C3%A9",
        "limit=1000",
        "after=x",
    ] {
        let page = b.get_json(&format!("/console/payments?{bad}")).await;
        assert_eq!(page.status, 400, "{bad}: {}", page.text);
        assert!(page.json()["error"].is_string());
    }
    let html = b.get("/console/payments?transaction_id=pay_dead").await;
    assert!(
        html.text
            .contains("href=\"/console/payments/generic/pay_dead\""),
        "{}",
        html.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_payment_page_shows_major_units_its_refunds_ledger_tokens_and_one_timeline() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    assert_eq!(
        app.deliver(&payment("pay_page", 10000)).await.result(),
        "processed"
    );
    let refund = json!({"transaction_id": "re_page", "payment_transaction_id": "pay_page",
        "amount": 2050, "currency": "EUR", "event_type": "refund.succeeded"});
    assert_eq!(app.deliver(&refund).await.result(), "processed");
    let mut b = Browser::new(&app.admin);
    b.sign_in(&files.viewer).await;

    let v = b
        .get_json("/console/payments/generic/pay_page")
        .await
        .json();
    assert_eq!(v["row"]["amount"], "100.00");
    assert_eq!(v["row"]["amount_out"], "20.50");
    assert_eq!(v["children"][0]["transaction_id"], "re_page");
    let effects: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["effect"].as_str().unwrap())
        .collect();
    assert_eq!(effects, ["credit", "debit"]);
    let ledger: Vec<&Value> = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["what"] == "ledger")
        .collect();
    assert_eq!(ledger.len(), 2);
    assert!(
        ledger[0]["token"].as_i64().unwrap() > 0,
        "the token that wrote it"
    );
    assert_eq!(ledger[1]["out_so_far"], "20.50 EUR of 100.00 EUR");
    let whats: Vec<&str> = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["what"].as_str().unwrap())
        .collect();
    assert_eq!(whats.first(), Some(&"created"), "{whats:?}");
    assert!(v["bodies"].is_null(), "a viewer gets no stored body");

    let page = b.get("/console/payments/generic/pay_page").await;
    assert!(page.text.contains("100.00 EUR"), "{}", page.text);
    assert!(
        !page.text.contains("10000 EUR"),
        "never minor units as if major"
    );
    assert!(
        page.text
            .contains("href=\"/console/payments/generic/re_page\""),
        "a link to the refund"
    );
    let child = b.get("/console/payments/generic/re_page").await;
    assert!(
        child
            .text
            .contains("href=\"/console/payments/generic/pay_page\""),
        "and back to its payment"
    );
    assert_eq!(b.get("/console/payments/generic/nope").await.status, 404);
}

/// A chargeback the merchant won comes back as a reinstatement: its row is
/// `failed` in the table (the withdrawal undone), which the console must not
/// show as an orange "failed" (a lost chargeback to a payments reader). The
/// row, its ledger entry and the payment's own lines share a second: their
/// times show milliseconds, so their order reads as what it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reinstated_dispute_reads_reinstated_never_failed_and_lines_sharing_a_second_show_milliseconds(
) {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    assert_eq!(
        app.deliver(&payment("pay_won", 10000)).await.result(),
        "processed"
    );
    for event_type in ["dispute.funds_withdrawn", "dispute.funds_reinstated"] {
        let dispute = json!({"transaction_id": "dp_won", "payment_transaction_id": "pay_won",
            "amount": 10000, "currency": "EUR", "event_type": event_type});
        assert_eq!(
            app.deliver(&dispute).await.result(),
            "processed",
            "{event_type}"
        );
    }
    let mut b = Browser::new(&app.admin);
    b.sign_in(&files.viewer).await;
    for path in [
        "/console/payments/generic/dp_won",
        "/console/payments/generic/pay_won",
        "/console/payments?transaction_id=dp_won",
    ] {
        let page = b.get(path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(
            page.text
                .contains("<span class=\"badge s-reinstated\">reinstated</span>"),
            "{path}: {}",
            page.text
        );
        assert!(!page.text.contains("s-failed"), "{path}: {}", page.text);
    }
    let page = b.get("/console/payments/generic/dp_won").await;
    assert!(page.text.contains("dp_won is reinstated"), "{}", page.text);
    // The dispute's row and its ledger entry are written by one transaction:
    // one timestamp, so they share a second whatever the clock.
    let with_ms = |text: &str| {
        text.split("<span class=\"when\">")
            .skip(1)
            .filter_map(|rest| rest.split('<').next())
            .filter(|when| {
                let seconds = when.trim_end_matches(" UTC");
                seconds.len() == "2026-01-01 00:00:00.000".len()
                    && seconds.as_bytes()[19] == b'.'
                    && seconds[20..].bytes().all(|b| b.is_ascii_digit())
            })
            .count()
    };
    assert!(with_ms(&page.text) >= 2, "{}", page.text);
    let v = b.get_json("/console/payments/generic/dp_won").await.json();
    assert_eq!(
        v["row"]["status"], "failed",
        "the JSON keeps the stored status"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_value_is_html_escaped_and_stored_bodies_are_shown_to_operators_only() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.inbox_config(0))).await;
    let tx = "<script>alert('x')</script>&\"";
    let mut p = payment(tx, 500);
    p["note"] = json!("<img src=x onerror=alert(1)>");
    assert_eq!(app.deliver(&p).await.result(), "accepted");
    let path = format!(
        "/console/payments/generic/{}",
        fencehook::console::model::encode_segment(tx)
    );
    let mut viewer = Browser::new(&app.admin);
    viewer.sign_in(&files.viewer).await;
    let mut op = Browser::new(&app.admin);
    op.sign_in(&files.operator).await;

    let seen = viewer.get(&path).await;
    assert_eq!(seen.status, 200, "{}", seen.text);
    assert!(
        seen.text
            .contains("&lt;script&gt;alert('x')&lt;/script&gt;&amp;&quot;"),
        "{}",
        seen.text
    );
    assert!(!seen.text.contains("<script>"));
    assert!(
        !seen.text.contains("Stored bodies"),
        "no raw body for a viewer"
    );
    assert!(viewer.get_json(&path).await.json()["bodies"].is_null());

    let operator = op.get(&path).await;
    assert!(operator.text.contains("Stored bodies"));
    assert!(
        operator.text.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "the body, escaped"
    );
    assert!(!operator.text.contains("<img"));
    let bodies = op.get_json(&path).await.json()["bodies"].clone();
    assert!(
        bodies[0][1].as_str().unwrap().contains("onerror"),
        "{bodies}"
    );
    for page in [&seen, &operator] {
        assert!(
            !page.text.contains(crate::helpers::SECRET) && !page.text.contains(&files.operator)
        );
    }
    let search = viewer
        .get("/console/payments?transaction_id=%3Cscript")
        .await;
    assert!(search.text.contains("&lt;script&gt;") && !search.text.contains("<script>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_deliveries_are_listed_with_provider_reason_and_peer_but_never_body_or_signature() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    let body = json!({"transaction_id": "tx_refused", "amount": 100, "currency": "EUR",
        "event_type": "payment.succeeded", "marker": "BODY-MARKER-7731"})
    .to_string();
    let forged = app
        .post_signed(
            "generic",
            body.as_bytes(),
            crate::helpers::now(),
            "whsec_d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldA==",
        )
        .await;
    assert_eq!(forged.status, 401);
    let bad = app.deliver(&json!({"transaction_id": "tx_bad", "amount": "10", "currency": "EUR", "event_type": "payment.succeeded"})).await;
    assert_eq!(bad.status, 400);
    let mut b = Browser::new(&app.admin);
    b.sign_in(&files.viewer).await;

    let v = b.get_json("/console/refusals").await.json();
    let list = v["refusals"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{v}");
    assert_eq!(
        (list[0]["result"].as_str(), list[0]["status"].as_u64()),
        (Some("invalid_payload"), Some(400))
    );
    assert_eq!(
        (list[1]["result"].as_str(), list[1]["status"].as_u64()),
        (Some("unauthorized"), Some(401))
    );
    for r in list {
        assert_eq!(r["provider"], "generic");
        assert_eq!(r["peer"], "127.0.0.1");
        assert!(r["reason"].is_string(), "what failed: {r}");
        assert!(r["at"].as_i64().unwrap() > 0);
    }
    let html = b.get("/console/refusals").await.text;
    assert!(
        !html.contains("BODY-MARKER") && !v.to_string().contains("BODY-MARKER"),
        "never the body"
    );
    assert!(
        !html.contains("v1,") && !v.to_string().contains("v1,"),
        "never a signature"
    );
    let overview = b.get_json("/console").await.json();
    assert_eq!(overview["refusals_kept"], 2);
    let answered: u64 = overview["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["count"].as_u64().unwrap())
        .sum();
    assert_eq!(answered, 2, "{overview}");
}

/// The overview's figures are this instance's metrics: what `/metrics`
/// says of refused refunds, over-returned payments and leases held, the
/// overview says too (read from the metric handles, not from the exposition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_what_this_instances_metrics_count_of_refused_refunds_and_over_returned_payments(
) {
    use crate::helpers::money::{event, send};
    use fencehook::metrics::{
        FENCE_REJECTED_TOTAL, LEASES_HELD, PAYMENTS_OVER_RETURNED_TOTAL, REFUND_REJECTED_TOTAL,
    };
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    send(&app, &event("payment.succeeded", "pay_fig", 1000, None)).await;
    let refund = event("refund.succeeded", "re_fig", 1000, Some("pay_fig"));
    assert_eq!(send(&app, &refund).await, (200, "processed".into()));
    let dispute = event("dispute.funds_withdrawn", "dp_fig", 1000, Some("pay_fig"));
    assert_eq!(send(&app, &dispute).await, (200, "processed".into()));
    for tx in ["re_fig_2", "re_fig_3"] {
        let more = event("refund.succeeded", tx, 1, Some("pay_fig"));
        assert_eq!(send(&app, &more).await, (422, "refund_rejected".into()));
    }
    let mut b = Browser::new(&app.admin);
    b.sign_in(&files.viewer).await;

    let overview = b.get_json("/console").await.json();
    let rejections: Vec<(String, f64)> =
        serde_json::from_value(overview["refund_rejections"].clone()).unwrap();
    let exceeds = rejections.iter().find(|(r, _)| r == "exceeds_payment");
    assert_eq!(exceeds.map(|(_, n)| *n), Some(2.0), "{overview}");
    for (reason, n) in &rejections {
        let counted = app.metric(REFUND_REJECTED_TOTAL, &[("reason", reason)]);
        assert_eq!(*n, counted, "{reason}");
    }
    assert_eq!(overview["over_returned"], 1.0, "{overview}");
    assert_eq!(app.metric(PAYMENTS_OVER_RETURNED_TOTAL, &[]), 1.0);
    assert_eq!(overview["leases_held"], app.metric(LEASES_HELD, &[]));
    assert_eq!(
        overview["fence_rejected"],
        app.metric(FENCE_REJECTED_TOTAL, &[])
    );
    let html = b.get("/console").await.text;
    assert!(html.contains("exceeds_payment"), "{html}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_token_file_signs_its_sessions_out_once_sighup_rereads_it() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let server = ServeProcess::start(&[
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        (
            "FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE",
            files.path("viewer").display().to_string(),
        ),
        (
            "FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE",
            files.path("operator").display().to_string(),
        ),
    ])
    .await;
    let mut op = Browser::new(&server.admin);
    op.sign_in(&files.operator).await;
    let mut viewer = Browser::new(&server.admin);
    viewer.sign_in(&files.viewer).await;
    assert_eq!(op.get("/console").await.status, 200);

    // A file that fails the checks is not taken: the old token stays.
    files.write("operator", "too-short");
    server.signal("HUP");
    wait_for("the refusal logged", Duration::from_secs(10), || async {
        !server
            .log_lines("console token file is not usable")
            .is_empty()
    })
    .await;
    assert_eq!(
        op.get("/console").await.status,
        200,
        "the old token is still in force"
    );

    let rotated = format!("rotated-{}", uuid::Uuid::new_v4().simple());
    files.write("operator", &rotated);
    server.signal("HUP");
    wait_for(
        "the old operator session signed out",
        Duration::from_secs(10),
        || async { op.get("/console").await.status == 303 },
    )
    .await;
    assert_eq!(
        viewer.get("/console").await.status,
        200,
        "the viewer's token did not change"
    );
    let old = Browser::new(&server.admin)
        .post("/console/login", &[("token", &files.operator)], &[])
        .await;
    assert_eq!(old.status, 401);
    Browser::new(&server.admin).sign_in(&rotated).await;
}

/// How many of the console's indexes of `payments` are there and valid.
async fn console_indexes(ctx: &TestContext) -> i64 {
    ctx.count(
        "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
          WHERE c.relname IN ('payments_console_status_idx', 'payments_console_transaction_idx')
            AND i.indisvalid",
    )
    .await
}

/// An instance without a console writes payments without the console's two
/// index entries: a new database has no such index, an instance without a
/// console leaves it so, and one that serves the console builds both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_indexes_are_built_by_an_instance_that_serves_the_console() {
    let ctx = TestContext::new().await;
    assert_eq!(console_indexes(&ctx).await, 0, "none on a new database");
    let plain = ctx.spawn(ctx.config()).await;
    assert_eq!(
        plain.deliver(&payment("tx_plain", 1000)).await.result(),
        "processed"
    );
    assert_eq!(
        console_indexes(&ctx).await,
        0,
        "an instance without a console builds none"
    );
    let files = TokenFiles::new();
    let _console = ctx.spawn(files.enable(ctx.config())).await;
    wait_for(
        "both console indexes built",
        Duration::from_secs(30),
        || async { console_indexes(&ctx).await == 2 },
    )
    .await;
}

/// A database with payments keeps the console's indexes through the
/// migration that leaves them out of new ones (a console may read them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_with_payments_keeps_the_console_indexes_through_the_migration() {
    let ctx = TestContext::at_version(17).await;
    assert_eq!(console_indexes(&ctx).await, 2);
    let app = ctx.spawn(ctx.config()).await;
    assert_eq!(
        app.deliver(&payment("tx_kept", 1000)).await.result(),
        "processed"
    );
    app.stop().await;
    ctx.migrate_to_latest().await;
    assert_eq!(console_indexes(&ctx).await, 2, "kept");
}

/// Boxed query parameters, for one EXPLAIN each.
type Params = Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>>;

/// A million payments: the console's searches stay index scans that read
/// about a page of rows. Built with one INSERT … generate_series (about ten
/// seconds here), then ANALYZE, as a production table would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_million_payments_every_search_is_an_index_scan_reading_about_a_page() {
    use fencehook::store::console::{SEARCH_BY_PREFIX, SEARCH_BY_TIME};
    let ctx = TestContext::new().await;
    let db = ctx.db().await;
    db.batch_execute(
        "SET statement_timeout = 0;
         SET synchronous_commit = off;
         -- A bulk load, as a restore would do it: the inbox's wake-up trigger
         -- (nothing waits here) off, V12's indexes built after the rows.
         ALTER TABLE payments DISABLE TRIGGER payments_wake_waiting;
         DROP INDEX IF EXISTS payments_console_status_idx, payments_console_transaction_idx;
         INSERT INTO payments (provider, transaction_id, kind, event_type, amount_minor, currency,
                               fingerprint, status, fence, created_at, updated_at)
         SELECT CASE WHEN i % 50 = 0 THEN 'stripe' ELSE 'generic' END, 'tx_' || i, 'payment',
                'payment.succeeded', 1000 + i % 7, 'EUR', 'fp',
                CASE WHEN i % 1000 = 0 THEN 'dead' WHEN i % 97 = 0 THEN 'failed' ELSE 'succeeded' END, 1,
                now() - (1000000 - i) * interval '1 second', now() - (1000000 - i) * interval '1 second'
           FROM generate_series(1, 1000000) i;
         SET maintenance_work_mem = '256MB';
         CREATE INDEX payments_console_status_idx ON payments (provider, status, created_at, id);
         CREATE INDEX payments_console_transaction_idx ON payments (transaction_id text_pattern_ops);
         ALTER TABLE payments ENABLE TRIGGER payments_wake_waiting;
         ANALYZE payments;",
    )
    .await
    .unwrap();
    let none: Option<String> = None;
    let no_time: Option<time::OffsetDateTime> = None;
    let no_id: Option<i64> = None;
    let all: Vec<String> = ["queued", "processing", "succeeded", "failed", "dead"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let dead = vec!["dead".to_owned()];
    let since = Some(time::OffsetDateTime::now_utc() - time::Duration::hours(2));
    let stripe = Some("stripe".to_owned());
    let limit = 50i64;
    let explain = |sql: &'static str, params: Params| async move {
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            params.iter().map(|p| p.as_ref() as _).collect();
        let row = db
            .query_one(
                &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}"),
                &refs,
            )
            .await
            .unwrap();
        let plan: Value = row.get(0);
        plan
    };
    let searches: Vec<(&str, &str, Params)> = vec![
        (
            "newest first",
            SEARCH_BY_TIME,
            vec![
                Box::new(none.clone()),
                Box::new(all.clone()),
                Box::new(no_time),
                Box::new(no_time),
                Box::new(no_time),
                Box::new(no_id),
                Box::new(limit),
            ],
        ),
        (
            "dead",
            SEARCH_BY_TIME,
            vec![
                Box::new(none.clone()),
                Box::new(dead.clone()),
                Box::new(no_time),
                Box::new(no_time),
                Box::new(no_time),
                Box::new(no_id),
                Box::new(limit),
            ],
        ),
        (
            "a rare provider, since",
            SEARCH_BY_TIME,
            vec![
                Box::new(stripe.clone()),
                Box::new(all.clone()),
                Box::new(since),
                Box::new(no_time),
                Box::new(no_time),
                Box::new(no_id),
                Box::new(limit),
            ],
        ),
        (
            "a prefix",
            SEARCH_BY_PREFIX,
            vec![
                Box::new("tx_99999".to_owned()),
                Box::new("tx_9999:".to_owned()),
                Box::new(none.clone()),
                Box::new(all.clone()),
                Box::new(no_time),
                Box::new(no_time),
                Box::new(no_time),
                Box::new(no_id),
                Box::new(limit),
            ],
        ),
        (
            "one id",
            SEARCH_BY_PREFIX,
            vec![
                Box::new("tx_123456".to_owned()),
                Box::new("tx_123457".to_owned()),
                Box::new(none.clone()),
                Box::new(all.clone()),
                Box::new(no_time),
                Box::new(no_time),
                Box::new(no_time),
                Box::new(no_id),
                Box::new(limit),
            ],
        ),
    ];
    for (what, sql, params) in searches {
        let plan = explain(sql, params).await;
        let text = plan.to_string();
        assert!(
            !text.contains("\"Seq Scan\""),
            "{what}: a sequential scan in {plan:#}"
        );
        // Rows the plan's scans of payments read, in all.
        let mut read = 0.0;
        let mut stack = vec![plan[0]["Plan"].clone()];
        while let Some(node) = stack.pop() {
            if node["Relation Name"] == "payments" {
                read +=
                    node["Actual Rows"].as_f64().unwrap() * node["Actual Loops"].as_f64().unwrap();
            }
            stack.extend(node["Plans"].as_array().cloned().unwrap_or_default());
        }
        assert!(
            read <= 2000.0,
            "{what}: read {read} rows of payments: {plan:#}"
        );
        eprintln!(
            "{what}: {read} payments rows read, {} ms",
            plan[0]["Execution Time"]
        );
    }
}

/// `make run CONSOLE=1`'s tokens (scripts/dev-console.sh): two fresh
/// tokens of at least 32 bytes in private files under a gitignored
/// directory, the exports that turn the console on, the URL and how to sign
/// in; a real `fencehook serve` started with the exports serves the console
/// to the printed token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_run_console_writes_private_throwaway_tokens_and_prints_how_to_sign_in() {
    use std::os::unix::fs::PermissionsExt;
    let ctx = TestContext::new().await;
    let dir = std::env::temp_dir().join(format!("fencehook-devconsole-{}", &ctx.prefix[7..]));
    let run = || {
        let out = std::process::Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/dev-console.sh"
        ))
        .env("FENCEHOOK_DEV_CONSOLE_DIR", &dir)
        .env("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:9090")
        .output()
        .unwrap();
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (exports, said) = run();
    let viewer = dir.join("viewer.token");
    let operator = dir.join("operator.token");
    assert_eq!(
        exports,
        format!(
            "export FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE={}\nexport FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE={}\n",
            viewer.display(),
            operator.display()
        )
    );
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    let (v, o) = (read(&viewer), read(&operator));
    assert!(v.len() >= 32 && o.len() >= 32 && v != o, "{v} {o}");
    for file in [&viewer, &operator] {
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
    assert!(
        said.contains("console on http://127.0.0.1:9090/console")
            && said.contains(&format!("operator token: {o}"))
            && said.contains(&format!("viewer:           {v}")),
        "{said}"
    );
    let script = include_str!("../../scripts/dev-console.sh");
    assert!(
        script.contains("dir=${FENCEHOOK_DEV_CONSOLE_DIR:-$PWD/target/dev-console}")
            && include_str!("../../.gitignore")
                .lines()
                .any(|l| l == "/target"),
        "by default under target/, which git ignores"
    );
    let (_, again) = run();
    assert_ne!(read(&operator), o, "a new token every run");
    assert!(again.contains(&read(&operator)));

    let p = ServeProcess::start(&[
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        (
            "FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE",
            viewer.display().to_string(),
        ),
        (
            "FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE",
            operator.display().to_string(),
        ),
    ])
    .await;
    let mut browser = Browser::new(&p.admin);
    browser.sign_in(read(&operator).trim()).await;
    let overview = browser.get("/console").await;
    assert_eq!(overview.status, 200, "{}", overview.text);
    drop(p);
    std::fs::remove_dir_all(&dir).unwrap();
}
