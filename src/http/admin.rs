//! Admin listener: `/metrics`, `/healthz`, `/readyz`. Never on the public port.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::{json, Body};
use crate::app::State;

pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => json(StatusCode::OK, json!({"status": "ok"})),
        (&Method::GET, "/readyz") => readyz(&state).await,
        (&Method::GET, "/metrics") => {
            state.refresh_gauges();
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

async fn readyz(state: &State) -> Response<Body> {
    let (pg, lease) = state.probe_backends().await;
    let draining = state.is_draining();
    let show = |r: &Result<(), String>| match r {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("error: {e}"),
    };
    let body = json!({
        "postgres": show(&pg),
        "lease_backend": show(&lease),
        "draining": draining,
    });
    let ok = pg.is_ok() && lease.is_ok() && !draining;
    json(
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        body,
    )
}
