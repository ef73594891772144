//! The name of every setting, written once: the `env = …` of its flag and
//! every message that names it take it from here, so a renamed setting cannot
//! leave a message naming the old one. (The tests spell the names out: they
//! check the names a user types.)

/// What every fencehook setting's name starts with; a variable that does
/// and is no setting is warned about at start.
pub const PREFIX: &str = "FENCEHOOK_";

/// The OTLP exporter's settings together, as a message names them.
pub const OTEL_EXPORTER_OTLP_ALL: &str = "OTEL_EXPORTER_OTLP_*";

/// `FENCEHOOK_REDIS_TIMEOUT_MS`, the old name of
/// `FENCEHOOK_LEASE_TIMEOUT_MS`: warned about at start, read by nothing.
pub const FENCEHOOK_REDIS_TIMEOUT_MS: &str = "FENCEHOOK_REDIS_TIMEOUT_MS";

/// `pub const NAME: &str = "NAME";` for each name, the name written once.
macro_rules! settings {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("`", stringify!($name), "`")]
            pub const $name: &str = stringify!($name);
        )*
    };
}

settings! {
    REDIS_URL,
    FENCEHOOK_LISTEN,
    FENCEHOOK_ADMIN_LISTEN,
    FENCEHOOK_LEASE_BACKEND,
    FENCEHOOK_LEASE_TTL_MS,
    FENCEHOOK_LEASE_MAX_MS,
    FENCEHOOK_FENCE_KEY_TTL_SECS,
    FENCEHOOK_REDIS_KEY_PREFIX,
    FENCEHOOK_LEASE_TIMEOUT_MS,
    FENCEHOOK_INFLIGHT_WAIT_MS,
    FENCEHOOK_DOWNSTREAM_URL,
    FENCEHOOK_DOWNSTREAM_TIMEOUT_MS,
    FENCEHOOK_DOWNSTREAM_CA_FILE,
    FENCEHOOK_DOWNSTREAM_SECRET,
    FENCEHOOK_PROVIDERS,
    FENCEHOOK_GENERIC_SECRET,
    FENCEHOOK_ALLOW_PUBLISHED_SECRETS,
    FENCEHOOK_MAX_BODY_BYTES,
    FENCEHOOK_BODY_TIMEOUT_MS,
    FENCEHOOK_MAX_INFLIGHT,
    FENCEHOOK_MAX_CONNECTIONS,
    FENCEHOOK_MAX_CONNECTIONS_PER_PEER,
    FENCEHOOK_PEER_IPV6_PREFIX,
    FENCEHOOK_CONNECTION_MAX_REQUESTS,
    FENCEHOOK_CONNECTION_MAX_AGE_SECS,
    FENCEHOOK_SHUTDOWN_TIMEOUT_MS,
    FENCEHOOK_MIGRATE_ON_START,
    FENCEHOOK_REQUIRE_SYNC_REPLICATION,
    FENCEHOOK_LOG_FORMAT,
    FENCEHOOK_LOG,
    FENCEHOOK_MODE,
    FENCEHOOK_WORKERS,
    FENCEHOOK_RETRY_BASE_MS,
    FENCEHOOK_RETRY_MAX_MS,
    FENCEHOOK_MAX_ATTEMPTS,
    FENCEHOOK_MAX_AGE_SECS,
    FENCEHOOK_EVENT_RETENTION_DAYS,
    FENCEHOOK_PRUNE_INTERVAL_SECS,
    FENCEHOOK_RECONCILE_INTERVAL_SECS,
    FENCEHOOK_RECONCILE_LOOKBACK_SECS,
    FENCEHOOK_RECONCILE_OVERLAP_SECS,
    FENCEHOOK_RECONCILE_SETTLE_SECS,
    FENCEHOOK_DELIVERY_HISTORY,
    DATABASE_URL,
    FENCEHOOK_DB_POOL_SIZE,
    FENCEHOOK_DB_POOL_WAIT_MS,
    FENCEHOOK_DB_STATEMENT_TIMEOUT_MS,
    FENCEHOOK_DB_CONNECT_TIMEOUT_MS,
    FENCEHOOK_REDIS_SENTINELS,
    FENCEHOOK_REDIS_SENTINEL_MASTER,
    FENCEHOOK_REDIS_SENTINEL_PASSWORD,
    FENCEHOOK_REDIS_CA_FILE,
    FENCEHOOK_REDIS_CLIENT_CERT_FILE,
    FENCEHOOK_REDIS_CLIENT_KEY_FILE,
    FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE,
    FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE,
    FENCEHOOK_CONSOLE_SECURE_COOKIE,
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_TRACES_HEADERS,
    OTEL_EXPORTER_OTLP_TIMEOUT,
    OTEL_SERVICE_NAME,
    OTEL_RESOURCE_ATTRIBUTES,
    OTEL_TRACES_SAMPLER,
    OTEL_TRACES_SAMPLER_ARG,
    OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_SCHEDULE_DELAY,
    // Read by the tools only: `send`'s target and `send`/`load`'s WeChat Pay key.
    FENCEHOOK_URL,
    FENCEHOOK_WECHATPAY_APIV3_KEY,
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    const ROOT: &str = env!("CARGO_MANIFEST_DIR");

    /// Every setting name this file writes.
    fn names() -> Vec<String> {
        let text = std::fs::read_to_string(format!("{ROOT}/src/config/setting.rs")).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap();
        text.lines()
            .map(str::trim)
            .map(|l| l.trim_end_matches(','))
            .filter(|l| {
                l.len() > 4
                    && l.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    && l.contains('_')
            })
            .map(str::to_owned)
            .collect()
    }

    fn sources(dir: &Path) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                files.extend(sources(&path));
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
        files
    }

    /// The string literals of a line of code (not of its comment).
    fn literals(line: &str) -> Vec<&str> {
        let code = line.trim_start();
        if code.starts_with("//") {
            return Vec::new();
        }
        code.split('"').skip(1).step_by(2).collect()
    }

    /// A renamed setting cannot leave a message naming the old one: outside
    /// this file, code names a setting through its constant. (The metrics
    /// table's help texts are literals by necessity, and tests spell the
    /// names a user types.)
    #[test]
    fn no_setting_name_is_spelled_in_a_string_outside_this_file() {
        let names = names();
        assert!(names.len() > 60, "{names:?}");
        let src = Path::new(ROOT).join("src");
        let mut spelled = Vec::new();
        for file in sources(&src) {
            let relative = file.strip_prefix(&src).unwrap().display().to_string();
            if relative == "config/setting.rs" || relative == "metrics/table.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
            for (n, line) in code.lines().enumerate() {
                for literal in literals(line) {
                    let words = literal.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
                    if let Some(name) = words.into_iter().find(|w| names.iter().any(|n| n == w)) {
                        spelled.push(format!("src/{relative}:{}: {name}", n + 1));
                    }
                }
            }
        }
        assert!(
            spelled.is_empty(),
            "setting names spelled out; use config::setting's constants:\n{}",
            spelled.join("\n")
        );
    }
}
