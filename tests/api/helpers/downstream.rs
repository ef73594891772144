//! A mock of the merchant's downstream service (an outside party, so a mock
//! is fair): records every call with its headers, and can delay, fail, or hold
//! calls until the test lets them go.

use std::collections::HashMap;
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
    /// The W3C `traceparent` the call carried (tracing on), if any.
    pub traceparent: Option<String>,
    /// Every header, and the body's bytes as sent (what a signature covers).
    pub headers: hyper::HeaderMap,
    pub raw_body: Bytes,
}

#[derive(Default)]
struct Behaviour {
    status: u16,
    delay: Duration,
    /// Calls with this token wait at the gate until `open_gate`.
    gate_token: Option<i64>,
    gate_open: bool,
    /// Idempotency keys as a downstream that implements them keeps them: the
    /// body and answer of the first 2xx call under each key.
    strict: Option<HashMap<String, (serde_json::Value, u16)>>,
}

pub struct MockDownstream {
    pub addr: SocketAddr,
    /// `https` when it speaks TLS.
    scheme: &'static str,
    calls: Arc<Mutex<Vec<Call>>>,
    behaviour: Arc<Mutex<Behaviour>>,
    gate: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl MockDownstream {
    pub async fn start() -> MockDownstream {
        MockDownstream::start_with(None).await
    }

    /// The same service over TLS only, with the certificate and key of `ca`
    /// (a [`TestCa`](super::redis_ha::TestCa)'s files).
    pub async fn start_tls(ca: &super::redis_ha::TestCa) -> MockDownstream {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(&ca.cert_file)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&ca.key_file).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        MockDownstream::start_with(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> MockDownstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let behaviour = Arc::new(Mutex::new(Behaviour {
            status: 200,
            ..Default::default()
        }));
        let gate = Arc::new(Notify::new());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let task = tokio::spawn({
            let (calls, behaviour, gate) = (calls.clone(), behaviour.clone(), gate.clone());
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (calls, behaviour, gate) = (calls.clone(), behaviour.clone(), gate.clone());
                    let tls = tls.clone();
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
                                let traceparent =
                                    Some(header("traceparent")).filter(|t| !t.is_empty());
                                let headers = req.headers().clone();
                                let bytes = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let body = serde_json::from_slice(&bytes)
                                    .unwrap_or(serde_json::Value::Null);
                                calls.lock().unwrap().push(Call {
                                    idempotency_key: key.clone(),
                                    fencing_token: token,
                                    body: body.clone(),
                                    traceparent,
                                    headers,
                                    raw_body: bytes.clone(),
                                });
                                let (status, delay, gated, known) = {
                                    let b = behaviour.lock().unwrap();
                                    let known = b.strict.as_ref().and_then(|seen| {
                                        seen.get(&key).map(|(first, status)| {
                                            // A reused key: the first answer again, or
                                            // 422 when the body is another one.
                                            if *first == body {
                                                *status
                                            } else {
                                                422
                                            }
                                        })
                                    });
                                    (
                                        b.status,
                                        b.delay,
                                        b.gate_token == Some(token) && !b.gate_open,
                                        known,
                                    )
                                };
                                if let Some(status) = known {
                                    let mut resp =
                                        hyper::Response::new(Full::new(Bytes::from_static(b"{}")));
                                    *resp.status_mut() =
                                        hyper::StatusCode::from_u16(status).unwrap();
                                    return Ok::<_, Infallible>(resp);
                                }
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
                                if (200..300).contains(&status) {
                                    if let Some(seen) = &mut behaviour.lock().unwrap().strict {
                                        seen.entry(key).or_insert((body, status));
                                    }
                                }
                                let mut resp =
                                    hyper::Response::new(Full::new(Bytes::from_static(b"{}")));
                                *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                                Ok::<_, Infallible>(resp)
                            }
                        });
                        match tls {
                            // A client that refuses the certificate ends the
                            // handshake: no call is made.
                            Some(acceptor) => {
                                if let Ok(stream) = acceptor.accept(stream).await {
                                    let _ = http1::Builder::new()
                                        .serve_connection(TokioIo::new(stream), svc)
                                        .await;
                                }
                            }
                            None => {
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), svc)
                                    .await;
                            }
                        }
                    });
                }
            }
        });
        MockDownstream {
            addr,
            scheme,
            calls,
            behaviour,
            gate,
            task,
        }
    }

    pub fn url(&self) -> hyper::Uri {
        format!("{}://{}/payments", self.scheme, self.addr)
            .parse()
            .unwrap()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn set_status(&self, status: u16) {
        self.behaviour.lock().unwrap().status = status;
    }

    /// Deduplicates by `Idempotency-Key` as a downstream that implements it
    /// does: a reused key with the same body is answered as the first 2xx
    /// call under it was (not executed again), with another body 422.
    pub fn strict_idempotency(&self) {
        self.behaviour.lock().unwrap().strict = Some(HashMap::new());
    }

    /// With [`MockDownstream::strict_idempotency`]: the bodies of the steps
    /// it executed (the first 2xx under each key), by key.
    pub fn executed(&self) -> HashMap<String, serde_json::Value> {
        let b = self.behaviour.lock().unwrap();
        b.strict
            .iter()
            .flatten()
            .map(|(key, (body, _))| (key.clone(), body.clone()))
            .collect()
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
