//! The Redis master as Redis Sentinel names it.
//!
//! The `redis` crate's Sentinel client finds the master once; it does not
//! follow a failover. So the connection it gives is kept only while it
//! works: any error on it (a dropped connection, a `READONLY` reply from a
//! demoted master, a command cut short by the lease timeout) drops it, and
//! the next command asks the sentinels again. Until they name a master that
//! answers as one, commands fail and deliveries answer 503; leases held
//! across the failover are lost (their renewals fail), and the fence in the
//! database refuses any write from a token that went back with the new
//! master's counter (the holder's resync moves it past the database fence).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisError};
use tokio::sync::Mutex;

use crate::config::SentinelConfig;

/// A connection to the master being made ([`SentinelConn::connection`]).
type Connecting<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<MultiplexedConnection, RedisError>> + Send + 'a>,
>;

/// A master connection found through the sentinels; cheap to clone.
#[derive(Clone)]
pub struct SentinelConn {
    inner: Arc<Inner>,
}

struct Inner {
    /// One discovery at a time: a failover makes every in-flight command fail
    /// at once, and one question to the sentinels answers them all.
    state: Mutex<State>,
    connect_timeout: Duration,
}

struct State {
    sentinels: SentinelClient,
    /// The master's connection and its generation (so an error on an old one
    /// never drops a newer one).
    current: Option<(u64, MultiplexedConnection)>,
    generation: u64,
}

impl SentinelConn {
    /// Connects lazily, like the other Redis modes: nothing is asked of the
    /// sentinels before the first command.
    pub fn new(
        cfg: &SentinelConfig,
        connect_timeout: Duration,
    ) -> Result<SentinelConn, RedisError> {
        let addrs = cfg.sentinels.iter().map(|node| {
            // Checked by the configuration: host:port.
            let (host, port) = node.rsplit_once(':').unwrap_or((node, "26379"));
            ConnectionAddr::Tcp(host.to_owned(), port.parse().unwrap_or(26379))
        });
        let mut builder =
            SentinelClientBuilder::new(addrs, &cfg.master, SentinelServerType::Master)?;
        if let Some(password) = &cfg.password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        Ok(SentinelConn {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    sentinels: builder.build()?,
                    current: None,
                    generation: 0,
                }),
                connect_timeout,
            }),
        })
    }

    /// The master's connection, asking the sentinels when there is none.
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        let mut state = self.inner.state.lock().await;
        if let Some(current) = &state.current {
            return Ok(current.clone());
        }
        // The client checks that the node the sentinels name answers ROLE as
        // a master before handing it out. Boxed as a `dyn` future: the
        // `redis` crate's is deep enough that proving a delivery's future
        // `Send` through it passes the compiler's recursion limit, and this
        // runs only to (re)connect.
        let connect: Connecting<'_> = Box::pin(async {
            let client = state.sentinels.async_get_client().await?;
            client
                .get_multiplexed_async_connection_with_config(
                    &AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(self.inner.connect_timeout))
                        // The lease facade bounds every command once.
                        .set_response_timeout(None),
                )
                .await
        });
        let conn = connect.await?;
        state.generation += 1;
        let current = (state.generation, conn);
        state.current = Some(current.clone());
        Ok(current)
    }

    /// Forgets connection `generation`, if it is still the current one.
    async fn forget(inner: &Inner, generation: u64) {
        let mut state = inner.state.lock().await;
        if state
            .current
            .as_ref()
            .is_some_and(|(g, _)| *g == generation)
        {
            state.current = None;
        }
    }

    /// Runs `f` on the master's connection. An error, or the caller giving up
    /// before the answer (the lease timeout), drops that connection so the
    /// next command asks the sentinels again: a master that stopped
    /// answering may have been replaced.
    pub async fn run<T, F, Fut>(&self, f: F) -> Result<T, RedisError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        let (generation, conn) = self.connection().await?;
        let mut guard = ForgetOnDrop {
            inner: Some(self.inner.clone()),
            generation,
        };
        let result = f(conn).await;
        if result.is_ok() {
            guard.inner = None;
        }
        result
    }
}

/// Drops the connection of an attempt that failed or was abandoned.
struct ForgetOnDrop {
    inner: Option<Arc<Inner>>,
    generation: u64,
}

impl Drop for ForgetOnDrop {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let generation = self.generation;
            // Drop cannot wait for the lock; a runtime is always there (the
            // command ran on it).
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move { SentinelConn::forget(&inner, generation).await });
            }
        }
    }
}
