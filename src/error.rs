//! The processing error. It knows nothing about HTTP: `http::answer` maps
//! every variant to 503 (never a 2xx, never a duplicate).
//!
//! Like every error type in the crate, it prints only its own message in
//! `Display` and returns its cause from `source()`; [`crate::report::chain`]
//! joins the two for a log line.

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
