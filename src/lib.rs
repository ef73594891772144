//! fencehook: a payment-webhook receiver that applies every payment exactly once.
//!
//! # Layout
//!
//! Data flows one way: HTTP edge → provider adapter → processor → lease +
//! store → answer. Each room below depends only on the rooms after it in this
//! list, except two pairs that lean on each other: [`console`] and [`http`]
//! (the admin route serves the console, which answers with the edge's `Body`
//! and JSON helper), [`config`] and [`db`] (`DATABASE_URL` is checked with
//! [`db::tls`]'s parser; the pool reads [`config::DbConfig`]).
//!
//! - [`app`]: `App::build(config)`, `port()`, `run_until_stopped(shutdown)`,
//!   and `Workers::build(config)` for `fencehook work`: one constructor
//!   wires the rooms both run on; nothing imports it.
//! - [`startup`]: how `serve` and `work` start (telemetry first, the
//!   settings validated and logged, the backends that do not answer said)
//!   and the start before the database (waiting for PostgreSQL with a
//!   backoff before migrating).
//! - [`http`]: accept loops ([`http::serve`]: connection caps, head limits,
//!   the drain bound), the webhook route, the admin route, the handlers'
//!   [`http::state::State`], the sampling of refusal log lines
//!   ([`http::log_sample`]), and **the** outcome → status/body mapping
//!   ([`http::answer`]).
//! - [`console`]: the operator console on the admin listener (`/console`):
//!   sign-in and roles, the pages (search, a payment's timeline, inbox events,
//!   refusals) as HTML or JSON, and the replays, which are the CLI's.
//! - [`reconcile`]: the PSP's record as the source of truth: a provider's
//!   events listed through its PSP's API and handed to [`delivery`] as
//!   webhooks of them would be (known, recovered, divergent), one runner
//!   per provider across instances, on a schedule in `serve` and `work`
//!   ([`store::reconcile`] owns its tables).
//! - [`delivery`]: what happens to a verified delivery's items, whoever
//!   verified them (the webhook handler; later, a PSP's events API):
//!   ignored, quarantined (a batch item that cannot be booked), a refund
//!   the PSP may have meant as a cancel decided by the ledger, stored for
//!   the inbox workers or booked now by the processor; and, for the webhook,
//!   a transmission bound to its body and confirmed with the PSP's API
//!   where its scheme's signature does not cover the body well.
//! - [`inbox`]: inbox mode (`FENCEHOOK_MODE=inbox`): a delivery's events
//!   stored in one statement at accept, then booked by workers (`serve`'s
//!   and `fencehook work`'s) through the processor, retried with backoff,
//!   pruned once done.
//! - [`history`]: the delivery history's writer: each answered delivery
//!   that reached the booking path handed to a bounded queue without
//!   waiting, written in batches by one task ([`store::history`] owns the
//!   table); a full queue drops and counts, never delays an answer.
//! - [`processor`]: the state machine of one event (fast path → lease →
//!   fenced claim → business step → fenced finalize → release), returning an
//!   [`processor::Outcome`].
//! - [`error`]: the processing error (lease, store or downstream), which
//!   `http::answer` maps to 503.
//! - [`health`]: readiness probes and the gauges sampled in the background.
//! - [`store`]: fenced writes returning outcome enums, SQLSTATE
//!   classification, migrations ([`store::migrate`]), the invariant
//!   checks of `fencehook audit` ([`store::audit`]), the drain figures
//!   of an inbox-mode `fencehook load` ([`store::drain`]), the PayPal
//!   transmission ids bound to their bodies ([`store::transmissions`]),
//!   the ledger as finance reads it ([`store::ledger`]), the erasure of
//!   stored bodies ([`store::erase`]), the delivery history
//!   ([`store::history`]) and one payments row as operators read it
//!   ([`store::record`]: `inspect` and the console). The write that takes its lease inside
//!   itself starts with the PostgreSQL lease backend's SQL fragment.
//! - [`lease`]: the lease facade and guard ([`lease::LeaseGuard`]), the
//!   heartbeat (`lease/heartbeat.rs`), the Redis backend with its Lua
//!   scripts ([`lease::redis`]; the master asked of Redis Sentinel in
//!   [`lease::sentinel`]) and the PostgreSQL backend (the owner of the
//!   `leases` table, whose SQL the store's inline write borrows).
//! - [`downstream`]: the optional business call that leaves the database.
//! - [`telemetry`]: the process's log lines and, when an OTLP endpoint is
//!   set, OpenTelemetry traces: the span list ([`telemetry::spans`]), W3C
//!   trace context in and out ([`telemetry::propagation`]), the export queue.
//! - [`metrics`]: one table of every metric (name, kind, labels, help:
//!   `metrics/table.rs`), label values as enums, the per-app registry
//!   derived from the table, and the figures the console's overview reads
//!   kept beside their series (`metrics/figures.rs`).
//! - [`config`]: settings (env + flags), defaults, cross-field validation;
//!   the traces' and the console's settings too ([`config::console`]).
//! - [`db`]: the PostgreSQL pool builder the store and the lease backend share,
//!   and every connection's TLS (`sslmode`, `sslrootcert`: [`db::tls`]).
//! - [`providers`]: one file per scheme, each a [`providers::Scheme`]:
//!   its settings (its own table of the providers file), signature check
//!   and payload mapping to a [`domain::CanonicalEvent`], the body its PSP
//!   expects, and the PSP's side the tools play (a delivery built and signed
//!   as the PSP does, with keys asked for by name); `providers/mod.rs` lists
//!   the schemes once. The providers file is read in `providers/file.rs`,
//!   each table for its scheme in [`providers::settings`]; fetching from a
//!   PSP (bounded in flight, time and size) is `providers/fetch.rs`, which
//!   PayPal's certificates and its REST API client
//!   ([`providers::paypal_api`]) use.
//! - [`outbound`]: the outgoing HTTP clients (the downstream call's, the
//!   PayPal certificate and API fetches', the OTLP exporter's), below the
//!   edge, the downstream call, the providers and telemetry.
//! - [`domain`]: the canonical event, its kinds and fingerprint, row
//!   statuses, the lifecycle rules; amounts in minor units and their
//!   currencies' exponents ([`domain::amount`]).
//! - [`report`]: the one-line cause chain for logs, below every room.
//!
//! The operator and demo tools (`send`, `load`, `check-config`, `migrate`,
//! `audit`'s printing and the load run's answers file, the inbox's
//! `inspect`, `events`, `replay` and `prune`, `export ledger` and `erase`)
//! are **not** in this library: they live under `src/tools/`,
//! a module tree of the `fencehook` binary (declared in `main.rs`), so no
//! service module can import them, nor uses their own dependencies
//! (`hdrhistogram`, `humantime`; the one binary links them).
//!
//! Test seams (`Hooks`, `App::build_with_hooks`, `LeaseGuard::abandon`, the
//! `fail` failpoints) exist only with the `test-support` feature.

#![forbid(unsafe_code)]

pub mod app;
pub mod config;
pub mod console;
pub mod db;
pub mod delivery;
pub mod domain;
pub mod downstream;
pub mod error;
pub mod health;
pub mod history;
pub mod http;
pub mod inbox;
pub mod lease;
pub mod metrics;
pub mod outbound;
pub mod processor;
pub mod providers;
pub mod reconcile;
pub mod report;
pub mod startup;
pub mod store;
pub mod telemetry;

#[cfg(test)]
mod tests {
    //! The layout above is a claim about the code; this keeps it true.

    use std::collections::{BTreeSet, HashMap};
    use std::path::{Path, PathBuf};

    const ROOT: &str = env!("CARGO_MANIFEST_DIR");

    /// The pairs the layout says lean on each other.
    const PAIRS: &[(&str, &str)] = &[("console", "http"), ("db", "config")];

    /// Every `.rs` file under `dir`.
    fn sources(dir: &Path) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                files.extend(sources(&path));
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
        files
    }

    /// A file's code without its comments and without its test module.
    fn code(text: &str) -> String {
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        text.lines()
            .map(|l| l.split("//").next().unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The rooms a room's code names, `crate::<room>` or in a `use
    /// crate::{…}` group.
    fn rooms_used(code: &str, rooms: &[String]) -> BTreeSet<String> {
        let mut used = BTreeSet::new();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find(';').unwrap_or(group.len())];
                group
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .filter_map(|p| p.split("::").next())
                    .collect()
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                vec![&rest[..end]]
            };
            used.extend(
                names
                    .into_iter()
                    .filter(|n| rooms.iter().any(|r| r == n))
                    .map(str::to_owned),
            );
        }
        used
    }

    #[test]
    fn every_room_uses_only_rooms_after_it_in_the_layout_but_the_named_pairs() {
        let lib = std::fs::read_to_string(format!("{ROOT}/src/lib.rs")).unwrap();
        let order: Vec<String> = lib
            .lines()
            .filter_map(|l| l.strip_prefix("//! - [`"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_owned)
            .collect();
        let declared: BTreeSet<String> = lib
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod "))
            .map(|l| l.trim_end_matches(';').to_owned())
            .collect();
        assert_eq!(
            order.iter().cloned().collect::<BTreeSet<_>>(),
            declared,
            "the layout names every room once"
        );
        let place: HashMap<&str, usize> = order
            .iter()
            .enumerate()
            .map(|(i, r)| (r.as_str(), i))
            .collect();
        let mut back = Vec::new();
        let src = Path::new(ROOT).join("src");
        for file in sources(&src) {
            let relative = file.strip_prefix(&src).unwrap();
            let first = relative.components().next().unwrap().as_os_str();
            let room = first.to_str().unwrap().trim_end_matches(".rs");
            let Some(&here) = place.get(room) else {
                continue; // lib.rs, main.rs, the tools
            };
            let text = std::fs::read_to_string(&file).unwrap();
            for used in rooms_used(&code(&text), &order) {
                let paired = PAIRS.contains(&(room, used.as_str()));
                if used != room && place[used.as_str()] < here && !paired {
                    back.push(format!("{} uses {used}", relative.display()));
                }
            }
        }
        assert!(
            back.is_empty(),
            "arrows back up the layout of src/lib.rs:\n{}",
            back.join("\n")
        );
    }
}
