//! A mock of the PSPs' events APIs (outside parties, so a mock is fair): a
//! small hyper server that implements what fencehook relies on of them.
//!
//! - Stripe `GET /v1/events`: `Authorization: Bearer <key>` (401 without
//!   it), newest first, `limit` (default 10, at most 100), `created[gte]`,
//!   `created[lte]`, `types[]` (any of), `starting_after` (the page after
//!   that event), `{"object":"list","data":[…],"has_more":…}`.
//! - PayPal `POST /v1/oauth2/token` (Basic auth, client credentials) and
//!   `GET /v1/notifications/webhooks-events` (Bearer token, `start_time`,
//!   `end_time`, `page_size`, a `next` link while more remain).
//!
//! A switch makes it answer 429 with `Retry-After`, 500, or stall (never
//! answer), for the next N requests or all of them; it counts requests and
//! the most it had in flight at once.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// The Stripe key the mock takes.
pub const STRIPE_KEY: &str = "sk_test_fencehookReconcileMockKey01";
/// PayPal's client id and secret the mock takes, and the token it issues.
pub const PAYPAL_CLIENT_ID: &str = "fencehook-mock-client";
pub const PAYPAL_CLIENT_SECRET: &str = "fencehook-mock-client-secret";
const PAYPAL_TOKEN: &str = "A21AAmockTokenForFencehook";

/// What the mock answers instead of the truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// 429 with `Retry-After: secs`.
    RateLimited {
        retry_after_secs: u64,
    },
    /// 500.
    Down,
    /// Never answers.
    Stall,
}

#[derive(Default)]
struct State {
    stripe: Vec<Value>,
    paypal: Vec<Value>,
    /// The fault, and for how many more requests (`None`: all of them).
    fault: Option<(Fault, Option<usize>)>,
    /// When each request arrived.
    arrivals: Vec<Instant>,
}

pub struct MockPspApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockPspApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockPspApi {
    pub async fn start() -> MockPspApi {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let task = {
            let (state, in_flight, max_in_flight) =
                (state.clone(), in_flight.clone(), max_in_flight.clone());
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (state, in_flight, max_in_flight) =
                        (state.clone(), in_flight.clone(), max_in_flight.clone());
                    tokio::spawn(async move {
                        let service = service_fn(move |req| {
                            let (state, in_flight, max_in_flight) =
                                (state.clone(), in_flight.clone(), max_in_flight.clone());
                            async move {
                                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                                max_in_flight.fetch_max(now, Ordering::SeqCst);
                                let answer = answer(&state, req, addr).await;
                                in_flight.fetch_sub(1, Ordering::SeqCst);
                                Ok::<_, Infallible>(answer)
                            }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            })
        };
        MockPspApi {
            addr,
            state,
            in_flight,
            max_in_flight,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stripe holds `event` (an event object with `id`, `created`, `type`).
    pub fn add_stripe(&self, event: Value) {
        self.state.lock().unwrap().stripe.push(event);
    }

    /// PayPal holds `event` (with `id`, `create_time`, `event_type`).
    pub fn add_paypal(&self, event: Value) {
        self.state.lock().unwrap().paypal.push(event);
    }

    /// Answers the next `times` requests (all, with `None`) with `fault`.
    pub fn fail(&self, fault: Fault, times: Option<usize>) {
        self.state.lock().unwrap().fault = Some((fault, times));
    }

    /// When each request arrived, in order.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.state.lock().unwrap().arrivals.clone()
    }

    /// The most requests it had in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

fn reply(status: u16, body: Value) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The query's pairs, percent-decoded (`types%5B%5D` is `types[]`).
fn query(req: &hyper::Request<hyper::body::Incoming>) -> Vec<(String, String)> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn one<'a>(q: &'a [(String, String)], key: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

async fn answer(
    state: &Mutex<State>,
    req: hyper::Request<hyper::body::Incoming>,
    addr: SocketAddr,
) -> hyper::Response<Full<Bytes>> {
    let fault = {
        let mut s = state.lock().unwrap();
        s.arrivals.push(Instant::now());
        match &mut s.fault {
            Some((fault, None)) => *fault,
            Some((fault, Some(n))) if *n > 0 => {
                *n -= 1;
                *fault
            }
            _ => Fault::None,
        }
    };
    match fault {
        Fault::None => {}
        Fault::RateLimited { retry_after_secs } => {
            let mut r = reply(429, json!({"error": {"type": "rate_limit_error"}}));
            r.headers_mut()
                .insert("retry-after", retry_after_secs.to_string().parse().unwrap());
            return r;
        }
        Fault::Down => return reply(500, json!({"error": {"type": "api_error"}})),
        Fault::Stall => std::future::pending::<()>().await,
    }
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    match (req.method().as_str(), req.uri().path()) {
        ("GET", "/v1/events") => {
            if auth != format!("Bearer {STRIPE_KEY}") {
                return reply(401, json!({"error": {"type": "invalid_request_error"}}));
            }
            stripe_events(&state.lock().unwrap().stripe, &query(&req))
        }
        ("POST", "/v1/oauth2/token") => {
            use base64::Engine;
            let basic = base64::engine::general_purpose::STANDARD
                .encode(format!("{PAYPAL_CLIENT_ID}:{PAYPAL_CLIENT_SECRET}"));
            if auth != format!("Basic {basic}") {
                return reply(401, json!({"error": "invalid_client"}));
            }
            reply(
                200,
                json!({"access_token": PAYPAL_TOKEN, "token_type": "Bearer", "expires_in": 32400}),
            )
        }
        ("GET", "/v1/notifications/webhooks-events") => {
            if auth != format!("Bearer {PAYPAL_TOKEN}") {
                return reply(401, json!({"name": "AUTHENTICATION_FAILURE"}));
            }
            paypal_events(&state.lock().unwrap().paypal, &query(&req), addr)
        }
        _ => reply(404, json!({"error": "not found"})),
    }
}

/// Stripe's list: newest first, filtered, paged.
fn stripe_events(all: &[Value], q: &[(String, String)]) -> hyper::Response<Full<Bytes>> {
    let limit: usize = one(q, "limit")
        .map_or(10, |l| l.parse().unwrap_or(10))
        .clamp(1, 100);
    let gte: i64 = one(q, "created[gte]").map_or(i64::MIN, |v| v.parse().unwrap());
    let lte: i64 = one(q, "created[lte]").map_or(i64::MAX, |v| v.parse().unwrap());
    let types: Vec<&str> = q
        .iter()
        .filter(|(k, _)| k == "types[]")
        .map(|(_, v)| v.as_str())
        .collect();
    let mut events: Vec<(usize, &Value)> = all
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            let created = e["created"].as_i64().unwrap();
            (gte..=lte).contains(&created)
                && (types.is_empty() || types.contains(&e["type"].as_str().unwrap()))
        })
        .collect();
    // Newest first; among the same second, the later created first.
    events.sort_by(|a, b| (b.1["created"].as_i64(), b.0).cmp(&(a.1["created"].as_i64(), a.0)));
    let start = match one(q, "starting_after") {
        Some(after) => match events.iter().position(|(_, e)| e["id"] == after) {
            Some(i) => i + 1,
            None => return reply(400, json!({"error": {"message": "No such event"}})),
        },
        None => 0,
    };
    let page: Vec<Value> = events
        .iter()
        .skip(start)
        .take(limit)
        .map(|(_, e)| (*e).clone())
        .collect();
    let has_more = events.len() > start + page.len();
    reply(
        200,
        json!({"object": "list", "url": "/v1/events", "has_more": has_more, "data": page}),
    )
}

/// PayPal's list: in the window, `page_size` a page, a `next` link while
/// more remain.
fn paypal_events(
    all: &[Value],
    q: &[(String, String)],
    addr: SocketAddr,
) -> hyper::Response<Full<Bytes>> {
    use time::format_description::well_known::Rfc3339;
    use time::OffsetDateTime;
    let at = |s: &str| OffsetDateTime::parse(s, &Rfc3339).unwrap();
    let size: usize = one(q, "page_size")
        .map_or(10, |v| v.parse().unwrap())
        .clamp(1, 300);
    let page_no: usize = one(q, "page").map_or(1, |v| v.parse().unwrap());
    let start = one(q, "start_time").map(at);
    let end = one(q, "end_time").map(at);
    let mut events: Vec<&Value> = all
        .iter()
        .filter(|e| {
            let t = at(e["create_time"].as_str().unwrap());
            start.is_none_or(|s| t >= s) && end.is_none_or(|e| t <= e)
        })
        .collect();
    events.sort_by_key(|e| std::cmp::Reverse(at(e["create_time"].as_str().unwrap())));
    let page: Vec<Value> = events
        .iter()
        .skip((page_no - 1) * size)
        .take(size)
        .map(|e| (*e).clone())
        .collect();
    let mut links = vec![];
    if events.len() > page_no * size {
        let mut rest: Vec<String> = q
            .iter()
            .filter(|(k, _)| k != "page")
            .map(|(k, v)| format!("{k}={}", v.replace(':', "%3A").replace('+', "%2B")))
            .collect();
        rest.push(format!("page={}", page_no + 1));
        links.push(json!({
            "href": format!("http://{addr}/v1/notifications/webhooks-events?{}", rest.join("&")),
            "rel": "next", "method": "GET"
        }));
    }
    reply(
        200,
        json!({"events": page, "count": page.len(), "links": links}),
    )
}
