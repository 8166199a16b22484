//! Profiled runs.
use crate::error::CliError;
use kiln_device::{Buffer, Kernel};
use std::path::Path;
pub fn run_traced(_k: &Kernel, _b: &[&Buffer], _v: &[i64], _p: &Path) -> Result<(), CliError> {
    Err(CliError::Mismatch("trace".into()))
}
