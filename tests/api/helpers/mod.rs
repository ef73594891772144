//! Integration harness: real PostgreSQL and real Redis, a fresh database and a
//! Redis key prefix per test, apps on port 0 built in-process with
//! `App::build`, a mock downstream service, and a TCP fault proxy.

pub mod browser;
pub mod cluster;
pub mod console;
pub mod downstream;
pub mod inbox;
pub mod log;
pub mod metrics;
pub mod mollie_api;
pub mod money;
pub mod otlp;
pub mod patroni;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod psp_api;
pub mod psp_http;
pub mod psp_sdk;
pub mod redis_ha;
pub mod sweep;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fencehook::app::App;
use fencehook::config::{Config, DbConfig, InboxConfig, LeaseBackendKind, LeaseConfig, Mode};
use fencehook::http::state::State;
use fencehook::outbound::HttpClient;
use fencehook::processor::hooks::Hooks;
use fencehook::providers::{standard, Provider};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The generic provider's secret in every test.
pub const SECRET: &str = "whsec_dGVzdC1zZWNyZXQtZm9yLWZlbmNlaG9vay10ZXN0cw==";

pub fn database_admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Address of a URL's host:port (for putting a proxy in front of it).
pub fn socket_of(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).expect("url has a scheme");
    let hostport = rest.rsplit('@').next().unwrap().split('/').next().unwrap();
    let hostport = hostport.replace("localhost", "127.0.0.1");
    hostport.parse().expect("url host is host:port")
}

/// A database and a Redis key prefix that belong to one test; the database is
/// dropped when the context is dropped.
pub struct TestContext {
    /// One connection for the test's own queries (opened on first use).
    client: tokio::sync::OnceCell<tokio_postgres::Client>,
    pub db_name: String,
    pub database_url: String,
    pub redis_url: String,
    pub prefix: String,
}

impl TestContext {
    pub async fn new() -> TestContext {
        let ctx = TestContext::unmigrated().await;
        fencehook::store::migrate::run(
            &ctx.database_url,
            fencehook::store::migrate::MissingDatabase::Create,
        )
        .await
        .expect("test database created and migrated");
        ctx
    }

    /// A test's database, created but not migrated: no table at all.
    pub async fn empty() -> TestContext {
        let ctx = TestContext::unmigrated().await;
        let (admin, conn) = tokio_postgres::connect(&database_admin_url(), tokio_postgres::NoTls)
            .await
            .expect("admin connection");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        admin
            .batch_execute(&format!("CREATE DATABASE \"{}\"", ctx.db_name))
            .await
            .expect("test database created");
        ctx
    }

    /// A test's database as the release with migrations up to `version` left it.
    pub async fn at_version(version: i32) -> TestContext {
        let ctx = TestContext::unmigrated().await;
        fencehook::store::migrate::run_to(&ctx.database_url, version)
            .await
            .expect("test database created and migrated");
        ctx
    }

    /// Applies the migrations after the version the database is at (see
    /// [`TestContext::at_version`]).
    pub async fn migrate_to_latest(&self) {
        fencehook::store::migrate::run(
            &self.database_url,
            fencehook::store::migrate::MissingDatabase::Refuse,
        )
        .await
        .expect("migrated to the latest");
    }

    /// A context whose database does not exist yet (its name is free);
    /// the first one of a test process sweeps a crashed run's databases.
    async fn unmigrated() -> TestContext {
        log::init();
        sweep::once().await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let db_name = sweep::database_name(now());
        let admin = database_admin_url();
        let database_url = with_dbname(&admin, &db_name);
        TestContext {
            client: tokio::sync::OnceCell::new(),
            db_name,
            database_url,
            redis_url: redis_url(),
            prefix: format!("fhtest-{}", &id[..16]),
        }
    }

    /// PostgreSQL URL of this test's database, but through `addr` (a proxy).
    pub fn database_url_via(&self, addr: SocketAddr) -> String {
        let cfg: tokio_postgres::Config = self.database_url.parse().unwrap();
        let user = cfg.get_user().unwrap_or("postgres");
        format!("postgres://{user}@{addr}/{}", self.db_name)
    }

    pub fn config(&self) -> Config {
        Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            db: DbConfig {
                url: self.database_url.clone(),
                pool_size: 4,
                pool_wait: Duration::from_secs(2),
                statement_timeout: Duration::from_secs(5),
                connect_timeout: Duration::from_secs(2),
            },
            lease: LeaseConfig {
                backend: LeaseBackendKind::Redis,
                redis_url: self.redis_url.clone(),
                sentinel: None,
                redis_tls: Default::default(),
                key_prefix: self.prefix.clone(),
                ttl: Duration::from_millis(2000),
                max_hold: Duration::from_secs(30),
                fence_key_ttl: Duration::from_secs(3600 * 24 * 7),
                lease_timeout: Duration::from_millis(500),
            },
            inflight_wait: Duration::from_millis(1000),
            downstream_url: None,
            downstream_timeout: Duration::from_secs(10),
            downstream_trust: Default::default(),
            providers: vec![Provider::generic(SECRET).unwrap()],
            providers_file: None,
            max_body_bytes: 64 * 1024,
            body_timeout: Duration::from_secs(10),
            max_inflight: 512,
            max_connections: 1024,
            max_connections_per_peer: 1024,
            peer_ipv6_prefix: 64,
            connection_max_requests: 1000,
            connection_max_age: Duration::from_secs(120),
            allow_published_secrets: false,
            shutdown_timeout: Duration::from_secs(5),
            migrate_on_start: false,
            require_sync_replication: false,
            delivery_history: true,
            inbox: InboxConfig {
                mode: Mode::Sync,
                workers: 2,
                retry_base: Duration::from_millis(100),
                retry_max: Duration::from_secs(2),
                max_attempts: 20,
                max_age: Duration::from_secs(3600),
                retention: Duration::from_secs(86_400),
                prune_interval: None,
                idle_poll: Duration::from_secs(1),
            },
            reconcile: Default::default(),
            console: Default::default(),
            traces: None,
        }
    }

    /// [`TestContext::config`] in inbox mode with `workers` workers.
    pub fn inbox_config(&self, workers: usize) -> Config {
        let mut cfg = self.config();
        cfg.inbox.mode = Mode::Inbox;
        cfg.inbox.workers = workers;
        cfg
    }

    /// [`TestContext::config`] with the given lease backend.
    pub fn config_for(&self, backend: LeaseBackendKind) -> Config {
        let mut cfg = self.config();
        cfg.lease.backend = backend;
        cfg
    }

    pub async fn spawn(&self, cfg: Config) -> TestApp {
        self.spawn_with_hooks(cfg, Hooks::default()).await
    }

    pub async fn spawn_with_hooks(&self, cfg: Config, hooks: Hooks) -> TestApp {
        log::init();
        let app = App::build_with_hooks(cfg, hooks).await.expect("app builds");
        let base = format!("http://127.0.0.1:{}", app.port());
        let admin = format!("http://127.0.0.1:{}", app.admin_port());
        let state = app.state();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(app.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        TestApp {
            base,
            admin,
            state,
            stop: Some(stop),
            task: Some(task),
            client: client(),
        }
    }

    /// The test's own connection to its database (one per test).
    pub async fn db(&self) -> &tokio_postgres::Client {
        self.client
            .get_or_init(|| async {
                let (client, conn) =
                    tokio_postgres::connect(&self.database_url, tokio_postgres::NoTls)
                        .await
                        .unwrap();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                client
            })
            .await
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.db().await.query_one(sql, &[]).await.unwrap().get(0)
    }

    pub async fn payments(&self) -> i64 {
        self.count("SELECT count(*) FROM payments").await
    }

    pub async fn entries(&self) -> i64 {
        self.count("SELECT count(*) FROM ledger_entries").await
    }

    /// (status, fence) of one payment.
    pub async fn payment(&self, transaction_id: &str) -> Option<(String, i64)> {
        let row = self
            .db()
            .await
            .query_opt(
                "SELECT status, fence FROM payments WHERE transaction_id = $1",
                &[&transaction_id],
            )
            .await
            .unwrap();
        row.map(|r| (r.get(0), r.get(1)))
    }

    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.redis_url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Keys of this test's prefix.
    pub async fn redis_keys(&self) -> Vec<String> {
        let mut conn = self.redis().await;
        redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut conn)
            .await
            .unwrap()
    }

    pub fn lock_key(&self, transaction_id: &str) -> String {
        format!("{}:{{generic:{transaction_id}}}:lock", self.prefix)
    }

    pub fn fence_key(&self, transaction_id: &str) -> String {
        format!("{}:{{generic:{transaction_id}}}:fence", self.prefix)
    }

    /// Bad input wrote nothing: no payment row, no ledger entry, no lease key.
    pub async fn assert_nothing_written(&self) {
        assert_eq!(self.payments().await, 0, "no payment row");
        assert_eq!(self.entries().await, 0, "no ledger entry");
        let keys = self.redis_keys().await;
        assert!(keys.is_empty(), "no lease taken: {keys:?}");
    }

    /// Every invariant `fencehook audit` checks in the database.
    pub async fn assert_audit_clean(&self) {
        let checks = fencehook::store::audit::run(&self.database_url)
            .await
            .unwrap();
        for c in checks {
            assert!(
                c.violations.is_empty(),
                "audit check {} violated: {:?}",
                c.name,
                c.violations
            );
        }
    }
}

impl Drop for TestContext {
    fn drop(&mut self) {
        let url = database_admin_url();
        let name = self.db_name.clone();
        let prefix = self.prefix.clone();
        let redis_url = self.redis_url.clone();
        // Dropping needs its own runtime: the test's may be shutting down.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await;
                }
                if let Ok(client) = redis::Client::open(redis_url.as_str()) {
                    if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                        let keys: Vec<String> = redis::cmd("KEYS")
                            .arg(format!("{prefix}:*"))
                            .query_async(&mut conn)
                            .await
                            .unwrap_or_default();
                        if !keys.is_empty() {
                            let _: Result<i64, _> =
                                redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
                        }
                    }
                }
            });
        })
        .join();
    }
}

fn with_dbname(url: &str, name: &str) -> String {
    let (base, _) = url.rsplit_once('/').expect("database url has a path");
    format!("{base}/{name}")
}

pub fn client() -> HttpClient {
    fencehook::outbound::new(Duration::from_secs(5))
}

/// An app running in this process.
pub struct TestApp {
    pub base: String,
    pub admin: String,
    pub state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    client: HttpClient,
}

/// What an app answered.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub retry_after: Option<String>,
    /// The body as JSON (`Null` when it is not JSON, e.g. Adyen's `[accepted]`).
    pub body: Value,
    /// The body as text.
    pub text: String,
    pub content_type: Option<String>,
    /// The `Connection` header, when the answer has one.
    pub connection: Option<String>,
}

impl Reply {
    pub fn result(&self) -> &str {
        self.body
            .get("result")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

impl TestApp {
    /// Signs and posts a generic payload.
    pub async fn deliver(&self, payload: &Value) -> Reply {
        self.post_signed("generic", payload.to_string().as_bytes(), now(), SECRET)
            .await
    }

    pub async fn post_signed(&self, provider: &str, body: &[u8], ts: i64, secret: &str) -> Reply {
        let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
        let sig = standard::sign(secret, &id, ts, body).unwrap();
        self.post(
            &format!("/webhooks/{provider}"),
            &[
                ("content-type", "application/json"),
                ("webhook-id", &id),
                ("webhook-timestamp", &ts.to_string()),
                ("webhook-signature", &sig),
            ],
            body.to_vec(),
        )
        .await
    }

    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
        let mut req = hyper::Request::post(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .client
            .request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .expect("app answers");
        let status = resp.status().as_u16();
        let header = |name| header_of(resp.headers(), name);
        let retry_after = header("retry-after");
        let content_type = header("content-type");
        let connection = header("connection");
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply {
            status,
            retry_after,
            body,
            text: String::from_utf8_lossy(&bytes).into_owned(),
            content_type,
            connection,
        }
    }

    /// Delivers until the answer is neither 409 nor 503 (a PSP's retries), or
    /// the deadline passes. Returns every answer.
    pub async fn deliver_until_settled(&self, payload: &Value, deadline: Duration) -> Vec<Reply> {
        let end = tokio::time::Instant::now() + deadline;
        let mut answers = Vec::new();
        loop {
            let r = self.deliver(payload).await;
            let retry = r.status == 409 || r.status == 503;
            answers.push(r);
            if !retry || tokio::time::Instant::now() >= end {
                return answers;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn get_admin(&self, path: &str) -> (u16, String) {
        let req = hyper::Request::get(format!("{}{path}", self.admin))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = self.client.request(req).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Sum of a metric's samples with these labels, from this app's registry.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metrics::sum(&self.state.metrics.render(), name, labels)
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A generic payment payload.
pub fn payment(transaction_id: &str, amount: i64) -> Value {
    serde_json::json!({
        "transaction_id": transaction_id,
        "amount": amount,
        "currency": "EUR",
        "event_type": "payment.succeeded",
    })
}

/// Waits for `cond` with a deadline; panics with `what` when it never holds.
pub async fn wait_for<F, Fut>(what: &str, deadline: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A response header as text, when present.
pub fn header_of(headers: &hyper::HeaderMap, name: &str) -> Option<String> {
    headers.get(name).map(|v| v.to_str().unwrap().to_owned())
}

/// An address on loopback `ip` (e.g. `127.0.0.2`) with nothing listening on
/// it, for a server another process will start there. Only use an `ip` no
/// other test binds: a port free on 127.0.0.1 now may be taken by any test
/// before the server binds it.
pub async fn free_addr_on(ip: &str) -> SocketAddr {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    l.local_addr().unwrap()
}

/// A loopback port with nothing listening on it.
pub async fn closed_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// Runs each named `async fn(LeaseBackendKind)` as two tests, one per lease
/// backend: `redis_backend::<name>` and `postgres_backend::<name>`.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod redis_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(fencehook::config::LeaseBackendKind::Redis).await
                }
            )*
        }
        mod postgres_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(fencehook::config::LeaseBackendKind::Postgres).await
                }
            )*
        }
    };
}
pub(crate) use both_backends;

/// What a set of a payment's events comes to, whatever their order: the
/// money in and out per object.
pub fn expected_net(events: &[Value]) -> HashMap<String, i64> {
    let has = |t: &str, tx: &str| {
        events
            .iter()
            .any(|e| e["event_type"] == t && e["transaction_id"] == tx)
    };
    let mut net = HashMap::new();
    for e in events {
        let tx = e["transaction_id"].as_str().unwrap();
        let amount = e["amount"].as_i64().unwrap();
        let value = match e["event_type"].as_str().unwrap() {
            "payment.succeeded" | "payment.failed" => {
                if has("payment.succeeded", tx) {
                    amount
                } else {
                    0
                }
            }
            "refund.succeeded" | "refund.failed" => {
                if has("refund.succeeded", tx) && !has("refund.failed", tx) {
                    -amount
                } else {
                    0
                }
            }
            _ => {
                if has("dispute.funds_withdrawn", tx) && !has("dispute.funds_reinstated", tx) {
                    -amount
                } else {
                    0
                }
            }
        };
        net.insert(tx.to_owned(), value);
    }
    net
}
