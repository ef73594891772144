//! TLS to PostgreSQL: `sslmode` and `sslrootcert` in `DATABASE_URL`, with
//! libpq's meanings, through rustls (ring).
//!
//! `tokio-postgres` knows `sslmode=disable|prefer|require` only, refuses
//! `sslrootcert` as an unknown option, and verifies nothing itself: the
//! connector does. So both parameters are taken out of the URL here, the rest
//! goes to `tokio-postgres`, and the connector is built to match:
//!
//! | `sslmode` | TLS | certificate chain | host name |
//! | --- | --- | --- | --- |
//! | absent, `disable` | never | – | – |
//! | `prefer` | when the server offers it | only with `sslrootcert` | no |
//! | `require` | always | only with `sslrootcert` | no |
//! | `verify-ca` | always | against `sslrootcert` | no |
//! | `verify-full` | always | against `sslrootcert` | yes |
//!
//! An absent `sslmode` stays plaintext, as fencehook always connected; libpq
//! would try TLS first (`prefer`), which changes nothing against a server
//! without TLS but costs a handshake per connection against one with it.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// `sslmode`, as libpq spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, UrlError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => return Err(UrlError::SslMode(other.to_owned())),
        })
    }
}

/// Why a database URL cannot be used. Never carries the password.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("not a PostgreSQL URL as written (in the URL form, special characters of the user and password are percent-encoded: `@` as %40, `/` as %2F)")]
    Url(#[source] tokio_postgres::Error),
    #[error("the user or password holds a raw `{0}`, which ends that part of the URL early (the rest would be taken for the host): percent-encode it as {pct} and every other special character there", pct = percent(*.0))]
    RawInUserinfo(char),
    #[error("sslmode `{0}` is not one of disable, prefer, require, verify-ca, verify-full")]
    SslMode(String),
    #[error(
        "sslmode={0} needs sslrootcert=<file> (the CA certificates to verify the server against)"
    )]
    NoRootCert(&'static str),
    #[error("sslrootcert {}: cannot be read", .0.display())]
    RootCertRead(PathBuf, #[source] io::Error),
    #[error("sslrootcert {}: holds no usable PEM certificate", .0.display())]
    RootCertEmpty(PathBuf),
    #[error("cannot build the TLS configuration")]
    Tls(#[source] rustls::Error),
}

/// A parsed `DATABASE_URL`: what `tokio-postgres` takes, and the connector
/// its `sslmode` and `sslrootcert` call for.
#[derive(Clone)]
pub struct Target {
    pub config: tokio_postgres::Config,
    pub tls: MakeRustls,
    pub mode: SslMode,
}

impl Target {
    /// Parses `url` (a `postgresql://` URL or `key=value` words) and reads
    /// `sslrootcert` when TLS can be used, so an unreadable file or a mode
    /// that cannot verify stops the start, not the first connection.
    pub fn parse(url: &str) -> Result<Target, UrlError> {
        let split = split(url)?;
        let mode = match &split.sslmode {
            Some(v) => SslMode::parse(v)?,
            None => SslMode::Disable,
        };
        let mut config: tokio_postgres::Config = split.rest.parse().map_err(UrlError::Url)?;
        config.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let tls = MakeRustls {
            config: client_config(mode, split.sslrootcert.as_deref().map(Path::new))?.map(Arc::new),
        };
        Ok(Target { config, tls, mode })
    }
}

/// `url` without `sslmode` and `sslrootcert`, and their values.
#[derive(Debug, PartialEq, Eq)]
struct Split {
    rest: String,
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

fn split(url: &str) -> Result<Split, UrlError> {
    match url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        Some(rest) => {
            check_userinfo(rest)?;
            Ok(split_url(url))
        }
        None => Ok(split_words(url)),
    }
}

/// A user or password holding a raw `@`, `/`, `?` or `#` parses as something
/// else than its writer meant: the password's tail taken for the host, a
/// host that never answers, waited for as if it were down. Refused here, as
/// a setting to fix. `rest` is the URL after its scheme.
fn check_userinfo(rest: &str) -> Result<(), UrlError> {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.matches('@').count() > 1 {
        return Err(UrlError::RawInUserinfo('@'));
    }
    let Some(delimiter) = rest[end..].chars().next() else {
        return Ok(());
    };
    if authority.contains('@') {
        return Ok(());
    }
    // No `@` before the first delimiter, but one soon after it (before any
    // path, parameter or value): the delimiter was in the user or password.
    let tail = &rest[end + 1..];
    match tail.find('@') {
        Some(at) if !tail[..at].contains(['/', '=', '&']) => {
            Err(UrlError::RawInUserinfo(delimiter))
        }
        _ => Ok(()),
    }
}

/// `c` percent-encoded.
fn percent(c: char) -> String {
    let mut buf = [0u8; 4];
    c.encode_utf8(&mut buf)
        .bytes()
        .map(|b| format!("%{b:02X}"))
        .collect()
}

/// The URL form: the two parameters come out of the query string, decoded;
/// every other parameter is left as written.
fn split_url(url: &str) -> Split {
    let mut out = Split {
        rest: url.to_owned(),
        sslmode: None,
        sslrootcert: None,
    };
    let Some((head, query)) = url.split_once('?') else {
        return out;
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match decode(key).as_str() {
            "sslmode" => out.sslmode = Some(decode(value)),
            "sslrootcert" => out.sslrootcert = Some(decode(value)),
            _ => kept.push(pair),
        }
    }
    out.rest = if kept.is_empty() {
        head.to_owned()
    } else {
        format!("{head}?{}", kept.join("&"))
    };
    out
}

/// The `key=value` form (`host=db sslmode=verify-full sslrootcert='/etc/x y.pem'`):
/// values unquoted and unescaped as libpq does; the other words are kept as
/// written (`tokio-postgres` parses them and says what is wrong).
fn split_words(url: &str) -> Split {
    let mut out = Split {
        rest: String::new(),
        sslmode: None,
        sslrootcert: None,
    };
    let mut kept: Vec<&str> = Vec::new();
    let mut rest = url.trim_start();
    while !rest.is_empty() {
        let start = rest;
        let key_end = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let key = &rest[..key_end];
        rest = rest[key_end..].trim_start();
        let mut value = String::new();
        if let Some(after) = rest.strip_prefix('=') {
            rest = after.trim_start();
            let mut chars = rest.char_indices().peekable();
            let quoted = rest.starts_with('\'');
            if quoted {
                chars.next();
            }
            let mut end = rest.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '\'' if quoted => {
                        end = i + 1;
                        break;
                    }
                    c if !quoted && c.is_whitespace() => {
                        end = i;
                        break;
                    }
                    c => value.push(c),
                }
            }
            rest = &rest[end..];
        }
        let word = start[..start.len() - rest.len()].trim();
        rest = rest.trim_start();
        match key {
            "sslmode" => out.sslmode = Some(value),
            "sslrootcert" => out.sslrootcert = Some(value),
            _ => kept.push(word),
        }
    }
    out.rest = kept.join(" ");
    out
}

/// The rustls configuration `mode` calls for; `None` for no TLS at all.
fn client_config(
    mode: SslMode,
    root_cert: Option<&Path>,
) -> Result<Option<ClientConfig>, UrlError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = match (mode, root_cert) {
        (SslMode::Disable, _) => return Ok(None),
        (SslMode::VerifyCa, None) => return Err(UrlError::NoRootCert("verify-ca")),
        (SslMode::VerifyFull, None) => return Err(UrlError::NoRootCert("verify-full")),
        (_, Some(path)) => Some(Arc::new(read_roots(path)?)),
        (_, None) => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match roots {
        // `prefer` and `require` without a CA: encrypted, the server
        // unverified (libpq's meaning).
        None => Arc::new(Unverified(provider.clone())),
        Some(roots) => {
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| UrlError::Tls(rustls::Error::General(e.to_string())))?;
            if mode == SslMode::VerifyFull {
                webpki
            } else {
                // `verify-ca`, and `prefer`/`require` given a CA (libpq
                // verifies the chain whenever it has a root certificate).
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(UrlError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    // What libpq 17 offers; servers before 17 ignore it, 17 and later need
    // it for a direct TLS start (`sslnegotiation=direct`).
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Some(config))
}

fn read_roots(path: &Path) -> Result<RootCertStore, UrlError> {
    let pem = std::fs::read(path).map_err(|e| UrlError::RootCertRead(path.to_owned(), e))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|_| UrlError::RootCertEmpty(path.to_owned()))?;
        roots
            .add(cert)
            .map_err(|_| UrlError::RootCertEmpty(path.to_owned()))?;
    }
    if roots.is_empty() {
        return Err(UrlError::RootCertEmpty(path.to_owned()));
    }
    Ok(roots)
}

/// Accepts any server certificate, but still checks the handshake's
/// signatures with it (an encrypted channel to whoever answered).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a given CA; the name in the
/// certificate is not compared with the host. webpki checks the name last,
/// so a name mismatch means everything before it passed.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The `tokio-postgres` connector over tokio-rustls. `config` is `None`
/// under `sslmode=disable`, where `tokio-postgres` never asks for TLS.
#[derive(Clone)]
pub struct MakeRustls {
    config: Option<Arc<ClientConfig>>,
}

/// A TLS handshake with PostgreSQL failed, or could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(io::Error);

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = TlsError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, TlsError> {
        // Asked for every connection, TLS or not (a Unix socket gives ""):
        // whatever is wrong here is said only if a handshake is attempted.
        let setup = match &self.config {
            None => Err("sslmode=disable: no TLS configured".to_owned()),
            Some(config) => ServerName::try_from(domain.to_owned())
                .map(|name| (config.clone(), name))
                .map_err(|e| format!("`{domain}` cannot be verified as a TLS server name ({e})")),
        };
        Ok(RustlsConnect(setup))
    }
}

pub struct RustlsConnect(Result<(Arc<ClientConfig>, ServerName<'static>), String>);

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = TlsError;
    type Future = Pin<Box<dyn Future<Output = Result<RustlsStream<S>, TlsError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let (config, name) = self.0.map_err(|e| TlsError(io::Error::other(e)))?;
            tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
                .map(RustlsStream)
                .map_err(TlsError)
        })
    }
}

/// A TLS stream to PostgreSQL.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S> tokio_postgres::tls::TlsStream for RustlsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn channel_binding(&self) -> ChannelBinding {
        // No tls-server-end-point: SCRAM runs without channel binding, as
        // under `channel_binding=prefer` (the default) against any server.
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Whether a connection failed in its TLS negotiation (the server refused
/// TLS under a mode that needs it, or its certificate did not verify): a
/// setting to fix, not an outage to wait out.
pub fn is_tls_failure(e: &tokio_postgres::Error) -> bool {
    // tokio-postgres has no public error kind; its TLS errors all start so.
    e.to_string().starts_with("error performing TLS handshake")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(rest: &str, mode: Option<&str>, root: Option<&str>) -> Split {
        Split {
            rest: rest.to_owned(),
            sslmode: mode.map(str::to_owned),
            sslrootcert: root.map(str::to_owned),
        }
    }

    #[test]
    fn the_url_form_loses_sslmode_and_sslrootcert_and_keeps_every_other_parameter() {
        assert_eq!(
            split_url("postgresql://u:p@db:5433/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca%20x.pem"),
            s("postgresql://u:p@db:5433/app?application_name=x", Some("verify-full"), Some("/etc/ca x.pem"))
        );
        assert_eq!(
            split_url("postgres://db/app?sslmode=require"),
            s("postgres://db/app", Some("require"), None)
        );
        assert_eq!(
            split_url("postgres://db/app"),
            s("postgres://db/app", None, None)
        );
    }

    #[test]
    fn the_word_form_loses_sslmode_and_sslrootcert_quoted_or_not() {
        assert_eq!(
            split_words(
                "host=db sslmode = verify-ca sslrootcert='/etc/my ca\\'s.pem' password='a b'"
            ),
            s(
                "host=db password='a b'",
                Some("verify-ca"),
                Some("/etc/my ca's.pem")
            )
        );
        assert_eq!(
            split_words("host=db user=u"),
            s("host=db user=u", None, None)
        );
    }

    #[test]
    fn an_absent_sslmode_means_no_tls_as_before() {
        let t = Target::parse("postgres://db/app").unwrap();
        assert_eq!(t.mode, SslMode::Disable);
        assert!(t.tls.config.is_none());
        assert_eq!(
            t.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable
        );
    }

    #[test]
    fn each_mode_maps_to_the_connection_tokio_postgres_makes() {
        use tokio_postgres::config::SslMode as Pg;
        for (mode, pg) in [
            ("disable", Pg::Disable),
            ("prefer", Pg::Prefer),
            ("require", Pg::Require),
        ] {
            let t = Target::parse(&format!("postgres://db/app?sslmode={mode}")).unwrap();
            assert_eq!(t.config.get_ssl_mode(), pg, "{mode}");
            assert_eq!(t.tls.config.is_some(), mode != "disable", "{mode}");
        }
    }

    #[test]
    fn verifying_modes_need_a_readable_root_certificate() {
        for mode in ["verify-ca", "verify-full"] {
            let e = Target::parse(&format!("postgres://u:secret@db/app?sslmode={mode}"))
                .err()
                .unwrap();
            assert!(matches!(e, UrlError::NoRootCert(_)), "{mode}: {e}");
        }
        let e = Target::parse(
            "postgres://u:secret@db/app?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        )
        .err()
        .unwrap();
        assert!(matches!(e, UrlError::RootCertRead(..)), "{e}");
        let text = crate::report::chain(&e);
        assert!(
            text.contains("/nonexistent/ca.pem") && !text.contains("secret"),
            "{text}"
        );
    }

    #[test]
    fn a_root_certificate_file_without_a_certificate_is_refused() {
        let dir = std::env::temp_dir().join(format!("fencehook-pgtls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("empty.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = Target::parse(&format!(
            "postgres://db/app?sslmode=require&sslrootcert={}",
            path.display()
        ))
        .err()
        .unwrap();
        assert!(matches!(e, UrlError::RootCertEmpty(_)), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn disable_ignores_sslrootcert_as_libpq_does() {
        let t = Target::parse("postgres://db/app?sslmode=disable&sslrootcert=/nonexistent/ca.pem")
            .unwrap();
        assert!(t.tls.config.is_none());
    }

    /// tokio-postgres makes the connector before it knows whether TLS is
    /// used, for a Unix socket too (host name ""): making it never fails.
    #[test]
    fn the_connector_is_made_for_every_connection_even_without_tls_or_a_host_name() {
        for url in ["postgres://db/app", "postgres://db/app?sslmode=require"] {
            let mut t = Target::parse(url).unwrap();
            for host in ["db", ""] {
                let made =
                    MakeTlsConnect::<tokio::net::TcpStream>::make_tls_connect(&mut t.tls, host);
                assert!(made.is_ok(), "{url} {host:?}");
            }
        }
    }

    #[test]
    fn an_unknown_sslmode_is_refused_by_name() {
        let e = Target::parse("postgres://db/app?sslmode=allow")
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "sslmode `allow` is not one of disable, prefer, require, verify-ca, verify-full"
        );
    }

    #[test]
    fn a_raw_delimiter_in_the_user_or_password_is_refused_naming_its_encoding() {
        for (url, raw, encoded) in [
            ("postgres://app:p@ss@db.internal:5432/fencehook", '@', "%40"),
            ("postgresql://app:pa/ss@db.internal/fencehook", '/', "%2F"),
            ("postgres://app:pa?ss@db.internal/fencehook", '?', "%3F"),
            ("postgres://app:pa#ss@db.internal/fencehook", '#', "%23"),
            ("postgres://a@b:p@h1:5432,h2:5432/db", '@', "%40"),
        ] {
            let e = Target::parse(url).err().unwrap_or_else(|| panic!("{url}"));
            assert!(
                matches!(e, UrlError::RawInUserinfo(c) if c == raw),
                "{url}: {e}"
            );
            let said = e.to_string();
            assert!(
                said.contains("percent-encode") && said.contains(encoded),
                "{said}"
            );
            assert!(!said.contains("ss@"), "no part of the password: {said}");
        }
    }

    #[test]
    fn urls_written_as_meant_still_parse() {
        for url in [
            "postgres://app:p%40ss%2Fw@db.internal:5432/fencehook",
            "postgres://app@%2Frun%2Fpostgresql/fencehook",
            "postgresql:///fencehook?host=/run/postgresql",
            "postgres://app:s3cret@h1:5432,h2:5432/db?target_session_attrs=read-write",
            "postgres://db/app?application_name=a@b",
            "postgres://app:pa:ss@db/app",
            "postgres://db",
            "host=db user=app password=p@ss/w dbname=x",
        ] {
            Target::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn an_unknown_parameter_is_refused_saying_how_the_url_is_written() {
        let e = Target::parse("postgres://app@db/fencehook?sslmdoe=require")
            .err()
            .unwrap();
        let said = crate::report::chain(&e);
        assert!(
            said.contains("sslmdoe") && said.contains("percent-encoded"),
            "{said}"
        );
    }
}
