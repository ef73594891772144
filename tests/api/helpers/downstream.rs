//! A mock of the merchant's downstream service (an outside party, so a mock
//! is fair): records every call with its headers, and can delay, fail, or hold
//! calls until the test lets them go.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// One call the mock received.
#[derive(Debug, Clone)]
pub struct Call {
    pub idempotency_key: String,
    pub fencing_token: i64,
    pub body: serde_json::Value,
}

#[derive(Default)]
struct Behaviour {
    status: u16,
    delay: Duration,
    /// Calls with this token wait at the gate until `open_gate`.
    gate_token: Option<i64>,
    gate_open: bool,
}

pub struct MockDownstream {
    pub addr: SocketAddr,
    calls: Arc<Mutex<Vec<Call>>>,
    behaviour: Arc<Mutex<Behaviour>>,
    gate: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl MockDownstream {
    pub async fn start() -> MockDownstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let behaviour = Arc::new(Mutex::new(Behaviour {
            status: 200,
            ..Default::default()
        }));
        let gate = Arc::new(Notify::new());
        let task = tokio::spawn({
            let (calls, behaviour, gate) = (calls.clone(), behaviour.clone(), gate.clone());
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (calls, behaviour, gate) = (calls.clone(), behaviour.clone(), gate.clone());
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                            let (calls, behaviour, gate) =
                                (calls.clone(), behaviour.clone(), gate.clone());
                            async move {
                                let header = |n: &str| {
                                    req.headers()
                                        .get(n)
                                        .and_then(|v| v.to_str().ok())
                                        .unwrap_or("")
                                        .to_owned()
                                };
                                let key = header("idempotency-key");
                                let token: i64 = header("fencing-token").parse().unwrap_or(-1);
                                let bytes = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let body = serde_json::from_slice(&bytes)
                                    .unwrap_or(serde_json::Value::Null);
                                calls.lock().unwrap().push(Call {
                                    idempotency_key: key,
                                    fencing_token: token,
                                    body,
                                });
                                let (status, delay, gated) = {
                                    let b = behaviour.lock().unwrap();
                                    (
                                        b.status,
                                        b.delay,
                                        b.gate_token == Some(token) && !b.gate_open,
                                    )
                                };
                                if gated {
                                    loop {
                                        let notified = gate.notified();
                                        if behaviour.lock().unwrap().gate_open {
                                            break;
                                        }
                                        notified.await;
                                    }
                                }
                                tokio::time::sleep(delay).await;
                                let mut resp =
                                    hyper::Response::new(Full::new(Bytes::from_static(b"{}")));
                                *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                                Ok::<_, Infallible>(resp)
                            }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            }
        });
        MockDownstream {
            addr,
            calls,
            behaviour,
            gate,
            task,
        }
    }

    pub fn url(&self) -> hyper::Uri {
        format!("http://{}/payments", self.addr).parse().unwrap()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn set_status(&self, status: u16) {
        self.behaviour.lock().unwrap().status = status;
    }

    pub fn set_delay(&self, delay: Duration) {
        self.behaviour.lock().unwrap().delay = delay;
    }

    /// Holds calls carrying `token` until [`MockDownstream::open_gate`].
    pub fn gate_token(&self, token: i64) {
        let mut b = self.behaviour.lock().unwrap();
        b.gate_token = Some(token);
        b.gate_open = false;
    }

    pub fn open_gate(&self) {
        self.behaviour.lock().unwrap().gate_open = true;
        self.gate.notify_waiters();
    }
}

impl Drop for MockDownstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}
