//! PayPal's signing certificates, kept per provider: what a stranger naming
//! certificate URLs can make the cache hold is bounded (the tiers below);
//! `paypal.rs` fetches into it and verifies with what it holds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::keys::CertificateInfo;
use super::scheme::Reject;

/// Certificates kept per tier (verified, unverified) and provider; PayPal
/// rotates its certificate yearly.
pub const CACHE_ENTRIES: usize = 16;
/// Failed URLs remembered (oldest out first).
pub const NEGATIVE_ENTRIES: usize = 256;

/// One URL's certificate, fetched once however many deliveries wait for it.
pub(super) type Cell = Arc<OnceCell<Arc<CertificateInfo>>>;

/// The certificates of one provider, by URL.
///
/// Anyone may name a URL under the prefixes, signed or not, so what a
/// stranger's URL can cost is bounded: at most `MAX_CONCURRENT_FETCHES`
/// fetches at once (a delivery that finds none free is a 503, PayPal
/// retries), one fetch per URL however many deliveries wait for it (the
/// cell), a failure remembered for `NEGATIVE_TTL` (at most
/// [`NEGATIVE_ENTRIES`] URLs), and two tiers of [`CACHE_ENTRIES`] each: a
/// certificate is *unverified* until a signature verified with it, and a new
/// URL only ever pushes out the oldest unverified one, so a flood of
/// strangers' URLs cannot evict PayPal's certificate.
#[derive(Default)]
pub(super) struct CertCache {
    pub(super) entries: Mutex<Entries>,
}

#[derive(Default)]
pub(super) struct Entries {
    pub(super) cells: HashMap<String, (Cell, Tier)>,
    /// URLs of each tier, oldest first.
    pub(super) unverified: VecDeque<String>,
    pub(super) verified: VecDeque<String>,
    /// URLs whose fetch failed: until when, and the answer meanwhile.
    pub(super) failed: HashMap<String, (Instant, Reject)>,
    pub(super) failed_order: VecDeque<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tier {
    Unverified,
    Verified,
}

impl CertCache {
    /// The cell of `url`, made (in the unverified tier, dropping the oldest
    /// unverified beyond the bound) when new; or the remembered failure.
    pub(super) fn cell(&self, url: &str, now: Instant) -> Result<Cell, Reject> {
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = &mut *guard;
        if let Some((cell, _)) = e.cells.get(url) {
            return Ok(cell.clone());
        }
        if let Some((until, reject)) = e.failed.get(url) {
            if *until > now {
                return Err(reject.clone());
            }
            e.failed.remove(url);
            e.failed_order.retain(|u| u != url);
        }
        while e.unverified.len() >= CACHE_ENTRIES {
            let Some(oldest) = e.unverified.pop_front() else {
                break;
            };
            e.cells.remove(&oldest);
        }
        let cell = Cell::default();
        e.cells
            .insert(url.to_owned(), (cell.clone(), Tier::Unverified));
        e.unverified.push_back(url.to_owned());
        Ok(cell)
    }

    /// The failure remembered for `url`, if any is still in force.
    pub(super) fn remembered(&self, url: &str, now: Instant) -> Option<Reject> {
        let guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        guard
            .failed
            .get(url)
            .filter(|(until, _)| *until > now)
            .map(|(_, reject)| reject.clone())
    }

    /// A signature verified with `url`'s certificate: it moves to the
    /// verified tier, where only another verified certificate can push it out.
    pub(super) fn mark_verified(&self, url: &str, cell: &Cell) {
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = &mut *guard;
        match e.cells.get_mut(url) {
            Some((c, tier)) if Arc::ptr_eq(c, cell) && *tier == Tier::Unverified => {
                *tier = Tier::Verified;
            }
            _ => return,
        }
        e.unverified.retain(|u| u != url);
        while e.verified.len() >= CACHE_ENTRIES {
            let Some(oldest) = e.verified.pop_front() else {
                break;
            };
            e.cells.remove(&oldest);
        }
        e.verified.push_back(url.to_owned());
    }

    /// Drops `url`'s cell if the fetch into it failed, remembering why
    /// (`Some`) until `until`.
    pub(super) fn forget_failed(&self, url: &str, cell: &Cell, failure: Option<(Instant, Reject)>) {
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = &mut *guard;
        let ours = e
            .cells
            .get(url)
            .is_some_and(|(c, _)| Arc::ptr_eq(c, cell) && !c.initialized());
        if !ours {
            return;
        }
        e.cells.remove(url);
        e.unverified.retain(|u| u != url);
        if let Some(failure) = failure {
            while e.failed.len() >= NEGATIVE_ENTRIES {
                let Some(oldest) = e.failed_order.pop_front() else {
                    break;
                };
                e.failed.remove(&oldest);
            }
            if e.failed.insert(url.to_owned(), failure).is_none() {
                e.failed_order.push_back(url.to_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strangers_urls_push_out_only_unverified_certificates_and_failures_are_bounded() {
        let cache = CertCache::default();
        let now = Instant::now();
        let ttl = std::time::Duration::from_secs(60);
        let verified = cache.cell("paypal", now).unwrap();
        cache.mark_verified("paypal", &verified);
        for i in 0..CACHE_ENTRIES * 3 {
            cache.cell(&format!("u{i}"), now).unwrap();
        }
        {
            let e = cache.entries.lock().unwrap();
            assert_eq!(e.unverified.len(), CACHE_ENTRIES);
            assert_eq!(e.cells.len(), CACHE_ENTRIES + 1);
            assert!(e.cells.contains_key("paypal"), "the verified one stays");
            assert!(!e.cells.contains_key("u0"), "oldest unverified out first");
        }
        // Verified certificates push out only the oldest verified one.
        for i in 0..CACHE_ENTRIES {
            let url = format!("v{i}");
            let cell = cache.cell(&url, now).unwrap();
            cache.mark_verified(&url, &cell);
        }
        assert!(!cache.entries.lock().unwrap().cells.contains_key("paypal"));
        // Failures: remembered until their time, at most NEGATIVE_ENTRIES.
        let reject = Reject::Unavailable("down".into());
        for i in 0..NEGATIVE_ENTRIES + 5 {
            let url = format!("f{i}");
            let cell = cache.cell(&url, now).unwrap();
            let until = now + ttl;
            cache.forget_failed(&url, &cell, Some((until, reject.clone())));
        }
        assert_eq!(cache.entries.lock().unwrap().failed.len(), NEGATIVE_ENTRIES);
        let last = format!("f{}", NEGATIVE_ENTRIES + 4);
        assert_eq!(cache.cell(&last, now).err(), Some(reject));
        assert!(cache.cell(&last, now + ttl).is_ok(), "then tried again");
        assert!(
            cache.cell("f0", now).is_ok(),
            "the oldest failure forgotten"
        );
    }
}
