//! The one-line cause chain for logs and start-up refusals.
//!
//! Error types in every module print only their own message in `Display` and
//! return their cause from `source()`; [`chain`] joins the two for a log line,
//! so no cause is printed twice. It sits below every room so that any of them
//! can log an error without importing [`crate::error`], which names the lease,
//! the store and the downstream call.

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
