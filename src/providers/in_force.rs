//! The providers in force: read at start, replaced whole when SIGHUP
//! re-reads the providers file. One set, shared by whoever needs the
//! current providers — the webhook handlers and the scheduled
//! reconciliation — so a secret or an `api_key` added and reloaded is in
//! force for both at once.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::Provider;

type ByName = Arc<HashMap<String, Arc<Provider>>>;

/// A handle on the providers in force; its clones see the same set.
#[derive(Clone, Default)]
pub struct InForce(Arc<RwLock<ByName>>);

impl InForce {
    pub fn new(providers: Vec<Provider>) -> InForce {
        InForce(Arc::new(RwLock::new(by_name(providers))))
    }

    /// The provider named `name` (a caller keeps the one it looked up,
    /// whatever a reload does meanwhile).
    pub fn get(&self, name: &str) -> Option<Arc<Provider>> {
        self.read().get(name).cloned()
    }

    /// Every provider in force, by name.
    pub fn all(&self) -> Vec<Arc<Provider>> {
        let mut all: Vec<_> = self.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Replaces every provider at once.
    pub fn replace(&self, providers: Vec<Provider>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = by_name(providers);
    }

    fn read(&self) -> ByName {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn by_name(providers: Vec<Provider>) -> ByName {
    Arc::new(
        providers
            .into_iter()
            .map(|p| (p.name.clone(), Arc::new(p)))
            .collect(),
    )
}
