//! fencehook: a payment-webhook receiver that applies every payment exactly once.
//!
//! # Layout
//!
//! Data flows one way: HTTP edge → provider adapter → processor → lease +
//! store → answer. Each room below depends only on the rooms after it in this
//! list (and on [`domain`], [`config`], [`metrics`], [`error`]):
//!
//! - [`app`]: `App::build(config)`, `port()`, `run_until_stopped(shutdown)`:
//!   wires the rooms together; nothing imports it.
//! - [`http`]: accept loops ([`http::serve`]: connection caps, head limits,
//!   the drain bound), the webhook route, the admin route, the handlers'
//!   [`http::state::State`], the sampling of refusal log lines
//!   ([`http::log_sample`]), and **the** outcome → status/body mapping
//!   ([`http::answer`]).
//! - [`console`]: the operator console on the admin listener (`/console`):
//!   sign-in and roles, the pages (search, a payment's timeline, inbox events,
//!   refusals) as HTML or JSON, and the replays, which are the CLI's.
//! - [`providers`]: one file per scheme, each a [`providers::Scheme`]:
//!   its settings, signature check and payload mapping to a
//!   [`domain::CanonicalEvent`], the body its PSP expects, and the PSP's
//!   side the tools play (a delivery built and signed as the PSP does);
//!   `providers/mod.rs` lists the schemes once. The providers file is read
//!   in `providers/file.rs`; PayPal's optional fetch-to-confirm API client
//!   is `providers/paypal_api.rs`.
//! - [`processor`]: the state machine of one event (fast path → lease →
//!   fenced claim → business step → fenced finalize → release), returning an
//!   [`processor::Outcome`].
//! - [`lease`]: the lease facade and guard ([`lease::LeaseGuard`]), the
//!   heartbeat (`lease/heartbeat.rs`), the Redis backend with its Lua
//!   scripts ([`lease::redis`]; the master asked of Redis Sentinel in
//!   [`lease::sentinel`]) and the PostgreSQL backend.
//! - [`startup`]: the start before the database (waiting for PostgreSQL
//!   with a backoff before migrating).
//! - [`store`]: fenced writes returning outcome enums, SQLSTATE
//!   classification, migrations ([`store::migrate`]), the invariant
//!   checks of `fencehook audit` ([`store::audit`]), the drain figures
//!   of an inbox-mode `fencehook load` ([`store::drain`]) and the PayPal
//!   transmission ids bound to their bodies ([`store::transmissions`]).
//! - [`downstream`]: the optional business call that leaves the database.
//! - [`health`]: readiness probes and the gauges sampled in the background.
//! - [`db`]: the PostgreSQL pool builder the store and the lease backend share,
//!   and every connection's TLS (`sslmode`, `sslrootcert`: [`db::tls`]).
//! - [`domain`]: the canonical event, its kinds and fingerprint, row statuses.
//! - [`config`]: settings (env + flags), defaults, cross-field validation.
//! - [`metrics`]: one table of every metric (name, kind, labels, help:
//!   `metrics/table.rs`), label values as enums, the per-app registry
//!   derived from the table.
//! - [`telemetry`]: the process's log lines and, when an OTLP endpoint is
//!   set, OpenTelemetry traces: the span list ([`telemetry::spans`]), W3C
//!   trace context in and out ([`telemetry::propagation`]), the export queue.
//! - [`error`]: the processing error and the one-line cause chain for logs.
//!
//! The operator and demo tools (`send`, `load`, `audit`'s printing and its
//! answers file) are **not** in this library: they live under `src/tools/`,
//! a module tree of the `fencehook` binary (declared in `main.rs`), so no
//! service module can import them and their dependencies (`hdrhistogram`,
//! `humantime`) never reach the service.
//!
//! Test seams (`Hooks`, `App::build_with_hooks`, `LeaseGuard::abandon`, the
//! `fail` failpoints) exist only with the `test-support` feature.

#![forbid(unsafe_code)]

pub mod app;
pub mod config;
pub mod console;
pub mod db;
pub mod domain;
pub mod downstream;
pub mod error;
pub mod health;
pub mod http;
pub mod inbox;
pub mod lease;
pub mod metrics;
pub mod processor;
pub mod providers;
pub mod startup;
pub mod store;
pub mod telemetry;
