//! TLS to PostgreSQL: a private cluster made here (initdb, `ssl=on`, a
//! server certificate signed by a private CA made here), `sslmode` and
//! `sslrootcert` in `DATABASE_URL`, and what the server itself says about
//! the service's connections (`pg_stat_ssl`).

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fencehook::providers::testkeys;

use crate::helpers::process::ServeProcess;
use crate::helpers::{payment, redis_url, wait_for, SECRET};

const CA: &str = "CN=fencehook test CA";
const OTHER_CA: &str = "CN=another test CA";

/// A private PostgreSQL cluster on a loopback address of its own (two, in
/// fact: its certificate names only the first), stopped and removed on drop.
struct TlsPostgres {
    dir: PathBuf,
    bindir: PathBuf,
    /// The address the server certificate names.
    ip: Ipv4Addr,
    /// Another address of the same server, not in its certificate.
    other_ip: Ipv4Addr,
    port: u16,
    _child: tokio::process::Child,
}

fn random_loopback() -> Ipv4Addr {
    Ipv4Addr::new(
        127,
        100 + rand::random::<u8>() % 100,
        rand::random::<u8>(),
        1 + rand::random::<u8>() % 254,
    )
}

fn pg_bindir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql")
        .map(|e| e.unwrap().path().join("bin"))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// `program` as the `postgres` user when we are root (the server refuses to
/// run as root); `setpriv` execs, so the child is the program itself.
fn as_pg(program: &Path) -> std::process::Command {
    if is_root() {
        let mut c = std::process::Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ])
        .arg(program);
        c
    } else {
        std::process::Command::new(program)
    }
}

impl TlsPostgres {
    /// A cluster with `ssl` on or off, its certificate issued by [`CA`].
    async fn start(ssl: bool) -> TlsPostgres {
        let dir = std::env::temp_dir().join(format!("fh-pgtls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let ip = random_loopback();
        let other_ip = random_loopback();
        std::fs::write(dir.join("ca.pem"), testkeys::ca_certificate(0, CA)).unwrap();
        std::fs::write(
            dir.join("other-ca.pem"),
            testkeys::ca_certificate(2, OTHER_CA),
        )
        .unwrap();
        std::fs::write(
            dir.join("server.crt"),
            testkeys::server_certificate(1, ip, 0, CA),
        )
        .unwrap();
        std::fs::write(dir.join("server.key"), testkeys::private_key_pem(1)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        if is_root() {
            let ok = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown to postgres");
        }
        let bindir = pg_bindir();
        let out = as_pg(&bindir.join("initdb"))
            .arg("-D")
            .arg(dir.join("data"))
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // A port free on both addresses (nothing else binds them).
        let port = crate::helpers::free_addr_on(&ip.to_string()).await.port();
        let mut cmd = tokio::process::Command::from(as_pg(&bindir.join("postgres")));
        cmd.arg("-D")
            .arg(dir.join("data"))
            .args(["-p", &port.to_string()])
            .arg("-c")
            .arg(format!("listen_addresses={ip},{other_ip}"))
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()))
            .args(["-c", "fsync=off", "-c", "max_connections=40"])
            .arg("-c")
            .arg(format!("ssl={}", if ssl { "on" } else { "off" }))
            .arg("-c")
            .arg(format!(
                "ssl_cert_file={}",
                dir.join("server.crt").display()
            ))
            .arg("-c")
            .arg(format!("ssl_key_file={}", dir.join("server.key").display()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let child = cmd.spawn().expect("postgres starts");
        let pg = TlsPostgres {
            dir,
            bindir,
            ip,
            other_ip,
            port,
            _child: child,
        };
        let plain = pg.plain_url();
        wait_for(
            "the private PostgreSQL answers",
            Duration::from_secs(30),
            || {
                let plain = plain.clone();
                async move {
                    tokio_postgres::connect(&plain, tokio_postgres::NoTls)
                        .await
                        .is_ok()
                }
            },
        )
        .await;
        pg
    }

    fn ca(&self) -> String {
        self.dir.join("ca.pem").display().to_string()
    }

    fn other_ca(&self) -> String {
        self.dir.join("other-ca.pem").display().to_string()
    }

    /// The URL the service is given: a password (which trust ignores), so a
    /// test can check it is never printed.
    fn url(&self, query: &str) -> String {
        format!(
            "postgres://postgres:hunter2@{}:{}/postgres?{query}",
            self.ip, self.port
        )
    }

    /// The test's own connection, without TLS.
    fn plain_url(&self) -> String {
        format!("postgres://postgres@{}:{}/postgres", self.ip, self.port)
    }

    async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.plain_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    }

    /// The service's connections (application names `fencehook*`) and how
    /// many of them are encrypted, as the server sees them.
    async fn service_connections(&self) -> (i64, i64) {
        let row = self
            .client()
            .await
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE s.ssl) \
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.application_name LIKE 'fencehook%'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        // An immediate stop lets the server remove its shared memory and
        // socket; the child is killed on drop anyway.
        let _ = as_pg(&self.bindir.join("pg_ctl"))
            .arg("stop")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn env(url: String) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", url),
        ("REDIS_URL", redis_url()),
        (
            "FENCEHOOK_REDIS_KEY_PREFIX",
            format!(
                "fhtest-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..16]
            ),
        ),
        // The service migrates the private cluster itself, through TLS.
        ("FENCEHOOK_MIGRATE_ON_START", "true".to_owned()),
    ]
}

/// `fencehook serve` with `url`, expected to stop at start: its stderr.
async fn refused_start(url: &str) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"))
        .arg("serve")
        .env_remove("REDIS_URL")
        .env("DATABASE_URL", url)
        .env("FENCEHOOK_GENERIC_SECRET", SECRET)
        .env("FENCEHOOK_LISTEN", "127.0.0.1:0")
        .env("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:0")
        .env("FENCEHOOK_LOG_FORMAT", "json")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The one line that stops the start (the others are JSON log lines).
fn refusal_line(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("fencehook: "))
        .collect();
    assert_eq!(lines.len(), 1, "one line says why:\n{stderr}");
    assert!(
        !stderr.contains("hunter2"),
        "no password printed:\n{stderr}"
    );
    lines[0].to_owned()
}

async fn books_a_delivery_over_tls(pg: &TlsPostgres, query: &str, tx: &str) {
    let p = ServeProcess::start(&env(pg.url(query))).await;
    let r = p.deliver(&payment(tx, 1250)).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let booked: i64 = pg
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM payments WHERE transaction_id = $1",
            &[&tx],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(booked, 1, "one row booked");
    let (all, encrypted) = pg.service_connections().await;
    assert!(all >= 1, "the service holds a connection");
    assert_eq!(
        encrypted, all,
        "every connection of the service is encrypted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verify_full_with_the_servers_ca_books_a_delivery_over_encrypted_connections() {
    let pg = TlsPostgres::start(true).await;
    let query = format!("sslmode=verify-full&sslrootcert={}", pg.ca());
    books_a_delivery_over_tls(&pg, &query, "tx_pgtls_full").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn require_without_a_ca_books_a_delivery_over_encrypted_connections() {
    let pg = TlsPostgres::start(true).await;
    books_a_delivery_over_tls(&pg, "sslmode=require", "tx_pgtls_require").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_certificate_from_another_ca_stops_the_start_naming_database_url() {
    let pg = TlsPostgres::start(true).await;
    for mode in ["verify-full", "verify-ca", "require"] {
        let (code, stderr) =
            refused_start(&pg.url(&format!("sslmode={mode}&sslrootcert={}", pg.other_ca()))).await;
        assert_eq!(code, Some(1), "{mode}: {stderr}");
        let line = refusal_line(&stderr);
        assert!(
            line.contains("DATABASE_URL") && line.contains("UnknownIssuer"),
            "{mode}: {line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn require_against_a_server_without_tls_stops_the_start_naming_database_url() {
    let pg = TlsPostgres::start(false).await;
    let (code, stderr) = refused_start(&pg.url("sslmode=require")).await;
    assert_eq!(code, Some(1), "{stderr}");
    let line = refusal_line(&stderr);
    assert!(
        line.contains("DATABASE_URL") && line.contains("server does not support TLS"),
        "{line}"
    );
    let tables: i64 = pg
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'payments'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "nothing was migrated in the clear");
}

/// The certificate names one address of the server: through the other,
/// `verify-full` refuses the name while `verify-ca` checks the chain only.
#[tokio::test(flavor = "multi_thread")]
async fn verify_ca_accepts_the_servers_certificate_under_another_name_and_verify_full_does_not() {
    let pg = TlsPostgres::start(true).await;
    let via_other = |mode: &str| {
        format!(
            "postgres://postgres@{}:{}/postgres?sslmode={mode}&sslrootcert={}",
            pg.other_ip,
            pg.port,
            pg.ca()
        )
    };
    let migrate = |url: String| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"))
            .arg("migrate")
            .env("DATABASE_URL", url)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .unwrap()
    };
    let full = migrate(via_other("verify-full")).await;
    let err = String::from_utf8_lossy(&full.stderr);
    assert!(!full.status.success(), "{err}");
    assert!(
        err.contains("DATABASE_URL") && err.contains("not valid for name"),
        "{err}"
    );
    let ca = migrate(via_other("verify-ca")).await;
    assert!(
        ca.status.success(),
        "{}",
        String::from_utf8_lossy(&ca.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_sslrootcert_is_refused_as_configuration_naming_database_url() {
    let (code, stderr) = refused_start(
        "postgres://postgres:hunter2@127.0.0.1:5432/postgres?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    )
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    let line = refusal_line(&stderr);
    assert!(
        line.contains("DATABASE_URL") && line.contains("/nonexistent/ca.pem"),
        "{line}"
    );
}

/// Inbox mode adds the listener's own connection (LISTEN): it is
/// encrypted like the pool's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_inbox_listener_and_workers_connect_over_verified_tls_too() {
    let pg = TlsPostgres::start(true).await;
    let mut e = env(pg.url(&format!("sslmode=verify-full&sslrootcert={}", pg.ca())));
    e.push(("FENCEHOOK_MODE", "inbox".to_owned()));
    e.push(("FENCEHOOK_WORKERS", "1".to_owned()));
    let p = ServeProcess::start(&e).await;
    let r = p.deliver(&payment("tx_pgtls_inbox", 900)).await;
    assert_eq!((r.status, r.result()), (200, "accepted"), "{r:?}");
    let client = pg.client().await;
    wait_for("the worker books the event", Duration::from_secs(20), || {
        let client = &client;
        async move {
            client
                .query_one(
                    "SELECT count(*) FROM payments WHERE transaction_id = 'tx_pgtls_inbox' AND status = 'succeeded'",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 1
        }
    })
    .await;
    let listener = || async {
        client
            .query(
                "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.application_name = 'fencehook-inbox-listen'",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, bool>(0))
            .collect::<Vec<bool>>()
    };
    // It connects in the background at start.
    wait_for(
        "the listener is connected",
        Duration::from_secs(20),
        || async { !listener().await.is_empty() },
    )
    .await;
    assert_eq!(listener().await, vec![true], "one listener, encrypted");
    let (all, encrypted) = pg.service_connections().await;
    assert_eq!(
        encrypted, all,
        "every connection of the service is encrypted"
    );
}

/// Without `sslmode` nothing changes: plaintext even to a server that
/// offers TLS, over TCP and over a Unix socket (which has no host name).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_sslmode_the_service_connects_in_the_clear_as_before() {
    let pg = TlsPostgres::start(true).await;
    let socket = format!(
        "postgres://postgres@{}:{}/postgres",
        pg.dir.display().to_string().replace('/', "%2F"),
        pg.port
    );
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"))
        .arg("migrate")
        .env("DATABASE_URL", &socket)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = ServeProcess::start(&env(pg.url(""))).await;
    let r = p.deliver(&payment("tx_pgtls_plain", 700)).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let (all, encrypted) = pg.service_connections().await;
    assert!(all >= 1, "the service holds a connection");
    assert_eq!(encrypted, 0, "no connection of the service is encrypted");
}
