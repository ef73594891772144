//! Start-up that tells the truth, and secrets rotated without a restart:
//! the start log names the database and Redis (never a password), a backend
//! that does not answer is warned about at once, a missing database is an
//! error (not a new empty one), a role with only DML rights can serve, and
//! SIGHUP re-reads the providers file.

use std::time::Duration;

use crate::helpers::process::{ServeProcess, WorkProcess};
use crate::helpers::{closed_port, payment, wait_for, TestContext, SECRET};

fn env(ctx: &TestContext) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_start_log_names_the_database_and_redis_and_warns_when_redis_does_not_answer() {
    let ctx = TestContext::new().await;
    let port = closed_port().await;
    let mut e = env(&ctx);
    e.retain(|(k, _)| *k != "REDIS_URL");
    e.push(("REDIS_URL", format!("redis://:hunter2@127.0.0.1:{port}/0")));
    let p = ServeProcess::start(&e).await;
    let logs = p.logs.lock().unwrap().join("\n");
    let starting = logs
        .lines()
        .find(|l| l.contains("fencehook starting"))
        .unwrap_or_else(|| panic!("{logs}"));
    assert!(
        starting.contains(&format!("127.0.0.1:5432/{}", ctx.db_name)),
        "{starting}"
    );
    assert!(
        starting.contains(&format!("127.0.0.1:{port}/0")),
        "{starting}"
    );
    assert!(!logs.contains("hunter2"), "no password in the log:\n{logs}");
    assert!(
        logs.contains("the lease backend does not answer at start"),
        "warned at once, before any delivery:\n{logs}"
    );
}

/// With `FENCEHOOK_LOG_FORMAT=json` a reader of the log (`jq`) gets JSON
/// from the first line: the warnings found before the log was set up (a
/// near miss of a setting's name, an unknown `FENCEHOOK_*`, a bad
/// `FENCEHOOK_LOG`) are log lines too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_json_logs_every_start_line_is_json_the_early_warnings_too() {
    let ctx = TestContext::new().await;
    let mut e = env(&ctx);
    e.push(("DATABSE_URL", "postgres://elsewhere/db".to_owned()));
    e.push(("FENCEHOOK_NOT_A_SETTING", "1".to_owned()));
    e.push(("FENCEHOOK_LOG", "fencehook=loudest".to_owned()));
    let p = ServeProcess::start(&e).await;
    wait_for("the serving line kept", Duration::from_secs(10), || async {
        !p.log_lines("fencehook serving").is_empty()
    })
    .await;
    let lines = p.logs.lock().unwrap().clone();
    let not_json: Vec<&String> = lines
        .iter()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_err())
        .collect();
    assert!(not_json.is_empty(), "not JSON: {not_json:#?}");
    let warned = |text: &str| {
        lines.iter().any(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["level"] == "WARN" && v["message"].as_str().is_some_and(|m| m.contains(text))
        })
    };
    assert!(
        warned("DATABSE_URL is not a setting and is ignored; did you mean DATABASE_URL?"),
        "{lines:#?}"
    );
    assert!(
        warned("unknown setting FENCEHOOK_NOT_A_SETTING is ignored"),
        "{lines:#?}"
    );
    assert!(
        warned("FENCEHOOK_LOG `fencehook=loudest` is not a log filter"),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_that_does_not_exist_stops_the_start_and_is_not_created() {
    let ctx = TestContext::new().await;
    let missing = format!("{}_missing", ctx.db_name);
    let url = ctx.database_url.replace(&ctx.db_name, &missing);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"))
        .arg("serve")
        .env("DATABASE_URL", &url)
        .env("FENCEHOOK_GENERIC_SECRET", SECRET)
        .env("FENCEHOOK_LISTEN", "127.0.0.1:0")
        .env("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:0")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("database `{missing}` does not exist"))
            && err.contains("fencehook migrate --create-database"),
        "{err}"
    );
    let exists = ctx
        .count(&format!(
            "SELECT count(*) FROM pg_database WHERE datname = '{missing}'"
        ))
        .await;
    assert_eq!(exists, 0, "serve created no database");
}

/// `migrate` runs as the database's owner; `serve` needs only DML rights
/// once the schema is current: it runs no DDL at all then.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_role_with_only_dml_rights_can_serve_a_current_schema() {
    let ctx = TestContext::new().await;
    let role = format!("fh_dml_{}", &ctx.prefix[7..]);
    ctx.db()
        .await
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role};"
        ))
        .await
        .unwrap();
    let url = ctx
        .database_url
        .replacen("postgres@", &format!("{role}@"), 1);
    let mut e = env(&ctx);
    e.retain(|(k, _)| *k != "DATABASE_URL");
    e.push(("DATABASE_URL", url.clone()));
    e.push(("FENCEHOOK_MIGRATE_ON_START", "true".to_owned()));
    let p = ServeProcess::start(&e).await;
    let r = p.deliver(&payment("tx_dml", 100)).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    // The same role cannot migrate (no DDL rights): that is the owner's job.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"))
        .args(["migrate", "--database-url", &url])
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "migrate needs the owner's rights"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("permission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(p);
    ctx.db()
        .await
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role};"))
        .await
        .unwrap();
}

/// `fencehook <args>` with only `env` for settings, bounded: a command
/// that waits where it should have stopped fails the test instead of hanging it.
async fn bare(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.args(args).kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("FENCEHOOK_") || k == "DATABASE_URL" || k == "REDIS_URL" {
            cmd.env_remove(k);
        }
    }
    cmd.env("FENCEHOOK_GENERIC_SECRET", SECRET)
        .env("FENCEHOOK_LISTEN", "127.0.0.1:0")
        .env("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("`fencehook {args:?}` still runs after 60 s"))
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A misspelt variable (`DATABSE_URL`) once left a built-in URL in force:
/// the local superuser's `fencehook` database, served after a warning.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_database_url_serve_work_and_migrate_stop_naming_it() {
    for args in [&["serve"][..], &["work"], &["migrate"], &["audit"]] {
        let (code, err) = bare(
            args,
            &[("DATABSE_URL", "postgres://postgres@127.0.0.1:5432/x")],
        )
        .await;
        assert_eq!(code, Some(2), "{args:?}: {err}");
        let line = err
            .lines()
            .find(|l| l.contains("invalid configuration"))
            .unwrap_or_else(|| panic!("{args:?}: {err}"));
        assert!(
            line.contains("DATABASE_URL: is not set") && line.contains("no default database"),
            "{args:?}: {line}"
        );
    }
}

/// A raw `@` in the password made the password's tail a host, which never
/// answered: the start waited for it forever, as for an outage.
#[tokio::test(flavor = "multi_thread")]
async fn a_raw_at_or_slash_in_the_password_stops_the_start_saying_to_percent_encode() {
    for (url, encoded) in [
        (
            "postgres://fencehook_app:p@ss@127.0.0.1:5432/fencehook",
            "%40",
        ),
        (
            "postgres://fencehook_app:pa/ss@127.0.0.1:5432/fencehook",
            "%2F",
        ),
    ] {
        for command in ["serve", "work"] {
            let (code, err) = bare(&[command], &[("DATABASE_URL", url)]).await;
            assert_eq!(code, Some(2), "{command} {url}: {err}");
            assert!(
                err.contains("invalid configuration: DATABASE_URL: ")
                    && err.contains("percent-encode")
                    && err.contains(encoded),
                "{command} {url}: {err}"
            );
            assert!(!err.contains("ss@"), "no part of the password: {err}");
            assert!(!err.contains("waiting for it"), "not waited for: {err}");
        }
    }
}

/// The app role has no DDL rights: on a database nobody migrated, its start
/// says who must migrate rather than only "permission denied for schema public".
#[tokio::test(flavor = "multi_thread")]
async fn the_app_role_on_an_unmigrated_database_is_told_to_run_migrate_as_the_owner() {
    let ctx = TestContext::empty().await;
    let role = format!("fh_app_{}", &ctx.prefix[7..]);
    ctx.db()
        .await
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             REVOKE CREATE ON SCHEMA public FROM PUBLIC;
             GRANT CONNECT ON DATABASE \"{}\" TO {role};",
            ctx.db_name
        ))
        .await
        .unwrap();
    let url = ctx
        .database_url
        .replacen("postgres@", &format!("{role}@"), 1);
    let (code, err) = bare(
        &["serve"],
        &[
            ("DATABASE_URL", &url),
            ("REDIS_URL", &ctx.redis_url),
            ("FENCEHOOK_REDIS_KEY_PREFIX", &ctx.prefix),
        ],
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the role `{role}` may not create fencehook's tables"
        )) && err.contains("run `fencehook migrate` as the database's owner")
            && err.contains("permission denied"),
        "{err}"
    );
    let tables = ctx
        .count("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .await;
    assert_eq!(tables, 0, "nothing created");
    ctx.db()
        .await
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role};"))
        .await
        .unwrap();
}

/// SIGHUP re-reads the providers file: a new secret verifies without a
/// restart; a file that does not parse leaves the old providers in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_re_reads_the_providers_file_and_keeps_the_old_one_when_the_new_is_broken() {
    let ctx = TestContext::new().await;
    let new_secret = "whsec_bmV3LXNlY3JldC1mb3ItcmVsb2FkLXRlc3Q=";
    let dir = std::env::temp_dir().join(format!("fencehook-sighup-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("providers.toml");
    let write = |secrets: &str| {
        std::fs::write(
            &file,
            format!("[providers.generic]\nscheme = \"standard\"\nsecrets = [{secrets}]\n"),
        )
        .unwrap()
    };
    write(&format!("\"{SECRET}\""));
    let mut e = env(&ctx);
    e.push(("FENCEHOOK_PROVIDERS", file.display().to_string()));
    let p = ServeProcess::start(&e).await;
    let signed_with_new = |tx: &str| {
        let base = p.base.clone();
        let tx = tx.to_owned();
        async move { crate::helpers::process::deliver_signed(&base, &payment(&tx, 5), new_secret).await }
    };
    assert_eq!(
        signed_with_new("tx_hup_1").await.status,
        401,
        "not yet known"
    );

    write(&format!("\"{SECRET}\", \"{new_secret}\""));
    p.signal("HUP");
    wait_for(
        "the new secret verifies",
        Duration::from_secs(10),
        || async { signed_with_new("tx_hup_2").await.status == 200 },
    )
    .await;
    assert_eq!(
        p.deliver(&payment("tx_hup_3", 5)).await.status,
        200,
        "the old one too"
    );

    std::fs::write(&file, "[providers.generic]\nscheme = \"nonsense\"\n").unwrap();
    p.signal("HUP");
    wait_for(
        "the reload error counted",
        Duration::from_secs(10),
        || async {
            p.metric("fencehook_providers_reloads_total", &[("result", "error")])
                .await
                == 1.0
        },
    )
    .await;
    assert_eq!(
        signed_with_new("tx_hup_4").await.status,
        200,
        "a broken file leaves the providers in force"
    );
    let logs = p.logs.lock().unwrap().join("\n");
    assert!(
        logs.contains("does not parse; the providers in force are kept"),
        "{logs}"
    );
    assert_eq!(
        p.metric("fencehook_providers_reloads_total", &[("result", "ok")])
            .await,
        1.0
    );

    // What the start refuses, a reload refuses: the development secret.
    write(&format!("\"{}\"", fencehook::providers::DEV_SECRET));
    p.signal("HUP");
    wait_for(
        "the published secret refused",
        Duration::from_secs(10),
        || async {
            p.metric("fencehook_providers_reloads_total", &[("result", "error")])
                .await
                == 2.0
        },
    )
    .await;
    assert_eq!(
        signed_with_new("tx_hup_5").await.status,
        200,
        "the providers in force are kept"
    );
    let logs = p.logs.lock().unwrap().join("\n");
    assert!(logs.contains("DEVELOPMENT secret"), "{logs}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `systemctl reload` sends SIGHUP whatever the settings: without a providers
/// file (serve) or any providers at all (work) it is said to be ignored, and
/// the process keeps serving — SIGHUP's default action would end it at once,
/// without a drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_without_a_providers_file_is_ignored_by_serve_and_work() {
    let ctx = TestContext::new().await;
    let mut serve = ServeProcess::start(&env(&ctx)).await;
    let mut work = WorkProcess::start(&env(&ctx)).await;
    serve.signal("HUP");
    work.signal("HUP");
    for (name, logs) in [("serve", &serve.logs), ("work", &work.logs)] {
        wait_for(
            &format!("{name} says SIGHUP is ignored"),
            Duration::from_secs(10),
            || async {
                logs.lock()
                    .unwrap()
                    .iter()
                    .any(|l| l.contains("SIGHUP ignored"))
            },
        )
        .await;
    }
    assert_eq!(serve.wait_exit(Duration::from_millis(200)).await, None);
    assert_eq!(work.wait_exit(Duration::from_millis(200)).await, None);
    assert_eq!(serve.deliver(&payment("tx_after_hup", 7)).await.status, 200);
    assert_eq!(ctx.entries().await, 1);
}
