//! kiln-runtime: execution plans.

pub mod hazard;
