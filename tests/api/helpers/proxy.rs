//! A TCP fault-injection proxy for integration tests.
//!
//! [`FaultProxy`] sits on loopback between the service under test and one of
//! its backing stores (PostgreSQL, Redis, ...).  Point the service at
//! [`FaultProxy::addr`] instead of the real server, then inject network faults
//! while the test runs:
//!
//! * [`FaultProxy::pause`] / [`FaultProxy::resume`] freeze traffic without
//!   closing anything (a stalled network or a hung server),
//! * [`FaultProxy::cut`] / [`FaultProxy::restore`] drop every connection and
//!   refuse new ones (a crashed server or a partition),
//! * [`FaultProxy::set_delay`] adds latency to every forwarded chunk.
//!
//! Everything runs on tasks spawned on the current tokio runtime; dropping
//! the proxy aborts all of them.
#![allow(dead_code)]

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Fault state shared by the accept loop and every connection task.
#[derive(Clone, Copy, Debug, Default)]
struct State {
    /// No bytes are forwarded while set.
    paused: bool,
    /// No bytes are forwarded from the upstream back to the client while
    /// set: requests arrive and run, their replies are held.
    replies_paused: bool,
    /// New connections are closed right after accept while set.
    cut: bool,
    /// Bumped by every `cut()`; a connection dies once this differs from
    /// the value it was accepted under.
    epoch: u64,
    /// Sleep before forwarding each chunk.
    delay: Duration,
}

/// A loopback TCP proxy that forwards to one upstream and can inject faults.
pub struct FaultProxy {
    addr: SocketAddr,
    state: watch::Sender<State>,
    accepted: Arc<AtomicUsize>,
    accept_task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards every accepted connection to
    /// `upstream`.  The listener is bound when this returns, so
    /// [`addr`](Self::addr) is immediately connectable.
    ///
    /// # Panics
    /// If the loopback listener cannot be bound.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("FaultProxy: bind 127.0.0.1:0");
        let addr = listener
            .local_addr()
            .expect("FaultProxy: listener local_addr");
        let (state, rx) = watch::channel(State::default());
        let accepted = Arc::new(AtomicUsize::new(0));
        let accept_task = tokio::spawn(accept_loop(listener, upstream, rx, accepted.clone()));
        FaultProxy {
            addr,
            state,
            accepted,
            accept_task,
        }
    }

    /// The address clients should connect to instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding bytes in both directions on every connection,
    /// existing and new, until [`resume`](Self::resume).  Connections stay
    /// open and new ones are still accepted; data read meanwhile is held,
    /// never dropped, and delivered in order after `resume()`.
    pub fn pause(&self) {
        self.state.send_modify(|s| s.paused = true);
    }

    /// Ends a [`pause`](Self::pause) or [`pause_replies`](Self::pause_replies);
    /// held bytes are forwarded promptly.
    pub fn resume(&self) {
        self.state.send_modify(|s| {
            s.paused = false;
            s.replies_paused = false;
        });
    }

    /// Holds the upstream's replies (requests still reach it and run): a
    /// reply lost or late after the client's own timeout.
    pub fn pause_replies(&self) {
        self.state.send_modify(|s| s.replies_paused = true);
    }

    /// Closes every existing connection (both sides) within a few
    /// milliseconds, even if paused or idle, and until
    /// [`restore`](Self::restore) closes each new connection right after
    /// accepting it.
    pub fn cut(&self) {
        self.state.send_modify(|s| {
            s.cut = true;
            s.epoch = s.epoch.wrapping_add(1);
        });
    }

    /// Ends a [`cut`](Self::cut); connections accepted from now on are
    /// forwarded normally.  Connections closed by the cut stay closed.
    pub fn restore(&self) {
        self.state.send_modify(|s| s.cut = false);
    }

    /// Sleeps `d` before forwarding each chunk, in each direction, on every
    /// connection (`Duration::ZERO` disables the delay).
    pub fn set_delay(&self, d: Duration) {
        self.state.send_modify(|s| s.delay = d);
    }

    /// Number of connections accepted so far, including those closed
    /// immediately because of a [`cut`](Self::cut).
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    /// Aborts the accept loop and, with it, every connection task.  Does not
    /// block; sockets are closed once the runtime drops the aborted tasks.
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    state: watch::Receiver<State>,
    accepted: Arc<AtomicUsize>,
) {
    // Owning the JoinSet here means aborting this task aborts all connections.
    let mut conns = JoinSet::new();
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // Transient (e.g. EMFILE, ECONNABORTED): back off briefly.
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        accepted.fetch_add(1, Ordering::SeqCst);
        while conns.try_join_next().is_some() {}
        let now = *state.borrow();
        if now.cut {
            drop(client);
            continue;
        }
        conns.spawn(handle_conn(client, upstream, state.clone(), now.epoch));
    }
}

/// Forwards one connection until both directions hit EOF, either side
/// fails, or the proxy is cut (or dropped).
async fn handle_conn(
    client: TcpStream,
    upstream: SocketAddr,
    state: watch::Receiver<State>,
    epoch: u64,
) {
    let mut cut_rx = state.clone();
    let cut = async move {
        // Err means the proxy was dropped: close as well.
        let _ = cut_rx.wait_for(|s| s.epoch != epoch).await;
    };
    let forward = async move {
        let Ok(server) = TcpStream::connect(upstream).await else {
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_r, client_w) = client.into_split();
        let (server_r, server_w) = server.into_split();
        let _ = tokio::try_join!(
            pipe(client_r, server_w, state.clone(), false),
            pipe(server_r, client_w, state, true),
        );
    };
    // Whichever finishes first drops the other, closing both sockets.
    tokio::select! {
        () = cut => {}
        () = forward => {}
    }
}

/// Copies one direction: read a chunk, wait while paused, apply the delay,
/// write it.  EOF is propagated as a write shutdown (half-close).
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    replies: bool,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        let delay = wait_unpaused(&mut state, replies).await?.delay;
        if n == 0 {
            to.shutdown().await?;
            return Ok(());
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
            // A pause that started during the delay must still hold the data.
            wait_unpaused(&mut state, replies).await?;
        }
        to.write_all(&buf[..n]).await?;
    }
}

/// Waits until the proxy is not paused (for this direction) and returns the current state.
async fn wait_unpaused(state: &mut watch::Receiver<State>, replies: bool) -> io::Result<State> {
    match state
        .wait_for(|s| !(s.paused || (replies && s.replies_paused)))
        .await
    {
        Ok(s) => Ok(*s),
        Err(_) => Err(io::Error::other("FaultProxy dropped")),
    }
}
