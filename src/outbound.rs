//! The outgoing HTTP/1 clients: the downstream call's (`http://`, or
//! `https://` only, with its own roots: [`https_only`]), the
//! providers' fetches from their PSPs' (`providers/fetch.rs`) and the OTLP
//! exporter's (`https://` or `http://`, over rustls), and the tools that
//! play a PSP.
//!
//! A room of its own below the HTTP edge, the downstream call, the providers
//! and telemetry, so none of them reaches into another to open a connection.
//! No client here follows a redirect (hyper's legacy client never does).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client that speaks TLS to `https://` URLs and plain HTTP to `http://`.
pub type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A pooled, keep-alive HTTP/1 client for plain `http://` URLs, with
/// `TCP_NODELAY` and a bound on opening a connection.
pub fn new(connect_timeout: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    Client::builder(TokioExecutor::new()).build(connector)
}

/// The same client for `https://` URLs too: rustls with ring and Mozilla's
/// roots, so no OpenSSL and no CA bundle on the host. The error is a
/// sentence for the caller to prefix with the setting it serves.
pub fn https(connect_timeout: Duration) -> Result<HttpsClient, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(Arc::new(rustls::crypto::ring::default_provider()))
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

/// A client for one `https://` service that must prove who it is: TLS
/// only (an `http://` URL is refused, never sent in plaintext), verified
/// against `roots` (a private CA) or, without them, Mozilla's roots
/// compiled in. A certificate that does not verify fails the request.
pub fn https_only(
    connect_timeout: Duration,
    roots: Option<Arc<rustls::RootCertStore>>,
) -> Result<HttpsClient, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match roots {
        Some(roots) => {
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("cannot set up TLS: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            builder.with_tls_config(config)
        }
        None => builder
            .with_provider_and_webpki_roots(provider)
            .map_err(|e| format!("cannot set up TLS: {e}"))?,
    };
    let https = builder.https_only().enable_http1().wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(https))
}
