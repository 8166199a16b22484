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
//! Backends come from kiln-device's registry (plus the suite's own, see [`OWN`]) and
//! are opened at run time ([`backend`]). Each has a [`Conformance`] entry, which its backend
//! crate exports: its peer and the tests it does not support, with the reason. A test that cannot run (its backend is absent, or
//! unsupported there) writes `SKIPPED <test>: <reason>` to the test output (shown beside its
//! `ok`), unless `KILN_REQUIRE` (a comma list such as `cpu,opencl`) names the backend: then
//! an absent backend fails the test.
//!
//! The crate sits at the top of kiln next to the command line (see `docs/architecture.md`):
//! it depends on kiln-backends (whose features choose the backends it runs on) and on
//! `kiln-runtime`, and nothing that ships depends on it. Beside the [`suite`] it holds the
//! [`reference`](mod@reference) semantics every backend must reproduce (plain Rust),
//! [`host`] values of every dtype with their buffer upload and download, and the small
//! [`kernels`] several bodies share, and [`races`](mod@races), the check that a kernel's result
//! does not depend on the order its work items run in (the differential tests compare only
//! such kernels). A backend is checked by running the bodies on its
//! device:
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_conformance::suite;
//! use kiln_device::kiln_ir::Scalar;
//! let device = kiln_conformance::open("cpu")?; // once per process, shared by every test
//! suite::buffers::views(&device)?; // views see and change the window of their base
//! suite::programs::alu(&device, Scalar::F32)?; // every f32 op against the Rust reference
//! assert!(kiln_conformance::unsupported("cpu", "views").is_none());
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

pub use kiln_device::Conformance;
use kiln_device::kiln_ir::IrError;
use kiln_device::{Device, DynQueueFactory, Error};

pub mod cuda_compile;
pub mod host;
pub mod kernels;
pub mod races;
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

/// The suite's own devices, beside the registry's: `cpu-guarded` is the CPU device over
/// [`kiln_cpu::GuardPageAllocator`] (every contract again, with buffers that fault at the
/// first byte past their end); `cuda-compile` is the CPU device whose compiler also compiles
/// every kernel to PTX and an `sm_90` cubin ([`cuda_compile`]): the CUDA toolchain checked on
/// every conformance kernel, no GPU needed. Each runs when this build registers the backends
/// it is made of.
pub const OWN: &[Conformance] = &[
    Conformance { name: "cpu-guarded", peer: "cpu", unsupported: &[kiln_cpu::SAME_DEVICE_PEER], pair: None },
    Conformance { name: "cuda-compile", peer: "opencl", unsupported: &[], pair: None },
];

/// Every backend the suite runs on in this build, with its peer and the tests it does not
/// support: each registry backend's own entry (its driver's, listed by kiln-backends) and the
/// suite's [`OWN`]. Each needs one line in `tests/conformance.rs`'s `backends!` (a test checks
/// that every registered backend has one).
pub fn registrations() -> impl Iterator<Item = &'static Conformance> {
    kiln_backends::conformance().chain(OWN)
}

/// The registration of backend `name` (lower case).
pub fn registration(name: &str) -> Option<&'static Conformance> {
    registrations().find(|r| r.name == name)
}

/// Why backend `name` does not support `test`, when its registration lists it.
pub fn unsupported(name: &str, test: &str) -> Option<&'static str> {
    registration(name)?.unsupported.iter().find(|(t, _)| *t == test).map(|(_, why)| *why)
}

/// Registers every backend this build has with kiln-device's registry. Idempotent.
pub fn register_backends() {
    kiln_backends::register_all();
}

/// Whether the backends of the suite's own device `name` are registered: the CPU, and for
/// `cuda-compile` CUDA as well.
fn own_present(name: &str) -> bool {
    let cpu = kiln_device::find_backend(kiln_cpu::BACKEND).is_some();
    match name {
        "cuda-compile" => cpu && kiln_device::find_backend(kiln_cuda::BACKEND).is_some(),
        _ => cpu,
    }
}

/// Opens a backend's first device, once per process: every later call returns the same
/// device (or the same error), so tests running in parallel share one device and its
/// kernel cache. A registry backend is opened through [`kiln_device::open_device`].
///
/// # Errors
/// [`Error::Invalid`] for a name the suite does not know ([`registrations`]);
/// [`Error::Unavailable`] for one this build leaves out; the errors of opening it.
pub fn open(name: &str) -> Result<Arc<Device>, Error> {
    type Opened = HashMap<String, Result<Arc<Device>, Error>>;
    static OPENED: OnceLock<Mutex<Opened>> = OnceLock::new();
    let mut opened = OPENED.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = opened.get(name) {
        return r.clone();
    }
    register_backends();
    let own = OWN.iter().any(|r| r.name == name);
    let r = match name {
        _ if own && !own_present(name) => {
            Err(Error::Unavailable(format!("this build of kiln-conformance leaves out a backend `{name}` is made of")))
        }
        "cpu-guarded" => kiln_cpu::GuardPageAllocator::new().and_then(|a| kiln_cpu::open_with_allocator(Arc::new(a))),
        "cuda-compile" => cuda_compile::open(),
        _ if let Some((backend, pair)) = registration(name).and_then(|r| r.pair) => {
            kiln_device::open_device(backend).and_then(|d| Ok(Arc::new(d.with_default_compiler(pair)?)))
        }
        _ if registration(name).is_some() && kiln_device::find_backend(name).is_some() => {
            kiln_device::open_device(name)
        }
        _ if kiln_backends::left_out().iter().any(|l| l.feature == name) => Err(Error::Unavailable(format!(
            "this build of kiln-conformance leaves out the `{name}` backend (feature kiln-backends/{name})"
        ))),
        _ => Err(Error::Invalid(format!("unknown backend `{name}` (known: {})", known().join(", ")))),
    };
    opened.insert(name.to_string(), r.clone());
    r
}

/// Every backend name the suite knows in this build: [`registrations`]'s, lower case.
pub fn known() -> Vec<&'static str> {
    registrations().map(|r| r.name).collect()
}

/// The device of backend `name`, or `None` after reporting `test` as skipped with the
/// reason ([`kiln_device::testing::skip_unless_required`]) when the backend cannot be opened.
///
/// # Panics
/// When the backend cannot be opened and `KILN_REQUIRE` names it: this is the test
/// harness's entry point, and a required backend that is missing fails the test.
pub fn backend(name: &str, test: &str) -> Option<Arc<Device>> {
    kiln_device::testing::or_skip(name, test, open(name))
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
        assert!(registration("tpu").is_none());
        assert!(matches!(open("tpu"), Err(Error::Invalid(_))));
    }

    #[test]
    fn unsupported_tests_have_reasons() {
        let (test, why) = kiln_cpu::SAME_DEVICE_PEER;
        assert_eq!(unsupported("cpu-guarded", test), Some(why));
        assert_eq!(unsupported("cpu", test), None);
        assert!(registrations().flat_map(|r| r.unsupported).all(|(_, why)| !why.is_empty()));
    }

    #[test]
    fn expect_err_checks_kind() {
        let e: Result<(), Error> = Err(Error::Buffer("b".into()));
        assert!(expect_err("x", e.clone(), |e| matches!(e, Error::Buffer(_))).is_ok());
        assert!(matches!(expect_err("x", e, |e| matches!(e, Error::Launch(_))), Err(Failure::Violation(_))));
        assert!(matches!(expect_err("x", Ok::<i32, Error>(1), |_| true), Err(Failure::Violation(_))));
    }
}
