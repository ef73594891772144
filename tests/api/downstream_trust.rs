//! The downstream call is a webhook the order service can trust: over
//! `https://` the order service's certificate must verify (its own CA file,
//! or the public CAs), a certificate that does not is a failed call (503,
//! nothing booked) and never a plaintext retry, and with a secret every
//! call is signed so that a Standard Webhooks library verifies it.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use fencehook::config::downstream::{DownstreamArgs, DownstreamTrust};
use serde_json::json;

use crate::helpers::downstream::{Call, MockDownstream};
use crate::helpers::process::fencehook_binary;
use crate::helpers::redis_ha::TestCa;
use crate::helpers::{now, payment, TestContext, SECRET};

/// The order service's secret in these tests (a 32-byte key).
const DOWNSTREAM_SECRET: &str = "whsec_b3JkZXItc2VydmljZS1zZWNyZXQtZm9yLXRlc3RzLSE=";

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fh-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn trust(url: &hyper::Uri, ca: Option<&TestCa>, secret: Option<&str>) -> DownstreamTrust {
    DownstreamArgs {
        downstream_ca_file: ca.map(|c| c.ca_file.clone()),
        downstream_secret: secret.map(str::to_owned),
    }
    .validate(Some(url))
    .unwrap()
}

/// Verifies `call` with the `standardwebhooks` package from PyPI (the
/// virtualenv of scripts/psp-sdks.sh under target/): (verified, what it said).
fn standard_webhooks_verifies(call: &Call, body: &[u8], secret: &str) -> (bool, String) {
    let repo = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(format!("{repo}/scripts/psp-sdks.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/psp-sdks.sh runs");
    assert!(
        out.status.success(),
        "the Python SDKs could not be installed"
    );
    let python = String::from_utf8(out.stdout).unwrap();
    let python = python.lines().last().unwrap().trim().to_owned();
    let headers: serde_json::Map<String, serde_json::Value> = call
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap())))
        .collect();
    let input = json!({
        "secret": secret,
        "headers": headers,
        "body_b64": base64::engine::general_purpose::STANDARD.encode(body),
    });
    let mut child = Command::new(python)
        .arg(format!("{repo}/tests/psp-sdks/standardwebhooks_verify.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && said.trim() == "verified", said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_downstream_of_a_private_ca_books_and_each_call_verifies_with_a_standard_webhooks_library(
) {
    let ctx = TestContext::new().await;
    let dir = temp_dir("downstream-tls");
    let ca = TestCa::new(&dir, "orders", "127.0.0.1");
    let mock = MockDownstream::start_tls(&ca).await;
    let url = mock.url();
    assert_eq!(url.scheme_str(), Some("https"));
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(url.clone());
    cfg.downstream_trust = trust(&url, Some(&ca), Some(DOWNSTREAM_SECRET));
    let app = ctx.spawn(cfg).await;

    let r = app.deliver(&payment("pay_tls", 4200)).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    assert_eq!(ctx.payment("pay_tls").await.unwrap().0, "succeeded");
    assert_eq!(ctx.entries().await, 1);

    let calls = mock.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    let header = |name: &str| call.headers.get(name).unwrap().to_str().unwrap().to_owned();
    assert_eq!(header("webhook-id"), "generic:pay_tls:payment.succeeded");
    assert_eq!(header("webhook-id"), call.idempotency_key);
    let ts: i64 = header("webhook-timestamp").parse().unwrap();
    assert!((now() - ts).abs() < 120, "{ts}");
    assert!(header("webhook-signature").starts_with("v1,"));

    let (verified, said) = standard_webhooks_verifies(call, &call.raw_body, DOWNSTREAM_SECRET);
    assert!(verified, "standardwebhooks: {said}");
    // The library is no rubber stamp: another body, or another secret, fails.
    let mut tampered = call.raw_body.to_vec();
    tampered.extend_from_slice(b" ");
    let (verified, said) = standard_webhooks_verifies(call, &tampered, DOWNSTREAM_SECRET);
    assert!(!verified && said.contains("refused"), "{said}");
    let (verified, _) = standard_webhooks_verifies(call, &call.raw_body, SECRET);
    assert!(!verified, "a wrong secret fails");

    // Without a secret the call carries no webhook-* header.
    let ctx2 = TestContext::new().await;
    let mut cfg = ctx2.config();
    cfg.downstream_url = Some(url.clone());
    cfg.downstream_trust = trust(&url, Some(&ca), None);
    let unsigned = ctx2.spawn(cfg).await;
    let r = unsigned.deliver(&payment("pay_unsigned", 100)).await;
    assert_eq!(r.result(), "processed", "{r:?}");
    let calls = mock.calls();
    assert_eq!(calls.len(), 2);
    assert!(
        calls[1]
            .headers
            .keys()
            .all(|k| !k.as_str().starts_with("webhook-")),
        "{:?}",
        calls[1].headers
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_certificate_that_does_not_verify_is_a_503_with_nothing_booked_and_never_plaintext(
) {
    let dir = temp_dir("downstream-untrusted");
    let ca = TestCa::new(&dir, "orders", "127.0.0.1");
    let other = TestCa::new(&dir, "other", "127.0.0.1");
    let mock = MockDownstream::start_tls(&ca).await;
    let url = mock.url();
    // The order service's certificate from another CA than the file's, from
    // a CA no public root vouches for, and an https:// URL whose server
    // speaks plain HTTP: each a failed call.
    let plain = MockDownstream::start().await;
    let plain_as_https: hyper::Uri = format!("https://{}/payments", plain.addr).parse().unwrap();
    for (target, trusted, case) in [
        (&url, Some(&other), "another CA's file"),
        (&url, None, "the public CAs"),
        (
            &plain_as_https,
            Some(&ca),
            "a plain-HTTP server behind https://",
        ),
    ] {
        let ctx = TestContext::new().await;
        let mut cfg = ctx.config();
        cfg.downstream_url = Some(target.clone());
        cfg.downstream_trust = trust(target, trusted, Some(DOWNSTREAM_SECRET));
        let app = ctx.spawn(cfg).await;
        let r = app.deliver(&payment("pay_untrusted", 4200)).await;
        assert_eq!(r.status, 503, "{case}: {r:?}");
        assert_ne!(
            ctx.payment("pay_untrusted").await.map(|p| p.0).as_deref(),
            Some("succeeded"),
            "{case}"
        );
        assert_eq!(ctx.entries().await, 0, "{case}: nothing booked");
        ctx.assert_audit_clean().await;
    }
    assert!(mock.calls().is_empty(), "no request reached the server");
    assert!(
        plain.calls().is_empty(),
        "nothing was sent in plaintext: {:?}",
        plain.calls()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_downstream_secret_or_ca_file_stops_the_start_and_check_config_names_each() {
    let ctx = TestContext::new().await;
    let base = [
        ("DATABASE_URL", ctx.database_url.as_str()),
        ("REDIS_URL", ctx.redis_url.as_str()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.as_str()),
        ("FENCEHOOK_GENERIC_SECRET", SECRET),
        (
            "FENCEHOOK_DOWNSTREAM_URL",
            "https://orders.internal/payments",
        ),
    ];
    let bad = [
        ("FENCEHOOK_DOWNSTREAM_SECRET", "sk_live_not_a_whsec"),
        ("FENCEHOOK_DOWNSTREAM_CA_FILE", "/nonexistent/orders-ca.pem"),
    ];
    let env: Vec<(&str, &str)> = base.iter().chain(&bad).copied().collect();
    let (code, out, err) = fencehook_binary(&["check-config"], &env).await;
    assert_eq!(code, 2, "{out}{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("invalid configuration"))
        .collect();
    assert_eq!(lines.len(), 2, "one line each: {err}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("FENCEHOOK_DOWNSTREAM_SECRET: must be a Standard Webhooks secret")),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l
                .contains("FENCEHOOK_DOWNSTREAM_CA_FILE: cannot read /nonexistent/orders-ca.pem")),
        "{err}"
    );
    assert!(
        !err.contains("sk_live_not_a_whsec"),
        "the secret is not printed: {err}"
    );

    // serve stops at once, with one line naming the setting.
    let env: Vec<(&str, &str)> = base.iter().chain(&bad[..1]).copied().collect();
    let started = std::time::Instant::now();
    let (code, out, err) = fencehook_binary(&["serve"], &env).await;
    assert_eq!(code, 2, "{out}{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
    let line = err
        .lines()
        .find(|l| l.contains("invalid configuration"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("FENCEHOOK_DOWNSTREAM_SECRET"), "{line}");

    // Good settings: check-config says the calls are signed.
    let dir = temp_dir("downstream-config");
    let ca = TestCa::new(&dir, "orders", "127.0.0.1");
    let ca_file = ca.ca_file.to_str().unwrap().to_owned();
    let env: Vec<(&str, &str)> = base
        .iter()
        .copied()
        .chain([
            ("FENCEHOOK_DOWNSTREAM_SECRET", DOWNSTREAM_SECRET),
            ("FENCEHOOK_DOWNSTREAM_CA_FILE", ca_file.as_str()),
        ])
        .collect();
    let (code, out, err) = fencehook_binary(&["check-config"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("downstream https://orders.internal/payments (signed, its CA file)"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
