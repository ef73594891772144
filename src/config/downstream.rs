//! The settings that make the downstream call one the order service can
//! trust: whom an `https://` downstream must prove it is
//! (`FENCEHOOK_DOWNSTREAM_CA_FILE`, else the public CAs) and the Standard
//! Webhooks key every call is signed with (`FENCEHOOK_DOWNSTREAM_SECRET`).
//! Read and checked at start: an unreadable CA file or a secret that is no
//! `whsec_<base64>` key stops the start with one line naming the setting.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use clap::Args;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

use super::error::{bad, ConfigErrors, Found};
use super::{setting, ConfigError};

/// The key sizes Standard Webhooks allows (24 to 64 bytes).
pub const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// Flags and environment of the downstream call's trust (flattened into
/// `fencehook serve` and `work`).
#[derive(Debug, Clone, Args, Default)]
pub struct DownstreamArgs {
    /// PEM file of the CA certificate(s) an https:// downstream's certificate
    /// must chain to, instead of the public CAs (a private CA). A certificate
    /// that does not verify fails the call (503); never a plaintext fallback.
    #[arg(long, env = setting::FENCEHOOK_DOWNSTREAM_CA_FILE)]
    pub downstream_ca_file: Option<PathBuf>,
    /// Standard Webhooks secret (`whsec_<base64>`, a 24 to 64-byte key):
    /// every downstream call carries webhook-id (its Idempotency-Key),
    /// webhook-timestamp and webhook-signature.
    #[arg(long, env = setting::FENCEHOOK_DOWNSTREAM_SECRET, hide_env_values = true)]
    pub downstream_secret: Option<String>,
}

/// The Standard Webhooks key the downstream calls are signed with. Never
/// printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(Vec<u8>);

impl SigningKey {
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(<redacted>)")
    }
}

/// The downstream call's trust, validated. Default: the public CAs, unsigned.
#[derive(Debug, Clone, Default)]
pub struct DownstreamTrust {
    /// The roots of an https:// downstream; `None`: the public CAs
    /// (Mozilla's, compiled in).
    pub roots: Option<Arc<RootCertStore>>,
    /// Sign every call (Standard Webhooks); `None`: unsigned.
    pub key: Option<SigningKey>,
}

impl DownstreamArgs {
    /// Both settings, every error found; `url` is the downstream's, if any.
    pub fn validate(&self, url: Option<&hyper::Uri>) -> Result<DownstreamTrust, ConfigErrors> {
        let mut found = Found::default();
        let roots = match &self.downstream_ca_file {
            None => Some(None),
            Some(path) => found.ok(ca_file(path, url).map(|r| Some(Arc::new(r)))),
        };
        let key = match self.downstream_secret.as_deref() {
            None => Some(None),
            Some(secret) => found.ok(signing_key(secret, url).map(Some)),
        };
        found.finish(roots.zip(key), |(roots, key)| DownstreamTrust {
            roots,
            key,
        })
    }
}

fn ca_file(path: &Path, url: Option<&hyper::Uri>) -> Result<RootCertStore, ConfigError> {
    let setting = setting::FENCEHOOK_DOWNSTREAM_CA_FILE;
    if url.and_then(|u| u.scheme_str()) != Some("https") {
        return Err(bad(
            setting,
            format!(
                "set, but {} is not an https:// URL: nothing would be verified",
                setting::FENCEHOOK_DOWNSTREAM_URL
            ),
        ));
    }
    let pem = std::fs::read(path)
        .map_err(|e| bad(setting, format!("cannot read {}: {e}", path.display())))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let added = cert
            .map_err(|e| e.to_string())
            .and_then(|c| roots.add(c).map_err(|e| e.to_string()));
        if let Err(e) = added {
            return Err(bad(
                setting,
                format!("{}: not a PEM certificate: {e}", path.display()),
            ));
        }
    }
    if roots.is_empty() {
        return Err(bad(
            setting,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(roots)
}

fn signing_key(secret: &str, url: Option<&hyper::Uri>) -> Result<SigningKey, ConfigError> {
    let setting = setting::FENCEHOOK_DOWNSTREAM_SECRET;
    if url.is_none() {
        return Err(bad(
            setting,
            format!(
                "set without {}: there is no call to sign",
                setting::FENCEHOOK_DOWNSTREAM_URL
            ),
        ));
    }
    let b64 = secret.strip_prefix("whsec_").ok_or_else(|| {
        bad(
            setting,
            "must be a Standard Webhooks secret, whsec_ followed by the key in base64",
        )
    })?;
    let key = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| bad(setting, "the part after whsec_ is not base64"))?;
    if !SECRET_BYTES.contains(&key.len()) {
        return Err(bad(
            setting,
            format!(
                "the key is {} bytes; Standard Webhooks keys are {} to {}",
                key.len(),
                SECRET_BYTES.start(),
                SECRET_BYTES.end()
            ),
        ));
    }
    Ok(SigningKey(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(ca: Option<&str>, secret: Option<&str>) -> DownstreamArgs {
        DownstreamArgs {
            downstream_ca_file: ca.map(PathBuf::from),
            downstream_secret: secret.map(str::to_owned),
        }
    }

    fn https() -> hyper::Uri {
        "https://orders.internal/payments".parse().unwrap()
    }

    fn errors(a: &DownstreamArgs, url: Option<&hyper::Uri>) -> Vec<String> {
        a.validate(url)
            .unwrap_err()
            .all()
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn a_secret_must_be_whsec_and_a_base64_key_of_24_to_64_bytes() {
        let url = https();
        let good = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([7u8; 32])
        );
        let trust = args(None, Some(&good)).validate(Some(&url)).unwrap();
        assert_eq!(trust.key.unwrap().bytes(), &[7u8; 32]);
        let short = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([7u8; 8])
        );
        for (secret, says) in [
            ("sk_live_abc", "whsec_"),
            ("whsec_not base64!", "not base64"),
            (short.as_str(), "8 bytes"),
        ] {
            let e = errors(&args(None, Some(secret)), Some(&url));
            assert_eq!(e.len(), 1, "{e:?}");
            assert!(
                e[0].starts_with("FENCEHOOK_DOWNSTREAM_SECRET: ") && e[0].contains(says),
                "{e:?}"
            );
            assert!(!e[0].contains(secret), "the secret is not printed: {e:?}");
        }
        let e = errors(&args(None, Some(&good)), None);
        assert!(e[0].contains("without FENCEHOOK_DOWNSTREAM_URL"), "{e:?}");
        assert!(format!("{:?}", SigningKey(vec![1, 2])).contains("redacted"));
    }

    #[test]
    fn a_ca_file_must_be_readable_hold_certificates_and_go_with_an_https_url() {
        let url = https();
        let e = errors(&args(Some("/nonexistent/ca.pem"), Some("nope")), Some(&url));
        assert_eq!(e.len(), 2, "every bad setting at once: {e:?}");
        assert!(
            e[0].starts_with("FENCEHOOK_DOWNSTREAM_CA_FILE: cannot read /nonexistent/ca.pem"),
            "{e:?}"
        );
        assert!(e[1].starts_with("FENCEHOOK_DOWNSTREAM_SECRET: "), "{e:?}");
        let dir = std::env::temp_dir().join(format!("fh-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = errors(&args(empty.to_str(), None), Some(&url));
        assert!(e[0].contains("holds no PEM certificate"), "{e:?}");
        let plain: hyper::Uri = "http://orders.internal/payments".parse().unwrap();
        let e = errors(&args(empty.to_str(), None), Some(&plain));
        assert!(e[0].contains("is not an https:// URL"), "{e:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
