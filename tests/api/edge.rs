//! The HTTP edge under hostile or unlucky clients: a drain bound that is
//! kept, bodies that stall, more connections than allowed, oversized headers,
//! ambiguous JSON, floods of refusals in the log, and scans.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::process::ServeProcess;
use crate::helpers::{client, now, payment, socket_of, wait_for, TestApp, TestContext, SECRET};

/// What a raw connection received until the peer closed it (or reset it), or
/// until `limit`: (the bytes as text, whether it was closed).
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let end = Instant::now() + limit;
    let closed = loop {
        match tokio::time::timeout_at(end, stream.read(&mut buf)).await {
            Err(_) => break false,
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
        }
    };
    (String::from_utf8_lossy(&received).into_owned(), closed)
}

fn public_addr(app: &TestApp) -> SocketAddr {
    socket_of(&app.base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_drain_timeout_a_stuck_delivery_is_cut_off_unanswered_and_books_nothing() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.gate_token(1);
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    cfg.shutdown_timeout = Duration::from_millis(500);
    let app = ctx.spawn(cfg.clone()).await;
    let url = format!("{}/webhooks/generic", app.base);
    let p = payment("tx_cut", 700);
    let in_flight = tokio::spawn({
        let body = p.to_string();
        async move {
            let id = "msg_cut";
            let ts = now();
            let sig =
                fencehook::providers::standard::sign(SECRET, id, ts, body.as_bytes()).unwrap();
            let req = hyper::Request::post(url)
                .header("content-type", "application/json")
                .header("webhook-id", id)
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", sig)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            client()
                .request(req)
                .await
                .map(|resp| resp.status().as_u16())
        }
    });
    wait_for("the downstream call", Duration::from_secs(5), || async {
        !downstream.calls().is_empty()
    })
    .await;
    tokio::time::timeout(Duration::from_secs(5), app.stop())
        .await
        .expect("stop() returns once the drain bound has passed, not when the delivery ends");
    // Only now may the stuck call go on: nothing of the cut delivery may act on it.
    downstream.open_gate();
    let answered = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("the client is not left waiting")
        .unwrap();
    let err = answered.expect_err("a cut delivery is never answered, least of all 200");
    assert!(
        !err.is_connect(),
        "the request was sent, then its connection closed: {err:?}"
    );
    assert_eq!(ctx.entries().await, 0, "no ledger entry");
    assert_eq!(
        ctx.payment("tx_cut").await,
        Some(("processing".to_owned(), 1)),
        "claimed, never finalised"
    );
    wait_for(
        "the dropped lease guard releases in the background",
        Duration::from_secs(5),
        || async { !ctx.redis_keys().await.contains(&ctx.lock_key("tx_cut")) },
    )
    .await;
    // The PSP's retry resumes the claim under a newer token and books it once.
    let app = ctx.spawn(cfg).await;
    assert_eq!(app.deliver(&p).await.result(), "processed");
    assert_eq!(ctx.entries().await, 1);
    ctx.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_stalls_is_answered_408_after_the_body_timeout_and_the_connection_closed() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config();
    cfg.body_timeout = Duration::from_secs(1);
    let app = ctx.spawn(cfg).await;
    let mut stream = TcpStream::connect(public_addr(&app)).await.unwrap();
    stream
        .write_all(
            b"POST /webhooks/generic HTTP/1.1\r\nhost: fencehook\r\n\
              content-type: application/json\r\ncontent-length: 100\r\n\r\n\
              {\"transaction_id\": \"tx_slow\",",
        )
        .await
        .unwrap();
    let sent = Instant::now();
    let (reply, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(
        sent.elapsed() >= Duration::from_millis(900),
        "not before the timeout: {:?}",
        sent.elapsed()
    );
    assert!(
        reply.to_ascii_lowercase().contains("connection: close"),
        "{reply}"
    );
    assert!(reply.contains("request_timeout"), "{reply}");
    assert!(closed, "the connection is closed after the 408");
    assert_eq!(
        app.metric("fencehook_webhooks_total", &[("result", "request_timeout")]),
        1.0
    );
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_max_connections_a_new_connection_gets_a_quick_503_while_the_admin_port_answers() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config();
    cfg.max_connections = 8;
    let app = ctx.spawn(cfg).await;
    let addr = public_addr(&app);
    let open = || app.metric("fencehook_connections_open", &[("listener", "public")]);
    // The listener accepts in arrival order: by the time the ninth is
    // accepted, the eight before it hold every slot.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut ninth = TcpStream::connect(addr).await.unwrap();
    let _ = ninth
        .write_all(
            b"POST /webhooks/generic HTTP/1.1\r\nhost: fencehook\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
    // The refusal is written (and the socket half-closed) at once; the
    // margin is for a loaded machine, not for the server.
    let (reply, closed) = read_until_closed(&mut ninth, Duration::from_secs(5)).await;
    assert!(
        reply.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{reply:?}"
    );
    assert!(reply.contains("\r\nRetry-After: 1\r\n"), "{reply:?}");
    assert!(reply.contains("\r\nConnection: close\r\n"), "{reply:?}");
    assert!(closed, "closed right after the 503");
    // Each accepted connection is counted by its own task, which the
    // scheduler may run after the refusal's: the gauge is waited for.
    wait_for(
        "the eight idle ones are counted open",
        Duration::from_secs(5),
        || async { open() == 8.0 },
    )
    .await;
    // /healthz, not /readyz: what is asserted is that the admin listener
    // still accepts and answers, not how fast the database probe is on a
    // loaded machine.
    let (status, body) = app.get_admin("/healthz").await;
    assert_eq!(status, 200, "the admin listener has its own cap: {body}");
    assert_eq!(open(), 8.0, "the eight idle ones are still open");
    assert_eq!(
        app.metric(
            "fencehook_connections_refused_total",
            &[("listener", "public")]
        ),
        1.0
    );

    drop(idle);
    wait_for(
        "the idle connections are gone",
        Duration::from_secs(5),
        || async { open() == 0.0 },
    )
    .await;
    assert_eq!(
        app.deliver(&payment("tx_after_full", 100)).await.result(),
        "processed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_200_kb_header_block_is_refused_and_the_next_delivery_is_served() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let body = payment("tx_big_head", 100).to_string();
    let (id, ts) = ("msg_big_head", now());
    let sig = fencehook::providers::standard::sign(SECRET, id, ts, body.as_bytes()).unwrap();
    let request = format!(
        "POST /webhooks/generic HTTP/1.1\r\nhost: fencehook\r\nconnection: close\r\n\
         content-type: application/json\r\nwebhook-id: {id}\r\nwebhook-timestamp: {ts}\r\n\
         webhook-signature: {sig}\r\nx-padding: {}\r\ncontent-length: {}\r\n\r\n{body}",
        "a".repeat(200 * 1024),
        body.len()
    );
    let mut stream = TcpStream::connect(public_addr(&app)).await.unwrap();
    // The server may stop reading (and close) before all of it is written.
    let _ = stream.write_all(request.as_bytes()).await;
    let (reply, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 431"),
        "refused with 431 or closed: {:.200}",
        reply
    );
    assert!(closed);
    assert_eq!(
        ctx.payments().await,
        0,
        "the oversized request was not processed"
    );
    assert_eq!(
        app.deliver(&payment("tx_after_big_head", 100))
            .await
            .result(),
        "processed"
    );
    // The cap is on the head: a body larger than it still goes through.
    let mut large_body = payment("tx_large_body", 100);
    large_body["padding"] = "x".repeat(60 * 1024).into();
    assert_eq!(app.deliver(&large_body).await.result(), "processed");
}

/// A signed delivery of `tx` as raw bytes, its head `head_bytes` long
/// (padded with one header) or as short as it can be (`None`).
fn signed_request(tx: &str, head_bytes: Option<usize>) -> String {
    let body = payment(tx, 100).to_string();
    let (id, ts) = (format!("msg_{tx}"), now());
    let sig = fencehook::providers::standard::sign(SECRET, &id, ts, body.as_bytes()).unwrap();
    let head = |pad: usize| {
        format!(
            "POST /webhooks/generic HTTP/1.1\r\nhost: fencehook\r\nconnection: close\r\n\
             content-type: application/json\r\nwebhook-id: {id}\r\nwebhook-timestamp: {ts}\r\n\
             webhook-signature: {sig}\r\ncontent-length: {}\r\nx-padding: {}\r\n\r\n",
            body.len(),
            "a".repeat(pad)
        )
    };
    let pad = head_bytes.map_or(0, |n| n - head(0).len());
    let request = format!("{}{body}", head(pad));
    if let Some(n) = head_bytes {
        assert_eq!(request.len() - body.len(), n);
    }
    request
}

/// A signed delivery whose head is `head_bytes` long, sent whole on a fresh
/// connection: what came back.
async fn deliver_with_head_of(app: &TestApp, tx: &str, head_bytes: usize) -> String {
    let request = signed_request(tx, Some(head_bytes));
    let mut stream = TcpStream::connect(public_addr(app)).await.unwrap();
    let _ = stream.write_all(request.as_bytes()).await;
    read_until_closed(&mut stream, Duration::from_secs(5))
        .await
        .0
}

/// The reference says 32 KiB; hyper's buffer once let heads of about
/// 48 KiB through. A head of 32 KiB is served, one byte more is 431,
/// whatever the size of the reads that bring it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_request_head_limit_is_the_documented_32_kib() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let limit = fencehook::http::MAX_HEAD_BYTES;
    assert_eq!(limit, 32 * 1024);
    let reply = deliver_with_head_of(&app, "tx_head_at", limit).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:.300}");
    for (tx, size) in [
        ("tx_head_over", limit + 1),
        ("tx_head_33k", limit + 1024),
        ("tx_head_40k", 40 * 1024),
        ("tx_head_47k", 47 * 1024),
    ] {
        let reply = deliver_with_head_of(&app, tx, size).await;
        assert!(
            reply.starts_with("HTTP/1.1 431") || reply.is_empty(),
            "{size}: {reply:.300}"
        );
    }
    assert_eq!(ctx.payments().await, 1, "only the head within the limit");
}

/// `Expect: 100-continue` asks the server whether to send the body. It is
/// answered only for a delivery to a known provider's path that carries its
/// signature header: elsewhere the final answer comes at once and no body
/// is invited (an unsigned one was invited before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expect_100_continue_is_answered_only_for_a_known_provider_and_a_signature_header() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let ask = |path: &'static str, extra: &'static str| {
        let addr = public_addr(&app);
        async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(
                    format!(
                        "POST {path} HTTP/1.1\r\nhost: fencehook\r\nconnection: close\r\n\
                         content-type: application/json\r\nexpect: 100-continue\r\ncontent-length: 2\r\n{extra}\r\n"
                    )
                    .as_bytes(),
                )
                .await
                .unwrap();
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .expect("an answer within 5 s")
                .unwrap();
            let first = String::from_utf8_lossy(&buf[..n]).into_owned();
            (stream, first)
        }
    };
    for path in ["/webhooks/nope", "/elsewhere", "/webhooks/generic/x"] {
        let (_, first) = ask(path, "").await;
        assert!(first.starts_with("HTTP/1.1 404"), "{path}: {first:.200}");
    }
    let (_, first) = ask("/webhooks/generic", "").await;
    assert!(
        first.starts_with("HTTP/1.1 401") && first.contains("unauthorized"),
        "no signature header, no body invited: {first:.200}"
    );
    let signed = "webhook-id: msg_1\r\nwebhook-timestamp: 1\r\nwebhook-signature: v1,x\r\n";
    let (mut stream, first) = ask("/webhooks/generic", signed).await;
    assert!(first.starts_with("HTTP/1.1 100 Continue"), "{first:.200}");
    stream.write_all(b"{}").await.unwrap();
    let (rest, _) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(
        format!("{first}{rest}").contains("HTTP/1.1 401"),
        "unsigned: {first}{rest}"
    );
}

/// One keep-alive connection that sends an unsigned delivery, reads its
/// 401, and sends the next every `every`, until the test ends.
async fn unsigned_keep_alive(addr: SocketAddr, every: Duration) {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return;
    };
    let request = b"POST /webhooks/generic HTTP/1.1\r\nhost: fencehook\r\n\
        content-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let mut buf = [0u8; 4096];
    loop {
        if stream.write_all(request).await.is_err() {
            return;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        tokio::time::sleep(every).await;
    }
}

/// 1,024 keep-alive connections from one client, one unsigned request each
/// every 8 s, once locked every provider out (503) for as long as they
/// ran. Now one peer address holds at most its share of the slots, and
/// another client's signed delivery is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keep_alive_flood_from_one_peer_cannot_lock_out_another_clients_signed_delivery() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config();
    cfg.max_connections = 64;
    cfg.max_connections_per_peer = 16;
    let app = ctx.spawn(cfg).await;
    let addr = public_addr(&app);
    let flood: Vec<_> = (0..96)
        .map(|_| tokio::spawn(unsigned_keep_alive(addr, Duration::from_millis(300))))
        .collect();
    let open = || app.metric("fencehook_connections_open", &[("listener", "public")]);
    let refused = || {
        app.metric(
            "fencehook_connections_refused_total",
            &[("listener", "public"), ("reason", "per_peer")],
        )
    };
    wait_for(
        "the flood is refused past its share",
        Duration::from_secs(10),
        || async { refused() >= 80.0 },
    )
    .await;
    assert_eq!(open(), 16.0, "one peer holds its share, no more");

    // Another client: another address on the loopback network.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let started = Instant::now();
    let mut stream = socket.connect(addr).await.unwrap();
    stream
        .write_all(signed_request("tx_beside_the_flood", None).as_bytes())
        .await
        .unwrap();
    let (reply, _) = read_until_closed(&mut stream, Duration::from_secs(2)).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:.300}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(
        app.metric(
            "fencehook_connections_refused_total",
            &[("listener", "public"), ("reason", "max_connections")],
        ),
        0.0
    );
    for f in flood {
        f.abort();
    }
}

/// Answers on one keep-alive connection until the server closes it: each
/// answer's head, and whether it said `Connection: close`.
async fn requests_until_closed(app: &TestApp, limit: usize) -> Vec<bool> {
    let mut stream = TcpStream::connect(public_addr(app)).await.unwrap();
    let mut closes = Vec::new();
    let mut buf = [0u8; 4096];
    for _ in 0..limit {
        if stream
            .write_all(b"GET /webhooks/generic HTTP/1.1\r\nhost: fencehook\r\n\r\n")
            .await
            .is_err()
        {
            break;
        }
        let n = match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => break,
        };
        let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 405"), "{head}");
        closes.push(head.contains("\r\nconnection: close\r\n"));
        if closes.last() == Some(&true) {
            let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
            assert!(closed, "closed after the answer that said so");
            break;
        }
    }
    closes
}

/// A client that keeps sending on one connection keeps it no longer than
/// its request budget and its age allow: the last answer says
/// `Connection: close`, then the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keep_alive_connection_is_closed_after_its_requests_or_its_age() {
    let ctx = TestContext::new().await;
    let mut cfg = ctx.config();
    cfg.connection_max_requests = 3;
    let app = ctx.spawn(cfg.clone()).await;
    assert_eq!(requests_until_closed(&app, 10).await, [false, false, true]);
    app.stop().await;

    cfg.connection_max_requests = 1000;
    cfg.connection_max_age = Duration::from_secs(1);
    let app = ctx.spawn(cfg).await;
    let started = Instant::now();
    let mut stream = TcpStream::connect(public_addr(&app)).await.unwrap();
    let mut buf = [0u8; 4096];
    let closed_at = loop {
        assert!(started.elapsed() < Duration::from_secs(10), "never closed");
        stream
            .write_all(b"GET /webhooks/generic HTTP/1.1\r\nhost: fencehook\r\n\r\n")
            .await
            .unwrap();
        let n = stream.read(&mut buf).await.unwrap();
        let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
        if head.contains("\r\nconnection: close\r\n") {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(closed_at >= Duration::from_secs(1), "{closed_at:?}");
    let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(closed);
}

/// 64 half-open connections to the admin listener once made `/healthz` and
/// `/readyz` answer 503: the instance left the load balancer. Now a new
/// connection takes the place of the oldest one that sent no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn half_open_connections_to_the_admin_listener_cannot_keep_the_probes_out() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let admin = socket_of(&app.admin);
    let mut half_open = Vec::new();
    for _ in 0..fencehook::app::ADMIN_MAX_CONNECTIONS * 2 {
        let mut s = TcpStream::connect(admin).await.unwrap();
        let _ = s.write_all(b"GET /hea").await;
        half_open.push(s);
    }
    for path in ["/healthz", "/readyz"] {
        let started = Instant::now();
        let mut s = TcpStream::connect(admin).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: fencehook\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let (reply, _) = read_until_closed(&mut s, Duration::from_secs(2)).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{path}: {reply:.300}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{path}: {:?}",
            started.elapsed()
        );
    }
    drop(half_open);
}

/// Replaying one captured batch gave 73,276 `duplicate` answers in 3 s and
/// 12.5 MB of log, one line each. Their outcome is already durable (and
/// was logged when booked): their lines are sampled, every one is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replayed_copies_answered_duplicate_are_counted_in_full_but_logged_in_a_few_lines() {
    let ctx = TestContext::new().await;
    let server = ServeProcess::start(&[
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
    ])
    .await;
    let p = payment("tx_replayed", 100);
    assert_eq!(server.deliver(&p).await.result(), "processed");
    let copies = 300;
    let results: Vec<String> = stream::iter(0..copies)
        .map(|_| async { server.deliver(&p).await.result().to_owned() })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(results.iter().all(|r| r == "duplicate"), "{results:?}");
    let counted = server
        .metric(
            "fencehook_webhooks_total",
            &[("provider", "generic"), ("result", "duplicate")],
        )
        .await;
    assert_eq!(counted, copies as f64, "every copy is counted");
    let lines = server.logs.lock().unwrap().clone();
    let logged = |result: &str| {
        lines
            .iter()
            .filter(|l| l.contains(&format!("\"result\":\"{result}\"")))
            .count()
    };
    assert_eq!(
        logged("processed"),
        1,
        "the booking's line is always written"
    );
    assert!(
        logged("duplicate") < 40,
        "{} lines for {copies} copies",
        logged("duplicate")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_payload_that_repeats_a_key_is_400_naming_it_and_writes_nothing() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    // Last wins for serde_json, first wins elsewhere: which amount was meant?
    let body = r#"{"transaction_id":"tx_dup_key","amount":1000,"currency":"EUR","event_type":"payment.succeeded","amount":9999}"#;
    let r = app
        .post_signed("generic", body.as_bytes(), now(), SECRET)
        .await;
    assert_eq!(
        (r.status, r.result()),
        (400, "invalid_payload"),
        "{}",
        r.text
    );
    let reason = r.body["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("\"amount\""),
        "the reason names the key: {reason}"
    );
    ctx.assert_nothing_written().await;
}

/// Lines mentioning an unauthorized delivery, and the sum of the refusals
/// they say were left out.
fn tally_unauthorized(lines: &[String]) -> (u64, u64) {
    let mut logged = 0;
    let mut suppressed = 0;
    for line in lines.iter().filter(|l| l.contains("unauthorized")) {
        logged += 1;
        if let Some(at) = line.find("suppressed=") {
            let digits: String = line[at + "suppressed=".len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            suppressed += digits.parse::<u64>().unwrap_or(0);
        }
    }
    (logged, suppressed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unsigned_flood_is_counted_in_full_but_logged_in_a_few_plain_lines() {
    let ctx = TestContext::new().await;
    let server = ServeProcess::start(&[
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
        ("FENCEHOOK_LOG_FORMAT", "text".to_owned()),
    ])
    .await;
    let url = format!("{}/webhooks/generic", server.base);
    let http = client();
    let unsigned = |i: u32| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let body = payment(&format!("tx_flood_{i}"), 100).to_string();
            let req = hyper::Request::post(url)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            http.request(req)
                .await
                .map_or(0, |resp| resp.status().as_u16())
        }
    };
    let statuses: Vec<u16> = stream::iter(0..500)
        .map(&unsigned)
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(statuses.iter().all(|&s| s == 401), "{statuses:?}");
    let mut sent = 500;
    // Every refusal is either logged or counted by the next line logged; one
    // more now and then ends the window the flood filled, so that a line
    // reports what it left out.
    let end = Instant::now() + Duration::from_secs(15);
    let (logged, suppressed) = loop {
        let (logged, suppressed) = tally_unauthorized(&server.logs.lock().unwrap());
        if logged + suppressed == sent || Instant::now() >= end {
            break (logged, suppressed);
        }
        assert_eq!(unsigned(sent as u32).await, 401);
        sent += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let lines = server.logs.lock().unwrap().clone();
    let bytes: usize = lines
        .iter()
        .filter(|l| l.contains("unauthorized"))
        .map(|l| l.len() + 1)
        .sum();
    println!(
        "{sent} unauthorized deliveries: {logged} log lines ({bytes} bytes), \
         {suppressed} counted as left out"
    );
    assert!(
        lines.iter().all(|l| !l.contains('\x1b')),
        "no colour codes in a pipe: {:?}",
        lines.iter().find(|l| l.contains('\x1b'))
    );
    assert!(logged < 20, "{logged} lines for {sent} refusals");
    assert_eq!(
        logged + suppressed,
        sent,
        "every refusal is logged or counted as left out"
    );
    assert_eq!(
        server
            .metric("fencehook_webhooks_total", &[("result", "unauthorized")])
            .await,
        sent as f64,
        "the metric counts every one"
    );
}

/// A 401's body says only `unauthorized`: its log line says what failed,
/// so that a wrong secret is told from a clock that is off, and never
/// carries the secret or the signature.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unauthorized_line_says_whether_the_timestamp_or_the_signature_failed() {
    let ctx = TestContext::new().await;
    let server = ServeProcess::start(&[
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
    ])
    .await;
    let post = |tx: &str, ts: i64, secret: &str| {
        let body = payment(tx, 100).to_string();
        let id = format!("msg_{tx}");
        let sig = fencehook::providers::standard::sign(secret, &id, ts, body.as_bytes()).unwrap();
        let req = hyper::Request::post(format!("{}/webhooks/generic", server.base))
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sig)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        async move { client().request(req).await.unwrap().status().as_u16() }
    };
    let other_secret = "whsec_b3RoZXItc2VjcmV0LW5vdC10aGUtcHJvdmlkZXJzLW93bg==";
    assert_eq!(post("tx_stale", now() - 3600, SECRET).await, 401);
    assert_eq!(post("tx_forged", now(), other_secret).await, 401);
    // In the order sent: the stale one's line, then the forged one's.
    let causes = || -> Vec<String> {
        server
            .logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("\"result\":\"unauthorized\""))
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|v| v["cause"].as_str().unwrap_or("(no cause)").to_owned())
            .collect()
    };
    wait_for("both refusals logged", Duration::from_secs(10), || async {
        causes().len() >= 2
    })
    .await;
    assert_eq!(
        causes(),
        [
            "webhook-timestamp outside tolerance",
            "signature does not match"
        ]
    );
    let lines = server.logs.lock().unwrap().clone();
    assert!(
        lines
            .iter()
            .all(|l| !l.contains(SECRET) && !l.contains(other_secret)),
        "{lines:#?}"
    );
    ctx.assert_nothing_written().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scans_keep_their_404_and_405_and_are_counted_by_a_bounded_reason() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let json = [("content-type", "application/json")];
    assert_eq!(
        app.post("/webhooks/nope", &json, b"{}".to_vec())
            .await
            .status,
        404
    );
    assert_eq!(app.post("/other", &json, b"{}".to_vec()).await.status, 404);
    let get = client()
        .request(
            hyper::Request::get(format!("{}/webhooks/generic", app.base))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(get.status().as_u16(), 405);
    assert_eq!(get.headers()["allow"], "POST");
    for reason in ["unknown_provider", "not_found", "method_not_allowed"] {
        assert_eq!(
            app.metric("fencehook_requests_rejected_total", &[("reason", reason)]),
            1.0,
            "{reason}"
        );
    }
    let (_, exposition) = app.get_admin("/metrics").await;
    assert!(
        !exposition.contains("nope"),
        "a requested name never becomes a label"
    );
    ctx.assert_nothing_written().await;
}
