//! A mock of a PSP's REST API (an outside party, so a mock is fair): JSON
//! objects served at their paths behind a Bearer key, as Mollie's payments
//! and refunds (and Stripe's objects of thin events) are. It records every
//! request and the most it ever had in flight at once, and can be slowed
//! down or made to fail.
//!
//! Mollie's objects are shaped as its API reference shows them (and as its
//! own Python client reads them: `psp_mollie`'s SDK test): a payment at
//! `/v2/payments/{id}`, its refunds at `/v2/payments/{id}/refunds`
//! (`_embedded.refunds`), an unknown id a 404 with Mollie's error body.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct Request {
    /// Path and query.
    pub path: String,
    pub headers: hyper::HeaderMap,
}

#[derive(Default)]
struct State {
    /// Path (without query) → JSON answered 200.
    objects: HashMap<String, Value>,
    requests: Vec<Request>,
    in_flight: usize,
    peak: usize,
    delay: Duration,
    /// Every request answered with this status (an API that is down).
    failing: Option<u16>,
}

pub struct MockApi {
    pub url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl MockApi {
    /// A mock answering requests that carry `Authorization: Bearer {key}`
    /// (401 otherwise).
    pub async fn start(key: &str) -> MockApi {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state: Arc<Mutex<State>> = Arc::default();
        let bearer = format!("Bearer {key}");
        let task = tokio::spawn({
            let state = state.clone();
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (state, bearer) = (state.clone(), bearer.clone());
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                            let (state, bearer) = (state.clone(), bearer.clone());
                            async move { Ok::<_, Infallible>(answer(&state, &bearer, req).await) }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            }
        });
        MockApi { url, state, task }
    }

    /// Serves `object` at `path`.
    pub fn put(&self, path: &str, object: Value) {
        self.state
            .lock()
            .unwrap()
            .objects
            .insert(path.to_owned(), object);
    }

    /// Every request waits `delay` before it is answered.
    pub fn slow_down(&self, delay: Duration) {
        self.state.lock().unwrap().delay = delay;
    }

    /// Every request is answered `status` (`None`: as usual again).
    pub fn fail_with(&self, status: Option<u16>) {
        self.state.lock().unwrap().failing = status;
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Requests whose path starts with `prefix`.
    pub fn hits(&self, prefix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.path.starts_with(prefix))
            .count()
    }

    /// The most requests the mock ever had in flight at once.
    pub fn peak_in_flight(&self) -> usize {
        self.state.lock().unwrap().peak
    }

    // ---- Mollie ---------------------------------------------------------

    /// Mollie's payment `id` in `status`, for `value` (a decimal string, as
    /// Mollie writes amounts) in `currency`, and its list of refunds (empty
    /// until [`MockApi::mollie_refunds`] fills it).
    pub fn mollie_payment(&self, id: &str, status: &str, value: &str, currency: &str) {
        self.put(
            &format!("/v2/payments/{id}"),
            mollie_payment(id, status, value, currency),
        );
        let listed = self
            .state
            .lock()
            .unwrap()
            .objects
            .contains_key(&format!("/v2/payments/{id}/refunds"));
        if !listed {
            self.mollie_refunds(id, &[]);
        }
    }

    /// The refunds of payment `id`: (refund id, status, value, currency).
    pub fn mollie_refunds(&self, id: &str, refunds: &[(&str, &str, &str, &str)]) {
        let embedded: Vec<Value> = refunds
            .iter()
            .map(|(re, status, value, currency)| {
                json!({
                    "resource": "refund",
                    "id": re,
                    "amount": {"value": value, "currency": currency},
                    "status": status,
                    "createdAt": "2026-12-01T10:05:00+00:00",
                    "description": "Order #12345",
                    "metadata": null,
                    "paymentId": id,
                    "_links": {
                        "self": {"href": format!("https://api.mollie.com/v2/payments/{id}/refunds/{re}"), "type": "application/hal+json"},
                        "payment": {"href": format!("https://api.mollie.com/v2/payments/{id}"), "type": "application/hal+json"}
                    }
                })
            })
            .collect();
        self.put(
            &format!("/v2/payments/{id}/refunds"),
            json!({
                "count": embedded.len(),
                "_embedded": {"refunds": embedded},
                "_links": {
                    "self": {"href": format!("https://api.mollie.com/v2/payments/{id}/refunds?limit=250"), "type": "application/hal+json"},
                    "previous": null,
                    "next": null,
                    "documentation": {"href": "https://docs.mollie.com/reference/list-refunds", "type": "text/html"}
                }
            }),
        );
        if !refunds.is_empty() {
            let path = format!("/v2/payments/{id}");
            let mut state = self.state.lock().unwrap();
            if let Some(payment) = state.objects.get_mut(&path) {
                payment["_links"]["refunds"] = json!({
                    "href": format!("https://api.mollie.com/v2/payments/{id}/refunds"),
                    "type": "application/hal+json"
                });
            }
        }
    }
}

impl Drop for MockApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A Mollie payment as `GET /v2/payments/{id}` answers it.
pub fn mollie_payment(id: &str, status: &str, value: &str, currency: &str) -> Value {
    let mut payment = json!({
        "resource": "payment",
        "id": id,
        "mode": "test",
        "createdAt": "2026-12-01T10:00:00+00:00",
        "amount": {"value": value, "currency": currency},
        "description": "Order #12345",
        "method": "ideal",
        "metadata": {"order_id": "12345"},
        "status": status,
        "isCancelable": false,
        "expiresAt": "2026-12-01T10:15:00+00:00",
        "profileId": "pfl_QkEhN94Ba",
        "sequenceType": "oneoff",
        "redirectUrl": "https://webshop.example.org/order/12345/",
        "webhookUrl": "https://webshop.example.org/payments/webhook/",
        "_links": {
            "self": {"href": format!("https://api.mollie.com/v2/payments/{id}"), "type": "application/hal+json"},
            "dashboard": {"href": format!("https://www.mollie.com/dashboard/org_12345678/payments/{id}"), "type": "text/html"},
            "documentation": {"href": "https://docs.mollie.com/reference/get-payment", "type": "text/html"}
        }
    });
    let at = match status {
        "paid" => Some("paidAt"),
        "failed" => Some("failedAt"),
        "canceled" => Some("canceledAt"),
        "expired" => Some("expiredAt"),
        "authorized" => Some("authorizedAt"),
        _ => None,
    };
    if let Some(at) = at {
        payment[at] = "2026-12-01T10:01:00+00:00".into();
    }
    if status == "paid" {
        payment["amountRefunded"] = json!({"value": "0.00", "currency": currency});
        payment["amountRemaining"] = json!({"value": value, "currency": currency});
        payment["settlementAmount"] = json!({"value": value, "currency": currency});
    }
    payment
}

async fn answer(
    state: &Mutex<State>,
    bearer: &str,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let delay = {
        let mut s = state.lock().unwrap();
        s.requests.push(Request {
            path: path.clone(),
            headers: req.headers().clone(),
        });
        s.in_flight += 1;
        s.peak = s.peak.max(s.in_flight);
        s.delay
    };
    tokio::time::sleep(delay).await;
    let authorized = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes() == bearer.as_bytes());
    let (status, body) = {
        let mut s = state.lock().unwrap();
        s.in_flight -= 1;
        let bare = path.split('?').next().unwrap_or("");
        match (s.failing, authorized, s.objects.get(bare)) {
            (Some(status), _, _) => (
                status,
                json!({"status": status, "title": "Service Unavailable"}),
            ),
            (None, false, _) => (
                401,
                json!({"status": 401, "title": "Unauthorized Request", "detail": "Missing authentication, or failed to authenticate"}),
            ),
            (None, true, Some(object)) => (200, object.clone()),
            (None, true, None) => (
                404,
                json!({"status": 404, "title": "Not Found", "detail": format!("No object exists at {bare}."),
                       "_links": {"documentation": {"href": "https://docs.mollie.com/overview/handling-errors", "type": "text/html"}}}),
            ),
        }
    };
    let mut resp = hyper::Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/hal+json"),
    );
    resp
}
