//! Private Redis topologies from the installed `redis-server`: a master, a
//! replica and three sentinels (`redis-server --sentinel`, which is all
//! Debian's redis-sentinel package runs), and a TLS-only server with a CA
//! and certificates made at test time. Each on a loopback address no other
//! test binds (`127.x.y.z`, chosen at random), so their ports stay theirs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// The master's name in every sentinel's `sentinel monitor`.
pub const MASTER: &str = "fhmaster";

fn private_ip() -> String {
    format!(
        "127.{}.{}.{}",
        100 + rand::random::<u8>() % 100,
        rand::random::<u8>(),
        1 + rand::random::<u8>() % 254
    )
}

/// `n` distinct free ports on `ip`: every listener is held until all are chosen.
fn free_ports(ip: &str, n: usize) -> Vec<u16> {
    let holders: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind((ip, 0)).unwrap())
        .collect();
    holders
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fh-{what}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn redis_server(args: &[&str]) -> Child {
    Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server is installed")
}

async fn cli(ip: &str, port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", ip, "-p", &port.to_string()])
        .args(args)
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One master, one replica, three sentinels (quorum 2) watching them.
pub struct PrivateSentinels {
    pub ip: String,
    pub master_port: u16,
    pub replica_port: u16,
    pub sentinel_ports: Vec<u16>,
    master: Option<Child>,
    others: Vec<Child>,
    dir: PathBuf,
}

impl PrivateSentinels {
    /// Starts them all and waits until every sentinel sees the replica and
    /// the two other sentinels, and the replica is in sync: a failover can
    /// then happen.
    pub async fn start() -> PrivateSentinels {
        let ip = private_ip();
        let dir = temp_dir("sentinel");
        let ports = free_ports(&ip, 5);
        let (master_port, replica_port) = (ports[0], ports[1]);
        let sentinel_ports = ports[2..].to_vec();
        let common = |port: u16| {
            vec![
                "--port".to_owned(),
                port.to_string(),
                "--bind".to_owned(),
                ip.clone(),
                "--save".to_owned(),
                String::new(),
                "--appendonly".to_owned(),
                "no".to_owned(),
                "--dir".to_owned(),
                dir.display().to_string(),
                "--dbfilename".to_owned(),
                format!("dump-{port}.rdb"),
            ]
        };
        let args = common(master_port);
        let master = redis_server(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let mut args = common(replica_port);
        args.extend([
            "--replicaof".to_owned(),
            ip.clone(),
            master_port.to_string(),
            // The address the master and the sentinels know the replica by.
            "--replica-announce-ip".to_owned(),
            ip.clone(),
        ]);
        let mut others = vec![redis_server(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )];
        for port in &sentinel_ports {
            // A sentinel rewrites its configuration file: one each.
            let conf = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind {ip}\ndir {dir}\n\
                     sentinel announce-ip {ip}\n\
                     sentinel monitor {MASTER} {ip} {master_port} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 5000\n\
                     sentinel parallel-syncs {MASTER} 1\n",
                    dir = dir.display()
                ),
            )
            .unwrap();
            others.push(redis_server(&[conf.to_str().unwrap(), "--sentinel"]));
        }
        let set = PrivateSentinels {
            ip,
            master_port,
            replica_port,
            sentinel_ports,
            master: Some(master),
            others,
            dir,
        };
        let (ip, replica, sentinels) =
            (set.ip.clone(), set.replica_port, set.sentinel_ports.clone());
        super::wait_for(
            "the replica in sync and every sentinel seeing it and the others",
            Duration::from_secs(30),
            || {
                let (ip, sentinels) = (ip.clone(), sentinels.clone());
                async move {
                    let info = cli(&ip, replica, &["info", "replication"]).await;
                    if !info.contains("master_link_status:up") {
                        return false;
                    }
                    for port in sentinels {
                        let m = cli(&ip, port, &["sentinel", "master", MASTER]).await;
                        let field = |name: &str| {
                            let mut lines = m.lines();
                            while let Some(l) = lines.next() {
                                if l.trim() == name {
                                    return lines.next().map(|v| v.trim().to_owned());
                                }
                            }
                            None
                        };
                        if field("num-slaves").as_deref() != Some("1")
                            || field("num-other-sentinels").as_deref() != Some("2")
                        {
                            return false;
                        }
                    }
                    true
                }
            },
        )
        .await;
        set
    }

    /// `host:port` of every sentinel.
    pub fn sentinels(&self) -> Vec<String> {
        self.sentinel_ports
            .iter()
            .map(|p| format!("{}:{p}", self.ip))
            .collect()
    }

    /// The master's port as each sentinel names it now.
    pub async fn named_masters(&self) -> Vec<String> {
        let mut out = Vec::new();
        for port in &self.sentinel_ports {
            let addr = cli(
                &self.ip,
                *port,
                &["sentinel", "get-master-addr-by-name", MASTER],
            )
            .await;
            out.push(addr.lines().nth(1).unwrap_or("").trim().to_owned());
        }
        out
    }

    /// SIGKILLs the master.
    pub async fn kill_master(&mut self) {
        if let Some(mut child) = self.master.take() {
            let _ = child.kill().await;
        }
    }

    /// A connection to the server on `port` (master or replica).
    pub async fn redis(&self, port: u16) -> redis::aio::MultiplexedConnection {
        redis::Client::open(format!("redis://{}:{port}", self.ip))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for PrivateSentinels {
    fn drop(&mut self) {
        for child in self.master.iter_mut().chain(self.others.iter_mut()) {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A master and one sentinel (quorum 1) whose `requirepass` is `password`:
/// a client must authenticate to the sentinel to be told the master.
pub struct PasswordSentinel {
    pub ip: String,
    pub master_port: u16,
    pub sentinel_port: u16,
    children: Vec<Child>,
    dir: PathBuf,
}

impl PasswordSentinel {
    /// Starts both and waits until the sentinel, asked with the password,
    /// names the master.
    pub async fn start(password: &str) -> PasswordSentinel {
        let ip = private_ip();
        let dir = temp_dir("sentinel-pw");
        let ports = free_ports(&ip, 2);
        let (master_port, sentinel_port) = (ports[0], ports[1]);
        let master = redis_server(&[
            "--port",
            &master_port.to_string(),
            "--bind",
            &ip,
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel_port}\nbind {ip}\ndir {dir}\nrequirepass {password}\n\
                 sentinel monitor {MASTER} {ip} {master_port} 1\n",
                dir = dir.display()
            ),
        )
        .unwrap();
        let sentinel = redis_server(&[conf.to_str().unwrap(), "--sentinel"]);
        let set = PasswordSentinel {
            ip: ip.clone(),
            master_port,
            sentinel_port,
            children: vec![master, sentinel],
            dir,
        };
        let expected = master_port.to_string();
        super::wait_for(
            "the sentinel naming the master",
            Duration::from_secs(30),
            || {
                let (ip, expected) = (ip.clone(), expected.clone());
                async move {
                    let out = cli(
                        &ip,
                        sentinel_port,
                        &[
                            "--no-auth-warning",
                            "-a",
                            password,
                            "sentinel",
                            "get-master-addr-by-name",
                            MASTER,
                        ],
                    )
                    .await;
                    out.lines().nth(1).map(str::trim) == Some(expected.as_str())
                }
            },
        )
        .await;
        set
    }

    /// A connection to the master.
    pub async fn master(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(format!("redis://{}:{}", self.ip, self.master_port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for PasswordSentinel {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA and the PEM files of a server certificate it signed.
pub struct TestCa {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TestCa {
    /// A new CA (in `dir`, files prefixed `name`) and a certificate for
    /// `localhost` and `ip` signed by it.
    pub fn new(dir: &Path, name: &str, ip: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("fencehook test CA {name}"));
        let ca_key = KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        let server = CertificateParams::new(vec!["localhost".to_owned(), ip.to_owned()]).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let cert = server.signed_by(&server_key, &ca, &ca_key).unwrap();
        let write = |file: &str, pem: String| {
            let path = dir.join(format!("{name}-{file}"));
            std::fs::write(&path, pem).unwrap();
            path
        };
        TestCa {
            ca_file: write("ca.pem", ca.pem()),
            cert_file: write("cert.pem", cert.pem()),
            key_file: write("key.pem", server_key.serialize_pem()),
        }
    }
}

/// A `redis-server` that speaks TLS only (`--port 0`), with a certificate
/// from its own CA; clients are not asked for one.
pub struct TlsRedis {
    pub addr: SocketAddr,
    pub ca: TestCa,
    /// A CA that did not sign the server's certificate.
    pub other_ca: TestCa,
    child: Child,
    dir: PathBuf,
}

impl TlsRedis {
    pub async fn start() -> TlsRedis {
        let ip = private_ip();
        let dir = temp_dir("tls-redis");
        let ca = TestCa::new(&dir, "server", &ip);
        let other_ca = TestCa::new(&dir, "other", &ip);
        let port = free_ports(&ip, 1)[0];
        let child = redis_server(&[
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            &ip,
            "--tls-cert-file",
            ca.cert_file.to_str().unwrap(),
            "--tls-key-file",
            ca.key_file.to_str().unwrap(),
            "--tls-ca-cert-file",
            ca.ca_file.to_str().unwrap(),
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            dir.to_str().unwrap(),
        ]);
        let r = TlsRedis {
            addr: format!("{ip}:{port}").parse().unwrap(),
            ca,
            other_ca,
            child,
            dir,
        };
        super::wait_for("the TLS redis answers", Duration::from_secs(10), || async {
            match r.try_connection().await {
                Some(mut c) => redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok(),
                None => false,
            }
        })
        .await;
        r
    }

    pub fn url(&self) -> String {
        format!("rediss://{}", self.addr)
    }

    async fn try_connection(&self) -> Option<redis::aio::MultiplexedConnection> {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(&self.ca.ca_file).unwrap()),
        };
        let client = redis::Client::build_with_tls(self.url(), certs).ok()?;
        client.get_multiplexed_async_connection().await.ok()
    }

    /// A connection of the test's own, over TLS with the right CA.
    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        self.try_connection().await.expect("the TLS redis answers")
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
