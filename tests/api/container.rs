//! fencehook as a container is run: the image `make image` builds
//! (scripts/image.sh, FROM scratch) runs `fencehook migrate` and then
//! `serve` against the real PostgreSQL and Redis, under the strictest
//! securityContext the Kubernetes manifests give it (non-root, read-only root
//! filesystem, no new privileges, no capability), books a delivery once and
//! drains on SIGTERM. The two Containerfiles are held to one shape.
//!
//! The image is `TEST_IMAGE` when set (`.ci/run` sets it to the
//! image `make image` built from the release binary), else one built here
//! from this test binary's `fencehook`, tagged by its hash so a second run
//! reuses it. Skipped, saying so, only where podman is not installed (`make
//! tools` installs it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crate::deploy::{on_path, port_of};
use crate::helpers::process::deliver_to;
use crate::helpers::{closed_port, payment, wait_for, TestContext, SECRET};

fn repo_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

/// The final stage of a Containerfile: its instructions, continuation lines
/// joined, comments dropped.
fn final_stage(name: &str) -> Vec<(String, String)> {
    let path = repo_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && pending.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(line);
                let (op, args) = pending.split_once(' ').unwrap_or((&pending, ""));
                instructions.push((op.to_ascii_uppercase(), args.trim().to_owned()));
                pending.clear();
            }
        }
    }
    let last_from = instructions
        .iter()
        .rposition(|(op, _)| op == "FROM")
        .expect("a FROM");
    instructions.split_off(last_from)
}

/// `k=v k2="v 2"` pairs of an ENV, LABEL or ARG instruction.
fn pairs(args: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = args.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=').expect("key=value");
        let (value, tail) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"').expect("closing quote");
                (&quoted[..end], &quoted[end + 1..])
            }
            None => after.split_once(' ').unwrap_or((after, "")),
        };
        out.push((key.trim().to_owned(), value.to_owned()));
        rest = tail.trim_start();
    }
    out
}

/// What the final stage of a Containerfile sets for the running container.
#[derive(Debug, PartialEq)]
pub(crate) struct ImageShape {
    pub(crate) user: String,
    pub(crate) entrypoint: Vec<String>,
    pub(crate) cmd: Vec<String>,
    pub(crate) expose: Vec<u16>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) labels: BTreeMap<String, String>,
}

pub(crate) fn image_shape(containerfile: &str) -> ImageShape {
    let stage = final_stage(containerfile);
    let one = |op: &str| -> String {
        let found: Vec<&String> = stage
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, a)| a)
            .collect();
        assert_eq!(found.len(), 1, "{containerfile}: one {op}");
        found[0].clone()
    };
    let json_array = |op: &str| -> Vec<String> {
        serde_json::from_str(&one(op))
            .unwrap_or_else(|e| panic!("{containerfile}: {op} in exec form: {e}"))
    };
    let all_pairs = |op: &str| -> BTreeMap<String, String> {
        stage
            .iter()
            .filter(|(o, _)| o == op)
            .flat_map(|(_, a)| pairs(a))
            .collect()
    };
    ImageShape {
        user: one("USER"),
        entrypoint: json_array("ENTRYPOINT"),
        cmd: json_array("CMD"),
        expose: one("EXPOSE")
            .split_whitespace()
            .map(|p| p.parse().expect("a port"))
            .collect(),
        env: all_pairs("ENV"),
        labels: all_pairs("LABEL"),
    }
}

/// The image's uid and gid (`USER uid:gid`).
pub(crate) fn image_user() -> (u32, u32) {
    let user = image_shape("scripts/image.Containerfile").user;
    let (uid, gid) = user.split_once(':').expect("USER uid:gid");
    (uid.parse().unwrap(), gid.parse().unwrap())
}

fn cargo_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[test]
fn both_containerfiles_run_fencehook_serve_as_65532_on_the_ports_they_expose() {
    let scratch = image_shape("scripts/image.Containerfile");
    let registry = image_shape("Containerfile");
    assert_eq!(scratch, registry, "the two images run alike");

    assert_eq!(
        scratch.user, "65532:65532",
        "non-root, distroless's nonroot uid"
    );
    assert_eq!(scratch.entrypoint, ["fencehook"]);
    assert_eq!(scratch.cmd, ["serve"]);
    let public = port_of(&scratch.env["FENCEHOOK_LISTEN"]);
    let admin = port_of(&scratch.env["FENCEHOOK_ADMIN_LISTEN"]);
    assert_eq!(scratch.expose, [public, admin]);
    assert_eq!(
        admin,
        port_of(&crate::deploy::example_settings()["FENCEHOOK_ADMIN_LISTEN"]),
        "the admin port deploy/ scrapes everywhere"
    );
    for listen in ["FENCEHOOK_LISTEN", "FENCEHOOK_ADMIN_LISTEN"] {
        assert!(
            scratch.env[listen].starts_with("0.0.0.0:"),
            "{listen}: reachable from outside the container"
        );
    }
    assert_eq!(scratch.env["FENCEHOOK_LOG_FORMAT"], "json");
    let settings = crate::deploy::serve_settings();
    for name in scratch.env.keys().filter(|k| *k != "PATH") {
        assert!(settings.contains_key(name), "{name} is no setting of serve");
    }
    for label in ["version", "revision"] {
        let key = format!("org.opencontainers.image.{label}");
        assert_eq!(
            scratch.labels[&key],
            format!("${{{}}}", label.to_uppercase())
        );
    }
    // The registry build's default version is this one (make image passes Cargo.toml's).
    let args: BTreeMap<String, String> = final_stage("Containerfile")
        .iter()
        .filter(|(op, _)| op == "ARG")
        .flat_map(|(_, a)| pairs(a))
        .collect();
    assert_eq!(
        args["VERSION"],
        cargo_version(),
        "Containerfile's ARG VERSION"
    );
}

/// `scripts/podman.sh` with `args`: the podman options this machine needs.
fn podman(args: &[&str]) -> Output {
    std::process::Command::new(repo_path("scripts/podman.sh"))
        .args(args)
        .output()
        .expect("scripts/podman.sh runs")
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The image under test: `TEST_IMAGE`, or one built from this
/// test binary's `fencehook` unless an earlier run built it already.
fn image_under_test() -> String {
    if let Ok(image) = std::env::var("TEST_IMAGE") {
        assert!(
            podman(&["image", "exists", &image]).status.success(),
            "TEST_IMAGE={image} does not exist: make image"
        );
        return image;
    }
    let binary = env!("CARGO_BIN_EXE_fencehook");
    let bytes = std::fs::read(binary).unwrap();
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    let tag = format!("localhost/fencehook-test:{}", &digest[..16]);
    if !podman(&["image", "exists", &tag]).status.success() {
        let out = std::process::Command::new(repo_path("scripts/image.sh"))
            .args([binary, &tag])
            .output()
            .expect("scripts/image.sh runs");
        assert!(
            out.status.success(),
            "scripts/image.sh: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    tag
}

/// A container started by the test, removed when dropped.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let logs = podman(&["logs", &self.0]);
            eprintln!(
                "container {} logs:\n{}{}",
                self.0,
                String::from_utf8_lossy(&logs.stdout),
                String::from_utf8_lossy(&logs.stderr)
            );
        }
        let _ = podman(&["rm", "--force", "--time", "0", &self.0]);
    }
}

/// `podman run` options of the strictest securityContext of
/// deploy/kubernetes: read-only root filesystem (and no writable /tmp or
/// /run of podman's own), no privilege escalation, every capability dropped;
/// the host's network, where the test's PostgreSQL and Redis are.
const STRICT: &[&str] = &[
    "--network",
    "host",
    "--read-only",
    "--read-only-tmpfs=false",
    "--security-opt",
    "no-new-privileges",
    "--cap-drop",
    "all",
];

/// `Key:\tvalue` of /proc/<pid>/status.
fn proc_status(pid: &str, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_image_migrates_serves_one_booking_as_non_root_without_a_shell_and_drains_on_sigterm() {
    if !on_path("podman") {
        eprintln!("SKIPPED the container test: podman is not installed (`make test` and `make image` install it)");
        return;
    }
    let image = image_under_test();
    let ctx = TestContext::empty().await;
    let tables = "SELECT count(*) FROM pg_tables WHERE tablename = 'payments'";
    assert_eq!(ctx.count(tables).await, 0);
    let db_env = format!("DATABASE_URL={}", ctx.database_url);

    // `fencehook migrate` from the image: the schema is there afterwards.
    let mut migrate = vec!["run", "--rm"];
    migrate.extend_from_slice(STRICT);
    migrate.extend_from_slice(&["--env", &db_env, &image, "migrate"]);
    podman_ok(&migrate);
    assert_eq!(ctx.count(tables).await, 1, "migrate created the schema");

    // Settings from the environment; the providers file and a console token
    // mounted read-only as Kubernetes mounts a Secret for the pod's fsGroup:
    // owned by root and the image's group, mode 0440 (giving a file away
    // needs root; tests run as root).
    let (_, gid) = image_user();
    let dir = crate::deploy::Scratch::new("container");
    let providers = dir.join("providers.toml");
    let token = dir.join("viewer.token");
    for (file, text) in [
        (
            &providers,
            format!("[providers.generic]\nscheme = \"standard\"\nsecrets = [\"{SECRET}\"]\n"),
        ),
        (&token, format!("{}\n", "t".repeat(40))),
    ] {
        std::fs::write(file, text).unwrap();
        std::os::unix::fs::chown(file, Some(0), Some(gid)).expect("chown: the test runs as root");
        std::fs::set_permissions(file, std::os::unix::fs::PermissionsExt::from_mode(0o440))
            .unwrap();
    }
    let port = closed_port().await;
    let mut admin_port = closed_port().await;
    while admin_port == port {
        admin_port = closed_port().await;
    }
    let env = [
        db_env.clone(),
        // A name, not an address: resolved inside the image (glibc, its
        // nsswitch.conf, the /etc/hosts podman provides).
        format!(
            "REDIS_URL={}",
            ctx.redis_url.replace("127.0.0.1", "localhost")
        ),
        format!("FENCEHOOK_REDIS_KEY_PREFIX={}", ctx.prefix),
        format!("FENCEHOOK_LISTEN=127.0.0.1:{port}"),
        format!("FENCEHOOK_ADMIN_LISTEN=127.0.0.1:{admin_port}"),
        "FENCEHOOK_PROVIDERS=/etc/fencehook/providers.toml".to_owned(),
        "FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE=/etc/fencehook/console/viewer.token".to_owned(),
    ];
    let mounts = [
        format!("{}:/etc/fencehook/providers.toml:ro", providers.display()),
        format!("{}:/etc/fencehook/console/viewer.token:ro", token.display()),
    ];
    let name = format!("fencehook-test-{}", uuid::Uuid::new_v4().simple());
    let mut run = vec!["run", "--detach", "--name", &name];
    run.extend_from_slice(STRICT);
    for e in &env {
        run.extend_from_slice(&["--env", e]);
    }
    for m in &mounts {
        run.extend_from_slice(&["--volume", m]);
    }
    // No command: the image's CMD is `serve`.
    run.push(&image);
    let started = Instant::now();
    podman_ok(&run);
    let container = Container(name.clone());

    let base = format!("http://127.0.0.1:{port}");
    let admin = format!("http://127.0.0.1:{admin_port}");
    let client = crate::helpers::client();
    let get = |path: &str| {
        let req = hyper::Request::get(format!("{admin}{path}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let request = client.request(req);
        async move { request.await.map(|r| r.status().as_u16()).unwrap_or(0) }
    };
    wait_for(
        "/readyz answers 200 from the container",
        Duration::from_secs(60),
        || async { get("/readyz").await == 200 },
    )
    .await;
    eprintln!(
        "container start to /readyz 200: {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(get("/healthz").await, 200);
    assert_eq!(
        get("/console/login").await,
        200,
        "the console token, group-readable by the process's own group, was accepted"
    );

    // A signed delivery is booked once; the PSP's re-send is a duplicate.
    let r = deliver_to(&base, &payment("tx_container_1", 4200)).await;
    assert_eq!((r.status, r.result()), (200, "processed"), "{r:?}");
    let r = deliver_to(&base, &payment("tx_container_1", 4200)).await;
    assert_eq!((r.status, r.result()), (200, "duplicate"), "{r:?}");
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(ctx.entries().await, 1);

    // The process as the kernel sees it: the image's unprivileged user, no
    // way to gain privileges, no capability, a read-only root filesystem.
    let pid = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &name]);
    let (uid, gid) = image_user();
    assert_ne!(uid, 0);
    assert_eq!(proc_status(&pid, "Uid"), format!("{uid} {uid} {uid} {uid}"));
    assert_eq!(proc_status(&pid, "Gid"), format!("{gid} {gid} {gid} {gid}"));
    assert_eq!(proc_status(&pid, "NoNewPrivs"), "1");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(proc_status(&pid, caps), "0000000000000000", "{caps}");
    }
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("the root mount");
    let options = root.split_whitespace().nth(5).unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "root mounted {options}"
    );

    // No shell to exec, none in the image's files, no package manager.
    for shell in ["sh", "/bin/sh", "/bin/bash", "/bin/busybox"] {
        let out = podman(&["exec", &name, shell, "-c", "true"]);
        assert!(!out.status.success(), "`podman exec {shell}` ran");
    }
    let files = podman(&["export", &name]);
    assert!(files.status.success());
    let listing = std::process::Command::new("tar")
        .arg("-t")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut tar| {
            use std::io::Write;
            tar.stdin.take().unwrap().write_all(&files.stdout)?;
            tar.wait_with_output()
        })
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    // Every file: the binary, glibc's loader and libraries, the few files
    // of /etc it reads, the package records, what podman adds, and the
    // test's own mounts.
    let expected = |path: &str| {
        path.ends_with('/')
            || [
                "usr/local/bin/fencehook",
                "etc/passwd",
                "etc/group",
                "etc/nsswitch.conf",
                "etc/ssl/certs/ca-certificates.crt",
                "etc/hosts",
                "etc/hostname",
                "etc/resolv.conf",
                "etc/mtab",
                "run/.containerenv",
            ]
            .contains(&path)
            || path.starts_with("var/lib/dpkg/status.d/")
            || path.starts_with("etc/fencehook/")
            || ((path.starts_with("lib/") || path.starts_with("lib64/")) && path.contains(".so"))
    };
    for path in listing.lines() {
        assert!(expected(path), "{path} is in the image:\n{listing}");
    }
    assert!(
        listing.lines().any(|l| l == "usr/local/bin/fencehook"),
        "{listing}"
    );

    // SIGTERM to PID 1: drained, exit 0, and the log (JSON lines) says so.
    podman_ok(&["kill", "--signal", "TERM", &name]);
    let waited = tokio::task::spawn_blocking({
        let name = name.clone();
        move || podman(&["wait", &name])
    });
    let exit = tokio::time::timeout(Duration::from_secs(60), waited)
        .await
        .expect("the container exits within the drain bound")
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&exit.stdout).trim(),
        "0",
        "exit status"
    );
    let logs = podman(&["logs", &name]);
    let logs =
        String::from_utf8_lossy(&logs.stderr).into_owned() + &String::from_utf8_lossy(&logs.stdout);
    let messages: Vec<String> = logs
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"));
            v["message"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    for said in ["shutting down: draining in-flight deliveries", "stopped"] {
        assert!(
            messages.iter().any(|m| m == said),
            "`{said}` in {messages:?}"
        );
    }
    drop(container);
}
