//! The one outgoing HTTP/1 client builder (downstream calls, and the tools
//! that play a PSP).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A pooled, keep-alive HTTP/1 client for plain `http://` URLs, with
/// `TCP_NODELAY` and a bound on opening a connection.
pub fn new(connect_timeout: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    Client::builder(TokioExecutor::new()).build(connector)
}
