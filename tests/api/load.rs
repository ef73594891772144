//! `fencehook load` against three real instances, and `fencehook audit
//! --answers` that goes with it — both run as the binary, as a user runs them.

use std::process::Command;

use serde_json::Value;

use crate::helpers::{TestContext, SECRET};

/// Runs the `fencehook` binary with `args`; (exit code, stdout, stderr).
fn fencehook(args: &[String], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the fencehook binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn count(report: &Value, status: u64, result: &str) -> u64 {
    report["answers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["status"] == status && a["result"] == result)
        .map(|a| a["count"].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_load_run_with_racing_copies_gets_one_processed_per_transaction_and_every_200_is_backed_by_a_row(
) {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(ctx.spawn(ctx.config()).await);
    }
    let dir = std::env::temp_dir().join(format!("fencehook-load-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let answers = dir.join("answers.jsonl").display().to_string();
    let mut args: Vec<String> = [
        "load",
        "--secret",
        SECRET,
        "--transactions",
        "150",
        "--duplicates",
        "3",
        "--concurrency",
        "24",
        "--failed-share",
        "0.2",
        "--answers",
        &answers,
        "--json",
    ]
    .map(str::to_owned)
    .to_vec();
    for app in &apps {
        args.extend(["--target".to_owned(), app.base.clone()]);
    }
    // The binary blocks; the instances it drives run on this runtime.
    let (code, out, err) = tokio::task::spawn_blocking(move || fencehook(&args, &[]))
        .await
        .unwrap();
    assert_eq!(code, 0, "a clean run exits 0: {err}\n{out}");
    let report: Value = serde_json::from_str(&out).expect("--json prints one JSON report");

    assert_eq!(report["stopped_by"], "transactions");
    assert_eq!(report["transactions"], 150);
    assert_eq!(report["deliveries"], 450);
    assert_eq!(report["payments"], 150);
    assert_eq!(report["processed_twice"], 0);
    assert_eq!(
        count(&report, 200, "processed"),
        150,
        "exactly one copy of each is `processed`"
    );
    for target in report["requests_per_target"].as_array().unwrap() {
        assert!(
            target["requests"].as_u64().unwrap() >= 150,
            "every instance got its share: {target}"
        );
    }
    assert_eq!(ctx.payments().await, 150);
    ctx.assert_audit_clean().await;

    let audit = |answers: String| {
        let db = ctx.database_url.clone();
        tokio::task::spawn_blocking(move || {
            fencehook(
                &["audit".to_owned(), "--answers".to_owned(), answers],
                &[("DATABASE_URL", &db)],
            )
        })
    };
    let (code, out, err) = audit(answers.clone()).await.unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("450 answers read, 150 transactions answered 2xx"),
        "{out}"
    );
    assert!(out.contains("audit: clean"), "{out}");

    // The check does catch a 200 without a terminal row: one that never
    // reached the database, and one left `processing`.
    ctx.db()
        .await
        .batch_execute(
            "UPDATE payments SET status = 'processing'
              WHERE id = (SELECT id FROM payments WHERE status = 'failed' LIMIT 1)",
        )
        .await
        .unwrap();
    let forged = dir.join("forged.jsonl");
    let mut text = std::fs::read_to_string(&answers).unwrap();
    text.push_str(
        r#"{"provider":"generic","transaction_id":"never-delivered","status":200,"result":"processed"}"#,
    );
    text.push('\n');
    std::fs::write(&forged, text).unwrap();
    let (code, out, _) = audit(forged.display().to_string()).await.unwrap();
    assert_eq!(code, 1, "a violation exits 1: {out}");
    assert!(out.contains("VIOLATED (2)"), "{out}");
    assert!(
        out.contains("generic:never-delivered answered 2xx, but there is no row"),
        "{out}"
    );
    assert!(out.contains("but its row is processing"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_inbox_load_run_accepts_each_transaction_once_waits_for_the_drain_and_reports_it() {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..2 {
        apps.push(ctx.spawn(ctx.inbox_config(2)).await);
    }
    let dir = std::env::temp_dir().join(format!("fencehook-load-inbox-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let answers = dir.join("answers.jsonl").display().to_string();
    let mut args: Vec<String> = [
        "load",
        "--secret",
        SECRET,
        "--transactions",
        "120",
        "--duplicates",
        "2",
        "--concurrency",
        "16",
        "--failed-share",
        "0.2",
        "--inbox",
        "--database-url",
        &ctx.database_url,
        "--drain-timeout",
        "60s",
        "--answers",
        &answers,
        "--json",
    ]
    .map(str::to_owned)
    .to_vec();
    for app in &apps {
        args.extend(["--target".to_owned(), app.base.clone()]);
    }
    let (code, out, err) = tokio::task::spawn_blocking(move || fencehook(&args, &[]))
        .await
        .unwrap();
    assert_eq!(code, 0, "a clean run exits 0: {err}\n{out}");
    let report: Value = serde_json::from_str(&out).expect("--json prints one JSON report");

    assert_eq!(report["transactions"], 120);
    assert_eq!(report["deliveries"], 240);
    assert_eq!(report["payments"], 120, "every transaction got a 2xx");
    assert_eq!(
        count(&report, 200, "accepted"),
        120,
        "exactly one copy of each is `accepted`"
    );
    assert_eq!(
        count(&report, 200, "processed"),
        0,
        "inbox mode books later"
    );
    let inbox = &report["inbox"];
    assert_eq!(inbox["accepted"], 120);
    assert_eq!(inbox["accepted_twice"], 0);
    assert_eq!(inbox["accepted_deliveries"], 240);
    assert!(inbox["accept_rate"].as_f64().unwrap() > 0.0, "{inbox}");
    let drain = &inbox["drain"];
    assert_eq!(drain["ended"], "drained", "{drain}");
    assert_eq!(drain["events"], 120);
    assert_eq!(drain["transactions"], 120);
    assert_eq!(drain["done"], 120, "every event booked");
    assert_eq!(drain["dead"], 0);
    assert_eq!(drain["unfinished"], 0);
    assert_eq!(drain["error"], Value::Null);
    assert!(drain["drain_rate"].as_f64().unwrap() > 0.0, "{drain}");
    assert!(drain["span_secs"].as_f64().unwrap() > 0.0, "{drain}");
    let lag = &drain["lag"];
    for p in ["p50_ms", "p90_ms", "p99_ms", "max_ms"] {
        assert!(lag[p].as_f64().unwrap() >= 0.0, "{p} in {lag}");
    }
    assert!(
        lag["p50_ms"].as_f64() <= lag["p99_ms"].as_f64()
            && lag["p99_ms"].as_f64() <= lag["max_ms"].as_f64(),
        "{lag}"
    );
    // The report's figures are the database's.
    assert_eq!(
        ctx.count("SELECT count(*) FROM events WHERE status = 'done'")
            .await,
        120
    );
    assert_eq!(
        ctx.count("SELECT count(*) FROM payments WHERE status IN ('succeeded', 'failed')")
            .await,
        120
    );
    ctx.assert_audit_clean().await;

    let audit = |answers: String| {
        let db = ctx.database_url.clone();
        tokio::task::spawn_blocking(move || {
            fencehook(
                &["audit".to_owned(), "--answers".to_owned(), answers],
                &[("DATABASE_URL", &db)],
            )
        })
    };
    let (code, out, err) = audit(answers.clone()).await.unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("240 answers read, 120 transactions answered 2xx to check (120 answered accepted, 120 with another 2xx)"),
        "{out}"
    );
    assert!(
        out.contains("every_accepted_has_a_row_and_an_event"),
        "{out}"
    );
    assert!(out.contains("audit: clean"), "{out}");

    // An `accepted` that was never stored is caught.
    let forged = dir.join("forged.jsonl");
    let mut text = std::fs::read_to_string(&answers).unwrap();
    text.push_str(
        r#"{"provider":"generic","transaction_id":"never-stored","status":200,"result":"accepted"}"#,
    );
    text.push('\n');
    std::fs::write(&forged, text).unwrap();
    let (code, out, _) = audit(forged.display().to_string()).await.unwrap();
    assert_eq!(code, 1, "a violation exits 1: {out}");
    assert!(
        out.contains("generic:never-stored answered accepted, but there is no row and no event"),
        "{out}"
    );
    for app in apps {
        app.stop().await;
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
