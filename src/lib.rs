//! fencehook: a payment-webhook receiver that applies every payment exactly once.
//!
//! # Layout
//!
//! Data flows one way: HTTP edge → provider adapter → processor → lease + store → answer.
//!
//! - [`app`]: `App::build(config)`, `port()`, `run_until_stopped(shutdown)`.
//! - [`config`]: settings (env + flags), defaults, cross-field validation.
//! - [`http`]: hyper accept loops, routing, the one outcome/error → status mapping.
//! - [`providers`]: signature verification and payload mapping to a [`providers::CanonicalEvent`].
//! - [`processor`]: fast path → lease → fenced transaction → release; returns an [`processor::Outcome`].
//! - [`lease`]: the Redis lease (Lua scripts), its heartbeat and guard.
//! - [`store`]: PostgreSQL pool, SQLSTATE classification, fenced writes, migrations, audit.
//! - [`downstream`]: the optional business call that leaves the database.
//! - [`metrics`]: metric names and the per-app registry.
//! - [`cli`]: the `send` and `audit` subcommands.
//! - [`load`]: the `load` subcommand, a PSP with duplicates driving one or more instances.

#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod config;
pub mod downstream;
pub mod error;
pub mod http;
pub mod lease;
pub mod load;
pub mod metrics;
pub mod processor;
pub mod providers;
pub mod store;
