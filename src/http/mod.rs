//! The HTTP edge: hyper accept loops for the public and admin listeners,
//! routing, and ([`answer`]) the one place where outcomes and errors become
//! statuses and bodies.
//!
//! What the accept loop bounds, so that no client can hold the edge: open
//! connections per listener ([`Limits::max_connections`]) and per peer
//! address ([`Limits::max_per_peer`]; an IPv6 address by its prefix,
//! [`peer_key`]; beyond either 503 and close, never a
//! queue, counted by reason), a keep-alive connection's life (requests and
//! age: past either its next answer says `Connection: close`), the request
//! head's size ([`MAX_HEAD_BYTES`], counted here byte for byte) and time,
//! the body's size and time (in [`webhook`]), and the drain after shutdown
//! ([`serve`]). A listener that [`Limits::evict_idle`] (the admin one) makes
//! room for a new connection by closing its oldest one that is between
//! requests, so half-open connections cannot keep a probe out.

pub mod admin;
pub mod answer;
pub mod log_sample;
pub mod state;
pub mod webhook;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ::metrics::Gauge;
use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use self::log_sample::{Kind, LogSampler};
use crate::metrics::{ConnectionRefusal, Listener, Metrics};

pub type Body = Full<Bytes>;

/// The peer's address, in every request's extensions (the console's refusal
/// list and sign-in throttle read it).
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

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

/// Largest request head (request line and headers) a connection may send,
/// as nginx's default (4 × 8 KiB). Counted here, on the bytes read while no
/// request is in progress: hyper's own bound (its read buffer) is checked
/// only between reads, so on its own it let heads of up to about 48 KiB
/// through. A larger head is answered 431 (or the connection is closed
/// mid-send) before anything is parsed. Bodies are read through the same buffer a chunk at a time, so
/// this does not bound them (`FENCEHOOK_MAX_BODY_BYTES` does).
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// Longest a client may take to send a request head on the public listener.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a connection beyond the cap is kept to be told 503: written at
/// once, then what the client sent is read and dropped until it closes, so
/// that closing does not become a reset that could destroy the 503 before the
/// client reads it.
const REFUSAL_TIME: Duration = Duration::from_millis(500);

/// Refusals being written at once per listener; beyond it a connection is
/// closed without a word (a flood then costs one accept each, nothing more).
pub const MAX_REFUSING: usize = 64;

/// How long a new connection on an evicting listener waits for the slot of
/// the idle connection closed for it.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// How often a waiting newcomer closes another idle connection.
const EVICTION_STEP: Duration = Duration::from_millis(50);

/// One listener's identity and bounds.
#[derive(Clone)]
pub struct Limits {
    /// The `listener` label of its connection metrics.
    pub listener: Listener,
    /// Connections open at once; beyond it a new one is answered 503 and closed.
    pub max_connections: usize,
    /// Connections open at once from one peer address; beyond it a new one
    /// is answered 503 and closed.
    pub max_per_peer: usize,
    /// Leading bits of an IPv6 address that make one peer ([`peer_key`]).
    pub peer_ipv6_prefix: u8,
    /// Requests one connection carries; the last is answered `Connection: close`.
    pub max_requests: u64,
    /// Past this age a connection's next answer says `Connection: close`.
    pub max_age: Duration,
    /// Longest a client may take to send a request head.
    pub head_timeout: Duration,
    /// When full, close the oldest connection that is between requests to
    /// make room for the new one, rather than refuse it.
    pub evict_idle: bool,
    /// After shutdown, how long open connections get to finish.
    pub drain: Duration,
    pub metrics: Metrics,
}

impl Limits {
    /// The public listener's bounds, from the configuration.
    pub fn public(cfg: &crate::config::Config, metrics: Metrics) -> Limits {
        Limits {
            listener: Listener::Public,
            max_connections: cfg.max_connections,
            max_per_peer: cfg.max_connections_per_peer,
            peer_ipv6_prefix: cfg.peer_ipv6_prefix,
            max_requests: cfg.connection_max_requests,
            max_age: cfg.connection_max_age,
            head_timeout: HEADER_READ_TIMEOUT,
            evict_idle: false,
            drain: cfg.shutdown_timeout,
            metrics,
        }
    }
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
        max_per_peer,
        peer_ipv6_prefix,
        max_requests,
        max_age,
        head_timeout,
        evict_idle,
        drain,
        metrics,
    } = limits;
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(max_connections));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let peers = Arc::new(Peers::default());
    let idle = Arc::new(Registry::default());
    let open = metrics.connections_open(which).clone();
    let refused_full = metrics
        .connection_refused(which, ConnectionRefusal::MaxConnections)
        .clone();
    let refused_peer = metrics
        .connection_refused(which, ConnectionRefusal::PerPeer)
        .clone();
    let accept_errors = metrics.accept_errors(which).clone();
    let log_sample = Arc::new(LogSampler::new());
    let serving = Arc::new(Serving {
        handler,
        idle: idle.clone(),
        open: open.clone(),
        max_requests,
        max_age,
        head_timeout,
    });
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer): (_, SocketAddr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors, mostly: it repeats for
                        // every connection in the backlog, so sampled.
                        accept_errors.increment(1);
                        if let Some(suppressed) = log_sample.admit(Kind::AcceptFailed) {
                            tracing::warn!(listener = which.as_str(), error = %e, suppressed,
                                "accept failed");
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let key = peer_key(peer.ip(), peer_ipv6_prefix);
                let Some(peer_slot) = peers.take(key, max_per_peer) else {
                    refused_peer.increment(1);
                    if let Some(suppressed) = log_sample.admit(Kind::ConnectionRefused) {
                        tracing::warn!(listener = which.as_str(), peer = %peer.ip(), counted_as = %key,
                            peer_ipv6_prefix, max_per_peer,
                            suppressed, "per-peer connection limit reached; answered 503 and closed");
                    }
                    if let Ok(refusing) = refusing.clone().try_acquire_owned() {
                        connections.spawn(refuse(stream, refusing));
                    }
                    continue;
                };
                match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let (serving, watcher) = (serving.clone(), graceful.watcher());
                        connections.spawn(async move {
                            serving.serve(stream, slot, peer_slot, watcher).await;
                        });
                    }
                    Err(_) if evict_idle => {
                        let Ok(waiting) = refusing.clone().try_acquire_owned() else {
                            continue;
                        };
                        let (serving, slots, idle, refused_full, watcher) = (
                            serving.clone(),
                            slots.clone(),
                            idle.clone(),
                            refused_full.clone(),
                            graceful.watcher(),
                        );
                        connections.spawn(async move {
                            match make_room(&idle, &slots).await {
                                Some(slot) => {
                                    drop(waiting);
                                    serving.serve(stream, slot, peer_slot, watcher).await;
                                }
                                None => {
                                    refused_full.increment(1);
                                    refuse(stream, waiting).await;
                                }
                            }
                        });
                    }
                    Err(_) => {
                        refused_full.increment(1);
                        if let Some(suppressed) = log_sample.admit(Kind::ConnectionRefused) {
                            tracing::warn!(listener = which.as_str(), max_connections, suppressed,
                                "connection limit reached; answered 503 and closed");
                        }
                        if let Ok(refusing) = refusing.clone().try_acquire_owned() {
                            connections.spawn(refuse(stream, refusing));
                        }
                    }
                }
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

/// A slot on a full evicting listener: closes the oldest idle connection
/// and waits for the slot it gives back, again every [`EVICTION_STEP`],
/// for [`EVICTION_WAIT`] at most. Again, because an eviction can find
/// nothing to close (the slots are held by connections closed for earlier
/// newcomers and not yet ended, or taken and not yet registered), and a
/// newcomer that waited without evicting would leave the one behind it
/// without a slot.
async fn make_room(idle: &Registry, slots: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    let deadline = tokio::time::Instant::now() + EVICTION_WAIT;
    loop {
        idle.evict_oldest();
        let step = (tokio::time::Instant::now() + EVICTION_STEP).min(deadline);
        if let Ok(Ok(slot)) = tokio::time::timeout_at(step, slots.clone().acquire_owned()).await {
            return Some(slot);
        }
        if step >= deadline {
            return None;
        }
    }
}

/// What every connection of one listener is served with.
struct Serving<H> {
    handler: Arc<H>,
    idle: Arc<Registry>,
    open: Gauge,
    max_requests: u64,
    max_age: Duration,
    head_timeout: Duration,
}

impl<H, F> Serving<H>
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    /// Serves one accepted connection until it closes (or is evicted).
    async fn serve(
        &self,
        stream: TcpStream,
        slot: OwnedSemaphorePermit,
        peer_slot: PeerSlot,
        watcher: Watcher,
    ) {
        let _open = OpenConnection::new(slot, peer_slot, self.open.clone());
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr().ok().map(PeerAddr);
        let conn = Arc::new(ConnState::default());
        let registered = self.idle.register(conn.clone());
        let handler = self.handler.clone();
        let (max_requests, max_age, born) = (self.max_requests, self.max_age, Instant::now());
        let svc = service_fn({
            let conn = conn.clone();
            move |mut req: Request<Incoming>| {
                if let Some(peer) = peer {
                    req.extensions_mut().insert(peer);
                }
                let request = InRequest::start(conn.clone());
                let close = request.number >= max_requests || born.elapsed() >= max_age;
                // A combinator, not an `async move` block around `.await`: that
                // would keep the handler's future twice in its state (the
                // captured one and the awaited one), and hyper moves this
                // future whole at every request.
                handler(req).map(move |mut resp| {
                    if close {
                        // hyper closes the connection once this answer is written.
                        resp.headers_mut().insert(
                            hyper::header::CONNECTION,
                            hyper::header::HeaderValue::from_static("close"),
                        );
                    }
                    drop(request);
                    Ok::<_, Infallible>(resp)
                })
            }
        });
        let io = HeadLimited {
            inner: stream,
            conn: conn.clone(),
        };
        let served = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.head_timeout)
            .max_buf_size(MAX_HEAD_BYTES)
            .serve_connection(TokioIo::new(io), svc);
        let served = watcher.watch(served);
        tokio::select! {
            ended = served => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            }
            () = conn.evicted.notified() => {
                tracing::debug!("idle connection closed to make room for a new one");
            }
        }
        drop(registered);
    }
}

/// One connection's state, shared by its reader ([`HeadLimited`]), its
/// service (requests) and the listener's [`Registry`].
#[derive(Default)]
struct ConnState {
    /// A request is being handled: its body may be read, and the
    /// connection is not evicted.
    busy: AtomicBool,
    /// Requests received so far.
    requests: AtomicU64,
    /// Bytes read since the last request ended (or the connection opened):
    /// the head being received.
    head_bytes: AtomicUsize,
    evicted: Notify,
}

/// A request in progress on its connection; when it ends (answered, or
/// dropped) the connection is between requests again.
struct InRequest {
    conn: Arc<ConnState>,
    /// 1 for the connection's first request.
    number: u64,
}

impl InRequest {
    fn start(conn: Arc<ConnState>) -> InRequest {
        conn.busy.store(true, Ordering::Release);
        let number = conn.requests.fetch_add(1, Ordering::Relaxed) + 1;
        InRequest { conn, number }
    }
}

impl Drop for InRequest {
    fn drop(&mut self) {
        self.conn.head_bytes.store(0, Ordering::Relaxed);
        self.conn.busy.store(false, Ordering::Release);
    }
}

/// A connection's stream that lets at most [`MAX_HEAD_BYTES`] through
/// between requests. hyper's buffer is bounded to the same size, so a head
/// that does not end within them finds the buffer full and is refused 431
/// before any more is read; during a request (the body) reads pass through
/// unchanged.
struct HeadLimited {
    inner: TcpStream,
    conn: Arc<ConnState>,
}

impl AsyncRead for HeadLimited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.conn.busy.load(Ordering::Acquire) {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let used = self.conn.head_bytes.load(Ordering::Relaxed);
        let allowance = MAX_HEAD_BYTES.saturating_sub(used);
        let room = allowance.min(buf.remaining());
        if room == 0 {
            // hyper has the whole allowance and asks for more: it is past
            // its own bound by now and answers 431; reading nothing more
            // (end of stream) is the safe fallback.
            return Poll::Ready(Ok(()));
        }
        if buf.remaining() <= allowance {
            // The caller's whole buffer is within the allowance (hyper's
            // reads are 8 KiB at first, the allowance 32 KiB): read into it
            // directly and count what came, with no copy and nothing zeroed.
            let before = buf.filled().len();
            let read = Pin::new(&mut self.inner).poll_read(cx, buf);
            if let Poll::Ready(Ok(())) = read {
                let got = buf.filled().len() - before;
                self.conn.head_bytes.fetch_add(got, Ordering::Relaxed);
            }
            return read;
        }
        // A bounded copy (the end of a long head): narrowing the caller's
        // buffer in place would take unsafe code.
        let mut chunk = [0u8; 8192];
        let take = room.min(chunk.len());
        let mut limited = ReadBuf::new(&mut chunk[..take]);
        match Pin::new(&mut self.inner).poll_read(cx, &mut limited) {
            Poll::Ready(Ok(())) => {
                let read = limited.filled();
                self.conn
                    .head_bytes
                    .fetch_add(read.len(), Ordering::Relaxed);
                buf.put_slice(read);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for HeadLimited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The open connections of a listener, oldest first, for eviction.
#[derive(Default)]
struct Registry {
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, Arc<ConnState>>>,
}

/// A connection's place in its [`Registry`], left when it drops.
struct Registered<'a> {
    registry: &'a Registry,
    id: u64,
}

impl Registry {
    fn register(&self, conn: Arc<ConnState>) -> Registered<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, conn);
        Registered { registry: self, id }
    }

    /// Tells the oldest connection that is between requests (half-open, or
    /// idle on keep-alive) to close, if there is one.
    fn evict_oldest(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let idle = open
            .iter()
            .find(|(_, c)| !c.busy.load(Ordering::Acquire))
            .map(|(id, _)| *id);
        if let Some(conn) = idle.and_then(|id| open.remove(&id)) {
            // A stored permit: the connection sees it even if it is not
            // waiting on it yet.
            conn.evicted.notify_one();
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.registry
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Connections open per peer address.
#[derive(Default)]
struct Peers {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// The address a peer's connections are counted under: an IPv4 address
/// (or an IPv4-mapped IPv6 one) as it is, an IPv6 address with all but its
/// first `ipv6_prefix` bits cleared. An ISP or a cloud gives one client a
/// whole /64 (or more), and any address in it connects: counted one by one,
/// such a client would have no cap at all.
pub fn peer_key(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let mask = match ipv6_prefix.min(128) {
        0 => 0,
        bits => u128::MAX << (128 - u32::from(bits)),
    };
    IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
}

impl Peers {
    /// A slot for one more connection from `ip`, if it has fewer than `max`.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

/// One connection's place in its peer's count.
struct PeerSlot {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                // The map holds the peers connected now, not every one seen.
                open.remove(&self.ip);
            }
        }
    }
}

/// A connection's slot under the listener's cap and its peer's, and its
/// place in the `fencehook_connections_open` gauge; all are given back when
/// it drops, however the connection ends (closed, failed, evicted, aborted).
struct OpenConnection {
    _slot: OwnedSemaphorePermit,
    _peer: PeerSlot,
    gauge: Gauge,
}

impl OpenConnection {
    fn new(slot: OwnedSemaphorePermit, peer: PeerSlot, gauge: Gauge) -> OpenConnection {
        gauge.increment(1.0);
        OpenConnection {
            _slot: slot,
            _peer: peer,
            gauge,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_ipv6_peer_is_counted_by_its_prefix_and_an_ipv4_one_by_its_address() {
        assert_eq!(
            peer_key(ip("2001:db8:1:2:aaaa::1"), 64),
            ip("2001:db8:1:2::")
        );
        assert_eq!(
            peer_key(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), 64),
            ip("2001:db8:1:2::")
        );
        assert_eq!(peer_key(ip("2001:db8:1:2:aaaa::1"), 48), ip("2001:db8:1::"));
        assert_eq!(
            peer_key(ip("2001:db8:1:2:aaaa::1"), 128),
            ip("2001:db8:1:2:aaaa::1")
        );
        assert_eq!(peer_key(ip("203.0.113.7"), 64), ip("203.0.113.7"));
        assert_eq!(
            peer_key(ip("::ffff:203.0.113.7"), 64),
            ip("203.0.113.7"),
            "an IPv4-mapped address is its IPv4 address"
        );
    }

    #[test]
    fn addresses_rotated_inside_one_ipv6_64_share_one_per_peer_cap() {
        let peers = Arc::new(Peers::default());
        let max = 2;
        let take = |addr: &str| peers.take(peer_key(ip(addr), 64), max);
        let first = take("2001:db8:0:7::1").expect("first");
        let second = take("2001:db8:0:7::2").expect("second");
        assert!(
            take("2001:db8:0:7:ffff::3").is_none(),
            "a third address of the same /64 is over the cap"
        );
        assert!(
            take("2001:db8:0:8::1").is_some(),
            "another /64 is another peer"
        );
        let v4a = take("198.51.100.1").expect("an IPv4 peer");
        let v4b = take("198.51.100.2").expect("each IPv4 address is a peer");
        drop((v4a, v4b));
        drop(first);
        assert!(
            take("2001:db8:0:7::9").is_some(),
            "a slot given back is free again"
        );
        drop(second);
    }
}
