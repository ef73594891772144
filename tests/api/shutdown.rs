//! Graceful shutdown: stop accepting, finish in-flight work, release leases.

use std::time::Duration;

use crate::helpers::downstream::MockDownstream;
use crate::helpers::{payment, wait_for, TestContext};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_during_a_slow_delivery_finishes_it_releases_the_lease_and_turns_unready() {
    let ctx = TestContext::new().await;
    let downstream = MockDownstream::start().await;
    downstream.set_delay(Duration::from_millis(1500));
    let mut cfg = ctx.config();
    cfg.downstream_url = Some(downstream.url());
    let app = ctx.spawn(cfg).await;
    let (base, admin) = (app.base.clone(), app.admin.clone());
    let state = app.state.clone();
    let p = payment("tx_shutdown", 321);
    let in_flight = {
        let (base, p) = (base.clone(), p.clone());
        tokio::spawn(async move { crate::helpers::process::deliver_to(&base, &p).await.status })
    };
    wait_for("the downstream call", Duration::from_secs(5), || async {
        !downstream.calls().is_empty()
    })
    .await;
    let stopping = tokio::spawn(app.stop());
    wait_for("draining", Duration::from_secs(5), || async {
        state.is_draining()
    })
    .await;
    let ready = crate::helpers::client()
        .request(
            hyper::Request::get(format!("{admin}/readyz"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        ready.status().as_u16(),
        503,
        "readiness turns 503 as soon as draining starts"
    );
    assert_eq!(
        in_flight.await.unwrap(),
        200,
        "the in-flight delivery finished"
    );
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("stops within the drain bound")
        .unwrap();
    assert_eq!(ctx.payment("tx_shutdown").await.unwrap().0, "succeeded");
    assert_eq!(ctx.entries().await, 1);
    assert!(
        ctx.redis_keys().await.iter().all(|k| !k.ends_with(":lock")),
        "lease released"
    );
    let refused = crate::helpers::client()
        .request(
            hyper::Request::post(format!("{base}/webhooks/generic"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap(),
        )
        .await;
    assert!(refused.is_err(), "no longer accepting");
}
