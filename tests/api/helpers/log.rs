//! `TEST_LOG=1`: the service's log in the test's output. Apps built in this
//! process log through one subscriber that writes with the test writer
//! (libtest shows it for a failing test, or always with `--nocapture`);
//! `fencehook` children's stderr lines are echoed there too, prefixed with
//! the command and its pid. `FENCEHOOK_LOG` sets the in-process levels
//! (`info` unless set).

use std::sync::Once;

/// `TEST_LOG` is set to anything but empty or `0`.
pub fn enabled() -> bool {
    std::env::var("TEST_LOG").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Installs the test-writer subscriber once per test process, when
/// [`enabled`].
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if !enabled() {
            return;
        }
        let levels = std::env::var("FENCEHOOK_LOG").unwrap_or_else(|_| "info".to_owned());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_new(levels)
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
            )
            .with_ansi(false)
            .with_test_writer()
            .try_init();
    });
}

/// A child's stderr line in the test's output, when [`enabled`].
pub fn echo(what: &str, pid: Option<u32>, line: &str) {
    if enabled() {
        let pid = pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
        eprintln!("[fencehook {what} {pid}] {line}");
    }
}

/// Runs only when asked (`--ignored`), from the test below: an app in this
/// process and a `fencehook serve` child log, then the test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fails on purpose; run by the_service_log_shows_in_a_failing_test_with_test_log"]
async fn fails_on_purpose_after_the_service_logged() {
    let ctx = super::TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    app.stop().await;
    let _serve = super::process::ServeProcess::start(&[
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
    ])
    .await;
    panic!("failing on purpose");
}

/// This binary running [`fails_on_purpose_after_the_service_logged`] with
/// `TEST_LOG` set as `test_log`: (its exit success, its stdout).
fn run_failing_test(test_log: &str) -> (bool, String) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helpers::log::fails_on_purpose_after_the_service_logged",
            "--ignored",
            "--test-threads=1",
        ])
        .env("TEST_LOG", test_log)
        .output()
        .expect("the test binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_service_log_shows_in_a_failing_test_with_test_log() {
    let (passed, output) = run_failing_test("1");
    assert!(!passed, "the inner test fails: {output}");
    assert!(output.contains("1 failed"), "it ran: {output}");
    // The in-process app's log (the test writer) ...
    assert!(
        output.contains("fencehook::app: stopped"),
        "in-process log shown: {output}"
    );
    // ... and the child's stderr.
    assert!(
        output.contains("[fencehook serve ") && output.contains("fencehook serving"),
        "child's log shown: {output}"
    );

    let (passed, output) = run_failing_test("0");
    assert!(!passed && output.contains("1 failed"), "it ran: {output}");
    assert!(
        !output.contains("[fencehook serve ") && !output.contains(" INFO "),
        "no service log without TEST_LOG: {output}"
    );
}
