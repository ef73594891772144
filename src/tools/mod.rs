//! The tools the `fencehook` binary carries beside the service: they play a
//! PSP (`send`, `load`), check what the service did (`audit`), check its
//! settings (`check-config`) or prepare its database (`migrate`), or let an
//! operator look at and act on the inbox (`inspect`, `replay`, `events`,
//! `prune`), or serve finance and privacy (`export ledger`, `erase`). This module
//! tree belongs to the binary, not to the library: the service cannot import
//! it, and its own dependencies (`hdrhistogram`, `humantime`) are used only here.

pub mod answers;
pub mod audit;
pub mod check_config;
pub mod finance;
pub mod load;
pub mod migrate;
pub mod ops;
pub mod reconcile;
pub mod send;
