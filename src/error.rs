//! The processing error. It knows nothing about HTTP: `http::answer` maps
//! every variant to 503 (never a 2xx, never a duplicate).
//!
//! Error types here and in the other modules print only their own message in
//! `Display` and return their cause from `source()`; [`chain`] joins the two
//! for a log line, so no cause is printed twice.

use crate::downstream::DownstreamError;
use crate::lease::LeaseError;
use crate::store::StoreError;

/// Why a delivery could not be brought to a durable outcome. Every variant is
/// retryable from the provider's side.
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
    /// Short label for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Lease(_) => "lease_backend",
            Error::Store(_) => "database",
            Error::Downstream(_) => "downstream",
        }
    }
}

/// `error: cause: cause …` — the whole chain on one line, for logs.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cur = c.source();
    }
    out
}
