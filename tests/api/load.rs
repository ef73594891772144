//! `fencehook load` against three real instances, and `fencehook audit
//! --answers` that goes with it — both run as the binary, as a user runs them.
//! Then the RSA schemes under load, against `fencehook serve` processes that
//! read the same providers file as the load, and `fencehook send` with
//! nothing but a provider's name.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use fencehook::providers::testkeys;
use serde_json::Value;

use crate::helpers::process::ServeProcess;
use crate::helpers::{free_addr_on, now, TestContext, SECRET};

/// Runs the `fencehook` binary with `args`; (exit code, stdout, stderr).
/// The settings of the environment the tests run in are not the child's:
/// only `env` is (a FENCEHOOK_PROVIDERS there would change what the tools
/// sign as).
fn fencehook(args: &[String], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("FENCEHOOK_") || k == "DATABASE_URL" {
            cmd.env_remove(k);
        }
    }
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

/// The PSP side of one RSA provider for a test: test key 0's private key,
/// its public half (and, for paypal, a certificate of it), and a providers
/// file that names the public half, written to a directory of the test's.
struct RsaPsp {
    dir: PathBuf,
    name: &'static str,
    providers: PathBuf,
    key: PathBuf,
    /// What `load` needs beside `--providers`, `--provider` and
    /// `--private-key`: what the file cannot say.
    load_args: Vec<String>,
}

const WECHAT_SERIAL: &str = "PUB_KEY_ID_0000000000000024101100397200000006";
const APIV3_KEY: &str = "fencehook-LOAD-apiv3-key-32bytes";

impl RsaPsp {
    /// `scheme`'s provider; paypal's certificate is served (by `load`) at
    /// `cert_addr`.
    fn write(ctx: &TestContext, scheme: &str, cert_addr: SocketAddr) -> RsaPsp {
        let dir = std::env::temp_dir().join(format!("fencehook-load-{scheme}-{}", ctx.prefix));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("psp.key");
        std::fs::write(&key, testkeys::private_key_pem(0)).unwrap();
        std::fs::write(dir.join("psp.pub.pem"), testkeys::public_key_pem(0)).unwrap();
        let (name, table, load_args) = match scheme {
            "wechatpay" => (
                "wechat",
                format!(
                    "scheme = \"wechatpay\"\nsecrets = [\"{APIV3_KEY}\"]\nplatform_keys = {{ \"{WECHAT_SERIAL}\" = \"psp.pub.pem\" }}\n"
                ),
                vec!["--serial".to_owned(), WECHAT_SERIAL.to_owned()],
            ),
            "alipay" => (
                "alipay",
                "scheme = \"alipay\"\napp_id = \"2021000000000000\"\npublic_keys = [\"psp.pub.pem\"]\n"
                    .to_owned(),
                Vec::new(),
            ),
            "paypal" => {
                let cert = dir.join("psp.crt");
                std::fs::write(
                    &cert,
                    testkeys::certificate(
                        0,
                        "0A1B2C",
                        "CN=messageverificationcerts.paypal.com",
                        0,
                        now() as u64 + 86_400,
                    ),
                )
                .unwrap();
                let prefix = format!("http://{cert_addr}/");
                (
                    "paypal",
                    format!(
                        "scheme = \"paypal\"\nwebhook_id = \"WH-LOAD-TEST\"\ncert_url_prefixes = [\"{prefix}\"]\n"
                    ),
                    vec![
                        "--cert-url".to_owned(),
                        format!("{prefix}v1/notifications/certs/CERT-load"),
                        "--serve-cert".to_owned(),
                        cert.display().to_string(),
                    ],
                )
            }
            other => panic!("not an RSA scheme: {other}"),
        };
        let providers = dir.join("providers.toml");
        std::fs::write(&providers, format!("[providers.{name}]\n{table}")).unwrap();
        RsaPsp {
            dir,
            name,
            providers,
            key,
            load_args,
        }
    }
}

impl Drop for RsaPsp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `fencehook serve`, as a process, reading `providers`.
async fn serve(ctx: &TestContext, providers: &Path) -> ServeProcess {
    ServeProcess::start(&[
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_PROVIDERS", providers.display().to_string()),
    ])
    .await
}

/// (status, result) of every line of an answers file.
fn answer_lines(path: &Path) -> Vec<(String, Option<u64>, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            (
                v["transaction_id"].as_str().unwrap().to_owned(),
                v["status"].as_u64(),
                v["result"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Runs `fencehook load` for a few seconds with k=2 against two `serve`
/// processes configured with `scheme`, and checks the rows: every
/// transaction answered 2xx has exactly one payment row and one ledger
/// entry; no answer was a 5xx. Returns the report and the results of the
/// 2xx answers of the answers file.
async fn a_load_run_of_an_rsa_scheme_books_each_2xx_once(scheme: &str) -> (Value, Vec<String>) {
    let ctx = TestContext::new().await;
    // PayPal's certificate is served by the load on an address the providers
    // file must name before the serves start, so the port is picked now and
    // bound only when the load starts. On 127.0.0.1 another test could take
    // it in between (every test binds port 0 there); nothing else binds
    // 127.0.0.2, so a port free there now is still free then.
    let psp = RsaPsp::write(&ctx, scheme, free_addr_on("127.0.0.2").await);
    let instances = [
        serve(&ctx, &psp.providers).await,
        serve(&ctx, &psp.providers).await,
    ];
    let answers = psp.dir.join("answers.jsonl");
    let mut args: Vec<String> = [
        "load",
        "--providers",
        &psp.providers.display().to_string(),
        "--provider",
        psp.name,
        "--private-key",
        &psp.key.display().to_string(),
        "--duration",
        "3s",
        "--duplicates",
        "2",
        "--concurrency",
        "8",
        "--failed-share",
        "0",
        "--answers",
        &answers.display().to_string(),
        "--json",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(psp.load_args.iter().cloned());
    for instance in &instances {
        args.extend(["--target".to_owned(), instance.base.clone()]);
    }
    let (code, out, err) = tokio::task::spawn_blocking(move || fencehook(&args, &[]))
        .await
        .unwrap();
    assert_eq!(code, 0, "a clean run exits 0: {err}\n{out}");
    let report: Value = serde_json::from_str(&out).expect("--json prints one JSON report");
    assert_eq!(report["scheme"], scheme);
    assert_eq!(report["provider"], psp.name);
    assert_eq!(report["stopped_by"], "duration");
    assert!(report["payments"].as_u64().unwrap() > 0, "{report}");
    for list in ["answers", "retried_answers"] {
        for a in report[list].as_array().unwrap() {
            assert!(
                a["status"].as_u64().is_some_and(|s| s < 500),
                "no 5xx, no transport error: {a} in {report}"
            );
        }
    }

    let lines = answer_lines(&answers);
    assert_eq!(
        lines.len() as u64,
        report["deliveries"].as_u64().unwrap(),
        "one line per delivery"
    );
    let answered_2xx: HashSet<String> = lines
        .iter()
        .filter(|(_, status, _)| matches!(status, Some(200..=299)))
        .map(|(tx, ..)| tx.clone())
        .collect();
    assert_eq!(
        answered_2xx.len() as u64,
        report["payments"].as_u64().unwrap()
    );
    let ids: Vec<String> = answered_2xx.iter().cloned().collect();
    let rows = ctx
        .db()
        .await
        .query(
            "SELECT p.transaction_id, p.status, count(l.id)
               FROM payments p LEFT JOIN ledger_entries l ON l.payment_id = p.id
              WHERE p.provider = $1 AND p.transaction_id = ANY($2)
              GROUP BY p.id",
            &[&psp.name, &ids],
        )
        .await
        .unwrap();
    let mut booked: BTreeMap<String, (String, i64)> = BTreeMap::new();
    for row in rows {
        let tx: String = row.get(0);
        assert!(
            booked
                .insert(tx.clone(), (row.get(1), row.get(2)))
                .is_none(),
            "{tx} has two rows"
        );
    }
    for tx in &answered_2xx {
        assert_eq!(
            booked.get(tx),
            Some(&("succeeded".to_owned(), 1)),
            "{tx} was answered 2xx: one succeeded row and one ledger entry"
        );
    }
    ctx.assert_audit_clean().await;
    let db = ctx.database_url.clone();
    let answers_arg = answers.display().to_string();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        fencehook(
            &["audit".to_owned(), "--answers".to_owned(), answers_arg],
            &[("DATABASE_URL", &db)],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("audit: clean"), "{out}");
    drop(instances);
    let results_2xx = lines
        .into_iter()
        .filter(|(_, status, _)| matches!(status, Some(200..=299)))
        .map(|(_, _, result)| result)
        .collect();
    (report, results_2xx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wechatpay_load_run_with_racing_copies_books_every_2xx_once_from_the_providers_file() {
    let (report, results_2xx) = a_load_run_of_an_rsa_scheme_books_each_2xx_once("wechatpay").await;
    // WeChat Pay's success is an empty 200: no result label to count.
    assert!(
        results_2xx.iter().all(|r| r == "success"),
        "{results_2xx:?}"
    );
    assert_eq!(
        report["unlabelled_2xx"].as_u64(),
        Some(results_2xx.len() as u64),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_alipay_load_run_with_racing_copies_books_every_2xx_once_from_the_providers_file() {
    let (report, results_2xx) = a_load_run_of_an_rsa_scheme_books_each_2xx_once("alipay").await;
    // Alipay's success is the text `success`.
    assert!(
        results_2xx.iter().all(|r| r == "success"),
        "{results_2xx:?}"
    );
    assert_eq!(
        report["unlabelled_2xx"].as_u64(),
        Some(results_2xx.len() as u64),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paypal_load_run_serving_its_own_certificate_books_every_2xx_once() {
    let (report, results_2xx) = a_load_run_of_an_rsa_scheme_books_each_2xx_once("paypal").await;
    // PayPal reads fencehook's JSON: each transaction `processed` exactly once.
    assert!(
        results_2xx
            .iter()
            .all(|r| r == "processed" || r == "duplicate"),
        "{results_2xx:?}"
    );
    assert_eq!(report["unlabelled_2xx"], 0);
    assert_eq!(report["processed_twice"], 0);
    assert_eq!(
        count(&report, 200, "processed"),
        report["payments"].as_u64().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn send_with_only_a_provider_name_signs_with_the_providers_file_and_an_unknown_name_is_refused(
) {
    let ctx = TestContext::new().await;
    let dir = std::env::temp_dir().join(format!("fencehook-send-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("psp.pub.pem"), testkeys::public_key_pem(0)).unwrap();
    let providers = dir.join("providers.toml");
    std::fs::write(
        &providers,
        r#"
[providers.shop]
scheme = "stripe"
secrets = ["whsec_shop_endpoint_secret_new_0123456789", "whsec_shop_endpoint_secret_old_0123456789"]

[providers.alipay]
scheme = "alipay"
app_id = "2021000000000000"
public_keys = ["psp.pub.pem"]
"#,
    )
    .unwrap();
    let instance = serve(&ctx, &providers).await;
    let file = providers.display().to_string();
    let send = move |provider: &str| {
        let args: Vec<String> = [
            "send",
            "--url",
            &instance.base,
            "--provider",
            provider,
            "--transaction-id",
            "pi_from_the_file",
            "--amount",
            "4200",
        ]
        .map(str::to_owned)
        .to_vec();
        // The built-in generic provider's secret in the environment, as
        // `make run` sets it: a provider of the file does not sign with it.
        let file = file.clone();
        tokio::task::spawn_blocking(move || {
            fencehook(
                &args,
                &[
                    ("FENCEHOOK_PROVIDERS", &file),
                    ("FENCEHOOK_GENERIC_SECRET", SECRET),
                ],
            )
        })
    };
    let (code, out, err) = send("shop").await.unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("200 "), "{out}");
    assert!(out.contains("processed"), "{out}");
    assert_eq!(
        ctx.payment("pi_from_the_file").await.map(|p| p.0),
        Some("succeeded".to_owned())
    );
    assert_eq!(ctx.entries().await, 1);

    let (code, out, err) = send("shpo").await.unwrap();
    assert_eq!(code, 2, "{out}{err}");
    assert_eq!(
        err.trim(),
        format!(
            "fencehook: --provider: `shpo` is not in the providers file {} (it has alipay, shop)",
            providers.display()
        )
    );
    let (code, _, err) = send("alipay").await.unwrap();
    assert_eq!(code, 2);
    assert!(
        err.contains("--private-key") && err.contains("holds public keys only"),
        "{err}"
    );
    assert_eq!(ctx.payments().await, 1, "nothing else was sent");
    std::fs::remove_dir_all(&dir).unwrap();
}
