//! Real processes: `fencehook serve` children on ephemeral ports, and private
//! `redis-server` instances a test may kill and restart. Never the shared ones.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::{client, Reply, SECRET};

/// A `fencehook serve` process.
pub struct ServeProcess {
    child: Child,
    pub base: String,
    pub admin: String,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl ServeProcess {
    /// Starts `fencehook serve` with `env` on ports it picks itself
    /// (`127.0.0.1:0`) and waits for its "serving" log line.
    pub async fn start(env: &[(&str, String)]) -> ServeProcess {
        ServeProcess::start_with(fencehook_command("serve"), env).await
    }

    /// As [`ServeProcess::start`], under an open-file limit of `soft`
    /// (`hard`) set by `prlimit` (util-linux), as `ulimit -n` would.
    pub async fn start_with_open_files(
        env: &[(&str, String)],
        soft: u64,
        hard: u64,
    ) -> ServeProcess {
        let mut cmd = Command::new("prlimit");
        cmd.arg(format!("--nofile={soft}:{hard}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_fencehook"))
            .arg("serve");
        ServeProcess::start_with(clean_env(cmd), env).await
    }

    async fn start_with(mut cmd: Command, env: &[(&str, String)]) -> ServeProcess {
        cmd.env("FENCEHOOK_LISTEN", "127.0.0.1:0")
            .env("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:0")
            .env("FENCEHOOK_GENERIC_SECRET", SECRET);
        let (child, logs, (port, admin_port)) =
            spawn_logged(cmd, env, "serve", serving_ports).await;
        ServeProcess {
            child,
            base: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            logs,
        }
    }

    /// Starts `fencehook serve` with `env` and waits only for its admin
    /// listener: the public one may wait for the database. `base` is empty
    /// until [`ServeProcess::wait_serving`] finds the "serving" line.
    pub async fn start_admin_first(env: &[(&str, String)]) -> ServeProcess {
        let mut cmd = fencehook_command("serve");
        cmd.env("FENCEHOOK_LISTEN", "127.0.0.1:0")
            .env("FENCEHOOK_ADMIN_LISTEN", "127.0.0.1:0")
            .env("FENCEHOOK_GENERIC_SECRET", SECRET);
        let (child, logs, admin_port) = spawn_logged(cmd, env, "serve", admin_port).await;
        ServeProcess {
            child,
            base: String::new(),
            admin: format!("http://127.0.0.1:{admin_port}"),
            logs,
        }
    }

    /// Waits (up to `limit`) for the "serving" line and sets `base`.
    pub async fn wait_serving(&mut self, limit: Duration) {
        let end = tokio::time::Instant::now() + limit;
        loop {
            let port = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .find_map(|l| serving_ports(l));
            if let Some((port, _)) = port {
                self.base = format!("http://127.0.0.1:{port}");
                return;
            }
            assert!(
                tokio::time::Instant::now() < end,
                "not serving within {limit:?}: {:?}",
                self.logs.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// GET on the admin listener: (status, body).
    pub async fn get_admin(&self, path: &str) -> (u16, String) {
        let req = hyper::Request::get(format!("{}{path}", self.admin))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Log lines whose message contains `text`.
    pub fn log_lines(&self, text: &str) -> Vec<String> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(text))
            .cloned()
            .collect()
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// Sends a signal by name (`KILL`, `STOP`, `CONT`, `TERM`).
    pub fn signal(&self, sig: &str) {
        send_signal(self.pid(), sig);
    }

    /// Waits for the process to exit; `None` when it did not within `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        wait_exit(&mut self.child, limit).await
    }

    pub async fn deliver(&self, payload: &serde_json::Value) -> Reply {
        deliver_to(&self.base, payload).await
    }

    /// Sum of a metric's samples on this process's /metrics.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let req = hyper::Request::get(format!("{}/metrics", self.admin))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        super::metrics::sum(&String::from_utf8_lossy(&body), name, labels)
    }
}

/// (port, admin port) from the "fencehook serving" line, in either log
/// format (`FENCEHOOK_LOG_FORMAT=text` too, colour codes or not).
/// `fencehook <command>` with JSON logs, no migrations, and none of the test
/// runner's own `FENCEHOOK_*`, `DATABASE_URL`, `REDIS_URL` or `FAILPOINTS`.
fn fencehook_command(command: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.arg(command);
    clean_env(cmd)
}

/// `cmd` (fencehook, or a wrapper that runs it) with the settings of
/// [`fencehook_command`].
fn clean_env(mut cmd: Command) -> Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("FENCEHOOK_")
            || k.starts_with("OTEL_")
            || k == "DATABASE_URL"
            || k == "REDIS_URL"
            || k == "FAILPOINTS"
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("FENCEHOOK_LOG_FORMAT", "json")
        .env("FENCEHOOK_MIGRATE_ON_START", "false");
    cmd
}

/// Spawns `cmd` with `env`, keeps its stderr lines (echoed to the test's
/// output with `TEST_LOG=1`), and waits (20 s at most) for the first line
/// `ready` recognises.
async fn spawn_logged<T: Send + 'static>(
    mut cmd: Command,
    env: &[(&str, String)],
    what: &str,
    ready: impl Fn(&str) -> Option<T> + Send + 'static,
) -> (Child, Arc<Mutex<Vec<String>>>, T) {
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("fencehook binary starts");
    let pid = child.id();
    let stderr = child.stderr.take().unwrap();
    let logs = Arc::new(Mutex::new(Vec::new()));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn({
        let logs = logs.clone();
        let what = what.to_owned();
        async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut ready_tx = Some(ready_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                super::log::echo(&what, pid, &line);
                if let Some(value) = ready(&line) {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(value);
                    }
                }
                logs.lock().unwrap().push(line);
            }
        }
    });
    let value = tokio::time::timeout(Duration::from_secs(20), ready_rx)
        .await
        .unwrap_or_else(|_| panic!("fencehook {what} did not start: {:?}", logs.lock().unwrap()))
        .expect("its start line");
    (child, logs, value)
}

/// Sends a signal by name (`KILL`, `STOP`, `CONT`, `TERM`, `HUP`).
fn send_signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig}");
}

/// Waits for the process to exit; `None` when it did not within `limit`.
async fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    tokio::time::timeout(limit, child.wait())
        .await
        .ok()
        .map(|r| r.unwrap())
}

/// The admin port from the "admin listener up" line (JSON logs).
fn admin_port(line: &str) -> Option<u64> {
    let v = serde_json::from_str::<serde_json::Value>(line).ok()?;
    v["message"]
        .as_str()?
        .starts_with("admin listener up")
        .then(|| v["admin_port"].as_u64())?
}

fn serving_ports(line: &str) -> Option<(u64, u64)> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
        if v["message"] == "fencehook serving" {
            return Some((v["port"].as_u64()?, v["admin_port"].as_u64()?));
        }
        return None;
    }
    let plain = strip_ansi(line);
    if !plain.contains("fencehook serving") {
        return None;
    }
    let field = |name: &str| -> Option<u64> {
        let at = plain.find(&format!(" {name}="))? + name.len() + 2;
        let digits: String = plain[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    Some((field("port")?, field("admin_port")?))
}

/// `line` without ANSI escape sequences (`ESC [ … final byte`).
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[test]
fn the_serving_line_gives_its_ports_in_text_with_or_without_colour() {
    let coloured = "\x1b[2m2025-01-01T00:00:00Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mfencehook\x1b[0m\x1b[2m:\x1b[0m fencehook serving \x1b[3mport\x1b[0m\x1b[2m=\x1b[0m4100 \x1b[3madmin_port\x1b[0m\x1b[2m=\x1b[0m4200";
    assert_eq!(serving_ports(coloured), Some((4100, 4200)));
    let plain = "2025-01-01T00:00:00Z  INFO fencehook: fencehook serving port=4100 admin_port=4200";
    assert_eq!(serving_ports(plain), Some((4100, 4200)));
    let json = r#"{"message":"fencehook serving","port":4100,"admin_port":4200}"#;
    assert_eq!(serving_ports(json), Some((4100, 4200)));
    assert_eq!(serving_ports("something else port=1"), None);
}

/// Signs and posts a generic payload to an app's base URL. Transport errors
/// (a killed process) come back as status 0.
pub async fn deliver_to(base: &str, payload: &serde_json::Value) -> Reply {
    deliver_signed(base, payload, SECRET).await
}

/// As [`deliver_to`], signed with `secret`.
pub async fn deliver_signed(base: &str, payload: &serde_json::Value, secret: &str) -> Reply {
    let body = payload.to_string();
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let ts = super::now();
    let sig = fencehook::providers::standard::sign(secret, &id, ts, body.as_bytes()).unwrap();
    let req = hyper::Request::post(format!("{base}/webhooks/generic"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sig)
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    send_for_reply(req).await
}

/// Signs a Stripe event with the endpoint secret `secret` (as Stripe does,
/// now) and posts it to `{base}/webhooks/{provider}`. Transport errors (a
/// killed process) come back as status 0.
pub async fn deliver_stripe_to(
    base: &str,
    provider: &str,
    event: &serde_json::Value,
    secret: &str,
) -> Reply {
    let body = event.to_string();
    let sig = fencehook::providers::stripe::sign(secret, super::now(), body.as_bytes()).unwrap();
    let req = hyper::Request::post(format!("{base}/webhooks/{provider}"))
        .header("content-type", "application/json")
        .header("stripe-signature", sig)
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    send_for_reply(req).await
}

/// Sends `req` (30 s at most) and reads its answer; status 0 when there is
/// none.
async fn send_for_reply(req: hyper::Request<http_body_util::Full<bytes::Bytes>>) -> Reply {
    match tokio::time::timeout(Duration::from_secs(30), client().request(req)).await {
        Ok(Ok(resp)) => {
            let status = resp.status().as_u16();
            let header = |name| super::header_of(resp.headers(), name);
            let retry_after = header("retry-after");
            let content_type = header("content-type");
            let connection = header("connection");
            let bytes = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Reply {
                status,
                retry_after,
                body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
                text: String::from_utf8_lossy(&bytes).into_owned(),
                content_type,
                connection,
            }
        }
        _ => Reply {
            status: 0,
            retry_after: None,
            body: serde_json::Value::Null,
            text: String::new(),
            content_type: None,
            connection: None,
        },
    }
}

/// A private `redis-server` without persistence, on an address of its own:
/// a loopback address no other test binds (`127.x.y.z`, chosen at random), so
/// the port it is restarted on stays free while it is down.
pub struct PrivateRedis {
    pub addr: std::net::SocketAddr,
    child: Option<Child>,
}

impl PrivateRedis {
    pub async fn start() -> PrivateRedis {
        let ip = format!(
            "127.{}.{}.{}",
            100 + rand::random::<u8>() % 100,
            rand::random::<u8>(),
            1 + rand::random::<u8>() % 254
        );
        let addr = super::free_addr_on(&ip).await;
        let mut r = PrivateRedis { addr, child: None };
        r.restart().await;
        r
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Starts (again) on the same port, empty, and waits until it answers.
    pub async fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.addr.port().to_string(),
                "--bind",
                &self.addr.ip().to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server is installed");
        self.child = Some(child);
        let url = self.url();
        super::wait_for("private redis answers", Duration::from_secs(10), || {
            let url = url.clone();
            async move {
                let Ok(client) = redis::Client::open(url.as_str()) else {
                    return false;
                };
                let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                    return false;
                };
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            }
        })
        .await;
    }

    /// SIGKILL: everything in memory is gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// A `fencehook work` process: inbox workers, no listeners.
pub struct WorkProcess {
    child: Child,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl WorkProcess {
    /// Starts `fencehook work` with `env` (JSON logs) and waits until its
    /// workers have started.
    pub async fn start(env: &[(&str, String)]) -> WorkProcess {
        let mut cmd = fencehook_command("work");
        cmd.env("FENCEHOOK_MODE", "inbox");
        let started = |line: &str| line.contains("inbox workers started").then_some(());
        let (child, logs, ()) = spawn_logged(cmd, env, "work", started).await;
        WorkProcess { child, logs }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// Sends a signal by name (`KILL`, `TERM`).
    pub fn signal(&self, sig: &str) {
        send_signal(self.pid(), sig);
    }

    /// Waits for the process to exit; `None` when it did not within `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        wait_exit(&mut self.child, limit).await
    }
}

/// Every thread of `pid` is in the stopped state (`T`).
pub fn is_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        if !state.starts_with('T') {
            return false;
        }
        any = true;
    }
    any
}

/// Runs `fencehook <args>` with only `env` of the settings (as
/// [`ServeProcess::start`] does: none of the test runner's own); (exit code,
/// stdout, stderr).
pub async fn fencehook_tool(args: &[&str], env: &[(&str, String)]) -> (i32, String, String) {
    let mut cmd = clean_env(Command::new(env!("CARGO_BIN_EXE_fencehook")));
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
    let out = cmd.output().await.expect("the fencehook binary runs");
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        super::log::echo(args.first().unwrap_or(&""), None, line);
    }
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the `fencehook` binary; (exit code, stdout, stderr).
pub async fn fencehook_binary(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("the fencehook binary runs");
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        super::log::echo(args.first().unwrap_or(&""), None, line);
    }
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
