//! A private Patroni cluster from Debian's packages (`patroni`,
//! `etcd-server`; `make tools` installs them): one etcd and three Patroni
//! nodes, each with its own PostgreSQL data directory under a temporary
//! directory, all on a loopback address no other test binds (`127.x.y.z`,
//! chosen at random), so their ports stay theirs. The nodes run
//! `deploy/patroni/patroni.yml` itself, with only what must differ on one host
//! replaced (see [`node_config`]). Patroni runs as `postgres` when the tests
//! run as root: PostgreSQL refuses root. Every process is killed and every
//! directory removed when the cluster is dropped, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use yaml_rust2::{Yaml, YamlEmitter, YamlLoader};

/// The example's superuser password: a placeholder, kept on a private cluster.
pub const SUPERUSER_PASSWORD: &str = "CHANGE-ME-SUPERUSER";

/// The failover timings of the test. The example's (ttl 20, loop_wait 4,
/// retry_timeout 8) keep the same rule, `ttl >= loop_wait + 2 * retry_timeout`
/// (2 + 2 * 5 = 12), with a shorter lock: a lost leader costs about 10-15 s
/// here instead of 20-25. Patroni 3.2 and later raise a ttl below 20 to 20,
/// which only makes the outage longer.
const TTL: i64 = 12;
const LOOP_WAIT: i64 = 2;
const RETRY_TIMEOUT: i64 = 5;

/// Fails, naming `make tools`, when Patroni or etcd is not installed.
pub fn require_tools() {
    for (bin, package) in [("patroni", "patroni"), ("etcd", "etcd-server")] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(bin).is_file()));
        assert!(
            found,
            "{bin} is not installed: `make tools` installs it (Debian's {package} package)"
        );
    }
}

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

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// `program` as the user that may run PostgreSQL, leader of a process group
/// of its own (so that the whole group can be killed). `setpriv` execs the
/// program, so the child's pid is the program's.
fn as_postgres(program: &str, args: &[&str]) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = if running_as_root() {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
            program,
        ]);
        cmd
    } else {
        Command::new(program)
    };
    cmd.args(args).process_group(0);
    cmd
}

fn chown_postgres(path: &Path) {
    if running_as_root() {
        let _ = Command::new("chown")
            .args(["-R", "postgres:", &path.display().to_string()])
            .status();
    }
}

fn kill(sig: &str, targets: &[String]) {
    if !targets.is_empty() {
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg("--")
            .args(targets)
            .stderr(Stdio::null())
            .status();
    }
}

/// The pids whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let child: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // pid (comm) state ppid …: comm may hold spaces, so after the last ')'.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// One Patroni node and its PostgreSQL.
pub struct Node {
    pub name: String,
    pub pg_port: u16,
    pub api_port: u16,
    dir: PathBuf,
    patroni: Option<Child>,
}

impl Node {
    fn config(&self) -> PathBuf {
        self.dir.join("patroni.yml")
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("patroni.log")
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        let child = as_postgres("patroni", &[&self.config().display().to_string()])
            .env("HOME", &self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("patroni starts");
        self.patroni = Some(child);
    }

    /// The postmaster's pid, from its data directory, while it runs.
    fn postmaster(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// SIGKILL to Patroni (its process group) and to PostgreSQL: the
    /// postmaster and every process it forked (each backend is a process
    /// group of its own), at once, as a host that dies takes them.
    fn kill(&mut self) {
        let mut targets = Vec::new();
        if let Some(child) = &self.patroni {
            targets.push(format!("-{}", child.id()));
        }
        if let Some(pm) = self.postmaster() {
            targets.extend(children_of(pm).iter().map(u32::to_string));
            targets.push(pm.to_string());
        }
        kill("KILL", &targets);
        if let Some(mut child) = self.patroni.take() {
            let _ = child.wait();
        }
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// etcd and three Patroni nodes; see the module's documentation.
pub struct PatroniCluster {
    pub ip: String,
    pub nodes: Vec<Node>,
    dir: PathBuf,
    etcd_dir: PathBuf,
    etcd: Option<Child>,
    http: fencehook::outbound::HttpClient,
}

impl PatroniCluster {
    /// Starts etcd, then the three nodes, and waits (generously: a loaded
    /// machine bootstraps slowly) until one is the leader and both others
    /// stream from it, one of them as its synchronous standby.
    pub async fn start() -> PatroniCluster {
        require_tools();
        let ip = private_ip();
        let ports = free_ports(&ip, 8);
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let dir = std::env::temp_dir().join(format!("fh-patroni-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        // etcd fsyncs every write: in memory where there is /dev/shm, so that
        // a loaded disk cannot make the leader miss its lock renewal.
        let shm = Path::new("/dev/shm");
        let etcd_dir =
            if shm.is_dir() { shm } else { dir.as_path() }.join(format!("fh-patroni-etcd-{id}"));
        let mut cluster = PatroniCluster {
            ip: ip.clone(),
            nodes: Vec::new(),
            dir: dir.clone(),
            etcd_dir: etcd_dir.clone(),
            etcd: None,
            http: fencehook::outbound::new(Duration::from_secs(5)),
        };
        let (client, peer) = (ports[0], ports[1]);
        cluster.start_etcd(client, peer);
        let template = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/patroni/patroni.yml"),
        )
        .expect("deploy/patroni/patroni.yml");
        for i in 0..3 {
            let name = format!("pg{}", i + 1);
            let node_dir = dir.join(&name);
            std::fs::create_dir_all(&node_dir).unwrap();
            let node = Node {
                name: name.clone(),
                pg_port: ports[2 + i],
                api_port: ports[5 + i],
                dir: node_dir,
                patroni: None,
            };
            let yaml = node_config(&template, &format!("fh-{id}"), &ip, client, &node);
            std::fs::write(node.config(), yaml).unwrap();
            cluster.nodes.push(node);
        }
        chown_postgres(&dir);
        cluster.validate_config(&cluster.nodes[0]);
        for node in &mut cluster.nodes {
            node.start();
        }
        cluster
            .wait(
                "a leader with its two replicas streaming, one synchronous",
                Duration::from_secs(150),
                |c| async move {
                    let leader = c.leader().await?;
                    let others: Vec<&str> = c
                        .nodes
                        .iter()
                        .filter(|n| n.name != c.nodes[leader].name)
                        .map(|n| n.name.as_str())
                        .collect();
                    let streams = c.streaming_from(leader).await;
                    let all = others
                        .iter()
                        .all(|n| streams.iter().any(|(name, _)| name == n));
                    let sync = streams.iter().any(|(_, state)| state == "sync");
                    (all && sync).then_some(())
                },
            )
            .await;
        cluster
    }

    fn start_etcd(&mut self, client: u16, peer: u16) {
        use std::os::unix::process::CommandExt;
        let ip = &self.ip;
        let log = std::fs::File::create(self.dir.join("etcd.log")).unwrap();
        let child = Command::new("etcd")
            .args([
                "--name",
                "etcd1",
                "--data-dir",
                &self.etcd_dir.display().to_string(),
                "--listen-client-urls",
                &format!("http://{ip}:{client}"),
                "--advertise-client-urls",
                &format!("http://{ip}:{client}"),
                "--listen-peer-urls",
                &format!("http://{ip}:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://{ip}:{peer}"),
                "--initial-cluster",
                &format!("etcd1=http://{ip}:{peer}"),
            ])
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.etcd = Some(child);
    }

    /// `patroni --validate-config` on a node's file: the example, rewritten,
    /// is one the installed Patroni takes.
    fn validate_config(&self, node: &Node) {
        let out = Command::new("patroni")
            .arg("--validate-config")
            .arg(node.config())
            .output()
            .expect("patroni runs");
        assert!(
            out.status.success(),
            "patroni --validate-config {}: {}{}",
            node.config().display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `postgres://postgres:…@` every node `/db?target_session_attrs=read-write`:
    /// the multi-host URL of deploy/fencehook.env.example.
    pub fn url(&self, db: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{}:{}", self.ip, n.pg_port))
            .collect();
        format!(
            "postgres://postgres:{SUPERUSER_PASSWORD}@{}/{db}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// The URL of database `db` on node `i` alone (any role).
    pub fn node_url(&self, i: usize, db: &str) -> String {
        format!(
            "postgres://postgres:{SUPERUSER_PASSWORD}@{}:{}/{db}",
            self.ip, self.nodes[i].pg_port
        )
    }

    /// `GET /patroni` of node `i`: its role and state as Patroni reports
    /// them; `None` while its REST API does not answer.
    pub async fn status(&self, i: usize) -> Option<Value> {
        let req = hyper::Request::get(format!(
            "http://{}:{}/patroni",
            self.ip, self.nodes[i].api_port
        ))
        .body(Full::new(Bytes::new()))
        .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(5), self.http.request(req))
            .await
            .ok()?
            .ok()?;
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice(&body).ok()
    }

    /// The node Patroni runs as the primary (`master` in Patroni 3.0,
    /// `primary` later), if one does now.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.nodes.len() {
            if self.nodes[i].patroni.is_none() {
                continue;
            }
            if let Some(s) = self.status(i).await {
                if matches!(s["role"].as_str(), Some("master" | "primary"))
                    && s["state"] == "running"
                {
                    return Some(i);
                }
            }
        }
        None
    }

    /// (name, sync_state) of every standby streaming from node `i`, as its
    /// `GET /patroni` lists them.
    pub async fn streaming_from(&self, i: usize) -> Vec<(String, String)> {
        let Some(s) = self.status(i).await else {
            return Vec::new();
        };
        s["replication"]
            .as_array()
            .map(|standbys| {
                standbys
                    .iter()
                    .filter(|r| r["state"] == "streaming")
                    .map(|r| {
                        (
                            r["application_name"].as_str().unwrap_or("").to_owned(),
                            r["sync_state"].as_str().unwrap_or("").to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Kills node `i`'s Patroni and PostgreSQL with SIGKILL.
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i`'s Patroni again (it starts its PostgreSQL itself).
    pub fn restart_node(&mut self, i: usize) {
        assert!(self.nodes[i].patroni.is_none(), "node {i} still runs");
        self.nodes[i].start();
    }

    /// Waits for `cond` to answer `Some` within `limit`; past it, fails
    /// with `what` and the end of every node's log.
    pub async fn wait<'a, T, F, Fut>(&'a self, what: &str, limit: Duration, mut cond: F) -> T
    where
        F: FnMut(&'a PatroniCluster) -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let end = tokio::time::Instant::now() + limit;
        loop {
            if let Some(v) = cond(self).await {
                return v;
            }
            if tokio::time::Instant::now() >= end {
                panic!("timed out waiting for: {what}\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The end of each node's Patroni log, for a failure message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.name, n.log_tail(25)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        // Patroni first, so that it starts nothing again; then PostgreSQL by
        // an immediate stop, which (unlike SIGKILL) removes its shared
        // memory segments; SIGKILL for whatever still runs.
        for node in &mut self.nodes {
            if let Some(mut child) = node.patroni.take() {
                kill("KILL", &[format!("-{}", child.id())]);
                let _ = child.wait();
            }
        }
        for node in &mut self.nodes {
            if node.postmaster().is_some() {
                let pg_ctl = super::postgres::bindir().join("pg_ctl");
                let data = node.data().display().to_string();
                let _ = as_postgres(
                    &pg_ctl.display().to_string(),
                    &["-D", &data, "-m", "immediate", "-w", "-t", "10", "stop"],
                )
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            }
            node.kill();
        }
        if let Some(mut etcd) = self.etcd.take() {
            kill("KILL", &[format!("-{}", etcd.id())]);
            let _ = etcd.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.etcd_dir);
    }
}

/// deploy/patroni/patroni.yml for `node` of a cluster on one host: every
/// change to the example is here.
///
/// - its own scope and namespace, so no two clusters share etcd keys;
/// - the node's name, and every address on the private loopback `ip`: the
///   REST API, PostgreSQL, and the one test etcd instead of three;
/// - its directories (data, pgpass, Unix socket) under the node's own;
/// - `bin_dir` where the installed PostgreSQL's binaries are;
/// - the test's failover timings ([`TTL`], [`LOOP_WAIT`], [`RETRY_TIMEOUT`]);
/// - `fsync = off`: a killed process loses nothing the kernel was given, and
///   the three nodes' base backups and checkpoints go faster;
/// - the hosts `pg_hba` admits: loopback instead of 10.0.0.0/24.
///
/// Synchronous mode, `use_pg_rewind`, initdb's options and every password
/// are the example's.
fn node_config(template: &str, scope: &str, ip: &str, etcd_port: u16, node: &Node) -> String {
    let mut doc = YamlLoader::load_from_str(template)
        .expect("deploy/patroni/patroni.yml is YAML")
        .remove(0);
    let s = |v: &str| Yaml::String(v.to_owned());
    let api = format!("{ip}:{}", node.api_port);
    let pg = format!("{ip}:{}", node.pg_port);
    let dir = node.dir.display().to_string();
    set(&mut doc, &["scope"], s(scope));
    set(&mut doc, &["namespace"], s("/fencehook-test/"));
    set(&mut doc, &["name"], s(&node.name));
    set(&mut doc, &["restapi", "listen"], s(&api));
    set(&mut doc, &["restapi", "connect_address"], s(&api));
    set(
        &mut doc,
        &["etcd3", "hosts"],
        Yaml::Array(vec![s(&format!("{ip}:{etcd_port}"))]),
    );
    set(&mut doc, &["bootstrap", "dcs", "ttl"], Yaml::Integer(TTL));
    set(
        &mut doc,
        &["bootstrap", "dcs", "loop_wait"],
        Yaml::Integer(LOOP_WAIT),
    );
    set(
        &mut doc,
        &["bootstrap", "dcs", "retry_timeout"],
        Yaml::Integer(RETRY_TIMEOUT),
    );
    set(
        &mut doc,
        &["bootstrap", "dcs", "postgresql", "parameters", "fsync"],
        s("off"),
    );
    let hba = match get(&doc, &["bootstrap", "pg_hba"]) {
        Yaml::Array(lines) => lines
            .iter()
            .map(|l| s(&l.as_str().unwrap().replace("10.0.0.0/24", "127.0.0.0/8")))
            .collect(),
        other => panic!("bootstrap.pg_hba is a list: {other:?}"),
    };
    set(&mut doc, &["bootstrap", "pg_hba"], Yaml::Array(hba));
    set(&mut doc, &["postgresql", "listen"], s(&pg));
    set(&mut doc, &["postgresql", "connect_address"], s(&pg));
    set(
        &mut doc,
        &["postgresql", "data_dir"],
        s(&format!("{dir}/data")),
    );
    set(
        &mut doc,
        &["postgresql", "pgpass"],
        s(&format!("{dir}/pgpass")),
    );
    set(
        &mut doc,
        &["postgresql", "parameters", "unix_socket_directories"],
        s(&dir),
    );
    set(
        &mut doc,
        &["postgresql", "bin_dir"],
        s(&super::postgres::bindir().display().to_string()),
    );
    let mut out = String::new();
    YamlEmitter::new(&mut out).dump(&doc).unwrap();
    out
}

fn get<'a>(doc: &'a Yaml, path: &[&str]) -> &'a Yaml {
    path.iter().fold(doc, |at, key| &at[*key])
}

/// Sets the value at `path`, which must exist in the example (a renamed key
/// there fails here rather than be added beside it), except a last key of a
/// `parameters` map.
fn set(doc: &mut Yaml, path: &[&str], value: Yaml) {
    let (last, parents) = path.split_last().unwrap();
    let mut at = doc;
    for key in parents {
        at = match at {
            Yaml::Hash(h) => h
                .get_mut(&Yaml::String((*key).to_owned()))
                .unwrap_or_else(|| panic!("deploy/patroni/patroni.yml has no {path:?}")),
            _ => panic!("{path:?}: {key} is not a map"),
        };
    }
    let Yaml::Hash(h) = at else {
        panic!("{path:?}: not a map")
    };
    let key = Yaml::String((*last).to_owned());
    assert!(
        h.contains_key(&key) || parents.last() == Some(&"parameters"),
        "deploy/patroni/patroni.yml has no {path:?}"
    );
    h.insert(key, value);
}
