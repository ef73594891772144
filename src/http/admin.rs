//! Admin listener: `/metrics`, `/healthz`, `/readyz`, and the operator
//! console under `/console` when it is configured. Never on the public port.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::state::State;
use super::{json, Body};

pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (_, path) if crate::console::is_console_path(path) => {
            let shared = crate::console::Shared {
                console: state.console(),
                metrics: &state.metrics,
                recent: &state.recent,
            };
            crate::console::handle(shared, req).await
        }
        (&Method::GET, "/healthz") => json(StatusCode::OK, json!({"status": "ok"})),
        (&Method::GET, "/readyz") => readyz(&state).await,
        (&Method::GET, "/metrics") => {
            state.health.refresh_pool_gauges();
            let mut resp = Response::new(Body::from(state.metrics.render()));
            resp.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            resp
        }
        _ => json(StatusCode::NOT_FOUND, json!({"result": "not_found"})),
    }
}

/// 200 only when every check passes, the public listener is bound and the
/// process is not draining; the body names each check and its state.
/// Synchronous replication is always reported, and decides only with
/// `FENCEHOOK_REQUIRE_SYNC_REPLICATION=true`. The backends' checks are
/// at most [`crate::health::READYZ_CACHE`] old; listening and draining are now.
async fn readyz(state: &State) -> Response<Body> {
    let probe = state.health.probe_recent().await;
    let listening = state.is_listening();
    let draining = state.is_draining();
    let show = |r: &Result<(), String>| match r {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("error: {e}"),
    };
    let sync = match (&probe.sync_replication, probe.sync_required) {
        (Ok(()), _) => "ok".to_owned(),
        (Err(e), true) => format!("error: {e} (required)"),
        (Err(e), false) => format!("{e} (not required)"),
    };
    let body = json!({
        "postgres": show(&probe.postgres),
        "schema": show(&probe.schema),
        "lease_backend": show(&probe.lease),
        "synchronous_replication": sync,
        "listening": listening,
        "draining": draining,
    });
    let status = if probe.ok() && listening && !draining {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, body)
}
