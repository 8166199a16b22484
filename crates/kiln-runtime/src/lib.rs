//! kiln-runtime: execution plans.

pub mod hazard;
pub mod schedule;
