//! A private Redis Cluster (3 primaries, 1 replica each) from `redis-server`
//! processes on free ports, for the lease's cluster path and failover.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

pub struct PrivateCluster {
    pub ports: Vec<u16>,
    children: Vec<Option<Child>>,
    dir: PathBuf,
}

async fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl PrivateCluster {
    pub async fn start() -> PrivateCluster {
        let dir =
            std::env::temp_dir().join(format!("fh-cluster-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ports = Vec::new();
        let mut bus_ports = Vec::new();
        let mut children = Vec::new();
        // Hold every listener until all ports are chosen, so no two are the
        // same. Each node also needs a cluster-bus port; the default (port +
        // 10000) can fall outside the port range or on a taken port, so it is
        // chosen the same way and passed with --cluster-port.
        let mut holders = Vec::new();
        for i in 0..12 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            if i < 6 {
                ports.push(port);
            } else {
                bus_ports.push(port);
            }
            holders.push(l);
        }
        drop(holders);
        for (port, bus) in ports.iter().zip(&bus_ports) {
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus.to_string(),
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-replica-validity-factor",
                    "0",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    dir.to_str().unwrap(),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("redis-server is installed");
            children.push(Some(child));
        }
        for port in &ports {
            super::wait_for(
                "cluster node answers",
                Duration::from_secs(10),
                || async move { cli(*port, &["ping"]).await.trim() == "PONG" },
            )
            .await;
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = PrivateCluster {
            ports,
            children,
            dir,
        };
        cluster.wait_ok().await;
        cluster
    }

    /// `REDIS_URL` naming every node as a seed.
    pub fn url(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until every live node reports `cluster_state:ok` and sees 3 primaries.
    pub async fn wait_ok(&self) {
        let live: Vec<u16> = self
            .ports
            .iter()
            .zip(&self.children)
            .filter(|(_, c)| c.is_some())
            .map(|(p, _)| *p)
            .collect();
        super::wait_for(
            "cluster_state:ok on every node",
            Duration::from_secs(30),
            || {
                let live = live.clone();
                async move {
                    for p in live {
                        let info = cli(p, &["cluster", "info"]).await;
                        let nodes = cli(p, &["cluster", "nodes"]).await;
                        let primaries = nodes
                            .lines()
                            .filter(|l| l.contains("master") && !l.contains("fail"))
                            .count();
                        if !info.contains("cluster_state:ok") || primaries != 3 {
                            return false;
                        }
                    }
                    true
                }
            },
        )
        .await;
    }

    /// Port of the primary that serves `key`'s slot.
    pub async fn primary_for(&self, key: &str) -> u16 {
        let slot: u16 = cli(self.ports[0], &["cluster", "keyslot", key])
            .await
            .trim()
            .parse()
            .unwrap();
        let nodes = cli(self.ports[0], &["cluster", "nodes"]).await;
        for line in nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
        {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port: u16 = fields[1]
                .split('@')
                .next()
                .unwrap()
                .rsplit(':')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            for range in &fields[8..] {
                let (lo, hi) = match range.split_once('-') {
                    Some((a, b)) => (a.parse::<u16>().unwrap(), b.parse::<u16>().unwrap()),
                    None => (range.parse().unwrap(), range.parse().unwrap()),
                };
                if (lo..=hi).contains(&slot) {
                    return port;
                }
            }
        }
        panic!("no primary serves slot {slot}:\n{nodes}");
    }

    /// SIGKILLs the node on `port` (its replica is promoted after the node timeout).
    pub async fn kill(&mut self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).unwrap();
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill().await;
        }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
