//! What SREs rely on: every metric the dashboard and the alert rules use is
//! one a running instance emits; check-config names each bad setting.

use std::time::Duration;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::metrics::exposed;
use crate::helpers::{payment, TestContext};

/// Metric names (`fencehook_…`) mentioned in a text.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("fencehook_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names.sort();
    names.dedup();
    names
}

fn dashboard_exprs() -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/grafana-dashboard.json"
    ))
    .unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut exprs = String::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push_str(target["expr"].as_str().expect("every target has an expr"));
            exprs.push('\n');
        }
    }
    exprs
}

fn alert_exprs() -> String {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/alerts.yml")).unwrap();
    let docs = yaml_rust2::YamlLoader::load_from_str(&text).expect("alert rules are YAML");
    let mut exprs = String::new();
    for group in docs[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            assert!(rule["alert"].as_str().is_some(), "every rule is an alert");
            exprs.push_str(rule["expr"].as_str().expect("every rule has an expr"));
            exprs.push('\n');
        }
    }
    exprs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_metric_in_the_spec_dashboard_and_alerts_is_emitted_after_traffic() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    // Held longer than a renew interval, so renewals (and their margin) are recorded.
    downstream.set_delay(Duration::from_millis(500));
    let mut cfg = ctx.config();
    cfg.lease.ttl = Duration::from_millis(600);
    cfg.lease.lease_timeout = Duration::from_millis(150);
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    assert_eq!(
        app.deliver(&payment("tx_ops", 100)).await.result(),
        "processed"
    );
    assert_eq!(
        app.deliver(&payment("tx_ops", 100)).await.result(),
        "duplicate"
    );
    let (status, health) = app.get_admin("/healthz").await;
    assert_eq!(status, 200, "{health}");
    let (status, ready) = app.get_admin("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["postgres"], "ok");
    assert_eq!(ready["lease_backend"], "ok");

    let (status, exposition) = app.get_admin("/metrics").await;
    assert_eq!(status, 200);
    let spec = [
        "fencehook_webhooks_total",
        "fencehook_webhook_duration_seconds_bucket",
        "fencehook_lease_acquire_total",
        "fencehook_lease_renew_total",
        "fencehook_lease_lost_total",
        "fencehook_lease_held_seconds_bucket",
        "fencehook_fence_rejected_total",
        "fencehook_fence_resync_total",
    ];
    for name in spec {
        assert!(
            exposed(&exposition, name),
            "documented metric {name} missing from /metrics"
        );
    }
    let used = metric_names(&(dashboard_exprs() + &alert_exprs()));
    assert!(
        used.len() >= 10,
        "the dashboard and rules use the metrics: {used:?}"
    );
    for name in used {
        assert!(
            exposed(&exposition, &name),
            "{name} is used by deploy/ but not emitted:\n{exposition}"
        );
    }
    for line in exposition
        .lines()
        .filter(|l| l.starts_with("# HELP fencehook_"))
    {
        assert!(
            line.split_whitespace().count() > 3,
            "described with a help text: {line}"
        );
    }
}

/// Runs `fencehook check-config` with only these settings (a generic secret
/// and a database URL unless they say otherwise).
fn check_config(env: &[(&str, &str)]) -> (i32, String, String) {
    let mut all = vec![
        ("FENCEHOOK_GENERIC_SECRET", crate::helpers::SECRET),
        (
            "DATABASE_URL",
            "postgres://fencehook_app@127.0.0.1:5432/fencehook",
        ),
    ];
    all.extend_from_slice(env);
    bare(&["check-config"], &all)
}

/// `fencehook <args>` with only `env` for settings (none from the test's
/// environment; a later pair wins over an earlier one of the same name).
fn bare(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("FENCEHOOK_") || k == "DATABASE_URL" || k == "REDIS_URL" {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn check_config_hides_the_downstream_password_and_warns_about_risky_settings() {
    let (code, out, err) = check_config(&[(
        "FENCEHOOK_DOWNSTREAM_URL",
        "http://orders:hunter2@127.0.0.1:8081/payments?api_key=k3y",
    )]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("http://127.0.0.1:8081/payments"), "{out}");
    assert!(!out.contains("hunter2") && !out.contains("k3y"), "{out}");
    assert!(err.is_empty(), "nothing to warn about: {err}");

    let dev = ("FENCEHOOK_GENERIC_SECRET", fencehook::providers::DEV_SECRET);
    let (code, _, err) = check_config(&[dev]);
    assert_eq!(
        code, 2,
        "the development secret is refused outside development"
    );
    assert!(
        err.contains("FENCEHOOK_GENERIC_SECRET: provider `generic`: secrets: ")
            && err.contains("DEVELOPMENT secret")
            && err.lines().count() == 1,
        "{err}"
    );
    let (code, _, err) = check_config(&[dev, ("FENCEHOOK_ALLOW_PUBLISHED_SECRETS", "true")]);
    assert_eq!(
        code, 0,
        "the development secret is allowed for development, loudly"
    );
    assert!(
        err.contains("warning") && err.contains("DEVELOPMENT secret"),
        "{err}"
    );
    // Stripe's shortest placeholder, accepted silently before.
    let dir = std::env::temp_dir().join(format!("fencehook-short-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    std::fs::write(
        &file,
        "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"whsec_a\"]\n",
    )
    .unwrap();
    let (code, _, err) = check_config(&[("FENCEHOOK_PROVIDERS", &file.display().to_string())]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("provider `stripe`: secrets: ") && err.contains("shorter than"),
        "{err}"
    );
    let (code, _, err) = check_config(&[("FENCEHOOK_ADMIN_LISTEN", "0.0.0.0:9090")]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: FENCEHOOK_ADMIN_LISTEN 0.0.0.0:9090 is not a loopback address"),
        "{err}"
    );

    let (code, _, err) = check_config(&[("FENCEHOOK_REDIS_TIMEOUT_MS", "100")]);
    assert_eq!(code, 0);
    assert!(
        err.contains("renamed to FENCEHOOK_LEASE_TIMEOUT_MS"),
        "{err}"
    );
}

#[test]
fn check_config_lists_every_error_of_the_providers_file_in_one_run_each_naming_provider_and_field()
{
    let dir = std::env::temp_dir().join(format!(
        "fencehook-many-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    std::fs::write(
        &file,
        r#"
[providers.alipay]
scheme = "alipay"
app_id = "2021000000000000"
public_keys = ["missing.pem"]

[providers.paypal]
scheme = "paypal"
webhook_id = "WH-1"
webhook = "WH-2"
max_age_sec = 60

[providers.stripe]
scheme = "stripe"
secrets = ["whsec_0123456789abcdef0123456789abcdef"]
tolerance = 60
"#,
    )
    .unwrap();
    let (code, _, err) = check_config(&[("FENCEHOOK_PROVIDERS", &file.display().to_string())]);
    assert_eq!(code, 2, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    for (provider, field, says) in [
        ("alipay", "public_keys", "cannot read"),
        ("paypal", "webhook", "not a setting of scheme paypal"),
        ("paypal", "max_age_sec", "did you mean max_age_secs?"),
        ("stripe", "tolerance", "did you mean tolerance_secs?"),
    ] {
        let named = format!("provider `{provider}`: {field}: ");
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.contains("FENCEHOOK_PROVIDERS")
                    && l.contains(&named)
                    && l.contains(says))
                .count(),
            1,
            "one line for {named}{says}: {err}"
        );
    }
    assert_eq!(lines.len(), 4, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_config_rejects_each_bad_setting_with_one_line_naming_it() {
    let (code, out, _) = check_config(&[]);
    assert_eq!(code, 0, "defaults are valid: {out}");
    assert!(out.starts_with("configuration ok"), "{out}");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("FENCEHOOK_LISTEN", "not-an-address")],
            "FENCEHOOK_LISTEN",
        ),
        (
            &[("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:8080")],
            "FENCEHOOK_ADMIN_LISTEN",
        ),
        (&[("DATABASE_URL", "not a url at all")], "DATABASE_URL"),
        (&[("REDIS_URL", "http://127.0.0.1:6379")], "REDIS_URL"),
        (
            &[("FENCEHOOK_LEASE_TTL_MS", "100")],
            "FENCEHOOK_LEASE_TTL_MS",
        ),
        (
            &[
                ("FENCEHOOK_LEASE_TTL_MS", "1200"),
                ("FENCEHOOK_LEASE_TIMEOUT_MS", "400"),
            ],
            "FENCEHOOK_LEASE_TIMEOUT_MS",
        ),
        (
            &[("FENCEHOOK_LEASE_MAX_MS", "1000")],
            "FENCEHOOK_LEASE_MAX_MS",
        ),
        (
            &[
                ("FENCEHOOK_DOWNSTREAM_URL", "http://127.0.0.1:9/x"),
                ("FENCEHOOK_DOWNSTREAM_TIMEOUT_MS", "60000"),
            ],
            "FENCEHOOK_LEASE_MAX_MS",
        ),
        (
            &[("FENCEHOOK_DOWNSTREAM_URL", "ftp://example/x")],
            "FENCEHOOK_DOWNSTREAM_URL",
        ),
        (
            &[("FENCEHOOK_FENCE_KEY_TTL_SECS", "30")],
            "FENCEHOOK_FENCE_KEY_TTL_SECS",
        ),
        (
            &[("FENCEHOOK_REDIS_KEY_PREFIX", "a{b}")],
            "FENCEHOOK_REDIS_KEY_PREFIX",
        ),
        (&[("FENCEHOOK_DB_POOL_SIZE", "0")], "FENCEHOOK_DB_POOL_SIZE"),
        (
            &[
                ("FENCEHOOK_DB_POOL_SIZE", "64"),
                ("FENCEHOOK_MAX_INFLIGHT", "8"),
            ],
            "FENCEHOOK_DB_POOL_SIZE",
        ),
        (
            &[("FENCEHOOK_DB_STATEMENT_TIMEOUT_MS", "0")],
            "FENCEHOOK_DB_STATEMENT_TIMEOUT_MS",
        ),
        (
            &[("FENCEHOOK_MAX_BODY_BYTES", "10")],
            "FENCEHOOK_MAX_BODY_BYTES",
        ),
        (
            &[("FENCEHOOK_BODY_TIMEOUT_MS", "0")],
            "FENCEHOOK_BODY_TIMEOUT_MS",
        ),
        (
            &[("FENCEHOOK_BODY_TIMEOUT_MS", "30001")],
            "FENCEHOOK_BODY_TIMEOUT_MS",
        ),
        (
            &[("FENCEHOOK_MAX_CONNECTIONS", "0")],
            "FENCEHOOK_MAX_CONNECTIONS",
        ),
        (
            &[("FENCEHOOK_GENERIC_SECRET", "plaintext")],
            "FENCEHOOK_GENERIC_SECRET",
        ),
        (
            &[("FENCEHOOK_PROVIDERS", "/nonexistent/providers.toml")],
            "FENCEHOOK_PROVIDERS",
        ),
        (
            &[("FENCEHOOK_LEASE_BACKEND", "mysql")],
            "FENCEHOOK_LEASE_BACKEND",
        ),
        (
            &[("FENCEHOOK_LEASE_TTL_MS", "five seconds")],
            "FENCEHOOK_LEASE_TTL_MS",
        ),
        (
            &[("FENCEHOOK_MIGRATE_ON_START", "maybe")],
            "FENCEHOOK_MIGRATE_ON_START",
        ),
    ];
    for (env, setting) in cases {
        let (code, _, err) = check_config(env);
        assert_eq!(code, 2, "{env:?} must be refused; stderr: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line for {env:?}: {err}");
        assert!(
            lines[0].contains(setting),
            "{env:?}: the line names {setting}: {err}"
        );
    }
    let (code, _, err) = check_config(&[("FENCEHOOK_LEASE_TLL_MS", "5000")]);
    assert_eq!(code, 0);
    assert!(
        err.contains("FENCEHOOK_LEASE_TLL_MS is not a setting and is ignored; did you mean FENCEHOOK_LEASE_TTL_MS?"),
        "typos are warned about: {err}"
    );
    let (code, _, err) = check_config(&[("DATABSE_URL", "postgres://elsewhere/db")]);
    assert_eq!(code, 0);
    assert!(
        err.contains("DATABSE_URL is not a setting and is ignored; did you mean DATABASE_URL?"),
        "near misses of any setting too: {err}"
    );
}

#[test]
fn check_config_names_every_bad_setting_in_one_run_one_line_each() {
    let (code, out, err) = check_config(&[
        ("FENCEHOOK_LISTEN", "not-an-address"),
        (
            "DATABASE_URL",
            "postgres://app:p@ss@127.0.0.1:5432/fencehook",
        ),
        ("FENCEHOOK_LEASE_TTL_MS", "five seconds"),
        ("FENCEHOOK_MAX_BODY_BYTES", "10"),
        ("FENCEHOOK_RETRY_BASE_MS", "0"),
        ("FENCEHOOK_MIGRATE_ON_START", "maybe"),
        (
            "FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE",
            "/nonexistent/viewer.token",
        ),
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.is_empty(), "no `configuration ok`: {out}");
    let lines: Vec<&str> = err.lines().collect();
    let named = |setting: &str| {
        lines
            .iter()
            .filter(|l| l.starts_with(&format!("fencehook: invalid configuration: {setting}: ")))
            .count()
    };
    for setting in [
        "FENCEHOOK_LISTEN",
        "DATABASE_URL",
        "FENCEHOOK_LEASE_TTL_MS",
        "FENCEHOOK_MAX_BODY_BYTES",
        "FENCEHOOK_RETRY_BASE_MS",
        "FENCEHOOK_MIGRATE_ON_START",
        "FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE",
    ] {
        assert_eq!(named(setting), 1, "{setting} named once:\n{err}");
    }
    assert_eq!(lines.len(), 7, "one line each, nothing else:\n{err}");
    assert!(!err.contains("p@ss"), "no password: {err}");
}

#[test]
fn check_config_reads_the_settings_file_the_units_read() {
    let dir = std::env::temp_dir().join(format!(
        "fencehook-envfile-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fencehook.env");
    std::fs::write(
        &file,
        format!(
            "# as systemd's EnvironmentFile= reads it\n\
             DATABASE_URL='postgres://fencehook_app:s3cret@db.internal:5432/fencehook?sslmode=disable'\n\
             ; another comment\n\
             FENCEHOOK_LEASE_TTL_MS=\"3000\"\n\
             FENCEHOOK_GENERIC_SECRET={}\n",
            crate::helpers::SECRET
        ),
    )
    .unwrap();
    let file_arg = file.display().to_string();
    let run = |extra: &[(&str, &str)]| bare(&["check-config", "--env-file", &file_arg], extra);
    let (code, stdout, stderr) = run(&[("FENCEHOOK_LEASE_TTL_MS", "9000")]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("ttl 3000 ms"),
        "the file's value wins, as in the unit: {stdout}"
    );

    std::fs::write(&file, "DATABASE_URL\n").unwrap();
    let (code, _, stderr) = run(&[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--env-file") && stderr.contains(":1: not NAME=value"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// At 3 a.m. "none matched" after a typo reads as "nothing is dead".
#[tokio::test(flavor = "multi_thread")]
async fn events_takes_only_the_real_statuses_spelled_exactly() {
    let ctx = TestContext::new().await;
    let db = [("DATABASE_URL", ctx.database_url.as_str())];
    for typo in ["Dead", "deadd", "failed"] {
        let (code, out, err) = bare(&["events", "--status", typo], &db);
        assert_eq!(code, 2, "{typo}: {out}{err}");
        assert!(out.is_empty(), "{typo}: nothing listed: {out}");
        assert!(
            err.contains(&format!("--status: invalid value `{typo}`"))
                && err.contains("(one of: queued, processing, done, dead)")
                && err.lines().count() == 1,
            "{typo}: {err}"
        );
    }
    let (_, _, err) = bare(&["events", "--status", "deadd"], &db);
    assert!(err.contains("did you mean `dead`?"), "{err}");
    let (code, out, err) = bare(&["events", "--status", "dead"], &db);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("events: none matched"), "{out}");
}

#[test]
fn replay_says_what_its_provider_flag_does() {
    let (code, help, _) = bare(&["replay", "--help"], &[]);
    assert_eq!(code, 0);
    let provider = help
        .split("--provider")
        .nth(1)
        .and_then(|rest| rest.split("\n      --").next())
        .unwrap_or_else(|| panic!("{help}"));
    let provider = provider.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        provider.contains("with --transaction-id, the one of that transaction")
            && provider.contains("with --dead, replay only this provider's dead events")
            && provider.contains("Alone it replays nothing"),
        "{provider}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_left_processing_past_the_max_hold_is_counted_as_stuck() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_status(500);
    let mut cfg = ctx.config();
    cfg.lease.ttl = Duration::from_millis(600);
    cfg.lease.lease_timeout = Duration::from_millis(150);
    cfg.lease.max_hold = Duration::from_secs(2);
    cfg.downstream_timeout = Duration::from_millis(100);
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    let stuck = || app.metric("fencehook_payments_stuck_processing", &[]);
    assert_eq!(app.deliver(&payment("tx_stuck", 100)).await.status, 503);
    app.state.health.count_stuck().await;
    assert_eq!(stuck(), 0.0, "a fresh claim may still have a holder");
    crate::helpers::wait_for(
        "past the max hold nobody works on it",
        Duration::from_secs(10),
        || async {
            app.state.health.count_stuck().await;
            stuck() == 1.0
        },
    )
    .await;
    downstream.set_status(200);
    assert_eq!(
        app.deliver(&payment("tx_stuck", 100)).await.result(),
        "processed"
    );
    app.state.health.count_stuck().await;
    assert_eq!(stuck(), 0.0, "resumed and finalised");
}
