//! The console at the edges of the admin listener: no body is read before
//! who asks is known (but a sign-in's, under a bound of its own), so slow
//! console clients cannot keep `/healthz` and `/readyz` out; `/readyz`
//! answers from a probe at most a second old; the console's statements are
//! bounded (replays in batches, up to what the dry run counted; counts
//! capped).

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::console::{form, Browser, TokenFiles};
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
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: fencehook\r\nconnection: close\r\n\r\n").as_bytes(),
    )
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
        if read_head(s, Duration::from_millis(200))
            .await
            .starts_with("HTTP/1.1 503")
        {
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
        (
            "/console/events/7/replay",
            "accept: application/json\r\n",
            "401",
        ),
        (
            "/console/logout",
            "authorization: Bearer not-a-token-of-ours\r\n",
            "401",
        ),
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
                head.to_ascii_lowercase()
                    .contains("location: /console/login"),
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
    wait_for(
        "/readyz names the schema",
        Duration::from_secs(10),
        || async {
            let (status, body) = app.get_admin("/readyz").await;
            status == 503 && body.contains("fencehook migrate")
        },
    )
    .await;
    db.batch_execute(show).await.unwrap();
    wait_for("/readyz 200", Duration::from_secs(10), || async {
        app.get_admin("/readyz").await.0 == 200
    })
    .await;
}

/// Inserts `n` inbox events `{prefix}{1..=n}` of this status (a dead one
/// died now, of a downstream 500), as the worker leaves them.
async fn insert_events(ctx: &TestContext, prefix: &str, n: i64, status: &str) {
    ctx.db()
        .await
        .execute(
            "INSERT INTO events (status, provider, transaction_id, event_type, delivery_id,
                                 fingerprint, canonical, body, attempts, last_error, finished_at)
             SELECT $3::text::event_status, 'generic', $1 || g, 'payment.succeeded',
                    $1 || g || ':payment.succeeded', 'fp', '{}', '{}', 1,
                    CASE WHEN $3 = 'dead' THEN 'the downstream answered 500' END,
                    CASE WHEN $3 = 'dead' THEN now() END
               FROM generate_series(1, $2::int8) g",
            &[&prefix, &n, &status],
        )
        .await
        .unwrap();
}

async fn dead_like(ctx: &TestContext, prefix: &str) -> i64 {
    ctx.count(&format!(
        "SELECT count(*) FROM events WHERE status = 'dead' AND transaction_id LIKE '{prefix}%'"
    ))
    .await
}

/// The confirmation replayed whatever matched when it was sent, not what
/// the dry run counted. Now its form carries the count and the time of it:
/// an event that died since (new, or older and dying later) is not
/// replayed by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_confirmed_replay_requeues_only_the_dead_events_its_dry_run_counted() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    insert_events(&ctx, "tx_counted_", 3, "dead").await;
    insert_events(&ctx, "tx_dies_later_", 1, "queued").await;
    let mut op = Browser::new(&app.admin);
    op.sign_in(&files.operator).await;
    let csrf = op.csrf().await;

    let filter = [("csrf", csrf.as_str()), ("provider", "generic")];
    let page = op.post("/console/events/replay", &filter, &[]).await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(
        page.text.contains(r#"name="count" value="3""#),
        "{}",
        page.text
    );
    let dry = op
        .request(
            "POST",
            "/console/events/replay",
            &[("accept", "application/json")],
            &form(&filter),
        )
        .await
        .json();
    assert_eq!(
        (dry["dry_run"].clone(), dry["matching"].clone()),
        (json!(true), json!(3)),
        "{dry}"
    );
    let as_of = dry["as_of"]
        .as_str()
        .expect("the time of the count")
        .to_owned();

    // After the count: two new events die, and one older one.
    insert_events(&ctx, "tx_after_", 2, "dead").await;
    ctx.db()
        .await
        .execute(
            "UPDATE events SET status = 'dead', finished_at = now(), last_error = 'late'
              WHERE transaction_id = 'tx_dies_later_1'",
            &[],
        )
        .await
        .unwrap();

    let confirm = [
        ("csrf", csrf.as_str()),
        ("provider", "generic"),
        ("count", "3"),
        ("as_of", as_of.as_str()),
        ("dry_run", "false"),
    ];
    let done = op
        .request(
            "POST",
            "/console/events/replay",
            &[("accept", "application/json")],
            &form(&confirm),
        )
        .await
        .json();
    assert_eq!(done["matching"], 3, "{done}");
    assert_eq!(
        dead_like(&ctx, "tx_counted_").await,
        0,
        "the three counted are re-queued"
    );
    assert_eq!(
        dead_like(&ctx, "tx_after_").await,
        2,
        "the new dead are not"
    );
    assert_eq!(
        dead_like(&ctx, "tx_dies_later_").await,
        1,
        "nor the one that died later"
    );
}

/// A replay of many re-queued every match in one statement and answered
/// every row. Now 500 per statement, and the answer lists the first 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_replay_requeues_in_batches_of_500_and_answers_the_first_100_rows() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    insert_events(&ctx, "tx_many_", 1234, "dead").await;
    let mut op = Browser::new(&app.admin);
    op.sign_in(&files.operator).await;
    let csrf = op.csrf().await;
    let confirm = [
        ("csrf", csrf.as_str()),
        ("count", "1234"),
        ("dry_run", "false"),
    ];
    let done = op
        .request(
            "POST",
            "/console/events/replay",
            &[("accept", "application/json")],
            &form(&confirm),
        )
        .await
        .json();
    assert_eq!(done["matching"], 1234, "{done:.300}");
    assert_eq!(done["batches"], 3, "500 + 500 + 234");
    assert_eq!(
        done["events"].as_array().unwrap().len(),
        fencehook::console::replay::EVENTS_SHOWN
    );
    assert_eq!(dead_like(&ctx, "tx_many_").await, 0);
    assert_eq!(
        ctx.count(
            "SELECT count(*) FROM events WHERE status = 'queued' AND errors @> '[{\"replay\": 1}]'"
        )
        .await,
        1234,
        "each re-queued once, its replay in its history"
    );
}

/// The overview counted every queued, processing and dead event on each
/// load. Now each count stops at 10,000 and reads "10,000+".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_overview_counts_inbox_events_up_to_ten_thousand_and_says_more() {
    let ctx = TestContext::new().await;
    let files = TokenFiles::new();
    let app = ctx.spawn(files.enable(ctx.config())).await;
    insert_events(&ctx, "tx_pile_", 10_050, "dead").await;
    insert_events(&ctx, "tx_few_", 1_234, "queued").await;
    let mut op = Browser::new(&app.admin);
    op.sign_in(&files.viewer).await;
    let overview = op.get_json("/console").await.json();
    let inbox = &overview["inbox"];
    assert_eq!(
        (
            inbox["dead"].clone(),
            inbox["queued"].clone(),
            inbox["cap"].clone()
        ),
        (json!(10_000), json!(1_234), json!(10_000)),
        "{inbox}"
    );
    let page = op.get("/console").await;
    assert!(page.text.contains("10,000+"), "{}", page.text);
    assert!(page.text.contains("1,234"), "{}", page.text);
    let events = op.get_json("/console/events?status=dead").await.json();
    assert_eq!(
        events["counts"]["dead"], 10_000,
        "{:.300}",
        events["counts"]
    );
}
