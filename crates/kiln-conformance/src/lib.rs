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
//! Backends come from kiln-device's registry (plus the suite's own, see [`REGISTRATIONS`]) and
//! are opened at run time ([`backend`]). Each has a [`Registration`]: its peer and the tests
//! it does not support, with the reason. A test that cannot run (its backend is absent, or
//! unsupported there) writes `SKIPPED <test>: <reason>` to the test output (shown beside its
//! `ok`), unless `KILN_REQUIRE` (a comma list such as `cpu,opencl`) names the backend: then
//! an absent backend fails the test.
//!
//! The crate sits at the top of kiln next to the command line (see `docs/architecture.md`):
//! it depends on every backend it is built with (features `cpu`, `opencl`, `cuda`) and on
//! `kiln-runtime`, and nothing that ships depends on it. Beside the [`suite`] it holds the
//! [`reference`](mod@reference) semantics every backend must reproduce (plain Rust),
//! [`host`] values of every dtype with their buffer upload and download, and the small
//! [`kernels`] several bodies share. A backend is checked by running the bodies on its
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

use kiln_device::kiln_ir::IrError;
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

/// How one backend runs the suite, in the style of IREE's CTS: its peer for the
/// cross-device checks, and every test it does not support, each with the reason.
#[derive(Debug, Clone, Copy)]
pub struct Registration {
    /// The backend's name as `KILN_REQUIRE` spells it (lower case): a registry backend's
    /// name, or one the suite builds itself (`cpu-guarded`, `cuda-compile`).
    pub name: &'static str,
    /// The backend whose device the cross-device checks pair with this one.
    pub peer: &'static str,
    /// `(test, reason)`: the tests (by their function name in `tests/conformance.rs`) that
    /// this backend reports as skipped, with why.
    pub unsupported: &'static [(&'static str, &'static str)],
}

/// Why a backend whose devices are the CPU's cannot run `error_foreign_buffer`.
const SAME_DEVICE_PEER: (&str, &str) =
    ("error_foreign_buffer", "its peer is the CPU backend, whose buffers its kernels accept as their own");

/// Why the OpenCL backend skips the 8- and 16-lane f32 ALU checks: PoCL 3.1 (the driver CI
/// runs) computes `sin` and `cos` of `float8`/`float16` wrongly for small inputs
/// (sin(0.001) = 0.008, cos(0.001) = 0.99997), while its scalar and 4-lane forms are right.
const POCL_VECTOR_SIN: &str = "PoCL 3.1's float8/float16 sin and cos are wrong for small inputs (sin(0.001) = 0.008); scalar and \
     4-lane f32 are checked";

/// Why the WebGPU backend skips `bitcasts_half`: WGSL reinterprets an f16 only as half of
/// a `vec2<f16>` (naga's `bitcast` keeps the component count, so a lone f16 has no bitcast to
/// an integer), and the way through its f32 value quiets a signalling NaN (f16 0xfc4d reads
/// back as 0xfe4d). Every other f16 and bf16 bitcast of the group is exact.
const WGSL_F16_BITS: &str = "WGSL cannot reinterpret a lone f16's bits; through f32, a signalling f16 NaN is quieted";

/// Every backend the suite runs on, with its peer and the tests it does not support. A
/// backend of the registry needs a line here and one line in `tests/conformance.rs`'s
/// `backends!` (a test checks that every registered backend has both).
///
/// Two backends are the suite's own rather than the registry's: `cpu-guarded` is the CPU
/// device over [`kiln_cpu::GuardPageAllocator`] (every contract again, with buffers that
/// fault at the first byte past their end); `cuda-compile` is the CPU device whose compiler
/// also compiles every kernel to PTX and an `sm_90` cubin ([`cuda_compile`]): the CUDA
/// toolchain checked on every conformance kernel, no GPU needed.
pub const REGISTRATIONS: &[Registration] = &[
    Registration { name: "cpu", peer: "opencl", unsupported: &[] },
    Registration { name: "cpu-guarded", peer: "cpu", unsupported: &[SAME_DEVICE_PEER] },
    Registration { name: "cpu-avx2", peer: "cpu", unsupported: &[SAME_DEVICE_PEER] },
    Registration { name: "cpu-sse2", peer: "cpu", unsupported: &[SAME_DEVICE_PEER] },
    Registration {
        name: "opencl",
        peer: "cpu",
        unsupported: &[("alu_f32x8", POCL_VECTOR_SIN), ("alu_f32x16", POCL_VECTOR_SIN)],
    },
    Registration { name: "cuda", peer: "cpu", unsupported: &[] },
    Registration { name: "cuda-compile", peer: "opencl", unsupported: &[] },
    Registration { name: "webgpu", peer: "cpu", unsupported: &[("bitcasts_half", WGSL_F16_BITS)] },
];

/// The registration of backend `name` (lower case).
pub fn registration(name: &str) -> Option<&'static Registration> {
    REGISTRATIONS.iter().find(|r| r.name == name)
}

/// Why backend `name` does not support `test`, when its registration lists it.
pub fn unsupported(name: &str, test: &str) -> Option<&'static str> {
    registration(name)?.unsupported.iter().find(|(t, _)| *t == test).map(|(_, why)| *why)
}

/// Registers every backend this build links with kiln-device's registry (the crate's `cpu`,
/// `opencl` and `cuda` features). Idempotent.
pub fn register_backends() {
    #[cfg(feature = "cpu")]
    kiln_cpu::register();
    #[cfg(feature = "opencl")]
    kiln_opencl::register();
    #[cfg(feature = "cuda")]
    kiln_cuda::register();
    #[cfg(feature = "webgpu")]
    kiln_webgpu::register();
}

/// Opens a backend's first device, once per process: every later call returns the same
/// device (or the same error), so tests running in parallel share one device and its
/// kernel cache. A registry backend is opened through [`kiln_device::open_device`].
///
/// # Errors
/// [`Error::Invalid`] for a name the suite does not know ([`REGISTRATIONS`]);
/// [`Error::Unavailable`] for one this build leaves out; the errors of opening it.
pub fn open(name: &str) -> Result<Arc<Device>, Error> {
    type Opened = HashMap<String, Result<Arc<Device>, Error>>;
    static OPENED: OnceLock<Mutex<Opened>> = OnceLock::new();
    let mut opened = OPENED.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = opened.get(name) {
        return r.clone();
    }
    register_backends();
    let r = match name {
        #[cfg(feature = "cpu")]
        "cpu-guarded" => kiln_cpu::GuardPageAllocator::new().and_then(|a| kiln_cpu::open_with_allocator(Arc::new(a))),
        #[cfg(all(feature = "cpu", feature = "cuda"))]
        "cuda-compile" => cuda_compile::open(),
        _ if registration(name).is_some() && kiln_device::find_backend(name).is_some() => {
            kiln_device::open_device(name)
        }
        _ if registration(name).is_some() => {
            Err(Error::Unavailable(format!("this build of kiln-conformance leaves out the `{name}` backend")))
        }
        _ => Err(Error::Invalid(format!("unknown backend `{name}` (known: {})", known().join(", ")))),
    };
    opened.insert(name.to_string(), r.clone());
    r
}

/// Every backend name the suite knows: [`REGISTRATIONS`]'s, lower case.
pub fn known() -> Vec<&'static str> {
    REGISTRATIONS.iter().map(|r| r.name).collect()
}

/// The device of backend `name`, or `None` after reporting `test` as skipped with the
/// reason ([`kiln_device::skip_unless_required`]) when the backend cannot be opened.
///
/// # Panics
/// When the backend cannot be opened and `KILN_REQUIRE` names it: this is the test
/// harness's entry point, and a required backend that is missing fails the test.
pub fn backend(name: &str, test: &str) -> Option<Arc<Device>> {
    match open(name) {
        Ok(d) => Some(d),
        Err(e) => {
            kiln_device::skip_unless_required(name, test, &e);
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
        assert!(registration("tpu").is_none());
        assert!(matches!(open("tpu"), Err(Error::Invalid(_))));
    }

    #[test]
    fn unsupported_tests_have_reasons() {
        assert_eq!(unsupported("cpu-guarded", SAME_DEVICE_PEER.0), Some(SAME_DEVICE_PEER.1));
        assert_eq!(unsupported("cpu", SAME_DEVICE_PEER.0), None);
        assert!(REGISTRATIONS.iter().flat_map(|r| r.unsupported).all(|(_, why)| !why.is_empty()));
    }

    #[test]
    fn expect_err_checks_kind() {
        let e: Result<(), Error> = Err(Error::Buffer("b".into()));
        assert!(expect_err("x", e.clone(), |e| matches!(e, Error::Buffer(_))).is_ok());
        assert!(matches!(expect_err("x", e, |e| matches!(e, Error::Launch(_))), Err(Failure::Violation(_))));
        assert!(matches!(expect_err("x", Ok::<i32, Error>(1), |_| true), Err(Failure::Violation(_))));
    }
}
