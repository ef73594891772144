//! The tools the `fencehook` binary carries beside the service: they play a
//! PSP (`send`, `load`) or check what the service did (`audit`). This module
//! tree belongs to the binary, not to the library: the service cannot import
//! it, and its dependencies (`rand`, `hdrhistogram`, `humantime`,
//! `httpdate`) are used only here.

pub mod answers;
pub mod audit;
pub mod deliveries;
pub mod load;
pub mod send;
