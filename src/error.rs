//! The crate's error type. It knows nothing about HTTP: the one mapping to a
//! status lives in `http::respond`.

use crate::downstream::DownstreamError;
use crate::lease::LeaseError;
use crate::store::StoreError;

/// Why a delivery could not be brought to a durable outcome. Every variant is
/// retryable from the provider's side and is answered 503, never 2xx.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("lease backend unavailable")]
    Lease(#[from] LeaseError),
    #[error("database unavailable")]
    Store(#[from] StoreError),
    #[error("downstream call failed")]
    Downstream(#[from] DownstreamError),
}

impl Error {
    /// Short label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Lease(_) => "lease_backend",
            Error::Store(_) => "database",
            Error::Downstream(_) => "downstream",
        }
    }
}

/// `error: cause: cause …` — the whole chain on one line, for logs.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cur = c.source();
    }
    out
}
