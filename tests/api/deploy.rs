//! What an operator installs from `deploy/` is tested as installed, so the
//! examples cannot rot: the providers file passes `check-config` with one
//! provider per scheme, the settings file names every setting of `serve
//! --help` (with its default) and nothing else, the Prometheus config loads
//! the alert rules and scrapes the admin port the settings file sets, the
//! systemd units stop after the drain and verify, and nginx — this very
//! config, ports and paths substituted — terminates TLS in front of a real
//! `fencehook serve`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fencehook::providers::SchemeKind;

use crate::helpers::process::ServeProcess;
use crate::helpers::{closed_port, now, payment, wait_for, TestContext, SECRET};

pub(crate) fn deploy_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name)
}

pub(crate) fn deploy_file(name: &str) -> String {
    let path = deploy_path(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The binary with no setting inherited from the test's environment.
pub(crate) fn fencehook_command() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fencehook"));
    for (k, _) in std::env::vars() {
        if k.starts_with("FENCEHOOK_") || k == "DATABASE_URL" || k == "REDIS_URL" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A database URL for the commands that only check settings (nothing
/// connects to it).
const EXAMPLE_DATABASE_URL: &str = "postgres://fencehook_app@db.internal:5432/fencehook";

/// Every setting of `fencehook serve --help`: its variable and its default
/// (`None` where the help shows none).
pub(crate) fn serve_settings() -> BTreeMap<String, Option<String>> {
    let out = fencehook_command()
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let mut settings = BTreeMap::new();
    for line in help.lines() {
        let Some(at) = line.find("[env: ") else {
            continue;
        };
        let rest = &line[at + "[env: ".len()..];
        let name = &rest[..rest.find(']').expect("[env: NAME]")];
        let default = rest.find("[default: ").map(|d| {
            let value = &rest[d + "[default: ".len()..];
            value[..value.find(']').expect("[default: X]")].to_owned()
        });
        settings.insert(name.to_owned(), default);
    }
    assert!(
        settings.len() >= 30 && settings.contains_key("DATABASE_URL"),
        "the help names the settings: {help}"
    );
    settings
}

/// A line of the settings file that sets a variable: `NAME=value` (set on
/// purpose) or `# NAME=value` (the default, shown commented out). Indented
/// mentions inside a comment are prose, not settings.
#[derive(Debug)]
struct EnvLine {
    name: String,
    value: String,
    commented: bool,
}

fn env_lines(text: &str) -> Vec<EnvLine> {
    let is_name = |s: &str| {
        !s.is_empty()
            && s.starts_with(|c: char| c.is_ascii_uppercase())
            && s.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    };
    text.lines()
        .filter_map(|line| {
            let (commented, body) = match line.strip_prefix("# ") {
                Some(rest) => (true, rest),
                None => (false, line),
            };
            let (name, value) = body.split_once('=')?;
            is_name(name).then(|| EnvLine {
                name: name.to_owned(),
                value: value.to_owned(),
                commented,
            })
        })
        .collect()
}

/// Every `FENCEHOOK_…` word of a text.
fn fencehook_words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("FENCEHOOK_") && w.len() > "FENCEHOOK_".len())
        .map(str::to_owned)
        .collect()
}

/// The values the settings file sets (not the commented defaults).
pub(crate) fn example_settings() -> BTreeMap<String, String> {
    env_lines(&deploy_file("fencehook.env.example"))
        .into_iter()
        .filter(|l| !l.commented)
        .map(|l| (l.name, l.value))
        .collect()
}

pub(crate) fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("`{addr}` is host:port"))
}

/// Its placeholders are published: served as they are, anyone could sign
/// deliveries (a probe booked 500,000 on three providers). `check-config`
/// refuses the file naming a provider, and passes it, loudly, only when
/// development is said.
#[test]
fn the_example_providers_file_is_refused_as_it_stands_and_passes_check_config_for_development() {
    let text = deploy_file("providers.example.toml");
    // Key files are relative to the file, so `check-config` below is what
    // reads it whole; here only which schemes it names.
    let mut schemes: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("scheme = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .collect();
    schemes.sort_unstable();
    let mut all: Vec<&str> = SchemeKind::ALL.iter().map(|s| s.as_str()).collect();
    all.sort_unstable();
    assert_eq!(schemes, all, "one provider per scheme fencehook supports");

    let out = fencehook_command()
        .arg("check-config")
        .env("FENCEHOOK_PROVIDERS", deploy_path("providers.example.toml"))
        .env("DATABASE_URL", EXAMPLE_DATABASE_URL)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    // Every published placeholder in one run, one line each.
    for provider in [
        "adyen", "alipay", "checkout", "mollie", "paddle", "razorpay", "shop", "square", "stripe",
        "wechat",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(&format!(
                    "invalid configuration: FENCEHOOK_PROVIDERS: provider `{provider}`: "
                )) && l.contains("FENCEHOOK_ALLOW_PUBLISHED_SECRETS=true serves it")),
            "{provider}: {stderr}"
        );
    }
    assert!(
        stderr
            .lines()
            .all(|l| l.starts_with("fencehook: invalid configuration: FENCEHOOK_PROVIDERS: ")),
        "{stderr}"
    );

    let out = fencehook_command()
        .arg("check-config")
        .env("FENCEHOOK_PROVIDERS", deploy_path("providers.example.toml"))
        .env("DATABASE_URL", EXAMPLE_DATABASE_URL)
        .env("FENCEHOOK_ALLOW_PUBLISHED_SECRETS", "true")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "providers [adyen, alipay, checkout, mollie, paddle, paypal, razorpay, shop, square, stripe, wechat]"
        ),
        "{stdout}"
    );
    for provider in [
        "adyen", "alipay", "checkout", "mollie", "paddle", "razorpay", "shop", "square", "stripe",
        "wechat",
    ] {
        assert!(
            stderr.contains(&format!("warning: provider `{provider}`: ")),
            "{provider} is warned about: {stderr}"
        );
    }
    assert!(stderr.contains("development only"), "{stderr}");
}

#[test]
fn the_example_settings_file_names_every_setting_of_serve_with_its_default_and_nothing_else() {
    let settings = serve_settings();
    let text = deploy_file("fencehook.env.example");
    let lines = env_lines(&text);

    for word in fencehook_words(&text) {
        assert!(
            settings.contains_key(&word),
            "{word} is named in fencehook.env.example but is no setting of `serve --help`"
        );
    }
    for line in &lines {
        assert!(
            settings.contains_key(&line.name),
            "{line:?} is no setting of `serve --help`"
        );
    }
    for (name, default) in &settings {
        let named: Vec<&EnvLine> = lines.iter().filter(|l| &l.name == name).collect();
        assert!(
            !named.is_empty(),
            "{name} (a setting of `serve --help`) is missing from fencehook.env.example"
        );
        assert!(
            named.iter().filter(|l| !l.commented).count() <= 1,
            "{name} is set twice"
        );
        for line in named.iter().filter(|l| l.commented) {
            if let Some(default) = default {
                assert_eq!(
                    &line.value, default,
                    "the commented line of {name} shows its default"
                );
            }
        }
    }

    // What the file sets is a valid configuration (its providers file being the example's).
    let mut cmd = fencehook_command();
    cmd.arg("check-config");
    for (name, value) in example_settings() {
        cmd.env(name, value);
    }
    cmd.env("FENCEHOOK_PROVIDERS", deploy_path("providers.example.toml"));
    // The example's placeholders are published secrets.
    cmd.env("FENCEHOOK_ALLOW_PUBLISHED_SECRETS", "true");
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The install block's `check-config` line, run as written (its paths moved
/// to a scratch directory holding the example files): it sees the settings
/// file, so it reads the providers file that one names, and says every
/// published placeholder; with development said in the file, it passes.
#[test]
fn the_install_blocks_check_config_line_works_as_written() {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let install = &guide[guide.find("useradd --system").expect("the install block")..];
    let line = install
        .lines()
        .take_while(|l| !l.starts_with("```"))
        .find(|l| l.contains(" check-config"))
        .expect("a check-config line in the install block");
    let command = line.split(" # ").next().unwrap().trim();
    let etc = Scratch::new("etc");
    let here = |text: &str| text.replace("/etc/fencehook/", &format!("{}/", etc.display()));
    let settings = here(&deploy_file("fencehook.env.example"));
    std::fs::write(etc.join("fencehook.env"), &settings).unwrap();
    std::fs::write(
        etc.join("providers.toml"),
        deploy_file("providers.example.toml"),
    )
    .unwrap();
    std::fs::create_dir_all(etc.join("keys")).unwrap();
    for key in std::fs::read_dir(deploy_path("keys")).unwrap() {
        let key = key.unwrap().path();
        std::fs::copy(&key, etc.join("keys").join(key.file_name().unwrap())).unwrap();
    }
    let run = || {
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c").arg(
            here(command).replace("/usr/local/bin/fencehook", env!("CARGO_BIN_EXE_fencehook")),
        );
        for (k, _) in std::env::vars() {
            if k.starts_with("FENCEHOOK_") || k == "DATABASE_URL" || k == "REDIS_URL" {
                cmd.env_remove(k);
            }
        }
        cmd.output().unwrap()
    };
    let out = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "`{command}`: {stderr}");
    assert!(
        stderr.lines().count() > 1
            && stderr.lines().all(|l| l
                .starts_with("fencehook: invalid configuration: FENCEHOOK_PROVIDERS: provider `")),
        "only the providers file's placeholders, every one: {stderr}"
    );
    std::fs::write(
        etc.join("fencehook.env"),
        format!("{settings}FENCEHOOK_ALLOW_PUBLISHED_SECRETS=true\n"),
    )
    .unwrap();
    let out = run();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(
            "configuration ok: providers [adyen, alipay, checkout, mollie, paddle, paypal, razorpay, shop, square, stripe, wechat]"
        ),
        "{stdout}"
    );
}

#[test]
fn the_prometheus_config_loads_the_alert_rules_and_scrapes_the_admin_port_of_the_example() {
    let text = deploy_file("prometheus.yml");
    let docs = yaml_rust2::YamlLoader::load_from_str(&text).expect("prometheus.yml is YAML");
    let doc = &docs[0];
    let rule_files: Vec<&str> = doc["rule_files"]
        .as_vec()
        .expect("rule_files")
        .iter()
        .map(|f| f.as_str().expect("a path"))
        .collect();
    assert_eq!(rule_files, ["alerts.yml"]);
    assert!(
        deploy_path("alerts.yml").exists(),
        "rule_files is relative to prometheus.yml: alerts.yml sits beside it"
    );

    let admin_port = port_of(&example_settings()["FENCEHOOK_ADMIN_LISTEN"]);
    assert_ne!(admin_port, 9090, "9090 is Prometheus's own port");
    let jobs = doc["scrape_configs"].as_vec().expect("scrape_configs");
    let job = jobs
        .iter()
        .find(|j| j["job_name"].as_str() == Some("fencehook"))
        .expect("a fencehook job");
    assert_eq!(job["metrics_path"].as_str(), Some("/metrics"));
    let targets: Vec<&str> = job["static_configs"]
        .as_vec()
        .expect("static_configs")
        .iter()
        .flat_map(|c| c["targets"].as_vec().expect("targets").iter())
        .map(|t| t.as_str().expect("host:port"))
        .collect();
    assert!(targets.len() >= 2, "several instances: {targets:?}");
    for target in targets {
        assert_eq!(
            port_of(target),
            admin_port,
            "{target} is the admin listener of fencehook.env.example"
        );
    }
}

/// The alert rules are checked by Prometheus's own tool, and their unit tests
/// (deploy/alerts.test.yml: series in, alerts out) pass: each rule that
/// pages for a refused provider, a silent one, the audit or the
/// reconciliation fires when it should and stays quiet when it should not.
#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests_cover_the_rules_that_page() {
    let promtool = find_program("promtool").expect(
        "promtool is not installed: `make tools` installs it (Debian's prometheus package)",
    );
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(deploy_path(""))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tests = yaml_rust2::YamlLoader::load_from_str(&deploy_file("alerts.test.yml"))
        .expect("alerts.test.yml is YAML");
    let mut fired: Vec<&str> = Vec::new();
    let mut quiet: Vec<&str> = Vec::new();
    for case in tests[0]["tests"].as_vec().expect("tests") {
        for check in case["alert_rule_test"].as_vec().expect("alert_rule_test") {
            let name = check["alertname"].as_str().expect("alertname");
            match check["exp_alerts"].as_vec().map(Vec::len) {
                Some(0) => quiet.push(name),
                _ => fired.push(name),
            }
        }
    }
    for rule in [
        "FencehookDeliveriesUnauthorized",
        "FencehookProviderSilent",
        "FencehookAuditViolations",
        "FencehookAuditStale",
        "FencehookReconcileRecovered",
        "FencehookReconcileDivergence",
        "FencehookReconcileStale",
    ] {
        assert!(fired.contains(&rule), "{rule} is tested firing");
        assert!(quiet.contains(&rule), "{rule} is tested quiet");
    }
}

/// `Key=value` lines of a unit file's `[Service]` section (a key set twice
/// keeps both values).
fn service_section(unit: &str) -> Vec<(String, String)> {
    let text = deploy_file(unit);
    let mut in_service = false;
    let mut entries = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                entries.push((k.to_owned(), v.to_owned()));
            }
        }
    }
    entries
}

fn unit_value<'a>(entries: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    entries
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// A systemd time span of one unit (`30s`, `2min`, `1h`, `500ms`, `20`).
fn timespan(value: &str) -> Duration {
    let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
    let n: u64 = digits.parse().unwrap_or_else(|_| panic!("`{value}`"));
    match &value[digits.len()..] {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "min" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        unit => panic!("time unit `{unit}` of `{value}`"),
    }
}

pub(crate) fn default_of(settings: &BTreeMap<String, Option<String>>, name: &str) -> u64 {
    settings[name]
        .as_deref()
        .unwrap_or_else(|| panic!("{name} has a default"))
        .parse()
        .unwrap()
}

#[test]
fn the_systemd_units_run_the_right_command_outlast_the_drain_and_verify() {
    let settings = serve_settings();
    let drain = Duration::from_millis(default_of(&settings, "FENCEHOOK_SHUTDOWN_TIMEOUT_MS"));

    let serve = service_section("fencehook.service");
    assert_eq!(
        unit_value(&serve, "ExecStart"),
        ["/usr/local/bin/fencehook serve"]
    );
    assert_eq!(
        unit_value(&serve, "EnvironmentFile"),
        ["/etc/fencehook/fencehook.env"]
    );
    assert_eq!(
        unit_value(&serve, "ExecReload"),
        ["/bin/kill -HUP $MAINPID"]
    );
    assert!(
        example_settings().contains_key("FENCEHOOK_PROVIDERS"),
        "reload (SIGHUP) re-reads the providers file: without one it is ignored"
    );
    assert_eq!(unit_value(&serve, "KillSignal"), ["SIGTERM"]);
    // The public drain, then the inbox workers' own, then the admin listener.
    let stop = timespan(unit_value(&serve, "TimeoutStopSec")[0]);
    assert!(
        stop > drain * 2 + Duration::from_secs(5),
        "TimeoutStopSec {stop:?} outlasts the drain"
    );
    let nofile: u64 = unit_value(&serve, "LimitNOFILE")[0].parse().unwrap();
    let needed = default_of(&settings, "FENCEHOOK_MAX_CONNECTIONS")
        + default_of(&settings, "FENCEHOOK_MAX_INFLIGHT")
        + default_of(&settings, "FENCEHOOK_DB_POOL_SIZE")
        + 256;
    assert!(
        nofile > needed,
        "LimitNOFILE {nofile} > connections + downstream calls + pool"
    );

    let work = service_section("fencehook-work.service");
    assert_eq!(
        unit_value(&work, "ExecStart"),
        ["/usr/local/bin/fencehook work"]
    );
    assert!(
        unit_value(&work, "ExecReload").is_empty(),
        "fencehook work has nothing to reload (it ignores SIGHUP)"
    );
    let stop = timespan(unit_value(&work, "TimeoutStopSec")[0]);
    assert!(stop > drain + Duration::from_secs(5), "{stop:?}");

    let migrate = service_section("fencehook-migrate.service");
    assert_eq!(unit_value(&migrate, "Type"), ["oneshot"]);
    assert_eq!(
        unit_value(&migrate, "ExecStart"),
        ["/usr/local/bin/fencehook migrate"]
    );
    assert_eq!(
        unit_value(&migrate, "EnvironmentFile"),
        ["/etc/fencehook/migrate.env"],
        "the owner's URL, and only there"
    );

    let audit = service_section("fencehook-audit.service");
    assert_eq!(unit_value(&audit, "Type"), ["oneshot"]);
    assert_eq!(
        unit_value(&audit, "ExecStart"),
        ["/usr/local/bin/fencehook audit"]
    );
    assert_eq!(
        unit_value(&audit, "EnvironmentFile"),
        ["/etc/fencehook/fencehook.env"],
        "serve's role records the run"
    );
    let timer = deploy_file("fencehook-audit.timer");
    assert!(
        timer.lines().any(|l| l.trim() == "OnCalendar=hourly"),
        "more often than the console's day before a run is stale: {timer}"
    );

    for unit in [&serve, &work, &migrate, &audit] {
        assert_eq!(unit_value(unit, "User"), ["fencehook"]);
        assert_eq!(unit_value(unit, "ProtectSystem"), ["strict"]);
        assert_eq!(unit_value(unit, "NoNewPrivileges"), ["yes"]);
        assert_eq!(unit_value(unit, "CapabilityBoundingSet"), [""]);
    }
    systemd_analyze_verify();
}

/// `systemd-analyze verify` of the units and the audit's timer. It checks that ExecStart's
/// binary exists, so the built binary is bind-mounted at /usr/local/bin in a
/// private mount namespace (root and `unshare` needed); skipped with a
/// message where that cannot be done. Without systemd-analyze it fails.
fn systemd_analyze_verify() {
    let units: Vec<PathBuf> = [
        "fencehook.service",
        "fencehook-work.service",
        "fencehook-migrate.service",
        "fencehook-audit.service",
        "fencehook-audit.timer",
    ]
    .iter()
    .map(|u| deploy_path(u))
    .collect();
    // A missing tool fails the test: a skip would pass silently, and the
    // suite would report green without ever having checked the units.
    assert!(
        on_path("systemd-analyze"),
        "systemd-analyze is not installed: `make tools` installs it"
    );
    let installed = Path::new("/usr/local/bin/fencehook").exists();
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let can_mount = root && on_path("unshare");
    if !(installed || can_mount) {
        eprintln!("SKIPPED systemd-analyze verify: /usr/local/bin/fencehook is missing and a private mount namespace needs root and unshare");
        return;
    }
    let out = if installed {
        std::process::Command::new("systemd-analyze")
            .arg("verify")
            .args(&units)
            .output()
    } else {
        let bin = Scratch::new("verify");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fencehook"), bin.join("fencehook")).unwrap();
        std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$1" /usr/local/bin && shift && exec systemd-analyze verify "$@""#)
            .arg("sh")
            .arg(bin.as_os_str())
            .args(&units)
            .output()
    }
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}

pub(crate) fn on_path(program: &str) -> bool {
    find_program(program).is_some()
}

/// `program` on PATH, or in the sbin directories a non-root PATH may lack.
pub(crate) fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .map(PathBuf::from)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// A fresh directory under the system's temporary directory, removed when
/// dropped; kept when the test fails, for the logs in it.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "fencehook-{what}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for its logs", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The value of the first `directive value;` line of an nginx config.
fn nginx_directive<'a>(conf: &'a str, directive: &str) -> &'a str {
    conf.lines()
        .map(str::trim)
        .find_map(|l| {
            l.strip_prefix(directive)
                .filter(|rest| rest.starts_with(' '))
                .map(|rest| rest.trim().trim_end_matches(';'))
        })
        .unwrap_or_else(|| panic!("nginx.conf has no {directive}"))
}

fn nginx_size(value: &str) -> u64 {
    match value.strip_suffix(['k', 'K']) {
        Some(k) => k.parse::<u64>().unwrap() * 1024,
        None => value.parse().unwrap(),
    }
}

#[test]
fn the_nginx_config_fronts_only_the_public_listener_with_fencehooks_limits() {
    let conf = deploy_file("nginx.conf");
    let settings = serve_settings();
    let example = example_settings();
    let upstream: Vec<&str> = nginx_directive(&conf, "server")
        .split_whitespace()
        .collect();
    assert_eq!(
        upstream[0], example["FENCEHOOK_LISTEN"],
        "nginx proxies to the public listener of fencehook.env.example"
    );
    // Behind nginx every connection has nginx's address: its own bound on
    // them must fit under fencehook's per-peer cap, and it carries the
    // per-client limits fencehook cannot see.
    let max_conns: u64 = upstream[1]
        .strip_prefix("max_conns=")
        .expect("the upstream bounds its connections")
        .parse()
        .unwrap();
    assert!(max_conns <= default_of(&settings, "FENCEHOOK_MAX_CONNECTIONS_PER_PEER"));
    assert!(max_conns < default_of(&settings, "FENCEHOOK_MAX_CONNECTIONS"));
    assert!(nginx_directive(&conf, "zone").starts_with("fencehook_public "));
    for directive in ["limit_conn_zone", "limit_req_zone"] {
        assert!(
            nginx_directive(&conf, directive).starts_with("$fencehook_client "),
            "{directive} is keyed on the client (an IPv4 address, an IPv6 /64)"
        );
    }
    assert_eq!(nginx_directive(&conf, "limit_conn"), "fencehook_conn 32");
    assert!(nginx_directive(&conf, "limit_req").starts_with("zone=fencehook_req "));
    let admin_port = port_of(&example["FENCEHOOK_ADMIN_LISTEN"]).to_string();
    assert!(
        !conf.contains(&admin_port),
        "the admin listener is never proxied"
    );
    let locations: Vec<&str> = conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("location "))
        .collect();
    assert_eq!(
        locations,
        ["/webhooks/ {", "@unavailable {", "@too_large {", "/ {"]
    );
    assert_eq!(
        nginx_size(nginx_directive(&conf, "client_max_body_size")),
        default_of(&settings, "FENCEHOOK_MAX_BODY_BYTES"),
        "the same body limit as FENCEHOOK_MAX_BODY_BYTES"
    );
    assert_eq!(
        nginx_size(nginx_directive(&conf, "client_body_buffer_size")),
        default_of(&settings, "FENCEHOOK_MAX_BODY_BYTES"),
        "bodies stay in memory"
    );
    // fencehook closes a connection idle for 10 s (its request-head timeout).
    let idle = timespan(nginx_directive(&conf, "keepalive_timeout"));
    assert!(
        idle < Duration::from_secs(10),
        "upstream keepalive {idle:?}"
    );
    let read = timespan(nginx_directive(&conf, "proxy_read_timeout"));
    assert!(
        read > Duration::from_millis(default_of(&settings, "FENCEHOOK_LEASE_MAX_MS")),
        "nginx waits as long as fencehook may work on a delivery"
    );
    assert_eq!(nginx_directive(&conf, "ssl_protocols"), "TLSv1.2 TLSv1.3");
    assert!(!conf.contains("underscores_in_headers on"));
}

/// A running private nginx, stopped when dropped.
struct Nginx {
    child: tokio::process::Child,
    error_log: PathBuf,
}

impl Nginx {
    async fn start(program: &Path, dir: &Path, port: u16) -> Nginx {
        let error_log = dir.join("error.log");
        let child = tokio::process::Command::new(program)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(&error_log)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nginx starts");
        let mut nginx = Nginx { child, error_log };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return nginx;
            }
            if let Ok(Some(status)) = nginx.child.try_wait() {
                panic!("nginx exited ({status}):\n{}", nginx.errors());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nginx does not listen:\n{}",
                nginx.errors()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn errors(&self) -> String {
        std::fs::read_to_string(&self.error_log).unwrap_or_default()
    }
}

/// deploy/nginx.conf with the test's ports, certificate and log directory:
/// every substituted text must be in the shipped file, so the file tested is
/// the file shipped.
fn nginx_conf_for_test(dir: &Path, port: u16, upstream_port: u16) -> String {
    let mut conf = deploy_file("nginx.conf");
    let dir = dir.display();
    let substitutions = [
        ("listen 443 ssl;", format!("listen 127.0.0.1:{port} ssl;")),
        // IPv6 may be missing on a test host; the IPv4 listener is the same server.
        ("listen [::]:443 ssl;", String::new()),
        (
            "server 127.0.0.1:8080 ",
            format!("server 127.0.0.1:{upstream_port} "),
        ),
        (
            "/etc/fencehook/tls/fullchain.pem",
            format!("{dir}/cert.pem"),
        ),
        ("/etc/fencehook/tls/privkey.pem", format!("{dir}/key.pem")),
        ("/var/log/nginx/", format!("{dir}/")),
    ];
    for (from, to) in substitutions {
        assert!(
            conf.contains(from),
            "deploy/nginx.conf no longer has `{from}`: update this test with it"
        );
        conf = conf.replace(from, &to);
    }
    for line in conf.lines().filter(|l| !l.trim_start().starts_with('#')) {
        assert!(
            !line.contains("/etc/") && !line.contains("/var/"),
            "the test's nginx touches nothing outside its directory: {line}"
        );
    }
    conf
}

/// The main context around the http-context file, as /etc/nginx/nginx.conf
/// would be, but everything in `dir` and one process (`master_process off`,
/// so killing the child stops it all).
fn nginx_main_conf(dir: &Path) -> String {
    let dir = dir.display();
    format!(
        "master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 64; }}
http {{
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    include {dir}/fencehook.conf;
}}
"
    )
}

/// What curl got: status, headers (lower-case names), body.
#[derive(Debug)]
struct CurlReply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl CurlReply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One HTTPS request through curl, trusting only the test's certificate.
async fn curl(
    dir: &Path,
    url: &str,
    extra: &[&str],
    headers: &[(&str, String)],
    body: Option<&[u8]>,
) -> CurlReply {
    let mut cmd = tokio::process::Command::new("curl");
    // `-q` first: no ~/.curlrc; no proxy from the environment.
    cmd.args([
        "-q",
        "--noproxy",
        "*",
        "--silent",
        "--show-error",
        "--include",
    ])
    .args(["--max-time", "20"])
    .arg("--cacert")
    .arg(dir.join("cert.pem"))
    // No `Expect: 100-continue`: one answer to parse.
    .args(["-H", "Expect:"])
    .args(extra);
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    if let Some(body) = body {
        let file = dir.join(format!("body-{}", uuid::Uuid::new_v4().simple()));
        std::fs::write(&file, body).unwrap();
        cmd.arg("--data-binary").arg(format!("@{}", file.display()));
    }
    let out = cmd.arg(url).output().await.expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "curl {url}: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    CurlReply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A generic delivery as a Standard Webhooks sender signs it.
fn signed(payload: &serde_json::Value) -> (Vec<(&'static str, String)>, Vec<u8>) {
    let body = payload.to_string().into_bytes();
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let ts = now();
    let sig = fencehook::providers::standard::sign(SECRET, &id, ts, &body).unwrap();
    (
        vec![
            ("content-type", "application/json".to_owned()),
            ("webhook-id", id),
            ("webhook-timestamp", ts.to_string()),
            ("webhook-signature", sig),
        ],
        body,
    )
}

/// The `map` of deploy/nginx.conf that keys nginx's per-client limits: run
/// in an nginx that takes the client address from a header (the realip
/// module), so the test can be any address. Every spelling nginx writes of
/// addresses in one IPv6 /64 is one key, another /64 is another, and an IPv4
/// address is itself (`$binary_remote_addr`: its four bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_counts_an_ipv6_client_by_its_64_in_every_spelling_and_an_ipv4_one_by_its_address() {
    let Some(nginx_program) = find_program("nginx") else {
        panic!("nginx is not installed: `make tools` installs it");
    };
    let conf = deploy_file("nginx.conf");
    let start = conf
        .find("map $remote_addr $fencehook_client {")
        .expect("deploy/nginx.conf maps the client key");
    let end = start + conf[start..].find("\n}\n").expect("the map's end") + 3;
    let dir = Scratch::new("nginx-map");
    let port = closed_port().await;
    std::fs::write(
        dir.join("fencehook.conf"),
        format!(
            "{}\nserver {{\n    listen 127.0.0.1:{port};\n    set_real_ip_from 127.0.0.1;\n    \
             real_ip_header X-Client;\n    location / {{ return 200 \"$fencehook_client\"; }}\n}}\n",
            &conf[start..end]
        ),
    )
    .unwrap();
    std::fs::write(dir.join("nginx.conf"), nginx_main_conf(&dir)).unwrap();
    let _nginx = Nginx::start(&nginx_program, &dir, port).await;
    let key = |client: &'static str| async move {
        let req = hyper::Request::get(format!("http://127.0.0.1:{port}/"))
            .header("x-client", client)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let resp = crate::helpers::client().request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "{client}");
        http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    };
    // One /64, as nginx writes its addresses (the zero groups compressed
    // where the longest run of them is).
    let same_64 = [
        ("2001:db8:0:0:1:0:0:0", "2001:db8:0:0::/64"),
        ("2001:db8::1", "2001:db8:0:0::/64"),
        ("2001:db8::5:6:7:8", "2001:db8:0:0::/64"),
        ("2001:db8:0:0:ffff:ffff:ffff:ffff", "2001:db8:0:0::/64"),
    ];
    for (client, expected) in same_64 {
        assert_eq!(
            String::from_utf8(key(client).await).unwrap(),
            expected,
            "{client}"
        );
    }
    for (client, expected) in [
        ("2a01:4f8:c17:1a2b::1", "2a01:4f8:c17:1a2b::/64"),
        ("2a01:4f8:c17::9", "2a01:4f8:c17:0::/64"),
        ("2a01::7:1:2:3:4", "2a01:0:0:7::/64"),
        ("2a01::1", "2a01:0:0:0::/64"),
    ] {
        assert_eq!(
            String::from_utf8(key(client).await).unwrap(),
            expected,
            "{client}"
        );
    }
    assert_eq!(key("203.0.113.7").await, vec![203, 0, 113, 7]);
    assert_eq!(key("203.0.113.8").await, vec![203, 0, 113, 8]);
}

/// TLS by nginx with deploy/nginx.conf, the client curl (`--cacert`: it
/// trusts only the test's self-signed certificate), the certificate made by
/// the openssl command; curl and openssl are in the machine's base image.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nginx_with_the_deploy_config_terminates_tls_and_passes_only_webhooks_to_fencehook() {
    // Fails rather than skips: a skipped test reads as a passed one.
    let Some(nginx_program) = find_program("nginx") else {
        panic!("nginx is not installed: `make tools` installs it");
    };
    for tool in ["openssl", "curl"] {
        assert!(on_path(tool), "{tool} is needed by this test");
    }
    let ctx = TestContext::new().await;
    let dir = Scratch::new("nginx");
    let openssl = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .output()
        .unwrap();
    assert!(
        openssl.status.success(),
        "{}",
        String::from_utf8_lossy(&openssl.stderr)
    );

    let mut serve = ServeProcess::start(&[
        ("DATABASE_URL", ctx.database_url.clone()),
        ("REDIS_URL", ctx.redis_url.clone()),
        ("FENCEHOOK_REDIS_KEY_PREFIX", ctx.prefix.clone()),
    ])
    .await;
    let port = closed_port().await;
    std::fs::write(
        dir.join("fencehook.conf"),
        nginx_conf_for_test(&dir, port, port_of(&serve.base)),
    )
    .unwrap();
    std::fs::write(dir.join("nginx.conf"), nginx_main_conf(&dir)).unwrap();
    let nginx = Nginx::start(&nginx_program, &dir, port).await;
    let base = format!("https://127.0.0.1:{port}");
    let webhook = format!("{base}/webhooks/generic");

    // A signed delivery through TLS: the signature headers and the body reach
    // fencehook untouched, and it is booked once.
    let (headers, body) = signed(&payment("tx_nginx_1", 4200));
    let r = curl(&dir, &webhook, &[], &headers, Some(&body)).await;
    assert_eq!(
        (r.status, r.json()["result"].as_str()),
        (200, Some("processed")),
        "{r:?}"
    );
    assert_eq!(ctx.payments().await, 1);
    assert_eq!(ctx.entries().await, 1);
    // A PSP's re-send, over TLS 1.2 this time.
    let (headers, body) = signed(&payment("tx_nginx_1", 4200));
    let r = curl(&dir, &webhook, &["--tls-max", "1.2"], &headers, Some(&body)).await;
    assert_eq!(
        (r.status, r.json()["result"].as_str()),
        (200, Some("duplicate")),
        "{r:?}"
    );

    // The admin listener's paths are not reachable through nginx.
    for path in [
        "/metrics",
        "/healthz",
        "/readyz",
        "/",
        "/webhooks/../metrics",
    ] {
        let r = curl(&dir, &format!("{base}{path}"), &["--path-as-is"], &[], None).await;
        assert_eq!(r.status, 404, "{path}: {r:?}");
        assert!(!r.body.contains("fencehook_"), "{path}: {r:?}");
    }

    // A body over FENCEHOOK_MAX_BODY_BYTES is refused before fencehook, as fencehook would.
    let big = format!(
        "{{\"transaction_id\":\"tx_nginx_big\",\"pad\":\"{}\"}}",
        "x".repeat(65_536)
    );
    let (mut headers, _) = signed(&payment("tx_nginx_big", 1));
    headers.retain(|(k, _)| *k == "content-type");
    let r = curl(&dir, &webhook, &[], &headers, Some(big.as_bytes())).await;
    assert_eq!(
        (r.status, r.json()["result"].as_str()),
        (413, Some("too_large")),
        "{r:?}"
    );
    assert_eq!(ctx.payments().await, 1, "nothing written");

    // fencehook down: nginx answers as fencehook answers an outage.
    serve.signal("KILL");
    serve
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");
    let (headers, body) = signed(&payment("tx_nginx_2", 100));
    let r = curl(&dir, &webhook, &[], &headers, Some(&body)).await;
    assert_eq!(
        (r.status, r.json()["result"].as_str()),
        (503, Some("unavailable")),
        "{r:?}"
    );
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");

    // Every request above is in the access log, with what fencehook answered.
    let access_log = dir.join("fencehook.access.log");
    wait_for("nginx logged the requests", Duration::from_secs(5), || {
        let logged = std::fs::read_to_string(&access_log)
            .is_ok_and(|log| log.lines().count() >= 9 && log.contains(" us=200 "));
        async move { logged }
    })
    .await;
    drop(nginx);
}

/// `make test` ends with one grand total of the unit and integration runs:
/// scripts/test-total.sh sums every test binary's result line.
#[test]
fn the_test_total_sums_every_result_line_into_one_line() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-total.sh");
    let mut child = std::process::Command::new(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    let output = "\
running 54 tests
test result: ok. 54 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.92s
running 203 tests
test a::b ... FAILED
test result: FAILED. 190 passed; 2 failed; 11 ignored; 0 measured; 0 filtered out; finished in 300s
";
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), output.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "244 passed, 2 failed\n"
    );
}
