//! The Redis lease backend.
//!
//! Keys share a hash tag so each transaction's lock and counter live in one
//! Redis Cluster slot:
//!
//! - `<prefix>:{<provider>:<transaction_id>}:lock` — `<owner-uuid>:<token>`, PX ttl
//! - `<prefix>:{<provider>:<transaction_id>}:fence` — the INCR counter; long
//!   expiry, never deleted by release
//!
//! The scripts are `redis::Script`s: called with EVALSHA, and on NOSCRIPT the
//! library loads the script and retries, so a restarted Redis is handled.
//!
//! No call here has a timeout of its own: the [`Lease`](super::Lease) facade
//! bounds every command once, and the client is built without a response
//! timeout so the two never nest.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::Script;
use uuid::Uuid;

use super::sentinel::SentinelConn;
use super::{LeaseError, LeaseKey, RawAcquire};
use crate::config::{setting, LeaseConfig, RedisTls};

// Tokens are handled as decimal strings inside the scripts, never as Lua
// numbers: Lua formats a number with `%.14g` (10^14 becomes `1e+14`, which no
// `<owner>:<token>` ever matches) and holds it as a double (inexact above
// 2^53). Redis does the arithmetic (`INCR` on a 64-bit integer) and the
// scripts read the counter back with `GET`, so a token is exact end to end.
//
// ACQUIRE and RESYNC are idempotent for their owner: a re-run by the same
// owner (the Redis Cluster client retries a command after an I/O error, and
// its first run may have gone through) answers what the first run did instead
// of failing or taking a second token.

/// Acquire. KEYS: lock, fence. ARGV: owner, ttl ms, fence-key ttl ms.
/// Returns `{1, token}` when acquired (or already ours: a retry), `{0,
/// remaining-ms}` when another owner holds it.
pub const ACQUIRE_LUA: &str = r"
local held = redis.call('GET', KEYS[1])
if held then
  local mine = ARGV[1] .. ':'
  if string.sub(held, 1, #mine) == mine then
    return {1, string.sub(held, #mine + 1)}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('INCR', KEYS[2])
local token = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {1, token}
";

/// Renew. KEYS: lock. ARGV: `<owner>:<token>`, ttl ms. Extends only our own
/// lock; a missing key is never recreated. Returns 1 when renewed.
pub const RENEW_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Release. KEYS: lock. ARGV: `<owner>:<token>`. Compare-and-delete: never
/// deletes a lock that is not ours; never touches the fence counter.
pub const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Cancel an acquire whose reply was lost. KEYS: lock. ARGV: owner. Deletes
/// the lock only if this owner holds it (whatever its token): the owner UUID
/// is new for every acquisition, so it names this attempt alone.
pub const CANCEL_LUA: &str = r"
local held = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':'
if held and string.sub(held, 1, #mine) == mine then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Fence resync. KEYS: lock, fence. ARGV: owner, our token, database fence,
/// fence-key ttl ms. Inside our lease only: raise the counter to at least the
/// database fence, INCR past it, and re-label the lock with the new token
/// (keeping its TTL). Returns the new token, or 0 when the lock is not ours.
/// A re-run after a resync that went through finds our lock already past the
/// database fence and answers that token.
pub const RESYNC_LUA: &str = r"
local function above(a, b)
  return #a > #b or (#a == #b and a > b)
end
local held = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':'
if not held or string.sub(held, 1, #mine) ~= mine then
  return 0
end
local current = string.sub(held, #mine + 1)
if current ~= ARGV[2] then
  if above(current, ARGV[3]) then
    return current
  end
  return 0
end
local counter = redis.call('GET', KEYS[2]) or '0'
if not above(counter, ARGV[3]) then
  redis.call('SET', KEYS[2], ARGV[3])
end
redis.call('INCR', KEYS[2])
local token = redis.call('GET', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[1], mine .. token, 'KEEPTTL')
return token
";

/// Redis-backed leases; cheap to clone.
#[derive(Clone)]
pub struct RedisLease {
    inner: Arc<Inner>,
}

/// One Redis server, a Redis Cluster (slots routed by the hash tag), or the
/// master Redis Sentinel names.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConn),
}

struct Inner {
    conn: Conn,
    prefix: String,
    ttl: Duration,
    fence_key_ttl: Duration,
    acquire: Script,
    renew: Script,
    release: Script,
    cancel: Script,
    resync: Script,
}

impl RedisLease {
    /// Connects lazily: a Redis that is down at start makes deliveries answer
    /// 503 until it is back, instead of stopping the process.
    ///
    /// `REDIS_URL` names one server (`redis://host:port`), or a Redis Cluster
    /// as a comma-separated list of seed nodes
    /// (`redis://10.0.0.1:7000,redis://10.0.0.2:7000`); `rediss://` for TLS.
    /// With Sentinel settings the master is asked of the sentinels instead.
    pub fn new(cfg: &LeaseConfig) -> Result<RedisLease, LeaseError> {
        let nodes: Vec<&str> = cfg
            .redis_url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let tls = nodes.iter().any(|n| n.starts_with("rediss://"));
        let conn = if let Some(sentinel) = &cfg.sentinel {
            Conn::Sentinel(SentinelConn::new(sentinel, cfg.lease_timeout)?)
        } else if nodes.len() > 1 {
            // The cluster client retries a command after an I/O error or a
            // redirection; every script is idempotent for its owner (see
            // above), so a retry of one that went through is harmless.
            let mut builder = redis::cluster::ClusterClient::builder(nodes);
            if tls {
                builder = builder.certs(certificates(&cfg.redis_tls));
            }
            let client = builder
                .connection_timeout(cfg.lease_timeout)
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(100)
                .build()?;
            Conn::Cluster(
                client
                    .get_pending_async_connection_with_config(redis::cluster::ClusterConfig::new()),
            )
        } else {
            let client = if tls {
                redis::Client::build_with_tls(cfg.redis_url.as_str(), certificates(&cfg.redis_tls))?
            } else {
                redis::Client::open(cfg.redis_url.as_str())?
            };
            let manager_cfg = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(cfg.lease_timeout))
                .set_response_timeout(None)
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(200));
            Conn::Single(ConnectionManager::new_lazy_with_config(
                client,
                manager_cfg,
            )?)
        };
        Ok(RedisLease {
            inner: Arc::new(Inner {
                conn,
                prefix: cfg.key_prefix.clone(),
                ttl: cfg.ttl,
                fence_key_ttl: cfg.fence_key_ttl,
                acquire: Script::new(ACQUIRE_LUA),
                renew: Script::new(RENEW_LUA),
                release: Script::new(RELEASE_LUA),
                cancel: Script::new(CANCEL_LUA),
                resync: Script::new(RESYNC_LUA),
            }),
        })
    }

    pub fn lock_key(&self, key: &LeaseKey) -> String {
        self.key_of(key, ":lock")
    }

    pub fn fence_key(&self, key: &LeaseKey) -> String {
        self.key_of(key, ":fence")
    }

    /// `<prefix>:{<provider>:<transaction_id>}<suffix>`, pieced together:
    /// `format!` took about 1,700 instructions a key, twice per delivery.
    fn key_of(&self, key: &LeaseKey, suffix: &str) -> String {
        let prefix = &self.inner.prefix;
        let (provider, tx) = (&key.provider, &key.transaction_id);
        let mut k =
            String::with_capacity(prefix.len() + provider.len() + tx.len() + suffix.len() + 4);
        for part in [prefix.as_str(), ":{", provider, ":", tx, "}", suffix] {
            k.push_str(part);
        }
        k
    }

    async fn call<T: redis::FromRedisValue>(
        &self,
        inv: redis::ScriptInvocation<'_>,
    ) -> Result<T, LeaseError> {
        Ok(match self.inner.conn.clone() {
            Conn::Single(mut c) => inv.invoke_async(&mut c).await?,
            Conn::Cluster(mut c) => inv.invoke_async(&mut c).await?,
            Conn::Sentinel(s) => {
                s.run(|mut c| async move { inv.invoke_async(&mut c).await })
                    .await?
            }
        })
    }

    /// One atomic acquisition for `owner`.
    pub async fn acquire(&self, key: &LeaseKey, owner: Uuid) -> Result<RawAcquire, LeaseError> {
        let mut inv = self.inner.acquire.key(self.lock_key(key));
        inv.key(self.fence_key(key))
            .arg(owner.to_string())
            .arg(self.inner.ttl.as_millis() as u64)
            .arg(self.inner.fence_key_ttl.as_millis() as u64);
        let (acquired, value): (i64, i64) = self.call(inv).await?;
        if acquired == 1 {
            Ok(RawAcquire::Acquired { token: value })
        } else {
            // -1 (no expiry) cannot come from us; treat it as a full TTL.
            let remaining = u64::try_from(value)
                .map(Duration::from_millis)
                .unwrap_or(self.inner.ttl);
            Ok(RawAcquire::Held { remaining })
        }
    }

    /// Extends the lock only if it still holds `<owner>:<token>`.
    pub async fn renew(&self, key: &LeaseKey, owner: Uuid, token: i64) -> Result<bool, LeaseError> {
        let mut inv = self.inner.renew.key(self.lock_key(key));
        inv.arg(format!("{owner}:{token}"))
            .arg(self.inner.ttl.as_millis() as u64);
        let renewed: i64 = self.call(inv).await?;
        Ok(renewed == 1)
    }

    /// Deletes the lock only if it still holds `<owner>:<token>`.
    pub async fn release(
        &self,
        key: &LeaseKey,
        owner: Uuid,
        token: i64,
    ) -> Result<bool, LeaseError> {
        let mut inv = self.inner.release.key(self.lock_key(key));
        inv.arg(format!("{owner}:{token}"));
        let deleted: i64 = self.call(inv).await?;
        Ok(deleted == 1)
    }

    /// Deletes the lock only if `owner` holds it, whatever its token.
    pub async fn cancel(&self, key: &LeaseKey, owner: Uuid) -> Result<bool, LeaseError> {
        let mut inv = self.inner.cancel.key(self.lock_key(key));
        inv.arg(owner.to_string());
        let deleted: i64 = self.call(inv).await?;
        Ok(deleted == 1)
    }

    /// See [`LeaseGuard::resync`](super::LeaseGuard::resync).
    pub async fn resync(
        &self,
        key: &LeaseKey,
        owner: Uuid,
        token: i64,
        db_fence: i64,
    ) -> Result<Option<i64>, LeaseError> {
        let mut inv = self.inner.resync.key(self.lock_key(key));
        inv.key(self.fence_key(key))
            .arg(owner.to_string())
            .arg(token.to_string())
            .arg(db_fence.to_string())
            .arg(self.inner.fence_key_ttl.as_millis() as u64);
        let new: i64 = self.call(inv).await?;
        Ok((new > 0).then_some(new))
    }

    /// Readiness probe.
    pub async fn ping(&self) -> Result<(), LeaseError> {
        let cmd = redis::cmd("PING");
        match self.inner.conn.clone() {
            Conn::Single(mut c) => cmd.query_async::<String>(&mut c).await?,
            // Routed to every primary: ready only when the whole cluster answers.
            Conn::Cluster(mut c) => cmd.query_async::<String>(&mut c).await?,
            Conn::Sentinel(s) => {
                s.run(|mut c| async move { cmd.query_async::<String>(&mut c).await })
                    .await?
            }
        };
        Ok(())
    }
}

/// The CA and client certificate of `rediss://`, as the client takes them.
fn certificates(tls: &RedisTls) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    }
}

/// With `rediss://`, one connection at start to each node until one answers,
/// so a certificate that does not verify (a wrong CA, a host name the
/// certificate does not cover, a client certificate the server refuses)
/// stops the start naming its setting, instead of every delivery answering
/// 503 for a reason only the logs say. A node that does not answer at all
/// is not an error here: the service waits for Redis as for any outage.
pub async fn verify_tls(cfg: &LeaseConfig) -> Result<(), crate::config::ConfigError> {
    use crate::config::ConfigError;
    if cfg.sentinel.is_some() || cfg.backend != crate::config::LeaseBackendKind::Redis {
        return Ok(());
    }
    for node in cfg.redis_url.split(',').map(str::trim) {
        if !node.starts_with("rediss://") {
            return Ok(());
        }
        let client =
            redis::Client::build_with_tls(node, certificates(&cfg.redis_tls)).map_err(|e| {
                ConfigError {
                    setting: setting::REDIS_URL,
                    reason: format!("cannot set up TLS: {e}"),
                }
            })?;
        let conn_cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(START_TLS_CHECK))
            .set_response_timeout(Some(START_TLS_CHECK));
        let attempt = client.get_multiplexed_async_connection_with_config(&conn_cfg);
        let err = match tokio::time::timeout(START_TLS_CHECK, attempt).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => continue,
        };
        if let Some(tls) = rustls_error(&err) {
            use rustls::{CertificateError, Error};
            let target = crate::config::redis_target(node);
            return Err(match tls {
                Error::InvalidCertificate(CertificateError::NotValidForName)
                | Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. }) => {
                    ConfigError {
                        setting: setting::REDIS_URL,
                        reason: format!("{target}: the server's certificate does not name this host ({tls})"),
                    }
                }
                Error::InvalidCertificate(_) => ConfigError {
                    setting: setting::FENCEHOOK_REDIS_CA_FILE,
                    reason: format!(
                        "{target}: the server's certificate does not verify against {} ({tls})",
                        if cfg.redis_tls.ca.is_some() { "this CA" } else { "the system's trust store; set the CA that signed it" }
                    ),
                },
                Error::AlertReceived(_) => ConfigError {
                    setting: setting::FENCEHOOK_REDIS_CLIENT_CERT_FILE,
                    reason: format!("{target}: the server refused the TLS handshake ({tls}); it may want a client certificate it trusts"),
                },
                _ => ConfigError {
                    setting: setting::REDIS_URL,
                    reason: format!("{target}: TLS handshake failed ({tls})"),
                },
            });
        }
    }
    Ok(())
}

/// How long the start's TLS check waits for one node.
const START_TLS_CHECK: Duration = Duration::from_secs(3);

/// The TLS error under a Redis error, if that is what it is. The client
/// wraps it in an `io::Error` behind an `Arc<dyn Error>`, and neither the
/// `Arc` nor `io::Error::source` hands the inner error on, so each layer is
/// unwrapped by hand.
fn rustls_error(err: &redis::RedisError) -> Option<&rustls::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    fn unwrap<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(shared) = e.downcast_ref::<Shared>() {
            return unwrap(shared.as_ref());
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io.get_ref().and_then(|inner| unwrap(inner));
        }
        None
    }
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        if let Some(tls) = unwrap(e) {
            return Some(tls);
        }
        source = e.source();
    }
    None
}
