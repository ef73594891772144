//! The console at the edges of the admin listener: no body is read before
//! who asks is known (but a sign-in's, under a bound of its own), so slow
//! console clients cannot keep `/healthz` and `/readyz` out; `/readyz`
//! answers from a probe at most a second old; the console's statements are
//! bounded (replays in batches, up to what the dry run counted; counts
//! capped).

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::console::TokenFiles;
use crate::helpers::{socket_of, wait_for, TestContext};

/// Reads until the answer's head has arrived (or the connection closes, or
/// `limit` passes): what was received.
async fn read_head(stream: &mut TcpStream, limit: Duration) -> String {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let end = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(end, stream.read(&mut buf)).await {
            Err(_) | Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                received.extend_from_slice(&buf[..n]);
                if received.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    String::from_utf8_lossy(&received).into_owned()
}

/// A probe on a new connection, as a load balancer sends it: its answer's head.
async fn probe(admin: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(admin).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: fencehook\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_head(&mut s, Duration::from_secs(5)).await
}

/// 64 slow `POST /console/login` (their bodies arriving a byte at a time)
/// held every admin connection while their forms were read, up to 5 s: the
/// probes were answered 503 and the instance left the load balancer. Now
/// eight sign-in forms are read at once, the others are answered 503 unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_sign_ins_held_open_leave_healthz_and_readyz_answering_200() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    let admin = socket_of(&app.admin);
    let slow = fencehook::app::ADMIN_MAX_CONNECTIONS + 16;
    let mut held = Vec::new();
    for _ in 0..slow {
        let mut s = TcpStream::connect(admin).await.unwrap();
        s.write_all(
            b"POST /console/login HTTP/1.1\r\nhost: fencehook\r\n\
              content-type: application/x-www-form-urlencoded\r\ncontent-length: 4096\r\n\r\ntoken=",
        )
        .await
        .unwrap();
        held.push(s);
    }
    // Longer than the old form timeout (5 s) lasted: the bodies keep coming.
    let until = Instant::now() + Duration::from_secs(6);
    let mut probes = 0;
    while Instant::now() < until {
        for s in &mut held {
            let _ = s.write_all(b"a").await;
        }
        for path in ["/healthz", "/readyz"] {
            let head = probe(admin, path).await;
            assert!(
                head.starts_with("HTTP/1.1 200"),
                "{path} after {probes} probes: {head:.200}"
            );
            probes += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut unread = 0;
    for s in &mut held {
        if read_head(s, Duration::from_millis(200)).await.starts_with("HTTP/1.1 503") {
            unread += 1;
        }
    }
    assert!(
        unread >= slow - fencehook::console::SIGNIN_READS,
        "{unread} of {slow} sign-ins answered 503 unread"
    );
    eprintln!("{probes} probes answered 200 while {slow} slow sign-ins were held; {unread} answered 503 unread");
}

/// A POST to a console write path without a session is answered before its
/// body is sent: the form of someone nobody signed in is never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unauthenticated_post_to_a_console_write_path_is_answered_before_its_body_is_sent() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    let admin = socket_of(&app.admin);
    for (path, extra, status) in [
        ("/console/events/replay", "", "303"),
        ("/console/events/7/replay", "accept: application/json\r\n", "401"),
        ("/console/logout", "authorization: Bearer not-a-token-of-ours\r\n", "401"),
    ] {
        let mut s = TcpStream::connect(admin).await.unwrap();
        s.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nhost: fencehook\r\n{extra}\
                 content-type: application/x-www-form-urlencoded\r\ncontent-length: 64\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        // The body is never sent: an answer at all is one given without it
        // (one that waited for it would be a 400 after the form timeout).
        let head = read_head(&mut s, Duration::from_secs(10)).await;
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status}")),
            "{path}: {head:.300}"
        );
        if status == "303" {
            assert!(
                head.to_ascii_lowercase().contains("location: /console/login"),
                "{head}"
            );
        }
    }
}

/// `/readyz` probed the backends on each request, a connection of the
/// delivery pool each time. Now it answers from a probe at most a second
/// old: a change at the database shows at the next probe after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_answers_from_a_probe_at_most_a_second_old() {
    let ctx = TestContext::new().await;
    let app = ctx.spawn(ctx.config()).await;
    let db = ctx.db().await;
    let hide = "ALTER TABLE refinery_schema_history RENAME TO refinery_schema_history_hidden";
    let show = "ALTER TABLE refinery_schema_history_hidden RENAME TO refinery_schema_history";
    let mut cached = None;
    for _ in 0..5 {
        // The first /readyz of a quiet second probes; the next one within
        // the second answers from it, though the schema is gone meanwhile.
        let first = Instant::now();
        let (status, body) = app.get_admin("/readyz").await;
        assert_eq!(status, 200, "{body}");
        db.batch_execute(hide).await.unwrap();
        let (status, body) = app.get_admin("/readyz").await;
        let within = first.elapsed() < Duration::from_millis(900);
        db.batch_execute(show).await.unwrap();
        if within {
            cached = Some((status, body));
            break;
        }
        // Too slow a round on a loaded machine: again, once the cache aged.
        wait_for("/readyz 200 again", Duration::from_secs(10), || async {
            app.get_admin("/readyz").await.0 == 200
        })
        .await;
    }
    let (status, body) = cached.expect("a round within the cache's second");
    assert_eq!(status, 200, "answered from the first probe: {body}");

    // Past the second, the change shows.
    db.batch_execute(hide).await.unwrap();
    wait_for("/readyz names the schema", Duration::from_secs(10), || async {
        let (status, body) = app.get_admin("/readyz").await;
        status == 503 && body.contains("fencehook migrate")
    })
    .await;
    db.batch_execute(show).await.unwrap();
    wait_for("/readyz 200", Duration::from_secs(10), || async {
        app.get_admin("/readyz").await.0 == 200
    })
    .await;
}
