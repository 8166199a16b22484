//! kiln-conformance: one suite of behaviour tests, written once and run on every backend.
//!
//! As IREE's HAL keeps its drivers honest with one conformance suite, kiln states the
//! contracts of `kiln-device` (signals, queues, buffers, programs, errors) and of
//! `kiln-runtime` (execution plans) as test bodies that take a [`Device`] and nothing else
//! backend-specific. `tests/conformance.rs` instantiates every body for every backend with
//! one macro line per backend.
//!
//! A test body is a `pub fn(&Arc<Device>) -> Outcome` in [`suite`] (cross-device bodies also
//! take a peer device). It returns [`Failure::Violation`] when the backend breaks a contract
//! and [`Failure::Api`] when a call that must succeed fails; it never panics on a backend's
//! misbehaviour, so a caller (a test harness, a `kiln conformance` command) decides how to
//! report it.
//!
//! Backends are found at run time ([`backend`]): a backend that cannot be opened is skipped
//! with its reason, unless `KILN_REQUIRE` (a comma list such as `cpu,opencl`) names it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use kiln_device::kiln_ir::{DeviceSpec, IrError};
use kiln_device::{Device, DynQueueFactory, Error};

#[cfg(all(feature = "cpu", feature = "cuda"))]
pub mod cuda_compile;
pub mod host;
pub mod kernels;
pub mod reference;
pub mod suite;

/// Why a conformance check did not pass.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Failure {
    /// An API call that the contract says must succeed returned an error.
    #[error("unexpected error: {0}")]
    Api(#[from] Error),
    /// The backend broke a contract: a wrong result, a missing error, a wrong error.
    #[error("contract violation: {0}")]
    Violation(String),
}

impl From<IrError> for Failure {
    fn from(e: IrError) -> Self {
        Failure::Api(Error::Ir(e))
    }
}

/// The result of one test body.
pub type Outcome = Result<(), Failure>;

/// Returns a [`Failure::Violation`] with the formatted message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::Failure::Violation(format!($($fmt)+)));
        }
    };
}

/// Checks that `result` is an error accepted by `matches` and returns it; an `Ok` or another
/// error is a violation that names `what` was being tried.
pub fn expect_err<T: fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    matches: impl FnOnce(&Error) -> bool,
) -> Result<Error, Failure> {
    match result {
        Ok(v) => Err(Failure::Violation(format!("{what}: expected an error, got Ok({v:?})"))),
        Err(e) if matches(&e) => Ok(e),
        Err(e) => Err(Failure::Violation(format!("{what}: got the wrong error: {e:?}"))),
    }
}

/// Collects mismatches of a long comparison and reports the first few with a total count.
#[derive(Debug, Default)]
pub struct Mismatches {
    lines: Vec<String>,
    count: usize,
}

impl Mismatches {
    const SHOWN: usize = 12;

    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, line: String) {
        self.count += 1;
        if self.lines.len() < Self::SHOWN {
            self.lines.push(line);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// `Ok` when nothing mismatched, else a violation headed by `what`.
    pub fn finish(self, what: &str) -> Outcome {
        if self.count == 0 {
            return Ok(());
        }
        let more = self.count.saturating_sub(self.lines.len());
        let tail = if more > 0 { format!("\n  ... and {more} more") } else { String::new() };
        Err(Failure::Violation(format!("{what}: {} mismatch(es):\n  {}{tail}", self.count, self.lines.join("\n  "))))
    }
}

/// The environment variable naming the backends that must be present (`cpu,opencl`).
pub const REQUIRE_ENV: &str = "KILN_REQUIRE";

/// The backends this suite knows, by the lower-case name used in `KILN_REQUIRE`.
/// `cpu-guarded` is the CPU device over [`kiln_cpu::GuardPageAllocator`]: every contract
/// again, with buffers that fault at the first byte past their end. `cuda-compile` is the
/// CPU device whose compiler also compiles every kernel to PTX and an `sm_90` cubin
/// ([`cuda_compile`]): the CUDA toolchain checked on every conformance kernel, no GPU needed.
pub const BACKENDS: &[&str] = &["cpu", "cpu-guarded", "opencl", "cuda", "cuda-compile"];

/// The device a backend name stands for in this suite (its first device).
pub fn spec_of(name: &str) -> Option<DeviceSpec> {
    match name {
        "cpu" | "cpu-guarded" | "cuda-compile" => Some(DeviceSpec::new("CPU", 0)),
        "opencl" => Some(DeviceSpec::new("OPENCL", 0)),
        "cuda" => Some(DeviceSpec::new("CUDA", 0)),
        _ => None,
    }
}

/// Opens a backend's first device, once per process: every later call returns the same
/// device (or the same error), so tests running in parallel share one device and its
/// kernel cache.
pub fn open(name: &str) -> Result<Arc<Device>, Error> {
    type Opened = HashMap<String, Result<Arc<Device>, Error>>;
    static OPENED: OnceLock<Mutex<Opened>> = OnceLock::new();
    let mut opened = OPENED.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = opened.get(name) {
        return r.clone();
    }
    let r = match spec_of(name) {
        #[cfg(feature = "cpu")]
        Some(DeviceSpec::new("CPU", 0)) if name == "cpu-guarded" => {
            kiln_cpu::GuardPageAllocator::new().and_then(|a| kiln_cpu::open_with_allocator(Arc::new(a)))
        }
        #[cfg(all(feature = "cpu", feature = "cuda"))]
        Some(DeviceSpec::new("CPU", 0)) if name == "cuda-compile" => cuda_compile::open(),
        #[cfg(feature = "cpu")]
        Some(spec @ DeviceSpec::new("CPU", 0)) if name != "cuda-compile" => kiln_cpu::open(&spec),
        #[cfg(feature = "opencl")]
        Some(spec @ DeviceSpec::OpenCl { .. }) => kiln_opencl::open(&spec),
        #[cfg(feature = "cuda")]
        Some(spec @ DeviceSpec::Cuda { .. }) => kiln_cuda::open(&spec),
        Some(_) => Err(Error::Unavailable(format!("this build leaves out the `{name}` feature of kiln-conformance"))),
        None => Err(Error::Invalid(format!("unknown backend `{name}` (known: {})", BACKENDS.join(", ")))),
    };
    opened.insert(name.to_string(), r.clone());
    r
}

/// Whether `KILN_REQUIRE` names `name` (case-insensitive, comma separated).
pub fn required(name: &str) -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v.split(',').any(|item| item.trim().eq_ignore_ascii_case(name)))
}

/// The device of backend `name`, or `None` after printing `skipped <name>: <reason>` when
/// it cannot be opened.
///
/// # Panics
/// When the backend cannot be opened and `KILN_REQUIRE` names it: this is the test
/// harness's entry point, and a required backend that is missing fails the test.
pub fn backend(name: &str) -> Option<Arc<Device>> {
    match open(name) {
        Ok(d) => Some(d),
        Err(e) if required(name) => panic!("{REQUIRE_ENV} names `{name}` but it is unavailable: {e}"),
        Err(e) => {
            println!("skipped {name}: {e}");
            None
        }
    }
}

/// The queue factory of `dev`; a device without one fails the queue, signal and plan
/// contracts (every kiln backend has hardware queues).
pub fn queues(dev: &Device) -> Result<Arc<dyn DynQueueFactory>, Failure> {
    dev.queues().ok_or_else(|| {
        Failure::Violation(format!(
            "device {} has no queue factory (Device::queues is None): the backend must build one in \
             its DeviceParts",
            dev.spec()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatches_report_the_first_few_and_a_count() {
        let mut m = Mismatches::new();
        assert!(m.is_empty());
        for i in 0..20 {
            m.push(format!("lane {i}"));
        }
        let Err(Failure::Violation(msg)) = m.finish("x") else { panic!("expected a violation") };
        assert!(msg.starts_with("x: 20 mismatch(es)"), "{msg}");
        assert!(msg.contains("lane 11") && !msg.contains("lane 12") && msg.contains("8 more"), "{msg}");
        assert!(Mismatches::new().finish("y").is_ok());
    }

    #[test]
    fn unknown_backends_are_errors_not_panics() {
        assert!(spec_of("tpu").is_none());
        assert!(matches!(open("tpu"), Err(Error::Invalid(_))));
    }

    #[test]
    fn expect_err_checks_kind() {
        let e: Result<(), Error> = Err(Error::Buffer("b".into()));
        assert!(expect_err("x", e.clone(), |e| matches!(e, Error::Buffer(_))).is_ok());
        assert!(matches!(expect_err("x", e, |e| matches!(e, Error::Launch(_))), Err(Failure::Violation(_))));
        assert!(matches!(expect_err("x", Ok::<i32, Error>(1), |_| true), Err(Failure::Violation(_))));
    }
}
