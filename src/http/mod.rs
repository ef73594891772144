//! The HTTP edge: hyper accept loops for the public and admin listeners,
//! routing, and ([`answer`]) the one place where outcomes and errors become
//! statuses and bodies.
//!
//! What the accept loop bounds, so that no client can hold the edge: open
//! connections per listener ([`Limits::max_connections`]; beyond it 503 and
//! close, never a queue), the request head's size ([`MAX_HEAD_BYTES`]) and
//! time (10 s), the body's size and time (in [`webhook`]), and the drain
//! after shutdown ([`serve`]).

pub mod admin;
pub mod answer;
pub mod client;
pub mod log_sample;
pub mod state;
pub mod webhook;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ::metrics::Gauge;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use self::log_sample::{Kind, LogSampler};
use crate::metrics::{Listener, Metrics};

pub type Body = Full<Bytes>;

/// A JSON response.
pub fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(value.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Largest request head (request line and headers) a connection may send:
/// the bound of hyper's read buffer, as nginx's default (4 × 8 KiB). A
/// larger head is answered 431 (or the connection is closed mid-send) before
/// anything is parsed. Bodies are read through the same buffer a chunk at a
/// time, so this does not bound them (`FENCEHOOK_MAX_BODY_BYTES` does).
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// Longest a client may take to send a request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a connection beyond the cap is kept to be told 503: written at
/// once, then what the client sent is read and dropped until it closes, so
/// that closing does not become a reset that could destroy the 503 before the
/// client reads it.
const REFUSAL_TIME: Duration = Duration::from_millis(500);

/// Refusals being written at once per listener; beyond it a connection is
/// closed without a word (a flood then costs one accept each, nothing more).
const MAX_REFUSING: usize = 64;

/// One listener's identity and bounds.
#[derive(Clone)]
pub struct Limits {
    /// The `listener` label of its connection metrics.
    pub listener: Listener,
    /// Connections open at once; beyond it a new one is answered 503 and closed.
    pub max_connections: usize,
    /// After shutdown, how long open connections get to finish.
    pub drain: Duration,
    pub metrics: Metrics,
}

/// Serves `listener` until `shutdown` resolves, then stops accepting and waits
/// up to `drain` for open connections (and the deliveries on them) to finish.
///
/// Every connection runs in a task of one [`JoinSet`], so the drain bound is
/// kept: past it the tasks still running are aborted, and this returns only
/// once they are gone. What an abort really does to the work on them: the
/// request's future is dropped at its next await, so no answer is sent and the
/// client sees the connection closed (the PSP retries). Nothing is undone: a
/// statement already sent to PostgreSQL may still commit (each fenced write is
/// one statement, so a finalize on the wire may book the payment without
/// anyone being told); a claim that committed without its finalize leaves the
/// row `processing`. Either way the retry is safe: it answers `duplicate`, or
/// resumes the claim under a higher token. A dropped
/// [`LeaseGuard`](crate::lease::LeaseGuard) tries to release its lease in a
/// background task; if the process exits first, the lease expires by its TTL.
pub async fn serve<H, F>(
    listener: TcpListener,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
) where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let Limits {
        listener: which,
        max_connections,
        drain,
        metrics,
    } = limits;
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(max_connections));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let open = metrics.connections_open(which).clone();
    let refused = metrics.connection_refused(which).clone();
    let log_sample = LogSampler::new();
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer): (_, SocketAddr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    refused.increment(1);
                    if let Some(suppressed) = log_sample.admit(Kind::ConnectionRefused) {
                        tracing::warn!(listener = which.as_str(), max_connections, suppressed,
                            "connection limit reached; answered 503 and closed");
                    }
                    if let Ok(refusing) = refusing.clone().try_acquire_owned() {
                        connections.spawn(refuse(stream, refusing));
                    }
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let svc = service_fn(move |req| {
                    let fut = handler(req);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .max_buf_size(MAX_HEAD_BYTES)
                    .serve_connection(TokioIo::new(stream), svc);
                let conn = graceful.watch(conn);
                let open = OpenConnection::new(slot, open.clone());
                connections.spawn(async move {
                    let _open = open;
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            Some(ended) = connections.join_next(), if !connections.is_empty() => {
                if let Err(e) = ended {
                    if e.is_panic() {
                        tracing::error!(error = %e, "a connection task panicked");
                    }
                }
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(drain, async {
        // Tells every connection to finish its request and close, then waits
        // for their tasks (not only for hyper's watchers) to end.
        let ((), ()) = tokio::join!(graceful.shutdown(), async {
            while connections.join_next().await.is_some() {}
        });
    })
    .await;
    if drained.is_err() {
        while connections.try_join_next().is_some() {}
        let cut = connections.len();
        connections.shutdown().await;
        tracing::warn!(
            listener = which.as_str(),
            ?drain,
            cut,
            "drain timeout: aborted the connections still open"
        );
    }
}

/// A connection's slot under the listener's cap, and its place in the
/// `fencehook_connections_open` gauge; both are given back when it drops,
/// however the connection ends (closed, failed, aborted).
struct OpenConnection {
    _slot: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl OpenConnection {
    fn new(slot: OwnedSemaphorePermit, gauge: Gauge) -> OpenConnection {
        gauge.increment(1.0);
        OpenConnection { _slot: slot, gauge }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

/// Tells a connection beyond the cap to come back later, without reading
/// its request (see [`answer::CONNECTION_REFUSED`]), within [`REFUSAL_TIME`].
async fn refuse(mut stream: TcpStream, _refusing: OwnedSemaphorePermit) {
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        stream.write_all(answer::CONNECTION_REFUSED).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
}
