//! The Redis lease store's settings beyond `REDIS_URL`: the master found
//! through Redis Sentinel, and the TLS material of `rediss://`, read and
//! checked at start. Only the Redis lease backend reads them.

use std::path::PathBuf;

use clap::Args;

use super::{bad, setting, ConfigError};

/// Where the Redis master comes from when it is not `REDIS_URL` (Sentinel),
/// and the TLS material of `rediss://`.
#[derive(Debug, Clone, Args, Default)]
pub struct RedisHaArgs {
    /// Redis Sentinel addresses (host:port,host:port,…): the master is asked
    /// of them, and asked again after an error. REDIS_URL must be unset.
    #[arg(long, env = setting::FENCEHOOK_REDIS_SENTINELS)]
    pub redis_sentinels: Option<String>,
    /// Name of the master the sentinels monitor (`sentinel monitor <name> …`).
    #[arg(long, env = setting::FENCEHOOK_REDIS_SENTINEL_MASTER)]
    pub redis_sentinel_master: Option<String>,
    /// Password of the sentinels themselves (their `requirepass`).
    #[arg(
        long,
        env = setting::FENCEHOOK_REDIS_SENTINEL_PASSWORD,
        hide_env_values = true
    )]
    pub redis_sentinel_password: Option<String>,
    /// PEM file of the CA that signed the Redis server's certificate
    /// (rediss://); without it the system's trust store is used.
    #[arg(long, env = setting::FENCEHOOK_REDIS_CA_FILE)]
    pub redis_ca_file: Option<PathBuf>,
    /// PEM certificate (chain) presented to Redis (rediss://, with
    /// FENCEHOOK_REDIS_CLIENT_KEY_FILE).
    #[arg(long, env = setting::FENCEHOOK_REDIS_CLIENT_CERT_FILE)]
    pub redis_client_cert_file: Option<PathBuf>,
    /// PEM private key of FENCEHOOK_REDIS_CLIENT_CERT_FILE.
    #[arg(long, env = setting::FENCEHOOK_REDIS_CLIENT_KEY_FILE)]
    pub redis_client_key_file: Option<PathBuf>,
}

/// `REDIS_URL` when none is set (and no sentinel either).
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// The master is found through Redis Sentinel.
#[derive(Clone)]
pub struct SentinelConfig {
    /// `host:port` of every sentinel.
    pub sentinels: Vec<String>,
    pub master: String,
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// TLS material for `rediss://`, read and parsed at start (PEM).
#[derive(Clone, Default)]
pub struct RedisTls {
    /// The CA bundle; `None`: the system's trust store.
    pub ca: Option<Vec<u8>>,
    /// Client certificate chain and key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl RedisHaArgs {
    /// The Sentinel settings, if any, checked against `REDIS_URL`.
    pub(super) fn sentinel(
        &self,
        redis_url: Option<&str>,
    ) -> Result<Option<SentinelConfig>, ConfigError> {
        let blank = |v: &Option<String>| v.as_deref().is_none_or(|s| s.trim().is_empty());
        match (
            blank(&self.redis_sentinels),
            blank(&self.redis_sentinel_master),
        ) {
            (true, true) => {
                if self.redis_sentinel_password.is_some() {
                    return Err(bad(
                        setting::FENCEHOOK_REDIS_SENTINEL_PASSWORD,
                        format!("is set without {fencehook_redis_sentinels}", fencehook_redis_sentinels = setting::FENCEHOOK_REDIS_SENTINELS),
                    ));
                }
                return Ok(None);
            }
            (false, true) => return Err(bad(
                setting::FENCEHOOK_REDIS_SENTINEL_MASTER,
                format!("must name the master the sentinels monitor when {fencehook_redis_sentinels} is set", fencehook_redis_sentinels = setting::FENCEHOOK_REDIS_SENTINELS),
            )),
            (true, false) => return Err(bad(
                setting::FENCEHOOK_REDIS_SENTINELS,
                format!("must list the sentinels (host:port,…) when {fencehook_redis_sentinel_master} is set", fencehook_redis_sentinel_master = setting::FENCEHOOK_REDIS_SENTINEL_MASTER),
            )),
            (false, false) => {}
        }
        if redis_url.is_some() {
            return Err(bad(
                setting::REDIS_URL,
                format!("must be unset when {fencehook_redis_sentinels} is set: the sentinels name the master", fencehook_redis_sentinels = setting::FENCEHOOK_REDIS_SENTINELS),
            ));
        }
        let mut sentinels = Vec::new();
        for node in self.redis_sentinels.as_deref().unwrap_or("").split(',') {
            let node = node.trim();
            let port = node
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            match port {
                Some((host, Ok(port))) if !host.is_empty() && port > 0 && !host.contains('/') => {
                    sentinels.push(node.to_owned())
                }
                _ => {
                    return Err(bad(
                        setting::FENCEHOOK_REDIS_SENTINELS,
                        format!("`{node}` is not host:port"),
                    ))
                }
            }
        }
        let master = self.redis_sentinel_master.as_deref().unwrap_or("").trim();
        if master.chars().any(char::is_whitespace) {
            return Err(bad(
                setting::FENCEHOOK_REDIS_SENTINEL_MASTER,
                "must not contain spaces",
            ));
        }
        if self.redis_ca_file.is_some() || self.redis_client_cert_file.is_some() {
            return Err(bad(
                setting::FENCEHOOK_REDIS_SENTINELS,
                format!("TLS to a Sentinel-managed Redis is not supported by this build; use a private network, or rediss:// in {redis_url} without Sentinel", redis_url = setting::REDIS_URL),
            ));
        }
        Ok(Some(SentinelConfig {
            sentinels,
            master: master.to_owned(),
            password: self
                .redis_sentinel_password
                .clone()
                .filter(|p| !p.is_empty()),
        }))
    }

    /// The TLS files, read and parsed; only with `rediss://`.
    pub(super) fn tls(&self, tls_url: bool) -> Result<RedisTls, ConfigError> {
        if !tls_url {
            for (setting, file) in [
                (setting::FENCEHOOK_REDIS_CA_FILE, &self.redis_ca_file),
                (
                    setting::FENCEHOOK_REDIS_CLIENT_CERT_FILE,
                    &self.redis_client_cert_file,
                ),
                (
                    setting::FENCEHOOK_REDIS_CLIENT_KEY_FILE,
                    &self.redis_client_key_file,
                ),
            ] {
                if file.is_some() {
                    return Err(bad(
                        setting,
                        format!(
                            "is set but {redis_url} is not rediss:// (TLS)",
                            redis_url = setting::REDIS_URL
                        ),
                    ));
                }
            }
            return Ok(RedisTls::default());
        }
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let read = |setting: &'static str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| bad(setting, format!("cannot read {}: {e}", path.display())))
        };
        let certs = |setting: &'static str, path: &PathBuf, pem: &[u8]| {
            let n = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    bad(
                        setting,
                        format!("{}: not a PEM certificate: {e}", path.display()),
                    )
                })?
                .len();
            if n == 0 {
                return Err(bad(
                    setting,
                    format!("{}: holds no PEM certificate", path.display()),
                ));
            }
            Ok(())
        };
        let ca = match &self.redis_ca_file {
            Some(path) => {
                let pem = read(setting::FENCEHOOK_REDIS_CA_FILE, path)?;
                certs(setting::FENCEHOOK_REDIS_CA_FILE, path, &pem)?;
                Some(pem)
            }
            None => None,
        };
        let client = match (&self.redis_client_cert_file, &self.redis_client_key_file) {
            (None, None) => None,
            (Some(_), None) => {
                return Err(bad(
                    setting::FENCEHOOK_REDIS_CLIENT_KEY_FILE,
                    format!(
                        "must be set with {fencehook_redis_client_cert_file}",
                        fencehook_redis_client_cert_file =
                            setting::FENCEHOOK_REDIS_CLIENT_CERT_FILE
                    ),
                ))
            }
            (None, Some(_)) => {
                return Err(bad(
                    setting::FENCEHOOK_REDIS_CLIENT_CERT_FILE,
                    format!(
                        "must be set with {fencehook_redis_client_key_file}",
                        fencehook_redis_client_key_file = setting::FENCEHOOK_REDIS_CLIENT_KEY_FILE
                    ),
                ))
            }
            (Some(cert_path), Some(key_path)) => {
                let cert = read(setting::FENCEHOOK_REDIS_CLIENT_CERT_FILE, cert_path)?;
                certs(setting::FENCEHOOK_REDIS_CLIENT_CERT_FILE, cert_path, &cert)?;
                let key = read(setting::FENCEHOOK_REDIS_CLIENT_KEY_FILE, key_path)?;
                PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
                    bad(
                        setting::FENCEHOOK_REDIS_CLIENT_KEY_FILE,
                        format!("{}: not a PEM private key: {e}", key_path.display()),
                    )
                })?;
                Some((cert, key))
            }
        };
        Ok(RedisTls { ca, client })
    }
}
