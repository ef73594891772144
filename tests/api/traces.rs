//! OpenTelemetry traces from real `fencehook serve` processes to a small
//! OTLP/HTTP receiver in the harness: a delivery's spans under the PSP's
//! trace, the downstream's `traceparent`, trace ids in JSON log lines, and a
//! collector that is dead or stalled changing no answer.

use std::time::Duration;

use fencehook::metrics::TRACE_SPANS_DROPPED_TOTAL;
use serde_json::Value;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::otlp::{Collector, ReceivedSpan};
use crate::helpers::process::ServeProcess;
use crate::helpers::{client, closed_port, payment, wait_for, TestContext, SECRET};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_ID}-01")
}

fn env(ctx: &TestContext, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_DB_POOL_SIZE", "4".to_owned()),
        ("FENCEHOOK_LOG_FORMAT", "json".to_owned()),
        // Spans leave a tenth of a second after they end, not five.
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ];
    env.extend_from_slice(extra);
    env
}

/// What the PSP's request carried, and what came back.
struct Sent {
    status: u16,
    body: Value,
    signature: String,
    text: String,
}

/// Signs and posts `payload` to the generic provider, with `headers` added.
async fn deliver(base: &str, payload: &Value, headers: &[(&str, &str)]) -> Sent {
    deliver_signed(base, payload, SECRET, headers).await
}

async fn deliver_signed(
    base: &str,
    payload: &Value,
    secret: &str,
    headers: &[(&str, &str)],
) -> Sent {
    let text = payload.to_string();
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let ts = crate::helpers::now();
    let signature = fencehook::providers::standard::sign(secret, &id, ts, text.as_bytes()).unwrap();
    let mut req = hyper::Request::post(format!("{base}/webhooks/generic"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", &signature)
        .header("user-agent", "psp-test/1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::from(text.clone())))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), client().request(req))
        .await
        .expect("an answer within 30 s")
        .expect("an answer");
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    Sent {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        signature,
        text,
    }
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_with_a_traceparent_yields_its_spans_under_that_trace_and_the_downstream_joins_it(
) {
    let ctx = TestContext::new().await;
    let collector = Collector::start().await;
    let downstream = MockDownstream::start().await;
    let app = ServeProcess::start(&env(
        &ctx,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
            ("FENCEHOOK_DOWNSTREAM_URL", downstream.url().to_string()),
        ],
    ))
    .await;
    // Exported at zero before any span was dropped.
    let dropped = app.metric(TRACE_SPANS_DROPPED_TOTAL, &[]).await;
    assert_eq!(dropped, 0.0);
    let p = payment("pay_traced", 1250);
    let sent = deliver(&app.base, &p, &[("traceparent", &traceparent())]).await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    assert_eq!(sent.body["result"], "processed");

    let spans = collector
        .wait_for(
            "the delivery and downstream spans",
            Duration::from_secs(20),
            |s| !named(s, "POST /webhooks/{provider}").is_empty() && !named(s, "POST").is_empty(),
        )
        .await;
    // The default encoding.
    assert!(collector
        .content_types()
        .iter()
        .all(|t| t.starts_with("application/x-protobuf")));
    let server = named(&spans, "POST /webhooks/{provider}")[0].clone();
    assert_eq!(server.trace_id, TRACE_ID, "the PSP's trace");
    assert_eq!(server.parent_span_id, PARENT_ID, "under the PSP's span");
    assert_eq!(server.kind, 2, "a server span");
    assert_eq!(server.attr("http.request.method"), Some("POST"));
    assert_eq!(server.attr("http.route"), Some("/webhooks/{provider}"));
    assert_eq!(server.attr("url.path"), Some("/webhooks/generic"));
    assert_eq!(server.attr("http.response.status_code"), Some("200"));
    assert_eq!(server.attr("user_agent.original"), Some("psp-test/1"));
    assert_eq!(server.attr("fencehook.provider"), Some("generic"));
    assert_eq!(server.attr("fencehook.result"), Some("processed"));
    assert_eq!(server.attr("fencehook.transaction_id"), Some("pay_traced"));
    assert_eq!(
        server.resource.get("service.name").map(String::as_str),
        Some("fencehook")
    );

    let verify = named(&spans, "fencehook.verify")[0];
    assert_eq!(verify.trace_id, TRACE_ID);
    assert_eq!(
        verify.parent_span_id, server.span_id,
        "verify is the delivery's child"
    );
    assert_eq!(verify.attr("fencehook.verified"), Some("true"));

    // The story of the item, under the delivery: the fast-path read, the
    // lease, the claim, the call, the finalize, the release.
    let spans = collector
        .wait_for("the item's spans", Duration::from_secs(20), |s| {
            [
                "fencehook.process",
                "fencehook.lease.release",
                "fencehook.finalize",
            ]
            .iter()
            .all(|n| !named(s, n).is_empty())
        })
        .await;
    let process = named(&spans, "fencehook.process")[0];
    assert_eq!(process.parent_span_id, server.span_id);
    assert_eq!(process.attr("fencehook.transaction_id"), Some("pay_traced"));
    assert_eq!(
        process.attr("fencehook.event_type"),
        Some("payment.succeeded")
    );
    let acquire = named(&spans, "fencehook.lease.acquire")[0];
    assert_eq!(acquire.attr("fencehook.lease.result"), Some("acquired"));
    let token = acquire
        .attr("fencehook.fencing_token")
        .expect("the token")
        .to_owned();
    for name in [
        "fencehook.fast_path",
        "fencehook.lease.acquire",
        "fencehook.claim",
        "POST",
        "fencehook.finalize",
        "fencehook.lease.release",
    ] {
        let span = named(&spans, name);
        assert_eq!(span.len(), 1, "one {name}");
        assert_eq!(span[0].trace_id, TRACE_ID, "{name}");
        assert_eq!(
            span[0].parent_span_id, process.span_id,
            "{name} is the item's child"
        );
        if name != "fencehook.fast_path" {
            assert_eq!(
                span[0].attr("fencehook.fencing_token"),
                Some(token.as_str()),
                "{name}"
            );
        }
    }
    // Each step lasts while its work does, inside the item's span, one
    // after the other in the order they run (the steps' spans are never
    // entered: each ends when its work is done).
    let steps: Vec<_> = [
        "fencehook.fast_path",
        "fencehook.lease.acquire",
        "fencehook.claim",
        "POST",
        "fencehook.finalize",
        "fencehook.lease.release",
    ]
    .iter()
    .map(|name| named(&spans, name)[0])
    .collect();
    let verify = named(&spans, "fencehook.verify")[0];
    assert!(
        verify.start < verify.end && verify.end <= process.start,
        "the check lasts, and ends before the item is processed"
    );
    for (step, next) in steps.iter().zip(steps.iter().skip(1)) {
        assert!(
            step.end <= next.start,
            "{} ends before {} starts",
            step.name,
            next.name
        );
    }
    for step in &steps {
        assert!(step.start < step.end, "{} lasts", step.name);
        assert!(
            process.start <= step.start && step.end <= process.end,
            "{} within the item's span",
            step.name
        );
    }
    let call = named(&spans, "POST")[0];
    assert_eq!(call.trace_id, TRACE_ID);
    assert_eq!(call.kind, 3, "a client span");
    assert_eq!(call.attr("http.response.status_code"), Some("200"));
    // The downstream saw this trace, under the client span.
    let calls = downstream.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].traceparent.as_deref(),
        Some(format!("00-{TRACE_ID}-{}-01", call.span_id).as_str()),
        "the downstream's parent is the client span"
    );

    // No secret, signature or body in any attribute.
    for s in &spans {
        for (k, v) in &s.attributes {
            assert!(
                !v.contains(&sent.signature) && !v.contains(SECRET) && !v.contains(&sent.text),
                "{}: {k} = {v}",
                s.name
            );
            assert!(!v.contains("1250"), "{}: {k} = {v}: no amount", s.name);
        }
    }

    // The delivery's log line leads to the trace.
    let line = app.log_lines("\"message\":\"delivery\"");
    let line: Value = serde_json::from_str(line.last().expect("a delivery line")).unwrap();
    assert_eq!(line["trace_id"], TRACE_ID);
    assert_eq!(line["span_id"], server.span_id.as_str());
}

/// A downstream URL whose path carries a token: the client span's
/// `url.full` keeps the scheme, host and port, the path and query are
/// replaced, and no attribute of any span holds the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_downstream_span_names_its_host_and_port_but_not_the_urls_secret_bearing_path() {
    let ctx = TestContext::new().await;
    let collector = Collector::start().await;
    let downstream = MockDownstream::start().await;
    let token = "tok-7c1f0e9a4b2d";
    let url = format!(
        "http://{}/hooks/{token}/payments?signature={token}",
        downstream.addr
    );
    let app = ServeProcess::start(&env(
        &ctx,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
            ("FENCEHOOK_DOWNSTREAM_URL", url),
        ],
    ))
    .await;
    let sent = deliver(&app.base, &payment("pay_path_token", 300), &[]).await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    assert_eq!(downstream.calls().len(), 1, "the call went to that URL");
    let spans = collector
        .wait_for("the downstream span", Duration::from_secs(20), |s| {
            !named(s, "POST").is_empty() && !named(s, "POST /webhooks/{provider}").is_empty()
        })
        .await;
    let call = named(&spans, "POST")[0];
    assert_eq!(
        call.attr("url.full"),
        Some(format!("http://{}/REDACTED", downstream.addr).as_str())
    );
    assert_eq!(call.attr("server.address"), Some("127.0.0.1"));
    assert_eq!(
        call.attr("server.port"),
        Some(downstream.addr.port().to_string().as_str())
    );
    for s in &spans {
        for (k, v) in &s.attributes {
            assert!(!v.contains(token), "{}: {k} = {v}", s.name);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_json_exports_reach_the_collector_and_a_delivery_without_traceparent_starts_its_own_trace(
) {
    let ctx = TestContext::new().await;
    let collector = Collector::start().await;
    let app = ServeProcess::start(&env(
        &ctx,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json".to_owned()),
            ("OTEL_SERVICE_NAME", "payments-webhooks".to_owned()),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment.name=test".to_owned(),
            ),
        ],
    ))
    .await;
    let sent = deliver(&app.base, &payment("pay_json", 100), &[]).await;
    assert_eq!(sent.status, 200);
    let spans = collector
        .wait_for("the delivery's spans", Duration::from_secs(20), |s| {
            [
                "POST /webhooks/{provider}",
                "fencehook.commit",
                "fencehook.process",
            ]
            .iter()
            .all(|n| !named(s, n).is_empty())
        })
        .await;
    assert!(collector
        .content_types()
        .iter()
        .all(|t| t.starts_with("application/json")));
    // Without a downstream: one transaction claims, books and finalizes.
    let commit = named(&spans, "fencehook.commit")[0];
    assert_eq!(
        commit.parent_span_id,
        named(&spans, "fencehook.process")[0].span_id
    );
    assert!(commit.attr("fencehook.fencing_token").is_some());
    assert!(named(&spans, "fencehook.claim").is_empty());
    let server = named(&spans, "POST /webhooks/{provider}")[0];
    assert_eq!(server.parent_span_id, "", "a root span");
    assert_eq!(server.trace_id.len(), 32);
    assert_ne!(server.trace_id, "0".repeat(32));
    assert_eq!(
        server.resource.get("service.name").map(String::as_str),
        Some("payments-webhooks")
    );
    assert_eq!(
        server
            .resource
            .get("deployment.environment.name")
            .map(String::as_str),
        Some("test")
    );
    // A refused delivery is traced too, with its answer.
    let other = "whsec_b3RoZXItc2VjcmV0LW5vdC10aGUtcHJvdmlkZXJzLW9uZQ==";
    let bad = deliver_signed(&app.base, &payment("pay_json", 100), other, &[]).await;
    assert_eq!(bad.status, 401, "{}", bad.body);
    let spans = collector
        .wait_for(
            "the refused delivery's span",
            Duration::from_secs(20),
            |s| {
                named(s, "POST /webhooks/{provider}")
                    .iter()
                    .any(|s| s.attr("fencehook.result") == Some("unauthorized"))
            },
        )
        .await;
    let refused = named(&spans, "POST /webhooks/{provider}")
        .into_iter()
        .find(|s| s.attr("fencehook.result") == Some("unauthorized"))
        .unwrap();
    assert_eq!(refused.attr("http.response.status_code"), Some("401"));
    assert_eq!(refused.status, 0, "a 4xx is not the server's error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_changes_no_answer_and_its_lost_spans_are_counted() {
    let ctx = TestContext::new().await;
    let dead = format!("http://127.0.0.1:{}", closed_port().await);
    let downstream = MockDownstream::start().await;
    let app = ServeProcess::start(&env(
        &ctx,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", dead),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000".to_owned()),
            ("FENCEHOOK_DOWNSTREAM_URL", downstream.url().to_string()),
        ],
    ))
    .await;
    let p = payment("pay_dead_collector", 700);
    let first = deliver(&app.base, &p, &[("traceparent", &traceparent())]).await;
    assert_eq!(
        (first.status, first.body["result"].as_str()),
        (200, Some("processed"))
    );
    let again = deliver(&app.base, &p, &[]).await;
    assert_eq!(
        (again.status, again.body["result"].as_str()),
        (200, Some("duplicate"))
    );
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(downstream.calls().len(), 1);
    wait_for(
        "the failed exports counted",
        Duration::from_secs(20),
        || async {
            app.metric(TRACE_SPANS_DROPPED_TOTAL, &[("reason", "export_failed")])
                .await
                > 0.0
        },
    )
    .await;
    assert!(!app
        .log_lines("could not export spans to the trace collector")
        .is_empty());
}

/// A collector that throttles (429 with `Retry-After`) makes the exporter
/// wait before it retries; the wait must not hold the thread the deliveries
/// run on. The instance runs on one runtime thread, so an exporter that
/// slept that thread would leave every delivery unanswered until its
/// first wait (8 s) was over.
#[tokio::test]
async fn a_throttling_collector_holds_up_no_delivery_while_the_exporter_waits_to_retry() {
    let ctx = TestContext::new().await;
    let throttling = Collector::throttling().await;
    let app = ServeProcess::start(&env(
        &ctx,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", throttling.endpoint()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "20000".to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50".to_owned()),
            ("TOKIO_WORKER_THREADS", "1".to_owned()),
        ],
    ))
    .await;
    let first = deliver(&app.base, &payment("pay_throttled_0", 100), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    wait_for(
        "an export refused with 429",
        Duration::from_secs(20),
        || async { !throttling.content_types().is_empty() },
    )
    .await;
    // The exporter now waits 8 s to retry; deliveries go on meanwhile.
    for i in 1..=5 {
        let p = payment(&format!("pay_throttled_{i}"), 100);
        let sent = tokio::time::timeout(Duration::from_secs(3), deliver(&app.base, &p, &[]))
            .await
            .expect("answered while the exporter waits to retry");
        assert_eq!(
            (sent.status, sent.body["result"].as_str()),
            (200, Some("processed"))
        );
    }
    assert_eq!(ctx.payments().await, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collector_holds_up_no_delivery_drops_and_counts_spans_and_bounds_the_shutdown() {
    let ctx = TestContext::new().await;
    let stalled = Collector::stalled().await;
    let mut app = ServeProcess::start(&env(
        &ctx,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", stalled.endpoint()),
            // The export hangs far longer than the test: only the queue
            // bound and the shutdown bound can end it.
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "600000".to_owned()),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "8".to_owned()),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4".to_owned()),
            ("FENCEHOOK_SHUTDOWN_TIMEOUT_MS", "2000".to_owned()),
        ],
    ))
    .await;
    for i in 0..20 {
        let sent = deliver(&app.base, &payment(&format!("pay_stall_{i}"), 100), &[]).await;
        assert_eq!(sent.status, 200, "{}", sent.body);
        assert_eq!(sent.body["result"], "processed");
    }
    assert_eq!(ctx.payments().await, 20);
    wait_for(
        "spans dropped on a full queue",
        Duration::from_secs(20),
        || async {
            app.metric(TRACE_SPANS_DROPPED_TOTAL, &[("reason", "queue_full")])
                .await
                > 0.0
        },
    )
    .await;
    // Shutdown gives up on the stalled export at the drain bound (2 s).
    let t = std::time::Instant::now();
    app.signal("TERM");
    let status = app
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("exits although the collector never answers");
    assert!(status.success(), "{status:?}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "exited after {:?}",
        t.elapsed()
    );
    assert!(!app
        .log_lines("were not exported within FENCEHOOK_SHUTDOWN_TIMEOUT_MS")
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_attempts_join_the_trace_their_event_was_accepted_under_linked_to_the_accept() {
    let ctx = TestContext::new().await;
    let collector = Collector::start().await;
    let downstream = MockDownstream::start().await;
    let app = ServeProcess::start(&env(
        &ctx,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
            ("FENCEHOOK_MODE", "inbox".to_owned()),
            ("FENCEHOOK_WORKERS", "2".to_owned()),
            ("FENCEHOOK_DOWNSTREAM_URL", downstream.url().to_string()),
        ],
    ))
    .await;
    let sent = deliver(
        &app.base,
        &payment("pay_inbox_traced", 300),
        &[("traceparent", &traceparent())],
    )
    .await;
    assert_eq!(
        (sent.status, sent.body["result"].as_str()),
        (200, Some("accepted"))
    );
    let spans = collector
        .wait_for("the accept and the attempt", Duration::from_secs(30), |s| {
            !named(s, "fencehook.inbox.attempt").is_empty() && !named(s, "POST").is_empty()
        })
        .await;
    let server = named(&spans, "POST /webhooks/{provider}")[0];
    let accept = named(&spans, "fencehook.inbox.accept")[0];
    assert_eq!(accept.trace_id, TRACE_ID);
    assert_eq!(accept.parent_span_id, server.span_id);
    let attempt = named(&spans, "fencehook.inbox.attempt")[0];
    assert_eq!(
        attempt.trace_id, TRACE_ID,
        "the attempt joins the PSP's trace"
    );
    assert_eq!(attempt.parent_span_id, accept.span_id);
    assert_eq!(
        attempt.links,
        vec![(TRACE_ID.to_owned(), accept.span_id.clone())],
        "linked to the accept"
    );
    assert_eq!(attempt.attr("fencehook.inbox.attempt"), Some("1"));
    assert_eq!(
        attempt.attr("fencehook.transaction_id"),
        Some("pay_inbox_traced")
    );
    // The worker's downstream call carries the same trace.
    let call = named(&spans, "POST")[0];
    assert_eq!(call.trace_id, TRACE_ID);
    wait_for("the downstream call", Duration::from_secs(10), || async {
        !downstream.calls().is_empty()
    })
    .await;
    assert_eq!(
        downstream.calls()[0].traceparent.as_deref(),
        Some(format!("00-{TRACE_ID}-{}-01", call.span_id).as_str())
    );
    wait_for("the payment booked", Duration::from_secs(10), || async {
        ctx.payment("pay_inbox_traced").await.map(|p| p.0) == Some("succeeded".to_owned())
    })
    .await;
}

/// `fencehook <command>` with `env` over a clean environment: exit code,
/// stdout, stderr.
fn run(command: &str, env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.arg(command);
    for (k, _) in std::env::vars() {
        if k.starts_with("FENCEHOOK_")
            || k.starts_with("OTEL_")
            || k == "DATABASE_URL"
            || k == "REDIS_URL"
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("FENCEHOOK_GENERIC_SECRET", SECRET)
        .env("FENCEHOOK_LISTEN", "127.0.0.1:0")
        .env("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:0")
        // Nothing answers there: a start that got past its settings would
        // wait for it, and the test would see no exit.
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // A start that got past its settings waits for the database: bounded,
    // so that such a regression fails instead of hanging.
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > end {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn check_config_says_where_traces_go_and_refuses_a_bad_trace_setting_in_one_line_naming_it() {
    let (code, out, err) = run("check-config", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l.ends_with("traces off")), "{out}");
    let (code, out, err) = run(
        "check-config",
        &[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://user:pw@otel.example:4318",
        )],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.ends_with("traces to https://otel.example:4318/v1/traces")),
        "{out}"
    );
    assert!(!out.contains("pw"), "{out}");
    for (setting, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "otel:4318"),
        ("OTEL_RESOURCE_ATTRIBUTES", "no-equals-sign"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
    ] {
        let mut env = vec![(setting, value)];
        if setting == "OTEL_TRACES_SAMPLER_ARG" {
            env.push(("OTEL_TRACES_SAMPLER", "traceidratio"));
        }
        let (code, _, err) = run("check-config", &env);
        assert_eq!(code, 2, "{setting}={value}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!("fencehook: invalid configuration: {setting}: ")),
            "{err}"
        );
    }
}

#[test]
fn serve_stops_at_start_on_a_bad_trace_setting_with_one_line_naming_it() {
    let (code, _, err) = run(
        "serve",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_SAMPLER", "sometimes"),
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("fencehook: invalid configuration: OTEL_TRACES_SAMPLER: "),
        "{err}"
    );
}
