//! `fencehook load --serve-cert FILE`: PayPal's signing certificate, served
//! by the load itself at `--cert-url` while the run lasts.
//!
//! A paypal provider fetches the certificate each delivery names in
//! `PAYPAL-CERT-URL`, and only under its `cert_url_prefixes`; against a local
//! service there is no PayPal to fetch it from. The load plays PayPal and
//! holds the key, so it serves the certificate too, on the URL's own host
//! and port: plain http on a loopback address (the provider then needs
//! `cert_url_prefixes = ["http://127.0.0.1:<port>/"]`). The file is checked
//! before the run — a certificate of `--private-key`'s key, valid now — so a
//! mistake is one line at start, not every delivery answered 401.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use bytes::Bytes;
use fencehook::providers::keys::CertificateInfo;
use fencehook::providers::paypal;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::{bad, ArgError};
use crate::tools::send::{Credentials, Psp};

/// The certificate to serve, and where.
#[derive(Debug, Clone)]
pub(super) struct CertFile {
    pub addr: SocketAddr,
    /// The path of `--cert-url`; any other path is a 404.
    path: String,
    pem: Bytes,
}

impl CertFile {
    /// Reads `file` and checks it against the signer of `psp` and its
    /// `--cert-url`, at unix time `now`.
    pub(super) fn read(file: &Path, psp: &Psp, now: i64) -> Result<CertFile, ArgError> {
        let url = psp.key(&paypal::CERT_URL).map_err(|_| {
            bad(
                "cert-url",
                "--serve-cert serves the certificate at --cert-url: give the URL (e.g. http://127.0.0.1:8099/certs/psp.crt)",
            )
        })?;
        let (addr, path) = listen_at(url).map_err(|e| bad("cert-url", format!("`{url}`: {e}")))?;
        let shown = file.display();
        let pem = std::fs::read(file).map_err(|e| bad("serve-cert", format!("{shown}: {e}")))?;
        let cert =
            CertificateInfo::parse(&pem).map_err(|e| bad("serve-cert", format!("{shown}: {e}")))?;
        let signer = psp.signer().map_err(|e| bad(e.flag, e.reason))?;
        if cert.key != signer.public_key() {
            return Err(bad(
                "serve-cert",
                format!("{shown} is not a certificate of --private-key's key"),
            ));
        }
        if !cert.is_valid_at(now) {
            return Err(bad(
                "serve-cert",
                format!("{shown} is outside its validity period"),
            ));
        }
        Ok(CertFile {
            addr,
            path,
            pem: Bytes::from(pem),
        })
    }

    /// Listens on the URL's address and serves the certificate until the
    /// returned server is dropped.
    pub(super) async fn serve(&self) -> std::io::Result<CertServer> {
        let listener = TcpListener::bind(self.addr).await?;
        let (path, pem) = (self.path.clone(), self.pem.clone());
        let task = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    // Out of file descriptors, say: the next accept may work.
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let (path, pem) = (path.clone(), pem.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let mut resp = hyper::Response::new(Full::new(Bytes::new()));
                        if req.uri().path() == path {
                            *resp.body_mut() = Full::new(pem.clone());
                        } else {
                            *resp.status_mut() = hyper::StatusCode::NOT_FOUND;
                        }
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(CertServer { task })
    }
}

/// The certificate being served; stops listening when dropped.
pub(super) struct CertServer {
    task: JoinHandle<()>,
}

impl Drop for CertServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The loopback address and the path of an `http://` URL with a port.
fn listen_at(url: &str) -> Result<(SocketAddr, String), String> {
    let uri: hyper::Uri = url.parse().map_err(|_| "not a URL".to_owned())?;
    if uri.scheme_str() != Some("http") {
        return Err("the load serves the certificate over plain http://".into());
    }
    let host = uri.host().unwrap_or("");
    let ip = if host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .map_err(|_| "the host is not an IP address or localhost".to_owned())?
    };
    if !ip.is_loopback() {
        return Err("not on a loopback address (127.0.0.0/8, ::1, localhost)".into());
    }
    let port = uri
        .port_u16()
        .ok_or("give the port to listen on (http://127.0.0.1:<port>/…)")?;
    Ok((SocketAddr::new(ip, port), uri.path().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_is_served_on_the_urls_loopback_host_and_port() {
        assert_eq!(
            listen_at("http://127.0.0.1:8099/v1/notifications/certs/CERT-1"),
            Ok((
                "127.0.0.1:8099".parse().unwrap(),
                "/v1/notifications/certs/CERT-1".to_owned()
            ))
        );
        assert_eq!(
            listen_at("http://localhost:8099/c").unwrap().0,
            "127.0.0.1:8099".parse().unwrap()
        );
        assert_eq!(
            listen_at("http://[::1]:8099/c").unwrap().0,
            "[::1]:8099".parse().unwrap()
        );
        for (url, why) in [
            ("https://127.0.0.1:8099/c", "http://"),
            ("http://api.paypal.com:80/c", "IP address"),
            ("http://10.0.0.1:8099/c", "loopback"),
            ("http://127.0.0.1/c", "port"),
            ("not a url", "URL"),
        ] {
            let err = listen_at(url).unwrap_err();
            assert!(err.contains(why), "{url}: {err}");
        }
    }
}
