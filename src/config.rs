//! Settings: every one an environment variable with a flag twin (clap), a
//! default shown by `fencehook serve --help`, and validation at start —
//! including the rules that span fields (the heartbeat must be able to renew a
//! lease well before it expires). A bad setting stops the start with one line
//! that names it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::providers::{self, Provider};

pub mod console;
mod database;
pub mod downstream;
mod error;
pub mod reconcile;
mod redis;
pub mod setting;
mod traces;
pub use database::{database_target, DbArgs, DbConfig};
pub(crate) use error::{bad, Found};
pub use error::{ConfigError, ConfigErrors};
pub use redis::{RedisHaArgs, RedisTls, SentinelConfig, DEFAULT_REDIS_URL};
pub use traces::{OtlpProtocol, Sampler, SamplerRoot, TraceArgs, TraceConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LeaseBackendKind {
    Redis,
    Postgres,
    /// No lease at all: the UNIQUE constraint and the one-statement claim
    /// only. Exists for `make bench`'s baseline row, in builds with the
    /// `bench-baseline` feature; refused otherwise. Unsafe with a downstream.
    #[value(hide = true)]
    UniqueOnly,
}

impl LeaseBackendKind {
    /// The value of `FENCEHOOK_LEASE_BACKEND`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseBackendKind::Redis => "redis",
            LeaseBackendKind::Postgres => "postgres",
            LeaseBackendKind::UniqueOnly => "unique-only",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags and environment of `fencehook serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Redis URL of the lease store with the redis lease backend
    /// (redis://host:port[/db], rediss:// for TLS; unread with postgres). Default: redis://127.0.0.1:6379, unless
    /// FENCEHOOK_REDIS_SENTINELS is set (then it must be unset).
    #[arg(long, env = setting::REDIS_URL)]
    pub redis_url: Option<String>,
    #[command(flatten)]
    pub redis_ha: RedisHaArgs,
    /// Public listener: POST /webhooks/{provider}.
    #[arg(long, env = setting::FENCEHOOK_LISTEN, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Admin listener: /metrics, /healthz, /readyz. Never the public port.
    #[arg(long, env = setting::FENCEHOOK_ADMIN_LISTEN, default_value = "127.0.0.1:9090")]
    pub admin_listen: String,
    /// Where leases and fencing tokens live.
    #[arg(
        long,
        env = setting::FENCEHOOK_LEASE_BACKEND,
        value_enum,
        default_value = "redis"
    )]
    pub lease_backend: LeaseBackendKind,
    /// Lease time-to-live; the heartbeat renews every ttl/3.
    #[arg(long, env = setting::FENCEHOOK_LEASE_TTL_MS, default_value_t = 5000)]
    pub lease_ttl_ms: u64,
    /// Longest a lease is renewed for one delivery; past it the lease is let go.
    #[arg(long, env = setting::FENCEHOOK_LEASE_MAX_MS, default_value_t = 60_000)]
    pub lease_max_ms: u64,
    /// Expiry of an idle per-transaction fence counter (Redis key, or PostgreSQL
    /// lease row); at least FENCEHOOK_LEASE_MAX_MS. Safety does not depend on
    /// it: a counter that starts again is fast-forwarded past the database fence.
    #[arg(long, env = setting::FENCEHOOK_FENCE_KEY_TTL_SECS, default_value_t = 300)]
    pub fence_key_ttl_secs: u64,
    /// Prefix of every Redis key (`<prefix>:{<provider>:<transaction_id>}:lock`).
    #[arg(long, env = setting::FENCEHOOK_REDIS_KEY_PREFIX, default_value = "fencehook")]
    pub redis_key_prefix: String,
    /// Timeout of one lease command (acquire, renew, release), on Redis or,
    /// with the postgres backend, on the database; below a third of the TTL.
    /// Default: a quarter of the TTL, at most 1000.
    #[arg(long, env = setting::FENCEHOOK_LEASE_TIMEOUT_MS)]
    pub lease_timeout_ms: Option<u64>,
    /// How long a delivery waits for another holder's outcome before answering 409.
    #[arg(long, env = setting::FENCEHOOK_INFLIGHT_WAIT_MS, default_value_t = 1000)]
    pub inflight_wait_ms: u64,
    /// Business service to POST each canonical event to before it is
    /// finalised: http:// or https:// (verified against the public CAs, or
    /// FENCEHOOK_DOWNSTREAM_CA_FILE).
    #[arg(long, env = setting::FENCEHOOK_DOWNSTREAM_URL)]
    pub downstream_url: Option<String>,
    /// Timeout of one downstream call.
    #[arg(
        long,
        env = setting::FENCEHOOK_DOWNSTREAM_TIMEOUT_MS,
        default_value_t = 10_000
    )]
    pub downstream_timeout_ms: u64,
    /// TOML file of providers; without it a built-in `generic` provider is served.
    #[arg(long, env = setting::FENCEHOOK_PROVIDERS)]
    pub providers: Option<PathBuf>,
    /// Secret (`whsec_<base64>`) of the built-in `generic` provider.
    #[arg(long, env = setting::FENCEHOOK_GENERIC_SECRET, hide_env_values = true)]
    pub generic_secret: Option<String>,
    /// Development only (`make run` sets it): serve secrets and keys published
    /// in fencehook's own files, or shorter than their PSP issues. Refused
    /// without it: anyone can sign with them.
    #[arg(long, env = setting::FENCEHOOK_ALLOW_PUBLISHED_SECRETS, default_value_t = false, action = clap::ArgAction::Set)]
    pub allow_published_secrets: bool,
    /// Largest accepted request body.
    #[arg(long, env = setting::FENCEHOOK_MAX_BODY_BYTES, default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,
    /// Longest the whole request body may take to arrive; past it 408 and the connection is closed.
    #[arg(long, env = setting::FENCEHOOK_BODY_TIMEOUT_MS, default_value_t = 10_000)]
    pub body_timeout_ms: u64,
    /// Deliveries processed at once by this instance; beyond it they are answered 503 at once.
    #[arg(long, env = setting::FENCEHOOK_MAX_INFLIGHT, default_value_t = 512)]
    pub max_inflight: usize,
    /// Connections open at once on the public listener; beyond it a new one gets 503 and is closed.
    #[arg(long, env = setting::FENCEHOOK_MAX_CONNECTIONS, default_value_t = 1024)]
    pub max_connections: usize,
    /// Connections one peer address may hold open at once on the public
    /// listener; beyond it a new one gets 503 and is closed. Behind a proxy
    /// every connection has the proxy's address: keep it at or above the
    /// proxy's own bound (nginx's `max_conns`).
    #[arg(
        long,
        env = setting::FENCEHOOK_MAX_CONNECTIONS_PER_PEER,
        default_value_t = 256
    )]
    pub max_connections_per_peer: usize,
    /// How many leading bits of an IPv6 peer address make one peer for that
    /// cap (1–128; 128: each address alone). A client commonly holds a
    /// whole /64 and can connect from any address in it; IPv4 addresses
    /// are each a peer.
    #[arg(
        long,
        env = setting::FENCEHOOK_PEER_IPV6_PREFIX,
        default_value_t = 64
    )]
    pub peer_ipv6_prefix: u8,
    /// Requests one keep-alive connection may carry; the last is answered
    /// with `Connection: close`.
    #[arg(
        long,
        env = setting::FENCEHOOK_CONNECTION_MAX_REQUESTS,
        default_value_t = 1000
    )]
    pub connection_max_requests: u64,
    /// Age after which a keep-alive connection's next answer carries
    /// `Connection: close`.
    #[arg(long, env = setting::FENCEHOOK_CONNECTION_MAX_AGE_SECS, default_value_t = 120)]
    pub connection_max_age_secs: u64,
    /// Bound on finishing in-flight deliveries after SIGTERM/SIGINT.
    #[arg(long, env = setting::FENCEHOOK_SHUTDOWN_TIMEOUT_MS, default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,
    /// Apply migrations from sql/ at start.
    #[arg(long, env = setting::FENCEHOOK_MIGRATE_ON_START, default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate_on_start: bool,
    /// Answer deliveries 503 (and `/readyz` 503) while the database's commits
    /// do not wait for a synchronous standby: an acknowledged payment could
    /// otherwise be lost in a failover.
    #[arg(long, env = setting::FENCEHOOK_REQUIRE_SYNC_REPLICATION, default_value_t = false, action = clap::ArgAction::Set)]
    pub require_sync_replication: bool,
    /// Record every delivery that reached the fenced path, with its answer,
    /// in the delivery history (kept for FENCEHOOK_EVENT_RETENTION_DAYS;
    /// written in batches off the delivery path).
    #[arg(long, env = setting::FENCEHOOK_DELIVERY_HISTORY, default_value_t = true, action = clap::ArgAction::Set)]
    pub delivery_history: bool,
    /// Log format.
    #[arg(long, env = setting::FENCEHOOK_LOG_FORMAT, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log levels, per module if wanted (e.g. `warn`, `info,fencehook::inbox=debug`).
    #[arg(long, env = setting::FENCEHOOK_LOG, default_value = "info")]
    pub log: String,
    #[command(flatten)]
    pub inbox: InboxArgs,
    #[command(flatten)]
    pub reconcile: reconcile::ScheduleArgs,
    #[command(flatten)]
    pub console: console::ConsoleArgs,
    #[command(flatten)]
    pub traces: TraceArgs,
    #[command(flatten)]
    pub downstream_trust: downstream::DownstreamArgs,
}

/// Inbox mode: accept in one write, book asynchronously.
#[derive(Debug, Clone, Args)]
pub struct InboxArgs {
    /// sync: book before answering; inbox: answer `accepted` after one
    /// durable write, workers book it.
    #[arg(long, env = setting::FENCEHOOK_MODE, value_enum, default_value = "sync")]
    pub mode: Mode,
    /// Inbox workers in this process (0: accept only).
    #[arg(long, env = setting::FENCEHOOK_WORKERS, default_value_t = 4)]
    pub workers: usize,
    /// First retry delay after a failed attempt; doubles per attempt, with jitter.
    #[arg(long, env = setting::FENCEHOOK_RETRY_BASE_MS, default_value_t = 1000)]
    pub retry_base_ms: u64,
    /// Longest retry delay.
    #[arg(long, env = setting::FENCEHOOK_RETRY_MAX_MS, default_value_t = 3_600_000)]
    pub retry_max_ms: u64,
    /// Failed attempts after which an event is dead (until replayed).
    #[arg(long, env = setting::FENCEHOOK_MAX_ATTEMPTS, default_value_t = 20)]
    pub max_attempts: u32,
    /// Age after which an event is dead, whatever its attempts.
    #[arg(long, env = setting::FENCEHOOK_MAX_AGE_SECS, default_value_t = 259_200)]
    pub max_age_secs: u64,
    /// How long finished events are kept (by `fencehook prune` and the
    /// scheduled prune).
    #[arg(long, env = setting::FENCEHOOK_EVENT_RETENTION_DAYS, default_value_t = 30)]
    pub event_retention_days: u64,
    /// How often `serve` and `work` delete finished events past retention
    /// (as `fencehook prune` does); 0: never, prune by hand or cron.
    #[arg(long, env = setting::FENCEHOOK_PRUNE_INTERVAL_SECS, default_value_t = 3600)]
    pub prune_interval_secs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Sync,
    Inbox,
}

/// Inbox settings, validated.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    pub mode: Mode,
    pub workers: usize,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub retention: Duration,
    /// How often the scheduled prune runs; `None`: never.
    pub prune_interval: Option<Duration>,
    /// How long an idle worker sleeps when no notification wakes it: 1 s,
    /// not a setting (tests lengthen it to show that notifications, not the
    /// poll, wake the workers).
    pub idle_poll: Duration,
}

impl InboxArgs {
    /// Every inbox setting checked, each bad one named.
    pub fn validate(&self) -> Result<InboxConfig, ConfigErrors> {
        let mut found = Found::default();
        if self.retry_base_ms == 0 {
            found.refuse(setting::FENCEHOOK_RETRY_BASE_MS, "must be above 0");
        }
        if self.retry_max_ms < self.retry_base_ms {
            found.refuse(
                setting::FENCEHOOK_RETRY_MAX_MS,
                format!(
                    "must be at least {fencehook_retry_base_ms}",
                    fencehook_retry_base_ms = setting::FENCEHOOK_RETRY_BASE_MS
                ),
            );
        } else if self.retry_max_ms > MAX_RETRY_MAX_MS {
            found.refuse(
                setting::FENCEHOOK_RETRY_MAX_MS,
                format!("must be at most {MAX_RETRY_MAX_MS} (30 days)"),
            );
        }
        if self.max_attempts == 0 {
            found.refuse(setting::FENCEHOOK_MAX_ATTEMPTS, "must be at least 1");
        }
        if self.max_age_secs == 0 {
            found.refuse(setting::FENCEHOOK_MAX_AGE_SECS, "must be above 0");
        } else if self.max_age_secs > MAX_RETENTION_DAYS * 86_400 {
            found.refuse(
                setting::FENCEHOOK_MAX_AGE_SECS,
                format!(
                    "must be at most {} ({MAX_RETENTION_DAYS} days)",
                    MAX_RETENTION_DAYS * 86_400
                ),
            );
        }
        let retention = found.ok(retention(self.event_retention_days));
        if self.prune_interval_secs > MAX_PRUNE_INTERVAL_SECS {
            found.refuse(
                setting::FENCEHOOK_PRUNE_INTERVAL_SECS,
                format!("must be at most {MAX_PRUNE_INTERVAL_SECS} (a week), or 0 for never"),
            );
        }
        if self.workers > 256 {
            found.refuse(setting::FENCEHOOK_WORKERS, "must be at most 256");
        }
        found.finish(retention, |retention| InboxConfig {
            mode: self.mode,
            workers: self.workers,
            retry_base: Duration::from_millis(self.retry_base_ms),
            retry_max: Duration::from_millis(self.retry_max_ms),
            max_attempts: self.max_attempts,
            max_age: Duration::from_secs(self.max_age_secs),
            retention,
            prune_interval: (self.prune_interval_secs > 0)
                .then(|| Duration::from_secs(self.prune_interval_secs)),
            idle_poll: Duration::from_secs(1),
        })
    }
}

/// Longest `FENCEHOOK_EVENT_RETENTION_DAYS` (and `FENCEHOOK_MAX_AGE_SECS`):
/// a hundred years, "keep forever" in practice. Above it a date computed
/// from the setting could leave the calendar (a huge value once wrapped to
/// −1 days, and `prune` deleted every finished event).
pub const MAX_RETENTION_DAYS: u64 = 36_500;

/// Longest `FENCEHOOK_RETRY_MAX_MS`: 30 days.
const MAX_RETRY_MAX_MS: u64 = 30 * 86_400_000;

/// Longest `FENCEHOOK_PRUNE_INTERVAL_SECS`: a week.
const MAX_PRUNE_INTERVAL_SECS: u64 = 7 * 86_400;

/// `FENCEHOOK_EVENT_RETENTION_DAYS`, checked: between 1 and
/// [`MAX_RETENTION_DAYS`].
pub fn retention(days: u64) -> Result<Duration, ConfigError> {
    if !(1..=MAX_RETENTION_DAYS).contains(&days) {
        return Err(bad(
            setting::FENCEHOOK_EVENT_RETENTION_DAYS,
            format!("{days} must be between 1 and {MAX_RETENTION_DAYS} (100 years)"),
        ));
    }
    Ok(Duration::from_secs(days * 86_400))
}

/// `now - age`, or `None` when that is not a date (before year −9999):
/// a duration never meets a date unchecked.
pub fn time_before(now: time::OffsetDateTime, age: Duration) -> Option<time::OffsetDateTime> {
    now.checked_sub(time::Duration::try_from(age).ok()?)
}

/// Lease settings, validated.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub backend: LeaseBackendKind,
    /// One server or Cluster seeds; unused when `sentinel` is set.
    pub redis_url: String,
    /// The master is asked of these sentinels instead of `redis_url`.
    pub sentinel: Option<SentinelConfig>,
    /// For `rediss://`.
    pub redis_tls: RedisTls,
    pub key_prefix: String,
    pub ttl: Duration,
    pub max_hold: Duration,
    pub fence_key_ttl: Duration,
    /// Bound on one lease command, whichever backend answers it.
    pub lease_timeout: Duration,
}

impl LeaseConfig {
    /// Where the leases live, for the start log: the Redis nodes, or the
    /// sentinels and the master's name; never a password.
    pub fn redis_target(&self) -> String {
        match &self.sentinel {
            Some(s) => format!("sentinels {} master {}", s.sentinels.join(","), s.master),
            None => redis_target(&self.redis_url),
        }
    }

    /// The heartbeat renews this often: a third of the TTL, so two renewals
    /// can fail before the lease expires.
    pub fn renew_interval(&self) -> Duration {
        self.ttl / 3
    }
}

impl Config {
    /// Settings that start but are probably a mistake: said at start (and by
    /// `check-config`), never refused.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .providers
            .iter()
            .flat_map(|p| p.warnings().iter().cloned())
            .collect();
        if self.allow_published_secrets {
            out.push(
                format!("{fencehook_allow_published_secrets}=true: for development only; never in production", fencehook_allow_published_secrets = setting::FENCEHOOK_ALLOW_PUBLISHED_SECRETS)
                    .to_owned(),
            );
            out.extend(self.providers.iter().flat_map(|p| {
                p.exposures().iter().map(|e| {
                    format!(
                        "{e}; served because {fencehook_allow_published_secrets}=true",
                        fencehook_allow_published_secrets =
                            setting::FENCEHOOK_ALLOW_PUBLISHED_SECRETS
                    )
                })
            }));
        }
        if !self.admin_listen.ip().is_loopback() {
            out.push(format!(
                "{fencehook_admin_listen} {} is not a loopback address: /metrics, /healthz and /readyz answer whoever reaches it; keep it on a private network, never public",
                self.admin_listen, fencehook_admin_listen = setting::FENCEHOOK_ADMIN_LISTEN
            ));
        }
        out
    }
}

/// Where `REDIS_URL` points, for the start log: host:port/db of each node,
/// never a password.
pub fn redis_target(url: &str) -> String {
    url.split(',')
        .map(|node| {
            let rest = node.trim().split_once("://").map_or(node, |(_, r)| r);
            rest.rsplit_once('@')
                .map_or(rest, |(_, hostpart)| hostpart)
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A URL for messages: scheme, host, port and path; never the user,
/// password or query string.
pub fn redacted_url(uri: &hyper::Uri) -> String {
    let mut out = format!("{}://", uri.scheme_str().unwrap_or("http"));
    out.push_str(uri.host().unwrap_or(""));
    if let Some(port) = uri.port_u16() {
        out.push_str(&format!(":{port}"));
    }
    out.push_str(uri.path());
    out
}

/// Everything `App::build` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub db: DbConfig,
    pub lease: LeaseConfig,
    pub inflight_wait: Duration,
    pub downstream_url: Option<hyper::Uri>,
    pub downstream_timeout: Duration,
    /// Whom an https:// downstream must prove it is, and the key every call
    /// is signed with (none by default).
    pub downstream_trust: downstream::DownstreamTrust,
    pub providers: Vec<Provider>,
    /// `FENCEHOOK_PROVIDERS`: re-read on SIGHUP.
    pub providers_file: Option<PathBuf>,
    pub max_body_bytes: usize,
    /// Bound on reading one whole request body.
    pub body_timeout: Duration,
    pub max_inflight: usize,
    /// Connections open at once on the public listener.
    pub max_connections: usize,
    /// Connections open at once from one peer address on the public listener.
    pub max_connections_per_peer: usize,
    /// IPv6 peers are counted by this prefix of their address (bits).
    pub peer_ipv6_prefix: u8,
    /// Requests one keep-alive connection carries before it is closed.
    pub connection_max_requests: u64,
    /// Age past which a keep-alive connection is closed after its next answer.
    pub connection_max_age: Duration,
    /// `FENCEHOOK_ALLOW_PUBLISHED_SECRETS` (development only): also applied
    /// to the providers file re-read on SIGHUP.
    pub allow_published_secrets: bool,
    pub shutdown_timeout: Duration,
    pub migrate_on_start: bool,
    /// `FENCEHOOK_REQUIRE_SYNC_REPLICATION`.
    pub require_sync_replication: bool,
    /// `FENCEHOOK_DELIVERY_HISTORY`.
    pub delivery_history: bool,
    pub inbox: InboxConfig,
    /// The scheduled reconciliation (off by default).
    pub reconcile: reconcile::ReconcileConfig,
    /// The operator console (`/console` on the admin listener); off by default.
    pub console: console::ConsoleConfig,
    /// OpenTelemetry traces; `None`: off (no OTLP endpoint set).
    pub traces: Option<TraceConfig>,
}

impl ServeArgs {
    /// Checks every setting and the rules between them; every bad one is
    /// named.
    pub fn validate(&self) -> Result<Config, ConfigErrors> {
        self.validate_with(true)
    }

    /// As [`ServeArgs::validate`], for `fencehook work`: workers verify no
    /// signature, so providers are optional (the same environment file as
    /// `serve` still works).
    pub fn validate_for_workers(&self) -> Result<Config, ConfigErrors> {
        self.validate_with(false)
    }

    fn validate_with(&self, providers_required: bool) -> Result<Config, ConfigErrors> {
        let mut found = Found::default();
        let listeners = self.listeners(&mut found);
        let db = found.all(self.db.validate());
        let lease = found.all(self.lease_config());
        let downstream_url = found.ok(self.downstream_url());
        if let (Some(Some(_)), Some(lease)) = (&downstream_url, &lease) {
            found.ok(self.downstream_fits(lease));
        }
        let downstream_trust = match &downstream_url {
            Some(url) => found.all(self.downstream_trust.validate(url.as_ref())),
            // The URL is bad: its trust is checked once it is fixed.
            None => Some(Default::default()),
        };
        self.limits(&mut found);
        let providers = self.providers(providers_required, &mut found);
        let inbox = found.all(self.inbox.validate());
        let reconcile = found.all(self.reconcile.validate());
        // `work` serves no console: its token files are not read there.
        let console = match providers_required {
            true => found.ok(self.console.validate()),
            false => Some(Default::default()),
        };
        let traces = found.ok(self.traces.validate());
        let parts = (|| {
            Some((
                listeners?,
                db?,
                lease?,
                downstream_url?,
                downstream_trust?,
                providers?,
                inbox?,
                reconcile?,
                console?,
                traces?,
            ))
        })();
        found.finish(
            parts,
            |(
                (listen, admin_listen),
                db,
                lease,
                downstream_url,
                downstream_trust,
                providers,
                inbox,
                reconcile,
                console,
                traces,
            )| {
                Config {
                    listen,
                    admin_listen,
                    db,
                    lease,
                    inflight_wait: Duration::from_millis(self.inflight_wait_ms),
                    downstream_url,
                    downstream_timeout: Duration::from_millis(self.downstream_timeout_ms),
                    downstream_trust,
                    providers,
                    providers_file: self.providers.clone(),
                    max_body_bytes: self.max_body_bytes,
                    body_timeout: Duration::from_millis(self.body_timeout_ms),
                    max_inflight: self.max_inflight,
                    max_connections: self.max_connections,
                    max_connections_per_peer: self.max_connections_per_peer,
                    peer_ipv6_prefix: self.peer_ipv6_prefix,
                    connection_max_requests: self.connection_max_requests,
                    connection_max_age: Duration::from_secs(self.connection_max_age_secs),
                    allow_published_secrets: self.allow_published_secrets,
                    shutdown_timeout: Duration::from_millis(self.shutdown_timeout_ms),
                    migrate_on_start: self.migrate_on_start,
                    require_sync_replication: self.require_sync_replication,
                    delivery_history: self.delivery_history,
                    inbox,
                    reconcile,
                    console,
                    traces,
                }
            },
        )
    }

    /// The public and admin addresses: each host:port, and not the same one.
    fn listeners(&self, found: &mut Found) -> Option<(SocketAddr, SocketAddr)> {
        let listen: Option<SocketAddr> = found.ok(self.listen.parse().map_err(|_| {
            bad(
                setting::FENCEHOOK_LISTEN,
                format!("`{}` is not host:port", self.listen),
            )
        }));
        let admin_listen: Option<SocketAddr> = found.ok(self.admin_listen.parse().map_err(|_| {
            bad(
                setting::FENCEHOOK_ADMIN_LISTEN,
                format!("`{}` is not host:port", self.admin_listen),
            )
        }));
        let (listen, admin_listen) = (listen?, admin_listen?);
        if admin_listen == listen && admin_listen.port() != 0 {
            found.refuse(
                setting::FENCEHOOK_ADMIN_LISTEN,
                format!(
                    "must differ from {fencehook_listen}",
                    fencehook_listen = setting::FENCEHOOK_LISTEN
                ),
            );
            return None;
        }
        Some((listen, admin_listen))
    }

    /// `FENCEHOOK_DOWNSTREAM_URL`, when one is set: an http:// or https://
    /// URL with a host.
    fn downstream_url(&self) -> Result<Option<hyper::Uri>, ConfigError> {
        let Some(s) = self.downstream_url.as_deref().filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let uri: hyper::Uri = s.parse().map_err(|_| {
            bad(
                setting::FENCEHOOK_DOWNSTREAM_URL,
                format!("`{s}` is not a URL"),
            )
        })?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(bad(
                setting::FENCEHOOK_DOWNSTREAM_URL,
                "must be an http:// or https:// URL with a host",
            ));
        }
        Ok(Some(uri))
    }

    /// With a downstream: its timeout is set, and a lease can be held
    /// through one call.
    fn downstream_fits(&self, lease: &LeaseConfig) -> Result<(), ConfigError> {
        if self.downstream_timeout_ms == 0 {
            return Err(bad(
                setting::FENCEHOOK_DOWNSTREAM_TIMEOUT_MS,
                "must be above 0",
            ));
        }
        if Duration::from_millis(self.downstream_timeout_ms) + lease.ttl > lease.max_hold {
            return Err(bad(
                setting::FENCEHOOK_LEASE_MAX_MS,
                format!(
                    "{} ms cannot cover {fencehook_downstream_timeout_ms} ({}) plus one lease TTL ({})",
                    lease.max_hold.as_millis(),
                    self.downstream_timeout_ms,
                    self.lease_ttl_ms, fencehook_downstream_timeout_ms = setting::FENCEHOOK_DOWNSTREAM_TIMEOUT_MS
                ),
            ));
        }
        Ok(())
    }

    /// The bounds on deliveries, bodies and connections, each checked.
    fn limits(&self, found: &mut Found) {
        if self.max_inflight == 0 {
            found.refuse(setting::FENCEHOOK_MAX_INFLIGHT, "must be at least 1");
        } else if self.db.db_pool_size > self.max_inflight {
            // Each delivery holds at most one pooled connection at a time, so
            // connections beyond the in-flight limit could never be used.
            found.refuse(
                setting::FENCEHOOK_DB_POOL_SIZE,
                format!(
                    "{} is more than {fencehook_max_inflight} ({}): a delivery uses one connection at a time",
                    self.db.db_pool_size, self.max_inflight, fencehook_max_inflight = setting::FENCEHOOK_MAX_INFLIGHT
                ),
            );
        }
        if self.max_body_bytes < 256 {
            found.refuse(setting::FENCEHOOK_MAX_BODY_BYTES, "must be at least 256");
        }
        // A PSP sends a few KiB at once; 30 s is already generous, and a
        // longer bound would let slow clients keep connections for nothing.
        if !(1..=MAX_BODY_TIMEOUT_MS).contains(&self.body_timeout_ms) {
            found.refuse(
                setting::FENCEHOOK_BODY_TIMEOUT_MS,
                format!(
                    "{} must be between 1 and {MAX_BODY_TIMEOUT_MS} ms",
                    self.body_timeout_ms
                ),
            );
        }
        if !(1..=128).contains(&self.peer_ipv6_prefix) {
            found.refuse(
                setting::FENCEHOOK_PEER_IPV6_PREFIX,
                format!("{} must be between 1 and 128 (bits)", self.peer_ipv6_prefix),
            );
        }
        for (setting, value) in [
            (
                setting::FENCEHOOK_MAX_CONNECTIONS,
                self.max_connections as u64,
            ),
            (
                setting::FENCEHOOK_MAX_CONNECTIONS_PER_PEER,
                self.max_connections_per_peer as u64,
            ),
            (
                setting::FENCEHOOK_CONNECTION_MAX_REQUESTS,
                self.connection_max_requests,
            ),
        ] {
            if value == 0 {
                found.refuse(setting, "must be at least 1");
            }
        }
        if !(1..=MAX_CONNECTION_AGE_SECS).contains(&self.connection_max_age_secs) {
            found.refuse(
                setting::FENCEHOOK_CONNECTION_MAX_AGE_SECS,
                format!("must be between 1 and {MAX_CONNECTION_AGE_SECS} (a day)"),
            );
        }
    }

    /// The providers: the file's, or the built-in `generic` one; none for
    /// `work` without either. Every error of the file is kept, and every
    /// published secret named.
    fn providers(&self, required: bool, found: &mut Found) -> Option<Vec<Provider>> {
        let setting = match &self.providers {
            Some(_) => setting::FENCEHOOK_PROVIDERS,
            None => setting::FENCEHOOK_GENERIC_SECRET,
        };
        let providers = match &self.providers {
            Some(path) => match providers::load_file(path) {
                Ok(providers) => providers,
                Err(e) => {
                    for line in e.into_lines() {
                        found.refuse(setting, line);
                    }
                    return None;
                }
            },
            None if !required && self.generic_secret.is_none() => Vec::new(),
            None => {
                let Some(secret) = self.generic_secret.as_deref() else {
                    found.refuse(
                        setting,
                        format!(
                            "required when {fencehook_providers} is not set",
                            fencehook_providers = setting::FENCEHOOK_PROVIDERS
                        ),
                    );
                    return None;
                };
                vec![found.ok(Provider::generic(secret).map_err(|e| bad(setting, e)))?]
            }
        };
        // Anyone who has read fencehook's repository could sign with these.
        if !self.allow_published_secrets {
            let exposed: Vec<String> = providers
                .iter()
                .flat_map(|p| p.exposures().iter().cloned())
                .collect();
            for e in &exposed {
                found.refuse(
                    setting,
                    format!("{e}; use the PSP's own ({fencehook_allow_published_secrets}=true serves it, for development only)", fencehook_allow_published_secrets = setting::FENCEHOOK_ALLOW_PUBLISHED_SECRETS),
                );
            }
            if !exposed.is_empty() {
                return None;
            }
        }
        Some(providers)
    }

    fn lease_config(&self) -> Result<LeaseConfig, ConfigErrors> {
        let mut found = Found::default();
        found.ok(self.backend_allowed());
        // Only the Redis backend reads the Redis settings: with postgres (or
        // unique-only) REDIS_URL, the sentinels and the TLS files are not
        // looked at, so a malformed or stale one does not stop the start.
        let redis = found.ok(match self.lease_backend {
            LeaseBackendKind::Redis => self.redis_lease(),
            LeaseBackendKind::Postgres | LeaseBackendKind::UniqueOnly => {
                Ok((self.redis_url_or_default(), None, RedisTls::default()))
            }
        });
        let timing = found.ok(self.lease_timing());
        let prefix = &self.redis_key_prefix;
        if prefix.is_empty()
            || prefix.contains(['{', '}'])
            || prefix.chars().any(|c| c.is_whitespace())
        {
            found.refuse(
                setting::FENCEHOOK_REDIS_KEY_PREFIX,
                "must be non-empty, without braces or spaces",
            );
        }
        found.finish(
            redis.zip(timing),
            |((redis_url, sentinel, redis_tls), (ttl, lease_timeout, fence_key_ttl))| LeaseConfig {
                backend: self.lease_backend,
                redis_url,
                sentinel,
                redis_tls,
                key_prefix: prefix.clone(),
                ttl,
                max_hold: Duration::from_millis(self.lease_max_ms),
                fence_key_ttl,
                lease_timeout,
            },
        )
    }

    /// `unique-only` only where it can run.
    fn backend_allowed(&self) -> Result<(), ConfigError> {
        if self.lease_backend == LeaseBackendKind::UniqueOnly {
            if !cfg!(feature = "bench-baseline") {
                return Err(bad(
                    setting::FENCEHOOK_LEASE_BACKEND,
                    "unique-only exists only in benchmark builds (feature bench-baseline); use redis or postgres",
                ));
            }
            if self.downstream_url.is_some() {
                return Err(bad(
                    setting::FENCEHOOK_LEASE_BACKEND,
                    format!("unique-only has no lease to take over a crashed holder's claim: it is for inline benchmarks without {fencehook_downstream_url}", fencehook_downstream_url = setting::FENCEHOOK_DOWNSTREAM_URL),
                ));
            }
        }
        Ok(())
    }

    /// The TTL, the lease command timeout and the counter's expiry, checked
    /// against each other.
    fn lease_timing(&self) -> Result<(Duration, Duration, Duration), ConfigError> {
        if self.lease_ttl_ms < 150 {
            return Err(bad(
                setting::FENCEHOOK_LEASE_TTL_MS,
                "must be at least 150 ms",
            ));
        }
        let ttl = Duration::from_millis(self.lease_ttl_ms);
        let lease_timeout = match self.lease_timeout_ms {
            // Derived from the TTL, so a TTL set alone always starts.
            None => (ttl / 4).min(DEFAULT_LEASE_TIMEOUT),
            Some(0) => return Err(bad(setting::FENCEHOOK_LEASE_TIMEOUT_MS, "must be above 0")),
            Some(ms) => Duration::from_millis(ms),
        };
        // A renewal sent at ttl/3 that times out must still leave time for a
        // second attempt before the lease expires.
        if lease_timeout >= ttl / 3 {
            return Err(bad(
                setting::FENCEHOOK_LEASE_TIMEOUT_MS,
                format!(
                    "{} ms must be below a third of {fencehook_lease_ttl_ms} ({} ms), or one slow renewal loses the lease",
                    lease_timeout.as_millis(),
                    self.lease_ttl_ms / 3, fencehook_lease_ttl_ms = setting::FENCEHOOK_LEASE_TTL_MS
                ),
            ));
        }
        if self.lease_max_ms < self.lease_ttl_ms {
            return Err(bad(
                setting::FENCEHOOK_LEASE_MAX_MS,
                format!(
                    "must be at least {fencehook_lease_ttl_ms}",
                    fencehook_lease_ttl_ms = setting::FENCEHOOK_LEASE_TTL_MS
                ),
            ));
        }
        // The counter must outlive every lease taken from it: renewed leases
        // last up to the maximum hold, and each acquire refreshes the counter.
        let fence_key_ttl = Duration::from_secs(self.fence_key_ttl_secs);
        if fence_key_ttl < Duration::from_millis(self.lease_max_ms) {
            return Err(bad(
                setting::FENCEHOOK_FENCE_KEY_TTL_SECS,
                format!(
                    "{} s is shorter than {fencehook_lease_max_ms} ({} ms): a counter must outlive the leases taken from it",
                    self.fence_key_ttl_secs, self.lease_max_ms, fencehook_lease_max_ms = setting::FENCEHOOK_LEASE_MAX_MS
                ),
            ));
        }
        Ok((ttl, lease_timeout, fence_key_ttl))
    }

    /// `REDIS_URL` as given (checked only for the Redis backend), or the
    /// default.
    fn redis_url_or_default(&self) -> String {
        self.redis_url
            .clone()
            .unwrap_or_else(|| DEFAULT_REDIS_URL.to_owned())
    }

    /// The Redis backend's settings, checked: the URL (or the cluster's seed
    /// nodes), the sentinels and the TLS files.
    fn redis_lease(&self) -> Result<(String, Option<SentinelConfig>, RedisTls), ConfigError> {
        let sentinel = self.redis_ha.sentinel(self.redis_url.as_deref())?;
        let redis_url = self.redis_url_or_default();
        // One URL, or a comma-separated list of Redis Cluster seed nodes; all
        // TLS or none.
        let nodes: Vec<&str> = redis_url.split(',').map(str::trim).collect();
        for node in &nodes {
            if !node.starts_with("redis://") && !node.starts_with("rediss://") {
                return Err(bad(
                    setting::REDIS_URL,
                    format!("`{node}` is not a redis:// or rediss:// URL"),
                ));
            }
        }
        let tls_url = nodes.iter().any(|n| n.starts_with("rediss://"));
        if tls_url && !nodes.iter().all(|n| n.starts_with("rediss://")) {
            return Err(bad(
                setting::REDIS_URL,
                "mixes redis:// and rediss://: every node is TLS or none",
            ));
        }
        let redis_tls = self.redis_ha.tls(tls_url && sentinel.is_none())?;
        Ok((redis_url, sentinel, redis_tls))
    }
}

/// Upper bound of `FENCEHOOK_CONNECTION_MAX_AGE_SECS`.
const MAX_CONNECTION_AGE_SECS: u64 = 86_400;

/// Upper bound of `FENCEHOOK_BODY_TIMEOUT_MS`.
const MAX_BODY_TIMEOUT_MS: u64 = 30_000;

/// The lease timeout when `FENCEHOOK_LEASE_TIMEOUT_MS` is not set: a quarter
/// of the TTL, at most this.
const DEFAULT_LEASE_TIMEOUT: Duration = Duration::from_millis(1000);

/// Settings that were renamed: (old name, new name). Warned about at start.
pub const RENAMED_SETTINGS: &[(&str, &str)] = &[(
    setting::FENCEHOOK_REDIS_TIMEOUT_MS,
    setting::FENCEHOOK_LEASE_TIMEOUT_MS,
)];

/// Variables in `env` that look like a setting but are none: every
/// `FENCEHOOK_*` that no setting reads, and any other name one or two
/// letters away from a known one (`DATABSE_URL`, `REDIS_ULR`). Each comes
/// with the setting it was probably meant to be, when one is that close. A
/// typo would otherwise leave a default silently in force — the wrong
/// database, say.
pub fn misspelt_settings(
    known: &[String],
    env: impl IntoIterator<Item = (String, String)>,
) -> Vec<(String, Option<String>)> {
    let closest = |name: &str| {
        known
            .iter()
            .map(|k| (strsim::damerau_levenshtein(name, k), k))
            .filter(|(d, _)| *d <= 2)
            .min()
            .map(|(_, k)| k.clone())
    };
    let mut out: Vec<(String, Option<String>)> = env
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| !known.contains(k))
        .filter_map(|k| {
            let near = closest(&k);
            (k.starts_with(setting::PREFIX) || near.is_some()).then_some((k, near))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    #[command(args_override_self = true)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        parse_all(args).map_err(ConfigErrors::into_first)
    }

    /// Every error of `args`, with a generic secret and a database given
    /// unless `args` give others.
    fn parse_all(args: &[&str]) -> Result<Config, ConfigErrors> {
        let mut argv = vec![
            "fencehook",
            "--generic-secret",
            "whsec_dGVzdC1zZWNyZXQtZm9yLWZlbmNlaG9vay10ZXN0cw==",
            "--database-url",
            "postgres://fencehook_app@db.internal:5432/fencehook",
        ];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .expect("flags parse")
            .serve
            .validate()
    }

    #[test]
    fn every_bad_setting_is_named_in_one_validation_in_the_order_checked() {
        let e = parse_all(&[
            "--listen",
            "nowhere",
            "--database-url",
            "postgres://app:p@ss@db.internal/fencehook",
            "--db-statement-timeout-ms",
            "0",
            "--lease-ttl-ms",
            "10",
            "--redis-key-prefix",
            "a b",
            "--max-body-bytes",
            "10",
            "--max-connections",
            "0",
            "--retry-base-ms",
            "0",
            "--workers",
            "1000",
            "--generic-secret",
            "not-a-secret",
        ])
        .unwrap_err();
        let named: Vec<&str> = e.all().iter().map(|e| e.setting).collect();
        assert_eq!(
            named,
            [
                "FENCEHOOK_LISTEN",
                "DATABASE_URL",
                "FENCEHOOK_DB_STATEMENT_TIMEOUT_MS",
                "FENCEHOOK_LEASE_TTL_MS",
                "FENCEHOOK_REDIS_KEY_PREFIX",
                "FENCEHOOK_MAX_BODY_BYTES",
                "FENCEHOOK_MAX_CONNECTIONS",
                "FENCEHOOK_GENERIC_SECRET",
                "FENCEHOOK_RETRY_BASE_MS",
                "FENCEHOOK_WORKERS",
            ]
        );
        assert!(
            e.all()[1].reason.contains("percent-encode"),
            "{}",
            e.all()[1]
        );
        let one_line = e.to_string();
        assert!(
            one_line.starts_with("FENCEHOOK_LISTEN: ")
                && one_line.ends_with("(9 more: `fencehook check-config` lists every one)")
                && !one_line.contains('\n'),
            "{one_line}"
        );
    }

    #[test]
    fn the_unique_only_baseline_is_refused_outside_benchmark_builds_and_with_a_downstream() {
        let e = parse(&["--lease-backend", "unique-only"]);
        if cfg!(feature = "bench-baseline") {
            assert!(e.is_ok(), "{e:?}");
        } else {
            let e = e.unwrap_err();
            assert_eq!(e.setting, "FENCEHOOK_LEASE_BACKEND");
            assert!(e.reason.contains("benchmark builds"), "{}", e.reason);
        }
        let e = parse(&[
            "--lease-backend",
            "unique-only",
            "--downstream-url",
            "http://127.0.0.1:1/book",
        ])
        .unwrap_err();
        assert_eq!(e.setting, "FENCEHOOK_LEASE_BACKEND");
    }

    #[test]
    fn near_misses_of_any_setting_are_listed_with_what_they_were_meant_to_be() {
        let known: Vec<String> = ["DATABASE_URL", "REDIS_URL", "FENCEHOOK_LEASE_TTL_MS"]
            .map(str::to_owned)
            .to_vec();
        let env = [
            "DATABSE_URL",
            "REDIS_ULR",
            "DATABASE_URL",
            "FENCEHOOK_LEASE_TTL",
            "FENCEHOOK_NOTHING_LIKE_IT",
            "PATH",
            "HOME",
        ]
        .map(|k| (k.to_owned(), String::new()));
        let found = misspelt_settings(&known, env);
        let shown: Vec<(&str, Option<&str>)> = found
            .iter()
            .map(|(k, near)| (k.as_str(), near.as_deref()))
            .collect();
        assert_eq!(
            shown,
            [
                ("DATABSE_URL", Some("DATABASE_URL")),
                ("FENCEHOOK_LEASE_TTL", None),
                ("FENCEHOOK_NOTHING_LIKE_IT", None),
                ("REDIS_ULR", Some("REDIS_URL")),
            ]
        );
    }

    #[test]
    fn risky_but_allowed_settings_are_warned_about() {
        let cfg = parse(&[
            "--generic-secret",
            crate::providers::DEV_SECRET,
            "--allow-published-secrets",
            "true",
        ])
        .unwrap();
        let warnings = cfg.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("development only"), "{warnings:?}");
        assert!(warnings[1].contains("DEVELOPMENT secret"), "{warnings:?}");
        let cfg = parse(&["--admin-listen", "0.0.0.0:9090"]).unwrap();
        assert!(
            cfg.warnings()[0].contains("FENCEHOOK_ADMIN_LISTEN 0.0.0.0:9090 is not a loopback"),
            "{:?}",
            cfg.warnings()
        );
        assert!(parse(&[]).unwrap().warnings().is_empty());
        let p = crate::providers::Provider::new(
            "old",
            crate::providers::SchemeKind::Stripe,
            &["whsec_x".into()],
            Some(10 * 365 * 86_400),
        )
        .unwrap();
        assert!(
            p.warnings()[0].contains("tolerance_secs"),
            "{:?}",
            p.warnings()
        );
    }

    #[test]
    fn a_published_or_short_secret_stops_the_start_unless_development_is_said() {
        for secret in [
            crate::providers::DEV_SECRET,
            "whsec_UExBQ0VIT0xERVItc2hvcC1zZWNyZXQtcmVwbGFjZS1tZQ==",
            "whsec_c2hvcnQta2V5",
        ] {
            let err = parse(&["--generic-secret", secret]).unwrap_err();
            assert_eq!(err.setting, "FENCEHOOK_GENERIC_SECRET", "{secret}");
            assert!(
                err.reason.starts_with("provider `generic`: secrets: ")
                    && err.reason.contains("FENCEHOOK_ALLOW_PUBLISHED_SECRETS")
                    && !err.reason.contains(secret)
                    && !err.to_string().contains('\n'),
                "{err}"
            );
            parse(&[
                "--generic-secret",
                secret,
                "--allow-published-secrets",
                "true",
            ])
            .expect("allowed for development");
        }
    }

    #[test]
    fn retention_and_ages_are_bounded_so_no_date_leaves_the_calendar() {
        for (args, setting) in [
            (
                &["--event-retention-days", "18446744073709551615"][..],
                "FENCEHOOK_EVENT_RETENTION_DAYS",
            ),
            (
                &["--event-retention-days", "36501"][..],
                "FENCEHOOK_EVENT_RETENTION_DAYS",
            ),
            (
                &["--max-age-secs", "18446744073709551615"][..],
                "FENCEHOOK_MAX_AGE_SECS",
            ),
            (
                &["--retry-max-ms", "18446744073709551615"][..],
                "FENCEHOOK_RETRY_MAX_MS",
            ),
            (
                &["--prune-interval-secs", "18446744073709551615"][..],
                "FENCEHOOK_PRUNE_INTERVAL_SECS",
            ),
        ] {
            let err = parse(args).expect_err(setting);
            assert_eq!(err.setting, setting, "{args:?}: {err}");
        }
        let cfg = parse(&["--event-retention-days", "36500"]).unwrap();
        let now = time::OffsetDateTime::now_utc();
        assert!(time_before(now, cfg.inbox.retention).is_some_and(|t| t < now));
        assert_eq!(time_before(now, Duration::MAX), None);
    }

    #[test]
    fn the_start_log_names_every_host_of_a_multi_host_database_url() {
        assert_eq!(
            database_target(
                "postgresql://app:s3cret@h1:5432,h2:5433/payments?target_session_attrs=read-write"
            ),
            "h1:5432,h2:5433/payments"
        );
        assert_eq!(
            database_target("host=h1,h2,h3 port=6432 user=app password=s3cret dbname=pay"),
            "h1:6432,h2:6432,h3:6432/pay"
        );
    }

    #[test]
    fn the_start_log_names_the_database_and_redis_without_secrets() {
        assert_eq!(
            database_target("postgres://app:s3cret@db.internal:6432/payments"),
            "db.internal:6432/payments"
        );
        assert_eq!(redis_target("redis://:s3cret@cache:6379/2"), "cache:6379/2");
        assert_eq!(
            redis_target("redis://a:7000,redis://u:p@b:7001"),
            "a:7000,b:7001"
        );
    }

    #[test]
    fn a_url_shown_in_messages_has_no_password_and_no_query() {
        let uri: hyper::Uri = "http://user:s3cret@orders.internal:8443/hook?token=abc"
            .parse()
            .unwrap();
        let shown = redacted_url(&uri);
        assert_eq!(shown, "http://orders.internal:8443/hook");
    }

    #[test]
    fn a_pool_larger_than_the_inflight_limit_is_refused() {
        let err = parse(&["--db-pool-size", "64", "--max-inflight", "32"]).unwrap_err();
        assert_eq!(err.setting, "FENCEHOOK_DB_POOL_SIZE");
    }

    #[test]
    fn defaults_are_valid() {
        let cfg = parse(&[]).expect("defaults validate");
        assert_eq!(cfg.lease.ttl, Duration::from_millis(5000));
        assert_eq!(cfg.inflight_wait, Duration::from_millis(1000));
        assert_eq!(cfg.max_body_bytes, 65536);
        assert_eq!(cfg.body_timeout, Duration::from_secs(10));
        assert_eq!(cfg.max_connections, 1024);
    }

    #[test]
    fn the_body_timeout_must_be_between_1_ms_and_30_s() {
        for bad in ["0", "30001"] {
            let err = parse(&["--body-timeout-ms", bad]).unwrap_err();
            assert_eq!(err.setting, "FENCEHOOK_BODY_TIMEOUT_MS", "{bad}");
        }
        for ok in ["1", "30000"] {
            parse(&["--body-timeout-ms", ok]).expect(ok);
        }
    }

    #[test]
    fn a_lease_timeout_that_cannot_fit_in_a_renew_interval_names_the_setting() {
        let err = parse(&["--lease-ttl-ms", "900", "--lease-timeout-ms", "300"]).unwrap_err();
        assert_eq!(err.setting, "FENCEHOOK_LEASE_TIMEOUT_MS");
    }

    #[test]
    fn a_ttl_set_alone_starts_with_a_lease_timeout_derived_from_it() {
        for ttl in ["150", "900", "2000", "5000", "60000"] {
            let cfg = parse(&["--lease-ttl-ms", ttl]).expect(ttl);
            assert!(cfg.lease.lease_timeout < cfg.lease.ttl / 3, "{ttl}");
        }
        let cfg = parse(&["--lease-ttl-ms", "2000"]).unwrap();
        assert_eq!(cfg.lease.lease_timeout, Duration::from_millis(500));
        assert_eq!(
            parse(&[]).unwrap().lease.lease_timeout,
            Duration::from_millis(1000)
        );
    }

    #[test]
    fn max_hold_must_cover_the_downstream_timeout() {
        let err = parse(&[
            "--downstream-url",
            "http://127.0.0.1:1/x",
            "--downstream-timeout-ms",
            "60000",
        ])
        .unwrap_err();
        assert_eq!(err.setting, "FENCEHOOK_LEASE_MAX_MS");
    }

    #[test]
    fn bad_values_name_their_setting() {
        for (args, setting) in [
            (&["--listen", "nope"][..], "FENCEHOOK_LISTEN"),
            (&["--database-url", "mysql:/x y"][..], "DATABASE_URL"),
            (&["--redis-url", "http://x"][..], "REDIS_URL"),
            (
                &["--redis-url", "rediss://x:6380,redis://y:6380"][..],
                "REDIS_URL",
            ),
            (
                &["--fence-key-ttl-secs", "30"][..],
                "FENCEHOOK_FENCE_KEY_TTL_SECS",
            ),
            (&["--lease-ttl-ms", "10"][..], "FENCEHOOK_LEASE_TTL_MS"),
            (
                &["--downstream-url", "ftp://x/"][..],
                "FENCEHOOK_DOWNSTREAM_URL",
            ),
            (&["--db-pool-size", "0"][..], "FENCEHOOK_DB_POOL_SIZE"),
            (&["--max-connections", "0"][..], "FENCEHOOK_MAX_CONNECTIONS"),
            (
                &["--max-connections-per-peer", "0"][..],
                "FENCEHOOK_MAX_CONNECTIONS_PER_PEER",
            ),
            (
                &["--connection-max-requests", "0"][..],
                "FENCEHOOK_CONNECTION_MAX_REQUESTS",
            ),
            (
                &["--connection-max-age-secs", "0"][..],
                "FENCEHOOK_CONNECTION_MAX_AGE_SECS",
            ),
            (
                &["--generic-secret", "not-a-secret"][..],
                "FENCEHOOK_GENERIC_SECRET",
            ),
        ] {
            let err = parse(args).expect_err(setting);
            assert_eq!(err.setting, setting, "{args:?}: {err}");
        }
    }

    #[test]
    fn the_postgres_lease_backend_reads_no_redis_setting() {
        // With the Redis backend each of these stops the start (above and
        // in the sentinel and TLS tests); with PostgreSQL none is read.
        for redis in [
            &["--redis-url", "http://x"][..],
            &["--redis-url", "rediss://x:6380,redis://y:6380"][..],
            &[
                "--redis-url",
                "redis://x",
                "--redis-sentinels",
                "s:26379",
                "--redis-sentinel-master",
                "m",
            ][..],
            &["--redis-ca-file", "/nonexistent/ca.pem"][..],
            &[][..],
        ] {
            let args: Vec<&str> = ["--lease-backend", "postgres"]
                .into_iter()
                .chain(redis.iter().copied())
                .collect();
            let cfg = parse(&args).unwrap_or_else(|e| panic!("{redis:?}: {e}"));
            assert_eq!(cfg.lease.backend, LeaseBackendKind::Postgres);
            assert!(cfg.lease.sentinel.is_none(), "{redis:?}");
            assert!(cfg.lease.redis_tls.ca.is_none(), "{redis:?}");
        }
        let err = parse(&["--lease-backend", "redis", "--redis-url", "http://x"]).unwrap_err();
        assert_eq!(err.setting, "REDIS_URL");
    }

    fn pem_file(dir: &std::path::Path, name: &str, body: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        path.display().to_string()
    }

    #[test]
    fn sentinels_and_a_master_name_make_a_sentinel_config_logged_without_the_password() {
        let cfg = parse(&[
            "--redis-sentinels",
            "10.0.0.1:26379, sentinel-b:26380",
            "--redis-sentinel-master",
            "payments",
            "--redis-sentinel-password",
            "s3cret",
        ])
        .unwrap();
        let s = cfg.lease.sentinel.as_ref().expect("sentinel mode");
        assert_eq!(s.sentinels, ["10.0.0.1:26379", "sentinel-b:26380"]);
        assert_eq!(s.master, "payments");
        assert_eq!(s.password.as_deref(), Some("s3cret"));
        let target = cfg.lease.redis_target();
        assert_eq!(
            target,
            "sentinels 10.0.0.1:26379,sentinel-b:26380 master payments"
        );
        assert!(!format!("{cfg:?}").contains("s3cret"));
        assert!(parse(&[]).unwrap().lease.sentinel.is_none());
        assert_eq!(parse(&[]).unwrap().lease.redis_url, DEFAULT_REDIS_URL);
    }

    #[test]
    fn sentinel_settings_that_do_not_fit_together_name_their_setting() {
        for (args, setting) in [
            (
                &["--redis-sentinels", "a:26379"][..],
                "FENCEHOOK_REDIS_SENTINEL_MASTER",
            ),
            (
                &["--redis-sentinel-master", "m"][..],
                "FENCEHOOK_REDIS_SENTINELS",
            ),
            (
                &[
                    "--redis-sentinels",
                    "a:26379",
                    "--redis-sentinel-master",
                    "m",
                    "--redis-url",
                    "redis://a:6379",
                ][..],
                "REDIS_URL",
            ),
            (
                &["--redis-sentinels", "a", "--redis-sentinel-master", "m"][..],
                "FENCEHOOK_REDIS_SENTINELS",
            ),
            (
                &[
                    "--redis-sentinels",
                    "a:26379,redis://b:1",
                    "--redis-sentinel-master",
                    "m",
                ][..],
                "FENCEHOOK_REDIS_SENTINELS",
            ),
            (
                &["--redis-sentinel-password", "p"][..],
                "FENCEHOOK_REDIS_SENTINEL_PASSWORD",
            ),
            (
                &[
                    "--redis-sentinels",
                    "a:26379",
                    "--redis-sentinel-master",
                    "m",
                    "--redis-ca-file",
                    "/etc/ca.pem",
                ][..],
                "FENCEHOOK_REDIS_SENTINELS",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.setting, setting, "{args:?}: {e}");
            assert!(!e.to_string().contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn rediss_reads_its_ca_and_client_files_and_refuses_bad_ones_naming_the_setting() {
        let dir = std::env::temp_dir().join(format!("fh-tls-cfg-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let ca_file = pem_file(&dir, "ca.pem", &ca.cert.pem());
        let key_file = pem_file(&dir, "key.pem", &ca.key_pair.serialize_pem());
        let junk = pem_file(&dir, "junk.pem", "not a certificate\n");
        let missing = dir.join("missing.pem").display().to_string();

        let cfg = parse(&[
            "--redis-url",
            "rediss://cache:6380",
            "--redis-ca-file",
            &ca_file,
            "--redis-client-cert-file",
            &ca_file,
            "--redis-client-key-file",
            &key_file,
        ])
        .unwrap();
        assert!(cfg.lease.redis_tls.ca.is_some());
        assert!(cfg.lease.redis_tls.client.is_some());
        assert!(!format!("{cfg:?}").contains("PRIVATE KEY"));
        let plain = parse(&["--redis-url", "rediss://cache:6380"]).unwrap();
        assert!(plain.lease.redis_tls.ca.is_none(), "the system's roots");

        for (args, setting) in [
            (
                &["--redis-url", "rediss://c:1", "--redis-ca-file", &missing][..],
                "FENCEHOOK_REDIS_CA_FILE",
            ),
            (
                &["--redis-url", "rediss://c:1", "--redis-ca-file", &junk][..],
                "FENCEHOOK_REDIS_CA_FILE",
            ),
            (
                &["--redis-url", "redis://c:1", "--redis-ca-file", &ca_file][..],
                "FENCEHOOK_REDIS_CA_FILE",
            ),
            (
                &[
                    "--redis-url",
                    "rediss://c:1",
                    "--redis-client-cert-file",
                    &ca_file,
                ][..],
                "FENCEHOOK_REDIS_CLIENT_KEY_FILE",
            ),
            (
                &[
                    "--redis-url",
                    "rediss://c:1",
                    "--redis-client-key-file",
                    &key_file,
                ][..],
                "FENCEHOOK_REDIS_CLIENT_CERT_FILE",
            ),
            (
                &[
                    "--redis-url",
                    "rediss://c:1",
                    "--redis-client-cert-file",
                    &ca_file,
                    "--redis-client-key-file",
                    &ca_file,
                ][..],
                "FENCEHOOK_REDIS_CLIENT_KEY_FILE",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.setting, setting, "{args:?}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
